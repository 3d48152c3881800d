"""The rendezvous contract and its keys."""

from __future__ import annotations

import asyncio
import random

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
        100, 100, 0, 0)


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
