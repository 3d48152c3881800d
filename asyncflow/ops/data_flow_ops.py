"""Queues: ``af.FIFOQueue`` (TF 1.x ``tf.queue.FIFOQueue``).

The queue itself is a session resource (:class:`FIFOQueueResource`): a ``FIFOQueueV2``
op looks it up or creates it (queues with one ``shared_name`` share state; an
incompatible redefinition is an ``InvalidArgumentError`` naming what differs) and
outputs its handle, which the enqueue / dequeue / close / size ops take as input.
Enqueue and dequeue are async kernels: a full or empty queue makes them wait on the
event loop, holding no thread.  Each has a ``nowait`` twin the step tries first: an
enqueue with room, a dequeue with elements (and nobody waiting ahead of it) finishes
at once, with no task and no future.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from asyncflow import dtypes, errors
from asyncflow.framework import registry
from asyncflow.framework.graph import Operation, Tensor, convert_to_tensor, get_default_graph
from asyncflow.framework.shapes import TensorShape, as_shape, unknown_shape
from asyncflow.ops._base import define_op
from asyncflow.runtime.resources import WOULD_BLOCK, FIFOQueueResource, QueueSpec, ResourceMgr

__all__ = ["FIFOQueue"]


def _handle_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Any]:
    return [(dtypes.string, TensorShape(()))]


def _no_outputs(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Any]:
    return []


def _dequeue_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Any]:
    n = attrs.get("n")
    out = []
    for dt, shape in zip(attrs["component_types"], attrs["shapes"]):
        if n is None:
            out.append((dt, shape))
        elif shape.dims is None:
            out.append((dt, unknown_shape()))
        else:
            out.append((dt, TensorShape([n, *shape.dims])))
    return out


def _size_shape(inputs: Sequence[Tensor], attrs: Mapping[str, Any]) -> list[Any]:
    return [(dtypes.int32, TensorShape(()))]


define_op("FIFOQueueV2", _handle_shape, stateful=True)
define_op("QueueEnqueueV2", _no_outputs, stateful=True)
define_op("QueueEnqueueManyV2", _no_outputs, stateful=True)
define_op("QueueDequeueV2", _dequeue_shape, stateful=True)
define_op("QueueDequeueManyV2", _dequeue_shape, stateful=True)
define_op("QueueCloseV2", _no_outputs, stateful=True)
define_op("QueueSizeV2", _size_shape, stateful=True)


def _spec(attrs: Mapping[str, Any]) -> QueueSpec:
    return QueueSpec(
        capacity=attrs["capacity"],
        dtypes=tuple(dt.name for dt in attrs["component_types"]),
        shapes=tuple(None if s.dims is None else tuple(s.dims) for s in attrs["shapes"]),
    )


def _queue(op: Operation, resources: ResourceMgr) -> Callable[[], FIFOQueueResource]:
    attrs = op._attrs
    name = attrs["shared_name"]
    container = attrs.get("container", "")
    spec = _spec(attrs)
    # The queue this kernel last found and checked: while the manager still holds it
    # (one dict read), it needs no type or spec check again.
    checked: list[FIFOQueueResource | None] = [None]

    def get() -> FIFOQueueResource:
        found = checked[0]
        if found is not None and resources.get(container, name) is found:
            return found
        found = checked[0] = resources.lookup_or_create(
            container,
            name,
            FIFOQueueResource,
            lambda: FIFOQueueResource(name, spec),
            lambda q: q.check(spec),
        )
        return found

    return get


@registry.register_kernel_factory("FIFOQueueV2", needs_resources=True)
def _queue_kernel(op: Operation, resources: ResourceMgr) -> tuple[Callable[..., Any], int]:
    get = _queue(op, resources)
    handle = np.array(op._attrs["shared_name"], dtype=object)[()]

    def make() -> Any:
        get()
        return handle

    return make, registry.INLINE


def _converter(op: Operation) -> Callable[[Sequence[Any], bool], list[tuple[Any, ...]]]:
    attrs = op._attrs
    types = [dt.np for dt in attrs["component_types"]]
    shapes = [s.dims for s in attrs["shapes"]]
    queue = attrs["shared_name"]
    # The common enqueue: each component a numpy scalar of its dtype (what a fed or
    # computed 0-d value is) into a scalar (or unknown) shape: stored as it is.
    scalars = tuple(
        np.dtype(dt).type if dims is None or not dims else None for dt, dims in zip(types, shapes)
    )

    def convert(values: Sequence[Any], many: bool) -> list[tuple[Any, ...]]:
        if (
            not many
            and len(values) == len(scalars)
            and all(type(v) is t for v, t in zip(values, scalars))
        ):
            return [tuple(values)]
        arrays = []
        for k, (v, dt, dims) in enumerate(zip(values, types, shapes)):
            a = np.asarray(v, dtype=dt)
            item_shape = a.shape[1:] if many else a.shape
            if dims is not None and (
                len(item_shape) != len(dims)
                or any(d is not None and d != s for d, s in zip(dims, item_shape))
            ):
                raise errors.InvalidArgumentError(
                    None,
                    None,
                    f"Shape mismatch in tuple component {k} of queue {queue!r}: "
                    f"expected {list(dims)}, got {list(item_shape)}",
                )
            arrays.append(a)
        if not many:
            return [tuple(a[()] if a.ndim == 0 else a for a in arrays)]
        n = arrays[0].shape[0] if arrays and arrays[0].ndim else None
        if n is None or any(a.ndim == 0 or a.shape[0] != n for a in arrays):
            raise errors.InvalidArgumentError(
                None,
                None,
                f"enqueue_many on queue {queue!r} needs components with one "
                f"leading batch dimension, got shapes "
                f"{[list(a.shape) for a in arrays]}",
            )
        return [tuple(a[i][()] if a[i].ndim == 0 else a[i] for a in arrays) for i in range(n)]

    return convert


@registry.register_kernel_factory("QueueEnqueueV2", needs_resources=True)
@registry.register_kernel_factory("QueueEnqueueManyV2", needs_resources=True)
def _enqueue_kernel(op: Operation, resources: ResourceMgr) -> tuple[Callable[..., Any], int]:
    get = _queue(op, resources)
    convert = _converter(op)
    many = op._type == "QueueEnqueueManyV2"

    async def enqueue(handle: Any, *components: Any) -> None:
        await get().put(convert(components, many))

    def enqueue_nowait(handle: Any, *components: Any) -> Any:
        return None if get().put_nowait(convert(components, many)) else WOULD_BLOCK

    enqueue.nowait = enqueue_nowait  # type: ignore[attr-defined]
    return enqueue, registry.ASYNC


@registry.register_kernel_factory("QueueDequeueV2", needs_resources=True)
@registry.register_kernel_factory("QueueDequeueManyV2", needs_resources=True)
def _dequeue_kernel(op: Operation, resources: ResourceMgr) -> tuple[Callable[..., Any], int]:
    get = _queue(op, resources)
    n = op._attrs.get("n")
    types = [dt.np for dt in op._attrs["component_types"]]
    single = len(types) == 1
    # dequeue_many(0) gives [0, *component shape] (TF), [0] when the shape is unknown.
    empty_shapes = [
        (0,) if s.dims is None or None in s.dims else (0, *s.dims) for s in op._attrs["shapes"]
    ] or [(0,)] * len(types)

    def values_of(elements: list[tuple[Any, ...]]) -> Any:
        if n is None:
            values = list(elements[0])
        else:
            values = [
                np.stack([np.asarray(e[k]) for e in elements]).astype(dt, copy=False)
                if elements
                else np.empty(empty_shapes[k], dt)
                for k, dt in enumerate(types)
            ]
        return values[0] if single else values

    async def dequeue(handle: Any) -> Any:
        return values_of(await get().get(1 if n is None else n))

    def dequeue_nowait(handle: Any) -> Any:
        elements = get().get_nowait(1 if n is None else n)
        return WOULD_BLOCK if elements is None else values_of(elements)

    dequeue.nowait = dequeue_nowait  # type: ignore[attr-defined]
    return dequeue, registry.ASYNC


@registry.register_kernel_factory("QueueCloseV2", needs_resources=True)
def _close_kernel(op: Operation, resources: ResourceMgr) -> tuple[Callable[..., Any], int]:
    get = _queue(op, resources)
    cancel = bool(op._attrs["cancel_pending_enqueues"])
    return (lambda handle: get().close(cancel)), registry.INLINE


@registry.register_kernel_factory("QueueSizeV2", needs_resources=True)
def _size_kernel(op: Operation, resources: ResourceMgr) -> tuple[Callable[..., Any], int]:
    get = _queue(op, resources)
    return (lambda handle: np.int32(get().size())), registry.INLINE


class FIFOQueue:
    """A queue of tuples of tensors, first in first out (TF 1.x ``FIFOQueue``).

    ``enqueue(value)`` / ``enqueue((c0, c1))``, ``enqueue_many((batch0, batch1))``,
    ``dequeue()`` (a Tensor for one component, a list for several),
    ``dequeue_many(n)``, ``close(cancel_pending_enqueues=False)``, ``size()``.
    Dequeue on a closed queue without enough elements → ``OutOfRangeError``;
    enqueue on a closed queue → ``CancelledError``.

    What a step that fails, times out or is cancelled has done to a queue (TF's rule):

    * a dequeue still *waiting* for elements takes none;
    * a dequeue handed its elements whose step is cancelled before the dequeue
      returned gives them back to the front of the queue, in order;
    * a dequeue that *returned* inside a step that later fails (another node's error,
      a deadline while other work still ran) has consumed its elements, as in TF;
    * a step whose every node finished is reported finished, with its results, even
      when its deadline or a ``close()`` lands in the same loop iteration;
    * an enqueue that returned has put its elements, whatever happens to its step
      afterwards; one cancelled while waiting for room puts the elements it has not
      put yet nowhere (``enqueue_many`` may have put a prefix).
    """

    def __init__(
        self,
        capacity: int,
        dtypes: Any,
        shapes: Any = None,
        names: Any = None,
        shared_name: str | None = None,
        name: str = "fifo_queue",
    ) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
            raise ValueError(f"FIFOQueue capacity must be a positive int, got {capacity!r}")
        from asyncflow.dtypes import as_dtype

        types = [as_dtype(d) for d in (dtypes if isinstance(dtypes, list | tuple) else [dtypes])]
        if shapes is None:
            shape_list = [unknown_shape() for _ in types]
        else:
            raw = (
                shapes
                if isinstance(shapes, list | tuple)
                and shapes
                and isinstance(shapes[0], list | tuple | TensorShape)
                else [shapes]
            )
            shape_list = [as_shape(s) for s in raw]
            if len(shape_list) != len(types):
                raise ValueError(f"FIFOQueue: {len(types)} dtypes but {len(shape_list)} shapes")
        graph = get_default_graph()
        self._graph = graph
        self._dtypes = types
        self._shapes = shape_list
        op = graph.create_op(
            "FIFOQueueV2",
            (),
            {
                "capacity": capacity,
                "component_types": types,
                "shapes": shape_list,
                "container": "",
                "shared_name": shared_name or "",
            },
            name=name,
        )
        if not shared_name:
            op._attrs["shared_name"] = op.name  # the queue is private to this op
        self._op = op
        self._attrs = {
            k: op._attrs[k]
            for k in ("capacity", "component_types", "shapes", "container", "shared_name")
        }

    @property
    def queue_ref(self) -> Tensor:
        """The queue's handle."""
        return self._op.outputs[0]

    @property
    def name(self) -> str:
        """The queue op's name."""
        return self._op.name

    @property
    def dtypes(self) -> list[dtypes.DType]:
        """The component dtypes."""
        return list(self._dtypes)

    @property
    def shapes(self) -> list[TensorShape]:
        """The component shapes."""
        return list(self._shapes)

    def _components(self, vals: Any, many: bool) -> list[Tensor]:
        values = list(vals) if isinstance(vals, list | tuple) else [vals]
        if len(self._dtypes) == 1 and len(values) != 1:
            values = [vals]
        if len(values) != len(self._dtypes):
            raise ValueError(
                f"queue {self.name!r} has {len(self._dtypes)} components, got {len(values)} values"
            )
        out = []
        for k, (v, dt, shape) in enumerate(zip(values, self._dtypes, self._shapes)):
            t = convert_to_tensor(v, dtype=dt)
            item = t.shape[1:] if many and t.shape.rank else t.shape
            if not shape.is_compatible_with(item):
                raise ValueError(
                    f"queue {self.name!r}: component {k} has shape {item}, expected {shape}"
                )
            out.append(t)
        return out

    def _op_with(
        self, op_type: str, inputs: Sequence[Tensor], extra: Mapping[str, Any], name: str | None
    ) -> Operation:
        with self._graph.colocate_with(self._op):
            return self._graph.create_op(
                op_type, (self.queue_ref, *inputs), {**self._attrs, **extra}, name=name or op_type
            )

    def enqueue(self, vals: Any, name: str | None = None) -> Operation:
        """Enqueue one element (a value, or a tuple with one value per component)."""
        return self._op_with("QueueEnqueueV2", self._components(vals, False), {}, name)

    def enqueue_many(self, vals: Any, name: str | None = None) -> Operation:
        """Enqueue a batch: one array per component, sliced along the first dimension."""
        return self._op_with("QueueEnqueueManyV2", self._components(vals, True), {}, name)

    def dequeue(self, name: str | None = None) -> Any:
        """Dequeue one element: a Tensor for one component, a list for several."""
        op = self._op_with("QueueDequeueV2", (), {}, name)
        return op.outputs[0] if len(op.outputs) == 1 else list(op.outputs)

    def dequeue_many(self, n: int, name: str | None = None) -> Any:
        """Dequeue ``n`` elements, stacked along a new first dimension."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"dequeue_many: n must be an int >= 0, got {n!r}")
        op = self._op_with("QueueDequeueManyV2", (), {"n": n}, name)
        return op.outputs[0] if len(op.outputs) == 1 else list(op.outputs)

    def close(self, cancel_pending_enqueues: bool = False, name: str | None = None) -> Operation:
        """Close the queue (optionally cancelling enqueues that are waiting)."""
        return self._op_with(
            "QueueCloseV2", (), {"cancel_pending_enqueues": cancel_pending_enqueues}, name
        )

    def size(self, name: str | None = None) -> Tensor:
        """The number of queued elements."""
        return self._op_with("QueueSizeV2", (), {}, name).outputs[0]

    def __repr__(self) -> str:
        return f"<af.FIFOQueue {self.name!r} dtypes={[d.name for d in self._dtypes]}>"
