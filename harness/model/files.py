"""Read a user's file safely: a regular file, under a size cap, checked before a byte is read.

A FIFO blocks a plain ``read_bytes()`` forever, ``/dev/zero`` grows it without end and a 200 MB log
takes minutes to parse. :func:`read_regular` opens without blocking, checks
the opened file (so a path swapped between a check and the read is caught too), and reads at most the
cap.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from harness.errors import UsageError

MiB = 1 << 20
MODEL_MAX_BYTES = 64 * MiB  # a .tflite for an ESP32 lives in its flash (16 MB at most)
LOG_MAX_BYTES = 64 * MiB  # a captured run for `compare` (a 25 MB log compares in ~4 s)
INPUT_MAX_BYTES = 64 * MiB  # one input or dataset file
_BIG_HINT = "check that this is the right file"


_KINDS = {  # by stat.S_IFMT; any other file that is not regular: "not a regular file"
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def _refuse(error: type[UsageError], path: Path, what: str, why: str, hint: str) -> UsageError:
    return error(f"{what} {path} is {why}: refused before reading it", hint=hint)


def check_regular(
    path: str | Path,
    *,
    what: str,
    max_bytes: int,
    error: type[UsageError] = UsageError,
    big_hint: str = _BIG_HINT,
) -> int:
    """The size of ``path`` when it is a regular file of at most ``max_bytes`` (symlinks followed);
    ``error`` (exit 2) otherwise. Does not open the file."""
    p = Path(path)
    try:
        status = os.stat(p)
    except FileNotFoundError:
        raise error(f"{what} not found: {p}", hint="check the path") from None
    except OSError as exc:
        raise error(f"cannot read {what} {p}: {exc.strerror or exc}") from None
    _check_stat(status, p, what, max_bytes, error, big_hint)
    return status.st_size


def _check_stat(
    status: os.stat_result, path: Path, what: str, max_bytes: int, error: type[UsageError], big_hint: str
) -> None:
    if not stat.S_ISREG(status.st_mode):
        kind = _KINDS.get(stat.S_IFMT(status.st_mode))
        why = f"{kind}, so it is not a regular file" if kind else "not a regular file"
        hint = "give the path of a regular file (not a pipe, device or directory)"
    elif status.st_size > max_bytes:
        why = f"{status.st_size / MiB:.1f} MiB, more than the {max_bytes // MiB} MiB esp-check reads"
        hint = big_hint
    else:
        return
    raise _refuse(error, path, what, why, hint)


def read_regular(
    path: str | Path,
    *,
    what: str,
    max_bytes: int,
    error: type[UsageError] = UsageError,
    big_hint: str = _BIG_HINT,
) -> bytes:
    """The bytes of ``path`` when it is a regular file of at most ``max_bytes``; ``error`` (exit 2) for a
    FIFO, a device, a directory, a missing or unreadable file or one over the cap, before reading it."""
    p = Path(path)
    check_regular(p, what=what, max_bytes=max_bytes, error=error, big_hint=big_hint)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        with os.fdopen(os.open(p, flags), "rb") as fh:
            _check_stat(os.fstat(fh.fileno()), p, what, max_bytes, error, big_hint)  # the opened file
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise error(f"cannot read {what} {p}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:  # it grew after the check
        raise _refuse(error, p, what, f"larger than the {max_bytes // MiB} MiB esp-check reads", big_hint)
    return data
