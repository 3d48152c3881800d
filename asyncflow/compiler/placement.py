"""Placement: give every needed op one of the session's devices.

An op's requested device (``af.device(...)``) is matched against the session's
devices; unspecified fields match anything, so ``/cpu:1``, ``/device:CPU:1`` and the
full ``/job:localhost/replica:0/task:0/device:CPU:1`` all name the same device, and
an empty request means the session's default device.  An unknown device is an
``InvalidArgumentError`` naming it and listing the session's devices (unless
``allow_soft_placement``, which falls back to the default device).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from asyncflow import errors
from asyncflow.framework.device_spec import DeviceSpec

if TYPE_CHECKING:
    from asyncflow.framework.graph import Operation

__all__ = ["place"]


def place(ops: Sequence[Operation], devices: Sequence[str], *,
          allow_soft_placement: bool = False) -> list[int]:
    """For each op, the index into ``devices`` (full names) it runs on; devices[0] is the default."""
    parsed = [DeviceSpec.from_string(d) for d in devices]
    memo: dict[str, int] = {"": 0}
    out: list[int] = []
    append = out.append
    for op in ops:
        requested = op._device
        index = memo.get(requested)
        if index is None:
            index = memo[requested] = _resolve(op, requested, devices, parsed,
                                               allow_soft_placement)
        append(index)
    return out


def _resolve(op: Operation, requested: str, devices: Sequence[str],
             parsed: Sequence[DeviceSpec], soft: bool) -> int:
    try:
        want = DeviceSpec.from_string(requested)
    except ValueError as exc:
        raise errors.InvalidArgumentError(
            None, op, f"Cannot assign a device for operation {op.name!r}: {exc}") from None
    for i, have in enumerate(parsed):
        if _matches(want, have):
            return i
    if soft:
        return 0
    raise errors.InvalidArgumentError(
        None, op,
        f"Cannot assign a device for operation {op.name!r}: Operation was explicitly "
        f"assigned to {requested} but available devices are [ {', '.join(devices)} ]. "
        f"Make sure the device specification refers to a valid device.")


def _matches(want: DeviceSpec, have: DeviceSpec) -> bool:
    return ((want.job is None or want.job == have.job)
            and (want.replica is None or want.replica == have.replica)
            and (want.task is None or want.task == have.task)
            and (want.device_type is None or want.device_type == have.device_type)
            and (want.device_index is None or want.device_index == have.device_index))
