"""The SHA-256 a device reports in HELLO for an app slot (docs/protocol.md "HELLO", app/other-slot hashes).

The rule ESP-IDF follows, and why the host needs it: docs/protocol.md "App slot hashes and the skipped
flash". :func:`slot_sha256` computes it from the ``.bin`` the host flashes, with esptool's image parser.
"""

from __future__ import annotations

import hashlib
import io

ESP_IMAGE_MAGIC = 0xE9
# esp_app_desc_t opens an ESP-IDF app's first segment: file offset 0x20 of the .bin (24-byte image header,
# 8-byte segment header); its app_elf_sha256 is at 0x90 in it (0xB0 into the .bin, where pytest-embedded
# reads it), and its start-up log prints a prefix of that as "ELF file SHA256:"
APP_DESC_AT = 0x20
APP_DESC_MAGIC = 0xABCD5432
APP_DESC_ELF_SHA = 0x90
# project_name in esp-check's app descriptions: the generated projects' CMake project() name, after which
# ESP-IDF names the app's .bin and .elf (the builders' outputs, the simulated app's start-up log)
APP_NAME = "esp_check_fw"


def elf_sha256(head: bytes) -> str:
    """The ``app_elf_sha256`` of the app description at the start of an app ``.bin`` (``head``: its first
    ``APP_DESC_AT + APP_DESC_ELF_SHA + 32`` bytes or more), hex; "" when it is not an ESP-IDF app image or
    the hash is not set."""
    desc = head[APP_DESC_AT:]
    if (
        len(desc) < APP_DESC_ELF_SHA + 32
        or head[0] != ESP_IMAGE_MAGIC
        or int.from_bytes(desc[:4], "little") != APP_DESC_MAGIC
    ):
        return ""
    sha = desc[APP_DESC_ELF_SHA : APP_DESC_ELF_SHA + 32]
    return sha.hex() if any(sha) else ""


def slot_sha256(data: bytes, chip: str) -> str:
    """What ``esp_partition_get_sha256`` reports for a slot holding ``data`` (lower-case hex), or "" when
    ESP-IDF would find no valid image there (damaged digest, unreadable header or segments)."""
    if not data or data[0] != ESP_IMAGE_MAGIC:
        return hashlib.sha256(data).hexdigest() if data else ""  # a native board's host program
    from esptool.bin_image import LoadFirmwareImage  # lazy: esptool (~75 ms) is not on a repeat run's path

    try:
        cls = type(LoadFirmwareImage(chip, data))  # the chip's image class
        f = io.BytesIO(data)
        img = cls(f)  # parses header, segments and checksum; leaves f after the checksum byte
    except Exception:  # esptool raises FatalError / struct.error on garbage
        return ""
    end = f.tell()
    if getattr(img, "append_digest", False):
        stored = bytes(img.stored_digest)
        if len(stored) != 32 or hashlib.sha256(data[:end]).digest() != stored:
            return ""
        return stored.hex()
    return hashlib.sha256(data[:end]).hexdigest()
