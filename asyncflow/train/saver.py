"""Checkpoints: ``Saver`` writes and restores variables; ``latest_checkpoint`` finds them.

Format (one file per checkpoint, ``<path>.npz``): a numpy ``.npz`` archive with one
array per variable, keyed by the variable's op name (``"dense/w"``), plus the entry
``__asyncflow_index__``: UTF-8 JSON ``{"format": 1, "variables": {name: {"dtype": ...,
"shape": [...]}}}``.  Beside the checkpoints, the file ``checkpoint`` (JSON) lists them:
``{"model_checkpoint_path": ..., "all_model_checkpoint_paths": [...]}``, newest last.

``Saver(sharded=True)`` (TF's sharded saver) writes each task's variables *on that
task*: one shard ``<path>.shard-K-of-N.npz`` per device task (same format), written
by an op placed there, so a ``ps`` task's values never travel through the client;
``<path>.npz`` is then a manifest (the index, with ``"shards": N`` and each
variable's shard, and no arrays).  As in TF, the tasks and the client must see the
same filesystem (a shared or network file system) for a sharded checkpoint.

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
import re
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from asyncflow import dtypes, errors
from asyncflow.framework.graph import Operation, Tensor
from asyncflow.framework.graph import device as _device
from asyncflow.ops.array_ops import group, placeholder
from asyncflow.ops.py_func import py_func
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
    ``max_to_keep`` newest checkpoints are kept (``None`` or 0: all).  ``sharded``:
    each task's variables are saved and restored on that task (see the module doc).
    """

    def __init__(
        self,
        var_list: Sequence[Variable] | Mapping[str, Variable] | None = None,
        max_to_keep: int | None = 5,
        name: str = "save",
        sharded: bool = False,
    ) -> None:
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
        self._shards: list[dict[str, Variable]] = []
        assigns: list[Any] = []
        with graph.as_default(), graph.name_scope(name), graph.control_dependencies(None):
            if sharded:
                self._shards = _by_task(named)
                self._path = placeholder(dtypes.string, (), name="shard_path")
                saves = [self._shard_ops(k, shard, assigns) for k, shard in enumerate(self._shards)]
                self._save_op: Operation | None = group(*saves, name="save_shards")
            else:
                self._save_op = None
                for key, var in named.items():
                    p = placeholder(var.dtype, var.shape, name="restore_value")
                    self._feeds[key] = p
                    assigns.append(var.assign(p))
            self._restore_op: Operation = group(*assigns, name="restore_all")
        self._kept: list[str] = []

    def _shard_ops(self, k: int, shard: dict[str, Variable], assigns: list[Any]) -> Any:
        """Shard ``k``'s save op and restore assigns, placed on its variables' task."""
        n = len(self._shards)
        names = tuple(shard)
        with _device(next(iter(shard.values())).op.device):
            save = py_func(
                _ShardWriter(names, k, n),
                [self._path, *shard.values()],
                [],
                expensive=True,
                name=f"save_shard_{k}",
            )
            values = py_func(
                _ShardReader(
                    names,
                    tuple(v.dtype.np for v in shard.values()),
                    tuple(_static_shape(v) for v in shard.values()),
                    k,
                    n,
                ),
                [self._path],
                [v.dtype for v in shard.values()],
                expensive=True,
                name=f"restore_shard_{k}",
            )
            assigns.extend(
                var.assign(value) for var, value in zip(shard.values(), values, strict=True)
            )
        return save

    @property
    def last_checkpoints(self) -> list[str]:
        """The checkpoints this saver wrote and still keeps, oldest first."""
        return list(self._kept)

    async def save(
        self,
        sess: Any,
        save_path: str | os.PathLike[str],
        global_step: Any = None,
        write_state: bool = True,
    ) -> str:
        """Write the variables' values; returns the checkpoint path (``save_path[-step]``).

        Atomic: a failed save leaves earlier checkpoints untouched.
        """
        path = os.fspath(save_path)
        if global_step is not None:
            step = global_step if isinstance(global_step, int) else int(await sess.run(global_step))
            path = f"{path}-{step}"
        if self._save_op is not None:
            await sess.run(self._save_op, feed_dict={self._path: path})
            await asyncio.to_thread(_write_manifest, path, self._shards)
        else:
            values = await sess.run(dict(self._vars))
            await asyncio.to_thread(_write_checkpoint, path, values)
        if path in self._kept:
            self._kept.remove(path)
        self._kept.append(path)
        stale: list[str] = []
        if self._max_to_keep and len(self._kept) > self._max_to_keep:
            stale, self._kept = self._kept[: -self._max_to_keep], self._kept[-self._max_to_keep :]
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
        if self._save_op is not None:
            await asyncio.to_thread(_check_manifest, path, self._shards)
            await sess.run(self._restore_op, feed_dict={self._path: path})
            return
        stored = await asyncio.to_thread(_read_checkpoint, path)
        feeds: dict[Tensor, Any] = {}
        for key, var in self._vars.items():
            if key not in stored:
                raise errors.NotFoundError(
                    None, None, f"variable {key!r} not found in checkpoint {path!r}"
                )
            value = stored[key]
            if value.dtype != var.dtype.np:
                raise errors.InvalidArgumentError(
                    None,
                    None,
                    f"variable {key!r} has dtype {var.dtype.name}, checkpoint "
                    f"{path!r} holds {dtypes.as_dtype(value.dtype).name}",
                )
            if not var.shape.is_compatible_with(value.shape):
                raise errors.InvalidArgumentError(
                    None,
                    None,
                    f"variable {key!r} has shape {var.shape}, checkpoint "
                    f"{path!r} holds shape {list(value.shape)}",
                )
            feeds[self._feeds[key]] = value
        await sess.run(self._restore_op, feed_dict=feeds)

    def __repr__(self) -> str:
        return (
            f"<Saver variables={len(self._vars)} shards={len(self._shards) or 1} "
            f"kept={len(self._kept)}>"
        )


def _by_task(named: Mapping[str, Variable]) -> list[dict[str, Variable]]:
    """Variables grouped by the task of their device (no job: the client's), in order."""
    groups: dict[str, dict[str, Variable]] = {}
    for key, var in named.items():
        groups.setdefault(_task_key(var.op.device), {})[key] = var
    return [groups[k] for k in sorted(groups)]


def _task_key(device: str) -> str:
    job = re.search(r"/job:([^/]+)", device)
    task = re.search(r"/task:(\d+)", device)
    if job is None:
        return ""
    return f"/job:{job.group(1)}/task:{task.group(1) if task else 0}"


def _static_shape(var: Variable) -> tuple[int, ...] | None:
    if not var.shape.is_fully_defined():
        return None
    return tuple(int(d) for d in var.shape.as_list() if d is not None)


def _shard_file(path: str, k: int, n: int) -> str:
    return f"{path}.shard-{k}-of-{n}"


def _path_of(value: Any) -> str:
    value = value.item() if isinstance(value, np.ndarray) else value
    return value.decode() if isinstance(value, bytes) else str(value)


class _ShardWriter:
    """Writes one shard where its op runs (on the variables' task).  A class at module
    level, so it ships to a worker by reference."""

    def __init__(self, names: tuple[str, ...], k: int, n: int) -> None:
        self.names, self.k, self.n = names, k, n

    def __call__(self, path: Any, *values: Any) -> None:
        _write_checkpoint(
            _shard_file(_path_of(path), self.k, self.n),
            dict(zip(self.names, values, strict=True)),
            {"writer_pid": os.getpid()},
        )


class _ShardReader:
    """Reads one shard where its op runs, checking each variable's dtype and shape."""

    def __init__(
        self,
        names: tuple[str, ...],
        dtypes_: tuple[Any, ...],
        shapes: tuple[tuple[int, ...] | None, ...],
        k: int,
        n: int,
    ) -> None:
        self.names, self.dtypes, self.shapes, self.k, self.n = names, dtypes_, shapes, k, n

    def __call__(self, path: Any) -> list[np.ndarray]:
        file = _shard_file(_path_of(path), self.k, self.n)
        stored = _read_checkpoint(file)
        out = []
        for key, dtype, shape in zip(self.names, self.dtypes, self.shapes, strict=True):
            if key not in stored:
                raise errors.NotFoundError(
                    None, None, f"variable {key!r} not found in checkpoint shard {file!r}"
                )
            value = stored[key]
            if value.dtype != dtype or (shape is not None and value.shape != shape):
                raise errors.InvalidArgumentError(
                    None,
                    None,
                    f"variable {key!r} is {np.dtype(dtype).name} {shape}, "
                    f"checkpoint shard {file!r} holds {value.dtype.name} "
                    f"{value.shape}",
                )
            out.append(value)
        return out


def _write_manifest(path: str, shards: Sequence[Mapping[str, Variable]]) -> None:
    index = {
        "format": FORMAT,
        "shards": len(shards),
        "variables": {
            key: {"dtype": var.dtype.name, "shard": k}
            for k, shard in enumerate(shards)
            for key, var in shard.items()
        },
    }
    buffer = io.BytesIO()
    savez: Any = np.savez  # its typed signature cannot take names as keywords
    savez(buffer, **{_INDEX: np.frombuffer(json.dumps(index).encode(), np.uint8)})
    _atomic_write(path + ".npz", buffer.getvalue())


def _check_manifest(path: str, shards: Sequence[Mapping[str, Variable]]) -> None:
    index, _ = _load(path, values=False)
    if index.get("shards") != len(shards):
        raise errors.InvalidArgumentError(
            None,
            None,
            f"checkpoint {path!r} has {index.get('shards') or 1} shard(s), this "
            f"Saver(sharded=True) saves {len(shards)}",
        )


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
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(target) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        _remove(tmp)
        raise


def _write_checkpoint(
    path: str, values: Mapping[str, Any], extra: Mapping[str, Any] | None = None
) -> None:
    arrays = {k: np.asarray(v) for k, v in values.items()}
    for k, a in arrays.items():
        if a.dtype == object:
            raise errors.UnimplementedError(None, None, f"cannot checkpoint string variable {k!r}")
    index = {
        "format": FORMAT,
        "variables": {
            k: {"dtype": dtypes.as_dtype(a.dtype).name, "shape": list(a.shape)}
            for k, a in arrays.items()
        },
        **(extra or {}),
    }
    buffer = io.BytesIO()
    arrays[_INDEX] = np.frombuffer(json.dumps(index).encode(), np.uint8)
    savez: Any = np.savez  # its typed signature cannot take names as keywords
    savez(buffer, **arrays)
    _atomic_write(path + ".npz", buffer.getvalue())


def _read_checkpoint(path: str) -> dict[str, np.ndarray]:
    index, values = _load(path, values=True)
    if index.get("format") != FORMAT:
        raise errors.DataLossError(
            None, None, f"checkpoint {path!r} has format {index.get('format')!r}, expected {FORMAT}"
        )
    return values


def _load(path: str, *, values: bool) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The index of checkpoint ``path`` and, when ``values``, the variables it lists;
    a missing file is NotFoundError, an unreadable one DataLossError, both naming it."""
    file = path + ".npz"
    if not os.path.exists(file):
        raise errors.NotFoundError(None, None, f"checkpoint {path!r} not found (no {file!r})")
    try:
        with np.load(file, allow_pickle=False) as data:
            index = json.loads(bytes(data[_INDEX]).decode())
            read = (
                {k: data[k] for k in index["variables"]}
                if values and index.get("format") == FORMAT
                else {}
            )
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as exc:
        raise errors.DataLossError(
            None, None, f"checkpoint {path!r} is unreadable: {type(exc).__name__}: {exc}"
        ) from exc
    return index, read


def _write_state(latest: str, kept: list[str]) -> None:
    directory = os.path.dirname(os.path.abspath(latest))
    # Absolute: a relative save path would otherwise be read relative to the directory.
    state = {
        "model_checkpoint_path": os.path.abspath(latest),
        "all_model_checkpoint_paths": [os.path.abspath(p) for p in kept],
    }
    _atomic_write(os.path.join(directory, _STATE), json.dumps(state, indent=1).encode())


def _remove(file: str) -> None:
    try:
        os.remove(file)
    except FileNotFoundError:
        pass
