"""Build a main component and its component sources into a host program, with the ESP-IDF stand-ins.

The components' own ``CMakeLists.txt`` files are built by real CMake through the build-system
stand-in (``standins/idf_standins.cmake``), the way ESP-IDF builds them, in one cached CMake tree per
library key, with one lock per tree; the main component is swapped into that tree per build
(docs/native.md "Cache" says what the key covers).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import filelock

from harness.errors import BuildError
from harness.firmware.native.components import ComponentSource, copy_once, tree_sha256
from harness.firmware.native.config import idf_api_h, sdkconfig_cmake, sdkconfig_h
from harness.firmware.native.toolchain import Toolchain
from harness.firmware.toolrun import NOTE, OutputCallback, run_streaming
from harness.resources import write_if_changed

STANDINS_DIR = Path(__file__).resolve().parent / "standins"
TREE_FORMAT = 1
PROGRAM = "esp_check_native_app"
_ERROR_LINE = re.compile(
    r"\berror:|^FAILED:|CMake Error|undefined reference|ld returned|\*\*\* \[|ninja: build stopped|"
    r"cannot find -l|fatal error"
)


@dataclass(frozen=True)
class NativePlan:
    """Everything a native build is made of: a main component, its component sources, their configuration
    and the toolchain; ``key`` (:func:`tree_key`) names the compiled libraries."""

    main_dir: Path
    components: tuple[ComponentSource, ...]  # snapshotted (content-hashed)
    config: dict[str, str]
    toolchain: Toolchain
    idf_version: str
    root: Path  # the cache root its library trees live under
    key: str
    warnings: tuple[str, ...] = ()
    # the component manager's lock the components came from (main's CMakeLists reads versions there first)
    dependencies_lock: Path | None = None

    def describe(self) -> dict[str, Any]:
        """Provenance for manifests and reports."""
        return {
            "library_key": self.key,
            "host": self.toolchain.machine,
            "bits": self.toolchain.bits,
            "sanitize": self.toolchain.sanitize_label,
            "compiler": self.toolchain.version,
            "components": [c.describe() for c in self.components],
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True)
class NativeProgram:
    """A built host program."""

    path: Path
    reused_tree: bool  # the libraries were already built in this tree (only main/ compiled)


def standins_sha256() -> str:
    """Content hash of what is compiled from the stand-ins (headers, sources, CMake files): a new
    esp-check with different stand-ins gets new trees; their README does not count."""
    h = hashlib.sha256()
    for rel in ("CMakeLists.txt", "idf_standins.cmake", "include", "src"):
        path = STANDINS_DIR / rel
        digest = tree_sha256(path).encode() if path.is_dir() else hashlib.sha256(path.read_bytes()).digest()
        h.update(rel.encode() + b"\0" + digest)
    return h.hexdigest()


def tree_key(
    components: Sequence[ComponentSource], config: Mapping[str, str], idf_version: str, toolchain: Toolchain
) -> str:
    """The library key: everything that changes the compiled components, and nothing of main/."""
    if any(not c.sha256 for c in components):
        raise ValueError("components must be snapshotted (content-hashed) before they are keyed")
    material = {
        "format": TREE_FORMAT,
        "standins": standins_sha256(),
        "toolchain": toolchain.identity(),
        "config": dict(config),
        "idf_version": idf_version,
        "components": [[c.name, c.sha256] for c in components],
    }
    blob = json.dumps(material, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()


def configure_command(
    toolchain: Toolchain,
    tree: Path,
    main_dir: Path,
    components: Sequence[ComponentSource],
    dependencies_lock: Path | None = None,
    standins: Path | None = None,
) -> list[str]:
    """The ``cmake`` configure argument list for one tree (no shell; lists joined with ``;``);
    ``dependencies_lock`` as :attr:`NativePlan.dependencies_lock`. ``standins``: the tree's own copy of
    the stand-ins (:func:`build_program` makes it); the installed package's directory when not given."""
    comps = ";".join(f"{c.name}={c.path}" for c in components)
    return [
        toolchain.cmake,
        "-S",
        str(standins or STANDINS_DIR),
        "-B",
        str(tree / "build"),
        "-G",
        toolchain.generator,
        f"-DCMAKE_C_COMPILER={toolchain.cc}",
        f"-DCMAKE_CXX_COMPILER={toolchain.cxx}",
        f"-DCMAKE_C_FLAGS={' '.join(toolchain.common_flags)}",
        f"-DCMAKE_CXX_FLAGS={' '.join(toolchain.cxx_flags)}",
        f"-DCMAKE_EXE_LINKER_FLAGS={' '.join(toolchain.common_flags)}",
        "-DCMAKE_BUILD_TYPE=",
        f"-DESP_CHECK_CONFIG_DIR={tree / 'config'}",
        f"-DESP_CHECK_COMPONENTS={comps}",
        f"-DESP_CHECK_MAIN_DIR={main_dir}",
        f"-DESP_CHECK_PROJECT_DIR={main_dir.parent}",
        f"-DESP_CHECK_DEPENDENCIES_LOCK={dependencies_lock or ''}",
        f"-DESP_CHECK_NATIVE_HOST={toolchain.machine}",
        f"-DESP_CHECK_NATIVE_SANITIZE={toolchain.sanitize_label}",
    ]


def _forget_moved_build(build: Path, source: Path) -> None:
    """Remove a CMake build directory configured from another source directory (trees made before the
    stand-ins were copied into them): CMake refuses to reuse it, so it is configured afresh."""
    cache = build / "CMakeCache.txt"
    try:
        text = cache.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return
    for line in text.splitlines():
        if line.startswith("CMAKE_HOME_DIRECTORY:"):
            if Path(line.split("=", 1)[-1]).resolve() != source.resolve():
                shutil.rmtree(build, ignore_errors=True)
            return


LOCK_WAIT_S = 7200.0
LOCK_NOTE_EVERY_S = 60.0


def _owner(tree: Path) -> str:
    """Who holds ``tree``'s lock, as its holder wrote it (pid, host, command, since when)."""
    try:
        o = json.loads((tree / "tree.lock.owner").read_text(encoding="utf-8"))
        since = time.strftime("%H:%M:%S", time.localtime(float(o["since"])))
        return f"pid {o['pid']} on {o['host']} since {since}: {o['command'][:200]}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that did not say who it is"


@contextlib.contextmanager
def tree_lock(tree: Path, log_path: Path, on_output: OutputCallback | None) -> Iterator[None]:
    """The build tree's lock. A build that has to wait says so, on whose build, in the log and as an
    ``esp-check:`` note (again every minute); the wait is not part of any build time-out. BuildError
    after LOCK_WAIT_S."""
    lock = filelock.FileLock(str(tree / "tree.lock"))
    t0, wait = time.monotonic(), 0.0
    while True:
        try:
            lock.acquire(timeout=wait)
            break
        except filelock.Timeout:
            waited = time.monotonic() - t0
            note = (
                f"{NOTE}waiting for another build of the same native tree ({waited:.0f} s so far): "
                f"{_owner(tree)}; lock {tree / 'tree.lock'}"
            )
            with log_path.open("a", encoding="utf-8") as log:
                log.write(note + "\n")
            if on_output is not None:
                on_output(note)
            wait = LOCK_NOTE_EVERY_S
            if waited > LOCK_WAIT_S:
                raise BuildError(
                    f"another build has held the native build tree {tree} for over {LOCK_WAIT_S:.0f} s: "
                    f"{_owner(tree)}",
                    hint="wait for it to finish, or stop it if it is stuck",
                ) from None
    try:
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        owner["command"] = " ".join(sys.argv)
        write_if_changed(tree / "tree.lock.owner", json.dumps(owner) + "\n")
        yield
    finally:
        lock.release()


def compiler_launcher(env: Mapping[str, str]) -> list[str]:
    """``ccache`` as CMake's compiler launcher when it is on PATH (ESP_CHECK_CCACHE=0 turns it off).

    The optimized and the ANSI C variant are two trees (their sdkconfig.h differ), yet most of
    esp-tflite-micro's sources never read sdkconfig.h: compiled once, they are reused by the other
    tree, the other word size of the same flags, and the next component version's unchanged files."""
    if env.get("ESP_CHECK_CCACHE", "1").lower() in ("0", "no", "off", "false"):
        return []
    found = shutil.which("ccache", path=env.get("PATH"))
    return [f"-DCMAKE_C_COMPILER_LAUNCHER={found}", f"-DCMAKE_CXX_COMPILER_LAUNCHER={found}"] if found else []


def ccache_env(root: Path) -> dict[str, str]:
    """What makes ccache hit across trees: paths under the cache root are hashed relative to the build
    directory (the same from every tree), and the build directory itself is not hashed."""
    return {"CCACHE_BASEDIR": str(root.resolve()), "CCACHE_NOHASHDIR": "1"}


def build_command(toolchain: Toolchain, tree: Path, jobs: int) -> list[str]:
    return [toolchain.cmake, "--build", str(tree / "build"), "--target", PROGRAM, "--parallel", str(jobs)]


def build_program(
    plan: NativePlan,
    out: Path,
    *,
    log_path: Path,
    on_output: OutputCallback | None = None,
    timeout: float | None = None,
    jobs: int | None = None,
    env: Mapping[str, str] | None = None,
) -> NativeProgram:
    """Build the plan's main component (a directory with ``app_main``) with its components into ``out``
    (the libraries reused from the plan's tree when built). BuildError (exit 3) with the compiler's
    errors and the log path when CMake or the compiler fails.
    """
    main_dir, components, config, toolchain = plan.main_dir, plan.components, plan.config, plan.toolchain
    root, idf_version, key = plan.root, plan.idf_version, plan.key
    for path in (main_dir, root, *(c.path for c in components)):
        if any(ch in str(path) for ch in ';"$'):  # CMake list separator / quoting
            raise BuildError(
                f"the native build cannot use the path {path}: it contains ';', '\"' or '$'",
                hint="use --cache-dir / --out / --components-dir paths without those characters",
            )
    tree = root / "trees" / key[:32]
    tree.mkdir(parents=True, exist_ok=True)
    run_env = dict(os.environ if env is None else env)
    n_jobs = jobs or os.cpu_count() or 2
    with tree_lock(tree, log_path, on_output):
        reused = (tree / "built").is_file()
        write_if_changed(tree / "config" / "sdkconfig.h", sdkconfig_h(config))
        write_if_changed(tree / "config" / "sdkconfig.cmake", sdkconfig_cmake(config, idf_version))
        write_if_changed(tree / "config" / "esp_check_idf_api.h", idf_api_h(idf_version))
        about = {
            "key": key,
            "toolchain": toolchain.identity(),
            "components": [c.describe() for c in components],
            "idf_version": idf_version,
        }
        write_if_changed(tree / "esp-check-tree.json", json.dumps(about, indent=2) + "\n")
        # CMake's source directory is the tree's own copy of the stand-ins: CMake remembers it in the build
        # tree, which outlives the esp-check install that made it (a new venv, an upgrade, another checkout
        # with the same stand-ins content has the same key); the key covers the stand-ins' content
        standins = copy_once(STANDINS_DIR, tree / "standins")
        _forget_moved_build(tree / "build", standins)
        what = ", ".join(f"{c.name} {c.version or '(no version)'}" for c in components)
        with log_path.open("a", encoding="utf-8") as log:
            state = "libraries already built, compiling main/" if reused else f"first build: compiling {what}"
            log.write(f"native: tree {tree} ({state})\n")
        configure = configure_command(
            toolchain, tree, main_dir.resolve(), components, plan.dependencies_lock, standins
        )
        if not (tree / "build" / "CMakeCache.txt").is_file():  # a new tree (an old one keeps its setting)
            configure += compiler_launcher(run_env)
        run_env.update(ccache_env(root))
        for argv in (configure, build_command(toolchain, tree, n_jobs)):
            rc, tail = run_streaming(
                argv, cwd=tree, env=run_env, log_path=log_path, on_output=on_output, timeout=timeout
            )
            if rc != 0:
                raise _failed(argv, rc, tail, log_path)
        built = tree / "build" / PROGRAM
        if not built.is_file():
            raise BuildError(f"the native build finished but {built} is missing", hint=f"see {log_path}")
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        shutil.copy2(built, tmp)
        tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR)
        tmp.replace(out)
        (tree / "built").write_text(key + "\n", encoding="utf-8")
    return NativeProgram(out, reused_tree=reused)


def _failed(argv: Sequence[str], rc: int, tail: Sequence[str], log_path: Path) -> BuildError:
    step = (
        "CMake could not configure the native build" if "--build" not in argv else "the native build failed"
    )
    errors = [ln for ln in tail if _ERROR_LINE.search(ln)]
    shown = "\n".join("  " + ln[:300] for ln in (errors or [ln for ln in tail if ln.strip()])[-12:])
    return BuildError(
        f"{step} (exit code {rc}):\n{shown}\nFull log: {log_path}",
        hint="the component sources or the host compiler rejected something; a component that needs "
        "ESP-IDF APIs beyond the stand-ins (docs/native.md) cannot build natively",
    )
