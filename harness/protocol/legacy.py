"""Legacy logs: ``Output: <value>`` lines from hand-written sketches and old TFLM builds.

What it reads, and the old TFLM ``MicroPrintf`` float grammar it maps back to exact float32 bits:
docs/protocol.md "Human-readable lines".
"""

from __future__ import annotations

import bisect
import re
import struct
from collections.abc import Iterator

from harness.errors import LogFormatError

_SHIFTS = (3, 4, 8, 11, 13, 14, 17, 18, 19, 20, 21, 22, 23)
_FRACTION_MAX = (1 << 23) - 1

_MICRO_RE = re.compile(r"(-?)(?:(Inf)|(NaN)|1\.([0-9]{1,7})\*2\^(-?[0-9]{1,3}))")
_DECIMAL_RE = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]{1,4})?")
_SPECIAL_RE = re.compile(r"[-+]?(?:inf|infinity|nan)", re.IGNORECASE)
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_SEP_RE = re.compile(r"[\s,;]+")
_LINE_RE = re.compile(r"\r\n|\r|\n")
# one Output: line of plain decimals (no MicroPrintf token, inf, nan or comma): float() reads each
# exactly. The number is written without ambiguity (digits, then an optional fraction) so that a hostile
# line cannot make the regex backtrack quadratically.
_NUM = r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]{1,4})?"
_PLAIN_RE = re.compile(rf"[ \t]*(?:{_NUM}[ \t]+)*{_NUM}[ \t]*")
OUTPUT_TAG = "Output:"


def _scaled(f: int) -> int:
    return f + sum(f >> s for s in _SHIFTS)


def decode_microprintf_bits(token: str) -> int:
    """float32 bits of a MicroPrintf token; ValueError if the token is not one it can print."""
    m = _MICRO_RE.fullmatch(token)
    if m is None:
        raise ValueError(f"{token!r} is not a MicroPrintf float")
    sign = 0x80000000 if m.group(1) else 0
    if m.group(2):
        return sign | 0x7F800000
    if m.group(3):
        return sign | 0x7FC00000
    digits, e = m.group(4), int(m.group(5))
    if not -127 <= e <= 127:
        raise ValueError(f"{token!r}: exponent {e} outside -127..127")
    target = int(digits.ljust(7, "0"))
    # _scaled is strictly increasing: binary search for the exact fraction (the last one when none fits)
    lo = bisect.bisect_left(range(_FRACTION_MAX), target, key=_scaled)
    if _scaled(lo) != target:
        raise ValueError(f"{token!r}: digits {digits} are not ones MicroPrintf prints for any float32")
    return sign | ((e + 127) << 23) | lo


def decode_microprintf_float(token: str) -> float:
    """Exact float32 value (as a Python float) of a MicroPrintf token such as ``1.0937498*2^-3``."""
    bits = decode_microprintf_bits(token)
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


def parse_value(token: str) -> float:
    """One printed number: MicroPrintf token, decimal, %e, inf or nan. ValueError otherwise."""
    if "*2^" in token or token.lstrip("-") in ("Inf", "NaN"):
        return decode_microprintf_float(token)
    if _DECIMAL_RE.fullmatch(token) or _SPECIAL_RE.fullmatch(token):
        return float(token)
    raise ValueError(f"{token!r} is not a number")


def parse_legacy_log(text: str | bytes) -> list[float]:
    """All values printed on ``Output:`` lines, in order (empty list if there are none).

    Raises LogFormatError when an ``Output:`` line carries something that is not a number: a
    garbled value must not silently disappear from a comparison.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    values: list[float] = []
    for line_no, line in _output_lines(text):
        pos = line.find(OUTPUT_TAG)
        rest = line[pos + len(OUTPUT_TAG) :]
        if "\x1b" in rest:
            rest = _ANSI_RE.sub("", rest)
        if _PLAIN_RE.fullmatch(rest):  # the common case: plain decimals, read in one go
            values.extend(map(float, rest.split()))
            continue
        tokens = [t for t in _SEP_RE.split(rest) if t]
        if not tokens:
            raise LogFormatError(
                f"line {line_no}: 'Output:' line without a value: {line[:80]!r}",
                hint="the log may be truncated or garbled; capture it again",
            )
        for tok in tokens:
            try:
                values.append(parse_value(tok))
            except ValueError as exc:
                raise LogFormatError(
                    f"line {line_no}: cannot read {tok[:40]!r} on an Output: line ({exc})",
                    hint="values may be decimal, %e, inf/nan, or the TFLM MicroPrintf form 1.D*2^E",
                ) from None
    return values


def _output_lines(text: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, line) of the lines holding ``Output:``, found by a forward scan: the lines
    between them are counted, never split out (a 25 MB log is read in well under a second)."""
    line_no, line_start = 1, 0
    pos = text.find(OUTPUT_TAG)
    while pos >= 0:
        line_no += _count_breaks(text, line_start, pos)
        line_start = max(text.rfind("\n", 0, pos), text.rfind("\r", 0, pos)) + 1
        end = _LINE_RE.search(text, pos)
        stop = end.start() if end else len(text)
        yield line_no, text[line_start:stop]
        pos = text.find(OUTPUT_TAG, stop)


def _count_breaks(text: str, start: int, stop: int) -> int:
    """Line breaks (``\r\n``, ``\r`` or ``\n``, as _LINE_RE splits) in ``text[start:stop]``."""
    return text.count("\n", start, stop) + text.count("\r", start, stop) - text.count("\r\n", start, stop)
