"""A partition's program, and a loop iteration's, runs as one Python function per block.

A block's function has one line per node (a plain kernel's call and its slots'
frees written out, a started call's start, a join's check at the top, any other node
its closure's call), compiled once per shape of block: blocks alike (a long chain's)
share the template's code with their own constants.  A failing line names its node,
in any block of any shape.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

import asyncflow as af
from asyncflow.runtime import block_code

FROM_FIRST_RUN = af.SessionConfig(executor_options=af.ExecutorOptions(schedule_after=0))
CHAIN = 800  # four blocks of at most 256 instructions


def _chain(graph: af.Graph, n: int = CHAIN) -> tuple[af.Tensor, af.Tensor]:
    with graph.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        y = x
        for k in range(n):
            y = af.add(y, np.float32(1.0), name=f"add{k}")
    return x, y


def _program(sess: af.Session, fetch: af.Tensor, feed: dict[Any, Any]) -> Any:
    program = sess._prepare(fetch, feed).bound[0].derived["program"]
    assert program is not None
    return program


def test_blocks_of_one_shape_compile_once_and_keep_their_own_slots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(block_code, "_TEMPLATES", {})
    compiled: list[int] = []
    compile_one = block_code._compile

    def counted(shape: Any) -> Any:
        compiled.append(1)
        return compile_one(shape)

    monkeypatch.setattr(block_code, "_compile", counted)
    x, y = _chain(af.Graph())
    with af.Session(graph=y.graph, config=FROM_FIRST_RUN) as sess:
        assert sess.run_sync(y, {x: 1.0}) == CHAIN + 1
        assert sess.run_sync(y, {x: 2.0}) == CHAIN + 2
        program = _program(sess, y, {x: 1.0})
        ops = sess._prepare(y, {x: 1.0}).bound[0].ops
    blocks = [program.block(b) for b in range(len(program.blocks))]
    assert len(blocks) == 4
    first, second, third, _ = (b.__code__ for b in blocks)
    # The middle blocks are alike (the first reads the fed value, which is not freed):
    # one compiled template, two sets of slots.
    assert second.co_code == third.co_code
    assert second.co_consts != third.co_consts
    assert first.co_code != second.co_code
    assert len(compiled) == 3  # the three shapes
    # Every line calls its own node's kernel.
    called = [n for b in range(4) for n, _ in program.calls(b)]
    assert [ops[n].name for n in called] == [f"add{k}" for k in range(CHAIN)]


def test_a_failing_kernel_in_a_later_block_names_its_node() -> None:
    graph = af.Graph()
    with graph.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        limit = af.placeholder(af.float32, shape=(), name="limit")
        y = x
        for k in range(400):
            y = af.add(y, np.float32(1.0), name=f"add{k}")

        def check(v: np.ndarray, bound: np.ndarray) -> np.ndarray:
            if v > bound:
                raise ValueError(f"{v} is over {bound}")
            return v

        y = af.py_func(check, [y, limit], af.float32, name="over_the_limit")
        for k in range(20):
            y = af.add(y, np.float32(1.0), name=f"after{k}")
    with af.Session(graph=graph, config=FROM_FIRST_RUN) as sess:
        assert sess.run_sync(y, {x: 0.0, limit: 1e9}) == 420.0
        with pytest.raises(af.errors.InvalidArgumentError, match="over_the_limit") as info:
            sess.run_sync(y, {x: 0.0, limit: 10.0})
        assert info.value.node_name == "over_the_limit"
        assert sess.run_sync(y, {x: 1.0, limit: 1e9}) == 421.0  # the session goes on
        assert _program(sess, y, {x: 0.0, limit: 1.0}).block(1) is not None


async def test_a_program_starts_its_calls_and_joins_them_in_two_blocks() -> None:
    # The service's step: an op, two calls started in one block, then the block that
    # joins both at its top and reads them.  The first block checks the second's first
    # join ahead, so the second is called once a run, when both values are there (not
    # once more only to find the first call still running).
    async def io(v: np.ndarray) -> np.ndarray:
        await asyncio.sleep(0)
        return v

    graph = af.Graph()
    with graph.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        a = af.py_func(io, [x], af.float32, name="io_a")
        b = af.py_func(io, [af.add(x, np.float32(1.0))], af.float32, name="io_b")
        y = af.multiply(af.add(a, b), np.float32(2.0), name="y")
    async with af.Session(graph=graph, config=FROM_FIRST_RUN) as sess:
        for v in range(3):
            assert await sess.run(y, {x: float(v)}) == (2 * v + 1) * 2
        program = _program(sess, y, {x: 0.0})
        second = program.block(1)
        calls: list[int] = []

        def counted(vals: list[Any], step: Any) -> Any:
            calls.append(1)
            return second(vals, step)

        program.blocks[1] = counted
        for v in range(3):
            assert await sess.run(y, {x: float(v)}) == (2 * v + 1) * 2
        assert len(calls) == 3
    assert len(program.blocks) == 2
    assert program.program.spans[0][2] == ()  # nothing joined before the starts
    assert len(program.program.spans[1][2]) == 2  # both calls joined at the top


def test_a_loop_iteration_is_one_block_call_and_a_failing_line_names_its_node() -> None:
    from asyncflow.runtime.loop_fastpath import fast_loops

    graph = af.Graph()
    with graph.as_default():
        n = af.placeholder(af.int32, shape=(), name="n")
        limit = af.placeholder(af.float32, shape=(), name="limit")

        def check(v: np.ndarray, bound: np.ndarray) -> np.ndarray:
            if v > bound:
                raise ValueError(f"{v} is over {bound}")
            return v

        def body(i: Any, acc: Any) -> tuple[Any, Any]:
            grown = af.add(acc, af.cast(i, af.float32), name="grow")
            checked = af.py_func(check, [grown, limit], af.float32, name="over_the_limit")
            checked.set_shape(())
            return af.add(i, 1, name="step"), checked

        _, total = af.while_loop(lambda i, acc: i < n, body, [af.constant(0), np.float32(0)])
    with af.Session(graph=graph) as sess:
        assert sess.run_sync(total, {n: 5, limit: 1e9}) == 10.0
        bound = sess._prepare(total, {n: 5, limit: 1e9}).bound[0]
        (loop,) = (lp for lp in fast_loops(bound) if lp is not None)
        # The body of an iteration that goes on: one function, its lines calling the
        # nodes' own kernels (the py_func's too: a plain kernel of one output).
        called = {
            bound.ops[node].name for node, _ in block_code.calls_of(loop.true, loop.true_lines)
        }
        assert {"grow", "step", "over_the_limit"} <= {name.rsplit("/", 1)[-1] for name in called}
        with pytest.raises(af.errors.InvalidArgumentError, match="over_the_limit") as info:
            sess.run_sync(total, {n: 5, limit: 3.0})
        assert info.value.node_name is not None
        assert info.value.node_name.rsplit("/", 1)[-1] == "over_the_limit"
        assert sess.run_sync(total, {n: 4, limit: 1e9}) == 6.0  # the session goes on
