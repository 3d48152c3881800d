"""The ``asyncflow`` command.

``asyncflow run GRAPH.json --feed x:0=[[1,2,3]] --fetch y:0``
    Import a graph def (``Graph.as_graph_def()`` dumped as JSON) into a fresh graph,
    run one step and print each fetch as ``name = value``.  A feed value is JSON or
    the path of a ``.npy`` file; a bare op name ``x`` means its tensor ``x:0``.

    A graph file may name Python functions (``py_func`` references,
    ``"module:qualname"``); loading one imports its module, which runs code.  ``run``
    therefore refuses every reference whose module is not allowed by
    ``--allow-module M`` (repeatable; allows ``M`` and its submodules) or ``--trust``,
    and lists the references it found.  ``--progress`` draws a live progress bar on
    stderr (``rich``, the ``progress`` extra) once a run passes one second: kernels
    done / total and the kernel running longest.

``asyncflow graph GRAPH.json [--format dot|mermaid]``
    Print the graph as a Graphviz DOT or Mermaid picture (imports nothing).

``asyncflow --version``
    Print the version.

``asyncflow demo [--trace FILE]`` (``run`` takes ``--trace FILE`` too)
    Build and run a small graph that mixes numpy kernels with simulated async I/O
    kernels, then print the results and a per-node timing table taken from the
    step's ``RunMetadata.step_stats``.

Every failure is one line on stderr (``asyncflow: error: ...``) and a non-zero exit
status, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn

import numpy as np

__all__ = ["main"]

PROG = "asyncflow"


class _UsageError(Exception):
    """A bad command line, graph file or feed: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(message)


def _build_parser() -> argparse.ArgumentParser:
    from asyncflow import __version__

    parser = _Parser(prog=PROG, description="Run asyncflow dataflow graphs.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    run = sub.add_parser(
        "run",
        help="import a graph def (JSON) and run one step",
        description="Import a graph def and run one step.",
    )
    run.add_argument("graph", metavar="GRAPH.json", help="a graph def written as JSON")
    run.add_argument(
        "--feed",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="feed tensor NAME ('x:0' or 'x') with VALUE (JSON or a .npy path)",
    )
    run.add_argument(
        "--fetch",
        action="append",
        default=[],
        metavar="NAME",
        help="a tensor to fetch and print ('y:0' or 'y')",
    )
    run.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="OP",
        help="an op to run without fetching a value",
    )
    run.add_argument(
        "--trace",
        metavar="FILE",
        help="also write a Chrome trace (Perfetto, chrome://tracing) to FILE",
    )
    run.add_argument(
        "--progress",
        action="store_true",
        help="show a live progress bar on stderr for runs over ~1 s (nodes done / "
        "total, the node running longest); needs the 'progress' extra",
    )
    run.add_argument(
        "--allow-module",
        action="append",
        default=[],
        metavar="M",
        help="let py_func references import module M (and its submodules)",
    )
    run.add_argument(
        "--trust",
        action="store_true",
        help="let py_func references import any module (trusted files only)",
    )
    run.add_argument(
        "--opt-level",
        type=int,
        choices=(0, 1),
        default=1,
        help="graph optimizations: 1 (default) folds constants, merges common "
        "subexpressions and inlines functions; 0 runs the graph as written",
    )
    picture = sub.add_parser(
        "graph",
        help="print a graph def as a DOT or Mermaid picture",
        description="Print a graph def as a picture (imports nothing).",
    )
    picture.add_argument("graph", metavar="GRAPH.json", help="a graph def written as JSON")
    picture.add_argument(
        "--format",
        choices=("dot", "mermaid"),
        default="dot",
        help="Graphviz DOT (default) or Mermaid",
    )
    demo = sub.add_parser(
        "demo",
        help="run a built-in graph mixing numpy and async I/O",
        description="Run a built-in example graph and print its timing.",
    )
    demo.add_argument(
        "--trace",
        metavar="FILE",
        help="also write a Chrome trace (Perfetto, chrome://tracing) to FILE",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``asyncflow`` command with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command == "run":
            return _run(args)
        if args.command == "graph":
            return _graph(args)
        return _demo(args)
    except SystemExit as exc:  # --help and --version print and exit through argparse
        return exc.code if isinstance(exc.code, int) else 0
    except _UsageError as exc:
        return _fail(str(exc), 2)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except Exception as exc:  # the command line never shows a traceback
        return _fail(_describe(exc), 1)


def _fail(message: str, status: int) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return status


def _describe(exc: BaseException) -> str:
    from asyncflow import errors

    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    text = " ".join(line.strip() for line in text.splitlines() if line.strip())
    kind = type(exc).__name__
    if isinstance(exc, errors.OpError):
        kind = f"{kind} in node {exc.node_name!r}" if exc.node_name else kind
    return f"{kind}: {text}" if text else kind


# -- asyncflow run ----------------------------------------------------------------


def _run(args: argparse.Namespace) -> int:
    import asyncflow as af
    from asyncflow.framework.graph_def import allowed_reference_modules

    graph_def = _load_graph_def(args.graph)
    if not args.fetch and not args.target:
        raise _UsageError("nothing to run: give at least one --fetch NAME or --target OP")
    allowed = None if args.trust else frozenset(args.allow_module)
    _check_references(args.graph, graph_def, allowed)
    graph = af.Graph()
    _search_working_directory()
    token = allowed_reference_modules.set(allowed)  # the import itself checks again
    try:
        with graph.as_default():
            af.import_graph_def(graph_def, name="")
    except (TypeError, ValueError) as exc:
        raise _UsageError(
            f"cannot import graph file {args.graph!r}: {exc}{_module_hint(exc)}"
        ) from None
    finally:
        allowed_reference_modules.reset(token)
    _defined_in(graph, args.graph)
    feed_dict: dict[Any, Any] = {}
    for item in args.feed:
        name, value = _parse_feed(item)
        feed_dict[_tensor(graph, name, "--feed")] = value
    fetches = [_tensor(graph, name, "--fetch") for name in args.fetch]
    targets = [_operation(graph, name) for name in args.target]
    options = af.RunOptions(trace_level=af.RunOptions.FULL_TRACE) if args.trace else None
    metadata = af.RunMetadata() if args.trace else None
    level = af.OptimizerOptions.L1 if args.opt_level == 1 else af.OptimizerOptions.L0
    config = af.SessionConfig(
        graph_options=af.GraphOptions(optimizer_options=af.OptimizerOptions(opt_level=level))
    )
    bar = _ProgressBar() if args.progress else None
    if bar is not None:
        options = options or af.RunOptions()
        options.progress = bar.update
    with af.Session(graph=graph, config=config) as sess:
        try:
            results = sess.run_sync(
                [fetches, targets], feed_dict=feed_dict, options=options, run_metadata=metadata
            )[0]
        finally:
            if bar is not None:
                bar.close()
    for tensor, value in zip(fetches, results, strict=True):
        print(_format_fetch(tensor.name, value))
    if metadata is not None:
        _write_trace(metadata.step_stats, args.trace)
        print(f"Chrome trace written to {args.trace}")
    return 0


def _search_working_directory() -> None:
    """Let allowed references import modules from the working directory, as with
    ``python -m asyncflow`` (the console script's ``sys.path`` starts at its own
    directory instead).  Appended, so a file here never shadows an installed module."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


def _module_hint(exc: BaseException) -> str:
    """What to do when a reference's module is not found."""
    if "No module named" not in str(exc):
        return ""
    return (
        f" (modules are imported from the installed packages, PYTHONPATH and the "
        f"working directory {os.getcwd()!r}: run from the directory that holds the "
        f"module, or add its directory to PYTHONPATH)"
    )


def _defined_in(graph: Any, path: str) -> None:
    """Errors of a loaded graph say where its ops come from: the graph file (the frame
    that imported it is this command's, which tells the user nothing)."""
    for op in graph.get_operations():
        op._file, op._line = path, 0


#: Seconds a run goes on before ``--progress`` shows its bar (short runs show none).
PROGRESS_AFTER = 1.0


class _ProgressBar:
    """``--progress``: a rich progress bar on stderr, shown once a run passes
    :data:`PROGRESS_AFTER` seconds; fed by ``RunOptions(progress=...)`` events."""

    def __init__(self) -> None:
        try:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )
        except ImportError:
            raise _UsageError(
                "--progress needs the 'rich' library: pip install 'asyncflow[progress]'"
            ) from None
        # No refresh thread: each event (every 0.1 s, on the run's loop) refreshes.
        self._progress = Progress(
            TextColumn("nodes"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[longest]}"),
            console=Console(stderr=True),
            auto_refresh=False,
        )
        self._task: Any = None

    def update(self, event: Any) -> None:
        if self._task is None:
            if event.elapsed < PROGRESS_AFTER:
                return
            self._progress.start()
            self._task = self._progress.add_task("run", total=event.nodes_total, longest="")
        longest = event.longest
        text = f"running {longest[0]} for {longest[1]:.1f} s" if longest else ""
        self._progress.update(
            self._task, completed=event.nodes_done, longest=text, total=event.nodes_total
        )
        self._progress.refresh()

    def close(self) -> None:
        if self._task is not None:
            self._progress.stop()


def callable_references(graph_def: Any) -> dict[str, list[str]]:
    """Every ``py_func`` reference (``"module:qualname"``) in a graph def, with where it is.

    Walks the whole JSON value, so a reference anywhere the importer could decode one
    (node attributes, the function library, nested values) is found.  Maps each
    reference to the nodes (or ``"library"``) naming it.
    """
    found: dict[str, list[str]] = {}
    nodes = graph_def.get("node") if isinstance(graph_def, dict) else None
    roots: list[tuple[str, Any]] = []
    if isinstance(nodes, list):
        roots += [(str(n.get("name")) if isinstance(n, dict) else "?", n) for n in nodes]
    rest = (
        {k: v for k, v in graph_def.items() if k != "node"}
        if isinstance(graph_def, dict)
        else graph_def
    )
    roots.append(("library" if isinstance(graph_def, dict) else "?", rest))
    for where, root in roots:
        stack = [root]
        while stack:  # iterative: graph defs can be deep and large
            value = stack.pop()
            if isinstance(value, dict):
                ref = value.get("func")
                if isinstance(ref, str):
                    places = found.setdefault(ref, [])
                    if where not in places:
                        places.append(where)
                stack.extend(value.values())
            elif isinstance(value, list):
                stack.extend(value)
    return found


def _check_references(path: str, graph_def: Any, allowed: frozenset[str] | None) -> None:
    from asyncflow.framework.graph_def import reference_module_allowed

    refs = callable_references(graph_def)
    refused = {
        ref: where
        for ref, where in refs.items()
        if not reference_module_allowed(ref.partition(":")[0], allowed)
    }
    if not refused:
        return
    listed = ", ".join(
        f"{ref!r} (in {', '.join(repr(w) for w in where)})"
        for ref, where in sorted(refused.items())
    )
    modules = sorted({ref.partition(":")[0] for ref in refused})
    flags = " ".join(f"--allow-module {m}" for m in modules)
    raise _UsageError(
        f"graph file {path!r} names Python functions that loading it would "
        f"import and run: {listed}; refusing to import "
        f"{', '.join(repr(m) for m in modules)}. If you trust this file, "
        f"pass {flags} (or --trust)"
    )


def _graph(args: argparse.Namespace) -> int:
    from asyncflow import tracing

    graph_def = _load_graph_def(args.graph)
    render = tracing.to_dot if args.format == "dot" else tracing.to_mermaid
    try:
        print(render(graph_def))
    except (TypeError, ValueError) as exc:
        raise _UsageError(f"cannot draw graph file {args.graph!r}: {exc}") from None
    return 0


def _load_graph_def(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise _UsageError(f"cannot read graph file {path!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise _UsageError(f"graph file {path!r} is not UTF-8 text (expected JSON)") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise _UsageError(f"graph file {path!r} is not valid JSON: {exc}") from None


def _parse_feed(item: str) -> tuple[str, Any]:
    name, sep, text = item.partition("=")
    if not sep or not name:
        raise _UsageError(f"bad --feed {item!r}: expected NAME=VALUE, e.g. x:0=[1,2,3]")
    if text.endswith(".npy") or (text and os.path.isfile(text)):
        try:
            return name, np.load(text, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise _UsageError(f"bad --feed {item!r}: cannot load {text!r}: {exc}") from None
    try:
        return name, json.loads(text)
    except json.JSONDecodeError as exc:
        raise _UsageError(
            f"bad --feed {item!r}: VALUE is not JSON ({exc.msg}) nor a .npy file"
        ) from None


def _tensor(graph: Any, name: str, flag: str) -> Any:
    full = name if ":" in name else f"{name}:0"
    try:
        return graph.get_tensor_by_name(full)
    except (KeyError, ValueError) as exc:
        message = exc.args[0] if exc.args else str(exc)
        raise _UsageError(f"bad {flag} {name!r}: {message}") from None


def _operation(graph: Any, name: str) -> Any:
    try:
        return graph.get_operation_by_name(name)
    except (KeyError, ValueError) as exc:
        message = exc.args[0] if exc.args else str(exc)
        raise _UsageError(f"bad --target {name!r}: {message}") from None


def _format_fetch(name: str, value: Any) -> str:
    text = str(value)
    pad = " " * (len(name) + 3)
    return f"{name} = " + text.replace("\n", "\n" + pad)


# -- asyncflow demo -----------------------------------------------------------------

#: Simulated latency of one call to the (pretend) user service.
DEMO_LATENCY_S = 0.05

_DEMO_USERS = (7, 12, 31, 42)


async def fetch_user(user_id: np.ndarray) -> np.ndarray:
    """Pretend to call a remote user service: await its latency, return 3 features."""
    await asyncio.sleep(DEMO_LATENCY_S)
    rng = np.random.default_rng(int(user_id))
    features: np.ndarray = rng.random(3).astype(np.float32)
    return features


def score_batch(features: np.ndarray) -> np.ndarray:
    """A deliberately 'expensive' scoring step, run on a worker thread."""
    scores: np.ndarray = np.tanh(features @ features.T).sum(axis=1).astype(np.float32)
    return scores


def build_demo_graph() -> tuple[Any, dict[str, Any]]:
    """The demo graph and its named fetches.

    Four async ``fetch_user`` kernels run concurrently; a stack, a matmul and a
    softmax (inline numpy kernels) and a thread-pool ``score_batch`` follow.
    """
    import asyncflow as af

    graph = af.Graph()
    with graph.as_default():
        weights = af.constant(
            np.array([[0.5, -1.0], [1.5, 0.25], [-0.5, 2.0]], np.float32), name="weights"
        )
        rows = [
            af.py_func(
                fetch_user,
                [af.constant(np.int64(uid), name=f"id_{uid}")],
                af.float32,
                name=f"fetch_user_{uid}",
            )
            for uid in _DEMO_USERS
        ]
        features = af.stack(rows, name="features")
        logits = af.matmul(features, weights, name="logits")
        probs = af.nn.softmax(logits, name="probs")
        scores = af.py_func(score_batch, [features], af.float32, expensive=True, name="score_batch")
        best = af.argmax(scores, axis=0, name="best")
    return graph, {"probs": probs, "scores": scores, "best": best}


async def _run_demo() -> tuple[dict[str, Any], Any, float]:
    import asyncflow as af

    graph, fetches = build_demo_graph()
    metadata = af.RunMetadata()
    options = af.RunOptions(trace_level=af.RunOptions.FULL_TRACE)
    async with af.Session(graph=graph) as sess:
        start = time.perf_counter()
        results = await sess.run(fetches, options=options, run_metadata=metadata)
        wall = time.perf_counter() - start
    return results, metadata, wall


def _demo(args: argparse.Namespace) -> int:
    results, metadata, wall = asyncio.run(_run_demo())
    np.set_printoptions(precision=3, suppress=True)
    print(
        f"asyncflow demo: {len(_DEMO_USERS)} async user lookups "
        f"({DEMO_LATENCY_S * 1000:.0f} ms each) -> stack -> matmul -> softmax, "
        f"plus a thread-pool scoring kernel\n"
    )
    for name, value in results.items():
        print(_format_fetch(name, value))
    print()
    rows = _timing_rows(metadata.step_stats)
    print(_timing_table(rows))
    async_total = sum(r[4] for r in rows if r[2] == "async")
    print(
        f"\nstep wall time {wall * 1000:.1f} ms; async kernels' latencies sum to "
        f"{async_total:.1f} ms: they overlapped on the event loop."
    )
    if args.trace:
        _write_trace(metadata.step_stats, args.trace)
        print(f"Chrome trace written to {args.trace} (open it in https://ui.perfetto.dev)")
    return 0


def _timing_rows(step_stats: Any) -> list[tuple[str, str, str, float, float]]:
    """(node, op type, kind, start ms from the first node, duration ms), by start time."""
    stats = [ns for dev in step_stats.dev_stats for ns in dev.node_stats]
    if not stats:
        return []
    t0 = min(ns.all_start_micros for ns in stats)
    rows = [
        (
            ns.node_name,
            ns.op_type,
            ns.kind,
            (ns.all_start_micros - t0) / 1000.0,
            ns.op_end_rel_micros / 1000.0,
        )
        for ns in stats
    ]
    rows.sort(key=lambda r: (r[3], r[0]))
    return rows


def _timing_table(rows: list[tuple[str, str, str, float, float]]) -> str:
    header = ("node", "op", "kind", "start ms", "dur ms")
    name_w = max([len(header[0]), *(len(r[0]) for r in rows)])
    op_w = max([len(header[1]), *(len(r[1]) for r in rows)])
    lines = [
        f"{header[0]:<{name_w}}  {header[1]:<{op_w}}  {header[2]:<6}  "
        f"{header[3]:>8}  {header[4]:>8}"
    ]
    lines.append("-" * len(lines[0]))
    for name, op, kind, start, dur in rows:
        lines.append(f"{name:<{name_w}}  {op:<{op_w}}  {kind:<6}  {start:>8.2f}  {dur:>8.2f}")
    return "\n".join(lines)


def _write_trace(step_stats: Any, path: str) -> None:
    from asyncflow.tracing import Timeline

    trace = Timeline(step_stats).generate_chrome_trace_format()
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(trace)
    except OSError as exc:
        raise _UsageError(f"cannot write trace file {path!r}: {exc.strerror or exc}") from None
