"""Loops inside a partition's straight-line program: each loop frame one instruction
of the root frame's program (``root_runs_straight_line``).

Every graph runs on fresh sessions twice: lowered from its first run
(``schedule_after=0``) and on the general propagator only; results and errors (type,
node, message) must agree, and each test checks which engine ran, so a program that
silently stopped holding loops cannot pass as agreement.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import asyncflow as af
from asyncflow.runtime import interpreter, propagators
from tests.engines import engine_name
from tests.ordering import check_long_step_yields

Build = Callable[[], tuple[Any, dict[Any, Any]]]

PROGRAM = af.SessionConfig(executor_options=af.ExecutorOptions(schedule_after=0))
GENERAL = af.SessionConfig(executor_options=af.ExecutorOptions(straight_line=False))


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What ran, in order: ``program`` / ``general`` per step (a program's run starts
    with ``_rerun``, on a new step or on one kept from an earlier run), ``loop`` per
    loop instruction a program started."""
    seen: list[str] = []
    program_rerun = interpreter.ProgramPropagator._rerun
    general_init = propagators.PropagatorState._init_general
    start = interpreter.ProgramPropagator._start

    def program(self: interpreter.ProgramPropagator, *args: Any) -> None:
        seen.append("program")
        program_rerun(self, *args)

    def general(self: propagators.PropagatorState, *args: Any) -> None:
        seen.append("general")
        general_init(self, *args)

    def loop(self: interpreter.ProgramPropagator, signal: interpreter.RunLoop) -> None:
        seen.append("loop")
        start(self, signal)

    monkeypatch.setattr(interpreter.ProgramPropagator, "_rerun", program)
    monkeypatch.setattr(propagators.PropagatorState, "_init_general", general)
    monkeypatch.setattr(interpreter.ProgramPropagator, "_start", loop)
    return seen


def outcome(build: Build, config: af.SessionConfig) -> Any:
    """The fetched value, or ``('error', type, node, message)``."""
    graph = af.Graph()
    with graph.as_default():
        fetches, feeds = build()
    with af.Session(graph=graph, config=config) as sess:
        try:
            return sess.run_sync(fetches, feed_dict=feeds)
        except af.errors.OpError as exc:
            return ("error", type(exc), exc.node_name, exc.message)


def run_both(build: Build, engines: list[str], expected: list[str]) -> Any:
    """The outcome on the program path (whose engines must be ``expected``), checked
    against the general propagator's."""
    engines.clear()
    ours = outcome(build, PROGRAM)
    assert engines == expected
    engines.clear()
    general = outcome(build, GENERAL)
    assert engines == ["general"]
    same(ours, general)
    return ours


def same(a: Any, b: Any) -> None:
    if isinstance(a, tuple) and a and a[0] == "error":
        assert a == b
    elif isinstance(a, (tuple, list)):
        assert isinstance(b, (tuple, list))
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same(x, y)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            same(a[k], b[k])
    else:
        np.testing.assert_array_equal(a, b)
        assert np.asarray(a).dtype == np.asarray(b).dtype


def scan_rows(x: Any, h: Any, step: Callable[[Any, Any], Any], rows: int = 5) -> Any:
    """``dynamic_rnn``'s loop: the ``rows`` rows of ``x`` (of 3 values) through
    TensorArrays, state ``h``."""
    xs = af.TensorArray(af.float32, size=rows, element_shape=(3,)).unstack(x)
    out = af.TensorArray(af.float32, size=rows, element_shape=(3,))

    def body(i: Any, h: Any, flow: Any) -> Any:
        v = step(h, xs.read(i))
        return i + 1, v, af.TensorArray(af.float32, handle=out.handle, flow=flow).write(i, v).flow

    _, h, flow = af.while_loop(lambda i, h, flow: i < rows, body, (af.constant(0), h, out.flow))
    return af.TensorArray(af.float32, handle=out.handle, flow=flow).stack(), h


# -- the program runs loops ---------------------------------------------------------------


def test_map_fn_runs_as_one_program(engines: list[str]) -> None:
    data = np.arange(12, dtype=np.float32).reshape(4, 3)

    def build() -> tuple[Any, dict[Any, Any]]:
        x = af.placeholder(af.float32, shape=(4, 3), name="x")
        return af.map_fn(lambda r: r * 2.0 + 1.0, x), {x: data}

    got = run_both(build, engines, ["program", "loop"])
    np.testing.assert_array_equal(got, data * 2.0 + 1.0)


def test_two_tensor_array_loops_in_a_row_and_root_nodes_between(engines: list[str]) -> None:
    data = np.linspace(-1, 1, 15, dtype=np.float32).reshape(5, 3)

    def build() -> tuple[Any, dict[Any, Any]]:
        x = af.placeholder(af.float32, shape=(5, 3), name="x")
        first, h = scan_rows(x, af.zeros((3,)), lambda h, r: af.tanh(h * 0.5 + r))
        second, g = scan_rows(first * 2.0, h, lambda h, r: af.maximum(h, r))
        return {"second": second, "g": g, "sum": af.reduce_sum(first) + af.reduce_sum(g)}, {x: data}

    got = run_both(build, engines, ["program", "loop", "loop"])
    h = np.zeros(3, np.float32)
    rows = []
    for r in data:
        h = np.tanh(h * np.float32(0.5) + r)
        rows.append(h)
    np.testing.assert_allclose(
        got["second"], np.maximum.accumulate(np.maximum(h, 2 * np.stack(rows))), rtol=1e-6
    )


def test_a_loop_that_never_iterates_and_one_of_many_iterations(engines: list[str]) -> None:
    def build() -> tuple[Any, dict[Any, Any]]:
        n = af.placeholder(af.int32, shape=(), name="n")
        a = af.while_loop(lambda i, s: i < n, lambda i, s: (i + 1, s + 1.5), (0, af.constant(1.0)))
        b = af.while_loop(lambda i, s: i < 0, lambda i, s: (i + 1, s * 2), (0, a[1]))
        return (a, b), {n: 700}

    got = run_both(build, engines, ["program", "loop", "loop"])
    assert got == ((700, 1051.0), (0, 1051.0))


def test_a_cond_inside_the_body_keeps_the_program(engines: list[str]) -> None:
    def build() -> tuple[Any, dict[Any, Any]]:
        def body(i: Any, s: Any) -> Any:
            return i + 1, af.cond(af.equal(i % 2, 0), lambda: s + 1, lambda: s * 3)

        return af.while_loop(lambda i, s: i < 6, body, (0, af.constant(1))), {}

    assert run_both(build, engines, ["program", "loop"]) == (6, 66)


def test_nested_conds_and_a_case_inside_the_body_keep_the_program(engines: list[str]) -> None:
    # Both sides of every cond merge back into a live value: the loop's carries are
    # statically live however deep the branches nest.
    def build() -> tuple[Any, dict[Any, Any]]:
        def body(i: Any, s: Any) -> Any:
            odd = af.equal(i % 2, 1)

            def inner() -> Any:
                return af.cond(i > 2, lambda: s - 4.0, lambda: af.cond(odd, lambda: s, lambda: -s))

            t = af.cond(odd, inner, lambda: s * 2.0)
            u = af.case([(af.less(t, 0.0), lambda: t * 0.5)], default=lambda: t + 1.0)
            return i + 1, af.cond(odd, lambda: u, lambda: u + t)

        return af.while_loop(lambda i, s: i < 9, body, (0, af.constant(1.5))), {}

    i, s = run_both(build, engines, ["program", "loop"])
    expected = 1.5
    for k in range(9):
        odd = k % 2 == 1
        t = (expected - 4.0 if k > 2 else expected) if odd else expected * 2.0
        u = t * 0.5 if t < 0.0 else t + 1.0
        expected = u if odd else u + t
    assert (i, s) == (9, expected)


# -- what keeps the general propagator ----------------------------------------------------------


def test_a_cond_in_the_root_frame_keeps_the_general_propagator(engines: list[str]) -> None:
    def build() -> tuple[Any, dict[Any, Any]]:
        p = af.placeholder(af.bool, shape=(), name="p")
        start = af.cond(p, lambda: af.constant(2.0), lambda: af.constant(3.0))
        out = af.while_loop(lambda i, s: i < 3, lambda i, s: (i + 1, s * start), (0, start))
        return out, {p: True}

    assert run_both(build, engines, ["general"]) == (3, 16.0)


def test_a_loop_whose_carry_may_be_dead_keeps_the_general_propagator(
    engines: list[str],
) -> None:
    # From iteration 3 on, s's NextIteration is dead: the loop is not closed (it would
    # hand back to the general form), so the partition keeps the general propagator.
    def build() -> tuple[Any, dict[Any, Any]]:
        def body(i: Any, s: Any) -> Any:
            return i + 1, af.raw_ops.switch(s + 1.0, i < 3)[1]

        return af.while_loop(lambda i, s: i < 8, body, (af.constant(0), af.constant(0.0))), {}

    _, error_type, node, _ = run_both(build, engines, ["general"])
    assert error_type is af.errors.InvalidArgumentError  # a fetched dead tensor
    assert node == "while/Exit_1"


def test_an_async_kernel_in_the_body_keeps_the_general_propagator(engines: list[str]) -> None:
    def build() -> tuple[Any, dict[Any, Any]]:
        async def later(s: np.ndarray) -> np.float32:
            await asyncio.sleep(0)
            return np.float32(s + 1.0)

        def body(i: Any, s: Any) -> Any:
            t = af.py_func(later, [s], af.float32)
            t.set_shape(())
            return i + 1, t

        return af.while_loop(lambda i, s: i < 4, body, (0, af.constant(np.float32(0)))), {}

    assert run_both(build, engines, ["general"]) == (4, 4.0)


def test_the_rule_reads_the_schedules_closed_flag() -> None:
    from asyncflow.compiler.ir import graph_ir, ref_of
    from asyncflow.compiler.loop_schedule import root_runs_straight_line
    from asyncflow.compiler.pipeline import compile_signature

    def plan_of(body: Callable[[Any, Any], Any]) -> Any:
        graph = af.Graph()
        with graph.as_default():
            out = af.while_loop(lambda i, s: i < 5, body, (af.constant(0), af.constant(0.0)))
        compiled = compile_signature(
            graph_ir(graph),
            feeds=[],
            fetches=[ref_of(out[0]), ref_of(out[1])],
            targets=[],
            devices=["/job:localhost/replica:0/task:0/device:CPU:0"],
            incarnation=1,
        )
        (plan,) = compiled.plans
        return plan

    class Inline:
        flow = 0  # registry.INLINE: the kinds are not what this test is about

    closed = plan_of(lambda i, s: (i + 1, s + 1.0))
    open_ = plan_of(lambda i, s: (i + 1, af.raw_ops.switch(s + 1.0, i < 3)[1]))
    for plan, expected in ((closed, True), (open_, False)):
        (schedule,) = plan.loop_schedules[1:]
        assert schedule is not None
        assert schedule.closed is expected
        nodes = [Inline()] * len(plan.nodes)
        assert root_runs_straight_line(plan.frames, plan.loop_schedules, nodes) is expected


# -- failures, the clock, observers ---------------------------------------------------------


def test_an_error_in_the_body_names_its_node_and_the_session_stays_usable(
    engines: list[str],
) -> None:
    def check(i: np.ndarray) -> np.int32:
        if i == 17:
            raise ValueError(f"no iteration {int(i)}")
        return np.int32(i)

    def build() -> tuple[Any, dict[Any, Any]]:
        n = af.placeholder(af.int32, shape=(), name="n")

        def body(i: Any, s: Any) -> Any:
            v = af.py_func(check, [i], af.int32, name="checker")
            v.set_shape(())
            return i + 1, s + v

        out = af.while_loop(lambda i, s: i < n, body, (0, af.constant(0)))
        return out, {n: 100}

    _, error_type, node, message = run_both(build, engines, ["program", "loop"])
    assert error_type is af.errors.InvalidArgumentError
    assert node == "while/checker"
    assert "no iteration 17" in message
    graph = af.Graph()
    with graph.as_default():
        fetches, feeds = build()
    with af.Session(graph=graph, config=PROGRAM) as sess:
        with pytest.raises(af.errors.InvalidArgumentError, match="no iteration 17"):
            sess.run_sync(fetches, feeds)
        (n,) = feeds
        assert sess.run_sync(fetches, {n: 5}) == (5, 10)  # the same plan, still usable


def test_an_error_after_the_loop_names_the_root_node(engines: list[str]) -> None:
    def build() -> tuple[Any, dict[Any, Any]]:
        n = af.placeholder(af.int32, shape=(), name="n")
        _, v = af.while_loop(
            lambda i, v: i < n, lambda i, v: (i + 1, v * 2.0), (0, af.ones((2, 3)))
        )
        shape = af.placeholder(af.int32, shape=(2,), name="shape")
        return af.reshape(v, shape, name="reshaped"), {n: 3, shape: [4, 4]}

    _, error_type, node, message = run_both(build, engines, ["program", "loop"])
    assert error_type is af.errors.InvalidArgumentError
    assert node == "reshaped"
    assert "reshaped" in message


async def test_a_long_loop_yields_and_meets_its_deadline_inside_a_program(
    engines: list[str],
) -> None:
    graph = af.Graph()
    with graph.as_default():
        n = af.placeholder(af.int32, shape=(), name="n")
        out = af.while_loop(lambda i, s: i < n, lambda i, s: (i + 1, s + 1.0), (0, 0.0))
        after = out[1] * 2.0
    async with af.Session(graph=graph, config=PROGRAM) as sess:
        engines.clear()
        assert await sess.run(after, {n: 20_000}) == 40_000.0
        assert engines == ["program", "loop"]
        await check_long_step_yields(sess, after, {n: 10**9})  # a billion iterations
        assert await sess.run(after, {n: 3}) == 6.0  # still usable
        assert engines.count("program") == 4


#: The straight-line engines, but the root frame never lowered: the general propagator
#: running its loop frames' own programs (what a plan with loops ran before).
FAST_LOOPS = af.SessionConfig(executor_options=af.ExecutorOptions(schedule_after=10**9))


def _traced_names(config: af.SessionConfig) -> list[tuple[str, int]]:
    graph = af.Graph()
    with graph.as_default():
        x = af.placeholder(af.float32, shape=(3, 2), name="x")
        y = af.map_fn(lambda r: r + 1.0, x) * 2.0
    meta = af.RunMetadata()
    with af.Session(graph=graph, config=config) as sess:
        got = sess.run_sync(
            y,
            {x: np.ones((3, 2), np.float32)},
            options=af.RunOptions(trace_level=af.RunOptions.FULL_TRACE),
            run_metadata=meta,
        )
    np.testing.assert_array_equal(got, np.full((3, 2), 4.0, np.float32))
    stats = [n for d in meta.step_stats.dev_stats for n in d.node_stats]
    return sorted((n.node_name, n.iter_id) for n in stats)


def test_a_traced_program_records_what_the_loop_fast_path_does(engines: list[str]) -> None:
    engines.clear()
    ours = _traced_names(PROGRAM)
    assert engines == ["program", "loop"]
    engines.clear()
    before = _traced_names(FAST_LOOPS)
    assert engines == ["general"]
    assert ours == before
    assert ("mul", 0) in ours
    assert [k for name, k in ours if name.endswith("while/add")] == [0, 1, 2]


async def test_a_streamed_loop_output_is_told_when_its_loop_ends(
    engines: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from asyncflow.runtime.observe import retvals

    events: list[str] = []
    observer = retvals._exit_observer

    def exit_observer(*args: Any) -> Callable[[int, Any], None]:
        told = observer(*args)

        def on_exit(i: int, value: Any) -> None:
            events.append(f"exit {value}")
            told(i, value)

        return on_exit

    def record(v: np.ndarray) -> np.ndarray:
        events.append("later")
        return v * 3

    monkeypatch.setattr(retvals, "_exit_observer", exit_observer)
    graph = af.Graph()
    with graph.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        looped = af.while_loop(lambda i, s: i < 5, lambda i, s: (i + 1, s + x), (0, 0.0))
        later = af.py_func(record, [looped[1]], af.float32, stateful=True, name="later")
    for config, engine in ((PROGRAM, ["program", "loop"]), (FAST_LOOPS, ["general"])):
        async with af.Session(graph=graph, config=config) as sess:
            engines.clear()
            events.clear()
            seen = {f.name: v async for f, v in sess.run_stream([later, looped[1]], {x: 2.0})}
        assert engines == engine
        assert seen == {looped[1].name: 10.0, later.name: 30.0}
        assert events == ["exit 10.0", "later"]  # told as the loop ended, before later ran


def test_a_hopping_decode_before_a_loop_in_one_program(
    engines: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The decode of a large image hops to the step's dispatch; the program waits for
    # it, then runs the loop over its rows and the nodes after.
    pytest.importorskip("PIL")
    import io

    from PIL import Image

    from asyncflow.runtime.step import Step

    dispatched: list[str] = []
    dispatch = Step.dispatch

    def counted(self: Step, token: Any, i: int, node: Any, *args: Any, **kwargs: Any) -> None:
        dispatched.append(f"{self._bound.ops[i].name} {engine_name(self)}")
        dispatch(self, token, i, node, *args, **kwargs)

    monkeypatch.setattr(Step, "dispatch", counted)

    image = np.random.default_rng(7).integers(0, 256, (160, 120, 3), np.uint8)
    buf = io.BytesIO()
    Image.fromarray(image, "RGB").save(buf, format="PNG")

    def build() -> tuple[Any, dict[Any, Any]]:
        data = af.placeholder(af.string, (), name="data")
        pixels = af.cast(af.image.decode_png(data, name="decode"), af.float32)
        rows = af.map_fn(lambda row: af.reduce_sum(row), pixels)
        return af.reduce_max(rows, name="out"), {data: buf.getvalue()}

    got = run_both(build, engines, ["program", "loop"])
    assert got == image.astype(np.float32).sum(axis=(1, 2)).max()
    assert dispatched == ["decode ProgramPropagator", "decode PropagatorState"]
