"""Run a plan over a bench: one worker thread per board, board locks, retries, quarantine.

Scheduling, firmware sharing, locks and stopping: docs/ci.md "How a run works"; how a task runs as a
job of the one pipeline: docs/architecture.md. :func:`harness.runner.policy.decide` says what happens
after an attempt; this module applies its decisions.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import json
import os
import threading
import time
import traceback
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from harness import children
from harness.analysis.report import report_dict
from harness.device.labgrid import LabgridClient, PlaceLease
from harness.device.locks import BoardLock, lock_key
from harness.device.ports import check_present
from harness.errors import (
    BoardBusyError,
    BuildError,
    EspCheckError,
    ExitCode,
    PlanError,
    PlatformUnreachableError,
    Verdict,
    combine_exit_codes,
)
from harness.firmware.boards import load_board
from harness.firmware.generate import FirmwareFeatures
from harness.firmware.native.project import NativeOptions
from harness.flows import firmware as firmware_flow
from harness.flows.records import Recorder, StageTimeouts
from harness.flows.targets import target_class
from harness.model.loader import load_model
from harness.model.opdata import espnn_model_acceleration
from harness.model.reference import prepare_host_results
from harness.protocol.emitter import build_c_library, find_c_compiler
from harness.resources import atomic_write
from harness.runner.attempts import judge_dataset, judge_inputs
from harness.runner.inventory import BenchBoard, Inventory
from harness.runner.paths import move_aside, safe_component
from harness.runner.plan import Plan, dataset_options
from harness.runner.policy import (
    BoardFacts,
    BoardNext,
    Decision,
    Decisive,
    Next,
    Outcome,
    Policy,
    TaskFacts,
    abort_reason,
    decide,
    may_take,
    orphans,
)
from harness.runner.reports import write_reports
from harness.runner.results import (
    Attempt,
    BoardState,
    BoardStatus,
    BoardUsage,
    EventKind,
    RunEvent,
    RunResult,
    Task,
    TaskState,
)

if TYPE_CHECKING:
    from harness.firmware.boards import Board
    from harness.flows.firmware import Firmware
    from harness.flows.job import JobOptions, JobSpec
    from harness.runner.plan import Job

V = TypeVar("V")

# (board, url, attempt number, task id) -> URL to open instead, or None. A seam for random
# per-attempt fault injection on simulated benches (bench/bench_soak.py); tests use the simulator's
# own ``fault_boots`` instead. The board itself is the only thing faked.
PortOverride = Callable[[BenchBoard, str, int, str], "str | None"]


@dataclass
class RunOptions:
    """How to run (the plan says what to run)."""

    out_dir: Path
    lock_dir: Path | None = None
    lock_timeout_s: float | None = None  # None: the plan's [run] lock_timeout_s
    cache_dir: Path | None = None
    builder: str | None = None
    native: NativeOptions | None = None  # native boards' builds (docs/native.md)
    owner: str = ""
    progress: Callable[[str], None] | None = None
    stop: threading.Event | None = None
    hard_stop: threading.Event | None = None  # second Ctrl-C: stop waiting for running attempts
    port_override: PortOverride | None = None
    backoff_s: float | None = None  # None: the plan's [run] settings
    quarantine_after: int | None = None
    # report files outside out_dir this run will write (--junit, --markdown, --json-file): deleted
    # when the run starts, so a run killed before it writes them leaves no stale verdict behind
    report_paths: Sequence[Path] = ()


class _Memo(Generic[V]):
    """Compute-once values shared by threads (firmware builds, host references), errors included."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._locks: dict[Hashable, threading.Lock] = {}
        self._values: dict[Hashable, V | EspCheckError] = {}

    def get(self, key: Hashable, fn: Callable[[], V]) -> V:
        with self._lock:
            one = self._locks.setdefault(key, threading.Lock())
        with one:
            if key not in self._values:
                try:
                    self._values[key] = fn()
                except EspCheckError as exc:
                    self._values[key] = exc
            value = self._values[key]
        if isinstance(value, EspCheckError):
            raise value
        return value


def _exit_code(code: int | None) -> ExitCode:
    return ExitCode(code) if code in {int(c) for c in ExitCode} else ExitCode.INTERNAL


class Runner:
    """One run of a plan over an inventory (use :func:`run_plan`)."""

    def __init__(self, plan: Plan, inventory: Inventory, options: RunOptions) -> None:
        self.plan = plan
        self.inv = inventory
        self.opt = options
        self.out = Path(options.out_dir).resolve()
        self.stop = options.stop or threading.Event()
        self.hard_stop = options.hard_stop or threading.Event()
        self.cond = threading.Condition()
        self.boards = {b.name: BoardState(b) for b in inventory.boards}
        self.usage: list[BoardUsage] = []
        self.events: list[RunEvent] = []
        self.builds: _Memo[Firmware] = _Memo()
        self.refs: _Memo[None] = _Memo()
        self.lock_timeout = (
            options.lock_timeout_s if options.lock_timeout_s is not None else plan.run.lock_timeout_s
        )
        self.rules = functools.partial(  # the job's retries go in per task
            Policy,
            quarantine_after=options.quarantine_after or plan.run.quarantine_after,
            backoff_s=options.backoff_s if options.backoff_s is not None else plan.run.backoff_s,
            backoff_max_s=plan.run.backoff_max_s,
        )
        self.moved_aside: Path | None = None
        self.leases: list[PlaceLease] = []  # labgrid places this run may hold (released at the end)
        self.offline_tools: dict[str, BuildError] = {}  # tool -> its first "cannot reach its platform"
        self.tool_gates: dict[str, threading.Lock] = {}  # the first build of each tool runs alone
        self.tools_tried: set[str] = set()
        self.tasks = self._make_tasks()

    # ---- setup ------------------------------------------------------------------------------------

    def _make_tasks(self) -> list[Task]:
        tasks: list[Task] = []
        for job in self.plan.jobs:
            for btype in job.boards:
                canon = load_board(btype).name
                benches = [b for b in self.inv.boards if b.board.name == canon]
                if not benches:
                    raise PlanError(
                        f"plan {self.plan.path}: job {job.name!r}: field 'boards' wants board type "
                        f"{canon!r}, but inventory {self.inv.path} has no board of that type",
                        hint="add the board to the inventory or remove the type from the job",
                    )
                targets: list[str | None] = [b.name for b in benches] if job.placement == "each" else [None]
                _refuse_untested(self.plan.path, job, benches[0].board)
                for case in job.cases:
                    for pinned in targets:
                        where = canon + (f"@{pinned}" if pinned else "")
                        parts = (job.name, case.name, where)
                        tasks.append(
                            Task(
                                id="/".join(parts),
                                job=job,
                                case=case,
                                board_type=canon,
                                pinned=pinned,
                                dir=self.out.joinpath("jobs", *map(safe_component, parts)),
                            )
                        )
        return tasks

    def say(self, msg: str) -> None:
        if self.opt.progress is not None:
            self.opt.progress(msg)

    def event(
        self, kind: EventKind, message: str, *, board: str | None = None, task: str | None = None
    ) -> None:
        with self.cond:
            self.events.append(
                RunEvent(t=time.time(), kind=kind.value, board=board, task=task, message=message)
            )
        self.say(f"[{kind}] " + (f"{board}: " if board else "") + (f"{task}: " if task else "") + message)

    # ---- scheduling -------------------------------------------------------------------------------

    def _next_for(self, state: BoardState) -> Task | None:
        with self.cond:
            while True:
                if self.stop.is_set() or state.status != BoardStatus.OK:
                    return None
                now = time.monotonic()
                same_type = [t for t in self.tasks if t.board_type == state.bench.board.name]
                mine = [
                    t
                    for t in same_type
                    if t.state == TaskState.PENDING and may_take(t, state, self.boards.values())
                ]
                ready = [t for t in mine if t.not_before <= now]
                if ready:
                    ready[0].state = TaskState.RUNNING
                    return ready[0]
                if mine:
                    self.cond.wait(timeout=max(0.01, min(t.not_before for t in mine) - now))
                elif any(t.state in (TaskState.PENDING, TaskState.RUNNING) for t in same_type):
                    self.cond.wait(timeout=0.5)  # a running task may come back for a retry
                else:
                    return None

    def _finish(self, t: Task, code: ExitCode, reason: str, decisive: Attempt | None = None) -> None:
        t.state = TaskState.DONE
        t.exit_code = int(code)
        t.verdict = Verdict.from_exit_code(code)
        t.reason = reason
        if decisive is not None:
            t.decisive = decisive
        self.cond.notify_all()

    def _abort(self, t: Task, reason: str) -> None:
        self._finish(t, ExitCode.INFRASTRUCTURE, reason)
        t.state = TaskState.ABORTED

    def _orphan_check(self) -> None:
        """Pending tasks that no usable board can take any more become errors (caller holds cond)."""
        for t, reason in orphans(self.tasks, self.boards.values()):
            self._finish(t, ExitCode.INFRASTRUCTURE, reason)

    def _decide(self, t: Task, state: BoardState, a: Attempt) -> Decision:
        first = next((x for x in t.attempts if x is not a and x.exit_code == ExitCode.FIRMWARE_FAULT), None)
        return decide(
            Outcome(
                exit_code=_exit_code(a.exit_code),
                reason=a.reason,
                board_fault=a.board_fault,
                host_side=a.host_side,
                board_busy=a.board_busy,
            ),
            TaskFacts(t.infra_failures, t.fault_attempts, first.reason if first is not None else None),
            BoardFacts(
                state.status, state.consecutive_infra, state.bench.can_power_cycle, state.power_cycled
            ),
            self.rules(retries=t.job.retries),
            stopping=self.stop.is_set(),
        )

    def _apply(self, t: Task, state: BoardState, a: Attempt, d: Decision) -> None:
        """Carry out a decision of the rules (caller holds cond)."""
        t.infra_failures, t.fault_attempts = d.infra_failures, d.fault_attempts
        state.consecutive_infra = d.consecutive_infra
        if d.avoid_board:
            t.avoid.add(state.bench.name)
        for kind, message in d.events:
            self.event(
                kind, message, board=state.bench.name, task=None if kind == EventKind.QUARANTINE else t.id
            )
        if d.next == Next.FINISH:
            self._finish(t, d.exit_code, d.reason, a if d.decisive == Decisive.THIS else t.first_fault())
        elif d.next == Next.ABORT:
            self._abort(t, d.reason)
        else:
            t.state = TaskState.PENDING
            t.not_before = time.monotonic() + d.delay_s
        if d.board == BoardNext.POWER_CYCLE:
            state.status, state.power_cycled = BoardStatus.POWER_CYCLING, True
        elif d.board in (BoardNext.QUARANTINE, BoardNext.BUSY):
            state.status = BoardStatus.QUARANTINED if d.board == BoardNext.QUARANTINE else BoardStatus.BUSY
            state.reason = d.board_reason
        self._orphan_check()  # a requeued task whose boards are all gone ends here, not as "aborted"
        self.cond.notify_all()

    # ---- workers ----------------------------------------------------------------------------------

    def worker(self, state: BoardState) -> None:
        while True:
            t = self._next_for(state)
            if t is None:
                return
            a = self._run_attempt(t, state)
            with self.cond:
                if self.hard_stop.is_set():  # abandoned: its task is aborted, whatever came back late
                    return
                self._apply(t, state, a, self._decide(t, state, a))
                cycle = state.status == BoardStatus.POWER_CYCLING
            verdict = Verdict.from_exit_code(_exit_code(a.exit_code))
            self.say(f"[done] {t.id} attempt {a.n} on {state.bench.name}: {verdict} ({a.reason[:200]})")
            if cycle:
                self._power_cycle(state)

    def _run_attempt(self, t: Task, state: BoardState) -> Attempt:
        """One attempt, its record written whatever happens (a bug must not lose it)."""
        n = len(t.attempts) + 1
        a = Attempt(
            n=n, board=state.bench.name, dir=t.dir / safe_component(f"attempt-{n}-{state.bench.name}")
        )
        t.attempts.append(a)
        state.attempts += 1
        try:
            self._attempt(t, state, a)
        except Exception as exc:  # a bug must not kill the worker or lose the task's record
            a.exit_code = int(ExitCode.INTERNAL)
            a.reason = f"internal error: {type(exc).__name__}: {exc}"
            a.board_fault = False
            with contextlib.suppress(Exception):
                assert a.dir is not None
                atomic_write(a.dir / "traceback.txt", traceback.format_exc())
        self._write_attempt(t, a)
        return a

    def _power_cycle(self, state: BoardState) -> None:
        ok, out = self._place_power_cycle(state.bench) if state.bench.place else state.bench.run_power_cycle()
        self.event(EventKind.POWER_CYCLE, f"{'ok' if ok else 'FAILED'}: {out}", board=state.bench.name)
        with self.cond:
            state.status = BoardStatus.OK  # one more attempt; the next board failure quarantines it
            self.cond.notify_all()

    def _place_power_cycle(self, bench: BenchBoard) -> tuple[bool, str]:
        """Power-cycle a labgrid place through labgrid's power driver (``labgrid-client power cycle``)."""
        lease = self._lease(bench)
        try:
            self._take_place(bench, lease)
            return lease.client.power_cycle(lease.place)
        except EspCheckError as exc:
            return False, f"labgrid: {exc.message}"
        finally:
            lease.release()

    # ---- one attempt ------------------------------------------------------------------------------

    def _attempt(self, t: Task, state: BoardState, a: Attempt) -> None:
        """The firmware built once per key (host side, before the board is locked), then the job on the
        locked board through the one pipeline (:func:`harness.flows.flash_and_compare.run_job`: its
        judge checks every capture); this module turns its result into the attempt's verdict."""
        # lazy: the pipeline (pyserial's tools, rich: ~70 ms) loads when a task runs, not for `bench detect`
        from harness.flows.flash_and_compare import run_job

        assert a.dir is not None
        a.dir.mkdir(parents=True, exist_ok=True)
        self.say(f"[start] {t.id} attempt {a.n} on {state.bench.name}")
        fw = None
        if t.job.data is None:
            try:
                fw = self._firmware(t, state.bench.board)
            except EspCheckError as exc:  # host side, not retried (its builds: attempts._attempt_facts)
                a.failed("firmware build", exc, host_side=True)
                return
        held = self._lock_board(state, a)
        if held is None:
            return
        try:
            result = run_job(self._job_spec(t, state.bench, a, fw))
        except EspCheckError as exc:  # raised before flashing: generation, the dataset, the port
            infra = exc.exit_code == ExitCode.INFRASTRUCTURE
            what = "dataset job" if t.job.data is not None else "job"
            a.failed(what, exc, host_side=not infra, board_fault=infra)
            return
        finally:
            self._release(t, state.bench, a, held)
        if t.job.data is not None:
            judge_dataset(t, a, result)
        else:
            judge_inputs(t, a, result)

    def _job_options(self, t: Task) -> JobOptions:
        """How the task's job runs: the plan's settings, the run's build options, no lock (the runner
        holds it)."""
        from harness.flows.job import JobOptions  # lazy: the pipeline, as in _attempt

        return JobOptions(
            input_options=t.job.input_options,
            tolerance_lsb=t.job.tolerance_lsb,
            ref_tolerance_lsb=t.job.ref_tolerance_lsb,
            reference=t.job.needs_reference,
            builder=self.opt.builder,
            cache_dir=self.opt.cache_dir,
            arena_kb=t.job.arena_kb,
            lock=False,
            dataset=dataset_options(t.job, t.case),  # None for a job of input files
            timeouts=StageTimeouts(**t.job.timeouts.model_dump()),  # the same three fields
            native=self.opt.native,
            allow_untested=t.job.allow_untested,
        )

    def _job_spec(self, t: Task, bench: BenchBoard, a: Attempt, fw: Firmware | None) -> JobSpec:
        from harness.flows.job import JobSpec  # lazy: the pipeline, as in _attempt

        assert a.dir is not None
        inputs = () if t.job.data is not None else tuple(Path(p) for p in t.case.inputs)
        port = a.port
        if self.opt.port_override is not None:
            port = self.opt.port_override(bench, a.port, a.n, t.id) or a.port
        return JobSpec(
            Path(t.case.model), inputs, bench.board, port, a.dir, self._job_options(t), firmware=fw
        )

    def _lock_board(self, state: BoardState, a: Attempt) -> BoardLock | PlaceLease | None:
        """Take the board's lock (a labgrid place: reserve and acquire it), or None with the attempt
        marked failed."""
        bench = state.bench
        try:
            held = self._lease_place(state, a) if bench.place else self._board_lock(state, a)
        except BoardBusyError as exc:  # held past the wait (or a stop request): no attempt, no lock
            a.exit_code, a.reason, a.board_busy = int(ExitCode.INFRASTRUCTURE), exc.message, True
            return None
        except EspCheckError as exc:  # the port; or the coordinator, the place or its serial port resource
            infra = exc.exit_code == ExitCode.INFRASTRUCTURE
            a.failed("labgrid" if bench.place else "port", exc, board_fault=infra and not bench.place)
            return None
        a.lock_wait_s = held.waited_s
        a.started = time.time()
        return held

    def _board_lock(self, state: BoardState, a: Attempt) -> BoardLock:
        """Resolve the board's port and take its board lock."""
        ps = state.bench.resolve()
        a.port = ps.url
        a.lock_key = state.lock_key = lock_key(ps)
        owner = self.opt.owner or f"esp-check run {self.plan.path.name}"
        held = BoardLock(a.lock_key, self.opt.lock_dir, owner=owner)
        held.acquire(
            self.lock_timeout,
            on_wait=lambda m: self.say(f"[lock] {state.bench.name}: {m}"),
            cancel=self.stop,  # a stop request ends the wait: no new work on any board
        )
        return held

    def _lease(self, bench: BenchBoard) -> PlaceLease:
        """A lease on the board's labgrid place, tracked so the run releases it whatever happens."""
        assert bench.place is not None and bench.coordinator is not None
        lease = PlaceLease(LabgridClient(bench.coordinator), bench.place)
        with self.cond:
            self.leases.append(lease)
        return lease

    def _take_place(self, bench: BenchBoard, lease: PlaceLease) -> None:
        """Wait for and acquire the place (BoardBusyError / LabgridError as the lock would)."""
        lease.acquire(
            self.lock_timeout,
            on_wait=lambda m: self.say(f"[labgrid] {bench.name}: {m}"),
            on_note=lambda m: self.event(EventKind.STALE_RELEASED, m, board=bench.name),  # says it too
            cancel=self.stop,
        )

    def _lease_place(self, state: BoardState, a: Attempt) -> PlaceLease:
        """Reserve and acquire the board's labgrid place; its NetworkSerialPort is the port."""
        bench = state.bench
        lease = self._lease(bench)
        a.lock_key = state.lock_key = lease.key
        self._take_place(bench, lease)
        assert lease.url is not None
        self.say(f"[labgrid] {bench.name}: acquired place {lease.place} (serial port {lease.url})")
        a.port = lease.url
        return lease

    def _release(self, t: Task, bench: BenchBoard, a: Attempt, held: BoardLock | PlaceLease) -> None:
        a.ended = time.time()
        held.release()
        with self.cond:
            self.usage.append(
                BoardUsage(
                    board=bench.name,
                    lock_key=a.lock_key,
                    pid=os.getpid(),
                    task=t.id,
                    attempt=a.n,
                    start=a.started,
                    end=a.ended,
                )
            )

    def _firmware(self, t: Task, board: Board) -> Firmware:
        """Generate + build both variants once per (model, board type, console, options): the inputs are
        streamed, so jobs with other inputs reuse the same firmware (and what is already flashed), and
        the attempts' jobs flash it as it is (they generate and build nothing)."""
        key = _firmware_key(t, board)
        tool = self.opt.builder or board.builder

        def build() -> Firmware:
            digest = hashlib.sha256(repr(key).encode()).hexdigest()[:10]
            name = safe_component(f"{t.case.name}__{board.name}__{board.console}__{digest}")
            with self._first_build_of(tool):
                self._refuse_if_offline(tool)
                fw = firmware_flow.prepare_firmware(
                    t.case.model,
                    [],
                    board,
                    self.out / "firmware" / name,
                    rec=Recorder(),
                    options=self._job_options(t),
                    features=FirmwareFeatures(embed_inputs=False),
                )
                for exc in fw.failures.values():
                    if isinstance(exc, PlatformUnreachableError):
                        with self.cond:
                            self.offline_tools.setdefault(tool, exc)
                    raise exc
            return fw

        return self.builds.get(key, build)

    @contextlib.contextmanager
    def _first_build_of(self, tool: str) -> Iterator[None]:
        """The first build of a build tool runs alone: builds started together (the prepare phase runs
        them in parallel) would each spend minutes finding that the tool cannot reach its platform.
        Once one build of the tool has ended, ok or not, the others run side by side."""
        with self.cond:
            gate = self.tool_gates.setdefault(tool, threading.Lock())
        with gate:  # tools_tried is read and written under the tool's gate only
            first = tool not in self.tools_tried
            self.tools_tried.add(tool)
            if first:
                yield
                return
        yield

    def _refuse_if_offline(self, tool: str) -> None:
        """Once a build found that ``tool`` cannot reach its platform (offline), no other build of this
        run tries again (each would spend minutes retrying the download): they fail at once, saying why."""
        with self.cond:
            first = self.offline_tools.get(tool)
        if first is not None:
            raise BuildError(
                f"not built: an earlier build of this run found that {tool} cannot reach its platform "
                f"({first.message.splitlines()[0]})",
                hint=first.hint,
            )

    def _reference(self, t: Task) -> None:
        """The host reference the task's jobs read (reference outputs and arena, one child, cached on
        disk), made once per model x inputs x input options: ``runner.prepare`` runs it before the boards
        start, so no attempt waits for it under a board's lock."""
        inputs = list(t.case.inputs)
        self.refs.get(
            _reference_key(t),
            lambda: prepare_host_results(t.case.model, inputs, input_options=t.job.input_options),
        )

    def _shared_work(self) -> list[Callable[[], object]]:
        """One callable per distinct piece of shared work of the tasks that can run on a usable board."""
        work: dict[Hashable, Callable[[], object]] = {}  # by the key its result is kept under
        usable = {
            b.bench.board.name: b.bench.board for b in self.boards.values() if b.status == BoardStatus.OK
        }
        if any(target_class(board).expects_sim for board in usable.values()):  # their loop runs the C codec
            work["codec"] = _codec_library
        for t in self.tasks:
            board = usable.get(t.board_type)
            if board is None or t.job.data is not None:  # dataset jobs build inside their flow
                continue
            work.setdefault(_firmware_key(t, board), functools.partial(self._firmware, t, board))
            if t.job.needs_reference:
                work.setdefault(_reference_key(t), functools.partial(self._reference, t))
        return list(work.values())

    def _prepare_shared(self) -> None:
        """The prepare phase (docs/ci.md "How a run works"), a few pieces at a time. A stop starts no
        more of them; a hard stop stops waiting for the running ones (daemon threads, as the board
        workers)."""
        work = self._shared_work()
        if not work:
            return
        self.say(f"[prepare] {len(work)} shared build(s) and reference(s) before the boards start")
        todo = collections.deque(work)  # its pops are thread-safe

        def worker() -> None:
            while not self.stop.is_set():
                try:
                    job = todo.popleft()
                except IndexError:
                    return
                with contextlib.suppress(EspCheckError):  # memoized: the task that needs it reports it
                    job()

        self._run_threads(
            threading.Thread(target=worker, name=f"prepare-{k}", daemon=True)
            for k in range(min(len(work), 4, os.cpu_count() or 1))
        )

    def _write_attempt(self, t: Task, a: Attempt) -> None:
        if a.dir is None:
            return
        doc = {
            "task": t.id,
            "attempt": a.n,
            **a.where_and_how(),
            "verdict": str(Verdict.from_exit_code(_exit_code(a.exit_code))),
            "variants": {v: o.to_dict() for v, o in a.variants.items()},
            "comparison": report_dict(a.comparison) if a.comparison is not None else None,
        }
        with contextlib.suppress(OSError):
            atomic_write(a.dir / "attempt.json", json.dumps(doc, indent=1, default=str) + "\n")

    # ---- run --------------------------------------------------------------------------------------

    def run(self) -> RunResult:
        """Clear the previous run's reports, run every task on the boards, abort what is left."""
        started = time.time()
        self._prepare_out()
        self._check_ports()
        try:
            self._prepare_shared()
            self._run_threads(
                threading.Thread(target=self.worker, args=(s,), name=f"board-{s.bench.name}", daemon=True)
                for s in self.boards.values()
            )
        finally:  # also on a crash or a second Ctrl-C: no labgrid place stays acquired by us
            if self.hard_stop.is_set():  # abandoned attempts: their children (host reference, builds) too
                children.stop_all()
            self.release_places()
        interrupted = self._abort_unfinished()
        codes = [ExitCode(t.exit_code) for t in self.tasks if t.exit_code is not None]
        return RunResult(
            plan=self.plan,
            inventory=self.inv,
            out_dir=self.out,
            tasks=list(self.tasks),
            boards=list(self.boards.values()),
            usage=sorted(self.usage, key=lambda u: u["start"] or 0),
            events=list(self.events),
            started=started,
            finished=time.time(),
            interrupted=interrupted,
            exit_code=combine_exit_codes(codes) if codes else ExitCode.INFRASTRUCTURE,
            moved_aside=self.moved_aside,
        )

    def release_places(self) -> None:
        """Release every labgrid place this run still holds or is reserving."""
        with self.cond:
            leases = list(self.leases)
        for lease in leases:
            if lease.is_locked or lease.is_releasing:
                self.say(f"[labgrid] releasing place {lease.place}")
            lease.release()  # waits for a release a board worker has in flight: the process may exit next

    def _prepare_out(self) -> None:
        """No verdict of an earlier run into the same directory may survive this one."""
        self.out.mkdir(parents=True, exist_ok=True)
        self.moved_aside, said = move_aside(self.out, self.opt.report_paths)
        for line in said:
            self.say(f"[out] previous run's reports: {line}")

    def _check_ports(self) -> None:
        """Before any build: a board whose port does not exist now takes no work (its tasks go to the
        other boards of its type, or end at once with "no usable board left")."""
        for state in self.boards.values():
            if state.bench.place:  # a labgrid place has a port only once acquired
                continue
            try:
                check_present(state.bench.resolve())
            except EspCheckError as exc:
                with self.cond:
                    state.status = BoardStatus.QUARANTINED
                    state.reason = f"port missing when the run started: {exc.message}"
                self.event(EventKind.QUARANTINE, state.reason, board=state.bench.name)
        with self.cond:
            self._orphan_check()

    def _run_threads(self, threads: Iterable[threading.Thread]) -> None:
        """Start every thread, then wait for each; a hard stop ends the wait (they are daemons)."""
        started = list(threads)
        for th in started:
            th.start()
        for th in started:
            while th.is_alive() and not self.hard_stop.is_set():
                th.join(timeout=0.2)

    def _abort_unfinished(self) -> bool:
        """Tasks without a verdict when the workers stop are aborted; True when a signal stopped us."""
        with self.cond:
            for t in self.tasks:
                if t.state in (TaskState.PENDING, TaskState.RUNNING):
                    self._abort(t, abort_reason(t))
            return self.stop.is_set() or self.hard_stop.is_set()


def _firmware_key(t: Task, board: Board) -> Hashable:
    """What a task's firmware is built from (:meth:`Runner._firmware`: built once per key)."""
    return (str(t.case.model), board.name, board.console, t.job.arena_kb, t.job.input_options)


def _reference_key(t: Task) -> Hashable:
    """What a task's host reference is made from (:meth:`Runner._reference`: made once per key)."""
    return (str(t.case.model), tuple(map(str, t.case.inputs)), t.job.input_options)


def _codec_library() -> None:
    """The C library every simulated board's firmware loop runs (compiled once per source hash)."""
    if find_c_compiler() is not None:
        build_c_library()


def _refuse_untested(plan: Path, job: Job, board: Board) -> None:
    """A model in which ESP-NN accelerates no op on the board's chip proves nothing about ESP-NN (both
    builds run the same kernels): refused before anything runs, as flash-and-compare refuses it, unless
    the job says ``allow_untested = true``."""
    if job.allow_untested:
        return
    for case in job.cases:
        accel = espnn_model_acceleration(load_model(case.model), board.chip)
        if not any(a.accelerated for a in accel):
            raise PlanError(
                f"plan {plan}: job {job.name!r}: ESP-NN accelerates none of the {len(accel)} ops of model "
                f"{case.model} on {board.chip} (board type {board.name}): both variants would run the same "
                "TFLM kernels, so a match would say nothing about ESP-NN",
                hint="esp-check inspect MODEL lists what ESP-NN accelerates per chip; set "
                "allow_untested = true in the job to run it anyway",
            )


def run_plan(plan: Plan, inventory: Inventory, options: RunOptions) -> RunResult:
    """Run every task of ``plan`` on ``inventory`` and write the reports into ``options.out_dir``.

    Raises PlanError before anything runs when a job's board type has no board in the inventory.
    """
    runner = Runner(plan, inventory, options)
    result = runner.run()
    write_reports(result)
    return result
