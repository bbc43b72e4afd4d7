"""Content-addressed build cache: the same rendered project, versions, board and builder give the same key.

A hit means the builder is not run at all (docs/firmware.md "esp-check build": key, location, size bound,
one lock per key). Entries live in ``<root>/entries/<key>/``, written to a temporary directory and renamed
into place, so a reader never sees half an entry; one index lock serializes eviction.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import filelock

from harness.errors import BuildError
from harness.resources import atomic_write, user_cache_dir

DEFAULT_MAX_BYTES = 2 * 1024**3
LOCK_TIMEOUT_S = 3600.0  # a build of the same key in another process may take this long
ENTRY_META = "meta.json"
_USED_MARK = ".used"


def default_cache_dir() -> Path:
    """``builds/`` in esp-check's cache root (:func:`harness.resources.user_cache_dir`)."""
    return user_cache_dir("builds")


def native_root(cache_dir: str | Path | None = None) -> Path:
    """``native/`` in the build cache (``cache_dir``, else :func:`default_cache_dir`): the native target's
    source snapshots and library trees, flash-and-compare's and the sweep's (docs/native.md "Cache")."""
    return Path(cache_dir or default_cache_dir()) / "native"


class BuildMeta(TypedDict, total=False):
    """What an entry keeps beside its files (meta.json): what the build says about them, then what the
    cache adds (``files``: name -> size, ``key``, ``stored_at``)."""

    offsets: dict[str, int]  # role -> flash offset
    sdkconfig: dict[str, str]  # the flash-relevant CONFIG_ symbols
    resolved: dict[str, object] | None  # dependencies.lock and the components it resolved
    builder: str
    board: str
    extras: list[str]  # roles of the files not flashed (the ELF, sdkconfig.json)
    native: dict[str, object]  # a native build's plan
    app_slot: dict[str, str]  # the app file's SHA-256 and what HELLO reports for its slot (build.py)
    files: dict[str, int]
    key: str
    stored_at: float


@dataclass(frozen=True)
class CacheEntry:
    """A cached build: its files (by name inside ``path``) and the metadata stored with them."""

    key: str
    path: Path
    meta: BuildMeta


def _dir_size(path: Path) -> int:
    total = 0
    for p in path.rglob("*"):
        with contextlib.suppress(OSError):
            if p.is_file():
                total += p.stat().st_size
    return total


class BuildCache:
    """A size-bounded directory of build results keyed by content hash; safe across processes."""

    def __init__(self, root: str | Path, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        try:
            (self.root / "entries").mkdir(parents=True, exist_ok=True)
            (self.root / "locks").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BuildError(
                f"cannot create the build cache at {self.root}: {exc.strerror or exc}",
                hint="pass --cache-dir to a writable directory, or --no-cache",
            ) from exc

    def _check_key(self, key: str) -> None:
        if not key or any(c not in "0123456789abcdef" for c in key):
            raise ValueError(f"invalid cache key {key!r}")

    def entry_dir(self, key: str) -> Path:
        self._check_key(key)
        return self.root / "entries" / key

    def lock(self, key: str) -> filelock.BaseFileLock:
        """The per-key lock: hold it while checking for and building one key."""
        self._check_key(key)
        return filelock.FileLock(str(self.root / "locks" / f"{key}.lock"), timeout=LOCK_TIMEOUT_S)

    def _index_lock(self) -> filelock.BaseFileLock:
        return filelock.FileLock(str(self.root / "index.lock"), timeout=LOCK_TIMEOUT_S)

    def get(self, key: str) -> CacheEntry | None:
        """The entry for ``key`` if complete (every listed file present with its size), else None."""
        path = self.entry_dir(key)
        try:
            meta: BuildMeta = json.loads((path / ENTRY_META).read_text(encoding="utf-8"))
            files = meta.get("files", {})
            if not isinstance(files, dict) or any((path / n).stat().st_size != s for n, s in files.items()):
                return None
        except (OSError, ValueError):
            return None
        with contextlib.suppress(OSError):
            (path / _USED_MARK).touch()
        return CacheEntry(key, path, meta)

    def put(self, key: str, files: dict[str, Path], meta: BuildMeta) -> CacheEntry:
        """Store copies of ``files`` (name in the entry -> source path) and ``meta`` under ``key``."""
        final = self.entry_dir(key)
        tmp = self.root / "entries" / f".tmp-{key}-{uuid.uuid4().hex}"
        tmp.mkdir(parents=True)
        try:
            sizes: dict[str, int] = {}
            for name, src in files.items():
                if "/" in name or "\\" in name or name in (ENTRY_META, _USED_MARK):
                    raise ValueError(f"invalid cache file name {name!r}")
                shutil.copy2(src, tmp / name)
                sizes[name] = (tmp / name).stat().st_size
            full_meta: BuildMeta = {**meta, "files": sizes, "key": key, "stored_at": time.time()}
            (tmp / ENTRY_META).write_text(json.dumps(full_meta, indent=2, sort_keys=True), encoding="utf-8")
            (tmp / _USED_MARK).touch()
            with self._index_lock():
                shutil.rmtree(final, ignore_errors=True)
                tmp.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # (gone already when it became the entry)
        self.evict(keep=key)
        return CacheEntry(key, final, full_meta)

    def update_meta(self, entry: CacheEntry, extra: BuildMeta) -> CacheEntry:
        """``entry`` with ``extra`` merged into its metadata, rewritten in place (atomically: a reader sees
        the old or the new file); hold the key's lock. A write that fails leaves the entry as it was."""
        meta: BuildMeta = {**entry.meta, **extra}
        with contextlib.suppress(OSError):
            atomic_write(entry.path / ENTRY_META, json.dumps(meta, indent=2, sort_keys=True), durable=False)
        return CacheEntry(entry.key, entry.path, meta)

    def entries(self) -> list[tuple[str, int, float]]:
        """(key, bytes, last used time) of every complete entry."""
        out: list[tuple[str, int, float]] = []
        for path in (self.root / "entries").iterdir():
            if path.name.startswith(".tmp-") or not (path / ENTRY_META).is_file():
                continue
            try:
                used = (path / _USED_MARK).stat().st_mtime
            except OSError:
                used = 0.0
            out.append((path.name, _dir_size(path), used))
        return out

    def evict(self, keep: str | None = None) -> list[str]:
        """Delete least recently used entries until the cache fits ``max_bytes``; returns deleted keys.

        Entries whose key lock is held (a build or a hit in progress) and ``keep`` are never deleted.
        """
        removed: list[str] = []
        with self._index_lock():
            entries = sorted(self.entries(), key=lambda e: e[2])
            total = sum(size for _, size, _ in entries)
            for key, size, _ in entries:
                if total <= self.max_bytes:
                    break
                if key == keep:
                    continue
                try:
                    with self.lock(key).acquire(timeout=0):
                        shutil.rmtree(self.entry_dir(key), ignore_errors=True)
                except filelock.Timeout:
                    continue
                total -= size
                removed.append(key)
        return removed
