"""Flash build artifacts with esptool 5's Python API, on a serial handle the caller keeps open.

The steps (``esptool write-flash``'s, as library calls) and why the port stays open: docs/device.md
"Flashing". esptool (0.05-0.07 s of imports) is imported inside the functions that talk to the ROM
loader, so a run whose board already holds its images (skipped from HELLO hashes) never loads it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO, TypedDict, TypeVar

import serial

from harness.chips import FLASH_BAUD, ROM_BAUD
from harness.device.esptool_log import EsptoolLogSink, capture_esptool_log
from harness.device.ports import PortSpec, Transport, open_port, resolve_port
from harness.device.reset import bootloader_reset
from harness.errors import ExitCode, FlashError

if TYPE_CHECKING:
    from esptool.loader import ESPLoader

BEFORE_MODES = ("auto", "default-reset", "usb-reset", "no-reset", "no-reset-no-sync", "harness-reset")
AFTER_MODES = ("hard-reset", "no-reset", "no-reset-stub", "soft-reset", "watchdog-reset")


# Failures that are the user's choice of board or arguments, not the link or the tools: exit 2.
USAGE_KINDS = ("chip_mismatch", "chip_revision", "usage")
# Failures a retry cannot help: those, and an image larger than the chip's flash.
_FINAL_KINDS = (*USAGE_KINDS, "image_too_large")
# A kind's hint, where it does not depend on the port (FlashFailure's default)
_KIND_HINTS = {
    "chip_mismatch": "wrong board on this port, or wrong --board: pick the board definition for the "
    "attached chip",
    "chip_revision": "pick the board definition built for this silicon (`esp-check boards`; e.g. esp32p4 "
    "for ESP32-P4 before v3, esp32p4-v3 for v3.x): ESP-IDF builds an image for one range of revisions and "
    "the bootloader refuses to start it on another",
    "image_too_large": "the board definition's flash_size is larger than the real flash chip, or the build "
    "is too big: use the matching board file or a smaller partition layout",
    "verify_failed": "the written data did not read back: retry at a lower --flash-baud; persistent "
    "failures mean a flash or power problem",
    "stub_failed": "retry; if it persists, flash at a lower baud",
    "link_lost": "check the USB cable and hub; a board that resets itself under load may have a power "
    "problem",
}


class FlashFailure(FlashError):
    """A flash step failed. ``kind`` says which (table in docs/device.md); ``retryable`` is False
    when trying again cannot help (wrong chip, image too large). A wrong board for the chip (another
    chip, or a revision the board's image does not accept) and bad arguments are usage errors (exit 2),
    never retryable; every other kind is infrastructure (exit 3). ``hint`` defaults to the kind's."""

    def __init__(
        self,
        message: str,
        *,
        kind: str,
        hint: str | None = None,
        retryable: bool | None = None,
        esptool_message: str | None = None,
    ) -> None:
        super().__init__(message, hint=_KIND_HINTS.get(kind) if hint is None else hint)
        self.kind = kind
        self.retryable = kind not in _FINAL_KINDS if retryable is None else retryable
        self.esptool_message = esptool_message
        if kind in USAGE_KINDS:
            self.exit_code = ExitCode.USAGE


@dataclasses.dataclass(frozen=True)
class FlashProgress:
    """One progress event: ``stage`` is connect|stub|baud|attach|write|reset|done."""

    stage: str
    message: str
    region: int | None = None  # index into the artifact list while writing
    offset: int | None = None
    done: int = 0
    total: int = 0


ProgressCallback = Callable[[FlashProgress], None]


@dataclasses.dataclass
class RegionResult:
    offset: int
    path: Path
    size: int
    md5: str
    skipped: bool = False  # esptool found the same bytes in flash (MD5) and wrote nothing
    bytes_written: int = 0  # uncompressed bytes written to flash
    bytes_sent: int = 0  # bytes sent on the wire (compressed when compression helped)
    seconds: float = 0.0
    verified: bool = False  # esptool's MD5 check passed (after the write, or as the skip check)


@dataclasses.dataclass
class FlashResult:
    port: str
    chip: str  # normalized target name, e.g. "esp32s3"
    chip_name: str  # esptool's name, e.g. "ESP32-S3"
    _: dataclasses.KW_ONLY  # the rest by name; what no ROM loader said (a native board) is left out
    description: str | None = None
    revision: str | None = None  # "v0.2"
    features: list[str] = dataclasses.field(default_factory=list)
    mac: str | None = None
    crystal_mhz: int | None = None
    flash_size: str | None = None  # as detected from the flash ID, e.g. "8MB"
    stub: bool = False
    baud: int
    before: str
    after: str
    connect_attempts: int = 0
    regions: list[RegionResult]
    duration_s: float
    log_path: Path | None
    esptool_log: str = dataclasses.field(repr=False, default="")
    serial: serial.SerialBase | None = dataclasses.field(repr=False, compare=False, default=None)
    # why no esptool session ran ("": one did), e.g. the board's HELLO showed it holds every image
    skipped_reason: str = ""

    @property
    def bytes_written(self) -> int:
        return sum(r.bytes_written for r in self.regions)

    def to_dict(self) -> dict[str, object]:
        skip = {"serial", "esptool_log", "regions"}
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in skip}
        d["features"] = list(self.features)
        d["log_path"] = str(self.log_path) if self.log_path else None
        d["regions"] = [{**dataclasses.asdict(r), "path": str(r.path)} for r in self.regions]
        d["bytes_written"] = self.bytes_written
        return d


def normalize_chip(name: str) -> str:
    """ "ESP32-S3" / "esp32-s3" / "esp32s3" -> "esp32s3" (the IDF target spelling)."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


# --- error mapping -----------------------------------------------------------------------------

_BOOT_HINT = (
    "put the chip in download mode by hand: hold BOOT (IO0), press and release EN/RST, release BOOT, "
    "then retry; if that works, the board's DTR/RTS auto-reset circuit (or the USB cable/hub) is the problem"
)


def _fmt_rev(rev: int) -> str:
    return f"v{rev // 100}.{rev % 100}"


# esptool's words -> what failed (then "URL: esptool's first line"), kind
_ESPTOOL_FAILURES = (
    (("requires chip revision",), "the image does not suit the chip on", "chip_revision"),  # image header
    (("will not fit in",), "image does not fit in the flash of the chip on", "image_too_large"),
    (("MD5 of file does not match", "Write failed"), "flash verify failed on", "verify_failed"),
    (("Failed to start stub flasher",), "the flasher stub did not start on", "stub_failed"),
)


def _transport_hint(ps: PortSpec) -> str:
    if ps.transport == Transport.SOCKET:
        return "esptool cannot reset a board over socket://: " + _BOOT_HINT
    if ps.transport == Transport.RFC2217:
        return (
            "the RFC2217 server must be esptool's esp_rfc2217_server (it performs the bootloader reset "
            "itself) and must not be serving another client; " + _BOOT_HINT
        )
    if ps.transport == Transport.PTY:
        return "a pty cannot carry DTR/RTS, so nothing reset the board: " + _BOOT_HINT
    return _BOOT_HINT


def map_esptool_error(exc: BaseException, *, stage: str, ps: PortSpec, boot_log: bytes = b"") -> FlashFailure:
    """Turn an esptool/pyserial failure into a :class:`FlashFailure` with an actionable hint."""
    from esptool.util import FatalError  # only when a flash runs (module docstring)

    msg = str(exc).strip()
    first = msg.splitlines()[0] if msg else type(exc).__name__
    if isinstance(exc, (serial.SerialException, OSError)) and not isinstance(exc, FatalError):
        return FlashFailure(
            f"serial link to {ps.url} lost during {stage}: {first}", kind="link_lost", esptool_message=msg
        )
    m = re.search(r"This chip is (\S+), not (\S+)\.", msg)
    if m:
        return FlashFailure(
            f"the chip on {ps.url} is {m.group(1)}, but {m.group(2)} was expected",
            kind="chip_mismatch",
            esptool_message=msg,
        )
    if "Wrong boot mode detected" in msg:
        mode = re.search(r"\((0x[0-9a-fA-F]+)\)", msg)
        return FlashFailure(
            f"{ps.url}: the chip booted in the wrong mode ({mode.group(1) if mode else '?'}) instead of the "
            "ROM download mode",
            kind="wrong_boot_mode",
            hint=_transport_hint(ps),
            esptool_message=msg,
        )
    for needles, what, kind in _ESPTOOL_FAILURES:
        if any(n in msg for n in needles):
            return FlashFailure(f"{what} {ps.url}: {first}", kind=kind, esptool_message=msg)
    if stage == "connect":
        detail = ""
        if b"Guru Meditation" in boot_log or "Guru Meditation" in msg:
            detail = " (the running app was crashing instead of the ROM bootloader answering)"
        return FlashFailure(
            f"no sync with the ROM bootloader on {ps.url}{detail}: {first}",
            kind="no_sync",
            hint=_transport_hint(ps),
            esptool_message=msg,
        )
    return FlashFailure(
        f"esptool failed during {stage} on {ps.url}: {first}", kind="esptool", esptool_message=msg
    )


# --- the flash run -----------------------------------------------------------------------------


def _resolve_before(before: str, ps: PortSpec, reset_style: str) -> tuple[str, bool]:
    """-> (esptool connect mode, whether we perform the bootloader reset ourselves first)."""
    if before not in BEFORE_MODES:
        raise FlashFailure(f"unknown before-mode {before!r}", kind="usage", hint=f"use one of {BEFORE_MODES}")
    if before == "harness-reset":
        return "no-reset", True
    if before != "auto":
        return before, False
    if ps.transport == Transport.DEVICE and (reset_style == "usb_serial_jtag" or ps.reenumerates):
        return "usb-reset", False
    return ps.caps.esptool_before, ps.caps.harness_reset  # socket://, pty, loop://: nothing can reset


_T = TypeVar("_T")


class _ChipFacts(TypedDict):
    """What the ROM loader says about the chip (FlashResult's fields of the same names)."""

    chip: str
    description: str | None
    revision: str | None
    features: list[str]
    mac: str | None
    crystal_mhz: int | None


def _try(fn: Callable[[], _T]) -> _T | None:
    from esptool.util import FatalError  # only when a flash runs (NotImplementedInROMError is one)

    try:
        return fn()
    except (FatalError, NotImplementedError, AttributeError, KeyError, ValueError, serial.SerialException):
        return None


def _fmt_mac(mac: object) -> str | None:
    if not mac:
        return None
    if isinstance(mac, (tuple, list)) and mac and isinstance(mac[0], int):
        return ":".join(f"{b:02x}" for b in mac)
    return str(mac)


_ROM_BOOT_RE = re.compile(rb"boot:(0x[0-9a-fA-F]+)[^\n]*\n(.*)", re.DOTALL)


def _read_rom_banner(ser: serial.SerialBase) -> bytes:
    """What the ROM printed after our bootloader reset: up to the line after ``boot:0x..``
    (download mode says ``waiting for download`` there), at most 0.3 s. esptool's sync
    discards it, so this is our only chance to tell "wrong boot mode" from "no answer"."""
    got = b""
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:
        waiting = ser.in_waiting
        got += ser.read(waiting) if waiting else b""
        m = _ROM_BOOT_RE.search(got)
        if m and b"\n" in m.group(2):
            break
        time.sleep(0.01)
    return got


def _connect(
    ser: serial.SerialBase,
    ps: PortSpec,
    *,
    chip: str | None,
    mode: str,
    self_reset: bool,
    reset_style: str,
    attempts: int,
    emit: Callable[[FlashProgress], None],
) -> tuple[ESPLoader, int]:
    from esptool.cmds import detect_chip  # only when a flash runs (module docstring)
    from esptool.targets import CHIP_DEFS  # only when a flash runs
    from esptool.util import FatalError  # only when a flash runs

    last: BaseException | None = None
    boot_log = b""
    tries = attempts if self_reset or mode in ("no-reset", "no-reset-no-sync") else 1
    for attempt in range(1, tries + 1):
        emit(FlashProgress("connect", f"connecting to {ps.url} (attempt {attempt}/{tries})"))
        try:
            if not ser.is_open:
                ser.open()
            ser.baudrate = ROM_BAUD
            if self_reset:
                ser.reset_input_buffer()
                bootloader_reset(ser, reset_style)
                boot_log = _read_rom_banner(ser)
            per_try = 1 if tries > 1 else attempts
            if chip:
                esp = CHIP_DEFS[chip](ser, ROM_BAUD)
                esp.connect(mode, per_try)
            else:
                esp = detect_chip(ser, ROM_BAUD, mode, False, per_try)
            return esp, attempt
        except (FatalError, serial.SerialException, OSError) as exc:
            last = exc
            m = re.search(rb"boot:(0x[0-9a-fA-F]+)(.*waiting for download)?", boot_log, re.DOTALL)
            if (
                self_reset
                and m
                and not m.group(2)
                and isinstance(exc, FatalError)
                and "Failed to connect" in str(exc)
            ):
                last = FatalError(
                    f"Wrong boot mode detected ({m.group(1).decode()})! "
                    "The chip needs to be in download mode."
                )
            if isinstance(last, FatalError) and "This chip is" in str(last):
                break  # wrong chip: retrying cannot help
            time.sleep(0.05)
    assert last is not None
    raise map_esptool_error(last, stage="connect", ps=ps, boot_log=boot_log) from last


def _identify(
    esp: ESPLoader, ps: PortSpec, expected_chip: str | None, chip_revisions: tuple[int, int] | None
) -> _ChipFacts:
    """What the ROM says about the chip, after refusing (exit 2, before anything is written) another chip
    than the board's or a revision outside the range its image accepts."""
    detected = normalize_chip(esp.CHIP_NAME)
    if expected_chip and normalize_chip(expected_chip) != detected:
        raise FlashFailure(
            f"the chip on {ps.url} is {esp.CHIP_NAME}, but the board definition says {expected_chip}",
            kind="chip_mismatch",
        )
    rev = _try(esp.get_chip_revision)
    rev = rev if isinstance(rev, int) else None
    # esptool's major * 100 + minor; not checked when unknown (unreadable, or the board does not say)
    if rev is not None and chip_revisions is not None and not chip_revisions[0] <= rev <= chip_revisions[1]:
        low, high = chip_revisions
        raise FlashFailure(
            f"the chip on {ps.url} is {esp.CHIP_NAME} revision {_fmt_rev(rev)}, but the board definition's "
            f"image accepts revisions {_fmt_rev(low)} to {_fmt_rev(high)} only: it would not boot",
            kind="chip_revision",
        )
    crystal = _try(esp.get_crystal_freq)
    return {
        "chip": detected,
        "description": _try(esp.get_chip_description),
        "revision": None if rev is None else _fmt_rev(rev),
        "features": list(_try(esp.get_chip_features) or []),
        "mac": _fmt_mac(_try(esp.read_mac)),
        "crystal_mhz": crystal if isinstance(crystal, int) else None,
    }


def flash_artifacts(
    port: serial.SerialBase | PortSpec | str,
    artifacts: Sequence[tuple[int, Path | str]],
    *,
    chip: str | None = None,
    expected_chip: str | None = None,
    chip_revisions: tuple[int, int] | None = None,
    baud: int = FLASH_BAUD,
    before: str = "auto",
    after: str = "hard-reset",
    reset_style: str = "classic",
    skip_flashed: bool = True,
    diff_with: Sequence[Path | str | None] | None = None,
    connect_attempts: int = 7,
    console_baud: int | None = None,
    progress: ProgressCallback | None = None,
    log_path: Path | None = None,
    port_spec: PortSpec | None = None,
) -> FlashResult:
    """Write ``artifacts`` ((offset, file) pairs, e.g. from ``BuildResult.artifacts``) to the board.

    ``port``: an *open* pyserial object (best: the one the capture will read), a PortSpec or a port
    string (opened ``exclusive=True``, left open in ``FlashResult.serial``). ``chip`` forces esptool's
    chip class; ``expected_chip`` and ``chip_revisions`` (the board's) are checked before anything is
    written. ``before``: an esptool connect mode or ``auto``; ``after``: an esptool reset mode
    (``no-reset-stub`` when the capture resets into the app). ``console_baud``: the baud to switch
    to after a hard reset, so the app's first line is read at the right rate.
    """
    from esptool.cmds import attach_flash, detect_flash_size, reset_chip, run_stub  # a flash runs
    from esptool.util import FatalError  # only when a flash runs

    t0 = time.monotonic()
    regions = _regions(artifacts, after)
    if isinstance(port, serial.SerialBase):
        ser = port
        ps = port_spec or resolve_port(str(port.port))
    else:
        ps = port if isinstance(port, PortSpec) else resolve_port(port)
        ser = open_port(ps, ROM_BAUD, exclusive=True)
    chip_cls = _chip_class(chip)
    mode, self_reset = _resolve_before(before, ps, reset_style)
    log = _FlashLog(log_path, progress, [r.offset for r in regions])
    stage = "connect"
    try:
        with capture_esptool_log(log):
            esp, attempts_used = _connect(
                ser, ps, chip=chip_cls, mode=mode, self_reset=self_reset, reset_style=reset_style,
                attempts=max(1, connect_attempts), emit=log.emit,
            )  # fmt: skip
            facts = _identify(esp, ps, expected_chip, chip_revisions)
            stage = "stub"
            log.emit(FlashProgress("stub", "uploading the flasher stub"))
            esp = run_stub(esp)
            stage = "baud"
            _change_baud(esp, ps, baud, log.emit)
            stage = "attach"
            attach_flash(esp)
            flash_size = _try(lambda: detect_flash_size(esp))
            _check_fits(regions, flash_size, ps)
            stage = "write"
            diffs = list(diff_with or ())  # rewrite only changed sectors; without them, MD5-skip
            for i, r in enumerate(regions):
                log.region = i
                diff = diffs[i] if i < len(diffs) else None
                _write_region(esp, r, skip_flashed=skip_flashed and not diffs, diff=diff)
            log.region = None
            stage = "reset"
            log.emit(FlashProgress("reset", f"after flashing: {after}"))
            reset_chip(esp, after)
            if after == "hard-reset" and console_baud:
                ser.baudrate = console_baud
            result = FlashResult(
                port=ps.url,
                chip_name=esp.CHIP_NAME,
                **facts,
                flash_size=flash_size,
                stub=bool(getattr(esp, "IS_STUB", False)),
                baud=baud if ps.caps.baud_change else ROM_BAUD,
                before=mode if not self_reset else f"harness-reset+{mode}",
                after=after,
                connect_attempts=attempts_used,
                regions=regions,
                duration_s=time.monotonic() - t0,
                log_path=log_path,
                esptool_log=log.text(),
                serial=ser,
            )
            skipped = sum(r.skipped for r in regions)
            done = f"{result.bytes_written} bytes written, {skipped}/{len(regions)} regions already in flash"
            log.emit(FlashProgress("done", done))
    except (FatalError, serial.SerialException, OSError) as exc:  # a FlashFailure is none of them
        raise map_esptool_error(exc, stage=stage, ps=ps) from exc
    finally:
        log.close()
    return result


def _regions(artifacts: Sequence[tuple[int, Path | str]], after: str) -> list[RegionResult]:
    """One result per file to write, with the MD5 esptool's skip check compares; FlashFailure(usage) for
    anything a flash cannot start with."""
    if after not in AFTER_MODES:
        raise FlashFailure(f"unknown after-mode {after!r}", kind="usage", hint=f"use {AFTER_MODES}")
    items = [(int(off), Path(p)) for off, p in artifacts]
    if not items:
        raise FlashFailure("nothing to flash: the artifact list is empty", kind="usage")
    for off, path in items:
        if not path.is_file():
            raise FlashFailure(
                f"artifact {path} (offset {off:#x}) does not exist",
                kind="usage",
                hint="build the project first (esp-check build)",
            )
    return [
        RegionResult(
            offset=off,
            path=path,
            size=path.stat().st_size,
            md5=hashlib.md5(path.read_bytes(), usedforsecurity=False).hexdigest(),
        )
        for off, path in items
    ]


def _chip_class(chip: str | None) -> str | None:
    """esptool's chip key for a forced ``chip``; None means detect."""
    if not chip:
        return None
    from esptool.targets import CHIP_DEFS  # only when a flash runs (module docstring)

    key = normalize_chip(chip)
    if key not in CHIP_DEFS:
        raise FlashFailure(f"esptool does not know chip {chip!r}", kind="usage")
    return key


class _FlashLog(EsptoolLogSink):
    """The flash log file (esptool's output plus our stage lines) and progress events per region."""

    def __init__(self, path: Path | None, progress: ProgressCallback | None, offsets: list[int]) -> None:
        file: TextIO | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        super().__init__(stream=file)
        self.on_event = progress
        self.offsets = offsets
        self.region: int | None = None

    def emit(self, ev: FlashProgress) -> None:
        if self._stream is not None and ev.stage != "write":
            self._stream.write(f"[esp-check] {ev.stage}: {ev.message}\n")
            self._stream.flush()
        if self.on_event is not None:
            self.on_event(ev)

    def progress(self, current: int, total: int, prefix: str) -> None:
        idx = self.region
        off = self.offsets[idx] if idx is not None else None
        desc = prefix.strip() or "writing"
        self.emit(FlashProgress("write", desc, region=idx, offset=off, done=current, total=total))

    def close(self) -> None:
        self.flush()
        if self._stream is not None:
            self._stream.close()


def _change_baud(esp: ESPLoader, ps: PortSpec, baud: int, emit: Callable[[FlashProgress], None]) -> None:
    """Switch to the flashing baud where the transport can (RFC2217 can, a raw socket cannot)."""
    if not baud or baud == ROM_BAUD:
        return
    from esptool.util import NotImplementedInROMError  # only when a flash runs

    if ps.caps.baud_change:
        emit(FlashProgress("baud", f"changing baud to {baud}"))
        with contextlib.suppress(NotImplementedInROMError):
            esp.change_baud(baud)
    else:
        emit(FlashProgress("baud", f"{ps.transport} cannot change the board's baud; staying at {ROM_BAUD}"))


def _check_fits(regions: Sequence[RegionResult], flash_size: str | None, ps: PortSpec) -> None:
    """FlashFailure(image_too_large) before writing a region past the end of the chip's flash."""
    from esptool.util import flash_size_bytes  # only when a flash runs (module docstring)

    flash_bytes = flash_size_bytes(flash_size) if flash_size else None
    if flash_bytes is None:
        return
    for r in regions:
        if r.offset + r.size > flash_bytes:
            raise FlashFailure(
                f"{r.path.name} ({r.size} bytes at {r.offset:#x}) does not fit in the "
                f"{flash_size} flash of the chip on {ps.url}",
                kind="image_too_large",
            )


def _write_region(esp: ESPLoader, r: RegionResult, *, skip_flashed: bool, diff: Path | str | None) -> None:
    """One ``write_flash`` call per region, counting what esptool actually sends (by wrapping the
    loader's begin calls on this instance) so skipped regions and bytes written are facts, not
    parsed log text."""
    from esptool.cmds import write_flash  # only when a flash runs (module docstring)

    calls: list[tuple[int, int]] = []
    orig_defl = esp.flash_defl_begin
    orig_plain = esp.flash_begin

    def defl_begin(size: int, compsize: int, offset: int, *a: object, **kw: object) -> object:
        calls.append((size, compsize))
        return orig_defl(size, compsize, offset, *a, **kw)

    def plain_begin(size: int, offset: int, *a: object, **kw: object) -> object:
        calls.append((size, size))
        return orig_plain(size, offset, *a, **kw)

    esp.flash_defl_begin = defl_begin
    esp.flash_begin = plain_begin
    t = time.monotonic()
    try:
        kwargs: dict[str, object] = {"compress": True}
        if diff is not None:
            kwargs["diff_with"] = [str(diff)]
        elif skip_flashed:
            kwargs["skip_flashed"] = True
        write_flash(esp, [(r.offset, str(r.path))], **kwargs)
    finally:
        del esp.flash_defl_begin
        del esp.flash_begin
    r.seconds = time.monotonic() - t
    r.skipped = not calls
    r.bytes_written = sum(c[0] for c in calls)
    r.bytes_sent = sum(c[1] for c in calls)
    r.verified = True  # write_flash raises on an MD5 mismatch; a skip is itself an MD5 match
