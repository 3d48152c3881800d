"""The Rendezvous: where a step's partitions hand tensors to each other by key.

TensorFlow's ``IntraProcessRendezvous`` on the event loop: one table of keyed
queues per step.  A ``_Send`` never blocks; a ``_Recv`` is satisfied at once when
the value is already there, or leaves a *waiter* that the matching send completes
— no polling, no task per waiting recv.  Several sends on one key queue up, each
consumed by one recv (newer TF).  A value travels with its *dead* flag (for
control flow).

A waiter is anything with a future's ``done`` / ``set_result`` / ``set_exception``
(:class:`Waiter`): an ``asyncio.Future`` (:meth:`LocalRendezvous.recv_future`, the
general path), or an executor's own object (:meth:`LocalRendezvous.recv_or_wait`).
Like TF's ``RecvAsync`` done callback, the rendezvous completes a waiter
synchronously, inside the send; what happens next (run the receiving node now,
queue it, schedule it on the loop) is the waiter's business, so the rendezvous
neither knows nor cares whether a peer is a partition of this process or a task on
another machine.  A waiter whose ``done()`` turns true before its value came (its
step stopped) gives up its turn: the value goes to the next waiter or stays queued.

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
    "Waiter",
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


class Waiter(Protocol):
    """A waiting recv, as the rendezvous sees it (``asyncio.Future`` is one).

    The rendezvous calls ``set_result`` or ``set_exception`` at most once, and only
    while ``done()`` is false.
    """

    def done(self) -> bool: ...
    def set_result(self, result: Item, /) -> None: ...
    def set_exception(self, exception: BaseException, /) -> None: ...


class Rendezvous(Protocol):
    """What an executor needs from a rendezvous (local or remote)."""

    def send(self, key: str, value: Any, is_dead: bool = False) -> None: ...
    def recv_nowait(self, key: str) -> Item: ...
    def recv_or_wait(self, key: str, waiter: Waiter) -> Item | None: ...
    def recv_future(self, key: str) -> asyncio.Future[Item]: ...
    async def recv(self, key: str) -> Item: ...
    def abort(self, error: BaseException) -> None: ...
    def statistics(self) -> RendezvousStatistics: ...


class LocalRendezvous:
    """A per-step rendezvous for partitions of one process (one event loop)."""

    __slots__ = (
        "_aborted",
        "_more_values",
        "_more_waiters",
        "_received",
        "_sent",
        "_values",
        "_waiters",
    )

    def __init__(self) -> None:
        # Per key, a FIFO of queued items or of waiting recvs, never both (a send first
        # satisfies a waiter; a recv first takes a value).  A FIFO is its first entry
        # in _values / _waiters, the rest (rare: several sends on one key) in
        # _more_values / _more_waiters: one dict entry per edge, no deque to allocate.
        # Invariant: _more_x[key] exists only while _x[key] does, and is never empty.
        self._values: dict[str, Item] = {}
        self._more_values: dict[str, deque[Item]] = {}
        self._waiters: dict[str, Waiter] = {}
        self._more_waiters: dict[str, deque[Waiter]] = {}
        self._aborted: BaseException | None = None
        self._sent = 0
        self._received = 0

    def send(self, key: str, value: Any, is_dead: bool = False) -> None:
        """Hand ``value`` to the first waiting recv of ``key``, or queue it.  Never blocks."""
        if self._aborted is not None:
            raise self._abort_error(key)
        self._sent += 1
        waiters = self._waiters
        waiter = waiters.pop(key, None)
        while waiter is not None:
            if self._more_waiters:
                _promote(waiters, self._more_waiters, key)
            if not waiter.done():  # a cancelled recv gives up its turn
                self._received += 1
                waiter.set_result((value, is_dead))
                return
            waiter = waiters.pop(key, None)
        if key in self._values:
            self._more_values.setdefault(key, deque()).append((value, is_dead))
        else:
            self._values[key] = (value, is_dead)

    def recv_nowait(self, key: str) -> Item:
        """The oldest queued ``(value, is_dead)`` of ``key``; ``WouldBlock`` if none yet."""
        if self._aborted is not None:
            raise self._abort_error(key)
        item = self._values.pop(key, None)
        if item is None:
            raise WouldBlock(key)
        if self._more_values:
            _promote(self._values, self._more_values, key)
        self._received += 1
        return item

    def recv_or_wait(self, key: str, waiter: Waiter) -> Item | None:
        """The oldest queued ``(value, is_dead)`` of ``key`` (``waiter`` unused); or None,
        and the matching send (or an abort) completes ``waiter`` later.

        ``AbortedError`` if the rendezvous was aborted.  The fast path of a recv: no
        exception and no future when the value is there.
        """
        if self._aborted is not None:
            raise self._abort_error(key)
        item = self._values.pop(key, None)
        if item is not None:
            if self._more_values:
                _promote(self._values, self._more_values, key)
            self._received += 1
            return item
        if key in self._waiters:
            self._more_waiters.setdefault(key, deque()).append(waiter)
        else:
            self._waiters[key] = waiter
        return None

    def recv_future(self, key: str) -> asyncio.Future[Item]:
        """A future for the next ``(value, is_dead)`` of ``key`` (already done if queued)."""
        fut: asyncio.Future[Item] = asyncio.get_running_loop().create_future()
        try:
            # This table's own (a subclass's recv_or_wait may call recv_future).
            item = LocalRendezvous.recv_or_wait(self, key, fut)
        except errors.AbortedError as exc:
            fut.set_exception(exc)
            return fut
        if item is not None:
            fut.set_result(item)
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
        more, self._more_waiters = self._more_waiters, {}
        self._values.clear()
        self._more_values.clear()
        for key, first in waiters.items():
            for waiter in (first, *more.get(key, ())):
                if not waiter.done():
                    waiter.set_exception(self._abort_error(key))

    @property
    def aborted(self) -> BaseException | None:
        """The error it was aborted with, or None."""
        return self._aborted

    def statistics(self) -> RendezvousStatistics:
        """Counters and current queue sizes."""
        return RendezvousStatistics(
            sent=self._sent,
            received=self._received,
            queued_values=len(self._values) + sum(map(len, self._more_values.values())),
            waiting_recvs=sum(
                not w.done()
                for w in (
                    *self._waiters.values(),
                    *(w for q in self._more_waiters.values() for w in q),
                )
            ),
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
        return (
            f"<LocalRendezvous sent={s.sent} received={s.received} "
            f"waiting={s.waiting_recvs} aborted={s.aborted}>"
        )


def _promote(first: dict[str, Any], more: dict[str, deque[Any]], key: str) -> None:
    """The first entry of ``key``'s FIFO was taken: the next one (if any) moves up."""
    rest = more.get(key)
    if rest:
        first[key] = rest.popleft()
        if not rest:
            del more[key]
