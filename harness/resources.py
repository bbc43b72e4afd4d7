"""Find esp-check's data directories (firmware templates, board files) in a checkout or an installed wheel.

In a repository checkout they sit beside the package (``firmware_templates/``, ``boards/``); the wheel
force-includes them as ``harness/_data/firmware_templates`` and ``harness/_data/boards``
(pyproject.toml). Looking in both places keeps one source of truth without copying files around.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from harness.errors import EspCheckError, PlanError, UsageError, write_error

# the one choice of TOML parser: Python 3.11's tomllib, else its backport tomli (pyproject.toml supports
# 3.10); ``parse_toml(text)`` raises TOMLDecodeError, a ValueError, on text that is not TOML
if sys.version_info >= (3, 11):
    from tomllib import loads as parse_toml
else:  # pragma: no cover - Python 3.10
    from tomli import loads as parse_toml

_PACKAGE_DIR = Path(__file__).resolve().parent
_T = TypeVar("_T")


def _locate(name: str) -> Path:
    candidates = (_PACKAGE_DIR / "_data" / name, _PACKAGE_DIR.parent / name)
    for cand in candidates:
        if cand.is_dir():
            return cand
    raise EspCheckError(
        f"esp-check's '{name}' directory is missing (looked in {', '.join(str(c) for c in candidates)})",
        hint="reinstall esp-check (pip install --force-reinstall esp-check) or run from a full checkout",
    )


def templates_dir() -> Path:
    """Directory holding the Jinja firmware templates (``firmware_templates``)."""
    return _locate("firmware_templates")


def boards_dir() -> Path:
    """Directory holding the built-in board definitions (``boards/*.toml``)."""
    return _locate("boards")


def read_toml(path: Path, what: str, example: str) -> dict[str, object]:
    """The TOML file ``path`` (a ``what``: plan, inventory); PlanError naming it when it is missing,
    unreadable or not TOML (``example``: the file to look at)."""
    try:
        return parse_toml(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanError(f"{what} file not found: {path}", hint="check the path") from None
    except OSError as exc:
        raise PlanError(f"cannot read {what} {path}: {exc}") from None
    except ValueError as exc:  # TOMLDecodeError, or UnicodeDecodeError
        raise PlanError(f"{what} {path} is not valid TOML: {exc}", hint=f"see {example}") from None


def data_dir() -> Path:
    """Package data shipped inside ``harness/data`` (allow-lists, op tables)."""
    return _PACKAGE_DIR / "data"


def user_cache_dir(kind: str) -> Path:
    """``<root>/<kind>``: one cache root for builds, the compiled emitter, reference results, ...: the
    root is ``$ESP_CHECK_CACHE_DIR`` when set, else the platform's user cache directory plus ``esp-check``."""
    env = os.environ.get("ESP_CHECK_CACHE_DIR")
    if env:
        return Path(env) / kind
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "esp-check" / kind


_IDF_VERSION = re.compile(r"([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})")


def installed_versions(*dists: str) -> dict[str, str]:
    """The version of each of ``dists`` that is installed, from its metadata (nothing is imported)."""
    found: dict[str, str] = {}
    for dist in dists:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[dist] = importlib.metadata.version(dist)
    return found


def code_digest(tag: str, here: Path, files: Sequence[str], dists: Sequence[str]) -> str:
    """A digest of what a stored result depends on besides its input: ``tag`` (the store's format),
    the installed versions of ``dists`` and the bytes of ``files`` (relative to the folder ``here``)."""
    h = hashlib.sha256(tag.encode())
    for dist, version in installed_versions(*dists).items():
        h.update(f"|{dist} {version}".encode())
    for name in files:
        h.update(name.encode() + b"\0" + (here / name).read_bytes())
    return h.hexdigest()[:32]


def atomic_write(path: Path, data: str | bytes, *, durable: bool = True) -> None:
    """Write ``path`` so a reader (or a kill -9) sees the old file or the new one, never half of one
    (``durable``: flushed to the disk before it replaces the old one; a cache need not be)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        with open(tmp, "wb") as fh:
            fh.write(raw)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_output(path: Path, data: str | bytes, what: str) -> None:
    """A report file the user asked for (JUnit, HTML), written atomically, its folder made as --out's is;
    one that cannot be written is exit 3 naming it (a full disk says so), never a traceback."""
    try:
        atomic_write(path, data)
    except OSError as exc:
        raise write_error(exc, f"the {what} {path}") from None


def check_output_path(path: str | Path, flag: str) -> None:
    """Refuse (exit 2, before any work) a report destination that cannot become a file: a folder, or a path
    under a file. Its folder is made here, as --out's is."""
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        why = "it is a directory" if p.is_dir() else None
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        if any(a.exists() and not a.is_dir() for a in p.parents):
            why = "a file is in the way of its folder"
    if why is not None:
        raise UsageError(
            f"cannot write {flag} {p}: {why}", hint=f"give {flag} a file path in a folder you can write"
        )


def write_if_changed(path: Path, data: str | bytes) -> bool:
    """Write ``data`` atomically (:func:`atomic_write`, not flushed to the disk) and return True; keep the
    file, and its mtime, when its content is already ``data`` (so nothing that depends on it rebuilds)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with contextlib.suppress(OSError):
        if path.read_bytes() == raw:
            return False
    atomic_write(path, raw, durable=False)  # a full disk leaves no half-written file behind
    return True


def cache_entry(kind: str, digest: str, code_id: str) -> Path:
    """The cache file of the result for SHA-256 ``digest`` by the code ``code_id`` (:func:`code_digest`)."""
    return user_cache_dir(kind) / f"{digest}-{code_id}.json"


def load_stored(path: Path, build: Callable[[dict[str, Any]], _T], **key: object) -> _T | None:
    """``build`` of the JSON kept at ``path`` if its ``key`` fields (popped) match; None if not or damaged."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return None if any(doc.pop(k) != v for k, v in key.items()) else build(doc)
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None


def store_json(path: Path, doc: object, keep: int) -> None:
    """Write ``doc`` to the cache file ``path`` atomically (a reader never sees half a file), then keep
    at most ``keep`` JSON files in its folder, the oldest out first. A cache that cannot be written is
    only slower: nothing is raised."""
    with contextlib.suppress(OSError, ValueError, TypeError):
        atomic_write(path, json.dumps(doc), durable=False)
        files = list(path.parent.glob("*.json"))
        for f in sorted(files, key=lambda f: f.stat().st_mtime)[: max(0, len(files) - keep)]:
            with contextlib.suppress(OSError):
                f.unlink()


def version_tuple(text: str) -> tuple[int, int, int]:
    """``"5.5.2"`` -> ``(5, 5, 2)``; ValueError for anything that is not MAJOR.MINOR.PATCH."""
    m = _IDF_VERSION.fullmatch(text)
    if m is None:
        raise ValueError(f"{text!r} is not a MAJOR.MINOR.PATCH version")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


@functools.lru_cache(maxsize=1)
def _versions_table() -> dict[str, Any]:
    return dict(parse_toml((data_dir() / "versions.toml").read_text(encoding="utf-8")))


def pinned_versions() -> dict[str, str]:
    """Component and platform versions esp-check pins (``harness/data/versions.toml`` ``[pinned]``)."""
    return {str(k): str(v) for k, v in _versions_table()["pinned"].items()}


def idf_support() -> tuple[str, str]:
    """(oldest supported ESP-IDF, first unsupported ESP-IDF) for every board, from versions.toml."""
    table = _versions_table()["idf"]
    low, below = str(table["min"]), str(table["below"])
    if not version_tuple(low) < version_tuple(below):
        raise EspCheckError(f"harness/data/versions.toml: [idf] min {low} is not below {below}")
    return low, below
