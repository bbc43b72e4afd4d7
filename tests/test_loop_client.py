"""The host's loop client waits for a slow model's batched results before it probes (docs/protocol.md
"Flow control and sequence rules"), and takes the ACK folded into a RESULT frame.

What is faked: the board (a port that answers with the frames given to it, then stays silent, as a
device busy in its invokes does) and the clock (the client's ``time`` module: a clock that advances only
when the client sleeps, so the waits are exact and the test takes no wall time). Everything else is the
real LoopClient and the real frame codec.
"""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest

import harness.device.loop as device_loop
from harness.device.loop import LinkError, LoopClient
from harness.protocol import frames as fr

SESSION = 0x25B
HELLO = fr.Hello(
    proto=fr.VERSION, sim=True, tap=False, nn="ansi_c", slot=1, init_status=0, input_dtype="int8",
    max_payload=fr.TX_MAX_PAYLOAD, window=16384, input_bytes=16, output_bytes=(4,),
    model_sha256="0" * 64, fwver="t", session=SESSION,
)  # fmt: skip


class Clock:
    """The client's clock: advances only when the client sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += max(s, 1e-4)


class BusyBoard:
    """A device that sent ``answer`` and is now busy in its invokes (silent); it records what the host
    wrote, with the clock's time."""

    def __init__(self, clock: Clock, answer: bytes, later: list[tuple[float, bytes]] | None = None) -> None:
        self.clock, self.pending, self.timeout = clock, bytearray(answer), 0
        self.later = list(later or [])  # (seconds from now, frame): what the device sends later
        self.start = clock.now
        self.written: list[tuple[float, bytes]] = []

    @property
    def in_waiting(self) -> int:
        while self.later and self.start + self.later[0][0] <= self.clock.now:
            self.pending += self.later.pop(0)[1]
        return len(self.pending)

    def read(self, n: int) -> bytes:
        out = bytes(self.pending[:n])
        del self.pending[:n]
        return out

    def write(self, data: bytes) -> int:
        self.written.append((self.clock.now, bytes(data)))
        return len(data)


def _result(ident: int, invoke_us: int, ack: int | None = None) -> bytes:
    """A RESULT frame of one CRC-only record (status ok), the ACK folded in when ``ack`` is given."""
    payload = struct.pack("<BIII", 0, ident, invoke_us, 0x1234) + struct.pack("<I", 0xABCD)
    if ack is None:
        return fr.encode_frame(fr.RSP_RESULT, ident, payload, key=HELLO.key)
    payload += struct.pack("<H", ack)
    return fr.encode_frame(fr.RSP_RESULT, ident, payload, fr.FRAME_ACK, key=HELLO.key)


def _client(
    monkeypatch: pytest.MonkeyPatch, answer: bytes, later: list[tuple[float, bytes]] | None = None
) -> tuple[LoopClient, BusyBoard, Clock]:
    clock = Clock()
    monkeypatch.setattr(device_loop, "time", SimpleNamespace(monotonic=clock.monotonic, sleep=clock.sleep))
    board = BusyBoard(clock, answer, later)
    return LoopClient(board, HELLO, stall_timeout=30), board, clock  # type: ignore[arg-type]


def _first_probe(board: BusyBoard, after: float) -> float:
    syncs = [t for t, d in board.written if t > after and d[2:3] == bytes([fr.CMD_SYNC])]
    return syncs[0] if syncs else float("inf")


@pytest.mark.parametrize(("invoke_us", "earliest", "latest"), [(967_593, 5.5, 10.0), (2_000, 2.9, 3.5)])
def test_the_client_probes_a_silent_device_after_its_batch_window(
    monkeypatch: pytest.MonkeyPatch, invoke_us: int, earliest: float, latest: float
) -> None:
    """U-Net 48 on ANSI C (~0.97 s per invoke): the device keeps its results until the oldest waited
    2.5 s of invokes, so ~4 s between frames is no lost frame, and the client must not probe before 3 s
    + that window (a probe's SYNC would cut the batch and cost a SYNC_ACK). A fast model's device is
    still probed after 3 s (a lost tail frame is found before a 4 s silence limit)."""
    client, board, clock = _client(monkeypatch, _result(0, invoke_us))
    for i in range(1, 4):
        client.send(fr.CMD_RUN, fr.encode_run(i, results=fr.RES_CRC))
    sent = clock.now
    client.pump(0.0)  # the first result arrives: the device reported its invoke time
    with pytest.raises(LinkError):
        client.wait_frame(fr.RSP_SYNC, "a SYNC_ACK", timeout=12)
    waited = _first_probe(board, sent) - sent
    assert earliest < waited < latest, waited
    assert client.stats.probes >= 1


def test_an_ack_folded_into_a_result_frame_frees_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """The device's ACK of seq 0..2 rides on its RESULT frame: the client takes the results and frees
    the frames it acknowledges, with no ACK frame."""
    client, _board, _clock = _client(monkeypatch, _result(7, 967_593, ack=3))
    for i in range(3):
        client.send(fr.CMD_RUN, fr.encode_run(i, results=fr.RES_CRC))
    client.send(fr.CMD_RUN, fr.encode_run(3, results=fr.RES_CRC))
    client.pump(0.0)
    assert [seq for seq, _ in client.unacked] == [3]
    (f,) = client.inbox
    assert [r.ident for r in fr.decode_results(f.payload, HELLO.output_bytes)] == [7]


def test_a_device_sending_full_batches_is_not_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    """U-Net 48 on ESP-NN (0.17 s per invoke): 7 results fill a 16 KiB frame every 1.2 s, and a full
    batch goes without an ACK (the RUNs it consumed are far from half the window). Results arriving
    show the device works through its queue: no probe while they come, however long no ACK came."""
    frames_later = [(1.2 * k, _result(k, 168_101)) for k in range(1, 10)]
    client, _board, _clock = _client(monkeypatch, _result(0, 168_101), frames_later)
    for i in range(60):
        client.send(fr.CMD_RUN, fr.encode_run(i, results=fr.RES_CRC))
    with pytest.raises(LinkError):
        client.wait_frame(fr.RSP_SYNC, "a SYNC_ACK", timeout=11)
    assert len(client.inbox) == 10 and client.stats.probes == 0 and client.stats.rx_gaps == 0


@pytest.mark.parametrize("returncode", [1, -11])
def test_a_native_programs_exit_line_ends_the_wait_as_a_restart(
    monkeypatch: pytest.MonkeyPatch, returncode: int
) -> None:
    """A native board reports its program's abnormal end in one line (a sanitizer report, a signal) and
    then sends nothing more: that line is its crash report, as ``Rebooting...`` is a chip's, so the wait
    ends there as a restart instead of running into the 30 s stall limit. Faked: the board (the exit
    line, as harness.device.protocol_native writes it, then silence) and the clock."""
    from harness.device.loop import DeviceRestarted
    from harness.device.protocol_native import exit_line

    line = exit_line(returncode)
    assert line is not None
    client, _board, clock = _client(monkeypatch, b"==1==ABORTING\r\n" + line.encode("ascii"))
    client.send(fr.CMD_RUN, fr.encode_run(0, results=fr.RES_CRC))
    start = clock.now
    with pytest.raises(DeviceRestarted):
        client.wait_frame(fr.RSP_RESULT, "a RESULT", timeout=60)
    assert client.restarted and clock.now - start < 30  # the fake clock: no stall limit waited out
