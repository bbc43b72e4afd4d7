"""Bench inventories (``--inventory BENCH.toml``): the physical boards and how to reach them.

Each ``[[board]]`` has a unique name, a board type, its console and exactly one way to reach it (a
port, a USB serial number or location, or a labgrid place). Fields and format: docs/ci.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, StringConstraints, ValidationError

from harness.chips import CHIPS, ROM_BAUD
from harness.device.labgrid import CONSOLE_TAG, TYPE_TAG, LabgridClient, place_key
from harness.device.locks import lock_key
from harness.device.ports import PortCandidate, PortSpec, list_candidates, open_port, resolve_port
from harness.device.reset import hard_reset_into_app
from harness.errors import EspCheckError, PlanError, PortError
from harness.firmware.board_types import Console
from harness.firmware.boards import Board, list_boards, load_board
from harness.flows.targets import RealTarget, open_target, target_class
from harness.inprocess import NAME_RE
from harness.resources import read_toml
from harness.runner.plan import At, Name
from harness.userfiles import UserModel, field_path, problem, validated

_REACH_KEYS = ("port", "usb_serial", "usb_location", "place")
Reach = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]


class BoardEntry(UserModel):
    """One ``[[board]]`` table as written: exactly one of port / usb_serial / usb_location / place."""

    name: Name
    type: str = Field(min_length=1, description="a board type from `esp-check boards`, or a .toml path")
    console: Console | None = Field(None, description="the connector in use (default: the board type's)")
    port: Reach | None = Field(None, description="/dev/serial/by-id/..., rfc2217://, socket://, sim://")
    usb_serial: Reach | None = None
    usb_location: Reach | None = Field(None, description="USB port path such as 1-1.2")
    place: Reach | None = Field(None, description="a labgrid place")
    power_cycle: tuple[Annotated[str, Field(min_length=1)], ...] = Field(
        (), strict=False, description="argv list, run without a shell"
    )
    power_cycle_timeout_s: float = Field(60.0, gt=0)


class LabgridTable(UserModel):
    """``[labgrid]``: the coordinator of the inventory's places."""

    coordinator: Reach = Field(description="HOST:PORT")


class InventoryFile(UserModel):
    """A bench inventory (``--inventory BENCH.toml``) as written. Format: docs/ci.md ("Inventory file")."""

    schema_version: Literal[1] = 1
    labgrid: LabgridTable | None = None
    board: list[BoardEntry] = Field(min_length=1)


@dataclass(frozen=True)
class BenchBoard:
    """One physical (or simulated) board on the bench."""

    name: str
    type: str  # board type name or path, as written
    board: Board  # with the console override applied
    port: str | None = None
    usb_serial: str | None = None
    usb_location: str | None = None
    power_cycle: tuple[str, ...] = ()
    power_cycle_timeout_s: float = BoardEntry.model_fields["power_cycle_timeout_s"].default
    place: str | None = None  # a labgrid place ...
    coordinator: str | None = None  # ... on this labgrid coordinator (host:port)

    @property
    def simulated(self) -> bool:
        return self.board.simulated

    @property
    def can_power_cycle(self) -> bool:
        """A power-cycle command, or a labgrid place (labgrid says whether it has a power resource)."""
        return bool(self.power_cycle) or self.place is not None

    def reach(self) -> tuple[str, str]:
        """(field, value) of how the board is reached; two boards may not share one."""
        for key in _REACH_KEYS:
            value = getattr(self, key)
            if value:
                return key, value
        raise ValueError(f"board {self.name} has no port")

    def describe_port(self) -> str:
        if self.place:
            return f"labgrid place {self.place} ({self.coordinator})"
        if self.port:
            return self.port
        if self.usb_serial:
            return f"USB serial {self.usb_serial}"
        return f"USB location {self.usb_location}"

    def resolve(self) -> PortSpec:
        """The :class:`harness.device.ports.PortSpec` to open now (USB boards are looked up again).

        A labgrid place has no port before it is acquired: see :class:`harness.device.labgrid.PlaceLease`.
        """
        if self.place:
            raise PortError(f"board {self.name} is labgrid place {self.place}: acquire it first")
        if self.port:  # the target's URL (a sim:// one gets the board type's chip, reset and flash)
            return resolve_port(open_target(self.board, self.port).port_url, self.board)
        cands = list_candidates()
        if self.usb_serial:
            found = [c for c in cands if c.serial_number == self.usb_serial]
            what = f"USB serial number {self.usb_serial}"
        else:
            # pyserial reports "1-1.4:1.0" (port path:configuration.interface); either form matches
            found = [
                c for c in cands if c.location and self.usb_location in (c.location, c.location.split(":")[0])
            ]
            what = f"USB location {self.usb_location}"
        if len(found) != 1:
            listing = "\n".join(f"  {c.label()}" for c in cands) or "  (no serial ports)"
            raise PortError(
                f"board {self.name}: {len(found)} serial devices have {what}. Ports seen:\n{listing}",
                hint="is it plugged in? `esp-check bench detect` lists serial numbers and locations",
            )
        return dataclasses.replace(resolve_port(found[0].device, self.board), usb=found[0])

    def run_power_cycle(self) -> tuple[bool, str]:
        """Run the power-cycle command (argv, no shell). Returns (ok, output/explanation)."""
        if not self.power_cycle:
            return False, "no power_cycle command"
        try:
            proc = subprocess.run(
                list(self.power_cycle),
                capture_output=True,
                text=True,
                timeout=self.power_cycle_timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, f"power_cycle {self.power_cycle[0]} failed: {exc}"
        out = (proc.stdout + proc.stderr).strip()[-2000:]
        return proc.returncode == 0, f"exit {proc.returncode}: {out}"


@dataclass(frozen=True)
class Inventory:
    path: Path
    boards: tuple[BenchBoard, ...]

    def by_name(self, name: str) -> BenchBoard:
        for b in self.boards:
            if b.name == name:
                return b
        raise KeyError(name)


class _At(At):
    kind = "inventory"
    hint = "see docs/ci.md ('Inventory file'); `esp-check bench detect` prints a starting point"


def load_inventory(path: str | Path, *, coordinator: str | None = None) -> Inventory:
    """Read and validate an inventory; raises PlanError (exit 2) naming file, board and field.

    ``coordinator`` (``run --labgrid``) overrides the file's ``[labgrid] coordinator`` for its places.
    """
    p = Path(path)
    data = read_toml(p, "inventory", "docs/examples/bench.toml")
    file = validated(InventoryFile, data, lambda exc: _inventory_error(p, data, exc))
    coordinator = coordinator or (file.labgrid.coordinator if file.labgrid else None)
    boards: dict[str, BenchBoard] = {}  # by the board lock each takes
    for entry in file.board:
        board = _bench_board(p, entry, {b.name for b in boards.values()}, coordinator)
        key, value = board.reach()
        ident = _identity(board)
        if ident in boards:
            other = boards[ident]
            raise _At(p, f"board {board.name!r}").err(
                key,
                f"{value!r} is also used by board {other.name!r} ({'='.join(other.reach())}): both are "
                f"board lock {ident}",
                "one physical board appears once in an inventory",
            )
        boards[ident] = board
    return Inventory(path=p, boards=tuple(boards.values()))


def _identity(board: BenchBoard) -> str:
    """The board lock an entry takes (``lock_key``, docs/ci.md "Board locks"), as far as the attached
    USB devices show now; a USB board not attached now is its field and value."""
    key, value = board.reach()
    if key == "place":
        return place_key(value)
    if key == "port":
        return lock_key(value)
    with contextlib.suppress(PortError):  # not attached: no identity to compare but the value
        return lock_key(board.resolve())
    return f"{key}={value}"


def discover_inventory(coordinator: str) -> Inventory:
    """The boards of a labgrid lab: every place tagged ``esp_check_type=<board type>``.

    ``esp-check run PLAN --labgrid HOST:PORT`` without ``--inventory`` (docs/ci.md "A lab on labgrid").
    """
    client = LabgridClient(coordinator)
    where = Path(f"labgrid-{coordinator}")
    boards: list[BenchBoard] = []
    for name in client.places():
        info = client.show(name)
        btype = info.tags.get(TYPE_TAG)
        if not btype:
            continue
        tab = {"name": _place_board_name(name), "type": btype, "place": name}
        if CONSOLE_TAG in info.tags:
            tab["console"] = info.tags[CONSOLE_TAG]
        data = {"board": [tab]}
        entry = validated(InventoryFile, data, partial(_inventory_error, where, data)).board[0]
        boards.append(_bench_board(where, entry, {b.name for b in boards}, coordinator))
    if not boards:
        raise PlanError(
            f"labgrid coordinator {coordinator} has no place tagged {TYPE_TAG}=<board type>",
            hint=f"tag each board's place: labgrid-client -x {coordinator} -p PLACE set-tags "
            f"{TYPE_TAG}=esp32s3-devkitc-1-n8r8 (or pass --inventory with place = ... entries)",
        )
    return Inventory(path=where, boards=tuple(boards))


def _place_board_name(place: str) -> str:
    """The inventory name of a discovered place: the place name, made a valid board name."""
    name = "".join(c if c.isascii() and (c.isalnum() or c in "_.-") else "_" for c in place)[:64]
    if NAME_RE.fullmatch(name) and name == place:
        return name
    digest = hashlib.sha256(place.encode()).hexdigest()[:8]
    return f"place-{name.strip('._-')[:40]}-{digest}".replace("--", "-")


_UNKNOWN = {
    "": "is not an inventory field",
    "board": "is not a board field",
    "labgrid": "is not a labgrid setting",
}
_POWER_CYCLE_HINT = 'e.g. power_cycle = ["uhubctl", "-l", "1-1", "-p", "2", "-a", "cycle"]'


def _inventory_error(inventory_path: Path, data: Mapping[str, object], exc: ValidationError) -> PlanError:
    """The first problem pydantic found, as "inventory FILE: WHERE: field 'F' ..."."""
    loc, msg, hint = problem(exc, InventoryFile, _UNKNOWN)
    if loc[0] == "board" and len(loc) > 2:
        name, entry = field_path(loc[2:])
        return _At.entry(inventory_path, data, loc).err(
            name, entry + msg, _POWER_CYCLE_HINT if name == "power_cycle" else hint
        )
    if loc[0] == "board":
        return _At(inventory_path, "top level").err(
            "board", f"{msg}: list the bench's boards as [[board]] tables"
        )
    name, entry = field_path(loc)
    where = "[labgrid]" if loc[0] == "labgrid" else "top level"
    return _At(inventory_path, where).err(name.rpartition(".")[2], entry + msg, hint)


def _bench_board(
    inventory_path: Path, entry: BoardEntry, seen: set[str], coordinator: str | None
) -> BenchBoard:
    """One ``[[board]]`` table: board type and console, how to reach it (a labgrid place on
    ``coordinator``), its power cycle."""
    at = _At(inventory_path, f"board {entry.name!r}")
    if entry.name in seen:
        raise at.err("name", "is used twice; board names must be unique")
    board = _board_type(at, entry)
    key, value = _reach(at, entry, board)
    if key == "place" and not coordinator:
        raise at.err(
            "place",
            "needs a labgrid coordinator",
            'give `--labgrid HOST:PORT` or `[labgrid] coordinator = "HOST:PORT"` in the inventory',
        )
    return BenchBoard(
        name=entry.name,
        type=entry.type,
        board=board,
        port=value if key == "port" else None,
        usb_serial=value if key == "usb_serial" else None,
        usb_location=value if key == "usb_location" else None,
        place=value if key == "place" else None,
        coordinator=coordinator if key == "place" else None,
        power_cycle=entry.power_cycle,
        power_cycle_timeout_s=entry.power_cycle_timeout_s,
    )


def _board_type(at: At, entry: BoardEntry) -> Board:
    """The board type (built-in name or .toml relative to the inventory), with its console applied."""
    with at.wrap("type", f"names an unknown board type {entry.type!r}"):
        board = load_board(at.board_ref(entry.type))
    console = entry.console or board.console
    if console == "usb_serial_jtag" and not CHIPS[board.chip].usb_serial_jtag:
        raise at.err("console", f"is usb_serial_jtag but the {board.chip} has no USB-Serial-JTAG")
    if console == board.console:
        return board
    # another console connector of the same board type (an ESP32-S3-DevKitC-1 has UART and USB-JTAG)
    return dataclasses.replace(
        board, console=console, reset="usb_serial_jtag" if console == "usb_serial_jtag" else "classic"
    )


def _reach(at: At, entry: BoardEntry, board: Board) -> tuple[str, str]:
    """Exactly one of port / usb_serial / usb_location / place, checked: (field, value)."""
    reach = {k: v for k in _REACH_KEYS if (v := getattr(entry, k)) is not None}
    if len(reach) != 1:
        got = sorted(reach) or "none"
        raise at.err("port", f"needs exactly one of port / usb_serial / usb_location / place (got {got})")
    key, value = next(iter(reach.items()))
    scheme = value.split("://", 1)[0].lower() if "://" in value else ""
    if key == "port" and value.lower() == "auto":
        raise at.err("port", "cannot be 'auto' on a bench: name the board's port")
    if key == "port" and scheme not in ("", "rfc2217", "socket", "sim", "native"):
        raise at.err(
            "port",
            f"uses unsupported URL scheme {scheme}://",
            "use rfc2217://, socket://, sim:// or native://",
        )
    refused = target_class(board).refuse_reach(board, key, value)  # what the kind of board takes
    if refused is not None:
        raise at.err(key, *refused)
    return key, value


# ---- bench detect ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DetectedDevice(PortCandidate):
    """One attached serial device for ``esp-check bench detect``: the port's facts, then (maybe) its chip."""

    chip: str | None = None
    chip_note: str | None = None

    def to_dict(self) -> dict[str, object]:
        d = dataclasses.asdict(self)
        del d["vid"], d["pid"]
        return {**d, "vid_pid": self.vid_pid}


def detect_devices(*, probe_chip: bool = False, only_known: bool = False) -> list[DetectedDevice]:
    """Attached serial devices (pyserial list_ports), optionally asking each for its chip.

    The chip probe runs esptool's detection (it resets the board into the ROM loader and back);
    a port another program holds is skipped, never stolen.
    """
    out: list[DetectedDevice] = []
    for c in list_candidates():
        if only_known and c.kind is None:
            continue
        chip, note = _probe_chip(c.device, c.is_usb_serial_jtag) if probe_chip else (None, None)
        out.append(DetectedDevice(**dataclasses.asdict(c), chip=chip, chip_note=note))
    return out


def _probe_chip(device: str, usb_jtag: bool) -> tuple[str | None, str | None]:
    # lazy: device.flash (~13 ms, rich) and esptool below, only for `bench detect --probe-chip`
    from harness.device.flash import normalize_chip

    try:
        ser = open_port(resolve_port(device), ROM_BAUD)
    except PortError as exc:
        return None, f"skipped: {exc.message}"
    style = "usb_serial_jtag" if usb_jtag else "classic"
    try:
        import esptool.cmds  # lazy: only a chip probe talks to the ROM loader

        esp = esptool.cmds.detect_chip(ser, ROM_BAUD, "usb-reset" if usb_jtag else "default-reset", False, 3)
        name = normalize_chip(str(getattr(esp, "CHIP_NAME", "")))
        with contextlib.suppress(Exception):
            hard_reset_into_app(ser, style)  # leave the board running its app again
        return name, None
    except Exception as exc:  # esptool raises its own FatalError/SerialException types
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return None, f"no answer from the ROM loader: {first}"
    finally:
        with contextlib.suppress(Exception):
            ser.close()


def inventory_snippet(devices: Sequence[DetectedDevice]) -> str:
    """A ``[[board]]`` TOML snippet per device (stable by-id path, else the USB serial number)."""
    by_chip: dict[str, str] = {}
    with contextlib.suppress(EspCheckError):
        for b in list_boards():
            if target_class(b) is RealTarget:  # a detected device is a real board
                by_chip.setdefault(b.chip, b.name)
    lines = ["# generated by `esp-check bench detect`: check each type and console before use"]
    for n, d in enumerate(devices, 1):
        lines += ["", "[[board]]", f'name = "board{n}"']
        btype = by_chip.get(d.chip or "", "FILL-ME")
        note = "" if d.chip else "  # chip not probed: pick a type from `esp-check boards`"
        lines.append(f'type = "{btype}"{note}')
        lines.append(f'console = "{"usb_serial_jtag" if d.is_usb_serial_jtag else "uart"}"')
        # a JSON string (its non-ASCII characters as they are) is a TOML basic string
        if d.device.startswith("/dev/serial/by-id/") or not d.serial_number:
            lines.append(f"port = {json.dumps(d.device, ensure_ascii=False)}")
        else:
            lines.append(f"usb_serial = {json.dumps(d.serial_number, ensure_ascii=False)}")
        lines.append(f"# {d.kind or d.description}; location {d.location or '?'}")
    return "\n".join(lines) + "\n"
