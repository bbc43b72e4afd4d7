"""harness.model.inputs: every input format gives the fixture's quantized tensor; mismatches fail clearly."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from harness.errors import InputDataError
from harness.model.inputs import InputOptions, load_input, quantize, truncation_report
from harness.model.loader import TensorInfo, load_model

CASES = [
    ("cnn_classifier_11", "cnn_classifier_11"),
    ("cnn_classifier_11__ambiguous", "cnn_classifier_11"),
    ("op_zoo", "op_zoo"),
    ("unet_mbv2_035_48", "unet_mbv2_035_48"),
    ("unet_mbv2_035_64", "unet_mbv2_035_64"),
    ("unet_mbv2_035_128", "unet_mbv2_035_128"),
]


def _tensor(models_dir: Path, model: str) -> TensorInfo:
    return load_model(models_dir / f"{model}.tflite").inputs[0]


@pytest.mark.parametrize(("name", "model"), CASES)
def test_float_npy_quantizes_to_fixture(models_dir: Path, name: str, model: str) -> None:
    t = _tensor(models_dir, model)
    p = load_input(models_dir / "inputs" / f"{name}.npy", t)
    expected = np.load(models_dir / "inputs" / f"{name}.q.npy")
    assert p.quantized.dtype == np.int8 and p.quantized.shape == t.shape
    np.testing.assert_array_equal(p.quantized, expected)
    assert p.sha256 == hashlib.sha256(expected.tobytes()).hexdigest()
    assert not p.prequantized and p.real is not None


@pytest.mark.parametrize(("name", "model"), [c for c in CASES if c[0] != "op_zoo"])
def test_png_quantizes_to_fixture(models_dir: Path, name: str, model: str) -> None:
    p = load_input(models_dir / "inputs" / f"{name}.png", _tensor(models_dir, model))
    np.testing.assert_array_equal(p.quantized, np.load(models_dir / "inputs" / f"{name}.q.npy"))
    assert any("0..1" in n for n in p.notes)


def test_prequantized_npy_used_as_is(models_dir: Path) -> None:
    t = _tensor(models_dir, "op_zoo")
    q = np.load(models_dir / "inputs" / "op_zoo.q.npy")
    p = load_input(models_dir / "inputs" / "op_zoo.q.npy", t)
    assert p.prequantized and p.report.differing == 0
    np.testing.assert_array_equal(p.quantized, q)
    assert p.real is not None
    np.testing.assert_allclose(p.real, (q.astype(float) - t.zero_point) * t.scale)  # type: ignore[operator]


def test_round_half_away_from_zero_and_clamp() -> None:
    x = np.array([0.5, -0.5, 1.5, -1.5, 2.4999, -2.5000001, 200.0, -300.0])
    np.testing.assert_array_equal(quantize(x, 1.0, 0, "int8"), [1, -1, 2, -2, 2, -3, 127, -128])
    np.testing.assert_array_equal(quantize(np.array([0.5, 1e9]), 1.0, 3, "int16"), [4, 32767])
    np.testing.assert_array_equal(quantize(np.array([-1.0, 300.0]), 1.0, 0, "uint8"), [0, 255])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-1.0, 1.0, allow_nan=False), min_size=1, max_size=50),
    st.floats(1e-3, 0.1),
    st.integers(-20, 20),
)
def test_quantize_error_at_most_half_lsb(values: list[float], scale: float, zp: int) -> None:
    x = np.array(values)
    q = quantize(x, scale, zp, "int16")  # wide enough: nothing clamps
    err = np.abs((q.astype(np.float64) - zp) * scale - x)
    assert np.all(err <= scale / 2 * (1 + 1e-9))


def _sketch_cast(real: np.ndarray, scale: float, zp: int) -> np.ndarray:
    """The bug report's C: (int8_t)(x / scale + zero_point), written element by element."""
    out = []
    for v in real.ravel():
        f = np.float32(np.float32(v) / np.float32(scale) + np.float32(zp))
        i = math.trunc(float(f))
        out.append(((i + 128) % 256) - 128)
    return np.array(out)


def test_truncation_report_counts_what_the_sketch_gets_wrong(models_dir: Path) -> None:
    t = _tensor(models_dir, "cnn_classifier_11")
    p = load_input(models_dir / "inputs" / "cnn_classifier_11.npy", t)
    assert p.real is not None and t.scale is not None and t.zero_point is not None
    naive = _sketch_cast(p.real, t.scale, t.zero_point)
    expected_wrong = int(np.count_nonzero(naive != p.quantized.ravel()))
    assert expected_wrong > 0  # zero point -128 makes truncation round the wrong way
    assert p.report.differing == expected_wrong
    assert p.report.max_abs_diff == 1 and p.report.wrapped == 0


def test_truncation_report_wrap_and_clamp() -> None:
    r = truncation_report(np.array([1.2, 0.0, -0.6]), 1 / 255, -128, "int8")
    # 1.2 -> 178 (wraps to -78 in the sketch; correct clamps to 127); -0.6 -> -281 (wraps; clamps to -128)
    assert r.wrapped == 2 and r.clamped == 2 and r.differing == 2 and r.total == 3


def test_hwc_npy_gets_batch_dim_but_chw_is_rejected(models_dir: Path, tmp_path: Path) -> None:
    t = _tensor(models_dir, "cnn_classifier_11")
    x = np.load(models_dir / "inputs" / "cnn_classifier_11.npy")
    np.save(tmp_path / "hwc.npy", x[0])
    p = load_input(tmp_path / "hwc.npy", t)
    np.testing.assert_array_equal(p.quantized, np.load(models_dir / "inputs" / "cnn_classifier_11.q.npy"))
    assert any("batch" in n for n in p.notes)
    np.save(tmp_path / "chw.npy", x[0].transpose(2, 0, 1))
    with pytest.raises(InputDataError) as err:
        load_input(tmp_path / "chw.npy", t)
    assert "[3, 32, 32]" in str(err.value) and "[1, 32, 32, 3]" in str(err.value)


def test_int_npy_of_wrong_dtype_rejected(models_dir: Path, tmp_path: Path) -> None:
    t = _tensor(models_dir, "op_zoo")
    np.save(tmp_path / "i16.npy", np.zeros(t.shape, np.int16))
    with pytest.raises(InputDataError, match="int16"):
        load_input(tmp_path / "i16.npy", t)


def test_image_size_mismatch_and_resize_policies(models_dir: Path, tmp_path: Path) -> None:
    t = _tensor(models_dir, "cnn_classifier_11")
    big = tmp_path / "big.png"
    Image.fromarray(np.full((40, 64, 3), 200, np.uint8)).save(big)
    with pytest.raises(InputDataError) as err:
        load_input(big, t)
    assert "64x40" in str(err.value) and "[1, 32, 32, 3]" in str(err.value)
    for policy in ("stretch", "crop", "pad"):
        p = load_input(big, t, InputOptions(resize=policy))
        assert p.quantized.shape == (1, 32, 32, 3)
    stretched = load_input(big, t, InputOptions(resize="stretch"))
    assert np.all(stretched.quantized == stretched.quantized.flat[0])  # uniform image stays uniform
    padded = load_input(big, t, InputOptions(resize="pad"))
    assert padded.quantized[0, 0, 0, 0] == -128  # black letterbox border (real 0.0 -> zp)


def test_color_mode_checked(models_dir: Path) -> None:
    t = _tensor(models_dir, "cnn_classifier_11")
    with pytest.raises(InputDataError, match="grayscale"):
        load_input(models_dir / "inputs" / "cnn_classifier_11.png", t, InputOptions(color="grayscale"))


def test_named_ranges_and_scale_offset(models_dir: Path) -> None:
    t = _tensor(models_dir, "cnn_classifier_11")
    png = models_dir / "inputs" / "cnn_classifier_11.png"
    p = load_input(png, t, InputOptions(value_range="-1..1"))
    assert p.real is not None and p.real.min() >= -1.0 and p.real.max() <= 1.0 and p.real.min() < 0
    same = load_input(png, t, InputOptions(scale=1 / 255, offset=0.0))
    np.testing.assert_array_equal(same.quantized, np.load(models_dir / "inputs" / "cnn_classifier_11.q.npy"))
    with pytest.raises(InputDataError, match="not both"):
        InputOptions(value_range="0..1", scale=2.0)
    with pytest.raises(InputDataError):
        InputOptions(resize="zoom")


def test_raw_binary(models_dir: Path, tmp_path: Path) -> None:
    t = _tensor(models_dir, "op_zoo")
    q = np.load(models_dir / "inputs" / "op_zoo.q.npy")
    (tmp_path / "q.bin").write_bytes(q.tobytes())
    p = load_input(tmp_path / "q.bin", t, InputOptions(raw_dtype="int8"))
    assert p.prequantized
    np.testing.assert_array_equal(p.quantized, q)
    x = np.load(models_dir / "inputs" / "op_zoo.npy").astype("<f4")
    (tmp_path / "f.raw").write_bytes(x.tobytes())
    np.testing.assert_array_equal(
        load_input(tmp_path / "f.raw", t, InputOptions(raw_dtype="float32")).quantized, q
    )
    with pytest.raises(InputDataError, match="--input-dtype"):
        load_input(tmp_path / "f.raw", t)
    (tmp_path / "short.bin").write_bytes(q.tobytes()[:-3])
    with pytest.raises(InputDataError, match="672 elements"):
        load_input(tmp_path / "short.bin", t, InputOptions(raw_dtype="int8"))


def test_c_array_text(models_dir: Path, tmp_path: Path) -> None:
    t = _tensor(models_dir, "op_zoo")
    x = np.load(models_dir / "inputs" / "op_zoo.npy").ravel()
    q = np.load(models_dir / "inputs" / "op_zoo.q.npy")
    body = ",\n  ".join(f"{v:.9g}f" for v in x)
    src = tmp_path / "image.h"
    src.write_text(
        "// pasted from the sketch\n#pragma once\n/* 15x15x3 */\n"
        f"const float image[675] = {{\n  {body}\n}};\n"
    )
    p = load_input(src, t)
    np.testing.assert_array_equal(p.quantized, q)
    assert p.kind == "c-array"
    ints = tmp_path / "q.c"
    ints.write_text("static const int8_t input_q[] = {" + ", ".join(str(v) for v in q.ravel()) + "};")
    pq = load_input(ints, t)
    assert pq.prequantized
    np.testing.assert_array_equal(pq.quantized, q)
    short = tmp_path / "s.c"
    short.write_text("float image[] = {0.15, 0.2};")
    with pytest.raises(InputDataError, match="holds 2 elements"):
        load_input(short, t)
    (tmp_path / "none.txt").write_text("nothing here")
    with pytest.raises(InputDataError, match="no C array"):
        load_input(tmp_path / "none.txt", t)


def test_float_model_input_not_quantized(tmp_path: Path) -> None:
    t = TensorInfo(index=0, name="x", shape=(1, 4), dtype="float32", scale=None, zero_point=None)
    np.save(tmp_path / "x.npy", np.array([[0.1, 0.2, 0.3, 0.4]]))
    p = load_input(tmp_path / "x.npy", t)
    assert p.quantized.dtype == np.float32
    np.testing.assert_array_equal(p.quantized, np.array([[0.1, 0.2, 0.3, 0.4]], np.float32))


def test_unknown_format_and_missing_file(models_dir: Path, tmp_path: Path) -> None:
    t = _tensor(models_dir, "op_zoo")
    (tmp_path / "x.weird").write_bytes(b"\0")
    with pytest.raises(InputDataError, match="suffix"):
        load_input(tmp_path / "x.weird", t)
    with pytest.raises(InputDataError, match="not found"):
        load_input(tmp_path / "missing.npy", t)


def _png_header_only(path: Path, width: int, height: int) -> Path:
    """A PNG whose header says width x height, with a broken IDAT (decoding it fails).

    Built chunk by chunk like any PNG writer; refusing it by its header dimensions is the only way
    to say what is wrong with it, so the message proves nothing was decoded.
    """
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    idat = chunk(b"IDAT", b"\x78\x9c\x00\x00")
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + idat + chunk(b"IEND", b""))
    return path


@pytest.mark.parametrize("side", [14000, 9500])  # DecompressionBombError / only a warning in Pillow
@pytest.mark.parametrize("resize", ["error", "stretch"])
def test_huge_image_refused_from_its_header(models_dir: Path, tmp_path: Path, side: int, resize: str) -> None:
    t = _tensor(models_dir, "cnn_classifier_11")
    png = _png_header_only(tmp_path / "huge.png", side, side)
    with pytest.raises(InputDataError) as exc:
        load_input(png, t, InputOptions(resize=resize))
    if side == 14000:  # Pillow refuses it before esp-check sees the header
        assert "too large" in exc.value.message and "megapixels" in exc.value.message
    else:
        assert f"{side}x{side}" in exc.value.message


def test_image_size_mismatch_refused_before_decoding(models_dir: Path, tmp_path: Path) -> None:
    """Without --resize a wrong-size image is refused from its header (it would only be thrown away)."""
    t = _tensor(models_dir, "cnn_classifier_11")
    png = _png_header_only(tmp_path / "wrong.png", 33, 31)
    with pytest.raises(InputDataError, match=r"33x31 .*needs \d+x\d+"):
        load_input(png, t)


# ---- the default image range follows the input tensor's quantization ---------------------------------


def test_an_image_for_a_minus_one_to_one_model_is_read_as_minus_one_to_one(
    tmp_path: Path, models_dir: Path
) -> None:
    """op_zoo's input is quantized like TFLM's person_detect (scale 1/127.5, zero point -1): its real
    range is -1..1, so a black pixel is -1.0 (int8 -128), not 0.0 (int8 -1) as the 0..1 default made it."""
    from harness.model.inputs import default_image_range

    t = _tensor(models_dir, "op_zoo")
    assert default_image_range(t).name == "-1..1" and default_image_range(t).matched
    img = np.zeros((15, 15, 3), np.uint8)
    img[0, 0] = 255
    Image.fromarray(img).save(tmp_path / "x.png")
    p = load_input(tmp_path / "x.png", t)
    assert p.quantized.reshape(-1)[3] == -128 and p.quantized.reshape(-1)[0] == 126  # 1.0 / scale = 127.49...
    assert any("input range -1..1 by default" in n for n in p.notes)
    explicit = load_input(tmp_path / "x.png", t, InputOptions(value_range="0..1"))
    assert explicit.quantized.reshape(-1)[3] == -1  # --input-range still decides


def test_the_default_range_of_other_quantizations(models_dir: Path) -> None:
    from harness.model.inputs import default_image_range

    assert default_image_range(_tensor(models_dir, "cnn_classifier_11")).name == "0..1"  # 1/255, -128
    unet = default_image_range(_tensor(models_dir, "unet_mbv2_035_48"))  # spans 0..9.02: no named range
    assert unet.name == "0..1" and not unet.matched and "no named range fits" in unet.reason
    t255 = TensorInfo(0, "in", (1, 4), "int8", 1.0, -128)
    assert default_image_range(t255).name == "0..255"
    flt = TensorInfo(0, "in", (1, 4), "float32", None, None)
    assert default_image_range(flt).name == "0..1" and "assumed" in default_image_range(flt).reason


def test_inspect_says_which_range_it_uses(models_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from harness.cli import main

    assert main(["inspect", str(models_dir / "op_zoo.tflite"), "--no-arena"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "8-bit data (images) for input" in out and "is read as -1..1" in out
    assert main(["inspect", str(models_dir / "unet_mbv2_035_48.tflite"), "--no-arena", "--json"]) == 0
    rng = json.loads(capsys.readouterr().out)["inputs"][0]["image_range"]
    assert rng["name"] == "0..1" and rng["from_quantization"] is False
