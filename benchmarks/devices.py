"""The device family: chains that cross devices every k nodes (``xdev``) and independent
matmul chains on one or two devices against plain threads (``parallel``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import gc
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from benchmarks.common import (
    Af,
    atimed,
    chain_graph,
    check,
)
from benchmarks.report import Row
from benchmarks.sizes import Sizes

#: The xdev workloads' chains change device every k nodes (one row per k).
XDEV_KS = (1, 100)


# --------------------------------------------------------------------------- xdev


def _xdev_chain_graph(af: Af, n: int, k: int) -> tuple[Any, Any, Any, int]:
    """The chain workload's graph on two devices, switching device every ``k`` adds.

    Each device has its own constant ``one``, and the placeholder is fed to the
    first add, on /cpu:0 with the client (as TF places feeds and fetches), so the
    cross-device edges are the chain's own device changes, and the fetch's way back
    to /cpu:0 when the chain ends on /cpu:1 (one more, as in TF's partition graphs):
    returned as the 4th item.
    """
    g = af.Graph()
    with g.as_default():
        x0 = af.placeholder(af.float32, shape=(), name="x")
        ones = []
        for d in range(2):
            with af.device(f"/cpu:{d}"):
                ones.append(af.constant(np.float32(1.0), name=f"one{d}"))
        x = x0
        for i in range(n):
            d = (i // k) % 2
            with af.device(f"/cpu:{d}"):
                x = x + ones[d]
    edges = sum(1 for i in range(1, n) if (i // k) % 2 != ((i - 1) // k) % 2)
    return g, x0, x, edges + ((n - 1) // k) % 2


async def _send_ops(af: Af, sess: Any, fetch: Any, feed: dict[Any, Any]) -> int:
    """How many ``_Send`` ops the run's partition graphs hold (its cross-device edges)."""
    md = af.RunMetadata()
    await sess.run(
        fetch, feed_dict=feed, options=af.RunOptions(output_partition_graphs=True), run_metadata=md
    )
    return sum(node["op"] == "_Send" for pg in md.partition_graphs for node in pg["node"])


def xdev(k: int) -> Callable[[Af, Sizes, dict[str, Row]], None]:
    """The ``xdev.k{k}`` workload: the scalar chain switching device every ``k`` adds,
    in us per op, beside the same chain on one device.

    The two chains run interleaved, repeat by repeat in one event loop, so a noisy
    neighbour hits both; each figure is the best repeat (medians in the notes).  The
    cost of one edge is derived in a note only, from the paired repeats: it is a
    difference of two timings and never the row's figure.
    """

    def workload(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
        n = s.chain_n
        g1, x1, y1 = chain_graph(af, n)
        g2, x2, y2, edges = _xdev_chain_graph(af, n, k)
        two = af.SessionConfig(device_count={"CPU": 2})

        async def main() -> tuple[list[float], list[float]]:
            async with af.Session(graph=g1) as one_dev, af.Session(graph=g2, config=two) as two_dev:
                for sess, x, y in ((one_dev, x1, y1), (two_dev, x2, y2)):
                    value = await sess.run(y, feed_dict={x: 0.0})
                    check(value == n, f"xdev chain computed {value!r}, expected {n}")
                sends = await _send_ops(af, two_dev, y2, {x2: 0.0})
                check(
                    sends == edges,
                    f"the 2-device chain has {sends} _Send ops, "
                    f"expected {edges} cross-device edges",
                )
                two_times, one_times = [], []
                for _ in range(s.repeats):
                    one_times.append(await atimed(lambda: one_dev.run(y1, feed_dict={x1: 0.0})))
                    two_times.append(await atimed(lambda: two_dev.run(y2, feed_dict={x2: 0.0})))
                return two_times, one_times

        two_times, one_times = asyncio.run(main())
        row = rows[f"xdev.k{k}"]
        row.ours, row.anchor = min(two_times) / n * 1e6, min(one_times) / n * 1e6
        row.notes.append(xdev_note(n, edges, two_times, one_times))

    workload.__name__ = f"xdev_k{k}"
    return workload


def xdev_note(
    n: int, edges: int, two_times: list[float], one_times: list[float], who: str = ""
) -> str:
    """The xdev row's note: medians, and the per-edge cost derived from paired repeats
    (shared with TF's anchor, which is measured the same way)."""
    from statistics import median

    per_edge = median(t2 - t1 for t2, t1 in zip(two_times, one_times, strict=True))
    return (
        f"{who}median {median(two_times) / n * 1e6:.2f} us/op on 2 devices, "
        f"{median(one_times) / n * 1e6:.2f} on 1 device (best "
        f"{min(two_times) / n * 1e6:.2f} / {min(one_times) / n * 1e6:.2f}); derived: "
        f"{per_edge / max(edges, 1) * 1e6:.2f} us per send/recv edge (median over the "
        f"{len(two_times)} paired repeats of (2-device run - 1-device run) / {edges:,} "
        f"edges)"
    )


# --------------------------------------------------------------------------- parallel


def _matmul(a: Any, w: Any) -> Any:
    return np.matmul(a, w)


def _matmul_operands(d: int) -> tuple[Any, Any]:
    rng = np.random.default_rng(0)
    w_val = (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32)
    a_val = rng.standard_normal((d, d)).astype(np.float32)
    return w_val, a_val


def _matmul_graph(af: Af, w_val: Any, k: int, two_devices: bool) -> tuple[Any, Any, list[Any]]:
    """(graph, placeholder a, heads) of two independent chains of ``k`` expensive
    matmuls; with ``two_devices`` chain c (and its own copy of w) is on /cpu:c."""
    d = w_val.shape[0]
    g = af.Graph()
    with g.as_default():
        a = af.placeholder(af.float32, shape=(d, d), name="a")
        w = None if two_devices else af.constant(w_val, name="w")
        heads = []
        for c in range(2):
            with af.device(f"/cpu:{c}") if two_devices else contextlib.nullcontext():
                wc = af.constant(w_val, name=f"w{c}") if w is None else w
                h = a
                for _ in range(k):
                    h = af.py_func(_matmul, [h, wc], af.float32, expensive=True)
                heads.append(h)
    return g, a, heads


class _CoresTimer:
    """Wall times per key and, for each key's best repeat, the cores the process got
    (process CPU seconds per wall second).  Below ~1.6 with two threads means a busy
    machine (or a serialised executor, if the plain-threads anchor did get two cores)."""

    def __init__(self, *keys: str) -> None:
        self.times: dict[str, list[float]] = {key: [] for key in keys}
        self.cores: dict[str, float] = {}

    def _note(self, key: str, wall: float, cpu: float) -> None:
        if wall <= min(self.times[key], default=float("inf")):
            self.cores[key] = cpu / wall
        self.times[key].append(wall)

    def run(self, key: str, fn: Callable[[], object]) -> None:
        gc.collect()
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        self._note(key, time.perf_counter() - t0, time.process_time() - c0)

    async def arun(self, key: str, fn: Callable[[], Awaitable[object]]) -> None:
        gc.collect()
        c0, t0 = time.process_time(), time.perf_counter()
        await fn()
        self._note(key, time.perf_counter() - t0, time.process_time() - c0)

    def best(self) -> dict[str, float]:
        return {key: min(v) for key, v in self.times.items()}

    def median(self) -> dict[str, float]:
        return {key: statistics.median(v) for key, v in self.times.items()}


def _record_speedups(
    row: Row, timer: _CoresTimer, ours: tuple[str, str], anchor: tuple[str, str]
) -> None:
    """A speedup row: the best time of ``ours[0]`` over the best of ``ours[1]`` (the
    anchor likewise), and the same ratio of the medians."""
    best, median = timer.best(), timer.median()
    row.ours, row.ours_median = best[ours[0]] / best[ours[1]], median[ours[0]] / median[ours[1]]
    row.anchor = best[anchor[0]] / best[anchor[1]]
    row.anchor_median = median[anchor[0]] / median[anchor[1]]
    row.repeats = len(timer.times[ours[0]])


def _plain_chains(
    w_val: Any, a_val: Any, k: int, pool: concurrent.futures.ThreadPoolExecutor
) -> dict[str, Callable[[], object]]:
    """The numpy anchor: both chains one after the other, and on two threads."""

    def plain_chain() -> Any:
        h = a_val
        for _ in range(k):
            h = _matmul(h, w_val)
        return h

    def plain_serial() -> None:
        plain_chain()
        plain_chain()

    def plain_threads() -> None:
        for f in [pool.submit(plain_chain), pool.submit(plain_chain)]:
            f.result()

    return {"chain": plain_chain, "serial": plain_serial, "threads": plain_threads}


async def _time_sessions(
    timer: _CoresTimer,
    sessions: dict[str, Any],
    plain: dict[str, Any],
    heads: dict[str, tuple[Any, Any]],
    a_val: Any,
    repeats: int,
) -> None:
    """Check every session's result, then alternate the anchor and the sessions
    repeat by repeat.  ``heads`` maps a session's key to its (placeholder, fetches)."""
    expected = plain["chain"]()
    for key, sess in sessions.items():
        a, fetches = heads[key]
        out = await sess.run(fetches, feed_dict={a: a_val})
        check(
            all(np.allclose(o, expected, rtol=1e-4, atol=1e-4) for o in out),
            f"parallel graph ({key}) computed a wrong product",
        )
    plain["threads"]()
    for _ in range(repeats):
        timer.run("serial", plain["serial"])
        timer.run("threads", plain["threads"])
        for key, sess in sessions.items():
            a, fetches = heads[key]
            await timer.arun(key, functools.partial(sess.run, fetches, feed_dict={a: a_val}))


def parallel(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    k = s.matmul_chain
    w_val, a_val = _matmul_operands(s.matmul_dim)
    g, a, heads = _matmul_graph(af, w_val, k, two_devices=False)
    timer = _CoresTimer("1", "2", "0", "serial", "threads")
    pool = concurrent.futures.ThreadPoolExecutor(2)

    async def main() -> None:
        configs = {
            key: af.SessionConfig(inter_op_parallelism_threads=int(key)) for key in ("1", "2", "0")
        }
        async with (
            af.Session(graph=g, config=configs["1"]) as s1,
            af.Session(graph=g, config=configs["2"]) as s2,
            af.Session(graph=g, config=configs["0"]) as s0,
        ):
            sessions = {"1": s1, "2": s2, "0": s0}
            await _time_sessions(
                timer,
                sessions,
                _plain_chains(w_val, a_val, k, pool),
                dict.fromkeys(sessions, (a, heads)),
                a_val,
                s.slow_repeats,
            )

    try:
        asyncio.run(main())
    finally:
        pool.shutdown()
    best, cores_used = timer.best(), timer.cores
    row = rows["parallel"]
    _record_speedups(row, timer, ("1", "2"), ("serial", "threads"))
    row.notes.append(
        f"best step: 1 thread {best['1'] * 1e3:.1f} ms, 2 threads {best['2'] * 1e3:.1f} ms, "
        f"default config (0 = one per core) {best['0'] * 1e3:.1f} ms "
        f"(speedup {best['1'] / best['0']:.2f}); plain numpy serial "
        f"{best['serial'] * 1e3:.1f} ms"
    )
    row.notes.append(
        f"cores busy (process CPU s / wall s) in those steps: asyncflow 1 thread "
        f"{cores_used['1']:.2f}, 2 threads {cores_used['2']:.2f}; plain threads "
        f"{cores_used['threads']:.2f}"
    )


def parallel_2dev(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    """The parallel workload's chains on /cpu:0 and /cpu:1, one thread per device,
    against the same graph on one device with one thread."""
    k = s.matmul_chain
    w_val, a_val = _matmul_operands(s.matmul_dim)
    g1, a1, heads1 = _matmul_graph(af, w_val, k, two_devices=False)
    g2, a2, heads2 = _matmul_graph(af, w_val, k, two_devices=True)
    timer = _CoresTimer("1dev", "2dev", "serial", "threads")
    pool = concurrent.futures.ThreadPoolExecutor(2)

    async def main() -> None:
        one = af.SessionConfig(inter_op_parallelism_threads=1)
        two = af.SessionConfig(device_count={"CPU": 2}, inter_op_parallelism_threads=1)
        async with af.Session(graph=g1, config=one) as s1, af.Session(graph=g2, config=two) as s2:
            # The feed a crosses to /cpu:1's chain and that chain's head back to the
            # client on /cpu:0, as TF places feeds and fetches.
            sends = await _send_ops(af, s2, heads2, {a2: a_val})
            check(sends == 2, f"the 2-device matmul graph has {sends} _Send ops, expected 2")
            await _time_sessions(
                timer,
                {"1dev": s1, "2dev": s2},
                _plain_chains(w_val, a_val, k, pool),
                {"1dev": (a1, heads1), "2dev": (a2, heads2)},
                a_val,
                s.slow_repeats,
            )

    try:
        asyncio.run(main())
    finally:
        pool.shutdown()
    best, cores_used = timer.best(), timer.cores
    row = rows["parallel.2dev"]
    _record_speedups(row, timer, ("1dev", "2dev"), ("serial", "threads"))
    row.notes.append(
        f"best step: 1 device x 1 thread {best['1dev'] * 1e3:.1f} ms, 2 devices x 1 thread "
        f"{best['2dev'] * 1e3:.1f} ms; plain numpy serial {best['serial'] * 1e3:.1f} ms; "
        f"no target given: >= 1.6 is what the single-device parallel target asks"
    )
    row.notes.append(
        f"cores busy (process CPU s / wall s) in those steps: asyncflow 1 device "
        f"{cores_used['1dev']:.2f}, 2 devices {cores_used['2dev']:.2f}; plain threads "
        f"{cores_used['threads']:.2f}"
    )
