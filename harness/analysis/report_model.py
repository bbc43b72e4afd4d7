"""The compare report's typed model: docs/report-schema.json is generated from :class:`CompareReport`
(``python -m harness.runner.schemas``), and tests validate :func:`harness.analysis.report.report_dict`'s
documents against it.

``report_dict`` builds its document by hand, without pydantic: building these models' validators costs
a CLI run ~0.03-0.06 s of CPU, and report.json is written on every run (docs/dataset.md, host CPU).
tests/test_report.py checks that the document it builds is, value for value and key order for key order,
what these models validate and dump.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from harness.analysis.report import SCHEMA_ID, SCHEMA_VERSION
from harness.jsontypes import json_number

__all__ = ["CompareReport", "ComparisonDoc", "FaultDoc", "Mismatch", "SourceDoc", "ToolDoc"]

Number = int | float  # (smart union: an int stays an int, the same JSON text)
Share = Annotated[int, Field(ge=0, le=1)] | Annotated[float, Field(ge=0, le=1)]
Tolerance = Annotated[int, Field(ge=0)] | Annotated[float, Field(ge=0)]
Reported = Number | Literal["nan", "inf", "-inf"]  # JSON has no NaN / Infinity
Metric = Annotated[Reported | None, BeforeValidator(json_number)]
Value = Annotated[Reported, BeforeValidator(json_number)]
Values = Annotated[list[Metric] | None, Field(description="for tensors of at most 64 elements, else null")]


class _Doc(BaseModel):
    """A part of a report esp-check writes (more keys may come within a schema version)."""

    model_config = ConfigDict(json_schema_serialization_defaults_required=True)


class Mismatch(_Doc):
    """One of the first elements beyond the tolerance (``diff_lsb`` only when the scale is known)."""

    model_config = ConfigDict(json_schema_serialization_defaults_required=False)

    index: int
    a: Value
    b: Value
    diff_lsb: Value | None = Field(None, exclude_if=lambda v: v is None)


class ComparisonDoc(_Doc):
    """One output tensor of one input, A against B (differences are A minus B)."""

    a: str
    b: str
    run: int = Field(ge=0, description="Input index i.")
    output: int = Field(ge=0)
    name: str
    verdict: Literal["match", "mismatch"]
    count: int = Field(ge=0)
    mismatched: int = Field(
        ge=0, description="Elements with |diff| > tolerance_lsb (exact inequality when units is 'real')."
    )
    tolerance_lsb: Number
    units: Literal["lsb", "real"] = Field(
        description="lsb: differences counted in quantization steps; real: scale unknown, real values "
        "compared exactly."
    )
    scale: Number | None
    zero_point: int | None
    max_abs_diff: Metric
    mean_abs_diff: Metric
    max_diff_lsb: Metric
    mean_diff_lsb: Metric
    rmse: Metric
    cosine: Metric
    argmax_a: int | None
    argmax_b: int | None
    argmax_agree: bool | None
    topk: int = Field(ge=0)
    topk_agreement: Share | None
    pinned_a: bool | None = Field(
        description="At least 90% of A's elements sit at the dtype min or max "
        "(null: quantized values unknown)."
    )
    pinned_b: bool | None
    pinned_fraction_a: Number | None
    pinned_fraction_b: Number | None
    diff_lsb: Values = Field(description="|A-B| per element in LSB, for tensors of at most 64 elements.")
    values_a: Values = Field(description="A's real (dequantized) values, for tensors of at most 64 elements.")
    values_b: Values
    first_mismatches: list[Mismatch] = Field(max_length=10)


class SourceDoc(_Doc):
    label: str = Field(description="A, B or reference")
    kind: Literal["protocol", "legacy", "results", "npy", "reference"]
    path: str | None
    nn: str | None = Field(
        description="ESP-NN mode the firmware printed from its compiled-in config (INFO nn); null when not "
        "proven (legacy logs, .npy)."
    )
    model_sha256: str | None
    simulated: bool
    input_sha256: list[str | None]
    invoke_us: list[int | None]
    info: dict[str, str] = Field(description="All INFO fields of a protocol capture.")
    backend_version: str | None


class FaultDoc(_Doc):
    """An ERROR record the firmware printed: a finding (exit 4; exit 2 for stage 'input')."""

    source: str
    stage: str
    code: int
    run: int | None
    msg: str


class ToolDoc(_Doc):
    name: Literal["esp-check"] = "esp-check"
    version: str


class CompareReport(_Doc):
    """Output of `esp-check compare --json` (harness.analysis.report.report_dict). Versioned by
    schema_version: a field is only ever added within one version; renaming or removing one, or changing
    its values, bumps the version. Version 2 uses the one verdict vocabulary of every esp-check report
    (usage_error, infrastructure_error, internal_error where version 1 said input_error and error);
    `--schema-version 1` still writes version 1 for one release, with a deprecation warning. JSON has no
    NaN/Infinity, so non-finite numbers are the strings 'nan', 'inf', '-inf'. Differences are A minus B;
    LSB = one quantization step of the output (its scale)."""

    model_config = ConfigDict(title="esp-check compare report")

    schema_id: Literal["esp-check-compare-report"] = Field(SCHEMA_ID, alias="schema")
    schema_version: Literal[2] = SCHEMA_VERSION
    tool: ToolDoc
    reference_backend: str | None = Field(
        description="Host reference backend and version (e.g. 'tflite-micro 0.dev20261023182759 (TFLM "
        "reference kernels)'), null without --model/--input."
    )
    simulated: bool = Field(description="True when any source came from the simulated board (BEGIN sim=1).")
    verdict: Literal[
        "match", "mismatch", "firmware_fault", "usage_error", "infrastructure_error", "internal_error"
    ]
    exit_code: Literal[0, 1, 2, 3, 4, 70] = Field(
        description="The process exit code this report maps to (README)."
    )
    tolerance_lsb: Tolerance = Field(description="Allowed |A-B| (optimized vs ANSI C).")
    ref_tolerance_lsb: Tolerance = Field(description="Allowed |device - host reference|.")
    sources: list[SourceDoc] = Field(min_length=2, max_length=3)
    comparisons: list[ComparisonDoc]
    faults: list[FaultDoc]
    warnings: list[str]
