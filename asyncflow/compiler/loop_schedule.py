"""Straight-line schedules for simple loop frames (the frame propagator's fast path).

The frame propagator keeps every value of a loop in per-iteration dicts and finds
ready nodes by pending counts: general (nested frames, async kernels, transfers,
``parallel_iterations``), but it pays that bookkeeping for every node of every
iteration.  Most loops do not need it: their frame holds only inline kernels and
control-flow routing, so running one iteration after the other, each in a fixed
topological order, is a valid serialization of what the general propagator does.

:func:`schedule_loops` finds such frames and lowers each to a
:class:`LoopSchedule`: the iteration as three straight-line programs over one flat
list of *local* slots, reused from iteration to iteration.

* **head** — the nodes that do not depend on the loop's Switches: the predicate and
  whatever else only needs the loop variables; it runs first in every iteration.
* **true** — the rest of an iteration whose predicate is true: the loop Switches
  pass their data through (their false sides, read only by the Exits, are dead), so
  most nodes are *statically live* and run without a dead-tensor check.
* **final** — the rest of the iteration whose predicate is false (or dead): the
  Exits take the loop variables; the body is statically dead and skipped.

Dead tensors of a ``cond`` inside the body stay dynamic: a node that may read one
carries the slots to check (a node with a dead data or control input is dead); a
Merge picks its first live input in schedule order.  ``Identity`` and ``LoopCond``
are aliases (their consumers read the input slot), a ``Const`` whose control inputs
are statically live is a preloaded slot.  Every slot is freed after its last reader
in the program that runs, so a long loop holds one iteration's values at most.

What is not eligible keeps the general propagator: nested loops (a frame with a
child frame), Enters, NextIterations or Exits wired other than ``while_loop`` wires
them, more than one ``LoopCond``, a control edge from a Switch or from a node
without outputs, a body larger than :data:`MAX_NODES`.  Kernel kinds are only known
when kernels are bound: the runtime also keeps the general path for a frame holding
a kernel that does not run inline (async, thread, transfer).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from asyncflow.compiler.control_flow import (
    CF_ENTER,
    CF_EXIT,
    CF_MERGE,
    CF_NEXT,
    CF_NONE,
    CF_SWITCH,
    FrameInfo,
)
from asyncflow.framework import registry

if TYPE_CHECKING:
    from asyncflow.compiler.ir import NodeDef

__all__ = [
    "I_CONST",
    "I_EXIT",
    "I_KERNEL",
    "I_LOOP",
    "I_MERGE",
    "I_SWITCH",
    "MAX_NODES",
    "MAX_STARTS",
    "Instr",
    "LoopSchedule",
    "StartGraph",
    "program_starts",
    "reachable",
    "root_runs_straight_line",
    "runs_straight_line",
    "schedule_loops",
    "start_schedule",
    "started",
]

#: Instruction kinds.  ``I_LOOP``: a whole loop frame as one instruction of its
#: parent's program (see :func:`root_runs_straight_line`).
I_KERNEL, I_CONST, I_SWITCH, I_MERGE, I_EXIT, I_LOOP = range(6)

#: A frame with more nodes keeps the general propagator: the fast path yields to the
#: event loop only between iterations, so an iteration must stay well within a slice.
MAX_NODES = 1024

#: Kernel kinds a straight-line program runs: synchronous kernels and control-flow
#: routing.  Async, thread and transfer kernels wait, so they need the general engine.
_STRAIGHT_LINE_FLOWS = frozenset({registry.INLINE, registry.CONTROL})


def runs_straight_line(nodes: Iterable[Any], hops: bool = False) -> bool:
    """THE rule deciding which engine runs a group of nodes (a loop frame the compiler
    lowered, or a frame-free partition): the straight-line interpreter when every
    node's kernel kind (``flow``: ``registry.INLINE`` ... as bound) is synchronous,
    else the general pending-count propagator.

    ``hops``: the program can hand one node at a time to the step's dispatch and wait
    for it (a frame-free program can; a loop frame's iteration cannot).  Then an async
    kernel whose ``nowait`` twin answers ``WOULD_BLOCK`` only for work too large to run
    inline (its ``offloads`` is true: the awaited call then finishes on its own, never
    waiting for another node of the step, as a small image decode) runs there too:
    its twin inline, and the rare large call hops.  A kernel whose twin can block on
    another node (a queue's) keeps the general engine, which runs that other node
    meanwhile.

    A node's *shape* never matters: kernels with no input (a variable read), several
    outputs or none, or reading a resource (captured by the kernel, ordered by control
    edges) all run in the interpreter, in the program's topological order, which is a
    valid serialization of what the general engine does.  Structure that programs do
    not model (nested frames, odd wiring) is decided by :func:`schedule_loops`, which
    returns None for such a frame.
    """
    return all(
        n.flow in _STRAIGHT_LINE_FLOWS
        or (hops and n.flow == registry.ASYNC and getattr(n.kernel, "offloads", False) is True)
        for n in nodes
    )


def started(node: Any) -> bool:
    """Whether a frame-free program *starts* ``node`` (hands it to the step's dispatch
    and goes on) and joins it before its first consumer, instead of running it: an
    async kernel with no ``nowait`` twin (a database or HTTP call, an async
    ``py_func``) and at least one output (its first output slot says whether its value
    arrived).  A queue's kernels (a twin that may wait for another node of the step)
    and kernels of other kinds keep the general engine."""
    return (
        node.flow == registry.ASYNC
        and getattr(node.kernel, "nowait", None) is None
        and node.num_outputs > 0
    )


def reachable(seeds: Iterable[int], edges: Sequence[Iterable[int]]) -> set[int]:
    """The nodes reached from ``seeds`` along ``edges`` (per node, its successors), in
    one step or more: the seeds themselves only when a path leads back to them."""
    seen: set[int] = set()
    stack = [n for s in seeds for n in edges[s]]
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(edges[n])
    return seen


class StartGraph(Protocol):
    """What :func:`start_schedule` reads of a plan (:class:`asyncflow.compiler.plan.Plan`)."""

    @property
    def consumers(self) -> Sequence[Iterable[int]]: ...
    @property
    def initial_pending(self) -> Sequence[int]: ...
    @property
    def initial_ready(self) -> Sequence[int]: ...


#: A partition with more started nodes keeps the general engine (the rule's check
#: walks what each call in flight leads to: kept small).
MAX_STARTS = 64


def program_starts(nodes: Sequence[Any], graph: StartGraph) -> frozenset[int] | None:
    """The nodes a frame-free partition's program starts (:func:`started`), or None
    when the partition keeps the general engine: some node is neither straight-line
    (:func:`runs_straight_line`, with hops) nor started, or no fixed order starts every
    call as early as the general engine would (:func:`start_schedule`)."""
    if runs_straight_line(nodes, hops=True):
        return frozenset()  # (the common case, one pass: a large plan's bind pays little)
    starts: list[int] = []
    for i, n in enumerate(nodes):
        if runs_straight_line((n,), hops=True):
            continue
        if not started(n):
            return None
        starts.append(i)
    chosen = frozenset(starts)
    if len(chosen) > MAX_STARTS or start_schedule(graph, chosen) is None:
        return None
    return chosen


def start_schedule(
    graph: StartGraph, starts: frozenset[int]
) -> tuple[tuple[int, ...], dict[int, int]] | None:
    """THE order of a program that starts the async nodes ``starts`` (dispatches each
    and goes on), and where it joins each (waits for its value): the order, and per
    started node that has readers, the position it is joined before (its first
    reader's).  None when a fixed order would start a call later than the general
    engine does.

    The program runs what is ready, what leads to a call first (so calls start as
    early as their inputs allow), the calls as they come (started, their readers not
    yet ready), then the rest.  When nothing is left to run but calls in flight, it
    waits for them all; that costs no call its start only when every call still to
    start needs every call in flight (an I/O chain, or stages of calls that each
    read the whole stage before: the general engine cannot start them earlier
    either).  A call still to start that needs only some of them keeps the general
    engine, which starts it when its own inputs arrive.  Joins then move down to
    each call's first reader, so what reads one call runs while the others are still
    in flight."""
    consumers = graph.consumers
    n = len(consumers)
    urgent = reachable(starts, _producers(consumers)) | starts  # what calls need, and them
    pending = list(graph.initial_pending)
    first: list[int] = []  # ready, leading to a call
    rest: list[int] = []  # ready, the others
    for i in graph.initial_ready:
        (first if i in urgent else rest).append(i)

    def arrived(i: int) -> None:  # node i's value is there: its readers may be ready
        for c in consumers[i]:
            pending[c] -= 1
            if not pending[c]:
                (first if c in urgent else rest).append(c)

    order: list[int] = []
    in_flight: list[int] = []
    left = set(starts)  # not started yet
    leads_to: dict[int, set[int]] = {}
    while True:
        while first or rest:
            i = (first or rest).pop()
            order.append(i)
            if i in starts:
                left.discard(i)
                in_flight.append(i)
            else:
                arrived(i)
        if not in_flight:
            break
        if not _needed_by_all(in_flight, left, consumers, leads_to):
            return None
        for f in in_flight:  # joined: what reads them may run
            arrived(f)
        in_flight.clear()
    if len(order) != n:
        return None  # some node never becomes ready: the general path says what waits
    position = {i: k for k, i in enumerate(order)}
    joins = {s: min(position[c] for c in consumers[s]) for s in starts if consumers[s]}
    return tuple(order), joins


def _needed_by_all(
    in_flight: list[int],
    left: set[int],
    consumers: Sequence[Iterable[int]],
    leads_to: dict[int, set[int]],
) -> bool:
    """Whether every call still to start (``left``) needs every call in flight
    (``leads_to`` keeps what each call leads to, walked once)."""
    for f in in_flight:
        if f not in leads_to:
            leads_to[f] = reachable((f,), consumers)
        if not leads_to[f].issuperset(left):
            return False
    return True


def _producers(consumers: Sequence[Iterable[int]]) -> list[list[int]]:
    """Per node, the nodes it is a consumer of."""
    producers: list[list[int]] = [[] for _ in consumers]
    for p, cs in enumerate(consumers):
        for c in cs:
            producers[c].append(p)
    return producers


def root_runs_straight_line(
    info: FrameInfo | None,
    schedules: Sequence[LoopSchedule | None],
    nodes: Sequence[Any],
    graph: StartGraph | None = None,
) -> bool:
    """Whether a whole partition runs as ONE straight-line program (the rule's
    structural half; the kernel kinds are :func:`runs_straight_line`'s).

    Without control flow (``info`` None) that is the kernels' rule alone, and with the
    partition's ``graph`` given (its plan), async kernels the program starts and
    joins (:func:`program_starts`).  With
    loops, the root frame's program holds each loop frame as one instruction
    (``I_LOOP``: the frame's own schedule, run to its end) when nothing in the root
    frame can be dead or wait: the root frame routes nothing (no Switch, Merge or
    other control flow but the loops' Enters), every loop frame is a child of the
    root with a :attr:`LoopSchedule.closed` schedule (its Exits always deliver live
    values, it never hands back to the general path), the loops' kernels run inline
    and the root's run inline or hop.  Anything else keeps the general propagator
    (whose loop frames may still take their own schedules)."""
    if info is None:
        if graph is not None:
            return program_starts(nodes, graph) is not None
        return runs_straight_line(nodes, hops=True)
    if len(info.frames) < 2 or any(s is None or not s.closed for s in schedules[1:]):
        return False
    if any(f.parent != 0 for f in info.frames[1:]):
        return False
    if any(f == 0 and k not in (CF_NONE, CF_ENTER) for k, f in zip(info.kind, info.frame)):
        return False
    root = [n for n, f in zip(nodes, info.frame) if f == 0]
    loops = [n for n, f in zip(nodes, info.frame) if f != 0]
    return runs_straight_line(root, hops=True) and runs_straight_line(loops)


_LIVE, _MAYBE, _DEAD = 0, 1, 2
#: Where a may-be-dead value is live: the conjunction of (predicate slot, side) of the
#: ``cond`` Switches above it (its value is live exactly when each predicate took its
#: side, the Switches' data being live then).
Branch = frozenset[tuple[int, int]]
_ALIASES = frozenset({"Identity", "LoopCond"})


class Instr(NamedTuple):
    """One node of a program.  Slots are local (indices of the program's value list).
    A named tuple: immutable, picklable, and cheap to make (a large partition's
    program has one per node)."""

    kind: int  # I_*
    node: int  # the plan's node index (what errors name)
    ins: tuple[int, ...]  # I_KERNEL: input slots; I_SWITCH: (data, pred);
    # I_MERGE: live candidates in schedule order; I_EXIT: (data,)
    out: int  # first output slot (-1: none stored)
    num_outputs: int
    checks: tuple[int, ...]  # slots whose dead value makes the node dead (may be dead)
    frees: tuple[int, ...]  # slots to clear after the node ran (their last reader)
    positions: tuple[int, ...] = ()  # I_MERGE: the input position of each candidate
    value: Any = None  # I_CONST: its value


@dataclass(frozen=True, slots=True)
class LoopSchedule:
    """The straight-line form of one loop frame's iteration (see the module doc)."""

    frame: int  # the static frame (FrameInfo.frames index)
    members: tuple[int, ...]  # every node running in the frame
    template: tuple[Any, ...]  # the local slots' initial values (constants)
    #: Enter node -> the local slots its value goes to when the frame starts (a
    #: constant Enter: its own slot; a loop variable's: the slot of its loop Merge).
    enters: tuple[tuple[int, tuple[int, ...]], ...]
    pred: int  # the slot of the loop's predicate
    head: tuple[Instr, ...]
    true: tuple[Instr, ...]
    true_frees: tuple[int, ...]  # cleared when a true iteration begins
    final: tuple[Instr, ...]
    #: Per NextIteration: (node, the slot it reads, the slot of the Merge it feeds).
    carries: tuple[tuple[int, int, int], ...]
    carry_frees: tuple[int, ...]  # cleared once the carries are read
    #: Loop Merges whose value_index is read: (slot, Enter's position, NextIteration's).
    index_slots: tuple[tuple[int, int, int], ...]
    #: Per Exit: the loop Switch it reads (its dead origin in a true iteration).
    exits: tuple[tuple[int, int], ...]
    #: Nothing of the loop's interface is ever dead: its predicate and the values
    #: its NextIterations carry are statically live, so every run that starts with
    #: live Enters ends in ``final`` with every Exit live (it never hands back to
    #: the general path): the frame can be one instruction of a root program.
    closed: bool = False


def schedule_loops(
    nodes: Sequence[NodeDef],
    info: FrameInfo,
    inputs: Sequence[tuple[int, ...]],
    out: Sequence[int],
    consumers: Sequence[tuple[int, ...]],
    initial_values: Sequence[Any],
) -> tuple[LoopSchedule | None, ...]:
    """Per static frame (index 0, the root, is always None): its schedule, or None
    when the frame keeps the general propagator."""
    node_of = {n.name: i for i, n in enumerate(nodes)}
    members: dict[int, list[int]] = {}
    enters: dict[int, list[int]] = {}
    for i, f in enumerate(info.frame):
        members.setdefault(f, []).append(i)
        if info.kind[i] == CF_ENTER:
            enters.setdefault(info.child[i], []).append(i)
    out_schedules: list[LoopSchedule | None] = [None]
    for f in range(1, len(info.frames)):
        builder = _Builder(
            f,
            nodes,
            node_of,
            info,
            inputs,
            out,
            consumers,
            initial_values,
            members.get(f, []),
            enters.get(f, []),
        )
        out_schedules.append(builder.build())
    return tuple(out_schedules)


class _Ineligible(Exception):
    """The frame keeps the general propagator (the reason is for debugging)."""


class _Builder:
    """Lowers one static frame; :meth:`build` returns None for an ineligible one."""

    def __init__(
        self,
        f: int,
        nodes: Sequence[NodeDef],
        node_of: dict[str, int],
        info: FrameInfo,
        inputs: Sequence[tuple[int, ...]],
        out: Sequence[int],
        consumers: Sequence[tuple[int, ...]],
        initial_values: Sequence[Any],
        members: list[int],
        enters: list[int],
    ) -> None:
        self.f = f
        self.nodes = nodes
        self.node_of = node_of
        self.info = info
        self.inputs = inputs
        self.out = out
        self.consumers = consumers
        self.initial = initial_values
        self.members = members
        self.enters = enters
        self.member_set = set(members)
        # global output slot -> producing node, for the frame's nodes and Enters
        self.producer: dict[int, int] = {}
        for i in (*members, *enters):
            for k in range(len(nodes[i].outputs)):
                self.producer[out[i] + k] = i
        self.local: dict[int, int] = {}  # global slot -> local slot
        self.template: list[Any] = []

    def build(self) -> LoopSchedule | None:
        try:
            return self._build()
        except _Ineligible:
            return None

    # -- structure ---------------------------------------------------------------------

    kinds: dict[int, int]
    loop_cond: int
    loop_merges: list[int]
    nexts: list[int]
    exits: list[int]
    loop_switches: list[int]

    def _controls(self, i: int) -> list[int]:
        """Node ``i``'s control producers in this partition."""
        got = (self.node_of.get(c) for c in self.nodes[i].control_inputs)
        return [p for p in dict.fromkeys(got) if p is not None]

    def _check_structure(self) -> None:
        """The frame is wired as ``while_loop`` wires it (else :class:`_Ineligible`)."""
        info, nodes = self.info, self.nodes
        if not self.members or len(self.members) > MAX_NODES:
            raise _Ineligible("empty or too large")
        self.kinds = kinds = {i: info.kind[i] for i in self.members}
        if any(k == CF_ENTER for k in kinds.values()):
            raise _Ineligible("a nested frame")
        conds = [i for i in self.members if nodes[i].op == "LoopCond"]
        if len(conds) != 1:
            raise _Ineligible("not exactly one LoopCond")
        self.loop_cond = conds[0]
        self.loop_merges = [i for i in self.members if info.loop_merge[i]]
        if not self.loop_merges:
            raise _Ineligible("no loop variable")
        self.nexts = [i for i in self.members if kinds[i] == CF_NEXT]
        self.exits = [i for i in self.members if kinds[i] == CF_EXIT]
        self._check_loop_variables()
        self._check_inputs()
        self._check_switches()

    def _check_loop_variables(self) -> None:
        """Each loop variable: Enter -> Merge <- NextIteration, and nothing else."""
        info, nodes, kinds = self.info, self.nodes, self.kinds
        enter_set = set(self.enters)
        merge_set = set(self.loop_merges)
        self.merge_enter: dict[int, tuple[int, int]] = {}  # merge -> (enter, position)
        self.merge_next: dict[int, tuple[int, int]] = {}  # merge -> (next, position)
        for m in self.loop_merges:
            ins = self.inputs[m]
            srcs = [self.producer.get(s) for s in ins]
            if len(ins) != 2 or self._controls(m) or nodes[m].control_inputs:
                raise _Ineligible("a loop Merge other than Merge(Enter, NextIteration)")
            for pos, p in enumerate(srcs):
                if p in enter_set and not info.constant[p]:
                    self.merge_enter[m] = (p, pos)
                elif p is not None and p in self.member_set and kinds[p] == CF_NEXT:
                    self.merge_next[m] = (p, pos)
            if m not in self.merge_enter or m not in self.merge_next:
                raise _Ineligible("a loop Merge other than Merge(Enter, NextIteration)")
        for e in self.enters:
            if not info.constant[e] and any(
                c not in merge_set or self.out[e] not in self.inputs[c] for c in self.consumers[e]
            ):
                raise _Ineligible("a loop variable's Enter read by a node other than its Merge")
        self._pair_nexts()

    def _pair_nexts(self) -> None:
        """Each NextIteration feeds exactly one loop Merge, without control inputs."""
        nodes, merge_set = self.nodes, set(self.loop_merges)
        self.next_merge: dict[int, int] = {}
        for n in self.nexts:
            cons = self.consumers[n]
            if (
                len(cons) != 1
                or cons[0] not in merge_set
                or self.merge_next[cons[0]][0] != n
                or len(nodes[n].outputs) != 1
            ):
                raise _Ineligible("a NextIteration not feeding exactly one loop Merge")
            if self._controls(n):
                raise _Ineligible("a NextIteration with control inputs")
            self.next_merge[n] = cons[0]
        if len(self.next_merge) != len(self.loop_merges):
            raise _Ineligible("loop Merges and NextIterations do not pair up")

    def _check_inputs(self) -> None:
        """Inputs come from the frame, its constant Enters, or preloaded constants;
        control edges from nodes whose first output tells whether they are dead."""
        info, kinds = self.info, self.kinds
        enter_set = set(self.enters)
        merge_set = set(self.loop_merges)
        for i in self.members:
            if i in merge_set:
                continue
            for s in self.inputs[i]:
                p = self.producer.get(s)
                if p is None:
                    if self.initial[s] is None:
                        raise _Ineligible("an input from outside the frame")
                elif p in enter_set:
                    if not info.constant[p]:
                        raise _Ineligible("a loop variable's Enter read directly")
                elif kinds[p] in (CF_NEXT, CF_EXIT):
                    raise _Ineligible("a NextIteration or Exit read inside the frame")
            self._check_controls(i, enter_set)

    def _check_controls(self, i: int, enter_set: set[int]) -> None:
        """Node ``i``'s control edges come from constant Enters or from frame nodes
        whose first output tells whether they are dead."""
        info, nodes, kinds = self.info, self.nodes, self.kinds
        for p in self._controls(i):
            if p in enter_set:
                if not info.constant[p]:
                    raise _Ineligible("a control edge from a loop variable's Enter")
            elif p not in self.member_set or kinds[p] in (CF_NEXT, CF_EXIT):
                raise _Ineligible("a control edge from outside the frame")
            elif kinds[p] == CF_SWITCH or not nodes[p].outputs:
                raise _Ineligible("a control edge from a Switch or a node without outputs")

    def _check_switches(self) -> None:
        """The loop Switches (predicate: the LoopCond) feed the Exits from their false
        side and the body from their true side, by data edges only."""
        kinds = self.kinds
        pred_slot = self.out[self.loop_cond]
        self.loop_switches = [
            i for i in self.members if kinds[i] == CF_SWITCH and self.inputs[i][1] == pred_slot
        ]
        if not self.loop_switches:
            raise _Ineligible("no loop Switch")
        exit_set = set(self.exits)
        switch_false = {self.out[s]: s for s in self.loop_switches}
        self.exit_switch: dict[int, int] = {}
        for e in self.exits:
            sw = switch_false.get(self.inputs[e][0])
            if sw is None or self._controls(e):
                raise _Ineligible("an Exit not reading a loop Switch's false output")
            self.exit_switch[e] = sw
        for s in self.loop_switches:
            for c in self.consumers[s]:
                if self.out[s] + 1 not in self.inputs[c] and c not in exit_set:
                    raise _Ineligible("a control edge from a loop Switch")
                if c in exit_set and self.out[s] + 1 in self.inputs[c]:
                    raise _Ineligible("an Exit reading a loop Switch's true output")
                if c not in exit_set and self.out[s] in self.inputs[c]:
                    raise _Ineligible(
                        "a node other than an Exit reading a loop Switch's false output"
                    )

    def _order(self) -> list[int]:
        """The frame's nodes but its loop Merges, in a topological order of one
        iteration (ties by plan order); a cycle makes the frame ineligible."""
        merge_set = set(self.loop_merges)
        todo = [i for i in self.members if i not in merge_set]
        todo_set = set(todo)
        pending: dict[int, int] = {}
        succ: dict[int, list[int]] = {i: [] for i in todo}
        for i in todo:
            producers = {self.producer.get(s) for s in self.inputs[i]}
            producers.update(self._controls(i))
            ps = [p for p in producers if p in todo_set]
            pending[i] = len(ps)
            for p in ps:
                succ[p].append(i)
        ready = [i for i in todo if not pending[i]]
        heapq.heapify(ready)
        order: list[int] = []
        while ready:
            i = heapq.heappop(ready)
            order.append(i)
            for c in succ[i]:
                pending[c] -= 1
                if not pending[c]:
                    heapq.heappush(ready, c)
        if len(order) != len(todo):
            raise _Ineligible("a cycle inside one iteration")
        return order

    def _downstream(self, order: list[int]) -> set[int]:
        """The nodes reached from the loop Switches (the Switches included)."""
        down = set(self.loop_switches)
        for i in order:
            if i in down:
                continue
            producers = {self.producer.get(s) for s in self.inputs[i]}
            producers.update(self._controls(i))
            if producers & down:
                down.add(i)
        return down

    # -- slots ---------------------------------------------------------------------------

    def _slot(self, g: int) -> int:
        """The local slot of global slot ``g`` (a node's outputs stay contiguous)."""
        loc = self.local.get(g)
        if loc is not None:
            return loc
        p = self.producer.get(g)
        if p is None:  # a preloaded constant
            loc = self.local[g] = len(self.template)
            self.template.append(self.initial[g])
            return loc
        base = self.out[p]
        for k in range(len(self.nodes[p].outputs)):
            self.local[base + k] = len(self.template)
            self.template.append(None)
        return self.local[g]

    # -- programs ------------------------------------------------------------------------

    def _build(self) -> LoopSchedule:
        self._check_structure()
        order = self._order()
        down = self._downstream(order)
        position = {i: k for k, i in enumerate(order)}
        # Status of global slots (after aliasing): live, maybe dead, dead.
        status: dict[int, int] = {}
        for e in self.enters:
            if self.info.constant[e]:
                status[self.out[e]] = _LIVE
        for m in self.loop_merges:
            status[self.out[m]] = status[self.out[m] + 1] = _LIVE
        alias: dict[int, int] = {}
        head_nodes = [i for i in order if i not in down]
        body_nodes = [i for i in order if i in down]
        head, head_status, head_alias, head_tags = self._program(
            head_nodes, status, alias, {}, None, position
        )
        pred = self._resolve(head_alias, self.out[self.loop_cond])
        if head_status.get(pred, _LIVE) == _DEAD:
            raise _Ineligible("a predicate that is always dead")
        true, true_status, true_alias, _ = self._program(
            body_nodes, head_status, head_alias, head_tags, True, position
        )
        final, final_status, final_alias, _ = self._program(
            body_nodes, head_status, head_alias, head_tags, False, position
        )
        carries = []
        for n in self.nexts:
            src = self._resolve(true_alias, self.inputs[n][0])
            if true_status.get(src, _LIVE) == _DEAD:
                raise _Ineligible("a NextIteration that is always dead")
            carries.append((n, src, self.out[self.next_merge[n]]))
        exits_live = all(
            final_status.get(self._resolve(final_alias, self.inputs[e][0]), _LIVE) == _LIVE
            for e in self.exits
        )
        closed = (
            head_status.get(pred, _LIVE) == _LIVE
            and exits_live
            and all(true_status.get(src, _LIVE) == _LIVE for _, src, _ in carries)
        )
        return self._lower(head, true, final, carries, pred, closed)

    def _resolve(self, alias: dict[int, int], g: int) -> int:
        while g in alias:
            g = alias[g]
        return g

    def _witnesses(self, i: int, alias: dict[int, int]) -> list[int]:
        """Per control producer of node ``i``: a slot holding a dead value exactly when
        that producer is dead (its first output, after aliasing)."""
        return [self._resolve(alias, self.out[p]) for p in self._controls(i)]

    def _program(
        self,
        order: list[int],
        status_in: dict[int, int],
        alias_in: dict[int, int],
        tags_in: dict[int, Branch],
        pred: bool | None,
        position: dict[int, int],
    ) -> tuple[list[tuple[Any, ...]], dict[int, int], dict[int, int], dict[int, Branch]]:
        """The raw instructions of ``order`` (global slots) when the loop predicate is
        ``pred`` (None: the head, which does not depend on it)."""
        t = _Trace(dict(status_in), dict(alias_in), dict(tags_in), position)
        for i in order:
            ins = [self._resolve(t.alias, s) for s in self.inputs[i]]
            if i in self.loop_switches:
                self._loop_switch(t, i, ins, pred)
            elif self.info.kind[i] == CF_MERGE:
                self._merge(t, i, ins)
            else:
                self._node(t, i, ins, pred)
        return t.prog, t.status, t.alias, t.tags

    def _combine(self, t: _Trace, slots: list[int]) -> tuple[int, list[int]]:
        """The worst status of ``slots`` and those that may be dead (the checks), in
        the order of their producers."""
        worst = max((t.st(s) for s in slots), default=_LIVE)
        checks = sorted(
            {s for s in slots if t.st(s) == _MAYBE},
            key=lambda s: t.position.get(self.producer.get(s, -1), -1),
        )
        return worst, checks

    def _set_outputs(self, t: _Trace, i: int, value: int, tag: Branch | None = None) -> None:
        """Node ``i``'s outputs are ``value`` (``_MAYBE``: live exactly when ``tag``
        holds, when it is known)."""
        for k in range(len(self.nodes[i].outputs)):
            t.status[self.out[i] + k] = value
            if value == _MAYBE and tag is not None:
                t.tags[self.out[i] + k] = tag

    def _tag(self, t: _Trace, checks: list[int]) -> Branch | None:
        """When the may-be-dead slots ``checks`` are all live: the conjunction of their
        branches, or None when one of them has none."""
        tag: set[tuple[int, int]] = set()
        for s in checks:
            c = t.tags.get(s)
            if c is None:
                return None
            tag |= c
        return frozenset(tag)

    def _switch(self, t: _Trace, i: int, ins: list[int], tag: Branch | None) -> None:
        """A Switch in the body (a ``cond``'s): its false side is live exactly when its
        inputs are (``tag``) and the predicate is false, its true side when it is true."""
        out = self.out[i]
        t.status[out] = t.status[out + 1] = _MAYBE
        if tag is not None:
            t.tags[out] = tag | {(ins[1], 0)}
            t.tags[out + 1] = tag | {(ins[1], 1)}

    def _loop_switch(self, t: _Trace, i: int, ins: list[int], pred: bool | None) -> None:
        """A loop Switch: with the predicate known true its data passes to the true
        side (the false side is dead); else it routes at run time."""
        out = self.out[i]
        if pred:
            t.alias[out + 1] = ins[0]
            t.status[out] = _DEAD
            return
        worst, checks = self._combine(t, ins + self._witnesses(i, t.alias))
        t.status[out] = worst if worst != _DEAD else _DEAD
        t.status[out + 1] = _DEAD
        if worst != _DEAD:
            t.prog.append((I_SWITCH, i, ins, out, 2, checks))

    def _merge(self, t: _Trace, i: int, ins: list[int]) -> None:
        """A Merge: its candidates that may be live, in producer order."""
        cands = sorted(
            ((pos, s) for pos, s in enumerate(ins) if t.st(s) != _DEAD),
            key=lambda c: t.position.get(self.producer.get(c[1], -1), -1),
        )
        if not cands:
            self._set_outputs(t, i, _DEAD)
            return
        if any(t.st(s) == _LIVE for _, s in cands):
            self._set_outputs(t, i, _LIVE)
        else:  # live when some candidate is: always, for both sides of a cond
            tags = [t.tags.get(s) for _, s in cands]
            either = _disjunction(tags) if None not in tags else None  # type: ignore[arg-type]
            self._set_outputs(t, i, _LIVE if either == frozenset() else _MAYBE, either)
        positions = tuple(pos for pos, _ in cands)
        t.prog.append((I_MERGE, i, [s for _, s in cands], self.out[i], 2, [], positions))

    def _node(self, t: _Trace, i: int, ins: list[int], pred: bool | None) -> None:
        """Any other node: dead when an input or control producer always is; else an
        instruction (or an alias: NextIteration, identities)."""
        node, kind = self.nodes[i], self.info.kind[i]
        worst, checks = self._combine(t, ins + self._witnesses(i, t.alias))
        tag = self._tag(t, checks)
        if worst == _DEAD:
            self._set_outputs(t, i, _DEAD)
        elif kind == CF_SWITCH:
            self._switch(t, i, ins, tag)
            t.prog.append((I_SWITCH, i, ins, self.out[i], 2, checks))
        elif kind == CF_EXIT:
            t.prog.append((I_EXIT, i, ins, -1, 0, checks))
        elif kind == CF_NEXT:
            if pred is not True:
                raise _Ineligible("a NextIteration live when the loop ends")
            t.alias[self.out[i]] = ins[0]
        elif node.op in _ALIASES and len(ins) == 1 and not node.control_inputs:
            t.alias[self.out[i]] = ins[0]
        elif node.op == "Const":
            self._const(t, i, node.attrs["value"], checks, tag)
        else:
            self._set_outputs(t, i, worst, tag)
            nout = len(node.outputs)
            t.prog.append((I_KERNEL, i, ins, self.out[i] if nout else -1, nout, checks))

    def _const(self, t: _Trace, i: int, value: Any, checks: list[int], tag: Branch | None) -> None:
        """A Const in the frame: in the template when always live, else an instruction
        (it may be dead through its control inputs)."""
        g = self.out[i]
        if not checks:
            t.status[g] = _LIVE
            self.local.setdefault(g, len(self.template))
            if self.local[g] == len(self.template):
                self.template.append(value[()] if value.ndim == 0 else value)
            return
        self._set_outputs(t, i, _MAYBE, tag)
        t.prog.append((I_CONST, i, [], g, 1, checks, value[()] if value.ndim == 0 else value))

    def _lower(
        self,
        head: list[tuple[Any, ...]],
        true: list[tuple[Any, ...]],
        final: list[tuple[Any, ...]],
        carries: list[tuple[int, int, int]],
        pred: int,
        closed: bool,
    ) -> LoopSchedule:
        """Local slots and last-use frees for the three programs."""
        enters = self._enter_targets()
        merge_slots = {self._slot(self.out[m]) for m in self.loop_merges}
        pred_local = self._slot(pred)
        # Local slots are numbered as first asked for (the template grows with them):
        # every slot is asked for before the template is taken.
        head_reads = [self._reads(r) for r in head]
        true_reads = [self._reads(r) for r in true]
        final_reads = [self._reads(r) for r in final]
        carry_reads = [self._slot(src) for _, src, _ in carries]
        # Never freed: constants and the constant Enters' values.
        keep = {k for k, v in enumerate(self.template) if v is not None}
        keep.update(slots[0] for e, slots in enters if self.info.constant[e])
        read_in_true = {s for rs in true_reads for s in rs} | set(carry_reads)
        later = read_in_true | {s for rs in final_reads for s in rs} | {pred_local}
        head_frees = self._frees_of(head_reads, head, later | keep)
        true_frees = self._frees_of(true_reads, true, set(carry_reads) | keep)
        # Alive at the start of a true iteration but never read in it: cleared at once.
        alive = (merge_slots | {s for raw in head for s in self._writes(raw)}) & later
        start_frees = tuple(sorted(s for s in alive if s not in read_in_true and s not in keep))
        index_slots = self._index_slots()
        head_i = self._lowered(head, head_frees)
        true_i = self._lowered(true, true_frees)
        final_i = self._lowered(final, None)
        carries_l = tuple((n, self._slot(src), self._slot(m)) for n, src, m in carries)
        return LoopSchedule(
            frame=self.f,
            members=tuple(sorted((*self.members, *self.enters))),
            template=tuple(self.template),
            enters=tuple(enters),
            pred=pred_local,
            head=head_i,
            true=true_i,
            true_frees=start_frees,
            final=final_i,
            carries=carries_l,
            carry_frees=tuple(sorted({s for s in carry_reads if s not in keep})),
            index_slots=index_slots,
            exits=tuple((e, self.exit_switch[e]) for e in self.exits),
            closed=closed,
        )

    def _enter_targets(self) -> list[tuple[int, tuple[int, ...]]]:
        """Per Enter, the local slots it fills: its own for a constant Enter, its loop
        Merges' outputs for a loop variable's."""
        enters: list[tuple[int, tuple[int, ...]]] = []
        for e in self.enters:
            if self.info.constant[e]:
                enters.append((e, (self._slot(self.out[e]),)))
            else:
                targets = tuple(
                    self._slot(self.out[m]) for m in self.loop_merges if self.merge_enter[m][0] == e
                )
                enters.append((e, targets))
        return enters

    def _index_slots(self) -> tuple[tuple[int, int, int], ...]:
        """(local slot, Enter position, NextIteration position) of every loop Merge
        whose value index is read."""
        index_slots = []
        for m in self.loop_merges:
            g = self.out[m] + 1
            if any(g in self.inputs[c] for c in self.consumers[m]):
                index_slots.append((self._slot(g), self.merge_enter[m][1], self.merge_next[m][1]))
        return tuple(index_slots)

    def _reads(self, raw: tuple[Any, ...]) -> list[int]:
        return [self._slot(g) for g in (*raw[2], *raw[5])]

    def _writes(self, raw: tuple[Any, ...]) -> list[int]:
        if raw[3] < 0:
            return []
        base = self._slot(raw[3])
        return [base + k for k in range(raw[4])]

    def _frees_of(
        self, reads_list: list[list[int]], raws: list[tuple[Any, ...]], kept: set[int]
    ) -> list[list[int]]:
        """Per instruction: the slots it reads or writes last (``kept``: never freed
        here, or read after the program)."""
        last: dict[int, int] = {}
        for k, (rs, raw) in enumerate(zip(reads_list, raws, strict=True)):
            for s in self._writes(raw):
                last.setdefault(s, k)
            for s in rs:
                last[s] = k
        out: list[list[int]] = [[] for _ in raws]
        for s, k in last.items():
            if s not in kept:
                out[k].append(s)
        return out

    def _lowered(
        self, raws: list[tuple[Any, ...]], frees: list[list[int]] | None
    ) -> tuple[Instr, ...]:
        return tuple(
            Instr(
                raw[0],
                raw[1],
                tuple(self._slot(g) for g in raw[2]),
                self._slot(raw[3]) if raw[3] >= 0 else -1,
                raw[4],
                tuple(self._slot(g) for g in raw[5]),
                tuple(sorted(frees[k])) if frees is not None else (),
                tuple(raw[6]) if raw[0] == I_MERGE else (),
                raw[6] if raw[0] == I_CONST else None,
            )
            for k, raw in enumerate(raws)
        )


class _Trace:
    """The state of lowering one program: per global slot its status (``_LIVE``,
    ``_MAYBE`` dead, ``_DEAD``; a slot not in it is live: preloaded constants and
    constant Enters), for a may-be-dead slot the branch it is live in when known
    (``tags``), the slots standing for others (aliases), the raw instructions, and
    every node's position in the frame's order."""

    __slots__ = ("alias", "position", "prog", "status", "tags")

    def __init__(
        self,
        status: dict[int, int],
        alias: dict[int, int],
        tags: dict[int, Branch],
        position: dict[int, int],
    ) -> None:
        self.status = status
        self.alias = alias
        self.tags = tags
        self.position = position
        self.prog: list[tuple[Any, ...]] = []

    def st(self, g: int) -> int:
        return self.status.get(g, _LIVE)


def _disjunction(tags: Sequence[Branch]) -> Branch | None:
    """A branch equal to "one of ``tags`` holds", or None when none is found: the
    branches resolve pairwise (``C and p`` or ``C and not p`` is ``C``: a ``cond``'s two
    sides merge into what holds around it, the empty branch being "always"), and the
    answer is a resolvent every one of ``tags`` implies."""
    known = set(tags)
    grown = True
    while grown:
        grown = False
        for a in list(known):
            for b in list(known):
                only_a, only_b = a - b, b - a
                if len(only_a) == 1 == len(only_b):
                    ((p, x),), ((q, y),) = only_a, only_b
                    if p == q and x != y and (a & b) not in known:
                        known.add(a & b)
                        grown = True
    found = [c for c in known if all(c <= tag for tag in tags)]
    return min(found, key=len) if found else None
