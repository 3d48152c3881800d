"""The comms under a distributed step: a cancelled call never leaves a socket open,
nor an error nobody retrieves.

A real Dask server on 127.0.0.1 and real connection pools; the cancellations are
landed at the exact moment that used to lose a socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import ssl
import struct
import threading
import warnings
from collections.abc import AsyncIterator, Coroutine
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("asyncflow.distributed")

from distributed.comm.core import CommClosedError
from distributed.core import ConnectionPool, Server
from distributed.protocol.serialize import to_serialize
from tornado import tcpclient

from asyncflow.distributed import _comm
from asyncflow.distributed._comm import _Wire
from asyncflow.distributed._dask import close_pool, closing_with, send
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


async def test_an_asyncflow_comm_connected_as_its_caller_is_cancelled_goes_to_the_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same moment on asyncflow's comm backend: the caller is cancelled as its
    connect completes; the comm ends in the pool, idle, and closes with it."""
    server = await _served()
    victims: list[asyncio.Task[Any]] = []
    connect = _comm._Connector.connect

    async def cancel_once_connected(self: Any, *args: Any, **kwargs: Any) -> Any:
        comm = await connect(self, *args, **kwargs)
        if victims:
            victims.pop().cancel()
        return comm

    monkeypatch.setattr(_comm._Connector, "connect", cancel_once_connected)
    pool = ConnectionPool(limit=8)
    await pool.start()
    try:
        call = asyncio.ensure_future(send(pool, server.address, "echo", x=1))
        victims.append(call)
        with pytest.raises(asyncio.CancelledError):
            await call
        monkeypatch.undo()
        await _settled(pool)
        assert (pool.active, pool.open) == (0, 1), pool
        assert (await send(pool, server.address, "echo", x=7))["x"] == 7
        assert pool.open == 1
    finally:
        await close_pool(pool)
        await server.close()
    assert _open_sockets_to(server.port) == []


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


# -- asyncflow's comm backend (aftcp://, aftls://) ------------------------------------------


def _stream(messages: list[list[bytes]]) -> bytes:
    """``messages`` framed as :class:`_Wire` writes them."""
    out = bytearray()
    for frames in messages:
        out += struct.pack(f"<Q{len(frames)}Q", len(frames), *map(len, frames))
        for frame in frames:
            out += frame
    return bytes(out)


def _feed(wire: _Wire, data: bytes, cuts: list[int]) -> None:
    """``data`` into ``wire`` as the socket would read it: into the buffers it asks for,
    at most ``cuts[k]`` bytes per read (then whatever is left, in reads of 4096)."""
    at, k = 0, 0
    while at < len(data):
        buf = wire.get_buffer(-1)
        want = cuts[k] if k < len(cuts) else 4096
        n = max(1, min(want, len(buf), len(data) - at))
        buf[:n] = data[at : at + n]
        wire.buffer_updated(n)
        at, k = at + n, k + 1


_frame_sizes = st.one_of(
    st.integers(0, 64),
    st.integers(65, 5000),
    st.sampled_from([(1 << 16) - 17, 1 << 16, (1 << 16) + 1, 200_003]),
)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.lists(_frame_sizes, min_size=0, max_size=4), min_size=1, max_size=5),
    cuts=st.lists(st.integers(1, 300_000), max_size=40),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_wire_reassembles_messages_however_the_socket_splits_them(
    sizes: list[list[int]], cuts: list[int], seed: int
) -> None:
    # Frames smaller and larger than the scratch buffer, empty frames and messages,
    # several messages per read and a frame table cut anywhere: each message comes
    # out whole, in order, its frames writable (numpy arrays are made on them).
    rng = np.random.default_rng(seed)
    messages = [[rng.bytes(n) for n in frames] for frames in sizes]
    wire = _Wire()
    _feed(wire, _stream(messages), cuts)
    got = list(wire._inbox)
    assert [[bytes(f) for f in frames] for frames in got] == messages
    for frames in got:
        for frame in frames:
            assert not memoryview(frame).readonly
    assert wire.error is None
    assert wire._sizes is None


@pytest.mark.parametrize(
    ("messages", "cuts"),
    [
        # Thousands of small messages in reads of 4098 bytes: the scratch buffer fills
        # to its end with a frame count cut in two, and what is unparsed moves to its
        # front (the reads and sizes are chosen so that happens).
        ([[b"x"] for _ in range(6000)], [4098] * 400),
        # Messages that are all frame table (two empty frames): one larger than what
        # is left of the scratch buffer moves to its front.
        ([[b"", b""] for _ in range(5000)], [4099] * 100),
        # A frame table larger than the scratch buffer (10,000 frames).
        ([[bytes([k % 251]) for k in range(10_000)], [b"after"]], []),
    ],
    ids=["a-count-cut-at-the-scratch-end", "a-table-cut-at-the-scratch-end", "a-wide-table"],
)
def test_the_wire_reads_frame_tables_wherever_they_fall(
    messages: list[list[bytes]], cuts: list[int]
) -> None:
    wire = _Wire()
    _feed(wire, _stream(messages), cuts)
    assert [[bytes(f) for f in frames] for frames in wire._inbox] == messages


def test_a_garbled_frame_table_closes_the_comm() -> None:
    wire = _Wire()
    _feed(wire, struct.pack("<Q", 1 << 40), [])
    assert isinstance(wire.error, CommClosedError)
    assert "garbled" in str(wire.error)


async def _echo_value(comm: Any, x: Any) -> dict[str, Any]:
    return {"x": to_serialize(x)}  # type: ignore[no-untyped-call]


#: Set by ``_slow`` once it runs (the servers of these tests run on the test's loop).
_slow_started: list[asyncio.Event] = []


async def _slow(comm: Any) -> dict[str, bool]:
    _slow_started[-1].set()
    await asyncio.sleep(30)
    return {"ok": True}


async def _call_slow(pool: ConnectionPool, address: str) -> asyncio.Future[Any]:
    """A call of ``_slow``, once its handler runs (the request sent and read)."""
    _slow_started.append(asyncio.Event())
    call = asyncio.ensure_future(send(pool, address, "slow"))
    await asyncio.wait_for(_slow_started[-1].wait(), 10)
    return call


async def _served(scheme: str = "aftcp", **listen: Any) -> Any:
    server = Server({"echo": _echo_value, "slow": _slow})  # type: ignore[no-untyped-call]
    await server
    await server.listen(f"{scheme}://127.0.0.1:0", **listen)  # type: ignore[no-untyped-call]
    return server


@contextlib.asynccontextmanager
async def _server_and_pool(limit: int = 8) -> AsyncIterator[tuple[Any, ConnectionPool]]:
    """A server on asyncflow's backend and a pool to call it; both closed after (a
    server the test closed itself closes again harmlessly)."""
    server = await _served()
    pool = ConnectionPool(limit=limit)
    await pool.start()
    try:
        yield server, pool
    finally:
        await close_pool(pool)
        await server.close()


async def test_dask_servers_and_pools_run_over_the_asyncio_backend() -> None:
    # Dask's own Server, ConnectionPool and send_recv, on the backend: values of every
    # size (inline, one frame, frames split across reads, a message larger than the
    # transport's buffer) come back equal, and 20 calls at once share the pool.
    async with _server_and_pool(limit=32) as (server, pool):
        assert server.address.startswith("aftcp://127.0.0.1:")
        for n in (0, 1, 1000, 70_000, 6_000_000):
            value = np.arange(n, dtype=np.float32)
            wired = to_serialize(value)  # type: ignore[no-untyped-call]
            back = (await send(pool, server.address, "echo", x=wired))["x"]
            assert back.dtype == value.dtype
            assert np.array_equal(back, value)
            back[...] = 0  # writable
        replies = await asyncio.gather(
            *(send(pool, server.address, "echo", x=k) for k in range(20))
        )
        assert [r["x"] for r in replies] == list(range(20))
    assert _open_sockets_to(server.port) == []


async def test_a_call_cancelled_mid_reply_aborts_its_comm_and_the_pool_goes_on() -> None:
    async with _server_and_pool() as (server, pool):
        call = await _call_slow(pool, server.address)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert pool.open == 0  # its comm was cut, not given back with a reply pending
        assert (await send(pool, server.address, "echo", x=3))["x"] == 3


async def test_a_peer_that_goes_away_is_a_comm_closed_error() -> None:
    async with _server_and_pool() as (server, pool):
        call = await _call_slow(pool, server.address)
        await server.close()  # (closes its comms)
        with pytest.raises(CommClosedError):
            await asyncio.wait_for(call, 10)


async def test_aftls_carries_messages_over_tls_with_dasks_security(tls_security: Any) -> None:
    # The TLS twin: Dask's Security makes the contexts (mutual TLS, as Dask's tls://),
    # small and large messages come back equal, and a client without a certificate
    # is refused.
    listen = tls_security.get_listen_args("worker")
    connect = tls_security.get_connection_args("client")
    server = await _served("aftls", **listen)
    assert server.address.startswith("aftls://127.0.0.1:")
    pool = ConnectionPool(limit=8, connection_args=connect, timeout=10)
    await pool.start()
    try:
        for n in (1, 3_000_000):
            value = np.arange(n, dtype=np.float64)
            wired = to_serialize(value)  # type: ignore[no-untyped-call]
            back = (await send(pool, server.address, "echo", x=wired))["x"]
            assert np.array_equal(back, value)
        location = server.address.split("://")[1]
        with pytest.raises(TypeError, match="ssl_context"):
            await _comm._Connector("aftls://").connect(location)
        # Trusting the server but without a certificate of its own: refused.
        anonymous = ssl.create_default_context(cafile=tls_security.tls_ca_file)
        anonymous.check_hostname = False
        stranger = ConnectionPool(limit=1, connection_args={"ssl_context": anonymous})
        await stranger.start()
        try:
            with pytest.raises(CommClosedError, match="closed"):
                await asyncio.wait_for(send(stranger, server.address, "echo", x=1), 20)
        finally:
            await close_pool(stranger)
    finally:
        await close_pool(pool)
        await server.close()


async def test_unencrypted_asyncflow_comms_are_refused_when_encryption_is_required() -> None:
    server = Server({})  # type: ignore[no-untyped-call]
    await server
    try:
        with pytest.raises(RuntimeError, match="encryption required"):
            await server.listen("aftcp://127.0.0.1:0", require_encryption=True)  # type: ignore[no-untyped-call]
    finally:
        await server.close()


def test_a_pool_of_a_loop_closes_with_the_loop() -> None:
    # A session's loop ends (asyncio.run returns) with its pool still open: the guard
    # closed by asyncio's shutdown_asyncgens closes its comms on the loop, so no socket
    # (and no unclosed transport) outlives it.
    ready: Future[int] = Future()
    stop = threading.Event()

    def serve() -> None:
        async def main() -> None:
            server = await _served()
            ready.set_result(server.port)
            await asyncio.to_thread(stop.wait, 60)
            await server.close()

        asyncio.run(main())

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        port = ready.result(30)

        async def session_loop() -> None:
            pool = ConnectionPool(limit=8)
            await pool.start()
            guard = closing_with(pool)
            await anext(guard)
            _guards.append(guard)  # (held, as the cluster holds it)
            assert (await send(pool, f"aftcp://127.0.0.1:{port}", "echo", x=1))["x"] == 1
            assert len(_open_sockets_to(port)) == 1

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            asyncio.run(session_loop())
            assert _open_sockets_to(port) == []
            _guards.clear()
            gc.collect()
        assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
    finally:
        stop.set()
        thread.join(30)


_guards: list[Any] = []


def test_aborting_a_comm_of_a_closed_loop_is_harmless() -> None:
    loop = asyncio.new_event_loop()
    wire = _Wire()
    wire._loop = loop
    loop.close()
    wire.abort()
    assert isinstance(wire.error, CommClosedError)
