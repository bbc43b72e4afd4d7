"""Report schema versions: the current vocabulary, and the deprecated previous version for one release."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from harness.analysis.compare import OutputTensor, Source, compare_sources
from harness.analysis.report import report_dict
from harness.cli import main
from harness.errors import ExitCode, UsageError, Verdict

ROOT = Path(__file__).parent.parent
LOGS = Path(__file__).parent / "data" / "logs"
SCHEMA = json.loads((ROOT / "docs" / "report-schema.json").read_text())


def _src(label: str, values: list[int], nn: str) -> Source:
    arr = np.array(values, dtype=np.int8)
    t = OutputTensor(0, arr, raw=True, shape=arr.shape, dtype="int8", scale=0.5, zero_point=0, name="o")
    return Source(label, "protocol", [[t]], nn_mode=nn)


@pytest.mark.parametrize(
    ("code", "verdict"),
    [
        (ExitCode.MATCH, "match"),
        (ExitCode.MISMATCH, "mismatch"),
        (ExitCode.USAGE, "usage_error"),
        (ExitCode.INFRASTRUCTURE, "infrastructure_error"),
        (ExitCode.FIRMWARE_FAULT, "firmware_fault"),
        (ExitCode.INTERNAL, "internal_error"),
        (99, "internal_error"),
    ],
)
def test_one_verdict_vocabulary(code: int, verdict: str) -> None:
    assert str(Verdict.from_exit_code(code)) == verdict


@pytest.mark.parametrize(
    ("verdict", "code"),
    [
        ("match", ExitCode.MATCH),
        ("mismatch", ExitCode.MISMATCH),
        ("nondeterministic", ExitCode.MISMATCH),
        ("device_error", ExitCode.FIRMWARE_FAULT),
        ("incomplete", ExitCode.INFRASTRUCTURE),
        ("firmware_fault", ExitCode.FIRMWARE_FAULT),
        ("internal_error", ExitCode.INTERNAL),
    ],
)
def test_dataset_verdicts_are_in_the_one_vocabulary(verdict: str, code: ExitCode) -> None:
    """A dataset input's verdict is a Verdict like a run's, and each says which exit code it stands for
    (the dataset analysis kept a table of its own beside errors.Verdict)."""
    assert Verdict(verdict).exit_code == code
    assert Verdict.from_exit_code(Verdict(verdict).exit_code).exit_code == code


def test_compare_report_v2_uses_the_shared_vocabulary_and_v1_the_old_one() -> None:
    result = compare_sources(_src("A", [1, 2], "optimized"), _src("B", [1, 3], "ansi_c"))
    v2 = report_dict(result)
    jsonschema.validate(v2, SCHEMA)
    assert v2["schema_version"] == 2 and v2["verdict"] == "mismatch"
    with pytest.warns(DeprecationWarning, match="schema_version 1 is deprecated"):
        v1 = report_dict(result, schema_version=1)
    assert v1["schema_version"] == 1 and v1["verdict"] == "mismatch"
    with pytest.raises(UsageError, match="not available"):
        report_dict(result, schema_version=7)


def test_v1_renames_usage_error_to_input_error() -> None:
    from harness.analysis.schemas import compare_v1

    assert compare_v1({"verdict": "usage_error"})["verdict"] == "input_error"
    assert compare_v1({"verdict": "infrastructure_error"})["verdict"] == "error"
    assert compare_v1({"verdict": "match"})["verdict"] == "match"


def test_cli_schema_version_1_warns_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["compare", str(LOGS / "report_ansi_c.log"), str(LOGS / "report_optimized.log")]
    args += ["--scale", "0.00390625", "--zero-point", "-128", "--json"]
    assert main([*args, "--schema-version", "1"]) == ExitCode.MISMATCH
    out = capsys.readouterr()
    assert json.loads(out.out)["schema_version"] == 1
    assert "warning:" in out.err and "deprecated" in out.err
    assert main(args) == ExitCode.MISMATCH
    out = capsys.readouterr()
    assert json.loads(out.out)["schema_version"] == 2 and "deprecated" not in out.err
