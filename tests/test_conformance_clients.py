"""Conformance: the real client tools, run as users run them, against `esp-check sim serve` and our build
directories.

Real (from PyPI, the `test` extra, each run as a subprocess): the esptool 5 CLI, pytest-embedded with its
`esp` and `idf` services, esp-idf-monitor, pyserial's RFC 2217 client inside them, and esp-check's own
CLI. Faked: only the board, which is the simulator served by `esp-check sim serve` in its own process
(RFC 2217, or raw TCP with the board strapped into download mode). pytest-embedded runs in a pytest
subprocess with a config of its own: it is kept out of this suite (see test_conformance_isolation.py).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import select
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sim_helpers import HANG_S

from harness.firmware.build import BuildResult, build_project
from harness.firmware.generate import generate_projects
from harness.flashfmt.partitions import table_rows
from harness.protocol.capture import parse_capture
from harness.protocol.frames import Frame, FrameDecoder, decode_hello
from harness.sim.chips import get_chip

pytestmark = pytest.mark.slow

MODELS = Path(__file__).parent / "data" / "models"
MODEL = MODELS / "cnn_classifier_11.tflite"
INPUT = MODELS / "inputs" / "cnn_classifier_11__ambiguous.png"
END = re.compile(rb"@EC1 \d+ END status=ok")
HELLO_LINE = re.compile(rb"@ECH HELLO [A-Za-z0-9+/]+={0,2}\r*\n")
VERIFIED = "Verification successful (digest matched)"  # esptool 5 verify-flash, per region


def _need(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install -e '.[test]' installs the client tools)")


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    """The optimized firmware for the simulated board, built by esp-check into ESP-IDF's layout."""
    out = tmp_path_factory.mktemp("conformance")
    (proj,) = generate_projects(MODEL, [INPUT], "sim", out_dir=out / "fw", variants=("optimized",))
    return build_project(proj.path, use_cache=False)


@pytest.fixture(scope="module")
def ansi_build(build: BuildResult) -> BuildResult:
    """The ANSI C firmware of the same model for the same board (its app lives in ota_1)."""
    (proj,) = generate_projects(MODEL, [INPUT], "sim", out_dir=build.project_dir.parent, variants=("ansi",))
    return build_project(proj.path, use_cache=False)


def _capture_after_reset(url: str, timeout: float = 90) -> bytes:
    """What the board prints after a classic DTR/RTS reset (EN pulled low, then released), up to END."""
    import serial

    seen = b""
    with serial.serial_for_url(url, baudrate=115200, timeout=0.5) as port:
        port.dtr = False
        port.rts = True
        time.sleep(0.1)
        port.rts = False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not (END.search(seen) and HELLO_LINE.search(seen)):
            seen += port.read(4096)
    return seen


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., tuple[str, str]]]:
    """Start `esp-check sim serve ARGS` in its own process: returns (URL it prints, board name)."""
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str) -> tuple[str, str]:
        name = f"conf-{uuid.uuid4().hex[:8]}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "harness.cli", "sim", "serve", "--name", name, "--port", "0", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        procs.append(proc)
        assert proc.stdout is not None
        banner, listening = proc.stdout.readline(), proc.stdout.readline()
        assert "SIMULATED BOARD" in banner, banner + listening
        return listening.split()[-1], name

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=HANG_S)


def esptool(port: str | None, *args: str, cwd: Path | None = None, timeout: float = 300) -> str:
    """The esptool CLI (`python -m esptool` is the `esptool` entry point); fails the test on exit != 0."""
    argv = [sys.executable, "-m", "esptool", *(["--port", port] if port else []), *args]
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


def _flash_params(write_output: str, build: BuildResult) -> list[str]:
    """The flash mode / frequency / size esptool wrote into the bootloader header: what it says it set
    ("Flash parameters set to 0x0230."), or, when it changed nothing and says nothing, the file's own."""
    m = re.search(r"Flash parameters set to 0x([0-9a-f]{4})", write_output, re.IGNORECASE)
    boot = next(a for a in build.artifacts if a.role == "bootloader").path.read_bytes()
    value = int(m.group(1), 16) if m else int.from_bytes(boot[2:4], "big")
    mode = {0: "qio", 1: "qout", 2: "dio", 3: "dout"}[value >> 8]
    size = {0: "1MB", 1: "2MB", 2: "4MB", 3: "8MB", 4: "16MB", 5: "32MB"}[(value >> 4) & 0xF]
    freq = {0: "40m", 1: "26m", 2: "20m", 0xF: "80m"}[value & 0xF]
    return ["--flash-mode", mode, "--flash-freq", freq, "--flash-size", size]


def _flash_files(build: BuildResult) -> list[str]:
    out = build.flasher_args.parent
    return [x for a in build.artifacts for x in (hex(a.offset), a.path.relative_to(out).as_posix())]


# ---- esptool CLI ----------------------------------------------------------------------------------


def test_esptool_image_info_on_every_produced_image(build: BuildResult) -> None:
    out = build.flasher_args.parent
    elf_sha = hashlib.sha256(build.elf.read_bytes()).hexdigest()  # type: ignore[union-attr]
    for a in build.artifacts:
        if a.role in ("partition-table", "otadata", "model"):
            continue  # not ESP images: a table (gen_esp32part's rules, test_sim_image.py), data partitions
        text = esptool(None, "--chip", "esp32s3", "image-info", str(a.path), cwd=out, timeout=60)
        assert "Checksum:" in text and "(valid)" in text and "invalid" not in text.lower(), text
        assert re.search(r"Validation hash: [0-9a-f]{64} \(valid\)", text), text
        if a.role == "app":
            assert "Project name: esp_check_fw" in text and f"ELF file SHA256: {elf_sha}" in text


def test_esptool_image_info_shows_the_boards_revision_range(build: BuildResult) -> None:
    """The bootloader and the app carry the board's chip revisions (sim: v0.0 - v0.99) in their extended
    header, as ESP-IDF writes CONFIG_ESP_REV_MIN_FULL / MAX_FULL (old code: max 0, "v0.0")."""
    for role in ("bootloader", "app"):
        path = next(a.path for a in build.artifacts if a.role == role)
        text = esptool(None, "--chip", "esp32s3", "image-info", str(path), timeout=60)
        assert "Minimal chip revision: v0.0" in text and "Maximal chip revision: v0.99" in text, text


def test_esptool_cli_refuses_a_build_for_other_chip_revisions(
    serve: Callable[..., tuple[str, str]], tmp_path: Path
) -> None:
    """A board file whose image accepts v0.3 - v0.99 only, flashed by hand with `esptool write-flash
    @flash_args` to the simulated ESP32-S3 (revision v0.2): esptool itself refuses the bootloader, before
    it writes anything, as it would refuse an ESP-IDF build for other silicon. On the old code the image
    header said nothing (max_rev_full 0), and esptool skipped its check."""
    board = tmp_path / "sim-rev3.toml"
    text = (Path(__file__).parent.parent / "boards" / "sim.toml").read_text()
    board.write_text(
        text.replace('name = "sim"', 'name = "sim-rev3"').replace(
            'chip_rev_min = "0.0"', 'chip_rev_min = "0.3"'
        )
    )
    (proj,) = generate_projects(MODEL, [INPUT], str(board), out_dir=tmp_path / "fw", variants=("optimized",))
    res = build_project(proj.path, use_cache=False)
    url, _ = serve("--rfc2217")
    argv = [sys.executable, "-m", "esptool", "--port", url, "write-flash", "@flash_args"]
    proc = subprocess.run(argv, cwd=res.flasher_args.parent, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-2000:]
    assert "requires chip revision in range v0.3 - v0.99 (this chip is revision v0.2)" in out, out[-2000:]
    assert "Wrote " not in out  # refused before writing anything


def test_esptool_cli_over_rfc2217(build: BuildResult, serve: Callable[..., tuple[str, str]]) -> None:
    """chip-id, then write-flash @flash_args at 921600 and verify-flash with what esptool wrote."""
    url, _ = serve("--rfc2217")
    out = build.flasher_args.parent
    assert "ESP32-S3" in esptool(url, "chip-id")
    written = esptool(url, "--baud", "921600", "write-flash", "@flash_args", cwd=out)
    assert written.count("Hash of data verified") == len(build.artifacts), written[-2000:]
    params = _flash_params(written, build)
    verified = esptool(url, "--baud", "921600", "verify-flash", *params, *_flash_files(build), cwd=out)
    assert verified.count(VERIFIED) == len(build.artifacts), verified[-2000:]


def test_esptool_cli_over_raw_tcp_to_a_board_strapped_for_download(
    build: BuildResult, serve: Callable[..., tuple[str, str]], tmp_path: Path
) -> None:
    """Raw TCP carries no DTR/RTS: the board is strapped into download mode. Every command after the
    first re-connects to the flasher stub still running from the one before (esptool's no-reset)."""
    url, name = serve("--boot", "download")
    out = build.flasher_args.parent
    chip = get_chip("esp32s3")
    # the ROM loader first (--no-stub): the board is fresh from power-on
    rom = esptool(url, "--no-stub", "flash-id")
    assert "Detected flash size: 8MB" in rom
    table = next(a for a in build.artifacts if a.role == "partition-table")
    rel = table.path.relative_to(out).as_posix()
    esptool(url, "--no-stub", "write-flash", hex(table.offset), rel, cwd=out)
    assert VERIFIED in esptool(url, "--no-stub", "verify-flash", hex(table.offset), rel, cwd=out)
    # then the stub, as users run it
    assert "ESP32-S3" in esptool(url, "chip-id")
    assert f"MAC:                {chip.mac(name)}" in esptool(url, "read-mac")
    flash_id = esptool(url, "flash-id")
    assert "Manufacturer: ef" in flash_id and "Detected flash size: 8MB" in flash_id
    written = esptool(url, "write-flash", "@flash_args", cwd=out)
    assert "Stub flasher is already running" in written  # the stub answered SYNC like Espressif's
    assert written.count("Hash of data verified") == len(build.artifacts)
    verified = esptool(url, "verify-flash", *_flash_params(written, build), *_flash_files(build), cwd=out)
    assert verified.count(VERIFIED) == len(build.artifacts)
    app = build.app_bin.read_bytes()
    app_offset = next(a.offset for a in build.artifacts if a.role == "app")
    esptool(url, "read-flash", hex(app_offset), hex(len(app)), str(tmp_path / "app.bin"))
    assert (tmp_path / "app.bin").read_bytes() == app
    nvs = next(p for p in table_rows(table.path.read_bytes()) if p.label == "nvs")
    esptool(url, "erase-region", hex(nvs.offset), hex(nvs.size))
    esptool(url, "read-flash", hex(nvs.offset), "0x1000", str(tmp_path / "nvs.bin"))
    assert (tmp_path / "nvs.bin").read_bytes() == b"\xff" * 0x1000


def test_esptool_write_flash_of_the_ansi_build_directory_boots_the_ansi_app(
    build: BuildResult, ansi_build: BuildResult, serve: Callable[..., tuple[str, str]], tmp_path: Path
) -> None:
    """A board holding the optimized build (the usual order), then `esptool write-flash @flash_args` in the
    ANSI C build directory, as a user flashes it by hand: the board boots the ANSI C app (nn=ansi_c), not
    the optimized app still in ota_0. On the old code the ANSI build's otadata was erased, so ota_0 ran."""
    url, _ = serve("--rfc2217", "--flash", str(_flash_file(build, tmp_path / "flash.bin")))
    written = esptool(url, "write-flash", "@flash_args", cwd=ansi_build.flasher_args.parent)
    assert written.count("Hash of data verified") == len(ansi_build.artifacts), written[-2000:]
    cap = parse_capture(_capture_after_reset(url))
    assert cap.valid and cap.simulated, cap.problems
    assert cap.nn_mode == "ansi_c"


# ---- pytest-embedded ------------------------------------------------------------------------------


def _pytest_embedded(tests: Path, url: str, build: BuildResult, body: str, *extra: str) -> None:
    """Run pytest with pytest-embedded (`--embedded-services esp,idf`) on ``build``'s directory: one test
    whose body is ``body``; fails unless it passes."""
    tests.mkdir()
    (tests / "pytest.ini").write_text("[pytest]\n")  # not this project's config (which blocks the plugin)
    (tests / "test_dut.py").write_text("def test_dut(dut):\n" + body)
    env = {k: v for k, v in os.environ.items() if k not in ("ESPBAUD", "PYTEST_ADDOPTS")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(tests / "pytest.ini"), "--rootdir", str(tests), "-q",
         "-p", "no:cacheprovider", "-p", "no:labgrid",  # labgrid's `target` fixture shadows pytest-embedded's
         "--embedded-services", "esp,idf", "--port", url, "--target", "esp32s3",
         "--app-path", str(build.project_dir), "--build-dir", str(build.flasher_args.parent), *extra,
         "test_dut.py"],
        cwd=tests, capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout


def test_pytest_embedded_flashes_our_build_and_sees_the_end_record(
    build: BuildResult, serve: Callable[..., tuple[str, str]], tmp_path: Path
) -> None:
    """`pytest --embedded-services esp,idf`: IdfApp reads our build directory, IdfSerial flashes it at
    the default ESPBAUD (921600) and hard-resets, and `dut.expect` reads the app's END record at 115200."""
    _need("pytest_embedded_idf")
    url, _ = serve("--rfc2217")
    body = (
        "    dut.expect(r'@EC1 0 BEGIN .*sim=1', timeout=60)\n"
        "    dut.expect(r'@EC1 \\d+ END status=ok', timeout=60)\n"
        # the resident loop's HELLO after boot is one line of text (it used to be ~45 binary bytes)
        "    dut.expect(r'@ECH HELLO [A-Za-z0-9+/]+={0,2}\\r?\\n', timeout=60)\n"
    )
    _pytest_embedded(tmp_path / "pe", url, build, body)


def test_pytest_embedded_build_dir_of_the_ansi_build_runs_the_ansi_app(
    build: BuildResult, ansi_build: BuildResult, serve: Callable[..., tuple[str, str]], tmp_path: Path
) -> None:
    """pytest-embedded `--build-dir` on the ANSI C build directory, on a board that holds the optimized
    build (the usual order): the app that prints its records is the ANSI C one (`INFO nn=ansi_c`), with
    `--confirm-target-elf-sha256 y` as users run it. On the old code the optimized app in ota_0 ran."""
    _need("pytest_embedded_idf")
    url, _ = serve("--rfc2217", "--flash", str(_flash_file(build, tmp_path / "flash.bin")))
    body = (
        "    dut.expect(r'@EC1 0 BEGIN .*sim=1', timeout=60)\n"
        "    dut.expect(r' nn=ansi_c', timeout=60)\n"
        "    dut.expect(r'@EC1 \\d+ END status=ok', timeout=60)\n"
    )
    _pytest_embedded(tmp_path / "pe", url, ansi_build, body, "--confirm-target-elf-sha256", "y")


# ---- esp-idf-monitor ------------------------------------------------------------------------------


def _flash_file(build: BuildResult, path: Path) -> Path:
    """A flash image holding the build, as a factory-programmed board's flash (for `sim serve --flash`)."""
    flash = bytearray(b"\xff" * (8 << 20))
    for a in build.artifacts:
        blob = a.path.read_bytes()
        flash[a.offset : a.offset + len(blob)] = blob
    path.write_bytes(bytes(flash))
    return path


def test_esp_idf_monitor_resets_and_shows_boot_log_and_records(
    build: BuildResult, serve: Callable[..., tuple[str, str]], tmp_path: Path
) -> None:
    """idf_monitor (in a pseudo-terminal, as on a developer's screen) resets the board on start-up."""
    _need("esp_idf_monitor")
    import pty

    url, _ = serve("--rfc2217", "--flash", str(_flash_file(build, tmp_path / "flash.bin")))
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "esp_idf_monitor", "--port", url, "--baud", "115200", "--target", "esp32s3",
         "--toolchain-prefix", "xtensa-esp32s3-elf-", str(build.elf)],
        stdin=slave, stdout=slave, stderr=slave, close_fds=True, env=dict(os.environ, TERM="dumb"),
    )  # fmt: skip
    os.close(slave)
    seen = b""
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not (END.search(seen) and HELLO_LINE.search(seen)):
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    seen += os.read(master, 65536)
                except OSError:
                    break
    finally:
        proc.terminate()
        proc.wait(timeout=HANG_S)
        os.close(master)
    assert b"--- esp-idf-monitor" in seen and b"ESP-ROM:esp32s3" in seen, seen[-2000:]
    assert b"2nd stage bootloader" in seen and b"main_task: Calling app_main()" in seen
    text = re.sub(rb"\x1b\[[0-9;]*m", b"", seen)  # the monitor colours IDF log lines
    cap = parse_capture(text)
    assert cap.valid and cap.simulated and cap.nn_mode == "optimized", cap.problems
    # the HELLO the app sends after its records reads as one line of text on the screen, and is the frame
    hello = HELLO_LINE.search(text)
    assert hello is not None and all(c < 0x80 for c in text[END.search(text).end() :]), text[-600:]  # type: ignore[union-attr]
    frames = [f for f in FrameDecoder().feed(hello.group(0)) if isinstance(f, Frame)]
    assert [decode_hello(f.payload).nn for f in frames] == ["optimized"]


# ---- esp-check's own commands against a served simulator ------------------------------------------


def test_flash_and_compare_and_run_match_on_a_served_simulator(
    serve: Callable[..., tuple[str, str]], tmp_path: Path
) -> None:
    url, _ = serve("--rfc2217")
    cli = [sys.executable, "-m", "harness.cli"]
    out = tmp_path / "fac"
    proc = subprocess.run([*cli, "flash-and-compare", str(MODEL), "--input", str(INPUT), "--board", "sim",
                           "--port", url, "--out", str(out), "--cache-dir", str(tmp_path / "cache")],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((out / "report.json").read_text())
    assert doc["verdict"] == "match" and doc["simulated"] is True and doc["port"] == url
    (tmp_path / "bench.toml").write_text(f'[[board]]\nname = "served"\ntype = "sim"\nport = "{url}"\n')
    (tmp_path / "plan.toml").write_text(
        f'[[job]]\nname = "served"\nmodels = ["{MODEL}"]\ninputs = ["{INPUT}"]\nboards = ["sim"]\n'
    )
    proc = subprocess.run([*cli, "run", str(tmp_path / "plan.toml"),
                           "--inventory", str(tmp_path / "bench.toml"),
                           "--out", str(tmp_path / "run"), "--lock-dir", str(tmp_path / "locks"),
                           "--cache-dir", str(tmp_path / "cache"), "--no-step-summary"],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["verdict"] == "match" and summary["simulated"] is True
