"""TF 1.x shortcuts users reach for: bytes strings, set_shape, eval/run; asyncio only (trio: clear error)."""

from __future__ import annotations

import asyncio

import anyio
import numpy as np
import pytest

import asyncflow as af
from asyncflow._backend import require_asyncio

# -- af.string holds bytes --------------------------------------------------------


def test_string_constants_hold_utf8_bytes() -> None:
    g = af.Graph()
    with g.as_default():
        word = af.constant("big")
        words = af.constant([["a", "bé"], [b"\xff", "c"]])
        joined = words + af.constant("!")
    with af.Session(graph=g) as sess:
        got_word, got_words, got_joined = sess.run_sync([word, words, joined])
    assert got_word == b"big"
    assert type(got_word) is bytes
    assert got_words.dtype == object
    assert got_words.tolist() == [[b"a", "bé".encode()], [b"\xff", b"c"]]
    assert got_joined.tolist() == [[b"a!", "bé!".encode()], [b"\xff!", b"c!"]]


def test_py_func_string_results_are_bytes() -> None:
    def greet(name: bytes) -> list[object]:
        return [f"hello {name.decode()}", b"raw"]

    g = af.Graph()
    with g.as_default():
        hello, raw = af.py_func(greet, [af.constant("ann")], [af.string, af.string])
        single = af.py_func(lambda: "ü", [], af.string)
    with af.Session(graph=g) as sess:
        assert sess.run_sync([hello, raw, single]) == [b"hello ann", b"raw", "ü".encode()]


def test_as_string_array() -> None:
    out = af.dtypes.as_string_array([["x", b"y"], [np.str_("z"), np.bytes_(b"w")]])
    assert out.dtype == object
    assert [type(v) for v in out.reshape(-1)] == [bytes] * 4
    assert out.tolist() == [[b"x", b"y"], [b"z", b"w"]]
    assert af.dtypes.as_string_array(np.array([b"ab", b"c"])).tolist() == [b"ab", b"c"]
    with pytest.raises(TypeError, match="a string tensor holds bytes or str, got int 3"):
        af.dtypes.as_string_array(["a", 3])
    with pytest.raises(TypeError, match="a string tensor holds bytes or str, got int 3"):
        af.constant(3, dtype=af.string)


# -- set_shape / get_shape -----------------------------------------------------------


def test_set_shape_refines_a_py_func_output() -> None:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(None, 3), name="x")
        y = af.py_func(lambda v: v * 2, [x], af.float32, name="double")
        assert y.get_shape().rank is None
        y.set_shape((None, 3))
        y.set_shape((2, None))  # merged with what was known
        assert tuple(y.get_shape()) == (2, 3)
        assert tuple(af.matmul(y, af.ones((3, 4))).shape) == (2, 4)  # consumers see it
        with pytest.raises(
            ValueError,
            match=r"cannot set the shape of tensor 'double:0' to "
            r"\(2, 4\)",
        ):
            y.set_shape((2, 4))
        assert tuple(y.shape) == (2, 3)  # a failed set_shape changes nothing
        with pytest.raises(ValueError, match="'x:0'"):
            x.set_shape((None,))


# -- eval / run shortcuts --------------------------------------------------------------


async def test_eval_and_op_run_shortcuts() -> None:
    g = af.Graph()
    with g.as_default():
        v = af.Variable(1.0, name="v")
        x = af.placeholder(af.float32, shape=(), name="x")
        y = v * x
        bump = v.assign_add(1.0).op
    async with af.Session(graph=g) as sess:
        # Checked at run time, what the annotation promises:
        assert await v.initializer.run(session=sess) is None  # type: ignore[func-returns-value]
        assert await y.eval({x: 3.0}, session=sess) == 3.0
        await bump.run(session=sess)
        assert await y.eval(feed_dict={x: 3.0}, session=sess) == 6.0
        with pytest.raises(ValueError, match=r"tensor 'mul:0'.*pass session=sess"):
            await y.eval({x: 1.0})
        with pytest.raises(af.errors.InvalidArgumentError, match="'x'"):
            await y.eval(session=sess)  # the session stays usable after
        assert await y.eval({x: 1.0}, session=sess) == 2.0


# -- asyncio only: anyio's asyncio backend works, trio gets a clear error ---------------


def _graph() -> tuple[af.Graph, af.Tensor]:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        y = x * 2.0
    return g, y


def test_anyio_asyncio_backend_works() -> None:
    g, y = _graph()

    async def main() -> list[float]:
        async with af.Session(graph=g) as sess:
            results: list[float] = []

            async def one(v: float) -> None:
                results.append(float(await y.eval({"x:0": v}, session=sess)))
                results.append(float(await sess.run(y, {"x:0": v})))

            async with anyio.create_task_group() as tg:
                for v in (1.0, 2.0):
                    tg.start_soon(one, v)
            return sorted(results)

    assert anyio.run(main, backend="asyncio") == [2.0, 2.0, 4.0, 4.0]


def test_trio_gets_a_clear_error() -> None:
    g, y = _graph()

    async def main() -> None:
        require_asyncio()

    with pytest.raises(
        RuntimeError,
        match=r"asyncflow needs the asyncio event loop, but it "
        r"was awaited from trio.*backend='asyncio'",
    ):
        anyio.run(main, backend="trio")

    with af.Session(graph=g) as sess:

        async def evaluate() -> None:
            await y.eval({"x:0": 1.0}, session=sess)

        with pytest.raises(
            RuntimeError,
            match=r"tensor 'mul:0'.eval\(\) needs the asyncio "
            r"event loop.*trio",
        ):
            anyio.run(evaluate, backend="trio")

        async def run() -> None:
            await sess.run(y, {"x:0": 1.0})

        with pytest.raises(RuntimeError, match=r"Session.run needs the asyncio event loop.*trio"):
            anyio.run(run, backend="trio")

        async def callable_() -> None:
            await sess.make_callable(y, ["x:0"])(1.0)

        with pytest.raises(RuntimeError, match=r"Session.run needs the asyncio event loop.*trio"):
            anyio.run(callable_, backend="trio")

        async def partial() -> None:
            await sess.partial_run_setup([y], ["x:0"])

        with pytest.raises(RuntimeError, match=r"partial_run_setup needs the asyncio"):
            anyio.run(partial, backend="trio")
        assert sess.run_sync(y, {"x:0": 1.0}) == 2.0  # the session is unharmed


def test_require_asyncio_outside_any_loop() -> None:
    with pytest.raises(RuntimeError, match=r"must be awaited inside an asyncio event loop"):
        require_asyncio()


async def test_require_asyncio_inside_asyncio() -> None:
    require_asyncio()
    assert asyncio.get_running_loop() is not None


async def test_string_feeds_are_bytes_as_tf(graph: af.Graph) -> None:
    s = af.placeholder(af.string, name="s")
    out = af.identity(s)
    async with af.Session(graph=graph) as sess:
        assert await sess.run(out, {s: "héllo"}) == "héllo".encode()
        got = await sess.run(out, {s: np.array(["a", "b"])})
        assert got.dtype == object
        assert list(got) == [b"a", b"b"]
        assert list(await sess.run(out, {s: [b"x", "y"]})) == [b"x", b"y"]
