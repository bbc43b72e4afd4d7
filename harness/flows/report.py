"""flash-and-compare's reports: report.json (docs/flash-and-compare-schema.json) and JUnit XML."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from pathlib import Path

from harness import __version__
from harness.analysis import junit
from harness.analysis.compare import results_document
from harness.analysis.report import RAW_LOG_MAX, compare_cases, compare_suite, error_case, report_dict
from harness.analysis.schemas import check_version, compare_v1, versioned
from harness.errors import EspCheckError, ExitCode, write_error
from harness.flashfmt.partitions import VARIANTS
from harness.flows.records import FlashAndCompareResult, VariantRun, variant_failure
from harness.resources import atomic_write

SCHEMA_VERSION = 2  # 2: stage status ok|failed only; the embedded compare report is version 2


def result_dict(
    result: FlashAndCompareResult, *, model: Path | None, inputs: Sequence[Path], seconds: float
) -> dict[str, object]:
    """The JSON report (``report.json``); schema: docs/flash-and-compare-schema.json."""
    return {
        "schema": "esp-check/flash-and-compare",
        "schema_version": SCHEMA_VERSION,
        "tool_version": __version__,
        "verdict": str(result.verdict),
        "exit_code": int(result.exit_code),
        "simulated": result.simulated,
        "native": result.native,
        "board": result.board,
        "port": result.port,
        "model": str(model) if model is not None else "",
        "inputs": [str(p) for p in inputs],
        "seconds": round(seconds, 3),
        "errors": result.errors,
        "warnings": result.warnings,
        "stages": [s.to_dict() for s in result.stages],
        "variants": {
            v: {
                "project_dir": str(r.project_dir) if r.project_dir else None,
                "firmware_sha256": r.firmware_sha256,
                "build_cache_hit": r.build_cache_hit,
                "flash": r.flash,
                "serial_log": str(r.serial_log) if r.serial_log else None,
                "capture_valid": r.capture_valid,
                "nn_mode": r.nn_mode,
                "problems": r.problems,
                "findings": r.findings,
                "results": results_document(r.source) if r.source is not None else None,
            }
            for v, r in result.variants.items()
        },
        "comparison": report_dict(result.comparison) if result.comparison is not None else None,
        "tap": result.tap.to_dict() if result.tap is not None else None,
        "espnn": result.espnn,
        "reference_refused": result.reference_refused,
        "link": result.link,
        "dataset": result.dataset,
    }


def write_report(
    result: FlashAndCompareResult, *, model: Path | None, inputs: Sequence[Path], seconds: float
) -> None:
    """report.json, replaced atomically. When it cannot be written (a full disk), no half file and no
    earlier report stays behind: an old "match" beside this run's logs would be a false verdict."""
    doc = result_dict(result, model=model, inputs=inputs, seconds=seconds)
    try:
        atomic_write(result.report_path, json.dumps(doc, indent=2, default=str) + "\n")
    except OSError as exc:
        with contextlib.suppress(OSError):
            result.report_path.unlink(missing_ok=True)
        raise write_error(exc, str(result.report_path)) from None


def write_refusal(out_dir: Path, message: str) -> None:
    """Replace an earlier report.json in ``out_dir`` by one that says usage_error (exit 2, ``message``):
    a command line refused before the run (click's checks, exclusive flags) must not leave the last
    run's "match" in place. Nothing is created where no report was."""
    report = out_dir / "report.json"
    if not report.is_file():
        return
    result = FlashAndCompareResult(
        out_dir=out_dir, board="", port="", simulated=False, stages=[],
        variants={v: VariantRun(v) for v in VARIANTS}, comparison=None, exit_code=ExitCode.USAGE,
        report_path=report, errors=[f"stopped: {message}"],
    )  # fmt: skip
    with contextlib.suppress(EspCheckError):  # cannot be written: write_report removed the old one
        write_report(result, model=None, inputs=[], seconds=0.0)


def discard_report(out_dir: Path) -> None:
    """Remove an earlier run's report.json (and a left-over .tmp) before this run writes its own: if
    this run cannot finish its report (killed, disk full), no earlier verdict is left to be read as its."""
    for name in ("report.json", "report.json.tmp"):
        path = out_dir / name
        try:
            if path.is_file() or path.is_symlink():
                path.unlink()
        except OSError as exc:
            raise write_error(exc, f"the earlier {path}") from None


def write_junit(
    result: FlashAndCompareResult, path: Path, *, model: Path | None = None, inputs: Sequence[Path] = ()
) -> None:
    """The comparison's testcases plus one per variant that did not run cleanly (crash, no capture);
    ``classname`` ``esp-check.<model>.<board>`` (harness.analysis.junit)."""
    where = (model.stem if model is not None else "", result.board)
    cls = junit.classname(*where)
    logs = {
        v: r.serial_log.read_bytes()
        for v, r in result.variants.items()
        if r.serial_log and r.serial_log.exists()
    }
    if result.comparison is not None:
        cases = compare_cases(result.comparison, where, inputs)
    else:  # a dataset's one case is named as run names it; a run that compared nothing: "compare"
        source = (result.dataset or {}).get("source")
        name = "compare" if result.dataset is None else junit.case_name(0, str(source), "dataset")
        message = "; ".join(result.errors) or str(result.verdict)
        cases = [error_case(message, result.exit_code, logs, where, name)]
    for v, r in result.variants.items():
        if r.exit_code is None:
            continue
        message = variant_failure([s for s in result.stages if s.variant == v], r.findings, r.problems)
        outcome, kind = junit.outcome_of(r.exit_code)
        out = logs.get(v, b"").decode("utf-8", "replace")
        cases.append(junit.Case(cls, f"{v}.run", outcome, kind, message, text=message, out=out))
    out = junit.log_text(logs, RAW_LOG_MAX)  # a "run" case's: no comparison or variant showed the verdict
    cases = junit.with_run_case(cases, result.exit_code, cls, "; ".join(result.errors), out)
    junit.write(junit.tree([compare_suite(cases, result.comparison)]), path)


def _v1(doc: dict[str, object]) -> dict[str, object]:
    comparison = doc.get("comparison")
    if isinstance(comparison, dict):
        compare_v1(comparison)["schema_version"] = 1
    return doc


_DOWNGRADES = {1: _v1}


def check_report_version(schema_version: int | None) -> None:
    """Refuse an unknown --schema-version before the run, not after it."""
    check_version(schema_version, SCHEMA_VERSION, _DOWNGRADES, what="flash-and-compare report")


def report_as(doc: dict[str, object], schema_version: int | None) -> dict[str, object]:
    """report.json as ``schema_version`` (the previous version is deprecated, for one release)."""
    return versioned(doc, schema_version, what="flash-and-compare report", downgrades=_DOWNGRADES)
