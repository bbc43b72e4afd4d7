"""Which op instances a hybrid firmware can switch to esp-nn's ANSI C kernels (docs/hybrid.md).

The seven kernels esp-tflite-micro routes through ESP-NN (``harness/data/ops.toml``) can be sent, node
by node, to the matching ``esp_nn_*_ansi`` function by the generated wrapper; every other op runs the
same TFLM reference kernel in both builds. Plain data and pure functions: the firmware generator, the
simulator and the hybrid flow share them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from harness.errors import UsageError
from harness.model.loader import ModelInfo, OpInfo
from harness.model.opdata import DILATED, ELEMENTWISE, POOLS, WEIGHTED

# ESP-NN's kernels (ops.toml) -> enum Kind of the wrapper (firmware_templates/hybrid/esp_check_hybrid.cc.j2),
# which registers each as Register_<opcode> (tests/test_hybrid_firmware.py checks both)
ANSI_KINDS: dict[str, str] = {
    "CONV_2D": "kConv",
    "DEPTHWISE_CONV_2D": "kDepthwise",
    "ADD": "kAdd",
    "MUL": "kMul",
    "FULLY_CONNECTED": "kFullyConnected",
    "AVERAGE_POOL_2D": "kAvgPool",
    "MAX_POOL_2D": "kMaxPool",
    "SOFTMAX": "kSoftmax",
}


def switchable(op: OpInfo) -> bool:
    """The op's kind has an esp-tflite-micro ESP-NN kernel, so the hybrid wrapper can switch it."""
    return op.opcode in ANSI_KINDS


def candidate_ops(info: ModelInfo) -> list[int]:
    """Indices of the main subgraph's switchable ops, in execution order (what bisection searches)."""
    return [op.index for op in info.main_ops if switchable(op)]


def ansi_path_applies(info: ModelInfo, op: OpInfo) -> bool:
    """Whether the wrapper's ANSI C call runs this node (mirrors its checks), or the original kernel does.

    The original kernel runs (in both builds the same TFLM reference code) for non-int8 tensors,
    CONV/DEPTHWISE with dilation != 1, and ADD/MUL whose inputs need broadcasting.
    """
    t = info.tensors
    ins = [i for i in op.inputs if i >= 0]
    outs = [o for o in op.outputs if o >= 0]
    if not ins or not outs or t[ins[0]].dtype != "int8" or t[outs[0]].dtype != "int8":
        return False
    if op.opcode in WEIGHTED and (len(ins) < 2 or t[ins[1]].dtype != "int8"):
        return False
    if op.opcode in DILATED:
        dh, dw = op.options.get("dilation_h_factor", 1), op.options.get("dilation_w_factor", 1)
        return dh == 1 and dw == 1 and len(t[ins[0]].shape) == 4
    if op.opcode in ELEMENTWISE:
        return len(ins) >= 2 and t[ins[1]].dtype == "int8" and t[ins[0]].shape == t[ins[1]].shape
    if op.opcode in POOLS:
        return len(t[ins[0]].shape) == 4
    return True


def format_ops(ops: Iterable[int]) -> str:
    """``17,27`` (sorted, unique): the form the CLI takes and the firmware prints (INFO ansi_ops)."""
    return ",".join(str(k) for k in sorted(set(ops)))


def select_ansi_ops(info: ModelInfo, ops: Sequence[int] = (), kinds: Sequence[str] = ()) -> tuple[int, ...]:
    """``--ansi-ops`` and ``--ansi-kinds`` as one sorted tuple of op indices; UsageError for what the
    wrapper cannot switch (an index out of range, an op without an ESP-NN kernel, an unknown kind)."""
    main = info.main_ops
    chosen: set[int] = set()
    for k in ops:
        if not 0 <= int(k) < len(main):
            raise UsageError(
                f"--ansi-ops {k}: the model has ops 0..{len(main) - 1}",
                hint="`esp-check inspect MODEL` lists the ops with their indices",
            )
        op = main[int(k)]
        if not switchable(op):
            raise UsageError(
                f"op {k} ({op.opcode}) has no ESP-NN kernel: the optimized and the ANSI C build run the same "
                "TFLM reference kernel for it, so there is nothing to switch",
                hint=f"switchable kinds: {', '.join(ANSI_KINDS)}",
            )
        chosen.add(int(k))
    for kind in kinds:
        name = kind.strip().upper()
        if name not in ANSI_KINDS:
            raise UsageError(
                f"--ansi-kinds {kind}: not a kind with an ESP-NN kernel",
                hint=f"use one of {', '.join(ANSI_KINDS)}",
            )
        chosen |= {op.index for op in main if op.opcode == name}
    return tuple(sorted(chosen))
