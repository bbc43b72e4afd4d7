"""Reports: JSON validated against docs/report-schema.json, JUnit XML structure, terminal table."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from rich.console import Console

from harness.analysis import junit
from harness.analysis.compare import (
    CompareResult,
    Fault,
    OutputTensor,
    Source,
    compare_files,
    compare_sources,
)
from harness.analysis.report import (
    SCHEMA_VERSION,
    junit_error_tree,
    junit_tree,
    print_report,
    report_dict,
)
from harness.errors import ExitCode

ROOT = Path(__file__).parent.parent
LOGS = Path(__file__).parent / "data" / "logs"
SCHEMA = json.loads((ROOT / "docs" / "report-schema.json").read_text())


def acceptance() -> CompareResult:
    return compare_files(
        LOGS / "report_ansi_c.log", LOGS / "report_optimized.log", scale=0.00390625, zero_point=-128
    )


def src(label: str, values: np.ndarray, nn: str, faults: list[Fault] | None = None) -> Source:
    t = OutputTensor(
        0, values, raw=True, shape=values.shape, dtype="int8", scale=0.5, zero_point=0, name="out"
    )
    return Source(
        label,
        "protocol",
        [[t]],
        nn_mode=nn,
        faults=faults or [],
        raw_log=b"log \x00\x1b[0m " + label.encode(),
    )


def test_schema_is_valid_and_versioned() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["properties"]["schema_version"]["const"] == SCHEMA_VERSION


def test_json_report_validates_against_schema() -> None:
    rep = report_dict(acceptance())
    jsonschema.validate(rep, SCHEMA)
    assert rep["schema_version"] == 2 and rep["tool"]["name"] == "esp-check" and rep["simulated"] is False
    assert rep["reference_backend"] is None and rep["exit_code"] == 1
    json.dumps(rep, allow_nan=False)  # strict JSON: no NaN/Infinity literals


def test_json_non_finite_values_are_strings() -> None:
    a = Source("A", "npy", [[OutputTensor(0, np.array([np.nan, 1.0, np.inf]), raw=False)]])
    b = Source("B", "npy", [[OutputTensor(0, np.array([0.0, 1.0, np.inf]), raw=False)]])
    rep = report_dict(compare_sources(a, b))
    jsonschema.validate(rep, SCHEMA)
    assert rep["comparisons"][0]["values_a"][0] == "nan" and rep["comparisons"][0]["values_b"][2] == "inf"
    json.dumps(rep, allow_nan=False)


def _model_cases() -> list[CompareResult]:
    """Reports of each kind: quantized with mismatches and a fault, real values with NaN and +-inf (no
    scale: no LSB), a large tensor (no per-element values), a match."""
    rng = np.random.default_rng(7)
    big = rng.integers(-128, 127, 3000).astype(np.int8)
    shifted = big.copy()
    shifted[::7] = np.clip(shifted[::7].astype(np.int16) + 3, -128, 127).astype(np.int8)
    fault = Fault("B", "alloc", 7, None, "AllocateTensors_failed")
    real = (np.array([np.nan, np.inf, -np.inf, 2.0]), np.array([0.5, np.inf, 1.0, 2.0]))
    return [
        acceptance(),
        compare_sources(
            src("A", np.array([1, 2], np.int8), "optimized"),
            src("B", np.array([1, 3], np.int8), "ansi_c", [fault]),
        ),
        compare_sources(
            Source("A", "npy", [[OutputTensor(0, real[0], raw=False)]]),
            Source("B", "npy", [[OutputTensor(0, real[1], raw=False)]]),
        ),
        compare_sources(src("A", big, "optimized"), src("B", shifted, "ansi_c")),
        compare_sources(src("A", big, "optimized"), src("B", big, "ansi_c")),
    ]


def test_the_hand_built_report_is_what_its_model_validates_and_dumps() -> None:
    """report_dict builds report.json's comparison without pydantic (a CLI run does not build the
    models); the model (harness.analysis.report_model, docs/report-schema.json's source) must validate
    each document and dump it back to the same JSON text, key order included. Plain JSON: no numpy
    scalar may reach the document (json.dumps without a default)."""
    from harness.analysis.report_model import CompareReport

    for result in _model_cases():
        doc = report_dict(result)
        text = json.dumps(doc, allow_nan=False)
        again = CompareReport.model_validate(doc).model_dump(by_alias=True)
        assert json.dumps(again, allow_nan=False) == text
        jsonschema.validate(doc, SCHEMA)


def test_schema_rejects_a_broken_report() -> None:
    rep = report_dict(acceptance())
    del rep["comparisons"][0]["mismatched"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(rep, SCHEMA)


def test_junit_one_testcase_per_output_and_faults(tmp_path: Path) -> None:
    good = np.array([1, 2, 3], dtype=np.int8)
    bad = np.array([1, 2, 9], dtype=np.int8)
    fault = Fault("B", "alloc", 7, None, "AllocateTensors_failed")
    result = compare_sources(src("A", good, "optimized"), src("B", bad, "ansi_c", [fault]))
    path = tmp_path / "junit.xml"
    junit.write(junit_tree(result), path)
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    suite = root.find("testsuite")
    assert (
        suite is not None
        and suite.get("tests") == "2"
        and suite.get("failures") == "2"
        and suite.get("errors") == "0"
    )
    cases = suite.findall("testcase")
    assert (
        cases[0].get("classname") == "esp-check.compare"
        and cases[0].get("name") == "input0.A_vs_B.output0[out]"
    )
    fail = cases[0].find("failure")
    assert (
        fail is not None
        and fail.get("type") == "mismatch"
        and "1 of 3 elements differ" in (fail.get("message") or "")
    )
    assert cases[1].find("failure").get("type") == "firmware_fault"  # type: ignore[union-attr]
    out = cases[0].find("system-out")
    assert out is not None and "log" in (out.text or "") and "\x00" not in (out.text or "")
    assert result.exit_code == 4  # firmware fault outranks the mismatch


def test_junit_match_has_no_failure(tmp_path: Path) -> None:
    v = np.array([1, 2, 3], dtype=np.int8)
    tree = junit_tree(compare_sources(src("A", v, "optimized"), src("B", v.copy(), "ansi_c")))
    root = tree.getroot()
    assert root.get("tests") == "1" and root.get("failures") == "0"
    assert root.find("./testsuite/testcase/failure") is None


def test_junit_error_tree() -> None:
    tree = junit_error_tree(
        "A: capture is corrupted\nmore", ExitCode.INFRASTRUCTURE, {"a.log": b"\xff\x01raw"}
    )
    root = tree.getroot()
    err = root.find("./testsuite/testcase/error")
    assert err is not None and err.get("message") == "A: capture is corrupted" and root.get("errors") == "1"
    text = root.find("./testsuite/testcase/system-out").text or ""  # type: ignore[union-attr]
    assert "a.log" in text and "\x01" not in text
    ET.fromstring(ET.tostring(root))  # well-formed


def test_terminal_table_highlights_mismatch() -> None:
    con = Console(record=True, width=100, color_system="truecolor", force_terminal=True)
    print_report(acceptance(), con)
    text = con.export_text(clear=False)
    assert "MISMATCH" in text and "5 vs 10" in text and "verdict: mismatch" in text
    styled = con.export_text(styles=True)
    assert "\x1b[1;31m" in styled and "\x1b[31m" in styled  # mismatch cells in red


def test_device_text_is_not_rich_markup() -> None:
    v = np.array([1, 2, 3], dtype=np.int8)
    fault = Fault("B", "invoke", 1, 0, "[link=http://x]click[/link][bold]boom")
    b = src("B", v.copy(), "ansi_c", [fault])
    a = src("A", v, "optimized")
    a.runs[0][0].name = "[red]seg"
    result = compare_sources(a, b)
    con = Console(record=True, width=120)
    print_report(result, con)
    text = con.export_text()
    assert "[link=http://x]click[/link][bold]boom" in text and "([red]seg)" in text


def test_junit_error_tree_firmware_fault_is_a_failure() -> None:
    root = junit_error_tree("optimized: Guru Meditation Error", ExitCode.FIRMWARE_FAULT).getroot()
    assert root.get("failures") == "1" and root.get("errors") == "0"
    assert root.find("./testsuite/testcase/failure") is not None


def test_a_mismatch_is_worded_once_in_every_report(tmp_path: Path) -> None:
    """TensorComparison.mismatch_text is the wording of the JUnit failure and of flash-and-compare's
    one-line summary (and of a run's reasons and testcases): where, how many, the tolerance, the worst
    difference and argmax. Without a scale there are no LSB to count: it says so (the old summary said
    "by more than 0 LSB")."""
    from harness.flashfmt.partitions import VARIANTS
    from harness.flows.records import FlashAndCompareResult, VariantRun

    result = compare_sources(
        src("A", np.array([1, 2, 3], np.int8), "optimized"), src("B", np.array([1, 2, 9], np.int8), "ansi_c")
    )
    (c,) = result.comparisons
    said = (
        "A vs B, input 0 output 0 [out]: 1 of 3 elements differ by more than 0 LSB (max 6 LSB, argmax 2 vs 2)"
    )
    assert c.mismatch_text() == said
    (case,) = junit_tree(result).getroot().iter("testcase")
    assert case.find("failure").get("message") == said  # type: ignore[union-attr]
    fc = FlashAndCompareResult(
        out_dir=tmp_path, board="sim", port="sim://x", simulated=True, stages=[],
        variants={v: VariantRun(v) for v in VARIANTS}, comparison=result, exit_code=result.exit_code,
        report_path=tmp_path / "report.json",
    )  # fmt: skip
    assert fc.summary == f"mismatch (exit 1) on sim [SIMULATED]: {said}"
    a = Source("A", "npy", [[OutputTensor(0, np.array([1.0, 2.5]), raw=False)]])
    b = Source("B", "npy", [[OutputTensor(0, np.array([1.0, 2.0]), raw=False)]])
    (real,) = compare_sources(a, b).comparisons
    assert real.mismatch_text() == (
        "A vs B, input 0 output 0: 1 of 2 elements differ "
        "(real values, no scale: compared exactly, max |diff| 0.5, argmax 1 vs 1)"
    )


def test_the_headline_words_a_failed_variant_as_every_report_does(tmp_path: Path) -> None:
    """flash-and-compare's one-line summary says a variant's failure in ``records.variant_failure``'s words
    (its JUnit case and the run's reason say the same), never a warning that came first in its findings
    (the old headline quoted the first finding, whatever its severity). Nothing is faked."""
    from harness.flashfmt.partitions import VARIANTS
    from harness.flows.records import FlashAndCompareResult, StageRecord, StageStatus, VariantRun

    crash = "firmware fault: Guru Meditation Error: Core 0 panic'ed"
    runs = {v: VariantRun(v) for v in VARIANTS}
    runs["optimized"].exit_code = ExitCode.FIRMWARE_FAULT
    runs["optimized"].findings = [
        {"severity": "warning", "message": "task watchdog got triggered"},
        {"severity": "firmware_fault", "message": "Guru Meditation Error: Core 0 panic'ed"},
    ]
    stage = StageRecord("verify", "optimized", StageStatus.FAILED, 0.1, f"{crash}\nsee the serial log")
    fc = FlashAndCompareResult(
        out_dir=tmp_path,
        board="sim",
        port="sim://x",
        simulated=True,
        stages=[stage],
        variants=runs,
        comparison=None,
        exit_code=ExitCode.FIRMWARE_FAULT,
        report_path=tmp_path / "report.json",
    )
    assert fc.summary == f"firmware_fault (exit 4) on sim [SIMULATED]: optimized: {crash}"
