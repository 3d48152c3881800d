"""Workload sizes and the small timing helpers every benchmark module shares."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

WORKLOADS = (
    "chain",
    "xdev.k1",
    "xdev.k100",
    "wide",
    "tiny",
    "concurrent",
    "callable",
    "callable.nested",
    "trace",
    "trace.off",
    "overlap",
    "parallel",
    "parallel.2dev",
    "loop",
    "loop.cond",
    "queue",
    "variable",
    "cnn",
    "scale",
    "scale.cond",
    "opt.fold",
    "opt.cse",
    "opt.call",
    "service",
)


@dataclass(frozen=True, slots=True)
class Sizes:
    """How big each workload is and how often it is repeated (best of ``repeats``)."""

    chain_n: int = 10_000  # scalar adds in the chain
    wide_n: int = 10_000  # independent scalar adds reduced by add_n
    tiny_calls: int = 2_000  # session.run calls per timed repeat
    tiny_sync_calls: int = 300  # run_sync / asyncio.run calls per timed repeat
    concurrent_runs: int = 1_000  # tiny runs gathered at once (the concurrent workload)
    concurrent_batches: int = 5  # such gathers per timed repeat
    tf_callable_calls: int = 500  # TF's make_callable / session.run calls per repeat
    overlap_layers: int = 10
    overlap_width: int = 100
    overlap_sleep: float = 0.01  # seconds each async kernel sleeps
    matmul_dim: int = 512
    matmul_chain: int = 8  # matmuls per chain (two independent chains)
    scale_n: int = 100_000  # nodes in the scale workload's chain
    tf_scale_n: int = 100_000  # the same for TensorFlow (its build is ~35x slower)
    scale_repeats: int = 3  # fresh subprocesses per engine (TF's takes ~25 s each)
    loop_n: int = 100_000  # iterations of the while_loop workload (scalar body)
    loop_cond_n: int = 25_000  # iterations of the while_loop with an af.cond in its body
    loop_parallel_iterations: int = 10  # the while_loops' parallel_iterations (TF: same)
    queue_n: int = 20_000  # elements moved through the FIFOQueue, one per enqueue step
    queue_capacity: int = 100
    queue_producers: int = 4  # asyncio tasks (TF: threads) running enqueue steps
    queue_consumers: int = 4  # asyncio tasks (TF: threads) running dequeue steps
    variable_n: int = 50_000  # assign_add steps in all
    variable_tasks: int = 100  # concurrent asyncio tasks running them
    tf_variable_threads: int = 8  # TF's anchor: threads running the assign_add steps
    cnn_batch: int = 32  # images per step of the small-CNN workload
    cnn_image: int = 32  # their height and width (NHWC, 3 channels)
    state_repeats: int = 3  # best-of-N for queue / variable (TF's steps are slow)
    fold_n: int = 2_000  # constant subexpressions in the folding workload
    cse_n: int = 3_000  # ops in the CSE workload (30 % of them duplicates)
    call_n: int = 1_000  # chained function calls
    # HTTP requests per endpoint per repeat (~0.7 s of load at ~14k requests/s).
    service_requests: int = 10_000
    service_concurrency: int = 50  # requests in flight
    service_sleep: float = 0.001  # seconds the endpoints' async kernel sleeps (I/O)
    service_census_requests: int = 200  # requests per endpoint whose bytecodes are counted
    # Repeats per endpoint, alternating endpoints (a median of 3 swung by more than
    # the target's margin from run to run).
    service_repeats: int = 5
    repeats: int = 5  # best-of-N for the microbenchmarks
    slow_repeats: int = 5  # best-of-N for overlap / parallel / Dask

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Sizes:
        return cls(**data)


FULL = Sizes()
QUICK = Sizes(
    chain_n=500,
    wide_n=500,
    tiny_calls=200,
    tiny_sync_calls=20,
    tf_callable_calls=50,
    overlap_layers=3,
    overlap_width=20,
    overlap_sleep=0.01,
    matmul_dim=128,
    matmul_chain=3,
    scale_n=2_000,
    tf_scale_n=2_000,
    scale_repeats=2,
    concurrent_batches=1,
    service_requests=200,
    service_concurrency=20,
    service_repeats=1,
    service_census_requests=20,
    loop_n=2_000,
    loop_cond_n=1_000,
    queue_n=1_000,
    variable_n=2_000,
    cnn_batch=2,
    cnn_image=16,
    state_repeats=1,
    fold_n=100,
    cse_n=150,
    call_n=50,
    repeats=2,
    slow_repeats=1,
)


_CLOCK: list[Callable[[], float]] = [time.perf_counter]


def clock() -> float:
    """The clock the in-process workloads time their repeats with: wall time
    (``time.perf_counter``), unless :func:`using_clock` chose another."""
    return _CLOCK[0]()


@contextlib.contextmanager
def using_clock(fn: Callable[[], float]) -> Iterator[None]:
    """Time the in-process workloads with ``fn`` inside the block: the regression
    guard uses ``time.process_time`` (its rows run on one thread), which a busy
    neighbour taking the core away does not advance."""
    _CLOCK.insert(0, fn)
    try:
        yield
    finally:
        _CLOCK.pop(0)


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call of ``fn`` takes (after a collection, so garbage left by the
    previous repeat is not charged to this one)."""
    gc.collect()
    start = clock()
    fn()
    return clock() - start
