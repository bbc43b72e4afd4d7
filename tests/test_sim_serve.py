"""A simulated board served over TCP: raw socket://, RFC 2217 (pyserial's PortManager), the
`esp-check sim serve` command, and esptool's own esp_rfc2217_server in front of a sim:// port.

Faked: the board (harness.sim). Clients are real esptool / pyserial over real sockets.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import serial
from esp_pylib.serial_reset import classic_bootloader_reset
from esptool import cmds
from sim_helpers import HANG_S, make_project, read_until_end

import harness.sim as sim
from harness.protocol.capture import parse_capture
from harness.sim.board import get_board, remove_board
from harness.sim.image import build_sim_firmware
from harness.sim.serve import SimServer, serve_rfc2217, serve_tcp

sim.register()


@pytest.fixture(scope="module")
def s3_files(tmp_path_factory: pytest.TempPathFactory, models_dir: Path) -> list[tuple[int, Path]]:
    x = np.load(models_dir / "inputs" / "op_zoo.q.npy")
    root = tmp_path_factory.mktemp("serve-fw")
    proj = make_project(root / "p", models_dir / "op_zoo.tflite", [x], chip="esp32s3", variant="ansi")
    return build_sim_firmware(proj, root / "b")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_raw_tcp_serves_bytes_but_cannot_reset(s3_files) -> None:
    name = f"tcp-{uuid.uuid4().hex[:8]}"
    url = f"sim://{name}?chip=esp32s3&emitter=c"
    local = serial.serial_for_url(url)
    classic_bootloader_reset(local, enter_boot_delay=0.02, reset_delay=0.05)  # put it in download mode
    local.close()
    server = serve_tcp(url)
    try:
        client = serial.serial_for_url(server.address, timeout=0.5)
        esp = cmds.detect_chip(client, 115200, "default-reset", connect_attempts=2)  # esptool: no-reset
        assert esp.CHIP_NAME == "ESP32-S3"
        esp = cmds.run_stub(esp)
        cmds.write_flash(esp, [(o, str(p)) for o, p in s3_files], skip_flashed=True)
        client.close()
        assert get_board(name).flash_bytes_written > 0
        assert get_board(name).boots == 0  # nobody could reset it into the app over raw TCP
    finally:
        server.stop()
        remove_board(name)


def test_raw_tcp_board_strapped_into_download_mode(s3_files) -> None:
    """What a bench offers raw TCP clients: a board with BOOT held, powered on by the server."""
    name = f"tcp-{uuid.uuid4().hex[:8]}"
    server = serve_tcp(f"sim://{name}?chip=esp32s3&emitter=c&boot=download")
    try:
        client = serial.serial_for_url(server.address, timeout=0.5)
        esp = cmds.detect_chip(client, 115200, "no-reset", connect_attempts=2)  # nobody reset it from here
        assert esp.CHIP_NAME == "ESP32-S3"
        client.close()
        board = get_board(name)
        assert board.download_sessions == 1 and board.boots == 0
    finally:
        server.stop()
        remove_board(name)


def test_strap_wins_over_the_reset_circuit() -> None:
    name = f"strap-{uuid.uuid4().hex[:8]}"
    port = serial.serial_for_url(f"sim://{name}?chip=esp32c3&boot=download", baudrate=115200, timeout=0.3)
    try:
        port.dtr = False
        port.rts = True  # EN low with IO0 released by the circuit: a plain hard reset ...
        port.rts = False
        out = read_until_end(port, idle=0.3)
        assert b"waiting for download" in out  # ... but BOOT is held: the ROM waits for a host
        assert get_board(name).boots == 0
    finally:
        port.close()
        remove_board(name)


@pytest.mark.slow
def test_rfc2217_server_resets_for_esptool(s3_files) -> None:
    name = f"rfc-{uuid.uuid4().hex[:8]}"
    server = serve_rfc2217(f"sim://{name}?chip=esp32s3&emitter=c")
    try:
        # timeout=3 = esptool's DEFAULT_TIMEOUT: pyserial's RFC 2217 client renegotiates (~0.15 s) on every
        # timeout change, and esptool changes it around each command whose timeout differs
        client = serial.serial_for_url(server.address, timeout=3)
        esp = cmds.detect_chip(client, 115200, "default-reset", connect_attempts=3)  # reset by the server
        esp = cmds.run_stub(esp)
        esp.change_baud(460800)  # baud travels via RFC 2217 SET_BAUDRATE
        cmds.attach_flash(esp)
        cmds.write_flash(esp, [(o, str(p)) for o, p in s3_files], skip_flashed=True)
        # console baud first: the server's UART reads the boot output at whatever rate is set when it
        # arrives (bytes at the wrong rate are garbage, as on a real UART)
        client.baudrate = 115200
        esp.hard_reset()
        # the server resets in its own thread after the RTS change arrives: allow for a slow machine
        raw = read_until_end(client, timeout=20, idle=5)
        cap = parse_capture(raw)
        client.close()
        assert cap.valid, (cap.problems, raw[-600:], get_board(name).status())
        assert cap.nn_mode == "ansi_c" and cap.simulated
    finally:
        server.stop()
        remove_board(name)


def test_rfc2217_clients_need_no_ign_set_control(s3_files) -> None:
    """The server answers the DTR/RTS requests esptool's port manager takes over, so a client opens the
    plain URL (and waits for answers instead of pyserial's 0.1 s sleep per control request)."""
    name = f"rfc-{uuid.uuid4().hex[:8]}"
    server = serve_rfc2217(f"sim://{name}?chip=esp32s3&emitter=c")
    try:
        assert "ign_set_control" not in server.address
        client = serial.serial_for_url(server.address, timeout=3)
        esp = cmds.detect_chip(client, 115200, "default-reset", connect_attempts=3)  # DTR/RTS: answered
        assert esp.CHIP_NAME == "ESP32-S3"
        client.dtr = False  # a lone line change is acknowledged too (pyserial waits for the answer)
        client.close()
    finally:
        server.stop()
        remove_board(name)


@pytest.mark.slow
def test_cli_sim_serve_subprocess(tmp_path: Path) -> None:
    """`esp-check sim serve --rfc2217 --port 0` in its own process; esptool connects from here."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "sim",
            "serve",
            "--name",
            "cli0",
            "--chip",
            "esp32c3",
            "--rfc2217",
            "--port",
            "0",
            "--flash",
            str(tmp_path / "flash.bin"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        assert "SIMULATED BOARD" in lines[0]
        address = lines[1].split()[-1]
        assert address.startswith("rfc2217://127.0.0.1:")
        client = serial.serial_for_url(address, timeout=3)
        esp = cmds.detect_chip(client, 115200, "default-reset", connect_attempts=3)
        assert esp.CHIP_NAME == "ESP32-C3"
        client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=HANG_S)


@pytest.mark.slow
def test_esp_rfc2217_server_in_front_of_sim_port(tmp_path: Path, s3_files) -> None:
    """esptool's own esp_rfc2217_server serving a sim:// port (a remote board, reached over RFC 2217).

    esp_rfc2217_server performs its own resets (it does not forward DTR/RTS). On Linux it uses the
    ioctl reset, which a sim:// port (like a pty) cannot take; esptool's documented config option
    ``custom_reset_sequence`` makes it use plain DTR/RTS writes instead.
    """
    cfg = tmp_path / "esptool.cfg"
    cfg.write_text("[esptool]\ncustom_reset_sequence = D0|R1|W0.1|D1|R0|W0.05|D0\n")
    flash = tmp_path / "flash.bin"
    port = _free_port()
    code = (
        "import sys, harness.sim; harness.sim.register(); "
        "from esp_rfc2217_server import main; main(sys.argv[1:])"
    )
    env = dict(os.environ, ESPTOOL_CFGFILE=str(cfg))
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "-p", str(port), f"sim://remote0?chip=esp32s3&emitter=c&flash={flash}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        client = serial.serial_for_url(f"rfc2217://127.0.0.1:{port}?ign_set_control", timeout=3)
        esp = cmds.detect_chip(client, 115200, "default-reset", connect_attempts=4)
        assert esp.CHIP_NAME == "ESP32-S3"
        esp = cmds.run_stub(esp)
        cmds.attach_flash(esp)
        cmds.write_flash(esp, [(o, str(p)) for o, p in s3_files], skip_flashed=True)
        client.close()
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=HANG_S)
    data = flash.read_bytes()
    for off, path in s3_files:
        blob = path.read_bytes()
        assert data[off : off + len(blob)] == blob, out[-2000:]


def test_cli_sim_serve_rejects_bad_board_before_binding() -> None:
    from harness.cli import main

    assert main(["sim", "serve", "--chip", "esp32", "--reset", "usb_jtag", "--port", "0"]) == 2
    assert main(["sim", "serve", "--fault", "melt", "--port", "0"]) == 2
    assert main(["sim", "serve", "--boot", "sideways", "--port", "0"]) == 2
    assert main(["sim", "serve", "--flash-size", "3MB", "--port", "0"]) == 2


def _esptool_gets_the_board(server: SimServer) -> None:
    """The server thread lives, and a real client (pyserial + esptool) gets the board."""
    assert server._thread is not None and server._thread.is_alive()
    client = serial.serial_for_url(server.address, timeout=3)
    esp = cmds.detect_chip(client, 115200, "default-reset", connect_attempts=3)
    assert esp.CHIP_NAME == "ESP32-S3"
    client.close()


def test_a_client_that_vanishes_mid_handshake_does_not_take_the_board_away(s3_files) -> None:
    """Clients connect and reset the connection at once (SO_LINGER 0: the server's telnet
    negotiation hits a dead socket); the next real client (pyserial + esptool) still gets the board."""
    name = f"rfc-{uuid.uuid4().hex[:8]}"
    server = serve_rfc2217(f"sim://{name}?chip=esp32s3&emitter=c")
    try:
        for _ in range(3):
            s = socket.create_connection(("127.0.0.1", server.port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
            time.sleep(0.3)
        _esptool_gets_the_board(server)
        assert server.clients_served == 4 and server.sessions_failed >= 1, server.last_error
    finally:
        server.stop()
        remove_board(name)


def test_a_malformed_rfc2217_request_is_ignored_and_the_board_stays_served(s3_files) -> None:
    """A client's SET-BAUDRATE with a one-byte value (pyserial's port manager unpacks four bytes and
    raises struct.error, which it does not catch) is ignored: the server thread lives on, and the next
    client (pyserial + esptool) gets the board."""
    from serial import rfc2217 as r

    name = f"rfc-{uuid.uuid4().hex[:8]}"
    server = serve_rfc2217(f"sim://{name}?chip=esp32s3&emitter=c")
    try:
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            s.sendall(r.IAC + r.SB + r.COM_PORT_OPTION + r.SET_BAUDRATE + b"\x01" + r.IAC + r.SE)
            time.sleep(0.5)
        time.sleep(0.3)
        _esptool_gets_the_board(server)
        assert server.sessions_failed == 0, server.last_error
    finally:
        server.stop()
        remove_board(name)
