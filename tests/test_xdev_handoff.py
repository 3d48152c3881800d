"""Cross-device edges: the direct hand-off against the general (future) path.

Every graph here runs twice, once with ``ExecutorOptions.handoffs`` on (a send completes the
peer partition's waiting recv and drains it on the spot, see
:mod:`asyncflow.runtime.step`) and once off (every wait an ``asyncio.Future`` resolved
through the event loop), and both must give the same values, errors, deadlines,
cancellations and traces.  A counting wrapper checks that each path is the one taken.
"""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import asyncflow as af
from asyncflow.runtime import barrier
from asyncflow.runtime.rendezvous import LocalRendezvous
from asyncflow.runtime.step import Step
from tests.ordering import wait_in_flight

PATHS = ("handoff", "general")


#: Whether the sessions ``devices`` configures hand off (the ``path`` fixture sets it).
_HANDOFFS = {"on": True}


def devices(n: int, handoffs: bool | None = None) -> af.SessionConfig:
    # L0: constant chains would be folded away, and these tests are about the edges.
    on = _HANDOFFS["on"] if handoffs is None else handoffs
    return af.SessionConfig(
        device_count={"CPU": n},
        graph_options=af.GraphOptions(
            optimizer_options=af.OptimizerOptions(opt_level=af.OptimizerOptions.L0)
        ),
        executor_options=af.ExecutorOptions(handoffs=on),
    )


@pytest.fixture(params=PATHS)
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Runs the test on one path; afterwards checks that this path was the one taken."""
    counts = {"handoff": 0, "general": 0}
    handoff_drain, recv_done = Step._handoff_drain, Step._recv_done

    def counted_drain(self: Step, *args: Any) -> None:
        counts["handoff"] += 1
        handoff_drain(self, *args)

    def counted_done(self: Step, *args: Any) -> None:
        counts["general"] += 1
        recv_done(self, *args)

    monkeypatch.setitem(_HANDOFFS, "on", request.param == "handoff")
    monkeypatch.setattr(Step, "_handoff_drain", counted_drain)
    monkeypatch.setattr(Step, "_recv_done", counted_done)
    yield request.param
    other = "general" if request.param == "handoff" else "handoff"
    assert counts[other] == 0, counts
    assert counts[request.param] > 0, counts


@pytest.fixture
def rendezvous_seen(monkeypatch: pytest.MonkeyPatch) -> list[LocalRendezvous]:
    """The rendezvous of every multi-partition step the test runs, in order."""
    seen: list[LocalRendezvous] = []
    original = barrier.ExecutorBarrier.__init__

    def spy(self: barrier.ExecutorBarrier, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        seen.append(self.rendezvous)

    monkeypatch.setattr(barrier.ExecutorBarrier, "__init__", spy)
    return seen


def chain(n: int, n_devices: int, k: int = 1) -> tuple[af.Graph, af.Tensor, af.Tensor]:
    """``x + 1`` ``n`` times, changing device every ``k`` adds (round robin)."""
    g = af.Graph()
    with g.as_default():
        x0 = af.placeholder(af.float64, shape=(), name="x")
        ones = []
        for d in range(n_devices):
            with af.device(f"/cpu:{d}"):
                ones.append(af.constant(1.0, af.float64, name=f"one{d}"))
        x = x0
        for i in range(n):
            d = (i // k) % n_devices
            with af.device(f"/cpu:{d}"):
                x = af.add(x, ones[d], name=f"add{i}")
    return g, x0, x


def _run(
    graph: af.Graph,
    n_devices: int,
    fetches: Any,
    feeds: Any = None,
    options: af.RunOptions | None = None,
    run_metadata: af.RunMetadata | None = None,
) -> Any:
    with af.Session(graph=graph, config=devices(n_devices)) as sess:
        return sess.run_sync(fetches, feeds, options=options, run_metadata=run_metadata)


@pytest.mark.parametrize(
    ("n", "n_devices", "k"), [(300, 2, 1), (300, 3, 1), (301, 2, 7), (50, 4, 2)]
)
def test_chains_across_devices(path: str, n: int, n_devices: int, k: int) -> None:
    g, x0, y = chain(n, n_devices, k)
    assert _run(g, n_devices, y, {x0: 0.5}) == n + 0.5


def test_fan_out_and_fan_in_across_devices(path: str, graph: af.Graph) -> None:
    # One value sent to three devices (queued hand-offs for several partitions at
    # once), each adds its own, and the sums come back to device 0.
    with af.device("/cpu:0"):
        x = af.placeholder(af.float64, shape=(3,), name="x")
        base = af.multiply(x, 2.0, name="base")
    parts = []
    for d in (1, 2, 3):
        with af.device(f"/cpu:{d}"):
            parts.append(af.add(base, float(d), name=f"part{d}"))
    with af.device("/cpu:0"):
        total = af.add_n(parts, name="total")
    got = _run(graph, 4, [total, parts[1]], {x: [1.0, 2.0, 3.0]})
    np.testing.assert_array_equal(got[0], [12.0, 18.0, 24.0])
    np.testing.assert_array_equal(got[1], [4.0, 6.0, 8.0])


@pytest.mark.parametrize("take", [True, False])
def test_cond_across_devices(path: str, graph: af.Graph, take: bool) -> None:
    # The predicate and the branches are on different devices: the untaken branch's
    # values cross as dead tensors, and the Merge on device 0 sees the live one.
    with af.device("/cpu:0"):
        p = af.placeholder(af.bool, shape=(), name="p")
        x = af.placeholder(af.float64, shape=(), name="x")

    def true_fn() -> af.Tensor:
        with af.device("/cpu:1"):
            return af.multiply(x, 10.0, name="on1")

    def false_fn() -> af.Tensor:
        with af.device("/cpu:2"):
            return af.subtract(x, 1.0, name="on2")

    with af.device("/cpu:0"):
        out = af.add(af.cond(p, true_fn, false_fn), 0.5, name="out")
    got = _run(graph, 3, out, {p: take, x: 3.0})
    assert got == (30.5 if take else 2.5)


def test_dead_fetch_across_devices_names_the_tensor(path: str, graph: af.Graph) -> None:
    with af.device("/cpu:0"):
        p = af.placeholder(af.bool, shape=(), name="p")
        x = af.placeholder(af.float64, shape=(), name="x")
        later = af.reshape(af.py_func(_later, [x], af.float64), ())  # device 1 waits
        untaken, _taken = af.raw_ops.switch(later, p)
    with af.device("/cpu:1"):
        dead = af.negative(untaken, name="dead_on1")
    with pytest.raises(af.errors.InvalidArgumentError, match="dead_on1"):
        _run(graph, 2, dead, {p: True, x: 1.0})


async def _later(v: Any) -> Any:
    await asyncio.sleep(0.001)
    return v


def test_loop_across_devices(path: str, graph: af.Graph) -> None:
    # The body changes device twice per iteration: every edge is keyed by frame and
    # iteration; parallel iterations put several keys in flight at once.
    def body(i: af.Tensor, s: af.Tensor) -> tuple[af.Tensor, af.Tensor]:
        with af.device("/cpu:1"):
            s2 = af.add(s, af.cast(i, af.float64), name="on1")
        with af.device("/cpu:0"):
            return af.add(i, 1, name="next_i"), af.multiply(s2, 1.0, name="on0")

    with af.device("/cpu:0"):
        n = af.placeholder(af.int32, shape=(), name="n")
        _, total = af.while_loop(
            lambda i, s: af.less(i, n), body, [af.constant(0), af.constant(0.0, af.float64)]
        )
    assert _run(graph, 2, total, {n: 200}) == sum(range(200))


def test_error_on_one_device_names_the_node(path: str) -> None:
    g, x0, y = chain(40, 2)
    with g.as_default():
        with af.device("/cpu:1"):
            bad = af.py_func(_fail_on_21, [g.get_tensor_by_name("add20:0")], af.float64, name="bad")
        with af.device("/cpu:0"):
            z = af.add(y, bad, name="z")
    with af.Session(graph=g, config=devices(2)) as sess:
        with pytest.raises(af.errors.InvalidArgumentError, match="bad value 21") as info:
            sess.run_sync(z, {x0: 0.0})
        assert info.value.node_name == "bad"  # the root error, not a peer's abort
        assert sess.run_sync(y, {x0: 1.0}) == 41.0  # the session is still usable


def _fail_on_21(v: Any) -> Any:
    if v == 21.0:
        raise ValueError(f"bad value {v}")
    return v


async def test_deadline_stops_a_long_chain_of_hand_offs(
    path: str, rendezvous_seen: list[LocalRendezvous]
) -> None:
    # 8,000 device changes run synchronously on the fast path: the step must still
    # yield to the loop so that its deadline fires, and fail only after it stopped;
    # its rendezvous then holds no waiting recv (nor, through them, the steps).
    g, x0, y = chain(8_000, 2)
    opts = af.RunOptions(timeout_in_ms=5)
    before = asyncio.all_tasks()
    async with af.Session(graph=g, config=devices(2)) as sess:
        await sess.run(y, {x0: 0.0})  # compile outside the deadline
        with pytest.raises(af.errors.DeadlineExceededError):
            await sess.run(y, {x0: 0.0}, options=opts)
        stats = rendezvous_seen[-1].statistics()
        assert stats.aborted
        assert (stats.waiting_recvs, stats.queued_values) == (0, 0)
        assert await sess.run(y, {x0: 1.0}) == 8_001.0
    assert asyncio.all_tasks() - before == set()


async def test_deadline_while_a_recv_waits(path: str, graph: af.Graph) -> None:
    with af.device("/cpu:0"):
        x = af.placeholder(af.float64, shape=(), name="x")
        slow = af.py_func(_sleepy, [x], af.float64, name="slow")
    with af.device("/cpu:1"):
        y = af.add(slow, 1.0, name="y")  # its recv waits for slow's value
    async with af.Session(graph=graph, config=devices(2)) as sess:
        with pytest.raises(af.errors.DeadlineExceededError):
            await sess.run(y, {x: 1.0}, options=af.RunOptions(timeout_in_ms=20))
        assert await sess.run(y, {x: -1.0}) == 0.0


async def _sleepy(v: Any) -> Any:
    # Always yields once, so the other partition's recv is waiting when the value comes.
    await asyncio.sleep(10 if v > 0 else 0)
    return v


async def test_cancellation_mid_chain(path: str) -> None:
    g, x0, y = chain(8_000, 2)
    before = asyncio.all_tasks()
    async with af.Session(graph=g, config=devices(2)) as sess:
        await sess.run(y, {x0: 0.0})
        task = asyncio.create_task(sess.run(y, {x0: 0.0}))
        asyncio.get_running_loop().call_later(0.002, task.cancel)
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await sess.run(y, {x0: 2.0}) == 8_002.0
    assert asyncio.all_tasks() - before == set()


@pytest.mark.parametrize("handoffs", [True, False])
def test_traces_record_every_transfer_on_its_device(
    handoffs: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A traced step takes the same path as an untraced one: with hand-offs on, a send
    # drains the receiving partition, whose trace is the current one meanwhile.
    monkeypatch.setitem(_HANDOFFS, "on", handoffs)
    drains: list[int] = []
    handoff_drain = Step._handoff_drain

    def counted_drain(self: Step, *args: Any) -> None:
        drains.append(1)
        handoff_drain(self, *args)

    monkeypatch.setattr(Step, "_handoff_drain", counted_drain)
    g, x0, y = chain(30, 3)
    md = af.RunMetadata()
    opts = af.RunOptions(trace_level=af.RunOptions.FULL_TRACE)
    assert _run(g, 3, y, {x0: 0.0}, options=opts, run_metadata=md) == 30.0
    assert bool(drains) == handoffs
    where = {
        n.node_name: d.device
        for d in md.step_stats.dev_stats
        for n in d.node_stats
        if n.kind == "inline"
    }
    for i in range(30):  # each add recorded on its own device, not on its sender's
        assert where[f"add{i}"].endswith(f"CPU:{i % 3}"), (i, where[f"add{i}"])
    traffic = [
        n for d in md.step_stats.dev_stats for n in d.node_stats if n.kind in ("send", "recv")
    ]
    sends = sorted(n.rendezvous_key for n in traffic if n.kind == "send")
    recvs = sorted(n.rendezvous_key for n in traffic if n.kind == "recv")
    assert len(sends) == 30  # the device changes, and the fetch to the client's /cpu:0
    assert sends == recvs


def test_twenty_thousand_device_changes_keep_the_stack_flat(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Stack depth seen by a kernel near the start and near the end of the chain: a
    # hand-off that nested one drain per edge would blow the recursion limit.  Both
    # paths.
    depths: dict[str, int] = {}

    def depth(name: str) -> Any:
        def probe(v: Any) -> Any:
            frame, n = sys._getframe(), 0
            while frame is not None:
                frame, n = frame.f_back, n + 1  # type: ignore[assignment]
            depths[name] = n
            return v

        return probe

    g, x0, y = chain(20_001, 2)
    with g.as_default():
        with af.device("/cpu:1"):
            early = af.py_func(depth("early"), [g.get_tensor_by_name("add3:0")], af.float64)
        with af.device("/cpu:0"):
            late = af.py_func(depth("late"), [g.get_tensor_by_name("add19996:0")], af.float64)
    limit = sys.getrecursionlimit()
    for handoffs in (True, False):
        with af.Session(graph=g, config=devices(2, handoffs)) as sess:
            depths.clear()
            sys.setrecursionlimit(400)  # far below 20,000: per-edge nesting would fail
            try:
                got = sess.run_sync([y, early, late], {x0: 0.0})
            finally:
                sys.setrecursionlimit(limit)
            assert list(got) == [20_001.0, 4.0, 19_997.0]
            assert depths["late"] <= depths["early"] + 30, (handoffs, depths)


async def test_partial_run_feeds_a_partition_that_waits(path: str, graph: af.Graph) -> None:
    # The feed arrives from the caller, not from a partition of the step: the waiting
    # recv is completed from the event loop.
    with af.device("/cpu:0"):
        a = af.placeholder(af.float64, shape=(), name="a")
    with af.device("/cpu:1"):
        b = af.multiply(a, 3.0, name="b")
    with af.device("/cpu:0"):
        c = af.add(b, 1.0, name="c")
    async with af.Session(graph=graph, config=devices(2)) as sess:
        h = await sess.partial_run_setup([b, c], [a])
        await wait_in_flight(sess, 1)  # the partitions' recvs wait for the feed
        assert await sess.partial_run(h, b, {a: 2.0}) == 6.0
        assert await sess.partial_run(h, c) == 7.0


async def test_a_failed_step_leaves_nothing_waiting(
    path: str, rendezvous_seen: list[LocalRendezvous]
) -> None:
    # Device 1 fails early while device 0's recvs wait: the rendezvous is aborted
    # (every waiter failed, nothing queued), no task is left, and nothing of the step
    # is left for the cycle collector.
    g, x0, y = chain(200, 2)
    with g.as_default():
        with af.device("/cpu:1"):
            bad = af.py_func(_fail_on_21, [g.get_tensor_by_name("add20:0")], af.float64, name="bad")
        with af.device("/cpu:0"):
            z = af.add(y, bad, name="z")
    before = asyncio.all_tasks()
    async with af.Session(graph=g, config=devices(2)) as sess:
        await sess.run(y, {x0: 0.0})
        gc.collect()
        gc.disable()
        try:
            with pytest.raises(af.errors.InvalidArgumentError, match="bad value 21"):
                await sess.run(z, {x0: 0.0})
            garbage = gc.collect()
        finally:
            gc.enable()
    stats = rendezvous_seen[-1].statistics()
    assert stats.aborted
    assert stats.waiting_recvs == 0
    assert stats.queued_values == 0
    assert asyncio.all_tasks() - before == set()
    assert garbage == 0


def test_hand_offs_left_to_the_loop_when_the_slice_is_over(monkeypatch: pytest.MonkeyPatch) -> None:
    # Three devices in a ring: the outermost send's queue holds the hand-offs of the
    # two others' chain.  With no time slice left, the rest of the queue goes to the
    # event loop (each hand-off run from there in its step's context).
    from asyncflow.runtime import handoff as handoff_module
    from asyncflow.runtime import step as step_module

    later = 0
    handoff_later = Step._handoff_later

    def counted(self: Step, *args: Any) -> None:
        nonlocal later
        later += 1
        handoff_later(self, *args)

    monkeypatch.setattr(step_module, "SLICE", 0.0)
    monkeypatch.setattr(handoff_module, "_HANDOFF_CHECK_EVERY", 1)
    monkeypatch.setattr(Step, "_handoff_later", counted)
    g, x0, y = chain(300, 3)
    assert _run(g, 3, y, {x0: 0.25}) == 300.25
    assert later > 0


def test_a_recv_whose_value_is_there_leaves_its_waiter_to_the_next(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In a device-switching chain about half the recvs find their value queued: on the
    # hand-off path the waiter such a recv offered, unused, is offered by the next recv
    # (no allocation).  Same results on both paths.
    # (waiter, kept by the rendezvous): holding them keeps their ids unique
    offered: list[tuple[Any, bool]] = []
    original = LocalRendezvous.recv_or_wait

    def spy(self: LocalRendezvous, key: str, waiter: Any) -> Any:
        item = original(self, key, waiter)
        offered.append((waiter, item is None))
        return item

    monkeypatch.setattr(LocalRendezvous, "recv_or_wait", spy)
    g, x0, y = chain(200, 2)
    assert _run(g, 2, y, {x0: 0.5}) == 200.5
    assert _run(g, 2, y, {x0: 1.5}) == 201.5  # the step's leftover spare is not reused
    kept = [id(w) for w, k in offered if k]
    taken = [id(w) for w, k in offered if not k]
    assert kept  # recvs that waited
    assert taken  # recvs that found their value
    if path == "handoff":
        assert len(set(taken)) < len(taken)  # unused waiters were offered again
