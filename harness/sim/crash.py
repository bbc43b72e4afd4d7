"""Crash reports of the simulated chip, in each chip's own shape (Xtensa Guru Meditation with a
Backtrace, RISC-V with MEPC/MTVAL and a stack dump), and the app's ELF SHA-256 that ESP-IDF prints."""

from __future__ import annotations

import hashlib
import random

from harness.sim.chips import ChipSpec
from harness.sim.image import LoadedImage

# ---- panics -------------------------------------------------------------------------------------


def _hex(rng: random.Random, base: int, span: int = 0x40000) -> int:
    return (base + rng.randrange(0, span)) & ~0x3


def _flash_pc(chip: ChipSpec, rng: random.Random) -> int:
    """An address in the chip's flash-mapped code (0x400Dxxxx on the ESP32, 0x420xxxxx on S3/C3)."""
    return _hex(rng, chip.irom_start + 0x8000)


def _iram_pc(chip: ChipSpec, rng: random.Random) -> int:
    """An address in the chip's internal instruction RAM (panic_abort & co. live there)."""
    return _hex(rng, chip.iram_start + 0x1000, 0x10000)


def _stack_ptr(chip: ChipSpec, rng: random.Random) -> int:
    """A task stack address in the chip's data RAM."""
    return _hex(rng, chip.dram_start + 0x10000, 0x20000)


def elf_sha256(chip: ChipSpec, app: LoadedImage) -> str:
    """The app's "ELF file SHA256": fixed per image and per chip (the same payload built for another chip
    is another image), never random per boot."""
    h = hashlib.sha256(chip.name.encode())
    for addr, data in app.segments:
        h.update(addr.to_bytes(4, "little") + data)
    return h.hexdigest()


# ESP-IDF v5 prints CONFIG_APP_RETRIEVE_LEN_ELF_SHA (default 9) characters of it, at boot and on a panic
ELF_SHA_PRINTED = 9

# what a crash prints before its register dump / backtrace, per ``kind``
_HEADLINES = {
    "panic": "Guru Meditation Error: Core  0 panic'ed ({cause}). Exception was unhandled.",
    "abort": "abort() was called at PC 0x{pc:08x} on core 0",
    "startup": "assert failed: esp_startup_start_app app_startup.c:83 (res == pdTRUE)",
}


def panic_text(chip: ChipSpec, kind: str, rng: random.Random, elf_sha: str = "0" * 64) -> bytes:
    """A crash report in the chip's own form: ``kind`` "panic" (Guru Meditation), "abort" (abort()) or
    "startup" (an assert before app_main, e.g. no RAM left for the main task's stack).

    Addresses come from the chip's memory map (an S3 crashes at 0x420xxxxx with stacks at 0x3fcxxxxx,
    never at the classic ESP32's 0x400dxxxx / 0x3ffbxxxx); Xtensa prints registers and a ``Backtrace:``,
    RISC-V prints MEPC/MCAUSE/MTVAL and ``Stack memory:`` and no backtrace line.
    """
    pc = _flash_pc(chip, rng)
    cause = "LoadProhibited" if chip.arch == "xtensa" else "Load access fault"
    lines = [_HEADLINES[kind].format(pc=pc, cause=cause), ""]
    if chip.arch == "xtensa":
        lines += _xtensa_report(chip, kind, pc, rng)
    else:
        lines += _riscv_report(chip, kind, pc, rng)
    lines += ["", "", f"ELF file SHA256: {elf_sha[:ELF_SHA_PRINTED]}", "", "Rebooting...", ""]
    return "\r\n".join(lines).encode()


def _dump_rows(regs: list[tuple[str, int]]) -> list[str]:
    return ["".join(f"{n:<8}: 0x{v:08x}  " for n, v in regs[j : j + 4]) for j in range(0, len(regs), 4)]


def _xtensa_report(chip: ChipSpec, kind: str, pc: int, rng: random.Random) -> list[str]:
    sp = _stack_ptr(chip, rng)
    lines: list[str] = []
    frames = [(pc, sp)]
    if kind == "panic":
        ret = (_flash_pc(chip, rng) & 0x3FFFFFFF) | 0x80000000  # A0: return address, window bits on top
        regs = [("PC", pc), ("PS", 0x00060030), ("A0", ret), ("A1", sp)]
        regs += [(f"A{i}", rng.getrandbits(32)) for i in range(2, 16)]
        regs += [("SAR", 0x1D), ("EXCCAUSE", 0x1C), ("EXCVADDR", 0), ("LBEG", 0x4000C2E0),
                 ("LEND", 0x4000C2F6), ("LCOUNT", 0)]  # fmt: skip
        lines += ["Core  0 register dump:", *_dump_rows(regs), ""]
    else:  # panic_abort, esp_system_abort, abort()/__assert_func run from IRAM before the caller
        frames = [(_iram_pc(chip, rng), sp - 0x60 + 0x20 * k) for k in range(3)] + frames
    frames += [(_flash_pc(chip, rng), sp + 0x20 * (k + 1)) for k in range(4)]
    lines += ["", "Backtrace: " + " ".join(f"0x{a:08x}:0x{b:08x}" for a, b in frames), ""]
    return lines


def _riscv_report(chip: ChipSpec, kind: str, pc: int, rng: random.Random) -> list[str]:
    sp = _stack_ptr(chip, rng)
    mepc = pc if kind == "panic" else _iram_pc(chip, rng)  # an abort stops in panic_abort (IRAM)
    regs = [("MEPC", mepc), ("RA", mepc - 0x20), ("SP", sp), ("GP", chip.dram_start + 0xB400)]
    names = (
        "TP",
        "T0",
        "T1",
        "T2",
        "S0/FP",
        "S1",
        "A0",
        "A1",
        "A2",
        "A3",
        "A4",
        "A5",
        "A6",
        "A7",
        "S2",
        "S3",
    )
    regs += [(n, rng.getrandbits(32)) for n in names]
    regs += [
        ("MSTATUS", 0x00001881),
        ("MTVEC", chip.iram_start + 0x4001),
        ("MCAUSE", 0x00000005 if kind == "panic" else 0x00000003),
        ("MTVAL", 0 if kind == "panic" else 0x00009002),
        ("MHARTID", 0),
    ]
    lines = ["Core  0 register dump:", *_dump_rows(regs), "", "Stack memory:"]
    for row in range(8):
        lines.append(f"{sp + row * 32:08x}: " + " ".join(f"0x{rng.getrandbits(32):08x}" for _ in range(8)))
    return lines
