"""Print and Assert: TensorFlow 1.x's debugging ops.

``Print`` passes its first input through and writes a message with the data to
stderr (``first_n`` times when set).  ``Assert`` fails the step with
``InvalidArgumentError`` naming the assert and showing its data when its condition
is false.  Both are stateful, so they are never folded away or merged.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from asyncflow import dtypes, errors
from asyncflow.framework import registry
from asyncflow.framework.graph import Operation, Tensor, convert_to_tensor
from asyncflow.framework.shapes import TensorShape
from asyncflow.ops._base import define_op, make_op

__all__ = ["Assert", "Print"]

Specs = list[tuple[dtypes.DType, Any]]


def _element(v: Any) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, np.bool_ | bool):
        return "1" if v else "0"
    if isinstance(v, np.float64):
        return f"{float(v):.17g}"
    if isinstance(v, np.floating):  # float32 and float16 print as float32, as TF
        return f"{float(v):.9g}"
    return str(v)


def _summarize(value: Any, summarize: int) -> str:
    """TF 1.x's ``Tensor::SummarizeValue``: nested ``[...]`` per dimension, the first
    ``summarize`` elements (all when negative), ``...`` where elements were left out."""
    a = np.asarray(value)
    flat = a.reshape(-1)
    limit = flat.size if summarize < 0 else min(summarize, flat.size)
    if a.ndim == 0:
        out = " ".join(_element(v) for v in flat[:limit])
    else:
        parts: list[str] = []
        index = [0]

        def one_dim(dim: int) -> None:
            if index[0] >= limit:
                return
            if dim == a.ndim - 1:
                for i in range(a.shape[dim]):
                    if index[0] >= limit:
                        if dim != 0:
                            parts.append("...")
                        return
                    if i > 0:
                        parts.append(" ")
                    parts.append(_element(flat[index[0]]))
                    index[0] += 1
                return
            for _ in range(a.shape[dim]):
                opened = index[0] < limit
                if opened:
                    parts.append("[")
                one_dim(dim + 1)
                if index[0] < limit or opened:
                    parts.append("]")

        one_dim(0)
        out = "".join(parts)
    return out + ("..." if flat.size > limit else "")


define_op("Print", lambda inputs, attrs: [(inputs[0]._dtype, inputs[0]._shape)], stateful=True)


@registry.register_kernel_factory("Print")
def _print_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    message = op._attrs["message"]
    first_n, summarize = int(op._attrs["first_n"]), int(op._attrs["summarize"])
    lock = threading.Lock()
    count = [0]

    def print_kernel(x: Any, *data: Any) -> Any:
        with lock:
            count[0] += 1
            show = first_n < 0 or count[0] <= first_n
        if show:
            sys.stderr.write(
                message + "".join(f"[{_summarize(d, summarize)}]" for d in data) + "\n"
            )
        return x

    return print_kernel, registry.INLINE


def Print(
    input_: Any,
    data: Sequence[Any],
    message: str | None = None,
    first_n: int | None = None,
    summarize: int | None = None,
    name: str | None = None,
) -> Tensor:
    """``input_`` unchanged; running it writes ``message`` and ``data`` to stderr (op ``Print``)."""
    x = convert_to_tensor(input_)
    tensors = [convert_to_tensor(d) for d in data]
    attrs = {
        "message": message or "",
        "first_n": -1 if first_n is None else int(first_n),
        "summarize": 3 if summarize is None else int(summarize),
    }
    return make_op("Print", (x, *tensors), attrs, name=name, default_name="Print").outputs[0]


def _assert_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> Specs:
    cond = inputs[0]
    if not cond._dtype.is_bool:
        raise TypeError(f"condition {cond.name!r} must be bool, got {cond._dtype.name}")
    if cond._shape.rank not in (0, None) and cond._shape != TensorShape(()):
        raise ValueError(f"condition {cond.name!r} must be a scalar, got shape {cond._shape}")
    return []


define_op("Assert", _assert_shape, stateful=True)


@registry.register_kernel_factory("Assert")
def _assert_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    summarize = int(op._attrs["summarize"])

    def assert_kernel(cond: Any, *data: Any) -> None:
        if not bool(cond):
            shown = " ".join(f"[{_summarize(d, summarize)}]" for d in data)
            raise errors.InvalidArgumentError(None, op, f"assertion failed: {shown}")

    return assert_kernel, registry.INLINE


def Assert(
    condition: Any, data: Sequence[Any], summarize: int | None = None, name: str | None = None
) -> Operation:
    """An op that fails the step with ``InvalidArgumentError`` when ``condition`` is false.

    The error names the assert op and shows ``data`` (the first ``summarize`` elements
    of each).  Use it as a control dependency, as ``tf.Assert``.
    """
    c = convert_to_tensor(condition)
    tensors = [convert_to_tensor(d) for d in data]
    attrs = {"summarize": 3 if summarize is None else int(summarize)}
    return make_op("Assert", (c, *tensors), attrs, name=name, default_name="Assert")
