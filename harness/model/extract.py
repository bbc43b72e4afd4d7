"""A one-op .tflite cut out of a model: the op, its real weights, its tensors' quantization (docs/hybrid.md).

What an esp-nn maintainer needs to reproduce a divergence on their own: the culprit op alone, fed with
the input tensor the device captured (``--tap --dump-ops``). Built with the ``tflite`` schema package's
builder functions; the op's builtin options are copied field by field (the options of the ops ESP-NN
accelerates hold scalars only), so the extracted op computes exactly what it did in the model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING

import flatbuffers
import numpy as np

from harness.errors import ModelError
from harness.model.loader import builtin_options, parse_model_bytes, raw_builtin_code, vector

if TYPE_CHECKING:
    import tflite


def _options(tfl: ModuleType, builder: flatbuffers.Builder, op: tflite.Operator) -> tuple[int, int] | None:
    """(options type, offset of the copied options table) of operator ``op``, None when it has none."""
    kind = int(op.BuiltinOptionsType())
    if kind == 0:
        return None
    found = builtin_options(tfl, op)
    if found is None:
        raise ModelError(f"op options type {kind} is unknown to the tflite schema package")
    name, src, accessors = found
    values: dict[str, object] = {}
    for attr in accessors:
        if attr.startswith("Init") or not hasattr(tfl, f"{name}Add{attr}"):
            continue
        if hasattr(src, attr + "Length"):
            if getattr(src, attr + "Length")():
                raise ModelError(f"{name}.{attr} is a vector: this op cannot be extracted on its own")
            continue
        values[attr] = getattr(src, attr)()
    return kind, write_table(tfl, builder, name, **values)


def write_table(tfl: ModuleType, builder: flatbuffers.Builder, name: str, **fields: object) -> int:
    """A ``name`` table (Tensor, Operator, Model, ...) with ``fields`` added in their order (the byte
    layout follows it); a field that is None is left out."""
    getattr(tfl, f"{name}Start")(builder)
    for field, value in fields.items():
        if value is not None:
            getattr(tfl, f"{name}Add{field}")(builder, value)
    return int(getattr(tfl, f"{name}End")(builder))


def _vec(
    builder: flatbuffers.Builder,
    start: Callable[[flatbuffers.Builder, int], object],
    values: Sequence[float],
    prepend: Callable[[float], object],
) -> int:
    start(builder, len(values))
    for v in reversed(values):
        prepend(v)
    return int(builder.EndVector())


def _tensor(tfl: ModuleType, builder: flatbuffers.Builder, tensor: tflite.Tensor, buffer: int) -> int:
    """Copy ``tensor`` (shape, type, name, quantization) pointing at ``buffer``."""
    q = tensor.Quantization()
    quant = None
    if q is not None and q.ScaleLength():
        quant = list(vector(q, "Scale", float)), list(vector(q, "ZeroPoint")), int(q.QuantizedDimension())
    shape = list(vector(tensor, "Shape"))
    return write_tensor(
        tfl, builder, tensor.Name() or b"t", shape, int(tensor.Type()), buffer=buffer, quant=quant
    )


def write_tensor(
    tfl: ModuleType,
    builder: flatbuffers.Builder,
    name: str | bytes,
    shape: list[int],
    dtype: int,
    *,
    buffer: int,
    quant: tuple[list[float], list[int], int] | None,
) -> int:
    """A Tensor table; ``quant`` = (scales, zero points, quantized dimension), None for none."""
    name_off = builder.CreateString(name)
    shape_off = _vec(builder, tfl.TensorStartShapeVector, shape, builder.PrependInt32)
    q_off = None
    if quant is not None:
        scales, zps, qdim = quant
        sv = _vec(builder, tfl.QuantizationParametersStartScaleVector, scales, builder.PrependFloat32)
        zv = _vec(builder, tfl.QuantizationParametersStartZeroPointVector, zps, builder.PrependInt64)
        q_off = write_table(
            tfl, builder, "QuantizationParameters", Scale=sv, ZeroPoint=zv, QuantizedDimension=qdim
        )
    fields = {"Shape": shape_off, "Type": dtype, "Buffer": buffer, "Name": name_off, "Quantization": q_off}
    return write_table(tfl, builder, "Tensor", **fields)


def write_operator(
    tfl: ModuleType,
    builder: flatbuffers.Builder,
    code: tuple[int, int, int],
    inputs: list[int],
    outputs: list[int],
    options: tuple[int, int] | None,
) -> tuple[int, int]:
    """(OperatorCode, Operator) of a one-op model: ``code`` = (builtin code, deprecated builtin code,
    version), ``options`` = (builtin options type, offset of the options table) or None."""
    builtin, deprecated, version = code
    code_off = write_table(
        tfl, builder, "OperatorCode", BuiltinCode=builtin, DeprecatedBuiltinCode=deprecated, Version=version
    )
    ins = _vec(builder, tfl.OperatorStartInputsVector, inputs, builder.PrependInt32)
    outs = _vec(builder, tfl.OperatorStartOutputsVector, outputs, builder.PrependInt32)
    kind, table = options if options is not None else (None, None)
    op = {
        "OpcodeIndex": 0,
        "Inputs": ins,
        "Outputs": outs,
        "BuiltinOptionsType": kind,
        "BuiltinOptions": table,
    }
    return code_off, write_table(tfl, builder, "Operator", **op)


def single_op_model(model_bytes: bytes, op_index: int) -> bytes:
    """A one-subgraph model holding only op ``op_index`` of subgraph 0: its non-constant inputs are the
    model's inputs (in the op's order), its outputs the model's outputs, its constants keep their data."""
    import tflite  # lazy: ~25 ms; `hybrid` imports this module, a run writing no reproducer needs none

    info = parse_model_bytes(model_bytes)
    if not 0 <= op_index < len(info.main_ops):
        raise ModelError(f"op {op_index} does not exist (the model has ops 0..{len(info.main_ops) - 1})")
    model = tflite.Model.GetRootAsModel(model_bytes, 0)
    sg = model.Subgraphs(0)
    op = sg.Operators(op_index)
    ins, outs = info.main_ops[op_index].inputs, info.main_ops[op_index].outputs
    used = list(dict.fromkeys(t for t in (*ins, *outs) if t >= 0))
    new_index = {t: k for k, t in enumerate(used)}
    b = flatbuffers.Builder(1024 + sum(info.tensors[t].nbytes for t in used))
    buffers = [write_buffer(tflite, b, None)]
    tensor_offsets = []
    for t in used:
        src = sg.Tensors(t)
        data = model.Buffers(src.Buffer()).DataAsNumpy() if info.tensors[t].is_constant else None
        buf = 0
        if isinstance(data, np.ndarray) and data.size:
            buffers.append(write_buffer(tflite, b, data.tobytes()))
            buf = len(buffers) - 1
        tensor_offsets.append(_tensor(tflite, b, src, buf))
    code = model.OperatorCodes(op.OpcodeIndex())
    code_off, op_off = write_operator(
        tflite,
        b,
        (raw_builtin_code(code), int(code.DeprecatedBuiltinCode()), int(code.Version())),
        [new_index.get(t, -1) for t in ins],
        [new_index[t] for t in outs if t >= 0],
        _options(tflite, b, op),
    )
    model_ins = [new_index[t] for t in ins if t >= 0 and not info.tensors[t].is_constant]
    model_outs = [new_index[t] for t in outs if t >= 0]
    return write_model(
        tflite,
        b,
        tensor_offsets,
        op=op_off,
        code=code_off,
        buffers=buffers,
        inputs=model_ins,
        outputs=model_outs,
    )


def write_buffer(tfl: ModuleType, builder: flatbuffers.Builder, data: bytes | None) -> int:
    """A Buffer table holding ``data`` (an empty one for None): buffer 0 of a model is always empty."""
    return write_table(tfl, builder, "Buffer", Data=builder.CreateByteVector(data) if data else None)


def write_model(
    tfl: ModuleType,
    builder: flatbuffers.Builder,
    tensors: list[int],
    op: int,
    code: int,
    buffers: list[int],
    inputs: list[int],
    outputs: list[int],
) -> bytes:
    """The finished one-subgraph, one-op model (``TFL3``) made of what ``builder`` already holds."""
    tv = _vec(builder, tfl.SubGraphStartTensorsVector, tensors, builder.PrependUOffsetTRelative)
    ov = _vec(builder, tfl.SubGraphStartOperatorsVector, [op], builder.PrependUOffsetTRelative)
    iv = _vec(builder, tfl.SubGraphStartInputsVector, inputs, builder.PrependInt32)
    outv = _vec(builder, tfl.SubGraphStartOutputsVector, outputs, builder.PrependInt32)
    sg = write_table(tfl, builder, "SubGraph", Tensors=tv, Operators=ov, Inputs=iv, Outputs=outv)
    sgv = _vec(builder, tfl.ModelStartSubgraphsVector, [sg], builder.PrependUOffsetTRelative)
    cv = _vec(builder, tfl.ModelStartOperatorCodesVector, [code], builder.PrependUOffsetTRelative)
    bv = _vec(builder, tfl.ModelStartBuffersVector, buffers, builder.PrependUOffsetTRelative)
    desc = builder.CreateString("esp-check: one op extracted from a model, with its real weights")
    fields = {"Version": 3, "OperatorCodes": cv, "Subgraphs": sgv, "Buffers": bv, "Description": desc}
    builder.Finish(write_table(tfl, builder, "Model", **fields), file_identifier=b"TFL3")
    return bytes(builder.Output())
