"""Running one :class:`~.programs.Program` three ways, and comparing the outcomes.

- :func:`run_asyncflow` builds the program with asyncflow and runs it in a Session
  (two CPU devices, a deadline on every run so that nothing can hang);
- :func:`run_numpy` is the pure-numpy reference interpreter: it shares no code with
  asyncflow and states TF 1.x's semantics op by op (pruned, lazy evaluation per run;
  only the taken branch of a ``cond``; variables and queues carried across runs);
- :func:`run_tensorflow` builds the same program with ``tf.compat.v1`` (graph mode,
  v1 control flow) when TensorFlow is installed;
- :func:`run_reference` runs control-flow-free programs through
  :func:`asyncflow.testing.reference_run` (the kernels, sequentially) with one
  resource manager across the runs, a third opinion on the kernels themselves.

An outcome is a list with one entry per run (per call of a callable or a partial
run): ``("ok", [values])`` or ``("error", stage, error class name)`` where stage is
``"build"`` or ``"run"``; a partial run's calls after its first error are
``("error", "skipped", "NotRun")``.  Every entry of a racy run (a deadline, a caller
giving up) ends with ``"racy"``: it may be a ``DeadlineExceededError`` or
``CancelledError`` where another oracle has the values (:func:`compare`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from .programs import RACY_ERRORS, Node, Program, Run, image_pixels, image_png

if TYPE_CHECKING:
    import asyncflow as af

Outcome = list[tuple[Any, ...]]

# -- building with asyncflow or TensorFlow -------------------------------------------------


class _Api:
    """The handful of names that differ between ``asyncflow`` and ``tf.compat.v1``."""

    def __init__(
        self,
        module: Any,
        *,
        sigmoid: Any,
        mod: Any,
        where: Any,
        defun: Any,
        sleep: Callable[[Any, float, str], Any],
    ) -> None:
        self.m = module
        self.sigmoid = sigmoid
        self.mod = mod
        self.where = where
        self.defun = defun  # the Defun decorator
        self.sleep = sleep  # (x, ms, dtype) -> a py_func returning x after ms

    def fn(self, name: str) -> Any:
        if name in ("sigmoid", "mod", "where"):
            return getattr(self, name)
        if name.startswith("nn."):
            return getattr(self.m.nn, name[3:])
        return getattr(self.m, name)


def _build(program: Program, api: _Api) -> dict[int, Any]:
    m = api.m
    out: dict[int, Any] = {}
    for node in program.nodes:
        ctx = m.device(node.device) if node.device else contextlib.nullcontext()
        with ctx:
            out[node.id] = _build_node(node, [out[a] for a in node.args], api)
    return out


def _build_node(n: Node, a: list[Any], api: _Api) -> Any:
    build = _BUILDERS.get(n.kind)
    if build is None:
        raise AssertionError(f"unknown node kind {n.kind!r}")
    return build(n, a, api)


def _build_image(n: Node, api: _Api) -> Any:
    """decode_png of the node's image, its first pixels in the node's shape and dtype."""
    m, at = api.m, n.attrs
    png = m.constant(image_png(at["seed"], at["rows"], at["side"]))
    flat = m.reshape(m.image.decode_png(png, channels=1), [-1])
    return m.cast(m.reshape(flat[: int(np.prod(n.shape))], list(n.shape)), n.dtype)


def _build_cond(n: Node, a: list[Any], api: _Api) -> Any:
    m, at = api.m, n.attrs
    pred, x, y = a
    return m.cond(pred, lambda: api.fn(at["true"])(x, y), lambda: api.fn(at["false"])(x))


def _build_cond_unary(n: Node, a: list[Any], api: _Api) -> Any:
    m = api.m
    pred, x = a
    return m.cond(pred, lambda: m.logical_not(x), lambda: m.identity(x))


def _build_while(n: Node, a: list[Any], api: _Api) -> Any:
    m, at = api.m, n.attrs
    n_iter, x, y = a
    op = api.fn(at["op"])
    _, acc = m.while_loop(
        lambda i, acc: m.less(i, n_iter),
        lambda i, acc: (m.add(i, 1), op(acc, y)),
        [m.constant(0, dtype="int32"), x],
    )
    return acc


def _build_ta_loop(n: Node, a: list[Any], api: _Api) -> Any:
    """See ``_Gen.ta_loop``: the rows of ``x`` through two TensorArrays (carried as
    their flows, as ``dynamic_rnn`` carries them)."""
    m, at = api.m, n.attrs
    x, y = a
    rows, dt = n.shape[0], n.dtype
    op = api.fn(at["op"])
    row = list(n.shape[1:])
    xs = m.TensorArray(dt, size=rows, element_shape=row).unstack(x)
    out = m.TensorArray(dt, size=rows, element_shape=row)

    def body(i: Any, h: Any, flow: Any) -> Any:
        v = op(h, xs.read(i)) if at["mode"] == "scan" else op(xs.read(i), y)
        ta = m.TensorArray(dt, handle=out.handle, flow=flow).write(i, v)
        return m.add(i, 1), v if at["mode"] == "scan" else h, ta.flow

    _, _, flow = m.while_loop(
        lambda i, h, flow: m.less(i, rows),
        body,
        [m.constant(0, dtype="int32"), y, out.flow],
    )
    return m.TensorArray(dt, handle=out.handle, flow=flow).stack()


def _build_case(n: Node, a: list[Any], api: _Api) -> Any:
    m, at = api.m, n.attrs
    *preds, x = a
    pairs = [(p, (lambda f=f: api.fn(f)(x))) for p, f in zip(preds, at["fns"], strict=True)]
    default = None if at["default"] is None else (lambda: api.fn(at["default"])(x))
    return m.case(pairs, default=default, exclusive=at["exclusive"])


def _build_step_node(n: Node, a: list[Any], api: _Api) -> Any:
    """Functions, state in loops and slow kernels (the kinds of the step categories)."""
    m, at, k = api.m, n.attrs, n.kind
    shape = list(n.shape)
    if k == "defun":

        def body(x: Any) -> Any:
            y = api.fn(at["op"])(x, m.constant(at["const"], dtype=at["dtype"]))  # no input
            if not at["assert"]:
                return y
            check = m.Assert(m.constant(at["flag"]), ["function body ran"])  # no data input
            with m.control_dependencies([check]):
                return m.identity(y)

        return api.defun(m.as_dtype(at["dtype"]))(body)
    if k == "call":
        return m.reshape(a[0](a[1]), shape)
    if k == "cond_call":
        fn, pred, x = a
        called, other = (lambda: m.reshape(fn(x), shape)), (lambda: api.fn(at["other"])(x))
        return m.cond(pred, other, called) if at["swap"] else m.cond(pred, called, other)
    if k == "while_call":
        fn, n_iter, x = a
        _, acc = m.while_loop(
            lambda i, acc: m.less(i, n_iter),
            lambda i, acc: (m.add(i, 1), m.reshape(fn(acc), shape)),
            [m.constant(0, dtype="int32"), x],
        )
        return acc
    if k == "while_var":
        return _while_var(m, n, a)
    if k == "sleep":
        assert n.dtype is not None, f"sleep node n{n.id} has no dtype"
        return m.reshape(api.sleep(a[0], at["ms"], n.dtype), shape)
    raise AssertionError(f"unknown node kind {k!r}")


def _while_var(m: Any, n: Node, a: list[Any]) -> Any:
    """A loop adding the variable to an accumulator each iteration; ``assign`` adds
    ``delta`` to the variable first, ``cond`` does so in even iterations only (in a
    ``cond`` in the loop).  Each iteration's variable ops wait for the accumulator of
    the one before: the order is the program's, not the scheduler's."""
    n_iter, var, delta = a
    mode = n.attrs["mode"]

    def step(i: Any, acc: Any) -> Any:
        with m.control_dependencies([acc]):
            if mode == "read":
                return acc + var.read_value()
            if mode == "assign":
                with m.control_dependencies([var.assign_add(delta)]):
                    return acc + var.read_value()

            def bump() -> Any:
                return m.identity(var.assign_add(delta))

            def keep() -> Any:
                return m.identity(var.read_value())

            return acc + m.cond(m.equal(m.mod(i, 2), 0), bump, keep)

    _, acc = m.while_loop(
        lambda i, acc: m.less(i, n_iter),
        lambda i, acc: (m.add(i, 1), step(i, acc)),
        [m.constant(0, dtype="int32"), m.zeros(list(n.shape), n.dtype)],
    )
    return acc


#: How each node kind is built with the API under test (``api.m``: asyncflow or TF 1.x).
_BUILDERS: dict[str, Callable[[Node, list[Any], _Api], Any]] = {
    "const": lambda n, a, api: api.m.constant(n.attrs["value"], dtype=n.dtype),
    "image": lambda n, a, api: _build_image(n, api),
    "placeholder": lambda n, a, api: api.m.placeholder(n.dtype, shape=n.shape),
    "binary": lambda n, a, api: api.fn(n.attrs["op"])(a[0], a[1]),
    "compare": lambda n, a, api: api.fn(n.attrs["op"])(a[0], a[1]),
    "logical": lambda n, a, api: api.fn(n.attrs["op"])(a[0], a[1]),
    "unary": lambda n, a, api: api.fn(n.attrs["op"])(a[0]),
    "where": lambda n, a, api: api.where(a[0], a[1], a[2]),
    "reduce": lambda n, a, api: getattr(api.m, n.attrs["op"])(
        a[0], axis=n.attrs["axis"], keepdims=n.attrs["keepdims"]
    ),
    "arg": lambda n, a, api: getattr(api.m, n.attrs["op"])(a[0], axis=n.attrs["axis"]),
    "cast": lambda n, a, api: api.m.cast(a[0], n.attrs["to"]),
    "gather": lambda n, a, api: api.m.gather(
        a[0], api.m.constant(np.array(n.attrs["indices"], np.int32)), axis=n.attrs["axis"]
    ),
    "transpose": lambda n, a, api: api.m.transpose(a[0]),
    "reshape": lambda n, a, api: api.m.reshape(a[0], list(n.attrs["shape"])),
    "concat": lambda n, a, api: api.m.concat([a[0], a[1]], n.attrs["axis"]),
    "clip": lambda n, a, api: api.m.clip_by_value(a[0], n.attrs["lo"], n.attrs["hi"]),
    "add_n": lambda n, a, api: api.m.add_n(a),
    "stack": lambda n, a, api: api.m.stack(a, axis=n.attrs["axis"]),
    "one_hot": lambda n, a, api: api.m.one_hot(a[0], n.attrs["depth"]),
    "matmul": lambda n, a, api: api.m.matmul(a[0], a[1]),
    "cumsum": lambda n, a, api: api.m.cumsum(
        a[0], axis=n.attrs["axis"], exclusive=n.attrs["exclusive"], reverse=n.attrs["reverse"]
    ),
    "reverse": lambda n, a, api: api.m.reverse(a[0], [n.attrs["axis"]]),
    "tile": lambda n, a, api: api.m.tile(a[0], n.attrs["multiples"]),
    "pad": lambda n, a, api: api.m.pad(a[0], n.attrs["paddings"]),
    "slice": lambda n, a, api: a[0][n.attrs["begin"] :: n.attrs["step"]],
    "expand_squeeze": lambda n, a, api: api.m.squeeze(
        api.m.expand_dims(a[0], n.attrs["axis"]), [n.attrs["axis"]]
    ),
    "cond": _build_cond,
    "cond_unary": _build_cond_unary,
    "while": _build_while,
    "ta_loop": _build_ta_loop,
    "case": _build_case,
    "defun": _build_step_node,
    "call": _build_step_node,
    "cond_call": _build_step_node,
    "while_call": _build_step_node,
    "while_var": _build_step_node,
    "sleep": _build_step_node,
    "variable": lambda n, a, api: api.m.Variable(n.attrs["init"]),
    "var_init": lambda n, a, api: a[0].initializer,
    "assign_add": lambda n, a, api: getattr(a[0], n.kind)(a[1]),
    "assign_sub": lambda n, a, api: getattr(a[0], n.kind)(a[1]),
    "assign": lambda n, a, api: getattr(a[0], n.kind)(a[1]),
    "read": lambda n, a, api: a[0].read_value(),
    "queue": lambda n, a, api: api.m.FIFOQueue(
        n.attrs["capacity"], [n.attrs["dtype"]], shapes=[n.attrs["shape"]]
    ),
    "enqueue_many": lambda n, a, api: a[0].enqueue_many([a[1]]),
    "dequeue_many": lambda n, a, api: a[0].dequeue_many(n.attrs["n"]),
    "dequeue": lambda n, a, api: a[0].dequeue(),
    "close": lambda n, a, api: a[0].close(),
    "qsize": lambda n, a, api: a[0].size(),
}


def _error_name(exc: BaseException) -> str:
    return type(exc).__name__


class CallerCancelled(Exception):
    """asyncflow's caller gave up on a run (``Run.cancel_ms``)."""


def _values(values: Any) -> list[Any]:
    return [None if v is None else np.asarray(v) for v in values]


async def _entry(run: Run, call: Callable[[], Awaitable[Any]]) -> tuple[Any, ...]:
    """One outcome entry: the call's values or its error, marked when ``run`` is racy."""
    mark = ("racy",) if run.racy else ()
    try:
        values = await call()
    except CallerCancelled:
        return ("error", "run", "CancelledError", *mark)
    except Exception as exc:  # an OpError of either library
        return ("error", "run", _error_name(exc), *mark)
    return ("ok", _values(values), *mark)


class _Runner:
    """How a driver runs a program's runs in one library's session (coroutines, so
    asyncflow's run in its event loop; TensorFlow's block, which is fine there)."""

    async def run(self, run: Run, fetches: list[Any], feeds: dict[Any, Any]) -> Any:
        raise NotImplementedError

    async def callable(
        self, run: Run, fetches: list[Any], feed_list: list[Any], values: list[Any]
    ) -> Any:
        raise NotImplementedError

    async def partial_setup(self, fetches: list[Any], feeds: list[Any]) -> Any:
        raise NotImplementedError

    async def partial_run(self, handle: Any, fetches: list[Any], feeds: dict[Any, Any]) -> Any:
        raise NotImplementedError


async def _drive(program: Program, build: Callable[[], dict[int, Any]], runner: _Runner) -> Outcome:
    try:
        built = build()
    except (TypeError, ValueError) as exc:
        return [("error", "build", _error_name(exc))] * program.entries
    outcome: Outcome = []
    for r in program.runs:
        if r.mode == "partial":
            outcome.extend(await _drive_partial(r, built, runner))
        else:
            outcome.extend(await _drive_run(r, built, runner))
    return outcome


async def _drive_run(r: Run, built: dict[int, Any], runner: _Runner) -> Outcome:
    """A run's entry, or a callable's (one per call)."""
    fetches = [built[i] for i in r.fetches]
    if r.mode == "run":
        feeds = {built[i]: v for i, v in r.feeds.items()}
        return [await _entry(r, lambda: runner.run(r, fetches, feeds))]
    feed_list = [built[i] for i in r.feed_list]
    outcome: Outcome = []
    for _, values in r.calls:
        args = [values[i] for i in r.feed_list]
        outcome.append(
            await _entry(r, functools.partial(runner.callable, r, fetches, feed_list, args))
        )
    return outcome


async def _drive_partial(r: Run, built: dict[int, Any], runner: _Runner) -> Outcome:
    """A partial run's calls, one entry each; the calls after an error are not made."""
    handle: Any = None

    async def setup() -> list[Any]:
        nonlocal handle
        handle = await runner.partial_setup(
            [built[i] for i in r.fetches], [built[i] for i in r.feed_list]
        )
        return []

    first = await _entry(r, setup)
    outcome: Outcome = []
    for fetches, feeds in r.calls:
        if first[0] == "error":
            outcome.append(first)
            first = ("error", "skipped", "NotRun")
            continue
        entry = await _entry(
            r,
            functools.partial(
                runner.partial_run,
                handle,
                [built[i] for i in fetches],
                {built[i]: v for i, v in feeds.items()},
            ),
        )
        outcome.append(entry)
        if entry[0] == "error":
            first = ("error", "skipped", "NotRun")
    return outcome


def _run_options(af_: Any, run: Run, base: af.RunOptions | None) -> af.RunOptions | None:
    """``base`` with the run's own deadline, if it has one.  A run without one passes
    none (or ``base`` as it is): the session's default path, whose driver awaits a
    step's lone kernel in its own frame; the caller bounds its wait instead
    (:meth:`_AsyncflowRunner._caller`), so nothing hangs."""
    if not run.timeout_ms:
        return base
    options = base if base is not None else af_.RunOptions()
    return dataclasses.replace(options, timeout_in_ms=run.timeout_ms)


#: How long a caller waits for one run (a ``run_sync`` on its thread, an awaited run
#: without a deadline of its own) before the run counts as hung.
SYNC_WAIT_S = 20.0


class Hung(AssertionError):
    """A run did not finish within ``SYNC_WAIT_S``."""


class _AsyncflowRunner(_Runner):
    def __init__(self, sess: Any, run_options: af.RunOptions | None, sync: bool = False) -> None:
        import asyncflow

        self.af = asyncflow
        self.sess = sess
        self.base = run_options
        self.sync = sync
        self.callables: dict[int, Any] = {}

    async def _sync_door(self, run: Run, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args, options=...)`` (a ``run_sync``) on a worker thread, where no
        event loop runs: the synchronous door.  A run without a deadline of its own (nor
        ``run_options``) passes no options, so that the door may start the step on no
        loop at all; instead the wait for the thread is bounded (a step still waiting
        then fails this run, and the session's close cancels it)."""
        options = _run_options(self.af, run, self.base)
        work = asyncio.to_thread(call, *args, options=options)
        return await asyncio.wait_for(work, SYNC_WAIT_S)

    async def _caller(self, run: Run, step: Awaitable[Any]) -> Any:
        """``step``, given up on after ``run.cancel_ms`` (a cancelled caller), or after
        ``SYNC_WAIT_S`` (a hung run: the test fails)."""
        if not run.cancel_ms:
            try:
                async with asyncio.timeout(SYNC_WAIT_S):
                    return await step
            except TimeoutError as exc:
                if isinstance(exc, self.af.errors.OpError):  # the step's own deadline
                    raise
                raise Hung(f"a run did not finish in {SYNC_WAIT_S} s") from None
        try:
            async with asyncio.timeout(run.cancel_ms / 1000):
                return await step
        except TimeoutError as exc:
            if isinstance(exc, self.af.errors.OpError):  # the step's own deadline
                raise
            raise CallerCancelled from None

    async def run(self, run: Run, fetches: list[Any], feeds: dict[Any, Any]) -> Any:
        if self.sync and not run.cancel_ms:  # (a caller giving up needs the async form)
            return await self._sync_door(run, self.sess.run_sync, fetches, feeds)
        options = _run_options(self.af, run, self.base)
        return await self._caller(run, self.sess.run(fetches, feed_dict=feeds, options=options))

    async def callable(
        self, run: Run, fetches: list[Any], feed_list: list[Any], values: list[Any]
    ) -> Any:
        fn = self.callables.get(id(run))
        if fn is None:
            fn = self.callables[id(run)] = self.sess.make_callable(
                fetches, feed_list=feed_list, accept_options=True
            )
        if self.sync and not run.cancel_ms:
            return await self._sync_door(run, fn.run_sync, *values)
        options = _run_options(self.af, run, self.base)
        return await self._caller(run, fn(*values, options=options))

    async def partial_setup(self, fetches: list[Any], feeds: list[Any]) -> Any:
        return await self.sess.partial_run_setup(fetches, feeds=feeds)

    async def partial_run(self, handle: Any, fetches: list[Any], feeds: dict[Any, Any]) -> Any:
        return await asyncio.wait_for(self.sess.partial_run(handle, fetches, feeds), 20)


def asyncflow_api() -> _Api:
    import asyncflow as af

    def sleep(x: Any, ms: float, dtype: str) -> Any:
        async def slow(v: Any) -> Any:
            await asyncio.sleep(ms / 1000)
            return v

        return af.py_func(slow, [x], af.as_dtype(dtype))

    return _Api(af, sigmoid=af.nn.sigmoid, mod=af.mod, where=af.where, defun=af.Defun, sleep=sleep)


def run_asyncflow(
    program: Program,
    *,
    config: af.SessionConfig | None = None,
    run_options: af.RunOptions | None = None,
    sync: bool = False,
) -> Outcome:
    """``program`` in an asyncflow session: ``config`` (default: two CPUs; programs
    place ops on ``/cpu:1``, so a given config needs two CPU devices too) and
    ``run_options`` (default: none) for every run and callable call (partial runs take
    no run options); each run's deadline is the program's, else ``run_options``'s,
    else none: the caller's wait is bounded instead (``SYNC_WAIT_S``), so that nothing
    hangs.  ``sync``: runs and callable calls go through the synchronous door
    (``run_sync``, on a worker thread; a run whose caller gives up keeps the async
    form), the wait for the thread bounded the same way."""
    import asyncflow as af

    api = asyncflow_api()
    graph = af.Graph()
    config = config if config is not None else af.SessionConfig(device_count={"CPU": 2})

    def build() -> dict[int, Any]:
        with graph.as_default():
            return _build(program, api)

    async def main() -> Outcome:
        async with af.Session(graph=graph, config=config) as sess:
            return await _drive(program, build, _AsyncflowRunner(sess, run_options, sync))

    return asyncio.run(main())


class _TensorflowRunner(_Runner):
    def __init__(self, tf1: Any, sess: Any) -> None:
        self.tf1 = tf1
        self.sess = sess
        self.callables: dict[int, Any] = {}

    def _options(self, run: Run) -> Any:
        return self.tf1.RunOptions(timeout_in_ms=run.timeout_ms or 20_000)

    async def run(self, run: Run, fetches: list[Any], feeds: dict[Any, Any]) -> Any:
        return self.sess.run(fetches, feed_dict=feeds, options=self._options(run))

    async def callable(
        self, run: Run, fetches: list[Any], feed_list: list[Any], values: list[Any]
    ) -> Any:
        fn = self.callables.get(id(run))
        if fn is None:
            fn = self.callables[id(run)] = self.sess.make_callable(
                fetches, feed_list=feed_list, accept_options=True
            )
        return fn(*values, options=self._options(run))

    async def partial_setup(self, fetches: list[Any], feeds: list[Any]) -> Any:
        return self.sess.partial_run_setup(fetches, feeds)

    async def partial_run(self, handle: Any, fetches: list[Any], feeds: dict[Any, Any]) -> Any:
        return self.sess.partial_run(handle, fetches, feed_dict=feeds)


def run_tensorflow(program: Program) -> Outcome:
    import tensorflow as tf
    from tensorflow.python.framework import function as tf_function

    tf1 = tf.compat.v1
    tf1.disable_v2_behavior()  # graph mode, v1 control flow, ref variables

    def sleep(x: Any, ms: float, dtype: str) -> Any:
        def slow(v: Any) -> Any:
            time.sleep(ms / 1000)
            return np.asarray(v, dtype)

        return tf1.py_func(slow, [x], tf1.as_dtype(dtype))

    api = _Api(
        tf1,
        sigmoid=tf1.sigmoid,
        mod=tf1.math.floormod,
        where=_tf_where(tf1),
        defun=tf_function.Defun,
        sleep=sleep,
    )
    graph = tf1.Graph()
    config = tf1.ConfigProto(
        device_count={"CPU": 2}, inter_op_parallelism_threads=2, intra_op_parallelism_threads=1
    )

    def build() -> dict[int, Any]:
        with graph.as_default():
            return _build(program, api)

    with tf1.Session(graph=graph, config=config) as sess:
        return asyncio.run(_drive(program, build, _TensorflowRunner(tf1, sess)))


def _tf_where(tf1: Any) -> Callable[[Any, Any, Any], Any]:
    """TF 1.x's ``tf.where`` (Select) where it accepts the operands (same shapes; a
    scalar or vector condition), else ``tf.where_v2`` (broadcasting, TF >= 1.14)."""

    def where(cond: Any, x: Any, y: Any) -> Any:
        if x.shape == y.shape and (cond.shape == x.shape or cond.shape.rank in (0, 1)):
            return tf1.where(cond, x, y)
        return tf1.where_v2(cond, x, y)

    return where


def run_reference(program: Program) -> Outcome | None:
    """Through ``asyncflow.testing.reference_run``; None for programs with control flow."""
    import asyncflow as af
    from asyncflow.runtime.resources import ResourceMgr
    from asyncflow.testing import reference_run

    if any(n.kind in _NOT_REFERENCE for n in program.nodes) or any(
        r.mode != "run" or r.racy for r in program.runs
    ):
        return None
    api = asyncflow_api()
    graph = af.Graph()
    resources = ResourceMgr()

    def build() -> dict[int, Any]:
        with graph.as_default():
            return _build(program, api)

    class Runner(_Runner):
        async def run(self, run: Run, fetches: list[Any], feeds: dict[Any, Any]) -> Any:
            return reference_run(fetches, feeds, graph=graph, resources=resources)

    return asyncio.run(_drive(program, build, Runner()))


#: What ``reference_run`` does not take: control flow, functions, async kernels.
_NOT_REFERENCE = frozenset(
    {
        "cond",
        "cond_unary",
        "while",
        "ta_loop",
        "case",
        "defun",
        "call",
        "cond_call",
        "while_call",
        "while_var",
        "sleep",
    }
)


# -- the numpy reference interpreter ---------------------------------------------------------


class NpError(Exception):
    """A step failure of the reference interpreter; ``code`` is the TF error class name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _invalid(message: str) -> NpError:
    return NpError("InvalidArgumentError", message)


def _check_divisor(y: np.ndarray) -> None:
    if y.dtype.kind in "iu" and not np.all(y):
        raise _invalid("Integer division by zero")


def _floordiv(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    _check_divisor(y)
    out: np.ndarray = np.floor_divide(x, y) if x.dtype.kind in "iu" else np.floor(x / y)
    return out


def _mod(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    _check_divisor(y)
    out: np.ndarray = np.remainder(x, y)
    return out


def _divide(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if x.dtype.kind in "iu":  # TF's truediv of int32/int64 is float64
        return x.astype(np.float64) / y.astype(np.float64)
    out: np.ndarray = x / y
    return out


def _sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))
    out: np.ndarray = np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype)
    return out


def _truncatediv(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    _check_divisor(y)
    q = np.abs(x) // np.abs(y)
    out: np.ndarray = np.where((x < 0) != (y < 0), -q, q).astype(x.dtype)
    return out


def _truncatemod(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    _check_divisor(y)
    out: np.ndarray = np.fmod(x, y)
    return out


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    out: np.ndarray = e / np.sum(e, axis=-1, keepdims=True)
    return out


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - np.max(x, axis=-1, keepdims=True)
    out: np.ndarray = shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))
    return out


def _selu(x: np.ndarray) -> np.ndarray:
    alpha, scale = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
    return (scale * np.where(x > 0, x, alpha * np.expm1(x))).astype(x.dtype)


NP_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "floordiv": _floordiv,
    "mod": _mod,
    "divide": _divide,
    "pow": np.power,
    "less": np.less,
    "less_equal": np.less_equal,
    "greater": np.greater,
    "greater_equal": np.greater_equal,
    "equal": np.equal,
    "not_equal": np.not_equal,
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
    "squared_difference": lambda x, y: np.square(x - y),
    "truncatediv": _truncatediv,
    "truncatemod": _truncatemod,
}
NP_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "negative": np.negative,
    "abs": np.abs,
    "square": np.square,
    "sqrt": np.sqrt,
    "exp": np.exp,
    "log": np.log,
    "tanh": np.tanh,
    "sigmoid": _sigmoid,
    "logical_not": np.logical_not,
    "identity": lambda x: x,
    "sign": np.sign,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": np.round,
    "reciprocal": lambda x: 1 / x,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "sin": np.sin,
    "cos": np.cos,
    "log1p": np.log1p,
    "expm1": np.expm1,
    "is_nan": np.isnan,
    "is_finite": np.isfinite,
    "nn.relu": lambda x: np.maximum(x, np.zeros((), x.dtype)),
    "nn.relu6": lambda x: np.minimum(np.maximum(x, np.zeros((), x.dtype)), np.asarray(6, x.dtype)),
    "nn.elu": lambda x: np.where(x > 0, x, np.expm1(x)),
    "nn.selu": _selu,
    "nn.softplus": lambda x: (np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0)).astype(x.dtype),
    "nn.leaky_relu": lambda x: np.where(x > 0, x, x * np.asarray(0.2, x.dtype)),
    "zeros_like": np.zeros_like,
    "ones_like": np.ones_like,
    "nn.softmax": _softmax,
    "nn.log_softmax": _log_softmax,
}


def _reduce(op: str, x: np.ndarray, axis: int | None, keep: bool) -> np.ndarray:
    out: np.ndarray
    if op == "reduce_sum":
        out = np.sum(x, axis=axis, keepdims=keep, dtype=x.dtype)
        return out
    if op == "reduce_prod":
        out = np.prod(x, axis=axis, keepdims=keep, dtype=x.dtype)
        return out
    if op in ("reduce_any", "reduce_all"):
        return np.asarray((np.any if op == "reduce_any" else np.all)(x, axis=axis, keepdims=keep))
    if op in ("reduce_max", "reduce_min"):
        lowest = op == "reduce_max"
        if x.dtype.kind == "f":
            identity: Any = -np.inf if lowest else np.inf
        else:
            identity = np.iinfo(x.dtype).min if lowest else np.iinfo(x.dtype).max
        fn = np.max if lowest else np.min
        return np.asarray(fn(x, axis=axis, keepdims=keep, initial=identity))
    # reduce_mean: integers accumulate wide and truncate toward zero; empty -> 0 / nan.
    total = np.sum(
        x, axis=axis, keepdims=keep, dtype=np.float64 if x.dtype.kind == "f" else np.int64
    )
    count = x.size // max(total.size, 1) if x.size else 0
    if x.dtype.kind == "f":
        if count == 0:
            return np.full(np.shape(total), np.nan, x.dtype)
        return np.asarray(np.mean(x, axis=axis, keepdims=keep, dtype=x.dtype))
    if count == 0:
        return np.zeros(np.shape(total), x.dtype)
    q = np.abs(total) // count
    return np.where(total < 0, -q, q).astype(x.dtype)


def _arg(op: str, x: np.ndarray, axis: int) -> np.ndarray:
    if x.shape[axis] == 0:
        raise _invalid(f"Reduction axis {axis} is empty")
    if x.dtype.kind == "f":  # NaNs never win; an all-NaN slice gives 0
        x = np.where(np.isnan(x), -np.inf if op == "argmax" else np.inf, x)
    fn = np.argmax if op == "argmax" else np.argmin
    return np.asarray(fn(x, axis=axis)).astype(np.int64)


class _Queue:
    def __init__(self, dtype: str, shape: tuple[int, ...]) -> None:
        self.items: deque[np.ndarray] = deque()
        self.closed = False
        self.dtype = dtype
        self.shape = shape

    def take(self, n: int) -> list[np.ndarray]:
        if len(self.items) < n:
            if self.closed:
                raise NpError("OutOfRangeError", "queue closed with too few elements")
            raise AssertionError("generator error: a dequeue that would block forever")
        return [self.items.popleft() for _ in range(n)]


#: Node kinds by how the numpy interpreter evaluates them.
_ELEMENTWISE = frozenset(
    {"const", "image", "placeholder", "binary", "compare", "logical", "unary", "where", "cast"}
)
_SHAPED = frozenset({"reduce", "arg", "gather", "transpose", "reshape", "concat"})
_STRUCTURAL = frozenset(
    {
        "clip",
        "add_n",
        "stack",
        "one_hot",
        "matmul",
        "cumsum",
        "reverse",
        "tile",
        "pad",
        "slice",
        "expand_squeeze",
    }
)


def _shaped(n: Node, a: list[np.ndarray]) -> Any:
    k, at, x = n.kind, n.attrs, a[0]
    if k == "reduce":
        return _reduce(at["op"], x, at["axis"], at["keepdims"])
    if k == "arg":
        return _arg(at["op"], x, at["axis"])
    if k == "gather":
        limit = x.shape[at["axis"]]
        for i, index in enumerate(at["indices"]):
            if not 0 <= index < limit:
                raise _invalid(f"indices[{i}] = {index} is not in [0, {limit})")
        return np.take(x, at["indices"], axis=at["axis"])
    if k == "transpose":
        return np.transpose(x)
    if k == "reshape":
        return np.reshape(x, at["shape"])
    return np.concatenate([x, a[1]], axis=at["axis"])  # concat


def _control(n: Node, args: list[Any]) -> Any:
    """cond, cond_unary and while, their operands computed."""
    k, at = n.kind, n.attrs
    if k == "cond":
        if args[0]:
            return np.asarray(NP_BINARY[at["true"]](args[1], args[2]))
        return np.asarray(NP_UNARY[at["false"]](args[1]))
    if k == "cond_unary":
        return np.logical_not(args[1]) if args[0] else args[1]
    if k == "ta_loop":
        x, h = args
        out = []
        for row in x:
            v = NP_BINARY[at["op"]](h, row) if at["mode"] == "scan" else NP_BINARY[at["op"]](row, h)
            out.append(np.asarray(v).astype(x.dtype))
            h = out[-1] if at["mode"] == "scan" else h
        return np.stack(out)
    acc = args[1]
    for _ in range(int(args[0])):
        acc = np.asarray(NP_BINARY[at["op"]](acc, args[2])).astype(acc.dtype)
    return acc


def _cumsum(x: np.ndarray, at: dict[str, Any]) -> np.ndarray:
    axis = at["axis"]
    y = np.flip(x, axis) if at["reverse"] else x
    c = np.cumsum(y, axis=axis, dtype=x.dtype)
    if at["exclusive"] and c.shape[axis]:
        c = np.concatenate(
            [np.zeros_like(np.take(c, [0], axis=axis)), np.delete(c, -1, axis=axis)], axis=axis
        )
    return np.flip(c, axis) if at["reverse"] else c


class _NumpyInterpreter:
    def __init__(self, program: Program) -> None:
        self.nodes = program.nodes
        self.variables: dict[int, np.ndarray] = {}
        self.queues: dict[int, _Queue] = {}

    def run(
        self, fetches: list[int], feeds: dict[int, np.ndarray], memo: dict[int, Any] | None = None
    ) -> list[Any]:
        """The values of ``fetches``; ``memo`` is shared by the calls of one step."""
        memo = {} if memo is None else memo

        def value(nid: int) -> Any:
            if nid not in memo:
                memo[nid] = self.eval(self.nodes[nid], value, feeds)
            return memo[nid]

        return [value(i) for i in fetches]

    def eval(self, n: Node, v: Callable[[int], Any], feeds: dict[int, np.ndarray]) -> Any:
        k = n.kind
        if k in _ELEMENTWISE:
            return self.elementwise(n, v, feeds)
        if k in _SHAPED:
            return _shaped(n, [v(i) for i in n.args])
        if k in _STRUCTURAL:
            return self.structural(n, [v(i) for i in n.args])
        if k in ("cond", "cond_unary", "while", "ta_loop"):
            # The operands are made outside the branch / loop, so they are computed
            # whichever branch is taken and however many iterations run (as TF).
            return _control(n, [v(i) for i in n.args])
        if k == "case":
            return self.case(n, v)
        if k in ("defun", "call", "cond_call", "while_call", "sleep"):
            return self.function(n, v)
        if k == "while_var":
            return self.while_var(n, v)
        return self.stateful(n, v)

    def elementwise(self, n: Node, v: Callable[[int], Any], feeds: dict[int, np.ndarray]) -> Any:
        k, at = n.kind, n.attrs
        if k == "const":
            return np.asarray(at["value"], n.dtype)
        if k == "image":
            flat = image_pixels(at).reshape(-1)[: int(np.prod(n.shape))]
            return flat.reshape(n.shape).astype(n.dtype)
        if k == "placeholder":
            return np.asarray(feeds[n.id], n.dtype)
        if k in ("binary", "compare", "logical"):
            return np.asarray(NP_BINARY[at["op"]](v(n.args[0]), v(n.args[1])))
        if k == "unary":
            return np.asarray(NP_UNARY[at["op"]](v(n.args[0])))
        if k == "where":
            return np.where(v(n.args[0]), v(n.args[1]), v(n.args[2]))
        return v(n.args[0]).astype(at["to"])  # cast

    def function(self, n: Node, v: Callable[[int], Any]) -> Any:
        """A ``Defun``'s body runs exactly when it is called: in the taken branch, in an
        iteration that runs."""
        k = n.kind
        if k == "defun":
            return n.id
        if k == "sleep":
            return v(n.args[0])
        at = self.nodes[n.args[0]].attrs

        def call(x: np.ndarray) -> np.ndarray:
            if at["assert"] and not at["flag"]:
                raise _invalid("assertion failed: [function body ran]")
            c = np.asarray(at["const"], at["dtype"])
            return np.asarray(NP_BINARY[at["op"]](x, c)).astype(at["dtype"])

        if k == "call":
            return call(v(n.args[1]))
        if k == "cond_call":
            pred, x = bool(v(n.args[1])), v(n.args[2])
            if pred != n.attrs["swap"]:
                return call(x)
            return np.asarray(NP_UNARY[n.attrs["other"]](x))
        times, acc = int(v(n.args[1])), v(n.args[2])
        for _ in range(times):
            acc = call(acc)
        return acc

    def while_var(self, n: Node, v: Callable[[int], Any]) -> Any:
        """See ``_while_var``: the accumulator adds the variable each iteration."""
        times, var = int(v(n.args[0])), n.args[1]
        if var not in self.variables:
            raise NpError("FailedPreconditionError", "uninitialized variable")
        delta = v(n.args[2])  # made outside the loop: computed however many iterations run
        acc = np.zeros(n.shape, n.dtype)
        for i in range(times):
            old = self.variables[var]
            if n.attrs["mode"] == "assign" or (n.attrs["mode"] == "cond" and i % 2 == 0):
                self.variables[var] = np.asarray(old + delta, old.dtype)
            acc = np.asarray(acc + self.variables[var], n.dtype)
        return acc

    def structural(self, n: Node, a: list[np.ndarray]) -> Any:
        k, at = n.kind, n.attrs
        x = a[0]
        if k == "clip":
            return np.minimum(
                np.maximum(x, np.asarray(at["lo"], x.dtype)), np.asarray(at["hi"], x.dtype)
            )
        if k == "add_n":
            total = a[0]
            for y in a[1:]:
                total = total + y
            return total
        if k == "stack":
            return np.stack(a, axis=at["axis"])
        if k == "one_hot":
            depth = at["depth"]
            return (x[..., None] == np.arange(depth)).astype(np.float32)
        if k == "matmul":
            return np.matmul(x, a[1])
        if k == "cumsum":
            return _cumsum(x, at)
        if k == "reverse":
            return np.flip(x, at["axis"])
        if k == "tile":
            return np.tile(x, at["multiples"]) if at["multiples"] else x
        if k == "pad":
            return np.pad(x, at["paddings"])
        if k == "slice":
            return x[at["begin"] :: at["step"]]
        return x  # expand_squeeze

    def case(self, n: Node, v: Callable[[int], Any]) -> Any:
        at = n.attrs
        *preds, x = n.args
        truth = [bool(v(p)) for p in preds]
        value = v(x)  # made outside the branches: computed whatever is taken
        if at["exclusive"] and sum(truth) > 1:
            raise _invalid("more than one predicate is true with exclusive=True")
        for t, f in zip(truth, at["fns"], strict=True):
            if t:
                return NP_UNARY[f](value)
        if at["default"] is None:  # TF: the last fn, asserting its predicate
            raise _invalid("None of conditions evaluated as True")
        return NP_UNARY[at["default"]](value)

    def variable_op(self, n: Node, v: Callable[[int], Any]) -> Any:
        k, var = n.kind, n.args[0]
        if var not in self.variables:
            raise NpError("FailedPreconditionError", "uninitialized variable")
        if k != "read":
            delta = v(n.args[1])
            old = self.variables[var]
            new = old + delta if k == "assign_add" else old - delta if k == "assign_sub" else delta
            self.variables[var] = np.asarray(new, old.dtype)
        return self.variables[var].copy()

    def stateful(self, n: Node, v: Callable[[int], Any]) -> Any:
        k, at = n.kind, n.attrs
        if k == "variable":
            return n.id
        if k == "var_init":
            self.variables[n.args[0]] = np.array(self.nodes[n.args[0]].attrs["init"])
            return None
        if k in ("assign_add", "assign_sub", "assign", "read"):
            return self.variable_op(n, v)
        if k == "queue":
            self.queues.setdefault(n.id, _Queue(at["dtype"], at["shape"]))
            return n.id
        q = self.queues.setdefault(
            n.args[0],
            _Queue(self.nodes[n.args[0]].attrs["dtype"], self.nodes[n.args[0]].attrs["shape"]),
        )
        if k == "enqueue_many":
            if q.closed:
                raise NpError("CancelledError", "queue is closed")
            q.items.extend(np.asarray(v(n.args[1]), q.dtype))
            return None
        if k == "dequeue_many":
            taken = q.take(at["n"])
            return np.stack(taken) if taken else np.empty((0, *q.shape), q.dtype)
        if k == "dequeue":
            return q.take(1)[0]
        if k == "close":
            if q.closed:
                raise NpError("CancelledError", "queue is already closed")
            q.closed = True
            return None
        if k == "qsize":
            return np.int32(len(q.items))
        raise AssertionError(f"unknown node kind {k!r}")


def run_numpy(program: Program) -> Outcome:
    interp = _NumpyInterpreter(program)
    outcome: Outcome = []
    with np.errstate(all="ignore"):
        for r in program.runs:
            if r.mode == "partial":
                outcome.extend(_numpy_partial(interp, r))
                continue
            calls = (
                [(r.fetches, r.feeds)] if r.mode == "run" else [(r.fetches, f) for _, f in r.calls]
            )
            mark = ("racy",) if r.racy else ()
            for fetches, feeds in calls:
                try:
                    values = interp.run(fetches, feeds)
                except NpError as exc:
                    outcome.append(("error", "run", exc.code, *mark))
                else:
                    outcome.append(("ok", _values(values), *mark))
    return outcome


def _numpy_partial(interp: _NumpyInterpreter, r: Run) -> Outcome:
    """One step over several calls: a fetch needing a declared feed that is not fed
    yet is an ``InvalidArgumentError`` (TF's CheckFetch); the calls after an error
    are not made."""
    memo: dict[int, Any] = {}
    fed: dict[int, np.ndarray] = {}
    outcome: Outcome = []
    for fetches, feeds in r.calls:
        if outcome and outcome[-1][0] == "error":
            outcome.append(("error", "skipped", "NotRun"))
            continue
        fed.update(feeds)
        if _reads(interp.nodes, fetches) & (set(r.feed_list) - set(fed)):
            outcome.append(("error", "run", "InvalidArgumentError"))
            continue
        try:
            outcome.append(("ok", _values(interp.run(fetches, fed, memo))))
        except NpError as exc:
            outcome.append(("error", "run", exc.code))
    return outcome


def _reads(nodes: list[Node], fetches: list[int]) -> set[int]:
    """Every node ``fetches`` depend on."""
    seen: set[int] = set()
    stack = list(fetches)
    while stack:
        nid = stack.pop()
        if nid not in seen:
            seen.add(nid)
            stack.extend(nodes[nid].args)
    return seen


# -- comparing outcomes -------------------------------------------------------------------------

# (float rtol, float atol) per dtype for each oracle: the numpy interpreter computes
# with the same numpy routines; TF's Eigen kernels (exp, tanh, sums in another order)
# round differently in the last bits.
TOLERANCE = {
    "exact": {"float32": (1e-5, 1e-6), "float64": (1e-9, 1e-12)},
    "tf": {"float32": (2e-4, 1e-5), "float64": (1e-7, 1e-12)},
}


def _same_value(a: Any, b: Any, tol: dict[str, tuple[float, float]]) -> str | None:
    if a is None or b is None:
        return None if a is None and b is None else "one side returned no value"
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype:
        return f"dtype {a.dtype} != {b.dtype}"
    if a.shape != b.shape:
        return f"shape {a.shape} != {b.shape}"
    if a.dtype.kind == "f":
        rtol, atol = tol[a.dtype.name]
        if not np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
            return f"values differ: {a.tolist()} != {b.tolist()}"
        return None
    if not np.array_equal(a, b):
        return f"values differ: {a.tolist()} != {b.tolist()}"
    return None


def compare(ours: Outcome, theirs: Outcome, tolerance: str = "exact") -> str | None:
    """None when the outcomes agree, else a sentence saying where they first differ.

    Errors agree when both sides fail the same run with the same error class, or both
    fail while building (TypeError and ValueError alike).  In a racy run (entries
    marked ``"racy"``) a ``DeadlineExceededError`` or ``CancelledError`` on either side
    agrees with anything; every other outcome is compared as usual.
    """
    tol = TOLERANCE[tolerance]
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if a[-1] == "racy" and (
            (a[0] == "error" and a[2] in RACY_ERRORS) or (b[0] == "error" and b[2] in RACY_ERRORS)
        ):
            continue  # the deadline or the caller came first
        if a[0] == "error" or b[0] == "error":
            if a[0] != b[0]:
                return (
                    f"run {i}: {a[:3] if a[0] == 'error' else 'ok'} vs "
                    f"{b[:3] if b[0] == 'error' else 'ok'}"
                )
            if a[1] == "build" and b[1] == "build":
                continue
            if a[1:] != b[1:]:
                return f"run {i}: error {a[1:]} vs {b[1:]}"
            continue
        for j, (x, y) in enumerate(zip(a[1], b[1], strict=True)):
            why = _same_value(x, y, tol)
            if why is not None:
                return f"run {i} fetch {j}: {why}"
    return None


@contextlib.contextmanager
def quiet_tensorflow() -> Iterator[None]:
    """Silence TensorFlow's C++ and Python logging while importing it."""
    import logging
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    yield
