"""flash-and-compare when the host reference refuses the model: the variants still decide what is said.

The host reference runs in a child process (harness.model.hostrun), so its abort is a
:class:`~harness.errors.ReferenceRefusedError`, not a crash of esp-check; this module turns the
variants' runs into report.json's ``reference_refused`` finding, exit 1 (docs/sweep.md: when, and why 1).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from harness.analysis.compare import CompareResult
from harness.errors import ExitCode, ReferenceRefusedError
from harness.flashfmt.partitions import VARIANTS
from harness.flows.records import OutputValues, RefusalFinding, VariantRun

EXIT_CODE = ExitCode.MISMATCH
_SHOWN = 8  # distinct values listed per output


def _values(variant_run: VariantRun) -> list[OutputValues]:
    """Per run and output of one variant: element count and its distinct values (the first few)."""
    out: list[OutputValues] = []
    if variant_run.source is None:
        return out
    for k, run in enumerate(variant_run.source.runs):
        for t in run:
            flat = np.asarray(t.values).reshape(-1)
            distinct = np.unique(flat)
            shown = [v.item() for v in distinct[:_SHOWN]]
            row = OutputValues(
                run=k, output=t.index, count=int(flat.size), distinct=int(distinct.size), values=shown
            )
            out.append(row)
    return out


def _describe(values: list[OutputValues]) -> str:
    parts = []
    for v in values:
        if v["distinct"] == 1:
            what = f"every one {v['values'][0]}"
        else:
            more = ", ..." if v["distinct"] > len(v["values"]) else ""
            what = f"{v['distinct']} distinct: {', '.join(str(x) for x in v['values'])}{more}"
        parts.append(f"run {v['run']} output {v['output']}: {v['count']} values, {what}")
    return "; ".join(parts)


def refusal_finding(
    refused: ReferenceRefusedError, variants: Mapping[str, VariantRun], comparison: CompareResult | None
) -> RefusalFinding:
    """The ``reference_refused`` finding: what the reference said, and whether the variants agree.

    ``comparison`` is optimized vs ANSI C (there is no reference leg); None when a variant gave no
    valid capture, in which case ``variants_agree`` is None and the variants' own findings stand.
    """
    ran = [v for v in VARIANTS if variants[v].source is not None]
    agree: bool | None = None
    mismatched = 0
    if comparison is not None and len(ran) == len(VARIANTS):
        mismatched = sum(c.mismatched for c in comparison.comparisons)
        agree = not comparison.faults and all(c.match for c in comparison.comparisons)
    head = "host reference refused: TFLM's reference aborts on this model (SIGABRT in Invoke"
    head += f" on input run {refused.run})" if refused.run is not None else ")"
    values = {v: _values(variants[v]) for v in ran}
    if agree is True:
        tail = f"optimized and ANSI C agree: {_describe(values['optimized'])}"
    elif agree is False:
        tail = (
            f"optimized and ANSI C DISAGREE ({mismatched} element(s) differ); optimized: "
            f"{_describe(values['optimized'])}; ANSI C: {_describe(values['ansi'])}"
        )
    elif ran:
        tail = f"only {ran[0]} gave outputs: {_describe(values[ran[0]])}"
    else:
        tail = "neither variant gave outputs"
    return {
        "kind": "reference_refused",
        "summary": f"{head}; {tail}. Nothing verifies these outputs: no match is claimed",
        "reference": refused.message,
        "reference_run": refused.run,
        "variants_agree": agree,
        "mismatched": mismatched,
        "values": values,
        "exit_code": int(EXIT_CODE),
    }
