"""Neural-network ops: activations, softmax and losses, bias_add, batch norm (``af.nn``).

Convolution and pooling live in :mod:`asyncflow.ops.conv_ops`.  Op types, attributes
and numerics are TensorFlow's, so frozen TF graphs import onto these kernels.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from asyncflow import dtypes, errors
from asyncflow.framework import registry
from asyncflow.framework.graph import Operation, Tensor, convert_to_tensor
from asyncflow.framework.shapes import TensorShape, unknown_shape
from asyncflow.ops._base import define_op, inline_kernel, make_op

__all__ = [
    "bias_add",
    "elu",
    "fused_batch_norm",
    "l2_normalize",
    "leaky_relu",
    "log_softmax",
    "relu",
    "relu6",
    "selu",
    "sigmoid",
    "softmax",
    "softmax_cross_entropy_with_logits",
    "sparse_softmax_cross_entropy_with_logits",
]

Specs = list[tuple[dtypes.DType, Any]]


def _real_unary_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    (x,) = inputs
    if not (x._dtype.is_integer or x._dtype.is_floating):
        raise TypeError(
            f"input {x.name!r} has dtype {x._dtype.name}, expected an integer or floating dtype"
        )
    return [(x._dtype, x._shape)]


def _float_unary_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    (x,) = inputs
    if not x._dtype.is_floating:
        raise TypeError(f"input {x.name!r} has dtype {x._dtype.name}, expected a floating dtype")
    return [(x._dtype, x._shape)]


def _like(value: Any, dtype: dtypes.DType) -> Tensor:
    """A Tensor as is; a Python or numpy value converted to ``dtype`` (as TF's ``T``)."""
    if isinstance(value, Tensor) or hasattr(value, "_as_graph_element"):
        return convert_to_tensor(value)
    return convert_to_tensor(value, dtype=dtype)


# -- per-channel arithmetic over whole rows ------------------------------------------------

#: Channels below which a per-channel vector is applied to an NHWC image row by row:
#: broadcasting a vector of 16 channels, numpy's inner loop runs 16 values at a time
#: (87 us to scale and shift a batch of 8 32x32x16 images, 36 us row by row); from 64
#: channels on the two are even.
ROW_CHANNELS = 64


def channel_rows(x: np.ndarray, *vectors: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]] | None:
    """A C-contiguous NHWC ``x`` with few channels as a ``[n * h, w * c]`` view, and each
    per-channel vector tiled to one row; None when the plain broadcast is as fast."""
    if x.ndim != 4 or x.shape[3] >= ROW_CHANNELS or not x.flags.c_contiguous:
        return None
    n, h, w, c = x.shape
    # (``np.tile``'s result, by ndarray methods: 0.6 us a vector where tile took 2.2)
    return x.reshape(n * h, w * c), [v.reshape(1, -1).repeat(w, 0).reshape(-1) for v in vectors]


# -- Relu ------------------------------------------------------------------------------

define_op("Relu", _real_unary_shape)


@registry.register_kernel_factory("Relu")
def _relu_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    # A zero of the input dtype keeps the result dtype exact for every input kind.
    zero = op._inputs[0]._dtype.as_numpy_dtype(0)
    return functools.partial(np.maximum, zero), registry.INLINE


def relu(features: Any, name: str | None = None) -> Tensor:
    """``max(features, 0)`` elementwise (op ``Relu``)."""
    x = convert_to_tensor(features)
    return make_op("Relu", (x,), name=name, default_name="Relu").outputs[0]


# -- Sigmoid -----------------------------------------------------------------------

define_op("Sigmoid", _float_unary_shape)


def _sigmoid_kernel(x: Any) -> Any:
    # sigmoid(x) = exp(min(x, 0)) / (1 + exp(-|x|)): neither exp overflows, and for
    # x < 0 it is e / (1 + e), which keeps the relative precision of tiny results
    # (sigmoid(-700) = 9.86e-305 as TF, where the tanh form rounds to 0 below -37).
    # Six ufunc calls and no select: an LSTM cell calls this three times per step on
    # a few dozen floats, where each numpy call's overhead is the cost.  The 0 and 1
    # are 0-d arrays of x's dtype: a Python number costs each of its two ufunc calls
    # a weak-scalar conversion (2.2 -> 1.7 us on 16 floats; the same values).
    x = np.asarray(x)
    zero, one = _zero_one(x.dtype)
    return (np.exp(np.minimum(x, zero)) / (one + np.exp(-np.abs(x))))[()]


#: Per dtype: (0, 1) as 0-d arrays of it.
_ZERO_ONE: dict[np.dtype[Any], tuple[np.ndarray, np.ndarray]] = {}


def _zero_one(dtype: np.dtype[Any]) -> tuple[np.ndarray, np.ndarray]:
    pair = _ZERO_ONE.get(dtype)
    if pair is None:
        pair = _ZERO_ONE[dtype] = (np.zeros((), dtype), np.ones((), dtype))
    return pair


inline_kernel("Sigmoid", _sigmoid_kernel)


def sigmoid(x: Any, name: str | None = None) -> Tensor:
    """``1 / (1 + exp(-x))`` elementwise, computed without overflow (op ``Sigmoid``)."""
    t = convert_to_tensor(x)
    return make_op("Sigmoid", (t,), name=name, default_name="Sigmoid").outputs[0]


# -- Softmax -----------------------------------------------------------------------


def _softmax_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    specs = _float_unary_shape(inputs, attrs)
    (x,) = inputs
    rank = x._shape.rank
    axis = attrs["axis"]
    if rank is not None:
        if rank == 0:
            raise ValueError(f"softmax needs logits of rank >= 1, got a scalar ({x.name})")
        if not -rank <= axis < rank:
            raise ValueError(
                f"axis {axis} is out of range [{-rank}, {rank}) for logits "
                f"{x.name!r} of rank {rank}"
            )
    return specs


define_op("Softmax", _softmax_shape)


def _softmax(x: Any, axis: int) -> Any:
    # Subtracting the max makes exp() overflow-free; the result is unchanged.  The
    # ufuncs' own reduce and in-place exp / divide: no wrappers, one temporary.
    e = np.subtract(x, np.maximum.reduce(x, axis=axis, keepdims=True))
    np.exp(e, out=e)
    e /= np.add.reduce(e, axis=axis, keepdims=True)
    return e


inline_kernel("Softmax", _softmax, attrs=("axis",))


def softmax(
    logits: Any, axis: int | None = None, name: str | None = None, dim: int | None = None
) -> Tensor:
    """``exp(logits) / sum(exp(logits), axis)``, numerically stable (op ``Softmax``).

    ``axis`` defaults to the last dimension; ``dim`` is its TF 1.x alias.
    """
    if dim is not None:
        if axis is not None:
            raise ValueError("cannot specify both 'axis' and 'dim'")
        axis = dim
    x = convert_to_tensor(logits)
    a = -1 if axis is None else int(axis)
    return make_op("Softmax", (x,), {"axis": a}, name=name, default_name="Softmax").outputs[0]


# -- simple activations ----------------------------------------------------------------

define_op("Relu6", _real_unary_shape)


def _relu6_kernel(x: Any) -> Any:
    return np.minimum(np.maximum(x, x.dtype.type(0)), x.dtype.type(6))


inline_kernel("Relu6", _relu6_kernel)


def relu6(features: Any, name: str | None = None) -> Tensor:
    """``min(max(features, 0), 6)`` elementwise (op ``Relu6``)."""
    x = convert_to_tensor(features)
    return make_op("Relu6", (x,), name=name, default_name="Relu6").outputs[0]


define_op("LeakyRelu", _float_unary_shape)


def _leaky_relu_kernel(x: Any, alpha: float) -> Any:
    return np.where(x > 0, x, x * x.dtype.type(alpha))


inline_kernel("LeakyRelu", _leaky_relu_kernel, attrs=("alpha",))


def leaky_relu(features: Any, alpha: float = 0.2, name: str | None = None) -> Tensor:
    """``features`` where positive, else ``alpha * features`` (op ``LeakyRelu``)."""
    x = convert_to_tensor(features)
    return make_op(
        "LeakyRelu", (x,), {"alpha": float(alpha)}, name=name, default_name="LeakyRelu"
    ).outputs[0]


define_op("Elu", _float_unary_shape)


def _elu_kernel(x: Any) -> Any:
    return np.where(x < 0, np.expm1(np.minimum(x, 0)), x)


inline_kernel("Elu", _elu_kernel)


def elu(features: Any, name: str | None = None) -> Tensor:
    """``exp(x) - 1`` where ``x < 0``, else ``x`` (op ``Elu``)."""
    x = convert_to_tensor(features)
    return make_op("Elu", (x,), name=name, default_name="Elu").outputs[0]


define_op("Selu", _float_unary_shape)

_SELU_SCALE = 1.0507009873554804934193349852946
_SELU_ALPHA = 1.6732632423543772848170429916717


def _selu_kernel(x: Any) -> Any:
    scale = x.dtype.type(_SELU_SCALE)
    neg = x.dtype.type(_SELU_SCALE * _SELU_ALPHA) * np.expm1(np.minimum(x, 0))
    return np.where(x < 0, neg, scale * x)


inline_kernel("Selu", _selu_kernel)


def selu(features: Any, name: str | None = None) -> Tensor:
    """Scaled ELU with TF's fixed ``scale`` and ``alpha`` (op ``Selu``)."""
    x = convert_to_tensor(features)
    return make_op("Selu", (x,), name=name, default_name="Selu").outputs[0]


# -- LogSoftmax ----------------------------------------------------------------------


def _last_axis_float_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    specs = _float_unary_shape(inputs, attrs)
    (x,) = inputs
    if x._shape.rank == 0:
        raise ValueError(f"logits must have rank >= 1, got a scalar ({x.name})")
    return specs


define_op("LogSoftmax", _last_axis_float_shape)


def _log_softmax(x: Any, axis: int = -1) -> Any:
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


inline_kernel("LogSoftmax", _log_softmax)


def log_softmax(
    logits: Any, axis: int | None = None, name: str | None = None, dim: int | None = None
) -> Tensor:
    """``logits - log(sum(exp(logits), axis))`` (op ``LogSoftmax``, last axis).

    For another ``axis`` the op runs on a transposed view, as TensorFlow does.
    """
    if dim is not None:
        axis = dim
    x = convert_to_tensor(logits)
    rank = x.shape.rank
    a = -1 if axis is None else int(axis)
    if rank is None or a in (-1, rank - 1):
        return make_op("LogSoftmax", (x,), name=name, default_name="LogSoftmax").outputs[0]
    from asyncflow.ops.array_ops import transpose

    if not -rank <= a < rank:
        raise ValueError(f"axis {a} is out of range for logits {x.name!r} of rank {rank}")
    perm = list(range(rank))
    perm[a % rank], perm[-1] = perm[-1], perm[a % rank]
    y = make_op("LogSoftmax", (transpose(x, perm),), default_name="LogSoftmax").outputs[0]
    return transpose(y, perm, name=name or "LogSoftmax")


# -- BiasAdd ----------------------------------------------------------------------------


def _bias_add_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    x, b = inputs
    if not x._dtype.is_numeric:
        raise TypeError(f"value {x.name!r} has dtype {x._dtype.name}, expected numeric")
    if b._dtype is not x._dtype:
        raise TypeError(
            f"bias {b.name!r} has dtype {b._dtype.name}, value {x.name!r} has {x._dtype.name}"
        )
    fmt = attrs["data_format"]
    if fmt not in ("NHWC", "NCHW"):
        raise ValueError(f"data_format must be 'NHWC' or 'NCHW', got {fmt!r}")
    if b._shape.rank not in (1, None):
        raise ValueError(f"bias must be 1-D, got shape {b._shape} ({b.name})")
    rank = x._shape.rank
    if rank is not None and rank < 2:
        raise ValueError(f"value must be at least rank 2, got shape {x._shape} ({x.name})")
    if rank is not None and b._shape.rank == 1:
        c = x._shape[1 if fmt == "NCHW" else -1]
        if c is not None and b._shape[0] is not None and c != b._shape[0]:
            raise ValueError(
                f"bias of size {b._shape[0]} does not match the channel "
                f"dimension {c} of value {x.name!r} with shape {x._shape}"
            )
    return [(x._dtype, x._shape)]


define_op("BiasAdd", _bias_add_shape)


@registry.register_kernel_factory("BiasAdd")
def _bias_add_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    if op._attrs["data_format"] != "NCHW":
        return np.add, registry.INLINE

    def bias_add_nchw(x: Any, b: Any) -> Any:
        return x + b.reshape((-1,) + (1,) * (x.ndim - 2))

    return bias_add_nchw, registry.INLINE


def bias_add(
    value: Any, bias: Any, data_format: str | None = None, name: str | None = None
) -> Tensor:
    """``value + bias`` with a 1-D ``bias`` over the channel dimension (op ``BiasAdd``)."""
    x = convert_to_tensor(value)
    b = _like(bias, x.dtype)
    return make_op(
        "BiasAdd", (x, b), {"data_format": data_format or "NHWC"}, name=name, default_name="BiasAdd"
    ).outputs[0]


# -- FusedBatchNorm ----------------------------------------------------------------------


def _batch_norm_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any], outputs: int) -> Specs:
    x, scale, offset, mean, var = inputs
    if x._dtype not in (dtypes.float16, dtypes.float32):
        raise TypeError(f"x {x.name!r} has dtype {x._dtype.name}, expected float16 or float32")
    for t in (scale, offset, mean, var):
        if t._dtype is not dtypes.float32:
            raise TypeError(f"{t.name!r} has dtype {t._dtype.name}, expected float32")
        if t._shape.rank not in (1, None):
            raise ValueError(f"{t.name!r} must be 1-D, got shape {t._shape}")
    fmt = attrs["data_format"]
    if fmt not in ("NHWC", "NCHW"):
        raise ValueError(f"data_format must be 'NHWC' or 'NCHW', got {fmt!r}")
    if x._shape.rank not in (4, None):
        raise ValueError(f"x must be rank 4, got shape {x._shape} ({x.name})")
    c = None if x._shape.rank is None else x._shape[1 if fmt == "NCHW" else 3]
    for t in (scale, offset) + ((mean, var) if not attrs["is_training"] else ()):
        n = t._shape[0] if t._shape.rank == 1 else None
        if c is not None and n is not None and n != c:
            raise ValueError(f"{t.name!r} has {n} elements, x {x.name!r} has {c} channels")
    vec = TensorShape([c])
    specs: Specs = [(x._dtype, x._shape)] + [(dtypes.float32, vec)] * 4
    if outputs == 6:
        specs.append((dtypes.float32, unknown_shape()))
    return specs


define_op("FusedBatchNorm", lambda i, a: _batch_norm_shape(i, a, 5))
define_op("FusedBatchNormV2", lambda i, a: _batch_norm_shape(i, a, 5))
define_op("FusedBatchNormV3", lambda i, a: _batch_norm_shape(i, a, 6))


def _scale_shift(x: np.ndarray, scale: np.ndarray, shift: np.ndarray, nhwc: bool) -> np.ndarray:
    """``x * scale + shift`` per channel (broadcast as given), in one new array."""
    rows = channel_rows(x, scale, shift) if nhwc else None
    if rows is None:
        y: np.ndarray = x * scale
        y += shift
        return y
    view, (scale_row, shift_row) = rows
    out: np.ndarray = view * scale_row
    out += shift_row
    return out.reshape(x.shape)


def _batch_norm_factory(op: Operation) -> tuple[Callable[..., Any], int]:
    eps = float(op._attrs["epsilon"])
    nchw = op._attrs["data_format"] == "NCHW"
    training = bool(op._attrs["is_training"])
    v3 = op._type == "FusedBatchNormV3"
    axes = (0, 2, 3) if nchw else (0, 1, 2)

    def batch_norm_kernel(x: Any, scale: Any, offset: Any, mean: Any, var: Any) -> Any:
        xf = x.astype(np.float32, copy=False)
        if training:
            mean = xf.mean(axis=axes)
            var = xf.var(axis=axes)
            n = xf.size // max(xf.shape[1 if nchw else 3], 1)
            # As TF: y uses the biased variance, the output batch_variance the unbiased.
            out_var = var * (n / max(n - 1, 1))
        else:
            out_var = var
        inv = scale / np.sqrt(var + np.float32(eps))
        shift = offset - mean * inv
        if nchw:
            inv, shift = inv.reshape(-1, 1, 1), shift.reshape(-1, 1, 1)
        y = _scale_shift(xf, inv, shift, not nchw).astype(x.dtype, copy=False)
        outs = [y, mean, out_var, mean, var]
        if v3:
            outs.append(np.zeros((0,), np.float32))
        return outs

    return batch_norm_kernel, registry.INLINE


for _bn in ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"):
    registry.register_kernel_factory(_bn)(_batch_norm_factory)


def fused_batch_norm(
    x: Any,
    scale: Any,
    offset: Any,
    mean: Any = None,
    variance: Any = None,
    epsilon: float = 0.001,
    data_format: str = "NHWC",
    is_training: bool = True,
    name: str | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Batch normalization of a rank-4 ``x`` (op ``FusedBatchNormV3``).

    Returns ``(y, batch_mean, batch_variance)`` as ``tf.compat.v1.nn.fused_batch_norm``.
    For inference pass ``mean``, ``variance`` and ``is_training=False``; with
    ``is_training=True`` (TF's default) the batch statistics are used.
    """
    xt = convert_to_tensor(x)
    if mean is None or variance is None:
        if not is_training:
            raise ValueError(
                "fused_batch_norm: mean and variance are required when is_training=False"
            )
        mean = variance = np.zeros((0,), np.float32)
    tensors = tuple(_like(v, dtypes.float32) for v in (scale, offset, mean, variance))
    min_eps = 1.001e-5
    attrs = {
        "epsilon": float(max(epsilon, min_eps)),
        "data_format": data_format,
        "is_training": bool(is_training),
        "exponential_avg_factor": 1.0,
    }
    op = make_op(
        "FusedBatchNormV3", (xt, *tensors), attrs, name=name, default_name="FusedBatchNormV3"
    )
    return op.outputs[0], op.outputs[1], op.outputs[2]


# -- softmax cross entropy ----------------------------------------------------------------


def _xent_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    logits, labels = inputs
    _float_unary_shape((logits,), attrs)
    if labels._dtype is not logits._dtype:
        raise TypeError(
            f"labels {labels.name!r} have dtype {labels._dtype.name}, logits "
            f"{logits.name!r} have {logits._dtype.name}"
        )
    if logits._shape.rank not in (2, None):
        raise ValueError(
            f"logits must be 2-D [batch, classes], got shape {logits._shape} ({logits.name})"
        )
    if not logits._shape.is_compatible_with(labels._shape):
        raise ValueError(
            f"logits and labels must have the same shape, got {logits._shape} and {labels._shape}"
        )
    shape = logits._shape.merge_with(labels._shape)
    batch = TensorShape([shape[0]]) if shape.rank == 2 else unknown_shape(1)
    return [(logits._dtype, batch), (logits._dtype, shape)]


define_op("SoftmaxCrossEntropyWithLogits", _xent_shape)


def _xent_kernel(logits: Any, labels: Any) -> list[Any]:
    log_p = _log_softmax(logits)
    loss = -np.sum(labels * log_p, axis=-1)
    return [loss, np.exp(log_p) - labels]


inline_kernel("SoftmaxCrossEntropyWithLogits", _xent_kernel)


def _sparse_xent_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    logits, labels = inputs
    _float_unary_shape((logits,), attrs)
    if labels._dtype not in (dtypes.int32, dtypes.int64):
        raise TypeError(
            f"labels {labels.name!r} have dtype {labels._dtype.name}, expected int32 or int64"
        )
    if logits._shape.rank not in (2, None):
        raise ValueError(
            f"logits must be 2-D [batch, classes], got shape {logits._shape} ({logits.name})"
        )
    if labels._shape.rank not in (1, None):
        raise ValueError(f"labels must be 1-D [batch], got shape {labels._shape} ({labels.name})")
    batch = TensorShape([None]) if logits._shape.rank is None else TensorShape([logits._shape[0]])
    batch = batch.merge_with(labels._shape) if labels._shape.rank == 1 else batch
    return [(logits._dtype, batch), (logits._dtype, logits._shape)]


define_op("SparseSoftmaxCrossEntropyWithLogits", _sparse_xent_shape)


def _sparse_xent_kernel(logits: Any, labels: Any) -> list[Any]:
    classes = logits.shape[-1]
    bad = (labels < 0) | (labels >= classes)
    if np.any(bad):
        value = labels[np.argmax(bad)]
        raise errors.InvalidArgumentError(
            None,
            None,
            f"Received a label value of {value} which is outside the valid "
            f"range of [0, {classes}).  Label values: {labels.tolist()}",
        )
    log_p = _log_softmax(logits)
    rows = np.arange(labels.shape[0])
    loss = -log_p[rows, labels]
    backprop = np.exp(log_p)
    backprop[rows, labels] -= 1
    return [loss, backprop]


inline_kernel("SparseSoftmaxCrossEntropyWithLogits", _sparse_xent_kernel)


def softmax_cross_entropy_with_logits(
    labels: Any = None,
    logits: Any = None,
    axis: int = -1,
    name: str | None = None,
    dim: int | None = None,
) -> Tensor:
    """Per-example ``-sum(labels * log_softmax(logits))`` over the last axis.

    Op ``SoftmaxCrossEntropyWithLogits`` (rank-2 ``[batch, classes]`` inputs, as TF's op).
    """
    if labels is None or logits is None:
        raise ValueError("softmax_cross_entropy_with_logits needs labels= and logits=")
    if (dim if dim is not None else axis) != -1:
        raise ValueError("softmax_cross_entropy_with_logits supports axis=-1 only")
    lg = convert_to_tensor(logits)
    lb = _like(labels, lg.dtype)
    op = make_op(
        "SoftmaxCrossEntropyWithLogits",
        (lg, lb),
        name=name,
        default_name="SoftmaxCrossEntropyWithLogits",
    )
    return op.outputs[0]


def sparse_softmax_cross_entropy_with_logits(
    labels: Any = None, logits: Any = None, name: str | None = None
) -> Tensor:
    """Per-example ``-log_softmax(logits)[label]`` for int class ``labels``.

    Op ``SparseSoftmaxCrossEntropyWithLogits``; a label outside ``[0, classes)`` fails
    the step with ``InvalidArgumentError`` naming the value.
    """
    if labels is None or logits is None:
        raise ValueError("sparse_softmax_cross_entropy_with_logits needs labels= and logits=")
    lg, lb = convert_to_tensor(logits), convert_to_tensor(labels)
    op = make_op(
        "SparseSoftmaxCrossEntropyWithLogits",
        (lg, lb),
        name=name,
        default_name="SparseSoftmaxCrossEntropyWithLogits",
    )
    return op.outputs[0]


# -- l2_normalize (composite, as TF) ------------------------------------------------------


def l2_normalize(
    x: Any, axis: Any = None, epsilon: float = 1e-12, name: str | None = None, dim: Any = None
) -> Tensor:
    """``x / sqrt(max(sum(x ** 2, axis), epsilon))`` built from TF's ops.

    ``Square``, ``Sum``, ``Maximum``, ``Rsqrt`` and ``Mul``, exactly as ``tf.nn.l2_normalize``.
    """
    from asyncflow.framework.graph import name_scope
    from asyncflow.ops import extra_math_ops, math_ops

    if dim is not None:
        axis = dim
    with name_scope(name or "l2_normalize"):
        t = convert_to_tensor(x)
        square_sum = math_ops.reduce_sum(math_ops.square(t), axis, keepdims=True)
        inv = extra_math_ops.rsqrt(math_ops.maximum(square_sum, epsilon))
        return math_ops.multiply(t, inv)
