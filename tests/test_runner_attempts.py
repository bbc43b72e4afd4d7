"""The runner's verdict of an attempt is the pipeline's (harness.runner.attempts.judge_inputs): the plan's
comparisons narrow which comparisons decide it (docs/ci.md), nothing else. Nothing is faked but the
pipeline's result, built here as run_job builds it, with a finding the runner does not rebuild itself
(a tap finding) in its exit code and errors; or the board (``sim://`` with a fault injected), with the
pipeline run for real."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from harness.analysis.compare import OutputTensor, Source, compare_sources
from harness.errors import ExitCode
from harness.flashfmt.partitions import VARIANTS
from harness.flows.flash_and_compare import flash_and_compare
from harness.flows.job import JobOptions
from harness.flows.records import FlashAndCompareResult, StageTimeouts, VariantRun
from harness.runner.attempts import judge_inputs
from harness.runner.plan import Job, ModelCase
from harness.runner.results import Attempt, CaseStatus, CaseType, Task


def _source(label: str, values: list[int]) -> Source:
    arr = np.array(values, dtype=np.int8)
    t = OutputTensor(0, arr, raw=True, shape=arr.shape, dtype="int8", scale=0.5, zero_point=0, name="out")
    return Source(label, "protocol", [[t]], nn_mode="optimized" if label == "optimized" else "ansi_c")


def _judged(
    tmp_path: Path, ansi: list[int], exit_code: ExitCode, errors: list[str], comparisons: tuple[str, ...]
) -> Attempt:
    comp = compare_sources(_source("optimized", [1, 2, 3]), _source("ansi", ansi))
    result = FlashAndCompareResult(
        out_dir=tmp_path, board="sim", port="sim://x", simulated=True, stages=[],
        variants={v: VariantRun(v) for v in VARIANTS}, comparison=comp, exit_code=exit_code,
        report_path=tmp_path / "report.json", errors=errors,
    )  # fmt: skip
    job = Job(name="j", cases=(), boards=("sim",), comparisons=comparisons)
    task = Task("t", job, ModelCase(Path("m.tflite"), (Path("a.npy"),)), "sim", None, tmp_path)
    attempt = Attempt(1, "sim")
    judge_inputs(task, attempt, result)
    return attempt


def _judged_on_sim(tmp_path: Path, models_dir: Path, faults: str) -> Attempt:
    """The runner's judgement of flash-and-compare run for real on a ``sim://`` board with ``faults``."""
    model, image = models_dir / "cnn_classifier_11.tflite", models_dir / "inputs" / "cnn_classifier_11.png"
    limits = StageTimeouts(capture_total=30, capture_silence=3)
    port = f"sim://?emitter=c&{faults}"
    options = JobOptions(cache_dir=tmp_path / "cache", timeouts=limits, reference=False)
    result = flash_and_compare(model, [image], port=port, out_dir=tmp_path / "out", options=options)
    job = Job(name="j", cases=(), boards=("sim",), comparisons=("optimized-vs-ansi",))
    task = Task("t", job, ModelCase(model, (image,)), "sim", None, tmp_path)
    attempt = Attempt(1, "sim")
    judge_inputs(task, attempt, result)
    return attempt


def test_a_finding_the_pipeline_adds_is_never_dropped_by_the_runner(tmp_path: Path) -> None:
    """Every comparison matches, but the pipeline's verdict is a mismatch from a finding of its own (a
    tap finding): the runner's attempt keeps it (it rebuilt a match from the comparison before)."""
    finding = "tap: op 3 output differs from the host reference"
    a = _judged(tmp_path, [1, 2, 3], ExitCode.MISMATCH, [finding], ("optimized-vs-ansi",))
    assert a.exit_code == ExitCode.MISMATCH, a.reason
    assert finding in a.reason


def test_the_plans_comparisons_still_narrow_the_verdict(tmp_path: Path) -> None:
    """docs/ci.md: the plan's comparisons pick which comparisons decide the task: an optimized-vs-ANSI C
    mismatch the plan did not ask about leaves the pipeline's exit 1 out of the task's verdict."""
    a = _judged(tmp_path, [1, 2, 9], ExitCode.MISMATCH, [], ("ansi-vs-host",))
    assert a.exit_code == ExitCode.MATCH, a.reason


def test_a_fault_is_stated_once_in_the_attempts_reason(tmp_path: Path, models_dir: Path) -> None:
    """The optimized firmware reports ``ERROR stage=alloc``: the attempt's reason says so once (it said it
    in the variant's words and again as the comparison's fault), with the same verdict, board_fault and
    testcases. Faked: the board (sim://, the fault injected); the pipeline runs for real."""
    attempt = _judged_on_sim(tmp_path, models_dir, "fault=alloc&variant_fault=optimized")
    said = [part for part in attempt.reason.split("; ") if part.startswith("optimized:")]
    assert len(said) == 1 and "AllocateTensors_failed" in said[0], attempt.reason
    assert (attempt.exit_code, attempt.board_fault) == (ExitCode.FIRMWARE_FAULT, False)
    assert [(c.status, c.type) for c in attempt.testcases] == [(CaseStatus.FAILURE, CaseType.FIRMWARE_FAULT)]


def test_an_attempts_reason_says_why_a_damaged_link_failed_it(tmp_path: Path, models_dir: Path) -> None:
    """Every 4th frame the board receives is damaged: both variants' links need repairs, so each is an
    infrastructure failure (exit 3, a board fault) though no stage failed. The reason says so in the
    pipeline's words (the link_repair finding), not just "failed". Faked: the board (sim://, the fault
    injected); the pipeline runs for real."""
    attempt = _judged_on_sim(tmp_path, models_dir, "fault=frame_rx&frame_every=4")
    assert (attempt.exit_code, attempt.board_fault) == (ExitCode.INFRASTRUCTURE, True), attempt.reason
    said = attempt.reason.split("; ")
    for v in VARIANTS:
        assert any(p.startswith(f"{v}: the serial link needed repairs: ") for p in said), attempt.reason


def test_a_variants_failure_is_worded_in_one_place() -> None:
    """VariantOutcome.failure_detail words why a variant did not run cleanly, for the attempt's reason and
    its testcases: its failed stages' details, else its findings (not the warnings) and problems, else
    "did not run cleanly" (was "failed", which said nothing the verdict did not). Nothing is faked: the
    outcomes are built as the runner builds them."""
    from harness.flows.records import StageRecord, StageStatus
    from harness.runner.results import VariantOutcome

    def outcome(stages: list[StageRecord]) -> VariantOutcome:
        findings: list[dict[str, object]] = [
            {"severity": "warning", "message": "task watchdog"},
            {"severity": "error", "message": "the serial link needed repairs: 3 naks"},
        ]
        return VariantOutcome("ansi", 3, None, None, None, None, None, True, ["no END"], findings, stages)

    flash = StageRecord("flash", "ansi", StageStatus.FAILED, 1.0, "port gone\nretry later")
    assert outcome([flash]).failure_detail() == "port gone\nretry later"
    ok = StageRecord("flash", "ansi", StageStatus.OK, 1.0)
    assert outcome([ok]).failure_detail() == "the serial link needed repairs: 3 naks; no END"
    assert (
        dataclasses.replace(outcome([]), findings=[], problems=[]).failure_detail() == "did not run cleanly"
    )


def test_report_records_are_written_as_plain_json() -> None:
    """report.json's stages and summary.json's testcases are ``dataclasses.asdict`` of their records (a
    StrEnum is its value in JSON; the to_dict methods that converted each enum by hand are gone): the text
    is exactly what the writers wrote before. Nothing is faked."""
    from harness.flows.records import StageRecord, StageStatus
    from harness.runner.results import CaseStatus, CaseType, Testcase

    stage = StageRecord("flash", "ansi", StageStatus.FAILED, 1.23456, "port gone", 3)
    assert json.dumps(stage.to_dict()) == (
        '{"stage": "flash", "variant": "ansi", "status": "failed", "seconds": 1.235, "detail": "port gone", '
        '"exit_code": 3}'
    )
    case = Testcase(0, "a.npy", "optimized-vs-ansi", CaseStatus.FAILURE, CaseType.MISMATCH, "1 LSB")
    want = {"input_index": 0, "input": "a.npy", "comparison": "optimized-vs-ansi", "status": "failure"}
    want |= {"type": "mismatch", "message": "1 LSB"}
    assert json.dumps(dataclasses.asdict(case), indent=1, default=str) == json.dumps(want, indent=1)
