"""Rendezvous keys: TensorFlow's ``src_device;incarnation;dst_device;edge;frame_id:iter_id``.

Partitioning names every cut edge with a key (frame and iteration ``0:0``); an
edge inside a loop frame is sent and received once per iteration, under the key
whose last field is that frame instance's id and the iteration (:func:`frame_key`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from asyncflow import errors
from asyncflow.framework.device_spec import DeviceSpec

__all__ = ["ParsedKey", "create_key", "frame_key", "parse_key"]


@dataclass(frozen=True, slots=True)
class ParsedKey:
    """The parts of a rendezvous key."""

    src_device: str
    src_incarnation: int
    dst_device: str
    edge_name: str
    frame_id: int
    iter_id: int


_FRAME_ITER = re.compile(r"^(\d+):(\d+)$")
_INCARNATION = re.compile(r"^[0-9a-f]{16}$")


def create_key(
    src_device: str,
    src_incarnation: int,
    dst_device: str,
    edge_name: str,
    frame_iter: tuple[int, int] = (0, 0),
) -> str:
    """``src_device;incarnation(16 hex digits);dst_device;edge_name;frame_id:iter_id``."""
    if not 0 <= src_incarnation < 2**64:
        raise ValueError(f"incarnation must fit in 64 bits, got {src_incarnation}")
    return (
        f"{src_device};{src_incarnation:016x};{dst_device};{edge_name};"
        f"{frame_iter[0]}:{frame_iter[1]}"
    )


def parse_key(key: str) -> ParsedKey:
    """Split a key made by :func:`create_key`; ``InvalidArgumentError`` naming it if malformed."""

    def bad(why: str) -> errors.InvalidArgumentError:
        return errors.InvalidArgumentError(None, None, f"Invalid rendezvous key {key!r}: {why}")

    if not isinstance(key, str):
        raise bad("not a string")
    parts = key.split(";")
    if len(parts) != 5:
        raise bad(f"expected 5 ';'-separated parts, got {len(parts)}")
    src, inc, dst, name, frame_iter = parts
    for device in (src, dst):
        try:
            spec = DeviceSpec.from_string(device)
        except ValueError as exc:
            raise bad(str(exc)) from None
        if spec.device_type is None or spec.device_index is None:
            raise bad(f"{device!r} is not a full device name")
    if not _INCARNATION.match(inc):
        raise bad(f"incarnation {inc!r} is not 16 hex digits")
    if not name:
        raise bad("empty edge name")
    m = _FRAME_ITER.match(frame_iter)
    if m is None:
        raise bad(f"frame/iteration {frame_iter!r} is not 'frame_id:iter_id'")
    return ParsedKey(src, int(inc, 16), dst, name, int(m.group(1)), int(m.group(2)))


def frame_key(key: str, frame_id: int, iter_id: int) -> str:
    """``key`` (made by :func:`create_key`) for iteration ``iter_id`` of frame ``frame_id``."""
    return f"{key[: key.rindex(';') + 1]}{frame_id}:{iter_id}"
