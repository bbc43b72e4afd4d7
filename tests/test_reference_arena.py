"""harness.model.arena: arena measured by the host TFLM in a subprocess, target margin, rough fallback."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import pytest

from harness.errors import ModelError
from harness.model import arena, hostrun
from harness.model.loader import load_model

ON_TFLM_PLATFORM = sys.platform == "linux" and platform.machine() == "x86_64"

# Host arena sizes listed in tests/data/models/README.md (TFLM, 64-bit host), measured independently.
README_ARENA = {
    "op_zoo": 12_640,
    "cnn_classifier_11": 25_952,
    "unet_mbv2_035_48": 205_296,
    "unet_mbv2_035_64": 330_736,
    "unet_mbv2_035_128": 1_190_896,
}


@pytest.mark.needs_tflm
@pytest.mark.skipif(not ON_TFLM_PLATFORM, reason="tflite-micro wheels exist only for Linux x86-64")
@pytest.mark.parametrize("name", ["op_zoo", "cnn_classifier_11", "unet_mbv2_035_48"])
def test_measured_arena_matches_readme(models_dir: Path, name: str) -> None:
    est = arena.estimate_arena(models_dir / f"{name}.tflite")
    assert est.method == "measured" and est.verified
    assert est.host_bytes == README_ARENA[name]
    assert est.head_bytes is not None and est.tail_bytes is not None
    assert est.head_bytes + est.tail_bytes == est.host_bytes
    assert est.backend_version.startswith("tflite-micro")
    # target = host + largest ESP-NN scratch + stated margin, rounded up to 1 KiB
    assert est.target_bytes >= est.host_bytes + est.espnn_scratch_bytes + est.margin_bytes
    assert est.target_bytes % 1024 == 0 and est.target_bytes - 1024 < (
        est.host_bytes + est.espnn_scratch_bytes + est.margin_bytes
    )
    assert est.margin_bytes == int(est.host_bytes * arena.MARGIN_FRACTION) + arena.MARGIN_FIXED
    assert "authoritative" in est.note


@pytest.mark.needs_tflm
@pytest.mark.skipif(not ON_TFLM_PLATFORM, reason="tflite-micro wheels exist only for Linux x86-64")
def test_chip_changes_only_the_scratch_term(models_dir: Path) -> None:
    p = models_dir / "cnn_classifier_11.tflite"
    generic = arena.estimate_arena(p, chip="esp32")
    s3 = arena.estimate_arena(p, chip="esp32s3")
    worst = arena.estimate_arena(p)
    assert generic.host_bytes == s3.host_bytes == worst.host_bytes
    assert generic.espnn_scratch_bytes < s3.espnn_scratch_bytes == worst.espnn_scratch_bytes
    assert generic.target_bytes < s3.target_bytes
    assert arena.estimate_arena(p, chip="esp32s3") == s3


def test_scratch_bounds(models_dir: Path) -> None:
    info = load_model(models_dir / "cnn_classifier_11.tflite")
    # generic chips: optimized C conv/depthwise request no scratch; softmax needs 4 B per class
    assert arena.espnn_scratch_bound(info, "esp32") == 4 * 11
    s3 = arena.espnn_scratch_bound(info, "esp32s3")
    assert s3 > 4 * 11
    # a 3x3 conv with 16 input channels and 24 outputs needs at least its channel-aligned filter copy
    assert s3 >= 3 * 3 * 16 * 24


def test_rough_estimate_close_to_readme(models_dir: Path) -> None:
    for name, measured in README_ARENA.items():
        rough = arena.rough_host_bytes(load_model(models_dir / f"{name}.tflite"))
        assert 0.75 * measured <= rough <= 1.25 * measured, (name, rough, measured)


def test_rough_fallback_without_tflm(monkeypatch: pytest.MonkeyPatch, models_dir: Path) -> None:
    # Faked: the wheel's absence (macOS/Windows/ARM).
    monkeypatch.setitem(sys.modules, "tflite_micro", None)
    monkeypatch.setitem(sys.modules, "tflite_micro.python.tflite_micro", None)
    est = arena.estimate_arena(models_dir / "op_zoo.tflite")
    assert est.method == "rough" and not est.verified
    assert "ROUGH" in est.note
    assert est.target_bytes > est.host_bytes


def _fake_child(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, script: str) -> None:
    """Faked: the host-reference child process, replaced by a Python one-liner."""
    monkeypatch.setenv("ESP_CHECK_CACHE_DIR", str(tmp_path / "cache"))  # nothing cached yet
    monkeypatch.setattr(hostrun, "_child_argv", lambda job_dir: [sys.executable, "-c", script])


@pytest.mark.needs_tflm
@pytest.mark.skipif(not ON_TFLM_PLATFORM, reason="tflite-micro wheels exist only for Linux x86-64")
def test_crashing_probe_refuses_the_model(
    monkeypatch: pytest.MonkeyPatch, models_dir: Path, tmp_path: Path
) -> None:
    # The child dies of SIGSEGV while measuring: the model crashes TFLM, inspect/generate refuse it.
    _fake_child(monkeypatch, tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    with pytest.raises(ModelError, match=r"crashes TFLM's reference interpreter: signal 11 \(SIGSEGV\)"):
        arena.estimate_arena(models_dir / "op_zoo.tflite")


@pytest.mark.needs_tflm
@pytest.mark.skipif(not ON_TFLM_PLATFORM, reason="tflite-micro wheels exist only for Linux x86-64")
def test_crash_in_the_confirming_run_only_unverifies(
    monkeypatch: pytest.MonkeyPatch, models_dir: Path, tmp_path: Path
) -> None:
    # The measurement arrived, then the run at exactly that size crashed: a figure, not confirmed.
    line = '@HOSTRUN {"stage": "measured", "version": "tflite-micro x", "total": 12640, "head": 1, "tail": 2}'
    _fake_child(monkeypatch, tmp_path, f"import os, signal; print({line!r}, flush=True); os.abort()")
    est = arena.estimate_arena(models_dir / "op_zoo.tflite")
    assert est.method == "measured" and est.host_bytes == 12640 and not est.verified
    assert "NOT confirmed" in est.note


@pytest.mark.needs_tflm
@pytest.mark.skipif(not ON_TFLM_PLATFORM, reason="tflite-micro wheels exist only for Linux x86-64")
def test_failed_measurement_falls_back_to_labelled_rough(
    monkeypatch: pytest.MonkeyPatch, models_dir: Path, tmp_path: Path
) -> None:
    # The child exits with an error (no signal): inspect/generate still get an estimate, clearly labelled.
    _fake_child(monkeypatch, tmp_path, "import sys; sys.exit('TFLM said no')")
    est = arena.estimate_arena(models_dir / "op_zoo.tflite")
    assert est.method == "rough"
    assert "measurement failed" in est.note and "TFLM said no" in est.note


@pytest.mark.needs_tflm
@pytest.mark.skipif(not ON_TFLM_PLATFORM, reason="tflite-micro wheels exist only for Linux x86-64")
def test_probe_works_from_another_directory(
    models_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the child must still find the harness package
    total, _head, _tail, verified = arena.measure_host_arena(models_dir / "op_zoo.tflite")
    assert total == README_ARENA["op_zoo"] and verified
