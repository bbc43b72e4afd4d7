"""The CLI and the Python API are two front ends over the same operations (docs/architecture.md): each
command runs an operation that ``harness.api`` exports, the very same function, so a Python user can do
what a command does. Read with :mod:`ast` from the command modules' imports; nothing runs.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from harness import api
from harness.cli import LAZY_COMMANDS

# command -> the API operations it runs (``sim`` is the simulated board's own tool, not an operation on
# a model: it has no API function)
OPERATIONS = {
    "inspect": ["load_model", "estimate_arena"],
    "reference": ["load_model", "run_reference"],
    "compare": ["compare_files"],
    "boards": ["list_boards", "load_board"],
    "generate": ["generate_projects"],
    "build": ["build_project"],
    "flash-and-compare": ["flash_and_compare", "JobOptions"],
    "hybrid": ["hybrid", "HybridOptions", "JobOptions"],
    "run": ["load_plan", "load_inventory", "RunOptions"],
    "bench": ["detect_devices"],
    "sweep": ["sweep", "SweepOptions"],
}


def _imported(module: str) -> dict[str, object]:
    """Every name the command module imports from harness (at top level or inside a function)."""
    tree = ast.parse(Path(importlib.import_module(module).__file__ or "").read_text(encoding="utf-8"))
    found: dict[str, object] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("harness."):
            home = importlib.import_module(node.module or "")
            for alias in node.names:
                found[alias.asname or alias.name] = getattr(home, alias.name)
    return found


def test_every_command_is_listed() -> None:
    assert set(OPERATIONS) | {"sim"} == set(LAZY_COMMANDS)


@pytest.mark.parametrize("command", sorted(OPERATIONS))
def test_each_command_runs_the_apis_own_operation(command: str) -> None:
    module = LAZY_COMMANDS[command].split(":")[0]
    names = _imported(module)
    for op in OPERATIONS[command]:
        assert op in api.__all__, f"harness.api does not export {op}, which `esp-check {command}` runs"
        assert names.get(op) is getattr(api, op), f"`esp-check {command}` does not run harness.api.{op}"


def test_flows_names_are_imported_from_where_they_are_defined() -> None:
    """harness.flows.flash_and_compare re-exports nothing: what harness/, tests and bench import from it is
    defined there (a class or function defined elsewhere is imported from its own module)."""
    root = Path(__file__).resolve().parent.parent
    home = "harness.flows.flash_and_compare"
    module = importlib.import_module(home)
    assert not hasattr(module, "__all__")
    borrowed = []
    for path in [
        *(root / "harness").rglob("*.py"),
        *(root / "tests").glob("*.py"),
        *(root / "bench").glob("*.py"),
    ]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == home:
                for alias in node.names:
                    defined_in = getattr(getattr(module, alias.name), "__module__", home)
                    if defined_in != home:
                        borrowed.append(f"{path.relative_to(root)}: {alias.name} (from {defined_in})")
    assert borrowed == []
