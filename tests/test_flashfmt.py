"""ESP flash formats and the boot rule (harness.flashfmt), and the boards that boot by them.

What is real: the partition table packer and parsers, otadata, the sim builder's images, pyserial's URL
dispatch. Faked: the boards (the simulated board, and the native board whose "apps" here are two
shell scripts that print their name).
"""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import numpy as np
import pytest
import serial
from esp_pylib.serial_reset import hard_reset
from sim_helpers import HANG_S, PARTITIONS_4MB, make_project, read_until_end

import harness.sim as sim
from harness.device.protocol_native import BOOT_LINE
from harness.device.protocol_native import register as register_native
from harness.errors import BuildError
from harness.firmware.boards import list_boards, load_board
from harness.firmware.layout import flash_layout
from harness.flashfmt import otadata
from harness.flashfmt.partitions import (
    APP,
    OTA_0,
    Partition,
    PartitionTableError,
    app_partition,
    pack_partition_table,
    parse_partition_table,
    parse_partitions_csv,
    table_rows,
)
from harness.protocol.capture import parse_capture
from harness.sim.board import remove_board
from harness.sim.image import build_sim_firmware

# The generator's table with the two OTA apps listed in the other order (same offsets): ESP-IDF's
# bootloader counts OTA apps by subtype, so otadata's slot 1 is ota_1 wherever its row stands.
SWAPPED = "".join(PARTITIONS_4MB.splitlines(keepends=True)[i] for i in (0, 1, 3, 2, 4))


def _flash_reader(flash: bytes):
    return lambda offset, size: flash[offset : offset + size]


def test_one_table_type_round_trips_through_csv_and_binary() -> None:
    """The generator's rows, written as partitions.csv and read back, pack to a table the strict
    (bootloader) parser and the lenient (build / native) reader both return unchanged."""
    layout = flash_layout(load_board("sim"))
    parts = parse_partitions_csv(layout.csv())
    assert parts == list(layout.rows)
    raw = pack_partition_table(parts)
    assert parse_partition_table(raw) == parts == table_rows(raw)
    assert table_rows(b"\xff" * 0xC00) == []  # erased flash: no table, not an error
    with pytest.raises(PartitionTableError, match="no valid partition table"):
        parse_partition_table(b"\xff" * 0xC00)
    damaged = bytearray(raw)
    damaged[40] ^= 1
    with pytest.raises(PartitionTableError, match="MD5"):
        parse_partition_table(bytes(damaged))
    assert hashlib.md5(raw[: 32 * len(parts)]).digest() == raw[32 * len(parts) + 16 : 32 * len(parts) + 32]


@pytest.mark.parametrize("board", list_boards())
def test_every_boards_layout_boots_each_variant_from_its_slot(board: str) -> None:
    """For every board file: the otadata a variant's build writes makes the boot rule pick that
    variant's slot first."""
    layout = flash_layout(load_board(board))
    parts = list(layout.rows)
    ota = next(p for p in parts if p.label == "otadata")
    for variant in ("optimized", "ansi"):
        app = next(p for p in parts if p.offset == layout.slot_offset(variant))
        flash = bytearray(b"\xff" * layout.flash_bytes)
        flash[ota.offset : ota.offset + ota.size] = otadata.initial_for(parts, app, ota.size)
        order = otadata.boot_order(parts, _flash_reader(bytes(flash)))
        assert order.apps[0] == app and order.read_otadata
        assert sorted(order.apps, key=lambda p: p.offset) == [p for p in parts if p.type == APP]


def test_boot_rule_counts_ota_apps_by_subtype() -> None:
    parts = parse_partitions_csv(SWAPPED)
    ota = next(p for p in parts if p.label == "otadata")
    flash = bytearray(b"\xff" * (4 << 20))
    flash[ota.offset : ota.offset + ota.size] = otadata.select(b"\xff" * ota.size, 1, 2)
    order = otadata.boot_order(parts, _flash_reader(bytes(flash)))
    assert order.slot == 1 and order.apps[0].label == "ota_1" and order.apps[0].subtype == OTA_0 + 1
    erased = otadata.boot_order(parts, _flash_reader(b"\xff" * (4 << 20)))
    assert erased.slot is None and erased.apps[0].label == "ota_0"  # empty otadata boots ota_0
    factory = [Partition("factory", APP, 0, 0x10000, 0x100000), *parts]
    assert otadata.boot_order(factory, _flash_reader(b"\xff" * (4 << 20))).apps[0].label == "factory"


# Tables the generator never writes, as a user's partitions.csv may be: no ota_0 (so ESP-IDF's bootloader,
# which indexes OTA apps by subtype below their count, reaches ota_1 only as the second of two OTA apps)
OTA_1_ONLY = "".join(ln for ln in PARTITIONS_4MB.splitlines(keepends=True) if not ln.startswith("ota_0"))
OTA_1_AND_2 = OTA_1_ONLY.replace("model,    data, 0x40,   0x220000", "ota_2,    app,  ota_2,  0x220000")


@pytest.mark.parametrize(
    ("table", "optimized", "ansi"),
    [
        (PARTITIONS_4MB, "ota_0", "ota_1"),
        ("factory,  app,  factory, 0x300000, 0x100000\n" + PARTITIONS_4MB, "factory", "factory"),
        (OTA_1_AND_2, None, "ota_1"),  # two OTA apps: otadata selects index 1, ota_1
        (OTA_1_ONLY, None, None),  # one OTA app: index 0 only, and there is no ota_0
    ],
)
def test_app_partition_is_where_the_bootloader_boots_the_variant_from(
    table: str, optimized: str | None, ansi: str | None
) -> None:
    """One rule for the sim, pio/idf and native builders: the factory app, else the variant's OTA slot
    when ESP-IDF's bootloader can boot it; a BuildError naming the table and the fix otherwise."""
    parts = parse_partitions_csv(table)
    for variant, label in (("optimized", optimized), ("ansi", ansi)):
        if label is None:
            with pytest.raises(BuildError, match=rf"^t\.csv has no app partition .* the {variant} app") as ei:
                app_partition(parts, variant, "t.csv")
            assert "regenerate the project" in (ei.value.hint or "")
            continue
        app = app_partition(parts, variant, "t.csv")
        assert app.label == label
        with pytest.raises(BuildError, match=rf"larger than its app partition '{label}'") as ei:
            app_partition(parts, variant, "t.csv", app_bytes=app.size + 1)
        assert "partitions.csv" in (ei.value.hint or "")


def test_boot_rule_indexes_ota_apps_by_subtype_below_their_count() -> None:
    """bootloader_utility.c: OTA app N is ``bs->ota[N]``, reached only for N below the number of OTA apps.
    (The rule took the OTA apps in subtype order: it booted ota_2 for slot 1 of ota_1 + ota_2, and booted
    an ota_1-only table, which a chip does not boot.)"""
    parts = parse_partitions_csv(OTA_1_AND_2)
    ota = next(p for p in parts if p.label == "otadata")
    flash = bytearray(b"\xff" * (4 << 20))
    flash[ota.offset : ota.offset + ota.size] = otadata.select(b"\xff" * ota.size, 1, 2)
    order = otadata.boot_order(parts, _flash_reader(bytes(flash)))
    assert order.slot == 1 and [p.label for p in order.apps] == ["ota_1"]  # then index 0: no ota_0
    assert otadata.boot_order(parse_partitions_csv(OTA_1_ONLY), _flash_reader(bytes(flash))).apps == []
    with pytest.raises(ValueError, match="cannot select ota_1 among 1 OTA apps"):
        otadata.select(b"\xff" * ota.size, 1, 1)  # no sequence number maps to it (it looped forever)


@pytest.mark.parametrize(("table", "variant"), [(OTA_1_ONLY, "ansi"), (OTA_1_AND_2, "optimized")])
def test_sim_packer_refuses_a_table_the_bootloader_cannot_boot_the_app_from(
    tmp_path: Path, models_dir: Path, table: str, variant: str
) -> None:
    """(It hung writing otadata for ota_1 in an ota_1-only table; the other it packed as told.)"""
    x = np.load(models_dir / "inputs" / "cnn_classifier_11.q.npy")
    proj = make_project(tmp_path / "p", models_dir / "cnn_classifier_11.tflite", [x], variant=variant)
    (proj / "partitions.csv").write_text(table)
    with pytest.raises(BuildError, match=rf"partitions\.csv has no app partition .* the {variant} app"):
        build_sim_firmware(proj, tmp_path / "b")


def test_sim_packer_says_an_app_too_large_as_the_other_builders(tmp_path: Path, models_dir: Path) -> None:
    """(It said "the simulated app (N bytes) does not fit ota_1", with no hint.)"""
    x = np.load(models_dir / "inputs" / "cnn_classifier_11.q.npy")
    proj = make_project(tmp_path / "p", models_dir / "cnn_classifier_11.tflite", [x], variant="ansi")
    small = PARTITIONS_4MB.replace("ota_1,  0x120000, 0x100000", "ota_1,  0x120000, 0x001000")
    (proj / "partitions.csv").write_text(small)
    with pytest.raises(
        BuildError, match=r"firmware \(\d+ bytes\) is larger than its app partition 'ota_1'"
    ) as ei:
        build_sim_firmware(proj, tmp_path / "b")
    assert "partitions.csv" in (ei.value.hint or "")


def _sim_files(tmp: Path, models_dir: Path, variant: str) -> list[tuple[int, Path]]:
    x = np.load(models_dir / "inputs" / "cnn_classifier_11.q.npy")
    proj = make_project(
        tmp / f"proj-{variant}", models_dir / "cnn_classifier_11.tflite", [x], variant=variant
    )
    (proj / "partitions.csv").write_text(SWAPPED)
    return build_sim_firmware(proj, tmp / f"build-{variant}")


@pytest.mark.needs_cc
@pytest.mark.parametrize(("slot", "nn"), [(None, "optimized"), (0, "optimized"), (1, "ansi_c")])
def test_simulated_board_boots_the_slot_otadata_selects_with_ota_rows_swapped(
    tmp_path: Path, models_dir: Path, slot: int | None, nn: str
) -> None:
    """Both variants in flash, the table listing ota_1 before ota_0, otadata erased or as
    ``esp_ota_set_boot_partition(ota_<slot>)`` writes it (the firmware's BOOT command): the simulated
    board runs the app in that slot (erased: ota_0), as ESP-IDF's bootloader would. (It counted OTA apps
    in table order, and booted the first OTA row for erased otadata: the other app every time.)"""
    sim.register()
    name = f"ff-{uuid.uuid4().hex[:10]}"
    port = serial.serial_for_url(f"sim://{name}?chip=esp32s3&emitter=c", baudrate=115200, timeout=0.2)
    try:
        port.board.program(_sim_files(tmp_path, models_dir, "optimized"))
        port.board.program(_sim_files(tmp_path, models_dir, "ansi"))
        ota = next(p for p in parse_partitions_csv(SWAPPED) if p.label == "otadata")
        blank = b"\xff" * ota.size
        port.board.program([(ota.offset, blank if slot is None else otadata.select(blank, slot, 2))])
        port.dtr = False
        hard_reset(port, hold_delay=0.01)
        cap = parse_capture(read_until_end(port))
        assert cap.valid, cap.problems
        assert cap.nn_mode == nn
    finally:
        port.close()
        remove_board(name)


@pytest.mark.parametrize("slot", [None, 0, 1])
def test_native_board_boots_the_slot_otadata_selects_with_ota_rows_swapped(
    tmp_path: Path, slot: int | None
) -> None:
    """The native board's boot stand-in follows the same rule (its "apps" are scripts; only the boot
    line, printed before an app starts, is read). Erased otadata boots ota_0."""
    parts = parse_partitions_csv(SWAPPED)
    ota = next(p for p in parts if p.label == "otadata")
    blank = b"\xff" * ota.size
    (tmp_path / "table.bin").write_bytes(pack_partition_table(parts))
    (tmp_path / "ota.bin").write_bytes(blank if slot is None else otadata.select(blank, slot, 2))
    register_native()
    port = serial.serial_for_url(f"native://ff-{uuid.uuid4().hex[:10]}", timeout=HANG_S)
    try:
        port.write_region(0xC000, tmp_path / "table.bin")
        port.write_region(ota.offset, tmp_path / "ota.bin")
        for p in parts:
            if p.type == APP:
                script = tmp_path / p.label
                script.write_text(f"#!/bin/sh\necho {p.label}\n")
                port.write_region(p.offset, script)
        port.dtr = False
        hard_reset(port, hold_delay=0.01)
        out = port.read_until(b")\r\n")
        booted = next(p for p in parts if p.label == f"ota_{slot or 0}")
        assert out.startswith(BOOT_LINE.encode()) and f"0x{booted.offset:x} ({booted.label})".encode() in out
    finally:
        port.close()
