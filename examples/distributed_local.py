"""A graph over a parameter server and two workers, on a one-machine Dask cluster.

``afd.LocalCluster`` starts one Dask worker process per task; the same code runs on
a real cluster with ``afd.Cluster.connect("tcp://scheduler:8786", jobs=...)`` (see
README.md, "Distributed").  Run: ``python examples/distributed_local.py``.
"""

from __future__ import annotations

import asyncio
import os

import numpy as np

import asyncflow as af
import asyncflow.distributed as afd


def build() -> tuple[af.Graph, af.Variable, af.Tensor, af.Tensor, af.Tensor]:
    g = af.Graph()
    with g.as_default():
        with af.device("/job:ps/task:0"):  # the variable lives on the parameter server
            w = af.Variable(np.zeros(3, np.float32), name="w")
        x = af.placeholder(af.float32, shape=(3,), name="x")  # fed here, in this process
        with af.device("/job:worker/task:0"):
            update = w.assign_add(x * 0.5)
        with af.device("/job:worker/task:1"):
            total = af.reduce_sum(w.read_value() * 2.0, name="total")
            where = af.py_func(lambda: np.int64(os.getpid()), [], af.int64, name="pid")
    return g, w, update, total, where


async def main() -> None:
    g, w, update, total, where = build()
    async with afd.LocalCluster(jobs={"ps": 1, "worker": 2}) as cluster:
        print("devices:", len(cluster.devices()))
        async with af.Session(cluster, graph=g) as sess:
            await sess.run(w.initializer)
            for step in range(3):
                await sess.run(update, feed_dict={"x:0": np.full(3, step, np.float32)})
            print("w =", (await sess.run(w)).tolist())
            print("total =", float(await sess.run(total)))
            print("kernel ran in another process:", int(await sess.run(where)) != os.getpid())


if __name__ == "__main__":  # Dask starts worker processes: guard the entry point
    asyncio.run(main())
