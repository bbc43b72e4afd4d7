"""Kernel-sweep throughput and coverage (docs/sweep.md): cases per second, coverage per kernel and class.

    python bench/bench_sweep.py --espnn DIR [--tflm DIR] [--cases N] [--op conv ...] [--no-sanitize]

Without --espnn it sweeps the stand-in component tree of the tests (max pool only, no reference), so it
runs anywhere a host compiler and CMake are. Prints what one run measured; asserts nothing.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from harness.analysis.sweep_cases import OPS
from harness.flows.sweep import SweepOptions, sweep

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "data" / "native_components" / "esp-nn"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--espnn", type=Path, default=FIXTURE)
    ap.add_argument("--tflm", type=Path, default=None)
    ap.add_argument("--cases", type=int, default=500)
    ap.add_argument("--op", action="append", choices=list(OPS))
    ap.add_argument("--no-sanitize", action="store_true")
    args = ap.parse_args()
    ops = tuple(args.op or (["max_pool"] if args.espnn == FIXTURE else OPS))
    with tempfile.TemporaryDirectory() as tmp:
        r = sweep(
            SweepOptions(
                ops=ops,
                cases_per_op=args.cases,
                espnn_dir=args.espnn,
                tflm_dir=args.tflm,
                sanitize=not args.no_sanitize,
            ),
            tmp,
        )
    print(
        f"{r.cases} cases in {r.seconds:.2f} s: {r.cases_per_second:.0f} cases/s "
        f"({'ASan+UBSan' if not args.no_sanitize else 'plain'}; reference "
        f"{'compiled' if r.reference else 'absent'})"
    )
    print(f"{'op':<16}{'class':<34}{'cases':>6}{'opt/ANSI':>9}{'ANSI/ANSI':>10}{'vs ref':>8}{'absent':>8}")
    for row in r.coverage:
        print(
            f"{row['op']:<16}{row['class']:<34}{row['cases']:>6}{row['opt_vs_ansi']:>9}"
            f"{row['ansi_vs_ansi']:>10}{row['vs_reference']:>8}{row['absent']:>8}"
        )
    print(f"findings: {len(r.findings)} group(s); exit code {r.exit_code}")


if __name__ == "__main__":
    main()
