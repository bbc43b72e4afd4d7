"""No global mutable state in harness/: read from the source (ast), and one native board's lifetime (run).

A function that writes into a module-level dict, list or set, rebinds a module global, or a module-level
instance of a class whose methods change its attributes, is process-wide state: it outlives every run,
is shared by every thread and test, and has no owner to reset it. The exceptions are listed here, each
with its reason.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[1] / "harness"
MUTATORS = {"append", "extend", "add", "update", "pop", "popitem", "setdefault", "clear", "remove", "insert"}
ALLOWED = {
    # pyserial builds URL handler ports itself: the boards behind sim:// and native:// can be reached only
    # through the process (harness/inprocess.py says so at length)
    ("inprocess.py", "BOARDS"),
    # set once, in the host-reference child process only (harness.model.hostrun), never in esp-check's own
    ("model/backends.py", "_invoke_hook"),
    # the child processes this process started and that still run: killed at interpreter exit and on a
    # hard stop of `esp-check run`, so none outlives esp-check; what "at exit" reaches is the process
    ("children.py", "_LIVE"),
    # a bounded memo of a pure function: parsed models by the SHA-256 of their bytes (immutable ModelInfo);
    # a hit gives exactly what a parse would, so no caller can see who else filled it
    ("model/loader.py", "_parsed"),
}


def _module_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _written_name(node: ast.AST) -> str | None:
    """The plain name whose contents ``node`` changes (``x[k] = ...``, ``del x[k]``, ``x.append(...)``)."""
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AugAssign | ast.Delete):
        targets = [node.target] if isinstance(node, ast.AugAssign) else node.targets
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
        targets = [node.func]
    for t in targets:
        if isinstance(t, ast.Subscript | ast.Attribute) and isinstance(t.value, ast.Name):
            return t.value.id
    return None


def _local_names(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    args = fn.args
    names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def _root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _stateful_classes(tree: ast.Module) -> set[str]:
    """Classes of this module with a method (other than __init__) that changes ``self``'s attributes."""
    out = set()
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for fn in _functions(cls):
            for node in ast.walk(fn) if fn.name != "__init__" else ():
                stored = isinstance(node, ast.Attribute | ast.Subscript) and isinstance(
                    node.ctx, ast.Store | ast.Del
                )
                called = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                mutated = called and node.func.attr in MUTATORS and _root(node.func.value) == "self"  # type: ignore[union-attr]
                if (stored and _root(node) == "self") or mutated:  # type: ignore[arg-type]
                    out.add(cls.name)
    return out


def _findings(path: Path, root: Path = HARNESS) -> list[tuple[str, str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    rel = path.relative_to(root).as_posix()
    module = _module_names(tree)
    out = []
    for fn in _functions(tree):
        local = _local_names(fn)
        for node in ast.walk(fn):
            if isinstance(node, ast.Global):
                out += [(rel, name, node.lineno) for name in node.names]
            name = _written_name(node)
            if name in module and name not in local:
                out.append((rel, name, node.lineno))
    stateful = _stateful_classes(tree)
    for node in tree.body:
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in stateful:
            out += [(rel, name, node.lineno) for name in _module_names(ast.Module([node], []))]
    return out


def test_no_module_level_state_is_written_outside_the_listed_exceptions() -> None:
    found = [f for path in sorted(HARNESS.rglob("*.py")) for f in _findings(path)]
    unexpected = [f"harness/{rel}:{line} {name}" for rel, name, line in found if (rel, name) not in ALLOWED]
    assert not unexpected, (
        "process-wide mutable state (give it an owner, or list it with a reason):\n" + "\n".join(unexpected)
    )
    assert {(rel, name) for rel, name, _ in found} == ALLOWED  # every exception is still needed


def test_the_scan_sees_each_kind_of_global_state(tmp_path: Path) -> None:
    """The scan itself: a cache dict written by a function, a rebound global, a registry instance."""
    src = tmp_path / "m.py"
    src.write_text(
        "_CACHE = {}\n_hook = None\n"
        "def load(k):\n    _CACHE[k] = 1\n"
        "def set_hook(h):\n    global _hook\n    _hook = h\n"
        "class Registry:\n    def __init__(self):\n        self.items = {}\n"
        "    def add(self, k):\n        self.items[k] = 1\n"
        "REG = Registry()\n"
        "def pure(x):\n    y = {}\n    y[x] = 1\n    return y\n"
    )
    assert {name for _, name, _ in _findings(src, tmp_path)} == {"_CACHE", "_hook", "REG"}


def test_a_native_boards_directory_outlives_its_port_but_not_the_process(tmp_path: Path) -> None:
    """The native board owns its directory (no module-level list and atexit hook): closing the port keeps
    its flash, the end of the process removes it."""
    code = (
        "import serial\n"
        "from harness.device.protocol_native import register\n"
        "register()\n"
        "port = serial.serial_for_url('native://gs-board')\n"
        "first = port._dir\n"
        "port.close()\n"
        "again = serial.serial_for_url('native://gs-board')\n"
        "assert again._dir == first and first.is_dir()\n"
        "again.close()\n"
        "print(first)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(HARNESS.parent), "TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    board_dir = Path(out.stdout.strip())
    assert board_dir.parent == tmp_path and not board_dir.exists()
