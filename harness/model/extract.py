"""A one-op .tflite cut out of a model: the op, its real weights, its tensors' quantization (docs/hybrid.md).

What an esp-nn maintainer needs to reproduce a divergence on their own: the culprit op alone, fed with
the input tensor the device captured (``--tap --dump-ops``). Built with the ``tflite`` schema package's
builder functions; the op's builtin options are copied field by field (the options of the ops ESP-NN
accelerates hold scalars only), so the extracted op computes exactly what it did in the model.
"""

from __future__ import annotations

from typing import Any

import flatbuffers
import numpy as np

from harness.errors import ModelError
from harness.model.loader import parse_model_bytes

_SKIP = ("Init", "GetRootAs")
_VECTOR_SUFFIXES = ("Length", "AsNumpy", "IsNone")


def _enum_names(cls: type) -> dict[int, str]:
    return {v: k for k, v in vars(cls).items() if not k.startswith("_") and isinstance(v, int)}


def _options(tfl: Any, b: flatbuffers.Builder, op: Any) -> tuple[int, int | None]:
    """(options type, offset of the copied options table) of operator ``op``."""
    kind = int(op.BuiltinOptionsType())
    if kind == 0:
        return 0, None
    name = _enum_names(tfl.BuiltinOptions).get(kind)
    cls = getattr(tfl, name, None) if name else None
    table = op.BuiltinOptions()
    if cls is None or table is None:
        raise ModelError(f"op options type {kind} is unknown to the tflite schema package")
    src = cls()
    src.Init(table.Bytes, table.Pos)
    values: list[tuple[Any, Any]] = []
    for attr in sorted(dir(cls)):
        if attr.startswith(("_", *_SKIP)) or attr.endswith(_VECTOR_SUFFIXES):
            continue
        adder = getattr(tfl, f"{name}Add{attr}", None)
        if adder is None or not callable(getattr(src, attr)):
            continue
        if hasattr(src, attr + "Length"):
            if getattr(src, attr + "Length")():
                raise ModelError(f"{name}.{attr} is a vector: this op cannot be extracted on its own")
            continue
        values.append((adder, getattr(src, attr)()))
    getattr(tfl, f"{name}Start")(b)
    for adder, value in values:
        adder(b, value)
    return kind, getattr(tfl, f"{name}End")(b)


def _vec(b: flatbuffers.Builder, start: Any, values: list[Any], prepend: Any) -> int:
    start(b, len(values))
    for v in reversed(values):
        prepend(v)
    return int(b.EndVector())


def _tensor(tfl: Any, b: flatbuffers.Builder, t: Any, buffer: int) -> int:
    """Copy tensor ``t`` (shape, type, name, quantization) pointing at ``buffer``."""
    q = t.Quantization()
    quant = None
    if q is not None and q.ScaleLength():
        zps = [int(z) for z in q.ZeroPointAsNumpy()] if q.ZeroPointLength() else []
        quant = [float(s) for s in q.ScaleAsNumpy()], zps, int(q.QuantizedDimension())
    shape = [int(x) for x in t.ShapeAsNumpy()] if t.ShapeLength() else []
    return write_tensor(tfl, b, t.Name() or b"t", shape, int(t.Type()), buffer=buffer, quant=quant)


def write_tensor(
    tfl: Any,
    b: flatbuffers.Builder,
    name: str | bytes,
    shape: list[int],
    dtype: int,
    *,
    buffer: int,
    quant: tuple[list[float], list[int], int] | None,
) -> int:
    """A Tensor table; ``quant`` = (scales, zero points, quantized dimension), None for none."""
    name_off = b.CreateString(name)
    shape_off = _vec(b, tfl.TensorStartShapeVector, shape, b.PrependInt32)
    q_off = None
    if quant is not None:
        scales, zps, qdim = quant
        sv = _vec(b, tfl.QuantizationParametersStartScaleVector, scales, b.PrependFloat32)
        zv = _vec(b, tfl.QuantizationParametersStartZeroPointVector, zps, b.PrependInt64)
        tfl.QuantizationParametersStart(b)
        tfl.QuantizationParametersAddScale(b, sv)
        tfl.QuantizationParametersAddZeroPoint(b, zv)
        tfl.QuantizationParametersAddQuantizedDimension(b, qdim)
        q_off = tfl.QuantizationParametersEnd(b)
    tfl.TensorStart(b)
    tfl.TensorAddShape(b, shape_off)
    tfl.TensorAddType(b, dtype)
    tfl.TensorAddBuffer(b, buffer)
    tfl.TensorAddName(b, name_off)
    if q_off is not None:
        tfl.TensorAddQuantization(b, q_off)
    return int(tfl.TensorEnd(b))


def write_operator(
    tfl: Any,
    b: flatbuffers.Builder,
    code: tuple[int, int, int],
    inputs: list[int],
    outputs: list[int],
    options: tuple[int, int] | None,
) -> tuple[int, int]:
    """(OperatorCode, Operator) of a one-op model: ``code`` = (builtin code, deprecated builtin code,
    version), ``options`` = (builtin options type, offset of the options table) or None."""
    tfl.OperatorCodeStart(b)
    tfl.OperatorCodeAddBuiltinCode(b, code[0])
    tfl.OperatorCodeAddDeprecatedBuiltinCode(b, code[1])
    tfl.OperatorCodeAddVersion(b, code[2])
    code_off = int(tfl.OperatorCodeEnd(b))
    ins = _vec(b, tfl.OperatorStartInputsVector, inputs, b.PrependInt32)
    outs = _vec(b, tfl.OperatorStartOutputsVector, outputs, b.PrependInt32)
    tfl.OperatorStart(b)
    tfl.OperatorAddOpcodeIndex(b, 0)
    tfl.OperatorAddInputs(b, ins)
    tfl.OperatorAddOutputs(b, outs)
    if options is not None:
        tfl.OperatorAddBuiltinOptionsType(b, options[0])
        tfl.OperatorAddBuiltinOptions(b, options[1])
    return code_off, int(tfl.OperatorEnd(b))


def single_op_model(model_bytes: bytes, op_index: int) -> bytes:
    """A one-subgraph model holding only op ``op_index`` of subgraph 0: its non-constant inputs are the
    model's inputs (in the op's order), its outputs the model's outputs, its constants keep their data."""
    import tflite

    info = parse_model_bytes(model_bytes)
    if not 0 <= op_index < len(info.main_ops):
        raise ModelError(f"op {op_index} does not exist (the model has ops 0..{len(info.main_ops) - 1})")
    model = tflite.Model.GetRootAsModel(model_bytes, 0)
    sg = model.Subgraphs(0)
    op = sg.Operators(op_index)
    ins = [int(x) for x in op.InputsAsNumpy()] if op.InputsLength() else []
    outs = [int(x) for x in op.OutputsAsNumpy()] if op.OutputsLength() else []
    used = list(dict.fromkeys(t for t in ins + outs if t >= 0))
    new_index = {t: k for k, t in enumerate(used)}
    b = flatbuffers.Builder(1024 + sum(info.tensors[t].nbytes for t in used))
    buffers = [_buffer(tflite, b, None)]
    tensor_offsets = []
    for t in used:
        src = sg.Tensors(t)
        data = model.Buffers(src.Buffer()).DataAsNumpy() if info.tensors[t].is_constant else None
        buf = 0
        if isinstance(data, np.ndarray) and data.size:
            buffers.append(_buffer(tflite, b, data.tobytes()))
            buf = len(buffers) - 1
        tensor_offsets.append(_tensor(tflite, b, src, buf))
    opts_type, opts = _options(tflite, b, op)
    code = model.OperatorCodes(op.OpcodeIndex())
    code_off, op_off = write_operator(
        tflite,
        b,
        (int(code.BuiltinCode()), int(code.DeprecatedBuiltinCode()), int(code.Version())),
        [new_index.get(t, -1) for t in ins],
        [new_index[t] for t in outs if t >= 0],
        (opts_type, opts) if opts is not None else None,
    )
    model_ins = [new_index[t] for t in ins if t >= 0 and not info.tensors[t].is_constant]
    model_outs = [new_index[t] for t in outs if t >= 0]
    return _finish(tflite, b, tensor_offsets, op_off, code_off, buffers, model_ins, model_outs)


def _buffer(tfl: Any, b: flatbuffers.Builder, data: bytes | None) -> int:
    vec = b.CreateByteVector(data) if data else None
    tfl.BufferStart(b)
    if vec is not None:
        tfl.BufferAddData(b, vec)
    return int(tfl.BufferEnd(b))


def _finish(
    tfl: Any,
    b: flatbuffers.Builder,
    tensors: list[int],
    op: int,
    code: int,
    buffers: list[int],
    inputs: list[int],
    outputs: list[int],
) -> bytes:
    tv = _vec(b, tfl.SubGraphStartTensorsVector, tensors, b.PrependUOffsetTRelative)
    ov = _vec(b, tfl.SubGraphStartOperatorsVector, [op], b.PrependUOffsetTRelative)
    iv = _vec(b, tfl.SubGraphStartInputsVector, inputs, b.PrependInt32)
    outv = _vec(b, tfl.SubGraphStartOutputsVector, outputs, b.PrependInt32)
    tfl.SubGraphStart(b)
    tfl.SubGraphAddTensors(b, tv)
    tfl.SubGraphAddOperators(b, ov)
    tfl.SubGraphAddInputs(b, iv)
    tfl.SubGraphAddOutputs(b, outv)
    sg = tfl.SubGraphEnd(b)
    sgv = _vec(b, tfl.ModelStartSubgraphsVector, [sg], b.PrependUOffsetTRelative)
    cv = _vec(b, tfl.ModelStartOperatorCodesVector, [code], b.PrependUOffsetTRelative)
    bv = _vec(b, tfl.ModelStartBuffersVector, buffers, b.PrependUOffsetTRelative)
    desc = b.CreateString("esp-check: one op extracted from a model, with its real weights")
    tfl.ModelStart(b)
    tfl.ModelAddVersion(b, 3)
    tfl.ModelAddOperatorCodes(b, cv)
    tfl.ModelAddSubgraphs(b, sgv)
    tfl.ModelAddBuffers(b, bv)
    tfl.ModelAddDescription(b, desc)
    b.Finish(tfl.ModelEnd(b), file_identifier=b"TFL3")
    return bytes(b.Output())
