"""Counting the objects steps keep: shared by the footprint tests."""

from __future__ import annotations

import contextvars
import gc
from collections import Counter

from asyncflow.runtime.kernel_env import quiet_numpy
from asyncflow.runtime.step import current_step

__all__ = ["context_map_objects", "tracked"]


def tracked() -> Counter[str]:
    """The GC-tracked objects now, by type name."""
    gc.collect()
    return Counter(type(o).__name__ for o in gc.get_objects())


def context_map_objects(samples: int = 400) -> int:
    """GC-tracked objects of the map of a fresh context holding what a step sets in its
    task's context (the running step, numpy's quiet error state): 2 most often, more
    when the two variables' hashes (random per process: they mix in the names' string
    hashes) collide in the map's first levels (3 of 60 hash seeds gave 3)."""

    def set_both() -> contextvars.Context:
        current_step.set(None)
        quiet_numpy()
        return contextvars.copy_context()

    before = tracked()
    kept = [contextvars.Context().run(set_both) for _ in range(samples)]
    after = tracked()
    del kept
    return round(sum(after[k] - before[k] for k in after if k.startswith("hamt")) / samples)
