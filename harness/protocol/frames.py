"""Binary frames and resident-loop payloads (docs/protocol.md "Binary frames" and "Resident loop").

The twin of ``firmware_templates/common/esp_check_frame.c``: same layout, same decoder decisions (a
contract test feeds both the same bytes). Serial input is hostile: a payload length is checked before
anything is buffered, a frame counts only after its CRC-32 passed, every payload is length-checked before
it is unpacked (:class:`FrameFormatError` otherwise), and bytes that are not part of a valid frame come
back as text, in order, so IDF log lines and text records interleaved with frames survive untouched.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

VERSION = 1
MAGIC = b"\xec\xf5"
HEADER = 10
TRAILER = 4
MAX_PAYLOAD = 4096
MAX_FRAME = HEADER + MAX_PAYLOAD + TRAILER

# host -> device
CMD_HELLO, CMD_LOAD, CMD_RUN, CMD_SESSION, CMD_END, CMD_SYNC, CMD_BOOT = range(1, 8)
# device -> host
RSP_HELLO, RSP_ACK, RSP_NAK, RSP_RESULT, RSP_DATA, RSP_ERROR, RSP_SYNC, RSP_BOOT = range(0x80, 0x88)
TYPE_NAMES = {
    CMD_HELLO: "HELLO?", CMD_LOAD: "LOAD", CMD_RUN: "RUN", CMD_SESSION: "SESSION", CMD_END: "END",
    CMD_SYNC: "SYNC", CMD_BOOT: "BOOT", RSP_HELLO: "HELLO", RSP_ACK: "ACK", RSP_NAK: "NAK",
    RSP_RESULT: "RESULT", RSP_DATA: "DATA", RSP_ERROR: "ERROR", RSP_SYNC: "SYNC_ACK", RSP_BOOT: "BOOTING",
}  # fmt: skip

SRC_LOADED, SRC_PRNG = 0, 1
RES_CRC, RES_FULL, RES_FULL_IF_DIFFERENT = 0, 1, 2
RESULTS_MODES = {"crc": RES_CRC, "full": RES_FULL, "auto": RES_FULL_IF_DIFFERENT}
RUN_FIXED = 20
REC_FIXED = 20
ST_OK, ST_INVOKE_FAILED, ST_INPUT_INCOMPLETE = 0, 1, 2
FL_NONDETERMINISTIC, FL_INLINE, FL_DATA_FRAMES = 0x01, 0x02, 0x04
DATA_FIXED = 10
HELLO_FIXED = 52
NAK_BAD_FRAME, NAK_GAP = 1, 2
NO_ID = 0xFFFFFFFF
MAX_OUTPUTS = 16
FWVER_MAX = 32
ERROR_MSG_MAX = 120

STAGES = {1: "schema", 2: "resolver", 3: "alloc", 4: "input", 5: "invoke", 6: "output", 7: "internal",
          8: "model", 9: "protocol"}  # fmt: skip
STAGE_CODES = {v: k for k, v in STAGES.items()}
DTYPE_CODES = {"int8": 1, "uint8": 2, "int16": 3, "int32": 4, "float32": 5}
DTYPE_NAMES = {v: k for k, v in DTYPE_CODES.items()}
NN_NAMES = {0: "unknown", 1: "optimized", 2: "ansi_c"}
NN_CODES = {v: k for k, v in NN_NAMES.items()}


class FrameFormatError(ValueError):
    """A frame passed its CRC but its payload does not have the layout its type requires."""


def crc32(data: bytes | bytearray | memoryview) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


# ---- frames ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    """One valid frame (CRC checked)."""

    type: int
    seq: int
    payload: bytes
    flags: int = 0

    @property
    def size(self) -> int:
        """Bytes on the wire."""
        return HEADER + len(self.payload) + TRAILER

    @property
    def name(self) -> str:
        return TYPE_NAMES.get(self.type, f"0x{self.type:02x}")


def encode_frame(ftype: int, seq: int, payload: bytes = b"", flags: int = 0) -> bytes:
    """One frame: magic, type, flags, seq, len, len ^ 0xFFFF, payload, CRC-32 of all that."""
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"frame payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}")
    n = len(payload)
    head = MAGIC + struct.pack("<BBHHH", ftype & 0xFF, flags & 0xFF, seq & 0xFFFF, n, n ^ 0xFFFF)
    body = head + bytes(payload)
    return body + struct.pack("<I", crc32(body))


@dataclass
class DecoderStats:
    frames: int = 0
    bad_headers: int = 0
    bad_crc: int = 0
    skipped: int = 0

    @property
    def bad(self) -> int:
        return self.bad_headers + self.bad_crc


class FrameDecoder:
    """Streaming decoder with the C decoder's exact decisions (esp_check_frame.c).

    ``feed`` returns, in stream order, :class:`Frame` objects and ``bytes`` runs that are not part of a
    valid frame (text, noise, rejected candidates). A candidate waiting for its remaining bytes is held
    back; :meth:`flush` releases it as text at the end of a stream.
    """

    def __init__(self, max_payload: int = MAX_PAYLOAD) -> None:
        self.max_payload = min(max_payload, MAX_PAYLOAD)
        self.buf = bytearray()
        self.stats = DecoderStats()

    def feed(
        self, data: bytes | bytearray | memoryview, on_frame: Callable[[Frame], None] | None = None
    ) -> list[Frame | bytes]:
        """Decode ``data``; with ``on_frame`` each frame is handed over the moment it completes (as the C
        decoder's callback is) instead of being returned."""
        out: list[Frame | bytes] = []
        text = bytearray()
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
                take = min(n - pos, MAX_FRAME - len(self.buf))
                self.buf += data[pos : pos + take]
                pos += take
            while self.buf:
                got = self._step(text)
                if got is None:
                    break
                if isinstance(got, Frame):
                    if text:
                        out.append(bytes(text))
                        text.clear()
                    if on_frame is not None:
                        on_frame(got)
                    else:
                        out.append(got)
            if self.buf and pos >= n:
                break
        if text:
            out.append(bytes(text))
        return out

    def flush(self) -> bytes:
        """Bytes of an incomplete candidate at the end of the stream (as text)."""
        rest = bytes(self.buf)
        self.stats.skipped += len(rest)
        self.buf.clear()
        return rest

    def _drop(self, k: int, text: bytearray) -> None:
        text += self.buf[:k]
        self.stats.skipped += k
        del self.buf[:k]

    def _resync(self, text: bytearray) -> None:
        nxt = self.buf.find(MAGIC[:1], 1)
        self._drop(len(self.buf) if nxt < 0 else nxt, text)

    def _step(self, text: bytearray) -> Frame | bool | None:
        """None: wait for more bytes; True: progress without a frame; a Frame."""
        buf = self.buf
        if buf[0] != MAGIC[0]:
            nxt = buf.find(MAGIC[:1])
            self._drop(len(buf) if nxt < 0 else nxt, text)
            return True
        if len(buf) < 2:
            return None
        if buf[1] != MAGIC[1]:
            self._resync(text)
            return True
        if len(buf) < HEADER:
            return None
        ftype, flags, seq, length, length_x = struct.unpack_from("<BBHHH", buf, 2)
        if length + length_x != 0xFFFF or length > self.max_payload:
            self.stats.bad_headers += 1
            self._resync(text)
            return True
        total = HEADER + length + TRAILER
        if len(buf) < total:
            return None
        if crc32(memoryview(buf)[: HEADER + length]) != struct.unpack_from("<I", buf, HEADER + length)[0]:
            self.stats.bad_crc += 1
            self._resync(text)
            return True
        frame = Frame(ftype, seq, bytes(buf[HEADER : HEADER + length]), flags)
        del buf[:total]
        self.stats.frames += 1
        return frame


@dataclass
class SplitStream:
    """A serial capture separated into its text (frames removed, order kept) and its frames."""

    text: bytes
    frames: list[Frame]
    stats: DecoderStats


def split_stream(raw: bytes) -> SplitStream:
    """Remove every valid frame from ``raw``; everything else (text, damaged frames) stays as text."""
    if MAGIC not in raw:  # the common case of a text-only log: nothing to do
        return SplitStream(raw, [], DecoderStats(skipped=len(raw)))
    dec = FrameDecoder()
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

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_INDEX_MIX = 0xD1B54A32D192ED03
_M64 = (1 << 64) - 1


def prng_bytes(seed: int, index: int, dtype: str, nbytes: int) -> bytes:
    """The bytes the device's ``ecf_prng_fill`` writes for input ``index`` of ``seed`` (SplitMix64)."""
    if not 0 <= seed <= _M64 or not 0 <= index <= 0xFFFFFFFF:
        raise ValueError("seed must be a u64 and index a u32")
    state0 = (seed ^ ((index * _INDEX_MIX) & _M64)) & _M64
    per_draw = 8
    draws = -(-nbytes // per_draw)
    with np.errstate(over="ignore"):
        z = np.uint64(state0) + _GOLDEN * np.arange(1, draws + 1, dtype=np.uint64)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
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

    @property
    def init_stage(self) -> str | None:
        return None if self.init_status == 0 else STAGES.get(self.init_status, f"code{self.init_status}")


def encode_hello(h: Hello) -> bytes:
    fw = h.fwver.encode("ascii", "replace")[:FWVER_MAX]
    head = struct.pack(
        "<BBBBBBHIIHH",
        h.proto, int(h.sim) | (2 if h.tap else 0), NN_CODES.get(h.nn, 0),
        0xFF if h.slot is None else h.slot, h.init_status, DTYPE_CODES.get(h.input_dtype, 0),
        h.max_payload, h.window, h.input_bytes, len(h.output_bytes), 0,
    )  # fmt: skip
    sha = bytes.fromhex(h.model_sha256) if h.model_sha256 else b"\0" * 32
    return head + sha + b"".join(struct.pack("<I", n) for n in h.output_bytes) + bytes([len(fw)]) + fw


def decode_hello(p: bytes) -> Hello:
    _need(p, HELLO_FIXED + 1, "HELLO")
    proto, flags, nn, slot, init, dt, maxp, window, in_bytes, n_out, _ = struct.unpack_from("<BBBBBBHIIHH", p)
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
        proto, bool(flags & 1), bool(flags & 2), NN_NAMES.get(nn, "unknown"), None if slot == 0xFF else slot,
        init, DTYPE_NAMES.get(dt, "unknown"), maxp, window, in_bytes, tuple(outs), p[20:52].hex(), fw,
    )  # fmt: skip


def encode_run(
    ident: int,
    *,
    source: int = SRC_LOADED,
    results: int = RES_FULL,
    text: bool = False,
    repeat: int = 1,
    seed: int = 0,
    expected: Sequence[int] = (),
) -> bytes:
    if not 1 <= repeat <= 0xFFFF:
        raise ValueError(f"repeat {repeat} out of range 1..65535")
    head = struct.pack("<IBBBBHHQ", ident, source, results, int(text), 0, repeat, len(expected), seed)
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


def decode_results(p: bytes, output_bytes: Sequence[int]) -> list[ResultRecord]:
    """All records of one RESULT payload; FrameFormatError for any inconsistency (nothing partial)."""
    n = len(output_bytes)
    total = sum(output_bytes)
    pos = 0
    recs: list[ResultRecord] = []
    while pos < len(p):
        _need(p[pos:], REC_FIXED + 4 * n, "RESULT record")
        ident, status, flags, reps, us, in_crc, _ = struct.unpack_from("<IBBHIII", p, pos)
        if flags & ~(FL_NONDETERMINISTIC | FL_INLINE | FL_DATA_FRAMES) or (flags & FL_INLINE and
                                                                            flags & FL_DATA_FRAMES):
            raise FrameFormatError(f"RESULT record for input {ident} has invalid flags 0x{flags:02x}")
        pos += REC_FIXED
        crcs = struct.unpack_from(f"<{n}I", p, pos)
        pos += 4 * n
        rec = ResultRecord(ident, status, flags, reps, us, in_crc, tuple(crcs))
        if flags & FL_NONDETERMINISTIC:
            _need(p[pos:], 4 + 4 * n, "RESULT nondeterminism block")
            rec.diff_repeat = struct.unpack_from("<H", p, pos)[0]
            rec.diff_crcs = tuple(struct.unpack_from(f"<{n}I", p, pos + 4))
            pos += 4 + 4 * n
        if flags & FL_INLINE:
            _need(p[pos:], total, "RESULT inline data")
            rec.data = []
            for size in output_bytes:
                rec.data.append(p[pos : pos + size])
                pos += size
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
    ident, o, off = struct.unpack_from("<IHI", p)
    return DataChunk(ident, o, off, p[DATA_FIXED:])


@dataclass(frozen=True)
class DeviceError:
    ident: int | None
    code: int
    stage: str
    msg: str


def decode_error(p: bytes) -> DeviceError:
    _need(p, 9, "ERROR")
    ident, code = struct.unpack_from("<Ii", p)
    stage = STAGES.get(p[8], f"code{p[8]}")
    msg = p[9 : 9 + ERROR_MSG_MAX].decode("ascii", "replace")
    return DeviceError(None if ident == NO_ID else ident, code, stage, msg)


def decode_ack(p: bytes) -> int:
    _need(p, 2, "ACK")
    return int(struct.unpack_from("<H", p)[0])


def decode_nak(p: bytes) -> tuple[int, int]:
    _need(p, 3, "NAK")
    seq = struct.unpack_from("<H", p)[0]
    return int(seq), p[2]


def decode_boot(p: bytes) -> tuple[int, int]:
    _need(p, 8, "BOOTING")
    return p[0], int(struct.unpack_from("<i", p, 4)[0])


def iter_frames(raw: bytes) -> Iterator[Frame]:
    """Valid frames in a capture (convenience for reports and tests)."""
    yield from split_stream(raw).frames
