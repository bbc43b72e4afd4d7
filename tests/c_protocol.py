"""The firmware's portable C through ctypes, for tests that cross-check it against the Python twins.

``c_encode_frame``, ``c_prng`` and ``CFrameDecoder`` bind esp_check_frame.c in the host library
harness.protocol.native loads (its ctypes mirrors of the C structs are shared from there);
``emitter_sources`` finds the emitter's C files. Only tests use these, so they live here and not in
harness/ (docs/protocol.md "Binary frames and the resident loop").
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

from harness.protocol import frames
from harness.protocol.native import _FRAME_CB, _Decoder
from harness.resources import templates_dir


def emitter_sources() -> tuple[Path, Path]:
    """The firmware's emitter sources (.c, .h), from the installed wheel's data or the checkout."""
    common = templates_dir() / "common"
    return common / "esp_check_proto.c", common / "esp_check_proto.h"


def c_encode_frame(lib: ctypes.CDLL, ftype: int, seq: int, payload: bytes) -> bytes:
    """An unkeyed frame without flags, as esp_check_frame.c encodes it."""
    out = (ctypes.c_uint8 * frames.MAX_FRAME)()
    n = lib.ecf_encode_keyed(out, len(out), ftype, 0, seq, payload, len(payload), 0)
    return bytes(out[:n])


def c_prng(lib: ctypes.CDLL, seed: int, index: int, dtype: str, nbytes: int) -> bytes:
    out = (ctypes.c_uint8 * max(nbytes, 1))()
    lib.ecf_prng_fill(seed, index, frames.DTYPE_CODES.get(dtype, 0), out, nbytes)
    return bytes(out[:nbytes])


class CFrameDecoder:
    """esp_check_frame.c's streaming decoder (frames and counters; text is dropped, as on the device)."""

    def __init__(self, lib: ctypes.CDLL, max_payload: int = frames.MAX_PAYLOAD, key: int = 0) -> None:
        self.lib = lib
        self.state = _Decoder()
        lib.ecf_decoder_init(ctypes.byref(self.state), max_payload)
        lib.ecf_decoder_set_key(ctypes.byref(self.state), key)
        self._got: list[frames.Frame] = []

        def _cb(_ctx: int | None, f: Any) -> None:
            c = f.contents
            self._got.append(frames.Frame(c.type, c.seq, ctypes.string_at(c.payload, c.len), c.flags))

        self._cb = _FRAME_CB(_cb)

    def feed(self, data: bytes) -> list[frames.Frame]:
        self._got = []
        self.lib.ecf_decoder_feed(ctypes.byref(self.state), data, len(data), self._cb, None)
        return self._got

    @property
    def stats(self) -> frames.DecoderStats:
        s = self.state
        return frames.DecoderStats(s.frames, s.bad_headers, s.bad_crc, s.skipped)
