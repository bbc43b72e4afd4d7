"""ESP-IDF's binary partition table, as bootloaders read it (the firmware builds' layout checks and the
native board's boot stand-in, harness/device/protocol_native.py).

32-byte rows: magic ``AA 50``, type, subtype, little-endian offset and size, a 16-byte label, flags; the
table ends at the first row without the magic (the MD5 row ``EB EB`` or erased flash).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

PARTITION_MAGIC = b"\xaa\x50"  # bytes AA 50 on flash (gen_esp32part.py MAGIC_BYTES)
TABLE_MAX_BYTES = 0xC00  # ESP-IDF's table area


class PartitionEntry(NamedTuple):
    label: str
    type: int
    subtype: int
    offset: int
    size: int


def parse_partition_table(data: bytes) -> list[PartitionEntry]:
    """Entries of an ESP-IDF binary partition table (32-byte rows starting AA 50; the MD5 row ends it)."""
    entries: list[PartitionEntry] = []
    for pos in range(0, min(len(data), TABLE_MAX_BYTES) - 31, 32):
        row = data[pos : pos + 32]
        if row[:2] != PARTITION_MAGIC:
            break
        ptype, subtype, offset, size, label = struct.unpack("<BBII16s", row[2:28])
        name = label.split(b"\0", 1)[0].decode("ascii", "replace")
        entries.append(PartitionEntry(name, ptype, subtype, offset, size))
    return entries


__all__ = ["PARTITION_MAGIC", "TABLE_MAX_BYTES", "PartitionEntry", "parse_partition_table"]
