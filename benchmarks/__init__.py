"""asyncflow's benchmark suite: ``python -m benchmarks [--quick] [--only NAME] [--json FILE]``;
``python -m benchmarks --guard`` is CI's regression guard (see :mod:`benchmarks.guard`).

Each workload of the performance model (docs/architecture.md) is measured for asyncflow and,
in the same run, for its anchors: plain numpy calls and plain asyncio (in this
process, interleaved with asyncflow's repeats), TensorFlow 1.x through
``tf.compat.v1`` and Dask's threaded scheduler (each in a subprocess of its own, and
only when importable: they are anchors, never dependencies of asyncflow).  The
``service`` workload serves an ASGI app from a child process and loads it from this
one: it needs the ``bench`` extra (``pip install -e ".[bench]"``) and is reported as
skipped without it.

Importing this package pins BLAS to one thread (unless the caller already chose a
value, or runs ``python -m benchmarks models``, see :mod:`benchmarks.models`): with a multi-threaded BLAS the single-worker baseline of the
``parallel`` workload would already use both cores and the speedup would mean nothing.
The variables only take effect if numpy has not been imported yet, which
``python -m benchmarks`` guarantees; :data:`BLAS_PINNED_BEFORE_NUMPY` records it.
"""

from __future__ import annotations

import os
import sys

BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

#: True when the BLAS thread variables were set before numpy was first imported.
BLAS_PINNED_BEFORE_NUMPY = "numpy" not in sys.modules

#: ``python -m benchmarks models`` (and its TF child) measure models as users run them,
#: BLAS threads included: asyncflow sizes the BLAS pool per kernel, TF its own pools.
MEASURES_THREADS = sys.argv[1:2] in (["models"], ["--tf-child"])

if not MEASURES_THREADS:
    for _var in BLAS_THREAD_VARS:
        os.environ.setdefault(_var, "1")
# TensorFlow's C++ logging is noise in a benchmark table.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

__all__ = ["BLAS_PINNED_BEFORE_NUMPY", "BLAS_THREAD_VARS", "MEASURES_THREADS"]
