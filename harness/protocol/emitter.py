"""Output-protocol emitters (docs/protocol.md): the firmware's C emitter via ctypes, or a Python twin.

Backend ``"c"`` compiles ``firmware_templates/common/esp_check_proto.c`` (the file the firmware builds) with
the host C compiler into a per-user cache; ``"python"`` must stay byte-identical to it (a contract test
checks this); ``"auto"`` prefers C when a compiler exists.
"""

from __future__ import annotations

import base64
import ctypes
import hashlib
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, TypeAlias

import numpy as np
from filelock import FileLock, Timeout

from harness.errors import BuildError, UsageError
from harness.protocol import spec
from harness.protocol.spec import DATA_CHUNK, DTYPES, ITEM_SIZES, LINE_MAX, MARKER, MAX_DIMS, TAP_MAX_TENSORS
from harness.resources import code_digest, templates_dir, user_cache_dir

if TYPE_CHECKING:
    from harness.protocol.loop import LoopOutput

BODY_MAX = LINE_MAX - 11  # "*XXXXXXXX\r\n" follows the body

_C_FLAGS = ("-std=c99", "-O2", "-shared", "-fPIC", "-Wall", "-Wextra")
# a protocol value's bytes: those outside spec.PRINTABLE, and '*', become '_' (text records, ERROR frames)
SANITIZE = bytes(c if c in spec.PRINTABLE and c != 0x2A else 0x5F for c in range(256))
_OVERFLOW_TAIL = b" ERROR stage=internal code=0 msg=record_overflow "
_KEY = re.compile(r"[a-z][a-z0-9_]*")  # a record field's key (ASCII only)


class ProtocolOverflowError(UsageError):
    """A record would exceed the protocol's 240-byte line limit (or has an invalid key)."""


FieldValue = str | int


@dataclass(frozen=True)
class TapTensor:
    """One tensor in an OP record: model tensor index, shape, CRC-32 of its bytes at that moment."""

    t: int
    shape: tuple[int, ...]
    crc: int


_Taps = Sequence[TapTensor]


# ---- shared helpers (both backends) --------------------------------------------------------------


def _cbytes(value: str | bytes) -> bytes:
    """What a C string sees: UTF-8 bytes up to the first NUL."""
    raw = value.encode("utf-8", "replace") if isinstance(value, str) else bytes(value)
    nul = raw.find(b"\0")
    return raw if nul < 0 else raw[:nul]


def sanitize_value(value: str | bytes, max_len: int = LINE_MAX) -> bytes:
    """Protocol string value: each byte outside spec.PRINTABLE, and '*', becomes '_'; empty is '-'."""
    raw = _cbytes(value)[:max_len]
    return raw.translate(SANITIZE) if raw else b"-"


def _float32_bits(x: float) -> int:
    try:
        return int(struct.unpack("<I", struct.pack("<f", x))[0])
    except (OverflowError, struct.error) as exc:
        raise ValueError(f"scale {x!r} is not representable as float32") from exc


def _check_int(name: str, v: int, lo: int, hi: int) -> int:
    if not isinstance(v, int | np.integer) or isinstance(v, bool) or not lo <= int(v) <= hi:
        raise ValueError(f"{name}={v!r} out of range [{lo}, {hi}]")
    return int(v)


def _i32(name: str, v: int) -> int:
    return _check_int(name, v, -(2**31), 2**31 - 1)


def _u64(name: str, v: int) -> int:
    return _check_int(name, v, 0, 2**64 - 1)


def format_human(dtype: str, raw: bytes, scale_bits: int, zp: int) -> bytes:
    """The ``Output:`` line of one element (same arithmetic and text as the C emitter)."""
    q = np.frombuffer(raw, dtype=DTYPES[dtype], count=1)[0]
    scale = struct.unpack("<f", struct.pack("<I", scale_bits))[0]
    if dtype == "float32":
        v = float(q)
    elif scale == 0.0:
        v = float(int(q))
    else:
        v = float(int(q) - zp) * scale
    if math.isnan(v):
        return b"Output: nan\r\n"
    if math.isinf(v):
        return b"Output: -inf\r\n" if v < 0 else b"Output: inf\r\n"
    return b"Output: %.6f\r\n" % v


class _Tensor(NamedTuple):
    """A tensor's arguments after the checks both backends make (the same errors for the same input)."""

    dtype: str
    dims: list[int]
    scale: float
    bits: int  # the scale's float32 bits
    zp: int
    data: bytes
    problem: str | None  # what makes it unprintable (the C emitter's ERROR msg), or None


def _checked_tensor(dtype: str, shape: Sequence[int], scale: float, zp: int, data: bytes) -> _Tensor:
    zp, dims, bits, data = _i32("zp", zp), [_i32("dim", d) for d in shape], _float32_bits(scale), bytes(data)
    return _Tensor(dtype, dims, scale, bits, zp, data, problem=_tensor_problem(dtype, dims, len(data)))


def _tensor_problem(dtype: str, shape: Sequence[int], nbytes: int) -> str | None:
    item = ITEM_SIZES.get(dtype)
    if item is None:
        return "bad_dtype"
    if len(shape) > MAX_DIMS:
        return "bad_shape"
    count = 1
    for d in shape:
        if d < 0 or (d > 0 and count > (2**64 - 1) // 16 // d):
            return "bad_shape"
        count *= d
    if count * item != nbytes:
        return "tensor_size"
    return None


class _Emitter:
    """TENSOR and OPDUMP as both backends take them: the arguments checked here, printed by the backend."""

    def tensor(
        self,
        i: int,
        o: int,
        dtype: str,
        shape: Sequence[int],
        scale: float,
        zp: int,
        data: bytes,
        name: str = "",
        human_max: int = 16,
    ) -> bool:
        i, o = _i32("i", i), _i32("o", o)
        return self._tensor(i, o, _checked_tensor(dtype, shape, scale, zp, data), name, human_max)

    def _tensor(self, i: int, o: int, t: _Tensor, name: str, human_max: int) -> bool:
        raise NotImplementedError

    def op_dump(
        self,
        i: int,
        idx: int,
        t: int,
        role: str,
        dtype: str,
        shape: Sequence[int],
        scale: float,
        zp: int,
        data: bytes,
    ) -> None:
        head = (_i32("i", i), _i32("idx", idx), _i32("t", t))
        self._op_dump(head, role, _checked_tensor(dtype, shape, scale, zp, data))

    def _op_dump(self, head: tuple[int, int, int], role: str, t: _Tensor) -> None:
        raise NotImplementedError

    def op(
        self,
        i: int,
        sub: int,
        idx: int,
        opname: str,
        cycles: int,
        ins: Sequence[TapTensor],
        outs: Sequence[TapTensor],
    ) -> None:
        for x in (*ins, *outs):
            _i32("t", x.t)
            _check_int("crc", x.crc, 0, 2**32 - 1)
            for d in x.shape:
                _i32("dim", d)
        head = (_i32("i", i), _i32("sub", sub), _i32("idx", idx))
        self._op(head, opname, _u64("cycles", cycles), ins, outs)

    def _op(self, head: tuple[int, int, int], opname: str, cycles: int, ins: _Taps, outs: _Taps) -> None:
        raise NotImplementedError


# ---- pure-Python emitter -------------------------------------------------------------------------


class PythonEmitter(_Emitter):
    """Pure-Python twin of esp_check_proto.c (byte-identical output)."""

    backend = "python"

    def __init__(self, write: Callable[[bytes], None]) -> None:
        self._write = write
        self.seq = 0

    def _emit(self, rtype: str, fields: Sequence[tuple[str, bytes]]) -> bool:
        body = MARKER + b"%d %s" % (self.seq, rtype.encode("ascii"))
        ok = True
        for key, value in fields:
            if not _KEY.fullmatch(key):
                ok = False
                break
            body += b" " + key.encode("ascii") + b"=" + value
        body += b" "
        if not ok or len(body) > BODY_MAX:
            body = MARKER + b"%d" % self.seq + _OVERFLOW_TAIL
            ok = False
        self._write(body + b"*%08X\r\n" % zlib.crc32(body))
        self.seq = (self.seq + 1) & 0xFFFFFFFF
        return ok

    @staticmethod
    def _value(v: FieldValue) -> bytes:
        if isinstance(v, bool):
            return b"1" if v else b"0"
        if isinstance(v, int | np.integer):
            return b"%d" % int(v)
        return sanitize_value(v)

    def begin(self, fwver: str, sim: bool) -> None:
        self.seq = 0
        fields = [("proto", spec.PROTO_VERSION.encode()), ("fw", b"esp-check")]
        self._emit("BEGIN", [*fields, ("fwver", sanitize_value(fwver)), ("sim", b"1" if sim else b"0")])

    def info(self, fields: Sequence[tuple[str, FieldValue]]) -> None:
        self.record("INFO", fields)

    def record(self, rtype: str, fields: Sequence[tuple[str, FieldValue]]) -> None:
        """Any record of key=value fields (INFO, HYBRID): ecp_record_start / ecp_kv_* / ecp_record_end."""
        encoded = [(k, self._value(v)) for k, v in fields]
        check_record_fits(self.seq, rtype, encoded)
        self._emit(rtype, encoded)

    def arena(self, size: int, used: int, mem: str) -> None:
        sizes = [("size", b"%d" % _u64("size", size)), ("used", b"%d" % _u64("used", used))]
        self._emit("ARENA", [*sizes, ("mem", sanitize_value(mem))])

    def input(self, i: int, nbytes: int, sha256_hex: str) -> None:
        head = [("i", b"%d" % _i32("i", i)), ("bytes", b"%d" % _u64("nbytes", nbytes))]
        self._emit("INPUT", [*head, ("sha256", sanitize_value(sha256_hex))])

    def time(self, i: int, invoke_us: int) -> None:
        us = _check_int("invoke_us", invoke_us, -(2**63), 2**63 - 1)
        self._emit("TIME", [("i", b"%d" % _i32("i", i)), ("invoke_us", b"%d" % us)])

    def error(self, stage: str, code: int, msg: str, i: int | None = None) -> None:
        fields = [("stage", sanitize_value(stage)), ("code", b"%d" % _i32("code", code))]
        if i is not None and i >= 0:
            fields.append(("i", b"%d" % _check_int("i", i, 0, 2**31 - 1)))
        fields.append(("msg", sanitize_value(msg, spec.MSG_MAX)))
        self._emit("ERROR", fields)

    def end(self, ok: bool) -> None:
        self._emit("END", [("status", b"ok" if ok else b"error"), ("records", b"%d" % self.seq)])

    def _tensor(self, i: int, o: int, t: _Tensor, name: str, human_max: int) -> bool:
        if t.problem is not None:
            self.error("internal", 0, t.problem, i)
            return False
        head = [("i", b"%d" % i), ("o", b"%d" % o)]
        fields = [*head, *_tensor_fields(t)]
        cname = _cbytes(name)
        if cname:
            fields.append(("name", sanitize_value(cname, spec.NAME_MAX)))
        if not self._emit("TENSOR", fields) or not self._emit_chunks("DATA", head, t.data):
            return False
        item = ITEM_SIZES[t.dtype]
        for j in range(min(max(human_max, 0), len(t.data) // item)):
            self._write(format_human(t.dtype, t.data[j * item : (j + 1) * item], t.bits, t.zp))
        return True

    # ---- tap records ----

    @staticmethod
    def _tap_list(ts: Sequence[TapTensor]) -> bytes | None:
        if len(ts) > TAP_MAX_TENSORS:
            return None
        parts = []
        for x in ts:
            if len(x.shape) > MAX_DIMS:
                return None
            shape = b"x".join(b"%d" % d for d in x.shape) if x.shape else b"-"
            parts.append(b"%d:%s:%08X" % (x.t, shape, x.crc & 0xFFFFFFFF))
        return b",".join(parts) if parts else b"-"

    def _op(self, head: tuple[int, int, int], opname: str, cycles: int, ins: _Taps, outs: _Taps) -> None:
        lin, lout = self._tap_list(ins), self._tap_list(outs)
        fields = [(k, b"%d" % v) for k, v in zip(("i", "sub", "idx"), head, strict=True)]
        fields += [("op", sanitize_value(opname, spec.OPNAME_MAX)), ("cycles", b"%d" % cycles)]
        if lin is None or lout is None:
            fields.append(("-bad", b""))  # invalid key: same overflow ERROR record as the C emitter
        else:
            fields += [("in", lin), ("out", lout)]
        self._emit("OP", fields)

    def op_end(self, i: int, ops: int, dropped: int, ram_bytes: int) -> None:
        counts = [("ops", ops), ("dropped", dropped), ("ram", ram_bytes)]
        self._emit("OPEND", [("i", b"%d" % _i32("i", i)), *((k, b"%d" % _u64(k, v)) for k, v in counts)])

    def _op_dump(self, head: tuple[int, int, int], role: str, t: _Tensor) -> None:
        bad = t.problem
        if bad is None and role not in ("in", "out"):
            bad = "bad_role"
        if bad is not None:
            self.error("internal", 0, bad, head[0])
            return
        fields = [(k, b"%d" % v) for k, v in zip(("i", "idx", "t"), head, strict=True)]
        fields.append(("role", role.encode()))
        if self._emit("OPDUMP", [*fields, *_tensor_fields(t)]):
            self._emit_chunks("OPDATA", fields, t.data)

    def _emit_chunks(self, rtype: str, head: list[tuple[str, bytes]], data: bytes) -> bool:
        """DATA/OPDATA records: ``head`` fields, then off and up to DATA_CHUNK bytes as base64."""
        for off in range(0, len(data), DATA_CHUNK):
            b64 = base64.b64encode(data[off : off + DATA_CHUNK])
            if not self._emit(rtype, [*head, ("off", b"%d" % off), ("b64", b64)]):
                return False
        return True


def _tensor_fields(t: _Tensor) -> list[tuple[str, bytes]]:
    """What TENSOR and OPDUMP both say about a tensor: dtype, shape, scale bits, zp, size, CRC32."""
    return [
        ("dtype", t.dtype.encode("ascii")),
        ("shape", b"x".join(b"%d" % d for d in t.dims) if t.dims else b"-"),
        ("scale", b"0x%08X" % t.bits),
        ("zp", b"%d" % t.zp),
        ("bytes", b"%d" % len(t.data)),
        ("crc", b"%08X" % zlib.crc32(t.data)),
    ]


def check_record_fits(seq: int, rtype: str, fields: Sequence[tuple[str, bytes]]) -> None:
    """Raise ProtocolOverflowError if a record with these fields cannot be emitted as-is."""
    if not (rtype.isascii() and rtype.isalnum() and rtype[:1].isupper() and rtype == rtype.upper()):
        raise ProtocolOverflowError(f"invalid record type {rtype!r}", hint="types are upper-case, e.g. INFO")
    for key, _ in fields:
        if not _KEY.fullmatch(key):
            raise ProtocolOverflowError(
                f"invalid protocol key {key!r}", hint="keys must match [a-z][a-z0-9_]*"
            )
    length = (
        len(MARKER + b"%d %s" % (seq, rtype.encode("ascii")))
        + sum(2 + len(k) + len(v) for k, v in fields)
        + 1
    )
    if length > BODY_MAX:
        raise ProtocolOverflowError(
            f"{rtype} record would be {length + 11} bytes, more than the protocol's {LINE_MAX}",
            hint="split the fields over several INFO records",
        )


# ---- C emitter through ctypes --------------------------------------------------------------------

_WRITE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_char), ctypes.c_size_t)


# Every portable C file the firmware compiles next to app_main.cc (emitter, frames, command loop), in
# the order they are compiled into the host library.
C_SOURCES = ("esp_check_proto", "esp_check_frame", "esp_check_loop")


def find_c_compiler() -> str | None:
    """Host C compiler (``$CC``, cc, gcc, clang) or None."""
    env_cc = os.environ.get("CC")
    for cand in ([env_cc] if env_cc else []) + ["cc", "gcc", "clang"]:
        found = shutil.which(cand)
        if found:
            return found
    return None


def build_c_library(cache_dir: Path | None = None, compiler: str | None = None) -> Path:
    """Compile the portable C files (emitter, frames, loop) into one shared library, cached by source hash
    (safe when concurrent)."""
    cc = compiler or find_c_compiler()
    if cc is None:
        raise BuildError(
            "no host C compiler found for the protocol emitter",
            hint="install gcc or clang, set $CC, or use the 'python' emitter backend",
        )
    common = templates_dir() / "common"
    names = [f"{name}{ext}" for name in C_SOURCES for ext in (".c", ".h")]
    c_files = [str(common / f"{name}.c") for name in C_SOURCES]
    digest = code_digest("\0".join((cc, *_C_FLAGS, sys.platform)), common, names, ())
    suffix = {"darwin": ".dylib", "win32": ".dll"}.get(sys.platform, ".so")
    out_dir = cache_dir / "emitter" if cache_dir else user_cache_dir("emitter")
    out = out_dir / f"libesp_check_proto-{digest[:20]}{suffix}"
    if out.is_file():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    # One compile per library: every simulated board of a run (threads, processes) asks at once.
    lock = out_dir.with_name(f"{out_dir.name}.lock")
    try:
        with FileLock(lock, timeout=300):
            if not out.is_file():  # else another one built it while we waited
                _compile_library(cc, common, c_files, out)
    except Timeout as exc:
        raise BuildError(
            f"waited 300 s for {lock}, held by another esp-check compiling the protocol library",
            hint=f"if no esp-check is running, delete {lock}",
        ) from exc
    return out


def _compile_library(cc: str, include: Path, c_files: list[str], out: Path) -> None:
    fd, tmp_name = tempfile.mkstemp(prefix=".build-", suffix=out.suffix, dir=out.parent)
    os.close(fd)
    try:
        proc = subprocess.run(
            [cc, *_C_FLAGS, "-I", str(include), "-o", tmp_name, *c_files],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if proc.returncode != 0:
            raise BuildError(
                f"compiling {', '.join(Path(p).name for p in c_files)} with {cc} failed:\n"
                f"{proc.stderr.strip()[-2000:]}",
                hint="check the host C compiler, or use the 'python' emitter backend",
            )
        os.replace(tmp_name, out)  # atomic: a reader without the lock sees the old name or the whole file
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)


class _CTapTensor(ctypes.Structure):
    """ecp_tap_tensor_t."""

    _fields_ = [
        ("t", ctypes.c_int32),
        ("crc", ctypes.c_uint32),
        ("ndims", ctypes.c_int32),
        ("dims", ctypes.c_int32 * MAX_DIMS),
    ]


def _c_tap_array(ts: Sequence[TapTensor]) -> ctypes.Array[_CTapTensor]:
    arr = (_CTapTensor * max(1, len(ts)))()
    for k, x in enumerate(ts):
        dims = (ctypes.c_int32 * MAX_DIMS)(*x.shape[:MAX_DIMS])
        # ndims > MAX_DIMS: the C side rejects it (only MAX_DIMS are copied)
        arr[k] = _CTapTensor(x.t, x.crc & 0xFFFFFFFF, len(x.shape), dims)
    return arr


def load_c_library(
    path: Path | None = None, more: dict[str, tuple[object, list[object]]] | None = None
) -> ctypes.CDLL:
    """The library :func:`build_c_library` made (``path``, else the default build), loaded with the
    emitter's signatures and ``more`` (harness.protocol.native's, the loop's): one handle for its caller to
    own and pass to each :class:`CEmitter`."""
    lib = ctypes.CDLL(str(path or build_c_library()))
    vp, cp, sz, cint = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int
    i32, i64, u64 = ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64
    dims, taps = ctypes.POINTER(i32), ctypes.POINTER(_CTapTensor)
    sigs: dict[str, tuple[object, list[object]]] = {
        "ecp_sizeof": (sz, []),
        "ecp_init": (None, [vp, _WRITE_FN, vp]),
        "ecp_record_start": (None, [vp, cp]),
        "ecp_kv_str": (None, [vp, cp, cp]),
        "ecp_kv_int": (None, [vp, cp, i64]),
        "ecp_record_end": (cint, [vp]),
        "ecp_info_str": (cint, [vp, cp, cp]),
        "ecp_begin": (cint, [vp, cp, cint]),
        "ecp_arena": (cint, [vp, u64, u64, cp]),
        "ecp_input": (cint, [vp, cint, u64, cp]),
        "ecp_time": (cint, [vp, cint, i64]),
        "ecp_tensor": (cint, [vp, cint, cint, cp, dims, cint, ctypes.c_float, i32, cp, sz, cp, cint]),
        "ecp_error": (cint, [vp, cp, i32, cint, cp]),
        "ecp_end": (cint, [vp, cint]),
        "ecp_op": (cint, [vp, cint, cint, cint, cp, u64, taps, cint, taps, cint]),
        "ecp_op_end": (cint, [vp, cint, u64, u64, u64]),
        "ecp_op_dump": (cint, [vp, cint, cint, cint, cp, cp, dims, cint, ctypes.c_float, i32, cp, sz]),
    }
    for name, (restype, argtypes) in {**sigs, **(more or {})}.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


class CEmitter(_Emitter):
    """The firmware's own emitter (esp_check_proto.c) driven through ctypes."""

    backend = "c"

    def __init__(self, write: Callable[[bytes], None], lib: ctypes.CDLL) -> None:
        self.lib = lib  # from load_c_library, owned by the caller

        def _cb(_ctx: int | None, buf: ctypes._Pointer[ctypes.c_char], n: int) -> int:
            write(ctypes.string_at(buf, n))
            return int(n)

        self._cb = _WRITE_FN(_cb)  # keep a reference: C holds the pointer
        self.state = ctypes.create_string_buffer(int(self.lib.ecp_sizeof()))
        self.lib.ecp_init(self.state, self._cb, None)
        self.seq = 0

    def _sync(self, rc: int = 0) -> int:
        """Read the C emitter's seq back (the first field of ecp_t after two pointers); pass ``rc`` on."""
        off = 2 * ctypes.sizeof(ctypes.c_void_p)
        self.seq = int(ctypes.c_uint32.from_buffer(self.state, off).value)
        return int(rc)

    def begin(self, fwver: str, sim: bool) -> None:
        self._sync(self.lib.ecp_begin(self.state, _cbytes(fwver), 1 if sim else 0))

    def info(self, fields: Sequence[tuple[str, FieldValue]]) -> None:
        self.record("INFO", fields)

    def record(self, rtype: str, fields: Sequence[tuple[str, FieldValue]]) -> None:
        """Any record of key=value fields, through ecp_record_start / ecp_kv_* / ecp_record_end."""
        check_record_fits(self.seq, rtype, [(k, PythonEmitter._value(v)) for k, v in fields])
        self.lib.ecp_record_start(self.state, rtype.encode("ascii"))
        for key, value in fields:
            if isinstance(value, bool):
                self.lib.ecp_kv_int(self.state, key.encode("ascii"), int(value))
            elif isinstance(value, int | np.integer):
                number = _check_int(key, int(value), -(2**63), 2**63 - 1)
                self.lib.ecp_kv_int(self.state, key.encode("ascii"), number)
            else:
                self.lib.ecp_kv_str(self.state, key.encode("ascii"), _cbytes(value))
        self._sync(self.lib.ecp_record_end(self.state))

    def arena(self, size: int, used: int, mem: str) -> None:
        self._sync(self.lib.ecp_arena(self.state, _u64("size", size), _u64("used", used), _cbytes(mem)))

    def input(self, i: int, nbytes: int, sha256_hex: str) -> None:
        head = (_i32("i", i), _u64("nbytes", nbytes))
        self._sync(self.lib.ecp_input(self.state, *head, _cbytes(sha256_hex)))

    def time(self, i: int, invoke_us: int) -> None:
        us = _check_int("invoke_us", invoke_us, -(2**63), 2**63 - 1)
        self._sync(self.lib.ecp_time(self.state, _i32("i", i), us))

    def _tensor(self, i: int, o: int, t: _Tensor, name: str, human_max: int) -> bool:
        arr = (ctypes.c_int32 * max(len(t.dims), 1))(*t.dims)
        human = max(-(2**31), min(int(human_max), 2**31 - 1))
        head = (i, o, t.dtype.encode("ascii", "replace"), arr, len(t.dims), t.scale)
        rc = self.lib.ecp_tensor(self.state, *head, t.zp, t.data, len(t.data), _cbytes(name), human)
        return self._sync(rc) == 0

    def error(self, stage: str, code: int, msg: str, i: int | None = None) -> None:
        code = _i32("code", code)
        index = -1 if i is None else _i32("i", i)
        self._sync(self.lib.ecp_error(self.state, _cbytes(stage), code, index, _cbytes(msg)))

    def end(self, ok: bool) -> None:
        self._sync(self.lib.ecp_end(self.state, 1 if ok else 0))

    def _op(self, head: tuple[int, int, int], opname: str, cycles: int, ins: _Taps, outs: _Taps) -> None:
        taps = (_c_tap_array(ins), len(ins), _c_tap_array(outs), len(outs))
        self._sync(self.lib.ecp_op(self.state, *head, _cbytes(opname), cycles, *taps))

    def op_end(self, i: int, ops: int, dropped: int, ram_bytes: int) -> None:
        counts = (_u64("ops", ops), _u64("dropped", dropped), _u64("ram", ram_bytes))
        self._sync(self.lib.ecp_op_end(self.state, _i32("i", i), *counts))

    def _op_dump(self, head: tuple[int, int, int], role: str, t: _Tensor) -> None:
        arr = (ctypes.c_int32 * max(len(t.dims), 1))(*t.dims)
        names = (_cbytes(role), t.dtype.encode("ascii", "replace"))
        tensor = (arr, len(t.dims), t.scale, t.zp, t.data, len(t.data))
        self._sync(self.lib.ecp_op_dump(self.state, *head, *names, *tensor))


Emitter: TypeAlias = PythonEmitter | CEmitter  # what firmware-like code prints the protocol through


def make_emitter(
    write: Callable[[bytes], None], *, backend: str = "auto", cache_dir: Path | None = None
) -> Emitter:
    """An emitter writing protocol bytes to ``write``: backend ``"c"``, ``"python"`` or ``"auto"``."""
    if backend not in ("auto", "c", "python"):
        raise UsageError(f"unknown emitter backend {backend!r}", hint="use 'auto', 'c' or 'python'")
    if backend == "python" or (backend == "auto" and find_c_compiler() is None):
        return PythonEmitter(write)
    return CEmitter(write, load_c_library(build_c_library(cache_dir)))


# ---- whole-capture helper (simulator, tests) -----------------------------------------------------


@dataclass(frozen=True)
class TensorSpec:
    """One output tensor to emit."""

    dtype: str
    shape: tuple[int, ...]
    scale: float
    zp: int
    data: bytes
    name: str = ""


def emit_tensor(em: Emitter, i: int, o: int, t: TensorSpec | LoopOutput, data: bytes, human_max: int) -> bool:
    """Output ``o`` of run ``i`` (``t`` says what it is) as its TENSOR and DATA records: False when the
    emitter refused it (it printed an ERROR record instead)."""
    meta = (t.dtype, list(t.shape), t.scale, t.zp)
    return bool(em.tensor(i, o, *meta, data=data, name=t.name, human_max=human_max))


@dataclass(frozen=True)
class RunSpec:
    """One input's run: the quantized input bytes, the invoke time and the outputs."""

    input_data: bytes
    invoke_us: int
    outputs: tuple[TensorSpec, ...]


def pack_info(fields: Sequence[tuple[str, FieldValue]], seq: int = 1) -> list[list[tuple[str, FieldValue]]]:
    """Greedily pack INFO fields into as few records as fit the line limit (in the given order)."""
    records: list[list[tuple[str, FieldValue]]] = []
    cur: list[tuple[str, FieldValue]] = []
    for item in fields:
        trial = [*cur, item]
        try:
            check_record_fits(seq + len(records), "INFO", [(k, PythonEmitter._value(v)) for k, v in trial])
        except ProtocolOverflowError:
            if not cur:
                raise
            records.append(cur)
            cur = [item]
        else:
            cur = trial
    if cur:
        records.append(cur)
    return records


def emit_capture(
    em: Emitter,
    *,
    info: Sequence[tuple[str, FieldValue]],
    runs: Sequence[RunSpec],
    fwver: str = "0.1.0",
    sim: bool = False,
    arena: tuple[int, int, str] | None = (65536, 32768, "host"),
    human_max: int = 16,
) -> None:
    """Print a whole, successful boot (BEGIN, INFO, ARENA, per run INPUT/TIME/TENSOR/DATA, END)."""
    em.begin(fwver, sim)
    for rec in pack_info(info):
        em.info(rec)
    if arena is not None:
        em.arena(*arena)
    for i, run in enumerate(runs):
        em.input(i, len(run.input_data), hashlib.sha256(run.input_data).hexdigest())
        em.time(i, run.invoke_us)
        for o, t in enumerate(run.outputs):
            emit_tensor(em, i, o, t, t.data, human_max)
    em.end(True)
