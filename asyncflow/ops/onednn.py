"""Convolutions through oneDNN, TensorFlow's own CPU kernel library: the optional
``asyncflow[onednn]`` extra.

With the extra installed (the ``onednn-cpu-gomp`` wheel: oneDNN 3.x built with GNU
OpenMP, no Python code of its own), a large float32 NHWC ``Conv2D``, plain or as the
optimizer's ``_FusedConv2D`` (bias, residual, ``Relu`` / ``Relu6``), runs as one oneDNN
convolution, called through ``ctypes`` (which releases the GIL for the call): the
direct convolution TF runs, with the bias (and a residual) added as the output is
written, where numpy needs a window copy (im2col), a GEMM and more passes.  The
activation is numpy's, in place after it: oneDNN's turns NaN into 0, where TF's fused
convolution keeps it.  Measured on the zoo's batch-8 ResNet block: the convolution
itself three to four times faster than numpy's at one thread.  Without the extra, for
small and depthwise convolutions (``conv_ops._onednn`` says which), other dtypes, or an
input oneDNN refuses, numpy's kernels run, and give the same results to float32
rounding.

Threads: every call runs on one thread, the calling one (the kernel's: inline on the
event loop, or the device's worker thread).  The calling thread's OpenMP thread count
is set to 1 for the call and put back after, so OpenMP never starts a thread team of
its own: parallelism across kernels is the executor's, across a batch the convolution
kernel's split (``conv_ops._RunTimeSized``), as with numpy.  No thread pool of
OpenMP's is left behind, and a forked child (Dask's workers, multiprocessing) never
inherits one.

Each distinct geometry (shapes, strides, padding, what is fused) is made once per kernel
into a oneDNN primitive (its code generated for this CPU), then executed with the
arrays' own buffers: no copies in or out.  Memory objects and the stream are per
thread, the scratchpad is the caller's (``dnnl_scratchpad_mode_user``), so one kernel
runs concurrently from several threads (concurrent steps of one plan).

``ASYNCFLOW_ONEDNN=0`` in the environment, or :func:`set_enabled` (``False``), turns it
off; :func:`available` says whether it is in use.  The first oneDNN convolution of a
process also fixes glibc's malloc thresholds (:func:`keep_freed_memory`;
``ASYNCFLOW_MALLOC_TUNING=0`` keeps glibc's).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import sys
import threading
from collections.abc import Iterator
from sys import getrefcount
from typing import Any, NamedTuple

import numpy as np

from asyncflow.runtime.malloc import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, raise_to

__all__ = [
    "Convolution",
    "Geometry",
    "available",
    "convolution",
    "keep_freed_memory",
    "set_enabled",
    "version",
]

logger = logging.getLogger("asyncflow.onednn")

# oneDNN 3.x C API constants (dnnl_types.h / dnnl_common_types.h); the major version
# is checked at load.
_UNDEF = 0  # dnnl_data_type_undef
_F32 = 3  # dnnl_f32
_CPU = 1  # dnnl_cpu
_IN_ORDER = 1  # dnnl_stream_in_order
_FORWARD_INFERENCE = 96  # dnnl_forward_inference
_CONVOLUTION_DIRECT = 1  # dnnl_convolution_direct
_SCRATCHPAD_USER = 1  # dnnl_scratchpad_mode_user
_QUERY_IMPL_INFO = 8  # dnnl_query_impl_info_str
_QUERY_SCRATCHPAD_MD = 136  # dnnl_query_scratchpad_md
_ARG_SRC, _ARG_DST, _ARG_WEIGHTS, _ARG_BIAS, _ARG_SCRATCHPAD = 1, 17, 33, 41, 80
_MAX_DIMS = 12  # DNNL_MAX_NDIMS
#: The implementations taken: oneDNN's generated direct convolutions.  Its fallbacks
#: (``gemm:*``: a window copy and a GEMM per group, ``ref:*``: loops) are no faster than
#: numpy's kernels, which run instead.
_FAST = ("brgconv", "jit")
#: Output buffers a convolution keeps for reuse (see ``Convolution._output``).
_SPARES = 2

_Dims = ctypes.c_int64 * _MAX_DIMS
_Pair = ctypes.c_int64 * 2
_P = ctypes.c_void_p


class _Arg(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_int), ("memory", _P)]


class _Version(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_int),
        ("minor", ctypes.c_int),
        ("patch", ctypes.c_int),
        ("hash", ctypes.c_char_p),
        ("cpu_runtime", ctypes.c_uint),
        ("gpu_runtime", ctypes.c_uint),
    ]


class _Library:
    """The loaded library, its engine, and the OpenMP runtime it uses."""

    def __init__(self, dnnl: ctypes.CDLL, omp: ctypes.CDLL) -> None:
        self.dnnl = dnnl
        dnnl.dnnl_version.restype = ctypes.POINTER(_Version)
        v = dnnl.dnnl_version().contents
        self.version = (v.major, v.minor, v.patch)
        if v.major != 3:
            raise OSError(f"oneDNN {v.major}.{v.minor} found, asyncflow speaks its 3.x C API")
        dnnl.dnnl_primitive_desc_query_md.restype = _P
        dnnl.dnnl_primitive_desc_query_md.argtypes = [_P, ctypes.c_int, ctypes.c_int]
        dnnl.dnnl_memory_desc_get_size.restype = ctypes.c_size_t
        dnnl.dnnl_memory_desc_get_size.argtypes = [_P]
        dnnl.dnnl_memory_set_data_handle.argtypes = [_P, _P]
        dnnl.dnnl_primitive_execute.argtypes = [_P, _P, ctypes.c_int, _P]
        dnnl.dnnl_stream_wait.argtypes = [_P]
        self.engine = _P()
        _check(dnnl.dnnl_engine_create(ctypes.byref(self.engine), _CPU, 0), "dnnl_engine_create")
        self.get_threads = omp.omp_get_max_threads
        self.set_threads = omp.omp_set_num_threads
        self.local = threading.local()  # .stream: this thread's

    def stream(self) -> _P:
        """This thread's stream (destroyed with the thread's locals)."""
        owned: _Owned | None = getattr(self.local, "stream", None)
        if owned is None:
            stream = _P()
            _check(
                self.dnnl.dnnl_stream_create(ctypes.byref(stream), self.engine, _IN_ORDER),
                "dnnl_stream_create",
            )
            owned = self.local.stream = _Owned(self.dnnl.dnnl_stream_destroy, [stream])
        return owned.handles[0]


class _Owned:
    """oneDNN handles destroyed when this is: held in a ``threading.local``, a thread's
    handles go when the thread ends (a session's worker threads) or their owner goes."""

    __slots__ = ("_destroy", "handles")

    def __init__(self, destroy: Any, handles: list[_P]) -> None:
        self._destroy = destroy
        self.handles = handles

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            for handle in self.handles:
                if handle:
                    self._destroy(handle)


class _ThreadState(_Owned):
    """One thread's objects for one primitive: a memory object per descriptor (source,
    weights, destination, [bias], [scratchpad]; destroyed with this), the argument array
    naming them, the scratchpad's buffer, and what the others point at now."""

    __slots__ = ("args", "bias", "nargs", "scratch", "weights", "x", "y")

    def __init__(self, lib: _Library, mds: list[_P], scratch: int) -> None:
        super().__init__(lib.dnnl.dnnl_memory_destroy, [])
        for md in mds:
            mem = _P()  # (made with no buffer: a null handle, DNNL_MEMORY_NONE)
            _check(lib.dnnl.dnnl_memory_create(ctypes.byref(mem), md, lib.engine, None), "memory")
            self.handles.append(mem)
        kinds = [_ARG_SRC, _ARG_WEIGHTS, _ARG_DST, _ARG_BIAS][: len(mds) - bool(scratch)]
        if scratch:
            kinds.append(_ARG_SCRATCHPAD)
            self.scratch = np.empty(scratch, np.uint8)
            lib.dnnl.dnnl_memory_set_data_handle(self.handles[-1], self.scratch.ctypes.data)
        self.nargs = len(kinds)
        self.args = (_Arg * self.nargs)(
            *(_Arg(k, m) for k, m in zip(kinds, self.handles, strict=True))
        )
        self.x = self.y = 0  # the addresses set (0: none yet)
        self.weights: np.ndarray | None = None  # the arrays set (held: compared by identity)
        self.bias: np.ndarray | None = None


def _check(status: int, what: str) -> None:
    if status != 0:
        raise _Refused(f"{what}: oneDNN status {status}")


class _Refused(Exception):
    """oneDNN refused a call (an unsupported geometry): the numpy kernel runs instead."""


def _library_paths() -> list[str]:
    """Where the extra's wheel puts ``libdnnl.so.3`` (``<prefix>/lib``), then the
    system's."""
    paths = [os.path.join(sys.prefix, "lib", "libdnnl.so.3")]
    found = ctypes.util.find_library("dnnl")
    if found:
        paths.append(found)
    return paths


def _load() -> _Library | None:
    if os.environ.get("ASYNCFLOW_ONEDNN", "1") == "0":
        return None
    for path in _library_paths():
        if not os.path.exists(path) and os.sep in path:
            continue
        try:
            dnnl = ctypes.CDLL(path)
            omp = ctypes.CDLL("libgomp.so.1")  # (already loaded by libdnnl: its OpenMP)
            return _Library(dnnl, omp)
        except (OSError, AttributeError, _Refused) as exc:
            logger.debug("oneDNN at %s not used: %s", path, exc)
    return None


def keep_freed_memory() -> bool:
    """Fix glibc malloc's thresholds at the ceilings its dynamic ones reach (blocks from
    32 MiB are mapped on their own, 64 MiB of free heap top is kept before it is given
    back); True when set.

    Done once, when the process makes its first oneDNN convolution
    (``ASYNCFLOW_MALLOC_TUNING=0`` in the environment keeps glibc's defaults): with
    oneDNN's convolutions a step makes no large temporaries any more, glibc then gives
    the heap's top back to the system after every step, and the next step's arrays
    fault their pages in again.  Measured on the
    conv SavedModel at batch 8: 0.98 ms a step, 0.45 with the thresholds fixed (numpy's
    kernels: 0.65 either way); TF keeps its buffers too.  Not on other C libraries."""
    return raise_to(M_MMAP_THRESHOLD, 32 << 20) and raise_to(M_TRIM_THRESHOLD, 64 << 20)


_lib: _Library | None = _load()
_enabled = _lib is not None
_tuned = False  # keep_freed_memory ran (at the first primitive made)


def available() -> bool:
    """True when convolutions run through oneDNN (the extra installed and enabled)."""
    return _enabled


def version() -> tuple[int, int, int] | None:
    """oneDNN's version, when loaded."""
    return _lib.version if _lib is not None else None


def set_enabled(enabled: bool) -> bool:
    """Turn the oneDNN convolutions on or off (off: numpy's kernels); returns the previous
    setting.  On without the library is a ``RuntimeError``."""
    global _enabled
    if enabled and _lib is None:
        raise RuntimeError(
            "oneDNN is not installed (pip install 'asyncflow[onednn]'), or "
            "ASYNCFLOW_ONEDNN=0 kept it from loading"
        )
    before, _enabled = _enabled, enabled
    return before


@contextlib.contextmanager
def _one_thread(lib: _Library) -> Iterator[None]:
    """This thread's OpenMP thread count is 1 inside the block (see the module doc)."""
    before = lib.get_threads()
    if before != 1:
        lib.set_threads(1)
    try:
        yield
    finally:
        if before != 1:
            lib.set_threads(before)


def _memory_desc(lib: _Library, dims: list[int], strides: list[int]) -> _P:
    md = _P()
    _check(
        lib.dnnl.dnnl_memory_desc_create_with_strides(
            ctypes.byref(md), len(dims), _Dims(*dims), _F32, _Dims(*strides)
        ),
        "dnnl_memory_desc_create_with_strides",
    )
    return md


class Geometry(NamedTuple):
    """What a convolution primitive is made for: the shapes (``x`` NHWC, ``f``
    ``(kh, kw, c, o)``), the output's height and width, strides, dilations,
    ``((top, bottom), (left, right))`` padding, and what is fused after the
    convolution."""

    x_shape: tuple[int, ...]
    f_shape: tuple[int, ...]
    out_hw: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    pads: tuple[tuple[int, int], tuple[int, int]]
    bias: bool
    residual: bool  # a tensor of the output's shape is added

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        return (self.x_shape[0], *self.out_hw, self.f_shape[3])


def _descriptors(lib: _Library, geo: Geometry) -> list[_P]:
    """The memory descriptors of source, weights, destination (and bias): oneDNN's
    logical dims ((N, C, H, W), (O, I, KH, KW)) with the strides of numpy's NHWC and
    HWIO buffers, so oneDNN reads and writes them as they are."""
    n, h, w, c = geo.x_shape
    kh, kw, fc, _ = geo.f_shape
    _, oh, ow, o = geo.out_shape
    mds = [
        _memory_desc(lib, [n, c, h, w], [h * w * c, 1, w * c, c]),
        _memory_desc(lib, [o, fc, kh, kw], [1, o, kw * fc * o, fc * o]),
        _memory_desc(lib, [n, o, oh, ow], [oh * ow * o, 1, ow * o, o]),
    ]
    if geo.bias:
        mds.append(_memory_desc(lib, [o], [1]))
    return mds


def _attributes(lib: _Library, geo: Geometry) -> tuple[_P, _P]:
    """(the primitive's attributes, their post-ops or a null handle): the scratchpad is
    the caller's; a residual is a sum post-op.

    (No activation post-op: oneDNN's ``relu`` and ``clip`` turn NaN into 0, where TF's
    fused convolution, as numpy's ``maximum``, keeps it; the caller clamps in place.)"""
    dnnl = lib.dnnl
    attr, post_ops = _P(), _P()
    _check(dnnl.dnnl_primitive_attr_create(ctypes.byref(attr)), "attr")
    _check(dnnl.dnnl_primitive_attr_set_scratchpad_mode(attr, _SCRATCHPAD_USER), "attr")
    if not geo.residual:
        return attr, post_ops
    _check(dnnl.dnnl_post_ops_create(ctypes.byref(post_ops)), "post_ops")
    # dst = conv + bias + dst (the residual, copied in first)
    _check(dnnl.dnnl_post_ops_append_sum(post_ops, ctypes.c_float(1.0), 0, _UNDEF), "sum")
    _check(dnnl.dnnl_primitive_attr_set_post_ops(attr, post_ops), "attr")
    return attr, post_ops


class Convolution:
    """One :class:`Geometry` made into a oneDNN primitive, executed on numpy's buffers."""

    __slots__ = (
        "_lib",
        "_local",
        "_mds",
        "_outputs",
        "_prim",
        "_scratch",
        "geometry",
        "impl",
    )

    def __init__(self, lib: _Library, geo: Geometry) -> None:
        self._lib = lib
        self.geometry = geo
        self._local = threading.local()  # .state: this thread's (see _state)
        # The outputs handed out, with their buffers' addresses (see _output): one list
        # of pairs, so that two threads adding at once cannot mismatch them.
        self._outputs: list[tuple[np.ndarray, int]] = []
        self._prim = _P()
        self._mds = _descriptors(lib, geo)
        dnnl = lib.dnnl
        attr, post_ops = _attributes(lib, geo)
        pd = _P()
        (sh, sw), (dh, dw), ((top, bottom), (left, right)) = geo.strides, geo.dilations, geo.pads
        src, wts, dst = self._mds[:3]
        try:
            with _one_thread(lib):  # (its blocking chosen for the one thread it runs on)
                _check(
                    dnnl.dnnl_convolution_forward_primitive_desc_create(
                        ctypes.byref(pd),
                        lib.engine,
                        _FORWARD_INFERENCE,
                        _CONVOLUTION_DIRECT,
                        src,
                        wts,
                        self._mds[3] if geo.bias else None,
                        dst,
                        _Pair(sh, sw),
                        _Pair(dh - 1, dw - 1),  # (oneDNN counts the gaps: 0 is dense)
                        _Pair(top, left),
                        _Pair(bottom, right),
                        attr,
                    ),
                    "dnnl_convolution_forward_primitive_desc_create",
                )
                self.impl = self._query(pd)
                if not self.impl.startswith(_FAST):
                    raise _Refused(f"oneDNN would run {geo} as {self.impl}")
                _check(dnnl.dnnl_primitive_create(ctypes.byref(self._prim), pd), "primitive")
        finally:
            if pd:
                dnnl.dnnl_primitive_desc_destroy(pd)
            if post_ops:
                dnnl.dnnl_post_ops_destroy(post_ops)
            dnnl.dnnl_primitive_attr_destroy(attr)

    def _query(self, pd: _P) -> str:
        """The implementation oneDNN chose (its name), and the scratchpad it needs (its
        descriptor kept, its size in ``_scratch``)."""
        dnnl = self._lib.dnnl
        info = ctypes.c_char_p()
        _check(dnnl.dnnl_primitive_desc_query(pd, _QUERY_IMPL_INFO, 0, ctypes.byref(info)), "query")
        scratch_md = dnnl.dnnl_primitive_desc_query_md(pd, _QUERY_SCRATCHPAD_MD, 0)
        self._scratch = int(dnnl.dnnl_memory_desc_get_size(scratch_md)) if scratch_md else 0
        if self._scratch:
            scratch = _P()
            _check(dnnl.dnnl_memory_desc_clone(ctypes.byref(scratch), _P(scratch_md)), "md")
            self._mds.append(scratch)
        return (info.value or b"").decode()

    def _state(self) -> _ThreadState:
        """This thread's memory objects and argument array (see :class:`_ThreadState`)."""
        state: _ThreadState | None = getattr(self._local, "state", None)
        if state is None:
            state = self._local.state = _ThreadState(self._lib, self._mds, self._scratch)
        return state

    def _output(self) -> tuple[np.ndarray, int]:
        """A buffer for the output and its address: one handed out before that nobody
        holds any more (not even a view of it), else a new one, kept for later calls
        (``_SPARES`` at most).

        A fresh output of a batched convolution is hundreds of kilobytes: allocated per
        call, glibc maps it (or grows the heap) and gives it back when it is freed, and
        every call pays the page faults of writing it again (the zoo's batch-8 ResNet
        block: its convolutions took 1.8x their time in isolation, its step 1.6 ms
        instead of 0.9).  TF's allocator keeps its buffers; so does this.
        """
        outputs = self._outputs
        for k in range(len(outputs)):
            y, address = outputs[k]
            # Held by its pair, this frame and the call's argument alone: nobody else can
            # see it.  (Two threads looking at the same one both see one more, and both
            # pass it by.)
            if getrefcount(y) == 3:
                return y, address
        y = np.empty(self.geometry.out_shape, np.float32)
        address = y.ctypes.data
        if len(outputs) < _SPARES:
            outputs.append((y, address))
        return y, address

    def __call__(
        self, x: np.ndarray, f: np.ndarray, b: np.ndarray | None, residual: np.ndarray | None
    ) -> np.ndarray:
        """The convolution of C-contiguous float32 ``x`` by ``f`` (plus ``b``, plus
        ``residual``, made with ``residual=True``).

        (A buffer's address is given to its memory object only when it changed since
        this thread's last call: the filter and bias are the same arrays from call to
        call, the output one of two; each ``ctypes`` call costs ~0.5 us.)"""
        lib = self._lib
        y, y_address = self._output()
        if residual is not None:
            np.copyto(y, residual)
        state = self._state()
        mems = state.handles
        put = lib.dnnl.dnnl_memory_set_data_handle
        address = x.ctypes.data
        if state.x != address:
            put(mems[0], address)
            state.x = address
        if state.weights is not f:
            put(mems[1], f.ctypes.data)
            state.weights = f
        if state.y != y_address:
            put(mems[2], y_address)
            state.y = y_address
        if b is not None and state.bias is not b:
            put(mems[3], b.ctypes.data)
            state.bias = b
        stream = lib.stream()
        with _one_thread(lib):
            _check(
                lib.dnnl.dnnl_primitive_execute(self._prim, stream, state.nargs, state.args),
                "execute",
            )
            _check(lib.dnnl.dnnl_stream_wait(stream), "wait")
        return y

    def __del__(self) -> None:
        lib = getattr(self, "_lib", None)
        if lib is None:
            return
        with contextlib.suppress(Exception):
            if self._prim:
                lib.dnnl.dnnl_primitive_destroy(self._prim)
            for md in self._mds:
                lib.dnnl.dnnl_memory_desc_destroy(md)


def convolution(
    cache: dict[Any, Convolution | None],
    x: np.ndarray,
    f: np.ndarray,
    b: np.ndarray | None,
    strides: tuple[int, int],
    dilations: tuple[int, int],
    pads: tuple[tuple[int, int], tuple[int, int]],
    out_hw: tuple[int, int],
    activation: str | None,
    residual: np.ndarray | None = None,
) -> np.ndarray | None:
    """``x`` convolved by ``f`` (plus ``b``, plus ``residual``, then ``activation``)
    through oneDNN, or None when it is off or cannot take these inputs (the caller runs
    numpy's kernel).

    ``cache`` is the kernel's own: one primitive per input geometry."""
    lib = _lib
    if not _enabled or lib is None:
        return None
    if x.dtype != np.float32 or f.dtype != np.float32 or x.ndim != 4 or f.ndim != 4:
        return None
    o = f.shape[3]
    if b is not None and (b.dtype != np.float32 or b.shape != (o,)):
        return None
    out_shape = (x.shape[0], *out_hw, o)
    if residual is not None and (residual.dtype != np.float32 or residual.shape != out_shape):
        return None  # (a residual that broadcasts: numpy's kernel adds it)
    key = (x.shape, f.shape)
    if key in cache:
        conv = cache[key]
    else:
        geo = Geometry(
            x.shape,
            f.shape,
            out_hw,
            strides,
            dilations,
            pads,
            b is not None,
            residual is not None,
        )
        global _tuned
        if not _tuned:
            _tuned = True
            keep_freed_memory()
        try:
            conv = Convolution(lib, geo)
        except _Refused as exc:  # numpy's kernel runs it, and oneDNN is not asked again
            logger.debug("oneDNN refused %s: %s", geo, exc)
            conv = None
        cache[key] = conv
    if conv is None:
        return None
    y = conv(
        np.ascontiguousarray(x),
        np.ascontiguousarray(f),
        None if b is None else np.ascontiguousarray(b),
        residual,
    )
    # Clamped here, in place, as numpy's kernel does (NaN stays NaN, as in TF).
    if activation == "Relu":
        np.maximum(y, 0, out=y)
    elif activation == "Relu6":
        np.clip(y, 0, 6, out=y)
    return y
