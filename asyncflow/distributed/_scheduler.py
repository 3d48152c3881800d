"""What asyncflow runs *on the Dask scheduler*: the task → worker-name map.

Both pieces are made inside functions, so cloudpickle ships them by value and the
scheduler needs no asyncflow installed:

* :func:`claimer` — binds unpinned tasks to free workers, atomically (a function run
  synchronously on the scheduler's event loop) and records the map in the scheduler's
  metadata under :data:`METADATA_KEY`, so every client sees the same map;
* :func:`keeper` — a scheduler plugin that keeps adaptive scaling from retiring a
  worker hosting a task, and tells every worker when a client leaves (so tasks drop
  that master's sessions at once instead of waiting out its lease).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

__all__ = ["CLIENT_GONE", "METADATA_KEY", "claimer", "keeper", "name_order"]

#: Scheduler metadata key of the recorded task → worker-name map.
METADATA_KEY = ["asyncflow", "tasks"]
#: The worker handler by which the scheduler says a client left.
CLIENT_GONE = "asyncflow_client_gone"


def claimer() -> Callable[..., dict[str, str]]:
    """The function that binds unpinned tasks to free workers *on the scheduler*.

    Made here, so cloudpickle ships it by value (the scheduler needs no asyncflow),
    and run synchronously on the scheduler's event loop, so two clients connecting at
    once cannot choose differently: the first choice is recorded in the scheduler's
    metadata and every later client reads it.
    """

    def claim(
        key: list[str], pinned: dict[str, str | None], free: list[str], dask_scheduler: Any = None
    ) -> dict[str, str]:
        recorded = dict(dask_scheduler.get_metadata(key, default=None) or {})
        taken = set(recorded.values()) | {n for n in pinned.values() if n is not None}
        spare = [n for n in free if n not in taken]
        names: dict[str, str] = {}
        for task, name in pinned.items():
            if name is not None:
                recorded[task] = name
            elif task not in recorded:
                if not spare:
                    raise ValueError(
                        f"no free Dask worker for task {task}: every worker "
                        f"of the cluster hosts a task already ({recorded!r})"
                    )
                recorded[task] = spare.pop(0)
            names[task] = recorded[task]
        dask_scheduler.set_metadata(key, recorded)
        return names

    return claim


def keeper() -> type:
    """A scheduler plugin that keeps Dask's adaptive scaling from retiring a worker that
    hosts a task (one named in the recorded task map).

    Made here, so cloudpickle ships the class by value: the scheduler needs no
    asyncflow.  Dask asks it through ``SchedulerPlugin.valid_workers_downscaling``
    whenever it picks workers to close (``Adaptive``, ``retire_workers`` by count).
    """
    from distributed.diagnostics.plugin import SchedulerPlugin

    class AsyncflowTaskKeeper(SchedulerPlugin):
        def __init__(self) -> None:
            self._telling: set[asyncio.Task[None]] = set()

        def valid_workers_downscaling(self, scheduler: Any, workers: list[Any]) -> list[Any]:
            hosts = set((scheduler.get_metadata(METADATA_KEY, default=None) or {}).values())
            return [ws for ws in workers if str(ws.name) not in hosts]

        def remove_client(self, scheduler: Any, client: str) -> None:
            # Each worker hears it through its asyncflow handler (a worker without one
            # answers None: harmless); every call bounded, every task kept until done.
            for address in list(scheduler.workers):
                task = asyncio.ensure_future(self._tell(scheduler, address, client))
                self._telling.add(task)
                task.add_done_callback(self._telling.discard)

        async def _tell(self, scheduler: Any, address: str, client: str) -> None:
            try:
                async with asyncio.timeout(5):
                    await getattr(scheduler.rpc(address), CLIENT_GONE)(client=client)
            except Exception:
                pass  # a worker that is gone or slow: its leases expire anyway

    return AsyncflowTaskKeeper


def name_order(name: str) -> tuple[int, int | str]:
    """Worker names in a stable order: numbers (LocalCluster's 0, 1, ...) numerically."""
    return (0, int(name)) if name.isdigit() else (1, name)
