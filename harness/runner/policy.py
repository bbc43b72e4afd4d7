"""The runner's rules as pure functions: what happens after an attempt, and which board takes a task.

Data in, data out: :func:`decide` reads an attempt's outcome, the task's and the board's counters and
the policy, and returns a :class:`Decision`; the executor applies it (state, counters, events, power
cycle). Nothing here mutates, sleeps, logs or touches a board, so every rule has a unit test
(tests/test_runner_policy.py). The rules themselves: docs/ci.md, "How a run works".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from harness.errors import ExitCode, Verdict
from harness.runner.results import BoardState, BoardStatus, EventKind, Task, TaskState


@dataclass(frozen=True)
class Policy:
    """The knobs of the rules: the job's ``retries`` and the plan's ``[run]`` settings (their defaults)."""

    retries: int
    quarantine_after: int
    backoff_s: float
    backoff_max_s: float


@dataclass(frozen=True)
class Outcome:
    """What one attempt ended with."""

    exit_code: ExitCode
    reason: str
    board_fault: bool = False  # infrastructure failure where the board did not answer
    host_side: bool = False  # failed on this machine (generation, build): never the board's fault
    board_busy: bool = False  # another process held the board's lock until the wait timed out


@dataclass(frozen=True)
class TaskFacts:
    """The task's counters before this attempt."""

    infra_failures: int = 0
    fault_attempts: int = 0
    first_fault_reason: str | None = None  # reason of its first firmware-fault attempt


@dataclass(frozen=True)
class BoardFacts:
    """The board's state before this attempt."""

    status: BoardStatus = BoardStatus.OK
    consecutive_infra: int = 0
    can_power_cycle: bool = False  # the inventory gives a power_cycle command
    power_cycled: bool = False  # it already ran in this run


class Next(str, Enum):
    """What happens to the task."""

    FINISH = "finish"  # the verdict is final
    RETRY = "retry"  # back to pending after ``delay_s``, on another board of the type if any
    CONFIRM = "confirm"  # back to pending at once: re-run a firmware fault to confirm it
    ABORT = "abort"  # the run is stopping: no verdict (task state aborted, exit 3)


class BoardNext(str, Enum):
    """What happens to the board."""

    KEEP = "keep"
    POWER_CYCLE = "power-cycle"  # run its power_cycle command, then one more attempt
    QUARANTINE = "quarantine"  # no more work for the rest of the run
    BUSY = "busy"  # someone else holds it: no more work for the rest of the run


class Decisive(str, Enum):
    """Which attempt decided the verdict."""

    THIS = "this"
    FIRST_FAULT = "first_fault"  # the task's first firmware-fault attempt


@dataclass(frozen=True)
class Decision:
    """The rules' answer for one attempt; the executor applies it."""

    next: Next
    exit_code: ExitCode  # FINISH: the task's exit code; ABORT: 3; RETRY / CONFIRM: this attempt's
    reason: str
    decisive: Decisive = Decisive.THIS
    delay_s: float = 0.0
    avoid_board: bool = False  # prefer another board for the next attempt
    board: BoardNext = BoardNext.KEEP
    board_reason: str = ""
    events: tuple[tuple[EventKind, str], ...] = ()
    infra_failures: int = 0  # the task's counters after this attempt
    fault_attempts: int = 0
    consecutive_infra: int = 0  # the board's counter after this attempt


def backoff(policy: Policy, failures: int) -> float:
    """Delay before retry number ``failures`` (1-based): doubling from ``backoff_s``, capped."""
    return float(min(policy.backoff_s * (2 ** max(0, failures - 1)), policy.backoff_max_s))


def decide(
    outcome: Outcome, task: TaskFacts, board: BoardFacts, policy: Policy, *, stopping: bool
) -> Decision:
    """Apply the rules (module docstring) to one attempt's outcome."""
    consecutive = _board_count(outcome, board)
    step = _task_step(outcome, task, policy, stopping)
    board_next, board_reason, board_events = _board_step(outcome, board, consecutive, policy, stopping)
    return dataclasses.replace(
        step,
        infra_failures=task.infra_failures + (outcome.exit_code == ExitCode.INFRASTRUCTURE),
        fault_attempts=task.fault_attempts + (outcome.exit_code == ExitCode.FIRMWARE_FAULT),
        consecutive_infra=consecutive,
        board=board_next,
        board_reason=board_reason,
        events=step.events + board_events,
    )


def _board_count(outcome: Outcome, board: BoardFacts) -> int:
    """Consecutive board failures: +1 when the board did not answer, 0 once it answered."""
    if outcome.board_fault:
        return board.consecutive_infra + 1
    if outcome.exit_code == ExitCode.INFRASTRUCTURE:
        return board.consecutive_infra  # busy lock, host-side failure: says nothing about the board
    return 0


def _task_step(outcome: Outcome, task: TaskFacts, policy: Policy, stopping: bool) -> Decision:
    if outcome.exit_code == ExitCode.INFRASTRUCTURE:
        return _after_infrastructure(outcome, task, policy, stopping)
    if outcome.exit_code == ExitCode.FIRMWARE_FAULT:
        return _after_fault(outcome, task, stopping)
    if task.first_fault_reason is not None:  # the confirmation re-run did not crash
        verdict = Verdict.from_exit_code(outcome.exit_code)
        why = f"not reproduced by the re-run (which gave {verdict}): intermittent crash"
        return _fault_stands(f"{why}: {task.first_fault_reason}")
    return Decision(Next.FINISH, outcome.exit_code, outcome.reason)


def _fault_stands(why: str) -> Decision:
    """The task's first firmware fault is its verdict, whatever its confirmation re-run did."""
    return Decision(
        Next.FINISH, ExitCode.FIRMWARE_FAULT, f"firmware fault {why}", decisive=Decisive.FIRST_FAULT
    )


def _after_infrastructure(outcome: Outcome, task: TaskFacts, policy: Policy, stopping: bool) -> Decision:
    n = task.infra_failures + 1
    fault = task.first_fault_reason
    if stopping:
        if fault is not None:  # the finding stands even when its confirmation cannot run
            return _fault_stands(f"(not confirmed: run stopped): {fault}")
        return Decision(
            Next.ABORT,
            ExitCode.INFRASTRUCTURE,
            f"run stopped before a retry (last attempt: {outcome.reason})",
        )
    if not outcome.host_side and n <= policy.retries:
        delay = backoff(policy, n)
        message = f"infrastructure failure ({outcome.reason}); retry {n}/{policy.retries} in {delay:.1f} s"
        return Decision(
            Next.RETRY,
            ExitCode.INFRASTRUCTURE,
            outcome.reason,
            delay_s=delay,
            avoid_board=True,
            events=((EventKind.RETRY, message),),
        )
    if fault is not None:  # a fault was seen; its confirmation run hit the infrastructure
        return _fault_stands(f"(confirmation re-run failed: {outcome.reason}): {fault}")
    if outcome.host_side:
        return Decision(Next.FINISH, ExitCode.INFRASTRUCTURE, f"{outcome.reason} (host side: not retried)")
    return Decision(
        Next.FINISH, ExitCode.INFRASTRUCTURE, f"gave up after {n} infrastructure failure(s): {outcome.reason}"
    )


def _after_fault(outcome: Outcome, task: TaskFacts, stopping: bool) -> Decision:
    n = task.fault_attempts + 1
    if n == 1 and not stopping:
        return Decision(
            Next.CONFIRM,
            ExitCode.FIRMWARE_FAULT,
            outcome.reason,
            events=((EventKind.CONFIRM, f"firmware fault ({outcome.reason}); re-running once to confirm"),),
        )
    confirmed = " (confirmed by a re-run)" if n >= 2 else ""
    return Decision(Next.FINISH, ExitCode.FIRMWARE_FAULT, f"firmware fault{confirmed}: {outcome.reason}")


def _board_step(
    outcome: Outcome, board: BoardFacts, consecutive: int, policy: Policy, stopping: bool
) -> tuple[BoardNext, str, tuple[tuple[EventKind, str], ...]]:
    if outcome.board_busy:
        return (BoardNext.KEEP, "", ()) if stopping else (BoardNext.BUSY, outcome.reason, ())
    if not outcome.board_fault or consecutive < policy.quarantine_after or board.status != BoardStatus.OK:
        return BoardNext.KEEP, "", ()
    if board.can_power_cycle and not board.power_cycled:
        # one power cycle, then one more attempt; not while stopping (no more work is coming)
        return (BoardNext.KEEP, "", ()) if stopping else (BoardNext.POWER_CYCLE, "", ())
    reason = f"{consecutive} consecutive infrastructure failures (last: {outcome.reason})"
    return BoardNext.QUARANTINE, reason, ((EventKind.QUARANTINE, reason),)


# ---- scheduling -----------------------------------------------------------------------------------


def _fits(task: Task, board: BoardState) -> bool:
    """The board is of the task's type (and is the pinned one, for placement "each")."""
    return task.board_type == board.bench.board.name and task.pinned in (None, board.bench.name)


def may_take(task: Task, board: BoardState, boards: Iterable[BoardState]) -> bool:
    """Whether ``board`` may run ``task`` now (a board that failed it only when no other usable board
    of the type is left: docs/ci.md "How a run works")."""
    if not _fits(task, board):
        return False
    if board.bench.name not in task.avoid:
        return True
    return not any(
        _fits(task, s) and s.status == BoardStatus.OK and s.bench.name not in task.avoid for s in boards
    )


def orphans(tasks: Iterable[Task], boards: Iterable[BoardState]) -> list[tuple[Task, str]]:
    """Pending tasks no usable board can take any more, with the reason ("no usable board left")."""
    boards = list(boards)
    out = []
    for t in tasks:
        if t.state != TaskState.PENDING:
            continue
        mine = [s for s in boards if _fits(t, s)]
        if any(s.status in (BoardStatus.OK, BoardStatus.POWER_CYCLING) for s in mine):
            continue
        gone = "; ".join(f"{s.bench.name} ({s.status.value}: {s.reason})" for s in mine)
        out.append((t, "no usable board left: " + gone))
    return out


def abort_reason(task: Task) -> str:
    """Why a task the run stopped without a verdict is aborted."""
    if task.state == TaskState.RUNNING:
        return "run stopped while this task was running"
    if task.attempts:
        return f"run stopped before a retry (last attempt: {task.attempts[-1].reason})"
    return "run stopped before this task ran"
