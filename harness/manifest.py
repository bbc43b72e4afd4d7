"""A generated project's manifest, ``esp-check.json``: its typed model (:class:`Manifest`), its one reader
(:func:`read_manifest`, for the generator, the builders and the sim packer) and its one writer.

What the keys mean: docs/firmware.md "What is in a project".
"""

from __future__ import annotations

import json
import types
import typing
from functools import cache
from pathlib import Path
from typing import TypedDict

from harness.errors import BuildError
from harness.flashfmt.partitions import VARIANTS
from harness.resources import write_if_changed

MANIFEST_NAME = "esp-check.json"
MANIFEST_SCHEMA = "esp-check-project/1"
# variant -> the ESP-NN mode its firmware reports (INFO nn=...), the manifest's nn_expected
NN_EXPECTED = {"optimized": "optimized", "ansi": "ansi_c"}
VARIANT_OF_NN = {nn: v for v, nn in NN_EXPECTED.items()}
_REGENERATE = "regenerate the project with `esp-check generate` (this esp-check version)"


class Manifest(TypedDict, total=False):
    """A generated project's esp-check.json (docs/firmware.md). :func:`read_manifest` checks each key's
    type against these annotations; only ``schema`` and ``variant`` must be there (the simulated builder
    also reads hand-made manifests, tests/, with defaults for what is missing)."""

    schema: str
    esp_check_version: str
    template_version: str
    variant: str
    nn_config: str
    nn_expected: str
    board: str
    chip: str
    board_def: dict[str, object]  # Board.to_dict() and the board file's file_sha256
    builder: str
    pio_env: str
    console_baud: int
    versions: dict[str, str]
    model: dict[str, object]
    input_tensor: dict[str, object]
    inputs: list[dict[str, object]]
    outputs: list[dict[str, object]]
    ops: list[str]
    resolver: list[str]
    arena_bytes: int
    arena_mem: str
    arena_max: dict[str, int]
    arena_source: str
    arena_estimate_bytes: int | None
    arena_espnn_formulas: str | None
    human_max: int
    files: dict[str, str]
    resolved: dict[str, object] | None  # what the build resolved (dependencies.lock), written by the build
    flash_layout: dict[str, object]
    tap: dict[str, object]
    hybrid: dict[str, object]
    keep_bytes: int  # the kept-input store in PSRAM (0: none), docs/protocol.md "Kept inputs"
    resident: dict[str, int]  # resident_buffers(): driver rings and the receive window (HELLO window)
    generation_key: str  # GENERATION_KEY: the hash of everything the generation read (kept projects)
    # only in hand-made manifests: the simulated builder's fallbacks
    fwver: str
    target: str
    flash_size: str
    idf: str
    tflm: str
    espnn: str


@cache
def _field_types() -> dict[str, tuple[type, ...]]:
    """Each key's JSON type(s), from :class:`Manifest`'s annotations (``int | None``: int or null)."""
    out: dict[str, tuple[type, ...]] = {}
    for key, hint in typing.get_type_hints(Manifest).items():
        args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        out[key] = tuple(typing.get_origin(a) or a for a in args)
    return out


def _field_problem(data: dict[str, object]) -> str | None:
    """What is wrong with the first key of a known type that has another, or with the variant."""
    for key, kinds in _field_types().items():
        if key not in data:
            continue
        value = data[key]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            return f"field {key!r} is {json.dumps(value)[:40]}, not a JSON {names}"
    if data.get("variant") not in VARIANTS:
        return f"field 'variant' is {json.dumps(data.get('variant'))[:40]}, neither optimized nor ansi"
    return None


def read_manifest(project_dir: str | Path) -> Manifest:
    """The ``esp-check.json`` of a generated project, its keys checked against :class:`Manifest`: a
    BuildError (exit 3) naming the file, the field and the fix when it is missing, unreadable, of another
    schema, or a field has the wrong type."""
    path = Path(project_dir) / MANIFEST_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BuildError(
            f"{project_dir} is not an esp-check project (no {MANIFEST_NAME})",
            hint="create it with `esp-check generate`",
        ) from None
    except (OSError, ValueError) as exc:
        raise BuildError(f"cannot read {path}: {exc}", hint=_REGENERATE) from None
    if not isinstance(data, dict):
        raise BuildError(f"{path} is not a JSON object", hint=_REGENERATE)
    if data.get("schema") != MANIFEST_SCHEMA:
        raise BuildError(
            f"{path}: field 'schema' is {json.dumps(data.get('schema'))[:40]}, not {MANIFEST_SCHEMA!r}",
            hint=_REGENERATE,
        )
    wrong = _field_problem(data)
    if wrong is not None:
        raise BuildError(f"{path}: {wrong}", hint=_REGENERATE)
    return typing.cast(Manifest, data)  # each key's type checked above


def write_manifest(project_dir: Path, manifest: Manifest) -> bool:
    """Write ``esp-check.json`` (sorted keys, indented) when its bytes change; True when they did."""
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    return write_if_changed(Path(project_dir) / MANIFEST_NAME, text.encode("utf-8"))
