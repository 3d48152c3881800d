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

An outcome is a list with one entry per run: ``("ok", [values])`` or
``("error", stage, error class name)`` where stage is ``"build"`` or ``"run"``.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from .programs import Node, Program

if TYPE_CHECKING:
    import asyncflow as af

Outcome = list[tuple[Any, ...]]

# -- building with asyncflow or TensorFlow -------------------------------------------------


class _Api:
    """The handful of names that differ between ``asyncflow`` and ``tf.compat.v1``."""

    def __init__(self, module: Any, *, sigmoid: Any, mod: Any, where: Any) -> None:
        self.m = module
        self.sigmoid = sigmoid
        self.mod = mod
        self.where = where

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
    m, at = api.m, n.attrs
    k = n.kind
    if k == "const":
        return m.constant(at["value"], dtype=n.dtype)
    if k == "placeholder":
        return m.placeholder(n.dtype, shape=n.shape)
    if k in ("binary", "compare", "logical"):
        return api.fn(at["op"])(a[0], a[1])
    if k == "unary":
        return api.fn(at["op"])(a[0])
    if k == "where":
        return api.where(a[0], a[1], a[2])
    if k == "reduce":
        return getattr(m, at["op"])(a[0], axis=at["axis"], keepdims=at["keepdims"])
    if k == "arg":
        return getattr(m, at["op"])(a[0], axis=at["axis"])
    if k == "cast":
        return m.cast(a[0], at["to"])
    if k == "gather":
        return m.gather(a[0], m.constant(np.array(at["indices"], np.int32)), axis=at["axis"])
    if k == "transpose":
        return m.transpose(a[0])
    if k == "reshape":
        return m.reshape(a[0], list(at["shape"]))
    if k == "concat":
        return m.concat([a[0], a[1]], at["axis"])
    if k == "clip":
        return m.clip_by_value(a[0], at["lo"], at["hi"])
    if k == "add_n":
        return m.add_n(a)
    if k == "stack":
        return m.stack(a, axis=at["axis"])
    if k == "one_hot":
        return m.one_hot(a[0], at["depth"])
    if k == "matmul":
        return m.matmul(a[0], a[1])
    if k == "cumsum":
        return m.cumsum(a[0], axis=at["axis"], exclusive=at["exclusive"],
                        reverse=at["reverse"])
    if k == "reverse":
        return m.reverse(a[0], [at["axis"]])
    if k == "tile":
        return m.tile(a[0], at["multiples"])
    if k == "pad":
        return m.pad(a[0], at["paddings"])
    if k == "slice":
        return a[0][at["begin"]::at["step"]]
    if k == "expand_squeeze":
        return m.squeeze(m.expand_dims(a[0], at["axis"]), [at["axis"]])
    if k == "cond":
        pred, x, y = a
        return m.cond(pred, lambda: api.fn(at["true"])(x, y), lambda: api.fn(at["false"])(x))
    if k == "cond_unary":
        pred, x = a
        return m.cond(pred, lambda: m.logical_not(x), lambda: m.identity(x))
    if k == "while":
        n_iter, x, y = a
        op = api.fn(at["op"])
        _, acc = m.while_loop(lambda i, acc: m.less(i, n_iter),
                              lambda i, acc: (m.add(i, 1), op(acc, y)),
                              [m.constant(0, dtype="int32"), x])
        return acc
    if k == "case":
        *preds, x = a
        pairs = [(p, (lambda f=f: api.fn(f)(x))) for p, f in zip(preds, at["fns"], strict=True)]
        default = None if at["default"] is None else (lambda: api.fn(at["default"])(x))
        return m.case(pairs, default=default, exclusive=at["exclusive"])
    if k == "variable":
        return m.Variable(at["init"])
    if k == "var_init":
        return a[0].initializer
    if k in ("assign_add", "assign_sub", "assign"):
        return getattr(a[0], k)(a[1])
    if k == "read":
        return a[0].read_value()
    if k == "queue":
        return m.FIFOQueue(at["capacity"], [at["dtype"]], shapes=[at["shape"]])
    if k == "enqueue_many":
        return a[0].enqueue_many([a[1]])
    if k == "dequeue_many":
        return a[0].dequeue_many(at["n"])
    if k == "dequeue":
        return a[0].dequeue()
    if k == "close":
        return a[0].close()
    if k == "qsize":
        return a[0].size()
    raise AssertionError(f"unknown node kind {k!r}")


def _error_name(exc: BaseException) -> str:
    return type(exc).__name__


def _drive(program: Program, build: Callable[[], dict[int, Any]],
           run: Callable[[list[Any], dict[Any, Any]], list[Any]]) -> Outcome:
    try:
        built = build()
    except (TypeError, ValueError) as exc:
        return [("error", "build", _error_name(exc))] * len(program.runs)
    outcome: Outcome = []
    for r in program.runs:
        fetches = [built[i] for i in r.fetches]
        feeds = {built[i]: v for i, v in r.feeds.items()}
        try:
            values = run(fetches, feeds)
        except Exception as exc:  # an OpError of either library
            outcome.append(("error", "run", _error_name(exc)))
        else:
            outcome.append(("ok", [None if v is None else np.asarray(v) for v in values]))
    return outcome


def run_asyncflow(program: Program, config: af.SessionConfig | None = None,
                  run_options: af.RunOptions | None = None) -> Outcome:
    import asyncflow as af

    api = _Api(af, sigmoid=af.nn.sigmoid, mod=af.mod, where=af.where)
    graph = af.Graph()
    if config is None:
        config = af.SessionConfig(device_count={"CPU": 2})
    options = run_options if run_options is not None else af.RunOptions(timeout_in_ms=20_000)

    def build() -> dict[int, Any]:
        with graph.as_default():
            return _build(program, api)

    with af.Session(graph=graph, config=config) as sess:
        return _drive(program, build,
                      lambda f, d: sess.run_sync(f, feed_dict=d, options=options))


def run_tensorflow(program: Program) -> Outcome:
    import tensorflow as tf

    tf1 = tf.compat.v1
    tf1.disable_v2_behavior()  # graph mode, v1 control flow, ref variables
    api = _Api(tf1, sigmoid=tf1.sigmoid, mod=tf1.math.floormod, where=_tf_where(tf1))
    graph = tf1.Graph()
    config = tf1.ConfigProto(device_count={"CPU": 2}, inter_op_parallelism_threads=2,
                             intra_op_parallelism_threads=1)
    options = tf1.RunOptions(timeout_in_ms=20_000)

    def build() -> dict[int, Any]:
        with graph.as_default():
            return _build(program, api)

    with tf1.Session(graph=graph, config=config) as sess:
        return _drive(program, build,
                      lambda f, d: sess.run(f, feed_dict=d, options=options))


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

    if any(n.kind in ("cond", "cond_unary", "while", "case") for n in program.nodes):
        return None
    api = _Api(af, sigmoid=af.nn.sigmoid, mod=af.mod, where=af.where)
    graph = af.Graph()
    resources = ResourceMgr()

    def build() -> dict[int, Any]:
        with graph.as_default():
            return _build(program, api)

    def run(fetches: list[Any], feeds: dict[Any, Any]) -> list[Any]:
        return reference_run(fetches, feeds, graph=graph, resources=resources)

    return _drive(program, build, run)


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
    return np.floor_divide(x, y) if x.dtype.kind in "iu" else np.floor(x / y)


def _mod(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    _check_divisor(y)
    return np.remainder(x, y)


def _divide(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if x.dtype.kind in "iu":  # TF's truediv of int32/int64 is float64
        return x.astype(np.float64) / y.astype(np.float64)
    return x / y


def _sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype)


def _truncatediv(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    _check_divisor(y)
    q = np.abs(x) // np.abs(y)
    return np.where((x < 0) != (y < 0), -q, q).astype(x.dtype)


def _truncatemod(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    _check_divisor(y)
    return np.fmod(x, y)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - np.max(x, axis=-1, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def _selu(x: np.ndarray) -> np.ndarray:
    alpha, scale = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
    return (scale * np.where(x > 0, x, alpha * np.expm1(x))).astype(x.dtype)


NP_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "maximum": np.maximum,
    "minimum": np.minimum, "floordiv": _floordiv, "mod": _mod, "divide": _divide,
    "pow": np.power, "less": np.less, "less_equal": np.less_equal, "greater": np.greater,
    "greater_equal": np.greater_equal, "equal": np.equal, "not_equal": np.not_equal,
    "logical_and": np.logical_and, "logical_or": np.logical_or,
    "squared_difference": lambda x, y: np.square(x - y), "truncatediv": _truncatediv,
    "truncatemod": _truncatemod,
}
NP_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "negative": np.negative, "abs": np.abs, "square": np.square, "sqrt": np.sqrt,
    "exp": np.exp, "log": np.log, "tanh": np.tanh, "sigmoid": _sigmoid,
    "logical_not": np.logical_not, "identity": lambda x: x,
    "sign": np.sign, "floor": np.floor, "ceil": np.ceil, "round": np.round,
    "reciprocal": lambda x: 1 / x, "rsqrt": lambda x: 1 / np.sqrt(x), "sin": np.sin,
    "cos": np.cos, "log1p": np.log1p, "expm1": np.expm1, "is_nan": np.isnan,
    "is_finite": np.isfinite, "nn.relu": lambda x: np.maximum(x, np.zeros((), x.dtype)),
    "nn.relu6": lambda x: np.minimum(np.maximum(x, np.zeros((), x.dtype)),
                                     np.asarray(6, x.dtype)),
    "nn.elu": lambda x: np.where(x > 0, x, np.expm1(x)),
    "nn.selu": _selu,
    "nn.softplus": lambda x: (np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0)).astype(x.dtype),
    "nn.leaky_relu": lambda x: np.where(x > 0, x, x * np.asarray(0.2, x.dtype)),
    "zeros_like": np.zeros_like, "ones_like": np.ones_like,
    "nn.softmax": _softmax, "nn.log_softmax": _log_softmax,
}


def _reduce(op: str, x: np.ndarray, axis: int | None, keep: bool) -> np.ndarray:
    if op == "reduce_sum":
        return np.sum(x, axis=axis, keepdims=keep, dtype=x.dtype)
    if op == "reduce_prod":
        return np.prod(x, axis=axis, keepdims=keep, dtype=x.dtype)
    if op in ("reduce_any", "reduce_all"):
        return np.asarray((np.any if op == "reduce_any" else np.all)(x, axis=axis,
                                                                      keepdims=keep))
    if op in ("reduce_max", "reduce_min"):
        lowest = op == "reduce_max"
        if x.dtype.kind == "f":
            identity: Any = -np.inf if lowest else np.inf
        else:
            identity = np.iinfo(x.dtype).min if lowest else np.iinfo(x.dtype).max
        fn = np.max if lowest else np.min
        return np.asarray(fn(x, axis=axis, keepdims=keep, initial=identity))
    # reduce_mean: integers accumulate wide and truncate toward zero; empty -> 0 / nan.
    total = np.sum(x, axis=axis, keepdims=keep,
                   dtype=np.float64 if x.dtype.kind == "f" else np.int64)
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


class _NumpyInterpreter:
    def __init__(self, program: Program) -> None:
        self.nodes = program.nodes
        self.variables: dict[int, np.ndarray] = {}
        self.queues: dict[int, _Queue] = {}

    def run(self, fetches: list[int], feeds: dict[int, np.ndarray]) -> list[Any]:
        memo: dict[int, Any] = {}

        def value(nid: int) -> Any:
            if nid not in memo:
                memo[nid] = self.eval(self.nodes[nid], value, feeds)
            return memo[nid]

        return [value(i) for i in fetches]

    def eval(self, n: Node, v: Callable[[int], Any],
             feeds: dict[int, np.ndarray]) -> Any:
        k, at = n.kind, n.attrs
        if k == "const":
            return np.asarray(at["value"], n.dtype)
        if k == "placeholder":
            return np.asarray(feeds[n.id], n.dtype)
        if k in ("binary", "compare", "logical"):
            return np.asarray(NP_BINARY[at["op"]](v(n.args[0]), v(n.args[1])))
        if k == "unary":
            return np.asarray(NP_UNARY[at["op"]](v(n.args[0])))
        if k == "where":
            return np.where(v(n.args[0]), v(n.args[1]), v(n.args[2]))
        if k == "reduce":
            return _reduce(at["op"], v(n.args[0]), at["axis"], at["keepdims"])
        if k == "arg":
            return _arg(at["op"], v(n.args[0]), at["axis"])
        if k == "cast":
            return v(n.args[0]).astype(at["to"])
        if k == "gather":
            x = v(n.args[0])
            limit = x.shape[at["axis"]]
            for i, index in enumerate(at["indices"]):
                if not 0 <= index < limit:
                    raise _invalid(f"indices[{i}] = {index} is not in [0, {limit})")
            return np.take(x, at["indices"], axis=at["axis"])
        if k == "transpose":
            return np.transpose(v(n.args[0]))
        if k == "reshape":
            return np.reshape(v(n.args[0]), at["shape"])
        if k == "concat":
            return np.concatenate([v(n.args[0]), v(n.args[1])], axis=at["axis"])
        if k in ("clip", "add_n", "stack", "one_hot", "matmul", "cumsum", "reverse", "tile",
                 "pad", "slice", "expand_squeeze"):
            return self.structural(n, [v(i) for i in n.args])
        if k in ("cond", "cond_unary", "while"):
            # The operands are made outside the branch / loop, so they are computed
            # whichever branch is taken and however many iterations run (as TF).
            args = [v(i) for i in n.args]
        if k == "cond":
            if args[0]:
                return np.asarray(NP_BINARY[at["true"]](args[1], args[2]))
            return np.asarray(NP_UNARY[at["false"]](args[1]))
        if k == "cond_unary":
            return np.logical_not(args[1]) if args[0] else args[1]
        if k == "while":
            acc = args[1]
            for _ in range(int(args[0])):
                acc = np.asarray(NP_BINARY[at["op"]](acc, args[2])).astype(acc.dtype)
            return acc
        if k == "case":
            return self.case(n, v)
        return self.stateful(n, v)

    def structural(self, n: Node, a: list[np.ndarray]) -> Any:
        k, at = n.kind, n.attrs
        x = a[0]
        if k == "clip":
            return np.minimum(np.maximum(x, np.asarray(at["lo"], x.dtype)),
                              np.asarray(at["hi"], x.dtype))
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
            axis = at["axis"]
            y = np.flip(x, axis) if at["reverse"] else x
            c = np.cumsum(y, axis=axis, dtype=x.dtype)
            if at["exclusive"]:
                c = np.concatenate([np.zeros_like(np.take(c, [0], axis=axis)),
                                    np.delete(c, -1, axis=axis)], axis=axis) \
                    if c.shape[axis] else c
            return np.flip(c, axis) if at["reverse"] else c
        if k == "reverse":
            return np.flip(x, at["axis"])
        if k == "tile":
            return np.tile(x, at["multiples"]) if at["multiples"] else x
        if k == "pad":
            return np.pad(x, at["paddings"])
        if k == "slice":
            return x[at["begin"]::at["step"]]
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

    def stateful(self, n: Node, v: Callable[[int], Any]) -> Any:
        k, at = n.kind, n.attrs
        if k == "variable":
            return n.id
        if k == "var_init":
            self.variables[n.args[0]] = np.array(self.nodes[n.args[0]].attrs["init"])
            return None
        if k in ("assign_add", "assign_sub", "assign", "read"):
            var = n.args[0]
            if var not in self.variables:
                raise NpError("FailedPreconditionError", "uninitialized variable")
            if k != "read":
                delta = v(n.args[1])
                old = self.variables[var]
                new = old + delta if k == "assign_add" else old - delta if \
                    k == "assign_sub" else delta
                self.variables[var] = np.asarray(new, old.dtype)
            return self.variables[var].copy()
        if k == "queue":
            self.queues.setdefault(n.id, _Queue(at["dtype"], at["shape"]))
            return n.id
        q = self.queues.setdefault(n.args[0], _Queue(self.nodes[n.args[0]].attrs["dtype"],
                                                     self.nodes[n.args[0]].attrs["shape"]))
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
            try:
                values = interp.run(r.fetches, r.feeds)
            except NpError as exc:
                outcome.append(("error", "run", exc.code))
            else:
                outcome.append(("ok", [None if x is None else np.asarray(x) for x in values]))
    return outcome


# -- comparing outcomes -------------------------------------------------------------------------

# (float rtol, float atol) per dtype for each oracle: the numpy interpreter computes
# with the same numpy routines; TF's Eigen kernels (exp, tanh, sums in another order)
# round differently in the last bits.
TOLERANCE = {"exact": {"float32": (1e-5, 1e-6), "float64": (1e-9, 1e-12)},
             "tf": {"float32": (2e-4, 1e-5), "float64": (1e-7, 1e-12)}}


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
    fail while building (TypeError and ValueError alike).
    """
    tol = TOLERANCE[tolerance]
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if a[0] == "error" or b[0] == "error":
            if a[0] != b[0]:
                return f"run {i}: {a[:3] if a[0] == 'error' else 'ok'} vs " \
                       f"{b[:3] if b[0] == 'error' else 'ok'}"
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
