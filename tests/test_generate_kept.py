"""A project whose inputs have not changed is kept, not rendered again.

Generation stores a hash of everything it reads (templates, board, model, inputs, options, esp-check's
version and code) in each manifest; the next generation into the same folder compares it and every
generated file's bytes, and renders again on any difference. Nothing is faked: the real templates (or a
copy of them, edited), the real sim board and a fixture model. ``_render_files`` is wrapped only to
count its calls (it still renders).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.errors import EspCheckError, ExitCode
from harness.firmware import generate as gen
from harness.resources import templates_dir

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "tests" / "data" / "models"
MODEL = MODELS / "op_zoo.tflite"
INPUT = MODELS / "inputs" / "op_zoo.npy"


@pytest.fixture
def renders(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The variants rendered so far (the real renderer runs)."""
    seen: list[str] = []
    real: Callable[..., dict[str, bytes]] = gen._render_files

    def counting(env: Any, ctx: Any, *args: Any) -> dict[str, bytes]:
        seen.append(str(ctx["variant"]))
        return real(env, ctx, *args)

    monkeypatch.setattr(gen, "_render_files", counting)
    return seen


def _generate(out: Path, **options: Any) -> list[gen.GeneratedProject]:
    return gen.generate_projects(MODEL, [INPUT], "sim", out_dir=out, arena_kb=16, **options)


def _tree(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_unchanged_inputs_keep_the_projects(tmp_path: Path, renders: list[str]) -> None:
    out = tmp_path / "out"
    first = _generate(out)
    before = _tree(out)
    assert renders == ["optimized", "ansi"]
    again = _generate(out)
    assert renders == ["optimized", "ansi"], "the second generation rendered again"
    assert _tree(out) == before
    assert again == first  # same variants, paths, board, arena, file lists
    for p, q in zip(first, again, strict=True):
        assert q.manifest[gen.GENERATION_KEY] == p.manifest[gen.GENERATION_KEY]
        assert json.loads(q.manifest_path.read_text())[gen.GENERATION_KEY] == p.manifest[gen.GENERATION_KEY]


def test_one_option_changed_renders_again(tmp_path: Path, renders: list[str]) -> None:
    out = tmp_path / "out"
    _generate(out)
    (p, q) = _generate(out, human_max=15)
    assert renders == ["optimized", "ansi"] * 2
    assert p.manifest["human_max"] == q.manifest["human_max"] == 15
    _generate(out, human_max=15, variants=("ansi",))  # the ansi project is kept, as it is
    assert renders == ["optimized", "ansi"] * 2


def test_one_template_byte_changed_renders_again(
    tmp_path: Path, renders: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    templates = tmp_path / "templates"
    shutil.copytree(templates_dir(), templates)
    monkeypatch.setattr(gen, "templates_dir", lambda: templates)
    out = tmp_path / "out"
    _generate(out)
    cmake = templates / "project" / "CMakeLists.txt.j2"
    cmake.write_bytes(cmake.read_bytes() + b"\n")  # one byte more
    _generate(out)
    assert renders == ["optimized", "ansi"] * 2
    assert (out / "ansi" / "CMakeLists.txt").read_bytes().endswith(b"\n\n")


def test_a_generated_file_edited_or_gone_is_rendered_again(tmp_path: Path, renders: list[str]) -> None:
    out = tmp_path / "out"
    _generate(out)
    before = _tree(out)
    app = out / "optimized" / "main" / "app_main.cc"
    app.write_bytes(app.read_bytes().replace(b"kArena", b"kArenb", 1))
    (out / "ansi" / "partitions.csv").unlink()
    _generate(out)
    assert renders == ["optimized", "ansi"] * 2
    assert _tree(out) == before


def test_a_changed_model_or_input_renders_again(tmp_path: Path, renders: list[str]) -> None:
    out = tmp_path / "out"
    model = tmp_path / "m.tflite"
    shutil.copyfile(MODEL, model)
    gen.generate_projects(model, [INPUT], "sim", out_dir=out, arena_kb=16, variants=("ansi",))
    data = bytearray(INPUT.read_bytes())
    data[-1] ^= 1  # the last element of the .npy
    changed = tmp_path / "in.npy"
    changed.write_bytes(bytes(data))
    gen.generate_projects(model, [changed], "sim", out_dir=out, arena_kb=16, variants=("ansi",))
    assert renders == ["ansi", "ansi"]


def test_a_kept_generation_does_not_import_jinja(tmp_path: Path) -> None:
    """Jinja is imported to render, so a run whose projects are kept pays nothing for it (each
    generation in a fresh Python, as each CLI run is)."""
    code = (
        "import sys\n"
        "from harness.firmware.generate import generate_projects\n"
        f"generate_projects({str(MODEL)!r}, [{str(INPUT)!r}], 'sim', out_dir={str(tmp_path)!r},"
        " arena_kb=16)\n"
        "print('jinja2' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runs = [
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        for _ in range(2)
    ]
    assert [r.stdout.strip() for r in runs] == ["True", "False"]


def test_an_unreadable_model_is_refused_as_before(tmp_path: Path) -> None:
    """The key reads the model first; a missing one is still the generation's own usage error."""
    with pytest.raises(EspCheckError) as err:
        gen.generate_projects(tmp_path / "missing.tflite", [INPUT], "sim", out_dir=tmp_path / "out")
    assert err.value.exit_code == ExitCode.USAGE
    assert "missing.tflite" in str(err.value)
