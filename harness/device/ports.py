"""Serial ports: resolve what the user typed (path, ``auto``, pyserial URL) and open it with errors a
person can act on.

Transports differ in what they can do (docs/device.md, "Ports and transports": DTR/RTS, who resets,
notes): the flash and console layers ask :class:`TransportCaps` instead of guessing from the string.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import socket
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import serial
import serial.rfc2217
from esp_pylib.serial_ports import get_port_list

from harness.chips import ROM_BAUD
from harness.device.protocol_native import register as register_native
from harness.errors import PortError

# USB (VID, PID) of the bridges ESP32 dev boards carry, and Espressif's own USB-Serial-JTAG.
KNOWN_USB_DEVICES: dict[tuple[int, int], str] = {
    (0x10C4, 0xEA60): "CP210x USB-UART bridge",
    (0x1A86, 0x7523): "CH340 USB-UART bridge",
    (0x1A86, 0x55D4): "CH9102 USB-UART bridge",
    (0x0403, 0x6001): "FTDI FT232R USB-UART bridge",
    (0x0403, 0x6010): "FTDI FT2232 USB-UART bridge",
    (0x0403, 0x6014): "FTDI FT232H USB-UART bridge",
    (0x0403, 0x6015): "FTDI FT231X USB-UART bridge",
    (0x303A, 0x1001): "Espressif USB-Serial-JTAG",
}
USB_SERIAL_JTAG = (0x303A, 0x1001)

# Stable names for USB serial devices on Linux (udev). A module constant so tests can point it at
# a temporary directory of symlinks.
BY_ID_DIR = Path("/dev/serial/by-id")


class BoardLike(Protocol):
    """What this layer reads from a board definition (``harness.firmware.boards.Board`` fits)."""

    @property
    def chip(self) -> str: ...
    @property
    def console(self) -> str: ...  # "uart" | "usb_serial_jtag"
    @property
    def reset(self) -> str: ...  # "classic" | "usb_serial_jtag"


class Transport:
    """Names of the transports (plain strings so they serialize into reports as-is)."""

    DEVICE = "device"
    PTY = "pty"
    RFC2217 = "rfc2217"
    SOCKET = "socket"
    SIM = "sim"
    NATIVE = "native"
    LOOP = "loop"
    URL = "url"  # any other pyserial URL handler


@dataclasses.dataclass(frozen=True)
class TransportCaps:
    """What a transport can do; the flash/console layers decide resets from this, not from strings."""

    notes: str
    modem_lines: bool = False  # DTR/RTS reach the board
    atomic_modem_lines: bool = False  # ioctl(TIOCMSET) works (esptool's UnixTightReset needs it)
    local_reset: bool = False  # we can reset the board ourselves with DTR/RTS
    server_resets: bool = False  # a remote server performs resets when DTR/RTS change (rfc2217)
    baud_change: bool = False  # changing the baud rate reaches the board's UART
    exclusive_lock: bool = False  # pyserial's exclusive=True is enforced (flock)
    single_client: bool = False  # the far end serves one client at a time
    disconnect_is_eof: bool = False  # a dropped link means "no more data", not an error to retry
    esptool_before: str = "no-reset"  # esptool's connect mode on it (a USB-Serial-JTAG device: usb-reset)
    harness_reset: bool = False  # esp-check toggles DTR/RTS into the bootloader itself first
    lock_by: str = "url"  # the board lock's key: "path" (real path), "net" (host:port), "name" (URL name)
    installs_program: bool = False  # "flashing" installs a host program (a native board), not esptool


CAPS: dict[str, TransportCaps] = {  # per transport name; every PortSpec resolve_port makes gets its row
    Transport.DEVICE: TransportCaps(
        modem_lines=True,
        atomic_modem_lines=os.name != "nt",
        local_reset=True,
        baud_change=True,
        exclusive_lock=True,
        notes="local serial device; USB-Serial-JTAG ports re-enumerate on reset (reopened by "
        "serial number or /dev/serial/by-id)",
        esptool_before="default-reset",
        lock_by="path",
    ),
    Transport.PTY: TransportCaps(
        exclusive_lock=True,
        disconnect_is_eof=True,
        notes="pseudo-terminal: DTR/RTS ioctls fail, reset the board by hand",
        lock_by="path",
    ),
    Transport.RFC2217: TransportCaps(
        modem_lines=True,
        server_resets=True,
        baud_change=True,
        single_client=True,
        notes="esptool's esp_rfc2217_server performs its own bootloader/hard resets on DTR/RTS "
        "changes, has no USB-Serial-JTAG reset and serves one client at a time",
        esptool_before="default-reset",  # the server turns our DTR/RTS changes into its own resets
        lock_by="net",
    ),
    Transport.SOCKET: TransportCaps(
        disconnect_is_eof=True,
        notes="raw TCP: no reset at all (esptool forces no-reset); a peer close ends the stream",
        lock_by="net",
    ),
    Transport.SIM: TransportCaps(
        modem_lines=True,
        local_reset=True,
        baud_change=True,
        exclusive_lock=True,
        notes="in-process simulated board (harness.sim); results are simulated",
        harness_reset=True,  # esptool's POSIX sequence needs a tty ioctl; the simulator takes plain writes
        lock_by="name",
    ),
    Transport.NATIVE: TransportCaps(
        modem_lines=True,
        local_reset=True,
        baud_change=True,
        disconnect_is_eof=True,
        notes="native board: the firmware built for this PC, run as a program (reset restarts it; "
        "its end is the end of the stream); results are NATIVE, no chip is involved",
        lock_by="name",
        installs_program=True,
    ),
    Transport.LOOP: TransportCaps(disconnect_is_eof=True, notes="pyserial loopback (tests only)"),
    Transport.URL: TransportCaps(
        disconnect_is_eof=True,
        notes="other pyserial URL handler: capabilities unknown, treated as reset-less",
    ),
}


@dataclasses.dataclass(frozen=True)
class PortCandidate:
    """One attached serial device as ``list_ports`` reports it (for ``auto`` and error messages)."""

    device: str  # what to open (by-id path when there is one)
    kernel_device: str  # what list_ports said (/dev/ttyUSB0, COM3, /dev/cu.usbserial-1410)
    vid: int | None
    pid: int | None
    serial_number: str | None
    location: str | None
    description: str
    kind: str | None  # name from KNOWN_USB_DEVICES, None if unknown

    @property
    def is_usb_serial_jtag(self) -> bool:
        return (self.vid, self.pid) == USB_SERIAL_JTAG

    @property
    def vid_pid(self) -> str | None:
        return f"{self.vid:04X}:{self.pid:04X}" if self.vid is not None and self.pid is not None else None

    def label(self) -> str:
        sn = f" SN={self.serial_number}" if self.serial_number else ""
        return f"{self.device} [{self.vid_pid or '?'}{sn}] {self.kind or self.description}"


@dataclasses.dataclass(frozen=True)
class PortSpec:
    """A resolved port: what to pass to ``serial_for_url`` plus what we know about the transport."""

    spec: str  # what the user gave ("auto", "/dev/ttyUSB0", "rfc2217://host:4000", ...)
    url: str  # path or URL to open
    transport: str  # a Transport name
    caps: TransportCaps
    usb: PortCandidate | None = None  # USB identity when known (device ports)
    note: str | None = None  # e.g. "using /dev/cu.X instead of /dev/tty.X"

    @property
    def reenumerates(self) -> bool:
        """True for USB-Serial-JTAG: the port vanishes on reset and comes back (maybe renamed)."""
        return self.usb is not None and self.usb.is_usb_serial_jtag

    def relocate(self) -> str:
        """The path/URL to open *now*: after a USB re-enumeration the kernel name may have changed.

        by-id paths are stable; otherwise the device is found again by USB serial number.
        """
        if self.transport != Transport.DEVICE or self.usb is None or self.url.startswith(str(BY_ID_DIR)):
            return self.url
        if self.usb.serial_number and self.usb.vid is not None and self.usb.pid is not None:
            for cand in list_candidates(vids=[self.usb.vid], pids=[self.usb.pid]):
                if cand.serial_number == self.usb.serial_number:  # exact: get_port_list's is a substring
                    return cand.device
        return self.url


def _by_id_links() -> dict[str, str]:
    """Map real device path -> /dev/serial/by-id symlink (Linux only; empty elsewhere)."""
    try:
        entries = sorted(BY_ID_DIR.iterdir(), reverse=True)  # a device's first name is written last: it wins
    except OSError:
        return {}
    return {os.path.realpath(entry): str(entry) for entry in entries}  # non-strict realpath: no OSError


def list_candidates(
    platform: str | None = None, *, vids: list[int] | None = None, pids: list[int] | None = None
) -> list[PortCandidate]:
    """Serial devices attached now, as esptool lists them (``vids`` / ``pids`` filters), with stable names
    where the OS has them (docs/device.md, "Ports and transports")."""
    plat = platform or sys.platform
    links = _by_id_links() if plat.startswith("linux") else {}
    out: list[PortCandidate] = []
    for info in get_port_list(vids=vids, pids=pids):
        kernel = str(info.device)
        if plat == "darwin" and kernel.startswith("/dev/tty."):
            continue  # pyserial lists the cu.* twin too; tty.* blocks on open
        device = links.get(os.path.realpath(kernel), kernel) if links else kernel
        vid, pid = info.vid, info.pid
        out.append(
            PortCandidate(
                device=device,
                kernel_device=kernel,
                vid=vid,
                pid=pid,
                serial_number=info.serial_number,
                location=getattr(info, "location", None),
                description=str(info.description or ""),
                kind=KNOWN_USB_DEVICES.get((vid, pid)) if vid is not None and pid is not None else None,
            )
        )
    return out


def _transport_of(spec: str) -> str:
    """A URL's transport is named as its scheme (any other scheme: URL); a path is a device."""
    scheme, sep, _ = spec.lower().partition("://")
    if not sep:
        return Transport.DEVICE
    schemes = (Transport.RFC2217, Transport.SOCKET, Transport.SIM, Transport.NATIVE, Transport.LOOP)
    return scheme if scheme in schemes else Transport.URL


def _is_pty(path: str) -> bool:
    real = os.path.realpath(path)
    return real.startswith("/dev/pts/") or bool(re.fullmatch(r"/dev/tty[p-za-e][0-9a-f]", real))


def resolve_port(
    spec: str,
    board: BoardLike | None = None,
    *,
    platform: str | None = None,
) -> PortSpec:
    """Turn ``--port`` into a :class:`PortSpec`; ``auto`` picks the one attached ESP32 board (with
    ``board``: of its console kind), else a :class:`PortError` listing what was found (docs/device.md)."""
    plat = platform or sys.platform
    text = spec.strip()
    if not text:
        raise PortError("empty --port", hint="give a device path, 'auto', or a URL like rfc2217://host:port")
    if text.lower() == "auto":
        return _resolve_auto(text, board, plat)
    transport = _transport_of(text)
    if transport != Transport.DEVICE:
        return PortSpec(text, text, transport, CAPS[transport])
    path, note = text, None
    if plat == "darwin" and text.startswith("/dev/tty."):
        twin = "/dev/cu." + text[len("/dev/tty.") :]
        path, note = twin, f"using {twin} instead of {text} (tty.* waits for carrier detect on macOS)"
    if plat.startswith("linux") and _is_pty(path):
        return PortSpec(text, path, Transport.PTY, CAPS[Transport.PTY], note=note)
    return PortSpec(text, path, transport, CAPS[transport], usb=_identify(path, plat), note=note)


def _identify(path: str, plat: str) -> PortCandidate | None:
    """USB identity of an explicit path, if list_ports knows it (by real path, so by-id links match)."""
    real = os.path.realpath(path) if not plat.startswith("win") else path
    for cand in list_candidates(plat):
        if path in (cand.device, cand.kernel_device) or real == os.path.realpath(cand.kernel_device):
            return cand
    return None


def _resolve_auto(spec: str, board: BoardLike | None, plat: str) -> PortSpec:
    everything = list_candidates(plat)
    want_jtag = board is not None and getattr(board, "console", "uart") == "usb_serial_jtag"
    matching = [
        c for c in everything if c.kind is not None and (board is None or c.is_usb_serial_jtag == want_jtag)
    ]
    if len(matching) == 1:
        cand = matching[0]
        note = f"--port auto chose {cand.label()}"
        return PortSpec(spec, cand.device, Transport.DEVICE, CAPS[Transport.DEVICE], usb=cand, note=note)
    listing = "\n".join(f"  {c.label()}" for c in everything) or "  (no serial ports at all)"
    what = "an ESP32 board"
    if board is not None:
        what = f"a {'USB-Serial-JTAG' if want_jtag else 'USB-UART bridge'} console"
    if not matching:
        raise PortError(
            f"--port auto found no serial port that looks like {what}. Ports seen:\n{listing}",
            hint="plug the board in (a data cable, not charge-only), check `dmesg` or Device Manager, "
            "or give --port explicitly",
        )
    listing = "\n".join(f"  {c.label()}" for c in matching)
    raise PortError(
        f"--port auto is ambiguous: {len(matching)} candidates for {what}:\n{listing}",
        hint="pass --port with one of the paths above (prefer /dev/serial/by-id/... on Linux)",
    )


def find_port_holders(device: str) -> list[tuple[int, str]]:
    """Other processes holding ``device`` open (Linux /proc scan; empty list elsewhere or unknown).

    Serial monitors such as ``screen`` or ``idf.py monitor`` do not always take the flock that
    pyserial's ``exclusive=True`` checks, so this is how "busy" gets a name.
    """
    if not sys.platform.startswith("linux"):
        return []
    try:
        target = os.stat(device)
    except OSError:
        return []
    me = os.getpid()
    holders: list[tuple[int, str]] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == me:
            continue
        try:
            fds = list((proc / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                st = os.stat(fd)
            except OSError:
                continue
            if st.st_rdev == target.st_rdev and st.st_ino == target.st_ino and st.st_dev == target.st_dev:
                try:
                    name = (proc / "comm").read_text().strip()
                except OSError:
                    name = "?"
                holders.append((int(proc.name), name))
                break
    return holders


def _holders_text(holders: Iterable[tuple[int, str]]) -> str:
    return ", ".join(f"{name} (pid {pid})" for pid, name in holders)


def check_present(port_spec: PortSpec) -> None:
    """PortError now for a port that is not there (before minutes of builds find out).

    A local device must exist (Windows COM names are checked against list_ports). A network port
    (``rfc2217://``, ``socket://``) must accept a TCP connection: the probe connects and closes at once,
    so the server's one client slot is free again before the builds start.
    """
    if port_spec.caps.lock_by == "net":
        _probe_network(port_spec.url)
        return
    if port_spec.transport not in (Transport.DEVICE, Transport.PTY):
        return
    plat = sys.platform
    if plat.startswith("win"):
        present = any(port_spec.url.upper() == c.device.upper() for c in list_candidates(plat))
    else:
        present = os.path.exists(port_spec.url)
    if present:
        return
    missing = FileNotFoundError(errno.ENOENT, "No such file or directory")
    err = explain_open_error(port_spec.url, missing, platform=plat)
    attached = [c.label() for c in list_candidates(plat)]
    listing = "; attached now: " + ", ".join(attached) if attached else "; no serial ports are attached now"
    raise PortError(err.message, hint=f"{err.hint}{listing}")


def _probe_network(url: str, timeout: float = 3.0) -> None:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "", parts.port or 0), timeout=timeout):
            pass
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise PortError(
            f"cannot connect to {url}: nothing answers there ({why})",
            hint="start the server first (esptool's esp_rfc2217_server, `esp-check sim serve --rfc2217`, "
            "ser2net) and check the host name and port (checked before building: nothing was built)",
        ) from None


def explain_open_error(url: str, exc: BaseException, *, platform: str | None = None) -> PortError:
    """Map a pyserial/OS open failure to a :class:`PortError` that says what to do.

    Exposed so the mapping is testable without the hardware that produces each errno.
    """
    plat = platform or sys.platform
    code = getattr(exc, "errno", None)
    text = str(exc)
    low = text.lower()
    if code in (errno.ENOENT, errno.ENODEV, errno.ENXIO) or "no such file" in low or "filenotfound" in low:
        return PortError(
            f"serial port {url} does not exist ({text})",
            hint="is the board plugged in? list ports with `python -m serial.tools.list_ports -v` or "
            "use --port auto; USB-Serial-JTAG boards may re-enumerate under another name after a reset",
        )
    if (
        code in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EBUSY)
        or "exclusively lock" in low
        or (plat.startswith("win") and "access is denied" in low)
    ):
        holders = _holders_text(find_port_holders(url))
        held = f" (held by {holders})" if holders else ""
        return PortError(
            f"serial port {url} is busy{held}: another program has it open ({text})",
            hint="close the other serial monitor (idf.py monitor, screen, minicom, Arduino IDE, another "
            "esp-check run) and try again",
        )
    if code in (errno.EACCES, errno.EPERM) or "permission denied" in low:
        hint = (
            "add your user to the 'dialout' group (Debian/Ubuntu; 'uucp' on Arch): "
            "`sudo usermod -aG dialout $USER`, then log out and back in"
        )
        if plat == "darwin":
            hint = "check the device permissions, and that no other program owns the port"
        return PortError(f"permission denied opening serial port {url} ({text})", hint=hint)
    if code in (errno.ENOTTY, errno.EISDIR, errno.EINVAL) or "inappropriate ioctl" in low:
        return PortError(
            f"{url} is not a serial port ({text})",
            hint="give the board's serial device (e.g. /dev/ttyUSB0, /dev/ttyACM0, COM3) or a pyserial URL",
        )
    if code in (errno.ECONNREFUSED, errno.ETIMEDOUT, errno.EHOSTUNREACH) or "connection refused" in low:
        return PortError(
            f"cannot connect to {url} ({text})",
            hint="is the remote serial server (esp_rfc2217_server / esp-check sim serve / ser2net) "
            "running and reachable? an RFC2217 server serves one client at a time",
        )
    if isinstance(exc, ValueError):
        return PortError(
            f"invalid port {url!r}: {text}",
            hint="use a device path, 'auto', or rfc2217://host:port, socket://host:port, sim://NAME",
        )
    return PortError(f"could not open serial port {url}: {text}", hint="check the port name and cable")


class Rfc2217Serial(serial.rfc2217.Serial):
    """pyserial's RFC 2217 client, renegotiating the link only when a setting the server holds changes.

    pyserial renegotiates on *any* setting change, the read timeout included, which is this side's own
    and which esptool changes around nearly every command (what that cost: docs/device.md, "RFC 2217:
    what to expect"). labgrid's pyserial fork skips it the same way; this works with either package.
    """

    _negotiated: dict[str, object] | None = None  # the settings the server last confirmed

    def _reconfigure_port(self) -> None:
        wanted = self.get_settings()  # write_timeout stays in: pyserial refuses one (NotImplementedError)
        del wanted["timeout"], wanted["inter_byte_timeout"]  # this side's own, never the server's
        if wanted == self._negotiated and self._socket is not None:
            return  # only a timeout changed: nothing for the server
        super()._reconfigure_port()
        self._negotiated = wanted

    def close(self) -> None:
        self._negotiated = None  # the next open negotiates everything again
        super().close()


def open_port(
    spec: PortSpec | str,
    baud: int = ROM_BAUD,
    *,
    exclusive: bool = True,
    check_holders: bool = True,
) -> serial.SerialBase:
    """Open a port for flashing and capture, without resetting the board on open.

    Its read timeout is 0.05 s; ``rfc2217://`` ports are :class:`Rfc2217Serial`. DTR and RTS are
    set inactive *before* opening (both lines equal means "run" on the classic
    auto-reset circuit), and ``exclusive=True`` makes a second opener fail instead of stealing bytes.
    With ``check_holders`` a local device already open in another process (a monitor that took
    no lock) is reported as busy too.
    """
    ps = spec if isinstance(spec, PortSpec) else resolve_port(spec)
    url = ps.url
    if ps.caps.installs_program:
        register_native()  # pyserial finds harness.device.protocol_native for native://
    try:
        # a timeout change costs nothing on rfc2217:// either (Rfc2217Serial)
        kwargs: dict[str, object] = {"baudrate": baud, "timeout": 0.05}
        if exclusive and ps.caps.exclusive_lock:
            kwargs["exclusive"] = True
        if ps.transport == Transport.RFC2217:
            port = Rfc2217Serial(None, **kwargs)  # no port given: nothing opens yet
            port.port = url
        else:
            port = serial.serial_for_url(url, do_not_open=True, **kwargs)
        if ps.caps.modem_lines and ps.transport != Transport.RFC2217:
            port.dtr = False
            port.rts = False
        port.open()
    except (serial.SerialException, OSError, ValueError) as exc:
        raise explain_open_error(url, exc) from exc
    if check_holders and exclusive and ps.transport in (Transport.DEVICE, Transport.PTY):
        holders = find_port_holders(url)
        if holders:
            port.close()
            raise PortError(
                f"serial port {url} is busy: also open in {_holders_text(holders)}",
                hint="close the other serial monitor first; two readers split the bytes between them",
            )
    return port


def reopen_after_reenumeration(port_spec: PortSpec, baud: int, *, wait_s: float = 5.0) -> serial.SerialBase:
    """Open the port again after a USB-Serial-JTAG reset made it vanish, waiting at most ``wait_s``.

    The device is looked up again each try (by-id path or USB serial number), since it may come
    back under another kernel name.
    """
    deadline = time.monotonic() + wait_s
    last: BaseException | None = None
    while True:
        try:
            return open_port(
                dataclasses.replace(port_spec, url=port_spec.relocate()), baud, check_holders=False
            )
        except (PortError, serial.SerialException, OSError) as exc:
            last = exc
        if time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    raise PortError(
        f"{port_spec.url} did not come back within {wait_s:.1f} s after the board reset ({last})",
        hint="USB-Serial-JTAG boards re-enumerate on reset: check the cable/hub, or use the "
        "/dev/serial/by-id/... path so the port is found again under its stable name",
    )


RAW_TCP_SIMULATOR = (
    "a simulated board behind raw TCP (socket://) can never run its app: DTR/RTS do not travel over a "
    "raw socket and nobody can press its buttons, so after flashing it stays in the ROM loader"
)
RAW_TCP_SIMULATOR_HINT = (
    "serve the board with `esp-check sim serve --rfc2217` (or esp_rfc2217_server in front of its sim:// "
    "port) and give that rfc2217://HOST:PORT URL"
)
