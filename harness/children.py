"""Child processes esp-check starts that must not outlive it.

When (a second signal, SIGTERM, exit) and which: docs/ci.md's signal rules. A worker thread abandoned
by a second signal is a daemon thread, so the process exits under it and its child (the host reference
child, a build tool in its own process group) would run on to nobody; every such child is registered
here while it runs, and :func:`stop_all` kills them (a build tool's whole group), also at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Iterator, Sequence
from typing import Any

# Sanitizer runtime settings for a native program (set unless the user did, by the native port and the
# kernel sweep): a report ends the program (a firmware fault); leaks at exit are not faults (firmware
# never exits on a device).
SANITIZER_ENV = {
    "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:halt_on_error=1:print_summary=1",
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1:print_summary=1",
}
_LOCK = threading.Lock()
_LIVE: dict[int, tuple[subprocess.Popen[Any], bool]] = {}  # pid -> (process, leads its own group)


def start(argv: Sequence[str], *, group: bool = False, **popen: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(argv, **popen)``, registered as it starts (``group``: in a process group of its
    own, killed as a whole). Made under the lock :func:`stop_all` takes, so a child that starts while
    esp-check exits is killed with the others, never missed between its start and its registration."""
    with _LOCK:
        proc = subprocess.Popen(list(argv), start_new_session=group, **popen)
        _LIVE[proc.pid] = (proc, group)
    return proc


@contextlib.contextmanager
def tracked(proc: subprocess.Popen[Any]) -> Iterator[subprocess.Popen[Any]]:
    """Keep ``proc`` (from :func:`start`) registered while the block runs, and forget it after."""
    try:
        yield proc
    finally:
        with _LOCK:
            _LIVE.pop(proc.pid, None)


def stop_all() -> int:
    """Kill every registered child that is still running (SIGKILL; a group leader's whole group);
    returns how many were running."""
    with _LOCK:
        live = list(_LIVE.values())
    running = [(proc, group) for proc, group in live if proc.poll() is None]
    for proc, group in running:
        kill(proc, group=group)
    return len(running)


def kill(proc: subprocess.Popen[Any], *, group: bool = False) -> None:
    """SIGKILL ``proc`` (``group``: and every process of the group it leads); one already gone is fine."""
    if group:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


atexit.register(stop_all)
