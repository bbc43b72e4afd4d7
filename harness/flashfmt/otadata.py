"""ESP-IDF's otadata, as the second-stage bootloader reads it and ``esp_ota_set_boot_partition`` writes it
(the simulated board's bootloader and app, and the host when it must select a slot with esptool), and
the boot rule built on it (:func:`boot_order`).

The entry layout and the selection rule: docs/firmware.md "Flash layout".
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Sequence
from typing import NamedTuple

from harness.flashfmt.partitions import APP, DATA, FACTORY, OTA_0, OTADATA, TEST, Partition, find

SECTOR = 0x1000
ENTRY = 32
STATE_INVALID = 3
STATE_ABORTED = 4
STATE_VALID = 2


def _crc(seq: int) -> int:
    return zlib.crc32(struct.pack("<I", seq), 0xFFFFFFFF) & 0xFFFFFFFF


def _entries(otadata: bytes) -> list[tuple[int, int]]:
    """(sector index, seq) of every valid entry."""
    out = []
    for k in range(2):
        raw = otadata[k * SECTOR : k * SECTOR + ENTRY]
        if len(raw) < ENTRY:
            continue
        seq, state, crc = struct.unpack_from("<I", raw)[0], *struct.unpack_from("<II", raw, 24)
        if seq in (0, 0xFFFFFFFF) or crc != _crc(seq) or state in (STATE_INVALID, STATE_ABORTED):
            continue
        out.append((k, seq))
    return out


def selected_slot(otadata: bytes, n_slots: int) -> int | None:
    """The OTA app index otadata selects, or None when it selects nothing (erased or damaged)."""
    entries = _entries(otadata)
    if not entries or n_slots <= 0:
        return None
    seq = max(s for _, s in entries)
    return (seq - 1) % n_slots


def select(otadata: bytes, slot: int, n_slots: int) -> bytes:
    """New otadata contents after ``esp_ota_set_boot_partition(ota_<slot>)``: a new entry in the sector
    that does not hold the active one, with the next sequence number that maps to ``slot``; ValueError for
    a slot no sequence number maps to (ESP-IDF refuses it too: ESP_ERR_INVALID_ARG)."""
    if not 0 <= slot < n_slots:
        raise ValueError(f"otadata cannot select ota_{slot} among {n_slots} OTA apps")
    entries = _entries(otadata)
    top = max((s for _, s in entries), default=0)
    active = max(entries, key=lambda e: e[1])[0] if entries else 1
    seq = top + 1
    while (seq - 1) % n_slots != slot:
        seq += 1
    entry = struct.pack("<I20sII", seq, b"\xff" * 20, STATE_VALID, _crc(seq))
    out = bytearray(otadata.ljust(2 * SECTOR, b"\xff"))
    sector = 1 - active
    out[sector * SECTOR : (sector + 1) * SECTOR] = entry + b"\xff" * (SECTOR - ENTRY)
    return bytes(out)


def initial(size: int, slot: int, n_slots: int) -> bytes:
    """The ``ota_data_initial.bin`` that boots ``ota_<slot>`` on a board flashed by hand: erased (which boots
    ``ota_0``, as ESP-IDF's own file) for slot 0, else one valid entry selecting ``slot``. Flashing a build
    directory on its own then runs the app it holds, whatever the board ran before."""
    blank = b"\xff" * max(size, 2 * SECTOR)
    out = blank if slot == 0 else select(blank, slot, n_slots)
    return out[:size] if size >= 2 * SECTOR else out


class BootOrder(NamedTuple):
    apps: list[Partition]  # the app partitions the bootloader tries, in its order
    slot: int | None  # the OTA app otadata selects (None: erased, damaged, or no otadata)
    read_otadata: bool  # the table has otadata and OTA apps, so the bootloader read it


def boot_order(parts: Sequence[Partition], read: Callable[[int, int], bytes]) -> BootOrder:
    """The boot rule of ESP-IDF's second-stage bootloader, the one both the simulated and the native
    board follow (bootloader_utility.c). OTA apps are indexed by subtype (``ota_N`` is index N) and only
    indices below their count are reached. It starts at the OTA app otadata selects (``(seq - 1) % count``),
    else at the factory app; then tries the lower indices down to the factory app, the higher ones, and
    last the test app. ``read(offset, size)`` reads flash."""
    apps = [p for p in parts if p.type == APP]
    ota = {p.subtype - OTA_0: p for p in apps if p.is_ota_app}  # bs->ota[subtype & 0xF]
    count = sum(1 for p in apps if p.is_ota_app)  # bs->app_count
    otadata = find(parts, DATA, OTADATA)
    slot = None
    if otadata is not None and count:
        slot = selected_slot(read(otadata.offset, otadata.size), count)
    start = -1 if slot is None else slot  # -1: FACTORY_INDEX (without one, the next try is ota_0)
    tries = [find(parts, APP, FACTORY) if i < 0 else ota.get(i) for i in range(start, -2, -1)]
    tries += [ota.get(i) for i in range(start + 1, count)] + [find(parts, APP, TEST)]
    return BootOrder([p for p in tries if p is not None], slot, otadata is not None and count > 0)


def initial_for(parts: Sequence[Partition], app: Partition, size: int) -> bytes:
    """The ``ota_data_initial.bin`` of a build whose app sits in ``app``: it boots that app when the build
    directory is flashed on its own (erased when ``app`` is a factory app or ``ota_0``)."""
    slots = sum(1 for p in parts if p.is_ota_app)
    own = app.subtype - OTA_0 if app.is_ota_app else 0
    return initial(size, own, max(slots, 1))
