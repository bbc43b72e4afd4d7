"""pyserial URL handler ``sim://NAME?...``: a serial port wired to a simulated board.

pyserial finds this module as ``<package>.protocol_sim`` once :func:`harness.sim.register` ran; the
port has no file descriptor, so esptool resets it with DTR/RTS writes (docs/simulator.md "Reset styles").
"""

from __future__ import annotations

from serial.serialutil import PortNotOpenError, SerialException

from harness.errors import UsageError
from harness.inprocess import InProcessPort
from harness.sim.board import SimBoard, get_board, parse_url


class Serial(InProcessPort):
    """A pyserial port whose other end is a :class:`harness.sim.board.SimBoard`."""

    SCHEME = "sim"

    def __init__(self, *args: object, **kwargs: object) -> None:
        self._board: SimBoard | None = None
        self._conn = 0
        super().__init__(*args, **kwargs)

    # ---- lifecycle -----------------------------------------------------------------------------

    def open(self) -> None:
        url = self._url_to_open()
        try:
            board = get_board(*parse_url(url))
        except UsageError as exc:
            raise SerialException(f"could not open {url!r} (form: sim://NAME[?options]): {exc}") from None
        self._conn = board.attach(bool(self._exclusive))
        self._board = board
        self.is_open = True
        self._reconfigure_port()
        if not self._dsrdtr and not self._rtscts:
            board.set_lines(self._conn, bool(self._dtr_state), bool(self._rts_state))

    def close(self) -> None:
        if self.is_open and self._board is not None:
            self._board.detach(self._conn)
        self.is_open = False

    def _reconfigure_port(self) -> None:
        """Tell the board the host UART's new rate: what was received before stays as received."""
        if self.is_open and self._board is not None:
            self._board.set_port_baud(self._conn, int(self._baudrate))

    def _live(self) -> SimBoard:
        if not self.is_open or self._board is None:
            raise PortNotOpenError()
        return self._board

    # ---- data ----------------------------------------------------------------------------------

    @property
    def in_waiting(self) -> int:
        return self._live().in_waiting(self._conn)

    def read(self, size: int = 1) -> bytes:
        board = self._live()
        if size <= 0:
            return b""
        return board.read(self._conn, size, self._timeout, int(self._baudrate))

    def write(self, data: bytes | bytearray | memoryview) -> int:
        board = self._live()
        raw = bytes(data)
        board.write(self._conn, raw, int(self._baudrate))
        return len(raw)

    def reset_input_buffer(self) -> None:
        self._live().discard_input(self._conn)

    def _update_rts_state(self) -> None:
        self._live().set_lines(self._conn, bool(self._dtr_state), bool(self._rts_state))

    _update_dtr_state = _update_rts_state  # the board takes both lines at once

    @property
    def board(self) -> SimBoard:
        """The simulated board behind this port (for tests and `esp-check sim serve`)."""
        return self._live()
