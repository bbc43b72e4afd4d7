"""harness.model.loader: parsing the fixture models and rejecting broken or unsupported ones cleanly."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from test_model_builder import ADD, CONV_2D, CUSTOM, LSH_PROJECTION, Op, T, build_model

from harness.errors import ExitCode, ModelError
from harness.model.loader import load_model, parse_model_bytes

FIXTURES = ["unet_mbv2_035_128", "unet_mbv2_035_64", "unet_mbv2_035_48", "cnn_classifier_11", "op_zoo"]


@pytest.fixture(scope="module")
def zoo(models_dir: Path):  # type: ignore[no-untyped-def]
    return load_model(models_dir / "op_zoo.tflite")


@pytest.mark.parametrize("name", ["unet_mbv2_035_128", "unet_mbv2_035_64", "unet_mbv2_035_48"])
def test_unet_ops_match_readme(models_dir: Path, name: str) -> None:
    info = load_model(models_dir / f"{name}.tflite")
    assert info.op_counts() == {
        "CONV_2D": 36,
        "DEPTHWISE_CONV_2D": 13,
        "ADD": 8,
        "RESIZE_NEAREST_NEIGHBOR": 4,
        "CONCATENATION": 4,
        "LOGISTIC": 1,
    }
    assert len(info.ops) == 66
    assert info.kind == "int8"
    out = info.outputs[0]
    assert out.dtype == "int8" and out.scale == pytest.approx(0.00390625) and out.zero_point == -128
    assert info.inputs[0].zero_point == -128


def test_input_scales_match_readme(models_dir: Path) -> None:
    expected = {
        "unet_mbv2_035_128": 0.039007,
        "unet_mbv2_035_64": 0.0345189,
        "unet_mbv2_035_48": 0.0353871,
        "cnn_classifier_11": 0.00392157,
        "op_zoo": 0.00784314,
    }
    for name, scale in expected.items():
        info = load_model(models_dir / f"{name}.tflite")
        assert info.inputs[0].scale == pytest.approx(scale, rel=1e-5), name
        assert info.size_bytes == (models_dir / f"{name}.tflite").stat().st_size


def test_classifier_ops_in_order(models_dir: Path) -> None:
    info = load_model(models_dir / "cnn_classifier_11.tflite")
    assert info.op_counts() == {
        "CONV_2D": 6,
        "MAX_POOL_2D": 1,
        "DEPTHWISE_CONV_2D": 2,
        "ADD": 1,
        "MUL": 1,
        "AVERAGE_POOL_2D": 2,
        "FULLY_CONNECTED": 1,
        "SOFTMAX": 1,
    }
    assert info.ops[0].opcode == "CONV_2D" and info.ops[-1].opcode == "SOFTMAX"
    assert [op.index for op in info.ops] == list(range(15))
    assert info.outputs[0].shape == (1, 11)


def test_op_zoo_two_outputs_and_options(zoo) -> None:  # type: ignore[no-untyped-def]
    assert [o.shape for o in zoo.outputs] == [(1, 8, 8, 13), (1, 13)]
    assert zoo.outputs[0].scale == pytest.approx(0.00406373, rel=1e-5) and zoo.outputs[0].zero_point == 2
    assert len(zoo.ops) == 23 and len(zoo.distinct_ops) == 15
    dilated = [op for op in zoo.ops if op.options.get("dilation_h_factor") == 2]
    assert {op.opcode for op in dilated} == {"CONV_2D", "DEPTHWISE_CONV_2D"}
    assert any(op.options.get("depth_multiplier") == 3 for op in zoo.ops)
    assert zoo.ops[0].options["padding"] in ("SAME", "VALID")
    strides = {op.options.get("stride_w") for op in zoo.ops if op.opcode == "CONV_2D"}
    assert 2 in strides and 1 in strides


def test_per_channel_weights_detected(zoo) -> None:  # type: ignore[no-untyped-def]
    conv = next(op for op in zoo.ops if op.opcode == "CONV_2D")
    weights = zoo.tensors[conv.inputs[1]]
    assert weights.per_channel and len(weights.scales) == weights.shape[0]
    assert weights.is_constant and not zoo.tensors[conv.outputs[0]].is_constant


def test_deprecated_builtin_code_only() -> None:
    # Older converters (e.g. TFLM's person_detect) store the op only in deprecated_builtin_code.
    data = build_model(
        [T("x", (1, 4), "float32"), T("y", (1, 4), "float32"), T("z", (1, 4), "float32")],
        [Op(0, [0, 1], [2], deprecated=ADD + 18, add_options=True)],  # 18 = MUL
        inputs=[0, 1],
        outputs=[2],
    )
    assert parse_model_bytes(data).ops[0].opcode == "MUL"


def test_builtin_code_above_127_wins_over_placeholder() -> None:
    # New ops: builtin_code > 127, deprecated_builtin_code = 127 (the placeholder).
    data = build_model(
        [T("x", (1, 4), "float32"), T("y", (1, 4), "float32")],
        [Op(130, [0], [1], deprecated=127)],  # 130 = BROADCAST_TO (TFLM supports it)
        inputs=[0],
        outputs=[1],
    )
    assert parse_model_bytes(data).ops[0].opcode == "BROADCAST_TO"
    # 132 = CONV_3D: TFLM has no kernel for it -> named in the error
    data = build_model(
        [T("x", (1, 4), "float32"), T("y", (1, 4), "float32")],
        [Op(132, [0], [1], deprecated=127)],
        inputs=[0],
        outputs=[1],
    )
    with pytest.raises(ModelError, match=r"op 0 \(CONV_3D\)"):
        parse_model_bytes(data)


def test_unsupported_op_names_op_and_index() -> None:
    data = build_model(
        [T("x", (1, 4), "float32"), T("y", (1, 4), "float32"), T("z", (1, 4), "float32")],
        [Op(ADD, [0, 0], [1], add_options=True), Op(LSH_PROJECTION, [1], [2])],
        inputs=[0],
        outputs=[2],
    )
    with pytest.raises(ModelError) as err:
        parse_model_bytes(data, "m.tflite")
    assert "op 1" in str(err.value) and "LSH_PROJECTION" in str(err.value)
    assert err.value.exit_code == ExitCode.USAGE and err.value.hint


def test_unknown_custom_op_is_named() -> None:
    data = build_model(
        [T("x", (1, 4), "float32"), T("y", (1, 4), "float32")],
        [Op(CUSTOM, [0], [1], custom="MyFancyOp")],
        inputs=[0],
        outputs=[1],
    )
    with pytest.raises(ModelError, match="MyFancyOp"):
        parse_model_bytes(data)


def test_known_custom_op_accepted() -> None:
    data = build_model(
        [T("x", (1, 4), "float32"), T("y", (1, 4), "float32")],
        [Op(CUSTOM, [0], [1], custom="TFLite_Detection_PostProcess")],
        inputs=[0],
        outputs=[1],
    )
    op = parse_model_bytes(data).ops[0]
    assert op.opcode == "CUSTOM" and op.custom_code == "TFLite_Detection_PostProcess"


def test_bad_tensor_index_rejected() -> None:
    data = build_model(
        [T("x", (1, 4), "float32"), T("y", (1, 4), "float32")],
        [Op(CONV_2D, [0, 7], [1])],
        inputs=[0],
        outputs=[1],
    )
    with pytest.raises(ModelError, match="tensor 7"):
        parse_model_bytes(data)


@pytest.mark.parametrize("name", ["cnn_classifier_11", "op_zoo"])
def test_every_truncation_is_a_model_error(models_dir: Path, name: str) -> None:
    data = (models_dir / f"{name}.tflite").read_bytes()
    cuts = [*range(0, len(data), 211), len(data) - 1, len(data) - 4]
    for cut in cuts:
        with pytest.raises(ModelError):
            parse_model_bytes(data[:cut], "cut.tflite")


def test_random_corruption_never_escapes_as_other_exception(models_dir: Path) -> None:
    data = (models_dir / "op_zoo.tflite").read_bytes()
    rnd = random.Random(7)
    accepted = rejected = 0
    for _ in range(200):
        b = bytearray(data)
        for _ in range(6):
            b[rnd.randrange(len(b))] = rnd.randrange(256)
        try:
            parse_model_bytes(bytes(b))
            accepted += 1  # flipped weight bytes are undetectable without a checksum
        except ModelError:
            rejected += 1
    assert rejected > 0 and accepted + rejected == 200


@pytest.mark.parametrize(
    ("content", "phrase"),
    [
        (b"", "too short"),
        (b"\x89HDF\r\n\x1a\n" + bytes(64), "HDF5"),
        (b"PK\x03\x04" + bytes(64), "ZIP"),
        (b"unsigned char model_tflite[] = {0x1c, 0x00};\n" * 3, "C source"),
        (bytes(range(256)), "TFL3"),
    ],
)
def test_non_tflite_files(tmp_path: Path, content: bytes, phrase: str) -> None:
    p = tmp_path / "model.tflite"
    p.write_bytes(content)
    with pytest.raises(ModelError) as err:
        load_model(p)
    assert phrase in str(err.value)
    assert str(p) in str(err.value)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="not found"):
        load_model(tmp_path / "nope.tflite")
    with pytest.raises(ModelError, match="directory"):
        load_model(tmp_path)


def test_sha256_and_tensor_sizes(models_dir: Path) -> None:
    import hashlib

    p = models_dir / "cnn_classifier_11.tflite"
    info = load_model(p)
    assert info.sha256 == hashlib.sha256(p.read_bytes()).hexdigest()
    assert info.inputs[0].nbytes == 32 * 32 * 3
    assert info.tensor(info.inputs[0].index) == info.inputs[0]
    assert np.dtype(info.outputs[0].dtype) == np.int8
