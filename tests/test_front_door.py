"""What a new user meets first: bad input refused at the door, errors that name what
was pending, and a clear error under an event loop that is not asyncio."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest

import asyncflow as af

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
            await sess.run(y, {x: 1.0}, run_metadata={})
        with pytest.raises(TypeError, match=r"options must be an af.RunOptions, got str"):
            await sess.run(y, {x: 1.0}, options="fast")
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


def _stuck_graph() -> tuple[af.Graph, af.Tensor, af.Tensor]:
    async def never(v: Any) -> Any:
        await asyncio.Event().wait()
        return v

    g = af.Graph()
    with g.as_default():
        x = af.constant(1.0, name="x")
        both = af.add(af.py_func(never, [x], af.float32, name="slow_b"),
                      af.py_func(never, [x], af.float32, name="slow_a"), name="both")
        lone = af.py_func(never, [x], af.float32, name="lone")
    return g, both, lone


async def test_a_deadline_names_the_kernels_still_running() -> None:
    g, both, lone = _stuck_graph()
    async with af.Session(graph=g) as sess:
        with pytest.raises(af.errors.DeadlineExceededError) as caught:
            await sess.run(both, options=af.RunOptions(timeout_in_ms=20))
        assert caught.value.node_name == "slow_a"
        assert caught.value.op is g.get_operation_by_name("slow_a")
        assert "still running: 'slow_a', 'slow_b'" in str(caught.value)
        assert "timeout_in_ms=20" in str(caught.value)
        # A lone async kernel is awaited in the caller's task: named too.
        with pytest.raises(af.errors.DeadlineExceededError,
                           match=r"still running: 'lone'$") as caught:
            await sess.run(lone, options=af.RunOptions(timeout_in_ms=20))
        assert caught.value.node_name == "lone"


async def test_a_deadline_names_pending_kernels_across_devices() -> None:
    async def never(v: Any) -> Any:
        await asyncio.Event().wait()
        return v

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

    with pytest.raises(RuntimeError, match=r"async with af.Session\(...\) needs the asyncio "
                                           r"event loop, but it was awaited from trio.*"
                                           r"backend='asyncio'"):
        anyio.run(main, backend="trio")

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
        (a,) = af.import_graph_def(g0.as_graph_def(), return_elements=["a:0"])
        assert a.name == "a:0"
