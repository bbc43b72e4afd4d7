"""Which distribution's files make up the ``serial`` package (pyserial, or labgrid's fork).

Both install the same ``serial`` package, and uninstalling one deletes the files under the other's feet
(docs/ci.md, "labgrid and pyserial"): this module reads both distributions' RECORD hashes and says what
is really there.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

DISTRIBUTIONS = ("pyserial", "pyserial-labgrid")


@dataclass
class SerialPackage:
    """What is installed and which distribution each file of ``serial/`` matches."""

    installed: dict[str, str] = field(default_factory=dict)  # distribution -> version
    provider: str | None = None  # the distribution whose files all match, None: mixed or broken
    missing: list[str] = field(default_factory=list)  # files a RECORD lists that are not on disk
    mixed: list[str] = field(default_factory=list)  # "path: distribution" where files come from both

    @property
    def ok(self) -> bool:
        return bool(self.installed) and not self.missing and not self.unmet

    @property
    def unmet(self) -> list[str]:
        """Required distributions not installed by name: esptool and esp-check require ``pyserial``, so
        a venv whose ``serial`` files come from pyserial-labgrid alone still fails ``pip check``."""
        return [] if not self.installed or "pyserial" in self.installed else ["pyserial"]

    def describe(self) -> str:
        have = ", ".join(f"{d} {v}" for d, v in sorted(self.installed.items())) or "none"
        if not self.installed:
            return "no pyserial distribution is installed"
        if self.missing:
            return f"the serial package is broken: {len(self.missing)} file(s) missing ({have} installed)"
        if self.unmet:
            return (
                f"pyserial is not installed ({have} installed): esptool and esp-check require it by name, "
                "so `pip check` reports it and the next `pip install` may delete the shared serial files"
            )
        if self.provider:
            return (
                f"serial package files of {self.provider} {self.installed[self.provider]} (installed: {have})"
            )
        return f"serial package files mixed from {have}: {', '.join(self.mixed)}"

    def fix(self) -> str:
        """The one command that makes the package whole again (labgrid's fork: a superset)."""
        name = "pyserial-labgrid" if "pyserial-labgrid" in self.installed else "pyserial"
        again = f"pip install --force-reinstall --no-deps {name}"
        # pyserial first, then the fork over it: both recorded as installed, the fork's files on disk
        return f"pip install --no-deps pyserial && {again}" if self.unmet else again

    def to_dict(self) -> dict[str, object]:
        return {
            **asdict(self),  # installed, provider, missing, mixed
            "ok": self.ok,
            "unmet": self.unmet,
            "summary": self.describe(),
            "fix": None if self.ok and self.provider else self.fix(),
        }


def _sha256(path: Path) -> str | None:
    try:
        digest = hashlib.sha256(path.read_bytes()).digest()
    except OSError:
        return None
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _record(dist: metadata.Distribution) -> dict[str, tuple[Path, str]]:
    """``serial/...`` files of a distribution: relative path -> (path on disk, RECORD hash)."""
    out: dict[str, tuple[Path, str]] = {}
    for f in dist.files or ():
        rel = f.as_posix()
        if rel.startswith("serial/") and rel.endswith(".py") and f.hash is not None:
            out[rel] = (Path(str(dist.locate_file(f))), f"{f.hash.mode}={f.hash.value}")
    return out


def inspect_serial_package(path: list[str] | None = None) -> SerialPackage:
    """Compare the files on disk with each installed distribution's RECORD (``path``: sys.path)."""
    pkg = SerialPackage()
    records: dict[str, dict[str, tuple[Path, str]]] = {}
    for name in DISTRIBUTIONS:
        found = list(
            metadata.distributions(name=name, path=path) if path else metadata.distributions(name=name)
        )
        if not found:
            continue
        dist = found[0]
        pkg.installed[name] = dist.version
        records[name] = _record(dist)
    owners: dict[str, set[str]] = {name: set() for name in records}
    for name, files in records.items():
        for rel, (on_disk, want) in sorted(files.items()):
            have = _sha256(on_disk)
            if have is None:
                pkg.missing.append(rel)
            elif have == want:
                owners[name].add(rel)
    pkg.missing = sorted(set(pkg.missing))
    every = set().union(*(set(f) for f in records.values())) if records else set()
    # the distribution written last matches every file; the other only the files both ship alike
    whole = [name for name in records if records[name] and owners[name] == set(records[name])]
    if not pkg.missing and whole:
        pkg.provider = whole[0]
    elif not pkg.missing:
        pkg.mixed = sorted(
            f"{rel}: {'/'.join(n for n in records if rel in owners[n]) or 'neither'}"
            for rel in every
            if sum(rel in owners[n] for n in records) != len(records)
        )
    return pkg
