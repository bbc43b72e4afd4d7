"""The host toolchain of a native build: compilers, word size, sanitizers, CMake and its generator.

Everything here that changes the program (compiler identity, flags) goes into the build's cache
key through :meth:`Toolchain.identity`. A toolchain is checked before a 12-minute build starts: a
32-bit or sanitizer build that cannot even link ``int main(){}`` fails at once with a hint.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import BuildError

SANITIZERS = ("address", "undefined")
BITS = (32, 64)


@dataclass(frozen=True)
class Toolchain:
    """Host compilers and the flags every source of one native build gets."""

    cc: str
    cxx: str
    cmake: str
    generator: str  # "Ninja" or "Unix Makefiles"
    version: str  # first line of `cc --version` / `c++ --version`
    machine: str  # `cc -dumpmachine`, e.g. x86_64-linux-gnu
    bits: int
    sanitize: tuple[str, ...] = ()

    @property
    def common_flags(self) -> list[str]:
        """Flags for C and C++ compiles and for the link (word size, optimization, sanitizers)."""
        flags = [f"-m{self.bits}", "-O2"]  # -O2: CONFIG_COMPILER_OPTIMIZATION_PERF, as on the device
        if self.sanitize:
            flags += [
                f"-fsanitize={','.join(self.sanitize)}",
                # left-shifting a negative value is undefined in ISO C but defined by GCC, the compiler
                # that builds the firmware for the chips (two's complement; esp-nn relies on it in its
                # requantization and add kernels): not a finding. Shift exponents stay checked.
                "-fno-sanitize=shift-base",
                "-fno-sanitize-recover=all",
                "-fno-omit-frame-pointer",
                "-g",
            ]
        return flags

    @property
    def cxx_flags(self) -> list[str]:
        # ESP-IDF's defaults (CONFIG_COMPILER_CXX_EXCEPTIONS / _RTTI off); components add their own.
        return [*self.common_flags, "-fno-exceptions", "-fno-rtti"]

    @property
    def sanitize_label(self) -> str:
        return "+".join(self.sanitize) if self.sanitize else "none"

    def identity(self) -> dict[str, Any]:
        """What changes the program: part of every native cache key."""
        return {
            "cc": self.cc,
            "cxx": self.cxx,
            "version": self.version,
            "machine": self.machine,
            "generator": self.generator,
            "c_flags": self.common_flags,
            "cxx_flags": self.cxx_flags,
        }


def _first_line(argv: list[str], env: Mapping[str, str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=dict(env), check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"cannot run {argv[0]}: {exc}", hint="check the host compiler installation") from exc
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else ""


def _which(name: str, env: Mapping[str, str]) -> str | None:
    return shutil.which(name, path=env.get("PATH"))


def find_toolchain(bits: int = 64, sanitize: bool = False, env: Mapping[str, str] | None = None) -> Toolchain:
    """The host's C/C++ compilers (``CC``/``CXX`` or cc/c++), CMake and Ninja/Make, checked to link a
    program with these flags. BuildError (exit 3) naming what is missing and how to install it."""
    e = dict(os.environ if env is None else env)
    if bits not in BITS:
        raise BuildError(f"native builds are 32- or 64-bit, not {bits}-bit", hint="use bits = 32 or 64")
    cc = _which(e.get("CC") or "cc", e) or _which("gcc", e) or _which("clang", e)
    cxx = _which(e.get("CXX") or "c++", e) or _which("g++", e) or _which("clang++", e)
    if cc is None or cxx is None:
        raise BuildError(
            "no host C/C++ compiler found for the native target (cc / c++, or CC / CXX)",
            hint="install one (Debian/Ubuntu: apt install build-essential; macOS: xcode-select --install)",
        )
    cmake = _which("cmake", e)
    if cmake is None:
        raise BuildError(
            "CMake is not installed: the native target builds the components' own CMakeLists.txt",
            hint="install CMake 3.16 or newer (apt install cmake, or pip install cmake)",
        )
    generator = "Ninja" if _which("ninja", e) else "Unix Makefiles"
    if generator == "Unix Makefiles" and _which("make", e) is None:
        raise BuildError("neither ninja nor make is installed", hint="apt install ninja-build (or make)")
    tc = Toolchain(
        cc=cc,
        cxx=cxx,
        cmake=cmake,
        generator=generator,
        version=f"{_first_line([cc, '--version'], e)} / {_first_line([cxx, '--version'], e)}",
        # the triple becomes a C string literal (INFO native=): keep it to [A-Za-z0-9._-]
        machine=re.sub(r"[^A-Za-z0-9._-]", "_", _first_line([cc, "-dumpmachine"], e)) or "unknown",
        bits=bits,
        sanitize=SANITIZERS if sanitize else (),
    )
    problem = _probe(tc.cxx, tuple(tc.cxx_flags), tuple(sorted(e.items())))
    if problem:
        raise BuildError(
            f"the host C++ compiler cannot build a {bits}-bit"
            f"{' sanitizer' if sanitize else ''} program ({' '.join(tc.cxx_flags)}):\n  {problem}",
            hint=_probe_hint(bits, sanitize),
        )
    return tc


def _probe_hint(bits: int, sanitize: bool) -> str:
    if bits == 32:
        return (
            "32-bit builds need the multilib toolchain (Debian/Ubuntu: apt install gcc-multilib "
            "g++-multilib); on hosts without -m32 use the 64-bit native board"
        )
    if sanitize:
        return "install the sanitizer runtimes (Debian/Ubuntu: libasan / libubsan, part of gcc)"
    return "check the host compiler installation"


@functools.lru_cache(maxsize=16)
def _probe(cxx: str, flags: tuple[str, ...], env_items: tuple[tuple[str, str], ...]) -> str | None:
    """None when ``cxx flags`` compiles and links a trivial program, else the compiler's first error."""
    with tempfile.TemporaryDirectory(prefix="esp-check-probe-") as tmp:
        src = Path(tmp) / "probe.cc"
        src.write_text('#include <cstdio>\nint main() { std::puts("ok"); return 0; }\n', encoding="utf-8")
        try:
            out = subprocess.run(
                [cxx, *flags, str(src), "-o", str(Path(tmp) / "probe")],
                capture_output=True,
                text=True,
                timeout=120,
                env=dict(env_items),
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return str(exc)
        if out.returncode == 0:
            return None
        lines = [ln for ln in (out.stderr or out.stdout).splitlines() if ln.strip()]
        return "\n  ".join(lines[:4]) or f"exit code {out.returncode}"
