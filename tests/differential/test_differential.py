"""CI's differential run: random programs, asyncflow vs the numpy reference oracle.

A fixed seed range, so that a failure names a program anyone can replay with
``python -m tests.differential --ref 1 --seed S``.  TensorFlow is never imported
here (``python -m tests.differential --tf N`` is the TF run).
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import inspect
import itertools
import sys
from collections.abc import Iterable
from typing import Any

import numpy as np
import pytest

import asyncflow as af
from asyncflow.runtime import step as step_module
from asyncflow.session import core as session_module
from asyncflow.session.runners import SyncRunners

from .oracles import Outcome, compare, run_asyncflow, run_numpy, run_reference
from .programs import CATEGORIES, Program, generate

#: Programs of CI's run (seeds 0 .. PROGRAMS - 1), each on every variant below.
PROGRAMS = 500
#: And a few more each day: seeds past the fixed range that move with the date, so
#: successive CI runs reach new programs (a failure names its seed, replayable with
#: ``python -m tests.differential --ref 1 --seed S``).
DAILY = 20


def daily_seeds(today: datetime.date | None = None) -> range:
    """The ``DAILY`` extra seeds of ``today``'s runs (a new block every day)."""
    day = (today or datetime.date.today()).toordinal()
    first = 100_000 + (day % 10_000) * DAILY
    return range(first, first + DAILY)


#: The variant run is split into this many tests (a failure names its chunk).
CHUNKS = 10


#: Every way a session can run a program: (name, SessionConfig keywords, traced).
#: Engines (straight-line interpreter where the plan allows / the general propagator
#: only) x traced or not x optimizer L0 / L1 x hand-offs or futures between devices x
#: three shuffles of the general propagator's ready batches.
SEEDS = (0, 1, 2)


def _variants() -> list[tuple[str, af.SessionConfig, bool]]:
    out = []
    for straight, traced, level, handoffs, seed in itertools.product(
        (True, False),
        (False, True),
        (af.OptimizerOptions.L1, af.OptimizerOptions.L0),
        (True, False),
        SEEDS,
    ):
        # A straight-line variant with a shuffle seed of 1 or 2 lowers its plans from
        # their first run (the shuffle only moves the general propagator's batches).
        options = af.ExecutorOptions(
            straight_line=straight,
            handoffs=handoffs,
            shuffle_seed=seed,
            schedule_after=0 if straight and seed else 1,
        )
        graph = af.GraphOptions(optimizer_options=af.OptimizerOptions(opt_level=level))
        name = (
            f"{'straight' if straight else 'general'}/{'traced' if traced else 'plain'}/"
            f"{'L1' if level == af.OptimizerOptions.L1 else 'L0'}/"
            f"{'handoff' if handoffs else 'future'}/shuffle{seed}"
        )
        out.append(
            (
                name,
                af.SessionConfig(
                    device_count={"CPU": 2}, graph_options=graph, executor_options=options
                ),
                traced,
            )
        )
    return out


VARIANTS = _variants()
_TRACE = af.RunOptions(trace_level=af.RunOptions.FULL_TRACE, timeout_in_ms=20_000)

#: The plain variants pass no deadline of their own (their steps are awaited by the
#: session driver's own loop); these run every program under one, so an untraced
#: ``Step.run`` under the driver's deadline runs them too: one per engine.
DEADLINE_VARIANTS = [
    (f"{name}/deadline", config)
    for name, config, traced in VARIANTS
    if not traced
    and config.executor_options.handoffs
    and config.executor_options.shuffle_seed == 0
    and config.graph_options.optimizer_options.opt_level == af.OptimizerOptions.L1
]
_DEADLINE = af.RunOptions(timeout_in_ms=20_000)


def _expected(program: Program) -> Outcome:
    return run_numpy(program)


def _check(program: Program, expected: Outcome, traced_steps: list[int]) -> list[str]:
    """``program`` on every variant against ``expected``: the failures."""
    failures = []
    # A program on one device runs one partition: no hand-off either way, so the
    # future-based variants would repeat the hand-off ones exactly.
    several = bool({n.device for n in program.nodes} - {None, "/cpu:0"})
    for name, config, traced in VARIANTS:
        if not several and not config.executor_options.handoffs:
            continue
        before = len(traced_steps)
        ours = run_asyncflow(program, config=config, run_options=_TRACE if traced else None)
        if traced and any(o[0] == "ok" for o in ours) and len(traced_steps) == before:
            failures.append(f"seed {program.seed} [{name}]: no step was traced")
        why = compare(ours, expected)
        if why is not None:
            failures.append(f"seed {program.seed} ({program.category}) [{name}]: {why}")
    for name, config in DEADLINE_VARIANTS:
        why = compare(run_asyncflow(program, config=config, run_options=_DEADLINE), expected)
        if why is not None:
            failures.append(f"seed {program.seed} ({program.category}) [{name}]: {why}")
    return failures


@pytest.fixture
def traced_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The oracle passes no RunMetadata: a run asking for FULL_TRACE is traced anyway
    (the stats are made and dropped), and each traced step is counted here."""
    counted: list[int] = []

    def wants(options: af.RunOptions | None, run_metadata: Any) -> bool:
        traced = options is not None and options.trace_level >= af.RunOptions.FULL_TRACE
        if traced:
            counted.append(1)
        return traced

    monkeypatch.setattr(session_module, "_wants_trace", wants)
    return counted


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_every_variant_agrees_with_the_numpy_reference(chunk: int, traced_steps: list[int]) -> None:
    failures = []
    for seed in [*range(chunk, PROGRAMS, CHUNKS), *daily_seeds()[chunk::CHUNKS]]:
        program = generate(seed)
        failures += _check(program, _expected(program), traced_steps)
    assert failures == []


def test_asyncflow_agrees_with_the_numpy_reference_on_every_program() -> None:
    """The default session against both references, and the outcomes the generator
    reaches (every category, both outcomes, errors included)."""
    failures = []
    categories: collections.Counter[str] = collections.Counter()
    outcomes: collections.Counter[str] = collections.Counter()
    for seed in range(PROGRAMS):
        program = generate(seed)
        categories[program.category] += 1
        ours = run_asyncflow(program)
        outcomes.update(o[0] if o[0] == "ok" else o[2] for o in ours)
        why = compare(ours, run_numpy(program))
        if why is None:
            reference = run_reference(program)
            if reference is not None:
                why = compare(ours, reference)
                why = None if why is None else f"vs reference_run: {why}"
        if why is not None:
            failures.append(f"seed {seed} ({program.category}): {why}")
    assert failures == []
    assert set(categories) == set(CATEGORIES)
    assert outcomes["ok"] > PROGRAMS
    for error in ("InvalidArgumentError", "OutOfRangeError", "CancelledError"):
        assert outcomes[error] > 0, outcomes


def test_the_loop_fast_path_runs_in_the_straight_line_variants(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Agreement means nothing if the straight-line variants never took the fast path.
    from asyncflow.runtime import loop_fastpath

    programs = [
        p for p in map(generate, range(PROGRAMS)) if any(n.kind == "while" for n in p.nodes)
    ]
    assert len(programs) >= 10
    begun: list[bool] = []
    begin = loop_fastpath.LoopRun.begin

    def counted(run: loop_fastpath.LoopRun) -> bool:
        started = begin(run)
        begun.append(started)
        return started

    monkeypatch.setattr(loop_fastpath.LoopRun, "begin", counted)
    straight = af.SessionConfig(device_count={"CPU": 2})
    general = af.SessionConfig(
        device_count={"CPU": 2}, executor_options=af.ExecutorOptions(straight_line=False)
    )
    for p in programs:
        run_asyncflow(p, config=straight)
    assert sum(begun) >= 3  # the rest are folded, pruned or error out before the loop
    begun.clear()
    for p in programs:
        run_asyncflow(p, config=general)
    assert not any(begun)


def test_the_sync_door_agrees_and_starts_image_programs_on_no_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Programs decoding images, through ``run_sync``: the numpy reference's values,
    and the door taking the path the plan allows.  A plan whose only async nodes are
    decodes (a straight-line program holding them) starts on no event loop: a small
    image finishes there, a large one hops and enters the thread's loop after."""
    programs = [
        p for p in map(generate, range(PROGRAMS)) if any(n.kind == "image" for n in p.nodes)
    ]
    assert len(programs) >= 10
    entered: list[int] = []
    doors: collections.Counter[str] = collections.Counter()
    run_sync, run_loop = session_module.Session._run_sync, SyncRunners.run

    def counted_loop(self: SyncRunners, coro: Any) -> Any:
        entered.append(1)
        return run_loop(self, coro)

    def door(self: af.Session, call: Any, *args: Any) -> Any:
        before = len(entered)
        try:
            return run_sync(self, call, *args)
        finally:
            decodes = any(n.op == "DecodePng" for b in call.bound for n in b.plan.nodes)
            if decodes and not call.fast:
                path = "sync_first" if call.sync_first else "loop"
                doors[f"{path}, {'entered' if len(entered) > before else 'no loop'}"] += 1

    monkeypatch.setattr(session_module.Session, "_run_sync", door)
    monkeypatch.setattr(SyncRunners, "run", counted_loop)
    failures = []
    for p in programs:
        why = compare(run_asyncflow(p, sync=True), run_numpy(p))
        if why is not None:
            failures.append(f"seed {p.seed} ({p.category}): {why}")
    assert failures == []
    # Small images decoded inline (no loop at all), large ones hopped; plans with
    # other async nodes (queues, sleeps) or several partitions start on the loop.
    assert doors["sync_first, no loop"] >= 10, doors
    assert doors["sync_first, entered"] >= 3, doors
    assert doors["loop, entered"] >= 1, doors
    assert doors["loop, no loop"] == 0, doors


def _untraced_variants() -> list[tuple[str, af.SessionConfig]]:
    """One variant per engine, optimizer level and shuffle: untraced, with hand-offs."""
    return [(n, c) for n, c, traced in VARIANTS if c.executor_options.handoffs and not traced]


def _agree(programs: list[Program], name: str, config: af.SessionConfig) -> None:
    for p in programs:
        assert compare(run_asyncflow(p, config=config), _expected(p)) is None, (p.seed, name)


def test_root_programs_run_loops_in_the_straight_line_variants(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Loops in a root frame that routes nothing run as instructions of the root
    # frame's program (on their second run, or from the first with schedule_after=0);
    # the general variants never do.
    from asyncflow.runtime import interpreter

    programs = [generate(seed, "loops") for seed in range(12)]
    started = _counted(monkeypatch, interpreter.ProgramPropagator, "_start")
    _reached_in_straight_line_variants(programs, started, 10)


def _counted(
    monkeypatch: pytest.MonkeyPatch, owner: type, name: str, when: Any = None
) -> list[int]:
    """A list that gets an entry each time ``owner.name`` is called (with a first
    argument after the instance that ``when`` accepts, when given)."""
    calls: list[int] = []
    method = getattr(owner, name)

    def counted(self: Any, *args: Any) -> Any:
        if when is None or when(args[0]):
            calls.append(1)
        return method(self, *args)

    monkeypatch.setattr(owner, name, counted)
    return calls


def _thrice(programs: Iterable[Program]) -> list[Program]:
    """Each run of each program three times in a row (the reference's too): a plan's
    later runs find it lowered on its second run in every straight-line variant."""
    return [dataclasses.replace(p, runs=[r for r in p.runs for _ in range(3)]) for p in programs]


def _reached_in_straight_line_variants(
    programs: list[Program], reached: list[int], at_least: int
) -> None:
    """``programs`` agree with the reference in every untraced variant, and what
    ``reached`` counts happened ``at_least`` times in each straight-line variant, never
    in a general one."""
    for name, config in _untraced_variants():
        reached.clear()
        _agree(programs, name, config)
        if config.executor_options.straight_line:
            assert len(reached) >= at_least, name
        else:
            assert not reached, name


def test_programs_start_and_join_calls_in_the_straight_line_variants(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Async calls on one device that a fixed order starts as early as the general
    # engine (one level, chains, pairs read together) run as a straight-line program
    # that starts each call and joins it before its first reader, under deadlines and
    # callers that give up too; the general variants never start a node.
    from asyncflow.runtime import interpreter

    programs = [generate(seed, "deadlines") for seed in range(24)]
    started = _counted(  # a started node's value arrived
        monkeypatch,
        interpreter.ProgramPropagator,
        "complete",
        lambda token: type(token) is interpreter.Start,
    )
    _reached_in_straight_line_variants(programs, started, 10)


def test_programs_hop_large_image_decodes_in_the_straight_line_variants(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A decode whose image is too large for its ``nowait`` twin hops: the program hands
    # that node to the step's dispatch, waits, and resumes at the block after it.
    # Each run of the image programs three times in a row, so the variants that lower
    # a plan on its second run hop too; the general variants never run a program.
    from asyncflow.runtime import interpreter

    programs = _thrice(
        p
        for p in (generate(seed, c) for c in ("numerics", "control_flow") for seed in range(120))
        if any(n.kind == "image" and n.attrs["rows"] > 1 for n in p.nodes)  # (no state)
    )
    assert len(programs) >= 10
    hopped = _counted(
        monkeypatch,
        interpreter.ProgramPropagator,
        "complete",
        lambda token: type(token) is not interpreter.Start,
    )
    _reached_in_straight_line_variants(programs, hopped, 15)


def test_completed_steps_run_again_in_the_straight_line_variants(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A step the driver made that completed is kept by its call, and the call's next
    # steps run on it, its program's state made anew (``Step.again``): runs of the
    # same plan after runs that returned, failed, timed out or were given up on, with
    # other feeds; the general variants never keep one.
    from asyncflow.runtime import interpreter

    # Each run three times in a row (the reference too): a plan's later steps run on
    # its earlier ones', whatever their outcome (lowered from the first run or the
    # second, by variant).  (Not queue programs: their generator sizes each queue for
    # its runs once.)
    programs = _thrice(
        generate(seed, c) for c in ("deadlines", "functions", "loops") for seed in range(16)
    )
    # (A program's run starts with ``_rerun``; a kept step's from ``Step.again``: the
    # frame two above the predicate, which ``_counted``'s wrapper calls.)
    again = _counted(
        monkeypatch,
        interpreter.ProgramPropagator,
        "_rerun",
        lambda _: sys._getframe(2).f_code.co_qualname == "Step.again",
    )
    _reached_in_straight_line_variants(programs, again, 10)


def test_step_less_runs_in_the_straight_line_variants(monkeypatch: pytest.MonkeyPatch) -> None:
    # Plans that cannot suspend run without a step once lowered (``run_through``):
    # results and kernel errors both, from the first run where plans are lowered at
    # once (schedule_after=0); the general variants never do.
    programs = [generate(seed) for seed in range(40)]
    outcomes: collections.Counter[str] = collections.Counter()
    through = step_module.run_through

    def counted(bound: Any, frame: Any) -> Any:
        try:
            values = through(bound, frame)
        except af.errors.OpError:
            outcomes["raised"] += 1
            raise
        outcomes["made" if values is None else "ran"] += 1
        return values

    monkeypatch.setattr(session_module, "run_through", counted)
    for name, config in _untraced_variants():
        outcomes.clear()
        _agree(programs, name, config)
        options = config.executor_options
        if options.straight_line and options.schedule_after == 0:
            assert outcomes["ran"] >= 20, (name, outcomes)
            assert outcomes["raised"] >= 1, (name, outcomes)
        elif not options.straight_line:
            assert outcomes["ran"] == outcomes["raised"] == 0, (name, outcomes)


def test_the_driver_awaits_lone_kernels_itself_in_the_plain_variants(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A step the driver made (untraced, no deadline of its own) is awaited through
    # ``Step.run``'s loop written out in the driver's frame: its lone kernels returning
    # and raising (a dequeue the caller gives up on, a closed queue) there; runs with a
    # deadline take ``Step.run`` itself.  Both agree with the reference.
    programs = [
        generate(seed, c) for c in ("queues", "deadlines", "functions") for seed in range(12)
    ]
    seen: collections.Counter[tuple[str, str]] = collections.Counter()

    def counted(name: str) -> Any:
        method = getattr(step_module.Step, name)

        def call(step: Any, *args: Any) -> Any:
            seen[(sys._getframe(1).f_code.co_qualname, name)] += 1
            return method(step, *args)

        return call

    for name in ("awaited", "await_raised"):
        monkeypatch.setattr(step_module.Step, name, counted(name))
    for name, config in _untraced_variants():
        seen.clear()
        _agree(programs, name, config)
        assert seen[("Session._drive", "awaited")] >= 5, (name, seen)
        assert seen[("Session._drive", "await_raised")] >= 1, (name, seen)
        assert seen[("Step.run", "awaited")] >= 5, (name, seen)
    assert len(DEADLINE_VARIANTS) == 2  # one per engine
    for name, config in DEADLINE_VARIANTS:
        seen.clear()
        for p in programs:
            ours = run_asyncflow(p, config=config, run_options=_DEADLINE)
            assert compare(ours, _expected(p)) is None, (p.seed, name)
        assert seen[("Session._drive", "awaited")] == 0, (name, seen)
        assert seen[("Step.run", "awaited")] >= 10, (name, seen)


def test_steps_wait_for_their_tasks_on_the_wake_up_future_in_both_frames(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What is left after a step's first kernel (``Step._next_wait``) with nothing ready
    # is the step's wake-up future itself, awaited by the driver's frame (a
    # one-partition step, two slow kernels side by side) and by ``Step.run``'s (a
    # partition waiting for its recvs); the random programs take both and agree with
    # the reference.
    programs = [
        generate(seed, c)
        for c in ("queues", "deadlines", "functions", "devices", "partial_runs")
        for seed in range(12)
    ]
    seen: collections.Counter[tuple[str, str]] = collections.Counter()
    next_wait = step_module.Step._next_wait
    awaiting_frames = ("Session._drive", "Step.run")

    def counted(step: Any) -> Any:
        rest = next_wait(step)
        if rest is None:
            return rest
        kind = type(rest).__name__ if not inspect.iscoroutine(rest) else rest.cr_code.co_name
        frame = sys._getframe(1)
        while frame.f_code.co_qualname not in awaiting_frames:  # the frame that awaits it
            frame = frame.f_back  # type: ignore[assignment]
        seen[(frame.f_code.co_qualname, kind)] += 1
        return rest

    monkeypatch.setattr(step_module.Step, "_next_wait", counted)
    for name, config in _untraced_variants():
        seen.clear()
        _agree(programs, name, config)
        assert seen[("Session._drive", "Future")] >= 3, (name, seen)
        assert seen[("Step.run", "Future")] >= 3, (name, seen)


def test_generation_is_deterministic() -> None:
    a, b = generate(123), generate(123)
    assert a.describe() == b.describe()
    assert generate(124).describe() != a.describe()


def test_compare_detects_a_wrong_value_and_a_wrong_error() -> None:
    ok = [("ok", [np.array([1.0, 2.0], np.float32)])]
    assert compare(ok, ok) is None
    assert compare(ok, [("ok", [np.array([1.0, 2.5], np.float32)])]) is not None
    assert compare(ok, [("ok", [np.array([1.0, 2.0], np.float64)])]) is not None
    assert compare(ok, [("error", "run", "InvalidArgumentError")]) is not None
    assert (
        compare([("error", "run", "OutOfRangeError")], [("error", "run", "CancelledError")])
        is not None
    )


@pytest.mark.parametrize("category", CATEGORIES)
def test_every_category_yields_runs(category: str) -> None:
    program = generate(7, category)
    assert program.category == category
    assert program.runs
