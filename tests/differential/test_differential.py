"""CI's differential run: random programs, asyncflow vs the numpy reference oracle.

A fixed seed range, so that a failure names a program anyone can replay with
``python -m tests.differential --ref 1 --seed S``.  TensorFlow is never imported
here (``python -m tests.differential --tf N`` is the TF run).
"""

from __future__ import annotations

import collections

import numpy as np
import pytest

from .oracles import compare, run_asyncflow, run_numpy, run_reference
from .programs import CATEGORIES, generate

PROGRAMS = 300


def test_asyncflow_agrees_with_the_numpy_reference_on_every_program() -> None:
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
    # The generator reaches every category and both outcomes, errors included.
    assert set(categories) == set(CATEGORIES)
    assert outcomes["ok"] > PROGRAMS
    for error in ("InvalidArgumentError", "OutOfRangeError", "CancelledError"):
        assert outcomes[error] > 0, outcomes


def test_loop_programs_agree_on_the_fast_and_the_general_loop_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # while_loops run on the frame propagator's fast path when they can; the same
    # programs with only its general form must give the same outcomes.
    from asyncflow.runtime import loop_fastpath

    programs = [p for p in map(generate, range(PROGRAMS))
                if any(n.kind == "while" for n in p.nodes)]
    assert len(programs) >= 10
    begun: list[bool] = []
    begin = loop_fastpath.LoopRun.begin

    def counted(run: loop_fastpath.LoopRun) -> bool:
        started = begin(run)
        begun.append(started)
        return started

    monkeypatch.setattr(loop_fastpath.LoopRun, "begin", counted)
    fast = [run_asyncflow(p) for p in programs]
    assert sum(begun) >= 3  # the rest are folded, pruned or error out before the loop
    monkeypatch.setattr(loop_fastpath, "ENABLED", False)
    failures = []
    for program, ours in zip(programs, fast, strict=True):
        why = compare(ours, run_asyncflow(program))
        if why is not None:
            failures.append(f"seed {program.seed}: fast path vs general: {why}")
    assert failures == []


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
    assert compare([("error", "run", "OutOfRangeError")],
                   [("error", "run", "CancelledError")]) is not None


@pytest.mark.parametrize("category", CATEGORIES)
def test_every_category_yields_runs(category: str) -> None:
    program = generate(7, category)
    assert program.category == category
    assert program.runs
