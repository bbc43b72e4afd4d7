"""What an orchestrated run records: stages, per-variant outcomes, limits, progress."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, TypeVar

if sys.version_info >= (3, 11):
    from typing import NotRequired
else:  # pragma: no cover - Python 3.10 (typing_extensions costs a repeat run ~10 ms to import)
    from typing_extensions import NotRequired

from harness.analysis.classify import Severity
from harness.analysis.compare import CompareResult, Source
from harness.errors import EspCheckError, ExitCode, StrEnum, Verdict
from harness.jsontypes import JSONValue
from harness.protocol.capture import Capture, parse_capture

if TYPE_CHECKING:  # (only --tap runs load the tap analysis: flash_and_compare._tap)
    from harness.analysis.tap import TapResult


ProgressFn = Callable[[str, str], None]  # (stage, message)
T = TypeVar("T")


class StageStatus(StrEnum):
    """How a stage ended."""

    OK = "ok"
    FAILED = "failed"


@dataclass(frozen=True)
class StageTimeouts:
    """Per-stage limits in seconds. Flash time is bounded by esptool's own per-command timeouts."""

    build: float = 1800.0
    capture_total: float = 180.0
    capture_silence: float = 30.0


@dataclass
class StageRecord:
    """One stage of one run: what happened, how long it took, and why it failed."""

    stage: str
    variant: str | None
    status: StageStatus
    seconds: float
    detail: str = ""
    exit_code: int | None = None

    def to_dict(self) -> dict[str, object]:
        return {**dataclasses.asdict(self), "seconds": round(self.seconds, 3)}  # a StrEnum is its value


class FlashRegion(TypedDict):
    offset: int
    role: str
    variant: str | None
    size: int
    skipped: bool
    bytes_written: int


class FlashFacts(TypedDict):
    """What report.json says about the flash: chip, revision, MAC, bytes written per region."""

    chip: str
    revision: str | None
    mac: str | None
    regions: list[FlashRegion]
    bytes_written: int
    seconds: float
    skipped: NotRequired[str]  # no esptool session: why (the HELLO hashes matched)


class EspnnCoverage(TypedDict):
    """How many of the model's ops ESP-NN accelerates on the chip, and why none when none."""

    chip: str
    accelerated_ops: int
    ops: int
    why: str


class OutputValues(TypedDict):
    run: int
    output: int
    count: int
    distinct: int
    values: list[JSONValue]


class RefusalFinding(TypedDict):
    """``reference_refused`` of report.json (flows/refused.py)."""

    kind: str
    summary: str
    reference: str
    reference_run: int | None
    variants_agree: bool | None
    mismatched: int
    values: dict[str, list[OutputValues]]
    exit_code: int


class NativeFacts(TypedDict):
    """``native`` of report.json: what a native board's results mean, what each program said it was."""

    meaning: str
    bits: int | None
    reported: dict[str, dict[str, str | None]]


def section(value: object) -> dict[str, JSONValue]:
    """A table of a report section read back (``FlashAndCompareResult.dataset``, ...): empty when it
    is missing or not a table."""
    return value if isinstance(value, dict) else {}


def entries(value: object) -> list[JSONValue]:
    """An array of a report section read back: empty when it is missing or not an array."""
    return value if isinstance(value, list) else []


def variant_failure(
    stages: list[StageRecord],
    findings: list[dict[str, object]],
    problems: list[str],
    otherwise: str = "did not run cleanly",
) -> str:
    """Why a variant did not run cleanly, for its JUnit ``<variant>.run`` case, the run's reason and the
    headline: its failed stages' details (a link that needed repairs is the ``link`` stage), else what its
    findings (not the warnings) and its capture's problems say, else ``otherwise``."""
    said = [s.detail for s in stages if s.status == StageStatus.FAILED and s.detail]
    said = said or [str(f["message"]) for f in findings if f.get("severity") != Severity.WARNING] + problems
    return "; ".join(said) or otherwise


@dataclass
class VariantRun:
    """Everything one variant produced; kept even when a stage failed."""

    variant: str
    project_dir: Path | None = None
    firmware_sha256: str | None = None
    build_cache_hit: bool | None = None
    flash: FlashFacts | None = None
    serial_log: Path | None = None
    capture_valid: bool = False
    nn_mode: str | None = None
    findings: list[dict[str, object]] = field(default_factory=list)
    source: Source | None = None  # the device's outputs, only when its capture validated
    problems: list[str] = field(default_factory=list)
    exit_code: ExitCode | None = None  # what this variant's failure implies; None when it ran cleanly

    def capture(self) -> Capture | None:
        """What the device printed, parsed from the serial log (None: no log was written)."""
        if self.serial_log is None or not Path(self.serial_log).is_file():
            return None
        return parse_capture(Path(self.serial_log).read_bytes())


class Recorder:
    """Collects stage records and forwards progress events."""

    def __init__(self, progress: ProgressFn | None = None) -> None:
        self.stages: list[StageRecord] = []
        self.progress = progress

    def say(self, stage: str, message: str) -> None:
        if self.progress is not None:
            self.progress(stage, message)

    def adopt(self, stages: list[StageRecord], prefix: str) -> None:
        """Take another run's stages into this record, each labelled ``prefix:stage``."""
        self.stages += [dataclasses.replace(s, stage=f"{prefix}:{s.stage}") for s in stages]

    def add(
        self, stage: str, variant: str | None, code: ExitCode | None, seconds: float, detail: str = ""
    ) -> None:
        """Record a stage decided elsewhere (no callable to time)."""
        status = StageStatus.OK if code is None else StageStatus.FAILED
        self.stages.append(
            StageRecord(stage, variant, status, seconds, detail, None if code is None else int(code))
        )

    def run(
        self, stage: str, variant: str | None, fn: Callable[[], T], detail: Callable[[], str] | None = None
    ) -> T:
        """Time ``fn`` as ``stage``; ``detail`` says, after it succeeded, what the record should note."""
        label = f"{stage} [{variant}]" if variant else stage
        self.say(label, "started")
        t0 = time.monotonic()
        try:
            value = fn()
        except EspCheckError as exc:
            self.add(stage, variant, exc.exit_code, time.monotonic() - t0, str(exc))
            self.say(label, f"failed: {exc.message}")
            raise
        self.add(stage, variant, None, time.monotonic() - t0, detail() if detail is not None else "")
        self.say(label, f"done in {time.monotonic() - t0:.1f} s")
        return value


@dataclass
class FlashAndCompareResult:
    """The outcome of one ``flash-and-compare`` run."""

    out_dir: Path
    board: str
    port: str
    simulated: bool
    stages: list[StageRecord]
    variants: dict[str, VariantRun]
    comparison: CompareResult | None
    exit_code: ExitCode
    report_path: Path
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    tap: TapResult | None = None  # with --tap
    espnn: EspnnCoverage | None = None
    dataset: dict[str, JSONValue] | None = None  # --dataset / --random-inputs: per-input verdicts, agreement
    link: dict[str, float | int | None] | None = None  # what crossed the serial link in the resident loop
    native: NativeFacts | None = None
    reference_refused: RefusalFinding | None = None  # the host reference aborted (flows/refused.py)

    @property
    def espnn_untested(self) -> bool:
        """True when ESP-NN accelerates none of the ops: both variants run the same kernels."""
        return self.espnn is not None and self.espnn["accelerated_ops"] == 0

    @property
    def verdict(self) -> Verdict:
        return Verdict.from_exit_code(self.exit_code)

    @property
    def summary(self) -> str:
        """One line: the verdict and the first piece of evidence behind it (what a failed assertion
        should say; the full account is in ``report_path``)."""
        head = f"{self.verdict} (exit {int(self.exit_code)}) on {self.board}" + (
            " [SIMULATED]" if self.simulated else ""
        )
        why = _first_reason(self)
        return f"{head}: {why}" if why else f"{head}; report: {self.report_path}"


def _first_reason(result: FlashAndCompareResult) -> str:
    """The evidence that decided the verdict, most specific first."""
    if result.exit_code == ExitCode.MATCH:
        cmp = result.comparison
        if cmp is None:
            return ""
        n = len(cmp.comparisons)
        return f"{n} output comparison(s) agree within {cmp.tolerance_lsb:g} LSB"
    for run in result.variants.values():  # a crash, a timeout, a lost link, as the device showed it
        if run.exit_code is not None and run.exit_code != ExitCode.MATCH:
            stages = [s for s in result.stages if s.variant == run.variant]
            if said := variant_failure(stages, run.findings, run.problems, otherwise=""):
                return f"{run.variant}: {said.splitlines()[0]}"
    if result.comparison is not None:
        for fault in result.comparison.faults:
            return f"{fault.source} reported an error at stage {fault.stage}: {fault.msg}"
        for c in result.comparison.comparisons:
            if not c.match:
                return c.mismatch_text()
    if result.errors:
        return result.errors[0]
    failed = [s for s in result.stages if s.status == StageStatus.FAILED]
    if failed:
        s = failed[-1]
        return f"stage {s.stage}" + (f" ({s.variant})" if s.variant else "") + f" failed: {s.detail}"
    return ""
