"""What a run records: tasks, attempts, board states and the run's result (reports render these)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness.errors import ExitCode
from harness.runner.inventory import BenchBoard, Inventory
from harness.runner.plan import Job, ModelCase, Plan


@dataclass
class VariantOutcome:
    variant: str
    exit_code: int | None
    serial_log: str | None
    firmware_sha256: str | None
    build_cache_hit: bool | None
    flash: dict[str, Any] | None
    nn_mode: str | None
    capture_valid: bool
    problems: list[str]
    findings: list[dict[str, Any]]
    stages: list[dict[str, Any]]


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
    comparison: Any | None = None  # harness.analysis.compare.CompareResult
    board_fault: bool = False  # counts toward the board's quarantine
    testcases: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Task:
    id: str
    index: int
    job: Job
    case: ModelCase
    board_type: str  # canonical Board.name
    pinned: str | None  # inventory board name (placement "each")
    dir: Path
    state: str = "pending"  # pending | running | done | aborted
    not_before: float = 0.0
    infra_failures: int = 0
    fault_attempts: int = 0
    avoid: set[str] = field(default_factory=set)
    attempts: list[Attempt] = field(default_factory=list)
    exit_code: int | None = None
    verdict: str = "pending"
    reason: str = ""
    decisive: Attempt | None = None
    builds: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class BoardState:
    bench: BenchBoard
    status: str = "ok"  # ok | quarantined | busy | unreachable
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
    usage: list[dict[str, Any]]
    events: list[dict[str, Any]]
    started: float
    finished: float
    interrupted: bool
    exit_code: ExitCode


VERDICTS = {
    ExitCode.MATCH: "match",
    ExitCode.MISMATCH: "mismatch",
    ExitCode.USAGE: "usage_error",
    ExitCode.INFRASTRUCTURE: "infrastructure_error",
    ExitCode.FIRMWARE_FAULT: "firmware_fault",
    ExitCode.INTERNAL: "internal_error",
}


def now_iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
