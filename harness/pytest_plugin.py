"""esp-check inside your pytest suite: a board fixture and ``flash_and_compare`` (pytest11 entry point).

Installed with esp-check, so pytest loads it in every run in the environment; it is inert unless used:
options (group ``esp-check``) and fixtures, no hook that changes collection or logging, nothing heavy
imported until a fixture runs. Its fixtures, options and the one report hook (a test of its fixtures
that labgrid's plugin skipped fails instead): docs/ci.md, "esp-check inside your pytest suite".
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

_GROUP = "esp-check"


# --esp-check-NAME METAVAR (default: not given), help
_OPTIONS = (
    ("board", "TYPE", "board type (esp-check boards) or board .toml of the board under test"),
    ("port", "PORT", "its port: /dev/..., COM5, rfc2217://host:port, sim://NAME, auto"),
    ("inventory", "BENCH.toml", "take the board from this bench inventory (docs/ci.md)"),
    ("board-name", "NAME", "which inventory board (default: the first)"),
    ("labgrid", "HOST:PORT", "labgrid coordinator; the board is --esp-check-place"),
    ("place", "PLACE", "labgrid place of the board (held for the whole session)"),
    ("out", "DIR", "artifact root (default: each test's tmp_path)"),
)


def pytest_addoption(parser: pytest.Parser) -> None:
    """Options only: a run that does not use them is the run it would be without this plugin."""
    group = parser.getgroup(_GROUP, "esp-check (flash and compare TFLM models on ESP32 boards)")
    for name, metavar, text in _OPTIONS:
        group.addoption(f"--esp-check-{name}", default=None, metavar=metavar, help=text)
    held = "seconds to wait for a board or place someone else holds"
    group.addoption("--esp-check-lock-timeout", default=600.0, type=float, metavar="S", help=held)


@dataclass(frozen=True)
class EspCheckBoard:
    """The board a test runs on: its type, how to reach it, and where that came from."""

    board: Any  # board type name, .toml path, or a harness.firmware.boards.Board
    port: str | None  # None: a simulated board picks its own sim:// port
    source: str  # "options", "inventory bench.toml board s3-a", "labgrid place lab-3", "dut"
    simulated: bool = False

    @classmethod
    def from_dut(cls, dut: Any, board: str) -> EspCheckBoard:
        """A pytest-embedded ``dut``'s board (its serial port; the type is not known to it)."""
        port = getattr(getattr(dut, "serial", None), "port", None)
        if not isinstance(port, str) or not port:
            raise pytest.UsageError("this dut has no serial port (use pytest-embedded's serial service)")
        return cls(board=board, port=port, source="dut", simulated=port.startswith("sim://"))


def _from_options(config: pytest.Config) -> EspCheckBoard | None:
    board, port = config.getoption("esp_check_board"), config.getoption("esp_check_port")
    if board is None and port is None:
        return None
    if board is None:
        raise pytest.UsageError("--esp-check-port needs --esp-check-board TYPE (esp-check boards lists them)")
    return EspCheckBoard(board, port, "options", _simulated(board))


def _from_inventory(config: pytest.Config) -> EspCheckBoard | None:
    path = config.getoption("esp_check_inventory")
    if path is None:
        return None
    from harness.runner.inventory import load_inventory  # lazy: the plugin loads into every pytest run

    inv = load_inventory(path, coordinator=config.getoption("esp_check_labgrid"))
    name = config.getoption("esp_check_board_name")
    bench = inv.by_name(name) if name else inv.boards[0]
    if bench.place:
        raise pytest.UsageError(
            f"inventory board {bench.name} is labgrid place {bench.place}: use --esp-check-labgrid "
            f"{bench.coordinator} --esp-check-place {bench.place}"
        )
    if not bench.port:  # a USB board: looked up by serial number / location now
        return EspCheckBoard(bench.board, bench.resolve().url, f"inventory {path} board {bench.name}")
    return EspCheckBoard(bench.board, bench.port, f"inventory {path} board {bench.name}", bench.simulated)


def _simulated(board: str) -> bool:
    from harness.firmware.boards import load_board  # lazy: the plugin loads into every pytest run

    return bool(load_board(board).simulated)


@contextlib.contextmanager
def _labgrid_board(config: pytest.Config) -> Iterator[EspCheckBoard | None]:
    """The session's labgrid place, held from first use to the end of the session."""
    coordinator, place = config.getoption("esp_check_labgrid"), config.getoption("esp_check_place")
    if coordinator is None and place is None:
        yield None
        return
    if not (coordinator and place):
        raise pytest.UsageError("--esp-check-labgrid HOST:PORT and --esp-check-place NAME go together")
    from harness.device.labgrid import TYPE_TAG, LabgridClient, PlaceLease  # lazy: as _from_inventory

    client = LabgridClient(coordinator)
    board = config.getoption("esp_check_board") or client.show(place).tags.get(TYPE_TAG)
    if not board:
        raise pytest.UsageError(f"place {place} has no {TYPE_TAG} tag: give --esp-check-board TYPE")
    lease = PlaceLease(client, place)
    try:
        lease.acquire(config.getoption("esp_check_lock_timeout"), on_wait=warnings.warn)
        yield EspCheckBoard(board, lease.url, f"labgrid place {place}", _simulated(board))
    finally:
        lease.release()


LABGRID_SKIP = "missing environment config (use --lg-env)"  # labgrid's env fixture, without --lg-env
_ESP_CHECK_FIXTURES = ("flash_and_compare", "esp_check_board")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A test using esp-check's fixtures that labgrid's plugin skipped fails, loudly (not exit 0)."""
    outcome: Any = yield
    rep = outcome.get_result()
    if rep.when != "setup" or not rep.skipped:
        return
    if not any(f in getattr(item, "fixturenames", ()) for f in _ESP_CHECK_FIXTURES):
        return
    reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) and len(rep.longrepr) == 3 else ""
    if LABGRID_SKIP not in str(reason):
        return
    rep.outcome = "failed"
    rep.longrepr = (
        f"esp-check: labgrid's pytest plugin skipped this test ({reason}): labgrid is installed and "
        "pytest-embedded's fixtures request `target`, a fixture labgrid's plugin also defines, which needs "
        "a labgrid environment. This test never ran. Run pytest with `-p no:labgrid` (or give --lg-env), "
        "or uninstall labgrid from this environment (docs/ci.md, 'esp-check inside your pytest suite')."
    )


@pytest.fixture(scope="session")
def esp_check_board(pytestconfig: pytest.Config) -> Iterator[EspCheckBoard]:
    """The board under test (options, inventory or labgrid place); a usage error without one."""
    with _labgrid_board(pytestconfig) as placed:
        found = placed or _from_options(pytestconfig) or _from_inventory(pytestconfig)
        if found is None:
            pytest.fail(
                "no esp-check board: pass --esp-check-board TYPE --esp-check-port PORT, "
                "--esp-check-inventory BENCH.toml, or --esp-check-labgrid HOST:PORT --esp-check-place NAME",
                pytrace=False,
            )
        yield found


def _artifact_dir(config: pytest.Config, node: pytest.Item, tmp_path: Path, n: int) -> Path:
    root = config.getoption("esp_check_out")
    name = re.sub(r"[^A-Za-z0-9_.@+-]+", "_", node.nodeid).strip("._")[:120] or "test"
    base = Path(root) / name if root else tmp_path / "esp-check"
    return base if n == 1 else base.with_name(f"{base.name}-{n}")


def _record(record_property: Callable[[str, object], None], board: EspCheckBoard, result: Any) -> None:
    """JUnit properties: the verdict and where its evidence is (the test's ``user_properties``)."""
    record_property("esp_check_verdict", str(result.verdict))
    record_property("esp_check_exit_code", int(result.exit_code))
    record_property("esp_check_board", str(getattr(board.board, "name", board.board)))
    record_property("esp_check_port", result.port)
    record_property("esp_check_simulated", bool(result.simulated))
    record_property("esp_check_out_dir", str(result.out_dir))
    record_property("esp_check_report", str(result.report_path))
    for variant, run in sorted(result.variants.items()):
        if run.serial_log:
            record_property(f"esp_check_serial_log_{variant}", str(run.serial_log))


@contextlib.contextmanager
def _dut_port_released(dut: Any) -> Iterator[None]:
    """pytest-embedded holds the dut's port open with a reader thread: hand it to esp-check, then back."""
    serial = dut.serial
    with serial.disable_redirect_thread(kill_port=True):
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                serial.proc.open()  # its reader thread restarts when the with-block ends


@pytest.fixture
def flash_and_compare(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., Any]:
    """``flash_and_compare(model, inputs, *, board=None, dut=None, **options)`` -> the result object.

    ``board``: an :class:`EspCheckBoard` (default: the ``esp_check_board`` fixture); ``dut``: a
    pytest-embedded dut whose port to use (with ``board_type=``); ``options``: those of
    :class:`harness.api.JobOptions` (``tolerance_lsb``, ``reference``, ``tap``, ...), and ``out_dir``.
    """
    calls = [0]

    def run(
        model: str | Path,
        inputs: Sequence[str | Path],
        *,
        board: EspCheckBoard | None = None,
        dut: Any = None,
        board_type: str | None = None,
        **options: Any,
    ) -> Any:
        from harness import api  # lazy: numpy, pyserial, the pipeline: only when a test calls this

        if dut is not None:
            board = EspCheckBoard.from_dut(dut, board_type or (board.board if board else "sim"))
        board = board or request.getfixturevalue("esp_check_board")
        calls[0] += 1
        out_dir = options.pop("out_dir", None)
        out_dir = out_dir or _artifact_dir(request.config, request.node, tmp_path, calls[0])
        options.setdefault("lock_timeout", request.config.getoption("esp_check_lock_timeout"))
        job = api.JobOptions(**options)  # a TypeError names an option that does not exist
        with _dut_port_released(dut) if dut is not None else contextlib.nullcontext():
            result = api.flash_and_compare(
                model, list(inputs), board=board.board, port=board.port, out_dir=out_dir, options=job
            )
        # user_properties directly, not the record_property fixture: the same <property> elements in
        # junit.xml without its warning under pytest's default junit_family (xunit2)
        _record(lambda k, v: request.node.user_properties.append((k, v)), board, result)
        return result

    return run
