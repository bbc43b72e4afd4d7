"""Contract and fuzz tests for the binary frames and the resident command loop (docs/protocol.md).

Nothing is faked: the C files are the ones the generated firmware compiles (firmware_templates/common),
compiled with the host C compiler and driven through ctypes, and compared with their Python twins
(harness.protocol.frames, harness.protocol.loop). The C decoder and loop also run under AddressSanitizer
and UndefinedBehaviorSanitizer on seeded hostile input.
"""

from __future__ import annotations

import ast
import contextlib
import random
import re
import struct
from pathlib import Path

import pytest
from c_protocol import CFrameDecoder, c_encode_frame, c_prng
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.protocol import frames as fr
from harness.protocol import loop as py_loop
from harness.protocol.capture import parse_capture
from harness.protocol.emitter import PythonEmitter, find_c_compiler
from harness.protocol.native import load_library

HAVE_CC = find_c_compiler() is not None
needs_cc = pytest.mark.skipif(not HAVE_CC, reason="no host C compiler: the C side is not testable")
COMMON = Path(__file__).resolve().parent.parent / "firmware_templates" / "common"


@pytest.fixture(scope="module")
def lib():  # type: ignore[no-untyped-def]
    if not HAVE_CC:
        pytest.skip("no host C compiler")
    return load_library()


# ---- codec: C and Python agree -------------------------------------------------------------------


@needs_cc
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ftype=st.integers(0, 255), seq=st.integers(0, 0xFFFF), payload=st.binary(max_size=fr.MAX_PAYLOAD))
def test_c_and_python_encode_the_same_frame(lib, ftype: int, seq: int, payload: bytes) -> None:  # type: ignore[no-untyped-def]
    py = fr.encode_frame(ftype, seq, payload)
    assert c_encode_frame(lib, ftype, seq, payload) == py
    assert len(py) == fr.HEADER + len(payload) + fr.TRAILER
    (f,) = fr.split_stream(py).frames
    assert (f.type, f.seq, f.payload) == (ftype, seq, payload)


def test_encoder_refuses_oversized_payloads() -> None:
    with pytest.raises(ValueError, match="exceeds 16384"):
        fr.encode_frame(1, 0, bytes(fr.TX_MAX_PAYLOAD + 1))


def _hostile_stream(rng: random.Random) -> bytes:
    """Frames, text, noise, lone magic bytes, bit flips, truncations, a lying length field."""
    out = bytearray()
    for _ in range(rng.randrange(0, 8)):
        kind = rng.random()
        if kind < 0.2:
            out += b"I (123) esp-check: a log line\r\n"
        elif kind < 0.3:
            out += bytes(rng.randrange(256) for _ in range(rng.randrange(0, 50)))
        elif kind < 0.35:
            out += fr.MAGIC[: rng.randrange(1, 3)]
        payload = rng.randbytes(rng.randrange(600))
        f = bytearray(fr.encode_frame(rng.randrange(256), rng.randrange(65536), payload))
        r = rng.random()
        if r < 0.2:
            f[rng.randrange(len(f))] ^= 1 << rng.randrange(8)
        elif r < 0.3:
            f = f[: rng.randrange(len(f))]
        elif r < 0.35:  # consistent but huge length field: rejected at the header
            struct.pack_into("<HH", f, 6, 0xFFF0, 0xFFF0 ^ 0xFFFF)
        out += f
    return bytes(out)


@needs_cc
def test_c_and_python_decoders_take_the_same_decisions(lib) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(20261130)
    for trial in range(400):
        stream = _hostile_stream(rng)
        c, py = CFrameDecoder(lib), fr.FrameDecoder()
        got_c: list[fr.Frame] = []
        got_py: list[fr.Frame] = []
        pos = 0
        while pos < len(stream):  # the same stream in random chunks on both sides
            k = rng.randrange(1, 200)
            chunk = stream[pos : pos + k]
            pos += k
            got_c += c.feed(chunk)
            got_py += [x for x in py.feed(chunk) if isinstance(x, fr.Frame)]
        assert got_c == got_py, f"trial {trial}"
        assert c.stats == py.stats, f"trial {trial}"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=80), st.binary(min_size=0, max_size=300).map(
    lambda p: fr.encode_frame(0x81, 7, p))), max_size=12), st.integers(1, 64))  # fmt: skip
def test_python_decoder_conserves_every_byte(parts: list[bytes], chunk: int) -> None:
    """Text and frames come back in order; nothing is lost or duplicated, whatever the bytes."""
    stream = b"".join(parts)
    dec = fr.FrameDecoder()
    items: list[fr.Frame | bytes] = []
    for k in range(0, len(stream), chunk):
        items += dec.feed(stream[k : k + chunk])
    tail = dec.flush()
    rebuilt = b"".join(
        fr.encode_frame(x.type, x.seq, x.payload, x.flags) if isinstance(x, fr.Frame) else x for x in items
    )
    assert rebuilt + tail == stream


def test_text_and_records_survive_interleaved_frames() -> None:
    """A text capture with ACK/HELLO frames between its lines parses exactly like the capture alone."""
    from harness.protocol.emitter import RunSpec, TensorSpec, emit_capture

    out: list[bytes] = []
    em = PythonEmitter(out.append)
    info = [("nn", "ansi_c"), ("target", "esp32s3"), ("chip", "esp32s3"), ("rev", "0.2"), ("cores", 2),
            ("cpu_mhz", 240), ("idf", "v5.5.3"), ("tflm", "1.3.8"), ("espnn", "1.1.2"),
            ("model_sha256", "3c" * 32), ("model_bytes", 100), ("inputs", 1), ("outputs", 1)]  # fmt: skip
    data = bytes(range(256))
    emit_capture(em, info=info, runs=[RunSpec(b"\x01" * 8, 5, (TensorSpec("int8", (1, 256), 0.5, 0, data),))])
    plain = b"".join(out)
    mixed = b"".join(ln + fr.encode_frame(fr.RSP_ACK, k, b"\x00" * 4) for k, ln in enumerate(out))
    a, b = parse_capture(plain), parse_capture(mixed)
    assert a.valid and b.valid and b.frames == len(out)
    assert [r.outputs[0].data.tobytes() for r in b.runs] == [data]
    assert a.records == b.records


# ---- random inputs ---------------------------------------------------------------------------------


def test_prng_is_splitmix64() -> None:
    """Seed 0, index 0 is plain SplitMix64 from state 0: its published first outputs."""
    words = struct.unpack("<2Q", fr.prng_bytes(0, 0, "int8", 16))
    assert words == (0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4)


@needs_cc
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "int32", "float32"])
def test_device_prng_replicated_bit_exactly(lib, dtype: str) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(dtype)
    for _ in range(30):
        seed, index, n = rng.getrandbits(64), rng.getrandbits(32), rng.choice([0, 1, 4, 7, 8, 12, 6912, 3072])
        assert c_prng(lib, seed, index, dtype, n) == fr.prng_bytes(seed, index, dtype, n)
    vals = struct.unpack("<1000f", fr.prng_bytes(5, 1, "float32", 4000)) if dtype == "float32" else ()
    assert all(0.0 <= v < 1.0 for v in vals)


# ---- payload decoders: hostile payloads raise FrameFormatError, nothing else ----------------------


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200), st.lists(st.integers(0, 40), max_size=4))
def test_payload_decoders_only_raise_format_errors(p: bytes, outs: list[int]) -> None:
    for fn in (fr.decode_hello, fr.decode_data, fr.decode_error, fr.decode_ack, fr.decode_nak, fr.decode_boot,
               lambda x: fr.decode_results(x, outs)):  # fmt: skip
        with contextlib.suppress(fr.FrameFormatError):
            fn(p)


def test_hello_round_trip() -> None:
    h = fr.Hello(fr.VERSION, True, False, "ansi_c", 1, 0, "int8", 4096, 16384, 6912, (2304, 11), "ab" * 32,
                 "0.1.0", 0xDEADBEEF, "cd" * 32, "")  # fmt: skip
    assert fr.decode_hello(fr.encode_hello(h)) == h
    assert h.key == fr.key_crc(0xDEADBEEF, "ansi_c") != fr.key_crc(0xDEADBEEF, "optimized")


def test_hello_of_another_frame_protocol_is_refused_with_a_fix() -> None:
    h = fr.Hello(2, False, False, "optimized", 0, 0, "int8", 4096, 4096, 4, (4,), "", "x")
    old = bytes([1]) + fr.encode_hello(h)[1:]
    with pytest.raises(fr.FrameFormatError, match="rebuild and flash"):
        fr.decode_hello(old)


def test_a_record_whose_id_follows_nothing_is_refused() -> None:
    """The compact record head (docs/protocol.md "Result record"): 'next id' on a payload's first record,
    or the reserved bit, is a format error, never a record with a guessed id."""
    ok = struct.pack("<BIII", 0, 7, 100, 0xABCD) + struct.pack("<BII", fr.HEAD_NEXT_ID, 101, 0xBCDE)
    a, b = fr.decode_results(ok, [])
    assert (a.ident, b.ident, b.invoke_us, b.input_crc) == (7, 8, 101, 0xBCDE)
    for bad in (struct.pack("<BII", fr.HEAD_NEXT_ID, 1, 2), struct.pack("<BIII", 0x80, 1, 2, 3)):
        with pytest.raises(fr.FrameFormatError):
            fr.decode_results(bad, [])


# ---- the C headers' numbers are frames.py's ---------------------------------------------------------


def _fields(layout: struct.Struct, names: str) -> dict[str, tuple[int, int]]:
    """A frames.py payload layout's fields by name (``_``: a reserved one; ``zero``: pad bytes, and only
    they): (offset, size) of each."""
    codes = re.findall(r"\d*[a-zA-Z]", layout.format.lstrip("<"))
    out, at = {}, 0
    for name, code in zip(names.split(), codes, strict=True):
        assert (name == "zero") == code.endswith("x"), f"{layout.format}: {name} is {code}"
        if name != "_":
            out[name] = (at, struct.calcsize("<" + code))
        at += struct.calcsize("<" + code)
    return out


# where the C writes or reads each field of the frame header (ECF_AT_<field>) and of a payload
# (ECL_<payload>_AT_<field>; ECL_<payload>_BYTES: its size): frames.py's layouts, field names (``_``: none)
_LAYOUTS = {
    "ECF_AT_": (fr.FRAME_HEAD, "magic type flags seq len len_check"),
    "ECL_HELLO_AT_": (
        fr.HELLO_HEAD,
        "proto flags nn slot init dtype max_payload window input_bytes outputs _ session model_sha256"
        " app_sha256 other_sha256 keep_capacity kept",
    ),
    "ECL_RUN_AT_": (fr.RUN_HEAD, "id source results flags keep repeat expected seed"),
    "ECL_REC_AT_": (fr.REC_HEAD, "head id invoke_us input_crc"),
    "ECL_DATA_AT_": (fr.DATA_HEAD, "id output offset"),
    "ECL_ERROR_AT_": (fr.ERROR_HEAD, "id code stage"),
    "ECL_ACK_AT_": (fr.ACK_BODY, "next_seq zero"),
    "ECL_NAK_AT_": (fr.NAK_BODY, "next_seq reason zero"),
    "ECL_SYNC_AT_": (fr.SYNC_BODY, "token"),
    "ECL_BOOT_AT_": (fr.BOOT_BODY, "slot zero status"),
    "ECL_BAUD_AT_": (fr.BAUD_BODY, "baud status"),
    "ECL_KEEP_AT_": (py_loop.KEEP_HEAD, "magic input_bytes capacity nonce bytes model_sha256 place"),
}
_FIELDS = {prefix: _fields(*layout) for prefix, layout in _LAYOUTS.items()}
# frames.py constants the device has no define for: the host's own bounds and what it derives
_HOST_ONLY = {"LOAD_CHUNK", "HELLO_LINE_MAX"}
# C names whose Python twin is spelled or stored another way (any other ECF_X / ECL_X is frames.X)
_OTHER_NAMES = {
    "ECF_MAGIC0": ("MAGIC", fr.MAGIC[0]),
    "ECF_MAGIC1": ("MAGIC", fr.MAGIC[1]),
    "ECF_MAX_TX_PAYLOAD": ("TX_MAX_PAYLOAD", fr.TX_MAX_PAYLOAD),
    "ECF_TYPE_HELLO_Q": ("CMD_HELLO", fr.CMD_HELLO),
    "ECF_TYPE_HELLO": ("RSP_HELLO", fr.RSP_HELLO),
    "ECF_HELLO_LINE_PREFIX": ("HELLO_LINE", b"\r\n" + fr.HELLO_LINE),
    "ECL_BAUD_CONFIRM_US": ("BAUD_CONFIRM_S", round(fr.BAUD_CONFIRM_S * 1_000_000)),
    "ECL_HELLO_SHA256": ("HELLO_HEAD", _FIELDS["ECL_HELLO_AT_"]["model_sha256"][1]),
    "ECL_KEEP_AT_CRC": ("KEEP_HEAD", py_loop.KEEP_HEAD.size),  # the header's CRC-32 follows its fields
    "ECL_OK": ("", py_loop.ECL_OK),
    "ECL_HALTED": ("", py_loop.ECL_HALTED),
    "ECL_REBOOT": ("", py_loop.ECL_REBOOT),
}
_FAMILIES = {"ECF_DT_": fr.DTYPE_CODES, "ECL_STAGE_": fr.STAGE_CODES, "ECL_NN_": fr.NN_CODES}


def _c_defines(common: Path) -> dict[str, int | bytes]:
    """Every ``#define ECF_`` / ``ECL_`` of esp_check_frame.h and esp_check_loop.h, evaluated: a number, a
    string (as bytes), or a sum of earlier defines in parentheses."""
    raw: dict[str, str] = {}
    for header in ("esp_check_frame.h", "esp_check_loop.h"):
        text = (common / header).read_text(encoding="utf-8")
        raw.update(re.findall(r'^#define (EC[FL]_\w+)[ \t]+(\([^)]*\)|"[^"]*"|\S+)', text, re.MULTILINE))
    out: dict[str, int | bytes] = {}
    for name, value in raw.items():
        if value.startswith('"'):
            out[name] = ast.literal_eval("b" + value)
        elif value.startswith("("):
            out[name] = sum(int(out[term.strip()]) for term in value.strip("()").split("+"))
        else:
            out[name] = int(value.rstrip("uUlL"), 0)
    return out


def _python_twin(name: str) -> int | bytes:
    """frames.py's value of the C define ``name``: a missing one raises (a define on the C side only)."""
    if name in _OTHER_NAMES:
        return _OTHER_NAMES[name][1]
    for prefix, table in _FAMILIES.items():
        if name.startswith(prefix):
            return table[name[len(prefix) :].lower()]
    for prefix, fields in _FIELDS.items():
        if name.startswith(prefix):
            return fields[name[len(prefix) :].lower()][0]
    if name.endswith("_BYTES") and name[: -len("BYTES")] + "AT_" in _LAYOUTS:
        return _LAYOUTS[name[: -len("BYTES")] + "AT_"][0].size
    value = getattr(fr, name[4:])
    assert isinstance(value, int | bytes), name
    return value


def test_the_c_frame_and_loop_defines_are_frames_py() -> None:
    """esp_check_frame.h's and esp_check_loop.h's numbers (frame layout, types, codes, bounds, flags, the
    payloads' field offsets and sizes, the input PRNG's constants, the kept-input store) and frames.py's
    are one fact in two languages: every C define has its equal Python twin, every frames.py constant (and
    code table entry, payload layout and its fields) its define, but the host's own two (``_HOST_ONLY``).
    A define added or changed on one side alone fails here."""
    c_side = _c_defines(COMMON)
    assert c_side == {name: _python_twin(name) for name in c_side}
    twins = {name[4:] for name in c_side} | {python for python, _ in _OTHER_NAMES.values()}
    constants = {
        n for n, v in vars(fr).items() if n.isupper() and n[0] != "_" and isinstance(v, int | float | bytes)
    }
    assert constants - _HOST_ONLY - twins == set()
    for prefix, table in (_FAMILIES | _FIELDS).items():
        assert {prefix + key.upper() for key in table} <= set(c_side), prefix
    layouts = [layout for layout, _ in _LAYOUTS.values()]  # every frames.py layout has its defines
    assert [n for n, v in vars(fr).items() if isinstance(v, struct.Struct) and v not in layouts] == []
    # the largest HELLO payload fits the device's control-frame buffer
    assert fr.HELLO_FIXED + 4 * fr.MAX_OUTPUTS + 1 + fr.FWVER_MAX <= fr.CTRL_MAX
