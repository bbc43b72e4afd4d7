"""The resident command loop's device side, in Python: the twin of esp_check_loop.c, decision for decision
(docs/protocol.md "Binary frames and the resident loop"); the simulated board runs it without a C compiler."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from harness.protocol import frames
from harness.protocol.emitter import SANITIZE, emit_tensor
from harness.protocol.spec import PRINTABLE, crc32

ECL_OK, ECL_HALTED, ECL_REBOOT = 0, 1, 2


@dataclass(frozen=True)
class LoopOutput:
    """One output tensor as the loop sees it (text records need the metadata)."""

    bytes: int
    dtype: str
    shape: tuple[int, ...]
    scale: float
    zp: int
    name: str


class LoopHost(Protocol):
    """What the application gives the loop (the C side's ecl_config_t callbacks)."""

    def write(self, data: bytes) -> None: ...
    def invoke(self, data: bytes) -> tuple[int, int, list[bytes]]:
        """-> (rc, invoke_us, output bytes per output): rc 0 ok, > 0 TFLM error, < 0 the device stops."""
        ...

    def session_begin(self, emitter: Any, inputs: int) -> None: ...
    def text_extra(self, emitter: Any, i: int) -> None: ...
    def sha256_hex(self, data: bytes) -> str: ...
    def boot_slot(self, slot: int) -> int: ...
    def set_baud(self, baud: int) -> None:
        """After the BAUD reply: switch the console to ``baud`` (back by itself if nothing comes)."""
        ...


@dataclass
class LoopConfig:
    input_bytes: int
    input_dtype: str
    outputs: Sequence[LoopOutput]
    window: int
    human_max: int = 16
    sim: bool = True
    tap: bool = False
    nn: str = "unknown"
    slot: int | None = None
    init_status: int = 0
    model_sha256: str = ""
    fwver: str = "0.0.0"
    session: int = 0  # this boot's session id (docs/protocol.md "Boot key")
    app_sha256: str = ""
    other_sha256: str = ""
    baud_switch: bool = False  # the console can change its baud (a UART): BAUD is served, else refused
    keep: bytearray | memoryview | None = None  # the kept-input store (survives a restart); None: none
    keep_place: int = 0  # where the app placed the store (its address on a chip): its header records it


# what HELLO reports as configured: the fields LoopConfig and Hello share (the same name means the same
# value), but the firmware version, which is sanitized first
HELLO_AS_CONFIGURED = sorted(
    {f.name for f in fields(frames.Hello)} & {f.name for f in fields(LoopConfig)} - {"fwver"}
)


@dataclass
class _RunRequest:
    """A RUN command (docs/protocol.md "RUN"); ``expected``: the host's CRC-32s, one per output, or none."""

    ident: int
    source: int
    results: int
    repeat: int
    seed: int
    expected: tuple[int, ...]
    text: bool = False
    keep: bool = False
    now: bool = False


# the store's header before its CRC-32 (docs/protocol.md "Kept inputs", Layout): magic, input bytes,
# capacity, nonce, store bytes, the model's SHA-256, placement
KEEP_HEAD = struct.Struct("<8sIIII32sI")
_KEEP_MIN = frames.KEEP_HEADER + frames.KEEP_ALIGN  # the header, and room to align the inputs


def keep_header(input_bytes: int, cap: int, nonce: int, size: int, model_sha: bytes, place: int) -> bytes:
    """The kept-input store's header: :data:`KEEP_HEAD`'s fields, then their CRC-32."""
    head = KEEP_HEAD.pack(frames.KEEP_MAGIC, input_bytes, cap, nonce, size, model_sha, place & 0xFFFFFFFF)
    return head + struct.pack("<I", crc32(head))


def keep_slot(input_bytes: int, cap: int, k: int) -> int:
    """Where the store keeps the bytes of entry ``k``: after the entries, from a KEEP_ALIGN boundary."""
    end = frames.KEEP_HEADER + cap * frames.KEEP_ENTRY
    return end + -end % frames.KEEP_ALIGN + k * input_bytes


class KeepStore:
    """The kept-input store in ``cfg.keep`` (esp_check_loop.c ``ecl_keep_open`` and friends)."""

    def __init__(self, cfg: LoopConfig) -> None:
        self.cfg = cfg
        self.region = cfg.keep or bytearray()  # none: no room for a single entry
        self.cap = self.kept = self.nonce = 0
        region = self.region
        if not cfg.model_sha256 or cfg.input_bytes == 0 or len(region) < _KEEP_MIN:
            return
        cap = min((len(region) - _KEEP_MIN) // (cfg.input_bytes + frames.KEEP_ENTRY), frames.KEEP_MAX)
        if cap == 0:
            return
        self.cap = cap
        self.nonce = KEEP_HEAD.unpack_from(region)[3]  # the header's own: it must match in the comparison
        if self._header() != bytes(region[: frames.KEEP_HEADER]):  # not ours: a fresh, empty store
            self.nonce = cfg.session
            region[: frames.KEEP_HEADER] = self._header()
            end = frames.KEEP_HEADER + cap * frames.KEEP_ENTRY
            region[frames.KEEP_HEADER : end] = bytes(end - frames.KEEP_HEADER)
            return
        self.kept = sum(self._entry(k)[0] for k in range(cap))

    def _header(self) -> bytes:
        c = self.cfg
        sha = bytes.fromhex(c.model_sha256)
        return keep_header(c.input_bytes, self.cap, self.nonce, len(self.region), sha, c.keep_place)

    def _check(self, index: int, crc: int) -> int:
        return crc32(struct.pack("<III", self.nonce, index, crc))

    def _entry(self, k: int) -> tuple[bool, int]:
        crc, check = struct.unpack_from("<II", self.region, frames.KEEP_HEADER + k * frames.KEEP_ENTRY)
        return check == self._check(k, crc), crc

    def _slot(self, k: int) -> int:
        return keep_slot(self.cfg.input_bytes, self.cap, k)

    def find(self, ident: int, want: int) -> bytes | None:
        """The kept copy of input ``ident`` (entry ``ident % cap``) whose CRC-32 is ``want``, or None."""
        if self.cap == 0:
            return None
        k = ident % self.cap
        ok, crc = self._entry(k)
        if not ok or crc != want:
            return None
        at = self._slot(k)
        data = bytes(self.region[at : at + self.cfg.input_bytes])
        return data if crc32(data) == want else None

    def store(self, ident: int, data: bytes) -> None:
        """Keep input ``ident`` in entry ``ident % cap`` (a chunk of the dataset takes the entries over)."""
        if self.cap == 0:
            return
        k = ident % self.cap
        e = frames.KEEP_HEADER + k * frames.KEEP_ENTRY
        at = self._slot(k)
        self.region[e + 4 : e + 8] = bytes(4)  # invalid while the bytes change
        self.region[at : at + len(data)] = data
        crc = crc32(data)
        self.region[e : e + 8] = struct.pack("<II", crc, self._check(k, crc))


@dataclass
class DeviceLoop:
    """State machine of esp_check_loop.c (ecl_t); ``emitter`` prints the text records."""

    cfg: LoopConfig
    host: LoopHost
    emitter: Any  # harness.protocol.emitter.Emitter with a ``seq`` attribute
    rx_expected: int = 0
    tx_seq: int = 0
    nak_pending: bool = False
    bad_seen: int = 0
    consumed_since_ack: int = 0
    loaded: int = 0
    session_open: bool = False
    session_error: bool = False
    status: int = ECL_OK
    batch: bytearray = field(default_factory=bytearray)
    batch_last: int = 0  # the id of the last record in the batch
    batch_wait_us: int = 0  # invoke time of the RUNs after the batch's first record: how long it waited
    run_busy_us: int = 0  # invoke time of the RUN whose record is being added
    slow_shown: bool = False  # a RUN of SLOW_RUN_US or more had its result sent at once (this boot)

    def __post_init__(self) -> None:
        self.cfg.window = max(self.cfg.window, frames.MAX_FRAME)
        self.key = frames.key_crc(self.cfg.session, self.cfg.nn)
        self.dec = frames.FrameDecoder(frames.MAX_PAYLOAD, key=self.key, hello_lines=False)
        self.staging = bytearray(self.cfg.input_bytes)
        self.store = KeepStore(self.cfg)
        self.outputs_now = [bytes(o.bytes) for o in self.cfg.outputs]

    # ---- sending ----------------------------------------------------------------------------------

    def _send(self, ftype: int, payload: bytes, flags: int = 0) -> None:
        frame = frames.encode_frame(ftype, self.tx_seq, payload, flags, key=self.key)
        self.host.write(frames.hello_line(frame) if ftype == frames.RSP_HELLO else frame)
        self.tx_seq = (self.tx_seq + 1) & 0xFFFF

    def _flush(self, flags: int = 0) -> None:
        if self.batch:
            self._send(frames.RSP_RESULT, bytes(self.batch), flags)
            self.batch.clear()
        self.batch_wait_us = 0

    def _ack(self) -> None:
        self._send(frames.RSP_ACK, frames.ACK_BODY.pack(self.rx_expected))
        self.consumed_since_ack = 0

    def _flush_ack(self) -> None:
        """The batch, and an ACK of what was consumed: one RESULT frame that carries both when it can."""
        if self.batch and self.consumed_since_ack > 0 and len(self.batch) + 2 <= frames.TX_MAX_PAYLOAD:
            self.batch += struct.pack("<H", self.rx_expected)
            self._flush(frames.FRAME_ACK)
            self.consumed_since_ack = 0
            return
        self._flush()
        if self.consumed_since_ack > 0:
            self._ack()

    def _nak(self, reason: int) -> None:
        if self.nak_pending:
            return
        self._flush()
        self._send(frames.RSP_NAK, frames.NAK_BODY.pack(self.rx_expected, reason))
        self.nak_pending = True

    def error(self, ident: int, stage: int, code: int, msg: str) -> None:
        self._flush()
        raw = msg.encode("utf-8", "replace")[: frames.ERROR_MSG_MAX]
        clean = raw.translate(SANITIZE)
        head = frames.ERROR_HEAD.pack(ident & 0xFFFFFFFF, code, stage)  # code: the C's int32_t
        self._send(frames.RSP_ERROR, head + clean)

    def hello(self) -> None:
        c = self.cfg
        fw = bytes(ch if ch in PRINTABLE else 0x5F for ch in c.fwver.encode("utf-8")[: frames.FWVER_MAX])
        h = frames.Hello(
            frames.VERSION,
            max_payload=frames.TX_MAX_PAYLOAD,
            output_bytes=tuple(o.bytes for o in c.outputs),
            fwver=fw.decode("ascii"),
            keep_capacity=self.store.cap,
            kept=self.store.kept,
            **{k: getattr(c, k) for k in HELLO_AS_CONFIGURED},
        )
        self._flush()
        self._send(frames.RSP_HELLO, frames.encode_hello(h))

    # ---- receiving --------------------------------------------------------------------------------

    def rx(self, data: bytes) -> int:
        if self.status != ECL_OK:
            return self.status
        self.dec.feed(data, on_frame=self._on_frame)
        if self.status == ECL_OK and self.dec.stats.bad != self.bad_seen:
            self.bad_seen = self.dec.stats.bad
            self._nak(frames.NAK_BAD_FRAME)
        return self.status

    def idle(self) -> int:
        if self.status != ECL_OK:
            return self.status
        self._flush_ack()
        return self.status

    def _on_frame(self, f: frames.Frame) -> None:
        if self.status != ECL_OK:
            return
        if self.dec.stats.bad != self.bad_seen:  # bad candidates before this frame: NAK them first
            self.bad_seen = self.dec.stats.bad
            self._nak(frames.NAK_BAD_FRAME)
        d = (f.seq - self.rx_expected) & 0xFFFF
        if d >= 0x8000:
            self._ack()
            return
        if d > 0:
            self._nak(frames.NAK_GAP)
            return
        self.nak_pending = False
        self.rx_expected = (self.rx_expected + 1) & 0xFFFF
        self.consumed_since_ack += f.size
        if self.consumed_since_ack >= self.cfg.window // frames.ACK_PER_WINDOW:
            self._ack()
        self._dispatch(f)

    def _dispatch(self, f: frames.Frame) -> None:
        handlers: dict[int, Callable[[frames.Frame], None]] = {
            frames.CMD_HELLO: lambda _f: self.hello(),
            frames.CMD_LOAD: self._load,
            frames.CMD_RUN: self._run,
            frames.CMD_SESSION: self._session,
            frames.CMD_END: self._end,
            frames.CMD_SYNC: self._sync,
            frames.CMD_BOOT: self._boot,
            frames.CMD_BAUD: self._baud,
        }
        handler = handlers.get(f.type)
        if handler is None:
            self.error(frames.NO_ID, frames.STAGE_CODES["protocol"], f.type, "unknown_command")
        else:
            handler(f)

    # ---- commands ---------------------------------------------------------------------------------

    def _load(self, f: frames.Frame) -> None:
        if len(f.payload) < 4:
            self.error(frames.NO_ID, frames.STAGE_CODES["protocol"], len(f.payload), "bad_load_command")
            return
        off = struct.unpack_from("<I", f.payload)[0]
        n = len(f.payload) - 4
        if off > self.cfg.input_bytes or n > self.cfg.input_bytes - off:
            code = int.from_bytes(f.payload[:4], "little", signed=True)  # the offset, as C's int32_t
            self.error(frames.NO_ID, frames.STAGE_CODES["input"], code, "load_beyond_input_tensor")
            self.loaded = 0
            return
        self.staging[off : off + n] = f.payload[4:]
        self.loaded += n

    def _session(self, f: frames.Frame) -> None:
        self._flush()
        self.session_open = True
        self.session_error = False
        self.emitter.seq = 0
        inputs = struct.unpack_from("<I", f.payload)[0] if len(f.payload) >= 4 else 0
        self.host.session_begin(self.emitter, inputs)

    def _end(self, f: frames.Frame) -> None:
        self._flush()
        if not self.session_open:
            self.error(frames.NO_ID, frames.STAGE_CODES["protocol"], 0, "end_without_session")
            return
        self.emitter.end(not self.session_error)
        self.session_open = False

    def _sync(self, f: frames.Frame) -> None:
        self._flush()
        token = (
            f.payload if len(f.payload) >= frames.SYNC_BODY.size else b""
        )  # pack: its first 4 bytes, or 0s
        self._send(frames.RSP_SYNC, frames.SYNC_BODY.pack(token))

    def _boot(self, f: frames.Frame) -> None:
        slot = f.payload[0] if f.payload else 0xFF
        rc = self.host.boot_slot(slot) if f.payload and slot <= 1 else -1
        self._flush()
        self._send(frames.RSP_BOOT, frames.BOOT_BODY.pack(slot, rc))
        if rc == 0:
            self.status = ECL_REBOOT

    def _baud(self, f: frames.Frame) -> None:
        baud = struct.unpack_from("<I", f.payload)[0] if len(f.payload) >= 4 else 0
        rc = 0 if self.cfg.baud_switch and frames.BAUD_MIN <= baud <= frames.BAUD_MAX else -1
        self._flush()
        self._send(frames.RSP_BAUD, frames.BAUD_BODY.pack(baud, rc))
        if rc == 0:
            self.host.set_baud(baud)  # after the reply: it leaves at the old baud

    def _parse_run(self, f: frames.Frame) -> _RunRequest | None:
        p = f.payload
        if len(p) < frames.RUN_FIXED:
            return None
        ident, source, results, text, keep, repeat, n_expect, seed = frames.RUN_HEAD.unpack_from(p)
        if len(p) != frames.RUN_FIXED + 4 * n_expect or n_expect not in (0, len(self.cfg.outputs)):
            return None
        text, now = text & frames.RUN_TEXT, text // frames.RUN_NOW  # flags: RUN_NOW and any bit above it
        if source > frames.SRC_KEPT or results > frames.RES_FULL_IF_DIFFERENT or now > 1 or repeat == 0:
            return None
        if keep > 1 or (keep and source != frames.SRC_LOADED) or (text and source == frames.SRC_KEPT):
            return None
        expected = tuple(struct.unpack_from(f"<{n_expect}I", p, frames.RUN_FIXED))
        flags = {"text": bool(text), "keep": bool(keep), "now": bool(now)}
        return _RunRequest(ident, source, results, repeat, seed, expected, **flags)

    def _run(self, f: frames.Frame) -> None:
        r = self._parse_run(f)
        if r is None or (r.text and not self.session_open):
            ident = struct.unpack_from("<I", f.payload)[0] if len(f.payload) >= 4 else frames.NO_ID
            self.error(ident, frames.STAGE_CODES["protocol"], len(f.payload), "bad_run_command")
            self.loaded = 0
            return
        data: bytes | None = None  # the input a kept source names (else the staging buffer's)
        if r.source == frames.SRC_PRNG:
            self.staging[:] = frames.prng_bytes(r.seed, r.ident, self.cfg.input_dtype, self.cfg.input_bytes)
        elif r.source == frames.SRC_KEPT:
            data = self.store.find(r.ident, r.seed & 0xFFFFFFFF)
            if data is None:
                self._not_run(r.ident, frames.ST_NOT_KEPT)
                return
        elif self.loaded != self.cfg.input_bytes:
            self.loaded = 0
            if r.text:
                self._flush()
                self.emitter.error("input", 0, "input_not_loaded", r.ident)
                self.session_error = True
                return
            self._not_run(r.ident, frames.ST_INPUT_INCOMPLETE)
            return
        elif r.keep:
            self.store.store(r.ident, bytes(self.staging))
        self.loaded = 0
        data = bytes(self.staging) if data is None else data
        if r.text:
            self._flush()
            self._run_text(r, data)
        else:
            self._run_binary(r, data)

    def _not_run(self, ident: int, status: int) -> None:
        rec = frames.REC_HEAD.pack(status << frames.HEAD_STATUS_SHIFT, ident, 0, 0)
        self.run_busy_us = 0
        self._emit_record(bytearray(rec + b"\0" * (4 * len(self.cfg.outputs))), frames.REC_FIXED, full=False)

    def _invoke(self, data: bytes) -> tuple[int, int]:
        rc, us, outs = self.host.invoke(data)
        if rc == 0:
            if len(outs) != len(self.cfg.outputs) or any(
                len(b) != o.bytes for b, o in zip(outs, self.cfg.outputs, strict=True)
            ):
                raise ValueError("invoke returned outputs of the wrong size")
            self.outputs_now = list(outs)
        return rc, us

    def _run_text(self, r: _RunRequest, data: bytes) -> None:
        em = self.emitter
        em.input(r.ident, self.cfg.input_bytes, self.host.sha256_hex(data))
        rc, us = self._invoke(data)
        if rc < 0:
            self.status = ECL_HALTED
            return
        if rc > 0:
            em.error("invoke", rc, "Invoke_failed", r.ident)
            self.session_error = True
            return
        em.time(r.ident, us)
        for o, (t, data) in enumerate(zip(self.cfg.outputs, self.outputs_now, strict=True)):
            if not emit_tensor(em, r.ident, o, t, data, self.cfg.human_max):
                self.session_error = True
                return
        self.host.text_extra(em, r.ident)

    def _crcs(self) -> list[int]:
        return [crc32(b) for b in self.outputs_now]

    def _run_binary(self, r: _RunRequest, data: bytes) -> None:
        n = len(self.cfg.outputs)
        input_crc = crc32(data)
        done, first_us, status, flags, first_diff, busy_us = 0, 0, frames.ST_OK, 0, 0, 0
        first: list[int] = [0] * n
        diff: list[int] = []
        while done < r.repeat:
            rc, us = self._invoke(data)
            if rc < 0:
                self.status = ECL_HALTED
                return
            if rc > 0:
                status, first_us = frames.ST_INVOKE_FAILED, rc
                break
            busy_us = min(busy_us + us, 0xFFFFFFFF)
            if done == 0:
                first_us, first = us, self._crcs()
            elif not flags & frames.FL_NONDETERMINISTIC:
                now = self._crcs()
                if now != first:
                    flags |= frames.FL_NONDETERMINISTIC
                    first_diff, diff = done, now
            done += 1
        if r.repeat > 1:
            flags |= frames.FL_REPEATS
        head = flags | status << frames.HEAD_STATUS_SHIFT
        rec = bytearray(frames.REC_HEAD.pack(head, r.ident, first_us & 0xFFFFFFFF, input_crc))
        if flags & frames.FL_REPEATS:
            rec += struct.pack("<HH", done, first_diff)
        crc_at = len(rec)
        rec += b"".join(struct.pack("<I", c if status == frames.ST_OK else 0) for c in first)
        if flags & frames.FL_NONDETERMINISTIC:
            rec += b"".join(struct.pack("<I", c) for c in diff)
        full = False
        if status == frames.ST_OK:
            if r.results == frames.RES_FULL:
                full = True
            elif r.results == frames.RES_FULL_IF_DIFFERENT:
                full = not r.expected or any(e != c for e, c in zip(r.expected, first, strict=False))
        self.run_busy_us = busy_us
        self._emit_record(rec, crc_at, full)
        # a batch that waited long enough (a slow model's results share frames), or asked for, or the boot's
        # first slow RUN (the host learns the invoke time): out, with the ACK
        slow = busy_us >= frames.SLOW_RUN_US
        if self.batch_wait_us >= frames.BATCH_WAIT_US or r.now or (slow and not self.slow_shown):
            self.slow_shown |= slow
            self._flush_ack()

    def _append_record(self, rec: bytearray) -> None:
        """Into the batch (its room was made): an id that follows the previous record's is not sent."""
        ident = struct.unpack_from("<I", rec, 1)[0]
        if self.batch:  # the batch's first record waited this RUN's invokes too
            self.batch_wait_us = min(self.batch_wait_us + self.run_busy_us, 0xFFFFFFFF)
        if self.batch and ident == (self.batch_last + 1) & 0xFFFFFFFF:
            self.batch += bytes([rec[0] | frames.HEAD_NEXT_ID]) + rec[5:]
        else:
            self.batch += rec
        self.batch_last = ident

    def _emit_record(self, rec: bytearray, crc_at: int, full: bool) -> None:
        cap = frames.TX_MAX_PAYLOAD
        data_len = sum(o.bytes for o in self.cfg.outputs)
        if not full:
            if len(self.batch) + len(rec) > cap:
                self._flush()
            self._append_record(rec)
            return
        crcs = 4 * len(self.cfg.outputs)
        if not rec[0] & frames.FL_NONDETERMINISTIC and len(rec) - crcs + data_len <= cap:
            del rec[crc_at : crc_at + crcs]  # inline and deterministic: the host computes them
        if len(rec) + data_len <= cap:
            if len(self.batch) + len(rec) + data_len > cap:
                self._flush()
            rec[0] |= frames.FL_INLINE
            self._append_record(rec)
            for b in self.outputs_now:
                self.batch += b
            return
        if len(self.batch) + len(rec) > cap:
            self._flush()
        rec[0] |= frames.FL_DATA_FRAMES
        self._append_record(rec)
        self._flush()
        chunk = cap - frames.DATA_FIXED
        for o, b in enumerate(self.outputs_now):
            for off in range(0, len(b), chunk):
                self._send(
                    frames.RSP_DATA, frames.DATA_HEAD.pack(self.batch_last, o, off) + b[off : off + chunk]
                )
