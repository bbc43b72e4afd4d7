"""Reset sequences by board reset style, on top of esp-pylib's DTR/RTS primitives (the same pulse
trains esptool and idf.py monitor use).

Two styles (``Board.reset``):

- ``classic``: the DevKit auto-reset circuit (two transistors): RTS drives EN, DTR drives IO0,
  and equal DTR/RTS means "run". Hard reset into the app = pulse RTS (EN low) with DTR inactive
  (IO0 high, so the chip boots from flash). Bootloader reset = EN low, then release EN while
  IO0 is held low.
- ``usb_serial_jtag``: the chip's own USB-Serial-JTAG peripheral interprets DTR/RTS itself; a
  reset makes the USB device drop off the bus and re-enumerate (the open handle dies), and the
  ROM reports ``rst:0x15 (USB_UART_CHIP_RESET)``.
"""

from __future__ import annotations

import serial
from esp_pylib.serial_reset import (
    classic_bootloader_reset,
    hard_reset,
    set_dtr,
    usb_jtag_bootloader_reset,
)

__all__ = ["RESET_STYLES", "bootloader_reset", "hard_reset_into_app"]

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
