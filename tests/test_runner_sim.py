"""``esp-check run`` end to end on a bench of simulated boards.

What is real: plan/inventory parsing, the scheduler and its worker threads, filelock board locks,
the generated projects and the sim builder's images, esptool 5 flashing over real pyserial ports
(``sim://`` and, for one board, RFC 2217 over TCP served by ``harness.sim.serve`` in a background
thread), the console capture and parser, the TFLM host reference, the comparison and every report.
What is faked: the boards themselves (harness.sim), the outermost edge. Faults are injected through
the simulator's URL parameters (``sync_fail``, ``disconnect``, ``corrupt``, ``panic``; transient ones
with ``fault_boots=N``, which faults only the board's first N app boots), and a closed TCP port
stands for a board whose serial server is down.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from harness.device.locks import BoardLock
from harness.errors import ExitCode
from harness.flows.job import JobOptions
from harness.runner import RunOptions, load_inventory, load_plan, run_plan
from harness.runner.reports import summary_dict

pytest.importorskip("tflite_micro")

MODELS = ("cnn_classifier_11", "op_zoo", "unet_mbv2_035_48")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runner-build-cache")


@pytest.fixture(scope="module")
def inputs_dir(tmp_path_factory: pytest.TempPathFactory, models_dir: Path) -> Path:
    """Each model's fixture input, plus a second one made from it (flipped along the last axis)."""
    d = tmp_path_factory.mktemp("runner-inputs")
    for m in MODELS:
        x = np.load(models_dir / "inputs" / f"{m}.npy")
        np.save(d / f"{m}.npy", x)
        np.save(d / f"{m}_flip.npy", np.ascontiguousarray(np.flip(x, axis=-1)))
    return d


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def write_plan(
    path: Path,
    models_dir: Path,
    inputs_dir: Path,
    models: tuple[str, ...],
    boards: list[str],
    *,
    placement: str = "each",
    retries: int = 2,
    quarantine_after: int = 3,
    extra: str = "",
) -> Path:
    text = f"""
[run]
backoff_s = 0.05
backoff_max_s = 0.2
quarantine_after = {quarantine_after}
lock_timeout_s = 120

[defaults]
comparisons = ["optimized-vs-ansi", "each-vs-host"]
timeouts = {{ capture_total = 30, capture_silence = 3 }}
retries = {retries}

[[job]]
name = "fixtures"
models = {json.dumps([str(models_dir / f"{m}.tflite") for m in models])}
inputs = ["{inputs_dir}/{{model}}.npy", "{inputs_dir}/{{model}}_flip.npy"]
boards = {json.dumps(boards)}
placement = "{placement}"
{extra}
"""
    path.write_text(text)
    return path


def remote_job(tmp_path: Path, models_dir: Path, inputs_dir: Path, model: str = "op_zoo") -> str:
    """A board type for the board behind the RFC 2217 server (boards are data) and a job for it.

    RFC 2217 is slow (each esptool command is a network round trip through the server's port
    manager), so the remote board runs one model, not the whole matrix.
    """
    text = (ROOT / "boards" / "sim.toml").read_text().replace('name = "sim"', 'name = "sim-remote"')
    (tmp_path / "sim-remote.toml").write_text(text)
    return f"""
[[job]]
name = "remote"
models = ["{models_dir / (model + ".tflite")}"]
inputs = ["{inputs_dir}/{{model}}.npy", "{inputs_dir}/{{model}}_flip.npy"]
boards = ["sim-remote.toml"]
"""


def write_inventory(path: Path, boards: list[tuple[str, str, str]]) -> Path:
    parts = [f'[[board]]\nname = "{n}"\ntype = "{t}"\nport = "{p}"\n' for n, t, p in boards]
    path.write_text("\n".join(parts))
    return path


SCHEMA = json.loads((ROOT / "docs" / "run-summary-schema.json").read_text())
# version 1 of that schema (as released), for the deprecated `--schema-version 1` form
SCHEMA_V1 = json.loads((ROOT / "tests" / "data" / "schemas" / "run-summary-v1.json").read_text())


def summary(out: Path) -> dict:
    """The run's summary.json, validated against its documented schema."""
    import jsonschema

    doc = json.loads((out / "summary.json").read_text())
    jsonschema.validate(doc, SCHEMA)
    return doc


def by_board(doc: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for t in doc["tasks"]:
        out.setdefault(t["board"], []).append(t)
    return out


@pytest.fixture
def served_board():
    """A simulated board behind an RFC 2217 server (esptool's EspPortManager) in a background thread."""
    from harness.sim.board import remove_board
    from harness.sim.serve import serve_rfc2217

    name = _uid("rfc")
    server = serve_rfc2217(f"sim://{name}?chip=esp32s3&emitter=c&flash_size=8MB")  # as boards/sim.toml
    yield server
    server.stop()
    remove_board(name)


@pytest.mark.slow
def test_three_models_two_inputs_three_boards_all_match(
    tmp_path: Path, models_dir: Path, inputs_dir: Path, cache_dir: Path, served_board
):
    b1, b2, b3 = _uid("b1"), _uid("b2"), _uid("b3")
    inv = write_inventory(
        tmp_path / "bench.toml",
        [
            ("b1", "sim", f"sim://{b1}?emitter=c"),
            ("b2", "sim", f"sim://{b2}?emitter=c"),
            ("b3", "sim-usbjtag", f"sim://{b3}?emitter=c"),  # USB-Serial-JTAG console: re-enumerates
            ("remote", "sim-remote.toml", served_board.address),  # over TCP: RFC 2217
        ],
    )
    plan = write_plan(
        tmp_path / "plan.toml",
        models_dir,
        inputs_dir,
        MODELS,
        ["sim", "sim-usbjtag"],
        extra=remote_job(tmp_path, models_dir, inputs_dir),
    )
    out = tmp_path / "out"
    result = run_plan(
        load_plan(plan),
        load_inventory(inv),
        RunOptions(out_dir=out, lock_dir=tmp_path / "locks", cache_dir=cache_dir),
    )
    doc = summary(out)
    assert result.exit_code == ExitCode.MATCH, [(t["id"], t["reason"]) for t in doc["tasks"]]
    assert doc["verdict"] == "match" and doc["simulated"] is True
    # 3 models x 3 boards (placement "each") + 1 model on the remote board; 2 inputs x 3 comparisons each
    assert len(doc["tasks"]) == 10
    assert {t["board"] for t in doc["tasks"]} == {"b1", "b2", "b3", "remote"}
    assert doc["counts"]["testcases"] == 10 * 2 * 3 == doc["counts"]["passed"]
    for t in doc["tasks"]:
        assert t["verdict"] == "match" and len(t["attempts"]) == 1
        assert {c["input"].endswith("_flip.npy") for c in t["testcases"]} == {True, False}
        assert {c["comparison"] for c in t["testcases"]} == {
            "optimized-vs-ansi",
            "optimized-vs-reference",
            "ansi-vs-reference",
        }
        for v in ("optimized", "ansi"):
            log = t["attempts"][0]["variants"][v]["serial_log"]
            assert Path(log).read_bytes().count(b" END ") == 1  # artifacts kept per attempt
    # same firmware for the two boards of type "sim": built once, flashed to both
    for m in MODELS:
        shas = {
            t["board"]: t["builds"]["optimized"]["firmware_sha256"]
            for t in doc["tasks"]
            if t["job"] == "fixtures" and f"/{m}/" in t["id"]
        }
        assert shas["b1"] == shas["b2"] != shas["b3"]  # b3's firmware has a USB-Serial-JTAG console
    # the served board is locked by its server address, the simulated ones by name: never a /dev path
    keys = {b["name"]: b["lock_key"] for b in doc["boards"]}
    assert keys["remote"] == f"net-127.0.0.1-{served_board.port}" and keys["b1"] == f"sim-{b1}"
    # both variants of each of its tasks went through the RFC 2217 server (one session per attempt: the
    # pipeline flashes both variants at once and boots each in turn over the same connection)
    remote = [t for t in doc["tasks"] if t["board"] == "remote"]
    assert remote and served_board.clients_served >= len(remote)
    for t in remote:
        for v in ("optimized", "ansi"):
            assert b" END " in Path(t["attempts"][0]["variants"][v]["serial_log"]).read_bytes()
    # JUnit: one testcase per task x input x comparison, raw serial log attached
    root = ET.parse(out / "junit.xml").getroot()
    cases = root.findall(".//testcase")
    assert len(cases) == 60 and root.get("failures") == "0" and root.get("errors") == "0"
    assert all("@EC1 " in (c.findtext("system-out") or "") for c in cases)
    md = (out / "summary.md").read_text()
    assert "match" in md and "| 60 | 60 | 0 | 0 |" in md


@pytest.mark.slow
def test_injected_faults_give_retries_quarantine_failures_and_errors(
    tmp_path: Path, models_dir: Path, inputs_dir: Path, cache_dir: Path
):
    names = {k: _uid(k) for k in ("sync", "disc", "broken", "corrupt", "panic", "flaky")}
    inv = write_inventory(
        tmp_path / "bench.toml",
        [
            # esptool tries 7 times inside one connect; the 7 failing sessions fail the first attempt
            ("sync", "sim", f"sim://{names['sync']}?emitter=c&fault=sync_fail&fault_count=7"),
            # the link drops in the middle of the records on the first boot only (the optimized variant)
            ("disc", "sim", f"sim://{names['disc']}?emitter=c&fault=disconnect&fault_boots=1"),
            # never answers the ROM loader (a board whose server is down is found before any build and
            # takes no work: test_quarantined_board_hands_its_jobs_to_another_board)
            ("broken", "sim", f"sim://{names['broken']}?emitter=c&fault=sync_fail&fault_count=100000"),
            ("corrupt", "sim", f"sim://{names['corrupt']}?emitter=c&fault=corrupt&variant_fault=optimized"),
            ("panic", "sim", f"sim://{names['panic']}?emitter=c&fault=panic&variant_fault=optimized"),
            # crashes on its first boot only: the confirmation re-run does not reproduce it
            (
                "flaky",
                "sim",
                f"sim://{names['flaky']}?emitter=c&fault=panic&variant_fault=optimized&fault_boots=1",
            ),
        ],
    )
    plan = write_plan(
        tmp_path / "plan.toml", models_dir, inputs_dir, ("cnn_classifier_11",), ["sim"], quarantine_after=3
    )
    out = tmp_path / "out"
    result = run_plan(
        load_plan(plan),
        load_inventory(inv),
        RunOptions(out_dir=out, lock_dir=tmp_path / "locks", cache_dir=cache_dir),
    )
    doc = summary(out)
    tasks = {t["board"]: t for t in doc["tasks"]}
    boards = {b["name"]: b for b in doc["boards"]}
    # first sync fails -> retried -> match
    assert [a["exit_code"] for a in tasks["sync"]["attempts"]] == [3, 0]
    assert "no sync" in tasks["sync"]["attempts"][0]["reason"] and tasks["sync"]["verdict"] == "match"
    # disconnect mid-run -> retried -> match
    assert [a["exit_code"] for a in tasks["disc"]["attempts"]] == [3, 0]
    assert tasks["disc"]["verdict"] == "match"
    # permanently broken -> retries up to the limit, then quarantined; its task is an error
    assert [a["exit_code"] for a in tasks["broken"]["attempts"]] == [3, 3, 3]
    assert boards["broken"]["status"] == "quarantined"
    assert tasks["broken"]["verdict"] == "infrastructure_error"
    # a variant corrupting its outputs -> mismatch on the first attempt, never retried
    assert [a["exit_code"] for a in tasks["corrupt"]["attempts"]] == [1]
    assert tasks["corrupt"]["verdict"] == "mismatch"
    # a crash is a finding: re-run once to confirm, never counted against the board
    assert [a["exit_code"] for a in tasks["panic"]["attempts"]] == [4, 4]
    assert tasks["panic"]["verdict"] == "firmware_fault" and tasks["panic"]["firmware_fault_confirmed"]
    assert boards["panic"]["status"] == "ok" and boards["panic"]["consecutive_infra_failures"] == 0
    # a crash the re-run does not reproduce is still a firmware fault ("intermittent"), decided by the crash
    assert [a["exit_code"] for a in tasks["flaky"]["attempts"]] == [4, 0]
    assert (
        tasks["flaky"]["verdict"] == "firmware_fault" and tasks["flaky"]["firmware_fault_confirmed"] is False
    )
    assert "intermittent" in tasks["flaky"]["reason"] and tasks["flaky"]["decisive_attempt"] == 1
    for name in ("sync", "disc", "corrupt", "flaky"):
        assert boards[name]["status"] == "ok"
    # exit code precedence: firmware fault (4) over mismatch (1) over infrastructure (3)
    assert result.exit_code == ExitCode.FIRMWARE_FAULT and doc["exit_code"] == 4
    # testcases: mismatch/firmware fault are failures, infrastructure is an error
    cases = {b: {(c["comparison"], c["input_index"]): c for c in t["testcases"]} for b, t in tasks.items()}
    assert cases["corrupt"][("optimized-vs-ansi", 0)]["status"] == "failure"
    assert cases["corrupt"][("ansi-vs-reference", 0)]["status"] == "passed"
    assert cases["panic"][("optimized-vs-ansi", 0)]["type"] == "firmware_fault"
    assert cases["panic"][("optimized-vs-ansi", 0)]["status"] == "failure"
    assert cases["panic"][("ansi-vs-reference", 1)]["status"] == "passed"
    assert {c["status"] for c in cases["broken"].values()} == {"error"}
    assert {c["status"] for c in cases["sync"].values()} == {"passed"}
    root = ET.parse(out / "junit.xml").getroot()
    assert int(root.get("errors")) == 6 and int(root.get("failures")) >= 4
    kinds = [e["kind"] for e in doc["events"]]
    assert kinds.count("retry") == 4 and kinds.count("quarantine") == 1 and kinds.count("confirm") == 2
    assert all(t["state"] == "done" for t in doc["tasks"]) and doc["counts"]["aborted"] == 0


@pytest.mark.slow
def test_quarantined_board_hands_its_jobs_to_another_board(
    tmp_path: Path, models_dir: Path, inputs_dir: Path, cache_dir: Path
):
    good = _uid("good")
    inv = write_inventory(
        tmp_path / "bench.toml",
        [
            ("good", "sim", f"sim://{good}?emitter=c"),
            ("broken", "sim", f"rfc2217://127.0.0.1:{_free_port()}"),
        ],
    )
    plan = write_plan(
        tmp_path / "plan.toml", models_dir, inputs_dir, MODELS, ["sim"], placement="any", quarantine_after=2
    )
    out = tmp_path / "out"
    result = run_plan(
        load_plan(plan),
        load_inventory(inv),
        RunOptions(out_dir=out, lock_dir=tmp_path / "locks", cache_dir=cache_dir),
    )
    doc = summary(out)
    assert result.exit_code == ExitCode.MATCH, [(t["id"], t["reason"]) for t in doc["tasks"]]
    assert all(t["verdict"] == "match" and t["board"] == "good" for t in doc["tasks"])
    broken = next(b for b in doc["boards"] if b["name"] == "broken")
    # no cascade: nothing answers at the broken board's server, which is found before any build (a TCP
    # probe of its rfc2217:// port): it is quarantined at once and takes no work
    assert broken["attempts"] == 0 and broken["status"] == "quarantined"
    assert "port missing when the run started" in broken["reason"] and "nothing answers" in broken["reason"]


def test_power_cycle_is_tried_once_before_quarantine(
    tmp_path: Path, models_dir: Path, inputs_dir: Path, cache_dir: Path
):
    marker = tmp_path / "cycles"
    cycle = [sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write('cycle\\n')", str(marker)]
    (tmp_path / "bench.toml").write_text(
        # a board that never answers the ROM loader (a server that is down is found before any build)
        f'[[board]]\nname = "dead"\ntype = "sim"\n'
        f'port = "sim://{_uid("dead")}?emitter=c&fault=sync_fail&fault_count=100000"\n'
        f"power_cycle = {json.dumps(cycle)}\n"
    )
    plan = write_plan(
        tmp_path / "plan.toml", models_dir, inputs_dir, ("op_zoo",), ["sim"], retries=5, quarantine_after=2
    )
    out = tmp_path / "out"
    run_plan(
        load_plan(plan),
        load_inventory(tmp_path / "bench.toml"),
        RunOptions(out_dir=out, lock_dir=tmp_path / "locks", cache_dir=cache_dir),
    )
    doc = summary(out)
    board = doc["boards"][0]
    assert marker.read_text() == "cycle\n"  # run once, not once per failure
    assert board["power_cycled"] is True and board["status"] == "quarantined"
    # 2 failures -> power cycle -> 1 more failure -> quarantined; the 5 allowed retries are not burnt
    assert [a["exit_code"] for a in doc["tasks"][0]["attempts"]] == [3, 3, 3]
    assert [e["kind"] for e in doc["events"]] == ["retry", "retry", "power-cycle", "retry", "quarantine"]
    assert doc["tasks"][0]["verdict"] == "infrastructure_error"


def test_stop_lets_the_running_attempt_finish_and_aborts_the_rest(
    tmp_path: Path, models_dir: Path, inputs_dir: Path, cache_dir: Path
):
    name = _uid("stop")
    inv = write_inventory(tmp_path / "bench.toml", [("only", "sim", f"sim://{name}?emitter=c")])
    plan = write_plan(tmp_path / "plan.toml", models_dir, inputs_dir, MODELS, ["sim"])
    stop = threading.Event()

    def progress(msg: str) -> None:
        if msg.startswith("[start]"):
            stop.set()  # as the CLI's SIGINT/SIGTERM handler does

    out = tmp_path / "out"
    result = run_plan(
        load_plan(plan),
        load_inventory(inv),
        RunOptions(
            out_dir=out, lock_dir=tmp_path / "locks", cache_dir=cache_dir, progress=progress, stop=stop
        ),
    )
    doc = summary(out)
    assert [t["state"] for t in doc["tasks"]] == ["done", "aborted", "aborted"]
    assert [t["verdict"] for t in doc["tasks"]] == ["match", "infrastructure_error", "infrastructure_error"]
    assert doc["interrupted"] is True and doc["verdict"] == "infrastructure_error"
    assert doc["counts"]["aborted"] == 2 and doc["counts"]["infrastructure_error"] == 2
    assert result.exit_code == ExitCode.INFRASTRUCTURE
    assert result.stopped == "interrupted: the tasks without a verdict were aborted"  # the exit lines say so
    # the deprecated version 1 form: "aborted" and "interrupted" were verdicts there
    with pytest.warns(DeprecationWarning, match="schema_version 1 is deprecated"):
        v1 = summary_dict(result, schema_version=1)
    import jsonschema

    jsonschema.validate(v1, SCHEMA_V1)
    assert [t["verdict"] for t in v1["tasks"]] == ["match", "aborted", "aborted"]
    assert v1["verdict"] == "interrupted" and "state" not in v1["tasks"][0]
    assert v1["counts"]["aborted"] == 2 and v1["counts"]["infrastructure_error"] == 0
    root = ET.parse(out / "junit.xml").getroot()
    assert {e.get("type") for e in root.iter("error")} == {"aborted"}
    lk = BoardLock(f"sim-{name}", tmp_path / "locks")
    lk.acquire(0.5)  # released: nobody holds the board any more
    lk.release()


def test_a_stop_after_every_verdict_exits_with_the_verdicts_and_says_so(
    tmp_path: Path, models_dir: Path, inputs_dir: Path, cache_dir: Path
):
    """Ctrl-C after the last task had its verdict (docs/ci.md "Ctrl-C"): nothing was cut short, so the
    exit is the verdicts' (0: every task matched), and the exit lines say why an interrupted run passed;
    a stop that left a task without its verdict says the tasks were aborted (exit 3, the test above).
    The old line was a bare "exit 0 (interrupted)", and docs/ci.md said exit 3."""
    import io

    from rich.console import Console

    from harness.commands.runner_cmds import _print
    from harness.runner.reports import markdown

    inv = write_inventory(tmp_path / "bench.toml", [("only", "sim", f"sim://{_uid('late')}?emitter=c")])
    plan = write_plan(tmp_path / "plan.toml", models_dir, inputs_dir, ("op_zoo",), ["sim"])
    stop = threading.Event()

    def progress(msg: str) -> None:
        if msg.startswith("[done]"):  # the task has its verdict: the stop comes after it
            stop.set()

    out = tmp_path / "out"
    opts = RunOptions(
        out_dir=out, lock_dir=tmp_path / "locks", cache_dir=cache_dir, progress=progress, stop=stop
    )
    result = run_plan(load_plan(plan), load_inventory(inv), opts)
    doc = summary(out)
    assert [t["state"] for t in doc["tasks"]] == ["done"] and doc["verdict"] == "match"
    assert doc["interrupted"] is True and result.exit_code == ExitCode.MATCH
    text = io.StringIO()
    _print(Console(file=text, width=200), result)
    assert "exit 0 (interrupted after every task had its verdict)" in text.getvalue()
    assert "(exit 0) — **interrupted after every task had its verdict**" in markdown(result)


def test_busy_board_waits_visibly_then_gives_up(
    tmp_path: Path, models_dir: Path, inputs_dir: Path, cache_dir: Path
):
    name = _uid("busy")
    inv = write_inventory(tmp_path / "bench.toml", [("held", "sim", f"sim://{name}?emitter=c")])
    plan = write_plan(tmp_path / "plan.toml", models_dir, inputs_dir, ("op_zoo",), ["sim"])
    holder = BoardLock(f"sim-{name}", tmp_path / "locks", owner="a person at the bench")
    holder.acquire(1)
    messages: list[str] = []
    try:
        result = run_plan(
            load_plan(plan),
            load_inventory(inv),
            RunOptions(
                out_dir=tmp_path / "out",
                lock_dir=tmp_path / "locks",
                cache_dir=cache_dir,
                lock_timeout_s=0.6,
                progress=messages.append,
            ),
        )
    finally:
        holder.release()
    assert result.exit_code == ExitCode.INFRASTRUCTURE
    assert any("a person at the bench" in m for m in messages if m.startswith("[lock]"))
    doc = summary(tmp_path / "out")
    assert doc["boards"][0]["status"] == "busy"
    assert doc["tasks"][0]["verdict"] == "infrastructure_error"


def test_flash_and_compare_waits_for_the_runner_lock(tmp_path: Path, models_dir: Path, cache_dir: Path):
    """A person's flash-and-compare takes the same lock as `esp-check run` for the same board."""
    from harness.flows.flash_and_compare import flash_and_compare
    from harness.flows.records import StageTimeouts

    name = _uid("fac")
    holder = BoardLock(f"sim-{name}", tmp_path / "locks", owner="esp-check run plan.toml")
    holder.acquire(1)
    try:
        result = flash_and_compare(
            models_dir / "op_zoo.tflite",
            [models_dir / "inputs" / "op_zoo.npy"],
            board="sim",
            port=f"sim://{name}",
            out_dir=tmp_path / "o1",
            options=JobOptions(
                cache_dir=cache_dir,
                reference=False,
                timeouts=StageTimeouts(capture_total=30, capture_silence=3),
                lock_dir=tmp_path / "locks",
                lock_timeout=0.5,
            ),
        )
    finally:
        holder.release()
    assert result.exit_code == ExitCode.INFRASTRUCTURE
    assert any("esp-check run plan.toml" in e for e in result.errors)
    assert all(r.flash is None for r in result.variants.values())  # the board was never touched
    again = flash_and_compare(
        models_dir / "op_zoo.tflite",
        [models_dir / "inputs" / "op_zoo.npy"],
        board="sim",
        port=f"sim://{name}",
        out_dir=tmp_path / "o2",
        options=JobOptions(
            cache_dir=cache_dir,
            reference=False,
            timeouts=StageTimeouts(capture_total=30, capture_silence=3),
            lock_dir=tmp_path / "locks",
            lock_timeout=0.5,
        ),
    )
    assert again.exit_code == ExitCode.MATCH


def _overlaps(intervals: list[dict]) -> list[tuple[dict, dict]]:
    bad = []
    by_key: dict[str, list[dict]] = {}
    for u in intervals:
        by_key.setdefault(u["lock_key"], []).append(u)
    for items in by_key.values():
        items.sort(key=lambda u: u["start"])
        for a, b in itertools.pairwise(items):
            if b["start"] < a["end"]:
                bad.append((a, b))
    return bad


@pytest.mark.slow
def test_two_runner_processes_never_share_a_board(
    tmp_path: Path, models_dir: Path, inputs_dir: Path, cache_dir: Path, served_board
):
    """Two `esp-check run` subprocesses, one inventory: per-board usage intervals never overlap."""
    inv = write_inventory(
        tmp_path / "bench.toml",
        [
            ("s1", "sim", f"sim://{_uid('shared')}?emitter=c"),  # same name in both processes: one board
            ("net", "sim-remote.toml", served_board.address),  # one TCP server both processes connect to
        ],
    )
    plan = write_plan(
        tmp_path / "plan.toml",
        models_dir,
        inputs_dir,
        ("cnn_classifier_11", "op_zoo"),
        ["sim"],
        extra=remote_job(tmp_path, models_dir, inputs_dir),
    )
    env = dict(os.environ, ESP_CHECK_CACHE_DIR=str(cache_dir))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "harness.cli",
                "run",
                str(plan),
                "--inventory",
                str(inv),
                "--out",
                str(tmp_path / f"out{i}"),
                "--lock-dir",
                str(tmp_path / "locks"),
                "--no-step-summary",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for i in (1, 2)
    ]
    outputs = [p.communicate(timeout=240)[0].decode(errors="replace") for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    usage = summary(tmp_path / "out1")["board_usage"] + summary(tmp_path / "out2")["board_usage"]
    assert len({u["pid"] for u in usage}) == 2
    assert len(usage) == 2 * 3  # per process: 2 models on s1, 1 on the remote board; one attempt each
    assert {u["lock_key"] for u in usage} == {
        summary(tmp_path / "out1")["boards"][0]["lock_key"],
        f"net-127.0.0.1-{served_board.port}",
    }
    assert all(u["end"] > u["start"] for u in usage)
    assert _overlaps(usage) == []


def test_sigterm_stops_the_cli_cleanly(tmp_path: Path, models_dir: Path, inputs_dir: Path, cache_dir: Path):
    """SIGTERM (what CI sends on cancel, then SIGKILL a few seconds later): the running attempt is
    abandoned at once (not waited for), every task is aborted, reports are written, exit 3."""
    import signal

    name = _uid("term")
    inv = write_inventory(tmp_path / "bench.toml", [("only", "sim", f"sim://{name}?emitter=c")])
    plan = write_plan(tmp_path / "plan.toml", models_dir, inputs_dir, MODELS, ["sim"])
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "run",
            str(plan),
            "-i",
            str(inv),
            "--out",
            str(tmp_path / "out"),
            "--lock-dir",
            str(tmp_path / "locks"),
            "--no-step-summary",
        ],
        cwd=ROOT,
        env=dict(os.environ, ESP_CHECK_CACHE_DIR=str(cache_dir)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "[start]" in line:
            proc.send_signal(signal.SIGTERM)
            break
    rest = proc.communicate(timeout=120)[1]
    assert proc.returncode == ExitCode.INFRASTRUCTURE, "".join(seen) + rest
    assert "SIGTERM" in rest
    doc = summary(tmp_path / "out")
    assert doc["interrupted"] is True
    assert [t["state"] for t in doc["tasks"]] == ["aborted", "aborted", "aborted"]
    assert doc["tasks"][0]["reason"] == "run stopped while this task was running"
    assert (tmp_path / "out" / "junit.xml").exists() and (tmp_path / "out" / "summary.md").exists()
    lk = BoardLock(f"sim-{name}", tmp_path / "locks")
    lk.acquire(0.5)  # the lock went with the process
    lk.release()


def _cli_run(
    plan: Path, inv: Path, out: Path, tmp_path: Path, cache_dir: Path, *extra: str
) -> subprocess.Popen:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "harness.cli", "run", str(plan), "-i", str(inv), "--out", str(out)),
            *("--lock-dir", str(tmp_path / "locks"), "--no-step-summary", *extra),
        ],
        cwd=ROOT,
        env=dict(os.environ, ESP_CHECK_CACHE_DIR=str(cache_dir)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_a_run_killed_with_sigkill_leaves_no_stale_verdict(
    tmp_path: Path, models_dir: Path, inputs_dir: Path, cache_dir: Path
):
    """kill -9 writes no reports: the previous run's "match" must not stay next to new mismatches."""
    import signal

    name = _uid("kill")
    plan = write_plan(
        tmp_path / "plan.toml", models_dir, inputs_dir, ("cnn_classifier_11", "op_zoo"), ["sim"]
    )
    clean = write_inventory(tmp_path / "clean.toml", [("only", "sim", f"sim://{name}?emitter=c")])
    faulty = write_inventory(
        tmp_path / "faulty.toml",
        [("only", "sim", f"sim://{name}?emitter=c&fault=corrupt&variant_fault=optimized")],
    )
    out = tmp_path / "out"
    # 1. a clean run to the end: everything matches
    first = _cli_run(plan, clean, out, tmp_path, cache_dir)
    assert first.wait(timeout=240) == ExitCode.MATCH, first.communicate()[1]
    assert summary(out)["verdict"] == "match"
    # 2. the bench goes bad; the run is killed with SIGKILL once its first task recorded a mismatch
    killed = _cli_run(plan, faulty, out, tmp_path, cache_dir)
    assert killed.stderr is not None
    seen = []
    for line in killed.stderr:
        seen.append(line)
        if "[start]" in line and "/op_zoo/" in line:  # the first task (cnn_classifier_11) is judged
            killed.send_signal(signal.SIGKILL)
            break
    killed.communicate(timeout=60)
    assert killed.returncode == -signal.SIGKILL, "".join(seen)
    attempts = [json.loads(p.read_text()) for p in (out / "jobs").rglob("attempt.json")]
    assert attempts and {a["exit_code"] for a in attempts} == {1}
    # no verdict file of the clean run is left beside them: moved aside, and said so
    assert not [p.name for p in out.iterdir() if p.name in ("summary.json", "junit.xml", "summary.md")]
    assert not list((out / "jobs").rglob("result.json"))
    assert any("previous-run" in line for line in seen)
    assert json.loads((out / "previous-run" / "summary.json").read_text())["verdict"] == "match"
    # 3. the rerun with the fault finishes: every report says mismatch
    rerun = _cli_run(plan, faulty, out, tmp_path, cache_dir)
    assert rerun.wait(timeout=240) == ExitCode.MISMATCH, rerun.communicate()[1]
    doc = summary(out)
    assert doc["verdict"] == "mismatch"
    assert doc["previous_run_dir"] == str(out / "previous-run" / "incomplete-run")
    assert [t["verdict"] for t in doc["tasks"]] == ["mismatch", "mismatch"]
    results = [json.loads(p.read_text()) for p in (out / "jobs").rglob("result.json")]
    assert len(results) == 2 and {r["verdict"] for r in results} == {"mismatch"}
    assert [json.loads(p.read_text())["exit_code"] for p in (out / "jobs").rglob("attempt.json")] == [1, 1]
    assert int(ET.parse(out / "junit.xml").getroot().get("failures")) > 0
    assert "mismatch" in (out / "summary.md").read_text().splitlines()[0]
    # what the killed run left (its attempt, no summary) is kept apart: the last complete run's summary
    # and JUnit (the clean run's "match") are not lost
    assert list((out / "previous-run" / "incomplete-run" / "jobs").rglob("attempt.json"))
    assert json.loads((out / "previous-run" / "summary.json").read_text())["verdict"] == "match"
    assert (out / "previous-run" / "junit.xml").exists()
    assert not list(out.glob("*.tmp")) and not list(out.glob(".*.tmp"))


def test_a_hard_stop_kills_the_children_of_the_abandoned_attempt(
    tmp_path: Path, models_dir: Path, inputs_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    """Regression: after a second SIGTERM ("abandoning running attempts") the attempt's host
    reference child ran on for 22 s and exited 0 to nobody. A hard stop now kills the children of the
    abandoned attempts. What is faked: the board (the simulator) and the host reference child, a
    sleeping interpreter (its process is the outermost edge), so it is surely running at the stop."""
    import psutil

    from harness.model import hostrun

    started = tmp_path / "child-started"
    sleeper = f"import pathlib, time; pathlib.Path({str(started)!r}).write_text('up'); time.sleep(120)"
    monkeypatch.setattr(hostrun, "_child_argv", lambda _job: [sys.executable, "-c", sleeper])
    monkeypatch.setenv("ESP_CHECK_CACHE_DIR", str(tmp_path / "cache"))  # no cached host reference
    inv = write_inventory(tmp_path / "bench.toml", [("only", "sim", f"sim://{_uid('hard')}?emitter=c")])
    plan = write_plan(tmp_path / "plan.toml", models_dir, inputs_dir, ("cnn_classifier_11",), ["sim"])
    stop, hard = threading.Event(), threading.Event()
    opts = RunOptions(out_dir=tmp_path / "out", lock_dir=tmp_path / "locks", cache_dir=tmp_path / "cache",
                      stop=stop, hard_stop=hard)  # fmt: skip
    results: list[object] = []
    th = threading.Thread(target=lambda: results.append(run_plan(load_plan(plan), load_inventory(inv), opts)))
    th.start()
    while not started.exists() and th.is_alive():
        th.join(timeout=0.05)
    kids = [p for p in psutil.Process().children(recursive=True) if sleeper in " ".join(p.cmdline())]
    assert kids, "the host reference child never started"
    stop.set()
    hard.set()  # what the CLI's handler does on SIGTERM
    th.join(timeout=120)
    assert not th.is_alive() and results[0].exit_code == ExitCode.INFRASTRUCTURE  # type: ignore[attr-defined]
    assert summary(tmp_path / "out")["interrupted"] is True
    _, alive = psutil.wait_procs(kids, timeout=10)
    assert alive == [], f"the abandoned attempt's child still runs: {alive}"


@pytest.mark.parametrize("slow_start", [False, True])
def test_children_do_not_outlive_esp_check(tmp_path: Path, slow_start: bool):
    """At exit, esp-check kills the children its threads still wait for: a build tool's whole process
    group (it runs in its own), e.g. a daemon worker thread's build when a run is abandoned. The tool
    here is sh with a background sleep (a compiler left running by the build). ``slow_start``: the
    worker thread stalls right after the tool has started (as a loaded machine may deschedule it), so
    esp-check exits before that thread could register the tool: it must be killed all the same."""
    import psutil

    pids = tmp_path / "pids"
    stall = ""
    if slow_start:  # faked: Popen returns 0.5 s after the child started (the edge of what is real here)
        stall = """
import subprocess
class _Stalled(subprocess.Popen):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        time.sleep(0.5)
subprocess.Popen = _Stalled
"""
    script = f"""
import os, pathlib, threading, time
{stall}
from harness.firmware.toolrun import run_streaming
cmd = "sleep 120 & echo $$ $! > {pids}.tmp && mv {pids}.tmp {pids}; wait"
def build():
    run_streaming(["sh", "-c", cmd], cwd=pathlib.Path("."), env=dict(os.environ),
                  log_path=pathlib.Path({str(tmp_path / "tool.log")!r}), on_output=None, timeout=None)
threading.Thread(target=build, daemon=True).start()
while not pathlib.Path({str(pids)!r}).exists():
    time.sleep(0.02)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, timeout=60, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    procs = []
    for pid in map(int, pids.read_text().split()):
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(procs, timeout=10)
    assert alive == [], f"a build tool's process outlived esp-check: {alive}"
