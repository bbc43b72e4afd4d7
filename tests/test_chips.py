"""Per-chip facts (harness.chips): one row per chip, every fact present for every chip a board names.

Nothing is faked: the board files, esptool's chip classes and the simulated board's chip specs.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
from esptool.targets import CHIP_DEFS

from harness.chips import BOARD_CHIPS, CHIPS, Chip, arch_of, strap_pin
from harness.firmware.boards import list_boards, load_board
from harness.sim.chips import CHIPS as SIM_CHIPS

NAMED = sorted({load_board(b).chip for b in list_boards()} | set(BOARD_CHIPS))


@pytest.mark.parametrize("chip", NAMED)
def test_every_chip_a_board_names_has_every_fact(chip: str) -> None:
    row = CHIPS[chip]
    for f in dataclasses.fields(Chip):
        assert getattr(row, f.name) not in (None, "", ()), (chip, f.name)
    assert row.name == chip and row.arch in ("xtensa", "riscv") and 1 <= row.cores <= 2
    assert all(80 <= mhz <= 400 for mhz in row.max_mhz)
    assert row.bootloader_offset == CHIP_DEFS[chip].BOOTLOADER_FLASH_OFFSET  # esptool's chip table
    assert row.toolprefix.startswith(("xtensa-", "riscv32-")) and row.toolprefix.endswith("-elf-")
    assert row.toolprefix.startswith(row.arch.replace("riscv", "riscv32"))
    assert re.fullmatch(r"GPIO\d+", row.strap_pin) and strap_pin(chip) == row.strap_pin
    assert row.mmap_window_bytes >= 4 << 20 and row.mmap_window_bytes % (1 << 20) == 0
    assert 256 << 10 <= row.sram_bytes <= 1 << 20 and row.sram_bytes % 1024 == 0
    assert arch_of(chip) == row.arch


def test_the_simulated_chips_take_the_shared_facts_from_the_one_table() -> None:
    """The simulated board's chips agree with the table and with esptool's own class for the chip."""
    for name, spec in SIM_CHIPS.items():
        row = CHIPS[name]
        assert (spec.arch, spec.cores, spec.bootloader_offset) == (row.arch, row.cores, row.bootloader_offset)
        assert spec.cpu_mhz in row.max_mhz
        assert (spec.display, spec.image_chip_id) == (
            CHIP_DEFS[name].CHIP_NAME,
            CHIP_DEFS[name].IMAGE_CHIP_ID,
        )


def test_chips_no_board_names_keep_what_the_classifier_reads() -> None:
    assert strap_pin("esp32c2") == strap_pin("esp32h2") == "GPIO9"
    assert strap_pin("esp32x9") is None and strap_pin(None) is None
    assert arch_of("esp32c5") == "riscv"  # not in the table: every newer ESP chip is RISC-V
