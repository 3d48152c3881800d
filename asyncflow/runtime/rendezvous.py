"""The Rendezvous: where a step's partitions hand tensors to each other by key.

TensorFlow's ``IntraProcessRendezvous`` on the event loop: one table of keyed
queues per step.  A ``_Send`` never blocks; a ``_Recv`` is satisfied at once when
the value is already there, or gets an ``asyncio.Future`` that the matching send
resolves — no polling, no task per waiting recv.  Several sends on one key queue
up, each consumed by one recv (newer TF).  A value travels with its *dead* flag
(for control flow).

``abort(error)`` is sticky: every waiting recv and every later send or recv fails
at once with ``AbortedError`` carrying the original error as its cause, so when one
partition fails its peers stop instead of waiting for values that will never come.

Keys have TensorFlow's form ``src_device;incarnation;dst_device;tensor_name;frame:iter``
(see :mod:`asyncflow.compiler.keys`).  The executor only sees the
:class:`Rendezvous` protocol, so a rendezvous whose peer is on another machine
plugs in without changing it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from anyio import WouldBlock

from asyncflow import errors

__all__ = [
    "LocalRendezvous",
    "Rendezvous",
    "RendezvousStatistics",
    "WouldBlock",
]

Item = tuple[Any, bool]  # (value, is_dead)


@dataclass(frozen=True, slots=True)
class RendezvousStatistics:
    """A snapshot: values sent and received, keys with queued values or waiting recvs."""

    sent: int
    received: int
    queued_values: int
    waiting_recvs: int
    aborted: bool


class Rendezvous(Protocol):
    """What an executor needs from a rendezvous (local or remote)."""

    def send(self, key: str, value: Any, is_dead: bool = False) -> None: ...
    def recv_nowait(self, key: str) -> Item: ...
    def recv_future(self, key: str) -> asyncio.Future[Item]: ...
    async def recv(self, key: str) -> Item: ...
    def abort(self, error: BaseException) -> None: ...
    def statistics(self) -> RendezvousStatistics: ...


class LocalRendezvous:
    """A per-step rendezvous for partitions of one process (one event loop)."""

    __slots__ = ("_aborted", "_received", "_sent", "_values", "_waiters")

    def __init__(self) -> None:
        # Invariant: for any key, at most one of _values[key] / _waiters[key] is
        # non-empty (a send first satisfies a waiter; a recv first takes a value).
        self._values: dict[str, deque[Item]] = {}
        self._waiters: dict[str, deque[asyncio.Future[Item]]] = {}
        self._aborted: BaseException | None = None
        self._sent = 0
        self._received = 0

    def send(self, key: str, value: Any, is_dead: bool = False) -> None:
        """Hand ``value`` to the first waiting recv of ``key``, or queue it.  Never blocks."""
        if self._aborted is not None:
            raise self._abort_error(key)
        self._sent += 1
        waiters = self._waiters.get(key)
        while waiters:
            fut = waiters.popleft()
            if not fut.done():  # a cancelled recv gives up its turn
                if not waiters:
                    del self._waiters[key]
                self._received += 1
                fut.set_result((value, is_dead))
                return
        self._waiters.pop(key, None)
        self._values.setdefault(key, deque()).append((value, is_dead))

    def recv_nowait(self, key: str) -> Item:
        """The oldest queued ``(value, is_dead)`` of ``key``; ``WouldBlock`` if none yet."""
        if self._aborted is not None:
            raise self._abort_error(key)
        queue = self._values.get(key)
        if not queue:
            raise WouldBlock(key)
        item = queue.popleft()
        if not queue:
            del self._values[key]
        self._received += 1
        return item

    def recv_future(self, key: str) -> asyncio.Future[Item]:
        """A future for the next ``(value, is_dead)`` of ``key`` (already done if queued)."""
        fut: asyncio.Future[Item] = asyncio.get_running_loop().create_future()
        try:
            fut.set_result(self.recv_nowait(key))
        except WouldBlock:
            self._waiters.setdefault(key, deque()).append(fut)
        except errors.AbortedError as exc:
            fut.set_exception(exc)
        return fut

    async def recv(self, key: str) -> Item:
        """Wait for the next ``(value, is_dead)`` of ``key``."""
        return await self.recv_future(key)

    def abort(self, error: BaseException) -> None:
        """Fail every waiting and later send/recv with ``AbortedError`` (sticky; first wins)."""
        if self._aborted is not None:
            return
        self._aborted = error
        waiters, self._waiters = self._waiters, {}
        self._values.clear()
        for key, queue in waiters.items():
            for fut in queue:
                if not fut.done():
                    fut.set_exception(self._abort_error(key))

    @property
    def aborted(self) -> BaseException | None:
        """The error it was aborted with, or None."""
        return self._aborted

    def statistics(self) -> RendezvousStatistics:
        """Counters and current queue sizes."""
        return RendezvousStatistics(
            sent=self._sent,
            received=self._received,
            queued_values=sum(len(q) for q in self._values.values()),
            waiting_recvs=sum(1 for q in self._waiters.values() for f in q if not f.done()),
            aborted=self._aborted is not None,
        )

    def _abort_error(self, key: str) -> errors.AbortedError:
        cause = self._aborted
        detail = cause.message if isinstance(cause, errors.OpError) else repr(cause)
        err = errors.AbortedError(None, None, f"rendezvous aborted (key {key!r}): {detail}")
        err.__cause__ = cause
        return err

    def __repr__(self) -> str:
        s = self.statistics()
        return (f"<LocalRendezvous sent={s.sent} received={s.received} "
                f"waiting={s.waiting_recvs} aborted={s.aborted}>")
