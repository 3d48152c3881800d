"""Per-step execution statistics, named as TensorFlow's ``StepStats`` protos.

Filled only when a run asks for ``RunOptions(trace_level=FULL_TRACE)`` and passes a
``RunMetadata``; a run without tracing never touches these classes.  Times are
microseconds: ``all_start_micros`` is wall-clock (epoch) time, the ``*_rel_micros``
fields are relative to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["AllocatorMemoryUsed", "DeviceStepStats", "NodeExecStats", "NodeOutput",
           "StepStats"]


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


@dataclass(slots=True)
class DeviceStepStats:
    """The node stats of one device (``device`` is the full device name)."""

    device: str
    node_stats: list[NodeExecStats] = field(default_factory=list)


@dataclass(slots=True)
class StepStats:
    """Everything recorded for one step: one :class:`DeviceStepStats` per device."""

    dev_stats: list[DeviceStepStats] = field(default_factory=list)
