"""`inspect` and `generate` work where no host reference can be installed (macOS x86-64, or any
machine without the tflite-micro wheel).

Faked: the two reference packages are shadowed, for this subprocess and every process it starts, by
stand-ins on PYTHONPATH that raise ImportError, exactly as a missing wheel does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def _blocked_env(tmp_path: Path) -> dict[str, str]:
    shadow = tmp_path / "shadow"
    for name in ("tflite_micro", "ai_edge_litert"):
        pkg = shadow / name
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text(f"raise ImportError('{name} is not installed (test stand-in)')\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(shadow), env.get("PYTHONPATH", "")])
    # a machine without the wheel never measured an arena: no cache of another test's measurement (the
    # cache is keyed by the wheel's metadata, which the stand-ins leave in place)
    env["ESP_CHECK_CACHE_DIR"] = str(tmp_path / "cache")
    return env


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_inspect_and_generate_without_any_reference_backend(models_dir: Path, tmp_path: Path) -> None:
    env = _blocked_env(tmp_path)
    probe = subprocess.run(
        [sys.executable, "-c", "import tflite_micro"], capture_output=True, text=True, env=env
    )
    assert probe.returncode != 0 and "test stand-in" in probe.stderr

    model = models_dir / "cnn_classifier_11.tflite"
    insp = _run(["inspect", str(model), "--json"], env)
    assert insp.returncode == 0, insp.stderr
    doc = json.loads(insp.stdout)
    assert "CONV_2D" in json.dumps(doc)
    assert "rough" in json.dumps(doc).lower()  # the arena figure says it was not measured

    out = tmp_path / "fw"
    gen = _run(
        [
            "generate",
            str(model),
            "--input",
            str(models_dir / "inputs" / "cnn_classifier_11.png"),
            "--board",
            "esp32s3-devkitc-1-n8r8",
            "--out",
            str(out),
            "--json",
        ],
        env,
    )
    assert gen.returncode == 0, gen.stderr
    for variant, flag in (("optimized", "CONFIG_NN_OPTIMIZED=y"), ("ansi", "CONFIG_NN_ANSI_C=y")):
        assert flag in (out / variant / "sdkconfig.defaults").read_text()
        assert (out / variant / "main" / "app_main.cc").exists()

    ref = _run(
        ["reference", str(model), "--input", str(models_dir / "inputs" / "cnn_classifier_11.png")], env
    )
    assert ref.returncode == 3  # infrastructure: no backend, with a hint
    assert "hint" in ref.stderr.lower()
