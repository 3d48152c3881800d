"""Function inlining: replace each call node by the function's body, wired in place.

As TensorFlow's ``InlineFunctionBody`` (``common_runtime/function.cc``): the body's
nodes are copied into the graph under the call's name as a prefix
(``call/mul``), on the call's device unless they ask for one of their own.  Uses
of an argument become uses of the call's input (through an ``Identity`` named
after the argument when the call has control inputs, which it then carries, or
when the body has input-less nodes).  The body's input-less nodes (constants, an
assertion on a constant) are gated on the call's inputs as by TF's *input control
node*: a ``NoOp`` (``call/input_control_node``) after every argument's ``Identity``
(and the call's control inputs) is a control input of each.  So they run only when
the call would: in the taken branch of a ``cond`` and in an iteration that runs
(an untaken input is dead, and so are the ``Identity`` and the ``NoOp``).  The call node itself becomes an ``Identity`` (one
output), an ``IdentityN`` (several) or a ``NoOp`` (none) *of the same name* over
the returned tensors, so consumers and fetches of the call are untouched; it also
waits for the body's side-effect-only nodes, as TF's output control node does.
Loop frames of the body are renamed with the prefix, so two inlined calls never
share a frame.  Calls inside an inlined body are inlined by the next round of the
optimizer's fixed-point loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from asyncflow.compiler.ir import FUNCTION_ATTR, FunctionIR, NodeDef, Ref, ValueInfo
from asyncflow.compiler.placement import place

__all__ = ["inline_functions"]


def inline_functions(nodes: Sequence[NodeDef], placement: Sequence[int], devices: Sequence[str],
                     *, allow_soft_placement: bool = False
                     ) -> tuple[tuple[NodeDef, ...], tuple[int, ...], int]:
    """Inline every call of ``nodes``; returns the nodes, their placement and the
    number of calls inlined."""
    if not any(FUNCTION_ATTR in n.attrs for n in nodes):
        return tuple(nodes), tuple(placement), 0
    taken = {n.name for n in nodes}
    out: list[NodeDef] = []
    where: list[int] = []
    calls = 0
    for node, d in zip(nodes, placement):
        fn = node.attrs.get(FUNCTION_ATTR)
        if fn is None:
            out.append(node)
            where.append(d)
            continue
        body = _inlined_body(node, fn, taken)
        for b in body:
            out.append(b)
            where.append(d if not b.device or b is body[-1] else
                         place([b], devices, allow_soft_placement=allow_soft_placement)[0])
        calls += 1
    return tuple(out), tuple(where), calls


def _inlined_body(call: NodeDef, fn: FunctionIR, taken: set[str]) -> list[NodeDef]:
    """The body of ``fn`` renamed under ``call``; the last node stands for the call."""
    prefix = call.name + "/"

    def unique(base: str) -> str:
        name, k = prefix + base, 0
        while name in taken:
            k += 1
            name = f"{prefix}{base}_{k}"
        taken.add(name)
        return name

    names = {n.name: unique(n.name) for n in fn.nodes}
    args = dict(zip(fn.args, call.inputs))
    gated = any(not n.inputs and not n.control_inputs and n.name not in args
                for n in fn.nodes)
    out: list[NodeDef] = []
    for n in fn.nodes:
        if n.name in args:
            # The argument waits for the call's control inputs; a dead input makes
            # it dead, which the input control node passes on.
            if call.control_inputs or gated:
                out.append(NodeDef(names[n.name], "Identity", (args[n.name],),
                                   call.control_inputs, call.device, {}, n.outputs,
                                   n.outputs, False, call.traceback))
                args[n.name] = (names[n.name], 0)
            continue
    start: tuple[str, ...] = ()  # what the body's input-less nodes wait for
    if gated:
        waits = tuple(args[a][0] for a in fn.args if a in args) or call.control_inputs
        if waits:
            start = (unique("input_control_node"),)
            out.append(NodeDef(start[0], "NoOp", (), waits, call.device, {}, (), (),
                               False, call.traceback))

    def ref(r: Ref) -> Ref:
        return args[r[0]] if r[0] in args else (names[r[0]], r[1])

    used: set[str] = set()
    for n in fn.nodes:
        if n.name in fn.args:
            continue
        inputs = tuple(ref(r) for r in n.inputs)
        controls = tuple(args[c][0] if c in args else names[c] for c in n.control_inputs)
        if not inputs and not controls:
            controls = start  # input-less nodes start with the call
        used.update(r[0] for r in n.inputs)
        used.update(n.control_inputs)
        out.append(n._replace(name=names[n.name], inputs=inputs, control_inputs=controls,
                           attrs=_renamed_attrs(n.attrs, prefix, names)))
    rets = tuple(ref(r) for r in fn.rets)
    returned = {r[0] for r in fn.rets}
    side_effects = tuple(names[n.name] for n in fn.nodes
                         if (n.stateful or not n.outputs) and n.name not in used
                         and n.name not in returned and n.name not in fn.args)
    op = "Identity" if len(rets) == 1 else ("NoOp" if not rets else "IdentityN")
    attrs = {k: v for k, v in call.attrs.items() if k == "_class"}
    out.append(NodeDef(call.name, op, rets, side_effects, call.device, attrs, call.outputs,
                       tuple(ValueInfo(o.dtype, o.shape) for o in call.outputs),
                       False, call.traceback))
    return out


def _renamed_attrs(attrs: Any, prefix: str, names: dict[str, str]) -> Any:
    """Frame names and colocation references of a body node, under the call's prefix."""
    if "frame_name" not in attrs and "_class" not in attrs:
        return attrs
    new = dict(attrs)
    if "frame_name" in new:
        new["frame_name"] = prefix + new["frame_name"]
    if "_class" in new:
        new["_class"] = [f"loc:@{names.get(c[5:], c[5:])}" if isinstance(c, str)
                         and c.startswith("loc:@") else c for c in new["_class"]]
    return new
