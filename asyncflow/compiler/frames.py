"""Frame analysis: which loop frame every node of a control-flow plan runs in.

As TensorFlow's ``BuildControlFlowInfo``: a node runs in the frame its inputs come
from, except that an ``Enter``'s output lives in the child frame named by its
``frame_name`` attribute and an ``Exit``'s output in the parent frame.  Frames are
static here (one per loop in the graph); the executor instantiates them per parent
iteration at run time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from asyncflow import errors

if TYPE_CHECKING:
    from asyncflow.framework.graph import Operation, Tensor

__all__ = ["CF_ENTER", "CF_EXIT", "CF_MERGE", "CF_NEXT", "CF_NONE", "CF_SWITCH",
           "FrameInfo", "StaticFrame", "analyze_frames"]

CF_NONE, CF_SWITCH, CF_MERGE, CF_ENTER, CF_EXIT, CF_NEXT = range(6)
_KINDS = {"Switch": CF_SWITCH, "Merge": CF_MERGE, "Enter": CF_ENTER, "Exit": CF_EXIT,
          "NextIteration": CF_NEXT}


@dataclass(frozen=True, slots=True)
class StaticFrame:
    """One loop of the graph.  Frame 0 is the root (no loop)."""

    name: str
    parent: int
    parallel_iterations: int
    exits: tuple[int, ...]      # Exit nodes running in this frame
    num_enters: int             # Enter nodes whose output lives in this frame


@dataclass(frozen=True, slots=True)
class FrameInfo:
    """Per-node control-flow facts of a plan (indexed by node)."""

    kind: tuple[int, ...]            # CF_* of each node
    frame: tuple[int, ...]           # the frame each node runs in
    child: tuple[int, ...]           # Enter: the frame its output lives in (else -1)
    constant: tuple[bool, ...]       # Enter: is_constant
    loop_merge: tuple[bool, ...]     # Merge with a NextIteration input
    merge_controls: tuple[int, ...]  # Merge: how many control producers it waits for
    frames: tuple[StaticFrame, ...]


def analyze_frames(sched: Sequence[Operation], node_of_op: dict[Operation, int],
                   feeds: Sequence[Tensor], fetches: Sequence[Tensor]) -> FrameInfo:
    """Frames of every scheduled node; rejects feeds/fetches inside loops."""
    n = len(sched)
    kind = [_KINDS.get(op._type, CF_NONE) for op in sched]
    frame = [-1] * n
    out_frame = [-1] * n
    frame_keys: dict[tuple[int, str], int] = {}
    names: list[str] = [""]      # per static frame: name, parent, parallel_iterations
    parents: list[int] = [-1]
    parallel: list[int] = [1]

    def output_frame(i: int) -> int:
        f = frame[i]
        if kind[i] == CF_ENTER:
            op = sched[i]
            key = (f, op._attrs["frame_name"])
            child = frame_keys.get(key)
            if child is None:
                child = frame_keys[key] = len(names)
                names.append(op._attrs["frame_name"])
                parents.append(f)
                parallel.append(int(op._attrs["parallel_iterations"]))
            return child
        if kind[i] == CF_EXIT:
            parent = parents[f]
            if parent < 0:
                raise errors.InvalidArgumentError(
                    None, sched[i], f"Exit node {sched[i].name!r} is not inside a loop frame")
            return parent
        return f

    consumers: list[list[int]] = [[] for _ in range(n)]
    sources: list[int] = []
    for i, op in enumerate(sched):
        producers = [node_of_op[t._op] for t in op._inputs if t._op in node_of_op]
        producers += [node_of_op[c] for c in op._control_inputs if c in node_of_op]
        if not producers:
            sources.append(i)
        for p in producers:
            consumers[p].append(i)
    work = deque(sources)
    for i in sources:
        frame[i] = 0
    while work:
        i = work.popleft()
        out_frame[i] = output_frame(i)
        for c in consumers[i]:
            if frame[c] < 0:
                frame[c] = out_frame[i]
                work.append(c)
            elif frame[c] != out_frame[i] and not (kind[c] == CF_MERGE and kind[i] == CF_NEXT):
                raise errors.InvalidArgumentError(
                    None, sched[c],
                    f"node {sched[c].name!r} has inputs from different loop frames "
                    f"(one is {sched[i].name!r}); values cross frames only through "
                    f"Enter and Exit")
    for i in range(n):
        if frame[i] < 0:
            frame[i] = 0
            out_frame[i] = output_frame(i)
    for t in list(feeds) + list(fetches):
        j = node_of_op.get(t._op)
        if j is not None and out_frame[j] != 0:
            what = "fed" if t in feeds else "fetched"
            raise errors.InvalidArgumentError(
                None, t._op, f"Tensor {t.name!r} is inside a while loop and cannot be {what}; "
                             f"feed or fetch the loop's inputs or outputs instead")
    exits: dict[int, list[int]] = {}
    enters: dict[int, int] = {}
    child = [-1] * n
    constant = [False] * n
    for i, op in enumerate(sched):
        if kind[i] == CF_EXIT:
            exits.setdefault(frame[i], []).append(i)
        elif kind[i] == CF_ENTER:
            child[i] = out_frame[i]
            constant[i] = bool(op._attrs.get("is_constant", False))
            enters[out_frame[i]] = enters.get(out_frame[i], 0) + 1
    loop_merge = [kind[i] == CF_MERGE and any(
        t._op in node_of_op and kind[node_of_op[t._op]] == CF_NEXT for t in op._inputs)
        for i, op in enumerate(sched)]
    merge_controls = [
        len({node_of_op[c] for c in op._control_inputs if c in node_of_op})
        if kind[i] == CF_MERGE else 0 for i, op in enumerate(sched)]
    static = tuple(
        StaticFrame(names[k], parents[k], parallel[k], tuple(exits.get(k, ())),
                    enters.get(k, 0))
        for k in range(len(names)))
    return FrameInfo(tuple(kind), tuple(frame), tuple(child), tuple(constant),
                     tuple(loop_merge), tuple(merge_controls), static)
