"""Start-up time of the CLI: ``esp-check --version`` against ``esptool version`` in the same venv.

Both are the console scripts pip installed next to this Python (the esptool one is the reference a
user compares with); esp-check runs from this checkout (PYTHONPATH). Prints, side by side, the median
of --repeat runs of each: wall seconds and CPU seconds (user + system of that process, ``os.wait4``),
and their ratios; nothing here asserts timing.

Usage: python bench/bench_cli_startup.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _script(name: str) -> list[str]:
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} is not installed in this venv ({here})")
    return [found]


def _run(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one run of ``cmd``."""
    t0 = time.perf_counter()
    with subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc:
        err = proc.stderr.read() if proc.stderr else b""
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}: {err.decode(errors='replace')}")
    return time.perf_counter() - t0, usage.ru_utime + usage.ru_stime


def _medians(cmd: list[str], repeat: int, env: dict[str, str]) -> tuple[float, float]:
    _run(cmd, env)  # warm the file cache once
    runs = [_run(cmd, env) for _ in range(repeat)]
    return statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    # bytecode is written (as after pip install), to a private folder: a checkout's sources would
    # otherwise be compiled again by every run when PYTHONDONTWRITEBYTECODE is set
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
    with tempfile.TemporaryDirectory(prefix="bench-cli-startup-") as d:
        env["PYTHONPYCACHEPREFIX"] = d
        ours = _medians([*_script("esp-check"), "--version"], args.repeat, env)
        theirs = _medians([*_script("esptool"), "version"], args.repeat, env)
    print(f"median of {args.repeat} runs each   {'wall':>8} {'CPU':>8}")
    print(f"esp-check --version        {ours[0]:7.3f}s {ours[1]:7.3f}s")
    print(f"esptool version            {theirs[0]:7.3f}s {theirs[1]:7.3f}s")
    print(f"ratio esp-check / esptool  {ours[0] / theirs[0]:7.2f}x {ours[1] / theirs[1]:7.2f}x")
    print(f"load: {os.getloadavg()}")


if __name__ == "__main__":
    main()
