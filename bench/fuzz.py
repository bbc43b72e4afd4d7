"""Long fuzz runs of esp-check's parsers through its real CLI; prints what the mutants got.

    python bench/fuzz.py --captures 5000 --legacy 1000 --models 1000 --seed 1
    python bench/fuzz.py --replay model 17 --seed 1      # one mutant again, with esp-check's message
    python bench/fuzz.py --captures 0 --legacy 0 --models 0 --frames 1000   # resident-loop tampering

``--frames``: each trial is a dataset run on a served simulated board (clean, or with corrupt optimized
kernels) through a man in the middle that damages, drops, reorders, replays across boots or forges
one thing in the frame stream (tests/tamper.py); a false match or an exit code of the wrong class counts
as an offending trial.

Mutants and the oracle are in tests/fuzzing.py (shared with the bounded CI test tests/test_fuzz.py).
The mutants run in a worker process that notes each mutant before running it, so a crash of the
esp-check process itself (a signal) or a hang is attributed to its mutant and the run goes on with
the next one. A crash contained in the host-reference child (exit 2, "crashes TFLM's reference
interpreter") is counted apart: it is the designed outcome, not an esp-check crash.

Printed: per target a histogram of exit codes, false matches (exit 0 although the evidence differs),
crashes (signal / exit 70 / hang in the esp-check process), contained reference crashes, mutants
per second; then the first offending mutants with the command to replay them.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

WORKER_STALL_S = 600  # no progress for this long: the mutant in flight hangs
WORKER_MEMORY = 6 * 1024**3


def _worker(target: str, start: int, end: int, seed: int, log: Path) -> int:
    import resource

    import fuzzing

    # esp-check in this process may not take the machine down: past this it gets MemoryError (exit 70)
    resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY, WORKER_MEMORY))

    if target == "frames":
        return _frames_worker(start, end, seed, log)
    captures, legacy, models = fuzzing.load_bases()
    run = {
        "capture": lambda k, d: fuzzing.capture_mutant(seed, k, captures, d),
        "legacy": lambda k, d: fuzzing.legacy_mutant(seed, k, legacy, d),
        "model": lambda k, d: fuzzing.model_mutant(seed, k, models, d),
    }[target]
    with open(log, "a", encoding="utf-8") as f, tempfile.TemporaryDirectory() as tmp:
        for k in range(start, end):
            f.write(json.dumps({"begin": k}) + "\n")
            f.flush()
            o = run(k, Path(tmp))
            f.write(json.dumps({"k": k, **{key: getattr(o, key) for key in (
                "mutation", "code", "false_match", "contained_crash", "detail")}}) + "\n")  # fmt: skip
            f.flush()
    return 0


def _frames_worker(start: int, end: int, seed: int, log: Path) -> int:
    import shutil

    import tamper

    servers = tamper.Servers()
    try:
        with open(log, "a", encoding="utf-8") as f, tempfile.TemporaryDirectory() as tmp:
            for k in range(start, end):
                f.write(json.dumps({"begin": k}) + "\n")
                f.flush()
                doc = tamper.fuzz_trial(seed, k, tmp, servers)
                f.write(json.dumps({"k": k, **doc}) + "\n")
                f.flush()
                shutil.rmtree(Path(tmp) / f"t{k}", ignore_errors=True)
    finally:
        servers.close()
    return 0


def _run_target(target: str, n: int, seed: int, workdir: Path) -> list[dict[str, object]]:
    """All mutants of one target, restarting the worker after a crash or a hang."""
    log = workdir / f"{target}.jsonl"
    env = dict(os.environ, ESP_CHECK_CACHE_DIR=str(workdir / "cache"))
    results: dict[int, dict[str, object]] = {}
    start = 0
    while start < n:
        cmd = [sys.executable, __file__, "--worker", target, str(start), str(n), str(seed), str(log)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        size, last_progress = -1, time.monotonic()
        while proc.poll() is None:
            time.sleep(0.5)
            now_size = log.stat().st_size if log.exists() else 0
            if now_size != size:
                size, last_progress = now_size, time.monotonic()
            elif time.monotonic() - last_progress > WORKER_STALL_S:
                proc.kill()
        proc.wait()
        in_flight = None
        for line in log.read_text(encoding="utf-8").splitlines():
            doc = json.loads(line)
            if "begin" in doc:
                in_flight = doc["begin"]
            else:
                results[int(doc["k"])] = doc
                in_flight = None
        if in_flight is not None and in_flight not in results:
            why = (
                "hang (no progress)"
                if proc.returncode == -9
                else f"esp-check process died: exit {proc.returncode}"
            )
            tail = (proc.stderr.read() if proc.stderr else "")[-400:]
            results[in_flight] = {"k": in_flight, "mutation": "?", "code": None, "false_match": False,
                                  "contained_crash": False, "detail": f"{why} {tail}"}  # fmt: skip
        done = max(results) + 1 if results else 0
        if proc.returncode != 0 and done == start:
            raise SystemExit(f"the {target} worker cannot start: {proc.stderr.read() if proc.stderr else ''}")
        start = done
    return [results[k] for k in sorted(results)]


def _report(target: str, results: list[dict[str, object]], seconds: float, seed: int) -> int:
    codes = collections.Counter("hang/crash" if r["code"] is None else str(r["code"]) for r in results)
    false = [r for r in results if r["false_match"]]
    crashes = [r for r in results if r["code"] is None or r["code"] == 70]
    contained = sum(1 for r in results if r["contained_crash"])
    print(
        f"\n{target}: {len(results)} mutants in {seconds:.0f} s ({len(results) / max(seconds, 1e-9):.1f}/s)"
    )
    print("  exit codes: " + ", ".join(f"{c}: {codes[c]}" for c in sorted(codes)))
    print(f"  false matches: {len(false)}   crashes (signal/hang/exit 70): {len(crashes)}   "
          f"reference crashes contained in the child (exit 2): {contained}")  # fmt: skip
    late = [r for r in results if r["contained_crash"] and "inspect ok" in str(r["mutation"])]
    if target == "model":
        print(f"  accepted by inspect, then crashed the reference child: {len(late)}")
    for r in (false + crashes + late)[:10]:
        print(f"  ! mutant {r['k']} ({r['mutation']}): exit {r['code']} false_match={r['false_match']}")
        print(f"    {str(r['detail']).strip()[-300:]!r}")
        print(f"    replay: python bench/fuzz.py --replay {target} {r['k']} --seed {seed}")
    return len(false) + len(crashes)


def _replay(target: str, k: int, seed: int) -> int:
    import fuzzing

    captures, legacy, models = fuzzing.load_bases()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        o = {
            "capture": lambda: fuzzing.capture_mutant(seed, k, captures, d),
            "legacy": lambda: fuzzing.legacy_mutant(seed, k, legacy, d),
            "model": lambda: fuzzing.model_mutant(seed, k, models, d),
        }[target]()
        print(o)
        for f in sorted(d.iterdir()):
            keep = Path(f"fuzz-{target}-{k}-{f.name}")
            keep.write_bytes(f.read_bytes())
            print(f"kept {keep}")
    return 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _, _, target, start, end, seed, log = sys.argv
        return _worker(target, int(start), int(end), int(seed), Path(log))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--captures", type=int, default=5000)
    ap.add_argument("--legacy", type=int, default=1000)
    ap.add_argument("--models", type=int, default=1000)
    ap.add_argument("--frames", type=int, default=0, help="tamper trials on the resident loop (~7 s each)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--replay", nargs=2, metavar=("TARGET", "K"))
    args = ap.parse_args()
    if args.replay:
        return _replay(args.replay[0], int(args.replay[1]), args.seed)
    bad = 0
    with tempfile.TemporaryDirectory(prefix="esp-check-fuzz-") as tmp:
        targets = (("capture", args.captures), ("legacy", args.legacy), ("model", args.models),
                   ("frames", args.frames))  # fmt: skip
        for target, n in targets:
            if n <= 0:
                continue
            t0 = time.monotonic()
            results = _run_target(target, n, args.seed, Path(tmp))
            bad += _report(target, results, time.monotonic() - t0, args.seed)
    print(f"\nseed {args.seed}: {'no false match, no crash' if bad == 0 else f'{bad} offending mutants'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
