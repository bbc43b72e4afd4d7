"""Acceptance on the simulated board: ``flash-and-compare --tap`` names the op that goes wrong.

Real here: generated projects (with the tap tables), the sim builder's app image, esptool flashing over a
pyserial port, the console capture, the protocol parser (tap records included), the TFLM per-layer host
reference and the tap analysis. Faked: the board (``sim://``), which injects the op-level fault and
models how it propagates to later ops (harness/sim/tap_sim.py). The simulator never prints where it
injected the fault: the op index and region below are found from the device's records alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.cli import main
from harness.errors import ExitCode
from harness.flows.flash_and_compare import flash_and_compare
from harness.flows.job import JobOptions
from harness.flows.records import StageTimeouts

pytest.importorskip("tflite_micro")

MODEL = "unet_mbv2_035_48.tflite"
INPUT = "inputs/unet_mbv2_035_48.png"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tap-build-cache")


def run_tap(models_dir: Path, out: Path, cache_dir: Path, query: str, **kw: object):  # type: ignore[no-untyped-def]
    return flash_and_compare(
        models_dir / MODEL,
        [models_dir / INPUT],
        board="sim",
        port=f"sim://?{query}" if query else None,
        out_dir=out,
        **kw,
        options=JobOptions(
            cache_dir=cache_dir, timeouts=StageTimeouts(capture_total=60, capture_silence=5), tap=True
        ),
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("k", "opcode", "region", "expect"),
    [
        (4, "DEPTHWISE_CONV_2D", "last_row", "last row only"),
        (17, "CONV_2D", "last_row", "last row only"),
        (27, "ADD", "last_col", "last column only"),
        (52, "RESIZE_NEAREST_NEIGHBOR", "first_row", "first row only"),
    ],
)
def test_tap_names_op_opcode_and_region(
    models_dir: Path, tmp_path: Path, cache_dir: Path, k: int, opcode: str, region: str, expect: str
) -> None:
    q = f"fault=op_corrupt&fault_op={k}&fault_region={region}&variant_fault=optimized&corrupt_lsb=2"
    result = run_tap(models_dir, tmp_path / "out", cache_dir, q)
    assert result.exit_code == ExitCode.MISMATCH  # the final outputs differ too
    tap = result.tap
    assert tap is not None and not tap.problems and not tap.findings, (tap.problems, tap.findings)
    culprit = tap.culprit
    assert culprit is not None
    assert (culprit.a, culprit.b) == ("optimized", "ansi")
    assert (culprit.op, culprit.opcode, culprit.kind) == (k, opcode, "output")
    row = tap.runs[0]
    assert row["optimized_vs_host"].op == k and row["ansi_vs_host"].op is None  # ANSI C is the good one
    assert tap.dump_ops == [k]
    out_vs_ansi = [d for d in tap.dumps if d.op == k and d.role == "out" and d.against == "ansi"]
    assert out_vs_ansi and out_vs_ansi[0].region.startswith(expect), out_vs_ansi[0].region
    assert out_vs_ansi[0].max_lsb == 2 and set(out_vs_ansi[0].lsb_histogram) <= {2, -2}
    ins = [d for d in tap.dumps if d.op == k and d.role == "in"]
    assert ins and all(d.differing == 0 for d in ins)  # its inputs were fine: op k itself is wrong
    doc = json.loads(result.report_path.read_text())
    assert doc["tap"]["culprit"]["op"] == k and doc["tap"]["culprit"]["opcode"] == opcode
    assert any(expect in line for line in doc["tap"]["summary"])


@pytest.mark.slow
def test_tap_reports_clobbered_input_not_the_reader(
    models_dir: Path, tmp_path: Path, cache_dir: Path
) -> None:
    # op 53 (CONCATENATION) reads tensor 113, written by op 10; the fault overwrites it in between
    q = "fault=op_clobber&fault_op=53&fault_region=last_col&variant_fault=optimized"
    result = run_tap(models_dir, tmp_path / "out", cache_dir, q)
    culprit = result.tap.culprit
    assert culprit is not None
    assert (culprit.op, culprit.kind, culprit.tensor, culprit.producer) == (53, "clobbered_input", 113, 10)
    assert "overwritten between op 10 and op 53" in culprit.message
    assert result.tap.dump_ops == [10, 53]
    by = {(d.op, d.tensor, d.role, d.against): d for d in result.tap.dumps}
    assert by[(10, 113, "out", "host")].differing == 0  # the producer wrote the right values ...
    clob = by[(53, 113, "in", "host")]  # ... and they were changed before op 53 read them
    assert clob.differing > 0 and clob.region.startswith("last column only")


@pytest.mark.slow
def test_clean_tapped_run_via_cli_matches_and_times_ops(
    models_dir: Path, tmp_path: Path, cache_dir: Path
) -> None:
    out = tmp_path / "out"
    code = main(["flash-and-compare", str(models_dir / MODEL), "--input", str(models_dir / INPUT),
                 "--tap", "--out", str(out), "--cache-dir", str(cache_dir), "--capture-timeout", "60",
                 "--silence-timeout", "5"])  # fmt: skip
    assert code == ExitCode.MATCH
    doc = json.loads((out / "report.json").read_text())
    tap = doc["tap"]
    assert tap["culprit"] is None and tap["problems"] == tap["findings"] == [] and tap["dump_ops"] == []
    assert all(r[k]["op"] is None for r in tap["runs"] for k in ("optimized_vs_ansi", "optimized_vs_host"))
    assert len(tap["timing"]["ops"]) == 66
    conv = tap["timing"]["by_type"]["CONV_2D"]
    assert conv["count"] == 36 and conv["us"]["optimized"] > 0 and conv["speedup"] > 1
    assert tap["ram_bytes"]["optimized"] == 36 * 66  # records only: nothing dumped
    # the tapped firmware printed INFO tap=1 and one OP record per op
    log = (out / "logs" / "serial-optimized.log").read_bytes()
    assert b" tap=1 " in log and log.count(b" OP i=0 ") == 66


def test_output_crc_check_catches_a_tap_that_changed_outputs(models_dir: Path) -> None:
    """check_outputs_untouched compares the last OP record's CRC with the TENSOR record's CRC."""
    from harness.analysis.tap import check_outputs_untouched
    from harness.protocol.capture import parse_capture
    from harness.protocol.emitter import PythonEmitter, TapTensor

    def cap(out_crc: int) -> bytes:
        lines: list[bytes] = []
        em = PythonEmitter(lines.append)
        em.begin("0.1.0", True)
        em.info([("nn", "optimized"), ("target", "esp32s3"), ("chip", "esp32s3"), ("rev", "0.2"),
                 ("cores", 2), ("cpu_mhz", 240), ("idf", "v5"), ("tflm", "1"), ("espnn", "1")])  # fmt: skip
        em.info([("model_sha256", "ab" * 32), ("model_bytes", 1), ("inputs", 1), ("outputs", 1), ("tap", 1)])
        em.input(0, 1, "cd" * 32)
        em.time(0, 5)
        data = np.array([1, 2], np.int8).tobytes()
        em.tensor(0, 0, "int8", (2,), 1.0, 0, data, "", 0)
        em.op(0, 0, 0, "LOGISTIC", 10, [TapTensor(0, (2,), 1)], [TapTensor(9, (2,), out_crc)])
        em.op_end(0, 1, 0, 36)
        em.end(True)
        return b"".join(lines)

    import zlib

    good = parse_capture(cap(zlib.crc32(np.array([1, 2], np.int8).tobytes())))
    assert good.valid and check_outputs_untouched(good.runs[0], [9]) == []
    bad = parse_capture(cap(0x12345678))
    assert bad.valid
    (problem,) = check_outputs_untouched(bad.runs[0], [9])
    assert "printed 12345678" in problem


@pytest.mark.slow
def test_cli_prints_op_opcode_region_and_report_fits_schema(
    models_dir: Path, tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    out = tmp_path / "out"
    port = "sim://?fault=op_corrupt&fault_op=17&fault_region=last_col&variant_fault=optimized"
    code = main(["flash-and-compare", str(models_dir / MODEL), "--input", str(models_dir / INPUT),
                 "--port", port, "--tap", "--out", str(out), "--cache-dir", str(cache_dir),
                 "--capture-timeout", "60", "--silence-timeout", "5"])  # fmt: skip
    assert code == ExitCode.MISMATCH
    err = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert "first divergent op 17 (CONV_2D)" in err
    assert "last column only" in err and "per-op time by op type" in err
    doc = json.loads((out / "report.json").read_text())
    schema = json.loads((Path(__file__).parents[1] / "docs" / "flash-and-compare-schema.json").read_text())
    jsonschema.validate(doc, schema)
    assert doc["tap"]["culprit"]["op"] == 17


def test_an_untapped_capture_is_a_problem_of_the_analysis_not_a_finding(
    models_dir: Path, tmp_path: Path
) -> None:
    """A firmware built without --tap prints no OP records: the tap analysis cannot run on it (a problem),
    which says nothing about its outputs (never a finding, which would make the run a mismatch). Faked:
    the board (sim://)."""
    from harness.analysis.tap import analyze_captures
    from harness.model.loader import load_model

    model = models_dir / "cnn_classifier_11.tflite"
    r = flash_and_compare(model, [models_dir / "inputs/cnn_classifier_11.png"], out_dir=tmp_path / "o")
    caps = {v: c for v, run in r.variants.items() if (c := run.capture()) is not None}
    assert set(caps) == {"optimized", "ansi"}, r.errors
    res = analyze_captures(load_model(model), caps, None)
    assert res.findings == [], res.findings
    assert len([p for p in res.problems if "not built with --tap" in p]) == 2
