"""The environment kernels run in: numpy quiet, a worker thread in the step's context."""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from asyncflow import errors

__all__ = [
    "call_in_thread",
    "quiet_numpy",
    "quiet_numpy_held",
    "restore_numpy",
    "restore_numpy_held",
]

# Kernels run with numpy's floating-point warnings off (TF does not warn either).
# np.errstate(all="ignore") costs ~1 us per step on a ~6 us tiny run, most of it
# building the same error object each time: set numpy's context variable to one
# prebuilt object instead, when this numpy has it (numpy >= 2), else use errstate.
try:
    from numpy._core._ufunc_config import (  # type: ignore[attr-defined]
        _extobj_contextvar,
        _make_extobj,
    )

    _QUIET = _make_extobj(all="ignore")

    # The context variable's own methods, not functions around them: no Python call
    # per step for either (a tiny run makes ~40 calls, each one counts).
    #: ``quiet_numpy()``: numpy quiet from now on; returns the token ``restore_numpy`` takes.
    quiet_numpy: Callable[[], Any] = functools.partial(_extobj_contextvar.set, _QUIET)
    #: ``restore_numpy(token)``: numpy's error state as before ``quiet_numpy``.
    restore_numpy: Callable[[Any], None] = _extobj_contextvar.reset

    # Across awaits (a step waiting for I/O): the state before, not the context
    # variable's Token, is what the caller keeps; a Token is one more object per step
    # in flight for the cycle collector.  (~0.1 us more than a Token's set and reset:
    # not for the synchronous paths.)
    def quiet_numpy_held() -> Any:
        before = _extobj_contextvar.get()
        _extobj_contextvar.set(_QUIET)
        return before

    #: ``restore_numpy_held(before)``: numpy's error state back to ``before`` (the
    #: context variable's own ``set``, no Python call; its token is dropped at once).
    restore_numpy_held: Callable[[Any], Any] = _extobj_contextvar.set
except ImportError:  # pragma: no cover - older numpy

    def _quiet_errstate() -> Any:
        state = np.errstate(all="ignore")
        state.__enter__()
        return state

    def _restore_errstate(token: Any) -> None:
        token.__exit__(None, None, None)

    quiet_numpy = _quiet_errstate
    restore_numpy = _restore_errstate

    def quiet_numpy_held() -> Any:
        return quiet_numpy()

    def _restore_held(before: Any) -> None:
        restore_numpy(before)

    restore_numpy_held = _restore_held


def call_in_thread(ctx: contextvars.Context, kernel: Callable[..., Any], args: list[Any]) -> Any:
    """Run a kernel on a worker thread, in the step's context.

    ``StopIteration`` cannot cross into an asyncio future (it would never complete),
    so it becomes ``OutOfRangeError`` here, as TensorFlow maps it.
    """
    try:
        return ctx.run(kernel, *args)
    except StopIteration as exc:
        raise errors.OutOfRangeError(None, None, f"StopIteration: {exc}") from exc
