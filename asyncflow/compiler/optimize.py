"""The optimizer's place in the pipeline: after placement, before control-flow
lowering and partitioning (TF's ``GraphOptimizer`` runs there too).

Constant folding, common-subexpression elimination and function inlining are
passes over the IR that will run here (see DESIGN §6); until they exist, the
pipeline hands the pruned, placed nodes through unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

from asyncflow.compiler.ir import NodeDef

__all__ = ["optimize"]


def optimize(nodes: Sequence[NodeDef], placement: Sequence[int]
             ) -> tuple[tuple[NodeDef, ...], tuple[int, ...]]:
    """The optimized nodes and their placement (no pass is enabled yet)."""
    return tuple(nodes), tuple(placement)
