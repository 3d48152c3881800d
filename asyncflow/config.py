"""Session and run configuration, and what a run reports back.

``SessionConfig``, ``RunOptions`` and ``RunMetadata``, with what they carry: the
``StepStats`` a traced run fills (``RunOptions(trace_level=FULL_TRACE)`` with a
``RunMetadata``; recorded by :mod:`asyncflow.runtime.observe.trace`) and the
``ProgressEvent`` a ``RunOptions(progress=callback)`` receives (counted by
:mod:`asyncflow.runtime.observe.progress`).  These are values only, below the
runtime: the observers that make them live in :mod:`asyncflow.runtime.observe`.

Field names follow TensorFlow's ``ConfigProto``, ``RunOptions``, ``RunMetadata``
and ``StepStats``.  Step stats times are microseconds: ``all_start_micros`` is
wall-clock (epoch) time, the ``*_rel_micros`` fields are relative to it; a run
without tracing never touches these classes.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

__all__ = [
    "AllocatorMemoryUsed",
    "DeviceStepStats",
    "ExecutorOptions",
    "GraphOptions",
    "NodeExecStats",
    "NodeOutput",
    "OptimizerOptions",
    "ProgressEvent",
    "RunMetadata",
    "RunOptions",
    "SessionConfig",
    "StepStats",
]


@dataclass(frozen=True, slots=True)
class OptimizerOptions:
    """Which graph optimizations run on every compiled plan (TensorFlow's ``OptimizerOptions``).

    ``opt_level=L1`` (the default) enables constant folding, common-subexpression
    elimination and function inlining; ``L0`` disables all three whatever the
    ``do_*`` flags say.  At ``L1`` each ``do_*`` flag turns its pass on or off.
    Constants larger than ``max_folded_constant_in_bytes`` are never folded.
    Results are identical at every level.

    TensorFlow differs in one detail: there ``L1`` forces folding and CSE on and the
    flags matter only at ``L0``; here (docs/architecture.md) ``L0`` means no optimization at
    all and the flags select passes at ``L1``.
    """

    L1: ClassVar[int] = 0
    L0: ClassVar[int] = -1

    opt_level: int = 0
    do_constant_folding: bool = True
    do_common_subexpression_elimination: bool = True
    do_function_inlining: bool = True
    max_folded_constant_in_bytes: int = 10 * 2**20

    def __post_init__(self) -> None:
        if self.opt_level not in (OptimizerOptions.L0, OptimizerOptions.L1):
            raise ValueError(
                f"opt_level must be OptimizerOptions.L0 or .L1, got {self.opt_level!r}"
            )
        size = self.max_folded_constant_in_bytes
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(f"max_folded_constant_in_bytes must be an int >= 0, got {size!r}")

    @property
    def folding(self) -> bool:
        """Constant folding runs."""
        return self.opt_level == OptimizerOptions.L1 and self.do_constant_folding

    @property
    def cse(self) -> bool:
        """Common-subexpression elimination runs."""
        return self.opt_level == OptimizerOptions.L1 and self.do_common_subexpression_elimination

    @property
    def inlining(self) -> bool:
        """Function calls are inlined (otherwise a call kernel runs the body)."""
        return self.opt_level == OptimizerOptions.L1 and self.do_function_inlining


@dataclass(frozen=True, slots=True)
class GraphOptions:
    """Graph-level options of a session (TensorFlow's ``GraphOptions``)."""

    optimizer_options: OptimizerOptions = field(default_factory=OptimizerOptions)

    def __post_init__(self) -> None:
        if not isinstance(self.optimizer_options, OptimizerOptions):
            raise TypeError(
                f"optimizer_options must be an af.OptimizerOptions, "
                f"got {type(self.optimizer_options).__name__}"
            )


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """How a session is set up (TensorFlow's ``ConfigProto``).

    * ``device_count`` — local devices per type, e.g. ``{"CPU": 2}`` (default one CPU).
    * ``inter_op_parallelism_threads`` — worker threads per device for expensive
      kernels; 0 means one per core.
    * ``intra_op_parallelism_threads`` — BLAS threads a large GEMM of an expensive
      kernel (on a worker thread) may use while it runs alone; 0 means one per core.
      Otherwise BLAS runs one thread, so by default kernels * BLAS threads never
      exceeds the cores (set through ``threadpoolctl``, never environment variables).
    * ``operation_timeout_in_ms`` — default deadline of every run (0: none); a
      run's own ``RunOptions.timeout_in_ms`` wins.
    * ``allow_soft_placement`` — an op asking for an unknown device runs on the
      default device instead of failing.
    * ``place_pruned_graph`` — validate device requests only for the ops a run
      needs (False, as TF: every op of the graph must ask for a valid device).
    * ``log_device_placement`` — log each node's device through ``logging``.
    * ``graph_options`` — graph optimizations (:class:`GraphOptions`).
    * ``isolate_session_state`` — on a cluster, give this session its own variables
      and queues on every task instead of the containers shared by every session
      connected to the cluster (TF semantics).
    * ``max_concurrent_steps`` — backpressure: at most this many steps of the session
      run at once; later ones wait their turn (FIFO), and the wait counts against
      their deadline (``timeout_in_ms``).  0: no limit.
    * ``executor_options`` — how the executor runs this session's steps
      (:class:`ExecutorOptions`; the default is the fastest).
    """

    device_count: dict[str, int] = field(default_factory=lambda: {"CPU": 1})
    inter_op_parallelism_threads: int = 0
    intra_op_parallelism_threads: int = 0
    operation_timeout_in_ms: int = 0
    allow_soft_placement: bool = False
    place_pruned_graph: bool = False
    log_device_placement: bool = False
    graph_options: GraphOptions = field(default_factory=GraphOptions)
    isolate_session_state: bool = False
    max_concurrent_steps: int = 0
    executor_options: ExecutorOptions = field(default_factory=lambda: ExecutorOptions())

    def __post_init__(self) -> None:
        if not isinstance(self.executor_options, ExecutorOptions):
            raise TypeError(
                f"executor_options must be an af.ExecutorOptions, "
                f"got {type(self.executor_options).__name__}"
            )
        if not isinstance(self.graph_options, GraphOptions):
            raise TypeError(
                f"graph_options must be an af.GraphOptions, got {type(self.graph_options).__name__}"
            )
        if not isinstance(self.device_count, dict):
            raise TypeError(
                f"device_count must be a dict like {{'CPU': 2}}, got {self.device_count!r}"
            )
        for kind, n in self.device_count.items():
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise ValueError(f"device_count[{kind!r}] must be an int >= 0, got {n!r}")
            if kind.upper() != "CPU" and n:
                raise ValueError(
                    f"device type {kind!r} is not supported here; only 'CPU' devices exist"
                )
        if self.device_count.get("CPU", self.device_count.get("cpu", 1)) < 1:
            raise ValueError("device_count must provide at least one CPU device")
        for name in (
            "inter_op_parallelism_threads",
            "intra_op_parallelism_threads",
            "operation_timeout_in_ms",
            "max_concurrent_steps",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")


# -- what a run reports: step stats and progress events -------------------------------


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


# -- run options and metadata -----------------------------------------------------------


@dataclass(slots=True)
class RunOptions:
    """Options of one run: deadline, tracing, partition graph output, progress.

    ``progress=callback`` calls ``callback(af.ProgressEvent)`` on the step's event
    loop every 0.1 s while the step runs, and once more (``finished=True``) when it
    ends: kernels done out of total and the kernels running longest.  A callback
    that raises is logged and dropped.  Without it a run pays nothing for progress.
    """

    NO_TRACE: ClassVar[int] = 0
    SOFTWARE_TRACE: ClassVar[int] = 1
    HARDWARE_TRACE: ClassVar[int] = 2
    FULL_TRACE: ClassVar[int] = 3

    timeout_in_ms: int = 0
    trace_level: int = 0
    output_partition_graphs: bool = False
    progress: Callable[[ProgressEvent], object] | None = None

    def __post_init__(self) -> None:
        self._check()

    def _check(self) -> None:
        """``ValueError`` for a bad field; made and run (the fields are settable) check it.

        As TF (an int64 proto field): a deadline that is not a number, or negative, is
        refused at the door, not found out when the step runs.
        """
        t = self.timeout_in_ms
        if not isinstance(t, int | float) or isinstance(t, bool) or not t >= 0:
            raise ValueError(
                f"RunOptions.timeout_in_ms must be a number >= 0 (0: no deadline), got {t!r}"
            )


@dataclass(slots=True)
class RunMetadata:
    """What a run reports back: ``step_stats`` (when traced) and ``partition_graphs``.

    A RunMetadata passed to another run is refilled from scratch.
    """

    step_stats: StepStats = field(default_factory=StepStats)
    partition_graphs: list[dict[str, Any]] = field(default_factory=list)

    def clear(self) -> None:
        """Empty it (done by every run it is passed to)."""
        self.step_stats = StepStats()
        self.partition_graphs = []


@dataclass(frozen=True, slots=True)
class ExecutorOptions:
    """How a session's steps run, chosen when its plans are bound (all choices
    compute the same values; the differential suite runs random programs on each and
    compares them with the reference interpreter).  The defaults are the fastest.

    * ``straight_line`` — nodes that the plan-time rule
      (:func:`asyncflow.compiler.loop_schedule.runs_straight_line`) gives to the
      straight-line interpreter run there: a frame-free partition of synchronous
      kernels replays its static order, a simple loop frame runs as one tight loop.
      False: every node runs on the general pending-count propagator.
    * ``schedule_after`` — how many runs of a plan use the general propagator before
      its static order is built (0: from the first run; the first run of a large plan
      then pays for the order).
    * ``handoffs`` — the partitions of a step hand values to each other directly (a
      send drains the receiving partition on its own stack).  False: every
      cross-partition wait is an ``asyncio.Future`` completed through the event loop.
    * ``own_task_group`` — a step's async and thread kernels run in a task group of the
      step's own, which ends without another trip through the event loop when its
      tasks are done.  False: an ``asyncio.TaskGroup``.
    * ``kernel_parts`` — an async ``py_func`` runs as its function and its conversion
      (one coroutine less per node).  False: through the kernel's own coroutine.
    * ``shuffle_seed`` — for tests: None, or a seed with which the general propagator
      takes up every batch of ready nodes in a shuffled order (the same order for the
      same seed and program), exposing results that depend on an order the graph does
      not fix.  The straight-line interpreter's order is fixed at plan time.
    """

    straight_line: bool = True
    schedule_after: int = 1
    handoffs: bool = True
    own_task_group: bool = True
    kernel_parts: bool = True
    shuffle_seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("straight_line", "handoffs", "own_task_group", "kernel_parts"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise TypeError(f"ExecutorOptions.{name} must be a bool, got {value!r}")
        after = self.schedule_after
        if not isinstance(after, int) or isinstance(after, bool) or after < 0:
            raise ValueError(f"ExecutorOptions.schedule_after must be an int >= 0, got {after!r}")
        seed = self.shuffle_seed
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise TypeError(f"ExecutorOptions.shuffle_seed must be None or an int, got {seed!r}")

    def shuffler(self) -> random.Random | None:
        """A fresh generator for one step's shuffled batches (None: no shuffling)."""
        return None if self.shuffle_seed is None else random.Random(self.shuffle_seed)
