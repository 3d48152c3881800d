"""Decoding through C decoders with TF's pixels, Pillow as the fallback.

PNG: an 8-bit RGB or RGBA image decodes through ``pyspng`` (libspng), the others
(gray, palette, 16-bit, gray output) through Pillow; both give TF's exact pixels
(``decode/png_*`` in ``tests/fixtures/tf/zoo/ops.npz``).

JPEG: TF's exact pixels through ``simplejpeg``, Pillow as the fallback.

TF decodes with libjpeg-turbo, by default with its fast integer IDCT and fancy chroma
upsampling.  ``simplejpeg`` is libjpeg-turbo with both settings exposed, so every
``dct_method`` / ``fancy_upscaling`` combination TF recorded
(``tests/fixtures/tf/zoo/ops.npz``, ``decode_jpeg/...``) is matched exactly; Pillow
always decodes with the accurate IDCT and fancy upsampling (exactly TF's
``INTEGER_ACCURATE`` output, a few levels from TF's default).
"""

from __future__ import annotations

import io
import json
import pathlib
from typing import Any

import numpy as np
import pytest

import asyncflow as af
from asyncflow import compat
from asyncflow.ops import image_ops

pytest.importorskip("PIL")

ZOO = pathlib.Path(__file__).parent / "fixtures" / "tf" / "zoo"
OPS = np.load(ZOO / "ops.npz")
JPEG = OPS["decode_jpeg/bytes"].tobytes()
SETTINGS = [
    (dct, fancy) for dct in ("", "INTEGER_FAST", "INTEGER_ACCURATE") for fancy in (True, False)
]


def tf_pixels(dct: str, fancy: bool) -> np.ndarray:
    return OPS[f"decode_jpeg/{dct or 'default'}/{int(fancy)}"]  # type: ignore[no-any-return]


def decode(data: bytes, channels: int = 3, **settings: Any) -> np.ndarray:
    with af.Graph().as_default():
        out = af.image.decode_jpeg(data, channels=channels, name="decode", **settings)
        with af.Session() as sess:
            return sess.run_sync(out)  # type: ignore[no-any-return]


@pytest.fixture
def pillow_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode as an install without ``simplejpeg`` does."""
    monkeypatch.setattr(image_ops, "_simplejpeg", lambda: None)


@pytest.mark.parametrize(("dct", "fancy"), SETTINGS)
def test_every_decoder_setting_gives_tfs_exact_pixels(dct: str, fancy: bool) -> None:
    pytest.importorskip("simplejpeg")
    got = decode(JPEG, fancy_upscaling=fancy, dct_method=dct)
    np.testing.assert_array_equal(got, tf_pixels(dct, fancy))


@pytest.mark.parametrize("channels", [0, 1, 3])
def test_each_channel_count_gives_tfs_exact_pixels(channels: int) -> None:
    pytest.importorskip("simplejpeg")
    data = OPS["decode/jpeg_rgb/bytes"].tobytes()
    np.testing.assert_array_equal(decode(data, channels), OPS[f"decode/jpeg_rgb/{channels}"])


@pytest.mark.usefixtures("pillow_only")
def test_pillow_alone_is_tfs_accurate_decode_and_near_the_default() -> None:
    np.testing.assert_array_equal(
        decode(JPEG, dct_method="INTEGER_ACCURATE"), tf_pixels("INTEGER_ACCURATE", True)
    )
    default = decode(JPEG).astype(int)
    assert np.abs(default - tf_pixels("", True)).max() <= 10
    for channels in (0, 1, 3):
        data = OPS["decode/jpeg_rgb/bytes"].tobytes()
        expected = OPS[f"decode/jpeg_rgb/{channels}"]
        got = decode(data, channels)
        assert got.shape == expected.shape
        assert np.abs(got.astype(int) - expected).max() <= 10


def test_both_paths_agree_on_the_accurate_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("simplejpeg")
    turbo = decode(JPEG, dct_method="INTEGER_ACCURATE")
    monkeypatch.setattr(image_ops, "_simplejpeg", lambda: None)
    np.testing.assert_array_equal(decode(JPEG, dct_method="INTEGER_ACCURATE"), turbo)


def _zoo_image_jpeg() -> tuple[af.Graph, Any, list[Any], dict[str, np.ndarray]]:
    entry = json.loads((ZOO / "manifest.json").read_text())["models"]["image_jpeg"]
    g = af.Graph()
    with g.as_default():
        compat.import_tf_graph_def((ZOO / entry["graph"]).read_bytes(), name="")
    values = np.load(ZOO / entry["values"])
    fetches = [g.get_tensor_by_name(n) for n in entry["outputs"]]
    expected = {n: values[f"fetch/{n}"] for n in entry["outputs"]}
    return (
        g,
        g.get_tensor_by_name("image_bytes:0"),
        fetches,
        expected | {"feed": values["feed/image_bytes:0"]},
    )


def test_the_zoo_jpeg_pipeline_matches_tf_to_float32_tolerance() -> None:
    """With TF's pixels the whole preprocessing graph (decode, six resizes, normalize)
    matches TF to the zoo's float32 tolerance, not the JPEG allowance its manifest
    records for Pillow's decode."""
    pytest.importorskip("simplejpeg")
    g, data, fetches, expected = _zoo_image_jpeg()
    with af.Session(graph=g) as sess:
        got = sess.run_sync(fetches, {data: expected["feed"].tobytes()})
    for t, value in zip(fetches, got, strict=True):
        np.testing.assert_allclose(value, expected[t.name], rtol=1e-4, atol=1e-5, err_msg=t.name)


def test_an_imported_graph_with_a_bad_dct_method_names_the_node() -> None:
    with af.Graph().as_default() as g:
        data = af.placeholder(af.string, (), name="data")
        bad = g.create_op(
            "DecodeJpeg",
            [data],
            {"channels": 3, "dtype": af.uint8, "dct_method": "INTEGER_FASTEST"},
            name="bad_decode",
        ).outputs[0]
        with af.Session() as sess:
            with pytest.raises(
                af.errors.InvalidArgumentError, match=r"'bad_decode': dct_method .*INTEGER_FASTEST"
            ):
                sess.run_sync(bad, {data: JPEG})
            assert sess.run_sync(af.image.decode_jpeg(data), {data: JPEG}).shape == (13, 19, 3)
    with pytest.raises(ValueError, match="dct_method must be one of"):
        af.image.decode_jpeg(JPEG, dct_method="fast")


@pytest.mark.parametrize("path", ["simplejpeg", "pillow"])
def test_corrupt_jpegs_name_the_node_and_the_session_stays_usable(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PIL import Image

    if path == "simplejpeg":
        pytest.importorskip("simplejpeg")
    else:
        monkeypatch.setattr(image_ops, "_simplejpeg", lambda: None)
    large = np.random.default_rng(8).integers(0, 256, (150, 140, 3), np.uint8)
    buf = io.BytesIO()
    Image.fromarray(large).save(buf, format="JPEG", quality=90)
    whole = buf.getvalue()
    with af.Graph().as_default():
        data = af.placeholder(af.string, (), name="data")
        img = af.image.decode_jpeg(data, name="decode_jpeg_node")
        with af.Session() as sess:
            for bad in (b"not a jpeg", JPEG[: len(JPEG) // 2], whole[: len(whole) // 2]):
                with pytest.raises(
                    af.errors.InvalidArgumentError,
                    match=rf"Invalid JPEG data, size {len(bad)}[\s\S]*decode_jpeg_node",
                ):
                    sess.run_sync(img, {data: bad})
            assert sess.run_sync(img, {data: whole}).shape == (150, 140, 3)
            assert sess.run_sync(img, {data: JPEG}).shape == (13, 19, 3)


def test_a_cmyk_jpeg_goes_to_pillow() -> None:
    """libjpeg-turbo's CMYK conversion is not TF's: Pillow decodes such an image, as
    it did before (``simplejpeg`` present or not)."""
    from PIL import Image

    cmyk = np.random.default_rng(9).integers(0, 256, (6, 5, 4), np.uint8)
    buf = io.BytesIO()
    Image.fromarray(cmyk, "CMYK").save(buf, format="JPEG", quality=95)
    expected = np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))
    np.testing.assert_array_equal(decode(buf.getvalue()), expected)


PNG_CASES = sorted(k for k in OPS.files if k.startswith("decode/png_") and not k.endswith("/bytes"))


@pytest.fixture
def png_paths(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The decoder of each PNG decode: "pyspng" or "pillow"."""
    paths: list[str] = []
    fast, pixels = image_ops._PngDecoder._fast_decode, image_ops._pixels

    def via_spng(self: Any, *args: Any) -> np.ndarray:
        paths.append("pyspng")
        return fast(self, *args)

    def via_pillow(*args: Any) -> np.ndarray:
        paths.append("pillow")
        return pixels(*args)

    monkeypatch.setattr(image_ops._PngDecoder, "_fast_decode", via_spng)
    monkeypatch.setattr(image_ops, "_pixels", via_pillow)
    return paths


def decode_png(data: bytes, channels: int) -> np.ndarray:
    with af.Graph().as_default():
        out = af.image.decode_png(data, channels=channels, name="decode")
        with af.Session() as sess:
            return sess.run_sync(out)  # type: ignore[no-any-return]


@pytest.mark.parametrize("case", PNG_CASES)
def test_png_decodes_take_libspng_where_it_gives_tfs_pixels(
    case: str, png_paths: list[str]
) -> None:
    pytest.importorskip("pyspng")
    _, source, channels = case.split("/")
    got = decode_png(OPS[f"decode/{source}/bytes"].tobytes(), int(channels))
    np.testing.assert_array_equal(got, OPS[case])
    eight_bit_color = source in ("png_rgb", "png_rgba")
    assert png_paths == ["pyspng" if eight_bit_color and channels != "1" else "pillow"]


@pytest.mark.parametrize("case", PNG_CASES)
def test_png_decodes_through_pillow_alone_are_tfs_too(
    case: str, png_paths: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(image_ops, "_pyspng", lambda: None)
    _, source, channels = case.split("/")
    got = decode_png(OPS[f"decode/{source}/bytes"].tobytes(), int(channels))
    np.testing.assert_array_equal(got, OPS[case])
    assert png_paths == ["pillow"]


@pytest.mark.parametrize("path", ["pyspng", "pillow"])
def test_corrupt_pngs_name_the_node_and_the_session_stays_usable(
    path: str, monkeypatch: pytest.MonkeyPatch, png_paths: list[str]
) -> None:
    from PIL import Image

    if path == "pyspng":
        pytest.importorskip("pyspng")
    else:
        monkeypatch.setattr(image_ops, "_pyspng", lambda: None)
    large = np.random.default_rng(10).integers(0, 256, (150, 140, 3), np.uint8)
    buf = io.BytesIO()
    Image.fromarray(large).save(buf, format="PNG")
    whole = buf.getvalue()
    small = OPS["decode/png_rgb/bytes"].tobytes()
    with af.Graph().as_default():
        data = af.placeholder(af.string, (), name="data")
        img = af.image.decode_png(data, channels=3, name="decode_png_node")
        with af.Session() as sess:
            for bad in (b"not a png", small[: len(small) // 2], whole[: len(whole) // 2]):
                with pytest.raises(
                    af.errors.InvalidArgumentError,
                    match=rf"Invalid PNG data, size {len(bad)}[\s\S]*decode_png_node",
                ):
                    sess.run_sync(img, {data: bad})
            np.testing.assert_array_equal(sess.run_sync(img, {data: whole}), large)
    assert png_paths[-1] == path


def test_a_ratio_is_refused_naming_the_node() -> None:
    """TF decodes at 1/ratio of the size; asyncflow does not, and says so rather than
    returning a full-size image."""
    with af.Graph().as_default() as g:
        data = af.placeholder(af.string, (), name="data")
        halved = g.create_op(
            "DecodeJpeg", [data], {"channels": 3, "dtype": af.uint8, "ratio": 2}, name="halved"
        ).outputs[0]
        with af.Session() as sess:
            with pytest.raises(af.errors.UnimplementedError, match=r"'halved': ratio=2"):
                sess.run_sync(halved, {data: JPEG})
            assert sess.run_sync(af.image.decode_jpeg(data), {data: JPEG}).shape == (13, 19, 3)
