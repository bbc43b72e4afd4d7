"""Flashing and flash-then-capture with real esptool 5 (esptool.cmds) and real pyserial.

Faked: only the board. It is the simulated board (harness.sim, ``sim://`` URLs), which speaks the
ESP ROM loader protocol; esptool's loader, stub, compression, MD5 checks and the reset sequences
are the real ones. Error mappings that need hardware states the simulator cannot produce are
checked on esptool's own exception texts.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import serial
from esptool.util import FatalError
from sim_helpers import make_project

import harness.sim as sim
from harness.analysis.classify import classify, exit_code_for
from harness.device.esptool_log import EsptoolLogSink, capture_esptool_log
from harness.device.flash import FlashFailure, FlashProgress, flash_artifacts, map_esptool_error
from harness.device.ports import open_port, resolve_port
from harness.device.session import DeviceSession
from harness.errors import ExitCode, PortError
from harness.protocol.capture import parse_capture
from harness.sim.board import remove_board
from harness.sim.image import build_sim_firmware
from harness.sim.serve import serve_rfc2217, serve_tcp

sim.register()

S3_CLASSIC = SimpleNamespace(
    chip="esp32s3", console="uart", reset="classic", flash_baud=921600, monitor_baud=115200
)
S3_JTAG = SimpleNamespace(
    chip="esp32s3", console="usb_serial_jtag", reset="usb_serial_jtag", flash_baud=921600, monitor_baud=115200
)


@pytest.fixture(scope="module")
def firmware(tmp_path_factory: pytest.TempPathFactory, models_dir: Path) -> list[tuple[int, Path]]:
    x = np.load(models_dir / "inputs" / "op_zoo.q.npy")
    root = tmp_path_factory.mktemp("fw")
    proj = make_project(root / "proj", models_dir / "op_zoo.tflite", [x], chip="esp32s3", variant="optimized")
    return build_sim_firmware(proj, root / "build")


@pytest.fixture
def sim_url() -> Iterator:
    names: list[str] = []

    def make(reset: str = "classic", chip: str = "esp32s3", extra: str = "") -> str:
        name = f"dev-{uuid.uuid4().hex[:10]}"
        names.append(name)
        return f"sim://{name}?chip={chip}&reset={reset}&flash_size=8MB&emitter=c{extra}"

    yield make
    for name in names:
        remove_board(name)


def test_flash_then_capture_on_one_handle_then_skip_on_reflash(
    firmware: list[tuple[int, Path]], sim_url, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = sim_url("classic")
    events: list[FlashProgress] = []
    with DeviceSession(url, S3_CLASSIC) as dev:
        handle = dev.serial
        fr = dev.flash(firmware, progress=events.append, log_path=tmp_path / "flash.log")
        assert fr.chip == "esp32s3" and fr.chip_name == "ESP32-S3"
        assert fr.stub and fr.baud == 921600
        assert fr.flash_size == "8MB"
        assert fr.mac and fr.revision and fr.revision.startswith("v")
        # the empty otadata image equals erased flash: esptool's MD5 check skips it, writes the rest
        assert all(r.verified and r.skipped == (set(r.path.read_bytes()) == {0xFF}) for r in fr.regions)
        assert fr.bytes_written >= sum(r.size for r in fr.regions if not r.skipped)  # uncompressed
        assert 0 < sum(r.bytes_sent for r in fr.regions) < fr.bytes_written  # compressed on the wire
        assert dev.serial is handle  # flashing did not close or replace the handle
        assert json.loads(json.dumps(fr.to_dict()))["regions"][0]["offset"] == firmware[0][0]
        assert json.dumps(dev.describe())
        with pytest.raises(PortError) as busy:  # exclusive: a second opener of this board is refused
            open_port(url, 115200)
        assert "busy" in str(busy.value)
        cap = dev.capture(tmp_path / "serial.log", total_timeout=30, silence_timeout=10)
        assert dev.serial is handle
    assert cap.ended_by == "end_record"
    assert cap.resets == 1 and cap.boots == 1
    parsed = parse_capture(cap.data)
    assert parsed.valid and parsed.complete
    assert classify(cap.data, ended_by=cap.ended_by, parsed=parsed) == []
    assert (tmp_path / "serial.log").read_bytes() == cap.data
    log = (tmp_path / "flash.log").read_text()
    assert "Hash of data verified" in log and "Stub flasher running" in log
    assert any(e.stage == "write" and e.total > 0 for e in events)
    assert "Hash of data verified" not in capsys.readouterr().out  # esptool did not print to stdout

    # the same firmware again: esptool's skip_flashed finds it in flash and writes nothing
    with DeviceSession(url, S3_CLASSIC) as dev:
        again = dev.flash(firmware)
        cap2 = dev.capture(total_timeout=30, silence_timeout=10)
    assert all(r.skipped for r in again.regions) and again.bytes_written == 0
    assert all(r.verified for r in again.regions)
    assert cap2.ended_by == "end_record"


def test_usb_serial_jtag_board_reenumerates_and_capture_reopens(
    firmware: list[tuple[int, Path]], sim_url, tmp_path: Path
) -> None:
    url = sim_url("usb_serial_jtag")
    with DeviceSession(url, S3_JTAG) as dev:
        fr = dev.flash(firmware)
        assert fr.before.endswith("usb-reset") or "harness-reset" in fr.before
        first = dev.serial
        cap = dev.capture(tmp_path / "jtag.log", total_timeout=30, silence_timeout=10)
        assert dev.serial is not first  # the port vanished on reset and was reopened
    assert cap.reopens >= 1
    assert cap.ended_by == "end_record"
    assert parse_capture(cap.data).valid
    assert b"USB_UART_CHIP_RESET" in cap.data or b"ESP-ROM" in cap.data


def test_chip_mismatch_is_not_retryable(firmware: list[tuple[int, Path]], sim_url) -> None:
    port = serial.serial_for_url(sim_url("classic", chip="esp32c3"), exclusive=True)
    try:
        with pytest.raises(FlashFailure) as ei:
            flash_artifacts(port, firmware, expected_chip="esp32s3", port_spec=resolve_port(port.port))
    finally:
        port.close()
    assert ei.value.kind == "chip_mismatch"
    assert not ei.value.retryable
    assert ei.value.exit_code == ExitCode.USAGE  # a wrong board for the chip is a usage error
    assert "ESP32-C3" in str(ei.value)


def test_chip_revision_outside_the_boards_range_is_refused_before_writing(
    firmware: list[tuple[int, Path]], sim_url
) -> None:
    """The simulated ESP32-S3 reports v0.2 through its eFuses, read by real esptool. A board whose image
    accepts only v3.0-v3.99 (as esp32p4-v3's does) is refused before a byte is written: a v3 P4 never
    reaches app_main with an image for older silicon, so only the flash step can tell."""
    url = sim_url("classic")
    port = serial.serial_for_url(url, exclusive=True)
    try:
        with pytest.raises(FlashFailure) as ei:
            flash_artifacts(
                port, firmware, expected_chip="esp32s3", chip_revisions=(300, 399),
                port_spec=resolve_port(url),
            )  # fmt: skip
        assert set(port.board.flash) == {0xFF}  # nothing written
        assert ei.value.kind == "chip_revision" and not ei.value.retryable
        assert ei.value.exit_code == ExitCode.USAGE
        assert "revision v0.2" in str(ei.value) and "v3.0 to v3.99" in str(ei.value)
        assert "esp32p4-v3" in (ei.value.hint or "")
        fr = flash_artifacts(
            port, firmware, expected_chip="esp32s3", chip_revisions=(0, 99), port_spec=resolve_port(url)
        )
        assert fr.revision == "v0.2" and not all(r.skipped for r in fr.regions)  # inside the range: flashed
    finally:
        port.close()


def test_image_larger_than_flash(sim_url, tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(b"\xaa" * 0x3000)
    port = serial.serial_for_url(sim_url("classic"), exclusive=True)
    try:
        with pytest.raises(FlashFailure) as ei:
            flash_artifacts(port, [(0x800000 - 0x1000, big)], port_spec=resolve_port(port.port))
    finally:
        port.close()
    assert ei.value.kind == "image_too_large"
    assert "8MB" in str(ei.value)


def test_first_sync_fails_then_retry_connects(firmware: list[tuple[int, Path]], sim_url) -> None:
    url = sim_url("classic", extra="&fault=sync_fail&fault_count=1")
    with DeviceSession(url, S3_CLASSIC) as dev:
        fr = dev.flash(firmware, connect_attempts=4)
    assert fr.connect_attempts >= 2


def test_no_sync_on_a_port_without_a_board() -> None:
    port = serial.serial_for_url("loop://", timeout=0.05)
    art = Path(__file__)
    try:
        with pytest.raises(FlashFailure) as ei:
            flash_artifacts(port, [(0x10000, art)], connect_attempts=1)
    finally:
        port.close()
    assert ei.value.kind == "no_sync"
    assert "BOOT" in (ei.value.hint or "")


def test_missing_artifact_and_bad_modes(tmp_path: Path) -> None:
    port = serial.serial_for_url("loop://")
    try:
        with pytest.raises(FlashFailure) as ei:
            flash_artifacts(port, [(0x0, tmp_path / "nope.bin")])
        assert ei.value.kind == "usage" and "does not exist" in str(ei.value)
        f = tmp_path / "a.bin"
        f.write_bytes(b"x")
        with pytest.raises(FlashFailure):
            flash_artifacts(port, [(0, f)], after="bogus")
        with pytest.raises(FlashFailure):
            flash_artifacts(port, [(0, f)], before="bogus")
        with pytest.raises(FlashFailure):
            flash_artifacts(port, [])
    finally:
        port.close()


@pytest.mark.parametrize(
    ("text", "stage", "kind", "retryable"),
    [
        ("Failed to connect to ESP32: No serial data received.", "connect", "no_sync", True),
        (
            "Failed to connect to ESP32: Wrong boot mode detected (0x13)! "
            "The chip needs to be in download mode.",
            "connect",
            "wrong_boot_mode",
            True,
        ),
        ("This chip is ESP32-C3, not ESP32-S3. Wrong chip argument?", "connect", "chip_mismatch", False),
        (  # esptool's own check of the bootloader image header (in its words, our values)
            "'bootloader.bin' requires chip revision in range v0.1 - v1.99 (this chip is revision v3.1). "
            "Use --force to flash anyway.",
            "write",
            "chip_revision",
            False,
        ),
        (
            "File 'app.bin' (length 5000000) at offset 0x00010000 will not fit in 4194304 bytes of flash. "
            "Change the flash_size argument or flashing address.",
            "write",
            "image_too_large",
            False,
        ),
        ("MD5 of file does not match data in flash!", "write", "verify_failed", True),
        ("Failed to start stub flasher. There was no response.", "stub", "stub_failed", True),
        ("Invalid head of packet (0x47): Possible serial noise or corruption.", "connect", "no_sync", True),
    ],
)
def test_esptool_messages_map_to_actionable_errors(text: str, stage: str, kind: str, retryable: bool) -> None:
    err = map_esptool_error(FatalError(text), stage=stage, ps=resolve_port("/dev/ttyUSB0", platform="linux"))
    assert err.kind == kind
    assert err.retryable is retryable
    usage = kind in ("chip_mismatch", "chip_revision")
    assert err.exit_code == (ExitCode.USAGE if usage else ExitCode.INFRASTRUCTURE)
    assert err.esptool_message == text
    assert err.hint


def test_transport_specific_sync_hints() -> None:
    exc = FatalError("Failed to connect to ESP32: No serial data received.")
    sock = map_esptool_error(exc, stage="connect", ps=resolve_port("socket://h:1"))
    assert "socket://" in (sock.hint or "")
    rfc = map_esptool_error(exc, stage="connect", ps=resolve_port("rfc2217://h:1"))
    assert "esp_rfc2217_server" in (rfc.hint or "")
    lost = map_esptool_error(serial.SerialException("read failed"), stage="write", ps=resolve_port("/dev/x"))
    assert lost.kind == "link_lost"


def test_esptool_log_is_routed_per_thread(capsys: pytest.CaptureFixture[str]) -> None:
    from esptool.logger import log

    mine = EsptoolLogSink()
    other = EsptoolLogSink()
    barrier = threading.Barrier(2)

    def worker() -> None:
        with capture_esptool_log(other):
            barrier.wait()
            log.print("from the worker")

    th = threading.Thread(target=worker)
    with capture_esptool_log(mine):
        th.start()
        barrier.wait()
        log.print("Connecting...", end="")
        log.print(".", end="")
        log.print("")
        log.warn("careful [bold]now[/bold]")
    th.join()
    assert mine.lines == ["Connecting....", "Warning: careful now"]
    assert other.lines == ["from the worker"]
    assert "Connecting" not in capsys.readouterr().out


def test_firmware_fault_from_the_sim_is_classified(firmware: list[tuple[int, Path]], sim_url) -> None:
    url = sim_url("classic", extra="&fault=panic")
    with DeviceSession(url, S3_CLASSIC) as dev:
        dev.flash(firmware)
        cap = dev.capture(total_timeout=30, silence_timeout=3, max_boots=3)
    findings = classify(cap.data, ended_by=cap.ended_by)
    assert "panic" in [f.kind for f in findings]
    assert exit_code_for(findings) == ExitCode.FIRMWARE_FAULT


@pytest.mark.slow
def test_remote_board_over_rfc2217(firmware: list[tuple[int, Path]], sim_url, tmp_path: Path) -> None:
    """An RFC2217 server in front of the board (esptool's EspPortManager, as in esp_rfc2217_server):
    the server performs the resets; flash then capture works through it."""
    server = serve_rfc2217(sim_url("classic"))
    try:
        with DeviceSession(server.address, S3_CLASSIC) as dev:
            assert dev.spec.caps.server_resets
            fr = dev.flash(firmware)
            cap = dev.capture(tmp_path / "remote.log", total_timeout=30, silence_timeout=10)
    finally:
        server.stop()
    assert fr.before == "default-reset"
    assert cap.ended_by == "end_record", (cap, cap.data[-300:])
    assert parse_capture(cap.data).valid


def test_socket_url_cannot_reset_so_flashing_says_so(firmware: list[tuple[int, Path]], sim_url) -> None:
    server = serve_tcp(sim_url("classic"))
    try:
        with pytest.raises(FlashFailure) as ei, DeviceSession(server.address, S3_CLASSIC) as dev:
            dev.flash(firmware, connect_attempts=1)
    finally:
        server.stop()
    assert ei.value.kind in ("no_sync", "wrong_boot_mode")
    assert "socket://" in (ei.value.hint or "")


def test_diff_with_rewrites_only_changed_sectors(
    firmware: list[tuple[int, Path]], sim_url, tmp_path: Path
) -> None:
    """esptool's fast re-flash: with the previously flashed files as ``diff_with``, an unchanged file
    is only MD5-verified and a changed one is written sector by sector."""
    url = sim_url("classic")
    app_off, app = firmware[-1]
    changed = tmp_path / "app-changed.bin"
    data = bytearray(app.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte in one 4 KiB sector
    changed.write_bytes(bytes(data))
    with DeviceSession(url, S3_CLASSIC) as dev:
        dev.flash(firmware)
        same = dev.flash(firmware, diff_with=[p for _, p in firmware])
        assert all(r.skipped for r in same.regions) and same.bytes_written == 0
        new = [*firmware[:-1], (app_off, changed)]
        fast = dev.flash(new, diff_with=[p for _, p in firmware])
    app_region = fast.regions[-1]
    assert not app_region.skipped and app_region.verified
    assert app_region.bytes_written == 0x1000  # exactly the one changed sector
    assert all(r.skipped for r in fast.regions[:-1])


def test_wrong_boot_mode_when_io0_is_sampled_too_late(firmware: list[tuple[int, Path]], sim_url) -> None:
    """A board whose EN RC delay outlasts the IO0-low pulse boots the app instead of the ROM loader
    (the simulated board samples IO0 ``strap_window`` s after EN rises): reported as wrong boot mode."""
    url = sim_url("classic", extra="&strap_window=0.3")
    with pytest.raises(FlashFailure) as ei, DeviceSession(url, S3_CLASSIC) as dev:
        dev.flash(firmware, connect_attempts=2)
    assert ei.value.kind == "wrong_boot_mode"
    assert "BOOT" in (ei.value.hint or "")


@pytest.mark.parametrize(
    ("kind", "retryable", "exit_code"),
    [("usage", False, 2), ("chip_mismatch", False, 2), ("chip_revision", False, 2), ("link_lost", True, 3)],
)
def test_a_usage_kind_is_never_retryable_unless_said(kind: str, retryable: bool, exit_code: int) -> None:
    # No board: the rule lives in the exception itself (a wrong board or argument stays wrong on a retry).
    err = FlashFailure("x", kind=kind)
    assert (err.retryable, int(err.exit_code)) == (retryable, exit_code)
    assert FlashFailure("x", kind="image_too_large", retryable=False).retryable is False


def test_the_default_flash_baud_has_one_home() -> None:
    """Without a board's flash_baud or an option, a session and flash_artifacts both use
    harness.chips.FLASH_BAUD itself (the same object, not an equal copy)."""
    import inspect

    from harness.chips import FLASH_BAUD

    assert inspect.signature(flash_artifacts).parameters["baud"].default is FLASH_BAUD
    assert DeviceSession("sim://one-baud", None).flash_baud is FLASH_BAUD
