"""Board definitions: data in ``boards/*.toml``, validated into :class:`Board`.

Boards are data so a user can add one without touching code: ``load_board`` accepts a built-in name
or a path to a TOML file. Every problem is a :class:`BoardDefinitionError` naming the file and the field.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import BoardDefinitionError
from harness.resources import boards_dir, idf_support, version_tuple

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

CHIPS = ("esp32", "esp32s2", "esp32s3", "esp32c3", "esp32c6", "esp32p4")
PSRAM_KINDS = ("none", "quad", "octal", "hex")
CONSOLES = ("uart", "usb_serial_jtag")
RESET_STYLES = ("classic", "usb_serial_jtag")
ESPNN_PATHS = ("generic", "s3", "p4")
BUILDERS = ("pio", "idf", "sim", "native")
NATIVE_BITS = (32, 64)
FLASH_SIZES = ("2MB", "4MB", "8MB", "16MB", "32MB")

# Facts per chip that are not board choices: second-stage bootloader offset (ESP-IDF's
# BOOTLOADER_OFFSET_IN_FLASH default, esptool's chip table) and number of cores. Used only as a
# fallback when a resolved sdkconfig does not say.
BOOTLOADER_OFFSETS: dict[str, int] = {
    "esp32": 0x1000,
    "esp32s2": 0x1000,
    "esp32s3": 0x0,
    "esp32c3": 0x0,
    "esp32c6": 0x0,
    "esp32p4": 0x2000,
}
CHIP_CORES: dict[str, int] = {
    "esp32": 2,
    "esp32s2": 1,
    "esp32s3": 2,
    "esp32c3": 1,
    "esp32c6": 1,
    "esp32p4": 2,
}
# Highest CPU frequency each chip's Kconfig offers (P4: 360 before silicon v3, 400 from v3).
CHIP_MAX_MHZ: dict[str, tuple[int, ...]] = {
    "esp32": (240,),
    "esp32s2": (240,),
    "esp32s3": (240,),
    "esp32c3": (160,),
    "esp32c6": (160,),
    "esp32p4": (360, 400),
}
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
_PIO_BOARD = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_CHIP_REV = re.compile(r"^([0-9]{1,2})\.([0-9]{1,2})$")

_FIELDS: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "description": str,
    "chip": str,
    "pio_board": str,
    "flash_size": str,
    "psram": str,
    "psram_mb": int,
    "internal_ram_arena_kb": int,
    "console": str,
    "flash_baud": int,
    "monitor_baud": int,
    "reset": str,
    "cpu_mhz": int,
    "espnn_path": str,
    "builder": str,
}
_OPTIONAL: dict[str, type | tuple[type, ...]] = {
    "simulated": bool,
    "default_port": str,
    "sdkconfig": dict,
    "sim": dict,  # simulator settings (same keys as sim:// URL parameters; validated by harness.sim)
    "native": dict,  # native target settings (builder = "native"): bits = 32 | 64
    "idf_min": str,  # oldest ESP-IDF this board needs, when newer than harness/data/versions.toml's
    "chip_rev_min": str,  # chip revisions the built image accepts ("major.minor"), checked at flash time
    "chip_rev_max": str,
    "partition_table_offset": int,
    "psram_memtest": bool,  # run ESP-IDF's PSRAM memory test at every boot (default: off, it costs boot time)
    "link_baud": int,  # the resident loop's top baud after HELLO (UART consoles; default 921600)
}


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
    simulated: bool = False
    default_port: str | None = None
    sdkconfig: dict[str, str] = field(default_factory=dict)
    sim: dict[str, str | int | float | bool] = field(default_factory=dict)
    idf_min: str | None = None  # raises harness/data/versions.toml's minimum for this board
    chip_rev_min: int | None = None  # esptool's major * 100 + minor
    chip_rev_max: int | None = None
    partition_table_offset: int = DEFAULT_PARTITION_TABLE_OFFSET
    native: dict[str, int] = field(default_factory=dict)
    psram_memtest: bool = False  # CONFIG_SPIRAM_MEMTEST: off unless the board asks for it
    link_baud: int = 921600  # the resident loop switches to this after HELLO (UART consoles only)
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
        return CHIP_CORES[self.chip]

    @property
    def bootloader_offset(self) -> int:
        return BOOTLOADER_OFFSETS[self.chip]

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

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly view (``esp-check boards --json`` and manifests)."""
        return {
            "name": self.name,
            "description": self.description,
            "chip": self.chip,
            "pio_board": self.pio_board,
            "flash_size": self.flash_size,
            "psram": self.psram,
            "psram_mb": self.psram_mb,
            "internal_ram_arena_kb": self.internal_ram_arena_kb,
            "console": self.console,
            "flash_baud": self.flash_baud,
            "monitor_baud": self.monitor_baud,
            "reset": self.reset,
            "cpu_mhz": self.cpu_mhz,
            "espnn_path": self.espnn_path,
            "builder": self.builder,
            "simulated": self.simulated,
            "default_port": self.default_port,
            "sdkconfig": dict(self.sdkconfig),
            "sim": dict(self.sim),
            "idf_min": self.idf_min,
            "idf_range": list(self.idf_range),
            "chip_rev_min": format_chip_rev(self.chip_rev_min),
            "chip_rev_max": format_chip_rev(self.chip_rev_max),
            "partition_table_offset": self.partition_table_offset,
            "native": dict(self.native),
            "psram_memtest": self.psram_memtest,
            "link_baud": self.link_baud,
        }


def format_chip_rev(rev: int | None) -> str | None:
    """esptool's ``major * 100 + minor`` as ``"major.minor"`` (None stays None)."""
    return None if rev is None else f"{rev // 100}.{rev % 100}"


def _err(path: Path, fieldname: str, msg: str, hint: str | None = None) -> BoardDefinitionError:
    return BoardDefinitionError(
        f"board file {path}: field '{fieldname}' {msg}",
        hint=hint or "fix the field (see docs/firmware.md, 'Board definitions', for every field)",
    )


def _choice(path: Path, data: dict[str, Any], key: str, allowed: tuple[str, ...]) -> None:
    if data[key] not in allowed:
        raise _err(path, key, f"is {data[key]!r}; expected one of: {', '.join(allowed)}")


def _check_hardware(path: Path, data: dict[str, Any], chip: str) -> None:
    """Field combinations the chip and the tools cannot have (PSRAM kind, clocks, builder, ESP-NN path)."""
    if data["cpu_mhz"] not in CHIP_MAX_MHZ[chip]:
        allowed = ", ".join(str(m) for m in CHIP_MAX_MHZ[chip])
        raise _err(path, "cpu_mhz", f"is {data['cpu_mhz']}; the maximum for {chip} is {allowed} MHz")
    if data["psram"] == "none" and data["psram_mb"] != 0:
        raise _err(path, "psram_mb", 'must be 0 when psram = "none"')
    if data["psram"] != "none" and not 1 <= data["psram_mb"] <= 64:
        raise _err(path, "psram_mb", f"is {data['psram_mb']}; expected 1..64 for a board with PSRAM")
    if data["psram"] == "octal" and chip != "esp32s3":
        raise _err(path, "psram", f"octal PSRAM exists only on esp32s3 modules, not {chip}")
    if data["psram"] == "hex" and chip != "esp32p4":
        raise _err(path, "psram", f"hex PSRAM exists only on esp32p4, not {chip}")
    if data.get("psram_memtest") and data["psram"] == "none":
        raise _err(path, "psram_memtest", 'is true, but the board has no PSRAM (psram = "none")')
    if not 8 <= data["internal_ram_arena_kb"] <= 1024:
        raise _err(path, "internal_ram_arena_kb", f"is {data['internal_ram_arena_kb']}; expected 8..1024")
    for key in ("flash_baud", "monitor_baud", "link_baud"):
        if key in data and not 9600 <= data[key] <= 5_000_000:
            raise _err(path, key, f"is {data[key]}; expected a baud rate between 9600 and 5000000")
    if data["builder"] == "pio" and not data["pio_board"]:
        raise _err(path, "pio_board", 'is empty but builder = "pio" needs a PlatformIO board id')
    if data["pio_board"] and not _PIO_BOARD.match(data["pio_board"]):
        raise _err(path, "pio_board", f"{data['pio_board']!r} is not a PlatformIO board id")
    if data["chip"] == "esp32p4" and data["builder"] == "pio":
        raise _err(
            path,
            "builder",
            'is "pio", but platform-espressif32 6.13.0 cannot build esp32p4',
            hint='use builder = "idf" (ESP-IDF idf.py) for ESP32-P4 boards',
        )
    if data["espnn_path"] == "s3" and chip != "esp32s3":
        raise _err(
            path, "espnn_path", f'is "s3" but the chip is {chip}: ESP-NN\'s S3 assembly runs only there'
        )
    if data["espnn_path"] == "p4" and chip != "esp32p4":
        raise _err(path, "espnn_path", f'is "p4" but the chip is {chip}')
    if chip in ("esp32s3", "esp32p4") and data["espnn_path"] == "generic":
        raise _err(path, "espnn_path", f'is "generic" but ESP-NN always builds its {chip} path for {chip}')
    if data["console"] == "usb_serial_jtag" and chip in ("esp32", "esp32s2"):
        raise _err(path, "console", f"{chip} has no USB-Serial-JTAG peripheral")


def parse_board(data: dict[str, Any], path: Path) -> Board:
    """Validate one decoded board TOML table; ``path`` is only used in error messages."""
    unknown = sorted(set(data) - set(_FIELDS) - set(_OPTIONAL))
    if unknown:
        raise _err(path, unknown[0], "is not a known board field", hint=f"known fields: {', '.join(_FIELDS)}")
    for key in _FIELDS:
        if key not in data:
            raise _err(path, key, "is missing")
    for key, typ in {**_FIELDS, **_OPTIONAL}.items():
        if key not in data:
            continue
        value = data[key]
        if typ is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise _err(path, key, f"must be an integer, got {value!r}")
        if not isinstance(value, typ):
            raise _err(path, key, f"must be of type {getattr(typ, '__name__', typ)}, got {value!r}")
    if not _NAME.match(data["name"]):
        raise _err(path, "name", f"{data['name']!r} is not a valid board name (lower-case, digits, - _ .)")
    _choice(path, data, "chip", CHIPS)
    _choice(path, data, "psram", PSRAM_KINDS)
    _choice(path, data, "console", CONSOLES)
    _choice(path, data, "reset", RESET_STYLES)
    _choice(path, data, "espnn_path", ESPNN_PATHS)
    _choice(path, data, "builder", BUILDERS)
    _choice(path, data, "flash_size", FLASH_SIZES)
    chip = data["chip"]
    _check_hardware(path, data, chip)
    simulated = bool(data.get("simulated", False))
    if (data["builder"] == "sim") != simulated:
        raise _err(path, "simulated", 'must be true exactly when builder = "sim"')
    sdkconfig = _sdkconfig_table(path, data.get("sdkconfig", {}))
    sim_table = data.get("sim", {})
    if sim_table and not simulated:
        raise _err(path, "sim", 'is only allowed for simulated boards (builder = "sim")')
    for key, value in sim_table.items():
        if not re.match(r"^[a-z][a-z0-9_]{0,31}$", key) or not isinstance(value, (str, int, float, bool)):
            raise _err(path, f"sim.{key}", f"must be a simple value under a lower-case key, got {value!r}")
    if data.get("default_port") is not None and not re.match(r"^[\x21-\x7e]{1,200}$", data["default_port"]):
        raise _err(path, "default_port", "must be a port name or URL without spaces")
    _check_idf_min(path, data)
    rev_min, rev_max = _chip_revs(path, data)
    pt_offset = _partition_table_offset(path, data)
    return Board(
        name=data["name"],
        description=data["description"],
        chip=chip,
        pio_board=data["pio_board"],
        flash_size=data["flash_size"],
        psram=data["psram"],
        psram_mb=data["psram_mb"],
        internal_ram_arena_kb=data["internal_ram_arena_kb"],
        console=data["console"],
        flash_baud=data["flash_baud"],
        monitor_baud=data["monitor_baud"],
        reset=data["reset"],
        cpu_mhz=data["cpu_mhz"],
        espnn_path=data["espnn_path"],
        builder=data["builder"],
        simulated=simulated,
        default_port=data.get("default_port"),
        sdkconfig=sdkconfig,
        sim=dict(sim_table),
        idf_min=data.get("idf_min"),
        chip_rev_min=rev_min,
        chip_rev_max=rev_max,
        partition_table_offset=pt_offset,
        native=_native_table(path, data),
        psram_memtest=bool(data.get("psram_memtest", False)),
        link_baud=int(data.get("link_baud", 921600)),
        source=path,
    )


def _sdkconfig_table(path: Path, sdk: dict[str, Any]) -> dict[str, str]:
    """The ``[sdkconfig]`` table: Kconfig names with y / n / number / quoted-text values."""
    sdkconfig: dict[str, str] = {}
    for key, value in sdk.items():
        if not _SDKCONFIG_NAME.match(key):
            raise _err(path, f"sdkconfig.{key}", "is not a Kconfig symbol name (CONFIG_[A-Z0-9_]+)")
        if not isinstance(value, str) or not _SDKCONFIG_VALUE.match(value):
            raise _err(
                path, f"sdkconfig.{key}", f'has an unsupported value {value!r} (y, n, a number or "text")'
            )
        sdkconfig[key] = value
    return sdkconfig


def _native_table(path: Path, data: dict[str, Any]) -> dict[str, int]:
    """The ``[native]`` table: only for builder = "native", whose ESP-NN path must be the generic C one."""
    table = data.get("native", {})
    if data["builder"] != "native":
        if table:
            raise _err(path, "native", 'is only allowed for native boards (builder = "native")')
        return {}
    if data["espnn_path"] != "generic":
        raise _err(
            path,
            "espnn_path",
            f'is "{data["espnn_path"]}" but a native build runs only ESP-NN\'s generic C kernels on the host',
            hint='use espnn_path = "generic" with chip = "esp32", "esp32c3" or "esp32c6"',
        )
    unknown = sorted(set(table) - {"bits"})
    if unknown:
        raise _err(path, f"native.{unknown[0]}", "is not a native setting", hint="known: bits")
    bits = table.get("bits", 64)
    if isinstance(bits, bool) or bits not in NATIVE_BITS:
        raise _err(path, "native.bits", f"is {bits!r}; expected 32 or 64")
    return {"bits": int(bits)}


def _check_idf_min(path: Path, data: dict[str, Any]) -> None:
    if "idf_min" not in data:
        return
    below = idf_support()[1]  # a minimum below esp-check's own is allowed and has no effect
    try:
        wanted = version_tuple(data["idf_min"])
    except ValueError:
        raise _err(
            path, "idf_min", f"is {data['idf_min']!r}; expected MAJOR.MINOR.PATCH, e.g. 5.5.2"
        ) from None
    if not wanted < version_tuple(below):
        raise _err(
            path,
            "idf_min",
            f"is {data['idf_min']}, but esp-check's firmware supports ESP-IDF below {below} only",
            hint="see harness/data/versions.toml for why",
        )


def _chip_revs(path: Path, data: dict[str, Any]) -> tuple[int | None, int | None]:
    present = [k for k in ("chip_rev_min", "chip_rev_max") if k in data]
    if not present:
        return None, None
    if len(present) == 1:
        other = "chip_rev_max" if present[0] == "chip_rev_min" else "chip_rev_min"
        raise _err(path, other, "is missing (give both chip_rev_min and chip_rev_max, or neither)")
    revs: list[int] = []
    for key in ("chip_rev_min", "chip_rev_max"):
        m = _CHIP_REV.match(data[key])
        if m is None or int(m.group(2)) > 99:
            raise _err(path, key, f'is {data[key]!r}; expected a chip revision such as "3.0" or "1.99"')
        revs.append(int(m.group(1)) * 100 + int(m.group(2)))
    if revs[0] > revs[1]:
        raise _err(
            path, "chip_rev_max", f"is {data['chip_rev_max']}, below chip_rev_min {data['chip_rev_min']}"
        )
    return revs[0], revs[1]


def _partition_table_offset(path: Path, data: dict[str, Any]) -> int:
    offset = int(data.get("partition_table_offset", DEFAULT_PARTITION_TABLE_OFFSET))
    boot = BOOTLOADER_OFFSETS[data["chip"]]
    highest = APP_OFFSET - PARTITION_TABLE_BYTES - MIN_NVS_BYTES
    if offset % 0x1000 or not 0x8000 <= offset <= highest or offset <= boot:
        raise _err(
            path,
            "partition_table_offset",
            f"is {offset:#x}; expected a 4 KB-aligned offset from 0x8000 to {highest:#x} (the table is "
            f"followed by nvs, at least {MIN_NVS_BYTES:#x} bytes, before the app at {APP_OFFSET:#x})",
        )
    return offset


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
