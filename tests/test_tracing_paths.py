"""FULL_TRACE through every path a step can take: the loop-free ``run_sync`` path, the
synchronous first slice of ``await run``, the awaited step (a plan with an async
kernel), and a plan with loop frames (whose nodes are recorded with their frame and
iteration).  The same nodes must give the same stats whichever path ran them."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import pickle
import threading
import time
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pytest

import asyncflow as af
from asyncflow.config import DeviceStepStats, NodeExecStats, NodeOutput

TRACE = af.RunOptions(trace_level=af.RunOptions.FULL_TRACE)


@runtime_checkable
class _TracedKernel(Protocol):
    """The traced wrapper of a node's kernel: it carries the node and the kernel."""

    compact: tuple[int, Any]


def _shape_of(ns: NodeExecStats) -> tuple[Any, ...]:
    """What a node's stats say that does not depend on when it ran."""
    return (
        ns.op_type,
        ns.kind,
        ns.thread_id,
        ns.frame_name,
        ns.iter_id,
        ns.timeline_label,
        tuple((o.slot, o.shape, o.dtype, o.requested_bytes) for o in ns.output),
    )


def _by_name(md: af.RunMetadata) -> dict[str, NodeExecStats]:
    out: dict[str, NodeExecStats] = {}
    for dev in md.step_stats.dev_stats:
        for ns in dev.node_stats:
            if ns.frame_name:
                continue  # inside a loop: once per iteration
            assert ns.node_name not in out, f"{ns.node_name} recorded twice"
            out[ns.node_name] = ns
    return out


def _graph() -> tuple[af.Tensor, list[af.Tensor], af.Tensor, af.Tensor]:
    """An inline graph with array, scalar (several dtypes) and multi-output nodes; and
    the same graph joined by an async kernel, and by a while loop."""
    x = af.placeholder(af.float32, shape=(2, 3), name="x")
    y = af.multiply(x, 2.0, name="y")  # (2, 3) float32
    total = af.reduce_sum(y, name="total")  # float32 scalar
    first, second = af.unstack(y, name="rows")  # two outputs
    as_int = af.cast(total, af.int8, name="as_int")  # int8 scalar
    as_bool = af.greater(total, 0.0, name="positive")  # bool scalar
    as_c = af.cast(total, af.complex64, name="as_c")  # complex64 scalar
    fetches = [y, total, first, second, as_int, as_bool, as_c]

    async def later(v: Any) -> Any:
        await asyncio.sleep(0)
        return v

    awaited = af.py_func(later, [total], af.float32, name="awaited")
    _, looped = af.while_loop(
        lambda i, s: i < 3,
        lambda i, s: (i + 1, s + total),
        [af.constant(0), af.constant(0.0)],
        name="loop",
    )
    return x, fetches, awaited, looped


def test_traced_paths_record_the_same_stats(graph: af.Graph) -> None:
    x, fetches, awaited, looped = _graph()
    feed = {x: np.arange(6, dtype=np.float32).reshape(2, 3)}
    with af.Session(graph=graph) as sess:
        md_sync = af.RunMetadata()
        before = time.time()
        # run_sync of an all-inline plan, traced, runs without an event loop.
        plain = sess.run_sync(fetches, feed, options=TRACE, run_metadata=md_sync)
        after = time.time()

    async def on_a_loop() -> list[Any]:
        async with af.Session(graph=graph) as sess:
            return [
                await sess.run(f, feed, options=TRACE, run_metadata=md)
                for f, md in zip((fetches, [*fetches, awaited], [*fetches, looped]), runs)
            ]

    runs = [af.RunMetadata(), af.RunMetadata(), af.RunMetadata()]
    fast, with_async, with_loop = asyncio.run(on_a_loop())
    for got in (fast, with_async[:-1], with_loop[:-1]):
        for a, b in zip(plain, got, strict=True):
            np.testing.assert_array_equal(a, b)
    assert with_async[-1] == 30.0
    assert with_loop[-1] == 90.0

    # The fast path, the awaited step and the frame propagator record the same stats.
    sync = _by_name(md_sync)
    names = {"y", "total", "rows", "as_int", "positive", "as_c"}
    assert names <= set(sync)
    for md in runs:
        other = _by_name(md)
        assert {name: _shape_of(other[name]) for name in names} == {
            name: _shape_of(sync[name]) for name in names
        }
    assert _by_name(runs[1])["awaited"].kind == "async"
    assert any(ns.frame_name for d in runs[2].step_stats.dev_stats for ns in d.node_stats)

    outputs = {
        name: [(o.slot, o.shape, o.dtype, o.requested_bytes) for o in sync[name].output]
        for name in names
    }
    assert outputs["y"] == [(0, (2, 3), "float32", 24)]
    assert outputs["total"] == [(0, (), "float32", 4)]
    assert outputs["rows"] == [(0, (3,), "float32", 12), (1, (3,), "float32", 12)]
    assert outputs["as_int"] == [(0, (), "int8", 1)]
    assert outputs["positive"] == [(0, (), "bool", 1)]
    assert outputs["as_c"] == [(0, (), "complex64", 8)]
    for ns in sync.values():
        assert ns.kind == "inline"
        assert ns.thread_id == threading.get_ident()
        assert int(before * 1e6) - 1 <= ns.all_start_micros <= int(after * 1e6) + 1
        assert ns.scheduled_micros <= ns.all_start_micros
        assert 0 <= ns.op_end_rel_micros <= ns.all_end_rel_micros
        assert ns.timeline_label == f"{ns.node_name} = {ns.op_type}()"
    # A consumer starts no earlier than its producer.
    assert sync["y"].all_start_micros <= sync["total"].all_start_micros
    assert sync["total"].all_start_micros <= sync["as_int"].all_start_micros


async def test_a_long_traced_chain_records_every_node_across_slices(graph: af.Graph) -> None:
    # Long enough to outlast the first time slice: the traced fast path goes on awaited.
    x = af.placeholder(af.float32, shape=(), name="x")
    y = x
    for _ in range(3000):
        y = y + 1.0
    md = af.RunMetadata()
    async with af.Session(graph=graph) as sess:
        assert await sess.run(y, {x: 0.0}, options=TRACE, run_metadata=md) == 3000.0
    (dev,) = md.step_stats.dev_stats
    adds = [ns for ns in dev.node_stats if ns.op_type in ("Add", "AddV2")]
    assert len(adds) == 3000
    starts = [ns.all_start_micros for ns in adds]
    assert starts == sorted(starts)  # a chain runs in order
    assert {ns.thread_id for ns in adds} == {threading.get_ident()}


async def test_step_stats_are_made_once_and_pickle(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, shape=(), name="x")
    y = af.add(x, 1.0, name="y")
    md = af.RunMetadata()
    async with af.Session(graph=graph) as sess:
        await sess.run(y, {x: 1.0}, options=TRACE, run_metadata=md)
    (dev,) = md.step_stats.dev_stats
    assert dev.node_stats is dev.node_stats  # made on first access, kept
    copy = pickle.loads(pickle.dumps(md.step_stats))
    assert copy == md.step_stats
    assert [ns.node_name for ns in copy.dev_stats[0].node_stats] == [
        ns.node_name for ns in dev.node_stats
    ]
    assert "y" in repr(dev)
    dev.node_stats = []
    assert dev.node_stats == []
    assert dev != copy.dev_stats[0]
    built: list[int] = []
    lazy = DeviceStepStats.deferred("/cpu:0", lambda: built.append(1) or [])  # type: ignore[func-returns-value]
    assert built == []
    assert lazy.node_stats == []
    assert lazy.node_stats == []
    assert built == [1]  # built once
    with pytest.raises(TypeError):
        hash(lazy)


def test_a_traced_program_runs_the_same_order_with_traced_kernels(graph: af.Graph) -> None:
    from asyncflow.runtime.interpreter import program_of
    from asyncflow.runtime.observe.trace import observe_trace

    x = af.placeholder(af.float32, shape=(), name="x")
    z = af.multiply(af.add(x, 1.0, name="y"), 2.0, name="z")
    with af.Session(graph=graph) as sess:
        for _ in range(3):  # the plan is lowered after its first run
            assert sess.run_sync(z, {x: 1.0}) == 4.0
        bound = sess._prepare(z, {x: 1.0}).bound[0]
    plan_program = bound.derived["program"]
    traced = observe_trace(bound)
    assert traced is observe_trace(bound)  # made once per plan
    program = program_of(traced)
    assert program is not None
    assert program is program_of(traced)  # bound once per traced plan
    assert program.program is plan_program.program  # the same order
    assert program.args == plan_program.args
    # What each block's lines call, per node: the plan's own blocks call its kernels,
    # the traced copy's call the traced kernels (or a closure fusing the recording
    # into the node's own kernel, trace.traced_op), node for node.
    calls = [c for k in range(len(program.blocks)) for c in program.calls(k)]
    plan_calls = [c for k in range(len(plan_program.blocks)) for c in plan_program.calls(k)]
    assert [n for n, _ in calls] == [n for n, _ in plan_calls]
    assert {bound.ops[n].name for n, _ in calls} >= {"y", "z"}
    for node, f in plan_calls:
        assert f is bound.nodes[node].kernel  # the plan's kernel, called on its line
    fused = 0
    for node, f in calls:
        traced_kernel = traced.nodes[node].kernel
        if getattr(f, "__qualname__", "") == "traced_op.<locals>.traced":
            fused += 1
            assert isinstance(traced_kernel, _TracedKernel)
            assert traced_kernel.compact == (node, bound.nodes[node].kernel)
            held = {c.cell_contents for c in f.__closure__ or ()}
            assert bound.nodes[node].kernel in held
        else:
            assert f is traced_kernel
    assert fused
    traced_kernels = {n.kernel for n in traced.nodes} - {n.kernel for n in bound.nodes}
    assert not any(f in traced_kernels for _, f in plan_calls)


async def test_tracing_is_the_same_on_every_run_of_a_plan(graph: af.Graph) -> None:
    # Repeated runs of one plan may take other paths (a plan made of inline kernels is
    # replayed as a straight-line schedule after its first runs): traced runs record
    # the same nodes and outputs on every one, interleaved with untraced runs.
    x = af.placeholder(af.float32, shape=(2,), name="x")
    y = af.multiply(x, 2.0, name="y")
    total = af.reduce_sum(y, name="total")
    first, _ = af.unstack(y, name="parts")
    out = af.add(total, first, name="out")
    async with af.Session(graph=graph) as sess:
        seen = []
        for k in range(8):
            assert await sess.run(out, {x: [1.0, 2.0]}) == 8.0
            md = af.RunMetadata()
            assert await sess.run(out, {x: [1.0, 2.0]}, options=TRACE, run_metadata=md) == 8.0
            by_name = _by_name(md)
            seen.append({n: _shape_of(by_name[n]) for n in ("y", "total", "parts", "out")})
            starts = [by_name[n].all_start_micros for n in ("y", "total", "out")]
            assert starts == sorted(starts), k
    assert all(s == seen[0] for s in seen)
    assert seen[0]["parts"][-1] == ((0, (), "float32", 4), (1, (), "float32", 4))


def _straightforward_stats(
    bound: Any, records: list[Any], compact: Any, tid: int
) -> list[NodeExecStats]:
    """A traced step's records made into NodeExecStats the plain way (every event in
    one list sorted by (end, seq), each made by the dataclass's constructor): what the
    optimised build in runtime/observe/trace.py must give, field by field."""
    events: list[tuple[float, int, Any]] = []
    for seq, r in enumerate(records):
        if type(r) is float:
            events.append((r, seq, None))
        elif isinstance(r, NodeExecStats):
            events.append(((r.all_start_micros + r.all_end_rel_micros) / 1e6, seq, r))
        else:
            events.append((r[3], seq, r))
    infos: list[Any] = []
    if compact is not None:
        ends, infos = compact
        events.extend((end, len(records) + i, i) for i, end in enumerate(ends) if end)
    events.sort(key=lambda e: (e[0], e[1]))

    out = []
    last = 0.0
    for end, _, r in events:
        if r is None:
            last = end
        elif type(r) is int:
            start, last = last or end, end
            info = infos[r]
            out.append(
                _plain_stats(
                    bound,
                    r,
                    "inline",
                    start,
                    end,
                    tid,
                    (info,) if bound.nodes[r].num_outputs == 1 else info,
                    "",
                    None,
                )
            )
        elif isinstance(r, NodeExecStats):
            out.append(r)
        else:
            i, kind, start, end, thread, info, key, label = r
            if thread == tid:
                last = end
            out.append(_plain_stats(bound, i, kind, start, end, thread, info, key, label))
    return out


def _plain_outputs(info: tuple[Any, ...]) -> list[NodeOutput]:
    """A node's outputs made by the constructor (the oracle's)."""
    outs = []
    for k, o in enumerate(info):
        if o is None:
            continue
        if isinstance(o, type):
            d = np.dtype(o)
            outs.append(NodeOutput(slot=k, shape=(), dtype=d.name, requested_bytes=d.itemsize))
        else:
            shape, dtype, nbytes = o
            outs.append(
                NodeOutput(
                    slot=k,
                    shape=tuple(shape),
                    dtype=np.dtype(dtype).name,
                    requested_bytes=int(nbytes),
                )
            )
    return outs


def _plain_stats(
    bound: Any,
    i: int,
    kind: str,
    start: float,
    end: float,
    thread: int,
    info: Any,
    key: str,
    label: tuple[str, int] | None,
) -> NodeExecStats:
    """One node run's stats made by the constructor (the oracle's)."""
    op = bound.ops[i]
    frame, iteration = label if label is not None else ("", 0)
    timeline = f"{op.name} = {op.type}()" + (f" [frame {frame} iter {iteration}]" if frame else "")
    start_us = int(start * 1e6)
    dur = int(end * 1e6) - start_us
    return NodeExecStats(
        node_name=op.name,
        op_type=op.type,
        kind=kind,
        scheduled_micros=start_us,
        all_start_micros=start_us,
        op_start_rel_micros=0,
        op_end_rel_micros=dur,
        all_end_rel_micros=dur,
        thread_id=thread,
        timeline_label=timeline,
        output=_plain_outputs(info),
        rendezvous_key=key,
        frame_name=frame,
        iter_id=iteration,
    )


def _fields(ns: NodeExecStats) -> tuple[Any, ...]:
    return tuple(getattr(ns, f.name) for f in dataclasses.fields(NodeExecStats))


def test_stats_made_fast_equal_those_made_plainly(graph: af.Graph) -> None:
    # Inline (compact and not), async, thread, send/recv and loop nodes; the optimised
    # build of each step's stats equals the plain one field by field.
    x, fetches, awaited, looped = _graph()

    def slow(v: Any) -> Any:
        time.sleep(0.001)
        return v

    with af.device("/cpu:1"):
        far = af.multiply(fetches[1], 3.0, name="far")  # total -> /cpu:1: send/recv
        threaded = af.py_func(slow, [far], af.float32, expensive=True, name="threaded")
    out = af.add(threaded, fetches[1], name="out")
    feed = {x: np.arange(6, dtype=np.float32).reshape(2, 3)}
    config = af.SessionConfig(device_count={"CPU": 2})

    mds: list[af.RunMetadata] = []  # not the coroutine's result: asyncio may repr that

    async def traced_runs() -> None:
        async with af.Session(graph=graph, config=config) as sess:
            for f in (fetches, [*fetches, awaited], [*fetches, looped], [*fetches, out]):
                for _ in range(3):  # later runs of a plan may replay its static schedule
                    md = af.RunMetadata()
                    await sess.run(f, feed, options=TRACE, run_metadata=md)
                    mds.append(md)

    kinds: set[str] = set()
    framed = 0
    asyncio.run(traced_runs())
    for md in mds:
        for dev in md.step_stats.dev_stats:
            build = dev._build
            assert isinstance(build, functools.partial)  # not read yet
            plain = _straightforward_stats(*build.args)
            fast = dev.node_stats
            assert [_fields(ns) for ns in fast] == [_fields(ns) for ns in plain]
            assert fast == plain
            assert all(type(ns) is NodeExecStats for ns in fast)
            assert repr(fast) == repr(plain)
            assert pickle.loads(pickle.dumps(fast)) == plain
            kinds.update(ns.kind for ns in fast)
            framed += sum(bool(ns.frame_name) for ns in fast)
    assert kinds == {"inline", "async", "thread", "send", "recv", "control"}
    assert framed > 0
