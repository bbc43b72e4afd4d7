"""The simulated chip's per-op cycle model: a documented stand-in, not a measurement (docs/simulator.md).

The cost formula, the speed-up table and the jitter: docs/simulator.md "Cycle model".
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from harness.model.loader import ModelInfo, OpInfo
from harness.model.opdata import chip_family, espnn_model_acceleration

OVERHEAD_CYCLES = 1500  # TFLM invoke + kernel prologue, both builds
JITTER = 0.015  # +-1.5 %

# ANSI C cycles per unit of work (see the module docstring for the unit), any chip.
ANSI_CYCLES: dict[str, float] = {
    "CONV_2D": 4.0,
    "DEPTHWISE_CONV_2D": 5.0,
    "FULLY_CONNECTED": 3.0,
    "ADD": 12.0,
    "MUL": 10.0,
    "AVERAGE_POOL_2D": 3.0,
    "MAX_POOL_2D": 2.5,
    "SOFTMAX": 60.0,
}
REFERENCE_CYCLES = 6.0  # per output byte: TFLM reference kernels (the same code in both builds)

# ESP-NN optimized speedup of the work, per chip family (harness/data/ops.toml) and kind; a kind missing
# here has no ESP-NN kernel on that family (1.0).
SPEEDUP: dict[str, dict[str, float]] = {
    "esp32s3": {"CONV_2D": 6.0, "DEPTHWISE_CONV_2D": 4.0, "FULLY_CONNECTED": 5.0, "ADD": 3.0, "MUL": 3.0,
                "AVERAGE_POOL_2D": 2.5, "MAX_POOL_2D": 2.5, "SOFTMAX": 1.5},
    "esp32p4": {"CONV_2D": 5.0, "DEPTHWISE_CONV_2D": 3.5, "FULLY_CONNECTED": 4.0, "ADD": 2.5, "MUL": 2.5,
                "AVERAGE_POOL_2D": 2.0, "MAX_POOL_2D": 2.0, "SOFTMAX": 1.5},
    "generic": {"CONV_2D": 2.0, "DEPTHWISE_CONV_2D": 1.6, "SOFTMAX": 1.3},
}  # fmt: skip


@dataclass(frozen=True)
class Dispatch:
    """Which kernel each op of one image runs: the image's variant, the hybrid table's ANSI C ops, and
    an op kind the ``unoptimized_kind`` fault compiled without optimization (ANSI timing, same outputs)."""

    variant: str = "optimized"
    ansi_ops: frozenset[int] = frozenset()
    unoptimized_kind: str | None = None

    def kernel(self, op: int) -> str:
        """``ansi`` or ``optimized``: the kernel whose *results* op ``op`` produces."""
        return "ansi" if self.variant != "optimized" or op in self.ansi_ops else "optimized"

    def timing(self, op: OpInfo) -> str:
        """The kernel whose *speed* op ``op`` runs at (a kind compiled without optimization is ANSI)."""
        if op.opcode == self.unoptimized_kind:
            return "ansi"
        return self.kernel(op.index)


def _work(info: ModelInfo, op: OpInfo) -> float:
    t = info.tensors
    outs = [o for o in op.outputs if o >= 0]
    ins = [i for i in op.inputs if i >= 0]
    out_elems = sum(t[o].num_elements for o in outs)
    if op.opcode in ("CONV_2D", "DEPTHWISE_CONV_2D") and len(ins) >= 2 and len(t[ins[1]].shape) == 4:
        _, fh, fw, fc = t[ins[1]].shape
        return float(out_elems * fh * fw * (fc if op.opcode == "CONV_2D" else 1))
    if op.opcode == "FULLY_CONNECTED" and len(ins) >= 2 and t[ins[1]].shape:
        return float(out_elems * t[ins[1]].shape[-1])
    if op.opcode in ("AVERAGE_POOL_2D", "MAX_POOL_2D"):
        window = int(str(op.options.get("filter_height", 1))) * int(str(op.options.get("filter_width", 1)))
        return float(out_elems * window)
    return float(out_elems)


def _jitter(op: int, kernel: str, salt: str) -> float:
    h = hashlib.sha256(f"{salt}:{op}:{kernel}".encode()).digest()
    return 1.0 + JITTER * (2.0 * int.from_bytes(h[:4], "little") / 0xFFFFFFFF - 1.0)


def op_cycles(info: ModelInfo, chip: str, dispatch: Dispatch, salt: str = "") -> list[int]:
    """Modelled CPU cycles of every op of the main subgraph on ``chip`` for one image."""
    family = chip_family(chip)
    accel = {a.index: a.accelerated for a in espnn_model_acceleration(info, chip)}
    out: list[int] = []
    for op in info.main_ops:
        kernel = dispatch.timing(op)
        if op.opcode in ANSI_CYCLES:
            work = _work(info, op) * ANSI_CYCLES[op.opcode]
            if kernel == "optimized" and accel.get(op.index, False):
                work /= SPEEDUP.get(family, {}).get(op.opcode, 1.0)
        else:
            work = sum(info.tensors[o].nbytes for o in op.outputs if o >= 0) * REFERENCE_CYCLES
        out.append(int((OVERHEAD_CYCLES + work) * _jitter(op.index, kernel, salt)))
    return out


def invoke_us(cycles: Sequence[int], cpu_mhz: int) -> int:
    """The modelled ``TIME invoke_us``: the ops' cycles at the CPU clock."""
    return int(sum(cycles) / max(1, cpu_mhz))
