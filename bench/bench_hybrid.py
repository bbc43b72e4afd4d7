"""How `esp-check hybrid` does on the simulated U-Net 48: ops found, firmware runs, speedup kept.

Prints one row per scenario, measured in this run (the simulator's cycle model, not an ESP32):

    python bench/bench_hybrid.py

Nothing here asserts: the acceptance checks are tests/test_hybrid_flow.py.
"""

from __future__ import annotations

import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.flows.hybrid import HybridOptions, hybrid  # noqa: E402
from harness.flows.job import JobOptions  # noqa: E402
from harness.flows.records import StageTimeouts  # noqa: E402
from harness.model.hybrid_ops import candidate_ops  # noqa: E402
from harness.model.loader import load_model  # noqa: E402

MODEL = ROOT / "tests" / "data" / "models" / "unet_mbv2_035_48.tflite"
INPUT = ROOT / "tests" / "data" / "models" / "inputs" / "unet_mbv2_035_48.png"
SCENARIOS = [
    ("op_corrupt@4", "fault=op_corrupt&fault_op=4&variant_fault=optimized", False),
    ("op_corrupt@17", "fault=op_corrupt&fault_op=17&variant_fault=optimized", False),
    ("op_corrupt@27", "fault=op_corrupt&fault_op=27&variant_fault=optimized", False),
    ("op_corrupt@54", "fault=op_corrupt&fault_op=54&variant_fault=optimized", False),
    ("op_corrupt@4 --bisect", "fault=op_corrupt&fault_op=4&variant_fault=optimized", True),
    ("op_corrupt@17 --bisect", "fault=op_corrupt&fault_op=17&variant_fault=optimized", True),
    ("op_corrupt@27 --bisect", "fault=op_corrupt&fault_op=27&variant_fault=optimized", True),
    ("op_corrupt@54 --bisect", "fault=op_corrupt&fault_op=54&variant_fault=optimized", True),
    ("op_panic@33", "fault=op_panic&fault_op=33&variant_fault=optimized", False),
    ("op_corrupt@17,27", "fault=op_corrupt&fault_op=17,27&variant_fault=optimized", False),
    ("op_corrupt@17,27 --bisect", "fault=op_corrupt&fault_op=17,27&variant_fault=optimized", True),
]


def main() -> None:
    n = len(candidate_ops(load_model(MODEL)))
    bound = math.ceil(math.log2(n)) + 1
    print(f"U-Net 48: {n} switchable ops, bisection bound ceil(log2 {n})+1 = {bound} runs per culprit")
    head = f"{'scenario':28} {'ops on ANSI C':14} {'runs':>5} {'bisect per culprit':>19}"
    print(f"{head} {'kept %':>8} {'s':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for k, (name, query, bisect) in enumerate(SCENARIOS):
            t0 = time.monotonic()
            res = hybrid(
                MODEL,
                [INPUT],
                board="sim",
                port=f"sim://?{query}",
                out_dir=Path(tmp) / str(k),
                options=HybridOptions(bisect=bisect),
                job=JobOptions(
                    cache_dir=Path(tmp) / "cache", timeouts=StageTimeouts(capture_total=60, capture_silence=3)
                ),
            )
            per = res.bisection.runs_per_culprit() if res.bisection is not None else "-"
            kept = res.cost.get("speedup_kept_percent") if res.cost else None
            ops = ",".join(map(str, res.ansi_ops)) if res.offered else "not offered"
            secs = time.monotonic() - t0
            print(f"{name:28} {ops:14} {len(res.runs):5d} {per!s:>19} {kept!s:>8} {secs:6.1f}")


if __name__ == "__main__":
    main()
