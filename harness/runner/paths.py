"""Artifact paths of a run: every component that comes from a file name or a plan field goes through
:func:`safe_component`, and :func:`move_aside` keeps a previous run's verdicts from surviving a rerun.

The rules ("Names in paths", "No stale verdicts"): docs/ci.md "Reports and artifacts".
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

from harness.errors import UsageError

MAX_COMPONENT = 80  # characters; well below every file system's 255-byte limit, hash included
_UNSAFE = re.compile(r"[^A-Za-z0-9_.@+-]")
# Windows refuses these as file names, with any extension ("con.tflite" too), in any case
_RESERVED = re.compile(r"(con|prn|aux|nul|com[0-9¹²³]|lpt[0-9¹²³]|conin\$|conout\$)(\..*)?", re.IGNORECASE)

# what a run writes at the top of its out_dir, besides firmware/ (reusable builds, not verdicts)
REPORT_NAMES = ("summary.json", "junit.xml", "summary.md", "jobs")
PREVIOUS_DIR = "previous-run"
INCOMPLETE_DIR = "incomplete-run"  # under previous-run/: what a run that did not finish (kill -9) left
MARKER = ".esp-check-run"  # written into every out_dir (and previous-run/) a run uses
SUMMARY_SCHEMA = "esp-check/run-summary"


def safe_component(text: str) -> str:
    """``text`` as one portable path component: never ``.``/``..``, a separator, NUL, a reserved name.

    Unchanged when it already is one (``fixtures``, ``cnn_classifier_11``, ``sim@b1``); the rules for
    the others: docs/ci.md "Names in paths"."""
    safe = _UNSAFE.sub("_", text)
    safe = re.sub(r"^\.|\.$", "_", safe)  # no ".", "..", hidden names, or Windows' dropped trailing dot
    if _RESERVED.fullmatch(safe):
        safe = "_" + safe
    if safe == text and 0 < len(safe) <= MAX_COMPONENT:
        return safe
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{safe[: MAX_COMPONENT - 9]}-{digest}" if safe else digest


def _ours(directory: Path) -> bool:
    """``directory`` was written by ``esp-check run``: its marker, or (before markers) a run summary."""
    if (directory / MARKER).is_file():
        return True
    try:
        return (
            json.loads((directory / "summary.json").read_text(encoding="utf-8")).get("schema")
            == SUMMARY_SCHEMA
        )
    except (OSError, ValueError, AttributeError):
        return False


def move_aside(out_dir: Path, extra: Iterable[Path] = ()) -> tuple[Path | None, list[str]]:
    """Move the previous run's reports out of the way before a run starts, and mark ``out_dir``.

    Where they go and what is refused: docs/ci.md "No stale verdicts". Returns the directory they
    went to (None when there was nothing) and lines saying what was moved or deleted.
    """
    found = [out_dir / n for n in REPORT_NAMES if (out_dir / n).exists() or (out_dir / n).is_symlink()]
    dest = out_dir / PREVIOUS_DIR
    if found and not _ours(out_dir):
        raise UsageError(
            f"--out {out_dir} holds {', '.join(p.name for p in found)}, which no esp-check run wrote",
            hint="give --out an empty directory or one an earlier `esp-check run` used",
        )
    if found and (dest.exists() or dest.is_symlink()) and not (dest / MARKER).is_file():
        raise UsageError(
            f"{dest} was not written by esp-check; it would be replaced by the previous run's reports",
            hint="move it away or choose another --out",
        )
    complete = (out_dir / "summary.json").is_file()  # the run before finished (a killed one wrote none)
    found += sorted(out_dir.glob("*.tmp")) if out_dir.is_dir() else []
    said: list[str] = []
    target = dest if complete else dest / INCOMPLETE_DIR
    if found:
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for d in {dest, target}:
            (d / MARKER).write_text("reports of an earlier esp-check run\n", encoding="utf-8")
        for p in found:
            os.replace(p, target / p.name)
        said.append(f"moved {', '.join(p.name for p in found)} to {target}")
        if not complete and (dest / "summary.json").is_file():
            said.append(f"(a run that did not finish; the last complete run's reports stay in {dest})")
    for p in extra:
        if p.is_file() or p.is_symlink():
            p.unlink()
            said.append(f"deleted {p}")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MARKER).write_text(
        "written by esp-check run: its reports may be moved to previous-run/\n", encoding="utf-8"
    )
    return (target if found else None), said
