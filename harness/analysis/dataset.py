"""Dataset verdicts: optimized vs ANSI C vs the host reference over many inputs (docs/dataset.md).

What a leg holds and what each verdict rests on: docs/dataset.md. Two legs whose CRC-32s are equal hold
equal outputs (a CRC-32 collision between two different outputs has probability 2^-32: documented, not
hidden); otherwise their bytes are compared element by element, in LSB or real units (float32).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from harness.errors import ExitCode, Verdict, combine_exit_codes
from harness.flashfmt.partitions import VARIANTS
from harness.jsontypes import json_number
from harness.protocol.spec import crc32

LEGS = (*VARIANTS, "host")
# the comparison pairs by their report key: optimized_vs_ansi, then optimized_vs_host and ansi_vs_host
PAIRS = {f"{a}_vs_{b}": (a, b) for a, b in itertools.combinations(LEGS, 2)}
OPT_ANSI, *VS_HOST = PAIRS


@dataclass
class Leg:
    """One source's result for one input (status ``ok``, ``invoke_failed``, ``missing`` or ``invalid``)."""

    status: str
    crcs: tuple[int, ...] | None = None
    data: list[np.ndarray] | None = None
    nondeterministic: bool = False
    invoke_us: int | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def host_leg(outputs: Sequence[np.ndarray]) -> Leg:
    arrays = [np.ascontiguousarray(a) for a in outputs]
    return Leg("ok", tuple(map(crc32, arrays)), arrays)


@dataclass(frozen=True)
class OutputSpec:
    dtype: str
    shape: tuple[int, ...]
    name: str = ""


@dataclass
class PairStats:
    """One pair of legs over the dataset."""

    compared: int = 0  # inputs where both legs were ok and comparable
    equal: int = 0  # bit-exact
    within: int = 0  # within the tolerance
    max_lsb: list[float] = field(default_factory=list)  # per output
    sum_abs: list[float] = field(default_factory=list)  # per output: sum of |diff| over elements
    elements: list[int] = field(default_factory=list)  # per output: elements compared

    def to_dict(self) -> dict[str, object]:
        n = self.compared
        return {
            "compared": n,
            "bit_exact": self.equal,
            "within_tolerance": self.within,
            "agreement": round(self.within / n, 6) if n else None,
            "max_lsb_per_output": [json_number(round(x, 6)) for x in self.max_lsb],
            "mean_lsb_per_output": [
                json_number(round(s / e, 9)) if e else None
                for s, e in zip(self.sum_abs, self.elements, strict=True)
            ],
        }


@dataclass
class Row:
    """One input's verdict."""

    index: int
    name: str
    label: int | None
    verdict: Verdict
    lsb: dict[str, float | None]  # pair (a key of PAIRS) -> max |diff| over outputs (None: not compared)
    top1: dict[str, int | None]
    invoke_us: dict[str, int | None]
    detail: str = ""

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["max_lsb"] = {k: json_number(v) for k, v in d.pop("lsb").items()}
        return d


@dataclass
class DatasetAnalysis:
    rows: list[Row]
    pairs: dict[str, PairStats]
    outputs: list[OutputSpec]
    tolerance_lsb: float
    ref_tolerance_lsb: float
    classifier: bool
    top1: dict[str, dict[str, int]] = field(default_factory=dict)  # pair -> {compared, agree}
    accuracy: dict[str, dict[str, int]] = field(default_factory=dict)  # leg -> {labelled, correct}

    @property
    def counts(self) -> dict[str, int]:
        return dict(Counter(r.verdict for r in self.rows))

    @property
    def exit_code(self) -> ExitCode:
        codes = [r.verdict.exit_code for r in self.rows]
        return combine_exit_codes(codes) if codes else ExitCode.INFRASTRUCTURE

    def disagreeing(self, limit: int = 20) -> list[Row]:
        """Inputs that disagree anywhere, largest difference first (optimized vs ANSI C, then vs host)."""
        bad = [r for r in self.rows if r.verdict in ("mismatch", "nondeterministic")]

        def key(row: Row) -> tuple[float, float]:
            oa = row.lsb.get(OPT_ANSI) or 0.0
            host = max((row.lsb.get(p) or 0.0) for p in VS_HOST)
            return (-oa, -host)

        return sorted(bad, key=key)[:limit]

    def to_dict(self) -> dict[str, object]:
        return {
            "inputs": len(self.rows),
            "verdicts": self.counts,
            "tolerance_lsb": self.tolerance_lsb,
            "ref_tolerance_lsb": self.ref_tolerance_lsb,
            "outputs": [{"name": o.name, "dtype": o.dtype, "shape": list(o.shape)} for o in self.outputs],
            "agreement": {key: s.to_dict() for key, s in self.pairs.items()},
            "classifier": self.classifier,
            "top1_agreement": self.top1,
            "accuracy": self.accuracy,
            "disagreeing": [r.to_dict() for r in self.disagreeing()],
            "rows": [r.to_dict() for r in self.rows],
        }


def _diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| per element. Float outputs: a NaN or an infinity on one side that the other side does not
    have at the same element is an infinite difference (never hidden by a max or a tolerance); two NaNs,
    or two equal infinities, do not differ in value (their bits may: the CRC-32s say so)."""
    if a.dtype.kind in "iu":
        return np.abs(a.astype(np.int64) - b.astype(np.int64)).astype(np.float64).reshape(-1)
    x, y = a.astype(np.float64).reshape(-1), b.astype(np.float64).reshape(-1)
    same = (x == y) | (np.isnan(x) & np.isnan(y))
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(np.where(same, 0.0, x - y))
    return np.where(np.isnan(d), np.inf, d)


def _compare(x: Leg, y: Leg, stats: PairStats, sizes: Sequence[int], tol: float) -> tuple[float | None, str]:
    """Max |diff| over outputs (0 for equal CRCs), or None with the reason it is unknown."""
    if not (x.ok and y.ok) or x.crcs is None or y.crcs is None:
        return None, "a leg has no result"
    n_out = len(sizes)
    if not stats.max_lsb:
        stats.max_lsb, stats.sum_abs, stats.elements = [0.0] * n_out, [0.0] * n_out, [0] * n_out
    worst = 0.0
    sums, counts, maxes = [0.0] * n_out, [0] * n_out, [0.0] * n_out
    for o in range(n_out):
        if x.crcs[o] == y.crcs[o]:
            counts[o] = sizes[o]  # equal: every element differs by 0
            continue
        if x.data is None or y.data is None:
            return None, "a CRC-32 differs and the outputs were not fetched"
        d = _diff(x.data[o], y.data[o])
        maxes[o], sums[o], counts[o] = float(d.max(initial=0.0)), float(d.sum()), int(d.size)
        worst = max(worst, maxes[o])
    stats.compared += 1
    stats.equal += x.crcs == y.crcs
    stats.within += worst <= tol
    for o in range(n_out):
        stats.max_lsb[o] = max(stats.max_lsb[o], maxes[o])
        stats.sum_abs[o] += sums[o]
        stats.elements[o] += counts[o]
    return worst, ""


def _infer(here: Mapping[str, Leg]) -> dict[str, Leg]:
    """A CRC-only leg takes each output's bytes from another leg of the same input with an equal CRC-32.

    With ``--results crc`` an output whose CRC equals the expected one (the host reference's, or the other
    variant's) is not fetched: its bytes are those of the leg it equals (up to a 2^-32 CRC collision).
    """
    out = dict(here)
    for name, leg in here.items():
        if not leg.ok or leg.crcs is None or leg.data is not None:
            continue
        data: list[np.ndarray] = []
        for o, crc in enumerate(leg.crcs):
            same = (x for x in here.values() if x.ok and x.data is not None and x.crcs and x.crcs[o] == crc)
            src = next((x.data[o] for x in same if x.data is not None), None)
            if src is None:
                break
            data.append(src)
        if len(data) == len(leg.crcs):
            out[name] = replace(leg, data=data)
    return out


def _top1(leg: Leg, host: Leg | None) -> int | None:
    if not leg.ok:
        return None
    if leg.data is not None:
        return int(np.argmax(leg.data[0]))
    if host is not None and host.data is not None and leg.crcs is not None and leg.crcs == host.crcs:
        return int(np.argmax(host.data[0]))
    return None


def is_classifier(outputs: Sequence[OutputSpec]) -> bool:
    """One output of shape [C] or [1, C], C >= 2: its argmax is a class."""
    if not outputs:
        return False
    shape = [d for d in outputs[0].shape if d != 1]
    return len(shape) == 1 and shape[0] >= 2


def analyze(
    names: Sequence[str],
    labels: Sequence[int | None],
    outputs: Sequence[OutputSpec],
    legs: Mapping[str, Sequence[Leg]],
    *,
    tolerance_lsb: float = 0,
    ref_tolerance_lsb: float = 0,
) -> DatasetAnalysis:
    """Per-input verdicts and the dataset's agreement, LSB, top-1 and accuracy figures."""
    sizes = [int(np.prod(o.shape)) for o in outputs]
    classifier = is_classifier(outputs)
    pairs = {key: PairStats() for key, (a, b) in PAIRS.items() if a in legs and b in legs}
    top1 = {p: {"compared": 0, "agree": 0} for p in pairs} if classifier else {}
    accuracy = {leg: {"labelled": 0, "correct": 0} for leg in LEGS if leg in legs} if classifier else {}
    rows = []
    for i, name in enumerate(names):
        here = _infer({leg: legs[leg][i] for leg in legs})
        lsb: dict[str, float | None] = {}
        why = []
        for key, stats in pairs.items():
            a, b = PAIRS[key]
            tol = tolerance_lsb if key == OPT_ANSI else ref_tolerance_lsb
            lsb[key], reason = _compare(here[a], here[b], stats, sizes, tol)
            if reason and here[a].ok and here[b].ok:
                why.append(f"{key}: {reason}")
        t1 = {leg: _top1(here[leg], here.get("host")) for leg in legs} if classifier else {}
        for key in top1:
            a, b = PAIRS[key]
            if t1.get(a) is not None and t1.get(b) is not None:
                top1[key]["compared"] += 1
                top1[key]["agree"] += t1[a] == t1[b]
        if labels[i] is not None:
            for leg in accuracy:
                if t1.get(leg) is not None:
                    accuracy[leg]["labelled"] += 1
                    accuracy[leg]["correct"] += t1[leg] == labels[i]
        verdict, detail = _verdict(here, lsb, tolerance_lsb, ref_tolerance_lsb, why)
        invoke: dict[str, int | None] = {v: here[v].invoke_us for v in VARIANTS if v in here}
        rows.append(
            Row(i, name, labels[i], verdict=verdict, lsb=lsb, top1=t1, invoke_us=invoke, detail=detail)
        )
    return DatasetAnalysis(
        rows,
        pairs,
        list(outputs),
        tolerance_lsb=tolerance_lsb,
        ref_tolerance_lsb=ref_tolerance_lsb,
        classifier=classifier,
        top1=top1,
        accuracy=accuracy,
    )


def _verdict(
    legs: Mapping[str, Leg], lsb: Mapping[str, float | None], tol: float, ref_tol: float, why: list[str]
) -> tuple[Verdict, str]:
    """Findings first (a failed invoke, a non-deterministic input, a difference that was measured), then
    what is unknown: a finding stays a finding when another leg of the same input is missing."""
    devices = {v: legs[v] for v in VARIANTS if v in legs}
    said = {v: f"{v}: {leg.status} {leg.detail}".strip() for v, leg in devices.items() if not leg.ok}
    missing = [*said.values(), *why]
    unknown = f" (also: {'; '.join(missing)})" if missing else ""
    failed = [said[v] for v in said if devices[v].status == "invoke_failed"]
    if failed:
        return Verdict.DEVICE_ERROR, "; ".join(failed)
    nondet = [v for v, leg in devices.items() if leg.ok and leg.nondeterministic]
    if nondet:
        return Verdict.NONDETERMINISTIC, "; ".join(
            f"{v}: {legs[v].detail or 'the same input gave different outputs across repeats'}" for v in nondet
        )
    found = []
    oa = lsb.get(OPT_ANSI)
    if oa is not None and oa > tol:
        found.append(f"optimized vs ANSI C differ by {oa:g}")
    found += [
        f"{k} differ by {x:g}" for k, x in lsb.items() if k in VS_HOST and x is not None and x > ref_tol
    ]
    if found:
        return Verdict.MISMATCH, "; ".join(found) + unknown
    if missing:
        return Verdict.INCOMPLETE, "; ".join(missing)
    return Verdict.MATCH, ""
