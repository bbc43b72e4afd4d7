"""Board definitions: data in ``boards/*.toml``, validated into :class:`Board`.

Boards are data so a user can add one without touching code: ``load_board`` accepts a built-in name
or a path to a TOML file. Every problem is a :class:`BoardDefinitionError` naming the file and the field.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import AfterValidator, Field, ValidationError

from harness.chips import BOARD_CHIPS, CHIPS
from harness.errors import BoardDefinitionError
from harness.resources import boards_dir, idf_support, version_tuple
from harness.userfiles import UserModel, field_path, known_keys, problem

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

Psram = Literal["none", "quad", "octal", "hex"]
Console = Literal["uart", "usb_serial_jtag"]
ResetStyle = Literal["classic", "usb_serial_jtag"]
EspnnPath = Literal["generic", "s3", "p4"]
Builder = Literal["pio", "idf", "sim", "native"]
FlashSize = Literal["2MB", "4MB", "8MB", "16MB", "32MB"]
PSRAM_KINDS: tuple[str, ...] = get_args(Psram)
CONSOLES: tuple[str, ...] = get_args(Console)
RESET_STYLES: tuple[str, ...] = get_args(ResetStyle)
ESPNN_PATHS: tuple[str, ...] = get_args(EspnnPath)
BUILDERS: tuple[str, ...] = get_args(Builder)
FLASH_SIZES: tuple[str, ...] = get_args(FlashSize)
NATIVE_BITS = (32, 64)

# Where the partition table goes unless a board says otherwise. ESP-IDF's default 0x8000 leaves the
# ESP32-P4 bootloader (at 0x2000) about 1.4 KB of headroom; esp-tflite-micro's examples moved the table
# to 0xc000 on every target for that reason, and so do we. The layout after it (partitions.csv.j2):
# nvs from the table's next sector up to the app at APP_OFFSET.
DEFAULT_PARTITION_TABLE_OFFSET = 0xC000
APP_OFFSET = 0x10000
MIN_NVS_BYTES = 0x3000  # ESP-IDF's documented minimum for a read-write NVS partition
PARTITION_TABLE_BYTES = 0x1000  # one sector (the table itself is at most 0xC00 bytes)
# What a board may add to sdkconfig.defaults: Kconfig names only, values restricted to y/n/ints/quoted.
_SDKCONFIG_NAME = re.compile(r"^CONFIG_[A-Z0-9_]+$")
_SDKCONFIG_VALUE = re.compile(r'^(y|n|-?[0-9]+|0x[0-9a-fA-F]+|"[A-Za-z0-9_.:/ -]*")$')
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_CHIP_REV = re.compile(r"^([0-9]{1,2})\.([0-9]{1,2})$")


def _known_chip(chip: str) -> str:
    if chip not in BOARD_CHIPS:
        raise ValueError(f"is {chip!r}; expected one of: {', '.join(BOARD_CHIPS)}")
    return chip


Baud = Annotated[int, Field(ge=9600, le=5_000_000, description="a baud rate")]
Text = Annotated[str, Field(max_length=200)]


class NativeTable(UserModel):
    """``[native]`` of a native board (builder = "native")."""

    bits: Literal[32, 64] = Field(64, description="word size of the host program")


class BoardFile(UserModel):
    """A board file (``boards/*.toml``) as written; :func:`parse_board` checks the combinations."""

    name: Annotated[str, Field(pattern=_NAME.pattern, description="lower-case, digits, - _ .")]
    description: Text
    chip: Annotated[str, AfterValidator(_known_chip), Field(json_schema_extra={"enum": list(BOARD_CHIPS)})]
    pio_board: Annotated[str, Field(pattern=r"^([a-z0-9][a-z0-9_.-]{0,63})?$")]
    flash_size: FlashSize
    psram: Psram
    psram_mb: Annotated[int, Field(ge=0, le=64)]
    internal_ram_arena_kb: Annotated[int, Field(ge=8, le=1024, description="largest arena in internal RAM")]
    console: Console
    flash_baud: Baud
    monitor_baud: Baud
    reset: ResetStyle
    cpu_mhz: Annotated[int, Field(gt=0)]
    espnn_path: EspnnPath
    builder: Builder
    simulated: bool = False
    default_port: Annotated[str, Field(pattern=r"^[\x21-\x7e]{1,200}$")] | None = None
    sdkconfig: dict[str, str] = Field(default_factory=dict, description="extra sdkconfig.defaults lines")
    # simulator settings (the sim:// URL parameters; validated by harness.sim)
    sim: dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,31}$")], str | int | float | bool] = Field(
        default_factory=dict
    )
    native: NativeTable | None = None
    idf_min: str | None = Field(None, description="oldest ESP-IDF this board needs, MAJOR.MINOR.PATCH")
    chip_rev_min: str | None = Field(None, description='chip revisions the image accepts, "major.minor"')
    chip_rev_max: str | None = None
    partition_table_offset: int = DEFAULT_PARTITION_TABLE_OFFSET
    psram_memtest: bool = Field(False, description="ESP-IDF's PSRAM memory test at every boot (costs time)")
    link_baud: Baud = Field(921600, description="the resident loop's top baud after HELLO (UART consoles)")


@dataclass(frozen=True)
class Board:
    """One board type: what the generated firmware and the build need to know about it."""

    name: str
    description: str
    chip: str  # IDF target
    pio_board: str  # PlatformIO board id ("" when the board cannot build with PlatformIO)
    flash_size: str  # "4MB", "8MB", ...
    psram: str  # none | quad | octal | hex
    psram_mb: int
    internal_ram_arena_kb: int  # largest arena placed in internal RAM
    console: str  # uart | usb_serial_jtag
    flash_baud: int
    monitor_baud: int
    reset: str  # classic | usb_serial_jtag
    cpu_mhz: int
    espnn_path: str  # generic | s3 | p4: which ESP-NN code the optimized build runs
    builder: str  # pio | idf | sim
    simulated: bool  # (the defaults of every field are BoardFile's)
    default_port: str | None
    sdkconfig: dict[str, str]
    sim: dict[str, str | int | float | bool]
    idf_min: str | None  # raises harness/data/versions.toml's minimum for this board
    chip_rev_min: int | None  # esptool's major * 100 + minor
    chip_rev_max: int | None
    partition_table_offset: int
    native: dict[str, int]
    psram_memtest: bool  # CONFIG_SPIRAM_MEMTEST: off unless the board asks for it
    link_baud: int  # the resident loop switches to this after HELLO (UART consoles only)
    source: Path | None = None

    @property
    def is_native(self) -> bool:
        """Built for the host PC and run as a program (docs/native.md), not flashed to a chip."""
        return self.builder == "native"

    @property
    def native_bits(self) -> int:
        return int(self.native.get("bits", 64))

    @property
    def has_psram(self) -> bool:
        return self.psram != "none"

    @property
    def cores(self) -> int:
        return CHIPS[self.chip].cores

    @property
    def bootloader_offset(self) -> int:
        return CHIPS[self.chip].bootloader_offset

    @property
    def flash_bytes(self) -> int:
        return int(self.flash_size[:-2]) * 1024 * 1024

    @property
    def idf_range(self) -> tuple[str, str]:
        """(oldest, first unsupported) ESP-IDF version for this board's firmware."""
        low, below = idf_support()
        if self.idf_min is not None and version_tuple(self.idf_min) > version_tuple(low):
            low = self.idf_min
        return low, below

    @property
    def chip_revisions(self) -> tuple[int, int] | None:
        """(min, max) chip revision as major * 100 + minor, or None when the board does not say."""
        if self.chip_rev_min is None or self.chip_rev_max is None:
            return None
        return self.chip_rev_min, self.chip_rev_max

    def to_dict(self) -> dict[str, object]:
        """JSON-friendly view (``esp-check boards --json`` and manifests): every field but ``source``,
        chip revisions written as in the file, and the ESP-IDF range after ``idf_min``."""
        out: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.startswith("chip_rev_"):
                value = format_chip_rev(value)
            if f.name != "source":
                out[f.name] = dict(value) if isinstance(value, dict) else value
            if f.name == "idf_min":
                out["idf_range"] = list(self.idf_range)
        return out


def format_chip_rev(rev: int | None) -> str | None:
    """esptool's ``major * 100 + minor`` as ``"major.minor"`` (None stays None)."""
    return None if rev is None else f"{rev // 100}.{rev % 100}"


def _err(path: Path, fieldname: str, msg: str, hint: str | None = None) -> BoardDefinitionError:
    return BoardDefinitionError(
        f"board file {path}: field '{fieldname}' {msg}",
        hint=hint or "fix the field (see docs/firmware.md, 'Board definitions', for every field)",
    )


def _check_hardware(path: Path, f: BoardFile) -> None:
    """Field combinations the chip and the tools cannot have (PSRAM kind, clocks, builder, ESP-NN path)."""
    chip = f.chip
    if f.cpu_mhz not in CHIPS[chip].max_mhz:
        allowed = ", ".join(str(m) for m in CHIPS[chip].max_mhz)
        raise _err(path, "cpu_mhz", f"is {f.cpu_mhz}; the maximum for {chip} is {allowed} MHz")
    if f.psram == "none" and f.psram_mb != 0:
        raise _err(path, "psram_mb", 'must be 0 when psram = "none"')
    if f.psram != "none" and f.psram_mb < 1:
        raise _err(path, "psram_mb", f"is {f.psram_mb}; expected 1..64 for a board with PSRAM")
    if f.psram == "octal" and chip != "esp32s3":
        raise _err(path, "psram", f"octal PSRAM exists only on esp32s3 modules, not {chip}")
    if f.psram == "hex" and chip != "esp32p4":
        raise _err(path, "psram", f"hex PSRAM exists only on esp32p4, not {chip}")
    if f.psram_memtest and f.psram == "none":
        raise _err(path, "psram_memtest", 'is true, but the board has no PSRAM (psram = "none")')
    if f.builder == "pio" and not f.pio_board:
        raise _err(path, "pio_board", 'is empty but builder = "pio" needs a PlatformIO board id')
    if chip == "esp32p4" and f.builder == "pio":
        raise _err(
            path,
            "builder",
            'is "pio", but platform-espressif32 6.13.0 cannot build esp32p4',
            hint='use builder = "idf" (ESP-IDF idf.py) for ESP32-P4 boards',
        )
    if f.espnn_path == "s3" and chip != "esp32s3":
        raise _err(
            path, "espnn_path", f'is "s3" but the chip is {chip}: ESP-NN\'s S3 assembly runs only there'
        )
    if f.espnn_path == "p4" and chip != "esp32p4":
        raise _err(path, "espnn_path", f'is "p4" but the chip is {chip}')
    if chip in ("esp32s3", "esp32p4") and f.espnn_path == "generic":
        raise _err(path, "espnn_path", f'is "generic" but ESP-NN always builds its {chip} path for {chip}')
    if f.console == "usb_serial_jtag" and not CHIPS[chip].usb_serial_jtag:
        raise _err(path, "console", f"{chip} has no USB-Serial-JTAG peripheral")
    if (f.builder == "sim") != f.simulated:
        raise _err(path, "simulated", 'must be true exactly when builder = "sim"')
    if f.sim and not f.simulated:
        raise _err(path, "sim", 'is only allowed for simulated boards (builder = "sim")')


def parse_board(data: dict[str, object], path: Path) -> Board:
    """Validate one decoded board TOML table; ``path`` is only used in error messages."""
    try:
        f = BoardFile.model_validate(data)
    except ValidationError as exc:
        loc, msg = problem(
            exc, BoardFile, {"": "is not a known board field", "native": "is not a native setting"}
        )
        name, entry = field_path(loc)
        hint = known_keys(BoardFile, loc) if "not a" in msg else None
        raise _err(path, name, entry + msg, hint) from None
    _check_hardware(path, f)
    for key, value in f.sdkconfig.items():
        if not _SDKCONFIG_NAME.match(key):
            raise _err(path, f"sdkconfig.{key}", "is not a Kconfig symbol name (CONFIG_[A-Z0-9_]+)")
        if not _SDKCONFIG_VALUE.match(value):
            raise _err(
                path, f"sdkconfig.{key}", f'has an unsupported value {value!r} (y, n, a number or "text")'
            )
    _check_idf_min(path, f.idf_min)
    _check_partition_table_offset(path, f)
    rev_min, rev_max = _chip_revs(path, f)
    settings = f.model_dump(exclude={"native", "chip_rev_min", "chip_rev_max"})
    return Board(
        **settings,
        chip_rev_min=rev_min,
        chip_rev_max=rev_max,
        native=_native_table(path, f),
        source=path,
    )


def _native_table(path: Path, f: BoardFile) -> dict[str, int]:
    """The ``[native]`` table: only for builder = "native", whose ESP-NN path must be the generic C one."""
    if f.builder != "native":
        if f.native is not None:
            raise _err(path, "native", 'is only allowed for native boards (builder = "native")')
        return {}
    if f.espnn_path != "generic":
        raise _err(
            path,
            "espnn_path",
            f'is "{f.espnn_path}" but a native build runs only ESP-NN\'s generic C kernels on the host',
            hint='use espnn_path = "generic" with chip = "esp32", "esp32c3" or "esp32c6"',
        )
    return {"bits": (f.native or NativeTable()).bits}


def _check_idf_min(path: Path, idf_min: str | None) -> None:
    if idf_min is None:
        return
    below = idf_support()[1]  # a minimum below esp-check's own is allowed and has no effect
    try:
        wanted = version_tuple(idf_min)
    except ValueError:
        raise _err(path, "idf_min", f"is {idf_min!r}; expected MAJOR.MINOR.PATCH, e.g. 5.5.2") from None
    if not wanted < version_tuple(below):
        raise _err(
            path,
            "idf_min",
            f"is {idf_min}, but esp-check's firmware supports ESP-IDF below {below} only",
            hint="see harness/data/versions.toml for why",
        )


def _chip_revs(path: Path, f: BoardFile) -> tuple[int | None, int | None]:
    given = {"chip_rev_min": f.chip_rev_min, "chip_rev_max": f.chip_rev_max}
    if f.chip_rev_min is None and f.chip_rev_max is None:
        return None, None
    revs: list[int] = []
    for key, value in given.items():
        if value is None:
            raise _err(path, key, "is missing (give both chip_rev_min and chip_rev_max, or neither)")
        m = _CHIP_REV.match(value)
        if m is None or int(m.group(2)) > 99:
            raise _err(path, key, f'is {value!r}; expected a chip revision such as "3.0" or "1.99"')
        revs.append(int(m.group(1)) * 100 + int(m.group(2)))
    if revs[0] > revs[1]:
        raise _err(path, "chip_rev_max", f"is {f.chip_rev_max}, below chip_rev_min {f.chip_rev_min}")
    return revs[0], revs[1]


def _check_partition_table_offset(path: Path, f: BoardFile) -> None:
    offset = f.partition_table_offset
    boot = CHIPS[f.chip].bootloader_offset
    highest = APP_OFFSET - PARTITION_TABLE_BYTES - MIN_NVS_BYTES
    if offset % 0x1000 or not 0x8000 <= offset <= highest or offset <= boot:
        raise _err(
            path,
            "partition_table_offset",
            f"is {offset:#x}; expected a 4 KB-aligned offset from 0x8000 to {highest:#x} (the table is "
            f"followed by nvs, at least {MIN_NVS_BYTES:#x} bytes, before the app at {APP_OFFSET:#x})",
        )


def load_board_file(path: Path) -> Board:
    """Load and validate one board TOML file."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise BoardDefinitionError(
            f"cannot read board file {path}: {exc.strerror or exc}", hint="check the path"
        ) from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise BoardDefinitionError(
            f"board file {path} is not valid TOML: {exc}", hint="fix the TOML syntax"
        ) from exc
    return parse_board(data, path)


def list_boards(directory: Path | None = None) -> list[Board]:
    """All board definitions in ``directory`` (default: the built-in ``boards/``), sorted by name."""
    folder = directory or boards_dir()
    boards = [load_board_file(p) for p in sorted(folder.glob("*.toml"))]
    for b in boards:
        if b.source is not None and b.source.stem != b.name:
            raise BoardDefinitionError(
                f"board file {b.source}: field 'name' is {b.name!r} but the file is named {b.source.name}",
                hint=f"rename the file to {b.name}.toml or fix the name",
            )
    return boards


def load_board(name_or_path: str | Path | Board) -> Board:
    """A board by built-in name (``esp32s3-devkitc-1-n8r8``) or by path to a ``.toml`` file."""
    if isinstance(name_or_path, Board):  # convenience for API callers passing a Board through
        return name_or_path
    text = str(name_or_path)
    path = Path(text)
    if text.endswith(".toml") or path.is_file():
        return load_board_file(path)
    if not _NAME.match(text):
        raise BoardDefinitionError(
            f"{text!r} is not a board name or a .toml file", hint="see `esp-check boards`"
        )
    candidate = boards_dir() / f"{text}.toml"
    if not candidate.is_file():
        known = ", ".join(b.stem for b in sorted(boards_dir().glob("*.toml")))
        raise BoardDefinitionError(
            f"unknown board {text!r}", hint=f"known boards: {known}; or pass a path to a board .toml file"
        )
    return load_board_file(candidate)
