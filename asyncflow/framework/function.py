"""Graph functions: ``af.Defun`` and the function library (TF 1.x ``function.Defun``).

``@af.Defun(af.float32, af.float32)`` turns a Python function into a graph function:
its body is traced once, on first use, into a function graph (:class:`FuncGraph`)
whose arguments are placeholders of the declared types.  Calling the decorated
object in a graph adds the function's definition (and those of the functions it
calls) to the graph's library and one *call op* whose type is the function's name;
its outputs have the dtypes and shapes of the body's results.

Tensors of the enclosing graph used inside the body are *captured* (TF's
``_FuncGraph``): each becomes an extra placeholder of the body and an extra input
of every call, after the declared ones.  The compiler either inlines the body in
place of the call or, with inlining off, a call kernel runs it as a nested step
(``_Arg`` in, ``_Retval`` out).
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from asyncflow import dtypes as _dtypes
from asyncflow.framework.graph import Graph, Operation, Tensor, convert_to_tensor, get_default_graph
from asyncflow.framework.registry import OpDef
from asyncflow.framework.shapes import TensorShape

__all__ = ["DefinedFunction", "Defun", "FuncGraph", "FunctionDef"]


class FuncGraph(Graph):
    """The graph a function body is traced into; captures tensors of ``outer``."""

    def __init__(self, name: str, outer: Graph | None) -> None:
        super().__init__()
        self.function_name = name
        self.outer = outer
        #: outer tensor -> its placeholder in this body, in capture order
        self.captures: dict[Tensor, Tensor] = {}
        #: what each capture stands for in ``outer`` (the extra inputs of a call there)
        self._outer_tensors: list[Tensor] = []

    def _can_capture(self, graph: Graph) -> bool:
        g: Graph | None = self.outer
        while g is not None:
            if g is graph:
                return True
            g = g.outer if isinstance(g, FuncGraph) else None
        return False

    def capture(self, t: Tensor) -> Tensor:
        """The body's placeholder standing for outer tensor ``t`` (made once)."""
        placeholder = self.captures.get(t)
        if placeholder is not None:
            return placeholder
        source = t._op._graph
        if self.outer is None or not self._can_capture(source):
            raise ValueError(
                f"function {self.function_name!r} uses tensor {t.name!r} of "
                f"a graph it is not defined in"
            )
        if source is not self.outer:  # defined further out: the enclosing body captures first
            assert isinstance(self.outer, FuncGraph)
            outer_t = self.outer.capture(t)
        else:
            outer_t = t
        # Outside any cond / loop / control dependency of the body: the value is an
        # argument of the whole call.
        with (
            self._control_flow_context(None),
            self.control_dependencies(None),
            self.name_scope(None),
            self.device(None),
        ):
            placeholder = Graph.create_op(
                self,
                "Placeholder",
                (),
                {"dtype": t._dtype, "shape": t._shape},
                name=f"captured_{len(self.captures)}",
            ).outputs[0]
        self.captures[t] = placeholder
        self._outer_tensors.append(outer_t)
        return placeholder

    def create_op(
        self,
        op_type: str,
        inputs: Sequence[Tensor],
        attrs: Any = None,
        name: str | None = None,
        *,
        control_inputs: Iterable[Operation] = (),
    ) -> Operation:
        inputs = [
            self.capture(t) if isinstance(t, Tensor) and t._op._graph is not self else t
            for t in inputs
        ]
        for c in control_inputs:
            if isinstance(c, Operation) and c._graph is not self:
                raise ValueError(
                    f"function {self.function_name!r}: control input {c.name!r} "
                    f"is from another graph (a body may only capture tensors)"
                )
        return super().create_op(op_type, inputs, attrs, name, control_inputs=control_inputs)


class FunctionDef:
    """A function of a graph's library: its traced body and signature.

    ``args`` names the body's argument placeholders (declared ones, then captured
    ones); ``rets`` are the body tensors returned.  ``op_def`` is what call ops of
    this function are built with.
    """

    __slots__ = ("_ir", "args", "body", "name", "num_declared", "op_def", "out_names", "rets")

    def __init__(
        self,
        name: str,
        body: Graph,
        args: Sequence[str],
        num_declared: int,
        rets: Sequence[Tensor],
        out_names: Sequence[str],
    ) -> None:
        self.name = name
        self.body = body
        self.args = tuple(args)
        self.num_declared = num_declared
        self.rets = tuple(rets)
        self.out_names = tuple(out_names)
        self._ir: Any = None  # the compiler's value form, made once (compiler/ir.py)
        stateful = any(
            op._op_def.stateful for op in body.get_operations() if op._type != "Placeholder"
        )
        self.op_def = OpDef(name, self._shape_fn, stateful=stateful)

    @property
    def input_types(self) -> tuple[_dtypes.DType, ...]:
        """The dtypes of every argument (declared, then captured)."""
        return tuple(self.body.get_operation_by_name(a)._attrs["dtype"] for a in self.args)

    def _shape_fn(self, inputs: Sequence[Tensor], attrs: Any) -> list[tuple[Any, Any]]:
        types = self.input_types
        if len(inputs) != len(types):
            raise TypeError(f"function {self.name!r} takes {len(types)} inputs, got {len(inputs)}")
        for k, (t, dt) in enumerate(zip(inputs, types)):
            if t.dtype is not dt:
                raise TypeError(
                    f"function {self.name!r}: input {k} must be {dt.name}, "
                    f"got {t.dtype.name} ({t.name!r})"
                )
        return [(t._dtype, t._shape) for t in self.rets]

    def functions(self) -> list[FunctionDef]:
        """This function and every function its body calls (callees first)."""
        out: list[FunctionDef] = []
        for f in self.body._functions.values():
            out.extend(f.functions())
        out.append(self)
        return out

    def __repr__(self) -> str:
        return f"<FunctionDef {self.name!r} args={len(self.args)} rets={len(self.rets)}>"


def add_to_library(graph: Graph, fdef: FunctionDef) -> None:
    """Add ``fdef`` and its callees to ``graph``'s library (``ValueError`` when another
    function of the same name is there already)."""
    for f in fdef.functions():
        other = graph._functions.get(f.name)
        if other is None:
            graph._functions[f.name] = f
        elif other is not f and _fingerprint(other) != _fingerprint(f):
            raise ValueError(f"graph {graph!r} already has a different function named {f.name!r}")


class DefinedFunction:
    """A Python function made a graph function by :class:`Defun`; call it on tensors."""

    def __init__(
        self,
        func: Callable[..., Any],
        input_types: Sequence[Any],
        func_name: str | None,
        out_names: Sequence[str] | None,
    ) -> None:
        self._func = func
        self._input_types = tuple(_dtypes.as_dtype(t) for t in input_types)
        self._func_name = func_name
        self._out_names = tuple(out_names) if out_names is not None else None
        self._definition: FunctionDef | None = None
        self._captured: tuple[Tensor, ...] = ()
        functools.update_wrapper(self, func)

    @property
    def name(self) -> str:
        """The function's name: the type of its call ops."""
        return self.definition.name

    @property
    def definition(self) -> FunctionDef:
        """The traced definition (traced on first use, in the default graph)."""
        if self._definition is None:
            self._definition = self._trace(get_default_graph())
        return self._definition

    @property
    def captured_inputs(self) -> tuple[Tensor, ...]:
        """Tensors of the defining graph the body uses (extra inputs of every call)."""
        _ = self.definition
        return self._captured

    @property
    def declared_input_types(self) -> tuple[_dtypes.DType, ...]:
        """The dtypes given to ``Defun``."""
        return self._input_types

    def _trace(self, outer: Graph) -> FunctionDef:
        pyname = re.sub(r"\W", "_", getattr(self._func, "__name__", "function"))
        body = FuncGraph(self._func_name or pyname, outer)
        with body.as_default():
            params = _param_names(self._func, len(self._input_types))
            args = [
                Graph.create_op(
                    body, "Placeholder", (), {"dtype": dt, "shape": TensorShape(None)}, name=n
                ).outputs[0]
                for n, dt in zip(params, self._input_types)
            ]
            result = self._func(*args)
            outs = _as_outputs(result, body, pyname)
        n_out = len(outs)
        out_names = self._out_names or tuple(f"output_{k}" for k in range(n_out))
        if len(out_names) != n_out:
            raise ValueError(
                f"function {pyname!r} returns {n_out} values but out_names has {len(out_names)}"
            )
        arg_names = [a._op._name for a in args] + [p._op._name for p in body.captures.values()]
        fdef = FunctionDef("", body, arg_names, len(args), outs, out_names)
        fdef.name = self._func_name or f"{pyname}_{_fingerprint(fdef)[:12]}"
        body.function_name = fdef.name
        fdef.op_def = OpDef(fdef.name, fdef._shape_fn, stateful=fdef.op_def.stateful)
        self._captured = tuple(body._outer_tensors)
        return fdef

    def __call__(self, *args: Any, name: str | None = None) -> Any:
        graph = get_default_graph()
        fdef = self.definition
        if len(args) != len(self._input_types):
            raise TypeError(
                f"function {fdef.name!r} takes {len(self._input_types)} arguments, got {len(args)}"
            )
        tensors = []
        for k, (a, dt) in enumerate(zip(args, self._input_types)):
            try:
                tensors.append(convert_to_tensor(a, dtype=dt))
            except TypeError as exc:
                raise TypeError(f"function {fdef.name!r}, argument {k}: {exc}") from None
        captured = self._captured
        for t in (*tensors, *captured):
            if t._op._graph is not graph and not graph._can_capture(t._op._graph):
                raise ValueError(
                    f"function {fdef.name!r} is called in graph {graph!r} but "
                    f"its input {t.name!r} is from another graph"
                )
        add_to_library(graph, fdef)
        op = graph.create_op(fdef.name, [*tensors, *captured], name=name or fdef.name)
        if not op.outputs:
            return op
        return op.outputs[0] if len(op.outputs) == 1 else tuple(op.outputs)


class Defun:
    """Decorator: ``@af.Defun(af.float32, af.float32)`` makes a graph function
    (TF 1.x ``function.Defun``).

    The body is traced once into the graph's function library; calling the result
    on tensors adds a call op whose type is the function's name.  ``func_name``
    names the function (default: the Python name and a hash of the definition);
    ``out_names`` names its outputs.  Wrong arity or dtypes at a call raise
    ``TypeError`` naming the function.
    """

    def __init__(
        self,
        *input_types: Any,
        func_name: str | None = None,
        out_names: Sequence[str] | None = None,
    ) -> None:
        self._input_types = input_types
        self._func_name = func_name
        self._out_names = out_names

    def __call__(self, func: Callable[..., Any]) -> DefinedFunction:
        if not callable(func):
            raise TypeError(f"Defun decorates a function, got {type(func).__name__}")
        return DefinedFunction(func, self._input_types, self._func_name, self._out_names)


def _param_names(func: Callable[..., Any], n: int) -> list[str]:
    import inspect

    try:
        params = [
            p.name
            for p in inspect.signature(func).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    names = params[:n] if len(params) >= n else [f"arg_{k}" for k in range(n)]
    return names


def _as_outputs(result: Any, body: FuncGraph, pyname: str) -> tuple[Tensor, ...]:
    if result is None:
        return ()
    items = list(result) if isinstance(result, list | tuple) else [result]
    outs = []
    for k, r in enumerate(items):
        if isinstance(r, Operation):
            raise TypeError(
                f"function {pyname!r} returns operation {r.name!r} (output {k}); return tensors"
            )
        t = convert_to_tensor(r)
        if t._op._graph is not body:
            t = body.capture(t)
        outs.append(t)
    return tuple(outs)


def _fingerprint(fdef: FunctionDef) -> str:
    """A hash of a definition (body ops, signature): equal bodies, equal names (TF)."""
    h = hashlib.sha1()
    for op in fdef.body.get_operations():
        h.update(f"{op._name}={op._type}(".encode())
        for t in op._inputs:
            h.update(f"{t.name},".encode())
        h.update(f"^{[c._name for c in op._control_inputs]}|{op._device}|".encode())
        for key in sorted(op._attrs):
            value = op._attrs[key]
            h.update(key.encode())
            h.update(value.tobytes() if isinstance(value, np.ndarray) else repr(value).encode())
    h.update(repr((fdef.args, fdef.num_declared, [t.name for t in fdef.rets])).encode())
    return h.hexdigest()
