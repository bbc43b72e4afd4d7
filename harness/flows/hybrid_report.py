"""``esp-check hybrid``'s report: report.json (docs/hybrid.md), and on request HTML and a bundle."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Sequence
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
            "culprit": base.tap.culprit.to_dict() if base.tap is not None and base.tap.culprit else None,
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
    text = None
    if html is not None or bundle is not None:
        from harness.analysis.html_report import render_hybrid_html  # lazy: jinja2 only for --html/--bundle

        text = render_hybrid_html(doc)
    if html is not None and text is not None:
        Path(html).parent.mkdir(parents=True, exist_ok=True)
        Path(html).write_text(text, encoding="utf-8")
    if bundle is not None:
        _bundle(res, doc, model, inputs, Path(bundle), text)
    return doc


def _bundle(
    res: HybridResult,
    doc: dict[str, object],
    model: Path,
    inputs: Sequence[Path],
    dest: Path,
    html: str | None,
) -> None:
    """A zip for an upstream report: reports, the drop-in files, the one-op reproducers, logs, the model."""
    out = Path(res.out_dir)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(dest.suffix + ".tmp")
    skip = {".pio", "build", "managed_components", "__pycache__"}
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("report.json", json.dumps(doc, indent=2, default=str) + "\n")
        if html is not None:
            z.writestr("report.html", html)
        z.write(model, f"model/{model.name}")
        for k, p in enumerate(inputs):
            z.write(p, f"inputs/{k}/{p.name}")
        for sub in ("hybrid-dropin", "repro", "baseline/report.json", "baseline/logs", "runs"):
            root = out / sub
            files = [root] if root.is_file() else sorted(root.rglob("*")) if root.is_dir() else []
            for f in files:
                rel = f.relative_to(out)
                if f.is_file() and not (set(rel.parts) & skip):
                    z.write(f, rel.as_posix())
    tmp.replace(dest)
