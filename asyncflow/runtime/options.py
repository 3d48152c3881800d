"""How the executor runs a bound plan: one frozen value, chosen when the plan is bound.

Every choice gives the same results (the differential suite runs random programs on
each and compares them with the reference interpreter); they differ in speed and in
which of the runtime's paths a step takes.  The defaults are the fastest.  A session
takes its value from ``SessionConfig(executor_options=...)``; nothing in the runtime
reads a module-level switch.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["ExecutorOptions"]


@dataclass(frozen=True, slots=True)
class ExecutorOptions:
    """How a session's steps run (all choices compute the same values).

    * ``straight_line`` — nodes that the plan-time rule
      (:func:`asyncflow.compiler.loop_schedule.runs_straight_line`) gives to the
      straight-line interpreter run there: a frame-free partition of synchronous
      kernels replays its static order, a simple loop frame runs as one tight loop.
      False: every node runs on the general pending-count propagator.
    * ``schedule_after`` — how many runs of a plan use the general propagator before
      its static order is built (0: from the first run; the first run of a large plan
      then pays for the order).
    * ``handoffs`` — the partitions of a step hand values to each other directly (a
      send drains the receiving partition on its own stack).  False: every
      cross-partition wait is an ``asyncio.Future`` completed through the event loop.
    * ``own_task_group`` — a step's async and thread kernels run in a task group of the
      step's own, which ends without another trip through the event loop when its
      tasks are done.  False: an ``asyncio.TaskGroup``.
    * ``kernel_parts`` — an async ``py_func`` runs as its function and its conversion
      (one coroutine less per node).  False: through the kernel's own coroutine.
    * ``shuffle_seed`` — for tests: None, or a seed with which the general propagator
      takes up every batch of ready nodes in a shuffled order (the same order for the
      same seed and program), exposing results that depend on an order the graph does
      not fix.  The straight-line interpreter's order is fixed at plan time.
    """

    straight_line: bool = True
    schedule_after: int = 1
    handoffs: bool = True
    own_task_group: bool = True
    kernel_parts: bool = True
    shuffle_seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("straight_line", "handoffs", "own_task_group", "kernel_parts"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise TypeError(f"ExecutorOptions.{name} must be a bool, got {value!r}")
        after = self.schedule_after
        if not isinstance(after, int) or isinstance(after, bool) or after < 0:
            raise ValueError(f"ExecutorOptions.schedule_after must be an int >= 0, "
                             f"got {after!r}")
        seed = self.shuffle_seed
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise TypeError(f"ExecutorOptions.shuffle_seed must be None or an int, "
                            f"got {seed!r}")

    def shuffler(self) -> random.Random | None:
        """A fresh generator for one step's shuffled batches (None: no shuffling)."""
        return None if self.shuffle_seed is None else random.Random(self.shuffle_seed)
