"""Loop frames as straight-line programs: the frame propagator's fast path.

:func:`fast_loops` binds the compiler's
:class:`~asyncflow.compiler.loop_schedule.LoopSchedule` of each eligible loop frame
to the plan's kernels (once per bound plan, remembered with it; the step hands them
to its :class:`~asyncflow.runtime.propagators.PropagatorState`): the head and the
body of an iteration that goes on each become one block function
(:mod:`asyncflow.runtime.block_code`: a live kernel's call written out on its line,
any other node the straight-line interpreter's closure for it, called on its line;
:func:`~asyncflow.runtime.interpreter.write_instr`).  :class:`LoopRun` is one
instance of such a frame in a step: one flat value list, reused from iteration to
iteration, and the iteration counter.

A partition that runs as one program (``loop_schedule.root_runs_straight_line``)
holds each loop frame as one instruction: its
:class:`~asyncflow.runtime.interpreter.ProgramPropagator` starts a ``LoopRun`` on the
Enters' values, advances it (resumable, as below) and stores its Exits' values; such
a loop is closed (it never hands back).  Elsewhere the
:class:`~asyncflow.runtime.propagators.PropagatorState` stays in charge of frames:
it creates a ``LoopRun`` when the frame is entered, gives it the Enters' values, calls :meth:`LoopRun.advance` from its drain (resumable between iterations,
so the step still yields to the event loop on its time slice), and afterwards
delivers the Exits.  When a run meets what the straight-line programs do not model
(a loop variable entering dead, or NextIterations of one iteration not all live),
it stops at an iteration boundary and the frame propagator carries on in general
form from there; that is always exact, because every iteration so far ran whole.

Which frames run here: see :mod:`asyncflow.compiler.loop_schedule` and its
``runs_straight_line`` rule (every kernel of the frame synchronous).  A traced step
(``FULL_TRACE``) runs the same programs with its traced kernels (each records its
frame and iteration; the loop's Merges and the body's Switches and Merges are
recorded as control).  ``ExecutorOptions(straight_line=False)`` turns the fast path
off.
"""

from __future__ import annotations

import asyncio
import operator
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from asyncflow.compiler.loop_schedule import (
    I_SWITCH,
    LoopSchedule,
    runs_straight_line,
)
from asyncflow.runtime.block_code import Block, BlockWriter, node_of
from asyncflow.runtime.gc_pause import gc_paused
from asyncflow.runtime.interpreter import BInstr, bind_instr, run_program, write_instr
from asyncflow.runtime.observe.trace import StepTrace
from asyncflow.runtime.propagators import (
    CHECK_EVERY,
    DONE,
    FAILED,
    HANDOFF,
    RUNNING,
    Dead,
    slice_over,
)

if TYPE_CHECKING:
    from asyncflow.runtime.bind import BoundPlan
    from asyncflow.runtime.propagators import Step

__all__ = ["BoundLoop", "LoopRun", "fast_loops"]


class BoundLoop:
    """A loop frame's schedule with its kernels (made once per bound plan)."""

    __slots__ = (
        "carries",
        "carry_frees",
        "enters",
        "exit_markers",
        "final",
        "head",
        "head_lines",
        "index_slots",
        "merge_slots",
        "merges",
        "name",
        "pred",
        "pred_node",
        "schedule",
        "sources",
        "template",
        "true",
        "true_frees",
        "true_lines",
        "work",
    )

    def __init__(
        self,
        schedule: LoopSchedule,
        nodes: Sequence[Any],
        ops: Sequence[Any],
        name: str = "",
        merges: tuple[int, ...] = (),
    ) -> None:
        self.schedule = schedule
        #: The frame's name (what a traced kernel records with its iteration).
        self.name = name
        #: Traced plans: the loop Merges, recorded as control at every iteration (the
        #: programs route the loop variables without running them); else empty.
        self.merges = merges
        traced = bool(merges)
        self.template = schedule.template
        self.enters = dict(schedule.enters)
        self.pred = schedule.pred
        head = [bind_instr(x, nodes, ops) for x in schedule.head]
        true = [bind_instr(x, nodes, ops) for x in schedule.true]
        #: The head and a continuing iteration's body, each one block function
        #: (``block_code``: a line per node), and the node of each of their lines
        #: (what a failing line names).
        self.head, self.head_lines = _block(head, traced)
        self.true, self.true_lines = _block(true, traced)
        self.final = tuple(bind_instr(x, nodes, ops) for x in schedule.final)
        self.true_frees = schedule.true_frees
        self.carries = schedule.carries
        sources = [src for _, src, _ in schedule.carries]
        #: The NextIterations' values, as a tuple, read from the value list at once.
        self.sources: Callable[[list[Any]], tuple[Any, ...]] = (
            operator.itemgetter(*sources) if len(sources) > 1 else _one_getter(sources[0])
        )
        self.merge_slots = tuple(m for _, _, m in schedule.carries)
        self.carry_frees = schedule.carry_frees
        self.index_slots = tuple((s, np.int32(e), np.int32(n)) for s, e, n in schedule.index_slots)
        #: Per Exit: the dead value it holds in an iteration whose predicate is true.
        self.exit_markers = tuple((e, Dead(ops[sw].name)) for e, sw in schedule.exits)
        # A predicate that is no truth value fails the first loop Switch, which tests it.
        self.pred_node = next((x.node for x in schedule.final if x.kind == I_SWITCH), -1)
        #: Nodes an iteration counts against the step's CHECK_EVERY budget.
        self.work = max(1, len(head) + len(true))

    def start(self) -> LoopRun:
        """A new instance of the frame (its Enters' values come next)."""
        return LoopRun(self)


#: The bound fast paths of each bound plan, made on its first step.
_BOUND: weakref.WeakKeyDictionary[BoundPlan, tuple[BoundLoop | None, ...]] = (
    weakref.WeakKeyDictionary()
)


def fast_loops(bound: BoundPlan) -> tuple[BoundLoop | None, ...]:
    """Per static frame of ``bound``'s plan: its fast path, or None (general path)."""
    if not bound.options.straight_line or not bound.plan.loop_schedules:
        return ()
    loops = _BOUND.get(bound)
    if loops is None:
        loops = _BOUND[bound] = _bind_loops(bound)
    return loops


def _bind_loops(bound: BoundPlan) -> tuple[BoundLoop | None, ...]:
    nodes, ops = bound.nodes, bound.ops
    out: list[BoundLoop | None] = []
    for schedule in bound.plan.loop_schedules:
        if schedule is None or not runs_straight_line(nodes[i] for i in schedule.members):
            out.append(None)  # a kernel that does not run inline: the general path
        else:
            frames = bound.plan.frames
            assert frames is not None
            merges = (
                tuple(i for i in schedule.members if frames.loop_merge[i])
                if bound.derived.get("traced")
                else ()
            )
            out.append(BoundLoop(schedule, nodes, ops, frames.frames[schedule.frame].name, merges))
    return tuple(out) if any(b is not None for b in out) else ()


class LoopRun:
    """One frame instance on the fast path: its values and its iteration."""

    __slots__ = ("carried", "entered", "exits", "iteration", "loop", "vals")

    def __init__(self, loop: BoundLoop) -> None:
        self.loop = loop
        self.vals: list[Any] = []
        self.iteration = 0
        #: The Enters' (node, value) in arrival order (replayed if the run hands off).
        self.entered: list[tuple[int, Any]] = []
        #: FINAL: the Exits' (node, value), live or dead, in the order they ran.
        self.exits: list[tuple[int, Any]] = []
        #: HANDOFF: the NextIterations' (node, value) of the last iteration.
        self.carried: list[tuple[int, Any]] = []

    def begin(self) -> bool:
        """Every Enter arrived: fill the value list.  False when a value entered dead
        (the general path runs such a frame)."""
        if any(v.__class__ is Dead for _, v in self.entered):
            return False
        vals = self.vals = list(self.loop.template)
        targets = self.loop.enters
        for e, v in self.entered:
            for s in targets[e]:
                vals[s] = v
        for s, first, _ in self.loop.index_slots:
            vals[s] = first
        self.entered = []  # the loop variables' first values live in ``vals`` now
        return True

    # The per-iteration hot loop of a loop frame, kept in one piece: the head, the
    # predicate, the body and the carries of an iteration without a call between them.
    def advance(self, until: float, step: Step) -> int:  # noqa: C901
        """Run iterations until the loop ends (DONE, or HANDOFF to the general path),
        the clock passes ``until`` (RUNNING: call again), or a node fails (FAILED: the
        step has the error, naming the node)."""
        loop = self.loop
        vals = self.vals
        head, true, final = loop.head, loop.true, loop.final
        pred, true_frees, carry_frees = loop.pred, loop.true_frees, loop.carry_frees
        sources, merge_slots, index_slots = loop.sources, loop.merge_slots, loop.index_slots
        work = loop.work
        budget = CHECK_EVERY
        k = self.iteration
        trace = step._trace  # a traced step: its kernels record the iteration
        while True:
            if trace is not None:
                _record_iteration(trace, loop, k)
            try:
                head(vals, None)
            except (Exception, asyncio.CancelledError) as exc:  # the kernel's (Step.fail)
                return self._fail(step, head, loop.head_lines, exc)
            p = vals[pred]
            try:
                go = p.__class__ is not Dead and bool(p)
            except Exception as exc:  # not a truth value: the loop Switch fails on it
                step.fail(loop.pred_node, exc)
                return FAILED
            if not go:
                self.iteration = k
                return DONE if run_program(final, vals, step, self.exits) else FAILED
            for s in true_frees:
                vals[s] = None
            try:
                true(vals, None)
            except (Exception, asyncio.CancelledError) as exc:  # the kernel's (Step.fail)
                return self._fail(step, true, loop.true_lines, exc)
            carry = sources(vals)
            for s in carry_frees:
                vals[s] = None
            for v in carry:
                if v.__class__ is Dead:  # the general path decides what comes next
                    self.iteration = k
                    self.carried = [(n, c) for (n, _, _), c in zip(loop.carries, carry)]
                    return HANDOFF
            for s, v in zip(merge_slots, carry):
                vals[s] = v
            if index_slots:
                for s, _, nxt in index_slots:
                    vals[s] = nxt
            k += 1
            budget -= work
            if budget <= 0:
                budget = CHECK_EVERY
                if slice_over(until) or step._error is not None:
                    self.iteration = k
                    return RUNNING

    def _fail(self, step: Step, block: Block, lines: tuple[int, ...], exc: BaseException) -> int:
        """A line of ``block`` raised ``exc``: its node fails the step."""
        step.fail(node_of(block, lines, exc), exc)
        return FAILED


def _block(instrs: list[BInstr], traced: bool) -> tuple[Block, tuple[int, ...]]:
    """A loop program as one block function, and the node of each of its lines."""
    block = BlockWriter(None)  # (no joins: nothing is pending in a loop frame)
    with gc_paused(promote_after=0):  # new objects, none cyclic, kept with the plan
        for x in instrs:
            write_instr(block, x, traced)
        return block.make(), tuple(block.where)


def _one_getter(slot: int) -> Callable[[list[Any]], tuple[Any, ...]]:
    """``operator.itemgetter(slot)``, but giving a 1-tuple."""

    def get(vals: list[Any]) -> tuple[Any, ...]:
        return (vals[slot],)

    return get


def _record_iteration(trace: StepTrace, loop: BoundLoop, k: int) -> None:
    """A traced step starts iteration ``k`` of ``loop``: its kernels record it, and its
    loop Merges are recorded as control."""
    trace.label = (loop.name, k)
    now = time.time()
    for m in loop.merges:
        trace.record(m, "control", now, now, ())
