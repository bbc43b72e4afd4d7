"""The lazy CLI: a command's module loads only when that command runs.

`esp-check --version` and `esp-check bench check-serial` must work in a venv whose `serial` package is
gone (check-serial exists to diagnose that venv). Each test runs the real entry point in a subprocess
in which `import serial` fails (a `None` entry in sys.modules, what Python does for a blocked module);
nothing else is faked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from harness.cli import LAZY_COMMANDS, LazyGroup, cli
from harness.errors import ExitCode, InfrastructureError

ROOT = Path(__file__).resolve().parent.parent

_BLOCKED = (
    "import sys\n"
    "for name in {blocked!r}: sys.modules[name] = None\n"
    "sys.argv[0] = 'esp-check'\n"
    "from harness.cli import entry\n"
    "entry()\n"
)


def _run(*args: str, blocked: tuple[str, ...] = ("serial",)) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", _BLOCKED.format(blocked=blocked), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_version_runs_without_pyserial():
    r = _run("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("esp-check, version "), r.stdout


def test_check_serial_runs_without_pyserial():
    r = _run("bench", "check-serial", "--json")
    assert "ModuleNotFoundError" not in r.stderr, r.stderr
    doc = json.loads(r.stdout)
    # the verdict is about the files on disk, which this test leaves as installed
    assert r.returncode == (0 if doc["ok"] else 3), (r.returncode, doc)
    assert {"installed", "provider", "missing", "unmet", "fix"} <= set(doc)


def test_version_loads_none_of_the_command_modules():
    code = (
        "import sys\nfrom harness.cli import main\nrc = main(['--version'])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('serial', 'esptool', 'numpy', 'rich')"
        " or m.startswith(('harness.commands.', 'harness.device', 'harness.flows')))\n"
        "print(rc, heavy)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("0 []"), r.stdout


def test_help_lists_every_command_and_names_what_one_cannot_load():
    # no command module imports pyserial, esptool or jinja2 when it loads any more (they come with the
    # flash, the capture and the rendering a command runs), but every one that computes needs numpy
    blocked = ("serial", "esptool", "jinja2", "numpy")
    r = _run("--help", blocked=blocked)
    assert r.returncode == 0, r.stderr
    for name in LAZY_COMMANDS:
        assert f"  {name} " in r.stdout, (name, r.stdout)
    assert any(f"needs the Python package '{pkg}'" in r.stdout for pkg in blocked), r.stdout


def test_a_command_whose_package_is_missing_exits_3_with_the_repair(tmp_path, monkeypatch):
    """A command module that imports a package this venv lacks: exit 3 naming it, not exit 70."""
    (tmp_path / "needs_missing_pkg.py").write_text("import esp_check_no_such_package\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    group = LazyGroup(name="esp-check", lazy={"fancy": "needs_missing_pkg:fancy_cmd"})
    with pytest.raises(InfrastructureError) as info:
        group.main(["fancy"], standalone_mode=False)
    assert info.value.exit_code == ExitCode.INFRASTRUCTURE
    assert "needs the Python package 'esp_check_no_such_package'" in str(info.value)
    assert "check-serial" in str(info.value)


def test_a_missing_module_of_the_tool_itself_stays_a_bug():
    group = LazyGroup(name="esp-check", lazy={"gone": "harness.commands.no_such_module:cmd"})
    with pytest.raises(ModuleNotFoundError):
        group.main(["gone"], standalone_mode=False)


def test_every_table_entry_is_a_click_command_of_that_name():
    ctx = click.Context(cli)
    for name in LAZY_COMMANDS:
        command = cli.get_command(ctx, name)
        assert isinstance(command, click.Command) and command.name == name, name


LIST_MODULES = ROOT / "bench" / "list_modules.py"  # writes what a CLI run loaded


def test_bench_detect_loads_no_pipeline_and_no_esptool(tmp_path: Path) -> None:
    """`bench detect` imports the runner (the inventory): the pipeline, esptool (only a chip probe's) and
    YAML (only a labgrid place's) stay out, as the runner's imports inside functions say."""
    listed = tmp_path / "modules.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(LIST_MODULES), str(listed), "bench", "detect", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    loaded = set(listed.read_text().split())
    assert "harness.runner.inventory" in loaded  # (the list is of a run that used the runner)
    unused = {"harness.flows.job", "harness.flows.flash_and_compare", "harness.flows.dataset"}
    unused |= {"harness.device.flash", "esptool", "yaml"}
    assert loaded & unused == set()
