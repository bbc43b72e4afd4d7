"""Where the time goes when a board is flashed over RFC 2217 (a remote bench, ``esp-check sim serve``).

Serves a simulated ESP32-S3 with ``esp-check sim serve --rfc2217`` in its own process and measures,
in one run (nothing here asserts timing; medians of --repeat runs):

- pyserial's RFC 2217 client alone: open + close, one timeout change, one baud change, one DTR/RTS
  change (the per-operation costs every RFC 2217 client pays, whoever the server is), and a timeout
  change on esp-check's own client (``harness.device.ports.Rfc2217Serial``: none reaches the server);
- the esptool CLI as users run it: ``chip-id``, ``write-flash @flash_args`` of an esp-check build;
- esp-check's own flash (``DeviceSession.flash``: connect, stub, baud, attach, write, per stage) and
  capture over RFC 2217, and the same on a local ``sim://`` port (the simulator's own cost), with
  the ratio between them.

Usage: python bench/bench_rfc2217.py [--repeat 3] [--model tests/data/models/cnn_classifier_11.tflite]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import serial

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "tests" / "data" / "models"


def _median(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.monotonic()
        fn()
        times.append(time.monotonic() - t0)
    return statistics.median(times)


def _serve(extra: list[str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "sim", "serve", "--name", f"bench-{uuid.uuid4().hex[:6]}",
         "--port", "0", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    proc.stdout.readline()
    return proc, proc.stdout.readline().split()[-1]


def _build(model: Path, inp: Path, out: Path) -> object:
    from harness.firmware.build import build_project
    from harness.firmware.generate import generate_projects

    (proj,) = generate_projects(model, [inp], "sim", out_dir=out, variants=("optimized",))
    return build_project(proj.path, use_cache=False)


def _client_costs(url: str, repeat: int) -> dict[str, float]:
    def open_close() -> None:
        serial.serial_for_url(url, timeout=3).close()

    costs = {"pyserial rfc2217 open+close": _median(open_close, repeat)}
    port = serial.serial_for_url(url, timeout=3)  # the server has one client slot: open after that
    try:

        def timeout_change() -> None:
            port.timeout = 0.5 if port.timeout == 3 else 3

        def baud_change() -> None:
            port.baudrate = 460800 if port.baudrate == 115200 else 115200

        def line_change() -> None:
            port.dtr = not port.dtr

        costs["pyserial rfc2217 timeout change"] = _median(timeout_change, repeat)
        costs["pyserial rfc2217 baud change"] = _median(baud_change, repeat)
        costs["pyserial rfc2217 DTR change"] = _median(line_change, repeat)
    finally:
        port.close()
    from harness.device.ports import open_port

    ours = open_port(url, 115200)  # esp-check's client: a timeout change stays on this side
    try:

        def our_timeout_change() -> None:
            ours.timeout = 0.5 if ours.timeout == 3 else 3

        costs["esp-check rfc2217 timeout change"] = _median(our_timeout_change, repeat)
    finally:
        ours.close()
    return costs


def _esptool_cli(url: str, build: object, repeat: int) -> dict[str, float]:
    out_dir = build.flasher_args.parent  # type: ignore[attr-defined]

    def run(*args: str) -> None:
        subprocess.run([sys.executable, "-m", "esptool", "--port", url, *args], cwd=out_dir, check=True,
                       capture_output=True, timeout=300)  # fmt: skip

    return {
        "esptool CLI chip-id": _median(lambda: run("chip-id"), repeat),
        "esptool CLI write-flash @flash_args (921600)": _median(
            lambda: run("--baud", "921600", "write-flash", "@flash_args"), repeat
        ),
    }


def _ours(url: str, build: object, repeat: int) -> dict[str, float]:
    from harness.device.session import DeviceSession
    from harness.firmware.boards import load_board

    board = load_board("sim")
    stages: dict[str, list[float]] = defaultdict(list)
    for _ in range(repeat):
        marks: list[tuple[str, float]] = []
        t0 = time.monotonic()
        with DeviceSession(url, board) as dev:
            stages["open"].append(time.monotonic() - t0)
            t1 = time.monotonic()

            def progress(ev: object, t1: float = t1, marks: list[tuple[str, float]] = marks) -> None:
                stage = str(getattr(ev, "stage", ""))
                if not marks or marks[-1][0] != stage:
                    marks.append((stage, time.monotonic() - t1))

            dev.flash(build.flash_files(), progress=progress, skip_flashed=False)  # type: ignore[attr-defined]
            t2 = time.monotonic()
            stages["flash (total)"].append(t2 - t1)
            for (name, start), nxt in zip(marks, [*marks[1:], ("end", t2 - t1)], strict=True):
                stages[f"  flash: {name}"].append(nxt[1] - start)
            cap = dev.capture(total_timeout=60, silence_timeout=5)
            assert cap.ended_by == "end_record", cap.ended_by
            stages["capture (reset to END)"].append(time.monotonic() - t2)
    return {k: statistics.median(v) for k, v in stages.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--model", default=str(MODELS / "cnn_classifier_11.tflite"))
    args = ap.parse_args()
    model = Path(args.model)
    inp = MODELS / "inputs" / (model.stem + ".png")
    import harness.sim

    harness.sim.register()
    with tempfile.TemporaryDirectory() as tmp:
        build = _build(model, inp, Path(tmp) / "fw")
        proc, url = _serve(["--rfc2217"])
        try:
            rows = _client_costs(url, args.repeat)
            rows |= _esptool_cli(url, build, args.repeat)
            # what clients pay with esp_rfc2217_server's URL form (it never answers DTR/RTS requests)
            legacy = url + "?ign_set_control"
            old = _client_costs(legacy, 1) | _esptool_cli(legacy, build, 1)
            rows |= {f"{k} [?ign_set_control]": v for k, v in old.items()}
            remote = _ours(url, build, args.repeat)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
        local = _ours(f"sim://bench-local-{uuid.uuid4().hex[:6]}?flash_size=8MB", build, args.repeat)
    print(f"{'what':66s} {'seconds':>8s}")
    for name, sec in rows.items():
        print(f"{name:66s} {sec:8.2f}")
    print(f"\n{'esp-check (DeviceSession)':42s} {'rfc2217':>8s} {'sim://':>8s} {'ratio':>6s}")
    for name in remote:
        r, loc = remote[name], local.get(name, float("nan"))
        print(f"{name:42s} {r:8.2f} {loc:8.2f} {r / loc if loc else float('nan'):6.1f}")


if __name__ == "__main__":
    main()
