"""``flash-and-compare``: generate both variants, build, flash, capture, compare, report.

Every stage is recorded (status, time, error) and the artifact directory is written even when a stage
fails, so nothing is lost. The verdict rests only on what the device printed: CRC-checked records,
its compiled-in ESP-NN mode, and the model/input hashes it computed.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from harness.analysis.compare import (
    CompareResult,
    Source,
    check_tolerances,
    compare_variants,
    output_quant,
    reference_source,
)
from harness.analysis.tap import TapResult
from harness.device.locks import board_lock
from harness.device.loop import LinkStats
from harness.device.ports import check_present, refuse_raw_tcp_simulator, resolve_port
from harness.errors import (
    DISK_FULL_ERRNOS,
    EspCheckError,
    ExitCode,
    ReferenceRefusedError,
    Terminated,
    UsageError,
    combine_exit_codes,
    write_error,
)
from harness.firmware.boards import Board, load_board
from harness.firmware.generate import FirmwareFeatures
from harness.firmware.native.project import NATIVE_MEANING, NativeOptions
from harness.flows.capture import flash_and_capture, run_variants, with_board
from harness.flows.dataset import (
    DatasetOptions,
    DatasetOutcome,
    HostLegsJob,
    load_inputs,
    output_specs,
    pick_tap_inputs,
    run_dataset,
    verdicts,
    write_tap_inputs,
)
from harness.flows.firmware import Firmware, build_firmware, generate_firmware
from harness.flows.records import (
    VARIANT_ORDER,
    FlashAndCompareResult,
    ProgressFn,
    Recorder,
    StageRecord,
    StageTimeouts,
    VariantRun,
)
from harness.flows.refused import refusal_finding
from harness.flows.report import discard_report, write_junit, write_report
from harness.flows.resident import ResidentBoard
from harness.flows.tap_run import TapRunRequest, run_tap_flow
from harness.model.dataset import Dataset
from harness.model.inputs import InputOptions, input_tensor_bytes
from harness.model.loader import ModelInfo, load_model
from harness.model.opdata import espnn_model_acceleration
from harness.model.reference import prepare_host_results


def sim_port_for(board_chip: str, reset: str, port: str | None, flash_size: str | None = None) -> str:
    """A ``sim://`` URL with a fresh board name unless the user named one (one run, one board).

    Chip, reset circuit and flash size default to the board definition's, so the simulated chip is the
    one the firmware was built for (an image built for 8 MB refuses to start on 4 MB, as on hardware).
    """
    url = port or "sim://"
    parts = urlsplit(url)
    name = parts.netloc or parts.path.lstrip("/")
    if not name:
        name = f"esp-check-{uuid.uuid4().hex[:10]}"
    query = parts.query
    keys = {kv.split("=", 1)[0] for kv in query.split("&") if kv}
    extra = []
    if "chip" not in keys:
        extra.append(f"chip={board_chip}")
    if "reset" not in keys:
        extra.append(f"reset={'usb_jtag' if reset == 'usb_serial_jtag' else 'classic'}")
    if "flash_size" not in keys and flash_size:
        extra.append(f"flash_size={flash_size}")
    query = "&".join([q for q in [query, *extra] if q])
    return urlunsplit(("sim", name, "", query, ""))


@dataclass
class _Run:
    """The state of one flash-and-compare run while its steps execute."""

    model: Path
    inputs: list[Path]
    out: Path
    rec: Recorder
    loaded_board: Board | None = None
    loaded_model: ModelInfo | None = None
    port_url: str = ""
    fresh_sim: bool = False  # a simulated board made for this run alone: nobody else's, no lock
    variants: dict[str, VariantRun] = field(default_factory=lambda: {v: VariantRun(v) for v in VARIANT_ORDER})
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    codes: list[ExitCode] = field(default_factory=list)
    comparison: CompareResult | None = None
    dataset: DatasetOutcome | None = None
    streamed: list[bytes] = field(default_factory=list)  # the inputs as the device's input tensor takes them
    link: LinkStats | None = None
    tap: TapResult | None = None
    espnn: dict[str, Any] | None = None
    refused: ReferenceRefusedError | None = None  # the host reference aborted (flows/refused.py)

    @classmethod
    def empty(
        cls, model: str | Path, inputs: Sequence[str | Path], out: Path, progress: ProgressFn | None
    ) -> _Run:
        return cls(Path(model), [Path(p) for p in inputs], out, Recorder(progress))

    @property
    def board(self) -> Board:
        assert self.loaded_board is not None, "used before _start loaded the board"
        return self.loaded_board

    @property
    def info(self) -> ModelInfo:
        assert self.loaded_model is not None, "used before _start loaded the model"
        return self.loaded_model

    def failed(self, what: str, exc: EspCheckError) -> None:
        self.errors.append(f"{what}: {exc}")
        self.codes.append(exc.exit_code)


def flash_and_compare(
    model: str | Path,
    inputs: Sequence[str | Path],
    *,
    board: str | Path = "sim",
    port: str | None = None,
    out_dir: str | Path = "esp-check-out",
    input_options: InputOptions | None = None,
    tolerance_lsb: float = 0,
    ref_tolerance_lsb: float = 0,
    reference: bool = True,
    builder: str | None = None,
    cache_dir: str | Path | None = None,
    flash_baud: int | None = None,
    arena_kb: int | None = None,
    timeouts: StageTimeouts | None = None,
    junit: str | Path | None = None,
    progress: ProgressFn | None = None,
    lock: bool = True,
    lock_dir: str | Path | None = None,
    lock_timeout: float = 600.0,
    tap: bool = False,
    dump_ops: Sequence[int] = (),
    html: str | Path | None = None,
    bundle: str | Path | None = None,
    dataset: DatasetOptions | None = None,
    native: NativeOptions | None = None,
    allow_untested: bool = False,
) -> FlashAndCompareResult:
    """Run the whole job and return its result; the report is always written to ``out_dir``.

    Usage errors found before any hardware is touched are raised; later failures are recorded per
    stage and decide the exit code. With ``lock`` the board's cross-process lock (harness.device.locks,
    in ``lock_dir``) is held while flashing and capturing; a board still busy after ``lock_timeout``
    seconds is an infrastructure error (exit 3). ``dataset``: a whole dataset instead of ``inputs``
    (docs/dataset.md); ``native``: a native board's builds (docs/native.md). A model in which ESP-NN
    accelerates no op on the board's chip is refused (UsageError, exit 2: both variants would run the same
    kernels) unless ``allow_untested``; then it runs, and the report says ESP-NN was not tested.
    """
    t_all = time.monotonic()
    limits = timeouts or StageTimeouts()
    check_tolerances(tolerance_lsb, ref_tolerance_lsb)
    out = prepare_out_dir(out_dir)
    discard_report(out)
    run = _Run.empty(model, inputs, out, progress)
    _refuse_clobbering(run, junit=junit, html=html, bundle=bundle)

    def lock_cm() -> contextlib.AbstractContextManager[Any] | None:
        """The board's lock, or None for a simulated board made for this run alone (nobody else's)."""
        if not lock or run.fresh_sim:
            return None
        return _board_lock(run, lock_dir, lock_timeout)

    def finish() -> FlashAndCompareResult:
        return _finish(run, time.monotonic() - t_all, junit=junit, html=html, bundle=bundle)

    with _stopped(run, finish):
        _start(run, board, port, allow_untested)
        _check_dump_ops(dump_ops, run.info)
        if dataset is not None:
            job = _DatasetJob(
                input_options, reference, builder, cache_dir, arena_kb, limits, flash_baud, native,
                tuple(sorted(set(dump_ops))),
            )  # fmt: skip
            _dataset_job(run, dataset, job, lock_cm, tolerance_lsb, ref_tolerance_lsb)
            return finish()
        if reference:  # ONE host child runs the reference on the inputs and measures the arena;
            # generate, the reference leg and the simulated board read its cached results
            prepare_host_results(run.model, run.inputs, input_options=input_options, per_layer=tap)
        # the inputs are streamed to the resident firmware, never compiled in: a new input rebuilds and
        # reflashes nothing (generate still checks them, before anything is built)
        projects = generate_firmware(
            run.model, run.inputs, run.board, run.out / "projects", rec=run.rec, input_options=input_options,
            arena_kb=arena_kb, features=FirmwareFeatures(tap=tap, embed_inputs=False),
        )  # fmt: skip
        run.streamed = input_tensor_bytes(run.inputs, run.info.inputs[0], input_options)
        ref_source = _host_reference(run, input_options) if reference else None
        fw = build_firmware(
            projects, rec=run.rec, logs_dir=run.out / "logs", builder=builder, cache_dir=cache_dir,
            timeout=limits.build, native=native,
        )  # fmt: skip
        if not _record_builds(run, fw) or not _flash_and_capture_both(run, fw, lock_cm, limits, flash_baud):
            return finish()
        run.comparison = _compare(run, ref_source, tolerance_lsb, ref_tolerance_lsb)
        if tap:
            _tap(run, lock_cm, TapRunRequest(
                run.model, tuple(run.inputs), run.info, run.board, run.port_url, run.out, builder, cache_dir,
                input_options, arena_kb, limits, flash_baud, reference, tuple(sorted(set(dump_ops))), native,
            ))  # fmt: skip
    return finish()


@contextlib.contextmanager
def _stopped(run: _Run, finish: Callable[[], FlashAndCompareResult]) -> Iterator[None]:
    """A run that stops early still writes its report, saying why: a usage error found before any
    hardware (or any EspCheckError that escaped a stage), Ctrl-C or SIGTERM, a full disk (exit 3)."""
    try:
        yield
    except EspCheckError as exc:
        run.failed("stopped", exc)
        finish()
        raise
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (harness.cli turns it into Terminated)
        _interrupted(run, exc)
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


def _refuse_clobbering(
    run: _Run, *, junit: str | Path | None, html: str | Path | None, bundle: str | Path | None
) -> None:
    """--junit/--html/--bundle must not overwrite report.json, a log or project of this run, the model or
    an input, or each other (``--bundle OUT/report.json`` replaced the report with a zip, exit 0)."""
    mine = {run.out / "report.json": "this run's report.json", run.model.resolve(): "the model"}
    mine.update({p.resolve(): "an input" for p in run.inputs})
    taken: dict[Path, str] = {}
    for flag, given in (("--junit", junit), ("--html", html), ("--bundle", bundle)):
        if given is None:
            continue
        path = Path(given).resolve()
        inside = next((d for d in ("logs", "projects") if path.is_relative_to(run.out / d)), None)
        clash = mine.get(path) or taken.get(path) or (f"this run's {inside}/ directory" if inside else None)
        if clash is not None:
            exc = UsageError(f"{flag} {given} would overwrite {clash}", hint=f"give {flag} another path")
            run.failed("stopped", exc)
            _finish(run, 0.0, junit=None, html=None, bundle=None)
            raise exc
        taken[path] = f"the {flag} file"


def _tap(
    run: _Run, lock_cm: Callable[[], contextlib.AbstractContextManager[Any] | None], req: TapRunRequest
) -> None:
    """``--tap``: the tap flow after the comparison (its dump run, timing, culprit)."""
    cm = lock_cm()
    outcome = run.rec.run("tap", None, lambda: run_tap_flow(req, run.variants, rec=run.rec, lock_cm=cm))
    run.tap = outcome.result
    run.errors.extend(outcome.errors)
    run.codes.extend(outcome.codes)


def _interrupted(run: _Run, exc: KeyboardInterrupt) -> None:
    """A run stopped by Ctrl-C (exit 130) or SIGTERM (143): its report says so, never a verdict."""
    how = "SIGTERM" if isinstance(exc, Terminated) else "Ctrl-C"
    run.errors.append(f"interrupted ({how}): the run did not finish")
    run.codes.append(ExitCode.TERMINATED if isinstance(exc, Terminated) else ExitCode.INTERRUPTED)


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


SERVED_SIM_SCHEMES = ("rfc2217://",)  # socket:// cannot reset a served simulator: refused in _start


def _start(run: _Run, board: str | Path, port: str | None, allow_untested: bool = False) -> None:
    """Load the board and model and pick the port (usage errors raise: nothing touched yet).

    A simulated board runs only on a simulator's port: ``sim://`` in this process, or the
    ``rfc2217://`` URL of a served one (never a device path: a tty is real hardware; never raw TCP
    ``socket://``: nothing could reset the board into its app).
    Whether the device is a simulator is then decided by what it prints (BEGIN ``sim=1``), not by the
    URL. A real board's port is checked here, before two builds that take minutes on a fresh machine.
    """
    board_def = run.loaded_board = load_board(board)
    run.loaded_model = load_model(run.model)
    run.espnn = _espnn_coverage(run.loaded_model, board_def.chip)
    if run.espnn["accelerated_ops"] == 0:
        untested = (
            f"ESP-NN accelerates none of this model's {run.espnn['ops']} ops on {board_def.chip} "
            f"({run.espnn['why']}): both variants run the same TFLM kernels, so a match here says "
            "nothing about ESP-NN"
        )
        if not allow_untested:
            raise UsageError(
                untested,
                hint="esp-check inspect MODEL lists what ESP-NN accelerates per chip (an int8 model is "
                "what it accelerates); pass --allow-untested to run it anyway (the verdict then says "
                "ESP-NN NOT TESTED)",
            )
        run.warnings.append(untested)
    if board_def.is_native:
        if port is not None and not port.startswith("native://"):
            raise UsageError(
                f"board {board_def.name} is a native board (the firmware runs as a program on this PC), "
                f"but --port {port} is not a native:// port",
                hint="omit --port (a fresh native board is made), or give native://NAME",
            )
        size = f"?flash={board_def.flash_size}" if board_def.flash_size else ""  # the board's flash
        run.port_url = port or f"native://esp-check-{uuid.uuid4().hex[:10]}{size}"
        run.fresh_sim = port is None  # made for this run alone: nobody else's, no lock
    elif board_def.simulated and port is not None and port.startswith(SERVED_SIM_SCHEMES):
        # a simulator served by `esp-check sim serve` (or esp_rfc2217_server in front of a sim:// port):
        # reached like a remote board; its BEGIN record must say sim=1 (verify_capture checks it)
        run.port_url = port
        ps = run.rec.run("port", None, lambda: resolve_port(port, board_def))
        run.rec.run("port-present", None, lambda: check_present(ps))
    elif board_def.simulated:
        if port is not None:
            refuse_raw_tcp_simulator(port, board_def.name)
        if port is not None and not port.startswith("sim://"):
            raise UsageError(
                f"board {board_def.name} is a simulated board, but --port {port} is not a simulator's port",
                hint="omit --port (a fresh simulated board is made), give a sim://NAME?... URL or the "
                "rfc2217:// URL of `esp-check sim serve --rfc2217`, or name the real board with --board "
                "(esp-check boards lists them)",
            )
        # A fresh simulated board per run (parallel runs never share one), configured like the
        # board file's default port (flash size, ...) unless the user gave a sim:// URL.
        template = port
        if template is None and board_def.default_port and board_def.default_port.startswith("sim://"):
            template = "sim://?" + board_def.default_port.partition("?")[2]
        run.port_url = sim_port_for(board_def.chip, board_def.reset, template, board_def.flash_size)
        run.fresh_sim = port is None
    else:
        if port is not None and port.startswith("sim://"):  # else minutes of real builds, then a failure
            raise UsageError(
                f"board {board_def.name} is a real board, but --port {port} is a simulated board's",
                hint="give the board's serial port (or --port auto), or --board sim for the simulator",
            )
        run.port_url = port or "auto"
        ps = run.rec.run("port", None, lambda: resolve_port(run.port_url, board_def))
        run.rec.run("port-present", None, lambda: check_present(ps))


def _check_dump_ops(dump_ops: Sequence[int], info: ModelInfo) -> None:
    """``--dump-ops`` names ops of this model (refused before anything is built, not after the run)."""
    bad = sorted(i for i in set(dump_ops) if not 0 <= i < len(info.ops))
    if bad:
        raise UsageError(
            f"--dump-ops {','.join(map(str, bad))}: the model has {len(info.ops)} op(s), "
            f"indices 0..{len(info.ops) - 1}",
            hint="esp-check inspect MODEL lists the ops with their indices",
        )


def _espnn_coverage(info: ModelInfo, chip: str) -> dict[str, Any]:
    """How many ops ESP-NN accelerates on ``chip``, and why not when none."""
    accel = espnn_model_acceleration(info, chip)
    k = sum(a.accelerated for a in accel)
    reasons = sorted({a.reason for a in accel if not a.accelerated})
    why = f"{info.kind} model; " + "; ".join(reasons[:3]) if reasons else "no ops"
    return {"chip": chip, "accelerated_ops": k, "ops": len(accel), "why": why if k == 0 else ""}


def _host_reference(run: _Run, input_options: InputOptions | None) -> Source | None:
    """The host reference leg; missing it is a loud warning, not a failure (device vs device stands)."""
    try:
        return run.rec.run(
            "reference",
            None,
            lambda: reference_source(run.model, run.inputs, backend="auto", input_options=input_options),
        )
    except ReferenceRefusedError as exc:  # both variants still run; _finish gives the verdict
        run.refused = exc
        return None
    except EspCheckError as exc:
        if exc.exit_code == ExitCode.USAGE:
            raise
        run.warnings.append(f"host reference unavailable, comparing optimized vs ANSI C only: {exc}")
        return None


def _record_builds(run: _Run, fw: Firmware) -> bool:
    """Copy build facts into the variants; False when a build failed (nothing to flash)."""
    for v, p in fw.projects.items():
        run.variants[v].project_dir = p.path
    for v, b in fw.builds.items():
        run.variants[v].firmware_sha256 = b.firmware_sha256
        run.variants[v].build_cache_hit = b.cache_hit
    for v, exc in fw.failures.items():
        run.failed(f"build {v}", exc)
    return fw.complete


def _flash_and_capture_both(
    run: _Run,
    fw: Firmware,
    lock_cm: Callable[[], contextlib.AbstractContextManager[Any] | None],
    limits: StageTimeouts,
    flash_baud: int | None,
) -> bool:
    """Flash both variants in one session and stream the inputs to each, holding the board's lock."""
    with contextlib.ExitStack() as held:
        try:
            cm = lock_cm()
            if cm is not None:
                run.rec.run("lock", None, lambda: held.enter_context(cm))
        except EspCheckError as exc:
            run.failed("board lock", exc)
            return False
        run.link = run_variants(
            run.rec, run.variants, fw.builds, run.board, run.port_url, run.out, limits, flash_baud,
            run.streamed,
        )  # fmt: skip
        for v in VARIANT_ORDER:
            code = run.variants[v].exit_code
            if code is not None:
                run.codes.append(code)
    return True


@dataclass(frozen=True)
class _DatasetJob:
    input_options: InputOptions | None
    reference: bool
    builder: str | None
    cache_dir: str | Path | None
    arena_kb: int | None
    limits: StageTimeouts
    flash_baud: int | None
    native: NativeOptions | None = None
    dump_ops: tuple[int, ...] = ()


def _dataset_job(
    run: _Run,
    opts: DatasetOptions,
    job: _DatasetJob,
    lock_cm: Callable[[], contextlib.AbstractContextManager[Any] | None],
    tolerance_lsb: float,
    ref_tolerance_lsb: float,
) -> None:
    """Dataset mode: the inputs are loaded (usage errors before anything is built), both variants are
    built with nothing compiled in, flashed once, and the dataset streams through each while the host
    reference runs on all of them; every input gets its verdict."""
    ds = load_inputs(opts, run.info.inputs[0], job.input_options)
    outcome = run.dataset = DatasetOutcome(ds)
    projects = generate_firmware(
        run.model, [], run.board, run.out / "projects", rec=run.rec, input_options=job.input_options,
        arena_kb=job.arena_kb, features=FirmwareFeatures(embed_inputs=False),
    )  # fmt: skip
    fw = build_firmware(
        projects, rec=run.rec, logs_dir=run.out / "logs", builder=job.builder, cache_dir=job.cache_dir,
        timeout=job.limits.build, native=job.native,
    )  # fmt: skip
    if not _record_builds(run, fw):
        return
    outputs = output_specs(run.info)

    def body(rb: ResidentBoard, order: list[str]) -> None:
        outcome.run = run_dataset(
            rb, run.variants, order, ds, outputs, results=opts.results, repeat=opts.repeat, host=outcome.host
        )

    with contextlib.ExitStack() as held:
        host = _start_host_legs(run, ds, job.reference, held)
        try:
            cm = lock_cm()
            if cm is not None:
                run.rec.run("lock", None, lambda: held.enter_context(cm))
        except EspCheckError as exc:
            run.failed("board lock", exc)
            return
        if opts.results != "full":  # crc mode: the device's CRCs are checked against the host's as it streams
            _join_host_legs(run, outcome, host)
        run.link = with_board(
            run.rec,
            run.variants,
            fw.builds,
            run.board,
            run.port_url,
            run.out,
            job.limits,
            job.flash_baud,
            body,
        )
        _join_host_legs(run, outcome, host)
    run.codes += [r.exit_code for r in run.variants.values() if r.exit_code is not None]
    if outcome.run is not None:
        verdicts(outcome, run.variants, outputs, tolerance_lsb, ref_tolerance_lsb)
    run.codes += outcome.codes
    run.errors += outcome.errors
    if opts.tap_inputs and outcome.run is not None:
        _dataset_tap(run, opts, job, lock_cm)


def _start_host_legs(
    run: _Run, ds: Dataset, reference: bool, held: contextlib.ExitStack
) -> HostLegsJob | None:
    """The dataset's host reference, started before the board is locked and flashed: it runs while the
    inputs stream (in full mode it is waited for only before the verdicts). ``held`` kills it if the
    run ends before then."""
    if not reference:
        return None
    job = HostLegsJob(run.model, run.info, ds, run.rec)
    held.callback(job.cancel)
    return job


def _join_host_legs(run: _Run, outcome: DatasetOutcome, host: HostLegsJob | None) -> None:
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


def _dataset_tap(
    run: _Run,
    opts: DatasetOptions,
    job: _DatasetJob,
    lock_cm: Callable[[], contextlib.AbstractContextManager[Any] | None],
) -> None:
    """``--tap-inputs``: the chosen dataset inputs, written as .npy files under ``tap-inputs/``, run
    through a tapped build of both variants (as ``--tap --input`` would) and analysed by the tap flow.
    Its stages are labelled ``tap:``, its artifacts go under ``tap/``; the dataset's verdict stands."""
    outcome = run.dataset
    assert outcome is not None
    picks = pick_tap_inputs(outcome, opts.tap_inputs)
    outcome.tap_inputs = write_tap_inputs(outcome.dataset, picks, run.info.inputs[0], run.out / "tap-inputs")
    if not picks:
        return
    paths = [Path(d["file"]) for d in outcome.tap_inputs]
    sub = _Run(run.model, paths, run.out / "tap", Recorder(run.rec.progress), run.loaded_board,
               run.loaded_model, run.port_url, run.fresh_sim)  # fmt: skip
    try:
        if job.reference:
            prepare_host_results(run.model, paths, per_layer=True)
        projects = generate_firmware(
            run.model, paths, run.board, sub.out / "projects", rec=sub.rec, arena_kb=job.arena_kb,
            features=FirmwareFeatures(tap=True, embed_inputs=False),
        )  # fmt: skip
        sub.streamed = input_tensor_bytes(paths, run.info.inputs[0], None)
        fw = build_firmware(
            projects, rec=sub.rec, logs_dir=sub.out / "logs", builder=job.builder, cache_dir=job.cache_dir,
            timeout=job.limits.build, native=job.native,
        )  # fmt: skip
        if _record_builds(sub, fw) and _flash_and_capture_both(sub, fw, lock_cm, job.limits, job.flash_baud):
            req = TapRunRequest(
                run.model, tuple(paths), run.info, run.board, run.port_url, sub.out, job.builder,
                job.cache_dir, None, job.arena_kb, job.limits, job.flash_baud, job.reference,
                job.dump_ops, job.native,
            )  # fmt: skip
            tapped = sub.rec.run(
                "tap", None, lambda: run_tap_flow(req, sub.variants, rec=sub.rec, lock_cm=lock_cm())
            )
            run.tap = tapped.result
            sub.errors += tapped.errors
            sub.codes += tapped.codes
    except EspCheckError as exc:
        sub.failed("tap run", exc)
    finally:
        for s in sub.rec.stages:
            s.stage = f"tap:{s.stage}"
        run.rec.stages.extend(sub.rec.stages)
        run.errors += [f"tap run: {e}" for e in sub.errors]
        run.codes += sub.codes


def _board_lock(
    run: _Run, lock_dir: str | Path | None, timeout: float
) -> contextlib.AbstractContextManager[Any]:
    """The lock ``esp-check run`` takes for the same board (a port that does not resolve: no lock)."""
    try:
        ps = resolve_port(run.port_url, run.board)
    except EspCheckError:
        return contextlib.nullcontext()  # the port stage reports it
    return board_lock(
        ps,
        lock_dir=lock_dir,
        timeout=timeout,
        owner="esp-check flash-and-compare",
        on_wait=lambda msg: run.rec.say("lock", msg),
    )


def _native_facts(run: _Run) -> dict[str, Any] | None:
    """What a native board's results mean, and what each variant's program said it was (INFO)."""
    if run.loaded_board is None or not run.loaded_board.is_native:
        return None
    keys = ("native", "native_bits", "native_sanitize", "idf", "tflm", "tflm_from", "espnn", "espnn_from")
    reported = {
        v: {k: vr.source.info.get(k) for k in keys} for v, vr in run.variants.items() if vr.source is not None
    }
    return {"meaning": NATIVE_MEANING, "bits": run.loaded_board.native_bits, "reported": reported}


def _compare(
    run: _Run, ref_source: Source | None, tolerance_lsb: float, ref_tolerance_lsb: float
) -> CompareResult | None:
    """What the device printed, compared (compare_variants decides which legs there are)."""
    opt, ansi = run.variants["optimized"].source, run.variants["ansi"].source
    if (opt is None or ansi is None) and (ref_source is None or (opt is None and ansi is None)):
        return None
    try:
        result = run.rec.run(
            "compare",
            None,
            lambda: compare_variants(
                opt, ansi, ref_source, tolerance_lsb=tolerance_lsb, ref_tolerance_lsb=ref_tolerance_lsb,
                output_quant=output_quant(run.info.outputs),
            ),
        )  # fmt: skip
    except EspCheckError as exc:
        run.failed("compare", exc)
        return None
    if result is not None:
        run.codes.append(result.exit_code)
    return result


def _finish(
    run: _Run,
    seconds: float,
    *,
    junit: str | Path | None,
    html: str | Path | None,
    bundle: str | Path | None,
) -> FlashAndCompareResult:
    """The result, with report.json always written (and JUnit/HTML/bundle when asked for)."""
    refused = None if run.refused is None else refusal_finding(run.refused, run.variants, run.comparison)
    if refused is not None:
        run.errors.append(refused["summary"])
        run.codes.append(ExitCode(refused["exit_code"]))
    result = FlashAndCompareResult(
        out_dir=run.out,
        board=run.loaded_board.name if run.loaded_board else "",
        port=run.port_url,
        simulated=bool(run.loaded_board and run.loaded_board.simulated),
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
        native=_native_facts(run),
        reference_refused=refused,
    )
    write_report(result, model=run.model, inputs=run.inputs, seconds=seconds)
    if html is not None or bundle is not None:
        from harness.analysis.html_report import write_outputs

        tapped = [Path(d["file"]) for d in (run.dataset.tap_inputs or [])] if run.dataset else []
        # a dataset run's bundle carries the inputs it tapped (the dataset itself stays where it is)
        write_outputs(result, model=run.model, inputs=run.inputs or tapped, html=html, bundle=bundle)
    if junit is not None:
        write_junit(result, Path(junit))
    return result


__all__ = [
    "FlashAndCompareResult",
    "StageRecord",
    "StageTimeouts",
    "VariantRun",
    "flash_and_capture",
    "flash_and_compare",
    "sim_port_for",
]
