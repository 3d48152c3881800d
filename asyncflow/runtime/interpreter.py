"""The straight-line interpreter: the one engine that runs instruction programs.

The compiler lowers what a fixed order can express into programs of
:class:`~asyncflow.compiler.loop_schedule.Instr` (a partition of synchronous kernels
whose root frame routes nothing, its loops one instruction each, or without control
flow with async calls, each started (:class:`Start`: ``Step.start``) and joined
before its first reader (:class:`Join`; ``loop_schedule.start_schedule``):
:func:`asyncflow.runtime.static_order.lower_static_order`; a simple loop frame's
iteration: :mod:`asyncflow.compiler.loop_schedule`).  Here an
instruction is bound to its kernel as a closure over its slots (one call per node:
no unpacking, no dispatch on its kind), and a partition's program is written as one
Python function per block (:mod:`asyncflow.runtime.block_code`: a plain kernel's
call and a started node's start written out on its line, any other instruction its
closure's call); programs run over one flat value list, freeing each slot after its
last reader.  :class:`ProgramPropagator` runs a partition's program a block at a
time; :mod:`asyncflow.runtime.loop_fastpath` runs a loop frame's closures iteration
after iteration (for a program's loop instruction, or for the general propagator).
Everything else runs on the general propagators.

The rules are the engines' shared ones: a dead input makes a node dead, a Switch
routes by :func:`~asyncflow.runtime.propagators.switch_outputs`, a Merge takes its
first live candidate (:func:`merge_pick`), a failing kernel goes to ``Step.fail``,
the clock is asked through :func:`~asyncflow.runtime.propagators.slice_over`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from types import MethodType
from typing import TYPE_CHECKING, Any

import numpy as np

from asyncflow import errors
from asyncflow.compiler.loop_schedule import (
    I_CONST,
    I_EXIT,
    I_KERNEL,
    I_LOOP,
    I_MERGE,
    I_SWITCH,
    Instr,
    started,
)
from asyncflow.framework import registry
from asyncflow.runtime.block_code import Block, BlockWriter, calls_of, node_of
from asyncflow.runtime.gc_pause import gc_paused
from asyncflow.runtime.observe.trace import current_trace, traced_op
from asyncflow.runtime.propagators import (
    DONE,
    FAILED,
    RUNNING,
    Dead,
    StepSide,
    check_outputs,
    first_dead,
    slice_over,
    switch_outputs,
)
from asyncflow.runtime.resources import WOULD_BLOCK
from asyncflow.runtime.static_order import StaticProgram, lower_static_order

if TYPE_CHECKING:
    from asyncflow.runtime.bind import BoundNode, BoundPlan
    from asyncflow.runtime.propagators import FastLoop, FastRun, Step

__all__ = [
    "PROGRAM_SLOTS",
    "BInstr",
    "BoundProgram",
    "LoopsOf",
    "Op",
    "ProgramPropagator",
    "RunLoop",
    "bind_instr",
    "closure",
    "execute",
    "lowering_due",
    "merge_pick",
    "program_of",
    "run_program",
    "write_instr",
]


def merge_pick(vals: list[Any], candidates: Sequence[tuple[int, Any]]) -> tuple[Any, Any]:
    """THE straight-line form of the Merge rule: (value, index) of the first live
    candidate ``(slot, index)`` in program order, or (dead, dead) with the first dead
    one when none is live.  (The pending-count engines fire on the same rule as
    inputs arrive: :func:`~asyncflow.runtime.propagators.merge_arrive`.)"""
    first_dead = None
    for slot, index in candidates:
        v = vals[slot]
        if v.__class__ is not Dead:
            return v, index
        if first_dead is None:
            first_dead = v
    return first_dead, first_dead


# The commonest closures' bodies, bound (``types.MethodType``) to one tuple of the
# node's kernel and slots: a bound method and a tuple per node are 144 bytes, a
# closure over cells 448 (a function, its cells tuple and a cell per value), and a
# large program keeps one per node.  The call is the same one call per node.


def _k2(node: tuple[Any, int, int, int], vals: list[Any]) -> None:
    kernel, a, b, out = node
    vals[out] = kernel(vals[a], vals[b])


def _k2f(node: tuple[Any, int, int, int, int], vals: list[Any]) -> None:
    kernel, a, b, out, r = node
    vals[out] = kernel(vals[a], vals[b])
    vals[r] = None


def _k1(node: tuple[Any, int, int], vals: list[Any]) -> None:
    kernel, a, out = node
    vals[out] = kernel(vals[a])


def _k1f(node: tuple[Any, int, int, int], vals: list[Any]) -> None:
    kernel, a, out, r = node
    vals[out] = kernel(vals[a])
    vals[r] = None


def _k2ff(node: tuple[Any, int, int, int, int, int], vals: list[Any]) -> None:
    kernel, a, b, out, r, q = node
    vals[out] = kernel(vals[a], vals[b])
    vals[r] = vals[q] = None


def _k3(node: tuple[Any, int, int, int, int, tuple[int, ...]], vals: list[Any]) -> None:
    kernel, a, b, c, out, frees = node
    vals[out] = kernel(vals[a], vals[b], vals[c])
    for r in frees:
        vals[r] = None


def _kn(node: tuple[Any, tuple[int, ...], int, tuple[int, ...]], vals: list[Any]) -> None:
    kernel, ins, out, frees = node
    vals[out] = kernel(*[vals[s] for s in ins])
    for r in frees:
        vals[r] = None


def _kmany(node: tuple[Any, tuple[int, ...], int, int, tuple[int, ...]], vals: list[Any]) -> None:
    kernel, ins, out, nout, frees = node  # several outputs, or none
    v = kernel(*[vals[s] for s in ins])
    if nout:
        vals[out : out + nout] = check_outputs(v, nout)
    for r in frees:
        vals[r] = None


def _kernel_closure(
    kernel: Any, ins: tuple[int, ...], out: int, nout: int, frees: tuple[int, ...]
) -> Op:
    """A kernel's closure, the shortest body for its shape: the commonest shapes (one
    output, one or two inputs, at most two slots to free; a traced kernel's with its
    recording fused in: ``trace.traced_op``) and three inputs have their own, every
    other shape (no input or more than three, several outputs or none) a general one.
    Any kernel shape runs here (see ``runs_straight_line``); in a loop body every
    node is one such call per iteration."""
    if nout != 1:
        return MethodType(_kmany, (kernel, ins, out, nout, frees))
    if len(frees) <= 1:
        traced = traced_op(kernel, ins, out, frees[0] if frees else -1)
        if traced is not None:
            return traced
    n = len(ins)
    if n == 2:
        a, b = ins
        if not frees:
            return MethodType(_k2, (kernel, a, b, out))
        if len(frees) == 1:
            return MethodType(_k2f, (kernel, a, b, out, frees[0]))
        if len(frees) == 2:
            return MethodType(_k2ff, (kernel, a, b, out, *frees))
    elif n == 1 and len(frees) <= 1:
        if frees:
            return MethodType(_k1f, (kernel, ins[0], out, frees[0]))
        return MethodType(_k1, (kernel, ins[0], out))
    elif n == 3:
        return MethodType(_k3, (kernel, *ins, out, frees))
    return MethodType(_kn, (kernel, ins, out, frees))


#: One bound instruction: what the interpreter unpacks.
#: (kind, kernel or None, input slots, out slot, outputs, check slots, frees, node, extra)
BInstr = tuple[int, Any, tuple[int, ...], int, int, tuple[int, ...], tuple[int, ...], int, Any]
#: An instruction of the head or of an iteration that goes on, as a closure over
#: its slots and kernel (one call per node: no unpacking, no dispatch on its kind).
Op = Callable[[list[Any]], None]


class Hop(Exception):  # (a signal between a closure and its runner, not an error)
    """A node's ``nowait`` twin could not finish it inline: the program's runner hands
    the node to the step's dispatch (its ``inputs``) and waits for its value, then
    stores it at ``out`` (``nout`` outputs) and frees ``frees``."""

    def __init__(
        self, node: int, args: list[Any], out: int, nout: int, frees: tuple[int, ...]
    ) -> None:
        super().__init__(node)
        self.node, self.inputs, self.out, self.nout, self.frees = node, args, out, nout, frees

    def store(self, vals: list[Any], value: Any) -> None:
        """The node's value arrived: its outputs into ``vals``, its inputs freed."""
        _store(vals, value, self.out, self.nout, self.frees)


#: The first output slot of a started node whose value has not arrived yet.
_PENDING: Any = type("_Pending", (), {"__repr__": lambda self: "<pending>"})()


class Start:
    """A started node (an async kernel the program dispatches and goes on; its line
    of the block, ``BlockWriter.start``, reads its inputs and frees their last
    reads): its token, and where its value goes when it arrives
    (:meth:`ProgramPropagator.complete`)."""

    __slots__ = ("node", "nout", "out", "own")

    def __init__(self, x: Instr) -> None:
        self.node, self.out, self.nout = x.node, x.out, x.num_outputs
        #: Its unread outputs, freed as they arrive (``ProgramPropagator.complete``).
        self.own = tuple(r for r in x.frees if x.out <= r < x.out + x.num_outputs)


class Join:
    """The program waits here until started ``node``'s value arrived (its first output
    slot holds no :data:`_PENDING`, which the block's line checks): at the top of the
    block that first reads it (``ahead`` 0: the program resumes at that block), or checked ahead at the end
    of the block before (``ahead`` 1: it resumes at the next block, which checks its
    joins again; a block that waits is not called once more only to wait)."""

    __slots__ = ("ahead", "node")

    def __init__(self, node: int, ahead: int = 0) -> None:
        self.node, self.ahead = node, ahead


class RunLoop(Exception):  # (a signal between a closure and its runner, not an error)
    """A program reached a loop frame's instruction (``I_LOOP``): its runner starts the
    frame's :class:`~asyncflow.runtime.propagators.FastRun` on ``entered`` (the Enters'
    values, read here: their slots ``frees`` are free already) and goes on after it
    when the loop is done."""

    def __init__(self, loop: FastLoop, entered: list[tuple[int, Any]]) -> None:
        super().__init__(loop)
        self.loop, self.entered = loop, entered


def _loop_closure(loop: FastLoop, enters: tuple[int, ...], x: Instr) -> Op:
    """Loop frame instruction ``x`` bound to the frame's fast path ``loop``: it hands
    the Enters' values to the runner (:class:`RunLoop`), which runs the frame (a loop
    yields to the event loop between iterations, which one closure call cannot)."""
    pairs = tuple(zip(enters, x.ins, strict=True))
    frees = x.frees

    def run_loop(vals: list[Any]) -> None:
        entered = [(e, vals[s]) for e, s in pairs]
        for r in frees:
            vals[r] = None
        raise RunLoop(loop, entered)

    return run_loop


def _store(vals: list[Any], value: Any, out: int, nout: int, frees: tuple[int, ...]) -> None:
    """A kernel's value ``value`` into its ``nout`` output slots from ``out``; then its
    last reads' slots ``frees`` are freed."""
    if nout == 1:
        vals[out] = value
    elif nout:
        vals[out : out + nout] = check_outputs(value, nout)
    for r in frees:
        vals[r] = None


#: ``BInstr.extra`` of an async kernel: a program has one only when it runs by its
#: ``nowait`` twin and may hop (``loop_schedule.runs_straight_line``).
_HOPS = "hops"


def bind_instr(x: Instr, nodes: Sequence[Any], ops: Sequence[Any]) -> BInstr:
    extra: Any = None
    kernel: Any = None
    if x.kind == I_KERNEL:
        bound = nodes[x.node]
        kernel = bound.kernel
        if bound.flow == registry.ASYNC:  # in a program only by its nowait twin
            extra = _HOPS
    elif x.kind == I_CONST:
        extra = x.value
    elif x.kind == I_SWITCH:
        extra = Dead(ops[x.node].name)
    elif x.kind == I_MERGE:
        extra = tuple(np.int32(p) for p in x.positions)
    return (x.kind, kernel, x.ins, x.out, x.num_outputs, x.checks, x.frees, x.node, extra)


def _recorded(run: Op, node: int) -> Op:
    """A routing instruction (Switch, Merge) of a traced plan: recorded as control."""

    def recorded(vals: list[Any]) -> None:
        run(vals)
        trace = current_trace()
        if trace is not None:
            now = time.time()
            trace.record(node, "control", now, now, ())

    return recorded


def closure(x: BInstr, traced: bool = False) -> Op:
    """Instruction ``x`` (of the head or of an iteration that goes on) as a closure
    (``traced``: a routing instruction records itself)."""
    kind, kernel, ins, out, nout, checks, frees, node, extra = x
    run = _live_closure(kind, kernel, ins, out, nout, frees, extra, node)
    if traced and kind in (I_SWITCH, I_MERGE):
        run = _recorded(run, node)
    if not checks:
        return run
    dead_outs = range(out, out + nout)
    if len(checks) == 1 and nout == 1:  # a node of one cond branch, most often
        (c,) = checks

        def checked_one(vals: list[Any]) -> None:  # first_dead of one slot, inline
            v = vals[c]
            if v.__class__ is Dead:
                vals[out] = v
                for r in frees:
                    vals[r] = None
            else:
                run(vals)

        return checked_one

    def checked(vals: list[Any]) -> None:
        dead = first_dead(map(vals.__getitem__, checks))  # the node may be dead
        if dead is None:
            run(vals)
            return
        for o in dead_outs:
            vals[o] = dead
        for r in frees:
            vals[r] = None

    return checked


def write_instr(block: BlockWriter, x: BInstr, traced: bool = False) -> None:
    """Bound instruction ``x`` as a line of ``block``
    (:class:`~asyncflow.runtime.block_code.BlockWriter`): a live kernel of one output
    as its call written out (the block's kernel line), any other instruction (one
    that may be dead, route, hop, give several outputs, or a compact traced kernel,
    which records) as its closure's call (:func:`closure`: the rules stay there)."""
    kind, kernel, ins, out, nout, checks, frees, node, extra = x
    if (
        kind == I_KERNEL
        and nout == 1
        and not checks
        and extra is not _HOPS
        and getattr(kernel, "compact", None) is None
    ):
        block.kernel(node, kernel, ins, out, frees)
    else:
        block.call(node, closure(x, traced))


def _live_closure(
    kind: int,
    kernel: Any,
    ins: tuple[int, ...],
    out: int,
    nout: int,
    frees: tuple[int, ...],
    extra: Any,
    node: int,
) -> Op:
    """The closure of a live node: a kernel's by its shape (:func:`_kernel_closure`),
    a routing node's or a constant's by its kind."""
    if kind == I_KERNEL:
        if extra is _HOPS:
            return _hop_closure(kernel, ins, out, nout, frees, node)
        return _kernel_closure(kernel, ins, out, nout, frees)
    if kind == I_SWITCH:
        data_slot, pred_slot = ins

        def switch(vals: list[Any]) -> None:
            vals[out], vals[out + 1] = switch_outputs(vals[data_slot], vals[pred_slot], extra)
            for r in frees:
                vals[r] = None

        return switch
    if kind == I_CONST:

        def const(vals: list[Any]) -> None:
            vals[out] = extra
            for r in frees:
                vals[r] = None

        return const
    if kind == I_MERGE:
        candidates = tuple(zip(ins, extra, strict=True))

        def merge(vals: list[Any]) -> None:
            vals[out], vals[out + 1] = merge_pick(vals, candidates)
            for r in frees:
                vals[r] = None

        return merge
    raise AssertionError(f"no closure for instruction kind {kind}")  # Exits run in final


def _hop_closure(
    kernel: Any, ins: tuple[int, ...], out: int, nout: int, frees: tuple[int, ...], node: int
) -> Op:
    """A kernel run by its ``nowait`` twin: the value at once, or :class:`Hop` (the
    runner dispatches the node).  A kernel without the twin (a traced copy's) always
    hops: the step's dispatch runs it as it would on the general engine."""
    nowait = getattr(kernel, "nowait", None)

    def hop(vals: list[Any]) -> None:
        args = [vals[s] for s in ins]
        v = WOULD_BLOCK if nowait is None else nowait(*args)
        if v is WOULD_BLOCK:
            raise Hop(node, args, out, nout, frees)
        _store(vals, v, out, nout, frees)

    return hop


def run_program(
    program: Sequence[BInstr], vals: list[Any], step: Step, exits: list[tuple[int, Any]] | None
) -> bool:
    """Run one straight-line program over ``vals``; False when a node failed (the
    step has its error)."""
    failed: list[int] = [-1]
    try:
        execute(program, vals, exits, failed)
    except (Exception, asyncio.CancelledError) as exc:  # the kernel's (Step.fail)
        step.fail(failed[0], exc)
        return False
    return True


# A per-node hot loop (every instruction of a loop frame's programs runs here), kept in
# one piece: one unpack and a branch on the kind per node, no call.
def execute(  # noqa: C901
    program: Sequence[BInstr],
    vals: list[Any],
    exits: list[tuple[int, Any]] | None = None,
    failed: list[int] | None = None,
) -> None:
    """Run instructions (any kind); a kernel's exception propagates, and ``failed[0]``
    (when given) says whose it was."""
    for kind, kernel, ins, out, nout, checks, frees, node, extra in program:
        if failed is not None:
            failed[0] = node
        if checks:  # the node may be dead: it is when any of these slots is
            dead = first_dead(map(vals.__getitem__, checks))
            if dead is not None:
                if kind == I_EXIT:
                    exits.append((node, dead))  # type: ignore[union-attr]
                elif nout == 1:
                    vals[out] = dead
                elif nout:
                    vals[out : out + nout] = (dead,) * nout
                for s in frees:
                    vals[s] = None
                continue
        if kind == I_KERNEL:
            n = len(ins)
            if n == 2:
                v = kernel(vals[ins[0]], vals[ins[1]])
            elif n == 1:
                v = kernel(vals[ins[0]])
            else:
                v = kernel(*[vals[s] for s in ins])
            if nout == 1:
                vals[out] = v
            elif nout:
                vals[out : out + nout] = check_outputs(v, nout)
        elif kind == I_SWITCH:
            vals[out], vals[out + 1] = switch_outputs(vals[ins[0]], vals[ins[1]], extra)
        elif kind == I_MERGE:
            vals[out], vals[out + 1] = merge_pick(vals, tuple(zip(ins, extra, strict=True)))
        elif kind == I_CONST:
            vals[out] = extra
        else:  # I_EXIT
            exits.append((node, vals[ins[0]]))  # type: ignore[union-attr]
        for s in frees:
            vals[s] = None


# -- partition programs ----------------------------------------------------------------------


class BoundProgram:
    """A partition's program bound to the kernels of one bound plan, in blocks (the
    started nodes a block joins first, then at most :data:`CHECK_EVERY` instructions:
    the points where a step looks at the clock), each one function
    (:mod:`asyncflow.runtime.block_code`).  A block is lowered and its function made when a step
    first reaches it: a large program is made over its first run's time slices (a
    deadline or a cancellation lands between two blocks), and costs nothing again."""

    __slots__ = ("_lines", "_loops", "_nodes", "args", "blocks", "program", "through")

    def __init__(
        self,
        program: StaticProgram,
        nodes: Sequence[BoundNode],
        args: tuple[tuple[int, int], ...],
        loops: Sequence[FastLoop | None] = (),
    ) -> None:
        self.program = program
        self._nodes = nodes
        #: Per static loop frame: its fast path (what a loop instruction runs).
        self._loops = loops
        #: Per block (``program.spans``): its function, or None until a step first
        #: runs it.
        self.blocks: list[Block | None] = [None] * len(program.spans)
        #: Per block: the node of each line of its function (what a failure names).
        self._lines: list[tuple[int, ...]] = [()] * len(program.spans)
        #: (slot, feed index) of every _Arg node.
        self.args = args
        #: The program is one block without a loop instruction or an async node (one
        #: started or one that may hop): a step of it cannot suspend, so it runs
        #: without being made (:func:`asyncflow.runtime.step.run_through`).
        self.through = False
        if len(self.blocks) == 1:  # made now (a step would make it at once): known now
            self.block(0)

    def block(self, b: int) -> Block:
        """Block ``b``'s function (lowered and made on first use)."""
        fn = self.blocks[b]
        if fn is not None:
            return fn
        program = self.program
        lo, hi, joins = program.spans[b]
        with gc_paused(promote_after=0):  # new objects, none cyclic, kept with the plan
            instrs = program.instrs(lo, hi)
            block = BlockWriter(_PENDING)
            for node in joins:
                slot = program.out_of(node)
                block.join(slot, Join(node))
            for x in instrs:
                self._write(block, x)
            if b + 1 < len(program.spans) and program.spans[b + 1][2]:
                # The next block's first join, checked ahead (see Join).
                node = program.spans[b + 1][2][0]
                slot = program.out_of(node)
                block.join(slot, Join(node, 1))
            fn = block.make()
        self.through = len(self.blocks) == 1 and all(
            x.kind != I_LOOP and (x.kind != I_KERNEL or self._nodes[x.node].flow != registry.ASYNC)
            for x in instrs
        )
        self._lines[b] = tuple(block.where)
        self.blocks[b] = fn
        return fn

    def _write(self, block: BlockWriter, x: Instr) -> None:
        """Instruction ``x``'s line: a started node's start, a loop's closure, any
        other instruction as :func:`write_instr` writes it."""
        if x.kind == I_LOOP:
            loop = self._loops[x.value]
            assert loop is not None  # (root_runs_straight_line: every loop has one)
            block.call(x.node, _loop_closure(loop, self.program.enters(x.value), x))
        elif x.kind == I_KERNEL and x.node in self.program.starts:
            start = Start(x)
            frees = tuple(r for r in x.frees if r not in start.own)
            block.start(x.node, start, x.ins, x.out, frees)
        else:
            write_instr(block, bind_instr(x, self._nodes, ()))

    def calls(self, b: int) -> list[tuple[int, Callable[..., Any]]]:
        """(node, callable) of each line of block ``b`` that calls a kernel or a
        closure (what the block runs besides starts and joins)."""
        return calls_of(self.block(b), self._lines[b])

    def node_at(self, b: int, exc: BaseException) -> int:
        """The node whose line of block ``b`` raised ``exc`` (-1: none found)."""
        fn = self.blocks[b]
        return -1 if fn is None else node_of(fn, self._lines[b], exc)


#: What a program's loop instructions run: per static frame of a bound plan, its fast
#: path (``loop_fastpath.fast_loops``, given by the step: it lives above this module).
LoopsOf = Callable[["BoundPlan"], Sequence["FastLoop | None"]]


def _no_loops(bound: BoundPlan) -> Sequence[FastLoop | None]:
    return ()


def program_of(bound: BoundPlan, loops_of: LoopsOf = _no_loops) -> BoundProgram | None:
    """The program ``bound``'s steps run, or None while its plan runs on the general
    path: the plan is lowered after ``ExecutorOptions.schedule_after`` runs (by
    default its first run pays nothing for it), once.  An observed copy of a plan
    binds the plan's program to its own kernels (and its loops to its own loop
    programs, ``loops_of``)."""
    derived = bound.derived
    program = derived.get("program")
    if program is not None:
        return program  # type: ignore[no-any-return]
    ref = derived.get("base")  # an observed copy's plan, weakly (see observe.hook.observed)
    base = ref() if ref is not None else None
    plan_program = _lowered(base if base is not None else bound, loops_of)
    if plan_program is None:
        return None
    if base is None:
        program = plan_program
    else:
        program = BoundProgram(
            plan_program.program, bound.nodes, plan_program.args, loops_of(bound)
        )
    derived["program"] = program
    return program


def lowering_due(bound: BoundPlan) -> bool:
    """The next run of ``bound``'s plan is lowered (:func:`program_of` would make its
    program now): it has run ``ExecutorOptions.schedule_after`` times, and its plan
    was not found to need the general path."""
    derived = bound.derived
    return derived.get("runs", 0) >= bound.options.schedule_after and not derived.get("unlowered")


def _lowered(bound: BoundPlan, loops_of: LoopsOf) -> BoundProgram | None:
    """The plan's own program, made once it has run enough (counts a run)."""
    derived = bound.derived
    program = derived.get("program")
    if program is not None:
        return program  # type: ignore[no-any-return]
    due = lowering_due(bound)
    derived["runs"] = derived.get("runs", 0) + 1
    if not due:
        return None
    plan = bound.plan
    # The calls its program starts (the plan is schedulable: the rule took them when
    # the plan was bound, ``loop_schedule.program_starts``; none in a plan of
    # synchronous kernels, asked in one look).
    starts = (
        frozenset()
        if plan.frames is not None or bound.all_inline
        else frozenset(i for i, n in enumerate(bound.nodes) if started(n))
    )
    # The nodes that may hop (an async kernel run by its ``nowait`` twin): a block
    # ends after each.
    hops = (
        frozenset()
        if bound.all_inline
        else frozenset(i for i, n in enumerate(bound.nodes) if n.flow == registry.ASYNC) - starts
    )
    with gc_paused():  # ~10x faster for a large plan in a large heap
        lowered = lower_static_order(plan, starts, hops)
    if lowered is None:
        derived["unlowered"] = True  # some node never becomes ready: the general path
        return None
    args = tuple((s, k) for s, (k, _) in zip(plan.arg_slots, plan.partition.args))
    program = derived["program"] = BoundProgram(lowered, bound.nodes, args, loops_of(bound))
    return program


#: The straight-line engine's state, per step (slots of the step's class).
PROGRAM_SLOTS = ("_end", "_loop_run", "_next", "_program", "_vals", "_waiting")


class ProgramPropagator(StepSide):
    """The straight-line engine of a step (a mixin of it: the step of such a plan *is*
    its propagator, one object per step in flight, see
    :class:`asyncflow.runtime.step.Step`).  Runs a :class:`BoundProgram`: every node
    once, in the plan's fixed order, no pending counts and no ready stack — what the
    general propagator computes for the partitions it takes (synchronous kernels, no
    routing in the root frame: nothing is dead or waited for).  Everything else the
    step does (first error, yielding on the clock, retvals) is unchanged.

    A node whose ``nowait`` twin cannot finish it inline (:class:`Hop`) is
    dispatched: the step runs it as the general engine would (a task, a worker
    thread), the program waits, and :meth:`complete` stores its value and resumes
    right after it (a hop ends its block: at the next one).  A started call
    (:class:`Start`) is started the same way (by ``Step.start``, where the dispatch
    hands such a node) but the program goes on, the Start its token; its value is
    pending in its first output slot until :meth:`complete` stores it, and a
    :class:`Join` at the top of the block of its first reader waits for that
    (``has_ready`` is false while a join waits; the block runs again when it
    arrives).  A loop frame's
    instruction (:class:`RunLoop`) runs the frame's own programs (:mod:`asyncflow.runtime.loop_fastpath`) until it is done — across
    drains when the clock runs out between iterations — then the program goes on
    after it with the Exits' values."""

    __slots__ = ()  # (its step's class declares them: PROGRAM_SLOTS)
    _bound: BoundPlan

    def _init_program(self, program: BoundProgram, args: Sequence[Any]) -> None:
        """The engine's state for a step of ``program`` over ``args`` (the step's
        ``_bound`` is set by the step)."""
        self._program = program
        self._end = len(program.blocks)
        # The hopped or joined node, until its value arrives.
        self._waiting: Hop | Join | None = None
        self._loop_run: FastRun | None = None  # the loop frame running now, until it is done
        self._rerun(args)

    def _rerun(self, args: Sequence[Any]) -> None:
        """A run's state over ``args``: its values (the fed ones in the _Arg nodes'
        slots), from the first block.  All a step that finished needs to run again
        (every block ran, nothing waits); a new step's engine starts with it."""
        vals = list(self._bound.plan.initial_values)
        for s, k in self._program.args:  # the _Arg nodes
            vals[s] = args[k]
        self._vals = vals
        self._next = 0  # the next block to run

    def has_ready(self) -> bool:
        return self._waiting is None and (self._next < self._end or self._loop_run is not None)

    def clear(self) -> None:
        self._next = self._end
        self._loop_run = None

    def idle(self) -> None:
        pass  # (a program keeps nothing that only running needs)

    # The per-block loop of every drain (one call per block, see block_code), and the
    # signals a block's last line may raise: kept in one piece, no call between.
    def drain(self, until: float) -> bool:  # noqa: C901
        """Run the program's blocks until the end, a join whose value has not arrived
        or a hop (True), or until the clock passes ``until`` after a block or a loop
        iteration (False: the step yields, then drains again).  ``_next`` says where
        to resume: a join's own block (or the one after, for a join checked ahead at
        the end of the block before), the block after a hop's or a loop's."""
        step = self
        program = self._program
        blocks = program.blocks
        vals = self._vals
        end = self._end
        while step._error is None and self._waiting is None:
            if self._loop_run is not None:
                if not self._advance(until):
                    return False
                continue
            b = self._next
            if b >= end:
                break
            try:
                while True:
                    join: Join | None = (blocks[b] or program.block(b))(vals, step)
                    if join is not None:
                        self._next = b + join.ahead
                        self._waiting = join  # (its node's value resumes the program)
                        return True
                    b += 1
                    if b >= end:
                        self._next = end
                        return True
                    if slice_over(until):
                        self._next = b
                        return False  # the step yields to the loop, then goes on
            except RunLoop as signal:
                # The signal outlives this frame: without its traceback it holds no
                # frame, and no frame holds it (no cycle per step).
                signal.__traceback__ = None
                self._next = b + 1  # (a loop ends its block)
                self._start(signal)
            except Hop as hop:
                hop.__traceback__ = None
                self._next = b + 1  # (a hop ends its block)
                self._waiting = hop
                # (A twin that finishes this time completes at once: the loop goes on.)
                try:
                    step.dispatch(hop.node, hop.node, self._bound.nodes[hop.node], hop.inputs)
                except Exception as exc:  # the twin's, called again by the dispatch
                    self._next = end
                    step.fail(hop.node, exc)
            except (Exception, asyncio.CancelledError) as exc:  # the kernel's (Step.fail)
                self._next = end
                step.fail(program.node_at(b, exc), exc)
        return True

    def _start(self, signal: RunLoop) -> None:
        """A loop instruction: its frame starts on the Enters' values."""
        run = signal.loop.start()
        run.entered = signal.entered
        trace = self._trace
        if trace is not None:  # the Enters route (recorded as control, as in general form)
            for e, _ in signal.entered:
                now = time.time()
                trace.record(e, "control", now, now, ())
        if not run.begin():  # a value entered dead: the plan's rule says it cannot
            e = signal.entered[0][0]
            self._next = self._end
            self.fail(e, errors.InternalError(None, None, "a dead value entered a loop"))
            return
        self._loop_run = run

    def _advance(self, until: float) -> bool:
        """Run the current loop frame; False when the clock passed ``until`` first."""
        run = self._loop_run
        assert run is not None
        step = self
        outcome = run.advance(until, step)
        if outcome == RUNNING:
            return False
        self._loop_run = None
        if outcome == DONE:
            self._exits(run.exits)
            return True
        self._next = self._end
        if outcome != FAILED:  # a hand-off: the plan's rule says a closed loop never does
            e = run.exits[0][0] if run.exits else -1
            step.fail(e, errors.InternalError(None, None, "a loop handed off in a program"))
        return True

    def _exits(self, exits: list[tuple[int, Any]]) -> None:
        """The loop is done: its Exits' values into the root frame's slots (traced: as
        control records of its last iteration; streamed: told as they arrive)."""
        vals, out = self._vals, self._bound.plan.out
        on_exit = self._bound.derived.get("on_exit")
        trace = self._trace
        for e, v in exits:
            vals[out[e]] = v
            if trace is not None:
                now = time.time()
                trace.record(e, "control", now, now, ())
            if on_exit is not None:
                on_exit(e, v)
        if trace is not None:
            trace.label = None  # root nodes run in no frame

    def complete(self, token: Any, value: Any) -> bool:
        """A dispatched node's value (``token``: the hopped node, or the :class:`Start`
        of a started one): stored; the program resumes after the hop, or after the
        join, that waited for it.  False when the program still waits (a join for
        another node): nothing is ready, the step need not drain."""
        waiting = self._waiting
        if token.__class__ is not Start:
            if waiting.__class__ is not Hop or token != waiting.node:
                raise AssertionError(f"a program dispatched no node {token}")
            self._waiting = None
            waiting.store(self._vals, value)
            return True
        start: Start = token
        vals = self._vals
        if start.nout == 1:  # (Start.store written out: two calls less per call)
            vals[start.out] = value
        else:
            vals[start.out : start.out + start.nout] = check_outputs(value, start.nout)
        for r in start.own:
            vals[r] = None
        if waiting is not None and start.node == waiting.node:
            self._waiting = None
            return True
        return waiting is None

    def retvals(self) -> list[Any]:
        vals, slots = self._vals, self._bound.plan.retval_slots  # the _Retval nodes
        if len(slots) == 1:  # one fetch (most runs): no comprehension, one call less
            return [vals[slots[0]]]
        return [vals[s] for s in slots]
