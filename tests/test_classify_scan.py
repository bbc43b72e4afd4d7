"""The classifier reads only the lines that can start evidence, found in one pass.

`classify` finds the candidate lines of a capture with one scan per anchor over the squeezed text
(harness.analysis.classify._hot_lines) instead of running every detector on every line. These tests
check that this changes no finding: on every transcript of the corpus and on the simulator's fault
texts, the findings equal those of a scan of every line; and that evidence buried deep in a large log
is still found. The time it saves is measured in bench/bench_compare.py (never asserted here).
Nothing is faked.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.analysis import classify as cl
from harness.protocol.legacy import parse_legacy_log

CORPUS = Path(__file__).resolve().parent / "data" / "transcripts"
TRANSCRIPTS = sorted(CORPUS.glob("*/*.txt"))


def _every_line(text: str) -> list[int]:
    return list(range(text.count("\n") + 1))


def _findings(raw: bytes, ended_by: str | None = None) -> list[dict[str, object]]:
    return [f.to_dict() for f in cl.classify(raw, ended_by=ended_by)]


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=lambda p: p.name)
def test_the_hot_lines_change_no_finding(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = path.read_bytes()
    fast = [_findings(raw, e) for e in (None, "silence", "boot_loop")]
    monkeypatch.setattr(cl, "_hot_lines", _every_line)
    slow = [_findings(raw, e) for e in (None, "silence", "boot_loop")]
    assert fast == slow


def test_every_anchor_is_found_by_the_scan() -> None:
    """Each literal anchor, alone on a line among noise, makes its line hot (also without its first
    character, as _hit allows)."""
    for anchor in cl._HOT_ANCHORS:
        text = f"I (1) app: noise\nxx {anchor[1:].upper()} yy\nI (2) app: noise"
        assert cl._hot_lines(text) == [1], anchor


def test_a_crash_deep_in_a_large_log_is_found() -> None:
    noise = "I (1234) esp-check: invoke 17 took 5123 us, free heap 123456\r\nOutput: 0.5 0.25 -1\r\n"
    crash = (
        "Guru Meditation Error: Core  0 panic'ed (LoadProhibited). Exception was unhandled.\r\n"
        "Core  0 register dump:\r\nPC      : 0x400d1234  PS      : 0x00060330  A0      : 0x800d5678\r\n"
        "Backtrace: 0x400d1234:0x3ffb1f00 0x400d5678:0x3ffb1f20\r\n\r\nRebooting...\r\n"
    )
    raw = (noise * 100_000 + crash + noise * 100_000).encode()
    kinds = [f.kind for f in cl.classify(raw)]
    assert kinds == ["panic"]
    panic = cl.classify(raw)[0]
    assert panic.line == 200_001 and panic.details["pc"] == "0x400d1234"
    assert panic.details["backtrace"][0] == ("0x400d1234", "0x3ffb1f00")


def test_legacy_output_lines_keep_their_numbers_and_exact_values() -> None:
    text = "boot\r\nOutput: 1.5 -2e3\rjunk\nOutput: 1.0937498*2^-3, nan\r\n\nOutput: +.5\nOutput: x1"
    with pytest.raises(Exception, match="line 7"):
        parse_legacy_log(text)
    values = parse_legacy_log(text.rsplit("\n", 1)[0])
    assert values[:2] == [1.5, -2000.0] and values[2] == 0.13671875 and values[4] == 0.5
    assert values[3] != values[3]  # nan


@pytest.mark.parametrize("chunk", [5, 7, 16, 1 << 22])
def test_the_gram_scan_finds_every_anchor_across_chunk_boundaries(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 4-gram pass runs in chunks: an anchor that straddles two chunks is found like any other."""
    monkeypatch.setattr(cl, "_CHUNK", chunk)
    body = b"xx".join(cl._HOT_LITERALS) + b"\nabc"
    want = {i for lit in cl._HOT_LITERALS for i in range(len(body)) if body.startswith(lit, i)}
    assert want <= set(cl._hot_offsets(body))
