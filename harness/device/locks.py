"""Exclusive, cross-process board locks (filelock, ``flock`` on POSIX), keyed on the board's identity.

The keys (what stays the same when the ``/dev`` name does not), the lock directory, waiting and remote
boards: docs/ci.md, "Board locks".
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import filelock

from harness.device.ports import PortSpec, resolve_port
from harness.errors import BoardBusyError
from harness.resources import atomic_write, user_cache_dir

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_COM = re.compile(r"(?i)com\d+")  # a Windows port name, any case


def default_lock_dir() -> Path:
    """``$ESP_CHECK_LOCK_DIR``, else a per-user runtime directory (sharing a bench: docs/ci.md)."""
    env = os.environ.get("ESP_CHECK_LOCK_DIR")
    if env:
        return Path(env)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "esp-check" / "board-locks"
    return user_cache_dir("board-locks")


def _safe(text: str) -> str:
    return _UNSAFE.sub("_", text).strip("_")[:120] or "board"


_LOOPBACK = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


def _net_host(host: str) -> str:
    """A host as one spelling, never looked up (a resolver's answer differs between machines and over
    time, and so would one board's key): a trailing dot dropped, an address in its canonical form, every
    loopback name and address and 0.0.0.0 / :: (they reach this host too) as ``127.0.0.1``."""
    host = host.rstrip(".")
    if host in _LOOPBACK:
        return "127.0.0.1"
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return "127.0.0.1" if addr.is_loopback or addr.is_unspecified else str(addr)


def lock_key(port: PortSpec | str) -> str:
    """The board's identity behind a resolved :class:`harness.device.ports.PortSpec` (or a port string),
    never its /dev name: the one rule of the board locks and of the inventory's duplicate check (which
    spellings reach one board: docs/ci.md, "Board locks", has the table)."""
    ps = port if isinstance(port, PortSpec) else resolve_port(str(port))
    if ps.usb is not None and ps.usb.serial_number:
        return "usb-sn-" + _safe(ps.usb.serial_number)
    parts = urlsplit(ps.url)
    if ps.caps.lock_by == "net":
        with contextlib.suppress(ValueError):  # a port that is not a number: the URL's own key below
            return f"net-{_safe(_net_host(parts.hostname or ''))}-{parts.port or 0}"
    if ps.caps.lock_by == "name":
        return f"{ps.transport}-" + _safe(parts.netloc or parts.path.lstrip("/"))
    if ps.caps.lock_by == "path":
        return "dev-" + _safe(ps.url.upper() if _COM.fullmatch(ps.url) else os.path.realpath(ps.url))
    return "url-" + _safe(ps.url)


class BoardLock:
    """One board's lock. ``acquire`` waits visibly and at most ``timeout`` seconds."""

    def __init__(self, key: str, lock_dir: str | Path | None = None, *, owner: str = "") -> None:
        self.key = key
        self.dir = Path(lock_dir) if lock_dir is not None else default_lock_dir()
        self.path = self.dir / f"{key}.lock"
        self.info_path = self.dir / f"{key}.owner.json"
        self.owner = owner or f"esp-check (pid {os.getpid()})"
        self._lock = filelock.FileLock(str(self.path), thread_local=False)
        self.acquired_at: float | None = None
        self.waited_s = 0.0

    def holder(self) -> dict[str, object] | None:
        """What the current holder wrote about itself (pid, host, owner, since), if readable."""
        try:
            doc = json.loads(self.info_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def describe_holder(self) -> str:
        h = self.holder()
        if not h:
            return "another process"
        since = h.get("since")
        age = f", for {time.time() - since:.0f} s" if isinstance(since, (int, float)) else ""
        return f"{h.get('owner', '?')} (pid {h.get('pid', '?')} on {h.get('host', '?')}{age})"

    def acquire(
        self,
        timeout: float,
        *,
        on_wait: Callable[[str], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> None:
        """Take the lock or raise :class:`BoardBusyError` (exit 3) after ``timeout`` seconds.

        ``on_wait`` is told who holds the board when waiting starts and every 5 s after; ``cancel``
        (e.g. Ctrl-C) ends the wait early with BoardBusyError too.
        """
        self.dir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        deadline = t0 + max(timeout, 0.0)
        next_report = t0
        while True:
            slice_s = max(0.0, min(0.25, deadline - time.monotonic()))
            try:
                self._lock.acquire(timeout=slice_s, poll_interval=0.02)
                break
            except filelock.Timeout:
                pass
            now = time.monotonic()
            if cancel is not None and cancel.is_set():
                raise BoardBusyError(f"stopped while waiting for board lock {self.key}")
            if now >= deadline:
                raise BoardBusyError(
                    f"board {self.key} is still in use by {self.describe_holder()} after waiting "
                    f"{timeout:.0f} s (lock {self.path})",
                    hint="wait for the other run to finish, or raise the wait with --lock-timeout / "
                    "[run] lock_timeout_s; a lock held by a dead process is released by the OS",
                )
            if on_wait is not None and now >= next_report:
                on_wait(f"waiting for board {self.key}: in use by {self.describe_holder()}")
                next_report = now + 5.0
        self.waited_s = time.monotonic() - t0
        self.acquired_at = time.time()
        doc = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "owner": self.owner,
            "since": self.acquired_at,
        }
        with contextlib.suppress(OSError):
            atomic_write(self.info_path, json.dumps(doc), durable=False)

    def release(self) -> None:
        if not self._lock.is_locked:
            return
        with contextlib.suppress(OSError):
            h = self.holder()
            if h and h.get("pid") == os.getpid() and h.get("since") == self.acquired_at:
                self.info_path.unlink()
        self._lock.release()
        self.acquired_at = None

    @property
    def is_locked(self) -> bool:
        return bool(self._lock.is_locked)


@contextlib.contextmanager
def board_lock(
    port: PortSpec | str,
    *,
    lock_dir: str | Path | None = None,
    timeout: float = 600.0,
    owner: str = "",
    on_wait: Callable[[str], None] | None = None,
) -> Iterator[BoardLock]:
    """Hold the lock of the board behind ``port`` (PortSpec or port string) for a ``with`` block."""
    lock = BoardLock(lock_key(port), lock_dir, owner=owner)
    lock.acquire(timeout, on_wait=on_wait)
    try:
        yield lock
    finally:
        lock.release()
