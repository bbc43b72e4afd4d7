"""Simulated board images: real formats (esptool's image parser, gen_esp32part's table layout)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from esptool.bin_image import LoadFirmwareImage
from sim_helpers import default_partitions, make_project, read_app_payload

from harness.errors import BuildError
from harness.flashfmt.partitions import (
    Partition,
    PartitionTableError,
    pack_partition_table,
    parse_partition_table,
)
from harness.sim.chips import get_chip
from harness.sim.image import APP_OFFSET, build_sim_firmware


def _project(tmp_path: Path, models_dir: Path, chip: str = "esp32s3", variant: str = "ansi") -> Path:
    x = np.load(models_dir / "inputs" / "op_zoo.q.npy")
    return make_project(
        tmp_path / "proj", models_dir / "op_zoo.tflite", [x, x[..., ::-1].copy()], variant=variant, chip=chip
    )


def test_partition_table_layout_and_md5_row() -> None:
    parts = default_partitions(0x40000, 0xC000)
    raw = pack_partition_table(parts)
    assert len(raw) == 0xC00
    # gen_esp32part layout: 32-byte entries, then 0xEBEB + 14x0xFF + MD5 of the entries
    assert raw[:2] == b"\xaa\x50"
    md5_row = raw[64:96]
    assert md5_row[:16] == b"\xeb\xeb" + b"\xff" * 14
    assert md5_row[16:] == hashlib.md5(raw[:64]).digest()
    assert raw[96:] == b"\xff" * (0xC00 - 96)
    assert parse_partition_table(raw) == parts
    nvs, factory = parts
    assert (nvs.label, nvs.offset, nvs.size) == ("nvs", 0xD000, 0x3000)  # right after the table
    assert (factory.label, factory.type, factory.subtype, factory.offset) == ("factory", 0, 0, APP_OFFSET)
    with pytest.raises(BuildError, match="no room for nvs"):
        default_partitions(0x40000, 0xE000)


def test_partition_table_corruption_detected() -> None:
    raw = bytearray(pack_partition_table([Partition("factory", 0, 0, 0x10000, 0x100000)]))
    raw[10] ^= 0x01  # flip a bit in the entry: the MD5 row no longer matches
    with pytest.raises(PartitionTableError, match="MD5"):
        parse_partition_table(bytes(raw))
    with pytest.raises(PartitionTableError):
        parse_partition_table(b"\xff" * 0xC00)


@pytest.mark.parametrize("chip", ["esp32", "esp32s3", "esp32c3"])
def test_build_sim_firmware_real_esp_images(tmp_path: Path, models_dir: Path, chip: str) -> None:
    proj = _project(tmp_path, models_dir, chip=chip)
    files = build_sim_firmware(proj, tmp_path / "build")
    spec = get_chip(chip)
    # bootloader, the table where the board says (boards/sim.toml: 0xc000), otadata, the ANSI C app in
    # ota_1, the model image (testing.PARTITIONS_4MB)
    assert [off for off, _ in files] == [spec.bootloader_offset, 0xC000, 0x10000, 0x120000, 0x220000]
    for off, path in files:
        if off in (0xC000, 0x10000, 0x220000):
            continue
        img = LoadFirmwareImage(chip, path.read_bytes())  # esptool's own parser
        assert img.chip_id == spec.image_chip_id
        assert img.checksum == img.calculate_checksum()
        assert img.stored_digest == img.calc_digest
    flash = bytearray(b"\xff" * (4 << 20))
    for off, path in files:
        data = path.read_bytes()
        flash[off : off + len(data)] = data
    _part, _img, payload = read_app_payload(spec, flash)
    assert payload.variant == "ansi" and payload.nn == "ansi_c"
    assert payload.model == (models_dir / "op_zoo.tflite").read_bytes()
    assert len(payload.inputs) == 2 and payload.inputs[0] != payload.inputs[1]
    assert "model_sha256" not in payload.header  # the app is the same whatever the model bytes are


def test_table_offset_travels_from_the_manifest_through_the_bootloader(
    tmp_path: Path, models_dir: Path
) -> None:
    proj = _project(tmp_path, models_dir)
    manifest = json.loads((proj / "esp-check.json").read_text())
    manifest["board_def"]["partition_table_offset"] = 0x9000
    (proj / "esp-check.json").write_text(json.dumps(manifest))
    files = build_sim_firmware(proj, tmp_path / "build")
    assert [off for off, _ in files][1] == 0x9000
    flash = bytearray(b"\xff" * (4 << 20))
    for off, path in files:
        data = path.read_bytes()
        flash[off : off + len(data)] = data
    spec = get_chip("esp32s3")
    app, _img, _payload = read_app_payload(spec, flash)  # found via the offset in the bootloader image
    assert app.offset == 0x120000  # the ANSI C app, in ota_1
    flash[0xC000 : 0xC000 + 0xC00] = flash[
        0x9000 : 0x9000 + 0xC00
    ]  # a table where the bootloader does not look
    flash[0x9000 : 0x9000 + 0xC00] = b"\xff" * 0xC00
    with pytest.raises(PartitionTableError):
        read_app_payload(spec, flash)
    del manifest["board_def"]
    (proj / "esp-check.json").write_text(json.dumps(manifest))
    with pytest.raises(BuildError, match="partition_table_offset"):
        build_sim_firmware(proj, tmp_path / "b2")


def test_app_image_corruption_is_detected(tmp_path: Path, models_dir: Path) -> None:
    proj = _project(tmp_path, models_dir)
    files = dict((off, p) for off, p in build_sim_firmware(proj, tmp_path / "build"))
    spec = get_chip("esp32s3")
    flash = bytearray(b"\xff" * (4 << 20))
    for off, path in files.items():
        data = path.read_bytes()
        flash[off : off + len(data)] = data
    damaged = bytearray(flash)
    damaged[0x120000 + 0x400] ^= 0x40  # one bit in the app image
    with pytest.raises(ValueError, match=r"Checksum|hash"):
        read_app_payload(spec, damaged)
    damaged = bytearray(flash)
    damaged[0x220000 + 0x400] ^= 0x40  # one bit in the model partition
    with pytest.raises(ValueError, match="SHA-256"):
        read_app_payload(spec, damaged)


def test_builder_rejects_bad_projects(tmp_path: Path, models_dir: Path) -> None:
    with pytest.raises(BuildError, match=r"esp-check\.json"):
        build_sim_firmware(tmp_path / "nothing", tmp_path / "b")
    proj = _project(tmp_path, models_dir)
    manifest = json.loads((proj / "esp-check.json").read_text())
    manifest["variant"] = "fast"
    (proj / "esp-check.json").write_text(json.dumps(manifest))
    with pytest.raises(BuildError, match="variant"):
        build_sim_firmware(proj, tmp_path / "b")
    manifest["variant"] = "optimized"
    manifest["inputs"] = ["a", "b", "c"]
    (proj / "esp-check.json").write_text(json.dumps(manifest))
    with pytest.raises(BuildError, match="3 inputs"):
        build_sim_firmware(proj, tmp_path / "b")


@pytest.mark.parametrize("chip", ["esp32", "esp32s3", "esp32c3"])
def test_sim_builder_writes_an_elf_real_tools_read(tmp_path: Path, models_dir: Path, chip: str) -> None:
    """The ELF beside the app: pyelftools (what esp-idf-panic-decoder uses) and binutils' readelf read it;
    its sections are the image's segments; its SHA-256 is in the app description, where ESP-IDF puts it
    (0xB0 into the .bin: what pytest-embedded's --confirm-target-elf-sha256 reads)."""
    import shutil
    import subprocess

    from elftools.elf.elffile import ELFFile
    from esp_idf_panic_decoder.pc_address_matcher import PcAddressMatcher

    files = build_sim_firmware(_project(tmp_path, models_dir, chip=chip), tmp_path / "b")
    app_path = next(p for _, p in files if p.name == "esp-check-sim.bin")  # the model image comes last
    elf_path = app_path.with_suffix(".elf")
    with elf_path.open("rb") as f:
        elf = ELFFile(f)
        assert elf["e_machine"] == ("EM_XTENSA" if chip != "esp32c3" else "EM_RISCV") and elf.elfclass == 32
        sections = {s.name: s for s in elf.iter_sections()}
        symbols = sections[".symtab"].iter_symbols()
        funcs = {s.name: s["st_value"] for s in symbols if s["st_info"]["type"] == "STT_FUNC"}
        assert {"app_main", "panic_abort", "esp_nn_conv_s8_ansi"} <= set(funcs)
        image = LoadFirmwareImage(chip, str(app_path))
        by_addr = {seg.addr: bytes(seg.data) for seg in image.segments}
        for name in (".flash.rodata", ".flash.text", ".iram0.text"):
            sec = sections[name]
            data = by_addr[sec["sh_addr"]]
            if name == ".flash.rodata":  # the image's copy carries the ELF's SHA-256 in the app description
                n = len(sec.data())
                assert data[:0x90] == sec.data()[:0x90] and data[0xB0:n] == sec.data()[0xB0:]
            else:
                assert data[: len(sec.data())] == sec.data()
        assert image.entrypoint == elf["e_entry"] == funcs["call_start_cpu0"]
    digest = hashlib.sha256(elf_path.read_bytes()).digest()
    assert app_path.read_bytes()[0xB0:0xD0] == digest
    assert PcAddressMatcher(str(elf_path)).is_executable_address(funcs["app_main"] + 8)
    if shutil.which("readelf"):
        proc = subprocess.run(["readelf", "-W", "-h", "-l", "-S", "-s", str(elf_path)], capture_output=True,
                              text=True, timeout=30)  # fmt: skip
        assert proc.returncode == 0 and not proc.stderr, proc.stderr
        assert "app_main" in proc.stdout and "EXEC (Executable file)" in proc.stdout


@pytest.mark.parametrize(("board", "window"), [("sim", 64 * 1024), ("esp32c3-devkitm-1", 16 * 1024)])
def test_the_receive_window_travels_from_generate_to_the_simulated_app(
    tmp_path: Path, models_dir: Path, board: str, window: int
) -> None:
    """The window the firmware announces (compiled in from the manifest's ``resident`` buffers: 64 KiB in
    PSRAM where the board has it, the driver's 16 KiB ring on an ESP32-C3) is the one the simulated app
    announces: the sim builder read ``resident`` from a manifest that never carried it (always 16 KiB)."""
    from harness.firmware.generate import generate_projects

    model = models_dir / "op_zoo.tflite"
    proj = generate_projects(
        model, [models_dir / "inputs" / "op_zoo.npy"], board, out_dir=tmp_path / "p", arena_kb=16
    )
    ansi = next(p for p in proj if p.variant == "ansi")
    source = (ansi.path / "main" / "app_main.cc").read_text()
    assert f"constexpr int kRxWindowBytes = {window};" in source
    assert json.loads(ansi.manifest_path.read_text())["resident"]["rx_window_bytes"] == window
    files = build_sim_firmware(ansi.path, tmp_path / "build")
    flash = bytearray(b"\xff" * (4 << 20))
    for off, path in files:
        data = path.read_bytes()
        flash[off : off + len(data)] = data
    _part, _img, payload = read_app_payload(get_chip(ansi.board.chip), flash)
    assert payload.header["window"] == window
