"""Board definitions: data in ``boards/*.toml``, validated into :class:`Board`.

Boards are data so a user can add one without touching code: ``load_board`` accepts a built-in name
or a path to a TOML file. Every problem is a :class:`BoardDefinitionError` naming the file and the field.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, get_args

from harness.chips import CHIPS
from harness.errors import BoardDefinitionError
from harness.firmware.board_types import NAME_PATTERN, Builder
from harness.resources import (
    boards_dir,
    cache_entry,
    code_digest,
    idf_support,
    load_stored,
    parse_toml,
    store_json,
    version_tuple,
)

if TYPE_CHECKING:
    from pydantic import ValidationError

    from harness.firmware.board_file import BoardFile

BUILDERS: tuple[str, ...] = get_args(Builder)

APP_OFFSET = 0x10000
MIN_NVS_BYTES = 0x3000  # ESP-IDF's documented minimum for a read-write NVS partition
PARTITION_TABLE_BYTES = 0x1000  # one sector (the table itself is at most 0xC00 bytes)
# What a board may add to sdkconfig.defaults: Kconfig names only, values restricted to y/n/ints/quoted.
_SDKCONFIG_NAME = re.compile(r"CONFIG_[A-Z0-9_]+")
_SDKCONFIG_VALUE = re.compile(r'^(y|n|-?[0-9]+|0x[0-9a-fA-F]+|"[A-Za-z0-9_.:/ -]*")$')
_NAME = re.compile(NAME_PATTERN)
_CHIP_REV = re.compile(r"([0-9]{1,2})\.([0-9]{1,2})")


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

    def __post_init__(self) -> None:  # a Board made through the API never met the board-file validation
        if self.chip not in CHIPS:
            raise BoardDefinitionError(
                f"board {self.name!r}: unknown chip {self.chip!r}; known chips: {', '.join(CHIPS)}",
                hint="name an ESP-IDF target esp-check knows (see docs/firmware.md, 'Board definitions')",
            )

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
        for name, value in vars(self).items():  # the fields, in order
            if name.startswith("chip_rev_"):
                value = format_chip_rev(value)
            if name != "source":
                out[name] = dict(value) if isinstance(value, dict) else value
            if name == "idf_min":
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


def _check_hardware(path: Path, board_file: BoardFile) -> None:
    """Field combinations the chip and the tools cannot have (PSRAM kind, clocks, builder, ESP-NN path)."""
    chip = board_file.chip
    if board_file.cpu_mhz not in CHIPS[chip].max_mhz:
        allowed = ", ".join(str(m) for m in CHIPS[chip].max_mhz)
        raise _err(path, "cpu_mhz", f"is {board_file.cpu_mhz}; the maximum for {chip} is {allowed} MHz")
    if board_file.psram == "none" and board_file.psram_mb != 0:
        raise _err(path, "psram_mb", 'must be 0 when psram = "none"')
    if board_file.psram != "none" and board_file.psram_mb < 1:
        raise _err(path, "psram_mb", f"is {board_file.psram_mb}; expected 1..64 for a board with PSRAM")
    if board_file.psram == "octal" and chip != "esp32s3":
        raise _err(path, "psram", f"octal PSRAM exists only on esp32s3 modules, not {chip}")
    if board_file.psram == "hex" and chip != "esp32p4":
        raise _err(path, "psram", f"hex PSRAM exists only on esp32p4, not {chip}")
    if board_file.psram_memtest and board_file.psram == "none":
        raise _err(path, "psram_memtest", 'is true, but the board has no PSRAM (psram = "none")')
    if board_file.builder == "pio" and not board_file.pio_board:
        raise _err(path, "pio_board", 'is empty but builder = "pio" needs a PlatformIO board id')
    if chip == "esp32p4" and board_file.builder == "pio":
        raise _err(
            path,
            "builder",
            'is "pio", but platform-espressif32 6.13.0 cannot build esp32p4',
            hint='use builder = "idf" (ESP-IDF idf.py) for ESP32-P4 boards',
        )
    if board_file.espnn_path == "s3" and chip != "esp32s3":
        raise _err(
            path, "espnn_path", f'is "s3" but the chip is {chip}: ESP-NN\'s S3 assembly runs only there'
        )
    if board_file.espnn_path == "p4" and chip != "esp32p4":
        raise _err(path, "espnn_path", f'is "p4" but the chip is {chip}')
    if chip in ("esp32s3", "esp32p4") and board_file.espnn_path == "generic":
        raise _err(path, "espnn_path", f'is "generic" but ESP-NN always builds its {chip} path for {chip}')
    if board_file.console == "usb_serial_jtag" and not CHIPS[chip].usb_serial_jtag:
        raise _err(path, "console", f"{chip} has no USB-Serial-JTAG peripheral")
    if (board_file.builder == "sim") != board_file.simulated:
        raise _err(path, "simulated", 'must be true exactly when builder = "sim"')
    if board_file.sim and not board_file.simulated:
        raise _err(path, "sim", 'is only allowed for simulated boards (builder = "sim")')


def parse_board(data: dict[str, object], path: Path) -> Board:
    """Validate one decoded board TOML table; ``path`` is only used in error messages."""
    # lazy: pydantic (~60 ms) validates a board file once; a repeat run reads its stored form
    from harness.firmware.board_file import BoardFile  # lazy: imports pydantic
    from harness.userfiles import field_path, problem, validated  # lazy: imports pydantic

    def error(exc: ValidationError) -> BoardDefinitionError:
        loc, msg, hint = problem(
            exc, BoardFile, {"": "is not a known board field", "native": "is not a native setting"}
        )
        name, entry = field_path(loc)
        return _err(path, name, entry + msg, hint)

    f = validated(BoardFile, data, error)
    _check_hardware(path, f)
    for key, value in f.sdkconfig.items():
        if not _SDKCONFIG_NAME.fullmatch(key):
            raise _err(path, f"sdkconfig.{key}", "is not a Kconfig symbol name (CONFIG_[A-Z0-9_]+)")
        if not _SDKCONFIG_VALUE.fullmatch(value):
            raise _err(
                path, f"sdkconfig.{key}", f'has an unsupported value {value!r} (y, n, a number or "text")'
            )
    _check_idf_min(path, f.idf_min)
    _check_partition_table_offset(path, f)
    rev_min, rev_max = _chip_revs(path, f)
    settings = f.model_dump(exclude={"native", "chip_rev_min", "chip_rev_max"})
    return Board(
        **settings, chip_rev_min=rev_min, chip_rev_max=rev_max, native=_native_table(path, f), source=path
    )


def _native_table(path: Path, board_file: BoardFile) -> dict[str, int]:
    """The ``[native]`` table: only for builder = "native", whose ESP-NN path must be the generic C one."""
    if board_file.builder != "native":
        if board_file.native is not None:
            raise _err(path, "native", 'is only allowed for native boards (builder = "native")')
        return {}
    if board_file.espnn_path != "generic":
        raise _err(
            path,
            "espnn_path",
            f'is "{board_file.espnn_path}" but a native build runs only ESP-NN\'s generic C kernels'
            " on the host",
            hint='use espnn_path = "generic" with chip = "esp32", "esp32c3" or "esp32c6"',
        )
    bits = board_file.native.bits if board_file.native is not None else 64  # NativeTable's default
    return {"bits": bits}


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


def _chip_revs(path: Path, board_file: BoardFile) -> tuple[int | None, int | None]:
    given = {"chip_rev_min": board_file.chip_rev_min, "chip_rev_max": board_file.chip_rev_max}
    if board_file.chip_rev_min is None and board_file.chip_rev_max is None:
        return None, None
    revs: list[int] = []
    for key, value in given.items():
        if value is None:
            raise _err(path, key, "is missing (give both chip_rev_min and chip_rev_max, or neither)")
        m = _CHIP_REV.fullmatch(value)
        if m is None:
            raise _err(path, key, f'is {value!r}; expected a chip revision such as "3.0" or "1.99"')
        revs.append(int(m.group(1)) * 100 + int(m.group(2)))
    if revs[0] > revs[1]:
        raise _err(
            path,
            "chip_rev_max",
            f"is {board_file.chip_rev_max}, below chip_rev_min {board_file.chip_rev_min}",
        )
    return revs[0], revs[1]


def _check_partition_table_offset(path: Path, board_file: BoardFile) -> None:
    offset = board_file.partition_table_offset
    boot = CHIPS[board_file.chip].bootloader_offset
    highest = APP_OFFSET - PARTITION_TABLE_BYTES - MIN_NVS_BYTES
    if offset % 0x1000 or not 0x8000 <= offset <= highest or offset <= boot:
        raise _err(
            path,
            "partition_table_offset",
            f"is {offset:#x}; expected a 4 KB-aligned offset from 0x8000 to {highest:#x} (the table is "
            f"followed by nvs, at least {MIN_NVS_BYTES:#x} bytes, before the app at {APP_OFFSET:#x})",
        )


def load_board_file(path: Path) -> Board:
    """Load and validate one board TOML file (a file validated before is read from its stored form)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise BoardDefinitionError(
            f"cannot read board file {path}: {exc.strerror or exc}", hint="check the path"
        ) from exc
    digest = hashlib.sha256(raw).hexdigest()
    stored = load_stored(_board_entry(digest), lambda doc: Board(**doc, source=path), sha256=digest)
    if stored is not None:
        return stored
    try:
        data = parse_toml(raw.decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError or TOMLDecodeError
        raise BoardDefinitionError(
            f"board file {path} is not valid TOML: {exc}", hint="fix the TOML syntax"
        ) from exc
    board = parse_board(data, path)
    _store_board(digest, board)
    return board


# A validated board file is kept for the next process (``board-files`` in the cache dir), keyed by the
# file's SHA-256 and by everything validation depends on (:func:`_validator_id`): this code, the model,
# the chip table, versions.toml and the pydantic version. A repeat CLI run then imports no pydantic
# (0.06-0.08 s of CPU). Only files that passed are stored: a refusal is validated again, so its
# message is the current code's. A damaged or foreign entry is ignored (validated again).
_BOARD_FORMAT = 1
_BOARD_MAX = 256
_VALIDATOR_FILES = ("boards.py", "board_file.py", "../userfiles.py", "../chips.py", "../data/versions.toml")


@functools.cache
def _validator_id() -> str:
    here = Path(__file__).resolve().parent
    return code_digest(f"format {_BOARD_FORMAT}", here, _VALIDATOR_FILES, ("pydantic", "pydantic-core"))


def _board_entry(digest: str) -> Path:
    return cache_entry("board-files", digest, _validator_id())


def _store_board(digest: str, board: Board) -> None:
    """Keep ``board`` for the next process; a cache that cannot be written is only slower."""
    doc = {name: value for name, value in vars(board).items() if name != "source"}
    with contextlib.suppress(OSError):  # (the validator's sources unreadable: no store, only slower)
        store_json(_board_entry(digest), {"sha256": digest, **doc}, _BOARD_MAX)


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
    """A board by built-in name (``esp32s3-devkitc-1-n8r8``) or by path to a ``.toml`` file: a board file's
    name ends in .toml, so a bare name is never a file of that name in the working directory."""
    if isinstance(name_or_path, Board):  # convenience for API callers passing a Board through
        return name_or_path
    text = str(name_or_path)
    if text.endswith(".toml"):
        return load_board_file(Path(text))
    candidate = boards_dir() / f"{text}.toml"
    if _NAME.fullmatch(text) and candidate.is_file():
        return load_board_file(candidate)
    known = ", ".join(b.stem for b in sorted(boards_dir().glob("*.toml")))
    what = f"{text!r} is a file, but a board file's name must end in .toml" if Path(text).is_file() else ""
    raise BoardDefinitionError(
        what or f"unknown board {text!r}", hint=f"known boards: {known}; or pass a path to a board .toml file"
    )
