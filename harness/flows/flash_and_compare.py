"""``flash-and-compare``: generate both variants, build, flash, capture, compare, report.

Its stages, and what a verdict rests on: docs/architecture.md "The pipeline: one job spec, one path"
and "The judge".
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from harness.analysis.compare import (
    CompareResult,
    Source,
    check_tolerances,
    compare_variants,
    empty_outputs,
    output_quant,
    reference_source,
)
from harness.analysis.dataset import OutputSpec
from harness.device.loop import LinkStats
from harness.errors import (
    DISK_FULL_ERRNOS,
    EspCheckError,
    ExitCode,
    ReferenceRefusedError,
    UsageError,
    combine_exit_codes,
    stopped_by,
    write_error,
)
from harness.firmware.boards import Board, load_board
from harness.firmware.generate import FirmwareFeatures
from harness.flashfmt.partitions import VARIANTS
from harness.flows.capture import Body, streaming, with_board
from harness.flows.dataset import (
    DatasetOptions,
    DatasetOutcome,
    HostLegsJob,
    load_inputs,
    pick_tap_inputs,
    run_dataset,
    verdicts,
    write_tap_inputs,
)
from harness.flows.firmware import Firmware, prepare_firmware
from harness.flows.job import JobOptions, JobSpec
from harness.flows.records import (
    EspnnCoverage,
    FlashAndCompareResult,
    ProgressFn,
    Recorder,
    VariantRun,
)
from harness.flows.refused import refusal_finding
from harness.flows.report import discard_report, write_junit, write_report
from harness.flows.resident import ResidentBoard
from harness.flows.targets import BoardLockCM, Target, open_target
from harness.model.inputs import input_tensor_bytes
from harness.model.loader import ModelInfo, load_model
from harness.model.opdata import espnn_model_acceleration
from harness.model.reference import prepare_host_results
from harness.resources import check_output_path

if TYPE_CHECKING:  # (only --tap runs load the tap analysis: _tap)
    from harness.analysis.tap import TapResult


@dataclass
class _JobState:
    spec: JobSpec
    out: Path
    rec: Recorder
    loaded_board: Board | None = None
    loaded_model: ModelInfo | None = None
    loaded_target: Target | None = None
    variants: dict[str, VariantRun] = field(default_factory=lambda: {v: VariantRun(v) for v in VARIANTS})
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    codes: list[ExitCode] = field(default_factory=list)
    comparison: CompareResult | None = None
    dataset: DatasetOutcome | None = None
    streamed: list[bytes] = field(default_factory=list)  # the inputs as the device's input tensor takes them
    link: LinkStats | None = None
    tap: TapResult | None = None
    espnn: EspnnCoverage | None = None
    refused: ReferenceRefusedError | None = None  # the host reference aborted (flows/refused.py)

    @property
    def opts(self) -> JobOptions:
        return self.spec.options

    @property
    def board(self) -> Board:
        assert self.loaded_board is not None, "used before _prepare loaded the board"
        return self.loaded_board

    @property
    def info(self) -> ModelInfo:
        assert self.loaded_model is not None, "used before _prepare loaded the model"
        return self.loaded_model

    @property
    def target(self) -> Target:
        assert self.loaded_target is not None, "used before _prepare chose the target"
        return self.loaded_target

    def failed(self, what: str, exc: EspCheckError) -> None:
        self.errors.append(f"{what}: {exc}")
        self.codes.append(exc.exit_code)

    def lock(self) -> BoardLockCM | None:
        """The board's lock while it is flashed and captured (None: not asked for, or a private board)."""
        return self.target.job_lock(self.opts, "esp-check flash-and-compare", self.rec)


def flash_and_compare(
    model: str | Path,
    inputs: Sequence[str | Path] = (),
    *,
    board: str | Path = "sim",
    port: str | None = None,
    out_dir: str | Path = "esp-check-out",
    options: JobOptions | None = None,
    progress: ProgressFn | None = None,
) -> FlashAndCompareResult:
    """Check ``model`` on ``inputs`` (or ``options.dataset``) on ``board``: :func:`run_job` of that spec.

    Usage errors found before any hardware is touched are raised; later failures are recorded per
    stage and decide the exit code; the report is always written to ``out_dir``.
    """
    spec = JobSpec.of(model, inputs, board=board, port=port, out_dir=out_dir, options=options)
    return run_job(spec, progress)


def run_job(spec: JobSpec, progress: ProgressFn | None = None) -> FlashAndCompareResult:
    """The one pipeline every mode runs: prepare -> acquire -> execute -> judge -> report.

    What each stage does: docs/architecture.md "The pipeline: one job spec, one path".
    """
    t_all = time.monotonic()
    check_tolerances(spec.options.tolerance_lsb, spec.options.ref_tolerance_lsb)
    out = prepare_out_dir(spec.out_dir)
    check_report_paths(spec.options)
    discard_report(out)
    run = _JobState(spec, out, Recorder(progress))
    _refuse_clobbering(run)

    def finish() -> FlashAndCompareResult:
        return _finish(run, time.monotonic() - t_all)

    with _stopped(run, finish):
        _prepare(run)
        if not _port_there(run):
            return finish()
        workload = DatasetWorkload() if spec.options.dataset is not None else InputsWorkload()
        workload.execute(run)
    return finish()


class InputsWorkload:
    """The job's inputs (``--input``), streamed to both variants; ``--tap`` then analyses the runs."""

    def execute(self, run: _JobState) -> None:
        o = run.opts
        if o.reference:  # ONE host child runs the reference on the inputs and measures the arena;
            # generate, the reference leg and the simulated board read its cached results
            prepare_host_results(
                run.spec.model, run.spec.inputs, input_options=o.input_options, per_layer=o.tap
            )
        # the inputs are streamed to the resident firmware, never compiled in: a new input rebuilds and
        # reflashes nothing (generate still checks them, before anything is built)
        features = FirmwareFeatures(tap=o.tap, embed_inputs=False)
        fw = _firmware(run, run.spec.inputs, features, functools.partial(self.host, run))
        if fw is None:
            return
        with _acquired(run) as locked:
            if not locked:
                return
            _execute(run, fw, streaming(run.variants, run.streamed))
        run.comparison = _compare(run, self.ref_source)
        if o.tap:
            _tap(run)

    ref_source: Source | None = None

    def host(self, run: _JobState) -> None:
        run.streamed = input_tensor_bytes(run.spec.inputs, run.info.inputs[0], run.opts.input_options)
        self.ref_source = _host_reference(run) if run.opts.reference else None


class DatasetWorkload:
    """A dataset (docs/dataset.md): loaded first (usage errors before anything is built), then streamed
    through both variants while the host reference runs; ``--tap-inputs`` then taps chosen inputs."""

    def execute(self, run: _JobState) -> None:
        opts = run.opts.dataset
        assert opts is not None
        ds = load_inputs(opts, run.info.inputs[0], run.opts.input_options)
        run.warnings += empty_outputs((o, t.name, t.num_elements) for o, t in enumerate(run.info.outputs))
        outcome = run.dataset = DatasetOutcome(ds)
        fw = _firmware(run, [], FirmwareFeatures(embed_inputs=False))
        if fw is None:
            return
        outputs = [OutputSpec(t.dtype, tuple(t.shape), t.name) for t in run.info.outputs]

        def body(resident: ResidentBoard, order: list[str]) -> None:
            outcome.run = run_dataset(resident, run.variants, order, ds, outputs, opts, host=outcome.host)

        with contextlib.ExitStack() as held:
            # the host reference starts before the board is locked and flashed: it runs while the inputs
            # stream (in full mode it is waited for only before the verdicts); ``held`` kills it early
            host = HostLegsJob(run.spec.model, run.info, ds, run.rec) if run.opts.reference else None
            if host is not None:
                held.callback(host.cancel)
            if not held.enter_context(_acquired(run)):
                return
            if opts.results != "full":
                _join_host_legs(run, outcome, host)
            _execute(run, fw, body)
            _join_host_legs(run, outcome, host)
        if outcome.run is None:
            return
        verdicts(outcome, run.variants, outputs, run.opts.tolerance_lsb, run.opts.ref_tolerance_lsb, run.rec)
        run.codes += outcome.run.codes
        run.errors += outcome.run.errors
        if opts.tap_inputs:
            _dataset_tap(run, opts)


def _firmware(
    run: _JobState,
    inputs: Sequence[Path],
    features: FirmwareFeatures,
    before_build: Callable[[], None] = lambda: None,
) -> Firmware | None:
    """Generate both variants, run the host side (``before_build``: it overlaps nothing yet, but it
    must fail before minutes of building), build; None when a build failed (nothing to flash). A spec
    that brings its ``firmware`` (the runner's, made once per model and board type) is not generated
    or built again: the host side still runs and checks the inputs."""
    fw = run.spec.firmware
    if fw is not None:
        before_build()
    else:
        fw = prepare_firmware(
            run.spec.model,
            inputs,
            run.board,
            run.out,
            rec=run.rec,
            options=run.opts,
            features=features,
            before_build=before_build,
        )
    return fw if _record_builds(run, fw) else None


@contextlib.contextmanager
def _acquired(run: _JobState) -> Iterator[bool]:
    """acquire: the board's lock held for the ``with`` block (True), or False when it could not be taken."""
    with contextlib.ExitStack() as held:
        try:
            cm = run.lock()
            if cm is not None:
                run.rec.run("lock", None, lambda: held.enter_context(cm))
        except EspCheckError as exc:
            run.failed("board lock", exc)
            yield False
            return
        yield True


def _execute(run: _JobState, firmware: Firmware, body: Body) -> None:
    """execute: flash what differs, boot, ``body``; the variants' exit codes join the run's."""
    run.link = with_board(
        run.rec, run.variants, firmware.builds, target=run.target, out=run.out, limits=run.opts.timeouts,
        flash_baud=run.opts.flash_baud, body=body,
    )  # fmt: skip
    run.codes += [r.exit_code for r in run.variants.values() if r.exit_code is not None]


@contextlib.contextmanager
def _stopped(run: _JobState, finish: Callable[[], FlashAndCompareResult]) -> Iterator[None]:
    """A run that stops early still writes its report, saying why: a usage error found before any
    hardware (or any EspCheckError that escaped a stage), Ctrl-C or SIGTERM, a full disk (exit 3)."""
    try:
        yield
    except EspCheckError as exc:
        run.failed("stopped", exc)
        finish()
        raise
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (harness.cli turns it into Terminated)
        code, how = stopped_by(exc)
        run.errors.append(f"{how}: the run did not finish")
        run.codes.append(code)
        finish()
        raise
    except OSError as exc:  # writing an artifact (a project, a log) failed: the host's disk, exit 3
        if exc.errno not in DISK_FULL_ERRNOS:
            raise
        err = write_error(exc, f"the artifacts in {run.out}")
        run.failed("stopped", err)
        with contextlib.suppress(EspCheckError):  # no room for the report either: write_report cleans up
            finish()
        raise err from None


def _refuse_clobbering(run: _JobState) -> None:
    """--junit/--html/--bundle must not overwrite report.json, a log or project of this run, the model or
    an input, or each other (``--bundle OUT/report.json`` replaced the report with a zip, exit 0)."""
    mine = {run.out / "report.json": "this run's report.json", run.spec.model.resolve(): "the model"}
    mine.update({p.resolve(): "an input" for p in run.spec.inputs})
    taken: dict[Path, str] = {}
    flags = (("--junit", run.opts.junit), ("--html", run.opts.html), ("--bundle", run.opts.bundle))
    for flag, given in flags:
        if given is None:
            continue
        path = Path(given).resolve()
        inside = next((d for d in ("logs", "projects") if path.is_relative_to(run.out / d)), None)
        clash = mine.get(path) or taken.get(path) or (f"this run's {inside}/ directory" if inside else None)
        if clash is not None:
            exc = UsageError(f"{flag} {given} would overwrite {clash}", hint=f"give {flag} another path")
            run.failed("stopped", exc)
            _finish(run, 0.0, reports=False)
            raise exc
        taken[path] = f"the {flag} file"


def _tap(run: _JobState) -> None:
    """``--tap``: the tap flow after the comparison (its dump run rebuilds the same firmware with dumps
    on, and its timing and culprit). Imported here: a run without --tap loads none of the tap analysis."""
    from harness.flows.tap_run import TapRunRequest, run_tap_flow  # lazy: --tap only, not on a repeat run

    req = TapRunRequest(spec=run.spec, info=run.info, target=run.target, out=run.out)
    cm = run.lock()
    outcome = run.rec.run("tap", None, lambda: run_tap_flow(req, run.variants, rec=run.rec, lock_cm=cm))
    run.tap = outcome.result
    run.errors.extend(outcome.errors)
    run.codes.extend(outcome.codes)
    if run.tap.findings:  # the device's own evidence that its outputs are wrong: a mismatch (docs/tap.md)
        run.errors += [f"tap: {f}" for f in run.tap.findings]
        run.codes.append(ExitCode.MISMATCH)


def check_report_paths(options: JobOptions) -> None:
    """--junit, --html and --bundle files that cannot be written: refused before any work, not after it."""
    for flag, path in {"--junit": options.junit, "--html": options.html, "--bundle": options.bundle}.items():
        if path is not None:
            check_output_path(path, flag)


def prepare_out_dir(out_dir: str | Path) -> Path:
    """The artifact directory, created and proven writable before any work (UsageError otherwise)."""
    out = Path(out_dir).resolve()
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".esp-check-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        if out.exists() and not out.is_dir():
            why = "a file of that name is in the way"
        raise UsageError(
            f"cannot write the artifact directory {out}: {why}",
            hint="pass --out a directory you can write (it is created if missing)",
        ) from None
    return out


def _prepare(run: _JobState) -> None:
    """Load the board and model, choose the target and check its port (usage errors raise: nothing has
    been touched yet), and refuse a model ESP-NN does not touch on the board's chip."""
    board = run.loaded_board = load_board(run.spec.board)
    run.loaded_model = load_model(run.spec.model)
    run.loaded_target = run.spec.target or open_target(board, run.spec.port)
    run.espnn = _espnn_coverage(run.loaded_model, board.chip)
    if run.espnn["accelerated_ops"] == 0:
        untested = (
            f"ESP-NN accelerates none of this model's {run.espnn['ops']} ops on {board.chip} "
            f"({run.espnn['why']}): both variants run the same TFLM kernels, so a match here says "
            "nothing about ESP-NN"
        )
        if not run.opts.allow_untested:
            raise UsageError(
                untested,
                hint="esp-check inspect MODEL lists what ESP-NN accelerates per chip (an int8 model is "
                "what it accelerates); pass --allow-untested to run it anyway (the verdict then says "
                "ESP-NN NOT TESTED)",
            )
        run.warnings.append(untested)
    _check_dump_ops(run.opts.dump_ops, run.info)


def _port_there(run: _JobState) -> bool:
    """The target's port is there (a missing device, a server that does not answer): checked before the
    builds, which take minutes on a fresh machine. When it is not, the job ends here with exit 3 and a
    report that says why: an infrastructure finding, as a link lost later would be."""
    try:
        run.target.check(run.rec)
    except EspCheckError as exc:
        if exc.exit_code == ExitCode.USAGE:
            raise
        run.failed("port", exc)
        return False
    return True


def _check_dump_ops(dump_ops: Sequence[int], info: ModelInfo) -> None:
    """``--dump-ops`` names ops of this model (refused before anything is built, not after the run)."""
    bad = sorted(i for i in set(dump_ops) if not 0 <= i < len(info.ops))
    if bad:
        raise UsageError(
            f"--dump-ops {','.join(map(str, bad))}: the model has {len(info.ops)} op(s), "
            f"indices 0..{len(info.ops) - 1}",
            hint="esp-check inspect MODEL lists the ops with their indices",
        )


def _espnn_coverage(info: ModelInfo, chip: str) -> EspnnCoverage:
    accel = espnn_model_acceleration(info, chip)
    k = sum(a.accelerated for a in accel)
    reasons = sorted({a.reason for a in accel if not a.accelerated})
    why = f"{info.kind} model; " + "; ".join(reasons[:3]) if reasons else "no ops"
    return EspnnCoverage(chip=chip, accelerated_ops=k, ops=len(accel), why=why if k == 0 else "")


def _host_reference(run: _JobState) -> Source | None:
    """The host reference leg; missing it is a loud warning, not a failure (device vs device stands)."""
    try:
        return run.rec.run(
            "reference",
            None,
            lambda: reference_source(
                run.spec.model, run.spec.inputs, backend="auto", input_options=run.opts.input_options
            ),
        )
    except ReferenceRefusedError as exc:  # both variants still run; _finish gives the verdict
        run.refused = exc
        return None
    except EspCheckError as exc:
        if exc.exit_code == ExitCode.USAGE:
            raise
        run.warnings.append(f"host reference unavailable, comparing optimized vs ANSI C only: {exc}")
        return None


def _record_builds(run: _JobState, firmware: Firmware) -> bool:
    """Copy build facts into the variants; False when a build failed (nothing to flash)."""
    for v, p in firmware.projects.items():
        run.variants[v].project_dir = p.path
    for v, b in firmware.builds.items():
        run.variants[v].firmware_sha256 = b.firmware_sha256
        run.variants[v].build_cache_hit = b.cache_hit
    for v, exc in firmware.failures.items():
        run.failed(f"build {v}", exc)
    return firmware.complete


def _join_host_legs(run: _JobState, outcome: DatasetOutcome, host: HostLegsJob | None) -> None:
    """Wait for the host reference (once): a usage error (the model) ends the run with exit 2; any
    other failure leaves optimized vs ANSI C only, with a warning."""
    if host is None or host.taken:
        return
    try:
        outcome.host = host.result()
    except EspCheckError as exc:
        if exc.exit_code == ExitCode.USAGE:
            raise
        run.warnings.append(f"host reference unavailable, comparing optimized vs ANSI C only: {exc}")


def _dataset_tap(run: _JobState, opts: DatasetOptions) -> None:
    """``--tap-inputs``: the chosen dataset inputs, written as .npy files under ``tap-inputs/``, run as a
    job of their own (``--tap --input`` of them, through this same pipeline) under ``tap/``. Its stages
    are labelled ``tap:``; the dataset's verdict stands."""
    outcome = run.dataset
    assert outcome is not None
    picks = pick_tap_inputs(outcome, opts.tap_inputs)
    outcome.tap_inputs = write_tap_inputs(outcome.dataset, picks, run.info.inputs[0], run.out / "tap-inputs")
    if not picks:
        return
    paths = tuple(Path(d["file"]) for d in outcome.tap_inputs)
    tapped = run.opts.replace(dataset=None, tap=True, input_options=None, junit=None, html=None, bundle=None)
    spec = dataclasses.replace(run.spec, inputs=paths, out_dir=run.out / "tap", options=tapped)
    sub = _JobState(
        spec, spec.out_dir, Recorder(run.rec.progress), run.loaded_board, run.loaded_model, run.target
    )
    try:
        InputsWorkload().execute(sub)
        run.tap = sub.tap
    except EspCheckError as exc:
        sub.failed("tap run", exc)
    finally:
        run.rec.adopt(sub.rec.stages, "tap")
        run.errors += [f"tap run: {e}" for e in sub.errors]
        codes = list(sub.codes)
        if sub.comparison is not None:  # the dataset's verdict stands: the tap run's own is not a second one
            codes.remove(sub.comparison.exit_code)
        run.codes += [c for c in codes if c != ExitCode.MATCH]


def _compare(run: _JobState, ref_source: Source | None) -> CompareResult | None:
    """What the device printed, compared (compare_variants decides which legs there are)."""
    opt, ansi = run.variants["optimized"].source, run.variants["ansi"].source
    if (opt is None or ansi is None) and (ref_source is None or (opt is None and ansi is None)):
        return None
    try:
        result = run.rec.run(
            "compare",
            None,
            lambda: compare_variants(
                opt, ansi, ref_source, tolerance_lsb=run.opts.tolerance_lsb,
                ref_tolerance_lsb=run.opts.ref_tolerance_lsb, output_quant=output_quant(run.info.outputs),
            ),
        )  # fmt: skip
    except EspCheckError as exc:
        run.failed("compare", exc)
        return None
    if result is not None:
        run.codes.append(result.exit_code)
    return result


def _finish(run: _JobState, seconds: float, *, reports: bool = True) -> FlashAndCompareResult:
    """The result, with report.json always written (and JUnit/HTML/bundle when asked for and ``reports``)."""
    html, bundle, junit = (run.opts.html, run.opts.bundle, run.opts.junit) if reports else (None, None, None)
    refused = None if run.refused is None else refusal_finding(run.refused, run.variants, run.comparison)
    if refused is not None:
        run.errors.append(refused["summary"])
        run.codes.append(ExitCode(refused["exit_code"]))
    result = FlashAndCompareResult(
        out_dir=run.out,
        board=run.loaded_board.name if run.loaded_board else "",
        port=run.loaded_target.port_url if run.loaded_target else "",
        simulated=bool(run.loaded_target and run.loaded_target.expects_sim),
        stages=run.rec.stages,
        variants=run.variants,
        comparison=run.comparison,
        exit_code=combine_exit_codes(run.codes) if run.codes else ExitCode.INFRASTRUCTURE,
        report_path=run.out / "report.json",
        errors=run.errors,
        warnings=run.warnings,
        tap=run.tap,
        espnn=run.espnn,
        dataset=run.dataset.to_dict() if run.dataset is not None else None,
        link=run.link.to_dict() if run.link is not None else None,
        native=run.loaded_target.facts(run.variants) if run.loaded_target else None,
        reference_refused=refused,
    )
    write_report(result, model=run.spec.model, inputs=run.spec.inputs, seconds=seconds)
    if html is not None or bundle is not None:
        from harness.analysis.html_report import write_outputs  # lazy: jinja2 only for --html/--bundle

        tapped = [Path(d["file"]) for d in (run.dataset.tap_inputs or [])] if run.dataset else []
        # a dataset run's bundle carries the inputs it tapped (the dataset itself stays where it is)
        write_outputs(
            result, model=run.spec.model, inputs=run.spec.inputs or tapped, html=html, bundle=bundle
        )
    if junit is not None:
        write_junit(result, Path(junit), model=run.spec.model, inputs=run.spec.inputs)
    return result
