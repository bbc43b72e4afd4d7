"""Which tensors of an op the ``--tap`` wrapper checksums (docs/protocol.md, OP records).

One rule shared by the firmware generator, the host analysis and the simulator: inputs that are not
constant (weights and biases sit in flash and cannot change), and outputs, at most
``TAP_MAX_TENSORS`` each.
"""

from __future__ import annotations

from harness.model.loader import ModelInfo, OpInfo
from harness.protocol.spec import TAP_MAX_TENSORS


def tapped_inputs(info: ModelInfo, op: OpInfo) -> list[int]:
    """Inputs the wrapper checksums: non-constant tensors, at most ``TAP_MAX_TENSORS``."""
    return [t for t in op.inputs if t >= 0 and not info.tensors[t].is_constant][:TAP_MAX_TENSORS]


def tapped_outputs(op: OpInfo) -> list[int]:
    """Outputs the wrapper checksums, at most ``TAP_MAX_TENSORS``."""
    return [t for t in op.outputs if t >= 0][:TAP_MAX_TENSORS]
