"""The judge's invariants in dataset mode: no false match, no lost crash, no result taken on trust.

Each test here reproduces a way an earlier version gave a false match or hid a firmware fault, on the
simulated board (the board is the only fake: its faults are injected through the ``sim://`` URL; the
frames, the loop client, the host TFLM reference and the verdict code are the real ones).
"""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path

import numpy as np
import pytest
from test_model_builder import ADD, Op, T, build_model

from harness.analysis.dataset import Leg, OutputSpec, analyze
from harness.errors import ExitCode
from harness.flows.dataset import DatasetOptions
from harness.flows.flash_and_compare import flash_and_compare
from harness.flows.job import JobOptions
from harness.flows.records import StageTimeouts
from harness.sim.board import remove_board

DEQUANTIZE, LOG = 6, 73
CNN = "cnn_classifier_11.tflite"


def log_model() -> bytes:
    """int8 ADD -> DEQUANTIZE -> LOG: a float32 output with NaN (log of a negative) and -inf (log 0)."""
    const = np.arange(-8, 8, dtype=np.int8).reshape(1, 16)
    return build_model(
        [
            T("x", (1, 16), "int8", 0.05, 0),
            T("c", (1, 16), "int8", 0.05, 0, const),
            T("s", (1, 16), "int8", 0.1, 0),
            T("f", (1, 16), "float32"),
            T("y", (1, 16), "float32"),
        ],
        [Op(ADD, [0, 1], [2], add_options=True), Op(DEQUANTIZE, [2], [3]), Op(LOG, [3], [4])],
        inputs=[0],
        outputs=[4],
    )


@pytest.fixture
def sim_port():  # type: ignore[no-untyped-def]
    names: list[str] = []

    def make(query: str) -> str:
        name = f"judge-{uuid.uuid4().hex[:10]}"
        names.append(name)
        return f"sim://{name}?{query}"

    yield make
    for n in names:
        remove_board(n)


def _strict_json(path: Path) -> dict:  # type: ignore[type-arg]
    def refuse(token: str) -> None:
        raise AssertionError(f"{path} holds the bare token {token}: not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)  # type: ignore[no-any-return]


def _run(model: Path, out: Path, port: str, reference: bool = True, **opts: object):  # type: ignore[no-untyped-def]
    return flash_and_compare(
        model,
        [],
        board="sim",
        port=port,
        out_dir=out,
        options=JobOptions(
            dataset=DatasetOptions(**opts),
            timeouts=StageTimeouts(capture_total=60, capture_silence=4),
            reference=reference,
        ),
    )


# ---- NaN / inf in float outputs -------------------------------------------------------------------


def _float_leg(values: list[float]) -> Leg:
    a = np.array(values, dtype=np.float32)
    import zlib

    return Leg("ok", (zlib.crc32(a.tobytes()),), [a])


@pytest.mark.parametrize(
    ("a", "b", "differs"),
    [
        ([1.0, float("nan")], [1.0, 2.0], True),  # NaN on one side only
        ([1.0, 2.0], [float("nan"), 2.0], True),
        ([float("inf"), 2.0], [3.0, 2.0], True),
        ([float("-inf"), 2.0], [float("inf"), 2.0], True),
        ([float("nan"), float("-inf")], [float("nan"), float("-inf")], False),  # the same on both sides
    ],
)
def test_non_finite_float_outputs_are_differences_only_where_the_sides_differ(
    a: list[float], b: list[float], differs: bool
) -> None:
    outs = [OutputSpec("float32", (2,))]
    res = analyze(["x"], [None], outs, {"optimized": [_float_leg(a)], "ansi": [_float_leg(b)]})
    assert res.rows[0].verdict == ("mismatch" if differs else "match")
    doc = json.dumps(res.to_dict(), allow_nan=False)  # raises on a bare NaN / Infinity
    assert ('"inf"' in doc) == differs


@pytest.mark.parametrize("results", ["full", "crc"])
def test_dataset_with_nan_outputs_finds_the_corrupt_variant(tmp_path: Path, sim_port, results: str) -> None:  # type: ignore[no-untyped-def]
    model = tmp_path / "log.tflite"
    model.write_bytes(log_model())
    port = sim_port("fault=corrupt&variant_fault=optimized")
    r = _run(model, tmp_path / "o", port, random_inputs=20, seed=1, results=results)
    assert r.exit_code == ExitCode.MISMATCH, r.errors
    doc = _strict_json(r.report_path)
    verdicts = doc["dataset"]["analysis"]["verdicts"]
    assert verdicts.get("mismatch", 0) >= 1 and "match" in verdicts
    worst = doc["dataset"]["analysis"]["agreement"]["optimized_vs_ansi"]["max_lsb_per_output"][0]
    assert worst == "inf" or (isinstance(worst, float) and math.isfinite(worst) and worst > 0)


# ---- a result fetched twice must agree with itself ------------------------------------------------


def test_crc_mode_refetch_that_differs_is_nondeterminism_not_a_replacement(
    tmp_path: Path, models_dir: Path, sim_port
) -> None:  # type: ignore[no-untyped-def]
    """--results crc: the optimized variant's CRC-only results are fetched again in full; the flaky
    kernel gives other outputs the second time. The second result must not silently replace the first."""
    port = sim_port("fault=flaky&variant_fault=optimized")
    r = _run(models_dir / CNN, tmp_path / "o", port, random_inputs=2, seed=3, results="crc", reference=False)
    assert r.exit_code == ExitCode.MISMATCH, r.errors
    rows = _strict_json(r.report_path)["dataset"]["analysis"]["rows"]
    bad = [row for row in rows if row["verdict"] == "nondeterministic"]
    assert bad and "run again" in bad[0]["detail"]


def test_tap_evidence_of_wrong_outputs_is_a_mismatch_even_when_the_variants_agree(
    tmp_path: Path, models_dir: Path, sim_port
) -> None:  # type: ignore[no-untyped-def]
    """Both variants print the same corrupt outputs and no host reference runs: optimized and ANSI C
    agree, but each tapped device's own records say its printed output is not what the op that wrote it
    checksummed (docs/tap.md). That evidence is a finding in the verdict, report.json and JUnit."""
    junit = tmp_path / "j.xml"
    opts = JobOptions(reference=False, tap=True, junit=junit, timeouts=StageTimeouts(capture_total=40))
    image = models_dir / "inputs/cnn_classifier_11.png"
    port = sim_port("fault=corrupt")
    r = flash_and_compare(
        models_dir / CNN, [image], board="sim", port=port, out_dir=tmp_path / "o", options=opts
    )
    assert r.comparison is not None and r.comparison.exit_code == ExitCode.MATCH  # the variants agree
    assert r.exit_code == ExitCode.MISMATCH, r.errors
    doc = _strict_json(r.report_path)
    assert doc["verdict"] == "mismatch"
    assert [f.split(":")[0] for f in doc["tap"]["findings"]] == ["optimized", "ansi"]
    assert "changed after its op ran" in doc["tap"]["findings"][0]
    assert 'failures="1"' in junit.read_text()


# ---- a crash in a stream is a firmware fault, in flash-and-compare and in the runner ---------------


def test_dataset_crash_text_is_a_firmware_fault_not_a_link_hiccup(
    tmp_path: Path, models_dir: Path, sim_port
) -> None:  # type: ignore[no-untyped-def]
    port = sim_port("fault=panic&variant_fault=optimized")
    r = _run(models_dir / CNN, tmp_path / "o", port, random_inputs=6, seed=3, results="crc")
    assert r.exit_code == ExitCode.FIRMWARE_FAULT, r.errors
    doc = _strict_json(r.report_path)
    assert doc["dataset"]["analysis"]["verdicts"].get("device_error", 0) >= 1
    kinds = {f["kind"] for f in doc["variants"]["optimized"]["findings"]}
    assert "panic" in kinds, kinds
    assert not any(f["kind"] == "panic" for f in doc["variants"]["ansi"]["findings"])


def test_runner_keeps_a_dataset_crash_that_a_retry_does_not_reproduce(
    tmp_path: Path, models_dir: Path
) -> None:
    """The board crashes on its first app boot only (fault_boots=1): the confirmation re-run matches,
    and the task still ends as a firmware fault (intermittent), never as a match."""
    from harness.runner import RunOptions, load_inventory, load_plan, run_plan

    name = f"judge-run-{uuid.uuid4().hex[:8]}"
    inv = tmp_path / "bench.toml"
    inv.write_text(
        f'[[board]]\nname = "b1"\ntype = "sim"\n'
        f'port = "sim://{name}?emitter=c&fault=panic&variant_fault=optimized&fault_boots=1"\n'
    )
    plan = tmp_path / "plan.toml"
    plan.write_text(
        '[run]\nbackoff_s = 0.05\n\n[defaults]\nboards = ["sim"]\n'
        "timeouts = { capture_total = 60, capture_silence = 4 }\n"
        f'\n[[job]]\nname = "rnd"\nmodels = ["{models_dir}/cnn_classifier_11.tflite"]\n'
        'random_inputs = 6\nseed = 3\nresults = "crc"\n'
    )
    out = tmp_path / "out"
    try:
        opts = RunOptions(out_dir=out, lock_dir=tmp_path / "locks", cache_dir=tmp_path / "cache")
        result = run_plan(load_plan(plan), load_inventory(inv), opts)
    finally:
        remove_board(name)
    doc = _strict_json(out / "summary.json")
    (task,) = doc["tasks"]
    assert result.exit_code == ExitCode.FIRMWARE_FAULT, task["reason"]
    assert task["firmware_fault_confirmed"] is not None


# ---- a model the host TFLM cannot allocate is the model's problem (exit 2) --------------------------


def _unallocatable_model(workdir: Path) -> tuple[Path, Path]:
    """Fuzz mutant 421 of seed 4242 (tests/fuzzing.py, as ``bench/fuzz.py --replay model 421 --seed
    4242`` keeps it): a cnn_classifier_11 whose flatbuffer still verifies but which TFLM cannot allocate
    (a smashed word makes FULLY_CONNECTED's input int32: fully_connected.cc:57 refuses it in Prepare).
    Mutant 110, used before, now stops at the loader: it feeds a rank-1 tensor to a CONV_2D."""
    import random

    from fuzzing import MODEL_MUTATIONS, load_bases, mutate

    _, _, bases = load_bases()
    rng = random.Random("4242:model:421")
    name = rng.choice(sorted(bases))
    data, _how = mutate(bases[name], rng, MODEL_MUTATIONS)
    model = workdir / "m.tflite"
    model.write_bytes(data)
    from harness.model.loader import load_model

    x = workdir / "x0.npy"
    t = load_model(model).inputs[0]
    np.save(x, np.zeros(t.shape, dtype=np.dtype(t.dtype)))
    return model, x


@pytest.mark.parametrize("loop", ["c", "python"])  # the simulated board's loop: the firmware's C, or its twin
@pytest.mark.parametrize("mode", ["single", "dataset"])
def test_a_model_tflm_cannot_allocate_is_a_usage_error(tmp_path: Path, mode: str, loop: str, capsys) -> None:  # type: ignore[no-untyped-def]
    from harness.cli import main

    model, x = _unallocatable_model(tmp_path)
    how = ["--input", str(x)] if mode == "single" else ["--random-inputs", "3"]
    port = f"sim://?emitter={loop}"
    rc = main(
        [
            "flash-and-compare",
            str(model),
            *how,
            "--board",
            "sim",
            "--port",
            port,
            "--out",
            str(tmp_path / "o"),
        ]
    )
    err = capsys.readouterr().err
    assert rc == ExitCode.USAGE, err
    assert "allocate" in err and "cannot load this model" in err


# ---- a verdict rests on compared elements: an output with none is no evidence ----------------------

RESHAPE = 22


def _empty_output_model(workdir: Path, outputs: list[int]) -> tuple[Path, Path]:
    """int8 ADD (ESP-NN accelerates it) -> "s" [1], then RESHAPE -> "empty", declared [0]: the firmware
    prints each output's declared bytes, so "empty" comes back with zero elements on every variant (and
    the host TFLM, which makes a declared [0] a scalar, refuses the model: no reference leg)."""
    tensors = [
        T("x", (1,), "int8", 0.05, 0),
        T("c", (1,), "int8", 0.05, 0, np.array([3], np.int8)),
        T("s", (1,), "int8", 0.1, 0),
        T("empty", (0,), "int8", 0.1, 0),
    ]
    ops = [Op(ADD, [0, 1], [2], add_options=True), Op(RESHAPE, [2], [3])]
    model, x = workdir / "m.tflite", workdir / "x0.npy"
    model.write_bytes(build_model(tensors, ops, [0], outputs))
    np.save(x, np.array([40], np.int8))
    return model, x


def _cli(model: Path, x: Path, mode: str, out: Path, capsys) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    from harness.cli import main

    how = ["--input", str(x)] if mode != "dataset" else ["--random-inputs", "3"]
    rc = main(
        ["flash-and-compare", str(model), *how, "--board", "sim", "--port", "sim://", "--out", str(out)]
    )
    if mode == "compare":  # the two captures the run kept, compared by ``esp-check compare``
        capsys.readouterr()
        rc = main(["compare", str(out / "logs/serial-optimized.log"), str(out / "logs/serial-ansi.log")])
    captured = capsys.readouterr()
    return rc, captured.out + captured.err


@pytest.mark.parametrize("mode", ["single", "dataset", "compare"])
def test_outputs_with_no_elements_are_never_a_match(tmp_path: Path, mode: str, capsys) -> None:  # type: ignore[no-untyped-def]
    """Every output has zero elements: nothing was compared, so the run cannot be a match (exit 2, as
    for runs that cannot honestly be compared). Faked: the board (``sim://``)."""
    model, x = _empty_output_model(tmp_path, outputs=[3])
    rc, text = _cli(model, x, mode, tmp_path / "o", capsys)
    assert rc == ExitCode.USAGE, text
    assert "nothing to compare" in text and "output 0 [empty] has zero elements" in text


@pytest.mark.parametrize("mode", ["single", "dataset", "compare"])
def test_an_output_with_no_elements_is_said_not_compared(tmp_path: Path, mode: str, capsys) -> None:  # type: ignore[no-untyped-def]
    """One normal output and one with zero elements: the normal one decides the verdict, and the run says
    the empty one was not compared. Faked: the board (``sim://``)."""
    model, x = _empty_output_model(tmp_path, outputs=[2, 3])
    rc, text = _cli(model, x, mode, tmp_path / "o", capsys)
    assert rc == ExitCode.MATCH, text
    assert "output 1 [empty] has zero elements: not compared" in " ".join(text.split())


def test_runner_task_whose_outputs_have_no_elements_is_not_a_match(tmp_path: Path) -> None:
    """The runner's task judges the pipeline's result: nothing compared is exit 2, never a match.
    Faked: the board (``sim://``)."""
    from harness.runner import RunOptions, load_inventory, load_plan, run_plan

    model, x = _empty_output_model(tmp_path, outputs=[3])
    name = f"judge-run-{uuid.uuid4().hex[:8]}"
    inv = tmp_path / "bench.toml"
    inv.write_text(f'[[board]]\nname = "b1"\ntype = "sim"\nport = "sim://{name}"\n')
    plan = tmp_path / "plan.toml"
    plan.write_text(
        f'[run]\nbackoff_s = 0.05\n\n[[job]]\nname = "empty"\nmodels = ["{model}"]\ninputs = ["{x}"]\n'
        'boards = ["sim"]\ncomparisons = ["optimized-vs-ansi"]\n'  # the host refuses the model
    )
    try:
        opts = RunOptions(out_dir=tmp_path / "out", lock_dir=tmp_path / "locks", cache_dir=tmp_path / "cache")
        result = run_plan(load_plan(plan), load_inventory(inv), opts)
    finally:
        remove_board(name)
    (task,) = _strict_json(tmp_path / "out" / "summary.json")["tasks"]
    assert result.exit_code == ExitCode.USAGE, task["reason"]
    assert "zero elements" in task["reason"]


# ---- hybrid: a culprit op only from firmware evidence ----------------------------------------------


def _hybrid(models_dir: Path, tmp_path: Path, port: str, bisect: bool):  # type: ignore[no-untyped-def]
    from harness.flows.hybrid import HybridOptions, hybrid

    return hybrid(
        models_dir / CNN,
        [models_dir / "inputs" / "cnn_classifier_11.png"],
        board="sim",
        port=port,
        out_dir=tmp_path / "o",
        options=HybridOptions(bisect=bisect),
        job=JobOptions(timeouts=StageTimeouts(capture_total=60, capture_silence=4)),
    )


@pytest.mark.slow
@pytest.mark.parametrize("bisect", [True, False])
def test_hybrid_names_no_op_when_the_baseline_failed_on_the_link(
    tmp_path: Path, models_dir: Path, sim_port, bisect: bool
) -> None:  # type: ignore[no-untyped-def]
    """frame_tx damages the optimized app's frames: the baseline is an infrastructure error, which says
    nothing against any op. Bisection (or taps) must not name a culprit from runs that all come back good."""
    # every 3rd frame: a one-input run sends 4 (HELLO, BAUD_OK, SYNC_ACK, ACK) since results and ACKs
    # wait for the host's pause (docs/protocol.md "Result record"); the fault must act to be tested
    query = "emitter=c&fault=frame_tx&frame_every=3&variant_fault=optimized"
    res = _hybrid(models_dir, tmp_path, sim_port(query), bisect)
    assert res.exit_code == ExitCode.INFRASTRUCTURE, res.message
    assert not res.offered and res.culprits == [] and res.ansi_ops == []
    assert "no evidence against the optimized build" in res.message


# ---- a long Invoke is not a lossy link ------------------------------------------------------------


@pytest.mark.slow
def test_an_invoke_longer_than_the_ack_timeout_is_a_clean_match(
    tmp_path: Path, models_dir: Path, sim_port
) -> None:  # type: ignore[no-untyped-def]
    """The board is busy 3.5 s per invoke (longer than the loop client's 3 s acknowledgement timeout):
    the client probes with a new SYNC frame instead of sending frames again, so nothing is repaired
    and the run is a clean match (it used to end as exit 3 with a link_repair finding)."""
    r = flash_and_compare(
        models_dir / CNN,
        [],
        board="sim",
        port=sim_port("invoke_time=3.5"),
        out_dir=tmp_path / "o",
        options=JobOptions(
            dataset=DatasetOptions(random_inputs=2, seed=1, results="full"),
            timeouts=StageTimeouts(capture_total=60, capture_silence=8),
        ),
    )
    assert r.exit_code == ExitCode.MATCH, r.errors
    link = _strict_json(r.report_path)["dataset"]["link"]
    assert all(v["retransmitted_frames"] == 0 and v["naks"] == 0 for v in link.values()), link
    assert sum(v["probes"] for v in link.values()) >= 1, link


def test_hybrid_names_no_op_for_a_crash_that_does_not_come_back(
    tmp_path: Path, models_dir: Path, sim_port
) -> None:  # type: ignore[no-untyped-def]
    """The optimized build crashes on the board's first boot only (fault_boots=1). Bisection would find
    every later run good and name the last op it tried; the confirmation run shows the failure does not
    come back, so no op is named and the crash stays a firmware fault (exit 4)."""
    port = sim_port("emitter=c&fault=panic&variant_fault=optimized&fault_boots=1")
    res = _hybrid(models_dir, tmp_path, port, bisect=True)
    assert res.exit_code == ExitCode.FIRMWARE_FAULT, res.message
    assert not res.offered and res.culprits == [] and res.ansi_ops == []
    assert "intermittent" in res.message


def test_hybrid_does_not_verify_against_an_ansi_build_whose_outputs_its_ops_did_not_write(
    tmp_path: Path, models_dir: Path, sim_port
) -> None:  # type: ignore[no-untyped-def]
    """Both builds print the same corrupt outputs and no host reference runs: the tapped baseline's own
    records say ANSI C's printed output is not what its ops wrote (a tap finding, exit 1). Then ANSI C
    is no reference to verify a hybrid against (every candidate would "match" it), and the fault, which
    comes back on every boot, is not non-determinism."""
    from harness.flows.hybrid import hybrid

    job = JobOptions(reference=False, timeouts=StageTimeouts(capture_total=60, capture_silence=4))
    image = models_dir / "inputs" / "cnn_classifier_11.png"
    port = sim_port("emitter=c&fault=corrupt")
    res = hybrid(models_dir / CNN, [image], board="sim", port=port, out_dir=tmp_path / "o", job=job)
    assert res.exit_code == ExitCode.MISMATCH and not res.offered, res.message
    assert "nothing to verify a hybrid against" in res.message and "intermittent" not in res.message


def test_hybrid_takes_an_optimized_tap_finding_for_the_optimized_builds_not_ansi_cs(
    tmp_path: Path, models_dir: Path, sim_port
) -> None:  # type: ignore[no-untyped-def]
    """Only the optimized build prints corrupt outputs (no host reference): the tapped baseline's only
    tap findings are the optimized build's. The variant is the finding's field, never read from its
    text: ANSI C stays the reference a hybrid is verified against, and the finding is the optimized
    build's exit 1. Faked: the board (sim://, the fault injected)."""
    from harness.analysis.tap import TapFinding
    from harness.flows.hybrid import hybrid

    job = JobOptions(reference=False, timeouts=StageTimeouts(capture_total=60, capture_silence=4))
    image = models_dir / "inputs" / "cnn_classifier_11.png"
    port = sim_port("emitter=c&fault=corrupt&variant_fault=optimized")
    res = hybrid(models_dir / CNN, [image], board="sim", port=port, out_dir=tmp_path / "o", job=job)
    tap = res.baseline.tap if res.baseline is not None else None
    assert tap is not None and tap.findings, res.message
    assert {f.variant for f in tap.findings} == {"optimized"}
    assert str(TapFinding("optimized", "ansi: x")) == "optimized: ansi: x"  # the text says its variant first
    assert "nothing to verify a hybrid against" not in res.message, res.message
    assert res.exit_code == ExitCode.MISMATCH and not res.offered, res.message


@pytest.mark.parametrize("bisect", [False, True])
def test_hybrid_offers_nothing_for_a_mismatch_that_does_not_come_back(
    tmp_path: Path, models_dir: Path, sim_port, bisect: bool
) -> None:  # type: ignore[no-untyped-def]
    """Op 3 of the optimized build is wrong on the board's first boot only (fault_boots=1). Every later
    run is good whatever runs ANSI C, so a tapped hybrid with op 3 on ANSI C "verifies" without proving
    anything. Taps and bisection alike: the failure must come back first; it does not, so no op is named,
    nothing is offered, and the vanished mismatch is reported as non-determinism (exit 1)."""
    port = sim_port("emitter=c&fault=op_corrupt&fault_op=3&variant_fault=optimized&fault_boots=1")
    res = _hybrid(models_dir, tmp_path, port, bisect=bisect)
    assert res.exit_code == ExitCode.MISMATCH, res.message
    assert not res.offered and res.culprits == [] and res.ansi_ops == [] and res.dropin is None
    assert "non-deterministic" in res.message, res.message
    doc = _strict_json(res.report_path)
    assert doc["exit_code"] == 1 and not doc["offered"]


def test_an_app_that_is_not_the_build_is_refused_from_its_hello(
    tmp_path: Path, models_dir: Path, sim_port
) -> None:  # type: ignore[no-untyped-def]
    """HELLO's running-app SHA-256 is a device claim the judge checks at every boot: the ANSI C slot
    holding another valid ANSI C app (here the --tap build: same variant, same model) is refused with
    exit 2, never streamed as the build's results. The board's flash is set by hand (the fake: a
    simulated board whose flash did not take the build's app)."""
    from harness.device.session import DeviceSession
    from harness.firmware.boards import load_board
    from harness.firmware.build import build_project
    from harness.firmware.generate import FirmwareFeatures, generate_projects
    from harness.flows.capture import boot_variant
    from harness.flows.records import Recorder, VariantRun
    from harness.flows.resident import ResidentBoard, merged_flash_files

    builds = {}
    for tap in (False, True):
        for p in generate_projects(models_dir / CNN, [], "sim", out_dir=tmp_path / f"fw-{tap}",
                                   features=FirmwareFeatures(tap=tap, embed_inputs=False)):  # fmt: skip
            builds[(p.variant, tap)] = build_project(p.path, cache_dir=tmp_path / "cache")
    mine = {v: builds[(v, False)] for v in ("optimized", "ansi")}
    files = dict(merged_flash_files(mine))
    tapped = builds[("ansi", True)].artifact("app")
    assert tapped is not None
    files[tapped.offset] = tapped.path  # ota_1: a valid ANSI C app, but not the build's
    import harness.sim

    harness.sim.register()
    url = sim_port("emitter=c&flash_size=8MB")
    with DeviceSession(url, load_board("sim")) as dev:
        dev.serial.board.program(sorted(files.items()))  # type: ignore[union-attr]
        rb = ResidentBoard(Recorder(), dev, mine, StageTimeouts(capture_total=30, capture_silence=4))
        assert rb.flash(tmp_path / "logs" / "flash.log").skipped_reason == ""  # the probe saw ota_1 differ
        dev.serial.board.program([(tapped.offset, tapped.path)])  # type: ignore[union-attr]
        rb.current = None
        run = VariantRun("ansi", serial_log=tmp_path / "logs" / "serial-ansi.log")
        got = boot_variant(rb, run)
    assert got == ExitCode.USAGE and "another firmware" in " ".join(run.problems), run.problems
