"""The trace observer: a step run with ``RunOptions(trace_level=FULL_TRACE)``.

A traced step runs the plan's traced copy (:func:`observe_trace`, made once per plan
with the hook of :mod:`asyncflow.runtime.observe.hook`: the same engine, other
kernels).  Control-flow routing (Switch, Merge, frames), which runs no kernel, is
reported by the general propagator through :meth:`StepTrace.record`, one
``is not None`` check where it happens.

A traced step keeps raw records and makes them into TF's ``NodeExecStats`` only
when someone reads its stats (``RunMetadata.step_stats`` builds them on first
access).  The inline nodes of a frame-free plan (each runs at most once) write into
``compact`` at their own index: ``ends[i]``, the time the kernel returned (a
float in a list: a list store is half the cost of an ``array`` store, and the
numbers become one numpy array when the stats are read), and ``infos[i]``, its
outputs' info.  Those nodes are the hot path of ``FULL_TRACE``: they record with a
kernel of their own (:func:`_compact_traced`), not through the hook's wrapper (whose
probe call was a third of what tracing cost per node), and in a straight-line
program the recording is fused into the instruction's closure (:func:`traced_op`):
no wrapper call per node.  Every other kernel is observed through
:func:`~asyncflow.runtime.observe.hook.observe_node` with a probe of this module.
One clock read per inline node: a node starts where the step's previous event on
its thread ended — the node before it, a transfer or control record, or a
*boundary*, a bare time appended to ``records`` before every drain, when the step
takes up work after the loop ran something else.  ``records`` holds, in the order
things happened::

    a float                                         a boundary
    (i, kind, start, end, tid, infos, key, label)  any other node run
    NodeExecStats                                   a nested step's (merge)

An info is what ``_output_info`` gives, or a numpy scalar's type for a scalar.
"""

from __future__ import annotations

import contextvars
import functools
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from asyncflow.compiler.keys import frame_key
from asyncflow.config import DeviceStepStats, NodeExecStats, NodeOutput, StepStats
from asyncflow.framework import registry
from asyncflow.runtime.bind import BoundNode, BoundPlan
from asyncflow.runtime.gc_pause import gc_paused
from asyncflow.runtime.observe.hook import Probe, base_of, observe_node, observed
from asyncflow.runtime.propagators import Dead

__all__ = ["StepTrace", "current_trace", "observe_trace", "traced_op"]

_ASYNC = registry.ASYNC


def observe_trace(bound: BoundPlan) -> BoundPlan:
    """``bound`` with the kernels of a traced step: its observed copy for the tracer
    (made once per plan)."""
    return _traced(bound).plan


def current_trace() -> StepTrace | None:
    """The trace of the traced step draining in this context, if any."""
    return _TRACING.get()


class StepTrace:
    """What one traced step records (see the module docstring).  Made per traced step."""

    __slots__ = ("_base", "compact", "label", "records", "tid")

    def __init__(self, bound: BoundPlan) -> None:
        #: The plan whose names the stats carry (a traced copy's base).
        self._base = base_of(bound)
        self.records: list[Any] = []
        #: The inline records of a frame-free plan: (ends, infos) by node.
        self.compact: tuple[list[float], list[Any]] | None = None
        if not bound.frames:
            n = len(bound.nodes)
            self.compact = ([0.0] * n, [None] * n)
        self.tid = 0  # the thread the step's inline nodes run on
        #: The (frame name, iteration) of the node running now (loops), or None.
        self.label: tuple[str, int] | None = None

    def on(self) -> tuple[Any, Any]:
        """Make this the trace the step's traced kernels record into (in this context)
        until :meth:`off`; a boundary: the step takes up work."""
        self.tid = threading.get_ident()
        self.records.append(time.time())
        return _TRACING.set(self), _RECORD.set(self.compact)

    @staticmethod
    def off(tokens: tuple[Any, Any]) -> None:
        _RECORD.reset(tokens[1])
        _TRACING.reset(tokens[0])

    def boundary(self) -> None:
        """The step takes up work after the event loop ran something else."""
        self.records.append(time.time())

    def record(
        self, i: int, kind: str, start: float, end: float, outputs: Sequence[Any], key: str = ""
    ) -> None:
        """Node ``i`` ran from ``start`` to ``end`` with ``outputs``."""
        self.records.append(
            (
                i,
                kind,
                start,
                end,
                threading.get_ident(),
                tuple(_output_info(o) for o in outputs),
                key,
                self.label,
            )
        )

    def transfer(self, i: int, start: float, frame_id: int, iter_id: int) -> None:
        """Node ``i``, a send or recv (of iteration ``iter_id`` of frame ``frame_id``), ran."""
        node = self._base.plan.nodes[i]
        key = node.attrs["key"]
        if frame_id or iter_id:
            key = frame_key(key, frame_id, iter_id)
        self.record(i, "send" if node.op == "_Send" else "recv", start, time.time(), (), key=key)

    def merge(self, stats: StepStats, prefix: str) -> None:
        """Add a nested step's node stats (a function call's body), names prefixed."""
        for dev in stats.dev_stats:
            for n in dev.node_stats:
                n.node_name = prefix + n.node_name
                n.timeline_label = prefix + n.timeline_label
                self.records.append(n)  # already a NodeExecStats

    def stats(self) -> StepStats:
        """The step's stats (one device: the partition's); its NodeExecStats are made
        from the raw records when first read."""
        base = self._base
        return StepStats(
            [
                DeviceStepStats.deferred(
                    base.plan.device,
                    functools.partial(_node_stats, base, self.records, self.compact, self.tid),
                )
            ]
        )


#: The trace a traced kernel records into (set while a traced step drains) and its
#: ``compact`` records (what the inline kernels of frame-free plans write).
_TRACING: contextvars.ContextVar[StepTrace | None] = contextvars.ContextVar(
    "asyncflow_tracing_step", default=None
)
_RECORD: contextvars.ContextVar[tuple[list[float], list[Any]] | None] = contextvars.ContextVar(
    "asyncflow_trace_record", default=None
)


class _Traced:
    """What tracing a bound plan needs, made once per plan: the traced kernels (a
    traced step allocates no closures, and so no reference cycles, per node), and the
    names NodeExecStats carry."""

    __slots__ = ("_inline", "_names", "nodes", "plan")

    def __init__(self, bound: BoundPlan) -> None:
        frames = bound.frames
        self.nodes = tuple(_traced_node(i, n, frames) for i, n in enumerate(bound.nodes))
        self._names: list[tuple[str, str, str]] | None = None
        self._inline: list[tuple[str, str, str, bool]] | None = None
        #: ``bound`` running the traced kernels (the same engine, see ``hook.observed``).
        self.plan = observed(bound, self.nodes)
        self.plan.derived["traced"] = True  # its loop programs record their routing

    def names(self, bound: BoundPlan) -> list[tuple[str, str, str]]:
        """(node name, op type, timeline label) per node, made on first use."""
        names = self._names
        if names is None:
            names = self._names = [
                (op.name, op.type, f"{op.name} = {op.type}()") for op in bound.ops
            ]
        return names

    def inline(self, bound: BoundPlan) -> list[tuple[str, str, str, bool]]:
        """Per node: its names and whether it has one output (its info is then recorded
        bare), what the stats of a compact inline node need; made on first use."""
        inline = self._inline
        if inline is None:
            inline = self._inline = [
                (*names, n.num_outputs == 1)
                for names, n in zip(self.names(bound), bound.nodes, strict=True)
            ]
        return inline


_TRACED: weakref.WeakKeyDictionary[BoundPlan, _Traced] = weakref.WeakKeyDictionary()


def _traced(bound: BoundPlan) -> _Traced:
    traced = _TRACED.get(bound)
    if traced is None:
        traced = _TRACED[bound] = _Traced(bound)
    return traced


def _traced_node(i: int, node: BoundNode, frames: bool) -> BoundNode:
    """``node`` with a kernel that records when it ran into the current traced step."""
    flow = node.flow
    if flow not in (registry.INLINE, registry.ASYNC, registry.EXPENSIVE):
        return node  # transfers are recorded by dispatch, control flow by the propagator
    if flow == registry.INLINE and not frames:
        kernel = node.kernel
        compact = _compact_traced(i, kernel, node.arity, node.num_outputs == 1)
        # What a straight-line program fuses into its closure (traced_op).
        compact.compact = (i, kernel)  # type: ignore[attr-defined]
        return BoundNode(compact, *node[1:])
    return observe_node(node, _probe(i, registry.KERNEL_KINDS[flow], node.num_outputs == 1, flow))


def _probe(i: int, kind: str, single: bool, flow: int) -> Probe:
    """What node ``i`` (``kind``) of a traced step records: when it ran, on which
    thread, its outputs' info and its loop frame and iteration.  An async kernel takes
    the trace and label when the step calls it (other nodes of its frame run before it
    ends); another kernel reads them when it returned."""
    now = time.time
    current = _TRACING.get
    ident = threading.get_ident

    def info(v: Any) -> tuple[Any, ...]:
        return (_output_info(v),) if single else tuple(_output_info(o) for o in (v or ()))

    if flow == _ASYNC:

        def returned(state: tuple[float, StepTrace | None, tuple[str, int] | None], v: Any) -> None:
            start, trace, label = state
            if trace is not None:
                trace.records.append((i, kind, start, now(), ident(), info(v), "", label))

        def started() -> tuple[float, StepTrace | None, tuple[str, int] | None]:
            trace = current()
            return now(), trace, trace.label if trace is not None else None

        return Probe(returned, started)

    if not single:

        def ended(start: float, v: Any) -> None:
            end = now()
            trace = current()
            if trace is not None:
                trace.records.append((i, kind, start, end, ident(), info(v), "", trace.label))

        return Probe(ended, now)
    output_info = _output_info
    scalars = _SCALAR_TYPES

    # The common case, a kernel with one output (of a loop body, mostly): its info made
    # here, a numpy scalar's as its type (as the compact kernels do), which pays for the
    # hook's call of this probe.
    def ended_one(start: float, v: Any) -> None:
        end = now()
        trace = current()
        if trace is not None:
            t = type(v)
            info = t if t in scalars else output_info(v)
            trace.records.append((i, kind, start, end, ident(), (info,), "", trace.label))

    return Probe(ended_one, now)


def _compact_traced(
    i: int, kernel: Callable[..., Any], arity: int, single: bool
) -> Callable[..., Any]:
    """The traced kernel of an inline node of a frame-free plan: one clock read, one
    context variable read and two stores at the node's index (a numpy scalar output is
    recorded as its type: no attribute reads, no object kept)."""
    now = time.time
    current = _RECORD.get
    scalars = _SCALAR_TYPES
    info = _output_info
    if single and arity == 2:

        def traced2(a: Any, b: Any) -> Any:
            v = kernel(a, b)
            record = current()
            if record is not None:
                ends, infos = record
                ends[i] = now()
                t = type(v)
                infos[i] = t if t in scalars else info(v)
            return v

        return traced2
    if single and arity == 1:

        def traced1(a: Any) -> Any:
            v = kernel(a)
            record = current()
            if record is not None:
                ends, infos = record
                ends[i] = now()
                t = type(v)
                infos[i] = t if t in scalars else info(v)
            return v

        return traced1

    def traced(*args: Any) -> Any:
        v = kernel(*args)
        record = current()
        if record is not None:
            ends, infos = record
            ends[i] = now()
            if single:
                t = type(v)
                infos[i] = t if t in scalars else info(v)
            else:
                infos[i] = tuple(info(o) for o in (v or ()))
        return v

    return traced


def traced_op(
    kernel: Callable[..., Any], ins: tuple[int, ...], out: int, free: int
) -> Callable[[list[Any]], None] | None:
    """The straight-line closure of a compact traced kernel (one output, one or two
    inputs; ``free``: the slot to clear after it, or -1) with the recording of
    :func:`_compact_traced` fused in, or None when ``kernel`` is no such kernel.  A
    traced program's node then costs one call, as an untraced one's: the wrapper's
    call was a third of what tracing cost per node."""
    parts = getattr(kernel, "compact", None)
    if parts is None or len(ins) not in (1, 2):
        return None
    i, raw = parts
    now = time.time
    current = _RECORD.get
    scalars = _SCALAR_TYPES
    info = _output_info
    a, b = ins[0], ins[-1]
    two = len(ins) == 2

    def traced(vals: list[Any]) -> None:  # (the same record as _compact_traced's)
        v = vals[out] = raw(vals[a], vals[b]) if two else raw(vals[a])
        if free >= 0:
            vals[free] = None
        record = current()
        if record is not None:
            ends, infos = record
            ends[i] = now()
            t = type(v)
            infos[i] = t if t in scalars else info(v)

    return traced


def _node_stats(
    bound: BoundPlan, records: list[Any], compact: tuple[list[float], list[Any]] | None, tid: int
) -> list[NodeExecStats]:
    """A traced step's raw records as TF's ``NodeExecStats``, in the order the nodes
    ended (see the module docstring).

    The records (boundaries, node runs, nested steps' stats; few in a frame-free plan)
    are sorted by when they ended, ties in the order they were made; the compact
    inline nodes are taken from ``ends`` with numpy (already in end order when the
    plan ran in index order, else sorted stably) and their stats made in a tight loop
    (:func:`_inline_stats`); a record goes before the compact nodes that ended at the
    same time."""
    # A large step's stats are many new objects, none of them cyclic, kept as long as
    # the RunMetadata: no collection while they are made, and they start old (else
    # the next young collection, right after the read, scans them all for nothing).
    with gc_paused(promote_after=5_000):
        return _make_node_stats(bound, records, compact, tid)


def _make_node_stats(
    bound: BoundPlan, records: list[Any], compact: tuple[list[float], list[Any]] | None, tid: int
) -> list[NodeExecStats]:
    events = _events(records)
    traced = _traced(bound)
    names = traced.names(bound)
    index, micros, infos, times = _compact_order(compact)
    cuts: list[int] = [0] * len(events)
    if times is not None and events:
        # A record goes before the compact nodes that ended at the same time.
        cuts = np.searchsorted(times, [e[0] for e in events], side="left").tolist()
    out: list[NodeExecStats] = []
    inline = traced.inline(bound)
    pos = 0
    last = 0  # when the step's previous event on its own thread ended (us; 0: none yet)
    for (end, _, r), cut in zip(events, cuts, strict=True):
        if cut > pos:
            last = _inline_stats(out, inline, infos, index[pos:cut], micros[pos:cut], last, tid)
            pos = cut
        if r is None:
            last = int(end * 1e6)  # a boundary
        elif isinstance(r, NodeExecStats):
            out.append(r)
        else:
            i, kind, start, end, tid_r, outputs, key, label = r
            if tid_r == tid:
                last = int(end * 1e6)
            out.append(_exec_stats(names[i], kind, start, end, tid_r, outputs, key, label))
    if pos < len(index):
        _inline_stats(out, inline, infos, index[pos:], micros[pos:], last, tid)
    return out


def _events(records: list[Any]) -> list[tuple[float, int, Any]]:
    """The records as (end, seq, record), sorted: seq is unique, so the sort never
    compares records (a boundary's record is None)."""
    events: list[tuple[float, int, Any]] = []
    for seq, r in enumerate(records):
        if type(r) is float:
            events.append((r, seq, None))
        elif isinstance(r, NodeExecStats):
            events.append(((r.all_start_micros + r.all_end_rel_micros) / 1e6, seq, r))
        else:
            events.append((r[3], seq, r))
    events.sort()
    return events


def _compact_order(
    compact: tuple[list[float], list[Any]] | None,
) -> tuple[list[int], list[int], list[Any], Any]:
    """The compact inline nodes that ran, in the order they ended: (their indexes,
    their ends in us, the infos by node, their ends in seconds as an array or None)."""
    if compact is None:
        return [], [], [], None
    ends, infos = compact
    at = np.array(ends, dtype=np.float64)
    idx = np.flatnonzero(at)
    times = at[idx]
    if times.size > 1 and bool((times[1:] < times[:-1]).any()):
        order = np.argsort(times, kind="stable")  # ties: by node index
        idx, times = idx[order], times[order]
    # int(t * 1e6) of each end: the product is the same double, the cast truncates.
    return idx.tolist(), (times * 1e6).astype(np.int64).tolist(), infos, times


def _inline_stats(
    out: list[NodeExecStats],
    inline: list[tuple[str, str, str, bool]],
    infos: list[Any],
    index: list[int],
    micros: list[int],
    last: int,
    tid: int,
) -> int:
    """Append the stats of compact inline nodes ``index`` (in the order they ended,
    at ``micros``) to ``out``: each started where the step's previous event ended
    (``last``, in us; 0: when it ended).  Returns when the last one ended.

    The hot loop of reading a traced step's stats: every field of the dataclass is set
    directly (no keyword or ``__init__`` call per node; tests/test_tracing_paths.py
    checks the result field by field against the constructor's)."""
    new = object.__new__
    cls = NodeExecStats
    append = out.append
    scalars = _FIRST_SCALAR_OUTPUTS
    for i, end in zip(index, micros, strict=True):
        start = last or end
        last = end
        name, op_type, timeline, single = inline[i]
        info = infos[i]
        if not single:
            output = _node_outputs(info)
        elif type(info) is type:  # a numpy scalar's type: its shared NodeOutput
            o = scalars.get(info)
            output = [o if o is not None else _scalar_output(0, info)]
        else:
            output = _node_outputs((info,))
        s = new(cls)
        s.node_name = name
        s.op_type = op_type
        s.kind = "inline"
        s.scheduled_micros = start
        s.all_start_micros = start
        s.op_start_rel_micros = 0
        s.op_end_rel_micros = s.all_end_rel_micros = end - start
        s.thread_id = tid
        s.timeline_label = timeline
        s.output = output
        s.rendezvous_key = ""
        s.frame_name = ""
        s.iter_id = 0
        append(s)
    return last


def _exec_stats(
    names: tuple[str, str, str],
    kind: str,
    start: float,
    end: float,
    tid: int,
    outputs: tuple[Any, ...],
    key: str,
    label: tuple[str, int] | None,
) -> NodeExecStats:
    name, op_type, timeline = names
    start_us = int(start * 1e6)
    dur = int(end * 1e6) - start_us
    frame, iteration = label if label is not None else ("", 0)
    if frame:
        timeline = f"{name} = {op_type}() [frame {frame} iter {iteration}]"
    return NodeExecStats(
        name,
        op_type,
        kind,
        start_us,
        start_us,
        0,
        dur,
        dur,
        tid,
        timeline,
        _node_outputs(outputs),
        key,
        frame,
        iteration,
    )


#: The NodeOutput of a numpy scalar output, by (output index, scalar type); and of
#: output 0 by scalar type.
_SCALAR_OUTPUTS: dict[tuple[int, type], NodeOutput] = {}
_FIRST_SCALAR_OUTPUTS: dict[type, NodeOutput] = {}


def _scalar_output(k: int, scalar: type) -> NodeOutput:
    """Output ``k`` of numpy scalar type ``scalar``: one shared (frozen) NodeOutput."""
    out = _SCALAR_OUTPUTS.get((k, scalar))
    if out is None:
        name, size = _dtype_info(scalar)
        out = _SCALAR_OUTPUTS[(k, scalar)] = NodeOutput(k, (), name, size)
        if k == 0:
            _FIRST_SCALAR_OUTPUTS[scalar] = out
    return out


def _node_outputs(infos: tuple[Any, ...]) -> list[NodeOutput]:
    outs = []
    for k, info in enumerate(infos):
        if info is None:
            continue
        if isinstance(info, type):  # a numpy scalar
            outs.append(_scalar_output(k, info))
        else:
            shape, dtype, nbytes = info
            outs.append(NodeOutput(k, tuple(shape), _dtype_info(dtype)[0], int(nbytes)))
    return outs


_DTYPE_INFO: dict[Any, tuple[str, int]] = {}

#: numpy scalar types of a fixed size: a traced node's scalar output is recorded as
#: its type alone (``np.str_`` / ``np.bytes_`` / ``np.void`` vary in size: not here).
_SCALAR_TYPES = frozenset(np.dtype(c).type for c in "?bBhHiIlLqQefdgFDG")


def _dtype_info(dtype: Any) -> tuple[str, int]:
    """The name and item size of a dtype given by its scalar type, memoized (numpy
    computes ``dtype.name`` anew on every access)."""
    info = _DTYPE_INFO.get(dtype)
    if info is None:
        d = np.dtype(dtype)
        info = _DTYPE_INFO[dtype] = (d.name, d.itemsize)
    return info


def _output_info(o: Any) -> tuple[tuple[int, ...], Any, int] | None:
    """(shape, dtype, bytes) of a node's output, without keeping the value alive."""
    if o is None or isinstance(o, Dead):
        return None
    if not isinstance(o, np.ndarray | np.generic):
        o = np.asarray(o)
    return o.shape, o.dtype.type, o.nbytes  # the scalar type: hashed fast, named later
