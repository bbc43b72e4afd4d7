"""Parser validity rules (docs/protocol.md): a capture that is not intact can never yield results."""

from __future__ import annotations

import hashlib
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.errors import CaptureError, ExitCode
from harness.protocol.capture import Capture, parse_capture
from harness.protocol.emitter import PythonEmitter, RunSpec, TensorSpec, emit_capture
from harness.protocol.spec import crc32_hex

INFO = [
    ("nn", "ansi_c"), ("target", "esp32"), ("chip", "esp32"), ("rev", "3.1"), ("cores", 2),
    ("cpu_mhz", 240), ("idf", "v5.5.3"), ("tflm", "1.3.8"), ("espnn", "1.1.2"),
    ("model_sha256", "ab" * 32), ("model_bytes", 100), ("inputs", 2), ("outputs", 2),
]  # fmt: skip
OUT0 = np.arange(-100, 150, dtype=np.int16).astype(np.int8)  # 250 bytes: 3 DATA chunks (96+96+58)
OUT1 = np.array([1.5, -2.25, np.inf], dtype=np.float32)


def good_capture(nn: str = "ansi_c") -> bytes:
    out: list[bytes] = []
    runs = [
        RunSpec(bytes([k]) * 5, 1000 + k, (
            TensorSpec("int8", (1, 250), 0.00390625, -128, (OUT0 + k).tobytes(), "seg"),
            TensorSpec("float32", (3,), 0.0, 0, OUT1.tobytes(), "probs"),
        ))
        for k in range(2)
    ]  # fmt: skip
    info = [(k, nn if k == "nn" else v) for k, v in INFO]
    emit_capture(PythonEmitter(out.append), info=info, runs=runs, arena=(4096, 2048, "internal"))
    return b"".join(out)


def rec(seq: int, rtype: str, *fields: str) -> bytes:
    body = f"@EC1 {seq} {rtype}{''.join(' ' + f for f in fields)} ".encode()
    return body + f"*{zlib.crc32(body):08X}\r\n".encode()


def lines_of(raw: bytes) -> list[bytes]:
    return raw.split(b"\r\n")


def test_good_capture_is_valid_and_complete() -> None:
    cap = parse_capture(good_capture())
    assert cap.valid and cap.complete and not cap.problems and not cap.warnings
    assert cap.nn_mode == "ansi_c" and cap.model_sha256 == "ab" * 32 and not cap.simulated
    assert cap.arena is not None and (cap.arena.size, cap.arena.used, cap.arena.mem) == (
        4096,
        2048,
        "internal",
    )
    assert [r.index for r in cap.runs] == [0, 1]
    assert (
        cap.runs[1].input_sha256 == hashlib.sha256(b"\x01" * 5).hexdigest() and cap.runs[1].invoke_us == 1001
    )
    t0, t1 = cap.runs[1].outputs
    assert t0.data.dtype == np.int8 and t0.data.shape == (1, 250) and np.array_equal(t0.data[0], OUT0 + 1)
    assert t1.data.dtype == np.float32 and t1.data.tobytes() == OUT1.tobytes() and t1.name == "probs"
    assert cap.require_valid() is cap


def test_crc32_hex_is_zlib() -> None:
    assert crc32_hex(b"123456789") == "CBF43926"
    assert crc32_hex(b"") == "00000000"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_single_byte_corruption_is_detected_or_harmless(data: st.DataObject) -> None:
    """The worst bug: corrupted bytes must never produce different results that look valid."""
    raw = good_capture()
    ref = parse_capture(raw)
    pos = data.draw(st.integers(0, len(raw) - 1))
    new = data.draw(st.integers(0, 255).filter(lambda b: b != raw[pos]))
    mode = data.draw(st.sampled_from(["flip", "delete", "insert"]))
    if mode == "flip":
        bad = raw[:pos] + bytes([new]) + raw[pos + 1 :]
    elif mode == "delete":
        bad = raw[:pos] + raw[pos + 1 :]
    else:
        bad = raw[:pos] + bytes([new]) + raw[pos:]
    cap = parse_capture(bad)
    if cap.valid:  # only bytes outside records (Output: lines, line ends) may change without detection
        assert [[t.data.tobytes() for t in r.outputs] for r in cap.runs] == [
            [t.data.tobytes() for t in r.outputs] for r in ref.runs
        ]
        assert cap.info == ref.info and [r.input_sha256 for r in cap.runs] == [
            r.input_sha256 for r in ref.runs
        ]
    else:
        with pytest.raises(CaptureError) as exc_info:
            cap.require_valid("A")
        assert exc_info.value.exit_code == ExitCode.INFRASTRUCTURE


@settings(max_examples=100, deadline=None)
@given(cut=st.integers(0, 10_000))
def test_truncation_is_never_valid(cut: int) -> None:
    raw = good_capture()
    end_line = raw.rindex(b"@EC1 ")
    k = cut % (end_line + 20)  # anywhere up to a few bytes into the END record
    cap = parse_capture(raw[:k])
    assert not cap.valid and cap.problems


def test_lost_line_is_a_sequence_gap() -> None:
    ls = lines_of(good_capture())
    idx = next(i for i, line in enumerate(ls) if b" TIME " in line)
    cap = parse_capture(b"\r\n".join(ls[:idx] + ls[idx + 1 :]))
    assert not cap.valid
    assert any("sequence jumps" in p for p in cap.problems)


def test_repeated_line_is_detected() -> None:
    ls = lines_of(good_capture())
    idx = next(i for i, line in enumerate(ls) if b" DATA " in line)
    cap = parse_capture(b"\r\n".join([*ls[: idx + 1], ls[idx], *ls[idx + 1 :]]))
    assert not cap.valid and any("sequence" in p for p in cap.problems)


def _minimal(*middle: bytes, end: bytes | None = None, info: list[str] | None = None) -> bytes:
    fields = info if info is not None else [f"{k}={v}" for k, v in INFO if k not in ("inputs", "outputs")] + [
        "inputs=1", "outputs=1"
    ]  # fmt: skip
    parts = [rec(0, "BEGIN", "proto=1", "fw=esp-check", "fwver=0.1.0", "sim=1")]
    parts.append(rec(1, "INFO", *fields[:7]))
    parts.append(rec(2, "INFO", *fields[7:]))
    seq = 3
    for m in middle:
        rtype, *flds = m.decode().split(" ")
        parts.append(rec(seq, rtype, *flds))
        seq += 1
    parts.append(end if end is not None else rec(seq, "END", "status=ok", f"records={seq}"))
    return b"".join(parts)


SHA = "c" * 64


def test_minimal_handmade_capture_is_valid() -> None:
    data = bytes(range(11))
    cap = parse_capture(_minimal(
        b"INPUT i=0 bytes=5 sha256=" + SHA.encode(), b"TIME i=0 invoke_us=7",
        f"TENSOR i=0 o=0 dtype=uint8 shape=11 scale=0x3B800000 zp=0 bytes=11 crc={crc32_hex(data)}".encode(),
        b"DATA i=0 o=0 off=0 b64=AAECAwQFBgcICQo=",
    ))  # fmt: skip
    assert cap.valid, cap.problems
    assert cap.simulated and cap.runs[0].outputs[0].data.tolist() == list(range(11))


@pytest.mark.parametrize(
    ("middle", "end", "needle"),
    [
        ((), b"", "no END record"),
        ((), rec(3, "END", "status=ok", "records=2"), "END says 2 records"),
        ((), rec(3, "END", "status=maybe", "records=3"), "status 'maybe'"),
        (
            (
                b"INPUT i=0 bytes=5 sha256=" + SHA.encode(),
                b"TIME i=0 invoke_us=7",
                b"TENSOR i=0 o=0 dtype=int8 shape=200 scale=0x3F800000 zp=0 bytes=200 crc=00000000",
                b"DATA i=0 o=0 off=0 b64=" + __import__("base64").b64encode(bytes(96)),
            ),
            None,
            "only 96 of 200 bytes",
        ),
        (
            (
                b"INPUT i=0 bytes=5 sha256=" + SHA.encode(),
                b"TIME i=0 invoke_us=7",
                b"TENSOR i=0 o=0 dtype=int8 shape=2 scale=0x3F800000 zp=0 bytes=2 crc=DEADBEEF",
                b"DATA i=0 o=0 off=0 b64=AAE=",
            ),
            None,
            "data CRC",
        ),
        (
            (
                b"INPUT i=0 bytes=5 sha256=" + SHA.encode(),
                b"TIME i=0 invoke_us=7",
                b"TENSOR i=0 o=0 dtype=int8 shape=3 scale=0x3F800000 zp=0 bytes=2 crc=DEADBEEF",
            ),
            None,
            "does not match shape",
        ),
        (
            (
                b"INPUT i=0 bytes=5 sha256=" + SHA.encode(),
                b"TIME i=0 invoke_us=7",
                b"TENSOR i=0 o=0 dtype=int8 shape=2 scale=0x3F800000 zp=0 bytes=2 crc="
                + crc32_hex(b"\0\1").encode(),
                b"DATA i=0 o=0 off=1 b64=AAE=",
            ),
            None,
            "does not continue",
        ),
        (
            (
                b"INPUT i=0 bytes=5 sha256=" + SHA.encode(),
                b"TIME i=0 invoke_us=7",
                b"TENSOR i=0 o=0 dtype=int8 shape=2 scale=0x3F800000 zp=0 bytes=2 crc="
                + crc32_hex(b"\0\1").encode(),
                b"DATA i=0 o=0 off=0 b64=AA!E",
            ),
            None,
            "not valid base64",
        ),
        ((b"INPUT i=0 bytes=5 sha256=" + SHA.encode(),), None, "has no TIME"),
        ((b"INPUT i=0 bytes=5 sha256=" + SHA.encode(), b"TIME i=0 invoke_us=7"), None, "outputs [] arrived"),
        ((b"INPUT i=0 bytes=5 sha256=XYZ", b"TIME i=0 invoke_us=7"), None, "not 64 lower-case hex"),
        ((b"INPUT i=0 bytes=1_000 sha256=" + SHA.encode(),), None, "not an integer"),
        ((b"TIME i=0 invoke_us=7",), None, "without its INPUT"),
        ((b"ERROR stage=invoke code=1 i=0 msg=x",), None, "status=ok although ERROR"),
        (
            (b"TENSOR i=0 o=0 dtype=float16 shape=2 scale=0x3F800000 zp=0 bytes=4 crc=00000000",),
            None,
            "dtype",
        ),
    ],
)
def test_validity_rules(middle: tuple[bytes, ...], end: bytes | None, needle: str) -> None:
    cap = parse_capture(_minimal(*middle, end=end))
    assert not cap.valid
    assert any(needle in p for p in cap.problems), cap.problems


def test_missing_required_info_and_bad_begin() -> None:
    cap = parse_capture(_minimal(info=["nn=optimized", "target=esp32", "chip=esp32", "rev=1.0", "cores=2",
                                       "cpu_mhz=160", "idf=x", "tflm=1"]))  # fmt: skip
    assert not cap.valid and any("required INFO keys missing: espnn" in p for p in cap.problems)
    raw = rec(0, "BEGIN", "proto=2", "fw=other", "fwver=1", "sim=7") + rec(1, "END", "status=ok", "records=1")
    probs = " | ".join(parse_capture(raw).problems)
    assert "protocol version '2'" in probs and "not esp-check firmware" in probs and "sim='7'" in probs


def test_duplicate_info_key_is_a_problem() -> None:
    fields = [f"{k}={v}" for k, v in INFO if k not in ("inputs", "outputs")] + ["inputs=0", "nn=optimized"]
    cap = parse_capture(_minimal(info=fields))
    assert any("INFO key 'nn' repeated" in p for p in cap.problems)


def firmware_faulted(cap: Capture) -> bool:
    """The firmware reported a fault: an ERROR record, or END status=error."""
    return bool(cap.errors) or cap.end_status == "error"


def test_firmware_error_run_is_valid_evidence_of_a_fault() -> None:
    cap = parse_capture(_minimal(
        b"INPUT i=0 bytes=5 sha256=" + SHA.encode(), b"ERROR stage=invoke code=1 i=0 msg=Invoke_failed",
        end=rec(5, "END", "status=error", "records=5"),
    ))  # fmt: skip
    assert cap.valid, cap.problems
    assert (
        firmware_faulted(cap)
        and cap.errors[0].stage == "invoke"
        and cap.runs[0].errors[0].msg == "Invoke_failed"
    )
    assert not parse_capture(
        _minimal(end=rec(3, "END", "status=error", "records=3"))
    ).valid  # error without ERROR


def test_second_begin_is_a_reboot_and_first_boot_kept() -> None:
    raw = good_capture()
    cut = raw.index(b" TIME i=1 ")
    rebooted = raw[: raw.rindex(b"\n", 0, cut) + 1] + b"Guru Meditation Error: Core  0 panic'ed\r\n" + raw
    cap = parse_capture(rebooted)
    assert not cap.valid and cap.boots == 2
    assert any("rebooted mid-run" in p for p in cap.problems)
    assert len(cap.runs) == 2 and cap.runs[0].outputs  # first boot's records kept as evidence


def test_boot_after_end_is_a_warning_only() -> None:
    raw = good_capture()
    cap = parse_capture(raw + b"ets Jun  8 2016\r\n" + raw[: raw.index(b"\n") + 1])
    assert cap.valid and any("booted again after END" in w for w in cap.warnings)


def test_watchdog_splice_is_repaired_with_warning() -> None:
    raw = good_capture()
    pos = raw.index(b"TENSOR i=0 o=0") + 25
    log = b"\x1b[0;31mE (51234) task_wdt: Task watchdog got triggered. The following tasks did not reset"
    log += b"\x1b[0m\r\n"
    cap = parse_capture(raw[:pos] + log + raw[pos:])
    assert cap.valid, cap.problems
    assert any("task_wdt" in w for w in cap.warnings)
    assert np.array_equal(cap.runs[0].outputs[0].data[0], OUT0)
    # a splice that also lost bytes cannot be repaired
    cap2 = parse_capture(raw[:pos] + log + raw[pos + 1 :])
    assert not cap2.valid and any("corrupted record" in p for p in cap2.problems)


def test_noise_prefixes_colours_and_line_endings() -> None:
    ls = lines_of(good_capture())
    noisy = [b"\xff\xfe\x00garbage \xc3(", b"I (123) boot: ESP-IDF v5.5.3"]
    for k, line in enumerate(ls):
        if not line:
            continue
        if k % 3 == 0:
            line = b"I (99) app: " + line  # logged through ESP_LOGI
        elif k % 3 == 1:
            line = b"\x1b[0;32m" + line + b"\x1b[0m"
        noisy.append(line + (b"\r\r\n" if k % 2 else b"\n"))
    cap = parse_capture(b"".join(x if x.endswith(b"\n") else x + b"\n" for x in noisy))
    assert cap.valid, cap.problems
    assert np.array_equal(cap.runs[0].outputs[0].data[0], OUT0)
    assert parse_capture(good_capture().decode("ascii")).valid  # str input


def test_overlong_record_line_rejected() -> None:
    long_info = rec(1, "INFO", "x=" + "a" * 240)
    raw = (
        rec(0, "BEGIN", "proto=1", "fw=esp-check", "fwver=1", "sim=0")
        + long_info
        + rec(2, "END", "status=ok", "records=2")
    )
    cap = parse_capture(raw)
    assert any("longer than 240" in p for p in cap.problems)


def test_hostile_input_is_never_evaluated_and_huge_lines_are_bounded() -> None:
    evil = rec(1, "INFO", "nn=__import__('os').system('false')")
    assert b"(" in evil
    cap = parse_capture(rec(0, "BEGIN", "proto=1", "fw=esp-check", "fwver=1", "sim=0") + evil)
    assert cap.info["nn"] == "__import__('os').system('false')"
    blob = b"@EC1 " + b"A" * 5_000_000  # no newline at all
    cap2 = parse_capture(blob)
    assert not cap2.valid and cap2.problems
    cap3 = parse_capture(b"")
    assert not cap3.valid and not cap3.has_records


def test_unknown_record_types_are_kept() -> None:
    # (OP is a tap record now, tests/test_tap_protocol.py; PROF stands for a future record type)
    cap = parse_capture(_minimal(b"PROF i=0 idx=3 op=CONV_2D in_crc=00000000 out_crc=11111111 cycles=5",
                                 b"INPUT i=0 bytes=1 sha256=" + SHA.encode(), b"TIME i=0 invoke_us=1",
                                 b"TENSOR i=0 o=0 dtype=int8 shape=- scale=0x00000000 zp=0 bytes=1 crc="
                                 + crc32_hex(b"\x07").encode(), b"DATA i=0 o=0 off=0 b64=Bw=="))  # fmt: skip
    assert cap.valid, cap.problems
    assert [r.type for r in cap.unknown] == ["PROF"] and cap.unknown[0].fields["op"] == "CONV_2D"
    assert cap.runs[0].outputs[0].shape == () and int(cap.runs[0].outputs[0].data) == 7


def test_stale_records_before_begin_are_ignored_with_warning() -> None:
    stale = rec(41, "DATA", "i=0", "o=0", "off=0", "b64=AAAA") + b"@EC1 42 DATA i=0 o=0 off=9\r\n"
    cap = parse_capture(stale + good_capture())
    assert cap.valid, cap.problems
    assert any("before the first BEGIN" in w for w in cap.warnings)


def test_spec_example_is_a_valid_capture() -> None:
    """docs/protocol.md's example is real output: the spec and the parser agree."""
    from pathlib import Path

    spec = (Path(__file__).parent.parent / "docs" / "protocol.md").read_text()
    example = spec[spec.index("## Example") :].split("```")[1].strip("\n")
    cap = parse_capture(example.replace("\n", "\r\n") + "\r\n")
    assert cap.valid, cap.problems
    t = cap.runs[0].outputs[0]
    assert (t.data.astype(int) + 128).tolist() == [[2, 0, 35, 61, 0, 74, 24, 3, 20, 35, 1]]
    assert t.name == "StatefulPartitionedCall:0" and cap.info["model_bytes"] == "28888"
    out: list[bytes] = []  # and the emitter prints exactly that text
    em = PythonEmitter(out.append)
    em.begin("0.1.0", False)
    for rec_fields in ([("nn", "ansi_c"), ("target", "esp32s3"), ("chip", "esp32s3"), ("rev", "0.2"),
                        ("cores", 2), ("cpu_mhz", 240)],
                       [("idf", "v5.5.3"), ("tflm", "1.3.8"), ("espnn", "1.1.2"), ("model_bytes", 28888),
                        ("inputs", 1), ("outputs", 1)],
                       [("model_sha256", cap.info["model_sha256"])]):  # fmt: skip
        em.info(rec_fields)
    em.arena(40960, 25952, "internal")
    em.input(0, 3072, cap.runs[0].input_sha256)
    em.time(0, 48210)
    em.tensor(0, 0, "int8", [1, 11], 0.00390625, -128, t.data.tobytes(), name=t.name, human_max=3)
    em.end(True)
    assert b"".join(out).decode() == example.replace("\n", "\r\n") + "\r\n"


@pytest.mark.parametrize(("key", "value"), [("outputs", "abc"), ("inputs", "-1"), ("model_sha256", "XYZ")])
def test_malformed_identity_info_is_a_problem(key: str, value: str) -> None:
    fields = [f"{k}={value if k == key else v}" for k, v in INFO if k not in ("inputs", "outputs")]
    fields += [f"inputs={value if key == 'inputs' else 0}", f"outputs={value if key == 'outputs' else 1}"]
    cap = parse_capture(_minimal(info=fields))
    assert not cap.valid and any(key in p for p in cap.problems), cap.problems


def _data_capture(b64: str) -> bytes:
    """One 1-byte uint8 output whose only DATA record carries ``b64``."""
    return _minimal(
        b"INPUT i=0 bytes=5 sha256=" + SHA.encode(), b"TIME i=0 invoke_us=7",
        f"TENSOR i=0 o=0 dtype=uint8 shape=1 scale=0x3B800000 zp=0 bytes=1 crc={crc32_hex(b'@')}".encode(),
        f"DATA i=0 o=0 off=0 b64={b64}".encode(),
    )  # fmt: skip


def test_non_canonical_base64_is_rejected() -> None:
    """Strict base64 (docs/protocol.md): pad bits must be zero ("QA==" is the only form of 0x40)."""
    assert parse_capture(_data_capture("QA==")).valid
    for variant in ("QB==", "QP==", "QA=", "QA"):  # non-zero pad bits; missing padding
        cap = parse_capture(_data_capture(variant))
        assert not cap.valid and any("base64" in p for p in cap.problems), variant


def test_corrupted_record_in_a_later_boot_after_end_is_ignored() -> None:
    """Spec: a BEGIN after a complete END is a warning, the later boot is ignored, corrupt lines included."""
    raw = good_capture()
    later = bytearray(raw)
    later[raw.index(b" INFO ") + 8] ^= 0x01  # break the later boot's INFO CRC
    cap = parse_capture(raw + b"ets Jun  8 2016\r\n" + bytes(later))
    assert cap.valid, cap.problems
    assert any("booted again after END" in w for w in cap.warnings)
    assert any("corrupted record" in w for w in cap.warnings)
    # ... but a corrupted line after END with no new BEGIN still breaks rule 3
    bad = bytearray(raw[: raw.index(b"\n") + 1])
    bad[10] ^= 0x01
    assert not parse_capture(raw + bytes(bad)).valid
