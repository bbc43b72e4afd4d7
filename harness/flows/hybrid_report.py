"""``esp-check hybrid``'s report: report.json (docs/hybrid.md), and on request HTML and a bundle."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from harness import __version__
from harness.analysis.report import report_dict
from harness.errors import Verdict
from harness.flows.records import StageRecord
from harness.resources import atomic_write

if TYPE_CHECKING:
    from harness.flows.hybrid import HybridResult

SCHEMA = "esp-check/hybrid"
SCHEMA_VERSION = 1


def result_doc(
    res: HybridResult, stages: Sequence[StageRecord], *, model: Path, inputs: Sequence[Path]
) -> dict[str, object]:
    """The JSON report of a :class:`harness.flows.hybrid.HybridResult`."""
    base = res.baseline
    ver = res.verification
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "tool_version": __version__,
        "verdict": str(Verdict.from_exit_code(res.exit_code)),
        "exit_code": int(res.exit_code),
        "offered": res.offered,
        "message": res.message,
        "mode": res.mode,
        "simulated": res.simulated,
        "board": res.board,
        "port": res.port,
        "model": str(model),
        "inputs": [str(p) for p in inputs],
        "seconds": round(res.seconds, 3),
        "ansi_ops": res.ansi_ops,
        "culprits": res.culprits,
        "runs": [r.to_dict() for r in res.runs],
        "firmware_runs": len(res.runs),
        "bisection": res.bisection.to_dict() if res.bisection is not None else None,
        "verification": None
        if ver is None
        else {**ver.to_dict(), "comparison": report_dict(ver.comparison) if ver.comparison else None},
        "cost": res.cost,
        "audit": res.audit,
        "dropin": res.dropin,
        "repro": res.repro,
        "baseline": None
        if base is None
        else {
            "report": str(base.report_path),
            "exit_code": int(base.exit_code),
            "verdict": str(base.verdict),
            "culprit": asdict(base.tap.culprit) if base.tap is not None and base.tap.culprit else None,
        },
        "errors": res.errors,
        "warnings": res.warnings,
        "notes": res.notes,
        "stages": [s.to_dict() for s in stages],
    }


def write_hybrid_outputs(
    res: HybridResult,
    stages: Sequence[StageRecord],
    *,
    model: Path,
    inputs: Sequence[Path],
    html: str | Path | None = None,
    bundle: str | Path | None = None,
) -> dict[str, object]:
    """report.json always; the HTML report and the bundle when asked for."""
    doc = result_doc(res, stages, model=model, inputs=inputs)
    atomic_write(res.report_path, json.dumps(doc, indent=2, default=str) + "\n")
    if html is None and bundle is None:
        return doc
    # lazy: jinja2 only for --html/--bundle
    from harness.analysis.html_report import render_hybrid_html, write_html, write_zip

    text = render_hybrid_html(doc)
    if html is not None:
        write_html(Path(html), text)
    if bundle is not None:
        write_zip(Path(bundle), _bundle_head(doc, model, inputs, text), Path(res.out_dir), _BUNDLE_TREES)
    return doc


# what of the output directory a hybrid bundle holds, under the same names
_BUNDLE_TREES = [(s, s) for s in ("hybrid-dropin", "repro", "baseline/report.json", "baseline/logs", "runs")]


def _bundle_head(
    doc: dict[str, object], model: Path, inputs: Sequence[Path], html: str
) -> list[tuple[str, str | Path]]:
    """A zip for an upstream report: the reports, the model and the inputs, then (_BUNDLE_TREES) the drop-in
    files, the one-op reproducers, logs."""
    head: list[tuple[str, str | Path]] = [("report.json", json.dumps(doc, indent=2, default=str) + "\n")]
    head += [("report.html", html), (f"model/{model.name}", model)]
    return head + [(f"inputs/{k}/{p.name}", p) for k, p in enumerate(inputs)]
