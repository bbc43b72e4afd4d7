"""Model inspection: parse a .tflite flatbuffer with the pure-Python ``tflite`` schema package.

This module must work on every OS (no TFLM runtime needed): ``inspect`` and ``generate`` run on
macOS and Windows too. Flatbuffers in Python do not verify their input, so :func:`load_model`
checks the file identifier, every index and every vector bound it relies on, and turns any
parsing failure into a :class:`~harness.errors.ModelError` instead of a traceback (or, later, a
segfault inside the C++ interpreter that would be handed the same bytes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import math
import re
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

import flatbuffers

from harness.errors import ModelError
from harness.model import opdata
from harness.model.files import MODEL_MAX_BYTES, read_regular
from harness.model.modelinfo import ModelInfo, OpInfo, TensorInfo, tensor_bytes
from harness.model.verify import verify_structure
from harness.protocol.spec import MAX_DIMS
from harness.resources import cache_entry, code_digest, load_stored, store_json

if TYPE_CHECKING:
    import tflite

# --------------------------------------------------------------------------------------------
# parsing


def _snake(name: str) -> str:
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", s).lower()


def enum_names(enum_cls: type) -> dict[int, str]:
    """Value -> name of a flatbuffer schema enum class (``tflite.TensorType``, ...)."""
    return {v: k for k, v in vars(enum_cls).items() if not k.startswith("_") and isinstance(v, int)}


def _lazy_tflite() -> ModuleType:
    try:
        # lazy: ~25 ms; a repeat run reads the parse from the disk cache and never imports tflite
        import tflite
        import tflite.utils  # lazy: as tflite
    except ImportError as exc:  # pragma: no cover - it is a hard dependency
        raise ModelError(
            "the `tflite` flatbuffer schema package is not installed",
            hint="pip install 'tflite>=2.10' (it is a dependency of esp-check; reinstall esp-check)",
        ) from exc
    return tflite


_SKIP_SUFFIXES = ("IsNone", "Length", "AsNumpy", "BufferHasIdentifier")
_N = TypeVar("_N", int, float)


def vector(table: object, field: str, kind: Callable[[Any], _N] = int) -> tuple[_N, ...]:
    """A flatbuffer table's scalar vector ``field`` (``Shape``: ShapeLength, ShapeAsNumpy) as a tuple of
    ``kind``, empty when the table has none."""
    if not getattr(table, f"{field}Length")():
        return ()
    return tuple(kind(x) for x in getattr(table, f"{field}AsNumpy")())


def builtin_options(tfl: ModuleType, op: tflite.Operator) -> tuple[str, Any, list[str]] | None:
    """(class name, table, field accessor names) of an operator's builtin options; None when it has none
    or of a type the ``tflite`` schema package does not know."""
    name = enum_names(tfl.BuiltinOptions).get(op.BuiltinOptionsType())
    cls = getattr(tfl, name, None) if name else None
    table = op.BuiltinOptions()
    if name is None or cls is None or table is None:
        return None
    obj = cls()
    obj.Init(table.Bytes, table.Pos)
    accessors = [
        a for a in dir(cls) if not a.startswith(("_", "GetRootAs")) and not a.endswith(_SKIP_SUFFIXES)
    ]
    return name, obj, [a for a in accessors if a != "Init" and callable(getattr(obj, a))]


def _read_options(tfl: ModuleType, op: tflite.Operator) -> dict[str, object]:
    """Builtin options of one operator as a plain dict (snake_case keys, enums as names)."""
    found = builtin_options(tfl, op)
    if found is None:
        return {}
    _, obj, accessors = found
    enums = {"Padding": tfl.Padding, "FusedActivationFunction": tfl.ActivationFunctionType}
    out: dict[str, object] = {}
    for attr in accessors:
        if hasattr(obj, attr + "AsNumpy"):  # vector field
            out[_snake(attr)] = vector(obj, attr)
            continue
        try:
            value = getattr(obj, attr)()
        except TypeError:
            continue  # accessor needs arguments (nested table): not needed here
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if attr in enums and isinstance(value, int):
            value = enum_names(enums[attr]).get(value, value)
        if isinstance(value, (int, float, bool, str)):
            out[_snake(attr)] = value
    return out


def _tensor_info(
    tfl: ModuleType, tensor: tflite.Tensor, index: int, model: tflite.Model, dtype_names: dict[int, str]
) -> TensorInfo:
    name_raw = tensor.Name()
    name = name_raw.decode("utf-8", "replace") if name_raw else f"tensor_{index}"
    shape = vector(tensor, "Shape")
    if any(d < -1 for d in shape):
        raise ModelError(f"tensor {index} ({name!r}) has shape {list(shape)}, which TFLM cannot hold")
    if any(d < 0 for d in shape):
        sig = vector(tensor, "ShapeSignature") or shape
        shape = tuple(1 if d < 0 else d for d in sig)  # dynamic batch -> 1 (TFLM has no dynamic shapes)
    type_code = tensor.Type()
    if type_code not in dtype_names:
        raise ModelError(f"tensor {index} ({name!r}) has unknown type code {type_code}")
    dtype = dtype_names[type_code].lower()
    q = tensor.Quantization()
    scales = vector(q, "Scale", float) if q is not None else ()
    zps = vector(q, "ZeroPoint") if q is not None else ()
    qdim = int(q.QuantizedDimension()) if q is not None else 0
    buf_index = tensor.Buffer()
    if buf_index < 0 or buf_index >= model.BuffersLength():
        raise ModelError(f"tensor {index} ({name!r}) refers to buffer {buf_index}, which does not exist")
    buf = model.Buffers(buf_index)
    is_const = bool(buf is not None and (buf.DataLength() > 0 or buf.Size() > 0))
    _check_shape(index, name, shape, dtype, is_const)
    if is_const and tensor.Sparsity() is None:
        _check_backing(index, name, shape, dtype, max(int(buf.DataLength()), int(buf.Size())))
    return TensorInfo(
        index=index,
        name=name,
        shape=shape,
        dtype=dtype,
        scale=scales[0] if scales else None,
        zero_point=(zps[0] if zps else 0) if scales else None,
        per_channel=len(scales) > 1,
        scales=scales,
        zero_points=zps,
        quantized_dimension=qdim,
        is_constant=is_const,
        is_variable=bool(tensor.IsVariable()),
    )


# No ESP32 has more than 32 MiB of PSRAM: a non-constant tensor over twice that is a corrupted shape.
MAX_TENSOR_BYTES = 64 * 1024 * 1024


def _check_shape(index: int, name: str, shape: tuple[int, ...], dtype: str, is_const: bool) -> None:
    """Shapes TFLM cannot hold: negative or huge dimensions, too many of them, too many bytes."""
    if len(shape) > MAX_DIMS or any(d < 0 for d in shape):
        raise ModelError(f"tensor {index} ({name!r}) has shape {list(shape)}, which TFLM cannot hold")
    n = math.prod(shape)
    nbytes = tensor_bytes(dtype, n)
    nbytes = n if nbytes is None else nbytes  # string, variant: at least a byte each
    if not is_const and nbytes > MAX_TENSOR_BYTES:
        raise ModelError(
            f"tensor {index} ({name!r}) has shape {list(shape)}: {nbytes} bytes, more than any ESP32 "
            f"can hold (limit {MAX_TENSOR_BYTES} B)",
            hint="the file is corrupted (re-export or re-copy it), or the model is not for a microcontroller",
        )


def _check_backing(index: int, name: str, shape: tuple[int, ...], dtype: str, have: int) -> None:
    """A constant tensor's buffer must hold all its elements (TFLM would read past it)."""
    need = tensor_bytes(dtype, math.prod(shape), packed=True)
    if need is None:
        return  # strings, resources, variants: no fixed size
    if have < need:
        raise ModelError(
            f"constant tensor {index} ({name!r}) of shape {list(shape)} {dtype} needs {need} bytes, "
            f"its buffer holds {have}"
        )


def _check_references(model: tflite.Model, subgraph_tensors: list[int]) -> None:
    """Indices outside the tensor lists: metadata buffers, signature defs (TFLM's wheel reads them)."""
    n_buffers, n_subgraphs = model.BuffersLength(), model.SubgraphsLength()
    for i in range(model.MetadataLength()):
        b = model.Metadata(i).Buffer()
        if not 0 <= b < n_buffers:
            raise ModelError(f"metadata {i} refers to buffer {b}, which does not exist")
    for i in range(model.SignatureDefsLength()):
        sig = model.SignatureDefs(i)
        s = sig.SubgraphIndex()
        if not 0 <= s < n_subgraphs:
            raise ModelError(f"signature {i} refers to subgraph {s}, which does not exist")
        for k in range(sig.InputsLength() + sig.OutputsLength()):
            tm = sig.Inputs(k) if k < sig.InputsLength() else sig.Outputs(k - sig.InputsLength())
            if not 0 <= tm.TensorIndex() < subgraph_tensors[s]:
                raise ModelError(f"signature {i} refers to tensor {tm.TensorIndex()} of subgraph {s}, "
                                 "which does not exist")  # fmt: skip


# TFLM's kernels copy a tensor's shape into a RuntimeShape, which holds at most this many dimensions
# (kMaxSmallSize, tensorflow/lite/kernels/internal/runtime_shape.h): more overflow it (only a DCHECK
# guards it). RESHAPE and SQUEEZE read the dims array itself. The protocol's own bound: spec.MAX_DIMS.
TFLM_MAX_DIMS = 6
_RUNTIME_SHAPE = (TFLM_MAX_DIMS, "kMaxSmallSize in tensorflow/lite/kernels/internal/runtime_shape.h")


def _check_rank(where: str, opcode: str, used: tuple[int, ...], tensors: tuple[TensorInfo, ...]) -> None:
    if opcode in ("RESHAPE", "SQUEEZE"):
        return
    limit, source = opdata.rank_limit(opcode) or _RUNTIME_SHAPE  # smaller per-op limits: ops.toml
    for t in (tensors[i] for i in used if i >= 0):
        if len(t.shape) > limit:
            raise ModelError(
                f"{where} ({opcode}): tensor {t.index} ({t.name!r}) has rank {len(t.shape)}; TFLM's kernel "
                f"holds at most {limit} dimensions ({source}) and writes past that",
                hint=f"re-export it so that {opcode} sees at most {limit} dimensions "
                "(only RESHAPE and SQUEEZE take any rank)",
            )


# TFLM's float MEAN copies its axis entries into MeanParams.axis[4] with no bound (ResolveAxis,
# tensorflow/lite/micro/kernels/reduce_common.cc:66-75, called at :307 for float32 only; types.h:897).
# Their count is the axis tensor's element count (reduce_common.cc:298), fixed by its shape whether the
# tensor is constant or not. SUM, REDUCE_MAX/MIN/ALL and integer MEAN size a scratch buffer by it instead.
_MEAN_AXES = 4


def _check_mean_axes(where: str, opcode: str, ins: tuple[int, ...], tensors: tuple[TensorInfo, ...]) -> None:
    if opcode != "MEAN" or len(ins) < 2 or min(ins[:2]) < 0 or tensors[ins[0]].dtype != "float32":
        return
    axis = tensors[ins[1]]
    if (n := math.prod(axis.shape)) > _MEAN_AXES:
        raise ModelError(
            f"{where} (MEAN): axis tensor {axis.index} ({axis.name!r}) has {n} entries; TFLM's float MEAN "
            f"holds at most {_MEAN_AXES} (MeanParams.axis in tensorflow/lite/kernels/internal/types.h) "
            "and writes past that",
            hint=f"re-export it to reduce over at most {_MEAN_AXES} axes (a RESHAPE can merge adjacent ones)",
        )


# Parameter tensors whose size and type Prepare checks less than Eval reads them (esp-tflite-micro 1.3.8
# micro/kernels): per op, the types Eval reads them as, then per parameter input (index, entries per
# dimension of input 0, dimensions not counted). PAD reads 2 per input dimension, Prepare counts the
# output's (pad_common.cc:66, 94-97); MIRROR_PAD checks only its first dimension (mirror_pad.cc:182,
# 36-37); TRANSPOSE reads int32 (transpose_common.cc:41, transpose.cc:29); SLICE reads size as begin's
# type (slice.cc:42-43, 101-106); STRIDED_SLICE int32 (strided_slice_common.cc:76-78); BATCH_TO_SPACE_ND,
# SPACE_TO_BATCH_ND one block entry and two crops/paddings per spatial dimension (batch_to_space_nd.cc:81-83).
_PARAMS: dict[str, tuple[tuple[str, ...], tuple[tuple[int, int, int], ...]]] = {
    "PAD": (("int32",), ((1, 2, 0),)),
    "PADV2": (("int32",), ((1, 2, 0),)),
    "MIRROR_PAD": (("int32", "int64"), ((1, 2, 0),)),
    "TRANSPOSE": (("int32",), ((1, 1, 0),)),
    "SLICE": (("int32", "int64"), ((1, 1, 0), (2, 1, 0))),
    "STRIDED_SLICE": (("int32",), ((1, 1, 0), (2, 1, 0), (3, 1, 0))),
    "BATCH_TO_SPACE_ND": (("int32",), ((1, 1, 2), (2, 2, 2))),
    "SPACE_TO_BATCH_ND": (("int32",), ((1, 1, 2), (2, 2, 2))),
}
_Values = tuple[tuple[int, ...], ...]


def _transpose_values(
    x: TensorInfo, y: TensorInfo, v: _Values, _: dict[str, object]
) -> tuple[int, str] | None:
    """Prepare checks each entry's range, not repeats (transpose_common.cc:45-48); Eval walks the input by
    the output's dims (reference/transpose.h:102-112)."""
    if sorted(v[0]) != list(range(len(x.shape))) or y.shape != tuple(x.shape[p] for p in v[0]):
        return 0, f"is {list(v[0])}, not a permutation of 0..{len(x.shape) - 1} giving output {list(y.shape)}"
    return None


def _slice_values(x: TensorInfo, y: TensorInfo, v: _Values, _: dict[str, object]) -> tuple[int, str] | None:
    """Eval copies begin..begin+size (-1: to the end) of each dimension, unchecked, into the output
    (reference/slice.h:93-107)."""
    stops = [d if s == -1 else b + s for d, b, s in zip(x.shape, *v, strict=True)]
    for k, (d, b, s, stop) in enumerate(zip(x.shape, *v, stops, strict=True)):
        if not 0 <= b <= stop <= d:
            return 1, f"begin {b} and size {s} for dimension {k} of size {d} run outside the input"
    if (n := math.prod(e - b for e, b in zip(stops, v[0], strict=True))) > math.prod(y.shape):
        return 1, f"selects {n} elements, more than output {list(y.shape)} holds"
    return None


def _block_values(x: TensorInfo, y: TensorInfo, v: _Values, _: dict[str, object]) -> tuple[int, str] | None:
    """Eval divides by the width's block size (reference/batch_to_space_nd.h:78, space_to_batch_nd.h:81)."""
    return (
        (0, f"has block size {min(v[0])} (at least 1), the kernel divides by it") if min(v[0]) < 1 else None
    )


def _mirror_values(
    x: TensorInfo, y: TensorInfo, v: _Values, opt: dict[str, object]
) -> tuple[int, str] | None:
    """A left padding past the input (REFLECT: its size - 1) mirrors outside it (mirror_pad.cc:43-46); no
    options leave the mode unknown, mirrored as SYMMETRIC (core/api/flatbuffer_conversions.cc:1864-1870)."""
    offset = 1 if opt.get("mode") == 0 else 0  # MirrorPadMode.REFLECT
    for k, (d, lo) in enumerate(zip(x.shape, v[0][::2], strict=True)):
        if lo > d - offset:
            return 0, f"has left padding {lo} for dimension {k} of size {d} (at most {d - offset})"
    return None


_PARAM_VALUES = {
    "TRANSPOSE": _transpose_values,
    "SLICE": _slice_values,
    "BATCH_TO_SPACE_ND": _block_values,
    "SPACE_TO_BATCH_ND": _block_values,
    "MIRROR_PAD": _mirror_values,
}


def _param_problem(
    op: tuple[str, tuple[int, ...], tuple[int, ...], dict[str, object]],
    tensors: tuple[TensorInfo, ...],
    values: Callable[[TensorInfo], tuple[int, ...]],
) -> tuple[TensorInfo, str] | None:
    """``op``: opcode, inputs, outputs, options. Sizes and types of the parameter tensors always; their
    values when all are constant (a computed one: SLICE, MIRROR_PAD, *_SPACE_ND; the rest refuse it)."""
    opcode, ins, outs, options = op
    types, params = _PARAMS.get(opcode, ((), ()))
    if not params or len(ins) <= params[-1][0] or min(ins[: len(params) + 1]) < 0 or not outs or outs[0] < 0:
        return None  # Prepare refuses missing inputs
    x, ps = tensors[ins[0]], [tensors[ins[i]] for i, _, _ in params]
    reads = ps[0].dtype if ps[0].dtype in types else types[0]
    for t, (_, per, skip) in zip(ps, params, strict=True):
        need, n = per * max(len(x.shape) - skip, 0), math.prod(t.shape)
        if t.dtype != reads:
            return t, f"is {t.dtype}; the kernel reads it as {reads}"
        if n != need:
            return (
                t,
                f"has {n} entries; the kernel reads {need}, {per} per dimension of input {list(x.shape)}",
            )
    check = _PARAM_VALUES.get(opcode)
    if check is None or not all(t.is_constant for t in ps):
        return None
    found = check(x, tensors[outs[0]], tuple(values(t) for t in ps), options)
    return None if found is None else (ps[found[0]], found[1])


def _check_params(
    where: str,
    op: tuple[str, tuple[int, ...], tuple[int, ...], dict[str, object]],
    tensors: tuple[TensorInfo, ...],
    values: Callable[[TensorInfo], tuple[int, ...]],
) -> None:
    if bad := _param_problem(op, tensors, values):
        raise ModelError(
            f"{where} ({op[0]}): tensor {bad[0].index} ({bad[0].name!r}) {bad[1]} "
            "(no TFLM check before its Eval)",
            hint="re-export the model: a converter writes these parameters as the kernel reads them "
            "(or re-copy a damaged file)",
        )


def _const_ints(model: tflite.Model, sg: tflite.SubGraph, t: TensorInfo) -> tuple[int, ...]:
    """The values of constant int32/int64 tensor ``t`` (its buffer inline or at an offset in the file)."""
    buf = model.Buffers(sg.Tensors(t.index).Buffer())
    raw = buf.DataAsNumpy().tobytes() if buf.DataLength() else model._tab.Bytes[buf.Offset() :]
    return struct.unpack_from(f"<{math.prod(t.shape)}{'i' if t.dtype == 'int32' else 'q'}", raw)


# The weighted ops: (weights' rank, their output-channel dimension, bias input); the weights are input 1,
# the activation _NHWC_INPUT's. TRANSPOSE_CONV's weights: Prepare reads dims 0..2 unchecked
# (micro/kernels/transpose_conv.cc:181-185), Eval dims 0..3 with only a DCHECK of rank 4
# (reference/integer_ops/transpose_conv.h:39-53, 88). TFLM ignores its output_shape input
# (transpose_conv.h:26-32). Output channels: kConvQuantizedDimension (conv_common.cc:34),
# depthwise_conv_common.cc:38, transpose_conv.h:37.
_WEIGHTED = {
    "CONV_2D": (4, 0, 2),
    "DEPTHWISE_CONV_2D": (4, 3, 2),
    "FULLY_CONNECTED": (2, 0, 2),
    "TRANSPOSE_CONV": (4, 0, 3),
}
# The bias type Eval reads, by activation type (GetTensorData<int32_t>(bias) for int8: esp_nn/conv.cc:258,
# esp_nn/depthwise_conv.cc:142, esp_nn/fully_connected.cc:171, transpose_conv.cc:335; int64 for int16:
# esp_nn/depthwise_conv.cc:392, esp_nn/fully_connected.cc:270); no Prepare checks it. For int16 CONV_2D's
# Eval also takes int32 (esp_nn/conv.cc:314), TRANSPOSE_CONV int16 (widened, transpose_conv.cc:128).
_BIAS_TYPE = {
    "float32": "float32",
    "int8": "int32",
    "int16": "int64",
    "int16 CONV_2D": "int32",
    "int16 TRANSPOSE_CONV": "int16",
}


# The activation input of these ops (other ops: 0): read with the output as NHWC (input->dims->data[3],
# esp_nn/conv.cc:72; RuntimeShape.Dims(3) in reference conv, depthwise, pooling, transpose conv) with
# at most a TFLITE_DCHECK of rank 4 (esp_nn/pooling.cc:51-52); only ESP-NN's depthwise Prepare checks it.
_NHWC_INPUT = {
    "CONV_2D": 0,
    "DEPTHWISE_CONV_2D": 0,
    "AVERAGE_POOL_2D": 0,
    "MAX_POOL_2D": 0,
    "TRANSPOSE_CONV": 2,
}


def _check_nhwc(where: str, opcode: str, used: tuple[int, ...], tensors: tuple[TensorInfo, ...]) -> None:
    """``used``: the op's activation input and output (-1: absent)."""
    for t in (tensors[i] for i in used if i >= 0):
        if len(t.shape) != 4:
            raise ModelError(
                f"{where} ({opcode}): tensor {t.index} ({t.name!r}) has rank {len(t.shape)}; TFLM's kernel "
                "needs rank 4 (batch, height, width, channels) and reads past a shorter shape",
                hint="re-export the model with 4-dimensional activations for this op (batch first)",
            )


def _check_weighted_op(where: str, opcode: str, ins: tuple[int, ...], outs: tuple[int, ...],
                       tensors: tuple[TensorInfo, ...]) -> None:  # fmt: skip
    """The ops ESP-NN accelerates (and esp-check's scratch arithmetic reads), TRANSPOSE_CONV: input, weights,
    output present, weights of the right rank and no empty dimension (TFLM divides by them: SIGFPE)."""
    rank, _, bias = _WEIGHTED.get(opcode, (None, 0, 0))
    act = _NHWC_INPUT.get(opcode, 0)
    if rank is None:
        return
    if len(ins) <= max(act, 1) or min(ins[act], ins[1]) < 0 or not outs or outs[0] < 0:
        raise ModelError(f"{where} ({opcode}) needs an input, weights and an output; it has {ins} -> {outs}")
    weights = tensors[ins[1]]
    if len(weights.shape) != rank or 0 in weights.shape or 0 in tensors[ins[act]].shape:
        raise ModelError(
            f"{where} ({opcode}): weights of shape {list(weights.shape)} for input "
            f"{list(tensors[ins[act]].shape)} (TFLM needs rank {rank} and no empty dimension)"
        )
    bias_t = tensors[ins[bias]] if len(ins) > bias and ins[bias] >= 0 else None
    _check_channels(
        f"{where} ({opcode})", opcode, (weights, tensors[outs[0]]), tensors[ins[act]].dtype, bias_t
    )


def _check_channels(
    where: str, opcode: str, weights_out: tuple[TensorInfo, TensorInfo], act: str, bias: TensorInfo | None
) -> None:
    """Per output channel the kernels read a weights row (FULLY_CONNECTED: as many as the output's last
    dimension, only DCHECK_LE'd: esp_nn/fully_connected.cc:166-167), a multiplier made from a weights scale
    (FULLY_CONNECTED's Prepare bounds the scales by their quantized_dimension, not the channels:
    fully_connected_common.cc:104-109) and a bias entry, bounded at most by a DCHECK
    (reference/integer_ops/conv.h:54-56, 123; transpose_conv.h:48)."""
    weights, out = weights_out
    dim = _WEIGHTED[opcode][1]
    channels = weights.shape[dim]
    if (have := out.shape[-1] if out.shape else 0) != channels:
        raise ModelError(
            f"{where}: output tensor {out.index} ({out.name!r}) has {have} channels; the weights have "
            f"{channels} (dimension {dim} of {list(weights.shape)}); TFLM's kernel needs them equal "
            "(FULLY_CONNECTED reads past the weights, the convolutions leave channels unwritten)",
            hint="re-export the model: the output's last dimension is the weights' output channels",
        )
    n = len(weights.scales)
    if n > 1 and (n != channels or weights.quantized_dimension != dim):
        raise ModelError(
            f"{where}: weights tensor {weights.index} ({weights.name!r}) has {n} per-channel scales along "
            f"dimension {weights.quantized_dimension}; TFLM applies one per output channel: {channels} "
            f"(dimension {dim} of {list(weights.shape)})",
            hint=f"re-quantize the weights per output channel (quantized_dimension {dim}) or per tensor",
        )
    if bias is None:
        return
    if (size := math.prod(bias.shape)) < channels:
        raise ModelError(
            f"{where}: bias tensor {bias.index} ({bias.name!r}) has {size} entries; the kernel reads "
            f"{channels}, one per output channel, past its end",
            hint=f"re-export the model with a bias of {channels} entries (or none)",
        )
    allowed = [t for key in (act, f"{act} {opcode}") if (t := _BIAS_TYPE.get(key))]
    if allowed and bias.dtype not in allowed:
        raise ModelError(
            f"{where}: bias tensor {bias.index} ({bias.name!r}) is {bias.dtype}; for {act} activations the "
            f"kernel reads {' or '.join(allowed)}",
            hint="re-export (re-quantize) the model: the converter writes the bias as the kernel reads it",
        )


# Ops whose Eval trusts an axis (an option, or the first entry of a constant input) and the shapes of
# the tensors it copies between, which their Prepare checks at most with a DCHECK: CONCATENATION
# (concatenation.cc:46-51, reference/concatenation.h:39-51), SPLIT / SPLIT_V (split.cc:39-44: every
# output as long as the first; split_v.cc:37-46, size_splits unread; both check only the axis, at Eval),
# PACK / UNPACK (no Prepare: pack.cc:38-66, unpack.cc:39-69), ARG_MAX / ARG_MIN (no Prepare:
# reference/arg_min_max.h:39-57). Past a shape, their loops copy past the tensors. opcode -> (the axis:
# option or input, the tensor it indexes: an input or "out", how the other side's shapes follow).
_JOINS: dict[str, tuple[str | int, int | str, str]] = {
    "CONCATENATION": ("axis", "out", "concat"),
    "SPLIT": (0, 1, "split"),
    "SPLIT_V": (2, 0, "concat"),
    "PACK": ("axis", "out", "stack"),
    "UNPACK": ("axis", 0, "stack"),
    "ARG_MAX": (1, 0, "drop"),
    "ARG_MIN": (1, 0, "drop"),
}
_CONSISTENT = "re-export the model: the TF converter writes these consistently (the file is corrupted)"


def _check_joins(
    where: str,
    opcode: str,
    io: tuple[tuple[int, ...], tuple[int, ...]],
    tensors: tuple[TensorInfo, ...],
    options: dict[str, object],
    values: Callable[[TensorInfo], tuple[int, ...]],
) -> None:
    """Axis in range, PACK's values_count / UNPACK's num, and the parts' shapes of the ops in _JOINS;
    GATHER's and GATHER_ND's indices and output."""
    ins, outs = io

    def const(i: int) -> tuple[int, ...]:  # a constant int32 / int64 input's values, else ()
        t = tensors[i]
        return values(t) if t.is_constant and t.dtype in ("int32", "int64") else ()

    if opcode in ("GATHER", "GATHER_ND") and len(ins) > 1 and outs and min(ins[:2] + outs[:1]) >= 0:
        used = (tensors[ins[0]], tensors[ins[1]], tensors[outs[0]])
        return _check_gather(f"{where} ({opcode})", opcode == "GATHER_ND", used, options, const(ins[1]))
    source, side, kind = _JOINS.get(opcode, ("", 0, ""))
    needed = max(v for v in (source, side, 0) if isinstance(v, int))  # the inputs it reads
    if not kind or not outs or len(ins) <= needed or min(ins + outs) < 0:
        return
    whole = tensors[outs[0] if side == "out" else ins[int(side)]]
    parts = [tensors[i] for i in (ins if side == "out" else outs)]
    s, n = whole.shape, len(parts)
    axis = options.get(source, 0) if isinstance(source, str) else (const(ins[source]) or (None,))[0]
    if not isinstance(axis, int):
        return  # an axis computed at run time (ARG_MAX, ARG_MIN): TFLM uses it unchecked
    if not -len(s) <= axis < len(s):
        if opcode.startswith("SPLIT"):
            return  # TF_LITE_ENSURE'd in Eval: an invoke error (split.cc:94-95, split_v.cc:97-98)
        raise ModelError(
            f"{where} ({opcode}): axis {axis} is outside [-{len(s)}, {len(s)}) of tensor {whole.index} "
            f"({whole.name!r}) of shape {list(s)}; TFLM's kernel reads that shape past its end",
            hint=_CONSISTENT,
        )
    axis %= len(s)
    key = next((k for k in ("values_count", "num") if k in options), "")
    count = options.get(key, n)
    if count != n or (kind == "stack" and s[axis] != n) or (kind == "split" and s[axis] % n):
        counted = f" ({key}={count})" if key else ""
        raise ModelError(
            f"{where} ({opcode}): {n} tensors{counted} to join along axis {axis} of tensor {whole.index} "
            f"({whole.name!r}) of shape {list(s)}; TFLM's kernel copies past them",
            hint=_CONSISTENT,
        )
    along = [p.shape[axis] if len(p.shape) > axis else -1 for p in parts]
    along = [s[axis] // n] * n if kind == "split" else [*along[:-1], s[axis] - sum(along[:-1])]
    kept = [()] * n if kind in ("stack", "drop") else [(d,) for d in along]
    _check_parts(f"{where} ({opcode})", parts, [s[:axis] + d + s[axis + 1 :] for d in kept])


def _check_parts(where: str, parts: list[TensorInfo], wants: list[tuple[int, ...]]) -> None:
    for part, want in zip(parts, wants, strict=True):
        if part.shape != want:
            raise ModelError(
                f"{where}: tensor {part.index} ({part.name!r}) has shape {list(part.shape)}; "
                f"from its other tensors' shapes and its axis TFLM's kernel copies it as {list(want)}, "
                "past the smaller of the two",
                hint=_CONSISTENT,
            )


def _check_gather(
    where: str,
    nd: bool,
    used: tuple[TensorInfo, TensorInfo, TensorInfo],
    options: dict[str, object],
    values: tuple[int, ...],
) -> None:
    """GATHER reads its indices unchecked (only DCHECKs, gather.cc:85-93) and writes the output in the
    shape Prepare computes into the file's dims (gather.cc:170-182); GATHER_ND bounds only the flat
    position (gather_nd.cc:148-157), so an index past its dimension reads another element."""
    x, idx = used[0].shape, used[1].shape
    axis, batch = options.get("axis", 0), options.get("batch_dims", 0)
    if nd:
        if not idx or not 0 < idx[-1] <= len(x):
            return  # refused by Prepare (gather_nd.cc:68-84)
        want, limits = idx[:-1] + x[idx[-1] :], x[: idx[-1]]
    else:
        if not isinstance(axis, int) or not isinstance(batch, int) or not -len(x) <= axis < len(x):
            return  # refused by Prepare (gather.cc:147)
        axis, batch = axis % len(x), batch + len(idx) * (batch < 0)
        if not 0 <= batch <= min(axis, len(idx)):
            return  # refused by Prepare (gather.cc:155-157)
        want, limits = x[:axis] + idx[batch:] + x[axis + 1 :], (x[axis],)
    for k, v in enumerate(values):
        if not 0 <= v < limits[k % len(limits)]:
            raise ModelError(
                f"{where}: index {v} of tensor {used[1].index} ({used[1].name!r}) is outside "
                f"[0, {limits[k % len(limits)]}) of input {list(x)}; TFLM's kernel reads there unchecked",
                hint="re-export the model with indices inside the gathered dimensions",
            )
    _check_parts(where, [used[2]], [want])


def _check_buffers(model: tflite.Model, size: int) -> None:
    """Every constant buffer must lie inside the file (catches truncation of the weights): an inline
    one :func:`verify_structure` has read, an external one (offset/size: large-model layout) here."""
    for i in range(model.BuffersLength()):
        buf = model.Buffers(i)
        off, n = int(buf.Offset()), int(buf.Size())
        if off > 1 and off + n > size:
            raise ModelError(
                f"buffer {i} lies at bytes {off}..{off + n}, beyond the end of the file ({size} B)"
            )


def raw_builtin_code(opcode: tflite.OperatorCode) -> int:
    """The int32 ``builtin_code`` field itself (vtable slot 10), 0 when absent.

    ``tflite``'s ``OperatorCode.BuiltinCode()`` returns ``deprecated_builtin_code`` whenever this
    field is below 127, so a file with only ``builtin_code`` set (TFLM's model_editor, other
    non-TensorFlow writers) would read as ADD. The op is max(deprecated, builtin), as in TFLM's
    GetBuiltinCode.
    """
    o = opcode._tab.Offset(10)
    return int(opcode._tab.Get(flatbuffers.number_types.Int32Flags, o + opcode._tab.Pos)) if o else 0


def _describe_non_tflite(head: bytes) -> str:
    if head.startswith(b"\x89HDF"):
        return "it looks like a Keras HDF5 file (.h5), not a converted .tflite model"
    if head.startswith(b"PK\x03\x04"):
        return "it looks like a ZIP archive (e.g. a .keras file), not a .tflite model"
    if head.startswith((b"{", b"[")):
        return "it looks like a JSON text file, not a .tflite model"
    if head.lstrip().startswith((b"#", b"//", b"/*", b"unsigned", b"const", b"alignas")):
        return "it looks like a C source file; pass the .tflite file, not the xxd-style array"
    return "it does not carry the TFLite file identifier"


def _check_header(data: bytes, path: Path) -> None:
    size = len(data)
    if size < 16:
        raise ModelError(
            f"{path}: file is {size} bytes long, too short to be a .tflite model (truncated or empty)",
            hint="re-export or re-copy the model file",
        )
    ident = data[4:8]
    if ident != b"TFL3":
        raise ModelError(
            f"{path}: not a TFLite flatbuffer: {_describe_non_tflite(data[:16])} "
            f"(bytes 4..8 are {ident!r}, expected b'TFL3')",
            hint="convert the model with tf.lite.TFLiteConverter (full-integer int8) "
            "and pass the .tflite file",
        )
    (root,) = struct.unpack_from("<I", data, 0)
    if root + 4 > size:
        raise ModelError(
            f"{path}: root table offset {root} is past the end of the file ({size} B): truncated"
        )


def _opcodes(tfl: ModuleType, model: tflite.Model) -> list[tuple[str, str | None, int]]:
    """(name, custom code, version) per operator code."""
    builtin_names: dict[int, str] = dict(tfl.utils.BUILTIN_OPCODE2NAME)
    opcodes: list[tuple[str, str | None, int]] = []
    for i in range(model.OperatorCodesLength()):
        oc = model.OperatorCodes(i)
        code = max(raw_builtin_code(oc), int(oc.DeprecatedBuiltinCode()))
        name = builtin_names.get(code) or f"BUILTIN_{code}"
        custom = oc.CustomCode()
        opcodes.append((name, custom.decode("utf-8", "replace") if custom else None, int(oc.Version())))
    return opcodes


def _subgraph(
    tfl: ModuleType, model: tflite.Model, index: int, opcodes: list[tuple[str, str | None, int]]
) -> tuple[tuple[TensorInfo, ...], list[OpInfo], tuple[int, ...], tuple[int, ...]]:
    """Tensors, ops, input and output indices of subgraph ``index``, every index checked."""
    sg = model.Subgraphs(index)
    n_tensors = sg.TensorsLength()
    dtype_names = enum_names(tfl.TensorType)
    tensors = tuple(_tensor_info(tfl, sg.Tensors(t), t, model, dtype_names) for t in range(n_tensors))

    def indices(table: object, field: str, what: str) -> tuple[int, ...]:
        idx = vector(table, field)
        for v in idx:
            if v < -1 or v >= n_tensors:
                raise ModelError(f"subgraph {index}: {what} refers to tensor {v}, which does not exist")
        return idx

    ops: list[OpInfo] = []
    n_subgraphs = model.SubgraphsLength()
    values = functools.partial(_const_ints, model, sg)  # a constant parameter tensor's ints
    for k in range(sg.OperatorsLength()):
        op = sg.Operators(k)
        oc_index = op.OpcodeIndex()
        if oc_index >= len(opcodes):
            raise ModelError(f"op {k}: opcode index {oc_index} is out of range ({len(opcodes)} opcodes)")
        opcode, custom, version = opcodes[oc_index]
        where = f"op {k}" if index == 0 else f"op {k} of subgraph {index}"
        opdata.resolver_method(opcode, custom, where=where)
        options = _read_options(tfl, op)
        for key, value in options.items():  # IF / WHILE / CALL_ONCE name subgraphs by index
            if key.endswith("subgraph_index") and isinstance(value, int) and not 0 <= value < n_subgraphs:
                raise ModelError(f"{where}: {key}={value} refers to a subgraph that does not exist")
        indices(op, "Intermediates", f"{where} intermediate")
        ins = indices(op, "Inputs", f"{where} input")
        outs = indices(op, "Outputs", f"{where} output")
        _check_weighted_op(where, opcode, ins, outs, tensors)
        _check_rank(where, opcode, ins + outs, tensors)
        _check_mean_axes(where, opcode, ins, tensors)
        _check_params(where, (opcode, ins, outs, options), tensors, values)
        _check_joins(where, opcode, (ins, outs), tensors, options, values)
        if (first := _NHWC_INPUT.get(opcode)) is not None:
            _check_nhwc(where, opcode, ins[first : first + 1] + outs[:1], tensors)
        ops.append(
            OpInfo(
                index=k,
                opcode=opcode,
                inputs=ins,
                outputs=outs,
                subgraph=index,
                options=MappingProxyType(options),
                custom_code=custom,
                version=version,
            )
        )
    return tensors, ops, indices(sg, "Inputs", "model input"), indices(sg, "Outputs", "model output")


def _parse(data: bytes, path: Path, sha256: str) -> ModelInfo:
    tfl = _lazy_tflite()
    _check_header(data, path)
    size = len(data)
    model = tfl.Model.GetRootAsModel(data, 0)
    verify_structure(tfl, model, size)  # every table, vector and string inside the file
    if model.SubgraphsLength() < 1:
        raise ModelError(f"{path}: the model has no subgraph")
    _check_buffers(model, size)
    _check_references(model, [model.Subgraphs(s).TensorsLength() for s in range(model.SubgraphsLength())])
    opcodes = _opcodes(tfl, model)
    subgraphs = [_subgraph(tfl, model, s, opcodes) for s in range(model.SubgraphsLength())]
    main_tensors, _, ins, outs = subgraphs[0]
    main_inputs = tuple(main_tensors[i] for i in ins if i >= 0)
    main_outputs = tuple(main_tensors[i] for i in outs if i >= 0)
    if not main_inputs or not main_outputs:
        raise ModelError(f"{path}: the main subgraph has no inputs or no outputs")
    desc = model.Description()
    return ModelInfo(
        path=path,
        size_bytes=size,
        sha256=sha256,
        schema_version=int(model.Version()),
        inputs=main_inputs,
        outputs=main_outputs,
        ops=tuple(op for _, sub_ops, _, _ in subgraphs for op in sub_ops),
        tensors=main_tensors,
        subgraph_count=int(model.SubgraphsLength()),
        description=desc.decode("utf-8", "replace") if desc else "",
    )


# Parsed models by content hash: a run reads the same model in the flow, the generator, the arena
# estimate, the host reference and the simulated board; each parse of a U-Net costs ~0.1 s of CPU.
# ModelInfo is immutable (frozen dataclasses, tuples), so handing out one object is safe. Bounded (a
# sweep or a runner walks many models): least recently used first out; errors are never cached.
_PARSED_MAX = 16
_parsed: OrderedDict[str, ModelInfo] = OrderedDict()
_parsed_lock = threading.Lock()


def _parse_cached(data: bytes, path: Path) -> ModelInfo:
    digest = hashlib.sha256(data).hexdigest()
    with _parsed_lock:
        hit = _parsed.get(digest)
        if hit is not None:
            _parsed.move_to_end(digest)
    if hit is None:
        hit = _stored(digest, len(data), path)
        if hit is None:
            hit = _parse(data, path, digest)
            _store(hit)
        with _parsed_lock:
            _parsed[digest] = hit
            while len(_parsed) > _PARSED_MAX:
                _parsed.popitem(last=False)
    return hit if hit.path == path else dataclasses.replace(hit, path=path)


# ... and on disk, for the next process: a repeat CLI run needs no `tflite` import (0.035 s) and no parse
# (0.05 s on a U-Net). One small JSON per model in the cache dir (``model-info``), keyed by the model's
# SHA-256 and by what parsing depends on (:func:`_parser_id`), so a result is never stale: another
# esp-check, an edited parser or op table, another `tflite` package is another key. Only models that
# parsed are stored (a refusal is re-parsed, so its message is the current code's).
_INFO_FORMAT = 1
_INFO_MAX = 256
_PARSER_FILES = ("loader.py", "verify.py", "opdata.py", "modelinfo.py", "../data/ops.toml")


@functools.cache
def _parser_id() -> str:
    """A digest of everything a parse result depends on besides the model's bytes."""
    here = Path(__file__).resolve().parent
    return code_digest(f"format {_INFO_FORMAT}", here, _PARSER_FILES, ("tflite", "flatbuffers", "numpy"))


def _info_path(digest: str) -> Path:
    return cache_entry("model-info", digest, _parser_id())


def _tuples(fields: dict[str, Any]) -> dict[str, Any]:
    """JSON's lists back to the tuples the dataclasses hold."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}


def _stored(digest: str, size: int, path: Path) -> ModelInfo | None:
    """The stored parse of the model with SHA-256 ``digest``, or None (missing, damaged, another one)."""

    def build(doc: dict[str, Any]) -> ModelInfo:
        tensors = tuple(TensorInfo(**_tuples(t)) for t in doc.pop("tensors"))
        return ModelInfo(
            path=path,
            size_bytes=size,
            sha256=digest,
            inputs=tuple(tensors[i] for i in doc.pop("inputs")),
            outputs=tuple(tensors[i] for i in doc.pop("outputs")),
            ops=tuple(
                OpInfo(options=MappingProxyType(_tuples(o.pop("options"))), **_tuples(o))
                for o in doc.pop("ops")
            ),
            tensors=tensors,
            **doc,
        )

    return load_stored(_info_path(digest), build, sha256=digest, size_bytes=size)


def _store(info: ModelInfo) -> None:
    """Keep ``info`` for the next process; a cache that cannot be written is only slower."""
    doc = {  # vars: the fields, in order; the path is the caller's
        **{k: v for k, v in vars(info).items() if k != "path"},
        "tensors": [vars(t) for t in info.tensors],
        "inputs": [info.tensors.index(t) for t in info.inputs],
        "outputs": [info.tensors.index(t) for t in info.outputs],
        "ops": [{**vars(o), "options": dict(o.options)} for o in info.ops],
    }
    with contextlib.suppress(OSError):  # (the parser's sources unreadable: no store, only slower)
        store_json(_info_path(info.sha256), doc, _INFO_MAX)  # a sweep writes one per generated model


def parse_model_bytes(data: bytes, path: str | Path = "<bytes>") -> ModelInfo:
    """Parse a model already in memory (``path`` is only used in messages and ``ModelInfo.path``).

    The same bytes are parsed once per process (a bounded cache keyed by their SHA-256)."""
    p = Path(path)
    try:
        return _parse_cached(bytes(data), p)
    except (struct.error, IndexError, ValueError, TypeError, UnicodeDecodeError, OverflowError) as exc:
        raise ModelError(
            f"{p}: the .tflite flatbuffer is corrupted or truncated "
            f"({'out-of-bounds read' if isinstance(exc, struct.error) else type(exc).__name__}: {exc})",
            hint="re-export or re-copy the model; compare its size and sha256 with the original",
        ) from exc


def read_model(path: str | Path) -> tuple[bytes, ModelInfo]:
    """The bytes of a .tflite file, read once, and their parse; ModelError for unreadable, corrupt or
    unsupported models."""
    p = Path(path)
    hint = "a TFLite Micro model for an ESP32 fits in its flash: check the path"
    data = read_regular(p, what="model file", max_bytes=MODEL_MAX_BYTES, error=ModelError, big_hint=hint)
    return data, parse_model_bytes(data, p)


def load_model(path: str | Path) -> ModelInfo:
    """Read and validate a .tflite file (:func:`read_model`)."""
    return read_model(path)[1]
