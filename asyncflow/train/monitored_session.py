"""``MonitoredSession``: a session that survives its tasks restarting (TF 1.x's
``tf.compat.v1.train.MonitoredSession`` with a chief session creator, a checkpoint
saver hook and its recoverable session).

The loop, as TF's ``_RecoverableSession``::

    create:   session = session_factory(); restore the latest checkpoint of
              checkpoint_dir, or run the initializer when there is none
    run:      session.run(...); every save_steps steps save a checkpoint
    on AbortedError / UnavailableError (a task restarted, or is gone for now):
              close the session, create it again (retrying while the task is not
              back, up to recovery_timeout_s) and run the same step again

What recovery loses is what TF loses: the steps since the last checkpoint (their
variable updates are gone with the task that held them; the restored values are the
checkpoint's).  Without a ``MonitoredSession`` a restarted ``ps`` task comes back
with uninitialized variables and the caller handles the errors itself.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any

from asyncflow import errors
from asyncflow.ops.state_ops import global_variables, global_variables_initializer
from asyncflow.train.saver import Saver, latest_checkpoint

__all__ = ["MonitoredSession"]

#: The errors after which TF's recoverable session creates its session again.
RECOVERABLE = (errors.AbortedError, errors.UnavailableError)

SessionFactory = Callable[[], Any]


class MonitoredSession:
    """Runs steps on a session it recreates and restores after a task failure.

    ``session_factory()`` returns an ``af.Session`` (or an awaitable of one, e.g. one
    that connects a cluster first).  ``checkpoint_dir``: where checkpoints are saved
    (``model.ckpt-<step>``) and restored from; ``save_steps``: save every that many
    steps (and when the session closes).  ``init_op``: what a session without a
    checkpoint runs (default: every global variable's initializer).  ``saver``:
    default ``Saver`` of the graph's global variables.  Use ``async with`` and
    ``await msess.run(...)``, or ``with`` and ``msess.run_sync(...)``.
    """

    def __init__(
        self,
        session_factory: SessionFactory,
        *,
        checkpoint_dir: str | None = None,
        save_steps: int | None = None,
        init_op: Any = None,
        saver: Saver | None = None,
        recovery_timeout_s: float = 60.0,
        retry_interval_s: float = 0.25,
    ) -> None:
        if not callable(session_factory):
            raise TypeError(
                f"MonitoredSession needs a callable session_factory, got {session_factory!r}"
            )
        if save_steps is not None and (not isinstance(save_steps, int) or save_steps < 1):
            raise ValueError(f"save_steps must be an int >= 1 or None, got {save_steps!r}")
        if save_steps is not None and checkpoint_dir is None:
            raise ValueError("save_steps needs a checkpoint_dir to save into")
        self._factory = session_factory
        self.checkpoint_dir = checkpoint_dir
        self.save_steps = save_steps
        self._init_op = init_op
        self._saver = saver
        self.recovery_timeout_s = recovery_timeout_s
        self.retry_interval_s = retry_interval_s
        self._sess: Any = None
        #: Steps run (restored from the checkpoint's ``-<step>`` suffix on recovery).
        self.global_step = 0
        #: How many times the session was recreated after a task failure.
        self.recoveries = 0
        self._closed = False

    # -- creating and recovering --------------------------------------------------------

    async def _create(self) -> None:
        """A session, restored or initialized; retried while its tasks are not back."""
        deadline = time.monotonic() + self.recovery_timeout_s
        while True:
            sess = self._factory()
            if inspect.isawaitable(sess):
                sess = await sess
            try:
                await self._prepare(sess)
            except RECOVERABLE:
                await _close_quietly(sess)
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(self.retry_interval_s)
                continue
            except BaseException:
                await _close_quietly(sess)
                raise
            self._sess = sess
            return

    async def _prepare(self, sess: Any) -> None:
        path = latest_checkpoint(self.checkpoint_dir) if self.checkpoint_dir else None
        if path is None:
            init = self._init_op
            if init is None:
                with sess.graph.as_default():
                    init = global_variables_initializer()
                self._init_op = init
            await sess.run(init)
            self.global_step = 0
            return
        await self._the_saver(sess).restore(sess, path)
        match = re.search(r"-(\d+)$", path)
        self.global_step = int(match.group(1)) if match else 0

    def _the_saver(self, sess: Any) -> Saver:
        if self._saver is None:
            self._saver = Saver(global_variables(sess.graph))
        return self._saver

    async def _recover(self) -> None:
        old, self._sess = self._sess, None
        await _close_quietly(old)
        self.recoveries += 1
        await self._create()

    # -- running ---------------------------------------------------------------------------

    @property
    def session(self) -> Any:
        """The current underlying session (replaced by every recovery)."""
        if self._sess is None:
            raise RuntimeError("MonitoredSession is not open: use `async with` or `with`")
        return self._sess

    async def run(
        self, fetches: Any, feed_dict: Mapping[Any, Any] | None = None, **kwargs: Any
    ) -> Any:
        """``Session.run``, recovering from a task failure and running the step again."""
        while True:
            sess = self.session
            try:
                out = await sess.run(fetches, feed_dict, **kwargs)
            except RECOVERABLE:
                await self._recover()
                continue
            self.global_step += 1
            if self.save_steps is not None and self.global_step % self.save_steps == 0:
                await self.save()
            return out

    async def save(self) -> str:
        """Save a checkpoint of the current step into ``checkpoint_dir``; its path."""
        if self.checkpoint_dir is None:
            raise ValueError("MonitoredSession has no checkpoint_dir to save into")
        sess = self.session
        return await self._the_saver(sess).save(
            sess, os.path.join(self.checkpoint_dir, "model.ckpt"), global_step=self.global_step
        )

    async def close(self) -> None:
        """Save a last checkpoint (when saving) and close the session; idempotent."""
        if self._closed:
            return
        self._closed = True
        sess, failed = self._sess, False
        try:
            if sess is not None and self.save_steps is not None:
                try:
                    await self.save()
                except RECOVERABLE:
                    failed = True  # a task is gone: the last checkpoint stays the latest
        finally:
            self._sess = None
            if sess is not None:
                await _close_quietly(sess) if failed else await sess.close()

    async def __aenter__(self) -> MonitoredSession:
        await self._create()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- plain code --------------------------------------------------------------------

    def run_sync(
        self, fetches: Any, feed_dict: Mapping[Any, Any] | None = None, **kwargs: Any
    ) -> Any:
        """``run`` for code without an event loop."""
        return _sync(self.run(fetches, feed_dict, **kwargs))

    def __enter__(self) -> MonitoredSession:
        _sync(self._create())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _sync(self.close())

    def __repr__(self) -> str:
        return (
            f"<MonitoredSession step={self.global_step} recoveries={self.recoveries} "
            f"closed={self._closed}>"
        )


def _sync(coro: Awaitable[Any]) -> Any:
    async def run() -> Any:
        return await coro

    return asyncio.run(run())


async def _close_quietly(sess: Any) -> None:
    """Close a session whose tasks may be gone (its errors say nothing new)."""
    if sess is None:
        return
    try:
        await sess.close()
    except errors.OpError:
        pass
