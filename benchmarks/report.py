"""Rows of the results table, their targets, and the table / JSON renderings."""

from __future__ import annotations

import math
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

    def text(self, unit: str) -> str:
        if self.relative:
            return f"{self.op} {_num(self.value)}x anchor"
        return f"{self.op} {_num(self.value)} {unit}"

    def met(self, ours: float, anchor: float | None) -> bool | None:
        if self.relative:
            if anchor is None or anchor <= 0:
                return None
            ours = ours / anchor
        return ours <= self.value if self.op == "<=" else ours >= self.value


@dataclass(slots=True)
class Row:
    """One measured figure: asyncflow's value next to its anchors."""

    id: str
    metric: str
    unit: str
    anchor_name: str
    target: Target | None = None
    better: str = "lower"  # which direction is better, for reading the ratios
    ours: float | None = None
    anchor: float | None = None
    tf: float | None = None
    dask: float | None = None
    tf_note: str = "n/a"  # shown when tf is None: "n/a", "not installed", "error", ...
    dask_note: str = "n/a"
    error: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        if self.target is None:
            return "-"
        if self.error is not None or self.ours is None:
            return "NOT met (error)"
        met = self.target.met(self.ours, self.anchor)
        if met is None:
            return "unknown"
        if (not met and self.target.anchor_must_meet and self.anchor is not None
                and not self.target.met(self.anchor, None) and self._near_anchor()):
            return "inconclusive"
        return "met" if met else "NOT met"

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
)


def _line(cells: list[str]) -> str:
    parts = [f"{c:{align}{width}}" for c, (_, width, align) in zip(cells, COLUMNS, strict=True)]
    return "  ".join(parts).rstrip()


def render_table(rows: list[Row]) -> str:
    header = _line([name for name, _, _ in COLUMNS])
    out = [header, "-" * len(header)]
    for r in rows:
        ours = "ERROR" if r.error is not None else _cell(r.ours, "-")
        out.append(_line([
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
        ]))
    return "\n".join(out)


def render_ratio_legend(rows: list[Row]) -> str:
    """How to read the ratio columns: which units are better when higher."""
    higher = list(dict.fromkeys(f"'{r.unit}'" for r in rows if r.better == "higher"))
    if not higher:
        return "ratios are ours / other: lower is better."
    units = higher[0] if len(higher) == 1 else f"{', '.join(higher[:-1])} and {higher[-1]}"
    return (f"ratios are ours / other: lower is better, except in {units} rows "
            f"(higher is better: there a ratio above 1.00x means asyncflow is ahead).")


def render_anchor_legend(rows: list[Row]) -> str:
    out = ["anchor column (measured in this process, interleaved with asyncflow's repeats):"]
    out += [f"  {r.id:<18} {r.anchor_name}" for r in rows if r.anchor_name]
    return "\n".join(out)


def render_targets(rows: list[Row]) -> str:
    out = []
    for r in rows:
        if r.target is None:
            continue
        what = f"{r.id}: asyncflow {_cell(r.ours, 'ERROR')} {r.unit}"
        if r.target.relative and r.ours is not None and r.anchor:
            what += f" = {r.ours / r.anchor:.2f}x anchor ({_num(r.anchor)} {r.unit})"
        status = r.status
        line = f"[{status:^7}] {what}; target {r.target.text(r.unit)}"
        if status == "inconclusive":
            line += (f" - the anchor itself only reached {_num(r.anchor)}: the target is "
                     f"out of this machine's reach right now")
        out.append(line)
    return "\n".join(out)


def render_notes(rows: list[Row]) -> str:
    out = []
    errors_seen: set[str] = set()
    for r in rows:
        if r.error is not None and r.error not in errors_seen:
            errors_seen.add(r.error)
            out.append(f"  {r.id}: ERROR {r.error}")
        out += [f"  {r.id}: {note}" for note in r.notes]
    return "notes:\n" + "\n".join(out) if out else ""
