"""What esp-check knows about a model (tensors, ops, I/O), independent of any TFLM runtime.

Kept apart from the parser (:mod:`harness.model.loader`) so that modules the parser uses (the op
tables in :mod:`harness.model.opdata`) can name these types without an import cycle.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

_EMPTY: Mapping[str, object] = MappingProxyType({})

# The TFLite schema's TensorType (tensorflow/compiler/mlir/lite/schema/schema.fbs), by the lower-case name the
# loader gives a tensor's dtype: bits per element as a flatbuffer buffer stores it. INT4 packs two elements
# per byte. None: no fixed element size (STRING: a count, offsets, then the bytes; RESOURCE and VARIANT are
# handles, with no data in a buffer).
ELEMENT_BITS: Mapping[str, int | None] = MappingProxyType(
    {"float32": 32, "float16": 16, "int32": 32, "uint8": 8, "int64": 64, "string": None, "bool": 8,
     "int16": 16, "complex64": 64, "int8": 8, "float64": 64, "complex128": 128, "uint64": 64,
     "resource": None, "variant": None, "uint32": 32, "uint16": 16, "int4": 4, "bfloat16": 16}
)  # fmt: skip


def tensor_bytes(dtype: str, count: int, *, packed: bool = False) -> int | None:
    """Bytes that ``count`` elements of ``dtype`` take (:data:`ELEMENT_BITS`): as TFLM holds them in the
    arena (TfLiteTypeSizeOf: int4 unpacked to a byte each, a resource as its int32 id) or, with ``packed``,
    as a flatbuffer buffer stores them (int4 two per byte, rounded up). None for a type with no fixed size:
    string and variant (TFLM's arena refuses them: AllocateTensors fails), a resource in a buffer, and a
    type the table does not name."""
    if dtype == "resource" and not packed:
        return 4 * count
    bits = ELEMENT_BITS.get(dtype)
    if bits is None:
        return None
    return (count * (bits if packed else max(bits, 8)) + 7) // 8


# Dtypes of tensors that hold activations/data (not shapes/indices).
_ACTIVATION_DTYPES = {"int8", "uint8", "int16", "float32", "float16"}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the model's main subgraph."""

    index: int
    name: str
    shape: tuple[int, ...]
    dtype: str  # numpy dtype name: "int8", "uint8", "int16", "int32", "float32", ...
    scale: float | None  # per-tensor scale (first scale if per-channel), None if not quantized
    zero_point: int | None
    per_channel: bool = False
    scales: tuple[float, ...] = ()  # all scales (one per channel if per_channel)
    zero_points: tuple[int, ...] = ()
    quantized_dimension: int = 0
    is_constant: bool = False  # backed by a non-empty buffer in the flatbuffer (weights, biases)
    is_variable: bool = False

    @property
    def num_elements(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor in TFLM's arena (:func:`tensor_bytes`: int4 one byte per element); a type
        with no fixed size (string, variant), which TFLM cannot allocate, counts one byte per element."""
        nbytes = tensor_bytes(self.dtype, self.num_elements)
        return self.num_elements if nbytes is None else nbytes

    def to_dict(self) -> dict[str, object]:
        """JSON-ready description (used by ``inspect --json`` and reports)."""
        return {
            "index": self.index,
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "scale": self.scale,
            "zero_point": self.zero_point,
            "per_channel": self.per_channel,
            "num_scales": len(self.scales),
            "quantized_dimension": self.quantized_dimension,
        }


@dataclass(frozen=True)
class OpInfo:
    """One operator in execution order."""

    index: int
    opcode: str  # builtin name, e.g. "CONV_2D" (max of builtin_code and deprecated_builtin_code)
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    subgraph: int = 0
    # Builtin options by snake_case field name, e.g. {"stride_w": 2, "dilation_h_factor": 1,
    # "padding": "SAME", "fused_activation_function": "RELU6"}. Vectors become tuples.
    options: Mapping[str, object] = field(default_factory=lambda: _EMPTY, compare=False)
    custom_code: str | None = None  # for opcode == "CUSTOM"
    version: int = 1


@dataclass(frozen=True)
class ModelInfo:
    """What esp-check needs to know about a model, independent of any TFLM runtime."""

    path: Path
    size_bytes: int
    sha256: str
    schema_version: int
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    ops: tuple[OpInfo, ...]
    tensors: tuple[TensorInfo, ...] = field(default=(), repr=False)
    subgraph_count: int = 1
    description: str = ""

    @property
    def distinct_ops(self) -> tuple[str, ...]:
        """Distinct opcodes in first-use order (one resolver registration each)."""
        return tuple(dict.fromkeys(op.opcode for op in self.ops))

    @property
    def main_ops(self) -> tuple[OpInfo, ...]:
        """Operators of subgraph 0 in execution order (what per-layer comparison walks)."""
        return tuple(op for op in self.ops if op.subgraph == 0)

    def tensor(self, index: int) -> TensorInfo:
        """Main-subgraph tensor by index."""
        return self.tensors[index]

    def op_counts(self) -> dict[str, int]:
        """Opcode -> number of uses, in first-use order."""
        return dict(Counter(op.opcode for op in self.ops))

    @property
    def kind(self) -> str:
        """Quantization kind of the activations: "int8", "int16", "uint8", "float" or "mixed".

        "int8" is esp-check's main case (ESP-NN accelerates only int8). "int16" covers 16x8
        models (int16 activations, int8 weights), e.g. SVDF keyword spotters. Shape/index
        tensors (int32/int64/bool) are ignored; so are int32 outputs such as argmax.
        """
        dtypes = {
            self.tensors[t].dtype
            for op in self.main_ops
            for t in op.outputs
            if t >= 0 and self.tensors[t].dtype in _ACTIVATION_DTYPES
        }
        dtypes |= {t.dtype for t in self.inputs if t.dtype in _ACTIVATION_DTYPES}
        if not dtypes or dtypes == {"int8"}:
            return "int8"
        if dtypes <= {"int8", "int16"}:
            return "int16"
        if dtypes == {"uint8"} or dtypes == {"uint8", "int8"}:
            return "uint8"
        if dtypes <= {"float32", "float16"}:
            return "float"
        return "mixed"
