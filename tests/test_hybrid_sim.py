"""The simulator's side of the hybrid feature: per-op dispatch, op crash faults, the cycle model, and the
``unoptimized_kind`` fault -- each modelled, and each checked here against what the board prints.

Real: generated projects, the sim builder (which reads the wrapper table from main/esp_check_hybrid.cc as
compiled), esptool over a pyserial port, the protocol parser. Faked: the board itself.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness.analysis.hybrid import hybrid_evidence
from harness.errors import ExitCode, UsageError
from harness.firmware.boards import load_board
from harness.firmware.build import build_project
from harness.firmware.generate import FirmwareFeatures, generate_projects
from harness.flows.capture import flash_and_capture
from harness.flows.records import StageTimeouts
from harness.flows.targets import open_target, sim_port_for
from harness.model.hybrid_ops import candidate_ops
from harness.model.loader import load_model
from harness.protocol.capture import Capture, parse_capture
from harness.sim.cycles import SPEEDUP, Dispatch, op_cycles
from harness.sim.faults import parse_faults

pytest.importorskip("tflite_micro")

MODELS = Path(__file__).parent / "data" / "models"
UNET = MODELS / "unet_mbv2_035_48.tflite"
UNET_IN = MODELS / "inputs" / "unet_mbv2_035_48.png"


def _boot(
    tmp: Path, query: str, ops: tuple[int, ...] = (), tap: bool = False, edit=None
) -> tuple[Capture, object]:  # type: ignore[no-untyped-def]
    (p,) = generate_projects(UNET, [UNET_IN], "sim", out_dir=tmp / "p", variants=("optimized",),
                             features=FirmwareFeatures(tap=tap, ansi_ops=ops))  # fmt: skip
    if edit is not None:
        edit(p.path)
    build = build_project(p.path, cache_dir=tmp / "cache")
    board = load_board("sim")
    port = sim_port_for(board.chip, board.reset, f"sim://hs{time.monotonic_ns()}?{query}", board.flash_size)
    vr, _ = flash_and_capture(build, open_target(board, port), tmp, variant="optimized",
                              timeouts=StageTimeouts(capture_total=60, capture_silence=3))  # fmt: skip
    return parse_capture(Path(vr.serial_log).read_bytes()), vr  # type: ignore[arg-type]


def test_fault_op_lists_and_new_faults_parse() -> None:
    spec = parse_faults({"fault": "op_corrupt", "fault_op": "27,17"})
    assert spec.fault_ops == (17, 27) and spec.fault_op == 17
    assert parse_faults({"fault": "op_panic", "fault_op": "33"}).fault_ops == (33,)
    assert parse_faults({"fault": "unoptimized_kind", "fault_kind": "conv_2d"}).fault_kind == "CONV_2D"
    with pytest.raises(UsageError, match="fault_op"):
        parse_faults({"fault": "op_hang"})
    with pytest.raises(UsageError, match="fault_kind"):
        parse_faults({"fault": "unoptimized_kind"})
    with pytest.raises(UsageError, match="not an op index"):
        parse_faults({"fault": "op_corrupt", "fault_op": "17,x"})


def test_cycle_model_per_chip_and_kind() -> None:
    info = load_model(UNET)
    opt = op_cycles(info, "esp32s3", Dispatch("optimized"))
    ansi = op_cycles(info, "esp32s3", Dispatch("ansi"))
    accel = set(candidate_ops(info))
    for op in info.main_ops:
        ratio = ansi[op.index] / opt[op.index]
        if op.index in accel:  # ESP-NN on the S3: faster, but never more than the modelled work speedup
            assert 1.1 < ratio <= SPEEDUP["esp32s3"][op.opcode] * 1.04, (op.index, ratio)
        else:  # same TFLM kernel in both builds: same cycles up to the +-1.5 % jitter
            assert abs(ratio - 1) < 0.04, (op.index, ratio)
    generic = op_cycles(info, "esp32", Dispatch("optimized"))
    add = next(o.index for o in info.main_ops if o.opcode == "ADD")
    assert abs(ansi[add] / generic[add] - 1) < 0.04  # ESP-NN has no ADD kernel on the ESP32 (generic C)
    hyb = op_cycles(info, "esp32s3", Dispatch("optimized", frozenset({17})))
    assert abs(hyb[17] / ansi[17] - 1) < 0.04 and hyb[16] == opt[16]
    unopt = op_cycles(info, "esp32s3", Dispatch("optimized", unoptimized_kind="CONV_2D"))
    assert all(abs(unopt[o.index] / ansi[o.index] - 1) < 0.04 for o in info.main_ops if o.opcode == "CONV_2D")
    assert op_cycles(info, "esp32s3", Dispatch("optimized")) == opt  # deterministic


@pytest.mark.slow
def test_op_fault_disappears_where_the_table_sends_the_op_to_ansi_c(tmp_path: Path) -> None:
    q = "fault=op_corrupt&fault_op=17&variant_fault=optimized"
    plain, _ = _boot(tmp_path / "a", q, tap=True)
    hyb, _ = _boot(tmp_path / "b", q, (17,), tap=True)
    other, _ = _boot(tmp_path / "c", q, (18,), tap=True)
    out = lambda cap: [t.crc for t in cap.runs[0].outputs]  # noqa: E731
    assert (
        plain.info["sim_fault"] == "op_corrupt" and "sim_fault" not in hyb.info
    )  # not injected: nothing hit
    assert out(plain) != out(hyb) and out(other) == out(plain)
    assert hyb.hybrid_ops == ((17,), False) and hyb.runs[0].hybrid == {"ansi": 1, "fallback": 0}
    cyc = {o.idx: o.cycles for o in hyb.runs[0].ops}
    base = {o.idx: o.cycles for o in plain.runs[0].ops}
    assert cyc[17] > 3 * base[17] and cyc[16] == base[16]  # op 17 at ANSI C speed, the rest unchanged


@pytest.mark.slow
def test_the_sim_dispatches_on_the_compiled_table_like_the_wrapper(tmp_path: Path) -> None:
    """A table row whose output tensor is not the node's is never recognised (by the C wrapper or here)."""

    def break_row(project: Path) -> None:
        src = project / "main" / "esp_check_hybrid.cc"
        src.write_text(src.read_text().replace("{ 17, 120, kConv, 0 }", "{ 17, 121, kConv, 0 }"))

    cap, _ = _boot(tmp_path, "fault=op_corrupt&fault_op=17&variant_fault=optimized", (17,), edit=break_row)
    assert cap.valid and cap.runs[0].hybrid == {"ansi": 0, "fallback": 0}
    assert cap.info["sim_fault"] == "op_corrupt"  # op 17 still ran the faulty optimized kernel
    assert "0 invokes went to ANSI C, expected 1" in hybrid_evidence(cap, [17], 1)[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "code"), [("op_panic", ExitCode.FIRMWARE_FAULT), ("op_hang", ExitCode.INFRASTRUCTURE)]
)
def test_op_crash_faults_fire_only_where_the_op_runs_optimized(
    tmp_path: Path, fault: str, code: ExitCode
) -> None:
    q = f"fault={fault}&fault_op=33&variant_fault=optimized"
    cap, vr = _boot(tmp_path / "a", q)
    assert vr.exit_code == code and cap.runs and cap.runs[0].invoke_us is None and not cap.complete  # type: ignore[attr-defined]
    if fault == "op_panic":
        assert any(f["kind"] == "panic" for f in vr.findings)  # type: ignore[attr-defined]
    fixed, vr2 = _boot(tmp_path / "b", q, (33,))
    assert vr2.exit_code is None and fixed.valid and fixed.runs[0].hybrid == {"ansi": 1, "fallback": 0}  # type: ignore[attr-defined]
