"""Crash addresses -> functions, with the app's ELF, the way ``idf.py monitor`` decodes them.

The decoding itself is Espressif's ``esp-idf-panic-decoder`` (``PcAddressDecoder``); ``addr2line`` comes
with the toolchain, not from PyPI, and is looked for where docs/device.md says (the paragraph on
``find_addr2line``). When no ELF or no ``addr2line`` is found, the finding says that decoding was skipped
and why.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from harness.analysis.classify import Finding, Severity
from harness.chips import CHIPS, arch_of

TOOLCHAIN_ENV = "ESP_CHECK_TOOLCHAIN_PREFIX"  # e.g. /opt/esp/riscv32-esp-elf/bin/riscv32-esp-elf-
_RISCV_PREFIXES = ("riscv32-esp-elf-",)  # a chip not in harness.chips: every newer ESP chip is RISC-V
_GENERIC_RISCV = ("riscv64-unknown-elf-", "riscv32-unknown-elf-", "riscv64-linux-gnu-")
_PIO_PACKAGES = ("toolchain-xtensa-esp-elf", "toolchain-xtensa-esp32", "toolchain-xtensa-esp32s2",
                 "toolchain-xtensa-esp32s3", "toolchain-riscv32-esp")  # fmt: skip
# ESP-IDF's tool directories are named as the toolchain prefixes the chip table gives
_IDF_TOOLS = sorted({prefix.rstrip("-") for chip in CHIPS.values() for prefix in chip.toolchain_prefixes})
_BFD_TARGET = {"xtensa": "elf32-xtensa-le", "riscv": "elf32-littleriscv"}


@dataclasses.dataclass(frozen=True)
class Toolchain:
    """An ``addr2line`` found for a chip: ``prefix`` + "addr2line" is the command."""

    prefix: str
    source: str  # where it was found (env, PATH, PlatformIO, ESP-IDF tools, generic RISC-V binutils)


def _own_prefixes(chip: str) -> tuple[str, ...]:
    """The chip's own toolchain prefixes, looked for on PATH and where PlatformIO / ESP-IDF put them."""
    return CHIPS[chip].toolchain_prefixes if chip in CHIPS else _RISCV_PREFIXES


def _candidates(chip: str, env: Mapping[str, str]) -> list[tuple[str, str]]:
    """(prefix, source) in search order; a prefix may be a bare name (looked up on PATH) or a path."""
    own = _own_prefixes(chip)
    out: list[tuple[str, str]] = [(p, "PATH") for p in own]
    core = Path(env.get("PLATFORMIO_CORE_DIR") or Path.home() / ".platformio")
    for pkg in _PIO_PACKAGES:
        out += [(str(core / "packages" / pkg / "bin" / p), f"PlatformIO {pkg}") for p in own]
    tools = Path(env.get("IDF_TOOLS_PATH") or Path.home() / ".espressif") / "tools"
    for tool in _IDF_TOOLS:
        for version_dir in sorted((tools / tool).glob("*"), reverse=True):
            out += [(str(version_dir / tool / "bin" / p), f"ESP-IDF tools {tool}") for p in own]
    if arch_of(chip) == "riscv":
        out += [(p, "generic RISC-V binutils") for p in _GENERIC_RISCV]
    out.append(("", "binutils addr2line (multi-target)"))
    return out


@functools.lru_cache(maxsize=32)
def _supports(exe: str, target: str) -> bool:
    """Whether a (host or multiarch) addr2line's BFD reads ``target`` ELF files."""
    try:
        proc = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return target in proc.stdout


def find_addr2line(chip: str, env: Mapping[str, str] | None = None) -> tuple[Toolchain | None, str]:
    """The toolchain to decode ``chip``'s addresses with, or (None, why not)."""
    env = os.environ if env is None else env
    explicit = env.get(TOOLCHAIN_ENV)
    if explicit:
        found = shutil.which(explicit + "addr2line", path=env.get("PATH"))
        if found is not None:
            return Toolchain(explicit, TOOLCHAIN_ENV), ""
        return None, f"{TOOLCHAIN_ENV}={explicit} but {explicit}addr2line does not exist"
    for prefix, source in _candidates(chip, env):
        exe: str | None = shutil.which(prefix + "addr2line", path=env.get("PATH"))
        if exe is None:
            continue
        if source.startswith("binutils") and not _supports(exe, _BFD_TARGET[arch_of(chip)]):
            continue
        return Toolchain(prefix, source), ""
    own = _own_prefixes(chip)[0]
    why = (
        f"no {own}addr2line found (it comes with ESP-IDF or PlatformIO's toolchain, not with pip): "
        f"put its bin directory on PATH or set {TOOLCHAIN_ENV}"
    )
    if arch_of(chip) == "riscv":
        why += "; a generic RISC-V binutils (Debian: binutils-riscv64-unknown-elf) works too"
    return None, why


def addresses(details: Mapping[str, object]) -> list[str]:
    """The code addresses a crash finding names, innermost first: MEPC and RA (RISC-V), the backtrace's
    PCs (Xtensa), then the PC the headline names (e.g. the caller of abort())."""
    out: list[str] = []
    for key in ("mepc", "ra"):
        value = details.get(key)
        if isinstance(value, str):
            out.append(value.lower())
    backtrace = details.get("backtrace")
    for pair in backtrace if isinstance(backtrace, (list, tuple)) else ():
        if isinstance(pair, (list, tuple)) and pair:
            out.append(str(pair[0]).lower())
    pc = details.get("pc")
    if isinstance(pc, str):
        out.append(pc.lower())
    return list(dict.fromkeys(out))  # first occurrence of each, in order


def decode(elf: Path, toolchain: Toolchain, addrs: Sequence[str]) -> list[dict[str, str]]:
    """Each address esp-idf-panic-decoder could place: address, function, file, line."""
    # lazy: pulls pdb and pyelftools (~25 ms); only a crash is decoded, a clean run never is
    from esp_idf_panic_decoder import PcAddressDecoder

    decoder = PcAddressDecoder(toolchain.prefix, str(elf))
    return [
        {"address": addr, "function": trace[0].func, "file": trace[0].path, "line": trace[0].line}
        for addr, trace in decoder.translate_addresses(" ".join(addrs))
    ]


def decode_findings(
    findings: Sequence[Finding], elf: Path | None, chip: str, env: Mapping[str, str] | None = None
) -> list[Finding]:
    """Findings with ``details["decoded"]`` (frames) and ``details["decode"]`` (what was done and, when
    decoding was skipped, why) for every crash finding that names code addresses."""
    todo = [f for f in findings if f.severity == Severity.FIRMWARE_FAULT and addresses(f.details)]
    if not todo:
        return list(findings)
    toolchain, why = None, "the build left no ELF file (symbols) to decode with"
    if elf is not None and Path(elf).is_file():
        toolchain, why = find_addr2line(chip, env)
    out: list[Finding] = []
    for f in findings:
        if f not in todo:
            out.append(f)
            continue
        details = dict(f.details)
        if toolchain is not None and elf is not None:
            try:
                frames = decode(Path(elf), toolchain, addresses(f.details))
                details["decoded"] = frames
                details["decode"] = {
                    "status": "decoded" if frames else "no_match",
                    "elf": str(elf),
                    "addr2line": toolchain.prefix + "addr2line",
                    "source": toolchain.source,
                }
            except Exception as exc:  # a broken toolchain must not hide the finding itself
                details["decode"] = {"status": "skipped", "why": f"{toolchain.prefix}addr2line failed: {exc}"}
        else:
            details["decode"] = {"status": "skipped", "why": why}
        out.append(dataclasses.replace(f, details=details))
    return out


def describe(details: Mapping[str, object]) -> str | None:
    """One line for a terminal: the decoded call chain, or why it was not decoded."""
    decode_info = details.get("decode")
    if not isinstance(decode_info, Mapping):
        return None
    frames = details.get("decoded")
    if isinstance(frames, list) and frames:
        return "backtrace: " + " <- ".join(
            str(fr.get("function")) for fr in frames[:8] if isinstance(fr, Mapping)
        )
    if decode_info.get("status") == "skipped":
        return f"backtrace not decoded: {decode_info.get('why')}"
    return "backtrace: no address is in the ELF's code (another build's report?)"
