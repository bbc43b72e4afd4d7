"""flash-and-compare's run lifecycle and command line: flags that do not apply, stale reports,
full disks, SIGTERM, terminal output.

Nothing is faked unless a test says so: the board is the simulated one (``sim``), the CLI is
``harness.cli.main`` as the console script calls it.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import serial

from harness.cli import main
from harness.errors import ExitCode
from harness.sim.board import remove_board

MODELS = Path(__file__).parent / "data" / "models"
MODEL = MODELS / "cnn_classifier_11.tflite"
PNG = MODELS / "inputs" / "cnn_classifier_11.png"


def _fac(out: Path, *extra: str) -> list[str]:
    return ["flash-and-compare", str(MODEL), "--input", str(PNG), "--board", "sim", "--out", str(out), *extra]


@pytest.mark.parametrize(
    "flags",
    [
        ("--repeat", "3"),
        ("--labels", "LABELS"),
        ("--results", "crc"),
        ("--seed", "5"),
        ("--seed", "0"),
        ("--keep-chunks", "always"),
    ],
)
def test_dataset_flags_with_input_files_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: tuple[str, str]
) -> None:
    """Each was ignored silently with --input (exit 0, no determinism check, no accuracy): now exit 2,
    naming the flag, before anything is built (report.json records no build stage)."""
    labels = tmp_path / "labels.csv"
    labels.write_text("cnn_classifier_11.png,4\n")
    args = [a.replace("LABELS", str(labels)) for a in flags]
    assert main(_fac(tmp_path / "o", *args)) == ExitCode.USAGE
    err = " ".join(capsys.readouterr().err.split())
    assert f"{flags[0]} applies only to a dataset run" in err, err


def test_seed_with_a_dataset_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "d"
    data.mkdir()
    (data / "a.png").write_bytes(PNG.read_bytes())
    args = [
        "flash-and-compare",
        str(MODEL),
        "--dataset",
        str(data),
        "--seed",
        "3",
        "--out",
        str(tmp_path / "o"),
    ]
    assert main(args) == ExitCode.USAGE
    assert "--seed applies only to --random-inputs" in " ".join(capsys.readouterr().err.split())


def test_dump_ops_out_of_range_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--dump-ops 999 was refused only after a full run: now before anything is generated or built."""
    out = tmp_path / "o"
    assert main(_fac(out, "--tap", "--dump-ops", "3,999")) == ExitCode.USAGE
    err = " ".join(capsys.readouterr().err.split())
    assert "--dump-ops 999: the model has" in err, err
    doc = json.loads((out / "report.json").read_text())
    assert doc["verdict"] == "usage_error"
    assert not [s for s in doc["stages"] if s["stage"] in ("generate", "build")], doc["stages"]


def test_sigterm_is_handled_like_ctrl_c(tmp_path: Path) -> None:
    """timeout(1), docker stop and CI cancels send SIGTERM: exit 143, a report that says interrupted
    (not the previous run's "match"), and the host reference child's temp folder removed. The signal
    is sent while that child runs (its folder exists), to the real CLI in a subprocess."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out, tmp = tmp_path / "o", tmp_path / "tmp"
    out.mkdir()
    tmp.mkdir()
    (out / "report.json").write_text(json.dumps({"verdict": "match", "exit_code": 0}))
    env = dict(os.environ, TMPDIR=str(tmp), ESP_CHECK_CACHE_DIR=str(tmp_path / "cache"))
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    # the optimized app hangs (fault=hang): a signal that lands after the reference has ended still finds
    # the run going, so exit 143 does not depend on how fast a loaded machine polls
    hang = ("--port", "sim://sigterm?fault=hang&variant_fault=optimized")
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", *_fac(out, *hang)], cwd=root, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not list(tmp.glob("esp-check-host-*")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        assert list(tmp.glob("esp-check-host-*")), "the host reference child never started"
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=60)[1]
    finally:
        proc.kill()
    assert proc.returncode == 143, err  # 128 + SIGTERM
    doc = json.loads((out / "report.json").read_text())
    assert doc["verdict"] == "interrupted" and doc["exit_code"] == 143, doc
    assert any("interrupted (SIGTERM)" in e for e in doc["errors"]), doc["errors"]
    assert list(tmp.glob("esp-check-host-*")) == []
    assert list(out.glob("*.tmp")) == []


# ---- a full disk: exit 3 with a clear message, no *.tmp, no earlier "match" left -------------------


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``where`` (needs root and mount(8)); skips with the reason where it
    cannot mount. This is a real full disk, not a fake: the kernel returns ENOSPC."""
    where.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        pytest.skip("no mount(8) here: the full-disk test needs a small tmpfs")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(
            f"cannot mount a small tmpfs for the full-disk test: {done.stderr.strip() or done.returncode}"
        )
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True)


def _fill(mnt: Path) -> None:
    """Write a filler file until the file system is full."""
    with open(mnt / "filler", "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)


def test_console_thread_survives_a_full_disk_and_says_so(tmp_path: Path) -> None:
    """The serial log cannot be written: the capture stops with exit 3 naming the full disk, the reader
    thread does not die with a traceback, and it is not reported as a lost serial link. The port is a
    real pyserial loop:// port holding what a board printed."""
    from harness.device.console import capture_run
    from harness.errors import InfrastructureError

    died: list[str] = []
    old = threading.excepthook
    threading.excepthook = lambda args: died.append(
        f"{args.thread.name if args.thread else '?'}: {args.exc_value}"
    )
    try:
        with small_tmpfs(tmp_path / "mnt", "64k") as mnt:
            _fill(mnt)
            port = serial.serial_for_url("loop://", timeout=0.05)
            port.write(b"ESP-ROM:esp32s3-20210327\r\n" + b"I (1) app: hello\r\n" * 100)  # < loop:// buffer
            with pytest.raises(
                InfrastructureError, match="no space left on the device while writing the serial log"
            ):
                capture_run(
                    port, log_path=mnt / "serial.log", reset=None, silence_timeout=2, total_timeout=10
                )
    finally:
        threading.excepthook = old
    assert died == []


def _du(path: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


@pytest.mark.slow
def test_full_disk_is_exit_3_and_leaves_no_stale_match(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """flash-and-compare with --out on a tmpfs too small for its artifacts, at sizes where the projects,
    the serial logs or report.json no longer fit: always exit 3 with a clear message (never 70 and a
    traceback), no *.tmp left, and the earlier report.json ("match") is gone, not left beside the new logs."""
    with small_tmpfs(tmp_path / "big", "16m") as big:
        assert main(_fac(big / "o")) == ExitCode.MATCH
        needed = _du(big / "o")
    capsys.readouterr()
    sizes = sorted({64 * 1024, needed // 2, needed - 32 * 1024, needed - 16 * 1024, needed - 4096})
    for k, size in enumerate(sizes):
        with small_tmpfs(tmp_path / f"m{k}", f"{size // 4096 * 4}k") as mnt:
            out = mnt / "o"
            out.mkdir()
            (out / "report.json").write_text(json.dumps({"verdict": "match", "exit_code": 0}))
            code = main(_fac(out))
            err = " ".join(capsys.readouterr().err.split())
            if code == ExitCode.MATCH and size > needed // 2:  # it fitted after all: runs differ by a few KB
                assert json.loads((out / "report.json").read_text())["verdict"] == "match"
                assert list(out.rglob("*.tmp")) == []
                continue
            assert code == ExitCode.INFRASTRUCTURE, (size, needed, err)
            assert "no space left on the device while writing" in err and "Traceback" not in err, err
            assert "serial link was lost" not in err, err
            assert list(out.rglob("*.tmp")) == []
            report = out / "report.json"
            if report.exists():  # written after all (the space sufficed for it): it says what happened
                assert json.loads(report.read_text())["verdict"] == "infrastructure_error"


# ---- stale or clobbered reports ---------------------------------------------------------------------


def _old_match(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    report = out / "report.json"
    report.write_text(json.dumps({"verdict": "match", "exit_code": 0}))
    return report


@pytest.mark.parametrize(
    "flags",
    [
        ("--tolerance-lsb", "nan"),  # click's check of the value
        ("--random-inputs", "0"),  # click's range
        ("--no-such-flag",),  # click's parser
        ("--dataset", "DIR"),  # the command's own check: --input and --dataset exclude each other
    ],
)
def test_usage_errors_before_the_run_replace_the_old_match(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: tuple[str, ...]
) -> None:
    """A refused command line exits 2 and leaves report.json saying usage_error, as the run's own usage
    errors do, not the previous run's "match"."""
    (tmp_path / "d").mkdir()
    report = _old_match(tmp_path / "o")
    args = [f.replace("DIR", str(tmp_path / "d")) for f in flags]
    assert main([*_fac(tmp_path / "o"), *args]) == ExitCode.USAGE
    capsys.readouterr()
    doc = json.loads(report.read_text())
    assert doc["verdict"] == "usage_error" and doc["exit_code"] == 2, doc
    assert doc["errors"] and doc["schema"] == "esp-check/flash-and-compare"


def test_usage_error_creates_no_report_where_there_was_none(tmp_path: Path) -> None:
    assert main([*_fac(tmp_path / "o"), "--tolerance-lsb", "nan"]) == ExitCode.USAGE
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("flag", ["--bundle", "--html", "--junit"])
def test_a_report_file_onto_report_json_or_the_model_is_refused(tmp_path: Path, flag: str) -> None:
    """--bundle OUT/report.json replaced report.json with a zip and exited 0: refused (exit 2), and
    report.json is still JSON; pointing it at the model is refused too (the model stays intact)."""
    out = tmp_path / "o"
    assert main([*_fac(out), flag, str(out / "report.json")]) == ExitCode.USAGE
    assert json.loads((out / "report.json").read_text())["verdict"] == "usage_error"
    model = tmp_path / "m.tflite"
    model.write_bytes(MODEL.read_bytes())
    args = _fac(out)
    args[1] = str(model)
    assert main([*args, flag, str(model)]) == ExitCode.USAGE
    assert model.read_bytes() == MODEL.read_bytes()


# ---- terminal polish ----------------------------------------------------------------------------------


def test_terminal_output_says_each_thing_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One verdict line; the comparison table says SIMULATED; one boot stage per variant; column headers
    without "optimized (optimized)" / "ansi (ansi_c)"; in --json mode stdout is the JSON and the verdict
    line goes to stderr."""
    assert main(_fac(tmp_path / "o")) == ExitCode.MATCH
    err = capsys.readouterr().err
    assert sum("verdict: match" in line for line in err.splitlines()) == 1, err
    title = next(line for line in err.splitlines() if line.startswith("run 0, output 0"))
    assert "SIMULATED" in title, err
    assert sum("boot [optimized]" in line for line in err.splitlines()) == 1, err
    assert "optimized (optimized)" not in err and "ansi (ansi_c)" not in err, err
    assert main([*_fac(tmp_path / "o"), "--json"]) == ExitCode.MATCH
    captured = capsys.readouterr()
    assert json.loads(captured.out)["verdict"] == "match"
    assert [line for line in captured.err.splitlines() if "verdict:" in line] == [
        "verdict: match (exit 0)  [SIMULATED: no real ESP32 was used]"
    ]


def test_help_and_command_list_read_whole(capsys: pytest.CaptureFixture[str]) -> None:
    """--input-offset's help had "[x<=None]"; the command list cut build's line at "(e.g."."""
    assert main(["flash-and-compare", "--help"]) == 0
    assert "x<=None" not in capsys.readouterr().out
    assert main(["--help"]) == 0
    listing = " ".join(capsys.readouterr().out.split())
    assert (
        "Build generated project directories (e.g. OUT/optimized OUT/ansi), with a content-addressed"
        in listing
    )


def test_input_errors_say_what_the_file_is(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A FIFO given as --input is not "not found"; a scale that overflows is an input error, not a numpy
    RuntimeWarning; a path with an escape sequence is shown escaped, not stripped."""
    import os

    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    assert main(["flash-and-compare", str(MODEL), "--input", str(fifo), "--out", str(tmp_path / "o")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "is not a regular file" in err and "not found" not in err, err
    npy = tmp_path / "x.npy"
    import numpy as np

    np.save(npy, np.full((1, 32, 32, 3), 200, dtype=np.uint8))
    with warnings_as_errors():
        code = main(
            [*_fac(tmp_path / "o2")[:3], str(npy), "--input-scale", "1e308", "--out", str(tmp_path / "o2")]
        )
    assert code == 2
    assert "infinities" in " ".join(capsys.readouterr().err.split())
    odd = tmp_path / "a\x1b[2Jb.png"
    assert main(["flash-and-compare", str(MODEL), "--input", str(odd), "--out", str(tmp_path / "o3")]) == 2
    err = capsys.readouterr().err
    assert "a\\x1b[2Jb.png" in err and "\x1b" not in err, err


@contextlib.contextmanager
def warnings_as_errors() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        yield


def test_a_failed_build_is_said_once_with_real_line_breaks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each build error is printed once (not again as a failed stage), and its hint on its own line, not
    after a literal \\x0a. (The sim board refuses the pio builder: a build failure with a hint.)"""
    args = [*_fac(tmp_path / "o"), "--builder", "pio", "--cache-dir", str(tmp_path / "cache")]
    assert main(args) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "\\x0a" not in err, err
    said = [line for line in err.splitlines() if "cannot be built with builder" in line]
    assert len([line for line in said if "optimized" in line]) == 2, err  # its progress line, its error
    assert (
        sum(line.strip().startswith("Hint: the simulated board builds only") for line in err.splitlines())
        == 2
    )


def test_findings_show_their_severity_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A finding showed "(Severity.INFRASTRUCTURE)": its value is what the table says. The simulated board
    browns out in the optimized app (an injected fault, docs/simulator.md)."""
    port = "sim://?fault=brownout&variant_fault=optimized"
    assert main([*_fac(tmp_path / "o"), "--port", port]) == ExitCode.INFRASTRUCTURE
    err = " ".join(capsys.readouterr().err.split())
    assert "brownout (infrastructure)" in err.replace("│ ", "").replace(" │", ""), err
    assert "Severity." not in err, err


# ---- the README: a plain user install, the pytest-plugin example ----------------------------------------

README = Path(__file__).resolve().parents[1] / "README.md"
# what only the `test` extra installs (pyproject.toml): the main job must not need any of it
TEST_ONLY = ("pytest", "_pytest", "hypothesis", "jsonschema", "mypy", "importlinter", "uv", "labgrid",
             "pytest_embedded", "pytest_embedded_serial_esp", "pytest_embedded_idf", "esp_idf_monitor",
             "idf_component_manager", "ai_edge_litert")  # fmt: skip
_BLOCK = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError("blocked: only the test extra installs " + name)
sys.meta_path.insert(0, _Block())
from harness.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _block(lang: str, after: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"```{lang}\n", text.index(after)) + len(lang) + 4
    return text[start : text.index("```", start)]


def test_readme_quick_start_is_a_plain_install_that_runs_the_main_job(tmp_path: Path) -> None:
    """The quick start installs esp-check alone (no test extra: 2.5 min, labgrid, mypy...), and its
    command runs the main job on the simulated board with every test-extra package made unimportable."""
    import os
    import shlex
    import sys

    block = _block("sh", "## Quick start")
    installs = [line for line in block.splitlines() if line.startswith("pip install")]
    assert installs and all("[" not in line.split("#")[0] for line in installs), installs
    command = block.split("esp-check flash-and-compare", 1)[1].replace("\\\n", " ").split("\n")[0]
    args = shlex.split(command.replace("--out esp-check-out", f"--out {tmp_path / 'o'}"))
    root = README.parent
    env = dict(os.environ, PYTHONPATH=str(root), ESP_CHECK_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run(
        [sys.executable, "-c", _BLOCK.format(blocked=set(TEST_ONLY)), "flash-and-compare", *args],
        cwd=root, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "verdict: match" in done.stderr and "SIMULATED" in done.stderr


@pytest.mark.slow
def test_readme_pytest_example_passes_or_fails_loudly(tmp_path: Path) -> None:
    """The README's pytest-plugin example, run as the README says (pytest with the installed plugins, in a
    directory of its own): it passes; and where labgrid's plugin would skip it (labgrid and pytest-embedded
    installed, no -p no:labgrid), it fails with the hint instead of exiting 0 "skipped"."""
    import importlib.util
    import os
    import shlex
    import sys

    example = _block("python", "## In your pytest suite")
    (tmp_path / "test_example.py").write_text(example, encoding="utf-8")
    shutil.copy(MODEL, tmp_path / "kws.tflite")
    shutil.copy(MODELS / "inputs" / "cnn_classifier_11.npy", tmp_path / "yes.npy")
    command = shlex.split(example.split("# pytest", 1)[1].splitlines()[0])
    env = dict(os.environ, PYTHONPATH=str(README.parent), ESP_CHECK_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("PYTEST_ADDOPTS", None)

    def pytest_run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra, *command],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip

    clash = all(importlib.util.find_spec(m) for m in ("labgrid", "pytest_embedded"))
    done = pytest_run(*(["-p", "no:labgrid"] if clash else []))  # as the README says to
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-3000:]
    if not clash:
        pytest.skip("labgrid and pytest-embedded are not both installed: nothing skips the example here")
    loud = pytest_run()
    assert loud.returncode != 0 and "labgrid's pytest plugin skipped this test" in loud.stdout, loud.stdout
    assert "-p no:labgrid" in loud.stdout and "1 skipped" not in loud.stdout


def test_a_repeat_run_says_the_flash_was_skipped_for_both_variants(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The second run on the same simulated board holds both apps and the model (its HELLO hashes): no
    esptool session ran, so the ANSI C row must not claim to share one."""
    port = f"sim://skip-{uuid.uuid4().hex[:8]}"
    try:
        assert main([*_fac(tmp_path / "a"), "--port", port]) == ExitCode.MATCH
        capsys.readouterr()
        assert main([*_fac(tmp_path / "b"), "--port", port]) == ExitCode.MATCH
    finally:
        remove_board(port.removeprefix("sim://"))
    cap = capsys.readouterr()
    out = " ".join((cap.out + cap.err).replace("│", " ").split())
    assert "flash skipped" in out, out
    assert "skipped with optimized" in out, out
    assert "same esptool session" not in out, out
