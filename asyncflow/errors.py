"""The asyncflow error hierarchy, mirroring TensorFlow's status codes.

Every error a step can end with is an :class:`OpError`.  It names the node that
failed (``.node_name``, ``.op``) and carries TensorFlow's numeric ``.error_code``::

    Exception
     └── OpError                      .node_name .op .error_code .message
          ├── CancelledError          (1)  not an asyncio.CancelledError
          ├── UnknownError            (2)  a kernel raised something unmapped
          ├── InvalidArgumentError    (3)  e.g. an unfed placeholder
          ├── DeadlineExceededError   (4)  also a TimeoutError
          ├── NotFoundError           (5)
          ├── AlreadyExistsError      (6)
          ├── PermissionDeniedError   (7)
          ├── ResourceExhaustedError  (8)
          ├── FailedPreconditionError (9)  e.g. an uninitialized variable
          ├── AbortedError            (10)
          ├── OutOfRangeError         (11) e.g. a closed, drained queue
          ├── UnimplementedError      (12)
          ├── InternalError           (13)
          ├── UnavailableError        (14)
          └── DataLossError           (15)

Client-side mistakes that TensorFlow reports with Python builtins stay builtins:
a malformed fetch is a ``TypeError``, an unknown tensor name a ``ValueError``, a
value that does not fit a feed's static shape a ``ValueError``.

:func:`from_exception` maps a kernel's own exception to the matching ``OpError``
at the boundary between a kernel and the executor.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = [
    "ABORTED",
    "ALREADY_EXISTS",
    "CANCELLED",
    "DATA_LOSS",
    "DEADLINE_EXCEEDED",
    "FAILED_PRECONDITION",
    "INTERNAL",
    "INVALID_ARGUMENT",
    "NOT_FOUND",
    "OK",
    "OUT_OF_RANGE",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "UNAUTHENTICATED",
    "UNAVAILABLE",
    "UNIMPLEMENTED",
    "UNKNOWN",
    "AbortedError",
    "AlreadyExistsError",
    "CancelledError",
    "DataLossError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "NodeLike",
    "NotFoundError",
    "OpError",
    "OutOfRangeError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "UnavailableError",
    "UnimplementedError",
    "UnknownError",
    "exception_type_from_error_code",
    "from_exception",
]


class NodeLike(Protocol):
    """What an error names: a graph ``Operation`` or a compiled node (anything with a
    ``name``; errors keep no reference to a graph's internals beyond it)."""

    @property
    def name(self) -> str: ...


OK = 0
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
ALREADY_EXISTS = 6
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9
ABORTED = 10
OUT_OF_RANGE = 11
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14
DATA_LOSS = 15
UNAUTHENTICATED = 16


class OpError(Exception):
    """A step failed.  Names the node (``node_name``) and its operation (``op``).

    ``message`` is the human-readable description; ``str(error)`` is the message.
    """

    error_code: int = UNKNOWN

    def __init__(
        self,
        node_def: Any = None,
        op: NodeLike | None = None,
        message: str = "",
        error_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.node_def = node_def
        self.op = op
        self.message = message
        if error_code is not None:
            self.error_code = error_code

    @property
    def node_name(self) -> str | None:
        """The name of the node the error is about, or None."""
        if self.op is not None:
            return self.op.name
        if isinstance(self.node_def, str):
            return self.node_def
        return None

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep errors picklable (threads, processes, distributed workers): the
        # Operation is not sent, only its name.
        return (type(self), (self.node_name, None, self.message))


class CancelledError(OpError):
    """The step was cancelled (e.g. its session closed).  Not an ``asyncio.CancelledError``."""

    error_code = CANCELLED


class UnknownError(OpError):
    """A kernel raised an exception that maps to no other code."""

    error_code = UNKNOWN


class InvalidArgumentError(OpError):
    """An argument is invalid: an unfed placeholder, a bad shape or value at run time."""

    error_code = INVALID_ARGUMENT


class DeadlineExceededError(OpError, TimeoutError):
    """The step ran past its deadline.  Also a builtin ``TimeoutError``."""

    error_code = DEADLINE_EXCEEDED


class NotFoundError(OpError):
    """Something requested (a file, a resource, an op type) does not exist."""

    error_code = NOT_FOUND


class AlreadyExistsError(OpError):
    """Something to be created already exists."""

    error_code = ALREADY_EXISTS


class PermissionDeniedError(OpError):
    """The caller may not do this."""

    error_code = PERMISSION_DENIED


class ResourceExhaustedError(OpError):
    """A resource (memory, a quota) ran out."""

    error_code = RESOURCE_EXHAUSTED


class FailedPreconditionError(OpError):
    """The system is not in a state to do this, e.g. an uninitialized variable."""

    error_code = FAILED_PRECONDITION


class AbortedError(OpError):
    """The operation was aborted, e.g. a rendezvous aborted by a peer's failure."""

    error_code = ABORTED


class OutOfRangeError(OpError):
    """Iterated past the valid range, e.g. dequeue on a closed, drained queue."""

    error_code = OUT_OF_RANGE


class UnimplementedError(OpError):
    """The operation is not implemented or not supported."""

    error_code = UNIMPLEMENTED


class InternalError(OpError):
    """An invariant of the runtime broke: a bug in asyncflow."""

    error_code = INTERNAL


class UnavailableError(OpError):
    """A service (a worker, a server) is unavailable right now."""

    error_code = UNAVAILABLE


class DataLossError(OpError):
    """Unrecoverable data loss or corruption."""

    error_code = DATA_LOSS


_CODE_TO_TYPE: dict[int, type[OpError]] = {
    cls.error_code: cls
    for cls in (
        CancelledError,
        UnknownError,
        InvalidArgumentError,
        DeadlineExceededError,
        NotFoundError,
        AlreadyExistsError,
        PermissionDeniedError,
        ResourceExhaustedError,
        FailedPreconditionError,
        AbortedError,
        OutOfRangeError,
        UnimplementedError,
        InternalError,
        UnavailableError,
        DataLossError,
    )
}

# Python exceptions a kernel may raise, mapped as TensorFlow's py_func does
# (ValueError/TypeError -> INVALID_ARGUMENT, StopIteration -> OUT_OF_RANGE, ...).
# Order matters: the first matching class wins, so subclasses come first.
_BUILTIN_TO_TYPE: tuple[tuple[type[BaseException], type[OpError]], ...] = (
    (TimeoutError, DeadlineExceededError),
    (FileNotFoundError, NotFoundError),
    (FileExistsError, AlreadyExistsError),
    (PermissionError, PermissionDeniedError),
    (ConnectionError, UnavailableError),
    (ValueError, InvalidArgumentError),
    (TypeError, InvalidArgumentError),
    (StopIteration, OutOfRangeError),
    (StopAsyncIteration, OutOfRangeError),
    (IndexError, OutOfRangeError),
    (MemoryError, ResourceExhaustedError),
    (NotImplementedError, UnimplementedError),
)


def exception_type_from_error_code(error_code: int) -> type[OpError]:
    """The ``OpError`` subclass for a TensorFlow error code (unknown codes: ``UnknownError``)."""
    return _CODE_TO_TYPE.get(error_code, UnknownError)


def from_exception(exc: BaseException, op: NodeLike | None = None, prefix: str = "") -> OpError:
    """The ``OpError`` a kernel's exception becomes; ``prefix`` is prepended to the message.

    An ``OpError`` keeps its type and message; other exceptions map to the matching
    code (unknown ones to ``UnknownError``).  The caller chains ``exc`` as the cause.
    """
    detail = str(exc) or type(exc).__name__
    if isinstance(exc, OpError):
        return type(exc)(exc.node_def, op or exc.op, prefix + exc.message)
    for builtin, mapped in _BUILTIN_TO_TYPE:
        if isinstance(exc, builtin):
            return mapped(None, op, f"{prefix}{type(exc).__name__}: {detail}")
    return UnknownError(None, op, f"{prefix}{type(exc).__name__}: {detail}")
