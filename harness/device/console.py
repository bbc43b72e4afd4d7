"""Console capture: reset into the app, read everything the board prints, stop at the protocol's
END record or a timeout.

One reader thread owns the port while capturing; it writes every byte to the raw log file as it
arrives (flushed, so a crash of the host loses nothing already received), keeps a bounded copy in
memory, counts boots, and spots the END line with a cheap line check (the full parser,
``harness.protocol.capture.parse_capture``, runs afterwards on the bytes). The main thread only waits
for a stop condition. The transport facts it handles (a USB-Serial-JTAG port reopened after its reset
through ``reopen``, a ``socket://`` peer's close read as the end of the stream) are docs/device.md's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import select
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

import serial
from serial.urlhandler import protocol_socket

from harness.analysis.classify import BootCounter
from harness.device.ports import TransportCaps
from harness.device.reset import hard_reset_into_app
from harness.errors import EspCheckError, write_error
from harness.protocol.frames import RSP_HELLO, Frame, FrameDecoder
from harness.protocol.spec import MARKER

# "hello": the resident firmware is ready for commands; "restart": it booted again mid-command
# "line": the caller's ``stop_on_line`` check found what it was waiting for (or against) in a line
ENDED_BY = (
    "end_record",
    "hello",
    "frame",
    "timeout",
    "silence",
    "disconnect",
    "boot_loop",
    "restart",
    "line",
)
_END_RE = re.compile(re.escape(MARKER) + rb"\d+ END(?: |\r|\n|$)")
_MAX_LINE = 4096  # longer "lines" (binary noise) are cut for the line checks; the log keeps all bytes


@dataclasses.dataclass
class RawCapture:
    """What the board printed during one run, and why the capture stopped."""

    data: bytes
    log_path: Path | None
    ended_by: str  # one of ENDED_BY
    duration_s: float
    # what a console capture counts (none in a resident loop session, which boots nothing itself)
    boots: int = 0  # boot starts seen in the stream (see classify.BootCounter)
    resets: int = 0  # resets into the app this capture performed
    reopens: int = 0  # times the port was reopened after it vanished (USB-Serial-JTAG)
    dropped_bytes: int = 0  # bytes beyond the in-memory bound (still in the log file)
    first_byte_s: float | None = None  # seconds from start to the first byte
    notes: list[str] = dataclasses.field(default_factory=list)
    hello: bytes | None = None  # the resident firmware's HELLO payload, when the capture stopped at it
    stop_frame: Frame | None = None  # the frame ``stop_on_frame`` accepted (HELLO, or e.g. a refusal)
    stale_frames: int = 0  # whole frames of an earlier boot (``stale_keys``) its frame check dropped
    serial: serial.SerialBase | None = dataclasses.field(repr=False, compare=False, default=None)

    @property
    def complete(self) -> bool:
        """The END record was seen (the parser still decides whether the records are valid)."""
        return self.ended_by == "end_record"


class _CaptureState:
    """What the reader thread has captured so far, and the conditions that stop it."""

    def __init__(self, port: serial.SerialBase, stop_on_line: Callable[[bytes], bool] | None = None) -> None:
        self.port = port
        self.buf = bytearray()
        self.dropped = 0
        self.line = bytearray()
        self.boots = BootCounter()
        self.last_data = time.monotonic()
        self.first_byte: float | None = None
        self.ended_by: str | None = None
        self.reopens = 0
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.stop = threading.Event()
        self.frames: FrameDecoder | None = None  # set when the capture stops at a frame
        self.stop_on_frame: Callable[[Frame], bool] | None = None
        self.stop_frame: Frame | None = None
        self.stop_on_line = stop_on_line
        self.log_error: EspCheckError | None = None  # the serial log could not be written

    def closing_notes(self, max_bytes: int) -> list[str]:
        """What the report says of a closed link and of the bytes beyond the memory bound."""
        notes = [f"link closed: {self.error}"] if self.error is not None else []
        if self.dropped:
            notes.append(
                f"{self.dropped} bytes beyond the {max_bytes}-byte memory bound are only in the log file"
            )
        return notes

    @property
    def hello(self) -> bytes | None:
        """The HELLO payload the capture stopped at, if it stopped at one."""
        frame = self.stop_frame
        return frame.payload if frame is not None and frame.type == RSP_HELLO else None


def _socket_of(port: serial.SerialBase) -> socket.socket | None:
    """The TCP socket behind a ``socket://`` port (pyserial keeps it in ``_socket``).

    Only for the raw socket handler: an ``rfc2217://`` port also has a ``_socket``, but its own
    reader thread owns it (telnet framing), so it is read through the port's API.
    """
    if not isinstance(port, protocol_socket.Serial):
        return None
    sock = getattr(port, "_socket", None)
    return sock if isinstance(sock, socket.socket) else None


def _read_some(port: serial.SerialBase, wait_s: float) -> bytes:
    """Read what is available (up to 64 KiB), waiting at most ``wait_s`` for the first byte.

    Raises ``serial.SerialException`` (or OSError) on disconnect *after* everything received
    before it was returned by earlier calls: no partial data is ever discarded.
    """
    sock = _socket_of(port)
    if sock is not None:
        ready, _, _ = select.select([sock], [], [], wait_s)
        if not ready:
            return b""
        try:
            data = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return b""
        if not data:
            raise serial.SerialException("socket disconnected")
        return data
    return bytes(port.read(min(port.in_waiting, 65536) or 1))  # 1: blocks up to port.timeout


def _reader(
    capture: _CaptureState,
    log: IO[bytes] | None,
    max_bytes: int,
    stop_at_end: bool,
    max_boots: int | None,
    reopen: Callable[[], serial.SerialBase] | None,
    disconnect_is_eof: bool,
) -> None:
    try:
        while not capture.stop.is_set():
            try:
                chunk = _read_some(capture.port, 0.05)
            except (serial.SerialException, OSError) as exc:
                if capture.stop.is_set():
                    break
                if reopen is not None and not disconnect_is_eof:
                    with contextlib.suppress(Exception):  # the handle is dead; closing is best effort
                        capture.port.close()
                    try:
                        capture.port = reopen()
                        capture.reopens += 1
                        continue
                    except Exception as exc2:
                        capture.error = exc2
                else:
                    capture.error = exc
                capture.ended_by = "disconnect"
                break
            if not chunk:
                continue
            now = time.monotonic()
            capture.last_data = now
            if capture.first_byte is None:
                capture.first_byte = now
            if log is not None:
                try:
                    log.write(chunk)
                    log.flush()
                except OSError as exc:  # a full disk: the capture stops, said as such (not a lost link)
                    capture.log_error = write_error(
                        exc, f"the serial log {getattr(log, 'name', '')}".rstrip()
                    )
                    break
            room = max(max_bytes - len(capture.buf), 0)  # bytes beyond it are only in the log
            capture.buf += chunk[:room]
            capture.dropped += max(len(chunk) - room, 0)
            if _scan_lines(capture, chunk, stop_at_end, max_boots):
                break
    finally:
        capture.done.set()


def _scan_lines(capture: _CaptureState, chunk: bytes, stop_at_end: bool, max_boots: int | None) -> bool:
    """Feed complete lines to the END check and the boot counter, and bytes to the HELLO check;
    True = stop now."""
    if capture.frames is not None and capture.stop_on_frame is not None:
        for item in capture.frames.feed(chunk):
            if isinstance(item, Frame) and capture.stop_on_frame(item):
                capture.stop_frame = item
                capture.ended_by = "hello" if item.type == RSP_HELLO else "frame"
                return True
    *lines, tail = (bytes(capture.line) + chunk).split(b"\n")
    capture.line = bytearray(tail[-_MAX_LINE:])
    for raw in lines:
        line = raw[-_MAX_LINE:]
        capture.boots.feed(line)
        if capture.stop_on_line is not None and capture.stop_on_line(line):
            capture.ended_by = "line"
            return True
        if stop_at_end and _END_RE.search(line):
            capture.ended_by = "end_record"
            return True
        if max_boots is not None and capture.boots.count >= max_boots:
            capture.ended_by = "boot_loop"
            return True
    return False


def capture_run(
    port: serial.SerialBase,
    *,
    log_path: Path | None = None,
    reset: str | None = "classic",
    baud: int | None = None,
    caps: TransportCaps | None = None,
    total_timeout: float = 120.0,
    silence_timeout: float = 30.0,
    max_bytes: int = 32 * 1024 * 1024,
    stop_at_end: bool = True,
    max_boots: int | None = 4,
    reopen: Callable[[], serial.SerialBase] | None = None,
    stop_at_hello: bool = False,
    stop_on_frame: Callable[[Frame], bool] | None = None,
    frame_key: int = 0,
    stale_keys: Sequence[int] = (),
    stop_on_line: Callable[[bytes], bool] | None = None,
) -> RawCapture:
    """Reset the board into its app (``reset`` = board reset style, ``None`` = don't) and capture.

    Stops at the END record, after ``silence_timeout`` seconds without a byte, after
    ``total_timeout`` seconds, when the link drops (``disconnect``), or when ``max_boots`` boot
    starts were seen (``boot_loop``: a board that keeps rebooting never prints END). ``baud`` is the
    console baud, set before the reset so the first line is read at the right rate. ``caps``
    (from the PortSpec) says whether a reset is possible at all and whether a dropped link is end
    of stream (socket://) or a re-enumeration to recover from (``reopen``). ``stop_on_line(line)``
    returning True stops the capture at that complete line (``line``).
    """
    t0 = time.monotonic()
    notes: list[str] = []
    resets = 0
    if baud and (caps is None or caps.baud_change):
        port.baudrate = baud
    port.timeout = 0.05
    if reset is not None:
        if caps is not None and not (caps.local_reset or caps.server_resets):
            notes.append("this transport cannot reset the board: capturing without a reset")
        else:
            port.reset_input_buffer()
            try:
                hard_reset_into_app(port, reset)
                resets = 1
            except (serial.SerialException, OSError) as exc:
                if reset != "usb_serial_jtag":
                    raise
                notes.append(f"port dropped during the USB-Serial-JTAG reset ({exc}); reopening")
    capture = _CaptureState(port, stop_on_line)  # its clock of the last data starts now
    if stop_at_hello or stop_on_frame is not None:
        # the running boot's key (its BOOTING reply is keyed); earlier boots' frames dropped and counted
        capture.frames = FrameDecoder(key=frame_key, stale_keys=stale_keys)
        capture.stop_on_frame = stop_on_frame or (lambda f: f.type == RSP_HELLO)
    log: IO[bytes] | None = None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "ab")  # noqa: SIM115 - closed below, after the reader stopped
    disconnect_is_eof = caps.disconnect_is_eof if caps is not None else reopen is None
    thread = threading.Thread(
        target=_reader,
        args=(capture, log, max_bytes, stop_at_end, max_boots, reopen, disconnect_is_eof),
        name="esp-check-console",
        daemon=True,
    )
    thread.start()
    try:
        deadline = t0 + total_timeout
        while not capture.done.wait(0.02):
            now = time.monotonic()
            if now >= deadline:
                capture.ended_by = capture.ended_by or "timeout"
                break
            if now - capture.last_data >= silence_timeout:
                capture.ended_by = capture.ended_by or "silence"
                break
    finally:
        capture.stop.set()
        thread.join(5.0)
        if log is not None:
            with contextlib.suppress(OSError):  # its buffer is empty, or the error was recorded
                log.close()
    if capture.log_error is not None:
        raise capture.log_error
    notes += capture.closing_notes(max_bytes)
    return RawCapture(
        data=bytes(capture.buf),
        log_path=log_path,
        ended_by=capture.ended_by or "timeout",
        duration_s=time.monotonic() - t0,
        boots=capture.boots.count,
        resets=resets,
        reopens=capture.reopens,
        dropped_bytes=capture.dropped,
        first_byte_s=(capture.first_byte - t0) if capture.first_byte is not None else None,
        notes=notes,
        serial=capture.port,
        hello=capture.hello,
        stop_frame=capture.stop_frame,
        stale_frames=capture.frames.stats.stale if capture.frames is not None else 0,
    )
