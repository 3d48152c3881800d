"""One hook for every observer: the tracer, the progress observer and the retval
observer wrap each kind of kernel with the same wrapper (``runtime/observe/hook.py``),
and steps of one plan observed by each agree on which kernels ran."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import asyncflow as af
from asyncflow.framework import registry
from asyncflow.runtime.bind import BoundNode, BoundPlan
from asyncflow.runtime.observe import hook
from asyncflow.runtime.observe.progress import ProgressObserver
from asyncflow.runtime.observe.retvals import observe_retvals
from asyncflow.runtime.observe.trace import observe_trace

TWO = af.SessionConfig(device_count={"CPU": 2})
TRACE = af.RunOptions(trace_level=af.RunOptions.FULL_TRACE)


def _every_kind(graph: af.Graph) -> tuple[af.Tensor, list[af.Tensor]]:
    """A plan with an inline, an async, a worker-thread kernel, a send and a recv (the
    thread kernel runs on the other device), and a ``cond`` whose untaken branch runs
    no kernel.  Returns x and the fetches (each produced by a kernel)."""
    x = af.placeholder(af.float64, shape=(), name="x")
    a = af.add(x, 1.0, name="a")

    async def later(v: Any) -> Any:
        await asyncio.sleep(0)
        return v * 2.0

    def slow(v: Any) -> Any:
        return v * 3.0

    b = af.py_func(later, [a], af.float64, name="b")
    with af.device("/cpu:1"):
        c = af.py_func(slow, [a], af.float64, expensive=True, name="c")
    d = af.cond(
        x > 0.0, lambda: af.add(b, 1.0, name="taken"), lambda: af.add(c, 1.0, name="untaken")
    )
    return x, [b, c, af.add(d, c, name="out")]


def _observed_copies(bound: BoundPlan, loop: asyncio.AbstractEventLoop) -> list[BoundPlan]:
    """The copies of ``bound`` the three observers make."""
    return [
        observe_trace(bound),
        ProgressObserver(lambda _event: None).observe(bound),
        observe_retvals(bound, lambda _k, _v: None, loop),
    ]


async def test_every_observer_wraps_every_kind_of_kernel_with_the_one_hook(
    graph: af.Graph,
) -> None:
    x, fetches = _every_kind(graph)
    loop = asyncio.get_running_loop()
    kinds_seen: set[int] = set()
    async with af.Session(graph=graph, config=TWO) as sess:
        assert await sess.run(fetches, {x: 1.0}) == [4.0, 6.0, 11.0]
        plans = sess._prepare(fetches, {x: 1.0}).bound
        assert len(plans) == 2
        for bound in plans:
            for copy in _observed_copies(bound, loop):
                for node, own in zip(copy.nodes, bound.nodes, strict=True):
                    if node.kernel is own.kernel:
                        continue
                    kernel = node.kernel
                    if kernel.__qualname__.startswith("_compact_traced"):
                        # the tracer's hot path: inline nodes of a frame-free plan only
                        assert node.flow == registry.INLINE
                        assert not bound.frames
                        continue
                    where = (kernel.__module__, kernel.__qualname__.split(".")[0])
                    assert where in {
                        ("asyncflow.runtime.observe.hook", "_sync_observed"),
                        ("asyncflow.runtime.observe.hook", "_async_observed"),
                        ("asyncflow.runtime.bind", "tap_recv"),  # the hook's recv tap
                    }, (node, where)
                    kinds_seen.add(node.flow)
    assert {registry.INLINE, registry.ASYNC, registry.EXPENSIVE} <= kinds_seen
    assert {registry.SEND, registry.RECV} <= kinds_seen


async def test_a_traced_a_progressed_and_a_streamed_step_agree_on_what_ran(
    graph: af.Graph,
) -> None:
    x, fetches = _every_kind(graph)
    events: list[af.ProgressEvent] = []
    async with af.Session(graph=graph, config=TWO) as sess:
        md = af.RunMetadata()
        assert await sess.run(fetches, {x: 1.0}, options=TRACE, run_metadata=md) == [
            4.0,
            6.0,
            11.0,
        ]
        progressed = af.RunOptions(progress=events.append)
        assert await sess.run(fetches, {x: 1.0}, options=progressed) == [4.0, 6.0, 11.0]
        streamed = [(t.name, v) async for t, v in sess.run_stream(fetches, {x: 1.0})]
    ran = [
        ns.node_name for d in md.step_stats.dev_stats for ns in d.node_stats if ns.kind != "control"
    ]
    assert len(ran) == len(set(ran))
    assert {"a", "b", "c", "out"} <= set(ran)
    assert any(name.endswith("taken") for name in ran)  # the taken branch ran
    assert not any(name.endswith("untaken") for name in ran)  # the other branch's did not
    # Progress counts the same kernels (sends and recvs included) as the trace records.
    assert events[-1].finished
    assert events[-1].nodes_done == len(ran)
    kinds = {ns.kind for d in md.step_stats.dev_stats for ns in d.node_stats}
    assert {"inline", "async", "thread", "send", "recv"} <= kinds
    # The streamed step reported every fetch, each with the value the others computed.
    assert sorted(streamed) == sorted([("b:0", 4.0), ("c:0", 6.0), ("out:0", 11.0)])


@pytest.mark.parametrize("flow", [registry.INLINE, registry.EXPENSIVE, registry.SEND])
def test_a_probe_sees_start_end_and_a_raising_kernel(flow: int) -> None:
    calls: list[tuple[str, Any]] = []

    def kernel(v: Any) -> Any:
        if v is None:
            raise ValueError("no value")
        return v + 1

    def start() -> str:
        calls.append(("start", None))
        return "state"

    probe = hook.Probe(
        end=lambda state, v: calls.append(("end", (state, v))),
        start=start,
        abort=lambda state: calls.append(("abort", state)),
    )
    node = _node(kernel, flow)
    observed = hook.observe_node(node, probe)
    assert observed.kernel(1) == 2
    with pytest.raises(ValueError, match="no value"):
        observed.kernel(None)
    assert calls == [("start", None), ("end", ("state", 2)), ("start", None), ("abort", "state")]


async def test_a_probe_sees_an_async_kernel_end_or_be_cancelled() -> None:
    calls: list[tuple[str, Any]] = []
    entered = asyncio.Event()
    release = asyncio.Event()

    async def kernel(v: Any) -> Any:
        entered.set()
        await release.wait()
        return v + 1

    probe = hook.Probe(
        end=lambda state, v: calls.append(("end", (state, v))),
        start=lambda: "state",
        abort=lambda state: calls.append(("abort", state)),
    )
    observed = hook.observe_node(_node(kernel, registry.ASYNC), probe)
    release.set()
    assert await observed.kernel(1) == 2
    release.clear()
    entered.clear()
    task = asyncio.ensure_future(observed.kernel(1))
    await entered.wait()  # the kernel is waiting for the release
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert calls == [("end", ("state", 2)), ("abort", "state")]


def _node(kernel: Any, flow: int) -> BoundNode:
    """A one-input node of kind ``flow`` running ``kernel`` (what the hook reads)."""
    return BoundNode(kernel, flow, 1, (0,), 1, 1, (), (), (), None, flow)
