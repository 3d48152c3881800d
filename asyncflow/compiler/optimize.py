"""The graph optimizer: TensorFlow's ``GraphOptimizer``, over the IR.

It runs once per compiled plan after placement and before control-flow lowering
and partitioning.  Each pass is a pure function from placed nodes to placed nodes
that reports whether it changed anything; the driver repeats the enabled passes —
function inlining (:mod:`~asyncflow.compiler.inline`), constant folding
(:mod:`~asyncflow.compiler.constant_folding`), common-subexpression elimination
(:mod:`~asyncflow.compiler.cse`) — until none does (at most ``MAX_ROUNDS`` rounds,
as TF), so folding can expose duplicates, merging can expose constants and inlined
bodies are folded and merged with the rest of the graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from asyncflow.compiler.constant_folding import fold_constants
from asyncflow.compiler.cse import eliminate_common_subexpressions
from asyncflow.compiler.fold_batchnorm import rewrite_convolutions
from asyncflow.compiler.inline import inline_functions
from asyncflow.compiler.ir import FUNCTION_ATTR, NodeDef, Ref
from asyncflow.config import OptimizerOptions

__all__ = ["MAX_ROUNDS", "OPTIONS_ATTR", "OptimizerStats", "optimize"]

MAX_ROUNDS = 10

#: The attribute of a call node left for the call kernel: the options its body is
#: compiled with (the caller's).
OPTIONS_ATTR = "_optimizer_options"


@dataclass(frozen=True, slots=True)
class OptimizerStats:
    """What the optimizer did to one plan: nodes before and after, nodes removed by
    constant folding and by CSE, calls inlined (each replaced by its body)."""

    nodes_before: int = 0
    nodes_after: int = 0
    folded: int = 0
    cse: int = 0
    inlined: int = 0
    rounds: int = 0


_DEFAULT = OptimizerOptions()


def optimize(
    nodes: Sequence[NodeDef],
    placement: Sequence[int],
    *,
    devices: Sequence[str] = (),
    options: OptimizerOptions = _DEFAULT,
    feeds: Sequence[Ref] = (),
    fetches: Sequence[Ref] = (),
    targets: Sequence[str] = (),
    allow_soft_placement: bool = False,
    calls: bool = True,
    served: list[Ref] | None = None,
) -> tuple[tuple[NodeDef, ...], tuple[int, ...], OptimizerStats]:
    """The optimized nodes, their placement and what changed.

    ``calls=False`` says no node is a function call (``GraphIR.calls``): inlining has
    nothing to look for.  With ``served`` (a list), CSE may merge fetched nodes too, as
    TF: ``served`` receives, for each fetch, the tensor that serves it (the fetch or
    the survivor it was merged into).  Without it, fetched nodes are kept.
    """
    nodes, placement = tuple(nodes), tuple(placement)
    before = len(nodes)
    inlining = options.inlining and calls
    if calls and not options.inlining:
        nodes = tuple(
            n._replace(attrs={**n.attrs, OPTIONS_ATTR: options}) if FUNCTION_ATTR in n.attrs else n
            for n in nodes
        )
    if served is not None:  # until CSE merges one
        served[:] = fetches
    if not (options.folding or options.cse or inlining):
        return nodes, placement, OptimizerStats(before, before)
    fed = frozenset(feeds)
    kept = set(targets) | {r[0] for r in fed}
    protected = frozenset(kept if served is not None else kept | {r[0] for r in fetches})
    renames: dict[str, str] | None = {} if served is not None else None
    folded = merged = inlined = rounds = 0
    for rounds in range(1, MAX_ROUNDS + 1):  # noqa: B007 (reported below)
        changed = False
        if inlining:
            nodes, placement, done = inline_functions(
                nodes, placement, devices, feeds=fed, allow_soft_placement=allow_soft_placement
            )
            inlined += done
            changed |= done > 0
        if options.folding:
            n = len(nodes)
            nodes, placement, did = fold_constants(
                nodes,
                placement,
                devices,
                feeds=fed,
                fetches=fetches,
                targets=targets,
                max_bytes=options.max_folded_constant_in_bytes,
            )
            folded += n - len(nodes)
            changed |= did
            # Batch norms folded into convolutions need folding's constants first.  A
            # fetched value is never rewritten away, whatever CSE may merge.
            nodes, placement, did = rewrite_convolutions(
                nodes, placement, feeds=fed, protected=protected | {r[0] for r in fetches}
            )
            changed |= did
        if options.cse:
            n = len(nodes)
            nodes, placement, did = eliminate_common_subexpressions(
                nodes, placement, feeds=fed, protected=protected, renames=renames
            )
            merged += n - len(nodes)
            changed |= did
            if renames and served is not None:  # later passes see the fetches as served
                served[:] = [(renames.get(r[0], r[0]), r[1]) for r in served]
                fetches = served
                renames.clear()
        if not changed:
            break
    return nodes, placement, OptimizerStats(before, len(nodes), folded, merged, inlined, rounds)
