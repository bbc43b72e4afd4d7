"""Regression tests for paths to a false match, a crash or a lost report (CLI and flow).

Real: the CLI (harness.cli.main / a subprocess of it), the protocol emitter and parser, the
comparison, the generated firmware, esptool against the simulated board. Faked: only the board
(``sim://``) where a run reaches it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from harness.cli import main
from harness.errors import ExitCode
from tests.test_compare import write_capture

ROOT = Path(__file__).parents[1]
MODELS = ROOT / "tests" / "data" / "models"
CNN = MODELS / "cnn_classifier_11.tflite"
CNN_IN = MODELS / "inputs" / "cnn_classifier_11__ambiguous.png"
UNET48 = MODELS / "unet_mbv2_035_48.tflite"  # one output of 48x48x1 = 2304 elements
OUT = [np.array([[-126, -128, -93, -67, -128, -54, -104, -125, -108, -93, -127]], dtype=np.int8)]


# ---- 1. numeric options are checked when parsed, before any work ------------------------------


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "-1"])
@pytest.mark.parametrize("flag", ["--tolerance-lsb", "--ref-tolerance-lsb"])
def test_flash_and_compare_refuses_bad_tolerance_before_any_work(
    tmp_path: Path, flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code = main(["flash-and-compare", str(CNN), "--input", str(CNN_IN), "--out", str(out), flag, value])
    assert code == ExitCode.USAGE
    assert not out.exists(), "nothing may be generated, built or flashed for a bad flag"
    assert flag in capsys.readouterr().err


@pytest.mark.parametrize(
    "args",
    [
        ["--capture-timeout", "nan"],
        ["--silence-timeout", "0"],
        ["--build-timeout", "inf"],
        ["--flash-baud", "0"],
        ["--arena-kb", "-4"],
        ["--input-scale", "nan"],
        ["--input-offset", "inf"],
    ],
)
def test_flash_and_compare_refuses_bad_numbers(tmp_path: Path, args: list[str]) -> None:
    out = tmp_path / "out"
    assert main(["flash-and-compare", str(CNN), "--input", str(CNN_IN), "--out", str(out), *args]) == 2
    assert not out.exists()


def test_compare_nan_tolerance_is_refused_not_a_match(tmp_path: Path) -> None:
    a = write_capture(tmp_path / "a.log", OUT, nn="optimized")
    b = write_capture(tmp_path / "b.log", [OUT[0] + 5], nn="ansi_c")
    assert main(["compare", str(a), str(b)]) == ExitCode.MISMATCH
    for bad in ("nan", "inf", "-1"):
        assert main(["compare", str(a), str(b), "--tolerance-lsb", bad]) == ExitCode.USAGE


def test_api_refuses_nan_tolerance() -> None:
    from harness.analysis.compare import OutputTensor, Source, compare_sources
    from harness.errors import UsageError

    t = OutputTensor(0, OUT[0], raw=True, shape=OUT[0].shape, dtype="int8", scale=0.5, zero_point=0)
    u = OutputTensor(0, OUT[0] + 9, raw=True, shape=OUT[0].shape, dtype="int8", scale=0.5, zero_point=0)
    a, b = Source("A", "npy", [[t]]), Source("B", "npy", [[u]])
    with pytest.raises(UsageError, match="finite"):
        compare_sources(a, b, tolerance_lsb=float("nan"))
    assert not compare_sources(a, b, tolerance_lsb=8).comparisons[0].match


# ---- 2. legacy logs are checked against the model -----------------------------------------------


def test_one_value_legacy_log_against_a_2304_output_model_is_incomplete(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("Output: 0.0\n")
    assert main(["compare", str(log), str(log), "--model", str(UNET48)]) == ExitCode.INFRASTRUCTURE


def test_legacy_logs_of_different_lengths_are_never_a_match(tmp_path: Path) -> None:
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text("Output: 0.5\nOutput: 0.25\n")
    b.write_text("Output: 0.5\n")
    assert main(["compare", str(a), str(b)]) == ExitCode.INFRASTRUCTURE


def test_full_legacy_log_is_split_into_the_model_outputs(tmp_path: Path) -> None:
    from harness.analysis.compare import compare_files

    values = (np.arange(2304) % 7) * 0.00390625
    log = tmp_path / "a.log"
    log.write_text("".join(f"Output: {v:.6f}\n" for v in values))
    result = compare_files(log, log, model=UNET48)
    assert result.exit_code == ExitCode.MATCH
    assert [c.count for c in result.comparisons] == [2304]


# ---- 3. compare refuses different inputs, models or outputs -------------------------------------


def test_different_input_hashes_are_refused_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = write_capture(tmp_path / "a.log", OUT, nn="optimized", input_bytes=b"\x01" * 4)
    b = write_capture(tmp_path / "b.log", [OUT[0] + 3], nn="ansi_c", input_bytes=b"\x02" * 4)
    assert main(["compare", str(a), str(b)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    import hashlib

    for raw in (b"\x01" * 4, b"\x02" * 4):
        assert hashlib.sha256(raw).hexdigest() in err
    assert "known symptom" not in err


def test_different_models_are_refused_naming_both(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_capture(tmp_path / "a.log", OUT, nn="optimized", model_sha="aa" * 32)
    b = write_capture(tmp_path / "b.log", OUT, nn="ansi_c", model_sha="bb" * 32)
    assert main(["compare", str(a), str(b)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "aa" * 32 in err and "bb" * 32 in err


def test_different_output_shapes_are_refused(tmp_path: Path) -> None:
    a = write_capture(tmp_path / "a.log", OUT, nn="optimized")
    b = write_capture(tmp_path / "b.log", [OUT[0].reshape(11, 1)], nn="ansi_c")
    assert main(["compare", str(a), str(b)]) == ExitCode.USAGE


# ---- 7. the report is written for input errors, Ctrl-C and refused --out -----------------------


def test_input_error_still_writes_the_report(tmp_path: Path) -> None:
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    out = tmp_path / "out"
    assert main(["flash-and-compare", str(CNN), "--input", str(bad), "--out", str(out)]) == ExitCode.USAGE
    doc = json.loads((out / "report.json").read_text())
    assert doc["verdict"] == "usage_error" and doc["exit_code"] == 2
    assert any("bad.png" in e for e in doc["errors"])


def test_out_blocked_by_a_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "out"
    blocker.write_text("a file")
    for out in (blocker, blocker / "sub"):
        assert main(["flash-and-compare", str(CNN), "--input", str(CNN_IN), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert "cannot write the artifact directory" in err or "is a file" in err


@pytest.mark.skipif(os.name != "posix", reason="SIGINT delivery to a child process")
def test_ctrl_c_exits_130_and_the_report_says_interrupted(tmp_path: Path) -> None:
    pytest.importorskip("tflite_micro")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "harness.cli", "flash-and-compare", str(CNN), "--input", str(CNN_IN)]
    cmd += ["--out", str(out), "--cache-dir", str(tmp_path / "cache")]
    # the simulated board's optimized app hangs after its input (fault=hang), so the run is still waiting
    # on it whenever the signal lands: a run that had already ended could not be interrupted (a whole
    # simulated run takes about a second, less than a loaded test machine may take to read a line)
    cmd += ["--board", "sim", "--port", "sim://ctrl-c?fault=hang&variant_fault=optimized"]

    # as a terminal's foreground job: SIGINT at its default. A test run started in the background of a
    # non-interactive shell (`.ci/run &`) has SIGINT ignored, which a child inherits (POSIX), and then Python
    # rightly installs no Ctrl-C handler: esp-check would not see the signal at all
    def sigint_default() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen(
        cmd, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, preexec_fn=sigint_default
    )
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:  # the user presses Ctrl-C while the optimized app runs
        seen.append(line)
        if "boot" in line and "optimized" in line:
            time.sleep(0.2)
            proc.send_signal(signal.SIGINT)
            break
    rest = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130, "".join(seen) + rest
    doc = json.loads((out / "report.json").read_text())
    assert doc["verdict"] == "interrupted" and doc["exit_code"] == 130


# ---- 8/9. ports are checked before any build ------------------------------------------------------


def test_simulated_board_refuses_a_real_port(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = main(["flash-and-compare", str(CNN), "--input", str(CNN_IN), "--board", "sim", "--port",
                 "/dev/ttyNOPE", "--out", str(out)])  # fmt: skip
    assert code == ExitCode.USAGE
    assert "not a simulator's port" in capsys.readouterr().err
    assert json.loads((out / "report.json").read_text())["verdict"] == "usage_error"
    assert not (out / "projects").exists()


@pytest.mark.parametrize("port", ["/dev/ttyUSB0", "COM3", "auto", "/dev/serial/by-id/usb-Silicon_Labs-if00"])
def test_simulated_board_refuses_every_device_path(tmp_path: Path, port: str) -> None:
    """A served simulator is reached by URL (rfc2217://, socket://); a device path is real hardware."""
    out = tmp_path / "out"
    code = main(["flash-and-compare", str(CNN), "--input", str(CNN_IN), "--board", "sim", "--port", port,
                 "--out", str(out)])  # fmt: skip
    assert code == ExitCode.USAGE and not (out / "projects").exists()


def _stream(sim: bool) -> bytes:
    from harness.protocol.emitter import make_emitter

    out = bytearray()
    e = make_emitter(out.extend, backend="python")
    e.begin("0.1.0", sim)
    e.info([("nn", "optimized"), ("target", "esp32s3")])
    e.end(True)
    return bytes(out)


@pytest.mark.parametrize(("device_sim", "board_sim"), [(False, True), (True, False)])
def test_device_that_is_not_what_the_board_says_is_never_a_result(device_sim: bool, board_sim: bool) -> None:
    """--board sim in front of real hardware (BEGIN without sim=1) is not silently reported as simulated,
    and a simulator behind a real board's name is not reported as hardware: usage error, outputs unused."""
    from harness.flows.capture import verdict_evidence
    from harness.protocol.capture import parse_capture

    cap = parse_capture(_stream(device_sim))
    assert cap.simulated == device_sim  # (an incomplete stream: the identity check comes first)
    code, detail, keep = verdict_evidence("optimized", cap, [], "end_record", board_sim)
    assert code == ExitCode.USAGE and not keep
    assert ("sim=1" in detail) and ("simulated board" if board_sim else "real board") in detail
    assert verdict_evidence("optimized", cap, [], "end_record", device_sim)[0] != ExitCode.USAGE  # consistent


def test_real_board_with_a_missing_port_fails_before_building(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    t0 = time.monotonic()
    code = main(["flash-and-compare", str(CNN), "--input", str(CNN_IN), "--board", "esp32s3-devkitc-1-n8r8",
                 "--port", "/dev/ttyNOPE", "--out", str(out)])  # fmt: skip
    assert code == ExitCode.INFRASTRUCTURE
    err = capsys.readouterr().err
    assert err.count("/dev/ttyNOPE") >= 1 and "--platformio-core-dir" not in err
    assert err.count("error:") == 1, err
    assert not (out / "projects").exists(), "no build may start before the port is known to exist"
    assert time.monotonic() - t0 < 30
    doc = json.loads((out / "report.json").read_text())
    assert doc["verdict"] == "infrastructure_error"


# ---- 11. text from a model or a device never drives the terminal ---------------------------------

HOSTILE = "[link=https://evil.example]x[/link]\x1b]52;c;aGVsbG8=\x07\x1b]0;pwned\x07[bold red]y"


def _hostile_model(tmp_path: Path) -> Path:
    from tests.test_model_builder import Op, T, build_model

    data = build_model(
        [T(HOSTILE, (1, 4), "float32"), T("b", (1, 4), "float32"), T(HOSTILE + "out", (1, 4), "float32")],
        [Op(0, [0, 1], [2], add_options=True)],  # ADD
        inputs=[0, 1],
        outputs=[2],
    )
    path = tmp_path / "hostile.tflite"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("command", ["inspect", "reference"])
def test_model_text_is_escaped_not_interpreted(tmp_path: Path, command: str) -> None:
    model = _hostile_model(tmp_path)
    args = [sys.executable, "-m", "harness.cli", command, str(model)]
    if command == "reference":
        pytest.importorskip("tflite_micro")
        for k in range(2):
            np.save(tmp_path / f"in{k}.npy", np.full((1, 4), 0.5, dtype=np.float32))
        args += ["--input", str(tmp_path / "in0.npy"), "--input", str(tmp_path / "in1.npy")]
    env = dict(os.environ, TERM="xterm-256color", FORCE_COLOR="1", COLUMNS="200")
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout
    assert b"\x1b]52" not in out and b"\x1b]0;" not in out and b"\x07" not in out
    assert b"\x1b]8;" not in out, "a model-supplied [link=...] must not become a terminal hyperlink"
    text = out.decode("utf-8", "replace")
    assert "[link=https://evil.example]" in text and "\\x1b]52" in text


# ---- 12. smaller defects ---------------------------------------------------------------------------


def test_bundle_keeps_two_inputs_with_the_same_file_name(tmp_path: Path) -> None:
    import types
    import zipfile

    from harness.analysis.html_report import write_bundle

    inputs = []
    for k in range(2):
        d = tmp_path / f"set{k}"
        d.mkdir()
        (d / "img.png").write_bytes(bytes([k]) * 8)
        inputs.append(d / "img.png")
    doc = {"verdict": "match", "exit_code": 0, "board": "sim", "variants": {}}
    result = types.SimpleNamespace(out_dir=tmp_path / "out")
    dest = write_bundle(result, doc, CNN, inputs, tmp_path / "b.zip", None)
    with zipfile.ZipFile(dest) as z:
        names = z.namelist()
        assert len(names) == len(set(names)), names
        assert z.read("inputs/0/img.png") == b"\x00" * 8 and z.read("inputs/1/img.png") == b"\x01" * 8
        readme = z.read("README.txt").decode()
    assert "--input inputs/0/img.png --input inputs/1/img.png" in readme


def test_float_model_is_refused_unless_allow_untested(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model with no op ESP-NN accelerates is exit 2 (not a CI-passing "match"); --allow-untested runs
    it and the verdict says ESP-NN was not tested. Nothing is faked: the simulated board runs it."""
    pytest.importorskip("tflite_micro")
    from tests.test_model_builder import Op, T, build_model

    const = np.array([[0.5, -1.0, 2.0, 0.25]], dtype=np.float32)
    data = build_model(
        [T("x", (1, 4), "float32"), T("c", (1, 4), "float32", data=const), T("y", (1, 4), "float32")],
        [Op(0, [0, 1], [2], add_options=True)],  # ADD: float, so no ESP-NN kernel on any chip
        inputs=[0],
        outputs=[2],
    )
    model = tmp_path / "float_add.tflite"
    model.write_bytes(data)
    np.save(tmp_path / "x.npy", np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32))
    out = tmp_path / "out"
    args = ["flash-and-compare", str(model), "--input", str(tmp_path / "x.npy"), "--out", str(out),
            "--cache-dir", str(tmp_path / "cache")]  # fmt: skip
    assert main(args) == ExitCode.USAGE
    refused = capsys.readouterr()
    assert "accelerates none" in refused.err and "--allow-untested" in refused.err
    assert json.loads((out / "report.json").read_text())["verdict"] == "usage_error"
    code = main([*args, "--allow-untested"])
    captured = capsys.readouterr()
    assert code == ExitCode.MATCH
    assert "ESP-NN NOT TESTED" in captured.out + captured.err
    doc = json.loads((out / "report.json").read_text())
    assert doc["espnn"]["accelerated_ops"] == 0 and doc["espnn"]["ops"] == 1
    assert any("accelerates none" in w for w in doc["warnings"])
