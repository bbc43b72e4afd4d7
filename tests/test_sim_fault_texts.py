"""The simulator's crash texts have the real per-chip shapes, and the classifier reads them like real ones.

Faked: the board (harness.sim). What is checked against the real world: the memory map of each chip
(ESP-IDF's soc/*/include/soc/soc.h ranges: ESP32 flash code 0x400C2000-0x40BFFFFF and DRAM
0x3FFAE000-0x3FFFFFFF; ESP32-S3 flash code 0x42000000-0x43FFFFFF, IRAM 0x40370000-0x403DFFFF, DRAM
0x3FC88000-0x3FCFFFFF; ESP32-C3 flash code 0x42000000-0x427FFFFF, IRAM 0x4037C000-0x403DFFFF, DRAM
0x3FC80000-0x3FCDFFFF), RISC-V crash reports without a backtrace line, and classify() on the output.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import serial
from esp_pylib.serial_reset import hard_reset
from sim_helpers import make_project, read_until_end

import harness.sim as sim
from harness.analysis.classify import classify, exit_code_for
from harness.errors import ExitCode
from harness.sim.board import remove_board
from harness.sim.image import build_sim_firmware

sim.register()
pytestmark = pytest.mark.needs_cc

CODE = {
    "esp32": (0x400C2000, 0x40BFFFFF),
    "esp32s3": (0x42000000, 0x43FFFFFF),
    "esp32c3": (0x42000000, 0x427FFFFF),
}
IRAM = {
    "esp32": (0x40070000, 0x400BFFFF),
    "esp32s3": (0x40370000, 0x403DFFFF),
    "esp32c3": (0x4037C000, 0x403DFFFF),
}
DRAM = {
    "esp32": (0x3FFAE000, 0x3FFFFFFF),
    "esp32s3": (0x3FC88000, 0x3FCFFFFF),
    "esp32c3": (0x3FC80000, 0x3FCDFFFF),
}


def _inside(addr: int, *ranges: tuple[int, int]) -> bool:
    return any(lo <= addr <= hi for lo, hi in ranges)


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory, models_dir: Path) -> dict[tuple[str, str], list]:
    x = np.load(models_dir / "inputs" / "op_zoo.q.npy")
    out = {}
    for chip in ("esp32", "esp32s3", "esp32c3"):
        for variant in ("optimized", "ansi"):
            root = tmp_path_factory.mktemp(f"txt-{chip}-{variant}")
            proj = make_project(root / "p", models_dir / "op_zoo.tflite", [x], chip=chip, variant=variant)
            out[(chip, variant)] = build_sim_firmware(proj, root / "b")
    return out


def _elf(files: list) -> Path:
    """The ELF the sim builder left beside the app (the model partition's image comes last in the list)."""
    return next(p for _, p in files if p.name == "esp-check-sim.bin").with_suffix(".elf")


@pytest.fixture
def run(images) -> Iterator:
    opened: list[tuple[serial.SerialBase, str]] = []

    def _run(query: str, chip: str, variant: str = "optimized") -> bytes:
        name = f"t-{uuid.uuid4().hex[:12]}"
        port = serial.serial_for_url(
            f"sim://{name}?chip={chip}&emitter=c&{query}", baudrate=115200, timeout=0.2
        )
        opened.append((port, name))
        port.board.program(images[(chip, variant)])
        port.dtr = False
        hard_reset(port, hold_delay=0.01)
        return read_until_end(port, idle=0.4)

    yield _run
    for port, name in opened:
        port.close()
        remove_board(name)


@pytest.mark.parametrize("chip", ["esp32", "esp32s3"])
@pytest.mark.parametrize("kind", ["panic", "abort"])
def test_xtensa_crash_addresses_come_from_the_chips_memory_map(run, chip: str, kind: str) -> None:
    text = run(f"fault={kind}&loops=1", chip).decode("latin-1")
    (bt,) = re.findall(r"Backtrace: (.*)", text)
    pairs = [(int(pc, 16), int(sp, 16)) for pc, sp in re.findall(r"0x([0-9a-f]{8}):0x([0-9a-f]{8})", bt)]
    assert len(pairs) >= 5
    for pc, sp in pairs:
        assert _inside(pc, CODE[chip], IRAM[chip]), (chip, hex(pc))
        assert _inside(sp, DRAM[chip]), (chip, hex(sp))
    if kind == "abort":  # panic_abort / esp_system_abort / abort run from IRAM, the caller from flash
        assert all(_inside(pc, IRAM[chip]) for pc, _ in pairs[:3]) and _inside(pairs[3][0], CODE[chip])
        assert int(re.search(r"abort\(\) was called at PC 0x([0-9a-f]{8})", text).group(1), 16) == pairs[3][0]
    else:
        regs = dict(re.findall(r"\b(PC|A0|A1)\s*: 0x([0-9a-f]{8})", text))
        assert _inside(int(regs["PC"], 16), CODE[chip]) and _inside(int(regs["A1"], 16), DRAM[chip])
        assert int(regs["A0"], 16) >> 30 == 2  # a windowed return address: the top bits carry the window
    if chip == "esp32s3":
        assert not re.search(r"0x400d[0-9a-f]{4}|0x3ffb[0-9a-f]{4}", text)  # never the classic ESP32's map
    f = next(f for f in classify(text) if f.kind == kind)
    assert f.details["arch"] == "xtensa" if kind == "panic" else "backtrace" in f.details


@pytest.mark.parametrize("fault", ["panic", "abort", "bootloop"])
def test_riscv_crashes_print_mepc_mcause_and_no_backtrace(run, fault: str) -> None:
    text = run(f"fault={fault}&loops=1", "esp32c3").decode("latin-1")
    assert "Backtrace" not in text
    regs = dict(re.findall(r"\b(MEPC|MCAUSE|MTVAL|SP)\s*: 0x([0-9a-f]{8})", text))
    assert {"MEPC", "MCAUSE", "MTVAL", "SP"} <= set(regs)
    assert _inside(int(regs["MEPC"], 16), CODE["esp32c3"], IRAM["esp32c3"])
    assert _inside(int(regs["SP"], 16), DRAM["esp32c3"])
    assert "Stack memory:" in text
    findings = classify(text)
    assert exit_code_for(findings) == ExitCode.FIRMWARE_FAULT
    assert next(f for f in findings if f.severity == "firmware_fault").details["arch"] == "riscv"


def _elf_hashes(text: str) -> tuple[list[str], list[str]]:
    boot = re.findall(r"app_init: ELF file SHA256:  ([0-9a-f]+)\.\.\.", text)
    crash = re.findall(r"^ELF file SHA256: ([0-9a-f]+)\r?$", text, re.MULTILINE)
    return boot, crash


def test_elf_sha256_is_fixed_per_image_and_chip_not_per_boot(run) -> None:
    text = run("fault=panic&loops=3", "esp32s3").decode("latin-1")
    boot, crash = _elf_hashes(text)
    assert len(boot) == 3 and len(crash) == 3
    assert len(set(boot)) == 1 and set(boot) == set(crash)  # every boot and every crash: the same image
    assert re.fullmatch(r"[0-9a-f]{9}", boot[0])  # ESP-IDF 5's default length
    again, _ = _elf_hashes(run("", "esp32s3").decode("latin-1"))
    assert again == boot[:1]  # a new board, the same image: the same hash
    other, _ = _elf_hashes(run("", "esp32s3", variant="ansi").decode("latin-1"))
    c3, _ = _elf_hashes(run("", "esp32c3").decode("latin-1"))
    esp32, _ = _elf_hashes(run("", "esp32").decode("latin-1"))
    assert len({boot[0], other[0], c3[0], esp32[0]}) == 4  # another image or another chip: another hash


@pytest.mark.parametrize("chip", ["esp32", "esp32s3", "esp32c3"])
def test_sim_bootloop_is_a_startup_assert_on_every_boot(run, chip: str) -> None:
    raw = run("fault=bootloop&loops=3", chip)
    assert raw.count(b"rst:") == 3 and b"@EC1" not in raw
    assert raw.count(b"assert failed: esp_startup_start_app") == 3
    findings = classify(raw, ended_by="silence")
    kinds = [f.kind for f in findings]
    assert kinds == ["abort", "boot_loop"], kinds
    assert findings[0].details["count"] == 3  # the same crash on every boot, reported once
    assert exit_code_for(findings) == ExitCode.FIRMWARE_FAULT


def test_printed_elf_sha256_is_the_sha256_of_the_elf_file(run, images) -> None:
    """What the app prints at boot and in a crash report is the SHA-256 of the ELF the build left beside
    the image (ESP-IDF's app description field), so it matches the build a developer decodes with."""
    import hashlib

    text = run("fault=abort&loops=1", "esp32s3").decode("latin-1")
    boot, crash = _elf_hashes(text)
    elf = _elf(images[("esp32s3", "optimized")])
    want = hashlib.sha256(elf.read_bytes()).hexdigest()[:9]
    assert boot == [want] and crash == [want]


@pytest.mark.parametrize("chip", ["esp32", "esp32s3", "esp32c3"])
@pytest.mark.parametrize("variant", ["optimized", "ansi"])
def test_crash_addresses_are_functions_of_the_apps_elf(run, images, chip: str, variant: str) -> None:
    """Every code address in a simulated crash report lies in a function of the app's ELF, and the
    faulting one is the variant's ESP-NN kernel (ESP-NN's S3 assembly only for optimized on an S3)."""
    from elftools.elf.elffile import ELFFile

    elf = _elf(images[(chip, variant)])
    with elf.open("rb") as f:
        table = ELFFile(f).get_section_by_name(".symtab")
        sized = [s for s in table.iter_symbols() if s["st_size"]]
        syms = [(s["st_value"], s["st_value"] + s["st_size"], s.name) for s in sized]

    def func(addr: int) -> str | None:
        return next((n for lo, hi, n in syms if lo <= addr < hi), None)

    text = run("fault=panic&loops=1", chip, variant).decode("latin-1")
    if chip == "esp32c3":
        pcs = [int(v, 16) for v in re.findall(r"\b(?:MEPC|RA)\s*: 0x([0-9a-f]{8})", text)]
    else:
        (bt,) = re.findall(r"Backtrace: (.*)", text)
        pcs = [int(pc, 16) for pc, _ in re.findall(r"0x([0-9a-f]{8}):0x([0-9a-f]{8})", bt)]
    names = [func(pc) for pc in pcs]
    assert None not in names, [hex(p) for p in pcs]
    s3_asm = (chip, variant) == ("esp32s3", "optimized")
    assert names[0] == ("esp_nn_conv_s8_esp32s3" if s3_asm else "esp_nn_conv_s8_ansi")
