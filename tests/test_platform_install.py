"""Dependency resolution for the platforms desk users have (macOS, Windows, ARM Linux).

pip's ``--dry-run --platform`` cannot check this from a Linux x86-64 host: pip evaluates environment
markers (``sys_platform``, ``platform_machine``) against the *running* interpreter, so it would try to
install the Linux-only tflite-micro wheel "for macOS". uv's ``--python-platform`` evaluates markers for
the target, so it is what proves that ``pip install esp-check`` resolves there. Needs the package index;
skips (with the reason) when it is unreachable.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# target -> (tflite-micro expected, ai-edge-litert expected)
TARGETS = {
    "aarch64-apple-darwin": (False, True),
    "x86_64-pc-windows-msvc": (False, True),
    "aarch64-unknown-linux-gnu": (False, True),
    "x86_64-apple-darwin": (False, False),  # no wheel of either: installs, without a host reference
    "x86_64-unknown-linux-gnu": (True, False),
}


def _compile(target: str, python: str) -> str:
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not installed (pip install uv)")
    cmd = [uv, "pip", "compile", str(ROOT / "pyproject.toml"), "--python-platform", target]
    cmd += ["--python-version", python, "--quiet", "--no-header"]
    # uv's cache answers in well under a second; go to the index only when the cache cannot.
    proc = subprocess.run([*cmd, "--offline"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    if proc.returncode != 0:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    if proc.returncode != 0 and re.search(r"(?i)failed to fetch|connect|network|dns", proc.stderr):
        pytest.skip(f"package index unreachable: {proc.stderr.strip()[:200]}")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("python", ["3.12"])
def test_dependencies_resolve_on_every_platform(target: str, python: str) -> None:
    pins = {
        m.group(1).lower(): m.group(2)
        for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+)", _compile(target, python), re.M)
    }
    want_tflm, want_litert = TARGETS[target]
    assert ("tflite-micro" in pins) == want_tflm
    assert ("ai-edge-litert" in pins) == want_litert
    # what inspect/generate/flash need is there everywhere
    for name in ("esptool", "pyserial", "tflite", "jinja2", "numpy", "click", "rich", "pillow"):
        assert name in pins, f"{name} missing for {target}"
    assert pins["esptool"].startswith("5.")


def test_the_toml_backport_is_chosen_in_one_place() -> None:
    """pyproject.toml supports Python 3.10, which has no ``tomllib`` (3.11's), so tomli stands in there:
    that choice is made once, by harness.resources (``parse_toml``), and everything else takes it from
    there, tests included."""
    assert re.search(r'^requires-python = ">=3\.10"$', (ROOT / "pyproject.toml").read_text(), re.M)
    switches = sorted(
        str(p.relative_to(ROOT))
        for folder in ("harness", "tests")
        for p in (ROOT / folder).rglob("*.py")
        if re.search(r"^\s*(import|from) tomli\b", p.read_text(encoding="utf-8"), re.M)
    )
    assert switches == ["harness/resources.py"]
