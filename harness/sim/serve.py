"""Expose a simulated board over TCP, for other processes (``esp-check sim serve``).

Raw TCP and RFC 2217, one client at a time: what each carries, why RFC 2217 runs esptool's resets
locally, and the one change from ``esp_rfc2217_server`` are in docs/simulator.md "Serving a board".
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from dataclasses import dataclass, field

import serial
import serial.rfc2217
from esp_rfc2217_server.esp_port_manager import EspPortManager
from esptool.reset import DEFAULT_RESET_DELAY, ClassicReset

from harness.errors import PortError
from harness.sim import parse_url, register


@dataclass
class SimServer:
    """A listening server for one ``sim://`` URL. ``start()`` returns at once; ``stop()`` ends it."""

    url: str
    host: str = "127.0.0.1"
    port: int = 0
    rfc2217: bool = False
    clients_served: int = 0
    sessions_failed: int = 0  # sessions a client ended abruptly (the server carried on)
    last_error: str | None = None
    _sock: socket.socket | None = None
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _ser: serial.SerialBase | None = None

    @property
    def address(self) -> str:
        """The pyserial URL a client opens."""
        if self.rfc2217:
            # no ?ign_set_control needed: this server answers every control request (see _port_manager)
            return f"rfc2217://{self.host}:{self.port}"
        return f"socket://{self.host}:{self.port}"

    def start(self) -> SimServer:
        register()
        try:
            ser = serial.serial_for_url(self.url, do_not_open=True, exclusive=True)
            ser.timeout = 0.05
            ser.dtr = False  # no client yet: leave the reset circuit alone
            ser.rts = False
            ser.open()
        except serial.SerialException as exc:
            raise PortError(f"cannot open {self.url}: {exc}", hint="check the sim:// URL") from exc
        self._ser = ser
        if parse_url(self.url)[1].boot == "download":
            # a board strapped into download mode (BOOT held) is powered on: EN pulse, the ROM waits
            ser.rts = True
            ser.rts = False
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            srv.bind((self.host, self.port))
        except OSError as exc:
            srv.close()
            ser.close()
            raise PortError(
                f"cannot listen on {self.host}:{self.port}: {exc}",
                hint="pick another --port (0 chooses a free one)",
            ) from exc
        srv.listen(1)
        srv.settimeout(0.2)
        self.port = srv.getsockname()[1]
        self._sock = srv
        self._thread = threading.Thread(target=self._serve, name=f"sim-serve-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._sock is not None:
            self._sock.close()
        if self._ser is not None:
            self._ser.close()

    def __enter__(self) -> SimServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait(self) -> None:
        """Block until stopped (the CLI's foreground mode; Ctrl-C raises KeyboardInterrupt)."""
        while self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=0.5)

    # ---- internals -----------------------------------------------------------------------------

    def _serve(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                client, _addr = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                break
            self.clients_served += 1
            try:
                self._session(client)
            except OSError as exc:  # also serial.SerialException: a client gone mid-handshake
                # (BrokenPipe, reset) ends its own session only; the board stays served for the next
                self.sessions_failed += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
            finally:
                with contextlib.suppress(OSError):
                    client.close()

    def _reopen(self) -> bool:
        ser = self._ser
        assert ser is not None
        with contextlib.suppress(serial.SerialException):
            ser.close()
        try:
            ser.open()
        except serial.SerialException:
            return False
        return True

    def _session(self, client: socket.socket) -> None:
        ser = self._ser
        assert ser is not None
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client.settimeout(0.2)
        lock = threading.Lock()
        alive = threading.Event()
        alive.set()

        class _ClientWriter:
            def write(self, data: bytes) -> None:
                with lock:
                    client.sendall(data)

        manager = _port_manager(ser, _ClientWriter()) if self.rfc2217 else None
        if not self.rfc2217:
            ser.dtr = True  # a terminal opening the port: both lines active, EN stays high
            ser.rts = True

        def pump_out() -> None:
            while alive.is_set() and not self._stop.is_set():
                try:
                    data = ser.read(ser.in_waiting or 1)
                except serial.SerialException:
                    if not self._reopen():
                        break
                    continue
                if not data:
                    continue
                try:
                    _ClientWriter().write(b"".join(manager.escape(data)) if manager else data)
                except OSError:
                    break
            alive.clear()

        reader = threading.Thread(target=pump_out, name="sim-serve-out", daemon=True)
        reader.start()
        try:
            while alive.is_set() and not self._stop.is_set():
                try:
                    data = client.recv(4096)
                except TimeoutError:
                    continue
                except OSError:
                    break
                if not data:
                    break
                payload = b"".join(manager.filter(data)) if manager else data
                if payload:
                    try:
                        ser.write(payload)
                    except serial.SerialException:
                        self._reopen()
        finally:
            alive.clear()
            reader.join(timeout=2)
            with contextlib.suppress(serial.SerialException, OSError):
                ser.rts = False  # RTS first: (1,1) -> (1,0) -> (0,0) never pulls EN low
                ser.dtr = False


_LINE_CONTROLS = (
    serial.rfc2217.SET_CONTROL_DTR_ON,
    serial.rfc2217.SET_CONTROL_DTR_OFF,
    serial.rfc2217.SET_CONTROL_RTS_ON,
    serial.rfc2217.SET_CONTROL_RTS_OFF,
)


def _port_manager(ser: serial.SerialBase, conn: object) -> serial.rfc2217.PortManager:
    """esp_rfc2217_server's EspPortManager, resetting with ClassicReset (no ioctl on sim:// ports), and
    acknowledging the DTR/RTS requests it takes over (EspPortManager never answers them), so clients
    open the plain URL (docs/simulator.md "Serving a board": what ``?ign_set_control`` costs instead).
    """

    class SimEspPortManager(EspPortManager):
        def _reset_thread(self) -> None:
            ClassicReset(self.serial, DEFAULT_RESET_DELAY)()

        def _telnet_process_subnegotiation(self, suboption: bytes) -> None:
            try:
                super()._telnet_process_subnegotiation(suboption)
            except struct.error:  # a value shorter than its option's (pyserial unpacks it unchecked)
                return  # ignored, as the malformed request it is: the server and its board carry on
            if (
                suboption[0:1] == serial.rfc2217.COM_PORT_OPTION
                and suboption[1:2] == serial.rfc2217.SET_CONTROL
                and suboption[2:3] in _LINE_CONTROLS
            ):
                self.rfc2217_send_subnegotiation(serial.rfc2217.SERVER_SET_CONTROL, suboption[2:3])

    return SimEspPortManager(ser, conn, False)


def serve_tcp(url: str, host: str = "127.0.0.1", port: int = 0) -> SimServer:
    """Serve ``url`` over raw TCP (``socket://``); returns the started server."""
    return SimServer(url, host, port, rfc2217=False).start()


def serve_rfc2217(url: str, host: str = "127.0.0.1", port: int = 0) -> SimServer:
    """Serve ``url`` over RFC 2217 (``rfc2217://``), forwarding DTR/RTS and baud rate."""
    return SimServer(url, host, port, rfc2217=True).start()
