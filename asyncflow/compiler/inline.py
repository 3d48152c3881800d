"""Function inlining: replace each call node by the function's body, wired in place.

As TensorFlow's ``InlineFunctionBody`` (``common_runtime/function.cc``): the body's
nodes are copied into the graph under the call's name as a prefix
(``call/mul``), on the call's device unless they ask for one of their own.  Uses
of an argument become uses of the call's input (through an ``Identity`` named
after the argument when the call has control inputs, which it then carries).

The body's input-less nodes (constants, an assertion on a constant) are gated on
the call's inputs, as by TF's *input control node*: they wait for every input's
producer and the call's control inputs — through a ``NoOp``
(``call/input_control_node``) when that is more than one node.  So they run only
when the call would: in the taken branch of a ``cond``, in an iteration that runs
(a dead input's producer is dead, and so is the control edge it sends).  A
``Switch`` is the exception: its control edges are live whichever branch is taken,
so an input taken from a ``Switch`` passes an ``Identity`` (named after the
argument), dead with the untaken branch, and the wait is on that.  A fed input is
never dead and is not waited for.  The call node itself becomes an ``Identity`` (one
output), an ``IdentityN`` (several) or a ``NoOp`` (none) *of the same name* over
the returned tensors, so consumers and fetches of the call are untouched; it also
waits for the body's side-effect-only nodes, as TF's output control node does.
Loop frames of the body are renamed with the prefix, so two inlined calls never
share a frame.  Calls inside an inlined body are inlined by the next round of the
optimizer's fixed-point loop.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from asyncflow.compiler.ir import FUNCTION_ATTR, FunctionIR, NodeDef, Ref, ValueInfo
from asyncflow.compiler.placement import place

__all__ = ["inline_functions"]


def inline_functions(
    nodes: Sequence[NodeDef],
    placement: Sequence[int],
    devices: Sequence[str],
    *,
    feeds: Collection[Ref] = (),
    allow_soft_placement: bool = False,
) -> tuple[tuple[NodeDef, ...], tuple[int, ...], int]:
    """Inline every call of ``nodes``; returns the nodes, their placement and the
    number of calls inlined."""
    if not any(FUNCTION_ATTR in n.attrs for n in nodes):
        return tuple(nodes), tuple(placement), 0
    taken = {n.name for n in nodes}
    ops = {n.name: n.op for n in nodes}
    out: list[NodeDef] = []
    where: list[int] = []
    calls = 0
    for node, d in zip(nodes, placement):
        fn = node.attrs.get(FUNCTION_ATTR)
        if fn is None:
            out.append(node)
            where.append(d)
            continue
        body = _inlined_body(node, fn, taken, _input_waits(node, ops, feeds))
        for b in body:
            out.append(b)
            where.append(
                d
                if not b.device or b is body[-1]
                else place([b], devices, allow_soft_placement=allow_soft_placement)[0]
            )
        calls += 1
    return tuple(out), tuple(where), calls


def _input_waits(
    call: NodeDef, ops: Mapping[str, str], feeds: Collection[Ref]
) -> tuple[str | int, ...]:
    """What the input-less body nodes of ``call`` wait for: a producer's name, or
    the index of an input taken from a ``Switch`` (waited for through an Identity)."""
    waits: list[str | int] = list(call.control_inputs)
    for k, r in enumerate(call.inputs):
        op = ops.get(r[0])
        if r in feeds or op is None:
            continue  # fed: never dead
        waits.append(k if op in _SWITCHES else r[0])
    return tuple(dict.fromkeys(waits))


#: Ops whose control edges are live when the output a consumer reads is dead.
_SWITCHES = frozenset({"Switch", "RefSwitch", "_SwitchN"})


def _inlined_body(
    call: NodeDef, fn: FunctionIR, taken: set[str], waits: tuple[str | int, ...]
) -> list[NodeDef]:
    """The body of ``fn`` renamed under ``call``; the last node stands for the call.
    ``waits`` come from :func:`_input_waits`."""
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
    gated = any(not n.inputs and not n.control_inputs and n.name not in args for n in fn.nodes)
    switched = {fn.args[k] for k in waits if isinstance(k, int)} if gated else set()
    out: list[NodeDef] = []
    for n in fn.nodes:
        if n.name in args:
            # The argument waits for the call's control inputs; an input from a
            # Switch is dead with its branch, which the Identity passes on.
            if call.control_inputs or n.name in switched:
                out.append(
                    NodeDef(
                        names[n.name],
                        "Identity",
                        (args[n.name],),
                        call.control_inputs,
                        call.device,
                        {},
                        n.outputs,
                        n.outputs,
                        False,
                        call.traceback,
                    )
                )
                args[n.name] = (names[n.name], 0)
            continue
    # What the body's input-less nodes wait for: one node, or a NoOp after several.
    start = tuple(w if isinstance(w, str) else args[fn.args[w]][0] for w in waits)
    if not gated:
        start = ()
    elif len(start) > 1:
        control = unique("input_control_node")
        out.append(
            NodeDef(control, "NoOp", (), start, call.device, {}, (), (), False, call.traceback)
        )
        start = (control,)

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
        out.append(
            n._replace(
                name=names[n.name],
                inputs=inputs,
                control_inputs=controls,
                attrs=_renamed_attrs(n.attrs, prefix, names),
            )
        )
    rets = tuple(ref(r) for r in fn.rets)
    returned = {r[0] for r in fn.rets}
    side_effects = tuple(
        names[n.name]
        for n in fn.nodes
        if (n.stateful or not n.outputs)
        and n.name not in used
        and n.name not in returned
        and n.name not in fn.args
    )
    op = "Identity" if len(rets) == 1 else ("NoOp" if not rets else "IdentityN")
    attrs = {k: v for k, v in call.attrs.items() if k == "_class"}
    out.append(
        NodeDef(
            call.name,
            op,
            rets,
            side_effects,
            call.device,
            attrs,
            call.outputs,
            tuple(ValueInfo(o.dtype, o.shape) for o in call.outputs),
            False,
            call.traceback,
        )
    )
    return out


def _renamed_attrs(attrs: Any, prefix: str, names: dict[str, str]) -> Any:
    """Frame names and colocation references of a body node, under the call's prefix."""
    if "frame_name" not in attrs and "_class" not in attrs:
        return attrs
    new = dict(attrs)
    if "frame_name" in new:
        new["frame_name"] = prefix + new["frame_name"]
    if "_class" in new:
        new["_class"] = [
            f"loc:@{names.get(c[5:], c[5:])}" if isinstance(c, str) and c.startswith("loc:@") else c
            for c in new["_class"]
        ]
    return new
