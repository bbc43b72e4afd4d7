"""End-to-end ``flash-and-compare`` on the simulated board.

What is real here: the generated projects, the sim builder's ESP app image, esptool 5 (its Python API)
flashing over a pyserial port, the console capture, the protocol parser, the TFLM host reference and
the comparison. What is faked: the board itself (``sim://``, harness/sim), the outermost edge.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main
from harness.errors import ExitCode
from harness.flows.flash_and_compare import flash_and_compare
from harness.flows.job import JobOptions
from harness.flows.records import StageTimeouts
from harness.flows.targets import sim_port_for

pytest.importorskip("tflite_micro")

MODEL = "cnn_classifier_11.tflite"
INPUT = "inputs/cnn_classifier_11__ambiguous.png"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("build-cache")


def run(models_dir: Path, tmp_path: Path, cache_dir: Path, port: str | None, board: str = "sim"):
    return flash_and_compare(
        models_dir / MODEL,
        [models_dir / INPUT],
        board=board,
        port=port,
        out_dir=tmp_path / "out",
        options=JobOptions(cache_dir=cache_dir, timeouts=StageTimeouts(capture_total=30, capture_silence=3)),
    )


SCHEMA = json.loads((Path(__file__).parents[1] / "docs" / "flash-and-compare-schema.json").read_text())
COMPARE_SCHEMA = json.loads((Path(__file__).parents[1] / "docs" / "report-schema.json").read_text())


def report(result) -> dict:
    """report.json, validated against its documented schema (and the embedded compare report)."""
    import jsonschema

    doc = json.loads(result.report_path.read_text())
    jsonschema.validate(doc, SCHEMA)
    if doc["comparison"] is not None:
        jsonschema.validate(doc["comparison"], COMPARE_SCHEMA)
    return doc


@pytest.mark.parametrize("board", ["sim", "sim-usbjtag"])
def test_clean_run_matches_on_both_reset_styles(
    models_dir: Path, tmp_path: Path, cache_dir: Path, board: str
):
    result = run(models_dir, tmp_path, cache_dir, None, board=board)
    doc = report(result)
    assert result.exit_code == ExitCode.MATCH, doc
    assert doc["verdict"] == "match" and doc["simulated"] is True
    assert doc["variants"]["optimized"]["nn_mode"] == "optimized"
    assert doc["variants"]["ansi"]["nn_mode"] == "ansi_c"
    # the two firmwares differ (the ESP-NN setting reached the build) and both were captured
    assert doc["variants"]["optimized"]["firmware_sha256"] != doc["variants"]["ansi"]["firmware_sha256"]
    pairs = {(c["a"], c["b"]) for c in doc["comparison"]["comparisons"]}
    assert pairs == {("optimized", "ansi"), ("optimized", "reference"), ("ansi", "reference")}
    for v in ("optimized", "ansi"):
        log = Path(doc["variants"][v]["serial_log"])
        assert b"@EC1 " in log.read_bytes()


def test_second_run_flashes_nothing_and_hits_build_cache(models_dir: Path, tmp_path: Path, cache_dir: Path):
    port = sim_port_for("esp32s3", "classic", "sim://reflash-test")
    first = run(models_dir, tmp_path / "1", cache_dir, port)
    second = run(models_dir, tmp_path / "2", cache_dir, port)
    assert first.exit_code == second.exit_code == ExitCode.MATCH
    # the board keeps its flash between runs: the second optimized flash finds the image in place
    # for the bootloader/partition table; the app differs between variants so it is rewritten.
    for v in ("optimized", "ansi"):
        assert second.variants[v].build_cache_hit is True
    written = [r["bytes_written"] for r in second.variants["optimized"].flash["regions"]]
    assert written[0] == 0 and written[1] == 0


# fault -> exit code the run must end with. None of these may ever be a match.
FAULTS = [
    ("fault=corrupt&variant_fault=optimized", ExitCode.MISMATCH),
    ("fault=pinned&variant_fault=optimized", ExitCode.MISMATCH),
    ("fault=panic&variant_fault=optimized", ExitCode.FIRMWARE_FAULT),
    ("fault=abort&variant_fault=ansi", ExitCode.FIRMWARE_FAULT),
    ("fault=alloc&variant_fault=optimized", ExitCode.FIRMWARE_FAULT),
    # silence with no watchdog evidence cannot be told from a dead link: infrastructure, never a match
    ("fault=hang&variant_fault=optimized", ExitCode.INFRASTRUCTURE),
    ("fault=bootloop&variant_fault=optimized", ExitCode.FIRMWARE_FAULT),
    ("fault=brownout&variant_fault=optimized", ExitCode.INFRASTRUCTURE),
    ("fault=truncate&variant_fault=optimized", ExitCode.INFRASTRUCTURE),
    ("fault=disconnect&variant_fault=optimized", ExitCode.INFRASTRUCTURE),
    ("fault=noise&noise=0.002", ExitCode.INFRASTRUCTURE),
]


# these wait out a capture timeout or a reboot loop (4-15 s each on 2 busy cores): the full suite only
SLOW_FAULTS = {"fault=hang", "fault=bootloop", "fault=truncate", "fault=disconnect", "fault=noise"}


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        pytest.param(q, e, id=name, marks=[pytest.mark.slow] if name in SLOW_FAULTS else [])
        for q, e in FAULTS
        for name in [q.split("&")[0]]
    ],
)
def test_fault_maps_to_exit_code_never_match(
    models_dir: Path, tmp_path: Path, cache_dir: Path, query: str, expected: ExitCode
):
    result = run(models_dir, tmp_path, cache_dir, f"sim://?{query}")
    doc = report(result)
    assert result.exit_code == expected, json.dumps(doc["stages"], indent=1)
    assert doc["verdict"] != "match"
    assert (tmp_path / "out" / "report.json").exists()
    # nothing lost: every variant that reached the capture stage has its raw serial log on disk
    for v in ("optimized", "ansi"):
        log = doc["variants"][v]["serial_log"]
        if log:
            assert Path(log).exists()


def test_benign_faults_still_match(models_dir: Path, tmp_path: Path, cache_dir: Path):
    """A failing first SYNC is retried by esptool's connect loop; a watchdog splice is repaired."""
    result = run(models_dir, tmp_path, cache_dir, "sim://?fault=sync_fail,wdt")
    assert result.exit_code == ExitCode.MATCH, report(result)["stages"]


def test_corrupt_names_the_output_and_lsb(models_dir: Path, tmp_path: Path, cache_dir: Path):
    result = run(
        models_dir, tmp_path, cache_dir, "sim://?fault=corrupt&variant_fault=optimized&corrupt_lsb=5"
    )
    comps = {(c.a, c.b): c for c in result.comparison.comparisons}
    assert not comps[("optimized", "ansi")].match
    assert comps[("optimized", "ansi")].max_diff_lsb >= 1
    assert comps[("ansi", "reference")].match  # the ANSI build agrees with the host reference


def test_cli_main_job_writes_junit(
    models_dir: Path, tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
):
    junit = tmp_path / "r.xml"
    code = main(
        [
            "flash-and-compare",
            str(models_dir / MODEL),
            "--input",
            str(models_dir / INPUT),
            "--board",
            "sim",
            "--out",
            str(tmp_path / "o"),
            "--cache-dir",
            str(cache_dir),
            "--junit",
            str(junit),
        ]
    )
    assert code == 0
    text = junit.read_text()
    assert "<testsuite" in text and 'failures="0"' in text
    # both variants were flashed in one esptool session: its bytes are shown once, not per variant
    cap = capsys.readouterr()
    out = " ".join((cap.out + cap.err).split())
    assert out.count("B written") == 1, out
    assert "same esptool" in out


def test_cli_without_input_is_usage_error(models_dir: Path, tmp_path: Path):
    assert main(["flash-and-compare", str(models_dir / MODEL), "--out", str(tmp_path)]) == ExitCode.USAGE


def test_sim_port_for_keeps_user_parameters():
    url = sim_port_for("esp32", "classic", "sim://bench1?fault=panic")
    assert url.startswith("sim://bench1?fault=panic")
    assert "chip=esp32" in url and "reset=classic" in url
    fresh = sim_port_for("esp32s3", "usb_serial_jtag", None)
    assert "reset=usb_jtag" in fresh and fresh != sim_port_for("esp32s3", "usb_serial_jtag", None)


def test_missing_host_reference_is_a_warning_not_a_verdict(
    models_dir: Path, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    """Faked: the host reference is made unavailable (as on Intel macOS); the simulator still runs."""
    import harness.analysis.compare
    from harness.errors import HostReferenceError

    def unavailable(*args: object, **kwargs: object) -> None:
        raise HostReferenceError("no host reference backend installed", hint="install tflite-micro")

    monkeypatch.setattr(harness.flows.flash_and_compare, "reference_source", unavailable)
    result = run(models_dir, tmp_path, cache_dir, None)
    assert result.exit_code == ExitCode.MATCH
    assert any("host reference unavailable" in w for w in result.warnings)
    assert {(c.a, c.b) for c in result.comparison.comparisons} == {("optimized", "ansi")}


def test_junit_names_the_crashed_variant(models_dir: Path, tmp_path: Path, cache_dir: Path):
    import xml.etree.ElementTree as ET

    junit = tmp_path / "r.xml"
    result = flash_and_compare(
        models_dir / MODEL,
        [models_dir / INPUT],
        board="sim",
        port="sim://?fault=panic&variant_fault=optimized",
        out_dir=tmp_path / "out",
        options=JobOptions(
            cache_dir=cache_dir, timeouts=StageTimeouts(capture_total=30, capture_silence=3), junit=junit
        ),
    )
    assert result.exit_code == ExitCode.FIRMWARE_FAULT
    root = ET.parse(junit).getroot()
    cases = {(c.get("classname"), c.get("name")): c for c in root.iter("testcase")}
    crashed = cases[(f"esp-check.{Path(MODEL).stem}.sim", "optimized.run")]
    failure = crashed.find("failure")
    assert failure is not None and failure.get("type") == "firmware_fault"
    assert "Guru Meditation" in (crashed.findtext("system-out") or "")
    assert int(root.get("failures")) >= 1
    # the crash is decoded with the build's ELF, or says why not (no Xtensa addr2line on this machine)
    from harness.firmware.backtrace import find_addr2line

    (panic,) = [f for f in report(result)["variants"]["optimized"]["findings"] if f["kind"] == "panic"]
    # the resident app crashes on the input it was sent, then reboots and waits: one crash, reported once
    assert panic["details"].get("count", 1) == 1
    decode = panic["details"]["decode"]
    if find_addr2line("esp32s3")[0] is None:
        assert decode["status"] == "skipped" and "xtensa-esp32s3-elf-addr2line" in decode["why"]
    else:
        assert panic["details"]["decoded"][0]["function"] == "esp_nn_conv_s8_esp32s3"


def test_board_for_other_silicon_revision_is_a_usage_error(models_dir: Path, tmp_path: Path, cache_dir: Path):
    """A board whose image accepts v3.x only (like esp32p4-v3) on a chip that reports v0.2: the flash step
    refuses before writing (exit 2, the board is wrong for the chip), and nothing is compared."""
    text = (Path(__file__).parents[1] / "boards" / "sim.toml").read_text()
    assert 'chip_rev_min = "0.0"' in text
    other = tmp_path / "sim-v3.toml"
    other.write_text(
        text.replace('name = "sim"', 'name = "sim-v3"')
        .replace('chip_rev_min = "0.0"', 'chip_rev_min = "3.0"')
        .replace('chip_rev_max = "0.99"', 'chip_rev_max = "3.99"')
    )
    result = run(models_dir, tmp_path, cache_dir, None, board=str(other))
    doc = report(result)
    assert result.exit_code == ExitCode.USAGE
    assert doc["verdict"] != "match" and doc["comparison"] is None
    flash = [s for s in doc["stages"] if s["stage"] == "flash"]
    assert flash and all(s["status"] == "failed" and s["exit_code"] == 2 for s in flash)
    assert all("revision v0.2" in s["detail"] and "v3.0 to v3.99" in s["detail"] for s in flash)


def test_report_files_in_a_new_folder_keep_the_verdict(
    models_dir: Path, tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
):
    """--junit/--html in a folder that does not exist yet: made, as --out is; the crash stays exit 4
    (was exit 70 with a FileNotFoundError traceback after the whole run, the finding lost)."""
    import xml.etree.ElementTree as ET

    junit, html = tmp_path / "new" / "r.xml", tmp_path / "other" / "r.html"
    args = ["flash-and-compare", str(models_dir / MODEL), "--input", str(models_dir / INPUT),
            "--out", str(tmp_path / "o"), "--cache-dir", str(cache_dir),
            "--port", "sim://?fault=panic&variant_fault=optimized", "--capture-timeout", "30",
            "--silence-timeout", "3", "--junit", str(junit), "--html", str(html)]  # fmt: skip
    assert main(args) == ExitCode.FIRMWARE_FAULT
    assert ET.parse(junit).getroot().get("failures") != "0" and "<html" in html.read_text()


@pytest.mark.parametrize("flag", ["--junit", "--html", "--bundle"])
def test_a_report_file_that_cannot_be_written_is_refused_before_the_run(
    models_dir: Path, tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str], flag: str
):
    """A report path under a file: a usage error naming the flag before anything is flashed (was exit 70,
    a traceback, after the whole run)."""
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("")
    out = tmp_path / "o"
    args = ["flash-and-compare", str(models_dir / MODEL), "--input", str(models_dir / INPUT),
            "--out", str(out), "--cache-dir", str(cache_dir), flag, str(in_the_way / "report.x")]  # fmt: skip
    assert main(args) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert flag in err and str(in_the_way) in err
    assert not (out / "logs").exists()  # nothing was built, flashed or captured


def test_an_unknown_schema_version_is_refused_before_the_run(
    models_dir: Path, tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
):
    """--schema-version 7 was checked only when the JSON was printed: the whole run went by, report.json
    said "match" and the command exited 2. Now it is refused before anything runs, as `run` does."""
    out = tmp_path / "o"
    args = ["flash-and-compare", str(models_dir / MODEL), "--input", str(models_dir / INPUT),
            "--out", str(out), "--cache-dir", str(cache_dir), "--json", "--schema-version", "7"]  # fmt: skip
    assert main(args) == ExitCode.USAGE
    assert "schema_version 7 is not available" in capsys.readouterr().err
    assert not (out / "logs").exists() and not (out / "report.json").exists()


@pytest.mark.parametrize(
    ("query", "named"), [("fault=bogus", "bogus"), ("fault=op_corrupt", "fault_op"), ("noise=2", "noise")]
)
def test_a_bad_sim_url_is_a_usage_error_before_the_run(
    models_dir: Path,
    tmp_path: Path,
    cache_dir: Path,
    capsys: pytest.CaptureFixture[str],
    query: str,
    named: str,
):
    """docs/simulator.md: an unknown key or a value out of range is a usage error naming the parameter.
    --port sim://...?fault=bogus was found only when the port opened: exit 3, "check the port name and
    cable" (and in `esp-check run` a retried infrastructure failure)."""
    out = tmp_path / "o"
    args = ["flash-and-compare", str(models_dir / MODEL), "--input", str(models_dir / INPUT),
            "--out", str(out), "--cache-dir", str(cache_dir), "--port", f"sim://bad-url?{query}"]  # fmt: skip
    assert main(args) == ExitCode.USAGE
    assert named in capsys.readouterr().err
    assert not (out / "logs" / "flash.log").exists()
