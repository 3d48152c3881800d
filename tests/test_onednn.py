"""oneDNN's convolutions (the ``asyncflow[onednn]`` extra) against the loop references
of ``tests/test_conv_kernels.py`` and against numpy's kernels: plain, depthwise and
fused (bias, residual, ``Relu`` / ``Relu6``), on random geometries; run concurrently
from several threads; their outputs reused only when nobody holds them; OpenMP kept to
the calling thread.

The extra is part of the ``test`` extra: where it is installed and does not load, these
tests fail; only where it is not installed at all (another platform) are they skipped.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import threading
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import asyncflow as af
from asyncflow.compiler.fold_batchnorm import FUSED_CONV
from asyncflow.ops import conv_ops, onednn
from tests.test_conv_kernels import (
    L0,
    _nhwc,
    _optimized_types,
    _reference,
    _residual_graph,
    _run,
    _tf_padding,
    geometry,
)


def _installed() -> bool:
    try:
        importlib.metadata.distribution("onednn-cpu-gomp")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.fixture(autouse=True)
def _onednn_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """oneDNN on, for every size (the tests' convolutions are small: below the sizes
    where it pays, numpy's kernels run them otherwise)."""
    if not onednn.available():
        if _installed() and os.environ.get("ASYNCFLOW_ONEDNN") != "0":
            pytest.fail("onednn-cpu-gomp is installed, but asyncflow did not load it")
        pytest.skip("the asyncflow[onednn] extra is not installed")
    monkeypatch.setattr(conv_ops, "_ONEDNN_MACS", 0)
    monkeypatch.setattr(conv_ops, "_ONEDNN_1X1_MACS", 0)


class _Counted:
    """Counts the oneDNN primitives executed inside the block."""

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def __enter__(self) -> _Counted:
        real = onednn.Convolution.__call__

        def counted(conv: onednn.Convolution, *args: Any) -> Any:
            with self._lock:
                self.calls += 1
            return real(conv, *args)

        self._real = real
        onednn.Convolution.__call__ = counted  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        onednn.Convolution.__call__ = self._real  # type: ignore[method-assign]


def _numpy(y: af.Tensor, feed: dict[Any, Any] | None = None, config: Any = None) -> Any:
    """``y`` run on numpy's kernels."""
    before = onednn.set_enabled(False)
    try:
        with af.Session(graph=y.graph, config=config) as sess:
            return sess.run_sync(y, feed)
    finally:
        onednn.set_enabled(before)


@settings(max_examples=60, deadline=None)
@given(g=geometry, o=st.integers(1, 4), depthwise=st.booleans())
def test_convolutions_match_the_loop_reference(g: dict[str, Any], o: int, depthwise: bool) -> None:
    rng = np.random.default_rng(g["seed"])
    x = rng.standard_normal((g["n"], g["h"], g["w"], g["c"])).astype(np.float32)
    m = min(o, 2)
    f = rng.standard_normal((*g["k"], g["c"], m if depthwise else o)).astype(np.float32)
    if depthwise:
        depth = g["c"] * m

        def reduce(win: np.ndarray, _: np.ndarray) -> np.ndarray:
            out: np.ndarray = np.einsum("ijc,ijcm->cm", win, f.astype(np.float64))
            return out.reshape(-1)

    else:
        depth = o

        def reduce(win: np.ndarray, _: np.ndarray) -> np.ndarray:
            return np.tensordot(win, f.astype(np.float64), 3)

    expected = _reference(
        x.astype(np.float64), g["k"], g["s"], g["d"], g["padding"], 0.0, reduce, depth
    )
    graph = af.Graph()
    with graph.as_default():
        fmt = "NCHW" if g["nchw"] else "NHWC"
        xin = np.transpose(x, (0, 3, 1, 2)) if g["nchw"] else x
        strides = (
            list(g["s"]) if not depthwise else [1, 1, *g["s"]] if g["nchw"] else [1, *g["s"], 1]
        )
        op = af.nn.depthwise_conv2d if depthwise else af.nn.conv2d
        y = op(
            af.constant(xin),
            af.constant(f),
            strides,
            _tf_padding(g["padding"], g["nchw"]),
            data_format=fmt,
            dilations=list(g["d"]),
        )
    with _Counted() as counted:
        got = _nhwc(_run(y, L0), g["nchw"])
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    # oneDNN ran it (an empty output, and a depthwise one: numpy's kernel)
    assert counted.calls == (1 if expected.size and not depthwise else 0)


@pytest.mark.parametrize("projection", [False, True])
@pytest.mark.parametrize("activation", [af.nn.relu, af.nn.relu6, af.identity])
def test_fused_convolutions_equal_numpys(projection: bool, activation: Any) -> None:
    """Bias, residual and activation applied by oneDNN as the output is written give
    numpy's kernel's values."""
    graph, x, y = _residual_graph(af.float32, projection, activation)
    assert _optimized_types(y).count(FUSED_CONV) == 1 + projection
    feed = {x: 3 * np.random.default_rng(1).standard_normal((2, 7, 7, 6)).astype(np.float32)}
    with _Counted() as counted, af.Session(graph=graph) as sess:
        got = sess.run_sync(y, feed)
    assert counted.calls == 1 + projection
    expected = _numpy(y, feed)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    if activation is af.nn.relu6:
        assert got.max() <= 6.0
        assert got.min() >= 0.0


def test_other_dtypes_and_a_refused_geometry_run_on_numpy() -> None:
    """float64 is numpy's; a filter whose depth does not match the input's is refused by
    oneDNN and fails in numpy's kernel with its own error, naming the node."""
    rng = np.random.default_rng(5)
    with af.Graph().as_default() as graph:
        x64 = af.placeholder(af.float64, [None, 5, 5, 3], name="x64")
        y64 = af.nn.conv2d(x64, af.constant(rng.standard_normal((3, 3, 3, 2))), 1, "SAME")
        x = af.placeholder(af.float32, [None, None, None, None], name="x")
        y = af.nn.conv2d(x, af.constant(np.ones((3, 3, 4, 2), np.float32)), 1, "SAME", name="conv")
    feed64 = {x64: rng.standard_normal((2, 5, 5, 3))}
    with _Counted() as counted, af.Session(graph=graph) as sess:
        got = sess.run_sync(y64, feed64)
        assert counted.calls == 0
        with pytest.raises(af.errors.InvalidArgumentError, match=r"(?s)input depth 3 .*node conv "):
            sess.run_sync(y, {x: np.ones((1, 5, 5, 3), np.float32)})
        assert sess.run_sync(y, {x: np.ones((1, 5, 5, 4), np.float32)}).shape == (1, 5, 5, 2)
        assert counted.calls == 1
    np.testing.assert_allclose(got, _numpy(y64, feed64), rtol=1e-12)


def _direct(cache: dict[Any, Any], x: np.ndarray, f: np.ndarray, b: np.ndarray) -> Any:
    """One fused 3x3 SAME convolution with bias and Relu, through the module's own door."""
    out = conv_ops._onednn(cache, x, f, b, (1, 1), (1, 1), "SAME", ((0, 0), (0, 0)), "Relu")
    assert out is not None
    return out


def _expected(x: np.ndarray, f: np.ndarray, b: np.ndarray) -> np.ndarray:
    y = conv_ops._conv2d(x, f, (1, 1), (1, 1), "SAME", ((0, 0), (0, 0))) + b
    out: np.ndarray = np.maximum(y, 0)
    return out


def test_one_kernel_runs_from_many_threads_at_once() -> None:
    """Concurrent steps of one plan run the same primitive on several threads: each call
    gets its own memory objects and output, and the right values."""
    rng = np.random.default_rng(6)
    f = rng.standard_normal((3, 3, 8, 8)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    inputs = [rng.standard_normal((4, 12, 12, 8)).astype(np.float32) for _ in range(6)]
    expected = [_expected(x, f, b) for x in inputs]
    cache: dict[Any, Any] = {}
    failures: list[str] = []

    def work(k: int) -> None:
        for i in range(30):
            j = (k + i) % len(inputs)
            got = _direct(cache, inputs[j], f, b)
            if not np.allclose(got, expected[j], rtol=1e-4, atol=1e-4):
                failures.append(f"thread {k} call {i}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert failures == []
    assert len(cache) == 1  # one primitive for the geometry, shared


def test_an_output_is_reused_only_when_nobody_holds_it() -> None:
    """A result (or a view of it) still held is never written again; one dropped is."""
    rng = np.random.default_rng(7)
    f = rng.standard_normal((3, 3, 4, 4)).astype(np.float32)
    b = np.zeros(4, np.float32)
    x1, x2 = (rng.standard_normal((2, 6, 6, 4)).astype(np.float32) for _ in range(2))
    cache: dict[Any, Any] = {}
    first = _direct(cache, x1, f, b)
    view = first[1:]
    kept = view.copy()
    del first
    second = _direct(cache, x2, f, b)
    third = _direct(cache, x2, f, b)
    np.testing.assert_array_equal(view, kept)  # the view's buffer was not reused
    assert not np.shares_memory(second, view)
    assert not np.shares_memory(third, view)
    address = second.__array_interface__["data"][0]
    del second
    fourth = _direct(cache, x1, f, b)
    assert fourth.__array_interface__["data"][0] == address  # nobody held it: reused
    np.testing.assert_allclose(fourth, _expected(x1, f, b), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(third, _expected(x2, f, b), rtol=1e-4, atol=1e-4)


def _os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_openmp_stays_on_the_calling_thread() -> None:
    """A convolution on a thread whose OpenMP count is 2 runs on that thread alone (no
    OpenMP team starts), and the thread's count is put back after."""
    lib = onednn._lib
    assert lib is not None
    rng = np.random.default_rng(8)
    f = rng.standard_normal((3, 3, 16, 16)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    x = rng.standard_normal((8, 32, 32, 16)).astype(np.float32)
    seen: list[int] = []

    def work() -> None:
        lib.set_threads(2)
        before = _os_threads()
        _direct({}, x, f, b)
        seen.extend([lib.get_threads(), _os_threads() - before])

    t = threading.Thread(target=work)
    t.start()
    t.join(timeout=60)
    assert seen == [2, 0]


def test_a_batch_on_worker_threads_leaves_no_thread_behind() -> None:
    """A batch-8 step whose convolutions run (split) on the device's worker threads uses
    oneDNN there and leaves no OpenMP thread when the session closes."""
    graph, x, y = _residual_graph(af.float32, True, af.nn.relu)
    feed = {x: np.random.default_rng(9).standard_normal((8, 7, 7, 6)).astype(np.float32)}
    expected = _numpy(y, feed)
    before = _os_threads()
    saved = conv_ops._EXPENSIVE_MACS
    conv_ops._EXPENSIVE_MACS = 1
    try:
        with _Counted() as counted, af.Session(graph=graph) as sess:
            for _ in range(3):
                np.testing.assert_allclose(sess.run_sync(y, feed), expected, rtol=1e-5, atol=1e-5)
    finally:
        conv_ops._EXPENSIVE_MACS = saved
    assert counted.calls >= 6
    deadline = 50
    while _os_threads() > before and deadline:  # (worker threads exit as the session closes)
        threading.Event().wait(0.1)
        deadline -= 1
    assert _os_threads() <= before


def test_off_by_environment_or_switch() -> None:
    """``ASYNCFLOW_ONEDNN=0`` keeps the library from loading; ``set_enabled(False)`` turns
    it off in a running process (numpy's kernels run, with the same values)."""
    code = (
        "from asyncflow.ops import onednn; import sys; "
        "sys.exit(0 if not onednn.available() and onednn.version() is None else 1)"
    )
    env = {**os.environ, "ASYNCFLOW_ONEDNN": "0"}
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=120).returncode == 0
    graph, x, y = _residual_graph(af.float32, False, af.nn.relu)
    feed = {x: np.ones((1, 7, 7, 6), np.float32)}
    with _Counted() as counted:
        off = _numpy(y, feed)
        assert counted.calls == 0
        with af.Session(graph=graph) as sess:
            on = sess.run_sync(y, feed)
        assert counted.calls == 1
    np.testing.assert_allclose(on, off, rtol=1e-5, atol=1e-5)


def test_small_and_depthwise_convolutions_stay_numpys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Below the sizes where oneDNN's fixed cost per call pays (k x k and 1x1 apart), and
    for depthwise convolutions (which oneDNN would run as a GEMM per channel), numpy's
    kernels run; at those sizes oneDNN does."""
    monkeypatch.undo()  # (the module fixture's thresholds of 0 off: the real ones)
    rng = np.random.default_rng(10)
    cases = [  # (input, filter, depthwise, runs on oneDNN)
        ((1, 8, 8, 4), (3, 3, 4, 4), False, False),
        ((1, 8, 8, 16), (3, 3, 16, 16), False, True),
        ((1, 32, 32, 16), (3, 3, 16, 16), False, True),
        ((1, 16, 16, 96), (1, 1, 96, 24), False, False),
        ((1, 32, 32, 32), (1, 1, 32, 64), False, True),
        ((8, 32, 32, 16), (3, 3, 16, 1), True, False),
    ]
    for xs, fs, depthwise, on in cases:
        with af.Graph().as_default():
            x = af.constant(rng.standard_normal(xs).astype(np.float32))
            f = af.constant(rng.standard_normal(fs).astype(np.float32))
            op = af.nn.depthwise_conv2d if depthwise else af.nn.conv2d
            y = op(x, f, [1, 1, 1, 1], "SAME")
        with _Counted() as counted:
            got = _run(y, L0)
        assert counted.calls == on, (xs, fs)
        np.testing.assert_allclose(got, _numpy(y, config=L0), rtol=1e-4, atol=1e-4)


_FAULTS = """
import resource, numpy as np
import asyncflow as af
with af.Graph().as_default():
    x = af.constant(np.ones((1, 32, 32, 16), np.float32))
    y = af.nn.conv2d(x, af.constant(np.ones((3, 3, 16, 16), np.float32)), 1, "SAME")
    with af.Session() as sess:
        sess.run_sync(y)  # the process's first oneDNN convolution
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def step():  # a step's arrays: four of 1 MiB alive at once, written, then freed
    arrays = [np.ones(1 << 18, np.float32) for _ in range(4)]
    del arrays
for _ in range(5):
    step()
before = faults()
for _ in range(50):
    step()
print(faults() - before)
"""


@pytest.mark.parametrize("tuned", [True, False])
def test_freed_memory_is_kept_for_the_next_step(tuned: bool) -> None:
    """After a oneDNN convolution, the pages of a step's freed arrays serve the next step's
    (no page faults); ``ASYNCFLOW_MALLOC_TUNING=0`` keeps glibc's thresholds, which give
    the heap's top back and fault it in again (256 pages per MiB)."""
    env = {**os.environ, "ASYNCFLOW_MALLOC_TUNING": "1" if tuned else "0"}
    out = subprocess.run(
        [sys.executable, "-c", _FAULTS], env=env, timeout=120, capture_output=True, text=True
    )
    faults = int(out.stdout.strip().splitlines()[-1])
    if tuned:
        assert faults < 50, faults
    else:
        assert faults > 50 * 100, faults


def test_a_threads_handles_go_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory objects and the stream a thread made are destroyed when it ends (a
    closed session's worker threads leave no oneDNN handles behind)."""
    import gc

    lib = onednn._lib
    assert lib is not None
    destroyed: list[str] = []
    for name in ("dnnl_memory_destroy", "dnnl_stream_destroy"):
        real = getattr(lib.dnnl, name)

        def spy(handle: Any, _real: Any = real, _name: str = name) -> Any:
            destroyed.append(_name)
            return _real(handle)

        monkeypatch.setattr(lib.dnnl, name, spy)
    rng = np.random.default_rng(11)
    f = rng.standard_normal((3, 3, 4, 4)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    x = rng.standard_normal((1, 6, 6, 4)).astype(np.float32)
    cache: dict[Any, Any] = {}
    t = threading.Thread(target=_direct, args=(cache, x, f, b))
    t.start()
    t.join(timeout=60)
    gc.collect()
    # source, weights, destination, bias (and a scratchpad when the primitive has one)
    memories = destroyed.count("dnnl_memory_destroy")
    assert memories in (4, 5), destroyed
    assert destroyed.count("dnnl_stream_destroy") == 1


@pytest.mark.parametrize("activation", [af.nn.relu, af.nn.relu6])
def test_nan_stays_nan_through_a_fused_activation(activation: Any) -> None:
    """TF's fused convolution keeps a NaN through its ``Relu`` / ``Relu6``, as numpy's
    ``maximum`` does; oneDNN's own activations would turn it into 0 (so the clamp is
    numpy's, after oneDNN's convolution)."""
    graph, x, y = _residual_graph(af.float32, False, activation)
    feed = np.random.default_rng(12).standard_normal((1, 7, 7, 6)).astype(np.float32)
    feed[0, 3, 3, 0] = np.nan
    with _Counted() as counted, af.Session(graph=graph) as sess:
        got = sess.run_sync(y, {x: feed})
    assert counted.calls == 1
    expected = _numpy(y, {x: feed})
    assert np.isnan(got).sum() == np.isnan(expected).sum() > 0
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)  # (NaN where NaN)


_FORK = """
import os, numpy as np
from asyncflow.ops import conv_ops, onednn
assert onednn.available()
x = np.ones((8, 32, 32, 16), np.float32)
f = np.ones((3, 3, 16, 16), np.float32)
b = np.zeros(16, np.float32)
args = ((1, 1), (1, 1), "SAME", ((0, 0), (0, 0)), "Relu")
assert conv_ops._onednn({}, x, f, b, *args) is not None
pid = os.fork()
if pid == 0:
    y = conv_ops._onednn({}, x, f, b, *args)
    os._exit(0 if y is not None and float(y[0, 5, 5, 0]) == 144.0 else 3)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_runs_convolutions() -> None:
    """No OpenMP team exists to be inherited: a child forked after oneDNN ran (as Dask's
    nanny and multiprocessing fork) runs its convolutions (bounded: 60 s)."""
    out = subprocess.run(
        [sys.executable, "-c", _FORK], timeout=60, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "0", out.stderr
