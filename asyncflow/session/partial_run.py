"""Partial runs (TF's ``partial_run_setup`` / ``partial_run``): one step whose feeds
arrive and whose fetches leave over several calls.

The step is compiled by the same pipeline as ``Session.run`` with the client as a
device of its own: each declared feed is a ``_Recv`` from the client and each fetch
a ``_Send`` to it (:func:`~asyncflow.compiler.partition.add_client_edges`), so the
step runs as soon as it is set up and blocks exactly where a value has not been fed
yet.  ``partial_run`` sends the fed values into the step's rendezvous and receives
the fetched ones.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from asyncflow import errors
from asyncflow.compiler.ir import GraphIR, ref_of
from asyncflow.compiler.pipeline import Compiled, compile_signature
from asyncflow.compiler.prune import prune
from asyncflow.config import RunOptions, SessionConfig
from asyncflow.framework.graph import Graph, Operation, Tensor
from asyncflow.runtime.barrier import StepRunner
from asyncflow.runtime.call_frame import CallFrame
from asyncflow.runtime.rendezvous import LocalRendezvous
from asyncflow.session.fetch_feed import FetchMapper, feed_converter, retval_converter

__all__ = ["PartialRuns"]

#: The client's device name in partial-run rendezvous keys.
CLIENT = "/job:localhost/replica:0/task:0/device:CPU:0"


class Session(Protocol):
    """What partial runs use of their :class:`asyncflow.Session` (of the same package):
    the compile inputs, binding, the step factory and the one driver."""

    _incarnation: int

    @property
    def graph(self) -> Graph: ...

    @property
    def config(self) -> SessionConfig: ...

    def list_devices(self) -> list[str]: ...

    def _check_open(self) -> None: ...

    def _feed_tensor(self, key: Any) -> Tensor: ...

    def _graph_ir(self) -> GraphIR: ...

    def _prepared(self, compiled: Compiled) -> Any: ...

    def _runner(
        self,
        call: Any,
        frame: CallFrame,
        trace: bool = False,
        rendezvous: LocalRendezvous | None = None,
    ) -> StepRunner: ...

    def _timeout_ms(self, options: RunOptions | None) -> int: ...

    async def _drive(
        self,
        call: Any,
        frame: CallFrame,
        timeout_ms: int,
        options: RunOptions | None,
        run_metadata: None,
        slice_s: float | None = ...,
        step: StepRunner | None = None,
    ) -> Any: ...


@dataclass(eq=False, slots=True)
class _PartialRun:
    """An open partial run: its step, rendezvous and what was fed / fetched so far."""

    handle: str
    step: StepRunner
    rendezvous: LocalRendezvous
    loop: asyncio.AbstractEventLoop
    feed_keys: dict[Tensor, str]
    fetch_keys: dict[Tensor, str]
    target_keys: dict[Operation, str]
    fed: set[Tensor] = field(default_factory=set)
    #: What ended the step, when it failed (the root error partial_run reports).
    error: BaseException | None = None
    fetched: set[Tensor | Operation] = field(default_factory=set)
    task: asyncio.Task[None] | None = None
    #: The graph as it was set up: what a fetch needs is looked up in it.
    ir: GraphIR | None = None

    def complete(self) -> bool:
        return len(self.fed) == len(self.feed_keys) and len(self.fetched) == len(
            self.fetch_keys
        ) + len(self.target_keys)


class PartialRuns:
    """The open partial runs of one session."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._runs: dict[str, _PartialRun] = {}
        self._ids = itertools.count(1)

    async def setup(self, fetches: Any, feeds: Sequence[Any] | None = None) -> str:
        """See :meth:`Session.partial_run_setup`."""
        sess = self._session
        sess._check_open()
        mapper = FetchMapper(sess.graph, fetches)
        feed_list = [sess._feed_tensor(k) for k in (feeds or ())]
        if len(set(feed_list)) != len(feed_list):
            raise ValueError(f"partial_run_setup: feeds has duplicate entries: {feeds!r}")
        ir = sess._graph_ir()
        compiled = compile_signature(
            ir,
            feeds=[ref_of(t) for t in feed_list],
            fetches=[ref_of(t) for t in mapper.tensors],
            targets=[op.name for op in mapper.targets],
            devices=sess.list_devices(),
            incarnation=sess._incarnation,
            allow_soft_placement=sess.config.allow_soft_placement,
            client=CLIENT,
            options=sess.config.graph_options.optimizer_options,
        )
        keys = compiled.client
        assert keys is not None
        rendezvous = LocalRendezvous()
        call = sess._prepared(compiled)
        frame = CallFrame(())
        step = sess._runner(call, frame, False, rendezvous)
        handle = f"partial_run_{next(self._ids)}"
        state = _PartialRun(
            handle,
            step,
            rendezvous,
            asyncio.get_running_loop(),
            dict(zip(feed_list, keys.feeds)),
            dict(zip(mapper.tensors, keys.fetches)),
            dict(zip(mapper.targets, keys.targets)),
            ir=ir,
        )

        async def run_partial() -> None:
            try:
                await sess._drive(call, frame, sess._timeout_ms(None), None, None, step=step)
            except BaseException as exc:
                state.error = exc
                rendezvous.abort(exc)  # waiting partial_run calls fail with the root error
                raise

        state.task = asyncio.get_running_loop().create_task(run_partial())
        state.task.add_done_callback(_retrieve)
        self._runs[handle] = state
        return handle

    async def run(
        self, handle: str, fetches: Any, feed_dict: Mapping[Any, Any] | None = None
    ) -> Any:
        """See :meth:`Session.partial_run`."""
        sess = self._session
        state = self._runs.get(handle) if isinstance(handle, str) else None
        if state is None:
            raise errors.InvalidArgumentError(
                None,
                None,
                f"The partial run handle {handle!r} is invalid: it was never "
                f"set up with partial_run_setup (or it already finished)",
            )
        if asyncio.get_running_loop() is not state.loop:
            raise RuntimeError(f"partial run {handle!r} was set up on another event loop")
        mapper = FetchMapper(sess.graph, fetches)
        feeds = [(sess._feed_tensor(k), v) for k, v in (feed_dict or {}).items()]
        checks: list[tuple[Any, Mapping[Any, str], set[Any], str, str]] = [
            *((t, state.feed_keys, state.fed, "feed", "fed") for t, _ in feeds),
            *((t, state.fetch_keys, state.fetched, "fetch", "fetched") for t in mapper.tensors),
            *((op, state.target_keys, state.fetched, "fetch", "fetched") for op in mapper.targets),
        ]
        for item, declared, done, what, verb in checks:
            op = item.op if isinstance(item, Tensor) else item
            if item not in declared:
                raise errors.InvalidArgumentError(
                    None, op, f"The {what} {item.name} was not specified in partial_run_setup."
                )
            if item in done:
                raise errors.InvalidArgumentError(
                    None, op, f"The {what} {item.name} has already been {verb}."
                )
        _check_computable(state, mapper, {t for t, _ in feeds})
        converted = [(t, feed_converter(t)(v)) for t, v in feeds]
        try:
            for t, value in converted:
                state.rendezvous.send(state.feed_keys[t], value)
                state.fed.add(t)
            values = []
            for t in mapper.tensors:
                value, _ = await state.rendezvous.recv(state.fetch_keys[t])
                state.fetched.add(t)
                values.append(retval_converter(t)(value))
            for op in mapper.targets:
                await state.rendezvous.recv(state.target_keys[op])
                state.fetched.add(op)
        except errors.AbortedError as exc:
            root = state.error
            self._runs.pop(handle, None)
            if isinstance(root, errors.OpError):
                raise root from None
            raise errors.CancelledError(
                None, None, f"partial run {handle!r} was aborted: {exc.message}"
            ) from exc
        if state.complete():
            self._runs.pop(handle, None)
            assert state.task is not None
            await state.task
        return mapper.rebuild(values)

    async def close(self) -> None:
        """Cancel the steps of abandoned partial runs (on this loop) and forget them all."""
        partials, self._runs = list(self._runs.values()), {}
        loop = asyncio.get_running_loop()
        for state in partials:
            if state.task is not None and state.loop is loop and not state.task.done():
                state.task.cancel()
                await asyncio.wait([state.task])  # its outcome is retrieved by _retrieve


def _check_computable(state: _PartialRun, mapper: FetchMapper, feeding: set[Tensor]) -> None:
    """As TF's ``CheckFetch``: a fetch that needs a declared feed not fed yet (before
    or by this call) would wait forever; ``InvalidArgumentError`` naming both."""
    pending = {ref_of(t): t for t in state.feed_keys if t not in state.fed and t not in feeding}
    if not pending or state.ir is None:
        return
    declared = [ref_of(t) for t in state.feed_keys]
    items: list[Tensor | Operation] = [*mapper.tensors, *mapper.targets]
    for item in items:
        missing: Tensor | None
        if isinstance(item, Tensor):
            ref = ref_of(item)
            missing = pending.get(ref)
            needed = prune(state.ir, [ref], (), declared)
        else:
            missing = None
            needed = prune(state.ir, (), [item.name], declared)
        for n in needed:
            if missing is not None:
                break
            missing = next((pending[r] for r in n.inputs if r in pending), None)
        if missing is not None:
            op = item.op if isinstance(item, Tensor) else item
            raise errors.InvalidArgumentError(
                None,
                op,
                f"Fetch {item.name} can't be computed from the feeds that have "
                f"been fed so far: it needs {missing.name}, which is not fed yet.",
            )


def _retrieve(task: asyncio.Task[None]) -> None:
    # The step's error reaches callers through partial_run; mark it retrieved.
    if not task.cancelled():
        task.exception()
