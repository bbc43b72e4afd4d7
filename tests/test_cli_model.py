"""`esp-check inspect` and `esp-check reference` in-process (harness.cli.main), real TFLM and LiteRT."""

from __future__ import annotations

import json
import platform
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from harness.cli import main

ON_TFLM_PLATFORM = sys.platform == "linux" and platform.machine() == "x86_64"
needs_tflm = pytest.mark.skipif(
    not ON_TFLM_PLATFORM, reason="tflite-micro wheels exist only for Linux x86-64"
)


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:  # type: ignore[type-arg]
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


def test_inspect_json_op_zoo(models_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(capsys, ["inspect", str(models_dir / "op_zoo.tflite"), "--json", "--no-arena"])
    assert data["schema"] == "esp-check.inspect/1"
    assert data["model"]["size_bytes"] == 13_888 and data["model"]["kind"] == "int8"
    assert len(data["ops"]) == 23 and data["op_counts"]["CONV_2D"] == 5
    assert [o["shape"] for o in data["outputs"]] == [[1, 8, 8, 13], [1, 13]]
    assert data["outputs"][0]["zero_point"] == 2
    assert data["resolver"]["methods"][0] == "AddConv2D" and len(data["resolver"]["methods"]) == 15
    chips = data["espnn"]["chips"]
    assert set(chips) == {"esp32", "esp32s3", "esp32p4"}
    assert chips["esp32s3"]["accelerated_ops"] == 10 and chips["esp32"]["accelerated_ops"] == 6
    reasons = {o["index"]: o["reason"] for o in chips["esp32s3"]["ops"]}
    assert "dilation" in reasons[6] and "depth 13" in reasons[8]
    assert data["arena"] is None


@needs_tflm
def test_inspect_human_with_input_and_arena(models_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "inspect",
            str(models_dir / "cnn_classifier_11.tflite"),
            "--chip",
            "esp32s3",
            "--input",
            str(models_dir / "inputs" / "cnn_classifier_11.png"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    for needle in (
        "AddConv2D",
        "AddSoftmax",
        "FULLY_CONNECTED",
        "esp32s3",
        "25,952 B (measured)",
        "truncating cast",
        "0.0039215689",
        "serving_default_input:0",
    ):
        assert needle in out, needle
    assert "ESP-NN on esp32s3" in out and "ESP-NN on esp32p4" not in out  # --chip limits the chips shown


@needs_tflm
def test_inspect_json_quantization_report(models_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from harness.model.inputs import load_input
    from harness.model.loader import load_model

    png = models_dir / "inputs" / "cnn_classifier_11__ambiguous.png"
    data = _json(
        capsys,
        [
            "inspect",
            str(models_dir / "cnn_classifier_11.tflite"),
            "--json",
            "--chip",
            "esp32",
            "--input",
            str(png),
        ],
    )
    (run,) = data["input_files"]
    direct = load_input(png, load_model(models_dir / "cnn_classifier_11.tflite").inputs[0])
    assert run[0]["truncating_cast"] == asdict(direct.report)
    assert run[0]["sha256"] == direct.sha256
    assert data["arena"]["method"] == "measured" and data["arena"]["chip"] == "esp32"
    assert data["arena"]["host_bytes"] == 25_952


def test_inspect_says_which_espnn_scratch_formulas(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_model_builder import padded_conv_model

    model = tmp_path / "padded_conv.tflite"
    model.write_bytes(padded_conv_model())
    assert main(["inspect", str(model), "--chip", "esp32s3"]) == 0
    out = capsys.readouterr().out
    assert "ESP-NN scratch: esp-nn 1.1.2: scratch formulas of set 1.1" in " ".join(out.split())
    data = _json(capsys, ["inspect", str(model), "--chip", "esp32s3", "--esp-nn-version", "1.2.3", "--json"])
    assert data["arena"]["espnn_version"] == "1.2.3" and data["arena"]["espnn_scratch_bytes"] == 704
    assert "set 1.2.3" in data["arena"]["espnn_formulas"]
    data = _json(capsys, ["inspect", str(model), "--chip", "esp32s3", "--esp-nn-version", "2.0.0", "--json"])
    assert data["arena"]["espnn_scratch_bytes"] == 31212 and "largest" in data["arena"]["espnn_formulas"]
    # `$` matched before a final newline: "1.2.3\\n" took set 1.2.3's formulas, as if it were 1.2.3
    args = ["inspect", str(model), "--chip", "esp32s3", "--json"]
    data = _json(capsys, [*args, "--esp-nn-version", "1.2.3\n"])
    assert data["arena"]["espnn_scratch_bytes"] == 31212 and "largest" in data["arena"]["espnn_formulas"]
    # the user's version string reaches the console literally, never as rich markup
    assert main(["inspect", str(model), "--chip", "esp32s3", "--esp-nn-version", "[red]9[/red]"]) == 0
    assert "esp-nn [red]9[/red] is not a version" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("kind", ["truncated", "corrupted", "text", "empty", "missing"])
def test_inspect_bad_models_exit_2(
    models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    data = (models_dir / "cnn_classifier_11.tflite").read_bytes()
    p = tmp_path / f"{kind}.tflite"
    if kind == "truncated":
        p.write_bytes(data[: len(data) * 2 // 3])
    elif kind == "corrupted":
        p.write_bytes(data[:4] + b"XXXX" + data[8:])
    elif kind == "text":
        p.write_text("this is not a model\n")
    elif kind == "empty":
        p.write_bytes(b"")
    code = main(["inspect", str(p), "--no-arena"])
    err = capsys.readouterr().err
    assert code == 2
    assert "error:" in err and str(p) in err and "Traceback" not in err


def test_inspect_unknown_chip_exit_2(models_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(models_dir / "op_zoo.tflite"), "--chip", "stm32", "--no-arena"]) == 2
    assert "unknown chip" in capsys.readouterr().err


def test_inspect_input_shape_mismatch_exit_2(models_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "inspect",
            str(models_dir / "op_zoo.tflite"),
            "--no-arena",
            "--input",
            str(models_dir / "inputs" / "cnn_classifier_11.npy"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "[1, 32, 32, 3]" in err and "[1, 15, 15, 3]" in err


@needs_tflm
def test_reference_json_bit_exact(models_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(
        capsys,
        [
            "reference",
            str(models_dir / "cnn_classifier_11.tflite"),
            "--json",
            "--input",
            str(models_dir / "inputs" / "cnn_classifier_11__ambiguous.png"),
        ],
    )
    assert data["schema"] == "esp-check.reference/1"
    assert data["backend"] == "tflm" and data["backend_version"].startswith("tflite-micro 0.dev")
    assert data["authoritative"] is True
    (run,) = data["runs"]
    out = run["outputs"][0]
    want = np.load(models_dir / "expected" / "cnn_classifier_11__ambiguous.out0.npy")
    assert out["raw"] == want.ravel().tolist()
    assert out["dequantized"] == pytest.approx(((want.astype(float) + 128) / 256).ravel().tolist())
    assert run["layers"] is None


@needs_tflm
def test_reference_per_layer_and_save_npy(
    models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "npy"
    code = main(
        [
            "reference",
            str(models_dir / "op_zoo.tflite"),
            "--per-layer",
            "--save-npy",
            str(out_dir),
            "--input",
            str(models_dir / "inputs" / "op_zoo.npy"),
        ]
    )
    text = capsys.readouterr().out
    assert code == 0
    assert "per layer" in text and "SOFTMAX" in text
    for k in range(2):
        np.testing.assert_array_equal(
            np.load(out_dir / f"run0.out{k}.npy"), np.load(models_dir / "expected" / f"op_zoo.out{k}.npy")
        )
    assert len(list(out_dir.glob("run0.op*.npy"))) == 23


@needs_tflm
def test_reference_two_runs(models_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inputs = models_dir / "inputs"
    data = _json(
        capsys,
        [
            "reference",
            str(models_dir / "cnn_classifier_11.tflite"),
            "--json",
            "--per-layer",
            "--input",
            str(inputs / "cnn_classifier_11.q.npy"),
            "--input",
            str(inputs / "cnn_classifier_11__ambiguous.q.npy"),
        ],
    )
    assert len(data["runs"]) == 2
    assert data["runs"][0]["outputs"][0]["raw"] != data["runs"][1]["outputs"][0]["raw"]
    assert len(data["runs"][1]["layers"]) == 15
    assert all(len(la["crc32"]) == 8 for la in data["runs"][1]["layers"])


@needs_tflm
def test_reference_litert_names_the_op_where_it_differs(
    models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _json(
        capsys,
        [
            "reference",
            str(models_dir / "cnn_classifier_11.tflite"),
            "--json",
            "--per-layer",
            "--backend",
            "litert",
            "--input",
            str(models_dir / "inputs" / "cnn_classifier_11__ambiguous.q.npy"),
        ],
    )
    assert data["backend"] == "litert" and data["authoritative"] is False
    assert [(d["op_index"], d["opcode"]) for d in data["backend_disagreements"]] == [(13, "FULLY_CONNECTED")]
    want = np.load(models_dir / "expected" / "cnn_classifier_11__ambiguous.out0.npy")
    assert data["runs"][0]["outputs"][0]["raw"] == want.ravel().tolist()


def test_reference_without_input_exit_2(models_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reference", str(models_dir / "op_zoo.tflite")]) == 2
    assert "--input" in capsys.readouterr().err


def test_reference_without_tflm_exit_3(
    no_tflm_wheel: None, models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Faked (no_tflm_wheel): the wheel's absence.
    code = main(
        [
            "reference",
            str(models_dir / "op_zoo.tflite"),
            "--input",
            str(models_dir / "inputs" / "op_zoo.q.npy"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 3 and "Linux x86-64" in err and "--backend litert" in err


def test_reference_truncated_model_exit_2(
    models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "cut.tflite"
    p.write_bytes((models_dir / "op_zoo.tflite").read_bytes()[:5000])
    code = main(["reference", str(p), "--input", str(models_dir / "inputs" / "op_zoo.q.npy")])
    assert code == 2 and "truncated" in capsys.readouterr().err


@needs_tflm
def test_float_two_input_model_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from test_model_builder import float_add_model

    model = tmp_path / "add.tflite"
    model.write_bytes(float_add_model())
    np.save(tmp_path / "a.npy", np.array([[1.0, 2.0, 3.0, 4.0]], np.float32))
    np.save(tmp_path / "b.npy", np.array([[0.5, 0.5, -4.0, 0.0]], np.float32))
    info = _json(
        capsys,
        [
            "inspect",
            str(model),
            "--json",
            "--input",
            str(tmp_path / "a.npy"),
            "--input",
            str(tmp_path / "b.npy"),
        ],
    )
    assert info["model"]["kind"] == "float" and len(info["inputs"]) == 2
    assert info["arena"]["method"] == "measured"
    assert [p["tensor"] for p in info["input_files"][0]] == ["a", "b"]
    ref = _json(
        capsys,
        [
            "reference",
            str(model),
            "--json",
            "--input",
            str(tmp_path / "a.npy"),
            "--input",
            str(tmp_path / "b.npy"),
        ],
    )
    assert ref["runs"][0]["outputs"][0]["raw"] == [1.5, 2.5, -1.0, 4.0]
    # three files for a two-input model: refused, not guessed
    code = main(
        [
            "reference",
            str(model),
            "--input",
            str(tmp_path / "a.npy"),
            "--input",
            str(tmp_path / "b.npy"),
            "--input",
            str(tmp_path / "a.npy"),
        ]
    )
    assert code == 2 and "2 files per run" in capsys.readouterr().err
