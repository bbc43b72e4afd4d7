"""ESP-IDF's partition table: the one type every part of esp-check uses (the generator writes it as
partitions.csv, the sim and native builders pack it, the simulated and native boards boot from it), its
CSV reader, its binary packer and parser, and the rule which app a variant's build goes to
(:func:`app_partition`).

The binary table's layout: docs/firmware.md "Flash layout".
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.errors import BuildError

PARTITION_MAGIC = b"\xaa\x50"  # bytes AA 50 on flash (gen_esp32part.py MAGIC_BYTES)
MD5_ROW_MAGIC = b"\xeb\xeb" + b"\xff" * 14
TABLE_MAX_BYTES = 0xC00  # ESP-IDF's table area
TABLE_SECTOR = 0x1000
_ROW = "<2sBBII16sI"

APP, DATA = 0x00, 0x01  # partition types
FACTORY, OTA_0, TEST = 0x00, 0x10, 0x20  # app subtypes (ota_N = OTA_0 + N)
OTADATA = 0x00  # data subtype "ota"
# (type, subtype) names as gen_esp32part.py reads and prints them
TYPE_NAMES = {"app": APP, "data": DATA}
SUBTYPE_NAMES = {
    "app": {"factory": FACTORY, "test": TEST, **{f"ota_{i}": OTA_0 + i for i in range(16)}},
    "data": {
        "ota": OTADATA,
        "phy": 0x01,
        "nvs": 0x02,
        "coredump": 0x03,
        "nvs_keys": 0x04,
        "fat": 0x81,
        "spiffs": 0x82,
    },
}
# Variant -> OTA app slot. ESP-IDF boots ota_0 while otadata is empty, so a board flashed by hand
# (`idf.py flash` writes an empty otadata) runs whichever variant was flashed last into ota_0.
VARIANT_SLOTS = {"optimized": 0, "ansi": 1}
VARIANTS: tuple[str, ...] = tuple(VARIANT_SLOTS)  # the variant names, in slot order: the one list
OTA_APPS = len(VARIANT_SLOTS)  # the generated table's OTA apps: one per variant


class PartitionTableError(ValueError):
    """Bytes or text that are not a valid partition table (what the bootloader or gen_esp32part checks)."""


@dataclass(frozen=True)
class Partition:
    """One partition table entry."""

    label: str
    type: int
    subtype: int
    offset: int
    size: int
    flags: int = 0

    @property
    def name(self) -> str:  # gen_esp32part's word for the label (partitions.csv's first column)
        return self.label

    @property
    def is_ota_app(self) -> bool:
        return self.type == APP and OTA_0 <= self.subtype < TEST

    def type_names(self) -> tuple[str, str]:
        """(type, subtype) as partitions.csv spells them: ``("app", "ota_0")``, ``("data", "0x40")``."""
        tname = next((k for k, v in TYPE_NAMES.items() if v == self.type), f"0x{self.type:02x}")
        subs = SUBTYPE_NAMES.get(tname, {})
        return tname, next((k for k, v in subs.items() if v == self.subtype), f"0x{self.subtype:02x}")

    def csv(self) -> str:
        """This entry as a partitions.csv row (aligned columns, hex offset and size)."""
        tname, sub = self.type_names()
        cols = f"{self.label + ',':<9} {tname + ',':<5} {sub + ',':<7}"
        return f"{cols} 0x{self.offset:06X}, 0x{self.size:06X}"


def _csv_number(text: str, what: str, n: int) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise PartitionTableError(f"partitions.csv line {n}: {what} {text!r} is not a number") from None


def parse_partitions_csv(text: str) -> list[Partition]:
    """A partitions.csv with explicit offsets and sizes, as gen_esp32part.py reads it: ``name, type,
    subtype, offset, size[, flags]``, type app/data, named or numeric subtypes, hex or decimal numbers;
    comments and blank lines skipped."""
    parts: list[Partition] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 5 or cols[1] not in TYPE_NAMES:
            raise PartitionTableError(f"partitions.csv line {n}: {raw.strip()!r} is not a partition row")
        name, tname, sub, off, size = cols[:5]
        subtype = SUBTYPE_NAMES[tname].get(sub)
        if subtype is None:
            subtype = _csv_number(sub, "subtype", n)
        if not 0 <= subtype <= 0xFE or len(name.encode()) > 16:
            raise PartitionTableError(f"partitions.csv line {n}: bad subtype or name in {raw.strip()!r}")
        offset, nbytes = _csv_number(off, "offset", n), _csv_number(size, "size", n)
        parts.append(Partition(name, TYPE_NAMES[tname], subtype, offset, nbytes))
    if not parts:
        raise PartitionTableError("partitions.csv holds no partitions")
    return parts


def read_partitions_csv(path: Path) -> list[Partition]:
    """A project's partitions.csv (BuildError, exit 3, when it is unreadable or not a table)."""
    try:
        return parse_partitions_csv(path.read_text(encoding="utf-8"))
    except (OSError, PartitionTableError) as exc:
        raise BuildError(f"{path}: {exc}", hint="regenerate the project") from exc


def pack_partition_table(parts: Sequence[Partition]) -> bytes:
    """Binary partition table: 32-byte entries, an MD5 row over them, 0xFF up to 0xC00 bytes."""
    out = bytearray()
    for p in parts:
        label = p.label.encode("ascii")[:16].ljust(16, b"\0")
        out += struct.pack(_ROW, PARTITION_MAGIC, p.type, p.subtype, p.offset, p.size, label, p.flags)
    out += MD5_ROW_MAGIC + hashlib.md5(bytes(out), usedforsecurity=False).digest()
    if len(out) > TABLE_MAX_BYTES:
        raise PartitionTableError(f"{len(parts)} partitions do not fit the table's {TABLE_MAX_BYTES} bytes")
    return bytes(out) + b"\xff" * (TABLE_MAX_BYTES - len(out))


def table_rows(data: bytes) -> list[Partition]:
    """The entries of a binary table up to its first row without the magic (the MD5 row, or erased
    flash: then none), without the bootloader's checks: what a build's table says, and where the native
    board's boot stand-in looks for a table (it tries several offsets)."""
    parts: list[Partition] = []
    for pos in range(0, min(len(data), TABLE_MAX_BYTES) - 31, 32):
        magic, ptype, subtype, offset, size, label, flags = struct.unpack_from(_ROW, data, pos)
        if magic != PARTITION_MAGIC:
            break
        name = label.split(b"\0", 1)[0].decode("ascii", "replace")
        parts.append(Partition(name, ptype, subtype, offset, size, flags))
    return parts


def parse_partition_table(data: bytes) -> list[Partition]:
    """The entries of a binary table, checked as the second-stage bootloader checks them (magic per
    entry, an MD5 row that matches): PartitionTableError otherwise."""
    parts = table_rows(data)
    end = 32 * len(parts)
    row = data[end : end + 32]
    if row[:16] == MD5_ROW_MAGIC and len(row) == 32:
        if hashlib.md5(data[:end], usedforsecurity=False).digest() != row[16:]:
            raise PartitionTableError("partition table MD5 mismatch")
        return parts
    if len(row) == 32 and row != b"\xff" * 32:
        raise PartitionTableError(f"partition {len(parts)} invalid magic number 0x{row[:2].hex()}")
    if not parts:
        raise PartitionTableError("no valid partition table")
    raise PartitionTableError("partition table has no MD5 row")


def find(
    parts: Sequence[Partition], ptype: int, subtype: int | None = None, label: str | None = None
) -> Partition | None:
    """The first entry of that type (and subtype, and label, when given)."""
    found = (
        p for p in parts if p.type == ptype and subtype in (None, p.subtype) and label in (None, p.label)
    )
    return next(found, None)


def app_partition(
    parts: Sequence[Partition], variant: str, where: str, *, app_bytes: int | None = None
) -> Partition:
    """Where a variant's app goes (``where``: the table, for the message), as ESP-IDF's bootloader boots
    it: the factory app (booted while otadata selects nothing), else the variant's OTA slot (optimized
    ``ota_0``, ANSI C ``ota_1``), which otadata selects only when the table has more OTA apps than its
    number (the bootloader indexes OTA apps by subtype and boots ``(seq - 1) % count``: an ``ota_1``-only
    table boots no ``ota_1``). BuildError when there is none, or when ``app_bytes`` do not fit it."""
    slot = VARIANT_SLOTS[variant]
    otas = sum(1 for p in parts if p.is_ota_app)
    app = find(parts, APP, FACTORY) or (find(parts, APP, OTA_0 + slot) if slot < otas else None)
    if app is None:
        among = f" with at least {slot + 1} OTA apps in the table" if slot else ""
        raise BuildError(
            f"{where} has no app partition the bootloader boots the {variant} app from: a factory app, "
            f"or ota_{slot}{among}",
            hint="regenerate the project: its partitions.csv has ota_0 and ota_1",
        )
    if app_bytes is not None and app_bytes > app.size:
        raise BuildError(
            f"the firmware ({app_bytes} bytes) is larger than its app partition '{app.label}' "
            f"({app.size} bytes) in {where}",
            hint="use fewer inputs per firmware, or larger app partitions in the project's partitions.csv "
            "(the board's flash permitting)",
        )
    return app
