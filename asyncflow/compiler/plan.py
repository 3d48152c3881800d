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
from typing import Any, NamedTuple

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
    slots = _lay_out_slots(part)
    sched = slots.sched
    n = len(sched)
    edges = _edges(slots)
    retval_slots = tuple(slots.slot(r) for _, r in part.retvals)
    frees, counted, refs = _last_use(slots, edges, retval_slots)
    frames, edges_out, loop_schedules = _propagation(part, slots, edges)
    pending = edges.pending
    return Plan(
        partition=part,
        nodes=tuple(sched),
        inputs=tuple(edges.in_slots),
        out=tuple(slots.out_slots),
        consumers=tuple(edges.consumers),
        frees=tuple(frees),
        counted=tuple(counted),
        initial_pending=tuple(pending),
        initial_ready=tuple(itertools.compress(range(n), map(operator.not_, pending))),
        initial_values=tuple(slots.initial_values),
        initial_refs=tuple(refs) if refs is not None else None,
        arg_slots=slots.arg_slots,
        retval_slots=retval_slots,
        num_slots=slots.n_slots,
        frames=frames,
        edges_out=edges_out,
        loop_schedules=loop_schedules,
    )


class _Slots:
    """Where every value of a partition lives: the first slot of every node, the
    scheduled nodes, and by slot its producer and preloaded value."""

    __slots__ = (
        "arg_slots",
        "fed_names",
        "fed_slot",
        "initial_values",
        "n_slots",
        "out_slots",
        "owner",
        "sched",
        "slot_of",
    )

    def __init__(self) -> None:
        self.slot_of: dict[str, int] = {}  # node name -> its first slot
        #: By slot, the scheduled node producing it (-1: a preloaded constant or an
        #: argument): an input edge is then one name lookup (its slot), the rest lists.
        self.owner: list[int] = []
        self.sched: list[NodeDef] = []  # the scheduled nodes (preloaded Consts excluded)
        self.out_slots: list[int] = []  # first output slot per scheduled node
        self.fed_slot: dict[Ref, int] = {}  # a fed ref -> its _Arg slot
        self.fed_names: set[str] = set()
        self.arg_slots: tuple[int, ...] = ()
        self.initial_values: list[Any] = []
        self.n_slots = 0

    def slot(self, r: Ref) -> int:
        s = self.fed_slot.get(r) if self.fed_slot else None
        return s if s is not None else self.slot_of[r[0]] + r[1]


def _lay_out_slots(part: PartitionDef) -> _Slots:
    """One pass: every node's first slot, and the scheduled nodes; then the _Arg
    slots and the preloaded constants' values."""
    slots = _Slots()
    slot_of, owner, sched, out_slots = slots.slot_of, slots.owner, slots.sched, slots.out_slots
    preloaded: list[tuple[int, Any]] = []
    n_slots = 0
    for node in part.nodes:
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
    for k, (_, r) in enumerate(part.args):
        slots.fed_slot[r] = n_slots + k
    slots.fed_names = {r[0] for r in slots.fed_slot}
    slots.arg_slots = tuple(range(n_slots, n_slots + len(part.args)))
    n_slots += len(part.args)
    owner.extend([-1] * len(part.args))
    initial_values: list[Any] = [None] * n_slots
    for first, value in preloaded:
        initial_values[first] = value[()] if value.ndim == 0 else value
    slots.initial_values = initial_values
    slots.n_slots = n_slots
    return slots


class _Edges(NamedTuple):
    """Every node's input slots, consumers and pending count, and per slot how many
    distinct nodes read it and the last one that did."""

    in_slots: list[tuple[int, ...]]
    consumers: list[Any]  # (i,) for one consumer, a tuple for more (final)
    pending: list[int]
    reads: list[int]
    last_reader: list[int]
    node_of: dict[str, int] | None  # name -> scheduled index, when control edges made it


def _add_consumer(consumers: list[Any], grown: list[int], p: int, i: int) -> None:
    cs = consumers[p]
    if not cs:  # most nodes have one consumer: a 1-tuple is final already
        consumers[p] = (i,)
    elif type(cs) is tuple:
        consumers[p] = [*cs, i]
        grown.append(p)
    else:
        cs.append(i)


def _edges(slots: _Slots) -> _Edges:
    """The edges of every scheduled node.

    The per-node hot loop of plan building: a 100,000-node chain's first run builds
    its plan here, so the common node (two data inputs, no control input, none fed)
    takes a branch of its own, inline, without lists (its first consumer without a
    call); every other node goes through :func:`_other_edges`."""
    sched, slot_of, owner = slots.sched, slots.slot_of, slots.owner
    fed_names = slots.fed_names
    n = len(sched)
    pending = [0] * n
    consumers: list[Any] = [()] * n  # (i,) for the first consumer, a list for more
    grown: list[int] = []  # the nodes whose consumers became a list
    in_slots: list[tuple[int, ...]] = []
    reads = [0] * slots.n_slots
    last_reader = [-1] * slots.n_slots
    node_of: dict[str, int] | None = None
    edges_of = (in_slots, consumers, grown, pending, reads, last_reader)
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
                    else:
                        _add_consumer(consumers, grown, pa, i)
                    pending[i] = 1
                if sb == sa:
                    continue
                last_reader[sb] = i
                reads[sb] += 1
                pb = owner[sb]
                if pb >= 0 and pb != pa:
                    _add_consumer(consumers, grown, pb, i)
                    pending[i] += 1
                continue
        node_of = _other_edges(slots, edges_of, node, i, node_of)
    for p in grown:  # only the entries that grew into lists become tuples
        consumers[p] = tuple(consumers[p])
    return _Edges(in_slots, consumers, pending, reads, last_reader, node_of)


def _other_edges(
    slots: _Slots,
    edges_of: tuple[list[tuple[int, ...]], list[Any], list[int], list[int], list[int], list[int]],
    node: NodeDef,
    i: int,
    node_of: dict[str, int] | None,
) -> dict[str, int] | None:
    """The edges of scheduled node ``i`` of any shape: its producers (data and
    control, each once) kept in a small list.  Returns ``node_of`` (name -> index,
    made on the first control edge)."""
    in_slots, consumers, grown, pending, reads, last_reader = edges_of
    slot_of, owner, fed_slot, fed_names = (
        slots.slot_of,
        slots.owner,
        slots.fed_slot,
        slots.fed_names,
    )
    ins_list: list[int] = []
    producers: list[int] = []
    for r in node.inputs:
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
            node_of = {m.name: j for j, m in enumerate(slots.sched)}
        for c in node.control_inputs:
            p = node_of.get(c, -1)
            if p >= 0 and p not in producers:
                producers.append(p)
    in_slots.append(tuple(ins_list))
    pending[i] = len(producers)
    for p in producers:
        _add_consumer(consumers, grown, p, i)
    return node_of


def _add_free(frees: list[Any], freeing: list[int], node: int, s: int) -> None:
    f = frees[node]
    if not f:
        frees[node] = (s,)
    elif type(f) is tuple:
        frees[node] = [*f, s]
        freeing.append(node)
    else:
        f.append(s)


def _last_use(
    slots: _Slots, edges: _Edges, retval_slots: tuple[int, ...]
) -> tuple[list[Any], list[Any], list[int] | None]:
    """Who frees each slot: its sole reader, its producer when nobody reads it, or
    every reader releasing one reference when several do (fetched, fed and preloaded
    slots are never freed).  Returns (frees, counted, initial refs or None)."""
    n = len(slots.sched)
    keep = set(slots.arg_slots)
    keep.update(retval_slots)
    initial_values, owner = slots.initial_values, slots.owner
    reads, last_reader, in_slots = edges.reads, edges.last_reader, edges.in_slots
    frees: list[Any] = [()] * n  # as consumers: (s,), then a list
    freeing: list[int] = []  # the nodes whose frees became a list
    refs: list[int] | None = None
    for s in range(slots.n_slots):
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
                else:
                    _add_free(frees, freeing, reader, s)
        elif k == 0:  # an output nobody reads: freed by its producer
            producer = owner[s]
            if producer >= 0 and s not in keep:
                _add_free(frees, freeing, producer, s)
        elif s not in keep and initial_values[s] is None:
            if refs is None:
                refs = [0] * slots.n_slots
            refs[s] = k
    for p in freeing:
        frees[p] = tuple(frees[p])
    counted = _counted(in_slots, refs) if refs is not None else [()] * n
    return frees, counted, refs


def _counted(in_slots: list[tuple[int, ...]], refs: list[int]) -> list[Any]:
    """Per node, the reference counted slots it reads (each once): every reader
    releases one reference."""
    counted: list[Any] = [()] * len(in_slots)
    for i, ins in enumerate(in_slots):
        mine = tuple(s for s in dict.fromkeys(ins) if refs[s])
        if mine:
            counted[i] = mine
    return counted


def _propagation(
    part: PartitionDef, slots: _Slots, edges: _Edges
) -> tuple[FrameInfo | None, EdgesOut, tuple[LoopSchedule | None, ...]]:
    """How readiness propagates: loops get frames, out-edges and their straight-line
    schedules (the frame propagator); control flow without loops gets the Switches
    and Merges (dead tensors, the plain propagator); the rest nothing."""
    sched = slots.sched
    ops = {node.op for node in sched}
    if "Enter" in ops:  # loops: the frame propagator
        frames = analyze_frames(sched, node_frames(sched))
        node_of = edges.node_of
        if node_of is None:
            node_of = {node.name: i for i, node in enumerate(sched)}
        edges_out = _edges_out(sched, node_of, edges.in_slots, slots.fed_slot)
        loop_schedules = schedule_loops(
            sched, frames, edges.in_slots, slots.out_slots, edges.consumers, slots.initial_values
        )
        return frames, edges_out, loop_schedules
    if not ops.isdisjoint(CONTROL_FLOW_OPS) or (part.control_flow and "_Recv" in ops):
        return cond_info(sched), (), ()  # dead tensors, one frame: the plain propagator
    return None, (), ()


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
