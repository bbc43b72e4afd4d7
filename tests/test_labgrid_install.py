"""``pip install 'esp-check[labgrid]'`` from scratch, and the pytest plugin beside pytest-embedded.

labgrid requires pyserial-labgrid, which installs the same ``serial`` package as pyserial (esptool's
and esp-check's dependency). This builds a fresh venv, installs esp-check from this checkout with its
``labgrid`` extra using pip (from the package index), and checks in that venv, through its own
commands only: whose files the ``serial`` package holds; a plan run with ``esp-check run --labgrid``
on a one-place lab whose coordinator, exporter and ``sim serve`` all come from that venv (labgrid,
the sim:// URL handler, esptool through RFC 2217); the same after labgrid's fork is made the
``serial`` package (``pip install --force-reinstall --no-deps pyserial-labgrid``). Then
pytest-embedded is added to the venv and a pytester-driven pytest run uses a pytest-embedded
``dut``'s port through esp-check's ``flash_and_compare`` fixture. What is faked: the board
(the simulator). Needs the package index; skips when it is unreachable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from tests.labgrid_lab import ROOT, Lab

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform != "linux", reason="labgrid labs run on Linux"),
]
pytest_plugins = ["pytester"]
pytest.importorskip("tflite_micro")
MODEL = "op_zoo"


def _pip(venv: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    if proc.returncode != 0 and any(
        w in proc.stderr.lower() for w in ("connection", "network", "resolve host")
    ):
        pytest.skip(f"package index unreachable: {proc.stderr.strip()[-300:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv with ``esp-check[labgrid]`` installed by pip from this checkout (not editable)."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    _pip(venv, f"{ROOT}[labgrid]")
    return venv


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return dict(os.environ, ESP_CHECK_CACHE_DIR=str(tmp_path_factory.mktemp("fresh-cache")))


def _serial_check(venv: Path) -> dict:
    proc = subprocess.run([str(venv / "bin" / "esp-check"), "bench", "check-serial", "--json"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def _lab_run(venv: Path, tmp: Path, models_dir: Path, env: dict[str, str]) -> tuple[int, str, dict]:
    """One place, one task, everything from ``venv``: returns (exit code, stderr, summary)."""
    lab = Lab(tmp / "lab", bin=venv / "bin").start(["f1"])
    try:
        lab.make_place("fresh-place", "f1")
        np.save(tmp / f"{MODEL}.npy", np.load(models_dir / "inputs" / f"{MODEL}.npy"))
        (tmp / "plan.toml").write_text(
            f'[[job]]\nname = "fresh"\nmodels = ["{models_dir / (MODEL + ".tflite")}"]\n'
            f'inputs = ["{tmp}/{{model}}.npy"]\nboards = ["sim"]\n'
        )
        proc = subprocess.run(
            [str(venv / "bin" / "esp-check"), "run", str(tmp / "plan.toml"), "--labgrid", lab.coordinator,
             "--out", str(tmp / "out"), "--no-step-summary"],
            capture_output=True, text=True, timeout=600, env=env, cwd=tmp,
        )  # fmt: skip
        doc = json.loads((tmp / "out" / "summary.json").read_text())
        return proc.returncode, proc.stderr + lab.logs(), doc
    finally:
        lab.stop()


def test_pip_install_esp_check_labgrid_from_scratch(
    fresh: Path, tmp_path: Path, models_dir: Path, cache_env: dict[str, str]
):
    check = subprocess.run(
        [str(fresh / "bin" / "python"), "-m", "pip", "check"], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout  # both distributions' requirements are met
    pkg = _serial_check(fresh)
    assert set(pkg["installed"]) == {"pyserial", "pyserial-labgrid"} and pkg["ok"], pkg
    assert pkg["provider"] in ("pyserial", "pyserial-labgrid"), pkg  # whole files of one of them
    first_provider = pkg["provider"]
    # 1. as pip left it
    code, err, doc = _lab_run(fresh, tmp_path / "as-installed", models_dir, cache_env)
    assert code == 0, err
    assert doc["verdict"] == "match" and doc["tasks"][0]["attempts"][0]["port"].startswith("rfc2217://")
    assert f"serial package files of {first_provider}" in err
    # 2. with labgrid's fork as the serial package (what labgrid's own docs expect)
    _pip(fresh, "--force-reinstall", "--no-deps", "pyserial-labgrid")
    assert _serial_check(fresh)["provider"] == "pyserial-labgrid"
    code, err, doc = _lab_run(fresh, tmp_path / "with-fork", models_dir, cache_env)
    assert code == 0, err
    assert doc["verdict"] == "match"


def test_the_plugin_beside_pytest_embedded_uses_a_dut_port(
    fresh: Path,
    pytester: pytest.Pytester,
    models_dir: Path,
    cache_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
):
    """pytest-embedded's `dut` holds the port; flash_and_compare(dut=dut) borrows it and gives it back."""
    _pip(fresh, "pytest-embedded~=2.9", "pytest-embedded-serial~=2.9")
    pytester.makeconftest(
        "import harness.sim\nharness.sim.register()  # pytest-embedded opens sim:// ports\n"
    )
    pytester.makepyfile(
        test_plugin_with_dut=f"""
        MODEL = {str(models_dir / (MODEL + ".tflite"))!r}
        INPUT = {str(models_dir / "inputs" / (MODEL + ".npy"))!r}

        def test_model_on_the_dut(dut, flash_and_compare):
            result = flash_and_compare(MODEL, [INPUT], dut=dut, board_type="sim")
            assert result.verdict == "match", result.errors
            assert result.port.split("?")[0] == dut.serial.port.split("?")[0]
            assert dut.serial.proc.is_open  # pytest-embedded has its port back
        """
    )
    # the board pytest-embedded opens is the one esp-check flashes: give it the board type's flash size
    port = f"sim://emb-{uuid.uuid4().hex[:8]}?emitter=c&flash_size=8MB"
    monkeypatch.setenv("ESP_CHECK_CACHE_DIR", cache_env["ESP_CHECK_CACHE_DIR"])
    res = pytester.run(
        str(fresh / "bin" / "python"), "-m", "pytest", "-p", "no:cacheprovider", "-rs",
        "-p", "no:labgrid",  # labgrid's plugin has a `target` fixture that shadows pytest-embedded's
        "--embedded-services", "serial",
        "--port", port, "--junitxml", str(pytester.path / "out.xml"), timeout=600,
    )  # fmt: skip
    assert res.ret == 0, res.stdout.str()[-5000:]
    props = {
        p.get("name"): p.get("value") for p in ET.parse(pytester.path / "out.xml").getroot().iter("property")
    }
    assert props["esp_check_verdict"] == "match", props
    assert props["esp_check_port"].startswith(port.split("?")[0]) and props["esp_check_simulated"] == "True"
    assert Path(props["esp_check_report"]).exists()
