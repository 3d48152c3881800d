"""What a step costs while it waits: the objects it keeps for the cycle collector and
the Python calls it makes around its one async kernel.

A service has many steps in flight, each awaiting one I/O kernel; every object such
a step keeps is one more for each collection to walk, times the steps in flight, and
every call around the await is paid per step.  The bounds are relative to a plain
coroutine doing the same work in the same process (its task, context, coroutines,
future), so they hold on any CPython that runs the suite.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import numpy as np

import asyncflow as af
from asyncflow.runtime.block_code import FILENAME as BLOCKS
from tests.footprint import tracked

#: Steps (and plain coroutines) in flight at once while their objects are counted.
N = 400

#: GC-tracked objects a waiting step may keep beyond a plain coroutine awaiting the
#: same kernel: its Step (which is its propagator) with its value list (a plan without
#: joins shares its pending counts; an idle step lets go of its ready stack); the
#: session driver's coroutine awaits the kernel itself, as the plain coroutine does.
#: Nothing in its task's context (no context map: the kernel finds its step through
#: ``cancellation.awaiting``).  Earlier designs kept 8, then 4 plus a context map of 2,
#: then 4 (a Step and its propagator), then 3 (``Step.run`` a coroutine of its own).
EXTRA_OBJECTS = 2


def _graph(kernel: Callable[[Any], Awaitable[Any]]) -> tuple[af.Graph, af.Tensor, af.Tensor]:
    """``kernel(x) * 2``: one async kernel between inline ones (a service's step)."""
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        y = af.multiply(af.py_func(kernel, [x], af.float32, name="io"), np.float32(2.0))
    return g, x, y


async def _kept_per_task(
    start: Callable[[], Coroutine[Any, Any, Any]], gate: asyncio.Event
) -> tuple[float, dict[str, float]]:
    """GC-tracked objects per task while ``N`` tasks of ``start()`` wait on ``gate``,
    in all and by type (the types at least one task in two keeps); the tasks are gone
    before it returns: the next count starts from none of them."""
    before = tracked()
    # Each task in a context of its own that holds nothing yet: the context a step
    # makes (the running step, numpy's quiet state) is a copy of its task's, whose
    # size grows with the context variables the process set before (the suite's
    # earlier tests: two objects more a step once 17 variables are set).
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(start(), context=contextvars.Context()) for _ in range(N)]
    await asyncio.sleep(0)  # every task runs to its kernel's wait
    await asyncio.sleep(0)
    after = tracked()
    gate.set()
    await asyncio.gather(*tasks)
    del tasks
    await asyncio.sleep(0)
    gate.clear()
    kept = {k: (after[k] - before[k]) / N for k in after if after[k] - before[k] >= N // 2}
    # The objects the tasks made and keep: the types that grew.  (Not the net change:
    # objects an earlier test left, freed meanwhile, would count against the tasks and
    # make the plain coroutine's figure vary with the tests that ran before.)
    grown = sum(max(0, after[k] - before[k]) for k in after)
    return grown / N, kept


async def test_a_waiting_step_keeps_few_objects_beyond_a_plain_coroutine() -> None:
    gate = asyncio.Event()

    async def io(v: Any) -> Any:
        await gate.wait()
        return v

    two = np.float32(2.0)

    async def plain() -> Any:
        return np.multiply(await io(np.float32(1.0)), two)

    g, x, y = _graph(io)
    async with af.Session(graph=g) as sess:
        gate.set()
        for _ in range(3):  # compiled, the program lowered, caches warm
            assert await sess.run(y, {x: 1.0}) == 2.0
        assert await plain() == 2.0
        gate.clear()
        theirs, their_types = await _kept_per_task(plain, gate)
        ours, our_types = await _kept_per_task(lambda: sess.run(y, {x: 1.0}), gate)
    # (Rounded: a few objects per batch are the event loop's, not any task's.)
    allowed = EXTRA_OBJECTS
    assert round(ours) - round(theirs) <= allowed, (
        f"a waiting step keeps {ours:.2f} GC-tracked objects, a plain coroutine "
        f"{theirs:.2f}: more than {allowed} extra (a step's: {our_types}; "
        f"a coroutine's: {their_types})"
    )


@contextmanager
def _calls_in(path: str) -> Iterator[Counter[str]]:
    """Count the Python functions called meanwhile whose file's path holds ``path`` (a
    module, or ``/asyncflow/`` for the whole package, its programs' blocks too), by
    name."""
    calls: Counter[str] = Counter()
    files = (path, BLOCKS) if path == "/asyncflow/" else (path,)

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and any(f in frame.f_code.co_filename for f in files):
            calls[frame.f_code.co_name] += 1

    sys.setprofile(profile)
    try:
        yield calls
    finally:
        sys.setprofile(None)


#: Python calls of the executor module per async kernel awaited in the step's own
#: frame, the step made and run around it (a function call's body runs as such a step
#: per call): the kernel's start, its completion and drain, the check for the next.
CALLS_PER_LONE_NODE = 8


async def test_a_lone_async_node_costs_few_calls_in_the_executor() -> None:
    async def io(v: Any) -> Any:
        return v

    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        t = x
        for k in range(20):  # twenty async nodes, one after the other
            t = af.py_func(io, [t], af.float32, name=f"io{k}")
    async with af.Session(graph=g) as sess:
        assert await sess.run(t, {x: 1.0}) == 1.0
        with _calls_in("/asyncflow/runtime/step.py") as calls:
            assert await sess.run(t, {x: 1.0}) == 1.0
    per_node = sum(calls.values()) / 20
    assert per_node <= CALLS_PER_LONE_NODE, (
        f"{per_node:.1f} calls in the executor per lone async node: {dict(calls)}"
    )


@contextmanager
def _builtin_calls() -> Iterator[Counter[str]]:
    """Count the builtins called meanwhile, by name (``lock.__exit__``: the lock's)."""
    calls: Counter[str] = Counter()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_call":
            owner = getattr(arg, "__self__", None)
            prefix = "lock." if type(owner).__name__ == "lock" else ""
            calls[prefix + arg.__name__] += 1

    sys.setprofile(profile)
    try:
        yield calls
    finally:
        sys.setprofile(None)


async def test_a_step_asks_for_the_loop_once_and_takes_the_sessions_lock_twice() -> None:
    """Asking for the running loop costs a system call (CPython checks the process id),
    so the driver asks once and hands it to the step it awaits (the step asked again
    before); the session's lock is taken to register and count the step, and to
    unregister and count it (the plan-cache hit is counted without it)."""

    async def io(v: Any) -> Any:
        return v

    g, x, y = _graph(io)
    async with af.Session(graph=g) as sess:
        for _ in range(3):  # compiled, the program lowered, caches warm
            assert await sess.run(y, {x: 1.0}) == 2.0
        with _builtin_calls() as calls:
            assert await sess.run(y, {x: 1.0}) == 2.0
    # (The driver asks through asyncio's check that raises nothing: the same call.)
    assert calls["get_running_loop"] + calls["_get_running_loop"] <= 1, dict(calls)
    assert calls["lock.__exit__"] <= 2, dict(calls)


#: Python functions of asyncflow a tiny all-inline run calls (a fetch, a feed, two
#: inline kernels): the session's door and plan lookup, the feed's conversion and its
#: frame, the driver, the step-less run and its two kernels, the result's conversion.
#: Each is paid per run by a service making many small ones (~60 ns apiece); the step
#: made and released, its propagator and their calls were 9 more.
CALLS_PER_TINY_RUN = 12


async def test_a_tiny_run_makes_few_python_calls() -> None:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        y = af.multiply(af.add(x, 1.0), 2.0)
    async with af.Session(graph=g) as sess:
        for _ in range(3):  # compiled, the program lowered, caches warm
            assert await sess.run(y, feed_dict={x: 1.0}) == 4.0
        with _calls_in("/asyncflow/") as calls:
            value = await sess.run(y, feed_dict={x: 1.0})
    assert value == 4.0
    assert sum(calls.values()) <= CALLS_PER_TINY_RUN, (
        f"{sum(calls.values())} Python calls per tiny run: {dict(calls)}"
    )


#: Python functions of asyncflow a service's step calls (one async kernel between
#: inline ones, the step waiting for it once): the tiny run's door, the driver
#: (register, await, unregister) and the step's await of its lone kernel (a coroutine
#: resumed counts as a call again).  43 before the step was its engine and the
#: driver skipped the inline slice for a step that must await anyway; 38 while
#: ``Step.run`` was a coroutine under the driver's, and ``outcome`` asked a finished
#: step whether it was settled.
CALLS_PER_WAITING_STEP = 37


async def test_a_step_awaiting_one_kernel_makes_few_python_calls() -> None:
    async def io(v: Any) -> Any:
        await asyncio.sleep(0)
        return v

    g, x, y = _graph(io)
    async with af.Session(graph=g) as sess:
        for _ in range(3):
            assert await sess.run(y, {x: 1.0}) == 2.0
        with _calls_in("/asyncflow/") as calls:
            value = await sess.run(y, {x: 1.0})
    assert value == 2.0
    assert sum(calls.values()) <= CALLS_PER_WAITING_STEP, (
        f"{sum(calls.values())} Python calls per waiting step: {dict(calls)}"
    )
