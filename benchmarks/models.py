"""Real models: ``python -m benchmarks models [--quick] [--manifest FILE ...] [--json FILE]``.

Each model runs at batch 1 (latency) and batch 8 (throughput: the time of one batch)
in asyncflow (default ``SessionConfig``) and in TensorFlow 1.x graph mode twice: its
default config (Grappler on) and with every graph optimizer off.  TensorFlow runs in
a child process of its own that stays alive for the whole run; the parent alternates
blocks of calls (asyncflow, TF default, TF without Grappler) round by round, so all
three see the same machine load.  Every call is timed; the table gives the minimum,
the median and the spread (90th / 10th percentile of the call times) of each.

Models come from two places:

* TF1 SavedModels: every directory with a ``saved_model.pb`` under
  ``tests/fixtures/tf/saved_models`` (``--saved-models DIR``), with ``<name>.npz``
  beside it holding inputs (``input/<key>``) and TF's outputs (``output/<key>``); the
  ``serving_default`` signature is served (``af.compat.load_saved_model`` /
  ``tf.compat.v1.saved_model.loader.load``).
* Frozen graphs listed by a manifest (``tests/fixtures/tf/zoo/manifest.json`` when it
  exists, or ``--manifest FILE``, repeatable): ``{"models": {name: {"graph": "x.pb",
  "inputs": [{"name": "input:0", ...}], "outputs": ["Identity:0"], "values": "x.npz"}}}``
  with ``feed/<tensor>`` and ``fetch/<tensor>`` arrays in the ``.npz``.

A batch is the recorded inputs' rows repeated to the batch size; inputs whose first
dimension is not the batch (a fixed shape, string image bytes) run at batch 1 only.
Before timing, asyncflow's outputs on the recorded inputs are checked against TF's.

Targets (batch-1 min ratio asyncflow / TF default): conv models (a ``Conv2D``,
``DepthwiseConv2dNative`` or ``Conv2DBackpropInput`` in the graph) <= 1.2x, the others
(text, transformer, RNN) <= 1.0x; batch 8 <= 1.5x; asyncflow's spread <= 1.5x.
The BLAS library is not pinned to one thread for this command (see
``benchmarks/__init__.py``): threads are part of what is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.process import importable
from benchmarks.tf_anchor import tf_config, tf_v1

REPO_ROOT = Path(__file__).resolve().parent.parent
SAVED_MODELS = REPO_ROOT / "tests" / "fixtures" / "tf" / "saved_models"
ZOO_MANIFEST = REPO_ROOT / "tests" / "fixtures" / "tf" / "zoo" / "manifest.json"
BATCHES = (1, 8)
CONFIGS = ("default", "no_grappler")
_CONV_TYPES = {"Conv2D", "DepthwiseConv2dNative", "Conv2DBackpropInput"}
TARGETS = {("conv", 1): 1.2, ("text", 1): 1.0, ("conv", 8): 1.5, ("text", 8): 1.5}
SPREAD_TARGET = 1.5


@dataclass
class ModelSpec:
    """A model to measure: where it is and what to feed and fetch."""

    name: str
    kind: str  # "saved_model" | "frozen"
    path: str
    inputs: list[str]  # signature keys (saved model) or tensor names
    outputs: list[str]
    values: str | None  # the .npz of recorded inputs and TF outputs
    family: str = "text"  # "conv" | "text"
    rtol: float = 1e-4
    atol: float = 1e-5
    strings: list[str] = field(default_factory=list)  # string inputs, stored as uint8 bytes


# -- discovery --------------------------------------------------------------------------


def _op_types_of_saved_model(path: Path) -> set[str]:
    from asyncflow.compat._tf_proto import messages

    saved = messages().SavedModel.FromString((path / "saved_model.pb").read_bytes())
    return {n.op for meta in saved.meta_graphs for n in meta.graph_def.node}


def _family(op_types: set[str]) -> str:
    return "conv" if op_types & _CONV_TYPES else "text"


def saved_models(root: Path) -> list[ModelSpec]:
    """The SavedModels under ``root`` with their recorded values."""
    out = []
    for pb in sorted(root.glob("*/saved_model.pb")):
        d = pb.parent
        npz = d.parent / f"{d.name}.npz"
        data = np.load(npz) if npz.exists() else None
        keys = data.files if data is not None else []
        out.append(
            ModelSpec(
                d.name,
                "saved_model",
                str(d),
                [k.removeprefix("input/") for k in keys if k.startswith("input/")],
                [k.removeprefix("output/") for k in keys if k.startswith("output/")],
                str(npz) if data is not None else None,
                _family(_op_types_of_saved_model(d)),
            )
        )
    return out


def manifest_models(manifest: Path) -> list[ModelSpec]:
    """The frozen graphs a zoo manifest lists."""
    spec = json.loads(manifest.read_text())
    out = []
    for name, m in sorted(spec.get("models", {}).items()):
        values = m.get("values")
        out.append(
            ModelSpec(
                name,
                "frozen",
                str(manifest.parent / m["graph"]),
                [i["name"] for i in m["inputs"]],
                list(m["outputs"]),
                str(manifest.parent / values) if values else None,
                _family(set(m.get("op_types", ()))),
                float(m.get("rtol", 1e-4)),
                float(m.get("atol", 1e-5)),
                [i["name"] for i in m["inputs"] if i.get("dtype") == "string"],
            )
        )
    return out


# -- inputs -----------------------------------------------------------------------------


def recorded(spec: ModelSpec) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The recorded feeds and TF's fetched values, keyed by input / output name."""
    if spec.values is None:
        return {}, {}
    data = np.load(spec.values, allow_pickle=False)
    feed, fetch = ("input/", "output/") if spec.kind == "saved_model" else ("feed/", "fetch/")
    feeds = {k: data[feed + k] for k in spec.inputs if feed + k in data.files}
    for k in spec.strings:  # (a zoo manifest stores a string feed as its bytes)
        if k in feeds:
            feeds[k] = np.array(feeds[k].tobytes(), dtype=object)
    return (feeds, {k: data[fetch + k] for k in spec.outputs if fetch + k in data.files})


def batched(feeds: dict[str, np.ndarray], batch: int) -> dict[str, np.ndarray] | None:
    """The feeds with ``batch`` rows (recorded rows repeated); None if not batchable."""
    if batch == 1 and all(v.ndim == 0 or v.dtype.kind in "SOU" for v in feeds.values()):
        return feeds
    if any(v.ndim == 0 or v.dtype.kind in "SOU" for v in feeds.values()):
        return None
    return {
        k: np.ascontiguousarray(np.take(v, np.arange(batch) % v.shape[0], axis=0))
        for k, v in feeds.items()
    }


# -- asyncflow's side -------------------------------------------------------------------


class AfModel:
    """A model loaded in asyncflow: ``call(feeds)`` runs one step from plain code."""

    def __init__(self, spec: ModelSpec) -> None:
        import asyncflow as af

        self.spec = spec
        if spec.kind == "saved_model":
            self._model = af.compat.load_saved_model(spec.path)
            self.session = self._model.session
            sig = self._model.signatures["serving_default"]
            self._call: Callable[[dict[str, Any]], Any] = lambda feeds: sig.run_sync(**feeds)
            return
        graph = af.Graph()
        with graph.as_default():
            found = af.compat.import_tf_graph_def(
                spec.path, name="", return_elements=spec.inputs + spec.outputs
            )
        assert found is not None
        ins, outs = found[: len(spec.inputs)], found[len(spec.inputs) :]
        self.session = af.Session(graph=graph)
        fn = self.session.make_callable(dict(zip(spec.outputs, outs)), feed_list=ins)
        self._call = lambda feeds: fn.run_sync(*[feeds[k] for k in spec.inputs])

    def call(self, feeds: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = self._call(feeds)
        return out

    def close(self) -> None:
        self.session.close_sync()


def mismatch(got: dict[str, Any], expected: dict[str, np.ndarray], spec: ModelSpec) -> str:
    """'' when every output matches TF's within the model's tolerance, else what differs."""
    bad = []
    for key, want in expected.items():
        value = np.asarray(got[key])
        if value.shape != want.shape or not np.allclose(
            value, want, rtol=spec.rtol, atol=spec.atol
        ):
            err = (
                float(np.max(np.abs(value.astype(np.float64) - want)))
                if value.shape == want.shape
                else float("nan")
            )
            bad.append(f"{key}: max abs err {err:.3g}")
    return "; ".join(bad)


# -- TensorFlow's side: a child process answering one JSON request per line ----------------


class TfModel:
    """A model in a TF 1.x session with the given config (in the TF child)."""

    def __init__(self, spec: ModelSpec, config: str) -> None:
        tf1 = tf_v1()
        conf = tf_config(tf1) if config == "no_grappler" else tf1.ConfigProto()
        graph = tf1.Graph()
        self.session = tf1.Session(graph=graph, config=conf)
        with graph.as_default():
            if spec.kind == "saved_model":
                meta = tf1.saved_model.loader.load(self.session, ["serve"], spec.path)
                sig = meta.signature_def["serving_default"]
                ins = [graph.get_tensor_by_name(sig.inputs[k].name) for k in spec.inputs]
                outs = [graph.get_tensor_by_name(sig.outputs[k].name) for k in spec.outputs]
            else:
                graph_def = tf1.GraphDef.FromString(Path(spec.path).read_bytes())
                tf1.import_graph_def(graph_def, name="")
                ins = [graph.get_tensor_by_name(n) for n in spec.inputs]
                outs = [graph.get_tensor_by_name(n) for n in spec.outputs]
        self._fn = self.session.make_callable(outs, feed_list=ins)
        self._inputs = spec.inputs

    def call(self, feeds: dict[str, Any]) -> Any:
        return self._fn(*[feeds[k] for k in self._inputs])


def _timed_calls(
    call: Callable[[dict[str, Any]], Any], feeds: dict[str, Any], n: int
) -> list[float]:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        call(feeds)
        times.append(time.perf_counter() - t)
    return times


def tf_child() -> int:
    """Serve ``load`` / ``time`` requests on stdin, one JSON object per line."""
    models: dict[tuple[str, str], TfModel] = {}
    specs: dict[str, ModelSpec] = {}
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["cmd"] == "load":
                spec = ModelSpec(**req["spec"])
                specs[spec.name] = spec
                for config in CONFIGS:
                    models[spec.name, config] = TfModel(spec, config)
                reply: dict[str, Any] = {"ok": True}
            elif req["cmd"] == "time":
                spec = specs[req["model"]]
                feeds = batched(recorded(spec)[0], req["batch"])
                assert feeds is not None
                model = models[spec.name, req["config"]]
                reply = {"times": _timed_calls(model.call, feeds, req["calls"])}
            else:
                return 0
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        print(json.dumps(reply), flush=True)
    return 0


class TfChild:
    """The parent's handle on the TF child (started once, asked round by round)."""

    def __init__(self, tf_python: str) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        self._proc = subprocess.Popen(
            [tf_python, "-m", "benchmarks.models", "--tf-child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=REPO_ROOT,
        )

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self._proc.stdin is not None
        assert self._proc.stdout is not None
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            return {"error": f"TF child exited ({self._proc.poll()})"}
        reply: dict[str, Any] = json.loads(line)
        return reply

    def close(self) -> None:
        try:
            self.ask({"cmd": "quit"})
        finally:
            self._proc.wait(timeout=60)


# -- the measurement --------------------------------------------------------------------


@dataclass
class Row:
    """One model at one batch size: every call's time per engine."""

    model: str
    family: str
    batch: int
    times: dict[str, list[float]] = field(default_factory=dict)  # engine -> seconds
    error: str = ""
    check: str = ""

    def stat(self, engine: str, what: str) -> float | None:
        t = sorted(self.times.get(engine, ()))
        if not t:
            return None
        if what == "min":
            return t[0]
        if what == "median":
            return statistics.median(t)
        return t[int(0.9 * (len(t) - 1))] / t[int(0.1 * (len(t) - 1))]  # spread

    def ratio(self, what: str = "min") -> float | None:
        ours, tf = self.stat("asyncflow", what), self.stat("default", what)
        return ours / tf if ours and tf else None

    def status(self) -> str:
        if self.error:
            return "error"
        target = TARGETS[self.family, min(self.batch, 8)]
        ratio, spread = self.ratio(), self.stat("asyncflow", "spread")
        if ratio is None:
            return "no TF"
        ok = ratio <= target and (spread or 0) <= SPREAD_TARGET
        return "met" if ok else "MISSED"


def measure(
    specs: list[ModelSpec],
    rounds: int,
    block_seconds: float,
    tf: TfChild | None,
    progress: Callable[[str], None],
) -> list[Row]:
    """Load every model, check it, then time it in interleaved rounds."""
    rows: list[Row] = []
    for spec in specs:
        progress(f"{spec.name} ...")
        rows.extend(_measure_model(spec, rounds, block_seconds, tf))
    return rows


def _measure_model(
    spec: ModelSpec, rounds: int, block_seconds: float, tf: TfChild | None
) -> list[Row]:
    feeds, expected = recorded(spec)
    plans = [(b, f) for b in BATCHES if (f := batched(feeds, b)) is not None]
    rows = [Row(spec.name, spec.family, b) for b, _ in plans]
    try:
        model = AfModel(spec)
    except Exception as exc:
        for row in rows:
            row.error = f"{type(exc).__name__}: {exc}"[:300]
        return rows
    try:
        check = mismatch(model.call(feeds), expected, spec) if expected else "no reference"
        tf_ok = tf is not None and "error" not in (
            reply := tf.ask({"cmd": "load", "spec": asdict(spec)})
        )
        for row, (batch, f) in zip(rows, plans):
            row.check = check or "ok"
            if tf is not None and not tf_ok:
                row.check += f"; TF: {reply.get('error')}"
            warm = _timed_calls(model.call, f, 3)
            calls = max(3, min(50, int(block_seconds / max(min(warm), 1e-6))))
            for _ in range(rounds):
                row.times.setdefault("asyncflow", []).extend(_timed_calls(model.call, f, calls))
                if tf is None or not tf_ok:
                    continue
                for config in CONFIGS:
                    reply = tf.ask(
                        {
                            "cmd": "time",
                            "model": spec.name,
                            "config": config,
                            "batch": batch,
                            "calls": calls,
                        }
                    )
                    row.times.setdefault(config, []).extend(reply.get("times", []))
    except Exception as exc:
        for row in rows:
            row.error = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        model.close()
    return rows


# -- the table --------------------------------------------------------------------------


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.2f}"


def _x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def render(rows: list[Row]) -> str:
    """The results table (times in ms per call)."""
    head = [
        "model",
        "fam",
        "batch",
        "af min",
        "af med",
        "af sprd",
        "TF min",
        "TF med",
        "TF sprd",
        "noG min",
        "noG med",
        "af/TF min",
        "af/TF med",
        "target",
        "status",
    ]
    lines = [head]
    for r in rows:
        target = f"<={TARGETS[r.family, r.batch]:.1f}x"
        lines.append(
            [
                r.model,
                r.family,
                str(r.batch),
                _ms(r.stat("asyncflow", "min")),
                _ms(r.stat("asyncflow", "median")),
                _x(r.stat("asyncflow", "spread")),
                _ms(r.stat("default", "min")),
                _ms(r.stat("default", "median")),
                _x(r.stat("default", "spread")),
                _ms(r.stat("no_grappler", "min")),
                _ms(r.stat("no_grappler", "median")),
                _x(r.ratio("min")),
                _x(r.ratio("median")),
                target,
                r.status(),
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines]
    out.insert(1, "-" * len(out[0]))
    notes = [
        f"{r.model} b{r.batch}: {r.error or r.check}" for r in rows if r.error or r.check != "ok"
    ]
    return "\n".join(out + (["", "notes:", *notes] if notes else []))


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks models",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="two short rounds: a smoke run")
    p.add_argument(
        "--manifest",
        action="append",
        default=[],
        type=Path,
        help=f"a zoo manifest (repeatable; default {ZOO_MANIFEST} if it exists)",
    )
    p.add_argument(
        "--saved-models",
        type=Path,
        default=SAVED_MODELS,
        help="directory of SavedModels (default: the test fixtures)",
    )
    p.add_argument("--only", action="append", default=[], help="model name (repeatable)")
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 7, quick 2)")
    p.add_argument("--no-external", action="store_true", help="asyncflow only, no TF")
    p.add_argument(
        "--tf-python",
        default=sys.executable,
        help="the Python that has TensorFlow (default: this one)",
    )
    p.add_argument("--json", type=Path, help="also write every call's time as JSON")
    p.add_argument("--tf-child", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.tf_child:
        return tf_child()
    manifests = args.manifest or ([ZOO_MANIFEST] if ZOO_MANIFEST.exists() else [])
    specs = saved_models(args.saved_models) + [s for m in manifests for s in manifest_models(m)]
    if args.only:
        specs = [s for s in specs if s.name in args.only]
    rounds = args.rounds or (2 if args.quick else 7)
    tf = None
    if not args.no_external and (args.tf_python != sys.executable or importable("tensorflow")):
        tf = TfChild(args.tf_python)

    def progress(msg: str) -> None:
        print(f"[benchmarks models] {msg}", file=sys.stderr, flush=True)

    load = os.getloadavg()[0]
    started = time.perf_counter()
    try:
        rows = measure(specs, rounds, 0.05 if args.quick else 0.25, tf, progress)
    finally:
        if tf is not None:
            tf.close()
    print(
        f"asyncflow real-model benchmark ({'quick: not a measurement' if args.quick else 'full'}"
        f"): {len(specs)} models, {rounds} interleaved rounds, {os.cpu_count()} CPUs, "
        f"1-min load average at start {load:.2f}, {time.perf_counter() - started:.0f} s"
    )
    print(blas_line())
    print(
        "times in ms per call; TF = TF 1.x default config (Grappler on), noG = every graph "
        "optimizer off; spread = p90 / p10 of the call times"
        + ("" if tf is not None else "; TF not measured")
    )
    print()
    print(render(rows))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    return 1 if any(r.error for r in rows) else 0


def blas_line() -> str:
    """numpy's BLAS and the kernels it runs (the per-core GEMM speed behind every conv
    figure), and whether oneDNN runs the large convolutions.  OpenBLAS runs the kernels ``OPENBLAS_CORETYPE`` names, else those it detects;
    on a Zen 5 EPYC (AVX-512) Haswell's AVX2 GEMM ran at 26-59 GMAC/s on one core,
    SkylakeX's at 83-118, TF's own at 77-124."""
    from threadpoolctl import threadpool_info  # type: ignore[import-untyped]

    libs = [
        f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture', '?')} kernels)"
        for i in threadpool_info()
        if i.get("user_api") == "blas"
    ]
    chosen = os.environ.get("OPENBLAS_CORETYPE")
    from asyncflow.ops import onednn

    version = onednn.version()
    dnn = (
        f"on (oneDNN {'.'.join(map(str, version))})"
        if onednn.available() and version is not None
        else "off (pip install 'asyncflow[onednn]')"
    )
    return (
        f"numpy BLAS: {', '.join(libs) or 'none found'}; "
        f"OPENBLAS_CORETYPE={chosen or 'unset'}; oneDNN convolutions: {dnn}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
