"""``esp-check run`` plans that name datasets (``dataset = ...`` / ``random_inputs = N`` in a ``[[job]]``).

Real: plan parsing and validation, the dataset loader, the scheduler, flash-and-compare's dataset mode
with esptool 5 flashing over a real pyserial port, the resident loop's frames, the TFLM host reference
and every report. Faked: the board (``sim://``, harness.sim), the outermost edge.
"""

from __future__ import annotations

import json
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from harness.cli import main
from harness.errors import ExitCode, PlanError
from harness.runner import RunOptions, load_inventory, load_plan, run_plan
from harness.runner.plan import dataset_options

ROOT = Path(__file__).resolve().parents[1]
MODEL = "cnn_classifier_11"


def _plan(tmp_path: Path, models_dir: Path, jobs: str) -> Path:
    p = tmp_path / "plan.toml"
    p.write_text(
        '[run]\nbackoff_s = 0.05\n\n[defaults]\nboards = ["sim"]\n'
        "timeouts = { capture_total = 60, capture_silence = 4 }\n" + jobs.replace("MODELS", str(models_dir))
    )
    return p


def _job(name: str, body: str) -> str:
    return f'\n[[job]]\nname = "{name}"\nmodels = ["MODELS/{MODEL}.tflite"]\n{body}\n'


@pytest.fixture
def data_dir(tmp_path: Path, models_dir: Path) -> Path:
    """data/<model stem>/: two inputs of the model (its fixture input and that input flipped)."""
    x = np.load(models_dir / "inputs" / f"{MODEL}.npy")
    d = tmp_path / "data" / MODEL
    d.mkdir(parents=True)
    np.save(d / "a.npy", x)
    np.save(d / "b.npy", np.ascontiguousarray(np.flip(x, axis=-1)))
    return d


def test_a_plan_names_datasets_and_random_inputs(tmp_path: Path, models_dir: Path, data_dir: Path) -> None:
    ds_body = 'dataset = "data/{model}"\nresults = "crc"\nkeep_chunks = "always"'
    plan = load_plan(_plan(tmp_path, models_dir, _job("ds", ds_body)
                           + _job("rnd", "random_inputs = 50\nseed = 7\nrepeat = 2")))  # fmt: skip
    ds, rnd = plan.jobs
    assert ds.cases[0].dataset == data_dir and ds.cases[0].inputs == ()
    opts = dataset_options(ds, ds.cases[0])
    assert (opts.source, opts.random_inputs, opts.results, opts.chunks) == (data_dir, None, "crc", "always")
    opts = dataset_options(rnd, rnd.cases[0])
    assert (opts.source, opts.random_inputs, opts.seed, opts.repeat, opts.chunks) == (None, 50, 7, 2, "auto")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('dataset = "data/nothing-here"', "dataset"),
        ('dataset = "data/{model}"\nrandom_inputs = 3', "random_inputs"),
        ('dataset = "data/{model}"\ninputs = ["data/{model}/a.npy"]', "dataset"),
        ("seed = 3", "seed"),
        ('random_inputs = 3\nresults = "some"', "results"),
        ('random_inputs = 3\nlabels = "l.csv"', "labels"),
        ("random_inputs = 0", "random_inputs"),
        ("random_inputs = 3\nrepeat = 0", "repeat"),
        ('keep_chunks = "always"', "keep_chunks"),  # a dataset setting without a dataset
        ('random_inputs = 3\nkeep_chunks = "sometimes"', "keep_chunks"),
        ('dataset = "bad.npz"', "dataset"),  # an array of the wrong shape for the model
        ('dataset = "data/{model}"\nlabels = "missing.csv"', "labels"),
    ],
)
def test_plan_dataset_errors_name_file_job_and_field(
    tmp_path: Path, models_dir: Path, data_dir: Path, body: str, field: str
) -> None:
    np.savez(tmp_path / "bad.npz", x=np.zeros((2, 3, 3), np.int8))
    p = _plan(tmp_path, models_dir, _job("j1", body))
    with pytest.raises(PlanError) as err:
        load_plan(p)
    msg = err.value.message
    assert str(p) in msg and "job 'j1'" in msg and f"field '{field}'" in msg, msg
    assert err.value.exit_code == ExitCode.USAGE


def test_run_refuses_a_bad_dataset_job_before_any_build(
    tmp_path: Path, models_dir: Path, data_dir: Path, capsys
) -> None:  # type: ignore[no-untyped-def]
    p = _plan(tmp_path, models_dir, _job("j1", 'dataset = "data/{model}-typo"'))
    inv = tmp_path / "bench.toml"
    inv.write_text('[[board]]\nname = "a"\ntype = "sim"\nport = "sim://never-used"\n')
    assert main(["run", str(p), "-i", str(inv), "--out", str(tmp_path / "o")]) == ExitCode.USAGE
    assert "field 'dataset'" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_two_dataset_jobs_on_one_board_reuse_what_is_flashed(
    tmp_path: Path, models_dir: Path, data_dir: Path
) -> None:
    """The second job runs the same firmware on the same board: every region's MD5 matches, 0 B written."""
    import jsonschema

    from harness.sim.board import remove_board

    name = f"rds-{uuid.uuid4().hex[:8]}"
    inv = tmp_path / "bench.toml"
    inv.write_text(f'[[board]]\nname = "b1"\ntype = "sim"\nport = "sim://{name}?emitter=c"\n')
    first_body = 'dataset = "data/{model}"\nresults = "crc"\nkeep_chunks = "never"'
    plan = _plan(tmp_path, models_dir, _job("first", first_body)
                 + _job("second", "random_inputs = 12\nseed = 3"))  # fmt: skip
    out = tmp_path / "out"
    try:
        opts = RunOptions(out_dir=out, lock_dir=tmp_path / "locks", cache_dir=tmp_path / "cache")
        result = run_plan(load_plan(plan), load_inventory(inv), opts)
    finally:
        remove_board(name)
    doc = json.loads((out / "summary.json").read_text())
    jsonschema.validate(doc, json.loads((ROOT / "docs" / "run-summary-schema.json").read_text()))
    tasks = {t["job"]: t for t in doc["tasks"]}
    assert result.exit_code == ExitCode.MATCH, [(t["id"], t["reason"]) for t in doc["tasks"]]
    first, second = tasks["first"], tasks["second"]
    assert first["dataset"]["inputs"] == 2 and first["dataset"]["verdicts"] == {"match": 2}
    assert second["dataset"]["inputs"] == 12 and second["dataset"]["verdicts"] == {"match": 12}
    assert second["dataset"]["agreement"]["optimized_vs_ansi"] == 1.0
    assert [c["comparison"] for c in second["testcases"]] == ["dataset"]
    assert second["testcases"][0]["status"] == "passed"
    names = [c.get("name") for c in ET.parse(out / "junit.xml").getroot().iter("testcase")]
    # one case per dataset job, named input0[<dataset>].dataset (the old writer said "dataset_vs_")
    assert names == [f"input0[{Path(first['model']).stem}].dataset", "input0[random].dataset"], names
    a1, a2 = first["attempts"][0], second["attempts"][0]
    assert a1["ended"] <= a2["started"]  # one board: the first job ran first
    assert sum(v["flash_bytes_written"] for v in a1["variants"].values()) > 0
    assert [v["flash_bytes_written"] for v in a2["variants"].values()] == [0, 0]
    first_report = json.loads(Path(first["dataset"]["report"]).read_text())
    assert first_report["dataset"]["chunks"]["policy"] == "never"  # the plan's keep_chunks reached the job
    report = json.loads(Path(second["dataset"]["report"]).read_text())
    assert report["dataset"]["chunks"]["policy"] == "auto"
    regions = [r for v in report["variants"].values() for r in v["flash"]["regions"]]
    assert regions and all(r["bytes_written"] == 0 and r["skipped"] for r in regions), regions
    assert first["builds"]["optimized"]["firmware_sha256"] == second["builds"]["optimized"]["firmware_sha256"]
