"""Flash one built variant, capture its run, and decide what the capture is worth.

The single flash-and-capture path: flash-and-compare, its ``--tap`` dump run and the CI runner all
come through :func:`flash_and_capture`, which drives one :class:`harness.device.session.DeviceSession`
(one open handle from flash to capture, re-opened after USB re-enumeration and always closed).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.analysis.classify import Finding, Severity, classify
from harness.analysis.compare import source_from_capture
from harness.device.console import RawCapture
from harness.device.flash import FlashResult
from harness.device.session import DeviceSession
from harness.errors import EspCheckError, ExitCode
from harness.firmware.backtrace import decode_findings
from harness.firmware.boards import Board
from harness.firmware.build import BuildResult
from harness.flows.records import EXPECTED_NN, ProgressFn, Recorder, StageRecord, StageTimeouts, VariantRun
from harness.protocol.capture import Capture, parse_capture


def flash_and_capture(
    build: BuildResult,
    board: Board,
    port_url: str,
    out_dir: Path,
    *,
    variant: str,
    timeouts: StageTimeouts | None = None,
    flash_baud: int | None = None,
    progress: ProgressFn | None = None,
) -> tuple[VariantRun, list[StageRecord]]:
    """Flash one built variant to the board at ``port_url``, capture and verify its run.

    The returned VariantRun has ``source`` (the device's outputs) only when its own records
    validated and it reported the ESP-NN mode this variant was built for; otherwise ``exit_code``
    says why. Logs go to ``out_dir/logs/{flash,serial}-<variant>.log``.
    """
    rec = Recorder(progress)
    run = VariantRun(variant, project_dir=build.project_dir)
    run.firmware_sha256 = build.firmware_sha256
    run.build_cache_hit = build.cache_hit
    run.exit_code = run_variant(rec, run, build, board, port_url, Path(out_dir), timeouts, flash_baud)
    return run, rec.stages


def run_variant(
    rec: Recorder,
    run: VariantRun,
    build: BuildResult,
    board: Board,
    port_url: str,
    out: Path,
    limits: StageTimeouts | None = None,
    flash_baud: int | None = None,
) -> ExitCode | None:
    """Flash and capture one variant into ``run``; returns the exit code its failure implies."""
    limits = limits or StageTimeouts()
    if port_url.startswith("sim://"):
        from harness.sim import register  # the pyserial URL handler for the simulated board

        register()
    v = run.variant
    try:
        dev = rec.run("port", v, lambda: DeviceSession(port_url, board, flash_baud=flash_baud))
        rec.run("open", v, dev.open)
    except EspCheckError as exc:
        return exc.exit_code
    try:
        fr = rec.run(
            "flash", v, lambda: dev.flash(build.flash_files(), log_path=out / "logs" / f"flash-{v}.log")
        )
        run.flash = flash_facts(fr)
        log_path = out / "logs" / f"serial-{v}.log"
        log_path.unlink(missing_ok=True)
        run.serial_log = log_path
        raw = rec.run(
            "capture",
            v,
            lambda: dev.capture(
                log_path, total_timeout=limits.capture_total, silence_timeout=limits.capture_silence
            ),
        )
    except EspCheckError as exc:
        return exc.exit_code
    finally:
        with contextlib.suppress(Exception):  # closing a dead port must not hide the real outcome
            dev.close()
    return verify_capture(
        rec, run, raw, log_path, elf=build.elf, chip=build.chip, simulated_board=board.simulated
    )


def flash_facts(fr: FlashResult) -> dict[str, Any]:
    """What report.json says about one flash: chip, revision, MAC, bytes written per region."""
    return {
        "chip": fr.chip,
        "revision": fr.revision,
        "mac": fr.mac,
        "regions": [
            {"offset": r.offset, "size": r.size, "skipped": r.skipped, "bytes_written": r.bytes_written}
            for r in fr.regions
        ],
        "seconds": round(fr.duration_s, 3),
    }


def verify_capture(
    rec: Recorder,
    run: VariantRun,
    raw: RawCapture,
    log_path: Path,
    *,
    elf: Path | None = None,
    chip: str = "",
    simulated_board: bool | None = None,
) -> ExitCode | None:
    """Parse and classify what the device printed; keep its outputs only when they are evidence.

    Crash findings get their code addresses decoded with the build's ELF (or say why they were not).
    """
    t0 = time.monotonic()
    cap = parse_capture(raw.data)
    findings = decode_findings(classify(raw.data, ended_by=raw.ended_by, parsed=cap), elf, chip)
    run.findings = [f.to_dict() for f in findings]
    run.nn_mode = cap.nn_mode
    run.problems = list(cap.problems)
    code, detail, keep = verdict_evidence(run.variant, cap, findings, raw.ended_by, simulated_board)
    if keep:
        run.source = source_from_capture(cap, run.variant, str(log_path), raw.data)
        run.capture_valid = True
    rec.add("verify", run.variant, code, time.monotonic() - t0, detail)
    return code


def verdict_evidence(
    variant: str,
    cap: Capture,
    findings: Sequence[Finding],
    ended_by: str,
    simulated_board: bool | None = None,
) -> tuple[ExitCode | None, str, bool]:
    """What one variant's capture is worth: (exit code or None, detail, keep its outputs as a source).

    Order matters: a device that says it is not what the board definition is (a simulator behind a
    real board's name, or real hardware behind a simulated board's: BEGIN ``sim=``) is a usage error
    whatever else it printed; a firmware fault is a finding even in a broken capture; an invalid
    capture is never a result; a valid one beside an infrastructure finding is kept as evidence but is
    never a clean match; a firmware that does not report the ESP-NN mode it was built for proves nothing.
    """
    if simulated_board is not None and cap.begin and cap.simulated != simulated_board:
        said = "a simulator (BEGIN sim=1)" if cap.simulated else "real hardware (BEGIN without sim=1)"
        board = "a simulated board" if simulated_board else "a real board"
        return (
            ExitCode.USAGE,
            f"the device on the port reports it is {said}, but --board names {board}: its results are "
            "not what the report would call them",
            False,
        )
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
