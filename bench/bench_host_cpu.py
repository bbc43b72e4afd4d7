"""Host CPU of a repeat CLI run: ``esp-check flash-and-compare ... --board sim`` on a cached build.

Each run is a fresh ``esp-check`` process (``python -m harness.cli``, what the console script runs),
measured with ``os.wait4`` (the ``getrusage`` of that one child): user + system CPU seconds of that
process and its children (the host-reference child included). The first run warms everything a
repeat run finds warm on a user's machine: the build cache, the host-reference cache, the generated
projects (kept when nothing they are made of changed), the simulated board's flash (kept in a flash
file, so the repeat run skips esptool: the board's HELLO reports the images it holds) and Python's
bytecode (under a private ``PYTHONPYCACHEPREFIX``, as pip's install has it).

Two figures, both printed by default:

- **in-process board** (``sim://``): the simulated board runs inside the esp-check process, so its CPU
  (the ROM loader, the model run by TFLM for the simulated firmware) is counted too: an upper bound of
  what esp-check costs with a real board;
- **served board** (``--served``; the goal's figure): the board runs in its own ``esp-check sim serve
  --rfc2217`` process and esp-check talks RFC 2217 to it, as to a networked real board: esp-check alone.

Each figure is split into the interpreter's start (``python -c pass``), the imports (a fresh Python
importing, in the same order, every module the repeat run had loaded when it exited) and the rest (the
run's own work). ``--tree`` may be given twice (e.g. ``git archive main | tar -x -C /tmp/main``): both
checkouts are then measured side by side, their repeat runs alternating, and the ratio is printed.
Prints medians of ``--repeat`` runs, the spread and wall time; nothing here asserts timing.

Usage: python bench/bench_host_cpu.py [--model M --input X] [--repeat 5] [--mode both|in-process|served]
       [--tree DIR [--tree DIR2]]
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


LIST_MODULES = str(Path(__file__).with_name("list_modules.py"))  # writes what a CLI run loaded
_IMPORT_ALL = (
    "import importlib, sys\n"
    "for name in open(sys.argv[1]).read().split():\n"
    "    try:\n"
    "        importlib.import_module(name)\n"
    "    except Exception:\n"
    "        pass\n"
)


def _median_cpu(cmd: list[str], env: dict[str, str], cwd: str, repeat: int) -> float:
    return statistics.median(cpu_of(cmd, env, cwd)[0] for _ in range(repeat))


class Setup:
    """One checkout's repeat run: its command line, environment and scratch folder."""

    def __init__(self, tree: str, tmp: Path, port: str, model: str, inputs: str) -> None:
        self.tree, self.tmp = str(Path(tree).resolve()), tmp
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        self.env.update(
            PYTHONPATH=self.tree,
            PYTHONPYCACHEPREFIX=str(tmp / "pycache"),
            ESP_CHECK_CACHE_DIR=os.environ.get("ESP_CHECK_CACHE_DIR", str(tmp / "cache")),
        )
        self.args = [
            "flash-and-compare", model, "--input", inputs, "--board", "sim", "--port", port,
            "--out", str(tmp / "out"),
        ]  # fmt: skip
        self.cmd = [sys.executable, "-m", "harness.cli", *self.args]

    def split(self, repeat: int) -> tuple[float, float, int]:
        """(interpreter start, imports of what the run loaded, how many modules) in CPU seconds."""
        listed = self.tmp / "modules.txt"
        lister = [sys.executable, LIST_MODULES, str(listed), *self.args]
        cpu_of(lister, self.env, self.tree)
        start = _median_cpu([sys.executable, "-c", "pass"], self.env, self.tree, repeat)
        imports = _median_cpu([sys.executable, "-c", _IMPORT_ALL, str(listed)], self.env, self.tree, repeat)
        return start, imports - start, len(listed.read_text().split())


def measure(trees: list[str], served: bool, args: argparse.Namespace, tmp: Path) -> None:
    """Warm each tree, alternate their repeat runs, print each one's figures (and the ratio)."""
    with contextlib.ExitStack() as stack:
        setups = []
        for k, tree in enumerate(trees):
            d = tmp / f"{'served' if served else 'inproc'}-{k}"
            d.mkdir(parents=True)
            env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
            if served:
                port = stack.enter_context(served_board(env, str(Path(tree).resolve()), d / "flash.bin"))
            else:
                port = f"sim://cpu-{uuid.uuid4().hex[:8]}?flash={d / 'flash.bin'}"
            setups.append(Setup(tree, d, port, args.model, args.input))
        firsts = [cpu_of(s.cmd, s.env, s.tree) for s in setups]
        runs: list[list[tuple[float, float, int]]] = [[] for _ in setups]
        for _ in range(args.repeat):
            for s, got in zip(setups, runs, strict=True):
                got.append(cpu_of(s.cmd, s.env, s.tree))
        splits = [s.split(args.repeat) for s in setups]
    board = "served board (sim serve --rfc2217: esp-check alone)" if served else "in-process board (sim://)"
    medians = []
    for s, first, got, (start, imports, n) in zip(setups, firsts, runs, splits, strict=True):
        cpus, walls = [c for c, _, _ in got], [w for _, w, _ in got]
        med = statistics.median(cpus)
        medians.append(med)
        print(f"{board}, tree {s.tree}")
        print(f"  first run (warms caches): {first[0]:.2f} s CPU, {first[1]:.2f} s wall, exit {first[2]}")
        spread = f"min {min(cpus):.2f}, max {max(cpus):.2f}"
        print(
            f"  repeat run, median of {args.repeat}: {med:.2f} s CPU ({spread}), "
            f"{statistics.median(walls):.2f} s wall (goal: <= 0.50 s CPU, served)"
        )
        print(
            f"  of it: interpreter start {start:.2f} s, imports {imports:.2f} s ({n} modules), "
            f"the run's own work {med - start - imports:.2f} s"
        )
    if len(medians) == 2:
        print(f"  ratio second / first tree: {medians[1] / medians[0]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(MODELS / "unet_mbv2_035_48.tflite"))
    ap.add_argument("--input", default=str(MODELS / "inputs" / "unet_mbv2_035_48.npy"))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--mode", choices=("both", "in-process", "served"), default="both")
    ap.add_argument("--served", action="store_true", help="the same as --mode served")
    ap.add_argument(
        "--tree", action="append", help="an esp-check checkout to run (PYTHONPATH); twice: side by side"
    )
    args = ap.parse_args()
    trees = args.tree or [str(ROOT)]
    if len(trees) > 2:
        ap.error("--tree: one or two checkouts")
    mode = "served" if args.served else args.mode
    print(f"model {Path(args.model).name}, host CPUs {os.cpu_count()}, load {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="bench-host-cpu-") as d:
        for served in {"both": (False, True), "in-process": (False,), "served": (True,)}[mode]:
            measure(trees, served, args, Path(d))
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
