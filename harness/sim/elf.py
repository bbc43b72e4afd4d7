"""The simulated app's ELF file: what ESP-IDF leaves beside the app binary, in a form real tools read.

What it holds and which tools read it: docs/simulator.md "Booting an image". The simulator's crash
reports pick their addresses from the same layout (:func:`frame_address`), so a backtrace from the
simulated board decodes to these functions.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass

from harness.sim.chips import ChipSpec

# e_machine (EM_XTENSA, EM_RISCV) and e_flags, by arch, as ESP-IDF's toolchains set them (RVC for the C3)
_MACHINE = {"xtensa": (94, 0x300), "riscv": (243, 0x1)}
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR = 0x1, 0x2, 0x4
SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB = 1, 2, 3
PT_LOAD = 1
ET_EXEC = 2
CODE_OFFSET = 0x20  # .flash.text / .flash.rodata start 0x20 into their 64 KB page, as in ESP-IDF apps

# (section, symbol, size): IRAM first (entry point, panic path), then flash-mapped code
_IRAM_FUNCS = (
    ("call_start_cpu0", 0x180),
    ("panic_abort", 0x40),
    ("esp_system_abort", 0x20),
    ("abort", 0x60),
    ("__assert_func", 0xA0),
    ("panic_handler", 0x200),
)
_FLASH_FUNCS = (
    ("app_main", 0x120),
    ("_ZN12_GLOBAL__N_13RunEP5ecp_t", 0x480),  # (anonymous namespace)::Run(ecp_t*) in app_main.cc
    ("_ZN6tflite16MicroInterpreter6InvokeEv", 0x140),
    ("_ZN6tflite10MicroGraph14InvokeSubgraphEi", 0x1C0),
    ("_ZN6tflite12_GLOBAL__N_14EvalEP13TfLiteContextP10TfLiteNode", 0x2A0),  # conv Eval
    ("esp_nn_conv_s8_ansi", 0x3C0),
    ("esp_nn_conv_s8_esp32s3", 0x900),
    ("esp_nn_depthwise_conv_s8_ansi", 0x380),
    ("esp_nn_depthwise_conv_s8_esp32s3", 0x7C0),
    ("main_task", 0xE0),
    ("esp_startup_start_app", 0x90),
    ("start_cpu0_default", 0x160),
    ("do_core_init", 0x130),
)

# the call chains a crash report shows, innermost first ("KERNEL" is the variant's conv kernel)
CHAINS = {
    "invoke": (
        "KERNEL",
        "_ZN6tflite12_GLOBAL__N_14EvalEP13TfLiteContextP10TfLiteNode",
        "_ZN6tflite10MicroGraph14InvokeSubgraphEi",
        "_ZN6tflite16MicroInterpreter6InvokeEv",
        "_ZN12_GLOBAL__N_13RunEP5ecp_t",
    ),
    "abort": ("panic_abort", "esp_system_abort", "abort"),
    "assert": ("panic_abort", "esp_system_abort", "__assert_func"),
    "startup": ("esp_startup_start_app", "start_cpu0_default"),
    "flash_size": ("do_core_init", "start_cpu0_default"),
}


@dataclass(frozen=True)
class Symbol:
    name: str
    section: str
    addr: int
    size: int


def flash_text_addr(chip: ChipSpec) -> int:
    return chip.rom.IROM_MAP_START + CODE_OFFSET


def layout(chip: ChipSpec) -> list[Symbol]:
    """The simulated app's functions for ``chip``: the same addresses in every image for that chip."""
    out: list[Symbol] = []
    for section, base, funcs in (
        (".iram0.text", chip.iram_start, _IRAM_FUNCS),
        (".flash.text", flash_text_addr(chip), _FLASH_FUNCS),
    ):
        addr = base
        for name, size in funcs:
            out.append(Symbol(name, section, addr, size))
            addr += size
    return out


def section_size(chip: ChipSpec, section: str) -> int:
    return sum(s.size for s in layout(chip) if s.section == section)


def frame_address(chip: ChipSpec, name: str, rng: random.Random) -> int:
    """A code address inside function ``name`` (4-byte aligned, past its prologue)."""
    sym = next(s for s in layout(chip) if s.name == name)
    return (sym.addr + 8 + rng.randrange(0, sym.size - 16)) & ~0x3


def chain(chip: ChipSpec, kind: str, variant: str, rng: random.Random) -> list[int]:
    """Addresses of a call chain (see :data:`CHAINS`), innermost first. Its conv kernel: ESP-NN's S3
    assembly when optimized on an S3, else its C code."""
    s3_asm = variant == "optimized" and chip.name == "esp32s3"
    kernel = "esp_nn_conv_s8_esp32s3" if s3_asm else "esp_nn_conv_s8_ansi"
    return [frame_address(chip, kernel if n == "KERNEL" else n, rng) for n in CHAINS[kind]]


def code_bytes(chip: ChipSpec, size: int) -> bytes:
    """Filler for code sections: the simulated CPU never runs it (Xtensa ``nop.n``, RISC-V ``c.nop``)."""
    unit = b"\x3d\xf0" if chip.arch == "xtensa" else b"\x01\x00"
    return unit * (size // 2) + b"\0" * (size % 2)


def write_elf(chip: ChipSpec, sections: list[tuple[str, int, bytes, int]], entry: int) -> bytes:
    """A little-endian ELF32 executable: ``sections`` are (name, address, bytes, SHF flags); the FUNC
    symbols of :func:`layout` are added for the sections that hold them."""
    names = [s[0] for s in sections]
    syms = [s for s in layout(chip) if s.section in names]
    strtab = bytearray(b"\0")
    symtab = bytearray(b"\0" * 16)
    for s in syms:
        symtab += struct.pack("<IIIBBH", len(strtab), s.addr, s.size, 0x12, 0, names.index(s.section) + 1)
        strtab += s.name.encode() + b"\0"
    shstr = bytearray(b"\0")
    all_names = [*names, ".symtab", ".strtab", ".shstrtab"]
    name_off = []
    for n in all_names:
        name_off.append(len(shstr))
        shstr += n.encode() + b"\0"

    phoff = 52
    pos = phoff + 32 * len(sections)
    body = bytearray()
    offsets: list[int] = []
    blobs = [s[2] for s in sections] + [bytes(symtab), bytes(strtab), bytes(shstr)]
    for blob in [*blobs, b""]:  # each 4-byte aligned; the section headers after them (b"")
        body += b"\0" * ((-(pos + len(body))) % 4)
        offsets.append(pos + len(body))
        body += blob
    shoff = offsets.pop()

    phdrs = bytearray()
    for (_n, addr, data, flags), off in zip(sections, offsets, strict=False):
        pflags = 4 | (2 if flags & SHF_WRITE else 0) | (1 if flags & SHF_EXECINSTR else 0)
        phdrs += struct.pack("<IIIIIIII", PT_LOAD, off, addr, addr, len(data), len(data), pflags, 4)
    shdrs = bytearray(b"\0" * 40)
    for i, (_n, addr, data, flags) in enumerate(sections):
        shdrs += struct.pack("<IIIIIIIIII", name_off[i], SHT_PROGBITS, flags, addr, offsets[i], len(data),
                             0, 0, 4, 0)  # fmt: skip
    k = len(sections)
    strtab_index = k + 2
    shdrs += struct.pack("<IIIIIIIIII", name_off[k], SHT_SYMTAB, 0, 0, offsets[k], len(symtab),
                         strtab_index, 1, 4, 16)  # fmt: skip
    for j, blob in ((k + 1, bytes(strtab)), (k + 2, bytes(shstr))):
        shdrs += struct.pack("<IIIIIIIIII", name_off[j], SHT_STRTAB, 0, 0, offsets[j], len(blob), 0, 0, 1, 0)
    ident = b"\x7fELF" + bytes((1, 1, 1, 0)) + b"\0" * 8
    machine, flags = _MACHINE[chip.arch]
    header = ident + struct.pack("<HHIIIII", ET_EXEC, machine, 1, entry, phoff, shoff, flags)
    # header, program header and section header sizes, their counts; .shstrtab is the last section
    header += struct.pack("<HHHHHH", 52, 32, len(sections), 40, len(all_names) + 1, len(all_names))
    return header + bytes(phdrs) + bytes(body) + bytes(shdrs)
