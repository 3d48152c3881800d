"""What a new user meets first: bad input refused at the door, errors that name what
was pending, and a clear error under an event loop that is not asyncio."""

from __future__ import annotations

import asyncio
import logging
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import numpy as np
import pytest

import asyncflow as af
from asyncflow.runtime.devices import blas_governor

if TYPE_CHECKING:
    from tests.conftest import AsyncHang, Hangs

# -- bad input at the door (TF raises for each) ------------------------------------------


def _graph() -> tuple[af.Graph, af.Tensor, af.Tensor]:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        y = x * 2.0
    return g, x, y


@pytest.mark.parametrize("bad", ["FULL_TRACE", {"timeout_in_ms": 5}, 3])
def test_options_that_are_not_run_options_are_a_type_error(bad: Any) -> None:
    g, x, y = _graph()
    with af.Session(graph=g) as sess:
        with pytest.raises(TypeError, match=r"options must be an af.RunOptions, got"):
            sess.run_sync(y, {x: 1.0}, options=bad)
        fn = sess.make_callable(y, [x], accept_options=True)
        with pytest.raises(TypeError, match=r"options must be an af.RunOptions"):
            fn.run_sync(1.0, options=bad)
        assert sess.run_sync(y, {x: 1.0}) == 2.0  # the session stays usable


async def test_run_metadata_that_is_not_run_metadata_is_a_type_error() -> None:
    g, x, y = _graph()
    async with af.Session(graph=g) as sess:
        with pytest.raises(TypeError, match=r"run_metadata must be an af.RunMetadata, got dict"):
            await sess.run(y, {x: 1.0}, run_metadata={})  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"options must be an af.RunOptions, got str"):
            await sess.run(y, {x: 1.0}, options="fast")  # type: ignore[arg-type]
        assert await sess.run(y, {x: 1.0}) == 2.0


@pytest.mark.parametrize("bad", [-1, -0.5, "100", None, float("nan")])
def test_a_negative_or_non_numeric_timeout_is_a_value_error(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"timeout_in_ms must be a number >= 0"):
        af.RunOptions(timeout_in_ms=bad)


def test_a_timeout_set_after_construction_is_checked_at_the_run() -> None:
    g, x, y = _graph()
    options = af.RunOptions()
    options.timeout_in_ms = -5
    with af.Session(graph=g) as sess, pytest.raises(ValueError, match=r"got -5"):
        sess.run_sync(y, {x: 1.0}, options=options)


@pytest.mark.parametrize("name", ["a b", "x:0", "^a", "/a", "-a", ">a", "a!", "a\tb"])
def test_op_names_follow_tensorflows_pattern(name: str) -> None:
    g = af.Graph()
    with g.as_default(), pytest.raises(ValueError, match=r"is not a valid op name"):
        af.constant(1.0, name=name)
    assert g.get_operations() == []


@pytest.mark.parametrize("name", ["a", "A.b-c/d>e_f", "0", ".x", "scope/op_1", "_internal"])
def test_valid_op_names_are_kept(name: str) -> None:
    g = af.Graph()
    with g.as_default():
        assert af.constant(1.0, name=name).op.name == name


# -- errors that name what was pending --------------------------------------------------


def _stuck_graph(never: AsyncHang) -> tuple[af.Graph, af.Tensor, af.Tensor]:
    g = af.Graph()
    with g.as_default():
        x = af.constant(1.0, name="x")
        both = af.add(
            af.py_func(never, [x], af.float32, name="slow_b"),
            af.py_func(never, [x], af.float32, name="slow_a"),
            name="both",
        )
        lone = af.py_func(never, [x], af.float32, name="lone")
    return g, both, lone


async def test_a_deadline_names_the_kernels_still_running(hanging_kernel: Hangs) -> None:
    g, both, lone = _stuck_graph(hanging_kernel.async_kernel())
    async with af.Session(graph=g) as sess:
        with pytest.raises(af.errors.DeadlineExceededError) as caught:
            await sess.run(both, options=af.RunOptions(timeout_in_ms=20))
        assert caught.value.node_name == "slow_a"
        assert caught.value.op is g.get_operation_by_name("slow_a")
        assert "still running: 'slow_a', 'slow_b'" in str(caught.value)
        assert "timeout_in_ms=20" in str(caught.value)
        # A lone async kernel is awaited in the caller's task: named too.
        with pytest.raises(
            af.errors.DeadlineExceededError, match=r"still running: 'lone'$"
        ) as caught:
            await sess.run(lone, options=af.RunOptions(timeout_in_ms=20))
        assert caught.value.node_name == "lone"


async def test_a_deadline_names_pending_kernels_across_devices(hanging_kernel: Hangs) -> None:
    never = hanging_kernel.async_kernel()
    g = af.Graph()
    with g.as_default():
        with af.device("/cpu:0"):
            a = af.py_func(never, [af.constant(1.0)], af.float32, name="on_cpu0")
        with af.device("/cpu:1"):
            b = af.identity(a, name="after") * 2.0  # waits on a receive: not a kernel
    config = af.SessionConfig(device_count={"CPU": 2}, operation_timeout_in_ms=20)
    async with af.Session(graph=g, config=config) as sess:
        with pytest.raises(af.errors.DeadlineExceededError) as caught:
            await sess.run(b)
        assert caught.value.node_name == "on_cpu0"
        assert str(caught.value).endswith("still running: 'on_cpu0'")


async def test_a_deadline_with_no_kernel_running_names_none() -> None:
    g = af.Graph()
    with g.as_default():
        q = af.FIFOQueue(1, af.float32, shapes=[()])
        take = q.dequeue()
    async with af.Session(graph=g) as sess:
        # The dequeue waits in the queue: it is a running async kernel, named.
        with pytest.raises(af.errors.DeadlineExceededError) as caught:
            await sess.run(take, options=af.RunOptions(timeout_in_ms=20))
        assert caught.value.node_name == take.op.name


# -- asyncio only: every entry point says so under trio -------------------------------


def test_async_with_session_under_trio_is_the_clear_error() -> None:
    g = af.Graph()
    with g.as_default():
        c = af.constant(1.0) + 2.0  # an all-inline plan: it would run without awaiting

    async def main() -> None:
        async with af.Session(graph=g) as sess:
            await sess.run(c)

    open_devices = blas_governor().users
    with pytest.raises(
        RuntimeError,
        match=r"async with af.Session\(...\) needs the asyncio "
        r"event loop, but it was awaited from trio.*"
        r"backend='asyncio'",
    ):
        anyio.run(main, backend="trio")
    assert blas_governor().users == open_devices  # the refused session was closed

    sess = af.Session(graph=g)

    async def close() -> None:
        await sess.close()

    with pytest.raises(RuntimeError, match=r"Session.close needs the asyncio event loop"):
        anyio.run(close, backend="trio")

    async def stream() -> None:
        async for _ in sess.run_stream([c]):
            pass

    with pytest.raises(RuntimeError, match=r"Session.run_stream needs the asyncio event loop"):
        anyio.run(stream, backend="trio")
    assert sess.run_sync(c) == 3.0  # unharmed
    sess.close_sync()


# -- import_graph_def is all or nothing -------------------------------------------------


def _graph_def_failing_late() -> dict[str, Any]:
    g = af.Graph()
    with g.as_default():
        a = af.constant(1.0, name="a")
        b = af.identity(a, name="b")
        af.identity(b, name="c")
    gd = g.as_graph_def()
    (c,) = [n for n in gd["node"] if n["name"] == "c"]
    c["input"] = ["b:3"]  # b has one output: found only once a and b exist
    return gd


def test_import_graph_def_is_all_or_nothing() -> None:
    g = af.Graph()
    with g.as_default():
        kept = af.constant(2.0, name="kept")
        version = g.version
        with pytest.raises(ValueError, match=r"input 'b:3' but node 'b' has only 1 output"):
            af.import_graph_def(_graph_def_failing_late())
        assert [op.name for op in g.get_operations()] == ["kept"]
        assert g.version > version  # caches keyed by the version are not fooled
        with pytest.raises(KeyError):
            g.get_operation_by_name("a")
        # The names are free again, and the graph works as before.
        assert af.constant(3.0, name="a").op.name == "a"
        with af.Session(graph=g) as sess:
            assert sess.run_sync(kept) == 2.0


def test_a_bad_return_element_leaves_nothing_either() -> None:
    g0 = af.Graph()
    with g0.as_default():
        af.constant(1.0, name="a")
    g = af.Graph()
    with g.as_default():
        with pytest.raises(ValueError, match=r"nope"):
            af.import_graph_def(g0.as_graph_def(), return_elements=["nope:0"])
        assert g.get_operations() == []
        elements = af.import_graph_def(g0.as_graph_def(), return_elements=["a:0"])
        assert elements is not None
        (a,) = elements
        assert a.name == "a:0"


# -- TF 1.x porting traps -------------------------------------------------------------


def test_while_loop_of_one_variable_returns_the_tensor_as_tf1() -> None:
    g = af.Graph()
    with g.as_default():
        n = af.while_loop(lambda i: i < 3, lambda i: i + 1, [af.constant(0)])
        assert isinstance(n, af.Tensor)
        doubled = n * 2  # a list would have been [n, n]
        (same,) = af.while_loop(
            lambda i: i < 3, lambda i: i + 1, [af.constant(0)], return_same_structure=True
        )
        tup = af.while_loop(lambda i: i < 2, lambda i: (i + 1,), (af.constant(0),))
        bare = af.while_loop(lambda i: i < 4, lambda i: i + 1, af.constant(0))
        d = af.while_loop(lambda v: v["i"] < 5, lambda v: {"i": v["i"] + 1}, {"i": af.constant(0)})
        i, s = af.while_loop(
            lambda i, s: i < 3, lambda i, s: (i + 1, s + i), [af.constant(0), af.constant(0)]
        )
    assert isinstance(tup, af.Tensor)
    assert isinstance(bare, af.Tensor)
    assert isinstance(d, dict)
    with af.Session(graph=g) as sess:
        assert sess.run_sync([doubled, same, tup, bare, d, i, s]) == [6, 3, 2, 4, {"i": 5}, 3, 3]


def _eval_graph() -> tuple[af.Graph, af.Tensor, af.Tensor, af.Operation]:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        y = af.multiply(x, 2.0, name="y")
        af.Variable(1.0, name="v")
        init = af.global_variables_initializer()
    return g, x, y, init


def test_eval_sync_and_run_sync_from_plain_code() -> None:
    g, x, y, init = _eval_graph()
    with af.Session(graph=g) as sess:
        init.run_sync(session=sess)
        assert y.eval_sync({x: 2.0}, session=sess) == 4.0
        assert g.get_tensor_by_name("v:0").eval_sync(session=sess) == 1.0
        with pytest.raises(ValueError, match=r"no default session"):
            y.eval_sync({x: 2.0})


def test_a_forgotten_await_fails_loudly() -> None:
    g, x, y, init = _eval_graph()
    with af.Session(graph=g) as sess:
        value = y.eval({x: 2.0}, session=sess)
        assert "eval_sync" in repr(value)
        uses: tuple[Callable[[Any], object], ...] = (
            float,
            lambda v: v + 1,
            lambda v: v * 2,
            np.asarray,
            bool,
        )
        for use in uses:
            with pytest.raises(
                TypeError,
                match=r"tensor 'y:0'.eval\(...\) returns a coroutine: "
                r"`await` it .* tensor 'y:0'.eval_sync",
            ):
                use(value)
        held = [value]
        del value
        with pytest.warns(RuntimeWarning, match=r"tensor 'y:0'.eval\(...\) was never awaited"):
            held.clear()  # collected here, never awaited
        held.append(init.run(session=sess))
        with pytest.warns(
            RuntimeWarning,
            match=r"operation 'init'.run\(...\) was never "
            r"awaited.*operation 'init'.run_sync",
        ):
            held.clear()
        # A coroutine still: asyncio.run and gather take it.
        assert asyncio.run(y.eval({x: 3.0}, session=sess)) == 6.0


async def test_eval_and_run_are_awaited_as_before() -> None:
    g, x, y, init = _eval_graph()
    async with af.Session(graph=g) as sess:
        await init.run(session=sess)
        assert list(
            await asyncio.gather(y.eval({x: 1.0}, session=sess), y.eval({x: 2.0}, session=sess))
        ) == [2.0, 4.0]


_PLACEMENT = """
import asyncflow as af
g = af.Graph()
with g.as_default():
    with af.device("/cpu:1"):
        y = af.add(af.constant(1.0, name="one"), 1.0, name="placed")
with af.Session(graph=g, config=af.SessionConfig(device_count={"CPU": 2},
                                                 log_device_placement=True)) as sess:
    sess.run_sync(y)
"""


def test_log_device_placement_shows_under_default_logging(tmp_path: Path) -> None:
    script = tmp_path / "placement.py"
    script.write_text(_PLACEMENT, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=True, timeout=60
    )
    assert "Device mapping:" in proc.stderr
    assert "placed: (Add): /job:localhost/replica:0/task:0/device:CPU:1" in proc.stderr
    assert proc.stdout == ""


# -- logging: DEBUG records, nothing printed by default -------------------------------


def test_compiles_are_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    g = af.Graph()
    with g.as_default():
        y = af.add(af.constant(1.0), af.constant(2.0), name="y")
    with caplog.at_level(logging.DEBUG, logger="asyncflow"), af.Session(graph=g) as sess:
        sess.run_sync(y)
        sess.run_sync(y)  # a cache hit: no second record
    (record,) = [r for r in caplog.records if r.getMessage().startswith("compiled ")]
    assert record.name == "asyncflow.session"
    assert record.levelno == logging.DEBUG
    assert re.fullmatch(
        r"compiled \[y:0\] <- \[\] in \d+\.\d ms: 1 partition\(s\) of \d+ "
        r"node\(s\); optimizer: 3 -> 1 nodes \(folded 2, cse 0, inlined 0, "
        r"\d+ round\(s\)\)",
        record.getMessage(),
    ), record.getMessage()


async def test_slow_and_failed_steps_are_logged_at_debug(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from asyncflow.session import core as session_module

    monkeypatch.setattr(session_module, "SLOW_STEP_SECONDS", 0.0)

    async def later(v: Any) -> Any:
        await asyncio.sleep(0)
        return v

    def broken(v: Any) -> Any:
        raise ValueError("no luck")

    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        slow = af.py_func(later, [x], af.float32, name="slow")
        bad = af.py_func(broken, [x], af.float32, name="bad")
    with caplog.at_level(logging.DEBUG, logger="asyncflow"):
        async with af.Session(graph=g) as sess:
            await sess.run(slow, {x: 1.0})
            with pytest.raises(af.errors.InvalidArgumentError):
                await sess.run(bad, {x: 1.0})
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert any(
        re.fullmatch(r"slow step: \[slow:0\] <- \[x:0\] took \d+\.\d+ s \(over 0 s\)", m)
        for m in messages
    ), messages
    assert any(
        m.startswith("step failed: [bad:0] <- [x:0]: InvalidArgumentError: ") and "no luck" in m
        for m in messages
    ), messages


_QUIET = """
import asyncflow as af
g = af.Graph()
with g.as_default():
    x = af.placeholder(af.float32, shape=(), name="x")
    y = af.py_func(lambda v: 1 / 0, [x], af.float32, name="y")
with af.Session(graph=g) as sess:
    try:
        sess.run_sync(y, {x: 1.0})
    except af.errors.OpError:
        pass
    sess.run_sync(x * 2.0, {x: 1.0})
"""


def test_nothing_is_printed_by_default(tmp_path: Path) -> None:
    script = tmp_path / "quiet.py"
    script.write_text(_QUIET, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=True, timeout=60
    )
    assert (proc.stdout, proc.stderr) == ("", "")


# -- streaming: values known before the step are yielded first -------------------------


async def test_constants_and_fed_fetches_are_yielded_before_a_slow_kernel() -> None:
    gate = asyncio.Event()

    async def waits(v: Any) -> Any:
        await gate.wait()  # released by the test only after it saw the early values
        return v

    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        slow = af.py_func(waits, [x], af.float32, name="slow")
        c = af.constant(5.0, name="c")
    seen: list[tuple[str, Any, bool]] = []
    # (Without the early yields the stream would wait forever: a bound, not an order.)
    async with af.Session(graph=g) as sess, asyncio.timeout(30):
        async for fetch, value in sess.run_stream([slow, c, x], {x: 1.0}):
            seen.append((fetch.name, value, gate.is_set()))
            if len(seen) == 2:
                gate.set()
    assert seen == [("c:0", 5.0, False), ("x:0", 1.0, False), ("slow:0", 1.0, True)]
