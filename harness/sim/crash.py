"""Crash reports of the simulated chip, in each chip's own shape (Xtensa Guru Meditation with a
Backtrace, RISC-V with MEPC/MTVAL and a stack dump)."""

from __future__ import annotations

import random

from harness.sim.chips import ChipSpec
from harness.sim.elf import chain as elf_chain

# ---- panics -------------------------------------------------------------------------------------


def _stack_ptr(chip: ChipSpec, rng: random.Random) -> int:
    """A task stack address in the chip's data RAM."""
    return (chip.dram_start + 0x10000 + rng.randrange(0, 0x20000)) & ~0x3


# ESP-IDF v5 prints CONFIG_APP_RETRIEVE_LEN_ELF_SHA (default 9) characters of it, at boot and on a panic
ELF_SHA_PRINTED = 9

# what a crash prints before its register dump / backtrace, per ``kind``
_HEADLINES = {
    "panic": "Guru Meditation Error: Core  0 panic'ed ({cause}). Exception was unhandled.",
    "abort": "abort() was called at PC 0x{pc:08x} on core 0",
    "startup": "assert failed: esp_startup_start_app app_startup.c:83 (res == pdTRUE)",
    # esp_flash_init_default_chip() failed in the start-up's core init (ESP-IDF 5.x)
    "flash_size": "assert failed: do_core_init startup.c:328 (flash_ret == ESP_OK)",
}


# the call chain a crash report shows, innermost first (harness.sim.elf.CHAINS)
_CHAINS = {
    "panic": ("invoke",),
    "abort": ("abort", "invoke"),
    "startup": ("assert", "startup"),
    "flash_size": ("assert", "flash_size"),
}


def crash_rng(chip: ChipSpec, kind: str, elf_sha: str, variant: str) -> random.Random:
    """The random source of one crash: seeded by the image (its ELF SHA-256, the variant, the chip) and the
    fault, never by the boot. A kernel bug faults at the same PC with the same stack on every reset, so a
    user decoding it (or comparing two resets) sees one crash, as on hardware."""
    return random.Random(f"crash:{chip.name}:{elf_sha}:{variant}:{kind}")


def panic_text(chip: ChipSpec, kind: str, elf_sha: str = "0" * 64, variant: str = "ansi") -> bytes:
    """A crash report in the chip's own form: ``kind`` "panic" (Guru Meditation), "abort" (abort()),
    "startup" (an assert before app_main, e.g. no RAM left for the main task's stack) or "flash_size"
    (the start-up's flash probe failed).

    Its addresses are functions of the app's ELF in the chip's memory map, and its shape the chip's
    (docs/simulator.md, crash reports); every value comes from :func:`crash_rng`, the same on every boot.
    """
    rng = crash_rng(chip, kind, elf_sha, variant)
    frames = [a for part in _CHAINS[kind] for a in elf_chain(chip, part, variant, rng)]
    caller = frames[0] if kind == "panic" else frames[3]  # abort(): the PC that called it
    cause = "LoadProhibited" if chip.arch == "xtensa" else "Load access fault"
    lines = [_HEADLINES[kind].format(pc=caller, cause=cause), ""]
    if chip.arch == "xtensa":
        lines += _xtensa_report(chip, kind, frames, rng)
    else:
        lines += _riscv_report(chip, kind, frames, rng)
    lines += ["", "", f"ELF file SHA256: {elf_sha[:ELF_SHA_PRINTED]}", "", "Rebooting...", ""]
    return "\r\n".join(lines).encode()


def _dump_rows(regs: list[tuple[str, int]]) -> list[str]:
    return ["".join(f"{n:<8}: 0x{v:08x}  " for n, v in regs[j : j + 4]) for j in range(0, len(regs), 4)]


def _xtensa_report(chip: ChipSpec, kind: str, frames: list[int], rng: random.Random) -> list[str]:
    sp = _stack_ptr(chip, rng)
    lines: list[str] = []
    if kind == "panic":
        ret = (frames[1] & 0x3FFFFFFF) | 0x80000000  # A0: the return address, window bits on top
        regs = [("PC", frames[0]), ("PS", 0x00060030), ("A0", ret), ("A1", sp)]
        regs += [(f"A{i}", rng.getrandbits(32)) for i in range(2, 16)]
        regs += [("SAR", 0x1D), ("EXCCAUSE", 0x1C), ("EXCVADDR", 0), ("LBEG", 0x4000C2E0),
                 ("LEND", 0x4000C2F6), ("LCOUNT", 0)]  # fmt: skip
        lines += ["Core  0 register dump:", *_dump_rows(regs), ""]
        sps = [sp + 0x20 * k for k in range(len(frames))]
    else:  # panic_abort, esp_system_abort, abort()/__assert_func run from IRAM, below the caller's frame
        sps = [sp - 0x60 + 0x20 * k for k in range(len(frames))]
    pairs = zip(frames, sps, strict=True)
    lines += ["", "Backtrace: " + " ".join(f"0x{a:08x}:0x{b:08x}" for a, b in pairs), ""]
    return lines


def _riscv_report(chip: ChipSpec, kind: str, frames: list[int], rng: random.Random) -> list[str]:
    sp = _stack_ptr(chip, rng)
    # MEPC: where it stopped (an abort stops in panic_abort, in IRAM); RA: the return address
    regs = [("MEPC", frames[0]), ("RA", frames[1]), ("SP", sp), ("GP", chip.dram_start + 0xB400)]
    names = ("TP", "T0", "T1", "T2", "S0/FP", "S1", *(f"A{k}" for k in range(8)), "S2", "S3")
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
