"""A straight-line program keeps a node whose kernel runs by its ``nowait`` twin.

An image decode is an async kernel: a small image decodes inline (its ``nowait``
twin), a large one on a worker thread.  A frame-free plan with such a node still runs
as one straight-line program; when the twin cannot finish (a large image) the program
hands that one node to the step's dispatch, waits, and goes on after it.  A kernel
whose twin may wait for another node of the step (a queue's) keeps the general
engine, which runs that other node meanwhile.
"""

from __future__ import annotations

import asyncio
import io
from typing import Any

import numpy as np
import pytest

import asyncflow as af
from asyncflow.runtime.call_frame import CallFrame
from asyncflow.runtime.interpreter import ProgramPropagator
from asyncflow.runtime.step import Step
from tests.engines import engine_name

pytest.importorskip("PIL")

FROM_FIRST_RUN = af.SessionConfig(executor_options=af.ExecutorOptions(schedule_after=0))
SMALL, LARGE = (7, 5, 3), (160, 120, 3)  # 35 pixels decode inline, 19,200 do not


def png(shape: tuple[int, ...], seed: int = 0) -> tuple[np.ndarray, bytes]:
    from PIL import Image

    image = np.random.default_rng(seed).integers(0, 256, shape, np.uint8)
    buf = io.BytesIO()
    Image.fromarray(image, "RGB").save(buf, format="PNG")
    return image, buf.getvalue()


@pytest.fixture
def dispatched(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(op name, propagator class name) of every node a step dispatches."""
    seen: list[tuple[str, str]] = []
    dispatch = Step.dispatch

    def counted(self: Step, token: Any, i: int, node: Any, *args: Any, **kwargs: Any) -> None:
        seen.append((self._bound.ops[i].name, engine_name(self)))
        dispatch(self, token, i, node, *args, **kwargs)

    monkeypatch.setattr(Step, "dispatch", counted)
    return seen


def preprocess() -> tuple[af.Graph, Any, Any]:
    """decode -> float -> scaled -> a sum: nodes before and after the decode."""
    g = af.Graph()
    with g.as_default():
        data = af.placeholder(af.string, (), name="data")
        img = af.cast(af.image.decode_png(data, name="decode"), af.float32)
        out = af.reduce_sum(img / 255.0 - 0.5, axis=2, name="out")
    return g, data, out


def expected(image: np.ndarray) -> Any:
    return (image.astype(np.float32) / np.float32(255.0) - np.float32(0.5)).sum(axis=2)


def test_a_small_decode_runs_inside_the_program(dispatched: list[tuple[str, str]]) -> None:
    g, data, out = preprocess()
    image, encoded = png(SMALL)
    with af.Session(graph=g, config=FROM_FIRST_RUN) as sess:
        got = sess.run_sync(out, {data: encoded})
        bound = sess._prepare(out, {data: encoded}).bound[0]
    assert bound.schedulable
    assert isinstance(Step(bound, CallFrame([encoded])), ProgramPropagator)
    np.testing.assert_allclose(got, expected(image), rtol=1e-6)
    assert dispatched == []  # inline: nothing handed to the step


def test_a_large_decode_hops_and_the_program_goes_on_after_it(
    dispatched: list[tuple[str, str]],
) -> None:
    g, data, out = preprocess()
    (small, small_png), (large, large_png) = png(SMALL, 1), png(LARGE, 2)
    with af.Session(graph=g, config=FROM_FIRST_RUN) as sess:
        outs = [sess.run_sync(out, {data: d}) for d in (large_png, small_png, large_png)]
        async_out = asyncio.run(sess.run(out, {data: large_png}))
    for got, image in zip([*outs, async_out], [large, small, large, large], strict=True):
        np.testing.assert_allclose(got, expected(image), rtol=1e-6)
    assert dispatched == [("decode", "ProgramPropagator")] * 3  # the large ones only


def test_two_decodes_one_hopping_in_one_program(dispatched: list[tuple[str, str]]) -> None:
    g = af.Graph()
    (small, small_png), (large, large_png) = png(SMALL, 3), png(LARGE, 4)
    with g.as_default():
        a = af.placeholder(af.string, (), name="a")
        b = af.placeholder(af.string, (), name="b")
        sums = [
            af.reduce_sum(af.cast(af.image.decode_png(x, name=f"decode_{x.op.name}"), af.int32))
            for x in (a, b)
        ]
        total = af.add(sums[0], sums[1], name="total")
    with af.Session(graph=g, config=FROM_FIRST_RUN) as sess:
        got = sess.run_sync([total, *sums], {a: large_png, b: small_png})
    assert got == [int(large.sum()) + int(small.sum()), int(large.sum()), int(small.sum())]
    assert dispatched == [("decode_a", "ProgramPropagator")]


def test_a_hopped_decode_that_fails_names_its_node_and_the_session_stays_usable(
    dispatched: list[tuple[str, str]],
) -> None:
    g, data, out = preprocess()
    image, encoded = png(LARGE, 5)
    cut = encoded[: len(encoded) // 2]  # the header reads (it hops), the pixels do not
    with af.Session(graph=g, config=FROM_FIRST_RUN) as sess:
        with pytest.raises(af.errors.InvalidArgumentError, match=r"Invalid PNG data[\s\S]*decode"):
            sess.run_sync(out, {data: cut})
        with pytest.raises(af.errors.InvalidArgumentError, match=r"Invalid PNG data[\s\S]*decode"):
            sess.run_sync(out, {data: b"not a png"})  # fails in the twin, inline
        np.testing.assert_allclose(sess.run_sync(out, {data: encoded}), expected(image), rtol=1e-6)
    assert [d for d, _ in dispatched] == ["decode", "decode"]


def test_a_traced_step_dispatches_the_decode_and_records_it(
    dispatched: list[tuple[str, str]],
) -> None:
    g, data, out = preprocess()
    image, encoded = png(SMALL, 6)
    md = af.RunMetadata()
    full = af.RunOptions(trace_level=af.RunOptions.FULL_TRACE)
    with af.Session(graph=g, config=FROM_FIRST_RUN) as sess:
        got = sess.run_sync(out, {data: encoded}, options=full, run_metadata=md)
    np.testing.assert_allclose(got, expected(image), rtol=1e-6)
    names = [n.node_name for d in md.step_stats.dev_stats for n in d.node_stats]
    assert "decode" in names
    assert "out" in names


def test_a_queue_op_keeps_the_general_engine() -> None:
    """A dequeue's twin may wait for an enqueue of the same step: a program that ran
    the dequeue first would wait forever, the general engine runs the enqueue."""
    g = af.Graph()
    with g.as_default():
        q = af.FIFOQueue(2, [af.float32], shapes=[()])
        x = af.placeholder(af.float32, (), name="x")
        enq = q.enqueue([x])
        deq = q.dequeue()
    with af.Session(graph=g, config=FROM_FIRST_RUN) as sess:

        async def both() -> Any:
            got = asyncio.ensure_future(sess.run(deq))
            await asyncio.sleep(0.01)
            await sess.run(enq, {x: 3.0})
            return await asyncio.wait_for(got, 5)

        assert asyncio.run(both()) == 3.0
        bound = sess._prepare(deq, None).bound[0]
    assert not bound.schedulable
