"""Pinned-output warnings: one side pinned is a symptom; every side saturated is only a caveat."""

from __future__ import annotations

import numpy as np

from harness.analysis.compare import OutputTensor, Source, compare_sources


def _src(label: str, values: list[int], nn: str | None) -> Source:
    t = OutputTensor(
        0,
        np.array(values, dtype=np.int8),
        raw=True,
        shape=(len(values),),
        dtype="int8",
        scale=1 / 256,
        zero_point=-128,
    )
    return Source(label, "results", [[t]], nn_mode=nn)


def test_one_side_pinned_warns_once_naming_it() -> None:
    broken = _src("optimized", [-128] * 11, "optimized")
    good = _src("ansi", [-100, -20, 3, 60, -128, 5, -50, -128, 7, 9, 127], "ansi_c")
    result = compare_sources(broken, good)
    pinned = [w for w in result.warnings if "pinned" in w]
    assert len(pinned) == 1 and pinned[0].startswith("optimized run 0 output 0") and "ansi" in pinned[0]
    assert result.exit_code == 1


def test_saturated_on_both_sides_is_a_caveat_not_a_symptom() -> None:
    a = _src("optimized", [-128] * 10 + [127], "optimized")
    b = _src("ansi", [-128] * 10 + [127], "ansi_c")
    result = compare_sources(a, b)
    assert result.exit_code == 0
    assert not any("symptom" in w for w in result.warnings)
    assert any("saturated" in w for w in result.warnings)
