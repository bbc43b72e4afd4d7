"""What the sweep driver printed, judged (docs/sweep.md): results, findings, coverage.

The driver's output is parsed strictly (a line that does not parse is not a result, and a case with no
result is never counted as passing). Each case gets every kind of finding that applies (the kinds:
docs/sweep.md, "Findings").
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import TypedDict

from harness.analysis import sanitizer
from harness.analysis.sweep_cases import Case

RAN, ABSENT, REFUSED, NO_REF = 0, 1, 2, 3
_R = re.compile(
    r"R (\d+) ([0-3]) ([0-3]) ([0-3]) (\d+) ([0-9a-f]{8}) ([0-9a-f]{8}) ([0-9a-f]{8}) "
    r"(-|\d+:\d+:-?\d+) (-|\d+:\d+:-?\d+) (-|\d+:\d+:-?\d+) (-?\d+) (-?\d+) ([01])"
)
_O = re.compile(r"O (\d+) (-|[0-9a-f]*) (-|[0-9a-f]*) (-|[0-9a-f]*)")
KINDS = ("sanitizer", "crash", "reference_refuses", "opt_vs_ansi", "both_vs_reference", "one_vs_reference")


@dataclass(frozen=True)
class Diff:
    count: int
    max_abs: int
    first: int


@dataclass
class Result:
    """One case's line from the driver."""

    id: int
    status: tuple[int, int, int]  # optimized, ANSI C, reference
    n: int
    crc: tuple[str, str, str]
    opt_ansi: Diff | None
    opt_ref: Diff | None
    ansi_ref: Diff | None
    alias: bool
    outputs: tuple[bytes | None, bytes | None, bytes | None] | None = None


def _diff(text: str) -> Diff | None:
    if text == "-":
        return None
    c, m, f = (int(x) for x in text.split(":"))
    return Diff(c, m, f)


def parse_result(line: str) -> Result | None:
    """A ``R`` line, or None when ``line`` is not one (never a guess)."""
    m = _R.fullmatch(line.strip())
    if not m:
        return None
    g = m.groups()
    return Result(
        id=int(g[0]),
        status=(int(g[1]), int(g[2]), int(g[3])),
        n=int(g[4]),
        crc=(g[5], g[6], g[7]),
        opt_ansi=_diff(g[8]),
        opt_ref=_diff(g[9]),
        ansi_ref=_diff(g[10]),
        alias=g[13] == "1",  # g[11], g[12]: the two scratch sizes (checked by the pattern, not used)
    )


def parse_outputs(line: str) -> tuple[int, tuple[bytes | None, ...]] | None:
    """An ``O`` line (ESP_CHECK_SWEEP_DUMP=1): the case id and the three output tensors."""
    m = _O.fullmatch(line.strip())
    if not m:
        return None
    outs = tuple(None if h == "-" else bytes.fromhex(h) for h in m.groups()[1:])
    return int(m.group(1)), outs


_NUMBER = re.compile(r"0x[0-9a-fA-F]+|-?\d+")


_Report = TypedDict(  # "in" is a keyword: the functional form
    "_Report", {"error": str, "type": str, "frames": list[str], "at": list[str], "summary": str, "in": str}
)


class SanitizerReport(_Report, total=False):
    """A sanitizer's report on one case: the error line, its type, the first frames, where."""

    variant: str  # the variant it stopped (the sweep flow adds it)


def sanitizer_report(text: str) -> SanitizerReport | None:
    """The error line, its type, the first frames (with file:line where the report gives them) and
    the summary of a sanitizer report in ``text``."""
    lines = text.splitlines()
    i, head = next(((i, h) for i, ln in enumerate(lines) if (h := sanitizer.head(ln))), (0, None))
    if head is None:
        return None
    found = [f for ln in lines[i:] if (f := sanitizer.frame(ln))][:6]
    frames = [f.func for f in found]
    at = [f"{f.func} {f.at}" if f.at else f.func for f in found]
    if head.location:
        at.insert(0, f"reported at {head.location.rsplit('/', 1)[-1]}")
    summary = next((ln.strip() for ln in lines[i:] if sanitizer.SUMMARY.match(ln)), "")
    where = next((f for f in frames if f.startswith("esp_nn")), frames[0] if frames else "")
    # the grouping key: the error's name, or what UBSan says without its numbers
    kind = head.error if head.line.startswith("ERROR:") else _NUMBER.sub("N", head.error.split(": ")[0])
    return {
        "error": head.line[:300],
        "type": kind[:120],
        "frames": frames,
        "at": at,
        "summary": summary[:300],
        "in": where,
    }


@dataclass
class CaseVerdict:
    case: Case
    result: Result | None
    kinds: list[str]
    sanitizers: list[SanitizerReport] = field(default_factory=list)  # one per variant it stopped
    crashes: list[str] = field(default_factory=list)  # "variant: how it died"


def judge(
    case: Case,
    result: Result | None,
    sanitizers: list[SanitizerReport] | None = None,
    crashes: list[str] | None = None,
) -> CaseVerdict:
    """Every finding kind that applies to one case (an empty list: the case passed)."""
    kinds: list[str] = []
    if sanitizers:
        kinds.append("sanitizer")
    if crashes:
        kinds.append("crash")
    if result is not None:
        so, sa, sr = result.status
        if sr == REFUSED and RAN in (so, sa):
            kinds.append("reference_refuses")
        if so == RAN and sa == RAN and not result.alias and result.opt_ansi and result.opt_ansi.count:
            kinds.append("opt_vs_ansi")
        if sr == RAN:
            bad_o = so == RAN and result.opt_ref is not None and result.opt_ref.count > 0
            bad_a = sa == RAN and result.ansi_ref is not None and result.ansi_ref.count > 0
            if bad_o and bad_a and result.opt_ansi is not None and result.opt_ansi.count == 0:
                kinds.append("both_vs_reference")
            elif bad_o or bad_a:
                kinds.append("one_vs_reference")
    return CaseVerdict(case, result, kinds, list(sanitizers or []), list(crashes or []))


@dataclass
class Coverage:
    """Per op and geometry class: cases run, compared opt-vs-ANSI for real, compared with the reference."""

    cases: Counter[tuple[str, str]] = field(default_factory=Counter)
    opt_vs_ansi: Counter[tuple[str, str]] = field(default_factory=Counter)
    aliased: Counter[tuple[str, str]] = field(default_factory=Counter)
    reference: Counter[tuple[str, str]] = field(default_factory=Counter)
    absent: Counter[tuple[str, str]] = field(default_factory=Counter)

    def add(self, verdict: CaseVerdict) -> None:
        key = (verdict.case.op, verdict.case.klass)
        self.cases[key] += 1
        r = verdict.result
        if r is None:
            return
        if RAN not in r.status[:2]:
            self.absent[key] += 1
        elif r.alias:
            self.aliased[key] += 1  # ANSI C vs ANSI C: not coverage of an optimized kernel
        elif r.status[0] == r.status[1] == RAN:
            self.opt_vs_ansi[key] += 1
        if r.status[2] == RAN and RAN in r.status[:2]:
            self.reference[key] += 1

    def rows(self) -> list[dict[str, object]]:
        return [
            {
                "op": op,
                "class": k,
                "cases": n,
                "opt_vs_ansi": self.opt_vs_ansi[(op, k)],
                "ansi_vs_ansi": self.aliased[(op, k)],
                "vs_reference": self.reference[(op, k)],
                "absent": self.absent[(op, k)],
            }
            for (op, k), n in sorted(self.cases.items())
        ]


def family(op: str, klass: str) -> str:
    """A coarser geometry class for grouping findings: what bugs have followed, not every filter size.

    conv: 1x1 or KxK, grouped or not; depthwise: 1x1 or KxK, multiplier 1 or more; fully connected:
    per-channel or per-tensor; pooling: the padding; add and mul: one family; softmax: its own class.
    A --from-model prefix (``opN``) is kept, so each model op stays apart.
    """
    words = klass.split()
    prefix = [words.pop(0)] if words and words[0].startswith("op") and words[0][2:].isdigit() else []
    size = ("1x1" if words and words[0] == "1x1" else "KxK") if words else ""
    if op == "conv":
        fam = ["grouped", size] if "grouped" in words else [size]
    elif op == "depthwise":
        fam = [size, "mult1" if "mult1" in words else "mult>1"]
    elif op == "fully_connected":
        fam = words[:1]
    elif op in ("avg_pool", "max_pool"):
        fam = [w for w in words if w in ("SAME", "VALID", "pad*")]
    elif op in ("add", "mul"):
        fam = ["any size"]
    else:
        fam = words
    return " ".join(prefix + fam)


def _why_api_only(verdicts: list[CaseVerdict]) -> str:
    """Why a group's cases do not reach esp-nn through TFLite, when one says (grouped conv)."""
    if any(v.case.reachable for v in verdicts):
        return ""
    return next((str(v.case.meta["why_api_only"]) for v in verdicts if v.case.meta.get("why_api_only")), "")


def _details(verdict: CaseVerdict, kind: str) -> list[tuple[str, dict[str, object]]]:
    """(sub-key, what the finding keeps) per distinct error of ``kind`` in one case: a sanitizer report
    per variant and error type (and the function it is in), a crash per variant; one for other kinds."""
    if kind == "sanitizer" and verdict.sanitizers:
        return [
            (f"{r['variant']}: {r['type']} in {r['in']}", {"variant": r["variant"], "sanitizer": r})
            for r in verdict.sanitizers
        ]
    if kind == "crash" and verdict.crashes:
        return [(c.split(":")[0], {"variant": c.split(":")[0], "crash": c}) for c in verdict.crashes]
    return [("", {})]


def group(verdicts: list[CaseVerdict]) -> list[dict[str, object]]:
    """Findings grouped by kernel, geometry family (:func:`family`), kind and, for sanitizer reports
    and crashes, the variant and the error type; each keeps its smallest case and how many cases of
    each finer geometry class it holds."""
    groups: dict[tuple[str, str, str, str], list[tuple[CaseVerdict, dict[str, object]]]] = defaultdict(list)
    for v in verdicts:
        for kind in v.kinds:
            for sub, detail in _details(v, kind):
                groups[(v.case.op, family(v.case.op, v.case.klass), kind, sub)].append((v, detail))
    out = []
    order = sorted(groups.items(), key=lambda kv: (KINDS.index(kv[0][2]), kv[0][:2], kv[0][3]))
    for (op, fam, kind, sub), items in order:
        vs = [v for v, _ in items]
        smallest, detail = min(items, key=lambda it: it[0].case.size())
        classes = Counter(v.case.klass for v in vs)
        out.append(
            {
                "op": op,
                "class": fam,
                "classes": dict(sorted(classes.items())),
                "kind": kind,
                **({"error": sub} if sub else {}),
                "cases": len(vs),
                "tflite_reachable": any(v.case.reachable for v in vs),
                **({"why_api_only": why} if (why := _why_api_only(vs)) else {}),
                "example": smallest,
                **detail,
            }
        )
    return out
