"""The static order of a bound plan: which node runs when, fixed for all its steps.

A partition made only of inline kernels, without control flow, always runs its nodes
in the same order: nothing waits, nothing is dead, every node runs exactly once.  So
does one with async calls that a fixed order starts as early as the general engine
would (``loop_schedule.program_starts``), in the order
``loop_schedule.start_schedule`` gives it: its program starts each call and joins it
before its first reader.  So
does one whose root frame routes nothing and whose loops are closed
(``loop_schedule.root_runs_straight_line``): there each loop frame is one unit of
the order (:func:`root_order`), one ``I_LOOP`` instruction that runs the frame's own
programs to the loop's end.
:func:`static_order` computes that order once — the very order the plain
propagator's ready stack would produce (LIFO, a node's first newly ready consumer
next), so values are freed as early as on the general path — and the executor
replays it as a straight line: :func:`lower_static_order` lowers it to an
instruction program (the form :mod:`asyncflow.compiler.loop_schedule` gives loop
frames), which the straight-line interpreter (:mod:`asyncflow.runtime.interpreter`)
runs.

It lives with the runtime, not in the compiler, because it is made at run time and
only for some plans: once a bound plan has run ``ExecutorOptions.schedule_after``
times and its kernels turned out all inline (binding decides that, not the plan),
and a range at a time as a step first reaches it — a large plan's first run pays
nothing for it.  It reads the plan's tables and writes nothing back.
"""

from __future__ import annotations

from asyncflow.compiler.control_flow import CF_ENTER
from asyncflow.compiler.loop_schedule import I_KERNEL, I_LOOP, Instr, start_schedule
from asyncflow.compiler.plan import Plan
from asyncflow.runtime.propagators import CHECK_EVERY

__all__ = [
    "StaticProgram",
    "lower_static_order",
    "static_order",
]


def static_order(plan: Plan) -> tuple[int, ...] | None:
    """Every scheduled node of ``plan`` once, producers before consumers (None when
    some node never becomes ready: the general path then reports what waits).  With
    loops (``root_runs_straight_line``): the root frame's nodes, and each loop frame
    ``f`` once as ``-f`` (see :func:`root_order`)."""
    if plan.frames is not None:
        return root_order(plan)
    pending = list(plan.initial_pending)
    consumers = plan.consumers
    ready = list(plan.initial_ready)
    order: list[int] = []
    emit = order.append
    push = ready.append
    while ready:
        i = ready.pop()
        while True:
            emit(i)
            nxt = -1
            for c in consumers[i]:
                p = pending[c] - 1
                pending[c] = p
                if not p:
                    if nxt < 0:
                        nxt = c
                    else:
                        push(c)
            if nxt < 0:
                break
            i = nxt
    return tuple(order) if len(order) == len(plan.nodes) else None


def _unit_of(plan: Plan) -> list[int]:
    """Per node, what the root program runs it as: itself (a root node) or ``-f``
    (its loop frame ``f``: the frame's nodes and the Enters into it)."""
    info = plan.frames
    assert info is not None
    return [
        -c if k == CF_ENTER else (-f if f else i)
        for i, (k, f, c) in enumerate(zip(info.kind, info.frame, info.child))
    ]


def root_order(plan: Plan) -> tuple[int, ...] | None:
    """The root frame's program order, each loop frame one unit ``-f``: the order the
    plain propagator's ready stack would take over the graph of units (a unit's
    producers are its nodes' producers outside it)."""
    unit = _unit_of(plan)
    units = list(dict.fromkeys(unit))
    succ: dict[int, list[int]] = {u: [] for u in units}
    pending = dict.fromkeys(units, 0)
    for p, cs in enumerate(plan.consumers):
        u = unit[p]
        for v in dict.fromkeys(unit[c] for c in cs):
            if v != u and v not in succ[u]:
                succ[u].append(v)
                pending[v] += 1
    ready = [u for u in reversed(units) if not pending[u]]
    order: list[int] = []
    while ready:
        u = ready.pop()
        order.append(u)
        for v in reversed(succ[u]):
            pending[v] -= 1
            if not pending[v]:
                ready.append(v)
    return tuple(order) if len(order) == len(units) else None


class StaticProgram:
    """A plan's static order as an instruction program over the plan's slots, lowered
    a range at a time (:meth:`instrs`): a large partition's program is made as its
    first run reaches each part, never in one piece before the run.

    A value is freed by its last reader in the order: the plan's sole readers (and
    producers of unread outputs) free what they free anyway, and a value read by
    several is freed by the last of them in the order."""

    __slots__ = ("_enters", "_extra", "_plan", "order", "spans", "starts")

    def __init__(
        self,
        plan: Plan,
        order: tuple[int, ...],
        starts: frozenset[int] = frozenset(),
        joins: dict[int, int] | None = None,
        hops: frozenset[int] = frozenset(),
    ) -> None:
        self._plan = plan
        self.order = order
        #: The nodes the program starts (dispatches, and goes on).
        self.starts = starts
        #: The program's blocks (:func:`_spans`): the started nodes to join first, then
        #: a range of the order; a block ends after a node that may hop and after a
        #: loop.
        self.spans = _spans(order, joins or {}, hops | frozenset(i for i in order if i < 0))
        #: Loop frame -> its Enters (a loop unit reads and frees what they do).
        self._enters: dict[int, list[int]] = {}
        if plan.frames is not None:
            for i, u in enumerate(_unit_of(plan)):
                if u < 0 and plan.frames.kind[i] == CF_ENTER:
                    self._enters.setdefault(-u, []).append(i)
        last: dict[int, int] = {}  # a counted slot -> its last reader in the order
        counted = plan.counted
        for i in order:
            for j in self._enters.get(-i, ()) if i < 0 else (i,):
                for s in counted[j]:
                    last[s] = i
        self._extra: dict[int, list[int]] = {}
        for s, i in last.items():
            self._extra.setdefault(i, []).append(s)

    def __len__(self) -> int:
        return len(self.order)

    def instrs(self, start: int, end: int) -> tuple[Instr, ...]:
        """The instructions of positions ``start`` to ``end`` of the order."""
        plan = self._plan
        inputs, outs, nodes, frees = plan.inputs, plan.out, plan.nodes, plan.frees
        extra = self._extra
        make = tuple.__new__  # an Instr without its Python-level __new__ (one per node)
        program = []
        for i in self.order[start:end]:
            if i < 0:
                program.append(self._loop(-i))
                continue
            nout = len(nodes[i].outputs)
            free = frees[i]
            more = extra.get(i)
            if more is not None:
                free = (*free, *more)
            program.append(
                make(
                    Instr,
                    (I_KERNEL, i, inputs[i], outs[i] if nout else -1, nout, (), free, (), None),
                )
            )
        return tuple(program)

    def out_of(self, node: int) -> int:
        """Node ``node``'s first output slot."""
        return self._plan.out[node]

    def enters(self, f: int) -> tuple[int, ...]:
        """The Enters into loop frame ``f``, in the order its instruction reads them."""
        return tuple(self._enters[f])

    def _loop(self, f: int) -> Instr:
        """Loop frame ``f`` as one instruction: it reads its Enters' inputs (in the
        Enters' order), frees what they free, and names its first Enter."""
        plan = self._plan
        enters = self._enters[f]
        frees = [s for e in enters for s in plan.frees[e]]
        frees.extend(self._extra.get(-f, ()))
        ins = tuple(plan.inputs[e][0] for e in enters)
        return Instr(I_LOOP, enters[0], ins, -1, 0, (), tuple(dict.fromkeys(frees)), (), f)


def _spans(
    order: tuple[int, ...], joins: dict[int, int], signals: frozenset[int]
) -> tuple[tuple[int, int, tuple[int, ...]], ...]:
    """The blocks of a program over ``order``: ``(start, end, joins)``, the started
    nodes ``joins`` to wait for before position ``start``, then positions ``start`` to
    ``end`` (at most ``CHECK_EVERY``, where a step looks at the clock).  A block ends
    before each join and after each of ``signals`` (a node that may hand itself to
    the step and wait, or a loop ``-f``: the program resumes after it)."""
    before: dict[int, list[int]] = {}
    for node, pos in joins.items():
        before.setdefault(pos, []).append(node)
    spans: list[tuple[int, int, tuple[int, ...]]] = []
    lo = 0
    waits: tuple[int, ...] = ()
    for pos, i in enumerate(order):
        due = before.get(pos)
        if pos > lo and (due is not None or pos - lo == CHECK_EVERY):
            spans.append((lo, pos, waits))
            lo, waits = pos, ()
        if due is not None:
            waits = tuple(due)
        if i in signals:
            spans.append((lo, pos + 1, waits))
            lo, waits = pos + 1, ()
    if len(order) > lo or waits:
        spans.append((lo, len(order), waits))
    return tuple(spans)


def lower_static_order(
    plan: Plan, starts: frozenset[int] = frozenset(), hops: frozenset[int] = frozenset()
) -> StaticProgram | None:
    """``plan``'s static order as a :class:`StaticProgram` that starts ``starts`` and
    joins each before its first reader (None when some node never becomes ready: the
    general path then reports what waits)."""
    if starts:  # the calls' order (``loop_schedule.start_schedule``)
        scheduled = start_schedule(plan, starts)
        if scheduled is None:
            return None
        return StaticProgram(plan, scheduled[0], starts, scheduled[1], hops)
    order = static_order(plan)
    return None if order is None else StaticProgram(plan, order, hops=hops)
