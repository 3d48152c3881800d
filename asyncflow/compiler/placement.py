"""Placement: give every needed op one of the session's devices.

Priority, as in TensorFlow: an explicit device request, then colocation (ops made
under ``af.colocate_with(op)`` carry ``_class = ["loc:@op"]`` and land with ``op``),
then the session's default device.

An op's requested device (``af.device(...)``) is matched against the session's
devices; unspecified fields match anything, so ``/cpu:1``, ``/device:CPU:1`` and the
full ``/job:localhost/replica:0/task:0/device:CPU:1`` all name the same device, and
an empty request means the session's default device.  An unknown device is an
``InvalidArgumentError`` naming it and listing the session's devices (unless
``allow_soft_placement``, which falls back to the default device).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from asyncflow import errors
from asyncflow.compiler.ir import NodeDef
from asyncflow.framework.device_spec import DeviceSpec

__all__ = ["place"]


def place(
    ops: Sequence[NodeDef],
    devices: Sequence[str],
    *,
    allow_soft_placement: bool = False,
    lookup: Mapping[str, NodeDef] | None = None,
) -> tuple[int, ...]:
    """For each node, the index into ``devices`` (full names) it runs on; devices[0] is
    the default.  ``lookup`` finds colocation roots that are not among ``ops``."""
    parsed = [DeviceSpec.from_string(d) for d in devices]
    memo: dict[str, int] = {"": 0}
    out: list[int] = []
    append = out.append
    colocated: list[int] = []
    for k, op in enumerate(ops):
        requested = op.device
        index = memo.get(requested)
        if index is None:
            index = memo[requested] = _resolve(op, requested, devices, parsed, allow_soft_placement)
        append(index)
        if "_class" in op.attrs:
            colocated.append(k)
    if colocated:
        _apply_colocation(
            ops, out, colocated, memo, devices, parsed, allow_soft_placement, lookup or {}
        )
    return tuple(out)


def _apply_colocation(
    ops: Sequence[NodeDef],
    out: list[int],
    colocated: list[int],
    memo: dict[str, int],
    devices: Sequence[str],
    parsed: Sequence[DeviceSpec],
    soft: bool,
    lookup: Mapping[str, NodeDef],
) -> None:
    """Put each colocation group on one device; conflicting explicit requests fail."""
    groups: dict[str, list[int]] = {}
    for k in colocated:
        for ref in ops[k].attrs["_class"]:
            if isinstance(ref, str) and ref.startswith("loc:@"):
                groups.setdefault(ref[len("loc:@") :], []).append(k)
                break
    position = {op.name: k for k, op in enumerate(ops)}
    for root_name, members in groups.items():
        root = lookup.get(root_name) or next(
            (ops[k] for k in members if ops[k].name == root_name), None
        )
        chosen: tuple[NodeDef, int] | None = None
        candidates = ([root] if root is not None else []) + [ops[k] for k in members]
        for op in candidates:
            if not op.device:
                continue
            index = memo.get(op.device)
            if index is None:
                index = memo[op.device] = _resolve(op, op.device, devices, parsed, soft)
            if chosen is None:
                chosen = (op, index)
            elif chosen[1] != index:
                raise errors.InvalidArgumentError(
                    None,
                    op,
                    f"Cannot colocate nodes {chosen[0].name!r} and {op.name!r}: "
                    f"{chosen[0].name!r} is on {devices[chosen[1]]} but {op.name!r} "
                    f"requests {op.device!r} (colocation group {root_name!r})",
                )
        index = chosen[1] if chosen is not None else 0
        for k in members:
            out[k] = index
        if root is not None and root.name in position:
            out[position[root.name]] = index


def _resolve(
    op: NodeDef, requested: str, devices: Sequence[str], parsed: Sequence[DeviceSpec], soft: bool
) -> int:
    try:
        want = DeviceSpec.from_string(requested)
    except ValueError as exc:
        raise errors.InvalidArgumentError(
            None, op, f"Cannot assign a device for operation {op.name!r}: {exc}"
        ) from None
    for i, have in enumerate(parsed):
        if _matches(want, have):
            return i
    if soft:
        return 0
    raise errors.InvalidArgumentError(
        None,
        op,
        f"Cannot assign a device for operation {op.name!r}: Operation was explicitly "
        f"assigned to {requested} but available devices are [ {', '.join(devices)} ]. "
        f"Make sure the device specification refers to a valid device.",
    )


def _matches(want: DeviceSpec, have: DeviceSpec) -> bool:
    return (
        (want.job is None or want.job == have.job)
        and (want.replica is None or want.replica == have.replica)
        and (want.task is None or want.task == have.task)
        and (want.device_type is None or want.device_type == have.device_type)
        and (want.device_index is None or want.device_index == have.device_index)
    )
