"""Test helpers: :func:`reference_run`, a tiny sequential reference interpreter.

``reference_run`` is the oracle that property tests compare the executor against,
so it is deliberately naive and shares no code with ``asyncflow.compiler`` or
``asyncflow.runtime``: it walks the graph from the fetches with an explicit stack
(deep chains do not hit the recursion limit), runs each needed op exactly once by
calling the kernel its factory returns, and honours control inputs and feeds.

It does not implement control-flow frames (Switch/Merge dead tensors, loops),
partitions, devices or sessions' resource managers.  Kernel exceptions propagate
unchanged; numpy floating-point warnings are silenced as in a real step.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from asyncflow.framework import registry
from asyncflow.framework.graph import Graph, Operation, Tensor, get_default_graph
from asyncflow.runtime.resources import ResourceMgr

__all__ = ["reference_run"]


def reference_run(
    fetches: Any,
    feed_dict: Mapping[Any, Any] | None = None,
    graph: Graph | None = None,
    *,
    check_dtypes: bool = True,
    resources: ResourceMgr | None = None,
) -> Any:
    """Evaluate ``fetches`` sequentially; the result has the structure of ``fetches``.

    ``fetches`` is a Tensor, an Operation (gives ``None``), a tensor or op name, or a
    nested list / tuple / namedtuple / dict of these.  ``feed_dict`` maps Tensors or
    ``"op:0"`` names to values (converted to the tensor's dtype).  0-d results are
    numpy scalars, others ``np.ndarray``.  With ``check_dtypes`` an ``AssertionError``
    names any op whose kernel returned a dtype other than the one it declared.
    ``resources`` carries variables and queues from one call to the next (a session's
    state); by default every call starts from a fresh resource manager.
    """
    if graph is None:
        graph = _graph_of(fetches) or get_default_graph()
    feeds: dict[Tensor, Any] = {}
    for key, value in (feed_dict or {}).items():
        t = graph.as_graph_element(key, allow_operation=False)
        assert isinstance(t, Tensor)
        feeds[t] = np.asarray(value, dtype=t.dtype.np)
    interpreter = _Interpreter(feeds, check_dtypes, resources)
    with np.errstate(all="ignore"):
        return _map_structure(fetches, lambda leaf: interpreter.fetch(graph, leaf))


def _graph_of(fetches: Any) -> Graph | None:
    found: list[Graph] = []

    def visit(leaf: Any) -> None:
        if isinstance(leaf, Tensor | Operation):
            found.append(leaf.graph)
        return None

    _map_structure(fetches, visit)
    return found[0] if found else None


def _map_structure(structure: Any, fn: Any) -> Any:
    ctor: Any = type(structure)
    if isinstance(structure, Mapping):
        return ctor({k: _map_structure(v, fn) for k, v in structure.items()})
    if isinstance(structure, tuple) and hasattr(structure, "_fields"):
        return ctor(*(_map_structure(v, fn) for v in structure))
    if isinstance(structure, list | tuple):
        return ctor(_map_structure(v, fn) for v in structure)
    return fn(structure)


class _Interpreter:
    """Memoized evaluation of ops; one instance per :func:`reference_run` call."""

    def __init__(
        self, feeds: dict[Tensor, Any], check_dtypes: bool, resources: ResourceMgr | None = None
    ) -> None:
        self.feeds = feeds
        self.check_dtypes = check_dtypes
        self.done: dict[Operation, tuple[Any, ...]] = {}
        # Stateful ops (variables, queues) get a fresh resource manager per run
        # unless the caller passes one to keep state across runs.
        self._resources = ResourceMgr() if resources is None else resources

    def fetch(self, graph: Graph, leaf: Any) -> Any:
        element = graph.as_graph_element(leaf)
        if isinstance(element, Operation):
            self.run(element)
            return None
        if element in self.feeds:
            return _as_result(self.feeds[element])
        self.run(element.op)
        return _as_result(self.done[element.op][element.value_index])

    def value(self, t: Tensor) -> Any:
        if t in self.feeds:
            return self.feeds[t]
        return self.done[t.op][t.value_index]

    def run(self, target: Operation) -> None:
        """Run ``target`` after its data and control ancestors (explicit stack)."""
        stack: list[tuple[Operation, bool]] = [(target, False)]
        in_progress: set[Operation] = set()
        while stack:
            op, expanded = stack.pop()
            if op in self.done:
                continue
            if expanded:
                self.done[op] = self.compute(op)
                in_progress.discard(op)
                continue
            if op in in_progress:
                raise ValueError(
                    f"reference_run: cycle through op {op.name!r} "
                    f"(control-flow loops are not supported)"
                )
            in_progress.add(op)
            stack.append((op, True))
            # Pushed last → popped first: control inputs run before data inputs.
            for t in reversed(op.inputs):
                if t not in self.feeds and t.op not in self.done:
                    stack.append((t.op, False))
            for c in reversed(op.control_inputs):
                if c not in self.done:
                    stack.append((c, False))

    def compute(self, op: Operation) -> tuple[Any, ...]:
        function = op._graph._functions.get(op.type)
        if function is not None:
            result = self.call(function, [self.value(t) for t in op.inputs])
        else:
            fn, kind = registry.get_kernel(op.type).instantiate(op, self._resources)
            result = fn(*[self.value(t) for t in op.inputs])
            if kind == registry.ASYNC or inspect.isawaitable(result):
                result = _run_coroutine(result)
        n = len(op.outputs)
        if n == 0:
            return ()
        outputs = (result,) if n == 1 else tuple(result)
        if len(outputs) != n:
            raise AssertionError(
                f"kernel of op {op.name!r} returned {len(outputs)} values for {n} outputs"
            )
        if self.check_dtypes:
            for t, v in zip(op.outputs, outputs, strict=True):
                got = np.asarray(v).dtype
                if not t.dtype.is_string and got != t.dtype.np:
                    raise AssertionError(
                        f"kernel of op {op.name!r} (type {op.type}) "
                        f"returned {got} for output {t.name!r} declared "
                        f"{t.dtype.name}"
                    )
        return outputs

    def call(self, function: Any, args: list[Any]) -> Any:
        """A function call (``af.Defun``): its body evaluated on the call's inputs."""
        body = function.body
        feeds = {
            body.get_operation_by_name(a).outputs[0]: v
            for a, v in zip(function.args, args, strict=True)
        }
        inner = _Interpreter(feeds, self.check_dtypes)
        inner._resources = self._resources
        results = [inner.fetch(body, t) for t in function.rets]
        for op in body.get_operations():  # side effects run even when nothing uses them
            if op._op_def.stateful and op.type != "Placeholder":
                inner.run(op)
        return results[0] if len(results) == 1 else results


def _as_result(value: Any) -> Any:
    array = np.asarray(value)
    return array[()] if array.ndim == 0 else array


def _run_coroutine(coro: Any) -> Any:
    """Run ``coro`` on a fresh event loop in a helper thread (the caller's loop may be busy)."""
    box: dict[str, Any] = {}

    async def main() -> Any:
        return await coro

    def target() -> None:
        try:
            box["result"] = asyncio.run(main())
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="reference_run-async", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"]
