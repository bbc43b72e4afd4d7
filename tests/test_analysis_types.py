"""harness/analysis/ stays typed: report payloads are TypedDicts or dataclasses, values from a
device or a file are ``object`` narrowed with isinstance. ``Any`` is left only where another package's
dicts come in, listed here per module; the list only ever shrinks."""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest

from harness.analysis import sweep_cases as sc

ANALYSIS = Path(__file__).resolve().parents[1] / "harness" / "analysis"
ANY_LEFT = {
    "html_report.py": 3,  # report.json read back (render_html, write_bundle, _devices)
    "sweep_report.py": 4,  # the finding groups and sources of harness.flows.sweep
    "sweep_repro.py": 2,  # the reproduction summary harness.flows.sweep extends
    "tap.py": 1,  # the reproducers of harness.flows.repro
}


def _any_uses(path: Path) -> int:
    """``Any`` in the code (annotations and expressions), not in imports, comments or docstrings."""
    return sum(
        isinstance(n, ast.Name) and n.id == "Any" for n in ast.walk(ast.parse(path.read_text("utf-8")))
    )


@pytest.mark.parametrize("path", sorted(ANALYSIS.glob("*.py")), ids=lambda p: p.name)
def test_analysis_uses_any_only_where_listed(path: Path) -> None:
    assert _any_uses(path) <= ANY_LEFT.get(path.name, 0), (
        f"{path.name}: type it (TypedDict, object + isinstance)"
    )


def test_sweep_overrides_do_not_shift_the_draws_after_them() -> None:
    """A --from-model size replaces a drawn one but is still drawn: with sizes that change no later draw,
    the case seed (drawn last) is the one the same random stream gives without the override."""
    made = {
        "conv": lambda rng, o: sc.conv_case(rng, over={"ih": 41, "iw": 41} if o else None),
        "depthwise": lambda rng, o: sc.depthwise_case(rng, over={"ih": 41} if o else None),
        "fully_connected": lambda rng, o: sc.fc_case(rng, row=9 if o else None),
        "add": lambda rng, o: sc.add_mul_case(rng, "add", size=11 if o else None),
        "max_pool": lambda rng, o: sc.pool_case(
            rng, "max_pool", shape=sc.PoolShape(2, 2, False, 41, 41, 3) if o else None
        ),
        "softmax": lambda rng, o: sc.softmax_case(rng, depth=7 if o else None, rows=2 if o else None),
    }
    for name, make in made.items():
        for seed in range(20):
            drawn, given = make(random.Random(seed), False), make(random.Random(seed), True)
            assert given.op == name and given.seed == drawn.seed and given.params != drawn.params, name
    own = sc.softmax_case(random.Random(0), depth=7, rows=2)
    assert (own.meta["depth"], own.meta["rows"]) == (7, 2)


def test_the_reference_childs_pipe_is_typed() -> None:
    """model/hostrun.py's message pipe (_put, _get) takes byte streams (IO[bytes]), not ``Any``."""
    assert _any_uses(ANALYSIS.parent / "model" / "hostrun.py") == 0
