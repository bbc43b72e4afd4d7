"""The pytest plugin (harness/pytest_plugin.py), run by pytester the way users run it.

Real: pytest and its entry-point plugin loading, the plugin's fixtures and options, esp-check's
flash-and-compare on the simulated board (the only fake, the board), pytest's JUnit XML.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

# pytester restores sys.modules after each in-process run, so what a run imports is imported again by the
# next: TFLM's compiled extension then fails ("already registered"), and a serial object made by one copy
# of pyserial is not an instance of the other's classes. Imported here once (numpy, pyserial, esp-check,
# TFLM), they are kept across runs. The plugin's own inertness is checked in a fresh interpreter below.
import numpy  # noqa: F401
import pytest
import serial  # noqa: F401

import harness.api  # noqa: F401

with contextlib.suppress(ImportError):
    import tflite_micro  # noqa: F401

pytest_plugins = ["pytester"]
MODEL = "op_zoo"


def _props(junit: Path) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        out[case.get("name", "")] = {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
    return out


@pytest.fixture(autouse=True)
def _inner_runs_like_ours(request: pytest.FixtureRequest) -> None:
    """pytester's runs do not read this project's addopts: block labgrid's and pytest-embedded's plugins
    there too (with both loaded every test is skipped: labgrid's `target` fixture, docs/ci.md)."""
    if "pytester" in request.fixturenames:
        ini = "[pytest]\naddopts = -p no:labgrid -p no:pytest_embedded\n"
        request.getfixturevalue("pytester").makeini(ini)


@pytest.fixture
def cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ESP_CHECK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "plugin-cache"))


def _normalized(result: pytest.RunResult) -> list[str]:
    """The run's output without what differs between any two runs (times) or names plugins."""
    lines = [re.sub(r"\d+\.\d+s", "T", line) for line in result.outlines]
    return [line for line in lines if not line.startswith(("plugins:", "rootdir:", "cachedir:"))]


def test_the_plugin_is_loaded_from_its_entry_point_and_inert(pytester: pytest.Pytester):
    """Installed, it loads into every pytest run: a suite that does not use it runs exactly as without it."""
    assert pytester.parseconfig().pluginmanager.hasplugin("esp_check")
    assert not pytester.parseconfig("-p", "no:esp_check").pluginmanager.hasplugin("esp_check")
    pytester.makepyfile(
        test_plugin_inert_plain="""
        import logging
        def test_ok():
            logging.getLogger("x").warning("hello")
        def test_fails():
            logging.getLogger("x").warning("captured")
            assert 1 == 2
        """
    )
    with_plugin = pytester.runpytest("--junitxml=out.xml", "-p", "no:cacheprovider", "-rA")
    with_plugin.assert_outcomes(passed=1, failed=1)
    assert all(not p for p in _props(pytester.path / "out.xml").values())  # no JUnit properties
    without = pytester.runpytest("--junitxml=out.xml", "-p", "no:esp_check", "-p", "no:cacheprovider", "-rA")
    assert _normalized(with_plugin) == _normalized(without)  # same output, same captured log format
    assert "captured" in with_plugin.stdout.str()
    help_text = pytester.runpytest("--help").stdout.str()
    assert "--esp-check-board" in help_text and "--esp-check-labgrid" in help_text


def test_importing_the_plugin_imports_nothing_heavy():
    code = (
        "import sys, harness.pytest_plugin\n"
        "heavy = ('numpy', 'harness.api', 'serial', 'esptool', 'harness.flows')\n"
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.slow
@pytest.mark.usefixtures("cache")
def test_flash_and_compare_fixture_gives_the_result_and_junit_properties(
    pytester: pytest.Pytester, models_dir: Path
):
    pytest.importorskip("tflite_micro")
    pytester.makepyfile(
        test_plugin_on_sim=f"""
        MODEL = {str(models_dir / (MODEL + ".tflite"))!r}
        INPUT = {str(models_dir / "inputs" / (MODEL + ".npy"))!r}

        def test_match(flash_and_compare, esp_check_board):
            assert esp_check_board.source == "options" and esp_check_board.simulated
            result = flash_and_compare(MODEL, [INPUT])
            assert result.verdict == "match", result.errors

        def test_mismatch(flash_and_compare, esp_check_board):
            from dataclasses import replace
            faulty = esp_check_board.port + "&fault=corrupt&variant_fault=optimized"
            bad = replace(esp_check_board, port=faulty)
            result = flash_and_compare(MODEL, [INPUT], board=bad)
            assert result.verdict == "match"  # fails: the optimized build corrupts outputs
        """
    )
    name = f"plug-{uuid.uuid4().hex[:8]}"
    res = pytester.runpytest(
        "--esp-check-board", "sim", "--esp-check-port", f"sim://{name}?emitter=c", "--junitxml=out.xml",
        "-p", "no:cacheprovider",
    )  # fmt: skip
    res.assert_outcomes(passed=1, failed=1)
    props = _props(pytester.path / "out.xml")
    good, bad = props["test_match"], props["test_mismatch"]
    assert good["esp_check_verdict"] == "match" and good["esp_check_exit_code"] == "0"
    assert bad["esp_check_verdict"] == "mismatch" and bad["esp_check_exit_code"] == "1"
    for p in (good, bad):
        assert p["esp_check_simulated"] == "True" and p["esp_check_board"] == "sim"
        report = json.loads(Path(p["esp_check_report"]).read_text())
        assert report["exit_code"] == int(p["esp_check_exit_code"])
        for v in ("optimized", "ansi"):
            assert Path(p[f"esp_check_serial_log_{v}"]).stat().st_size > 0
    assert Path(good["esp_check_out_dir"]) != Path(bad["esp_check_out_dir"])


def test_a_board_fixture_without_a_board_is_a_clear_error(pytester: pytest.Pytester):
    pytester.makepyfile(test_x="def test_x(esp_check_board):\n    pass\n")
    res = pytester.runpytest("-p", "no:cacheprovider")
    res.assert_outcomes(errors=1)
    res.stdout.fnmatch_lines(["*no esp-check board: pass --esp-check-board TYPE --esp-check-port PORT*"])


def test_the_board_can_come_from_an_inventory(pytester: pytest.Pytester):
    name = f"inv-{uuid.uuid4().hex[:8]}"
    (pytester.path / "bench.toml").write_text(
        f'[[board]]\nname = "a"\ntype = "sim"\nport = "sim://{name}-a"\n\n'
        f'[[board]]\nname = "b"\ntype = "sim-usbjtag"\nport = "sim://{name}-b"\n'
    )
    pytester.makepyfile(
        test_x="""
        def test_x(esp_check_board):
            assert esp_check_board.source.endswith("board b")
            assert esp_check_board.board.name == "sim-usbjtag" and esp_check_board.simulated
            assert esp_check_board.port.startswith("sim://")
        """
    )
    res = pytester.runpytest("--esp-check-inventory", "bench.toml", "--esp-check-board-name", "b")
    res.assert_outcomes(passed=1)


def test_a_port_without_a_board_type_is_a_usage_error(pytester: pytest.Pytester):
    pytester.makepyfile(test_x="def test_x(esp_check_board):\n    pass\n")
    res = pytester.runpytest("--esp-check-port", "sim://x")
    assert res.ret != 0
    assert "--esp-check-port needs --esp-check-board TYPE" in res.stdout.str() + res.stderr.str()


@pytest.mark.slow
@pytest.mark.usefixtures("cache")
def test_a_failed_assertion_on_the_result_says_why(pytester: pytest.Pytester, models_dir: Path):
    """`assert result.verdict == "match", result.summary`, as docs/ci.md writes it: a mismatch, a crash
    and a board that is not there each say what happened (``result.errors`` alone printed `[]`)."""
    pytest.importorskip("tflite_micro")
    pytester.makepyfile(
        test_why=f"""
        from dataclasses import replace
        MODEL = {str(models_dir / (MODEL + ".tflite"))!r}
        INPUT = {str(models_dir / "inputs" / (MODEL + ".npy"))!r}

        def _run(flash_and_compare, board, port):
            return flash_and_compare(MODEL, [INPUT], board=replace(board, port=port))

        def test_mismatch(flash_and_compare, esp_check_board):
            port = esp_check_board.port + "&fault=corrupt&variant_fault=optimized"
            result = _run(flash_and_compare, esp_check_board, port)
            assert result.verdict == "match", result.summary

        def test_crash(flash_and_compare, esp_check_board):
            port = esp_check_board.port + "&fault=panic&variant_fault=optimized"
            result = _run(flash_and_compare, esp_check_board, port)
            assert result.verdict == "match", result.summary

        def test_no_board(flash_and_compare, esp_check_board):
            result = _run(flash_and_compare, esp_check_board, "rfc2217://127.0.0.1:9")
            assert result.verdict == "match", result.summary
        """
    )
    name = f"why-{uuid.uuid4().hex[:8]}"
    res = pytester.runpytest(
        "--esp-check-board", "sim", "--esp-check-port", f"sim://{name}?emitter=c", "-p", "no:cacheprovider",
    )  # fmt: skip
    res.assert_outcomes(failed=3)
    said = {
        m.group(1): m.group(2)
        for m in re.finditer(r"^E\s+AssertionError: ((\w+) \(exit \d\) on sim.*)$", res.stdout.str(), re.M)
    }
    said = {v: k for k, v in said.items()}  # verdict -> its line
    assert set(said) == {"mismatch", "firmware_fault", "infrastructure_error"}, res.stdout.str()
    assert "elements differ by more than" in said["mismatch"], said
    assert said["firmware_fault"].startswith("firmware_fault (exit 4) on sim [SIMULATED]: optimized: "), said
    assert re.search(r"panic|Guru Meditation", said["firmware_fault"], re.I), said
    assert said["infrastructure_error"].startswith("infrastructure_error (exit 3) on sim [SIMULATED]: "), said
    assert "cannot connect to rfc2217://127.0.0.1:9" in said["infrastructure_error"], said
    assert "AssertionError: []" not in res.stdout.str()
