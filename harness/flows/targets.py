"""Targets: where a job runs. One class per kind of board, behind one interface, as pytest-embedded's
``Dut`` subclasses and labgrid's drivers are; the flows ask the target, they never branch on the kind.

The four targets and what each owns: docs/architecture.md "Targets".
"""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar
from urllib.parse import urlsplit, urlunsplit

from harness.device.locks import board_lock
from harness.device.ports import RAW_TCP_SIMULATOR, RAW_TCP_SIMULATOR_HINT, check_present, resolve_port
from harness.errors import EspCheckError, UsageError
from harness.firmware.boards import Board
from harness.firmware.native.project import NATIVE_MEANING
from harness.flows.records import NativeFacts, Recorder, VariantRun

if TYPE_CHECKING:
    from harness.flows.job import JobOptions

# a board's lock, held for a ``with`` block (what it yields is nobody's business)
BoardLockCM = contextlib.AbstractContextManager[object]


class Target:
    """A board kind. ``port_url`` is the port this job uses; ``private`` when the board was made for
    this job alone (nobody else can reach it: no lock)."""

    kind: ClassVar[str] = ""
    meaning: ClassVar[str] = ""  # what its results are, in reports: "" (a real chip), SIMULATED, NATIVE
    expects_sim: ClassVar[bool] = False  # what the device's BEGIN record must say (sim=1 or not)
    # how a bench inventory reaches it: URL schemes, "" (a device path or USB id), "place" (labgrid)
    reach: ClassVar[tuple[str, ...]] = ()

    def __init__(self, board: Board, port_url: str, *, private: bool = False) -> None:
        self.board, self.port_url, self.private = board, port_url, private

    @classmethod
    def claims(cls, board: Board, port: str | None) -> bool:
        raise NotImplementedError

    @classmethod
    def make(cls, board: Board, port: str | None) -> Target:
        """The target on ``port`` (None: the board kind's default); UsageError for a port it cannot use."""
        raise NotImplementedError

    @classmethod
    def refuse_reach(cls, board: Board, key: str, value: str) -> tuple[str, str] | None:
        """Why a bench inventory cannot reach a board of this kind by ``key = value`` (``port``,
        ``usb_serial``, ``usb_location`` or ``place``): (what is wrong, how to fix it), or None."""
        kind = "place" if key == "place" else (_scheme(value) if key == "port" else "")
        if kind in cls.reach:
            return cls.check_url(value) if key == "port" else None
        return cls.refusal(board, kind)

    @classmethod
    def refusal(cls, board: Board, kind: str) -> tuple[str, str]:
        """What is wrong with reaching this kind of board by ``kind`` (not one of its ``reach``)."""
        if kind == "native":
            return (
                f"is a native:// URL but board type {board.name} is not a native board",
                "a native board (builder = native) runs on a native://NAME port, and only there",
            )
        if kind == "sim":
            return f"is a sim:// URL but board type {board.name} is not simulated", "name the board's port"
        return f"cannot reach a {cls.kind} board", "see docs/ci.md, 'Inventory'"

    @classmethod
    def check_url(cls, url: str) -> tuple[str, str] | None:
        """A port URL this kind takes, checked further (None: fine)."""
        return None

    def check(self, rec: Recorder) -> None:
        """Before anything is built: the port exists (a real port that is missing fails in seconds, not
        after two builds that take minutes on a fresh machine)."""
        ps = rec.run("port", None, lambda: resolve_port(self.port_url, self.board))
        rec.run("port-present", None, lambda: check_present(ps))

    def prepare(self) -> None:
        """Before a session opens on the port (a pyserial URL handler to register, ...)."""

    def lock(
        self, *, lock_dir: str | Path | None, timeout: float, owner: str, on_wait: Callable[[str], None]
    ) -> BoardLockCM | None:
        """The board's cross-process lock (the one ``esp-check run`` takes), or None for a private board."""
        if self.private:
            return None
        try:
            ps = resolve_port(self.port_url, self.board)
        except EspCheckError:
            return contextlib.nullcontext()  # the port stage reports it
        return board_lock(ps, lock_dir=lock_dir, timeout=timeout, owner=owner, on_wait=on_wait)

    def job_lock(self, options: JobOptions, owner: str, rec: Recorder) -> BoardLockCM | None:
        """:meth:`lock` in ``options``' lock directory and time, its waits said as stage ``lock``; None
        when ``options.lock`` is False (the caller holds the lock, or wants none: every mode, one rule)."""
        if not options.lock:
            return None
        wait = functools.partial(rec.say, "lock")
        return self.lock(lock_dir=options.lock_dir, timeout=options.lock_timeout, owner=owner, on_wait=wait)

    def facts(self, variants: Mapping[str, VariantRun]) -> NativeFacts | None:
        """What report.json says about the target beyond its name (None: nothing)."""
        return None


class RealTarget(Target):
    kind = "real"
    reach = ("", "rfc2217", "socket", "place")

    @classmethod
    def claims(cls, board: Board, port: str | None) -> bool:
        return not board.simulated and not board.is_native

    @classmethod
    def make(cls, board: Board, port: str | None) -> Target:
        if port is not None and _scheme(port) in ("sim", "native"):  # else minutes of builds, then a failure
            raise UsageError(
                f"board {board.name} is a real board, but --port {port} is a "
                f"{'simulated' if _scheme(port) == 'sim' else 'native'} board's",
                hint="give the board's serial port (or --port auto), or --board sim for the simulator",
            )
        return cls(board, port or "auto")


class _Simulated(Target):
    """What every simulated board shares: its results are SIMULATED, its BEGIN record must say sim=1,
    and a bench inventory reaches it by a sim:// or rfc2217:// URL or a labgrid place."""

    meaning = "SIMULATED"
    expects_sim = True
    reach = ("sim", "rfc2217", "place")

    @classmethod
    def refusal(cls, board: Board, kind: str) -> tuple[str, str]:
        if kind == "socket":
            return f"is raw TCP: {RAW_TCP_SIMULATOR}", RAW_TCP_SIMULATOR_HINT
        if kind == "native":
            return super().refusal(board, kind)
        return (
            "must be a sim:// or rfc2217:// URL (or a labgrid place) for a simulated board type",
            "serve the board with `esp-check sim serve --rfc2217`, or give its sim:// URL",
        )

    @classmethod
    def check_url(cls, url: str) -> tuple[str, str] | None:
        if _scheme(url) != "sim":
            return None
        from harness.sim import parse_url  # lazy: the simulator (esptool, pydantic) only for sim:// ports

        try:
            parse_url(url)
        except EspCheckError as exc:
            hint = exc.hint or "docs/simulator.md lists its parameters"
            return f"is not a valid sim:// URL: {exc.message}", hint
        return None


class SimTarget(_Simulated):
    kind = "simulated"

    @classmethod
    def claims(cls, board: Board, port: str | None) -> bool:
        return board.simulated and _scheme(port or "sim://") != "rfc2217"

    @classmethod
    def make(cls, board: Board, port: str | None) -> Target:
        if port is not None and _scheme(port) != "sim":
            if _scheme(port) == "socket":
                raise UsageError(
                    f"board {board.name} is simulated and {port} is a raw TCP port: {RAW_TCP_SIMULATOR}",
                    hint=RAW_TCP_SIMULATOR_HINT,
                )
            raise UsageError(
                f"board {board.name} is a simulated board, but --port {port} is not a simulator's port",
                hint="omit --port (a fresh simulated board is made), give a sim://NAME?... URL or the "
                "rfc2217:// URL of `esp-check sim serve --rfc2217`, or name the real board with --board "
                "(esp-check boards lists them)",
            )
        # A fresh simulated board per job (parallel jobs never share one), configured like the board
        # file's default port (flash size, ...) unless the user gave a sim:// URL.
        template = port
        default = board.default_port or ""
        if template is None and _scheme(default) == "sim":
            template = "sim://?" + default.partition("?")[2]
        url = sim_port_for(board.chip, board.reset, template, board.flash_size)
        refused = cls.check_url(url)  # as an inventory's port is checked: a usage error, not a port failure
        if refused is not None:
            raise UsageError(f"--port {url} {refused[0]}", hint=refused[1])
        return cls(board, url, private=port is None)

    def check(self, rec: Recorder) -> None:
        """An in-process board is always there."""

    def prepare(self) -> None:
        from harness.sim import register  # lazy: the simulator (esptool, pydantic) only for sim:// boards

        register()


class ServedSimTarget(_Simulated):
    """A simulator served by `esp-check sim serve` (or esp_rfc2217_server in front of a sim:// port):
    reached like a remote board; its BEGIN record must still say sim=1."""

    kind = "served"

    @classmethod
    def claims(cls, board: Board, port: str | None) -> bool:
        return board.simulated and port is not None and _scheme(port) == "rfc2217"

    @classmethod
    def make(cls, board: Board, port: str | None) -> Target:
        assert port is not None
        return cls(board, port)


class NativeTarget(Target):
    kind = "native"
    meaning = "NATIVE"
    reach = ("native",)

    @classmethod
    def claims(cls, board: Board, port: str | None) -> bool:
        return board.is_native

    @classmethod
    def make(cls, board: Board, port: str | None) -> Target:
        if port is not None and _scheme(port) != "native":
            raise UsageError(
                f"board {board.name} is a native board (the firmware runs as a program on this PC), "
                f"but --port {port} is not a native:// port",
                hint="omit --port (a fresh native board is made), or give native://NAME",
            )
        size = f"?flash={board.flash_size}" if board.flash_size else ""  # the board's flash
        return cls(board, port or f"native://esp-check-{uuid.uuid4().hex[:10]}{size}", private=port is None)

    @classmethod
    def refusal(cls, board: Board, kind: str) -> tuple[str, str]:
        what = f"is not a native:// URL but board type {board.name} is a native board" if kind else ""
        return (
            what or "must be a native://NAME port for a native board type",
            "a native board (builder = native) runs on a native://NAME port, and only there",
        )

    def check(self, rec: Recorder) -> None:
        """The program is started by the session: nothing to look for before."""

    def facts(self, variants: Mapping[str, VariantRun]) -> NativeFacts | None:
        """What a native board's results mean, and what each variant's program said it was (INFO)."""
        keys = ("native", "native_bits", "native_sanitize", "idf", "tflm", "tflm_from", "espnn", "espnn_from")
        reported = {v: {k: r.source.info.get(k) for k in keys} for v, r in variants.items() if r.source}
        return NativeFacts(meaning=NATIVE_MEANING, bits=self.board.native_bits, reported=reported)


TARGETS: tuple[type[Target], ...] = (NativeTarget, ServedSimTarget, SimTarget, RealTarget)


def target_class(board: Board, port: str | None = None) -> type[Target]:
    """The kind of target ``board`` is on ``port``."""
    return next(t for t in TARGETS if t.claims(board, port))


def open_target(board: Board, port: str | None) -> Target:
    """The target for ``board`` on ``port`` (None: its default); UsageError for a port it cannot use."""
    return target_class(board, port).make(board, port)


def _scheme(url: str) -> str:
    return url.split("://", 1)[0].strip().lower() if "://" in url else ""


def sim_port_for(board_chip: str, reset: str, port: str | None, flash_size: str | None = None) -> str:
    """A ``sim://`` URL with a fresh board name unless the user named one (one run, one board).

    Chip, reset circuit and flash size default to the board definition's, so the simulated chip is the
    one the firmware was built for (an image built for 8 MB refuses to start on 4 MB, as on hardware).
    """
    parts = urlsplit(port or "sim://")
    name = parts.netloc or parts.path.lstrip("/") or f"esp-check-{uuid.uuid4().hex[:10]}"
    keys = {kv.split("=", 1)[0] for kv in parts.query.split("&") if kv}
    extra = [] if "chip" in keys else [f"chip={board_chip}"]
    if "reset" not in keys:
        extra.append(f"reset={'usb_jtag' if reset == 'usb_serial_jtag' else 'classic'}")
    if "flash_size" not in keys and flash_size:
        extra.append(f"flash_size={flash_size}")
    query = "&".join([q for q in [parts.query, *extra] if q])
    return urlunsplit(("sim", name, "", query, ""))
