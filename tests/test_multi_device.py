"""Devices, placement, partitioning and multi-partition steps."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asyncflow as af
from asyncflow.compiler.ir import graph_ir, ref_of
from asyncflow.compiler.partition import partition
from asyncflow.compiler.prune import prune

if TYPE_CHECKING:
    from tests.conftest import Hangs

CPU = "/job:localhost/replica:0/task:0/device:CPU:{}"
TWO = af.SessionConfig(device_count={"CPU": 2})
# The same, unoptimized: the constant graphs below would otherwise be folded into one
# constant per device, and these tests are about the edges between devices.
TWO_L0 = af.SessionConfig(
    device_count={"CPU": 2},
    graph_options=af.GraphOptions(
        optimizer_options=af.OptimizerOptions(opt_level=af.OptimizerOptions.L0)
    ),
)


def computing(md: af.RunMetadata) -> list[str]:
    """The devices of the partitions that compute something (the client's device
    receives the fetches in a partition of its own)."""
    plumbing = {"_Send", "_Recv", "_Arg", "_Retval"}
    return [
        pg["device"]
        for pg in md.partition_graphs
        if any(n["op"] not in plumbing for n in pg["node"])
    ]


def minus_ax(graph: af.Graph) -> tuple[af.Tensor, af.Tensor]:
    with af.device("/cpu:0"):
        a = af.constant([[3.0, 2.0], [-1.0, 0.0]], name="A")
    with af.device("/cpu:1"):
        x = af.constant([[1.0], [1.0]], name="x")
    with af.device("/cpu:0"):
        y = af.matmul(a, x, name="y")
    with af.device("/cpu:1"):
        neg = af.negative(y, name="neg_y")
    return y, neg


async def test_minus_ax_two_devices(graph: af.Graph) -> None:
    y, neg = minus_ax(graph)
    async with af.Session(graph=graph, config=TWO) as sess:
        out_y, out_neg = await sess.run([y, neg])
    assert out_y[0, 0] == 5.0
    np.testing.assert_array_equal(out_y, [[5.0], [-1.0]])
    np.testing.assert_array_equal(out_neg, [[-5.0], [1.0]])


def test_minus_ax_sync(graph: af.Graph) -> None:
    _y, neg = minus_ax(graph)
    with af.Session(graph=graph, config=TWO) as sess:
        np.testing.assert_array_equal(sess.run_sync(neg), [[-5.0], [1.0]])


async def test_partition_graphs_show_send_recv(graph: af.Graph) -> None:
    _y, neg = minus_ax(graph)
    md = af.RunMetadata()
    opts = af.RunOptions(output_partition_graphs=True)
    async with af.Session(graph=graph, config=TWO_L0) as sess:
        await sess.run(neg, options=opts, run_metadata=md)
    assert len(md.partition_graphs) == 2
    json.dumps(md.partition_graphs)
    by_device = {pg["device"]: [n["op"] for n in pg["node"]] for pg in md.partition_graphs}
    # x travels 1 -> 0, y travels 0 -> 1, and the fetched neg_y 1 -> 0: as TF, the
    # client (and its _Retval) is on the default device.
    assert by_device[CPU.format(0)].count("_Send") == 1
    assert by_device[CPU.format(0)].count("_Recv") == 2
    assert by_device[CPU.format(1)].count("_Send") == 2
    assert "_Retval" in by_device[CPU.format(0)]
    assert "_Retval" not in by_device[CPU.format(1)]


async def test_single_device_partition_graph_has_no_send_recv(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, name="x")
    y = af.add(x, 1.0)
    md = af.RunMetadata()
    async with af.Session(graph=graph) as sess:
        assert (
            await sess.run(
                y, {x: 1.0}, options=af.RunOptions(output_partition_graphs=True), run_metadata=md
            )
            == 2.0
        )
    (pg,) = md.partition_graphs
    ops = [n["op"] for n in pg["node"]]
    assert "_Send" not in ops
    assert "_Recv" not in ops
    assert ops.count("_Arg") == 1
    assert ops.count("_Retval") == 1


def _parts(
    graph: af.Graph,
    fetches: list[af.Tensor],
    placement_of: dict[str, int],
    feeds: tuple[af.Tensor, ...] = (),
    default: int = 0,
) -> list[Any]:
    nodes = prune(graph_ir(graph), [ref_of(t) for t in fetches], [], {ref_of(t) for t in feeds})
    placement = [placement_of.get(n.name, default) for n in nodes]
    devices = [CPU.format(i) for i in range(4)]
    return list(
        partition(
            nodes,
            placement,
            devices,
            [ref_of(t) for t in feeds],
            [ref_of(t) for t in fetches],
            [],
            incarnation=1,
        )
    )


def _count(parts: list[Any], op_type: str) -> int:
    return sum(1 for p in parts for n in p.nodes if n.op == op_type)


def test_partition_one_device_has_no_pairs(graph: af.Graph) -> None:
    a = af.constant(1.0, name="a")
    b = af.add(a, a, name="b")
    parts = _parts(graph, [b], {})
    assert len(parts) == 1
    assert _count(parts, "_Send") == _count(parts, "_Recv") == 0


def test_partition_multi_use_edge_shares_one_pair(graph: af.Graph) -> None:
    a = af.constant(1.0, name="a")
    b = af.add(a, 1.0, name="b")
    c = af.multiply(a, 2.0, name="c")
    d = af.add(b, c, name="d")
    parts = _parts(graph, [d], {"a": 0}, default=1)
    assert _count(parts, "_Send") == 2  # a -> device 1 once; the fetched d -> the client
    assert _count(parts, "_Recv") == 2


def test_partition_data_and_control_edge_make_two_pairs(graph: af.Graph) -> None:
    a = af.constant(1.0, name="a")
    b = af.identity(a, name="b")  # data edge from a
    with af.control_dependencies([a]):
        c = af.constant(2.0, name="c")  # control edge from a
    parts = _parts(graph, [b, c], {"b": 1, "c": 1})
    assert _count(parts, "_Send") == 4  # and the fetched b and c back to the client
    assert _count(parts, "_Recv") == 4
    keys = sorted(n.get_attr("tensor_name") for p in parts for n in p.nodes if n.op == "_Recv")
    assert keys == ["^a", "a:0", "b:0", "c:0"]


def test_partition_one_pair_per_destination_device(graph: af.Graph) -> None:
    a = af.constant(1.0, name="a")
    b = af.add(a, af.constant(1.0, name="k1"), name="b")
    c = af.add(a, af.constant(2.0, name="k2"), name="c")
    d = af.add(a, af.constant(3.0, name="k3"), name="d")
    parts = _parts(graph, [b, c, d], {"b": 1, "k1": 1, "c": 2, "k2": 2, "d": 2, "k3": 2})
    # a -> device 1, a -> device 2 (shared by c, d); b, c, d back to the client
    assert _count(parts, "_Send") == 5
    assert _count(parts, "_Recv") == 5


def test_partition_fed_tensor_is_not_an_edge(graph: af.Graph) -> None:
    a = af.placeholder(af.float32, name="a")
    b = af.add(a, 1.0, name="b")
    parts = _parts(graph, [b], {"a": 0}, feeds=(a,))
    assert _count(parts, "_Send") == 0
    (part,) = parts
    assert part.args == ((0, ("a", 0)),)


def test_partition_feeds_and_fetches_are_on_the_client_device(graph: af.Graph) -> None:
    # As TF: the client is on the default device; a fed tensor read on device 1 and a
    # fetch made there cross to and from it.
    a = af.placeholder(af.float32, name="a")
    b = af.add(a, 1.0, name="b")
    client, other = _parts(graph, [b], {}, feeds=(a,), default=1)
    assert (client.device, other.device) == (CPU.format(0), CPU.format(1))
    assert client.args == ((0, ("a", 0)),)
    assert other.args == other.retvals == ()
    assert [n.op for n in client.nodes] == ["_Recv", "_Send"]
    assert [k for k, _ in client.retvals] == [0]


async def test_fed_and_fetched_across_devices(graph: af.Graph) -> None:
    with af.device("/cpu:0"):
        x = af.placeholder(af.float32, name="x")
        y = af.add(x, 1.0, name="y")
    with af.device("/cpu:1"):
        z = af.multiply(y, 2.0, name="z")
    async with af.Session(graph=graph, config=TWO) as sess:
        fx, fy, fz = await sess.run([x, y, z], {x: 1.0})
        assert (fx, fy, fz) == (1.0, 2.0, 4.0)
        # Feeding the cross-device tensor removes the edge.
        assert await sess.run(z, {y: 10.0}) == 20.0


async def test_control_edge_across_devices_orders_side_effects(graph: af.Graph) -> None:
    order: list[str] = []

    def mark(name: str) -> Any:
        def f(v: Any) -> Any:
            order.append(name)
            return v

        return f

    with af.device("/cpu:0"):
        first = af.py_func(mark("first"), [af.constant(1.0)], af.float32)
    with af.device("/cpu:1"), af.control_dependencies([first]):
        second = af.py_func(mark("second"), [af.constant(2.0)], af.float32)
    async with af.Session(graph=graph, config=TWO) as sess:
        assert await sess.run(second) == 2.0
    assert order == ["first", "second"]


async def test_failure_on_one_device_fails_peer_recv_at_once(graph: af.Graph) -> None:
    async def fail_soon(v: Any) -> Any:
        await asyncio.sleep(0.01)
        raise ValueError("device 0 broke")

    with af.device("/cpu:0"):
        bad = af.py_func(fail_soon, [af.constant(1.0)], af.float32, name="bad")
    with af.device("/cpu:1"):
        waiting = af.add(bad, 1.0, name="waiting")  # recv of bad's value
    opts = af.RunOptions(timeout_in_ms=10_000)
    async with af.Session(graph=graph, config=TWO) as sess:
        start = time.monotonic()
        with pytest.raises(af.errors.InvalidArgumentError) as info:
            await sess.run(waiting, options=opts)
        elapsed = time.monotonic() - start
    assert info.value.node_name == "bad"  # the root error, not the peer's AbortedError
    assert "device 0 broke" in str(info.value)
    assert elapsed < 5  # the peer did not wait for its deadline
    assert len(asyncio.all_tasks()) == 1


async def test_failure_stops_a_busy_peer_partition(graph: af.Graph, hanging_kernel: Hangs) -> None:
    slow = hanging_kernel.async_kernel()

    async def fail(v: Any) -> Any:
        await slow.started.wait()
        raise RuntimeError("boom")

    with af.device("/cpu:0"):
        a = af.py_func(fail, [af.constant(1.0)], af.float32, name="fail")
    with af.device("/cpu:1"):
        b = af.py_func(slow, [af.constant(1.0)], af.float32, name="slow")
    async with af.Session(graph=graph, config=TWO) as sess:
        with pytest.raises(af.errors.UnknownError, match="boom"):
            await asyncio.wait_for(sess.run([a, b]), 5)
    assert slow.ended == ["cancelled"]


async def test_close_and_cancel_multi_partition_steps(
    graph: af.Graph, hanging_kernel: Hangs
) -> None:
    forever = hanging_kernel.async_kernel()
    started = forever.started
    with af.device("/cpu:0"):
        a = af.py_func(forever, [af.constant(1.0)], af.float32)
    with af.device("/cpu:1"):
        b = af.add(a, 1.0)
    sess = af.Session(graph=graph, config=TWO)
    task = asyncio.create_task(sess.run(b))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    started.clear()
    task = asyncio.create_task(sess.run(b))
    await started.wait()
    await sess.close()
    with pytest.raises(af.errors.CancelledError, match="closed"):
        await task
    assert len(asyncio.all_tasks()) == 1


async def test_two_devices_run_expensive_kernels_in_parallel(graph: af.Graph) -> None:
    barrier = threading.Barrier(2, timeout=5)

    def meet(v: Any) -> Any:
        barrier.wait()  # BrokenBarrierError unless both devices run at once
        return v

    with af.device("/cpu:0"):
        a = af.py_func(meet, [af.constant(1.0)], af.float32, expensive=True)
    with af.device("/cpu:1"):
        b = af.py_func(meet, [af.constant(2.0)], af.float32, expensive=True)
    # One thread per device: the parallelism comes from the two devices' limiters.
    config = af.SessionConfig(device_count={"CPU": 2}, inter_op_parallelism_threads=1)
    async with af.Session(graph=graph, config=config) as sess:
        assert await sess.run(af.add(a, b)) == 3.0


async def test_traced_multi_device_step(graph: af.Graph) -> None:
    _y, neg = minus_ax(graph)
    md = af.RunMetadata()
    opts = af.RunOptions(trace_level=af.RunOptions.FULL_TRACE)
    async with af.Session(graph=graph, config=TWO_L0) as sess:
        await sess.run(neg, options=opts, run_metadata=md)
    names = {
        d.device: [n.node_name for n in d.node_stats if n.kind == "inline"]
        for d in md.step_stats.dev_stats
    }
    assert names[CPU.format(0)] == ["y"]
    assert names[CPU.format(1)] == ["neg_y"]
    # Sends and recvs are recorded too, paired by their rendezvous key.
    traffic = [
        n for d in md.step_stats.dev_stats for n in d.node_stats if n.kind in ("send", "recv")
    ]
    sends = {n.rendezvous_key for n in traffic if n.kind == "send"}
    recvs = {n.rendezvous_key for n in traffic if n.kind == "recv"}
    assert len(sends) == 3  # x, y, and the fetched neg_y to the client's device
    assert sends == recvs


# -- devices and placement ----------------------------------------------------------


def test_device_spec_parsing() -> None:
    full = af.DeviceSpec.from_string("/job:localhost/replica:0/task:0/device:CPU:1")
    assert (full.job, full.replica, full.task, full.device_type, full.device_index) == (
        "localhost",
        0,
        0,
        "CPU",
        1,
    )
    assert af.DeviceSpec.from_string("/cpu:1") == af.DeviceSpec(device_type="CPU", device_index=1)
    assert af.DeviceSpec.from_string("/device:CPU:1").to_string() == "/device:CPU:1"
    assert af.DeviceSpec.from_string("/job:localhost").job == "localhost"
    assert af.DeviceSpec.from_string("/cpu:*").device_index is None
    with pytest.raises(ValueError, match="malformed"):
        af.DeviceSpec.from_string("/banana:split")


async def test_device_spellings_land_on_the_same_device(graph: af.Graph) -> None:
    spellings = ["/cpu:1", "/device:CPU:1", CPU.format(1), "/job:localhost/device:CPU:1"]
    outs = []
    for spec in spellings:
        with af.device(spec):
            outs.append(af.add(af.constant(1.0), 1.0))
    md = af.RunMetadata()
    async with af.Session(graph=graph, config=TWO) as sess:
        await sess.run(outs, options=af.RunOptions(output_partition_graphs=True), run_metadata=md)
    assert computing(md) == [CPU.format(1)]


async def test_unknown_device_lists_session_devices(graph: af.Graph) -> None:
    with af.device("/cpu:5"):
        y = af.constant(1.0, name="lost")
    async with af.Session(graph=graph, config=TWO) as sess:
        with pytest.raises(af.errors.InvalidArgumentError) as info:
            await sess.run(y)
    msg = str(info.value)
    assert "/cpu:5" in msg
    assert "lost" in msg
    assert CPU.format(0) in msg
    assert CPU.format(1) in msg


async def test_place_pruned_graph(graph: af.Graph) -> None:
    with af.device("/cpu:9"):
        af.constant(1.0, name="elsewhere")
    y = af.constant(2.0, name="here")
    async with af.Session(graph=graph) as sess:
        with pytest.raises(af.errors.InvalidArgumentError, match="elsewhere"):
            await sess.run(y)
    config = af.SessionConfig(place_pruned_graph=True)
    async with af.Session(graph=graph, config=config) as sess:
        assert await sess.run(y) == 2.0


async def test_colocate_with(graph: af.Graph) -> None:
    with af.device("/cpu:1"):
        a = af.constant(1.0, name="a")
    with af.device("/cpu:0"), af.colocate_with(a):
        b = af.add(a, 1.0, name="b")
    assert b.op.get_attr("_class") == ["loc:@a"]
    md = af.RunMetadata()
    async with af.Session(graph=graph, config=TWO) as sess:
        assert (
            await sess.run(b, options=af.RunOptions(output_partition_graphs=True), run_metadata=md)
            == 2.0
        )
    assert computing(md) == [CPU.format(1)]


async def test_incompatible_colocation_names_both_nodes(graph: af.Graph) -> None:
    with af.device("/cpu:0"):
        a = af.constant(1.0, name="anchor")
    # A conflicting request, as an imported graph def could carry it.
    with af.device("/cpu:1"):
        member = graph.create_op("Identity", [a], attrs={"_class": ["loc:@anchor"]}, name="member")
    async with af.Session(graph=graph, config=TWO) as sess:
        with pytest.raises(af.errors.InvalidArgumentError) as info:
            await sess.run(member.outputs[0])
    assert "anchor" in str(info.value)
    assert "member" in str(info.value)


async def test_log_device_placement(graph: af.Graph, caplog: pytest.LogCaptureFixture) -> None:
    with af.device("/cpu:1"):
        y = af.add(af.constant(1.0), 1.0, name="logged")
    config = af.SessionConfig(device_count={"CPU": 2}, log_device_placement=True)
    with caplog.at_level(logging.INFO, logger="asyncflow"):
        async with af.Session(graph=graph, config=config) as sess:
            await sess.run(y)
    assert any(
        "logged" in r.getMessage() and CPU.format(1) in r.getMessage() for r in caplog.records
    )


async def test_soft_placement(graph: af.Graph) -> None:
    with af.device("/cpu:3"):
        y = af.constant(4.0)
    config = af.SessionConfig(device_count={"CPU": 2}, allow_soft_placement=True)
    async with af.Session(graph=graph, config=config) as sess:
        assert await sess.run(y) == 4.0


# -- property test --------------------------------------------------------------------

BINARY = [af.add, af.subtract, af.multiply, af.maximum]


@st.composite
def placed_graphs(draw: st.DrawFn) -> tuple[af.Graph, int, list[Any], dict[Any, Any]]:
    n_devices = draw(st.integers(1, 4))
    g = af.Graph()
    with g.as_default():
        tensors: list[af.Tensor] = []
        feeds: dict[Any, Any] = {}
        for k in range(draw(st.integers(1, 3))):
            with af.device(f"/cpu:{draw(st.integers(0, n_devices - 1))}"):
                if draw(st.booleans()):
                    p = af.placeholder(af.float64, shape=(2,), name=f"p{k}")
                    feeds[p] = np.array([k + 0.5, -k - 0.25])
                    tensors.append(p)
                else:
                    tensors.append(af.constant(np.array([k + 1.0, 2.0 - k])))
        ops: list[af.Operation] = []
        for _ in range(draw(st.integers(1, 20))):
            pick = st.sampled_from(tensors)
            deps = draw(st.lists(st.sampled_from(ops), max_size=1)) if ops else []
            with (
                af.device(f"/cpu:{draw(st.integers(0, n_devices - 1))}"),
                af.control_dependencies(deps),
            ):
                kind = draw(st.sampled_from(["binary", "neg", "add_n", "async"]))
                if kind == "binary":
                    t = draw(st.sampled_from(BINARY))(draw(pick), draw(pick))
                elif kind == "neg":
                    t = af.negative(draw(pick))
                elif kind == "add_n":
                    t = af.add_n(draw(st.lists(pick, min_size=1, max_size=3)))
                else:
                    t = af.reshape(af.py_func(_async_identity, [draw(pick)], af.float64), (2,))
            tensors.append(t)
            ops.append(t.op)
        fetches: list[Any] = draw(st.lists(st.sampled_from(tensors), min_size=1, max_size=4))
        for t in draw(st.lists(st.sampled_from(tensors), max_size=1)):
            feeds.setdefault(t, np.array([1.5, -2.5]))
    return g, n_devices, fetches, feeds


async def _async_identity(v: np.ndarray) -> np.ndarray:
    await asyncio.sleep(0)
    return v


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(placed_graphs())
def test_random_placements_match_reference(
    case: tuple[af.Graph, int, list[Any], dict[Any, Any]],
) -> None:
    graph, n_devices, fetches, feeds = case
    expected = af.testing.reference_run(fetches, feeds, graph=graph)
    # Both ways across devices: the direct hand-off and the future-based path.
    for handoffs in (True, False):
        config = af.SessionConfig(
            device_count={"CPU": n_devices}, executor_options=af.ExecutorOptions(handoffs=handoffs)
        )
        with af.Session(graph=graph, config=config) as sess:
            got = sess.run_sync(fetches, feeds)
            assert len(got) == len(expected)
            for a, b in zip(got, expected):
                np.testing.assert_array_equal(a, b)
