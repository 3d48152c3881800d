"""The straight-line interpreter's closures: one call per node, whatever its shape.

A program's block (a partition's, or a loop iteration's) writes a live kernel of one
output as a call on its line and runs every other node as its closure, one call per
iteration; so every kernel shape (three inputs and more, several outputs or none,
several slots to free) has a body of its own instead of going through the general
instruction loop (``execute``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import asyncflow as af
from asyncflow.compiler.loop_schedule import I_KERNEL
from asyncflow.runtime import interpreter
from asyncflow.runtime.interpreter import BInstr, closure


def kernel_instr(
    kernel: Any, ins: tuple[int, ...], out: int, nout: int = 1, frees: tuple[int, ...] = ()
) -> BInstr:
    return (I_KERNEL, kernel, ins, out, nout, (), frees, 0, None)


@pytest.fixture
def no_execute(monkeypatch: pytest.MonkeyPatch) -> None:
    """A closure that fell back to the general instruction loop fails."""

    def refused(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a closure ran through execute()")

    monkeypatch.setattr(interpreter, "execute", refused)


CASES: list[tuple[str, Any, tuple[int, ...], int, tuple[int, ...], list[Any]]] = [
    # (what, kernel, ins, nout, frees, the value list after the call); it writes slot 4
    ("two inputs, two frees", lambda a, b: a + b, (0, 1), 1, (0, 1), [None, None, 0, 3, 3]),
    ("three inputs", lambda a, b, c: a + b + c, (0, 1, 2), 1, (), [1, 2, 0, 3, 3]),
    (
        "three inputs, three frees",
        lambda a, b, c: a * b,
        (0, 1, 2),
        1,
        (0, 1, 2),
        [None] * 3 + [3, 2],
    ),
    (
        "four inputs, a free",
        lambda a, b, c, d: a - b - c - d,
        (2, 1, 0, 3),
        1,
        (2,),
        [1, 2, None, 3, -6],
    ),
]


@pytest.mark.parametrize(("what", "kernel", "ins", "nout", "frees", "expected"), CASES)
def test_kernel_shapes_run_as_one_call(
    what: str,
    kernel: Any,
    ins: tuple[int, ...],
    nout: int,
    frees: tuple[int, ...],
    expected: list[Any],
    no_execute: None,
) -> None:
    vals: list[Any] = [1, 2, 0, 3, None]
    closure(kernel_instr(kernel, ins, 4, nout, frees))(vals)
    assert vals == expected, what


def test_several_outputs_and_none(no_execute: None) -> None:
    vals: list[Any] = [np.arange(4), None, None, 7]
    closure(kernel_instr(lambda x: (x[:2], x[2:]), (0,), 1, 2, (0,)))(vals)
    assert vals[0] is None
    assert vals[1].tolist() == [0, 1]
    assert vals[2].tolist() == [2, 3]
    seen: list[Any] = []
    closure(kernel_instr(seen.append, (3,), 0, 0, (3,)))(vals)  # no output: nothing stored
    assert seen == [7]
    assert vals[3] is None


def test_no_input_kernel(no_execute: None) -> None:
    vals: list[Any] = [None]
    closure(kernel_instr(lambda: 5, (), 0))(vals)
    assert vals == [5]


def test_wrong_output_count_is_the_kernels_error(no_execute: None) -> None:
    with pytest.raises(Exception, match="3"):
        closure(kernel_instr(lambda x: (x, x), (0,), 1, 3))([1, None, None, None])


def test_loop_body_of_three_input_and_multi_output_kernels_runs_no_execute(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A loop whose body has a 3-input Select, a 4-output Split and nodes freeing two
    slots runs its iterations as block lines and closure calls: the general
    instruction loop runs only the final program (the Switches and Exits), once per
    run."""
    calls: list[int] = []
    execute = interpreter.execute

    def counted(program: Any, *args: Any) -> None:
        calls.append(len(program))
        execute(program, *args)

    monkeypatch.setattr(interpreter, "execute", counted)
    g = af.Graph()
    with g.as_default():
        x0 = af.placeholder(af.float32, (2, 4), name="x0")

        def body(i: Any, x: Any) -> tuple[Any, Any]:
            a, b, c, d = af.split(x, 4, axis=1)
            y = af.concat([d, c, b, a], axis=1)
            return i + 1, af.where(af.greater(y, x), y - x, x * 2.0)

        out = af.while_loop(lambda i, x: i < 5, body, [af.constant(0), x0])[1]
    feed = np.arange(8, dtype=np.float32).reshape(2, 4)
    expected = feed.copy()
    for _ in range(5):
        y = expected[:, ::-1]
        expected = np.where(y > expected, y - expected, expected * 2.0)
    with af.Session(graph=g) as sess:
        got = sess.run_sync(out, {x0: feed})
    np.testing.assert_allclose(got, expected)
    assert len(calls) == 1, calls  # the final program only, not a call per node
