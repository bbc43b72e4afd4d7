"""Plan and inventory validation, board lock keys and locks, ``bench detect``, the ``run`` CLI.

Nothing here flashes a board except the CLI test at the end (one simulated board, harness.sim).
Faked in ``bench detect``: pyserial's ``comports()`` (the attached USB devices), the outermost edge.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from serial.tools.list_ports_common import ListPortInfo
from sim_helpers import HANG_S

from harness.cli import main
from harness.device.locks import BoardLock, board_lock, lock_key
from harness.device.ports import CAPS, PortCandidate, PortSpec, Transport
from harness.errors import BoardBusyError, ExitCode, PlanError
from harness.runner import load_inventory, load_plan
from harness.runner.inventory import detect_devices, inventory_snippet
from tests.junit_shape import assert_junit_shape

ROOT = Path(__file__).resolve().parents[1]


def plan_text(models_dir: Path, body: str = "", **job: str) -> str:
    fields = {
        "name": '"j1"',
        "models": f'["{models_dir}/op_zoo.tflite"]',
        "inputs": f'["{models_dir}/inputs/{{model}}.npy"]',
        "boards": '["sim"]',
    }
    fields.update(job)
    lines = [f"{k} = {v}" for k, v in fields.items() if v is not None]
    return body + "\n[[job]]\n" + "\n".join(lines) + "\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


# ---- plan --------------------------------------------------------------------------------------


def test_plan_defaults_globs_and_model_placeholder(tmp_path: Path, models_dir: Path):
    text = plan_text(
        models_dir,
        '[defaults]\ntolerance_lsb = 1\ncomparisons = ["optimized-vs-ansi"]\n',
        models=f'["{models_dir}/cnn_*.tflite", "{models_dir}/op_zoo.tflite"]',
        inputs=f'["{models_dir}/inputs/{{model}}*.npy"]',
        ref_tolerance_lsb="2",
    )
    plan = load_plan(write(tmp_path, "p.toml", text))
    job = plan.jobs[0]
    assert [c.name for c in job.cases] == ["cnn_classifier_11", "op_zoo"]
    cnn = job.cases[0]
    # {model}*.npy: the plain, ambiguous and .q variants of the cnn inputs, none of op_zoo's
    assert {p.name for p in cnn.inputs} == {
        "cnn_classifier_11.npy",
        "cnn_classifier_11.q.npy",
        "cnn_classifier_11__ambiguous.npy",
        "cnn_classifier_11__ambiguous.q.npy",
    }
    assert job.tolerance_lsb == 1 and job.ref_tolerance_lsb == 2
    assert job.pairs == (("optimized", "ansi"),) and not job.needs_reference
    assert job.retries == 2 and job.placement == "any"


@pytest.mark.parametrize(
    ("job", "body", "field"),
    [
        ({"tolerance_lsb": "-1"}, "", "tolerance_lsb"),
        ({"comparisons": '["optimized-vs-gpu"]'}, "", "comparisons"),
        ({"boards": '["no-such-board"]'}, "", "boards"),
        ({"inputs": '["nothing-*.png"]'}, "", "inputs"),
        ({"models": '["missing.tflite"]'}, "", "models"),
        ({"timeouts": "{ capture_total = 0 }"}, "", "timeouts.capture_total"),
        ({"timeouts": "{ flash = 3 }"}, "", "timeouts.flash"),
        ({"placement": '"random"'}, "", "placement"),
        ({"retries": "-1"}, "", "retries"),
        ({"colour": '"red"'}, "", "colour"),
        ({"input_options": '{ resize = "squash" }'}, "", "input_options"),
        ({"name": '"bad name!"'}, "", "name"),
        ({"name": '"j1\\n"'}, "", "name"),  # pydantic-core's `$` is the end of the text (Python's is not)
        ({}, "[run]\nquarantine_after = 0\n", "quarantine_after"),
    ],
)
def test_plan_errors_name_file_job_and_field(
    tmp_path: Path, models_dir: Path, job: dict, body: str, field: str
):
    p = write(tmp_path, "plan.toml", plan_text(models_dir, body, **job))
    with pytest.raises(PlanError) as err:
        load_plan(p)
    msg = err.value.message
    assert str(p) in msg and f"field '{field}'" in msg
    if field not in ("quarantine_after", "name"):
        assert "job 'j1'" in msg
    assert err.value.exit_code == ExitCode.USAGE


def test_plan_input_that_does_not_fit_the_model_is_a_plan_error(tmp_path: Path, models_dir: Path):
    text = plan_text(models_dir, inputs=f'["{models_dir}/inputs/cnn_classifier_11.npy"]')
    with pytest.raises(PlanError, match=r"field 'inputs'.*cnn_classifier_11.npy does not fit op_zoo"):
        load_plan(write(tmp_path, "plan.toml", text))


def test_plan_duplicate_job_names_and_bad_toml(tmp_path: Path, models_dir: Path):
    twice = plan_text(models_dir) + plan_text(models_dir)
    with pytest.raises(PlanError, match="must be unique"):
        load_plan(write(tmp_path, "a.toml", twice))
    with pytest.raises(PlanError, match="not valid TOML"):
        load_plan(write(tmp_path, "b.toml", "[[job]\n"))
    with pytest.raises(PlanError, match="at least one"):
        load_plan(write(tmp_path, "c.toml", "[defaults]\nretries = 1\n"))


def test_example_plan_and_inventory_in_docs_are_valid():
    plan = load_plan(ROOT / "docs" / "examples" / "plan.toml", check_files=False)
    assert plan.jobs and all(j.boards for j in plan.jobs)
    inv = load_inventory(ROOT / "docs" / "examples" / "bench.toml")
    assert len(inv.boards) >= 3
    assert any(b.port and b.port.startswith("rfc2217://") for b in inv.boards)
    assert any(b.power_cycle for b in inv.boards)
    assert any(b.usb_serial for b in inv.boards)
    sim_plan = load_plan(ROOT / "docs" / "examples" / "plan-sim.toml")
    sim_bench = load_inventory(ROOT / "docs" / "examples" / "bench-sim.toml")
    assert {b.board.name for b in sim_bench.boards} == set(sim_plan.jobs[0].boards)


# ---- inventory ---------------------------------------------------------------------------------


def test_inventory_console_override_and_reach(tmp_path: Path):
    inv = load_inventory(
        write(
            tmp_path,
            "bench.toml",
            """
            [[board]]
            name = "s3-jtag"
            type = "esp32s3-devkitc-1-n8"
            console = "usb_serial_jtag"
            usb_serial = "F4:12:FA:00:11:22"
            power_cycle = ["uhubctl", "-l", "1-1", "-p", "2", "-a", "cycle"]

            [[board]]
            name = "remote"
            type = "esp32-devkitc"
            port = "rfc2217://lab-pi:4000"
            """,
        )
    )
    s3, remote = inv.boards
    assert s3.board.console == "usb_serial_jtag" and s3.board.reset == "usb_serial_jtag"
    assert s3.power_cycle[0] == "uhubctl" and s3.usb_serial == "F4:12:FA:00:11:22"
    assert remote.board.console == "uart" and remote.port == "rfc2217://lab-pi:4000"


@pytest.mark.parametrize(
    ("board", "field"),
    [
        ('name = "x"\ntype = "esp32-devkitc"\nconsole = "usb_serial_jtag"\nport = "/dev/ttyUSB0"', "console"),
        ('name = "x"\ntype = "esp32-devkitc"', "port"),
        ('name = "x"\ntype = "esp32-devkitc"\nport = "/dev/ttyUSB0"\nusb_serial = "1"', "port"),
        ('name = "x"\ntype = "esp32-devkitc"\nport = "auto"', "port"),
        ('name = "x"\ntype = "esp32-devkitc"\nport = "telnet://h:1"', "port"),
        ('name = "x"\ntype = "esp32-devkitc"\nport = "sim://x"', "port"),
        ('name = "x"\ntype = "sim"\nport = "/dev/ttyUSB0"', "port"),
        ('name = "x"\ntype = "nope"\nport = "/dev/ttyUSB0"', "type"),
        (
            'name = "x"\ntype = "esp32-devkitc"\nport = "/dev/ttyUSB0"\npower_cycle = "uhubctl -a cycle"',
            "power_cycle",
        ),
        ('name = "x"\ntype = "esp32-devkitc"\nport = "/dev/ttyUSB0"\nspeed = 3', "speed"),
    ],
)
def test_inventory_errors_name_file_board_and_field(tmp_path: Path, board: str, field: str):
    p = write(tmp_path, "bench.toml", "[[board]]\n" + board + "\n")
    with pytest.raises(PlanError) as err:
        load_inventory(p)
    assert str(p) in err.value.message and "board 'x'" in err.value.message
    assert f"field '{field}'" in err.value.message


def test_inventory_same_port_twice_is_an_error(tmp_path: Path):
    text = '[[board]]\nname = "a"\ntype = "sim"\nport = "sim://same"\n' * 1
    text += '[[board]]\nname = "b"\ntype = "sim"\nport = "sim://same"\n'
    with pytest.raises(PlanError, match="also used by board 'a'"):
        load_inventory(write(tmp_path, "bench.toml", text))


def test_power_cycle_runs_argv_without_a_shell(tmp_path: Path):
    marker = tmp_path / "cycled"
    text = f"""
        [[board]]
        name = "a"
        type = "sim"
        port = "sim://pc"
        power_cycle = ["{sys.executable}", "-c",
                       "import pathlib,sys; pathlib.Path(sys.argv[1]).write_text('x')", "{marker}"]
    """
    board = load_inventory(write(tmp_path, "bench.toml", text)).boards[0]
    ok, _ = board.run_power_cycle()
    assert ok and marker.read_text() == "x"


# ---- lock keys and locks -----------------------------------------------------------------------


def _usb_spec(path: str, serial: str) -> PortSpec:
    cand = PortCandidate(path, path, 0x303A, 0x1001, serial, "1-1.2", "USB JTAG", "Espressif USB-Serial-JTAG")
    return PortSpec(path, path, Transport.DEVICE, CAPS[Transport.DEVICE], usb=cand)


def test_lock_key_follows_the_board_not_the_dev_path():
    # a USB-Serial-JTAG board re-enumerates under another name: same key
    assert lock_key(_usb_spec("/dev/ttyACM0", "F4:12")) == lock_key(_usb_spec("/dev/ttyACM1", "F4:12"))
    assert lock_key(_usb_spec("/dev/ttyACM0", "F4:12")) != lock_key(_usb_spec("/dev/ttyACM0", "F4:13"))
    # one remote server, one key, whichever scheme or spelling of the local host
    assert lock_key("rfc2217://localhost:4000?ign_set_control") == lock_key("socket://127.0.0.1:4000")
    assert lock_key("rfc2217://127.0.0.1:4000") != lock_key("rfc2217://127.0.0.1:4001")
    assert lock_key("sim://bench1?chip=esp32") == lock_key("sim://bench1") == "sim-bench1"


def test_lock_is_exclusive_across_processes_and_names_its_holder(tmp_path: Path):
    key = f"sim-{uuid.uuid4().hex[:6]}"
    script = (
        "import sys,time; from harness.device.locks import BoardLock;"
        f"lk=BoardLock({key!r}, {str(tmp_path)!r}, owner='nightly CI'); lk.acquire(5);"
        "print('held', flush=True); sys.stdin.readline(); lk.release()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        waits: list[str] = []
        mine = BoardLock(key, tmp_path)
        with pytest.raises(BoardBusyError) as err:
            mine.acquire(0.3, on_wait=waits.append)
        assert "nightly CI" in err.value.message and f"pid {proc.pid}" in err.value.message
        assert waits and "nightly CI" in waits[0]
    finally:
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.wait(timeout=HANG_S)
    with board_lock(f"sim://{key[4:]}", lock_dir=tmp_path, timeout=1) as lk:  # free again
        assert lk.is_locked and lk.holder() is not None
    assert not (tmp_path / f"{key}.owner.json").exists()


def test_a_lock_whose_owner_file_cannot_be_written_leaves_no_temp_file(tmp_path: Path, monkeypatch) -> None:
    """A full disk while the owner file is written: the lock is still held (the file only names its
    holder), and the half-written temp file is removed. Faked: ``os.replace``, the disk's refusal."""

    def refuse(*_args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.replace", refuse)
    lock = BoardLock("sim-full-disk", tmp_path)
    lock.acquire(1)
    try:
        assert lock.is_locked
        assert sorted(p.name for p in tmp_path.iterdir()) == ["sim-full-disk.lock"]
    finally:
        lock.release()


# ---- bench detect ------------------------------------------------------------------------------


def _port(device: str, vid: int, pid: int, serial: str, location: str) -> ListPortInfo:
    info = ListPortInfo(device, skip_link_detection=True)
    info.vid, info.pid, info.serial_number, info.location = vid, pid, serial, location
    info.description = "USB device"
    return info


def test_bench_detect_lists_devices_and_prints_an_inventory_snippet(monkeypatch, capsys):
    import esp_pylib.serial_ports

    ports = [
        _port("/dev/ttyUSB7", 0x10C4, 0xEA60, "0001-ab", "1-1.1"),
        _port("/dev/ttyACM3", 0x303A, 0x1001, "F4:12:FA:00:11:22", "1-1.2"),
        _port("/dev/ttyS0", 0x1234, 0x5678, "", "pci"),
    ]
    # FAKED: the OS enumeration behind esptool's port list (esp_pylib.serial_ports), which esp-check uses
    monkeypatch.setattr(esp_pylib.serial_ports, "_comports", lambda: ports)
    monkeypatch.setattr(esp_pylib.serial_ports.sys, "platform", "linux")
    devices = detect_devices()
    # esptool's order: Espressif's own USB device first, then the known bridge names, then the rest
    assert [d.to_dict()["vid_pid"] for d in devices] == ["303A:1001", "10C4:EA60", "1234:5678"]
    known = detect_devices(only_known=True)
    assert [d.device for d in known] == ["/dev/ttyACM3", "/dev/ttyUSB7"]
    snippet = inventory_snippet(known)
    assert 'usb_serial = "F4:12:FA:00:11:22"' in snippet and 'console = "usb_serial_jtag"' in snippet
    assert main(["bench", "detect", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [d["serial_number"] for d in doc] == ["F4:12:FA:00:11:22", "0001-ab"]


def test_bench_detect_json_keys_order_and_values_are_pinned(monkeypatch, capsys):
    """`bench detect --json` is read by scripts: its keys, their order and values stay as documented."""
    import esp_pylib.serial_ports

    ports = [_port("/dev/ttyACM3", 0x303A, 0x1001, "F4:12:FA:00:11:22", "1-1.2")]
    # FAKED: the OS enumeration behind esptool's port list (esp_pylib.serial_ports), which esp-check uses
    monkeypatch.setattr(esp_pylib.serial_ports, "_comports", lambda: ports)
    monkeypatch.setattr(esp_pylib.serial_ports.sys, "platform", "linux")
    assert main(["bench", "detect", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [list(d.items()) for d in doc] == [
        [
            ("device", "/dev/ttyACM3"),
            ("kernel_device", "/dev/ttyACM3"),
            ("serial_number", "F4:12:FA:00:11:22"),
            ("location", "1-1.2"),
            ("description", "USB device"),
            ("kind", "Espressif USB-Serial-JTAG"),
            ("chip", None),
            ("chip_note", None),
            ("vid_pid", "303A:1001"),
        ]
    ]


def test_bench_detect_snippet_is_a_loadable_inventory(tmp_path: Path):
    from harness.runner.inventory import DetectedDevice

    devs = [
        DetectedDevice(
            "/dev/serial/by-id/usb-X",
            "/dev/ttyUSB0",
            0x10C4,
            0xEA60,
            "s1",
            "1-1",
            "d",
            "CP210x",
            chip="esp32s3",
        )
    ]
    p = tmp_path / "bench.toml"
    p.write_text(inventory_snippet(devs))
    inv = load_inventory(p)
    assert inv.boards[0].board.chip == "esp32s3" and inv.boards[0].port == "/dev/serial/by-id/usb-X"


# ---- the run command ---------------------------------------------------------------------------


def test_run_cli_validates_up_front(tmp_path: Path, models_dir: Path, capsys):
    plan = write(tmp_path, "plan.toml", plan_text(models_dir, boards='["sim-usbjtag"]'))
    inv = write(tmp_path, "bench.toml", '[[board]]\nname = "a"\ntype = "sim"\nport = "sim://v"\n')
    # the job wants a board type the bench does not have: usage error before anything runs
    assert main(["run", str(plan), "-i", str(inv), "--out", str(tmp_path / "o")]) == ExitCode.USAGE
    assert "no board of that type" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    ok_plan = write(tmp_path, "ok.toml", plan_text(models_dir))
    assert main(["run", str(ok_plan), "-i", str(inv), "--validate-only"]) == ExitCode.MATCH
    assert "j1/op_zoo/sim" in capsys.readouterr().out


@pytest.mark.needs_tflm
def test_run_cli_writes_reports_and_the_step_summary(tmp_path: Path, models_dir: Path, monkeypatch):
    pytest.importorskip("tflite_micro")
    step = tmp_path / "step.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    plan = write(
        tmp_path, "plan.toml", plan_text(models_dir, timeouts="{ capture_total = 30, capture_silence = 3 }")
    )
    inv = write(
        tmp_path,
        "bench.toml",
        f'[[board]]\nname = "a"\ntype = "sim"\nport = "sim://cli-{uuid.uuid4().hex[:6]}"\n',
    )
    junit = tmp_path / "r.xml"
    code = main(
        [
            "run",
            str(plan),
            "-i",
            str(inv),
            "--out",
            str(tmp_path / "o"),
            "--junit",
            str(junit),
            "--lock-dir",
            str(tmp_path / "locks"),
        ]
    )
    assert code == ExitCode.MATCH
    doc = json.loads((tmp_path / "o" / "summary.json").read_text())
    import jsonschema

    jsonschema.Draft202012Validator.check_schema(
        json.loads((ROOT / "docs" / "run-summary-schema.json").read_text())
    )
    jsonschema.validate(doc, json.loads((ROOT / "docs" / "run-summary-schema.json").read_text()))
    assert doc["schema"] == "esp-check/run-summary" and doc["counts"]["passed"] == 3
    assert junit.read_text().count("<testcase ") == 3
    root = ET.parse(junit).getroot()
    assert_junit_shape(root)  # the old run writer left `skipped` off the root
    cases = [(c.get("classname"), c.get("name")) for c in root.iter("testcase")]
    assert {cls for cls, _ in cases} == {"esp-check.j1.op_zoo.a"}  # esp-check.<job>.<model>.<board>
    assert all(re.fullmatch(r"input0\[[^]]+\]\.\w+_vs_\w+", name or "") for _, name in cases), cases
    assert "esp-check run" in step.read_text() and "| 3 | 3 | 0 | 0 |" in step.read_text()


def test_usb_boards_are_found_by_serial_number_or_location(tmp_path: Path, monkeypatch):
    import esp_pylib.serial_ports

    ports = [
        _port("/dev/ttyUSB7", 0x10C4, 0xEA60, "0001-ab", "1-1.1:1.0"),
        _port("/dev/ttyACM3", 0x303A, 0x1001, "F4:12:FA:00:11:22", "1-1.2:1.0"),
    ]
    # FAKED: the OS enumeration behind esptool's port list (esp_pylib.serial_ports), which esp-check uses
    monkeypatch.setattr(esp_pylib.serial_ports, "_comports", lambda: ports)
    inv = load_inventory(
        write(
            tmp_path,
            "bench.toml",
            """
            [[board]]
            name = "jtag"
            type = "esp32s3-devkitc-1-n8"
            console = "usb_serial_jtag"
            usb_serial = "F4:12:FA:00:11:22"

            [[board]]
            name = "uart"
            type = "esp32-devkitc"
            usb_location = "1-1.1"

            [[board]]
            name = "gone"
            type = "esp32-devkitc"
            usb_serial = "not-plugged-in"
            """,
        )
    )
    jtag, uart, gone = inv.boards
    ps = jtag.resolve()
    assert ps.url == "/dev/ttyACM3" and lock_key(ps) == "usb-sn-F4_12_FA_00_11_22"
    # the same board after re-enumerating as ttyACM4: same lock
    ports[1] = _port("/dev/ttyACM4", 0x303A, 0x1001, "F4:12:FA:00:11:22", "1-1.2:1.0")
    assert jtag.resolve().url == "/dev/ttyACM4" and lock_key(jtag.resolve()) == lock_key(ps)
    assert uart.resolve().url == "/dev/ttyUSB7"
    from harness.errors import PortError

    with pytest.raises(PortError, match="0 serial devices have USB serial number not-plugged-in"):
        gone.resolve()


@pytest.mark.parametrize("reach", ['usb_serial = "F4:12:FA:00:11:22"', 'usb_location = "1-1.2"'])
def test_one_usb_board_by_port_and_by_usb_is_refused(tmp_path: Path, monkeypatch, reach: str):
    """One board as `port = "/dev/ttyACM3"` and as its USB serial number or location was two bench
    boards, so two workers could take it (both resolve to lock usb-sn-...): the inventory refuses it,
    naming the file and both entries."""
    import esp_pylib.serial_ports

    ports = [_port("/dev/ttyACM3", 0x303A, 0x1001, "F4:12:FA:00:11:22", "1-1.2:1.0")]
    # FAKED: the OS enumeration behind esptool's port list (esp_pylib.serial_ports), which esp-check uses
    monkeypatch.setattr(esp_pylib.serial_ports, "_comports", lambda: ports)
    board = 'type = "esp32s3-devkitc-1-n8"\nconsole = "usb_serial_jtag"'
    text = (
        f'[[board]]\nname = "a"\n{board}\nport = "/dev/ttyACM3"\n\n[[board]]\nname = "b"\n{board}\n{reach}\n'
    )
    inv = write(tmp_path, "bench.toml", text)
    with pytest.raises(PlanError) as err:
        load_inventory(inv)
    assert str(inv) in err.value.message and "board 'b'" in err.value.message, err.value.message
    assert (
        "is also used by board 'a'" in err.value.message and "usb-sn-F4_12_FA_00_11_22" in err.value.message
    )


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        # --json is a flag now: wherever it stands, the PLAN stays the PLAN
        (["p.toml", "-i", "b.toml", "--json"], ["p.toml", "-i", "b.toml", "--json"]),
        (["--json", "p.toml", "-i", "b.toml"], ["--json", "p.toml", "-i", "b.toml"]),
        (
            ["p.toml", "--json", "--out", "o", "-i", "b.toml"],
            ["p.toml", "--json", "--out", "o", "-i", "b.toml"],
        ),
        # the old form `--json PATH` (deprecated) becomes the hidden --json-file PATH
        (["p.toml", "-i", "b.toml", "--json", "s.json"], ["p.toml", "-i", "b.toml", "--json-file", "s.json"]),
        (["--json", "s.json", "p.toml", "-i", "b.toml"], ["--json-file", "s.json", "p.toml", "-i", "b.toml"]),
        (["p.toml", "--json=s.json", "-i", "b.toml"], ["p.toml", "--json-file", "s.json", "-i", "b.toml"]),
        (
            ["-i", "b.toml", "--out", "o", "--json", "s.json", "p.toml"],
            ["-i", "b.toml", "--out", "o", "--json-file", "s.json", "p.toml"],
        ),
    ],
)
def test_run_json_is_a_flag_and_the_old_path_form_is_recognised(argv: list[str], expected: list[str]):
    from harness.commands.runner_cmds import legacy_json_args, run_cmd

    assert legacy_json_args(run_cmd, argv) == expected


@pytest.mark.slow
@pytest.mark.needs_tflm
def test_run_json_flag_prints_the_summary_and_old_forms_still_work(tmp_path: Path, models_dir: Path, capsys):
    """``--json`` prints the summary (v2) on stdout; ``--json PATH`` and ``--schema-version 1`` warn."""
    pytest.importorskip("tflite_micro")
    plan = write(
        tmp_path, "plan.toml", plan_text(models_dir, timeouts="{ capture_total = 30, capture_silence = 3 }")
    )
    inv = write(
        tmp_path,
        "bench.toml",
        f'[[board]]\nname = "a"\ntype = "sim"\nport = "sim://j-{uuid.uuid4().hex[:6]}"\n',
    )
    base = ["run", str(plan), "-i", str(inv), "--lock-dir", str(tmp_path / "locks"), "--no-step-summary"]
    schema = json.loads((ROOT / "docs" / "run-summary-schema.json").read_text())
    import jsonschema

    assert main([*base, "--out", str(tmp_path / "o1"), "--json"]) == ExitCode.MATCH
    out = capsys.readouterr()
    doc = json.loads(out.out)  # stdout holds the JSON document and nothing else
    jsonschema.validate(doc, schema)
    assert doc["schema_version"] == 2 and doc == json.loads((tmp_path / "o1" / "summary.json").read_text())
    assert "deprecated" not in out.err
    # the old form: --json PATH writes the summary there, with a deprecation warning
    legacy = tmp_path / "s.json"
    assert main([*base, "--out", str(tmp_path / "o2"), "--json", str(legacy)]) == ExitCode.MATCH
    out = capsys.readouterr()
    assert out.out == "" and "warning: `run --json PATH` is deprecated" in out.err
    assert json.loads(legacy.read_text())["verdict"] == "match"
    # --schema-version 1: every JSON summary in the old form, one warning
    assert main([*base, "--out", str(tmp_path / "o3"), "--json", "--schema-version", "1"]) == ExitCode.MATCH
    out = capsys.readouterr()
    v1 = json.loads(out.out)
    jsonschema.validate(
        v1, json.loads((ROOT / "tests" / "data" / "schemas" / "run-summary-v1.json").read_text())
    )
    assert v1["schema_version"] == 1 and "state" not in v1["tasks"][0]
    assert out.err.count("schema_version 1 is deprecated") == 1
    results = list((tmp_path / "o3" / "jobs").rglob("result.json"))
    assert results and all(json.loads(r.read_text())["schema_version"] == 1 for r in results)
    # a version that does not exist is refused before anything runs
    assert main([*base, "--out", str(tmp_path / "o4"), "--schema-version", "7"]) == ExitCode.USAGE
    assert "not available" in capsys.readouterr().err and not (tmp_path / "o4").exists()


def test_states_agree_between_code_schema_and_docs():
    """Every state the runner sets is in docs/run-summary-schema.json and docs/ci.md, and nothing else is."""
    from harness.runner.results import TASK_VERDICTS, BoardStatus, CaseStatus, CaseType, EventKind, TaskState

    schema = json.loads((ROOT / "docs" / "run-summary-schema.json").read_text())
    props, defs = schema["properties"], schema["$defs"]
    task = props["tasks"]["items"]["properties"]
    assert set(defs["verdict"]["enum"]) == {str(v) for v in TASK_VERDICTS}
    assert props["verdict"] == {"$ref": "#/$defs/verdict"} and task["verdict"] == {"$ref": "#/$defs/verdict"}
    assert set(task["state"]["enum"]) == {str(TaskState.DONE), str(TaskState.ABORTED)}
    assert set(props["boards"]["items"]["properties"]["status"]["enum"]) == {str(s) for s in BoardStatus}
    assert set(props["events"]["items"]["properties"]["kind"]["enum"]) == {str(k) for k in EventKind}
    case = defs["testcase"]["properties"]
    assert set(case["status"]["enum"]) == {str(s) for s in CaseStatus}
    assert set(case["type"]["enum"]) == {str(t) for t in CaseType}
    required = set(props["counts"]["required"])
    assert {str(v) for v in TASK_VERDICTS} | {"aborted"} <= required
    ci = (ROOT / "docs" / "ci.md").read_text()
    for value in [*BoardStatus, *TaskState, *EventKind, *CaseStatus, *CaseType, *TASK_VERDICTS]:
        assert f"`{value}`" in ci, value
    code = "".join(p.read_text() for p in (ROOT / "harness" / "runner").glob("*.py"))
    assert "unreachable" not in code  # a board state once named in a comment, never set


@pytest.mark.needs_tflm
def test_job_input_options_reach_the_host_reference_too(tmp_path: Path, models_dir: Path):
    """A job's ``input_options`` prepare the firmware's inputs and the host reference's alike.

    Faked: the board (harness.sim). With the reference on default options, its input hashes differ
    from the firmware's and the comparison is refused instead of made.
    """
    pytest.importorskip("tflite_micro")
    from harness.runner import RunOptions, run_plan

    plan = write(
        tmp_path,
        "plan.toml",
        plan_text(
            models_dir,
            models=f'["{models_dir}/cnn_classifier_11.tflite"]',
            inputs=f'["{models_dir}/inputs/cnn_classifier_11.png"]',
            input_options='{ value_range = "-1..1" }',
            timeouts="{ capture_total = 30, capture_silence = 3 }",
        ),
    )
    inv = write(
        tmp_path,
        "bench.toml",
        f'[[board]]\nname = "a"\ntype = "sim"\nport = "sim://io-{uuid.uuid4().hex[:6]}"\n',
    )
    result = run_plan(
        load_plan(plan), load_inventory(inv), RunOptions(out_dir=tmp_path / "o", lock_dir=tmp_path / "locks")
    )
    task = result.tasks[0]
    assert result.exit_code == ExitCode.MATCH, task.reason
    assert {c.comparison for c in task.decisive.testcases if c.status == "passed"} == {
        "optimized-vs-ansi",
        "optimized-vs-reference",
        "ansi-vs-reference",
    }


def test_a_model_espnn_does_not_touch_is_refused_before_the_run_unless_allowed(tmp_path: Path):
    """As flash-and-compare refuses it: a float model (no op ESP-NN accelerates on any chip) in a plan is a
    PlanError naming the job and the model before any build; ``allow_untested = true`` lets it run. Nothing
    is faked (the runner is only constructed: its tasks are checked when it is made)."""
    import numpy as np

    from harness.runner.executor import Runner, RunOptions
    from tests.test_model_builder import Op, T, build_model

    const = np.array([[0.5, -1.0, 2.0, 0.25]], dtype=np.float32)
    model = tmp_path / "float_add.tflite"
    model.write_bytes(
        build_model(
            [T("x", (1, 4), "float32"), T("c", (1, 4), "float32", data=const), T("y", (1, 4), "float32")],
            [Op(0, [0, 1], [2], add_options=True)],
            inputs=[0],
            outputs=[2],
        )
    )
    np.save(tmp_path / "x.npy", np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32))
    inv = tmp_path / "bench.toml"
    inv.write_text('[[board]]\nname = "b1"\ntype = "sim"\nport = "sim://untested-b1"\n')
    job = '[[job]]\nname = "floaty"\nmodels = ["float_add.tflite"]\ninputs = ["x.npy"]\nboards = ["sim"]\n'
    (tmp_path / "plan.toml").write_text(job)
    opts = RunOptions(out_dir=tmp_path / "out")
    with pytest.raises(PlanError, match=r"job 'floaty': ESP-NN accelerates none of the 1 ops") as err:
        Runner(load_plan(tmp_path / "plan.toml"), load_inventory(inv), opts)
    assert "allow_untested = true" in (err.value.hint or "")
    (tmp_path / "plan.toml").write_text(job + "allow_untested = true\n")
    runner = Runner(load_plan(tmp_path / "plan.toml"), load_inventory(inv), opts)
    assert [t.job.allow_untested for t in runner.tasks] == [True]


def test_a_task_left_without_a_verdict_or_exit_code_is_never_reported_as_a_match(tmp_path: Path):
    """A task that no attempt finished (no verdict, no exit code) was reported as "match" (its missing
    exit code read as 0). What is real: the docs' example plan's job and case; nothing ran."""
    from harness.runner.reports import _task_verdict
    from harness.runner.results import Task

    plan = load_plan(ROOT / "docs" / "examples" / "plan.toml", check_files=False)
    job = plan.jobs[0]
    task = Task(id="t0", job=job, case=job.cases[0], board_type="sim", pinned=None, dir=tmp_path)
    assert str(_task_verdict(task)) == "infrastructure_error"
    task.exit_code = int(ExitCode.MISMATCH)
    assert str(_task_verdict(task)) == "mismatch"
