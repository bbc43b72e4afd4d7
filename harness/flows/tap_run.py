"""``--tap``, after the tapped runs: analyze them, then dump the culprit op in a second run.

Orchestration only (the analysis: :mod:`harness.analysis.tap`); the dump run's path: docs/architecture.md
"The pipeline: one job spec, one path".
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harness.analysis.tap import (
    TapResult,
    analyze_captures,
    analyze_dump_captures,
    host_taps,
    ops_to_dump,
)
from harness.errors import EspCheckError, ExitCode
from harness.firmware.generate import FirmwareFeatures
from harness.flashfmt.partitions import VARIANTS
from harness.flows.capture import streaming, with_board
from harness.flows.firmware import prepare_firmware
from harness.flows.job import JobSpec
from harness.flows.records import Recorder, VariantRun
from harness.flows.repro import write_reproducer
from harness.flows.targets import BoardLockCM, Target
from harness.jsontypes import JSONValue
from harness.model.inputs import input_tensor_bytes
from harness.model.loader import ModelInfo
from harness.protocol.capture import Capture


@dataclass(frozen=True)
class TapRunRequest:
    """What the dump run needs to rebuild and re-run the same job's firmware with dumps switched on."""

    spec: JobSpec
    info: ModelInfo
    target: Target
    out: Path


@dataclass
class TapRunOutcome:
    result: TapResult
    errors: list[str] = field(default_factory=list)
    codes: list[ExitCode] = field(default_factory=list)
    captures: dict[str, Capture] = field(default_factory=dict)  # dump_run: the dump run's captures


def streamed_inputs(req: TapRunRequest) -> list[np.ndarray]:
    """The exact quantized input tensors the firmware was given (the bytes the flow streams to it)."""
    tin = req.info.inputs[0]
    dtype = np.dtype(tin.dtype).newbyteorder("<")
    return [
        np.frombuffer(raw, dtype=dtype).reshape(tin.shape)
        for raw in input_tensor_bytes(req.spec.inputs, tin, req.spec.options.input_options)
    ]


def run_tap_flow(
    req: TapRunRequest,
    variants: Mapping[str, VariantRun],
    *,
    rec: Recorder,
    lock_cm: BoardLockCM | None = None,
) -> TapRunOutcome:
    """Analyze the tapped captures; when an op departs, dump it (and ``extra_dump_ops``) in a second run."""
    caps = {v: cap for v, run in variants.items() if run.capture_valid and (cap := run.capture()) is not None}
    if not caps:
        return TapRunOutcome(TapResult(problems=["no valid tapped capture to analyze"]))
    outcome = TapRunOutcome(TapResult())
    host_ops = host_tensors = None
    if req.spec.options.reference:
        try:
            host_ops, host_tensors = host_taps(req.info, req.spec.model.read_bytes(), streamed_inputs(req))
        except EspCheckError as exc:
            outcome.errors.append(f"tap: host per-layer reference unavailable: {exc.message}")
    outcome.result = res = analyze_captures(req.info, caps, host_ops)
    dump = sorted(set(ops_to_dump(res)) | set(req.spec.options.dump_ops))
    if not dump:
        return outcome
    res.dump_ops = dump
    rec.say("tap", f"second run dumping op(s) {','.join(map(str, dump))}")
    dump_caps = _dump_run(req, dump, rec, lock_cm, outcome, "tap-dump", what="tap dump run")
    if dump_caps is None:
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
) -> list[dict[str, JSONValue]]:
    """One-op reproducers (harness.flows.repro) for ``ops`` from a dump run, under ``req.out/repro``;
    ``dump_errors`` (why a build of the dump run has no capture) go into an unverified one's ``why``."""
    board = req.target.board.name
    return [
        write_reproducer(
            req.spec.model, req.info, k, dump_caps, req.out / "repro", board, dump_errors=dump_errors
        )
        for k in ops
    ]


def dump_run(req: TapRunRequest, ops: Sequence[int], rec: Recorder, subdir: str) -> TapRunOutcome:
    """Both variants rebuilt with ``--tap --dump-ops ops`` and run (no lock: the caller holds it), and
    reproducers of ``ops`` written."""
    outcome = TapRunOutcome(TapResult(dump_ops=sorted(ops)))
    caps = _dump_run(req, ops, rec, None, outcome, subdir, what="dump run")
    if caps is None:
        return outcome
    outcome.captures = caps
    outcome.result.repro = reproducers(req, ops, caps, dump_errors=outcome.errors)
    return outcome


def _dump_run(
    req: TapRunRequest,
    dump: Sequence[int],
    rec: Recorder,
    lock_cm: BoardLockCM | None,
    outcome: TapRunOutcome,
    subdir: str,
    *,
    what: str,
) -> dict[str, Capture] | None:
    """Rebuild both variants with dumps on, flash and capture each; failures go into ``outcome`` (None:
    the run stopped before any capture, ``what: error``)."""
    o, dump_dir, sub = req.spec.options, req.out / subdir, Recorder(rec.progress)
    features = FirmwareFeatures(tap=True, dump_ops=tuple(dump), embed_inputs=False)
    try:
        fw = prepare_firmware(
            req.spec.model, req.spec.inputs, req.target.board, dump_dir, rec=sub, options=o, features=features
        )
        streamed = input_tensor_bytes(req.spec.inputs, req.info.inputs[0], o.input_options)
        for v, exc in fw.failures.items():
            outcome.errors.append(f"tap dump run [{v}]: build: {exc}")
            outcome.codes.append(exc.exit_code)
        runs = {v: VariantRun(v, project_dir=b.project_dir) for v, b in fw.builds.items()}
        with lock_cm or contextlib.nullcontext():  # both variants over one session, as the job ran them
            with_board(
                sub, runs, fw.builds, target=req.target, out=dump_dir, limits=o.timeouts,
                flash_baud=o.flash_baud, body=streaming(runs, streamed),
            )  # fmt: skip
        dump_caps: dict[str, Capture] = {}
        for v, vr in sorted(runs.items(), key=lambda kv: VARIANTS.index(kv[0])):
            cap = vr.capture() if vr.capture_valid else None
            if cap is None:
                outcome.errors.append(f"tap dump run [{v}]: capture failed ({vr.exit_code})")
                outcome.codes.append(ExitCode(vr.exit_code or ExitCode.INFRASTRUCTURE))
                continue
            dump_caps[v] = cap
        return dump_caps
    except EspCheckError as exc:
        outcome.errors.append(f"{what}: {exc}")
        outcome.codes.append(exc.exit_code)
        return None
    finally:  # the dump run's stages join the report, labelled as such
        rec.adopt(sub.stages, subdir)


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
