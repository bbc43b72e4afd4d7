"""Benchmark: how often classify() gets the exit class of real-world transcripts right.

Reads tests/data/transcripts/manifest.toml (fixtures shaped after public transcripts, provenance in
PROVENANCE.md next to it) and prints, for the tuning part and the held-out part separately, per
category: how many fixtures got the expected exit class (4 firmware fault, 3 infrastructure, 0 no
fault) and how many reported every expected kind; then every miss. The held-out part is never used to
tune the classifier: its figure is the honest one.

It also checks the capture endings: each fixture is classified again as if the capture had ended by
silence, by timeout and by a boot loop; a fault the text shows must survive each ending.

Prints figures only (nothing asserts). Run: ``python bench/bench_classify.py [--json]``.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from harness.analysis.classify import classify, exit_code_for

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "data" / "transcripts"
ENDINGS = ("silence", "timeout", "boot_loop")


def load_manifest() -> list[dict[str, Any]]:
    return list(tomllib.loads((CORPUS / "manifest.toml").read_text(encoding="utf-8"))["transcript"])


def run_one(entry: dict[str, Any]) -> dict[str, Any]:
    raw = (CORPUS / entry["file"]).read_bytes()
    findings = classify(raw)
    code = exit_code_for(findings)
    got = int(code) if code is not None else 0
    kinds = sorted({f.kind for f in findings})
    kept = True
    for ended_by in ENDINGS:  # a fault the text shows survives every way a capture can end
        ended = {f.kind for f in classify(raw, ended_by=ended_by)}
        kept &= set(entry["kinds"]) <= ended
        if entry["exit"] == 4:
            kept &= exit_code_for(classify(raw, ended_by=ended_by)) == 4
    return {
        **entry,
        "got_exit": got,
        "got_kinds": kinds,
        "exit_ok": got == entry["exit"],
        "kinds_ok": set(entry["kinds"]) <= set(kinds),
        "endings_ok": kept,
    }


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for split in ("tuning", "heldout"):
        rows = [r for r in results if r["split"] == split]
        cats: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            cats[r["category"]].append(r)
        out[split] = {
            "n": len(rows),
            "exit_ok": sum(r["exit_ok"] for r in rows),
            "kinds_ok": sum(r["kinds_ok"] for r in rows),
            "endings_ok": sum(r["endings_ok"] for r in rows),
            "damaged": [
                sum(r["exit_ok"] for r in rows if r["damaged"]),
                sum(1 for r in rows if r["damaged"]),
            ],
            "firmware_fault_as_infrastructure": sum(1 for r in rows if r["exit"] == 4 and r["got_exit"] == 3),
            "download_as_firmware_fault": sum(
                1 for r in rows if "download_mode" in r["kinds"] and r["got_exit"] == 4
            ),
            "categories": {
                c: [sum(r["exit_ok"] for r in rs), sum(r["kinds_ok"] for r in rs), len(rs)]
                for c, rs in sorted(cats.items())
            },
            "misses": [
                {k: r[k] for k in ("file", "exit", "got_exit", "kinds", "got_kinds")}
                for r in rows
                if not (r["exit_ok"] and r["kinds_ok"])
            ],
        }
    return out


def main() -> None:
    results = [run_one(e) for e in load_manifest()]
    summary = summarize(results)
    if "--json" in sys.argv[1:]:
        print(json.dumps(summary, indent=1))
        return
    for split, s in summary.items():
        pct = 100.0 * s["exit_ok"] / s["n"] if s["n"] else 0.0
        print(
            f"\n== {split}: {s['exit_ok']}/{s['n']} exit class right ({pct:.1f}%), "
            f"{s['kinds_ok']}/{s['n']} with every expected kind, "
            f"{s['endings_ok']}/{s['n']} keep their faults on silence/timeout/boot-loop endings"
        )
        print(
            f"   damaged evidence: {s['damaged'][0]}/{s['damaged'][1]} right; firmware fault called "
            f"infrastructure: {s['firmware_fault_as_infrastructure']}; download mode called a firmware "
            f"fault: {s['download_as_firmware_fault']}"
        )
        print(f"   {'category':20s} {'exit ok':>8s} {'kinds ok':>9s}")
        for cat, (ok, kok, n) in s["categories"].items():
            print(f"   {cat:20s} {ok:>4d}/{n:<3d} {kok:>5d}/{n:<3d}")
        for m in s["misses"]:
            print(
                f"   MISS {m['file']}: expected exit {m['exit']} {m['kinds']}, "
                f"got {m['got_exit']} {m['got_kinds']}"
            )


if __name__ == "__main__":
    main()
