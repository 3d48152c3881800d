"""Op definitions and kernels.

An :class:`OpDef` says what an op type is at build time: its shape function (which
also checks dtypes) and whether it is stateful.  A :class:`KernelDef` says how it
runs on a device type: a *factory* that, given the :class:`Operation`, returns the
callable the executor invokes and the kernel's kind:

* ``INLINE``    — cheap synchronous; called on the event loop inside the ready loop.
* ``ASYNC``     — ``async def``; awaited as a task of the step's task group.
* ``EXPENSIVE`` — synchronous but slow; run on a worker thread of its device.

The callable takes the node's input values positionally and returns the single
output value, a sequence of values for several outputs, or ``None`` for none.
Factories run once per compiled plan, never per step, so they are the place to
bind attributes (``functools.partial``) and pick specialised numpy functions.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from asyncflow import errors

if TYPE_CHECKING:
    from asyncflow.dtypes import DType
    from asyncflow.framework.graph import Operation, Tensor
    from asyncflow.framework.shapes import TensorShape

__all__ = [
    "ASYNC",
    "CALL",
    "CONTROL",
    "EXPENSIVE",
    "INLINE",
    "KERNEL_KINDS",
    "RECV",
    "SEND",
    "KernelDef",
    "OpDef",
    "find_op_def",
    "get_kernel",
    "get_op_def",
    "register_kernel",
    "register_kernel_factory",
    "registered_ops",
]

INLINE = 0
ASYNC = 1
EXPENSIVE = 2
#: ``_Send`` / ``_Recv``: the kernel takes the step's rendezvous as first argument.
SEND = 3
RECV = 4
#: Switch / Merge / Enter / Exit / NextIteration: executed by the frame-aware
#: executor itself (they route values between frames and iterations).
CONTROL = 5
KERNEL_KINDS = ("inline", "async", "thread", "send", "recv", "control")

#: The op type the kernel of a function call is registered under (TF's
#: ``PartitionedCall``): a call node's own type is its function's name, so its kernel
#: is not found by type.  Its factory is ``factory(node, device, resources, bodies,
#: executor_options)``: the body is compiled and bound once per plan (``bodies``
#: shares it between the plan's calls) and runs as the caller's steps do.
CALL = "_Call"

ShapeFn = Callable[
    [Sequence["Tensor"], Mapping[str, Any]], Sequence[tuple["DType", "TensorShape | Any"]]
]
KernelFactory = Callable[["Operation"], tuple[Callable[..., Any], int]]


@dataclass(frozen=True, slots=True)
class OpDef:
    """What an op type is at build time.

    ``shape_fn(inputs, attrs)`` returns one ``(dtype, shape)`` per output and raises
    ``TypeError`` / ``ValueError`` for bad inputs (the graph adds the op's name).
    """

    type: str
    shape_fn: ShapeFn
    stateful: bool = False
    #: May tensors of this op be fed?  (TF: every tensor unless marked unfeedable.)
    feedable: bool = True


@dataclass(frozen=True, slots=True)
class KernelDef:
    """How an op type runs on one device type.

    ``needs_resources``: the factory is called ``factory(op, resources)`` with the
    session's resource manager (variables, queues), once per plan.
    """

    op_type: str
    device_type: str
    factory: Callable[..., tuple[Callable[..., Any], int]]
    needs_resources: bool = False
    #: The factory returns the same kernel whatever the op (no attribute bound, no
    #: specialisation): binding may call it once per op type.
    static: bool = False

    def instantiate(self, op: Operation, resources: Any = None) -> tuple[Callable[..., Any], int]:
        """The kernel callable and its kind for ``op``."""
        if self.needs_resources:
            if resources is None:
                raise errors.FailedPreconditionError(
                    None, op, f"op {op.name!r} ({self.op_type}) needs a session's resources"
                )
            return self.factory(op, resources)
        return self.factory(op)


_lock = threading.Lock()
_OPS: dict[str, OpDef] = {}
_KERNELS: dict[tuple[str, str], KernelDef] = {}


def _add_op_def(op_def: OpDef) -> None:
    with _lock:
        if op_def.type in _OPS:
            raise errors.AlreadyExistsError(
                None, None, f"op type {op_def.type!r} is already registered"
            )
        _OPS[op_def.type] = op_def


#: The OpDef of a type, or None: a bare dict lookup for the graph's hot path.
find_op_def = _OPS.get


def get_op_def(op_type: str) -> OpDef:
    """The OpDef of ``op_type``; ``ValueError`` naming it when unregistered."""
    try:
        return _OPS[op_type]
    except KeyError:
        raise ValueError(
            f"op type {op_type!r} is not registered (register it with af.register_op)"
        ) from None


def registered_ops() -> tuple[str, ...]:
    """The names of every registered op type, sorted."""
    return tuple(sorted(_OPS))


def get_kernel(op_type: str, device_type: str = "CPU") -> KernelDef:
    """The kernel of ``op_type`` on ``device_type``; ``NotFoundError`` when there is none."""
    try:
        return _KERNELS[(op_type, device_type)]
    except KeyError:
        raise errors.NotFoundError(
            None,
            None,
            f"no kernel registered for op type {op_type!r} on device type {device_type!r}",
        ) from None


def register_kernel_factory(
    op_type: str,
    device_type: str = "CPU",
    *,
    needs_resources: bool = False,
    static: bool = False,
) -> Callable[[Any], Any]:
    """Decorator: register a kernel *factory* (``op -> (callable, kind)``) for ``op_type``.

    With ``needs_resources=True`` the factory is ``(op, resources) -> (callable, kind)``.
    ``static=True`` promises it returns the same kernel for every op (see KernelDef).
    """

    def decorate(factory: Any) -> Any:
        with _lock:
            _KERNELS[(op_type, device_type)] = KernelDef(
                op_type, device_type, factory, needs_resources, static
            )
        return factory

    return decorate


def register_kernel(
    op_type: str,
    compute: Callable[..., Any] | None = None,
    *,
    device_type: str = "CPU",
    expensive: bool = False,
) -> Any:
    """Register ``compute(*inputs, **attrs)`` as the kernel of ``op_type``.

    ``compute`` may be ``def`` (run inline, or on a worker thread when
    ``expensive=True``) or ``async def`` (awaited on the event loop).  The op's
    attributes are passed as keyword arguments.  Usable as a decorator.
    """
    if compute is None:
        return functools.partial(
            register_kernel, op_type, device_type=device_type, expensive=expensive
        )
    if inspect.iscoroutinefunction(compute):
        if expensive:
            raise ValueError(
                f"kernel for {op_type!r}: an async def kernel cannot be "
                f"expensive (expensive kernels run on threads)"
            )
        kind = ASYNC
    else:
        kind = EXPENSIVE if expensive else INLINE

    def factory(op: Operation) -> tuple[Callable[..., Any], int]:
        attrs = op.node_attrs()
        return (functools.partial(compute, **attrs) if attrs else compute), kind

    register_kernel_factory(op_type, device_type)(factory)
    return compute


def define_op(
    op_type: str, shape_fn: ShapeFn, *, stateful: bool = False, feedable: bool = True
) -> OpDef:
    """Register an op type (built-in ones' names may start with ``_``; a user's
    constructor comes from ``asyncflow.ops._base.register_op``, which builds on the
    graph: this module imports nothing of asyncflow but its errors)."""
    op_def = OpDef(op_type, shape_fn, stateful=stateful, feedable=feedable)
    _add_op_def(op_def)
    return op_def
