"""A generated project's esp-check.json has one reader (harness.manifest.read_manifest): the generator,
``esp-check build`` and the sim packer refuse the same manifests with the same error, naming the file, the
field and the fix. Before, the sim packer read it on its own: it took another schema, and a field of the
wrong type came out as a bare ValueError; ``build`` refused a missing one with a GenerateError."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sim_helpers import make_project

from harness.errors import BuildError
from harness.firmware.build import build_project
from harness.manifest import MANIFEST_NAME, read_manifest
from harness.sim.image import build_sim_firmware


def _project(tmp_path: Path, models_dir: Path, **fields: object) -> Path:
    x = np.load(models_dir / "inputs" / "op_zoo.q.npy")
    proj = make_project(tmp_path / "proj", models_dir / "op_zoo.tflite", [x], builder="sim")
    doc = json.loads((proj / MANIFEST_NAME).read_text())
    (proj / MANIFEST_NAME).write_text(json.dumps({**doc, **fields}))
    return proj


@pytest.mark.parametrize(
    ("fields", "wrong"),
    [
        ({"schema": "esp-check-project/0"}, r"field 'schema' is \"esp-check-project/0\""),
        ({"console_baud": "fast"}, r"field 'console_baud' is \"fast\", not a JSON int"),
        ({"human_max": True}, r"field 'human_max' is true, not a JSON int"),
        ({"arena_max": [1, 2]}, r"field 'arena_max' is \[1, 2\], not a JSON dict"),
        ({"variant": "ansi_c"}, r"field 'variant' is \"ansi_c\", neither optimized nor ansi"),
    ],
)
def test_every_reader_refuses_a_wrong_field_naming_file_field_and_fix(
    tmp_path: Path, models_dir: Path, fields: dict[str, object], wrong: str
) -> None:
    proj = _project(tmp_path, models_dir, **fields)
    where = rf"{proj / MANIFEST_NAME}: {wrong}"
    for read in (
        lambda: read_manifest(proj),
        lambda: build_sim_firmware(proj, tmp_path / "sim"),
        lambda: build_project(proj, use_cache=False),
    ):
        with pytest.raises(BuildError, match=where) as ei:
            read()
        assert ei.value.hint is not None and "regenerate the project" in ei.value.hint


def test_a_missing_manifest_is_the_same_error_for_build_and_the_sim_packer(tmp_path: Path) -> None:
    for read in (
        lambda: build_project(tmp_path, use_cache=False),
        lambda: build_sim_firmware(tmp_path, tmp_path),
    ):
        with pytest.raises(
            BuildError, match=rf"{tmp_path} is not an esp-check project \(no esp-check\.json\)"
        ):
            read()


def test_a_manifest_that_reads_back_is_the_one_written(tmp_path: Path, models_dir: Path) -> None:
    proj = _project(tmp_path, models_dir, arena_estimate_bytes=None, resolved={"components": {}})
    manifest = read_manifest(proj)
    assert manifest["variant"] == "optimized" and manifest["resolved"] == {"components": {}}
    assert manifest == json.loads((proj / MANIFEST_NAME).read_text())
