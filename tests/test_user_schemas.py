"""The files users write are typed models: their JSON Schemas in docs/schemas/ are generated from them,
every shipped file is valid against its schema, and what the models now refuse names file, place and field.

Nothing is faked: real files, real TOML, real jsonschema.
"""

from __future__ import annotations

import os
from pathlib import Path

import jsonschema
import pytest

from harness.errors import ExitCode, PlanError, UsageError
from harness.firmware.board_file import BoardFile
from harness.firmware.boards import load_board
from harness.resources import parse_toml
from harness.runner import load_inventory, load_plan
from harness.runner.plan import Job, JobSettings, Timeouts
from harness.runner.schemas import SCHEMAS, schema_text, write_schemas
from harness.sim import parse_url

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_docs_schemas_are_the_models(name: str) -> None:
    """docs/ is what the models give: after a model change, run `python -m harness.runner.schemas`."""
    assert (DOCS / name).is_file(), f"docs/{name} is missing: python -m harness.runner.schemas"
    assert (DOCS / name).read_text(encoding="utf-8") == schema_text(name), (
        f"docs/{name} is stale: python -m harness.runner.schemas"
    )


def test_the_generator_writes_every_schema(tmp_path: Path) -> None:
    written = write_schemas(tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in written) == sorted(SCHEMAS)
    for p in written:
        jsonschema.Draft202012Validator.check_schema(jsonschema.validators.json.loads(p.read_text()))


@pytest.mark.parametrize(
    ("schema", "files"),
    [
        ("schemas/board.schema.json", sorted((ROOT / "boards").glob("*.toml"))),
        ("schemas/plan.schema.json", sorted((ROOT / "docs" / "examples").glob("plan*.toml"))),
        ("schemas/inventory.schema.json", sorted((ROOT / "docs" / "examples").glob("bench*.toml"))),
    ],
)
def test_every_shipped_file_is_valid_against_its_schema(schema: str, files: list[Path]) -> None:
    validator = jsonschema.Draft202012Validator(jsonschema.validators.json.loads(schema_text(schema)))
    assert files
    for f in files:
        errors = [e.message for e in validator.iter_errors(parse_toml(f.read_text()))]
        assert not errors, f"{f}: {errors}"
        first = f.read_text().splitlines()[0]
        if first.startswith("#:schema "):  # the editor directive points at this very schema
            assert (f.parent / first.split(maxsplit=1)[1]).resolve() == DOCS / schema, first


def test_the_schemas_refuse_what_the_loaders_refuse() -> None:
    board = jsonschema.Draft202012Validator(
        jsonschema.validators.json.loads(schema_text("schemas/board.schema.json"))
    )
    good = parse_toml((ROOT / "boards" / "esp32-devkitc.toml").read_text())
    assert board.is_valid(good)
    for bad in ({"colour": "blue"}, {"chip": "esp8266"}, {"monitor_baud": 12}, {"psram_mb": "8"}):
        assert not board.is_valid({**good, **bad}), bad


def test_the_sim_schema_offers_the_chips_the_simulator_models_and_no_other() -> None:
    """sim-params.schema.json's `chip` lists what parse_url builds a board for; a chip it does not model
    (esp32c6: a real target of the generator) is refused, named."""
    sim = jsonschema.validators.json.loads(schema_text("schemas/sim-params.schema.json"))
    offered = sim["properties"]["chip"].get("enum")
    assert offered == ["esp32", "esp32s3", "esp32c3"], sim["properties"]["chip"]
    assert [parse_url(f"sim://b?chip={c}")[1].chip.name for c in offered] == offered
    with pytest.raises(UsageError, match="does not model chip 'esp32c6'"):
        parse_url("sim://b?chip=esp32c6")


def test_job_defaults_are_the_plans_defaults(tmp_path: Path, models_dir: Path) -> None:
    """A job built in code and a job of a plan without [defaults] get the same settings (written once)."""
    p = tmp_path / "plan.toml"
    p.write_text(
        f'[[job]]\nname = "j"\nmodels = "{models_dir}/op_zoo.tflite"\n'
        f'inputs = "{models_dir}/inputs/op_zoo.npy"\nboards = "sim"\n'
    )
    from_file = load_plan(p).jobs[0]
    in_code = Job(name="j", cases=from_file.cases, boards=from_file.boards)
    assert from_file == in_code
    d = JobSettings()
    assert (in_code.retries, in_code.comparisons, in_code.timeouts) == (d.retries, d.comparisons, Timeouts())


def test_defaults_timeouts_merge_key_by_key(tmp_path: Path, models_dir: Path) -> None:
    p = tmp_path / "plan.toml"
    p.write_text(
        '[defaults]\ntimeouts = { build = 60 }\nboards = ["sim"]\n'
        f'[[job]]\nname = "j"\nmodels = ["{models_dir}/op_zoo.tflite"]\n'
        f'inputs = ["{models_dir}/inputs/op_zoo.npy"]\ntimeouts = {{ capture_total = 9 }}\n'
    )
    t = load_plan(p).jobs[0].timeouts
    assert (t.build, t.capture_total, t.capture_silence) == (60, 9, Timeouts().capture_silence)


# ---- what the hand-written checks let through ------------------------------------------------------


def test_inventory_schema_version_is_checked(tmp_path: Path) -> None:
    p = tmp_path / "bench.toml"
    p.write_text('schema_version = 2\n[[board]]\nname = "a"\ntype = "sim"\nport = "sim://a"\n')
    with pytest.raises(PlanError) as err:
        load_inventory(p)
    assert str(p) in err.value.message and "field 'schema_version'" in err.value.message
    assert err.value.exit_code == ExitCode.USAGE


def test_plan_input_options_are_typed(tmp_path: Path, models_dir: Path) -> None:
    """``scale = true`` was passed on as 1.0; a number is a number."""
    p = tmp_path / "plan.toml"
    p.write_text(
        f'[[job]]\nname = "j1"\nmodels = ["{models_dir}/op_zoo.tflite"]\n'
        f'inputs = ["{models_dir}/inputs/op_zoo.npy"]\nboards = ["sim"]\ninput_options = {{ scale = true }}\n'
    )
    with pytest.raises(PlanError) as err:
        load_plan(p)
    msg = err.value.message
    assert str(p) in msg and "job 'j1'" in msg and "field 'input_options.scale'" in msg, msg


def test_unknown_key_is_named_before_the_missing_one_it_explains(tmp_path: Path) -> None:
    p = tmp_path / "plan.toml"
    p.write_text('[[job]]\nname = "j1"\nmodel = ["x.tflite"]\ninputs = ["x.npy"]\nboards = ["sim"]\n')
    with pytest.raises(PlanError) as err:
        load_plan(p)
    assert "job 'j1': field 'model' is not a job field" in err.value.message
    assert err.value.hint and "models" in err.value.hint


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ("noise=2", "noise"),
        ("corrupt_frac=1.5", "corrupt_frac"),
        ("frame_every=0", "frame_every"),
        ("throttle=-9600", "throttle"),
        ("seed=x", "seed"),
    ],
)
def test_sim_parameters_have_ranges(query: str, words: str) -> None:
    """A bit-flip rate of 2 or a frame_every of 0 was taken (or silently changed); now it is a usage error."""
    with pytest.raises(UsageError, match=f"simulator parameter {words}"):
        parse_url(f"sim://x?chip=esp32s3&{query}")


def test_board_defaults_are_the_board_files(tmp_path: Path) -> None:
    """A board file that leaves out every optional field gets BoardFile's defaults (written once)."""
    text = (ROOT / "boards" / "esp32-devkitc.toml").read_text()
    required = [ln for ln in text.splitlines() if ln.split(" = ")[0] in BoardFile.model_fields]
    required = [ln for ln in required if BoardFile.model_fields[ln.split(" = ")[0]].is_required()]
    p = tmp_path / "esp32-devkitc.toml"
    p.write_text("\n".join(required) + "\n")
    b = load_board(p)
    defaults = BoardFile.model_fields
    assert b.partition_table_offset == defaults["partition_table_offset"].default
    assert b.simulated is defaults["simulated"].default and b.default_port is None
    assert (b.sdkconfig, b.sim, b.native, b.idf_min, b.chip_revisions) == ({}, {}, {}, None, None)


def test_a_discovered_place_is_checked_as_an_inventory_board_is(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A place's esp_check_console tag goes through the same model as an inventory's console field.

    Faked: the ``labgrid-client`` executable (a script answering ``places`` and ``show``).
    """
    from harness.runner.inventory import discover_inventory

    client = tmp_path / "labgrid-client"
    client.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        '  *places*) echo "s3-a" ;;\n'
        "  *show*) printf \"Place 's3-a':\\n  tags: esp_check_type=sim, esp_check_console=jtag\\n\" ;;\n"
        "esac\n"
    )
    client.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(PlanError) as err:
        discover_inventory("lab:20408")
    msg = err.value.message
    assert "labgrid-lab:20408" in msg and "board 's3-a'" in msg and "field 'console'" in msg, msg
    assert "'jtag'" in msg and "usb_serial_jtag" in msg, msg


def test_the_generated_report_schema_keeps_the_rules_of_the_written_one() -> None:
    """docs/report-schema.json was written by hand; generated from CompareReport it must still refuse
    what it refused (and the report of every kind of comparison must still be valid)."""
    import copy

    import numpy as np

    from harness.analysis.compare import OutputTensor, Source, compare_sources
    from harness.analysis.report import report_dict

    def src(label: str, arr: np.ndarray, scale: float | None) -> Source:
        t = OutputTensor(0, arr, raw=scale is not None, shape=arr.shape, dtype=str(arr.dtype), scale=scale,
                         zero_point=0 if scale else None, name="o")  # fmt: skip
        return Source(label, "protocol", [[t]], nn_mode="optimized" if label == "A" else "ansi_c")

    schema = jsonschema.Draft202012Validator(
        jsonschema.validators.json.loads(schema_text("report-schema.json"))
    )
    ints = report_dict(
        compare_sources(src("A", np.array([1, 2], np.int8), 0.5), src("B", np.array([1, 3], np.int8), 0.5))
    )
    real = np.array([0.5, np.nan], np.float32), np.array([0.5, 1.0], np.float32)
    floats = report_dict(compare_sources(src("A", real[0], None), src("B", real[1], None)))
    for doc in (ints, floats):
        assert schema.is_valid(doc), [e.message for e in schema.iter_errors(doc)]
    assert "diff_lsb" in ints["comparisons"][0]["first_mismatches"][0]
    assert "diff_lsb" not in floats["comparisons"][0]["first_mismatches"][0]  # no scale: no LSB
    assert floats["comparisons"][0]["max_abs_diff"] in ("nan", "inf")  # non-finite: a string in JSON
    for key, value in (("verdict", "fine"), ("exit_code", 5), ("schema_version", 1), ("tolerance_lsb", -1),
                       ("sources", ints["sources"][:1]), ("warnings", [1])):  # fmt: skip
        bad = {**ints, key: value}
        assert not schema.is_valid(bad), key
    for key, value in (("units", "bits"), ("max_abs_diff", "NaN"), ("topk_agreement", 2), ("run", -1),
                       ("first_mismatches", [{"index": 1, "a": 1}])):  # fmt: skip
        bad = copy.deepcopy(ints)
        bad["comparisons"][0][key] = value
        assert not schema.is_valid(bad), key
