"""Building a large plan without paying the cycle collector for it.

Compiling a signature (and building a plan's static schedule) makes several objects
per node and frees none: a cycle collection pass over them in the middle is pure
cost — 30-50 % of a large first run, and ten times the cost of building a 100,000-node
schedule in a process whose heap holds the graph.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["gc_paused"]

#: Young objects a build must leave behind before they are promoted (see gc_paused).
_PROMOTE_AFTER = 50_000


@contextlib.contextmanager
def gc_paused(promote_after: int = _PROMOTE_AFTER) -> Iterator[None]:
    """No cycle collection while the block runs.

    On the way out, a block that left many young objects (a large plan) has them
    promoted to the oldest generation (``gc.freeze()`` + ``gc.unfreeze()`` moves every
    tracked object there without a collection): they live as long as the plan cache,
    and the young collection the next allocation would start finds nothing to free
    in them after scanning them all (another third of a large first run).  Not when
    the application froze objects itself: unfreezing would thaw them.
    ``promote_after`` is how many young objects make a block large (a traced step's
    stats, two objects per node kept as long as the RunMetadata, say fewer).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if gc.get_count()[0] > promote_after and gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()
