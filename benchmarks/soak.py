"""Soak: ``python -m benchmarks.soak [--steps N] [--in-flight K] [--seed S]
[--cancel-fraction F]``.

Runs N steps (default 100,000) with K (default 500) in flight on one session: a mix
of counter increments behind an async kernel, queue producers and consumers, a
``cond`` and inline math, under random deadlines (``timeout_in_ms``) and random
caller cancellations (``asyncio.wait_for`` around ``run``).  Prints steps/s, the
outcome counts and the resident set size sampled as the run goes, then checks:

- RSS flat: after a warm-up tenth of the steps, every sample is within 10 % of the
  first one;
- no hang: every step ends within its guard (10 s); a step that does not is a hang;
- nothing lost: the counter equals the successful increments (plus at most the
  caller-cancelled ones), and the queue conserves elements (enqueued by successful
  producers = dequeued by successful consumers + still queued + at most one per
  consumer cancelled by its caller, who may cancel after the dequeue returned).

Exit status 1 when a check fails.  Not part of the CI run (it takes ~a minute).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import sys
import time
from collections import Counter
from typing import Any

import numpy as np

import asyncflow as af

GUARD_S = 10.0


def rss_mb() -> float:
    """The current resident set size (not the peak), from /proc."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def build() -> tuple[af.Graph, dict[str, Any]]:
    g = af.Graph()

    async def nap(v: Any) -> Any:
        await asyncio.sleep(random.choice((0.0, 0.0, 0.0005, 0.001)))
        return v

    with g.as_default():
        counter = af.Variable(0, name="counter")
        one = af.reshape(af.py_func(nap, [af.constant(1)], af.int32, name="nap"), [])
        bump = counter.assign_add(one)
        q = af.FIFOQueue(100_000, af.int32, shapes=[()], name="q")
        item = af.placeholder(af.int32, shape=(), name="item")
        x = af.placeholder(af.float32, shape=(16,), name="x")
        math = af.reduce_sum(
            af.cond(af.reduce_sum(x) > 0, lambda: af.nn.relu(x) * 2.0, lambda: af.tanh(x))
        )
    ops = {
        "bump": bump,
        "put": q.enqueue(item),
        "take": q.dequeue(),
        "size": q.size(),
        "counter": counter,
        "init": counter.initializer,
        "item": item,
        "x": x,
        "math": math,
    }
    return g, ops


class Soak:
    def __init__(
        self, steps: int, in_flight: int, seed: int, cancel_fraction: float = 0.05
    ) -> None:
        self.steps = steps
        self.cancel_fraction = cancel_fraction
        self.in_flight = in_flight
        self.rng = random.Random(seed)
        self.next_step = 0
        self.outcomes: Counter[str] = Counter()
        self.bumped = 0
        self.bump_cancelled = 0
        self.enqueued: list[int] = []
        self.dequeued: list[int] = []
        self.take_cancelled = 0
        self.hangs = 0
        self.rss: list[tuple[int, float]] = []

    async def one_step(self, sess: af.Session, ops: dict[str, Any], i: int) -> None:
        rng = self.rng
        kind = rng.choices(("bump", "put", "take", "math"), (3, 2, 2, 3))[0]
        fate = rng.random()
        options = af.RunOptions(timeout_in_ms=rng.choice((1, 2, 5))) if fate < 0.1 else None
        cancel_after = rng.uniform(0.0, 0.003) if 0.1 <= fate < 0.1 + self.cancel_fraction else None
        if kind == "take" and options is None:
            options = af.RunOptions(timeout_in_ms=50)  # the queue may be empty
        feeds: dict[Any, Any] = {}
        fetch = ops[kind]
        if kind == "put":
            feeds = {ops["item"]: i}
        elif kind == "math":
            feeds = {ops["x"]: np.full(16, rng.uniform(-1, 1), np.float32)}
        coro = sess.run(fetch, feeds, options=options)
        try:
            if cancel_after is not None:
                result = await asyncio.wait_for(coro, cancel_after)
            else:
                result = await asyncio.wait_for(coro, GUARD_S)
        except TimeoutError as exc:
            if cancel_after is None and not isinstance(exc, af.errors.DeadlineExceededError):
                self.hangs += 1
                self.outcomes["hang"] += 1
                return
            self.outcomes[
                "deadline" if isinstance(exc, af.errors.DeadlineExceededError) else "cancelled"
            ] += 1
            self.bump_cancelled += kind == "bump" and cancel_after is not None
            self.take_cancelled += kind == "take" and cancel_after is not None
            return
        except af.errors.OpError as exc:
            self.outcomes[type(exc).__name__] += 1
            return
        self.outcomes["ok"] += 1
        if kind == "bump":
            self.bumped += 1
        elif kind == "put":
            self.enqueued.append(i)
        elif kind == "take":
            self.dequeued.append(int(result))

    async def worker(self, sess: af.Session, ops: dict[str, Any]) -> None:
        while self.next_step < self.steps:
            i = self.next_step
            self.next_step += 1
            await self.one_step(sess, ops, i)
            if i % max(self.steps // 20, 1) == 0 and i:
                gc.collect()
                self.rss.append((i, rss_mb()))

    async def run(self) -> dict[str, Any]:
        g, ops = build()
        async with af.Session(graph=g) as sess:
            await sess.run(ops["init"])
            start = time.perf_counter()
            async with asyncio.TaskGroup() as tg:
                for _ in range(self.in_flight):
                    tg.create_task(self.worker(sess, ops))
            elapsed = time.perf_counter() - start
            remaining = [
                int(await sess.run(ops["take"])) for _ in range(int(await sess.run(ops["size"])))
            ]
            counter = int(await sess.run(ops["counter"]))
        gc.collect()
        self.rss.append((self.steps, rss_mb()))
        return {"elapsed": elapsed, "remaining": remaining, "counter": counter}

    def report(self, result: dict[str, Any]) -> bool:
        elapsed = result["elapsed"]
        print(
            f"soak: {self.steps} steps, {self.in_flight} in flight, {elapsed:.1f} s, "
            f"{self.steps / elapsed:,.0f} steps/s"
        )
        print("outcomes: " + ", ".join(f"{k}={v}" for k, v in sorted(self.outcomes.items())))
        warm = [(i, r) for i, r in self.rss if i >= self.steps // 10]
        base = warm[0][1] if warm else float("nan")
        print("rss MB: " + " ".join(f"{i / 1000:g}k:{r:.1f}" for i, r in self.rss))
        drift = max(abs(r - base) / base for _, r in warm) if warm else float("nan")
        checks = {
            "rss flat within 10%": bool(warm) and drift <= 0.10,
            "no hangs": self.hangs == 0,
            "counter = successful increments (+ caller-cancelled)": self.bumped
            <= result["counter"]
            <= self.bumped + self.bump_cancelled,
        }
        seen = self.dequeued + result["remaining"]
        lost = set(self.enqueued) - set(seen)
        checks["queue: nothing twice"] = len(seen) == len(set(seen))
        # Deadlines lose nothing (a dequeue that delivered finishes its step); a caller
        # who cancels after the dequeue returned consumed that element (documented).
        checks["queue: lost <= caller-cancelled consumers"] = len(lost) <= self.take_cancelled
        print(
            f"rss drift after warm-up: {100 * drift:.1f}%  counter={result['counter']} "
            f"bumped={self.bumped}  enqueued={len(self.enqueued)} "
            f"dequeued={len(self.dequeued)} remaining={len(result['remaining'])} "
            f"lost={len(lost)} (caller-cancelled consumers {self.take_cancelled})"
        )
        for name, ok in checks.items():
            print(f"  {'ok ' if ok else 'FAIL'} {name}")
        return all(checks.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--in-flight", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cancel-fraction",
        type=float,
        default=0.05,
        help="fraction of steps cancelled by their caller (default 0.05; "
        "0.1 more get a 1-5 ms deadline)",
    )
    args = parser.parse_args(argv)
    random.seed(args.seed)
    soak = Soak(args.steps, args.in_flight, args.seed, args.cancel_fraction)
    result = asyncio.run(soak.run())
    return 0 if soak.report(result) else 1


if __name__ == "__main__":
    sys.exit(main())
