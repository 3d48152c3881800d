"""Session resources: variables and queues, shared by every step of a session.

A :class:`ResourceMgr` maps ``(container, name)`` to a resource.  Resources outlive
steps and serve steps running on *any* event loop and thread at once (``await
sess.run`` on a service's loop, ``run_sync`` from worker threads), so nothing here
holds a lock across an ``await`` or a future of one particular loop:

* a :class:`VariableStore` guards its value with a ``threading.Lock`` held only for
  a read-modify-write;
* a :class:`FIFOQueueResource` keeps its elements and its waiting enqueues and
  dequeues under a ``threading.Lock``; a waiter is a future of *its own* loop, and
  is resolved with ``call_soon_threadsafe``.  Waiting holds no thread.  Waiters are
  served strictly in arrival order.  Elements handed to a waiter whose step was
  cancelled meanwhile go back to the front of the queue, in order: nothing is lost.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from asyncflow import errors

__all__ = ["WOULD_BLOCK", "FIFOQueueResource", "QueueSpec", "ResourceMgr", "VariableStore"]

T = TypeVar("T")


class _WouldBlock:
    __slots__ = ()

    def __repr__(self) -> str:
        return "WOULD_BLOCK"


#: What an async kernel's ``nowait`` twin returns when it cannot finish at once (see
#: ``Step.dispatch``): it did nothing, and the kernel itself is awaited instead.
WOULD_BLOCK: Any = _WouldBlock()


class ResourceMgr:
    """Named resources of one session (TF's ``ResourceMgr``): thread-safe, loop-agnostic."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._resources: dict[tuple[str, str], Any] = {}

    def lookup_or_create(
        self,
        container: str,
        name: str,
        kind: type[T],
        create: Callable[[], T],
        check: Callable[[T], None] | None = None,
    ) -> T:
        """The resource ``(container, name)``, created by ``create()`` if absent.

        ``check(existing)`` raises when an existing resource is incompatible.
        """
        key = (container, name)
        found = self._resources.get(key)  # a dict read is atomic: no lock on the hot path
        if found is None:
            with self._lock:
                found = self._resources.get(key)
                if found is None:
                    found = self._resources[key] = create()
                    return found
        if not isinstance(found, kind):
            raise errors.InvalidArgumentError(
                None, None, f"resource {name!r} is a {type(found).__name__}, not a {kind.__name__}"
            )
        if check is not None:
            check(found)
        return found

    def get(self, container: str, name: str) -> Any:
        """The resource, or ``None``."""
        return self._resources.get((container, name))

    def clear(self) -> None:
        """Release everything (session close): queues fail their waiters."""
        with self._lock:
            resources, self._resources = self._resources, {}
        for r in resources.values():
            release = getattr(r, "release", None)
            if release is not None:
                release()

    def __len__(self) -> int:
        return len(self._resources)

    def __repr__(self) -> str:
        return f"<ResourceMgr resources={len(self._resources)}>"


# -- variables ---------------------------------------------------------------------------


class VariableStore:
    """The value of one variable in one session."""

    __slots__ = ("_lock", "_value", "dtype", "name")

    def __init__(self, name: str, dtype: np.dtype[Any]) -> None:
        self.name = name
        self.dtype = dtype
        self._value: Any = None
        self._lock = threading.Lock()

    def read(self) -> Any:
        """The current value; ``FailedPreconditionError`` naming the variable if unset."""
        value = self._value
        if value is None:
            raise errors.FailedPreconditionError(
                None, None, f"Attempting to use uninitialized value {self.name}"
            )
        return value

    def assign(self, value: Any) -> Any:
        """Replace the value; returns it."""
        frozen = _frozen(value, self.dtype)
        with self._lock:
            self._value = frozen
        return frozen

    def update(self, fn: Callable[[Any], Any]) -> Any:
        """``value = fn(value)`` atomically (assign_add / assign_sub); returns the new value."""
        with self._lock:
            new = _frozen(fn(self.read()), self.dtype)
            self._value = new
        return new


def _frozen(value: Any, dtype: np.dtype[Any]) -> Any:
    # Stored values are read-only: a step or a caller can never change them in place
    # (fetches of read-only arrays are copied on the way out).
    if isinstance(value, np.ndarray):
        if value.dtype != dtype:
            value = value.astype(dtype)
        if value.flags.writeable:
            value = value.copy()
            value.flags.writeable = False
        return value
    return np.asarray(value, dtype=dtype)[()]


# -- queues -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """What a FIFO queue holds: capacity, component dtypes (numpy) and shapes (or None)."""

    capacity: int
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...] | None, ...]

    def differences(self, other: QueueSpec) -> list[str]:
        out = []
        if self.capacity != other.capacity:
            out.append(f"capacity {self.capacity} vs {other.capacity}")
        if self.dtypes != other.dtypes:
            out.append(f"component types {list(self.dtypes)} vs {list(other.dtypes)}")
        if self.shapes != other.shapes:
            out.append(f"shapes {list(self.shapes)} vs {list(other.shapes)}")
        return out


Element = tuple[Any, ...]


class _Waiter:
    __slots__ = ("future", "items", "n")

    def __init__(self, future: asyncio.Future[Any], n: int, items: deque[Element] | None) -> None:
        self.future = future
        self.n = n  # dequeue: how many elements it takes
        self.items = items  # enqueue: the elements still to put


class FIFOQueueResource:
    """A bounded FIFO queue of tuples of numpy values, served in arrival order."""

    def __init__(self, name: str, spec: QueueSpec) -> None:
        self.name = name
        self.spec = spec
        # Re-entrant: a waiter whose loop is gone gives its elements back from
        # inside _serve_locked.
        self._lock = threading.RLock()
        self._items: deque[Element] = deque()
        self._getters: deque[_Waiter] = deque()
        self._putters: deque[_Waiter] = deque()
        self._closed = False

    def check(self, spec: QueueSpec) -> None:
        """``InvalidArgumentError`` naming what differs from an existing shared queue."""
        diffs = self.spec.differences(spec)
        if diffs:
            raise errors.InvalidArgumentError(
                None,
                None,
                f"Shared queue {self.name!r} already exists with a different "
                f"definition: {'; '.join(diffs)}",
            )

    def size(self) -> int:
        """How many elements are queued."""
        return len(self._items)

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def put_nowait(self, elements: Sequence[Element]) -> bool:
        """Enqueue all of ``elements`` now if no enqueue is waiting and they fit: True;
        else False, having put nothing (``put`` then waits its turn)."""
        with self._lock:
            if self._closed:
                raise errors.CancelledError(None, None, f"Queue {self.name!r} is closed.")
            if self._putters or len(self._items) + len(elements) > self.spec.capacity:
                return False
            self._items.extend(elements)
            if self._getters:
                self._serve_locked()
            return True

    def get_nowait(self, n: int) -> list[Element] | None:
        """``n`` elements now if no dequeue is waiting and enough are queued; else None,
        having taken nothing (``get`` then waits its turn, or fails on a closed queue)."""
        with self._lock:
            items = self._items
            if self._getters or len(items) < n:
                return None
            taken = [items.popleft() for _ in range(n)]
            if self._putters:
                self._serve_locked()
            return taken

    async def put(self, elements: Sequence[Element]) -> None:
        """Enqueue ``elements`` in order, waiting (holding no thread) while the queue is full."""
        fut = asyncio.get_running_loop().create_future()
        waiter = _Waiter(fut, 0, deque(elements))
        with self._lock:
            if self._closed:
                raise errors.CancelledError(None, None, f"Queue {self.name!r} is closed.")
            self._putters.append(waiter)
            self._serve_locked()
        try:
            await fut
        except asyncio.CancelledError:
            with self._lock:
                if waiter in self._putters:
                    self._putters.remove(waiter)  # its remaining elements are dropped
            raise

    async def get(self, n: int) -> list[Element]:
        """Dequeue ``n`` elements, waiting while there are too few.

        ``OutOfRangeError`` once the queue is closed and cannot supply ``n``.
        """
        fut: asyncio.Future[list[Element]] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(fut, n, None)
        with self._lock:
            self._getters.append(waiter)
            self._serve_locked()
        try:
            return await fut
        except asyncio.CancelledError:
            with self._lock:
                if waiter in self._getters:
                    self._getters.remove(waiter)  # still waiting: it took nothing
                elif fut.done() and not fut.cancelled() and fut.exception() is None:
                    # Handed its elements, cancelled before it could deliver them to
                    # its step: they go back to the front of the queue, in order.
                    self._give_back(fut.result())
            raise

    def close(self, cancel_pending_enqueues: bool = False) -> None:
        """Close: no new enqueues; waiting dequeues that cannot be served fail.

        Closing a closed queue is ``CancelledError`` ("already closed"), as TF (after
        cancelling pending enqueues if asked).
        """
        with self._lock:
            was_closed = self._closed
            self._closed = True
            if cancel_pending_enqueues:
                while self._putters:
                    w = self._putters.popleft()
                    _resolve(
                        w.future,
                        errors.CancelledError(
                            None, None, f"Queue {self.name!r} is closed: pending enqueue cancelled."
                        ),
                        None,
                    )
            self._serve_locked()
        if was_closed:
            raise errors.CancelledError(None, None, f"Queue {self.name!r} is already closed.")

    def release(self) -> None:
        """Session close: fail every waiter with ``CancelledError``."""
        with self._lock:
            self._closed = True
            for w in (*self._putters, *self._getters):
                _resolve(
                    w.future,
                    errors.CancelledError(
                        None, None, f"Queue {self.name!r} was released (session closed)."
                    ),
                    None,
                )
            self._putters.clear()
            self._getters.clear()

    # Invariant (under the lock): a getter is waiting only if fewer than its n elements
    # are queued and it is first in line; a putter only if the queue is full.
    def _serve_locked(self) -> None:
        progress = True
        while progress:
            progress = False
            while self._getters and self._getters[0].n <= len(self._items):
                w = self._getters.popleft()
                taken = [self._items.popleft() for _ in range(w.n)]
                _resolve(w.future, None, taken, self._give_back)
                progress = True
            capacity = self.spec.capacity
            while self._putters and len(self._items) < capacity:
                w = self._putters[0]
                assert w.items is not None
                while w.items and len(self._items) < capacity:
                    self._items.append(w.items.popleft())
                    progress = True
                if not w.items:
                    self._putters.popleft()
                    _resolve(w.future, None, None)
            if (
                self._closed
                and self._getters
                and not self._putters
                and self._getters[0].n > len(self._items)
            ):
                w = self._getters.popleft()
                _resolve(
                    w.future,
                    errors.OutOfRangeError(
                        None,
                        None,
                        f"FIFOQueue {self.name!r} is closed and has insufficient "
                        f"elements (requested {w.n}, current size "
                        f"{len(self._items)})",
                    ),
                    None,
                )
                progress = True

    def _give_back(self, taken: list[Element]) -> None:
        # A dequeue's step was cancelled after it was handed its elements: put them
        # back at the front, in order, and serve the next waiter.
        with self._lock:
            self._items.extendleft(reversed(taken))
            self._serve_locked()

    def __repr__(self) -> str:
        return (
            f"<FIFOQueue {self.name!r} size={len(self._items)} "
            f"capacity={self.spec.capacity} closed={self._closed}>"
        )


def _resolve(
    fut: asyncio.Future[Any],
    error: BaseException | None,
    result: Any,
    give_back: Callable[[Any], None] | None = None,
) -> None:
    """Resolve a waiter's future on its own loop (any thread may call this)."""

    def settle() -> None:
        if fut.done():  # cancelled meanwhile
            if give_back is not None and result:
                give_back(result)
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)

    loop = fut.get_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        settle()  # on the waiter's own loop: no wake-up through the self-pipe needed
        return
    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:  # that loop is closed: its step is gone
        if give_back is not None and result:
            give_back(result)
