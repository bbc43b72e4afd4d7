"""Flash images for the simulated board, in the real formats (ESP images made with esptool's own classes),
and ``build_sim_firmware``, the "sim" builder: a generated project packed as bootloader, partition table,
otadata and an app whose flash-mapped data segment carries the inputs and the protocol settings. What the
images hold and how the simulated board boots them: docs/simulator.md "Booting an image".
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from esptool.bin_image import BaseFirmwareImage, ELFSection, LoadFirmwareImage
from esptool.targets import CHIP_DEFS

from harness.chips import CONSOLE_BAUD, DEFAULT_FLASH_SIZE
from harness.errors import BuildError
from harness.flashfmt import otadata
from harness.flashfmt.model_image import MODEL_IMAGE
from harness.flashfmt.model_image import PARTITION_LABEL as MODEL_LABEL
from harness.flashfmt.partitions import (
    DATA,
    OTADATA,
    TABLE_SECTOR,
    app_partition,
    find,
    pack_partition_table,
    read_partitions_csv,
)
from harness.manifest import MANIFEST_NAME, NN_EXPECTED, Manifest, read_manifest
from harness.protocol.app_image import APP_DESC_ELF_SHA, APP_DESC_MAGIC, APP_NAME
from harness.sim import elf
from harness.sim.chips import FLASH_SIZES, ChipSpec, get_chip

APP_OFFSET = 0x10000
_BOOTLOADER_PT_MARKER = b"ESPCHK-PT-OFFSET"  # followed by the offset as a little-endian u32
PAYLOAD_MAGIC = b"ESPCHKSIM1\0\0"
PAYLOAD_FORMAT = 2  # 2: the model is not in the app but in the model partition (inputs may be none)

# the files build_sim_firmware writes, by their role in a build (the ELF is the app's name, .elf)
SIM_FILES = {
    "bootloader": "bootloader.bin",
    "partition-table": "partition-table.bin",
    "otadata": "ota_data_initial.bin",
    "app": "esp-check-sim.bin",
}


# ---- app payload -------------------------------------------------------------------------------


@dataclass(frozen=True)
class AppPayload:
    """What the simulated app has "compiled in" (its settings and inputs), plus the model it mapped from the
    model partition at boot (``model`` is empty until then)."""

    header: dict[str, Any]
    model: bytes
    inputs: tuple[bytes, ...]

    @property
    def variant(self) -> str:
        return str(self.header["variant"])

    @property
    def nn(self) -> str:
        return NN_EXPECTED.get(self.variant, NN_EXPECTED["ansi"])


def pack_payload(header: dict[str, Any], inputs: list[bytes]) -> bytes:
    hdr = dict(header)
    hdr["format"] = PAYLOAD_FORMAT
    hdr["model_bytes"] = 0
    hdr["input_bytes"] = [len(b) for b in inputs]
    raw = json.dumps(hdr, sort_keys=True).encode()
    return PAYLOAD_MAGIC + struct.pack("<I", len(raw)) + raw + b"".join(inputs)


def unpack_payload(data: bytes) -> AppPayload:
    if not data.startswith(PAYLOAD_MAGIC):
        raise ValueError("no esp-check payload in the app image")
    pos = len(PAYLOAD_MAGIC)
    (hlen,) = struct.unpack_from("<I", data, pos)
    pos += 4
    header = json.loads(data[pos : pos + hlen].decode())
    pos += hlen
    if header.get("format") != PAYLOAD_FORMAT:  # (its model_bytes is 0: the model is mapped at boot)
        raise ValueError(f"payload format {header.get('format')} not understood")
    inputs = []
    for n in header["input_bytes"]:
        inputs.append(data[pos : pos + int(n)])
        pos += int(n)
    if any(len(b) != n for b, n in zip(inputs, header["input_bytes"], strict=True)):
        raise ValueError("payload truncated")
    return AppPayload(header=header, model=b"", inputs=tuple(inputs))


def _app_desc(project: str, version: str, idf: str, elf_sha: bytes = b"\0" * 32) -> bytes:
    """esp_app_desc_t (256 bytes), as at the start of every IDF app's DROM."""

    def s(v: str, n: int) -> bytes:
        return v.encode()[: n - 1].ljust(n, b"\0")

    desc = struct.pack("<III", APP_DESC_MAGIC, 0, 0) + b"\0" * 4
    desc += s(version, 32) + s(project, 32) + s("00:00:00", 16) + s("Jan  1 2026", 16) + s(idf, 32)
    desc += elf_sha + struct.pack("<HHB3s", 0, 0xFFFF, 16, b"\0") + b"\0" * 72
    return desc.ljust(256, b"\0")


def app_sections(
    chip: ChipSpec, payload: bytes, *, version: str, idf: str, elf_sha: bytes = b"\0" * 32
) -> list[tuple[str, int, bytes, int]]:
    """(name, address, bytes, SHF flags) of the simulated app: the app description + payload (DROM), the
    code laid out by harness.sim.elf (flash-mapped IROM and IRAM). The image and the ELF hold the same."""
    drom = _app_desc(APP_NAME, version, idf, elf_sha) + payload
    text, iram = elf.section_size(chip, ".flash.text"), elf.section_size(chip, ".iram0.text")
    code = elf.SHF_ALLOC | elf.SHF_EXECINSTR
    return [
        (".flash.rodata", chip.rom.DROM_MAP_START + elf.CODE_OFFSET, drom, elf.SHF_ALLOC),
        (".flash.text", elf.flash_text_addr(chip), elf.code_bytes(chip, text), code),
        (".iram0.text", chip.iram_start, elf.code_bytes(chip, iram), code),
    ]


def flash_size_freq(flash_size: str) -> int:
    """Image header byte 3 for ``flash_size`` ("4MB") at 40 MHz, as ESP-IDF's build writes it: the size in
    the high nibble (esptool's FLASH_SIZES for the ESP32 family: 1MB 0, 2MB 1, ...), 0x0 = 40 MHz below."""
    if flash_size.upper() not in FLASH_SIZES:
        raise BuildError(
            f"flash size {flash_size!r} is not one the simulated board models",
            hint=f"use one of {', '.join(FLASH_SIZES)}",
        )
    return list(FLASH_SIZES).index(flash_size.upper()) << 4


def header_flash_bytes(image: BaseFirmwareImage) -> int:
    """The flash size an image header states (byte 3, high nibble), in bytes."""
    return (1 << 20) << ((int(image.flash_size_freq) >> 4) & 0x7)


def pack_bootloader_image(
    chip: ChipSpec, table_offset: int, flash_size: str, revs: tuple[int, int] | None
) -> bytes:
    """A second-stage bootloader image (RAM segments only) with the chip id and SHA-256 appended, its
    data segment holding the partition table offset (docs/simulator.md "Booting an image")."""
    banner = b"esp-check simulated 2nd stage bootloader\0".ljust(48, b"\0")
    banner += _BOOTLOADER_PT_MARKER + struct.pack("<I", table_offset)
    segments = [
        ELFSection(b".dram0.data", chip.dram_start + 0x10000, banner.ljust(96, b"\0"), 0),
        ELFSection(b".iram_loader.text", chip.iram_start + 0x20000, b"\x00" * 32, 0),
    ]
    return _save_image(chip, flash_size, revs, segments, chip.iram_start + 0x20000)


def _save_image(
    chip: ChipSpec, flash_size: str, revs: tuple[int, int] | None, segments: list[ELFSection], entry: int
) -> bytes:
    """An ESP image of ``segments`` with the header ESP-IDF's build writes: DIO, the flash size at 40 MHz,
    the chip revisions it accepts (``revs``, else the chip's defaults) as ``elf2image --min-rev-full
    --max-rev-full`` and the legacy ``--min-rev`` (the major revision on the ESP32, the minor one on the C3)
    write them: esptool's write-flash refuses a bootloader for another revision."""
    img = CHIP_DEFS[chip.name].BOOTLOADER_IMAGE()
    img.flash_mode = 2  # dio
    img.flash_size_freq = flash_size_freq(flash_size)
    low, high = revs if revs is not None else chip.image_revs
    img.min_rev_full, img.max_rev_full = low, high
    img.min_rev = low // 100 if chip.name == "esp32" else low % 100 if chip.name == "esp32c3" else 0
    img.segments, img.entrypoint = segments, entry
    out = img.save(None)
    assert out is not None
    return bytes(out)


class ImageError(ValueError):
    """An image in flash fails the checks the ROM / bootloader make (magic, checksum, SHA-256, chip)."""


@dataclass
class LoadedImage:
    image: BaseFirmwareImage
    segments: list[tuple[int, bytes]] = field(default_factory=list)


def load_image(chip: ChipSpec, flash: bytes | bytearray, offset: int, max_len: int) -> LoadedImage:
    """Parse and validate an ESP image at ``offset`` exactly as far as a real boot does."""
    first = flash[offset : offset + 1]
    if first != b"\xe9":
        word = struct.unpack("<I", bytes(flash[offset : offset + 4]).ljust(4, b"\xff"))[0]
        raise ImageError(f"invalid header: 0x{word:08x}")
    try:
        img = LoadFirmwareImage(chip.name, bytes(flash[offset : offset + max_len]))
    except Exception as exc:  # esptool raises FatalError / struct.error on garbage
        raise ImageError(f"image at 0x{offset:x} unreadable: {exc}") from exc
    if getattr(img, "chip_id", chip.image_chip_id) != chip.image_chip_id:
        raise ImageError(f"mismatching chip ID in image: {img.chip_id} != {chip.image_chip_id}")
    if img.checksum != img.calculate_checksum():
        raise ImageError(
            f"Checksum failed. Calculated 0x{img.calculate_checksum():02x} read 0x{img.checksum:02x}"
        )
    if getattr(img, "append_digest", False) and img.stored_digest != img.calc_digest:
        raise ImageError("Image hash failed - image is corrupt")
    return LoadedImage(img, [(s.addr, bytes(s.data)) for s in img.segments])


def _drom_desc(chip: ChipSpec, loaded: LoadedImage) -> bytes | None:
    """The image's DROM segment that opens with the app description (esp_app_desc_t, 256 bytes)."""
    for addr, data in loaded.segments:
        in_drom = chip.rom.DROM_MAP_START <= addr < chip.rom.DROM_MAP_END
        if in_drom and len(data) >= 256 and struct.unpack_from("<I", data, 0)[0] == APP_DESC_MAGIC:
            return data
    return None


def app_elf_sha256(chip: ChipSpec, loaded: LoadedImage) -> str:
    """The app's "ELF file SHA256", as ESP-IDF prints it: the ``app_elf_sha256`` of the image's app
    description; an image packed without one gets a hash of its segments and the chip (fixed per image)."""
    sha = (_drom_desc(chip, loaded) or b"")[APP_DESC_ELF_SHA : APP_DESC_ELF_SHA + 32]
    if any(sha):
        return sha.hex()
    h = hashlib.sha256(chip.name.encode())
    for addr, data in loaded.segments:
        h.update(addr.to_bytes(4, "little") + data)
    return h.hexdigest()


def bootloader_max_bytes(chip: ChipSpec) -> int:
    """Bytes of flash the bootloader may span: from its offset up to the app (it ends before the table)."""
    return APP_OFFSET - chip.bootloader_offset


def bootloader_table_offset(loaded: LoadedImage) -> int:
    """The partition table offset compiled into a (simulated) second-stage bootloader image."""
    for _addr, data in loaded.segments:
        pos = data.find(_BOOTLOADER_PT_MARKER)
        if pos >= 0 and pos + len(_BOOTLOADER_PT_MARKER) + 4 <= len(data):
            (offset,) = struct.unpack_from("<I", data, pos + len(_BOOTLOADER_PT_MARKER))
            if offset % TABLE_SECTOR == 0 and 0 < offset < APP_OFFSET:
                return int(offset)
    raise ImageError("bootloader image holds no partition table offset (not built by the sim builder?)")


def find_payload(chip: ChipSpec, loaded: LoadedImage) -> AppPayload:
    data = _drom_desc(chip, loaded)
    if data is None or len(data) == 256:
        raise ImageError("app image has no esp-check payload (not built by the sim builder?)")
    return unpack_payload(data[256:])


# ---- the "sim" builder -------------------------------------------------------------------------


def _input_files(project_dir: Path, manifest: Manifest) -> list[Path]:
    data = project_dir / "esp-check"
    files = sorted(data.glob("input_*.bin"), key=lambda p: int(re.sub(r"\D", "", p.stem) or 0))
    declared = manifest.get("inputs")
    if isinstance(declared, list) and len(declared) != len(files):
        raise BuildError(
            f"{project_dir}: manifest lists {len(declared)} inputs but {len(files)} input_<k>.bin "
            "files exist",
            hint="regenerate the project",
        )
    return files  # none: a resident firmware that takes every input over the link


_HYBRID_ROW = re.compile(r"^\s*\{ (\d+), (\d+), (k[A-Za-z]+), \d+ \},", re.MULTILINE)


def hybrid_table(project_dir: Path) -> list[list[int | str]] | None:
    """``[[op, out_tensor, kind], ...]`` from the kSlots table of a project's main/esp_check_hybrid.cc
    when main/CMakeLists.txt compiles it (None otherwise): what the simulated wrapper dispatches on."""
    source = project_dir / "main" / "esp_check_hybrid.cc"
    cmake = project_dir / "main" / "CMakeLists.txt"
    try:
        if '"esp_check_hybrid.cc"' not in cmake.read_text(encoding="utf-8"):
            return None
        text = source.read_text(encoding="utf-8")
    except OSError:
        return None
    start = text.find("kSlots[] = {")
    end = text.find("};", start)
    if start < 0 or end < 0:
        raise BuildError(f"{source}: no kSlots table", hint="regenerate the project")
    return [[int(a), int(b), k] for a, b, k in _HYBRID_ROW.findall(text[start:end])]


def _table_offset(project_dir: Path, manifest: Manifest) -> int:
    board_def = manifest.get("board_def")
    offset = board_def.get("partition_table_offset") if isinstance(board_def, dict) else None
    if not isinstance(offset, int) or isinstance(offset, bool):
        raise BuildError(
            f"{project_dir / MANIFEST_NAME} does not say where the partition table goes "
            "(board_def.partition_table_offset)",
            hint="regenerate the project with this esp-check version",
        )
    return offset


def _app_header(manifest: Manifest, chip: ChipSpec, project_dir: Path) -> dict[str, Any]:
    """The simulated app's compiled-in settings (what the real firmware has from its sources)."""
    tap = manifest.get("tap") or {}
    dump_ops = tap.get("dump_ops", [])
    return {
        "variant": manifest["variant"],
        "chip": chip.name,
        "board": str(manifest.get("board", "sim")),
        "fwver": str(manifest.get("template_version") or manifest.get("fwver") or "0.0.0"),
        "human_max": int(manifest.get("human_max", 16)),
        # the arena comes with the model (its partition header); the app has only the board's limits
        "arena_max": {str(k): int(v) for k, v in dict(manifest.get("arena_max") or {}).items()},
        "keep_bytes": int(manifest.get("keep_bytes", 0)),  # the kept-input store in PSRAM (0: none)
        "console_baud": int(manifest.get("console_baud", CONSOLE_BAUD)),
        # a UART console can switch its baud (BAUD); USB-Serial-JTAG cannot
        "console": str((manifest.get("board_def") or {}).get("console") or "uart"),
        "idf": str(manifest.get("idf", "sim")),
        "tflm": str(manifest.get("tflm", "sim")),
        "espnn": str(manifest.get("espnn", "sim")),
        "window": _window(manifest),
        # --tap firmware: per-op records and the ops whose tensors it dumps (generate.py's manifest)
        "tap": bool(tap.get("enabled", False)),
        "dump_ops": [int(k) for k in dump_ops] if isinstance(dump_ops, list) else [],
        # hybrid firmware: the wrapper table as compiled (main/esp_check_hybrid.cc), not as intended
        "hybrid": hybrid_table(project_dir),
    }


def _window(manifest: Manifest) -> int:
    """The receive window the app announces: the manifest's ``resident`` buffers (generate.py
    ``resident_buffers``: 64 KiB on a board with PSRAM), 16 KiB for a manifest without them."""
    resident = manifest.get("resident") or {}
    return int(resident.get("rx_window_bytes") or resident.get("rx_buffer_bytes") or 16384)


def _board_revisions(board_def: object) -> tuple[int, int] | None:
    """The board's ``chip_rev_min`` / ``chip_rev_max`` ("major.minor") as esptool's major * 100 + minor, or
    None (the chip's defaults) when the manifest does not give both."""
    if not isinstance(board_def, dict):
        return None
    out = []
    for key in ("chip_rev_min", "chip_rev_max"):
        m = re.fullmatch(r"(\d{1,2})\.(\d{1,2})", str(board_def.get(key) or ""))
        if m is None:
            return None
        out.append(int(m.group(1)) * 100 + int(m.group(2)))
    return (out[0], out[1]) if out[0] <= out[1] else None


def build_sim_firmware(project_dir: Path, build_dir: Path) -> list[tuple[int, Path]]:
    """Pack a generated project into bootloader / partition table / otadata / app (+ the project's model
    image) for the simulated board; returns the esptool (offset, file) list (docs/simulator.md "Booting an
    image")."""
    project_dir = Path(project_dir)
    build_dir = Path(build_dir)
    manifest = read_manifest(project_dir)
    chip = get_chip(str(manifest.get("chip") or manifest.get("target") or "esp32s3"))
    table_offset = _table_offset(project_dir, manifest)
    parts = read_partitions_csv(project_dir / "partitions.csv")
    header = _app_header(manifest, chip, project_dir)
    inputs = [p.read_bytes() for p in _input_files(project_dir, manifest)]
    board_def = manifest.get("board_def")
    size = board_def.get("flash_size") if isinstance(board_def, dict) else None
    flash_size = str(size or manifest.get("flash_size") or DEFAULT_FLASH_SIZE)
    payload = pack_payload(header, inputs)
    version, idf = str(header["fwver"]), str(header["idf"])
    # ESP-IDF links the ELF with an empty app_elf_sha256, then puts the ELF's SHA-256 into the .bin (as
    # ``esptool elf2image --elf-sha256-offset`` does); the image's entry point is call_start_cpu0
    elf_bytes = elf.write_elf(chip, app_sections(chip, payload, version=version, idf=idf), chip.iram_start)
    elf_sha = hashlib.sha256(elf_bytes).digest()
    sections = app_sections(chip, payload, version=version, idf=idf, elf_sha=elf_sha)
    segments = [ELFSection(name.encode(), addr, data, 0) for name, addr, data, _flags in sections]
    revs = _board_revisions(board_def)
    app = _save_image(chip, flash_size, revs, segments, chip.iram_start)
    app_part = app_partition(
        parts, header["variant"], str(project_dir / "partitions.csv"), app_bytes=len(app)
    )
    build_dir.mkdir(parents=True, exist_ok=True)
    boot = pack_bootloader_image(chip, table_offset, flash_size, revs)
    files = [
        (chip.bootloader_offset, build_dir / SIM_FILES["bootloader"], boot),
        (table_offset, build_dir / SIM_FILES["partition-table"], pack_partition_table(parts)),
        (app_part.offset, build_dir / SIM_FILES["app"], app),
        (-1, build_dir / "esp-check-sim.elf", elf_bytes),  # beside the app, as ESP-IDF leaves <project>.elf
    ]
    ota = find(parts, DATA, OTADATA)
    if ota is not None:
        data = otadata.initial_for(parts, app_part, ota.size)
        files.append((ota.offset, build_dir / SIM_FILES["otadata"], data))
    out = []
    for off, path, data in files:
        path.write_bytes(data)
        if off >= 0:
            out.append((off, path))
    model = find(parts, DATA, label=MODEL_LABEL)
    image = project_dir / MODEL_IMAGE
    if model is not None and image.is_file():
        out.append((model.offset, image))
    return sorted(out)
