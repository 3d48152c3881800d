"""The plan: everything about a run signature that does not change between steps.

``build_plan`` lowers a pruned, placed op list into flat, index-based tables the
executor walks without a single name lookup:

* **slots** — every value a step holds lives at an integer index of one list:
  ``[op outputs..., _Arg values...]``.  ``initial_values`` pre-fills the slots of
  constants, so a ``Const`` without control inputs never runs at all.
* **nodes** — one :class:`NodeDef` tuple per op that runs: its kernel, kind, input
  slots, first output slot, output count, consumer nodes, and the input slots it
  releases when done.
* **pending counts** — ``initial_pending[i]`` is the number of distinct producer
  nodes (data or control) of node ``i``; a node is ready at zero.
* **last use** — a slot read by exactly one node is freed by that node
  (``frees``); a slot read by several is reference counted (``counted`` +
  ``initial_refs``); outputs nobody reads are freed by their producer.
* **call frame** — feeds enter through ``_Arg`` slots (``arg_slots``) and fetches
  leave through ``_Retval`` reads (``retval_slots``); fetched and arg slots are never
  freed.

A plan is immutable and shared by every concurrent step of its signature; kernels
in it must therefore be stateless callables.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from asyncflow import errors
from asyncflow.compiler.frames import FrameInfo, analyze_frames
from asyncflow.framework import registry

if TYPE_CHECKING:
    from asyncflow.framework.graph import Operation, Tensor

__all__ = ["ExecutionPlan", "NodeDef", "build_plan"]


class NodeDef(NamedTuple):
    """One scheduled node.  Field order is the executor's unpack order: keep in sync."""

    kernel: Callable[..., Any]
    kind: int               # registry.INLINE / ASYNC / EXPENSIVE
    arity: int              # len(inputs), stored so the hot loop need not call len()
    inputs: tuple[int, ...]  # input slots
    out: int                # first output slot
    num_outputs: int
    consumers: tuple[int, ...]  # nodes whose pending count this node decrements
    frees: tuple[int, ...]      # slots to clear after running (sole reader / unread output)
    counted: tuple[int, ...]    # slots to release by reference count after running
    getter: Callable[[list[Any]], tuple[Any, ...]] | None  # itemgetter for >2 inputs
    device: int             # index into the plan's devices


@dataclass(frozen=True, slots=True, eq=False)
class ExecutionPlan:
    """The immutable, per-signature executable form of a pruned graph."""

    nodes: tuple[NodeDef, ...]
    ops: tuple[Operation, ...]            # ops[i] is node i's operation (for errors, tracing)
    initial_pending: tuple[int, ...]
    initial_ready: tuple[int, ...]
    initial_values: tuple[Any, ...]
    initial_refs: tuple[int, ...] | None  # None when no slot is reference counted
    arg_slots: tuple[int, ...]
    retval_slots: tuple[int, ...]
    feeds: tuple[Tensor, ...]
    fetches: tuple[Tensor, ...]
    targets: tuple[Operation, ...]
    devices: tuple[str, ...]
    #: True when every node is INLINE: the step runs to completion without awaiting.
    all_inline: bool
    num_slots: int
    #: Control-flow plans only (Switch/Merge/Enter/Exit/NextIteration): the frame of
    #: every node, and per producer its consumers as (node, ((input, slot), ...),
    #: has_control_edge) — what the frame executor needs to track dead edges.
    frames: FrameInfo | None = None
    edges_out: tuple[tuple[tuple[int, tuple[tuple[int, int], ...], bool], ...], ...] = ()

    def __repr__(self) -> str:
        return (f"<ExecutionPlan nodes={len(self.nodes)} feeds={len(self.feeds)} "
                f"fetches={len(self.fetches)} all_inline={self.all_inline}>")


def _preloadable(op: Operation) -> bool:
    return op._type == "Const" and not op._control_inputs


def build_plan(ops: Sequence[Operation], placement: Sequence[int], devices: Sequence[str],
               feeds: Sequence[Tensor], fetches: Sequence[Tensor],
               targets: Sequence[Operation],
               device_types: Sequence[str] | None = None,
               edges: Mapping[Operation, tuple[tuple[Tensor, ...], tuple[Operation, ...]]]
               | None = None, resources: Any = None) -> ExecutionPlan:
    """Lower pruned ``ops`` into an :class:`ExecutionPlan`.

    ``edges`` overrides the inputs and control inputs of some ops (a partition's
    cut edges, see :mod:`asyncflow.compiler.partition`).
    """
    device_types = device_types or ["CPU"] * len(devices)
    # -- slots ------------------------------------------------------------------
    slot_of_op: dict[Operation, int] = {}
    n_slots = 0
    for op in ops:
        slot_of_op[op] = n_slots
        n_slots += len(op._outputs)
    fed_slot: dict[Tensor, int] = {}
    for k, t in enumerate(feeds):
        fed_slot[t] = n_slots + k
    arg_slots = tuple(range(n_slots, n_slots + len(feeds)))
    n_slots += len(feeds)
    initial_values: list[Any] = [None] * n_slots

    def slot(t: Tensor) -> int:
        s = fed_slot.get(t) if fed_slot else None
        return s if s is not None else slot_of_op[t._op] + t._value_index

    # -- nodes -------------------------------------------------------------------
    node_of_op: dict[Operation, int] = {}
    sched: list[Operation] = []
    sched_device: list[int] = []
    for op, dev in zip(ops, placement):
        if _preloadable(op):
            value = op._attrs["value"]
            initial_values[slot_of_op[op]] = value[()] if value.ndim == 0 else value
        else:
            node_of_op[op] = len(sched)
            sched.append(op)
            sched_device.append(dev)

    n = len(sched)
    pending = [0] * n
    consumers: list[list[int]] = [[] for _ in range(n)]
    in_slots: list[tuple[int, ...]] = []
    readers: dict[int, list[int]] = {}
    for i, op in enumerate(sched):
        if edges and op in edges:
            op_inputs, op_controls = edges[op]
        else:
            op_inputs, op_controls = op._inputs, op._control_inputs
        ins = tuple(slot(t) for t in op_inputs)
        in_slots.append(ins)
        producers: set[int] = set()
        for t in op_inputs:
            if fed_slot and t in fed_slot:
                continue
            p = node_of_op.get(t._op)
            if p is not None:
                producers.add(p)
        for c in op_controls:
            p = node_of_op.get(c)
            if p is not None:
                producers.add(p)
        pending[i] = len(producers)
        for p in producers:
            consumers[p].append(i)
        for s in set(ins):
            readers.setdefault(s, []).append(i)

    # -- last use ----------------------------------------------------------------
    keep = set(arg_slots)
    keep.update(slot(t) for t in fetches)
    frees: list[list[int]] = [[] for _ in range(n)]
    counted: list[list[int]] = [[] for _ in range(n)]
    refs: list[int] | None = None
    for s, rs in readers.items():
        if s in keep or initial_values[s] is not None:
            continue
        if len(rs) == 1:
            frees[rs[0]].append(s)
        else:
            if refs is None:
                refs = [0] * n_slots
            refs[s] = len(rs)
            for r in rs:
                counted[r].append(s)
    for i, op in enumerate(sched):
        base = slot_of_op[op]
        for k in range(len(op._outputs)):
            s = base + k
            if s not in readers and s not in keep:
                frees[i].append(s)

    # -- kernels -----------------------------------------------------------------
    nodes: list[NodeDef] = []
    all_inline = True
    has_control_flow = False
    kernel_cache: dict[tuple[str, str], registry.KernelDef] = {}
    for i, op in enumerate(sched):
        dev = sched_device[i]
        key = (op._type, device_types[dev])
        kdef = kernel_cache.get(key)
        if kdef is None:
            try:
                kdef = kernel_cache[key] = registry.get_kernel(*key)
            except errors.NotFoundError as exc:
                raise errors.NotFoundError(
                    None, op, f"{exc.message} (needed by node {op.name!r})") from None
        kernel, kind = kdef.instantiate(op, resources)
        if kind != registry.INLINE:
            all_inline = False
        if kind == registry.CONTROL:
            has_control_flow = True
        ins = in_slots[i]
        nodes.append(NodeDef(
            kernel, kind, len(ins), ins, slot_of_op[op], len(op._outputs), tuple(consumers[i]),
            tuple(frees[i]), tuple(counted[i]),
            operator.itemgetter(*ins) if len(ins) > 2 else None, dev))

    frames = None
    edges_out: tuple[tuple[tuple[int, tuple[tuple[int, int], ...], bool], ...], ...] = ()
    if has_control_flow:
        frames = analyze_frames(sched, node_of_op, feeds, fetches)
        edges_out = _edges_out(sched, node_of_op, in_slots, fed_slot)
    return ExecutionPlan(
        frames=frames,
        edges_out=edges_out,
        nodes=tuple(nodes),
        ops=tuple(sched),
        initial_pending=tuple(pending),
        initial_ready=tuple(i for i in range(n) if not pending[i]),
        initial_values=tuple(initial_values),
        initial_refs=tuple(refs) if refs is not None else None,
        arg_slots=arg_slots,
        retval_slots=tuple(slot(t) for t in fetches),
        feeds=tuple(feeds),
        fetches=tuple(fetches),
        targets=tuple(targets),
        devices=tuple(devices),
        all_inline=all_inline,
        num_slots=n_slots,
    )


def _edges_out(sched: Sequence[Operation], node_of_op: Mapping[Operation, int],
               in_slots: Sequence[tuple[int, ...]], fed_slot: Mapping[Tensor, int]
               ) -> tuple[tuple[tuple[int, tuple[tuple[int, int], ...], bool], ...], ...]:
    out: list[dict[int, tuple[list[tuple[int, int]], list[bool]]]] = [{} for _ in sched]
    for c, op in enumerate(sched):
        for pos, t in enumerate(op._inputs):
            p = node_of_op.get(t._op)
            if p is None or t in fed_slot:
                continue
            out[p].setdefault(c, ([], [False]))[0].append((pos, in_slots[c][pos]))
        for ctrl in op._control_inputs:
            p = node_of_op.get(ctrl)
            if p is not None:
                out[p].setdefault(c, ([], [False]))[1][0] = True
    return tuple(tuple((c, tuple(data), flag[0]) for c, (data, flag) in d.items())
                 for d in out)


def retval_converter(t: Tensor) -> Callable[[Any], Any]:
    """How a fetched value leaves the step: 0-d as a numpy scalar of ``t``'s dtype."""
    np_dtype = t._dtype.np
    scalar_type = np_dtype.type

    def convert(v: Any) -> Any:
        if type(v) is scalar_type:
            return v
        if isinstance(v, np.ndarray):
            if v.dtype != np_dtype:
                v = v.astype(np_dtype)
            if v.ndim == 0:
                return v[()]
            if not v.flags.writeable:
                v = v.copy()
            return v
        return np.asarray(v, dtype=np_dtype)[()]

    return convert
