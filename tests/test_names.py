"""Names and comments a reader outside the project can follow.

- No line refers to an issue by its number unless it links to it: the tracker is not public, so such
  a reference says nothing to a reader; the comment must state the rule or the fact itself.
- Every import inside a function in harness/ says why it is not at the top of its module, in a
  comment on the import's line(s) or on the line right above it.
- A private class name (``_Name``) is used by one class in harness/: two unrelated classes under one
  name make a reader (and a grep) mix them up.

Real: the repository's own files, read as text and parsed with ``ast``. Nothing is faked.
"""

from __future__ import annotations

import ast
import collections
import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
HARNESS = ROOT / "harness"

# "issue N", "Issue #N", "issues N", "#N item M", "#N defect M" (N, M numbers); a line with a URL links
_ISSUE_NUMBER = re.compile(r"(?i)\bissues?\s?#?\d+|(?<![\w&])#\d+\s+(?:items?|defects?)\b")
_LINK = re.compile(r"https?://")
_SCANNED = ("harness", "tests", "bench", "docs", "firmware_templates")
_BINARY = {
    ".tflite",
    ".png",
    ".bin",
    ".npy",
    ".npz",
    ".gz",
    ".zip",
    ".elf",
    ".so",
    ".o",
    ".a",
    ".pyc",
    ".wav",
}


def _text_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for top in _SCANNED:
        files += [p for p in sorted((ROOT / top).rglob("*")) if p.is_file() and p.suffix not in _BINARY]
    return [p for p in files if "__pycache__" not in p.parts]


def issue_references(text: str) -> list[tuple[int, str]]:
    """(line number, line) of each line naming an issue by number without a link on that line."""
    return [
        (n, line.strip())
        for n, line in enumerate(text.splitlines(), 1)
        if _ISSUE_NUMBER.search(line) and not _LINK.search(line)
    ]


def test_issue_reference_rule_sees_the_forms_in_use() -> None:
    """The pattern catches the spellings that were used, and lets a linked reference through."""
    n = 28  # kept out of the literals, so that this file's own lines stay clean
    numbered = [
        f"(issue {n}: a log)",
        f"Issue #{n} item 3",
        f"(#{n} item 7)",
        f"issue {n} defect 7",
        f"issues {n}, 29",
    ]
    fine = ["see https://github.com/espressif/esp-nn/issues/7", "the colour #c62828", "item 3 of the list"]
    assert [bool(issue_references(s)) for s in numbered] == [True] * len(numbered)
    assert [bool(issue_references(s)) for s in fine] == [False] * len(fine)


def test_no_unlinked_issue_numbers() -> None:
    found = []
    for path in _text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        found += [f"{path.relative_to(ROOT)}:{n}: {line}" for n, line in issue_references(text)]
    assert not found, "say the rule or fact instead of the issue number:\n" + "\n".join(found)


def unreasoned_imports(source: str) -> list[tuple[int, str]]:
    """(line, text) of each import inside a function with no comment on its line(s), right above it, or right
    above the run of imports it ends (one comment gives the reason of the imports written under it)."""
    lines = source.splitlines()
    found = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        imports = {
            node.end_lineno or node.lineno: node
            for node in ast.walk(fn)
            if isinstance(node, (ast.Import, ast.ImportFrom))
        }
        for node in imports.values():
            first, last = lines[node.lineno - 1], lines[(node.end_lineno or node.lineno) - 1]
            top = node
            while (previous := imports.get(top.lineno - 1)) is not None:
                top = previous
            above = lines[top.lineno - 2].strip() if top.lineno > 1 else ""
            if "#" not in first and "#" not in last and not above.startswith("#"):
                found.append((node.lineno, first.strip()))
    return sorted(set(found))


def test_import_reason_rule() -> None:
    """A reason on the import's line, on its closing line, right above it or above its run of imports
    counts; a bare import does not."""
    bare = "def f():\n    import json\n    return json\n"
    reasoned = [
        "def f():\n    import json  # only the --json path needs it\n    return json\n",
        "def f():\n    # only the --json path needs it\n    import json\n    return json\n",
        "def f():\n    from os import (\n        path,\n    )  # only here\n    return path\n",
        "def f():\n    # only --json needs them\n    import json\n    import shlex\n    return json, shlex\n",
    ]
    apart = "def f():\n    # only --json needs them\n    import json\n\n    import shlex\n    return shlex\n"
    assert unreasoned_imports(bare) == [(2, "import json")]
    assert [unreasoned_imports(s) for s in reasoned] == [[], [], [], []]
    assert unreasoned_imports(apart) == [(5, "import shlex")]  # a blank line ends the comment's run


def test_every_import_inside_a_function_has_a_reason() -> None:
    found = []
    for path in sorted(HARNESS.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        found += [f"{rel}:{n}: {line}" for n, line in unreasoned_imports(path.read_text(encoding="utf-8"))]
    assert not found, "say in a comment why each of these imports is inside its function:\n" + "\n".join(
        found
    )


# private class name -> why its classes in two modules are one concept. Empty: no such pair exists today.
SHARED_PRIVATE_CLASS_NAMES: dict[str, str] = {}


def test_private_class_names_are_unique() -> None:
    where = collections.defaultdict(list)
    for path in sorted(HARNESS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name.startswith("_"):
                where[node.name].append(f"{path.relative_to(ROOT).as_posix()}:{node.lineno}")
    shared = {
        name: places
        for name, places in where.items()
        if len(places) > 1 and name not in SHARED_PRIVATE_CLASS_NAMES
    }
    assert not shared, f"give each class a name that says what it is: {shared}"
