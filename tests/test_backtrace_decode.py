"""Crash findings decoded with the app's ELF by esp-idf-panic-decoder, as idf.py monitor does it.

Real: esp-idf-panic-decoder (PyPI), pyelftools, Debian's RISC-V binutils (`binutils-riscv64-unknown-elf`:
as, ld, addr2line; .ci/run installs it) and the ELFs they read: one assembled and linked here with
line information, and the simulator's own app ELF. Faked: the crash text's source (written here in
ESP-IDF's RISC-V panic shape, or printed by the simulated board). Xtensa: Debian has no Xtensa
toolchain, so Xtensa decoding runs only where one is installed (the test says so when it skips).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from sim_helpers import make_project

from harness.analysis.classify import classify
from harness.firmware import backtrace as bt
from harness.sim.chips import get_chip
from harness.sim.crash import panic_text
from harness.sim.image import build_sim_firmware

RISCV_TOOLS = ("riscv64-unknown-elf-as", "riscv64-unknown-elf-ld", "riscv64-unknown-elf-addr2line")
NO_RISCV = (
    "Debian's RISC-V binutils are not installed (apt-get install binutils-riscv64-unknown-elf; "
    ".ci/run installs them)"
)
needs_riscv = pytest.mark.skipif(not all(shutil.which(t) for t in RISCV_TOOLS), reason=NO_RISCV)

CRASH_S = """\
    .text
    .globl conv_kernel
    .type conv_kernel, @function
conv_kernel:
    addi sp, sp, -16
    .globl fault_site
fault_site:
    lw a0, 0(zero)
    addi sp, sp, 16
    ret
    .size conv_kernel, .-conv_kernel
    .globl app_main
    .type app_main, @function
app_main:
    addi sp, sp, -16
    call conv_kernel
    .globl return_site
return_site:
    addi sp, sp, 16
    ret
    .size app_main, .-app_main
"""


def _sim_elf(files: list) -> Path:
    """The ELF the sim builder left beside the app (the model partition's image comes last in the list)."""
    return next(p for _, p in files if p.name == "esp-check-sim.bin").with_suffix(".elf")


def _riscv_report(mepc: int, ra: int) -> str:
    """A crash report in ESP-IDF's RISC-V shape (ESP32-C3), our own values."""
    rows = [f"MEPC    : 0x{mepc:08x}  RA      : 0x{ra:08x}  SP      : 0x3fc8f7a0  GP      : 0x3fc8b400",
            "TP      : 0x3fc8f7f0  T0      : 0x4005890e  T1      : 0x3fc8f51c  T2      : 0x00000000",
            "MSTATUS : 0x00001881  MTVEC   : 0x40380001  MCAUSE  : 0x00000005  MTVAL   : 0x00000000",
            "MHARTID : 0x00000000"]  # fmt: skip
    return "\r\n".join(
        ["Guru Meditation Error: Core  0 panic'ed (Load access fault). Exception was unhandled.", "",
         "Core  0 register dump:", *rows, "", "Stack memory:",
         "3fc8f7a0: 0x00000000 0x00000000 0x3fc8f7d0 0x42000034 0x00000000 0x00000000 0x00000000 0x00000000",
         "", "ELF file SHA256: 0123456789abcdef", "", "Rebooting...", ""]
    )  # fmt: skip


@pytest.fixture(scope="module")
def riscv_elf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not all(shutil.which(t) for t in RISCV_TOOLS):
        pytest.skip(NO_RISCV)
    d = tmp_path_factory.mktemp("rv")
    (d / "crash.S").write_text(CRASH_S)
    asm = ["riscv64-unknown-elf-as", "-march=rv32imc", "-mabi=ilp32", "-g", "crash.S", "-o", "crash.o"]
    subprocess.run(asm, cwd=d, check=True, timeout=60)
    subprocess.run(["riscv64-unknown-elf-ld", "-m", "elf32lriscv", "-Ttext=0x42000020", "-e", "app_main",
                    "crash.o", "-o", "app.elf"], cwd=d, check=True, timeout=60)  # fmt: skip
    return d / "app.elf"


def _symbol(elf: Path, name: str) -> int:
    from elftools.elf.elffile import ELFFile

    with elf.open("rb") as f:
        table = ELFFile(f).get_section_by_name(".symtab")
        return int(next(s for s in table.iter_symbols() if s.name == name)["st_value"])


def _bare_env(tmp_path: Path, path: str = "") -> dict[str, str]:
    """No toolchain anywhere: an empty PATH, PlatformIO and ESP-IDF tool directories that hold nothing."""
    return {"PATH": path or str(tmp_path / "empty-bin"), "PLATFORMIO_CORE_DIR": str(tmp_path / "pio"),
            "IDF_TOOLS_PATH": str(tmp_path / "espressif")}  # fmt: skip


@needs_riscv
def test_riscv_crash_is_decoded_to_function_file_and_line(riscv_elf: Path) -> None:
    fault, ret = _symbol(riscv_elf, "fault_site"), _symbol(riscv_elf, "return_site")
    text = _riscv_report(fault, ret)  # MEPC: the faulting load; RA: the return address after the call
    findings = bt.decode_findings(classify(text), riscv_elf, "esp32c3")
    (panic,) = [f for f in findings if f.kind == "panic"]
    assert panic.details["decode"]["status"] == "decoded"
    assert panic.details["decode"]["source"] == "generic RISC-V binutils"
    frames = panic.details["decoded"]
    assert [f["function"] for f in frames] == ["conv_kernel", "app_main"]
    assert frames[0]["file"].endswith("crash.S") and frames[0]["line"] == "8"  # the lw
    assert frames[1]["line"] == "19"  # the line after the call: addr2line of a return address
    assert bt.describe(panic.details) == "backtrace: conv_kernel <- app_main"


@needs_riscv
@pytest.mark.parametrize("kind", ["panic", "abort"])
def test_simulated_c3_crash_decodes_with_the_sim_elf(tmp_path: Path, models_dir: Path, kind: str) -> None:
    """The simulator's crash addresses are functions of the ELF its build wrote: a decoder names them."""
    x = np.load(models_dir / "inputs" / "op_zoo.q.npy")
    proj = make_project(tmp_path / "p", models_dir / "op_zoo.tflite", [x], chip="esp32c3",
                        variant="optimized")  # fmt: skip
    files = build_sim_firmware(proj, tmp_path / "b")
    elf = _sim_elf(files)
    text = panic_text(get_chip("esp32c3"), kind, variant="optimized").decode()
    (crash,) = [f for f in bt.decode_findings(classify(text), elf, "esp32c3") if f.kind == kind]
    names = [fr["function"] for fr in crash.details["decoded"]]
    if kind == "panic":
        eval_fn = "tflite::(anonymous namespace)::Eval(TfLiteContext*, TfLiteNode*)"  # demangled
        assert names == ["esp_nn_conv_s8_ansi", eval_fn]
    else:  # MEPC in panic_abort (IRAM), RA in esp_system_abort
        assert names[:2] == ["panic_abort", "esp_system_abort"]


@needs_riscv
def test_toolchain_is_found_where_platformio_installs_it(tmp_path: Path, riscv_elf: Path) -> None:
    """PlatformIO's toolchain-riscv32-esp package (here: Debian's addr2line under that name) is found
    first, before generic binutils on PATH."""
    real = shutil.which("riscv64-unknown-elf-addr2line")
    assert real is not None
    pkg_bin = tmp_path / "pio" / "packages" / "toolchain-riscv32-esp" / "bin"
    pkg_bin.mkdir(parents=True)
    (pkg_bin / "riscv32-esp-elf-addr2line").symlink_to(real)
    env = _bare_env(tmp_path, path=os.path.dirname(real))
    tc, why = bt.find_addr2line("esp32c3", env)
    assert tc is not None and tc.source == "PlatformIO toolchain-riscv32-esp", why
    kernel = _symbol(riscv_elf, "conv_kernel")
    (panic,) = bt.decode_findings(classify(_riscv_report(kernel + 2, kernel + 4)), riscv_elf, "esp32c3", env)
    assert panic.details["decoded"][0]["function"] == "conv_kernel"


def test_no_addr2line_means_the_finding_says_decoding_was_skipped_and_why(
    tmp_path: Path, models_dir: Path
) -> None:
    x = np.load(models_dir / "inputs" / "op_zoo.q.npy")
    proj = make_project(tmp_path / "p", models_dir / "op_zoo.tflite", [x], chip="esp32s3")
    elf = _sim_elf(build_sim_firmware(proj, tmp_path / "b"))
    text = panic_text(get_chip("esp32s3"), "panic").decode()
    (panic,) = bt.decode_findings(classify(text), elf, "esp32s3", _bare_env(tmp_path))
    decode = panic.details["decode"]
    assert decode["status"] == "skipped" and "decoded" not in panic.details
    assert "xtensa-esp32s3-elf-addr2line" in decode["why"] and bt.TOOLCHAIN_ENV in decode["why"]
    line = bt.describe(panic.details) or ""
    assert line.startswith("backtrace not decoded: no xtensa-esp32s3-elf-addr2line")
    (no_elf,) = bt.decode_findings(classify(text), None, "esp32s3")
    why = "the build left no ELF file (symbols) to decode with"
    assert no_elf.details["decode"] == {"status": "skipped", "why": why}
    (c3,) = bt.decode_findings(
        classify(panic_text(get_chip("esp32c3"), "panic").decode()), elf, "esp32c3",
        _bare_env(tmp_path),
    )  # fmt: skip
    assert "binutils-riscv64-unknown-elf" in c3.details["decode"]["why"]  # RISC-V: what also works
    # findings without code addresses are left alone
    assert bt.decode_findings(classify("Brownout detector was triggered\r\n"), elf, "esp32s3")[0].details.get(
        "decode") is None  # fmt: skip


def test_xtensa_backtrace_decodes_where_a_toolchain_exists(tmp_path: Path, models_dir: Path) -> None:
    tc, why = bt.find_addr2line("esp32s3")
    if tc is None:
        pytest.skip("no Xtensa addr2line here: Debian packages no Xtensa toolchain (ESP-IDF's installer or "
                    f"PlatformIO's toolchain-xtensa-esp-elf provide one) ({why})")  # fmt: skip
    x = np.load(models_dir / "inputs" / "op_zoo.q.npy")
    proj = make_project(tmp_path / "p", models_dir / "op_zoo.tflite", [x], chip="esp32s3",
                        variant="optimized")  # fmt: skip
    elf = _sim_elf(build_sim_firmware(proj, tmp_path / "b"))
    text = panic_text(get_chip("esp32s3"), "panic", variant="optimized").decode()
    (panic,) = bt.decode_findings(classify(text), elf, "esp32s3")
    assert panic.details["decoded"][0]["function"] == "esp_nn_conv_s8_esp32s3"


def _itanium_names_are_well_formed(name: str) -> bool:
    """A Python check of a nested Itanium name (`_ZN` <len><id>... `E`): every length prefix is the length
    of the identifier that follows (what c++filt needs to demangle it)."""
    import re as _re

    if not name.startswith("_ZN"):
        return True
    pos = 3
    while pos < len(name) and name[pos] != "E":
        m = _re.match(r"\d+", name[pos:])
        if m is None:
            return False
        n, pos = int(m.group()), pos + len(m.group())
        ident = name[pos : pos + n]
        if len(ident) != n or not _re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", ident):
            return False
        pos += n
        if name[pos : pos + 1].isalpha() and name[pos] != "E":
            return False  # the identifier ran on: its length prefix was too short
    return pos < len(name)


@pytest.mark.parametrize("chip", ["esp32", "esp32s3", "esp32c3"])
def test_every_mangled_symbol_of_the_sim_elf_demangles(chip: str) -> None:
    """Every C++ symbol of the simulator's ELF demangles, with c++filt (binutils) when installed and by
    its length prefixes always: the old `_ZN6tflite10MicroGraph15InvokeSubgraphEi` (a 14-letter name with
    a 15 prefix) stayed raw in every decoded backtrace."""
    from harness.sim import elf

    names = [s.name for s in elf.layout(get_chip(chip)) if s.name.startswith("_Z")]
    assert "_ZN6tflite10MicroGraph14InvokeSubgraphEi" in names
    bad = [n for n in names if not _itanium_names_are_well_formed(n)]
    assert not bad, bad
    cxxfilt = shutil.which("c++filt")
    if cxxfilt is not None:
        out = subprocess.run([cxxfilt, *names], capture_output=True, text=True, check=True).stdout.split("\n")
        raw = [n for n, d in zip(names, out, strict=False) if d == n]
        assert not raw, f"c++filt left these raw: {raw}"
