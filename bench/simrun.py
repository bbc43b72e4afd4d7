"""What the benches share: a timed flash-and-compare on a throttled ``sim://`` port (bench_resident.py,
bench_time_model.py) and a result's seconds per stage (and bench_flow.py)."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

from harness.flows.flash_and_compare import flash_and_compare
from harness.flows.job import JobOptions
from harness.flows.records import FlashAndCompareResult, StageTimeouts


def timed_run(
    tmp: Path, tag: str, model: Path, inputs: list[Path], port: str, baud: int, **options: object
) -> tuple[float, FlashAndCompareResult]:
    """Wall seconds and result of one job into ``tmp/tag`` (build cache ``tmp/cache``); ``options`` are
    further JobOptions fields. A run that did not match is printed, never hidden."""
    t0 = time.monotonic()
    res = flash_and_compare(
        model,
        inputs,
        board="sim",
        port=port,
        out_dir=tmp / tag,
        options=JobOptions(
            cache_dir=tmp / "cache",
            flash_baud=baud,
            timeouts=StageTimeouts(capture_total=3600, capture_silence=120),
        ).replace(**options),
    )
    wall = time.monotonic() - t0
    if res.exit_code != 0:
        print(f"  !! {tag}: exit {res.exit_code} {res.errors[:2]}")
    return wall, res


def stage_seconds(result: FlashAndCompareResult) -> dict[str, float]:
    """Seconds per stage name, summed over the variants."""
    out: dict[str, float] = defaultdict(float)
    for s in result.stages:
        out[s.stage] += s.seconds
    return dict(out)
