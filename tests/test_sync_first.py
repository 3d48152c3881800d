"""``run_sync`` of a plan whose only waits are image decodes starts on no event loop.

The synchronous door runs the driver's first time slice on the caller's thread: a
small image decodes inline (its ``nowait`` twin) and the step ends there, without
entering the thread's event loop; a large image hops to the device's worker threads
and only then does the step go on, awaited on that loop and cancellable by
``Session.close``, exactly as an ``await sess.run`` of it.  A run with a deadline (its
own or the session's) is driven on the loop from the start, and its deadline lands on
the hop as well.
"""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import asyncflow as af
from asyncflow.ops import image_ops
from asyncflow.runtime.step import Step
from asyncflow.session.runners import SyncRunners

pytest.importorskip("PIL")

SMALL, LARGE = (9, 7, 3), (150, 140, 3)  # 63 pixels decode inline, 21,000 hop
#: Bounds every wait of a test: nothing here may hang.
WAIT_S = 10.0


def encoded(shape: tuple[int, ...], fmt: str, seed: int = 0) -> tuple[np.ndarray, bytes]:
    from PIL import Image

    image = np.random.default_rng(seed).integers(0, 256, shape, np.uint8)
    buf = io.BytesIO()
    Image.fromarray(image, "RGB").save(buf, format=fmt, quality=95)
    return image, buf.getvalue()


def preprocess(fmt: str) -> tuple[af.Graph, Any, list[Any]]:
    """decode -> resize -> normalize, and a nearest resize beside it."""
    g = af.Graph()
    decode = af.image.decode_png if fmt == "PNG" else af.image.decode_jpeg
    with g.as_default():
        data = af.placeholder(af.string, (), name="data")
        img = af.expand_dims(decode(data, channels=3, name="decode"), 0)
        up = af.image.resize_bilinear(img, [12, 10], half_pixel_centers=True)
        near = af.image.resize_nearest_neighbor(img, [5, 4])
        outs = [af.identity(up / 127.5 - 1.0, name="normalized"), near]
    return g, data, outs


@pytest.fixture
def loop_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per time ``run_sync`` entered a thread's event loop."""
    entered: list[int] = []
    run = SyncRunners.run

    def counted(self: SyncRunners, coro: Any) -> Any:
        entered.append(1)
        return run(self, coro)

    monkeypatch.setattr(SyncRunners, "run", counted)
    return entered


@pytest.fixture
def decode_threads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The thread of every decode that did not run by the ``nowait`` twin."""
    threads: list[int] = []
    decode = image_ops._Decoder.decode

    def recorded(self: image_ops._Decoder, contents: Any) -> np.ndarray:
        threads.append(threading.get_ident())
        return decode(self, contents)

    monkeypatch.setattr(image_ops._Decoder, "decode", recorded)
    return threads


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_the_same_values_both_ways_and_a_small_image_never_enters_the_loop(
    fmt: str, loop_runs: list[int], decode_threads: list[int]
) -> None:
    g, data, outs = preprocess(fmt)
    (_, small), (_, large) = encoded(SMALL, fmt, 1), encoded(LARGE, fmt, 2)
    with af.Session(graph=g) as sess:
        call = sess._prepare(outs, {data: small})
        fn = sess.make_callable(outs, [data])
        synced = [sess.run_sync(outs, {data: d}) for d in (small, large, small, large)]
        synced += [fn.run_sync(small), fn.run_sync(large)]
        awaited = [asyncio.run(sess.run(outs, {data: d})) for d in (small, large)]
    assert call.sync_first
    assert not call.fast  # the decode is an async node
    for got, want in zip(synced, [*awaited, *awaited, *awaited], strict=True):
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
    # The large images alone entered the loop (three run_sync calls), and each of
    # them was decoded on a worker thread, never on the caller's.
    assert len(loop_runs) == 3
    assert len(decode_threads) == 4  # three synchronous, one awaited
    assert threading.get_ident() not in decode_threads


@pytest.fixture
def gated(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, threading.Event]]:
    """(started, gate): a decode off the twin signals ``started`` and then waits for
    ``gate`` (at most ``WAIT_S``); the gate is opened when the test ends."""
    started, gate = threading.Event(), threading.Event()
    decode = image_ops._Decoder.decode

    def held(self: image_ops._Decoder, contents: Any) -> np.ndarray:
        started.set()
        gate.wait(WAIT_S)
        return decode(self, contents)

    monkeypatch.setattr(image_ops._Decoder, "decode", held)
    yield started, gate
    gate.set()


def open_gate_after(
    monkeypatch: pytest.MonkeyPatch, gate: threading.Event, method: str
) -> list[int]:
    """Open ``gate`` right after a step's ``method`` ran (``running``: the deadline
    noted what still runs; ``abort_threadsafe``: a close aborted the step).  A thread
    kernel is never abandoned (the step waits for it), so the held decode must end
    after what interrupts the step, not before."""
    calls: list[int] = []
    original = getattr(Step, method)

    def then_open(self: Step, *args: Any) -> Any:
        result = original(self, *args)
        calls.append(1)
        gate.set()
        return result

    monkeypatch.setattr(Step, method, then_open)
    return calls


def test_a_deadline_lands_on_the_hop_and_names_the_decode(
    gated: tuple[threading.Event, threading.Event], monkeypatch: pytest.MonkeyPatch
) -> None:
    started, gate = gated
    noted = open_gate_after(monkeypatch, gate, "running")
    g, data, outs = preprocess("PNG")
    (_, small), (_, large) = encoded(SMALL, "PNG", 3), encoded(LARGE, "PNG", 4)
    with af.Session(graph=g) as sess:
        want = sess.run_sync(outs[1], {data: small})
        with pytest.raises(af.errors.DeadlineExceededError, match="still running: 'decode'"):
            sess.run_sync(outs, {data: large}, options=af.RunOptions(timeout_in_ms=50))
        assert started.is_set()
        assert noted == [1]
        # The session stays usable, for small and large images.
        np.testing.assert_array_equal(sess.run_sync(outs[1], {data: small}), want)
        assert sess.run_sync(outs[1], {data: large}).shape == (1, 5, 4, 3)
        stats = sess.statistics()
    assert (stats.completed, stats.failed) == (3, 1)


def test_the_session_deadline_applies_to_the_hop(
    gated: tuple[threading.Event, threading.Event], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, gate = gated
    open_gate_after(monkeypatch, gate, "running")
    g, data, outs = preprocess("PNG")
    _, large = encoded(LARGE, "PNG", 5)
    config = af.SessionConfig(operation_timeout_in_ms=50)
    with (
        af.Session(graph=g, config=config) as sess,
        pytest.raises(af.errors.DeadlineExceededError, match="decode"),
    ):
        sess.make_callable(outs, [data]).run_sync(large)


def test_closing_the_session_cancels_a_step_waiting_on_the_hop(
    gated: tuple[threading.Event, threading.Event], monkeypatch: pytest.MonkeyPatch
) -> None:
    started, gate = gated
    aborted = open_gate_after(monkeypatch, gate, "abort_threadsafe")
    g, data, outs = preprocess("PNG")
    _, large = encoded(LARGE, "PNG", 6)
    sess = af.Session(graph=g)
    raised: list[BaseException] = []

    def caller() -> None:
        try:
            sess.run_sync(outs, {data: large})
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=caller)
    thread.start()
    assert started.wait(WAIT_S)
    sess.close_sync()  # aborts the step, waits for it, stops the devices' threads
    thread.join(WAIT_S)
    assert not thread.is_alive()
    assert aborted == [1]
    assert len(raised) == 1
    assert isinstance(raised[0], af.errors.CancelledError)
    assert "Session has been closed" in str(raised[0])


def test_a_traced_run_records_the_hopped_decode(loop_runs: list[int]) -> None:
    g, data, outs = preprocess("PNG")
    _, large = encoded(LARGE, "PNG", 7)
    md = af.RunMetadata()
    full = af.RunOptions(trace_level=af.RunOptions.FULL_TRACE)
    with af.Session(graph=g) as sess:
        sess.run_sync(outs, {data: large}, options=full, run_metadata=md)
    names = [n.node_name for d in md.step_stats.dev_stats for n in d.node_stats]
    assert "decode" in names
    assert len(loop_runs) == 1


def test_a_queue_plan_still_starts_on_the_loop(loop_runs: list[int]) -> None:
    """A queue's ``nowait`` twin may wake a waiter bound to an event loop: such a
    plan's first slice runs on the thread's loop, as before."""
    g = af.Graph()
    with g.as_default():
        q = af.FIFOQueue(2, [af.float32], shapes=[()])
        x = af.placeholder(af.float32, (), name="x")
        enq = q.enqueue([x])
        deq = q.dequeue()
    with af.Session(graph=g) as sess:
        sess.run_sync(enq, {x: 2.0})
        assert sess.run_sync(deq) == 2.0
        assert not sess._prepare(deq, None).sync_first
    assert len(loop_runs) == 2
