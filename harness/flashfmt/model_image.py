"""The model partition image (docs/firmware.md "Flash layout"): a 64-byte header, then the .tflite bytes.

Written by the generator (``esp-check/partitions/model.bin`` in every project, byte-identical for both
variants), flashed into the ``model`` data partition, memory-mapped by the firmware
(``esp_partition_mmap``) and read by the simulated board. The firmware checks magic, version, length and
header CRC before it maps the model, and prints the SHA-256 it computes over the mapped bytes
(``INFO model_sha256``): the header's SHA-256 is only there so a damaged partition is named as such.

Layout (little-endian)::

    0   8  magic "ECMODEL1"
    8   4  header bytes (64)
    12  4  model bytes
    16  32 SHA-256 of the model bytes
    48  4  CRC-32 (zlib) of bytes 0..47
    52  12 zero
    64  .. the model (16-byte aligned: partitions start on 4 KB boundaries)
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from dataclasses import dataclass

MAGIC = b"ECMODEL1"
HEADER_BYTES = 64
PARTITION_LABEL = "model"
PARTITION_SUBTYPE = 0x40  # first custom data subtype (ESP-IDF: 0x40..0xFE are free for applications)


class ModelImageError(ValueError):
    """The bytes in the model partition are not a model image (or not a complete one)."""


@dataclass(frozen=True)
class ModelImage:
    model: bytes
    sha256: str  # from the header, checked against the bytes by parse_model_image


def pack_model_image(model: bytes) -> bytes:
    head = MAGIC + struct.pack("<II", HEADER_BYTES, len(model)) + hashlib.sha256(model).digest()
    head += struct.pack("<I", zlib.crc32(head) & 0xFFFFFFFF)
    return head + bytes(HEADER_BYTES - len(head)) + model


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
    if hashlib.sha256(model).hexdigest() != sha:
        raise ModelImageError("model bytes do not match the image's SHA-256 (partly written or damaged)")
    return ModelImage(model, sha)
