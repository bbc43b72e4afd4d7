"""Hardware layer: serial ports, esptool flashing, console capture, crash classification.

Its public surface, re-exported here (each loaded on first use): docs/device.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.analysis.classify import Finding, Severity, classify, exit_code_for
    from harness.device.console import RawCapture, capture_run
    from harness.device.flash import FlashFailure, FlashProgress, FlashResult, RegionResult, flash_artifacts
    from harness.device.ports import PortSpec, TransportCaps, open_port, resolve_port
    from harness.device.session import DeviceSession

# name -> defining module, imported on first use: importing one submodule (device.serialpkg for
# `esp-check bench check-serial`) must not load pyserial and esptool through this package.
_HOME = {
    **dict.fromkeys(("Finding", "Severity", "classify", "exit_code_for"), "harness.analysis.classify"),
    **dict.fromkeys(("RawCapture", "capture_run"), "harness.device.console"),
    **dict.fromkeys(
        ("FlashFailure", "FlashProgress", "FlashResult", "RegionResult", "flash_artifacts"),
        "harness.device.flash",
    ),
    **dict.fromkeys(("PortSpec", "TransportCaps", "open_port", "resolve_port"), "harness.device.ports"),
    "DeviceSession": "harness.device.session",
}


def __getattr__(name: str) -> object:
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DeviceSession",
    "Finding",
    "FlashFailure",
    "FlashProgress",
    "FlashResult",
    "PortSpec",
    "RawCapture",
    "RegionResult",
    "Severity",
    "TransportCaps",
    "capture_run",
    "classify",
    "exit_code_for",
    "flash_artifacts",
    "open_port",
    "resolve_port",
]
