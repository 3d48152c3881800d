"""``af.tracing.to_dot`` / ``to_mermaid``: devices as clusters, control edges dashed, loops by frame."""

from __future__ import annotations

import re

import numpy as np
import pytest

import asyncflow as af


def _loop_graph() -> af.Graph:
    g = af.Graph()
    with g.as_default():
        with af.device("/cpu:1"):
            x = af.placeholder(af.float32, shape=(), name="x")
        _, total = af.while_loop(
            lambda i, s: i < 3,
            lambda i, s: (i + 1, s + x),
            (af.constant(0, name="i0"), af.constant(0.0, name="s0")),
            name="loop",
        )
        with af.control_dependencies([total]):
            af.identity(x, name="after")
        af.raw_ops.switch(x, af.constant(True, name="p"), name="sw")[1] + 1.0
    return g


def _block(text: str, opener: str, closer: str) -> str:
    """The text of the first block opened by a line containing ``opener``."""
    lines = text.splitlines()
    start = next(k for k, line in enumerate(lines) if opener in line)
    depth, out = 0, []
    for line in lines[start:]:
        stripped = line.strip()
        if stripped.startswith(("subgraph",)):
            depth += 1
        elif stripped == closer:
            depth -= 1
        out.append(line)
        if depth == 0:
            break
    return "\n".join(out)


def _ids(text: str) -> dict[str, str]:
    """Node name → id, from label lines of either format."""
    found = re.findall(r'(n\d+)\s*\[(?:label=)?"([^"\\<]+)(?:<br/>|\\n)', text)
    return {name: node_id for node_id, name in found}


def test_mermaid_groups_devices_and_loop_frames() -> None:
    text = af.tracing.to_mermaid(_loop_graph())
    ids = _ids(text)
    device = _block(text, 'subgraph c0["/cpu:1"]', "end")
    assert f'{ids["x"]}["x<br/>Placeholder"]' in device
    loop = _block(text, '["loop loop/while_frame"]', "end")
    for name in ("loop/Enter", "loop/Merge", "loop/Switch", "loop/add", "loop/NextIteration"):
        assert f'{ids[name]}["{name}<br/>' in loop
    for name in ("i0", "loop/Exit", "loop/Exit_1", "after", "x"):
        assert f'{ids[name]}["' not in loop, name
    # Control edge dashed, data edges solid, output 1 labelled.
    assert f"{ids['loop/Exit_1']} -.-> {ids['after']}" in text
    assert f"{ids['x']} --> {ids['after']}" in text
    assert f'{ids["sw"]} -->|":1"| ' in text


def test_dot_of_graph_and_of_its_graph_def_are_the_same() -> None:
    g = _loop_graph()
    text = af.tracing.to_dot(g)
    assert text == af.tracing.to_dot(g.as_graph_def())
    assert text.startswith("digraph asyncflow {\n")
    ids = _ids(text)
    assert f"{ids['loop/Exit_1']} -> {ids['after']} [style=dashed];" in text
    assert f"{ids['x']} -> {ids['after']};" in text
    assert 'label="/cpu:1";' in text
    assert 'label="loop loop/while_frame";' in text
    assert text.count("{") == text.count("}")


def test_nested_loops_nest_their_clusters() -> None:
    g = af.Graph()
    with g.as_default():

        def outer_body(i: af.Tensor, acc: af.Tensor) -> tuple[af.Tensor, af.Tensor]:
            _, inner = af.while_loop(
                lambda j, a: j < 2, lambda j, a: (j + 1, a + i), (af.constant(0), acc), name="inner"
            )
            return i + 1, inner

        af.while_loop(
            lambda i, a: i < 2, outer_body, (af.constant(0), af.constant(0)), name="outer"
        )
    text = af.tracing.to_mermaid(g)
    outer = _block(text, '["loop outer/while_frame"]', "end")
    assert '["loop outer/inner/while_frame"]' in outer
    inner = _block(text, '["loop outer/inner/while_frame"]', "end")
    assert '["outer/inner/add<br/>Add"]' in inner
    assert '["outer/add<br/>Add"]' not in inner


def test_partition_graphs_can_be_drawn() -> None:
    g = af.Graph()
    with g.as_default():
        with af.device("/cpu:0"):
            x = af.placeholder(af.float32, shape=[2], name="x")
            a = af.abs(x, name="a")
        with af.device("/cpu:1"):
            b = af.negative(a, name="b")
    options = af.RunOptions(output_partition_graphs=True)
    meta = af.RunMetadata()
    with af.Session(graph=g, config=af.SessionConfig(device_count={"CPU": 2})) as sess:
        sess.run_sync(b, {x: np.ones(2, np.float32)}, options=options, run_metadata=meta)
    pictures = [af.tracing.to_mermaid(pg) for pg in meta.partition_graphs]
    assert any("<br/>_Send" in p for p in pictures)
    assert any("<br/>_Recv" in p for p in pictures)


def test_quotes_in_names_are_escaped() -> None:
    graph_def = {"node": [{"name": 'say "hi"', "op": "Const", "input": [], "device": ""}]}
    assert '["say #quot;hi#quot;<br/>Const"]' in af.tracing.to_mermaid(graph_def)
    assert r'[label="say \"hi\"\nConst"];' in af.tracing.to_dot(graph_def)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (42, "expected an af.Graph or a graph def dict, got int"),
        ({"nodes": []}, "must have a 'node' list"),
        ({"node": [{"name": "a", "input": ["ghost"]}]}, "node 'a' has input 'ghost'"),
    ],
)
def test_bad_input_is_a_clear_error(bad: object, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=re.escape(message)):
        af.tracing.to_dot(bad)
