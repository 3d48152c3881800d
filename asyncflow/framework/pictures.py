"""Graph pictures: a :class:`Graph` or a graph def as Graphviz DOT or Mermaid text.

``af.tracing.to_dot(graph_or_graph_def)`` and ``af.tracing.to_mermaid(...)`` draw

* every op as a box labelled with its name and op type;
* data edges as solid arrows (labelled ``:k`` for output ``k > 0``), control edges
  as dashed arrows;
* the ops of one device inside a cluster (subgraph) named by the device (ops with
  no device at the top level);
* the ops of a ``while_loop`` inside a nested cluster per control-flow frame
  (``Enter`` opens a frame, ``Exit`` leaves it, as TensorFlow's frame inference).

A graph def is drawn as it is: nothing is imported, so a graph file naming Python
functions (``py_func``) is safe to draw.  Both functions are pure: the same graph
always gives the same text.
"""

from __future__ import annotations

import itertools
import json
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from asyncflow.framework.graph import Graph

__all__ = ["to_dot", "to_mermaid"]


@dataclass(frozen=True, slots=True)
class _Node:
    name: str
    op: str
    inputs: tuple[tuple[str, int], ...]  # (producer node, output index)
    controls: tuple[str, ...]
    device: str
    frame_name: str | None  # the frame an Enter node opens


@dataclass(slots=True)
class _Cluster:
    """One box of the picture: a device or a loop frame, holding nodes and sub-boxes."""

    label: str
    nodes: list[str] = field(default_factory=list)
    children: dict[str, _Cluster] = field(default_factory=dict)


def to_dot(graph: Any) -> str:
    """The graph (an ``af.Graph`` or a graph def dict) as Graphviz DOT text."""
    nodes = _nodes(graph)
    ids = {n.name: f"n{i}" for i, n in enumerate(nodes)}
    lines = [
        "digraph asyncflow {",
        "  rankdir=TB;",
        '  node [shape=box, style="rounded", fontname="Helvetica"];',
    ]
    counter = itertools.count()

    def emit(cluster: _Cluster, indent: str) -> None:
        for name in cluster.nodes:
            node = by_name[name]
            lines.append(f"{indent}{ids[name]} [label={_dot_str(name + chr(10) + node.op)}];")
        for child in cluster.children.values():
            lines.append(f"{indent}subgraph cluster_{next(counter)} {{")
            lines.append(f"{indent}  label={_dot_str(child.label)};")
            emit(child, indent + "  ")
            lines.append(f"{indent}}}")

    by_name = {n.name: n for n in nodes}
    emit(_clusters(nodes), "  ")
    for node in nodes:
        for src, index in node.inputs:
            label = f" [label={_dot_str(f':{index}')}]" if index else ""
            lines.append(f"  {ids[src]} -> {ids[node.name]}{label};")
        for src in node.controls:
            lines.append(f"  {ids[src]} -> {ids[node.name]} [style=dashed];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_mermaid(graph: Any) -> str:
    """The graph (an ``af.Graph`` or a graph def dict) as a Mermaid flowchart."""
    nodes = _nodes(graph)
    ids = {n.name: f"n{i}" for i, n in enumerate(nodes)}
    by_name = {n.name: n for n in nodes}
    lines = ["flowchart TD"]
    counter = itertools.count()

    def emit(cluster: _Cluster, indent: str) -> None:
        for name in cluster.nodes:
            label = _mermaid_str(f"{name}<br/>{by_name[name].op}")
            lines.append(f"{indent}{ids[name]}[{label}]")
        for child in cluster.children.values():
            lines.append(f"{indent}subgraph c{next(counter)}[{_mermaid_str(child.label)}]")
            emit(child, indent + "  ")
            lines.append(f"{indent}end")

    emit(_clusters(nodes), "  ")
    for node in nodes:
        for src, index in node.inputs:
            arrow = f"-->|{_mermaid_str(f':{index}')}|" if index else "-->"
            lines.append(f"  {ids[src]} {arrow} {ids[node.name]}")
        for src in node.controls:
            lines.append(f"  {ids[src]} -.-> {ids[node.name]}")
    return "\n".join(lines) + "\n"


# -- reading a graph or a graph def ----------------------------------------------


def _nodes(graph: Any) -> list[_Node]:
    if isinstance(graph, Graph):
        return [
            _Node(
                op.name,
                op.type,
                tuple((t.op.name, t.value_index) for t in op.inputs),
                tuple(c.name for c in op.control_inputs),
                op.device,
                _frame_attr(op._attrs.get("frame_name")) if op.type == "Enter" else None,
            )
            for op in graph.get_operations()
        ]
    if isinstance(graph, Mapping):
        return _graph_def_nodes(graph)
    raise TypeError(f"expected an af.Graph or a graph def dict, got {type(graph).__name__}")


def _frame_attr(value: Any) -> str | None:
    if isinstance(value, Mapping):  # encoded in a graph def: {"s": name}
        value = value.get("s")
    return value if isinstance(value, str) else None


def _graph_def_nodes(graph_def: Mapping[str, Any]) -> list[_Node]:
    raw = graph_def.get("node")
    if not isinstance(raw, list):
        raise ValueError("a graph def must have a 'node' list")
    nodes: list[_Node] = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            raise ValueError(f"node {i} of the graph def has no name")
        name = entry["name"]
        inputs: list[tuple[str, int]] = []
        controls: list[str] = []
        for text in entry.get("input", []):
            if not isinstance(text, str):
                raise ValueError(f"node {name!r}: input {text!r} is not a string")
            if text.startswith("^"):
                controls.append(text[1:])
            else:
                src, _, index = text.partition(":")
                inputs.append((src, int(index) if index.isdigit() else 0))
        attrs = entry.get("attr") or {}
        op = str(entry.get("op", "?"))
        frame = _frame_attr(attrs.get("frame_name")) if op == "Enter" else None
        nodes.append(
            _Node(name, op, tuple(inputs), tuple(controls), str(entry.get("device") or ""), frame)
        )
    known = {n.name for n in nodes}
    for n in nodes:
        for src in (*(s for s, _ in n.inputs), *n.controls):
            if src not in known:
                raise ValueError(
                    f"node {n.name!r} has input {src!r}, which is not a node of the graph def"
                )
    return nodes


# -- grouping -----------------------------------------------------------------------


def _clusters(nodes: list[_Node]) -> _Cluster:
    """Device clusters at the top, loop-frame clusters nested inside them."""
    frames = _frame_paths(nodes)
    root = _Cluster("")
    for node in nodes:
        box = root.children.setdefault(node.device, _Cluster(node.device)) if node.device else root
        for frame in frames[node.name]:
            box = box.children.setdefault(frame, _Cluster(f"loop {frame}"))
        box.nodes.append(node.name)
    return root


def _frame_paths(nodes: list[_Node]) -> dict[str, tuple[str, ...]]:
    """Each node's stack of loop frames (outermost first), TF's frame inference.

    A node is in the frame of its inputs; an ``Enter`` opens its ``frame_name`` inside
    that, an ``Exit`` is in the frame its input leaves.  Back edges (from
    ``NextIteration``) are ignored to get an order (Kahn's algorithm).
    """
    by_name = {n.name: n for n in nodes}
    consumers: dict[str, list[str]] = {n.name: [] for n in nodes}
    pending: dict[str, int] = {}
    for n in nodes:
        sources = [s for s in _sources(n) if by_name[s].op != "NextIteration"]
        pending[n.name] = len(sources)
        for s in sources:
            consumers[s].append(n.name)
    ready = deque(n.name for n in nodes if pending[n.name] == 0)
    paths: dict[str, tuple[str, ...]] = {}
    while ready:
        name = ready.popleft()
        node = by_name[name]
        inherited = next((paths[s] for s in _sources(node) if s in paths), ())
        if node.op == "Enter" and node.frame_name:
            path = (*inherited, node.frame_name)
        elif node.op == "Exit":
            path = inherited[:-1]
        else:
            path = inherited
        paths[name] = path
        for c in consumers[name]:
            pending[c] -= 1
            if pending[c] == 0:
                ready.append(c)
    for n in nodes:  # nodes on a cycle that is not a loop: drawn outside any frame
        paths.setdefault(n.name, ())
    return paths


def _sources(node: _Node) -> Iterator[str]:
    yield from (s for s, _ in node.inputs)
    yield from node.controls


def _dot_str(text: str) -> str:
    return json.dumps(text)  # a double-quoted string with \" and \\ escaped, as DOT wants


def _mermaid_str(text: str) -> str:
    return '"' + text.replace('"', "#quot;") + '"'
