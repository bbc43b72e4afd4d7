"""``--tap``, after the tapped runs: analyze them, then dump the culprit op in a second run.

Orchestration only; the analysis itself is pure functions in :mod:`harness.analysis.tap`. The dump
run goes through the same generate/build/flash/capture path as the first run (identical firmware is
refused there too), and its stage records join the run's report.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.analysis.tap import (
    TapResult,
    analyze_captures,
    analyze_dump_captures,
    host_taps,
    ops_to_dump,
)
from harness.errors import EspCheckError, ExitCode
from harness.firmware.boards import Board
from harness.firmware.generate import FirmwareFeatures
from harness.firmware.native.project import NativeOptions
from harness.flows.capture import flash_and_capture
from harness.flows.firmware import prepare_firmware
from harness.flows.records import VARIANT_ORDER, Recorder, StageTimeouts, VariantRun
from harness.model.inputs import InputOptions, input_tensor_bytes
from harness.model.loader import ModelInfo
from harness.protocol.capture import Capture, parse_capture


@dataclass(frozen=True)
class TapRunRequest:
    """What the dump run needs to rebuild and re-run the same firmware with dumps switched on."""

    model_path: Path
    input_paths: tuple[Path, ...]
    model: ModelInfo
    board: Board
    port_url: str
    out: Path
    builder: str | None = None
    cache_dir: str | Path | None = None
    input_options: InputOptions | None = None
    arena_kb: int | None = None
    limits: StageTimeouts = field(default_factory=StageTimeouts)
    flash_baud: int | None = None
    reference: bool = True
    extra_dump_ops: tuple[int, ...] = ()
    native: NativeOptions | None = None


@dataclass
class TapRunOutcome:
    result: TapResult
    errors: list[str] = field(default_factory=list)
    codes: list[ExitCode] = field(default_factory=list)
    captures: dict[str, Capture] = field(default_factory=dict)  # dump_run: the dump run's captures


def streamed_inputs(req: TapRunRequest) -> list[np.ndarray]:
    """The exact quantized input tensors the firmware was given (the bytes the flow streams to it)."""
    tin = req.model.inputs[0]
    dtype = np.dtype(tin.dtype).newbyteorder("<")
    return [
        np.frombuffer(raw, dtype=dtype).reshape(tin.shape)
        for raw in input_tensor_bytes(req.input_paths, tin, req.input_options)
    ]


def run_tap_flow(
    req: TapRunRequest,
    variants: Mapping[str, VariantRun],
    *,
    rec: Recorder,
    lock_cm: contextlib.AbstractContextManager[Any] | None = None,
) -> TapRunOutcome:
    """Analyze the tapped captures; when an op departs, dump it (and ``extra_dump_ops``) in a second run."""
    caps = {
        v: parse_capture(Path(run.serial_log).read_bytes())
        for v, run in variants.items()
        if run.serial_log is not None and Path(run.serial_log).is_file() and run.capture_valid
    }
    if not caps:
        return TapRunOutcome(TapResult(problems=["no valid tapped capture to analyze"]))
    outcome = TapRunOutcome(TapResult())
    host_ops = host_tensors = None
    if req.reference:
        try:
            host_ops, host_tensors = host_taps(req.model, req.model_path.read_bytes(), streamed_inputs(req))
        except EspCheckError as exc:
            outcome.errors.append(f"tap: host per-layer reference unavailable: {exc.message}")
    outcome.result = res = analyze_captures(req.model, caps, host_ops)
    dump = sorted(set(ops_to_dump(res)) | set(req.extra_dump_ops))
    if not dump:
        return outcome
    res.dump_ops = dump
    rec.say("tap", f"second run dumping op(s) {','.join(map(str, dump))}")
    try:
        dump_caps = _dump_run(req, dump, rec, lock_cm or contextlib.nullcontext(), outcome)
    except EspCheckError as exc:
        outcome.errors.append(f"tap dump run: {exc}")
        outcome.codes.append(exc.exit_code)
        return outcome
    res.problems += _nondeterminism(caps, dump_caps)
    analyze_dump_captures(res, dump_caps, host_tensors)
    d = res.culprit
    if d is not None and d.op is not None and d.kind == "output":
        res.repro = reproducers(req, [d.op], dump_caps)
    return outcome


def reproducers(
    req: TapRunRequest,
    ops: Sequence[int],
    dump_caps: Mapping[str, Capture],
    dump_errors: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """One-op reproducers (harness.flows.repro) for ``ops`` from a dump run, under ``req.out/repro``;
    ``dump_errors`` (why a build of the dump run has no capture) go into an unverified one's ``why``."""
    from harness.flows.repro import write_reproducer

    return [
        write_reproducer(
            req.model_path, req.model, k, dump_caps, req.out / "repro", req.board.name, dump_errors
        )
        for k in ops
    ]


def dump_run(
    req: TapRunRequest,
    ops: Sequence[int],
    rec: Recorder,
    lock_cm: contextlib.AbstractContextManager[Any] | None = None,
    subdir: str = "tap-dump",
) -> TapRunOutcome:
    """Both variants rebuilt with ``--tap --dump-ops ops`` and run, and reproducers of ``ops`` written."""
    outcome = TapRunOutcome(TapResult(dump_ops=sorted(ops)))
    try:
        caps = _dump_run(req, ops, rec, lock_cm or contextlib.nullcontext(), outcome, subdir)
    except EspCheckError as exc:
        outcome.errors.append(f"dump run: {exc}")
        outcome.codes.append(exc.exit_code)
        return outcome
    outcome.captures = caps
    outcome.result.repro = reproducers(req, ops, caps, dump_errors=outcome.errors)
    return outcome


def _dump_run(
    req: TapRunRequest,
    dump: Sequence[int],
    rec: Recorder,
    lock_cm: contextlib.AbstractContextManager[Any],
    outcome: TapRunOutcome,
    subdir: str = "tap-dump",
) -> dict[str, Capture]:
    """Rebuild both variants with dumps on, flash and capture each; failures go into ``outcome``."""
    dump_dir = req.out / subdir
    sub = Recorder(rec.progress)
    try:
        return _dump_variants(req, dump, sub, lock_cm, outcome, dump_dir)
    finally:  # the dump run's stages join the report, labelled as such
        for s in sub.stages:
            s.stage = f"{subdir}:{s.stage}"
        rec.stages.extend(sub.stages)


def _dump_variants(
    req: TapRunRequest,
    dump: Sequence[int],
    rec: Recorder,
    lock_cm: contextlib.AbstractContextManager[Any],
    outcome: TapRunOutcome,
    dump_dir: Path,
) -> dict[str, Capture]:
    fw = prepare_firmware(
        req.model_path, req.input_paths, req.board, dump_dir, rec=rec, input_options=req.input_options,
        arena_kb=req.arena_kb, features=FirmwareFeatures(tap=True, dump_ops=tuple(dump), embed_inputs=False),
        builder=req.builder, cache_dir=req.cache_dir, timeout=req.limits.build, native=req.native,
    )  # fmt: skip
    streamed = input_tensor_bytes(req.input_paths, req.model.inputs[0], req.input_options)
    for v, exc in fw.failures.items():
        outcome.errors.append(f"tap dump run [{v}]: build: {exc}")
        outcome.codes.append(exc.exit_code)
    dump_caps: dict[str, Capture] = {}
    with lock_cm:
        for v in VARIANT_ORDER:
            if v not in fw.builds:
                continue
            vr, stages = flash_and_capture(
                fw.builds[v], req.board, req.port_url, dump_dir, variant=v, inputs=streamed,
                timeouts=req.limits, flash_baud=req.flash_baud, progress=rec.progress,
            )  # fmt: skip
            rec.stages.extend(stages)
            if vr.serial_log is None or not vr.capture_valid:
                outcome.errors.append(f"tap dump run [{v}]: capture failed ({vr.exit_code})")
                outcome.codes.append(ExitCode(vr.exit_code or ExitCode.INFRASTRUCTURE))
                continue
            dump_caps[v] = parse_capture(Path(vr.serial_log).read_bytes())
    return dump_caps


def _nondeterminism(first: Mapping[str, Capture], second: Mapping[str, Capture]) -> list[str]:
    """The dump run must reproduce the tapped run's outputs; say where it does not."""
    problems = []
    for v, cap in second.items():
        if v not in first:
            continue
        for r1, r2 in zip(first[v].runs, cap.runs, strict=False):
            if [t.crc for t in r1.outputs] != [t.crc for t in r2.outputs]:
                problems.append(
                    f"{v}: the dump run's outputs differ from the first tapped run's (input {r1.index}): "
                    "the device is not deterministic or the dump changed the results"
                )
    return problems
