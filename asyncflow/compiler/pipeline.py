"""The compile pipeline: a graph's IR and a run signature in, plain plans out.

    prune → place → optimize → control-flow lowering → partition → plan

Every stage is a pure function over the values of :mod:`asyncflow.compiler.ir`; the
result, :class:`Compiled`, holds no graph, kernel or session object: it pickles, can
be cached per signature, printed, and shipped to another process.  Kernels are
bound to it afterwards (:func:`asyncflow.runtime.bind.bind`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from asyncflow import errors
from asyncflow.compiler.control_flow import (
    CONTROL_FLOW_OPS,
    Frames,
    add_control_loops,
    node_frames,
)
from asyncflow.compiler.ir import GraphIR, NodeDef, Ref
from asyncflow.compiler.optimize import OptimizerStats, optimize
from asyncflow.compiler.partition import PartitionDef, add_client_edges, partition
from asyncflow.compiler.placement import place
from asyncflow.compiler.plan import Plan, build_plan
from asyncflow.compiler.prune import prune
from asyncflow.config import OptimizerOptions

__all__ = ["ClientKeys", "Compiled", "compile_signature"]

_DEFAULT_OPTIONS = OptimizerOptions()


@dataclass(frozen=True, slots=True)
class ClientKeys:
    """Partial runs: the rendezvous keys of the client's feeds, fetches and targets."""

    feeds: tuple[str, ...]
    fetches: tuple[str, ...]
    targets: tuple[str, ...]


@dataclass(frozen=True, slots=True, eq=False)
class Compiled:
    """A compiled run signature: one plan per partition, and where each fetch comes from.

    ``retval_map[k]`` is ``(partition, index)`` for fetch ``k``, or ``(-1, feed index)``
    for a fetch that is also fed.  ``optimizer`` says what the graph optimizer did.
    """

    plans: tuple[Plan, ...]
    retval_map: tuple[tuple[int, int], ...]
    #: Every node that runs, and the index in ``devices`` of its device (see placement).
    nodes: tuple[NodeDef, ...]
    node_devices: tuple[int, ...]
    devices: tuple[str, ...]
    client: ClientKeys | None = None
    optimizer: OptimizerStats = field(default_factory=OptimizerStats)

    @property
    def placement(self) -> tuple[tuple[str, str], ...]:
        """(node name, device) of every node that runs (made when asked: a large
        compile would otherwise make a pair per node for a log line)."""
        devices = self.devices
        return tuple((n.name, devices[d]) for n, d in zip(self.nodes, self.node_devices))

    @property
    def partitions(self) -> tuple[PartitionDef, ...]:
        """The partitions (one per device used)."""
        return tuple(p.partition for p in self.plans)

    def __repr__(self) -> str:
        return f"<Compiled partitions={len(self.plans)} fetches={len(self.retval_map)}>"


def compile_signature(
    ir: GraphIR,
    *,
    feeds: Sequence[Ref],
    fetches: Sequence[Ref],
    targets: Sequence[str],
    devices: Sequence[str],
    incarnation: int,
    allow_soft_placement: bool = False,
    client: str | None = None,
    options: OptimizerOptions | None = None,
    client_device: bool = True,
) -> Compiled:
    """Compile the run of ``fetches`` / ``targets`` with ``feeds`` on ``devices``.

    ``options`` select the graph optimizations (default: ``OptimizerOptions()``, L1).

    With ``client`` (a partial run), feeds and fetches travel through the step's
    rendezvous from and to that device instead of the call frame.  Feeds and fetches
    are on the client's device, ``devices[0]`` (as TF), unless ``client_device`` is
    False (see :func:`~asyncflow.compiler.partition.partition`).
    """
    nodes = prune(ir, fetches, targets, feeds)
    placement = (
        place(nodes, devices, allow_soft_placement=allow_soft_placement, lookup=ir.by_name)
        if ir.requests
        else (0,) * len(nodes)
    )
    # A fetch whose node CSE merges is served by the survivor (as TF); a partial run's
    # fetches keep their nodes (each has its own rendezvous key).
    served: list[Ref] | None = [] if client is None else None
    nodes, placement, stats = optimize(
        nodes,
        placement,
        devices=devices,
        options=options or _DEFAULT_OPTIONS,
        feeds=feeds,
        fetches=fetches,
        targets=targets,
        allow_soft_placement=allow_soft_placement,
        calls=ir.calls,
        served=served,
    )
    if served is not None:
        fetches = served
    ops = {n.op for n in nodes}
    control_flow = not ops.isdisjoint(CONTROL_FLOW_OPS)
    has_loops = "Enter" in ops
    frames = loops = None
    if has_loops:
        if feeds:  # where the fed tensors live: in the graph as it is without the feeds
            everything = prune(ir, (*fetches, *feeds), targets)
            _check_not_in_loop(node_frames(everything), everything, feeds, "fed")
        frames = node_frames(nodes)
        _check_not_in_loop(frames, nodes, fetches, "fetched")
    client_keys = None
    if client is not None:
        feed_infos = [ir.by_name[r[0]].outputs[r[1]] for r in feeds]
        nodes, placement, fk, tk, gk = add_client_edges(
            nodes, placement, devices, feeds, fetches, targets, incarnation, client, feed_infos
        )
        client_keys = ClientKeys(fk, tk, gk)
        targets = tuple(n.name for n in nodes[len(nodes) - len(fetches) - len(targets) :])
        feeds, fetches = (), ()
        if has_loops:
            frames = node_frames(nodes)
    if frames is not None and len(set(placement)) > 1:
        nodes, placement, frames, loops = add_control_loops(nodes, placement, frames)
    parts = partition(
        nodes,
        placement,
        devices,
        feeds,
        fetches,
        targets,
        incarnation,
        frames,
        loops,
        control_flow=control_flow,
        client_device=client_device,
    )
    fed = {r: k for k, r in enumerate(feeds)}
    where: dict[int, tuple[int, int]] = {}
    for p, part in enumerate(parts):
        for local, (k, _) in enumerate(part.retvals):
            where[k] = (p, local)
    retval_map = tuple((-1, fed[r]) if r in fed else where[k] for k, r in enumerate(fetches))
    return Compiled(
        tuple([build_plan(part) for part in parts]),
        retval_map,
        tuple(nodes),
        tuple(placement),
        tuple(devices),
        client_keys,
        stats,
    )


def _check_not_in_loop(
    frames: Frames, nodes: Sequence[NodeDef], refs: Sequence[Ref], what: str
) -> None:
    """Feeds and fetches cross the call frame, which lives in the root frame."""
    for r in refs:
        if frames.out_frame.get(r[0]):
            node = next(n for n in nodes if n.name == r[0])
            raise errors.InvalidArgumentError(
                None,
                node,
                f"Tensor '{r[0]}:{r[1]}' is inside a while loop and cannot be "
                f"{what}; feed or fetch the loop's inputs or outputs instead",
            )
