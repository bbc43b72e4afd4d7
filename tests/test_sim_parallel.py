"""Several simulated boards used at once from threads: real esptool flashing + boot on each.

Faked: the boards (harness.sim).
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import numpy as np
import pytest
import serial
from esp_pylib.serial_reset import classic_bootloader_reset
from esptool import cmds
from esptool.util import FatalError
from sim_helpers import HANG_S, make_project, read_until_end

import harness.sim as sim
from harness.protocol.capture import parse_capture
from harness.sim.board import get_board, remove_board
from harness.sim.image import build_sim_firmware

sim.register()
pytestmark = pytest.mark.needs_cc


def test_three_boards_in_parallel_threads(tmp_path: Path, models_dir: Path) -> None:
    x = np.load(models_dir / "inputs" / "op_zoo.q.npy")
    jobs = [("esp32", "optimized"), ("esp32s3", "ansi"), ("esp32c3", "optimized")]
    files = {}
    for chip, variant in jobs:
        model = models_dir / "op_zoo.tflite"
        proj = make_project(tmp_path / f"p-{chip}", model, [x], chip=chip, variant=variant)
        files[chip] = build_sim_firmware(proj, tmp_path / f"b-{chip}")
    results: dict[str, bytes] = {}
    errors: list[BaseException] = []
    names = {chip: f"par-{chip}-{uuid.uuid4().hex[:8]}" for chip, _ in jobs}
    barrier = threading.Barrier(len(jobs))

    def worker(chip: str) -> None:
        try:
            port = serial.serial_for_url(f"sim://{names[chip]}?chip={chip}&emitter=c", exclusive=True)
            barrier.wait(timeout=HANG_S)
            for attempt in range(3):  # re-reset on a failed sync, as esptool's connect loop does
                classic_bootloader_reset(port, enter_boot_delay=0.02, reset_delay=0.05)
                try:
                    esp = cmds.detect_chip(port, 115200, "no-reset", connect_attempts=2)
                    break
                except FatalError:
                    if attempt == 2:
                        raise
                    port.open()
            esp = cmds.run_stub(esp)
            esp.change_baud(921600)
            cmds.attach_flash(esp)
            cmds.write_flash(esp, [(o, str(p)) for o, p in files[chip]], skip_flashed=True)
            esp.hard_reset()
            port.baudrate = 115200
            results[chip] = read_until_end(port)
            port.close()
        except BaseException as exc:  # collected and re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(chip,)) for chip, _ in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    try:
        assert not errors, errors
        for chip, variant in jobs:
            cap = parse_capture(results[chip])
            assert cap.valid, (chip, cap.problems)
            assert cap.info["chip"] == chip
            assert cap.nn_mode == ("optimized" if variant == "optimized" else "ansi_c")
            assert get_board(names[chip]).flash_bytes_written > 0
    finally:
        for name in names.values():
            remove_board(name)
