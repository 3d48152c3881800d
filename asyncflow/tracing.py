"""Step stats → a Chrome trace (``chrome://tracing``, https://ui.perfetto.dev); graph pictures.

``af.tracing.to_dot(graph)`` / ``to_mermaid(graph)`` draw a graph or graph def
(see :mod:`asyncflow.framework.pictures`).

``af.tracing.Timeline(run_metadata.step_stats).generate_chrome_trace_format()``
returns the JSON text of a trace in the Trace Event Format:

* one *process* per device (``process_name`` metadata), each node a complete event
  (``"ph": "X"``) named by its op type, with the node name, kernel kind (inline /
  async / thread / send / recv), thread and output shapes in ``args``;
* overlapping nodes of a device (concurrent async kernels, worker threads) are put
  on separate *lanes* (threads, ``thread_name`` metadata), as TensorFlow's timeline
  does, so every lane nests properly;
* a *flow arrow* (``"ph": "s"`` → ``"ph": "f"``) from every ``_Send`` to the ``_Recv``
  with the same rendezvous key, when ``show_dataflow`` is on.
"""

from __future__ import annotations

import json
from typing import Any

from asyncflow.config import NodeExecStats, StepStats
from asyncflow.framework.pictures import to_dot, to_mermaid

__all__ = ["Timeline", "to_dot", "to_mermaid"]


class Timeline:
    """Turns a step's :class:`StepStats` into a Chrome trace."""

    def __init__(self, step_stats: StepStats, graph: Any = None) -> None:
        if not isinstance(step_stats, StepStats):
            raise TypeError(
                f"Timeline needs the step_stats of a RunMetadata, got {type(step_stats).__name__}"
            )
        self._step_stats = step_stats

    def generate_chrome_trace_format(
        self, show_dataflow: bool = True, show_memory: bool = False
    ) -> str:
        """The trace as JSON text (``show_memory`` is accepted for TF compatibility)."""
        return json.dumps(self.trace_events(show_dataflow), separators=(",", ":"))

    def trace_events(self, show_dataflow: bool = True) -> dict[str, Any]:
        """The trace as a dict (``{"traceEvents": [...], "displayTimeUnit": "ms"}``)."""
        events: list[dict[str, Any]] = []
        origin = min(
            (ns.all_start_micros for d in self._step_stats.dev_stats for ns in d.node_stats),
            default=0,
        )
        sends: dict[str, tuple[int, int, int]] = {}
        recvs: dict[str, tuple[int, int, int]] = {}
        for pid, dev in enumerate(self._step_stats.dev_stats):
            events.append(
                {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": dev.device}}
            )
            events.append(
                {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}}
            )
            lanes = _assign_lanes(dev.node_stats)
            for tid in sorted(set(lanes)):
                events.append(
                    {
                        "ph": "M",
                        "name": "thread_name",
                        "pid": pid,
                        "tid": tid,
                        "args": {"name": f"lane {tid}"},
                    }
                )
            for ns, tid in zip(dev.node_stats, lanes):
                ts = ns.all_start_micros - origin
                dur = max(ns.all_end_rel_micros, 1)
                events.append(
                    {
                        "ph": "X",
                        "cat": "Op",
                        "name": ns.op_type or ns.node_name,
                        "pid": pid,
                        "tid": tid,
                        "ts": ts,
                        "dur": dur,
                        "args": {
                            "name": ns.node_name,
                            "op": ns.op_type,
                            "kind": ns.kind,
                            "thread_id": ns.thread_id,
                            **(
                                {"frame": ns.frame_name, "iteration": ns.iter_id}
                                if ns.frame_name
                                else {}
                            ),
                            "outputs": [
                                {
                                    "slot": o.slot,
                                    "shape": list(o.shape),
                                    "dtype": o.dtype,
                                    "bytes": o.requested_bytes,
                                }
                                for o in ns.output
                            ],
                        },
                    }
                )
                if ns.rendezvous_key:
                    where = (pid, tid, ts if ns.kind == "send" else ts + dur - 1)
                    (sends if ns.kind == "send" else recvs)[ns.rendezvous_key] = where
        if show_dataflow:
            for flow_id, (key, (spid, stid, sts)) in enumerate(sorted(sends.items())):
                target = recvs.get(key)
                if target is None:
                    continue
                rpid, rtid, rts = target
                name = key.split(";")[3] if key.count(";") == 4 else key
                events.append(
                    {
                        "ph": "s",
                        "cat": "DataFlow",
                        "name": name,
                        "id": flow_id,
                        "pid": spid,
                        "tid": stid,
                        "ts": sts,
                    }
                )
                events.append(
                    {
                        "ph": "f",
                        "bp": "e",
                        "cat": "DataFlow",
                        "name": name,
                        "id": flow_id,
                        "pid": rpid,
                        "tid": rtid,
                        "ts": max(rts, sts),
                    }
                )
        return {"traceEvents": events, "displayTimeUnit": "ms"}


def _assign_lanes(nodes: list[NodeExecStats]) -> list[int]:
    """Greedy lanes: each node on the first lane that is free when it starts."""
    order = sorted(range(len(nodes)), key=lambda k: nodes[k].all_start_micros)
    lane_end: list[int] = []
    lanes = [0] * len(nodes)
    for k in order:
        ns = nodes[k]
        start = ns.all_start_micros
        end = start + max(ns.all_end_rel_micros, 1)
        for lane, busy_until in enumerate(lane_end):
            if busy_until <= start:
                lane_end[lane] = end
                lanes[k] = lane
                break
        else:
            lanes[k] = len(lane_end)
            lane_end.append(end)
    return lanes
