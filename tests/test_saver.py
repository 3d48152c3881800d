"""Checkpoints: ``af.train.Saver`` and ``af.train.latest_checkpoint``."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np
import pytest

import asyncflow as af


def _model(graph: af.Graph) -> tuple[af.Variable, af.Variable, af.Variable, Any, Any]:
    with graph.as_default():
        w = af.Variable(np.arange(6, dtype=np.float32).reshape(2, 3), name="dense/w")
        b = af.Variable(np.zeros(3, np.float32), name="dense/b")
        step = af.Variable(0, name="global_step")
        train = af.group(
            w.assign_add(np.ones((2, 3), np.float32)), b.assign_sub([1, 2, 3]), step.assign_add(1)
        )
        init = af.global_variables_initializer()
    return w, b, step, train, init


async def test_save_and_restore_round_trip(tmp_path: pathlib.Path) -> None:
    g = af.Graph()
    w, b, step, train, init = _model(g)
    with g.as_default():
        saver = af.train.Saver()
    async with af.Session(graph=g) as sess:
        await sess.run(init)
        await sess.run(train)
        path = await saver.save(sess, tmp_path / "model", global_step=step)
        assert path == str(tmp_path / "model-1")
        saved = await sess.run([w, b, step])
        await sess.run(train)
        await saver.restore(sess, path)
        restored = await sess.run([w, b, step])
    for a, e in zip(restored, saved):
        np.testing.assert_array_equal(a, e)
    assert af.train.latest_checkpoint(tmp_path) == path
    # A fresh session of the same graph restores without running the initializers.
    async with af.Session(graph=g) as sess:
        await saver.restore(sess, af.train.latest_checkpoint(tmp_path) or "")
        np.testing.assert_array_equal(await sess.run(w), saved[0])


def test_format_is_npz_with_a_json_index(tmp_path: pathlib.Path) -> None:
    g = af.Graph()
    w, b, _step, _, init = _model(g)
    with g.as_default():
        saver = af.train.Saver([w, b], max_to_keep=2)
    with af.Session(graph=g) as sess:
        sess.run_sync(init)
        import asyncio

        for i in range(4):
            asyncio.run(saver.save(sess, tmp_path / "ckpt", global_step=i))
    with np.load(tmp_path / "ckpt-3.npz") as data:
        index = json.loads(bytes(data["__asyncflow_index__"]).decode())
        np.testing.assert_array_equal(data["dense/w"], np.arange(6).reshape(2, 3))
    assert index == {
        "format": 1,
        "variables": {
            "dense/w": {"dtype": "float32", "shape": [2, 3]},
            "dense/b": {"dtype": "float32", "shape": [3]},
        },
    }
    state = json.loads((tmp_path / "checkpoint").read_text())
    assert state["model_checkpoint_path"] == str(tmp_path / "ckpt-3")
    assert state["all_model_checkpoint_paths"] == [
        str(tmp_path / "ckpt-2"),
        str(tmp_path / "ckpt-3"),
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "ckpt-2.npz", "ckpt-3.npz"]
    assert saver.last_checkpoints == state["all_model_checkpoint_paths"]


async def test_failed_save_leaves_the_previous_checkpoint(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = af.Graph()
    w, _b, _step, train, init = _model(g)
    with g.as_default():
        saver = af.train.Saver()
    async with af.Session(graph=g) as sess:
        await sess.run(init)
        good = await saver.save(sess, tmp_path / "m")
        before = (tmp_path / "m.npz").read_bytes()
        await sess.run(train)

        def broken_fsync(fd: int) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr("os.fsync", broken_fsync)
        with pytest.raises(OSError, match="No space left"):
            await saver.save(sess, tmp_path / "m")
        monkeypatch.undo()
        assert (tmp_path / "m.npz").read_bytes() == before
        assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "m.npz"]  # noqa: ASYNC240
        await saver.restore(sess, good)
        np.testing.assert_array_equal(await sess.run(w), np.arange(6).reshape(2, 3))


async def test_restore_errors_name_the_variable(tmp_path: pathlib.Path) -> None:
    g = af.Graph()
    w, _b, _step, _, init = _model(g)
    with g.as_default():
        await_path = tmp_path / "small"
        only_w = af.train.Saver([w])
    async with af.Session(graph=g) as sess:
        await sess.run(init)
        await only_w.save(sess, await_path)
    with pytest.raises(af.errors.NotFoundError, match="nowhere"):
        async with af.Session(graph=g) as sess:
            await only_w.restore(sess, tmp_path / "nowhere")

    g2 = af.Graph()
    with g2.as_default():
        w2 = af.Variable(np.zeros((2, 3), np.float32), name="dense/w")
        b2 = af.Variable(np.zeros(3, np.float32), name="dense/b")
        wrong_shape = af.Variable(np.zeros((3, 2), np.float32), name="other/w")
        wrong_dtype = af.Variable(np.zeros((2, 3), np.float64), name="third/w")
        both = af.train.Saver([w2, b2])
        shape_saver = af.train.Saver({"dense/w": wrong_shape})
        dtype_saver = af.train.Saver({"dense/w": wrong_dtype})
    async with af.Session(graph=g2) as sess:
        with pytest.raises(af.errors.NotFoundError, match="'dense/b' not found"):
            await both.restore(sess, await_path)
        with pytest.raises(af.errors.InvalidArgumentError, match=r"'dense/w' has shape"):
            await shape_saver.restore(sess, await_path)
        with pytest.raises(af.errors.InvalidArgumentError, match=r"'dense/w' has dtype float64"):
            await dtype_saver.restore(sess, await_path)
        # The session stays usable after the errors.
        await sess.run(w2.initializer)
        np.testing.assert_array_equal(await sess.run(w2), np.zeros((2, 3)))


async def test_corrupt_checkpoint_is_data_loss(tmp_path: pathlib.Path) -> None:
    g = af.Graph()
    _w, _b, _step, _, _init = _model(g)
    with g.as_default():
        saver = af.train.Saver()
    (tmp_path / "bad.npz").write_bytes(b"not a zip file")
    async with af.Session(graph=g) as sess:
        with pytest.raises(af.errors.DataLossError, match="bad"):
            await saver.restore(sess, tmp_path / "bad")


def test_latest_checkpoint_without_state(tmp_path: pathlib.Path) -> None:
    assert af.train.latest_checkpoint(tmp_path) is None
    (tmp_path / "checkpoint").write_text("{broken")
    assert af.train.latest_checkpoint(tmp_path) is None


def test_saver_argument_errors() -> None:
    with af.Graph().as_default():
        with pytest.raises(ValueError, match="no variables"):
            af.train.Saver()
        with pytest.raises(TypeError, match=r"af\.Variable"):
            af.train.Saver([af.constant(1.0)])  # type: ignore[list-item]
