"""Flashing a native board (``native://``): install the built host program instead of running esptool.

The native target (docs/native.md) has no ROM loader: its "flash" is copying the program into the
port (:meth:`harness.device.protocol_native.Serial.install`). The result has the shape of an esptool
flash so reports and the flows treat both alike, and says what it was.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from pathlib import Path

import serial

from harness.device.flash import FlashFailure, FlashResult, RegionResult
from harness.device.protocol_native import Serial as NativeSerial

__all__ = ["install_program"]


def install_program(
    port: serial.SerialBase, artifacts: Sequence[tuple[int, Path | str]], *, log_path: Path | None = None
) -> FlashResult:
    """Install the one program of a native build on the native board behind ``port``."""
    t0 = time.monotonic()
    if not isinstance(port, NativeSerial):
        raise FlashFailure(
            "a native build can only be installed on a native:// port", kind="usage", retryable=False,
            hint="use the native board's port (omit --port, or give native://NAME)",
        )  # fmt: skip
    if len(artifacts) != 1:
        raise FlashFailure(
            f"a native build is one program, got {len(artifacts)} files", kind="usage", retryable=False,
            hint="build the project with the native builder",
        )  # fmt: skip
    offset, path = artifacts[0]
    program = Path(path)
    try:
        size, sha = port.install(program)
    except OSError as exc:
        raise FlashFailure(
            f"cannot install {program} on native board {port.name}: {exc.strerror or exc}",
            kind="usage", retryable=False, hint="rebuild the project",
        ) from exc  # fmt: skip
    seconds = time.monotonic() - t0
    line = f"native: installed {program.name} ({size} bytes, sha256 {sha}) on native://{port.name}\n"
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(line, encoding="utf-8")
    md5 = hashlib.md5(program.read_bytes(), usedforsecurity=False).hexdigest()
    region = RegionResult(offset, program, size, md5, bytes_written=size, seconds=seconds, verified=True)
    return FlashResult(
        port=f"native://{port.name}",
        chip="native",
        chip_name="host program",
        description="native board: the firmware built for this PC, run as a program",
        revision=None,
        features=[],
        mac=None,
        crystal_mhz=None,
        flash_size=None,
        stub=False,
        baud=0,
        before="none",
        after="none",
        connect_attempts=0,
        regions=[region],
        duration_s=seconds,
        log_path=log_path,
        esptool_log=line,
        serial=port,
    )
