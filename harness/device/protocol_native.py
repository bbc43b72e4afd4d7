"""pyserial URL handler ``native://NAME``: a serial port wired to a host program (a native board).

The native target (docs/native.md) builds the generated firmware as a program for this PC. This
port makes that program behave like a board behind a serial port, so the flash-and-capture path,
``--tap`` and the runner use it unchanged:

- **flash** (:meth:`Serial.install`, called by :class:`harness.device.session.DeviceSession`) copies
  the built program into the port's own directory: the board keeps what was flashed, whatever
  happens to the build directory afterwards;
- **reset**: the classic auto-reset lines (RTS drives EN, DTR drives IO0, as on a DevKit). EN pulled
  low stops the running program; EN released with IO0 high starts the installed program afresh;
- **read** returns what the program writes to stdout and stderr (one pipe, so a sanitizer report on
  stderr lands where the firmware's output stopped), **write** feeds its stdin (bytes beyond what the
  pipe holds are dropped, like a full UART FIFO);
- when the program ends before the host stops reading, an abnormal end (a signal, or a non-zero exit
  status) is reported as one line, ``esp-check native: the program ...``, the native board's crash
  report; then reads raise :class:`ProgramEnded` (end of stream, like a closed socket).

pyserial finds this module once ``harness.device`` is in ``serial.protocol_handler_packages``
(:func:`register`, called by :func:`harness.device.ports.open_port` for ``native://`` ports).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import serial
from serial.serialutil import PortNotOpenError, SerialBase, SerialException

_PACKAGE = "harness.device"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_register_lock = threading.Lock()
# Sanitizer runtime settings for a native program (unless the user set them): a report ends the
# program (a firmware fault); leaks at exit are not faults (firmware never exits on a device).
SANITIZER_ENV = {
    "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:halt_on_error=1:print_summary=1",
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1:print_summary=1",
}
EXIT_LINE = "esp-check native: the program"  # start of the line reporting an abnormal end
_MAX_BUFFER = 64 * 1024 * 1024


def register() -> None:
    """Add ``harness.device`` to pyserial's URL handler packages (idempotent)."""
    with _register_lock:
        if _PACKAGE not in serial.protocol_handler_packages:
            serial.protocol_handler_packages.append(_PACKAGE)


class ProgramEnded(SerialException):
    """The native program ended and everything it printed has been read."""


def exit_line(returncode: int) -> str | None:
    """The line a native board prints when its program ends abnormally (None for exit status 0)."""
    if returncode == 0:
        return None
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown signal"
        return f"{EXIT_LINE} was killed by signal {-returncode} ({name})\r\n"
    return f"{EXIT_LINE} exited with status {returncode}\r\n"


class Serial(SerialBase):
    """A pyserial port whose far end is a native program (see the module docstring)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self._cond = threading.Condition()
        self._buf = bytearray()
        self._ended = False  # the current program ended and its output is all in _buf
        self._proc: subprocess.Popen[bytes] | None = None
        self._generation = 0
        self._dir: Path | None = None
        self._program: Path | None = None
        self._en_low = False
        self.name = ""
        super().__init__(*args, **kwargs)

    # ---- lifecycle -----------------------------------------------------------------------------

    def open(self) -> None:
        if self._port is None:
            raise SerialException("Port must be configured before it can be used.")
        if self.is_open:  # type: ignore[has-type]
            raise SerialException("Port is already open.")
        url = str(self._port)
        name = url[len("native://") :].split("?", 1)[0].strip("/") if url.startswith("native://") else ""
        if not _NAME.match(name):
            raise SerialException(f"could not open {url!r}: expected native://NAME (letters, digits, . _ -)")
        self.name = name
        self._dir = Path(tempfile.mkdtemp(prefix=f"esp-check-native-{name}-"))
        self.is_open = True

    def close(self) -> None:
        self._stop_program()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self.is_open = False

    def _reconfigure_port(self) -> None:
        """Nothing to configure: a pipe has no baud rate."""

    def _live(self) -> None:
        if not self.is_open:
            raise PortNotOpenError()

    # ---- "flash" and reset -----------------------------------------------------------------------

    def install(self, program: str | Path) -> tuple[int, str]:
        """Copy ``program`` into this board (stopping what runs); returns (size, sha256)."""
        self._live()
        assert self._dir is not None
        self._stop_program()
        dest = self._dir / "program"
        shutil.copy2(program, dest)
        dest.chmod(dest.stat().st_mode | 0o100)
        self._program = dest
        data = dest.read_bytes()
        return len(data), hashlib.sha256(data).hexdigest()

    def _lines_changed(self) -> None:
        """Classic auto-reset circuit: EN is low while RTS is asserted and DTR is not."""
        if not self.is_open:
            return
        en_low = bool(self._rts_state) and not bool(self._dtr_state)
        if en_low and not self._en_low:
            self._stop_program()
        elif self._en_low and not en_low and not self._dtr_state:
            self._start_program()  # EN released with IO0 high: boot the installed program
        self._en_low = en_low

    def _update_rts_state(self) -> None:
        self._lines_changed()

    def _update_dtr_state(self) -> None:
        self._lines_changed()

    def _start_program(self) -> None:
        self._stop_program()
        if self._program is None:
            return  # nothing flashed: a blank board prints nothing
        env = dict(os.environ)
        for key, value in SANITIZER_ENV.items():
            env.setdefault(key, value)
        with self._cond:
            self._generation += 1
            generation = self._generation
            self._buf.clear()
            self._ended = False
        proc = subprocess.Popen(
            [str(self._program)],
            cwd=str(self._dir),
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert proc.stdin is not None
        os.set_blocking(proc.stdin.fileno(), False)
        self._proc = proc
        threading.Thread(
            target=self._pump, args=(proc, generation), name="esp-check-native", daemon=True
        ).start()

    def _stop_program(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with self._cond:
            self._generation += 1  # output still in flight from this program is dropped
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def _pump(self, proc: subprocess.Popen[bytes], generation: int) -> None:
        """Move the program's output into the buffer; at EOF, add its exit line and mark the end."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            with self._cond:
                if generation != self._generation:
                    return
                if not chunk:
                    break
                if len(self._buf) < _MAX_BUFFER:
                    self._buf += chunk
                self._cond.notify_all()
        rc = proc.wait()
        line = exit_line(rc)
        with self._cond:
            if generation != self._generation:
                return
            if line is not None:
                self._buf += line.encode("ascii")
            self._ended = True
            self._cond.notify_all()

    # ---- data ----------------------------------------------------------------------------------

    @property
    def in_waiting(self) -> int:
        self._live()
        with self._cond:
            return len(self._buf)

    def read(self, size: int = 1) -> bytes:
        self._live()
        if size <= 0:
            return b""
        deadline = None if self._timeout is None else time.monotonic() + float(self._timeout)
        with self._cond:
            while not self._buf:
                if self._ended:
                    raise ProgramEnded("the native program ended")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return b""
                self._cond.wait(left)
            out = bytes(self._buf[:size])
            del self._buf[:size]
            return out

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self._live()
        raw = bytes(data)
        proc = self._proc
        if proc is not None and proc.stdin is not None and proc.poll() is None:
            try:
                os.write(proc.stdin.fileno(), raw)
            except (BlockingIOError, BrokenPipeError):
                pass  # a full input pipe drops bytes, as a full UART FIFO does
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EPIPE):
                    raise
        return len(raw)

    def flush(self) -> None:
        self._live()

    def reset_input_buffer(self) -> None:
        self._live()
        with self._cond:
            self._buf.clear()

    def reset_output_buffer(self) -> None:
        self._live()

    def send_break(self, duration: float = 0.25) -> None:
        self._live()

    def _update_break_state(self) -> None:
        self._live()

    @property
    def cts(self) -> bool:
        self._live()
        return True

    @property
    def dsr(self) -> bool:
        self._live()
        return True

    @property
    def ri(self) -> bool:
        self._live()
        return False

    @property
    def cd(self) -> bool:
        self._live()
        return True

    def fileno(self) -> int:
        """No file descriptor (no modem-control ioctl), like the simulator's port."""
        raise OSError(errno.ENOTTY, "native:// ports have no file descriptor")

    @property
    def program(self) -> Path | None:
        """The installed program (None before the first flash)."""
        return self._program
