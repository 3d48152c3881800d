"""``map_fn``: apply a function to each slice of tensors along their leading axis.

Built on ``af.while_loop`` as TF 1.x's ``map_fn``; where TF accumulates into a
TensorArray we concatenate each iteration's result onto a loop variable whose leading
dimension is loosened by a shape invariant.  ``fn`` is traced once outside the loop
to learn its output dtypes and shapes; that trace is never run (nothing depends on it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asyncflow import dtypes
from asyncflow.framework.graph import Tensor, convert_to_tensor, name_scope
from asyncflow.framework.shapes import TensorShape

__all__ = ["map_fn"]


def _as_list(value: Any) -> tuple[list[Any], bool]:
    if isinstance(value, list | tuple):
        return list(value), True
    return [value], False


def _check_elems(tensors: list[Tensor]) -> None:
    for t in tensors:
        if t.shape.rank == 0:
            raise ValueError(f"map_fn: elems must have a leading dimension, {t.name!r} is a scalar")


def _check_probe(probe: list[Tensor], dtype: Any) -> None:
    """``fn``'s results on a first slice: the dtypes ``dtype`` names (when given), and
    fully known shapes (the loop's accumulators are built from them)."""
    if dtype is not None:
        wanted = [dtypes.as_dtype(d) for d in _as_list(dtype)[0]]
        if wanted != [p.dtype for p in probe]:
            raise TypeError(
                f"map_fn: fn returned dtypes {[p.dtype.name for p in probe]}, "
                f"dtype says {[d.name for d in wanted]}"
            )
    for p in probe:
        if not p.shape.is_fully_defined():
            raise ValueError(
                f"map_fn: fn must return tensors of fully known shape, got {p.shape} ({p.name})"
            )


def map_fn(
    fn: Callable[..., Any],
    elems: Any,
    dtype: Any = None,
    parallel_iterations: int | None = None,
    back_prop: bool = True,
    swap_memory: bool = False,
    infer_shape: bool = True,
    name: str | None = None,
) -> Any:
    """``stack([fn(x) for x in unstack(elems)])`` as a graph loop (TF's ``map_fn``).

    ``elems`` is a tensor or a list/tuple of tensors with one leading dimension; ``fn``
    gets the matching slice (or tuple of slices) and returns a tensor or a list/tuple of
    tensors.  ``dtype`` (TF's argument) checks the result dtypes when given.
    """
    from asyncflow.ops import array_ops, math_ops
    from asyncflow.ops.control_flow_ops import while_loop

    if not callable(fn):
        raise TypeError(f"map_fn: fn must be callable, got {fn!r}")
    items, packed_in = _as_list(elems)
    if not items:
        raise ValueError("map_fn: elems must not be empty")
    with name_scope(name or "map"):
        tensors = [convert_to_tensor(e) for e in items]
        _check_elems(tensors)
        n = array_ops.shape(tensors[0], out_type=dtypes.int32)[0]

        returned_sequence = [False]

        def call(i: Tensor) -> list[Tensor]:
            slices = [array_ops.gather(t, i) for t in tensors]
            outs, returned_sequence[0] = _as_list(fn(tuple(slices) if packed_in else slices[0]))
            return [convert_to_tensor(o) for o in outs]

        probe = call(convert_to_tensor(0))
        _check_probe(probe, dtype)
        inits = [
            array_ops.zeros([0, *[d or 0 for d in p.shape.as_list()]], dtype=p.dtype) for p in probe
        ]
        invariants = [TensorShape(()), *[TensorShape([None, *p.shape.as_list()]) for p in probe]]

        def body(i: Tensor, *accs: Tensor) -> list[Tensor]:
            outs = call(i)
            grown = [
                array_ops.concat([a, array_ops.expand_dims(o, 0)], axis=0)
                for a, o in zip(accs, outs)
            ]
            return [math_ops.add(i, 1), *grown]

        result = while_loop(
            lambda i, *accs: math_ops.less(i, n),
            body,
            [convert_to_tensor(0), *inits],
            shape_invariants=invariants,
            parallel_iterations=parallel_iterations or 10,
        )
        outs = list(result[1:])
        lead = tensors[0].shape[0] if tensors[0].shape.rank else None
        if lead is not None:  # a known leading dimension carries over, as TF
            for out, p in zip(outs, probe):
                out._shape = out._shape.merge_with(TensorShape([lead, *p.shape.as_list()]))
    return outs if returned_sequence[0] else outs[0]
