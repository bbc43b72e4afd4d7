"""Pinned and supported versions (harness/data/versions.toml): one place, and the docs say the same."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.errors import EspCheckError
from harness.firmware import generate as gen
from harness.firmware.boards import format_chip_rev, list_boards
from harness.resources import idf_support, pinned_versions, version_tuple

DOC = (Path(__file__).resolve().parents[1] / "docs" / "firmware.md").read_text(encoding="utf-8")


def _support_rows() -> dict[str, tuple[str, str, str, str]]:
    """board -> (revision range, ESP-IDF range, PlatformIO cell) from docs/firmware.md's support table."""
    section = DOC[DOC.index("### Supported ESP-IDF and PlatformIO versions") :]
    section = section[: section.index("\n## ")]
    rows: dict[str, tuple[str, str, str, str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`"):
            continue
        for name in re.findall(r"`([a-z0-9_.-]+)`", cells[0]):
            rows[name] = (cells[1], cells[2], cells[3], cells[0])
    return rows


def test_pinned_versions_are_what_generate_uses() -> None:
    pinned = pinned_versions()
    assert set(pinned) == {"platform", "tflm", "espnn", "idf"}
    assert pinned == gen.DEFAULT_VERSIONS
    for value in pinned.values():
        version_tuple(value)  # all MAJOR.MINOR.PATCH


def test_idf_range_is_sane_and_excludes_what_issue_13_found() -> None:
    low, below = idf_support()
    assert version_tuple(low) >= (5, 3, 0)  # 5.1: no CHIP_ESP32P4; 5.2: P4 preview, symbols missing
    assert version_tuple(below) <= (6, 0, 0)  # 6.x: Mbed TLS 4 removed mbedtls/sha256.h
    assert version_tuple(low) <= version_tuple(pinned_versions()["idf"]) < version_tuple(below)
    with pytest.raises(ValueError):
        version_tuple("5.3")


def test_docs_support_table_matches_the_data() -> None:
    rows = _support_rows()
    boards = list_boards()
    assert set(rows) == {b.name for b in boards}, "every board has a row in docs/firmware.md, no other"
    platform = pinned_versions()["platform"]
    for b in boards:
        revs, idf, pio, _ = rows[b.name]
        low, below = b.idf_range
        assert idf.startswith(f">={low}, <{below}"), (b.name, idf)
        if b.is_native:  # a host program: no chip, no revision range
            assert b.chip_revisions is None and revs.startswith("n/a"), (b.name, revs)
        else:
            assert b.chip_revisions is not None
            lo, hi = b.chip_revisions
            assert revs.startswith(f"v{format_chip_rev(lo)} - v{format_chip_rev(hi)}"), (b.name, revs)
        if b.pio_board and b.builder == "pio":
            assert f"espressif32 @ {platform}" in pio, (b.name, pio)
        else:
            assert pio.startswith("none"), (b.name, pio)


def test_broken_range_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.resources as res

    monkeypatch.setattr(res, "_versions_table", lambda: {"idf": {"min": "6.0.0", "below": "5.3.0"}})
    with pytest.raises(EspCheckError, match="not below"):
        res.idf_support()
