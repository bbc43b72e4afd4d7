"""Per-chip facts the simulated board answers with: detection values, eFuse words, banners, memory map
(the facts every part of esp-check shares, such as the architecture, cores and bootloader offset, come
from :mod:`harness.chips`).

Values are chosen so that esptool's own decoding of them yields a self-consistent chip
(docs/simulator.md "ROM loader protocol").
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from typing import Any

from esptool.loader import ESPLoader
from esptool.targets import CHIP_DEFS

from harness.chips import CHIPS as FACTS
from harness.chips import Chip
from harness.errors import UsageError

# The flash sizes the simulated board models, by name (an image header's size nibble is the index here),
# and esptool's RDID answer for each: manufacturer 0xEF (Winbond), memory type 0x40, capacity log2(size).
FLASH_SIZES: dict[str, int] = {f"{1 << k}MB": (1 << 20) << k for k in range(6)}
FLASH_SIZE_CODES: dict[int, int] = {size: 0x14 + k for k, size in enumerate(FLASH_SIZES.values())}


@dataclass(frozen=True)
class ChipSpec(Chip):
    """What one chip model looks like from the serial port: harness.chips' facts (shared by all of
    esp-check), and what only the simulated board needs."""

    display: str  # esptool's CHIP_NAME
    image_chip_id: int
    rom: type[ESPLoader]  # esptool's class for the chip: SPI and UART registers, flash windows, XTAL divider
    iram_start: int
    dram_start: int
    rom_banner: tuple[str, ...]  # lines before "rst:" on every ROM boot
    boot_modes: tuple[str, str]  # the ROM's "boot:" text: (SPI flash boot, download mode)
    rev: str  # "major.minor" as esp_chip_info() reports
    cpu_mhz: int  # the chip's highest frequency: the simulated CPU runs at it
    registers: dict[int, int] = field(default_factory=dict)  # eFuse and other read-only words
    # the chip revisions an ESP-IDF image for this chip accepts by default (esptool's major * 100 + minor:
    # CONFIG_ESP_REV_MIN_FULL / CONFIG_ESP_REV_MAX_FULL from Kconfig.hw_support, the same in v5.3 ... v5.5.3)
    image_revs: tuple[int, int] = (0, 99)

    def _mac_bytes(self, name: str) -> bytes:
        """A MAC derived from the board name (stable per board, unique-ish)."""
        tail = hashlib.sha256(name.encode()).digest()[:3]
        return bytes((0x24, 0x0A, 0xC4)) + tail if self.name == "esp32" else bytes((0x7C, 0xDF, 0xA1)) + tail

    def mac_registers(self, name: str) -> dict[int, int]:
        """The eFuse words holding :meth:`mac`."""
        mac = self._mac_bytes(name)
        if self.name == "esp32":
            # esptool: words = [efuse(2), efuse(1)], packed big-endian, first 2 bytes (CRC) dropped
            w2 = (0x5A << 16) | (mac[0] << 8) | mac[1]
            w1 = struct.unpack(">I", mac[2:6])[0]
            return {0x3FF5A004: w1, 0x3FF5A008: w2}
        base = 0x60007044 if self.name == "esp32s3" else 0x60008844
        mac1 = (mac[0] << 8) | mac[1]
        mac0 = struct.unpack(">I", mac[2:6])[0]
        return {base: mac0, base + 4: mac1}

    def mac(self, name: str) -> str:
        return ":".join(f"{b:02x}" for b in self._mac_bytes(name))


_ESP32_REGS = {
    0x40001000: 0x00F01D83,  # CHIP_DETECT_MAGIC_REG
    # eFuse BLK0: word3 = pkg D0WD (1<<9), rev bit0 (1<<15), CPU rated 240 MHz (1<<13)
    0x3FF5A00C: (1 << 9) | (1 << 15) | (1 << 13),
    0x3FF5A010: 0x80,  # word4: CK8M frequency calibration (128)
    0x3FF5A014: 1 << 20,  # word5: rev bit1 -> with APB_CTL_DATE bit31 = v3.0
    0x3FF6607C: 0x80000000 | 0x16042000,  # APB_CTL_DATE
    0x3FF5F06C: 800 << 7,  # RTCCALICFG1: 800 * 15625 * 128 / 40 = 40 MHz exactly
}

_ESP32S3_REGS = {
    0x40001000: 0x00000009,  # not used by esptool for S3 (chip_id comes from GET_SECURITY_INFO)
    0x60007044 + 12: 2 << 18,  # BLOCK1 word3: minor revision 2
    0x60007044 + 20: 0,  # BLOCK1 word5: major revision 0
    0x6000705C + 16: 1,  # BLOCK2 word4: block version major 1
}

_ESP32C3_REGS = {
    0x40001000: 0x1B31506F,
    0x60008844 + 12: 4 << 18,  # BLOCK1 word3: minor revision 4
    0x60008844 + 20: 0,
}


def _spec(name: str, **sim: Any) -> ChipSpec:
    """A chip's spec: harness.chips' facts, what esptool's own class for the chip says (its display name,
    image chip id, SPI and UART registers, flash windows), and ``sim`` (what only the simulated board has)."""
    rom, facts = CHIP_DEFS[name], FACTS[name]
    return ChipSpec(
        **vars(facts),
        display=rom.CHIP_NAME,
        image_chip_id=rom.IMAGE_CHIP_ID,
        rom=rom,
        cpu_mhz=facts.max_mhz[0],
        **sim,
    )


CHIPS: dict[str, ChipSpec] = {
    "esp32": _spec(
        "esp32",
        iram_start=0x40080000,
        dram_start=0x3FFB0000,
        rom_banner=("ets Jun  8 2016 00:22:57",),
        boot_modes=("0x13 (SPI_FAST_FLASH_BOOT)", "0x3 (DOWNLOAD_BOOT(UART0/UART1/SDIO_REI_REO_V2))"),
        rev="3.0",
        registers=_ESP32_REGS,
        image_revs=(0, 399),
    ),
    "esp32s3": _spec(
        "esp32s3",
        iram_start=0x40378000,
        dram_start=0x3FC88000,
        rom_banner=("ESP-ROM:esp32s3-20210327", "Build:Mar 27 2021"),
        boot_modes=("0x8 (SPI_FAST_FLASH_BOOT)", "0x0 (DOWNLOAD(USB/UART0))"),
        rev="0.2",
        registers=_ESP32S3_REGS,
    ),
    "esp32c3": _spec(
        "esp32c3",
        iram_start=0x4037C000,
        dram_start=0x3FC80000,
        rom_banner=("ESP-ROM:esp32c3-api1-20210207", "Build:Feb  7 2021"),
        boot_modes=("0xc (SPI_FAST_FLASH_BOOT)", "0x0 (DOWNLOAD(USB/UART0/1))"),
        rev="0.4",
        registers=_ESP32C3_REGS,
        image_revs=(3, 199),
    ),
}


def get_chip(name: str) -> ChipSpec:
    """Chip spec by esptool name (``esp32``, ``esp32s3``, ``esp32c3``); accepts ``ESP32-S3`` spelling."""
    key = name.lower().replace("-", "").replace("_", "")
    try:
        return CHIPS[key]
    except KeyError:
        raise UsageError(
            f"the simulated board does not model chip {name!r}",
            hint=f"use one of: {', '.join(sorted(CHIPS))}",
        ) from None
