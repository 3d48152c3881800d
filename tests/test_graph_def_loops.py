"""Graph defs of graphs with ``while_loop``.

A loop's back edge ``NextIteration -> Merge`` is the one edge allowed to close a
cycle: export, import (re-creating every op, rewiring the back edge) and the
imported graph gives the same results and the same static shapes.  Any other cycle
is still a ``ValueError`` naming its nodes, before anything is added.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asyncflow as af
from asyncflow.framework.graph_def import import_graph_def

Build = Callable[[], tuple[list[af.Tensor], dict[str, Any]]]


def _json_round_trip(graph_def: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(graph_def))  # type: ignore[no-any-return]


def _import_fresh(graph_def: dict[str, Any], **kwargs: Any) -> af.Graph:
    g = af.Graph()
    with g.as_default():
        import_graph_def(graph_def, **kwargs)
    return g


def _run(
    graph: af.Graph,
    fetches: list[str],
    feeds: dict[str, Any],
    targets: tuple[str, ...] = (),
    reads: tuple[str, ...] = (),
) -> list[Any]:
    """Run ``targets`` (variable initializers), then ``fetches``, then ``reads``."""
    with af.Session(graph=graph) as sess:
        if targets:
            sess.run_sync(list(targets))
        out = sess.run_sync(fetches, feeds, options=af.RunOptions(timeout_in_ms=20_000))
        return [*out, *(sess.run_sync(r) for r in reads)]


def _sum_loop() -> tuple[list[af.Tensor], dict[str, Any]]:
    x = af.placeholder(af.float32, (), name="x")
    i, s = af.while_loop(
        lambda i, s: i < 10, lambda i, s: (i + 1, s + x), (af.constant(0), af.constant(0.0))
    )
    return [i, s], {"x:0": 2.5}


def _nested_loops() -> tuple[list[af.Tensor], dict[str, Any]]:
    def inner(v: af.Tensor) -> af.Tensor:
        result: af.Tensor = af.while_loop(
            lambda s: s < 20.0, lambda s: s + s, v, parallel_iterations=1
        )
        return result

    r = af.while_loop(lambda x: x < 3000.0, lambda x: inner(x) * inner(x), af.constant(2.0))
    return [r], {}


def _loop_with_cond() -> tuple[list[af.Tensor], dict[str, Any]]:
    p = af.placeholder(af.bool, (), name="p")
    i, s = af.while_loop(
        lambda i, s: i < 7,
        lambda i, s: (
            i + 1,
            af.cond(
                af.logical_and(p, af.equal(i % 2, 0)),
                lambda: s + af.cast(i, af.float32),
                lambda: s - 1.0,
            ),
        ),
        (af.constant(0), af.constant(0.0)),
    )
    return [i, s], {"p:0": True}


def _loop_in_a_cond() -> tuple[list[af.Tensor], dict[str, Any]]:
    p = af.placeholder(af.bool, (), name="p")
    r = af.cond(
        p,
        lambda: af.while_loop(lambda i: i < 5, lambda i: i + 2, af.constant(0)),
        lambda: af.constant(-1),
    )
    return [r], {"p:0": True}


def _loop_with_control_dependencies() -> tuple[list[af.Tensor], dict[str, Any]]:
    v = af.Variable(0.0, name="v")
    w = af.Variable(0.0, name="w")
    u = af.Variable(0.0, name="u")
    bump = v.assign_add(1.0, name="bump")
    bump_u = af.group(u.assign_add(1.0), name="bump_u")  # no outputs

    def body(i: af.Tensor) -> af.Tensor:
        with af.control_dependencies([bump, bump_u, w.assign_add(2.0, name="tick")]):
            return i + 1

    with af.control_dependencies([af.constant(1.0) * 2.0]):
        r = af.while_loop(lambda i: i < 4, body, [af.constant(0)])
    return [r], {"targets": ("v/Assign", "w/Assign", "u/Assign"), "reads": ("v:0", "w:0", "u:0")}


def _counted_loop() -> tuple[list[af.Tensor], dict[str, Any]]:
    n = af.placeholder(af.int32, (), name="n")
    i, s = af.while_loop(
        lambda i, s: i < 100,
        lambda i, s: (i + 1, s * 2),
        (af.constant(0), af.constant(1)),
        maximum_iterations=n,
    )
    return [i, s], {"n:0": 6}


def _growing_loop_variable() -> tuple[list[af.Tensor], dict[str, Any]]:
    i, xs = af.while_loop(
        lambda i, xs: i < 3,
        lambda i, xs: (i + 1, af.concat([xs, xs * 2.0], 0)),
        (af.constant(0), af.constant([1.0], shape=(1,))),
        shape_invariants=(af.TensorShape([]), af.TensorShape([None])),
    )
    return [i, xs, af.reduce_sum(xs)], {}


def _exclusive_case_with_a_loop() -> tuple[list[af.Tensor], dict[str, Any]]:
    p = af.placeholder(af.bool, (), name="p")
    q = af.placeholder(af.bool, (), name="q")
    r = af.case(
        [(p, lambda: af.constant(10)), (q, lambda: af.constant(20))],
        default=lambda: af.while_loop(lambda i: i < 3, lambda i: i + 1, af.constant(0)),
        exclusive=True,
    )
    return [r], {"p:0": False, "q:0": False}


PROGRAMS: dict[str, Build] = {
    "exclusive_case": _exclusive_case_with_a_loop,
    "sum": _sum_loop,
    "nested": _nested_loops,
    "cond_in_loop": _loop_with_cond,
    "loop_in_cond": _loop_in_a_cond,
    "control_dependencies": _loop_with_control_dependencies,
    "maximum_iterations": _counted_loop,
    "shape_invariants": _growing_loop_variable,
}


def _build(program: Build) -> tuple[af.Graph, list[str], dict[str, Any], dict[str, Any]]:
    g = af.Graph()
    with g.as_default():
        fetches, extra = program()
    feeds = {k: v for k, v in extra.items() if ":" in k}
    runs = {k: v for k, v in extra.items() if k in ("targets", "reads")}
    return g, [t.name for t in fetches], feeds, runs


def _by_name(graph_def: dict[str, Any]) -> dict[str, Any]:
    """Nodes by name: an import creates ops in dependency order, not the def's order."""
    return {n["name"]: n for n in graph_def["node"]}


def _equal(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_loop_graph_round_trips_and_runs_identically(name: str) -> None:
    g, fetches, feeds, runs = _build(PROGRAMS[name])
    graph_def = _json_round_trip(g.as_graph_def())
    imported = _import_fresh(graph_def)
    # Same nodes, inputs (back edges included), devices and attributes ...
    assert _by_name(imported.as_graph_def()) == _by_name(graph_def)
    # ... the same static shapes (shape invariants included) ...
    shapes = {t.name: t.shape.dims for op in g.get_operations() for t in op.outputs}
    assert {t.name: t.shape.dims for op in imported.get_operations() for t in op.outputs} == shapes
    # ... and the same results.
    expected = _run(g, fetches, feeds, **runs)
    assert _equal(_run(imported, fetches, feeds, **runs), expected)


def test_known_results_after_round_trip() -> None:
    # The values themselves, so that "identical" is not "identically wrong".
    cases: dict[str, list[Any]] = {
        "sum": [10, 25.0],
        "exclusive_case": [3],
        "nested": [1048576.0],
        "cond_in_loop": [7, 9.0],
        "loop_in_cond": [6],
        "control_dependencies": [4, 1.0, 8.0, 1.0],
        "maximum_iterations": [6, 64],
    }
    for name, expected in cases.items():
        g, fetches, feeds, runs = _build(PROGRAMS[name])
        imported = _import_fresh(_json_round_trip(g.as_graph_def()))
        assert _equal(_run(imported, fetches, feeds, **runs), expected), name
    g, fetches, feeds, runs = _build(_growing_loop_variable)
    i, xs, total = _run(_import_fresh(g.as_graph_def()), fetches, feeds)
    assert (i, total) == (3, 27.0)
    assert xs.tolist() == [1.0, 2.0, 2.0, 4.0, 2.0, 4.0, 4.0, 8.0]


def test_back_edge_is_rewired_to_the_imported_next_iteration() -> None:
    g, *_ = _build(_sum_loop)
    imported = _import_fresh(g.as_graph_def(), name="copy")
    merges = [op for op in imported.get_operations() if op.type == "Merge"]
    assert len(merges) == 2
    for m in merges:
        entry, back = m.inputs
        assert entry.op.type == "Enter"
        assert back.op.type == "NextIteration"
        assert back.op.name.startswith("copy/")


def test_loop_imported_twice_under_prefixes_runs_both_copies() -> None:
    g, fetches, _, _ = _build(_sum_loop)
    graph_def = g.as_graph_def()
    target = af.Graph()
    with target.as_default():
        x = af.placeholder(af.float32, (), name="x")
        import_graph_def(graph_def, name="a", input_map={"x:0": x})
        import_graph_def(graph_def, name="b", input_map={"x:0": x * 2.0})
    out = _run(target, [f"a/{f}" for f in fetches] + [f"b/{f}" for f in fetches], {"x:0": 1.5})
    assert _equal(out, [10, 15.0, 10, 30.0])


def test_imported_loop_is_still_a_loop_for_feeds_and_fetches() -> None:
    g, _, feeds, _ = _build(_sum_loop)
    imported = _import_fresh(g.as_graph_def())
    inside = next(op for op in imported.get_operations() if op.type == "NextIteration")
    with pytest.raises(af.errors.InvalidArgumentError, match="while loop"):
        _run(imported, [inside.outputs[0].name], feeds)


# -- cycles other than a loop's back edge ---------------------------------------------


def _loop_def() -> dict[str, Any]:
    g, *_ = _build(_sum_loop)
    return _json_round_trip(g.as_graph_def())


def _node(graph_def: dict[str, Any], name: str) -> dict[str, Any]:
    return next(n for n in graph_def["node"] if n["name"] == name)


def _first(graph_def: dict[str, Any], op_type: str) -> dict[str, Any]:
    return next(n for n in graph_def["node"] if n["op"] == op_type)


def _expect_rejected(graph_def: dict[str, Any], error: type[Exception], match: str) -> None:
    g = af.Graph()
    with g.as_default(), pytest.raises(error, match=match):
        import_graph_def(graph_def)
    assert g.get_operations() == []  # validated before anything was added


def test_cycle_not_through_a_back_edge_is_a_value_error_naming_it() -> None:
    d = _loop_def()
    d["node"] += [
        {"name": "a", "op": "Identity", "input": ["b"]},
        {"name": "b", "op": "Identity", "input": ["a", "^while/Merge"]},
    ]
    _expect_rejected(d, ValueError, r"cycle through node 'a': 'a' -> 'b' -> 'a'")


def test_cycle_through_next_iteration_into_a_non_merge_is_a_value_error() -> None:
    d = _loop_def()
    # The loop counter's body add reads its own NextIteration: a cycle that does not
    # close through a Merge.
    nxt = _first(d, "NextIteration")
    add = _node(d, nxt["input"][0])
    add["input"][0] = nxt["name"]
    _expect_rejected(
        d,
        ValueError,
        rf"cycle through node .*'{nxt['name']}'.*"
        r"only through a NextIteration -> Merge edge",
    )


def test_cycle_closed_by_a_control_edge_from_next_iteration_is_a_value_error() -> None:
    d = _loop_def()
    merge = _first(d, "Merge")
    merge["input"].append("^" + merge["input"][1])
    _expect_rejected(d, ValueError, f"cycle through node .*'{merge['name']}'")


def test_merge_fed_only_by_next_iterations_is_a_value_error() -> None:
    d = _loop_def()
    merge = _first(d, "Merge")
    merge["input"][0] = merge["input"][1]
    _expect_rejected(d, ValueError, f"'{merge['name']}' \\(Merge\\) has only NextIteration")


def test_back_edge_of_another_dtype_is_a_type_error_naming_the_merge() -> None:
    d = _loop_def()
    int_merge, float_merge = [n for n in d["node"] if n["op"] == "Merge"]
    int_merge["input"][1] = float_merge["input"][1]  # an int32 loop closed by a float
    with pytest.raises(TypeError, match=f"'{int_merge['name']}' \\(Merge\\).*float32"):
        _import_fresh(d)


# -- partition graphs -------------------------------------------------------------


@pytest.mark.parametrize("name", ["sum", "nested", "cond_in_loop", "maximum_iterations"])
def test_partition_graphs_of_a_loop_import_again(name: str) -> None:
    g, fetches, feeds, _ = _build(PROGRAMS[name])
    md = af.RunMetadata()
    with af.Session(graph=g) as sess:
        sess.run_sync(
            fetches, feeds, options=af.RunOptions(output_partition_graphs=True), run_metadata=md
        )
    assert len(md.partition_graphs) == 1
    (pg,) = md.partition_graphs
    pg = _json_round_trip(pg)
    imported = _import_fresh(pg)
    types = {op.type for op in imported.get_operations()}
    assert {"_Retval", "Merge", "NextIteration", "Enter", "Exit"} <= types
    assert ("_Arg" in types) == bool(feeds)
    # Every node, edge (back edges included) and attribute came back.
    assert _by_name(imported.as_graph_def()) == _by_name(pg)
    for m in (op for op in imported.get_operations() if op.type == "Merge"):
        assert m.inputs[0].op.type != "NextIteration"


def test_partition_graphs_with_send_and_recv_import_again() -> None:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, (), name="x")
        with af.device("/cpu:0"):
            a = x * 2.0
        with af.device("/cpu:1"):
            b = a + 1.0
        with af.device("/cpu:0"):
            c = b * 3.0
    md = af.RunMetadata()
    with af.Session(graph=g, config=af.SessionConfig(device_count={"CPU": 2})) as sess:
        assert (
            sess.run_sync(
                c, {x: 1.0}, run_metadata=md, options=af.RunOptions(output_partition_graphs=True)
            )
            == 9.0
        )
    assert len(md.partition_graphs) == 2
    seen: set[str] = set()
    for pg in md.partition_graphs:
        pg = _json_round_trip(pg)
        imported = _import_fresh(pg)
        assert _by_name(imported.as_graph_def()) == _by_name(pg)
        seen.update(op.type for op in imported.get_operations())
    assert {"_Arg", "_Retval", "_Send", "_Recv"} <= seen


# -- fuzzing: mutated loop graph defs fail cleanly or import ---------------------------

_BASE = _loop_def()
_NAMES = [n["name"] for n in _BASE["node"]]


@st.composite
def _mutated_loop_defs(draw: st.DrawFn) -> Any:
    d = copy.deepcopy(_BASE)
    for _ in range(draw(st.integers(1, 3))):
        node = draw(st.sampled_from(d["node"]))
        action = draw(st.sampled_from(["rewire", "drop-input", "retype", "delete-node"]))
        if action == "rewire" and node["input"]:
            k = draw(st.integers(0, len(node["input"]) - 1))
            target = draw(st.sampled_from(_NAMES))
            node["input"][k] = draw(st.sampled_from([target, f"{target}:1", f"^{target}"]))
        elif action == "drop-input" and node["input"]:
            node["input"].pop(draw(st.integers(0, len(node["input"]) - 1)))
        elif action == "retype":
            node["op"] = draw(
                st.sampled_from(
                    ["Merge", "NextIteration", "Enter", "Exit", "Identity", "Switch", "LoopCond"]
                )
            )
        elif action == "delete-node" and len(d["node"]) > 1:
            d["node"].remove(node)
    return d


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated_loop_defs())
def test_fuzzed_loop_graph_defs_fail_cleanly(graph_def: Any) -> None:
    g = af.Graph()
    try:
        with g.as_default():
            import_graph_def(graph_def)
    except (ValueError, TypeError):
        pass
    else:
        # What imported must export back to the same nodes.
        assert _by_name(g.as_graph_def()) == _by_name(graph_def)


def test_control_input_beside_a_data_input_from_the_same_node_round_trips() -> None:
    # Found by the fuzz test above: "^x" beside a data input from x was dropped on
    # import (pruned as redundant), so the def did not export back to itself.  As TF's
    # importer, explicit control inputs are kept; control_dependencies() ops a data
    # input already waits for are still pruned.
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        af.identity(x, name="y")
    gd = g.as_graph_def()
    node = next(n for n in gd["node"] if n["name"] == "y")
    node["input"] = ["x", "^x"]
    g2 = af.Graph()
    with g2.as_default():
        af.import_graph_def(gd, name="")
    assert [op.name for op in g2.get_operation_by_name("y").control_inputs] == ["x"]
    exported = next(n for n in g2.as_graph_def()["node"] if n["name"] == "y")
    assert exported["input"] == ["x", "^x"]
    with g2.as_default(), af.control_dependencies([g2.get_operation_by_name("x")]):
        z = af.identity(g2.get_tensor_by_name("x:0"), name="z")
    assert z.op.control_inputs == ()  # implied by the data input: pruned as before
