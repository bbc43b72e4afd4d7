"""Artifact paths of ``esp-check run``: hostile names stay inside their directory, and a rerun into the
same ``--out`` keeps no stale verdict (harness.runner.paths).

Nothing is faked. The end-to-end kill -9 test is in tests/test_runner_sim.py.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.resources import atomic_write, write_if_changed
from harness.runner import RunOptions, load_inventory, load_plan
from harness.runner.executor import Runner
from harness.runner.paths import (
    INCOMPLETE_DIR,
    MARKER,
    MAX_COMPONENT,
    PREVIOUS_DIR,
    move_aside,
    safe_component,
)

HOSTILE = [
    "..",
    ".",
    "...",
    "/",
    "a/b",
    "../../etc",
    "a\\b",
    "nul\x00byte",
    "x" * 300,
    "модель",
    "模型",
    "e\u0301",  # decomposed é
    "CON",
    "con.tflite",
    "Lpt1",
    "aux.",
    "",
    " ",
    "a:b",
    "trailing.",
    ".hidden",
    "new\nline",
    "\udcff",  # a surrogate escape, as os.fsdecode gives for undecodable bytes
]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_become_one_portable_component(name: str, tmp_path: Path) -> None:
    safe = safe_component(name)
    assert safe not in ("", ".", "..")
    assert "/" not in safe and "\\" not in safe and "\x00" not in safe
    assert safe.isascii() and safe.isprintable()
    assert 0 < len(safe) <= MAX_COMPONENT
    assert not safe.startswith(".") and not safe.endswith((".", " "))
    assert safe.split(".")[0].upper() not in {"CON", "PRN", "AUX", "NUL", "LPT1", "COM1"}
    (tmp_path / "jobs").mkdir()
    d = tmp_path / "jobs" / safe
    d.mkdir()
    assert d.resolve().parent == (tmp_path / "jobs").resolve()  # it stays where it was put


def test_safe_names_are_kept_and_changed_ones_stay_distinct() -> None:
    for ok in ("fixtures", "cnn_classifier_11", "sim@b1", "esp32s3-devkitc-1-n8r8", "attempt-2-b1", "a.b"):
        assert safe_component(ok) == ok
    variants = ["a b", "a_b", "a/b", "a:b", "..", "...", ".", "CON", "con", "x" * 300, "x" * 301]
    assert len({safe_component(v) for v in variants}) == len(variants)
    assert safe_component("a b") == safe_component("a b")  # deterministic


@given(st.text(max_size=400))
def test_any_text_gives_a_safe_component(name: str) -> None:
    safe = safe_component(name)
    assert safe not in ("", ".", "..") and "/" not in safe and "\x00" not in safe
    assert safe.isascii() and len(safe) <= MAX_COMPONENT and not safe.startswith(".")


def test_dotted_model_names_stay_inside_their_job(tmp_path: Path, models_dir: Path) -> None:
    """``...tflite`` has the stem ``..``: its artifacts went to jobs/<board>/, shared by every such job."""
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        shutil.copy(models_dir / "op_zoo.tflite", tmp_path / d / "...tflite")
    shutil.copy(models_dir / "inputs" / "op_zoo.npy", tmp_path / "in.npy")
    jobs = "".join(
        f'[[job]]\nname = "{j}"\nmodels = ["{d}/...tflite"]\ninputs = ["in.npy"]\nboards = ["sim"]\n'
        for j, d in (("ja", "a"), ("jb", "b"))
    )
    (tmp_path / "plan.toml").write_text(jobs)
    (tmp_path / "bench.toml").write_text('[[board]]\nname = "b1"\ntype = "sim"\nport = "sim://paths-b1"\n')
    out = tmp_path / "out"
    runner = Runner(
        load_plan(tmp_path / "plan.toml"), load_inventory(tmp_path / "bench.toml"), RunOptions(out_dir=out)
    )
    dirs = [t.dir for t in runner.tasks]
    assert len(set(dirs)) == 2
    for t in runner.tasks:
        job_dir = (out / "jobs" / t.job.name).resolve()
        assert job_dir in t.dir.resolve().parents, t.dir
    assert [t.id for t in runner.tasks] == ["ja/../sim", "jb/../sim"]  # ids keep the real names


def test_model_placeholder_is_matched_literally(tmp_path: Path, models_dir: Path) -> None:
    """A stem with glob characters (``net[1]``) must not select other files through '{model}'."""
    shutil.copy(models_dir / "op_zoo.tflite", tmp_path / "net[1].tflite")
    x = models_dir / "inputs" / "op_zoo.npy"
    shutil.copy(x, tmp_path / "net[1]_a.npy")
    shutil.copy(x, tmp_path / "net1_b.npy")  # what the unescaped pattern net[1]_*.npy would match
    (tmp_path / "plan.toml").write_text(
        '[[job]]\nname = "j"\nmodels = ["*.tflite"]\ninputs = ["{model}_*.npy"]\nboards = ["sim"]\n'
    )
    plan = load_plan(tmp_path / "plan.toml")
    assert [p.name for p in plan.jobs[0].cases[0].inputs] == ["net[1]_a.npy"]


@pytest.mark.parametrize(
    "fields",
    [
        'inputs = ["in/{model}/x.npy"]',
        'dataset = "data/{model}"\nresults = "crc"',
        'dataset = "data"\nlabels = "{model}.csv"\nresults = "crc"',
    ],
    ids=["inputs", "dataset", "labels"],
)
def test_a_dotdot_stem_cannot_stand_for_model_in_a_path(
    fields: str, tmp_path: Path, models_dir: Path
) -> None:
    """One rule, one message: the inputs path and the dataset/labels path refuse the stem alike."""
    from harness.errors import PlanError

    shutil.copy(models_dir / "op_zoo.tflite", tmp_path / "...tflite")
    (tmp_path / "plan.toml").write_text(
        f'[[job]]\nname = "j"\nmodels = ["...tflite"]\n{fields}\nboards = ["sim"]\n'
    )
    with pytest.raises(PlanError) as exc:
        load_plan(tmp_path / "plan.toml")
    assert exc.value.message == (
        f"plan {tmp_path / 'plan.toml'}: job 'j': field 'models' has a model file named '...tflite', "
        "whose stem '..' cannot stand for '{model}' in a path"
    )
    assert exc.value.hint == "rename the model file"


def test_move_aside_keeps_the_previous_reports_and_deletes_outside_ones(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "jobs" / "j" / "m" / "sim").mkdir(parents=True)
    (out / "jobs" / "j" / "m" / "sim" / "result.json").write_text('{"verdict": "match"}')
    (out / "summary.json").write_text(json.dumps({"schema": "esp-check/run-summary", "verdict": "match"}))
    for name in ("junit.xml", "summary.md", ".summary.json.123.tmp"):
        (out / name).write_text("old")
    (out / "firmware").mkdir()
    (out / "firmware" / "keep").write_text("build")
    junit = tmp_path / "elsewhere.xml"
    junit.write_text("old")
    dest, said = move_aside(out, [junit, tmp_path / "not-there.json"])
    assert dest == out / PREVIOUS_DIR
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "firmware", PREVIOUS_DIR]
    assert (dest / "jobs" / "j" / "m" / "sim" / "result.json").exists() and not junit.exists()
    assert said == [
        f"moved summary.json, junit.xml, summary.md, jobs, .summary.json.123.tmp to {dest}",
        f"deleted {junit}",
    ]
    # a killed run left only jobs/ (the marker says the directory is esp-check's): what it left goes to
    # previous-run/incomplete-run/, and the last complete run's summary and JUnit stay in previous-run/
    (out / "jobs" / "k").mkdir(parents=True)
    moved, said = move_aside(out)
    assert moved == dest / INCOMPLETE_DIR and (moved / "jobs" / "k").is_dir()
    assert said == [
        f"moved jobs to {moved}",
        f"(a run that did not finish; the last complete run's reports stay in {dest})",
    ]
    assert json.loads((dest / "summary.json").read_text())["verdict"] == "match"
    assert (dest / "junit.xml").exists() and (dest / "jobs" / "j" / "m" / "sim" / "result.json").exists()
    # the next complete run's reports replace both
    (out / "summary.json").write_text(json.dumps({"schema": "esp-check/run-summary", "verdict": "mismatch"}))
    move_aside(out)
    assert sorted(p.name for p in dest.iterdir()) == [MARKER, "summary.json"]
    assert move_aside(tmp_path / "empty") == (None, [])
    assert (tmp_path / "empty" / MARKER).is_file()


def test_move_aside_touches_nothing_esp_check_did_not_write(tmp_path: Path) -> None:
    """``--out .`` in a project with its own jobs/ must not move (or later delete) that directory."""
    from harness.errors import UsageError

    mine = tmp_path / "project"
    (mine / "jobs").mkdir(parents=True)
    (mine / "jobs" / "deploy.sh").write_text("precious")
    with pytest.raises(UsageError, match="no esp-check run wrote"):
        move_aside(mine)
    assert (mine / "jobs" / "deploy.sh").read_text() == "precious" and not (mine / MARKER).exists()
    # an esp-check directory whose previous-run/ is someone else's: refused too
    out = tmp_path / "out"
    (out / PREVIOUS_DIR).mkdir(parents=True)
    (out / PREVIOUS_DIR / "notes.txt").write_text("mine")
    (out / MARKER).write_text("")
    (out / "junit.xml").write_text("old")
    with pytest.raises(UsageError, match="not written by esp-check"):
        move_aside(out)
    assert (out / PREVIOUS_DIR / "notes.txt").exists() and (out / "junit.xml").exists()


def test_atomic_write_leaves_the_old_file_when_the_write_fails(tmp_path: Path, monkeypatch) -> None:
    p = tmp_path / "summary.json"
    atomic_write(p, json.dumps({"verdict": "match"}))

    def boom(*_a, **_k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        atomic_write(p, "{half")
    assert json.loads(p.read_text()) == {"verdict": "match"}
    assert [x.name for x in tmp_path.iterdir()] == ["summary.json"]  # no temp file left behind


@pytest.mark.parametrize("content", ["#define X 1\n", b"\x00bin"])
def test_write_if_changed_keeps_an_unchanged_file_and_replaces_a_changed_one_atomically(
    tmp_path: Path, monkeypatch, content: str | bytes
) -> None:
    """The one write-if-changed both the firmware generator and the native build use (nothing faked but
    os.replace, to see the new content go through atomic_write's rename)."""
    p = tmp_path / "sub" / "sdkconfig.h"
    assert write_if_changed(p, content) is True
    raw = content.encode() if isinstance(content, str) else content
    assert p.read_bytes() == raw
    os.utime(p, ns=(1_000_000_000, 1_000_000_000))
    assert write_if_changed(p, content) is False
    assert p.stat().st_mtime_ns == 1_000_000_000  # unchanged: the mtime is kept, nothing rebuilds

    replaced: list[str] = []
    real_replace = os.replace

    def spy(src, dst) -> None:
        replaced.append(Path(dst).name)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    assert write_if_changed(p, raw + b"!") is True
    assert replaced == ["sdkconfig.h"] and p.read_bytes() == raw + b"!"
    assert [x.name for x in p.parent.iterdir()] == ["sdkconfig.h"]


def test_a_relative_board_file_is_relative_to_the_file_naming_it(
    tmp_path: Path, models_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan and an inventory in other directories than the cwd both find '../boards/mine.toml' next
    to themselves (one rule, At.board_ref), not next to the cwd."""
    from harness.resources import boards_dir

    for d in ("plans", "bench", "boards", "cwd/deeper"):
        (tmp_path / d).mkdir(parents=True)
    board_file = tmp_path / "boards" / "mine.toml"
    shutil.copy(boards_dir() / "sim-usbjtag.toml", board_file)
    shutil.copy(models_dir / "op_zoo.tflite", tmp_path / "plans" / "m.tflite")
    shutil.copy(models_dir / "inputs" / "op_zoo.npy", tmp_path / "plans" / "in.npy")
    (tmp_path / "plans" / "plan.toml").write_text(
        '[[job]]\nname = "j"\nmodels = ["m.tflite"]\ninputs = ["in.npy"]\nboards = ["../boards/mine.toml"]\n'
    )
    (tmp_path / "bench" / "bench.toml").write_text(
        '[[board]]\nname = "b1"\ntype = "../boards/mine.toml"\nport = "sim://paths-rel"\n'
    )
    monkeypatch.chdir(tmp_path / "cwd" / "deeper")  # where ../boards/mine.toml does not exist
    plan = load_plan(tmp_path / "plans" / "plan.toml")
    assert [Path(b).resolve() for b in plan.jobs[0].boards] == [board_file.resolve()]
    inventory = load_inventory(tmp_path / "bench" / "bench.toml")
    assert inventory.boards[0].board.source.resolve() == board_file.resolve()
