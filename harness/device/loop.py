"""The host side of the resident loop (docs/protocol.md "Resident loop"): frames over an open port.

:class:`LoopClient` keeps the flow-control window, go-back-N repair, probes and block reads that
section states; ACK/NAK are handled here, other frames queued for the caller, text kept for its
checks. Single-threaded: every wait pumps the port. :class:`LinkStats` counts what the link did.
"""

from __future__ import annotations

import dataclasses
import select
import struct
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import IO

import serial

from harness.chips import CONSOLE_BAUD
from harness.device.protocol_native import EXIT_LINE
from harness.errors import CaptureError, write_error
from harness.protocol import frames

MAX_RETRANSMITS = 8
ACK_TIMEOUT_S = 3.0  # no ACK for this long (and a silent device): probe (plus the batch window, see below)
SLOW_INVOKE_S = frames.SLOW_RUN_US / 1e6  # this slow per invoke: results batched by time on the device
PROBE_TOKEN = 0xEC5F0000  # SYNC tokens of probes (low 16 bits count them); sync() waits for its own
# Reading in blocks (LoopClient.pump): docs/protocol.md "Resident loop", how the host reads.
READ_BLOCK = 2048  # below a tty's 4 KiB line buffer
TEXT_BLOCK = 256
TEXT_WAIT_S = 0.005
COALESCE_MAX_S = 0.2  # a 2 KiB block takes 0.18 s at 115200 baud


class LinkError(CaptureError):
    """The resident loop's link failed: the device stalled, or frames kept getting lost (exit 3)."""


class LinkLost(LinkError):
    """The serial port itself failed (unplugged, closed, an OS error): not a silent device."""


# What ESP-IDF prints last before the chip resets: the panic handler and esp_restart ("Rebooting..."),
# the brownout interrupt (then esp_restart_noos). The next boot starts at the console baud. A native
# board's report of its program's abnormal end (EXIT_LINE) is its crash report:
# nothing more comes from that run either.
RESTART_LINES = (b"Rebooting...", b"Brownout detector was triggered", EXIT_LINE.encode("ascii"))
_RESTART_SPAN = max(len(line) for line in RESTART_LINES)  # text before a chunk a split line may start in


class DeviceRestarted(LinkError):
    """The device booted again in the middle of a command (a crash, a watchdog, a brownout): its text,
    already in the log, says why."""


# the LinkStats fields that count repairs: any of them makes a link not clean
_REPAIRS = ("retransmitted_frames", "naks", "damaged_frames", "rx_gaps")


@dataclasses.dataclass
class LinkStats:
    """What crossed the link (each direction: all bytes, and the payload bytes among them)."""

    tx_bytes: int = 0
    tx_payload: int = 0  # input tensor bytes sent in LOAD frames
    rx_bytes: int = 0
    rx_payload: int = 0  # output tensor bytes received (inline or DATA)
    frames_sent: int = 0
    frames_received: int = 0
    retransmitted_frames: int = 0
    naks: int = 0
    damaged_frames: int = 0  # device-to-host candidates that failed their checks
    rx_gaps: int = 0  # device frames lost (a gap in the device's sequence numbers)
    stale_frames: int = 0  # whole frames of an earlier boot (another session's key): dropped, never used
    probes: int = 0  # SYNC probes sent while the device was silent (a long Invoke): not repairs
    results: int = 0  # input results received (RESULT records): the per-input figures divide by it
    kept_runs: int = 0  # inputs run from the device's kept-input store (not uploaded again)
    kept_fallbacks: int = 0  # of them, the device held no valid copy: uploaded after all (not a repair)
    seconds: float = 0.0

    def add(self, other: LinkStats) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def repairs(self) -> LinkStats:
        """Only the repairs (and earlier boots' frames) of these stats: what a switch hands on to the next
        boot's client, without the traffic that client counts itself."""
        return LinkStats(**{f: getattr(self, f) for f in (*_REPAIRS, "stale_frames")})

    @property
    def clean(self) -> bool:
        """No repair was needed: nothing damaged, lost or sent twice."""
        return not any(getattr(self, f) for f in _REPAIRS)

    def to_dict(self) -> dict[str, float | int | None]:
        d: dict[str, float | int | None] = dataclasses.asdict(self)
        d["seconds"] = round(self.seconds, 3)
        d["efficiency_host_to_device"] = round(self.tx_payload / self.tx_bytes, 4) if self.tx_bytes else 0.0
        d["efficiency_device_to_host"] = round(self.rx_payload / self.rx_bytes, 4) if self.rx_bytes else 0.0
        # per input, whatever the mode (CRC-only results and random inputs have no payload to divide by):
        # bytes each way per result, and the device's bytes beyond the output bytes themselves
        n = self.results
        d["bytes_per_input_host_to_device"] = round(self.tx_bytes / n, 2) if n else None
        d["bytes_per_input_device_to_host"] = round(self.rx_bytes / n, 2) if n else None
        extra = self.rx_bytes - self.rx_payload
        d["overhead_per_input_device_to_host"] = round(extra / n, 2) if n else None
        return d


class LoopClient:
    """Command frames out, frames and text in, over a port whose app already sent HELLO."""

    def __init__(
        self,
        port: serial.SerialBase,
        hello: frames.Hello,
        log: IO[bytes] | None = None,
        *,
        stall_timeout: float = 30.0,
        ack_timeout: float = ACK_TIMEOUT_S,
        respect_window: bool = True,
        seq: int = 0,
        stale_keys: Sequence[int] = (),
    ) -> None:
        self.port = port
        self.hello = hello
        self.log = log
        self.stall_timeout = stall_timeout
        self.ack_timeout = ack_timeout
        self.window = hello.window if respect_window else 1 << 40
        # frames of this boot only: an earlier boot's (stale_keys) are dropped and counted
        self.dec = frames.FrameDecoder(key=hello.key, stale_keys=stale_keys)
        self.key = hello.key
        self.seq = seq & 0xFFFF  # the next command's seq: 0 after a boot, then it continues across clients
        self.unacked: deque[tuple[int, bytes]] = deque()  # (seq, frame bytes) sent, not yet acknowledged
        self.inbox: deque[frames.Frame] = deque()
        self.text = bytearray()
        self.raw = bytearray()  # every byte received, in order (also written to ``log``)
        self.restarted = False  # an unsolicited HELLO or a "Rebooting..." line: the device boots again
        self.stats = LinkStats()
        self.rx_expected: int | None = None  # the device's next seq (None until its first frame here)
        self.last_rx = time.monotonic()
        self._last_progress = time.monotonic()
        self._last_probe = 0.0
        self._invoke_s = 0.0  # the longest first invoke a RESULT frame reported (its first record)
        self._last_result = 0.0  # when the last RESULT frame came: the device works through the queue
        self._retries = 0
        self._t0 = time.monotonic()
        self._byte_s = byte_seconds(port)
        self._after_text = False  # the last thing decoded was text (more of it may be on its way)
        port.timeout = 0

    # ---- receiving --------------------------------------------------------------------------------

    def pump(self, wait: float = 0.0) -> bool:
        """Read what the device sent (waiting up to ``wait`` s for the first byte); True if bytes came."""
        # port.timeout stays 0 (set once): pyserial's RFC 2217 client renegotiates every port setting
        # on each timeout change, which fails while the board is busy (an invoke of more than 3 s)
        port = self.port
        try:
            n = port.in_waiting or (wait_readable(port, wait) if wait > 0 else 0)
            if not n:
                return False
            deadline = time.monotonic() + COALESCE_MAX_S
            try:
                while n:
                    self._ingest(read_waiting(port, n))
                    if self.restarted:
                        break
                    n = gather(port, self.dec.buf, self._byte_s, self._after_text, deadline)
            finally:
                self._log_io(lambda log: log.flush())
        except (serial.SerialException, OSError) as exc:
            raise LinkLost(f"resident loop: the serial link was lost ({exc})") from exc
        return True

    def _ingest(self, data: bytes) -> None:
        now = time.monotonic()
        self.last_rx = now
        self.stats.rx_bytes += len(data)
        self.raw += data
        self._log_io(lambda log: log.write(data))  # flushed once per pump: a block, not a byte
        bad_before, stale_before = self.dec.stats.bad, self.dec.stats.stale
        for item in self.dec.feed(data):
            self._after_text = not isinstance(item, frames.Frame)
            if isinstance(item, frames.Frame):
                self._on_frame(item)
            else:
                self.text += item
                # the device resets: waiting for the silence limit would add nothing
                tail = self.text[-(len(item) + _RESTART_SPAN) :]
                if any(line in tail for line in RESTART_LINES):
                    self.restarted = True
        self.stats.damaged_frames += self.dec.stats.bad - bad_before
        self.stats.stale_frames += self.dec.stats.stale - stale_before

    def _log_io(self, op: Callable[[IO[bytes]], object]) -> None:
        """``op`` on the serial log; a full disk is not a lost link (pump's OSError means the link)."""
        if self.log is not None:
            try:
                op(self.log)
            except OSError as exc:
                raise write_error(exc, f"the serial log {getattr(self.log, 'name', '')}".rstrip()) from None

    def _on_frame(self, frame: frames.Frame) -> None:
        self.stats.frames_received += 1
        if self.restarted:  # after a restart: another boot's frame (its HELLO set the key), never this one's
            return
        if self.rx_expected is not None and frame.seq != self.rx_expected:
            self.stats.rx_gaps += (frame.seq - self.rx_expected) & 0xFFFF
        self.rx_expected = (frame.seq + 1) & 0xFFFF
        if frame.type == frames.RSP_ACK:
            self._acked(frames.decode_ack(frame.payload))
        elif frame.type == frames.RSP_HELLO:
            self.restarted = True  # a new boot: everything in flight is gone
        elif frame.type == frames.RSP_NAK:
            seq, _reason = frames.decode_nak(frame.payload)
            self.stats.naks += 1
            self._acked(seq)
            self._retransmit(f"the device asked again for frame {seq}")
        else:
            if frame.type == frames.RSP_RESULT:
                self._last_result = time.monotonic()
                if frame.ack is not None:  # the ACK folded into the frame
                    self._acked(frame.ack)
                us = frames.first_invoke_us(frame.payload)
                if us is not None:
                    self._invoke_s = max(self._invoke_s, us / 1e6)
            self.inbox.append(frame)

    def _ack_wait(self) -> float:
        """How long to wait for an ACK before probing (docs/protocol.md "Flow control and sequence rules")."""
        if self._invoke_s < SLOW_INVOKE_S:
            return self.ack_timeout
        return self.ack_timeout + frames.BATCH_WAIT_US / 1e6 + 2 * self._invoke_s

    def _acked(self, next_seq: int) -> None:
        """Everything before ``next_seq`` left the device's receive buffer."""
        progressed = False
        while self.unacked and 0 < ((next_seq - self.unacked[0][0]) & 0xFFFF) <= 0x8000:  # modulo 2^16
            self.unacked.popleft()
            progressed = True
        if progressed:
            self._last_progress = time.monotonic()
            self._retries = 0

    def _retransmit(self, why: str) -> None:
        if not self.unacked:
            return
        self._retries += 1
        if self._retries > MAX_RETRANSMITS:
            raise LinkError(
                f"resident loop: frames kept getting lost ({why}; {MAX_RETRANSMITS} retransmissions)",
                hint="check the cable and the baud rate; a device that drops bytes it has room for is "
                "a firmware problem",
            )
        for _seq, frame in self.unacked:
            self._write(frame)
            self.stats.retransmitted_frames += 1
        self._last_progress = time.monotonic()

    # ---- sending ----------------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        try:
            self.port.write(data)
        except (serial.SerialException, OSError) as exc:
            raise LinkLost(f"resident loop: the serial link was lost ({exc})") from exc
        self.stats.tx_bytes += len(data)

    def in_flight(self) -> int:
        return sum(len(f) for _, f in self.unacked)

    def send(self, ftype: int, payload: bytes = b"") -> int:
        """Send one command frame once the window has room for it; returns its seq."""
        size = frames.HEADER + len(payload) + frames.TRAILER
        while self.unacked and self.in_flight() + size > self.window:
            self._wait_progress("room in the device's receive buffer")
        return self._send_now(ftype, payload)  # seq: after probes

    def _probe(self) -> None:
        """No acknowledgement for a while: a new SYNC, nothing sent twice (docs/protocol.md "Flow control
        and sequence rules"); none when the window has no room for it and its filler (the device is busy)."""
        self._last_probe = time.monotonic()
        # zero bytes first, as many as the largest frame in flight: if the tail of one was lost, the
        # device's decoder holds its start and would swallow a bare probe; the zeros complete it (its CRC
        # fails: a NAK). Behind a busy device they are noise its decoder skips (no magic byte in them).
        filler = bytes(max((len(f) for _, f in self.unacked), default=0))
        if self.in_flight() + len(filler) + frames.HEADER + 4 + frames.TRAILER > self.window:
            return
        self.stats.probes += 1
        token = (PROBE_TOKEN | (self.stats.probes & 0xFFFF)).to_bytes(4, "little")
        self._write(filler)
        self._send_now(frames.CMD_SYNC, token)

    def _send_now(self, ftype: int, payload: bytes) -> int:
        frame = frames.encode_frame(ftype, self.seq, payload, key=self.key)
        self._write(frame)
        self.unacked.append((self.seq, frame))
        self.stats.frames_sent += 1
        if len(self.unacked) == 1:
            self._last_progress = time.monotonic()
        seq = self.seq
        self.seq = (self.seq + 1) & 0xFFFF
        return seq

    def _wait_progress(self, what: str) -> None:
        """Pump once; probe after an ACK timeout (no ACK and no result); LinkError when the device stalls."""
        self.pump(0.02)
        if self.restarted:
            raise DeviceRestarted(f"the device restarted while esp-check waited for {what}")
        now = time.monotonic()
        idle = now - max(self._last_progress, self.last_rx)
        # no ACK and no result for a while: a result frame (a full batch goes without its ACK) shows the
        # device works through what it was sent; a lost frame at the tail leaves it silent
        quiet = now - max(self._last_progress, self._last_probe, self._last_result)
        if self.unacked and quiet > self._ack_wait() and now - self.last_rx > 0.2:
            self._probe()
        if idle > self.stall_timeout:
            raise LinkError(
                f"resident loop: the device stopped answering while esp-check waited for {what} "
                f"({idle:.0f} s of silence)",
                hint="a stalled device: see the serial log; for a very slow model raise --silence-timeout "
                "(a plan's capture_silence)",
            )

    def wait_frame(self, ftype: int, what: str, timeout: float | None = None) -> frames.Frame:
        """The next frame of ``ftype`` (others stay queued in order)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            for f in self.inbox:
                if f.type == ftype:
                    self.inbox.remove(f)
                    return f
            if deadline is not None and time.monotonic() > deadline:
                raise LinkError(f"resident loop: no {what} within {timeout:.0f} s")
            self._wait_progress(what)

    # ---- commands ---------------------------------------------------------------------------------

    def load(self, data: bytes) -> None:
        """The input tensor bytes, in LOAD frames (the device copies them into its staging buffer)."""
        chunk = frames.LOAD_CHUNK
        for off in range(0, len(data), chunk):
            part = data[off : off + chunk]
            self.send(frames.CMD_LOAD, frames.encode_load(off, part))
            self.stats.tx_payload += len(part)

    def sync(self, token: int = 0) -> None:
        """Everything sent so far has been run and its results sent (SYNC / SYNC_ACK)."""
        self.send(frames.CMD_SYNC, token.to_bytes(4, "little"))
        while True:
            f = self.wait_frame(frames.RSP_SYNC, "the device to finish its queued commands")
            if f.payload[:4] == token.to_bytes(4, "little"):
                break
        self._finish()

    def _finish(self) -> None:
        """Wait until every command frame is acknowledged (so a later session starts clean)."""
        while self.unacked:
            self._wait_progress("the last acknowledgement")
        self.stats.seconds = time.monotonic() - self._t0

    def text_session(self, inputs: list[bytes]) -> None:
        """SESSION, LOAD + RUN text per input, END: the device prints a complete text capture, read into
        ``self.text`` (callers check it with the protocol parser)."""
        self.send(frames.CMD_SESSION, len(inputs).to_bytes(4, "little"))
        for k, data in enumerate(inputs):
            self.load(data)
            self.send(frames.CMD_RUN, frames.encode_run(k, text=True))
        self.send(frames.CMD_END)
        while b" END status=" not in self.text:
            self._wait_progress("the END record of the text session")
        while b"\n" not in self.text[self.text.rindex(b" END status=") :]:
            self._wait_progress("the end of the END record")
        self._finish()


def wait_readable(port: serial.SerialBase, wait: float) -> int:
    """Bytes waiting after at most ``wait`` s, without touching ``port.timeout``: ``select`` on the
    port's descriptor where it has one (tty, socket://), else polling ``in_waiting`` (rfc2217://, whose
    reader thread queues bytes; sim://, native://)."""
    deadline = time.monotonic() + wait
    fileno = getattr(port, "fileno", None)
    if fileno is not None:
        try:
            fd = fileno()
        except (OSError, AttributeError, NotImplementedError, ValueError, serial.SerialException):
            fd = None
        if isinstance(fd, int) and fd >= 0:
            select.select([fd], [], [], wait)
            return int(port.in_waiting)
    while True:
        n = int(port.in_waiting)
        left = deadline - time.monotonic()
        if n or left <= 0:
            return n
        time.sleep(min(0.002, left))


def byte_seconds(port: serial.SerialBase) -> float:
    """Seconds one byte takes on the port's line (10 bits: 8N1); none: the default console baud."""
    baud = getattr(port, "baudrate", None)
    return 10.0 / (baud if isinstance(baud, int) and baud > 0 else CONSOLE_BAUD)


def gather(
    port: serial.SerialBase, held: bytes | bytearray, byte_s: float, after_text: bool, deadline: float
) -> int:
    """Bytes waiting once what is worth waiting for has come, or ``deadline`` (or the wait's own bound)
    passed: the rest of the frame candidate a decoder holds (``held``), else after text a short block;
    0 after a whole frame (nothing worth waiting for)."""
    want, limit = _wanted(held, byte_s, after_text)
    if not want:
        return 0
    deadline = min(deadline, time.monotonic() + limit)
    while True:  # between looks, sleep the time the missing bytes take on the line (at least 0.5 ms):
        n = int(port.in_waiting)  # a block costs a few polls, not one per byte
        left = deadline - time.monotonic()
        if n >= want or left <= 0:
            return n
        time.sleep(min(left, max(0.0005, (want - n) * byte_s)))


def _wanted(held: bytes | bytearray, byte_s: float, after_text: bool) -> tuple[int, float]:
    """(bytes worth waiting for, the longest to wait for them) given the candidate the decoder holds
    (``held``), as docs/protocol.md "Flow control and sequence rules" says the host reads."""
    if not held:
        return (TEXT_BLOCK, min(TEXT_WAIT_S, TEXT_BLOCK * byte_s)) if after_text else (0, 0.0)
    need = frames.HEADER - len(held)
    if need <= 0:
        length, length_x = struct.unpack_from("<HH", held, 6)
        if length + length_x != 0xFFFF:  # not a frame header: the decoder drops it at its next step
            return 0, 0.0
        need = frames.HEADER + length + frames.TRAILER - len(held)
        if need <= 0:
            return 0, 0.0
    need = min(need, READ_BLOCK)
    return need, 2 * need * byte_s + 0.002


def read_waiting(port: serial.SerialBase, n: int) -> bytes:
    """The ``n`` bytes waiting, in one block: pyserial's RFC 2217 client returns one byte per ``read`` at
    a timeout of 0 (its queue holds single bytes), so it is read until ``n`` came or it has no more."""
    data = bytes(port.read(n))
    while len(data) < n:
        more = port.read(n - len(data))
        if not more:
            break
        data += more
    return data
