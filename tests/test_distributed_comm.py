"""The comms under a distributed step: a cancelled call never leaves a socket open,
nor an error nobody retrieves.

A real Dask server on 127.0.0.1 and real connection pools; the cancellations are
landed at the exact moment that used to lose a socket.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
import warnings
from collections.abc import Coroutine
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("asyncflow.distributed")

from distributed.core import ConnectionPool, Server
from tornado import tcpclient

from asyncflow.distributed._dask import close_pool, send
from asyncflow.distributed.master import DistributedCall

_CALLS = 4


def _open_sockets_to(port: int) -> list[socket.socket]:
    """The open client sockets of this process connected to ``port`` on 127.0.0.1."""
    found = []
    for obj in gc.get_objects():
        if isinstance(obj, socket.socket) and obj.fileno() >= 0:
            try:
                peer = obj.getpeername()
            except OSError:
                continue
            if peer == ("127.0.0.1", port):
                found.append(obj)
    return found


async def _echo(comm: Any, x: int) -> dict[str, int]:
    return {"x": x}


async def test_a_call_cancelled_as_its_connect_completes_leaves_no_socket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Tornado resolves the connect's future, then the caller is cancelled before it
    resumes (a deadline firing in the same loop iteration as the connect completing):
    the caller sees its cancellation at once, the connected comm goes to the pool, and
    closing the pool closes it; no socket stays open, none is left to the GC."""
    server = Server({"echo": _echo})  # type: ignore[no-untyped-call]
    await server
    await server.listen("tcp://127.0.0.1:0")  # type: ignore[no-untyped-call]
    port = server.port
    victims: list[asyncio.Task[Any]] = []
    resolved = tcpclient._Connector.on_connect_done

    def cancel_once_resolved(self: Any, *args: Any) -> None:
        resolved(self, *args)
        if victims:
            victims.pop().cancel()

    monkeypatch.setattr(tcpclient._Connector, "on_connect_done", cancel_once_resolved)
    pools = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for k in range(_CALLS):
                # A pool of its own each: every call connects anew.
                pool = ConnectionPool(limit=8)
                await pool.start()
                pools.append(pool)
                call = asyncio.ensure_future(send(pool, server.address, "echo", x=k))
                victims.append(call)
                with pytest.raises(asyncio.CancelledError):
                    await call
            monkeypatch.undo()
            for pool in pools:  # the cancelled callers' connects end in the pool, idle
                await _settled(pool)
                assert (pool.active, pool.open) == (0, 1), pool
                assert await send(pool, server.address, "echo", x=7) == {"x": 7}
                assert pool.open == 1  # (that comm was reused, not a new one)
            assert len(_open_sockets_to(port)) == _CALLS
        finally:
            for pool in pools:
                await close_pool(pool)
            await server.close()
        assert _open_sockets_to(port) == []
        gc.collect()
    leaked = [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaked == []


async def _settled(pool: ConnectionPool) -> None:
    """Until ``pool`` holds an idle comm, for at most 5 s (a lost one never comes)."""
    for _ in range(500):
        if pool.open and not pool.active:
            return
        await asyncio.sleep(0.01)


async def test_a_pool_closed_while_a_cancelled_callers_connect_finishes_closes_it() -> None:
    """A caller cancelled mid-connect, then its pool closed at once: the connect that
    finishes meanwhile closes its comm instead of keeping it in the closed pool."""
    server = Server({"echo": _echo})  # type: ignore[no-untyped-call]
    await server
    await server.listen("tcp://127.0.0.1:0")  # type: ignore[no-untyped-call]
    port = server.port
    pool = ConnectionPool(limit=8)
    await pool.start()
    try:
        call = asyncio.ensure_future(send(pool, server.address, "echo", x=1))
        await asyncio.sleep(0)  # (the connect started)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await close_pool(pool)
        assert pool.open == 0
        assert _open_sockets_to(port) == []
    finally:
        await server.close()


class _Registering:
    """A cluster whose registrations are concurrent futures the test settles."""

    def __init__(self) -> None:
        self.generation: dict[str, int] = {}
        self.pending: list[Future[dict[str, str]]] = []

    def _submit(self, coro: Coroutine[Any, Any, Any]) -> Future[dict[str, str]]:
        coro.close()
        self.pending.append(Future())
        return self.pending[-1]


async def _give_up_on_registration(cluster: _Registering) -> None:
    """A step waits for its plan's registration and is cancelled (its deadline, or
    close) before the registration, shared with other steps, fails."""
    call = DistributedCall.__new__(DistributedCall)
    call.master = SimpleNamespace(cluster=cluster)  # type: ignore[assignment]
    call._handles = None
    call._lock = threading.Lock()
    call._generations = {}
    waiter = asyncio.ensure_future(call.handles())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    # (How the connect to a killed task ended, seen once under load.)
    cluster.pending.pop().set_exception(TimeoutError("Timeout"))
    for _ in range(3):  # the error reaches the wrapper on this loop
        await asyncio.sleep(0)


async def test_a_step_that_gave_up_on_a_failing_registration_leaves_no_unretrieved_error() -> None:
    logged: list[str] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: logged.append(context["message"]))
    try:
        await _give_up_on_registration(_Registering())
        gc.collect()  # the wrapper future is collected: asyncio would log it now
    finally:
        loop.set_exception_handler(None)
    assert logged == []
