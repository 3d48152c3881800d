"""The progress observer: nodes done out of total, and the node running longest.

Asked for with ``RunOptions(progress=callback)``; costs nothing otherwise.  As every
observer (:mod:`asyncflow.runtime.observe`), it does not tell the executor: a step
with progress runs a per-step observed copy of its bound plans
(:meth:`ProgressObserver.observe`: the same engine as the plan's) in which every
kernel counts itself (and async and worker-thread kernels say they are running),
and a ticker task of the run calls ``callback(ProgressEvent)`` every
``interval`` seconds on the step's loop, then once more, ``finished=True``, when the
step has ended (also when it failed).

Counts: ``nodes_done`` counts kernels that ran to the end — inline, async, worker
thread, send and receive nodes.  Control-flow routing (Switch, Merge, loop frames)
runs no kernel and is not counted, nor is the untaken branch of a ``cond``: a step
may finish below its total.  With loops, nodes run once per iteration, so
``nodes_total`` is None (unknown).

A callback that raises is logged (logger ``asyncflow.progress``) and not called
again; the step goes on.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from asyncflow.config import ProgressEvent
from asyncflow.framework import registry
from asyncflow.runtime.bind import BoundPlan
from asyncflow.runtime.observe.hook import Probe, observe_node, observed

__all__ = ["INTERVAL", "ProgressObserver"]

logger = logging.getLogger("asyncflow.progress")

T = TypeVar("T")

#: Seconds between two progress events of a step.
INTERVAL = 0.1


class ProgressObserver:
    """Counts the kernels of one step and reports to a callback."""

    __slots__ = (
        "_callback",
        "_done",
        "_ids",
        "_lock",
        "_running",
        "_start",
        "_thread_done",
        "_total",
    )

    def __init__(self, callback: Callable[[ProgressEvent], Any]) -> None:
        self._callback: Callable[[ProgressEvent], Any] | None = callback
        #: Kernels finished: on the loop thread (written there only) and on worker
        #: threads (written under ``_lock`` only); the sum is the count.
        self._done = 0
        self._thread_done = 0
        self._lock = threading.Lock()
        self._total: int | None = 0
        #: token -> (node name, start time) of async / thread kernels running now.
        self._running: dict[int, tuple[str, float]] = {}
        self._ids = itertools.count()
        self._start = time.monotonic()

    def observe(self, bound: BoundPlan) -> BoundPlan:
        """The observed copy of ``bound`` whose kernels count themselves."""
        names = [getattr(op, "name", "?") for op in bound.ops]
        nodes = tuple(
            observe_node(node, self._probe(node.flow, names[i]))
            for i, node in enumerate(bound.nodes)
        )
        counted = sum(node.flow != registry.CONTROL for node in bound.nodes)
        if bound.frames or self._total is None:
            self._total = None
        else:
            self._total += counted
        return observed(bound, nodes)

    def _probe(self, flow: int, name: str) -> Probe:
        """How a node of kind ``flow`` counts: when it ends; an async or worker-thread
        one also says it is running until it ends or raises."""
        if flow not in (registry.ASYNC, registry.EXPENSIVE):
            return Probe(self._ended)
        running = self._running
        ids = self._ids

        def started() -> int:
            token = next(ids)
            running[token] = (name, time.monotonic())
            return token

        def aborted(token: int) -> None:
            running.pop(token, None)

        count = self._ended if flow == registry.ASYNC else self._ended_on_thread

        def ended(token: int, v: Any) -> None:
            running.pop(token, None)
            count(token, v)

        return Probe(ended, started, aborted)

    def _ended(self, _state: Any, _value: Any) -> None:
        """A kernel ended on the loop thread (written there only)."""
        self._done += 1

    def _ended_on_thread(self, _state: Any, _value: Any) -> None:
        """A kernel ended on a worker thread (counted under the lock)."""
        with self._lock:
            self._thread_done += 1

    def event(self, finished: bool = False) -> ProgressEvent:
        """A snapshot now."""
        now = time.monotonic()
        running = sorted(
            ((name, now - t0) for name, t0 in list(self._running.values())),
            key=lambda item: -item[1],
        )
        done = self._done + self._thread_done
        return ProgressEvent(done, self._total, tuple(running), now - self._start, finished)

    def report(self, finished: bool = False) -> None:
        """Call the callback with an event (dropped for good if it raises)."""
        callback = self._callback
        if callback is None:
            return
        try:
            callback(self.event(finished))
        except Exception:
            logger.exception("progress callback %r raised; it will not be called again", callback)
            self._callback = None

    async def run_beside(self, work: Coroutine[Any, Any, T]) -> T:
        """Await ``work`` (the step) with a ticker task beside it, then report the
        finished event; ``work``'s exception is raised as itself."""
        error: Exception | None = None
        async with asyncio.TaskGroup() as tg:
            ticker = tg.create_task(self.tick())
            try:
                result = await work
            except Exception as exc:  # raised below, never inside an ExceptionGroup
                error = exc
            finally:
                ticker.cancel()
                self.report(finished=True)
        if error is not None:
            raise error
        return result

    async def tick(self, interval: float = INTERVAL) -> None:
        """Report every ``interval`` seconds until cancelled."""
        while True:
            await asyncio.sleep(interval)
            self.report()
