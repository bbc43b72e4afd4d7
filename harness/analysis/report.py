"""Reports for a comparison: a rich terminal table, versioned JSON (docs/report-schema.json), JUnit XML.

The JSON report's model and why it is built by hand: :mod:`harness.analysis.report_model`; the JUnit
naming rule: docs/ci.md.
"""

from __future__ import annotations

import dataclasses
import math
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from harness import __version__
from harness.analysis import junit
from harness.analysis.compare import CompareResult, Source, TensorComparison
from harness.analysis.schemas import compare_v1, versioned
from harness.errors import ExitCode
from harness.jsontypes import json_number

SCHEMA_ID: Final = "esp-check-compare-report"
SCHEMA_VERSION: Final = 2  # 2: one verdict vocabulary (usage_error, infrastructure_error, internal_error)
RAW_LOG_MAX = 256 * 1024  # per source in JUnit system-out (head and tail kept)


def _values(xs: Sequence[float | None] | None) -> list[float | str | None] | None:
    return None if xs is None else [json_number(x) for x in xs]


def _mismatch(m: dict[str, float | int]) -> dict[str, object]:
    doc: dict[str, object] = {"index": m["index"], "a": json_number(m["a"]), "b": json_number(m["b"])}
    diff = m.get("diff_lsb")
    if diff is not None:  # (no scale: no LSB, and no key)
        doc["diff_lsb"] = json_number(diff)
    return doc


def _source(s: Source) -> dict[str, object]:
    """One SourceDoc (harness.analysis.report_model), its keys in the model's order."""
    return {
        "label": s.label, "kind": s.kind, "path": s.path, "nn": s.nn_mode, "model_sha256": s.model_sha256,
        "simulated": s.simulated, "input_sha256": list(s.input_sha256), "invoke_us": list(s.invoke_us),
        "info": dict(s.info), "backend_version": s.backend_version,
    }  # fmt: skip


def _comparison(c: TensorComparison) -> dict[str, object]:
    """One ComparisonDoc (harness.analysis.report_model), its keys in the model's order."""
    return {
        "a": c.a, "b": c.b, "run": c.run, "output": c.output, "name": c.name,
        "verdict": "match" if c.match else "mismatch",
        "count": c.count, "mismatched": c.mismatched, "tolerance_lsb": c.tolerance_lsb, "units": c.units,
        "scale": c.scale, "zero_point": c.zero_point,
        "max_abs_diff": json_number(c.max_abs_diff), "mean_abs_diff": json_number(c.mean_abs_diff),
        "max_diff_lsb": json_number(c.max_diff_lsb), "mean_diff_lsb": json_number(c.mean_diff_lsb),
        "rmse": json_number(c.rmse), "cosine": json_number(c.cosine),
        "argmax_a": c.argmax_a, "argmax_b": c.argmax_b, "argmax_agree": c.argmax_agree,
        "topk": c.topk, "topk_agreement": c.topk_agreement,
        "pinned_a": c.pinned_a, "pinned_b": c.pinned_b,
        "pinned_fraction_a": c.pinned_fraction_a, "pinned_fraction_b": c.pinned_fraction_b,
        "diff_lsb": _values(c.diff_lsb), "values_a": _values(c.values_a), "values_b": _values(c.values_b),
        "first_mismatches": [_mismatch(m) for m in c.first_mismatches],
    }  # fmt: skip


def report_dict(result: CompareResult, schema_version: int | None = None) -> dict[str, object]:
    """The JSON report (docs/report-schema.json); ``schema_version=1`` for the deprecated form."""
    doc: dict[str, object] = {
        "schema": SCHEMA_ID,
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "esp-check", "version": __version__},
        "reference_backend": result.reference_backend,
        "simulated": result.simulated,
        "verdict": str(result.verdict),
        "exit_code": int(result.exit_code),
        "tolerance_lsb": result.tolerance_lsb,
        "ref_tolerance_lsb": result.ref_tolerance_lsb,
        "sources": [_source(s) for s in result.sources],
        "comparisons": [_comparison(c) for c in result.comparisons],
        "faults": [dataclasses.asdict(f) for f in result.faults],  # FaultDoc: Fault's fields, in order
        "warnings": list(result.warnings),
    }
    return versioned(doc, schema_version, what="compare report", downgrades={1: compare_v1})


# C0 controls, DEL and C1 controls as ``\\xNN``, bidi overrides and isolates as ``\\uNNNN``
_VISIBLE = {o: f"\\x{o:02x}" for o in (*range(0x20), *range(0x7F, 0xA0))} | {
    o: f"\\u{o:04x}" for o in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))
}


def sanitize_text(text: object) -> str:
    """Text from a model or a device, made safe for a terminal: control characters (ESC sequences
    such as OSC 52 clipboard writes or title changes, C1 controls, DEL, bidi overrides) are shown
    as visible ``\\xNN``/``\\uNNNN`` escapes instead of reaching the terminal."""
    return str(text).translate(_VISIBLE)


def safe_markup(text: object) -> str:
    """Untrusted text for a rich markup string: sanitized, and its ``[...]`` shown, not interpreted."""
    return escape(sanitize_text(text))


def safe_lines(text: object, indent: str = "  ") -> str:
    """Multi-line untrusted text (an error with its hint, a build log excerpt) for rich markup: each line
    sanitized and escaped, line breaks kept (not shown as a literal ``\\x0a``), later lines indented."""
    return f"\n{indent}".join(safe_markup(line) for line in str(text).splitlines() or [""])


def _fmt(x: float | None, digits: int = 4) -> str:
    if x is None:
        return "-"
    if float(x).is_integer() and abs(x) < 1e15:
        return str(int(x))
    return f"{x:.{digits}g}"


# the rows of the terminal table: the metric and its cell in one pair's column
_METRICS: tuple[tuple[str, Callable[[TensorComparison], str]], ...] = (
    ("elements", lambda c: str(c.count)),
    ("mismatched", lambda c: f"{c.mismatched} (tol {_fmt(c.tolerance_lsb)} LSB)"),
    ("max |diff| LSB", lambda c: _fmt(c.max_diff_lsb)),
    ("mean |diff| LSB", lambda c: _fmt(c.mean_diff_lsb, 3)),
    ("max |diff| real", lambda c: _fmt(c.max_abs_diff)),
    ("RMSE", lambda c: _fmt(c.rmse)),
    ("cosine", lambda c: _fmt(c.cosine, 6)),
    ("argmax", lambda c: f"{c.argmax_a} vs {c.argmax_b}"),
    ("top-k overlap", lambda c: "-" if c.topk_agreement is None else f"{c.topk_agreement:.0%} of {c.topk}"),
    ("pinned min/max", lambda c: ", ".join(s for s, p in ((c.a, c.pinned_a), (c.b, c.pinned_b)) if p) or "-"),
)


def print_report(
    result: CompareResult,
    console: Console | None = None,
    *,
    verdict_label: str | None = "verdict",
    simulated: bool | None = None,
) -> None:
    """Terminal report: per output, one column per compared pair; mismatches in red. ``verdict_label``
    None: no verdict line (the caller prints the run's one); ``simulated`` overrides the result's flag."""
    con = console or Console()
    labels = {}  # ``label (mode)``, just ``label`` where the mode repeats it (no "ansi (ansi_c)")
    for s in result.sources:
        mode = s.nn_mode or s.kind
        same = mode == s.label or (s.label, mode) == ("ansi", "ansi_c")
        labels[s.label] = safe_markup(s.label if same else f"{s.label} ({mode})")
    simulated = result.simulated if simulated is None else simulated
    groups: dict[tuple[int, int], list[TensorComparison]] = {}
    for c in result.comparisons:
        groups.setdefault((c.run, c.output), []).append(c)
    for (run, out), comps in groups.items():
        name = next((c.name for c in comps if c.name), "")
        title = f"run {run}, output {out}" + (f" ({safe_markup(name)})" if name else "")
        if simulated:
            title += " \\[SIMULATED board]"
        table = Table(title=title, title_justify="left")
        table.add_column("metric")
        for c in comps:
            table.add_column(f"{labels.get(c.a, c.a)}\nvs {labels.get(c.b, c.b)}", justify="right")
        for metric, cell in _METRICS:
            table.add_row(metric, *[Text(cell(c), style="" if c.match else "red") for c in comps])
        table.add_row(
            "verdict",
            *[Text("match", style="green") if c.match else Text("MISMATCH", style="bold red") for c in comps],
        )
        con.print(table)
    for c in result.comparisons:
        if c.match or c.values_a is None or c.values_b is None:
            continue
        detail = Table(title=f"{c.a} vs {c.b}, run {c.run} output {c.output}: per element")
        for col in ("index", c.a, c.b, "|diff| LSB"):
            detail.add_column(col, justify="right")
        for j, (va, vb) in enumerate(zip(c.values_a, c.values_b, strict=True)):
            d = c.diff_lsb[j] if c.diff_lsb is not None else None
            differs = va != vb and not (math.isnan(va) and math.isnan(vb))
            detail.add_row(str(j), f"{va:.8g}", f"{vb:.8g}", _fmt(d), style="red" if differs else None)
        con.print(detail)
    for f in result.faults:  # device-provided text: escaped, never interpreted as markup
        detail_text = f" in {f.source}: stage {f.stage}, code {f.code}"
        if f.run is not None:
            detail_text += f", run {f.run}"
        if f.msg:
            detail_text += f": {f.msg}"
        con.print(f"[bold red]{f.kind}[/]" + safe_markup(detail_text), highlight=False)
    for w in result.warnings:
        con.print("[yellow]warning:[/] " + safe_markup(w), highlight=False)
    if verdict_label is None:
        return
    colour = {"match": "green", "mismatch": "red", "firmware_fault": "red"}.get(str(result.verdict), "yellow")
    code = f" (exit {int(result.exit_code)})" if verdict_label == "verdict" else ""
    con.print(f"[bold {colour}]{escape(verdict_label)}: {result.verdict}[/]{code}")


# ---- JUnit (written by harness.analysis.junit; naming rule there and in docs/ci.md) ---------------


def compare_cases(
    result: CompareResult, where: Sequence[str] = ("compare",), inputs: Sequence[str | Path] = ()
) -> list[junit.Case]:
    """One testcase per compared output tensor, plus one per firmware fault; ``where`` names the run
    (``classname``: the model and board when known), ``inputs`` the files of runs 0, 1, ..."""
    cls = junit.classname(*where)
    logs = {f"{s.label}: {s.path}": s.raw_log for s in result.sources if s.raw_log is not None}
    out = junit.log_text(logs, RAW_LOG_MAX)

    def input_name(run: int) -> str:
        return junit.input_name(run, inputs[run] if 0 <= run < len(inputs) else None)

    cases = []
    for c in result.comparisons:
        name = f"{input_name(c.run)}.{c.a}_vs_{c.b}.output{c.output}" + (f"[{c.name}]" if c.name else "")
        if c.match:
            cases.append(junit.Case(cls, name, out=out))
            continue
        text = "\n".join(str(m) for m in c.first_mismatches)
        outcome, kind = junit.outcome_of(ExitCode.MISMATCH)
        cases.append(junit.Case(cls, name, outcome, type=kind, message=c.mismatch_text(), text=text, out=out))
    for f in result.faults:
        at = f"{input_name(f.run)}." if f.run is not None else ""
        msg = f"{f.kind} at stage {f.stage} (code {f.code}): {f.msg}"
        name = f"{at}{f.source}.fault.{f.stage}"
        outcome, kind = junit.outcome_of(f.exit_code)  # a crash: a failure; a capture fault: an error
        cases.append(junit.Case(cls, name, outcome, type=kind, message=msg, text=msg, out=out))
    return cases


def compare_suite(cases: list[junit.Case], result: CompareResult | None = None) -> junit.Suite:
    """The ``esp-check compare`` suite, with the comparison's properties when there is one."""
    props = {}
    if result is not None:
        props["simulated"] = str(result.simulated).lower()
        if result.reference_backend:
            props["reference_backend"] = result.reference_backend
    return junit.Suite("esp-check compare", cases, props)


def junit_tree(result: CompareResult) -> ET.ElementTree:
    """JUnit XML: one testcase per compared output, plus one per firmware fault."""
    return junit.tree([compare_suite(compare_cases(result), result)])


def error_case(
    message: str,
    code: ExitCode | int,
    raw_logs: dict[str, bytes] | None = None,
    where: Sequence[str] = ("compare",),
    name: str = "compare",
) -> junit.Case:
    """The testcase of a run that has no comparison to show, ending with exit code ``code``: its outcome
    and type by :func:`harness.analysis.junit.outcome_of` (a firmware fault is a ``<failure>``, an
    infrastructure or usage problem an ``<error>``)."""
    outcome, kind = junit.outcome_of(code)
    out = junit.log_text(dict(raw_logs or {}), RAW_LOG_MAX)
    return junit.Case(
        junit.classname(*where), name, outcome, type=kind, message=message or kind, text=message, out=out
    )


def junit_error_tree(
    message: str, code: ExitCode | int, raw_logs: dict[str, bytes] | None = None
) -> ET.ElementTree:
    """JUnit XML for a comparison that could not run (:func:`error_case`)."""
    return junit.tree([compare_suite([error_case(message, code, raw_logs)])])
