"""``flash-and-compare``: generate both variants, build, flash, capture, compare, report.

Every stage is recorded (status, time, error) and the artifact directory is written even when a stage
fails, so nothing is lost. The verdict rests only on what the device printed: CRC-checked records,
its compiled-in ESP-NN mode, and the model/input hashes it computed.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import __version__
from harness.errors import (
    EspCheckError,
    ExitCode,
    IncomparableError,
    combine_exit_codes,
)

# variant name in generated projects -> the ESP-NN mode the firmware must report (INFO nn=...)
EXPECTED_NN = {"optimized": "optimized", "ansi": "ansi_c"}
VARIANT_ORDER = ("optimized", "ansi")

ProgressFn = Callable[[str, str], None]  # (stage, message)


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
    status: str  # ok | failed | skipped
    seconds: float
    detail: str = ""
    exit_code: int | None = None
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class VariantRun:
    """Everything one variant produced; kept even when a stage failed."""

    variant: str
    project_dir: Path | None = None
    firmware_sha256: str | None = None
    build_cache_hit: bool | None = None
    flash: dict[str, Any] | None = None
    serial_log: Path | None = None
    capture_valid: bool = False
    nn_mode: str | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)
    source: Any | None = None  # harness.analysis.compare.Source when the capture was valid
    problems: list[str] = field(default_factory=list)
    exit_code: ExitCode | None = None  # what this variant's failure implies; None when it ran cleanly


@dataclass
class FlashAndCompareResult:
    """The outcome of one ``flash-and-compare`` run."""

    out_dir: Path
    board: str
    port: str
    simulated: bool
    stages: list[StageRecord]
    variants: dict[str, VariantRun]
    comparison: Any | None  # harness.analysis.compare.CompareResult
    exit_code: ExitCode
    report_path: Path
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    tap: Any | None = None  # harness.analysis.tap.TapResult with --tap

    @property
    def verdict(self) -> str:
        return {
            ExitCode.MATCH: "match",
            ExitCode.MISMATCH: "mismatch",
            ExitCode.USAGE: "usage_error",
            ExitCode.INFRASTRUCTURE: "infrastructure_error",
            ExitCode.FIRMWARE_FAULT: "firmware_fault",
        }.get(self.exit_code, "internal_error")


def sim_port_for(board_chip: str, reset: str, port: str | None) -> str:
    """A ``sim://`` URL with a fresh board name unless the user named one (one run, one board)."""
    from urllib.parse import urlsplit, urlunsplit

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
    query = "&".join([q for q in [query, *extra] if q])
    return urlunsplit(("sim", name, "", query, ""))


class _Recorder:
    """Collects stage records and forwards progress events."""

    def __init__(self, progress: ProgressFn | None) -> None:
        self.stages: list[StageRecord] = []
        self.progress = progress

    def say(self, stage: str, message: str) -> None:
        if self.progress is not None:
            self.progress(stage, message)

    def run(self, stage: str, variant: str | None, fn: Callable[[], Any]) -> Any:
        label = f"{stage} [{variant}]" if variant else stage
        self.say(label, "started")
        t0 = time.monotonic()
        try:
            value = fn()
        except EspCheckError as exc:
            rec = StageRecord(stage, variant, "failed", time.monotonic() - t0, str(exc), int(exc.exit_code))
            self.stages.append(rec)
            self.say(label, f"failed: {exc.message}")
            raise
        self.stages.append(StageRecord(stage, variant, "ok", time.monotonic() - t0))
        self.say(label, f"done in {time.monotonic() - t0:.1f} s")
        return value


def flash_and_compare(
    model: str | Path,
    inputs: Sequence[str | Path],
    *,
    board: str | Path = "sim",
    port: str | None = None,
    out_dir: str | Path = "esp-check-out",
    input_options: Any | None = None,
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
) -> FlashAndCompareResult:
    """Run the whole job and return its result; the report is always written to ``out_dir``.

    Usage errors found before any hardware is touched (bad model, bad input, unknown board) are
    raised; failures after that are recorded per stage and decide the exit code.

    With ``lock`` (default) the board's cross-process lock (harness.device.locks, keyed on its USB
    serial number / server host:port / sim name, in ``lock_dir`` or the default lock directory) is
    held while flashing and capturing, so a CI runner and this call never share a board; a board
    still busy after ``lock_timeout`` seconds is an infrastructure error (exit 3).
    """
    from harness.firmware.boards import load_board
    from harness.model.loader import load_model

    t_all = time.monotonic()
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    limits = timeouts or StageTimeouts()
    rec = _Recorder(progress)
    board_def = load_board(board)
    info = load_model(model)
    simulated = bool(getattr(board_def, "simulated", False))
    if simulated:
        # A fresh simulated board per run (parallel runs never share one), configured like the
        # board file's default port (flash size, ...) unless the user gave a sim:// URL.
        template = port
        if template is None and board_def.default_port and board_def.default_port.startswith("sim://"):
            template = "sim://?" + board_def.default_port.partition("?")[2]
        port_url = sim_port_for(board_def.chip, board_def.reset, template)
    elif port is None:
        port_url = "auto"
    else:
        port_url = port
    variants = {v: VariantRun(v) for v in VARIANT_ORDER}
    errors: list[str] = []
    warnings: list[str] = []
    codes: list[ExitCode] = []
    comparison = None
    tap_result: Any | None = None

    def finish() -> FlashAndCompareResult:
        code = combine_exit_codes(codes) if codes else ExitCode.INFRASTRUCTURE
        result = FlashAndCompareResult(
            out_dir=out,
            board=board_def.name,
            port=port_url,
            simulated=simulated,
            stages=rec.stages,
            variants=variants,
            comparison=comparison,
            exit_code=code,
            report_path=out / "report.json",
            errors=errors,
            warnings=warnings,
            tap=tap_result,
        )
        _write_report(
            result, model=Path(model), inputs=[Path(p) for p in inputs], seconds=time.monotonic() - t_all
        )
        if html is not None or bundle is not None:
            from harness.analysis.html_report import write_outputs

            write_outputs(
                result, model=Path(model), inputs=[Path(p) for p in inputs], html=html, bundle=bundle
            )
        if junit is not None:
            _write_junit(result, Path(junit))
        return result

    # 1. generate (usage errors propagate: nothing to flash yet)
    from harness.firmware.generate import generate_projects

    projects = rec.run(
        "generate",
        None,
        lambda: generate_projects(
            model,
            list(inputs),
            board_def,
            out_dir=out / "projects",
            input_options=input_options,
            arena_kb=arena_kb,
            tap=tap,
        ),
    )
    by_variant = {p.variant: p for p in projects}
    for v, p in by_variant.items():
        variants[v].project_dir = p.path

    # 2. host reference (optional third leg)
    ref_source = None
    if reference:
        from harness.analysis.compare import reference_source

        try:
            ref_source = rec.run(
                "reference",
                None,
                lambda: reference_source(model, list(inputs), backend="auto", input_options=input_options),
            )
        except EspCheckError as exc:
            if exc.exit_code == ExitCode.USAGE:
                raise
            # The device-vs-device comparison still stands on its own; say loudly what is missing.
            warnings.append(f"host reference unavailable, comparing optimized vs ANSI C only: {exc}")

    # 3. build both
    from harness.firmware.build import build_project

    builds: dict[str, Any] = {}
    for v in VARIANT_ORDER:
        project_dir: Path = by_variant[v].path

        def do_build(project_dir: Path = project_dir, v: str = v) -> Any:
            return build_project(
                project_dir,
                builder=builder,
                cache_dir=cache_dir,
                log_path=out / "logs" / f"build-{v}.log",
                timeout=limits.build,
            )

        try:
            b = rec.run("build", v, do_build)
        except EspCheckError as exc:
            errors.append(f"build {v}: {exc}")
            codes.append(exc.exit_code)
            continue
        builds[v] = b
        variants[v].firmware_sha256 = b.firmware_sha256
        variants[v].build_cache_hit = b.cache_hit
    if len(builds) == 2 and builds["optimized"].firmware_sha256 == builds["ansi"].firmware_sha256:
        raise IncomparableError(
            "the optimized and ANSI C builds produced byte-identical firmware: the ESP-NN setting did "
            "not reach the build",
            hint="delete the stale sdkconfig.<env> / sdkconfig in both projects and build again",
        )
    if len(builds) < 2:
        return finish()

    # 4. flash + capture each variant on the same board, one after the other, holding its lock
    with contextlib.ExitStack() as held:
        if lock and not (simulated and port is None):  # a fresh simulated board is nobody else's
            try:
                cm = _board_lock(port_url, board_def, lock_dir, lock_timeout, rec)
                rec.run("lock", None, lambda: held.enter_context(cm))
            except EspCheckError as exc:
                errors.append(f"board lock: {exc}")
                codes.append(exc.exit_code)
                return finish()
        for v in VARIANT_ORDER:
            code = _run_variant(rec, variants[v], builds[v], board_def, port_url, out, limits, flash_baud)
            variants[v].exit_code = code
            if code is not None:
                codes.append(code)

    # 5. compare what the device printed
    comparison = _compare(rec, variants, ref_source, info, tolerance_lsb, ref_tolerance_lsb, errors, codes)
    if tap:  # 6. which op went wrong: per-op checksums, then a second run dumping the culprit
        from harness.analysis.tap import run_tap_flow

        tap_lock = (
            _board_lock(port_url, board_def, lock_dir, lock_timeout, rec)
            if lock and not (simulated and port is None)  # same rule as step 4
            else contextlib.nullcontext()
        )
        tap_result, tap_errors, tap_codes = rec.run(
            "tap",
            None,
            lambda: run_tap_flow(
                model_path=model, input_paths=list(inputs), model=info, board_def=board_def,
                variants=variants, port_url=port_url, out=out, builder=builder, cache_dir=cache_dir,
                input_options=input_options, arena_kb=arena_kb, limits=limits, flash_baud=flash_baud,
                reference=reference, lock_cm=tap_lock, say=rec.say, extra_dump_ops=list(dump_ops),
            ),
        )  # fmt: skip
        errors.extend(tap_errors)
        codes.extend(ExitCode(c) for c in tap_codes)
    return finish()


def _board_lock(
    port_url: str, board: Any, lock_dir: str | Path | None, timeout: float, rec: _Recorder
) -> contextlib.AbstractContextManager[Any]:
    """The lock ``esp-check run`` takes for the same board (a port that does not resolve: no lock)."""
    from harness.device.locks import board_lock
    from harness.device.ports import resolve_port

    try:
        ps = resolve_port(port_url, board)
    except EspCheckError:
        return contextlib.nullcontext()  # the port stage reports it
    return board_lock(
        ps,
        lock_dir=lock_dir,
        timeout=timeout,
        owner="esp-check flash-and-compare",
        on_wait=lambda msg: rec.say("lock", msg),
    )


def flash_and_capture(
    build: Any,
    board: Any,
    port_url: str,
    out_dir: Path,
    *,
    variant: str,
    timeouts: StageTimeouts | None = None,
    flash_baud: int | None = None,
    progress: ProgressFn | None = None,
) -> tuple[VariantRun, list[StageRecord]]:
    """Flash one built variant to the board at ``port_url``, capture and verify its run.

    The building block the CI runner shares with ``flash-and-compare``: the returned VariantRun has
    ``source`` (a comparable harness.analysis.compare.Source) only when the device's own records validated
    and it reported the ESP-NN mode this variant was built for; otherwise ``exit_code`` says why.
    """
    rec = _Recorder(progress)
    run = VariantRun(variant, project_dir=getattr(build, "project_dir", None))
    run.firmware_sha256 = getattr(build, "firmware_sha256", None)
    run.build_cache_hit = getattr(build, "cache_hit", None)
    run.exit_code = _run_variant(
        rec, run, build, board, port_url, Path(out_dir), timeouts or StageTimeouts(), flash_baud
    )
    return run, rec.stages


def _run_variant(
    rec: _Recorder,
    run: VariantRun,
    build: Any,
    board: Any,
    port_url: str,
    out: Path,
    limits: StageTimeouts,
    flash_baud: int | None,
) -> ExitCode | None:
    """Flash and capture one variant; returns the exit code its failure implies (None if fine)."""
    from harness.analysis.classify import classify
    from harness.analysis.compare import source_from_capture
    from harness.device.console import capture_run
    from harness.device.flash import flash_artifacts
    from harness.device.ports import open_port, reopen_after_reenumeration, resolve_port
    from harness.protocol.capture import parse_capture

    if port_url.startswith("sim://"):
        from harness.sim import register

        register()
    v = run.variant
    try:
        ps = rec.run("port", v, lambda: resolve_port(port_url, board))
        ser = rec.run("open", v, lambda: open_port(ps, 115200))
    except EspCheckError as exc:
        return exc.exit_code
    try:
        try:
            fr = rec.run(
                "flash",
                v,
                lambda: flash_artifacts(
                    ser,
                    build.flash_files(),
                    expected_chip=board.chip,
                    chip_revisions=getattr(board, "chip_revisions", None),
                    baud=flash_baud or board.flash_baud,
                    after="no-reset",
                    reset_style=board.reset,
                    log_path=out / "logs" / f"flash-{v}.log",
                    port_spec=ps,
                ),
            )
        except EspCheckError as exc:
            return exc.exit_code
        run.flash = {
            "chip": fr.chip,
            "revision": fr.revision,
            "mac": fr.mac,
            "regions": [
                {"offset": r.offset, "size": r.size, "skipped": r.skipped, "bytes_written": r.bytes_written}
                for r in fr.regions
            ],
            "seconds": round(fr.duration_s, 3),
        }
        reopen = None
        if board.reset == "usb_serial_jtag":

            def reopen() -> Any:
                return reopen_after_reenumeration(ps, board.monitor_baud)

        log_path = out / "logs" / f"serial-{v}.log"
        if log_path.exists():
            log_path.unlink()
        run.serial_log = log_path
        try:
            raw = rec.run(
                "capture",
                v,
                lambda: capture_run(
                    ser,
                    log_path=log_path,
                    reset=board.reset,
                    baud=board.monitor_baud,
                    caps=ps.caps,
                    total_timeout=limits.capture_total,
                    silence_timeout=limits.capture_silence,
                    reopen=reopen,
                ),
            )
        except EspCheckError as exc:
            return exc.exit_code
    finally:
        # closing a dead port must not hide the real outcome
        with contextlib.suppress(Exception):
            ser.close()

    t0 = time.monotonic()
    cap = parse_capture(raw.data)
    findings = classify(raw.data, ended_by=raw.ended_by, parsed=cap)
    run.findings = [f.to_dict() for f in findings]
    run.nn_mode = cap.nn_mode
    run.problems = list(cap.problems)
    code, detail, keep = _verdict_evidence(v, cap, findings, raw.ended_by)
    if keep:
        run.source = source_from_capture(cap, v, str(log_path), raw.data)
        run.capture_valid = True
    status = "ok" if code is None else "failed"
    rec.stages.append(
        StageRecord("verify", v, status, time.monotonic() - t0, detail, None if code is None else int(code))
    )
    return code


def _verdict_evidence(
    variant: str, cap: Any, findings: Sequence[Any], ended_by: str
) -> tuple[ExitCode | None, str, bool]:
    """What one variant's capture is worth: (exit code or None, detail, keep its outputs as a source).

    Order matters: a firmware fault is a finding even in a broken capture; an invalid capture is never
    a result; a valid one beside an infrastructure finding is kept as evidence but is never a clean
    match; a firmware that does not report the ESP-NN mode it was built for proves nothing.
    """
    from harness.analysis.classify import Severity

    faults = [f for f in findings if f.severity == Severity.FIRMWARE_FAULT]
    if faults or cap.errors:
        msg = "; ".join(f.message for f in faults) or "; ".join(f"{e.stage}: {e.msg}" for e in cap.errors)
        # a clean ERROR record keeps the source so the fault is reported with it
        return ExitCode.FIRMWARE_FAULT, f"firmware fault: {msg}", bool(cap.valid)
    if not cap.valid:  # corrupted or truncated capture (CaptureError)
        return ExitCode.INFRASTRUCTURE, "; ".join(cap.problems) or f"capture ended by {ended_by}", False
    infra = [f for f in findings if f.severity == Severity.INFRASTRUCTURE]
    if infra:  # records validated, yet the board browned out / rebooted / lost data around them
        return ExitCode.INFRASTRUCTURE, "; ".join(f.message for f in infra), True
    expected = EXPECTED_NN[variant]
    if cap.nn_mode != expected:
        return (
            ExitCode.USAGE,
            f"the {variant} firmware reports ESP-NN mode {cap.nn_mode!r}, expected {expected!r}",
            False,
        )
    return None, f"nn={cap.nn_mode}", True


def _compare(
    rec: _Recorder,
    variants: dict[str, VariantRun],
    ref_source: Any | None,
    info: Any,
    tolerance_lsb: float,
    ref_tolerance_lsb: float,
    errors: list[str],
    codes: list[ExitCode],
) -> Any | None:
    from harness.analysis.compare import compare_sources

    quant = [(t.scale, t.zero_point, t.dtype) if t.scale else (None, None, t.dtype) for t in info.outputs]
    a, b = variants["optimized"].source, variants["ansi"].source
    try:
        if a is not None and b is not None:
            result = rec.run(
                "compare",
                None,
                lambda: compare_sources(
                    a,
                    b,
                    ref_source,
                    tolerance_lsb=tolerance_lsb,
                    ref_tolerance_lsb=ref_tolerance_lsb,
                    output_quant=quant,
                ),
            )
        elif (a is not None or b is not None) and ref_source is not None:
            only = a if a is not None else b
            assert only is not None
            result = rec.run(
                "compare",
                None,
                lambda: compare_sources(
                    only, ref_source, None, tolerance_lsb=ref_tolerance_lsb, output_quant=quant
                ),
            )
        else:
            return None
    except EspCheckError as exc:
        errors.append(f"compare: {exc}")
        codes.append(exc.exit_code)
        return None
    codes.append(result.exit_code)
    return result


# ---- reports -------------------------------------------------------------------------------------


def result_dict(
    result: FlashAndCompareResult, *, model: Path, inputs: Sequence[Path], seconds: float
) -> dict[str, Any]:
    """The JSON report (``report.json``); schema: docs/flash-and-compare-schema.json."""
    from harness.analysis.compare import results_document
    from harness.analysis.report import report_dict

    return {
        "schema": "esp-check/flash-and-compare",
        "schema_version": 1,
        "tool_version": __version__,
        "verdict": result.verdict,
        "exit_code": int(result.exit_code),
        "simulated": result.simulated,
        "board": result.board,
        "port": result.port,
        "model": str(model),
        "inputs": [str(p) for p in inputs],
        "seconds": round(seconds, 3),
        "errors": result.errors,
        "warnings": result.warnings,
        "stages": [
            {
                "stage": s.stage,
                "variant": s.variant,
                "status": s.status,
                "seconds": round(s.seconds, 3),
                "detail": s.detail,
                "exit_code": s.exit_code,
            }
            for s in result.stages
        ],
        "variants": {
            v: {
                "project_dir": str(r.project_dir) if r.project_dir else None,
                "firmware_sha256": r.firmware_sha256,
                "build_cache_hit": r.build_cache_hit,
                "flash": r.flash,
                "serial_log": str(r.serial_log) if r.serial_log else None,
                "capture_valid": r.capture_valid,
                "nn_mode": r.nn_mode,
                "problems": r.problems,
                "findings": r.findings,
                "results": results_document(r.source) if r.source is not None else None,
            }
            for v, r in result.variants.items()
        },
        "comparison": report_dict(result.comparison) if result.comparison is not None else None,
        "tap": result.tap.to_dict() if result.tap is not None else None,
    }


def _write_report(
    result: FlashAndCompareResult, *, model: Path, inputs: Sequence[Path], seconds: float
) -> None:
    doc = result_dict(result, model=model, inputs=inputs, seconds=seconds)
    tmp = result.report_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")
    tmp.replace(result.report_path)


def _write_junit(result: FlashAndCompareResult, path: Path) -> None:
    """The comparison's testcases plus one per variant that did not run cleanly (crash, no capture)."""
    import xml.etree.ElementTree as ET

    from harness.analysis.report import junit_error_tree, junit_tree, write_junit

    logs = {
        v: r.serial_log.read_bytes()
        for v, r in result.variants.items()
        if r.serial_log and r.serial_log.exists()
    }
    if result.comparison is not None:
        tree = junit_tree(result.comparison)
    else:
        kind = "failure" if result.exit_code == ExitCode.FIRMWARE_FAULT else "error"
        tree = junit_error_tree("; ".join(result.errors) or result.verdict, kind, logs)
    root = tree.getroot()
    assert root is not None
    suite = root.find("testsuite")
    assert suite is not None
    for v, r in result.variants.items():
        if r.exit_code is None:
            continue
        failed = [s for s in result.stages if s.variant == v and s.status == "failed"]
        message = "; ".join(s.detail for s in failed) or f"{v} did not run cleanly"
        case = ET.SubElement(suite, "testcase", classname=f"esp-check.device.{v}", name="run", time="0")
        tag = "failure" if r.exit_code == ExitCode.FIRMWARE_FAULT else "error"
        kind = {ExitCode.FIRMWARE_FAULT: "firmware_fault", ExitCode.USAGE: "usage"}.get(
            r.exit_code, "infrastructure"
        )
        el = ET.SubElement(case, tag, message=message.splitlines()[0][:500], type=kind)
        el.text = message
        log = logs.get(v, b"").decode("utf-8", "replace")
        ET.SubElement(case, "system-out").text = "".join(ch for ch in log if ch in "\t\n\r" or ch >= " ")
    cases = suite.findall("testcase")
    for counted in (suite, root):
        counted.set("tests", str(len(cases)))
        counted.set("failures", str(sum(1 for c in cases if c.find("failure") is not None)))
        counted.set("errors", str(sum(1 for c in cases if c.find("error") is not None)))
    ET.indent(root)
    write_junit(tree, path)


__all__ = [
    "FlashAndCompareResult",
    "StageRecord",
    "StageTimeouts",
    "VariantRun",
    "flash_and_capture",
    "flash_and_compare",
    "sim_port_for",
]
