"""The simulated board: flash, reset circuit, ROM loader session, and the serial line to the host.

One lock per board, all work in the caller's thread, output as a timed queue of chunks, no sleeps and no
background threads: docs/simulator.md "Boards and state". Time enters in one place, as on real
hardware: IO0 sampled ``strap_window`` after EN rises (docs/simulator.md "Reset styles").
"""

from __future__ import annotations

import functools
import operator
import random
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Literal

import serial
from pydantic import AfterValidator, BeforeValidator, Field

from harness.chips import DEFAULT_FLASH_SIZE, ROM_BAUD
from harness.errors import UsageError
from harness.inprocess import BOARDS, NAME_RE
from harness.protocol import frames
from harness.resources import atomic_write
from harness.sim.app import boot_from_flash, rom_header
from harness.sim.chips import CHIPS, FLASH_SIZE_CODES, FLASH_SIZES, ChipSpec, get_chip
from harness.sim.faults import FaultParams, FaultSpec, blank_is_none, parse_faults, sim_params_error
from harness.sim.loader import Loader
from harness.sim.resident import IDLE_QUIET_S, AppEnv, Piece, SimApp, keep_after_boot
from harness.userfiles import validated

RESET_STYLES = {  # the two reset styles by each name they go by
    **dict.fromkeys(("classic", "uart"), "classic"),
    **dict.fromkeys(("usb_jtag", "usb_serial_jtag", "usb"), "usb_jtag"),
}
KEEP_PSRAM_MAX = 512 * 1024  # PSRAM a simulated board offers the kept-input store (its size: the app's)


def _invoke_time(value: str) -> str:
    if value != "model":
        try:
            seconds = float(value)
        except ValueError:
            raise ValueError(f"is {value!r}; use model, or seconds") from None
        if not seconds >= 0:
            raise ValueError(f"is {value!r}; seconds must be >= 0")
    return value


class SimParams(FaultParams):
    """Every parameter of a ``sim://`` URL or a board file's ``[sim]`` table, with its default."""

    chip: str = Field("esp32s3", json_schema_extra={"enum": list(CHIPS)})  # (get_chip refuses another)
    reset: str = Field("classic", json_schema_extra={"enum": list(RESET_STYLES)})
    flash: str | None = Field(None, description="a file that keeps the board's flash between runs")
    flash_size: str = Field(DEFAULT_FLASH_SIZE, json_schema_extra={"enum": list(FLASH_SIZES)})
    throttle: Annotated[Annotated[int, Field(ge=0)] | None, BeforeValidator(blank_is_none)] = Field(
        None, description="line rate in baud, both directions; 0: as fast as the host reads"
    )
    emitter: Literal["auto", "c", "python"] = "auto"
    strap_window: float = Field(0.02, ge=0, description="seconds from EN rising to IO0 being sampled")
    invoke_time: Annotated[str, AfterValidator(_invoke_time)] = Field("0", description="model, or seconds")
    rx_buffer: Annotated[Annotated[int, Field(ge=1)] | None, BeforeValidator(blank_is_none)] = Field(
        None, description="the app's receive buffer in bytes (at least 64 are used)"
    )
    boot: str = Field("auto", description="auto (IO0 from the reset circuit) or download (strapped low)")


@dataclass(frozen=True)
class BoardConfig:
    """How one simulated board is built (from a ``sim://`` URL or a board file)."""

    chip: ChipSpec  # (the defaults of every field are SimParams')
    reset: str  # "classic" (DTR/RTS auto-reset circuit) or "usb_jtag" (USB-Serial-JTAG)
    flash_path: Path | None
    flash_size: int
    faults: FaultSpec
    throttle: int | None  # line rate in baud, both directions (None: as fast as the host reads)
    emitter: str
    strap_window: float
    invoke_time: str  # "model": the app is busy for its modelled invoke time; else seconds
    rx_buffer: int | None  # the app's receive buffer (default: the window its image announces)
    boot: str  # "auto": IO0 follows the reset circuit; "download": IO0 strapped low (BOOT held)
    explicit: frozenset[str]  # keys the URL / table named (the rest are defaults)


def parse_url(url: str) -> tuple[str, BoardConfig]:
    """``sim://NAME?chip=..&reset=..&flash=..&fault=..`` -> (name, config)."""
    if any(c in url for c in "\t\r\n"):  # urlsplit would drop them: a name or value not as typed
        raise UsageError(f"{url!r} has a tab or line break", hint="write the URL on one line, without tabs")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "sim":
        raise UsageError(f"not a sim:// URL: {url!r}", hint="use sim://NAME?chip=esp32s3")
    name = parts.netloc or parts.path.lstrip("/")
    if not NAME_RE.fullmatch(name):
        raise UsageError(
            f"bad simulated board name {name!r} in {url!r}",
            hint="use letters, digits, '.', '_' and '-' (max 64)",
        )
    params = {k: v[-1] for k, v in urllib.parse.parse_qs(parts.query, keep_blank_values=True).items()}
    p = validated(SimParams, params, functools.partial(sim_params_error, SimParams))
    chip = get_chip(p.chip)
    reset = RESET_STYLES.get(p.reset.lower())
    if reset is None:
        raise UsageError(f"unknown reset style {p.reset!r}", hint="use classic or usb_jtag")
    if reset == "usb_jtag" and chip.name == "esp32":
        raise UsageError(
            "the ESP32 has no USB-Serial-JTAG peripheral", hint="use reset=classic with chip=esp32"
        )
    size_raw = p.flash_size.upper()
    if size_raw not in FLASH_SIZES:
        raise UsageError(f"flash_size={size_raw!r} not modelled", hint=f"use one of {', '.join(FLASH_SIZES)}")
    boot = p.boot.lower()
    if boot not in ("auto", "download"):
        raise UsageError(
            f"boot={boot!r}", hint="use auto (IO0 from the reset circuit) or download (strapped low)"
        )
    return name, BoardConfig(
        chip=chip,
        reset=reset,
        flash_path=Path(p.flash) if p.flash else None,
        flash_size=FLASH_SIZES[size_raw],
        faults=parse_faults(params),
        throttle=p.throttle or None,
        emitter=p.emitter,
        strap_window=p.strap_window,
        invoke_time=p.invoke_time,
        rx_buffer=None if p.rx_buffer is None else max(64, p.rx_buffer),
        boot=boot,
        explicit=frozenset(params),
    )


@dataclass
class _Chunk:
    data: bytes
    t0: float
    rate: float | None  # bytes per second; None: all at t0
    baud: int | None  # baud the bytes were sent at (None: USB, no baud rate)
    event: str | None = None  # "disconnect"
    taken: int = 0

    def ready(self, now: float) -> int:
        if now < self.t0:
            return 0
        if self.rate is None:
            return len(self.data)
        return min(len(self.data), int((now - self.t0) * self.rate + 1e-9))


@dataclass
class _OpenPort:
    """One ``sim://`` port open on this board."""

    epoch: int
    exclusive: bool
    baud: int | None = None  # the host UART's rate (None until the port is configured)


class ReferenceCache(dict[str, object]):
    """The board's cache (the app's model and its reference outputs by input): a dict whose ``out:``
    entries are bounded by their bytes, not their count. The two variants of a dataset run ask for the
    same inputs in the same order, so a count limit below the dataset's size evicted each output just
    before the second variant needed it (measured: 5000 inputs took 85 s, 2500 took 1 s). The oldest
    outputs go first, and only when the outputs pass ``max_bytes``."""

    def __init__(self, max_bytes: int = 512 << 20) -> None:
        super().__init__()
        self.max_bytes = max_bytes
        self.out_bytes = 0

    @staticmethod
    def _size(value: object) -> int:
        return sum(int(getattr(a, "nbytes", 0)) for a in value) if isinstance(value, (list, tuple)) else 0

    def __setitem__(self, key: str, value: object) -> None:
        if key.startswith("out:"):
            if key in self:
                self.out_bytes -= self._size(self[key])
            self.out_bytes += self._size(value)
        super().__setitem__(key, value)
        if self.out_bytes > self.max_bytes:
            for k in [k for k in self if k.startswith("out:")]:
                if self.out_bytes <= self.max_bytes * 3 // 4 or k == key:
                    break
                self.out_bytes -= self._size(self[k])
                super().__delitem__(k)

    def __delitem__(self, key: str) -> None:
        if key.startswith("out:") and key in self:
            self.out_bytes -= self._size(self[key])
        super().__delitem__(key)


class SimBoard:
    """One simulated ESP32-family board. Create through :func:`get_board`."""

    def __init__(self, name: str, config: BoardConfig) -> None:
        self.name = name
        self.config = config
        self.chip = config.chip
        self._cond = threading.Condition(threading.RLock())
        self.flash_size = config.flash_size
        self.flash = self._load_flash()
        self.registers: dict[int, int] = dict(self.chip.registers)
        self.registers.update(self.chip.mac_registers(name))
        self.uart_baud = ROM_BAUD
        self.mode = "idle"  # idle (app finished long ago) | reset | rom | app | halted
        self._chunks: deque[_Chunk] = deque()
        self._last_end = 0.0
        self._epoch = 0
        self._conns: dict[int, _OpenPort] = {}
        self._next_conn = 1
        self._en_low = False
        self._pending: tuple[float, list[tuple[float, bool]]] | None = None
        self._usb_armed = False
        self._usb_in_reset = False
        self._usb_download = False
        self._loader: Loader | None = None
        self._dirty = False
        self._cache = ReferenceCache()
        self.boots = 0
        self.app_boots = 0  # boots that loaded an app image (``fault_boots`` counts these)
        self.download_sessions = 0
        self.flash_bytes_written = 0
        self._flash_done = 0
        self.console_baud = ROM_BAUD
        self._baud_revert: tuple[float, int] | None = None  # (deadline, console baud) after a BAUD switch
        self.log: deque[str] = deque(maxlen=200)
        # the running app's receive side (resident loop): line, receive buffer, busy device
        self._app: SimApp | None = None
        self._rx_line_free = 0.0  # when the host-to-device line is free again (throttled writes)
        self._dev_free = 0.0  # device time when it finishes what it was given
        self._inflight: deque[tuple[float, float, int]] = deque()  # (arrival, consumed, bytes) in the buffer
        self._idle_at: float | None = None  # the receive buffer runs empty then: send batches, ACK
        self._now: float | None = None  # device-side time of the output being emitted (throttled input)
        self.rx_dropped = 0  # bytes lost because the receive buffer was full (host ignored flow control)
        self.rx_bytes = 0
        # PSRAM the kept-input store lives in: noise at power-on, left alone by a software restart
        self.keep = bytearray(random.Random(f"{name}:psram").randbytes(KEEP_PSRAM_MAX))

    # ---- persistence ---------------------------------------------------------------------------

    def _load_flash(self) -> bytearray:
        path = self.config.flash_path
        if path is not None and path.exists():
            data = bytearray(path.read_bytes())
            if len(data) > self.flash_size:
                if len(data) not in FLASH_SIZE_CODES:
                    raise UsageError(
                        f"flash file {path} is {len(data)} bytes, not a flash size",
                        hint="delete it or pass the matching flash_size=",
                    )
                self.flash_size = len(data)
            return data + b"\xff" * (self.flash_size - len(data))
        return bytearray(b"\xff" * self.flash_size)

    def persist(self) -> None:
        """Write the flash image to its file (atomically), if the board has one and it changed."""
        with self._cond:
            path = self.config.flash_path
            if path is None or not self._dirty:
                return
            atomic_write(path, bytes(self.flash), durable=False)
            self._dirty = False

    def program(self, files: list[tuple[int, Path]] | list[tuple[int, bytes]]) -> None:
        """Put images into flash directly, as a factory-programmed board would hold them.

        For tests and benchmarks that are not about flashing; esptool goes through the ROM loader.
        """
        with self._cond:
            for offset, item in files:
                data = item if isinstance(item, bytes) else Path(item).read_bytes()
                if offset < 0 or offset + len(data) > self.flash_size:
                    raise UsageError(f"image of {len(data)} bytes at 0x{offset:x} does not fit the flash")
                self.flash[offset : offset + len(data)] = data
            self._dirty = True
            self.persist()

    def reconfigure(self, config: BoardConfig) -> None:
        """Apply a re-opened URL's settings.

        Faults, throttle and emitter follow the new URL. Chip, reset style and flash file belong to the
        hardware: a URL that omits them inherits them (``sim://NAME`` reopens any board), one that
        names different values is an error.
        """
        with self._cond:
            old = self.config
            clash = [
                f"{key}={new!s} (board has {was!s})"
                for key, new, was in (
                    ("chip", config.chip.name, old.chip.name),
                    ("reset", config.reset, old.reset),
                    ("flash", config.flash_path, old.flash_path),
                )
                if key in config.explicit and new != was
            ]
            if clash:
                raise UsageError(
                    f"simulated board {self.name!r} already exists; the URL asks for {', '.join(clash)}",
                    hint="use another board name, or remove it from the registry first",
                )
            self.config = replace(
                config, chip=old.chip, reset=old.reset, flash_path=old.flash_path, flash_size=old.flash_size
            )

    # ---- output queue --------------------------------------------------------------------------

    def _emit(
        self,
        data: bytes,
        baud: int | None,
        event: str | None = None,
        now: float | None = None,
        at: float = 0.0,
    ) -> None:
        if now is None:
            now = self._now if self._now is not None else time.monotonic()
        if self.config.reset == "usb_jtag":
            baud = None
        t0 = max(now + at, self._last_end)
        rate = self._rate(baud)
        self._chunks.append(_Chunk(bytes(data), t0, rate, baud, event))
        self._last_end = t0 + (len(data) / rate if rate else 0.0)
        self._cond.notify_all()

    def _emit_pieces(self, pieces: list[Piece], now: float, console_baud: int) -> None:
        """Queue what a boot or the app printed: ROM text at the ROM's baud, the rest at ``console_baud``."""
        for p in pieces:
            if p.kind == "disconnect":
                self._emit(b"", None, event="disconnect", now=now, at=p.at)
            else:
                self._emit(p.data, ROM_BAUD if p.kind == "rom" else console_baud, now=now, at=p.at)

    def _rate(self, baud: int | None) -> float | None:
        """Bytes per second on a throttled line: the baud the bytes are sent at (10 bits a byte), or the
        throttle for a line without one (USB); None: not throttled."""
        if not self.config.throttle:
            return None
        return (baud or self.config.throttle) / 10.0

    def _cut_future(self, now: float) -> None:
        """A reset stops the UART: bytes not yet on the wire never arrive."""
        kept: deque[_Chunk] = deque()
        for c in self._chunks:
            r = c.ready(now)
            if r >= len(c.data) and (c.event is None or c.t0 <= now):
                kept.append(c)
            elif r > c.taken:
                kept.append(_Chunk(c.data[:r], c.t0, c.rate, c.baud, None, c.taken))
        self._chunks = kept
        self._last_end = now

    def _ready(self, now: float) -> tuple[int, bool, float | None]:
        """(bytes ready, a link event is next, time the next byte/event becomes ready)."""
        n = 0
        for c in self._chunks:
            if c.event is not None:
                return n, c.t0 <= now, (None if c.t0 <= now else c.t0)
            r = c.ready(now)
            n += max(0, r - c.taken)
            if r < len(c.data):
                return n, False, (c.t0 if c.rate is None else c.t0 + (r + 1) / c.rate)
        return n, False, None

    def _take(self, size: int, now: float, port_baud: int) -> bytes:
        out = bytearray()
        while self._chunks and len(out) < size:
            c = self._chunks[0]
            if c.event is not None:
                break
            r = c.ready(now)
            k = min(r - c.taken, size - len(out))
            if k <= 0:
                break
            part = c.data[c.taken : c.taken + k]
            if c.baud is not None and c.baud != port_baud:
                part = _garble(part)
            out += part
            c.taken += k
            if c.taken >= len(c.data):
                self._chunks.popleft()
        return bytes(out)

    # ---- connections ---------------------------------------------------------------------------

    def attach(self, exclusive: bool) -> int:
        with self._cond:
            if self._conns and (exclusive or any(c.exclusive for c in self._conns.values())):
                raise serial.SerialException(
                    16, f"could not open port sim://{self.name}: [Errno 16] Device or resource busy"
                )
            ident = self._next_conn
            self._next_conn += 1
            self._conns[ident] = _OpenPort(self._epoch, exclusive)
            return ident

    def detach(self, ident: int) -> None:
        with self._cond:
            conn = self._conns.pop(ident, None)
            if conn is None:
                return
            if conn.epoch == self._epoch and not self._conns:
                # closing the tty drops DTR and RTS (HUPCL) ...
                self._set_lines(False, False, time.monotonic())
                if self.config.reset == "classic":
                    # ... and what the driver had buffered is gone
                    self._settle(time.monotonic())
                    self._chunks.clear()
            self.persist()

    def _check(self, ident: int) -> None:
        conn = self._conns.get(ident)
        if conn is None or conn.epoch != self._epoch:
            raise serial.SerialException(
                "device reports readiness to read but returned no data (device disconnected or multiple "
                "access on port?)"
            )

    def _drop_link(self) -> None:
        """The USB device leaves the bus (or the cable is pulled): open handles die."""
        self._epoch += 1
        self._cond.notify_all()

    # ---- host-facing I/O (called by the pyserial handler) --------------------------------------

    def read(self, ident: int, size: int, timeout: float | None, port_baud: int) -> bytes:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                now = time.monotonic()
                self._settle(now)
                self._check(ident)
                n, event, nxt = self._ready(now)
                if n >= size or (n > 0 and event):
                    return self._take(size, now, port_baud)
                if event:
                    self._chunks.popleft()
                    self.log.append("link dropped (fault disconnect)")
                    self.mode = "halted"
                    self._drop_link()
                    self._check(ident)
                if deadline is not None and now >= deadline:
                    return self._take(size, now, port_baud)
                wake = [t for t in (deadline, nxt, self._pending_time(), self._idle_at) if t is not None]
                self._cond.wait(None if not wake else max(0.0, min(wake) - now))

    def in_waiting(self, ident: int) -> int:
        with self._cond:
            now = time.monotonic()
            self._settle(now)
            self._check(ident)
            return self._ready(now)[0]

    def discard_input(self, ident: int) -> None:
        with self._cond:  # what in_waiting reports, taken (the lock is re-entrant)
            self._take(self.in_waiting(ident), time.monotonic(), 0)

    def write(self, ident: int, data: bytes, port_baud: int) -> None:
        with self._cond:
            now = time.monotonic()
            self._settle(now)
            self._check(ident)
            if self.mode == "app" and self._app is not None:
                self._app_write(bytes(data), now, port_baud)
                return
            loader = self._loader
            if self.mode != "rom" or loader is None:
                return  # nothing reads the console
            if self.config.reset == "classic" and loader.synced and port_baud != self.uart_baud:
                self.log.append(f"host writes at {port_baud} baud, chip listens at {self.uart_baud}: garbage")
                return
            was_synced = loader.synced
            self._now = self._arrival(now, len(data), port_baud)  # the loader answers once the request is in
            try:
                loader.feed(data)
            finally:
                self._now = None
            if loader.synced and not was_synced:
                self.uart_baud = port_baud  # the ROM auto-bauds on the SYNC pattern
            self.flash_bytes_written = self._flash_done + loader.flash_bytes_written

    # ---- the resident app's receive side ------------------------------------------------------------

    def _arrival(self, now: float, n: int, baud: int | None) -> float:
        """When the last of ``n`` bytes written now at ``baud`` has crossed the (throttled) host-to-device
        line."""
        start = max(now, self._rx_line_free)
        rate = self._rate(None if self.config.reset == "usb_jtag" else baud)
        end = start + (n / rate if rate else 0.0)
        self._rx_line_free = end
        return end

    def _rx_capacity(self) -> int:
        if self.config.rx_buffer is not None:
            return self.config.rx_buffer
        app = self._app
        return int(app.payload.header.get("window", 16384)) if app is not None else 16384

    def _app_write(self, data: bytes, now: float, port_baud: int) -> None:
        """Bytes for the running app: they cross the line at its rate, wait in the app's receive buffer
        (of real size: what does not fit is lost) while it is busy, and are processed in order."""
        fast = self._baud_revert is not None and now <= self._baud_revert[0]
        if fast and self.config.faults.active("baud_fail"):
            self.log.append(f"host writes at {port_baud} baud: the line cannot carry it (fault baud_fail)")
            return
        self._baud_watch(now, port_baud)
        if self.config.reset == "classic" and port_baud != self.console_baud:
            self.log.append(
                f"host writes at {port_baud} baud, the app listens at {self.console_baud}: garbage"
            )
            return
        step = 256
        rate = self._rate(None if self.config.reset == "usb_jtag" else port_baud)
        for k in range(0, len(data), step):
            chunk = data[k : k + step]
            arrival = self._arrival(now, len(chunk), port_baud)
            while self._inflight and self._inflight[0][1] <= arrival:
                self._inflight.popleft()
            held = sum(n for a, _c, n in self._inflight if a <= arrival)
            room = max(0, self._rx_capacity() - held)
            if len(chunk) > room:
                self.rx_dropped += len(chunk) - room
                self.log.append(f"receive buffer full: {len(chunk) - room} bytes lost")
                chunk = chunk[:room]
            if not chunk:
                continue
            first = arrival - (len(chunk) - 1) / rate if rate else arrival  # its first byte's arrival
            start = max(arrival, self._dev_free)
            if self._idle_at is not None and first <= self._idle_at:
                self._idle_at = None  # the device finds these bytes before it goes idle
            self._run_app_call(start, operator.methodcaller("rx", chunk))
            self._inflight.append((arrival, start, len(chunk)))
            self.rx_bytes += len(chunk)

    def _baud_watch(self, now: float, port_baud: int) -> None:
        """After the app's BAUD switch: bytes at the new baud confirm it; none within the firmware's
        confirm time (BaudWatch in app_main.cc) and the app's UART is back at the console baud."""
        if self._baud_revert is None:
            return
        deadline, old = self._baud_revert
        if now > deadline:
            self.log.append(f"app: no frame at {self.console_baud} baud in time: back to {old}")
            self.console_baud, self._baud_revert = old, None
        elif port_baud == self.console_baud:
            self._baud_revert = None

    def _run_app_call(self, start: float, call: Callable[[SimApp], tuple[list[Piece], str | None]]) -> None:
        """Run one step of the app (``call(app)``) that starts at device time ``start``; queue its output;
        reboot if it says so."""
        app = self._app
        if app is None:
            return
        pieces, reboot = call(app)
        busy = max([app.last_busy, *(p.at for p in pieces)])
        self._dirty = True  # the app may have written otadata
        self._emit_pieces(pieces, start, self.console_baud)
        self._dev_free = start + busy
        if app.baud_request is not None and reboot is None:  # after the BAUD_OK reply: the UART switches
            self.log.append(f"app: console {self.console_baud} -> {app.baud_request} baud")
            self._baud_revert = (self._dev_free + frames.BAUD_CONFIRM_S, self.console_baud)
            self.console_baud, app.baud_request = app.baud_request, None
        if reboot is not None:
            self._app = None
            self._idle_at = None
            self.log.append(f"app restarts ({reboot})")
            self._boot(download=False, reason="sw" if reboot == "sw" else reboot, now=self._dev_free)
        elif app.halted:
            self._idle_at = None  # silent from now on (hang, stall, cut output)
        else:
            self._idle_at = self._dev_free + IDLE_QUIET_S  # no byte for a tick: the app goes idle

    def _app_settle(self, now: float) -> None:
        """The receive buffer ran empty at ``_idle_at`` and nothing new came: the app flushes and ACKs."""
        if self._idle_at is None or now < self._idle_at or self._app is None:
            return
        at, self._idle_at = self._idle_at, None
        self._run_app_call(at, lambda app: (app.idle(), None))
        self._idle_at = None

    def set_port_baud(self, ident: int, baud: int) -> None:
        """The host changed its UART rate. Bytes already on the wire were received at the old rate:
        they keep what that made of them (garbage if it was not the rate they were sent at)."""
        with self._cond:
            conn = self._conns.get(ident)
            if conn is None:
                return
            old, conn.baud = conn.baud, baud
            if old is None or old == baud:
                return
            now = time.monotonic()
            self._settle(now)
            self._latch(now, old)

    def _latch(self, now: float, host_baud: int) -> None:
        latched: deque[_Chunk] = deque()
        for c in self._chunks:
            r = c.ready(now) if c.event is None and c.baud is not None else c.taken
            if r <= c.taken:
                latched.append(c)
                continue
            part = c.data[c.taken : r]
            latched.append(_Chunk(part if c.baud == host_baud else _garble(part), c.t0, None, None))
            if r < len(c.data):
                t_rest = c.t0 + (r / c.rate if c.rate else 0.0)
                latched.append(_Chunk(c.data[r:], t_rest, c.rate, c.baud))
        self._chunks = latched

    def set_lines(self, ident: int, dtr: bool, rts: bool) -> None:
        with self._cond:
            conn = self._conns.get(ident)
            if conn is None or conn.epoch != self._epoch:
                return  # control requests to a vanished device go nowhere
            self._set_lines(dtr, rts, time.monotonic())

    # ---- reset circuit -------------------------------------------------------------------------

    def _pending_time(self) -> float | None:
        return None if self._pending is None else self._pending[0] + self.config.strap_window

    def _settle(self, now: float) -> None:
        self._app_settle(now)
        sample = self._pending_time()  # IO0 is sampled then: its level at the last change before it counts
        if self._pending is not None and sample is not None and now >= sample:
            history = self._pending[1]
            self._pending = None
            io0_low = next((low for t, low in reversed(history) if t <= sample), False)
            strapped = self.config.boot == "download"  # IO0 held low (BOOT button, strap): wins
            self._boot(download=io0_low or strapped, reason="poweron", now=now)

    def _set_lines(self, dtr: bool, rts: bool, now: float) -> None:
        self._settle(now)
        if self.config.reset == "usb_jtag":
            self._set_lines_usb(dtr, rts, now)
            return
        en_low = rts and not dtr
        io0_low = dtr and not rts
        if en_low and not self._en_low:
            self._en_low = True
            self._pending = None
            self._hold_reset(now)
        elif not en_low and self._en_low:
            self._en_low = False
            self._pending = (now, [(now, io0_low)])
        elif self._pending is not None:
            self._pending[1].append((now, io0_low))

    def _set_lines_usb(self, dtr: bool, rts: bool, now: float) -> None:
        """USB-Serial-JTAG: RTS with DTR inactive resets; DTR-then-RTS selects download mode."""
        if dtr and not rts:
            self._usb_armed = True
        elif not dtr and not rts:
            self._usb_armed = False
        in_reset = rts and not dtr
        if in_reset and not self._usb_in_reset:
            self._usb_in_reset = True
            self._usb_download = self._usb_armed or self.config.boot == "download"
            self._hold_reset(now)
        elif not in_reset and self._usb_in_reset:
            self._usb_in_reset = False
            self._boot(download=self._usb_download, reason="usb", now=now)

    def _hold_reset(self, now: float) -> None:
        self._cut_future(now)
        self.mode = "reset"
        self._app = None
        self._idle_at = None
        self._inflight.clear()
        self._end_session()
        self.persist()
        self.log.append("reset asserted")

    def _end_session(self) -> None:
        if self._loader is not None:
            self._flash_done += self._loader.flash_bytes_written
            self.flash_bytes_written = self._flash_done
        self._loader = None

    def _boot(self, download: bool, reason: str, now: float) -> None:
        self._end_session()
        self.uart_baud = ROM_BAUD
        if download:
            self.mode = "rom"
            faults = self.config.faults
            ignore = faults.active("sync_fail") and self.download_sessions < faults.fault_count
            self.download_sessions += 1
            self._loader = Loader(self, ignore_sync=ignore, log=self.log.append)
            self.log.append(f"boot: download mode ({reason})")
            self._emit(rom_header(self.chip, reason, True), ROM_BAUD, now=now)
            return
        self.mode = "app"
        self.boots += 1
        self.log.append(f"boot: SPI flash ({reason})")
        self.persist()
        keep_after_boot(self.keep, reason, self.config.faults, self.boots)
        ctx = AppEnv(
            chip=self.chip,
            flash=self.flash,  # the app may write otadata (slot switch)
            parts=[],
            faults=self.config.faults.for_boot(self.app_boots + 1),  # a blank flash's boot is no app boot
            boot_index=self.boots,
            emitter_backend=self.config.emitter,
            cache=self._cache,
            invoke_time=self.config.invoke_time,
            log=self.log.append,
            keep=self.keep,
        )
        result = boot_from_flash(ctx, reason)
        if result.variant is not None:
            self.app_boots += 1
        self.console_baud = result.console_baud
        self._baud_revert = None
        self._app = result.app
        self._inflight.clear()
        self._idle_at = None
        if self.config.reset == "usb_jtag":
            # the app re-initialises USB: the port vanishes; what the app prints waits for the reopen
            self._chunks.clear()
            self._last_end = now
            self._drop_link()
        self._emit_pieces(result.pieces, now, result.console_baud)
        self._dev_free = max((now + p.at for p in result.pieces), default=now)

    # ---- LoaderHost ----------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self._emit(data, self.uart_baud)

    def set_uart_baud(self, baud: int) -> None:
        self.uart_baud = baud

    def restart(self, download: bool) -> None:
        self._boot(download=download, reason="sw", now=time.monotonic())

    def flash_changed(self) -> None:
        self._dirty = True

    # ---- introspection (tests, `sim serve`) ----------------------------------------------------

    def status(self) -> dict[str, object]:
        with self._cond:
            return {
                "name": self.name,
                "chip": self.chip.name,
                "reset": self.config.reset,
                "mode": self.mode,
                "boots": self.boots,
                "download_sessions": self.download_sessions,
                "flash_bytes_written": self.flash_bytes_written,
                "rx_bytes": self.rx_bytes,
                "rx_dropped": self.rx_dropped,
                "stub": bool(self._loader and self._loader.stub),
                "uart_baud": self.uart_baud,
                "open_ports": len(self._conns),
            }


def _garble(data: bytes) -> bytes:
    """Bytes read at the wrong baud rate: framing garbage with the high bit set (never valid text)."""
    return bytes(((b * 37 + 0x5B) & 0x7F) | 0x80 for b in data)


def get_board(name: str, config: BoardConfig | None = None) -> SimBoard:
    """The simulated board ``name`` of this process (harness.inprocess.BOARDS): made from ``config`` on
    first use, reconfigured by a later one (a re-opened URL's settings); KeyError when unknown and no
    ``config``. Its state survives closing and reopening its port."""
    board, made = BOARDS.get("sim", name, None if config is None else lambda: SimBoard(name, config))
    if config is not None and not made:
        board.reconfigure(config)
    return board


def remove_board(name: str) -> None:
    """Forget board ``name`` (its flash file, if it has one, keeps what it holds)."""
    board = BOARDS.remove("sim", name)
    if board is not None:
        board.persist()
