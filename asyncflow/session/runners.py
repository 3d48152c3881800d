"""The event loops behind ``run_sync``: one :class:`asyncio.Runner` per calling thread.

TensorFlow's ``DirectSession::Run`` is ``RunAsync`` plus a ``Notification``; the
sync wrapper here is ``Runner.run`` (what ``asyncio.run`` is built on), with the
runner kept across calls so that

* a call costs one task on an existing loop, not a new loop (about 120 µs);
* objects bound to a loop — an ``asyncio.Lock`` an async kernel holds, an HTTP
  client's connection pool — keep working from one ``run_sync`` to the next.

Each calling thread gets its own runner (a loop runs in one thread at a time).
Runners are closed with the session (:meth:`SyncRunners.close`; also when a
session nobody closed is collected), including those of threads that have exited
meanwhile; a new runner also closes the runners of
exited threads it finds, so a session used from many short-lived threads keeps
at most one loop per live thread.  A runner's loop is never installed as the
thread's current event loop (``loop_factory``), so closing it from another
thread touches no one else's loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["SyncRunners"]

T = TypeVar("T")


class _Entry:
    __slots__ = ("busy", "runner", "thread")

    def __init__(self, thread: threading.Thread) -> None:
        self.thread = thread
        self.runner = asyncio.Runner(loop_factory=asyncio.new_event_loop)
        #: Running a coroutine now: only its own thread may close it then.
        self.busy = False


class SyncRunners:
    """One ``asyncio.Runner`` per calling thread, closed together."""

    __slots__ = ("_closed", "_entries", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Thread ident -> entry.  Invariant: an entry whose thread has exited is
        #: idle (``busy`` is reset before ``run`` returns) and may be closed anywhere.
        self._entries: dict[int, _Entry] = {}
        self._closed = False

    def __len__(self) -> int:
        return len(self._entries)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` to completion on this thread's loop (made on first use)."""
        thread = threading.current_thread()
        stale: list[_Entry] = []
        with self._lock:
            if self._closed:
                coro.close()
                raise RuntimeError("Attempted to use a closed Session.")
            entry = self._entries.get(thread.ident)  # type: ignore[arg-type]
            if entry is None or entry.thread is not thread:
                # New thread (or a reused ident): reap the runners of exited threads.
                stale = [e for k, e in self._entries.items() if not e.thread.is_alive()]
                for e in stale:
                    del self._entries[e.thread.ident]  # type: ignore[arg-type]
                entry = self._entries[thread.ident] = _Entry(thread)  # type: ignore[index]
            entry.busy = True
        for e in stale:
            e.runner.close()
        close_now = False
        try:
            # The runner's loop, run directly: Runner.run would also swap the SIGINT
            # handler on every call (about a third of a call's cost in the main thread).
            # Ctrl-C therefore raises KeyboardInterrupt where the loop is; the step is
            # then cancelled and finished by closing the runner, below.
            loop = entry.runner.get_loop()
            ok, value = loop.run_until_complete(loop.create_task(_settled(coro)))
            if ok:
                return value  # type: ignore[no-any-return]
            try:
                raise value
            finally:
                value = None  # this frame, in the error's traceback, must not hold it
        except BaseException as exc:
            if not isinstance(exc, Exception):
                # KeyboardInterrupt / SystemExit stopped the loop with the step's tasks
                # suspended: as asyncio.run does, cancel them and finish them now (in
                # closing the runner), so the step ends and nothing waits for it.
                close_now = True
            raise
        finally:
            with self._lock:
                entry.busy = False
                if close_now and self._entries.get(thread.ident) is entry:  # type: ignore[arg-type]
                    del self._entries[thread.ident]  # type: ignore[arg-type]
                close_now = close_now or self._closed
            if close_now:  # (or the session closed while this call ran: ours to close)
                entry.runner.close()

    def close(self) -> None:
        """Close every idle runner; a busy one is closed by its thread when its call ends.

        A runner's close runs its loop, which cannot happen inside another running
        loop: called from a thread whose loop runs, this closes them on a helper
        thread and joins it (async code should prefer :meth:`close_elsewhere`).
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self._close_here()
            return
        helper = threading.Thread(target=self._close_here, name="asyncflow-close-runners")
        helper.start()
        helper.join()

    def _close_here(self) -> None:
        with self._lock:
            self._closed = True
            idle = [e for e in self._entries.values() if not e.busy]
            self._entries.clear()
        for e in idle:
            e.runner.close()

    async def close_elsewhere(self) -> None:
        """:meth:`close` from async code: the runners are closed on a helper thread
        (a loop cannot run inside another one), which this awaits and joins."""
        with self._lock:
            if not self._entries:
                self._closed = True
                return
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def close_and_tell() -> None:
            try:
                self._close_here()
            finally:
                loop.call_soon_threadsafe(_set_done, done)

        helper = threading.Thread(target=close_and_tell, name="asyncflow-close-runners")
        helper.start()
        try:
            await asyncio.shield(done)
        finally:
            helper.join()


def _set_done(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def _settled(coro: Coroutine[Any, Any, T]) -> tuple[bool, Any]:
    """``coro``'s result, or the ``Exception`` it raised, as a value.  Raised by the
    caller outside the loop: had it gone through ``run_until_complete``, the loop's
    frame (holding the task, which holds the exception) would be in its traceback,
    a reference cycle per failed call."""
    try:
        return True, await coro
    except Exception as exc:
        return False, exc
