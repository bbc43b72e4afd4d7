"""Operator data: MicroMutableOpResolver registrations and ESP-NN acceleration per chip.

The facts live in ``harness/data/ops.toml`` (with their source commits); this module only reads
them and applies the documented fallback rules of esp-tflite-micro's ESP-NN kernels to a model.
"""

from __future__ import annotations

import functools
import importlib.resources
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.errors import ModelError, UsageError
from harness.resources import parse_toml

if TYPE_CHECKING:
    from harness.model.modelinfo import ModelInfo, OpInfo

# Chip families shown by `inspect` (one representative chip each).
FAMILY_CHIPS: tuple[str, ...] = ("esp32", "esp32s3", "esp32p4")

DILATED = ("CONV_2D", "DEPTHWISE_CONV_2D")
WEIGHTED = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")
ELEMENTWISE = ("ADD", "MUL")
POOLS = ("MAX_POOL_2D", "AVERAGE_POOL_2D")


@functools.lru_cache(maxsize=1)
def _table() -> Mapping[str, Any]:
    """The parsed ops.toml (immutable after load; cached because it never changes in a process)."""
    text = importlib.resources.files("harness").joinpath("data/ops.toml").read_text(encoding="utf-8")
    return parse_toml(text)


def sources() -> dict[str, str]:
    """Where the resolver and ESP-NN tables come from (repository @ commit, files)."""
    return dict(_table()["source"])


def espnn_scratch_table() -> list[dict[str, str]]:
    """ops.toml ``[[espnn_scratch]]``: esp-nn version ranges and the scratch formula set each uses."""
    return [{str(k): str(v) for k, v in row.items()} for row in _table()["espnn_scratch"]]


def rank_limit(opcode: str) -> tuple[int, str] | None:
    """ops.toml ``[max_rank]``: the most dimensions ``opcode``'s kernel holds, under RuntimeShape's; where."""
    row = _table()["max_rank"].get(opcode)
    return None if row is None else (int(row["rank"]), str(row["source"]))


def resolver_method(opcode: str, custom_code: str | None = None, *, where: str = "") -> str:
    """``MicroMutableOpResolver`` method registering ``opcode`` (e.g. CONV_2D -> AddConv2D).

    For ``opcode == "CUSTOM"`` pass the custom code (e.g. "TFLite_Detection_PostProcess").
    Raises ModelError when TFLM has no registration for it, naming the op after ``where`` (e.g. "op 3").
    """
    custom = opcode == "CUSTOM"
    method = _table()["custom"].get(custom_code or "") if custom else _table()["resolver"].get(opcode)
    if method is not None:
        return str(method)
    name = f"{opcode}({custom_code})" if custom else opcode
    prefix = f"{where} ({name}): " if where else ""
    if custom:
        raise ModelError(
            f"{prefix}custom op {custom_code!r} has no TFLite Micro registration",
            hint="TFLM ships only a few custom ops (e.g. TFLite_Detection_PostProcess, Signal*); "
            "convert the model without custom ops or register your own kernel",
        )
    raise ModelError(
        f"{prefix}op {opcode} is not supported by TensorFlow Lite Micro (no MicroMutableOpResolver "
        "registration)",
        hint="replace the op before conversion (see the TFLM supported-ops list) or convert with "
        "builtin int8 ops only",
    )


def resolver_methods(model: ModelInfo) -> tuple[str, ...]:
    """Distinct resolver methods the firmware must call for ``model``, in first-use order."""
    return tuple(dict.fromkeys(resolver_method(op.opcode, op.custom_code) for op in model.ops))


def chip_family(chip: str) -> str:
    """ESP-NN family of an ESP-IDF target name: "esp32s3", "esp32p4" or "generic"."""
    c = chip.lower().replace("-", "").replace("_", "")
    families = _table()["espnn"]
    for family, data in families.items():
        if c in data["chips"]:
            return str(family)
    if c.startswith("esp32"):
        return "generic"  # every other target uses esp_nn_generic_opt.h (include/esp_nn.h)
    raise UsageError(
        f"unknown chip {chip!r}", hint="use an ESP-IDF target name such as esp32, esp32s3, esp32c3"
    )


def family_description(chip: str) -> str:
    """Human description of the ESP-NN implementation used on ``chip``."""
    return str(_table()["espnn"][chip_family(chip)]["description"])


def espnn_ops(chip: str) -> tuple[str, ...]:
    """Opcodes ESP-NN has an optimized kernel for on ``chip`` (before per-op fallbacks)."""
    return tuple(_table()["espnn"][chip_family(chip)]["ops"])


def espnn_accelerated(opcode: str, chip: str) -> bool:
    """Whether ESP-NN has an optimized kernel for ``opcode`` on ``chip`` (int8, no fallback cases)."""
    return opcode in espnn_ops(chip)


@dataclass(frozen=True)
class OpAcceleration:
    """Whether one op of a model runs on an ESP-NN optimized kernel on a chip, and why (not)."""

    index: int
    opcode: str
    accelerated: bool
    reason: str
    short: str = ""  # a few words for narrow tables, e.g. "dilation 2x2"


def _fallback_reason(op: OpInfo, model: ModelInfo) -> tuple[str, str] | None:
    """Why esp-tflite-micro's ESP-NN kernel would use the reference path for this op, if it would."""
    t = model.tensors

    def dtype(pos: int, outputs: bool = False) -> str | None:
        idx = (op.outputs if outputs else op.inputs)[pos : pos + 1]
        return t[idx[0]].dtype if idx and idx[0] >= 0 else None

    in_dt, out_dt = dtype(0), dtype(0, outputs=True)
    if in_dt != "int8" or out_dt != "int8":
        return f"{in_dt}->{out_dt} tensors (ESP-NN handles int8 only)", f"{in_dt}->{out_dt}"
    if op.opcode in WEIGHTED and dtype(1) != "int8":
        return f"{dtype(1)} weights (ESP-NN needs int8 filters)", f"{dtype(1)} weights"
    if op.opcode in ELEMENTWISE and len(op.inputs) >= 2 and dtype(1) != "int8":
        return f"second input is {dtype(1)}", f"{dtype(1)} input"
    if op.opcode in DILATED:
        dh, dw = op.options.get("dilation_h_factor", 1), op.options.get("dilation_w_factor", 1)
        if dh != 1 or dw != 1:
            return f"dilation {dh}x{dw} (ESP-NN needs dilation 1)", f"dilation {dh}x{dw}"
    if op.opcode in ELEMENTWISE and len(op.inputs) >= 2:
        a, b = t[op.inputs[0]].shape, t[op.inputs[1]].shape
        n = max(len(a), len(b))
        ea, eb = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
        if ea != eb:
            return f"broadcast {list(a)} vs {list(b)} (ESP-NN handles same-shape inputs only)", "broadcast"
    if op.opcode in POOLS:
        shape = t[op.outputs[0]].shape
        depth = shape[-1] if shape else 0
        if depth % 4:
            return f"depth {depth} not a multiple of 4 (uses esp_nn_*_pool_s8_ansi)", f"depth {depth} % 4"
    return None


def espnn_model_acceleration(model: ModelInfo, chip: str) -> list[OpAcceleration]:
    """Per op of the main subgraph: does ESP-NN accelerate it on ``chip``, including fallbacks.

    Fallback rules (int8 only, dilation 1, no broadcast ADD/MUL, pool depth % 4 == 0) follow
    esp-tflite-micro's kernels/esp_nn/*.cc; see ``harness/data/ops.toml``.
    """
    listed = set(espnn_ops(chip))
    desc = family_description(chip)
    out: list[OpAcceleration] = []
    for op in model.main_ops:
        reason = _fallback_reason(op, model) if op.opcode in listed else None
        if op.opcode not in listed:
            row = (False, "no ESP-NN kernel (TFLM reference)", "-")
        elif reason is None:
            row = (True, desc, "yes")
        else:
            row = (False, "fallback: " + reason[0], "no: " + reason[1])
        out.append(OpAcceleration(op.index, op.opcode, *row))
    return out
