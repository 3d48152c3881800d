"""Progress of long runs: RunOptions(progress=...) and ``asyncflow run --progress`` (item 8)."""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import asyncflow as af
from asyncflow import cli


def _chain_of_waits(graph: af.Graph, gates: list[asyncio.Event]) -> tuple[af.Tensor, af.Tensor]:
    """x -> add -> wait0 -> add -> wait1 ...: each wait kernel blocks on its gate."""
    x = af.placeholder(af.float32, shape=(), name="x")
    y = x
    for k, gate in enumerate(gates):

        async def wait(v: Any, gate: asyncio.Event = gate) -> Any:
            await gate.wait()
            return v

        y = af.py_func(wait, [y + 1.0], af.float32, name=f"wait{k}")
    return x, y


async def test_events_count_nodes_and_name_the_longest_running(graph: af.Graph) -> None:
    gates = [asyncio.Event(), asyncio.Event()]
    x, y = _chain_of_waits(graph, gates)
    events: list[af.ProgressEvent] = []
    reported = {f"wait{k}": asyncio.Event() for k in range(len(gates))}

    def on_progress(event: af.ProgressEvent) -> None:
        events.append(event)
        if event.longest is not None:
            reported[event.longest[0]].set()

    options = af.RunOptions(progress=on_progress)
    async with af.Session(graph=graph) as sess:
        run = asyncio.create_task(sess.run(y, {x: 0.0}, options=options))
        for k, gate in enumerate(gates):
            await reported[f"wait{k}"].wait()  # an event named it the longest running
            gate.set()
        assert await run == 2.0
    total = events[-1].nodes_total
    assert total == 4  # two adds, two waits
    seen = [(e.nodes_done, e.longest[0] if e.longest else None) for e in events]
    assert (1, "wait0") in seen
    assert (3, "wait1") in seen
    assert events[-1].finished
    assert events[-1].nodes_done == 4
    assert events[-1].running == ()
    assert not any(e.finished for e in events[:-1])
    assert [e.elapsed for e in events] == sorted(e.elapsed for e in events)


def test_run_sync_reports_and_a_failing_step_still_finishes(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, shape=(), name="x")

    def fail(v: Any) -> Any:
        raise ValueError("no")

    ok = af.identity(x * 2.0, name="ok")
    bad = af.py_func(fail, [ok], af.float32, name="bad")
    events: list[af.ProgressEvent] = []
    options = af.RunOptions(progress=events.append)
    with af.Session(graph=graph) as sess:
        assert sess.run_sync(ok, {x: 1.0}, options=options) == 2.0
        assert [(e.nodes_done, e.nodes_total, e.finished) for e in events] == [(2, 2, True)]
        events.clear()
        with pytest.raises(af.errors.InvalidArgumentError, match="bad"):
            sess.run_sync(bad, {x: 1.0}, options=options)
        assert [(e.nodes_done, e.finished) for e in events] == [(2, True)]


def test_loops_have_no_total(graph: af.Graph) -> None:
    i = af.constant(0)
    out = af.while_loop(lambda i: i < 5, lambda i: i + 1, [i])
    events: list[af.ProgressEvent] = []
    with af.Session(graph=graph) as sess:
        assert sess.run_sync(out, options=af.RunOptions(progress=events.append)) == [5]
    assert events[-1].nodes_total is None
    assert events[-1].nodes_done >= 5  # the body's add ran once per iteration


def test_a_raising_callback_is_logged_and_dropped(
    graph: af.Graph, caplog: pytest.LogCaptureFixture
) -> None:
    calls = []

    def broken(event: af.ProgressEvent) -> None:
        calls.append(event)
        raise RuntimeError("callback bug")

    y = af.constant(1.0) + 1.0
    with af.Session(graph=graph) as sess, caplog.at_level(logging.ERROR, "asyncflow.progress"):
        assert sess.run_sync(y, options=af.RunOptions(progress=broken)) == 2.0
    assert len(calls) == 1
    assert "progress callback" in caplog.text


def _slow_graph_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    module = "af_test_slow_kernels"
    (tmp_path / f"{module}.py").write_text(
        "import asyncio\nasync def slow(x):\n    await asyncio.sleep(0.3)\n    return x\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)
    kernels = importlib.import_module(module)
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        af.py_func(kernels.slow, [x + 1.0], af.float32, name="slow")
    path = tmp_path / "slow.json"
    path.write_text(json.dumps(g.as_graph_def()))
    return path


def test_cli_progress_bar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _slow_graph_file(tmp_path, monkeypatch)
    argv = ["run", str(path), "--feed", "x=1", "--fetch", "slow", "--trust", "--progress"]
    assert cli.main(argv) == 0  # 0.3 s: under PROGRESS_AFTER, no bar
    out, err = capsys.readouterr()
    assert out.strip() == "slow:0 = 2.0"
    assert err == ""
    monkeypatch.setattr(cli, "PROGRESS_AFTER", 0.05)
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "slow:0 = 2.0"
    assert "nodes" in err
    assert "2/2" in err  # the add and the slow kernel


def test_progress_bar_shows_the_longest_running_node() -> None:
    bar = cli._ProgressBar()
    bar._progress.console.file = open(  # noqa: SIM115  # closed below
        Path("/dev/null"), "w"
    )
    try:
        bar.update(af.ProgressEvent(3, 10, (("fetch_user", 1.5), ("db", 0.2)), 2.0))
        task = bar._progress.tasks[0]
        assert (task.completed, task.total) == (3, 10)
        assert task.fields["longest"] == "running fetch_user for 1.5 s"
    finally:
        bar.close()
        bar._progress.console.file.close()


def test_progress_event_is_frozen() -> None:
    event = af.ProgressEvent(1, None, (), 0.5, finished=True)
    assert event.longest is None
    with pytest.raises(AttributeError):
        event.nodes_done = 2  # type: ignore[misc]
    assert np.isclose(event.elapsed, 0.5)
