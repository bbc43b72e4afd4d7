"""A tiny .tflite writer for tests (flatbuffers + the `tflite` schema package's builder functions).

It makes models the fixtures do not cover: ops stored only in ``deprecated_builtin_code``, ops TFLM
cannot run, float and int16 I/O, several inputs, broadcasting ADD. Other test files import
``build_model``; the tests here check that what it writes reads back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import flatbuffers
import numpy as np
import tflite

from harness.model.loader import parse_model_bytes

TYPE = {"float32": 0, "float16": 1, "int32": 2, "uint8": 3, "int64": 4, "bool": 6, "int16": 7, "int8": 9}


@dataclass
class T:
    """A tensor: name, shape, dtype, optional quantization, optional constant data."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "int8"
    scale: float | None = None
    zero_point: int = 0
    data: np.ndarray | None = None
    scales: tuple[float, ...] | None = None  # per-channel scales (zero points 0), instead of `scale`
    qdim: int | None = None  # quantized_dimension, written when given


@dataclass
class Op:
    """An operator: builtin code (and deprecated code), tensor indices, optional ADD options."""

    builtin: int
    inputs: list[int]
    outputs: list[int]
    deprecated: int | None = None
    custom: str | None = None
    add_options: bool = False
    extra: dict[str, int] = field(default_factory=dict)
    # (BuiltinOptions type, writer returning the options table offset), e.g. Conv2DOptions
    options: tuple[int, Callable[[flatbuffers.Builder], int]] | None = None


def _ivec(b: flatbuffers.Builder, start: object, values: list[int]) -> int:
    start(b, len(values))  # type: ignore[operator]
    for v in reversed(values):
        b.PrependInt32(v)
    return b.EndVector()


def build_model(tensors: list[T], ops: list[Op], inputs: list[int], outputs: list[int]) -> bytes:
    """Serialize a one-subgraph model with the TFL3 identifier."""
    b = flatbuffers.Builder(1024)
    # buffers: 0 = empty sentinel, then one per constant tensor
    buffer_of: dict[int, int] = {}
    buf_offsets = []
    tflite.BufferStart(b)
    buf_offsets.append(tflite.BufferEnd(b))
    for i, t in enumerate(tensors):
        if t.data is not None:
            raw = np.ascontiguousarray(t.data.astype(t.dtype)).tobytes()
            vec = b.CreateByteVector(raw)
            tflite.BufferStart(b)
            tflite.BufferAddData(b, vec)
            buffer_of[i] = len(buf_offsets)
            buf_offsets.append(tflite.BufferEnd(b))
    t_offsets = []
    for i, t in enumerate(tensors):
        name = b.CreateString(t.name)
        shape = _ivec(b, tflite.TensorStartShapeVector, list(t.shape))
        q = None
        if t.scale is not None or t.scales is not None:
            scales = list(t.scales) if t.scales is not None else [t.scale]
            zps = [0] * len(scales) if t.scales is not None else [t.zero_point]
            tflite.QuantizationParametersStartScaleVector(b, len(scales))
            for sc in reversed(scales):
                b.PrependFloat32(sc)
            sv = b.EndVector()
            tflite.QuantizationParametersStartZeroPointVector(b, len(zps))
            for zp in reversed(zps):
                b.PrependInt64(zp)
            zv = b.EndVector()
            tflite.QuantizationParametersStart(b)
            tflite.QuantizationParametersAddScale(b, sv)
            tflite.QuantizationParametersAddZeroPoint(b, zv)
            if t.qdim is not None:
                b.ForceDefaults(True)
                tflite.QuantizationParametersAddQuantizedDimension(b, t.qdim)
                b.ForceDefaults(False)
            q = tflite.QuantizationParametersEnd(b)
        tflite.TensorStart(b)
        tflite.TensorAddShape(b, shape)
        tflite.TensorAddType(b, TYPE[t.dtype])
        tflite.TensorAddBuffer(b, buffer_of.get(i, 0))
        tflite.TensorAddName(b, name)
        if q is not None:
            tflite.TensorAddQuantization(b, q)
        t_offsets.append(tflite.TensorEnd(b))
    # operator codes: one per op (duplicates are fine)
    code_offsets = []
    for op in ops:
        custom = b.CreateString(op.custom) if op.custom else None
        tflite.OperatorCodeStart(b)
        tflite.OperatorCodeAddBuiltinCode(b, op.builtin)
        tflite.OperatorCodeAddDeprecatedBuiltinCode(
            b, op.deprecated if op.deprecated is not None else min(op.builtin, 127)
        )
        tflite.OperatorCodeAddVersion(b, 1)
        if custom is not None:
            tflite.OperatorCodeAddCustomCode(b, custom)
        code_offsets.append(tflite.OperatorCodeEnd(b))
    op_offsets = []
    for k, op in enumerate(ops):
        ins = _ivec(b, tflite.OperatorStartInputsVector, op.inputs)
        outs = _ivec(b, tflite.OperatorStartOutputsVector, op.outputs)
        opts = None
        opts_type = tflite.BuiltinOptions.AddOptions
        if op.add_options:
            tflite.AddOptionsStart(b)
            tflite.AddOptionsAddFusedActivationFunction(b, 0)
            opts = tflite.AddOptionsEnd(b)
        elif op.options is not None:
            opts_type, write = op.options
            opts = write(b)
        tflite.OperatorStart(b)
        tflite.OperatorAddOpcodeIndex(b, k)
        tflite.OperatorAddInputs(b, ins)
        tflite.OperatorAddOutputs(b, outs)
        if opts is not None:
            tflite.OperatorAddBuiltinOptionsType(b, opts_type)
            tflite.OperatorAddBuiltinOptions(b, opts)
        op_offsets.append(tflite.OperatorEnd(b))

    def table_vec(start: object, offs: list[int]) -> int:
        start(b, len(offs))  # type: ignore[operator]
        for o in reversed(offs):
            b.PrependUOffsetTRelative(o)
        return b.EndVector()

    tv = table_vec(tflite.SubGraphStartTensorsVector, t_offsets)
    ov = table_vec(tflite.SubGraphStartOperatorsVector, op_offsets)
    iv = _ivec(b, tflite.SubGraphStartInputsVector, inputs)
    outv = _ivec(b, tflite.SubGraphStartOutputsVector, outputs)
    tflite.SubGraphStart(b)
    tflite.SubGraphAddTensors(b, tv)
    tflite.SubGraphAddOperators(b, ov)
    tflite.SubGraphAddInputs(b, iv)
    tflite.SubGraphAddOutputs(b, outv)
    sg = tflite.SubGraphEnd(b)
    sgv = table_vec(tflite.ModelStartSubgraphsVector, [sg])
    cv = table_vec(tflite.ModelStartOperatorCodesVector, code_offsets)
    bv = table_vec(tflite.ModelStartBuffersVector, buf_offsets)
    tflite.ModelStart(b)
    tflite.ModelAddVersion(b, 3)
    tflite.ModelAddOperatorCodes(b, cv)
    tflite.ModelAddSubgraphs(b, sgv)
    tflite.ModelAddBuffers(b, bv)
    b.Finish(tflite.ModelEnd(b), file_identifier=b"TFL3")
    return bytes(b.Output())


ADD, CONV_2D, LSH_PROJECTION, CUSTOM = 0, 3, 15, 32


def float_add_model(shape_b: tuple[int, ...] = (1, 4)) -> bytes:
    """Two float32 inputs -> ADD -> float32 output (float I/O, two model inputs)."""
    return build_model(
        [T("a", (1, 4), "float32"), T("b", shape_b, "float32"), T("sum", (1, 4), "float32")],
        [Op(ADD, [0, 1], [2], add_options=True)],
        inputs=[0, 1],
        outputs=[2],
    )


def int16_add_model() -> bytes:
    """int16 (16x8-style, zero point 0) ADD of two inputs."""
    return build_model(
        [
            T("a", (1, 8), "int16", 0.001, 0),
            T("b", (1, 8), "int16", 0.001, 0),
            T("s", (1, 8), "int16", 0.002, 0),
        ],
        [Op(ADD, [0, 1], [2], add_options=True)],
        inputs=[0, 1],
        outputs=[2],
    )


def int8_broadcast_add_model() -> bytes:
    """int8 ADD of [1,2,2,4] + [1,1,1,4]: ESP-NN falls back to the reference kernel (broadcast)."""
    return build_model(
        [
            T("a", (1, 2, 2, 4), "int8", 0.05, 0),
            T("b", (1, 1, 1, 4), "int8", 0.05, 0),
            T("s", (1, 2, 2, 4), "int8", 0.1, 0),
        ],
        [Op(ADD, [0, 1], [2], add_options=True)],
        inputs=[0, 1],
        outputs=[2],
    )


def conv2d_options(
    padding: int = tflite.Padding.SAME, stride: int = 1, dilation: int = 1
) -> tuple[int, Callable[[flatbuffers.Builder], int]]:
    """``Op.options`` for a CONV_2D: Conv2DOptions (padding, stride, dilation; no activation)."""

    def write(b: flatbuffers.Builder) -> int:
        tflite.Conv2DOptionsStart(b)
        tflite.Conv2DOptionsAddPadding(b, padding)
        tflite.Conv2DOptionsAddStrideW(b, stride)
        tflite.Conv2DOptionsAddStrideH(b, stride)
        tflite.Conv2DOptionsAddFusedActivationFunction(b, 0)
        tflite.Conv2DOptionsAddDilationWFactor(b, dilation)
        tflite.Conv2DOptionsAddDilationHFactor(b, dilation)
        return int(tflite.Conv2DOptionsEnd(b))

    return tflite.BuiltinOptions.Conv2DOptions, write


def padded_conv_model(h: int = 96, w: int = 96, c: int = 3, oc: int = 16, seed: int = 0) -> bytes:
    """int8 [1,h,w,c] -> 3x3 CONV_2D, SAME padding, stride 1 -> int8 [1,h,w,oc]: a typical first layer
    (per-tensor quantization; bias scale = input scale * filter scale, as the converter writes it)."""
    rng = np.random.default_rng(seed)
    s_in, s_f, s_out = 1 / 128, 0.02, 0.05
    return build_model(
        [
            T("image", (1, h, w, c), "int8", s_in, -1),
            T("filter", (oc, 3, 3, c), "int8", s_f, 0, rng.integers(-127, 128, (oc, 3, 3, c))),
            T("bias", (oc,), "int32", s_in * s_f, 0, rng.integers(-2000, 2000, (oc,))),
            T("features", (1, h, w, oc), "int8", s_out, 3),
        ],
        [Op(CONV_2D, [0, 1, 2], [3], options=conv2d_options())],
        inputs=[0],
        outputs=[3],
    )


def test_builder_round_trip() -> None:
    info = parse_model_bytes(float_add_model())
    assert [t.name for t in info.inputs] == ["a", "b"]
    assert [t.name for t in info.outputs] == ["sum"]
    assert info.ops[0].opcode == "ADD"
    assert info.kind == "float"
    assert info.inputs[0].scale is None and info.inputs[0].zero_point is None


def test_builder_int16_kind() -> None:
    info = parse_model_bytes(int16_add_model())
    assert info.kind == "int16"
    assert info.inputs[0].dtype == "int16" and info.inputs[0].scale == np.float32(0.001)


def test_builder_conv_options_read_back() -> None:
    info = parse_model_bytes(padded_conv_model())
    (op,) = info.ops
    assert op.opcode == "CONV_2D" and op.options["padding"] == "SAME"
    assert op.options["stride_h"] == op.options["stride_w"] == 1
    assert info.tensors[op.inputs[1]].shape == (16, 3, 3, 3) and info.tensors[op.inputs[1]].is_constant
    assert info.outputs[0].shape == (1, 96, 96, 16) and info.kind == "int8"
