"""Image ops of serving input pipelines: resize, and PNG / JPEG decode and encode.

``ResizeBilinear`` / ``ResizeNearestNeighbor`` follow TF's kernels exactly
(``kernels/image/resize_*_op.cc``): the scale is ``in / out`` (``(in - 1) / (out - 1)``
with ``align_corners`` and more than one output pixel), computed in float32; bilinear
samples at ``out * scale`` (legacy) or ``(out + 0.5) * scale - 0.5``
(``half_pixel_centers``) and interpolates in float32; nearest takes ``floor`` of
``out * scale`` (``round`` with ``align_corners``; ``(out + 0.5) * scale`` with
``half_pixel_centers``), clamped to the image.

Decoding and encoding go through Pillow, the optional extra ``asyncflow[image]``;
without it those kernels fail with an ``UnimplementedError`` naming the op and the
extra.  PNG decodes bit-exactly as TF's libpng: an 8-bit RGB or RGBA image through
``pyspng`` (libspng, part of the extra) when it is installed, one C call on the
bytes, the others through Pillow.  JPEG decodes through libjpeg-turbo
by ``simplejpeg`` (part of the extra) with TF's decoder settings — its
``dct_method`` (the fast integer IDCT by default) and ``fancy_upscaling`` —, so
exactly TF's pixels, with far less Python per call than Pillow's header parsing;
without ``simplejpeg`` (and for CMYK images) Pillow decodes it with the accurate
IDCT, within a few levels per pixel of TF's.
"""

from __future__ import annotations

import functools
import importlib
import io
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from asyncflow import dtypes, errors
from asyncflow.framework import registry
from asyncflow.framework.graph import Operation, Tensor, convert_to_tensor
from asyncflow.framework.shapes import TensorShape
from asyncflow.ops._base import const_value, define_op, make_op
from asyncflow.ops.conv_ops import _step_device
from asyncflow.runtime.resources import WOULD_BLOCK

__all__ = [
    "decode_jpeg",
    "decode_png",
    "encode_jpeg",
    "encode_png",
    "resize",
    "resize_bilinear",
    "resize_nearest_neighbor",
]

Specs = list[tuple[dtypes.DType, Any]]


# -- resize -----------------------------------------------------------------------------------


def _resize_shape(out_dtype: dtypes.DType | None) -> Callable[..., Specs]:
    def shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
        images, size = inputs
        if images._shape.rank not in (None, 4):
            raise ValueError(
                f"images {images.name!r} must be 4-D [batch, height, width, "
                f"channels], got shape {images._shape}"
            )
        if size._dtype is not dtypes.int32:
            raise TypeError(f"size {size.name!r} must be int32, got {size._dtype.name}")
        if not size._shape.is_compatible_with(TensorShape([2])):
            raise ValueError(
                f"size {size.name!r} must be a 1-D tensor of 2 elements, got shape {size._shape}"
            )
        value = const_value(size)
        hw = [int(v) for v in value.tolist()] if value is not None else [None, None]
        if any(d is not None and d <= 0 for d in hw):
            raise ValueError(f"size {size.name!r} must be positive, got {hw}")
        dims = images._shape.dims
        batch, channels = (dims[0], dims[3]) if dims is not None else (None, None)
        return [(out_dtype or images._dtype, TensorShape([batch, *hw, channels]))]

    return shape


define_op("ResizeBilinear", _resize_shape(dtypes.float32))
define_op("ResizeNearestNeighbor", _resize_shape(None))


def _check_resize(images: np.ndarray, size: Any) -> tuple[int, int]:
    if images.ndim != 4:
        raise errors.InvalidArgumentError(
            None, None, f"input must be 4-dimensional, got shape {list(images.shape)}"
        )
    if getattr(size, "shape", None) != (2,):  # (a kernel's input is an array: one check)
        size = np.asarray(size)
        if size.shape != (2,):
            raise errors.InvalidArgumentError(
                None, None, f"size must be a 1-D tensor of 2 elements, got shape {list(size.shape)}"
            )
    out_h, out_w = size.tolist()
    if out_h <= 0 or out_w <= 0:
        raise errors.InvalidArgumentError(
            None, None, f"output dimensions must be positive, got [{out_h}, {out_w}]"
        )
    if images.shape[1] == 0 or images.shape[2] == 0:
        raise errors.InvalidArgumentError(
            None, None, f"input image must be of non-zero size, got {list(images.shape)}"
        )
    return out_h, out_w


def _scale(in_size: int, out_size: int, align_corners: bool) -> np.float32:
    if align_corners and out_size > 1:
        return np.float32(in_size - 1) / np.float32(out_size - 1)
    return np.float32(in_size) / np.float32(out_size)


def _read_only(*arrays: np.ndarray) -> None:
    for a in arrays:
        a.setflags(write=False)


@functools.lru_cache(maxsize=256)
def _bilinear_weights(
    in_size: int, out_size: int, align_corners: bool, half_pixel: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lower, upper, lerp) per output index, as TF's ``compute_interpolation_weights``.

    Cached (read-only): a serving graph resizes the same sizes every call, and making
    the weights cost as much as the small resize itself.
    """
    scale = _scale(in_size, out_size, align_corners)
    x = np.arange(out_size, dtype=np.float32)
    src = (x + np.float32(0.5)) * scale - np.float32(0.5) if half_pixel else x * scale
    floor = np.floor(src)
    lower = np.maximum(floor.astype(np.int64), 0)
    upper = np.minimum(np.ceil(src).astype(np.int64), in_size - 1)
    lerp = (src - floor).astype(np.float32)
    _read_only(lower, upper, lerp)
    return lower, upper, lerp


def _runs(columns: np.ndarray, channels: int) -> np.ndarray:
    """Source column indices as indices into a row of ``channels``-pixel runs: a
    ``take`` of single elements (numpy copies 1, 2, 4 or 8 bytes at a time without a
    ``memmove`` per index, 3-channel pixels it does not)."""
    out: np.ndarray = (columns[..., None] * channels + np.arange(channels)).reshape(
        *columns.shape[:-1], -1
    )
    return out


class _BilinearPlan(NamedTuple):
    """How one bilinear resize gathers and weighs (read-only arrays, cached)."""

    rows: np.ndarray | None  # the source rows some output row reads (None: all of them)
    top: np.ndarray  # per output row, its lower source row's index in ``rows``
    bottom: np.ndarray  # and its upper one's
    columns: np.ndarray  # [[lower...], [upper...]] source columns, per channel
    lx_run: np.ndarray  # the column weights repeated per channel
    ly_column: np.ndarray  # the row weights, as a column


@functools.lru_cache(maxsize=256)
def _bilinear_plan(
    in_h: int, in_w: int, channels: int, out_h: int, out_w: int, align: bool, half: bool
) -> _BilinearPlan:
    """The plan of one resize (a serving graph resizes the same sizes every call)."""
    y0, y1, ly = _bilinear_weights(in_h, out_h, align, half)
    x0, x1, lx = _bilinear_weights(in_w, out_w, align, half)
    used = np.unique(np.concatenate([y0, y1]))
    rows = None if len(used) == in_h else used
    top, bottom = np.searchsorted(used, y0), np.searchsorted(used, y1)
    columns = _runs(np.stack([x0, x1]), channels)
    plan = _BilinearPlan(rows, top, bottom, columns, np.repeat(lx, channels), ly[:, None])
    _read_only(*(a for a in plan if a is not None))
    return plan


def _bilinear(images: np.ndarray, out_h: int, out_w: int, align: bool, half: bool) -> np.ndarray:
    """TF's bilinear resize, in its order of operations (its rounding):
    ``top = tl + (tr - tl) * lx``, ``bottom = bl + (br - bl) * lx``,
    ``top + (bottom - top) * ly``, in float32.

    Each source row some output row reads is interpolated along its columns once (the
    same values for every output row reading it), both column bounds gathered by one
    ``take`` and each row one run of ``out_w * channels`` values with the column
    weights repeated per channel (broadcasting weights over 3 channels ran numpy's
    inner loop 3 values at a time); then the output rows take their two interpolated
    rows and interpolate between them.  An upscale interpolates each source row once
    instead of twice per output row (11x17 -> 31x26 RGB: 19 -> 9 us).
    """
    n, in_h, in_w, c = images.shape
    plan = _bilinear_plan(in_h, in_w, c, out_h, out_w, align, half)
    img = images.reshape(n, in_h, in_w * c)
    if plan.rows is not None:
        img = img.take(plan.rows, axis=1)
    # [n, rows, 2, out_w * c] in float32, converted once gathered (a downscale reads a
    # fraction of its image).
    corners = img.take(plan.columns, axis=2).astype(np.float32, copy=False)
    left = corners[:, :, 0]
    rows: np.ndarray = corners[:, :, 1] - left
    rows *= plan.lx_run
    rows += left
    top = rows.take(plan.top, axis=1)
    out: np.ndarray = rows.take(plan.bottom, axis=1)
    out -= top
    out *= plan.ly_column
    out += top
    return out.reshape(n, out_h, out_w, c)


@registry.register_kernel_factory("ResizeBilinear")
def _bilinear_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    align = bool(op._attrs.get("align_corners", False))
    half = bool(op._attrs.get("half_pixel_centers", False))

    def resize(images: Any, size: Any) -> np.ndarray:
        out_h, out_w = _check_resize(images, size)
        return _bilinear(images, out_h, out_w, align, half)

    return resize, _resize_kind(op)


@functools.lru_cache(maxsize=256)
def _nearest_index(
    in_size: int, out_size: int, align_corners: bool, half_pixel: bool
) -> np.ndarray:
    """The source index per output index (TF's nearest rule); cached, read-only."""
    scale = _scale(in_size, out_size, align_corners)
    x = np.arange(out_size, dtype=np.float32)
    src = (x + np.float32(0.5)) * scale if half_pixel else x * scale
    index = np.floor(src)
    if align_corners:
        # roundf: halves away from zero (src >= 0 here), unlike numpy's round-half-even;
        # src + 0.5 could round up in float32, so the fraction is compared instead.
        index = np.where(src - index >= np.float32(0.5), index + 1, index)
    out: np.ndarray = np.minimum(index.astype(np.int64), in_size - 1)
    if half_pixel:
        out = np.maximum(out, 0)
    _read_only(out)
    return out


@functools.lru_cache(maxsize=256)
def _nearest_plan(
    in_h: int, in_w: int, channels: int, out_h: int, out_w: int, align: bool, half: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(source rows, source columns per channel (:func:`_runs`)) of one resize; cached."""
    x_runs = _runs(_nearest_index(in_w, out_w, align, half), channels)
    _read_only(x_runs)
    return _nearest_index(in_h, out_h, align, half), x_runs


@registry.register_kernel_factory("ResizeNearestNeighbor")
def _nearest_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    align = bool(op._attrs.get("align_corners", False))
    half = bool(op._attrs.get("half_pixel_centers", False))

    def resize(images: Any, size: Any) -> np.ndarray:
        out_h, out_w = _check_resize(images, size)
        n, in_h, in_w, c = images.shape
        ys, x_runs = _nearest_plan(in_h, in_w, c, out_h, out_w, align, half)
        rows = images.reshape(n, in_h, in_w * c).take(ys, axis=1)
        out: np.ndarray = rows.take(x_runs, axis=2).reshape(n, out_h, out_w, c)
        return out

    return resize, _resize_kind(op)


#: Output elements below which a resize runs inline: ~10 ns each in numpy, so about
#: a third of a millisecond at most, less than a hop to a worker thread and back costs
#: on a busy loop (a serving graph's small resizes: 32x32x3 at batch 8 is 24,576).
_INLINE_RESIZE_ELEMENTS = 1 << 15
#: The batch a resize of unknown batch is sized for (a serving batch worth inlining).
_SIZED_BATCH = 8


def _resize_kind(op: Operation) -> int:
    """INLINE when the output's static shape says the resize is small (an unknown batch
    counted as ``_SIZED_BATCH``), else EXPENSIVE (the device's worker threads)."""
    shape = op._outputs[0]._shape
    dims = shape.as_list() if shape.rank == 4 else [None]
    elements = _SIZED_BATCH if dims[0] is None else dims[0]
    for d in dims[1:] or [None]:
        if d is None:
            return registry.EXPENSIVE
        elements *= d
    return registry.INLINE if elements < _INLINE_RESIZE_ELEMENTS else registry.EXPENSIVE


def _resize(
    op_type: str,
    images: Any,
    size: Any,
    align_corners: bool,
    half_pixel_centers: bool,
    name: str | None,
) -> Tensor:
    if align_corners and half_pixel_centers:
        raise ValueError(f"{op_type}: align_corners and half_pixel_centers cannot both be true")
    x = convert_to_tensor(images)
    s = convert_to_tensor(size, dtype=dtypes.int32)
    return make_op(
        op_type,
        (x, s),
        {"align_corners": bool(align_corners), "half_pixel_centers": bool(half_pixel_centers)},
        name=name,
        default_name=op_type,
    ).outputs[0]


def resize_bilinear(
    images: Any,
    size: Any,
    align_corners: bool = False,
    half_pixel_centers: bool = False,
    name: str | None = None,
) -> Tensor:
    """``images`` [batch, height, width, channels] resized to ``size`` = [new_height,
    new_width] by bilinear interpolation; float32 (op ``ResizeBilinear``, TF's rules)."""
    return _resize("ResizeBilinear", images, size, align_corners, half_pixel_centers, name)


def resize_nearest_neighbor(
    images: Any,
    size: Any,
    align_corners: bool = False,
    half_pixel_centers: bool = False,
    name: str | None = None,
) -> Tensor:
    """``images`` resized to ``size`` taking the nearest pixel; the input dtype (op
    ``ResizeNearestNeighbor``, TF's rules)."""
    return _resize("ResizeNearestNeighbor", images, size, align_corners, half_pixel_centers, name)


def resize(images: Any, size: Any, method: str = "bilinear", name: str | None = None) -> Tensor:
    """TF 2's ``tf.image.resize``: half-pixel centers, ``method`` ``"bilinear"`` (float32
    result) or ``"nearest"`` (the input dtype)."""
    ops = {"bilinear": resize_bilinear, "nearest": resize_nearest_neighbor}
    if method not in ops:
        raise ValueError(f"resize: method must be one of {sorted(ops)}, got {method!r}")
    return ops[method](images, size, half_pixel_centers=True, name=name)


# -- decode / encode (Pillow) -----------------------------------------------------------------


def _pillow(op_type: str) -> Any:
    """The ``PIL.Image`` module, or an ``UnimplementedError`` naming the op and the extra."""
    try:
        from PIL import Image
    except ImportError:
        raise errors.UnimplementedError(
            None,
            None,
            f"{op_type} needs Pillow, which is not installed: pip install 'asyncflow[image]'",
        ) from None
    return Image


def _decode_shape(allowed: tuple[int, ...]) -> Callable[..., Specs]:
    def shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
        (contents,) = inputs
        if not contents._dtype.is_string:
            raise TypeError(
                f"contents {contents.name!r} must be a string, got {contents._dtype.name}"
            )
        if not contents._shape.is_compatible_with(TensorShape(())):
            raise ValueError(
                f"contents {contents.name!r} must be a scalar, got shape {contents._shape}"
            )
        dtype = attrs.get("dtype", dtypes.uint8)
        if dtype is not dtypes.uint8:
            raise TypeError(f"only uint8 images are supported, got dtype {dtype.name}")
        channels = int(attrs.get("channels", 0))
        if channels not in allowed:
            raise ValueError(
                f"`channels` must be {', '.join(map(str, allowed[:-1]))} or "
                f"{allowed[-1]} but got {channels}"
            )
        return [(dtypes.uint8, TensorShape([None, None, channels or None]))]

    return shape


def _encode_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    (image,) = inputs
    if image._dtype is not dtypes.uint8:
        raise TypeError(f"image {image.name!r} must be uint8, got {image._dtype.name}")
    if image._shape.rank not in (None, 3):
        raise ValueError(
            f"image {image.name!r} must be 3-D [height, width, channels], got shape {image._shape}"
        )
    return [(dtypes.string, TensorShape(()))]


define_op("DecodePng", _decode_shape((0, 1, 3, 4)))
define_op("DecodeJpeg", _decode_shape((0, 1, 3)))
define_op("EncodePng", _encode_shape)
define_op("EncodeJpeg", _encode_shape)

# The Pillow mode for each requested channel count, and for each Pillow mode the one
# holding its natural channels (channels=0).
_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
_NATURAL = {
    "1": "L",
    "L": "L",
    "LA": "LA",
    "RGB": "RGB",
    "RGBA": "RGBA",
    "CMYK": "RGB",
    "YCbCr": "RGB",
}
#: libpng's integer RGB -> gray weights (0.299, 0.587 in 15 bits) that TF asks for; the
#: sum is truncated, where Pillow's "L" conversion rounds.
_PNG_GRAY = np.array([9798, 19235, 3735], np.int64)


def _invalid_data(fmt: str, data: bytes, exc: Exception) -> errors.InvalidArgumentError:
    return errors.InvalidArgumentError(None, None, f"Invalid {fmt} data, size {len(data)}: {exc}")


def _header(image_module: Any, data: bytes, fmt: str, gray: bool) -> Any:
    """The image with its header read and its pixels not yet decoded."""
    try:
        img = image_module.open(io.BytesIO(data), formats=[fmt])
        if gray and fmt == "JPEG":
            img.draft("L", img.size)  # libjpeg's own grayscale output (the Y channel)
    except Exception as exc:
        raise _invalid_data(fmt, data, exc) from None
    return img


def _load(image_module: Any, img: Any, data: bytes, fmt: str) -> Any:
    try:
        img.load()
    except Exception as exc:
        raise _invalid_data(fmt, data, exc) from None
    if img.mode.startswith("I"):
        # 16-bit grayscale: keep the high byte, as libpng's strip_16 does for TF.
        high = (np.asarray(img).astype(np.uint32) >> 8).astype(np.uint8)
        img = image_module.fromarray(high, "L")
    return img


def _pixels(img: Any, fmt: str, channels: int) -> np.ndarray:
    """A loaded image as uint8 [height, width, channels], converted as TF does."""
    if img.mode == "P":
        natural = "RGBA" if "transparency" in img.info else "RGB"
    else:
        natural = _NATURAL.get(img.mode, "RGB")
    if channels == 1 and fmt == "PNG" and natural in ("RGB", "RGBA"):
        rgb = np.asarray(img.convert("RGB"), dtype=np.int64)  # alpha dropped, as TF
        return ((rgb @ _PNG_GRAY) >> 15).astype(np.uint8)[:, :, None]
    mode = _MODES[channels] if channels else natural
    array = np.asarray(img.convert(mode) if img.mode != mode else img, dtype=np.uint8)
    return array if array.ndim == 3 else array[:, :, None]


#: Pixels up to which an image decodes inline, on the step's loop: Pillow decodes a
#: 128x128 PNG or JPEG in 0.2-0.3 ms, a 32x32 one in 40-50 us, where a hop to a worker
#: thread and back costs ~50 us and more on a busy loop.  The header says the size
#: (the byte length does not: a JPEG of 256x256 can be 8 KB and take 0.4 ms).
_INLINE_DECODE_PIXELS = 128 * 128


def _optional(module: str) -> Any:
    """An optional decoder's module, or None when it is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


@functools.cache
def _simplejpeg() -> Any:
    """``simplejpeg`` (libjpeg-turbo), or None."""
    return _optional("simplejpeg")


@functools.cache
def _pyspng() -> Any:
    """``pyspng`` (libspng), or None."""
    return _optional("pyspng")


class _Decoder:
    """``DecodePng`` / ``DecodeJpeg``: inline when the image is small, else on the
    worker threads of the step's device.

    The executor calls :meth:`nowait` first: it reads the header and, for an image of
    at most ``_INLINE_DECODE_PIXELS`` pixels, decodes at once; a larger one answers
    ``WOULD_BLOCK`` and the awaited call decodes on a thread.  A C decoder giving TF's
    pixels (a subclass's :meth:`_fast_header` says which images it takes) decodes
    with one call on the bytes; Pillow, whose header parsing is Python, the others.
    """

    __slots__ = ("_channels", "_fmt", "_op_type")

    #: ``nowait`` answers WOULD_BLOCK only for a large image, whose awaited decode then
    #: needs nothing but a thread: a straight-line program keeps this node
    #: (``loop_schedule.runs_straight_line``), the rare large image hops.  Nor does
    #: ``nowait`` need an event loop: ``run_sync`` calls it on the caller's thread.
    offloads = True

    def __init__(self, op_type: str, fmt: str, channels: int) -> None:
        self._op_type = op_type
        self._fmt = fmt
        self._channels = channels

    def _fast_header(self, data: bytes) -> tuple[int, Any] | None:
        """(the image's pixel count, what :meth:`_fast_decode` needs) when a C decoder
        takes ``data``; None when Pillow decodes it."""
        return None

    def _fast_decode(self, data: bytes, how: Any) -> np.ndarray:
        raise NotImplementedError

    def _opened(self, data: bytes) -> tuple[Any, Any]:
        image_module = _pillow(self._op_type)
        return image_module, _header(image_module, data, self._fmt, self._channels == 1)

    def _finish(self, image_module: Any, img: Any, data: bytes) -> np.ndarray:
        return _pixels(_load(image_module, img, data, self._fmt), self._fmt, self._channels)

    def decode(self, contents: Any) -> np.ndarray:
        """Decode on the calling thread, whatever the size."""
        data = bytes(contents)
        found = self._fast_header(data)
        if found is not None:
            return self._fast_decode(data, found[1])
        return self._finish(*self._opened(data), data)

    def nowait(self, contents: Any) -> Any:
        data = bytes(contents)
        found = self._fast_header(data)
        if found is not None:
            pixels, how = found
            return WOULD_BLOCK if pixels > _INLINE_DECODE_PIXELS else self._fast_decode(data, how)
        image_module, img = self._opened(data)
        width, height = img.size
        if width * height > _INLINE_DECODE_PIXELS:
            return WOULD_BLOCK
        return self._finish(image_module, img, data)

    async def __call__(self, contents: Any) -> np.ndarray:
        device = _step_device()
        if device is None:  # (not run by a step's executor: nothing to hop to)
            return self.decode(contents)
        return await device.run_in_thread(self.decode, contents)


#: TF's ``DecodeJpeg`` ``dct_method`` values.
_DCT_METHODS = frozenset({"", "INTEGER_FAST", "INTEGER_ACCURATE"})
#: The JPEG color spaces libjpeg-turbo converts to RGB and gray as TF's decoder does
#: (``decode_jpeg_header`` names them); CMYK and YCCK images go to Pillow.
_TURBO_SPACES = frozenset({"Gray", "YCbCr", "RGB"})


class _JpegDecoder(_Decoder):
    """``DecodeJpeg`` through ``simplejpeg`` when it is installed: the header is one C
    call (Pillow parses the markers in Python: 40 us of a 11x17 image's 45), and the
    decode is libjpeg-turbo's with TF's settings, so the pixels are TF's own."""

    __slots__ = ("_fastdct", "_fastupsample")

    def __init__(self, op_type: str, channels: int, dct_method: str, fancy_upscaling: bool) -> None:
        super().__init__(op_type, "JPEG", channels)
        # TF: "" (its default) and "INTEGER_FAST" are JDCT_IFAST, "INTEGER_ACCURATE"
        # JDCT_ISLOW; fancy upscaling is libjpeg's smooth chroma upsampling.
        self._fastdct = dct_method != "INTEGER_ACCURATE"
        self._fastupsample = not fancy_upscaling

    def _fast_header(self, data: bytes) -> tuple[int, Any] | None:
        turbo = _simplejpeg()
        if turbo is None:
            return None
        try:
            height, width, space, _ = turbo.decode_jpeg_header(data)
        except ValueError as exc:
            raise _invalid_data("JPEG", data, exc) from None
        if space not in _TURBO_SPACES:
            return None
        gray = self._channels == 1 or (self._channels == 0 and space == "Gray")
        return height * width, (turbo, "GRAY" if gray else "RGB")

    def _fast_decode(self, data: bytes, how: Any) -> np.ndarray:
        turbo, space = how
        try:
            pixels: np.ndarray = turbo.decode_jpeg(
                data, space, fastdct=self._fastdct, fastupsample=self._fastupsample
            )
        except ValueError as exc:
            raise _invalid_data("JPEG", data, exc) from None
        return pixels


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: The output format (pyspng's name) per requested channel count and PNG color type
#: (IHDR: 2 RGB, 6 RGBA) of the 8-bit images libspng decodes here: TF's pixels, the
#: alpha dropped or made opaque as TF does.  Gray, palette and 16-bit images, and
#: gray output, go to Pillow (their conversions are libpng's: see ``_pixels``).
_SPNG_FORMATS = {
    (0, 2): "RGB",
    (0, 6): "RGBA",
    (3, 2): "RGB",
    (3, 6): "RGB",
    (4, 2): "RGBA",
    (4, 6): "RGBA",
}


class _PngDecoder(_Decoder):
    """``DecodePng`` of an 8-bit RGB or RGBA image through ``pyspng`` (libspng) when
    it is installed: the size is read from the IHDR chunk, the decode is one call
    (Pillow's chunk parsing and load are Python: 20 of an 11x17 image's 24 us)."""

    __slots__ = ()

    def __init__(self, op_type: str, channels: int) -> None:
        super().__init__(op_type, "PNG", channels)

    def _fast_header(self, data: bytes) -> tuple[int, Any] | None:
        spng = _pyspng()
        if spng is None or len(data) < 26 or not data.startswith(_PNG_SIGNATURE):
            return None
        if data[12:16] != b"IHDR":
            return None  # (Pillow names what is wrong)
        width, height, depth, color = struct.unpack(">IIBB", data[16:26])
        fmt = _SPNG_FORMATS.get((self._channels, color)) if depth == 8 else None
        return None if fmt is None else (width * height, (spng, fmt))

    def _fast_decode(self, data: bytes, how: Any) -> np.ndarray:
        spng, fmt = how
        try:
            pixels: np.ndarray = spng.load(data, fmt)
        except RuntimeError as exc:  # (pyspng's error for every libspng failure)
            raise _invalid_data("PNG", data, exc) from None
        return pixels


@registry.register_kernel_factory("DecodePng")
@registry.register_kernel_factory("DecodeJpeg")
def _decode_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    channels = int(op._attrs.get("channels", 0))
    if op._type == "DecodePng":
        return _PngDecoder(op._type, channels), registry.ASYNC
    return _JpegDecoder(op._type, channels, *_jpeg_settings(op)), registry.ASYNC


def _jpeg_settings(op: Operation) -> tuple[str, bool]:
    """A ``DecodeJpeg`` node's (``dct_method``, ``fancy_upscaling``); a value TF
    refuses, or a ``ratio`` (decoding at a fraction of the size) which is not
    implemented, is an error naming the node."""
    dct_method = op._attrs.get("dct_method", "")
    if isinstance(dct_method, bytes):
        dct_method = dct_method.decode()
    if dct_method not in _DCT_METHODS:
        raise errors.InvalidArgumentError(
            op.name,
            op,
            f"DecodeJpeg {op.name!r}: dct_method must be one of {sorted(_DCT_METHODS)}, "
            f"got {dct_method!r}",
        )
    ratio = int(op._attrs.get("ratio", 1))
    if ratio != 1:
        raise errors.UnimplementedError(
            op.name,
            op,
            f"DecodeJpeg {op.name!r}: ratio={ratio} (decoding at 1/{ratio} of the size) is "
            "not supported; decode at full size and resize",
        )
    return dct_method, bool(op._attrs.get("fancy_upscaling", True))


@registry.register_kernel_factory("EncodePng")
@registry.register_kernel_factory("EncodeJpeg")
def _encode_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    png = op._type == "EncodePng"
    op_type = op._type
    options: dict[str, Any] = {}
    if png:
        level = int(op._attrs.get("compression", -1))
        options["compress_level"] = 6 if level < 0 else min(level, 9)
    else:
        options["quality"] = int(op._attrs.get("quality", 95))

    def encode(image: Any) -> bytes:
        image_module = _pillow(op_type)
        array = np.asarray(image)
        if array.ndim != 3 or array.shape[2] not in ((1, 2, 3, 4) if png else (1, 3)):
            raise errors.InvalidArgumentError(
                None,
                None,
                f"image must be 3-D with {'1-4' if png else '1 or 3'} channels, "
                f"got shape {list(array.shape)}",
            )
        mode = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}[array.shape[2]]
        img = image_module.fromarray(array[:, :, 0] if mode == "L" else array, mode)
        out = io.BytesIO()
        img.save(out, format="PNG" if png else "JPEG", **options)
        return out.getvalue()

    return encode, registry.EXPENSIVE


def _decode(
    op_type: str,
    contents: Any,
    channels: int,
    name: str | None,
    extra: Mapping[str, Any] | None = None,
) -> Tensor:
    t = convert_to_tensor(contents, dtype=dtypes.string)
    return make_op(
        op_type,
        (t,),
        {"channels": int(channels), "dtype": dtypes.uint8, **(extra or {})},
        name=name,
        default_name=op_type,
    ).outputs[0]


def decode_png(contents: Any, channels: int = 0, name: str | None = None) -> Tensor:
    """A PNG image (scalar string) as uint8 [height, width, channels] (op ``DecodePng``);
    ``channels=0`` keeps the image's own.  Needs ``asyncflow[image]``."""
    return _decode("DecodePng", contents, channels, name)


def decode_jpeg(
    contents: Any,
    channels: int = 0,
    name: str | None = None,
    *,
    fancy_upscaling: bool = True,
    dct_method: str = "",
) -> Tensor:
    """A JPEG image as uint8 [height, width, channels] (op ``DecodeJpeg``): TF's exact
    pixels through ``simplejpeg`` (libjpeg-turbo), with TF's ``fancy_upscaling`` and
    ``dct_method`` (``""``, TF's default, and ``"INTEGER_FAST"``: the fast integer
    IDCT; ``"INTEGER_ACCURATE"``: the accurate one).  Through Pillow alone (no
    ``simplejpeg``, or a CMYK image) the decode is Pillow's, accurate IDCT and fancy
    upscaling whatever they say, within a few levels of TF's pixels.  Needs
    ``asyncflow[image]``."""
    if dct_method not in _DCT_METHODS:
        raise ValueError(
            f"decode_jpeg: dct_method must be one of {sorted(_DCT_METHODS)}, got {dct_method!r}"
        )
    extra = {"fancy_upscaling": bool(fancy_upscaling), "dct_method": dct_method}
    return _decode("DecodeJpeg", contents, channels, name, extra)


def encode_png(image: Any, compression: int = -1, name: str | None = None) -> Tensor:
    """uint8 [height, width, channels] as PNG bytes (op ``EncodePng``); decoding gives
    the image back exactly (the compressed bytes differ from TF's libpng)."""
    x = convert_to_tensor(image)
    return make_op(
        "EncodePng", (x,), {"compression": int(compression)}, name=name, default_name="EncodePng"
    ).outputs[0]


def encode_jpeg(image: Any, quality: int = 95, name: str | None = None) -> Tensor:
    """uint8 [height, width, 1 or 3] as JPEG bytes (op ``EncodeJpeg``, lossy)."""
    x = convert_to_tensor(image)
    return make_op(
        "EncodeJpeg",
        (x,),
        {"quality": int(quality), "format": ""},
        name=name,
        default_name="EncodeJpeg",
    ).outputs[0]
