"""Every simulator fault through every mode: each cell ends with the exit code of its class, never a match
where the board was faulty.

What is faked: the board (``sim://`` with a fault injected, harness.sim running the firmware's own C
loop). Real: esptool flashing, the resident loop's frames, the host TFLM reference, the judge, the
runner. A fault that cannot act in a mode (text-record faults in a dataset stream, faults that need a
second invoke or a second RUN in a one-input run) must give the honest answer for what the board did,
which is a match: the table says so cell by cell. Cells marked ``None`` are covered elsewhere and too slow
here (a bisection over a crash: tests/test_hybrid_flow.py). Then the options that change who judges or
what is judged (no host reference, two outputs, a float output with NaN and -inf, the fast link's baud
switch refused), the board served over RFC 2217, the runner, and a repeat run that skips the flash.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path

import pytest

from harness.errors import ExitCode
from harness.flows.dataset import DatasetOptions
from harness.flows.flash_and_compare import flash_and_compare
from harness.flows.hybrid import HybridOptions, hybrid
from harness.flows.job import JobOptions
from harness.flows.records import StageTimeouts
from harness.sim.board import get_board, remove_board

pytestmark = pytest.mark.slow

MODEL = "cnn_classifier_11.tflite"
IMAGE = "inputs/cnn_classifier_11.png"
LIMITS = StageTimeouts(capture_total=40, capture_silence=3)
MODES = ("single", "tap", "ds_crc", "ds_full", "hybrid")
M, F, INF, OK = ExitCode.MISMATCH, ExitCode.FIRMWARE_FAULT, ExitCode.INFRASTRUCTURE, ExitCode.MATCH

# fault -> exit code per mode (single, tap, dataset crc, dataset full, hybrid --bisect)
MATRIX: dict[str, tuple[ExitCode | None, ...]] = {
    "": (OK, OK, OK, OK, OK),
    "fault=corrupt&variant_fault=optimized": (M, M, M, M, M),
    "fault=pinned&variant_fault=optimized": (M, M, M, M, None),
    "fault=corrupt": (M, M, M, M, M),  # both variants alike: the host says so (hybrid: the baseline)
    "fault=corrupt&variant_fault=ansi": (M, M, M, M, M),
    "fault=op_corrupt&fault_op=3&variant_fault=optimized": (M, M, M, M, OK),  # hybrid: op 3 on ANSI C
    "fault=panic&variant_fault=optimized": (F, F, F, F, None),
    "fault=abort&variant_fault=ansi": (F, F, F, F, F),  # hybrid: the ANSI C baseline itself is broken
    "fault=alloc&variant_fault=optimized": (F, F, F, F, None),
    "fault=hang&variant_fault=optimized": (INF, INF, INF, INF, INF),  # silence without watchdog evidence
    "fault=bootloop&variant_fault=optimized": (F, None, F, None, None),
    "fault=brownout&variant_fault=optimized": (INF, INF, INF, INF, INF),
    # text-record faults: a dataset streams binary frames, which they do not touch
    "fault=truncate&variant_fault=optimized": (INF, INF, OK, OK, INF),
    "fault=disconnect&variant_fault=optimized": (INF, INF, OK, OK, INF),
    "fault=noise&noise=0.002": (INF, None, INF, None, None),
    "fault=frame_rx&frame_every=4&variant_fault=optimized": (INF, INF, INF, INF, INF),
    "fault=frame_tx&frame_every=3&variant_fault=optimized": (INF, INF, INF, INF, INF),
    # one input is one RUN per variant: a stall after 2 RUNs and a flaky second invoke need a dataset
    "fault=stall&fault_count=2&variant_fault=optimized": (OK, OK, INF, INF, OK),
    "fault=flaky&variant_fault=optimized": (OK, OK, M, M, OK),
    "fault=sync_fail,wdt": (OK, OK, OK, OK, OK),  # repaired by esptool's connect loop / the splice repair
    # a crash on the first boot only: still a firmware fault, and no op is named from it
    "fault=panic&variant_fault=optimized&fault_boots=1": (F, F, F, F, F),
    # the kept-input store's PSRAM: random inputs are drawn by the device, nothing is kept, the faults
    # cannot act (one input per variant is uploaded as before); a dataset of files: KEEP_CELLS below
    "fault=keep_cold": (None, None, OK, OK, None),
    "fault=keep_stale": (None, None, OK, OK, None),
    "fault=keep_flip": (None, None, OK, OK, None),
}
CELLS = [(q, m, codes[k]) for q, codes in MATRIX.items() for k, m in enumerate(MODES) if codes[k] is not None]


@pytest.fixture
def port():  # type: ignore[no-untyped-def]
    names: list[str] = []

    def make(query: str) -> str:
        names.append(f"mx-{uuid.uuid4().hex[:8]}")
        return f"sim://{names[-1]}?emitter=c&{query}"

    yield make
    for n in names:
        remove_board(n)


def _run(
    mode: str, url: str, models_dir: Path, out: Path, *, model: str | Path = MODEL, reference: bool = True
) -> ExitCode:
    """One cell; ``model`` (a fixture name, or a path) takes its sample input from ``inputs/``."""
    model = models_dir / model
    image = models_dir / (IMAGE if model.name == MODEL else f"inputs/{model.stem}.q.npy")
    job = JobOptions(timeouts=LIMITS, reference=reference)
    if mode == "hybrid":
        res = hybrid(
            model,
            [image],
            board="sim",
            port=url,
            out_dir=out,
            options=HybridOptions(bisect=True),
            job=job,
        )
        assert res.exit_code == OK or not res.offered, res.message  # a hybrid is offered only as a match
        return res.exit_code
    if mode in ("single", "tap"):
        r = flash_and_compare(
            model,
            [image],
            board="sim",
            port=url,
            out_dir=out,
            options=job.replace(tap=mode == "tap"),
        )
    else:
        results = "crc" if mode == "ds_crc" else "full"
        ds = DatasetOptions(random_inputs=4, seed=3, results=results)
        r = flash_and_compare(model, [], board="sim", port=url, out_dir=out, options=job.replace(dataset=ds))
    assert r.report_path.is_file()  # nothing lost: the report is written whatever happened
    return r.exit_code


@pytest.mark.parametrize(
    ("query", "mode", "expected"), CELLS, ids=[f"{m}-{q or 'clean'}" for q, m, _ in CELLS]
)
def test_mode_by_fault(
    tmp_path: Path, models_dir: Path, port, query: str, mode: str, expected: ExitCode
) -> None:  # type: ignore[no-untyped-def]
    got = _run(mode, port(query), models_dir, tmp_path / "o")
    assert got == expected, f"{mode} with {query or 'no fault'}: exit {int(got)}, expected {int(expected)}"


# ---- options that change who judges or what is judged: no host reference, two outputs, float outputs ----

ONE_MODES = ("single", "tap", "ds_crc", "ds_full")
NO_TAP = ("single", "ds_crc", "ds_full")
CORRUPT = "fault=corrupt&variant_fault=optimized"
OPTION_CELLS = [
    # without the host reference optimized vs ANSI C is the only witness: it still sees one corrupt side
    *[("no_reference", CORRUPT, m, M) for m in NO_TAP],
    *[("no_reference", "fault=pinned&variant_fault=ansi", m, M) for m in NO_TAP],
    *[
        ("no_reference", "fault=panic&variant_fault=optimized&fault_boots=1", m, F)
        for m in ("single", "ds_full")
    ],
    ("no_reference", CORRUPT, "hybrid", M),
    # both variants alike and no host: they agree, but the tapped device's own records say each printed
    # output differs from what the op that wrote it checksummed (docs/tap.md): a finding, never a match
    ("no_reference", "fault=corrupt", "tap", M),
    # an input of op 5 overwritten after its producer printed its CRC, alike in both: the same evidence
    ("no_reference", "fault=op_clobber&fault_op=5", "tap", M),
    # op_zoo: two outputs; only some elements of each are corrupt
    *[("op_zoo", CORRUPT, m, M) for m in ONE_MODES],
    *[("op_zoo", "fault=panic&variant_fault=ansi", m, F) for m in ("single", "ds_crc")],
    # a float32 output with NaN and -inf in it (tests/test_judge_integrity.py log_model): one input
    *[("float", CORRUPT, m, M) for m in ("single", "tap")],
    *[("float", "", m, OK) for m in ("single", "tap")],
    # the fast link's baud switch refused by the bridge: the run falls back to the console baud
    *[("cnn", "fault=corrupt,baud_fail&variant_fault=optimized", m, M) for m in ("single", "ds_crc")],
    # a 4 MB chip behind the sim board file's 8 MB: the start-up probe fails and the app boot-loops; the
    # board file is wrong (docs/device.md flash_size_mismatch: 2), not the firmware or the link
    *[("cnn", "flash_size=4MB", m, ExitCode.USAGE) for m in ("single", "tap", "ds_crc", "ds_full")],
]


@pytest.mark.parametrize(
    ("option", "query", "mode", "expected"),
    OPTION_CELLS,
    ids=[f"{o}-{m}-{q or 'clean'}" for o, q, m, _ in OPTION_CELLS],
)
def test_mode_by_fault_with_options(
    tmp_path: Path, models_dir: Path, port, option: str, query: str, mode: str, expected: ExitCode
) -> None:  # type: ignore[no-untyped-def]
    model: str | Path = {"op_zoo": "op_zoo.tflite", "float": tmp_path / "log.tflite"}.get(option, MODEL)
    if option == "float":
        import numpy as np
        from test_judge_integrity import log_model

        Path(model).write_bytes(log_model())
        (tmp_path / "inputs").mkdir()
        np.save(tmp_path / "inputs/log.q.npy", np.arange(-64, 64, 8, dtype=np.int8).reshape(1, 16))
        models_dir = tmp_path
    got = _run(mode, port(query), models_dir, tmp_path / "o", model=model, reference=option != "no_reference")
    assert got == expected, f"{option} {mode} with {query or 'no fault'}: exit {int(got)}"


def test_served_board_by_fault(tmp_path: Path, models_dir: Path) -> None:
    """The board served over RFC 2217 (``esp-check sim serve --rfc2217``, another process's view of it):
    the same verdicts as in-process. Faked: the board (a served ``sim://``)."""
    from harness.sim.serve import serve_rfc2217

    cells = [("fault=corrupt&variant_fault=optimized", m, M) for m in ("single", "ds_crc")]
    cells += [("fault=panic&variant_fault=optimized", m, F) for m in ("single", "ds_full")]
    for k, (query, mode, expected) in enumerate(cells):
        name = f"mxs-{uuid.uuid4().hex[:8]}"
        server = serve_rfc2217(f"sim://{name}?emitter=c&flash_size=8MB&{query}")
        try:
            got = _run(mode, server.address, models_dir, tmp_path / str(k))
        finally:
            server.stop()
            remove_board(name)
        assert got == expected, f"served {mode} with {query}: exit {int(got)}, expected {int(expected)}"


# ---- a dataset of files: the second variant runs the inputs the first one kept (docs/protocol.md) ------

KEEP_CELLS = [
    (f, m) for f in ("", "fault=keep_cold", "fault=keep_stale", "fault=keep_flip") for m in ("crc", "full")
]


@pytest.mark.parametrize(("query", "results"), KEEP_CELLS, ids=[f"{m}-{q or 'clean'}" for q, m in KEEP_CELLS])
def test_kept_inputs_by_fault(tmp_path: Path, models_dir: Path, port, query: str, results: str) -> None:  # type: ignore[no-untyped-def]
    """Lost, stale or damaged kept inputs fall back to uploads: always the clean match the board earned,
    and the second variant uploads nothing only when its store was intact."""

    import numpy as np

    x = np.random.default_rng(8).integers(-128, 128, (5, 1, 32, 32, 3), dtype=np.int8)
    np.savez(tmp_path / "d.npz", x=x)
    ds = DatasetOptions(source=tmp_path / "d.npz", results=results)
    r = flash_and_compare(
        models_dir / MODEL, [], board="sim", port=port(query), out_dir=tmp_path / "o",
        options=JobOptions(timeouts=LIMITS, dataset=ds),
    )  # fmt: skip
    assert r.exit_code == OK, r.errors
    links = json.loads(r.report_path.read_text())["dataset"]["link"].values()
    assert sorted(x["tx_payload"] for x in links) == [0 if not query else 5 * 3072, 5 * 3072]


# ---- esp-check run: a dataset job and a one-input job on a faulty board ---------------------------

RUN_CELLS = [
    ("", OK),
    ("fault=corrupt&variant_fault=optimized", M),
    ("fault=panic&variant_fault=optimized&fault_boots=1", F),  # retried to confirm, never cleared
    ("fault=frame_tx&frame_every=3&variant_fault=optimized", INF),
]


@pytest.mark.parametrize(("query", "expected"), RUN_CELLS, ids=[q or "clean" for q, _ in RUN_CELLS])
def test_runner_by_fault(tmp_path: Path, models_dir: Path, query: str, expected: ExitCode) -> None:
    from harness.runner import RunOptions, load_inventory, load_plan, run_plan

    name = f"mxr-{uuid.uuid4().hex[:8]}"
    inv = tmp_path / "bench.toml"
    inv.write_text(f'[[board]]\nname = "b1"\ntype = "sim"\nport = "sim://{name}?emitter=c&{query}"\n')
    plan = tmp_path / "plan.toml"
    model = models_dir / MODEL
    plan.write_text(
        '[run]\nbackoff_s = 0.05\n\n[defaults]\nboards = ["sim"]\nretries = 1\n'
        "timeouts = { capture_total = 40, capture_silence = 3 }\n"
        f'\n[[job]]\nname = "ds"\nmodels = ["{model}"]\nrandom_inputs = 4\nseed = 3\nresults = "crc"\n'
        f'\n[[job]]\nname = "one"\nmodels = ["{model}"]\ninputs = ["{models_dir / IMAGE}"]\n'
    )
    try:
        opts = RunOptions(out_dir=tmp_path / "out", lock_dir=tmp_path / "locks", cache_dir=tmp_path / "cache")
        result = run_plan(load_plan(plan), load_inventory(inv), opts)
    finally:
        remove_board(name)
    assert result.exit_code == expected


# ---- a repeat run on a board that already holds the builds: no esptool session, the same verdict ----

SKIP_CELLS = [("", "single", OK)] + [
    ("fault=corrupt&variant_fault=optimized", m, M) for m in ("single", "tap", "ds_crc", "ds_full")
]


@pytest.mark.parametrize(
    ("query", "mode", "expected"), SKIP_CELLS, ids=[f"{m}-{q or 'clean'}" for q, m, _ in SKIP_CELLS]
)
def test_mode_with_the_flash_skipped(
    tmp_path: Path, models_dir: Path, port, query: str, mode: str, expected: ExitCode
) -> None:  # type: ignore[no-untyped-def]
    """The second run finds the builds on the board from its app's HELLO (model, running and other slot
    SHA-256) and runs no esptool session; the faulty variant is judged exactly as after a flash."""

    from harness.flows.resident import FLASH_SKIPPED

    url = port(query)
    assert _run(mode, url, models_dir, tmp_path / "a") == expected
    board = get_board(url.split("//")[1].split("?")[0])
    sessions = board.download_sessions
    got = _run(mode, url, models_dir, tmp_path / "b")
    assert got == expected, f"{mode} with {query or 'no fault'}, flash skipped: exit {int(got)}"
    doc = json.loads((tmp_path / "b" / "report.json").read_text())
    assert {v["flash"]["skipped"] for v in doc["variants"].values()} == {FLASH_SKIPPED}
    assert board.download_sessions == sessions


def test_runner_job_whose_served_board_is_gone_is_never_a_match(tmp_path: Path, models_dir: Path) -> None:
    """The served board answers when the run starts (no quarantine) and is gone when the task runs: the
    pipeline ends at its port check with exit 3 and no variant ran; the runner must not judge that as a
    match. Faked: the board (a served ``sim://``), stopped from the runner's port hook."""
    from harness.runner import RunOptions, load_inventory, load_plan, run_plan
    from harness.sim.serve import serve_rfc2217

    name = f"mxg-{uuid.uuid4().hex[:8]}"
    server = serve_rfc2217(f"sim://{name}?emitter=c&flash_size=8MB")
    inv = tmp_path / "bench.toml"
    inv.write_text(f'[[board]]\nname = "b1"\ntype = "sim"\nport = "{server.address}"\n')
    plan = tmp_path / "plan.toml"
    plan.write_text(
        '[defaults]\nboards = ["sim"]\nretries = 0\n'
        f'\n[[job]]\nname = "one"\nmodels = ["{models_dir / MODEL}"]\ninputs = ["{models_dir / IMAGE}"]\n'
    )

    def gone(*_: object) -> None:
        server.stop()  # the board's server died between the run's start and this attempt

    out = tmp_path / "out"
    try:
        opts = RunOptions(out_dir=out, lock_dir=tmp_path / "locks", cache_dir=tmp_path / "cache")
        result = run_plan(load_plan(plan), load_inventory(inv), dataclasses.replace(opts, port_override=gone))
    finally:
        server.stop()
        remove_board(name)
    assert result.exit_code == INF
    (task,) = json.loads((out / "summary.json").read_text())["tasks"]
    assert "port" in task["reason"], task["reason"]
