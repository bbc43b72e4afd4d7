"""Soak benchmark for ``esp-check run``: many jobs over 4 simulated boards with transient faults.

What it does (nothing here asserts; it prints numbers measured in this one run):

1. writes a plan of N one-model jobs (default 200; models alternate between the two fastest fixture
   models, one input each) and an inventory of 4 simulated boards (``sim://``, output throttled to a
   real UART rate so a board spends its time on the link, as real hardware does);
2. injects faults through ``RunOptions.port_override`` (the board is the only thing faked):
   - transient infrastructure faults on ``--fault-rate`` (5%) of all attempts, chosen by a seeded RNG
     among disconnect / truncated output / bit noise: these must be retried into the right verdict;
   - every 10th job is a known-bad job whose optimized variant corrupts outputs (expected: mismatch),
     every 25th one whose optimized variant panics (expected: firmware fault), on every attempt;
3. runs the plan on 4 boards, then the same jobs on 1 board (same fault rate, warm build cache);
   with ``--cold``, each of the two first runs on empty caches (build cache, host-reference cache,
   the simulated boards' protocol library: a fresh ``ESP_CHECK_CACHE_DIR``) and again warm, side by
   side: cold 4, warm 4, cold 1, warm 1;
4. reports completed jobs, wrong verdicts (goal 0), lost artifacts (goal 0: every attempt has its
   attempt.json and every serial log it names exists), retries, and throughput relative to 1 board.

Usage: python bench/bench_soak.py [--jobs 200] [--fault-rate 0.05] [--throttle 115200] [--skip-baseline]
       [--cold]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import threading
import time
import uuid
from pathlib import Path

from harness.runner import RunOptions, load_inventory, load_plan, run_plan

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "tests" / "data" / "models"
FAST_MODELS = ("cnn_classifier_11", "op_zoo")
TRANSIENT = ("disconnect", "truncate", "noise")


def expected_verdict(i: int) -> str:
    if i % 25 == 24:
        return "firmware_fault"
    if i % 10 == 9:
        return "mismatch"
    return "match"


def write_plan(path: Path, n: int) -> None:
    parts = [
        "[run]\nbackoff_s = 0.05\nbackoff_max_s = 0.5\nquarantine_after = 4\n",
        '[defaults]\nboards = ["sim"]\nretries = 4\n'
        'comparisons = ["optimized-vs-ansi", "each-vs-host"]\n'
        "timeouts = { capture_total = 60, capture_silence = 5 }\n",
    ]
    for i in range(n):
        m = FAST_MODELS[i % len(FAST_MODELS)]
        parts.append(
            f'[[job]]\nname = "job{i:03d}"\nmodels = ["{MODELS / (m + ".tflite")}"]\n'
            f'inputs = ["{MODELS / "inputs" / (m + ".npy")}"]\n'
        )
    path.write_text("\n".join(parts))


def write_inventory(path: Path, boards: int, throttle: int) -> None:
    run = uuid.uuid4().hex[:6]
    q = f"?emitter=c&throttle={throttle}" if throttle else "?emitter=c"
    entries = [
        f'[[board]]\nname = "soak{k}"\ntype = "sim"\nport = "sim://soak-{run}-{k}{q}"\n'
        for k in range(boards)
    ]
    path.write_text("\n".join(entries))


class FaultInjector:
    """Transient faults on a share of attempts; permanent findings on the known-bad jobs."""

    def __init__(self, rate: float, seed: int) -> None:
        self.rate = rate
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.injected = 0

    def __call__(self, board, url: str, attempt: int, task: str) -> str | None:
        i = int(task.split("/")[0][3:])
        extra = []
        want = expected_verdict(i)
        if want == "mismatch":
            extra.append("fault=corrupt&variant_fault=optimized")
        elif want == "firmware_fault":
            extra.append("fault=panic&variant_fault=optimized")
        with self.lock:  # one draw per attempt
            hit = self.rng.random() < self.rate
            kind = self.rng.choice(TRANSIENT)
            seed = self.rng.randrange(1 << 30)
        if hit:
            self.injected += 1
            if extra:  # keep the finding, add the transient fault on top (same fault= list)
                name = "corrupt" if want == "mismatch" else "panic"
                extra = [f"fault={name},{kind}&variant_fault=optimized&noise=0.002&seed={seed}"]
            else:
                extra.append(f"fault={kind}&noise=0.002&seed={seed}")
        return url + "&" + "&".join(extra) if extra else None


def lost_artifacts(doc: dict) -> list[str]:
    lost = []
    for t in doc["tasks"]:
        if not (Path(t["artifact_dir"]) / "result.json").exists():
            lost.append(f"{t['id']}: result.json")
        for a in t["attempts"]:
            if a["dir"] and not (Path(a["dir"]) / "attempt.json").exists():
                lost.append(f"{t['id']} attempt {a['n']}: attempt.json")
            for v, o in a["variants"].items():
                if o["serial_log"] and not Path(o["serial_log"]).exists():
                    lost.append(f"{t['id']} attempt {a['n']} {v}: serial log")
    return lost


def soak(
    tmp: Path, n: int, boards: int, rate: float, throttle: int, seed: int, cache: Path, label: str = ""
) -> dict:
    tag = f"{boards}b{label}"
    plan, inv = tmp / f"plan-{tag}.toml", tmp / f"bench-{tag}.toml"
    write_plan(plan, n)
    write_inventory(inv, boards, throttle)
    inject = FaultInjector(rate, seed)
    out = tmp / f"out-{tag}"
    t0 = time.monotonic()
    run_plan(
        load_plan(plan),
        load_inventory(inv),
        RunOptions(out_dir=out, lock_dir=tmp / "locks", cache_dir=cache, port_override=inject),
    )
    wall = time.monotonic() - t0
    doc = json.loads((out / "summary.json").read_text())
    wrong = [
        (t["id"], expected_verdict(int(t["job"][3:])), t["verdict"])
        for t in doc["tasks"]
        if t["verdict"] != expected_verdict(int(t["job"][3:]))
    ]
    return {
        "boards": boards,
        "label": label,
        "jobs": n,
        "completed": sum(
            1 for t in doc["tasks"] if t["state"] == "done" and t["verdict"] != "infrastructure_error"
        ),
        "wrong_verdicts": wrong,
        "lost_artifacts": lost_artifacts(doc),
        "attempts": doc["counts"]["attempts"],
        "retries": doc["counts"]["retries"],
        "faults_injected": inject.injected,
        "quarantined": [b["name"] for b in doc["boards"] if b["status"] != "ok"],
        "wall_s": wall,
        "jobs_per_min": 60.0 * n / wall,
        "verdicts": {
            k: doc["counts"][k] for k in ("match", "mismatch", "firmware_fault", "infrastructure_error")
        },
    }


def cold_and_warm(tmp: Path, args: argparse.Namespace) -> list[dict]:
    """Cold then warm on 4 boards, cold then warm on 1: each cold run on its own empty cache root."""
    results = []
    for k, boards in enumerate((args.boards, 1)):
        root = tmp / f"cache-{boards}b"
        old = os.environ.get("ESP_CHECK_CACHE_DIR")
        os.environ["ESP_CHECK_CACHE_DIR"] = str(root)  # host references, the protocol library
        try:
            for label in (" cold", " warm"):
                seed = args.seed + 2 * k
                results.append(
                    soak(tmp, args.jobs, boards, args.fault_rate, args.throttle, seed, root / "build", label)
                )
        finally:
            if old is None:
                os.environ.pop("ESP_CHECK_CACHE_DIR", None)
            else:
                os.environ["ESP_CHECK_CACHE_DIR"] = old
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--boards", type=int, default=4)
    ap.add_argument("--fault-rate", type=float, default=0.05)
    ap.add_argument("--throttle", type=int, default=115200, help="board output line rate (0: unthrottled)")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--skip-baseline", action="store_true", help="do not run the same jobs on one board")
    ap.add_argument("--cold", action="store_true", help="cold and warm runs side by side (4 runs)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        cache = tmp / "cache"
        if args.cold:
            results = cold_and_warm(tmp, args)
        else:
            results = [soak(tmp, args.jobs, args.boards, args.fault_rate, args.throttle, args.seed, cache)]
            if not args.skip_baseline:
                results.append(soak(tmp, args.jobs, 1, args.fault_rate, args.throttle, args.seed + 1, cache))
    for r in results:
        print(
            f"{r['boards']} board(s){r['label']}: {r['completed']}/{r['jobs']} jobs completed, "
            f"wrong verdicts {len(r['wrong_verdicts'])}, lost artifacts {len(r['lost_artifacts'])}, "
            f"{r['faults_injected']} transient faults injected, {r['retries']} retries, "
            f"{r['attempts']} attempts, quarantined {r['quarantined'] or 'none'}, "
            f"{r['wall_s']:.1f} s ({r['jobs_per_min']:.1f} jobs/min), verdicts {r['verdicts']}"
        )
        for w in r["wrong_verdicts"][:10]:
            print("  WRONG:", w)
        for lost in r["lost_artifacts"][:10]:
            print("  LOST:", lost)
    cpus, load = os.cpu_count(), os.getloadavg()
    if len(results) == 4:
        for i, label in ((0, "cold"), (1, "warm")):
            ratio = results[i]["jobs_per_min"] / results[i + 2]["jobs_per_min"]
            print(
                f"throughput {args.boards} boards / 1 board, {label}: {ratio:.2f}x (CPUs {cpus}, load {load})"
            )
    elif len(results) == 2:
        print(
            f"throughput {results[0]['boards']} boards / 1 board: "
            f"{results[0]['jobs_per_min'] / results[1]['jobs_per_min']:.2f}x "
            f"(1-board run had a warm build cache; host has {cpus} CPUs, load {load})"
        )


if __name__ == "__main__":
    main()
