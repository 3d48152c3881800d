"""The model zoo: frozen graphs TensorFlow itself exported (``fixtures/tf/make_zoo.py``).

Keras applications, a v1 ResNet, a Transformer encoder, a GPT-2-style decoder, a
``dynamic_rnn`` LSTM, ``map_fn``, TensorArray loops, image preprocessing, a conv
autoencoder and an int64 text classifier: each imports, matches TF's outputs, survives
the JSON graph def and the TF export round trips, and gives the same values under 20
concurrent runs of one session.  TensorFlow is never imported here.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
from typing import Any

import numpy as np
import pytest

import asyncflow as af
from asyncflow.compat import export_tf_graph_def, import_tf_graph_def, supported_tf_op_types
from asyncflow.compat.tf_import import _nodes, _parse

ZOO = pathlib.Path(__file__).parent / "fixtures" / "tf" / "zoo"
MANIFEST: dict[str, Any] = json.loads((ZOO / "manifest.json").read_text())
MODELS = sorted(MANIFEST["models"])
RTOL, ATOL = 1e-4, 1e-5


def _spec(name: str) -> dict[str, Any]:
    spec: dict[str, Any] = MANIFEST["models"][name]
    return spec


def _feeds(name: str) -> dict[str, Any]:
    spec, data = _spec(name), np.load(ZOO / _spec(name)["values"])
    feeds: dict[str, Any] = {}
    for inp in spec["inputs"]:
        value = data[f"feed/{inp['name']}"]
        feeds[inp["name"]] = value.tobytes() if inp["dtype"] == "string" else value
    return feeds


def _expected(name: str) -> list[np.ndarray]:
    data = np.load(ZOO / _spec(name)["values"])
    return [data[f"fetch/{out}"] for out in _spec(name)["outputs"]]


def _imported(name: str) -> af.Graph:
    g = af.Graph()
    with g.as_default():
        import_tf_graph_def(ZOO / _spec(name)["graph"], name="")
    return g


def _compare(name: str, values: list[Any], expected: list[np.ndarray]) -> None:
    spec = _spec(name)
    rtol, atol = spec.get("rtol", RTOL), spec.get("atol", ATOL)
    for out, value, want in zip(spec["outputs"], values, expected):
        got = np.asarray(value)
        assert got.dtype == want.dtype, (name, out)
        assert got.shape == want.shape, (name, out)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"{name} {out}")


async def _run(g: af.Graph, name: str, config: af.SessionConfig | None = None) -> list[Any]:
    async with af.Session(graph=g, config=config) as sess:
        out: list[Any] = await sess.run(_spec(name)["outputs"], feed_dict=_feeds(name))
    return out


@pytest.mark.parametrize("name", MODELS)
async def test_zoo_model_imports_and_matches_tf(name: str) -> None:
    g = _imported(name)
    _compare(name, await _run(g, name), _expected(name))


@pytest.mark.parametrize("name", MODELS)
async def test_zoo_model_survives_the_json_graph_def(name: str) -> None:
    g = _imported(name)
    g2 = af.Graph()
    with g2.as_default():
        af.import_graph_def(json.loads(json.dumps(g.as_graph_def())))
    _compare(name, await _run(g2, name), _expected(name))


@pytest.mark.parametrize("name", MODELS)
async def test_zoo_model_survives_the_tf_export(name: str) -> None:
    data = export_tf_graph_def(_imported(name))
    g2 = af.Graph()
    with g2.as_default():
        import_tf_graph_def(data, name="")
    _compare(name, await _run(g2, name), _expected(name))


@pytest.mark.parametrize("name", MODELS)
async def test_zoo_model_20_concurrent_runs_agree(name: str) -> None:
    g = _imported(name)
    spec, feeds = _spec(name), _feeds(name)
    async with af.Session(graph=g) as sess:
        runs = await asyncio.gather(
            *(sess.run(spec["outputs"], feed_dict=feeds) for _ in range(20))
        )
    for values in runs:
        for a, b in zip(values, runs[0]):
            np.testing.assert_array_equal(a, b)
    _compare(name, runs[0], _expected(name))


def test_every_zoo_op_type_is_supported_and_listed() -> None:
    supported = set(supported_tf_op_types())
    seen: set[str] = set()
    for name in MODELS:
        types = {n.op for n in _nodes(_parse(ZOO / _spec(name)["graph"]))}
        assert types == set(_spec(name)["op_types"]), name
        assert types <= supported, (name, sorted(types - supported))
        seen |= types
    assert sorted(seen) == MANIFEST["op_types"]


def test_op_types_of_applications_too_large_to_commit_are_supported() -> None:
    supported = set(supported_tf_op_types())
    skipped = MANIFEST["skipped_op_types"]
    assert set(skipped) <= set(MANIFEST["skipped"])
    assert len(skipped) >= 10
    for name, types in skipped.items():
        assert set(types) <= supported, (name, sorted(set(types) - supported))


def test_zoo_covers_what_deployed_models_need() -> None:
    needed = {
        "IdentityN",
        "Erfc",
        "MatrixBandPart",
        "TensorArrayV3",
        "TensorArrayReadV3",
        "TensorArrayWriteV3",
        "TensorArrayGatherV3",
        "TensorArrayScatterV3",
        "TensorArrayConcatV3",
        "TensorArraySplitV3",
        "TensorArraySizeV3",
        "TensorArrayCloseV3",
        "ResizeBilinear",
        "ResizeNearestNeighbor",
        "DecodePng",
        "DecodeJpeg",
        "FusedBatchNormV3",
        "Conv2DBackpropInput",
        "Enter",
    }
    assert needed <= set(MANIFEST["op_types"])


def test_zoo_fixtures_are_small() -> None:
    sizes = {p.name: p.stat().st_size for p in ZOO.iterdir()}
    assert max(sizes.values()) <= 4 << 20
    assert sum(sizes.values()) < 25 << 20


def test_manifest_is_readable_for_benchmarks() -> None:
    for name in MODELS:
        spec = _spec(name)
        assert (ZOO / spec["graph"]).exists()
        assert (ZOO / spec["values"]).exists()
        for inp in spec["inputs"]:
            assert set(inp) == {"name", "dtype", "shape"}
        assert spec["outputs"]
        if "atol" in spec or "rtol" in spec:
            assert spec["reason"], name


LOOP_MODELS = sorted(n for n in MODELS if "Enter" in _spec(n)["op_types"])


@pytest.mark.parametrize("name", LOOP_MODELS)
async def test_zoo_loops_match_tf_on_the_general_frame_path(name: str) -> None:
    # TensorArray loops with the straight-line programs off: the general propagator
    # must order reads and writes by the flow just the same.
    config = af.SessionConfig(executor_options=af.ExecutorOptions(straight_line=False))
    _compare(name, await _run(_imported(name), name, config), _expected(name))
