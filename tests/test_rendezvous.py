"""The rendezvous contract and its keys."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from asyncflow import errors
from asyncflow.compiler.keys import create_key, parse_key
from asyncflow.runtime.rendezvous import LocalRendezvous, WouldBlock

CPU0 = "/job:localhost/replica:0/task:0/device:CPU:0"
CPU1 = "/job:localhost/replica:0/task:0/device:CPU:1"


async def test_send_then_recv() -> None:
    r = LocalRendezvous()
    r.send("k", 1)
    assert await r.recv("k") == (1, False)
    assert r.statistics().sent == 1
    assert r.statistics().received == 1


async def test_recv_then_send() -> None:
    r = LocalRendezvous()
    waiter = asyncio.ensure_future(r.recv("k"))
    await asyncio.sleep(0)
    assert not waiter.done()
    assert r.statistics().waiting_recvs == 1
    r.send("k", "v", is_dead=True)
    assert await waiter == ("v", True)
    assert r.statistics().waiting_recvs == 0


async def test_recv_nowait() -> None:
    r = LocalRendezvous()
    with pytest.raises(WouldBlock):
        r.recv_nowait("k")
    r.send("k", 3)
    assert r.recv_nowait("k") == (3, False)
    with pytest.raises(WouldBlock):
        r.recv_nowait("k")


async def test_queued_sends_each_consumed_once_in_order() -> None:
    r = LocalRendezvous()
    for i in range(5):
        r.send("k", i)
    assert r.statistics().queued_values == 5
    assert [(await r.recv("k"))[0] for _ in range(5)] == [0, 1, 2, 3, 4]
    assert r.statistics().queued_values == 0


async def test_many_keys_random_delays() -> None:
    r = LocalRendezvous()
    rng = random.Random(7)

    async def sender(k: int) -> None:
        await asyncio.sleep(rng.random() * 0.01)
        r.send(f"key{k}", k * 10)

    async def receiver(k: int) -> int:
        await asyncio.sleep(rng.random() * 0.01)
        value, dead = await r.recv(f"key{k}")
        assert not dead
        return int(value)

    async with asyncio.TaskGroup() as tg:
        for k in range(100):
            tg.create_task(sender(k))
        results = [tg.create_task(receiver(k)) for k in range(100)]
    assert [t.result() for t in results] == [k * 10 for k in range(100)]
    stats = r.statistics()
    assert (stats.sent, stats.received, stats.queued_values, stats.waiting_recvs) == (
        100,
        100,
        0,
        0,
    )


async def test_abort_before_waiting() -> None:
    r = LocalRendezvous()
    root = ValueError("root")
    r.abort(root)
    with pytest.raises(errors.AbortedError) as info:
        await r.recv("k")
    assert info.value.__cause__ is root
    with pytest.raises(errors.AbortedError):
        r.send("k", 1)
    with pytest.raises(errors.AbortedError):
        r.recv_nowait("k")


async def test_abort_wakes_every_waiter() -> None:
    r = LocalRendezvous()
    waiters = [asyncio.ensure_future(r.recv(f"k{i}")) for i in range(3)]
    await asyncio.sleep(0)
    root = errors.InvalidArgumentError(None, None, "the root cause")
    r.abort(root)
    for w in waiters:
        with pytest.raises(errors.AbortedError, match="the root cause") as info:
            await w
        assert info.value.__cause__ is root


async def test_abort_is_sticky_first_wins() -> None:
    r = LocalRendezvous()
    first, second = ValueError("first"), ValueError("second")
    r.abort(first)
    r.abort(second)
    assert r.aborted is first
    assert r.statistics().aborted
    with pytest.raises(errors.AbortedError) as info:
        await r.recv("x")
    assert info.value.__cause__ is first


async def test_cancelled_recv_gives_up_its_turn() -> None:
    r = LocalRendezvous()
    gone = r.recv_future("k")
    kept = r.recv_future("k")
    gone.cancel()
    r.send("k", 1)
    assert await kept == (1, False)


class _Waiter:
    """A waiter that is not a future (what an executor may hand to recv_or_wait)."""

    def __init__(self, log: list[Any], name: str, gave_up: bool = False) -> None:
        self.log, self.name, self.gave_up = log, name, gave_up
        self.completed = False

    def done(self) -> bool:
        return self.completed or self.gave_up

    def set_result(self, result: Any, /) -> None:
        self.completed = True
        self.log.append((self.name, result))

    def set_exception(self, exception: BaseException, /) -> None:
        self.completed = True
        self.log.append((self.name, exception))


def test_recv_or_wait_returns_a_queued_value_or_keeps_the_waiter() -> None:
    r = LocalRendezvous()
    log: list[Any] = []
    r.send("k", 1)
    assert r.recv_or_wait("k", _Waiter(log, "unused")) == (1, False)
    assert r.recv_or_wait("k", _Waiter(log, "a")) is None
    assert r.statistics().waiting_recvs == 1
    assert log == []
    r.send("k", 2, is_dead=True)  # completes the waiter synchronously, in the send
    assert log == [("a", (2, True))]
    stats = r.statistics()
    assert (stats.sent, stats.received, stats.queued_values, stats.waiting_recvs) == (2, 2, 0, 0)


def test_several_waiters_and_values_on_one_key_keep_their_order() -> None:
    r = LocalRendezvous()
    log: list[Any] = []
    for name in ("a", "b", "c"):
        assert r.recv_or_wait("k", _Waiter(log, name)) is None
    r.recv_or_wait("k", _Waiter(log, "quits", gave_up=True))
    assert r.recv_or_wait("k", _Waiter(log, "d")) is None
    assert r.statistics().waiting_recvs == 4
    for v in range(4):
        r.send("k", v)
    assert log == [
        ("a", (0, False)),
        ("b", (1, False)),
        ("c", (2, False)),
        ("d", (3, False)),
    ]  # the one that gave up was skipped
    for v in range(4, 7):
        r.send("k", v)
    assert r.statistics().queued_values == 3
    assert [r.recv_or_wait("k", _Waiter(log, "x")) for _ in range(3)] == [
        (4, False),
        (5, False),
        (6, False),
    ]
    assert r.statistics().queued_values == 0


def test_abort_fails_every_waiter_of_every_key() -> None:
    r = LocalRendezvous()
    log: list[Any] = []
    r.recv_or_wait("k", _Waiter(log, "a"))
    r.recv_or_wait("k", _Waiter(log, "b"))
    r.recv_or_wait("j", _Waiter(log, "c"))
    r.send("q", 1)
    root = ValueError("root")
    r.abort(root)
    assert sorted(name for name, _ in log) == ["a", "b", "c"]
    assert all(isinstance(e, errors.AbortedError) and e.__cause__ is root for _, e in log)
    assert r.statistics().queued_values == 0
    with pytest.raises(errors.AbortedError):
        r.recv_or_wait("q", _Waiter(log, "late"))


def test_key_create_and_parse() -> None:
    key = create_key(CPU0, 0xABC, CPU1, "y:0", (2, 5))
    assert key == f"{CPU0};0000000000000abc;{CPU1};y:0;2:5"
    parsed = parse_key(key)
    assert parsed.src_device == CPU0
    assert parsed.src_incarnation == 0xABC
    assert parsed.dst_device == CPU1
    assert parsed.edge_name == "y:0"
    assert (parsed.frame_id, parsed.iter_id) == (2, 5)
    assert parse_key(create_key(CPU0, 1, CPU1, "^ctrl")).edge_name == "^ctrl"


@pytest.mark.parametrize(
    "key",
    [
        "",
        "a;b;c",
        f"{CPU0};0000000000000abc;{CPU1};y:0",
        f"{CPU0};abc;{CPU1};y:0;0:0",
        f"{CPU0};000000000000zzzz;{CPU1};y:0;0:0",
        f"/banana;0000000000000abc;{CPU1};y:0;0:0",
        f"/job:localhost;0000000000000abc;{CPU1};y:0;0:0",
        f"{CPU0};0000000000000abc;{CPU1};;0:0",
        f"{CPU0};0000000000000abc;{CPU1};y:0;0",
        f"{CPU0};0000000000000abc;{CPU1};y:0;a:b",
    ],
)
def test_parse_rejects_malformed_keys(key: str) -> None:
    with pytest.raises(errors.InvalidArgumentError, match="Invalid rendezvous key"):
        parse_key(key)


def test_incarnation_range() -> None:
    with pytest.raises(ValueError, match="64 bits"):
        create_key(CPU0, 2**64, CPU1, "t:0")
