"""glibc malloc's thresholds, set where asyncflow knows the process's allocation pattern.

Linux with glibc only; ``ASYNCFLOW_MALLOC_TUNING=0`` in the environment keeps glibc's
own thresholds everywhere asyncflow would set them:

* the first oneDNN convolution of a process keeps freed memory for the next step
  (:func:`asyncflow.ops.onednn.keep_freed_memory`);
* a Dask worker hosting a task maps blocks on their own only from 1 MiB and keeps
  1 MiB of free heap top (``asyncflow.distributed._dask``): Dask's nanny sets
  ``MALLOC_TRIM_THRESHOLD_`` (64 KiB) in its workers, setting any threshold freezes
  glibc's mmap threshold at 128 KiB, and msgpack's 256 KiB packing buffer was then
  mapped and unmapped, or given back and faulted in again, for every message.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["M_MMAP_THRESHOLD", "M_TRIM_THRESHOLD", "mallopt", "raise_to"]

#: glibc's ``mallopt`` parameters (malloc.h).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


#: What asyncflow set each parameter to last (a threshold is only ever raised).
_set: dict[int, int] = {}


def raise_to(param: int, value: int) -> bool:
    """``mallopt(param, value)`` unless asyncflow already set ``param`` at least as
    high; True when the threshold is now ``value`` or more."""
    if _set.get(param, -1) >= value:
        return True
    return mallopt(param, value)


def mallopt(param: int, value: int) -> bool:
    """glibc's ``mallopt(param, value)``; True when it was set (False: not glibc, or
    ``ASYNCFLOW_MALLOC_TUNING=0``)."""
    if os.environ.get("ASYNCFLOW_MALLOC_TUNING", "1") == "0" or not sys.platform.startswith(
        "linux"
    ):
        return False
    try:
        setter = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    if not setter(param, value):
        return False
    _set[param] = value
    return True
