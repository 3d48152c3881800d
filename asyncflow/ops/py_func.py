"""``af.py_func``: wrap a Python function (``def`` or ``async def``) as an op.

The function receives the inputs' numpy values and returns one value per output
(a bare value for a single ``Tout``; a list/tuple when ``Tout`` is a list).  Its
results are converted to the ``Tout`` dtypes.  A ``def`` runs inline on the event
loop, or on a worker thread with ``expensive=True``; an ``async def`` is awaited.

Attributes: ``func`` (the callable; graph defs store it by reference), ``Tout``
(list of DType), ``single`` (Tout was a bare DType), ``expensive``, ``is_async``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, overload

import numpy as np

from asyncflow import dtypes
from asyncflow.framework import registry
from asyncflow.framework.graph import Operation, Tensor, convert_to_tensor
from asyncflow.framework.shapes import unknown_shape
from asyncflow.ops._base import define_op, make_op

__all__ = ["py_func"]


def _py_func_shape(
    inputs: Sequence[Tensor], attrs: Mapping[str, Any]
) -> list[tuple[dtypes.DType, Any]]:
    return [(dt, unknown_shape()) for dt in attrs["Tout"]]


define_op("PyFunc", _py_func_shape, stateful=True)
define_op("PyFuncStateless", _py_func_shape)


def _converter(op: Operation) -> Callable[[Any], Any]:
    """A function mapping the Python function's result to the kernel's output(s)."""
    targets = [dt.np for dt in op._attrs["Tout"]]
    n = len(targets)
    label = f"py_func {op.name!r}"

    def as_output(value: Any, target: np.dtype[Any]) -> Any:
        if target.kind == "O":  # af.string: bytes, str encoded as UTF-8 (as TF)
            return dtypes.as_string_array(value)
        out = np.asarray(value, dtype=target)
        return out[()] if not out.ndim else out  # a 0-d value as a numpy scalar

    if op._attrs["single"]:
        (target,) = targets
        if target.kind == "O":
            return dtypes.as_string_array
        scalar = target.type

        def single(result: Any) -> Any:
            # A 0-d value is a numpy scalar, as a fed one is (the kernels' fast path);
            # one of the output's type already is the output.
            if type(result) is scalar:
                return result
            out = np.asarray(result, dtype=target)
            return out[()] if not out.ndim else out

        return single

    def convert(result: Any) -> Any:
        if n == 0:
            return None  # Tout=[]: a side-effect function; whatever it returns is dropped
        values = result if isinstance(result, list | tuple) else [result]
        if len(values) != n:
            raise ValueError(
                f"{label} returned {len(values)} values, but expects to see {n} values"
            )
        if n == 1:
            return as_output(values[0], targets[0])
        return [as_output(v, t) for v, t in zip(values, targets, strict=True)]

    return convert


def _py_func_kernel(op: Operation) -> tuple[Callable[..., Any], int]:
    func = op._attrs["func"]
    convert = _converter(op)
    if op._attrs["is_async"]:

        async def async_kernel(*args: Any) -> Any:
            return convert(await func(*args))

        # What the step runs instead, without this coroutine (see ExecutorOptions.kernel_parts).
        async_kernel.parts = (func, convert)  # type: ignore[attr-defined]
        return async_kernel, registry.ASYNC

    def kernel(*args: Any) -> Any:
        return convert(func(*args))

    return kernel, registry.EXPENSIVE if op._attrs["expensive"] else registry.INLINE


registry.register_kernel_factory("PyFunc")(_py_func_kernel)
registry.register_kernel_factory("PyFuncStateless")(_py_func_kernel)


def _is_async(func: Any) -> bool:
    # Also an object whose __call__ is ``async def`` (partials are handled by inspect).
    call = type(func).__call__ if not inspect.isroutine(func) else None
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(call)


@overload
def py_func(
    func: Callable[..., Any],
    inp: Any,
    Tout: dtypes.DType | str | type | np.dtype[Any],
    *,
    stateful: bool = True,
    expensive: bool = False,
    name: str | None = None,
) -> Tensor: ...


@overload
def py_func(
    func: Callable[..., Any],
    inp: Any,
    Tout: list[Any] | tuple[Any, ...],
    *,
    stateful: bool = True,
    expensive: bool = False,
    name: str | None = None,
) -> Any: ...


def py_func(
    func: Callable[..., Any],
    inp: Any,
    Tout: Any,
    *,
    stateful: bool = True,
    expensive: bool = False,
    name: str | None = None,
) -> Any:
    """An op that calls ``func(*input_values)`` with numpy values when it runs.

    ``Tout`` is a DType (returns a Tensor) or a list/tuple of DTypes (returns a list of
    Tensors, even of length 1; ``[]`` returns the Operation and drops the result;
    type checkers see ``Tensor`` for a single DType and ``Any`` for a list).  ``func`` may be ``def``
    (inline, or on a worker thread with ``expensive=True``) or ``async def`` (awaited
    on the event loop; ``expensive=True`` is then a ``ValueError``).  Output shapes
    are unknown.  Each returned value is converted to its ``Tout`` dtype; a 0-d one
    becomes a numpy scalar (as a fed 0-d value is), so the next kernel gets
    ``np.float32(3.0)``, not a 0-d array.  ``stateful=False`` (op ``PyFuncStateless``)
    lets the optimizer fold or deduplicate it.  A wrong number of returned values
    fails the step with ``InvalidArgumentError``.
    """
    if not callable(func):
        raise TypeError(f"py_func: func must be callable, got {func!r}")
    is_async = _is_async(func)
    if is_async and expensive:
        raise ValueError(
            f"py_func: async def function {func!r} cannot be expensive "
            f"(expensive functions run on worker threads)"
        )
    single = not isinstance(Tout, list | tuple)
    tout = [dtypes.as_dtype(Tout)] if single else [dtypes.as_dtype(t) for t in Tout]
    if isinstance(inp, list | tuple):
        inputs = [convert_to_tensor(x) for x in inp]
    else:
        inputs = [convert_to_tensor(inp)]
    op_type = "PyFunc" if stateful else "PyFuncStateless"
    attrs = {
        "func": func,
        "Tout": tout,
        "single": single,
        "expensive": bool(expensive),
        "is_async": is_async,
    }
    op = make_op(op_type, inputs, attrs, name=name, default_name=op_type)
    if single:
        return op.outputs[0]
    return list(op.outputs) if op.outputs else op
