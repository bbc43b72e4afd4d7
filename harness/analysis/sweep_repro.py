"""A kernel-sweep finding as a one-op .tflite plus its input (docs/sweep.md), for ``flash-and-compare``.

The tensors are the driver's own (rebuilt from the case's seed, ``harness.analysis.sweep_cases``), the
quantization is the case's scales, so TFLM's Prepare computes the same multipliers, shifts and
activation range the driver passed to esp-nn. What a reproduction holds (a constant second operand of
ADD / MUL, ``case.txt`` for an API-only case): docs/sweep.md, "Findings".
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import flatbuffers
import numpy as np

from harness.analysis.sweep_cases import Case, bias_values, from_scales, int8_values
from harness.analysis.sweep_findings import Result
from harness.errors import ModelError
from harness.model.extract import write_buffer, write_model, write_operator, write_table, write_tensor
from harness.model.loader import parse_model_bytes
from harness.model.opdata import espnn_model_acceleration

ACT = {"NONE": 0, "RELU": 1, "RELU6": 3}
CODES = {
    "conv": 3,
    "depthwise": 4,
    "fully_connected": 9,
    "add": 0,
    "mul": 18,
    "avg_pool": 1,
    "max_pool": 17,
    "softmax": 25,
}
INT8, INT32 = 9, 2


class _Writer:
    """Tensors and buffers of one single-op model."""

    def __init__(self, size: int) -> None:
        import tflite  # lazy: ~25 ms; only a finding's .tflite needs it, not a sweep with none

        self.tfl = tflite
        self.b = flatbuffers.Builder(size + 4096)
        self.buffers = [write_buffer(tflite, self.b, None)]
        self.tensors: list[int] = []
        self.shapes: list[list[int]] = []  # per tensor: tensor 0 is the model's input

    def tensor(
        self,
        name: str,
        shape: list[int],
        dtype: int,
        scales: list[float],
        zps: list[int],
        qdim: int = 0,
        data: np.ndarray | None = None,
    ) -> int:
        tfl, b = self.tfl, self.b
        buf = 0
        if data is not None:
            self.buffers.append(write_buffer(tfl, b, np.ascontiguousarray(data).tobytes()))
            buf = len(self.buffers) - 1
        self.tensors.append(write_tensor(tfl, b, name, shape, dtype, buffer=buf, quant=(scales, zps, qdim)))
        self.shapes.append(shape)
        return len(self.tensors) - 1

    def options(self, name: str, **fields: float) -> tuple[int, int]:
        """A builtin-options table ``name`` with ``fields`` added in their order: (options type, offset)."""
        return int(getattr(self.tfl.BuiltinOptions, name)), write_table(self.tfl, self.b, name, **fields)

    def finish(self, code: int, inputs: list[int], output: int, options: tuple[int, int] | None) -> bytes:
        tfl, b = self.tfl, self.b
        code_off, op = write_operator(tfl, b, (code, min(code, 127), 1), inputs, [output], options)
        return write_model(
            tfl, b, self.tensors, op=op, code=code_off, buffers=self.buffers, inputs=[0], outputs=[output]
        )


def _conv_like(writer: _Writer, case: Case) -> tuple[list[int], int, tuple[int, int]]:
    m = case.meta
    dw = case.op == "depthwise"
    oc = m["oc"]
    fshape = [1, m["kh"], m["kw"], oc] if dw else [oc, m["kh"], m["kw"], m["fc"]]
    filt = int8_values(case.seed, 1, int(np.prod(fshape)), -127, 127).reshape(fshape)
    bias = bias_values(case.seed, oc, m["bias_range"])
    writer.tensor("input", [1, m["ih"], m["iw"], m["ic"]], INT8, [m["in_scale"]], [m["in_zp"]])
    writer.tensor("filter", fshape, INT8, m["w_scales"], [0] * oc, qdim=3 if dw else 0, data=filt)
    writer.tensor("bias", [oc], INT32, [m["in_scale"] * s for s in m["w_scales"]], [0] * oc, data=bias)
    out = writer.tensor("output", [1, m["oh"], m["ow"], oc], INT8, [m["out_scale"]], [m["out_zp"]])
    pad = writer.tfl.Padding.SAME if m["same"] else writer.tfl.Padding.VALID
    geometry = {"Padding": pad, "StrideW": m["sw"], "StrideH": m["sh"]}
    mult = {"DepthMultiplier": m["mult_ch"]} if dw else {}
    rest = {"FusedActivationFunction": ACT[m["act"]], "DilationWFactor": 1, "DilationHFactor": 1}
    name = "DepthwiseConv2DOptions" if dw else "Conv2DOptions"
    return [0, 1, 2], out, writer.options(name, **geometry, **mult, **rest)


def _fc(writer: _Writer, case: Case) -> tuple[list[int], int, tuple[int, int]]:
    m = case.meta
    row, oc = m["row"], m["oc"]
    scales = m["w_scales"] if m["per_channel"] else m["w_scales"][:1]
    filt = int8_values(case.seed, 1, oc * row, -127, 127).reshape(oc, row)
    bias = bias_values(case.seed, oc, m["bias_range"])
    writer.tensor("input", [1, row], INT8, [m["in_scale"]], [m["in_zp"]])
    writer.tensor("filter", [oc, row], INT8, scales, [0] * len(scales), data=filt)
    writer.tensor("bias", [oc], INT32, [m["in_scale"] * s for s in scales], [0] * len(scales), data=bias)
    out = writer.tensor("output", [1, oc], INT8, [m["out_scale"]], [m["out_zp"]])
    return [0, 1, 2], out, writer.options("FullyConnectedOptions", FusedActivationFunction=ACT[m["act"]])


def _binary(writer: _Writer, case: Case) -> tuple[list[int], int, tuple[int, int]]:
    m = case.meta
    n, (s1, s2, so), (z1, z2, zo) = m["size"], m["scales"], m["zps"]
    writer.tensor("input", [1, n], INT8, [s1], [z1])
    writer.tensor("operand", [1, n], INT8, [s2], [z2], data=int8_values(case.seed, 1, n, case.lo, case.hi))
    out = writer.tensor("output", [1, n], INT8, [so], [zo])
    name = "AddOptions" if case.op == "add" else "MulOptions"
    return [0, 1], out, writer.options(name, FusedActivationFunction=ACT[m["act"]])


def _pool(writer: _Writer, case: Case) -> tuple[list[int], int, tuple[int, int]]:
    m = case.meta
    writer.tensor("input", [1, m["ih"], m["iw"], m["ch"]], INT8, [m["scale"]], [m["zp"]])
    out = writer.tensor("output", [1, m["oh"], m["ow"], m["ch"]], INT8, [m["scale"]], [m["zp"]])
    opts = writer.options(
        "Pool2DOptions",
        Padding=writer.tfl.Padding.SAME if m["same"] else writer.tfl.Padding.VALID,
        StrideW=m["sw"],
        StrideH=m["sh"],
        FilterWidth=m["kw"],
        FilterHeight=m["kh"],
        FusedActivationFunction=ACT[m["act"]],
    )
    return [0], out, opts


def _softmax(writer: _Writer, case: Case) -> tuple[list[int], int, tuple[int, int]]:
    m = case.meta
    writer.tensor("input", [m["rows"], m["depth"]], INT8, [m["in_scale"]], [m["in_zp"]])
    out = writer.tensor("output", [m["rows"], m["depth"]], INT8, [1.0 / 256], [-128])
    return [0], out, writer.options("SoftmaxOptions", Beta=1.0)


_BUILD = {
    "conv": _conv_like,
    "depthwise": _conv_like,
    "fully_connected": _fc,
    "add": _binary,
    "mul": _binary,
    "avg_pool": _pool,
    "max_pool": _pool,
    "softmax": _softmax,
}


def repro_model(case: Case) -> tuple[bytes, np.ndarray]:
    """(.tflite bytes, int8 input) of a TFLite-reachable case; ModelError for an API-only one."""
    if not case.reachable:
        why = case.meta.get("why_api_only") or "TFLite cannot express it as a model"
        raise ModelError(f"{case.op} case {case.id} is API-only: {why}")
    if case.op in ("conv", "depthwise", "fully_connected") and not from_scales(case.meta):
        raise ModelError(
            f"{case.op} case {case.id} has raw multipliers and shifts (--all) with no tensor scales behind "
            "them: no .tflite gives TFLM the same numbers"
        )
    w = _Writer(64 * 1024)
    ins, out, opts = _BUILD[case.op](w, case)
    data = w.finish(CODES[case.op], ins, out, opts)
    shape = w.shapes[0]
    x = int8_values(case.seed, 0, int(np.prod(shape)), case.lo, case.hi).reshape(shape)
    return data, x


def write_repro(
    case: Case, directory: Path, result: Result | None, board_args: list[str] | None = None
) -> dict[str, Any]:
    """``case.txt`` always; ``model.tflite`` + ``input.npy`` when TFLite can express the case.

    ``board_args`` (e.g. ``--board native-esp32 --components-dir DIR``) go into the printed command, so
    it runs on the kernels the sweep found the bug in; without them the command is not given."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "case.txt").write_text(case.line() + "\n", encoding="utf-8")
    info: dict[str, Any] = {"dir": str(directory), "case": "case.txt"}
    if result is not None and result.outputs is not None:
        info["outputs"] = {
            k: (v.hex() if v is not None else None)
            for k, v in zip(("optimized", "ansi_c", "reference"), result.outputs, strict=True)
        }
    try:
        model, x = repro_model(case)
    except ModelError as exc:
        info["model"] = None
        info["why_no_model"] = exc.message
    else:
        (directory / "model.tflite").write_bytes(model)
        np.save(directory / "input.npy", x)
        info["model"] = "model.tflite"
        info["input"] = "input.npy"
        if not board_args:
            info["why_no_command"] = (
                "no esp-tflite-micro sources were given (--tflm or --components-dir): no native firmware "
                "can be built to run the model on these esp-nn sources"
            )
        else:
            # the native board's chip (esp32) maps some kernels the sweep calls (pooling, for one) to
            # ANSI C in both builds: flash-and-compare would refuse the model as untested by ESP-NN
            accel = espnn_model_acceleration(parse_model_bytes(model), "esp32")
            untested = not any(a.accelerated for a in accel)
            info["command"] = shlex.join(
                [
                    "esp-check",
                    "flash-and-compare",
                    str(directory / "model.tflite"),
                    "--input",
                    str(directory / "input.npy"),
                    *board_args,
                    *(["--allow-untested"] if untested else []),
                ]
            )
    (directory / "finding.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info
