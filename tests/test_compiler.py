"""The compile passes are pure functions over the IR: tested here without any event loop."""

from __future__ import annotations

import ast
import pathlib
import pickle
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asyncflow as af
from asyncflow.compiler.control_flow import add_control_loops, node_frames
from asyncflow.compiler.ir import GraphIR, NodeDef, graph_ir, ref_of
from asyncflow.compiler.partition import partition, partition_graph_def
from asyncflow.compiler.pipeline import compile_signature
from asyncflow.compiler.placement import place
from asyncflow.compiler.plan import build_plan
from asyncflow.compiler.prune import _scan, _walk, prune
from asyncflow.framework import registry
from asyncflow.runtime.bind import SPECIAL, bind
from asyncflow.runtime.devices import LocalDevice
from tests.test_property import random_graphs

CPU0 = "/job:localhost/replica:0/task:0/device:CPU:0"
CPU1 = "/job:localhost/replica:0/task:0/device:CPU:1"
PACKAGE = pathlib.Path(af.__file__).parent


def names(nodes: tuple[NodeDef, ...]) -> list[str]:
    return [n.name for n in nodes]


def _prune(
    graph: af.Graph,
    fetches: list[af.Tensor],
    targets: Sequence[af.Operation] = (),
    feeds: AbstractSet[af.Tensor] = frozenset(),
) -> tuple[NodeDef, ...]:
    """prune, checked against its other algorithm (the walk from the fetches)."""
    ir = graph_ir(graph)
    fetched, targeted = [ref_of(t) for t in fetches], [op.name for op in targets]
    fed = {ref_of(t) for t in feeds}
    nodes = prune(ir, fetched, targeted, fed)
    roots = [name for name, k in fetched if (name, k) not in fed] + targeted
    assert nodes == _walk(ir, list(roots), fed)
    if not ir.back_edges:
        assert nodes == _scan(ir, roots, fed)
    return nodes


def test_prune_keeps_only_ancestors(graph: af.Graph) -> None:
    a = af.placeholder(af.float32, name="a")
    b = af.add(a, 1.0, name="b")
    af.add(a, 2.0, name="unrelated")
    c = af.multiply(b, 3.0, name="c")
    nodes = _prune(graph, [c])
    assert "unrelated" not in names(nodes)
    assert names(nodes)[-1] == "c"
    assert {"a", "b", "c"} <= set(names(nodes))


def test_prune_feed_cuts_ancestors(graph: af.Graph) -> None:
    a = af.placeholder(af.float32, name="a")
    b = af.add(a, 1.0, name="b")
    c = af.multiply(b, 3.0, name="c")
    nodes = _prune(graph, [c], feeds={b})
    assert "a" not in names(nodes)
    assert "b" not in names(nodes)
    # A fed-and-fetched tensor needs nothing at all.
    assert _prune(graph, [b], feeds={b}) == ()


def test_prune_feed_not_needed_is_dropped(graph: af.Graph) -> None:
    a = af.placeholder(af.float32, name="a")
    other = af.placeholder(af.float32, name="other")
    c = af.add(a, 1.0, name="c")
    assert "other" not in names(_prune(graph, [c], feeds={other}))


def test_prune_follows_control_edges_and_targets(graph: af.Graph) -> None:
    a = af.constant(1.0, name="a")
    side = af.identity(a, name="side")
    with af.control_dependencies([side]):
        c = af.identity(a, name="c")
    target = af.no_op(name="target")
    assert {"a", "side", "c", "target"} == set(names(_prune(graph, [c], [target])))


def test_prune_is_topological_and_iterative(graph: af.Graph) -> None:
    x = af.constant(0.0)
    early = x
    for k in range(5000):  # deeper than the recursion limit
        x = af.add(x, 1.0)
        if k == 10:
            early = x
    nodes = _prune(graph, [x])  # the walk gives way to the scan
    assert len(_prune(graph, [early])) == 2 * 11 + 1  # a walk: 11 adds, their constants
    position = {n.name: i for i, n in enumerate(nodes)}
    for n in nodes:
        for name, _ in n.inputs:
            assert position[name] < position[n.name]


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(random_graphs(), st.data())
def test_prune_scan_and_walk_agree_on_random_graphs(
    case: tuple[af.Graph, list[Any], dict[Any, Any]], data: st.DataObject
) -> None:
    """The reverse scan gives the walk's nodes, in graph order, on random graphs with
    control edges, fed tensors and targets."""
    graph, fetches, feeds = case
    tensors = [t for t in fetches if isinstance(t, af.Tensor)]
    targets = [f for f in fetches if isinstance(f, af.Operation)]
    nodes = _prune(graph, tensors, targets, set(feeds))
    assert len({n.name for n in nodes}) == len(nodes)
    # A fed Placeholder with a control edge out of it: the feed carries the edge.
    with graph.as_default():
        p = af.placeholder(af.float64, shape=(3,), name="carried")
        with af.control_dependencies([p.op]):
            after = af.identity(data.draw(st.sampled_from(tensors)))
    assert "carried" not in names(_prune(graph, [after], feeds={p}))
    assert "carried" in names(_prune(graph, [after]))


def test_prune_walks_a_graph_with_back_edges(graph: af.Graph) -> None:
    """A while loop's Merge is made before the NextIteration feeding it: the IR says
    so and pruning walks from the fetches (the reverse scan would miss the loop
    body)."""
    x = af.placeholder(af.float32, shape=(), name="x")
    i, s = af.while_loop(
        lambda i, s: i < 3, lambda i, s: (i + 1, s + x), [af.constant(0), af.constant(0.0)]
    )
    ir = graph_ir(graph)
    assert ir.back_edges
    assert not graph_ir(af.Graph()).back_edges
    nodes = _prune(graph, [s])
    assert any(n.op == "NextIteration" for n in nodes)
    assert {n.name for n in nodes} == {n.name for n in ir.nodes} - {i.op.name}
    # The scan alone notices a needed node it never reached, and gives up.
    assert _scan(GraphIR.of(ir.nodes, back_edges=False), [s.op.name], set()) is None


def _nodes(graph: af.Graph) -> tuple[NodeDef, ...]:
    return graph_ir(graph).nodes


def test_placement_normalizes_device_names(graph: af.Graph) -> None:
    for spec in ["", "/cpu:1", "/device:CPU:1", CPU1, "/job:localhost", "/cpu:0"]:
        with af.device(spec):
            af.no_op()
    assert place(_nodes(graph), [CPU0, CPU1]) == (0, 1, 1, 1, 0, 0)


def test_placement_unknown_device_names_it_and_lists_devices(graph: af.Graph) -> None:
    with af.device("/cpu:7"):
        af.no_op(name="far")
    with pytest.raises(af.errors.InvalidArgumentError) as info:
        place(_nodes(graph), [CPU0])
    assert "/cpu:7" in str(info.value)
    assert CPU0 in str(info.value)
    assert info.value.node_name == "far"
    assert place(_nodes(graph), [CPU0], allow_soft_placement=True) == (0,)


def test_placement_malformed_device(graph: af.Graph) -> None:
    with af.device("/banana"):
        af.no_op(name="odd")
    with pytest.raises(af.errors.InvalidArgumentError, match="odd"):
        place(_nodes(graph), [CPU0])


def _one_partition(
    graph: af.Graph,
    fetches: list[af.Tensor],
    feeds: list[af.Tensor] = (),  # type: ignore[assignment]
) -> object:
    compiled = compile_signature(
        graph_ir(graph),
        feeds=[ref_of(t) for t in feeds],
        fetches=[ref_of(t) for t in fetches],
        targets=[],
        devices=[CPU0],
        incarnation=1,
    )
    (plan,) = compiled.plans
    return plan


def test_plan_tables(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, name="x")
    one = af.constant(np.float32(1.0), name="one")
    a = af.add(x, one, name="a")
    b = af.multiply(a, a, name="b")
    c = af.add(a, b, name="c")
    plan = _one_partition(graph, [c], [x])
    # The constant is preloaded, not scheduled; the placeholder is fed, not run.
    assert [n.name for n in plan.nodes] == ["a", "b", "c"]  # type: ignore[attr-defined]
    ia, ib, ic = 0, 1, 2
    assert plan.initial_ready == (ia,)  # type: ignore[attr-defined]
    assert plan.initial_pending == (0, 1, 2)  # type: ignore[attr-defined]
    assert set(plan.consumers[ia]) == {ib, ic}  # type: ignore[attr-defined]
    assert plan.consumers[ib] == (ic,)  # type: ignore[attr-defined]
    # a's value is read by b and c: reference counted; b's by c only: freed by c.
    slot_a, slot_b, slot_c = plan.out  # type: ignore[attr-defined]
    assert slot_a in plan.counted[ib]  # type: ignore[attr-defined]
    assert slot_a in plan.counted[ic]  # type: ignore[attr-defined]
    assert plan.initial_refs[slot_a] == 2  # type: ignore[attr-defined]
    assert slot_b in plan.frees[ic]  # type: ignore[attr-defined]
    # c is fetched: never freed.
    assert all(slot_c not in f for f in plan.frees)  # type: ignore[attr-defined]
    assert plan.retval_slots == (slot_c,)  # type: ignore[attr-defined]
    assert plan.initial_values[plan.inputs[ia][1]] == np.float32(1.0)  # type: ignore[attr-defined]
    assert plan.arg_slots == (plan.inputs[ia][0],)  # type: ignore[attr-defined]
    assert plan.frames is None  # type: ignore[attr-defined]


def test_bind_records_kernel_kinds_and_is_the_only_runtime_step(graph: af.Graph) -> None:
    async def slow(v: np.ndarray) -> np.ndarray:
        return v

    x = af.constant(1.0)
    y = af.py_func(slow, [x], af.float32)
    z = af.py_func(_identity, [y], af.float32, expensive=True)
    plan = _one_partition(graph, [z])
    bound = bind(plan, LocalDevice(CPU0, "CPU", 0, 1))  # type: ignore[arg-type]
    assert [n.kind for n in bound.nodes] == [registry.ASYNC, registry.EXPENSIVE]
    assert not bound.all_inline


def _identity(v: np.ndarray) -> np.ndarray:
    return v


def test_bind_of_static_kernels_matches_binding_each_node(
    graph: af.Graph, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nodes of static inline kernels (two inputs or fewer) are bound from the kernel
    of their op type's first node; every field equals what binding each node on its
    own gives, with a node of three inputs beside them, and in a plan with a cond
    (whose Merge's inputs are special)."""
    x = af.placeholder(af.float32, shape=(), name="x")
    y = x + 1.0
    y = y * y - x
    z = af.add_n([y, x, y])
    out = af.negative(z + y)
    c = af.cond(z > 0.0, lambda: z + 1.0, lambda: z - 1.0)
    device = LocalDevice(CPU0, "CPU", 0, 1)
    plans = [_one_partition(graph, [out], feeds=[x]), _one_partition(graph, [c], feeds=[x])]
    fast = [bind(plan, device) for plan in plans]  # type: ignore[arg-type]
    monkeypatch.setattr(registry.KernelDef, "static", False)  # every node on its own
    general = [bind(plan, device) for plan in plans]  # type: ignore[arg-type]
    kinds = []
    for f, g in zip(fast, general):
        assert len(f.nodes) == len(g.nodes)
        kinds.append({a.kind for a in f.nodes})
        for a, b in zip(f.nodes, g.nodes):
            assert a[1:9] == b[1:9]  # kind, arity, inputs, out, outputs, consumers, frees, counted
            assert (a.getter is None) == (b.getter is None)
            assert a.flow == b.flow
    assert kinds[0] == {registry.INLINE}
    assert SPECIAL in kinds[1]


def test_bind_missing_kernel_is_not_found(graph: af.Graph) -> None:
    registry.define_op("_NoKernelHere", lambda inputs, attrs: [])
    graph.create_op("_NoKernelHere", [], name="lonely")
    part = partition(_nodes(graph), (0,), [CPU0], [], [], ["lonely"], 1)[0]
    with pytest.raises(af.errors.NotFoundError, match="lonely"):
        bind(build_plan(part), LocalDevice(CPU0, "CPU", 0, 1))


# -- the IR is a plain value ----------------------------------------------------------------


def _loop_graph(graph: af.Graph) -> af.Tensor:
    with af.device("/cpu:0"):
        i = af.constant(0, name="i0")
        s = af.constant(0.0, name="s0")

    def body(i: af.Tensor, s: af.Tensor) -> tuple[af.Tensor, af.Tensor]:
        with af.device("/cpu:1"):
            s2 = s + af.cast(i, af.float32)
        return i + 1, s2

    loop_vars: list[af.Tensor] = af.while_loop(lambda i, s: i < 5, body, [i, s])
    return loop_vars[1]


def test_compiled_partitions_pickle_and_round_trip(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, shape=(2,), name="x")
    with af.device("/cpu:1"):
        y = af.multiply(x, 3.0, name="y")
    z = af.reduce_sum(y, name="z")
    total = _loop_graph(graph)
    compiled = compile_signature(
        graph_ir(graph),
        feeds=[ref_of(x)],
        fetches=[ref_of(z), ref_of(total)],
        targets=[],
        devices=[CPU0, CPU1],
        incarnation=7,
    )
    assert len(compiled.plans) == 2
    data = pickle.dumps(compiled)
    back = pickle.loads(data)
    for mine, theirs in zip(compiled.plans, back.plans):
        assert mine.partition.device == theirs.partition.device
        assert len(mine.partition.nodes) == len(theirs.partition.nodes)
        for a, b in zip(mine.partition.nodes, theirs.partition.nodes):
            _same_node(a, b)
        assert mine.initial_pending == theirs.initial_pending
        assert mine.consumers == theirs.consumers
        assert mine.frames == theirs.frames
        assert repr(mine) == repr(theirs)
    assert back.retval_map == compiled.retval_map
    # A partition prints as a graph def, and round-trips through JSON-able values.
    for plan in back.plans:
        gd = partition_graph_def(plan.partition)
        assert {n["op"] for n in gd["node"]} >= {"_Send", "_Recv"}


def _same_node(a: NodeDef, b: NodeDef) -> None:
    for field in NodeDef._fields:
        x, y = getattr(a, field), getattr(b, field)
        if field == "attrs":
            assert x.keys() == y.keys()
            for k in x:
                if isinstance(x[k], np.ndarray):
                    np.testing.assert_array_equal(x[k], y[k])
                else:
                    assert x[k] == y[k], (a.name, k)
        else:
            assert x == y, (a.name, field)


def test_cross_device_loop_gets_a_control_loop_per_receiving_device(graph: af.Graph) -> None:
    total = _loop_graph(graph)
    ir = graph_ir(graph)
    nodes = prune(ir, [ref_of(total)], [])
    placement = place(nodes, [CPU0, CPU1])
    frames = node_frames(nodes)
    new_nodes, new_placement, new_frames, loops = add_control_loops(nodes, placement, frames)
    # The body's add is on cpu:1 and receives from the loop on cpu:0: one control loop on
    # cpu:1; the loop's next value comes back to cpu:0: one there too.
    assert {device for _, device in loops} == {0, 1}
    added = new_nodes[len(nodes) :]
    assert {n.op for n in added} == {"Const", "Enter", "Merge", "Switch", "NextIteration"}
    assert len(new_placement) == len(new_nodes)
    for n in added:
        if n.op == "Switch":  # the predicate is the leader's LoopCond
            assert ir.by_name[n.inputs[1][0]].op == "LoopCond"
    assert all(new_frames.frame[n.name] for n in added if n.op in ("Merge", "Switch"))
    # Nothing of the input changed: passes return new values.
    assert nodes == prune(ir, [ref_of(total)], [])


def test_graph_ir_is_cached_per_op_and_plain(graph: af.Graph) -> None:
    a = af.constant(1.0, name="a")
    b = af.add(a, 2.0, name="b")
    ir = graph_ir(graph)
    assert isinstance(ir, GraphIR)
    assert graph_ir(graph).by_name["b"] is ir.by_name["b"]
    node = ir.by_name["b"]
    assert node.op == "AddV2" or node.op == "Add"
    assert node.inputs == (("a", 0), (b.op.inputs[1].op.name, 0))
    with pytest.raises(AttributeError):
        node.name = "c"  # type: ignore[misc]
    pickle.loads(pickle.dumps(ir.nodes))


# -- layering -------------------------------------------------------------------------------


def _imports(path: pathlib.Path) -> set[str]:
    """Every asyncflow module ``path`` imports: at module level, in a function, or for
    type checking only (each is an arrow of the design)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "asyncflow":
            found.update(f"asyncflow.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m.startswith("asyncflow")}


def _module(path: pathlib.Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _graph() -> dict[str, set[str]]:
    return {_module(p): _imports(p) for p in PACKAGE.rglob("*.py")}


def test_compiler_never_imports_runtime_or_session() -> None:
    for module, imports in _graph().items():
        if module.startswith("asyncflow.compiler"):
            bad = {m for m in imports if m.startswith(("asyncflow.runtime", "asyncflow.session"))}
            assert not bad, f"{module} imports {bad}"


def test_layers_point_one_way() -> None:
    # framework -> compiler -> runtime -> session: nothing imports a layer above it.
    order = ["asyncflow.framework", "asyncflow.compiler", "asyncflow.runtime", "asyncflow.session"]

    def layer(module: str) -> int:
        for k, prefix in enumerate(order):
            if module == prefix or module.startswith(prefix + "."):
                return k
        return -1

    for module, imports in _graph().items():
        here = layer(module)
        if here < 0:
            continue
        for m in imports:
            assert layer(m) <= here, f"{module} (layer {order[here]}) imports {m}"
    session = _graph()["asyncflow.session"]
    assert not {m for m in session if m.startswith("asyncflow.ops")}, session
    assert not {m for m in _graph()["asyncflow.config"] if m.startswith("asyncflow.runtime")}


def test_import_graph_has_no_cycle() -> None:
    graph = _graph()
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for m in sorted(graph.get(module, ())):
            if m == module or m not in graph:
                continue
            if state.get(m) == 1:
                pytest.fail(f"import cycle: {' -> '.join([*path, m])}")
            if not state.get(m):
                visit(m, [*path, m])
        state[module] = 2

    for module in sorted(graph):
        if not state.get(module):
            visit(module, [module])
