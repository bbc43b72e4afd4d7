"""Run the esp-check CLI with the given arguments and write the names of every module it loaded.

``python bench/list_modules.py OUT.txt ARGS...``: used by bench_host_cpu.py (which modules a repeat run
imports) and tests/test_host_overhead.py (what a repeat run must not load).
"""

import atexit
import runpy
import sys
from pathlib import Path

out = Path(sys.argv.pop(1))
atexit.register(lambda: out.write_text("\n".join(sys.modules)))
sys.argv[0] = "esp-check"
runpy.run_module("harness.cli", run_name="__main__", alter_sys=True)
