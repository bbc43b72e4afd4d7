"""What old TFLM sketches print, for tests of the legacy-log parser (harness.protocol.legacy).

``encode_microprintf_float`` writes a float the way old TFLM ``MicroPrintf("%f")`` does (grammar:
docs/protocol.md "Human-readable lines"); the parser only reads such tokens back, so the encoder lives
here and not in harness/. It shares the parser's fraction scaling.
"""

from __future__ import annotations

import struct

from harness.protocol.legacy import _FRACTION_MAX, _scaled


def encode_microprintf_float(x: float) -> str:
    """Format like old TFLM ``MicroPrintf("%f")``: the float32 value of ``x`` as ``1.D*2^E``."""
    try:
        bits = int(struct.unpack("<I", struct.pack("<f", x))[0])
    except OverflowError:
        bits = 0xFF800000 if x < 0 else 0x7F800000
    sign = "-" if bits >> 31 else ""
    exp = (bits >> 23) & 0xFF
    frac = bits & _FRACTION_MAX
    if exp == 0xFF:
        return sign + ("Inf" if frac == 0 else "NaN")
    digits = f"{_scaled(frac):07d}".rstrip("0") or "0"
    return f"{sign}1.{digits}*2^{exp - 127}"
