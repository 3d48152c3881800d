"""The call frame of a step: TensorFlow's ``FunctionCallFrame``.

Feeds enter a step as ``_Arg`` nodes and fetches leave it through ``_Retval``
nodes.  In a plan these are the ``arg_slots`` and ``retval_slots``: the executor
runs every ``_Arg`` node when the step starts (it writes ``frame.args[k]`` into
slot ``arg_slots[k]``) and every ``_Retval`` node when the step ends (it reads
``retval_slots[k]`` into ``frame.retvals[k]``).  They need no scheduling of their
own: an ``_Arg`` has no inputs, a ``_Retval`` no consumers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["CallFrame"]


class CallFrame:
    """Argument values in, return values out, for one step."""

    __slots__ = ("args", "retvals")

    def __init__(self, args: Sequence[Any]) -> None:
        self.args = args
        self.retvals: list[Any] | None = None

    def __repr__(self) -> str:
        n = None if self.retvals is None else len(self.retvals)
        return f"<CallFrame args={len(self.args)} retvals={n}>"
