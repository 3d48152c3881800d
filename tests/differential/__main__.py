"""``python -m tests.differential [--tf N] [--ref N] [--seed S] [--show K] [--category C]``.

Runs N random programs through asyncflow and compares each with the numpy reference
interpreter (``--ref``, the default) or with TensorFlow 1.x (``--tf``), then prints
an agreement table by category.  Against TF a disagreement that README's
"Differences from TF 1.x" explains is counted as a documented difference (see
:data:`DOCUMENTED`); anything else is listed with its seed so that
``--seed S --tf 1 --show 1`` reproduces it with the program printed.  ``--category C``
generates only programs of category C.  ``--tf`` without TensorFlow installed says what to install and exits 2.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from collections.abc import Callable

from .oracles import Outcome, compare, quiet_tensorflow, run_asyncflow, run_numpy
from .programs import CATEGORIES, Program, generate


# Deliberate differences (README, "Differences from TF 1.x"): a predicate on the
# disagreement and the program, and the README entry it falls under.
def _truncate_by_zero(why: str, program: Program) -> bool:
    truncating = any(
        value in ("truncatediv", "truncatemod")  # as an op, a branch, a body
        for n in program.nodes
        for value in n.attrs.values()
        if isinstance(value, str)
    )
    return truncating and "'InvalidArgumentError') vs ('run', 'InternalError')" in why


def _where_rows(why: str, program: Program) -> bool:
    rows = any(
        n.kind == "where" and len(program.nodes[n.args[0]].shape) == 1 and len(n.shape) == 2
        for n in program.nodes
    )
    return rows and "values differ" in why


DOCUMENTED: list[tuple[str, Callable[[str, Program], bool]]] = [
    (
        "integer truncatediv/truncatemod by zero: InvalidArgumentError (TF: InternalError)",
        _truncate_by_zero,
    ),
    ("where(vector cond, matrices) broadcasts (TF 1.x's tf.where picks rows)", _where_rows),
]


def _classify(why: str, program: Program) -> str | None:
    for name, matches in DOCUMENTED:
        if matches(why, program):
            return name
    return None


def tensorflow_available() -> bool:
    """Whether TensorFlow can be imported here (found, not imported: that is slow)."""
    import importlib.util

    return importlib.util.find_spec("tensorflow") is not None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.differential")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--tf", type=int, metavar="N", help="compare N programs with TF 1.x")
    group.add_argument(
        "--ref",
        type=int,
        metavar="N",
        help="compare N programs with the numpy reference (default 300)",
    )
    parser.add_argument("--seed", type=int, default=0, help="first program seed")
    parser.add_argument(
        "--show", type=int, default=5, help="print the first K undocumented disagreements in full"
    )
    parser.add_argument("--category", choices=CATEGORIES, help="only programs of this category")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    n = args.tf if args.tf is not None else (args.ref or 300)
    oracle: Callable[[Program], Outcome] = run_numpy
    tolerance = "exact"
    if args.tf is not None:
        if not tensorflow_available():
            print(
                "python -m tests.differential --tf needs TensorFlow: pip install tensorflow-cpu",
                file=sys.stderr,
            )
            return 2
        with quiet_tensorflow():
            from .oracles import run_tensorflow
        oracle, tolerance = run_tensorflow, "tf"
    totals: collections.Counter[str] = collections.Counter()
    agreed: collections.Counter[str] = collections.Counter()
    documented: collections.Counter[str] = collections.Counter()
    reasons: collections.Counter[str] = collections.Counter()
    failures: list[tuple[int, str, str]] = []
    start = time.perf_counter()
    for seed in range(args.seed, args.seed + n):
        program = generate(seed, args.category)
        totals[program.category] += 1
        why = compare(run_asyncflow(program), oracle(program), tolerance)
        if why is None:
            agreed[program.category] += 1
            continue
        reason = _classify(why, program)
        if reason is not None:
            documented[program.category] += 1
            reasons[reason] += 1
            continue
        failures.append((seed, program.category, why))
        if len(failures) <= args.show:
            print(f"-- seed {seed}: {why}\n{program.describe()}\n", file=sys.stderr)
    elapsed = time.perf_counter() - start
    name = "TF 1.x" if args.tf is not None else "numpy reference"
    print(f"{n} programs vs {name} in {elapsed:.1f} s (seeds {args.seed}..{args.seed + n - 1})")
    print(
        f"{'category':<14}{'programs':>10}{'agree':>8}{'documented':>12}{'differ':>8}"
        f"{'agree %':>9}{'+doc %':>8}"
    )
    rows = [*CATEGORIES, "total"]
    for cat in rows:
        if cat == "total":
            t, a, d = sum(totals.values()), sum(agreed.values()), sum(documented.values())
        else:
            t, a, d = totals[cat], agreed[cat], documented[cat]
        if not t:
            continue
        print(
            f"{cat:<14}{t:>10}{a:>8}{d:>12}{t - a - d:>8}{100 * a / t:>8.1f}%"
            f"{100 * (a + d) / t:>7.1f}%"
        )
    for reason, count in reasons.most_common():
        print(f"  documented: {count:>4} x {reason}")
    for seed, cat, why in failures[:20]:
        print(f"  differs: seed {seed} ({cat}): {why[:150]}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
