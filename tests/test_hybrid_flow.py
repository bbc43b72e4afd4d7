"""Acceptance on the simulated board: ``esp-check hybrid`` finds the ops that break, builds
a firmware that keeps ESP-NN everywhere else, and verifies it bit for bit.

Real: the generated projects (the hybrid wrapper's table in main/esp_check_hybrid.cc, which the sim
builder reads as compiled), esptool flashing over a pyserial port, the console capture, the protocol
parser (INFO hybrid, HYBRID records, tap records), the TFLM host reference, the comparison and the
bisection. Faked: the board (``sim://``): it models the hybrid dispatch (an op fault of the optimized
kernel at op k disappears when the table sends op k to ANSI C), per-op crashes and the cycle model. The
simulator never says where a fault is: the ops below are found from what the runs printed.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pytest
from held_lock import held_elsewhere

from harness.cli import main
from harness.device.locks import lock_key
from harness.errors import ExitCode, Terminated
from harness.flows.flash_and_compare import flash_and_compare
from harness.flows.hybrid import HybridOptions, HybridResult, hybrid
from harness.flows.job import JobOptions
from harness.flows.records import StageTimeouts
from harness.model.hybrid_ops import candidate_ops
from harness.model.loader import load_model

pytest.importorskip("tflite_micro")

MODEL = "unet_mbv2_035_48.tflite"
INPUT = "inputs/unet_mbv2_035_48.png"
LIMITS = StageTimeouts(capture_total=60, capture_silence=3)
BOUND = math.ceil(math.log2(57)) + 1  # 57 switchable ops in the U-Net 48: 7 runs per culprit


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hybrid-build-cache")


def run_hybrid(models_dir: Path, out: Path, cache_dir: Path, query: str, **kw: object) -> HybridResult:
    return hybrid(
        models_dir / MODEL,
        [models_dir / INPUT],
        board="sim",
        port=f"sim://?{query}" if query else None,
        out_dir=out,
        **kw,
        job=JobOptions(cache_dir=cache_dir, timeouts=LIMITS),
    )


def _corrupt(ops: str) -> str:
    return f"fault=op_corrupt&fault_op={ops}&variant_fault=optimized"


def _check_verified(res: HybridResult, ops: list[int]) -> None:
    """Offered only with its own evidence: the table it printed, ANSI C dispatch counts, bit-exactness."""
    assert res.offered and res.exit_code == ExitCode.MATCH, (res.message, res.errors)
    assert res.ansi_ops == ops
    ver = res.verification
    assert ver is not None and not ver.tapped and ver.outcome == "good" and ver.capture is not None
    assert ver.capture.hybrid_ops == (tuple(ops), False)
    assert [r.hybrid for r in ver.capture.runs] == [{"ansi": len(ops), "fallback": 0}]
    comp = ver.comparison
    assert comp is not None and not comp.faults
    pairs = {(c.a, c.b) for c in comp.comparisons}
    assert {("hybrid", "ansi"), ("hybrid", "reference"), ("ansi", "reference")} <= pairs
    assert all(c.mismatched == 0 and c.tolerance_lsb == 0 for c in comp.comparisons)
    assert res.baseline is not None and res.baseline.exit_code != ExitCode.MATCH  # there was something to fix


def _check_deliverables(res: HybridResult, ops: list[int]) -> None:
    assert (
        res.dropin is not None and res.verification is not None and res.verification.project_dir is not None
    )
    drop, main_dir = Path(res.dropin["dir"]), res.verification.project_dir / "main"
    for name in ("esp_check_hybrid.h", "esp_check_hybrid.cc"):  # the files the verified firmware compiled
        assert (drop / name).read_bytes() == (main_dir / name).read_bytes()
    app = (main_dir / "app_main.cc").read_text()
    assert all(line.rstrip(";") in app for line in res.dropin["registration"])
    assert res.cost is not None and 0 < res.cost["speedup_kept_percent"] <= 100
    assert "of ESP-NN's speedup" in res.cost["summary"] and "100.0" not in res.cost["summary"]
    for k in ops:
        assert f"op {k} " in res.cost["summary"]
    assert sorted(r["op"] for r in res.repro) == ops and all(r["ok"] for r in res.repro), res.repro
    doc = json.loads(res.report_path.read_text())
    assert (
        doc["schema"] == "esp-check/hybrid" and doc["offered"] and doc["ansi_ops"] == ops and doc["simulated"]
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("k", "opcode"), [(4, "DEPTHWISE_CONV_2D"), (17, "CONV_2D"), (27, "ADD"), (54, "CONV_2D")]
)
def test_taps_name_op_k_alone_and_the_hybrid_verifies(
    models_dir: Path, tmp_path: Path, cache_dir: Path, k: int, opcode: str
) -> None:
    res = run_hybrid(models_dir, tmp_path / "out", cache_dir, _corrupt(str(k)))
    assert res.culprits == [{"op": k, "kind": opcode, "found_by": "tap (round 1)"}]
    # the optimized build ran again first and failed again at op k: the culprit reproduces
    assert [r.label for r in res.runs] == ["confirm", "tap-1", "verify"] and res.bisection is None
    confirm = res.runs[0]
    assert confirm.tapped and confirm.ansi_ops == [] and confirm.outcome == "bad"
    assert confirm.divergence is not None and confirm.divergence.op == k
    _check_verified(res, [k])
    _check_deliverables(res, [k])
    assert res.cost is not None and res.cost["measured"]  # the tapped hybrid run measured its own cycles
    per_op = res.cost["per_op"]
    assert [r["op"] for r in per_op] == [k] and per_op[0]["extra_cycles"] > 0


@pytest.mark.slow
def test_the_noise_band_asked_for_is_the_one_cost_and_audit_use(
    models_dir: Path, tmp_path: Path, cache_dir: Path
) -> None:
    """``--noise-band`` reaches the cost report and the ESP-NN speedup audit (they used the 10 % default)."""
    res = run_hybrid(
        models_dir, tmp_path / "out", cache_dir, _corrupt("17"), options=HybridOptions(noise_band=0.35)
    )
    _check_verified(res, [17])
    assert res.cost is not None and res.audit is not None
    assert res.cost.get("noise_band") == 0.35 and res.audit["noise_band"] == 0.35
    doc = json.loads(res.report_path.read_text())
    assert doc["cost"]["noise_band"] == 0.35 and doc["audit"]["noise_band"] == 0.35


@pytest.mark.slow
@pytest.mark.parametrize("k", [4, 17, 27, 54])
def test_bisect_finds_the_same_op_within_the_bound(
    models_dir: Path, tmp_path: Path, cache_dir: Path, k: int
) -> None:
    res = run_hybrid(
        models_dir, tmp_path / "out", cache_dir, _corrupt(str(k)), options=HybridOptions(bisect=True)
    )
    bis = res.bisection
    assert bis is not None and bis.success and bis.found == [k]
    assert (
        bis.bound_per_culprit == BOUND
        and len(bis.steps) <= BOUND
        and bis.runs_per_culprit() == [len(bis.steps)]
    )
    _check_verified(res, [k])
    assert res.verification is res.runs[-1]  # the bisection's own verify run is the plain hybrid firmware
    assert res.cost is not None and 0 < res.cost["speedup_kept_percent"] <= 100


@pytest.mark.slow
@pytest.mark.parametrize("crash", ["op_panic", "op_hang"])
def test_a_crash_at_op_33_is_bisected(models_dir: Path, tmp_path: Path, cache_dir: Path, crash: str) -> None:
    res = run_hybrid(
        models_dir, tmp_path / "out", cache_dir, f"fault={crash}&fault_op=33&variant_fault=optimized"
    )
    assert res.baseline is not None and res.baseline.exit_code in (
        ExitCode.FIRMWARE_FAULT,
        ExitCode.INFRASTRUCTURE,
    )
    assert any("bisecting" in n for n in res.notes)  # the taps had nothing to say: the run never finished
    bis = res.bisection
    assert bis is not None and bis.found == [33] and len(bis.steps) <= BOUND
    bad = [s for s in bis.steps if s.bad]
    assert (
        bad
        and all(33 in s.optimized for s in bad)
        and all(33 not in s.optimized for s in bis.steps if s.bad is False)
    )
    assert all(s.why.startswith("crash" if crash == "op_panic" else "hang") for s in bad)
    _check_verified(res, [33])
    assert (
        res.repro and res.repro[0]["input_from"] == "ansi" and res.repro[0]["ok"]
    )  # the optimized build crashed


@pytest.mark.slow
def test_two_faulty_ops_are_both_found_and_the_hybrid_matches(
    models_dir: Path, tmp_path: Path, cache_dir: Path
) -> None:
    res = run_hybrid(models_dir, tmp_path / "taps", cache_dir, _corrupt("17,27"))
    assert [c["op"] for c in res.culprits] == [17, 27] and [r.label for r in res.runs] == [
        "confirm",
        "tap-1",
        "tap-2",
        "verify",
    ]
    assert res.runs[0].divergence is not None and res.runs[0].divergence.op == 17  # the baseline's, again
    assert res.runs[1].divergence is not None and res.runs[1].divergence.op == 27  # round 2 named op 27
    _check_verified(res, [17, 27])
    _check_deliverables(res, [17, 27])
    bis = run_hybrid(
        models_dir, tmp_path / "bisect", cache_dir, _corrupt("17,27"), options=HybridOptions(bisect=True)
    )
    assert bis.bisection is not None and sorted(bis.bisection.found) == [17, 27]
    assert len(bis.bisection.runs_per_culprit()) == 2 and all(
        n <= BOUND for n in bis.bisection.runs_per_culprit()
    )
    _check_verified(bis, [17, 27])


@pytest.mark.slow
def test_given_ops_are_verified_and_a_wrong_choice_is_not_offered(
    models_dir: Path, tmp_path: Path, cache_dir: Path
) -> None:
    right = run_hybrid(
        models_dir, tmp_path / "right", cache_dir, _corrupt("17"), options=HybridOptions(ansi_ops=(17,))
    )
    _check_verified(right, [17])
    assert right.culprits == [{"op": 17, "kind": "CONV_2D", "found_by": "given"}] and right.repro == []
    wrong = run_hybrid(
        models_dir, tmp_path / "wrong", cache_dir, _corrupt("17"), options=HybridOptions(ansi_ops=(18,))
    )
    assert not wrong.offered and wrong.exit_code == ExitCode.MISMATCH and wrong.dropin is None
    assert wrong.verification is not None and wrong.verification.outcome == "bad"
    assert "not offered" in wrong.message and not (tmp_path / "wrong" / "hybrid-dropin").exists()


def test_a_hybrid_that_fails_on_two_inputs_names_each(
    models_dir: Path, tmp_path: Path, cache_dir: Path
) -> None:
    """Op 3 is wrong and op 5 is given: the hybrid differs on both inputs. Its why names each input in
    the one mismatch wording (TensorComparison.mismatch_text), not the same sentence twice."""
    cnn = models_dir / "cnn_classifier_11.tflite"
    inputs = [
        models_dir / "inputs" / "cnn_classifier_11.png",
        models_dir / "inputs" / "cnn_classifier_11.npy",
    ]
    res = hybrid(
        cnn, inputs, board="sim", port=f"sim://?{_corrupt('3')}", out_dir=tmp_path / "o",
        options=HybridOptions(ansi_ops=(5,)), job=JobOptions(cache_dir=cache_dir, timeouts=LIMITS),
    )  # fmt: skip
    assert not res.offered and res.exit_code == ExitCode.MISMATCH, res.message
    assert res.verification is not None and res.verification.outcome == "bad"
    first, second = res.verification.why.split("; ")
    assert first.startswith("hybrid vs ansi, input 0 output 0 ") and "1 of 11 elements differ" in first
    assert second.startswith("hybrid vs ansi, input 1 output 0 ") and "1 of 11 elements differ" in second
    assert "input 0 " in res.message and "input 1 " in res.message


@pytest.mark.slow
def test_no_hybrid_when_ansi_c_itself_is_wrong_or_nothing_is(
    models_dir: Path, tmp_path: Path, cache_dir: Path
) -> None:
    both = run_hybrid(
        models_dir, tmp_path / "both", cache_dir, "fault=op_corrupt&fault_op=17"
    )  # both kernels
    assert not both.offered and both.exit_code == ExitCode.MISMATCH and both.runs == []
    assert "ANSI C build itself differs from the host reference" in both.message
    clean = run_hybrid(models_dir, tmp_path / "clean", cache_dir, "")
    assert clean.exit_code == ExitCode.MATCH and not clean.offered and clean.runs == []
    assert "no hybrid needed" in clean.message


@pytest.mark.slow
def test_audit_flags_the_kind_compiled_without_optimization_and_no_other(
    models_dir: Path, tmp_path: Path, cache_dir: Path
) -> None:
    info = load_model(models_dir / MODEL)
    dw = [o.index for o in info.main_ops if o.opcode == "DEPTHWISE_CONV_2D"]
    res = flash_and_compare(
        models_dir / MODEL,
        [models_dir / INPUT],
        board="sim",
        port="sim://?fault=unoptimized_kind&fault_kind=DEPTHWISE_CONV_2D",
        out_dir=tmp_path / "out",
        options=JobOptions(cache_dir=cache_dir, timeouts=LIMITS, tap=True, html=tmp_path / "r.html"),
    )
    assert res.exit_code == ExitCode.MATCH  # same outputs: only the speed gives it away
    audit = res.tap.audit if res.tap is not None else None
    assert audit is not None and audit["chip"] == "esp32s3"
    assert [k["kind"] for k in audit["kinds"]] == ["DEPTHWISE_CONV_2D"]
    assert audit["kinds"][0]["finding"] == "not_optimized" and sorted(audit["flagged_ops"]) == dw
    assert "ESP-NN speedup audit" in (tmp_path / "r.html").read_text()
    doc = json.loads(res.report_path.read_text())
    assert doc["tap"]["audit"]["flagged_ops"] == audit["flagged_ops"]
    clean = flash_and_compare(
        models_dir / MODEL,
        [models_dir / INPUT],
        board="sim",
        out_dir=tmp_path / "clean",
        options=JobOptions(cache_dir=cache_dir, timeouts=LIMITS, tap=True),
    )
    assert clean.tap is not None and clean.tap.audit is not None
    assert clean.tap.audit["flagged_ops"] == [] and clean.tap.audit["kinds"] == []
    speedups = [r["speedup"] for r in clean.tap.audit["rows"] if r["espnn"]]
    assert len(speedups) == len(candidate_ops(info)) and min(speedups) > 1.1  # outside the noise band


@pytest.mark.slow
def test_the_one_op_reproducer_reproduces_on_its_own(
    models_dir: Path, tmp_path: Path, cache_dir: Path
) -> None:
    res = run_hybrid(models_dir, tmp_path / "out", cache_dir, _corrupt("17"))
    rep = Path(res.repro[0]["dir"])
    one = load_model(rep / "model.tflite")
    assert [o.opcode for o in one.main_ops] == ["CONV_2D"] and one.main_ops[0].options == load_model(
        models_dir / MODEL).main_ops[17].options  # fmt: skip
    expected, observed = np.load(rep / "expected_ansi.npy"), np.load(rep / "observed_optimized.npy")
    assert np.count_nonzero(expected != observed) == res.repro[0]["optimized_differs"] > 0
    # the same kernel fault, now at op 0 of the one-op model, shows up on its own; without it, a match
    args = rep / "model.tflite", [rep / "input_0.npy"]
    bad = flash_and_compare(
        *args,
        board="sim",
        port=f"sim://?{_corrupt('0')}",
        out_dir=tmp_path / "r1",
        options=JobOptions(cache_dir=cache_dir, timeouts=LIMITS),
    )
    good = flash_and_compare(
        *args, board="sim", out_dir=tmp_path / "r2", options=JobOptions(cache_dir=cache_dir, timeouts=LIMITS)
    )
    assert bad.exit_code == ExitCode.MISMATCH and good.exit_code == ExitCode.MATCH


@pytest.mark.slow
def test_cli_hybrid(
    models_dir: Path, tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    two = ["--input", str(models_dir / INPUT), "--input", str(models_dir / "inputs" / "unet_mbv2_035_48.npy")]
    base = [str(models_dir / MODEL), *two, "--board", "sim",
            "--cache-dir", str(cache_dir), "--silence-timeout", "3"]  # fmt: skip
    extra = ["--json", "--html", str(tmp_path / "h.html"), "--bundle", str(tmp_path / "b.zip")]
    code = main(["hybrid", *base, "--port", f"sim://?{_corrupt('27')}", "--out", str(tmp_path / "o"), *extra])
    doc = json.loads(capsys.readouterr().out)
    runs = {(c["a"], c["b"], c["run"]) for c in doc["verification"]["comparison"]["comparisons"]}
    assert {("hybrid", "ansi", 0), ("hybrid", "ansi", 1), ("hybrid", "reference", 1)} <= runs  # every input
    assert doc["verification"]["hybrid_records"] == [{"ansi": 1, "fallback": 0}] * 2
    assert (
        code == 0 and doc["ansi_ops"] == [27] and doc["offered"] and doc["verification"]["outcome"] == "good"
    )
    assert doc["cost"]["speedup_kept_percent"] > 0 and doc["firmware_runs"] == 3  # confirm, tap-1, verify
    assert "HYBRID OFFERED" in (tmp_path / "h.html").read_text()
    import zipfile

    names = zipfile.ZipFile(tmp_path / "b.zip").namelist()
    assert {"hybrid-dropin/esp_check_hybrid.cc", "hybrid-dropin/README.md", "report.json"} <= set(names)
    assert any(n.startswith("repro/op27_ADD/") and n.endswith("model.tflite") for n in names)
    assert main(["hybrid", *base, "--ansi-ops", "48", "--out", str(tmp_path / "u1")]) == 2
    assert main(["hybrid", *base, "--ansi-ops", "17", "--bisect", "--out", str(tmp_path / "u2")]) == 2
    assert main(["hybrid", *base, "--ansi-kinds", "LOGISTIC", "--out", str(tmp_path / "u3")]) == 2


def test_lock_false_takes_no_board_lock_in_the_hybrid_runs_either(
    models_dir: Path, tmp_path: Path, cache_dir: Path
) -> None:
    """``JobOptions(lock=False)`` (docs/ci.md, "Board locks"): no lock in the baseline nor in the hybrid
    runs. Another process holds the board's lock (a real flock); with ``lock_timeout=0`` any lock taken
    would fail at once with BoardBusyError, so a hybrid that runs to its verdict took none."""
    port = f"sim://nolock{time.monotonic_ns()}?{_corrupt('3')}"  # named: the lock key is known
    job = JobOptions(
        cache_dir=cache_dir, timeouts=LIMITS, lock=False, lock_dir=tmp_path / "locks", lock_timeout=0
    )
    with held_elsewhere(tmp_path / "locks" / f"{lock_key(port)}.lock"):
        res = hybrid(
            models_dir / "cnn_classifier_11.tflite",
            [models_dir / "inputs" / "cnn_classifier_11.png"],
            board="sim",
            port=port,
            out_dir=tmp_path / "o",
            options=HybridOptions(ansi_ops=(3,)),
            job=job,
        )
    assert res.offered and res.exit_code == ExitCode.MATCH, (res.message, res.errors)


@pytest.mark.parametrize(
    ("stop", "code", "how"), [(KeyboardInterrupt, 130, "Ctrl-C"), (Terminated, 143, "SIGTERM")]
)
def test_a_stopped_hybrid_reports_how_it_was_stopped(
    models_dir: Path, tmp_path: Path, cache_dir: Path, stop: type[KeyboardInterrupt], code: int, how: str
) -> None:
    """Ctrl-C and SIGTERM (harness.cli raises Terminated for it) stop hybrid as they stop flash-and-compare:
    the report says which one, with its exit code (130 / 143). Faked: the stop itself, raised from the
    progress callback on its first message; the run is the real one up to there."""

    def progress(*_: object) -> None:
        raise stop

    with pytest.raises(stop):
        run_hybrid(models_dir, tmp_path / "out", cache_dir, "", progress=progress)
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    assert doc["exit_code"] == code, doc
    assert any(f"interrupted ({how})" in e for e in doc["errors"]), doc["errors"]
