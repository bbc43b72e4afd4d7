"""Start-up time of the CLI: ``esp-check --version`` against ``esptool version`` in the same venv.

Both are the console scripts pip installed next to this Python (the esptool one is the reference a
user compares with); esp-check runs from this checkout (PYTHONPATH). Prints the median of --repeat
runs of each and their ratio; nothing here asserts timing.

Usage: python bench/bench_cli_startup.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _script(name: str) -> list[str]:
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} is not installed in this venv ({here})")
    return [found]


def _median_s(cmd: list[str], repeat: int, env: dict[str, str]) -> float:
    subprocess.run(cmd, env=env, capture_output=True, check=True)  # warm the file cache once
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, capture_output=True, check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))),
    }
    ours = _median_s([*_script("esp-check"), "--version"], args.repeat, env)
    theirs = _median_s([*_script("esptool"), "version"], args.repeat, env)
    print(f"esp-check --version  median of {args.repeat}: {ours:.3f} s")
    print(f"esptool version      median of {args.repeat}: {theirs:.3f} s")
    print(f"ratio esp-check / esptool: {ours / theirs:.2f}x")


if __name__ == "__main__":
    main()
