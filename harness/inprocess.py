"""Boards that live inside this process behind a pyserial URL: the simulated board (``sim://NAME``,
harness.sim) and the native board (``native://NAME``, harness.device.protocol_native).

Why this is process-wide state, and a board's lifetime in it: docs/simulator.md "Boards and state".
A board holding resources outside the process (the native board's directory) releases them itself
when it is dropped or at exit.
"""

from __future__ import annotations

import errno
import re
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import serial
from serial.serialutil import PortNotOpenError, SerialBase, SerialException

B = TypeVar("B")
# a name users give: a job or a board in a plan or an inventory, a sim://NAME or native://NAME board. Here,
# not beside the user-file models (harness.userfiles), so that opening a port never loads pydantic.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class InProcessBoards:
    """Boards by URL scheme and name (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._boards: dict[tuple[str, str], Any] = {}

    def get(self, scheme: str, name: str, make: Callable[[], B] | None = None) -> tuple[B, bool]:
        """(the board, whether it was made now): ``make()`` builds it on first use; KeyError when the
        board is unknown and there is no ``make``."""
        with self._lock:
            board = self._boards.get((scheme, name))
            if board is not None:
                return board, False
            if make is None:
                raise KeyError(f"{scheme}://{name}")
            board = self._boards[(scheme, name)] = make()
            return board, True

    def remove(self, scheme: str, name: str) -> Any:
        """Forget a board (None when unknown); what it holds is its owner's to release."""
        with self._lock:
            return self._boards.pop((scheme, name), None)

    def register_handlers(self, package: str) -> None:
        """Add ``package`` to pyserial's URL handler packages (idempotent)."""
        with self._lock:
            if package not in serial.protocol_handler_packages:
                serial.protocol_handler_packages.append(package)


class InProcessPort(SerialBase):
    """What the ports of in-process boards share: modem lines that read as a DevKit's USB bridge does (CTS,
    DSR, CD high, RI low), no break, nothing held on the way out, and no file descriptor, so no
    ``TIOCMSET``: esptool then uses its classic DTR/RTS reset, as for a pty or an RFC2217 link."""

    SCHEME = ""  # the URL scheme, for messages

    def _url_to_open(self) -> str:
        """The URL ``open()`` is to open (SerialException when it cannot open now)."""
        if self._port is None:
            raise SerialException("Port must be configured before it can be used.")
        if self.is_open:
            raise SerialException("Port is already open.")
        return str(self._port)

    def _live(self) -> Any:
        if not self.is_open:
            raise PortNotOpenError()
        return None

    # nothing is held on the way out, and a break does nothing: only an open port is checked
    flush = reset_output_buffer = _update_break_state = _live

    def _line(self, level: bool) -> bool:
        self._live()
        return level

    cts = dsr = cd = property(lambda self: self._line(True))  # high, as a DevKit's USB bridge reads them
    ri = property(lambda self: self._line(False))

    def fileno(self) -> int:
        why = f"{self.SCHEME}:// ports have no file descriptor (no modem-control ioctl)"
        raise OSError(errno.ENOTTY, why)


BOARDS = InProcessBoards()  # the one process-wide table (why: the module docstring)
