"""Partitioning: one subgraph per device, joined by ``_Send`` / ``_Recv`` pairs.

Given the pruned, placed IR of a run, every edge whose ends are on different
devices is cut:

* a **data edge** becomes one ``_Send`` on the producer's device and one ``_Recv``
  on the consumer's device per *(source tensor, destination device)* — several
  consumers on that device share the pair;
* a **control edge** becomes a small pair too: the ``_Send`` runs after the source
  node (a control input) and sends a token; the consumer gets the ``_Recv`` as a
  control input.

An edge inside a loop frame is cut the same way; its pair runs once per iteration
(keys carry the frame instance and iteration at run time) and the ``_Recv`` is gated
by the control loop of its frame on its device (:mod:`asyncflow.compiler.control_flow`).
Feeds come from and fetches go to the client, which is on the session's default
device (``devices[0]``), as TF places them: the partition of that device takes a fed
tensor as an ``_Arg`` and returns a fetched one as a ``_Retval``; a consumer or
producer on another device is joined to it by a ``_Send`` / ``_Recv`` pair like any
cut edge.
Every partition is a plain value (:class:`PartitionDef`): picklable, printable and
convertible to a graph def.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from asyncflow import dtypes
from asyncflow.compiler.control_flow import FramePath, Frames
from asyncflow.compiler.ir import NodeDef, Ref, ValueInfo, format_ref
from asyncflow.compiler.keys import create_key
from asyncflow.framework import registry
from asyncflow.framework.graph_def import encode_attr
from asyncflow.framework.shapes import TensorShape

__all__ = ["PartitionDef", "add_client_edges", "partition", "partition_graph_def"]

_TOKEN = ValueInfo(dtypes.bool, TensorShape(()))
#: The index of the client's device (the session's default device), where feeds are.
_CLIENT = 0


def _send_shape(inputs: Sequence[Any], attrs: Mapping[str, Any]) -> list[Any]:
    return []


def _recv_shape(inputs: Sequence[Any], attrs: Mapping[str, Any]) -> list[Any]:
    return [(attrs["dtype"], attrs["shape"])]


registry.define_op("_Send", _send_shape, stateful=True, feedable=False)
registry.define_op("_Recv", _recv_shape, stateful=True, feedable=False)


@dataclass(frozen=True, slots=True, eq=False)
class PartitionDef:
    """The nodes of one device, with their cross-device edges cut.

    ``args`` are ``(feed index, fed tensor)`` for the fed tensors this partition reads;
    ``retvals`` are ``(fetch index, tensor)`` for the fetches it produces; ``targets``
    the names of the target nodes it runs.
    """

    device: str
    nodes: tuple[NodeDef, ...]
    args: tuple[tuple[int, Ref], ...]
    retvals: tuple[tuple[int, Ref], ...]
    targets: tuple[str, ...]
    #: The run has control flow: values received from other devices may be dead.
    control_flow: bool = False

    def __repr__(self) -> str:
        return (
            f"<PartitionDef {self.device} nodes={len(self.nodes)} args={len(self.args)} "
            f"retvals={len(self.retvals)}>"
        )


def partition(
    nodes: Sequence[NodeDef],
    placement: Sequence[int],
    devices: Sequence[str],
    feeds: Sequence[Ref],
    fetches: Sequence[Ref],
    targets: Sequence[str],
    incarnation: int,
    frames: Frames | None = None,
    loops: Mapping[tuple[FramePath, int], str] | None = None,
    control_flow: bool = False,
    client_device: bool = True,
) -> tuple[PartitionDef, ...]:
    """Split placed ``nodes`` into one :class:`PartitionDef` per device used (device order).

    ``frames`` and ``loops`` come from :func:`~asyncflow.compiler.control_flow.add_control_loops`
    when the run has loops spanning devices.  ``client_device=False`` leaves each feed
    with its consumers' partitions and each fetch with its producer's (a distributed
    master hands them to every task itself).
    """
    fed = {r: k for k, r in enumerate(feeds)}
    if (
        placement
        and placement.count(placement[0]) == len(placement)
        and not loops
        and (placement[0] == _CLIENT or not (feeds or fetches) or not client_device)
    ):
        return (
            _one_partition(
                nodes, placement[0], devices, feeds, fed, fetches, targets, control_flow
            ),
        )
    cut = _Cut(nodes, placement, devices, fed, incarnation, frames, loops, client_device)
    nodes_of = cut.nodes_of
    for d in placement:
        nodes_of.setdefault(d, [])
    if client_device and (fetches or any(r in fed for n in nodes for r in n.inputs)):
        nodes_of.setdefault(_CLIENT, [])
    for n, d in zip(nodes, placement, strict=True):
        nodes_of[d].append(cut.cut_node(n, d))
    retvals_of = cut.retvals(fetches)
    targets_of: dict[int, list[str]] = {}
    for name in targets:
        targets_of.setdefault(cut.device_of[name], []).append(name)
    return tuple(
        PartitionDef(
            devices[d],
            tuple(nodes_of[d]),
            tuple((k, feeds[k]) for k in sorted(cut.args_of.get(d, ()))),
            tuple(retvals_of.get(d, ())),
            tuple(targets_of.get(d, ())),
            control_flow,
        )
        for d in sorted(nodes_of)
    )


class _Cut:
    """Cutting placed nodes into partitions: every edge between devices becomes a
    ``_Send`` / ``_Recv`` pair (one per tensor or control source and destination),
    every feed an ``_Arg`` of the partition that reads it (the client's device, unless
    ``client_device`` is False)."""

    def __init__(
        self,
        nodes: Sequence[NodeDef],
        placement: Sequence[int],
        devices: Sequence[str],
        fed: Mapping[Ref, int],
        incarnation: int,
        frames: Frames | None,
        loops: Mapping[tuple[FramePath, int], str] | None,
        client_device: bool,
    ) -> None:
        self.device_of = {n.name: d for n, d in zip(nodes, placement, strict=True)}
        self.nodes_of: dict[int, list[NodeDef]] = {}
        self.args_of: dict[int, set[int]] = {}
        self.recvs: dict[tuple[Ref | str, int], str] = {}  # (tensor or control source, dst)
        self.infos = {n.name: n for n in nodes}
        self.devices, self.fed, self.incarnation = devices, fed, incarnation
        self.frames, self.loops, self.client_device = frames, loops, client_device

    def recv_for(self, source: Ref | str, src: int, dst: int, info: ValueInfo | None = None) -> str:
        """The ``_Recv`` on ``dst`` of ``source`` from ``src`` (made once)."""
        name = self.recvs.get((source, dst))
        if name is None:
            name = self.recvs[(source, dst)] = _make_pair(
                source,
                self.infos,
                src,
                dst,
                self.devices,
                self.incarnation,
                self.nodes_of,
                self.frames,
                self.loops,
                info,
            )
        return name

    def cut_node(self, n: NodeDef, d: int) -> NodeDef:
        """Node ``n`` on device ``d`` with its inputs from other devices received."""
        inputs, changed = self._inputs(n, d)
        controls: list[str] = []
        for c in n.control_inputs:
            src = self.device_of.get(c)
            if src is None:
                changed = True  # not needed (e.g. a fed Placeholder): the feed carries it
            elif src == d:
                controls.append(c)
            else:
                controls.append(self.recv_for(c, src, d))
                changed = True
        if not changed:
            return n
        return NodeDef(
            n.name,
            n.op,
            tuple(inputs),
            tuple(controls),
            n.device,
            n.attrs,
            n.outputs,
            n.input_types,
            n.stateful,
            n.traceback,
        )

    def _inputs(self, n: NodeDef, d: int) -> tuple[list[Ref], bool]:
        """``n``'s data inputs on device ``d``, and whether any changed."""
        fed, client_device = self.fed, self.client_device
        changed = False
        inputs: list[Ref] = []
        for i, r in enumerate(n.inputs):
            k = fed.get(r) if fed else None
            if k is not None:  # from the client's device
                self.args_of.setdefault(_CLIENT if client_device else d, set()).add(k)
                if d == _CLIENT or not client_device:
                    inputs.append(r)
                else:
                    inputs.append((self.recv_for(r, _CLIENT, d, n.input_types[i]), 0))
                    changed = True
            elif self.device_of[r[0]] == d:
                inputs.append(r)
            else:
                inputs.append((self.recv_for(r, self.device_of[r[0]], d), 0))
                changed = True
        return inputs, changed

    def retvals(self, fetches: Sequence[Ref]) -> dict[int, list[tuple[int, Ref]]]:
        """Per device, the fetches it returns (to the client's device, when it is used)."""
        retvals_of: dict[int, list[tuple[int, Ref]]] = {}
        for k, r in enumerate(fetches):
            if r in self.fed:
                continue
            src = self.device_of[r[0]]
            if src != _CLIENT and self.client_device:  # to the client's device
                r = (self.recv_for(r, src, _CLIENT), 0)
                src = _CLIENT
            retvals_of.setdefault(src, []).append((k, r))
        return retvals_of


def _one_partition(
    nodes: Sequence[NodeDef],
    d: int,
    devices: Sequence[str],
    feeds: Sequence[Ref],
    fed: Mapping[Ref, int],
    fetches: Sequence[Ref],
    targets: Sequence[str],
    control_flow: bool,
) -> PartitionDef:
    """:func:`partition` when every node is on device ``d``: no edge is cut, so a node
    changes only when a control input is not in the run (a fed Placeholder's: the feed
    carries it).  The partition takes every feed as an argument (a feed nothing reads
    holds its slot until the step ends, and no pass over every node's inputs is spent
    finding out which are read)."""
    out: list[NodeDef] | None = None
    names: set[str] | None = None
    for k, n in enumerate(nodes):
        if n.control_inputs:
            if names is None:
                names = {m.name for m in nodes}
            if any(c not in names for c in n.control_inputs):
                if out is None:
                    out = list(nodes)
                out[k] = n._replace(control_inputs=tuple(c for c in n.control_inputs if c in names))
    return PartitionDef(
        devices[d],
        tuple(nodes if out is None else out),
        tuple(enumerate(feeds)),
        tuple((k, r) for k, r in enumerate(fetches) if r not in fed),
        tuple(targets),
        control_flow,
    )


def _make_pair(
    source: Ref | str,
    infos: Mapping[str, NodeDef],
    src: int,
    dst: int,
    devices: Sequence[str],
    incarnation: int,
    nodes_of: dict[int, list[NodeDef]],
    frames: Frames | None,
    loops: Mapping[tuple[FramePath, int], str] | None,
    fed_info: ValueInfo | None = None,
) -> str:
    """Add the ``_Send`` (on ``src``) and ``_Recv`` (on ``dst``) for one cut edge
    (``fed_info``: the edge carries a fed tensor, whose producer may not run)."""
    producer: NodeDef | None
    if isinstance(source, tuple):
        producer = infos.get(source[0])
        edge = f"{source[0]}:{source[1]}"
        base = f"{source[0]}_{source[1]}"
        info = fed_info if fed_info is not None else infos[source[0]].outputs[source[1]]
        send_inputs: tuple[Ref, ...] = (source,)
        send_controls: tuple[str, ...] = ()
    else:
        producer = infos[source]
        edge = f"^{source}"
        base = f"{source}_ctrl"
        info = _TOKEN
        send_inputs, send_controls = (), (source,)
    key = create_key(devices[src], incarnation, devices[dst], edge)
    attrs = {
        "key": key,
        "tensor_name": edge,
        "send_device": devices[src],
        "recv_device": devices[dst],
        "dtype": info.dtype,
        "shape": info.shape,
    }
    recv_controls: tuple[str, ...] = ()
    traceback = producer.traceback if producer is not None else ""
    if frames is not None and loops and producer is not None and fed_info is None:
        path = frames.out_frame[producer.name]
        if path:  # inside a loop: received once per iteration of this device's control loop
            recv_controls = (loops[(path, dst)],)
    send = NodeDef(
        f"_send_{base}_to_{dst}",
        "_Send",
        send_inputs,
        send_controls,
        devices[src],
        attrs,
        (),
        (info,) if send_inputs else (),
        True,
        traceback,
    )
    recv = NodeDef(
        f"_recv_{base}_on_{dst}",
        "_Recv",
        (),
        recv_controls,
        devices[dst],
        attrs,
        (info,),
        (),
        True,
        traceback,
    )
    nodes_of.setdefault(src, []).append(send)
    nodes_of.setdefault(dst, []).insert(0, recv)
    return recv.name


def partition_graph_def(part: PartitionDef) -> dict[str, Any]:
    """A graph def (``as_graph_def()``'s form) of one partition, with ``_Arg`` / ``_Retval``."""

    # A feed no node of the partition reads has no _Arg: as TF, which prunes it away
    # (the run still takes it, and its dtype is nowhere among these nodes).
    read = {r for n in part.nodes for r in n.inputs} | {r for _, r in part.retvals}
    args = [(k, r) for k, r in part.args if r in read]
    arg_names = {r: f"_arg_{r[0]}_{r[1]}" for _, r in args}

    def ref(r: Ref) -> str:
        return arg_names[r] if r in arg_names else format_ref(r)

    device = part.device
    nodes: list[dict[str, Any]] = []
    for k, r in args:
        dtype = _dtype_of(part, r)
        nodes.append(
            {
                "name": arg_names[r],
                "op": "_Arg",
                "input": [],
                "device": device,
                "attr": {"index": encode_attr(k), "T": encode_attr(dtype)},
            }
        )
    for n in part.nodes:
        attrs = {}
        for name, value in n.attrs.items():
            try:
                attrs[name] = encode_attr(value)
            except (TypeError, ValueError):
                attrs[name] = encode_attr(repr(value))
        nodes.append(
            {
                "name": n.name,
                "op": n.op,
                "input": [ref(r) for r in n.inputs] + [f"^{c}" for c in n.control_inputs],
                "device": device,
                "attr": attrs,
            }
        )
    for k, r in part.retvals:
        nodes.append(
            {
                "name": f"_retval_{r[0]}_{r[1]}",
                "op": "_Retval",
                "input": [ref(r)],
                "device": device,
                "attr": {"index": encode_attr(k), "T": encode_attr(_dtype_of(part, r))},
            }
        )
    return {
        "versions": {"producer": 1, "format": "asyncflow.partition_graph/1"},
        "device": device,
        "node": nodes,
    }


def _dtype_of(part: PartitionDef, r: Ref) -> dtypes.DType:
    return _info_of(r, part.nodes).dtype


def add_client_edges(
    nodes: Sequence[NodeDef],
    placement: Sequence[int],
    devices: Sequence[str],
    feeds: Sequence[Ref],
    fetches: Sequence[Ref],
    targets: Sequence[str],
    incarnation: int,
    client: str,
    feed_infos: Sequence[ValueInfo],
) -> tuple[tuple[NodeDef, ...], tuple[int, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """Partial runs: the client feeds and fetches through the step's rendezvous.

    Each fed tensor becomes a ``_Recv`` from ``client`` on the client's device (the
    session's default device, ``devices[0]``, as TF places feeds; partitioning carries
    it on to consumers elsewhere), unless nothing of the run reads it: a feed declared
    for another fetch gets a key and no node.  ``feed_infos`` are the fed tensors'
    dtypes and shapes (a feed nothing reads has no node here to learn them from).
    Each fetch is a ``_Send`` to ``client`` on its producer's device; each target a
    token ``_Send`` after it.  Returns the nodes and placement with these added, and
    the feed, fetch and target keys.
    """
    device_of = {n.name: d for n, d in zip(nodes, placement)}
    infos = {n.name: n for n in nodes}
    fed: dict[Ref, str] = {}
    added: list[NodeDef] = []
    added_device: list[int] = []
    feed_keys: list[str] = []
    read = {r for n in nodes for r in n.inputs} | set(fetches)
    for r, info in zip(feeds, feed_infos):
        name = f"_recv_feed_{r[0]}_{r[1]}"
        key = create_key(client, incarnation, devices[0], f"feed:{r[0]}:{r[1]}")
        feed_keys.append(key)
        if r not in read:
            continue
        fed[r] = name
        added.append(
            NodeDef(
                name,
                "_Recv",
                (),
                (),
                devices[0],
                {
                    "key": key,
                    "tensor_name": f"{r[0]}:{r[1]}",
                    "send_device": client,
                    "recv_device": devices[0],
                    "dtype": info.dtype,
                    "shape": info.shape,
                },
                (info,),
                (),
                True,
                infos[r[0]].traceback if r[0] in infos else "",
            )
        )
        added_device.append(0)
        device_of[name] = 0
    rewired = []
    for n in nodes:
        if any(r in fed for r in n.inputs):
            n = NodeDef(
                n.name,
                n.op,
                tuple((fed[r], 0) if r in fed else r for r in n.inputs),
                n.control_inputs,
                n.device,
                n.attrs,
                n.outputs,
                n.input_types,
                n.stateful,
                n.traceback,
            )
        rewired.append(n)
    fetch_keys: list[str] = []
    for r in fetches:
        source = (fed[r], 0) if r in fed else r
        d = device_of[source[0]]
        info = _info_of(r, nodes)
        key = create_key(devices[d], incarnation, client, f"fetch:{r[0]}:{r[1]}")
        fetch_keys.append(key)
        added.append(
            NodeDef(
                f"_send_fetch_{r[0]}_{r[1]}",
                "_Send",
                (source,),
                (),
                devices[d],
                {
                    "key": key,
                    "tensor_name": f"{r[0]}:{r[1]}",
                    "send_device": devices[d],
                    "recv_device": client,
                    "dtype": info.dtype,
                    "shape": info.shape,
                },
                (),
                (info,),
                True,
                "",
            )
        )
        added_device.append(d)
    target_keys: list[str] = []
    for name in targets:
        d = device_of[name]
        key = create_key(devices[d], incarnation, client, f"fetch:^{name}")
        target_keys.append(key)
        added.append(
            NodeDef(
                f"_send_fetch_{name}_ctrl",
                "_Send",
                (),
                (name,),
                devices[d],
                {
                    "key": key,
                    "tensor_name": f"^{name}",
                    "send_device": devices[d],
                    "recv_device": client,
                    "dtype": dtypes.bool,
                    "shape": TensorShape(()),
                },
                (),
                (),
                True,
                "",
            )
        )
        added_device.append(d)
    return (
        (*rewired, *added),
        (*placement, *added_device),
        tuple(feed_keys),
        tuple(fetch_keys),
        tuple(target_keys),
    )


def _info_of(r: Ref, nodes: Sequence[NodeDef]) -> ValueInfo:
    for n in nodes:
        if n.name == r[0]:
            return n.outputs[r[1]]
        for k, i in enumerate(n.inputs):
            if i == r:
                return n.input_types[k]
    raise KeyError(f"tensor {format_ref(r)!r} is not among the nodes of this run")
