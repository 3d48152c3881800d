"""A Dask comm backend on asyncio's own transports, for the task service.

Dask's ``tcp://`` comm rides on tornado's ``IOStream``: every message is three reads
(its length, its frame table, its frames), each a tornado future resolved from a
callback, and its writes go through tornado's buffer.  A 2-task step is three messages
in a row (the master's run to the producer, the producer's push, the consumer's
answer), and on this path those reads were most of a step's cost.

This module adds two schemes to Dask's comm registry (``distributed.comm.registry``,
Dask's own extension point for transports): ``aftcp://`` and ``aftls://``.  Their
comms are Dask ``Comm`` objects, used by Dask's ``Server``, ``ConnectionPool`` and
``send_recv`` and framed by Dask's own protocol (``to_frames``/``from_frames``: msgpack
and Dask's serializers, the same handshake); only the bytes move differently:

* one :class:`asyncio.BufferedProtocol` per connection: a message that arrives in one
  piece is parsed from a scratch buffer the socket was read into and handed to its
  reader with one wake-up; a large frame is read by the socket straight into the
  buffer it ends in (no copy, writable, as Dask's own reads give);
* writes go to asyncio's transport, a small message in one call, a large one in
  chunks that wait for the transport to drain (bounded buffering);
* ``aftls://`` is the same over asyncio's TLS, with the context Dask's ``Security``
  makes (``ssl_context`` in the connection arguments), so TLS clusters keep TLS.

The task service listens on ``aftcp://`` (``aftls://``) when its worker listens on
``tcp://`` (``tls://``); Dask's own servers keep Dask's comms.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import struct
from typing import Any

import dask
from distributed.comm import utils as _comm_utils
from distributed.comm.addressing import parse_host_port, unparse_host_port
from distributed.comm.core import (
    BaseListener,
    Comm,
    CommClosedError,
    Connector,
    FatalCommClosedError,
)
from distributed.comm.registry import backends
from distributed.comm.tcp import BaseTCPBackend
from distributed.protocol.utils import host_array

__all__ = ["SCHEMES", "AsyncioComm", "service_scheme"]

#: Dask's framing, untyped.
_utils: Any = _comm_utils

#: This backend's schemes, by the Dask scheme they stand in for.
SCHEMES = {"tcp": "aftcp", "tls": "aftls"}
#: Bytes the socket reads into before a message is parsed (one message of a step is
#: well under it); a frame this large or larger is read straight into its own buffer.
_SCRATCH = 1 << 16
#: A message up to this size is written in one call; a larger one frame by frame, in
#: chunks of ``_CHUNK`` that each wait for the transport to drain.
_COALESCE = 1 << 16
_CHUNK = 1 << 20
_HIGH_WATER = 1 << 20
#: The most frames a message may have (a frame table larger than this is garbage).
_MAX_FRAMES = 1 << 20
_COUNT = struct.Struct("<Q")
#: How long closing a comm waits for what it wrote to be sent before it cuts it.
_CLOSE_S = 5.0


def service_scheme(scheme: str) -> str:
    """The scheme the task service listens on beside a worker listening on ``scheme``
    (Dask's own for a scheme this backend does not stand in for)."""
    return SCHEMES.get(scheme, scheme)


class _Wire(asyncio.BufferedProtocol):
    """The bytes of one connection: framed messages in, flow-controlled writes out.

    A message is ``count, size * count, frame * count`` (little-endian 64-bit
    integers).  Received messages queue in :attr:`_inbox` (a comm has one reader at a
    time; pushes sent one way can queue up behind a run) until :meth:`receive`.
    """

    def __init__(self, on_made: Any = None) -> None:
        self._on_made = on_made
        self._loop: asyncio.AbstractEventLoop | None = None
        self.transport: asyncio.Transport | None = None
        #: Done once asyncio closed the connection (its socket is closed then).
        self.lost: asyncio.Future[None] | None = None
        self.error: BaseException | None = None  # set once the connection is gone
        self._inbox: collections.deque[list[Any]] = collections.deque()
        self._reader: asyncio.Future[None] | None = None
        self._drained: asyncio.Future[None] | None = None
        self._paused = False
        # Receiving: unparsed bytes are _scratch[_lo:_hi]; a message being read has
        # its frame sizes left in _sizes and its frames so far in _frames; a large
        # frame is read into _fill straight from the socket.
        self._scratch = bytearray(_SCRATCH)
        self._view = memoryview(self._scratch)
        self._lo = self._hi = 0
        self._sizes: collections.deque[int] | None = None
        self._frames: list[Any] = []
        self._fill: memoryview | None = None
        self._big: memoryview | None = None

    # -- asyncio's callbacks ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._loop = asyncio.get_running_loop()
        self.lost = self._loop.create_future()
        self.transport = transport
        transport.set_write_buffer_limits(high=_HIGH_WATER)
        if self._on_made is not None:
            self._on_made(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.error is None:
            self.error = CommClosedError(
                f"connection closed: {exc}" if exc else "connection closed"
            )
        self._wake_reader()
        if self.lost is not None and not self.lost.done():
            self.lost.set_result(None)
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._fill is not None:
            return self._fill
        if self._hi == len(self._scratch):  # full: move what is unparsed to the front
            self._keep(len(self._scratch))
        return self._view[self._hi :]

    def buffer_updated(self, nbytes: int) -> None:
        fill = self._fill
        if fill is not None:
            if nbytes < len(fill):
                self._fill = fill[nbytes:]
                return
            self._fill = None
            self._frames.append(self._big)
            self._big = None
            assert self._sizes is not None
            self._sizes.popleft()
        else:
            self._hi += nbytes
        try:
            self._parse()
        except ValueError as exc:  # a garbled stream: nothing after it can be trusted
            self.error = CommClosedError(f"garbled message: {exc}")
            self._wake_reader()
            if self.transport is not None:
                self.transport.abort()

    def eof_received(self) -> bool:
        return False  # (close: ``connection_lost`` follows)

    # -- framing ------------------------------------------------------------------------

    def _parse(self) -> None:
        """Take every complete message (and the start of a large frame) from the
        scratch buffer."""
        view = self._view
        while True:
            lo, hi = self._lo, self._hi
            sizes = self._sizes
            if sizes is None:
                if hi - lo < 8:
                    break
                (count,) = _COUNT.unpack_from(view, lo)
                if count > _MAX_FRAMES:
                    raise ValueError(f"{count} frames")
                table = 8 + 8 * count
                if hi - lo < table:
                    if table > len(self._scratch) - lo:  # (a table larger than the scratch)
                        self._keep(max(table, _SCRATCH))
                    break
                sizes = self._sizes = collections.deque(
                    struct.unpack_from(f"<{count}Q", view, lo + 8)
                )
                self._lo = lo = lo + table
            while sizes:
                size = sizes[0]
                if hi - lo >= size:
                    self._frames.append(bytearray(view[lo : lo + size]))
                    lo += size
                    sizes.popleft()
                    continue
                # Not all here: the rest of this frame goes straight into its buffer.
                big = self._big = host_array(size)  # (not zeroed: the socket fills it)
                have = hi - lo
                big[:have] = view[lo:hi]
                self._lo = self._hi = 0
                self._fill = big[have:]
                return
            self._lo = lo
            self._inbox.append(self._frames)
            self._frames, self._sizes = [], None
            self._wake_reader()
        if self._lo == self._hi:
            self._lo = self._hi = 0

    def _keep(self, size: int) -> None:
        """Move the unparsed bytes to the front of a scratch buffer of ``size`` bytes."""
        kept = self._view[self._lo : self._hi].tobytes()
        if size != len(self._scratch):
            self._scratch = bytearray(size)
            self._view = memoryview(self._scratch)
        self._scratch[: len(kept)] = kept
        self._lo, self._hi = 0, len(kept)

    def _wake_reader(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None and not reader.done():
            reader.set_result(None)

    # -- the comm's side ----------------------------------------------------------------

    async def receive(self) -> list[Any]:
        """The next message's frames (``CommClosedError`` once the connection is gone)."""
        while not self._inbox:
            if self.error is not None:
                raise self.error
            self._reader = asyncio.get_running_loop().create_future()
            await self._reader
        return self._inbox.popleft()

    async def send(self, frames: list[Any]) -> int:
        """Write one message; its size.  Waits only when the transport holds more than
        ``_HIGH_WATER`` bytes (a large message)."""
        transport = self.transport
        if self.error is not None or transport is None:
            raise self.error or CommClosedError("not connected")
        views = [memoryview(f).cast("B") if not isinstance(f, bytes) else f for f in frames]
        sizes = [len(v) for v in views]
        total = sum(sizes)
        header = struct.pack(f"<Q{len(sizes)}Q", len(sizes), *sizes)
        if total <= _COALESCE:
            transport.write(b"".join([header, *views]))
            return total
        transport.write(header)
        for view in views:
            for start in range(0, len(view), _CHUNK):
                if self.error is not None:
                    raise self.error
                transport.write(view[start : start + _CHUNK])
                while self._paused and self.error is None:
                    self._drained = asyncio.get_running_loop().create_future()
                    await self._drained
        if self.error is not None:
            raise self.error
        return total

    def abort(self) -> None:
        # (A transport closes through callbacks on its loop: with the loop closed there
        # is nothing left to do it; Dask's pools close theirs with the loop.)
        if self.transport is not None and self._loop is not None and not self._loop.is_closed():
            self.transport.abort()
        if self.error is None:
            self.error = CommClosedError("aborted")
        self._wake_reader()

    def close(self) -> None:
        if self.transport is not None and self._loop is not None and not self._loop.is_closed():
            self.transport.close()


class AsyncioComm(Comm):
    """A Dask ``Comm`` over one :class:`_Wire`."""

    max_shard_size = dask.utils.parse_bytes(dask.config.get("distributed.comm.shard"))

    def __init__(self, wire: _Wire, local_addr: str, peer_addr: str, deserialize: bool = True):
        super().__init__(deserialize=deserialize)
        self._wire = wire
        self._local_addr = local_addr
        self._peer_addr = peer_addr

    @property
    def local_address(self) -> str:
        return self._local_addr

    @property
    def peer_address(self) -> str:
        return self._peer_addr

    async def read(self, deserializers: Any = None) -> Any:
        try:
            frames = await self._wire.receive()
        except CommClosedError:
            raise
        except BaseException:  # (cancelled mid-read: what follows cannot be trusted)
            self.abort()
            raise
        try:
            return await _utils.from_frames(
                frames,
                deserialize=self.deserialize,
                deserializers=deserializers,
                allow_offload=self.allow_offload,
            )
        except EOFError:
            self.abort()
            raise CommClosedError("aborted stream on truncated data") from None

    async def write(self, msg: Any, serializers: Any = None, on_error: str = "message") -> int:
        frames = await _utils.to_frames(
            msg,
            allow_offload=self.allow_offload,
            serializers=serializers,
            on_error=on_error,
            context={
                "sender": self.local_info,
                "recipient": self.remote_info,
                **self.handshake_options,
            },
            frame_split_size=self.max_shard_size,
        )
        try:
            return await self._wire.send(frames)
        except CommClosedError:
            raise
        except BaseException:  # (cancelled mid-write: the stream is cut mid-message)
            self.abort()
            raise

    async def close(self) -> None:
        """Close once what was written is sent (at most ``_CLOSE_S``, then cut), and
        return when the socket is closed: a pool closing before its loop stops leaves
        no socket behind."""
        wire = self._wire
        wire.close()
        lost = wire.lost
        if lost is None or lost.done() or wire._loop is not asyncio.get_running_loop():
            return
        try:
            async with asyncio.timeout(_CLOSE_S):
                await asyncio.shield(lost)
        except TimeoutError:
            wire.abort()
            await asyncio.shield(lost)

    def abort(self) -> None:
        self._wire.abort()

    def closed(self) -> bool:
        return self._wire.error is not None


def _tls_context(prefix: str, connection_args: dict[str, Any]) -> ssl.SSLContext | None:
    if prefix != "aftls://":
        if connection_args.get("require_encryption"):
            raise RuntimeError(
                f"encryption required by Dask configuration, refusing communication on {prefix!r}"
            )
        return None
    ctx = connection_args.get("ssl_context")
    if not isinstance(ctx, ssl.SSLContext):
        raise TypeError(
            f"{prefix} expects an `ssl_context` argument of type ssl.SSLContext "
            f"(Dask's Security makes one); got {ctx!r}"
        )
    return ctx


def _address(prefix: str, sock: Any) -> str:
    return prefix + unparse_host_port(*sock.getsockname()[:2])


class _Connector(Connector):
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    async def connect(self, address: str, deserialize: bool = True, **connection_args: Any) -> Comm:
        ctx = _tls_context(self.prefix, connection_args)
        host, port = parse_host_port(address)
        loop = asyncio.get_running_loop()
        try:
            transport, wire = await loop.create_connection(
                _Wire,
                host,
                port,
                ssl=ctx,
                server_hostname=connection_args.get("server_hostname") or (host if ctx else None),
            )
        except ssl.SSLCertVerificationError as exc:
            raise FatalCommClosedError(
                "TLS certificate does not match. Check your security settings."
            ) from exc
        except ssl.SSLError as exc:
            raise FatalCommClosedError(str(exc)) from exc
        sock = transport.get_extra_info("socket")
        return AsyncioComm(wire, _address(self.prefix, sock), self.prefix + address, deserialize)


class _Listener(BaseListener):
    def __init__(
        self,
        prefix: str,
        address: str,
        comm_handler: Any,
        deserialize: bool = True,
        allow_offload: bool = True,
        default_host: str | None = None,
        default_port: int = 0,
        **connection_args: Any,
    ) -> None:
        super().__init__()
        self.prefix = prefix
        self.ip, self.port = parse_host_port(address, default_port)
        self.default_host = default_host
        self.comm_handler = comm_handler
        self.deserialize = deserialize
        self.allow_offload = allow_offload
        self._ssl = _tls_context(prefix, connection_args)
        self._server: asyncio.Server | None = None
        self._bound: tuple[str, int] | None = None
        #: Connections being handed to the comm handler (a task each, kept here).
        self._handling: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Wire(self._accept),
            self.ip or None,
            self.port,
            ssl=self._ssl,
            backlog=int(dask.config.get("distributed.comm.socket-backlog")),
            reuse_address=True,
        )
        self._bound = self._server.sockets[0].getsockname()[:2]

    def _accept(self, wire: _Wire) -> None:
        assert wire.transport is not None
        sock = wire.transport.get_extra_info("socket")
        if self._server is None:  # stopped meanwhile
            wire.abort()
            return
        peer = self.prefix + unparse_host_port(*wire.transport.get_extra_info("peername")[:2])
        comm = AsyncioComm(wire, _address(self.prefix, sock), peer, self.deserialize)
        comm.allow_offload = self.allow_offload
        task = asyncio.ensure_future(self._handle(comm))
        self._handling.add(task)
        task.add_done_callback(self._handling.discard)

    async def _handle(self, comm: AsyncioComm) -> None:
        try:
            await self.on_connection(comm)
        except CommClosedError:
            return
        await self.comm_handler(comm)

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        self.abort_handshaking_comms()

    def get_host_port(self) -> tuple[str, int]:
        if self._bound is None:
            raise ValueError("invalid operation on a listener that did not start")
        return self._bound

    @property
    def listen_address(self) -> str:
        return self.prefix + unparse_host_port(*self.get_host_port())

    @property
    def contact_address(self) -> str:
        host, port = self.get_host_port()
        host = _utils.ensure_concrete_host(host, default_host=self.default_host)
        return self.prefix + unparse_host_port(host, port)


class _Backend(BaseTCPBackend):  # (Dask's host:port address handling)
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def get_connector(self) -> Connector:
        return _Connector(self.prefix)

    def get_listener(
        self, loc: str, handle_comm: Any, deserialize: bool, **connection_args: Any
    ) -> BaseListener:
        return _Listener(self.prefix, loc, handle_comm, deserialize, **connection_args)


for _scheme in SCHEMES.values():
    backends.setdefault(_scheme, _Backend(f"{_scheme}://"))
