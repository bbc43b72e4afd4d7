"""Build a generated project with PlatformIO (``pio run``), ESP-IDF (``idf.py build``) or the sim packer.

The tool runs through :mod:`harness.firmware.toolrun`; the artifacts' flash offsets come from the
*resolved* configuration (``sdkconfig`` + the built partition table); the export to
``<project>/esp-check/build/`` and the build cache are docs/firmware.md "esp-check build".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from harness import __version__
from harness.chips import CHIPS, CONSOLE_BAUD
from harness.errors import BuildError, PlatformUnreachableError, UsageError
from harness.firmware import sdkconfig as sdkconfig_fmt
from harness.firmware.boards import BUILDERS
from harness.firmware.cache import (
    DEFAULT_MAX_BYTES,
    BuildCache,
    BuildMeta,
    CacheEntry,
    default_cache_dir,
    native_root,
)
from harness.firmware.generate import DATA_DIR, PIO_ENV
from harness.firmware.native.driver import build_program
from harness.firmware.native.project import NativeOptions, plan_native_build
from harness.firmware.toolrun import run_streaming as _run_streaming
from harness.flashfmt import otadata
from harness.flashfmt.model_image import MODEL_IMAGE, PARTITION_LABEL
from harness.flashfmt.partitions import (
    DATA,
    OTADATA,
    Partition,
    app_partition,
    find,
    pack_partition_table,
    read_partitions_csv,
    table_rows,
)
from harness.manifest import MANIFEST_NAME, Manifest, read_manifest, write_manifest
from harness.protocol.app_image import APP_NAME, slot_sha256
from harness.resources import atomic_write

# 2: the sim packer's bootloader carries the partition table offset; 3: ESP-IDF build directory
# layout, the ELF and config/sdkconfig.json are cached; 4: the model image is data (never cached, not in
# the key), apps go to their OTA slot
CACHE_FORMAT = 5  # 5: a cache entry names its files as the build directory does (LAYOUT's file names)
BUILD_SUBDIR = f"{DATA_DIR}/build"
LOG_NAME = "build.log"
FLASHER_ARGS = "flasher_args.json"
FLASH_ARGS = "flash_args"  # the same as esptool's @file argument list (ESP-IDF writes one too)
# A build's files in the exported build directory, which follows ESP-IDF's layout (docs/firmware.md
# "esp-check build": exactly one .bin at the top, the app, since pytest-embedded-idf takes the first it
# lists); a cache entry holds them flat, by their file names (the model image is data, never cached)
LAYOUT = {
    "bootloader": "bootloader/bootloader.bin",
    "partition-table": "partition_table/partition-table.bin",
    "otadata": "ota_data/ota_data_initial.bin",
    "model": "model/model.bin",
    "app": f"{APP_NAME}.bin",
    "elf": f"{APP_NAME}.elf",
    "sdkconfig_json": "config/sdkconfig.json",
    "prefix_map": "gdbinit/prefix_map",
}
# What ESP-IDF's prefix_map.cmake writes into gdbinit/prefix_map without CONFIG_APP_REPRODUCIBLE_BUILD: gdb
# reads it with --command (pytest-embedded-idf's panic decoding does) and warns when it is missing.
NO_PREFIX_MAP = "# There is no prefix map defined for the project.\n"
PROJECT_DESCRIPTION = "project_description.json"
# Flashed by esptool in a flash-and-compare run; otadata is left alone there (the running app switches
# slots itself, so a repeat run writes nothing), but flasher_args.json lists it for flashing by hand.
RUN_ROLES = ("bootloader", "partition-table", "model", "app")
# Data flashed beside the app but never compiled into it: a new model with the same generated code (the
# same ops, outputs and arena) reuses the built apps. The model image is copied fresh at every build.
_NOT_BUILD_INPUTS = {f"{DATA_DIR}/model.tflite", MODEL_IMAGE}
# Files and directories that are build products or resolved state, not inputs of the build.
_EXCLUDED_DIRS = {".pio", "build", "managed_components", ".git", "__pycache__"}
_EXCLUDED_FILES = {MANIFEST_NAME, "dependencies.lock", ".gitignore"}

_EXTRAS = ("elf", "prefix_map", "sdkconfig_json")  # the build's files that are not flashed
OutputCallback = Callable[[str], None]


class Artifact(NamedTuple):
    """One file to flash: offset, path, role (bootloader, partition-table, otadata, app)."""

    offset: int
    path: Path
    role: str


@dataclass(frozen=True)
class BuildResult:
    """What a build produced and where it goes in flash."""

    project_dir: Path
    builder: str
    artifacts: tuple[Artifact, ...]
    app_bin: Path
    flasher_args: Path
    log_path: Path | None
    cache_hit: bool
    cache_key: str
    firmware_sha256: str
    chip: str
    elf: Path | None = None  # the app's ELF (symbols for backtrace decoding), when the builder made one
    # What the device's HELLO reports for a slot holding this app (protocol.app_image.slot_sha256): computed
    # once when the app is built and kept in the cache entry, so a repeat run's flash skip reads it back
    # ("" unknown: compute it from app_bin)
    app_slot_sha256: str = ""

    def flash_files(self, roles: Sequence[str] | None = None) -> list[tuple[int, Path]]:
        """(offset, file) pairs in offset order, as esptool's write-flash takes them (``roles``: only
        those roles)."""
        return [(a.offset, a.path) for a in sorted(self.artifacts) if roles is None or a.role in roles]

    def artifact(self, role: str) -> Artifact | None:
        return next((a for a in self.artifacts if a.role == role), None)


def parse_sdkconfig(text: str) -> dict[str, str]:
    """The symbols a (resolved) sdkconfig defines (:func:`harness.firmware.sdkconfig.defined`), strings
    without their quotes."""
    symbols = sdkconfig_fmt.defined(sdkconfig_fmt.parse(text).symbols)
    return {key: sdkconfig_fmt.unquote(value) for key, value in symbols.items()}


def sdkconfig_json(text: str) -> dict[str, bool | int | str]:
    """An sdkconfig as ESP-IDF's ``config/sdkconfig.json`` has it: names without ``CONFIG_``, ``y`` and
    ``n`` (``is not set``) as booleans, strings as strings, decimal and hex numbers as integers."""
    out: dict[str, bool | int | str] = {}
    for key, value in sdkconfig_fmt.parse(text).symbols.items():
        name = key[len("CONFIG_") :]
        if value in ("y", "n"):
            out[name] = value == "y"
        elif sdkconfig_fmt.is_string(value):
            out[name] = sdkconfig_fmt.unquote(value)
        elif re.fullmatch(r"-?\d+", value):
            out[name] = int(value)
        elif re.fullmatch(r"0[xX][0-9a-fA-F]+", value):
            out[name] = int(value, 16)
        else:
            out[name] = value
    return out


def project_files(project_dir: Path) -> dict[str, str]:
    """Relative path -> sha256 of every input file of the build (not build products, not resolved state)."""
    out: dict[str, str] = {}
    for root, dirs, files in os.walk(project_dir):
        rel_root = Path(root).relative_to(project_dir)
        dirs[:] = sorted(
            d for d in dirs if d not in _EXCLUDED_DIRS and (rel_root / d).as_posix() != BUILD_SUBDIR
        )
        for name in sorted(files):
            rel = (rel_root / name).as_posix()
            if name in _EXCLUDED_FILES or (
                name.startswith("sdkconfig") and not name.startswith("sdkconfig.defaults")
            ):
                continue
            if name.endswith((".log", ".lock", ".tmp")) or rel in _NOT_BUILD_INPUTS:
                continue
            out[rel] = hashlib.sha256((Path(root) / name).read_bytes()).hexdigest()
    return out


def cache_key(project_dir: Path, builder: str, manifest: Manifest) -> str:
    """Hash of everything that changes the binary: rendered files, pinned versions, board, builder."""
    material = {
        "format": CACHE_FORMAT,
        "builder": builder,
        "board": manifest.get("board"),
        "board_def": manifest.get("board_def"),
        "versions": manifest.get("versions"),
        "files": project_files(project_dir),
        # The sim packer is esp-check code: a new esp-check may pack differently.
        "esp_check": __version__ if builder == "sim" else None,
    }
    blob = json.dumps(material, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()


_OFFLINE = re.compile(
    r"You are not connected to the Internet|HTTPClientError|Could not resolve host|"
    r"Temporary failure in name resolution|Name or service not known|Max retries exceeded|"
    r"Failed to establish a new connection|Network is unreachable|ConnectionError|"
    r"Could not find the package with|UnknownPackageError|Cannot establish a connection|"
    r"component registry|getaddrinfo failed",
    re.IGNORECASE,
)
_TOO_LARGE = re.compile(
    r"partition is too small|greater than maximum allowed|will not fit in region|region `[^']*' overflowed|"
    r"does not fit in",
    re.IGNORECASE,
)
_COMPILE = re.compile(r"\berror:|^FAILED:|\*\*\* \[|ninja: build stopped|CMake Error|undefined reference")


def _classify_failure(lines: Sequence[str]) -> tuple[str, str, list[str]]:
    """(what failed, hint, relevant lines) for a failed build log."""
    for pattern, what, hint in (
        (
            _OFFLINE,
            "the build tool could not download the platform, toolchain or components (offline?)",
            "connect to the internet once (downloads are cached in PLATFORMIO_CORE_DIR / the IDF component "
            "cache), or pass --platformio-core-dir pointing at a core directory that already holds "
            "platform espressif32 and its packages",
        ),
        (
            _TOO_LARGE,
            "the firmware is larger than its partition or a memory region",
            "use a smaller model, fewer inputs per firmware, or a board with more flash (the app "
            "partition is set in partitions.csv)",
        ),
        (
            _COMPILE,
            "the firmware did not compile",
            "see the compiler errors above and the full log; if the generated code is at fault, "
            "please report it with the log",
        ),
    ):
        idx = [i for i, ln in enumerate(lines) if pattern.search(ln)]
        if idx:
            # each matching line with the line before it (e.g. "Installing espressif32 ..." + the error)
            keep = sorted({j for i in idx for j in (i - 1, i) if j >= 0 and lines[j].strip()})
            return what, hint, [lines[j] for j in keep][-12:]
    return "the build failed", "see the full log", [ln for ln in lines if ln.strip()][-12:]


# ESP-IDF's nested build paths break on Windows past ~260 characters (MAX_PATH) and with spaces or
# non-ASCII characters in the project or PlatformIO core paths (known limitation of the IDF tooling).
WINDOWS_MAX_BASE_PATH = 80


def check_build_paths(project: Path, core_dir: Path | None, *, platform: str = sys.platform) -> None:
    """Refuse, before a long build fails obscurely, paths that ESP-IDF cannot build from on Windows."""
    if platform != "win32":
        return
    checks = [("project directory", project, "move the project (e.g. --out C:\\esp\\fw)")]
    if core_dir is not None:
        checks.append(("PLATFORMIO_CORE_DIR", core_dir, "pass --platformio-core-dir C:\\pio (short, ASCII)"))
    for label, path, fix in checks:
        text = str(path)
        problems = []
        if " " in text:
            problems.append("contains a space")
        if not text.isascii():
            problems.append("contains non-ASCII characters")
        if len(text) > WINDOWS_MAX_BASE_PATH:
            problems.append(f"is {len(text)} characters long (nested build paths exceed Windows' 260 limit)")
        if problems:
            raise BuildError(
                f"the {label} {text} {' and '.join(problems)}: ESP-IDF cannot build from there on Windows",
                hint=fix,
            )


def _windows_core_dir(env: Mapping[str, str], explicit: str | Path | None) -> Path:
    if explicit is not None:
        return Path(explicit)
    if env.get("PLATFORMIO_CORE_DIR"):
        return Path(env["PLATFORMIO_CORE_DIR"])
    return Path(env.get("USERPROFILE", str(Path.home()))) / ".platformio"


def _tool_failed(tool: str, rc: int, tail: list[str], log_path: Path) -> BuildError:
    what, hint, relevant = _classify_failure(tail)
    shown = "\n".join("  " + ln for ln in relevant)
    offline = any(_OFFLINE.search(ln) for ln in relevant)
    return (PlatformUnreachableError if offline else BuildError)(
        f"{tool} failed (exit code {rc}): {what}\n{shown}\nFull log: {log_path}", hint=hint
    )


def _build_pio(
    job: _BuildJob, pio: str | Path | None, platformio_core_dir: str | Path | None
) -> tuple[dict[str, Path], dict[str, str]]:
    project, env = job.project, job.env
    exe = job.find(
        pio,
        ("pio", "platformio"),
        "PlatformIO (`pio`) is not installed or not on PATH",
        hint="pip install platformio (it is an esp-check dependency), or pass --pio PATH",
    )
    check_build_paths(project, _windows_core_dir(env, platformio_core_dir))
    if platformio_core_dir is not None:
        env["PLATFORMIO_CORE_DIR"] = str(platformio_core_dir)
    resolved = project / f"sdkconfig.{PIO_ENV}"
    defaults = project / "sdkconfig.defaults"
    if resolved.exists() and defaults.exists() and resolved.stat().st_mtime < defaults.stat().st_mtime:
        resolved.unlink()  # PlatformIO would keep the stale resolved configuration
    job.run("pio run", [exe, "run", "-d", str(project), "-e", PIO_ENV])
    out = project / ".pio" / "build" / PIO_ENV
    files = {
        "app": out / "firmware.bin",
        "bootloader": out / "bootloader.bin",
        "partition-table": out / "partitions.bin",
        "otadata": out / "ota_data_initial.bin",
        "elf": out / "firmware.elf",
        "sdkconfig_json": out / "config" / "sdkconfig.json",  # ESP-IDF's confgen output, when there
        "prefix_map": out / "gdbinit" / "prefix_map",
        "sdkconfig": resolved,
    }
    return files, _read_sdkconfig(resolved)


def _build_idf(job: _BuildJob, idf_py: str | Path | None) -> tuple[dict[str, Path], dict[str, str]]:
    project = job.project
    exe = job.find(
        idf_py,
        ("idf.py",),
        "ESP-IDF's idf.py is not on PATH",
        hint="install ESP-IDF 5.x and run `. $IDF_PATH/export.sh` first, or pass --idf-py PATH",
    )
    check_build_paths(project, None)
    build = project / "build"
    job.run("idf.py build", [exe, "-C", str(project), "-B", str(build), f"-DIDF_TARGET={job.chip}", "build"])
    # ESP-IDF's build directory is what the export copies (LAYOUT), but for otadata at its top
    files = {role: build / rel for role, rel in LAYOUT.items() if role not in ("otadata", "model")}
    files |= {"otadata": build / "ota_data_initial.bin", "sdkconfig": project / "sdkconfig"}
    # ESP-IDF's own flasher_args.json names the app file; prefer it when present.
    with contextlib.suppress(OSError, ValueError, AttributeError):
        idf_args = json.loads((build / FLASHER_ARGS).read_text(encoding="utf-8"))
        app_file = idf_args.get("app", {}).get("file")
        if isinstance(app_file, str) and ".." not in Path(app_file).parts:
            files["app"] = build / app_file
            files["elf"] = (build / app_file).with_suffix(".elf")
    return files, _read_sdkconfig(project / "sdkconfig")


def _build_sim(job: _BuildJob) -> dict[str, Path]:
    # lazy: keeps the simulated board (~180 ms: esptool, pydantic, the resident app) off a real board's build
    from harness.sim.image import SIM_FILES, build_sim_firmware

    sim_dir = job.out_dir / "sim"
    roles = {name: role for role, name in SIM_FILES.items()}  # the model image is the project's: not in it
    packed = [
        (offset, path) for offset, path in build_sim_firmware(job.project, sim_dir) if path.name in roles
    ]
    files = {roles[path.name]: path for _offset, path in packed}
    elf = files["app"].with_suffix(".elf")
    if elf.is_file():
        files["elf"] = elf
    files["sdkconfig_json"] = _sim_sdkconfig_json(job, sim_dir)
    with job.log.open("a", encoding="utf-8") as log:
        for offset, path in packed:
            line = f"sim: packed {path.name} for offset 0x{offset:x}"
            log.write(line + "\n")
            if job.on_output:
                job.on_output(line)
    return files


def _sim_sdkconfig_json(job: _BuildJob, out: Path) -> Path:
    """config/sdkconfig.json for a sim build: the project's sdkconfig.defaults (no Kconfig resolution runs)
    plus the resolved symbols tools look for (target, its architecture, the flash size)."""
    try:
        text = (job.project / "sdkconfig.defaults").read_text(encoding="utf-8")
    except OSError:
        text = ""
    doc = sdkconfig_json(text)
    doc["IDF_TARGET"] = job.chip
    doc[f"IDF_TARGET_{job.chip.upper()}"] = True
    doc[f"IDF_TARGET_ARCH_{CHIPS[job.chip].arch.upper()}"] = True
    chosen = (k.split("_")[-1] for k, v in doc.items() if k.startswith("ESPTOOLPY_FLASHSIZE_") and v is True)
    size = next(chosen, job.board_def.get("flash_size"))
    if size:
        doc["ESPTOOLPY_FLASHSIZE"] = str(size)
    return _write_sdkconfig_json(out / "sdkconfig.json", doc)


def _write_sdkconfig_json(path: Path, doc: Mapping[str, object]) -> Path:
    """Write ``doc`` as config/sdkconfig.json (sorted keys, four-space indent)."""
    atomic_write(path, json.dumps(doc, indent=4, sort_keys=True) + "\n", durable=False)
    return path


def _read_sdkconfig(path: Path) -> dict[str, str]:
    try:
        return parse_sdkconfig(path.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return {}


def _layout(
    job: _BuildJob, files: Mapping[str, Path], sdkconfig: Mapping[str, str]
) -> list[tuple[str, int, Path]]:
    """(role, offset, source file) for what must be flashed; checks the app fits its partition. Where
    each offset comes from: docs/firmware.md "esp-check build" (the sim packer places its files by the same
    rules); the app's partition: :func:`app_partition`."""
    for role in ("app", "bootloader", "partition-table"):
        if role not in files or not files[role].is_file():
            raise BuildError(
                f"the build finished but its {role} binary is missing ({files.get(role)})",
                hint="see the build log; delete .pio/ or build/ in the project and build again",
            )
    try:
        boot_off = int(sdkconfig["CONFIG_BOOTLOADER_OFFSET_IN_FLASH"], 0)
    except (KeyError, ValueError):
        boot_off = CHIPS[job.chip].bootloader_offset
    try:
        pt_off = int(sdkconfig["CONFIG_PARTITION_TABLE_OFFSET"], 0)
    except (KeyError, ValueError):
        if job.table_offset is None:
            raise BuildError(
                "neither the resolved sdkconfig (CONFIG_PARTITION_TABLE_OFFSET) nor the project manifest "
                "(board_def.partition_table_offset) says where the partition table goes",
                hint="regenerate the project with this esp-check version and build again",
            ) from None
        pt_off = job.table_offset
    table = table_rows(files["partition-table"].read_bytes())
    where = f"the built partition table {files['partition-table']}"
    app_part = app_partition(table, job.variant, where, app_bytes=files["app"].stat().st_size)
    layout = [
        ("bootloader", boot_off, files["bootloader"]),
        ("partition-table", pt_off, files["partition-table"]),
    ]
    ota = find(table, DATA, OTADATA)
    if ota is not None and "otadata" in files and files["otadata"].is_file():
        layout.append(("otadata", ota.offset, files["otadata"]))
    layout.append(("app", app_part.offset, files["app"]))
    return layout + _model_layout(table, job.project)


def _note_cache_hit(log: Path, on_output: OutputCallback | None, key: str, root: Path, tool: str) -> None:
    with log.open("a", encoding="utf-8") as f:
        f.write(f"cache hit {key} ({root}): {tool} not run\n")
    if on_output:
        on_output(f"cache hit {key[:12]}: {tool} not run")


def _cached_files(entry: CacheEntry, project: Path) -> dict[str, Path]:
    """A cache hit's files by role; the model image is data, not a build product: always the project's."""
    stored = [*entry.meta["offsets"], *entry.meta.get("extras", [])]
    files = {role: entry.path / Path(LAYOUT[role]).name for role in stored if role != "model"}
    if "model" in entry.meta["offsets"]:
        files["model"] = project / MODEL_IMAGE
    return files


def _model_layout(table: Sequence[Partition], project: Path) -> list[tuple[str, int, Path]]:
    """The model image for the ``model`` data partition (none in a table without one)."""
    part = find(table, DATA, label=PARTITION_LABEL)
    if part is None:
        return []
    image = project / MODEL_IMAGE
    if not image.is_file():
        raise BuildError(f"{image} is missing", hint="regenerate the project with `esp-check generate`")
    if image.stat().st_size > part.size:
        raise BuildError(
            f"the model image ({image.stat().st_size} bytes) is larger than the '{part.label}' partition "
            f"({part.size} bytes)",
            hint="regenerate the project: generate refuses models the board cannot hold",
        )
    return [("model", part.offset, image)]


def _extras(files: Mapping[str, Path], out_dir: Path) -> dict[str, Path]:
    """The build's non-flashed outputs tools want: the ELF and config/sdkconfig.json (written from the
    resolved sdkconfig when the builder did not leave one)."""
    out = {role: files[role] for role in _EXTRAS if role in files and files[role].is_file()}
    resolved = files.get("sdkconfig")
    if "sdkconfig_json" not in out and resolved is not None and resolved.is_file():
        doc = sdkconfig_json(resolved.read_text(encoding="utf-8", errors="replace"))
        out["sdkconfig_json"] = _write_sdkconfig_json(out_dir / LAYOUT["sdkconfig_json"], doc)
    return out


def _select_own_slot(artifacts: Sequence[Artifact], variant: str) -> None:
    """Make the build directory's ``ota_data_initial.bin`` boot the app it holds (erased for ``ota_0``, an
    entry selecting ``ota_1`` for the ANSI C app): ESP-IDF's and PlatformIO's own file is always erased, so
    flashing the ANSI C build directory on its own would boot whatever sits in ``ota_0``."""
    ota = next((a for a in artifacts if a.role == "otadata"), None)
    table = next((a for a in artifacts if a.role == "partition-table"), None)
    if ota is None or table is None:
        return
    parts = table_rows(table.path.read_bytes())
    app = app_partition(parts, variant, str(table.path))
    if app.is_ota_app:  # a factory app boots from the tool's erased otadata
        ota.path.write_bytes(otadata.initial_for(parts, app, ota.path.stat().st_size))


def _place(src: Path, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.resolve() != dest.resolve():
        shutil.copyfile(src, dest)
    return dest


def project_description(
    project: Path, out_dir: Path, manifest: Manifest, chip: str, elf: Path | None
) -> dict[str, object]:
    """The fields of ESP-IDF's project_description.json that tools read (monitor, test runners), for
    the exported build directory (paths in it, files relative to it)."""
    baud = (manifest.get("board_def") or {}).get("monitor_baud")
    return {
        "project_name": APP_NAME,
        "project_version": str(manifest.get("template_version") or "0.0.0"),
        "project_path": str(project),
        "build_dir": str(out_dir),
        "target": chip,
        "build_type": "flash_app",
        "app_bin": LAYOUT["app"],
        "app_elf": LAYOUT["elf"] if elf is not None else "",
        "config_file": str(out_dir / LAYOUT["sdkconfig_json"]),
        "monitor_baudrate": baud if isinstance(baud, int) and baud else CONSOLE_BAUD,
        "monitor_toolprefix": CHIPS[chip].toolprefix,
        "generated_by": f"esp-check {__version__} (builder {manifest.get('builder') or 'pio'})",
    }


def flasher_args(
    artifacts: Sequence[Artifact], sdkconfig: Mapping[str, str], chip: str, flash_size: str, base: Path
) -> dict[str, Any]:
    """An ESP-IDF style flasher_args.json (paths relative to ``base``, the file's directory)."""
    mode = sdkconfig.get("CONFIG_ESPTOOLPY_FLASHMODE", "keep") or "keep"
    freq = sdkconfig.get("CONFIG_ESPTOOLPY_FLASHFREQ", "keep") or "keep"
    size = sdkconfig.get("CONFIG_ESPTOOLPY_FLASHSIZE", flash_size) or flash_size
    data: dict[str, Any] = {
        "write_flash_args": ["--flash-mode", mode, "--flash-freq", freq, "--flash-size", size],
        "flash_settings": {"flash_mode": mode, "flash_freq": freq, "flash_size": size},
        "flash_files": {hex(a.offset): a.path.relative_to(base).as_posix() for a in sorted(artifacts)},
    }
    for a in artifacts:
        rel = a.path.relative_to(base).as_posix()
        data[a.role] = {"offset": hex(a.offset), "file": rel, "encrypted": "false"}
    esptool = {"after": "hard-reset", "before": "default-reset", "stub": True, "chip": chip}
    return {**data, "extra_esptool_args": esptool}


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _resolved_components(project: Path) -> dict[str, object] | None:
    """The component manager's dependencies.lock (what versions the build really resolved), if any."""
    path = project / "dependencies.lock"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    try:
        import yaml  # lazy: ~10 ms, read only after a fresh ESP-IDF build, never on a cached one

        data = yaml.safe_load(text)
        deps = data.get("dependencies", {}) if isinstance(data, dict) else {}
        versions = {
            str(n): str(i["version"]) for n, i in deps.items() if isinstance(i, dict) and "version" in i
        }
    except Exception:
        versions = {}
    return {"dependencies_lock": text, "components": versions}


def _record_resolved(project: Path, resolved: dict[str, object]) -> None:
    """Record what the build resolved in the project's manifest (read again: the generator may have
    rewritten it since the build began)."""
    write_manifest(project, {**read_manifest(project), "resolved": resolved})


def _finish(job: _BuildJob, files: Mapping[str, Path], meta: BuildMeta, *, hit: bool) -> BuildResult:
    """Write the build directory (ESP-IDF's layout, see LAYOUT) from a build's or a cache entry's files."""
    project, out_dir, manifest, chip = job.project, job.out_dir, job.manifest, job.chip
    offsets: dict[str, int] = {str(k): int(v) for k, v in meta["offsets"].items()}
    # an earlier build's top-level images and ELFs (or an older esp-check's flat layout) go: tools take the
    # first *.bin / *.elf they find at the top of a build directory
    for path in out_dir.iterdir():
        if path.is_file() and path.suffix in (".bin", ".elf"):
            path.unlink()
    artifacts = sorted(
        Artifact(off, _place(files[role], out_dir / LAYOUT[role]), role) for role, off in offsets.items()
    )
    _select_own_slot(artifacts, job.variant)
    extras = {role: _place(files[role], out_dir / LAYOUT[role]) for role in _EXTRAS if role in files}
    elf = extras.get("elf")
    if "prefix_map" not in extras:  # sim, or a build that wrote none: ESP-IDF's file for that case
        atomic_write(out_dir / LAYOUT["prefix_map"], NO_PREFIX_MAP, durable=False)
    flash_size = str(job.board_def.get("flash_size") or "keep")
    args = flasher_args(artifacts, meta.get("sdkconfig", {}), chip, flash_size, out_dir)
    fa_path = out_dir / FLASHER_ARGS
    fa_path.write_text(json.dumps(args, indent=4) + "\n", encoding="utf-8")
    lines = [" ".join(args["write_flash_args"])]
    lines += [f"{hex(a.offset)} {a.path.relative_to(out_dir).as_posix()}" for a in artifacts]
    (out_dir / FLASH_ARGS).write_text("\n".join(lines) + "\n", encoding="utf-8")
    description = project_description(project, out_dir, manifest, chip, elf)
    (out_dir / PROJECT_DESCRIPTION).write_text(json.dumps(description, indent=4) + "\n", encoding="utf-8")
    resolved = meta.get("resolved")
    if resolved is not None:
        _record_resolved(project, resolved)
    app = out_dir / LAYOUT["app"]
    return BuildResult(
        project_dir=project,
        builder=job.builder,
        artifacts=tuple(artifacts),
        app_bin=app,
        flasher_args=fa_path,
        log_path=job.log,
        cache_hit=hit,
        cache_key=job.key,
        firmware_sha256=meta["app_slot"]["sha256"],  # of these very bytes: see _app_slot_kept, _build_meta
        chip=chip,
        elf=elf,
        app_slot_sha256=meta["app_slot"]["slot_sha256"],
    )


def _app_slot(app: Path, chip: str) -> dict[str, str]:
    """What the cache keeps of an app image for the flash skip: its file's SHA-256 and what HELLO reports
    for a slot holding it (esptool's image parser, run once per build instead of on every run)."""
    data = app.read_bytes()
    return {"sha256": hashlib.sha256(data).hexdigest(), "slot_sha256": slot_sha256(data, chip)}


def _app_slot_kept(cache: BuildCache, entry: CacheEntry, files: Mapping[str, Path], chip: str) -> CacheEntry:
    """``entry``, its stored app slot SHA-256 recomputed and rewritten when it is missing (an entry older
    than the field) or was not computed from the entry's app file: once, not on every run."""
    app = files.get("app")
    stored = entry.meta.get("app_slot") or {}
    if app is None or (stored.get("slot_sha256") and stored.get("sha256") == _sha256_file(app)):
        return entry
    return cache.update_meta(entry, {"app_slot": _app_slot(app, chip)})


def _chip_and_builder(project: Path, manifest: Manifest, builder: str | None) -> tuple[str, str]:
    """The project's chip and the builder to use; UsageError for an unknown chip or a builder the board
    cannot use (``builder`` None: the board's own)."""
    board_def = manifest.get("board_def") or {}
    chip = str(manifest.get("chip") or board_def.get("chip") or "")
    if chip not in CHIPS:
        raise UsageError(f"{project / MANIFEST_NAME}: unknown chip {chip!r}", hint="regenerate the project")
    board_name = str(manifest.get("board"))
    default_builder = str(manifest.get("builder") or "pio")
    chosen = builder or default_builder
    if chosen not in BUILDERS:
        raise UsageError(f"unknown builder {chosen!r}", hint=f"builders: {', '.join(BUILDERS)}")
    special = ("sim", "native")  # builders that work only for their own kind of board
    if any((chosen == b) != (default_builder == b) for b in special):
        raise UsageError(
            f"board {board_name} cannot be built with builder {chosen!r}",
            hint="the simulated board builds only with 'sim', native boards only with 'native', real boards "
            "only with 'pio' or 'idf'",
        )
    if chosen == "pio" and (chip == "esp32p4" or not board_def.get("pio_board")):
        raise UsageError(
            f"board {board_name} ({chip}) cannot be built with PlatformIO's platform-espressif32",
            hint="use --builder idf (ESP-IDF idf.py)",
        )
    return chip, chosen


def build_project(
    project_dir: str | Path,
    *,
    builder: str | None = None,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
    max_cache_bytes: int = DEFAULT_MAX_BYTES,
    platformio_core_dir: str | Path | None = None,
    pio: str | Path | None = None,
    idf_py: str | Path | None = None,
    log_path: str | Path | None = None,
    on_output: OutputCallback | None = None,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    native: NativeOptions | None = None,
) -> BuildResult:
    """Build one generated project (or reuse a cached build of identical inputs).

    ``builder`` defaults to the board's (manifest ``builder``). Errors: UsageError for a builder the
    board cannot use; BuildError (exit 3) for a missing tool, offline downloads, compile errors, or an
    app larger than its partition -- each naming the log file. ``native``: native boards' builds.
    """
    project = Path(project_dir).resolve()
    manifest = read_manifest(project)
    chip, chosen = _chip_and_builder(project, manifest, builder)
    out_dir = project / BUILD_SUBDIR
    out_dir.mkdir(parents=True, exist_ok=True)
    log = Path(log_path) if log_path is not None else out_dir / LOG_NAME
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"esp-check {__version__}: building {project} with {chosen}\n", encoding="utf-8")
    cache = BuildCache(cache_dir or default_cache_dir(), max_cache_bytes) if use_cache else None
    env = dict(os.environ if env is None else env)
    key = "" if chosen == "native" else cache_key(project, chosen, manifest)  # native: keyed on its plan
    job = _BuildJob(
        project, manifest, chosen, chip, out_dir, log, key=key, env=env, on_output=on_output, timeout=timeout
    )
    if chosen == "native":
        return _build_native(job, native or NativeOptions(), cache)

    with cache.lock(job.key) if cache is not None else contextlib.nullcontext():
        entry = cache.get(job.key) if cache is not None else None
        if cache is not None and entry is not None:
            _note_cache_hit(log, on_output, job.key, cache.root, "builder")
            files = _cached_files(entry, job.project)
            return _finish(job, files, _app_slot_kept(cache, entry, files, job.chip).meta, hit=True)
        sdk: dict[str, str] = {}
        if chosen == "pio":
            built, sdk = _build_pio(job, pio=pio, platformio_core_dir=platformio_core_dir)
        elif chosen == "idf":
            built, sdk = _build_idf(job, idf_py=idf_py)
        else:
            built = _build_sim(job)
        files, meta = _build_meta(job, built, sdk)
        if cache is not None:
            products = {Path(LAYOUT[role]).name: path for role, path in files.items() if role != "model"}
            cache.put(job.key, products, meta)
        return _finish(job, files, meta, hit=False)


@dataclass(frozen=True)
class _BuildJob:
    """One build_project call: the project, its manifest, the builder, where results go and where the
    builder runs (its environment, the build log, progress and time limit)."""

    project: Path
    manifest: Manifest
    builder: str
    chip: str
    out_dir: Path
    log: Path
    key: str
    env: dict[str, str]
    on_output: OutputCallback | None
    timeout: float | None

    @property
    def variant(self) -> str:
        return self.manifest["variant"]

    @property
    def board_def(self) -> dict[str, object]:
        return self.manifest.get("board_def") or {}

    @property
    def table_offset(self) -> int | None:
        """The board's partition table offset as the manifest records it (None: not recorded)."""
        raw = self.board_def.get("partition_table_offset")
        return raw if isinstance(raw, int) and not isinstance(raw, bool) else None

    def find(self, explicit: str | Path | None, names: Sequence[str], missing: str, hint: str) -> str:
        """The builder's executable (an explicit path or name, else the first of ``names`` on PATH)."""
        path = self.env.get("PATH")
        if explicit is not None:
            given = Path(explicit)  # made absolute: the builder runs in the project, not here
            exe = str(given.absolute()) if given.is_file() else shutil.which(str(explicit), path=path)
        else:
            exe = next((found for name in names if (found := shutil.which(name, path=path))), None)
        if exe is None:
            raise BuildError(missing, hint=hint)
        return exe

    def run(self, tool: str, cmd: list[str]) -> None:
        """Run a builder in the project, its output streamed to the log; a failure is a BuildError that
        names what broke (PlatformUnreachableError when the builder could not download)."""
        rc, tail = _run_streaming(
            cmd,
            cwd=self.project,
            env=self.env,
            log_path=self.log,
            on_output=self.on_output,
            timeout=self.timeout,
        )
        if rc != 0:
            raise _tool_failed(tool, rc, tail, self.log)


_SDKCONFIG_KEPT = (
    "CONFIG_ESPTOOLPY_",
    "CONFIG_PARTITION_TABLE_",
    "CONFIG_BOOTLOADER_OFFSET",
    "CONFIG_NN_",
    "CONFIG_IDF_TARGET",
)


def _build_meta(
    job: _BuildJob, files: Mapping[str, Path], sdk: Mapping[str, str]
) -> tuple[dict[str, Path], BuildMeta]:
    """What the cache keeps beside the images: offsets, the flash-relevant sdkconfig, versions."""
    layout = _layout(job, files, sdk)
    meta: BuildMeta = {
        "offsets": {role: off for role, off, _ in layout},
        "sdkconfig": {k: v for k, v in sdk.items() if k.startswith(_SDKCONFIG_KEPT)},
        "resolved": _resolved_components(job.project),
        "builder": job.builder,
        "board": str(job.manifest.get("board")),
    }
    if "app" in files:
        meta["app_slot"] = _app_slot(files["app"], job.chip)
    extras = _extras(files, job.out_dir)
    meta["extras"] = sorted(extras)
    return {role: path for role, _, path in layout} | extras, meta


# --------------------------------------------------------------------------------------------
# native target (docs/native.md): a host program instead of flash images

NATIVE_PROGRAM = "native_app"
NATIVE_INFO = "native.json"


def _build_native(job: _BuildJob, options: NativeOptions, cache: BuildCache | None) -> BuildResult:
    """Build a native board's project into ``esp-check/build/native_app`` (cached like the other builders,
    keyed on the project files and the native library key: sources, compiler, flags)."""
    project, manifest, out_dir, log = job.project, job.manifest, job.out_dir, job.log
    root = native_root(cache.root) if cache is not None else out_dir / "native-work"
    plan = plan_native_build(project, manifest, options, root=root, log_path=log, on_output=job.on_output,
                             timeout=job.timeout, env=job.env)  # fmt: skip
    files = project_files(project)
    material = {"format": CACHE_FORMAT, "builder": "native", "files": files, "native": plan.key}
    key = hashlib.sha256(json.dumps(material, sort_keys=True).encode("utf-8")).hexdigest()
    program = out_dir / NATIVE_PROGRAM
    meta: BuildMeta = {"offsets": {"app": 0}, "builder": "native", "native": plan.describe()}
    hit = False
    with cache.lock(key) if cache is not None else contextlib.nullcontext():
        entry = cache.get(key) if cache is not None else None
        if entry is not None:
            shutil.copy2(entry.path / NATIVE_PROGRAM, program)
            hit = True
            _note_cache_hit(log, job.on_output, key, root.parent, "compiler")  # root: <cache>/native
        else:
            built = build_program(plan, program, log_path=log, on_output=job.on_output, timeout=job.timeout,
                                  jobs=options.jobs, env=job.env)  # fmt: skip
            meta["native"]["reused_libraries"] = built.reused_tree
            if cache is not None:
                cache.put(key, {NATIVE_PROGRAM: program}, meta)
    program.chmod(program.stat().st_mode | 0o111)
    versions = {c.name.replace("__", "/"): c.version or "unknown" for c in plan.components}
    _record_resolved(project, {"dependencies_lock": None, "components": versions, "native": True})
    artifacts = _native_layout(job, program)
    info_path = out_dir / NATIVE_INFO
    sha256 = _sha256_file(program)
    info = {"program": program.name, "sha256": sha256, "cache_hit": hit, **meta["native"]}
    info["flash"] = {a.role: {"offset": hex(a.offset), "file": a.path.relative_to(out_dir).as_posix()}
                     for a in artifacts}  # fmt: skip
    info_path.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return BuildResult(
        project_dir=project,
        builder="native",
        artifacts=tuple(artifacts),
        app_bin=program,
        flasher_args=info_path,
        log_path=log,
        cache_hit=hit,
        cache_key=key,
        firmware_sha256=sha256,
        chip=job.chip,
        app_slot_sha256=sha256,  # a host program, not an ESP image: its stand-in reports the file's hash
    )


def _native_layout(job: _BuildJob, program: Path) -> list[Artifact]:
    """What a native board's "flash" takes, at the offsets a chip would: the partition table packed from
    the project's partitions.csv, blank otadata, the program in its variant's app slot (the native board
    keeps host programs beside its flash image: one does not fit a chip's slot) and the model image in
    the model partition. A project without a partition table (an older template) is the program alone."""
    project, out_dir = job.project, job.out_dir
    csv_path = project / "partitions.csv"
    if not csv_path.is_file():
        return [Artifact(0, program, "app")]
    table = read_partitions_csv(csv_path)
    table_off = job.table_offset or 0x8000
    table_path = out_dir / LAYOUT["partition-table"]
    atomic_write(table_path, pack_partition_table(table), durable=False)
    app = app_partition(table, job.variant, str(csv_path))
    out = [Artifact(table_off, table_path, "partition-table"), Artifact(app.offset, program, "app")]
    ota = find(table, DATA, OTADATA)
    if ota is not None:
        ota_path = out_dir / LAYOUT["otadata"]
        atomic_write(ota_path, otadata.initial_for(table, app, ota.size), durable=False)
        out.append(Artifact(ota.offset, ota_path, "otadata"))
    for _role, offset, image in _model_layout(table, project):
        out.append(Artifact(offset, _place(image, out_dir / LAYOUT["model"]), "model"))
    return sorted(out)
