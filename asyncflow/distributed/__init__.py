"""Distributed asyncflow: TensorFlow 1.x's master / worker, hosted on Dask distributed.

``af.Session(cluster, graph=g)`` partitions a graph over the tasks of a cluster
(``/job:ps/replica:0/task:0/device:CPU:0``, ...), registers each task's partitions
with the worker hosting that task, and runs every step on all of them at once;
tensors cross tasks by rendezvous key over Dask's comms.  See docs/architecture.md.

Needs the ``distributed`` extra: ``pip install "asyncflow[distributed]"``.
"""

from __future__ import annotations

try:
    import distributed as _distributed  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        'asyncflow.distributed needs Dask distributed: pip install "asyncflow[distributed]"'
    ) from exc

from asyncflow.distributed.cluster import Cluster, LocalCluster, reset

__all__ = ["Cluster", "LocalCluster", "reset"]
