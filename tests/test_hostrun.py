"""harness.model.hostrun: the host reference and the arena probe run in ONE child process with a
memory limit and a timeout; results are cached on disk so a repeat run starts no child at all.

Real here: the tflite-micro wheel in the child, the child process, its limits, the disk cache, the
CLI. Faked (where a test says so): the child's command line, replaced by a one-liner that dies of a
signal the way the wheel does on some corrupted models.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from test_model_builder import Op, T, build_model

from harness.cli import main
from harness.errors import ExitCode, HostReferenceError, ModelError, UsageError
from harness.flows.job import JobOptions
from harness.model import arena, hostrun, reference
from harness.model.loader import load_model

pytest.importorskip("tflite_micro")

MODEL = "cnn_classifier_11.tflite"
INPUT = "inputs/cnn_classifier_11__ambiguous.png"


@pytest.fixture
def children(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Path]:
    """A fresh, empty cache directory; the list of child processes started (job directories)."""
    monkeypatch.setenv("ESP_CHECK_CACHE_DIR", str(tmp_path / "cache"))
    started: list[Path] = []
    real = hostrun._spawn

    def counting(job_dir: Path, timeout: float, *rest):  # type: ignore[no-untyped-def]
        started.append(job_dir)
        return real(job_dir, timeout, *rest)

    monkeypatch.setattr(hostrun, "_spawn", counting)
    return started


def _q(models_dir: Path) -> np.ndarray:
    from harness.model.inputs import load_input

    info = load_model(models_dir / MODEL)
    return load_input(models_dir / INPUT, info.inputs[0]).quantized


def test_one_child_for_reference_and_arena_then_none(models_dir: Path, children: list[Path]) -> None:
    model = models_dir / MODEL
    reference.prepare_host_results(model, [models_dir / INPUT])
    assert len(children) == 1  # the reference run and the arena probe (with its confirming run)
    est = arena.estimate_arena(model, chip="esp32s3")
    ref = reference.run_reference(model, [[_q(models_dir)]], backend="auto")
    assert len(children) == 1  # both from the cache
    assert est.method == "measured" and est.verified and est.host_bytes == 25_952
    assert ref.backend == "tflm" and ref.runs[0].outputs[0].shape == (1, 11)
    # per-layer results are another entry: one more child, after which both kinds are cached
    layered = reference.run_reference(model, [[_q(models_dir)]], per_layer=True)
    assert len(children) == 2 and layered.runs[0].layers
    assert np.array_equal(layered.runs[0].outputs[0], ref.runs[0].outputs[0])
    reference.run_reference(model, [[_q(models_dir)]], per_layer=True)
    assert len(children) == 2
    # a different input is a different key
    reference.run_reference(model, [[np.zeros((1, 32, 32, 3), np.int8)]])
    assert len(children) == 3


def test_repeat_cli_runs_start_no_child(
    models_dir: Path, children: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = [str(models_dir / MODEL), "--input", str(models_dir / INPUT), "--json"]
    assert main(["inspect", *args]) == 0
    assert main(["reference", *args]) == 0
    first = len(children)
    assert first == 2  # inspect: the arena probe; reference: the outputs
    assert main(["inspect", *args]) == 0 and main(["reference", *args]) == 0
    assert len(children) == first
    capsys.readouterr()


_CACHE_HIT_IMPORTS = """
import sys
from pathlib import Path
from harness.model import arena, hostrun, reference
hostrun._spawn = lambda *a: sys.exit("a child was started: not a cache hit")
model, image = Path(sys.argv[1]), Path(sys.argv[2])
reference.prepare_host_results(model, [image])  # backend "auto", as flash-and-compare
arena.estimate_arena(model, chip="esp32s3")  # generate's arena plan
print(sorted(m for m in sys.modules if m.startswith("tflite_micro")))
"""


def test_a_cache_hit_imports_no_tflm_runtime(models_dir: Path, children: list[Path]) -> None:
    """A repeat run keys its cache on the wheel's metadata; the runtime is imported only to run."""
    import os
    import subprocess

    reference.prepare_host_results(models_dir / MODEL, [models_dir / INPUT])  # fills the cache
    assert len(children) == 1
    root = str(Path(hostrun.__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root}
    got = subprocess.run(  # a fresh interpreter: nothing imported by other tests
        [sys.executable, "-c", _CACHE_HIT_IMPORTS, str(models_dir / MODEL), str(models_dir / INPUT)],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert got.stdout.strip() == "[]", got.stdout + got.stderr


def test_damaged_cache_entry_is_a_miss(models_dir: Path, children: list[Path], tmp_path: Path) -> None:
    q = _q(models_dir)
    a = reference.run_reference(models_dir / MODEL, [[q]]).runs[0].outputs[0]
    for entry in (tmp_path / "cache" / "host-reference").iterdir():
        entry.write_bytes(entry.read_bytes()[:20])
    b = reference.run_reference(models_dir / MODEL, [[q]]).runs[0].outputs[0]
    assert len(children) == 2 and np.array_equal(a, b)
    first = arena.estimate_arena(models_dir / MODEL)
    for entry in (tmp_path / "cache" / "host-reference").glob("*.json"):
        entry.write_text('{"not": "an arena entry"}')
    assert arena.estimate_arena(models_dir / MODEL) == first
    assert len(children) == 4


def test_crash_in_the_child_is_a_model_error_exit_2(
    models_dir: Path,
    children: list[Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Faked: the child dies of SIGFPE as the wheel does on some corrupted models.
    script = "import os, signal; os.kill(os.getpid(), signal.SIGFPE)"
    monkeypatch.setattr(hostrun, "_child_argv", lambda job_dir: [sys.executable, "-c", script])
    with pytest.raises(ModelError, match=r"crashes TFLM's reference interpreter: signal 8 \(SIGFPE\)"):
        reference.run_reference(models_dir / MODEL, [[_q(models_dir)]])
    code = main(["reference", str(models_dir / MODEL), "--input", str(models_dir / INPUT)])
    assert code == ExitCode.USAGE
    assert "crashes TFLM's reference interpreter: signal 8" in capsys.readouterr().err
    assert main(["inspect", str(models_dir / MODEL)]) == ExitCode.USAGE  # the arena probe crashes too
    # failures are never cached: the real child runs afterwards
    monkeypatch.undo()
    monkeypatch.setattr(hostrun, "_spawn", hostrun._spawn)
    assert reference.run_reference(models_dir / MODEL, [[_q(models_dir)]]).runs


def test_memory_limit_is_enforced_in_the_child(children: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Real limit, real allocation: a 3 x 32 MiB float ADD needs a ~200 MB arena; allow far less."""
    n = 8 * 1024 * 1024
    model = build_model(
        [T("a", (1, n), "float32"), T("b", (1, n), "float32"), T("s", (1, n), "float32")],
        [Op(0, [0, 1], [2], add_options=True)],
        inputs=[0, 1],
        outputs=[2],
    )
    x = np.zeros((1, n), np.float32)
    monkeypatch.setenv("ESP_CHECK_REFERENCE_MEMORY_MB", "400")
    with pytest.raises(ModelError) as err:
        reference.run_reference(model, [[x, x]])
    assert "400 MiB" in err.value.message or "signal" in err.value.message
    assert len(children) == 1


def test_timeout_stops_the_child(
    models_dir: Path, children: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ESP_CHECK_REFERENCE_TIMEOUT", "0.01")
    with pytest.raises(HostReferenceError, match=r"did not finish within 0\.01 s"):
        reference.run_reference(models_dir / MODEL, [[_q(models_dir)]])


@pytest.mark.parametrize("value", ["nan", "-1", "abc", "inf"])
def test_bad_limit_settings_are_usage_errors(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("ESP_CHECK_REFERENCE_MEMORY_MB", value)
    with pytest.raises(UsageError, match="ESP_CHECK_REFERENCE_MEMORY_MB"):
        hostrun.limits()


def test_flash_and_compare_starts_one_host_child(
    models_dir: Path, children: list[Path], tmp_path: Path
) -> None:
    """Arena estimate (generate), reference leg and the simulated board's outputs: one child in all."""
    from harness.flows.flash_and_compare import flash_and_compare
    from harness.flows.records import StageTimeouts

    result = flash_and_compare(
        models_dir / MODEL,
        [models_dir / INPUT],
        board="sim",
        out_dir=tmp_path / "out",
        options=JobOptions(
            cache_dir=tmp_path / "builds", timeouts=StageTimeouts(capture_total=30, capture_silence=3)
        ),
    )
    assert result.exit_code == ExitCode.MATCH
    assert len(children) == 1


def test_flash_and_compare_refuses_a_crashing_model_and_writes_the_report(
    models_dir: Path, children: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Faked: the child dies of SIGSEGV. Exit 2 before anything is built, and report.json says why."""
    import json

    from harness.flows.flash_and_compare import flash_and_compare

    script = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    monkeypatch.setattr(hostrun, "_child_argv", lambda job_dir: [sys.executable, "-c", script])
    with pytest.raises(ModelError, match="signal 11"):
        flash_and_compare(
            models_dir / MODEL,
            [models_dir / INPUT],
            board="sim",
            out_dir=tmp_path / "out",
            options=JobOptions(cache_dir=tmp_path / "builds"),
        )
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    assert "crashes TFLM's reference interpreter: signal 11" in json.dumps(doc)
    assert not (tmp_path / "out" / "logs").exists() or not list((tmp_path / "out" / "logs").glob("build-*"))


def test_the_simulated_cpus_child_gives_the_reference_outputs_and_outlives_an_idle_exit(
    models_dir: Path,
) -> None:
    """InvokeChild (the simulated board's CPU): the same outputs as the host reference, input by input;
    a child that left (here: SIGALRM, as its idle timer ends it) is replaced by the next run."""
    import os
    import signal

    x = _q(models_dir)
    want = reference.run_reference(models_dir / MODEL, [[x]]).runs[0].outputs
    info = load_model(models_dir / MODEL)
    child = hostrun.InvokeChild((models_dir / MODEL).read_bytes(), info)
    for _ in range(2):
        got = child.run(x)
        assert [np.array_equal(g, w.reshape(g.shape)) for g, w in zip(got, want, strict=True)] == [True]
        assert child.proc is not None
        os.kill(child.proc.pid, signal.SIGALRM)
        child.proc.wait()
