"""A step that cannot suspend is run without being made.

Once a plan of one partition made only of synchronous kernels is lowered to a
straight-line program of one block with no loop (``BoundProgram.through``), the
driver runs that block over the fed values and returns the fetches: no ``Step``, no
propagator, no release.  What a ``Step`` would do must still happen: a failing kernel
fails the run with the node's error (the step is made only then), numpy stays quiet,
the statistics count the step, and nothing is left behind.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

import asyncflow as af
from asyncflow.runtime import step as step_module

#: Runs before a plan is lowered and its block made, with the default options.
WARM = 3


@contextmanager
def _steps_made() -> Iterator[list[int]]:
    """Counts the ``Step`` objects made meanwhile."""
    made: list[int] = []
    new = vars(step_module.Step)["__new__"]

    def counted(cls: type[step_module.Step], *args: Any, **kwargs: Any) -> step_module.Step:
        made.append(1)
        step: step_module.Step = new.__func__(cls, *args, **kwargs)
        return step

    step_module.Step.__new__ = staticmethod(counted)  # type: ignore[method-assign]
    try:
        yield made
    finally:
        step_module.Step.__new__ = new  # type: ignore[method-assign]


def _graph() -> tuple[af.Graph, Any, Any, Any]:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=None, name="x")
        y = af.multiply(af.add(x, 1.0), 2.0, name="y")
        z = af.reshape(y, [2], name="to_pair")  # fails unless two values are fed
    return g, x, y, z


async def test_a_lowered_all_inline_run_makes_no_step() -> None:
    g, x, y, _ = _graph()
    async with af.Session(graph=g) as sess:
        for _ in range(WARM):
            assert await sess.run(y, {x: 1.0}) == 4.0
        before = sess.statistics()
        with _steps_made() as made:
            values = [await sess.run(y, {x: float(v)}) for v in range(10)]
        after = sess.statistics()
    assert values == [(v + 1.0) * 2.0 for v in range(10)]
    assert made == []
    assert after.steps_started - before.steps_started == 10
    assert after.completed - before.completed == 10
    assert after.cache_hits - before.cache_hits == 10
    assert after.failed == before.failed


def test_run_sync_of_a_lowered_all_inline_plan_makes_no_step() -> None:
    g, x, y, _ = _graph()
    with af.Session(graph=g) as sess:
        for _ in range(WARM):
            sess.run_sync(y, {x: 1.0})
        with _steps_made() as made:
            assert sess.run_sync(y, {x: 2.0}) == 6.0
            assert sess.run_sync([y, {"y": y}], {x: 0.0}) == [2.0, {"y": 2.0}]
    # (The second signature is compiled and lowered meanwhile: its first runs make one.)
    assert len(made) <= WARM


async def test_a_kernel_failing_in_a_step_less_run_fails_as_in_a_step() -> None:
    g, x, _, z = _graph()
    general = af.SessionConfig(executor_options=af.ExecutorOptions(straight_line=False))
    errors: dict[str, af.errors.OpError] = {}
    for name, config in (("program", None), ("general", general)):
        async with af.Session(graph=g, config=config) as sess:
            for _ in range(WARM):
                assert list(await sess.run(z, {x: [1.0, 2.0]})) == [4.0, 6.0]
            before = sess.statistics()
            with _steps_made() as made:
                with pytest.raises(af.errors.InvalidArgumentError) as info:
                    await sess.run(z, {x: [1.0, 2.0, 3.0]})
                # The session goes on, still without a step for a run that works.
                assert list(await sess.run(z, {x: [0.0, 1.0]})) == [2.0, 4.0]
            after = sess.statistics()
            errors[name] = info.value
            assert (after.failed - before.failed, after.completed - before.completed) == (1, 1)
            assert after.steps_started - before.steps_started == 2
            if name == "program":
                assert made == [1]  # made for the failure only, to fail as a step does
    ours, theirs = errors["program"], errors["general"]
    assert ours.op is theirs.op
    assert ours.op is not None
    assert ours.op.name == "to_pair"
    assert ours.message == theirs.message
    assert "[[node to_pair (op Reshape, defined at" in ours.message
    assert type(ours.__cause__) is type(theirs.__cause__)


async def test_a_step_less_run_keeps_numpy_quiet() -> None:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        y = af.multiply(x, x)  # overflows float32 for a large x
    async with af.Session(graph=g) as sess:
        for _ in range(WARM):
            await sess.run(y, {x: 1.0})
        with np.errstate(all="raise"), _steps_made() as made:
            value = await sess.run(y, {x: np.float32(1e30)})
            assert np.isinf(value)
            # The caller's own numpy state is back after the run.
            with pytest.raises(FloatingPointError):
                np.float32(1e30) * np.float32(1e30)
    assert made == []


def test_step_counts_are_exact_when_threads_run_at_once() -> None:
    """The counts every run bumps take no lock: none is lost when threads race."""
    g, x, y, _ = _graph()
    threads, runs = 4, 400
    with af.Session(graph=g) as sess:
        for _ in range(WARM):
            sess.run_sync(y, {x: 1.0})
        before = sess.statistics()
        start = threading.Barrier(threads)

        wrong: list[Any] = []

        def runner() -> None:
            start.wait(timeout=10)
            for k in range(runs):  # (each thread its own feeds, through the same block)
                got = sess.run_sync(y, {x: float(k)})
                if got != (k + 1.0) * 2.0:
                    wrong.append((k, got))

        workers = [threading.Thread(target=runner) for _ in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join(timeout=60)
        after = sess.statistics()
    assert wrong == []
    total = threads * runs
    assert after.steps_started - before.steps_started == total
    assert after.completed - before.completed == total
    assert after.cache_hits - before.cache_hits == total
