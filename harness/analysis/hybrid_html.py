"""HTML for the hybrid report and the ESP-NN speedup audit (self-contained, every value escaped)."""

# ruff: noqa: E501  (HTML table markup reads better unwrapped)
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.analysis.html_report import _CSS, _e, audit_html


def _runs_html(doc: Mapping[str, Any]) -> str:
    h = ["<h2>Firmware runs</h2><table><tr><th>run</th><th>ops on ANSI C</th><th>tapped</th><th>result</th><th>why</th></tr>"]
    for r in doc.get("runs") or []:
        ok = r["outcome"] == "good"
        h.append(
            f"<tr><td>{_e(r['label'])}</td><td>{_e(','.join(map(str, r['ansi_ops'])) or '-')}</td>"
            f"<td>{'yes' if r['tapped'] else 'no'}</td><td class='{'good' if ok else 'bad'}'>{_e(r['outcome'])}</td>"
            f"<td>{_e(r.get('why', ''))[:300]}</td></tr>"
        )
    h.append("</table>")
    bis = doc.get("bisection")
    if bis:
        h.append(
            f"<p>bisection: {_e(bis['runs'])} run(s) over {_e(bis['switchable_ops'])} switchable ops (bound "
            f"{_e(bis['bound_per_culprit'])} per culprit), per culprit {_e(bis['runs_per_culprit'])}: {_e(bis['message'])}</p>"
        )
    return "\n".join(h)


def _deliverables_html(doc: Mapping[str, Any]) -> str:
    h: list[str] = []
    cost = doc.get("cost")
    if cost:
        h.append(f"<h2>Cost</h2><p>{_e(cost.get('summary', ''))}</p>")
    drop = doc.get("dropin")
    if drop:
        lines = "\n".join(drop.get("registration") or [])
        h.append(
            f"<h2>Drop-in files</h2><p>{_e(drop['dir'])}: {_e(', '.join(drop['files']))}</p>"
            f"<pre><code>{_e(lines)}</code></pre>"
        )
    for r in doc.get("repro") or []:
        state = "reproduces the ANSI C output on the host" if r.get("ok") else f"NOT verified: {r.get('why', '')}"
        h.append(f"<p>one-op reproducer of op {_e(r['op'])} ({_e(r['kind'])}): <code>{_e(r.get('dir', '-'))}</code> ({_e(state)})</p>")
    return "\n".join(h)


def render_hybrid_html(doc: Mapping[str, Any]) -> str:
    """The hybrid report as one HTML page."""
    verdict = str(doc.get("verdict"))
    cls = "match" if doc.get("offered") else ("mismatch" if verdict == "mismatch" else "other")
    head = "HYBRID OFFERED" if doc.get("offered") else "NO HYBRID OFFERED"
    h = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>esp-check hybrid: {_e(head)}</title><style>{_CSS}</style></head><body>",
        "<h1>esp-check hybrid</h1>",
        f"<div><span class='verdict {cls}'>{_e(head)}</span> exit code {_e(doc.get('exit_code'))} &middot; board "
        f"{_e(doc.get('board'))} &middot; model <code>{_e(doc.get('model'))}</code></div>",
        f"<p>{_e(doc.get('message'))}</p>",
    ]
    if doc.get("simulated"):
        h.append("<div class='sim'>SIMULATED BOARD: no real ESP32 was used for these results.</div>")
    for err in doc.get("errors") or []:
        h.append(f"<div class='bad'>error: {_e(err)}</div>")
    for c in doc.get("culprits") or []:
        h.append(f"<div class='culprit'>op {_e(c['op'])} ({_e(c['kind'])}) runs ANSI C, found by {_e(c['found_by'])}</div>")
    h += [_runs_html(doc), _deliverables_html(doc), audit_html(doc.get("audit"))]
    h.append(f"<p><small>esp-check {_e(doc.get('tool_version'))}</small></p></body></html>\n")
    return "\n".join(h)
