"""Constants and checksums that docs/protocol.md defines, in one place for every side.

The firmware's C emitter, the Python emitter, the simulator and the parser all take these from here
(the C side from the same numbers in esp_check_proto.h, checked by the contract tests).
"""

from __future__ import annotations

import zlib

import numpy as np

# the tensor types the protocol carries: numpy's little-endian dtype of each, and its item size
DTYPES: dict[str, str] = {"int8": "<i1", "uint8": "<u1", "int16": "<i2", "int32": "<i4", "float32": "<f4"}
ITEM_SIZES: dict[str, int] = {name: np.dtype(np_dtype).itemsize for name, np_dtype in DTYPES.items()}
PROTO_VERSION = "1"  # BEGIN proto=
MARKER = f"@EC{PROTO_VERSION} ".encode()  # every record line's marker: the version, then a space
LINE_MAX = 240  # bytes per record line, including its \r\n
DATA_CHUNK = 96  # tensor bytes per DATA / OPDATA record
TAP_MAX_TENSORS = 4  # tensors per side of an OP record
MAX_DIMS = 8  # dims the firmware records (more: record_overflow); TFLM kernels': loader.TFLM_MAX_DIMS
NAME_MAX = 64  # TENSOR name= is cut to this many bytes
MSG_MAX = 120  # ERROR msg= is cut to this many bytes
OPNAME_MAX = 32  # OP op= is cut to this many bytes
PRINTABLE = range(0x21, 0x7E + 1)  # a value's bytes outside it (and '*') become '_' (ECP_PRINTABLE_MIN..MAX)
TAP_RECORD_BYTES = 36  # firmware RAM per tapped op: uint32 cycles + 4 input CRCs + 4 output CRCs


def crc32(data: bytes | bytearray | memoryview | np.ndarray, start: int = 0) -> int:
    """CRC-32 (zlib polynomial) of raw bytes or an array's C-order bytes, unsigned, continuing ``start``."""
    if isinstance(data, np.ndarray):
        data = np.ascontiguousarray(data).tobytes()
    return zlib.crc32(data, start) & 0xFFFFFFFF


def crc32_hex(data: bytes | bytearray | memoryview | np.ndarray) -> str:
    """CRC-32 as the protocol writes it: 8 upper-case hex digits."""
    return f"{crc32(data):08X}"
