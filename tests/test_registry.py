"""User-defined op types: af.register_op / af.register_kernel, all three kernel kinds."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

import asyncflow as af
from asyncflow.framework import registry


def same_as_first(inputs: Sequence[af.Tensor], attrs: Mapping[str, Any]) -> list[Any]:
    if not inputs[0].dtype.is_floating:
        raise TypeError(f"needs a float input, got {inputs[0].dtype.name}")
    return [(inputs[0].dtype, inputs[0].shape)]


def _scale(x: Any, *, factor: float) -> Any:
    return x * x.dtype.type(factor)


scale = af.register_op("TestScale", same_as_first, kernel=_scale)


async def _async_scale(x: Any, *, factor: float) -> Any:
    await asyncio.sleep(0)
    return x * x.dtype.type(factor)


async_scale = af.register_op("TestAsyncScale", same_as_first)
af.register_kernel("TestAsyncScale", _async_scale)

thread_names: list[str] = []


def _thread_scale(x: Any, *, factor: float) -> Any:
    thread_names.append(threading.current_thread().name)
    return x * x.dtype.type(factor)


af.register_kernel("TestThreadScale", _thread_scale, expensive=True)


thread_scale = af.register_op("TestThreadScale", same_as_first)


async def test_user_ops_of_every_kind(graph: af.Graph) -> None:
    x = af.placeholder(af.float32, shape=(2,), name="x")
    y = thread_scale(async_scale(scale(x, factor=2.0), factor=3.0), factor=0.5, name="last")
    assert y.op.type == "TestThreadScale"
    assert y.op.name == "last"
    assert y.op.get_attr("factor") == 0.5
    assert tuple(y.shape) == (2,)
    async with af.Session(graph=graph) as sess:
        out = await sess.run(y, {x: [1.0, 2.0]})
    np.testing.assert_array_equal(out, np.array([3.0, 6.0], np.float32))
    assert thread_names
    assert thread_names[-1].startswith("asyncflow-")


def test_user_op_shape_fn_errors_name_the_op(graph: af.Graph) -> None:
    x = af.constant(np.array([1, 2], np.int32))
    with pytest.raises(TypeError, match="my_scale"):
        scale(x, factor=2.0, name="my_scale")


def test_register_op_rejects_duplicates_and_bad_names() -> None:
    with pytest.raises(af.errors.AlreadyExistsError, match="TestScale"):
        af.register_op("TestScale", same_as_first)
    with pytest.raises(ValueError, match="op type"):
        af.register_op("_Private", same_as_first)


def test_async_kernel_cannot_be_expensive() -> None:
    with pytest.raises(ValueError, match="cannot be expensive"):
        af.register_kernel("TestAsyncScale", _async_scale, expensive=True)


def test_unknown_op_type(graph: af.Graph) -> None:
    with pytest.raises(ValueError, match="NoSuchOp"):
        graph.create_op("NoSuchOp", [])


async def test_op_without_kernel_fails_the_run_clearly(graph: af.Graph) -> None:
    make = af.register_op("TestNoKernel", same_as_first)
    y = make(af.constant(1.0), name="kernelless")
    async with af.Session(graph=graph) as sess:
        with pytest.raises(af.errors.NotFoundError, match="kernelless"):
            await sess.run(y)
        assert await sess.run(af.constant(2.0)) == 2.0


def test_kernel_kinds_are_recorded() -> None:
    assert callable(registry.get_kernel("TestScale").factory)  # registered for CPU
    with pytest.raises(af.errors.NotFoundError):
        registry.get_kernel("TestScale", "GPU")
