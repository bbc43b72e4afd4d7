"""Parser for the esp-check output protocol (docs/protocol.md): serial bytes in, checked results out.

Serial input is hostile: nothing is evaluated, every line is length-checked, and ``Capture.valid`` holds
only if every rule of docs/protocol.md "Validity rules the parser enforces" holds;
:meth:`Capture.require_valid` turns anything else into a :class:`~harness.errors.CaptureError` (exit 3).
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import re
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from harness.errors import CaptureError
from harness.protocol import spec
from harness.protocol.frames import split_stream
from harness.protocol.spec import DATA_CHUNK, DTYPES, ITEM_SIZES, LINE_MAX, MARKER, TAP_MAX_TENSORS, crc32_hex

REQUIRED_BEGIN = ("proto", "fw", "fwver", "sim")
_BUILD_INFO = ("nn", "target", "chip", "rev", "cores", "cpu_mhz", "idf", "tflm", "espnn")  # board, build
REQUIRED_INFO = (*_BUILD_INFO, "model_sha256", "model_bytes", "inputs", "outputs")
ERROR_STAGES = ("schema", "resolver", "alloc", "input", "invoke", "output", "internal", "model")

_RECORD_RE = re.compile(
    re.escape(MARKER) + rb"(0|[1-9][0-9]{0,9}) ([A-Z][A-Z0-9_]{0,15})"
    rb"((?: [a-z][a-z0-9_]*=[\x21-\x29\x2b-\x7e]+)*) \*([0-9A-F]{8})"
)
_MARKER_RE = re.compile(re.escape(MARKER))
_TRAILING_ANSI_RE = re.compile(rb"(?:\x1b\[[0-9;]*[A-Za-z]|[ \t])+$")
# An ESP-IDF log line spliced into a record by another task: "E (1234) task_wdt: ..." (maybe coloured).
_IDF_LOG = rb"(?:\x1b\[[0-9;]*m)?[EWIDV] \([0-9:.]{1,16}\) [^:\r\n]{1,64}: "
_IDF_LOG_RE = re.compile(_IDF_LOG)
_INT_RE = re.compile(r"-?(0|[1-9][0-9]{0,19})")
_UINT_RE = re.compile(r"0|[1-9][0-9]{0,19}")
_HEX8_RE = re.compile(r"[0-9A-F]{8}")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_DIM = r"(?:0|[1-9][0-9]{0,9})"
_SHAPE = rf"-|{_DIM}(?:x{_DIM}){{0,7}}"  # a TENSOR's shape, or a tap entry's
_SHAPE_RE = re.compile(_SHAPE)
_TAP_ENTRY_RE = re.compile(rf"(-?{_DIM}):({_SHAPE}):([0-9A-F]{{8}})")
_OPNAME_RE = re.compile(r"[A-Za-z0-9_\-]{1,32}")
_ANSI_OPS_RE = re.compile(r"-|[0-9]{1,6}(,[0-9]{1,6})*\+?")  # INFO ansi_ops of hybrid firmware


@dataclass(frozen=True)
class Record:
    """One CRC-checked record line."""

    seq: int
    type: str
    fields: dict[str, str]
    line: int  # 1-based physical line number in the capture


@dataclass
class CapturedTensor:
    """One output tensor reassembled from TENSOR + DATA records (CRC verified)."""

    i: int
    o: int
    dtype: str
    shape: tuple[int, ...]
    scale: float
    zero_point: int
    data: np.ndarray  # raw values, dtype/shape as reported
    name: str = ""
    crc: str = ""

    @property
    def quantized(self) -> bool:
        return self.dtype != "float32" and self.scale != 0.0


@dataclass
class ErrorRecord:
    stage: str
    code: int
    i: int | None
    msg: str
    seq: int


@dataclass(frozen=True)
class TapEntry:
    """One tensor of an OP record: index, shape and the CRC-32 the device computed."""

    t: int
    shape: tuple[int, ...]
    crc: str  # 8 upper-case hex digits


@dataclass(frozen=True)
class OpRecord:
    """One executed op of a tapped run: input CRCs before its invoke, output CRCs after it."""

    i: int
    sub: int
    idx: int
    opcode: str
    cycles: int
    inputs: tuple[TapEntry, ...]
    outputs: tuple[TapEntry, ...]
    seq: int


@dataclass(frozen=True)
class OpDump:
    """A full tensor an op read (role ``in``) or wrote (``out``), reassembled and CRC-checked."""

    i: int
    idx: int
    t: int
    role: str
    tensor: CapturedTensor


@dataclass
class CapturedRun:
    """One input's invoke: its input hash, timing and outputs."""

    index: int
    input_bytes: int
    input_sha256: str
    invoke_us: int | None = None
    cycles: int | None = None
    outputs: list[CapturedTensor] = field(default_factory=list)
    errors: list[ErrorRecord] = field(default_factory=list)
    ops: list[OpRecord] = field(default_factory=list)  # tap: in print order
    ops_end: dict[str, int] | None = None  # tap: OPEND fields (ops, dropped, ram)
    hybrid: dict[str, int] | None = None  # hybrid firmware: HYBRID fields (ansi, fallback)
    dumps: list[OpDump] = field(default_factory=list)  # tap: OPDUMP tensors


@dataclass(frozen=True)
class ArenaInfo:
    size: int
    used: int
    mem: str


@dataclass
class Capture:
    """Everything a capture proved, plus every reason it cannot be trusted (``problems``)."""

    begin: dict[str, str] = field(default_factory=dict)
    info: dict[str, str] = field(default_factory=dict)
    arena: ArenaInfo | None = None
    runs: list[CapturedRun] = field(default_factory=list)
    errors: list[ErrorRecord] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    unknown: list[Record] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    end_status: str | None = None
    boots: int = 0
    has_records: bool = False  # any line carried the record marker
    frames: int = 0  # binary frames (docs/protocol.md "Binary frames") removed before the text was parsed
    payload_records: int = 0  # DATA / OPDATA records: counted, their bytes kept in the tensors only
    # byte spans of the parsed text (frames removed, ``text_size`` bytes) that hold nothing but valid
    # DATA records, whole lines: :func:`evidence_text` leaves them out of what the classifier reads
    payload_spans: list[tuple[int, int]] = field(default_factory=list)
    text_size: int = 0

    @property
    def complete(self) -> bool:
        """END was seen for the first boot."""
        return self.end_status is not None

    @property
    def valid(self) -> bool:
        """Results may be used: BEGIN..END present and no corruption, truncation or inconsistency."""
        return bool(self.begin) and self.complete and not self.problems

    @property
    def nn_mode(self) -> str | None:
        """ESP-NN mode the firmware reported from its compiled-in configuration."""
        return self.info.get("nn")

    @property
    def model_sha256(self) -> str | None:
        return self.info.get("model_sha256")

    @property
    def simulated(self) -> bool:
        return self.begin.get("sim") == "1"

    @property
    def tapped(self) -> bool:
        """The firmware says it was built with --tap (INFO tap=1)."""
        return self.info.get("tap") == "1"

    @property
    def hybrid_ops(self) -> tuple[tuple[int, ...], bool] | None:
        """Hybrid firmware (INFO hybrid=N): the op indices it says run ANSI C, and whether the list
        was cut short (a trailing ``+``); None for firmware without the hybrid wrapper."""
        if "hybrid" not in self.info:
            return None
        text = self.info.get("ansi_ops", "-")
        cut = text.endswith("+")
        parts = [p for p in text.rstrip("+").split(",") if p and p != "-"]
        return tuple(int(p) for p in parts if p.isdigit()), cut

    def require_valid(self, source: str = "capture") -> Capture:
        """Return self, or raise CaptureError (exit 3) listing why this capture is not evidence."""
        if not self.valid:
            shown = self.problems[:8] or ["no BEGIN/END records"]
            more = f" (+{len(self.problems) - 8} more)" if len(self.problems) > 8 else ""
            raise CaptureError(
                f"{source}: capture is corrupted or incomplete, so it is not a result: "
                + "; ".join(shown)
                + more,
                hint="re-run the capture (check baud rate, cable and that nothing else prints to the "
                "console); a reboot mid-run also shows up here",
            )
        return self


# ---- line level ----------------------------------------------------------------------------------

# A DATA record exactly as the firmware prints it (docs/protocol.md), read without building a Record:
# the bulk of a large capture. Any other shape of DATA line takes the general path, which decides the
# same way (this pattern only accepts what the general one accepts, with the field checks _data makes).
_DATA_LINE_RE = re.compile(
    re.escape(MARKER) + rb"(0|[1-9][0-9]{0,9}) DATA i=(0|[1-9][0-9]{0,19}) o=(0|[1-9][0-9]{0,19}) "
    rb"off=(0|[1-9][0-9]{0,19}) b64=([A-Za-z0-9+/]+={0,2}) \*([0-9A-F]{8})"
)
_PAYLOAD_SPANS_MAX = 1 << 16
_PAYLOAD_TYPES = ("DATA", "OPDATA")  # counted in Capture.payload_records, not kept in Capture.records


class _Data:
    """A DATA record read on the fast path: its fields already have the syntax ``_data`` requires."""

    __slots__ = ("b64", "i", "line", "o", "off", "seq")
    type = "DATA"

    def __init__(self, m: re.Match[bytes], line: int) -> None:
        self.seq, self.line = int(m.group(1)), line
        self.i, self.o, self.off = int(m.group(2)), int(m.group(3)), int(m.group(4))
        self.b64 = m.group(5)


def _iter_lines(text: bytes) -> Iterator[tuple[bytes, int, int]]:
    """``text.split(b"\n")`` one line at a time (a trailing ``\r`` dropped), with the byte span the
    line and its newline take: no list of lines is built, and only one line is copied at a time."""
    pos = 0
    ended = True
    for raw in io.BytesIO(text):
        ended = raw.endswith(b"\n")
        line = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1] if ended or raw.endswith(b"\r") else raw
        yield line, pos, pos + len(raw)
        pos += len(raw)
    if ended:
        yield b"", pos, pos


def _strip_tail(seg: bytes) -> bytes:
    """Drop what may follow a record's CRC: CRs, blanks and ANSI colour resets."""
    seg = seg.rstrip(b"\r")
    if seg.endswith((b" ", b"\t")) or b"\x1b" in seg:
        seg = _TRAILING_ANSI_RE.sub(b"", seg)
    return seg


def _check_segment(seg: bytes, pattern: re.Pattern[bytes] = _RECORD_RE) -> re.Match[bytes] | None:
    """``seg`` as a ``pattern`` record within the line limit, its CRC (the last group) good; else None."""
    if len(seg) + 2 > LINE_MAX:
        return None
    m = pattern.fullmatch(seg)
    if m is None or zlib.crc32(seg[:-9]) != int(m.group(pattern.groups), 16):
        return None
    return m


def _to_record(m: re.Match[bytes], line_no: int) -> tuple[Record | None, str | None]:
    fields: dict[str, str] = {}
    for tok in m.group(3).decode("ascii").split(" ")[1:]:
        key, _, value = tok.partition("=")
        if key in fields:
            return None, f"line {line_no}: duplicate field {key!r}"
        fields[key] = value
    return Record(int(m.group(1)), m.group(2).decode("ascii"), fields, line_no), None


class _Scanner:
    """Finds the CRC-checked records of a capture's text, one line at a time (a generator: nothing is
    kept but what the capture reports). Corrupted lines after the first BEGIN go to ``corrupt`` (whether
    they are problems depends on the records around them, which :func:`parse_capture` decides
    afterwards), those before it to ``warnings``; ``payload`` holds the byte spans of lines that are
    nothing but a valid DATA record (no evidence in them for the classifier; adjacent lines merged)."""

    def __init__(self, cap: Capture) -> None:
        self.cap = cap
        self.corrupt: list[tuple[int, str]] = []
        self.warnings: list[str] = []
        self.payload: list[tuple[int, int]] = []
        self.seen_begin = False

    def records(self, text: bytes) -> Iterator[Record | _Data]:
        lines = _iter_lines(text)
        pending = next(lines, None)
        k = 0
        while pending is not None:
            (line, begin, end), pending = pending, next(lines, None)
            k += 1
            start = line.find(MARKER)
            if start < 0:
                continue
            self.cap.has_records = True
            if start == 0 and line.find(MARKER, 1) < 0:
                m = _check_segment(_strip_tail(line), _DATA_LINE_RE)  # else the general path decides
                if m is not None:
                    self._payload(begin, end)
                    yield _Data(m, k)
                    continue
            positions = [m.start() for m in _MARKER_RE.finditer(line, start)]
            for idx, pos in enumerate(positions):
                last = idx == len(positions) - 1
                seg = _strip_tail(line[pos : positions[idx + 1]] if not last else line[pos:])
                m = _check_segment(seg)
                if m is None and last and pending is not None:
                    m = self._splice(seg, pending[0], k)
                    if m is not None:
                        k += 1
                        pending = next(lines, None)
                if m is None:
                    self._corrupted(seg, k)
                    continue
                rec, err = _to_record(m, k)
                if rec is None:
                    self.corrupt.append((k, err or f"line {k}: bad record"))
                    continue
                if rec.type == "BEGIN":
                    self.seen_begin = True
                yield rec

    def _payload(self, start: int, end: int) -> None:
        if self.payload and self.payload[-1][1] == start:  # the line right after the last span
            self.payload[-1] = (self.payload[-1][0], end)
        elif len(self.payload) < _PAYLOAD_SPANS_MAX:  # beyond: those lines are simply read (bounded)
            self.payload.append((start, end))

    def _splice(self, seg: bytes, following: bytes, k: int) -> re.Match[bytes] | None:
        """Watchdog-splice repair: drop a complete ESP-IDF log line and re-join with the next line."""
        log = _IDF_LOG_RE.search(seg, 5)
        if log is None:
            return None
        m = _check_segment(_strip_tail(seg[: log.start()] + following))
        if m is not None:
            spliced = seg[log.start() :].decode("ascii", "replace")
            self.warnings.append(f"line {k}: repaired a record split by a log line: {spliced[:120]!r}")
        return m

    def _corrupted(self, seg: bytes, k: int) -> None:
        what = "longer than 240 bytes" if len(seg) + 2 > LINE_MAX else "bad format or CRC"
        msg = f"line {k}: corrupted record ({what}): {seg[:60].decode('ascii', 'replace')!r}"
        if self.seen_begin:
            self.corrupt.append((k, msg))
        else:
            self.warnings.append(msg + " (before the first BEGIN: ignored)")


# ---- record level --------------------------------------------------------------------------------


class _FieldError(Exception):
    pass


def _get(rec: Record, key: str) -> str:
    try:
        return rec.fields[key]
    except KeyError:
        raise _FieldError(f"{rec.type} record (seq {rec.seq}) lacks field {key!r}") from None


def _int(rec: Record, key: str, *, unsigned: bool = False) -> int:
    v = _get(rec, key)
    if not (_UINT_RE if unsigned else _INT_RE).fullmatch(v):
        raise _FieldError(f"{rec.type} record (seq {rec.seq}): {key}={v!r} is not an integer")
    return int(v)


def _opt_int(rec: Record, key: str) -> int | None:
    return _int(rec, key) if key in rec.fields else None


def _decode_b64(text: bytes, what: str) -> bytes:
    """Strict base64 (RFC 4648 with padding, zero pad bits): the one text a chunk encodes to."""
    try:
        chunk = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise _FieldError(f"{what} b64 is not valid base64") from None
    if binascii.b2a_base64(chunk, newline=False) != text:
        shown = text[:16].decode("ascii")
        raise _FieldError(f"{what} b64 {shown!r}... is not canonical base64 (non-zero pad bits)")
    return chunk


class _Builder:
    def __init__(self, cap: Capture) -> None:
        self.cap = cap
        self.expected_seq = 0
        self.run_by_index: dict[int, CapturedRun] = {}
        # the TENSOR (or OPDUMP, with its dump) whose DATA (OPDATA) records are to come, and its bytes so far
        self.pending: tuple[Record, bytearray, CapturedTensor, OpDump | None] | None = None
        self.stale = 0
        self.broken = False
        self.ignored_from_line: int | None = None  # a later boot after a complete END starts here

    def problem(self, msg: str) -> None:
        self.cap.problems.append(msg)

    def _cut_short(self, prec: Record, buf: bytearray) -> None:
        self.problem(
            f"{prec.type} at line {prec.line}: only {len(buf)} of {prec.fields.get('bytes')} bytes arrived"
        )

    def feed(self, records: Iterable[Record | _Data]) -> None:
        cap = self.cap
        in_boot = False
        for rec in records:
            if rec.type == "BEGIN":
                cap.boots += 1
                if cap.boots > 1:
                    if cap.complete:
                        cap.warnings.append(
                            f"line {rec.line}: the device booted again after END; later output ignored"
                        )
                        self.ignored_from_line = rec.line
                    else:
                        self.problem(
                            f"line {rec.line}: second BEGIN before END: the device rebooted mid-run "
                            "(crash, watchdog or brownout); the first boot's records are kept as evidence"
                        )
                    break
                in_boot = True
            elif not in_boot:
                self.stale += 1
                continue
            if rec.seq != self.expected_seq:
                self.problem(
                    f"line {rec.line}: record sequence jumps from {self.expected_seq - 1} to {rec.seq} "
                    "(lost or repeated lines)"
                )
            self.expected_seq = rec.seq + 1
            if rec.type in _PAYLOAD_TYPES:
                cap.payload_records += 1
            else:
                assert isinstance(rec, Record)
                cap.records.append(rec)
            try:
                self.handle(rec)
            except _FieldError as exc:
                self.problem(f"line {rec.line}: {exc}")
        if self.stale:
            cap.warnings.append(f"{self.stale} record(s) before the first BEGIN ignored (earlier boot?)")

    def handle(self, rec: Record | _Data) -> None:
        """Close what a record of another type interrupts, then dispatch on the record type."""
        t = rec.type
        if self.pending is not None and t != ("DATA" if self.pending[3] is None else "OPDATA"):
            self._cut_short(*self.pending[:2])
            self.pending = None
        if self.cap.complete:
            self.problem(f"line {rec.line}: {t} record after END")
            return
        if isinstance(rec, _Data):
            self._data_at(rec.line, rec.i, rec.o, rec.off, rec.b64)
            return
        handler = self._HANDLERS.get(t)
        if handler is None:
            self.cap.unknown.append(rec)
        else:
            handler(self, rec)

    def _begin(self, rec: Record) -> None:
        for key in REQUIRED_BEGIN:
            _get(rec, key)
        if rec.seq != 0:
            self.problem(f"line {rec.line}: BEGIN has seq {rec.seq}, expected 0")
        if rec.fields["proto"] != spec.PROTO_VERSION:
            self.problem(
                f"line {rec.line}: protocol version {rec.fields['proto']!r} is not supported "
                f"(this esp-check reads version {spec.PROTO_VERSION})"
            )
        if rec.fields["fw"] != "esp-check":
            self.problem(f"line {rec.line}: firmware {rec.fields['fw']!r} is not esp-check firmware")
        if rec.fields["sim"] not in ("0", "1"):
            self.problem(f"line {rec.line}: sim={rec.fields['sim']!r} must be 0 or 1")
        self.cap.begin = dict(rec.fields)

    def _info(self, rec: Record) -> None:
        for key, value in rec.fields.items():
            if key in self.cap.info:
                self.problem(f"line {rec.line}: INFO key {key!r} repeated")
            self.cap.info[key] = value

    def _arena(self, rec: Record) -> None:
        if self.cap.arena is not None:
            self.problem(f"line {rec.line}: second ARENA record")
        self.cap.arena = ArenaInfo(
            _int(rec, "size", unsigned=True), _int(rec, "used", unsigned=True), _get(rec, "mem")
        )

    def _input(self, rec: Record) -> None:
        i = _int(rec, "i", unsigned=True)
        sha = _get(rec, "sha256")
        if not _SHA256_RE.fullmatch(sha):
            self.problem(f"line {rec.line}: INPUT sha256 {sha[:70]!r} is not 64 lower-case hex digits")
        if i in self.run_by_index:
            self.problem(f"line {rec.line}: INPUT i={i} repeated")
            return
        new_run = CapturedRun(i, _int(rec, "bytes", unsigned=True), sha)
        self.run_by_index[i] = new_run
        self.cap.runs.append(new_run)

    def _time(self, rec: Record) -> None:
        run = self._run(rec, once="invoke_us")
        if run is not None:
            run.invoke_us = _int(rec, "invoke_us")
            run.cycles = _opt_int(rec, "cycles")

    def _error(self, rec: Record) -> None:
        stage = _get(rec, "stage")
        if stage not in ERROR_STAGES:
            self.cap.warnings.append(f"line {rec.line}: ERROR stage {stage!r} is not one the spec lists")
        err = ErrorRecord(stage, _int(rec, "code"), _opt_int(rec, "i"), rec.fields.get("msg", ""), rec.seq)
        self.cap.errors.append(err)
        if err.i is not None and err.i in self.run_by_index:
            self.run_by_index[err.i].errors.append(err)

    def _end(self, rec: Record) -> None:
        status = _get(rec, "status")
        if status not in ("ok", "error"):
            self.problem(f"line {rec.line}: END status {status!r} must be ok or error")
        records = _int(rec, "records", unsigned=True)
        if records != rec.seq:
            self.problem(f"line {rec.line}: END says {records} records came before it, its seq is {rec.seq}")
        self.cap.end_status = status

    def _opend(self, rec: Record) -> None:
        run = self._run(rec, once="ops_end")
        if run is None:
            return
        end = {k: _int(rec, k, unsigned=True) for k in ("ops", "dropped", "ram")}
        if end["ops"] != len(run.ops):
            self.problem(
                f"line {rec.line}: OPEND i={run.index} says ops={end['ops']}, "
                f"{len(run.ops)} OP records arrived"
            )
        if end["dropped"]:
            self.cap.warnings.append(
                f"run i={run.index}: the device's tap buffer was full, {end['dropped']} op "
                "record(s) dropped (later ops are not checked)"
            )
        run.ops_end = end

    def _hybrid(self, rec: Record) -> None:
        """HYBRID i= ansi= fallback=: how many invokes the hybrid wrapper sent to ANSI C in run i."""
        run = self._run(rec, once="hybrid")
        if run is None:
            return
        run.hybrid = {k: _int(rec, k, unsigned=True) for k in ("ansi", "fallback")}

    @staticmethod
    def _tap_list(rec: Record, key: str) -> tuple[TapEntry, ...]:
        raw = _get(rec, key)
        if raw == "-":
            return ()
        parts = raw.split(",")
        if len(parts) > TAP_MAX_TENSORS:
            raise _FieldError(f"OP record (seq {rec.seq}): {key}= lists more than {TAP_MAX_TENSORS} tensors")
        out = []
        for part in parts:
            m = _TAP_ENTRY_RE.fullmatch(part)
            if m is None:
                raise _FieldError(f"OP record (seq {rec.seq}): {key} entry {part[:40]!r} is malformed")
            shape = () if m.group(2) == "-" else tuple(int(d) for d in m.group(2).split("x"))
            out.append(TapEntry(int(m.group(1)), shape, m.group(3)))
        return tuple(out)

    def _op(self, rec: Record) -> None:
        run = self._run(rec)
        if run is None:
            return
        if run.ops_end is not None:
            self.problem(f"line {rec.line}: OP after OPEND for i={run.index}")
        opname = _get(rec, "op")
        if not _OPNAME_RE.fullmatch(opname):
            raise _FieldError(f"OP record (seq {rec.seq}): op={opname[:40]!r} is not an op name")
        op = OpRecord(
            run.index,
            _int(rec, "sub", unsigned=True),
            _int(rec, "idx", unsigned=True),
            opcode=opname,
            cycles=_int(rec, "cycles", unsigned=True),
            inputs=self._tap_list(rec, "in"),
            outputs=self._tap_list(rec, "out"),
            seq=rec.seq,
        )
        if any(o.idx == op.idx and o.sub == op.sub for o in run.ops):
            self.problem(f"line {rec.line}: OP i={run.index} idx={op.idx} repeated")
            return
        run.ops.append(op)

    def _opdump(self, rec: Record) -> None:
        run = self._run(rec)
        fields = dict(rec.fields)
        fields.setdefault("o", "0")
        role = _get(rec, "role")
        if role not in ("in", "out"):
            raise _FieldError(f"OPDUMP role {role!r} must be in or out")
        idx, t = _int(rec, "idx", unsigned=True), _int(rec, "t")
        # same field checks as TENSOR, through a TENSOR-shaped view of the record
        _, tensor = self._tensor_meta(Record(rec.seq, "OPDUMP", fields, rec.line))
        if run is not None and any(d.idx == idx and d.t == t and d.role == role for d in run.dumps):
            self.problem(f"line {rec.line}: OPDUMP i={run.index} idx={idx} t={t} role={role} repeated")
        self.pending = (rec, bytearray(), tensor, OpDump(tensor.i, idx, t, role, tensor))
        if int(rec.fields["bytes"]) == 0:
            self._finish()

    def _opdata(self, rec: Record) -> None:
        if self.pending is None:  # (handle closed a pending TENSOR)
            self.problem(f"line {rec.line}: OPDATA without an OPDUMP record")
            return
        prec, buf, _, dump = self.pending
        assert dump is not None
        i, idx = (_int(rec, name, unsigned=True) for name in ("i", "idx"))
        key = (i, idx, _int(rec, "t"), _get(rec, "role"))
        off = _int(rec, "off", unsigned=True)
        if key != (dump.i, dump.idx, dump.t, dump.role) or off != len(buf):
            self.problem(f"line {rec.line}: OPDATA off={off} does not continue OPDUMP at line {prec.line}")
            self.pending = None
            return
        self._append(rec.line, _get(rec, "b64").encode("ascii"))

    def _filled(self, what: str, prec: Record, data: bytes, tensor: CapturedTensor) -> bool:
        """Give ``tensor`` its bytes when their CRC-32 is the one its record announced (else a problem)."""
        if crc32_hex(data) != tensor.crc:
            self.problem(f"{what} at line {prec.line}: data CRC {crc32_hex(data)} != {tensor.crc}")
            return False
        tensor.data = np.frombuffer(data, dtype=DTYPES[tensor.dtype]).reshape(tensor.shape)
        return True

    def _run(self, rec: Record, once: str | None = None) -> CapturedRun | None:
        """The run ``rec`` is about; a problem when there is none, or when its field ``once`` (one record
        of this type per run) is set already."""
        i = _int(rec, "i", unsigned=True)
        run = self.run_by_index.get(i)
        if run is None:
            self.problem(f"line {rec.line}: {rec.type} for i={i} without its INPUT record")
        elif once is not None and getattr(run, once) is not None:
            self.problem(f"line {rec.line}: {rec.type} for i={i} repeated")
        return run

    def _tensor(self, rec: Record) -> None:
        run, tensor = self._tensor_meta(rec)
        if run is not None and any(t.o == tensor.o for t in run.outputs):
            self.problem(f"line {rec.line}: TENSOR i={run.index} o={tensor.o} repeated")
        self.pending = (rec, bytearray(), tensor, None)
        self.broken = False
        if int(rec.fields["bytes"]) == 0:
            self._finish()

    def _tensor_meta(self, rec: Record) -> tuple[CapturedRun | None, CapturedTensor]:
        """A TENSOR record's run and tensor (its bytes still to come), every field checked."""
        run = self._run(rec)
        o = _int(rec, "o", unsigned=True)
        dtype = _get(rec, "dtype")
        if dtype not in DTYPES:
            raise _FieldError(f"TENSOR dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        shape_s = _get(rec, "shape")
        if not _SHAPE_RE.fullmatch(shape_s):
            raise _FieldError(f"TENSOR shape {shape_s!r} is malformed")
        shape = () if shape_s == "-" else tuple(int(d) for d in shape_s.split("x"))
        scale_s = _get(rec, "scale")
        if not (scale_s.startswith("0x") and _HEX8_RE.fullmatch(scale_s[2:])):
            raise _FieldError(f"TENSOR scale {scale_s!r} is not 0x + 8 hex digits")
        scale = float(np.frombuffer(int(scale_s[2:], 16).to_bytes(4, "little"), "<f4")[0])
        nbytes = _int(rec, "bytes", unsigned=True)
        crc = _get(rec, "crc")
        if not _HEX8_RE.fullmatch(crc):
            raise _FieldError(f"TENSOR crc {crc!r} is not 8 hex digits")
        if math.prod(shape) * ITEM_SIZES[dtype] != nbytes:
            raise _FieldError(f"TENSOR bytes={nbytes} does not match shape {shape_s} x {dtype}")
        name = rec.fields.get("name", "")
        return run, CapturedTensor(
            run.index if run else -1,
            o,
            dtype,
            shape=shape,
            scale=scale,
            zero_point=_int(rec, "zp"),
            data=np.zeros(0),
            name="" if name == "-" else name,
            crc=crc,
        )

    def _data(self, rec: Record) -> None:
        if self.pending is None:
            self._data_at(rec.line, 0, 0, 0, b"")  # says what is wrong
            return
        i, o, off = (_int(rec, key, unsigned=True) for key in ("i", "o", "off"))
        self._data_at(rec.line, i, o, off, _get(rec, "b64").encode("ascii"))

    def _data_at(self, line: int, i: int, o: int, off: int, b64: bytes) -> None:
        """One DATA record (from a Record, or read on the fast path): the next chunk of its TENSOR."""
        if self.pending is None:
            if not self.broken:  # the TENSOR this DATA belongs to is already reported broken
                self.problem(f"line {line}: DATA without a TENSOR record")
            return
        _, buf, tensor, _ = self.pending
        if (i, o) != (tensor.i, tensor.o) or off != len(buf):
            self.problem(
                f"line {line}: DATA i={i} o={o} off={off} does not continue TENSOR "
                f"i={tensor.i} o={tensor.o} at offset {len(buf)}"
            )
            self.pending = None
            self.broken = True
        elif not self._append(line, b64):
            self.broken = True

    def _append(self, line: int, b64: bytes) -> bool:
        """The next chunk of the pending tensor's bytes (the last one fills it); False (a problem, nothing
        pending) when it does not fit."""
        assert self.pending is not None
        prec, buf = self.pending[:2]
        what = "DATA" if prec.type == "TENSOR" else "OPDATA"
        chunk = _decode_b64(b64, what)
        total = int(prec.fields["bytes"])
        if not 0 < len(chunk) <= DATA_CHUNK or len(buf) + len(chunk) > total:
            self.problem(f"line {line}: {what} chunk of {len(chunk)} bytes does not fit its {prec.type}")
            self.pending = None
            return False
        buf.extend(chunk)
        if len(buf) == total:
            self._finish()
        return True

    def _finish(self) -> None:
        """The pending tensor is whole: into its run's outputs (or dumps) when its CRC-32 is right."""
        assert self.pending is not None
        prec, buf, tensor, dump = self.pending
        self.pending = None
        run = self.run_by_index.get(tensor.i)
        if self._filled(prec.type, prec, bytes(buf), tensor) and run is not None:
            if dump is None:
                run.outputs.append(tensor)
            else:
                run.dumps.append(dump)

    def finish(self) -> None:
        cap = self.cap
        if self.pending is not None:
            self._cut_short(*self.pending[:2])
        if not cap.has_records:
            self.problem(f"no esp-check protocol records ({MARKER.decode().strip()}) in the capture")
            return
        if not cap.begin:
            self.problem("no BEGIN record: the capture missed the start of the run")
            return
        if not cap.complete:
            self.problem("no END record: the capture is truncated (timeout, reset or lost data)")
        missing = [k for k in REQUIRED_INFO if k not in cap.info]
        if missing:
            self.problem(f"required INFO keys missing: {', '.join(missing)}")
        if "hybrid" in cap.info and not _ANSI_OPS_RE.fullmatch(cap.info.get("ansi_ops", "")):
            self.problem("INFO hybrid without a valid ansi_ops list (e.g. ansi_ops=17,27)")
        for key in ("cores", "cpu_mhz", "model_bytes", "inputs", "outputs", "hybrid"):
            if key in cap.info and not _UINT_RE.fullmatch(cap.info[key]):
                self.problem(f"INFO {key}={cap.info[key][:40]!r} is not an unsigned integer")
        sha = cap.info.get("model_sha256")
        no_model = sha == "-" and any(e.stage == "model" for e in cap.errors)  # nothing was mapped
        if sha is not None and not no_model and not _SHA256_RE.fullmatch(sha):
            self.problem("INFO model_sha256 is not 64 lower-case hex digits")
        if cap.end_status == "error" and not cap.errors:
            self.problem("END status=error without any ERROR record")
        if cap.end_status == "ok":
            if cap.errors:
                self.problem("END status=ok although ERROR records were printed")
            n_out = cap.info.get("outputs", "")
            n_in = cap.info.get("inputs", "")
            if _UINT_RE.fullmatch(n_in) and len(cap.runs) != int(n_in):
                self.problem(f"INFO inputs={n_in} but {len(cap.runs)} INPUT records")
            for run in cap.runs:
                if run.invoke_us is None:
                    self.problem(f"run i={run.index} has no TIME record")
                got = sorted(t.o for t in run.outputs)
                if _UINT_RE.fullmatch(n_out) and got != list(range(int(n_out))):
                    self.problem(f"run i={run.index}: outputs {got} arrived, expected 0..{int(n_out) - 1}")
                if cap.tapped and run.ops_end is None:
                    self.problem(f"run i={run.index}: tapped firmware (INFO tap=1) printed no OPEND record")
                if "hybrid" in cap.info and run.hybrid is None:
                    self.problem(f"run i={run.index}: hybrid firmware (INFO hybrid) printed no HYBRID record")
        for run in cap.runs:
            run.outputs.sort(key=lambda t: t.o)

    _HANDLERS: ClassVar[dict[str, Callable[[_Builder, Record], None]]] = {  # record type -> handler
        "BEGIN": _begin,
        "INFO": _info,
        "ARENA": _arena,
        "INPUT": _input,
        "TIME": _time,
        "TENSOR": _tensor,
        "DATA": _data,
        "ERROR": _error,
        "END": _end,
        "OP": _op,
        "OPEND": _opend,
        "HYBRID": _hybrid,
        "OPDUMP": _opdump,
        "OPDATA": _opdata,
    }


_DEVICE_TEXT_RE = re.compile(
    rb"ESP-ROM:|^ets [A-Z][a-z]{2} |rst:0x[0-9a-f]+ \(|Guru Meditation Error|abort\(\) was called|^"
    + _IDF_LOG,
    re.MULTILINE,
)


def looks_like_device_output(raw: bytes) -> bool:
    """Whether text without records is still an ESP32's serial output, or ends in a partial marker.

    ROM banner, ESP-IDF log lines or a panic without any record: a capture cut off before its first
    result (infrastructure, exit 3), not a file of the wrong kind (usage, exit 2).
    """
    tail = raw.rstrip(b"\r\n")[-len(MARKER) :]
    if any(tail.endswith(MARKER[:k]) for k in range(1, len(MARKER) + 1)):
        return True
    return _DEVICE_TEXT_RE.search(raw[: 1 << 20]) is not None


def parse_capture(raw: bytes | bytearray | memoryview | str) -> Capture:
    """Parse a serial capture; never raises on bad content (problems are recorded instead)."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogateescape")
    cap = Capture()
    # Binary frames of the resident loop (ACKs during a text session, HELLO at boot) are not text:
    # take them out first; a damaged frame stays in as (binary) text and can never pass as a record.
    split = split_stream(raw if isinstance(raw, bytes) else bytes(raw))
    cap.frames = len(split.frames)
    cap.text_size = len(split.text)
    # one pass, one line at a time: the scanner's records go straight to the builder (a
    # 25 MB capture is parsed in bounded memory; only the capture's own results are kept)
    scanner = _Scanner(cap)
    records = scanner.records(split.text)
    builder = _Builder(cap)
    builder.feed(records)
    for _ in records:  # after a later boot: read on for corrupted lines only (warnings)
        pass
    cap.payload_spans = scanner.payload
    cap.warnings[:0] = scanner.warnings
    cut = builder.ignored_from_line
    corrupt = scanner.corrupt
    cap.problems[:0] = [msg for line, msg in corrupt if cut is None or line < cut]
    later = [msg for line, msg in corrupt if cut is not None and line >= cut]
    cap.warnings.extend(msg + " (in a later boot after END: ignored)" for msg in later)
    builder.finish()
    return cap


def evidence_text(text: bytes, cap: Capture) -> bytes:
    """``text`` (the capture ``cap`` was parsed from, frames removed) without its payload lines: each
    run of lines that are nothing but valid DATA records becomes as many empty lines, so line numbers
    stay. Such lines hold no evidence (any other byte in one breaks its CRC); a 25 MB capture is then a
    few hundred KB for the classifier. ``text`` unchanged when the spans do not fit it."""
    spans = cap.payload_spans
    if not spans or len(text) != cap.text_size:
        return text
    if any(text[a : a + len(MARKER)] != MARKER or (a and text[a - 1] != 10) for a, _ in spans):
        return text
    out = bytearray()
    prev = 0
    for a, b in spans:
        out += text[prev:a]
        out += b"\n" * text.count(b"\n", a, b)
        prev = b
    out += text[prev:]
    return bytes(out)
