"""HTML for the hybrid report (harness/templates/hybrid.html.j2: self-contained, every value escaped)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.analysis.html_report import audit_view, render


def render_hybrid_html(doc: Mapping[str, Any]) -> str:
    """The hybrid report as one HTML page."""
    verdict = str(doc.get("verdict"))
    view = {
        "cls": "match" if doc.get("offered") else ("mismatch" if verdict == "mismatch" else "other"),
        "head": "HYBRID OFFERED" if doc.get("offered") else "NO HYBRID OFFERED",
        "audit": audit_view(doc.get("audit")),
    }
    return render("hybrid.html.j2", doc=doc, view=view)
