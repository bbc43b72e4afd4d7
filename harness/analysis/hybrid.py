"""Hybrid firmware, host side: bisection, what the hybrid costs, the ESP-NN speedup audit (docs/hybrid.md).

Pure functions and a small state machine; the runs themselves are :mod:`harness.flows.hybrid`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from harness.model.loader import ModelInfo
from harness.model.opdata import espnn_model_acceleration
from harness.protocol.capture import Capture

NOISE_BAND = 0.10  # a speedup within 1 +- 10 % is "the same speed" (per-op cycle counts of one run)
# fewer ANSI C cycles: no audit verdict, the time is mostly the fixed per-op cost (docs/hybrid.md)
MIN_AUDIT_CYCLES = 4000
NATIVE_NO_CLAIM = (
    "native board: the timing is this PC's, not a chip's, so no speedup or cost is claimed from it"
)


# ---- bisection ------------------------------------------------------------------------------------


@dataclass
class BisectStep:
    """One firmware run of a bisection: the ops that ran optimized / ANSI C and what happened."""

    run: int
    phase: str  # "search" | "verify"
    optimized: list[int]
    ansi: list[int]
    bad: bool | None = None
    why: str = ""

    def to_dict(self) -> dict[str, object]:
        return {
            "run": self.run,
            "phase": self.phase,
            "optimized_ops": _ranges(self.optimized),
            "ansi_ops": _ranges(self.ansi),
            "result": None if self.bad is None else ("bad" if self.bad else "good"),
            "why": self.why,
        }


@dataclass
class Bisection:
    """Find the switchable ops whose optimized kernel makes a run bad (crash, hang or wrong outputs).

    ``switchable`` are the ops the hybrid wrapper can send to ANSI C; the search and verify runs, and
    what a wrong guess costs (another round, within ``max_culprits``): docs/hybrid.md, "Bisection".
    """

    switchable: list[int]
    max_culprits: int = 4
    found: list[int] = field(default_factory=list)
    steps: list[BisectStep] = field(default_factory=list)
    suspects: list[int] = field(default_factory=list)
    done: bool = False
    success: bool = False
    message: str = ""
    _half: list[int] = field(default_factory=list)
    _runs_at_round_start: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.switchable = sorted(set(self.switchable))
        self.found = sorted(set(self.found))  # culprits already known (e.g. from taps): always ANSI C
        self.suspects = [k for k in self.switchable if k not in self.found]
        self._runs_at_round_start = [0]
        if not self.suspects:
            self.done, self.message = True, "no op the hybrid wrapper can switch: nothing to bisect"

    @property
    def bound_per_culprit(self) -> int:
        """ceil(log2(N)) + 1 runs, N = the switchable ops."""
        return math.ceil(math.log2(max(1, len(self.switchable)))) + 1

    def next_ansi_ops(self) -> list[int] | None:
        """The ops the next run sends to ANSI C (None when the bisection is over)."""
        if self.done:
            return None
        if len(self.suspects) == 1:
            self.found.append(self.suspects[0])
            self.suspects = []
        if not self.suspects:  # verify: only the culprits on ANSI C
            ansi = sorted(self.found)
            self._add("verify", ansi)
            return ansi
        self._half = self.suspects[: len(self.suspects) // 2]
        ansi = sorted(set(self.switchable) - set(self._half))
        self._add("search", ansi)
        return ansi

    def _add(self, phase: str, ansi: list[int]) -> None:
        optimized = sorted(set(self.switchable) - set(ansi))
        self.steps.append(BisectStep(len(self.steps) + 1, phase, optimized, ansi))

    def record(self, bad: bool, why: str = "") -> None:
        """The result of the run :meth:`next_ansi_ops` proposed."""
        step = self.steps[-1]
        step.bad, step.why = bad, why
        if step.phase == "search":
            self.suspects = self._half if bad else [k for k in self.suspects if k not in self._half]
            return
        self._runs_at_round_start.append(len(self.steps))
        if not bad:
            self.done, self.success = True, True
            self.message = f"ops {_ranges(self.found)} on ANSI C make the run good"
            return
        remaining = [k for k in self.switchable if k not in self.found]
        if len(self.found) >= self.max_culprits or not remaining:
            self.done = True
            self.message = (
                f"still bad with ops {_ranges(self.found)} on ANSI C after {len(self.found)} round(s): "
                "stopped (the failure may need several ops together, or lie outside the ESP-NN kernels)"
            )
            return
        self.suspects = remaining

    def abort(self, why: str) -> None:
        """Stop: a run could not be judged (an infrastructure failure is not evidence either way)."""
        self.done, self.success, self.message = True, False, why

    def runs_per_culprit(self) -> list[int]:
        """Firmware runs each round took (search runs plus its verify run)."""
        marks = self._runs_at_round_start + ([len(self.steps)] if not self.done else [])
        return [b - a for a, b in itertools.pairwise(marks) if b > a]

    def to_dict(self) -> dict[str, object]:
        return {
            "switchable_ops": len(self.switchable),
            "bound_per_culprit": self.bound_per_culprit,
            "culprits": sorted(self.found),
            "runs": len(self.steps),
            "runs_per_culprit": self.runs_per_culprit(),
            "success": self.success,
            "message": self.message,
            "steps": [s.to_dict() for s in self.steps],
        }


def _ranges(ops: Sequence[int]) -> str:
    """``0-16,18-56`` for humans and reports (sorted, unique)."""
    consecutive = itertools.groupby(enumerate(sorted(set(ops))), key=lambda kv: kv[1] - kv[0])
    runs = [[v for _, v in group] for _, group in consecutive]
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs) or "-"


# ---- cost -----------------------------------------------------------------------------------------


class OpCost(TypedDict):
    op: int
    kind: str
    cycles_optimized: int | None
    cycles_ansi: int | None
    extra_cycles: int | None


class CostReport(TypedDict):
    """What the hybrid costs, from per-op cycles (:func:`cost_report`)."""

    cycles: dict[str, int | None]  # None: unknown (no op timed above zero in both builds)
    ms: dict[str, float | None]
    speedup: dict[str, float | None]
    speedup_kept_percent: float | None
    measured: bool
    per_op: list[OpCost]
    cpu_mhz: int
    native: bool
    noise_band: float
    summary: str


class InvokeCost(TypedDict):
    """What the hybrid costs, from the builds' invoke times (:func:`invoke_cost`)."""

    invoke_us: dict[str, int | None]
    speedup_kept_percent: float | None
    measured: bool
    per_op: list[OpCost]
    summary: str
    native: bool


def _kept(opt: int | None, ansi: int | None, hyb: int | None, native: bool, band: float) -> float | None:
    """The % of ESP-NN's speedup the hybrid keeps, from cycles or invoke times (docs/hybrid.md, "Cost");
    None: no claim (a native board, no speedup above the noise band, a hybrid outside the builds' range)."""
    if native or not (opt and ansi and hyb) or ansi <= opt * (1.0 + band):
        return None
    comparable = opt * (1.0 - band) <= hyb <= ansi * (1.0 + band)
    return round(100.0 * (ansi - hyb) / (ansi - opt), 4) if comparable else None  # 4 digits: _percent


def cost_report(
    info: ModelInfo,
    optimized: Mapping[int, int],
    ansi: Mapping[int, int],
    ansi_ops: Sequence[int],
    cpu_mhz: int,
    measured_hybrid: Mapping[int, int] | None = None,
    *,
    native: bool = False,
    noise_band: float = NOISE_BAND,
) -> CostReport:
    """What the hybrid costs, from per-op cycles of both builds (and of the hybrid when ``measured_hybrid``):
    docs/hybrid.md, "Cost", and when a share is claimed ("ESP-NN speedup audit")."""
    ops = [k for k in sorted(set(optimized) & set(ansi)) if optimized[k] > 0 and ansi[k] > 0]  # 0: unknown
    chosen = set(ansi_ops)
    t_opt = sum(optimized[k] for k in ops) or None  # None: no op timed above zero in both (unknown)
    t_ansi = sum(ansi[k] for k in ops) or None
    t_est = sum(ansi[k] if k in chosen else optimized[k] for k in ops) or None
    t_hyb = t_est if measured_hybrid is None else None  # measured: unknown unless it timed every op of T
    if measured_hybrid is not None and all(measured_hybrid.get(k) for k in ops):
        t_hyb = sum(measured_hybrid[k] for k in ops) or None

    per_op: list[OpCost] = [
        {
            "op": k,
            "kind": info.main_ops[k].opcode if k < len(info.main_ops) else "?",
            "cycles_optimized": optimized.get(k),
            "cycles_ansi": ansi.get(k),
            "extra_cycles": (ansi[k] - optimized[k]) if ansi.get(k) and optimized.get(k) else None,
        }
        for k in sorted(chosen)
    ]
    mhz = max(1, int(cpu_mhz))
    doc: CostReport = {
        "cycles": {"optimized": t_opt, "ansi": t_ansi, "hybrid": t_hyb, "hybrid_estimate": t_est},
        "ms": {
            k: round(v / mhz / 1000.0, 3) if v else None
            for k, v in (("optimized", t_opt), ("ansi", t_ansi), ("hybrid", t_hyb))
        },
        "speedup": {
            "optimized": round(t_ansi / t_opt, 3) if t_opt and t_ansi else None,
            "hybrid": round(t_ansi / t_hyb, 3) if t_hyb and t_ansi else None,
        },
        "speedup_kept_percent": _kept(t_opt, t_ansi, t_hyb, native, noise_band),
        "measured": measured_hybrid is not None,
        "per_op": per_op,
        "cpu_mhz": mhz,
        "native": native,
        "noise_band": noise_band,
        "summary": "",
    }
    doc["summary"] = _cost_sentence(doc)
    return doc


def _percent(percent: float) -> str:
    """98.5% / 99.991%: enough digits that a small cost is not shown as 100%."""
    return f"{percent:.1f}%" if percent < 99.9 else f"{percent:.3f}%"


def _cost_head(doc: CostReport) -> str:
    """The cost claim, or why there is none."""
    kept, sp, c = doc["speedup_kept_percent"], doc["speedup"], doc["cycles"]
    how = "measured" if doc["measured"] else "estimated from the two builds' per-op cycles"
    if doc["native"]:
        return NATIVE_NO_CLAIM
    if kept is not None and sp["optimized"] and sp["hybrid"]:
        return (
            f"the hybrid keeps {_percent(kept)} of ESP-NN's speedup ({sp['optimized']:.2f}x -> "
            f"{sp['hybrid']:.2f}x over ANSI C, {how})"
        )
    if sp["optimized"] is None or sp["hybrid"] is None:
        return "the per-op cycles leave the speedup unknown (no time above zero): no cost is claimed"
    if sp["optimized"] <= 1.0 + doc["noise_band"]:
        got = sp["optimized"]
        return f"ESP-NN gives no speedup above the noise on this model ({got:.2f}x): no cost is claimed"
    return (
        f"the hybrid's time ({c['hybrid']:,} cycles, {how}) is outside the optimized and ANSI C builds' "
        f"({c['optimized']:,} and {c['ansi']:,}): not comparable, no share of the speedup is claimed"
    )


def _cost_sentence(doc: CostReport) -> str:
    head = _cost_head(doc)
    if doc["native"]:
        return head
    ops = "; ".join(
        f"op {r['op']} ({r['kind']}) costs {r['extra_cycles']:,} cycles more "
        f"({r['extra_cycles'] / doc['cpu_mhz'] / 1000.0:.3f} ms at {doc['cpu_mhz']} MHz)"
        for r in doc["per_op"]
        if r["extra_cycles"] is not None
    )
    return head + (f"; {ops}" if ops else "")


def invoke_cost(
    us: Mapping[str, int | None], *, native: bool = False, noise_band: float = NOISE_BAND
) -> InvokeCost:
    """Without per-op cycles (a bisection without taps): the cost from the three builds' measured invoke
    times (``optimized``, ``ansi``, ``hybrid``, in us), under the same rules as :func:`cost_report`."""
    opt, ansi, hyb = us.get("optimized"), us.get("ansi"), us.get("hybrid")
    kept = _kept(opt, ansi, hyb, native, noise_band)
    if native:
        summary = NATIVE_NO_CLAIM + f" (invoke times: {dict(us)})"
    elif kept is not None:
        summary = f"the hybrid keeps {_percent(kept)} of ESP-NN's speedup (invoke times: {dict(us)})"
    elif opt and ansi and hyb and ansi > opt * (1.0 + noise_band):
        summary = (
            f"the hybrid's invoke ({hyb} us) is outside the optimized and ANSI C builds' "
            f"({opt} and {ansi} us): not comparable, no share of the speedup is claimed"
        )
    elif opt is None and hyb and ansi:
        summary = (
            f"the optimized build never finished an invoke; the hybrid takes {hyb} us, ANSI C "
            f"{ansi} us ({ansi / hyb:.2f}x faster than ANSI C)"
        )
    elif opt and ansi:
        summary = (
            f"ESP-NN gives no speedup above the noise on this model ({ansi / opt:.2f}x): no cost is claimed"
        )
    else:
        summary = f"invoke times: {dict(us)}"
    return {
        "invoke_us": dict(us),
        "speedup_kept_percent": kept,
        "measured": True,
        "per_op": [],
        "summary": summary,
        "native": native,
    }


# ---- ESP-NN speedup audit -------------------------------------------------------------------------


class AuditRow(TypedDict):
    op: int
    kind: str
    espnn: bool
    reason: str
    cycles_optimized: int | None
    cycles_ansi: int | None
    speedup: float | None
    flag: str | None  # "slower" | "ansi_speed"
    no_verdict: str | None  # "native" | "below_floor"


class AuditKind(TypedDict):
    kind: str
    finding: str  # "not_optimized" | "some_ops"
    ops: list[int]
    message: str


class Audit(TypedDict):
    """The ESP-NN speedup audit (:func:`espnn_audit`)."""

    chip: str
    noise_band: float
    min_cycles: int
    native: bool
    note: str
    rows: list[AuditRow]
    flagged_ops: list[int]
    kinds: list[AuditKind]


def espnn_audit(
    info: ModelInfo,
    chip: str,
    optimized: Mapping[int, int],
    ansi: Mapping[int, int],
    noise_band: float = NOISE_BAND,
    *,
    native: bool = False,
) -> Audit:
    """Per op: ESP-NN expected on ``chip`` (with the reason when not), cycles of both builds, speedup.

    The flags (``ansi_speed``, ``slower``), the named kinds and the ops that get no verdict (below
    :data:`MIN_AUDIT_CYCLES` ANSI C cycles, or ``native``): docs/hybrid.md, "ESP-NN speedup audit".
    """
    accel = {a.index: a for a in espnn_model_acceleration(info, chip)}
    rows: list[AuditRow] = []
    for op in info.main_ops:
        a = accel.get(op.index)
        c_opt, c_ansi = optimized.get(op.index), ansi.get(op.index)
        speedup = (c_ansi / c_opt) if c_opt and c_ansi else None
        flag = None
        small = c_ansi is not None and c_ansi < MIN_AUDIT_CYCLES
        no_verdict = "native" if native else ("below_floor" if small else None)
        if no_verdict is None and speedup is not None:
            if speedup < 1.0 - noise_band:
                flag = "slower"
            elif a is not None and a.accelerated and speedup <= 1.0 + noise_band:
                flag = "ansi_speed"
        rows.append(
            {
                "op": op.index,
                "kind": op.opcode,
                "espnn": bool(a and a.accelerated),
                "reason": a.reason if a else "",
                "cycles_optimized": c_opt,
                "cycles_ansi": c_ansi,
                "speedup": round(speedup, 3) if speedup is not None else None,
                "flag": flag,
                "no_verdict": no_verdict,
            }
        )
    return {
        "chip": chip,
        "noise_band": noise_band,
        "min_cycles": MIN_AUDIT_CYCLES,
        "native": native,
        "note": NATIVE_NO_CLAIM if native else "",
        "rows": rows,
        "flagged_ops": [r["op"] for r in rows if r["flag"]],
        "kinds": _kind_findings(rows),
    }


def _kind_findings(rows: Sequence[AuditRow]) -> list[AuditKind]:
    out: list[AuditKind] = []
    by_kind: dict[str, list[AuditRow]] = {}
    for row in rows:
        by_kind.setdefault(row["kind"], []).append(row)
    for kind, group in by_kind.items():
        expected = [r for r in group if r["espnn"] and r["speedup"] is not None and not r["no_verdict"]]
        at_ansi = [r for r in expected if r["flag"] == "ansi_speed"]
        slower = [r for r in group if r["flag"] == "slower"]
        if expected and len(at_ansi) == len(expected):
            out.append(
                {
                    "kind": kind,
                    "finding": "not_optimized",
                    "ops": [r["op"] for r in at_ansi],
                    "message": f"{kind}: all {len(expected)} op(s) ESP-NN should accelerate run at ANSI C "
                    "speed: this kernel was most likely compiled without ESP-NN optimization (check that "
                    "CONFIG_NN_OPTIMIZED reaches esp_nn.h where esp-tflite-micro includes it)",
                }
            )
        elif at_ansi or slower:
            out.append(
                {
                    "kind": kind,
                    "finding": "some_ops",
                    "ops": [r["op"] for r in at_ansi + slower],
                    "message": f"{kind}: {len(at_ansi)} op(s) at ANSI C speed, {len(slower)} slower "
                    f"optimized (of {len(expected)} expected to be accelerated)",
                }
            )
    return out


# ---- what the hybrid capture says about itself ----------------------------------------------------


def hybrid_evidence(cap: Capture, ansi_ops: Sequence[int], expected_ansi_invokes: int) -> list[str]:
    """Problems with a hybrid capture's own account of its dispatch (empty: it says what was built)."""
    problems: list[str] = []
    printed = cap.hybrid_ops
    want = sorted(set(ansi_ops))
    if printed is None:
        return ["the firmware did not print INFO hybrid: it is not the hybrid build"]
    ops, cut = printed
    if (not cut and list(ops) != want) or (cut and list(ops) != want[: len(ops)]):
        problems.append(f"the firmware's table sends ops {_ranges(ops)} to ANSI C, expected {_ranges(want)}")
    for run in cap.runs:
        h = run.hybrid
        if h is None:
            problems.append(f"run {run.index}: no HYBRID record")
        elif h["ansi"] != expected_ansi_invokes:
            problems.append(
                f"run {run.index}: {h['ansi']} invokes went to ANSI C, expected {expected_ansi_invokes} "
                f"({h['fallback']} ran the original kernel)"
            )
    return problems
