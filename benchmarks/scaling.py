"""The scale family's driver: graph build, first and second run and peak RSS of a long
chain, each measured in a fresh subprocess (:mod:`benchmarks.scale`), asyncflow's and
TensorFlow's rounds alternating."""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.common import (
    Af,
    numpy_chain,
)
from benchmarks.process import run_child
from benchmarks.report import Row
from benchmarks.sizes import Sizes, timed

# --------------------------------------------------------------------------- scale


def _scale_rounds(
    engines: dict[str, int], repeats: int
) -> tuple[dict[str, list[dict[str, Any]]], str | None]:
    """``repeats`` rounds of one fresh subprocess per engine (alternating), and TF's
    error if its subprocess failed (TF is then left out of the later rounds; asyncflow
    failing fails the workload)."""
    results: dict[str, list[dict[str, Any]]] = {engine: [] for engine in engines}
    tf_error = None
    for _ in range(repeats):
        for engine, n in engines.items():
            if engine == "tf" and tf_error is not None:
                continue
            result = run_child(["benchmarks.scale", engine, str(n)], timeout=900)
            if "_error" in result:
                if engine == "asyncflow":
                    raise RuntimeError(f"scale subprocess failed: {result['_error']}")
                tf_error = result["_error"]
                continue
            results[engine].append(result)
    return results, tf_error


def scale(af: Af, s: Sizes, rows: dict[str, Row], with_tf: bool = False) -> None:
    """Build, first run, second run and memory of a 100k-node chain, each repeat in a
    fresh subprocess; with ``with_tf`` TensorFlow's subprocess alternates with
    asyncflow's repeat by repeat and fills the TF column (see :mod:`benchmarks.scale`
    for how memory is measured, the same way for both)."""
    del af  # measured in clean subprocesses
    engines = {"asyncflow": s.scale_n, **({"tf": s.tf_scale_n} if with_tf else {})}
    results, tf_error = _scale_rounds(engines, s.scale_repeats)
    floor = numpy_chain(s.scale_n)
    floor_times = [timed(floor) for _ in range(s.repeats)]
    for key in ("scale.build", "scale.first_run", "scale.second_run", "scale.peak_rss"):
        row = rows[key]
        ours = [r[key] for r in results["asyncflow"]]
        row.ours, row.ours_median = min(ours), statistics.median(ours)
        row.repeats = len(ours)
        if results.get("tf"):
            theirs = [r[key] for r in results["tf"]]
            row.tf, row.tf_median = min(theirs), statistics.median(theirs)
    for key in ("scale.first_run", "scale.second_run"):
        rows[key].anchor = min(floor_times) / s.scale_n * 1e6
        rows[key].anchor_median = statistics.median(floor_times) / s.scale_n * 1e6
    rows["scale.build"].notes.append(
        f"best of {s.scale_repeats} fresh subprocesses per engine"
        + (", asyncflow's and TF's alternating" if with_tf else "")
    )
    if with_tf and tf_error is not None:
        for key in ("scale.build", "scale.first_run", "scale.second_run", "scale.peak_rss"):
            rows[key].tf_note = "error"
        rows["scale.build"].notes.append(f"TF scale subprocess failed: {tf_error}")
    if with_tf and s.tf_scale_n != s.scale_n:
        rows["scale.build"].notes.append(
            f"TF's scale figures are for a {s.tf_scale_n:,}-node chain"
        )

    def memory(engine: str, what: str) -> str:
        r = min(results[engine], key=lambda r: r["scale.peak_rss"])
        return (
            f"{what}: peak {r['peak_abs_mb']:.0f} MB - {r['imports_rss_mb']:.0f} MB after "
            f"its imports = {r['scale.peak_rss']:.0f} MB (the child started at "
            f"{r['start_rss_mb']:.0f} MB)"
        )

    rows["scale.peak_rss"].notes.append(
        "each engine in a fresh subprocess: (peak RSS after the workload) - (RSS after "
        "the engine's imports), both measured the same way; absolute figures from the "
        "same interpreter start: "
        + memory("asyncflow", "asyncflow")
        + ("; " + memory("tf", "TF 1.x") if results.get("tf") else "")
    )


def scale_cond(af: Af, s: Sizes, rows: dict[str, Row]) -> None:
    """The 100k chain with one cond against the same chain, each in a fresh subprocess,
    alternating (best of ``repeats`` for time; peak RSS is the same each time)."""
    del af
    plain: list[dict[str, Any]] = []
    cond: list[dict[str, Any]] = []
    for _ in range(max(2, min(s.repeats, 3))):
        for engine, out in (("asyncflow", plain), ("asyncflow-cond", cond)):
            result = run_child(["benchmarks.scale", engine, str(s.scale_n)], timeout=600)
            if "_error" in result:
                raise RuntimeError(f"scale subprocess failed: {result['_error']}")
            out.append(result)
    for row_id, key in (
        ("scale.cond.second_run", "scale.second_run"),
        ("scale.cond.peak_rss", "scale.peak_rss"),
    ):
        rows[row_id].record([r[key] for r in cond], [r[key] for r in plain])
    rows["scale.cond.peak_rss"].notes.append(
        "peak RSS - RSS after the imports, each in its own subprocess (as scale.peak_rss)"
    )
