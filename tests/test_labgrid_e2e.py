"""``esp-check run --labgrid`` end to end on a labgrid lab on 127.0.0.1 (tests/labgrid_lab.py).

What is real: labgrid 26's coordinator, exporter and client (subprocesses, as in a lab), its
reservations, tags and NetworkPowerDriver; ``esp-check sim serve --rfc2217`` endpoints exported as
NetworkSerialPort resources; esptool flashing through them; esp-check's runner as a CLI subprocess.
What is faked: the boards (the simulator) and the power switch (an HTTP fake in this process).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from tests.labgrid_lab import ROOT, Lab, labgrid_tool

pytest.importorskip("tflite_micro")
if labgrid_tool("labgrid-coordinator") is None:  # pragma: no cover - CI installs labgrid (test extra)
    pytest.skip("labgrid is not installed (pip install 'esp-check[labgrid]')", allow_module_level=True)

pytestmark = pytest.mark.slow
pytest_plugins = ["pytester"]
SCHEMA = json.loads((ROOT / "docs" / "run-summary-schema.json").read_text())


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("labgrid-build-cache")


@pytest.fixture(scope="module")
def inputs_dir(tmp_path_factory: pytest.TempPathFactory, models_dir: Path) -> Path:
    d = tmp_path_factory.mktemp("labgrid-inputs")
    for m in ("op_zoo", "cnn_classifier_11"):
        np.save(d / f"{m}.npy", np.load(models_dir / "inputs" / f"{m}.npy"))
    return d


@pytest.fixture
def lab(tmp_path: Path):
    made: list[Lab] = []

    def start(boards: list[str], sim_args: dict[str, list[str]] | None = None) -> Lab:
        made.append(Lab(tmp_path / "lab").start(boards, sim_args))
        return made[-1]

    yield start
    for one in made:
        one.stop()


def write_plan(path: Path, models_dir: Path, inputs_dir: Path, models: list[str], *, placement: str,
               retries: int = 1, quarantine_after: int = 3, silence: int = 10) -> Path:  # fmt: skip
    path.write_text(
        f"""
[run]
backoff_s = 0.05
backoff_max_s = 0.2
quarantine_after = {quarantine_after}
lock_timeout_s = 120

[[job]]
name = "lab"
models = {json.dumps([str(models_dir / f"{m}.tflite") for m in models])}
inputs = ["{inputs_dir}/{{model}}.npy"]
boards = ["sim"]
placement = "{placement}"
retries = {retries}
timeouts = {{ capture_total = 60, capture_silence = {silence} }}
"""
    )
    return path


def run_cli(
    lab: Lab, plan: Path, out: Path, cache_dir: Path, *extra: str, inventory: Path | None = None
) -> subprocess.Popen:
    """``esp-check run`` as CI runs it: ``--labgrid`` (places found by tag), or an inventory naming places."""
    where = ["--inventory", str(inventory)] if inventory else ["--labgrid", lab.coordinator]
    argv = [sys.executable, "-m", "harness.cli", "run", str(plan), *where]
    argv += ["--out", str(out), "--no-step-summary", *extra]
    return subprocess.Popen(
        argv, cwd=ROOT, env=dict(os.environ, ESP_CHECK_CACHE_DIR=str(cache_dir), PYTHONUNBUFFERED="1"),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def finish(proc: subprocess.Popen, seen: list[str] | None = None, timeout: float = 400) -> str:
    err = proc.communicate(timeout=timeout)[1]
    return "".join(seen or []) + err


def lines_until(proc: subprocess.Popen, text: str) -> list[str]:
    """The runner's stderr lines up to the first that contains ``text`` (all of them if it exits first)."""
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if text in line:
            break
    return seen


def summary(out: Path) -> dict:
    doc = json.loads((out / "summary.json").read_text())
    jsonschema.validate(doc, SCHEMA)
    return doc


def assert_released(lab: Lab, place: str) -> None:
    shown = lab.show(place)
    assert "acquired: None" in shown, shown
    assert "esp_check=" not in shown, shown  # the holder tag went with the acquisition
    assert place not in lab.client("reservations"), "a reservation was left behind"


def test_a_plan_runs_across_two_places(
    lab, tmp_path: Path, models_dir: Path, inputs_dir: Path, cache_dir: Path
):
    """Places found by their esp_check_type tag; one task per place; both released at the end."""
    the_lab = lab(["b1", "b2"])
    the_lab.make_place("pl-a", "b1")
    the_lab.make_place("pl-b", "b2")
    plan = write_plan(tmp_path / "plan.toml", models_dir, inputs_dir, ["op_zoo"], placement="each")
    proc = run_cli(the_lab, plan, tmp_path / "out", cache_dir)
    err = finish(proc)
    assert proc.returncode == 0, err + the_lab.logs()
    doc = summary(tmp_path / "out")
    assert doc["simulated"] is True and doc["verdict"] == "match"
    assert sorted(t["board"] for t in doc["tasks"]) == ["pl-a", "pl-b"]
    assert {u["lock_key"] for u in doc["board_usage"]} == {"labgrid-pl-a", "labgrid-pl-b"}
    ports = {a["port"] for t in doc["tasks"] for a in t["attempts"]}
    assert ports == {f"rfc2217://127.0.0.1:{the_lab.sim_ports[b]}?ign_set_control" for b in ("b1", "b2")}
    assert "acquired place pl-a" in err and "acquired place pl-b" in err
    for place in ("pl-a", "pl-b"):
        assert_released(the_lab, place)


def _overlaps(intervals: list[dict]) -> list[tuple[dict, dict]]:
    bad = []
    items = sorted(intervals, key=lambda u: u["start"])
    for a, b in itertools.pairwise(items):
        if b["start"] < a["end"]:
            bad.append((a, b))
    return bad


def test_two_runners_contending_for_one_place_never_overlap(
    lab, tmp_path: Path, models_dir: Path, inputs_dir: Path, cache_dir: Path
):
    """Two runner processes (same host, same user) and one place: labgrid serializes them."""
    the_lab = lab(["shared"])
    the_lab.make_place("only", "shared")
    plan = write_plan(tmp_path / "plan.toml", models_dir, inputs_dir, ["op_zoo", "cnn_classifier_11"],
                      placement="any")  # fmt: skip
    inv = tmp_path / "bench.toml"  # the coordinator named in the inventory this time
    inv.write_text(
        f'[labgrid]\ncoordinator = "{the_lab.coordinator}"\n\n'
        '[[board]]\nname = "b"\ntype = "sim"\nplace = "only"\n'
    )
    procs = [run_cli(the_lab, plan, tmp_path / f"out{i}", cache_dir, inventory=inv) for i in (1, 2)]
    errs = [finish(p) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(errs) + the_lab.logs()
    usage = summary(tmp_path / "out1")["board_usage"] + summary(tmp_path / "out2")["board_usage"]
    assert len(usage) == 4 and len({u["pid"] for u in usage}) == 2
    assert {u["lock_key"] for u in usage} == {"labgrid-only"}
    assert all(u["end"] > u["start"] for u in usage)
    assert _overlaps(usage) == []
    waits = [
        a["lock_wait_s"]
        for n in (1, 2)
        for t in summary(tmp_path / f"out{n}")["tasks"]
        for a in t["attempts"]
    ]
    assert max(waits) > 1.0  # they did contend: one waited for the other
    assert "released a stale" not in "".join(
        errs
    )  # a live runner's acquisition is never taken for a stale one
    assert_released(the_lab, "only")


def test_kill_9_leaves_a_stale_acquisition_that_the_next_run_releases(
    lab, tmp_path: Path, models_dir: Path, inputs_dir: Path, cache_dir: Path
):
    the_lab = lab(["k1"])
    the_lab.make_place("victim", "k1")
    plan = write_plan(tmp_path / "plan.toml", models_dir, inputs_dir, ["op_zoo"], placement="any")
    killed = run_cli(the_lab, plan, tmp_path / "out1", cache_dir)
    assert killed.stderr is not None
    seen = []
    for line in killed.stderr:
        seen.append(line)
        if "acquired place victim" in line:
            killed.send_signal(signal.SIGKILL)
            break
    killed.communicate(timeout=60)
    assert killed.returncode == -signal.SIGKILL, "".join(seen) + the_lab.logs()
    shown = the_lab.show("victim")
    assert "acquired: None" not in shown and f"esp_check={killed.pid}_" in shown, (
        shown
    )  # labgrid never expires it
    rerun = run_cli(the_lab, plan, tmp_path / "out2", cache_dir, "--lock-timeout", "60")
    err = finish(rerun)
    assert rerun.returncode == 0, err + the_lab.logs()
    assert f"released a stale acquisition by esp-check pid {killed.pid}" in err
    assert err.count("released a stale acquisition") == 1, err  # said once, as the run's event
    events = summary(tmp_path / "out2")["events"]
    assert [e["kind"] for e in events] == ["stale-released"] and str(killed.pid) in events[0]["message"]
    assert_released(the_lab, "victim")


def test_a_place_acquired_by_hand_by_the_same_user_is_not_taken_for_stale(
    lab, tmp_path: Path, models_dir: Path, inputs_dir: Path, cache_dir: Path
):
    the_lab = lab(["h1"])
    the_lab.make_place("manual", "h1")
    the_lab.client("acquire", place="manual")  # this user, by hand, no esp-check tag
    plan = write_plan(tmp_path / "plan.toml", models_dir, inputs_dir, ["op_zoo"], placement="any")
    # the wait clock starts once the place is seen held (by the person): 1 s of it is enough
    proc = run_cli(the_lab, plan, tmp_path / "out", cache_dir, "--lock-timeout", "1")
    err = finish(proc)
    assert proc.returncode == 3, err
    assert "released a stale" not in err
    assert "acquired: None" not in the_lab.show("manual")  # still the person's
    assert "release --kick" in summary(tmp_path / "out")["boards"][0]["reason"]


def test_a_place_held_by_another_user_is_skipped_after_the_timeout_then_waited_for(
    lab, tmp_path: Path, models_dir: Path, inputs_dir: Path, cache_dir: Path
):
    the_lab = lab(["o1"])
    the_lab.make_place("theirs", "o1")
    the_lab.client("acquire", place="theirs", user="alice")
    plan = write_plan(tmp_path / "plan.toml", models_dir, inputs_dir, ["op_zoo"], placement="any")
    # 1. a short timeout: skipped, saying who holds it (said when the place is first seen held, which is
    #    also when the wait clock starts: 1 s of waiting is enough)
    proc = run_cli(the_lab, plan, tmp_path / "out1", cache_dir, "--lock-timeout", "1")
    err = finish(proc)
    assert proc.returncode == 3, err
    assert "waiting for labgrid place theirs: acquired by" in err and "/alice" in err
    board = summary(tmp_path / "out1")["boards"][0]
    assert board["status"] == "busy" and "/alice" in board["reason"] and "release --kick" in board["reason"]
    assert "theirs" not in the_lab.client("reservations")  # our waiting reservation was cancelled
    # 2. alice releases once the runner says it is waiting for her place (not after a fixed delay,
    #    which raced the runner's start-up under load): we get the place
    proc = run_cli(the_lab, plan, tmp_path / "out2", cache_dir, "--lock-timeout", "120")
    seen = lines_until(proc, "waiting for labgrid place theirs")
    said_waiting = time.monotonic()
    the_lab.client("release", place="theirs", user="alice")
    held_after_waiting = time.monotonic() - said_waiting
    err = finish(proc, seen)
    assert proc.returncode == 0, err + the_lab.logs()
    assert "waiting for labgrid place theirs: acquired by" in "".join(seen) and "/alice" in err
    waited = summary(tmp_path / "out2")["tasks"][0]["attempts"][0]["lock_wait_s"]
    assert waited >= held_after_waiting  # the recorded wait spans the time alice still held the place
    assert_released(the_lab, "theirs")


def test_sigterm_twice_releases_the_place_it_holds(
    lab, tmp_path: Path, models_dir: Path, inputs_dir: Path, cache_dir: Path
):
    """Two signals abandon the running attempt: the place is still released before the process exits."""
    the_lab = lab(["t1"])
    the_lab.make_place("term", "t1")
    plan = write_plan(tmp_path / "plan.toml", models_dir, inputs_dir, ["op_zoo"], placement="any")
    proc = run_cli(the_lab, plan, tmp_path / "out", cache_dir)
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "acquired place term" in line:
            proc.send_signal(signal.SIGTERM)
        elif "SIGTERM: abandoning running attempts" in line:  # the first one is taken: now the second
            proc.send_signal(signal.SIGTERM)
            break
    err = finish(proc, seen, timeout=120)
    assert proc.returncode == 3, err
    done = summary(tmp_path / "out")
    assert done["interrupted"] is True
    # released by the run's last step (it says so), or by the abandoned attempt's own release before it
    # (its board usage recorded); either way the place is free once the process is gone
    assert "releasing place term" in err or [u["task"] for u in done["board_usage"]], err
    assert_released(the_lab, "term")


def test_a_failing_place_is_power_cycled_through_labgrid(
    lab, tmp_path: Path, models_dir: Path, inputs_dir: Path, cache_dir: Path
):
    """quarantine_after reached: labgrid's NetworkPowerDriver switches the place's outlet off, then on."""
    the_lab = lab(["p1"], {"p1": ["--fault", "disconnect"]})
    the_lab.make_place("flaky", "p1")
    # the disconnected board goes silent: 3 s of silence (not 10) ends each capture
    plan = write_plan(tmp_path / "plan.toml", models_dir, inputs_dir, ["op_zoo"], placement="any",
                      retries=1, quarantine_after=1, silence=3)  # fmt: skip
    inv = tmp_path / "bench.toml"  # an inventory naming the place; --labgrid gives the coordinator
    inv.write_text('[[board]]\nname = "flaky-board"\ntype = "sim"\nplace = "flaky"\n')
    proc = run_cli(
        the_lab, plan, tmp_path / "out", cache_dir, "--labgrid", the_lab.coordinator, inventory=inv
    )
    err = finish(proc)
    assert proc.returncode == 3, err
    doc = summary(tmp_path / "out")
    cycles = [e for e in doc["events"] if e["kind"] == "power-cycle"]
    assert len(cycles) == 1 and cycles[0]["message"].startswith("ok"), doc["events"]
    assert the_lab.power is not None and the_lab.power.calls == [(0, "0"), (0, "1")]
    assert doc["boards"][0]["status"] == "quarantined"
    assert_released(the_lab, "flaky")


def test_the_pytest_plugin_holds_a_labgrid_place_for_the_session(
    lab, pytester: pytest.Pytester, models_dir: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    """--esp-check-labgrid/--esp-check-place: the board fixture reserves, acquires and finally releases."""
    the_lab = lab(["pt1"])
    the_lab.make_place("plugin-place", "pt1")
    monkeypatch.setenv("ESP_CHECK_CACHE_DIR", str(cache_dir))
    pytester.makepyfile(
        test_plugin_on_place=f"""
        import subprocess
        MODEL = {str(models_dir / "op_zoo.tflite")!r}
        INPUT = {str(models_dir / "inputs" / "op_zoo.npy")!r}

        def test_on_the_place(esp_check_board, flash_and_compare):
            assert esp_check_board.source == "labgrid place plugin-place" and esp_check_board.simulated
            assert esp_check_board.port.startswith("rfc2217://127.0.0.1:")
            result = flash_and_compare(MODEL, [INPUT])
            assert result.verdict == "match", result.errors
        """
    )
    res = pytester.runpytest(
        "--esp-check-labgrid", the_lab.coordinator, "--esp-check-place", "plugin-place",
        "--junitxml=out.xml", "-p", "no:cacheprovider", "-p", "no:labgrid", "-p", "no:pytest_embedded",
    )  # fmt: skip
    res.assert_outcomes(passed=1)
    assert "esp_check_verdict" in (pytester.path / "out.xml").read_text()
    assert_released(the_lab, "plugin-place")


def test_an_unknown_place_or_a_dead_coordinator_is_said_at_once(lab, tmp_path: Path):
    from harness.device.labgrid import LabgridClient, PlaceLease
    from harness.errors import ExitCode, LabgridError

    the_lab = lab(["u1"])
    t0 = time.monotonic()
    with pytest.raises(LabgridError, match="place pattern nope matches nothing") as err:
        PlaceLease(LabgridClient(the_lab.coordinator), "nope").acquire(60)
    assert err.value.exit_code == ExitCode.INFRASTRUCTURE
    with pytest.raises(LabgridError, match="Could not connect to coordinator"):
        PlaceLease(LabgridClient("127.0.0.1:1"), "x").acquire(60)
    assert time.monotonic() - t0 < 20  # not after the 60 s wait
    assert "nope" not in the_lab.client("reservations")


def test_lock_timeout_0_takes_a_free_place_and_skips_a_held_one(lab):
    """0 s of waiting: labgrid-client's own start-up does not count, so a free place is taken; a
    place another user holds is skipped, named with its holder, its waiting reservation cancelled."""
    from harness.device.labgrid import LabgridClient, PlaceLease
    from harness.errors import BoardBusyError

    the_lab = lab(["z1", "z2"])
    the_lab.make_place("free", "z1")
    the_lab.make_place("held", "z2")
    the_lab.client("acquire", place="held", user="alice")
    client = LabgridClient(the_lab.coordinator)
    lease = PlaceLease(client, "free")
    lease.acquire(0)
    try:
        assert lease.is_locked and lease.url is not None and lease.url.startswith("rfc2217://127.0.0.1:")
    finally:
        lease.release()
    assert_released(the_lab, "free")
    busy = PlaceLease(client, "held")
    with pytest.raises(BoardBusyError) as err:
        busy.acquire(0)
    busy.release()  # waits for the reservation's cancellation, which runs in the background
    assert "/alice" in err.value.message and "release --kick" in err.value.message, err.value.message
    assert "held" not in the_lab.client("reservations")
