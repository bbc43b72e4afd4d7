"""``esp-check run`` prepares the work its tasks share before the board workers start.

What is real: the plan and inventory, the runner and its worker threads, generation and the sim
builder, esptool over ``sim://`` ports, the TFLM host reference. What is faked: the boards (harness.sim).
The build and reference functions are wrapped only to record which thread ran them.
"""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from harness.errors import ExitCode
from harness.flows import firmware
from harness.model import hostrun
from harness.runner import RunOptions, load_inventory, load_plan, run_plan

pytest.importorskip("tflite_micro")

MODELS = ("cnn_classifier_11", "op_zoo")


def _plan(path: Path, models_dir: Path) -> Path:
    models = json.dumps([str(models_dir / f"{m}.tflite") for m in MODELS])
    path.write_text(
        '[defaults]\ncomparisons = ["optimized-vs-ansi", "each-vs-host"]\n'
        "timeouts = { capture_total = 30, capture_silence = 3 }\n\n"
        f'[[job]]\nname = "j"\nmodels = {models}\n'
        f'inputs = ["{models_dir}/inputs/{{model}}.npy"]\nboards = ["sim"]\nplacement = "each"\n'
    )
    return path


def test_builds_and_references_are_made_once_before_the_boards_start(
    tmp_path: Path, models_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, str]] = []
    real_fw, real_spawn = firmware.prepare_firmware, hostrun._spawn

    def fw(model: Any, *a: Any, **k: Any) -> Any:
        calls.append(("build", threading.current_thread().name))
        return real_fw(model, *a, **k)

    def spawn(*a: Any, **k: Any) -> Any:  # the host reference's child process (reference + arena)
        calls.append(("reference", threading.current_thread().name))
        return real_spawn(*a, **k)

    monkeypatch.setattr(firmware, "prepare_firmware", fw)
    monkeypatch.setattr(hostrun, "_spawn", spawn)
    monkeypatch.setenv("ESP_CHECK_CACHE_DIR", str(tmp_path / "caches"))  # no host result cached yet
    run = uuid.uuid4().hex[:8]
    inv = tmp_path / "bench.toml"
    inv.write_text(
        "\n".join(
            f'[[board]]\nname = "b{k}"\ntype = "sim"\nport = "sim://prep-{run}-{k}?emitter=c"\n'
            for k in range(2)
        )
    )
    result = run_plan(
        load_plan(_plan(tmp_path / "plan.toml", models_dir)),
        load_inventory(inv),
        RunOptions(out_dir=tmp_path / "out", lock_dir=tmp_path / "locks", cache_dir=tmp_path / "cache"),
    )
    assert result.exit_code == ExitCode.MATCH
    assert len(result.tasks) == 4  # 2 models x 2 boards, one firmware per model
    # one firmware per model; the host child (the arena probe generate asks for, then the reference and
    # its arena) at most twice per model, and all of it before the boards start: the jobs read the caches
    assert [kind for kind, _ in calls].count("build") == 2, calls
    assert 2 <= [kind for kind, _ in calls].count("reference") <= 2 * len(MODELS), calls
    assert not [c for c in calls if c[1].startswith("board-")], calls  # none left to a board worker


def test_an_attempt_flashes_the_prepared_firmware_without_generating_it_again(
    tmp_path: Path, models_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: the warm-up generated and built each firmware, then every attempt's job generated its
    projects again (and rebuilt them from the cache). Real: generation, the sim builder, esptool over
    ``sim://``; faked: the boards. ``generate_projects`` is wrapped only to count its calls."""
    generated: list[str] = []
    real = firmware.generate_projects

    def counting(model: Any, *a: Any, **k: Any) -> Any:
        generated.append(Path(model).name)
        return real(model, *a, **k)

    monkeypatch.setattr(firmware, "generate_projects", counting)
    model = models_dir / "cnn_classifier_11.tflite"
    plan = tmp_path / "plan.toml"
    plan.write_text(
        '[defaults]\ntimeouts = { capture_total = 30, capture_silence = 3 }\n\n[[job]]\nname = "j"\n'
        f'models = ["{model}"]\ninputs = ["{models_dir}/inputs/{{model}}.npy"]\nboards = ["sim"]\n'
        'placement = "each"\n'
    )
    run = uuid.uuid4().hex[:8]
    inv = tmp_path / "bench.toml"
    inv.write_text(
        "\n".join(
            f'[[board]]\nname = "b{k}"\ntype = "sim"\nport = "sim://once-{run}-{k}"\n' for k in range(2)
        )
    )
    result = run_plan(
        load_plan(plan),
        load_inventory(inv),
        RunOptions(out_dir=tmp_path / "out", lock_dir=tmp_path / "locks", cache_dir=tmp_path / "cache"),
    )
    assert result.exit_code == ExitCode.MATCH, [t.reason for t in result.tasks]
    assert len(result.tasks) == 2
    assert generated == ["cnn_classifier_11.tflite"], generated  # once for both boards' attempts
    for t in result.tasks:
        for v, outcome in t.attempts[-1].variants.items():
            assert (
                outcome.firmware_sha256 == t.builds[v]["firmware_sha256"]
            )  # what was flashed is what was built


def test_the_summary_records_each_task_s_builds_as_flashed(
    tmp_path: Path, models_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """summary.json's ``builds`` of a task with inputs (its firmware built once, before the boards start)
    are the builds its attempt flashed: SHA-256, cache hit and project directory. Real: the runner,
    generation, the sim builder, esptool over ``sim://``; faked: the board."""
    monkeypatch.setenv("ESP_CHECK_CACHE_DIR", str(tmp_path / "caches"))
    model = models_dir / "cnn_classifier_11.tflite"
    plan = tmp_path / "plan.toml"
    plan.write_text(
        '[defaults]\ntimeouts = { capture_total = 30, capture_silence = 3 }\n\n[[job]]\nname = "j"\n'
        f'models = ["{model}"]\ninputs = ["{models_dir}/inputs/{{model}}.npy"]\nboards = ["sim"]\n'
    )
    inv = tmp_path / "bench.toml"
    inv.write_text(f'[[board]]\nname = "b"\ntype = "sim"\nport = "sim://builds-{uuid.uuid4().hex[:8]}"\n')
    result = run_plan(
        load_plan(plan),
        load_inventory(inv),
        RunOptions(out_dir=tmp_path / "out", lock_dir=tmp_path / "locks", cache_dir=tmp_path / "cache"),
    )
    assert result.exit_code == ExitCode.MATCH, [t.reason for t in result.tasks]
    (task,) = json.loads((tmp_path / "out" / "summary.json").read_text())["tasks"]
    flashed = task["attempts"][-1]["variants"]
    assert sorted(task["builds"]) == ["ansi", "optimized"]
    for v, build in task["builds"].items():
        assert build["firmware_sha256"] == flashed[v]["firmware_sha256"]
        assert build["cache_hit"] == flashed[v]["build_cache_hit"]
        assert Path(build["project_dir"]).is_dir()
    assert task["builds"]["optimized"]["firmware_sha256"] != task["builds"]["ansi"]["firmware_sha256"]
