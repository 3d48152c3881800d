"""Step cancellation that kernels can see: TensorFlow's ``CancellationManager``.

Every step that can be interrupted has one.  A kernel gets the current step's
manager with :func:`get_cancellation_manager` (a context variable: it is visible to
inline kernels, to async kernels and to expensive kernels on worker threads alike)
and either polls ``is_cancelled`` — the way a long loop on a thread stops early — or
registers a callback.  The step cancels its manager when it fails, passes its
deadline, is cancelled by its caller or by ``Session.close()``; callbacks then run
once, on the thread that cancelled, and must be quick and thread-safe.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from asyncio import current_task
from asyncio.events import _get_running_loop
from collections.abc import Callable
from typing import Any

__all__ = ["CancellationManager", "get_cancellation_manager"]

logger = logging.getLogger("asyncflow.cancellation")

#: The step of work that runs outside a step's tasks (``asyncflow.runtime.step.
#: current_step``): set in the context a thread kernel or a hand-off callback runs in.
running_step: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "asyncflow_current_step", default=None
)

#: The step awaiting a kernel in a task, by task: an async kernel runs in its task's
#: own context, with no context variable set for it (setting one makes a new context
#: map, two more objects for the cycle collector per step in flight), and finds its
#: step here.  Set around the await, the previous entry put back after (a function
#: call's nested step awaits in its caller's task); an entry never outlives its await
#: (a task left pending on a loop that is dropped without cancelling it keeps its
#: entry, as it keeps everything else it holds).
awaiting: dict[Any, Any] = {}


def running() -> Any:
    """The step running the calling kernel, or None: the one awaiting the current
    task's kernel, else the context's (a thread kernel's, a hand-off's)."""
    if awaiting:
        loop = _get_running_loop()
        if loop is not None:
            step = awaiting.get(current_task(loop))
            if step is not None:
                return step
    return running_step.get()


#: Guards every manager's callbacks: registering and cancelling are rare and short,
#: while a manager is made for every step that awaits (no lock of its own to make).
_LOCK = threading.Lock()


class CancellationManager:
    """Cancellation of one step: a flag, plus callbacks run once when it is set."""

    __slots__ = ("_callbacks", "_cancelled", "_next")

    def __init__(self) -> None:
        self._cancelled = False
        # Made by the first registration (most steps register none).
        self._callbacks: dict[int, Callable[[], None]] | None = None
        self._next = 0  # the next registration's token

    @property
    def is_cancelled(self) -> bool:
        """True once the step is being cancelled (poll it in long-running kernels)."""
        return self._cancelled

    def register_callback(self, callback: Callable[[], None]) -> int | None:
        """Run ``callback()`` when the step is cancelled; returns a token for
        :meth:`deregister_callback`, or ``None`` (and does not run it) if the step is
        already cancelled."""
        with _LOCK:
            if self._cancelled:
                return None
            token = self._next
            self._next = token + 1
            if self._callbacks is None:
                self._callbacks = {}
            self._callbacks[token] = callback
            return token

    def deregister_callback(self, token: int | None) -> bool:
        """Forget a callback; False if it already ran (or never was registered)."""
        if token is None:
            return False
        with _LOCK:
            return self._callbacks is not None and self._callbacks.pop(token, None) is not None

    def cancel(self) -> None:
        """Set the flag and run the callbacks (once; later calls do nothing)."""
        with _LOCK:
            if self._cancelled:
                return
            self._cancelled = True
            callbacks = list(self._callbacks.values()) if self._callbacks else []
            self._callbacks = None
        for callback in callbacks:
            try:
                callback()
            except Exception:  # a callback must not break the cancellation of the rest
                logger.exception("cancellation callback %r raised", callback)

    def __repr__(self) -> str:
        return (
            f"<CancellationManager cancelled={self._cancelled} "
            f"callbacks={len(self._callbacks or ())}>"
        )


def get_cancellation_manager() -> CancellationManager | None:
    """The running step's cancellation manager (``None`` outside a kernel)."""
    step = running()
    return step.cancellation_manager() if step is not None else None
