"""Counting the objects steps keep: shared by the footprint tests."""

from __future__ import annotations

import gc
from collections import Counter

__all__ = ["tracked"]


def tracked() -> Counter[str]:
    """The GC-tracked objects now, by type name."""
    gc.collect()
    return Counter(type(o).__name__ for o in gc.get_objects())
