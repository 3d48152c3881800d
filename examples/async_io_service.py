"""A service-style example: graph steps that await I/O, many requests at once.

Each request runs one step of the same graph.  Inside a step two async ``py_func``
kernels (pretend calls to a profile service and a history service) run
concurrently, then numpy kernels combine their results.  Across requests the steps
run concurrently on one session, so the total time is close to one request's
latency, not the sum of all of them.

Run it with ``python examples/async_io_service.py``.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

import asyncflow as af

LATENCY_S = 0.05  # simulated network latency of each service call


async def fetch_profile(user_id: np.int64) -> np.ndarray:
    """Pretend profile service: 3 features per user."""
    await asyncio.sleep(LATENCY_S)
    return np.array([user_id % 3, user_id % 5, 1.0], np.float32)


async def fetch_history(user_id: np.int64) -> np.ndarray:
    """Pretend history service: the user's last 4 purchase amounts."""
    await asyncio.sleep(LATENCY_S)
    return np.arange(4, dtype=np.float32) * float(user_id)


def build_graph() -> tuple[af.Graph, af.Tensor, af.Tensor]:
    g = af.Graph()
    with g.as_default():
        user_id = af.placeholder(af.int64, shape=(), name="user_id")
        profile = af.py_func(fetch_profile, [user_id], af.float32, name="profile")
        history = af.py_func(fetch_history, [user_id], af.float32, name="history")
        weights = af.constant(np.array([0.5, 0.25, 1.0], np.float32), name="weights")
        score = af.add(af.reduce_sum(profile * weights), af.reduce_mean(history), name="score")
    return g, user_id, score


async def handle_request(sess: af.Session, user_id: af.Tensor, score: af.Tensor, uid: int) -> float:
    return float(await sess.run(score, feed_dict={user_id: uid}))


async def main() -> None:
    g, user_id, score = build_graph()
    uids = list(range(1, 9))
    async with af.Session(graph=g) as sess:
        start = time.perf_counter()
        scores = await asyncio.gather(*(handle_request(sess, user_id, score, u) for u in uids))
        elapsed = time.perf_counter() - start
    for uid, s in zip(uids, scores, strict=True):
        print(f"user {uid}: score {s:.2f}")
    sequential = len(uids) * 2 * LATENCY_S
    print(
        f"handled {len(uids)} requests in {elapsed * 1000:.0f} ms "
        f"(the same I/O done one call at a time: {sequential * 1000:.0f} ms)"
    )


if __name__ == "__main__":
    asyncio.run(main())
