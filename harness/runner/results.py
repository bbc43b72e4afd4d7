"""What a run records: tasks, attempts, board states and the run's result (reports render these).

Every state is an enum, and the same values appear in summary.json (docs/run-summary-schema.json) and
docs/ci.md. Verdicts are :class:`harness.errors.Verdict` (one vocabulary for every report); whether a
task finished or was aborted is its :class:`TaskState`, not a verdict.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from harness.analysis import junit
from harness.errors import EspCheckError, ExitCode, StrEnum, Verdict
from harness.flows.records import StageRecord, variant_failure
from harness.runner.inventory import BenchBoard, Inventory
from harness.runner.plan import Job, ModelCase, Plan

if TYPE_CHECKING:
    from harness.analysis.compare import CompareResult
    from harness.flows.records import FlashFacts
    from harness.jsontypes import JSONValue


class TaskState(StrEnum):
    """Where a task is. Only ``done`` and ``aborted`` appear in reports (they are written at the end)."""

    PENDING = "pending"  # waiting for a board (also between retries)
    RUNNING = "running"  # an attempt is on a board
    DONE = "done"  # it has a verdict
    ABORTED = "aborted"  # the run stopped before it got a verdict (exit 3, verdict infrastructure_error)


# The verdicts a task (and a run) can get. A run stopped by a signal still ends with the exit code of
# what it found (3 when nothing else: its unfinished tasks are aborted, infrastructure_error), so
# Verdict.INTERRUPTED (flash-and-compare's exit 130) never appears in a run summary.
TASK_VERDICTS: tuple[Verdict, ...] = (
    Verdict.MATCH,
    Verdict.MISMATCH,
    Verdict.FIRMWARE_FAULT,
    Verdict.INFRASTRUCTURE_ERROR,
    Verdict.USAGE_ERROR,
    Verdict.INTERNAL_ERROR,
)


class BoardStatus(StrEnum):
    """Where a board is."""

    OK = "ok"  # takes work
    POWER_CYCLING = "power-cycling"  # its power_cycle command is running (reported only when a second
    # signal ended the run meanwhile)
    QUARANTINED = "quarantined"  # quarantine_after consecutive infrastructure failures: no more work
    BUSY = "busy"  # another process held its lock past lock_timeout_s: no more work (not broken)


class EventKind(StrEnum):
    """What ``events[]`` of the summary record."""

    RETRY = "retry"
    CONFIRM = "confirm"
    QUARANTINE = "quarantine"
    POWER_CYCLE = "power-cycle"
    STALE_RELEASED = "stale-released"  # a labgrid place a killed esp-check run left acquired, released


class CaseStatus(StrEnum):
    """A testcase's JUnit outcome."""

    PASSED = "passed"
    FAILURE = "failure"  # a finding: mismatch or firmware fault
    ERROR = "error"  # no finding could be made: infrastructure, usage, internal, aborted


class CaseType(StrEnum):
    """A testcase's kind (JUnit ``type`` of its ``<failure>`` / ``<error>``)."""

    MATCH = "match"
    MISMATCH = "mismatch"
    FIRMWARE_FAULT = "firmware_fault"
    INFRASTRUCTURE = "infrastructure"
    USAGE = "usage"
    INTERNAL = "internal"
    ABORTED = "aborted"


def case_of(code: ExitCode | int) -> tuple[CaseStatus, CaseType]:
    """A testcase's status and type from an exit code: :func:`harness.analysis.junit.outcome_of`."""
    outcome, kind = junit.outcome_of(code)
    return CaseStatus(outcome), CaseType(kind)


class BuildFacts(TypedDict):
    """A task's build of one variant, as the summary lists it."""

    firmware_sha256: str | None
    cache_hit: bool | None
    project_dir: str


class AttemptDataset(TypedDict):
    """A dataset attempt's figures in the summary (its per-input verdicts: its report.json)."""

    source: JSONValue
    random_seed: JSONValue
    inputs: int
    verdicts: dict[str, int]
    agreement: dict[str, JSONValue]
    report: str


class BoardUsage(TypedDict):
    """One hold of a board's lock (``board_usage[]`` of the summary)."""

    board: str
    lock_key: str
    pid: int
    task: str
    attempt: int
    start: float | None
    end: float | None


class RunEvent(TypedDict):
    """One entry of ``events[]`` of the summary."""

    t: float
    kind: str
    board: str | None
    task: str | None
    message: str


@dataclass(frozen=True)
class Testcase:
    """One input x comparison of a task."""

    __test__ = False  # not a pytest class

    input_index: int
    input: str
    comparison: str  # "<a>-vs-<b>"
    status: CaseStatus
    type: CaseType
    message: str


@dataclass
class VariantOutcome:
    variant: str
    exit_code: int | None
    serial_log: str | None
    firmware_sha256: str | None
    build_cache_hit: bool | None
    flash: FlashFacts | None
    nn_mode: str | None
    capture_valid: bool
    problems: list[str]
    findings: list[dict[str, object]]
    stages: list[StageRecord]

    def failure_detail(self) -> str:
        """Why the variant did not run cleanly (:func:`harness.flows.records.variant_failure`)."""
        return variant_failure(self.stages, self.findings, self.problems)

    def to_dict(self) -> dict[str, object]:
        stages = [{k: v for k, v in s.to_dict().items() if k != "variant"} for s in self.stages]
        return {**dataclasses.asdict(self), "stages": stages}


# where and when an attempt ran and how it ended (and lock_wait_s, rounded)
_WHERE_AND_HOW = ("board", "port", "lock_key", "started", "ended", "exit_code", "reason", "board_fault")


@dataclass
class Attempt:
    """One try of a task on one board (both variants, then the comparison)."""

    n: int
    board: str
    port: str = ""
    lock_key: str = ""
    dir: Path | None = None
    started: float | None = None  # wall clock, while holding the board lock
    ended: float | None = None
    lock_wait_s: float = 0.0
    exit_code: int | None = None
    reason: str = ""
    variants: dict[str, VariantOutcome] = field(default_factory=dict)
    comparison: CompareResult | None = None
    board_fault: bool = False  # counts toward the board's quarantine
    host_side: bool = False  # failed before the board was touched (generation, build)
    board_busy: bool = False  # the board's lock was not free in time
    testcases: list[Testcase] = field(default_factory=list)
    dataset: AttemptDataset | None = None  # a dataset job: inputs, verdict counts, agreement per pair

    def failed(
        self, what: str, exc: EspCheckError, *, host_side: bool = False, board_fault: bool = False
    ) -> None:
        """The attempt ended before a verdict: ``what`` failed with ``exc``."""
        self.exit_code, self.reason = int(exc.exit_code), f"{what}: {exc.message}"
        self.host_side, self.board_fault = host_side, board_fault

    def where_and_how(self) -> dict[str, object]:
        """Where and when the attempt ran and how it ended, as attempt.json and summary.json write it."""
        return {**{k: getattr(self, k) for k in _WHERE_AND_HOW}, "lock_wait_s": round(self.lock_wait_s, 3)}


@dataclass
class Task:
    id: str
    job: Job
    case: ModelCase
    board_type: str  # canonical Board.name
    pinned: str | None  # inventory board name (placement "each")
    dir: Path
    state: TaskState = TaskState.PENDING
    not_before: float = 0.0
    infra_failures: int = 0
    fault_attempts: int = 0
    avoid: set[str] = field(default_factory=set)
    attempts: list[Attempt] = field(default_factory=list)
    exit_code: int | None = None
    verdict: Verdict | None = None  # None until the task is done or aborted
    reason: str = ""
    decisive: Attempt | None = None
    builds: dict[str, BuildFacts] = field(default_factory=dict)

    def first_fault(self) -> Attempt | None:
        return next((a for a in self.attempts if a.exit_code == ExitCode.FIRMWARE_FAULT), None)

    @property
    def reported(self) -> Attempt | None:
        """The attempt a report shows: the decisive one, else the last."""
        return self.decisive or (self.attempts[-1] if self.attempts else None)


@dataclass
class BoardState:
    bench: BenchBoard
    status: BoardStatus = BoardStatus.OK
    reason: str = ""
    consecutive_infra: int = 0
    power_cycled: bool = False
    attempts: int = 0
    lock_key: str | None = None


@dataclass
class RunResult:
    """Everything one ``esp-check run`` did; reports are rendered from this."""

    plan: Plan
    inventory: Inventory
    out_dir: Path
    tasks: list[Task]
    boards: list[BoardState]
    usage: list[BoardUsage]
    events: list[RunEvent]
    started: float
    finished: float
    interrupted: bool
    exit_code: ExitCode
    moved_aside: Path | None = None  # where the previous run's reports in out_dir went

    @property
    def verdict(self) -> Verdict:
        return Verdict.from_exit_code(self.exit_code)

    @property
    def stopped(self) -> str:
        """How a signal stopped the run ("" when none did), for the console's and the Markdown summary's
        exit line: its exit is its verdicts' as uninterrupted only when every task had its verdict (an
        aborted task is exit 3; docs/ci.md "Ctrl-C")."""
        if not self.interrupted:
            return ""
        if any(t.state == TaskState.ABORTED for t in self.tasks):
            return "interrupted: the tasks without a verdict were aborted"
        return "interrupted after every task had its verdict"

    @property
    def simulated(self) -> bool:
        return any(b.bench.simulated for b in self.boards)

    @property
    def native(self) -> bool:
        return any(b.bench.board.is_native for b in self.boards)
