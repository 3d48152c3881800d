"""Observation is a hook, not a path: a traced step, a step reporting progress and a
streaming step run the same engine, task mode and hand-offs as a plain one."""

from __future__ import annotations

from typing import Any

import numpy as np

import asyncflow as af
from asyncflow.runtime.barrier import ExecutorBarrier
from asyncflow.runtime.call_frame import CallFrame
from asyncflow.runtime.interpreter import ProgramPropagator
from asyncflow.runtime.propagators import PropagatorState
from asyncflow.runtime.step import Step


def _chain() -> tuple[af.Graph, af.Tensor, af.Tensor]:
    graph = af.Graph()
    with graph.as_default():
        x = af.placeholder(af.float64, shape=(), name="x")
        y = x
        for _ in range(5):
            y = y + 1.0
    return graph, x, y


def test_a_traced_step_replays_the_plans_schedule() -> None:
    graph, x, y = _chain()
    with af.Session(graph=graph) as sess:
        for _ in range(3):
            assert sess.run_sync(y, {x: 0.0}) == 5.0  # the plan gets its schedule
        bound = sess._prepare(y, {x: 0.0}).bound[0]
        plain = Step(bound, CallFrame([0.0]))
        traced = Step(bound, CallFrame([0.0]), trace=True)
        assert isinstance(plain, ProgramPropagator)
        assert isinstance(traced, ProgramPropagator)
        md = af.RunMetadata()
        full = af.RunOptions(trace_level=af.RunOptions.FULL_TRACE)
        assert sess.run_sync(y, {x: 0.0}, options=full, run_metadata=md) == 5.0
    adds = [
        n
        for d in md.step_stats.dev_stats
        for n in d.node_stats
        if n.op_type == "AddV2" or n.op_type == "Add"
    ]
    assert len(adds) == 5


def test_a_traced_loop_runs_its_straight_line_program() -> None:
    graph = af.Graph()
    with graph.as_default():
        out = af.while_loop(
            lambda i, s: i < 6,
            lambda i, s: (i + 1, s * 2.0),
            [af.constant(0), af.constant(np.float64(1.0))],
        )
    with af.Session(graph=graph) as sess:
        bound = sess._prepare(out, {}).bound[0]
        # The plan's first step: the general propagator, the loop on its programs; from
        # the second on (traced or not), one program holding the loop as one instruction.
        first = Step(bound, CallFrame([]))
        assert isinstance(first, PropagatorState)
        assert any(loop is not None for loop in first._loops)
        for trace in (True, False):
            prop = Step(bound, CallFrame([]), trace=trace)
            assert isinstance(prop, ProgramPropagator), trace
        md = af.RunMetadata()
        full = af.RunOptions(trace_level=af.RunOptions.FULL_TRACE)
        assert sess.run_sync(out, options=full, run_metadata=md) == [6, 64.0]
    stats = [n for d in md.step_stats.dev_stats for n in d.node_stats]
    muls = sorted(n.iter_id for n in stats if n.op_type == "Mul")
    assert muls == [0, 1, 2, 3, 4, 5]
    merges = {n.iter_id for n in stats if n.op_type == "Merge"}
    assert merges == {0, 1, 2, 3, 4, 5, 6}


def test_a_traced_multi_device_step_hands_off() -> None:
    graph = af.Graph()
    with graph.as_default():
        x = af.placeholder(af.float64, shape=(), name="x")
        with af.device("/cpu:1"):
            y = x * 2.0
        z = y + 1.0
    config = af.SessionConfig(device_count={"CPU": 2})
    with af.Session(graph=graph, config=config) as sess:
        call = sess._prepare(z, {x: 1.0})
        for trace in (False, True):
            barrier = ExecutorBarrier(
                call.bound, call.compiled.retval_map, CallFrame([1.0]), trace=trace
            )
            assert all(step._handoffs is not None for step in barrier._steps), trace
            barrier.release()


async def test_progress_counts_every_run_of_a_plan() -> None:
    # A step reporting progress counts its kernels on every run, also once the plan
    # replays its static schedule (the counted kernels run in the plan's order).
    graph, x, y = _chain()
    async with af.Session(graph=graph) as sess:
        for _ in range(4):
            events: list[Any] = []
            assert await sess.run(y, {x: 1.0}, options=af.RunOptions(progress=events.append)) == 6.0
            assert events[-1].finished
            assert events[-1].nodes_done == events[-1].nodes_total == 5
