"""The generator reaches the program kinds that exercise the step around the kernels,
the oracles model them, and ``run_asyncflow`` takes a session config and run options.

``test_differential.py`` runs every generated program; these tests make sure the
seeds it runs contain what they should (so a change to the generator cannot quietly
stop testing partial runs or functions in branches), and that the outcome rules
for racy runs accept exactly the values, a deadline or a cancellation.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest

import asyncflow as af

from . import __main__ as cli
from . import programs
from .oracles import compare, run_asyncflow, run_numpy
from .programs import RACY_ERRORS, generate
from .test_differential import PROGRAMS

SEEDS = range(PROGRAMS)  # the seeds test_differential runs


def _kinds() -> collections.Counter[str]:
    """What the seeds reach: categories and the features inside them."""
    seen: collections.Counter[str] = collections.Counter()
    for seed in SEEDS:
        p = generate(seed)
        seen[p.category] += 1
        nodes = p.nodes
        for n in nodes:
            seen[f"kind:{n.kind}"] += 1
            if n.kind == "defun" and n.attrs["assert"] and not n.attrs["flag"]:
                seen["function that fails when called"] += 1
            if n.kind == "while_call" and not _count_of(p, n.args[1]):
                seen["loop that never iterates"] += 1
        for r in p.runs:
            seen[f"mode:{r.mode}"] += 1
            seen["deadline"] += bool(r.timeout_ms)
            seen["caller cancels"] += bool(r.cancel_ms)
            if r.mode == "partial":
                declared = set(r.feed_list)
                needed = {k for f in r.fetches for k in _placeholders(p, f)}
                seen["unused partial feed"] += bool(declared - needed)
                seen["partial feed on /cpu:1"] += any(nodes[k].device == "/cpu:1" for k in declared)
                fed: set[int] = set()
                for fetches, feeds in r.calls:
                    fed |= set(feeds)
                    wanted = {k for f in fetches for k in _placeholders(p, f)}
                    seen["fetch before its feeds"] += bool(wanted - fed)
            if r.mode == "callable":
                seen["callable feed on another device"] += any(
                    nodes[k].device == "/cpu:1"
                    and any(k in c.args and c.device != "/cpu:1" for c in nodes)
                    for k in r.feed_list
                )
            if len(r.fetches) != len(set(r.fetches)) or any(
                _same_computation(nodes[a], nodes[b])
                for i, a in enumerate(r.fetches)
                for b in r.fetches[i + 1 :]
                if a != b
            ):
                seen["fetched duplicates"] += 1
    return seen


def _count_of(p: programs.Program, nid: int) -> int:
    """A loop's iteration count: its constant, or the least value any run feeds it."""
    value = p.nodes[nid].attrs.get("value")
    if value is not None:
        return int(value)
    fed = [int(r.feeds[nid]) for r in p.runs if nid in r.feeds]
    return min(fed, default=1)


def _placeholders(p: programs.Program, nid: int) -> set[int]:
    seen, stack = set(), [nid]
    while stack:
        k = stack.pop()
        if k not in seen:
            seen.add(k)
            stack.extend(p.nodes[k].args)
    return {k for k in seen if p.nodes[k].kind == "placeholder"}


def _same_computation(a: programs.Node, b: programs.Node) -> bool:
    return (a.kind, a.args, a.dtype, a.shape) == (b.kind, b.args, b.dtype, b.shape) and all(
        k in b.attrs and np.array_equal(a.attrs[k], b.attrs[k]) for k in a.attrs
    )


def test_the_seeds_reach_every_step_kind_often() -> None:
    seen = _kinds()
    for category in ("functions", "partial_runs", "callables", "deadlines", "duplicates"):
        assert seen[category] >= 20, (category, seen)
    for kind in (
        "kind:call",
        "kind:cond_call",
        "kind:while_call",
        "mode:partial",
        "mode:callable",
        "deadline",
        "caller cancels",
    ):
        assert seen[kind] >= 10, (kind, seen)
    for feature in (
        "function that fails when called",
        "loop that never iterates",
        "unused partial feed",
        "partial feed on /cpu:1",
        "fetch before its feeds",
        "callable feed on another device",
        "fetched duplicates",
    ):
        assert seen[feature] >= 5, (feature, seen)


def test_loop_state_and_multi_device_deadlines_are_generated() -> None:
    # Variables read and assigned in loop bodies, and deadlines over several devices
    # (the two kinds the runtime once crashed on) are drawn by the default seeds.
    seen = _kinds()
    assert seen["loop_state"] >= 20, seen
    devices = {n.device for p in map(generate, SEEDS) if p.category == "deadlines" for n in p.nodes}
    assert "/cpu:1" in devices
    program = generate(3, "loop_state")
    assert any(n.kind == "while_var" for n in program.nodes)
    assert all(o[0] == "ok" for o in run_numpy(program))


def test_loop_state_reference_values() -> None:
    # A hand-checked program: v = 1, three iterations of the "cond" mode add delta
    # (2) to v in iterations 0 and 2 and add v to the accumulator each time.
    nodes = [
        programs.Node(0, "variable", (), {"init": np.float32(1.0), "pure": False}, "float32", ()),
        programs.Node(1, "var_init", (0,), {"pure": False}, None, ()),
        programs.Node(2, "const", (), {"value": np.int32(3)}, "int32", ()),
        programs.Node(3, "const", (), {"value": np.float32(2.0)}, "float32", ()),
        programs.Node(4, "while_var", (2, 0, 3), {"mode": "cond", "pure": False}, "float32", ()),
        programs.Node(5, "read", (0,), {"pure": False}, "float32", ()),
    ]
    runs = [programs.Run([1]), programs.Run([4]), programs.Run([5])]
    out = run_numpy(programs.Program(0, "loop_state", nodes, runs))
    assert [o[1] for o in out] == [[None], [np.float32(3 + 3 + 5)], [np.float32(5.0)]]


def test_racy_runs_accept_values_a_deadline_or_a_cancellation_only() -> None:
    value = ("ok", [np.array(1.0, np.float32)], "racy")
    for error in RACY_ERRORS:
        assert compare([("error", "run", error, "racy")], [value]) is None
        assert compare([value], [("error", "run", error, "racy")]) is None
    assert compare([("error", "run", "TypeError", "racy")], [value]) is not None
    assert compare([("ok", [np.array(2.0, np.float32)], "racy")], [value]) is not None
    # Not racy: a deadline is a disagreement like any other error.
    assert (
        compare([("error", "run", "DeadlineExceededError")], [("ok", [np.array(1.0, np.float32)])])
        is not None
    )


@pytest.mark.parametrize(
    "category", ["functions", "partial_runs", "callables", "deadlines", "duplicates"]
)
def test_run_asyncflow_takes_a_config_and_run_options(category: str) -> None:
    # The executor matrix drives run_asyncflow through exactly these keywords: an
    # unoptimized traced session must give the outcomes of the default one.
    l0 = af.SessionConfig(
        device_count={"CPU": 2},
        graph_options=af.GraphOptions(
            optimizer_options=af.OptimizerOptions(opt_level=af.OptimizerOptions.L0)
        ),
    )
    traced = af.RunOptions(trace_level=af.RunOptions.FULL_TRACE)
    for seed in range(4):
        program = generate(seed, category)
        default = run_asyncflow(program)
        assert compare(default, run_numpy(program)) is None
        assert compare(run_asyncflow(program, config=l0, run_options=traced), default) is None


def test_tf_without_tensorflow_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "tensorflow_available", lambda: False)
    assert cli.main(["--tf", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["python -m tests.differential --tf needs TensorFlow: pip install tensorflow-cpu"]


def test_daily_seeds_lie_past_the_fixed_range_and_move_with_the_date() -> None:
    import datetime

    from .test_differential import DAILY, daily_seeds

    day = datetime.date(2026, 11, 26)
    today, tomorrow = daily_seeds(day), daily_seeds(day + datetime.timedelta(days=1))
    assert len(today) == DAILY
    assert min(today) >= PROGRAMS
    assert not set(today) & set(tomorrow)
