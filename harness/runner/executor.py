"""Run a plan over a bench: one worker thread per board, board locks, retries, quarantine.

Scheduling: every (job, model, board type) is a *task* (``placement = "each"``: one task per
inventory board of the type). A worker takes a task its board can run, gets the firmware (generated
and built once per model x inputs x board type x console, shared by every board that needs it; the
content-addressed build cache does the rest), takes the board's lock, flashes and captures both
variants (a board that already holds an image is not re-written: esptool's MD5 check), releases the
lock, and compares on the host.

Outcomes of one attempt (the exit-code classes of harness.errors):

- 0 / 1 (match / mismatch): final. A mismatch is never retried.
- 4 (firmware fault): a finding. Re-run once to confirm; never counted against the board.
- 3 (infrastructure: no sync, disconnect, timeout, corrupted capture, port gone): retried with
  exponential backoff up to the job's ``retries``, preferably on another board of the type. A board
  with ``quarantine_after`` consecutive infrastructure failures runs its power-cycle command once
  (if it has one) and is quarantined on the next failure: its tasks move to other boards of the type
  or are reported as errors.
- 2 (usage, e.g. the firmware reports the wrong ESP-NN mode): final.

A stop request (Ctrl-C / SIGTERM via ``RunOptions.stop``) lets running attempts finish, marks the
rest aborted and still writes every report.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.device.locks import BoardLock, lock_key
from harness.errors import (
    BoardBusyError,
    EspCheckError,
    ExitCode,
    PlanError,
    combine_exit_codes,
)
from harness.firmware.native.project import NativeOptions
from harness.runner.inventory import BenchBoard, Inventory
from harness.runner.plan import ModelCase, Plan
from harness.runner.results import VERDICTS, Attempt, BoardState, RunResult, Task, VariantOutcome

VARIANTS = ("optimized", "ansi")

# (board, url, variant, attempt number, task id) -> URL to open instead, or None. A seam for fault
# injection on simulated benches (tests, bench/bench_soak.py): the board itself is the only thing faked.
PortOverride = Callable[[BenchBoard, str, str, int, str], "str | None"]


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




def _safe(text: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9_.@-]+", "_", text)[:100]


class _Memo:
    """Compute-once values shared by threads (firmware builds, host references), errors included."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._locks: dict[Any, threading.Lock] = {}
        self._values: dict[Any, tuple[bool, Any]] = {}

    def get(self, key: Any, fn: Callable[[], Any]) -> Any:
        with self._lock:
            lk = self._locks.setdefault(key, threading.Lock())
        with lk:
            if key not in self._values:
                try:
                    self._values[key] = (True, fn())
                except EspCheckError as exc:
                    self._values[key] = (False, exc)
            ok, value = self._values[key]
        if not ok:
            raise value
        return value


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
        self.usage: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.builds = _Memo()
        self.refs = _Memo()
        self.ref_lock = threading.Lock()  # the host reference runs one model at a time
        self.lock_timeout = (
            options.lock_timeout_s if options.lock_timeout_s is not None else plan.run.lock_timeout_s
        )
        self.backoff = options.backoff_s if options.backoff_s is not None else plan.run.backoff_s
        self.quarantine_after = options.quarantine_after or plan.run.quarantine_after
        self.tasks = self._make_tasks()

    # ---- setup ------------------------------------------------------------------------------------

    def _make_tasks(self) -> list[Task]:
        from harness.firmware.boards import load_board

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
                for case in job.cases:
                    for pinned in targets:
                        where = canon + (f"@{pinned}" if pinned else "")
                        tid = f"{job.name}/{case.name}/{where}"
                        tasks.append(
                            Task(
                                id=tid,
                                index=len(tasks),
                                job=job,
                                case=case,
                                board_type=canon,
                                pinned=pinned,
                                dir=self.out / "jobs" / _safe(job.name) / _safe(case.name) / _safe(where),
                            )
                        )
        return tasks

    def say(self, msg: str) -> None:
        if self.opt.progress is not None:
            self.opt.progress(msg)

    def event(self, kind: str, message: str, *, board: str | None = None, task: str | None = None) -> None:
        with self.cond:
            self.events.append(
                {"t": time.time(), "kind": kind, "board": board, "task": task, "message": message}
            )
        self.say(f"[{kind}] " + (f"{board}: " if board else "") + (f"{task}: " if task else "") + message)

    # ---- scheduling -------------------------------------------------------------------------------

    def _available(self, name: str) -> bool:
        return self.boards[name].status == "ok"

    def _can_run(self, t: Task, st: BoardState) -> bool:
        if t.board_type != st.bench.board.name or (t.pinned is not None and t.pinned != st.bench.name):
            return False
        if st.bench.name in t.avoid:
            # go back to a board that failed this task only if no other usable board of the type is left
            others = [
                s
                for s in self.boards.values()
                if s.bench.board.name == t.board_type
                and s.status == "ok"
                and s.bench.name not in t.avoid
                and (t.pinned is None or t.pinned == s.bench.name)
            ]
            return not others
        return True

    def _orphan_check(self) -> None:
        """Pending tasks that no usable board can take any more become errors (caller holds cond)."""
        for t in self.tasks:
            if t.state != "pending":
                continue
            usable = [
                s
                for s in self.boards.values()
                if s.status in ("ok", "power-cycling")
                and s.bench.board.name == t.board_type
                and (t.pinned is None or t.pinned == s.bench.name)
            ]
            if not usable:
                gone = [
                    f"{s.bench.name} ({s.status}: {s.reason})"
                    for s in self.boards.values()
                    if s.bench.board.name == t.board_type and (t.pinned is None or t.pinned == s.bench.name)
                ]
                self._finish(
                    t,
                    ExitCode.INFRASTRUCTURE,
                    "no usable board left: " + "; ".join(gone),
                )

    def _next_for(self, st: BoardState) -> Task | None:
        with self.cond:
            while True:
                if self.stop.is_set() or st.status != "ok":
                    return None
                now = time.monotonic()
                mine = [t for t in self.tasks if t.state == "pending" and self._can_run(t, st)]
                ready = [t for t in mine if t.not_before <= now]
                if ready:
                    t = ready[0]
                    t.state = "running"
                    return t
                waiting_for_requeue = any(
                    t.state == "running" and t.board_type == st.bench.board.name for t in self.tasks
                )
                if mine:
                    self.cond.wait(timeout=max(0.01, min(t.not_before for t in mine) - now))
                elif waiting_for_requeue or any(
                    t.state == "pending" and t.board_type == st.bench.board.name for t in self.tasks
                ):
                    self.cond.wait(timeout=0.5)
                else:
                    return None

    def _finish(self, t: Task, code: ExitCode, reason: str, decisive: Attempt | None = None) -> None:
        t.state = "done"
        t.exit_code = int(code)
        t.verdict = VERDICTS.get(code, "internal_error")
        t.reason = reason
        if decisive is not None:
            t.decisive = decisive
        self.cond.notify_all()

    def _after_attempt(self, t: Task, st: BoardState, a: Attempt) -> None:
        """Decide retry / confirm / final, and the board's quarantine (under cond)."""
        code = ExitCode(a.exit_code if a.exit_code is not None else ExitCode.INTERNAL)
        name = st.bench.name
        if a.board_fault:
            st.consecutive_infra += 1
        elif code != ExitCode.INFRASTRUCTURE:
            st.consecutive_infra = 0  # the board talked: it works
        if code == ExitCode.INFRASTRUCTURE and not self.stop.is_set():
            t.infra_failures += 1
            t.avoid.add(name)
            if t.infra_failures <= t.job.retries:
                delay = min(self.backoff * (2 ** (t.infra_failures - 1)), self.plan.run.backoff_max_s)
                t.state = "pending"
                t.not_before = time.monotonic() + delay
                self.events.append(
                    {
                        "t": time.time(),
                        "kind": "retry",
                        "board": name,
                        "task": t.id,
                        "message": f"infrastructure failure ({a.reason}); "
                        f"retry {t.infra_failures}/{t.job.retries} in {delay:.1f} s",
                    }
                )
                self.say(
                    f"[retry] {t.id} on {name}: {a.reason}; "
                    f"retry {t.infra_failures}/{t.job.retries} in {delay:.1f} s"
                )
            else:
                prev_fault = next((x for x in t.attempts if x.exit_code == ExitCode.FIRMWARE_FAULT), None)
                if prev_fault is not None:  # a fault was seen; the confirmation run hit the infrastructure
                    self._finish(
                        t,
                        ExitCode.FIRMWARE_FAULT,
                        f"firmware fault (confirmation re-run failed: {a.reason})",
                        prev_fault,
                    )
                else:
                    self._finish(
                        t,
                        ExitCode.INFRASTRUCTURE,
                        f"gave up after {t.infra_failures} infrastructure failure(s): {a.reason}",
                        a,
                    )
        elif code == ExitCode.INFRASTRUCTURE:
            prev_fault = next((x for x in t.attempts if x.exit_code == ExitCode.FIRMWARE_FAULT), None)
            if prev_fault is not None:  # the finding stands even when its confirmation cannot run
                self._finish(
                    t,
                    ExitCode.FIRMWARE_FAULT,
                    f"firmware fault (not confirmed: run stopped): {prev_fault.reason}",
                    prev_fault,
                )
            else:
                t.state = "pending"  # not retried: the run is stopping; reported as aborted
        elif code == ExitCode.FIRMWARE_FAULT:
            t.fault_attempts += 1
            if t.fault_attempts == 1 and not self.stop.is_set():
                t.state = "pending"
                t.not_before = 0.0
                self.events.append(
                    {
                        "t": time.time(),
                        "kind": "confirm",
                        "board": name,
                        "task": t.id,
                        "message": f"firmware fault ({a.reason}); re-running once to confirm",
                    }
                )
                self.say(f"[confirm] {t.id} on {name}: firmware fault; re-running once to confirm")
            else:
                confirmed = t.fault_attempts >= 2
                self._finish(
                    t,
                    ExitCode.FIRMWARE_FAULT,
                    f"firmware fault{' (confirmed by a re-run)' if confirmed else ''}: {a.reason}",
                    a,
                )
        elif t.fault_attempts:
            first = next(x for x in t.attempts if x.exit_code == ExitCode.FIRMWARE_FAULT)
            self._finish(
                t,
                ExitCode.FIRMWARE_FAULT,
                f"firmware fault not reproduced by the re-run (which gave {VERDICTS.get(code, code)}): "
                f"intermittent crash: {first.reason}",
                first,
            )
        else:
            self._finish(t, code, a.reason, a)
        # quarantine
        if a.board_fault and st.consecutive_infra >= self.quarantine_after and st.status == "ok":
            if st.bench.power_cycle and not st.power_cycled:
                st.power_cycled = True
                st.status = "power-cycling"
            else:
                st.status = "quarantined"
                st.reason = f"{st.consecutive_infra} consecutive infrastructure failures (last: {a.reason})"
                self.events.append(
                    {
                        "t": time.time(),
                        "kind": "quarantine",
                        "board": name,
                        "task": None,
                        "message": st.reason,
                    }
                )
                self.say(f"[quarantine] {name}: {st.reason}")
        self._orphan_check()  # a requeued task whose boards are all gone ends here, not as "aborted"
        self.cond.notify_all()

    # ---- workers ----------------------------------------------------------------------------------

    def worker(self, st: BoardState) -> None:
        while True:
            t = self._next_for(st)
            if t is None:
                return
            n = len(t.attempts) + 1
            a = Attempt(n=n, board=st.bench.name, dir=t.dir / f"attempt-{n}-{_safe(st.bench.name)}")
            t.attempts.append(a)
            st.attempts += 1
            try:
                self._attempt(t, st, a)
            except Exception as exc:  # a bug must not kill the worker or lose the task's record
                a.exit_code = int(ExitCode.INTERNAL)
                a.reason = f"internal error: {type(exc).__name__}: {exc}"
                a.board_fault = False
                with contextlib.suppress(Exception):
                    assert a.dir is not None
                    a.dir.mkdir(parents=True, exist_ok=True)
                    (a.dir / "traceback.txt").write_text(traceback.format_exc(), encoding="utf-8")
            self._write_attempt(t, a)
            with self.cond:
                self._after_attempt(t, st, a)
                cycle = st.status == "power-cycling"
            if cycle:
                ok, out = st.bench.run_power_cycle()
                self.event("power-cycle", f"{'ok' if ok else 'FAILED'}: {out}", board=st.bench.name)
                with self.cond:
                    st.status = "ok"
                    st.consecutive_infra = self.quarantine_after - 1  # one more failure quarantines it
                    self.cond.notify_all()

    def _firmware(self, t: Task, board: Any) -> dict[str, Any]:
        """Generate + build both variants once per (model, inputs, board type, console, options)."""
        key = (
            str(t.case.model),
            tuple(map(str, t.case.inputs)),
            board.name,
            board.console,
            t.job.arena_kb,
            tuple(sorted(t.job.input_options.items())),
        )

        def make() -> dict[str, Any]:
            from harness.flows.firmware import prepare_firmware
            from harness.flows.records import Recorder
            from harness.model.inputs import InputOptions

            digest = hashlib.sha256(repr(key).encode()).hexdigest()[:10]
            fw_dir = self.out / "firmware" / _safe(f"{t.case.name}__{board.name}__{board.console}__{digest}")
            fw = prepare_firmware(
                t.case.model,
                list(t.case.inputs),
                board,
                fw_dir,
                rec=Recorder(),
                input_options=InputOptions(**t.job.input_options) if t.job.input_options else None,
                arena_kb=t.job.arena_kb,
                builder=self.opt.builder,
                cache_dir=self.opt.cache_dir,
                timeout=t.job.timeouts.build,
                native=self.opt.native,
            )
            for exc in fw.failures.values():
                raise exc
            return dict(fw.builds)

        return dict(self.builds.get(key, make))

    def _reference(self, case: ModelCase) -> Any:
        def make() -> Any:
            from harness.analysis.compare import reference_source

            with self.ref_lock:
                return reference_source(case.model, list(case.inputs))

        return self.refs.get((str(case.model), tuple(map(str, case.inputs))), make)

    def _attempt(self, t: Task, st: BoardState, a: Attempt) -> None:
        from harness.flows.capture import flash_and_capture
        from harness.flows.records import StageTimeouts

        bench = st.bench
        assert a.dir is not None
        a.dir.mkdir(parents=True, exist_ok=True)
        self.say(f"[start] {t.id} attempt {a.n} on {bench.name}")
        # 1. firmware (host side: a failure here is not the board's fault and is not retried)
        try:
            builds = self._firmware(t, bench.board)
        except EspCheckError as exc:
            a.exit_code = int(exc.exit_code)
            a.reason = f"firmware build: {exc.message}"
            a.board_fault = False
            if exc.exit_code == ExitCode.INFRASTRUCTURE:
                a.exit_code = int(ExitCode.INFRASTRUCTURE)
                t.infra_failures = t.job.retries  # a failed build is not a flaky link: no retry
            return
        t.builds = {
            v: {
                "firmware_sha256": b.firmware_sha256,
                "cache_hit": b.cache_hit,
                "project_dir": str(b.project_dir),
            }
            for v, b in builds.items()
        }
        # 2. the board: resolve, lock, flash + capture each variant
        try:
            ps = bench.resolve()
        except EspCheckError as exc:
            a.exit_code = int(exc.exit_code)
            a.reason = f"port: {exc.message}"
            a.board_fault = exc.exit_code == ExitCode.INFRASTRUCTURE
            return
        a.port = ps.url
        key = lock_key(ps)
        a.lock_key = key
        st.lock_key = key
        lk = BoardLock(key, self.opt.lock_dir, owner=self.opt.owner or f"esp-check run {self.plan.path.name}")
        try:
            lk.acquire(
                self.lock_timeout,
                on_wait=lambda m: self.say(f"[lock] {bench.name}: {m}"),
                cancel=self.stop,  # a stop request ends the wait: no new work on any board
            )
        except BoardBusyError as exc:
            a.exit_code = int(ExitCode.INFRASTRUCTURE)
            a.reason = exc.message
            a.board_fault = False
            with self.cond:
                if not self.stop.is_set():
                    st.status = "busy"
                    st.reason = exc.message
                    self._orphan_check()
            return
        a.lock_wait_s = lk.waited_s
        a.started = time.time()
        limits = StageTimeouts(
            build=t.job.timeouts.build,
            capture_total=t.job.timeouts.capture_total,
            capture_silence=t.job.timeouts.capture_silence,
        )
        runs: dict[str, Any] = {}
        try:
            for v in VARIANTS:
                url = ps.url
                if self.opt.port_override is not None:
                    url = self.opt.port_override(bench, ps.url, v, a.n, t.id) or ps.url
                run, stages = flash_and_capture(
                    builds[v], bench.board, url, a.dir, variant=v, timeouts=limits
                )
                runs[v] = run
                a.variants[v] = VariantOutcome(
                    variant=v,
                    exit_code=int(run.exit_code) if run.exit_code is not None else None,
                    serial_log=str(run.serial_log) if run.serial_log else None,
                    firmware_sha256=run.firmware_sha256,
                    build_cache_hit=run.build_cache_hit,
                    flash=run.flash,
                    nn_mode=run.nn_mode,
                    capture_valid=run.capture_valid,
                    problems=list(run.problems),
                    findings=list(run.findings),
                    stages=[{k: v for k, v in s.to_dict().items() if k != "variant"} for s in stages],
                )
                if run.exit_code == ExitCode.INFRASTRUCTURE:
                    break  # the link is bad: do not spend the other variant on it
        finally:
            a.ended = time.time()
            lk.release()
            with self.cond:
                self.usage.append(
                    {
                        "board": bench.name,
                        "lock_key": key,
                        "pid": os.getpid(),
                        "task": t.id,
                        "attempt": a.n,
                        "start": a.started,
                        "end": a.ended,
                    }
                )
        # 3. compare on the host
        self._judge(t, a, runs)

    def _judge(self, t: Task, a: Attempt, runs: dict[str, Any]) -> None:
        from harness.analysis.compare import compare_sources
        from harness.model.loader import load_model

        codes: list[ExitCode] = []
        reasons: list[str] = []
        for v in VARIANTS:
            r = runs.get(v)
            if r is None:
                reasons.append(f"{v}: not run (previous variant lost the link)")
                codes.append(ExitCode.INFRASTRUCTURE)
                continue
            if r.exit_code is not None:
                codes.append(ExitCode(r.exit_code))
                failed = [s for s in a.variants[v].stages if s["status"] == "failed"]
                why = failed[-1]["detail"].splitlines()[0] if failed else "failed"
                reasons.append(f"{v}: {why}")
        a.board_fault = bool(codes) and combine_exit_codes(codes) == ExitCode.INFRASTRUCTURE
        ref = None
        ref_problem = None
        if t.job.needs_reference:
            try:
                ref = self._reference(t.case)
            except EspCheckError as exc:
                ref_problem = f"host reference: {exc.message}"
                codes.append(exc.exit_code)
                reasons.append(ref_problem)
        info = load_model(t.case.model)
        quant = [(o.scale, o.zero_point, o.dtype) if o.scale else (None, None, o.dtype) for o in info.outputs]
        src = {v: runs[v].source for v in VARIANTS if v in runs and runs[v].source is not None}
        result = None
        try:
            if len(src) == 2:
                result = compare_sources(
                    src["optimized"],
                    src["ansi"],
                    ref,
                    tolerance_lsb=t.job.tolerance_lsb,
                    ref_tolerance_lsb=t.job.ref_tolerance_lsb,
                    output_quant=quant,
                )
            elif len(src) == 1 and ref is not None:
                result = compare_sources(
                    next(iter(src.values())),
                    ref,
                    None,
                    tolerance_lsb=t.job.ref_tolerance_lsb,
                    output_quant=quant,
                )
        except EspCheckError as exc:
            codes.append(exc.exit_code)
            reasons.append(f"compare: {exc.message}")
        a.comparison = result
        pairs = set(t.job.pairs)
        mism = []
        if result is not None:
            for c in result.comparisons:
                if (c.a, c.b) in pairs and not c.match:
                    mism.append(
                        f"{c.a} vs {c.b} input {c.run} output {c.output}: {c.mismatched}/{c.count} "
                        f"differ (max {c.max_diff_lsb} LSB)"
                    )
            for f in result.faults:
                codes.append(f.exit_code)
                reasons.append(f"{f.source}: ERROR stage={f.stage} code={f.code} {f.msg}")
        if mism:
            codes.append(ExitCode.MISMATCH)
            reasons = mism[:3] + reasons
        if not codes:
            codes.append(ExitCode.MATCH)
        code = combine_exit_codes(codes)
        a.exit_code = int(code)
        a.reason = "; ".join(dict.fromkeys(reasons)) or ("all compared outputs match" if code == 0 else "")
        a.testcases = _testcases(t, a, runs, result, ref_problem)

    def _write_attempt(self, t: Task, a: Attempt) -> None:
        if a.dir is None:
            return
        from harness.analysis.report import report_dict

        doc = {
            "task": t.id,
            "attempt": a.n,
            "board": a.board,
            "port": a.port,
            "lock_key": a.lock_key,
            "started": a.started,
            "ended": a.ended,
            "lock_wait_s": round(a.lock_wait_s, 3),
            "exit_code": a.exit_code,
            "reason": a.reason,
            "board_fault": a.board_fault,
            "variants": {v: dataclasses.asdict(o) for v, o in a.variants.items()},
            "comparison": report_dict(a.comparison) if a.comparison is not None else None,
        }
        with contextlib.suppress(OSError):
            a.dir.mkdir(parents=True, exist_ok=True)
            (a.dir / "attempt.json").write_text(
                json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8"
            )

    # ---- run --------------------------------------------------------------------------------------

    def run(self) -> RunResult:
        started = time.time()
        self.out.mkdir(parents=True, exist_ok=True)
        threads = []
        for st in self.boards.values():
            th = threading.Thread(target=self.worker, args=(st,), name=f"board-{st.bench.name}", daemon=True)
            th.start()
            threads.append(th)
        for th in threads:
            while th.is_alive():
                th.join(timeout=0.2)
                if self.hard_stop.is_set():
                    break
            if self.hard_stop.is_set():
                break
        with self.cond:
            interrupted = self.stop.is_set() or self.hard_stop.is_set()
            for t in self.tasks:
                if t.state in ("pending", "running"):
                    was = t.state
                    t.state = "aborted"
                    t.exit_code = int(ExitCode.INFRASTRUCTURE)
                    t.verdict = "aborted"
                    if was == "running":
                        t.reason = "run stopped while this task was running"
                    elif t.attempts:
                        t.reason = f"run stopped before a retry (last attempt: {t.attempts[-1].reason})"
                    else:
                        t.reason = "run stopped before this task ran"
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
        )


def _testcases(
    t: Task, a: Attempt, runs: dict[str, Any], result: Any | None, ref_problem: str | None
) -> list[dict[str, Any]]:
    """One entry per input x requested comparison: passed / failure (mismatch, fault) / error."""
    out: list[dict[str, Any]] = []
    by: dict[tuple[str, str, int], list[Any]] = {}
    faults: dict[str, list[Any]] = {}
    if result is not None:
        for c in result.comparisons:
            by.setdefault((c.a, c.b, c.run), []).append(c)
        for f in result.faults:
            faults.setdefault(f.source, []).append(f)

    def side_problem(label: str, k: int) -> tuple[str, str, str] | None:
        if label == "reference":
            return ("error", "infrastructure", ref_problem) if ref_problem else None
        for f in faults.get(label, []):
            if f.run is None or f.run == k:
                return ("failure", "firmware_fault", f"{label}: ERROR stage={f.stage} code={f.code} {f.msg}")
        r = runs.get(label)
        if r is None:
            return ("error", "infrastructure", f"{label} not run: the board link failed before it")
        if r.exit_code is not None and r.source is None:
            v = a.variants[label]
            failed = [s for s in v.stages if s["status"] == "failed"]
            detail = failed[-1]["detail"] if failed else "failed"
            code = int(r.exit_code)
            if code == ExitCode.FIRMWARE_FAULT:
                return ("failure", "firmware_fault", f"{label}: {detail}")
            kind = "usage" if code == ExitCode.USAGE else "infrastructure"
            return ("error", kind, f"{label}: {detail}")
        return None

    for k, path in enumerate(t.case.inputs):
        for pa, pb in t.job.pairs:
            tc: dict[str, Any] = {"input_index": k, "input": str(path), "comparison": f"{pa}-vs-{pb}"}
            comps = by.get((pa, pb, k), [])
            problems = [p for p in (side_problem(pa, k), side_problem(pb, k)) if p is not None]
            bad = [c for c in comps if not c.match]
            if bad:
                c = bad[0]
                tc.update(
                    status="failure",
                    type="mismatch",
                    message=f"{c.mismatched} of {c.count} elements of output {c.output} differ "
                    f"beyond {c.tolerance_lsb:g} LSB (max {c.max_diff_lsb} LSB, "
                    f"argmax {c.argmax_a} vs {c.argmax_b})",
                )
            elif any(p[0] == "failure" for p in problems):
                p = next(p for p in problems if p[0] == "failure")
                tc.update(status="failure", type=p[1], message=p[2])
            elif problems:
                tc.update(status="error", type=problems[0][1], message=problems[0][2])
            elif comps:
                tc.update(
                    status="passed",
                    type="match",
                    message=f"{len(comps)} output(s) within {comps[0].tolerance_lsb:g} LSB",
                )
            else:
                tc.update(status="error", type="infrastructure", message=a.reason or "nothing was compared")
            out.append(tc)
    return out


def run_plan(plan: Plan, inventory: Inventory, options: RunOptions) -> RunResult:
    """Run every task of ``plan`` on ``inventory`` and write the reports into ``options.out_dir``.

    Raises PlanError before anything runs when a job's board type has no board in the inventory.
    """
    from harness.runner.reports import write_reports

    runner = Runner(plan, inventory, options)
    result = runner.run()
    write_reports(result)
    return result
