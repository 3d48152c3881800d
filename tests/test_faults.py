"""Fault tests: random deadlines x caller cancellations x failing kernels x concurrent
steps over one queue and one variable.

Each round runs a few hundred concurrent steps of a "worker" graph

    dequeue x ─► work(x) (async or expensive; fails for some x) ─► counter.assign_add(1)

next to producer steps that enqueue with deadlines, and then checks, exactly where
the outcome is determined and by bounds where it cannot be (the documented rule:
a caller who cancels a step after its dequeue returned gets ``CancelledError`` and
those elements were consumed):

- conservation: no element is delivered twice; every element enqueued by a
  successful step is in the queue, was taken by a ``work`` kernel, or was taken by
  one of the steps that failed by deadline or cancellation before ``work`` started;
- exact counts: every successful step's ``x`` went through ``work``; the steps
  reporting the failing kernel's error are exactly the failing elements whose
  ``work`` raised (up to steps whose deadline landed after it raised); the counter
  equals the successful steps, plus at most the caller-cancelled ones whose ``work``
  had finished — never a step whose failure happened before its increment;
- no leaked asyncio tasks or asyncflow threads, and each round bounded in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import random
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import asyncflow as af

ROUND_TIMEOUT_S = 30


def _is_bad(x: int) -> bool:
    return x % 7 == 3


class _Tracker:
    """What the kernels saw, written by the kernels themselves."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: list[int] = []
        self.finished: list[int] = []
        self.failed: list[int] = []

    def note(self, where: list[int], x: int) -> None:
        with self.lock:
            where.append(x)


def _worker_graph(
    tracker: _Tracker, rng: random.Random, expensive: bool
) -> tuple[af.Graph, dict[str, Any]]:
    g = af.Graph()
    delays = [rng.choice([0.0, 0.0005, 0.002, 0.005]) for _ in range(64)]

    async def work_async(x: Any) -> Any:
        i = int(x)
        tracker.note(tracker.started, i)
        await asyncio.sleep(delays[i % 64])
        if _is_bad(i):
            tracker.note(tracker.failed, i)
            raise ValueError(f"element {i} is bad")
        tracker.note(tracker.finished, i)
        return x

    def work_sync(x: Any) -> Any:
        i = int(x)
        tracker.note(tracker.started, i)
        threading.Event().wait(delays[i % 64])
        if _is_bad(i):
            tracker.note(tracker.failed, i)
            raise ValueError(f"element {i} is bad")
        tracker.note(tracker.finished, i)
        return x

    with g.as_default():
        q = af.FIFOQueue(10_000, af.int32, shapes=[()], name="q")
        item = af.placeholder(af.int32, shape=(), name="item")
        counter = af.Variable(0, name="counter")
        x = q.dequeue()
        done = af.reshape(
            af.py_func(
                work_sync if expensive else work_async,
                [x],
                af.int32,
                expensive=expensive,
                name="work",
            ),
            [],
        )
        with af.control_dependencies([done]):
            bumped = counter.assign_add(1)
    ops = {
        "put": q.enqueue(item),
        "step": [done, bumped],
        "size": q.size(),
        "take": q.dequeue(),
        "counter": counter,
        "init": counter.initializer,
        "item": item,
    }
    return g, ops


@contextlib.contextmanager
def _old_objects_frozen() -> Iterator[None]:
    """The round's deadlines are milliseconds: keep the objects earlier tests left (a
    large heap in a full run) out of the cycle collector's scans meanwhile, so a
    collection of them does not time out the round's steps."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


async def _round(seed: int, expensive: bool, cancel_callers: bool) -> None:
    with _old_objects_frozen():
        await _round_body(seed, expensive, cancel_callers)


@dataclasses.dataclass(frozen=True)
class _Observed:
    """What a round's callers saw: the producers that enqueued, the steps that returned
    (x, count), each failure kind's count, the kernel errors, what was left queued, the
    counter at the end, and how many workers ran."""

    enqueued_ok: list[int]
    ok_steps: list[tuple[int, int]]
    outcomes: dict[str, int]
    kernel_errors: list[af.errors.OpError]
    remaining: list[int]
    counter: int
    workers: int


def _check_round(o: _Observed, tracker: _Tracker, cancel_callers: bool) -> None:
    """Conservation and exact counts: what the callers saw against what the kernels
    (``tracker``) saw."""
    started, finished, failed = tracker.started, tracker.finished, tracker.failed
    # The failing kernel's error names its node, with the kernel's message.
    assert {(e.node_name, "is bad" in e.message) for e in o.kernel_errors} <= {("work", True)}
    xs = [x for x, _ in o.ok_steps]
    counts = [c for _, c in o.ok_steps]
    # Nothing delivered twice, nothing made up.
    assert len(started) == len(set(started))
    assert not set(started) & set(o.remaining)
    assert set(started) | set(o.remaining) <= set(range(300))
    assert len(xs) == len(set(xs))
    assert set(xs) <= set(finished)
    # Conservation: what successful producers enqueued is still queued, went through
    # `work`, or went to a step that failed (deadline / cancel) before `work` started.
    failed_early = o.outcomes["deadline"] + o.outcomes["cancelled"]
    unaccounted = set(o.enqueued_ok) - set(started) - set(o.remaining)
    assert len(unaccounted) <= failed_early, sorted(unaccounted)
    # A step dequeues one element at most.
    assert len(set(o.enqueued_ok) - set(o.remaining)) <= o.workers
    # Exact counts.
    assert len(o.ok_steps) + sum(o.outcomes.values()) == o.workers
    assert all(_is_bad(x) for x in failed)
    assert not any(_is_bad(x) for x in xs)
    assert o.outcomes["kernel"] <= len(failed) <= o.outcomes["kernel"] + failed_early
    # Each success saw its own increment; the counter never counts a step that failed
    # before its increment (kernel failures, deadlines); caller-cancelled steps whose
    # work had finished may have incremented it (the cancellation won the race).
    assert len(set(counts)) == len(counts)
    finished_not_ok = len(set(finished) - set(xs))
    if cancel_callers:
        assert (
            len(o.ok_steps)
            <= o.counter
            <= len(o.ok_steps) + min(o.outcomes["cancelled"], finished_not_ok)
        )
    else:
        assert o.counter == len(o.ok_steps)
    assert max(counts, default=0) <= o.counter
    # The round exercised every outcome it was meant to.
    seen = (o.outcomes, len(o.ok_steps), len(o.enqueued_ok), len(tracker.started))
    assert o.ok_steps, seen
    assert o.outcomes["kernel"] > 0, seen
    assert o.outcomes["deadline"] > 0, seen
    if cancel_callers:
        assert o.outcomes["cancelled"] > 0


async def _round_body(seed: int, expensive: bool, cancel_callers: bool) -> None:
    rng = random.Random(seed)
    tracker = _Tracker()
    g, ops = _worker_graph(tracker, rng, expensive)
    enqueued_ok: list[int] = []
    ok_steps: list[tuple[int, int]] = []
    outcomes: dict[str, int] = {"kernel": 0, "deadline": 0, "cancelled": 0}
    kernel_errors: list[af.errors.OpError] = []
    before = asyncio.all_tasks()
    # Thread kernels wait (they do not compute): 8 threads per device let enough of
    # them finish within their deadlines that every outcome occurs even on a slow,
    # loaded machine (with 2, a round saw ~60 kernels run, and once no failing one).
    config = af.SessionConfig(device_count={"CPU": 2}, inter_op_parallelism_threads=8)

    async def producer(sess: af.Session, i: int) -> None:
        opts = af.RunOptions(timeout_in_ms=rng.choice([0, 0, 1, 5]))
        try:
            await sess.run(ops["put"], {ops["item"]: i}, options=opts)
            enqueued_ok.append(i)
        except af.errors.DeadlineExceededError:
            pass

    async def worker(sess: af.Session) -> None:
        # Every worker has a deadline: one waiting on a drained queue must end.
        opts = af.RunOptions(timeout_in_ms=rng.choice([1, 2, 4, 8, 50, 200]))
        try:
            x, count = await sess.run(ops["step"], options=opts)
            ok_steps.append((int(x), int(count)))
        except af.errors.DeadlineExceededError:
            outcomes["deadline"] += 1
        except af.errors.InvalidArgumentError as exc:
            kernel_errors.append(exc)
            outcomes["kernel"] += 1

    async with af.Session(graph=g, config=config) as sess:
        await sess.run(ops["init"])
        producers = [asyncio.ensure_future(producer(sess, i)) for i in range(300)]
        workers = [asyncio.ensure_future(worker(sess)) for _ in range(250)]
        cancelled: set[asyncio.Future[None]] = set()
        if cancel_callers:
            for _ in range(5):
                await asyncio.sleep(rng.uniform(0.0, 0.004))
                for t in rng.sample(workers, 10):
                    if t.cancel():
                        cancelled.add(t)
        results = await asyncio.gather(*producers, *workers, return_exceptions=True)
        for t in workers:
            if t in cancelled and t.cancelled():
                outcomes["cancelled"] += 1
        assert all(r is None or isinstance(r, asyncio.CancelledError) for r in results), [
            r for r in results if r is not None and not isinstance(r, asyncio.CancelledError)
        ]
        remaining = [
            int(await sess.run(ops["take"])) for _ in range(int(await sess.run(ops["size"])))
        ]
        counter = int(await sess.run(ops["counter"]))

    _check_round(
        _Observed(enqueued_ok, ok_steps, outcomes, kernel_errors, remaining, counter, len(workers)),
        tracker,
        cancel_callers,
    )
    # No leaked tasks: every step's tasks ended with the session.
    leftover = [t for t in asyncio.all_tasks() - before if t is not asyncio.current_task()]
    assert leftover == []


@pytest.mark.usefixtures("no_leaked_threads")
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("expensive", [False, True], ids=["async", "expensive"])
@pytest.mark.parametrize("cancel_callers", [False, True], ids=["deadlines", "cancels"])
async def test_random_faults_conserve_elements_and_counts(
    seed: int, expensive: bool, cancel_callers: bool
) -> None:
    await asyncio.wait_for(_round(seed, expensive, cancel_callers), ROUND_TIMEOUT_S)


def test_rounds_from_fresh_loops_and_threads_leave_nothing_behind() -> None:
    # run_sync-style: each round on its own loop in its own thread, concurrently.
    errors: list[BaseException] = []
    baseline = {t.name for t in threading.enumerate()}

    def one(seed: int) -> None:
        try:
            asyncio.run(
                asyncio.wait_for(_round(seed, seed % 2 == 0, seed % 3 == 0), ROUND_TIMEOUT_S)
            )
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(s,)) for s in (10, 11)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(ROUND_TIMEOUT_S + 5)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    extra = {t.name for t in threading.enumerate()} - baseline
    assert not {n for n in extra if n.startswith("asyncflow-")}, extra
