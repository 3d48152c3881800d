"""``af.train.MonitoredSession`` in process: initialize or restore, save every N steps,
recover from a recoverable error by recreating the session (TF's recoverable session)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import asyncflow as af


def _counter() -> tuple[af.Graph, Any]:
    g = af.Graph()
    with g.as_default():
        v = af.Variable(np.float32(0.0), name="v")
        step = v.assign_add(np.float32(1.0))
    return g, step


def test_saves_every_n_steps_and_resumes_from_the_latest_checkpoint(tmp_path: Path) -> None:
    g, step = _counter()
    ckpt = str(tmp_path / "ckpt")
    with af.train.MonitoredSession(
        lambda: af.Session(graph=g), checkpoint_dir=ckpt, save_steps=3
    ) as msess:
        values = [msess.run_sync(step) for _ in range(7)]
    assert values == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert af.train.latest_checkpoint(ckpt) == str(tmp_path / "ckpt" / "model.ckpt-7")
    with af.train.MonitoredSession(
        lambda: af.Session(graph=g), checkpoint_dir=ckpt, save_steps=3
    ) as msess:
        assert msess.global_step == 7  # restored, not initialized
        assert msess.run_sync(step) == 8.0


async def test_a_recoverable_error_recreates_the_session_and_restores(tmp_path: Path) -> None:
    g, step = _counter()
    made: list[af.Session] = []
    fail_next: list[af.errors.OpError] = []

    def flaky(x: np.ndarray) -> np.ndarray:
        if fail_next:
            raise fail_next.pop(0)  # as a restarted or vanished task fails a step
        return x

    with g.as_default():
        guarded = af.py_func(flaky, [step], af.float32)

    async def factory() -> af.Session:  # an async factory (e.g. connecting a cluster)
        made.append(af.Session(graph=g))
        return made[-1]

    async with af.train.MonitoredSession(
        factory, checkpoint_dir=str(tmp_path), save_steps=2, retry_interval_s=0.01
    ) as msess:
        assert await msess.run(guarded) == 1.0
        assert await msess.run(guarded) == 2.0  # saved: model.ckpt-2
        assert await msess.run(step) == 3.0
        fail_next.extend(
            [
                af.errors.UnavailableError(None, None, "task gone"),
                af.errors.AbortedError(None, None, "task restarted"),
            ]
        )
        # Each failure: a new session restored from model.ckpt-2, the step run again.
        assert await msess.run(guarded) == 3.0
        assert msess.recoveries == 2
        assert len(made) == 3
        assert [s.statistics().closed for s in made] == [True, True, False]
    assert made[2].statistics().closed
    # Other errors are the caller's.
    async with af.train.MonitoredSession(factory, checkpoint_dir=str(tmp_path)) as msess:
        fail_next.append(af.errors.InvalidArgumentError(None, None, "bad input"))
        with pytest.raises(af.errors.InvalidArgumentError, match="bad input"):
            await msess.run(guarded)
        assert msess.recoveries == 0


def test_bad_arguments_are_clear() -> None:
    with pytest.raises(TypeError, match="callable session_factory"):
        af.train.MonitoredSession(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="save_steps needs a checkpoint_dir"):
        af.train.MonitoredSession(af.Session, save_steps=2)
    with pytest.raises(RuntimeError, match="not open"):
        af.train.MonitoredSession(af.Session).run_sync(af.constant(1.0))


def test_a_relative_checkpoint_dir_is_found_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    g, step = _counter()
    with af.train.MonitoredSession(
        lambda: af.Session(graph=g), checkpoint_dir="ckpt", save_steps=2
    ) as msess:
        msess.run_sync(step)
    assert af.train.latest_checkpoint("ckpt") == str(tmp_path / "ckpt" / "model.ckpt-1")
