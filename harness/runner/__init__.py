"""Hardware-in-the-loop CI runner: ``esp-check run PLAN.toml --inventory BENCH.toml``.

Public surface: ``__all__`` below (docs/architecture.md "Public functions").

Format of the files and of the reports: docs/ci.md.
"""

from __future__ import annotations

from harness.runner.executor import RunOptions, RunResult, run_plan
from harness.runner.inventory import BenchBoard, Inventory, detect_devices, inventory_snippet, load_inventory
from harness.runner.plan import Job, Plan, load_plan
from harness.runner.reports import summary_dict, write_reports

__all__ = [
    "BenchBoard",
    "Inventory",
    "Job",
    "Plan",
    "RunOptions",
    "RunResult",
    "detect_devices",
    "inventory_snippet",
    "load_inventory",
    "load_plan",
    "run_plan",
    "summary_dict",
    "write_reports",
]
