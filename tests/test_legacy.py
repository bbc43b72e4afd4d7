"""Legacy ``Output:`` logs and the old TFLM MicroPrintf float format (grammar: docs/protocol.md)."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from legacy_log import encode_microprintf_float

from harness.errors import LogFormatError
from harness.protocol.legacy import (
    decode_microprintf_bits,
    decode_microprintf_float,
    parse_legacy_log,
)

LOGS = Path(__file__).parent / "data" / "logs"


def bits(x: float) -> int:
    return int(struct.unpack("<I", struct.pack("<f", x))[0])


def test_issue_examples() -> None:
    assert decode_microprintf_float("1.0937498*2^-3") == 0.13671875
    assert decode_microprintf_float("1.5707957*2^1") == float(np.float32(np.pi))
    assert decode_microprintf_float("1.0*2^-7") == 0.0078125
    assert encode_microprintf_float(float(np.float32(np.pi))) == "1.5707957*2^1"
    assert encode_microprintf_float(0.13671875) == "1.0937498*2^-3"
    assert encode_microprintf_float(0.99609375) == "1.9921868*2^-1"


def test_zero_denormals_and_specials() -> None:
    assert encode_microprintf_float(0.0) == "1.0*2^-127"
    assert encode_microprintf_float(-0.0) == "-1.0*2^-127"
    assert bits(decode_microprintf_float("1.0*2^-127")) == 0
    assert bits(decode_microprintf_float("-1.0*2^-127")) == 0x80000000
    tiny = struct.unpack("<f", struct.pack("<I", 1))[0]  # smallest denormal
    tok = encode_microprintf_float(tiny)
    assert tok.endswith("*2^-127") and tok != "1.0*2^-127"
    assert decode_microprintf_bits(tok) == 1
    assert encode_microprintf_float(math.inf) == "Inf" and encode_microprintf_float(-math.inf) == "-Inf"
    assert encode_microprintf_float(math.nan) == "NaN"
    assert decode_microprintf_float("-Inf") == -math.inf and math.isnan(decode_microprintf_float("NaN"))
    assert encode_microprintf_float(1e39) == "Inf"  # beyond float32


@pytest.mark.parametrize("token", ["1.0*2^128", "1.0*2^-128", "1.12345678*2^0", "2.0*2^1", "1.*2^1", "1.0*2^",
                                   "1.9999999*2^0"])  # fmt: skip
def test_invalid_tokens_rejected(token: str) -> None:
    with pytest.raises(ValueError):
        decode_microprintf_bits(token)


@settings(max_examples=3000, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_round_trip_every_float32_bit_pattern(b: int) -> None:
    x = struct.unpack("<f", struct.pack("<I", b))[0]
    tok = encode_microprintf_float(x)
    if math.isnan(x):
        assert tok.lstrip("-") == "NaN"
        return
    assert decode_microprintf_bits(tok) == b


@settings(max_examples=500, deadline=None)
@given(st.floats(width=32, allow_nan=False))
def test_round_trip_float32_values(x: float) -> None:
    assert bits(decode_microprintf_float(encode_microprintf_float(x))) == bits(x)


def test_extremes_round_trip() -> None:
    for b in (0x00000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x3F800000, 0x3FFFFFFF):
        x = struct.unpack("<f", struct.pack("<I", b))[0]
        assert decode_microprintf_bits(encode_microprintf_float(x)) == b


def test_log_formats() -> None:
    text = (
        "ets Jun  8 2016 00:22:57\r\n"
        "\x1b[0;32mI (123) app: Output: 0.5\x1b[0m\r\n"
        "Output: 1.0*2^-7 -1.5e-3, inf;-INF\n"
        "noise line Output without colon\r"
        "W (200) tflm: Output: nan\r\r\n"
        "Output: \x1b[1m1.0937498*2^-3\x1b[0m -1.0*2^-127\n"
        "Output: +2 .25 7.\n"
    )
    vals = parse_legacy_log(text.encode())
    assert vals[:3] == [0.5, 0.0078125, -1.5e-3]
    assert vals[3] == math.inf and vals[4] == -math.inf and math.isnan(vals[5])
    assert vals[6] == 0.13671875 and bits(vals[7]) == 0x80000000
    assert vals[8:] == [2.0, 0.25, 7.0]
    assert parse_legacy_log("no outputs here\n") == []
    assert parse_legacy_log(b"\xff\xfeOutput: 1.25\n") == [1.25]


@pytest.mark.parametrize("line", ["Output: 0.5 garbage", "Output:", "Output: 1_000", "Output: 0x10"])
def test_garbled_output_lines_fail_cleanly(line: str) -> None:
    with pytest.raises(LogFormatError, match="line 2"):
        parse_legacy_log("ok\n" + line + "\n")


def test_acceptance_fixture_values_are_exact() -> None:
    ansi = parse_legacy_log((LOGS / "report_ansi_c.log").read_bytes())
    opt = parse_legacy_log((LOGS / "report_optimized.log").read_bytes())
    assert [v * 256 for v in ansi] == [2, 0, 35, 61, 0, 74, 24, 3, 20, 35, 1]
    assert [v * 256 for v in opt] == [0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 255]
