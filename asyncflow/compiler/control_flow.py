"""Control flow on the IR: which loop frame every node runs in, and control loops for
loops that span devices.

**Frames** (TensorFlow's ``BuildControlFlowInfo``): a node runs in the frame its
inputs come from, except that an ``Enter``'s output lives in the child frame named
by its ``frame_name`` attribute and an ``Exit``'s output in the parent frame.  A
static frame is named by its path from the root (``("while_frame", "inner")``);
the executor instantiates it once per parent iteration at run time.

**Control loops** (TensorFlow's ``AddControlFlow`` in ``graph_partition.cc``): when a
loop's nodes sit on several devices, every device that receives a value inside the
loop needs to know, per iteration, that the iteration exists and whether the loop
goes on.  The loop's leader (the device of its ``LoopCond``) broadcasts the
predicate; each receiving device gets a small synthetic loop of its own —
``Enter → Merge → Switch(pred) → NextIteration → Merge`` — whose Merge fires once per
iteration and gates that device's ``_Recv`` nodes of the frame.  Nested frames
stack: the inner control loop's Enter hangs off the outer control loop's Merge.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from asyncflow import dtypes, errors
from asyncflow.compiler.ir import NodeDef, ValueInfo
from asyncflow.framework.shapes import TensorShape

__all__ = [
    "CF_ENTER",
    "CF_EXIT",
    "CF_MERGE",
    "CF_NEXT",
    "CF_NONE",
    "CF_SWITCH",
    "CONTROL_FLOW_OPS",
    "FrameInfo",
    "Frames",
    "StaticFrame",
    "add_control_loops",
    "analyze_frames",
    "cond_info",
    "node_frames",
]

CF_NONE, CF_SWITCH, CF_MERGE, CF_ENTER, CF_EXIT, CF_NEXT = range(6)
_KINDS = {
    "Switch": CF_SWITCH,
    "Merge": CF_MERGE,
    "Enter": CF_ENTER,
    "Exit": CF_EXIT,
    "NextIteration": CF_NEXT,
}
#: The op types routed by the frame propagator itself.
CONTROL_FLOW_OPS = frozenset(_KINDS)

#: A static frame: its path of frame names from the root (the root is ``()``).
FramePath = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Frames:
    """Per node name: the frame it runs in and the frame its outputs live in."""

    frame: Mapping[str, FramePath]
    out_frame: Mapping[str, FramePath]
    parallel_iterations: Mapping[FramePath, int]


def node_frames(nodes: Sequence[NodeDef]) -> Frames:
    """The frame of every node; ``InvalidArgumentError`` naming the node when values
    cross frames other than through Enter / Exit."""
    kind = {n.name: _KINDS.get(n.op, CF_NONE) for n in nodes}
    by_name = {n.name: n for n in nodes}
    frame: dict[str, FramePath] = {}
    out_frame: dict[str, FramePath] = {}
    parallel: dict[FramePath, int] = {}
    sources, consumers = _sources_and_consumers(nodes, by_name)
    for name in sources:
        frame[name] = ()
    work = deque(sources)
    while work:
        name = work.popleft()
        out = out_frame[name] = _output_frame(by_name[name], frame, kind, parallel)
        for c in consumers[name]:
            if c not in frame:
                frame[c] = out
                work.append(c)
            elif frame[c] != out and not (kind[c] == CF_MERGE and kind[name] == CF_NEXT):
                raise errors.InvalidArgumentError(
                    None,
                    by_name[c],
                    f"node {c!r} has inputs from different loop frames (one is {name!r}); "
                    f"values cross frames only through Enter and Exit",
                )
    for n in nodes:  # unreachable from a source: a cycle not closed by NextIteration
        if n.name not in frame:
            frame[n.name] = ()
            out_frame[n.name] = _output_frame(n, frame, kind, parallel)
    return Frames(frame, out_frame, parallel)


def _sources_and_consumers(
    nodes: Sequence[NodeDef], by_name: Mapping[str, NodeDef]
) -> tuple[list[str], dict[str, list[str]]]:
    """The nodes without producers, and every node's consumers (data and control).

    A constant without control inputs is a frame-less value (the plan preloads it):
    it may be read in any frame without an Enter, so it is nobody's producer."""
    frameless = {n.name for n in nodes if n.op == "Const" and not n.control_inputs}
    consumers: dict[str, list[str]] = {n.name: [] for n in nodes}
    sources: list[str] = []
    for n in nodes:
        producers = [r[0] for r in n.inputs if r[0] in by_name and r[0] not in frameless]
        producers += [c for c in n.control_inputs if c in by_name]
        if not producers:
            sources.append(n.name)
        for p in producers:
            consumers[p].append(n.name)
    return sources, consumers


def _output_frame(
    n: NodeDef,
    frame: Mapping[str, FramePath],
    kind: Mapping[str, int],
    parallel: dict[FramePath, int],
) -> FramePath:
    """The frame ``n``'s outputs live in: an Enter's child frame (its
    ``parallel_iterations`` noted), an Exit's parent frame, else its own."""
    f = frame[n.name]
    k = kind[n.name]
    if k == CF_ENTER:
        child = (*f, str(n.attrs["frame_name"]))
        parallel.setdefault(child, int(n.attrs.get("parallel_iterations", 10)))
        return child
    if k == CF_EXIT:
        if not f:
            raise errors.InvalidArgumentError(
                None, n, f"Exit node {n.name!r} is not inside a loop frame"
            )
        return f[:-1]
    return f


@dataclass(frozen=True, slots=True)
class StaticFrame:
    """One loop frame of a partition.  Frame 0 is the root (no loop)."""

    name: str  # the frame_name attribute ("" for the root)
    parent: int
    parallel_iterations: int
    exits: tuple[int, ...]  # Exit nodes running in this frame
    num_enters: int  # Enter nodes whose output lives in this frame


@dataclass(frozen=True, slots=True)
class FrameInfo:
    """Per-node control-flow facts of a plan (indexed by node)."""

    kind: tuple[int, ...]  # CF_* of each node
    frame: tuple[int, ...]  # the frame each node runs in
    child: tuple[int, ...]  # Enter: the frame its output lives in (else -1)
    constant: tuple[bool, ...]  # Enter: is_constant
    loop_merge: tuple[bool, ...]  # Merge with a NextIteration input
    merge_controls: tuple[int, ...]  # Merge: how many control producers it waits for
    frames: tuple[StaticFrame, ...]


def analyze_frames(sched: Sequence[NodeDef], frames: Frames) -> FrameInfo:
    """Index the frames of the scheduled nodes of one partition."""
    index: dict[FramePath, int] = {(): 0}
    paths: list[FramePath] = [()]

    def frame_index(path: FramePath) -> int:
        k = index.get(path)
        if k is None:
            frame_index(path[:-1])  # a parent frame gets its index first
            k = index[path] = len(paths)
            paths.append(path)
        return k

    node_of = {n.name: i for i, n in enumerate(sched)}
    kind = tuple(_KINDS.get(n.op, CF_NONE) for n in sched)
    frame = tuple(frame_index(frames.frame[n.name]) for n in sched)
    child = tuple(
        frame_index(frames.out_frame[n.name]) if k == CF_ENTER else -1 for n, k in zip(sched, kind)
    )
    constant = tuple(
        bool(n.attrs.get("is_constant", False)) if k == CF_ENTER else False
        for n, k in zip(sched, kind)
    )
    loop_merge = tuple(
        k == CF_MERGE and any(r[0] in node_of and kind[node_of[r[0]]] == CF_NEXT for r in n.inputs)
        for n, k in zip(sched, kind)
    )
    merge_controls = tuple(
        len({c for c in n.control_inputs if c in node_of}) if k == CF_MERGE else 0
        for n, k in zip(sched, kind)
    )
    exits: dict[int, list[int]] = {}
    enters: dict[int, int] = {}
    for i, k in enumerate(kind):
        if k == CF_EXIT:
            exits.setdefault(frame[i], []).append(i)
        elif k == CF_ENTER:
            enters[child[i]] = enters.get(child[i], 0) + 1
    static = tuple(
        StaticFrame(
            p[-1] if p else "",
            index[p[:-1]] if p else -1,
            frames.parallel_iterations.get(p, 1),
            tuple(exits.get(k, ())),
            enters.get(k, 0),
        )
        for k, p in enumerate(paths)
    )
    return FrameInfo(kind, frame, child, constant, loop_merge, merge_controls, static)


def cond_info(sched: Sequence[NodeDef]) -> FrameInfo:
    """The control-flow facts of a partition without loops (Switch / Merge only, or
    values received from devices where a branch may not have been taken): one frame."""
    present = {n.name for n in sched}
    kind = tuple(_KINDS.get(n.op, CF_NONE) for n in sched)
    merge_controls = tuple(
        len({c for c in n.control_inputs if c in present}) if k == CF_MERGE else 0
        for n, k in zip(sched, kind)
    )
    return FrameInfo(kind, (), (), (), (), merge_controls, (StaticFrame("", -1, 1, (), 0),))


# -- control loops for loops across devices -------------------------------------------

_DUMMY = ValueInfo(dtypes.float32, TensorShape([0]))
_INDEX = ValueInfo(dtypes.int32, TensorShape(()))
_BOOL = ValueInfo(dtypes.bool, TensorShape(()))


def add_control_loops(
    nodes: Sequence[NodeDef], placement: Sequence[int], frames: Frames
) -> tuple[tuple[NodeDef, ...], tuple[int, ...], Frames, dict[tuple[FramePath, int], str]]:
    """Add a control loop per (frame, device) that receives a value inside that frame
    from another device.  Returns the nodes, placement and frames with the control
    loops added, and ``(frame, device) -> the control loop's Merge``: partitioning
    gives each ``_Recv`` of that frame on that device a control edge from it.
    """
    adding = _ControlLoops(nodes, placement, frames)
    device_of = adding.device_of
    for n in nodes:
        d = device_of[n.name]
        for src in (*(r[0] for r in n.inputs), *n.control_inputs):
            if src not in device_of or device_of[src] == d:
                continue
            path = frames.out_frame[src]
            if path and path == frames.frame[n.name]:
                adding.ensure(path, d, n)
    if not adding.added:
        return tuple(nodes), tuple(placement), frames, adding.loops
    return (
        (*nodes, *adding.added),
        (*placement, *adding.added_device),
        Frames(adding.frame, adding.out_frame, frames.parallel_iterations),
        adding.loops,
    )


class _ControlLoops:
    """The control loops added to a placed graph, with their devices and frames."""

    def __init__(self, nodes: Sequence[NodeDef], placement: Sequence[int], frames: Frames) -> None:
        self.frames = frames
        self.device_of = {n.name: d for n, d in zip(nodes, placement, strict=True)}
        self.loop_cond = {frames.frame[n.name]: n.name for n in nodes if n.op == "LoopCond"}
        self.added: list[NodeDef] = []
        self.added_device: list[int] = []
        self.frame = dict(frames.frame)
        self.out_frame = dict(frames.out_frame)
        self.loops: dict[tuple[FramePath, int], str] = {}

    def new(self, node: NodeDef, device: int, runs_in: FramePath, outputs_in: FramePath) -> None:
        self.added.append(node)
        self.added_device.append(device)
        self.device_of[node.name] = device
        self.frame[node.name] = runs_in
        self.out_frame[node.name] = outputs_in

    def ensure(self, path: FramePath, device: int, owner: NodeDef) -> str:
        """The Merge of frame ``path``'s control loop on ``device`` (made with its
        parent frames' first)."""
        merge = self.loops.get((path, device))
        if merge is not None:
            return merge
        cond = self.loop_cond.get(path)
        if cond is None:
            raise errors.InvalidArgumentError(
                None,
                owner,
                f"A cross-device loop must have a pivot predicate: frame "
                f"{path[-1]!r} has no LoopCond among the nodes of this run",
            )
        prefix = f"_cloop{len(self.loops)}_{path[-1]}_{device}"
        parent = path[:-1]
        if parent:
            source = self.ensure(parent, device, owner)
        else:
            source = f"{prefix}/dummy"
            dummy = NodeDef(
                source,
                "Const",
                attrs={"value": np.zeros(0, np.float32), "dtype": dtypes.float32},
                outputs=(_DUMMY,),
                traceback=owner.traceback,
            )
            self.new(dummy, device, (), ())
        merge = self.loops[(path, device)] = f"{prefix}/merge"
        self._add_loop(prefix, path, device, source, cond, owner.traceback)
        return merge

    def _add_loop(
        self, prefix: str, path: FramePath, device: int, source: str, cond: str, tb: str
    ) -> None:
        """Enter -> Merge -> Switch (on the frame's LoopCond) -> NextIteration -> Merge."""
        enter = NodeDef(
            f"{prefix}/enter",
            "Enter",
            ((source, 0),),
            attrs={
                "frame_name": path[-1],
                "is_constant": False,
                "parallel_iterations": self.frames.parallel_iterations.get(path, 10),
            },
            outputs=(_DUMMY,),
            input_types=(_DUMMY,),
            traceback=tb,
        )
        self.new(enter, device, path[:-1], path)
        merge = NodeDef(
            f"{prefix}/merge",
            "Merge",
            ((f"{prefix}/enter", 0), (f"{prefix}/next", 0)),
            outputs=(_DUMMY, _INDEX),
            input_types=(_DUMMY, _DUMMY),
            traceback=tb,
        )
        self.new(merge, device, path, path)
        # The predicate comes from the leader's LoopCond; when that is on another
        # device, partitioning cuts this edge and gates its _Recv with the Merge.
        switch = NodeDef(
            f"{prefix}/switch",
            "Switch",
            ((f"{prefix}/merge", 0), (cond, 0)),
            outputs=(_DUMMY, _DUMMY),
            input_types=(_DUMMY, _BOOL),
            traceback=tb,
        )
        self.new(switch, device, path, path)
        next_iteration = NodeDef(
            f"{prefix}/next",
            "NextIteration",
            ((f"{prefix}/switch", 1),),
            outputs=(_DUMMY,),
            input_types=(_DUMMY,),
            traceback=tb,
        )
        self.new(next_iteration, device, path, path)
