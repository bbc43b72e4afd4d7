"""The resident-loop client over pyserial's own RFC 2217 client: reading never renegotiates the port.

pyserial's RFC 2217 client sends every port setting again, and waits up to 3 s for the answers, on
each change of ``port.timeout``. A client that changed the timeout around each read failed while the
board was busy for more than 3 s ("timeout while waiting for option"). Real: the RFC 2217 client
(pyserial), the server (``esp-check sim serve --rfc2217``'s SimServer), the esp-check LoopClient.
Faked: the board (the simulator). The port's ``_reconfigure_port`` is wrapped to count the
renegotiations; it still runs.
"""

from __future__ import annotations

import uuid

import serial

import harness.sim as sim
from harness.device.loop import LoopClient
from harness.protocol import frames as fr
from harness.sim.board import remove_board
from harness.sim.serve import serve_rfc2217

sim.register()

HELLO = fr.Hello(
    proto=1, sim=True, tap=False, nn="ansi", slot=None, init_status=0, input_dtype="int8",
    max_payload=256, window=4, input_bytes=16, output_bytes=(16,), model_sha256="0" * 64, fwver="t",
)  # fmt: skip


def test_pumping_an_rfc2217_port_never_changes_its_settings() -> None:
    name = f"loop-{uuid.uuid4().hex[:8]}"
    server = serve_rfc2217(f"sim://{name}?chip=esp32s3&emitter=c")
    try:
        port = serial.serial_for_url(server.address, timeout=0)
        renegotiations: list[float | None] = []
        real = port._reconfigure_port

        def counted(*args: object, **kwargs: object) -> None:
            renegotiations.append(port.timeout)
            real(*args, **kwargs)

        port._reconfigure_port = counted
        try:
            client = LoopClient(port, HELLO)  # sets the timeout to 0, once
            renegotiations.clear()
            for _ in range(20):  # what waiting for a long invoke's answer does, 20 polls
                client.pump(0.05)
            client.pump(0.0)
            assert renegotiations == [], renegotiations
        finally:
            port.close()
    finally:
        server.stop()
        remove_board(name)
