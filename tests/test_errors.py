from __future__ import annotations

import asyncio
import pickle

import pytest

from asyncflow import errors


def test_every_code_has_its_class() -> None:
    expected = {
        errors.CANCELLED: errors.CancelledError,
        errors.UNKNOWN: errors.UnknownError,
        errors.INVALID_ARGUMENT: errors.InvalidArgumentError,
        errors.DEADLINE_EXCEEDED: errors.DeadlineExceededError,
        errors.NOT_FOUND: errors.NotFoundError,
        errors.ALREADY_EXISTS: errors.AlreadyExistsError,
        errors.PERMISSION_DENIED: errors.PermissionDeniedError,
        errors.RESOURCE_EXHAUSTED: errors.ResourceExhaustedError,
        errors.FAILED_PRECONDITION: errors.FailedPreconditionError,
        errors.ABORTED: errors.AbortedError,
        errors.OUT_OF_RANGE: errors.OutOfRangeError,
        errors.UNIMPLEMENTED: errors.UnimplementedError,
        errors.INTERNAL: errors.InternalError,
        errors.UNAVAILABLE: errors.UnavailableError,
        errors.DATA_LOSS: errors.DataLossError,
    }
    for code, cls in expected.items():
        assert cls.error_code == code
        assert issubclass(cls, errors.OpError)
        assert errors.exception_type_from_error_code(code) is cls
        assert cls.__doc__
        # The tree in the module docstring names every class.
        assert cls.__name__ in errors.__doc__


def test_special_bases() -> None:
    assert issubclass(errors.DeadlineExceededError, TimeoutError)
    assert not issubclass(errors.CancelledError, asyncio.CancelledError)
    assert issubclass(errors.OpError, Exception)


def test_fields_and_str() -> None:
    e = errors.InvalidArgumentError("node_x", None, "bad thing")
    assert e.node_name == "node_x"
    assert e.op is None
    assert e.message == "bad thing"
    assert str(e) == "bad thing"
    assert e.error_code == errors.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("exc", "cls"),
    [
        (ValueError("v"), errors.InvalidArgumentError),
        (TypeError("t"), errors.InvalidArgumentError),
        (TimeoutError(), errors.DeadlineExceededError),
        (FileNotFoundError("f"), errors.NotFoundError),
        (StopIteration(), errors.OutOfRangeError),
        (MemoryError(), errors.ResourceExhaustedError),
        (NotImplementedError("n"), errors.UnimplementedError),
        (ConnectionRefusedError("c"), errors.UnavailableError),
        (RuntimeError("r"), errors.UnknownError),
        (KeyError("k"), errors.UnknownError),
    ],
)
def test_from_exception_maps_builtins(exc: BaseException, cls: type) -> None:
    mapped = errors.from_exception(exc)
    assert type(mapped) is cls
    assert type(exc).__name__ in mapped.message


def test_from_exception_keeps_op_errors() -> None:
    original = errors.FailedPreconditionError("v", None, "uninitialized")
    mapped = errors.from_exception(original, prefix="ctx: ")
    assert type(mapped) is errors.FailedPreconditionError
    assert mapped.message == "ctx: uninitialized"


def test_picklable() -> None:
    e = errors.AbortedError("n", None, "m")
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is errors.AbortedError
    assert back.message == "m"
    assert back.node_name == "n"
