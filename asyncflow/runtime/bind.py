"""Binding: a compiled plan's kernels, instantiated against a session's resources.

This is the one place where compiled values meet the runtime: for every scheduled
node of a :class:`~asyncflow.compiler.plan.Plan`, the kernel factory registered for
its op type is called with the node (an IR ``NodeDef``) and, when it asks, the
session's resource manager.  The result is a :class:`BoundPlan`: the plan, one
:class:`BoundNode` tuple per node (what the executor's hot loop unpacks), and the
device the partition runs on.  Binding happens once per plan and session, never
per step.

``_Send`` / ``_Recv`` kernels are defined here: they move values through the step's
rendezvous under the edge's key, once per loop iteration when the edge is inside a
loop frame.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from asyncflow import errors
from asyncflow.compiler.ir import FUNCTION_ATTR
from asyncflow.compiler.keys import frame_key
from asyncflow.compiler.loop_schedule import root_runs_straight_line
from asyncflow.config import ExecutorOptions
from asyncflow.framework import registry

if TYPE_CHECKING:
    from asyncflow.compiler.ir import NodeDef
    from asyncflow.compiler.plan import Plan
    from asyncflow.runtime.devices import LocalDevice
    from asyncflow.runtime.rendezvous import Rendezvous, Waiter

__all__ = [
    "SEND_TOKEN",
    "SPECIAL",
    "BoundNode",
    "BoundPlan",
    "RecvKernel",
    "SendKernel",
    "bind",
    "tap_recv",
]

#: The hot loop's "not on the fast path" kind: control-flow routing (Switch, Merge,
#: and the producers of a Merge's inputs, whose deadness the Merge counts).  Such a
#: node keeps its kernel's own kind in ``BoundNode.flow``.
SPECIAL = 6

_TOKEN = np.bool_(True)  # what a control-edge _Send carries


class BoundNode(NamedTuple):
    """One scheduled node, ready to run.  Field order is the hot loop's unpack order."""

    kernel: Callable[..., Any]
    kind: int  # registry.INLINE (fast path) / ASYNC / EXPENSIVE / SEND / RECV / CONTROL / SPECIAL
    arity: int  # len(inputs), stored so the hot loop need not call len()
    inputs: tuple[int, ...]  # input slots
    out: int  # first output slot
    num_outputs: int
    consumers: tuple[int, ...]  # nodes whose pending count this node decrements
    frees: tuple[int, ...]  # slots to clear after running (sole reader / unread output)
    counted: tuple[int, ...]  # slots to release by reference count after running
    getter: Callable[[list[Any]], tuple[Any, ...]] | None  # itemgetter for >2 inputs
    flow: int  # the kernel's own kind (differs from ``kind`` for SPECIAL)


@dataclass(frozen=True, slots=True, eq=False, weakref_slot=True)
class BoundPlan:
    """A plan with its kernels: what one :class:`~asyncflow.runtime.step.Step` runs."""

    plan: Plan
    nodes: tuple[BoundNode, ...]
    #: Looks up the user's graph op of a node by name (None: the IR node stands for it).
    op_lookup: Callable[[str], Any] | None
    device: LocalDevice
    #: Every node runs synchronously (inline kernels, Switch / Merge / Enter / Exit /
    #: NextIteration routing): a step may run to completion without awaiting.
    all_inline: bool
    #: Loops in the partition: readiness propagates through frames and iterations.
    frames: bool
    #: Only inline kernels and no control flow but loops that run as one instruction
    #: each (no dead tensor, nothing routed in the root frame), or, without control
    #: flow, async calls the program starts and joins (``program_starts``): steps may
    #: run its
    #: static order in the straight-line interpreter
    #: (:mod:`asyncflow.runtime.interpreter`; ``root_runs_straight_line``).
    schedulable: bool = False
    #: Some node is a ``_Recv`` (its value arrives from another partition).
    receives: bool = False
    #: How its steps run (chosen when the plan is bound).
    options: ExecutorOptions = field(default_factory=ExecutorOptions)
    #: What the runtime derives from the plan once and keeps with it (the static
    #: schedule, the traced kernels), keyed by what it is.
    derived: dict[str, Any] = field(default_factory=dict)

    @property
    def ops(self) -> tuple[Any, ...]:
        """What errors name for each node: the user's graph op when there is one, else
        the IR node.  Made on first use (errors, dead values, traces, loop programs
        ask; a large plan's first run does not)."""
        ops: tuple[Any, ...] | None = self.derived.get("ops")
        if ops is None:
            ref = self.derived.get("base")  # an observed copy: its plan's (held there)
            base = ref() if ref is not None else None
            if base is not None:
                return base.ops  # type: ignore[no-any-return]
            lookup = self.op_lookup
            if lookup is None:
                ops = self.plan.nodes
            else:
                ops = tuple(
                    [op if (op := lookup(n.name)) is not None else n for n in self.plan.nodes]
                )
            self.derived["ops"] = ops
        return ops

    def __repr__(self) -> str:
        return (
            f"<BoundPlan {self.plan.device} nodes={len(self.nodes)} "
            f"all_inline={self.all_inline} frames={self.frames}>"
        )


_DEFAULT_OPTIONS = ExecutorOptions()

#: A BoundNode from a ready tuple of its fields (no Python-level __new__ per node).
_new_bound: Any = functools.partial(tuple.__new__, BoundNode)


def bind(
    plan: Plan,
    device: LocalDevice,
    resources: Any = None,
    op_lookup: Callable[[str], Any] | None = None,
    options: ExecutorOptions | None = None,
) -> BoundPlan:
    """Instantiate the kernels of ``plan`` for ``device`` (and ``resources``); its steps
    run as ``options`` say (default: the fastest way)."""
    options = options if options is not None else _DEFAULT_OPTIONS
    kernel_cache: dict[str, registry.KernelDef] = {}
    static: dict[str, tuple[Callable[..., Any], int]] = {}  # kernels of static factories
    # A Merge is control flow: a plan without frame information has none.
    merges = (
        {i for i, node in enumerate(plan.nodes) if node.op == "Merge"}
        if plan.frames is not None
        else set()
    )
    merge_inputs = (
        {p for p, cons in enumerate(plan.consumers) if any(c in merges for c in cons)}
        if merges
        else set()
    )
    nodes: list[BoundNode] = []
    all_inline = True
    receives = False
    bodies: dict[Any, Any] = {}  # function bodies bound for this plan, shared by its calls
    # The kernels of static INLINE factories, by op type: a node of one of them with
    # at most two inputs, no attributes and no Merge to feed is bound in one step.
    plain: dict[str, Callable[..., Any]] = {}
    inline = registry.INLINE
    for i, (node, ins, out, consumers, frees, counted) in enumerate(
        zip(plan.nodes, plan.inputs, plan.out, plan.consumers, plan.frees, plan.counted)
    ):
        op_type = node.op
        if not node.attrs and len(ins) <= 2:
            kernel = plain.get(op_type)
            if kernel is not None:
                nodes.append(
                    _new_bound(
                        (
                            kernel,
                            inline,
                            len(ins),
                            ins,
                            out,
                            len(node.outputs),
                            consumers,
                            frees,
                            counted,
                            None,
                            inline,
                        )
                    )
                )
                continue
        known = static.get(op_type)
        if FUNCTION_ATTR in node.attrs:  # a call the optimizer did not inline
            kernel, flow = _call_kernel(node, device, resources, bodies, op_lookup, options)
        elif known is not None:
            kernel, flow = known
        else:
            kdef = _kernel_def(node, device, kernel_cache, op_lookup)
            kernel, flow = kdef.instantiate(node, resources)
            if kdef.static:
                static[op_type] = (kernel, flow)
                if flow == inline and not merge_inputs:
                    plain[op_type] = kernel
        kind = flow
        if flow == registry.INLINE:
            if merge_inputs and i in merge_inputs:
                kind = SPECIAL
        elif flow != registry.CONTROL:
            all_inline = False
            if flow == registry.RECV:
                receives = True
        arity = len(ins)
        nodes.append(
            _new_bound(
                (
                    kernel,
                    kind,
                    arity,
                    ins,
                    out,
                    len(node.outputs),
                    consumers,
                    frees,
                    counted,
                    operator.itemgetter(*ins) if arity > 2 else None,
                    flow,
                )
            )
        )
    # One program for the partition: frame-free, or loops as instructions of the root
    # frame's program (see ``root_runs_straight_line``).  A program hands a node to the
    # step's dispatch when its kernel's ``nowait`` twin cannot finish it inline, and
    # starts the async calls of a frame-free partition (``program_starts``).
    schedulable = options.straight_line and root_runs_straight_line(
        plan.frames, plan.loop_schedules, nodes, plan
    )
    return BoundPlan(
        plan,
        tuple(nodes),
        op_lookup,
        device,
        all_inline,
        plan.loops,
        schedulable,
        receives,
        options,
    )


def _kernel_def(
    node: NodeDef,
    device: LocalDevice,
    cache: dict[str, registry.KernelDef],
    op_lookup: Callable[[str], Any] | None,
) -> registry.KernelDef:
    """The registered kernel of ``node``'s op for ``device`` (looked up once per op
    type and plan); a missing one is a ``NotFoundError`` naming the node."""
    kdef = cache.get(node.op)
    if kdef is None:
        try:
            kdef = cache[node.op] = registry.get_kernel(node.op, device.device_type)
        except errors.NotFoundError as exc:
            raise errors.NotFoundError(
                None, _op_for(node, op_lookup), f"{exc.message} (needed by node {node.name!r})"
            ) from None
    return kdef


def _call_kernel(
    node: NodeDef,
    device: LocalDevice,
    resources: Any,
    bodies: dict[Any, Any],
    op_lookup: Callable[[str], Any] | None,
    options: ExecutorOptions,
) -> tuple[Callable[..., Any], int]:
    """The kernel of a call node, from the factory registered under ``registry.CALL``
    (:mod:`asyncflow.runtime.function_call`'s); its body runs with the caller's
    ``options``."""
    try:
        kdef = registry.get_kernel(registry.CALL, device.device_type)
    except errors.NotFoundError as exc:
        raise errors.NotFoundError(
            None,
            _op_for(node, op_lookup),
            f"{exc.message} (needed by function call {node.name!r} of {node.op})",
        ) from None
    return kdef.factory(node, device, resources, bodies, options)


def _op_for(node: NodeDef, op_lookup: Callable[[str], Any] | None) -> Any:
    if op_lookup is not None:
        op = op_lookup(node.name)
        if op is not None:
            return op
    return node


# -- _Send / _Recv ----------------------------------------------------------------------
# A transfer kernel takes (rendezvous, frame_id, iter_id, ...): the key of an edge inside
# a loop names the frame instance and the iteration (TF's frame_iter).  A send takes
# (value, is_dead) and never blocks; a recv takes the step's waiter and returns the
# (value, is_dead) already queued, or None when the waiter will get it (see
# Rendezvous.recv_or_wait).  Observers (streaming, progress) wrap a recv kernel with
# tap_recv; the executor calls the rendezvous itself only for unwrapped kernels.

#: What a control edge's _Send carries.
SEND_TOKEN = _TOKEN


class SendKernel:
    """A ``_Send`` kernel: ``kernel(rendezvous, frame_id, iter_id, [value,] is_dead)``.

    Its ``key`` is public so that the executor may call ``rendezvous.send`` itself for
    an edge outside loops (the common case: one Python call less per edge).
    """

    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key

    def __call__(
        self, rendezvous: Rendezvous, frame_id: int, iter_id: int, *value_and_dead: Any
    ) -> None:
        # (value, is_dead), or (is_dead,) for a control edge (it carries a token).
        *value, is_dead = value_and_dead
        key = self.key if not (frame_id or iter_id) else frame_key(self.key, frame_id, iter_id)
        rendezvous.send(key, value[0] if value else _TOKEN, is_dead)

    def __repr__(self) -> str:
        return f"<SendKernel {self.key!r}>"


class RecvKernel:
    """A ``_Recv`` kernel: ``kernel(rendezvous, frame_id, iter_id, waiter)`` -> the
    ``(value, is_dead)`` already queued, or None (``waiter`` gets it); see
    ``Rendezvous.recv_or_wait``.  ``key`` is public, as :class:`SendKernel`'s."""

    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key

    def __call__(
        self, rendezvous: Rendezvous, frame_id: int, iter_id: int, waiter: Waiter
    ) -> tuple[Any, bool] | None:
        key = self.key if not (frame_id or iter_id) else frame_key(self.key, frame_id, iter_id)
        return rendezvous.recv_or_wait(key, waiter)

    def __repr__(self) -> str:
        return f"<RecvKernel {self.key!r}>"


@registry.register_kernel_factory("_Send")
def _send_kernel(node: NodeDef) -> tuple[Callable[..., Any], int]:
    return SendKernel(node.attrs["key"]), registry.SEND


@registry.register_kernel_factory("_Recv")
def _recv_kernel(node: NodeDef) -> tuple[Callable[..., Any], int]:
    return RecvKernel(node.attrs["key"]), registry.RECV


def tap_recv(
    kernel: Callable[..., Any], on_item: Callable[[tuple[Any, bool]], None]
) -> Callable[..., Any]:
    """A ``_Recv`` kernel that also calls ``on_item((value, is_dead))`` when its value
    arrives, at once or later (for observers: streaming, progress)."""

    def recv(
        rendezvous: Rendezvous, frame_id: int, iter_id: int, waiter: Waiter
    ) -> tuple[Any, bool] | None:
        item: tuple[Any, bool] | None = kernel(rendezvous, frame_id, iter_id, _Tap(waiter, on_item))
        if item is not None:
            on_item(item)
        return item

    return recv


class _Tap:
    """A waiter passing its value to an observer on the way to the recv's own waiter."""

    __slots__ = ("on_item", "waiter")

    def __init__(self, waiter: Waiter, on_item: Callable[[tuple[Any, bool]], None]) -> None:
        self.waiter = waiter
        self.on_item = on_item

    def done(self) -> bool:
        return self.waiter.done()

    def set_result(self, result: tuple[Any, bool], /) -> None:
        self.on_item(result)
        self.waiter.set_result(result)

    def set_exception(self, exception: BaseException, /) -> None:
        self.waiter.set_exception(exception)
