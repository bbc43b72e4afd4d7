"""Component sources for native builds: a directory the user gives, or the ESP-IDF component manager.

The native driver builds whatever sources it is given (nothing upstream ships with esp-check); where they
come from (``--components-dir``, or the component manager, offline through a local mirror) is
docs/native.md "Building". Before a build, sources are copied by content hash into the cache
(:func:`snapshot`), so what was hashed is what is compiled and a cached build never points at a checkout
that moved or changed.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import filelock

from harness.errors import BuildError, UsageError

# ESP-IDF build name -> short name, in dependency order (esp-tflite-micro needs esp-nn).
FIRMWARE_COMPONENTS: dict[str, str] = {
    "espressif__esp-nn": "esp-nn",
    "espressif__esp-tflite-micro": "esp-tflite-micro",
}
MANIFEST = "idf_component.yml"
_VERSION_LINE = re.compile(r"""^version:[ \t]*["']?([0-9A-Za-z.+~-]+)""", re.MULTILINE)
_SKIP_DIRS = {".git", "__pycache__", ".pio", "build", "dist", ".component_hash_cache"}
_SKIP_FILES = {".component_hash"}


@dataclass(frozen=True)
class ComponentSource:
    """One component's sources as a build uses them."""

    name: str  # ESP-IDF build name, e.g. espressif__esp-nn
    path: Path
    version: str | None  # ``version:`` of its idf_component.yml (None: not stated, e.g. a git checkout)
    origin: str  # "components-dir" | "component-manager"
    sha256: str = ""  # content hash of the tree (see tree_sha256)
    lock: Path | None = None  # the component manager's dependencies.lock that resolved it, if any

    def describe(self) -> dict[str, str | None]:
        return {
            "name": self.name,
            "version": self.version,
            "origin": self.origin,
            "sha256": self.sha256,
            "path": str(self.path),
        }


def component_version(path: Path) -> str | None:
    """The ``version:`` line of ``path/idf_component.yml`` (the registry writes it into every archive)."""
    try:
        text = (path / MANIFEST).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    m = _VERSION_LINE.search(text)
    return m.group(1) if m else None


def tree_sha256(path: Path) -> str:
    """SHA-256 over every file's relative path and bytes (VCS and build directories skipped)."""
    h = hashlib.sha256()
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        for name in sorted(files):
            if name in _SKIP_FILES:
                continue
            full = Path(root) / name
            if full.is_symlink() and not full.exists():
                continue
            rel = full.relative_to(path).as_posix()
            h.update(rel.encode("utf-8") + b"\0")
            h.update(hashlib.sha256(full.read_bytes()).digest())
    return h.hexdigest()


def find_components(
    directory: str | Path, names: Sequence[str] = tuple(FIRMWARE_COMPONENTS)
) -> list[ComponentSource]:
    """The components ``names`` (build names) in ``directory``; UsageError (exit 2: the option names the
    wrong place: a usage error, not a failure of the tools) listing what is there."""
    base = Path(directory).expanduser().resolve()
    if not base.is_dir():
        raise UsageError(
            f"--components-dir {base} is not a directory",
            hint="give a directory holding esp-tflite-micro and esp-nn (checkouts, or a project's "
            "managed_components/)",
        )
    roots = [base, base / "managed_components"]
    found: list[ComponentSource] = []
    for name in names:
        short = FIRMWARE_COMPONENTS.get(name, name.split("__")[-1])
        hit = next(
            (r / c for r in roots for c in (name, short) if (r / c / "CMakeLists.txt").is_file()), None
        )
        if hit is None:
            present = sorted(p.name for r in roots if r.is_dir() for p in r.iterdir() if p.is_dir())
            raise UsageError(
                f"component {name} ({short}) is not in {base}: no {name}/ or {short}/ with a CMakeLists.txt "
                f"(found: {', '.join(present) or 'nothing'})",
                hint=f"put a checkout of {short} there (or point --components-dir at a project's "
                "managed_components/)",
            )
        lock = hit.parent.parent / "dependencies.lock"  # a project's managed_components/: its lock
        kept = lock if hit.parent.name == "managed_components" and lock.is_file() else None
        found.append(ComponentSource(name, hit, component_version(hit), "components-dir", lock=kept))
    return found


def snapshot(components: Sequence[ComponentSource], root: Path) -> list[ComponentSource]:
    """Copies of the sources under ``root/sources/<name>-<hash>/`` (made once per content hash)."""
    out = []
    for comp in components:
        digest = tree_sha256(comp.path)
        dest = root / "sources" / f"{comp.name}-{digest[:20]}"
        copy_once(comp.path, dest)
        out.append(replace(comp, path=dest, sha256=digest))
    return out


def copy_once(src: Path, dest: Path) -> Path:
    """Copy the source tree ``src`` to ``dest`` unless a complete copy is there (it has its
    CMakeLists.txt): copied beside it and renamed into place, so a half-made copy is never used."""
    if not (dest / "CMakeLists.txt").is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / f".tmp-{dest.name}-{uuid.uuid4().hex[:8]}"
        shutil.copytree(src, tmp, symlinks=False, ignore=shutil.ignore_patterns(*_SKIP_DIRS, *_SKIP_FILES))
        try:
            tmp.rename(dest)
        except OSError:  # another process made the same copy first
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def component_manager_command(project: Path, build_dir: Path) -> list[str]:
    """The command ESP-IDF's CMake runs to solve and download a project's dependencies."""
    return [
        sys.executable,
        "-m",
        "idf_component_manager.prepare_components",
        "--project_dir",
        str(project),
        "--lock_path",
        str(project / "dependencies.lock"),
        "--interface_version",
        "4",
        "prepare_dependencies",
        "--managed_components_list_file",
        str(build_dir / "managed_components_list.temp.cmake"),
        "--build_dir",
        str(build_dir),
    ]


def component_manager_env(
    base: Mapping[str, str], scratch: Path, idf_version: str, target: str
) -> dict[str, str]:
    """What the component manager needs instead of an ESP-IDF installation."""
    env = dict(base)
    idf_dir = scratch / "no-esp-idf"  # IDF_PATH must name a directory; no extra root manifest in it
    idf_dir.mkdir(parents=True, exist_ok=True)
    env.setdefault("IDF_PATH", str(idf_dir))
    env["IDF_VERSION"] = idf_version
    env["IDF_TARGET"] = target
    return env


Runner = Callable[[list[str], Path, Mapping[str, str]], tuple[int, list[str]]]


def download_components(
    manifest: Path,
    cache_root: Path,
    *,
    idf_version: str,
    target: str,
    run: Runner,
    env: Mapping[str, str] | None = None,
) -> list[ComponentSource]:
    """Download the dependencies of ``manifest`` (a ``main/idf_component.yml``) with the component
    manager into ``cache_root/downloads/<hash>/`` (once per manifest + IDF version + target).

    ``run(argv, cwd, env) -> (exit code, output lines)`` runs the subprocess (the build log's runner).
    """
    text = manifest.read_bytes()
    key = hashlib.sha256(text + f"\0{idf_version}\0{target}".encode()).hexdigest()[:24]
    scratch = cache_root / "downloads" / key
    project = scratch / "project"
    done = scratch / "done"
    scratch.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(scratch / ".lock"), timeout=3600):
        if not done.is_file():
            (project / "main").mkdir(parents=True, exist_ok=True)
            (project / "main" / MANIFEST).write_bytes(text)
            (project / "main" / "CMakeLists.txt").write_text("idf_component_register()\n", encoding="utf-8")
            (project / "CMakeLists.txt").write_text(
                "cmake_minimum_required(VERSION 3.16)\n"
                "include($ENV{IDF_PATH}/tools/cmake/project.cmake)\nproject(esp_check_components)\n",
                encoding="utf-8",
            )
            build_dir = scratch / "build"
            build_dir.mkdir(exist_ok=True)
            argv = component_manager_command(project, build_dir)
            cm_env = component_manager_env(os.environ if env is None else env, scratch, idf_version, target)
            rc, tail = run(argv, project, cm_env)
            if rc != 0:
                raise _download_failed(rc, tail)
            done.write_text("ok\n", encoding="utf-8")
    comps = find_components(project / "managed_components")
    return [replace(c, origin="component-manager", lock=project / "dependencies.lock") for c in comps]


def _download_failed(rc: int, tail: Sequence[str]) -> BuildError:
    shown = "\n".join("  " + ln for ln in [ln for ln in tail if ln.strip()][-8:])
    missing = any("No module named" in ln and "idf_component_manager" in ln for ln in tail)
    if missing:
        return BuildError(
            "the ESP-IDF component manager is not installed (idf-component-manager)",
            hint="pip install idf-component-manager, or pass --components-dir with esp-tflite-micro and "
            "esp-nn sources",
        )
    return BuildError(
        f"the ESP-IDF component manager could not provide the components (exit code {rc}):\n{shown}",
        hint="connect to the internet once (the download is cached), pass --components-dir with "
        "esp-tflite-micro and esp-nn sources (checkouts or a project's managed_components/), or set "
        "IDF_COMPONENT_LOCAL_STORAGE_URL=file:///path/to/mirror (a mirror made with "
        "`compote registry sync`)",
    )
