"""A parameter-server training job that survives its ps being killed.

This script plays the whole deployment on one machine: it starts a ``dask scheduler``
and three named ``dask worker`` processes (``ps-0``, ``w-0``, ``w-1``) as a
multi-machine job would (see docs/distributed.md for SSH, dask-jobqueue and
Kubernetes), trains a linear model whose weights live on ``ps-0`` under
``af.train.MonitoredSession`` (a checkpoint every 10 steps), kills ``ps-0`` mid-run
and starts it again under the same name.  The loop goes on from the last checkpoint.
Run: ``python examples/distributed_ps_recovery.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import asyncflow as af
import asyncflow.distributed as afd

DASK = str(Path(sys.executable).with_name("dask"))
TRUE_W = np.array([2.0, -1.0, 0.5], np.float32)


class Deployment:
    """The scheduler and workers, as processes this script kills by pid when done."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start_scheduler(self) -> str:
        path = self.tmp / "scheduler.json"
        self.procs["scheduler"] = subprocess.Popen(
            [
                DASK,
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--no-dashboard",
                # Dask still serves HTTP (health, metrics) without its dashboard, on all
                # interfaces unless told: keep it on loopback like everything else here.
                "--dashboard-address",
                "127.0.0.1:0",
                "--scheduler-file",
                str(path),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                return str(json.loads(path.read_text())["address"])
            except (OSError, ValueError, KeyError):
                time.sleep(0.05)
        raise RuntimeError("the scheduler did not start")

    def start_worker(self, address: str, name: str) -> None:
        self.procs[name] = subprocess.Popen(
            [
                DASK,
                "worker",
                address,
                "--host",
                "127.0.0.1",
                "--name",
                name,
                "--nthreads",
                "1",
                "--no-nanny",
                "--no-dashboard",
                # Dask still serves HTTP (health, metrics) without its dashboard, on all
                # interfaces unless told: keep it on loopback like everything else here.
                "--dashboard-address",
                "127.0.0.1:0",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def close(self) -> None:
        for name in list(self.procs):
            self.kill(name)


def build() -> tuple[af.Graph, af.Tensor, af.Tensor]:
    """Weights on ps; each worker computes the gradient of half of the batch."""
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(64, 3)).astype(np.float32)
    ys = xs @ TRUE_W
    g = af.Graph()
    with g.as_default():
        with af.device("/job:ps/task:0"):
            w = af.Variable(np.zeros(3, np.float32), name="w")
        grads: list[af.Tensor] = []
        for t, rows in enumerate((slice(0, 32), slice(32, 64))):
            with af.device(f"/job:worker/task:{t}"):
                x, y = af.constant(xs[rows]), af.constant(ys[rows])
                err = af.reduce_sum(x * w, axis=1) - y
                grads.append(af.reduce_mean(x * af.reshape(err, (32, 1)), axis=0))
        with af.device("/job:ps/task:0"):
            train = w.assign_sub(0.1 * (grads[0] + grads[1]) * 0.5)
            loss = af.reduce_mean(
                af.square(
                    af.matmul(af.constant(xs), af.reshape(w, (3, 1)))
                    - af.constant(ys.reshape(64, 1))
                )
            )
    return g, train, loss


async def train(deployment: Deployment, address: str, checkpoints: str) -> None:
    jobs = {"ps": ["ps-0"], "worker": ["w-0", "w-1"]}
    g, step, loss = build()
    async with (
        await afd.Cluster.connect(address, jobs=jobs) as cluster,
        af.train.MonitoredSession(
            lambda: af.Session(cluster, graph=g), checkpoint_dir=checkpoints, save_steps=10
        ) as msess,
    ):
        while msess.global_step < 60:
            if msess.global_step == 25 and msess.recoveries == 0:
                deployment.kill("ps-0")  # the ps host dies: its variables are gone
                print("step 25: killed ps-0, starting it again under the same name")
                deployment.start_worker(address, "ps-0")
            await msess.run(step)
            if msess.global_step == 21 and msess.recoveries == 1:
                print("recovered: ps-0 restored from the checkpoint of step 20")
        print(f"loss after 60 steps = {await msess.session.run(loss):.4f}")
        print(f"recoveries = {msess.recoveries}")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        deployment = Deployment(Path(tmp))
        try:
            address = deployment.start_scheduler()
            for name in ("ps-0", "w-0", "w-1"):
                deployment.start_worker(address, name)
            asyncio.run(train(deployment, address, str(Path(tmp) / "checkpoints")))
        finally:
            deployment.close()


if __name__ == "__main__":
    main()
