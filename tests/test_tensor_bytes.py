"""The one table of tensor item sizes (harness.model.modelinfo.ELEMENT_BITS, asked through tensor_bytes):
the TFLite schema's TensorType, as a flatbuffer buffer stores each type and as TFLM's arena holds it."""

from __future__ import annotations

import pytest
import tflite

from harness.model.loader import enum_names
from harness.model.modelinfo import ELEMENT_BITS, TensorInfo, tensor_bytes
from harness.protocol.spec import ITEM_SIZES

# (dtype, bytes of 3 elements in a buffer, bytes of 3 elements in TFLM's arena); None: no fixed size
EXPECTED = [
    ("float32", 12, 12), ("float16", 6, 6), ("int32", 12, 12), ("uint8", 3, 3), ("int64", 24, 24),
    ("string", None, None), ("bool", 3, 3), ("int16", 6, 6), ("complex64", 24, 24), ("int8", 3, 3),
    ("float64", 24, 24), ("complex128", 48, 48), ("uint64", 24, 24), ("resource", None, 12),
    ("variant", None, None), ("uint32", 12, 12), ("uint16", 6, 6),
    ("int4", 2, 3),  # two per byte in the file (rounded up), unpacked to a byte each by TFLM
    ("bfloat16", 6, 6),
]  # fmt: skip


@pytest.mark.parametrize(("dtype", "packed", "arena"), EXPECTED)
def test_every_tensor_type(dtype: str, packed: int | None, arena: int | None) -> None:
    assert tensor_bytes(dtype, 3, packed=True) == packed
    assert tensor_bytes(dtype, 3) == arena
    assert tensor_bytes(dtype, 0, packed=True) in (0, None)
    info = TensorInfo(0, "t", (3,), dtype, None, None)
    assert info.nbytes == (3 if arena is None else arena)  # no fixed size: a byte per element


def test_the_table_is_the_schemas_tensor_type() -> None:
    """Every TensorType of the installed schema has a row, and every row is a TensorType."""
    names = {name.lower() for name in enum_names(tflite.TensorType).values()}
    assert set(ELEMENT_BITS) == names == {d for d, *_ in EXPECTED}
    assert tensor_bytes("no_such_type", 3) is None and tensor_bytes("no_such_type", 3, packed=True) is None


def test_the_protocols_dtypes_agree_with_the_table() -> None:
    for dtype, size in ITEM_SIZES.items():
        assert tensor_bytes(dtype, 1) == tensor_bytes(dtype, 1, packed=True) == size


def test_bfloat16_and_resource_arena_bytes() -> None:
    """Fails on the old TensorInfo.nbytes: numpy knows no bfloat16 and no resource, so both counted one
    byte per element (TFLM: 2, and an int32 id)."""
    assert TensorInfo(0, "t", (4, 2), "bfloat16", None, None).nbytes == 16
    assert TensorInfo(0, "t", (2,), "resource", None, None).nbytes == 8
