"""The general propagator: which nodes of a step are ready, and where their values live.

TensorFlow's executor delegates readiness to a propagator; here there is one,
:class:`PropagatorState` (beside the straight-line interpreter of
:mod:`asyncflow.runtime.interpreter`, which runs what a fixed order expresses):

* The root frame: values in one list indexed by slot; ``pending[i]`` counts node
  ``i``'s unfinished producers; a node at zero is pushed on the ``ready`` stack
  (LIFO: finishing a chain first frees its values sooner).  A count is written only
  while it stays above zero (each producer finishes once, so a count at zero is
  never read again): a plan without joins (no node with two producers) never writes
  one, and its steps share the plan's counts instead of copying them.  Cheap kernels run right
  inside :meth:`PropagatorState._drain_root`, the per-node hot loop.  ``cond``
  needs no frames: a Switch, a Merge, the producers of a Merge's inputs, dead nodes
  and Enters leave the hot path for :meth:`PropagatorState._special`, which
  propagates *dead tensors* (a non-Merge node with a dead data or control input is
  dead; a Merge fires on its first live input, or dead when all are dead).  A plan
  without loops never leaves the root frame and pays nothing for frames.
* Loop frames: tokens ``(node, frame, iteration)``: a tree of frame instances (one
  per loop entered, per parent iteration), each with its live iterations; Enter
  delivers into iteration 0 of the child frame (a constant Enter into every
  iteration), NextIteration into the next iteration (a dead one ends the loop; at
  most ``parallel_iterations`` in flight, later ones queue), Exit into the parent
  frame (the root's lists for an outermost loop); a frame instance with no work
  left delivers its Exits that never got a live value as dead.  A loop frame the
  compiler gave a straight-line schedule (only inline kernels, no nested loop) runs
  instead as a tight loop over one reused value list
  (:mod:`asyncflow.runtime.loop_fastpath`) once all its Enters arrived, and hands
  back to the general form if it meets what that does not model; traced steps take
  the same path (with traced kernels).

Values are freed after their last reader (per iteration in loops), inline kernels
run without a task, every other node goes to ``step.dispatch``, and a fetched dead
tensor is an ``InvalidArgumentError`` naming it.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from time import perf_counter
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from asyncflow import errors
from asyncflow.compiler.control_flow import (
    CF_ENTER,
    CF_EXIT,
    CF_MERGE,
    CF_NEXT,
    CF_NONE,
    CF_SWITCH,
)
from asyncflow.framework import registry

if TYPE_CHECKING:
    from asyncflow.compiler.control_flow import FrameInfo
    from asyncflow.runtime.bind import BoundNode, BoundPlan

__all__ = [
    "CHECK_EVERY",
    "DONE",
    "FAILED",
    "GENERAL_SLOTS",
    "HANDOFF",
    "RUNNING",
    "Dead",
    "FastLoop",
    "FastRun",
    "PropagatorState",
    "Step",
    "StepSide",
    "check_outputs",
    "first_dead",
    "merge_arrive",
    "merge_outputs",
    "slice_over",
    "switch_outputs",
]

#: Nodes run between two looks at the clock while draining.
CHECK_EVERY = 256


def slice_over(until: float) -> bool:
    """THE time-slice rule, asked by every engine every :data:`CHECK_EVERY` nodes (a
    loop program: iterations' worth) and by the hand-offs of a chain of sends: the
    step's slice, ending at ``until``, is used up, so it yields to the event loop
    (deadlines, cancellation and other tasks run) and drains again after."""
    return perf_counter() >= until


def first_dead(values: Iterable[Any]) -> Dead | None:
    """THE dead-input rule, every engine's: a node other than a Merge with a dead
    input — a data input holding a dead value, or a control input from a dead node
    (whose first output is dead) — is dead, with the first dead value found; its
    outputs are that value and its kernel never runs.  (A Merge: ``merge_arrive``.)"""
    for v in values:
        if v.__class__ is Dead:
            return v
    return None


def switch_outputs(data: Any, pred: Any, marker: Dead) -> tuple[Any, Any]:
    """THE Switch rule (every engine's): ``data`` goes to output 1 when ``pred`` is
    true, else to output 0; the other output is ``marker``, the Switch's dead value."""
    return (marker, data) if pred else (data, marker)


def merge_arrive(
    m: list[Any], arrived: Iterable[tuple[int, Any]], control: bool, expected: int
) -> bool:
    """THE Merge rule of the general engine (root frame and loop frames alike), for
    inputs arriving at Merge state ``m`` = [control inputs left, dead inputs, first
    live input's position (-1: none yet), fired, first dead value]: ``arrived`` are
    the (position, value) of the data inputs that just came, ``control`` whether a
    control input did.  True when the Merge fires now: its control inputs are done
    and either an input arrived live (it forwards the first live one, with its
    position: :func:`merge_outputs`) or ``expected`` inputs arrived dead (it is
    dead).  A loop Merge expects one input per iteration.  The straight-line form,
    ``interpreter.merge_pick``, resolves the same rule once every input is known:
    the first live one in input order."""
    if m[3]:
        return False  # fired already (in this iteration)
    if control:
        m[0] -= 1
    for pos, v in arrived:
        if v.__class__ is Dead:
            m[1] += 1
            if m[4] is None:
                m[4] = v
        elif m[2] < 0:
            m[2] = pos
    fires: bool = m[0] <= 0 and (m[2] >= 0 or m[1] >= expected)
    m[3] = fires
    return fires


def merge_outputs(
    m: list[Any], inputs: Sequence[int], read: Callable[[int], Any], bound: BoundPlan, i: int
) -> tuple[Any, Any]:
    """The two outputs of Merge ``i`` that fired with state ``m`` (see
    :func:`merge_arrive`): its first live input's value (``read`` of its slot) and
    position, or its first dead input twice (a fresh marker naming the Merge when
    none was recorded)."""
    if m[2] < 0:
        dead = m[4] or Dead(bound.ops[i].name)
        return dead, dead
    return read(inputs[m[2]]), np.int32(m[2])


_INLINE = registry.INLINE
_SEND = registry.SEND
_RECV = registry.RECV


class Dead:
    """The marker of a dead tensor; remembers the Switch (or Recv) it comes from."""

    __slots__ = ("origin",)

    def __init__(self, origin: str) -> None:
        self.origin = origin

    def __repr__(self) -> str:
        return f"<dead from {self.origin!r}>"


class Step(Protocol):
    """What an engine asks of the step it is a part of (:class:`asyncflow.runtime.step.Step`,
    whose engine class mixes in :class:`PropagatorState` or the straight-line
    interpreter's ``ProgramPropagator``)."""

    _error: errors.OpError | None
    _bound: BoundPlan
    _trace: Any  # its StepTrace (runtime.observe) when traced, else None

    def dispatch(
        self,
        token: Any,
        i: int,
        node: BoundNode,
        args: list[Any],
        frame_id: int = 0,
        iter_id: int = 0,
        is_dead: bool = False,
    ) -> None: ...

    def start(self, token: Any, i: int, args: list[Any], parkable: bool) -> None: ...

    def fail(self, i: int, exc: BaseException) -> None: ...

    def record(
        self, i: int, kind: str, start: float, end: float, outputs: Sequence[Any], key: str = ""
    ) -> None: ...


def check_outputs(v: Any, nout: int) -> Any:
    if not isinstance(v, list | tuple) or len(v) != nout:
        got = f"{len(v)} values" if isinstance(v, list | tuple) else type(v).__name__
        raise errors.InternalError(None, None, f"kernel returned {got}, expected {nout} outputs")
    return v


def _dead_fetch(bound: BoundPlan, k: int, v: Dead) -> errors.InvalidArgumentError:
    """The error of fetch ``k`` holding a dead value, naming the user's tensor: a fetch
    produced on another device arrives through a ``_Recv``, whose name the user never
    wrote, so the Recv's ``tensor_name`` (the tensor sent) is named instead."""
    name, index = bound.plan.partition.retvals[k][1]
    at = next((i for i, n in enumerate(bound.plan.nodes) if n.name == name), None)
    node = bound.plan.nodes[at] if at is not None else None
    tensor, cause = f"{name}:{index}", f"the untaken output of Switch {v.origin!r}"
    if node is not None and node.op == "_Recv":
        tensor = str(node.attrs["tensor_name"])
        cause = (
            f"the untaken output of a Switch on {node.attrs['send_device']}, "
            f"from which it was sent dead"
        )
    op = bound.ops[at] if at is not None else None
    return errors.InvalidArgumentError(
        None,
        op,
        f"Retval[{k}] does not have value: the fetched tensor '{tensor}' "
        f"is dead: it depends on {cause}",
    )


# -- loops ------------------------------------------------------------------------------

#: Outcomes of :meth:`FastRun.advance`.
RUNNING, DONE, HANDOFF, FAILED = range(4)


class FastLoop(Protocol):
    """A loop frame's fast path, bound once per plan
    (:class:`asyncflow.runtime.loop_fastpath.BoundLoop`)."""

    @property
    def exit_markers(self) -> Sequence[tuple[int, Dead]]:
        """Per Exit: the dead value it holds in an iteration that goes on."""

    def start(self) -> FastRun:
        """A new instance of the frame (its Enters' values come next)."""


class FastRun(Protocol):
    """One frame instance on the fast path (:class:`~asyncflow.runtime.loop_fastpath.LoopRun`)."""

    entered: list[tuple[int, Any]]  # the Enters' (node, value), in arrival order
    exits: list[tuple[int, Any]]  # DONE: the Exits' (node, value) of the last iteration
    carried: list[tuple[int, Any]]  # HANDOFF: the NextIterations' (node, value)
    iteration: int  # DONE / HANDOFF: the last iteration run

    @property
    def loop(self) -> FastLoop:
        """The frame's fast path."""

    def begin(self) -> bool:
        """All Enters arrived: start (False: a value entered dead; the general form runs)."""

    def advance(self, until: float, step: Step) -> int:
        """Run iterations: RUNNING (time is up), DONE, HANDOFF or FAILED."""


class _Iteration:
    __slots__ = ("children", "dead", "merges", "outstanding", "pending", "refs", "vals")

    def __init__(self) -> None:
        self.vals: dict[int, Any] = {}
        self.pending: dict[int, int] = {}
        self.refs: dict[int, int] = {}
        self.dead: dict[int, Dead] = {}
        # Merge node -> its state (see merge_arrive)
        self.merges: dict[int, list[Any]] = {}
        self.outstanding = 0
        self.children = 0


class _Frame:
    __slots__ = (
        "children",
        "dead_exits",
        "delivered",
        "fast",
        "id",
        "invariants",
        "iters",
        "name",
        "parent",
        "parent_iter",
        "pending_enters",
        "static",
        "waiting",
    )

    def __init__(
        self, static: int, name: str, parent: _Frame | None, parent_iter: int, pending_enters: int
    ) -> None:
        self.static = static
        #: The instance name ("parent;iteration;frame"), the same in every partition
        #: holding part of the loop; ``id`` (its hash) goes into rendezvous keys.
        self.name = name
        self.id = (
            0
            if parent is None
            else int.from_bytes(hashlib.blake2b(name.encode(), digest_size=7).digest(), "big")
        )
        self.parent = parent
        self.parent_iter = parent_iter
        self.iters: dict[int, _Iteration] = {0: _Iteration()}
        self.pending_enters = pending_enters
        self.invariants: list[tuple[int, Any]] = []
        self.waiting: deque[tuple[int, int, Any]] = deque()  # (iteration, node, value)
        self.delivered: set[int] = set()
        self.dead_exits: dict[int, Dead] = {}
        self.children: dict[tuple[int, int], _Frame] = {}
        #: The fast path's run of this instance, while it has one (then ``iters`` is
        #: unused: the run holds the values until it is done or hands back).
        self.fast: FastRun | None = None


# -- the general propagator ---------------------------------------------------------------------------

#: The merges of every plain propagator without control flow: never written (only a
#: Merge node writes, and there is none), so one dict serves them all.
_NO_MERGES: dict[int, list[Any]] = {}


def _shuffler(bound: BoundPlan) -> Any:
    """The shuffle of a step's ready batches (``ExecutorOptions.shuffle_seed`` is set)."""
    return bound.options.shuffler().shuffle  # type: ignore[union-attr]


def _has_joins(bound: BoundPlan) -> bool:
    """Whether a node of the root frame waits for two producers or more (then its
    steps count down pending counts of their own); worked out once per plan, kept in
    ``bound.derived["joins"]``."""
    joins = bound.derived["joins"] = any(p > 1 for p in bound.plan.initial_pending)
    return joins


#: The frame-token queue of every step of a plan without loops: always empty.
_NO_FRAMES: deque[Any] = deque(maxlen=0)


#: The base of an engine class: the step's side it asks for (the ``Step`` protocol),
#: for the type checker; at run time the step's own class, which the engine is a
#: mixin of, has it.
if TYPE_CHECKING:
    StepSide = Step
else:
    StepSide = object

#: The general engine's state, per step (slots of the step's class).
GENERAL_SLOTS = (
    "_dead",
    "_fready",
    "_info",
    "_initial",
    "_initial_pending",
    "_initial_refs",
    "_kinds",
    "_loops",
    "_merges",
    "_on_exit",
    "_pending",
    "_pick",
    "_ready",
    "_refs",
    "_root",
    "_shuffle",
    "_vals",
)


class PropagatorState(StepSide):
    """THE general engine (a mixin of the step: the step of such a plan *is* its
    propagator, one object per step in flight, see
    :class:`asyncflow.runtime.step.Step`): readiness by pending counts, dead tensors,
    and the frames and iterations of loops (TensorFlow's ``PropagatorState``).

    The root frame (its one iteration) is flat lists indexed by slot or node —
    ``_vals``, ``_pending``, ``_refs``, ``_dead``, ``_merges`` — and its ready nodes
    (ints, on the ``_ready`` stack) run in the per-node hot loop,
    :meth:`_drain_root`.  A plan without loops never leaves it: ``_root`` stays None
    and nothing is paid for frames.  A loop's frame instances and iterations
    (:class:`_Frame`, :class:`_Iteration`: dicts) have ``(node, frame, iteration)``
    tokens, queued on ``_fready`` and run by :meth:`_drain_frames`; a root Enter
    moves its value into a frame (:meth:`_enter`), an Exit back into the root lists
    (:meth:`_deliver`).  Invariant: a root node's consumers are root nodes or Enters
    (a loop is entered only through its Enters), so the hot loop never meets a node
    of a loop frame.
    """

    __slots__ = ()  # (its step's class declares them: GENERAL_SLOTS)
    _bound: BoundPlan
    _nodes: Sequence[BoundNode]
    _info: FrameInfo  # (read by control flow only: set whenever there is some)
    _fready: deque[tuple[int, _Frame, int]]
    _root: _Frame | None
    # The loop side's (set only in a plan with loops, see ``_init_general``).
    _loops: Sequence[FastLoop | None]
    _initial: Sequence[Any]
    _initial_pending: Sequence[int]
    _initial_refs: Sequence[int] | None
    _pick: Callable[[int], int] | None
    _on_exit: Any

    def _init_general(
        self,
        bound: BoundPlan,
        args: Sequence[Any],
        loops: Sequence[FastLoop | None] = (),
    ) -> None:
        """The engine's state for a step of ``bound`` over ``args`` (the step's
        ``_bound`` and ``_nodes`` are set by the step)."""
        plan = bound.plan
        nodes = self._nodes
        vals = list(plan.initial_values)
        for s, (k, _) in zip(plan.arg_slots, plan.partition.args):  # the _Arg nodes
            vals[s] = args[k]
        self._vals = vals
        # (Shared when never written, see the module doc: one list less per step.)
        joins = bound.derived.get("joins")
        if joins is None:
            joins = _has_joins(bound)
        self._pending: list[int] = (
            list(plan.initial_pending) if joins else plan.initial_pending  # type: ignore[assignment]
        )
        self._ready = list(plan.initial_ready)
        self._refs = list(plan.initial_refs) if plan.initial_refs is not None else None
        info = plan.frames
        # Control flow (cond) or cross-device receives: nodes may be dead.
        # Invariant: _dead[i] is the Dead marker node i inherits, or None while live.
        self._dead: list[Dead | None] | None = [None] * len(nodes) if info is not None else None
        self._kinds = info.kind if info is not None else ()
        # Merge node -> its state (see merge_arrive)
        # (no Merge without control flow: then one shared, always empty dict)
        self._merges: dict[int, list[Any]] = {} if info is not None else _NO_MERGES
        # (Tests only: asked only when they shuffle, no call per step otherwise.)
        shuffled = bound.options.shuffle_seed is not None
        self._shuffle = _shuffler(bound) if shuffled else None
        self._info = info  # type: ignore[assignment]
        if not bound.frames:
            # No loops: frame tokens never exist, so one shared deque that stays empty
            # (nothing but frame code appends to it) and no root frame.  The loop
            # side's other slots are never read: left unset, five writes less per step.
            self._fready = _NO_FRAMES
            self._root = None
            return
        # The loop side (written here, not in a helper: one call less per step): the
        # root frame instance and its helpers.
        self._initial = plan.initial_values
        self._initial_pending = plan.initial_pending
        self._initial_refs = plan.initial_refs
        self._loops = loops  # the fast path per static frame (none: the general form)
        self._fready = deque()
        # The frame tree's root; its values are the flat lists above, its iteration
        # only counts the child frames it holds.
        self._root = _Frame(0, "", None, 0, 0)
        # (Tests only, ExecutorOptions.shuffle_seed: which ready frame token runs next.)
        rng = bound.options.shuffler() if shuffled else None
        self._pick = rng.randrange if rng is not None else None
        # A streaming step's hook: an Exit delivered a fetched value (None: nobody streams).
        self._on_exit = bound.derived.get("on_exit")

    def has_ready(self) -> bool:
        return bool(self._ready or self._fready)

    def clear(self) -> None:
        if self._ready:  # (an idle step's is the empty tuple)
            self._ready.clear()
        self._fready.clear()

    def idle(self) -> None:
        # Invariant: ``_ready`` is ``()`` only while idle, and every node that becomes
        # ready after it arrives through :meth:`complete`, which makes a new stack first
        # (a push onto the tuple would fail loudly, never corrupt a shared stack).
        if not self._ready and not self._fready:
            self._ready = ()  # type: ignore[assignment]

    def drain(self, until: float) -> bool:
        """Run ready nodes until none is left (True), or until the clock passes ``until``
        (False: the step yields to the event loop, then drains again): the root
        frame's in the hot loop, then the loop frames' tokens, in turn until neither
        has work (an Exit readies root nodes, a root Enter frame tokens)."""
        step = self
        trace = step._trace
        while True:
            if trace is not None:
                trace.label = None  # root nodes run in no frame
            if not self._drain_root(until):
                return False
            if not self._fready or step._error is not None:
                return True
            if not self._drain_frames(until):
                return False
            if not self._ready:
                return True

    # The per-node hot loop: kept in one piece on purpose (see the docstring).
    def _drain_root(self, until: float) -> bool:  # noqa: C901, PLR0915
        """Run the root frame's ready nodes (see :meth:`drain`).

        The hot loop (longer than the house's 60 lines on purpose): this is the
        per-node hot path and is kept in one piece: every
        attribute is hoisted into a local, and the common shapes (1 or 2 inputs, one
        output, one consumer) take the shortest branches.  The completion half
        (store outputs, release inputs, decrement consumers) is repeated in
        ``complete`` for nodes completed by tasks; keep the two in sync.
        """
        ready = self._ready
        step = self
        if not ready or step._error is not None:
            return True
        nodes = self._nodes
        vals = self._vals
        pending = self._pending
        refs = self._refs
        dead = self._dead
        pop = ready.pop
        push = ready.append
        shuffle = self._shuffle  # (tests only: ExecutorOptions.shuffle_seed)
        budget = CHECK_EVERY
        i = -1
        try:
            while ready:
                if shuffle is not None:
                    shuffle(ready)
                i = pop()
                while True:
                    kernel, kind, n, ins, out, nout, cons, frees, counted, getter, _ = nodes[i]
                    if kind or (dead is not None and dead[i] is not None):
                        if not self._kinds:  # no control flow: dispatch it right here
                            step.dispatch(
                                i,
                                i,
                                nodes[i],
                                [vals[ins[0]]] if n == 1 else [vals[s] for s in ins] if n else [],
                            )
                        else:
                            self._special(i)  # control flow, a dead node
                        break
                    if n == 2:
                        v = kernel(vals[ins[0]], vals[ins[1]])
                    elif n == 1:
                        v = kernel(vals[ins[0]])
                    elif n == 0:
                        v = kernel()
                    else:
                        v = kernel(*getter(vals))  # type: ignore[misc]
                    if nout == 1:
                        vals[out] = v
                    elif nout:
                        vals[out : out + nout] = check_outputs(v, nout)
                    for s in frees:
                        vals[s] = None
                    if counted:
                        for s in counted:
                            r = refs[s] - 1  # type: ignore[index]
                            refs[s] = r  # type: ignore[index]
                            if not r:
                                vals[s] = None
                    # Continue with the first consumer this node made ready, without a
                    # push/pop round trip (a chain runs entirely in this inner loop).
                    nxt = -1
                    for c in cons:
                        p = pending[c] - 1
                        if p:  # (a count reaching zero is never read again: not written)
                            pending[c] = p
                        elif nxt < 0:
                            nxt = c
                        else:
                            push(c)
                    budget -= 1
                    if not budget:
                        if slice_over(until):
                            if nxt >= 0:
                                push(nxt)
                            return not ready  # the step yields to the loop, then goes on
                        budget = CHECK_EVERY
                    if nxt < 0:
                        break
                    if shuffle is not None:  # the consumer joins the batch to shuffle
                        push(nxt)
                        break
                    i = nxt
                if step._error is not None:
                    return True
        except (Exception, asyncio.CancelledError) as exc:  # the kernel's (Step.fail)
            step.fail(i, exc)
        return True

    # Hot: every task-completed node of the root frame comes through here.
    def complete(self, token: Any, v: Any) -> bool | None:  # noqa: C901
        """Store node ``token``'s outputs, release its inputs, and ready its consumers
        (a root node's token is its index, a loop frame node's a tuple).  False when a
        live root node readied nothing and nothing else is ready (the step need not
        drain: most completions of a wide layer of async nodes); else None."""
        if self._ready.__class__ is tuple:  # type: ignore[comparison-overlap] # idle (see ``idle``)
            self._ready = []
        if token.__class__ is not int:
            self._complete_token(token, v)
            return None
        i: int = token
        node = self._nodes[i]
        nout = node.num_outputs
        if isinstance(v, Dead):
            self._store(node, (v,) * nout)
            self._propagate(i, node, v)
            return None
        vals = self._vals
        if nout == 1:
            vals[node.out] = v
        elif nout:
            vals[node.out : node.out + nout] = check_outputs(v, nout)
        if self._dead is not None:
            if nout > 1:  # a live node's outputs may still be dead: look at each
                self._propagate(i, node, None)
                return None
            # One live output (or none: a send): no consumer turns dead through it,
            # only a Merge counts it.  ``_propagate``, with the dead scan left out.
            kinds = self._kinds
            pending = self._pending
            push = self._ready.append
            for c in node.consumers:
                if kinds[c] == CF_MERGE:
                    self._merge_input(c, node.out, node.out + nout)
                    continue
                p = pending[c] - 1
                if p:
                    pending[c] = p
                else:
                    push(c)
        self._release(node)
        if self._dead is not None:
            return None  # consumers readied above
        pending = self._pending
        ready = self._ready
        push = ready.append
        for c in node.consumers:
            p = pending[c] - 1
            if p:
                pending[c] = p
            else:
                push(c)
        if not ready and not self._fready:
            return False
        return None

    # -- the root frame off the hot path: dispatch, dead tensors, Enter -----------------------------------------

    def _special(self, i: int) -> None:
        node = self._nodes[i]
        vals = self._vals
        step = self
        kinds = self._kinds
        # No control flow, nothing dead: a node to dispatch (with cross-device edges,
        # mostly a live send or recv).
        if not kinds or (kinds[i] == CF_NONE and node.flow != _INLINE and self._dead[i] is None):  # type: ignore[index]
            ins = node.inputs
            n = node.arity
            step.dispatch(
                i, i, node, [vals[ins[0]]] if n == 1 else [vals[s] for s in ins] if n else []
            )
            return
        cf = self._kinds[i]
        if cf == CF_MERGE:
            # No entry: every input is a preloaded constant (always live): the first.
            m = self._merges.pop(i, None) or [0, 0, 0, True, None]
            outs = merge_outputs(m, node.inputs, vals.__getitem__, self._bound, i)
            self._store(node, outs)
            self._propagate(i, node, outs[1] if outs[1].__class__ is Dead else None)
            if self._trace is not None:
                self._trace_control(i)
            return
        dead = self._dead[i] if self._dead is not None else None
        if cf == CF_ENTER:  # into a loop frame (a dead value enters dead)
            root = self._root
            assert root is not None
            value = dead if dead is not None else vals[node.inputs[0]]
            self._release(node)
            if step._trace is not None:
                self._trace_control(i)
            self._enter(i, root, 0, value)
            return
        if dead is not None:
            if node.flow == _SEND:  # transfers run dead: the peer learns the deadness
                step.dispatch(i, i, node, [None] * node.arity, 0, 0, True)
            elif node.flow == _RECV:
                step.dispatch(i, i, node, [])
            else:
                self._store(node, (dead,) * node.num_outputs)
                self._propagate(i, node, dead)
            return
        if cf == CF_SWITCH:
            data = vals[node.inputs[0]]
            self._store(
                node, switch_outputs(data, vals[node.inputs[1]], Dead(step._bound.ops[i].name))
            )
            self._propagate(i, node, None)
            if self._trace is not None:
                self._trace_control(i)
            return
        args = [vals[s] for s in node.inputs]
        if node.flow == _INLINE:  # an inline kernel whose output a Merge counts
            self.complete(i, node.kernel(*args))
            return
        step.dispatch(i, i, node, args)

    def _store(self, node: BoundNode, outs: Sequence[Any]) -> None:
        if len(outs) != node.num_outputs:
            raise errors.InternalError(
                None, None, f"kernel returned {len(outs)} values, expected {node.num_outputs}"
            )
        self._vals[node.out : node.out + node.num_outputs] = outs

    def _propagate(
        self, i: int, node: BoundNode, node_dead: Dead | None, release: bool = True
    ) -> None:
        """Ready node ``i``'s consumers, marking those its dead outputs reach; then free
        (``release``: its inputs are root slots, not an Exit's in a frame).

        A consumer reached from a dead node is dead (through data or control edges);
        one that reads a dead output of a live node (a Switch's untaken side) is dead
        too.  A Merge counts its dead and live inputs instead.
        """
        vals = self._vals
        dead = self._dead
        assert dead is not None
        nodes = self._nodes
        pending = self._pending
        push = self._ready.append
        kinds = self._kinds
        first, end = node.out, node.out + node.num_outputs
        for c in node.consumers:
            if kinds[c] == CF_MERGE:
                self._merge_input(c, first, end)
                continue
            if dead[c] is None:
                dead[c] = node_dead or first_dead(
                    vals[s] for s in nodes[c].inputs if first <= s < end
                )
            p = pending[c] - 1
            if p:
                pending[c] = p
            else:
                push(c)
        if release:
            self._release(node)

    def _release(self, node: BoundNode) -> None:
        """Free the slots whose last reader ``node`` is (the hot loop does this inline)."""
        vals = self._vals
        for s in node.frees:
            vals[s] = None
        refs = self._refs
        for s in node.counted:
            r = refs[s] - 1  # type: ignore[index]
            refs[s] = r  # type: ignore[index]
            if not r:
                vals[s] = None

    def _merge_input(self, c: int, first: int, end: int) -> None:
        """A producer of Merge ``c`` finished: its outputs are slots ``first:end``
        (none of them read by ``c``: a control edge)."""
        m = self._merges.get(c)
        if m is None:
            m = self._merges[c] = [self._info.merge_controls[c], 0, -1, False, None]
        vals = self._vals
        node = self._nodes[c]
        arrived = [(pos, vals[s]) for pos, s in enumerate(node.inputs) if first <= s < end]
        if merge_arrive(m, arrived, not arrived, node.arity):
            self._ready.append(c)

    def _trace_control(self, i: int) -> None:
        import time

        now = time.time()
        self.record(i, "control", now, now, ())

    def retvals(self) -> list[Any]:
        vals = self._vals
        slots = self._bound.plan.retval_slots  # the _Retval nodes
        # (One fetch, most runs: no comprehension, one call less.)
        out = [vals[slots[0]]] if len(slots) == 1 else [vals[s] for s in slots]
        if self._dead is not None:
            for k, v in enumerate(out):
                if isinstance(v, Dead):
                    raise _dead_fetch(self._bound, k, v)
        return out

    # -- loop frames ---------------------------------------------------------------------

    def release_frames(self) -> None:
        """The step is over: unlink the frame instances a failed or cancelled step left
        (each holds its parent, which holds it), so they are freed without the cycle
        collector.  A finished step has removed them all already."""
        root = self._root
        if root is None:
            return
        frames = list(root.children.values())
        while frames:
            frame = frames.pop()
            frames.extend(frame.children.values())
            frame.children.clear()
            frame.parent = None
        root.children.clear()

    def _push(self, i: int, frame: _Frame, it: int) -> None:
        frame.iters[it].outstanding += 1
        self._fready.append((i, frame, it))

    def _drain_frames(self, until: float) -> bool:
        """Run the loop frames' ready tokens (see :meth:`drain`)."""
        ready = self._fready
        step = self
        kinds = self._info.kind
        budget = CHECK_EVERY
        while ready and step._error is None:
            budget -= 1
            if not budget:
                if slice_over(until):
                    return False
                budget = CHECK_EVERY
            if self._pick is not None:  # a random ready token next: a shuffled batch
                ready.rotate(-self._pick(len(ready)))
            i, frame, it = ready.popleft()
            if i < 0:  # a frame instance on the fast path: runs until done or time is up
                if not self._run_fast(frame, until):
                    ready.append((i, frame, it))
                    return False
                continue
            try:
                self._execute(i, frame, it, self._nodes[i], kinds[i])
            except (Exception, asyncio.CancelledError) as exc:  # the kernel's (Step.fail)
                step.fail(i, exc)
        return True

    def _read(self, st: _Iteration, slot: int) -> Any:
        vals = st.vals
        return vals[slot] if slot in vals else self._initial[slot]

    def _execute(self, i: int, frame: _Frame, it: int, node: BoundNode, kind: int) -> None:
        """Run node ``i`` of iteration ``it`` of ``frame``: by its control-flow kind."""
        st = frame.iters[it]
        trace = self._trace
        if trace is not None:  # traced: kernels record their frame and iteration
            trace.label = (self._info.frames[frame.static].name, it)
        if kind == CF_NONE and node.flow == _INLINE and i not in st.dead:
            self._run_inline(i, frame, it, st, node)
        elif kind == CF_NONE:
            self._run_other(i, frame, it, st, node)
        elif kind == CF_MERGE:
            self._run_merge(i, frame, it, st, node)
        elif kind == CF_SWITCH:
            dead = st.dead.get(i)
            if dead is None:
                outs = switch_outputs(
                    self._read(st, node.inputs[0]),
                    self._read(st, node.inputs[1]),
                    Dead(self._bound.ops[i].name),
                )
            else:
                outs = (dead, dead)
            self._complete(i, frame, it, outs, dead)
            if trace is not None:
                self._trace_control(i)
        else:
            self._route(i, frame, it, st, node, kind)

    def _run_other(self, i: int, frame: _Frame, it: int, st: _Iteration, node: BoundNode) -> None:
        """A node that is dead, or whose kernel is not inline (dispatched)."""
        dead = st.dead.get(i)
        flow = node.flow
        if dead is not None and flow != _SEND and flow != _RECV:
            self._complete(i, frame, it, (dead,) * node.num_outputs, dead)
            return
        args = [self._read(st, s) for s in node.inputs]
        if flow == _INLINE:
            v = node.kernel(*args)
            nout = node.num_outputs
            outs = (v,) if nout == 1 else tuple(check_outputs(v, nout) if nout else ())
            self._complete(i, frame, it, outs, None)
        else:  # (transfers run dead too: the peer learns the deadness)
            self.dispatch(
                (i, frame, it),
                i,
                node,
                args if dead is None else [None] * len(args),
                frame.id,
                it,
                dead is not None,
            )

    def _run_merge(self, i: int, frame: _Frame, it: int, st: _Iteration, node: BoundNode) -> None:
        """A Merge that fired (``merge_arrive``): its first live input, or dead."""
        outs = merge_outputs(
            st.merges.pop(i), node.inputs, lambda s: self._read(st, s), self._bound, i
        )
        self._complete(i, frame, it, outs, outs[1] if outs[1].__class__ is Dead else None)
        if self._trace is not None:
            self._trace_control(i)

    def _route(
        self, i: int, frame: _Frame, it: int, st: _Iteration, node: BoundNode, kind: int
    ) -> None:
        """Enter, Exit, NextIteration: move the value between frames and iterations."""
        dead = st.dead.get(i)
        value = dead if dead is not None else self._read(st, node.inputs[0])
        self._release_in(st, node)
        if self._trace is not None:
            self._trace_control(i)
        if kind == CF_ENTER:
            self._enter(i, frame, it, value)
        elif kind == CF_EXIT:
            self._exit(i, value, frame)
            self._done_token(frame, it)
        elif kind == CF_NEXT:
            if not isinstance(value, Dead):
                self._next_iteration(i, frame, it + 1, value)
            self._done_token(frame, it)
        else:
            raise errors.InternalError(
                None, self._bound.ops[i], f"unknown control-flow kind {kind}"
            )

    def _exit(self, i: int, value: Any, frame: _Frame) -> None:
        """Exit ``i`` of ``frame`` got ``value``: its first live value goes to the parent
        frame at once (a dead one waits: delivered dead if no live value ever comes).
        Into the root frame it is a step's result: a stream is told (``on_exit``)."""
        if isinstance(value, Dead):
            frame.dead_exits[i] = value
            return
        if i in frame.delivered:
            return
        frame.delivered.add(i)
        parent = frame.parent
        assert parent is not None
        self._deliver(i, value, parent, frame.parent_iter)
        if self._on_exit is not None and parent is self._root:
            self._on_exit(i, value)

    def _enter(self, i: int, frame: _Frame, it: int, value: Any) -> None:
        child = self._child(frame, it, self._info.child[i])
        if child.fast is not None:
            self._enter_fast(child, i, value)
            self._done_token(frame, it)
            return
        if self._info.constant[i]:
            child.invariants.append((i, value))
            for k in list(child.iters):
                self._deliver(i, value, child, k)
        else:
            self._deliver(i, value, child, 0)
        child.pending_enters -= 1
        self._done_token(frame, it)
        self._check_iteration(child, 0)

    def _next_iteration(self, i: int, frame: _Frame, nxt: int, value: Any) -> None:
        """NextIteration ``i`` carries ``value`` into iteration ``nxt`` (at most
        ``parallel_iterations`` in flight: later ones queue)."""
        if nxt in frame.iters:
            self._deliver(i, value, frame, nxt)
        elif (
            len(frame.iters) < self._info.frames[frame.static].parallel_iterations
            and not frame.waiting
        ):
            self._new_iteration(frame, nxt)
            self._deliver(i, value, frame, nxt)
        else:
            frame.waiting.append((nxt, i, value))

    def _run_inline(self, i: int, frame: _Frame, it: int, st: _Iteration, node: BoundNode) -> None:
        """A live inline node: the common case of a loop body, in one piece (what
        ``_complete`` / ``_activate`` / ``_release`` / ``_done_token`` do, without the
        dead-tensor checks a live node's own outputs never need)."""
        vals = st.vals
        initial = self._initial
        v = node.kernel(*[vals[s] if s in vals else initial[s] for s in node.inputs])
        nout = node.num_outputs
        if nout == 1:
            vals[node.out] = v
        elif nout:
            for k, o in enumerate(check_outputs(v, nout)):
                vals[node.out + k] = o
        kinds = self._info.kind
        pending = st.pending
        initial_pending = self._initial_pending
        push = self._fready.append
        for c, data, control in self._bound.plan.edges_out[i]:
            if kinds[c] == CF_MERGE:
                self._activate_merge(c, frame, it, st, data, control)
                continue
            p = pending.get(c, initial_pending[c]) - 1
            if p:
                pending[c] = p
            else:
                pending.pop(c, None)
                st.outstanding += 1
                push((c, frame, it))
        self._release_in(st, node)
        st.outstanding -= 1
        if not st.outstanding:
            self._check_iteration(frame, it)

    def _complete_token(self, token: Any, v: Any) -> None:
        i, frame, it = token
        node = self._nodes[i]
        if isinstance(v, Dead):
            self._complete(i, frame, it, (v,) * node.num_outputs, v)
            return
        nout = node.num_outputs
        outs = (v,) if nout == 1 else (tuple(check_outputs(v, nout)) if nout else ())
        self._complete(i, frame, it, outs, None)

    # -- propagation -------------------------------------------------------------------

    def _complete(
        self, i: int, frame: _Frame, it: int, outs: Sequence[Any], dead: Dead | None
    ) -> None:
        """Store node ``i``'s outputs in (frame, it) and activate its consumers there."""
        st = frame.iters[it]
        if dead is not None:
            st.dead[i] = dead
        node = self._nodes[i]
        if len(outs) != node.num_outputs:
            raise errors.InternalError(
                None, None, f"kernel returned {len(outs)} values, expected {node.num_outputs}"
            )
        vals = st.vals
        for k, v in enumerate(outs):
            vals[node.out + k] = v
        self._activate(i, frame, it, st, dead)
        self._release_in(st, node)
        self._done_token(frame, it)

    def _release_in(self, st: _Iteration, node: BoundNode) -> None:
        """Free the slots whose last reader in this iteration ``node`` is."""
        vals = st.vals
        for s in node.frees:
            vals.pop(s, None)
        if node.counted:
            refs = st.refs
            initial = self._initial_refs
            assert initial is not None
            for s in node.counted:
                r = refs.get(s, initial[s]) - 1
                if r:
                    refs[s] = r
                else:
                    refs.pop(s, None)
                    vals.pop(s, None)

    def _deliver(self, i: int, value: Any, frame: _Frame, it: int) -> None:
        """Enter / Exit / NextIteration: put ``value`` into (frame, it) and activate there
        (an Exit into the root frame: its flat lists, readying root nodes)."""
        if frame is self._root:
            node = self._nodes[i]
            self._vals[node.out] = value
            self._propagate(i, node, value if value.__class__ is Dead else None, False)
            return
        st = frame.iters[it]
        st.vals[self._nodes[i].out] = value
        dead = value if isinstance(value, Dead) else None
        self._activate(i, frame, it, st, dead)

    def _activate(
        self, i: int, frame: _Frame, it: int, st: _Iteration, src_dead: Dead | None
    ) -> None:
        info = self._info
        initial_pending = self._initial_pending
        for c, data, control in self._bound.plan.edges_out[i]:
            if info.kind[c] == CF_MERGE:
                self._activate_merge(c, frame, it, st, data, control)
                continue
            edge_dead = first_dead(st.vals.get(slot) for _, slot in data) or (
                src_dead if control else None
            )
            if edge_dead is not None and c not in st.dead:
                st.dead[c] = edge_dead
            p = st.pending.get(c, initial_pending[c]) - 1
            if p == 0:
                st.pending.pop(c, None)
                self._push(c, frame, it)
            else:
                st.pending[c] = p

    def _activate_merge(
        self,
        c: int,
        frame: _Frame,
        it: int,
        st: _Iteration,
        data: Sequence[tuple[int, int]],
        control: bool,
    ) -> None:
        m = st.merges.get(c)
        if m is None:
            m = st.merges[c] = [self._info.merge_controls[c], 0, -1, False, None]
        vals = st.vals
        expected = 1 if self._info.loop_merge[c] else self._nodes[c].arity
        if merge_arrive(m, [(pos, vals.get(slot)) for pos, slot in data], control, expected):
            self._push(c, frame, it)

    # -- frames and iterations ------------------------------------------------------------

    def _child(self, frame: _Frame, it: int, static: int) -> _Frame:
        child = frame.children.get((it, static))
        if child is None:
            sf = self._info.frames[static]
            child = _Frame(static, f"{frame.name};{it};{sf.name}", frame, it, sf.num_enters)
            loop = self._loops[static] if self._loops else None
            if loop is not None:
                child.fast = loop.start()
            frame.children[(it, static)] = child
            frame.iters[it].children += 1
        return child

    # -- the fast path -----------------------------------------------------------------

    def _enter_fast(self, child: _Frame, i: int, value: Any) -> None:
        """Enter ``i`` delivers into a fast frame instance: it starts with the last one."""
        run = child.fast
        assert run is not None
        if self._info.constant[i]:
            child.invariants.append((i, value))  # for a hand-back to the general form
        run.entered.append((i, value))
        child.pending_enters -= 1
        if child.pending_enters:
            return
        if run.begin():
            self._fready.append((-1, child, 0))
            return
        # A value entered dead: the general form runs the frame, from its Enters.
        child.fast = None
        for e, v in run.entered:
            self._deliver(e, v, child, 0)
        self._check_iteration(child, 0)

    def _run_fast(self, frame: _Frame, until: float) -> bool:
        """Advance a fast frame instance; False when the clock passed ``until``."""
        run = frame.fast
        assert run is not None
        outcome = run.advance(until, self)
        if outcome == RUNNING:
            return False
        if outcome == FAILED:
            return True
        frame.fast = None
        frame.iters.clear()
        parent = frame.parent
        assert parent is not None
        if outcome == DONE:  # the last iteration's Exits
            for e, v in run.exits:
                if self._trace is not None:
                    self._trace_control(e)
                self._exit(e, v, frame)
            self._frame_done(frame)
            return True
        assert outcome == HANDOFF
        # An iteration with a true predicate ended with a dead NextIteration: its
        # Exits were dead (the loop Switches' false sides); the general form decides.
        for e, marker in run.loop.exit_markers:
            frame.dead_exits[e] = marker
        live = [(n, v) for n, v in run.carried if not isinstance(v, Dead)]
        if not live:
            self._frame_done(frame)
            return True
        nxt = run.iteration + 1
        self._new_iteration(frame, nxt)
        for n, v in live:
            self._deliver(n, v, frame, nxt)
        self._check_iteration(frame, nxt)
        return True

    def _new_iteration(self, frame: _Frame, it: int) -> None:
        frame.iters[it] = _Iteration()
        for e, value in frame.invariants:
            self._deliver(e, value, frame, it)

    def _done_token(self, frame: _Frame, it: int) -> None:
        frame.iters[it].outstanding -= 1
        self._check_iteration(frame, it)

    def _check_iteration(self, frame: _Frame, it: int) -> None:
        while True:
            st = frame.iters.get(it)
            if st is None or st.outstanding or st.children or frame is self._root:
                return
            if it == 0 and frame.pending_enters > 0:
                return
            if it > 0 and (it - 1) in frame.iters:
                return
            del frame.iters[it]  # the iteration's values go with it
            if (
                frame.waiting
                and len(frame.iters) < self._info.frames[frame.static].parallel_iterations
            ):
                nxt = frame.waiting[0][0]
                self._new_iteration(frame, nxt)
                while frame.waiting and frame.waiting[0][0] == nxt:
                    _, node, value = frame.waiting.popleft()
                    self._deliver(node, value, frame, nxt)
            if it + 1 in frame.iters:
                it += 1
                continue
            if not frame.iters and not frame.waiting:
                self._frame_done(frame)
            return

    def _frame_done(self, frame: _Frame) -> None:
        parent = frame.parent
        assert parent is not None
        for e in self._info.frames[frame.static].exits:
            if e not in frame.delivered:
                dead = frame.dead_exits.get(e) or Dead(self._bound.ops[e].name)
                self._deliver(e, dead, parent, frame.parent_iter)
        del parent.children[(frame.parent_iter, frame.static)]
        parent.iters[frame.parent_iter].children -= 1
        self._check_iteration(parent, frame.parent_iter)
