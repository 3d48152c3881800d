"""What observing a step hands to the user: step stats and progress events.

``StepStats`` and its parts are named as TensorFlow's protos.  They are filled only
when a run asks for ``RunOptions(trace_level=FULL_TRACE)`` and passes a
``RunMetadata`` (:mod:`asyncflow.runtime.observe.trace` records them); a run without
tracing never touches these classes.  Times are microseconds: ``all_start_micros``
is wall-clock (epoch) time, the ``*_rel_micros`` fields are relative to it.

``ProgressEvent`` is what ``RunOptions(progress=callback)`` receives
(:mod:`asyncflow.runtime.observe.progress` counts).

A leaf module (dataclasses only): the configuration module imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "AllocatorMemoryUsed",
    "DeviceStepStats",
    "NodeExecStats",
    "NodeOutput",
    "ProgressEvent",
    "StepStats",
]


@dataclass(frozen=True, slots=True)
class AllocatorMemoryUsed:
    """Bytes a node's outputs hold (TF's AllocatorMemoryUsed, simplified)."""

    allocator_name: str = "cpu"
    total_bytes: int = 0


@dataclass(frozen=True, slots=True)
class NodeOutput:
    """One output of a node: its slot, shape, dtype name and size in bytes."""

    slot: int
    shape: tuple[int, ...]
    dtype: str
    requested_bytes: int


@dataclass(slots=True)
class NodeExecStats:
    """When and where one node ran.

    ``scheduled_micros`` is when it became ready; ``all_start_micros`` when its
    kernel was entered; ``op_end_rel_micros`` when the kernel returned (relative to
    ``all_start_micros``).  ``kind`` is ``"inline"``, ``"async"``, ``"thread"``,
    ``"send"`` or ``"recv"``.
    """

    # runtime/observe/trace.py's _inline_stats sets every field directly (the hot loop of reading
    # a traced step's stats): a field added here is set there too (a test compares).

    node_name: str
    op_type: str = ""
    kind: str = "inline"
    scheduled_micros: int = 0
    all_start_micros: int = 0
    op_start_rel_micros: int = 0
    op_end_rel_micros: int = 0
    all_end_rel_micros: int = 0
    thread_id: int = 0
    timeline_label: str = ""
    output: list[NodeOutput] = field(default_factory=list)
    #: ``_Send`` / ``_Recv`` only: the rendezvous key (pairs them in a timeline).
    rendezvous_key: str = ""
    #: Inside a while loop: the loop's frame name and the iteration the node ran in.
    frame_name: str = ""
    iter_id: int = 0


class DeviceStepStats:
    """The node stats of one device (``device`` is the full device name).

    A traced step hands over its raw records: ``node_stats`` is made from them on
    first access (a traced run then costs little more per node than two clock
    reads), and is a plain list from then on.
    """

    __slots__ = ("_build", "_node_stats", "device")

    def __init__(self, device: str, node_stats: list[NodeExecStats] | None = None) -> None:
        self.device = device
        self._node_stats = [] if node_stats is None else node_stats
        self._build: Callable[[], list[NodeExecStats]] | None = None

    @classmethod
    def deferred(cls, device: str, build: Callable[[], list[NodeExecStats]]) -> DeviceStepStats:
        """Stats of ``device`` whose ``node_stats`` are ``build()``, called on first access."""
        stats = cls(device)
        stats._build = build
        return stats

    @property
    def node_stats(self) -> list[NodeExecStats]:
        """What ran on the device, one :class:`NodeExecStats` per node run."""
        build = self._build
        if build is not None:
            self._node_stats = build()
            self._build = None
        return self._node_stats

    @node_stats.setter
    def node_stats(self, value: list[NodeExecStats]) -> None:
        self._node_stats = value
        self._build = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DeviceStepStats):
            return NotImplemented
        return self.device == other.device and self.node_stats == other.node_stats

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass it replaces

    def __repr__(self) -> str:
        return f"DeviceStepStats(device={self.device!r}, node_stats={self.node_stats!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Shipped between processes (distributed steps) with its stats made.
        return DeviceStepStats, (self.device, self.node_stats)


@dataclass(slots=True)
class StepStats:
    """Everything recorded for one step: one :class:`DeviceStepStats` per device."""

    dev_stats: list[DeviceStepStats] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    """Where a step is: what ``RunOptions(progress=callback)`` receives.

    * ``nodes_done`` — kernels that have finished (each loop iteration counts).
    * ``nodes_total`` — kernels of the step's plans; None when it runs loops.
    * ``running`` — ``(node name, seconds running)`` of the async and worker-thread
      kernels running now, longest first.
    * ``elapsed`` — seconds since the step started.
    * ``finished`` — the last event of the step (sent whether it succeeded or not).
    """

    nodes_done: int
    nodes_total: int | None
    running: tuple[tuple[str, float], ...]
    elapsed: float
    finished: bool = False

    @property
    def longest(self) -> tuple[str, float] | None:
        """The node running longest now, with its seconds, or None."""
        return self.running[0] if self.running else None
