"""Every simulator fault is observable in what the port delivers, and deterministic given the seed.

Faked: the board (harness.sim) and, by design, its faults. Parsing uses the real protocol parser.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import serial
from esp_pylib.serial_reset import classic_bootloader_reset, hard_reset
from esptool import cmds
from esptool.util import FatalError
from sim_helpers import make_project, read_until_end

import harness.sim as sim
from harness.protocol.capture import parse_capture
from harness.sim.board import remove_board
from harness.sim.image import build_sim_firmware

sim.register()
pytestmark = pytest.mark.needs_cc


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory, models_dir: Path) -> dict[tuple[str, str], list]:
    x = np.load(models_dir / "inputs" / "op_zoo.q.npy")
    out = {}
    for chip in ("esp32s3", "esp32c3"):
        for variant in ("optimized", "ansi"):
            root = tmp_path_factory.mktemp(f"img-{chip}-{variant}")
            proj = make_project(root / "p", models_dir / "op_zoo.tflite", [x], chip=chip, variant=variant)
            out[(chip, variant)] = build_sim_firmware(proj, root / "b")
    return out


@pytest.fixture
def run(images) -> Iterator:
    names: list[tuple[serial.SerialBase, str]] = []

    def _run(
        query: str,
        chip: str = "esp32s3",
        variant: str = "optimized",
        name: str | None = None,
    ) -> bytes:
        name = name or f"f-{uuid.uuid4().hex[:12]}"
        url = f"sim://{name}?chip={chip}&emitter=c&{query}"
        port = serial.serial_for_url(url, baudrate=115200, timeout=0.2)
        names.append((port, name))
        port.board.program(images[(chip, variant)])
        port.dtr = False
        hard_reset(port, hold_delay=0.01)
        return read_until_end(port, idle=0.4)

    yield _run
    for port, name in names:
        port.close()
        remove_board(name)


def _outputs(raw: bytes) -> list[np.ndarray]:
    cap = parse_capture(raw)
    assert cap.valid, cap.problems
    return [t.data.reshape(-1) for t in cap.runs[0].outputs]


def test_corrupt_only_in_chosen_variant(run) -> None:
    clean = _outputs(run("", variant="optimized"))
    bad = run("fault=corrupt&variant_fault=optimized&corrupt_lsb=3&seed=7", variant="optimized")
    good = run("fault=corrupt&variant_fault=optimized&seed=7", variant="ansi")
    assert parse_capture(bad).info["sim_fault"] == "corrupt"
    assert "sim_fault" not in parse_capture(good).info
    for c, b, g in zip(clean, _outputs(bad), _outputs(good), strict=True):
        assert np.array_equal(c, g)
        diff = np.abs(b.astype(int) - c.astype(int))
        assert diff.max() == 3 and 0 < np.count_nonzero(diff) <= max(1, round(0.1 * c.size))


def test_pinned_outputs(run) -> None:
    for out in _outputs(run("fault=pinned")):
        assert (out == -128).all()


def test_xtensa_panic_has_backtrace_and_reboots(run) -> None:
    raw = run("fault=panic&loops=2", chip="esp32s3")
    assert b"Guru Meditation Error: Core  0 panic'ed (LoadProhibited)" in raw
    assert b"Backtrace: 0x" in raw and b"Rebooting..." in raw
    assert raw.count(b"rst:0xc (RTC_SW_CPU_RST)") == 1  # the reboot after the first panic
    cap = parse_capture(raw)
    assert not cap.valid and cap.end_status is None


def test_riscv_panic_has_mepc_and_stack_dump_no_backtrace(run) -> None:
    raw = run("fault=panic&loops=1", chip="esp32c3")
    assert b"Guru Meditation Error: Core  0 panic'ed (Load access fault)" in raw
    assert b"MEPC    : 0x" in raw and b"MTVAL   : 0x" in raw and b"Stack memory:" in raw
    assert b"Backtrace:" not in raw


def test_abort_brownout_bootloop(run) -> None:
    raw = run("fault=abort&loops=1")
    assert b"abort() was called at PC 0x" in raw and b"@EC1" in raw and b" END " not in raw
    raw = run("fault=brownout&loops=2")
    assert b"Brownout detector was triggered" in raw and b"rst:0xf (BROWNOUT_RST)" in raw
    raw = run("fault=bootloop&loops=3")
    assert raw.count(b"rst:") == 3 and b"@EC1" not in raw


def test_hang_is_silence_after_input(run) -> None:
    cap = parse_capture(run("fault=hang"))
    types = [r.type for r in cap.records]
    assert types[-1] == "INPUT" and "END" not in types and not cap.valid


def test_alloc_failure_is_an_error_record(run) -> None:
    cap = parse_capture(run("fault=alloc"))
    assert cap.end_status == "error"
    assert [(e.stage, e.msg) for e in cap.errors] == [("alloc", "AllocateTensors_failed")]


def test_truncated_output(run) -> None:
    raw = run("fault=truncate&seed=3")
    cap = parse_capture(raw)
    assert b"@EC1 0 BEGIN" in raw and not cap.complete and not cap.valid


def test_wdt_splice_keeps_records_valid(run) -> None:
    raw = run("fault=wdt&seed=5")
    spliced = [ln for ln in raw.split(b"\n") if b"@EC1" in ln and b"task_wdt" in ln]
    assert len(spliced) == 1
    cap = parse_capture(raw)
    assert cap.valid, cap.problems
    assert cap.warnings


def test_noise_is_seeded_and_detected(run) -> None:
    a = run("fault=noise&noise=0.001&seed=11")
    b = run("fault=noise&noise=0.001&seed=11")
    c = run("fault=noise&noise=0.001&seed=12")
    clean = run("fault=noise&noise=0")  # same INFO sim_fault line, no flips
    assert a == b != c
    assert a != clean and len(a) == len(clean)  # bit flips, no lost bytes
    assert not parse_capture(a).valid  # CRCs catch the flipped bits
    assert parse_capture(clean).valid


def test_disconnect_mid_run(images) -> None:
    name = f"d-{uuid.uuid4().hex[:12]}"
    port = serial.serial_for_url(
        f"sim://{name}?chip=esp32s3&emitter=c&fault=disconnect&seed=2", baudrate=115200, timeout=0.2
    )
    try:
        port.board.program(images[("esp32s3", "optimized")])
        port.dtr = False
        hard_reset(port, hold_delay=0.01)
        got = bytearray()
        with pytest.raises(serial.SerialException):
            for _ in range(1000):
                got += port.read(4096)  # what was buffered arrives, then the link is gone
        assert b"@EC1 0 BEGIN" in got and b" END " not in got
    finally:
        port.close()
        remove_board(name)


def test_first_sync_fails_then_connects(images) -> None:
    name = f"s-{uuid.uuid4().hex[:12]}"
    port = serial.serial_for_url(f"sim://{name}?chip=esp32s3&fault=sync_fail&fault_count=1", exclusive=True)
    try:
        classic_bootloader_reset(port, enter_boot_delay=0.02, reset_delay=0.05)
        with pytest.raises(FatalError):
            cmds.detect_chip(port, 115200, "no-reset", connect_attempts=1)
        port.open()  # esptool closed it after giving up
        classic_bootloader_reset(port, enter_boot_delay=0.02, reset_delay=0.05)
        assert cmds.detect_chip(port, 115200, "no-reset", connect_attempts=1).CHIP_NAME == "ESP32-S3"
    finally:
        port.close()
        remove_board(name)


def test_throttle_delivers_at_line_rate_and_intact(images) -> None:
    name = f"t-{uuid.uuid4().hex[:12]}"
    port = serial.serial_for_url(
        f"sim://{name}?chip=esp32s3&emitter=c&throttle=115200", baudrate=115200, timeout=0.2
    )
    try:
        port.board.program(images[("esp32s3", "optimized")])
        port.dtr = False
        hard_reset(port, hold_delay=0.01)
        port.timeout = 0
        first = port.read(1 << 20)  # what is on the wire right after the boot started
        port.timeout = 0.2
        rest = read_until_end(port)
        total = first + rest
        assert len(first) < len(total) // 2  # ~7 kB at 11.5 kB/s cannot all be there yet
        assert parse_capture(total).valid
    finally:
        port.close()
        remove_board(name)


def test_same_seed_same_stream(run) -> None:
    a = run("fault=truncate,wdt&seed=9")
    b = run("fault=truncate,wdt&seed=9")
    c = run("fault=truncate,wdt&seed=10")
    assert a == b != c


def test_fault_boots_makes_a_fault_transient(images) -> None:
    """fault_boots=1: the first app boot panics, the next one runs clean (a transient fault)."""
    name = f"fb-{uuid.uuid4().hex[:12]}"
    port = serial.serial_for_url(
        f"sim://{name}?chip=esp32s3&emitter=c&fault=panic&fault_boots=1", baudrate=115200, timeout=0.2
    )
    try:
        port.board.program(images[("esp32s3", "optimized")])
        port.dtr = False
        hard_reset(port, hold_delay=0.01)
        first = read_until_end(port, idle=0.4)
        assert b"Guru Meditation" in first
        assert not parse_capture(first).valid
        hard_reset(port, hold_delay=0.01)
        second = read_until_end(port, idle=0.4)
        assert b"Guru Meditation" not in second
        cap = parse_capture(second)
        assert cap.valid and cap.nn_mode == "optimized"
    finally:
        port.close()
        remove_board(name)


def test_a_crash_hits_the_same_place_on_every_reset(images) -> None:
    """A served C3 panic board reset three times by the host: the same MEPC, RA and stack every time (the
    crash is seeded by the image and the fault: a kernel bug faults where it faults). The old simulator
    seeded it with the boot number, so MEPC moved with every reset. Another image crashes elsewhere."""
    texts: dict[str, list[bytes]] = {}
    for variant in ("optimized", "ansi"):
        name = f"same-{uuid.uuid4().hex[:12]}"
        port = serial.serial_for_url(
            f"sim://{name}?chip=esp32c3&emitter=c&fault=panic&loops=1", baudrate=115200, timeout=0.2
        )
        try:
            port.board.program(images[("esp32c3", variant)])
            port.dtr = False
            for _ in range(3):
                hard_reset(port, hold_delay=0.01)
                raw = read_until_end(port, idle=0.4)
                start = raw.index(b"Guru Meditation")
                texts.setdefault(variant, []).append(raw[start : raw.index(b"Rebooting...", start)])
        finally:
            port.close()
            remove_board(name)
    for variant, crashes in texts.items():
        assert b"MEPC    : 0x" in crashes[0] and len(set(crashes)) == 1, (variant, crashes)
    assert texts["optimized"][0] != texts["ansi"][0]  # seeded by the image: its own kernel, its own stack


def test_a_negative_corrupt_lsb_at_the_dtype_minimum_moves_up_instead_of_raising() -> None:
    """corrupt with corrupt_lsb=-2: an element that -2 would take below the dtype's minimum moves +2
    instead, as one that +lsb would take above the maximum moves -lsb (the rule op_corrupt shares); it
    used to raise OverflowError and stop the simulated board."""
    from harness.sim.faults import parse_faults
    from harness.sim.resident import _apply_output_faults

    faults = parse_faults({"fault": "corrupt", "corrupt_lsb": "-2", "corrupt_frac": "1"})
    arr = np.array([-128, -127, 0, 127], dtype=np.int8)
    out = np.frombuffer(_apply_output_faults(arr, ["corrupt"], faults, 0, 0), dtype=np.int8)
    assert out.tolist() == [-126, -125, -2, 125]
