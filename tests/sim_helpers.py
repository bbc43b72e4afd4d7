"""Test helpers for the simulated board: projects to build, consoles to read, flash images to boot.

``make_project`` writes the minimal generated-project layout the "sim" builder reads (manifest,
partitions.csv, ``esp-check/model.tflite`` and its partition image, ``esp-check/input_<k>.bin``), for
tests that do not run the generator. ``default_partitions`` is a one-app layout for images built without a
project; ``read_app_payload`` reads a flash image back as the simulated ROM and bootloader do
(harness.sim.app). Only tests use these, so they live here and not in harness/ (no pytest dependency).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import selectors
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import serial

from harness.errors import BuildError
from harness.flashfmt import otadata
from harness.flashfmt.model_image import PARTITION_LABEL as MODEL_LABEL
from harness.flashfmt.model_image import pack_model_image, parse_model_image
from harness.flashfmt.partitions import (
    APP,
    DATA,
    FACTORY,
    TABLE_MAX_BYTES,
    TABLE_SECTOR,
    Partition,
    find,
    parse_partition_table,
)
from harness.manifest import MANIFEST_SCHEMA
from harness.resources import boards_dir, read_toml
from harness.sim.chips import ChipSpec
from harness.sim.image import (
    APP_OFFSET,
    AppPayload,
    ImageError,
    LoadedImage,
    bootloader_max_bytes,
    bootloader_table_offset,
    find_payload,
    load_image,
)

MIN_NVS_BYTES = 0x3000
END_RE = re.compile(rb"@EC1 \d+ END [^\r\n]*\r?\n")
# read_until_end's bound, which only a hung board reaches: reads end at END or silence first. Not a
# guess at boot time: with the cores busy, TFLM's child process took 5 s to print its first byte.
HANG_S = 60.0
# The generator's layout for a 4 MB board with the table at 0xC000 (harness.firmware.layout): two 1 MB
# app slots, the model after.
PARTITIONS_4MB = """\
nvs,      data, nvs,    0x00D000, 0x003000
otadata,  data, ota,    0x010000, 0x002000
ota_0,    app,  ota_0,  0x020000, 0x100000
ota_1,    app,  ota_1,  0x120000, 0x100000
model,    data, 0x40,   0x220000, 0x1E0000
"""


def make_project(
    root: Path,
    model: bytes | Path,
    inputs: Sequence[bytes | np.ndarray],
    *,
    variant: str = "optimized",
    chip: str = "esp32s3",
    **manifest: object,
) -> Path:
    """A generated-project directory holding only what ``build_sim_firmware`` needs."""
    root = Path(root)
    data = root / "esp-check"
    data.mkdir(parents=True, exist_ok=True)
    model_bytes = model if isinstance(model, bytes) else Path(model).read_bytes()
    (data / "model.tflite").write_bytes(model_bytes)
    (data / "partitions").mkdir(exist_ok=True)
    arena = manifest.get("arena_bytes")  # what the generator writes into the header (default 64 KiB)
    arena = arena if isinstance(arena, int) and arena else 64 * 1024
    mem = str(manifest.get("arena_mem") or "internal")
    (data / "partitions" / "model.bin").write_bytes(pack_model_image(model_bytes, arena, mem))
    (root / "partitions.csv").write_text(PARTITIONS_4MB)
    raws = [x if isinstance(x, bytes) else np.ascontiguousarray(x).tobytes() for x in inputs]
    for k, raw in enumerate(raws):
        (data / f"input_{k}.bin").write_bytes(raw)
    sim_board = read_toml(boards_dir() / "sim.toml", "board", "boards/sim.toml")
    doc: dict[str, object] = {
        "schema": MANIFEST_SCHEMA,
        "variant": variant,
        "chip": chip,
        "board": f"sim-{chip}",
        # where the partition table goes: the simulated board's own (boards/sim.toml)
        "board_def": {"partition_table_offset": sim_board["partition_table_offset"]},
        "template_version": "0.1.0",
        "model_sha256": hashlib.sha256(model_bytes).hexdigest(),
        "inputs": [
            {"file": f"input_{k}.bin", "sha256": hashlib.sha256(r).hexdigest()} for k, r in enumerate(raws)
        ],
        "human_max": 16,
    }
    doc.update(manifest)
    (root / "esp-check.json").write_text(json.dumps(doc, indent=2))
    return root


def read_until_end(port: serial.SerialBase, timeout: float = HANG_S, idle: float = 0.5) -> bytes:
    """Read a console until the protocol's END record, ``idle`` seconds of silence, or ``timeout``."""
    out = bytearray()
    deadline = time.monotonic() + timeout
    old = port.timeout
    port.timeout = min(idle, 0.1)
    quiet_since = time.monotonic()
    try:
        while time.monotonic() < deadline:
            chunk = port.read(port.in_waiting or 1)
            now = time.monotonic()
            if chunk:
                out += chunk
                quiet_since = now
                if END_RE.search(out):
                    break
            elif now - quiet_since >= idle:
                break
    finally:
        port.timeout = old
    return bytes(out)


def read_until_line(proc: subprocess.Popen[bytes], needle: bytes, timeout: float = HANG_S) -> bytes:
    """A process's stdout until a whole line holds ``needle``, the output ends, or ``timeout`` (which only a
    hung process reaches); a child still holding the pipe cannot stretch the bound. POSIX pipes."""
    assert proc.stdout is not None
    fd, out = proc.stdout.fileno(), bytearray()
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while not any(needle in line for line in out.split(b"\n")[:-1]):  # whole lines only
            left = deadline - time.monotonic()
            chunk = os.read(fd, 65536) if left > 0 and sel.select(left) else b""
            if not chunk:
                break
            out += chunk
    return bytes(out)


def default_partitions(app_size: int, table_offset: int) -> list[Partition]:
    """A one-app layout (nvs right after the table, factory app), for tests of images built without a
    project (generated projects bring their own partitions.csv)."""
    nvs = table_offset + TABLE_SECTOR
    if table_offset % TABLE_SECTOR or APP_OFFSET - nvs < MIN_NVS_BYTES:
        raise BuildError(
            f"partition table offset {table_offset:#x} leaves no room for nvs before the app at "
            f"{APP_OFFSET:#x}",
            hint="fix partition_table_offset in the board file and regenerate the project",
        )
    app_size = max(0x100000, (app_size + 0xFFFF) // 0x10000 * 0x10000)
    return [
        Partition("nvs", DATA, 0x02, nvs, APP_OFFSET - nvs),
        Partition("factory", APP, FACTORY, APP_OFFSET, app_size),
    ]


def read_app_payload(chip: ChipSpec, flash: bytes | bytearray) -> tuple[Partition, LoadedImage, AppPayload]:
    """Convenience for tests and tools: bootloader -> partition table -> the app otadata selects -> payload,
    with the model read from the model partition (raises on any error)."""
    boot = load_image(chip, flash, chip.bootloader_offset, bootloader_max_bytes(chip))
    table = bootloader_table_offset(boot)
    parts = parse_partition_table(bytes(flash[table : table + TABLE_MAX_BYTES]))
    order = otadata.boot_order(parts, lambda off, size: bytes(flash[off : off + size])).apps
    if not order:
        raise ImageError("no app partition in the partition table")
    errors = []
    for app in order:
        try:
            loaded = load_image(chip, flash, app.offset, app.size)
            payload = find_payload(chip, loaded)
            break
        except ImageError as exc:
            errors.append(f"{app.label}: {exc}")
    else:
        raise ImageError("no bootable app: " + "; ".join(errors))
    model = find(parts, DATA, label=MODEL_LABEL)
    if model is not None:
        image = parse_model_image(flash[model.offset : model.offset + model.size], model.size)
        payload = AppPayload(payload.header, image.model, payload.inputs)
    return app, loaded, payload
