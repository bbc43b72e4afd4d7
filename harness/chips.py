"""Per-chip facts, one row per chip (as esptool keeps one class per chip): what the board files, the
builders, the flash layout, the backtrace decoder, the classifier and the bench inventory need to know
about a chip that is not a board's choice. The simulated board's detection values (eFuse words, ROM
banners, memory map) are in harness.sim.chips and take these facts from here.

Every chip a board file may name (:data:`BOARD_CHIPS`) has a row with every fact;
tests/test_chips.py checks it, and that the bootloader offsets agree with esptool's chip table.
"""

from __future__ import annotations

from dataclasses import dataclass

# The baud every chip's ROM bootloader talks at after reset (its boot messages, esptool's first contact:
# esptool's ESP_ROM_BAUD); the app's console may use another.
ROM_BAUD = 115200
# The app's console baud when nothing sets another: ESP-IDF's default console
# (CONFIG_ESP_CONSOLE_UART_DEFAULT, CONFIG_ESP_CONSOLE_UART_BAUDRATE's default). Board files name theirs
# (monitor_baud).
CONSOLE_BAUD = 115200
# The baud esptool writes flash at when no board file (flash_baud) or option sets another.
FLASH_BAUD = 460800
# the flash of a simulated or native board whose URL or board file names no size
DEFAULT_FLASH_SIZE = "4MB"


@dataclass(frozen=True)
class Chip:
    name: str  # esptool's and ESP-IDF's lower-case target name
    arch: str  # "xtensa" or "riscv"
    cores: int
    # the CPU frequencies (MHz) a board may choose: the highest each chip's Kconfig offers (P4: 360 before
    # silicon v3, 400 from v3)
    max_mhz: tuple[int, ...]
    # second-stage bootloader offset (ESP-IDF's BOOTLOADER_OFFSET_IN_FLASH default, esptool's chip table):
    # a fallback when a resolved sdkconfig does not say
    bootloader_offset: int
    # ESP-IDF's monitor_toolprefix (its addr2line is <prefix>addr2line)
    toolprefix: str
    # the strap pin that selects download mode at reset (esptool / ESP-IDF "boot mode selection")
    strap_pin: str
    # has the USB Serial/JTAG controller (a board may use it as its console)
    usb_serial_jtag: bool
    # flash a chip can memory-map for data (ESP-IDF soc.h, SOC_DROM_LOW..SOC_DROM_HIGH); the app's own
    # rodata shares the window. ESP32-S2 is taken as its DROM0 bus only (conservative, not measured)
    mmap_window_bytes: int
    # on-chip SRAM (the most a ROM loader's RAM download may fill): Espressif's datasheets / SoC pages
    # (espressif.com/en/products/socs): ESP32 520 KB, S2 320 KB, S3 512 KB, C3 400 KB, C6 512 KB HP SRAM,
    # P4 768 KB HP L2MEM
    sram_bytes: int

    @property
    def toolchain_prefixes(self) -> tuple[str, ...]:
        """The chip's own toolchain prefixes: ESP-IDF >= 5.2 ships one xtensa-esp-elf toolchain for all
        Xtensa chips, with per-chip names too."""
        return (self.toolprefix, "xtensa-esp-elf-") if self.arch == "xtensa" else (self.toolprefix,)


# One row per chip, in Chip's field order. The data windows: ESP32 0x3F400000..0x3F800000, S3
# 0x3C000000..0x3E000000, P4 0x40000000..0x44000000.
_ROWS = (
    # name, arch, cores, max_mhz, bootloader_offset, toolprefix, strap_pin, usb_serial_jtag,
    # mmap_window_bytes, sram_bytes
    ("esp32", "xtensa", 2, (240,), 0x1000, "xtensa-esp32-elf-", "GPIO0", False, 4 << 20, 520 << 10),
    ("esp32s2", "xtensa", 1, (240,), 0x1000, "xtensa-esp32s2-elf-", "GPIO0", False, 4 << 20, 320 << 10),
    ("esp32s3", "xtensa", 2, (240,), 0x0, "xtensa-esp32s3-elf-", "GPIO0", True, 32 << 20, 512 << 10),
    ("esp32c3", "riscv", 1, (160,), 0x0, "riscv32-esp-elf-", "GPIO9", True, 8 << 20, 400 << 10),
    ("esp32c6", "riscv", 1, (160,), 0x0, "riscv32-esp-elf-", "GPIO9", True, 16 << 20, 512 << 10),
    ("esp32p4", "riscv", 2, (360, 400), 0x2000, "riscv32-esp-elf-", "GPIO35", True, 64 << 20, 768 << 10),
)
CHIPS: dict[str, Chip] = {row[0]: Chip(*row) for row in _ROWS}
BOARD_CHIPS = tuple(CHIPS)  # the chips a board file may name
# Chips no board file may name, whose ROM output the classifier still reads: their strap pins.
OTHER_STRAP_PINS = {"esp32c2": "GPIO9", "esp32h2": "GPIO9"}


def strap_pin(chip: str | None) -> str | None:
    """The download-mode strap pin of a chip named in a device's output (None when not known)."""
    known = CHIPS.get(chip or "")
    return known.strap_pin if known is not None else OTHER_STRAP_PINS.get(chip or "")


def arch_of(chip: str) -> str:
    """``xtensa`` or ``riscv`` (a chip not in the table: riscv, as every newer ESP chip)."""
    known = CHIPS.get(chip)
    return known.arch if known is not None else "riscv"
