"""Partitioning: one subgraph per device, joined by ``_Send`` / ``_Recv`` pairs.

Given the pruned, placed ops of a run, every edge whose ends are on different
devices is cut:

* a **data edge** becomes one ``_Send`` on the producer's device and one ``_Recv``
  on the consumer's device per *(source tensor, destination device)* — several
  consumers on that device share the pair;
* a **control edge** becomes a small pair too: the ``_Send`` runs after the source
  op (a control input) and sends a token; the consumer gets the ``_Recv`` as a
  control input.

A fed tensor is no edge at all: each partition reading it gets its own ``_Arg``.
The original graph is never modified: partitions carry their rewritten edges in
``edges`` (op → new inputs, new control inputs), and the synthetic ``_Send`` /
``_Recv`` ops live only in the partitions.  Rendezvous keys have TensorFlow's form
(see :mod:`asyncflow.runtime.rendezvous`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from asyncflow import dtypes
from asyncflow.framework import registry
from asyncflow.framework.graph import Operation, Tensor
from asyncflow.framework.shapes import TensorShape, unknown_shape
from asyncflow.runtime.rendezvous import create_key

if TYPE_CHECKING:
    from asyncflow.runtime.rendezvous import Rendezvous

__all__ = ["Partition", "partition"]

Edges = dict[Operation, tuple[tuple[Tensor, ...], tuple[Operation, ...]]]

_TOKEN = np.bool_(True)  # what a control-edge _Send carries


def _send_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Any]:
    return []


def _recv_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Any]:
    return [(attrs["dtype"], attrs["shape"])]


_SEND_DEF = registry.define_op("_Send", _send_shape, stateful=True, feedable=False)
_RECV_DEF = registry.define_op("_Recv", _recv_shape, stateful=True, feedable=False)


@registry.register_kernel_factory("_Send")
def _send_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    key = op._attrs["key"]
    if op._inputs:
        def send(rendezvous: Rendezvous, value: Any) -> None:
            rendezvous.send(key, value)
    else:
        def send(rendezvous: Rendezvous) -> None:  # type: ignore[misc]
            rendezvous.send(key, _TOKEN)
    return send, registry.SEND


@registry.register_kernel_factory("_Recv")
def _recv_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    key = op._attrs["key"]

    def recv(rendezvous: Rendezvous) -> Any:
        return rendezvous.recv_future(key)

    return recv, registry.RECV


@dataclass(frozen=True, slots=True, eq=False)
class Partition:
    """The ops of one device, with their cross-device edges rewritten.

    ``feeds`` / ``fetches`` index the run's feed and fetch lists: the fed tensors
    this partition reads, the fetched tensors it produces.
    """

    device: int
    ops: tuple[Operation, ...]
    edges: Edges
    feeds: tuple[int, ...]
    fetches: tuple[int, ...]
    targets: tuple[Operation, ...]


def partition(ops: Sequence[Operation], placement: Sequence[int], devices: Sequence[str],
              feeds: Sequence[Tensor], fetches: Sequence[Tensor],
              targets: Sequence[Operation], incarnation: int) -> list[Partition]:
    """Split placed ops into one :class:`Partition` per device used (device order)."""
    device_of: dict[Operation, int] = dict(zip(ops, placement))
    fed = {t: k for k, t in enumerate(feeds)}
    ops_of: dict[int, list[Operation]] = {}
    edges_of: dict[int, Edges] = {}
    feeds_of: dict[int, set[int]] = {}
    recvs: dict[tuple[Any, int], Operation] = {}  # (tensor or ^op, dst) -> _Recv

    def recv_for(source: Tensor | Operation, src: int, dst: int) -> Operation:
        key = (source, dst)
        recv = recvs.get(key)
        if recv is None:
            recv = recvs[key] = _make_pair(source, src, dst, devices, incarnation, ops_of)
        return recv

    for op in ops:
        ops_of.setdefault(device_of[op], []).append(op)
    for op in ops:
        d = device_of[op]
        changed = False
        inputs: list[Tensor] = []
        for t in op._inputs:
            k = fed.get(t) if fed else None
            if k is not None:
                feeds_of.setdefault(d, set()).add(k)
                inputs.append(t)
                continue
            src = device_of[t._op]
            if src == d:
                inputs.append(t)
            else:
                inputs.append(recv_for(t, src, d)._outputs[0])
                changed = True
        controls: list[Operation] = []
        for c in op._control_inputs:
            src_c = device_of.get(c)
            if src_c is None:
                changed = True  # not needed (e.g. a fed Placeholder): the feed carries it
            elif src_c == d:
                controls.append(c)
            else:
                controls.append(recv_for(c, src_c, d))
                changed = True
        if changed:
            edges_of.setdefault(d, {})[op] = (tuple(inputs), tuple(controls))

    fetches_of: dict[int, list[int]] = {}
    for k, t in enumerate(fetches):
        if t not in fed:
            fetches_of.setdefault(device_of[t._op], []).append(k)
    targets_of: dict[int, list[Operation]] = {}
    for op in targets:
        targets_of.setdefault(device_of[op], []).append(op)
    return [
        Partition(d, tuple(ops_of[d]), edges_of.get(d, {}), tuple(sorted(feeds_of.get(d, ()))),
                  tuple(fetches_of.get(d, ())), tuple(targets_of.get(d, ())))
        for d in sorted(ops_of)
    ]


def _make_pair(source: Tensor | Operation, src: int, dst: int, devices: Sequence[str],
               incarnation: int, ops_of: dict[int, list[Operation]]) -> Operation:
    """Create the ``_Send`` (on ``src``) and ``_Recv`` (on ``dst``) for one cut edge."""
    if isinstance(source, Tensor):
        op = source._op
        edge = source.name
        base = f"{op._name}_{source._value_index}"
        dtype, shape = source._dtype, source._shape
        send_inputs: tuple[Tensor, ...] = (source,)
        send_controls: tuple[Operation, ...] = ()
    else:
        op = source
        edge = f"^{op._name}"
        base = f"{op._name}_ctrl"
        dtype, shape = dtypes.bool, TensorShape(())
        send_inputs, send_controls = (), (op,)
    key = create_key(devices[src], incarnation, devices[dst], edge)
    attrs = {"key": key, "tensor_name": edge, "send_device": devices[src],
             "recv_device": devices[dst], "dtype": dtype, "shape": shape}
    graph = op._graph
    send = Operation(graph, f"_send_{base}_to_{dst}", "_Send", send_inputs, send_controls,
                     attrs, devices[src], op._traceback, -1, _SEND_DEF)
    send._outputs = ()
    recv = Operation(graph, f"_recv_{base}_on_{dst}", "_Recv", (), (), attrs, devices[dst],
                     op._traceback, -1, _RECV_DEF)
    recv._outputs = (Tensor(recv, 0, dtype, shape if shape is not None else unknown_shape()),)
    ops_of.setdefault(src, []).append(send)
    ops_of.setdefault(dst, []).insert(0, recv)
    return recv


def partition_graph_def(part: Partition, devices: Sequence[str], feeds: Sequence[Tensor],
                        fetches: Sequence[Tensor]) -> dict[str, Any]:
    """A graph def (``as_graph_def()``'s form) of one partition, with ``_Arg`` / ``_Retval``."""
    from asyncflow.framework.graph_def import encode_attr

    def ref(t: Tensor) -> str:
        if t in arg_names:
            return arg_names[t]
        return t._op._name if t._value_index == 0 else f"{t._op._name}:{t._value_index}"

    device = devices[part.device]
    arg_names = {feeds[k]: f"_arg_{feeds[k]._op._name}_{feeds[k]._value_index}"
                 for k in part.feeds}
    nodes: list[dict[str, Any]] = []
    for k in part.feeds:
        t = feeds[k]
        nodes.append({"name": arg_names[t], "op": "_Arg", "input": [], "device": device,
                      "attr": {"index": encode_attr(k), "T": encode_attr(t._dtype)}})
    for op in part.ops:
        inputs, controls = part.edges.get(op, (op._inputs, op._control_inputs))
        attrs = {}
        for name, value in op._attrs.items():
            try:
                attrs[name] = encode_attr(value)
            except (TypeError, ValueError):
                attrs[name] = encode_attr(repr(value))
        nodes.append({"name": op._name, "op": op._type,
                      "input": [ref(t) for t in inputs] + [f"^{c._name}" for c in controls],
                      "device": device, "attr": attrs})
    for k in part.fetches:
        t = fetches[k]
        nodes.append({"name": f"_retval_{t._op._name}_{t._value_index}", "op": "_Retval",
                      "input": [ref(t)], "device": device,
                      "attr": {"index": encode_attr(k), "T": encode_attr(t._dtype)}})
    return {"versions": {"producer": 1, "format": "asyncflow.partition_graph/1"},
            "device": device, "node": nodes}


def client_edges(feeds: Sequence[Tensor], fetches: Sequence[Tensor],
                 targets: Sequence[Operation], device: str, incarnation: int,
                 client: str = "/job:localhost/replica:0/task:0/device:CPU:0"
                 ) -> tuple[dict[Tensor, Operation], list[Operation]]:
    """``_Recv`` ops for values the client will feed, ``_Send`` ops for values it will
    fetch (and a token ``_Send`` per target op), all on ``device`` (partial runs)."""
    recvs: dict[Tensor, Operation] = {}
    for t in feeds:
        key = create_key(client, incarnation, device, f"feed:{t.name}")
        attrs = {"key": key, "tensor_name": t.name, "send_device": client,
                 "recv_device": device, "dtype": t._dtype, "shape": t._shape}
        recv = Operation(t._op._graph, f"_recv_feed_{t._op._name}_{t._value_index}", "_Recv",
                         (), (), attrs, device, t._op._traceback, -1, _RECV_DEF)
        recv._outputs = (Tensor(recv, 0, t._dtype, t._shape),)
        recvs[t] = recv
    sends: list[Operation] = []
    for t in fetches:
        source = recvs[t]._outputs[0] if t in recvs else t
        key = create_key(device, incarnation, client, f"fetch:{t.name}")
        attrs = {"key": key, "tensor_name": t.name, "send_device": device,
                 "recv_device": client, "dtype": t._dtype, "shape": t._shape}
        send = Operation(t._op._graph, f"_send_fetch_{t._op._name}_{t._value_index}",
                         "_Send", (source,), (), attrs, device, t._op._traceback, -1, _SEND_DEF)
        send._outputs = ()
        sends.append(send)
    for op in targets:
        key = create_key(device, incarnation, client, f"fetch:^{op.name}")
        attrs = {"key": key, "tensor_name": f"^{op.name}", "send_device": device,
                 "recv_device": client, "dtype": dtypes.bool, "shape": TensorShape(())}
        send = Operation(op._graph, f"_send_fetch_{op._name}_ctrl", "_Send", (), (op,), attrs,
                         device, op._traceback, -1, _SEND_DEF)
        send._outputs = ()
        sends.append(send)
    return recvs, sends
