"""Checkpoints: ``Saver`` writes and restores variables; ``latest_checkpoint`` finds them.

Format (one file per checkpoint, ``<path>.npz``): a numpy ``.npz`` archive with one
array per variable, keyed by the variable's op name (``"dense/w"``), plus the entry
``__asyncflow_index__``: UTF-8 JSON ``{"format": 1, "variables": {name: {"dtype": ...,
"shape": [...]}}}``.  Beside the checkpoints, the file ``checkpoint`` (JSON) lists them:
``{"model_checkpoint_path": ..., "all_model_checkpoint_paths": [...]}``, newest last.

Every file is written to a temporary name in the same directory and renamed over the
target (``os.replace``, atomic on POSIX and Windows), so a failed or interrupted save
leaves the previous checkpoint and the ``checkpoint`` list intact.  Disk I/O runs on a
worker thread (``asyncio.to_thread``), never on the event loop.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from asyncflow import dtypes, errors
from asyncflow.framework.graph import Operation, Tensor
from asyncflow.ops.array_ops import group, placeholder
from asyncflow.ops.state_ops import Variable, global_variables

__all__ = ["Saver", "latest_checkpoint"]

FORMAT = 1
_INDEX = "__asyncflow_index__"
_STATE = "checkpoint"


class Saver:
    """Saves and restores variables (TF 1.x ``tf.compat.v1.train.Saver``).

    ``var_list``: a list of variables (keyed by their op names) or a dict name ->
    variable; default: every global variable of the default graph.  The restore ops
    (a placeholder and an ``Assign`` per variable) are built here, as TF builds them.
    ``max_to_keep`` newest checkpoints are kept (``None`` or 0: all).
    """

    def __init__(self, var_list: Sequence[Variable] | Mapping[str, Variable] | None = None,
                 max_to_keep: int | None = 5, name: str = "save") -> None:
        if var_list is None:
            var_list = global_variables()
        if isinstance(var_list, Mapping):
            named = dict(var_list)
        else:
            named = {}
            for v in var_list:
                if not isinstance(v, Variable):
                    raise TypeError(f"Saver var_list must hold af.Variable objects, got {v!r}")
                if v.op.name in named:
                    raise ValueError(f"Saver var_list holds variable {v.op.name!r} twice")
                named[v.op.name] = v
        if not named:
            raise ValueError("Saver: no variables to save")
        self._vars = named
        self._max_to_keep = max_to_keep or 0
        graph = next(iter(named.values())).graph
        self._feeds: dict[str, Tensor] = {}
        assigns = []
        with graph.as_default(), graph.name_scope(name), graph.control_dependencies(None):
            for key, var in named.items():
                p = placeholder(var.dtype, var.shape, name="restore_value")
                self._feeds[key] = p
                assigns.append(var.assign(p))
            self._restore_op: Operation = group(*assigns, name="restore_all")
        self._kept: list[str] = []

    @property
    def last_checkpoints(self) -> list[str]:
        """The checkpoints this saver wrote and still keeps, oldest first."""
        return list(self._kept)

    async def save(self, sess: Any, save_path: str | os.PathLike[str],
                   global_step: Any = None, write_state: bool = True) -> str:
        """Write the variables' values; returns the checkpoint path (``save_path[-step]``).

        Atomic: a failed save leaves earlier checkpoints untouched.
        """
        path = os.fspath(save_path)
        if global_step is not None:
            step = global_step if isinstance(global_step, int) else int(
                await sess.run(global_step))
            path = f"{path}-{step}"
        values = await sess.run(dict(self._vars))
        await asyncio.to_thread(_write_checkpoint, path, values)
        if path in self._kept:
            self._kept.remove(path)
        self._kept.append(path)
        stale: list[str] = []
        if self._max_to_keep and len(self._kept) > self._max_to_keep:
            stale, self._kept = self._kept[:-self._max_to_keep], self._kept[-self._max_to_keep:]
        if write_state:
            await asyncio.to_thread(_write_state, path, list(self._kept))
        for old in stale:
            await asyncio.to_thread(_remove, old + ".npz")
        return path

    async def restore(self, sess: Any, save_path: str | os.PathLike[str]) -> None:
        """Assign every variable its value from the checkpoint ``save_path``.

        ``NotFoundError`` for a missing checkpoint or variable; ``InvalidArgumentError``
        naming the variable for a dtype or shape that does not match.
        """
        path = os.fspath(save_path)
        stored = await asyncio.to_thread(_read_checkpoint, path)
        feeds: dict[Tensor, Any] = {}
        for key, var in self._vars.items():
            if key not in stored:
                raise errors.NotFoundError(None, None, f"variable {key!r} not found in "
                                                       f"checkpoint {path!r}")
            value = stored[key]
            if value.dtype != var.dtype.np:
                raise errors.InvalidArgumentError(
                    None, None, f"variable {key!r} has dtype {var.dtype.name}, checkpoint "
                                f"{path!r} holds {dtypes.as_dtype(value.dtype).name}")
            if not var.shape.is_compatible_with(value.shape):
                raise errors.InvalidArgumentError(
                    None, None, f"variable {key!r} has shape {var.shape}, checkpoint "
                                f"{path!r} holds shape {list(value.shape)}")
            feeds[self._feeds[key]] = value
        await sess.run(self._restore_op, feed_dict=feeds)

    def __repr__(self) -> str:
        return f"<Saver variables={len(self._vars)} kept={len(self._kept)}>"


def latest_checkpoint(checkpoint_dir: str | os.PathLike[str]) -> str | None:
    """The newest checkpoint path listed in ``checkpoint_dir``, or None when there is none."""
    state = os.path.join(os.fspath(checkpoint_dir), _STATE)
    try:
        with open(state, encoding="utf-8") as f:
            path = json.load(f).get("model_checkpoint_path")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(path, str):
        return None
    if not os.path.isabs(path):
        path = os.path.join(os.fspath(checkpoint_dir), path)
    return path if os.path.exists(path + ".npz") else None


# -- files ------------------------------------------------------------------------------------

def _atomic_write(target: str, data: bytes) -> None:
    directory = os.path.dirname(os.path.abspath(target))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(target) + ".", suffix=".tmp",
                               dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        _remove(tmp)
        raise


def _write_checkpoint(path: str, values: Mapping[str, Any]) -> None:
    arrays = {k: np.asarray(v) for k, v in values.items()}
    for k, a in arrays.items():
        if a.dtype == object:
            raise errors.UnimplementedError(None, None, f"cannot checkpoint string variable "
                                                        f"{k!r}")
    index = {"format": FORMAT, "variables": {k: {"dtype": dtypes.as_dtype(a.dtype).name,
                                                 "shape": list(a.shape)}
                                             for k, a in arrays.items()}}
    buffer = io.BytesIO()
    arrays[_INDEX] = np.frombuffer(json.dumps(index).encode(), np.uint8)
    savez: Any = np.savez  # its typed signature cannot take names as keywords
    savez(buffer, **arrays)
    _atomic_write(path + ".npz", buffer.getvalue())


def _read_checkpoint(path: str) -> dict[str, np.ndarray]:
    file = path + ".npz"
    if not os.path.exists(file):
        raise errors.NotFoundError(None, None, f"checkpoint {path!r} not found (no {file!r})")
    try:
        with np.load(file, allow_pickle=False) as data:
            index = json.loads(bytes(data[_INDEX]).decode())
            if index.get("format") != FORMAT:
                raise errors.DataLossError(None, None, f"checkpoint {path!r} has format "
                                                       f"{index.get('format')!r}, expected "
                                                       f"{FORMAT}")
            return {k: data[k] for k in index["variables"]}
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as exc:
        raise errors.DataLossError(None, None, f"checkpoint {path!r} is unreadable: "
                                               f"{type(exc).__name__}: {exc}") from exc


def _write_state(latest: str, kept: list[str]) -> None:
    directory = os.path.dirname(os.path.abspath(latest))
    state = {"model_checkpoint_path": latest, "all_model_checkpoint_paths": kept}
    _atomic_write(os.path.join(directory, _STATE), json.dumps(state, indent=1).encode())


def _remove(file: str) -> None:
    try:
        os.remove(file)
    except FileNotFoundError:
        pass
