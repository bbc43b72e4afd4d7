"""Reset sequences by board reset style, on top of esp-pylib's DTR/RTS primitives (the same pulse
trains esptool and idf.py monitor use).

The two styles (``Board.reset``: ``classic``, ``usb_serial_jtag``): docs/device.md, "Ports and transports".
"""

from __future__ import annotations

import serial
from esp_pylib.serial_reset import (
    classic_bootloader_reset,
    hard_reset,
    set_dtr,
    usb_jtag_bootloader_reset,
)

RESET_STYLES = ("classic", "usb_serial_jtag")


def _check(style: str) -> None:
    if style not in RESET_STYLES:
        raise ValueError(f"unknown reset style {style!r} (expected one of {', '.join(RESET_STYLES)})")


def hard_reset_into_app(port: serial.SerialBase, style: str = "classic") -> None:
    """Restart the chip so it boots the flashed app (IO0 high while EN is pulsed).

    On ``usb_serial_jtag`` the port is expected to vanish afterwards; callers reopen it.
    """
    _check(style)
    set_dtr(port, False)  # IO0 high: boot from flash
    if style == "usb_serial_jtag":
        # The peripheral resets the chip on RTS; hold it longer so the host sees the detach.
        hard_reset(port, hold_delay=0.2, post_release_delay=0.0)
    else:
        hard_reset(port, hold_delay=0.1, post_release_delay=0.0)


def bootloader_reset(port: serial.SerialBase, style: str = "classic") -> None:
    """Reset into the ROM download mode (what esptool's connect does), for transports where esptool
    cannot run its own ioctl-based sequence (e.g. the simulator's URL handler)."""
    _check(style)
    if style == "usb_serial_jtag":
        usb_jtag_bootloader_reset(port)
    else:
        classic_bootloader_reset(port, enter_boot_delay=0.1, reset_delay=0.05)
    # both sequences end with DTR and RTS inactive ("run"), so a later close/open does not glitch EN
