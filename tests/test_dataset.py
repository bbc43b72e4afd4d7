"""Dataset mode: loading datasets, per-input verdicts, and whole runs on the simulated board.

What is faked: the board (harness.sim, running the firmware's own C loop) and, in the analysis unit
tests, the legs (hand-made results). The host reference is the real TFLM wheel, the frames and the
client the real ones.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from harness.analysis.dataset import Leg, OutputSpec, analyze, host_leg
from harness.cli import main
from harness.errors import ExitCode, InputDataError
from harness.flows.dataset import DatasetOptions
from harness.flows.flash_and_compare import flash_and_compare
from harness.flows.job import JobOptions
from harness.flows.records import StageTimeouts
from harness.model.dataset import load_dataset, random_dataset
from harness.model.loader import load_model
from harness.protocol.frames import prng_bytes
from harness.sim.board import remove_board

MODEL = "cnn_classifier_11.tflite"


@pytest.fixture(scope="module")
def tensor(models_dir: Path):  # type: ignore[no-untyped-def]
    return load_model(models_dir / MODEL).inputs[0]


# ---- loading ------------------------------------------------------------------------------------------


def test_folder_per_class_gives_labels(tmp_path: Path, models_dir: Path, tensor) -> None:  # type: ignore[no-untyped-def]
    src = models_dir / "inputs"
    for cls, name in (("cat", "cnn_classifier_11.png"), ("dog", "cnn_classifier_11__ambiguous.png")):
        (tmp_path / cls).mkdir()
        (tmp_path / cls / name).write_bytes((src / name).read_bytes())
    (tmp_path / "dog" / "notes.md").write_text("not an input")
    (tmp_path / "classes.txt").write_text("cat\ndog\n")  # class names need the class list
    ds = load_dataset(tmp_path, tensor)
    assert [it.name for it in ds.items] == [
        "cat/cnn_classifier_11.png",
        "dog/cnn_classifier_11__ambiguous.png",
    ]
    assert [it.label for it in ds.items] == ["cat", "dog"] and ds.classes == ["cat", "dog"]
    assert [ds.label_index(it) for it in ds.items] == [0, 1]
    from harness.model.inputs import input_tensor_bytes

    assert ds.items[0].data == input_tensor_bytes([src / "cnn_classifier_11.png"], tensor)[0]


def test_npz_list_and_label_files(tmp_path: Path, models_dir: Path, tensor) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(2)
    x = rng.integers(-128, 128, (5, 1, 32, 32, 3), dtype=np.int8)
    np.savez(tmp_path / "d.npz", x=x, y=np.array([3, 1, 4, 1, 5]))
    ds = load_dataset(tmp_path / "d.npz", tensor)
    assert [it.data for it in ds.items] == [a.tobytes() for a in x]
    assert [ds.label_index(it) for it in ds.items] == [3, 1, 4, 1, 5] and ds.classes == []
    src = models_dir / "inputs"
    (tmp_path / "list.txt").write_text(
        f"# two files\n{src / 'cnn_classifier_11.png'},7\n\n{src / 'cnn_classifier_11.npy'}\n"
    )
    ds = load_dataset(tmp_path / "list.txt", tensor)
    assert [it.label for it in ds.items] == ["7", None]
    (tmp_path / "labels.json").write_text(json.dumps({"cnn_classifier_11.npy": 2}))
    ds = load_dataset(tmp_path / "list.txt", tensor, labels=tmp_path / "labels.json")
    assert [ds.label_index(it) for it in ds.items] == [7, 2]
    (tmp_path / "labels.csv").write_text("name,label\ncnn_classifier_11.png,9\ncnn_classifier_11.npy,1\n")
    ds = load_dataset(tmp_path / "list.txt", tensor, labels=tmp_path / "labels.csv")
    assert [ds.label_index(it) for it in ds.items] == [9, 1]


def test_labels_file_covering_some_inputs_is_refused(tmp_path: Path, models_dir: Path, tensor) -> None:  # type: ignore[no-untyped-def]
    """A --labels file that leaves inputs unlabelled would give an accuracy over part of the dataset
    ("0/1" for 3 inputs) that reads as the whole's: refused, naming what it misses."""
    src = models_dir / "inputs"
    names = ("cnn_classifier_11.png", "cnn_classifier_11.npy", "cnn_classifier_11__ambiguous.png")
    (tmp_path / "list.txt").write_text("".join(f"{src / n}\n" for n in names))
    (tmp_path / "labels.csv").write_text("cnn_classifier_11.png,4\n")
    with pytest.raises(
        InputDataError, match=r"no label for 2 of the dataset's 3 inputs \(\S*cnn_classifier_11\.npy"
    ):
        load_dataset(tmp_path / "list.txt", tensor, labels=tmp_path / "labels.csv")


def test_bad_datasets_are_usage_errors(tmp_path: Path, tensor) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "empty").mkdir()
    np.savez(tmp_path / "two.npz", a=np.zeros(3), b=np.zeros(3))
    (tmp_path / "l.txt").write_text("missing.png\n")
    np.savez(tmp_path / "ok.npz", x=np.zeros((2, 1, 32, 32, 3), np.int8))
    (tmp_path / "none.json").write_text(json.dumps({"other": 1}))
    for path, labels, msg in (
        (tmp_path / "empty", None, "holds no inputs"),
        (tmp_path / "two.npz", None, "which array holds the inputs"),
        (tmp_path / "l.txt", None, "does not exist"),
        (tmp_path / "x.csv", None, "not a directory, .npz or .txt"),
        (tmp_path / "ok.npz", tmp_path / "none.json", "names none of the dataset"),
    ):
        with pytest.raises(InputDataError, match=msg):
            load_dataset(path, tensor, labels=labels)


_INPUT = (1, 32, 32, 3)  # the model's input shape
_BAD_DATASETS = {  # file -> (what it holds, what the message says, what its hint says)
    "scalar.npz": (
        {"x": np.int8(3)},
        r"x is a single value, not a list of inputs",
        r"x of shape \(N, 1, 32, 32, 3\)",
    ),
    "labels.npz": ({"y": np.array([1, 2])}, r"holds labels \(y\) but no inputs", r"name the inputs one of x"),
    "nothing.npz": ({}, r"an empty \.npz \(no arrays\)", r"name the inputs one of x"),
    "zero.npz": (
        {"x": np.zeros((0, *_INPUT), np.int8)},
        r"holds no inputs",
        r"x of shape \(N, 1, 32, 32, 3\)",
    ),
    "count.npz": (
        {"x": np.zeros((2, *_INPUT), np.int8), "y": np.array([1, 2, 3])},
        r"x holds 2 inputs but y holds 3 labels",
        r"one label per input \(y of shape \(2,\)\)",
    ),
    "nan.npz": (
        {"x": np.full((2, *_INPUT), np.nan, np.float32)},
        r"nan\.npz\[0\]: input contains NaN",
        r"finite",
    ),
    "list.txt": (
        None,
        r"line 1: missing\.png does not exist \(looked for \S+missing\.png\)",
        r"list's folder",
    ),
}


@pytest.mark.parametrize("name", list(_BAD_DATASETS))
def test_a_bad_dataset_says_what_is_wrong_and_how_to_fix_it(tmp_path: Path, tensor, name: str) -> None:  # type: ignore[no-untyped-def]
    """Each malformed --dataset is refused with what is wrong and a hint that fixes it (before: a 0-d x
    read "x and None do not have the same number of entries", an .npz of labels only was taken as the
    inputs, an empty x got a hint listing image extensions, the rest no hint at all)."""
    arrays, message, hint = _BAD_DATASETS[name]
    if arrays is None:
        (tmp_path / name).write_text("missing.png\n")
    else:
        np.savez(tmp_path / name, **arrays)
    with pytest.raises(InputDataError, match=message) as err:
        load_dataset(tmp_path / name, tensor)
    assert err.value.hint is not None and re.search(hint, err.value.hint), err.value.hint


def test_random_inputs_are_the_device_prngs(tensor) -> None:  # type: ignore[no-untyped-def]
    ds = random_dataset(4, 99, tensor)
    assert ds.random and ds.seed == 99 and len(ds) == 4
    assert [it.data for it in ds.items] == [prng_bytes(99, i, "int8", 3072) for i in range(4)]
    with pytest.raises(InputDataError):
        random_dataset(0, 1, tensor)


# ---- the per-input analysis ---------------------------------------------------------------------------

OUT = [OutputSpec("int8", (1, 4), "class")]


def _leg(values: list[int], data: bool = True, **kw: object) -> Leg:
    a = np.array([values], np.int8)
    return Leg("ok", (zlib.crc32(a.tobytes()),), [a] if data else None, **kw)  # type: ignore[arg-type]


def test_crc_equality_data_differences_and_unknowns() -> None:
    host = [host_leg([np.array([[1, 2, 9, 4]], np.int8)]) for _ in range(5)]
    opt = [_leg([1, 2, 9, 4], data=False), _leg([1, 2, 9, 7]), _leg([1, 2, 9, 5], data=False),
           Leg("invoke_failed", detail="status 1"), _leg([1, 2, 9, 4], nondeterministic=True)]  # fmt: skip
    ansi = [_leg([1, 2, 9, 4], data=False), _leg([1, 2, 9, 4], data=False), _leg([1, 2, 9, 4], data=False),
            _leg([1, 2, 9, 4]), Leg("missing")]  # fmt: skip
    a = analyze(
        [f"in{i}" for i in range(5)], [2, 2, 2, None, 0], OUT, {"optimized": opt, "ansi": ansi, "host": host}
    )
    # input 4: ANSI C's result is missing, but the optimized one is non-deterministic: a finding stays a
    # finding whatever else is unknown (findings before incompleteness, as the exit-code precedence)
    assert [r.verdict for r in a.rows] == [
        "match", "mismatch", "incomplete", "device_error", "nondeterministic"
    ]  # fmt: skip
    assert a.rows[0].lsb == {"optimized_vs_ansi": 0.0, "optimized_vs_host": 0.0, "ansi_vs_host": 0.0}
    assert a.rows[1].lsb["optimized_vs_ansi"] == 3.0  # ANSI C's bytes inferred from the host's equal CRC
    assert a.rows[2].lsb["optimized_vs_ansi"] is None  # CRCs differ, nothing fetched: never "agreement"
    assert a.exit_code == ExitCode.FIRMWARE_FAULT  # device error > mismatch > incomplete
    assert a.classifier and a.top1["optimized_vs_ansi"] == {"compared": 2, "agree": 2}
    assert a.accuracy["host"] == {"labelled": 4, "correct": 3}  # argmax 2 on inputs 0-2, label 0 on input 4
    assert [r.index for r in a.disagreeing()] == [1, 4]
    pairs = a.to_dict()["agreement"]
    assert pairs["optimized_vs_ansi"]["max_lsb_per_output"] == [3.0]
    assert pairs["optimized_vs_ansi"]["mean_lsb_per_output"] == [3.0 / 8]  # 2 inputs x 4 elements


def test_the_pair_keys_are_one_table() -> None:
    """dataset.PAIRS spells each comparison pair's report key once, with its two legs; analyze's rows and
    agreement (and the tap's divergences, the dataset table) take the keys from it."""
    from harness.analysis.dataset import PAIRS

    assert PAIRS == {
        "optimized_vs_ansi": ("optimized", "ansi"),
        "optimized_vs_host": ("optimized", "host"),
        "ansi_vs_host": ("ansi", "host"),
    }
    host = [host_leg([np.array([[1, 2, 9, 4]], np.int8)])]
    a = analyze(
        ["in0"], [None], OUT, {"optimized": [_leg([1, 2, 9, 7])], "ansi": [_leg([1, 2, 9, 4])], "host": host}
    )
    assert list(a.pairs) == list(a.rows[0].lsb) == list(PAIRS)
    assert a.rows[0].detail == "optimized vs ANSI C differ by 3; optimized_vs_host differ by 3"


def test_the_disagreeing_inputs_table_prints_each_pair_under_its_heading() -> None:
    """flash-and-compare --dataset's table of the worst inputs: one column per pair of PAIRS, in its
    order (opt vs ansi, opt vs host, ansi vs host). Faked: nothing (the console records its text)."""
    from rich.console import Console

    from harness.commands.device_cmds import _print_dataset

    host = [host_leg([np.array([[1, 2, 9, 4]], np.int8)]) for _ in range(2)]
    opt = [_leg([1, 2, 9, 7]), _leg([1, 2, 9, 4], nondeterministic=True)]
    ansi = [_leg([1, 2, 9, 4], data=False), Leg("missing")]
    a = analyze(["in0", "in1"], [None, None], OUT, {"optimized": opt, "ansi": ansi, "host": host})
    console = Console(record=True, width=120)
    _print_dataset(console, {"source": "ds", "inputs": 2, "analysis": a.to_dict()})
    lines = console.export_text().splitlines()
    head = lines.index("┃ input ┃ verdict          ┃ opt vs ansi ┃ opt vs host ┃ ansi vs host ┃")
    assert lines[head + 2 : head + 4] == [
        "│ 0 in0 │ mismatch         │ 3.0         │ 3.0         │ 0.0          │",
        "│ 1 in1 │ nondeterministic │ -           │ 0.0         │ -            │",
    ]


def test_nondeterminism_is_a_mismatch() -> None:
    legs = {"optimized": [_leg([1, 2, 3, 4], nondeterministic=True)], "ansi": [_leg([1, 2, 3, 4])]}
    a = analyze(["x"], [None], OUT, legs)
    assert a.rows[0].verdict == "nondeterministic" and a.exit_code == ExitCode.MISMATCH


# ---- whole runs on the simulated board ----------------------------------------------------------------


@pytest.fixture
def sim_port():  # type: ignore[no-untyped-def]
    names: list[str] = []

    def make(query: str = "") -> str:
        name = f"ds-{uuid.uuid4().hex[:10]}"
        names.append(name)
        return f"sim://{name}?emitter=c{query}"

    yield make
    for n in names:
        remove_board(n)


def _run(models_dir: Path, out: Path, port: str, **opts: object):  # type: ignore[no-untyped-def]
    return flash_and_compare(
        models_dir / MODEL,
        [],
        board="sim",
        port=port,
        out_dir=out,
        options=JobOptions(
            dataset=DatasetOptions(**opts), timeouts=StageTimeouts(capture_total=60, capture_silence=4)
        ),
    )


def _doc(result) -> dict:  # type: ignore[no-untyped-def]
    import jsonschema

    doc = json.loads(result.report_path.read_text())
    schema = json.loads((Path(__file__).parents[1] / "docs" / "flash-and-compare-schema.json").read_text())
    jsonschema.validate(doc, schema)
    return doc


@pytest.mark.parametrize("results", ["full", "crc"])
def test_random_inputs_match_and_crc_mode_fetches_nothing_when_equal(
    tmp_path: Path, models_dir: Path, sim_port, results: str
) -> None:
    r = _run(models_dir, tmp_path / "o", sim_port(), random_inputs=24, seed=11, results=results)
    assert r.exit_code == ExitCode.MATCH, (r.errors, r.stages)
    doc = _doc(r)
    a = doc["dataset"]["analysis"]
    assert a["verdicts"] == {"match": 24} and a["agreement"]["optimized_vs_ansi"]["bit_exact"] == 24
    link = doc["dataset"]["link"]
    assert all(s["tx_payload"] == 0 for s in link.values())  # random inputs: nothing uploaded
    got = sum(s["rx_payload"] for s in link.values())
    assert got == (2 * 24 * 11 if results == "full" else 0)  # crc: equal to the host, no output sent


def test_a_kernel_bug_over_a_dataset_is_found_and_ranked(tmp_path: Path, models_dir: Path, sim_port) -> None:
    """--results crc with a wrong optimized kernel: every input differs, each is fetched in full from
    both sides, ranked by LSB; the CLI exits 1."""
    port = sim_port("&fault=corrupt&variant_fault=optimized&corrupt_lsb=2&corrupt_frac=0.3")
    r = _run(models_dir, tmp_path / "o", port, random_inputs=10, seed=3, results="crc")
    assert r.exit_code == ExitCode.MISMATCH
    a = _doc(r)["dataset"]["analysis"]
    assert a["verdicts"] == {"mismatch": 10}
    assert a["agreement"]["optimized_vs_ansi"]["max_lsb_per_output"] == [2.0]
    assert a["agreement"]["ansi_vs_host"]["bit_exact"] == 10
    assert len(a["disagreeing"]) == 10 and a["disagreeing"][0]["max_lsb"]["optimized_vs_ansi"] == 2.0


def test_repeat_finds_a_nondeterministic_kernel(tmp_path: Path, models_dir: Path, sim_port) -> None:
    r = _run(models_dir, tmp_path / "o", sim_port("&fault=flaky&variant_fault=ansi"), random_inputs=6,
             seed=1, repeat=2)  # fmt: skip
    assert r.exit_code == ExitCode.MISMATCH
    doc = _doc(r)
    assert doc["dataset"]["analysis"]["verdicts"] == {"nondeterministic": 6}
    assert doc["dataset"]["after_reset"]["variant"] in ("optimized", "ansi")


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["frame_tx&frame_every=3", "frame_rx&frame_every=4", "stall&fault_count=3"])
def test_streaming_faults_in_a_dataset_never_match(
    tmp_path: Path, models_dir: Path, sim_port, fault: str
) -> None:
    r = _run(models_dir, tmp_path / "o", sim_port(f"&fault={fault}&variant_fault=optimized"),
             random_inputs=12, seed=5)  # fmt: skip
    assert r.exit_code == ExitCode.INFRASTRUCTURE, r.errors
    doc = _doc(r)
    assert doc["verdict"] != "match"
    verdicts = doc["dataset"]["analysis"]["verdicts"]
    # repaired (inputs whose results were lost are run again) or incomplete: never a mismatch, never clean
    assert set(verdicts) <= {"match", "incomplete"} and sum(verdicts.values()) == 12
    assert verdicts.get("match", 0) >= 6
    assert any(f["kind"] == "link_repair" for f in r.variants["optimized"].findings)


def test_a_dataset_link_that_needed_repairs_is_a_failed_stage(
    tmp_path: Path, models_dir: Path, sim_port
) -> None:
    """The dataset path judges the link after the per-input verdicts: a link that needed repairs is
    exit 3 and report.json names the stage that failed (``link``). Faked: the board (sim://)."""
    r = _run(models_dir, tmp_path / "o", sim_port("&fault=frame_rx&frame_every=4&variant_fault=optimized"),
             random_inputs=4, seed=5)  # fmt: skip
    assert r.exit_code == ExitCode.INFRASTRUCTURE, r.errors
    failed = [
        (s["stage"], s["variant"], s["exit_code"]) for s in _doc(r)["stages"] if s["status"] == "failed"
    ]
    assert ("link", "optimized", ExitCode.INFRASTRUCTURE) in failed, failed


def test_cli_dataset_run_with_labels(tmp_path: Path, models_dir: Path, sim_port, capsys) -> None:  # type: ignore[no-untyped-def]
    src = models_dir / "inputs"
    data = tmp_path / "data"
    for k, name in (("4", "cnn_classifier_11.png"), ("9", "cnn_classifier_11__ambiguous.png")):
        (data / k).mkdir(parents=True)  # folder-per-class, integer folder names are class indices
        (data / k / name).write_bytes((src / name).read_bytes())
    rc = main(["flash-and-compare", str(models_dir / MODEL), "--dataset", str(data), "--board", "sim",
               "--port", sim_port(), "--out", str(tmp_path / "o"), "--results", "crc"])  # fmt: skip
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 0 and "2 inputs: match 2" in err and "accuracy host:" in err, err
    rc = main(["flash-and-compare", str(models_dir / MODEL), "--dataset", str(data),
               "--input", str(src / "cnn_classifier_11.png"), "--out", str(tmp_path / "o2")])  # fmt: skip
    assert rc == 2


# ---- --tap-inputs: the tap flow on chosen inputs of a dataset -----------------------------------------


@pytest.mark.slow
def test_tap_inputs_name_the_faulty_op_of_a_chosen_dataset_input(
    tmp_path: Path, models_dir: Path, sim_port
) -> None:
    """A wrong optimized CONV_2D (op 3, injected by the simulated board, never printed by it): the
    dataset finds the inputs that differ, and the tap run on input 4 and on the worst one names op 3
    from the device's per-op records alone."""
    port = sim_port(
        "&fault=op_corrupt&fault_op=3&fault_region=last_row&variant_fault=optimized&corrupt_lsb=2"
    )
    r = flash_and_compare(
        models_dir / MODEL,
        [],
        board="sim",
        port=port,
        out_dir=tmp_path / "o",
        options=JobOptions(
            bundle=tmp_path / "b.zip",
            dataset=DatasetOptions(random_inputs=6, seed=2, tap_inputs=("4", "worst")),
            timeouts=StageTimeouts(capture_total=60, capture_silence=4),
        ),
    )
    assert r.exit_code == ExitCode.MISMATCH, (r.errors, r.stages)
    assert r.tap is not None and r.tap.culprit is not None, r.errors
    assert (r.tap.culprit.op, r.tap.culprit.opcode, r.tap.culprit.kind) == (3, "CONV_2D", "output")
    assert (r.tap.culprit.a, r.tap.culprit.b) == ("optimized", "ansi")
    doc = _doc(r)
    assert doc["tap"]["culprit"]["op"] == 3
    tapped = doc["dataset"]["tap_inputs"]
    worst = doc["dataset"]["analysis"]["disagreeing"][0]["index"]
    assert [d["index"] for d in tapped] == ([4] if worst == 4 else [4, worst])
    tensor = load_model(models_dir / MODEL).inputs[0]
    first = np.load(tapped[0]["file"])
    assert first.dtype == np.dtype(tensor.dtype) and first.tobytes() == prng_bytes(
        2, 4, tensor.dtype, first.nbytes
    )
    assert any(s.stage.startswith("tap:") for s in r.stages)
    with zipfile.ZipFile(tmp_path / "b.zip") as z:  # the bug-report bundle carries the tapped inputs
        assert z.read("inputs/0/input-00004.npy") == Path(tapped[0]["file"]).read_bytes()


@pytest.mark.slow
def test_tap_inputs_on_a_clean_dataset_find_no_divergence(
    tmp_path: Path, models_dir: Path, sim_port, capsys
) -> None:  # type: ignore[no-untyped-def]
    rc = main(["flash-and-compare", str(models_dir / MODEL), "--random-inputs", "4", "--seed", "9",
               "--board", "sim", "--port", sim_port(), "--out", str(tmp_path / "o"),
               "--tap-inputs", "1,worst"])  # fmt: skip
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 0, err
    assert "agree on every op checksum" in err and "tapped input 1 (index)" in err
    assert "no input disagrees" in err
    doc = _doc(type("R", (), {"report_path": tmp_path / "o" / "report.json"})())
    assert doc["tap"]["culprit"] is None and [d["index"] for d in doc["dataset"]["tap_inputs"]] == [1]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--random-inputs", "5", "--tap-inputs", "5"], "the dataset has 5 input(s)"),
        (["--random-inputs", "5", "--tap-inputs", "2,x"], "neither a dataset index"),
        (["--random-inputs", "5", "--tap-inputs", "-1"], "neither a dataset index"),
        (["--random-inputs", "5", "--tap"], "--tap-inputs"),
        (["--input", "x.png", "--tap-inputs", "1"], "needs --dataset"),
    ],
)
def test_tap_inputs_usage_errors(
    tmp_path: Path, models_dir: Path, capsys, args: list[str], says: str
) -> None:  # type: ignore[no-untyped-def]
    rc = main(["flash-and-compare", str(models_dir / MODEL), "--out", str(tmp_path / "o"), *args])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2 and says in err, err


# ---- class names need the model's class list ----------------------------------------------------------


def _two_class_folders(root: Path, models_dir: Path, names: tuple[str, str]) -> None:
    src = models_dir / "inputs"
    for cls, name in zip(names, ("cnn_classifier_11.png", "cnn_classifier_11__ambiguous.png"), strict=True):
        (root / cls).mkdir(parents=True)
        (root / cls / name).write_bytes((src / name).read_bytes())


def test_folder_names_without_a_class_list_are_refused(tmp_path: Path, models_dir: Path, tensor) -> None:  # type: ignore[no-untyped-def]
    """micro_speech's classes are silence, unknown, yes, no: sorted folder names `no`, `yes` would map
    to outputs 0 and 1, both wrong. Without the list there is no right answer: refuse."""
    _two_class_folders(tmp_path / "d", models_dir, ("yes", "no"))
    with pytest.raises(InputDataError, match="class names") as exc:
        load_dataset(tmp_path / "d", tensor)
    assert "classes.txt" in (exc.value.hint or "")


def test_the_class_list_gives_the_output_index(tmp_path: Path, models_dir: Path, tensor) -> None:  # type: ignore[no-untyped-def]
    _two_class_folders(tmp_path / "d", models_dir, ("yes", "no"))
    (tmp_path / "d" / "classes.txt").write_text("# micro_speech\nsilence\nunknown\nyes\nno\n")
    ds = load_dataset(tmp_path / "d", tensor)
    assert {it.label: ds.label_index(it) for it in ds.items} == {"yes": 2, "no": 3}
    beside = tmp_path / "e"
    _two_class_folders(beside / "test", models_dir, ("yes", "no"))
    (beside / "classes.txt").write_text("silence\nunknown\nyes\nno\n")  # beside the dataset folder
    ds2 = load_dataset(beside / "test", tensor)
    assert {it.label: ds2.label_index(it) for it in ds2.items} == {"yes": 2, "no": 3}
    api = load_dataset(tmp_path / "d", tensor, classes=["no", "yes"])
    assert {it.label: api.label_index(it) for it in api.items} == {"yes": 1, "no": 0}


def test_a_folder_the_class_list_lacks_is_refused(tmp_path: Path, models_dir: Path, tensor) -> None:  # type: ignore[no-untyped-def]
    _two_class_folders(tmp_path / "d", models_dir, ("yes", "maybe"))
    (tmp_path / "d" / "classes.txt").write_text("silence\nunknown\nyes\nno\n")
    with pytest.raises(InputDataError, match="'maybe' is not in the class list"):
        load_dataset(tmp_path / "d", tensor)
    (tmp_path / "d" / "classes.txt").write_text("yes\nyes\n")
    with pytest.raises(InputDataError, match="listed twice"):
        load_dataset(tmp_path / "d", tensor)


# ---- kept inputs: each uploaded input crosses the link once per check (docs/protocol.md "Kept inputs") --


def _npz(tmp_path: Path, n: int) -> Path:
    x = np.random.default_rng(25).integers(-128, 128, (n, 1, 32, 32, 3), dtype=np.int8)
    np.savez(tmp_path / "d.npz", x=x)
    return tmp_path / "d.npz"


@pytest.mark.parametrize("results", ["full", "crc"])
def test_uploaded_inputs_cross_the_link_once_and_match_like_uploads(
    tmp_path: Path, models_dir: Path, sim_port, results: str
) -> None:
    """The first variant uploads each input and keeps it in PSRAM; the second runs it from there by index
    and CRC-32 (no LOAD): the same verdicts as uploads, and half the host-to-device bytes."""
    n = 12
    r = _run(models_dir, tmp_path / "o", sim_port(), source=_npz(tmp_path, n), results=results)
    assert r.exit_code == ExitCode.MATCH, (r.errors, r.stages)
    doc = _doc(r)
    a = doc["dataset"]["analysis"]
    assert a["verdicts"] == {"match": n} and a["agreement"]["optimized_vs_ansi"]["bit_exact"] == n
    # whichever variant runs first (the board's running slot) uploads; the other runs what it kept
    first, second = sorted(doc["dataset"]["link"].values(), key=lambda x: x["kept_runs"])
    assert first["tx_payload"] == n * 3072 and first["kept_runs"] == 0
    assert second["tx_payload"] == 0 and second["kept_runs"] == n and second["kept_fallbacks"] == 0
    assert second["tx_bytes"] < first["tx_bytes"] / 20  # RUN commands only


@pytest.mark.parametrize("fault", ["keep_cold", "keep_stale", "keep_flip"])
def test_a_lost_stale_or_damaged_kept_store_falls_back_to_uploads(
    tmp_path: Path, models_dir: Path, sim_port, fault: str
) -> None:
    """PSRAM that a restart did not keep (noise), that holds another model's store, or whose kept inputs
    changed: the device runs none of them; the host uploads them and the check is the same clean match."""
    n = 6
    r = _run(
        models_dir, tmp_path / "o", sim_port(f"&fault={fault}"), source=_npz(tmp_path, n), results="full"
    )
    assert r.exit_code == ExitCode.MATCH, (r.errors, r.stages)
    doc = _doc(r)
    assert doc["dataset"]["analysis"]["verdicts"] == {"match": n}
    assert all(x["tx_payload"] == n * 3072 for x in doc["dataset"]["link"].values())  # uploaded after all
    second = max(doc["dataset"]["link"].values(), key=lambda x: x["kept_runs"])
    # a store the app found invalid at boot is not asked for at all; a damaged copy is refused per input
    assert second["kept_fallbacks"] == (n if fault == "keep_flip" else 0)


# ---- a dataset larger than the store runs in chunks of its capacity (docs/dataset.md) -----------------


@pytest.fixture
def store_of_4(monkeypatch: pytest.MonkeyPatch) -> int:
    """A kept-input store that holds 4 of cnn_classifier_11's 3,072-byte inputs (the generated app's
    kKeepBytes; the simulated board reads it from the manifest). Nothing else is faked."""
    from harness.firmware import generate

    monkeypatch.setattr(generate, "KEEP_STORE_BYTES", 64 + 16 + 4 * (3072 + 8))
    return 4


def _link(doc: dict) -> tuple[int, int, int]:  # type: ignore[type-arg]
    links = doc["dataset"]["link"].values()
    return (
        sum(x["tx_payload"] for x in links),
        sum(x["kept_runs"] for x in links),
        sum(x["kept_fallbacks"] for x in links),
    )


@pytest.mark.parametrize("results", ["full", "crc"])
def test_a_dataset_larger_than_the_store_crosses_the_link_once_in_chunks(
    tmp_path: Path, models_dir: Path, sim_port, store_of_4: int, results: str
) -> None:
    """10 inputs, a store of 4: chunks 0-3, 4-7, 8-9, each uploaded and kept by the variant running, then
    run from the store by the other: every input is uploaded once per check, and the verdicts are those
    of uploads. With --keep-chunks never, the 6 inputs beyond the store go to both variants."""
    n = 10
    src = _npz(tmp_path, n)
    r = _run(models_dir, tmp_path / "o", sim_port(), source=src, results=results, chunks="always")
    assert r.exit_code == ExitCode.MATCH, (r.errors, r.stages)
    doc = _doc(r)
    assert doc["dataset"]["analysis"]["verdicts"] == {"match": n}
    assert _link(doc) == (n * 3072, n, 0)  # each input uploaded once, run once from the store
    chunks = doc["dataset"]["chunks"]
    assert (chunks["capacity"], chunks["parts"], chunks["chunked"]) == (store_of_4, 3, True)
    assert len(chunks["slot_switch_s"]) == 3  # one slot switch per chunk
    r2 = _run(models_dir, tmp_path / "o2", sim_port(), source=src, results=results, chunks="never")
    assert r2.exit_code == ExitCode.MATCH, (r2.errors, r2.stages)
    assert _link(_doc(r2)) == ((n + n - store_of_4) * 3072, store_of_4, 0)


@pytest.mark.parametrize(
    "fault", ["keep_cold", "keep_flip", "keep_lost&fault_count=3", "keep_lost&fault_count=4"]
)
def test_a_store_lost_in_the_middle_of_a_chunked_dataset_is_uploaded_never_a_false_match(
    tmp_path: Path, models_dir: Path, sim_port, store_of_4: int, fault: str
) -> None:
    """Every restart loses the store, every kept input has a flipped byte, or the store goes cold at one
    slot switch in the middle (app boot 3 or 4: a chunk kept by one variant is gone when the other
    boots): the device runs none of the lost inputs from the store; the host uploads them, and every
    input's verdict still rests on bytes it sent (the same clean match, never a result of other bytes)."""
    n = 10
    r = _run(
        models_dir, tmp_path / "o", sim_port(f"&fault={fault}"), source=_npz(tmp_path, n), results="full",
        chunks="always",
    )  # fmt: skip
    assert r.exit_code == ExitCode.MATCH, (r.errors, r.stages)
    doc = _doc(r)
    assert doc["dataset"]["analysis"]["verdicts"] == {"match": n}
    up, kept, fallbacks = _link(doc)
    assert kept + (up // 3072 - n) - fallbacks == n  # every input: uploaded once, then kept or uploaded again
    assert up > n * 3072  # something was lost and uploaded again
    if fault.startswith("keep_lost"):
        assert 0 < kept - fallbacks < n  # one chunk only: the others ran from the store


def test_a_result_of_another_chunks_input_is_never_counted() -> None:
    """A device that ran the bytes an entry held from an earlier chunk (input 3 of a 4-input store, asked
    for input 7) reports their CRC-32 with outputs that are consistent in themselves: the judge refuses
    the result (``invalid``: run again, never a match), and accepts the same record for input 3."""
    from harness.flows.dataset import _Collector
    from harness.protocol import frames

    rng = np.random.default_rng(7)
    inputs = {i: rng.integers(0, 256, 3072, dtype=np.uint8).tobytes() for i in (3, 7)}
    out = rng.integers(0, 256, 11, dtype=np.uint8).tobytes()
    spec = OutputSpec("int8", (1, 11), "o")
    col = _Collector([11])
    col.records[7] = frames.ResultRecord(7, frames.ST_OK, frames.FL_INLINE, 1, 900, zlib.crc32(inputs[3]),
                                         (zlib.crc32(out),), data=[out])  # fmt: skip
    leg = col.leg(7, inputs[7], [spec])
    assert leg.status == "invalid" and not leg.ok and "other input bytes" in (leg.detail or "")
    col.records[3] = dataclasses.replace(col.records[7], ident=3)
    assert col.leg(3, inputs[3], [spec]).ok


def test_a_later_part_whose_boot_has_no_store_runs_the_rest_in_one_part() -> None:
    """Chunks are fixed by the HELLO of the first variant that boots into each part: when a later boot has
    no store (keep capacity 0: the app placed it elsewhere, a board without PSRAM), the rest runs in one
    part, uploaded to each variant (an empty chunk would never advance: the run would not end)."""
    from types import SimpleNamespace

    from harness.flows.dataset import _Chunks

    board = SimpleNamespace(current=None)  # what next_turn reads: no app running
    plan = _Chunks(100, "always", random=False, variants=2)
    assert plan.next_turn(["optimized", "ansi"], board) == ["optimized", "ansi"]  # type: ignore[arg-type]
    ids, keep = plan.part(SimpleNamespace(input_bytes=6912, keep_capacity=37))  # type: ignore[arg-type]
    assert ids == range(37) and keep == frozenset(range(37)) and plan.advance(92160.0)
    assert plan.next_turn(["optimized", "ansi"], board) is not None  # type: ignore[arg-type]
    ids, keep = plan.part(SimpleNamespace(input_bytes=6912, keep_capacity=0))  # type: ignore[arg-type]
    assert ids == range(37, 100) and keep == frozenset()
    assert not plan.advance(92160.0)
    assert plan.next_turn(["optimized", "ansi"], board) is None  # type: ignore[arg-type]


def test_cli_keep_chunks_reaches_the_run(tmp_path: Path, models_dir: Path, sim_port, store_of_4: int) -> None:  # type: ignore[no-untyped-def]
    """``--keep-chunks`` is the run's policy (report.json dataset.chunks), in process through the CLI."""
    src = _npz(tmp_path, 6)
    for policy, parts in (("never", 1), ("always", 2)):
        out = tmp_path / policy
        rc = main(["flash-and-compare", str(models_dir / MODEL), "--dataset", str(src), "--board", "sim",
                   "--port", sim_port(), "--out", str(out), "--keep-chunks", policy])  # fmt: skip
        chunks = json.loads((out / "report.json").read_text())["dataset"]["chunks"]
        assert rc == 0 and (chunks["policy"], chunks["parts"], chunks["capacity"]) == (
            policy,
            parts,
            store_of_4,
        )


def test_auto_chunks_only_when_the_link_time_saved_pays_for_the_slot_switches() -> None:
    """The rule of --keep-chunks auto (_Chunks.pays) on figures a real board would give: U-Net 48's
    6,912-byte inputs at 115200 baud, ESP-NN 0.17 s / ANSI C 0.97 s per invoke, a 1 s slot switch: the
    ANSI C invoke hides the second upload (0.61 s) but ESP-NN's does not, so chunks pay; at 921600 (0.076 s
    per upload) both invokes hide it, so the rest is uploaded to each variant instead."""
    from harness.flows.dataset import _Chunks

    plan = _Chunks(100, "auto", random=False, variants=2)
    plan.cap, plan.start, plan.input_bytes = 37, 37, 6912
    plan.switch_s, plan.invoke_s = [1.0], {"optimized": 0.17, "ansi": 0.97}
    assert plan.pays(115200 / 10)[0] is True
    assert plan.pays(921600 / 10)[0] is False
    assert plan.pays(0.0)[0] is False  # no baud to model (a native pipe): no extra switches
    plan.start = 100 - 30  # a rest the store holds: one chunk, no extra switch, whatever the link
    assert plan.pays(0.0)[0] is True


# ---- device -> host within output + 16 for a slow model (docs/protocol.md "Result record") ----------


def test_a_slow_models_results_on_the_stream_share_frames_with_their_acks(
    tmp_path: Path, models_dir: Path, sim_port
) -> None:
    """U-Net 48 (2,304-byte output) on the simulated board: the app reports the modelled invoke times of an
    S3 (ESP-NN ~0.17 s, ANSI C ~0.97 s) and its loop batches on them like a real one; the board is busy
    50 ms per invoke (what is faked: the wait, not the whole second), so the host's commands queue up as
    they would. Version 3 sent each slow input's result in a frame of its own and an ACK frame after it
    (2 frames per input, + 45 bytes). Now each result frame carries its ACK: what must hold whatever the
    host's timing is at most one frame per input (+2). How many results share a frame depends on how late
    a busy host sends (the device flushes when its receive buffer runs empty: at load average 8 the
    optimized variant sent 62 frames for 60 inputs, the ANSI C one 18), so batching and the byte figure
    (output + 16) are checked with a controlled clock by tests/test_loop.py and measured by
    bench/bench_resident.py."""
    n = 60
    r = flash_and_compare(
        models_dir / "unet_mbv2_035_48.tflite",
        [],
        board="sim",
        port=sim_port("&invoke_time=0.05"),
        out_dir=tmp_path / "o",
        options=JobOptions(
            dataset=DatasetOptions(random_inputs=n, seed=3, results="full"),
            timeouts=StageTimeouts(capture_total=120, capture_silence=4),
        ),
    )
    assert r.exit_code == ExitCode.MATCH, (r.errors, r.stages)
    link = _doc(r)["dataset"]["link"]
    assert len(link) == 2 and all(x["results"] == n and x["rx_payload"] == n * 2304 for x in link.values())
    assert all(x["naks"] == x["retransmitted_frames"] == x["rx_gaps"] == 0 for x in link.values()), link
    frames = [x["frames_received"] for x in link.values()]
    assert all(f <= n + 2 for f in frames), (frames, link)
