"""Binary frames and resident-loop payloads: the twin of esp_check_frame.c (docs/protocol.md "Frame layout").

Serial input is hostile: a length is checked before anything is buffered or unpacked (else
:class:`FrameFormatError`), a frame counts only after its CRC-32 passed, and other bytes are text, in order.
"""

from __future__ import annotations

import base64
import binascii
import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from harness.protocol.spec import crc32

VERSION = 4
MAGIC = b"\xec\xf5"
FRAME_HEAD = struct.Struct("<2sBBHHH")  # magic, type, flags, seq, len, len ^ 0xFFFF
HEADER = FRAME_HEAD.size
TRAILER = 4
MAX_PAYLOAD = 4096  # host -> device (the device's receive buffer holds one such frame)
CTRL_MAX = 256  # device -> host: the payload of a frame but RESULT and DATA (the largest HELLO fits)
LOAD_CHUNK = MAX_PAYLOAD - 4  # input bytes per LOAD frame: its payload after the u32 offset
MAX_FRAME = HEADER + MAX_PAYLOAD + TRAILER
TX_MAX_PAYLOAD = 16384  # device -> host: RESULT and DATA frames (ECF_MAX_TX_PAYLOAD, announced in HELLO)

# host -> device
CMD_HELLO, CMD_LOAD, CMD_RUN, CMD_SESSION, CMD_END, CMD_SYNC, CMD_BOOT, CMD_BAUD = range(1, 9)
# device -> host
RSP_HELLO, RSP_ACK, RSP_NAK, RSP_RESULT, RSP_DATA, RSP_ERROR, RSP_SYNC, RSP_BOOT, RSP_BAUD = range(0x80, 0x89)
BAUD_MIN, BAUD_MAX = 9600, 5_000_000  # what BAUD accepts (ECL_BAUD_MIN / ECL_BAUD_MAX)
BAUD_CONFIRM_S = 1.0  # no command frame at the new baud within this, the device goes back (kBaudConfirmUs)
TYPE_NAMES = {
    CMD_HELLO: "HELLO?", CMD_LOAD: "LOAD", CMD_RUN: "RUN", CMD_SESSION: "SESSION", CMD_END: "END",
    CMD_SYNC: "SYNC", CMD_BOOT: "BOOT", CMD_BAUD: "BAUD", RSP_HELLO: "HELLO", RSP_ACK: "ACK", RSP_NAK: "NAK",
    RSP_RESULT: "RESULT", RSP_DATA: "DATA", RSP_ERROR: "ERROR", RSP_SYNC: "SYNC_ACK", RSP_BOOT: "BOOTING",
    RSP_BAUD: "BAUD_OK",
}  # fmt: skip

SRC_LOADED, SRC_PRNG, SRC_KEPT = 0, 1, 2
RES_CRC, RES_FULL, RES_FULL_IF_DIFFERENT = 0, 1, 2
RUN_HEAD = struct.Struct("<IBBBBHHQ")  # RUN: id, source, results, flags, keep, repeat, expected CRCs, seed
RUN_FIXED = RUN_HEAD.size
RUN_TEXT, RUN_NOW = 0x01, 0x02  # RUN flags: print text records; send this result at once
REC_HEAD = struct.Struct("<BIII")  # head, id, invoke_us, input CRC-32; without the id when HEAD_NEXT_ID
REC_FIXED = REC_HEAD.size
HEAD_STATUS_SHIFT = 4  # a RESULT record head: flags in bits 0..3, status in bits 4..5
HEAD_NEXT_ID = 0x40  # the record's id is the previous record's (in the same RESULT payload) + 1: not sent
ST_OK, ST_INVOKE_FAILED, ST_INPUT_INCOMPLETE, ST_NOT_KEPT = 0, 1, 2, 3
FL_NONDETERMINISTIC, FL_INLINE, FL_DATA_FRAMES, FL_REPEATS = 0x01, 0x02, 0x04, 0x08
DATA_HEAD = struct.Struct("<IHI")  # DATA: id, output, offset
DATA_FIXED = DATA_HEAD.size
HELLO_FIXED = 128
HELLO_SIM, HELLO_TAP = 0x01, 0x02  # HELLO flags: the simulated board; tap firmware
SLOT_UNKNOWN = 0xFF  # HELLO slot: the running app slot is not known
KEEP_HEADER, KEEP_ENTRY, KEEP_MAX = 64, 8, 0xFFFF  # the kept-input store (docs/protocol.md "Kept inputs")
KEEP_MAGIC = b"ECKEEP\x00\x03"  # its header's first bytes: the store's layout, version 3
KEEP_ALIGN = 16  # its inputs start on a boundary of this many bytes from its start
HELLO_LINE = b"@ECH HELLO "  # the HELLO frame travels as one text line: this, base64 of the frame, CRLF
HELLO_LINE_MAX = 512  # longer than any HELLO line: a longer candidate is text
NAK_BAD_FRAME, NAK_GAP = 1, 2
NO_ID = 0xFFFFFFFF
MAX_OUTPUTS = 16
FWVER_MAX = 32
ERROR_MSG_MAX = 120
ERROR_HEAD = struct.Struct("<IiB")  # ERROR: id, code, stage, then the message
ERROR_FIXED = ERROR_HEAD.size
ACK_BODY = struct.Struct("<H2x")  # ACK: next_seq, u16 0
NAK_BODY = struct.Struct("<HBx")  # NAK: next_seq, reason, u8 0
SYNC_BODY = struct.Struct("<4s")  # SYNC and SYNC_ACK: the host's token
BOOT_BODY = struct.Struct("<B3xi")  # BOOTING: slot, 3 bytes 0, status
BAUD_BODY = struct.Struct("<Ii")  # BAUD_OK: baud, status
ACK_PER_WINDOW = 2  # the device ACKs once window / this many bytes were taken in since its last ACK
# a batch whose oldest result waited this much invoke time (the RUNs after it) is sent, with the ACK folded
# in (ECL_BATCH_WAIT_US): a slow model's results share frames; none waits longer than this plus one RUN
BATCH_WAIT_US = 2_500_000
SLOW_RUN_US = 100_000  # the boot's first RUN this slow sends its result at once (ECL_SLOW_RUN_US)
FRAME_ACK = 0x01  # RESULT frame flag: the payload ends with an ACK's u16 next_seq (folded into the frame)

STAGES = {1: "schema", 2: "resolver", 3: "alloc", 4: "input", 5: "invoke", 6: "output", 7: "internal",
          8: "model", 9: "protocol"}  # fmt: skip
STAGE_CODES = {v: k for k, v in STAGES.items()}
DTYPE_CODES = {"unknown": 0, "int8": 1, "uint8": 2, "int16": 3, "int32": 4, "float32": 5}
DTYPE_NAMES = {v: k for k, v in DTYPE_CODES.items()}
NN_NAMES = {0: "unknown", 1: "optimized", 2: "ansi_c"}
NN_CODES = {v: k for k, v in NN_NAMES.items()}


class FrameFormatError(ValueError):
    """A frame passed its CRC but its payload does not have the layout its type requires."""


def key_crc(session: int, nn: str | int) -> int:
    """The boot key (docs/protocol.md "Boot key"): CRC-32 of the session id (u32 LE) and the nn code. A
    keyed frame's CRC-32 starts from it, so a frame of another boot or variant fails its check."""
    code = nn if isinstance(nn, int) else NN_CODES.get(nn, 0)
    return crc32(struct.pack("<IB", session & 0xFFFFFFFF, code & 0xFF))


def keyed(ftype: int) -> bool:
    """Every frame type but HELLO? and HELLO (which set the session up) carries the boot key."""
    return ftype not in (CMD_HELLO, RSP_HELLO)


# ---- frames ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    """One valid frame (CRC checked)."""

    type: int
    seq: int
    payload: bytes
    flags: int = 0
    ack: int | None = None  # a RESULT frame's folded ACK (FRAME_ACK): its next_seq, not in ``payload``

    @property
    def size(self) -> int:
        """Bytes on the wire."""
        return HEADER + len(self.payload) + TRAILER + (0 if self.ack is None else 2)

    @property
    def name(self) -> str:
        return TYPE_NAMES.get(self.type, f"0x{self.type:02x}")


def encode_frame(ftype: int, seq: int, payload: bytes = b"", flags: int = 0, key: int = 0) -> bytes:
    """One frame: magic, type, flags, seq, len, len ^ 0xFFFF, payload, CRC-32 of all that (starting from
    the boot key ``key`` for keyed types)."""
    if len(payload) > TX_MAX_PAYLOAD:
        raise ValueError(f"frame payload of {len(payload)} bytes exceeds {TX_MAX_PAYLOAD}")
    n = len(payload)
    head = FRAME_HEAD.pack(MAGIC, ftype & 0xFF, flags & 0xFF, seq & 0xFFFF, n, n ^ 0xFFFF)
    body = head + bytes(payload)
    return body + struct.pack("<I", crc32(body, key if keyed(ftype) else 0))


def hello_line(frame: bytes) -> bytes:
    """The text line a HELLO frame travels as (readable in a serial monitor; docs/protocol.md)."""
    return b"\r\n" + HELLO_LINE + base64.b64encode(frame) + b"\r\n"


@dataclass
class DecoderStats:
    frames: int = 0
    bad_headers: int = 0
    bad_crc: int = 0
    skipped: int = 0
    stale: int = 0  # whole frames of an earlier boot (they pass under an earlier boot key): dropped

    @property
    def bad(self) -> int:
        return self.bad_headers + self.bad_crc


class FrameDecoder:
    """Streaming decoder with the C decoder's exact decisions (esp_check_frame.c).

    ``feed`` returns, in stream order, :class:`Frame` objects and ``bytes`` runs that are not part of a
    valid frame (text, noise, rejected candidates). A candidate waiting for its remaining bytes is held
    back; :meth:`flush` releases it as text at the end of a stream.

    ``key`` is the boot key (:func:`key_crc`) keyed frames must carry; ``stale_keys`` are earlier boots'
    keys: a frame that passes under one of them is a whole frame of another boot, dropped and counted
    (``stats.stale``), never delivered. ``hello_lines`` (the host side): a HELLO that arrives as its text
    line (``@ECH HELLO <base64>``) is delivered as the HELLO frame it encodes; a HELLO (line or frame)
    that announces an earlier boot's key is stale the same way, and its key is never followed. With no
    stale keys and no HELLO lines the decisions are the C decoder's, byte for byte.
    """

    def __init__(
        self,
        max_payload: int = TX_MAX_PAYLOAD,
        *,
        key: int = 0,
        stale_keys: Sequence[int] = (),
        hello_lines: bool = True,
    ) -> None:
        self.max_payload = min(max_payload, TX_MAX_PAYLOAD)  # the device's decoder: MAX_PAYLOAD
        self.buf = bytearray()
        self.stats = DecoderStats()
        self.key = key
        self.stale_keys = tuple(k for k in stale_keys if k != key)
        self.hello_lines = hello_lines
        self._line = bytearray()  # text held back: a HELLO line that has not ended yet

    def feed(
        self, data: bytes | bytearray | memoryview, on_frame: Callable[[Frame], None] | None = None
    ) -> list[Frame | bytes]:
        """Decode ``data``; with ``on_frame`` each frame is handed over the moment it completes (as the C
        decoder's callback is) instead of being returned (HELLO lines are then not looked for)."""
        out: list[Frame | bytes] = []
        text = bytearray()
        host = self.hello_lines and on_frame is None

        def emit_text() -> None:  # text before a frame candidate: a HELLO line in it sets the key first
            if text:
                out.extend(self._hello_text(bytes(text)) if host else [bytes(text)])
                text.clear()

        pos = 0
        data = bytes(data)
        n = len(data)
        while pos < n or self.buf:
            if not self.buf:
                nxt = data.find(MAGIC[:1], pos)
                end = n if nxt < 0 else nxt
                text += data[pos:end]
                self.stats.skipped += end - pos
                pos = end
                if pos >= n:
                    break
            if pos < n:
                take = min(n - pos, HEADER + self.max_payload + TRAILER - len(self.buf))
                self.buf += data[pos : pos + take]
                pos += take
            while self.buf:
                if host and self.buf[0] == MAGIC[0]:
                    emit_text()
                got = self._step(text)
                if got is None:
                    break
                if isinstance(got, Frame):
                    emit_text()
                    if host and self._line:  # a binary frame ends any held partial line
                        out.append(bytes(self._line))
                        self._line.clear()
                    if host and got.type == RSP_HELLO and not self._follow(got):
                        self.stats.frames -= 1  # an earlier boot's HELLO: stale, never a frame
                        continue
                    if on_frame is not None:  # never on the host side
                        on_frame(got)
                    else:
                        out.append(got)
            if self.buf and pos >= n:
                break
        emit_text()
        return out

    def _follow(self, frame: Frame) -> bool:
        """A HELLO starts (or repeats) a boot: its key is the key of the frames after it. One that announces
        an earlier boot's key (replayed bytes) is stale: counted, and False (dropped, never followed)."""
        try:
            key = decode_hello(frame.payload).key
        except FrameFormatError:
            return True
        if key in self.stale_keys:
            self.stats.stale += 1
            return False
        if key != self.key:
            if self.key:
                self.stale_keys = (*self.stale_keys, self.key)
            self.key = key  # never one of the stale keys: those returned above
        return True

    def flush(self) -> bytes:
        """Bytes of an incomplete candidate at the end of the stream (as text)."""
        rest = bytes(self._line) + bytes(self.buf)
        self.stats.skipped += len(self.buf)
        self.buf.clear()
        self._line.clear()
        return rest

    # ---- HELLO lines (host side) --------------------------------------------------------------------

    def _hello_text(self, text: bytes) -> list[Frame | bytes]:
        """Split ``text`` (after what was held) into text runs and the HELLO frames of complete HELLO
        lines; hold a partial one back."""
        out: list[Frame | bytes] = []
        text = bytes(self._line) + text
        self._line.clear()
        while text:
            at = text.find(HELLO_LINE)
            if at < 0:
                keep = _partial_prefix(text, HELLO_LINE)  # the line may start at the very end
                if text[: len(text) - keep]:
                    out.append(text[: len(text) - keep])
                self._line += text[len(text) - keep :]
                break
            if at:
                out.append(text[:at])
            end = text.find(b"\n", at)
            if end < 0:
                if len(text) - at > HELLO_LINE_MAX:
                    out.append(text[at:])
                else:
                    self._line += text[at:]
                break
            frame = hello_from_line(text[at + len(HELLO_LINE) : end])
            if frame is None:
                out.append(text[at : end + 1])
            elif self._follow(frame):  # else an earlier boot's HELLO: stale, neither a frame nor text
                self.stats.frames += 1
                out.append(frame)
            text = text[end + 1 :]
        return out

    # ---- binary frames ------------------------------------------------------------------------------

    def _resync(self, text: bytearray) -> None:
        """Drop the candidate's first byte and whatever follows up to the next magic byte, as text."""
        nxt = self.buf.find(MAGIC[:1], 1)
        k = len(self.buf) if nxt < 0 else nxt
        text += self.buf[:k]
        self.stats.skipped += k
        del self.buf[:k]

    def _step(self, text: bytearray) -> Frame | bool | None:
        """None: wait for more bytes; True: progress without a frame; a Frame."""
        buf = self.buf
        if buf[0] != MAGIC[0]:
            self._resync(text)
            return True
        if len(buf) < 2:
            return None
        if buf[1] != MAGIC[1]:
            self._resync(text)
            return True
        if len(buf) < HEADER:
            return None
        _, ftype, flags, seq, length, length_x = FRAME_HEAD.unpack_from(buf)
        if length + length_x != 0xFFFF or length > self.max_payload:
            self.stats.bad_headers += 1
            self._resync(text)
            return True
        total = HEADER + length + TRAILER
        if len(buf) < total:
            return None
        body = memoryview(buf)[: HEADER + length]
        got = struct.unpack_from("<I", buf, HEADER + length)[0]
        if crc32(body, self.key if keyed(ftype) else 0) != got:
            stale = keyed(ftype) and any(crc32(body, k) == got for k in self.stale_keys)
            del body
            if stale:  # a whole, intact frame of an earlier boot: never used, never text
                self.stats.stale += 1
                del buf[:total]
                return True
            self.stats.bad_crc += 1
            self._resync(text)
            return True
        del body
        payload, ack = bytes(buf[HEADER : HEADER + length]), None
        if ftype == RSP_RESULT and flags & FRAME_ACK and length >= 2:  # a folded ACK, split off the records
            payload, ack = payload[:-2], int.from_bytes(payload[-2:], "little")
        frame = Frame(ftype, seq, payload, flags, ack)
        del buf[:total]
        self.stats.frames += 1
        return frame


def _partial_prefix(text: bytes, marker: bytes) -> int:
    """How many bytes at the end of ``text`` are the start of ``marker``."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


_B64_LINE = re.compile(rb"[A-Za-z0-9+/]+={0,2}\r*")


def hello_from_line(body: bytes) -> Frame | None:
    """The HELLO frame a HELLO line's base64 (what follows ``HELLO_LINE``, up to the line's end) holds:
    exactly one whole, valid, unkeyed HELLO frame, else None."""
    if len(body) > HELLO_LINE_MAX or not _B64_LINE.fullmatch(body):
        return None
    try:
        raw = base64.b64decode(body.rstrip(b"\r"), validate=True)
    except (binascii.Error, ValueError):
        return None
    dec = FrameDecoder(hello_lines=False)
    items = dec.feed(raw)
    if len(items) != 1 or dec.buf or not isinstance(items[0], Frame) or items[0].type != RSP_HELLO:
        return None
    return items[0]


@dataclass
class SplitStream:
    """A serial capture separated into its text (frames removed, order kept) and its frames."""

    text: bytes
    frames: list[Frame]
    stats: DecoderStats


def split_stream(raw: bytes, key: int = 0) -> SplitStream:
    """Remove every valid frame from ``raw``; everything else (text, damaged frames) stays as text.

    Keyed frames are checked with the key of the last HELLO before them (``key``: before any HELLO);
    whole frames of an earlier boot are dropped and counted (``stats.stale``)."""
    if MAGIC not in raw and HELLO_LINE not in raw:  # the common case of a text-only log: nothing to do
        return SplitStream(raw, [], DecoderStats(skipped=len(raw)))
    dec = FrameDecoder(key=key)
    text = bytearray()
    frames: list[Frame] = []
    for item in dec.feed(raw):
        if isinstance(item, Frame):
            frames.append(item)
        else:
            text += item
    text += dec.flush()
    return SplitStream(bytes(text), frames, dec.stats)


# ---- random inputs (docs/protocol.md "Random inputs") ---------------------------------------------

PRNG_GOLDEN, PRNG_INDEX_MIX = 0x9E3779B97F4A7C15, 0xD1B54A32D192ED03  # SplitMix64's increment; index spread
PRNG_MIX1, PRNG_MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # SplitMix64's two multipliers
_M64 = (1 << 64) - 1


def prng_bytes(seed: int, index: int, dtype: str, nbytes: int) -> bytes:
    """The bytes the device's ``ecf_prng_fill`` writes for input ``index`` of ``seed`` (SplitMix64)."""
    if not 0 <= seed <= _M64 or not 0 <= index <= 0xFFFFFFFF:
        raise ValueError("seed must be a u64 and index a u32")
    state0 = (seed ^ ((index * PRNG_INDEX_MIX) & _M64)) & _M64
    per_draw = 8
    draws = -(-nbytes // per_draw)
    with np.errstate(over="ignore"):
        z = np.uint64(state0) + np.uint64(PRNG_GOLDEN) * np.arange(1, draws + 1, dtype=np.uint64)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(PRNG_MIX1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(PRNG_MIX2)
        z = z ^ (z >> np.uint64(31))
    stream = z.astype("<u8").tobytes()
    if dtype == "float32":
        words = np.frombuffer(stream, "<u4")[: nbytes // 4]
        vals = (words >> np.uint32(8)).astype(np.float32) * np.float32(1.0 / 16777216.0)
        return vals.astype("<f4").tobytes() + b"\0" * (nbytes % 4)
    return stream[:nbytes]


# ---- payloads -------------------------------------------------------------------------------------


def _need(payload: bytes, n: int, what: str) -> None:
    if len(payload) < n:
        raise FrameFormatError(f"{what} payload of {len(payload)} bytes, need at least {n}")


@dataclass(frozen=True)
class Hello:
    """What the resident firmware says about itself at boot and on request."""

    proto: int
    sim: bool
    tap: bool
    nn: str
    slot: int | None
    init_status: int
    input_dtype: str
    max_payload: int
    window: int
    input_bytes: int
    output_bytes: tuple[int, ...]
    model_sha256: str
    fwver: str
    session: int = 0  # this boot's session id: with ``nn``, the boot key of every other frame
    app_sha256: str = ""  # the running app image's SHA-256 ("" unknown)
    other_sha256: str = ""  # the other app slot's image SHA-256 ("" unknown)
    keep_capacity: int = 0  # inputs the kept-input store holds for this model (0: inputs are not kept)
    kept: int = 0  # valid kept inputs the app found at boot (they survived the restart)

    @property
    def init_stage(self) -> str | None:
        return None if self.init_status == 0 else STAGES.get(self.init_status, f"code{self.init_status}")

    @property
    def key(self) -> int:
        """The boot key this boot's keyed frames carry (both directions)."""
        return key_crc(self.session, self.nn)


HELLO_HEAD = struct.Struct("<BBBBBBHIIHHI32s32s32sII")  # HELLO's fixed part: HELLO_FIXED bytes


def _sha_bytes(hexd: str) -> bytes:
    return bytes.fromhex(hexd) if hexd else b"\0" * 32


def _sha_hex(raw: bytes) -> str:
    return "" if raw == b"\0" * 32 else raw.hex()


def encode_hello(h: Hello) -> bytes:
    fw = h.fwver.encode("ascii", "replace")[:FWVER_MAX]
    head = HELLO_HEAD.pack(
        h.proto, (HELLO_SIM if h.sim else 0) | (HELLO_TAP if h.tap else 0), NN_CODES.get(h.nn, 0),
        SLOT_UNKNOWN if h.slot is None else h.slot, h.init_status, DTYPE_CODES.get(h.input_dtype, 0),
        h.max_payload, h.window, h.input_bytes, len(h.output_bytes), 0, h.session & 0xFFFFFFFF,
        _sha_bytes(h.model_sha256), _sha_bytes(h.app_sha256), _sha_bytes(h.other_sha256), h.keep_capacity,
        h.kept,
    )  # fmt: skip
    outs = b"".join(struct.pack("<I", n) for n in h.output_bytes)
    return head + outs + bytes([len(fw)]) + fw


def decode_hello(p: bytes) -> Hello:
    _need(p, HELLO_FIXED + 1, "HELLO")
    if p[0] != VERSION:
        raise FrameFormatError(
            f"HELLO of frame protocol {p[0]}, esp-check speaks {VERSION}: rebuild and flash the firmware"
        )
    proto, flags, nn, slot, init, dt, maxp, window, in_bytes, n_out, _, session, *shas, cap, kept = (
        HELLO_HEAD.unpack_from(p)
    )
    if n_out > MAX_OUTPUTS:
        raise FrameFormatError(f"HELLO announces {n_out} outputs (at most {MAX_OUTPUTS})")
    _need(p, HELLO_FIXED + 4 * n_out + 1, "HELLO")
    outs = struct.unpack_from(f"<{n_out}I", p, HELLO_FIXED)
    pos = HELLO_FIXED + 4 * n_out
    vlen = p[pos]
    if vlen > FWVER_MAX or len(p) != pos + 1 + vlen:
        raise FrameFormatError("HELLO firmware version field does not match the payload length")
    fw = p[pos + 1 : pos + 1 + vlen].decode("ascii", "replace")
    return Hello(
        proto,
        bool(flags & HELLO_SIM),
        bool(flags & HELLO_TAP),
        nn=NN_NAMES.get(nn, "unknown"),
        slot=None if slot == SLOT_UNKNOWN else slot,
        init_status=init,
        input_dtype=DTYPE_NAMES.get(dt, "unknown"),
        max_payload=maxp,
        window=window,
        input_bytes=in_bytes,
        output_bytes=tuple(outs),
        model_sha256=shas[0].hex(),
        fwver=fw,
        session=session,
        app_sha256=_sha_hex(shas[1]),
        other_sha256=_sha_hex(shas[2]),
        keep_capacity=cap,
        kept=kept,
    )


def encode_run(
    ident: int,
    *,
    source: int = SRC_LOADED,
    results: int = RES_FULL,
    text: bool = False,
    repeat: int = 1,
    seed: int = 0,
    expected: Sequence[int] = (),
    keep: bool = False,
    now: bool = False,
) -> bytes:
    """A RUN payload. ``keep``: store the loaded input as kept input ``ident`` (source loaded only);
    ``source=SRC_KEPT`` runs kept input ``ident``, ``seed`` then being its CRC-32; ``now``: send its
    result at once (with an ACK), not batched with the next ones."""
    if not 1 <= repeat <= 0xFFFF:
        raise ValueError(f"repeat {repeat} out of range 1..65535")
    flags = (RUN_TEXT if text else 0) | (RUN_NOW if now else 0)
    head = RUN_HEAD.pack(ident, source, results, flags, int(keep), repeat, len(expected), seed)
    return head + b"".join(struct.pack("<I", c & 0xFFFFFFFF) for c in expected)


def encode_load(offset: int, data: bytes) -> bytes:
    return struct.pack("<I", offset) + data


@dataclass
class ResultRecord:
    """One input's result from a RESULT frame (outputs filled from inline data or DATA frames)."""

    ident: int
    status: int
    flags: int
    repeats: int
    invoke_us: int
    input_crc: int
    crcs: tuple[int, ...]
    diff_repeat: int | None = None
    diff_crcs: tuple[int, ...] | None = None
    data: list[bytes] | None = None  # per output, when full data came
    pending: dict[int, bytearray] = field(default_factory=dict)  # output -> bytes so far (DATA frames)

    @property
    def nondeterministic(self) -> bool:
        return bool(self.flags & FL_NONDETERMINISTIC)

    @property
    def wants_data_frames(self) -> bool:
        return bool(self.flags & FL_DATA_FRAMES)


def first_invoke_us(p: bytes) -> int | None:
    """The ``invoke_us`` of a RESULT payload's first record (which always sends its id), read without
    decoding the rest; None when that input did not run ok or the payload is too short for it."""
    if len(p) < 1 + 8 or (p[0] >> HEAD_STATUS_SHIFT) & 0x03:
        return None
    return int(struct.unpack_from("<I", p, 1 + 4)[0])


def decode_results(p: bytes, output_bytes: Sequence[int]) -> list[ResultRecord]:
    """All records of one RESULT payload; FrameFormatError for any inconsistency (nothing partial).

    A deterministic record with its outputs inline carries no CRC-32s: they are computed here from the
    bytes (which the frame's CRC protected), so every record comes back with ``crcs``."""
    n = len(output_bytes)
    total = sum(output_bytes)
    pos = 0
    recs: list[ResultRecord] = []
    known = FL_NONDETERMINISTIC | FL_INLINE | FL_DATA_FRAMES | FL_REPEATS
    while pos < len(p):
        head = p[pos]
        flags, status = head & 0x0F, (head >> HEAD_STATUS_SHIFT) & 0x03
        if head & 0x80 or (head & HEAD_NEXT_ID and not recs):
            raise FrameFormatError(f"RESULT record head 0x{head:02x} is invalid")
        if head & HEAD_NEXT_ID:
            _need(p[pos:], REC_FIXED - 4, "RESULT record")
            ident = (recs[-1].ident + 1) & 0xFFFFFFFF
            us, in_crc = struct.unpack_from("<II", p, pos + 1)
            pos += REC_FIXED - 4
        else:
            _need(p[pos:], REC_FIXED, "RESULT record")
            ident, us, in_crc = struct.unpack_from("<III", p, pos + 1)
            pos += REC_FIXED
        bad = flags & ~known or (flags & FL_INLINE and flags & FL_DATA_FRAMES)
        if bad or (flags & FL_NONDETERMINISTIC and not flags & FL_REPEATS):
            raise FrameFormatError(f"RESULT record for input {ident} has invalid flags 0x{flags:02x}")
        reps, diff_at = 1, 0
        if flags & FL_REPEATS:
            _need(p[pos:], 4, "RESULT repeats block")
            reps, diff_at = struct.unpack_from("<HH", p, pos)
            pos += 4
        inline_only = flags & FL_INLINE and not flags & FL_NONDETERMINISTIC
        crcs: tuple[int, ...] = ()
        if not inline_only:
            _need(p[pos:], 4 * n, "RESULT CRC-32s")
            crcs = tuple(struct.unpack_from(f"<{n}I", p, pos))
            pos += 4 * n
        rec = ResultRecord(ident, status, flags, repeats=reps, invoke_us=us, input_crc=in_crc, crcs=crcs)
        if flags & FL_NONDETERMINISTIC:
            _need(p[pos:], 4 * n, "RESULT nondeterminism block")
            rec.diff_repeat = diff_at
            rec.diff_crcs = tuple(struct.unpack_from(f"<{n}I", p, pos))
            pos += 4 * n
        if flags & FL_INLINE:
            _need(p[pos:], total, "RESULT inline data")
            rec.data = []
            for size in output_bytes:
                rec.data.append(p[pos : pos + size])
                pos += size
            if inline_only:
                rec.crcs = tuple(crc32(d) for d in rec.data)
        recs.append(rec)
    return recs


@dataclass(frozen=True)
class DataChunk:
    ident: int
    output: int
    offset: int
    data: bytes


def decode_data(p: bytes) -> DataChunk:
    _need(p, DATA_FIXED + 1, "DATA")
    ident, o, off = DATA_HEAD.unpack_from(p)
    return DataChunk(ident, o, off, p[DATA_FIXED:])


@dataclass(frozen=True)
class DeviceError:
    ident: int | None
    code: int
    stage: str
    msg: str


def decode_error(p: bytes) -> DeviceError:
    _need(p, ERROR_FIXED, "ERROR")
    ident, code, at = ERROR_HEAD.unpack_from(p)
    stage = STAGES.get(at, f"code{at}")
    msg = p[ERROR_FIXED : ERROR_FIXED + ERROR_MSG_MAX].decode("ascii", "replace")
    return DeviceError(None if ident == NO_ID else ident, code, stage, msg)


def decode_ack(p: bytes) -> int:
    _need(p, ACK_BODY.size, "ACK")
    return int(ACK_BODY.unpack_from(p)[0])


def decode_nak(p: bytes) -> tuple[int, int]:
    _need(p, NAK_BODY.size, "NAK")
    return NAK_BODY.unpack_from(p)


def decode_boot(p: bytes) -> tuple[int, int]:
    _need(p, BOOT_BODY.size, "BOOTING")
    return BOOT_BODY.unpack_from(p)


def decode_baud(p: bytes) -> tuple[int, int]:
    """BAUD_OK: (baud, status); status 0: the device switches to ``baud`` right after this frame."""
    _need(p, BAUD_BODY.size, "BAUD_OK")
    return BAUD_BODY.unpack_from(p)
