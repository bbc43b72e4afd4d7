"""A file lock held by another process: flock is per open file description, so only a second
process is a real second holder (a lock taken in the test's own process is not)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

_HOLD = (
    "import sys, filelock; l = filelock.FileLock(sys.argv[1]); l.acquire(); print('held', flush=True); "
    "sys.stdin.read()"
)


@contextlib.contextmanager
def held_elsewhere(path: Path) -> Iterator[None]:
    """``path`` (a filelock lock file) locked by a child process for the ``with`` block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.communicate("")
