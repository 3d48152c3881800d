"""Convolution rewrites of the optimizer: fold inference batch norms, fuse bias + activation.

Frozen inference graphs follow each convolution by a batch norm — a
``FusedBatchNorm*`` with ``is_training=False``, or, in graphs Keras exports, its
decomposition ``Sub(mean)`` / ``Mul(scale)`` / ``AddV2(beta)`` after constant folding
made the scale a constant — and then a bias and an activation; Keras also pads before
each strided convolution.  Each of those ops is a full pass over the activation.  As
TensorFlow's Grappler does (its remapper and ``FoldMultiplyIntoConv``), three passes
rewrite them:

* :func:`fold_batch_norms`: a ``Conv2D`` / ``DepthwiseConv2dNative`` (NHWC) with a
  constant filter, followed by a chain of per-channel affine ops with constant
  operands (``BiasAdd``, ``Add``/``AddV2``, ``Sub``, ``Mul``, inference
  ``FusedBatchNorm*``), becomes the convolution with a scaled filter and one
  ``BiasAdd``: ``conv(x, W) * a + b == conv(x, W * a) + b``.
* :func:`fold_pads`: a zero ``Pad`` of height and width before a ``VALID``
  convolution becomes the convolution's explicit padding.
* :func:`fuse_conv_bias_activation`: a convolution, its ``BiasAdd``, an optional
  residual ``Add`` (a ResNet's shortcut) and an optional ``Relu`` / ``Relu6`` become
  one ``_FusedConv2D`` node whose kernel adds the bias (and the residual) and clamps
  on the convolution's output.

A chain is only rewritten through values nothing else sees: every intermediate has
exactly one consumer, is neither fed nor fetched, and has no control edges.  The last
node of a chain keeps its name (and its consumers), so fetching it still works.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence

import numpy as np

from asyncflow import dtypes
from asyncflow.compiler.ir import NodeDef, Ref, ValueInfo
from asyncflow.framework.shapes import TensorShape

__all__ = [
    "FUSED_CONV",
    "fold_batch_norms",
    "fold_pads",
    "fuse_conv_bias_activation",
    "rewrite_convolutions",
]

#: The op type of a convolution fused with its bias and activation.
FUSED_CONV = "_FusedConv2D"

_CONVS = frozenset({"Conv2D", "DepthwiseConv2dNative"})
_BATCH_NORMS = frozenset({"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"})
_ACTIVATIONS = frozenset({"Relu", "Relu6"})

Nodes = tuple[tuple[NodeDef, ...], tuple[int, ...], bool]


def rewrite_convolutions(
    nodes: Sequence[NodeDef],
    placement: Sequence[int],
    *,
    feeds: Collection[Ref],
    protected: Collection[str],
) -> Nodes:
    """The three rewrites: pads into convolutions, then batch norms (a folded chain ends
    in the ``BiasAdd`` the fusion takes), then bias + activation.  Each rewrite
    starts at a convolution: a graph without one is returned as it is, without the
    lookups the rewrites build over every node."""
    if not any(n.op in _CONVS for n in nodes):
        return tuple(nodes), tuple(placement), False
    changed = False
    for rewrite in (fold_pads, fold_batch_norms, fuse_conv_bias_activation):
        nodes, placement, did = rewrite(nodes, placement, feeds=feeds, protected=protected)
        changed |= did
    return tuple(nodes), tuple(placement), changed


class _Graph:
    """The lookups both passes need: nodes by name, data uses per node, constants."""

    def __init__(
        self, nodes: Sequence[NodeDef], feeds: Collection[Ref], protected: Collection[str]
    ) -> None:
        self.by_name = {n.name: n for n in nodes}
        self.uses: Counter[str] = Counter()
        self.consumer: dict[str, str] = {}  # a node's last data consumer
        self.controlled: set[str] = set()  # nodes named by a control edge
        self.side_outputs_used: set[str] = set()  # nodes whose output 1, 2, ... is read
        for n in nodes:
            for r in n.inputs:
                self.uses[r[0]] += 1
                self.consumer[r[0]] = n.name
                if r[1]:
                    self.side_outputs_used.add(r[0])
            self.controlled.update(n.control_inputs)
        self.fed = {r[0] for r in feeds}
        self.protected = set(protected)

    def sole_consumer(self, name: str) -> NodeDef | None:
        """The one node using ``name``'s output 0, when ``name``'s value is private to it."""
        if (
            self.uses[name] != 1
            or name in self.protected
            or name in self.fed
            or name in self.controlled
        ):
            return None
        nxt = self.by_name[self.consumer[name]]
        return None if nxt.control_inputs else nxt

    def const(self, ref: Ref) -> np.ndarray | None:
        node = self.by_name.get(ref[0])
        if node is None or node.op != "Const" or node.control_inputs or ref[0] in self.fed:
            return None
        return np.asarray(node.attrs["value"])


# -- folding ------------------------------------------------------------------------------


def _channels(value: np.ndarray | None, o: int) -> np.ndarray | None:
    """``value`` as a per-channel vector of ``o`` entries, if it is one (or a scalar)."""
    if value is None or value.dtype.kind != "f":
        return None
    if value.size == 1:
        return np.full(o, float(value.reshape(-1)[0]))
    if value.size == o and value.shape[-1] == o:
        return value.reshape(o).astype(np.float64)
    return None


def _step(
    g: _Graph, node: NodeDef, cur: str, o: int, a: np.ndarray, b: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """The affine ``(a, b)`` after ``node`` when it is a per-channel op of ``cur``."""
    ins = node.inputs
    if node.op in _BATCH_NORMS:
        if (
            node.attrs.get("is_training", True)
            or node.attrs.get("data_format") != "NHWC"
            or ins[0] != (cur, 0)
            or node.name in g.side_outputs_used
        ):
            return None
        gamma, beta, mean, var = (_channels(g.const(r), o) for r in ins[1:5])
        if gamma is None or beta is None or mean is None or var is None:
            return None
        scale = gamma / np.sqrt(var + float(node.attrs.get("epsilon", 1e-4)))
        return a * scale, b * scale + beta - mean * scale
    if len(ins) != 2 or (cur, 0) not in ins:
        return None
    other = ins[1] if ins[0] == (cur, 0) else ins[0]
    c = _channels(g.const(other), o)
    if c is None:
        return None
    if node.op == "BiasAdd" and ins[0] == (cur, 0) and node.attrs.get("data_format") == "NHWC":
        return a, b + c
    if node.op in ("Add", "AddV2"):
        return a, b + c
    if node.op == "Sub" and ins[0] == (cur, 0):
        return a, b - c
    if node.op == "Mul":
        return a * c, b * c
    return None


def _fold_chain(g: _Graph, conv: NodeDef) -> tuple[list[NodeDef], np.ndarray, np.ndarray] | None:
    """The chain after ``conv`` that folds into it, with its affine ``(a, b)``."""
    if (
        conv.op not in _CONVS
        or conv.attrs.get("data_format") != "NHWC"
        or g.const(conv.inputs[1]) is None
        or not conv.outputs
    ):
        return None
    shape = conv.outputs[0].shape
    o = shape[-1] if shape.rank else None
    if o is None:
        return None
    a, b = np.ones(o), np.zeros(o)
    chain: list[NodeDef] = []
    cur = conv.name
    while (nxt := g.sole_consumer(cur)) is not None:
        if (
            nxt.device != conv.device
            or not nxt.outputs
            or nxt.outputs[0].dtype != conv.outputs[0].dtype
        ):
            break
        stepped = _step(g, nxt, cur, o, a, b)
        if stepped is None:
            break
        a, b = stepped
        chain.append(nxt)
        cur = nxt.name
    if not chain or (len(chain) == 1 and chain[0].op == "BiasAdd"):
        return None  # nothing to fold: a lone bias is the fusion's
    return chain, a, b


def _const_node(name: str, value: np.ndarray, like: NodeDef) -> NodeDef:

    value.flags.writeable = False
    dt = dtypes.as_dtype(value.dtype)
    return NodeDef(
        name,
        "Const",
        device=like.device,
        attrs={"value": value, "dtype": dt},
        outputs=(ValueInfo(dt, TensorShape(value.shape), value),),
        traceback=like.traceback,
    )


def _fresh(name: str, taken: set[str]) -> str:
    k = 0
    out = name
    while out in taken:
        k += 1
        out = f"{name}_{k}"
    taken.add(out)
    return out


def fold_batch_norms(
    nodes: Sequence[NodeDef],
    placement: Sequence[int],
    *,
    feeds: Collection[Ref],
    protected: Collection[str],
) -> Nodes:
    """Fold per-channel affine chains (batch norms) into their convolution's filter."""
    g = _Graph(nodes, feeds, protected)
    taken = set(g.by_name)
    before: dict[str, list[NodeDef]] = {}  # inserted before a node (new constants)
    replace: dict[str, NodeDef] = {}
    drop: set[str] = set()
    for conv in nodes:
        if conv.name in drop or conv.name in replace:
            continue
        found = _fold_chain(g, conv)
        if found is None:
            continue
        chain, a, b = found
        last = chain[-1]
        w = g.const(conv.inputs[1])
        assert w is not None
        scale = a if conv.op == "Conv2D" else a.reshape(w.shape[2], w.shape[3])
        dtype = w.dtype
        fconst = _const_node(
            _fresh(f"{last.name}/folded_filter", taken), (w * scale).astype(dtype), conv
        )
        bconst = _const_node(_fresh(f"{last.name}/folded_bias", taken), b.astype(dtype), conv)
        before[conv.name] = [fconst, bconst]
        replace[conv.name] = conv._replace(
            inputs=(conv.inputs[0], (fconst.name, 0)),
            input_types=(conv.input_types[0], fconst.outputs[0]),
        )
        replace[last.name] = NodeDef(
            last.name,
            "BiasAdd",
            ((conv.name, 0), (bconst.name, 0)),
            device=last.device,
            attrs={"data_format": "NHWC"},
            outputs=last.outputs[:1],
            input_types=(conv.outputs[0], bconst.outputs[0]),
            traceback=last.traceback,
        )
        drop.update(n.name for n in chain[:-1])
    if not replace:
        return tuple(nodes), tuple(placement), False
    return _rebuilt(nodes, placement, before, replace, drop, g)


def _residual(add: NodeDef, bias: NodeDef) -> int | None:
    """Which input of ``add`` is the residual summed onto ``bias``'s output (a ResNet's
    shortcut), when ``add`` is an ``Add`` / ``AddV2`` of two tensors of one shape (no
    broadcast: its output has the convolution's shape): TF's remapper fuses it the same
    way (``_FusedConv2D`` with ``fused_ops=["BiasAdd", "Add", ...]``)."""
    if add.op not in ("Add", "AddV2") or len(add.inputs) != 2:
        return None
    mine = (bias.name, 0)
    if add.inputs.count(mine) != 1:
        return None
    other = 1 - add.inputs.index(mine)
    out, conv_out = add.outputs[0], bias.outputs[0]
    if out.dtype != conv_out.dtype or out.shape.rank != 4 or conv_out.shape.rank != 4:
        return None
    if out.shape.as_list() != conv_out.shape.as_list():
        return None  # (the other input broadcasts the sum to a larger shape)
    return other


def _rebuilt(
    nodes: Sequence[NodeDef],
    placement: Sequence[int],
    before: dict[str, list[NodeDef]],
    replace: dict[str, NodeDef],
    drop: set[str],
    g: _Graph,
) -> Nodes:
    """The nodes with the rewrites applied and constants nothing reads any more dropped."""
    out: list[NodeDef] = []
    where: list[int] = []
    for node, d in zip(nodes, placement):
        if node.name in drop:
            continue
        for new in before.get(node.name, ()):
            out.append(new)
            where.append(d)
        out.append(replace.get(node.name, node))
        where.append(d)
    used = Counter(r[0] for n in out for r in n.inputs)
    keep = [
        k
        for k, n in enumerate(out)
        if not (
            n.op == "Const"
            and not used[n.name]
            and n.name in g.uses
            and n.name not in g.protected
            and n.name not in g.controlled
        )
    ]
    return tuple(out[k] for k in keep), tuple(where[k] for k in keep), True


# -- pads ---------------------------------------------------------------------------------


def _spatial_pads(value: np.ndarray | None) -> list[int] | None:
    """TF's 8 ``explicit_paddings`` for a constant NHWC ``Pad`` of height and width only."""
    if value is None or value.shape != (4, 2) or value.dtype.kind not in "iu":
        return None
    pads = [int(v) for v in value.reshape(-1)]
    if min(pads) < 0 or any(pads[k] for k in (0, 1, 6, 7)):
        return None
    return pads


def fold_pads(
    nodes: Sequence[NodeDef],
    placement: Sequence[int],
    *,
    feeds: Collection[Ref],
    protected: Collection[str],
) -> Nodes:
    """A zero ``Pad`` of height and width feeding a ``VALID`` convolution becomes the
    convolution's ``EXPLICIT`` padding (Keras pads before each strided convolution):
    the kernel pads once, as it would for ``SAME``, instead of a pass of its own."""
    g = _Graph(nodes, feeds, protected)
    replace: dict[str, NodeDef] = {}
    drop: set[str] = set()
    for pad in nodes:
        if pad.op != "Pad" or len(pad.inputs) != 2:
            continue
        conv = g.sole_consumer(pad.name)
        pads = _spatial_pads(g.const(pad.inputs[1]))
        if (
            conv is None
            or pads is None
            or conv.op not in _CONVS
            or conv.inputs[0] != (pad.name, 0)
            or conv.device != pad.device
            or conv.attrs.get("padding") != "VALID"
            or conv.attrs.get("data_format") != "NHWC"
        ):
            continue
        replace[conv.name] = conv._replace(
            inputs=(pad.inputs[0], conv.inputs[1]),
            input_types=(pad.input_types[0], conv.input_types[1]),
            attrs={**conv.attrs, "padding": "EXPLICIT", "explicit_paddings": pads},
        )
        drop.add(pad.name)
    if not replace:
        return tuple(nodes), tuple(placement), False
    return _rebuilt(nodes, placement, {}, replace, drop, g)


# -- fusion -------------------------------------------------------------------------------


def fuse_conv_bias_activation(
    nodes: Sequence[NodeDef],
    placement: Sequence[int],
    *,
    feeds: Collection[Ref],
    protected: Collection[str],
) -> Nodes:
    """Fuse convolution -> ``BiasAdd`` [-> ``Add`` of a residual] [-> ``Relu`` / ``Relu6``]
    into one node."""
    g = _Graph(nodes, feeds, protected)
    replace: dict[str, NodeDef] = {}
    drop: set[str] = set()
    for conv in nodes:
        if conv.op not in _CONVS or conv.attrs.get("data_format") != "NHWC":
            continue
        bias = g.sole_consumer(conv.name)
        if (
            bias is None
            or bias.op != "BiasAdd"
            or bias.inputs[0] != (conv.name, 0)
            or bias.attrs.get("data_format") != "NHWC"
            or bias.device != conv.device
        ):
            continue
        last, ops = bias, ["BiasAdd"]
        inputs, types = [conv.inputs[0], conv.inputs[1], bias.inputs[1]], [bias.input_types[1]]
        add = g.sole_consumer(bias.name)
        residual = None
        if (
            add is not None
            and add.device == conv.device
            and add.name not in drop
            and add.name not in replace
        ):
            # (An Add of two convolutions' outputs is fused into the first one met.)
            residual = _residual(add, bias)
        if add is not None and residual is not None:
            last, ops = add, ["BiasAdd", "Add"]
            inputs.append(add.inputs[residual])
            types.append(add.input_types[residual])
        act = g.sole_consumer(last.name)
        if act is not None and act.op in _ACTIVATIONS and act.device == conv.device:
            last, ops = act, [*ops, act.op]
        replace[last.name] = NodeDef(
            last.name,
            FUSED_CONV,
            tuple(inputs),
            conv.control_inputs,
            last.device,
            {**conv.attrs, "conv_op": conv.op, "fused_ops": tuple(ops)},
            last.outputs[:1],
            (*conv.input_types[:2], *types),
            traceback=conv.traceback,
        )
        fused = {conv.name, bias.name} | (
            {add.name} if add is not None and residual is not None else set()
        )
        drop.update(fused - {last.name})
    if not replace:
        return tuple(nodes), tuple(placement), False
    return _rebuilt(nodes, placement, {}, replace, drop, g)
