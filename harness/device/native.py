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
    """Write a native build's files to the native board behind ``port``, each at its flash offset (a
    bare program at offset 0 alone is installed as it is); regions the board already holds are skipped."""
    t0 = time.monotonic()
    if not isinstance(port, NativeSerial):
        raise FlashFailure(
            "a native build can only be installed on a native:// port", kind="usage",
            hint="use the native board's port (omit --port, or give native://NAME)",
        )  # fmt: skip
    if not artifacts:
        raise FlashFailure("nothing to flash", kind="usage", hint="build the project first")
    regions: list[RegionResult] = []
    lines: list[str] = []
    for offset, path in sorted(artifacts, key=lambda a: a[0]):
        t1 = time.monotonic()
        file = Path(path)
        try:
            if offset == 0 and len(artifacts) == 1:
                size, sha = port.install(file)
                written = size
            else:
                size, sha, written = port.write_region(offset, file)
        except OSError as exc:
            raise FlashFailure(
                f"cannot write {file} at 0x{offset:x} on native board {port.name}: {exc.strerror or exc}",
                kind="usage", hint="rebuild the project",
            ) from exc  # fmt: skip
        what = "the board already holds it: skipped" if written == 0 else "written"
        lines.append(f"native: installed {file.name} at 0x{offset:x} ({size} B, sha256 {sha[:16]}; {what})\n")
        md5 = hashlib.md5(file.read_bytes(), usedforsecurity=False).hexdigest()
        region = RegionResult(offset, file, size, md5, skipped=written == 0, bytes_written=written)
        region.seconds, region.verified = time.monotonic() - t1, True
        regions.append(region)
    seconds = time.monotonic() - t0
    text = "".join(lines) + f"native: native://{port.name} flashed\n"
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(text, encoding="utf-8")
    return FlashResult(
        port=f"native://{port.name}",
        chip="native",
        chip_name="host program",
        description="native board: the firmware built for this PC, run as a program",
        baud=0,
        before="none",
        after="none",
        regions=regions,
        duration_s=seconds,
        log_path=log_path,
        esptool_log=text,
        serial=port,
    )
