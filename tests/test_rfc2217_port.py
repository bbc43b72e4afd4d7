"""``rfc2217://`` ports as esp-check opens them: a read-timeout change stays on this side of the link.

Real: pyserial's RFC 2217 client (open_port) and server (``esp-check sim serve``'s, in this process),
esptool's loader on the open port. Faked: the board (the simulator behind the server). What the client
sends is read by wrapping its own ``rfc2217_send_subnegotiation`` (recorded, then sent as before).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import serial
import serial.rfc2217 as rfc
from esptool import cmds

import harness.sim as sim
from harness.device.ports import Rfc2217Serial, open_port
from harness.sim.board import remove_board
from harness.sim.serve import SimServer, serve_rfc2217

sim.register()
PORT_SETTINGS = {rfc.SET_BAUDRATE, rfc.SET_DATASIZE, rfc.SET_PARITY, rfc.SET_STOPSIZE}


@pytest.fixture
def server() -> Iterator[SimServer]:
    name = f"rfc-port-{uuid.uuid4().hex[:8]}"
    srv = serve_rfc2217(f"sim://{name}?chip=esp32s3&emitter=c")
    yield srv
    srv.stop()
    remove_board(name)


def _record(port: serial.SerialBase) -> list[tuple[bytes, bytes]]:
    """The (option, value) subnegotiations the client sends from now on."""
    sent: list[tuple[bytes, bytes]] = []
    send = port.rfc2217_send_subnegotiation

    def recording(option: bytes, value: bytes = b"") -> None:
        sent.append((option, value))
        send(option, value)

    port.rfc2217_send_subnegotiation = recording
    return sent


def _settings(sent: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The port-settings requests among them (and the flow-control request sent with them)."""
    flow = (rfc.SET_CONTROL, rfc.SET_CONTROL_USE_NO_FLOW_CONTROL)
    return [(o, v) for o, v in sent if o in PORT_SETTINGS or (o, v) == flow]


@pytest.mark.parametrize("query", ["", "?ign_set_control"])
def test_a_timeout_change_sends_nothing_and_a_baud_change_reaches_the_board(
    server: SimServer, query: str
) -> None:
    port = open_port(server.address + query, 115200)
    try:
        assert isinstance(port, Rfc2217Serial)
        assert server._ser is not None and server._ser.baudrate == 115200
        sent = _record(port)
        for timeout in (3.0, 0.001, None, 0.05):  # what esptool and the console set
            port.timeout = timeout
        port.baudrate = 115200  # unchanged: nothing to tell the server either
        assert _settings(sent) == [], sent  # old code: all four settings + flow control, each time
        port.baudrate = 460800
        assert (rfc.SET_BAUDRATE, (460800).to_bytes(4, "big")) in sent
        assert server._ser.baudrate == 460800  # the server confirmed it: the board's UART has it
    finally:
        port.close()


def test_esptool_commands_on_a_port_left_with_a_short_timeout_renegotiate_nothing(
    server: SimServer,
) -> None:
    """esptool sets its 3 s command timeout and restores the port's (here the console's 0.05 s) around
    every command: on pyserial's own client each command sent the port settings twice and waited."""
    port = open_port(server.address + "?ign_set_control", 115200)
    try:
        esp = cmds.detect_chip(port, 115200, "default-reset", connect_attempts=3)
        assert esp.CHIP_NAME == "ESP32-S3"
        port.timeout = 0.05
        sent = _record(port)
        mac = esp.read_mac()
        assert mac and len(mac) == 6 and esp.get_chip_revision() is not None
        assert port.timeout == 0.05  # esptool did change it (and back) around its commands
        assert _settings(sent) == [], sent
    finally:
        port.close()


def test_a_port_opened_again_negotiates_everything_again(server: SimServer) -> None:
    """Close forgets what the server confirmed: a new connection is a new port on the server side."""
    port = open_port(server.address, 115200)
    port.baudrate = 230400
    port.close()
    sent = _record(port)
    port.open()
    try:
        assert {o for o, _ in _settings(sent)} == PORT_SETTINGS | {rfc.SET_CONTROL}
        assert server._ser is not None and server._ser.baudrate == 230400
    finally:
        port.close()
