"""The model partition image: a 64-byte header, then the .tflite bytes (layout, arena fields and what the
firmware checks: docs/firmware.md "Flash layout")."""

from __future__ import annotations

import hashlib
import struct
import zlib
from dataclasses import dataclass

MAGIC = b"ECMODEL1"
HEADER_BYTES = 64
PARTITION_LABEL = "model"
PARTITION_SUBTYPE = 0x40  # first custom data subtype (ESP-IDF: 0x40..0xFE are free for applications)
# where a generated project keeps the image (generate writes it; the builders, the sim builder and the
# project's own flash targets flash it from there), under the project's esp-check/ data directory
MODEL_IMAGE = "esp-check/partitions/model.bin"


class ModelImageError(ValueError):
    """The bytes in the model partition are not a model image (or not a complete one)."""


class ModelDamagedError(ModelImageError):
    """A sound header, but the model bytes after it are not the ones its SHA-256 names. ``arena_bytes``:
    the header's arena size (0: its arena fields give none), which the firmware checks first."""

    def __init__(self, message: str, arena_bytes: int) -> None:
        super().__init__(message)
        self.arena_bytes = arena_bytes


ARENA_MEM = {"internal": 0, "psram": 1}


@dataclass(frozen=True)
class ModelImage:
    model: bytes
    sha256: str  # from the header, checked against the bytes by parse_model_image
    arena_bytes: int = 0  # 0: the header gives no arena
    arena_mem: str = "internal"  # internal | psram


def pack_model_image(model: bytes, arena_bytes: int = 0, arena_mem: str = "internal") -> bytes:
    head = MAGIC + struct.pack("<II", HEADER_BYTES, len(model)) + hashlib.sha256(model).digest()
    head += struct.pack("<I", zlib.crc32(head) & 0xFFFFFFFF)
    head += struct.pack("<IB3x", arena_bytes, ARENA_MEM[arena_mem])
    head += struct.pack("<I", zlib.crc32(head) & 0xFFFFFFFF)
    return head + model


def parse_model_image(data: bytes | bytearray | memoryview, partition_bytes: int | None = None) -> ModelImage:
    """Check and unpack what a model partition holds (``data`` may run on past the image: flash)."""
    data = bytes(data)
    if len(data) < HEADER_BYTES or data[:8] != MAGIC:
        raise ModelImageError(
            "no esp-check model image (magic ECMODEL1 missing): the model partition is empty or holds "
            "something else"
        )
    hdr, n = struct.unpack_from("<II", data, 8)
    (crc,) = struct.unpack_from("<I", data, 48)
    if crc != zlib.crc32(data[:48]) & 0xFFFFFFFF or hdr != HEADER_BYTES:
        raise ModelImageError("model image header is damaged (CRC or size field)")
    limit = (partition_bytes if partition_bytes is not None else len(data)) - HEADER_BYTES
    if n > limit or HEADER_BYTES + n > len(data):
        raise ModelImageError(f"model image announces {n} model bytes, more than the partition holds")
    model = data[HEADER_BYTES : HEADER_BYTES + n]
    sha = data[16:48].hex()
    arena, mem = _arena(data)
    if hashlib.sha256(model).hexdigest() != sha:
        message = "model bytes do not match the image's SHA-256 (partly written or damaged)"
        raise ModelDamagedError(message, arena)
    return ModelImage(model, sha, arena, mem)


def _arena(data: bytes) -> tuple[int, str]:
    """The header's arena fields (bytes 52..63, their own CRC): (0, "internal") when they give none."""
    arena, mem = struct.unpack_from("<IB", data, 52)
    (crc2,) = struct.unpack_from("<I", data, 60)
    if crc2 != zlib.crc32(data[:60]) & 0xFFFFFFFF or mem not in ARENA_MEM.values():
        return 0, "internal"
    return arena, "psram" if mem == 1 else "internal"
