"""End-to-end ``flash-and-compare`` on the simulated board, throttled to a real UART rate.

Prints, measured in one run (nothing here asserts timing):
- time per stage, first run (cold build cache, empty flash) and second run (warm, same board);
- host-side overhead: wall time not explained by bytes on the link at the line rate;
- flash bytes written on the repeated run (goal: 0 for unchanged regions);
- link efficiency of the output records: tensor payload bytes / bytes of the DATA record lines.

Usage: python bench/bench_flow.py [--model tests/data/models/unet_mbv2_035_48.tflite] [--baud 921600]
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path

from simrun import stage_seconds

from harness.flows.flash_and_compare import flash_and_compare
from harness.flows.job import JobOptions
from harness.flows.records import StageTimeouts

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "tests" / "data" / "models"


def _link_stats(log: Path) -> tuple[int, int, int]:
    """(all bytes, bytes of DATA record lines, payload bytes carried by them)."""
    raw = log.read_bytes()
    data_line_bytes = payload = 0
    for line in raw.splitlines(keepends=True):
        m = re.search(rb"@EC1 \d+ DATA .*? b64=(\S+)", line)
        if m:
            data_line_bytes += len(line)
            b64 = m.group(1)
            payload += len(b64) * 3 // 4 - b64.count(b"=")
    return len(raw), data_line_bytes, payload


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(MODELS / "unet_mbv2_035_48.tflite"))
    ap.add_argument("--input", default=None)
    ap.add_argument("--baud", type=int, default=921600)
    args = ap.parse_args()
    model = Path(args.model)
    inp = Path(args.input) if args.input else MODELS / "inputs" / (model.stem + ".png")
    with tempfile.TemporaryDirectory() as tmp:
        port = f"sim://bench-flow?throttle={args.baud}"
        runs = []
        for k in (1, 2):
            t0 = time.monotonic()
            result = flash_and_compare(
                model,
                [inp],
                board="sim",
                port=port,
                out_dir=Path(tmp) / f"run{k}",
                options=JobOptions(
                    cache_dir=Path(tmp) / "cache",
                    flash_baud=args.baud,
                    timeouts=StageTimeouts(capture_total=600, capture_silence=60),
                ),
            )
            runs.append((time.monotonic() - t0, result))
        print(f"model {model.name}, input {inp.name}, simulated line rate {args.baud} baud")
        for k, (wall, result) in enumerate(runs, 1):
            st = stage_seconds(result)
            print(f"\nrun {k}: verdict {result.verdict}, wall {wall:.2f} s")
            for name, sec in sorted(st.items(), key=lambda kv: -kv[1]):
                print(f"  {name:<10} {sec:7.3f} s  ({sec / wall:5.1%})")
            link_s = 0.0
            written = 0
            for v, r in result.variants.items():
                total, data_bytes, payload = _link_stats(r.serial_log) if r.serial_log else (0, 0, 0)
                link_s += total * 10 / args.baud
                regions = r.flash["regions"] if r.flash else []
                w = sum(x["bytes_written"] for x in regions)
                written += w
                eff = payload / data_bytes if data_bytes else float("nan")
                print(
                    f"  {v:<9} serial {total} B, DATA lines {data_bytes} B carry {payload} B payload: "
                    f"link efficiency {eff:.1%}; flash written {w} B"
                )
            print(
                f"  capture link time at {args.baud} baud {link_s:.2f} s; host-side overhead "
                f"(wall - capture link time) {wall - link_s:.2f} s = {(wall - link_s) / wall:.0%} of wall"
            )
            print(f"  flash bytes written, both variants: {written}")
        (w1, _), (w2, _) = runs
        print(f"\nsecond run / first run wall time: {w2 / w1:.2f}")
        print(json.dumps({"first_wall_s": round(w1, 3), "second_wall_s": round(w2, 3)}))


if __name__ == "__main__":
    main()
