"""Host CPU of a repeat CLI run: ``esp-check flash-and-compare ... --board sim`` on a cached build.

Each run is a fresh ``esp-check`` process (``python -m harness.cli``, what the console script runs),
measured with ``os.wait4`` (the ``getrusage`` of that one child): user + system CPU seconds of that
process and its children (the host-reference child included). The first run warms everything a
repeat run finds warm on a user's machine: the build cache, the host-reference cache, the simulated
board's flash (kept in a flash file, so the repeat run's esptool session finds every region already
there) and Python's bytecode (under a private ``PYTHONPYCACHEPREFIX``, as pip's install has it).

By default the simulated board (``sim://``) runs inside the esp-check process, so its CPU (the ROM
loader, the model run by TFLM for the simulated firmware) is counted too: an upper bound of what
esp-check costs with a real board. ``--served`` puts the board in its own ``esp-check sim serve
--rfc2217`` process and measures esp-check alone, talking RFC 2217 as to a networked real board.
Prints the median of ``--repeat`` repeat runs, the spread, and wall time; nothing here asserts timing.

Usage: python bench/bench_host_cpu.py [--model M --input X] [--repeat 5] [--tree DIR]
(``--tree`` runs another checkout, e.g. ``git archive main | tar -x -C /tmp/main``, for a before/after.)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "tests" / "data" / "models"


def cpu_of(cmd: list[str], env: dict[str, str], cwd: str) -> tuple[float, float, int]:
    """(CPU seconds, wall seconds, exit code) of one child process and its own children."""
    t0 = time.perf_counter()
    with subprocess.Popen(  # -m: cwd is on sys.path
        cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    ) as proc:
        out = proc.stdout.read() if proc.stdout else b""
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        sys.stderr.write(out.decode(errors="replace")[-3000:])
        raise SystemExit(f"esp-check exited {proc.returncode}")
    return usage.ru_utime + usage.ru_stime, wall, proc.returncode


@contextlib.contextmanager
def served_board(env: dict[str, str], cwd: str, flash: Path) -> Iterator[str]:
    """``esp-check sim serve --rfc2217`` in its own process: its CPU is not the client's."""
    cmd = [
        sys.executable, "-m", "harness.cli", "sim", "serve", "--rfc2217", "--port", "0",
        "--name", f"cpu-{uuid.uuid4().hex[:8]}", "--flash", str(flash),
    ]  # fmt: skip
    with subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, text=True) as server:
        try:
            url = None
            for line in server.stdout or ():  # a banner, then "listening on rfc2217://HOST:PORT"
                url = next((w for w in line.split() if w.startswith("rfc2217://")), None)
                if url:
                    break
            if url is None:
                raise SystemExit("sim serve ended without saying where it listens")
            yield url
        finally:
            server.terminate()
            server.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(MODELS / "unet_mbv2_035_48.tflite"))
    ap.add_argument("--input", default=str(MODELS / "inputs" / "unet_mbv2_035_48.npy"))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--served",
        action="store_true",
        help="the board in its own process (sim serve --rfc2217): esp-check alone",
    )
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
        tree = str(Path(args.tree).resolve())
        with contextlib.ExitStack() as stack:
            if args.served:
                port = stack.enter_context(served_board(env, tree, tmp / "flash.bin"))
            else:
                port = f"sim://cpu-{uuid.uuid4().hex[:8]}?flash={tmp / 'flash.bin'}"
            cmd = [
                sys.executable, "-m", "harness.cli", "flash-and-compare", args.model, "--input", args.input,
                "--board", "sim", "--port", port, "--out", str(tmp / "out"),
            ]  # fmt: skip
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
