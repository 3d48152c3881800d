"""The session layer: every entry point reaches its step through the one driver, the
distributed master plugs in through a typed protocol, other modules use the stated
seam, and a step in flight costs a bounded number of objects and coroutine levels."""

from __future__ import annotations

import asyncio
import collections
import contextvars
import gc
import inspect
import pathlib
import re
import sys
import threading
import types
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any

import numpy as np
import pytest

import asyncflow as af
from asyncflow.compiler.pipeline import Compiled
from asyncflow.distributed.master import Master
from asyncflow.framework.graph import Tensor
from asyncflow.runtime.barrier import StepRunner
from asyncflow.runtime.call_frame import CallFrame
from asyncflow.runtime.devices import blas_governor
from asyncflow.runtime.rendezvous import LocalRendezvous
from asyncflow.runtime.step import Step
from asyncflow.session import core
from asyncflow.session.call import CompiledCall
from asyncflow.session.seam import SessionInternals, SessionMaster

PACKAGE = pathlib.Path(af.__file__).parent


@pytest.fixture
def driven(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each step the session drives, by the signature of its call: through ``_drive``,
    or through its first phase alone (``run_sync`` of an all-inline plan, on no loop:
    the step run in its inline phase, or run without being made), marked
    ``"phase 1: "``."""
    seen: list[str] = []
    drive, inline, through = core.Session._drive, core.Session._inline_phase, core.Session._through

    def counted_drive(self: af.Session, call: CompiledCall, *args: Any, **kwargs: Any) -> Any:
        seen.append(call.signature)
        return drive(self, call, *args, **kwargs)

    def counted_inline(self: af.Session, call: CompiledCall, *args: Any, **kwargs: Any) -> Any:
        if sys._getframe(1).f_code is not drive.__code__:  # not within the driver
            seen.append(f"phase 1: {call.signature}")
        return inline(self, call, *args, **kwargs)

    def counted_through(self: af.Session, call: CompiledCall, *args: Any, **kwargs: Any) -> Any:
        result = through(self, call, *args, **kwargs)
        if result is not core._LEFT and sys._getframe(1).f_code is not drive.__code__:
            seen.append(f"phase 1: {call.signature}")
        return result

    monkeypatch.setattr(core.Session, "_drive", counted_drive)
    monkeypatch.setattr(core.Session, "_through", counted_through)
    monkeypatch.setattr(core.Session, "_inline_phase", counted_inline)
    return seen


def _tiny() -> tuple[Tensor, Tensor]:
    x = af.placeholder(af.float32, shape=(), name="x")
    return x, af.multiply(af.add(x, 1.0), 2.0, name="y")


async def test_every_async_entry_point_goes_through_the_driver(
    graph: af.Graph, driven: list[str]
) -> None:
    x, y = _tiny()
    events: list[Any] = []
    async with af.Session(graph=graph) as sess:
        assert await sess.run(y, {x: 1.0}) == 4.0
        assert await sess.make_callable(y, [x])(1.0) == 4.0
        assert [v async for _, v in sess.run_stream([y], {x: 1.0})] == [4.0]
        assert await y.eval({x: 1.0}, session=sess) == 4.0
        await y.op.run({x: 1.0}, session=sess)
        traced = af.RunOptions(trace_level=af.RunOptions.FULL_TRACE, timeout_in_ms=5_000)
        assert await sess.run(y, {x: 1.0}, options=traced, run_metadata=af.RunMetadata()) == 4.0
        assert await sess.run(y, {x: 1.0}, options=af.RunOptions(progress=events.append)) == 4.0
        handle = await sess.partial_run_setup([y], [x])
        assert await sess.partial_run(handle, y, {x: 1.0}) == 4.0
    y_x = "[y:0] <- [x:0]"
    # op.run fetches a target only; a partial run's call is compiled with the client's
    # edges (its feeds and fetches cross the rendezvous, not the signature).
    assert driven == [y_x, y_x, y_x, y_x, "[] <- [x:0]", y_x, y_x, "[] <- []"]


async def test_admission_goes_through_the_driver(graph: af.Graph, driven: list[str]) -> None:
    x, y = _tiny()
    config = af.SessionConfig(max_concurrent_steps=1)
    async with af.Session(graph=graph, config=config) as sess:
        got = await asyncio.gather(*(sess.run(y, {x: float(i)}) for i in range(3)))
    assert got == [2.0, 4.0, 6.0]
    assert len(driven) == 3


def test_sync_entry_points_go_through_the_driver(graph: af.Graph, driven: list[str]) -> None:
    x, y = _tiny()
    with af.Session(graph=graph) as sess:
        assert sess.run_sync(y, {x: 1.0}) == 4.0  # all inline: the driver on no loop
        with_deadline = af.RunOptions(timeout_in_ms=5_000)
        assert sess.run_sync(y, {x: 1.0}, options=with_deadline) == 4.0  # on its loop
        fn = sess.make_callable(y, [x], accept_options=True)
        assert fn.run_sync(1.0) == 4.0
        assert fn.run_sync(1.0, options=with_deadline) == 4.0
        assert y.eval_sync({x: 1.0}, session=sess) == 4.0
    y_x = "[y:0] <- [x:0]"
    one = f"phase 1: {y_x}"
    assert driven == [one, y_x, one, y_x, one]


def test_the_all_inline_driver_needs_no_loop(graph: af.Graph) -> None:
    x, y = _tiny()
    with af.Session(graph=graph) as sess:
        sess.run_sync(y, {x: 1.0})
        call = sess._prepare(y, {x: 1.0})
        driver = sess._drive(call, call.frame({x: 1.0}), 0, None, None, None)
        with pytest.raises(StopIteration) as done:
            driver.send(None)  # one step of the coroutine: it never suspends
        assert done.value.value == 4.0


async def test_session_run_returns_the_driver_itself(graph: af.Graph) -> None:
    x, y = _tiny()
    async with af.Session(graph=graph) as sess:
        coro = sess.run(y, {x: 1.0})
        assert isinstance(coro, types.CoroutineType)
        assert coro.cr_code is core.Session._drive.__code__  # no coroutine around it
        assert await coro == 4.0
        coro = sess.make_callable(y, [x])(1.0)
        assert isinstance(coro, types.CoroutineType)
        assert coro.cr_code is core.Session._drive.__code__
        assert await coro == 4.0


# -- the distributed master's seam ----------------------------------------------------


class _FakeCluster:
    """Just what :class:`Master` reads of a cluster when it is made and closed."""

    tasks = ("/job:worker/task:0",)

    def __init__(self) -> None:
        self.generation: dict[str, int] = {}
        self._lock = threading.Lock()
        self.sessions: set[str] = set()
        self.watchers: list[Any] = []

    def devices(self) -> list[str]:
        return ["/job:worker/replica:0/task:0/device:CPU:0"]

    def add_watcher(self, fn: Any) -> None:
        self.watchers.append(fn)

    def remove_watcher(self, fn: Any) -> None:
        self.watchers.remove(fn)


def test_the_distributed_master_is_a_session_master(graph: af.Graph) -> None:
    with af.Session(graph=graph) as sess:
        master = Master(_FakeCluster(), sess)  # type: ignore[arg-type]
        assert isinstance(master, SessionMaster)
        typed: SessionMaster = master  # the static check: mypy --strict on this file
        assert typed.device_names == ("/job:worker/replica:0/task:0/device:CPU:0",)


class _LocalMaster:
    """A master that runs every partition here, through the session's seam."""

    def __init__(self, session: af.Session) -> None:
        self.session = session
        self.device_names: tuple[str, ...] = ()
        self.steps = 0
        self.closed = False

    def prepared(
        self,
        compiled: Compiled,
        fetches: Sequence[Tensor],
        feed_keys: tuple[Any, ...],
        converters: tuple[Callable[[Any], Any], ...],
        rebuild: Any,
    ) -> CompiledCall:
        bound = [self.session.internals.bind(plan) for plan in compiled.plans]
        return CompiledCall(compiled, bound, fetches, feed_keys, converters, rebuild)

    def runner(
        self,
        call: CompiledCall,
        frame: CallFrame,
        trace: bool = False,
        rendezvous: LocalRendezvous | None = None,
    ) -> StepRunner:
        self.steps += 1
        return Step(call.bound[0], frame, trace, rendezvous)

    async def close(self) -> None:
        self.closed = True

    def close_sync(self) -> None:
        self.closed = True


class _Target:
    def __init__(self, make: Callable[[af.Session], Any]) -> None:
        self.make = make
        self.masters: list[Any] = []

    def _asyncflow_master(self, session: af.Session) -> Any:
        master = self.make(session)
        self.masters.append(master)
        return master


async def test_a_master_plugs_in_through_the_protocol(graph: af.Graph, driven: list[str]) -> None:
    x, y = _tiny()
    target = _Target(_LocalMaster)
    async with af.Session(target, graph=graph) as sess:
        assert sess.internals.distributed
        assert await sess.run(y, {x: 1.0}) == 4.0
        assert await sess.make_callable(y, [x])(2.0) == 6.0
    master = target.masters[0]
    assert master.steps == 2
    assert master.closed
    assert len(driven) == 2


def test_a_master_that_is_not_a_session_master_is_refused(graph: af.Graph) -> None:
    target = _Target(lambda session: object())
    open_devices = blas_governor().users
    with pytest.raises(TypeError, match=r"not an asyncflow\.session\.seam\.SessionMaster"):
        af.Session(target, graph=graph)
    assert blas_governor().users == open_devices  # its devices were closed


# -- the seam for other modules ---------------------------------------------------------


def test_internals_state_the_seam(graph: af.Graph) -> None:
    v = af.Variable(np.float32(3.0), name="v")
    with af.Session(graph=graph) as sess:
        sess.run_sync(af.global_variables_initializer())
        internals: SessionInternals = sess.internals
        assert not internals.distributed
        assert internals.resources is sess._resources
        call = sess._prepare(v, None)
        bound = internals.bind(call.compiled.plans[0])
        assert bound.plan is call.compiled.plans[0]
        assert sess.internals is not sess.internals  # made per use: no cycle kept


def _private_reaches() -> list[str]:
    found = []
    pattern = re.compile(r"\b(sess|session)\._")
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(PACKAGE / "session"):
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                found.append(f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}")
    return found


def test_no_module_outside_the_session_package_reads_its_privates() -> None:
    assert _private_reaches() == []


def test_the_old_session_modules_are_gone() -> None:
    for old in ("session.py", "callables.py", "fetch_feed.py", "partial_run.py", "streaming.py"):
        assert not (PACKAGE / old).exists(), old
    for old in ("runners.py", "admission.py"):
        assert not (PACKAGE / "runtime" / old).exists(), old


# -- the cost of a step in flight ------------------------------------------------------


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _tracked() -> collections.Counter[str]:
    return collections.Counter(type(o).__name__ for o in gc.get_objects())


async def _in_flight(
    steps: int, start: Callable[[asyncio.Event], Coroutine[Any, Any, Any]]
) -> tuple[float, collections.Counter[str]]:
    """GC-tracked objects per in-flight step (each waiting on one event), and the
    coroutines alive then, by name."""
    gate = asyncio.Event()
    before = len(gc.get_objects())
    # Each task in a context of its own that holds nothing yet: the context a step
    # makes (the running step, numpy's quiet state) is a copy of its task's, whose
    # size grows with the context variables the process set before (the suite's
    # earlier tests: two objects more a step once 17 variables are set).
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(start(gate), context=contextvars.Context()) for _ in range(steps)]
    for _ in range(3):
        await asyncio.sleep(0)
    per_step = (len(gc.get_objects()) - before) / steps
    coros = collections.Counter(
        o.cr_code.co_qualname for o in gc.get_objects() if inspect.iscoroutine(o)
    )
    gate.set()
    await asyncio.gather(*tasks)
    return per_step, coros


class _Gated:
    """An async kernel (for ``py_func``) that returns its input once ``gate`` is set
    (open at first: a step runs through)."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, v: Any) -> Any:
        await self.gate.wait()
        return v


async def _held_steps(
    graph: af.Graph, io: _Gated, fetch: Any, feed: dict[Any, Any], expected: float
) -> tuple[float, collections.Counter[str]]:
    """One step of ``fetch`` through (its value ``expected``), then :func:`_in_flight`
    of 500 steps held at ``io``'s gate."""
    async with af.Session(graph=graph) as sess:
        assert await sess.run(fetch, feed) == expected

        def step(gate: asyncio.Event) -> Coroutine[Any, Any, Any]:
            io.gate = gate
            return sess.run(fetch, feed)

        return await _in_flight(500, step)


async def test_a_step_awaiting_one_kernel_keeps_few_objects(
    graph: af.Graph, collector_off: None
) -> None:
    io = _Gated()
    x = af.placeholder(af.float32, shape=(), name="x")
    y = af.multiply(af.py_func(io, [x], af.float32, name="io"), np.float32(2.0))
    ours, coros = await _held_steps(graph, io, y, {x: 1.0}, 2.0)
    # The driver, which awaits the lone node's kernel in its own frame (Step.run's
    # loop, written out there): one level above the kernel (six before the session had
    # one driver, three before the lone node was awaited in Step.run, two while
    # Step.run awaited it under the driver), and 11 tracked objects per step (32
    # before, 22-24 with that third level and the context's Tokens held, 19 while the
    # step kept its call frame and so its args, 17 while it kept its own pending counts
    # and an idle ready stack, 15 while it set the running step and numpy's quiet state
    # in its task's context, 13 while the step and its propagator were two objects, 12
    # while Step.run was a level of its own; a task of a plain coroutine awaiting the
    # same keeps about 9).
    assert coros["Session._drive"] == 500
    assert coros["Step.run"] == 0
    assert coros["Step._await_alone"] == 0
    assert coros["Step._run_node"] == 0
    assert coros["Step._in_task_group"] == 0
    assert coros["Session.run"] == 0
    assert ours < 12, ours


async def test_a_step_awaiting_two_kernels_keeps_one_task_and_few_objects(
    graph: af.Graph, collector_off: None
) -> None:
    io = _Gated()
    x = af.placeholder(af.float32, shape=(), name="x")
    a = af.py_func(io, [x], af.float32, name="a")
    b = af.py_func(io, [x + 1.0], af.float32, name="b")
    y = (a + b) * np.float32(2.0)
    ours, coros = await _held_steps(graph, io, y, {x: 1.0}, 6.0)
    # The first kernel awaited in the driver's frame, the other in one task of the
    # step's own group: 24 tracked objects per step (42 when each kernel had a task and
    # its _run_node coroutine, and the step its task-group loop and a wake-up future;
    # 31 while the step kept its call frame and so its args; 29 while the step set the
    # running step and numpy's quiet state in the contexts of its task and the other;
    # 26 while the step and its propagator were two objects; 25 while Step.run was a
    # level of its own).
    assert coros["Session._drive"] == 500
    assert coros["Step.run"] == 0
    assert coros["Step._run_node"] == 500
    assert coros["Step._in_task_group"] == 0
    assert coros["Step._drive"] == 0
    assert ours < 25, ours


async def test_a_step_waiting_for_its_task_after_its_first_kernel_has_no_group_level(
    graph: af.Graph, collector_off: None
) -> None:
    """The first kernel returned, the other still runs in the step's own group, and
    nothing is ready: the driver awaits the step's wake-up future itself (what
    ``Step._next_wait`` hands it), with no coroutine of the step's waiting loop and none
    for the group."""
    callers: set[asyncio.Task[Any] | None] = set()
    gate = asyncio.Event()

    async def io(v: Any) -> Any:
        # The kernel awaited in the caller's task returns at once, the one in a task
        # of the step's group waits for the gate.
        if asyncio.current_task() not in callers:
            await gate.wait()
        return v

    x = af.placeholder(af.float32, shape=(), name="x")
    y = (af.py_func(io, [x], af.float32) + af.py_func(io, [x + 1.0], af.float32)) * 2.0
    async with af.Session(graph=graph) as sess:
        gate.set()
        assert await sess.run(y, {x: 1.0}) == 6.0
        gate.clear()
        tasks = [asyncio.ensure_future(sess.run(y, {x: 1.0})) for _ in range(50)]
        callers.update(tasks)
        for _ in range(4):
            await asyncio.sleep(0)
        coros = collections.Counter(
            o.cr_code.co_qualname for o in gc.get_objects() if inspect.iscoroutine(o)
        )
        gate.set()
        assert await asyncio.gather(*tasks) == [6.0] * 50
    assert coros["Step.run"] == 0  # (its loop is the driver's)
    assert coros["Step._next_wait"] == 0  # (not a coroutine: it hands the loop over)
    assert coros["Step._run_node"] == 50  # the waiting kernel's task
    assert coros["Step._drive"] == 0  # the driver awaits the wake-up future, not a loop
    assert coros["Step._run_tasks"] == 0
    assert coros["Step._in_task_group"] == 0


async def test_a_refused_run_raises_when_awaited_as_from_an_async_def(graph: af.Graph) -> None:
    x, y = _tiny()
    async with af.Session(graph=graph) as sess:
        bad_feed = sess.run(y, {x: np.zeros((2, 2), np.float32)})  # no error yet
        with pytest.raises(ValueError, match="Cannot feed value of shape"):
            await bad_feed
        wrong_count = sess.make_callable(y, [x])(1.0, 2.0)
        with pytest.raises(TypeError, match="expected 1 feed values"):
            await wrong_count
        assert await sess.run(y, {x: 1.0}) == 4.0  # the session stays usable
