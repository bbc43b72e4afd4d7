"""A man in the middle between esp-check and a served simulated board: no tampering with the resident
loop's frames ever gives a false match or an exit code of the wrong class.

What is faked: the board (``sim serve --rfc2217`` in this process, a simulated ESP32-S3, clean or with
its optimized kernels corrupt). Real: pyserial's RFC 2217 client, esptool flashing through the proxy,
the resident loop's frames, the host reference, the judge. The proxy (tests/tamper.py) rewrites data
bytes only after the first HELLO, one seeded event per run (see its docstring for the kinds). Longer
runs: ``python bench/fuzz.py --frames 1000``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tamper import KINDS, Servers, allowed_exits, run_trial

pytestmark = pytest.mark.slow

MODEL = str(Path(__file__).parent / "data" / "models" / "cnn_classifier_11.tflite")


@pytest.fixture(scope="module")
def servers():  # type: ignore[no-untyped-def]
    s = Servers()
    yield s
    s.close()


CASES = [(k, "clean") for k in KINDS] + [(k, "corrupt") for k in KINDS if k != "forge_nn"]


@pytest.mark.parametrize(("kind", "board"), CASES)
def test_tampered_stream_is_never_a_false_match(tmp_path: Path, servers, kind: str, board: str) -> None:  # type: ignore[no-untyped-def]
    t = run_trial(servers, kind, board, seed=7, model=MODEL, out=str(tmp_path / "o"))
    assert not t.false_match, t
    assert t.code in allowed_exits(kind, board), t
    if kind == "replay" and t.applied:  # another boot's frame, valid under its own key: dropped, counted
        assert t.stale_frames >= 1, t
    if kind == "replay_hello" and t.applied:  # and that boot's HELLO before it: stale too, never adopted
        assert t.stale_frames >= 2, t
