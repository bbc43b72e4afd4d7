"""A host reference that refuses: TFLM's reference kernels abort (SIGABRT) inside Invoke on some values.

Real here: the tflite-micro wheel in the host-reference child, aborting on a softmax row of 1024 entries
near its maximum (its ``exponent <= 31`` check), the child process and its stdout protocol, the arena
estimate. Faked (where a test says so): the child's command line, replaced by a one-liner that dies of
a signal before or after announcing an Invoke, to pin down which deaths count as a refusal.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from native_fixture import write_refused_input, write_refused_model

from harness.cli import main
from harness.errors import ExitCode, ModelError, ReferenceRefusedError
from harness.model import arena, hostrun, reference

pytest.importorskip("tflite_micro")


@pytest.fixture
def refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    monkeypatch.setenv("ESP_CHECK_CACHE_DIR", str(tmp_path / "cache"))
    return write_refused_model(tmp_path / "softmax.tflite"), write_refused_input(tmp_path / "flat.npy")


def test_the_wheel_refuses_a_long_flat_softmax_row_and_says_where(
    refused: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    model, inp = refused
    with pytest.raises(
        ReferenceRefusedError, match=r"aborted \(SIGABRT\) inside Invoke on input run 0"
    ) as err:
        reference.run_reference(model, [[np.load(inp)]])
    assert err.value.run == 0 and err.value.exit_code == ExitCode.USAGE  # alone: a model error
    # spread-out values are computed: the refusal depends on the values, not on the model
    spread = np.random.default_rng(1).integers(-128, 128, size=(1, 2, 2048, 1)).astype(np.int8)
    out = reference.run_reference(model, [[spread]]).runs[0].outputs
    assert out[1].shape == (1, 1024) and int(out[1].max()) > -128
    # the arena probe runs on zeros (a flat row): refused too, so the estimate falls back to rough
    est = arena.estimate_arena(model)
    assert est.method == "rough" and "refuse all-zero inputs" in est.note
    assert main(["reference", str(model), "--input", str(inp)]) == ExitCode.USAGE
    assert "refuses this model" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("announce", "sig", "refusal"),
    [
        (True, "SIGABRT", True),  # a kernel check after the Invoke was announced
        (False, "SIGABRT", False),  # an abort while loading: a broken model, not a refusal
        (True, "SIGSEGV", False),  # a crash inside Invoke is a crash, not a check
    ],
)
def test_only_an_abort_after_an_announced_invoke_is_a_refusal(
    refused: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, announce: bool, sig: str, refusal: bool
) -> None:
    # Faked: the child's command line (a one-liner speaking the child's stdout protocol, then dying).
    say = f'print({hostrun._SAY!r} + \'{{"stage": "invoke", "run": 0}}\', flush=True); ' if announce else ""
    script = f"import os, signal; {say}os.kill(os.getpid(), signal.{sig})"
    monkeypatch.setattr(hostrun, "_child_argv", lambda job_dir: [sys.executable, "-c", script])
    model, inp = refused
    with pytest.raises(ModelError) as err:
        reference.run_reference(model, [[np.load(inp)]])
    assert isinstance(err.value, ReferenceRefusedError) is refusal
    if not refusal:
        assert f"({sig})" in err.value.message


def test_flash_and_compare_of_a_refused_model_on_the_simulated_board_ends_in_a_verdict(
    refused: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The simulated chip runs TFLM's kernels, so it aborts where the reference does (abort(), reboot):
    the run ends with the firmware fault's exit code and a report, not with esp-check killed by the
    abort. Faked: the board (``sim://``)."""
    import json

    model, inp = refused
    out = tmp_path / "out"
    args = ["flash-and-compare", str(model), "--input", str(inp), "--board", "sim", "--out", str(out)]
    assert main([*args, "--port", "sim://refused-softmax", "--allow-untested"]) == ExitCode.FIRMWARE_FAULT
    doc = json.loads((out / "report.json").read_text())
    assert doc["exit_code"] == ExitCode.FIRMWARE_FAULT and doc["reference_refused"] is not None
    assert "firmware fault: abort() called" in " ".join(capsys.readouterr())
