"""Bounded, seeded fuzzing of the parsers through the real CLI entry (``harness.cli.main``).

Invariants (no false match, no crash, no lost report): exit 0 only when both sides' output bytes and
identities are equal (checked by an independent decoder, tests/fuzzing.py); never exit 70, never a hang; a
model that crashes the host reference does so in its child process and is exit 2. A signal in this process
would end the test run itself. ``bench/fuzz.py`` runs the same mutants by the thousand.

Nothing is faked: real emitter output, real fixture models, real tflite-micro in the child.
"""

from __future__ import annotations

import collections
from pathlib import Path

import fuzzing
import pytest

SEED = 20260611  # fixed: CI runs the same mutants every time
N_CAPTURES, N_LEGACY, N_MODELS = 500, 200, 60


@pytest.fixture(scope="module")
def bases() -> tuple[tuple[bytes, bytes], bytes, dict[str, bytes]]:
    return fuzzing.load_bases()


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ESP_CHECK_CACHE_DIR", str(tmp_path / "cache"))  # no result from an earlier run
    monkeypatch.setenv("ESP_CHECK_REFERENCE_TIMEOUT", "60")


def _check(outcomes: list[fuzzing.Outcome]) -> collections.Counter[int | None]:
    bad = [o for o in outcomes if o.bad]
    shown = "\n".join(
        f"{o.target} {o.k} {o.mutation}: exit {o.code} false={o.false_match} {o.detail[-200:]!r}"
        for o in bad[:10]
    )
    assert not bad, f"{len(bad)} mutants broke an invariant:\n{shown}"
    return collections.Counter(o.code for o in outcomes)


def test_unmutated_pair_is_a_match(bases, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The oracle's premise: the two base captures match (so exit 0 is reachable at all)."""
    (a, b), _, _ = bases
    (tmp_path / "a.log").write_bytes(a)
    (tmp_path / "b.log").write_bytes(b)
    assert fuzzing.run_cli(["compare", str(tmp_path / "a.log"), str(tmp_path / "b.log")])[0] == 0
    assert fuzzing.same_evidence(fuzzing.naive_capture(a), fuzzing.naive_capture(b))


def test_the_oracle_reads_records_as_the_protocol_defines_them(bases) -> None:  # type: ignore[no-untyped-def]
    """The oracle follows docs/protocol.md, not esp-check's parser: a record line's trailing spaces and tabs
    after the CRC are no part of it. (A bit flip that turned a record's \\r into a tab once made the oracle
    drop an authentic record and call esp-check's correct "match" false: seed 64, capture mutant 1964.)"""
    (a, _b), _, _ = bases
    tabbed = a.replace(b"\r\n", b" \t\r\n")
    assert tabbed != a and fuzzing.same_evidence(fuzzing.naive_capture(tabbed), fuzzing.naive_capture(a))
    # a record's text holds no CR, so its CR ends it even when the LF is lost (seed 71, capture mutant 688)
    no_lf = a.replace(b"\r\n@EC1 ", b"\r@EC1 ")
    assert no_lf != a and fuzzing.same_evidence(fuzzing.naive_capture(no_lf), fuzzing.naive_capture(a))
    cut = a.replace(b"\r\n", b"x\r\n")  # anything else after the CRC is a broken record
    assert not fuzzing.same_evidence(fuzzing.naive_capture(cut), fuzzing.naive_capture(a))


def test_fuzz_captures(bases, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    codes = _check([fuzzing.capture_mutant(SEED, k, bases[0], tmp_path) for k in range(N_CAPTURES)])
    # the mutants reach every verdict: matches (harmless changes), mismatches (valid changed data
    # with CRCs recomputed), refusals and corrupted captures
    assert codes[0] and codes[1] and codes[2] and codes[3], codes


def test_fuzz_legacy_logs(bases, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    codes = _check([fuzzing.legacy_mutant(SEED, k, bases[1], tmp_path) for k in range(N_LEGACY)])
    assert codes[0] and codes[1] and codes[3], codes


@pytest.mark.slow  # ~10 s on 2 busy cores: 60 mutants through `inspect`, accepted ones through `reference`
def test_fuzz_models(bases, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    outcomes = [fuzzing.model_mutant(SEED, k, bases[2], tmp_path) for k in range(N_MODELS)]
    codes = _check(outcomes)
    assert codes[0] and codes[2], codes  # some mutants still run, most are refused
