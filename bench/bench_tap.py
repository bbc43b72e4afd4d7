"""Benchmark: serial bytes and capture time that ``--tap`` adds on the UNet at 921600 baud.

Three firmwares of the optimized variant on the simulated board with its serial line throttled to
921600 baud (``sim://...?throttle=921600``): plain, ``--tap`` (per-op checksums only) and ``--tap``
with full dumps (every op's input and output tensors, ``--dump-ops`` all ops). Prints the bytes on the
wire, the capture time and both as ratios to the plain run, measured in this one run (no pass/fail).
The capture time includes the simulated boot; the invoke itself is modelled, so only the serial part
of the time says something about a real board.

Run: ``python bench/bench_tap.py [model.tflite input]`` (default: the 48x48 UNet fixture; the 128x128
model of the original report is tests/data/models/unet_mbv2_035_128.tflite).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from harness.firmware.boards import load_board
from harness.firmware.build import build_project
from harness.firmware.generate import generate_projects
from harness.flows.capture import flash_and_capture
from harness.flows.records import StageTimeouts
from harness.flows.targets import open_target
from harness.model.loader import load_model
from harness.sim import register

MODELS = Path(__file__).resolve().parents[1] / "tests" / "data" / "models"


def measure(model: Path, inp: Path, work: Path, mode: str) -> tuple[int, float, int]:
    info = load_model(model)
    dump = list(range(len(info.main_ops))) if mode == "full dumps" else []
    (proj,) = generate_projects(
        model, [inp], "sim", out_dir=work / mode / "projects", variants=("optimized",),
        tap=mode != "plain", dump_ops=dump,
    )  # fmt: skip
    build = build_project(proj.path, cache_dir=work / "cache", log_path=work / mode / "build.log")
    board = load_board("sim")
    port = f"sim://bench-{mode.replace(' ', '-')}?chip={board.chip}&throttle=921600"
    run, stages = flash_and_capture(
        build, open_target(board, port), work / mode, variant="optimized",
        timeouts=StageTimeouts(capture_total=900, capture_silence=60),
    )  # fmt: skip
    if not run.capture_valid or run.serial_log is None:
        raise SystemExit(f"{mode}: capture failed: {run.problems} {run.exit_code}")
    seconds = sum(s.seconds for s in stages if s.stage == "capture")
    data = run.serial_log.read_bytes()
    return len(data), seconds, int(proj.manifest.get("tap", {}).get("ram_bytes", 0))


def main() -> None:
    register()
    model = Path(sys.argv[1]) if len(sys.argv) > 2 else MODELS / "unet_mbv2_035_48.tflite"
    inp = Path(sys.argv[2]) if len(sys.argv) > 2 else MODELS / "inputs" / "unet_mbv2_035_48.png"
    with tempfile.TemporaryDirectory(prefix="bench-tap-") as tmp:
        rows = {mode: measure(model, inp, Path(tmp), mode) for mode in ("plain", "tap", "full dumps")}
    base_b, base_t, _ = rows["plain"]
    print(f"model {model.name}, optimized variant, simulated board, serial line 921600 baud")
    print("wire s = serial bytes x 10 bits / 921600 baud (the line time alone)")
    head = f"{'mode':<12} {'serial bytes':>13} {'x plain':>8} {'wire s':>8} {'capture s':>10} {'x plain':>8}"
    print(head + f" {'tap RAM B':>10}")
    for mode, (b, t, ram) in rows.items():
        wire = b * 10 / 921600
        print(f"{mode:<12} {b:>13} {b / base_b:>8.2f} {wire:>8.3f} {t:>10.2f} {t / base_t:>8.2f} {ram:>10}")


if __name__ == "__main__":
    main()
