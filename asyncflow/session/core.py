"""Session: the DirectSession of asyncflow.

``await sess.run(fetches, feed_dict)`` resolves its *signature* (the fetch
structure, the feed keys), looks up the compiled call for it — on a miss compiling
it once (:func:`~asyncflow.compiler.pipeline.compile_signature`: prune → place →
optimize → control flow → partition → plan, pure) and binding its kernels to this
session's devices and resources (:func:`~asyncflow.runtime.bind.bind`) — then runs
one :class:`~asyncflow.runtime.step.Step` per partition (an
:class:`~asyncflow.runtime.barrier.ExecutorBarrier` over several) and rebuilds the
caller's fetch structure from the step's return values.  ``run``,
``make_callable`` and ``partial_run`` share that one compile-and-bind path, and one
definition of the fast path (``CompiledCall.fast``).

Long-lived state (the plan cache, the devices and their thread pools, the set of
in-flight steps) holds nothing bound to an event loop, so one session serves
``await run`` on any loop and ``run_sync`` from any thread at once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import sys
import threading
import time
import traceback
import weakref
from collections.abc import AsyncGenerator, Callable, Coroutine, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any

from asyncflow import errors
from asyncflow._backend import require_asyncio, running_loop
from asyncflow.compiler.ir import GraphIR, graph_ir, ref_of
from asyncflow.compiler.optimize import OptimizerStats
from asyncflow.compiler.pipeline import Compiled, compile_signature
from asyncflow.compiler.placement import place
from asyncflow.compiler.plan import Plan
from asyncflow.config import RunMetadata, RunOptions, SessionConfig
from asyncflow.framework.device_spec import canonical_device
from asyncflow.framework.graph import Graph, Tensor, get_default_graph
from asyncflow.runtime import function_call as _function_call  # registers the _Call kernel
from asyncflow.runtime.barrier import ExecutorBarrier, StepRunner
from asyncflow.runtime.bind import BoundPlan, bind
from asyncflow.runtime.call_frame import CallFrame
from asyncflow.runtime.devices import LocalDevice
from asyncflow.runtime.gc_pause import gc_paused
from asyncflow.runtime.observe.progress import ProgressObserver
from asyncflow.runtime.rendezvous import LocalRendezvous
from asyncflow.runtime.resources import ResourceMgr
from asyncflow.runtime.step import RAISE_ON, SLICE, Step, run_through
from asyncflow.session.admission import Admission
from asyncflow.session.call import CompiledCall
from asyncflow.session.callables import SessionCallable
from asyncflow.session.fetch_feed import FetchMapper, Rebuild, feed_converter, fetch_key
from asyncflow.session.partial_run import PartialRuns
from asyncflow.session.runners import SyncRunners
from asyncflow.session.seam import SessionInternals, SessionMaster
from asyncflow.session.streaming import stream

__all__ = ["Session", "SessionStatistics"]

#: What the driver's first phase returns when the step has work left for the loop.
_LEFT: Any = object()

logger = logging.getLogger("asyncflow.session")
placement_logger = logging.getLogger("asyncflow.placement")

#: A step that runs at least this long (seconds) is logged at DEBUG ("slow step").
SLOW_STEP_SECONDS = 1.0
del _function_call


@dataclass(frozen=True, slots=True)
class SessionStatistics:
    """A snapshot of a session's counters (``Session.statistics()``).

    ``in_flight`` counts steps registered on a loop (a step that finishes within its
    first time slice without waiting never is); ``completed`` / ``failed`` count every
    ``run``, ``run_sync``, callable call and ``run_stream`` step by outcome (a
    cancelled or timed-out step, or one refused a slot before its deadline, failed).
    """

    steps_started: int
    compiles: int
    cache_hits: int
    cached_plans: int
    in_flight: int
    closed: bool
    #: Per cached plan: what the graph optimizer did (nodes removed by constant
    #: folding and CSE, calls inlined), in compile order.
    optimizer: tuple[OptimizerStats, ...] = ()
    #: Steps waiting for a slot (``SessionConfig.max_concurrent_steps``), FIFO.
    waiting: int = 0
    #: Steps that returned their values / that raised (errors, deadlines, cancels).
    completed: int = 0
    failed: int = 0
    #: Compiles per run signature ("fetches <- feeds"), in the order first compiled.
    compiles_per_plan: Mapping[str, int] = field(default_factory=dict)


# -- the session --------------------------------------------------------------------


class Session:
    """Runs (parts of) a graph.  ``await sess.run(...)`` in async code, ``run_sync`` elsewhere.

    ``async with af.Session(graph=g) as sess`` / ``with af.Session(graph=g) as sess``
    close it on exit.  Safe to use from many tasks and threads at once.
    """

    def __init__(
        self,
        target: str | Graph | Any = "",
        graph: Graph | None = None,
        config: SessionConfig | None = None,
    ) -> None:
        if isinstance(target, Graph) and graph is None:
            # Convenience: af.Session(g) (TF's first positional argument is `target`).
            graph, target = target, ""
        # A cluster (asyncflow.distributed) as target: it makes this session's master.
        make_master = (
            None if isinstance(target, str) else getattr(target, "_asyncflow_master", None)
        )
        if make_master is None and target:
            raise ValueError(f"target {target!r}: only the in-process target '' is supported")
        if graph is None:
            graph = get_default_graph()
        if not isinstance(graph, Graph):
            raise TypeError(f"graph must be an af.Graph, got {type(graph).__name__}")
        if config is None:
            config = SessionConfig()
        elif not isinstance(config, SessionConfig):
            raise TypeError(f"config must be an af.SessionConfig, got {type(config).__name__}")
        self._graph = graph
        self._config = config
        n_cpu = config.device_count.get("CPU", config.device_count.get("cpu", 1))
        threads = config.inter_op_parallelism_threads or _default_threads()
        self._devices = tuple(
            LocalDevice(
                canonical_device("CPU", i), "CPU", i, threads, config.intra_op_parallelism_threads
            )
            for i in range(n_cpu)
        )
        self._device_names = tuple(d.name for d in self._devices)
        self._cache: dict[Any, CompiledCall] = {}
        self._compile_lock = threading.Lock()
        # Guards the compile counters below, and close's waits on the steps in flight
        # (see _leave).
        self._counter_lock = threading.Lock()
        self._compiles = 0
        # The counts steps bump, without a lock (see _Tally): plan-cache hits, steps
        # that completed within the driver's inline phase (started and completed at
        # once, counted in both), and the others' starts and outcomes.
        self._hits = _Tally()
        self._inline_done = _Tally()
        self._steps = _Tally()
        self._completed = _Tally()
        self._failed = _Tally()
        #: Steps running on a loop; the future (made when close waits) is set when one ends.
        self._in_flight: dict[StepRunner, Future[None] | None] = {}
        self._in_flight_lock = self._counter_lock
        self._closed = False
        # Rendezvous keys carry this session's incarnation (TF: a random 64-bit id
        # per device incarnation), so keys of different sessions never match.
        self._incarnation = random.getrandbits(64)
        # Variables and queues of this session (plans bind their kernels to it).
        self._resources = ResourceMgr()
        self._partial_runs = PartialRuns(self)
        # run_sync's event loops: one per calling thread, closed with the session (or
        # when a session nobody closed is collected).
        self._runners = SyncRunners()
        weakref.finalize(self, self._runners.close)
        # Backpressure (None: no limit); outcome counters and compiles per signature.
        self._admission = (
            Admission(config.max_concurrent_steps) if config.max_concurrent_steps else None
        )
        self._plan_compiles: dict[str, int] = {}
        #: run_sync of an all-inline plan may skip the event loop (see _run_sync).
        self._loop_free = not config.operation_timeout_in_ms and self._admission is None
        self._device_of = {d.name: d for d in self._devices}
        # The graph's IR and the whole-graph placement check, per graph version.
        self._ir_cache: tuple[int, GraphIR] | None = None
        self._placement_checked = -1
        #: The distributed master (None in process): the cluster's devices follow ours.
        self._master: SessionMaster | None = None
        if make_master is not None:
            self._master = self._made_master(make_master, target)
            self._device_names += self._master.device_names

    def _made_master(self, make_master: Callable[[Session], Any], target: Any) -> SessionMaster:
        """The master ``target`` makes for this session; when it cannot, the devices
        are closed before the error propagates (no session: nobody else would)."""
        try:
            master = make_master(self)
            if not isinstance(master, SessionMaster):
                raise TypeError(
                    f"target {target!r} made {master!r} as this session's master: it is "
                    f"not an asyncflow.session.seam.SessionMaster"
                )
        except BaseException:
            for d in self._devices:
                d.close()
            raise
        return master

    # -- properties ------------------------------------------------------------------

    @property
    def graph(self) -> Graph:
        """The graph this session runs."""
        return self._graph

    @property
    def config(self) -> SessionConfig:
        """The session's configuration."""
        return self._config

    @property
    def internals(self) -> SessionInternals:
        """The seam other asyncflow modules use of this session (its resources, binding
        a plan to its devices); not for applications."""
        return _Internals(self)

    def list_devices(self) -> list[str]:
        """The full names of the session's devices."""
        return list(self._device_names)

    def statistics(self) -> SessionStatistics:
        """A frozen snapshot: steps started, compiles (in all and per signature), plan-cache
        hits, cached plans, steps in flight / waiting for a slot / completed / failed."""
        inline = self._inline_done.value()  # (read once: one count in both figures)
        return SessionStatistics(
            steps_started=self._steps.value() + inline,
            compiles=self._compiles,
            cache_hits=self._hits.value(),
            cached_plans=len(self._cache),
            in_flight=len(self._in_flight),
            closed=self._closed,
            optimizer=tuple(c.compiled.optimizer for c in list(self._cache.values())),
            waiting=self._admission.waiting if self._admission is not None else 0,
            completed=self._completed.value() + inline,
            failed=self._failed.value(),
            compiles_per_plan=dict(self._plan_compiles),
        )

    def __repr__(self) -> str:
        s = self.statistics()
        return f"<Session steps={s.steps_started} cached_plans={s.cached_plans} closed={s.closed}>"

    # -- running -----------------------------------------------------------------------

    def run(
        self,
        fetches: Any,
        feed_dict: Mapping[Any, Any] | None = None,
        options: RunOptions | None = None,
        run_metadata: RunMetadata | None = None,
    ) -> Coroutine[Any, Any, Any]:
        """Run one step: ``await sess.run(fetches, feed_dict)`` returns ``fetches``'
        structure with tensors replaced by values.

        Operations (targets) give ``None``; 0-d values are numpy scalars.  A failing
        step raises one ``af.errors.OpError`` naming the node.  What this returns is
        the step's own coroutine (the session's driver, with no coroutine around it:
        one level less per step in flight); as from an ``async def``, a fetch or feed
        the session cannot run is raised when it is awaited.
        """
        try:
            if options is not None or run_metadata is not None:
                _check_run_args(options, run_metadata)
            call = self._prepare(fetches, feed_dict)
            frame = call.frame(feed_dict)
        except Exception as exc:
            return _raising(exc)
        if options is None and self._admission is None:  # _start's first door, inline
            return self._drive(
                call, frame, self._config.operation_timeout_in_ms, None, run_metadata
            )
        return self._doors(call, frame, options, run_metadata)

    def run_sync(
        self,
        fetches: Any,
        feed_dict: Mapping[Any, Any] | None = None,
        options: RunOptions | None = None,
        run_metadata: RunMetadata | None = None,
    ) -> Any:
        """``run`` for code without an event loop.

        The step runs on this session's event loop for the calling thread (one
        ``asyncio.Runner`` per session and thread, made on first use and closed with
        the session), so async kernels see the same loop from call to call.  A plan
        made only of inline kernels, without a deadline (traced or not), never awaits,
        so it runs without any event loop (same results, same errors).  Called while
        an event loop runs in this thread, it raises ``RuntimeError``: use
        ``await sess.run(...)``.
        """
        _check_no_running_loop("Session.run_sync()", "sess.run(...)")
        if options is not None or run_metadata is not None:
            _check_run_args(options, run_metadata)
        call = self._prepare(fetches, feed_dict)
        return self._run_sync(call, call.frame(feed_dict), options, run_metadata)

    def _run_sync(
        self,
        call: CompiledCall,
        frame: CallFrame,
        options: RunOptions | None,
        run_metadata: RunMetadata | None,
    ) -> Any:
        """The sync door of ``run_sync`` and callables: the one driver, on no loop when
        it cannot need one, else on this thread's loop."""
        # No loop at all: no deadline (its own or the session's), no slot to wait for,
        # no progress ticker (traced or not: tracing never awaits), and a plan that
        # needs no loop to start (``call.sync_first``).
        if (
            call.sync_first
            and self._loop_free
            and (options is None or (not options.timeout_in_ms and options.progress is None))
        ):
            # The driver's first phase, called as it is (stepping the driver's coroutine
            # once would do the same, and cost a coroutine and a StopIteration per
            # call): an all-inline step is that phase run to its end.
            trace = _wants_trace(options, run_metadata)
            if call.step_less and not trace and run_metadata is None:
                result = self._through(call, frame)
                if result is not _LEFT:
                    return result
            step = self._runner(call, frame, trace)
            if call.fast:
                return self._inline_phase(call, step, None, options, run_metadata)
            result = self._inline_phase(call, step, SLICE, options, run_metadata)
            if result is not _LEFT:
                return result
            # A node that hops, or a slice that ran over: phase 2, on this thread's loop.
            return self._runners.run(self._drive(call, frame, 0, options, run_metadata, step=step))
        return self._runners.run(self._doors(call, frame, options, run_metadata))

    def run_stream(
        self,
        fetches: Any,
        feed_dict: Mapping[Any, Any] | None = None,
        options: RunOptions | None = None,
    ) -> AsyncGenerator[tuple[Any, Any], None]:
        """Run one step and yield ``(fetch, value)`` for each element of ``fetches`` (a
        list or tuple of fetches, or one) as soon as its value is ready.

        ``async for fetch, value in sess.run_stream([a, b], feed_dict): ...`` — values
        come in readiness order, not fetch order; a fetch made of several tensors (a
        nested structure) comes once all of them are ready.  The step's first error is
        raised where it happens, after the values ready before it.  Leaving the loop
        early cancels the rest of the step: deterministically with
        ``async with contextlib.aclosing(sess.run_stream(...)) as stream:`` (a bare
        ``break`` leaves the generator to the garbage collector, which closes it on
        the loop soon after).  Fed tensors and constants come first, before any kernel
        ran; fetches no kernel produces (operations, ``while_loop`` outputs) come when
        the step ends.
        """
        return stream(self, fetches, feed_dict, options)

    def make_callable(
        self, fetches: Any, feed_list: Sequence[Any] | None = None, accept_options: bool = False
    ) -> SessionCallable:
        """An async callable running ``fetches`` with positional feed values.

        The signature is resolved and compiled now; each call skips that work.
        ``accept_options=True`` adds ``options=`` and ``run_metadata=`` keywords.
        ``fn.run_sync(*feed_values)`` calls it from plain code, as ``run_sync``.
        """
        feed_list = list(feed_list or ())
        feed_dict = dict.fromkeys(feed_list)
        if len(feed_dict) != len(feed_list):
            raise ValueError(f"feed_list has duplicate entries: {feed_list!r}")
        call = self._prepare(fetches, feed_dict)
        converters = call.converters
        n = len(feed_list)

        def frame_of(
            feed_values: tuple[Any, ...],
            options: RunOptions | None,
            run_metadata: RunMetadata | None,
        ) -> CallFrame:
            if len(feed_values) != n:
                raise TypeError(
                    f"expected {n} feed values (for {feed_list!r}), got {len(feed_values)}"
                )
            if options is not None or run_metadata is not None:
                if not accept_options:
                    raise TypeError("this callable was made without accept_options=True")
                _check_run_args(options, run_metadata)
            self._check_open()
            return CallFrame([conv(v) for conv, v in zip(converters, feed_values)])

        def run(
            feed_values: tuple[Any, ...],
            options: RunOptions | None,
            run_metadata: RunMetadata | None,
        ) -> Coroutine[Any, Any, Any]:
            try:
                frame = frame_of(feed_values, options, run_metadata)
            except Exception as exc:
                return _raising(exc)
            return self._start(call, frame, options, run_metadata)

        def run_sync(
            feed_values: tuple[Any, ...],
            options: RunOptions | None,
            run_metadata: RunMetadata | None,
        ) -> Any:
            _check_no_running_loop("SessionCallable.run_sync()", "fn(...)")
            frame = frame_of(feed_values, options, run_metadata)
            return self._run_sync(call, frame, options, run_metadata)

        return SessionCallable(run, run_sync, call.signature)

    # -- the one driver ------------------------------------------------------------------

    def _start(
        self,
        call: CompiledCall,
        frame: CallFrame,
        options: RunOptions | None,
        run_metadata: RunMetadata | None,
    ) -> Coroutine[Any, Any, Any]:
        """The door of every async step (``run``, callables, ``run_stream``, progress):
        the driver itself (not a coroutine around it) when no option asks for more."""
        if options is None and self._admission is None:
            timeout_ms = self._config.operation_timeout_in_ms
            return self._drive(call, frame, timeout_ms, None, run_metadata)
        return self._doors(call, frame, options, run_metadata)

    async def _doors(
        self,
        call: CompiledCall,
        frame: CallFrame,
        options: RunOptions | None,
        run_metadata: RunMetadata | None,
    ) -> Any:
        """What options add before a step is made: a progress ticker beside it, a slot
        to wait for (``max_concurrent_steps``); then the one driver."""
        require_asyncio("Session.run")
        if options is not None and options.progress is not None:
            return await self._with_progress(call, frame, options, run_metadata)
        if self._admission is not None:
            return await self._admitted(call, frame, options, run_metadata)
        return await self._drive(call, frame, self._timeout_ms(options), options, run_metadata)

    async def _drive(  # noqa: C901, PLR0915 - the per-step hot path, see below
        self,
        call: CompiledCall,
        frame: CallFrame,
        timeout_ms: int,
        options: RunOptions | None,
        run_metadata: RunMetadata | None,
        slice_s: float | None = SLICE,
        step: StepRunner | None = None,
    ) -> Any:
        """The one driver of every step, whatever door it came through (``run``,
        ``run_sync``, callables, ``run_stream``, partial runs, ``eval``, distributed).

        The step of ``call`` over ``frame`` is made here, when the driver first runs
        (a step whose coroutine never ran was never made), unless the caller made it
        (``step``: a partial run's, with its own rendezvous) — or not at all: a step
        that cannot suspend (one block of synchronous kernels, :func:`run_through`) runs
        to its end without being made, as phase 1 would run it.  Phase 1, the inline time
        slice (``call.inline_first``): the step runs right here, synchronously, for
        ``slice_s`` seconds (``None``: to its end, for a caller with no loop) — no loop
        registration, no task; a step that finishes so returns without suspending
        (``run_sync`` of an all-inline plan, on no loop at all, is this phase run to
        its end: :meth:`_inline_phase`, called directly).  Phase 2,
        what is left: the step is registered in flight (``close`` aborts and waits for
        it) and awaited on the loop, under ``timeout_ms`` when positive.  A step made
        here, untraced and with no deadline, is awaited through its await protocol
        written out in this frame (``Step.run``'s loop): its lone kernel is awaited by
        the driver itself.

        (Longer than the house's limits on purpose: a helper coroutine around that
        await would be the coroutine level per step in flight this avoids.)
        """
        # (Asking for the running loop costs a system call, CPython checking the process
        # id: asked once here, and handed to the step that awaits here.)
        loop = running_loop()
        if loop is None and slice_s is not None:
            require_asyncio("Session.run")  # raises, saying what to do instead
        here: Step | None = None  # a step whose lone kernel this frame awaits itself
        kept: list[Step] | None = None  # where ``here`` is kept when it completes
        if step is None:
            trace = options is not None and _wants_trace(options, run_metadata)
            if call.step_less and not trace and run_metadata is None:
                result = self._through(call, frame)
                if result is not _LEFT:
                    return result
            if call.single and self._master is None:  # (_runner's first case: no call)
                if not trace and timeout_ms <= 0:
                    if run_metadata is None:  # (metadata reads its step after: not kept)
                        kept = call.spare
                        step = here = Step.again(call.bound[0], frame, kept)
                    else:
                        step = here = Step(call.bound[0], frame)
                else:
                    step = Step(call.bound[0], frame, trace)
            else:
                step = self._runner(call, frame, trace)
        del frame  # (the step has its args: not kept while it is in flight)
        if call.inline_first:
            result = self._inline_phase(call, step, slice_s, options, run_metadata)
            if result is not _LEFT:
                return result
        # Steps that reach the loop are the ones that can be slow: timed (two clock
        # reads, cheaper than asking the logger first), logged when the DEBUG log shows it.
        started = time.perf_counter()
        self._enter(step)
        try:
            if here is not None:
                # ``Step.run``'s loop, written out in this frame for the step made here
                # (untraced, no deadline): the lone kernel is awaited by the driver
                # itself, one coroutine level less per step in flight.  Every rule is
                # in the step's methods; ``Step.run`` is the reference.
                try:
                    work = here.start_waiting(loop)
                    while work is not None:
                        try:
                            v = await work
                        except BaseException as exc:
                            if (work := here.await_raised(exc)) is RAISE_ON:
                                raise
                        else:
                            work = here.awaited(v)
                    values = here.outcome()
                except BaseException as exc:
                    await here.unwind(exc)
                    raise
            elif timeout_ms > 0:
                values = await self._within(step, timeout_ms)
            else:
                values = await step.run()
        except BaseException:
            self._count_failed(call)
            self._leave(step)
            raise
        self._leave(step, True, kept)
        if (took := time.perf_counter() - started) >= SLOW_STEP_SECONDS and logger.isEnabledFor(
            logging.DEBUG
        ):
            logger.debug(
                "slow step: %s took %.3f s (over %.3g s)", call.signature, took, SLOW_STEP_SECONDS
            )
        if run_metadata is not None:
            self._fill_metadata(call, step, options, run_metadata)
        return call.results(values)

    def _through(self, call: CompiledCall, frame: CallFrame) -> Any:
        """A step that cannot suspend, run without making it (:func:`run_through`);
        ``_LEFT`` when its step must be made."""
        try:
            values = run_through(call.bound[0], frame)
        except BaseException:
            self._count_failed(call, started=True)
            raise
        if values is None:
            return _LEFT
        self._inline_done.bump()
        return call.results(values)

    def _inline_phase(
        self,
        call: CompiledCall,
        step: StepRunner,
        slice_s: float | None,
        options: RunOptions | None,
        run_metadata: RunMetadata | None,
    ) -> Any:
        """The driver's phase 1: ``step`` runs here for ``slice_s`` seconds (``None``:
        to its end); its result when it finished so, else ``_LEFT`` (phase 2 goes on)."""
        try:
            values = step.run_inline(slice_s)  # type: ignore[union-attr]
        except BaseException:
            step.release()
            self._count_failed(call, started=True)
            raise
        if values is None:
            assert slice_s is not None, "an all-inline step run to its end left work"
            return _LEFT
        self._inline_done.bump()
        if run_metadata is not None:
            self._fill_metadata(call, step, options, run_metadata)
        result = call.results(values)
        step.release()
        return result

    async def _within(self, step: StepRunner, timeout_ms: int) -> list[Any]:
        """``step.run()`` under a deadline ``timeout_ms`` from now (the driver's phase 2)."""
        # The kernels still running are noted at the deadline itself, so the error can
        # name what was pending: the note and the timeout's own handle are due at the
        # same time, and a cancelled task resumes only on a later loop turn, so the note
        # runs before the cancellation reaches a kernel (noting first and cancelling a
        # turn later let steps finish past it).
        loop = asyncio.get_running_loop()
        when = loop.time() + timeout_ms / 1000
        pending: list[str] = []
        alarm = loop.call_at(when, lambda: pending.extend(_running_nodes(step)))
        deadline = asyncio.timeout_at(when)
        try:
            async with deadline:
                return await step.run()
        except TimeoutError as exc:
            expired = deadline.expired()
            if step.finished:
                # Every node ran before the deadline landed: the step's outcome is its
                # results (a dequeue that took elements delivers them).
                return step.results()
            if step.error is not None:
                # The first error wins, even over a deadline that passed while the step
                # waited for its other kernels to stop.
                raise step.error from None
            if expired and not isinstance(exc, errors.OpError):
                _clear_frames(exc)
                raise self._deadline_error(timeout_ms, pending) from None
            raise
        finally:
            alarm.cancel()
            # The timeout holds this task: an error leaving through this frame (in its
            # traceback) would make a cycle with the task holding it.
            del deadline

    async def _with_progress(
        self,
        call: CompiledCall,
        frame: CallFrame,
        options: RunOptions,
        run_metadata: RunMetadata | None,
    ) -> Any:
        """A step reporting to ``options.progress`` (a ticker task beside the step)."""
        assert options.progress is not None
        observer = ProgressObserver(options.progress)
        counted = call.with_plans([observer.observe(b) for b in call.bound])
        return await observer.run_beside(
            self._start(counted, frame, replace(options, progress=None), run_metadata)
        )

    async def _admitted(
        self,
        call: CompiledCall,
        frame: CallFrame,
        options: RunOptions | None,
        run_metadata: RunMetadata | None,
    ) -> Any:
        """A step with a slot held (``SessionConfig.max_concurrent_steps``)."""
        admission = self._admission
        assert admission is not None
        if not admission.try_acquire():
            try:
                left = await admission.acquire_within(self._timeout_ms(options))
            except BaseException:
                self._count_failed(call)
                raise
            if left:  # the rest of the deadline is the step's
                options = (
                    replace(options, timeout_in_ms=left)
                    if options is not None
                    else RunOptions(timeout_in_ms=left)
                )
        try:
            if self._closed:  # closed while this step waited for its slot
                self._count_failed(call)
                self._check_open()
            timeout_ms = self._timeout_ms(options)
            return await self._drive(call, frame, timeout_ms, options, run_metadata)
        finally:
            admission.release()

    def _count_failed(self, call: CompiledCall | None = None, started: bool = False) -> None:
        """Count a failed step (called where its exception is being handled) and log it
        at DEBUG; ``started``: count it started too (a step that failed in the driver's
        first phase, never registered)."""
        self._failed.bump()
        if started:
            self._steps.bump()
        if logger.isEnabledFor(logging.DEBUG):
            exc = sys.exc_info()[1]
            logger.debug(
                "step failed: %s: %s",
                call.signature if call is not None else "(waiting for a slot)",
                _one_line(exc),
            )

    def _fill_metadata(
        self,
        call: CompiledCall,
        step: StepRunner,
        options: RunOptions | None,
        run_metadata: RunMetadata,
    ) -> None:
        """What a finished step tells the caller's ``RunMetadata`` (asked only when the
        caller passed one: no call per step otherwise)."""
        run_metadata.clear()
        stats = step.stats
        if stats is not None:
            run_metadata.step_stats = stats
        if options is not None and options.output_partition_graphs:
            run_metadata.partition_graphs = call.graph_defs()

    def _runner(
        self,
        call: CompiledCall,
        frame: CallFrame,
        trace: bool = False,
        rendezvous: LocalRendezvous | None = None,
    ) -> StepRunner:
        """The step of a compiled call: one partition's Step, or a barrier over several."""
        if self._master is not None:
            return self._master.runner(call, frame, trace, rendezvous)
        if call.single:
            return Step(call.bound[0], frame, trace, rendezvous)
        return ExecutorBarrier(
            call.bound, call.compiled.retval_map, frame, trace=trace, rendezvous=rendezvous
        )

    # -- partial runs ----------------------------------------------------------------------

    async def partial_run_setup(self, fetches: Any, feeds: Sequence[Any] | None = None) -> str:
        """Start a step whose feeds arrive and whose fetches leave over several
        :meth:`partial_run` calls (TF's ``partial_run_setup``); returns its handle.

        ``fetches`` may include operations (targets).  The step runs on this event
        loop: later ``partial_run`` calls with this handle must use the same loop.
        """
        require_asyncio("Session.partial_run_setup")
        return await self._partial_runs.setup(fetches, feeds)

    async def partial_run(
        self, handle: str, fetches: Any, feed_dict: Mapping[Any, Any] | None = None
    ) -> Any:
        """Feed some of the declared feeds and fetch some of the declared fetches.

        Each declared feed may be fed once and each fetch fetched once; anything else
        is an ``InvalidArgumentError`` with TensorFlow's message.
        """
        require_asyncio("Session.partial_run")
        return await self._partial_runs.run(handle, fetches, feed_dict)

    def _timeout_ms(self, options: RunOptions | None) -> int:
        return (
            options.timeout_in_ms
            if options is not None and options.timeout_in_ms
            else self._config.operation_timeout_in_ms
        )

    def _enter(self, step: StepRunner) -> None:
        """Count ``step`` and register it in flight (``close`` aborts and waits for it).

        No lock (any thread's steps, atomic under the GIL): the step is registered
        before ``_closed`` is read, and ``close`` sets ``_closed`` before it lists the
        steps in flight, so either close lists this step or this step sees it closed."""
        self._in_flight[step] = None
        if self._closed:  # (the rule's message is _check_open's: no call otherwise)
            # A close may have listed this step meanwhile, and waits for it: it leaves.
            self._leave(step)
            self._check_open()
        self._steps.bump()

    def _leave(
        self, step: StepRunner, completed: bool = False, spare: list[Step] | None = None
    ) -> None:
        """``step`` is over: unregister it (waking a ``close`` waiting for it), count it
        when it ``completed``, release it — or recycle it into ``spare`` (a step of
        ``Step.again`` nothing else reads), unless the session is closing (a close may
        have listed it, and aborts what it listed)."""
        done = self._in_flight.pop(step, None)
        if done is None and self._closed:
            # A close listed this step and may be making its future right now (it
            # holds the lock while it does, see _begin_close): that future, if any.
            with self._in_flight_lock:
                done = self._in_flight.pop(step, None)
        if completed:
            self._completed.bump()
        if done is not None:  # close() waits for this step
            done.set_result(None)
        if spare is not None and not self._closed:  # (open after the pop: never listed)
            step.recycle(spare)  # type: ignore[union-attr]
        else:
            step.release()

    def _deadline_error(
        self, timeout_ms: float, pending: Sequence[str]
    ) -> errors.DeadlineExceededError:
        """TF's deadline error: it names the first kernel still running (``node_name``,
        ``op``) and lists them all; a step with no kernel running (waiting on a receive,
        or between inline slices) names none."""
        message = f"Timed out waiting for the step to finish (timeout_in_ms={timeout_ms})"
        if not pending:
            return errors.DeadlineExceededError(None, None, message)
        shown = ", ".join(repr(n) for n in pending[:10])
        more = f" and {len(pending) - 10} more" if len(pending) > 10 else ""
        op = self._graph._by_name.get(pending[0])
        return errors.DeadlineExceededError(
            pending[0], op, f"{message}; still running: {shown}{more}"
        )

    # -- compiling ---------------------------------------------------------------------

    def _prepare(self, fetches: Any, feed_dict: Mapping[Any, Any] | None) -> CompiledCall:
        if self._closed:
            self._check_open()
        feed_keys = tuple(feed_dict) if feed_dict else ()
        # (A tensor is its own fetch key: asked here, one call less per run.)
        key = (fetches if type(fetches) is Tensor else fetch_key(fetches), feed_keys)
        call = self._cache.get(key)
        if call is None:
            with self._compile_lock:
                call = self._cache.get(key)
                if call is None:
                    started = time.perf_counter()
                    with gc_paused():
                        call = self._compile(fetches, feed_keys)
                    if logger.isEnabledFor(logging.DEBUG):
                        _log_compile(call, time.perf_counter() - started)
                    self._cache[key] = call
                    with self._counter_lock:
                        self._compiles += 1
                        label = call.signature
                        self._plan_compiles[label] = self._plan_compiles.get(label, 0) + 1
                    return call
        self._hits.bump()
        return call

    def _graph_ir(self) -> GraphIR:
        """The graph's IR, remade only when the graph grew."""
        version = self._graph.version
        cached = self._ir_cache
        if cached is None or cached[0] != version:
            cached = self._ir_cache = (version, graph_ir(self._graph))
        return cached[1]

    def _compile(self, fetches: Any, feed_keys: tuple[Any, ...]) -> CompiledCall:
        mapper = FetchMapper(self._graph, fetches)
        feeds = [self._feed_tensor(k) for k in feed_keys]
        if len(set(feeds)) != len(feeds):
            seen: set[Tensor] = set()
            dup = next(t for t in feeds if t in seen or seen.add(t))  # type: ignore[func-returns-value]
            raise ValueError(f"Tensor {dup.name!r} is fed more than once in feed_dict")
        ir = self._graph_ir()
        soft = self._config.allow_soft_placement
        if (
            not self._config.place_pruned_graph
            and ir.requests
            and self._placement_checked != self._graph.version
        ):
            # As TF's default: every op of the graph must ask for a valid device.
            place(ir.nodes, self._device_names, allow_soft_placement=soft, lookup=ir.by_name)
            self._placement_checked = self._graph.version
        compiled = compile_signature(
            ir,
            feeds=[ref_of(t) for t in feeds],
            fetches=[ref_of(t) for t in mapper.tensors],
            targets=[op.name for op in mapper.targets],
            devices=self._device_names,
            incarnation=self._incarnation,
            allow_soft_placement=soft,
            options=self._config.graph_options.optimizer_options,
            client_device=self._master is None,
        )
        if self._config.log_device_placement:
            _log_placement(
                [
                    f"{name}: ({ir.by_name[name].op if name in ir.by_name else ''}): {device}"
                    for name, device in compiled.placement
                ]
            )
        return self._prepared(
            compiled,
            mapper.tensors,
            feed_keys,
            tuple(feed_converter(t) for t in feeds),
            mapper.rebuild,
        )

    def _prepared(
        self,
        compiled: Compiled,
        fetches: Sequence[Tensor] = (),
        feed_keys: tuple[Any, ...] = (),
        converters: tuple[Callable[[Any], Any], ...] = (),
        rebuild: Rebuild = list,
    ) -> CompiledCall:
        """``compiled`` with its kernels bound to this session's devices and resources:
        the one place a compiled signature meets the runtime."""
        if self._master is not None:
            return self._master.prepared(compiled, fetches, feed_keys, converters, rebuild)
        bound = [self._bind(plan) for plan in compiled.plans]
        call = CompiledCall(compiled, bound, fetches, feed_keys, converters, rebuild)
        call.step_less = call.fast
        return call

    def _bind(self, plan: Plan) -> BoundPlan:
        """``plan``'s kernels bound to its device here and this session's resources."""
        options = self._config.executor_options
        lookup = self._graph._by_name.get
        return bind(plan, self._device_of[plan.device], self._resources, lookup, options)

    def _feed_tensor(self, key: Any) -> Tensor:
        graph = self._graph
        conv = getattr(key, "_as_graph_element", None)
        if conv is not None and not isinstance(key, Tensor):
            key = conv()
        if isinstance(key, Tensor):
            if key.graph is not graph:
                raise ValueError(
                    f"Cannot feed Tensor {key.name!r}: it is not an element of this session's graph"
                )
            t = key
        elif isinstance(key, str):
            if ":" not in key:
                raise TypeError(
                    f"Cannot interpret feed_dict key {key!r} as a Tensor: the name "
                    f"{key!r} refers to an Operation, not a Tensor. Tensor names "
                    f"must be of the form '<op_name>:<output_index>'."
                )
            try:
                t = graph.get_tensor_by_name(key)
            except KeyError as exc:
                raise ValueError(
                    f"Cannot interpret feed_dict key {key!r} as a Tensor: {exc.args[0]}"
                ) from None
        else:
            raise TypeError(
                f"Cannot interpret feed_dict key {key!r} as a Tensor: expected an "
                f"af.Tensor or a name like 'x:0', got {type(key).__name__}"
            )
        if not graph.is_feedable(t):
            raise ValueError(f"Tensor {t.name!r} may not be fed.")
        return t

    # -- closing ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("Attempted to use a closed Session.")

    def _begin_close(self) -> list[Future[None]]:
        with self._in_flight_lock:
            self._closed = True  # (before the steps are listed: see _enter)
            steps = []
            for step in list(self._in_flight):  # (a step may leave meanwhile)
                if step not in self._in_flight:
                    continue  # it left
                done = self._in_flight.get(step)
                if done is None:
                    # Made only now: a step that ends sets it.  One that left since
                    # the line above (seeing the session closed) waits for this lock
                    # and takes this future (see _leave).
                    done = self._in_flight[step] = Future()
                steps.append((step, done))
        for step, _ in steps:
            step.abort_threadsafe(
                errors.CancelledError(None, None, "Session has been closed: the step was cancelled")
            )
        return [done for _, done in steps]

    async def close(self) -> None:
        """Close: cancel in-flight steps (they fail with ``af.errors.CancelledError``),
        wait for them to stop, and release the devices' threads.  Idempotent."""
        require_asyncio("Session.close")
        for done in self._begin_close():
            await asyncio.wrap_future(done)
        # Abandoned partial runs: their steps were aborted above (or had not started).
        await self._partial_runs.close()
        if self._master is not None:
            await self._master.close()
        await self._runners.close_elsewhere()
        self._resources.clear()
        for d in self._devices:
            d.close()

    def close_sync(self) -> None:
        """``close`` for code without an event loop (used by ``with``)."""
        waits = self._begin_close()
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            for done in waits:
                done.result()
        if self._master is not None:
            self._master.close_sync()
        self._runners.close()
        self._resources.clear()
        for d in self._devices:
            d.close()

    async def __aenter__(self) -> Session:
        # Refused at the door under another event loop (trio), before any step: a plan
        # of inline kernels would otherwise run, and the exit fail obscurely.  No exit
        # follows a refused entry: the session is closed here.
        try:
            require_asyncio("async with af.Session(...)")
        except RuntimeError:
            self.close_sync()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close_sync()


class _Internals:
    """:class:`~asyncflow.session.seam.SessionInternals` of one session (made per use:
    a session holds no reference to it, so no cycle)."""

    __slots__ = ("_session",)

    def __init__(self, session: Session) -> None:
        self._session = session

    @property
    def resources(self) -> ResourceMgr:
        return self._session._resources

    @property
    def distributed(self) -> bool:
        return self._session._master is not None

    def bind(self, plan: Plan) -> BoundPlan:
        return self._session._bind(plan)


def _clear_frames(exc: BaseException | None) -> None:
    """Drop the locals of the finished frames a deadline's cancellation went through
    (the step's and asyncio's task group and timeout, which keep the exception that
    unwound them): nothing of the expired step is left for the cycle collector."""
    while exc is not None:
        traceback.clear_frames(exc.__traceback__)
        exc = exc.__context__


def _check_no_running_loop(what: str, instead: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(
        f"{what} cannot be called while an event loop is running in this "
        f"thread; use `await {instead}` instead"
    )


def _log_compile(call: CompiledCall, seconds: float) -> None:
    opt = call.compiled.optimizer
    sizes = ", ".join(str(len(p.nodes)) for p in call.compiled.plans)
    logger.debug(
        "compiled %s in %.1f ms: %d partition(s) of %s node(s); optimizer: "
        "%d -> %d nodes (folded %d, cse %d, inlined %d, %d round(s))",
        call.signature,
        seconds * 1000,
        len(call.compiled.plans),
        sizes,
        opt.nodes_before,
        opt.nodes_after,
        opt.folded,
        opt.cse,
        opt.inlined,
        opt.rounds,
    )


def _log_placement(lines: Sequence[str]) -> None:
    """``log_device_placement``: each node's device, as TF prints it.  Logged at INFO
    (logger ``asyncflow.placement``) when logging is set up to show that, else written
    to stderr as TF does: the user asked for it, and default logging would hide it."""
    if placement_logger.isEnabledFor(logging.INFO) and placement_logger.hasHandlers():
        for line in lines:
            placement_logger.info("%s", line)
    else:
        print("Device mapping:", *lines, sep="\n", file=sys.stderr)


def _one_line(exc: BaseException | None) -> str:
    if exc is None:
        return "(no exception)"
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _running_nodes(step: StepRunner) -> list[str]:
    """The nodes ``step`` is running now (a runner that cannot tell: none)."""
    running = getattr(step, "running", None)
    return list(running()) if running is not None else []


def _check_run_args(options: Any, run_metadata: Any) -> None:
    """The door of every run: TF's ``options`` / ``run_metadata`` must be its protos,
    and a bad one is a ``TypeError`` here, never an ``AttributeError`` mid-step."""
    if options is not None:
        if not isinstance(options, RunOptions):
            raise TypeError(
                f"options must be an af.RunOptions, got {type(options).__name__}: {options!r}"
            )
        options._check()
    if run_metadata is not None and not isinstance(run_metadata, RunMetadata):
        raise TypeError(
            f"run_metadata must be an af.RunMetadata, got "
            f"{type(run_metadata).__name__}: {run_metadata!r}"
        )


def _wants_trace(options: RunOptions | None, run_metadata: RunMetadata | None) -> bool:
    return (
        options is not None
        and run_metadata is not None
        and options.trace_level >= RunOptions.FULL_TRACE
    )


class _Tally:
    """A count that any thread bumps without a lock: ``itertools.count``'s
    ``__next__`` is one C call, atomic under the GIL (a ``+=`` is three bytecodes, so
    two threads may lose one; a lock round costs four times the call).  Its value is
    read from the count's ``repr``, ``count(n)``; reads are rare (``statistics``)."""

    __slots__ = ("_count", "bump")

    def __init__(self) -> None:
        self._count = itertools.count()
        #: Add one.
        self.bump: Callable[[], int] = self._count.__next__

    def value(self) -> int:
        return int(repr(self._count)[6:-1])


async def _raising(exc: Exception) -> Any:
    """A coroutine that raises ``exc`` when awaited: a call that hands back the driver's
    coroutine raises what it refused there, as an ``async def`` would.  The refusing
    frame is cut from the traceback (it holds ``exc``: a cycle)."""
    tb = exc.__traceback__
    if tb is not None:
        exc.__traceback__ = tb.tb_next
    try:
        raise exc
    finally:
        del exc


def _default_threads() -> int:
    import os

    return max(os.cpu_count() or 1, 1)
