"""pyserial URL handler ``native://NAME``: a serial port wired to a host program (a native board).

It makes the native target's program behave like a board behind a serial port, so the flash-and-capture
path, ``--tap`` and the runner use it unchanged. Its flash, reset (the boot stand-in), reads, writes and
a program's end: docs/native.md, "The native board"; the kept PSRAM and the full-FIFO drop: that page's
stand-in table. After a program's end reads raise :class:`ProgramEnded`.

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
from typing import BinaryIO
from urllib.parse import parse_qs

from serial.serialutil import SerialException

from harness.children import SANITIZER_ENV
from harness.chips import DEFAULT_FLASH_SIZE
from harness.flashfmt.otadata import boot_order
from harness.flashfmt.partitions import APP, TABLE_MAX_BYTES, Partition, table_rows
from harness.inprocess import BOARDS, NAME_RE, InProcessPort
from harness.resources import atomic_write

_PACKAGE = "harness.device"
EXIT_LINE = "esp-check native: the program"  # start of the line reporting an abnormal end
_MAX_BUFFER = 64 * 1024 * 1024
_MAX_FLASH_BYTES = 128 << 20
# Where the boot stand-in looks for the partition table (CONFIG_PARTITION_TABLE_OFFSET: ESP-IDF's
# default first, then the other 4 KB boundaries a board file may choose below otadata).
TABLE_OFFSETS = (0x8000, *range(0x9000, 0x10000, 0x1000))
SW_RESET_MARKER = "sw_reset"  # left by the esp_restart() stand-in (standins/src/flash.c)
NOINIT_FILE = "psram_noinit.bin"  # EXT_RAM_NOINIT_ATTR memory a software restart kept (standins/src/noinit.c)
BOOT_LINE = "esp-check native boot:"
_SIZE = re.compile(r"([0-9]{1,3})MB")


class NativeBoard:
    """A native board's state that outlives its port: its directory (its flash image and programs) and
    flash size. It lives in harness.inprocess.BOARDS until the process ends, as a board keeps its flash;
    the directory is removed when the board is dropped or at exit (``TemporaryDirectory``'s finalizer)."""

    def __init__(self, name: str, flash_bytes: int) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix=f"esp-check-native-{name}-")
        self.path = Path(self._tmp.name)
        self.flash_bytes = flash_bytes


def register() -> None:
    """Add ``harness.device`` to pyserial's URL handler packages (idempotent)."""
    BOARDS.register_handlers(_PACKAGE)


def _read_at(f: BinaryIO, offset: int, size: int) -> bytes:  # portable: os.pread is POSIX-only
    f.seek(offset)
    return f.read(size)


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


class Serial(InProcessPort):
    """A pyserial port whose far end is a native program (see the module docstring)."""

    SCHEME = "native"

    def __init__(self, *args: object, **kwargs: object) -> None:
        self._cond = threading.Condition()
        self._buf = bytearray()
        self._ended = False  # the current program ended and its output is all in _buf
        self._proc: subprocess.Popen[bytes] | None = None
        self._generation = 0
        self._dir: Path | None = None
        self._program: Path | None = None
        self._en_low = False
        self._flash_bytes = 0  # open() sets it: the URL's flash=, else 4MB
        self._life = threading.RLock()  # program start/stop: the reader thread restarts on esp_restart()
        self.name = ""
        super().__init__(*args, **kwargs)

    # ---- lifecycle -----------------------------------------------------------------------------

    def open(self) -> None:
        url = self._url_to_open()
        name = url[len("native://") :].split("?", 1)[0].strip("/") if url.startswith("native://") else ""
        if not NAME_RE.fullmatch(name):
            raise SerialException(f"could not open {url!r}: expected native://NAME (letters, digits, . _ -)")
        query = parse_qs(url.partition("?")[2])  # as typed: urlsplit would drop a newline in it
        size_text = (query.get("flash") or [DEFAULT_FLASH_SIZE])[0]
        m = _SIZE.fullmatch(size_text)
        if m is None or not 0 < (int(m.group(1)) << 20) <= _MAX_FLASH_BYTES:
            raise SerialException(f"could not open {url!r}: flash={size_text} is not a flash size like 4MB")
        self.name = name
        make = lambda: NativeBoard(name, int(m.group(1)) << 20)  # noqa: E731
        board, fresh = BOARDS.get("native", name, make)
        if not board.path.is_dir():  # removed behind this process's back: a blank board again
            BOARDS.remove("native", name)
            board, fresh = BOARDS.get("native", name, make)
        self._dir, self._flash_bytes = board.path, board.flash_bytes
        if fresh:
            (self._dir / "apps").mkdir()
            self._erase()
        bare = self._dir / "program"
        self._program = bare if bare.is_file() else None
        self.is_open = True

    def close(self) -> None:
        """Stop the program; the board keeps its flash (until this process ends), as a board does."""
        self._stop_program()
        self._dir = None
        self.is_open = False

    def _reconfigure_port(self) -> None:
        """Nothing to configure: a pipe has no baud rate."""

    # ---- "flash" and reset -----------------------------------------------------------------------

    def _erase(self) -> None:  # a blank board
        with open(self.home / "flash.bin", "wb") as f:
            f.write(b"\xff" * self._flash_bytes)
        for old in (self.home / "apps").iterdir():
            old.unlink()

    def install(self, program: str | Path) -> tuple[int, str, int]:
        """A bare program at offset 0 (no partition table): erase the board, keep ``program``; returns
        (size, sha256, bytes written: all of them), as :meth:`write_region`."""
        self._live()
        self._stop_program()
        self._erase()
        dest = self.home / "program"
        shutil.copy2(program, dest)
        dest.chmod(dest.stat().st_mode | 0o100)
        self._program = dest
        data = dest.read_bytes()
        return len(data), hashlib.sha256(data).hexdigest(), len(data)

    @property
    def home(self) -> Path:
        """The open board's directory: flash.bin (its flash), apps/ (a program per app slot), program."""
        assert self._dir is not None
        return self._dir

    def table(self) -> tuple[int, list[Partition]] | None:
        """The partition table in flash (its offset and entries), as the boot stand-in finds it."""
        with open(self.home / "flash.bin", "rb") as f:
            for off in TABLE_OFFSETS:
                f.seek(off)
                entries = table_rows(f.read(TABLE_MAX_BYTES))
                if entries:
                    return off, entries
        return None

    def write_region(self, offset: int, path: str | Path) -> tuple[int, str, int]:
        """Write one file at ``offset`` (see the module docstring): a host program when ``offset`` starts
        an app partition of the table in flash, else bytes of the flash image. Returns (size, sha256,
        bytes written); 0 written when the board already holds those bytes."""
        self._live()
        data = Path(path).read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        found = self.table()
        apps = {p.offset for p in found[1] if p.type == APP} if found else set()
        if offset in apps:
            dest = self.home / "apps" / f"0x{offset:x}"
            if dest.is_file() and hashlib.sha256(dest.read_bytes()).hexdigest() == sha:
                return len(data), sha, 0
            self._stop_program()
            atomic_write(dest, data, durable=False)  # a board of this process: gone at exit anyway
            dest.chmod(0o700)
            return len(data), sha, len(data)
        if offset < 0 or offset + len(data) > self._flash_bytes:
            raise OSError(
                errno.EFBIG,
                f"0x{offset:x}+{len(data)} bytes is beyond the board's {self._flash_bytes >> 20} MB of flash",
            )
        with open(self.home / "flash.bin", "r+b") as f:
            f.seek(offset)
            if f.read(len(data)) == data:
                return len(data), sha, 0
            self._stop_program()
            f.seek(offset)
            f.write(data)
        return len(data), sha, len(data)

    def _boot_choice(self) -> tuple[Path, dict[str, str], str] | None:
        """The boot stand-in: which program to start, its environment and the line it prints."""
        found = self.table()
        if found is None:
            if self._program is None:  # nothing flashed: the boot stand-in says so and the stream ends
                return Path(), {}, f"{BOOT_LINE} no partition table: nothing is flashed\r\n"
            return self._program, {}, ""
        table_off, parts = found
        with open(self.home / "flash.bin", "rb") as f:
            app = next(iter(boot_order(parts, lambda offset, size: _read_at(f, offset, size)).apps), None)
        if app is None:
            return None
        program = self.home / "apps" / f"0x{app.offset:x}"
        if not program.is_file():
            return Path(), {}, f"{BOOT_LINE} no app image in {app.label} at 0x{app.offset:x}\r\n"
        env = {
            "ESP_CHECK_NATIVE_FLASH": str(self.home / "flash.bin"),
            "ESP_CHECK_NATIVE_TABLE_OFFSET": f"0x{table_off:x}",
            "ESP_CHECK_NATIVE_APP_OFFSET": f"0x{app.offset:x}",
            "ESP_CHECK_NATIVE_BOARD_DIR": str(self.home),
        }
        line = f"{BOOT_LINE} Loaded app from partition at offset 0x{app.offset:x} ({app.label})\r\n"
        return program, env, line

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

    _update_rts_state = _update_dtr_state = _lines_changed  # pyserial calls these on a DTR or RTS change

    def _start_program(self, keep_output: bool = False) -> None:
        """Boot: the boot stand-in picks the program; ``keep_output`` after a software reset (the
        output before it is still to be read, as a UART's would be)."""
        with self._life:
            self._stop_program()
            choice = self._boot_choice()
            if choice is None:
                return
            program, extra, line = choice
            env = {**SANITIZER_ENV, **os.environ, **extra}  # the user's sanitizer settings win over ours
            with self._cond:
                self._generation += 1
                generation = self._generation
                if not keep_output:
                    self._buf.clear()
                # no program to start (a blank board, an empty app slot): after the boot stand-in's
                # line the stream ends, as after a program's end (nothing more comes until a flash)
                self._ended = not program.name
                self._buf += line.encode("ascii")
                self._cond.notify_all()
            if not program.name:
                return
            with contextlib.suppress(FileNotFoundError):
                (self.home / SW_RESET_MARKER).unlink()
            if not keep_output:  # a cold boot: PSRAM (EXT_RAM_NOINIT_ATTR, standins/src/noinit.c) is noise
                with contextlib.suppress(FileNotFoundError):
                    (self.home / NOINIT_FILE).unlink()
            proc = subprocess.Popen(
                [str(program)],
                cwd=str(self.home),
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
        with self._life:
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
        """Move the program's output into the buffer; at EOF, a software reset boots again, any other
        end adds its exit line and marks the end."""
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
        marker = self._dir / SW_RESET_MARKER if self._dir is not None else None
        if rc == 0 and marker is not None and marker.exists():
            with self._life:
                if generation == self._generation and self._proc is proc:
                    self._start_program(keep_output=True)
            return
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
            except OSError as exc:
                # a full input pipe drops bytes, as a full UART FIFO does; so does a dead one
                if exc.errno not in (errno.EAGAIN, errno.EPIPE):
                    raise
        return len(raw)

    def reset_input_buffer(self) -> None:
        self._live()
        with self._cond:
            self._buf.clear()
