"""The remote rendezvous: a step's :class:`LocalRendezvous`, plus the edges that cross tasks.

TensorFlow's ``BaseRemoteRendezvous`` on the event loop.  Same-task edges stay in
the local table.  Between tasks a value is *pushed*: the producing task's ``_Send``
hands it to the consuming task's rendezvous (``send_tensor(step_id, key)``, one
message, no answer), where the ``_Recv`` finds it as if it had been sent locally.
A push before the consumer's run is kept until the run comes; one after the step is
over there (it failed, was aborted or given up on) is dropped.  The session's own
process (``/job:localhost``) is no server: it pushes its sends too, but *pulls*
(``recv_tensor``) the values tasks send it, and tasks keep those until pulled.

Transfers are tasks of the step's task group (:meth:`attach`); a recv that is
cancelled (its step failed) cancels its pull, and :meth:`abort` fails every pending
transfer at once, so no remote wait outlives its step.  A task's push
(``push_now``) starts right in its ``_Send``: on an open idle connection it is
written without ever suspending (a write never waits for the socket to drain), so it
needs no task and no turn of the loop, and the task's answer to the session follows
at once; only a push that does suspend (a connect) goes on as a task of the group.
"""

from __future__ import annotations

import asyncio
import functools
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, TypeVar

from asyncflow import errors
from asyncflow.runtime.rendezvous import Item, LocalRendezvous, Waiter

__all__ = ["LOCAL_TASK", "PullFn", "PushFn", "RemoteRendezvous", "task_of"]

T = TypeVar("T")

#: The task of the session's own process.
LOCAL_TASK = "/job:localhost/replica:0/task:0"

#: ``pull(task, step_id, key)``: the value ``task`` sent under ``key`` in step ``step_id``.
PullFn = Callable[[str, int, str], Awaitable[Item]]
#: ``push(task, step_id, key, value, is_dead)``: hand a value to ``task``'s rendezvous.
PushFn = Callable[[str, int, str, Any, bool], Awaitable[None]]


def task_of(device: str) -> str:
    """``/job:J/replica:R/task:T`` of a full device name."""
    cut = device.find("/device:")
    return device if cut < 0 else device[:cut]


class RemoteRendezvous(LocalRendezvous):
    """The rendezvous of one step on one task (or in the session's process)."""

    __slots__ = (
        "_on_error",
        "_pull",
        "_push",
        "_push_error",
        "_push_now",
        "_step_id",
        "_task",
        "_tg",
        "_transfers",
    )

    def __init__(
        self,
        task: str,
        step_id: int,
        pull: PullFn | None,
        push: PushFn | None = None,
        on_error: Callable[[errors.OpError], None] | None = None,
        push_now: bool = False,
    ) -> None:
        super().__init__()
        self._task = task
        self._step_id = step_id
        self._pull = pull
        self._push = push
        # Pushes start in the sending kernel (``push`` must not depend on the task it
        # runs in: a task's one-way send does not, the session's calls register theirs).
        self._push_now = push_now
        self._on_error = on_error
        self._tg: asyncio.TaskGroup | None = None
        self._push_error: errors.OpError | None = None
        # Pending remote recvs: failed at once by abort().
        self._transfers: set[asyncio.Future[Item]] = set()

    @property
    def step_id(self) -> int:
        """The step this rendezvous belongs to."""
        return self._step_id

    @property
    def push_error(self) -> errors.OpError | None:
        """Why a push of this step failed (its consumer never gets the value), or None."""
        return self._push_error

    def attach(self, tg: asyncio.TaskGroup | None) -> None:
        """Run transfers in ``tg`` (the step's task group); None when the step ends."""
        self._tg = tg

    def _remote(self, device: str) -> str | None:
        task = task_of(device)
        return None if task == self._task else task

    def send(self, key: str, value: Any, is_dead: bool = False) -> None:
        """Local, unless the consumer is another task: then pushed there (a task keeps
        what the session receives: the session pulls it)."""
        push = self._push
        if push is not None:
            dst = self._remote(key.split(";", 3)[2])
            if dst is not None and (self._pull is not None or dst != LOCAL_TASK):
                if self._aborted is not None:
                    raise self._abort_error(key)
                self._sent += 1
                self._group()  # (before the push starts: it belongs to the step)
                pushing = push(dst, self._step_id, key, value, is_dead)
                if self._push_now and isinstance(pushing, Coroutine):
                    self._push_started(pushing)
                else:
                    self._spawn(self._pushing(pushing))
                return
        super().send(key, value, is_dead)

    def _pulled_from(self, key: str) -> str | None:
        """The task a recv of ``key`` pulls from; None when the value arrives here
        (same task, or a task, whose peers and session push to it)."""
        if self._pull is None:
            return None
        return self._remote(key[: key.index(";")])

    def recv_or_wait(self, key: str, waiter: Waiter) -> Item | None:
        """Local, unless the producer is another task: then the pull's future
        completes ``waiter`` (a pull is a task and a network trip: its future costs
        nothing in comparison)."""
        if self._pulled_from(key) is None:
            return super().recv_or_wait(key, waiter)
        if self._aborted is not None:
            raise self._abort_error(key)
        self.recv_future(key).add_done_callback(functools.partial(_forward, waiter))
        return None

    def recv_future(self, key: str) -> asyncio.Future[Item]:
        """Local, unless the producer is another task: then a pull from it."""
        src = self._pulled_from(key)
        if src is None:
            return super().recv_future(key)
        fut: asyncio.Future[Item] = asyncio.get_running_loop().create_future()
        if self._aborted is not None:
            fut.set_exception(self._abort_error(key))
            return fut
        self._transfers.add(fut)
        task = self._spawn(self._pulling(src, key, fut))

        def done(f: asyncio.Future[Item]) -> None:
            self._transfers.discard(f)
            task.cancel()  # the recv was cancelled (its step failed): stop pulling

        fut.add_done_callback(done)
        return fut

    def idle(self) -> bool:
        """Nothing queued, nobody waiting: every value sent here was taken."""
        return not self._values and not self._waiters and not self._transfers

    def local_recv_future(self, key: str) -> asyncio.Future[Item]:
        """A recv from this task's own table (what a peer's pull waits on)."""
        return super().recv_future(key)

    def abort(self, error: BaseException) -> None:
        """Abort locally, and fail every pending pull."""
        if self._aborted is not None:
            return
        super().abort(error)
        pending, self._transfers = self._transfers, set()
        for fut in pending:
            if not fut.done():
                fut.set_exception(self._abort_error("(remote recv)"))

    def _group(self) -> asyncio.TaskGroup:
        """The step's task group; an ``InternalError`` outside a step."""
        tg = self._tg
        if tg is None:
            raise errors.InternalError(
                None, None, f"step {self._step_id}: a cross-task transfer outside a step"
            )
        return tg

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        try:
            tg = self._group()
        except errors.InternalError:
            coro.close()
            raise
        return tg.create_task(coro)

    async def _pulling(self, src: str, key: str, fut: asyncio.Future[Item]) -> None:
        assert self._pull is not None  # (only the session pulls)
        try:
            item = await self._pull(src, self._step_id, key)
        except Exception as exc:
            if not fut.done():
                fut.set_exception(exc)
            return
        if not fut.done():
            self._received += 1
            fut.set_result(item)

    def _push_started(self, pushing: Coroutine[Any, Any, None]) -> None:
        """Run a push here until it first suspends; what is left (if anything) goes on
        as a task of the step.  Its failure is reported by that task, never from
        inside the sending kernel."""
        try:
            suspended_on = pushing.send(None)
        except StopIteration:
            return  # written
        except Exception as exc:
            self._spawn(self._pushing(_raising(exc)))
            return
        self._spawn(self._pushing(_resumed(pushing, suspended_on)))

    async def _pushing(self, pushing: Awaitable[None]) -> None:
        try:
            await pushing
        except Exception as exc:
            error = exc if isinstance(exc, errors.OpError) else errors.from_exception(exc)
            if self._push_error is None:
                self._push_error = error
            if self._on_error is not None:
                self._on_error(error)
            self.abort(error)


async def _raising(exc: Exception) -> None:
    raise exc


@types.coroutine
def _resumed(coro: Coroutine[Any, Any, T], suspended_on: Any) -> Generator[Any, Any, T]:
    """The rest of ``coro``, which was run by hand until it suspended on
    ``suspended_on`` (what it awaits), as an awaitable a task can go on with: what
    awaiting ``coro`` would have done from there on, cancellation included."""
    while True:
        try:
            sent = yield suspended_on
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:  # thrown in by the task (its cancellation)
            try:
                suspended_on = coro.throw(exc)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            continue
        try:
            suspended_on = coro.send(sent)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


def _forward(waiter: Waiter, fut: asyncio.Future[Item]) -> None:
    """A pull ended: hand its outcome to the recv waiting for it (unless it gave up)."""
    if fut.cancelled():
        exc: BaseException | None = errors.CancelledError(None, None, "remote recv cancelled")
    else:
        exc = fut.exception()  # always retrieved, so asyncio never logs it
    if waiter.done():
        return
    if exc is not None:
        waiter.set_exception(exc)
    else:
        waiter.set_result(fut.result())
