"""Console capture over real pyserial ports: ``loop://`` and ``socket://`` to a TCP server thread on
127.0.0.1 (the far end of the socket plays the board's UART bridge; nothing else is faked)."""

from __future__ import annotations

import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import serial
from serial.urlhandler.protocol_loop import Serial as LoopSerial

from harness.device.console import capture_run
from harness.device.ports import CAPS, Transport


def record(seq: int, body: str) -> bytes:
    text = f"@EC1 {seq} {body} "
    return f"{text}*{zlib.crc32(text.encode()):08X}\r\n".encode()


class TcpBoard:
    """A one-connection TCP server thread on 127.0.0.1 that runs ``script(conn)`` then closes."""

    def __init__(self, script: Callable[[socket.socket], None]) -> None:
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(1)
        self.port = self.srv.getsockname()[1]
        self.script = script
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        conn, _ = self.srv.accept()
        try:
            # pyserial's socket open() discards whatever already arrived (reset_input_buffer), so
            # the "board" starts talking only after the client says it is ready (see open_ready).
            conn.recv(1)
            self.script(conn)
        finally:
            conn.close()
            self.srv.close()

    @property
    def url(self) -> str:
        return f"socket://127.0.0.1:{self.port}"

    def join(self) -> None:
        self.thread.join(10)


def open_ready(url: str) -> serial.SerialBase:
    port = serial.serial_for_url(url, timeout=0.05)
    port.write(b"R")
    return port


@pytest.fixture
def stream() -> bytes:
    lines = [b"ESP-ROM:esp32s3-20210327\r\n", b"rst:0x1 (POWERON),boot:0x8 (SPI_FAST_FLASH_BOOT)\r\n"]
    lines += [f"I ({i}) app: line {i} ".encode() + b"x" * (i % 97) + b"\r\n" for i in range(4000)]
    return b"".join(lines)


def test_socket_peer_close_mid_stream_loses_nothing(stream: bytes, tmp_path: Path) -> None:
    def script(conn: socket.socket) -> None:
        for i in range(0, len(stream), 1500):  # many small writes, close right after the last
            conn.sendall(stream[i : i + 1500])
        conn.shutdown(socket.SHUT_WR)

    board = TcpBoard(script)
    port = open_ready(board.url)
    log = tmp_path / "serial.log"
    cap = capture_run(port, log_path=log, reset=None, caps=CAPS[Transport.SOCKET], silence_timeout=10)
    board.join()
    port.close()
    assert cap.ended_by == "disconnect"
    assert cap.data == stream
    assert log.read_bytes() == stream
    assert cap.boots == 1


def test_socket_stops_at_end_record(tmp_path: Path) -> None:
    body = (
        record(0, "BEGIN proto=1 fw=esp-check fwver=0.1.0 sim=1")
        + b"Output: 0.5\r\n"
        + record(1, "END status=ok records=1")
    )
    hold = threading.Event()

    def script(conn: socket.socket) -> None:
        conn.sendall(b"boot noise\r\n" + body)
        hold.wait(5)  # keep the link open: only the END record can stop the capture early

    board = TcpBoard(script)
    port = open_ready(board.url)
    t = time.monotonic()
    cap = capture_run(port, reset=None, caps=CAPS[Transport.SOCKET], silence_timeout=30, total_timeout=30)
    elapsed = time.monotonic() - t
    hold.set()
    board.join()
    port.close()
    assert cap.ended_by == "end_record"
    assert cap.complete
    assert cap.data.endswith(body)
    assert elapsed < 25  # sanity only: it did not wait for a timeout


def test_socket_silence_timeout() -> None:
    hold = threading.Event()

    def script(conn: socket.socket) -> None:
        conn.sendall(b"ESP-ROM:esp32s3-20210327\r\npartial line without newline")
        hold.wait(5)

    board = TcpBoard(script)
    port = open_ready(board.url)
    cap = capture_run(port, reset=None, caps=CAPS[Transport.SOCKET], silence_timeout=0.3, total_timeout=10)
    hold.set()
    board.join()
    port.close()
    assert cap.ended_by == "silence"
    assert cap.data.endswith(b"partial line without newline")
    assert cap.first_byte_s is not None


def test_socket_total_timeout_with_steady_output() -> None:
    stop = threading.Event()

    def script(conn: socket.socket) -> None:
        while not stop.is_set():
            conn.sendall(b"tick\r\n")
            time.sleep(0.02)

    board = TcpBoard(script)
    port = open_ready(board.url)
    cap = capture_run(port, reset=None, caps=CAPS[Transport.SOCKET], silence_timeout=5, total_timeout=0.5)
    stop.set()
    board.join()
    port.close()
    assert cap.ended_by == "timeout"
    assert cap.data.count(b"tick") >= 2


def test_boot_loop_stops_capture() -> None:
    boot = (
        b"ets Jun  8 2016 00:22:57\r\n\r\nrst:0xc (SW_CPU_RESET),boot:0x13 (SPI_FAST_FLASH_BOOT)\r\n"
        b"entry 0x400806b8\r\n"
    )
    hold = threading.Event()

    def script(conn: socket.socket) -> None:
        for _ in range(6):
            conn.sendall(
                boot + b"Guru Meditation Error: Core  0 panic'ed (LoadProhibited).\r\nRebooting...\r\n"
            )
            time.sleep(0.02)
        hold.wait(5)

    board = TcpBoard(script)
    port = open_ready(board.url)
    cap = capture_run(port, reset=None, caps=CAPS[Transport.SOCKET], silence_timeout=5, max_boots=3)
    hold.set()
    board.join()
    port.close()
    assert cap.ended_by == "boot_loop"
    assert cap.boots == 3


def test_reopen_after_port_vanishes_keeps_all_bytes() -> None:
    """USB-Serial-JTAG behaviour: the link drops on reset and comes back; the reader reopens it
    (here: the second connection is a second TCP server) and no byte of either part is lost."""
    part1 = b"I (96) esp_image: segment 0: paddr=00010020 vaddr=3c07002"
    part2 = (
        b"ESP-ROM:esp32s3-20210327\r\nrst:0x15 (USB_UART_CHIP_RESET),boot:0x8\r\n"
        + record(0, "BEGIN proto=1 fw=esp-check fwver=0.1.0 sim=1")
        + record(1, "END status=ok records=1")
    )
    first = TcpBoard(lambda c: c.sendall(part1))
    hold = threading.Event()

    def second_script(conn: socket.socket) -> None:
        conn.sendall(part2)
        hold.wait(5)

    second = TcpBoard(second_script)
    port = open_ready(first.url)
    opened: list[serial.SerialBase] = []

    def reopen() -> serial.SerialBase:
        p = open_ready(second.url)
        opened.append(p)
        return p

    cap = capture_run(port, reset=None, caps=CAPS[Transport.DEVICE], reopen=reopen, silence_timeout=5)
    hold.set()
    first.join()
    second.join()
    for p in opened:
        p.close()
    assert cap.reopens == 1
    assert cap.ended_by == "end_record"
    assert cap.data == part1 + part2
    assert cap.serial is opened[0]


class RecordingLoop(LoopSerial):
    """loop:// that records DTR/RTS changes (stands in for the board's auto-reset circuit)."""

    def __init__(self, *a: object, **k: object) -> None:
        self.lines: list[tuple[str, bool]] = []
        super().__init__(*a, **k)

    def _update_dtr_state(self) -> None:
        self.lines.append(("dtr", self._dtr_state))

    def _update_rts_state(self) -> None:
        self.lines.append(("rts", self._rts_state))


def _recording_loop() -> Iterator[RecordingLoop]:
    p = RecordingLoop(None, timeout=0.05)
    p.port = "loop://"
    p.open()
    p.lines.clear()
    return iter([p])


def test_loop_capture_with_classic_reset_and_log(tmp_path: Path) -> None:
    port = next(_recording_loop())
    payload = (
        b"hello\r\n"
        + record(0, "BEGIN proto=1 fw=esp-check fwver=0.1.0 sim=1")
        + record(1, "END status=ok records=1")
    )
    port.write(b"stale bytes from before the reset\r\n")
    time.sleep(0.05)

    # the board's output arrives after the reset: queue it from a thread once the reset happened
    def board() -> None:
        deadline = time.monotonic() + 2
        while not any(name == "rts" and state for name, state in port.lines) and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.15)  # RTS released
        port.write(payload)

    th = threading.Thread(target=board, daemon=True)
    th.start()
    log = tmp_path / "cap.log"
    cap = capture_run(port, log_path=log, reset="classic", baud=115200, silence_timeout=3)
    th.join()
    port.close()
    assert cap.resets == 1
    assert cap.ended_by == "end_record"
    assert cap.data == payload  # stale pre-reset bytes were discarded, nothing after the reset was
    assert log.read_bytes() == payload
    # classic hard reset: DTR inactive (IO0 high), RTS asserted (EN low) then released
    assert ("dtr", False) in port.lines
    rts = [state for name, state in port.lines if name == "rts"]
    assert rts[-2:] == [True, False]


def test_loop_memory_bound_keeps_everything_in_the_log(tmp_path: Path) -> None:
    port = serial.serial_for_url("loop://", timeout=0.05)
    blob = bytes(range(256)) * 40
    # loop:// holds at most 4096 bytes until read: write from a thread like a board would
    writer = threading.Thread(target=port.write, args=(blob,), daemon=True)
    writer.start()
    log = tmp_path / "big.log"
    cap = capture_run(
        port, log_path=log, reset=None, caps=CAPS[Transport.LOOP], silence_timeout=0.3, max_bytes=1000
    )
    writer.join(5)
    port.close()
    assert cap.ended_by == "silence"
    assert cap.data == blob[:1000]
    assert cap.dropped_bytes == len(blob) - 1000
    assert log.read_bytes() == blob
    assert any("memory bound" in n for n in cap.notes)


def test_transport_without_reset_is_noted() -> None:
    port = serial.serial_for_url("loop://", timeout=0.05)
    port.write(b"x\r\n")
    cap = capture_run(port, reset="classic", caps=CAPS[Transport.SOCKET], silence_timeout=0.2)
    port.close()
    assert cap.resets == 0
    assert any("cannot reset" in n for n in cap.notes)
