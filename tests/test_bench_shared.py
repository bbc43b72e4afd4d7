"""The bench scripts share their helpers (bench/simrun.py) instead of keeping twins that drift apart
(bench_resident.py and bench_time_model.py once each had a ``_run``, differing by two lines).

Reads bench/*.py with :mod:`ast` (nothing runs).
"""

from __future__ import annotations

import ast
import difflib
import itertools
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
SAME = 0.8  # share of equal source above which two helpers are one helper written twice


def _functions(sources: dict[str, str]) -> list[tuple[str, str]]:
    """(file:name, its body's source without the docstring) of every function of 3+ statements."""
    out = []
    for name, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.FunctionDef):
                continue
            stmts = node.body[1:] if ast.get_docstring(node) is not None else node.body
            if len(stmts) >= 3:
                body = ast.unparse(ast.Module(body=stmts, type_ignores=[]))
                out.append((f"{name}:{node.name}", body))
    return out


def twins(sources: dict[str, str]) -> list[tuple[str, str, float]]:
    """Pairs of functions in different files whose bodies are at least SAME alike."""
    found = []
    for (a, body_a), (b, body_b) in itertools.combinations(_functions(sources), 2):
        if a.split(":")[0] == b.split(":")[0]:
            continue
        m = difflib.SequenceMatcher(None, body_a, body_b, autojunk=False)
        if m.real_quick_ratio() < SAME or m.quick_ratio() < SAME:
            continue
        ratio = m.ratio()
        if ratio >= SAME:
            found.append((a, b, round(ratio, 2)))
    return found


def test_no_bench_helper_is_written_twice() -> None:
    sources = {p.name: p.read_text(encoding="utf-8") for p in sorted(BENCH.glob("*.py"))}
    assert twins(sources) == []


def test_the_twin_rule_can_fail() -> None:
    run = (
        "def _run(tmp, tag):\n    t0 = clock()\n"
        "    res = flash_and_compare(tmp / tag, board='sim', baud=921600)\n"
        "    if res.exit_code:\n        print(res.errors)\n    return (clock() - t0, res)\n"
    )
    other = run.replace("    t0 = clock()\n", "").replace("(clock() - t0, res)", "res")
    pairs = twins({"a.py": run, "b.py": other})
    assert [(a, b) for a, b, _ in pairs] == [("a.py:_run", "b.py:_run")]
