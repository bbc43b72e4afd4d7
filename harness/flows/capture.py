"""Flash built variants, stream the inputs to the resident firmware, and decide what each capture is worth.

The one flash-and-capture path, over one :class:`harness.device.session.DeviceSession`; who comes
through it: docs/architecture.md "The pipeline: one job spec, one path".
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from harness.analysis.classify import Finding, Severity, classify
from harness.analysis.compare import source_from_capture
from harness.device.console import RawCapture
from harness.device.loop import LinkStats
from harness.device.session import DeviceSession
from harness.errors import EspCheckError, ExitCode
from harness.firmware.backtrace import decode_findings
from harness.firmware.build import BuildResult
from harness.flashfmt.partitions import VARIANTS
from harness.flows.records import (
    ProgressFn,
    Recorder,
    StageRecord,
    StageTimeouts,
    VariantRun,
)
from harness.flows.resident import Boot, ResidentBoard, flash_facts
from harness.flows.targets import Target
from harness.manifest import NN_EXPECTED
from harness.protocol.capture import Capture, parse_capture

Body = Callable[[ResidentBoard, list[str]], None]  # what runs on the board once it is flashed and booted


def flash_and_capture(
    build: BuildResult,
    target: Target,
    out_dir: Path,
    *,
    variant: str,
    inputs: Sequence[bytes] = (),
    timeouts: StageTimeouts | None = None,
    flash_baud: int | None = None,
    progress: ProgressFn | None = None,
) -> tuple[VariantRun, list[StageRecord]]:
    """Flash one built variant to ``target``, stream ``inputs`` to it, verify its run.

    The returned VariantRun has ``source`` (the device's outputs) only when its own records
    validated and it reported the ESP-NN mode this variant was built for; otherwise ``exit_code``
    says why. Logs go to ``out_dir/logs/{flash,serial}-<variant>.log``.
    """
    rec = Recorder(progress)
    run = VariantRun(variant, build.project_dir, build.firmware_sha256, build.cache_hit)
    with_board(
        rec, {variant: run}, {variant: build}, target=target, out=Path(out_dir), limits=timeouts,
        flash_baud=flash_baud, body=streaming({variant: run}, inputs),
    )  # fmt: skip
    return run, rec.stages


def with_board(
    rec: Recorder,
    runs: Mapping[str, VariantRun],
    builds: Mapping[str, BuildResult],
    *,
    target: Target,
    out: Path,
    limits: StageTimeouts | None,
    flash_baud: int | None,
    body: Body,
) -> LinkStats | None:
    """Open the board, flash what differs, boot once, then ``body(board, variants in run order)``."""
    limits = limits or StageTimeouts()
    target.prepare()
    try:
        url, board = target.port_url, target.board
        dev = rec.run("port", None, lambda: DeviceSession(url, board, flash_baud=flash_baud))
        rec.run("open", None, dev.open)
    except EspCheckError as exc:
        for r in runs.values():
            r.exit_code = exc.exit_code
        return None
    resident = ResidentBoard(rec, dev, builds, limits, target.expects_sim)
    try:
        order = _prepare_board(resident, runs, out)
        if order is not None:
            body(resident, order)
    finally:
        with contextlib.suppress(Exception):  # closing a dead port must not hide the real outcome
            dev.close()
    return resident.link


def _prepare_board(resident: ResidentBoard, runs: Mapping[str, VariantRun], out: Path) -> list[str] | None:
    """Flash, boot once, and return the variants in run order (the one that booted first: one slot
    switch less); None when the flash or the first boot failed (each run's exit code says why)."""
    logs = out / "logs"
    try:
        facts = flash_facts(resident.flash(logs / "flash.log"), resident.builds)
        for r in runs.values():
            r.flash = facts
            log = logs / f"serial-{r.variant}.log"
            log.unlink(missing_ok=True)
            r.serial_log = log
        order = sorted(runs, key=lambda v: VARIANTS.index(v) if v in VARIANTS else 9)
        if resident.current is not None and resident.current.variant in order:
            order.insert(0, order.pop(order.index(resident.current.variant)))  # flash skipped: that app first
        first = resident.ensure(order[0], runs[order[0]].serial_log or logs / "serial.log")
    except EspCheckError as exc:
        for r in runs.values():
            r.exit_code = exc.exit_code
        return None
    booted = first.variant
    if booted is not None and booted in runs and booted != order[0]:
        order.insert(0, order.pop(order.index(booted)))
        Path(runs[order[1]].serial_log or "").replace(runs[booted].serial_log or "")
    return order


def boot_variant(resident: ResidentBoard, run: VariantRun) -> Boot | ExitCode | None:
    """``run.variant``'s app, ready for commands; else what its start-up evidence is worth (exit code)."""
    v = run.variant
    log = run.serial_log
    assert log is not None
    try:
        boot = resident.ensure(v, log)
        if boot.variant != v and resident.current is None:  # no app runs to ask for a switch: esptool does it
            resident.select_with_esptool(v, log.with_name(f"flash-select-{v}.log"))
            boot = resident.ensure(v, log)
    except EspCheckError as exc:
        return exc.exit_code
    if boot.hello is None or boot.hello.init_status != 0 or boot.variant != v:
        return verify_capture(resident, run, boot.raw, log)  # start-up evidence: a fault, a loop, silence
    run.nn_mode = boot.hello.nn  # compiled in (sdkconfig.h), as INFO nn in a text capture
    want = resident.model_sha256
    wrong = ""
    if want and boot.hello.model_sha256 != want:  # identity: the device runs the model it was given
        wrong = (
            f"the {v} app reports model SHA-256 {boot.hello.model_sha256[:16]}... in its HELLO, but the "
            f"model esp-check flashed is {want[:16]}...: its results would be of another model"
        )
    wrong = wrong or resident.other_firmware(boot, v)  # identity: the app is the build (HELLO image SHA)
    if wrong:
        resident.current = None
        run.problems.append(wrong)
        resident.rec.add("verify", v, ExitCode.USAGE, 0.0, wrong)
        return ExitCode.USAGE
    return boot


def streaming(runs: Mapping[str, VariantRun], inputs: Sequence[bytes]) -> Body:
    """:func:`with_board`'s body that streams ``inputs`` to each variant in run order."""

    def body(resident: ResidentBoard, order: list[str]) -> None:
        for v in order:
            runs[v].exit_code = stream_inputs(resident, runs[v], inputs)

    return body


def stream_inputs(resident: ResidentBoard, run: VariantRun, inputs: Sequence[bytes]) -> ExitCode | None:
    """Boot ``run.variant`` and stream the inputs in a text session; verify what it printed."""
    v = run.variant
    log = run.serial_log
    assert log is not None
    boot = boot_variant(resident, run)
    if not isinstance(boot, Boot):
        return boot
    raw = resident.rec.run("capture", v, lambda: resident.text_session(boot, inputs, log))
    whole = dataclasses.replace(
        raw, data=boot.raw.data + raw.data, boots=boot.raw.boots, resets=boot.raw.resets
    )
    code = verify_capture(resident, run, whole, log)
    return link_verdict(run, resident.last_link, code, resident.rec)


def link_verdict(run: VariantRun, stats: LinkStats, code: ExitCode | None, rec: Recorder) -> ExitCode | None:
    """A session whose link needed repairs is kept as evidence but is never a clean match: exit 3, a
    failed ``link`` stage, unless another stage (``code``) failed the variant already."""
    if stats.clean:
        return code
    what = (
        f"{stats.damaged_frames} damaged and {stats.rx_gaps} lost frame(s) from the device, "
        f"{stats.naks} NAK(s), {stats.retransmitted_frames} frame(s) sent again"
    )
    finding = Finding(
        "link_repair",
        Severity.INFRASTRUCTURE,
        f"the serial link needed repairs: {what}",
        line=None,
        evidence=(),
        details=stats.to_dict(),
        hint="check the cable, the hub and the baud rate; the results were checked, but a run "
        "over a lossy link is never reported as a clean match",
    )
    run.findings.append(finding.to_dict())
    if code is None:
        code = ExitCode.INFRASTRUCTURE
        rec.add("link", run.variant, code, 0.0, finding.message)
    return code


def verify_capture(
    resident: ResidentBoard, run: VariantRun, raw: RawCapture, log_path: Path
) -> ExitCode | None:
    """Parse and classify what the device printed; keep its outputs only when they are evidence.

    Crash findings get their code addresses decoded with the build's ELF (or say why they were not).
    """
    t0 = time.monotonic()
    cap = parse_capture(raw.data)
    build = resident.builds[run.variant]
    findings = decode_findings(classify(raw.data, ended_by=raw.ended_by, parsed=cap), build.elf, build.chip)
    run.findings = [f.to_dict() for f in findings]
    run.nn_mode = cap.nn_mode
    run.problems = list(cap.problems)
    code, detail, keep = verdict_evidence(run.variant, cap, findings, raw.ended_by, resident.simulated)
    if keep:
        run.source = source_from_capture(cap, run.variant, str(log_path), raw.data)
        run.capture_valid = True
    resident.rec.add("verify", run.variant, code, time.monotonic() - t0, detail)
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
    whatever else it printed, and so is a usage finding (a board file that promises more flash than the
    chip has: the start-up abort and boot loop that follow are its consequence); a firmware fault is a
    finding even in a broken capture; an invalid capture is never a result; a valid one beside an
    infrastructure finding is kept as evidence but is never a clean match; a firmware that does not
    report the ESP-NN mode it was built for proves nothing.
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
    if usage := [f for f in findings if f.severity == Severity.USAGE]:  # e.g. a board file's flash size
        return ExitCode.USAGE, "; ".join(f.message for f in usage), False
    faults = [f for f in findings if f.severity == Severity.FIRMWARE_FAULT]
    if cap.errors and not faults and all(e.stage == "model" for e in cap.errors):
        msg = "; ".join(f.message for f in findings if f.kind == "model_partition")
        return ExitCode.INFRASTRUCTURE, msg or "the model partition holds no valid model image", False
    if faults or cap.errors:
        msg = "; ".join(f.message for f in faults) or "; ".join(f"{e.stage}: {e.msg}" for e in cap.errors)
        # a clean ERROR record keeps the source so the fault is reported with it
        return ExitCode.FIRMWARE_FAULT, f"firmware fault: {msg}", bool(cap.valid)
    if not cap.valid:  # corrupted or truncated capture (CaptureError)
        return ExitCode.INFRASTRUCTURE, "; ".join(cap.problems) or f"capture ended by {ended_by}", False
    infra = [f for f in findings if f.severity == Severity.INFRASTRUCTURE]
    if infra:  # records validated, yet the board browned out / rebooted / lost data around them
        return ExitCode.INFRASTRUCTURE, "; ".join(f.message for f in infra), True
    expected = NN_EXPECTED[variant]
    if cap.nn_mode != expected:
        return (
            ExitCode.USAGE,
            f"the {variant} firmware reports ESP-NN mode {cap.nn_mode!r}, expected {expected!r}",
            False,
        )
    return None, f"nn={cap.nn_mode}", True
