"""The plan: everything about one partition of a run signature that does not change
between steps.

``build_plan`` lowers a :class:`~asyncflow.compiler.partition.PartitionDef` into flat,
index-based tables the executor walks without a single name lookup:

* **slots** — every value a step holds lives at an integer index of one list:
  ``[node outputs..., _Arg values...]``.  ``initial_values`` pre-fills the slots of
  constants, so a ``Const`` without control inputs never runs at all.
* **nodes** — the IR node of every scheduled node, its input slots, first output
  slot, output count, consumer nodes, and the input slots it releases when done.
* **pending counts** — ``initial_pending[i]`` is the number of distinct producer
  nodes (data or control) of node ``i``; a node is ready at zero.
* **last use** — a slot read by exactly one node is freed by that node
  (``frees``); a slot read by several is reference counted (``counted`` +
  ``initial_refs``); outputs nobody reads are freed by their producer.
* **call frame** — feeds enter through ``_Arg`` slots (``arg_slots``) and fetches
  leave through ``_Retval`` reads (``retval_slots``); fetched and arg slots are never
  freed.
* **propagation** — a partition with loop frames (an Enter) gets ``frames`` and
  ``edges_out`` and runs with the frame propagator; every other partition runs with
  the plain one (``frames`` then only says which nodes are Switches and Merges, when
  the partition has them or may receive dead values).

A plan is a plain value (no kernel, no graph, no lock): it pickles, and many
concurrent steps share it.  Kernels are bound to it by :mod:`asyncflow.runtime.bind`.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass
from typing import Any

from asyncflow.compiler.control_flow import (
    CONTROL_FLOW_OPS,
    FrameInfo,
    analyze_frames,
    cond_info,
    node_frames,
)
from asyncflow.compiler.ir import NodeDef, Ref
from asyncflow.compiler.loop_schedule import LoopSchedule, schedule_loops
from asyncflow.compiler.partition import PartitionDef

__all__ = ["Plan", "build_plan"]

#: Per producer: its consumers as (node, ((input position, slot), ...), has_control_edge).
EdgesOut = tuple[tuple[tuple[int, tuple[tuple[int, int], ...], bool], ...], ...]


@dataclass(frozen=True, slots=True, eq=False)
class Plan:
    """The immutable, per-signature executable form of one partition."""

    partition: PartitionDef
    nodes: tuple[NodeDef, ...]  # the scheduled nodes (preloaded constants excluded)
    inputs: tuple[tuple[int, ...], ...]  # input slots per node
    out: tuple[int, ...]  # first output slot per node
    consumers: tuple[tuple[int, ...], ...]
    frees: tuple[tuple[int, ...], ...]
    counted: tuple[tuple[int, ...], ...]
    initial_pending: tuple[int, ...]
    initial_ready: tuple[int, ...]
    initial_values: tuple[Any, ...]
    initial_refs: tuple[int, ...] | None  # None when no slot is reference counted
    arg_slots: tuple[int, ...]
    retval_slots: tuple[int, ...]
    num_slots: int
    #: Loop frames: the frame of every node and its out-edges (frame propagator only).
    frames: FrameInfo | None = None
    edges_out: EdgesOut = ()
    #: Per static loop frame: its straight-line schedule when it has one (the frame
    #: propagator's fast path, :mod:`asyncflow.compiler.loop_schedule`), else None.
    loop_schedules: tuple[LoopSchedule | None, ...] = ()

    @property
    def device(self) -> str:
        """The full name of the partition's device."""
        return self.partition.device

    @property
    def loops(self) -> bool:
        """Whether the partition holds loop frames (the frame propagator runs it)."""
        return self.frames is not None and len(self.frames.frames) > 1

    def __repr__(self) -> str:
        return (
            f"<Plan {self.device} nodes={len(self.nodes)} args={len(self.arg_slots)} "
            f"retvals={len(self.retval_slots)} frames={self.frames is not None}>"
        )


def build_plan(part: PartitionDef) -> Plan:
    """Lower one partition into a :class:`Plan`.

    Kept tight: a 100,000-node plan is built on its first run, so every table is
    made in one pass per node with flat lists indexed by node or slot (no per-slot
    containers, no empty list per node).
    """
    nodes = part.nodes
    # -- slots and nodes ------------------------------------------------------------
    # One pass: every node's first slot, and the scheduled nodes.  ``owner`` is, by
    # slot, the scheduled node producing it (-1: a preloaded constant or an
    # argument): an input edge is then one name lookup (its slot), the rest lists.
    slot_of: dict[str, int] = {}
    owner: list[int] = []
    sched: list[NodeDef] = []
    out_slots: list[int] = []
    preloaded: list[tuple[int, Any]] = []
    n_slots = 0
    for node in nodes:
        slot_of[node.name] = first = n_slots
        n_outputs = len(node.outputs)
        n_slots += n_outputs
        if node.op == "Const" and not node.control_inputs:  # preloaded, never runs
            preloaded.append((first, node.attrs["value"]))
            owner.append(-1)
        else:
            i = len(sched)
            sched.append(node)
            out_slots.append(first)
            if n_outputs == 1:
                owner.append(i)
            else:
                owner.extend([i] * n_outputs)
    fed_slot: dict[Ref, int] = {}
    for k, (_, r) in enumerate(part.args):
        fed_slot[r] = n_slots + k
    fed_names = {r[0] for r in fed_slot}
    arg_slots = tuple(range(n_slots, n_slots + len(part.args)))
    n_slots += len(part.args)
    owner.extend([-1] * len(part.args))
    initial_values: list[Any] = [None] * n_slots
    for first, value in preloaded:
        initial_values[first] = value[()] if value.ndim == 0 else value

    def slot(r: Ref) -> int:
        s = fed_slot.get(r) if fed_slot else None
        return s if s is not None else slot_of[r[0]] + r[1]

    n = len(sched)
    pending = [0] * n
    consumers: list[Any] = [()] * n  # (i,) for the first consumer, a list for more
    grown: list[int] = []  # the nodes whose consumers became a list
    in_slots: list[tuple[int, ...]] = []
    # Per slot: how many distinct nodes read it, and the last one that did.
    reads = [0] * n_slots
    last_reader = [-1] * n_slots
    node_of: dict[str, int] | None = None  # name -> scheduled index, for control edges
    # One pass per node, kept tight.  Two data inputs and no control input (most
    # nodes of a large graph) take a branch of their own, without lists; the rest
    # keeps its producers in a small list (most nodes have one or two).
    for i, node in enumerate(sched):
        inputs = node.inputs
        if len(inputs) == 2 and not node.control_inputs:
            ra, rb = inputs
            na, nb = ra[0], rb[0]
            if not fed_names or (na not in fed_names and nb not in fed_names):
                # Output 0's slot is the producer's own int object (one int object
                # per slot, not one per read: ints above 256 are 32 bytes each).
                sa = slot_of[na] + ra[1] if ra[1] else slot_of[na]
                sb = slot_of[nb] + rb[1] if rb[1] else slot_of[nb]
                in_slots.append((sa, sb))
                last_reader[sa] = i
                reads[sa] += 1
                pa = owner[sa]
                if pa >= 0:
                    cs = consumers[pa]
                    if not cs:  # most nodes have one consumer: a 1-tuple is final
                        consumers[pa] = (i,)
                    elif type(cs) is tuple:
                        consumers[pa] = [*cs, i]
                        grown.append(pa)
                    else:
                        cs.append(i)
                    pending[i] = 1
                if sb == sa:
                    continue
                last_reader[sb] = i
                reads[sb] += 1
                pb = owner[sb]
                if pb >= 0 and pb != pa:
                    cs = consumers[pb]
                    if not cs:
                        consumers[pb] = (i,)
                    elif type(cs) is tuple:
                        consumers[pb] = [*cs, i]
                        grown.append(pb)
                    else:
                        cs.append(i)
                    pending[i] += 1
                continue
        ins_list: list[int] = []
        producers: list[int] = []
        for r in inputs:
            name = r[0]
            if name in fed_names and r in fed_slot:
                s = fed_slot[r]
            else:
                s = slot_of[name] + r[1] if r[1] else slot_of[name]
                p = owner[s]
                if p >= 0 and p not in producers:
                    producers.append(p)
            ins_list.append(s)
            if last_reader[s] != i:  # a slot read twice by one node counts once
                last_reader[s] = i
                reads[s] += 1
        if node.control_inputs:
            if node_of is None:
                node_of = {m.name: j for j, m in enumerate(sched)}
            for c in node.control_inputs:
                p = node_of.get(c, -1)
                if p >= 0 and p not in producers:
                    producers.append(p)
        in_slots.append(tuple(ins_list))
        pending[i] = len(producers)
        for p in producers:
            cs = consumers[p]
            if not cs:  # most nodes have one consumer: a 1-tuple is final already
                consumers[p] = (i,)
            elif type(cs) is tuple:
                consumers[p] = [*cs, i]
                grown.append(p)
            else:
                cs.append(i)

    # -- last use ----------------------------------------------------------------
    retval_slots = tuple(slot(r) for _, r in part.retvals)
    keep = set(arg_slots)
    keep.update(retval_slots)
    frees: list[Any] = [()] * n  # as consumers: (s,), then a list
    freeing: list[int] = []  # the nodes whose frees became a list
    counted: list[Any] = [()] * n
    refs: list[int] | None = None
    for s in range(n_slots):
        k = reads[s]
        if k == 1:  # sole reader frees it, unless fetched, fed or preloaded
            if s not in keep and initial_values[s] is None:
                reader = last_reader[s]
                first_in = in_slots[reader][0]
                if first_in == s:  # the int object the reader holds (one per slot)
                    s = first_in
                f = frees[reader]
                if not f:
                    frees[reader] = (s,)
                elif type(f) is tuple:
                    frees[reader] = [*f, s]
                    freeing.append(reader)
                else:
                    f.append(s)
        elif k == 0:  # an output nobody reads: freed by its producer
            producer = owner[s]
            if producer >= 0 and s not in keep:
                f = frees[producer]
                if not f:
                    frees[producer] = (s,)
                elif type(f) is tuple:
                    frees[producer] = [*f, s]
                    freeing.append(producer)
                else:
                    f.append(s)
        elif s not in keep and initial_values[s] is None:
            if refs is None:
                refs = [0] * n_slots
            refs[s] = k
    if refs is not None:  # reference counted slots: every reader releases once
        for i, ins in enumerate(in_slots):
            for s in dict.fromkeys(ins):
                if refs[s]:
                    c = counted[i]
                    if c:
                        c.append(s)
                    else:
                        counted[i] = [s]

    # Only the entries that grew into lists become tuples (most are final already).
    for p in grown:
        consumers[p] = tuple(consumers[p])
    for p in freeing:
        frees[p] = tuple(frees[p])
    if refs is not None:
        counted = [tuple(c) for c in counted]

    frames = None
    edges_out: EdgesOut = ()
    loop_schedules: tuple[LoopSchedule | None, ...] = ()
    ops = {node.op for node in sched}
    if "Enter" in ops:  # loops: the frame propagator
        frames = analyze_frames(sched, node_frames(sched))
        edges_out = _edges_out(
            sched,
            node_of if node_of is not None else {node.name: i for i, node in enumerate(sched)},
            in_slots,
            fed_slot,
        )
        loop_schedules = schedule_loops(
            sched, frames, in_slots, out_slots, consumers, initial_values
        )
    elif not ops.isdisjoint(CONTROL_FLOW_OPS) or (part.control_flow and "_Recv" in ops):
        frames = cond_info(sched)  # dead tensors, one frame: the plain propagator
    return Plan(
        partition=part,
        nodes=tuple(sched),
        inputs=tuple(in_slots),
        out=tuple(out_slots),
        consumers=tuple(consumers),
        frees=tuple(frees),
        counted=tuple(counted),
        initial_pending=tuple(pending),
        initial_ready=tuple(itertools.compress(range(n), map(operator.not_, pending))),
        initial_values=tuple(initial_values),
        initial_refs=tuple(refs) if refs is not None else None,
        arg_slots=arg_slots,
        retval_slots=retval_slots,
        num_slots=n_slots,
        frames=frames,
        edges_out=edges_out,
        loop_schedules=loop_schedules,
    )


def _edges_out(
    sched: list[NodeDef],
    node_of: dict[str, int],
    in_slots: list[tuple[int, ...]],
    fed_slot: dict[Ref, int],
) -> EdgesOut:
    out: list[dict[int, tuple[list[tuple[int, int]], list[bool]]]] = [{} for _ in sched]
    for c, node in enumerate(sched):
        for pos, r in enumerate(node.inputs):
            p = node_of.get(r[0])
            if p is None or r in fed_slot:
                continue
            out[p].setdefault(c, ([], [False]))[0].append((pos, in_slots[c][pos]))
        for ctrl in node.control_inputs:
            p = node_of.get(ctrl)
            if p is not None:
                out[p].setdefault(c, ([], [False]))[1][0] = True
    return tuple(tuple((c, tuple(data), flag[0]) for c, (data, flag) in d.items()) for d in out)
