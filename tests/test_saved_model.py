"""TF1 SavedModels (``af.compat.load_saved_model``) and TF's tensor-bundle checkpoints.

The SavedModels in ``tests/fixtures/tf/saved_models`` were written by TensorFlow with
``tf.compat.v1.saved_model.Builder`` (``make_saved_models.py``), together with TF's
outputs for fixed inputs; these tests never import TensorFlow.
"""

from __future__ import annotations

import asyncio
import pathlib
import shutil
from typing import Any

import numpy as np
import pytest

import asyncflow as af
from asyncflow.compat import load_saved_model
from asyncflow.compat.tensor_bundle import BundleReader, _crc32c_python, crc32c, read_table
from asyncflow.runtime.devices import blas_governor

MODELS = pathlib.Path(__file__).parent / "fixtures" / "tf" / "saved_models"
NAMES = ["conv", "transformer"]


def _reference(name: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    data = np.load(MODELS / f"{name}.npz")
    feeds = {k.removeprefix("input/"): data[k] for k in data.files if k.startswith("input/")}
    outs = {k.removeprefix("output/"): data[k] for k in data.files if k.startswith("output/")}
    return feeds, outs


def _check(got: dict[str, Any], expected: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(expected)
    for key, value in expected.items():
        assert got[key].dtype == value.dtype, key
        assert got[key].shape == value.shape, key
        np.testing.assert_allclose(got[key], value, rtol=1e-4, atol=1e-5, err_msg=key)


@pytest.mark.parametrize("name", NAMES)
def test_serves_tf_numbers_sync(name: str) -> None:
    feeds, expected = _reference(name)
    model = load_saved_model(MODELS / name)
    try:
        assert model.tags == ("serve",)
        assert list(model.signatures) == ["serving_default"]
        _check(model.signatures["serving_default"].run_sync(**feeds), expected)
    finally:
        model.session.close_sync()


@pytest.mark.parametrize("name", NAMES)
async def test_serves_tf_numbers_async_and_concurrently(name: str) -> None:
    feeds, expected = _reference(name)
    g = af.Graph()
    async with af.Session(graph=g) as sess:
        model = load_saved_model(MODELS / name, tags=["serve"], session=sess)
        sig = model.signatures["serving_default"]
        outs = await asyncio.gather(*[sig(**feeds) for _ in range(20)])
        for out in outs:
            _check(out, expected)


def test_variables_are_restored_into_the_session_without_the_saver_graph() -> None:
    g = af.Graph()
    with af.Session(graph=g) as sess:
        model = load_saved_model(MODELS / "conv", session=sess)
        # TF's names: the variable's value is fetchable as in TF (ref variable node).
        w1 = sess.run_sync("conv/w1:0")
        reader = BundleReader(MODELS / "conv" / "variables" / "variables")
        np.testing.assert_array_equal(w1, reader.read("conv/w1"))
        assert sorted(model.variables) == reader.keys()
        types = {op.type for op in g.get_operations()}
        assert not types & {"SaveV2", "RestoreV2", "Assign", "MergeV2Checkpoints"}


def test_resource_variables_are_named_by_their_handle() -> None:
    model = load_saved_model(MODELS / "transformer")
    try:
        reader = BundleReader(MODELS / "transformer" / "variables" / "variables")
        assert sorted(model.variables) == reader.keys()
        np.testing.assert_array_equal(model.session.run_sync("block/q:0"), reader.read("block/q"))
    finally:
        model.session.close_sync()


def test_unknown_tags_list_the_available_tag_sets() -> None:
    with pytest.raises(af.errors.NotFoundError, match=r"tags \['train'\].*\[\['serve'\]\]"):
        load_saved_model(MODELS / "conv", tags=("train",))


def test_missing_signature_names_the_available_ones() -> None:
    model = load_saved_model(MODELS / "conv")
    try:
        with pytest.raises(KeyError, match=r"no signature 'predict'.*\['serving_default'\]"):
            model.signatures["predict"]
        with pytest.raises(TypeError, match=r"takes inputs \['images'\].*unknown \['x'\]"):
            model.signatures["serving_default"].run_sync(x=np.zeros((1, 32, 32, 3)))
    finally:
        model.session.close_sync()


def test_no_saved_model_is_not_found(tmp_path: pathlib.Path) -> None:
    with pytest.raises(af.errors.NotFoundError, match="no SavedModel"):
        load_saved_model(tmp_path)


# -- corrupt files ----------------------------------------------------------------------------


@pytest.fixture
def conv_copy(tmp_path: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(shutil.copytree(MODELS / "conv", tmp_path / "conv"))


def _flip(path: pathlib.Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def _truncate(path: pathlib.Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


INDEX = "variables/variables.index"
DATA = "variables/variables.data-00000-of-00001"


@pytest.mark.parametrize(
    ("file", "damage", "message"),
    [
        (INDEX, lambda p: _flip(p, 3), "block checksum mismatch"),
        (INDEX, lambda p: _flip(p, p.stat().st_size - 2), "bad magic number"),
        (INDEX, lambda p: _truncate(p, p.stat().st_size - 10), "bad magic number"),
        (INDEX, lambda p: _truncate(p, 20), "too short to be a table"),
        (DATA, lambda p: _flip(p, 100), "checksum of tensor .* does not match"),
        (DATA, lambda p: _truncate(p, p.stat().st_size // 2), "truncated"),
        (DATA, lambda p: p.unlink(), "missing"),
        ("saved_model.pb", lambda p: _truncate(p, p.stat().st_size // 3), "cannot parse"),
    ],
)
def test_corrupt_files_are_data_loss_naming_the_file(
    conv_copy: pathlib.Path, file: str, damage: Any, message: str
) -> None:
    damage(conv_copy / file)
    g = af.Graph()
    with af.Session(graph=g) as sess:
        with pytest.raises(af.errors.DataLossError, match=message) as info:
            load_saved_model(conv_copy, session=sess)
        assert str(conv_copy / file) in str(info.value)
        # Nothing was assigned: the session still works and has no half-restored state.
        with g.as_default():
            six = af.constant(2.0) * 3.0
        assert sess.run_sync(six) == 6.0
        assert not any(op.type == "VariableV2" for op in g.get_operations())


def test_a_missing_variable_is_not_found(conv_copy: pathlib.Path, tmp_path: pathlib.Path) -> None:
    # Swap in the transformer's checkpoint: none of the conv variables is there.
    shutil.rmtree(conv_copy / "variables")
    shutil.copytree(MODELS / "transformer" / "variables", conv_copy / "variables")
    open_devices = blas_governor().users
    with pytest.raises(af.errors.NotFoundError, match="tensor 'conv/b1' not found"):
        load_saved_model(conv_copy)
    assert blas_governor().users == open_devices  # the session it made is closed


# -- the table format -------------------------------------------------------------------------


def test_crc32c_matches_the_standard_check_value() -> None:
    assert crc32c(b"123456789") == 0xE3069283
    assert _crc32c_python(b"123456789") == 0xE3069283
    data = np.random.default_rng(0).bytes(1000)
    assert _crc32c_python(data) == crc32c(data)


def test_index_keys_are_decoded_from_shared_prefixes() -> None:
    entries = read_table(MODELS / "transformer" / "variables" / "variables.index")
    keys = [k for k, _ in entries]
    assert keys[0] == b""  # the bundle header
    assert keys[1:] == sorted(keys[1:])
    assert len(keys) == 17
    assert all(k.startswith(b"block/") for k in keys[1:])
    reader = BundleReader(MODELS / "transformer" / "variables" / "variables")
    assert reader.dtype_and_shape("block/fc1") == (af.float32, (64, 256))
    assert reader.read("block/fc1").shape == (64, 256)


def test_a_signature_may_return_a_variable_and_take_an_unused_input(
    conv_copy: pathlib.Path,
) -> None:
    # A second signature added to TF's saved_model.pb: outputs a variable's value and
    # takes an input its output does not depend on (both must still be served).
    from asyncflow.compat._tf_proto import messages

    pb = conv_copy / "saved_model.pb"
    saved = messages().SavedModel.FromString(pb.read_bytes())
    meta = saved.meta_graphs[0]
    sig = meta.signature_def["weights"]
    sig.inputs["images"].CopyFrom(meta.signature_def["serving_default"].inputs["images"])
    sig.outputs["w1"].name = "conv/w1:0"
    sig.outputs["w1"].dtype = 1
    pb.write_bytes(saved.SerializeToString())
    model = load_saved_model(conv_copy)
    try:
        out = model.signatures["weights"].run_sync(images=np.zeros((1, 32, 32, 3), np.float32))
        reader = BundleReader(conv_copy / "variables" / "variables")
        np.testing.assert_array_equal(out["w1"], reader.read("conv/w1"))
    finally:
        model.session.close_sync()


def test_a_text_saved_model_loads_too(conv_copy: pathlib.Path) -> None:
    from asyncflow.compat._tf_proto import messages

    m = messages()
    pb = conv_copy / "saved_model.pb"
    saved = m.SavedModel.FromString(pb.read_bytes())
    (conv_copy / "saved_model.pbtxt").write_text(m.text_format.MessageToString(saved))
    pb.unlink()
    feeds, expected = _reference("conv")
    model = load_saved_model(conv_copy)
    try:
        _check(model.signatures["serving_default"].run_sync(**feeds), expected)
    finally:
        model.session.close_sync()
