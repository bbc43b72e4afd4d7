"""No ``$``-anchored pattern is used with ``.match`` in harness/.

Python's ``$`` also matches before a final newline: ``re.match(r"^[0-9]+$", "12\\n")`` succeeds, so a
"the whole string is ..." check let a value with a trailing newline through (into generated C, a
project file, a flash size). A whole-string check is ``fullmatch`` with no anchors. Checked on the
syntax tree: a name bound to ``re.compile("...$")`` anywhere in harness/ may not be called with
``.match``, and ``re.match`` may not be given a pattern ending in ``$``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[1] / "harness"


def _ends_in_dollar(node: ast.expr) -> bool:
    """A string or bytes constant ending in an unescaped ``$``."""
    if not isinstance(node, ast.Constant) or not isinstance(node.value, (str, bytes)):
        return False
    text = node.value if isinstance(node.value, str) else node.value.decode("latin-1")
    return re.search(r"(?<!\\)(\\\\)*\$\Z", text) is not None


def _attr_call(call: ast.Call, owners: set[str] | None, attr: str) -> bool:
    """``call`` is ``NAME.attr(...)`` with NAME in ``owners`` (``None``: ``re``)."""
    f = call.func
    if not (isinstance(f, ast.Attribute) and f.attr == attr and isinstance(f.value, ast.Name)):
        return False
    return f.value.id == "re" if owners is None else f.value.id in owners


def offenders(sources: dict[str, str]) -> list[str]:
    """``file:line`` of every ``P.match(`` with ``P = re.compile("...$")`` and every ``re.match("...$"``."""
    nodes = [(name, n) for name, text in sources.items() for n in ast.walk(ast.parse(text))]
    anchored = {
        t.id
        for _, n in nodes
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and n.value.args
        if _attr_call(n.value, None, "compile") and _ends_in_dollar(n.value.args[0])
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    return [
        f"{name}:{n.lineno}"
        for name, n in nodes
        if isinstance(n, ast.Call)
        and (
            (_attr_call(n, None, "match") and bool(n.args) and _ends_in_dollar(n.args[0]))
            or _attr_call(n, anchored, "match")
        )
    ]


def test_no_dollar_anchored_pattern_is_used_with_match() -> None:
    bad = offenders({str(p.relative_to(HARNESS.parent)): p.read_text("utf-8") for p in HARNESS.rglob("*.py")})
    assert not bad, f"use fullmatch without ^...$ (Python's $ matches before a final newline): {bad}"


def test_the_check_finds_both_forms() -> None:
    snippet = (
        'P = re.compile(r"^[0-9]+$")\nP.match(s)\nP.fullmatch(s)\nP.search(s)\n'
        're.match(r"^a$", s)\nre.match(r"a\\$", s)\nQ = re.compile(r"a")\nQ.match(s)\n'
    )
    assert offenders({"x.py": snippet}) == ["x.py:2", "x.py:5"]
