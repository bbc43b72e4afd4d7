"""``esp-check hybrid``: from a finding to a fix -- ESP-NN optimized everywhere except the ops that break.

Read as the named steps of docs/hybrid.md "How it works": baseline, choose, verify, deliver.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from harness.analysis.compare import CompareResult, Source, compare_sources, output_quant
from harness.analysis.hybrid import (
    NOISE_BAND,
    Audit,
    Bisection,
    CostReport,
    InvokeCost,
    cost_report,
    hybrid_evidence,
    invoke_cost,
)
from harness.analysis.tap import Divergence, audit_captures, device_taps, first_divergence, op_cycles
from harness.errors import EspCheckError, ExitCode, UsageError, combine_exit_codes, stopped_by
from harness.firmware.boards import Board, load_board
from harness.firmware.build import build_project
from harness.firmware.generate import FirmwareFeatures, generate_projects
from harness.firmware.hybrid_context import (
    HEADER,
    SOURCE,
    hybrid_firmware_context,
    readme_snippet,
    registration_lines,
)
from harness.flows.capture import flash_and_capture
from harness.flows.flash_and_compare import check_report_paths, prepare_out_dir, run_job
from harness.flows.hybrid_report import write_hybrid_outputs
from harness.flows.job import JobOptions, JobSpec
from harness.flows.records import FlashAndCompareResult, ProgressFn, Recorder, VariantRun
from harness.flows.tap_run import TapRunRequest, dump_run
from harness.flows.targets import BoardLockCM, Target, open_target
from harness.jsontypes import JSONValue
from harness.model.hybrid_ops import ansi_path_applies, candidate_ops, format_ops, select_ansi_ops, switchable
from harness.model.loader import ModelInfo, load_model
from harness.model.opdata import resolver_methods
from harness.protocol.capture import Capture


@dataclass(frozen=True)
class HybridOptions:
    """How the ops are chosen: given (``ansi_ops``/``ansi_kinds``), from the taps, or by ``bisect``."""

    ansi_ops: tuple[int, ...] = ()
    ansi_kinds: tuple[str, ...] = ()
    bisect: bool = False
    max_rounds: int = 4  # tap iterations / culprits a bisection may find
    noise_band: float = NOISE_BAND

    @property
    def manual(self) -> bool:
        return bool(self.ansi_ops or self.ansi_kinds)


@dataclass
class HybridRun:
    """One hybrid firmware run: which ops ran ANSI C, and whether the run was good (bit-exact, clean)."""

    label: str
    ansi_ops: list[int]
    tapped: bool
    outcome: str = "error"  # good | bad | error
    why: str = ""
    variant: VariantRun | None = None
    capture: Capture | None = None
    comparison: CompareResult | None = None
    divergence: Divergence | None = None
    exit_code: ExitCode | None = None
    project_dir: Path | None = None

    @property
    def compared_as(self) -> str:
        """Its name in its comparison and divergence texts: with no op on ANSI C (confirm) it is the plain
        optimized build."""
        return "hybrid" if self.ansi_ops else "optimized"

    def to_dict(self) -> dict[str, object]:
        h = [r.hybrid for r in self.capture.runs] if self.capture is not None else []
        return {
            "label": self.label,
            "ansi_ops": self.ansi_ops,
            "tapped": self.tapped,
            "outcome": self.outcome,
            "why": self.why,
            "exit_code": None if self.exit_code is None else int(self.exit_code),
            "serial_log": str(self.variant.serial_log) if self.variant and self.variant.serial_log else None,
            "project_dir": str(self.project_dir) if self.project_dir else None,
            "hybrid_records": h,
            "invoke_us": [r.invoke_us for r in self.capture.runs] if self.capture is not None else [],
            "next_divergence": dataclasses.asdict(self.divergence) if self.divergence is not None else None,
        }


class Culprit(TypedDict):
    """An op that runs ANSI C in the hybrid, and what found it."""

    op: int
    kind: str
    found_by: str


class Dropin(TypedDict):
    """The verified firmware's drop-in files and the resolver lines that register them."""

    dir: str
    files: list[str]
    registration: list[str]
    from_project: str


@dataclass
class HybridResult:
    """Everything ``esp-check hybrid`` found and made; report.json holds the same (docs/hybrid.md)."""

    out_dir: Path
    report_path: Path
    board: str = ""
    port: str = ""
    simulated: bool = False
    mode: str = "taps"  # taps | manual | bisect
    ansi_ops: list[int] = field(default_factory=list)
    offered: bool = False
    message: str = ""
    exit_code: ExitCode = ExitCode.INFRASTRUCTURE
    baseline: FlashAndCompareResult | None = None
    culprits: list[Culprit] = field(default_factory=list)
    runs: list[HybridRun] = field(default_factory=list)
    bisection: Bisection | None = None
    verification: HybridRun | None = None
    cost: CostReport | InvokeCost | None = None  # analysis.hybrid.cost_report / invoke_cost
    audit: Audit | None = None  # the baseline's ESP-NN speedup audit
    dropin: Dropin | None = None
    repro: list[dict[str, JSONValue]] = field(default_factory=list)  # one-op reproducers (flows.repro)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class _State:
    """One hybrid command while its steps run: its job (model, inputs, board, options) and findings."""

    spec: JobSpec
    info: ModelInfo
    board: Board
    res: HybridResult
    opts: HybridOptions
    rec: Recorder
    codes: list[ExitCode] = field(default_factory=list)
    ansi_source: Source | None = None
    ref_source: Source | None = None
    target: Target | None = None  # the baseline's (the hybrid runs go to the same board)
    base_caps: dict[str, Capture] = field(default_factory=dict)  # the baseline's captures, parsed once


def hybrid(
    model: str | Path,
    inputs: Sequence[str | Path],
    *,
    board: str | Path = "sim",
    port: str | None = None,
    out_dir: str | Path = "esp-check-hybrid",
    options: HybridOptions | None = None,
    job: JobOptions | None = None,
    progress: ProgressFn | None = None,
) -> HybridResult:
    """Find the ops to run on ANSI C, verify the hybrid firmware bit for bit, hand over its files.

    ``job``: how each run is built and judged, as for flash-and-compare (its ``html``/``bundle`` are this
    command's reports). Usage errors (bad model, input, board, an op the wrapper cannot switch) raise
    before any hardware is touched; everything after is recorded and decides the exit code (0: a verified
    hybrid is offered, or nothing needed fixing).
    """
    t0 = time.monotonic()
    opts = options or HybridOptions()
    out = prepare_out_dir(out_dir)
    check_report_paths(job or JobOptions())
    info = load_model(model)
    if opts.manual:
        select_ansi_ops(info, opts.ansi_ops, opts.ansi_kinds)  # UsageError before anything runs
    if not inputs:
        raise UsageError("hybrid needs at least one --input", hint="pass --input FILE (repeatable)")
    res = HybridResult(out, out / "report.json")
    res.mode = "manual" if opts.manual else ("bisect" if opts.bisect else "taps")
    spec = JobSpec.of(model, inputs, board=board, port=port, out_dir=out, options=job)
    state = _State(spec, info, load_board(board), res, opts, Recorder(progress))
    try:
        if _baseline(state):
            with _board_lock(state):
                _choose(state)
                _verify(state)
                if res.offered:
                    _deliver(state)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (harness.cli turns it into Terminated)
        code, how = stopped_by(exc)
        res.errors.append(f"{how}: the run did not finish")
        state.codes.append(code)
        raise
    finally:
        res.seconds = time.monotonic() - t0
        _finish(state)
    return res


def _board_lock(state: _State) -> BoardLockCM:
    """The board's lock for the hybrid runs (the baseline took and released its own); none for a
    board made for this command alone, or with ``lock=False``."""
    assert state.target is not None
    lock = state.target.job_lock(state.spec.options, "esp-check hybrid", state.rec)
    return lock or contextlib.nullcontext()


# ---- 1. baseline ----------------------------------------------------------------------------------


def _baseline(state: _State) -> bool:
    """flash-and-compare both builds; False when there is nothing to do or nothing to verify against."""
    res = state.res
    baseline = state.spec.options.replace(tap=not state.opts.bisect, html=None, bundle=None, junit=None)
    # the hybrid runs go to the board the baseline ran on (a fresh simulated board: the same one)
    state.target = open_target(state.board, state.spec.port)
    spec = dataclasses.replace(
        state.spec, out_dir=state.res.out_dir / "baseline", options=baseline, target=state.target
    )
    base = run_job(spec, state.rec.progress)
    res.baseline, res.board, res.port, res.simulated = base, base.board, base.port, base.simulated
    state.base_caps = {v: c for v, run in base.variants.items() if (c := run.capture()) is not None}
    res.warnings += base.warnings
    res.audit = base.tap.audit if base.tap is not None else None
    if res.audit is not None and state.opts.noise_band != NOISE_BAND:  # the audit again, at this run's band
        res.audit = audit_captures(state.info, state.base_caps, state.opts.noise_band)
    ansi = base.variants["ansi"]
    # a tap finding of ANSI C: its printed outputs are not what its ops wrote
    wrong = base.tap is not None and any(f.variant == "ansi" for f in base.tap.findings)
    if ansi.source is None or ansi.exit_code is not None or wrong:
        res.message = "the ANSI C build did not run cleanly: there is nothing to verify a hybrid against"
        state.codes.append(ansi.exit_code or (base.exit_code if wrong else ExitCode.INFRASTRUCTURE))
        return False
    state.ansi_source = ansi.source
    comp = base.comparison
    state.ref_source = next((s for s in comp.sources if s.kind == "reference"), None) if comp else None
    if state.ref_source is None:
        res.warnings.append("no host reference: hybrids are verified against the ANSI C build only")
    bad_ref = [c for c in (comp.comparisons if comp else []) if c.a == "ansi" and not c.match]
    if bad_ref:
        res.message = (
            "the ANSI C build itself differs from the host reference: no hybrid can be bit-exact with both "
            "(an esp-nn ANSI C or TFLM problem, not an optimization one)"
        )
        state.codes.append(ExitCode.MISMATCH)
        return False
    state.codes.append(base.exit_code)  # what the optimized build did: the finding if no hybrid is offered
    if base.exit_code == ExitCode.MATCH and not state.opts.manual:
        res.message = "the optimized build already matches ANSI C and the host reference: no hybrid needed"
        return False
    # an optimized build that printed an input and then nothing (an invoke that never returned) is firmware
    # evidence too, unlike a link that failed (bisection then finds the op that hangs)
    hung = _hung(state.base_caps.get("optimized"), base.variants["optimized"])
    evidence = base.exit_code in (ExitCode.MISMATCH, ExitCode.FIRMWARE_FAULT) or hung
    if not evidence and not state.opts.manual:
        # a culprit op is named only from firmware evidence: a baseline that failed on the link, the
        # port or the build proves nothing wrong with the optimized kernels, so there is nothing to find
        res.message = (
            f"the baseline ended with exit {int(base.exit_code)} ({base.verdict}), not with a mismatch or "
            "a firmware fault: there is no evidence against the optimized build to find the ops of; fix "
            "what the baseline reports (baseline/report.json) and run again"
        )
        return False
    return True


# ---- 2. choose ------------------------------------------------------------------------------------


def _choose(state: _State) -> None:
    """Set ``res.ansi_ops``: given, from the taps (then bisection if they cannot name an op), or bisected."""
    if state.opts.manual:
        state.res.ansi_ops = list(select_ansi_ops(state.info, state.opts.ansi_ops, state.opts.ansi_kinds))
        state.res.culprits = [_culprit(state, k, "given") for k in state.res.ansi_ops]
        return
    again = _failure_reproduces(state)
    if again is None:
        return
    if state.opts.bisect:
        _bisect(state, [])
        return
    found, why = _iterate(state, again)
    if why:
        state.res.notes.append(f"taps could not finish the job ({why}): bisecting")
        state.res.mode = "taps+bisect"
        _bisect(state, found)


def _culprit(state: _State, op: int, how: str) -> Culprit:
    return Culprit(op=op, kind=state.info.main_ops[op].opcode, found_by=how)


def _iterate(state: _State, again: HybridRun) -> tuple[list[int], str]:
    """Tap rounds from the baseline's first departing op, named again by ``again`` (the confirming run);
    returns (ops found, why bisection must take over -- empty when done or stopped)."""
    base = state.res.baseline
    assert base is not None
    d = base.tap.culprit if base.tap is not None else None
    moved = again.divergence.op if again.divergence is not None else None
    if d is not None and d.op is not None and moved != d.op:  # the culprit itself must come back too
        now = "no op" if moved is None else f"op {moved}"
        return [], f"op {d.op} departed first in the baseline, {now} when the same build ran again"
    found: list[int] = []
    for round_no in range(1, state.opts.max_rounds + 1):
        op, why = _next_op(state, d, found)
        if op is None:
            return found, why
        found.append(op)
        state.res.culprits.append(_culprit(state, op, f"tap (round {round_no})"))
        run = _run_hybrid(state, found, tap=True, label=f"tap-{round_no}")
        if run.outcome == "good":
            state.res.ansi_ops = sorted(found)
            return found, ""
        if run.outcome == "error":
            state.res.message = f"hybrid run {run.label} failed: {run.why}"
            state.codes.append(run.exit_code or ExitCode.INFRASTRUCTURE)
            return found, ""
        d = run.divergence
    state.res.message = (
        f"still no match after {state.opts.max_rounds} round(s) with ops {format_ops(found)} on ANSI C"
    )
    return found, ""


def _next_op(state: _State, divergence: Divergence | None, found: list[int]) -> tuple[int | None, str]:
    """The op to send to ANSI C next from a divergence, or None and why taps cannot tell."""
    if divergence is None or divergence.op is None:
        return None, "the optimized run printed no departing op checksums (crashed, hung or not tapped)"
    if divergence.kind == "clobbered_input":
        return None, f"{divergence.message}; the op that overwrote it is not the one that read it"
    if divergence.kind != "output" or divergence.op in found:
        return None, f"op {divergence.op}: {divergence.message}"
    op = state.info.main_ops[divergence.op]
    if not switchable(op):
        state.res.message = (
            f"op {divergence.op} ({op.opcode}) departs first, but it has no ESP-NN kernel: both builds run "
            "the same TFLM kernel there, so no op can be switched to ANSI C to fix it"
        )
        return None, ""
    return divergence.op, ""


def _bisect(state: _State, found: list[int]) -> None:
    """Bisection over the switchable ops (known bad: optimized everywhere except ``found``, the
    failure confirmed by :func:`_failure_reproduces`)."""
    bis = Bisection(candidate_ops(state.info), max_culprits=state.opts.max_rounds, found=list(found))
    state.res.bisection = bis
    while (ansi := bis.next_ansi_ops()) is not None:
        run = _run_hybrid(state, ansi, tap=False, label=f"bisect-{len(bis.steps)}")
        if run.outcome == "error":
            bis.abort(f"run {run.label} failed: {run.why}")
            state.res.message = bis.message
            state.codes.append(run.exit_code or ExitCode.INFRASTRUCTURE)
            break
        bis.record(run.outcome == "bad", run.why)
    if bis.success:
        state.res.ansi_ops = sorted(bis.found)
        state.res.culprits += [_culprit(state, k, "bisection") for k in bis.found if k not in found]
    elif not state.res.message:
        state.res.message = bis.message


def _failure_reproduces(state: _State) -> HybridRun | None:
    """Every op found from the firmware (taps or bisection) stands on one premise: the optimized build's
    failure comes back. Run it once more, tapped like the baseline, before naming any op: the run when it
    is bad again, else None -- a failure that does not come back names no op, it stays a finding
    (non-determinism), with the baseline's exit code."""
    run = _run_hybrid(state, [], tap=not state.opts.bisect, label="confirm")
    if run.outcome == "bad":
        return run
    if run.outcome == "error":
        state.res.message = f"the run confirming the baseline's failure failed: {run.why}"
        state.codes.append(run.exit_code or ExitCode.INFRASTRUCTURE)
        return None
    state.res.message = (
        "the optimized build's failure did not come back when it ran again (every op optimized, clean "
        "this time): the optimized build is non-deterministic (an intermittent fault), so no op can be "
        "named from it and no hybrid is offered; the baseline's evidence is in baseline/report.json"
    )
    base = state.res.baseline
    state.codes.append(base.exit_code if base is not None else ExitCode.FIRMWARE_FAULT)  # the finding stands
    return None


# ---- one hybrid firmware run ----------------------------------------------------------------------


def _run_hybrid(state: _State, ansi_ops: Sequence[int], *, tap: bool, label: str) -> HybridRun:
    """Generate, build, flash and capture the optimized build with ``ansi_ops`` on ANSI C; judge it."""
    run = HybridRun(label, sorted(set(ansi_ops)), tap)
    state.res.runs.append(run)
    d = state.res.out_dir / "runs" / label
    feats = FirmwareFeatures(tap=tap, ansi_ops=tuple(run.ansi_ops))
    rec = Recorder(state.rec.progress)
    job = state.spec.options
    try:
        (project,) = rec.run("generate", label, lambda: generate_projects(
            state.spec.model, state.spec.inputs, state.board, out_dir=d / "projects", variants=("optimized",),
            input_options=job.input_options, arena_kb=job.arena_kb, features=feats,
        ))  # fmt: skip
        run.project_dir = project.path
        build = rec.run("build", label, lambda: build_project(
            project.path, builder=job.builder, cache_dir=job.cache_dir, log_path=d / "logs" / "build.log",
            timeout=job.timeouts.build, native=job.native,
        ))  # fmt: skip
    except UsageError:
        raise
    except EspCheckError as exc:
        run.why, run.exit_code = str(exc), exc.exit_code
        return run
    finally:
        state.rec.adopt(rec.stages, label)
    assert state.target is not None
    vr, stages = flash_and_capture(
        build, state.target, d, variant="optimized", timeouts=job.timeouts, flash_baud=job.flash_baud,
        progress=state.rec.progress,
    )  # fmt: skip
    state.rec.adopt(stages, label)
    _judge(state, run, vr)
    tail = f": {run.why}" if run.why else ""
    state.rec.say(label, f"ANSI C on ops {format_ops(run.ansi_ops) or '-'}: {run.outcome}{tail}")
    return run


def _judge(state: _State, run: HybridRun, variant_run: VariantRun) -> None:
    """good: clean capture, the dispatch it printed is the one asked for, bit-exact vs ANSI C and host."""
    run.variant, run.exit_code = variant_run, variant_run.exit_code
    run.capture = variant_run.capture()
    if variant_run.exit_code == ExitCode.FIRMWARE_FAULT:
        crash = "; ".join(str(f["message"]) for f in variant_run.findings[:1])
        run.outcome, run.why = "bad", f"crash: {crash}"
        return
    if _hung(run.capture, variant_run):
        run.outcome, run.why = "bad", "hang: the invoke never returned (INPUT printed, then silence)"
        return
    if variant_run.exit_code is not None or variant_run.source is None or run.capture is None:
        run.why = "; ".join(variant_run.problems[:2]) or f"capture failed (exit {variant_run.exit_code})"
        return
    expected = sum(1 for k in run.ansi_ops if ansi_path_applies(state.info, state.info.main_ops[k]))
    # no op on ANSI C: the plain optimized build, which has no wrapper table to account for
    evidence = hybrid_evidence(run.capture, run.ansi_ops, expected) if run.ansi_ops else []
    if evidence:
        run.why = "the firmware's own records do not show the requested dispatch: " + "; ".join(evidence)
        return
    assert state.ansi_source is not None
    label = run.compared_as
    hyb = dataclasses.replace(variant_run.source, label=label)
    quant = output_quant(state.info.outputs)
    run.comparison = compare_sources(hyb, state.ansi_source, state.ref_source, output_quant=quant)
    bad = [c for c in run.comparison.comparisons if not c.match and label in (c.a, c.b)]
    run.outcome = "good" if not bad and not run.comparison.faults else "bad"
    run.why = "; ".join(c.mismatch_text() for c in bad[:2])
    if run.tapped:
        run.divergence = _divergence(state, run)


def _hung(cap: Capture | None, variant_run: VariantRun) -> bool:
    """INPUT printed, then silence until the timeout (no END, no crash report): the invoke never returned."""
    silent = any(f.get("kind") in ("no_end", "hang") for f in variant_run.findings)
    return bool(silent and cap is not None and cap.runs and cap.runs[-1].invoke_us is None)


def _divergence(state: _State, run: HybridRun) -> Divergence | None:
    """First op where the tapped run departs from the tapped ANSI C baseline (first input that does)."""
    ansi = state.base_caps.get("ansi")
    if ansi is None or run.capture is None:
        return None
    for one, ref in zip(run.capture.runs, ansi.runs, strict=False):
        d = first_divergence(run.compared_as, device_taps(one), "ansi", device_taps(ref))
        if d.op is not None:
            return d
    return None


# ---- 3. verify ------------------------------------------------------------------------------------


def _verify(state: _State) -> None:
    """The plain hybrid firmware (no taps: what a user ships), judged like every hybrid run."""
    res = state.res
    if not res.ansi_ops:
        if not res.message:
            res.message = "no op set was found that makes the optimized build match"
        return
    last = res.runs[-1] if res.runs else None
    reuse = last is not None and not last.tapped and last.ansi_ops == res.ansi_ops and last.outcome == "good"
    run = last if reuse and last is not None else _run_hybrid(state, res.ansi_ops, tap=False, label="verify")
    res.verification = run
    res.offered = run.outcome == "good"
    ops = format_ops(res.ansi_ops)
    if res.offered:
        n = len(state.spec.inputs)
        res.message = (
            f"hybrid verified: ESP-NN optimized except op(s) {ops} on ANSI C; bit-exact with the ANSI C "
            f"build and the host reference on {'all ' + str(n) + ' inputs' if n > 1 else 'the input'}"
        )
    else:
        res.message = f"the hybrid with op(s) {ops} on ANSI C did not verify ({run.why}): not offered"
        state.codes.append(run.exit_code or ExitCode.MISMATCH)


# ---- 4. deliver -----------------------------------------------------------------------------------


def _deliver(state: _State) -> None:
    res = state.res
    assert res.verification is not None and res.verification.project_dir is not None
    res.dropin = _dropin(state, res.verification.project_dir)
    culprits = [c["op"] for c in res.culprits if c["found_by"] != "given"]
    dump_caps = {}
    if culprits and not _reuse_baseline_repro(state, culprits):
        dump_caps = _reproduce(state, culprits)
    res.cost = _cost(state, dump_caps)


def _dropin(state: _State, project: Path) -> Dropin:
    """The verified firmware's own esp_check_hybrid.{h,cc}, with the resolver lines and a README."""
    dest = state.res.out_dir / "hybrid-dropin"
    dest.mkdir(parents=True, exist_ok=True)
    for name in (HEADER, SOURCE):
        shutil.copyfile(project / "main" / name, dest / name)
    ctx = hybrid_firmware_context(
        state.info, state.res.ansi_ops, model_name=state.spec.model.name, model_sha256=state.info.sha256
    )
    assert ctx is not None
    resolver = list(resolver_methods(state.info))
    evidence = f"esp-check: {state.res.message}" + (" (SIMULATED board)" if state.res.simulated else "")
    (dest / "README.md").write_text(readme_snippet(ctx, resolver, evidence=evidence), encoding="utf-8")
    return Dropin(
        dir=str(dest),
        files=[HEADER, SOURCE, "README.md"],
        registration=registration_lines(ctx, resolver),
        from_project=str(project),
    )


def _cost(state: _State, dump_caps: dict[str, Capture]) -> CostReport | InvokeCost | None:
    """From per-op cycles of both builds (the tapped baseline, else the tapped reproducer dump run); a
    tapped hybrid run with the same ops measures the hybrid itself."""
    caps = state.base_caps
    if not (caps.get("ansi") and op_cycles(caps["ansi"])) and dump_caps.get("ansi"):
        caps = {**caps, **{v: c for v, c in dump_caps.items() if op_cycles(c)}}
    if "ansi" not in caps:
        return None
    mhz = int(caps["ansi"].info.get("cpu_mhz", "240") or 240)
    measured = next(
        (op_cycles(r.capture) for r in reversed(state.res.runs)
         if r.tapped and r.outcome == "good" and r.ansi_ops == state.res.ansi_ops and r.capture is not None),
        None,
    )  # fmt: skip
    if "optimized" in caps and op_cycles(caps["optimized"]) and op_cycles(caps["ansi"]):
        opt, ansi = op_cycles(caps["optimized"]), op_cycles(caps["ansi"])
        native = bool(caps["ansi"].info.get("native"))  # a PC's timing: no cost claim (analysis.hybrid)
        band = state.opts.noise_band
        return cost_report(
            state.info, opt, ansi, state.res.ansi_ops, mhz, measured, native=native, noise_band=band
        )
    return _invoke_cost(state, caps)


def _invoke_cost(state: _State, caps: dict[str, Capture]) -> InvokeCost:
    """Without per-op cycles (bisection, no taps): the measured invoke times of the three builds."""
    ver = state.res.verification

    def first_us(cap: Capture | None) -> int | None:
        return cap.runs[0].invoke_us if cap is not None and cap.runs else None

    us = {"optimized": first_us(caps.get("optimized")), "ansi": first_us(caps.get("ansi")),
          "hybrid": first_us(ver.capture if ver else None)}  # fmt: skip
    native = any(bool(c.info.get("native")) for c in caps.values())  # a PC's timing: no claim
    return invoke_cost(us, native=native, noise_band=state.opts.noise_band)


def _reuse_baseline_repro(state: _State, ops: list[int]) -> bool:
    """The baseline's tap dump run already made verified reproducers of exactly these ops: copy them."""
    base = state.res.baseline
    made = [r for r in (base.tap.repro if base is not None and base.tap is not None else []) if r.get("ok")]
    if sorted(r["op"] for r in made) != sorted(ops):
        return False
    for r in made:
        src = Path(r["dir"])
        dest = state.res.out_dir / "repro" / src.name
        shutil.copytree(src, dest, dirs_exist_ok=True)
        state.res.repro.append({**r, "dir": str(dest)})
    return True


def _reproduce(state: _State, ops: list[int]) -> dict[str, Capture]:
    """A dump run of both builds for the culprits, then one-op reproducers under ``out/repro``."""
    assert state.target is not None
    spec = dataclasses.replace(state.spec, options=state.spec.options.replace(dump_ops=()))
    req = TapRunRequest(spec, state.info, state.target, state.res.out_dir)
    outcome = dump_run(req, ops, state.rec, "repro-dump")
    state.res.warnings += [f"reproducer: {e}" for e in outcome.errors]
    state.res.repro = outcome.result.repro
    return outcome.captures


# ---- report ---------------------------------------------------------------------------------------


def _finish(state: _State) -> None:
    res = state.res
    res.exit_code = ExitCode.MATCH if res.offered else combine_exit_codes(state.codes or [ExitCode.MISMATCH])
    res.errors += list(res.baseline.errors if res.baseline else [])
    write_hybrid_outputs(
        res,
        state.rec.stages,
        model=state.spec.model,
        inputs=state.spec.inputs,
        html=state.spec.options.html,
        bundle=state.spec.options.bundle,
    )
