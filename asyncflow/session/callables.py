"""What ``Session.make_callable`` returns: a compiled signature, called with feed values."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from asyncflow.config import RunMetadata, RunOptions

__all__ = ["SessionCallable"]


class SessionCallable:
    """``await fn(*feed_values)`` runs one step of a signature compiled once;
    ``fn.run_sync(*feed_values)`` does the same from code without a running loop
    (on the session's loop for the calling thread, as ``Session.run_sync``).

    ``options=`` and ``run_metadata=`` keywords are accepted when the callable was
    made with ``accept_options=True``.
    """

    __slots__ = ("_run", "_run_sync", "_signature")

    def __init__(
        self,
        run: Callable[..., Coroutine[Any, Any, Any]],
        run_sync: Callable[..., Any],
        signature: str = "",
    ) -> None:
        self._run = run
        self._run_sync = run_sync
        self._signature = signature

    def __call__(
        self,
        *feed_values: Any,
        options: RunOptions | None = None,
        run_metadata: RunMetadata | None = None,
    ) -> Coroutine[Any, Any, Any]:
        # The step's coroutine itself (no wrapping coroutine): await it.
        return self._run(feed_values, options, run_metadata)

    def run_sync(
        self,
        *feed_values: Any,
        options: RunOptions | None = None,
        run_metadata: RunMetadata | None = None,
    ) -> Any:
        """Call it from plain code (no event loop running in this thread)."""
        return self._run_sync(feed_values, options, run_metadata)

    def __repr__(self) -> str:
        return f"<SessionCallable {self._signature}>"
