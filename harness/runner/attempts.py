"""What an attempt found: the pipeline's result (its judge checked every capture) turned into the
attempt's verdict, reason and testcases. The plan's comparisons pick which of the job's comparisons
decide the task; each input x comparison is a testcase (passed, failure or error, docs/ci.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from harness.errors import ExitCode, combine_exit_codes
from harness.flashfmt.partitions import VARIANTS
from harness.flows.records import StageRecord, section
from harness.runner.results import (
    Attempt,
    AttemptDataset,
    CaseStatus,
    CaseType,
    Task,
    Testcase,
    VariantOutcome,
    case_of,
)

if TYPE_CHECKING:
    from harness.analysis.compare import CompareResult, Fault, TensorComparison
    from harness.flows.records import FlashAndCompareResult, VariantRun


def _variant_outcome(variant: str, run: VariantRun, stages: list[StageRecord]) -> VariantOutcome:
    return VariantOutcome(
        variant=variant,
        exit_code=int(run.exit_code) if run.exit_code is not None else None,
        serial_log=str(run.serial_log) if run.serial_log else None,
        firmware_sha256=run.firmware_sha256,
        build_cache_hit=run.build_cache_hit,
        flash=run.flash,
        nn_mode=run.nn_mode,
        capture_valid=run.capture_valid,
        problems=list(run.problems),
        findings=list(run.findings),
        stages=list(stages),
    )


def judge_inputs(task: Task, attempt: Attempt, result: FlashAndCompareResult) -> None:
    """An attempt with inputs: the pipeline judged each capture; the plan's pairs pick the comparisons
    that decide the task, and each input x pair is a testcase."""
    runs = result.variants
    _attempt_facts(task, attempt, result)
    codes, reasons = _variant_problems(attempt, runs)
    comp = result.comparison
    if comp is None:  # nothing compared (a port gone, incomparable captures): the pipeline's verdict
        codes.append(ExitCode(result.exit_code))
        reasons += result.errors
    attempt.board_fault = bool(codes) and combine_exit_codes(codes) == ExitCode.INFRASTRUCTURE
    missing = [w for w in result.warnings if "host reference unavailable" in w]
    ref_problem = f"host reference: {missing[0]}" if missing else None
    if task.job.needs_reference and ref_problem is not None:
        codes.append(ExitCode.INFRASTRUCTURE)
        reasons.append(ref_problem)
    if result.reference_refused:
        codes.append(ExitCode(result.reference_refused["exit_code"]))
        reasons.append(result.reference_refused["summary"])
    pairs = set(task.job.pairs)
    compared = comp.comparisons if comp is not None else []
    mismatched = [c.mismatch_text() for c in compared if (c.a, c.b) in pairs and not c.match]
    if comp is not None and len(mismatched) == sum(not c.match for c in compared):  # nothing narrowed:
        codes.append(ExitCode(result.exit_code))  # the pipeline's verdict (and its findings) stands
        reasons += result.errors
    for f in comp.faults if comp is not None else []:
        codes.append(f.exit_code)
        if (run := runs.get(f.source)) is None or run.exit_code != f.exit_code:  # else its variant said it
            reasons.append(f"{f.source}: ERROR stage={f.stage} code={f.code} {f.msg}")
    if mismatched:
        codes.append(ExitCode.MISMATCH)
        reasons = mismatched[:3] + reasons
    code = combine_exit_codes(codes or [ExitCode.MATCH])
    attempt.exit_code = int(code)
    attempt.reason = "; ".join(dict.fromkeys(reasons)) or ("all compared outputs match" if code == 0 else "")
    attempt.comparison = comp
    attempt.testcases = _testcases(task, attempt, runs, comp, ref_problem)


def _attempt_facts(task: Task, attempt: Attempt, result: FlashAndCompareResult) -> None:
    """What every attempt records from the pipeline's result: each variant's outcome, the builds."""
    # the stages of both variants' session (port, flash, ...) belong to each: a failed flash explains both
    attempt.variants = {
        v: _variant_outcome(v, r, [s for s in result.stages if s.variant in (v, None)])
        for v, r in result.variants.items()
    }
    task.builds = {
        v: {
            "firmware_sha256": r.firmware_sha256,
            "cache_hit": r.build_cache_hit,
            "project_dir": str(r.project_dir),
        }
        for v, r in result.variants.items()
        if r.firmware_sha256
    }


def judge_dataset(task: Task, attempt: Attempt, result: FlashAndCompareResult) -> None:
    """A dataset attempt's verdict is flash-and-compare's; its figures go into the run summary."""
    code = ExitCode(result.exit_code)
    attempt.exit_code = int(code)
    attempt.board_fault = code == ExitCode.INFRASTRUCTURE
    _attempt_facts(task, attempt, result)
    doc = result.dataset or {}
    an = section(doc.get("analysis"))
    inputs = doc.get("inputs", 0)
    verdict_counts = {k: n for k, n in section(an.get("verdicts")).items() if isinstance(n, int)}
    attempt.dataset = AttemptDataset(
        source=doc.get("source"),
        random_seed=doc.get("random_seed"),
        inputs=inputs if isinstance(inputs, int) else 0,
        verdicts=verdict_counts,
        agreement={k: section(v).get("agreement") for k, v in section(an.get("agreement")).items()},
        report=str(result.report_path),
    )
    counts = ", ".join(f"{k} {n}" for k, n in sorted(verdict_counts.items()))
    what = f"dataset of {attempt.dataset['inputs']} inputs: {counts or 'no verdicts'}"
    attempt.reason = "; ".join([what, *result.errors[:3]])
    attempt.testcases = [Testcase(0, str(doc.get("source")), "dataset", *case_of(code), what)]


def _variant_problems(attempt: Attempt, runs: Mapping[str, VariantRun]) -> tuple[list[ExitCode], list[str]]:
    """Exit codes and reasons of the variants that did not run cleanly (the pipeline's result holds every
    variant, run or not: one that never ran has its stage's exit code)."""
    codes: list[ExitCode] = []
    reasons: list[str] = []
    for v in VARIANTS:
        code = runs[v].exit_code
        if code is not None:
            codes.append(ExitCode(code))
            reasons.append(f"{v}: {attempt.variants[v].failure_detail().splitlines()[0]}")
    return codes, reasons


_Problem = tuple[CaseStatus, CaseType, str]


def _side_problem(
    label: str,
    k: int,
    attempt: Attempt,
    runs: Mapping[str, VariantRun],
    faults: dict[str, list[Fault]],
    ref_problem: str | None,
) -> _Problem | None:
    """Why one side of a comparison (a variant or the host reference) has nothing valid for input k."""
    if label == "reference":
        return (*case_of(ExitCode.INFRASTRUCTURE), ref_problem) if ref_problem else None
    for f in faults.get(label, []):
        if f.run is None or f.run == k:
            msg = f"{label}: ERROR stage={f.stage} code={f.code} {f.msg}"
            return *case_of(f.exit_code), msg  # a crash: a failure; a bad input or capture: an error
    r = runs[label]
    if r.exit_code is not None and r.source is None:
        return *case_of(r.exit_code), f"{label}: {attempt.variants[label].failure_detail()}"
    return None


def _testcases(
    task: Task,
    attempt: Attempt,
    runs: Mapping[str, VariantRun],
    result: CompareResult | None,
    ref_problem: str | None,
) -> list[Testcase]:
    """One entry per input x requested comparison: passed / failure (mismatch, fault) / error."""
    out: list[Testcase] = []
    by: dict[tuple[str, str, int], list[TensorComparison]] = {}
    faults: dict[str, list[Fault]] = {}
    if result is not None:
        for c in result.comparisons:
            by.setdefault((c.a, c.b, c.run), []).append(c)
        for f in result.faults:
            faults.setdefault(f.source, []).append(f)
    for k, path in enumerate(task.case.inputs):
        for pa, pb in task.job.pairs:
            comps = by.get((pa, pb, k), [])
            sides = (_side_problem(x, k, attempt, runs, faults, ref_problem) for x in (pa, pb))
            problems = [p for p in sides if p is not None]
            bad = [c for c in comps if not c.match]
            if bad:
                verdict: _Problem = (*case_of(ExitCode.MISMATCH), bad[0].mismatch_text())
            elif problems:
                verdict = next((p for p in problems if p[0] == CaseStatus.FAILURE), problems[0])
            elif comps:
                within = f"{len(comps)} output(s) within {comps[0].tolerance_lsb:g} LSB"
                verdict = (*case_of(ExitCode.MATCH), within)
            else:
                why = attempt.reason or "nothing was compared"
                verdict = (*case_of(ExitCode.INFRASTRUCTURE), why)
            out.append(Testcase(k, str(path), f"{pa}-vs-{pb}", *verdict))
    return out
