"""Contract tests for the tap records (OP / OPEND / OPDUMP / OPDATA, docs/protocol.md "Tap records").

The C emitter is the very esp_check_proto.c the firmware compiles (host gcc, loaded through ctypes);
its Python twin must print the same bytes, and the parser must read back exactly what was printed and
reject a capture whose tap records are damaged or inconsistent. Nothing is faked.
"""

# ruff: noqa: E501  (protocol lines read better unwrapped)
from __future__ import annotations

import hashlib
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.protocol import emitter as em_mod
from harness.protocol.capture import Record, parse_capture
from harness.protocol.emitter import CEmitter, PythonEmitter, TapTensor, build_c_library, load_c_library

HAVE_CC = em_mod.find_c_compiler() is not None
pytestmark = pytest.mark.skipif(not HAVE_CC, reason="no host C compiler: C emitter contract not testable")

INFO = [
    ("nn", "optimized"), ("target", "esp32s3"), ("chip", "esp32s3"), ("rev", "0.2"), ("cores", 2),
    ("cpu_mhz", 240), ("idf", "v5.5.3"), ("tflm", "1.3.8"), ("espnn", "1.1.2"),
    ("model_sha256", "3c" * 32), ("model_bytes", 100), ("inputs", 1), ("outputs", 1), ("tap", 1),
]  # fmt: skip


@pytest.fixture(scope="module")
def libpath(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_c_library(tmp_path_factory.mktemp("emitter-cache"))


def _tapped_capture(
    em: CEmitter | PythonEmitter,
    ops: list[tuple[str, list[TapTensor], list[TapTensor]]],
    dump: tuple[int, int, str, np.ndarray] | None = None,
    *,
    opend_ops: int | None = None,
    opend: bool = True,
) -> None:
    out = np.arange(6, dtype=np.int8).reshape(1, 6)
    em.begin("0.1.0", True)
    em.info(INFO[:6])
    em.info(INFO[6:12])
    em.info(INFO[12:])
    em.input(0, 3, hashlib.sha256(b"abc").hexdigest())
    em.time(0, 1000)
    em.tensor(0, 0, "int8", out.shape, 0.5, -1, out.tobytes(), "y", 0)
    for k, (name, ins, outs) in enumerate(ops):
        em.op(0, 0, k, name, 100 * (k + 1), ins, outs)
    if opend:
        em.op_end(0, len(ops) if opend_ops is None else opend_ops, 0, 4096)
    if dump is not None:
        idx, t, role, arr = dump
        em.op_dump(0, idx, t, role, str(arr.dtype), arr.shape, 0.25, 3, arr.tobytes())
    em.end(True)


def _both(libpath: Path, fn) -> bytes:  # type: ignore[no-untyped-def]
    c_out: list[bytes] = []
    p_out: list[bytes] = []
    fn(CEmitter(c_out.append, load_c_library(libpath)))
    fn(PythonEmitter(p_out.append))
    c, p = b"".join(c_out), b"".join(p_out)
    assert c == p
    return c


def test_tapped_capture_round_trips_identically(libpath: Path) -> None:
    crc = zlib.crc32(b"x")
    ops = [
        ("CONV_2D", [TapTensor(0, (1, 4, 4, 3), 0x01020304)], [TapTensor(7, (1, 2, 2, 8), crc)]),
        ("ADD", [TapTensor(7, (1, 2, 2, 8), crc), TapTensor(3, (1, 2, 2, 8), 5)], [TapTensor(8, (1, 6), 9)]),
        ("RESHAPE", [TapTensor(8, (), 1)], []),
    ]
    dump = np.arange(-50, 150, dtype=np.int8).reshape(1, 10, 20)  # 200 bytes: 3 OPDATA chunks
    raw = _both(libpath, lambda em: _tapped_capture(em, ops, (1, 8, "out", dump)))
    assert (
        b" OP i=0 sub=0 idx=1 op=ADD cycles=200 in=7:1x2x2x8:%08X,3:1x2x2x8:00000005 out=8:1x6:00000009 "
        % crc
        in raw
    )
    cap = parse_capture(raw)
    assert cap.valid, cap.problems
    assert cap.tapped
    run = cap.runs[0]
    assert [o.opcode for o in run.ops] == ["CONV_2D", "ADD", "RESHAPE"]
    assert run.ops[1].inputs[0].t == 7 and run.ops[1].inputs[0].crc == f"{crc:08X}"
    assert run.ops[0].inputs[0].shape == (1, 4, 4, 3) and run.ops[2].inputs[0].shape == ()
    assert run.ops[2].outputs == () and run.ops[1].cycles == 200
    assert run.ops_end == {"ops": 3, "dropped": 0, "ram": 4096}
    (d,) = run.dumps
    assert (d.idx, d.t, d.role) == (1, 8, "out")
    assert np.array_equal(d.tensor.data, dump) and d.tensor.scale == 0.25 and d.tensor.zero_point == 3
    assert raw.count(b" OPDATA ") == 3


tap_tensor = st.builds(
    TapTensor,
    st.integers(-(2**31), 2**31 - 1),
    st.lists(st.integers(0, 2**31 - 1), max_size=8).map(tuple),
    st.integers(0, 2**32 - 1),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=st.text(max_size=40),
    cycles=st.integers(0, 2**64 - 1),
    ins=st.lists(tap_tensor, max_size=6),
    outs=st.lists(tap_tensor, max_size=5),
)
def test_op_record_contract_random(
    libpath: Path, name: str, cycles: int, ins: list[TapTensor], outs: list[TapTensor]
) -> None:
    """Any OP record: byte-identical on both emitters, and either parsed back exactly or replaced."""

    def one(em: CEmitter | PythonEmitter) -> None:
        em.begin("0.1.0", True)
        em.op(0, 0, 3, name, cycles, ins, outs)

    raw = _both(libpath, one)
    line = raw.split(b"\r\n")[1]
    assert len(line) + 2 <= em_mod.LINE_MAX
    if b" ERROR " in line:
        assert b"msg=record_overflow" in line
        assert len(ins) > 4 or len(outs) > 4 or len(line) > 0  # overflow is the only allowed substitute
        return
    assert len(ins) <= 4 and len(outs) <= 4
    from harness.protocol.capture import Capture, _Builder, _Scanner  # record level, no full capture needed

    (_begin, rec) = _Scanner(Capture()).records(raw)
    assert isinstance(rec, Record)
    assert rec.type == "OP" and int(rec.fields["cycles"]) == cycles
    entries = _Builder._tap_list(rec, "in") + _Builder._tap_list(rec, "out")
    assert [(e.t, e.shape, int(e.crc, 16)) for e in entries] == [(x.t, x.shape, x.crc) for x in ins + outs]


def test_opdump_bad_role_and_bad_size_are_errors_on_both(libpath: Path) -> None:
    def one(em: CEmitter | PythonEmitter) -> None:
        em.begin("0.1.0", True)
        em.op_dump(0, 1, 2, "both", "int8", (2,), 1.0, 0, b"ab")
        em.op_dump(0, 1, 2, "in", "int8", (3,), 1.0, 0, b"ab")

    raw = _both(libpath, one)
    assert b"msg=bad_role" in raw and b"msg=tensor_size" in raw


def _good(libpath: Path, **kw: object) -> bytes:
    ops = [("CONV_2D", [TapTensor(0, (2,), 1)], [TapTensor(1, (2,), 2)])]
    dump = np.array([1, 2, 3], dtype=np.int8)
    return _both(libpath, lambda em: _tapped_capture(em, ops, (0, 1, "out", dump), **kw))  # type: ignore[arg-type]


def test_parser_rejects_inconsistent_tap_records(libpath: Path) -> None:
    assert parse_capture(_good(libpath)).valid
    bad = parse_capture(_good(libpath, opend_ops=2))
    assert not bad.valid and any("OPEND" in p and "ops=2" in p for p in bad.problems)
    # a tapped firmware that printed no OPEND: incomplete
    cap = parse_capture(_good(libpath, opend=False))
    assert not cap.valid and any("no OPEND" in p for p in cap.problems)
    raw = _good(libpath)
    lines = raw.split(b"\r\n")
    # a damaged OPDATA line (one flipped character) is a corrupted record, never a result
    k = next(n for n, ln in enumerate(lines) if b" OPDATA " in ln)
    lines[k] = lines[k].replace(b"b64=A", b"b64=B")
    cap = parse_capture(b"\r\n".join(lines))
    assert not cap.valid and any("corrupted record" in p for p in cap.problems)


def test_parser_checks_opdump_data_crc_and_completeness() -> None:
    """Records with valid line CRCs but a tensor CRC that does not match its data, or missing chunks."""
    from harness.protocol.emitter import PythonEmitter

    def build(tamper: str) -> bytes:
        out: list[bytes] = []
        em = PythonEmitter(out.append)
        em.begin("0.1.0", True)
        for rec in (INFO[:6], INFO[6:12], INFO[12:]):
            em.info(rec)
        em.input(0, 3, hashlib.sha256(b"abc").hexdigest())
        em.time(0, 1)
        em.tensor(0, 0, "int8", (1,), 1.0, 0, b"\x01", "", 0)
        em.op_end(0, 0, 0, 0)
        data = bytes(range(100)) if tamper != "crc" else bytes(range(1, 101))
        if tamper == "crc":
            # a dump whose announced CRC is of other bytes: emit the header by hand with the wrong CRC
            em._emit(
                "OPDUMP",
                [(k, v) for k, v in [("i", b"0"), ("idx", b"0"), ("t", b"1"), ("role", b"out"),
                 ("dtype", b"int8"), ("shape", b"100"), ("scale", b"0x3F800000"), ("zp", b"0"),
                 ("bytes", b"100"), ("crc", b"%08X" % zlib.crc32(bytes(range(100))))]],
            )  # fmt: skip
            for off in (0, 96):
                em._emit("OPDATA", [("i", b"0"), ("idx", b"0"), ("t", b"1"), ("role", b"out"),
                                    ("off", b"%d" % off), ("b64", __import__("base64").b64encode(data[off:off + 96]))])  # fmt: skip
        else:
            em.op_dump(0, 0, 1, "out", "int8", (100,), 1.0, 0, data)
        em.end(True)
        raw = b"".join(out)
        if tamper == "drop":
            lines = raw.split(b"\r\n")
            k = next(n for n, ln in enumerate(lines) if b" OPDATA " in ln)
            raw = b"\r\n".join(lines[:k] + lines[k + 1 :])
        return raw

    assert parse_capture(build("none")).valid
    cap = parse_capture(build("crc"))
    assert not cap.valid and any("data CRC" in p for p in cap.problems)
    cap = parse_capture(build("drop"))
    assert not cap.valid


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    dtype=st.sampled_from(["int8", "uint8", "int16", "int32", "float32"]),
    shape=st.lists(st.integers(0, 7), min_size=0, max_size=4).map(tuple),
    role=st.sampled_from(["in", "out"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_opdump_contract_random(
    libpath: Path, dtype: str, shape: tuple[int, ...], role: str, seed: int
) -> None:
    """Any dump: byte-identical on both emitters and reassembled bit-exactly by the parser."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape)) if shape else 1
    raw = rng.integers(0, 256, n * np.dtype(dtype).itemsize, dtype=np.uint8).tobytes()
    arr = np.frombuffer(raw, dtype=dtype).reshape(shape)
    ops = [("CONV_2D", [TapTensor(0, (1,), 1)], [TapTensor(4, shape, zlib.crc32(raw))])]
    out = _both(libpath, lambda em: _tapped_capture(em, ops, (0, 4, role, arr)))
    cap = parse_capture(out)
    assert cap.valid, cap.problems
    (d,) = cap.runs[0].dumps
    assert d.role == role and d.tensor.shape == shape and d.tensor.dtype == dtype
    assert d.tensor.data.tobytes() == raw
