"""The workload registry: every row (:func:`make_rows`), the function that measures each
workload (its family module: executor, devices, control_flow, concurrency, scaling,
cnn_workload, optimizer) and the rows each one fills.

Every workload function takes the :class:`~benchmarks.sizes.Sizes` and fills the
rows it owns (see :func:`make_rows`).  Anchors and asyncflow alternate repeat by
repeat so that a noisy neighbour on the shared machine hits both, and each side
reports its best repeat.  The first asyncflow run of a session (plan compilation,
thread pool start) is never part of a steady-state figure; the scale workload times
it on purpose.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable
from types import ModuleType

from benchmarks.cnn_workload import cnn
from benchmarks.common import Af
from benchmarks.concurrency import concurrent_runs, queue, service, variable
from benchmarks.control_flow import loop
from benchmarks.devices import XDEV_KS, parallel, parallel_2dev, xdev
from benchmarks.executor import callable_, chain, overlap, tiny, trace, trace_off, wide
from benchmarks.optimizer import OPT_ROWS_OF, OPT_WORKLOADS, opt_rows
from benchmarks.report import Row, Target, TfTarget
from benchmarks.scaling import scale, scale_cond
from benchmarks.sizes import Sizes

#: The targets against TensorFlow 1.x, by row: judged when TF's column is
#: filled in the same run ("no TF" otherwise).  Its targets against in-process anchors
#: (trace's slowdown, concurrent tiny runs, the service) are the rows' own targets.
TF_TARGETS: dict[str, TfTarget] = {
    "chain": TfTarget("<=", 1.0),
    "wide": TfTarget("<=", 1.5),
    "xdev.k1": TfTarget("<=", 1.0),
    "tiny.run": TfTarget(">=", 30.0, faster=True),
    "loop": TfTarget("<=", 1.0),
    "loop.cond": TfTarget("<=", 1.5),
    "queue": TfTarget(">=", 5.0),
    "scale.build": TfTarget(">=", 50.0, faster=True),
    "scale.first_run": TfTarget(">=", 8.0, faster=True),
}


def make_rows(s: Sizes) -> dict[str, Row]:
    """Every row of the table, keyed by id, before anything is measured."""
    rows = [
        Row(
            "chain",
            f"{s.chain_n:,} chained adds",
            "us/node",
            "np.add loop over np.float32 scalars (the numpy floor)",
            Target("<=", 2.0, relative=True),
        ),
        *(
            Row(
                f"xdev.k{k}",
                f"{s.chain_n:,} adds, 2dev, k={k}",
                "us/op",
                f"the same chain on one device, us/op, interleaved with the 2-device "
                f"runs (xdev.k{k})",
            )
            for k in XDEV_KS
        ),
        Row(
            "wide",
            f"{s.wide_n:,} adds + add_n",
            "us/node",
            "list of np.add on np.float32 scalars + np.sum",
            Target("<=", 2.5),
        ),
        Row(
            "tiny.run",
            "await sess.run (3 ops)",
            "us/run",
            "await of a coroutine doing the same numpy ops",
            Target("<=", 20.0),
        ),
        Row(
            "concurrent",
            f"gather of {s.concurrent_runs:,} tiny runs",
            "runs/s",
            f"asyncio.gather of {s.concurrent_runs:,} coroutines doing the same numpy ops",
            Target(">=", 0.5, relative=True),
            better="higher",
        ),
        Row(
            "tiny.run_sync", "sess.run_sync (3 ops)", "us/run", "asyncio.run of an empty coroutine"
        ),
        Row(
            "tiny.run_sync.async",
            "run_sync, 1 async py_func",
            "us/run",
            "asyncio.run(sess.run(...)) of the same graph (a fresh loop per call)",
            Target("<=", 1 / 3, relative=True),
        ),
        Row(
            "callable",
            "make_callable (3 ops)",
            "us/call",
            "await sess.run of the same graph, fetch and feed (tiny.run's call)",
        ),
        Row(
            "callable.nested",
            "nested fetches, 2 feeds",
            "us/call",
            "await sess.run of the same nested fetches and 2-entry feed_dict",
        ),
        Row(
            "trace",
            f"{s.chain_n:,} adds, FULL_TRACE",
            "us/node",
            "the same chain untraced (sess.run(y, feed)), same session",
            Target("<=", 4.0, relative=True),
        ),
        Row(
            "trace.off",
            f"{s.chain_n:,} adds, trace off",
            "us/node",
            "sess.run(y, feed) without options / run_metadata, same session",
        ),
        Row(
            "overlap",
            f"{s.overlap_layers}x{s.overlap_width} async kernels",
            "total/cp",
            "asyncio.gather of each layer's coroutines, layer after layer",
            Target("<=", 1.1, anchor_must_meet=True),
        ),
        Row(
            "parallel",
            f"2x{s.matmul_chain} matmul {s.matmul_dim}^2",
            "speedup",
            "the two chains on a 2-thread executor vs one after the other",
            Target(">=", 1.6, anchor_must_meet=True),
            better="higher",
        ),
        Row(
            "parallel.2dev",
            f"2x{s.matmul_chain} matmul, 2dev x 1thr",
            "speedup",
            "the two chains on a 2-thread executor vs one after the other",
            better="higher",
        ),
        Row(
            "loop",
            f"{s.loop_n:,}-iter while_loop",
            "us/iter",
            "Python while loop: np.less, np.add on np.int32 / np.float32 scalars",
        ),
        Row(
            "loop.cond",
            f"{s.loop_cond_n:,} iters, cond body",
            "us/iter",
            "the same Python loop with np.mod, np.equal and an if/else add/subtract",
        ),
        Row(
            "queue",
            f"{s.queue_n:,} el, {s.queue_producers}+{s.queue_consumers} tasks",
            "el/s",
            f"asyncio.Queue({s.queue_capacity}), the same producer / consumer tasks",
            better="higher",
        ),
        Row(
            "variable",
            f"assign_add, {s.variable_tasks} tasks",
            "steps/s",
            f"{s.variable_tasks} tasks: int += 1, then await asyncio.sleep(0)",
            better="higher",
        ),
        Row(
            "cnn",
            f"CNN, {s.cnn_batch}x{s.cnn_image}x{s.cnn_image}x3",
            "ms/batch",
            "numpy calls of the same layers (the kernels without the runtime)",
        ),
        Row("scale.build", f"build {s.scale_n:,} nodes", "us/node", "", Target("<=", 10.0)),
        Row(
            "scale.first_run",
            "first run (compiles)",
            "us/node",
            "np.add loop (numpy floor) at the same length",
            Target("<=", 20.0),
        ),
        Row(
            "scale.second_run",
            "second run (cached)",
            "us/node",
            "np.add loop (numpy floor) at the same length",
        ),
        Row("scale.peak_rss", "peak RSS - RSS after imports", "MB", "", Target("<=", 400.0)),
        Row(
            "scale.cond.second_run",
            f"{s.scale_n:,} chain + one cond, run",
            "us/node",
            "the same chain without the cond (its own subprocess)",
            Target("<=", 1.2, relative=True),
        ),
        Row(
            "scale.cond.peak_rss",
            f"{s.scale_n:,} chain + one cond, RSS",
            "MB",
            "the same chain without the cond (peak RSS)",
            Target("<=", 1.2, relative=True),
        ),
        *opt_rows(s),
        Row(
            "service.cpu",
            f"ASGI, c={s.service_concurrency}, sess.run",
            "us/req",
            "the same app's asyncio.gather endpoint (same coroutines)",
            Target("<=", 1.1, relative=True, median=True),
        ),
        Row(
            "service.p50",
            "ASGI, p50 latency",
            "ms",
            "the same app's asyncio.gather endpoint (same coroutines)",
        ),
        Row(
            "service.p99",
            "ASGI, p99 latency",
            "ms",
            "the same app's asyncio.gather endpoint (same coroutines)",
            Target("<=", 1.5, relative=True),
        ),
        Row(
            "service.ops",
            "ASGI bytecodes, no HTTP",
            "ops/req",
            "the same app's asyncio.gather endpoint, counted the same way",
        ),
    ]
    for row in rows:
        row.tf_target = TF_TARGETS.get(row.id)
    return {r.id: r for r in rows}


WORKLOAD_FUNCS: dict[str, Callable[[Af, Sizes, dict[str, Row]], None]] = {
    "chain": chain,
    **{f"xdev.k{k}": xdev(k) for k in XDEV_KS},
    "wide": wide,
    "tiny": tiny,
    "concurrent": concurrent_runs,
    "callable": callable_(nested=False),
    "callable.nested": callable_(nested=True),
    "trace": trace,
    "trace.off": trace_off,
    "overlap": overlap,
    "parallel": parallel,
    "parallel.2dev": parallel_2dev,
    "loop": loop(with_cond=False),
    "loop.cond": loop(with_cond=True),
    "queue": queue,
    "variable": variable,
    "cnn": cnn,
    "scale": scale,
    "scale.cond": scale_cond,
    **OPT_WORKLOADS,
    "service": service,
}

ROWS_OF: dict[str, tuple[str, ...]] = {
    "chain": ("chain",),
    **{f"xdev.k{k}": (f"xdev.k{k}",) for k in XDEV_KS},
    "wide": ("wide",),
    "tiny": ("tiny.run", "tiny.run_sync", "tiny.run_sync.async"),
    "concurrent": ("concurrent",),
    "callable": ("callable",),
    "callable.nested": ("callable.nested",),
    "trace": ("trace",),
    "trace.off": ("trace.off",),
    "overlap": ("overlap",),
    "parallel": ("parallel",),
    "parallel.2dev": ("parallel.2dev",),
    "loop": ("loop",),
    "loop.cond": ("loop.cond",),
    "queue": ("queue",),
    "variable": ("variable",),
    "cnn": ("cnn",),
    "scale": ("scale.build", "scale.first_run", "scale.second_run", "scale.peak_rss"),
    "scale.cond": ("scale.cond.second_run", "scale.cond.peak_rss"),
    **OPT_ROWS_OF,
    "service": ("service.cpu", "service.p50", "service.p99", "service.ops"),
}


def progress(msg: str) -> None:
    print(f"[benchmarks] {msg}", file=sys.stderr, flush=True)


def run_ours(names: list[str], sizes: Sizes, rows: dict[str, Row], with_tf: bool = False) -> bool:
    """Measure asyncflow and the in-process anchors; False if a workload crashed.
    With ``with_tf`` the scale workload alternates TF's subprocesses with its own."""
    ok = True
    af: ModuleType | None
    try:
        import asyncflow as af
    except Exception as exc:  # every row reports it; the table is still printed
        af, import_error = None, f"import asyncflow failed: {type(exc).__name__}: {exc}"
    for name in names:
        start = time.perf_counter()
        progress(f"{name} ...")
        try:
            if af is None:
                raise RuntimeError(import_error)
            if name == "scale":
                scale(af, sizes, rows, with_tf=with_tf)
            else:
                WORKLOAD_FUNCS[name](af, sizes, rows)
        except Exception as exc:
            ok = False
            for row_id in ROWS_OF[name]:
                rows[row_id].error = f"{type(exc).__name__}: {exc}"
            progress(f"{name} FAILED:\n{traceback.format_exc()}")
        progress(f"{name} done in {time.perf_counter() - start:.1f} s")
    return ok
