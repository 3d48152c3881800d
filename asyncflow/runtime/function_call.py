"""The call kernel: a function call the optimizer did not inline, run as a nested step.

TensorFlow runs such a call through its function library runtime: the body is
instantiated once (compiled and bound, here with the same pipeline as any run,
and with the caller's optimizer options) and every call runs it as a step of its
own whose ``FunctionCallFrame`` carries the call's inputs in (``_Arg``) and the
results out (``_Retval``).

The kernel is ASYNC and the nested step runs inside the call's task, on the one
executor (:class:`~asyncflow.runtime.step.Step`), so it shares everything the
caller's step has: its cancellation manager (a failure or cancel of either stops
the other's kernels), its deadline and cancellation (the call's task is in the
caller's task group, under the caller's timeout), its abort (the caller's first
error cancels the call's task) and its tracing (the body's node stats join the
caller's, named ``call/node``).  A body made only of inline kernels runs without
awaiting, like the session's fast path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asyncflow.compiler.ir import FUNCTION_ATTR, FunctionIR, GraphIR, NodeDef
from asyncflow.compiler.optimize import OPTIONS_ATTR
from asyncflow.compiler.pipeline import Compiled, compile_signature
from asyncflow.config import ExecutorOptions, OptimizerOptions
from asyncflow.framework import registry
from asyncflow.runtime.bind import BoundPlan, bind
from asyncflow.runtime.call_frame import CallFrame
from asyncflow.runtime.cancellation import get_cancellation_manager, running
from asyncflow.runtime.devices import LocalDevice
from asyncflow.runtime.step import SLICE, Step

__all__ = ["compile_body", "make_call_kernel"]

#: A body compiled without inlining keeps its own calls as call kernels.
_NOT_INLINED = OptimizerOptions(do_function_inlining=False)


def compile_body(fn: FunctionIR, device: str, options: OptimizerOptions) -> Compiled:
    """``fn``'s body compiled for ``device``: arguments fed, results fetched, and its
    stateful nodes run even when no result needs them (as TF prunes function bodies)."""
    args = set(fn.args)
    targets = [n.name for n in fn.nodes if n.stateful and n.name not in args]
    return compile_signature(
        GraphIR.of(fn.nodes),
        feeds=[(a, 0) for a in fn.args],
        fetches=fn.rets,
        targets=targets,
        devices=(device,),
        incarnation=0,
        allow_soft_placement=True,
        options=options,
    )


class _Body:
    """A function body compiled and bound for one device: what every call runs."""

    __slots__ = ("bound", "name", "retval_map")

    def __init__(
        self,
        fn: FunctionIR,
        device: LocalDevice,
        resources: Any,
        options: OptimizerOptions,
        executor_options: ExecutorOptions,
    ) -> None:
        compiled = compile_body(fn, device.name, options)
        (plan,) = compiled.plans
        self.name = fn.name
        # The body runs as its caller's steps do (engine, hand-offs, shuffle).
        self.bound: BoundPlan = bind(plan, device, resources, options=executor_options)
        self.retval_map = compiled.retval_map


def make_call_kernel(
    node: NodeDef,
    device: LocalDevice,
    resources: Any,
    bodies: dict[Any, Any],
    executor_options: ExecutorOptions,
) -> tuple[Callable[..., Any], int]:
    """The ASYNC kernel of call node ``node`` (bodies are shared through ``bodies``),
    its body bound with the caller's ``executor_options``."""
    fn: FunctionIR = node.attrs[FUNCTION_ATTR]
    options = node.attrs.get(OPTIONS_ATTR, _NOT_INLINED)
    key = (id(fn), options)
    body: _Body | None = bodies.get(key)
    if body is None:
        body = bodies[key] = _Body(fn, device, resources, options, executor_options)
    prefix = node.name + "/"
    single = len(node.outputs) == 1
    bound, retval_map = body.bound, body.retval_map

    async def call(*args: Any) -> Any:
        caller = running()
        trace = caller is not None and caller.tracing
        step = Step(bound, CallFrame(args), trace, None, get_cancellation_manager())
        try:
            values = None
            if bound.all_inline and not trace:
                values = step.run_inline(SLICE)
            if values is None:
                values = await step.run()
            if trace and caller is not None and step.stats is not None:
                caller.merge_stats(step.stats, prefix)
        finally:
            step.release()  # no reference cycle per call (see Step.release)
        results = [args[k] if p < 0 else values[k] for p, k in retval_map]
        if single:
            return results[0]
        return results or None

    return call, registry.ASYNC


# Registered as every kernel is (by the module that defines it); the registry calls
# it ``factory(node, device, resources, bodies, executor_options)`` (see registry.CALL).
registry.register_kernel_factory(registry.CALL)(make_call_kernel)
