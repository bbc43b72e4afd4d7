"""Host CPU of a repeat CLI run: ``esp-check flash-and-compare ... --board sim`` on a cached build.

Each run is a fresh ``esp-check`` process (the console script a user runs), measured with
``resource.getrusage(RUSAGE_CHILDREN)`` around it: user + system CPU seconds of that process and its
children (the host-reference child included). The first run warms everything a repeat run finds
warm on a user's machine: the build cache, the host-reference cache, the simulated board's flash
(kept in a flash file, so the repeat run's esptool session finds every region already there) and
Python's bytecode (written under a private ``PYTHONPYCACHEPREFIX``, as pip's install would have it).

The simulated board runs inside the esp-check process, so its CPU is counted too: this is an upper
bound of what esp-check costs with a real board. Prints the median of ``--repeat`` repeat runs, the
spread, and wall time; nothing here asserts timing.

Usage: python bench/bench_host_cpu.py [--model M --input X] [--repeat 5] [--tree DIR]
(``--tree`` runs another checkout, e.g. ``git archive main | tar -x -C /tmp/main``, for a before/after.)
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "tests" / "data" / "models"


def cpu_of(cmd: list[str], env: dict[str, str], cwd: str) -> tuple[float, float, int]:
    """(CPU seconds, wall seconds, exit code) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, check=False)  # -m: cwd is on sys.path
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode not in (0, 1):
        sys.stderr.write(proc.stdout.decode(errors="replace")[-3000:] + proc.stderr.decode(errors="replace"))
        raise SystemExit(f"esp-check exited {proc.returncode}")
    return cpu, wall, proc.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(MODELS / "unet_mbv2_035_48.tflite"))
    ap.add_argument("--input", default=str(MODELS / "inputs" / "unet_mbv2_035_48.npy"))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tree", default=str(ROOT), help="the esp-check checkout to run (PYTHONPATH)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-host-cpu-") as d:
        tmp = Path(d)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(
            PYTHONPATH=str(Path(args.tree).resolve()),
            PYTHONPYCACHEPREFIX=str(tmp / "pycache"),
            ESP_CHECK_CACHE_DIR=os.environ.get("ESP_CHECK_CACHE_DIR", str(tmp / "cache")),
        )
        port = f"sim://cpu-{uuid.uuid4().hex[:8]}?flash={tmp / 'flash.bin'}"
        cmd = [
            sys.executable, "-m", "harness.cli", "flash-and-compare", args.model, "--input", args.input,
            "--board", "sim", "--port", port, "--out", str(tmp / "out"),
        ]  # fmt: skip
        tree = str(Path(args.tree).resolve())
        first = cpu_of(cmd, env, tree)
        runs = [cpu_of(cmd, env, tree) for _ in range(args.repeat)]
    cpus = [c for c, _, _ in runs]
    walls = [w for _, w, _ in runs]
    print(
        f"tree {args.tree}, model {Path(args.model).name}, host CPUs {os.cpu_count()}, load {os.getloadavg()}"
    )
    print(f"first run (warms caches): {first[0]:.2f} s CPU, {first[1]:.2f} s wall, exit {first[2]}")
    print(
        f"repeat run, median of {args.repeat}: {statistics.median(cpus):.2f} s CPU "
        f"(min {min(cpus):.2f}, max {max(cpus):.2f}), {statistics.median(walls):.2f} s wall "
        f"(goal: <= 0.50 s CPU)"
    )


if __name__ == "__main__":
    main()
