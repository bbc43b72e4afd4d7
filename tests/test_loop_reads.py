"""The resident loop's client reads the port in blocks, not bytes, and still logs every byte as it came.

A frame's header says how long the frame is, so the client waits for the rest of it (bounded) and reads
it at once; text is read after a short coalescing wait. The raw log and ``client.raw`` stay the exact
bytes the device sent, and every frame is decoded as before.

What is faked: the board (a UART that releases the bytes it was given at its baud rate, as a tty's
buffer fills; and a port that, like pyserial's RFC 2217 client at a timeout of 0, hands out one byte per
``read``) and the clock (the client's ``time`` module: advances only when the client sleeps, so the test
takes no wall time and counts exactly). Everything else is the real LoopClient and the real frame codec.
"""

from __future__ import annotations

import dataclasses
import io
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest
import serial

import harness.device.loop as device_loop
from harness.device.console import RawCapture
from harness.device.loop import DeviceRestarted, LinkError, LinkLost, LoopClient
from harness.device.session import DeviceSession
from harness.flows.records import Recorder, StageTimeouts
from harness.flows.resident import Boot, ResidentBoard
from harness.protocol import frames as fr
from tests.test_loop_client import Clock  # the client's clock: advances only when it sleeps

HELLO = fr.Hello(
    proto=fr.VERSION, sim=True, tap=False, nn="ansi_c", slot=1, init_status=0, input_dtype="int8",
    max_payload=fr.TX_MAX_PAYLOAD, window=16384, input_bytes=16, output_bytes=(2304,),
    model_sha256="0" * 64, fwver="t", session=0x77,
)  # fmt: skip


class Uart:
    """A device's bytes arriving at ``baud`` (10 bits a byte) from the clock's start; counts reads."""

    def __init__(self, clock: Clock, stream: bytes, baud: int, per_read: int | None = None) -> None:
        self.clock, self.stream, self.baudrate = clock, stream, baud
        self.start, self.taken, self.timeout = clock.now, 0, 0
        self.per_read = per_read  # at most this many bytes per read (None: all that is waiting)
        self.reads = 0

    def _arrived(self) -> int:
        return min(len(self.stream), int((self.clock.now - self.start) * self.baudrate / 10))

    @property
    def in_waiting(self) -> int:
        return self._arrived() - self.taken

    def read(self, n: int) -> bytes:
        self.reads += 1
        n = min(n, self.in_waiting, self.per_read or n)
        out = self.stream[self.taken : self.taken + n]
        self.taken += n
        return out

    def write(self, data: bytes) -> int:
        return len(data)


class CountingLog(io.BytesIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.name = "serial.log"

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.writes += 1
        return super().write(data)


def _stream() -> tuple[bytes, int]:
    """What a device prints for one input of 2,304 output bytes, in CRC-then-DATA form: log lines, a
    RESULT frame, the output in DATA frames, more text, a SYNC_ACK. Returns it and its frame count."""
    key = HELLO.key
    out = bytes(range(256)) * 9
    record = struct.pack("<BIII", 0, 0, 967_593, 0x1234) + struct.pack("<I", fr.crc32(out))
    parts = [
        b"I (1203) esp_check: loop ready, window 16384\r\n",
        fr.encode_frame(fr.RSP_RESULT, 0, record, key=key),
        fr.encode_frame(fr.RSP_DATA, 1, struct.pack("<IHI", 0, 0, 0) + out[:1500], key=key),
        b"W (2210) esp_check: a warning line in between\r\n" * 3,
        fr.encode_frame(fr.RSP_DATA, 2, struct.pack("<IHI", 0, 0, 1500) + out[1500:], key=key),
        fr.encode_frame(fr.RSP_SYNC, 3, (7).to_bytes(4, "little"), key=key),
        b"I (2301) esp_check: idle\r\n",
    ]
    return b"".join(parts), 4


def _run(
    monkeypatch: pytest.MonkeyPatch, baud: int, per_read: int | None
) -> tuple[LoopClient, Uart, CountingLog]:
    clock = Clock()
    monkeypatch.setattr(device_loop, "time", SimpleNamespace(monotonic=clock.monotonic, sleep=clock.sleep))
    stream, _ = _stream()
    port = Uart(clock, stream, baud, per_read)
    log = CountingLog()
    client = LoopClient(port, HELLO, log)  # type: ignore[arg-type]
    client.wait_frame(fr.RSP_SYNC, "the SYNC_ACK", timeout=10)
    while port.taken < len(stream):  # the text after it
        client.pump(0.05)
    return client, port, log


@pytest.mark.parametrize("baud", [115200, 921600])
def test_a_frame_stream_is_read_in_blocks_and_logged_byte_identical(
    monkeypatch: pytest.MonkeyPatch, baud: int
) -> None:
    """~5 KB (a U-Net 48 result) through a UART: the old client read what had trickled in at each look,
    hundreds of reads of a few bytes; now a frame is read once its bytes are there (2 KiB blocks at
    most) and text after a short wait."""
    client, port, log = _run(monkeypatch, baud, None)
    stream, nframes = _stream()
    assert bytes(client.raw) == stream and log.getvalue() == stream  # every byte, in order, once
    assert client.stats.rx_bytes == len(stream) and client.stats.frames_received == nframes
    assert client.stats.damaged_frames == 0 and client.stats.rx_gaps == 0
    assert [f.type for f in client.inbox] == [fr.RSP_RESULT, fr.RSP_DATA, fr.RSP_DATA]
    assert b"a warning line in between" in client.text and client.text.endswith(b"idle\r\n")
    # 5 KB in blocks of up to 2 KiB, frames whole, text coalesced: a few reads, not one per look
    assert port.reads <= 12, port.reads
    assert log.writes <= 12, log.writes


def test_a_port_that_hands_out_one_byte_per_read_is_decoded_and_logged_in_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pyserial's RFC 2217 client at a timeout of 0 returns one byte per ``read`` whatever is queued:
    the client gathers what ``in_waiting`` announced before it decodes and logs it, so ~5 KB is not
    5,000 log writes and decoder feeds."""
    client, port, log = _run(monkeypatch, 921600, 1)
    stream, nframes = _stream()
    assert bytes(client.raw) == stream and log.getvalue() == stream
    assert client.stats.frames_received == nframes and client.stats.damaged_frames == 0
    assert port.reads >= len(stream)  # the port's own limit: one byte per call
    assert log.writes <= 12, log.writes


def test_a_frame_cut_short_costs_a_bounded_wait_and_keeps_its_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The device stops in the middle of a frame (it reset): the client waits at most COALESCE_MAX_S
    for the rest, logs the bytes that came, and then text after it ("Rebooting...") still ends the
    wait as a restart."""
    clock = Clock()
    monkeypatch.setattr(device_loop, "time", SimpleNamespace(monotonic=clock.monotonic, sleep=clock.sleep))
    frame = fr.encode_frame(fr.RSP_DATA, 0, bytes(2000), key=HELLO.key)
    cut = b"I (10) esp_check: ready\r\n" + frame[:700]
    port = Uart(clock, cut, 115200)
    log = CountingLog()
    client = LoopClient(port, HELLO, log)  # type: ignore[arg-type]
    clock.now += len(cut) * 10 / 115200  # all of it has arrived
    t0 = clock.now
    assert client.pump(0.0)
    assert clock.now - t0 <= device_loop.COALESCE_MAX_S + 1e-3
    assert log.getvalue() == cut and bytes(client.raw) == cut and client.stats.frames_received == 0
    assert not client.restarted
    port.stream += bytes(1400) + b"\r\nRebooting...\r\n"  # the rest never comes; the reboot's text does
    clock.now += len(port.stream) * 10 / 115200
    while port.taken < len(port.stream):
        client.pump(0.0)
    assert log.getvalue() == port.stream and client.restarted


class TickingClock(Clock):
    """Also advances 10 us per look, as a real clock does while code runs (a spinning loop ends)."""

    def monotonic(self) -> float:
        self.now += 1e-5
        return self.now


class LateUart(Uart):
    """Silent for ``quiet`` s (the device busy), then the stream at the baud rate; ``read`` of an empty
    buffer returns at once, as a port with a timeout of 0 (a loop client set it) does."""

    def __init__(self, clock: Clock, stream: bytes, baud: int, quiet: float) -> None:
        super().__init__(clock, stream, baud)
        self.start += quiet

    def _arrived(self) -> int:
        return max(0, super()._arrived())


def test_waiting_for_the_slot_switch_reply_sleeps_and_reads_in_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DeviceSession._await_frame (the BOOTING and BAUD_OK replies of a slot switch and a baud switch)
    on a port whose timeout a loop client set to 0: the old code called read(1) in a loop while the
    device was busy (0.3 s here: tens of thousands of calls) and decoded the whole buffer again per
    chunk; now it sleeps between looks and reads what waits in one block. The reply is found, every
    byte is logged once."""
    from harness.device import session as device_session
    from harness.device.session import DeviceSession

    clock = TickingClock()
    fake_time = SimpleNamespace(monotonic=clock.monotonic, sleep=clock.sleep)
    monkeypatch.setattr(device_loop, "time", fake_time)
    monkeypatch.setattr(device_session, "time", fake_time)
    reply = fr.encode_frame(fr.RSP_BOOT, 4, bytes([1, 0, 0, 0]) + (0).to_bytes(4, "little"), key=HELLO.key)
    stream = b"I (5120) esp_check: switching to ota_1\r\n" + reply + b"I (5121) esp_check: restart\r\n"
    port = LateUart(clock, stream, 921600, quiet=0.3)
    dev = DeviceSession("loop://")
    dev.serial = port  # type: ignore[assignment]
    port.is_open = True  # type: ignore[attr-defined]
    log = CountingLog()
    got = dev._await_frame(HELLO, lambda f: f.type == fr.RSP_BOOT, 5.0, log, "the BOOTING reply")
    assert got is not None and fr.decode_boot(got.payload) == (1, 0)
    assert stream.startswith(log.getvalue()) and reply in log.getvalue()
    assert dev.pending_link.damaged_frames == 0
    assert port.reads <= 12, port.reads


def _switching_session(monkeypatch: pytest.MonkeyPatch, stream: bytes) -> tuple[DeviceSession, LateUart]:
    """A session whose resident loop runs at 921600 baud on a fake UART that sends ``stream`` after 0.1 s
    (the fake clock: the switch's waits take no wall time)."""
    from harness.device import session as device_session

    clock = TickingClock()
    fake_time = SimpleNamespace(monotonic=clock.monotonic, sleep=clock.sleep)
    monkeypatch.setattr(device_loop, "time", fake_time)
    monkeypatch.setattr(device_session, "time", fake_time)
    port = LateUart(clock, stream, 921600, quiet=0.1)
    port.is_open = True  # type: ignore[attr-defined]
    dev = DeviceSession("loop://")
    dev.serial = port  # type: ignore[assignment]
    dev.link_baud = 921600
    return dev, port


OTHER = dataclasses.replace(HELLO, session=0x99)  # another boot of the app: its own boot key
_BAUD_REFUSED = struct.pack("<Ii", 921600, -1)
_BOOT_REFUSED = bytes([1, 0, 0, 0]) + struct.pack("<i", 0x1503)


def _restart(how: str) -> bytes:
    """The device booting again, as esp-check sees it: a crash line, or the new boot's HELLO (as its text
    line, or as a bare binary frame)."""
    hello = fr.encode_frame(fr.RSP_HELLO, 0, fr.encode_hello(OTHER))
    text = b"Guru Meditation Error: Core  0 panic'ed\r\nRebooting...\r\n" if how == "reboot" else b""
    return text + (fr.hello_line(hello) if how != "frame" else hello)


@pytest.mark.parametrize("how", ["reboot", "line", "frame"])
def test_a_switch_reply_of_the_next_boot_is_never_taken_for_this_boots(
    monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """The slot switch's and the baud switch's replies are read through the loop client's decoder path:
    a reply that comes after the device booted again is another boot's (valid under the new HELLO's key),
    never the running boot's. The old switch path had its own decoder loop that took a HELLO's key over
    and then accepted that boot's replies: a refused baud switch of another boot was taken as this boot's
    answer (esp-check went on at the console baud with a dead boot key), a refused slot switch of another
    boot made the running app 'refuse'; a crash line was not noticed (waits ran out, then a misleading
    error). Now each is DeviceRestarted (a link error), and nothing after the restart is used."""
    restart = _restart(how)
    dev, _port = _switching_session(
        monkeypatch, restart + fr.encode_frame(fr.RSP_BAUD, 1, _BAUD_REFUSED, key=OTHER.key)
    )
    with pytest.raises(DeviceRestarted, match="restarted while esp-check waited for the BAUD_OK reply"):
        dev.set_link_baud(HELLO, 921600, seq=3)
    dev, _port = _switching_session(
        monkeypatch, restart + fr.encode_frame(fr.RSP_BOOT, 1, _BOOT_REFUSED, key=OTHER.key)
    )
    with pytest.raises(DeviceRestarted, match="restarted while esp-check waited for the BOOTING reply"):
        dev.switch_slot(HELLO, 1, seq=3)


def test_an_earlier_boots_replayed_switch_reply_is_dropped_and_counted_as_stale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A whole frame of an earlier boot (stale bytes a UART FIFO kept across a reset) before the switch's
    reply: dropped and counted stale, as in the loop client, not taken and not counted as damage; the
    running boot's reply is the one used."""
    stale = fr.encode_frame(fr.RSP_BAUD, 1, struct.pack("<Ii", 921600, 0), key=OTHER.key)
    dev, _port = _switching_session(
        monkeypatch, stale + fr.encode_frame(fr.RSP_BAUD, 1, _BAUD_REFUSED, key=HELLO.key)
    )
    dev.link_baud = None
    assert dev.set_link_baud(HELLO, 921600, seq=3, stale_keys=[OTHER.key]) == (dev.console_baud, 4)
    assert dev.pending_link.stale_frames == 1 and dev.pending_link.damaged_frames == 0, dev.pending_link


@pytest.mark.parametrize("how", ["reboot", "line", "frame"])
def test_nothing_after_a_restart_reaches_the_clients_inbox(how: str) -> None:
    """A frame after the device booted again is the next boot's (valid under its HELLO's key, which the
    decoder follows): a loop client never queues it as this boot's (a dataset collects its inbox even
    after DeviceRestarted). The frame before the restart is kept."""
    clock = Clock()
    before = fr.encode_frame(fr.RSP_SYNC, 5, struct.pack("<I", 1), key=HELLO.key)
    after = fr.encode_frame(fr.RSP_SYNC, 1, struct.pack("<I", 2), key=OTHER.key)
    port = Uart(clock, before + _restart(how) + after, 921600)
    client = LoopClient(port, HELLO)  # type: ignore[arg-type]
    clock.now += 1.0  # everything has arrived: one pump reads it in one block
    assert client.pump(0.0)
    assert client.restarted and [f.payload for f in client.inbox] == [struct.pack("<I", 1)]


class Device(LateUart):
    """A resident app behind the UART, as esp_check_loop.c treats commands: in ``seq`` order from
    ``expected`` (a gap is NAK'd), the first ``damage`` commands arriving damaged (NAK'd, not run);
    ``answer`` gives each command's reply frame (type byte, payload), ``after`` what the device prints
    after it (a reboot). Records what the host wrote."""

    def __init__(
        self, clock: Clock, expected: int, damage: int, answer: dict[int, bytes], after: bytes = b""
    ) -> None:
        super().__init__(clock, b"", 921600, quiet=0.0)
        self.expected, self.damage, self.answer, self.after = expected, damage, answer, after
        self.writes: list[bytes] = []
        self.out_seq = 7  # the device's own frame sequence

    def _reply(self, ftype: int, payload: bytes, after: bytes = b"") -> None:
        self.stream += fr.encode_frame(ftype, self.out_seq, payload, key=HELLO.key) + after
        self.out_seq += 1

    def _arrived(self) -> int:  # a reply is there at once (the console capture reads on the real clock)
        return len(self.stream)

    def write(self, data: bytes) -> int:
        self.writes.append(bytes(data))
        for f in fr.FrameDecoder(key=HELLO.key).feed(data):
            if not isinstance(f, fr.Frame):
                continue
            if self.damage:
                self.damage -= 1
                self._reply(fr.RSP_NAK, struct.pack("<HBB", self.expected, fr.NAK_BAD_FRAME, 0))
            elif f.seq != self.expected:
                self._reply(fr.RSP_NAK, struct.pack("<HBB", self.expected, fr.NAK_GAP, 0))
            else:
                self.expected += 1
                reply = self.answer[f.type]
                payload = reply[1:] if f.type != fr.CMD_SYNC else f.payload[:4]
                self._reply(reply[0], payload, self.after if f.type == fr.CMD_BOOT else b"")
        return len(data)


def _device_session(
    monkeypatch: pytest.MonkeyPatch, expected: int, damage: int, answer: dict[int, bytes], after: bytes = b""
) -> tuple[DeviceSession, Device]:
    dev, _port = _switching_session(monkeypatch, b"")
    port = Device(_port.clock, expected, damage, answer, after)
    port.is_open = True  # type: ignore[attr-defined]
    dev.serial = port  # type: ignore[assignment]
    return dev, port


def test_a_refused_slot_switch_at_the_fast_baud_leaves_the_link_at_the_fast_baud(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An app that refuses a BOOT (esp_check_loop.c: no ECL_REBOOT) runs on at the baud it answered at:
    the session's link stays at the fast baud, and the app's next command seq is the BOOT's + 1. The old
    code set the link back to the console baud: the next switch read its reply at the wrong baud."""
    refused = bytes([fr.RSP_BOOT]) + _BOOT_REFUSED
    dev, port = _device_session(monkeypatch, 3, 0, {fr.CMD_BOOT: refused})
    rb = ResidentBoard(Recorder(), dev, {}, StageTimeouts(capture_total=1, capture_silence=1))
    rb.current = cur = Boot(None, HELLO, "ansi", next_seq=3, link_baud=921600)  # type: ignore[arg-type]
    with pytest.raises(LinkError, match="refused to boot ota_0"):
        rb.ensure("optimized", tmp_path / "serial.log")
    assert dev.link_baud == 921600 and port.baudrate == 921600
    assert rb.current is cur and cur.next_seq == 4  # the app took seq 3: the next command is 4


def test_a_nakd_slot_switch_command_is_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A BOOT the device NAKs (it arrived damaged) is sent again, as every NAK'd command is
    (docs/protocol.md, go-back-N), and counted as a repair; the old code only counted the NAK, waited the
    5 s out and read the reboot that never came."""
    refused = bytes([fr.RSP_BOOT]) + _BOOT_REFUSED
    dev, port = _device_session(monkeypatch, 3, 1, {fr.CMD_BOOT: refused})
    with pytest.raises(LinkError, match="refused to boot ota_1"):
        dev.switch_slot(HELLO, 1, seq=3, total_timeout=0.3, silence_timeout=0.3)
    boot = fr.encode_frame(fr.CMD_BOOT, 3, bytes([1]), key=HELLO.key)
    assert port.writes == [boot, boot]
    assert dev.pending_link.naks == 1 and dev.pending_link.retransmitted_frames == 1


def test_a_nakd_baud_switch_command_is_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A BAUD the device NAKs is sent again: the link switches (a repair, counted). The old code did not
    resend it: its SYNC at the next seq was a gap to the device, and the switch failed (exit 3)."""
    ok = bytes([fr.RSP_BAUD]) + struct.pack("<Ii", 921600, 0)
    dev, port = _device_session(monkeypatch, 3, 1, {fr.CMD_BAUD: ok, fr.CMD_SYNC: bytes([fr.RSP_SYNC])})
    dev.link_baud = None
    assert dev.set_link_baud(HELLO, 921600, seq=3) == (921600, 5)
    assert dev.link_baud == 921600 and port.writes[0] == port.writes[1]
    assert dev.pending_link.naks == 1 and dev.pending_link.retransmitted_frames == 1


class DeadPort(LateUart):
    """A port that fails (unplugged): on writes, or when its baud rate is set."""

    def __init__(self, clock: Clock, stream: bytes, where: str) -> None:
        super().__init__(clock, stream, 115200, quiet=0.0)
        self.where = where

    def write(self, data: bytes) -> int:
        if self.where == "write":
            raise OSError(5, "Input/output error")
        return len(data)

    def __setattr__(self, name: str, value: object) -> None:
        if name == "baudrate" and getattr(self, "where", "") == "baudrate":
            raise serial.SerialException("could not set the baud rate: device disconnected")
        super().__setattr__(name, value)


@pytest.mark.parametrize("where", ["write", "baudrate"])
def test_a_port_lost_during_the_baud_switch_is_link_lost_and_the_board_is_marked_lost(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, where: str
) -> None:
    """A port that fails while the baud switches (a write, setting its baud rate) is LinkLost, told from
    a silent device by type (exit 3), and the board is marked lost (reopened before its next boot); the
    old code let the OSError / SerialException out raw, and did not mark the board."""
    dev, _port = _switching_session(monkeypatch, b"")
    ok = fr.encode_frame(fr.RSP_BAUD, 0, struct.pack("<Ii", 921600, 0), key=HELLO.key)
    port = DeadPort(_port.clock, ok, where)
    port.is_open = True  # type: ignore[attr-defined]
    dev.serial = port  # type: ignore[assignment]
    dev.link_baud = None
    dev.board = SimpleNamespace(link_baud=921600, console="uart")
    rb = ResidentBoard(Recorder(), dev, {}, StageTimeouts(capture_total=1, capture_silence=1))
    rb.current = boot = Boot(None, HELLO, "ansi")  # type: ignore[arg-type]
    with pytest.raises(LinkLost, match="serial link was lost"):
        rb._fast_link(boot, "ansi", tmp_path / "serial.log")
    assert rb.lost and rb.current is None


def _console_switch(
    monkeypatch: pytest.MonkeyPatch, new: fr.Hello, stale: bytes, replay: bytes
) -> tuple[DeviceSession, RawCapture]:
    """A slot switch at the console baud (HELLO's boot to ``new``) on a fake UART that has sent ``stale``,
    the BOOTING reply, the reboot, ``replay`` and ``new``'s HELLO line; OTHER's key is an earlier boot's."""
    booting = fr.encode_frame(fr.RSP_BOOT, 0, bytes([1, 0, 0, 0, 0, 0, 0, 0]), key=HELLO.key)
    reboot = b"ets Jun  8 2016 00:22:57\r\n\r\nrst:0xc (SW_CPU_RESET)\r\n"
    hello = fr.hello_line(fr.encode_frame(fr.RSP_HELLO, 0, fr.encode_hello(new)))
    dev, port = _switching_session(monkeypatch, stale + booting + reboot + replay + hello)
    dev.link_baud = None
    port.start -= 10.0  # everything has arrived
    cap = dev.switch_slot(HELLO, 1, seq=3, stale_keys=[OTHER.key], total_timeout=5, silence_timeout=5)
    return dev, cap


def test_an_earlier_boots_replayed_booting_frame_at_the_console_baud_is_dropped_and_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A slot switch at the console baud reads its BOOTING reply and the reboot in one console capture
    (its frame check: this boot's key, and now earlier boots' keys): a replayed refusal of an earlier
    boot is dropped and counted stale (the new boot's first loop client reports it), never taken for this
    app's refusal; the switch goes on to the new boot's HELLO. The old capture had no earlier keys: the
    frame went uncounted."""
    new = dataclasses.replace(HELLO, session=0x55)
    stale = fr.encode_frame(fr.RSP_BOOT, 1, _BOOT_REFUSED, key=OTHER.key)
    dev, cap = _console_switch(monkeypatch, new, stale, b"")
    assert cap.ended_by == "hello" and cap.hello == fr.encode_hello(new)
    assert dev.pending_link.stale_frames == 1 and dev.pending_link.damaged_frames == 0


def test_a_nakd_slot_switch_command_at_the_console_baud_is_sent_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At the console baud the BOOTING reply is read by the console capture: a NAK of the BOOT stops it,
    the BOOT is sent again (bounded) and the switch goes on to the new boot's HELLO, the repair counted for
    the new boot's first client. The old capture ignored the NAK: the app never switched, and the capture
    ran into its silence limit without a HELLO (then esptool selected the slot)."""
    new = dataclasses.replace(HELLO, session=0x55)
    reboot = b"ets Jun  8 2016 00:22:57\r\n\r\nrst:0xc (SW_CPU_RESET)\r\n"
    reboot += fr.hello_line(fr.encode_frame(fr.RSP_HELLO, 0, fr.encode_hello(new)))
    accepted = bytes([fr.RSP_BOOT, 1, 0, 0, 0]) + (0).to_bytes(4, "little")
    dev, port = _device_session(monkeypatch, 3, 1, {fr.CMD_BOOT: accepted}, reboot)
    dev.link_baud = None
    cap = dev.switch_slot(HELLO, 1, seq=3, total_timeout=2, silence_timeout=1)
    assert cap.ended_by == "hello" and cap.hello == fr.encode_hello(new)
    boot = fr.encode_frame(fr.CMD_BOOT, 3, bytes([1]), key=HELLO.key)
    assert port.writes == [boot, boot]
    assert dev.pending_link.naks == 1 and dev.pending_link.retransmitted_frames == 1


class RebootingDevice(Device):
    """A Device whose reboot after its BOOTING reply comes at the console baud, once the host has set its
    port there (at the fast baud only the BOOTING reply comes)."""

    def __init__(
        self, clock: Clock, expected: int, damage: int, answer: dict[int, bytes], reboot: bytes
    ) -> None:
        super().__init__(clock, expected, damage, answer)
        self.reboot, self.booting = reboot, False

    def _reply(self, ftype: int, payload: bytes, after: bytes = b"") -> None:
        super()._reply(ftype, payload, after)
        self.booting = self.booting or ftype == fr.RSP_BOOT

    def __setattr__(self, name: str, value: object) -> None:
        super().__setattr__(name, value)
        if name == "baudrate" and value == 115200 and getattr(self, "booting", False) and self.reboot:
            self.stream += self.reboot
            self.reboot = b""


@pytest.mark.parametrize("link_baud", [921600, None])
def test_a_slot_switchs_repairs_are_carried_into_the_new_boots_link_stats(
    monkeypatch: pytest.MonkeyPatch, link_baud: int | None
) -> None:
    """One rule on both paths (docs/protocol.md "Fast link"): a repair seen on the way to a boot (here a
    NAK'd BOOT, sent again) is carried into that boot's first loop client, so its run is never a clean
    link. At the fast baud the old code counted the NAK while waiting for BOOTING, then the console
    capture of the reboot reset the session's pending repairs: the new boot's link looked clean. At the
    console baud it was already counted."""
    new = dataclasses.replace(HELLO, session=0x55)
    reboot = b"ets Jun  8 2016 00:22:57\r\n\r\nrst:0xc (SW_CPU_RESET)\r\n"
    reboot += fr.hello_line(fr.encode_frame(fr.RSP_HELLO, 0, fr.encode_hello(new)))
    accepted = bytes([fr.RSP_BOOT, 1, 0, 0, 0]) + (0).to_bytes(4, "little")
    dev, _port = _switching_session(monkeypatch, b"")
    port = RebootingDevice(_port.clock, 3, 1, {fr.CMD_BOOT: accepted}, reboot)
    port.is_open = True  # type: ignore[attr-defined]
    dev.serial = port  # type: ignore[assignment]
    dev.link_baud = link_baud
    caps = dataclasses.replace(dev.spec.caps, baud_change=True)  # a UART: the capture sets the console baud
    dev.spec = dataclasses.replace(dev.spec, caps=caps)
    cap = dev.switch_slot(HELLO, 1, seq=3, total_timeout=2, silence_timeout=1)
    assert cap.ended_by == "hello" and cap.hello == fr.encode_hello(new)
    boot = fr.encode_frame(fr.CMD_BOOT, 3, bytes([1]), key=HELLO.key)
    assert port.writes == [boot, boot] and dev.link_baud is None
    stats = dev.client(new).stats
    assert stats.naks == 1 and stats.retransmitted_frames == 1 and not stats.clean, stats
    assert dev.client(new).stats.clean  # reported once, by the new boot's first client


def _hello_as(how: str, hello: fr.Hello) -> bytes:
    """``hello``'s HELLO as the device sends it (its text line) or as a bare binary frame."""
    frame = fr.encode_frame(fr.RSP_HELLO, 0, fr.encode_hello(hello))
    return fr.hello_line(frame) if how == "line" else frame


@pytest.mark.parametrize("how", ["line", "frame"])
@pytest.mark.parametrize("which", ["earlier", "running"])
def test_an_earlier_boots_replayed_hello_during_a_slot_switch_is_stale_and_the_new_boots_is_adopted(
    monkeypatch: pytest.MonkeyPatch, how: str, which: str
) -> None:
    """A slot switch at the console baud reads up to the new boot's HELLO. HELLO frames are not keyed: a
    replayed HELLO of an earlier boot (stale bytes a UART FIFO kept, a console-baud slot switch), or of
    the boot being switched away from, stopped the old capture as if it were the new boot's, and the host
    adopted that boot's key (its replayed frames then passed as current). Now such a HELLO is stale:
    counted, never adopted; the capture ends at the new boot's real HELLO."""
    new = dataclasses.replace(HELLO, session=0x55)
    dev, cap = _console_switch(monkeypatch, new, b"", _hello_as(how, OTHER if which == "earlier" else HELLO))
    assert cap.ended_by == "hello" and cap.hello == fr.encode_hello(new)
    assert dev.pending_link.stale_frames == 1 and dev.pending_link.damaged_frames == 0


@pytest.mark.parametrize("how", ["line", "frame"])
def test_an_earlier_boots_replayed_hello_and_results_mid_session_are_never_used(how: str) -> None:
    """Mid-session, a replayed HELLO of an earlier boot and that boot's RESULT frame (in place of this
    boot's frame of that seq) is not a restart and sets no key: both are dropped and counted stale, none
    reaches the inbox; the frame they replaced is a gap, so the session is not clean. The old decoder took
    the replayed HELLO's key over (the client called it a restart: a false exit 3, and with that key the
    earlier boot's frames passed its CRC check as current)."""
    clock = Clock()
    before = fr.encode_frame(fr.RSP_SYNC, 5, struct.pack("<I", 1), key=HELLO.key)
    record = struct.pack("<BIII", 0, 0, 967_593, 0x1234) + struct.pack("<I", 0)
    replayed = fr.encode_frame(fr.RSP_RESULT, 6, record, key=OTHER.key)
    after = fr.encode_frame(fr.RSP_SYNC, 7, struct.pack("<I", 2), key=HELLO.key)
    port = Uart(clock, before + _hello_as(how, OTHER) + replayed + after, 921600)
    client = LoopClient(port, HELLO, stale_keys=[OTHER.key])  # type: ignore[arg-type]
    clock.now += 1.0  # everything has arrived: one pump reads it in one block
    assert client.pump(0.0)
    assert not client.restarted and client.dec.key == HELLO.key
    assert [f.payload for f in client.inbox] == [struct.pack("<I", 1), struct.pack("<I", 2)]
    assert client.stats.stale_frames == 2 and client.stats.rx_gaps == 1 and not client.stats.clean


def test_after_a_reset_a_replayed_hello_of_any_boot_seen_is_stale(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A reset boot (no boot running) reads up to the new boot's HELLO with every boot key seen so far
    as an earlier boot's: a HELLO of the boot that just ended, replayed from a FIFO after the reset, is
    stale, never the new boot. The old reset capture knew no earlier keys and stopped at the replay."""
    import harness.device.console as device_console

    monkeypatch.setattr(device_console, "hard_reset_into_app", lambda _port, _style: None)
    new = dataclasses.replace(HELLO, session=0x55)
    real = fr.hello_line(fr.encode_frame(fr.RSP_HELLO, 0, fr.encode_hello(new)))
    dev, _port = _switching_session(monkeypatch, b"")
    port = Device(_port.clock, 0, 0, {}, b"")
    port.stream = fr.hello_line(fr.encode_frame(fr.RSP_HELLO, 0, fr.encode_hello(HELLO))) + real
    port.is_open = True  # type: ignore[attr-defined]
    port.reset_input_buffer = lambda: None  # type: ignore[attr-defined]
    dev.serial = port  # type: ignore[assignment]
    rb = ResidentBoard(Recorder(), dev, {}, StageTimeouts(capture_total=2, capture_silence=1))
    rb.keys = [OTHER.key, HELLO.key]  # the ansi_c boot that was running has ended (it crashed)
    boot = rb.ensure("ansi", tmp_path / "serial.log")
    assert boot.hello == new and boot.raw.stale_frames == 1
