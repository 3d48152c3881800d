"""Session: the DirectSession of asyncflow.

``await sess.run(fetches, feed_dict)`` resolves its *signature* (the fetch
structure, the feed keys), looks up the compiled call for it — compiling once on a
miss: prune → place → plan — then runs one :class:`~asyncflow.runtime.executor.Step`
and rebuilds the caller's fetch structure from the step's return values.

Long-lived state (the plan cache, the devices and their thread pools, the set of
in-flight steps) holds nothing bound to an event loop, so one session serves
``await run`` on any loop and ``run_sync`` from any thread at once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from asyncflow import errors
from asyncflow.compiler.partition import (
    Partition,
    client_edges,
    partition,
    partition_graph_def,
)
from asyncflow.compiler.placement import place
from asyncflow.compiler.plan import ExecutionPlan, build_plan, retval_converter
from asyncflow.compiler.prune import prune
from asyncflow.config import RunMetadata, RunOptions, SessionConfig
from asyncflow.fetch_feed import FetchMapper, Rebuild, feed_converter, fetch_key
from asyncflow.framework.device_spec import canonical_device
from asyncflow.framework.graph import Graph, Operation, Tensor, get_default_graph
from asyncflow.ops.control_flow_ops import CONTROL_FLOW_TYPES, WhileContext
from asyncflow.runtime.barrier import ExecutorBarrier
from asyncflow.runtime.call_frame import CallFrame
from asyncflow.runtime.devices import LocalDevice
from asyncflow.runtime.executor import Step
from asyncflow.runtime.frames import FrameStep
from asyncflow.runtime.rendezvous import LocalRendezvous
from asyncflow.runtime.resources import ResourceMgr

__all__ = ["Session", "SessionStatistics"]

logger = logging.getLogger("asyncflow.session")


@dataclass(frozen=True, slots=True)
class SessionStatistics:
    """A snapshot of a session's counters."""

    steps_started: int
    compiles: int
    cache_hits: int
    cached_plans: int
    in_flight: int
    closed: bool


class _CompiledCall:
    """Everything one run signature needs: plan(s), feed converters, fetch rebuild.

    One device: a single ``plan`` run by a :class:`Step`.  Several devices: one plan
    per partition, run by an :class:`ExecutorBarrier`; ``arg_maps[p]`` lists the feed
    indices partition ``p`` reads, ``retval_map[k]`` says where fetch ``k`` comes
    from (``(partition, index)``, or ``(-1, feed index)`` for a fed-and-fetched one).
    """

    __slots__ = ("all_inline", "arg_maps", "converters", "feed_keys", "graph_defs",
                 "partitions", "plan", "rebuild", "retval_converters", "retval_map")

    def __init__(self, partitions: Sequence[ExecutionPlan], arg_maps: Sequence[Sequence[int]],
                 retval_map: Sequence[tuple[int, int]], fetches: Sequence[Tensor],
                 feed_keys: tuple[Any, ...], converters: tuple[Callable[[Any], Any], ...],
                 rebuild: Rebuild, graph_defs: Callable[[], list[dict[str, Any]]]) -> None:
        self.partitions = tuple(partitions)
        self.plan = partitions[0] if len(partitions) == 1 else None
        self.all_inline = self.plan is not None and self.plan.all_inline
        self.arg_maps = tuple(tuple(m) for m in arg_maps)
        self.retval_map = tuple(retval_map)
        self.feed_keys = feed_keys
        self.converters = converters
        self.rebuild = rebuild
        self.retval_converters = tuple(retval_converter(t) for t in fetches)
        self.graph_defs = graph_defs

    def frame(self, feed_dict: Mapping[Any, Any] | None) -> CallFrame:
        """The call frame of one step: the converted feed values, in plan order."""
        if not self.converters:
            return CallFrame(())
        return CallFrame([conv(v) for conv, v in zip(self.converters, feed_dict.values())])  # type: ignore[union-attr]

    def runner(self, frame: CallFrame, devices: Sequence[LocalDevice],
               trace: bool) -> Step | ExecutorBarrier | FrameStep:
        """A single partition's Step (a FrameStep with control flow), or a barrier."""
        if self.plan is not None:
            if self.plan.frames is not None:
                return FrameStep(self.plan, frame, devices, trace=trace)
            return Step(self.plan, frame, devices, trace=trace)
        return ExecutorBarrier(self.partitions, self.arg_maps, self.retval_map, frame,
                               devices, trace=trace)

    def results(self, values: Sequence[Any]) -> Any:
        return self.rebuild([c(v) for c, v in zip(self.retval_converters, values)])


# -- the session --------------------------------------------------------------------

class Session:
    """Runs (parts of) a graph.  ``await sess.run(...)`` in async code, ``run_sync`` elsewhere.

    ``async with af.Session(graph=g) as sess`` / ``with af.Session(graph=g) as sess``
    close it on exit.  Safe to use from many tasks and threads at once.
    """

    def __init__(self, target: str | Graph = "", graph: Graph | None = None,
                 config: SessionConfig | None = None) -> None:
        if isinstance(target, Graph) and graph is None:
            # Convenience: af.Session(g) (TF's first positional argument is `target`).
            graph, target = target, ""
        if target:
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
        self._devices = tuple(LocalDevice(canonical_device("CPU", i), "CPU", i, threads)
                              for i in range(n_cpu))
        self._device_names = tuple(d.name for d in self._devices)
        self._cache: dict[Any, _CompiledCall] = {}
        self._compile_lock = threading.Lock()
        self._counter_lock = threading.Lock()  # guards the three counters below
        self._compiles = 0
        self._hits = 0
        self._steps = 0
        self._in_flight: dict[Step | ExecutorBarrier | FrameStep, Future[None]] = {}
        self._in_flight_lock = threading.Lock()
        self._closed = False
        # Rendezvous keys carry this session's incarnation (TF: a random 64-bit id
        # per device incarnation), so keys of different sessions never match.
        self._incarnation = random.getrandbits(64)
        # Variables and queues of this session (plans bind their kernels to it).
        self._resources = ResourceMgr()
        self._partial_runs: dict[str, _PartialRun] = {}
        self._partial_ids = itertools.count(1)

    # -- properties ------------------------------------------------------------------

    @property
    def graph(self) -> Graph:
        """The graph this session runs."""
        return self._graph

    @property
    def config(self) -> SessionConfig:
        """The session's configuration."""
        return self._config

    def list_devices(self) -> list[str]:
        """The full names of the session's devices."""
        return list(self._device_names)

    def statistics(self) -> SessionStatistics:
        """Counters: steps started, compiles, plan-cache hits, cached plans, in-flight steps."""
        return SessionStatistics(
            steps_started=self._steps,
            compiles=self._compiles,
            cache_hits=self._hits,
            cached_plans=len(self._cache),
            in_flight=len(self._in_flight),
            closed=self._closed,
        )

    def __repr__(self) -> str:
        s = self.statistics()
        return f"<Session steps={s.steps_started} cached_plans={s.cached_plans} closed={s.closed}>"

    # -- running -----------------------------------------------------------------------

    async def run(self, fetches: Any, feed_dict: Mapping[Any, Any] | None = None,
                  options: RunOptions | None = None,
                  run_metadata: RunMetadata | None = None) -> Any:
        """Run one step; returns ``fetches``' structure with tensors replaced by values.

        Operations (targets) give ``None``; 0-d values are numpy scalars.  A failing
        step raises one ``af.errors.OpError`` naming the node.
        """
        call = self._prepare(fetches, feed_dict)
        frame = call.frame(feed_dict)
        if call.all_inline and not _wants_trace(options, run_metadata) and not (
                options is not None and options.output_partition_graphs):
            return self._run_inline(call, frame, run_metadata)
        return await self._run_call(call, frame, options, run_metadata)

    def run_sync(self, fetches: Any, feed_dict: Mapping[Any, Any] | None = None,
                 options: RunOptions | None = None,
                 run_metadata: RunMetadata | None = None) -> Any:
        """``run`` for code without an event loop: ``asyncio.run(self.run(...))``.

        A plan made only of inline kernels never awaits, so it runs without creating
        an event loop at all (same results, same errors).  Called while an event loop
        runs in this thread, it raises ``RuntimeError``: use ``await sess.run(...)``.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError("Session.run_sync() cannot be called while an event loop is "
                               "running in this thread; use `await sess.run(...)` instead")
        call = self._prepare(fetches, feed_dict)
        frame = call.frame(feed_dict)
        if call.all_inline and not _wants_trace(options, run_metadata) and not (
                options is not None and options.output_partition_graphs):
            return self._run_inline(call, frame, run_metadata)
        return asyncio.run(self._run_call(call, frame, options, run_metadata))

    def make_callable(self, fetches: Any, feed_list: Sequence[Any] | None = None,
                      accept_options: bool = False) -> Callable[..., Any]:
        """An async callable running ``fetches`` with positional feed values.

        The signature is resolved and compiled now; each call skips that work.
        ``accept_options=True`` adds ``options=`` and ``run_metadata=`` keywords.
        """
        feed_list = list(feed_list or ())
        feed_dict = dict.fromkeys(feed_list)
        if len(feed_dict) != len(feed_list):
            raise ValueError(f"feed_list has duplicate entries: {feed_list!r}")
        call = self._prepare(fetches, feed_dict)
        converters = call.converters
        n = len(feed_list)
        inline = call.all_inline

        async def callable_(*feed_values: Any, options: RunOptions | None = None,
                            run_metadata: RunMetadata | None = None) -> Any:
            if len(feed_values) != n:
                raise TypeError(f"expected {n} feed values (for {feed_list!r}), got "
                                f"{len(feed_values)}")
            if (options is not None or run_metadata is not None) and not accept_options:
                raise TypeError("this callable was made without accept_options=True")
            self._check_open()
            frame = CallFrame([conv(v) for conv, v in zip(converters, feed_values)])
            if inline and not _wants_trace(options, run_metadata):
                return self._run_inline(call, frame, run_metadata)
            return await self._run_call(call, frame, options, run_metadata)

        return callable_

    def _run_inline(self, call: _CompiledCall, frame: CallFrame,
                    run_metadata: RunMetadata | None) -> Any:
        # An all-inline plan completes synchronously: no loop, no task, no registration
        # (nothing can interrupt it, so close() has nothing to cancel).
        with self._counter_lock:
            self._steps += 1
        if run_metadata is not None:
            run_metadata.clear()
        return call.results(Step(call.plan, frame, self._devices).run_inline())  # type: ignore[arg-type]

    async def _run_call(self, call: _CompiledCall, frame: CallFrame,
                        options: RunOptions | None, run_metadata: RunMetadata | None) -> Any:
        runner = call.runner(frame, self._devices, _wants_trace(options, run_metadata))
        values = await self._run_step(runner, options)
        if run_metadata is not None:
            self._fill_metadata(runner, call, options, run_metadata)
        return call.results(values)

    # -- partial runs ----------------------------------------------------------------------

    async def partial_run_setup(self, fetches: Any, feeds: Sequence[Any] | None = None) -> str:
        """Start a step whose feeds arrive and whose fetches leave over several
        :meth:`partial_run` calls (TF's ``partial_run_setup``); returns its handle.

        ``fetches`` may include operations (targets).  The step runs on this event
        loop: later ``partial_run`` calls with this handle must use the same loop.
        """
        self._check_open()
        graph = self._graph
        mapper = FetchMapper(graph, fetches)
        feed_list = [self._feed_tensor(k) for k in (feeds or ())]
        if len(set(feed_list)) != len(feed_list):
            raise ValueError(f"partial_run_setup: feeds has duplicate entries: {feeds!r}")
        ops = prune(mapper.tensors, mapper.targets, frozenset(feed_list))
        if any(op._type in CONTROL_FLOW_TYPES for op in ops):
            raise errors.UnimplementedError(
                None, None, "partial_run of a graph with control flow is not supported")
        soft = self._config.allow_soft_placement
        names = self._device_names
        placement = place(ops, names, allow_soft_placement=soft)
        device = names[0]
        recvs, sends = client_edges(feed_list, mapper.tensors, mapper.targets, device,
                                    self._incarnation)
        edges = {}
        for op in ops:
            if any(t in recvs for t in op._inputs):
                edges[op] = (tuple(recvs[t]._outputs[0] if t in recvs else t
                                   for t in op._inputs), op._control_inputs)
        all_ops = [*recvs.values(), *ops, *sends]
        plan = build_plan(all_ops, [0] * len(recvs) + placement + [0] * len(sends), names,
                          [], [], sends, [d.device_type for d in self._devices], edges=edges,
                          resources=self._resources)
        rendezvous = LocalRendezvous()
        step = Step(plan, CallFrame(()), self._devices, rendezvous=rendezvous)
        handle = f"partial_run_{next(self._partial_ids)}"
        state = _PartialRun(handle, step, rendezvous, asyncio.get_running_loop(),
                            {t: recvs[t]._attrs["key"] for t in feed_list},
                            {t: s._attrs["key"] for t, s in zip(mapper.tensors, sends)},
                            {op: s._attrs["key"]
                             for op, s in zip(mapper.targets, sends[len(mapper.tensors):])})

        async def run_partial() -> None:
            try:
                await self._run_step(step, None)
            except errors.OpError as exc:
                rendezvous.abort(exc)  # waiting partial_run calls fail with the root error
                raise
            except BaseException as exc:
                rendezvous.abort(exc)
                raise

        state.task = asyncio.get_running_loop().create_task(run_partial())
        state.task.add_done_callback(_retrieve)
        self._partial_runs[handle] = state
        return handle

    async def partial_run(self, handle: str, fetches: Any,
                          feed_dict: Mapping[Any, Any] | None = None) -> Any:
        """Feed some of the declared feeds and fetch some of the declared fetches.

        Each declared feed may be fed once and each fetch fetched once; anything else
        is an ``InvalidArgumentError`` with TensorFlow's message.
        """
        state = self._partial_runs.get(handle) if isinstance(handle, str) else None
        if state is None:
            raise errors.InvalidArgumentError(
                None, None, f"The partial run handle {handle!r} is invalid: it was never "
                            f"set up with partial_run_setup (or it already finished)")
        if asyncio.get_running_loop() is not state.loop:
            raise RuntimeError(f"partial run {handle!r} was set up on another event loop")
        mapper = FetchMapper(self._graph, fetches)
        feeds = [(self._feed_tensor(k), v) for k, v in (feed_dict or {}).items()]
        checks: list[tuple[Any, Mapping[Any, str], set[Any], str, str]] = [
            *((t, state.feed_keys, state.fed, "feed", "fed") for t, _ in feeds),
            *((t, state.fetch_keys, state.fetched, "fetch", "fetched")
              for t in mapper.tensors),
            *((op, state.target_keys, state.fetched, "fetch", "fetched")
              for op in mapper.targets)]
        for item, declared, done, what, verb in checks:
            op = item.op if isinstance(item, Tensor) else item
            if item not in declared:
                raise errors.InvalidArgumentError(
                    None, op, f"The {what} {item.name} was not specified in "
                              f"partial_run_setup.")
            if item in done:
                raise errors.InvalidArgumentError(
                    None, op, f"The {what} {item.name} has already been {verb}.")
        converted = [(t, feed_converter(t)(v)) for t, v in feeds]
        try:
            for t, value in converted:
                state.rendezvous.send(state.feed_keys[t], value)
                state.fed.add(t)
            values = []
            for t in mapper.tensors:
                value, _ = await state.rendezvous.recv(state.fetch_keys[t])
                state.fetched.add(t)
                values.append(retval_converter(t)(value))
            for op in mapper.targets:
                await state.rendezvous.recv(state.target_keys[op])
                state.fetched.add(op)
        except errors.AbortedError as exc:
            root = state.step.error
            self._partial_runs.pop(handle, None)
            if isinstance(root, errors.OpError):
                raise root from None
            raise errors.CancelledError(None, None, f"partial run {handle!r} was aborted: "
                                                    f"{exc.message}") from exc
        if state.complete():
            self._partial_runs.pop(handle, None)
            assert state.task is not None
            await state.task
        return mapper.rebuild(values)

    async def _run_step(self, step: Step | ExecutorBarrier | FrameStep,
                        options: RunOptions | None) -> list[Any]:
        with self._counter_lock:
            self._steps += 1
        done: Future[None] = Future()
        with self._in_flight_lock:
            self._check_open()
            self._in_flight[step] = done
        timeout_ms = (options.timeout_in_ms if options is not None and options.timeout_in_ms
                      else self._config.operation_timeout_in_ms)
        try:
            if timeout_ms > 0:
                deadline = asyncio.timeout(timeout_ms / 1000)
                try:
                    async with deadline:
                        return await step.run()
                except TimeoutError as exc:
                    if step.error is not None:
                        # The first error wins, even over a deadline that passed while
                        # the step waited for its other kernels to stop.
                        raise step.error from None
                    if deadline.expired() and not isinstance(exc, errors.OpError):
                        raise errors.DeadlineExceededError(
                            None, None, f"Timed out waiting for the step to finish "
                                        f"(timeout_in_ms={timeout_ms})") from None
                    raise
            return await step.run()
        finally:
            with self._in_flight_lock:
                self._in_flight.pop(step, None)
            done.set_result(None)

    def _fill_metadata(self, step: Step | ExecutorBarrier | FrameStep, call: _CompiledCall,
                       options: RunOptions | None, run_metadata: RunMetadata) -> None:
        run_metadata.clear()
        stats = step.stats
        if stats is not None:
            run_metadata.step_stats = stats
        if options is not None and options.output_partition_graphs:
            run_metadata.partition_graphs = call.graph_defs()

    # -- compiling ---------------------------------------------------------------------

    def _prepare(self, fetches: Any, feed_dict: Mapping[Any, Any] | None) -> _CompiledCall:
        if self._closed:
            raise RuntimeError("Attempted to use a closed Session.")
        feed_keys = tuple(feed_dict) if feed_dict else ()
        key = (fetch_key(fetches), feed_keys)
        call = self._cache.get(key)
        if call is None:
            with self._compile_lock:
                call = self._cache.get(key)
                if call is None:
                    call = self._compile(fetches, feed_keys)
                    self._cache[key] = call
                    with self._counter_lock:
                        self._compiles += 1
                    return call
        with self._counter_lock:
            self._hits += 1
        return call

    def _compile(self, fetches: Any, feed_keys: tuple[Any, ...]) -> _CompiledCall:
        graph = self._graph
        mapper = FetchMapper(graph, fetches)
        feeds = [self._feed_tensor(k) for k in feed_keys]
        if len(set(feeds)) != len(feeds):
            seen: set[Tensor] = set()
            dup = next(t for t in feeds if t in seen or seen.add(t))  # type: ignore[func-returns-value]
            raise ValueError(f"Tensor {dup.name!r} is fed more than once in feed_dict")
        for t in (*feeds, *mapper.tensors):
            if _inside_loop(t):
                what = "fed" if t in feeds else "fetched"
                raise errors.InvalidArgumentError(
                    None, t.op, f"Tensor {t.name!r} is inside a while loop and cannot be "
                                f"{what}; feed or fetch the loop's inputs or outputs instead")
        ops = prune(mapper.tensors, mapper.targets, frozenset(feeds))
        soft = self._config.allow_soft_placement
        if not self._config.place_pruned_graph:
            # As TF's default: every op of the graph must ask for a valid device.
            place(graph.get_operations(), self._device_names, allow_soft_placement=soft)
        placement = place(ops, self._device_names, allow_soft_placement=soft)
        if self._config.log_device_placement:
            for op, dev in zip(ops, placement):
                logger.info("%s: (%s): %s", op.name, op.type, self._device_names[dev])
        converters = tuple(feed_converter(t) for t in feeds)
        device_types = [d.device_type for d in self._devices]
        fetches = mapper.tensors
        names = self._device_names
        if len(set(placement)) <= 1 or any(op._type in CONTROL_FLOW_TYPES for op in ops):
            # One device: no partitioning, no rendezvous, no barrier.  Control flow is
            # not partitioned either: its frames run in one frame executor, each
            # expensive kernel still on its own device's threads.
            plan = build_plan(ops, placement, names, feeds, fetches, mapper.targets,
                              device_types, resources=self._resources)
            one = Partition(placement[0] if placement else 0, tuple(ops), {},
                            tuple(range(len(feeds))), tuple(range(len(fetches))),
                            tuple(mapper.targets))
            return _CompiledCall(
                [plan], [range(len(feeds))], [(0, k) for k in range(len(fetches))], fetches,
                feed_keys, converters, mapper.rebuild,
                lambda: [partition_graph_def(one, names, feeds, fetches)])
        parts = partition(ops, placement, names, feeds, fetches, mapper.targets,
                          self._incarnation)
        plans = [build_plan(p.ops, [p.device] * len(p.ops), names,
                            [feeds[k] for k in p.feeds], [fetches[k] for k in p.fetches],
                            p.targets, device_types, edges=p.edges,
                            resources=self._resources) for p in parts]
        fed = {t: k for k, t in enumerate(feeds)}
        where: dict[int, tuple[int, int]] = {}
        for index, p in enumerate(parts):
            for local, k in enumerate(p.fetches):
                where[k] = (index, local)
        retval_map = [(-1, fed[t]) if t in fed else where[k] for k, t in enumerate(fetches)]
        return _CompiledCall(
            plans, [p.feeds for p in parts], retval_map, fetches, feed_keys, converters,
            mapper.rebuild,
            lambda: [partition_graph_def(p, names, feeds, fetches) for p in parts])

    def _feed_tensor(self, key: Any) -> Tensor:
        graph = self._graph
        conv = getattr(key, "_as_graph_element", None)
        if conv is not None and not isinstance(key, Tensor):
            key = conv()
        if isinstance(key, Tensor):
            if key.graph is not graph:
                raise ValueError(f"Cannot feed Tensor {key.name!r}: it is not an element of "
                                 f"this session's graph")
            t = key
        elif isinstance(key, str):
            if ":" not in key:
                raise TypeError(f"Cannot interpret feed_dict key {key!r} as a Tensor: the name "
                                f"{key!r} refers to an Operation, not a Tensor. Tensor names "
                                f"must be of the form '<op_name>:<output_index>'.")
            try:
                t = graph.get_tensor_by_name(key)
            except KeyError as exc:
                raise ValueError(f"Cannot interpret feed_dict key {key!r} as a Tensor: "
                                 f"{exc.args[0]}") from None
        else:
            raise TypeError(f"Cannot interpret feed_dict key {key!r} as a Tensor: expected an "
                            f"af.Tensor or a name like 'x:0', got {type(key).__name__}")
        if not graph.is_feedable(t):
            raise ValueError(f"Tensor {t.name!r} may not be fed.")
        return t

    # -- closing ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("Attempted to use a closed Session.")

    def _begin_close(self) -> list[Future[None]]:
        with self._in_flight_lock:
            self._closed = True
            steps = list(self._in_flight.items())
        for step, _ in steps:
            step.abort_threadsafe(errors.CancelledError(
                None, None, "Session has been closed: the step was cancelled"))
        return [done for _, done in steps]

    async def close(self) -> None:
        """Close: cancel in-flight steps (they fail with ``af.errors.CancelledError``),
        wait for them to stop, and release the devices' threads.  Idempotent."""
        for done in self._begin_close():
            await asyncio.wrap_future(done)
        # Abandoned partial runs: their steps were aborted above (or had not started).
        partials, self._partial_runs = list(self._partial_runs.values()), {}
        loop = asyncio.get_running_loop()
        for state in partials:
            if state.task is not None and state.loop is loop and not state.task.done():
                state.task.cancel()
                await asyncio.wait([state.task])  # its outcome is retrieved by _retrieve
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
        self._resources.clear()
        for d in self._devices:
            d.close()

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close_sync()


@dataclass(eq=False, slots=True)
class _PartialRun:
    """An open partial run: its step, rendezvous and what was fed / fetched so far."""

    handle: str
    step: Step
    rendezvous: LocalRendezvous
    loop: asyncio.AbstractEventLoop
    feed_keys: dict[Tensor, str]
    fetch_keys: dict[Tensor, str]
    target_keys: dict[Operation, str]
    fed: set[Tensor] = field(default_factory=set)
    fetched: set[Tensor | Operation] = field(default_factory=set)
    task: asyncio.Task[None] | None = None

    def complete(self) -> bool:
        return (len(self.fed) == len(self.feed_keys)
                and len(self.fetched) == len(self.fetch_keys) + len(self.target_keys))


def _retrieve(task: asyncio.Task[None]) -> None:
    # The step's error reaches callers through partial_run; mark it retrieved.
    if not task.cancelled():
        task.exception()


def _inside_loop(t: Tensor) -> bool:
    ctx = t.op._ctx
    while ctx is not None:
        if isinstance(ctx, WhileContext):
            return True
        ctx = ctx.outer
    return False


def _wants_trace(options: RunOptions | None, run_metadata: RunMetadata | None) -> bool:
    return (options is not None and run_metadata is not None
            and options.trace_level >= RunOptions.FULL_TRACE)


def _default_threads() -> int:
    import os

    return max(os.cpu_count() or 1, 1)

