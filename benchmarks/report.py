"""Rows of the results table, their targets, and the table / JSON renderings."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Target:
    """``ours <op> value`` or, when ``relative``, ``ours / anchor <op> value``."""

    op: str  # "<=" or ">="
    value: float
    relative: bool = False
    # When the anchor itself misses the target (the parallel speedup on a machine
    # whose second core is busy with other work; asyncio's own timer and task
    # overhead in the overlap workload) and ours is within 10% of the anchor, the
    # target cannot be judged on this machine: "inconclusive", not "met".
    anchor_must_meet: bool = False
    # Judged on the medians of the repeats, not on the best of each side (a figure
    # whose best repeats swing with the machine more than the target's margin: the
    # service's CPU per request).
    median: bool = False

    def text(self, unit: str) -> str:
        of = " (medians)" if self.median else ""
        if self.relative:
            return f"{self.op} {_num(self.value)}x anchor{of}"
        return f"{self.op} {_num(self.value)} {unit}{of}"

    def met(self, ours: float, anchor: float | None) -> bool | None:
        if self.relative:
            if anchor is None or anchor <= 0:
                return None
            ours = ours / anchor
        return ours <= self.value if self.op == "<=" else ours >= self.value


@dataclass(frozen=True, slots=True)
class TfTarget:
    """The target against TensorFlow 1.x's figure of the same row:
    ``ours / tf <op> value``, or when ``faster``, ``tf / ours <op> value`` (read
    "``value``x faster than TF"; for a time, the lower ours the higher that ratio)."""

    op: str  # "<=" or ">="
    value: float
    faster: bool = False

    def text(self, short: bool = False) -> str:
        if self.faster:
            return f"{self.op} {_num(self.value)}x faster" + ("" if short else " than TF")
        return f"{self.op} {_num(self.value)}x TF"

    def ratio(self, ours: float, tf: float) -> float | None:
        if self.faster:
            return tf / ours if ours > 0 else None
        return ours / tf if tf > 0 else None

    def met(self, ours: float, tf: float) -> bool | None:
        r = self.ratio(ours, tf)
        if r is None:
            return None
        return r <= self.value if self.op == "<=" else r >= self.value


@dataclass(slots=True)
class Row:
    """One measured figure: asyncflow's value next to its anchors."""

    id: str
    metric: str
    unit: str
    anchor_name: str
    target: Target | None = None
    better: str = "lower"  # which direction is better, for reading the ratios
    tf_target: TfTarget | None = None  # the target against TF 1.x
    ours: float | None = None  # every figure: the best of the repeats ...
    anchor: float | None = None
    tf: float | None = None
    dask: float | None = None
    ours_median: float | None = None  # ... and, where known, their median
    anchor_median: float | None = None
    tf_median: float | None = None
    dask_median: float | None = None  # (the Dask anchors report only their best)
    repeats: int | None = None  # how many repeats ours and anchor are the best of
    tf_note: str = "n/a"  # shown when tf is None: "n/a", "not installed", "error", ...
    dask_note: str = "n/a"
    skipped: str | None = None  # why the row was not measured (an optional extra missing)
    error: str | None = None
    notes: list[str] = field(default_factory=list)

    def record(
        self,
        ours: Sequence[float],
        anchor: Sequence[float] | None = None,
        per: Callable[[float], float] = lambda t: t,
    ) -> None:
        """Set ours (and the anchor) from the repeats' raw measurements (seconds,
        usually): the best repeat and the median, each mapped through ``per`` (a
        monotonic conversion, e.g. seconds to us/node or to elements per second; the
        best is the smallest raw figure)."""
        self.ours, self.ours_median = per(min(ours)), per(statistics.median(ours))
        self.repeats = len(ours)
        if anchor is not None:
            self.anchor, self.anchor_median = per(min(anchor)), per(statistics.median(anchor))

    @property
    def status(self) -> str:
        if self.target is None:
            return "-"
        if self.skipped is not None:
            return "skipped"
        if self.error is not None or self.ours is None:
            return "NOT met (error)"
        met = self.target.met(*self.judged())
        if met is None:
            return "unknown"
        if (
            not met
            and self.target.anchor_must_meet
            and self.anchor is not None
            and not self.target.met(self.anchor, None)
            and self._near_anchor()
        ):
            return "inconclusive"
        return "met" if met else "NOT met"

    @property
    def tf_status(self) -> str:
        """The TF target's status: judged only when TF's figure is there."""
        if self.tf_target is None:
            return "-"
        if self.skipped is not None:
            return "skipped"
        if self.error is not None or self.ours is None:
            return "NOT met (error)"
        if self.tf is None:
            return "no TF"
        met = self.tf_target.met(self.ours, self.tf)
        if met is None:
            return "unknown"
        return "met" if met else "NOT met"

    @property
    def on_medians(self) -> bool:
        """The target judges the medians of the repeats (and the repeats have them)."""
        return self.target is not None and self.target.median and self.ours_median is not None

    def judged(self) -> tuple[float, float | None]:
        """(ours, anchor) as the target judges them: the best repeats, or their
        medians (:attr:`on_medians`)."""
        if self.on_medians:
            return self.ours_median, self.anchor_median  # type: ignore[return-value]
        assert self.ours is not None
        return self.ours, self.anchor

    def _near_anchor(self, tolerance: float = 1.1) -> bool:
        """Whether ours is within ``tolerance`` of the anchor (in the target's
        direction): a run far behind its anchor is a miss, however busy the machine."""
        assert self.target is not None
        assert self.ours is not None
        assert self.anchor is not None
        if self.target.op == "<=":
            return self.ours <= self.anchor * tolerance
        return self.ours >= self.anchor / tolerance

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["target"] = None if self.target is None else self.target.text(self.unit)
        data["status"] = self.status
        data["tf_target"] = None if self.tf_target is None else self.tf_target.text()
        data["tf_status"] = self.tf_status
        data["ratio_anchor"] = _ratio(self.ours, self.anchor)
        data["ratio_tf"] = _ratio(self.ours, self.tf)
        data["ratio_dask"] = _ratio(self.ours, self.dask)
        return data


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def _num(x: float | None) -> str:
    """A compact number: 3 significant digits, no exponent for everyday magnitudes."""
    if x is None:
        return "-"
    if not math.isfinite(x):
        return str(x)
    ax = abs(x)
    if ax >= 1000:
        return f"{x:,.0f}"
    if ax >= 100:
        return f"{x:.0f}"
    if ax >= 10:
        return f"{x:.1f}"
    if ax >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def _cell(value: float | None, fallback: str) -> str:
    return _num(value) if value is not None else fallback


def _ratio_cell(a: float | None, b: float | None) -> str:
    r = _ratio(a, b)
    return "-" if r is None else f"{r:.2f}x"


COLUMNS = (
    ("workload", 16, "<"),
    ("metric", 24, "<"),
    ("unit", 8, "<"),
    ("asyncflow", 9, ">"),
    ("anchor", 9, ">"),
    ("ours/anc", 8, ">"),
    ("TF 1.x", 9, ">"),
    ("ours/TF", 8, ">"),
    ("Dask", 9, ">"),
    ("ours/Dask", 9, ">"),
    ("target", 16, "<"),
    ("status", 12, "<"),
    ("target vs TF", 16, "<"),
    ("TF status", 9, "<"),
)


def _line(cells: list[str]) -> str:
    parts = [f"{c:{align}{width}}" for c, (_, width, align) in zip(cells, COLUMNS, strict=True)]
    return "  ".join(parts).rstrip()


def render_table(rows: list[Row]) -> str:
    header = _line([name for name, _, _ in COLUMNS])
    out = [header, "-" * len(header)]
    for r in rows:
        ours = (
            "ERROR"
            if r.error is not None
            else "skipped"
            if r.skipped is not None
            else _cell(r.ours, "-")
        )
        out.append(
            _line(
                [
                    r.id,
                    r.metric[:24],
                    r.unit,
                    ours,
                    _cell(r.anchor, "-"),
                    _ratio_cell(r.ours, r.anchor),
                    _cell(r.tf, r.tf_note),
                    _ratio_cell(r.ours, r.tf),
                    _cell(r.dask, r.dask_note),
                    _ratio_cell(r.ours, r.dask),
                    "-" if r.target is None else r.target.text(r.unit),
                    r.status,
                    "-" if r.tf_target is None else r.tf_target.text(short=True),
                    r.tf_status,
                ]
            )
        )
    return "\n".join(out)


MEDIAN_COLUMNS = (
    ("workload", 22, "<"),
    ("unit", 8, "<"),
    ("reps", 4, ">"),
    ("ours min", 9, ">"),
    ("ours med", 9, ">"),
    ("med/min", 7, ">"),
    ("anc min", 9, ">"),
    ("anc med", 9, ">"),
    ("ours/anc med", 12, ">"),
    ("TF min", 9, ">"),
    ("TF med", 9, ">"),
    ("ours/TF med", 11, ">"),
)


def render_medians(rows: list[Row]) -> str:
    """The best repeat beside the median of the repeats, for every row that has one:
    how far the typical repeat is from the best, and the ratios of the medians."""

    def line(cells: list[str]) -> str:
        return "  ".join(
            f"{c:{align}{width}}"
            for c, (_, width, align) in zip(cells, MEDIAN_COLUMNS, strict=True)
        ).rstrip()

    header = line([name for name, _, _ in MEDIAN_COLUMNS])
    out = [header, "-" * len(header)]
    for r in rows:
        if r.ours is None:
            continue
        out.append(
            line(
                [
                    r.id,
                    r.unit,
                    "-" if r.repeats is None else str(r.repeats),
                    _num(r.ours),
                    _cell(r.ours_median, "-"),
                    _ratio_cell(r.ours_median, r.ours),
                    _cell(r.anchor, "-"),
                    _cell(r.anchor_median, "-"),
                    _ratio_cell(r.ours_median, r.anchor_median),
                    _cell(r.tf, r.tf_note),
                    _cell(r.tf_median, "-"),
                    _ratio_cell(r.ours_median, r.tf_median),
                ]
            )
        )
    return "\n".join(out)


def render_ratio_legend(rows: list[Row]) -> str:
    """How to read the ratio columns: which units are better when higher."""
    higher = list(dict.fromkeys(f"'{r.unit}'" for r in rows if r.better == "higher"))
    if not higher:
        return "ratios are ours / other: lower is better."
    units = higher[0] if len(higher) == 1 else f"{', '.join(higher[:-1])} and {higher[-1]}"
    return (
        f"ratios are ours / other: lower is better, except in {units} rows "
        f"(higher is better: there a ratio above 1.00x means asyncflow is ahead)."
    )


def render_anchor_legend(rows: list[Row]) -> str:
    out = ["anchor column (measured in this process, interleaved with asyncflow's repeats):"]
    out += [f"  {r.id:<18} {r.anchor_name}" for r in rows if r.anchor_name]
    return "\n".join(out)


def render_targets(rows: list[Row]) -> str:
    """One line per target: the rows' own (against their in-process anchor or
    absolute), then the ones against TF 1.x ("no TF" when TF's column is empty)."""
    out = []
    for r in rows:
        ours = "skipped" if r.skipped is not None else _cell(r.ours, "ERROR")
        if r.target is not None:
            what = f"{r.id}: asyncflow {ours} {r.unit}"
            if r.target.relative and r.ours is not None and r.anchor:
                mine, theirs = r.judged()
                of = " median" if r.on_medians else ""
                if r.on_medians:
                    what = f"{r.id}: asyncflow median {_num(mine)} {r.unit}"
                if theirs:
                    what += f" = {mine / theirs:.2f}x anchor{of} ({_num(theirs)} {r.unit})"
            status = r.status
            line = f"[{status:^7}] {what}; target {r.target.text(r.unit)}"
            if status == "inconclusive":
                line += (
                    f" - the anchor itself only reached {_num(r.anchor)}: the target "
                    f"is out of this machine's reach right now"
                )
            out.append(line)
    for r in rows:
        if r.tf_target is None:
            continue
        ours = "skipped" if r.skipped is not None else _cell(r.ours, "ERROR")
        what = f"{r.id}: asyncflow {ours} {r.unit}"
        ratio = (
            None
            if r.ours is None or r.tf is None or r.skipped is not None
            else r.tf_target.ratio(r.ours, r.tf)
        )
        if r.tf is not None and ratio is not None:
            kind = "x faster than" if r.tf_target.faster else "x"
            what += f" vs TF 1.x {_num(r.tf)} = {ratio:.2f}{kind} TF"
        elif r.tf is None:
            what += f" (TF 1.x: {r.tf_note})"
        out.append(f"[{r.tf_status:^7}] vs TF: {what}; target {r.tf_target.text()}")
    return "\n".join(out)


def render_notes(rows: list[Row]) -> str:
    out = []
    errors_seen: set[str] = set()
    for r in rows:
        if r.skipped is not None:
            out.append(f"  {r.id}: skipped: {r.skipped}")
        if r.error is not None and r.error not in errors_seen:
            errors_seen.add(r.error)
            out.append(f"  {r.id}: ERROR {r.error}")
        out += [f"  {r.id}: {note}" for note in r.notes]
    return "notes:\n" + "\n".join(out) if out else ""
