"""``esp-check hybrid``'s report: the HTML template engine is needed only when HTML or a bundle is asked for.

Real: the report writer on a hybrid result. To show what it imports, ``jinja2`` is blocked (a ``None``
entry in sys.modules, what Python does for a blocked module) and the HTML report module unloaded;
nothing else is faked.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from harness.flows.hybrid import HybridResult
from harness.flows.hybrid_report import write_hybrid_outputs


def _result(out: Path) -> HybridResult:
    return HybridResult(out_dir=out, report_path=out / "report.json", message="no hybrid needed")


def test_a_hybrid_report_without_html_needs_no_template_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "jinja2", None)
    monkeypatch.delitem(sys.modules, "harness.analysis.html_report", raising=False)
    doc = write_hybrid_outputs(_result(tmp_path), [], model=tmp_path / "m.tflite", inputs=[])
    assert json.loads((tmp_path / "report.json").read_text()) == json.loads(json.dumps(doc, default=str))
    assert doc["message"] == "no hybrid needed"
    assert "harness.analysis.html_report" not in sys.modules


def test_a_hybrid_report_with_html_renders_it(tmp_path: Path) -> None:
    html = tmp_path / "hybrid.html"
    write_hybrid_outputs(_result(tmp_path), [], model=tmp_path / "m.tflite", inputs=[], html=html)
    assert "no hybrid needed" in html.read_text()
