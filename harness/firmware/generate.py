"""Render firmware projects (ESP-NN optimized and ANSI C) from the Jinja templates in ``firmware_templates/``.

What a project holds and why rendering is deterministic: docs/firmware.md "What is in a project". The two
variants differ only in ``CONFIG_NN_OPTIMIZED``/``CONFIG_NN_ANSI_C`` and in their manifest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import inspect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, ParamSpec

from harness import __version__
from harness.chips import CONSOLE_BAUD
from harness.errors import BuildError, EspCheckError, GenerateError
from harness.firmware import sdkconfig
from harness.firmware.boards import Board, load_board
from harness.firmware.hybrid_context import hybrid_firmware_context, render_hybrid_files
from harness.firmware.layout import OTADATA_BYTES, FlashLayout, check_model_fits, flash_layout
from harness.firmware.native.components import tree_sha256
from harness.firmware.tap_context import tap_firmware_context
from harness.flashfmt import otadata
from harness.flashfmt.model_image import HEADER_BYTES, MODEL_IMAGE, pack_model_image
from harness.flashfmt.partitions import OTA_APPS, VARIANT_SLOTS, VARIANTS
from harness.manifest import (
    MANIFEST_NAME,
    MANIFEST_SCHEMA,
    NN_EXPECTED,
    Manifest,
    read_manifest,
    write_manifest,
)
from harness.model.inputs import InputOptions, input_tensor_bytes
from harness.model.loader import ModelInfo, TensorInfo, load_model
from harness.model.opdata import resolver_methods
from harness.protocol.app_image import APP_NAME
from harness.protocol.spec import DTYPES
from harness.resources import (
    data_dir,
    installed_versions,
    parse_toml,
    pinned_versions,
    templates_dir,
    user_cache_dir,
    version_tuple,
    write_if_changed,
)

if TYPE_CHECKING:
    import jinja2

NN_SYMBOL = {"optimized": "CONFIG_NN_OPTIMIZED", "ansi": "CONFIG_NN_ANSI_C"}

# Pinned versions: harness/data/versions.toml [pinned] (platform, tflm, espnn, idf).
DEFAULT_VERSIONS: dict[str, str] = pinned_versions()
PIO_ENV = "esp_check"
DATA_DIR = "esp-check"  # model.tflite and input_<k>.bin copies, build outputs under esp-check/build
HUMAN_MAX = 16
MAIN_STACK_BYTES = 16384
PSRAM_RESERVE_BYTES = 512 * 1024  # PSRAM left for the rest of the system when the arena goes there
KEEP_STORE_BYTES = 256 * 1024  # of that reserve: the kept-input store (docs/protocol.md "Kept inputs")
MAX_INPUTS = 64
# The portable C the firmware compiles next to app_main.cc: text emitter, binary frames, command loop.
PROTO_FILES = tuple(f"esp_check_{name}{ext}" for name in ("proto", "frame", "loop") for ext in (".c", ".h"))
PIO_EXTRA_SCRIPT = f"{DATA_DIR}/pio_flash_model.py"
PIO_BOOT_SCRIPT = f"{DATA_DIR}/pio_boot_slot.py"
# otadata selecting the ANSI C app's slot: what `idf.py flash` / `pio run -t upload` of the ANSI C project
# write instead of the framework's erased otadata (which boots ota_0, the optimized app). The same bytes
# in both projects; the ANSI C project's build picks it from its sdkconfig (CONFIG_NN_ANSI_C).
OTADATA_ANSI_IMAGE = f"{DATA_DIR}/partitions/ota_data_ansi.bin"
# Resident loop buffers: the driver's RX ring (internal RAM), its TX ring, and the flow-control window the
# host may fill (HELLO window): the driver's ring, or on a board with PSRAM a 64 KiB stream buffer there
# (docs/protocol.md "Flow control"), out of PSRAM_RESERVE_BYTES beside the kept-input store.
RESIDENT = {"rx_buffer_bytes": 16384, "tx_buffer_bytes": 8192, "rx_window_bytes": 16384}
PSRAM_RX_WINDOW_BYTES = 64 * 1024

_VERSION_RE = re.compile(r"[0-9A-Za-z.+~-]{1,32}")
_METHOD_RE = re.compile(r"Add[A-Za-z0-9_]{1,64}")
_SAFE_CHARS = re.compile(r"[^A-Za-z0-9_.:/-]")


# --------------------------------------------------------------------------------------------
# sanitizing: every model-derived string that reaches C goes through one of these


def c_str(value: object, max_len: int = 64) -> str:
    """Text safe inside a C string literal and in a protocol value: ``[A-Za-z0-9_.:/-]`` only.

    No quote, backslash, ``?`` (trigraphs), ``*`` (comments, protocol CRC marker) or control
    character can survive; an empty name becomes ``-`` (the protocol's empty value).
    """
    text = _SAFE_CHARS.sub("_", str(value))[:max_len]
    return text or "-"


def _hex_array(data: bytes, per_line: int = 16) -> str:
    """C initializer body for ``data``: ``0x..,`` values, ``per_line`` per line (deterministic)."""
    if not data:
        return "    0x00,"  # a zero-length array is not valid C++; sizes are checked separately
    tokens = [f"0x{b:02x}," for b in data]
    lines = ["    " + " ".join(tokens[i : i + per_line]) for i in range(0, len(tokens), per_line)]
    return "\n".join(lines)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class GeneratedProject:
    """One rendered project directory (one variant)."""

    variant: str
    path: Path
    manifest_path: Path
    board: Board
    arena_bytes: int
    arena_mem: str  # internal | psram
    files: tuple[str, ...]  # relative paths written by the generator
    manifest: Manifest = field(compare=False, repr=False)

    @classmethod
    def from_manifest(cls, pdir: Path, board: Board, manifest: Manifest) -> GeneratedProject:
        """The project in ``pdir`` as its manifest describes it (KeyError, ValueError or TypeError when
        the manifest lacks its variant, arena or files)."""
        return cls(
            variant=str(manifest["variant"]),
            path=pdir,
            manifest_path=pdir / MANIFEST_NAME,
            board=board,
            arena_bytes=int(manifest["arena_bytes"]),
            arena_mem=str(manifest["arena_mem"]),
            files=tuple(sorted(manifest["files"])),
            manifest=manifest,
        )


@dataclass(frozen=True)
class ArenaPlan:
    """How big the arena is and where it lives on the board."""

    bytes: int
    mem: str  # internal | psram
    source: str  # "estimate (measured)" | "estimate (rough)" | "--arena-kb"
    estimate_bytes: int | None
    espnn_formulas: str | None = None  # which esp-nn version's scratch formulas the estimate used


def resident_buffers(board: Board) -> dict[str, int]:
    """The resident loop's buffers on ``board`` (``RESIDENT``, with the PSRAM window where it has PSRAM)."""
    return {**RESIDENT, "rx_window_bytes": PSRAM_RX_WINDOW_BYTES} if board.has_psram else dict(RESIDENT)


def _arena_max(board: Board) -> dict[str, int]:
    """The largest arena ``board`` offers in internal RAM and in PSRAM (0: none), as ``place_arena``."""
    psram = max(board.psram_mb * 1024 * 1024 - PSRAM_RESERVE_BYTES, 0) if board.has_psram else 0
    return {"internal": board.internal_ram_arena_kb * 1024, "psram": psram}


def place_arena(arena_bytes: int, board: Board) -> str:
    """``internal`` or ``psram`` for an ``arena_bytes`` arena on ``board``; GenerateError if neither fits."""
    limits = _arena_max(board)
    if arena_bytes <= limits["internal"]:
        return "internal"
    if board.has_psram and arena_bytes <= limits["psram"]:
        return "psram"
    where = f"{limits['internal'] // 1024} KB internal RAM"
    if board.has_psram:
        where += f" or {limits['psram'] // 1024} KB usable {board.psram} PSRAM"
    else:
        where += " and it has no PSRAM"
    raise GenerateError(
        f"the tensor arena needs {arena_bytes // 1024} KB, but board {board.name} offers {where}",
        hint="use a board with (more) PSRAM (e.g. esp32s3-devkitc-1-n8r8), a smaller model or input "
        "resolution, or --arena-kb if you know the device needs less than the estimate",
    )


# --------------------------------------------------------------------------------------------
# the arena estimate (harness.model.arena: measured by TFLM in the host child, else a rough estimate)


# Below this share of the measured host arena, TFLM can crash inside AllocateTensors (a kernel's Init
# dereferences a failed persistent allocation, e.g. REDUCE's InitReduce) instead of returning an error,
# so the firmware would panic rather than print ERROR stage=alloc. Seen on a host build of the generated
# firmware with op_zoo: 4 KB segfaults, 8 KB fails cleanly (needs ~12 KB).
MIN_ARENA_SHARE = 0.5


def _refuse_crashing_arena(model_path: Path, arena_kb: int) -> None:
    """Refuse an --arena-kb so small that TFLM may crash instead of reporting it."""
    from harness.model.arena import estimate_arena  # lazy: ~5 ms; a repeat run keeps its projects

    estimate = estimate_arena(model_path)
    if estimate.method != "measured":
        return  # a rough estimate is not evidence enough to refuse the user's number
    floor = int(estimate.host_bytes * MIN_ARENA_SHARE)
    if arena_kb * 1024 < floor:
        raise GenerateError(
            f"--arena-kb {arena_kb} is less than half of the {estimate.host_bytes} bytes the model "
            "measurably needs: TFLM may crash in AllocateTensors instead of reporting a too-small arena",
            hint=f"use at least {-(-floor // 1024)} KB (a clean 'ERROR stage=alloc' is expected up to "
            f"{-(-estimate.host_bytes // 1024)} KB), or omit --arena-kb to use the estimate",
        )


def _template_cache() -> jinja2.BytecodeCache | None:
    """Compiled templates in esp-check's cache: each run would otherwise compile every template again
    (~0.06 s of CPU). Jinja keys an entry by the template's name and checks its source's checksum, so
    an edited template is compiled afresh. A cache that cannot be written costs only the compile."""
    import jinja2  # not at the top: a generation whose projects are kept renders nothing (~0.02 s)

    class _TemplateCache(jinja2.FileSystemBytecodeCache):
        def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
            with contextlib.suppress(OSError):
                super().dump_bytecode(bucket)

    directory = user_cache_dir("templates")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return _TemplateCache(str(directory))


def _environment() -> jinja2.Environment:
    import jinja2  # not at the top: a generation whose projects are kept renders nothing

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir() / "project")),
        bytecode_cache=_template_cache(),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # noqa: S701 - we generate C/CMake/INI, not HTML; values are sanitized instead
    )
    env.filters["c_str"] = c_str
    # text safe inside a ``//`` comment: c_str's character set (no newline, no ``*/``), 80 characters
    env.filters["c_comment"] = functools.partial(c_str, max_len=80)
    return env


def template_version() -> str:
    """Version of the firmware templates (printed by the firmware as ``fwver``)."""
    text = (templates_dir() / "VERSION").read_text(encoding="utf-8").strip()
    if not _VERSION_RE.fullmatch(text):
        raise EspCheckError(f"firmware_templates/VERSION holds an invalid version {text!r}")
    return text


def load_allowlist() -> dict[str, Any]:
    """The sdkconfig allow-list (harness/data/sdkconfig_allowlist.toml)."""
    text = (data_dir() / "sdkconfig_allowlist.toml").read_text(encoding="utf-8")
    return dict(parse_toml(text))


def check_sdkconfig(
    text: str, chip: str, allow: Mapping[str, Any], where: str, idf_min: str | None = None
) -> list[str]:
    """Symbols of a rendered sdkconfig.defaults; GenerateError for any symbol not allowed for ``chip``
    (why: docs/firmware.md "The sdkconfig allow-list"). With ``idf_min`` (the oldest ESP-IDF the project
    allows), a symbol that only newer releases have is refused too, unless the older ones behave as if it
    had the value written (``absent_means``).
    """
    parsed = sdkconfig.parse(text)
    if parsed.malformed:
        raise GenerateError(
            f"{where}: {parsed.malformed[0]!r} is neither a Kconfig assignment nor a comment "
            "(ESP-IDF ignores it with a warning)",
            hint="correct it in the board file's [sdkconfig] table or in "
            "firmware_templates/project/sdkconfig.defaults.j2",
        )
    values = parsed.symbols
    for key, value in values.items():
        entry = allow["symbols"].get(key)
        if key in allow.get("forbidden", {}):
            raise GenerateError(f"{where}: {key} must never be set ({allow['forbidden'][key]})")
        if entry is None:
            raise GenerateError(
                f"{where}: {key} is not in the sdkconfig allow-list "
                "(ESP-IDF ignores unknown symbols silently)",
                hint="check the symbol name against the ESP-IDF Kconfig and add it to "
                "harness/data/sdkconfig_allowlist.toml",
            )
        chips = entry.get("chips")
        if chips is not None and chip not in chips:
            raise GenerateError(f"{where}: {key} does not exist for {chip} (only {', '.join(chips)})")
        since = entry.get("idf_since")
        if (
            idf_min is not None
            and since is not None
            and version_tuple(idf_min) < version_tuple(since)
            and entry.get("absent_means") != value
        ):
            raise GenerateError(
                f"{where}: {key} exists only from ESP-IDF {since}, but the project allows ESP-IDF "
                f"{idf_min}, which would ignore it silently and build a different firmware",
                hint=f'set idf_min = "{since}" (or newer) in the board file',
            )
    for key in values:
        low, high = allow["symbols"][key].get("range", (None, None))
        if low is not None and not (values[key].isdigit() and low <= int(values[key]) <= high):
            raise GenerateError(f"{where}: {key}={values[key]} is outside ESP-IDF's range {low}..{high}")
        missing = [need for need in allow["symbols"][key].get("requires", ()) if values.get(need) != "y"]
        if missing:
            raise GenerateError(
                f"{where}: {key} takes effect only with {', '.join(f'{n}=y' for n in missing)}: ESP-IDF's "
                "Kconfig would drop its value silently and build a different firmware",
                hint=f"set {', '.join(missing)} too (harness/data/sdkconfig_allowlist.toml, `requires`)",
            )
    return list(values)


def _resolver(model: ModelInfo) -> list[str]:
    methods = list(resolver_methods(model))
    for m in methods:
        if not _METHOD_RE.fullmatch(m):
            raise GenerateError(f"op table gives an invalid resolver method name {m!r}")
    return methods


@dataclass(frozen=True)
class FirmwareFeatures:
    """Optional parts of the firmware, decided by the caller and handed over as plain data.

    ``tap``: per-op checksum records (docs/tap.md); ``dump_ops``: ops whose tensors a second run dumps;
    ``embed_inputs``: compile the given inputs into the image (run once at boot, for people flashing by
    hand). Flows stream their inputs over the link instead, so that a new input rebuilds and reflashes
    nothing: they pass ``embed_inputs=False`` and no inputs at all.
    ``ansi_ops``: op instances the hybrid wrapper runs on esp-nn's ANSI C kernels (docs/hybrid.md).
    """

    tap: bool = False
    dump_ops: tuple[int, ...] = ()
    embed_inputs: bool = True
    ansi_ops: tuple[int, ...] = ()


# --------------------------------------------------------------------------------------------
# keeping projects whose inputs have not changed

GENERATION_KEY: Final = "generation_key"  # manifest field: the hash of everything the generation read
_KEY_FORMAT = "esp-check-generation/1"
_P = ParamSpec("_P")


def generation_key(arguments: Mapping[str, Any], board: Board) -> str:
    """SHA-256 of everything :func:`generate_projects` reads (docs/firmware.md lists it, under "What is in
    a project"). Not ``out_dir`` (projects hold no absolute path) nor ``variants`` (each variant's project
    is made alone; its manifest names its variant). "" when a file cannot be read: nothing is kept then."""
    # the arena probe, the rendering, the quantization
    wheels = installed_versions("tflite-micro", "jinja2", "numpy")
    options = {k: repr(v) for k, v in arguments.items() if k not in ("out_dir", "board", "variants")}
    pinned = _versions(arguments["tflm_version"], arguments["espnn_version"], arguments["platform_version"])
    h = hashlib.sha256(
        json.dumps([_KEY_FORMAT, __version__, wheels, options, pinned], sort_keys=True).encode()
    )
    h.update(json.dumps(board.to_dict(), sort_keys=True, default=repr).encode())
    sources = [Path(arguments["model_path"]), *map(Path, arguments["input_paths"])]
    for k, path in enumerate([*sources, *([board.source] if board.source else [])]):
        h.update(f"\0file {k}:{path.name}\0".encode())
        try:
            h.update(path.read_bytes())
        except OSError:
            return ""  # no key: the generation itself says what cannot be read
    package = Path(__file__).resolve().parents[1]
    trees = [templates_dir(), data_dir(), package / "resources.py"]
    for k, root in enumerate([*trees, *(package / d for d in ("firmware", "flashfmt", "model"))]):
        digest = tree_sha256(root) if root.is_dir() else _sha256(root.read_bytes())
        h.update(f"\0tree {k}:{root.name}:{digest}\0".encode())
    return h.hexdigest()


def _kept_projects(
    out_dir: Path, variants: Sequence[str], board: Board, key: str
) -> list[GeneratedProject] | None:
    """The projects already in ``out_dir`` when each one's manifest carries ``key`` and every file it
    lists still has the bytes it lists; None (generate again) on any difference or doubt."""
    projects = []
    if not variants or any(v not in VARIANTS for v in variants):
        return None  # the generation refuses them
    for variant in variants:
        pdir = out_dir / variant
        try:
            manifest = read_manifest(pdir)
            files = manifest["files"] if manifest.get(GENERATION_KEY) == key else None
            if files is None or manifest["variant"] != variant:
                return None
            for rel, digest in files.items():
                if ".." in Path(rel).parts or _sha256((pdir / rel).read_bytes()) != digest:
                    return None
            projects.append(GeneratedProject.from_manifest(pdir, board, manifest))
        except (OSError, BuildError, KeyError):
            return None
    return projects


def _kept_when_unchanged(
    generate: Callable[_P, list[GeneratedProject]],
) -> Callable[_P, list[GeneratedProject]]:
    """Skip rendering when ``out_dir`` already holds what these exact inputs generate (the key of
    :func:`generation_key` in each manifest, each file's bytes as listed); otherwise render and store
    the key. Any change of input, template byte, option or esp-check code renders again."""
    signature = inspect.signature(generate)

    @functools.wraps(generate)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> list[GeneratedProject]:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        board = bound.arguments["board"] = load_board(bound.arguments["board"])
        key = generation_key(bound.arguments, board)
        out_dir = Path(bound.arguments["out_dir"])
        if not key:
            return generate(*bound.args, **bound.kwargs)
        kept = _kept_projects(out_dir, bound.arguments["variants"], board, key)
        if kept is not None:
            return kept
        projects = []
        for p in generate(*bound.args, **bound.kwargs):
            manifest: Manifest = {**p.manifest, GENERATION_KEY: key}  # stored last: a failed one has none
            write_manifest(p.path, manifest)
            projects.append(dataclasses.replace(p, manifest=manifest))
        return projects

    return wrapper


@_kept_when_unchanged
def generate_projects(
    model_path: str | Path,
    input_paths: Sequence[str | Path],
    board: str | Path | Board,
    *,
    out_dir: str | Path,
    variants: Sequence[str] = VARIANTS,
    input_options: InputOptions | None = None,
    arena_kb: int | None = None,
    tflm_version: str | None = None,
    espnn_version: str | None = None,
    platform_version: str | None = None,
    human_max: int = HUMAN_MAX,
    features: FirmwareFeatures | None = None,
    tap: bool = False,
    dump_ops: Sequence[int] = (),
) -> list[GeneratedProject]:
    """Render one project per variant under ``out_dir/<variant>`` for ``model_path`` and K inputs;
    projects already made of the same inputs are kept (:func:`_kept_when_unchanged`). ``tap`` and
    ``dump_ops`` are shorthands for ``features``. Raises GenerateError (usage, exit 2) before anything
    is built when the model cannot be embedded (several input tensors, an unsupported dtype) or the
    arena fits in no memory of the board."""
    board_def = load_board(board)
    model_path = Path(model_path)
    feats = features or FirmwareFeatures(tap=tap, dump_ops=tuple(sorted({int(k) for k in dump_ops})))
    _check_request(variants, input_paths, human_max, feats.embed_inputs)
    versions = _versions(tflm_version, espnn_version, platform_version)
    model = load_model(model_path)
    tensor = _check_model(model, model_path)
    resolver = _resolver(model)
    # per-op checksum wrapper tables (None without tap and dump_ops); GenerateError on bad op indices
    tap_ctx = tap_firmware_context(model, tap=feats.tap, dump_ops=feats.dump_ops)
    model_bytes = model_path.read_bytes()
    layout = flash_layout(board_def)
    check_model_fits(layout, len(model_bytes), model_path.name)
    # hybrid wrapper table (None when every op runs ESP-NN optimized); UsageError on ops it cannot switch
    hybrid_ctx = hybrid_firmware_context(
        model, feats.ansi_ops, model_name=c_str(model_path.name), model_sha256=_sha256(model_bytes)
    )
    plan = _plan_arena(model_path, board_def, arena_kb, versions["espnn"])
    paths = [Path(p) for p in input_paths]
    prepared = list(zip(paths, input_tensor_bytes(paths, tensor, input_options), strict=True))
    if not feats.embed_inputs:
        prepared = []  # validated above; the flow streams them
    src = _Sources(
        board_def, versions, model_path, model_bytes, prepared, model=model, resolver=resolver, plan=plan
    )
    ctx = _base_context(src, human_max)
    ctx.update(tap=tap_ctx, hybrid=hybrid_ctx, **_layout_context(layout))
    env = _environment()
    allow = load_allowlist()
    projects = []
    for variant in variants:
        files = _render_files(env, dict(ctx, variant=variant), src, allow)
        manifest = _manifest(variant, src, ctx, files)
        manifest["flash_layout"] = layout.to_dict()
        if tap_ctx is not None:
            manifest["tap"] = tap_ctx["manifest"]
        if hybrid_ctx is not None:
            manifest["hybrid"] = {"ansi_ops": hybrid_ctx["ansi_ops"], "kinds": hybrid_ctx["kinds"]}
        pdir = Path(out_dir) / variant
        _write_project(pdir, files, manifest)
        projects.append(GeneratedProject.from_manifest(pdir, board_def, manifest))
    return projects


def _check_request(
    variants: Sequence[str], input_paths: Sequence[str | Path], human_max: int, embed: bool
) -> None:
    if not variants:
        raise GenerateError("no variant requested", hint="use --variant optimized, ansi or both")
    for v in variants:
        if v not in VARIANTS:
            raise GenerateError(f"unknown variant {v!r}", hint="variants: optimized, ansi")
    if embed and not input_paths:
        raise GenerateError("at least one --input is needed", hint="pass --input FILE (repeatable)")
    if embed and len(input_paths) > MAX_INPUTS:
        raise GenerateError(f"{len(input_paths)} inputs given; at most {MAX_INPUTS} fit in one firmware")
    if not 0 <= human_max <= 1024:
        raise GenerateError(f"human_max={human_max} must be between 0 and 1024")


def _versions(tflm: str | None, espnn: str | None, platform: str | None) -> dict[str, str]:
    given = {"tflm": tflm, "espnn": espnn, "platform": platform}
    versions = {**DEFAULT_VERSIONS, **{key: value for key, value in given.items() if value is not None}}
    for key, value in versions.items():
        if not isinstance(value, str) or not _VERSION_RE.fullmatch(value):
            raise GenerateError(
                f"version {key}={value!r} is not a valid version string", hint="use e.g. 1.3.8"
            )
    return versions


def _check_model(model: ModelInfo, model_path: Path) -> TensorInfo:
    """The one input tensor the firmware feeds; GenerateError for what it cannot embed."""
    if len(model.inputs) != 1:
        raise GenerateError(
            f"{model_path.name} has {len(model.inputs)} input tensors; the generated firmware "
            "supports exactly one",
            hint="multi-input models are not supported yet by `generate`",
        )
    tensor = model.inputs[0]
    for t in (tensor, *model.outputs):
        if t.dtype not in DTYPES:  # what the protocol's records carry
            raise GenerateError(
                f"tensor {c_str(t.name)} has dtype {t.dtype}; the firmware supports {', '.join(DTYPES)}",
                hint="convert the model with integer (int8) inputs and outputs",
            )
    return tensor  # (a model without outputs never loads: harness.model.loader refuses it)


def _plan_arena(model_path: Path, board: Board, arena_kb: int | None, espnn_version: str) -> ArenaPlan:
    if arena_kb is not None:
        if arena_kb <= 0:
            raise GenerateError(f"--arena-kb {arena_kb} must be positive")
        _refuse_crashing_arena(model_path, arena_kb)
        return ArenaPlan(arena_kb * 1024, place_arena(arena_kb * 1024, board), "--arena-kb", None)
    from harness.model.arena import estimate_arena  # lazy: ~5 ms; a repeat run keeps its projects

    est = estimate_arena(model_path, chip=board.chip, espnn_version=espnn_version)
    kib = -(-est.target_bytes // 1024) * 1024
    return ArenaPlan(
        kib, place_arena(kib, board), f"estimate ({est.method})", est.target_bytes, est.espnn_formulas
    )


def _layout_context(layout: FlashLayout) -> dict[str, object]:
    """Flash layout values for partitions.csv, sdkconfig, CMake, the PlatformIO script and the C++."""
    part = layout.model_partition
    return {
        "partitions": list(layout.rows),
        "partition_table_offset": layout.table_offset,
        "model_partition": {
            "name": part.name,
            "subtype": f"0x{part.subtype:02x}",
            "offset": part.offset,
            "header_bytes": HEADER_BYTES,
            "image": MODEL_IMAGE,
        },
        "boot": {
            "ansi_slot": f"ota_{VARIANT_SLOTS['ansi']}",
            "ansi_offset": layout.slot_offset("ansi"),
            "otadata_offset": layout.row("otadata").offset,
            "otadata_image": OTADATA_ANSI_IMAGE,
        },
    }


@dataclass(frozen=True)
class _Sources:
    """What one generation renders both variants from."""

    board: Board
    versions: Mapping[str, str]
    model_path: Path
    model_bytes: bytes
    prepared: Sequence[tuple[Path, bytes]]  # (source, tensor bytes) of each embedded input
    model: ModelInfo  # its one input tensor, inputs[0], checked by _check_model
    resolver: Sequence[str]
    plan: ArenaPlan


def _base_context(src: _Sources, human_max: int) -> dict[str, Any]:
    """Template context shared by both variants."""
    board, model, tensor, prepared, plan = src.board, src.model, src.model.inputs[0], src.prepared, src.plan
    tv = template_version()
    low, below = board.idf_range
    return {
        "banner": f"Generated by esp-check {__version__} (templates {tv}). "
        "Regenerate with `esp-check generate`.",
        "template_version": tv,
        "board": board,
        "console_baud_default": CONSOLE_BAUD,  # ESP-IDF's default console writes no baud (sdkconfig)
        "versions": src.versions,
        "pio_env": PIO_ENV,
        "app_name": APP_NAME,
        "inputs": [
            {"source_name": p.name, "sha256": _sha256(raw), "array": _hex_array(raw)} for p, raw in prepared
        ],
        # only embedded inputs need it compiled in: without them the app is the same for every model
        # with these ops (a new model rewrites only the model partition)
        "input_bytes": tensor.nbytes if prepared else 0,
        "input_dtype": tensor.dtype,
        "outputs": [{"index": k, **_tensor_fields(o)} for k, o in enumerate(model.outputs)],
        "resolver": list(src.resolver),
        "arena_bytes": plan.bytes,
        "arena_mem": plan.mem,
        "arena_max": _arena_max(board),  # compiled into the app, whatever the model partition asks
        "keep_bytes": KEEP_STORE_BYTES if board.has_psram else 0,  # out of PSRAM_RESERVE_BYTES: 0 without
        "resident": resident_buffers(board),
        "human_max": human_max,
        "main_stack_bytes": MAIN_STACK_BYTES,
        # the supported ESP-IDF range (idf_component.yml, the C++ version check, the manifest)
        "idf": {
            "range": f">={low},<{below}",
            "min_c": ", ".join(str(n) for n in version_tuple(low)),
            "below_c": ", ".join(str(n) for n in version_tuple(below)),
        },
    }


def _tensor_fields(t: TensorInfo) -> dict[str, object]:
    return {
        "name": c_str(t.name),
        "dtype": t.dtype,
        "shape": list(t.shape),
        "scale": t.scale,
        "zero_point": t.zero_point,
    }


def _render_files(
    env: jinja2.Environment, ctx: Mapping[str, Any], src: _Sources, allow: Mapping[str, Any]
) -> dict[str, bytes]:
    """Every file of one variant's project, relative path -> bytes."""
    board, model_bytes = src.board, src.model_bytes
    import jinja2  # not at the top: a generation whose projects are kept renders nothing

    files: dict[str, bytes] = {}
    for tname in sorted(n for n in env.list_templates() if n.endswith(".j2")):
        rel = tname.removesuffix(".j2")
        rel = ".gitignore" if rel == "gitignore" else rel
        if rel in ("platformio.ini", PIO_EXTRA_SCRIPT, PIO_BOOT_SCRIPT) and not board.pio_board:
            continue  # e.g. ESP32-P4: platform-espressif32 6.13.0 cannot build it
        try:
            text = env.get_template(tname).render(ctx)
        except jinja2.UndefinedError as exc:  # a template bug, never user input
            raise EspCheckError(f"template {tname} uses an undefined value: {exc}") from exc
        if rel == "sdkconfig.defaults":
            where = f"sdkconfig.defaults for board {board.name}"
            check_sdkconfig(text, board.chip, allow, where, idf_min=board.idf_range[0])
        files[rel] = text.encode("utf-8")
    proto_dir = templates_dir() / "common"
    for name in PROTO_FILES:
        if not (proto_dir / name).is_file():
            raise EspCheckError(f"firmware_templates/common/{name} is missing", hint="reinstall esp-check")
        files[f"main/{name}"] = (proto_dir / name).read_bytes()
    if ctx.get("hybrid") is not None:
        files.update(render_hybrid_files(ctx["hybrid"], str(ctx["banner"]), env))
    files[f"{DATA_DIR}/model.tflite"] = model_bytes
    files[MODEL_IMAGE] = pack_model_image(model_bytes, int(ctx["arena_bytes"]), str(ctx["arena_mem"]))
    files[OTADATA_ANSI_IMAGE] = otadata.initial(OTADATA_BYTES, VARIANT_SLOTS["ansi"], OTA_APPS)
    for k, (_, raw) in enumerate(src.prepared):
        files[f"{DATA_DIR}/input_{k}.bin"] = raw
    return files


def _write_project(pdir: Path, files: Mapping[str, bytes], manifest: Manifest) -> None:
    """Write what changed (mtimes of unchanged files stay), drop files an older generation wrote."""
    try:  # what an earlier generation in pdir wrote (nothing without a readable manifest)
        old_files = {k for k in read_manifest(pdir).get("files", {}) if ".." not in Path(k).parts}
    except BuildError:
        old_files = set()
    defaults_changed = False
    for rel, data in sorted(files.items()):
        changed = write_if_changed(pdir / rel, data)
        defaults_changed |= changed and rel == "sdkconfig.defaults"
    for rel in sorted(old_files - set(files)):
        stale = pdir / rel
        if stale.is_file():
            stale.unlink()
    if defaults_changed:
        # A resolved sdkconfig from an earlier build would override the new defaults.
        for stale_name in ("sdkconfig", f"sdkconfig.{PIO_ENV}", "sdkconfig.old"):
            (pdir / stale_name).unlink(missing_ok=True)
    write_manifest(pdir, manifest)


def _manifest(variant: str, src: _Sources, ctx: Mapping[str, Any], files: Mapping[str, bytes]) -> Manifest:
    """One variant's esp-check.json (``ctx``: the template context it was rendered with)."""
    board, versions, plan = src.board, src.versions, src.plan
    board_file_sha = _sha256(board.source.read_bytes()) if board.source and board.source.is_file() else None
    return {
        "schema": MANIFEST_SCHEMA,
        "esp_check_version": __version__,
        "template_version": ctx["template_version"],
        "variant": variant,
        "nn_config": NN_SYMBOL[variant],
        "nn_expected": NN_EXPECTED[variant],
        "board": board.name,
        "chip": board.chip,
        "board_def": {**board.to_dict(), "file_sha256": board_file_sha},
        "builder": board.builder,
        "pio_env": PIO_ENV,
        "console_baud": board.monitor_baud,
        "versions": {
            "platformio_platform": f"espressif32@{versions['platform']}",
            "esp-tflite-micro": versions["tflm"],
            "esp-nn": versions["espnn"],
            "esp-idf": versions["idf"],
            "esp-idf-supported": ctx["idf"]["range"],
        },
        "model": {
            "source_name": src.model_path.name,
            "file": f"{DATA_DIR}/model.tflite",
            "partition_image": MODEL_IMAGE,
            "bytes": len(src.model_bytes),
            "sha256": _sha256(src.model_bytes),
            "schema_version": src.model.schema_version,
        },
        "input_tensor": _tensor_fields(src.model.inputs[0]),
        "inputs": [
            {
                "index": k,
                "source_name": p.name,
                "source_sha256": _sha256(p.read_bytes()),
                "file": f"{DATA_DIR}/input_{k}.bin",
                "bytes": len(raw),
                "sha256": _sha256(raw),
            }
            for k, (p, raw) in enumerate(src.prepared)
        ],
        "outputs": [dict(o) for o in ctx["outputs"]],
        "ops": list(src.model.distinct_ops),
        "resolver": list(src.resolver),
        "arena_bytes": plan.bytes,
        "arena_mem": plan.mem,
        "arena_max": ctx["arena_max"],  # what the app accepts from a model partition header
        "keep_bytes": ctx["keep_bytes"],  # the kept-input store in PSRAM (0: none)
        "resident": ctx["resident"],  # the resident loop's buffers and receive window
        "arena_source": plan.source,
        "arena_estimate_bytes": plan.estimate_bytes,
        "arena_espnn_formulas": plan.espnn_formulas,
        "human_max": ctx["human_max"],
        "files": {rel: _sha256(data) for rel, data in sorted(files.items())},
        "resolved": None,
    }
