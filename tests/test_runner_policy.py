"""The runner's retry / confirm / quarantine rules (harness.runner.policy), one rule per test.

Pure functions, so nothing is faked: each test builds the facts an attempt leaves behind and checks
the decision. The end-to-end behaviour on simulated boards is in tests/test_runner_sim.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from harness.errors import ExitCode
from harness.runner.plan import Job, ModelCase
from harness.runner.policy import (
    BoardFacts,
    BoardNext,
    Decisive,
    Next,
    Outcome,
    Policy,
    TaskFacts,
    abort_reason,
    backoff,
    decide,
    may_take,
    orphans,
)
from harness.runner.results import Attempt, BoardState, BoardStatus, EventKind, Task, TaskState

POLICY = Policy(retries=2, quarantine_after=3, backoff_s=2.0, backoff_max_s=5.0)
FRESH = TaskFacts()
OK_BOARD = BoardFacts()
LINK_LOST = Outcome(ExitCode.INFRASTRUCTURE, "optimized: no sync", board_fault=True)


def _decide(
    outcome: Outcome, task: TaskFacts = FRESH, board: BoardFacts = OK_BOARD, *, stopping: bool = False
):
    return decide(outcome, task, board, POLICY, stopping=stopping)


# ---- final outcomes -------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [ExitCode.MATCH, ExitCode.MISMATCH, ExitCode.USAGE, ExitCode.INTERNAL])
def test_match_mismatch_usage_and_internal_are_final_and_reset_the_board_count(code: ExitCode) -> None:
    d = _decide(Outcome(code, "why"), board=BoardFacts(consecutive_infra=2))
    assert d.next == Next.FINISH and d.exit_code == code and d.reason == "why"
    assert d.decisive == Decisive.THIS and d.events == ()
    assert d.consecutive_infra == 0  # the board answered: it works
    assert d.board == BoardNext.KEEP and not d.avoid_board


def test_a_mismatch_is_never_retried_even_with_retries_left() -> None:
    d = _decide(Outcome(ExitCode.MISMATCH, "3/10 differ"), TaskFacts(infra_failures=1))
    assert d.next == Next.FINISH and d.infra_failures == 1


# ---- firmware faults ------------------------------------------------------------------------------


def test_a_firmware_fault_is_rerun_once_to_confirm() -> None:
    d = _decide(Outcome(ExitCode.FIRMWARE_FAULT, "optimized: panic"))
    assert d.next == Next.CONFIRM and d.delay_s == 0 and not d.avoid_board
    assert d.fault_attempts == 1
    assert [k for k, _ in d.events] == [EventKind.CONFIRM]


def test_a_second_fault_confirms_it() -> None:
    d = _decide(
        Outcome(ExitCode.FIRMWARE_FAULT, "optimized: panic"),
        TaskFacts(fault_attempts=1, first_fault_reason="x"),
    )
    assert d.next == Next.FINISH and d.exit_code == ExitCode.FIRMWARE_FAULT
    assert d.fault_attempts == 2 and "confirmed by a re-run" in d.reason and d.decisive == Decisive.THIS


@pytest.mark.parametrize("code", [ExitCode.MATCH, ExitCode.MISMATCH])
def test_a_fault_the_rerun_does_not_reproduce_is_still_a_fault(code: ExitCode) -> None:
    d = _decide(Outcome(code, "fine"), TaskFacts(fault_attempts=1, first_fault_reason="optimized: panic"))
    assert d.next == Next.FINISH and d.exit_code == ExitCode.FIRMWARE_FAULT
    assert "intermittent" in d.reason and "optimized: panic" in d.reason
    assert d.decisive == Decisive.FIRST_FAULT  # the verdict rests on the attempt that crashed


def test_firmware_faults_never_count_toward_quarantine() -> None:
    board = BoardFacts(consecutive_infra=POLICY.quarantine_after - 1)
    for facts in (FRESH, TaskFacts(fault_attempts=1, first_fault_reason="x")):
        d = _decide(Outcome(ExitCode.FIRMWARE_FAULT, "panic"), facts, board)
        assert d.consecutive_infra == 0 and d.board == BoardNext.KEEP


def test_a_fault_whose_confirmation_keeps_failing_on_the_link_stays_a_fault() -> None:
    facts = TaskFacts(infra_failures=POLICY.retries, fault_attempts=1, first_fault_reason="optimized: abort")
    d = _decide(LINK_LOST, facts)
    assert d.next == Next.FINISH and d.exit_code == ExitCode.FIRMWARE_FAULT
    assert d.decisive == Decisive.FIRST_FAULT and "confirmation re-run failed" in d.reason


# ---- infrastructure -------------------------------------------------------------------------------


def test_infrastructure_is_retried_with_doubling_capped_backoff_on_another_board() -> None:
    d1 = _decide(LINK_LOST)
    assert d1.next == Next.RETRY and d1.avoid_board and d1.infra_failures == 1 and d1.delay_s == 2.0
    assert [k for k, _ in d1.events] == [EventKind.RETRY] and "retry 1/2" in d1.events[0][1]
    d2 = _decide(LINK_LOST, TaskFacts(infra_failures=1))
    assert d2.next == Next.RETRY and d2.delay_s == 4.0
    assert [backoff(POLICY, n) for n in (1, 2, 3, 4)] == [2.0, 4.0, 5.0, 5.0]


def test_infrastructure_gives_up_after_the_retries() -> None:
    d = _decide(LINK_LOST, TaskFacts(infra_failures=POLICY.retries))
    assert d.next == Next.FINISH and d.exit_code == ExitCode.INFRASTRUCTURE
    assert d.infra_failures == 3 and "gave up after 3" in d.reason and d.events == ()


def test_zero_retries_means_one_attempt() -> None:
    d = decide(LINK_LOST, FRESH, OK_BOARD, dataclasses.replace(POLICY, retries=0), stopping=False)
    assert d.next == Next.FINISH


def test_a_host_side_failure_is_not_retried_and_not_the_boards_fault() -> None:
    build = Outcome(ExitCode.INFRASTRUCTURE, "firmware build: pio failed", host_side=True)
    d = _decide(build, board=BoardFacts(consecutive_infra=2))
    assert d.next == Next.FINISH and d.exit_code == ExitCode.INFRASTRUCTURE and "not retried" in d.reason
    assert d.consecutive_infra == 2 and d.board == BoardNext.KEEP  # neither counted nor reset


def test_board_failures_count_up_and_an_answering_board_resets_them() -> None:
    assert _decide(LINK_LOST, board=BoardFacts(consecutive_infra=1)).consecutive_infra == 2
    # an infrastructure outcome where the board answered (e.g. the host reference failed) keeps the count
    ref = Outcome(ExitCode.INFRASTRUCTURE, "host reference: timeout", board_fault=False)
    assert _decide(ref, board=BoardFacts(consecutive_infra=1)).consecutive_infra == 1
    assert _decide(Outcome(ExitCode.MATCH, ""), board=BoardFacts(consecutive_infra=1)).consecutive_infra == 0


# ---- quarantine -----------------------------------------------------------------------------------


def test_quarantine_after_n_consecutive_board_failures() -> None:
    d = _decide(LINK_LOST, board=BoardFacts(consecutive_infra=POLICY.quarantine_after - 1))
    assert d.board == BoardNext.QUARANTINE and d.consecutive_infra == 3
    assert "3 consecutive infrastructure failures" in d.board_reason
    assert (EventKind.QUARANTINE, d.board_reason) in d.events
    assert d.next == Next.RETRY  # the task itself may still run on another board


def test_below_the_threshold_the_board_stays() -> None:
    d = _decide(LINK_LOST, board=BoardFacts(consecutive_infra=POLICY.quarantine_after - 2))
    assert d.board == BoardNext.KEEP


def test_one_power_cycle_first_then_quarantine_on_the_next_failure() -> None:
    at_threshold = BoardFacts(consecutive_infra=POLICY.quarantine_after - 1, can_power_cycle=True)
    d = _decide(LINK_LOST, board=at_threshold)
    assert d.board == BoardNext.POWER_CYCLE and d.events[-1][0] != EventKind.QUARANTINE
    # after the cycle the board gets one more attempt; failing it quarantines, without a second cycle
    after = BoardFacts(consecutive_infra=d.consecutive_infra, can_power_cycle=True, power_cycled=True)
    d2 = _decide(LINK_LOST, board=after)
    assert d2.board == BoardNext.QUARANTINE and d2.consecutive_infra == 4
    # ... and answering resets the count instead
    assert _decide(Outcome(ExitCode.MATCH, ""), board=after).consecutive_infra == 0


def test_a_board_already_out_of_service_is_not_quarantined_again() -> None:
    for status in (BoardStatus.QUARANTINED, BoardStatus.BUSY, BoardStatus.POWER_CYCLING):
        d = _decide(LINK_LOST, board=BoardFacts(status=status, consecutive_infra=9))
        assert d.board == BoardNext.KEEP


def test_a_busy_board_is_set_aside_and_the_task_retried_elsewhere() -> None:
    busy = Outcome(ExitCode.INFRASTRUCTURE, "board usb-sn-1 is in use by pid 42", board_busy=True)
    d = _decide(busy, board=BoardFacts(consecutive_infra=1))
    assert d.board == BoardNext.BUSY and "pid 42" in d.board_reason
    assert d.next == Next.RETRY and d.avoid_board
    assert d.consecutive_infra == 1  # busy is not broken


# ---- stop requests --------------------------------------------------------------------------------


def test_stop_aborts_a_task_instead_of_retrying_it() -> None:
    d = _decide(LINK_LOST, stopping=True)
    assert d.next == Next.ABORT and d.exit_code == ExitCode.INFRASTRUCTURE and d.events == ()
    assert "run stopped before a retry" in d.reason


def test_stop_does_not_rerun_a_fault_but_keeps_it() -> None:
    d = _decide(Outcome(ExitCode.FIRMWARE_FAULT, "panic"), stopping=True)
    assert d.next == Next.FINISH and d.exit_code == ExitCode.FIRMWARE_FAULT and "confirmed" not in d.reason
    d2 = _decide(LINK_LOST, TaskFacts(fault_attempts=1, first_fault_reason="panic"), stopping=True)
    assert d2.next == Next.FINISH and d2.exit_code == ExitCode.FIRMWARE_FAULT
    assert "not confirmed: run stopped" in d2.reason and d2.decisive == Decisive.FIRST_FAULT


def test_stop_leaves_final_outcomes_alone() -> None:
    d = _decide(Outcome(ExitCode.MISMATCH, "differ"), stopping=True)
    assert d.next == Next.FINISH and d.exit_code == ExitCode.MISMATCH


def test_stop_runs_no_power_cycle_and_marks_no_board_busy() -> None:
    board = BoardFacts(consecutive_infra=POLICY.quarantine_after - 1, can_power_cycle=True)
    assert _decide(LINK_LOST, board=board, stopping=True).board == BoardNext.KEEP
    cancelled = Outcome(ExitCode.INFRASTRUCTURE, "stopped while waiting for board lock", board_busy=True)
    assert _decide(cancelled, stopping=True).board == BoardNext.KEEP
    # a board that cannot be power-cycled is still quarantined: that is a fact, not new work
    no_cycle = BoardFacts(consecutive_infra=POLICY.quarantine_after - 1)
    assert _decide(LINK_LOST, board=no_cycle, stopping=True).board == BoardNext.QUARANTINE


# ---- scheduling -----------------------------------------------------------------------------------


class _Bench:
    def __init__(self, name: str, btype: str = "sim") -> None:
        self.name = name
        self.board = type("B", (), {"name": btype})()


def _board(name: str, status: BoardStatus = BoardStatus.OK, btype: str = "sim") -> BoardState:
    return BoardState(bench=_Bench(name, btype), status=status)  # type: ignore[arg-type]


def _task(pinned: str | None = None, btype: str = "sim") -> Task:
    job = Job(name="j", cases=(), boards=(btype,))
    return Task("t", job, ModelCase(Path("m.tflite"), ()), btype, pinned, Path("x"))


def test_a_failed_task_prefers_another_board_and_comes_back_only_when_none_is_left() -> None:
    a, b = _board("a"), _board("b")
    t = _task()
    t.avoid.add("a")
    assert not may_take(t, a, [a, b]) and may_take(t, b, [a, b])
    b.status = BoardStatus.QUARANTINED
    assert may_take(t, a, [a, b])  # no other usable board: back to the one that failed


def test_type_and_pinning_decide_which_boards_may_take_a_task() -> None:
    a, other = _board("a"), _board("c", btype="esp32")
    assert may_take(_task(), a, [a]) and not may_take(_task(), other, [a, other])
    assert may_take(_task(pinned="a"), a, [a]) and not may_take(_task(pinned="b"), a, [a])


def test_tasks_no_usable_board_can_take_become_orphans() -> None:
    a = _board("a", BoardStatus.QUARANTINED)
    a.reason = "3 consecutive infrastructure failures"
    b = _board("b", BoardStatus.POWER_CYCLING)
    t1, t2 = _task(pinned="a"), _task(pinned="b")
    got = orphans([t1, t2], [a, b])
    assert [t for t, _ in got] == [t1]  # a power-cycling board is coming back
    assert got[0][1] == "no usable board left: a (quarantined: 3 consecutive infrastructure failures)"
    t1.state = TaskState.DONE
    assert orphans([t1], [a]) == []


def test_abort_reasons_say_where_the_task_was() -> None:
    t = _task()
    assert abort_reason(t) == "run stopped before this task ran"
    t.attempts.append(Attempt(n=1, board="a", reason="no sync"))
    assert abort_reason(t) == "run stopped before a retry (last attempt: no sync)"
    t.state = TaskState.RUNNING
    assert abort_reason(t) == "run stopped while this task was running"


def test_the_policy_has_no_defaults_of_its_own() -> None:
    """Its knobs come from the plan (JobSettings.retries, RunSettings) or the options, whose defaults
    are the only ones: a second set here could drift from them."""
    assert [f.name for f in dataclasses.fields(Policy) if f.default is not dataclasses.MISSING] == []
