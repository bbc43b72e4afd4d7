"""JUnit XML: one writer (harness.analysis.junit) for compare, flash-and-compare and run, in the shape CI
systems read (tests/junit_shape.py), with one naming rule (docs/ci.md). Nothing is faked: the reports
are built from comparison results and flash-and-compare records made here, as the commands make them."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from harness.analysis import junit
from harness.analysis.compare import Fault, OutputTensor, Source, compare_sources
from harness.analysis.report import junit_error_tree, junit_tree
from harness.errors import ExitCode, Verdict
from harness.flashfmt.partitions import VARIANTS
from harness.flows.records import FlashAndCompareResult, StageRecord, StageStatus, VariantRun
from harness.flows.report import write_junit
from harness.runner import reports
from harness.runner.attempts import judge_dataset, judge_inputs
from harness.runner.plan import Job, ModelCase
from harness.runner.results import Attempt, CaseStatus, CaseType, Task, TaskState, case_of
from tests.junit_shape import assert_junit_shape


def _source(label: str, values: list[int], faults: list[Fault] | None = None) -> Source:
    arr = np.array(values, dtype=np.int8)
    t = OutputTensor(0, arr, raw=True, shape=arr.shape, dtype="int8", scale=0.5, zero_point=0, name="out")
    return Source(
        label,
        "protocol",
        [[t]],
        nn_mode="optimized" if label == "optimized" else "ansi_c",
        faults=faults or [],
        raw_log=b"log \x1b[0m",
    )


def _result(
    tmp_path: Path, comparison: object, crashed: str | None, detail: str = ""
) -> FlashAndCompareResult:
    variants = {v: VariantRun(v) for v in VARIANTS}
    stages = []
    if crashed is not None:
        log = tmp_path / f"{crashed}.log"
        log.write_bytes(b"Guru Meditation Error \x00\x07 core 0 panic'ed\n")
        variants[crashed] = VariantRun(crashed, serial_log=log, exit_code=ExitCode.FIRMWARE_FAULT)
        stages.append(StageRecord("capture", crashed, StageStatus.FAILED, 1.0, detail))
    return FlashAndCompareResult(
        out_dir=tmp_path, board="esp32s3-devkitc-1", port="sim://x", simulated=True, stages=stages,
        variants=variants, comparison=comparison,  # type: ignore[arg-type]
        exit_code=ExitCode.FIRMWARE_FAULT if crashed else ExitCode.MISMATCH,
        report_path=tmp_path / "report.json", errors=["optimized: the firmware crashed"] if crashed else [],
    )  # fmt: skip


def test_every_writer_gives_the_shape_ci_reads(tmp_path: Path) -> None:
    """compare (mismatch + fault), compare that could not run, flash-and-compare with a crashed variant:
    each document has the counts and times CI systems read, on the root too (the old compare writer
    left the root without ``time``)."""
    fault = Fault("ansi", "invoke", 3, 0, "Invoke failed")
    result = compare_sources(_source("optimized", [1, 2, 3]), _source("ansi", [1, 2, 9], [fault]))
    assert_junit_shape(junit_tree(result).getroot())
    assert_junit_shape(
        junit_error_tree("no capture\nport vanished", ExitCode.INFRASTRUCTURE, {"a": b"x"}).getroot()
    )
    path = tmp_path / "fc.xml"
    write_junit(_result(tmp_path, None, "optimized", "panic"), path, model=Path("kws.tflite"))
    assert_junit_shape(ET.parse(path).getroot())


def test_flash_and_compare_junit_survives_control_characters_from_the_device(tmp_path: Path) -> None:
    """A failed stage's detail quotes the device (ANSI colours, a NUL): the JUnit file stays well-formed
    XML (the old flash-and-compare writer put the detail raw into the ``message`` attribute)."""
    path = tmp_path / "fc.xml"
    detail = "optimized: \x1b[0;31mGuru Meditation Error\x00 core 0\x1b[0m"
    write_junit(_result(tmp_path, None, "optimized", detail), path)
    root = ET.parse(path).getroot()
    (failure,) = [c.find("failure") for c in root.iter("testcase") if c.get("name") == "optimized.run"]
    assert failure is not None and "Guru Meditation Error" in (failure.get("message") or "")
    assert "\x00" not in (failure.get("message") or "") and "\x1b" not in (failure.text or "")
    assert_junit_shape(root)


def test_one_naming_rule_for_compare_and_flash_and_compare(tmp_path: Path) -> None:
    """classname says where (esp-check + model + board, or ``compare``), name says what: input, pair,
    output tensor; faults and crashed variants are named by their variant."""
    fault = Fault("ansi", "alloc", 7, None, "AllocateTensors failed")
    result = compare_sources(_source("optimized", [1, 2, 3]), _source("ansi", [1, 2, 9], [fault]))
    names = [(c.get("classname"), c.get("name")) for c in junit_tree(result).getroot().iter("testcase")]
    assert names == [
        ("esp-check.compare", "input0.optimized_vs_ansi.output0[out]"),
        ("esp-check.compare", "ansi.fault.alloc"),
    ]
    path = tmp_path / "fc.xml"
    fc = _result(tmp_path, result, "ansi")
    write_junit(fc, path, model=Path("models/kws.tflite"), inputs=[Path("in/yes.npy")])
    names = [(c.get("classname"), c.get("name")) for c in ET.parse(path).getroot().iter("testcase")]
    assert names == [
        ("esp-check.kws.esp32s3-devkitc-1", "input0[yes.npy].optimized_vs_ansi.output0[out]"),
        ("esp-check.kws.esp32s3-devkitc-1", "ansi.fault.alloc"),
        ("esp-check.kws.esp32s3-devkitc-1", "ansi.run"),
    ]
    # the run command's parts of the same rule
    assert junit.classname("job", "kws", "b1") == "esp-check.job.kws.b1"
    assert junit.input_name(2, "in/no.png") + "." + junit.check_name("ansi-vs-reference") == (
        "input2[no.png].ansi_vs_reference"
    )
    assert junit.check_name("dataset") == "dataset"  # a dataset job's one case (was "dataset_vs_")


def test_long_logs_keep_head_and_tail() -> None:
    text = junit.log_text({"optimized": b"H" * 100 + b"M" * 1000 + b"T" * 100, "ansi": None}, 200)
    assert text.startswith("===== optimized =====\n" + "H" * 100)
    assert "[... 1000 bytes omitted ...]" in text and text.count("T") == 100 and "M" not in text
    assert text.endswith("===== ansi (missing) =====")


def test_the_junit_writer_compiles_its_xml_pattern_only_when_it_writes() -> None:
    """Its pattern (every character XML 1.0 cannot carry) costs ~3 ms to compile: a run without --junit
    loads the module (the report module uses it) and must not pay for it. Real: a fresh interpreter,
    ``re``; the import is watched by wrapping ``re.compile``."""
    import subprocess
    import sys

    code = (
        "import re\n"
        "import harness, harness.errors\n"
        "seen = []\n"
        "real = re.compile\n"
        "re.compile = lambda p, *a, **k: (seen.append(p), real(p, *a, **k))[1]\n"
        "from harness.analysis import junit\n"
        "assert not [p for p in seen if '\\ud7ff' in str(p)], seen\n"
        "assert junit.xml_text('a\\x00b\\x1b') == 'a\\ufffdb\\ufffd'\n"
    )
    root = str(Path(__file__).resolve().parents[1])
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert got.returncode == 0, got.stderr[-2000:]


def test_junit_files_are_written_by_junit_write_with_no_forwarder() -> None:
    """Callers write JUnit through harness.analysis.junit.write itself: no function in harness/ only
    forwards to it (read with ast; nothing runs)."""
    import ast

    root = Path(__file__).resolve().parent.parent / "harness"
    forwarders = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef):
                continue
            body = [
                s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
            ]
            only = body[0] if len(body) == 1 else None
            call = only.value if isinstance(only, (ast.Expr, ast.Return)) else None
            if isinstance(call, ast.Call) and ast.unparse(call.func).endswith("junit.write"):
                forwarders.append(f"{path.relative_to(root.parent)}: {node.name}")
    assert forwarders == []


def _documented_rule() -> dict[int, tuple[str, str]]:
    """docs/ci.md's table (section "JUnit XML"): exit code -> a testcase's outcome and type."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "ci.md").read_text(encoding="utf-8")
    codes_row = next(ln for ln in text.splitlines() if ln.startswith("| exit code |"))
    outcome_row = text.splitlines()[text.splitlines().index(codes_row) + 2]
    rule = {}
    for codes, cell in zip(codes_row.split("|")[2:-1], outcome_row.split("|")[2:-1], strict=True):
        outcome, kind = (part.strip(" `") for part in cell.split("/"))
        rule.update({int(c): (outcome, kind) for c in codes.split(",")})
    return rule


RULE = _documented_rule()


def _outcome(case: ET.Element) -> tuple[str, str]:
    for outcome in ("failure", "error", "skipped"):
        if (el := case.find(outcome)) is not None:
            return outcome, el.get("type") or ""
    return "passed", "match"


@pytest.mark.parametrize("code", list(ExitCode), ids=lambda c: c.name)
def test_every_writer_maps_every_exit_code_by_the_one_rule(tmp_path: Path, code: ExitCode) -> None:
    """compare that could not run, flash-and-compare with no comparison (a dataset run, a stopped run)
    and with a variant that did not run cleanly, and a run task with no testcase of its attempt: each
    testcase's outcome and type is ``junit.outcome_of`` of its exit code (the old writers mapped each
    on their own: a dataset mismatch was an ``<error type="error">``)."""
    assert set(RULE) == set(ExitCode)
    assert junit.outcome_of(code) == junit.outcome_of(int(code)) == RULE[code]
    assert junit.outcome_of(99) == ("error", "internal")  # no ExitCode: esp-check's own fault, never a pass
    (compare_case,) = junit_error_tree("why", code).getroot().iter("testcase")
    assert _outcome(compare_case) == RULE[code]
    fc = _result(tmp_path, None, None)
    fc.exit_code = code
    if code != ExitCode.MATCH:  # a variant that ran cleanly has no exit code
        fc.variants["ansi"].exit_code = code
    write_junit(fc, tmp_path / "fc.xml")
    cases = {c.get("name"): c for c in ET.parse(tmp_path / "fc.xml").getroot().iter("testcase")}
    assert _outcome(cases["compare"]) == RULE[code]
    assert code == ExitCode.MATCH or _outcome(cases["ansi.run"]) == RULE[code]
    status, kind = RULE[code]
    assert case_of(code) == (CaseStatus(status), CaseType(kind))
    job = Job(name="j", cases=(), boards=("sim",))
    task = Task("t", job, ModelCase(Path("m.tflite"), (Path("a.npy"),)), "sim", None, tmp_path)
    task.state, task.verdict, task.exit_code = TaskState.DONE, Verdict.from_exit_code(code), int(code)
    got = {(c.status, c.type) for c in reports.testcases_of(task)}
    # a match no testcase shows is never passed: nothing was compared here
    assert got == ({(CaseStatus.ERROR, CaseType.INFRASTRUCTURE)} if code == 0 else {case_of(code)})


def test_a_dataset_case_has_one_name_in_run_and_flash_and_compare(tmp_path: Path) -> None:
    """docs/ci.md "JUnit naming": a dataset's one case is ``input0[<dataset>].dataset`` whichever command
    wrote it (flash-and-compare named it ``compare``)."""
    for source in ("digits", "random"):
        fc = _result(tmp_path, None, None)
        fc.dataset = {"source": source, "inputs": 3}
        write_junit(fc, tmp_path / "fc.xml")
        names = [c.get("name") for c in ET.parse(tmp_path / "fc.xml").getroot().iter("testcase")]
        job = Job(name="j", cases=(), boards=("sim",))
        task = Task("t", job, ModelCase(Path("m.tflite"), (Path("a.npy"),)), "sim", None, tmp_path)
        attempt = Attempt(1, "sim")
        judge_dataset(task, attempt, fc)
        task.attempts.append(attempt)
        task.decisive = attempt
        task.state, task.exit_code = TaskState.DONE, int(fc.exit_code)
        run_names = [c.name for c in reports._task_cases(task)]
        assert names == run_names == [f"input0[{source}].dataset"], (names, run_names)


def _not_passed(root: ET.Element) -> list[tuple[str | None, tuple[str, str]]]:
    return [(c.get("name"), _outcome(c)) for c in root.iter("testcase") if _outcome(c)[0] != "passed"]


def test_a_flash_and_compare_that_is_no_match_never_shows_only_passed_cases(tmp_path: Path) -> None:
    """Every comparison matches and every variant ran cleanly, but the run's exit code is a mismatch (a tap
    finding): the JUnit still has a case that fails with that exit code (docs/ci.md, "JUnit XML")."""
    result = compare_sources(_source("optimized", [1, 2, 3]), _source("ansi", [1, 2, 3]))
    fc = _result(tmp_path, result, None)
    fc.errors = ["tap: op 3 output changed after its op ran"]
    write_junit(fc, tmp_path / "fc.xml")
    assert _not_passed(ET.parse(tmp_path / "fc.xml").getroot()) == [("run", RULE[ExitCode.MISMATCH])]


def test_a_run_task_that_is_no_match_never_shows_only_passed_cases(tmp_path: Path) -> None:
    """A run task whose decisive attempt compared everything within tolerance but ended exit 3 (the
    optimized capture validated beside an infrastructure finding, a brownout: kept as evidence, never a
    clean match): its JUnit has a case that says the exit code, as flash-and-compare's does. Faked: the
    pipeline's result, built as run_job builds it."""
    comp = compare_sources(_source("optimized", [1, 2, 3]), _source("ansi", [1, 2, 3]))
    fc = _result(tmp_path, comp, None)
    fc.exit_code = ExitCode.INFRASTRUCTURE
    fc.variants["optimized"] = VariantRun("optimized", source=comp.sources[0], exit_code=fc.exit_code)
    fc.errors = ["optimized: brownout detector was triggered after the END record"]
    job = Job(name="j", cases=(), boards=("sim",), comparisons=("optimized-vs-ansi",))
    task = Task("t", job, ModelCase(Path("m.tflite"), (Path("a.npy"),)), "sim", None, tmp_path)
    attempt = Attempt(1, "sim")
    judge_inputs(task, attempt, fc)
    task.attempts.append(attempt)
    task.decisive, task.state, task.exit_code = attempt, TaskState.DONE, attempt.exit_code
    assert attempt.exit_code == ExitCode.INFRASTRUCTURE, attempt.reason
    assert {c.status for c in attempt.testcases} == {CaseStatus.PASSED}  # what the attempt compared
    shown = [(c.name, (c.outcome, c.type)) for c in reports._task_cases(task) if c.outcome != "passed"]
    assert shown == [("run", RULE[ExitCode.INFRASTRUCTURE])]
    # summary.json's testcases[] (and its counts) say the same as junit.xml: not 0 failures and 0 errors
    listed = [(c.comparison, (c.status.value, c.type.value)) for c in reports.testcases_of(task)]
    assert [x for x in listed if x[1][0] != "passed"] == [("run", RULE[ExitCode.INFRASTRUCTURE])]


@pytest.mark.parametrize("failed", [0, 1, 2], ids=["findings-only", "one-stage", "two-stages"])
def test_a_variants_failure_has_one_wording_in_junit_and_the_run(tmp_path: Path, failed: int) -> None:
    """A variant that did not run cleanly is worded by ``records.variant_failure`` for both the JUnit
    ``<variant>.run`` case and the run's attempt reason (the JUnit writer used to say "ansi did not run
    cleanly" where the run quoted the variant's findings, and the run kept only the last failed stage)."""
    fc = _result(tmp_path, None, None)
    run = fc.variants["ansi"]
    run.exit_code = ExitCode.INFRASTRUCTURE
    run.findings = [
        {"severity": "warning", "message": "task watchdog"},
        {"severity": "infrastructure", "message": "the serial link needed repairs: 3 naks"},
    ]
    run.problems = ["no END"]
    details = ["dataset: input 2 lost", "dataset-retry: input 2 lost again"][:failed]
    fc.stages = [StageRecord("dataset", "ansi", StageStatus.FAILED, 1.0, d) for d in details]
    fc.exit_code = ExitCode.INFRASTRUCTURE
    write_junit(fc, tmp_path / "fc.xml")
    cases = {c.get("name"): c for c in ET.parse(tmp_path / "fc.xml").getroot().iter("testcase")}
    error = cases["ansi.run"].find("error")
    assert error is not None
    want = "; ".join(details) or "the serial link needed repairs: 3 naks; no END"
    assert error.text == want
    job = Job(name="j", cases=(), boards=("sim",), comparisons=("optimized-vs-ansi",))
    task = Task("t", job, ModelCase(Path("m.tflite"), (Path("a.npy"),)), "sim", None, tmp_path)
    attempt = Attempt(1, "sim")
    judge_inputs(task, attempt, fc)
    assert attempt.variants["ansi"].failure_detail() == want
    assert f"ansi: {want}" in attempt.reason, attempt.reason


@pytest.mark.parametrize("stage", ["invoke", "input", "capture"])
def test_a_device_fault_has_one_outcome_in_compare_and_run(tmp_path: Path, stage: str) -> None:
    """A fault a variant reported is a testcase by ``junit.outcome_of`` of its exit code in both the
    compare JUnit and the run's testcases (the run called every fault a firmware_fault failure, where
    compare called a bad input a usage error and an unusable capture an infrastructure error)."""
    fault = Fault("ansi", stage, 3, 0, "it failed")
    comparison = compare_sources(_source("optimized", [1, 2, 3]), _source("ansi", [1, 2, 3], [fault]))
    (compare_case,) = [
        c for c in junit_tree(comparison).getroot().iter("testcase") if ".fault." in (c.get("name") or "")
    ]
    fc = _result(tmp_path, comparison, None)
    fc.exit_code = fault.exit_code
    job = Job(name="j", cases=(), boards=("sim",), comparisons=("optimized-vs-ansi",))
    task = Task("t", job, ModelCase(Path("m.tflite"), (Path("a.npy"),)), "sim", None, tmp_path)
    attempt = Attempt(1, "sim")
    judge_inputs(task, attempt, fc)
    (case,) = attempt.testcases
    assert (case.status.value, case.type.value) == _outcome(compare_case) == junit.outcome_of(fault.exit_code)
