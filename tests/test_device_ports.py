"""Port resolution and open errors.

Faked here (and only here): the list of attached USB devices. The OS enumeration behind
``esp_pylib.serial_ports`` (pyserial's ``comports``, which esptool's port list reads) is
monkeypatched to return ListPortInfo objects built by hand, since this machine has no USB serial
devices. Opening, locking and busy detection use real pseudo-terminals and real files.
"""

from __future__ import annotations

import errno
import os
import pty
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import esp_pylib.serial_ports
import pytest
import serial
from serial.tools.list_ports_common import ListPortInfo
from sim_helpers import HANG_S

from harness.device import ports
from harness.device.ports import (
    PortSpec,
    Transport,
    explain_open_error,
    find_port_holders,
    open_port,
    resolve_port,
)
from harness.errors import ExitCode, PortError


def fake_port(
    device: str, vid: int | None, pid: int | None, serial_number: str | None = None
) -> ListPortInfo:
    """A ListPortInfo as pyserial builds it for a USB device (FAKED: no such device exists here)."""
    info = ListPortInfo(device, skip_link_detection=True)
    info.vid, info.pid, info.serial_number = vid, pid, serial_number
    info.description = "fake"
    return info


@pytest.fixture
def fake_comports(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    devices: list[ListPortInfo] = []
    # the OS enumeration behind esptool's own port list (esp_pylib.serial_ports), which esp-check uses
    monkeypatch.setattr(esp_pylib.serial_ports, "_comports", lambda *a, **k: list(devices))
    monkeypatch.setattr(ports, "BY_ID_DIR", tmp_path / "by-id")
    return devices


BOARD_UART = SimpleNamespace(chip="esp32", console="uart", reset="classic")
BOARD_JTAG = SimpleNamespace(chip="esp32s3", console="usb_serial_jtag", reset="usb_serial_jtag")


def test_auto_picks_the_single_known_bridge(fake_comports: list[ListPortInfo]) -> None:
    fake_comports += [
        fake_port("/dev/ttyS0", None, None),
        fake_port("/dev/ttyUSB0", 0x10C4, 0xEA60, "0001"),
        fake_port("/dev/ttyACM5", 0x2341, 0x0043),  # an Arduino Uno: not an ESP32 bridge
    ]
    ps = resolve_port("auto", platform="linux")
    assert ps.url == "/dev/ttyUSB0"
    assert ps.transport == Transport.DEVICE
    assert ps.usb is not None and ps.usb.kind == "CP210x USB-UART bridge"
    assert "CP210x" in (ps.note or "")


@pytest.mark.parametrize(
    ("vid", "pid", "kind"),
    [
        (0x1A86, 0x7523, "CH340"),
        (0x1A86, 0x55D4, "CH9102"),
        (0x0403, 0x6001, "FT232R"),
        (0x0403, 0x6010, "FT2232"),
        (0x0403, 0x6014, "FT232H"),
        (0x0403, 0x6015, "FT231X"),
        (0x303A, 0x1001, "USB-Serial-JTAG"),
    ],
)
def test_auto_knows_each_bridge(fake_comports: list[ListPortInfo], vid: int, pid: int, kind: str) -> None:
    fake_comports.append(fake_port("/dev/ttyACM0", vid, pid))
    ps = resolve_port("auto", platform="linux")
    assert ps.usb is not None and kind in (ps.usb.kind or "")


def test_auto_prefers_by_id_path_on_linux(fake_comports: list[ListPortInfo], tmp_path: Path) -> None:
    real = tmp_path / "ttyUSB0"
    real.write_text("")
    fake_comports.append(fake_port(str(real), 0x10C4, 0xEA60, "abc"))
    by_id = tmp_path / "by-id"
    by_id.mkdir()
    link = by_id / "usb-Silicon_Labs_CP2102_abc-if00-port0"
    link.symlink_to(real)
    ps = resolve_port("auto", platform="linux")
    assert ps.url == str(link)
    assert ps.usb is not None and ps.usb.kernel_device == str(real)


def test_auto_ambiguity_lists_candidates(fake_comports: list[ListPortInfo]) -> None:
    fake_comports += [fake_port("/dev/ttyUSB0", 0x10C4, 0xEA60), fake_port("/dev/ttyUSB1", 0x1A86, 0x7523)]
    with pytest.raises(PortError) as ei:
        resolve_port("auto", platform="linux")
    text = str(ei.value)
    assert "ambiguous" in text and "/dev/ttyUSB0" in text and "/dev/ttyUSB1" in text
    assert ei.value.exit_code == ExitCode.INFRASTRUCTURE


def test_auto_with_board_filters_by_console_kind(fake_comports: list[ListPortInfo]) -> None:
    # An ESP32-S3-DevKitC-1 has both connectors: the board file says which one is the console.
    fake_comports += [
        fake_port("/dev/ttyUSB0", 0x10C4, 0xEA60),
        fake_port("/dev/ttyACM0", 0x303A, 0x1001, "S3"),
    ]
    assert resolve_port("auto", BOARD_JTAG, platform="linux").url == "/dev/ttyACM0"
    assert resolve_port("auto", BOARD_UART, platform="linux").url == "/dev/ttyUSB0"
    assert resolve_port("auto", BOARD_JTAG, platform="linux").reenumerates


def test_auto_with_nothing_attached(fake_comports: list[ListPortInfo]) -> None:
    fake_comports.append(fake_port("/dev/ttyS0", None, None))
    with pytest.raises(PortError) as ei:
        resolve_port("auto", platform="linux")
    assert "/dev/ttyS0" in str(ei.value) and "no serial port" in str(ei.value)


def test_macos_uses_cu_not_tty(fake_comports: list[ListPortInfo]) -> None:
    fake_comports += [
        fake_port("/dev/tty.usbserial-1410", 0x10C4, 0xEA60),
        fake_port("/dev/cu.usbserial-1410", 0x10C4, 0xEA60),
    ]
    assert resolve_port("auto", platform="darwin").url == "/dev/cu.usbserial-1410"
    ps = resolve_port("/dev/tty.usbserial-1410", platform="darwin")
    assert ps.url == "/dev/cu.usbserial-1410" and "carrier detect" in (ps.note or "")


def test_windows_com_port(fake_comports: list[ListPortInfo]) -> None:
    fake_comports.append(fake_port("COM7", 0x1A86, 0x55D4))
    ps = resolve_port("auto", platform="win32")
    assert ps.url == "COM7"
    assert resolve_port("COM7", platform="win32").usb is not None


def test_relocate_finds_reenumerated_device_by_serial_number(fake_comports: list[ListPortInfo]) -> None:
    fake_comports.append(fake_port("/dev/ttyACM0", 0x303A, 0x1001, "F4:12:FA:00:11:22"))
    ps = resolve_port("/dev/ttyACM0", platform="linux")
    assert ps.reenumerates
    fake_comports.clear()
    fake_comports.append(fake_port("/dev/ttyACM1", 0x303A, 0x1001, "F4:12:FA:00:11:22"))
    assert ps.relocate() == "/dev/ttyACM1"


@pytest.mark.parametrize(
    ("url", "transport", "reset", "server"),
    [
        ("rfc2217://127.0.0.1:4000", Transport.RFC2217, False, True),
        ("socket://127.0.0.1:4000", Transport.SOCKET, False, False),
        ("sim://board1?chip=esp32s3", Transport.SIM, True, False),
        ("loop://", Transport.LOOP, False, False),
        ("spy://loop://", Transport.URL, False, False),
    ],
)
def test_urls_and_their_capabilities(url: str, transport: str, reset: bool, server: bool) -> None:
    ps = resolve_port(url)
    assert ps.url == url and ps.transport == transport
    assert ps.caps.local_reset is reset and ps.caps.server_resets is server


def test_socket_and_rfc2217_facts() -> None:
    sock = resolve_port("socket://h:1").caps
    assert not sock.modem_lines and sock.disconnect_is_eof
    rfc = resolve_port("rfc2217://h:1").caps
    assert rfc.single_client and rfc.server_resets and not rfc.atomic_modem_lines


def test_pty_is_recognized_and_has_no_modem_lines() -> None:
    master, slave = pty.openpty()
    try:
        ps = resolve_port(os.ttyname(slave), platform="linux")
        assert ps.transport == Transport.PTY
        assert not ps.caps.modem_lines and not ps.caps.local_reset
    finally:
        os.close(master)
        os.close(slave)


def test_open_missing_device() -> None:
    with pytest.raises(PortError) as ei:
        open_port("/dev/ttyUSB-does-not-exist", 115200)
    assert "does not exist" in str(ei.value)
    assert "list_ports" in (ei.value.hint or "")


def test_open_regular_file_is_not_a_serial_port(tmp_path: Path) -> None:
    f = tmp_path / "notaport"
    f.write_text("x")
    with pytest.raises(PortError) as ei:
        open_port(str(f), 115200)
    assert "not a serial port" in str(ei.value)


def test_open_busy_exclusive_lock_on_real_pty() -> None:
    master, slave = pty.openpty()
    name = os.ttyname(slave)
    try:
        first = open_port(name, 115200)
        try:
            with pytest.raises(PortError) as ei:
                open_port(name, 115200)
            assert "busy" in str(ei.value)
            assert "close the other serial monitor" in (ei.value.hint or "")
        finally:
            first.close()
        # after the first handle closes, the port opens again
        again = open_port(name, 115200)
        again.close()
    finally:
        os.close(master)
        os.close(slave)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc scan is Linux-only")
def test_open_busy_held_by_a_monitor_without_lock() -> None:
    """A real second process holds the pty open without flock (like `screen`): reported by name."""
    master, slave = pty.openpty()
    name = os.ttyname(slave)
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import time; f = open({name!r}, 'rb', buffering=0); print('ok', flush=True); time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == b"ok"
        holders = find_port_holders(name)
        assert any(pid == child.pid for pid, _ in holders)
        with pytest.raises(PortError) as ei:
            open_port(name, 115200)
        assert f"pid {child.pid}" in str(ei.value)
        child.kill()
        child.wait()
        # once the monitor is gone, the port is free again
        deadline = time.monotonic() + HANG_S
        while find_port_holders(name) and time.monotonic() < deadline:
            time.sleep(0.05)
        open_port(name, 115200).close()
    finally:
        child.kill()
        child.wait()
        os.close(master)
        os.close(slave)


def test_permission_denied_mapping() -> None:
    """This suite runs as root, which a chmod'ed pty cannot stop, so the EACCES path is checked on
    the mapping with the exception pyserial raises (SerialException(errno, msg))."""
    exc = serial.SerialException(
        errno.EACCES, "could not open port /dev/ttyUSB0: [Errno 13] Permission denied"
    )
    err = explain_open_error("/dev/ttyUSB0", exc, platform="linux")
    assert "permission denied" in str(err)
    assert "dialout" in (err.hint or "")
    win = explain_open_error(
        "COM3",
        serial.SerialException(
            "could not open port 'COM3': PermissionError(13, 'Access is denied.', None, 5)"
        ),
        platform="win32",
    )
    assert "busy" in str(win)


def test_permission_denied_real_when_not_root(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("running as root: file permissions do not apply (mapping tested above)")
    master, slave = pty.openpty()
    name = os.ttyname(slave)
    os.chmod(name, 0o000)
    try:
        with pytest.raises(PortError) as ei:
            open_port(name, 115200)
        assert "permission denied" in str(ei.value)
    finally:
        os.close(master)
        os.close(slave)


def test_refused_and_bad_url() -> None:
    with pytest.raises(PortError) as ei:
        open_port("socket://127.0.0.1:1", 115200)
    assert "cannot connect" in str(ei.value)
    with pytest.raises(PortError) as ei2:
        open_port("nosuchproto://x", 115200)
    assert "invalid port" in str(ei2.value)


def test_empty_spec() -> None:
    with pytest.raises(PortError):
        resolve_port("  ")


def test_open_loop_url_roundtrip() -> None:
    p = open_port(PortSpec("loop://", "loop://", Transport.LOOP, ports.CAPS[Transport.LOOP]), 115200)
    try:
        p.write(b"abc")
        assert p.read(3) == b"abc"
    finally:
        p.close()


def test_the_port_list_is_esptools_own(fake_comports: list[ListPortInfo]) -> None:
    """esp-check lists ports as esptool does (esp_pylib.serial_ports): Espressif's USB devices first."""
    fake_comports += [
        fake_port("/dev/ttyS0", None, None),
        fake_port("/dev/ttyUSB0", 0x10C4, 0xEA60, "0001"),
        fake_port("/dev/ttyACM0", 0x303A, 0x1001, "F4:12:FA:00:11:22"),
    ]
    esptool_order = [p.device for p in esp_pylib.serial_ports.get_port_list()]
    assert [c.kernel_device for c in ports.list_candidates("linux")] == esptool_order
    assert esptool_order[0] == "/dev/ttyACM0"  # the Espressif VID leads, whatever the OS order
    only = ports.list_candidates("linux", vids=[0x10C4], pids=[0xEA60])
    assert [c.kernel_device for c in only] == ["/dev/ttyUSB0"]
