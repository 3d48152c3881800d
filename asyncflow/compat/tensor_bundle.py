"""Read TensorFlow's tensor-bundle checkpoints: ``<prefix>.index`` and ``<prefix>.data-*``.

The layout follows TensorFlow's ``util/tensor_bundle/tensor_bundle.cc`` and the
LevelDB-style table of ``lib/io/table*.cc``, ``block.cc`` and ``format.cc``:

* ``<prefix>.index`` is an immutable sorted table.  Its last 48 bytes are the *footer*:
  two block handles (varint64 offset + size: the meta-index and the index block),
  zero padding, and the 8-byte magic number ``0xdb4775248b80fb57``.  Every block is
  followed by a 5-byte trailer: a compression type byte (0 = none) and the *masked*
  CRC-32C of the block contents plus that byte.  A block holds entries with
  prefix-compressed keys (varint32 shared length, unshared length, value length,
  then the unshared key bytes and the value), then the restart offsets (fixed32 each)
  and their count.  The index block maps a key to the handle of the data block
  holding it.
* The table's values are serialized ``BundleEntryProto`` messages keyed by tensor
  name; the empty key holds the ``BundleHeaderProto`` (shard count, endianness).
* ``<prefix>.data-%05d-of-%05d`` shards hold the raw little-endian tensor bytes at
  ``[offset, offset + size)``; the entry's ``crc32c`` is the masked CRC-32C of them.

Every length, offset and checksum is checked; a bad one is a ``DataLossError`` that
names the file, as TF's reader does.  Nothing here needs TensorFlow.
"""

from __future__ import annotations

import functools
import os
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np

from asyncflow import dtypes, errors
from asyncflow.compat._tf_proto import messages
from asyncflow.compat._values import dtype_from_enum

__all__ = ["BundleReader", "crc32c", "read_table"]

_FOOTER_BYTES = 48  # 2 * BlockHandle::kMaxEncodedLength + the 8-byte magic
_TRAILER_BYTES = 5  # compression type + masked crc32c
_MAGIC = 0xDB4775248B80FB57
_MASK_DELTA = 0xA282EAD8
_NO_COMPRESSION = 0


def crc32c(data: bytes | memoryview) -> int:
    """The CRC-32C (Castagnoli) of ``data``, through ``google-crc32c`` when installed."""
    try:
        import google_crc32c
    except ImportError:  # pragma: no cover - depends on the environment
        return _crc32c_python(bytes(data))
    return int(google_crc32c.value(bytes(data)))


@functools.cache
def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


def _crc32c_python(data: bytes) -> int:
    crc = 0xFFFFFFFF
    table = _crc32c_table()
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _unmask(masked: int) -> int:
    """TF's ``crc32c::Unmask``: stored checksums are rotated and offset."""
    rot = (masked - _MASK_DELTA) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


class _Corrupt(Exception):
    """A malformed structure found while decoding; turned into DataLossError with the file."""


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while pos < end and shift <= 63:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
    raise _Corrupt(f"bad varint at byte {pos}")


def _block(data: bytes, handle: tuple[int, int]) -> bytes:
    offset, size = handle
    end = offset + size
    if end + _TRAILER_BYTES > len(data) - _FOOTER_BYTES:
        raise _Corrupt(
            f"truncated block read (block at {offset} of {size} bytes, file has {len(data)})"
        )
    contents = data[offset : end + 1]  # the block and its compression byte
    (stored,) = struct.unpack_from("<I", data, end + 1)
    if crc32c(contents) != _unmask(stored):
        raise _Corrupt(f"block checksum mismatch (block at {offset})")
    if contents[-1] != _NO_COMPRESSION:
        raise _Corrupt(
            f"block at {offset} has compression type {contents[-1]}; "
            f"only uncompressed tables are read"
        )
    return contents[:-1]


def _entries(block: bytes) -> Iterator[tuple[bytes, bytes]]:
    """A block's (key, value) pairs; keys share a prefix with the key before them."""
    if len(block) < 4:
        raise _Corrupt("block too short for its restart count")
    (restarts,) = struct.unpack_from("<I", block, len(block) - 4)
    limit = len(block) - 4 * (restarts + 1)
    if restarts == 0 or limit < 0:
        raise _Corrupt(f"bad restart count {restarts} in a block of {len(block)} bytes")
    pos, key = 0, b""
    while pos < limit:
        shared, pos = _varint(block, pos, limit)
        unshared, pos = _varint(block, pos, limit)
        size, pos = _varint(block, pos, limit)
        if shared > len(key) or pos + unshared + size > limit:
            raise _Corrupt(f"bad entry at byte {pos} of a block")
        key = key[:shared] + block[pos : pos + unshared]
        pos += unshared
        yield key, block[pos : pos + size]
        pos += size


def _handle(value: bytes) -> tuple[int, int]:
    offset, pos = _varint(value, 0, len(value))
    size, _ = _varint(value, pos, len(value))
    return offset, size


def read_table(path: str | os.PathLike[str]) -> list[tuple[bytes, bytes]]:
    """Every (key, value) of the table file ``path``, in key order.

    ``DataLossError`` naming the file when it is truncated, its magic number is wrong or
    a checksum does not match.
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        data = f.read()
    try:
        return _read_table(data)
    except _Corrupt as exc:
        raise errors.DataLossError(
            None, None, f"corrupt checkpoint index {path!r}: {exc}"
        ) from None


def _read_table(data: bytes) -> list[tuple[bytes, bytes]]:
    if len(data) < _FOOTER_BYTES:
        raise _Corrupt(f"file of {len(data)} bytes is too short to be a table")
    footer = len(data) - _FOOTER_BYTES
    (magic,) = struct.unpack_from("<Q", data, len(data) - 8)
    if magic != _MAGIC:
        raise _Corrupt("not an sstable (bad magic number)")
    _, pos = _varint(data, footer, len(data) - 8)  # the meta-index handle:
    _, pos = _varint(data, pos, len(data) - 8)  # unused by bundles
    index_offset, pos = _varint(data, pos, len(data) - 8)
    index_size, _ = _varint(data, pos, len(data) - 8)
    out: list[tuple[bytes, bytes]] = []
    for _, handle in _entries(_block(data, (index_offset, index_size))):
        out.extend(_entries(_block(data, _handle(handle))))
    keys = [k for k, _ in out]
    if keys != sorted(keys):
        raise _Corrupt("keys are not in order")
    return out


class BundleReader:
    """The tensors of one checkpoint ``prefix`` (``prefix.index`` + its data shards).

    The index is read and checked when the reader is made; tensor bytes are read and
    checksummed by :meth:`read`.
    """

    def __init__(self, prefix: str | os.PathLike[str]) -> None:
        self.prefix = os.fspath(prefix)
        self._index = self.prefix + ".index"
        if not os.path.exists(self._index):
            raise errors.NotFoundError(None, None, f"checkpoint index {self._index!r} not found")
        m = messages()
        self._entries: dict[str, Any] = {}
        header = None
        for key, value in read_table(self._index):
            try:
                if not key:
                    header = m.BundleHeaderProto.FromString(value)
                else:
                    self._entries[key.decode("utf-8")] = m.BundleEntryProto.FromString(value)
            except (m.DecodeError, UnicodeDecodeError) as exc:
                raise errors.DataLossError(
                    None, None, f"corrupt checkpoint index {self._index!r}: entry {key!r}: {exc}"
                ) from None
        if header is None:
            raise errors.DataLossError(
                None, None, f"corrupt checkpoint index {self._index!r}: no bundle header"
            )
        if header.endianness != 0:
            raise errors.UnimplementedError(
                None, None, f"checkpoint {self.prefix!r} was written on a big-endian machine"
            )
        self.num_shards = int(header.num_shards)

    def keys(self) -> list[str]:
        """The tensor names, sorted."""
        return sorted(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def dtype_and_shape(self, key: str) -> tuple[dtypes.DType, tuple[int, ...]]:
        """A tensor's dtype and shape from the index (no data read)."""
        entry = self._entry(key)
        where = f"checkpoint {self.prefix!r} tensor {key!r}"
        shape = tuple(int(d.size) for d in entry.shape.dim)
        if any(d < 0 for d in shape) or entry.shape.unknown_rank:
            raise errors.DataLossError(
                None,
                None,
                f"corrupt checkpoint index {self._index!r}: {key!r} has shape {list(shape)}",
            )
        return dtype_from_enum(entry.dtype, where), shape

    def _entry(self, key: str) -> Any:
        entry = self._entries.get(key)
        if entry is None:
            raise errors.NotFoundError(
                None, None, f"tensor {key!r} not found in checkpoint {self.prefix!r}"
            )
        return entry

    def shard_path(self, shard: int) -> str:
        """The data file of shard ``shard``."""
        return f"{self.prefix}.data-{shard:05d}-of-{self.num_shards:05d}"

    def read(self, key: str) -> np.ndarray:
        """The tensor ``key`` (read-only), its checksum verified."""
        entry = self._entry(key)
        dt, shape = self.dtype_and_shape(key)
        where = f"checkpoint {self.prefix!r} tensor {key!r}"
        if len(entry.slices):
            raise errors.UnimplementedError(
                None, None, f"{where} is partitioned into slices, which is not supported"
            )
        if dt is dtypes.string:
            raise errors.UnimplementedError(
                None, None, f"{where}: string tensors are not supported"
            )
        if not 0 <= entry.shard_id < self.num_shards:
            raise errors.DataLossError(
                None,
                None,
                f"corrupt checkpoint index "
                f"{self._index!r}: {key!r} is in shard "
                f"{entry.shard_id} of {self.num_shards}",
            )
        raw = self._bytes(entry, key)
        expected = int(np.prod(shape, dtype=np.int64)) * dt.np.itemsize
        if len(raw) != expected:
            raise errors.DataLossError(
                None,
                None,
                f"corrupt checkpoint index "
                f"{self._index!r}: {key!r} has {len(raw)} "
                f"bytes, its shape {list(shape)} needs "
                f"{expected}",
            )
        array = np.frombuffer(raw, dtype=dt.np.newbyteorder("<")).reshape(shape)
        array.flags.writeable = False
        return array

    def _bytes(self, entry: Any, key: str) -> bytes:
        path = self.shard_path(int(entry.shard_id))
        try:
            with open(path, "rb") as f:
                f.seek(int(entry.offset))
                raw = f.read(int(entry.size))
        except FileNotFoundError:
            raise errors.DataLossError(
                None, None, f"checkpoint data file {path!r} (tensor {key!r}) is missing"
            ) from None
        if len(raw) != entry.size:
            raise errors.DataLossError(
                None,
                None,
                f"checkpoint data file {path!r} is "
                f"truncated: tensor {key!r} needs bytes "
                f"[{entry.offset}, "
                f"{entry.offset + entry.size})",
            )
        if crc32c(raw) != _unmask(entry.crc32c):
            raise errors.DataLossError(
                None,
                None,
                f"checkpoint data file {path!r}: the checksum of tensor {key!r} does not match",
            )
        return raw

    def __repr__(self) -> str:
        return f"<BundleReader {self.prefix!r} tensors={len(self._entries)}>"
