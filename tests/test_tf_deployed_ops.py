"""Op types deployed TF1 graphs need, against values and errors TensorFlow computed.

``fixtures/tf/zoo/ops.npz`` and ``tensor_array_errors.json`` were written by
``make_zoo.py`` with TF 2.21; TensorFlow is never imported here.
"""

from __future__ import annotations

import io
import json
import pathlib
import re
import sys
import threading
from typing import Any

import numpy as np
import pytest

import asyncflow as af
from asyncflow.compat import export_tf_graph_def, import_tf_graph_def
from asyncflow.compat._tf_proto import messages

ZOO = pathlib.Path(__file__).parent / "fixtures" / "tf" / "zoo"
OPS = np.load(ZOO / "ops.npz")
TA_ERRORS: dict[str, str] = json.loads((ZOO / "tensor_array_errors.json").read_text())
CORNERS = [(False, False), (True, False), (False, True)]
BANDS = [(-1, 0), (0, -1), (1, 2), (0, 0), (-1, -1), (3, 1)]


def _run(fetches: Any, feed_dict: Any = None, graph: af.Graph | None = None) -> Any:
    with af.Session(graph=graph or af.get_default_graph()) as sess:
        return sess.run_sync(fetches, feed_dict)


# -- Erf, Erfc, MatrixBandPart, Select, IdentityN ------------------------------------------


@pytest.mark.parametrize("dt", ["float32", "float64"])
def test_erf_and_erfc_match_tf(dt: str) -> None:
    x = OPS[f"erf/{dt}/x"]
    with af.Graph().as_default():
        t = af.placeholder(dt)
        erf, erfc = _run([af.erf(t), af.erfc(t)], {t: x})
    assert erfc.dtype == np.dtype(dt)
    rtol = 2e-7 if dt == "float32" else 1e-15
    np.testing.assert_allclose(erf, OPS[f"erf/{dt}/erf"], rtol=rtol, atol=1e-30)
    # erfc keeps its relative precision where 1 - erf(x) would be 0 (x = 10: 2e-45).
    np.testing.assert_allclose(erfc, OPS[f"erf/{dt}/erfc"], rtol=rtol * 8, atol=1e-37)
    assert erfc[x == 10][0] > 0


@pytest.mark.parametrize(("lower", "upper"), BANDS)
def test_matrix_band_part_matches_tf(lower: int, upper: int) -> None:
    with af.Graph().as_default():
        out = _run(af.matrix_band_part(OPS["band/x"], lower, upper))
    np.testing.assert_array_equal(out, OPS[f"band/{lower}_{upper}"])


def test_matrix_band_part_rejects_a_band_wider_than_the_matrix() -> None:
    with af.Graph().as_default():
        x = af.placeholder(af.float32, name="m")
        y = af.matrix_band_part(x, 5, 0, name="band")
        with pytest.raises(
            af.errors.InvalidArgumentError,
            match=r"num_lower .* rows \(4\) "
            r"got: 5[\s\S]*band",
        ):
            _run(y, {x: OPS["band/x"]})


def test_select_v1_picks_rows_with_a_vector_condition_of_unknown_rank_inputs() -> None:
    with af.Graph().as_default() as g:
        c = af.placeholder(af.bool, name="c")
        x = af.placeholder(af.float32, name="x")
        y = af.placeholder(af.float32, name="y")
        s = g.create_op("Select", [c, x, y], {}, name="sel").outputs[0]
        a, b = np.ones((3, 2), np.float32), np.zeros((3, 2), np.float32)
        out = _run(s, {c: [True, False, True], x: a, y: b})
        np.testing.assert_array_equal(out, [[1, 1], [0, 0], [1, 1]])
        with pytest.raises(af.errors.InvalidArgumentError, match=r"batches .* 3 vs\. 2"):
            _run(s, {c: [True, False], x: a, y: b})


def test_select_v1_with_one_condition_for_the_whole_value_picks_an_input_itself() -> None:
    from asyncflow.ops.extra_math_ops import _select_v1_kernel

    a, b = np.ones((1, 4), np.float32), np.zeros((1, 4), np.float32)
    assert _select_v1_kernel(np.array([True]), a, b) is a  # a batch of one: no copy
    assert _select_v1_kernel(np.array([False]), a, b) is b
    m, n = np.ones((3, 2)), np.zeros((3, 2))
    assert _select_v1_kernel(np.bool_(False), m, n) is n  # a scalar condition
    with pytest.raises(af.errors.InvalidArgumentError, match=r"'cond' and 'then'"):
        _select_v1_kernel(np.array([True]), np.float32(1), np.float32(2))  # (1,) vs ()
    with pytest.raises(af.errors.InvalidArgumentError, match=r"batches .* 3 vs\. 1"):
        _select_v1_kernel(np.array([True]), m, n)
    with pytest.raises(af.errors.InvalidArgumentError, match=r"same size"):
        _select_v1_kernel(np.array([True]), a, n)


def test_identity_n_passes_every_value() -> None:
    with af.Graph().as_default() as g:
        a, b = af.constant([1.0, 2.0]), af.constant(3)
        op = g.create_op("IdentityN", [a, b], {}, name="idn")
        x, y = _run(list(op.outputs))
    np.testing.assert_array_equal(x, [1.0, 2.0])
    assert y == 3


# -- resize --------------------------------------------------------------------------------


@pytest.mark.parametrize("case", range(5))
@pytest.mark.parametrize("corner", range(3))
def test_resize_matches_tf(case: int, corner: int) -> None:
    align, half = CORNERS[corner]
    expected = OPS[f"resize/{case}/bilinear_{corner}"]
    size = list(expected.shape[1:3])
    with af.Graph().as_default():
        x = af.placeholder(af.float32)
        u = af.placeholder(af.uint8)
        outs = _run(
            [
                af.image.resize_bilinear(x, size, align, half),
                af.image.resize_bilinear(u, size, align, half),
                af.image.resize_nearest_neighbor(u, size, align, half),
            ],
            {x: OPS[f"resize/{case}/x"], u: OPS[f"resize/{case}/x_uint8"]},
        )
    bilinear, bilinear_u8, nearest = outs
    assert bilinear.dtype == np.float32
    assert bilinear_u8.dtype == np.float32
    assert nearest.dtype == np.uint8
    np.testing.assert_allclose(bilinear, expected, rtol=1e-6, atol=1e-4)
    np.testing.assert_allclose(
        bilinear_u8, OPS[f"resize/{case}/bilinear_uint8_{corner}"], rtol=1e-6, atol=1e-4
    )
    np.testing.assert_array_equal(nearest, OPS[f"resize/{case}/nearest_{corner}"])


def test_resize_static_shape_and_bad_arguments() -> None:
    with af.Graph().as_default():
        x = af.placeholder(af.float32, (None, 5, 5, 3))
        assert af.image.resize_bilinear(x, [7, 2]).shape.as_list() == [None, 7, 2, 3]
        with pytest.raises(ValueError, match="cannot both be true"):
            af.image.resize_bilinear(x, [7, 2], align_corners=True, half_pixel_centers=True)
        with pytest.raises(ValueError, match="4-D"):
            af.image.resize_nearest_neighbor(af.placeholder(af.float32, (5, 5, 3)), [2, 2])


def test_small_resizes_run_inline_and_large_ones_on_the_worker_threads() -> None:
    # A hop to a worker thread costs more than resizing a small image: a serving graph's
    # small resizes run inline, sized by their static output (an unknown batch as 8).
    from asyncflow.framework import registry

    with af.Graph().as_default():
        small = af.placeholder(af.float32, (None, 64, 64, 3))
        large = af.placeholder(af.float32, (1, 512, 512, 3))
        unknown = af.placeholder(af.float32, (None, None, None, 3))
        cases = [
            (af.image.resize_bilinear(small, [32, 32]), registry.INLINE),
            (af.image.resize_nearest_neighbor(small, [32, 32]), registry.INLINE),
            (af.image.resize_bilinear(small, [128, 128]), registry.EXPENSIVE),
            (af.image.resize_bilinear(large, [256, 256]), registry.EXPENSIVE),
            (af.image.resize_nearest_neighbor(unknown, af.shape(unknown)[1:3]), registry.EXPENSIVE),
        ]
        for out, kind in cases:
            assert registry.get_kernel(out.op.type).instantiate(out.op)[1] == kind, out
        # Inline or not, the values are the same.
        x = np.random.default_rng(0).random((2, 64, 64, 3), np.float32)
        with af.Session() as sess:
            inline, threaded = sess.run_sync(
                [
                    af.image.resize_bilinear(small, [32, 32]),
                    af.image.resize_bilinear(af.image.resize_bilinear(small, [128, 128]), [32, 32]),
                ],
                {small: x},
            )
        assert inline.shape == threaded.shape == (2, 32, 32, 3)


# -- PNG / JPEG ------------------------------------------------------------------------------


def _image() -> np.ndarray:
    rnd = np.random.default_rng(0)
    return rnd.integers(0, 256, (7, 5, 3)).astype(np.uint8)


def test_png_encode_decode_round_trip_is_exact_for_each_channel_count() -> None:
    for channels in (1, 2, 3, 4):
        image = np.random.default_rng(channels).integers(0, 256, (6, 9, channels), np.uint8)
        with af.Graph().as_default():
            encoded = af.image.encode_png(image)
            decoded = af.image.decode_png(encoded)
            data, out = _run([encoded, decoded])
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        np.testing.assert_array_equal(out, image)


def test_decode_png_converts_channels_as_asked() -> None:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(_image(), "RGB").save(buf, format="PNG")
    with af.Graph().as_default():
        rgba, rgb = _run(
            [af.image.decode_png(buf.getvalue(), channels=4), af.image.decode_png(buf.getvalue())]
        )
    np.testing.assert_array_equal(rgb, _image())
    np.testing.assert_array_equal(rgba[:, :, :3], _image())
    assert (rgba[:, :, 3] == 255).all()


def test_jpeg_round_trip_is_close() -> None:
    image = np.tile(np.linspace(0, 255, 16, dtype=np.uint8)[None, :, None], (16, 1, 3))
    with af.Graph().as_default():
        encoded = af.image.encode_jpeg(image, quality=95)
        accurate, default = _run(
            [
                af.image.decode_jpeg(encoded, dct_method="INTEGER_ACCURATE"),
                af.image.decode_jpeg(encoded),
            ]
        )
    assert accurate.shape == default.shape == image.shape
    assert np.abs(accurate.astype(int) - image).max() <= 4
    # TF's default, the fast integer IDCT, is off by 5 on this round trip in TF itself.
    assert np.abs(default.astype(int) - image).max() <= 6


def test_corrupt_image_names_the_node_and_the_session_stays_usable() -> None:
    with af.Graph().as_default():
        data = af.placeholder(af.string, (), name="data")
        img = af.image.decode_png(data, name="decode")
        with af.Session() as sess:
            with pytest.raises(
                af.errors.InvalidArgumentError, match=r"Invalid PNG data, size 9[\s\S]*decode"
            ):
                sess.run_sync(img, {data: b"not a png"})
            png = sess.run_sync(af.image.encode_png(_image()))
            np.testing.assert_array_equal(sess.run_sync(img, {data: png}), _image())


def _decode_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads that convert decoded images, in order."""
    from asyncflow.ops import image_ops

    names: list[str] = []
    pixels = image_ops._pixels

    def recorded(*args: Any) -> np.ndarray:
        names.append(threading.current_thread().name)
        return pixels(*args)

    monkeypatch.setattr(image_ops, "_pixels", recorded)
    for cls in (image_ops._JpegDecoder, image_ops._PngDecoder):  # the C decoders' path

        def recorded_fast(self: Any, *args: Any, fast: Any = cls._fast_decode) -> np.ndarray:
            names.append(threading.current_thread().name)
            return fast(self, *args)  # type: ignore[no-any-return]

        monkeypatch.setattr(cls, "_fast_decode", recorded_fast)
    return names


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_a_small_image_decodes_inline_and_a_large_one_on_a_worker_thread(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PIL import Image

    from asyncflow.ops import image_ops

    names = _decode_threads(monkeypatch)
    rnd = np.random.default_rng(3)
    small, large = (rnd.integers(0, 256, shape, np.uint8) for shape in [(7, 5, 3), (160, 120, 3)])
    assert 7 * 5 <= image_ops._INLINE_DECODE_PIXELS < 160 * 120
    encoded = []
    for image in (small, large):
        buf = io.BytesIO()
        Image.fromarray(image, "RGB").save(buf, format=fmt)
        encoded.append(buf.getvalue())
    decode = af.image.decode_png if fmt == "PNG" else af.image.decode_jpeg
    with af.Graph().as_default():
        data = af.placeholder(af.string, (), name="data")
        img = decode(data)
        with af.Session() as sess:
            outs = [sess.run_sync(img, {data: d}) for d in encoded]
            monkeypatch.setattr(image_ops, "_INLINE_DECODE_PIXELS", 0)  # every one threaded
            threaded = sess.run_sync(img, {data: encoded[0]})
    assert [n.startswith("asyncflow-CPU") for n in names] == [False, True, True]
    np.testing.assert_array_equal(threaded, outs[0])  # the same pixels either way
    if fmt == "PNG":
        np.testing.assert_array_equal(outs[0], small)
        np.testing.assert_array_equal(outs[1], large)
    else:
        assert [o.shape for o in outs] == [small.shape, large.shape]


def test_a_large_image_corrupt_past_its_header_names_the_node() -> None:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(4).integers(0, 256, (160, 120, 3), np.uint8)).save(
        buf, format="PNG"
    )
    cut = buf.getvalue()[: len(buf.getvalue()) // 2]  # the header reads, the pixels do not
    with af.Graph().as_default():
        data = af.placeholder(af.string, (), name="data")
        img = af.image.decode_png(data, name="decode_big")
        with af.Session() as sess:
            with pytest.raises(
                af.errors.InvalidArgumentError,
                match=rf"Invalid PNG data, size {len(cut)}[\s\S]*decode_big",
            ):
                sess.run_sync(img, {data: cut})
            assert sess.run_sync(img, {data: buf.getvalue()}).shape == (160, 120, 3)


def test_missing_pillow_names_the_op_and_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "PIL", None)
    with af.Graph().as_default():
        img = af.image.decode_png(b"\x89PNG", name="dec")
        with pytest.raises(
            af.errors.UnimplementedError,
            match=r"DecodePng needs Pillow.*asyncflow\[image\][\s\S]*dec",
        ):
            _run(img)


# -- TensorArray -----------------------------------------------------------------------------


def _misuse(name: str) -> af.Tensor:
    ta = af.TensorArray(af.float32, size=2, infer_shape=False, tensor_array_name="ta")
    if name == "write_twice":
        return ta.write(0, [1.0]).write(0, [2.0]).read(0)
    if name == "read_unwritten":
        return ta.write(0, [1.0]).read(1)
    if name == "read_cleared":
        written = ta.write(0, [1.0])
        first = written.read(0)
        with af.control_dependencies([first]):
            return written.read(0)
    if name == "write_out_of_range":
        return ta.write(5, [1.0]).read(0)
    if name == "gather_inconsistent":
        return ta.write(0, [1.0]).write(1, [1.0, 2.0]).gather([0, 1])
    if name == "split_lengths_sum":
        return ta.split([1.0, 2.0, 3.0], [1, 1]).read(0)
    if name == "split_size":
        return ta.split([1.0, 2.0, 3.0], [1, 1, 1]).read(0)
    written = ta.write(0, [1.0])
    with af.control_dependencies([written.close()]):
        return written.read(0)


@pytest.mark.parametrize("case", sorted(TA_ERRORS))
def test_tensor_array_misuse_fails_as_tf(case: str) -> None:
    kind, message = TA_ERRORS[case].split(": ", 1)
    # TF names the array "ta_<n>" (a unique suffix); asyncflow by its tensor_array_name.
    expected = " ".join(re.sub(r"TensorArray ta_\d+", "TensorArray ta", message).split())
    with af.Graph().as_default():
        fetch = _misuse(case)
        with af.Session() as sess:
            with pytest.raises(getattr(af.errors, kind)) as info:
                sess.run_sync(fetch)
            assert expected in " ".join(str(info.value).split())
            assert "[[node " in str(info.value)
            assert sess.run_sync(af.constant(1.0)) == 1.0  # the session stays usable


def test_tensor_array_errors_name_the_failing_node() -> None:
    with af.Graph().as_default():
        ta = af.TensorArray(af.float32, size=1, tensor_array_name="arr")
        read = ta.write(0, 1.0).write(0, 2.0, name="second_write").read(0)
        with pytest.raises(
            af.errors.InvalidArgumentError,
            match=r"TensorArray arr: Could not write to TensorArray index 0 "
            r"because it has already been written to\.[\s\S]*"
            r"second_write",
        ):
            _run(read)


def test_unwritten_index_reads_zeros_when_the_element_shape_is_known() -> None:
    with af.Graph().as_default():
        ta = af.TensorArray(af.float32, size=3, element_shape=[2])
        out = _run(ta.write(1, [1.0, 2.0]).stack())
    np.testing.assert_array_equal(out, [[0, 0], [1, 2], [0, 0]])


def test_dynamic_size_grows_and_concat_gives_lengths() -> None:
    with af.Graph().as_default() as g:
        ta = af.TensorArray(af.int32, size=0, dynamic_size=True, infer_shape=False)
        ta = ta.write(0, [1, 2]).write(3, [7])
        ta = ta.write(1, [3]).write(2, [4, 5, 6])
        concat = ta.concat()
        size = ta.size()
        lengths = g.get_operation_by_name(concat.op.name).outputs[1]
        values, n, lens = _run([concat, size, lengths])
    np.testing.assert_array_equal(values, [1, 2, 3, 4, 5, 6, 7])
    assert n == 4
    np.testing.assert_array_equal(lens, [2, 1, 3, 1])


def test_split_scatter_gather_and_unstack() -> None:
    with af.Graph().as_default():
        value = np.arange(12, dtype=np.float32).reshape(6, 2)
        split = af.TensorArray(af.float32, size=3, infer_shape=False).split(value, [1, 2, 3])
        parts = [split.read(i) for i in range(3)]
        scattered = af.TensorArray(af.float32, size=4, clear_after_read=False).scatter(
            [3, 0], value[:2]
        )
        un = af.TensorArray(af.float32, size=6).unstack(value)
        outs = _run([*parts, scattered.gather([0, 3]), un.stack()])
    np.testing.assert_array_equal(outs[0], value[:1])
    np.testing.assert_array_equal(outs[2], value[3:])
    np.testing.assert_array_equal(outs[3], value[1::-1])
    np.testing.assert_array_equal(outs[4], value)


def test_tensor_array_in_a_while_loop_orders_by_flow_across_iterations() -> None:
    with af.Graph().as_default():
        n = af.placeholder(af.int32, (), name="n")
        ta = af.TensorArray(af.float32, size=n, element_shape=[], clear_after_read=False)

        def body(i: Any, flow: Any) -> Any:
            cur = af.TensorArray(af.float32, handle=ta.handle, flow=flow)
            # Element i is i squared, read back from the array at the next iteration.
            prev = af.cond(i > 0, lambda: cur.read(i - 1), lambda: af.constant(0.0))
            return i + 1, cur.write(
                i, prev + af.cast(2 * i - 1, af.float32) + af.cast(af.equal(i, 0), af.float32)
            ).flow

        _, flow = af.while_loop(lambda i, f: i < n, body, [af.constant(0), ta.flow])
        out = af.TensorArray(af.float32, handle=ta.handle, flow=flow, element_shape=[]).gather(
            af.range(0, n)
        )
        result = _run(out, {n: 6})
    np.testing.assert_array_equal(result, [0, 1, 4, 9, 16, 25])


def test_tensor_array_graph_exports_to_tf_and_back() -> None:
    with af.Graph().as_default() as g:
        ta = af.TensorArray(af.float32, size=2, element_shape=[2], name="arr")
        out = af.identity(ta.write(0, [1.0, 2.0]).write(1, [3.0, 4.0]).stack(), name="out")
    data = export_tf_graph_def(g)
    m = messages()
    gd = m.GraphDef.FromString(data)
    types = {n.op for n in gd.node}
    assert {
        "TensorArrayV3",
        "TensorArrayWriteV3",
        "TensorArrayGatherV3",
        "TensorArraySizeV3",
    } <= types
    g2 = af.Graph()
    with g2.as_default():
        import_tf_graph_def(data, name="")
    np.testing.assert_array_equal(_run("out:0", graph=g2), [[1, 2], [3, 4]])
    assert out.shape.as_list() == [None, 2]


# -- static arguments folded from constants ---------------------------------------------------


def _node(gd: Any, name: str, op: str, inputs: list[str], **attrs: Any) -> None:
    nd = gd.node.add(name=name, op=op)
    nd.input.extend(inputs)
    for key, value in attrs.items():
        if key in ("dtype", "T", "Tidx", "Tperm"):
            nd.attr[key].type = value
        elif key == "value":
            nd.attr[key].tensor.CopyFrom(value)
        elif key == "N":
            nd.attr[key].i = value


def _perm_graph(perm_from_placeholder: bool) -> bytes:
    m = messages()
    gd = m.GraphDef()
    _node(gd, "x", "Placeholder", [], dtype=1)
    _node(
        gd,
        "a",
        "Const",
        [],
        dtype=3,
        value=m.TensorProto(dtype=3, int_val=[2], tensor_shape={"dim": [{"size": 1}]}),
    )
    if perm_from_placeholder:
        _node(gd, "b", "Placeholder", [], dtype=3)
    else:
        _node(
            gd,
            "b",
            "Const",
            [],
            dtype=3,
            value=m.TensorProto(dtype=3, int_val=[0, 1], tensor_shape={"dim": [{"size": 2}]}),
        )
    _node(gd, "axis", "Const", [], dtype=3, value=m.TensorProto(dtype=3, int_val=[0]))
    _node(gd, "perm", "ConcatV2", ["a", "b", "axis"], T=3, Tidx=3, N=2)
    _node(gd, "t", "Transpose", ["x", "perm"], T=1, Tperm=3)
    data: bytes = gd.SerializeToString()
    return data


def test_transpose_perm_made_by_concat_of_constants_is_folded() -> None:
    g = af.Graph()
    with g.as_default():
        import_tf_graph_def(_perm_graph(False), name="")
    t = g.get_operation_by_name("t")
    assert t.get_attr("perm") == [2, 0, 1]
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    np.testing.assert_array_equal(_run("t:0", {"x:0": x}, graph=g), x.transpose(2, 0, 1))


def test_a_perm_that_depends_on_data_is_refused_naming_the_node() -> None:
    with (
        af.Graph().as_default(),
        pytest.raises(
            af.errors.UnimplementedError,
            match=r"'t' \(Transpose\): perm must be a constant.*'perm:0' \(ConcatV2\)",
        ),
    ):
        import_tf_graph_def(_perm_graph(True), name="")


def test_public_constructors_build_tf_op_types() -> None:
    with af.Graph().as_default():
        x = af.constant(np.ones((1, 4, 4, 1), np.float32))
        a, b = af.identity_n([x, af.constant(2)])
        assert a.op is b.op
        assert a.op.type == "IdentityN"
        assert af.erfc(x).op.type == "Erfc"
        assert af.matrix_band_part(x[0, :, :, 0], -1, 0).op.type == "MatrixBandPart"
        r = af.image.resize(x, [2, 2])
        assert r.op.type == "ResizeBilinear"
        assert r.op.get_attr("half_pixel_centers") is True
        assert af.image.resize(x, [2, 2], method="nearest").op.type == "ResizeNearestNeighbor"
        with pytest.raises(ValueError, match="method"):
            af.image.resize(x, [2, 2], method="area")
        y = _run(r)
    np.testing.assert_array_equal(y, np.ones((1, 2, 2, 1)))


def test_identical_element_shapes_fixes_the_shape_at_the_first_write() -> None:
    with af.Graph().as_default():
        a = af.placeholder(af.float32, name="a")
        b = af.placeholder(af.float32, name="b")
        ta = af.TensorArray(af.float32, size=3, tensor_array_name="same")  # infer_shape
        ta = ta.write(0, a)
        zeros_after = ta.read(2)  # never written: zeros of the inferred shape
        mismatch = ta.write(1, b).read(0)
        with af.Session() as sess:
            out = sess.run_sync(zeros_after, {a: [1.0, 2.0]})
            np.testing.assert_array_equal(out, [0.0, 0.0])
            with pytest.raises(
                af.errors.InvalidArgumentError,
                match=r"TensorArray same: Could not write to TensorArray index "
                r"1 because the value shape is \[3\] which is "
                r"incompatible with the TensorArray's inferred element "
                r"shape: \[2\] \(consider setting infer_shape=False\)",
            ):
                sess.run_sync(mismatch, {a: [1.0, 2.0], b: [1.0, 2.0, 3.0]})


def test_a_write_of_a_shape_seen_before_is_checked_again_after_a_new_one() -> None:
    # A write compares its shape with the last one that fitted before checking it in
    # full: every new shape is checked, whatever fitted before.
    with af.Graph().as_default():
        a = af.placeholder(af.float32, name="a")
        b = af.placeholder(af.float32, name="b")
        ta = af.TensorArray(af.float32, size=3, element_shape=[None, 2], tensor_array_name="p")
        ta = ta.write(0, a).write(1, a).write(2, b)
        stacked = ta.stack()
        with af.Session() as sess:
            ok = sess.run_sync(stacked, {a: np.ones((1, 2)), b: np.zeros((1, 2))})
            np.testing.assert_array_equal(ok, [[[1, 1]], [[1, 1]], [[0, 0]]])
            with pytest.raises(af.errors.InvalidArgumentError, match=r"index 2 .* \[1,3\]"):
                sess.run_sync(stacked, {a: np.ones((1, 2)), b: np.zeros((1, 3))})
            with pytest.raises(af.errors.InvalidArgumentError, match=r"index 0 .* \[2\]"):
                sess.run_sync(stacked, {a: np.ones(2), b: np.zeros((1, 2))})


@pytest.mark.parametrize(
    ("shape", "axis", "num"), [((3, 64), 1, 4), ((4, 6, 2), -2, 3), ((8,), 0, 2)]
)
def test_split_gives_the_parts_numpy_split_gives(
    shape: tuple[int, ...], axis: int, num: int
) -> None:
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    with af.Graph().as_default():
        parts = _run(af.split(af.constant(x), num, axis=axis))
    for got, want in zip(parts, np.split(x, num, axis=axis), strict=True):
        np.testing.assert_array_equal(got, want)
        assert got.shape == want.shape


def test_scatter_checks_every_index_and_the_rows_once() -> None:
    # Scatter checks the rows' dtype and shape once, and each index as it writes it:
    # the second of two duplicate or out-of-range indices fails as a second write would.
    rows = np.arange(6, dtype=np.float32).reshape(3, 2)
    with af.Graph().as_default():
        idx = af.placeholder(af.int32, (None,), name="idx")
        ta = af.TensorArray(af.float32, size=3, element_shape=[2], tensor_array_name="sc")
        out = ta.scatter(idx, rows).stack()
        with af.Session() as sess:
            np.testing.assert_array_equal(sess.run_sync(out, {idx: [2, 0, 1]}), rows[[1, 2, 0]])
            with pytest.raises(
                af.errors.InvalidArgumentError, match=r"sc: Could not write .* index 0 .* already"
            ):
                sess.run_sync(out, {idx: [0, 1, 0]})
            with pytest.raises(
                af.errors.InvalidArgumentError, match=r"sc: Tried to write to index 3"
            ):
                sess.run_sync(out, {idx: [0, 3, 1]})
        fed = af.placeholder(af.float32, name="fed")  # (a shape known at run time only)
        wrong = af.TensorArray(af.float32, size=2, element_shape=[3], tensor_array_name="w")
        with pytest.raises(af.errors.InvalidArgumentError, match=r"w: .* index 0 .* \[2\]"):
            _run(wrong.scatter([0, 1], fed).stack(), {fed: rows[:2]})


def test_stack_of_an_empty_array_needs_a_full_element_shape() -> None:
    with af.Graph().as_default():
        n = af.placeholder(af.int32, (), name="n")
        known = af.TensorArray(af.float32, size=n, element_shape=[2]).stack()
        unknown = af.TensorArray(af.float32, size=n, tensor_array_name="e").stack()
        with af.Session() as sess:
            assert sess.run_sync(known, {n: 0}).shape == (0, 2)
            with pytest.raises(
                af.errors.InvalidArgumentError,
                match=r"TensorArray e: TensorArray has size zero, but element "
                r"shape <unknown> is not fully defined",
            ):
                sess.run_sync(unknown, {n: 0})


def test_constant_value_of_evaluates_constant_subgraphs_only() -> None:
    from asyncflow.framework.constant_eval import constant_value as constant_value_of

    with af.Graph().as_default():
        perm = af.concat([af.constant([2]), af.constant([0, 1]) * 1], 0)
        np.testing.assert_array_equal(constant_value_of(af.identity(perm)), [2, 0, 1])
        x = af.placeholder(af.int32, (2,))
        assert constant_value_of(af.concat([af.constant([2]), x], 0)) is None
        assert constant_value_of(af.random_uniform((2,)) + 1.0) is None  # stateful
        long = af.constant(0)
        for _ in range(300):  # more than a static argument's walk: not evaluated
            long = long + 1
        assert constant_value_of(long) is None
        np.testing.assert_array_equal(constant_value_of(af.constant(3) + 4), 7)


def test_a_16_bit_grayscale_png_decodes_to_its_high_byte() -> None:
    from PIL import Image

    wide = np.array([[0, 255, 256, 65535], [4660, 512, 1000, 40000]], np.uint16)
    buf = io.BytesIO()
    Image.fromarray(wide).save(buf, format="PNG")  # mode I;16
    with af.Graph().as_default():
        out = _run(af.image.decode_png(buf.getvalue()))
    np.testing.assert_array_equal(out[:, :, 0], wide >> 8)


DECODES = sorted(k for k in OPS.files if k.startswith("decode/") and not k.endswith("/bytes"))


@pytest.mark.parametrize("case", DECODES)
def test_decode_matches_tf(case: str) -> None:
    _, source, channels = case.split("/")
    data = OPS[f"decode/{source}/bytes"].tobytes()
    decode = af.image.decode_png if source.startswith("png") else af.image.decode_jpeg
    with af.Graph().as_default():
        out = _run(decode(data, channels=int(channels)))
    expected = OPS[case]
    assert out.shape == expected.shape
    if source.startswith("png"):
        np.testing.assert_array_equal(out, expected)  # PNG: exactly TF's pixels
    else:  # JPEG: decoders differ by a few levels
        assert np.abs(out.astype(int) - expected).max() <= 10


def test_decode_channels_tf_refuses_are_refused() -> None:
    with af.Graph().as_default():
        with pytest.raises(ValueError, match=r"`channels` must be 0, 1, 3 or 4 but got 2"):
            af.image.decode_png(b"", channels=2)
        with pytest.raises(ValueError, match=r"`channels` must be 0, 1 or 3 but got 4"):
            af.image.decode_jpeg(b"", channels=4)


def test_tensor_array_ops_are_colocated_with_the_array() -> None:
    import pickle

    from asyncflow.ops.tensor_array_ops import _Array

    with af.Graph().as_default():
        ta = af.TensorArray(af.float32, size=2, name="arr")
        read = ta.write(0, [1.0]).read(0)
        size = ta.size()
    for op in (read.op, size.op):
        assert op.get_attr("_class") == ["loc:@arr"]
    array = _Array("arr", np.dtype(np.float32), 1, False, True, af.TensorShape(None), False)
    with pytest.raises(TypeError, match="cannot leave its step's process"):
        pickle.dumps(array)
