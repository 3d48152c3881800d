"""``Session.run_stream``: each fetch of a step, yielded as soon as its value is ready.

One step runs (the same compiled signature, admission, deadline and counters as
``run``), in a task of a task group owned by the generator.  Kernels producing a
fetched value report it (:mod:`asyncflow.runtime.observe.retvals`) through a queue, and
the generator yields each fetch once all its tensors are there: readiness order.
Fetches whose values exist before the step runs (fed tensors, constants preloaded
into the plan) are yielded first; a ``while_loop`` output as soon as its loop exits.
A fetch nothing reports (an operation, a tensor passed through unchanged) is yielded
when the step ends, in fetch order.  The step's first error is raised by
the generator after the values that were ready before it.  Leaving the ``async
for`` early (``break``, an exception, ``aclose()``) cancels the rest of the step
and waits for it to stop: nothing keeps running.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from asyncflow._backend import require_asyncio
from asyncflow.runtime.observe.retvals import observe_retvals
from asyncflow.session.fetch_feed import FetchMapper

if TYPE_CHECKING:
    from asyncflow.config import RunOptions
    from asyncflow.framework.graph import Graph
    from asyncflow.runtime.bind import BoundPlan
    from asyncflow.runtime.call_frame import CallFrame

__all__ = ["stream"]


class _Call(Protocol):
    """What streaming needs of a session's compiled call."""

    bound: tuple[BoundPlan, ...]
    retval_converters: tuple[Any, ...]

    @property
    def compiled(self) -> Any: ...

    def frame(self, feed_dict: Mapping[Any, Any] | None) -> CallFrame: ...

    def results(self, values: Sequence[Any]) -> Any: ...

    def with_plans(self, bound: Sequence[BoundPlan]) -> Any: ...


class _Session(Protocol):
    @property
    def graph(self) -> Graph: ...

    def _prepare(self, fetches: Any, feed_dict: Mapping[Any, Any] | None) -> Any: ...

    def _start(
        self, call: Any, frame: CallFrame, options: RunOptions | None, run_metadata: None
    ) -> Coroutine[Any, Any, Any]: ...


class _Ready:
    """The values reported so far (fetch index in call order → converted value) and the
    queue that wakes the generator: one per ``run_stream`` call."""

    __slots__ = ("call", "queue", "values")

    def __init__(self, call: _Call) -> None:
        self.call = call
        self.values: dict[int, Any] = {}
        #: Fetch indices as they are reported; None once the step ended.
        self.queue: asyncio.Queue[int | None] = asyncio.Queue()

    def notify(self, k: int, value: Any) -> None:
        if k not in self.values:
            self.values[k] = self.call.retval_converters[k](value)
            self.queue.put_nowait(k)


def _elements(
    graph: Graph, elements: list[Any]
) -> tuple[list[tuple[list[int], Callable[[Any], Any]]], list[int], list[int]]:
    """Per element: the fetched tensors it needs (call order) and its rebuild; the
    elements yielded once their tensors are reported; those (naming an operation)
    done only when the step is."""
    order = {t: k for k, t in enumerate(FetchMapper(graph, elements).tensors)}
    parts = []
    left: list[int] = []
    at_end: list[int] = []
    for e, element in enumerate(elements):
        sub = FetchMapper(graph, element)
        parts.append(([order[t] for t in sub.tensors], sub.rebuild))
        (at_end if sub.targets else left).append(e)
    return parts, left, at_end


def _observed(call: _Call, ready: _Ready) -> Any:
    """``call`` with every partition's fetched retvals reported to ``ready``."""
    loop = asyncio.get_running_loop()
    retval_map = call.compiled.retval_map
    observed = []
    for p, bound in enumerate(call.bound):
        targets: dict[int, list[int]] = {}
        for k, (part, index) in enumerate(retval_map):
            if part == p:
                targets.setdefault(index, []).append(k)
        observed.append(observe_retvals(bound, _fan_out(targets, ready.notify), loop))
    return call.with_plans(observed)


async def stream(
    session: _Session, fetches: Any, feed_dict: Mapping[Any, Any] | None, options: RunOptions | None
) -> AsyncGenerator[tuple[Any, Any], None]:
    """The body of ``Session.run_stream`` (see there)."""
    require_asyncio("Session.run_stream")
    elements = list(fetches) if isinstance(fetches, list | tuple) else [fetches]
    call: _Call = session._prepare(elements, feed_dict)
    frame = call.frame(feed_dict)
    parts, left, at_end = _elements(session.graph, elements)
    ready = _Ready(call)
    streaming = _observed(call, ready)
    for k, value in _known_now(call, frame):  # fed, or a constant: yielded first
        ready.notify(k, value)

    outcome: list[Any] = []  # the step's results, or its exception

    async def drive() -> None:
        try:
            outcome.append(await session._start(streaming, frame, options, None))
        except Exception as exc:  # handed to the consumer, never to the task group
            outcome.append(exc)
        finally:
            ready.queue.put_nowait(None)

    leaving: BaseException | None = None
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(drive())
        try:
            while left:
                if await ready.queue.get() is None:
                    break
                for e in [e for e in left if all(k in ready.values for k in parts[e][0])]:
                    left.remove(e)
                    ks, rebuild = parts[e]
                    yield elements[e], rebuild([ready.values[k] for k in ks])
            else:
                await task  # everything was yielded: the step still finishes
        except (GeneratorExit, Exception) as exc:
            # The consumer left (aclose, or an exception thrown in): cancel the step,
            # let the group wait for it, then leave with that exception as itself
            # (a task group would wrap it in an ExceptionGroup).
            leaving = exc
        finally:
            task.cancel()  # a no-op once it is done; else the consumer left early
    if leaving is not None:
        raise leaving
    result = outcome[0]  # drive() records its outcome before it ends
    if isinstance(result, BaseException):
        raise result
    for e in sorted(left + at_end):  # fetches no kernel reported: from the step's results
        yield elements[e], result[e]


def _known_now(call: _Call, frame: CallFrame) -> list[tuple[int, Any]]:
    """The fetches (call order) whose values exist before the step runs: fed ones, and
    constants the plan preloads (a ``Const`` without control inputs never runs)."""
    known = []
    for k, (part, index) in enumerate(call.compiled.retval_map):
        if part < 0:  # fetched and fed
            known.append((k, frame.args[index]))
            continue
        plan = call.compiled.plans[part]
        value = plan.initial_values[plan.retval_slots[index]]
        if value is not None:
            known.append((k, value))
    return known


def _fan_out(
    targets: dict[int, list[int]], notify: Callable[[int, Any], None]
) -> Callable[[int, Any], None]:
    """Partition retval ``index`` → the fetches (call order) it is."""

    def tell(index: int, value: Any) -> None:
        for k in targets.get(index, ()):
            notify(k, value)

    return tell
