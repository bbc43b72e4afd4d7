"""Constants and checksums that docs/protocol.md defines, in one place for every side.

The firmware's C emitter, the Python emitter, the simulator and the parser all take these from here
(the C side from the same numbers in esp_check_proto.h, checked by the contract tests).
"""

from __future__ import annotations

import zlib

import numpy as np

TAP_MAX_TENSORS = 4  # tensors per side of an OP record
TAP_RECORD_BYTES = 36  # firmware RAM per tapped op: uint32 cycles + 4 input CRCs + 4 output CRCs


def crc32(data: bytes | bytearray | memoryview | np.ndarray) -> int:
    """CRC-32 (zlib polynomial) of raw bytes or of an array's C-order bytes, as an unsigned int."""
    if isinstance(data, np.ndarray):
        data = np.ascontiguousarray(data).tobytes()
    return zlib.crc32(data) & 0xFFFFFFFF


def crc32_hex(data: bytes | bytearray | memoryview | np.ndarray) -> str:
    """CRC-32 as the protocol writes it: 8 upper-case hex digits."""
    return f"{crc32(data):08X}"
