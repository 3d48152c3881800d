"""Progress events of a step (``RunOptions(progress=callback)``); see
:mod:`asyncflow.runtime.progress` for how they are counted."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ProgressEvent"]


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    """Where a step is: what ``RunOptions(progress=callback)`` receives.

    * ``nodes_done`` — kernels that have finished (each loop iteration counts).
    * ``nodes_total`` — kernels of the step's plans; None when it runs loops.
    * ``running`` — ``(node name, seconds running)`` of the async and worker-thread
      kernels running now, longest first.
    * ``elapsed`` — seconds since the step started.
    * ``finished`` — the last event of the step (sent whether it succeeded or not).
    """

    nodes_done: int
    nodes_total: int | None
    running: tuple[tuple[str, float], ...]
    elapsed: float
    finished: bool = False

    @property
    def longest(self) -> tuple[str, float] | None:
        """The node running longest now, with its seconds, or None."""
        return self.running[0] if self.running else None
