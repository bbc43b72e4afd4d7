"""harness.model.arena: arena measured by the host TFLM in a subprocess, target margin, rough fallback."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import pytest

from harness.errors import ModelError
from harness.model import arena, hostrun
from harness.model.loader import load_model
from harness.resources import pinned_versions

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


def test_rough_fallback_without_tflm(no_tflm_wheel: None, models_dir: Path) -> None:
    # Faked (no_tflm_wheel): the wheel's absence (macOS/Windows/ARM).
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
    est = arena.estimate_arena(models_dir / "op_zoo.tflite")
    assert est.method == "measured" and est.host_bytes == README_ARENA["op_zoo"] and est.verified


# --- ESP-NN scratch formulas keyed by the esp-nn version ------------------------------------------------
#
# The expected numbers below are worked out by hand from esp-nn's getters at the named tags (read at the
# source; the Python formulas were also compared with the C getters compiled from those tags on 6000
# random geometries, outside the test suite). A padded 3x3 first conv on 96x96x3 with 16 filters:
#   esp-nn <= 1.2.0, esp_nn_get_conv_scratch_size_esp32s3 (not 1x1): padded input (96+2)*(96+2)*3
#     + filter 3*3*align16(3)*16 + alignment 32 + per-channel accumulators 16*4            = 31212
#   esp-nn 1.2.1/1.2.2: im2col path (3*3 = 9 < 16 <= 27 = 3*3*3): 16*4 + 16 + 16*align16(27)
#     + 16 + align16(27) + alignment 32                                                      =   672
#   esp-nn 1.2.3: the same with 64 bytes of alignment margin                                  =   704
PADDED_CONV_1_1 = (96 + 2) * (96 + 2) * 3 + 3 * 3 * 16 * 16 + 32 + 16 * 4
PADDED_CONV_1_2_1 = 16 * 4 + 16 + 16 * 32 + 16 + 32 + 32
PADDED_CONV_1_2_3 = 16 * 4 + 16 + 16 * 32 + 16 + 32 + 64


@pytest.fixture(scope="module")
def padded_conv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from test_model_builder import padded_conv_model

    path = tmp_path_factory.mktemp("m") / "padded_conv_96x96x3.tflite"
    path.write_bytes(padded_conv_model())
    return path


def test_padded_first_conv_scratch_per_espnn_version(padded_conv: Path) -> None:
    info = load_model(padded_conv)
    assert (PADDED_CONV_1_1, PADDED_CONV_1_2_1, PADDED_CONV_1_2_3) == (31212, 672, 704)
    bound = arena.espnn_scratch_bound
    assert bound(info, "esp32s3", "1.1.2") == PADDED_CONV_1_1
    assert bound(info, "esp32s3", "1.2.0") == PADDED_CONV_1_1
    assert bound(info, "esp32s3", "1.2.0~1") == PADDED_CONV_1_1  # a registry revision of 1.2.0
    assert bound(info, "esp32s3", "1.2.2") == PADDED_CONV_1_2_1
    assert bound(info, "esp32s3", "1.2.3") == PADDED_CONV_1_2_3
    # unknown versions: the largest of all known formulas, never the smallest
    assert bound(info, "esp32s3", "1.3.0") == bound(info, "esp32s3", "main") == PADDED_CONV_1_1
    # the pinned version (harness/data/versions.toml) is what a plain estimate uses
    assert pinned_versions()["espnn"] == "1.1.2"
    assert bound(info, "esp32s3") == PADDED_CONV_1_1
    # P4 before 1.2.3 used the same getter as the S3; the generic optimized C requests nothing
    assert bound(info, "esp32p4", "1.1.2") == PADDED_CONV_1_1
    assert bound(info, "esp32", "1.1.2") == 0 and bound(info, "esp32c3", "1.3.0") == 0


def test_formula_sets_by_version() -> None:
    assert arena.espnn_formulas("1.1.2").sets == ("1.1",)
    assert arena.espnn_formulas("1.0.1").sets == ("1.1",)
    assert arena.espnn_formulas("1.2.0").sets == ("1.2.0",)
    assert arena.espnn_formulas("1.2.1").sets == ("1.2.1",)
    assert arena.espnn_formulas("1.2.3").sets == ("1.2.3",)
    unknown = arena.espnn_formulas("1.2.4")
    assert unknown.sets == ("1.1", "1.2.0", "1.2.1", "1.2.3") and "largest" in unknown.note
    assert arena.espnn_formulas(None).espnn_version == pinned_versions()["espnn"]
    # the depthwise s16 path kept 16 alignment bytes up to 1.1.x and 32 from 1.2.0: 3x3, 8 channels,
    # multiplier 4 on 8x8: 2 * (3*3*8*4 + 8*8*8) + 16 | 32
    g = arena.ConvGeometry(8, 8, 8, 3, 3, 8, 8, 32, 1, 1, 1, 1, mult=4)
    assert arena.FORMULA_SETS["1.1"][("esp32s3", "DEPTHWISE_CONV_2D")](g) == 2 * (288 + 512) + 16
    assert arena.FORMULA_SETS["1.2.0"][("esp32s3", "DEPTHWISE_CONV_2D")](g) == 2 * (288 + 512) + 32


def test_dilated_conv_still_counts(models_dir: Path) -> None:
    """esp-tflite-micro requests the scratch in Prepare for every int8 conv, also one its Eval then runs on
    the reference kernel (op_zoo's dilation-2 conv): the bound must include it."""
    info = load_model(models_dir / "op_zoo.tflite")
    dilated = next(op for op in info.main_ops if op.options.get("dilation_h_factor") == 2)
    g = arena.conv_geometry(dilated, info)
    assert (
        arena.espnn_scratch_bound(info, "esp32s3", "1.1.2")
        >= arena.FORMULA_SETS["1.1"][("esp32s3", "CONV_2D")](g)
        > 0
    )


@pytest.mark.needs_tflm
@pytest.mark.skipif(not ON_TFLM_PLATFORM, reason="tflite-micro wheels exist only for Linux x86-64")
def test_padded_first_conv_arena_target_covers_the_pinned_scratch(padded_conv: Path) -> None:
    est = arena.estimate_arena(padded_conv, chip="esp32s3")
    assert est.method == "measured" and est.verified
    assert est.espnn_scratch_bytes == PADDED_CONV_1_1
    assert est.espnn_version == "1.1.2" and "set 1.1 " in est.espnn_formulas
    assert est.target_bytes >= est.host_bytes + PADDED_CONV_1_1  # what AllocateTensors will need
    # the formula of a later esp-nn would have reserved far less: too small for esp-nn 1.1.2
    later = arena.estimate_arena(padded_conv, chip="esp32s3", espnn_version="1.2.3")
    assert later.espnn_scratch_bytes == PADDED_CONV_1_2_3
    assert later.target_bytes < est.host_bytes + PADDED_CONV_1_1
