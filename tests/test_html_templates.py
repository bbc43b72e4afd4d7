"""The HTML reports (flash-and-compare --html, hybrid --html) come from Jinja2 templates with autoescape
(harness/templates/*.html.j2, package data). Nothing is faked: the report documents are written here
as report.json files are, and rendered by the real templates; the wheel is built by uv (hatchling)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness.analysis.html_report import render_html, render_hybrid_html

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = '<script>alert("x")</script> & "q" \' <img src=x onerror=alert(1)>'


class _Text(HTMLParser):
    """The page as a reader sees it: its text, its tags and its attributes."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.text: list[str] = []
        self.tags: list[str] = []
        self.attrs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs += [v or "" for _, v in attrs]

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _read(html: str) -> _Text:
    p = _Text()
    p.feed(html)
    return p


def _doc(detail: str) -> dict[str, Any]:
    audit = {"chip": HOSTILE, "noise_band": 0.1, "kinds": [{"message": HOSTILE}],
             "rows": [{"op": 0, "kind": HOSTILE, "espnn": False, "reason": HOSTILE, "speedup": 1.0,
                       "flag": "ansi_speed", "cycles_optimized": 1, "cycles_ansi": 1}]}  # fmt: skip
    return {
        "verdict": "mismatch", "exit_code": 1, "board": HOSTILE, "model": f"models/{HOSTILE}.tflite",
        "simulated": True, "errors": [HOSTILE], "tool_version": "0", "message": HOSTILE, "offered": False,
        "variants": {"optimized": {"nn_mode": HOSTILE, "flash": {"chip": HOSTILE}, "capture_valid": True}},
        "comparison": {"comparisons": [{"a": "optimized", "b": "ansi", "run": 0, "output": 0, "name": HOSTILE,
                                        "verdict": "mismatch", "mismatched": 1, "count": 2, "max_diff_lsb": 1,
                                        "mean_diff_lsb": 0.5}]},
        "stages": [{"stage": "capture", "variant": "optimized", "status": "failed", "seconds": 1,
                    "detail": detail}],
        "culprits": [{"op": 3, "kind": HOSTILE, "found_by": HOSTILE}],
        "runs": [{"label": HOSTILE, "ansi_ops": [3], "tapped": True, "outcome": "bad", "why": detail}],
        "dropin": {"dir": HOSTILE, "files": [HOSTILE], "registration": [HOSTILE]},
        "repro": [{"op": 3, "kind": HOSTILE, "dir": HOSTILE, "ok": False, "why": HOSTILE}],
        "audit": audit,
    }  # fmt: skip


@pytest.mark.parametrize("report", ["flash-and-compare", "hybrid"])
def test_names_from_models_devices_and_paths_come_out_escaped(report: str) -> None:
    doc = _doc(HOSTILE)
    html = (
        render_html(SimpleNamespace(comparison=None, tap=None), doc)
        if report != "hybrid"
        else render_hybrid_html(doc)
    )
    page = _read(html)
    assert "script" not in page.tags and "img" not in page.tags  # no markup from the data
    assert not any("alert" in a for a in page.attrs)
    assert "&lt;script&gt;alert(" in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    text = "".join(page.text)
    assert text.count(HOSTILE) >= 5  # and a reader sees the names as they were


@pytest.mark.parametrize("report", ["flash-and-compare", "hybrid"])
def test_a_long_detail_is_cut_before_it_is_escaped(report: str) -> None:
    """Stage details and run reasons are cut to 300 characters: the cut falls in the text, never inside
    an entity (the old f-string report escaped first and cut after, leaving "&quo" in the page)."""
    detail = "x" * 298 + '"<b>bold</b>'
    doc = _doc(detail)
    html = (
        render_html(SimpleNamespace(comparison=None, tap=None), doc)
        if report != "hybrid"
        else render_hybrid_html(doc)
    )
    cells = re.findall(r"<td>(x{298}[^<]*)</td>", html)
    assert cells == ["x" * 298 + "&#34;&lt;"], cells
    assert any(t == detail[:300] for t in _read(html).text)


def test_the_wheel_carries_the_templates_and_py_typed(tmp_path: Path) -> None:
    """The built wheel has harness/templates/*.html.j2 (the reports cannot render without them) and
    harness/py.typed (type checkers read esp-check's annotations)."""
    templates = sorted(p.name for p in (ROOT / "harness" / "templates").glob("*.html.j2"))
    assert {"base.html.j2", "macros.html.j2", "flash_and_compare.html.j2", "hybrid.html.j2"} <= set(templates)
    assert (ROOT / "harness" / "py.typed").is_file()
    uv = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))  # the venv's own
    if uv is None:
        pytest.skip("uv is not installed (pip install uv): the wheel cannot be built here")
    src = tmp_path / "src"
    shutil.copytree(
        ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "tests", "*.pyc", "__pycache__", "bench")
    )
    proc = subprocess.run(
        [uv, "build", "--wheel", "--offline", "-o", str(tmp_path / "dist"), str(src)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    offline = ("offline", "network was disabled", "not found in the cache")  # as uv words it
    if proc.returncode != 0 and any(word in proc.stderr.lower() for word in offline):
        pytest.skip(
            f"hatchling is not in uv's cache and the index is unreachable: {proc.stderr.strip()[:200]}"
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "harness/py.typed" in names
    assert {f"harness/templates/{t}" for t in templates} <= names
