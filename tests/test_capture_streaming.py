"""Large captures in bounded work: ``parse_capture`` reads a capture one line at a
time and keeps only its results, and the classifier reads only the lines that can hold evidence.

Nothing is faked: the captures come from the project's own emitter (harness/protocol/emitter.py), the
panic text is what ESP-IDF prints. No timing is asserted (bench/bench_compare.py prints the seconds);
memory is measured with tracemalloc.
"""

from __future__ import annotations

import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest

from harness.analysis.classify import classify
from harness.analysis.compare import compare_files
from harness.errors import ExitCode
from harness.protocol.capture import DATA_CHUNK, evidence_text, parse_capture
from harness.protocol.emitter import PythonEmitter, RunSpec, TensorSpec, emit_capture

INFO = [
    ("nn", "optimized"), ("target", "esp32s3"), ("chip", "esp32s3"), ("rev", "0.2"), ("cores", 2),
    ("cpu_mhz", 240), ("idf", "v5.5.3"), ("tflm", "1.3.8"), ("espnn", "1.1.2"),
    ("model_sha256", "ab" * 32), ("model_bytes", 1), ("inputs", 1), ("outputs", 1),
]  # fmt: skip
PANIC = (
    b"Guru Meditation Error: Core  1 panic'ed (LoadProhibited). Exception was unhandled.\r\n"
    b"Backtrace: 0x400d1234:0x3ffb1230 0x400d5678:0x3ffb1250\r\n"
)


def _capture(payload: bytes, nn: str = "optimized") -> bytes:
    out = bytearray()
    info = [(k, nn if k == "nn" else v) for k, v in INFO]
    spec = RunSpec(b"\0" * 16, 1, (TensorSpec("int8", (len(payload),), 0.00390625, -128, payload),))
    emit_capture(PythonEmitter(out.extend), info=info, runs=[spec])
    return bytes(out)


@pytest.fixture(scope="module")
def payload() -> bytes:
    return np.random.default_rng(0).integers(-128, 128, 1_000_000).astype(np.int8).tobytes()


def test_parsing_a_large_capture_keeps_memory_near_its_size(payload: bytes) -> None:
    """A ~1.9 MB capture (one 1 MB tensor, 10,417 DATA records): the parser used to hold every line
    and every record (peak 5.4x the capture); now its peak is the capture's tensor plus a little."""
    raw = _capture(payload)
    tracemalloc.start()
    try:
        cap = parse_capture(raw)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert cap.valid, cap.problems
    assert cap.runs[0].outputs[0].data.tobytes() == payload
    assert peak < 1.5 * len(raw), f"parse_capture peaked at {peak / len(raw):.1f}x the capture's size"
    assert cap.payload_records == -(-len(payload) // DATA_CHUNK)
    assert all(r.type != "DATA" for r in cap.records)  # counted, not kept


def test_the_classifier_reads_the_evidence_lines_only_and_misses_no_crash(payload: bytes) -> None:
    """Lines that are nothing but a valid DATA record are left out of what the classifier reads; a
    panic printed between them, and one spliced into a DATA line (its CRC then fails), are still
    found, in compare as in the classifier."""
    raw = _capture(payload[:200_000])
    lines = raw.split(b"\r\n")
    data_lines = [k for k, ln in enumerate(lines) if b" DATA " in ln]
    mid = data_lines[len(data_lines) // 2]
    between = b"\r\n".join(lines[:mid]) + b"\r\n" + PANIC + b"\r\n".join(lines[mid:])
    cap = parse_capture(between)
    assert cap.valid, cap.problems  # text between records is not a record: the records still validate
    text = evidence_text(between, cap)
    assert len(text) < len(between) // 20
    assert text.count(b"\n") == between.count(b"\n")  # line numbers stay
    assert [f.kind for f in classify(between, parsed=cap)][:1] == ["panic"]

    spliced_line = lines[mid][:40] + PANIC.split(b"\r\n")[0] + lines[mid][40:]
    spliced = b"\r\n".join([*lines[:mid], spliced_line, *lines[mid + 1 :]])
    cap2 = parse_capture(spliced)
    assert not cap2.valid and any("corrupted record" in p for p in cap2.problems)
    assert b"Guru Meditation Error" in evidence_text(spliced, cap2)
    assert "panic" in [f.kind for f in classify(spliced, parsed=cap2)]


def test_payload_spans_that_do_not_fit_the_text_are_not_used(payload: bytes) -> None:
    """evidence_text drops lines only where the capture's spans fit the text given (same size, a record
    starting each span): for any other text the classifier reads everything."""
    raw = _capture(payload[:10_000])
    cap = parse_capture(raw)
    assert cap.payload_spans
    other = b"x" + raw[:-1]
    assert evidence_text(other, cap) is other
    assert evidence_text(raw + b"\n", cap) == raw + b"\n"


def test_fast_and_general_paths_agree_on_a_data_record(payload: bytes) -> None:
    """A DATA record in the firmware's field order is read without building a Record; the same record
    with its fields in another order (legal, CRC-checked) takes the general path: same tensor."""
    raw = _capture(payload[:150])
    lines = raw.split(b"\r\n")
    k = next(k for k, ln in enumerate(lines) if b" DATA " in ln)
    body = lines[k].rsplit(b" *", 1)[0]
    head, fields = body.split(b" DATA ")
    reordered = head + b" DATA " + b" ".join(reversed(fields.split(b" ")))
    lines[k] = reordered + f" *{zlib.crc32(reordered + b' '):08X}".encode()  # the CRC covers the blank
    general = parse_capture(b"\r\n".join(lines))
    fast = parse_capture(raw)
    assert general.valid and fast.valid, (general.problems, fast.problems)
    got = [c.runs[0].outputs[0].data.tobytes() for c in (general, fast)]
    assert got == [payload[:150], payload[:150]]
    assert general.payload_records == fast.payload_records == 2


def test_compare_of_a_large_capture_pair_is_a_match_and_sees_a_crash(payload: bytes, tmp_path: Path) -> None:
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_bytes(_capture(payload))
    b.write_bytes(_capture(payload, nn="ansi_c"))
    assert compare_files(a, b).exit_code == ExitCode.MATCH
    raw = _capture(payload, nn="ansi_c")
    cut = raw.index(b"\r\n", len(raw) // 2) + 2
    b.write_bytes(raw[:cut] + PANIC)
    assert compare_files(a, b).exit_code == ExitCode.FIRMWARE_FAULT
