"""``--tap``: find the op that goes wrong, from per-op checksums the device printed.

Pure functions on captures, each a step of docs/tap.md, "On the host".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict

import numpy as np

from harness.analysis.dataset import PAIRS, VS_HOST
from harness.analysis.hybrid import NOISE_BAND, Audit, espnn_audit
from harness.errors import EspCheckError
from harness.model.modelinfo import ModelInfo
from harness.model.reference import run_reference
from harness.model.taps import tapped_inputs, tapped_outputs
from harness.protocol.capture import Capture, CapturedRun
from harness.protocol.spec import crc32_hex

# ---- host side ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TapOp:
    """One op's checksums, from the device (a parsed OP record) or the host reference."""

    idx: int
    opcode: str
    inputs: tuple[tuple[int, str], ...]  # (tensor index, CRC hex)
    outputs: tuple[tuple[int, str], ...]
    cycles: int | None = None


def host_taps(
    model: ModelInfo, model_bytes: bytes, inputs: Sequence[np.ndarray], backend: str = "tflm"
) -> tuple[list[list[TapOp]], list[dict[int, np.ndarray]]]:
    """Per run: the host reference's TapOp list and every tensor (model input + op outputs) by index."""
    res = run_reference(model_bytes, [[a] for a in inputs], per_layer=True, backend=backend)
    all_ops: list[list[TapOp]] = []
    all_tensors: list[dict[int, np.ndarray]] = []
    for arr, run in zip(inputs, res.runs, strict=True):
        tensors: dict[int, np.ndarray] = {model.inputs[0].index: np.asarray(arr)}
        for lt in run.layers or []:
            tensors[lt.tensor_index] = lt.array
        ops = [
            TapOp(
                op.index,
                op.opcode,
                tuple((t, crc32_hex(tensors[t])) for t in tapped_inputs(model, op) if t in tensors),
                tuple((t, crc32_hex(tensors[t])) for t in tapped_outputs(op) if t in tensors),
            )
            for op in model.main_ops
        ]
        all_ops.append(ops)
        all_tensors.append(tensors)
    return all_ops, all_tensors


def device_taps(run: CapturedRun) -> list[TapOp]:
    """TapOp list of a parsed CapturedRun (harness.protocol.capture)."""
    return [
        TapOp(
            o.idx,
            o.opcode,
            tuple((e.t, e.crc) for e in o.inputs),
            tuple((e.t, e.crc) for e in o.outputs),
            o.cycles,
        )
        for o in run.ops
    ]


@dataclass
class Divergence:
    """The first op where stream ``a`` departs from stream ``b`` (None fields: they agree)."""

    a: str
    b: str
    op: int | None = None
    opcode: str | None = None
    kind: str | None = None  # "output" | "clobbered_input" | "input"
    tensor: int | None = None
    producer: int | None = None  # op that wrote the clobbered tensor
    ops_compared: int = 0
    differing_ops: list[int] = field(default_factory=list)
    message: str = ""
    layout_mismatch: list[int] = field(default_factory=list)  # ops whose tensor lists differ (not compared)
    missing: list[int] = field(default_factory=list)  # ops in b without a record in a


def first_divergence(a_name: str, a: Sequence[TapOp], b_name: str, b: Sequence[TapOp]) -> Divergence:
    """Name the first op (execution order) whose checksums differ between ``a`` and ``b``.

    An input CRC in ``a`` that differs from what ``a``'s own producer op printed for the same tensor
    means the tensor changed *between* the two ops (clobbered), which is reported as such.
    """
    res = Divergence(a_name, b_name)
    b_by = {o.idx: o for o in b}
    produced: dict[int, tuple[int, str]] = {}  # tensor -> (producer op, CRC it printed) in a
    for op in a:
        other = b_by.get(op.idx)
        if other is None:
            continue
        res.ops_compared += 1
        b_in, b_out = dict(other.inputs), dict(other.outputs)
        if [t for t, _ in op.inputs] != list(b_in) or [t for t, _ in op.outputs] != list(b_out):
            res.layout_mismatch.append(op.idx)  # never counted as agreement
            continue
        found: tuple[str, int, int | None] | None = None
        bad_in = next(((t, crc) for t, crc in op.inputs if b_in[t] != crc), None)
        bad_out = next((t for t, crc in op.outputs if b_out[t] != crc), None)
        if bad_in is not None:
            t, crc = bad_in
            prod = produced.get(t)
            clobbered = prod is not None and prod[1] != crc
            found = ("clobbered_input" if clobbered else "input", t, prod[0] if prod else None)
        elif bad_out is not None:
            found = ("output", bad_out, None)
        for t, crc in op.outputs:
            produced[t] = (op.idx, crc)
        if found is not None:
            res.differing_ops.append(op.idx)
            if res.op is None:
                res.op, res.opcode = op.idx, op.opcode
                res.kind, res.tensor, res.producer = found
    seen = {o.idx for o in a}
    res.missing = [o.idx for o in b if o.idx not in seen]
    res.ops_compared -= len(res.layout_mismatch)
    if res.op is None:
        res.message = f"{a_name} and {b_name} agree on all {res.ops_compared} ops compared"
        if res.missing or res.layout_mismatch:
            res.message += (
                f" ({len(res.missing)} op(s) without a record in {a_name}, {len(res.layout_mismatch)} with "
                "different tensor lists: NOT checked)"
            )
    elif res.kind == "clobbered_input":
        res.message = (
            f"op {res.op} ({res.opcode}) read tensor {res.tensor} with a different CRC than op "
            f"{res.producer} wrote into it on the {a_name} run: the tensor was overwritten between op "
            f"{res.producer} and op {res.op} (e.g. a scratch-buffer overflow), not computed wrongly "
            f"by op {res.op}"
        )
    elif res.kind == "output":
        res.message = (
            f"first divergent op {res.op} ({res.opcode}): same inputs, different output tensor {res.tensor} "
            f"({a_name} vs {b_name})"
        )
    else:
        res.message = f"first divergent op {res.op} ({res.opcode}): input tensor {res.tensor} already differs"
    return res


# ---- element-level dump analysis ------------------------------------------------------------------


@dataclass
class DumpDiff:
    """Element-level difference of one dumped tensor against a reference copy."""

    op: int
    tensor: int
    role: str
    against: str
    shape: tuple[int, ...]
    elements: int
    differing: int
    max_lsb: int
    lsb_histogram: dict[int, int]
    region: str
    rows: list[int]
    cols: list[int]
    channels: int

    @property
    def fraction(self) -> float:
        return self.differing / self.elements if self.elements else 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            **asdict(self),
            "shape": list(self.shape),
            "fraction": round(self.fraction, 6),
            "lsb_histogram": {str(k): v for k, v in sorted(self.lsb_histogram.items())},
        }


def describe_region(mask: np.ndarray) -> tuple[str, list[int], list[int], int]:
    """Where the True elements of ``mask`` sit: rows = axis -3, columns = axis -2 (NHWC)."""
    if not mask.any():
        return "none", [], [], 0
    nd = mask.ndim
    if nd < 2:
        idx = np.nonzero(mask.reshape(-1))[0]
        n = mask.size
        if set(idx.tolist()) == {n - 1}:
            return "last element only", [], [int(n - 1)], 0
        return ("everywhere" if idx.size == n else f"{idx.size} of {n} elements"), [], idx.tolist()[:64], 0
    row_ax = nd - 3 if nd >= 3 else nd - 2
    col_ax = nd - 2 if nd >= 3 else nd - 1
    rows, cols = (
        np.nonzero(mask.any(axis=tuple(a for a in range(nd) if a != ax)))[0].tolist()
        for ax in (row_ax, col_ax)
    )
    chans = int(np.count_nonzero(mask.any(axis=tuple(range(nd - 1))))) if nd >= 3 else 0
    h, w = mask.shape[row_ax], mask.shape[col_ax]
    if mask.all():
        return "everywhere", rows, cols, chans
    for hit, n, what in ((rows, h, "row"), (cols, w, "column")):
        for k, which in ((n - 1, "last"), (0, "first")):
            if hit == [k] and n > 1:
                return f"{which} {what} only ({what} {k} of {n})", rows, cols, chans
    border = np.zeros(mask.shape, dtype=bool)
    for ax, k in ((row_ax, 0), (row_ax, -1), (col_ax, 0), (col_ax, -1)):
        index: list[slice | int] = [slice(None)] * nd
        index[ax] = k
        border[tuple(index)] = True
    if not (mask & ~border).any():
        return "border only (first/last rows and columns)", rows, cols, chans
    return f"scattered over {len(rows)} of {h} rows and {len(cols)} of {w} columns", rows, cols, chans


def analyze_dump(op: int, tensor: int, role: str, got: np.ndarray, ref: np.ndarray, against: str) -> DumpDiff:
    """LSB differences of ``got`` vs ``ref`` (same shape), fraction affected and where."""
    g = np.asarray(got)
    r = np.asarray(ref).reshape(g.shape)
    diff = g.astype(np.int64) - r.astype(np.int64) if g.dtype.kind in "iu" else (g - r).astype(np.float64)
    mask = diff != 0
    hist: dict[int, int] = {}
    if mask.any() and g.dtype.kind in "iu":
        vals, counts = np.unique(diff[mask], return_counts=True)
        hist = {int(v): int(c) for v, c in zip(vals, counts, strict=True)}
    region, rows, cols, chans = describe_region(mask)
    return DumpDiff(
        op=op,
        tensor=tensor,
        role=role,
        against=against,
        shape=tuple(g.shape),
        elements=int(g.size),
        differing=int(np.count_nonzero(mask)),
        max_lsb=int(np.abs(diff).max()) if mask.any() else 0,
        lsb_histogram=hist,
        region=region,
        rows=rows[:64],
        cols=cols[:64],
        channels=chans,
    )


# ---- timing ---------------------------------------------------------------------------------------


class OpTime(TypedDict):
    op: int
    opcode: str
    us: dict[str, float]  # per variant
    speedup: float | None  # ansi / optimized


class TypeTime(TypedDict):
    count: int
    us: dict[str, float]
    speedup: float | None


class Timing(TypedDict):
    """Per-op time of the tapped variants (:func:`timing_table`)."""

    ops: list[OpTime]
    by_type: dict[str, TypeTime]
    total_us: dict[str, float]
    speedup: float | None


def timing_table(per_variant: Mapping[str, Sequence[TapOp]], cpu_mhz: Mapping[str, int]) -> Timing:
    """Per op: microseconds per variant and the speedup (ansi / optimized); totals per op type."""
    by_idx: dict[int, OpTime] = {}
    for v in per_variant:
        mhz = max(1, int(cpu_mhz.get(v, 240)))
        for o in per_variant[v]:
            row = by_idx.setdefault(o.idx, {"op": o.idx, "opcode": o.opcode, "us": {}, "speedup": None})
            if o.cycles is not None:
                row["us"][v] = o.cycles / mhz
    rows = [by_idx[k] for k in sorted(by_idx)]
    totals: dict[str, TypeTime] = {}
    total: dict[str, float] = {}
    for row in rows:
        row["speedup"] = _speedup([row])
        tot = totals.setdefault(row["opcode"], {"count": 0, "us": {}, "speedup": None})
        tot["count"] += 1
        for v, us in row["us"].items():  # a variant without a timed op has no total (unknown), never 0
            tot["us"][v] = tot["us"].get(v, 0.0) + us
            total[v] = total.get(v, 0.0) + us
    for name, tot in totals.items():
        tot["speedup"] = _speedup([r for r in rows if r["opcode"] == name])
    return {
        "ops": rows,
        "by_type": dict(sorted(totals.items(), key=lambda kv: -max(kv[1]["us"].values() or [0]))),
        "total_us": total,
        "speedup": _speedup(rows),
    }


def timing_cells(us: Mapping[str, float], speedup: float | None) -> tuple[str, str, str]:
    """Optimized us, ANSI C us and the speedup as the text and HTML reports print them; "-": unknown."""
    opt, ansi = (f"{us[v]:.1f}" if v in us else "-" for v in ("optimized", "ansi"))
    return opt, ansi, f"{speedup:.2f}x" if speedup is not None else "-"


def _speedup(rows: Sequence[OpTime]) -> float | None:
    """ANSI C / optimized time over the ops timed above zero in both; None: unknown (never a fake 0.0x)."""
    both = [r["us"] for r in rows if r["us"].get("ansi") and r["us"].get("optimized")]
    return sum(u["ansi"] for u in both) / sum(u["optimized"] for u in both) if both else None


# ---- consistency ----------------------------------------------------------------------------------


def check_outputs_untouched(run: CapturedRun, output_tensors: Sequence[int]) -> list[str]:
    """Where a tapped run's own records contradict each other: an op read a tensor with another CRC than
    the op that wrote it printed, or a final output is not what its last op record says it wrote."""
    problems = []
    last: dict[int, str] = {}
    by: dict[int, int] = {}  # tensor -> the op that wrote it last
    for o in run.ops:
        problems += [
            f"run i={run.index}: op {o.idx} read tensor {e.t} with CRC {e.crc} but op {by[e.t]} wrote "
            f"{last[e.t]}: the tensor was overwritten between the two ops (e.g. a scratch-buffer overflow)"
            for e in o.inputs
            if e.t in last and last[e.t] != e.crc
        ]
        for e in o.outputs:
            last[e.t], by[e.t] = e.crc, o.idx
    for k, t in enumerate(output_tensors):
        out = next((x for x in run.outputs if x.o == k), None)
        if out is None:
            continue
        if t not in last:
            problems.append(f"run i={run.index}: no OP record wrote model output {k} (tensor {t})")
        elif last[t] != out.crc:
            problems.append(
                f"run i={run.index}: output {k} has CRC {out.crc} but the op that wrote tensor {t} "
                f"printed {last[t]}: the output changed after its op ran (overwritten, or the tap "
                "interfered), so these op checksums do not explain the printed outputs"
            )
    return problems


# ---- flash-and-compare --tap ----------------------------------------------------------------------


@dataclass(frozen=True)
class TapFinding:
    """One variant's own evidence that its printed outputs are wrong (:func:`check_outputs_untouched`)."""

    variant: str
    text: str

    def __str__(self) -> str:
        return f"{self.variant}: {self.text}"


class DumpImage(TypedDict):
    """An image-shaped dumped tensor and its reference, for the HTML report."""

    op: int
    t: int
    role: str
    ref_name: str
    got: np.ndarray
    ref: np.ndarray


def divergences(run: Mapping[str, int | Divergence]) -> list[tuple[str, Divergence]]:
    """The divergences found for one input: optimized vs ANSI C, then each variant vs the host."""
    return [(k, d) for k in PAIRS if isinstance(d := run.get(k), Divergence)]


@dataclass
class TapResult:
    """What ``flash-and-compare --tap`` found, per input run, plus the dump run's evidence."""

    runs: list[dict[str, int | Divergence]] = field(default_factory=list)  # per input: "i" and divergences
    dump_ops: list[int] = field(default_factory=list)
    dumps: list[DumpDiff] = field(default_factory=list)
    timing: Timing | None = None
    audit: Audit | None = None  # ESP-NN speedup audit (analysis.hybrid.espnn_audit)
    repro: list[dict[str, Any]] = field(default_factory=list)  # one-op reproducers (flows.repro)
    ram_bytes: dict[str, int] = field(default_factory=dict)  # per variant, from OPEND
    problems: list[str] = field(default_factory=list)  # why the analysis is incomplete
    findings: list[TapFinding] = field(default_factory=list)  # the device's evidence of wrong outputs: exit 1
    notes: list[str] = field(default_factory=list)
    images: list[DumpImage] = field(default_factory=list)  # for the HTML report (not in JSON)

    @property
    def culprit(self) -> Divergence | None:
        """The first divergence that involves the optimized build (vs ANSI, else vs host)."""
        return next((d for run in self.runs for _, d in divergences(run) if d.op is not None), None)

    def summary_lines(self) -> list[str]:
        lines = [
            f"input {run['i']}: {key.replace('_', ' ')}: {d.message}"
            for run in self.runs
            for key, d in divergences(run)
        ]
        for dd in self.dumps:
            if dd.differing:
                hist = ", ".join(f"{k:+d} LSB x{v}" for k, v in sorted(dd.lsb_histogram.items()))
                lines.append(
                    f"op {dd.op} {dd.role}put tensor {dd.tensor} vs {dd.against}: {dd.differing} of "
                    f"{dd.elements} elements differ ({100 * dd.fraction:.2f}%), max {dd.max_lsb} LSB "
                    f"[{hist}], {dd.region}"
                )
            else:
                lines.append(f"op {dd.op} {dd.role}put tensor {dd.tensor} vs {dd.against}: identical")
        for r in self.repro:
            lines.append(
                f"one-op reproducer of op {r['op']} ({r['kind']}): {r.get('dir', '-')}"
                + ("" if r.get("ok") else f" (NOT verified: {r.get('why', 'no ANSI C output to check')})")
            )
        if self.audit is not None:
            lines += [f"ESP-NN audit: {k['message']}" for k in self.audit["kinds"]]
        lines += self.notes
        lines += [f"tap problem: {p}" for p in self.problems]
        return lines + [f"tap finding: {f}" for f in self.findings]

    @property
    def headline(self) -> str:
        """The first divergent op, else the device's own evidence, else what agrees on every op."""
        if self.culprit is not None:
            return self.culprit.message
        if self.findings:
            return "no op diverged, but the printed outputs are not what the ops wrote (tap findings)"
        host = any(k in VS_HOST for run in self.runs for k in run)
        return f"optimized, ANSI C{' and host' if host else ''} agree on every op checksum"

    def to_dict(self) -> dict[str, object]:
        return {
            "runs": [
                {k: (asdict(v) if isinstance(v, Divergence) else v) for k, v in r.items()} for r in self.runs
            ],
            "culprit": asdict(self.culprit) if self.culprit else None,
            "dump_ops": self.dump_ops,
            "dumps": [d.to_dict() for d in self.dumps],
            "timing": self.timing,
            "audit": self.audit,
            "repro": self.repro,
            "ram_bytes": self.ram_bytes,
            "problems": self.problems,
            "findings": [str(f) for f in self.findings],
            "headline": self.headline,
            "notes": self.notes,
            "summary": self.summary_lines(),
        }


def analyze_captures(
    model: ModelInfo, caps: Mapping[str, Capture], host_ops: Sequence[Sequence[TapOp]] | None
) -> TapResult:
    """Divergences per input run between the variants' op records and the host reference."""
    res = TapResult()
    outs = [t.index for t in model.outputs]
    for v, cap in caps.items():
        if not cap.tapped:
            res.problems.append(f"the {v} firmware did not report INFO tap=1: it was not built with --tap")
            continue  # no OP records: nothing to check its outputs against
        for run in cap.runs:
            res.findings += [TapFinding(v, p) for p in check_outputs_untouched(run, outs)]
            if run.ops_end is not None:
                res.ram_bytes[v] = int(run.ops_end["ram"])
    n = max((len(c.runs) for c in caps.values()), default=0)
    for i in range(n):
        row: dict[str, int | Divergence] = {"i": i}
        streams: dict[str, Sequence[TapOp]] = {
            v: device_taps(c.runs[i]) for v, c in caps.items() if i < len(c.runs)
        }
        if host_ops is not None and i < len(host_ops):
            streams["host"] = host_ops[i]
        for key, (x, y) in PAIRS.items():  # optimized vs ANSI C, then each variant vs the host
            if x in streams and y in streams:
                row[key] = first_divergence(x, streams[x], y, streams[y])
        res.runs.append(row)
        for key, d in row.items():
            if isinstance(d, Divergence) and (d.missing or d.layout_mismatch):
                res.problems.append(
                    f"input {i} {key}: ops {(d.missing + d.layout_mismatch)[:10]} could not be compared "
                    "(no record, or different tensor lists)"
                )
    mhz = {v: int(c.info.get("cpu_mhz", "240") or 240) for v, c in caps.items()}
    if caps and all(c.runs for c in caps.values()):
        res.timing = timing_table({v: device_taps(c.runs[0]) for v, c in caps.items()}, mhz)
        res.audit = audit_captures(model, caps)
    return res


def op_cycles(cap: Capture) -> dict[int, int]:
    """Op index -> CPU cycles of the first tapped run (ops without a cycle count are left out)."""
    if not cap.runs:
        return {}
    return {o.idx: int(o.cycles) for o in cap.runs[0].ops if o.cycles is not None}


def audit_captures(
    model: ModelInfo, caps: Mapping[str, Capture], noise_band: float = NOISE_BAND
) -> Audit | None:
    """The ESP-NN speedup audit of tapped optimized and ANSI C runs (None without both, or unknown chip)."""
    if "optimized" not in caps or "ansi" not in caps:
        return None
    chip = caps["optimized"].info.get("chip") or caps["optimized"].info.get("target") or ""
    try:
        native = bool(caps["optimized"].info.get("native"))  # a PC's timing: no audit claim
        cycles = op_cycles(caps["optimized"]), op_cycles(caps["ansi"])
        return espnn_audit(model, chip, *cycles, noise_band, native=native)
    except EspCheckError:  # a chip the ESP-NN table does not know: no expectation to audit against
        return None


def ops_to_dump(res: TapResult) -> list[int]:
    """The culprit op, plus the producer of a clobbered input (to show it wrote the right values)."""
    d = res.culprit
    if d is None or d.op is None:
        return []
    ops = {d.op}
    if d.kind == "clobbered_input" and d.producer is not None:
        ops.add(d.producer)
    return sorted(ops)


def analyze_dump_captures(
    res: TapResult,
    caps: Mapping[str, Capture],
    host_tensors: Sequence[Mapping[int, np.ndarray]] | None,
) -> None:
    """Element-level comparison of the dump run's first run: optimized vs ANSI and each vs host."""
    by_key = {v: {(d.idx, d.t, d.role): d for d in c.runs[0].dumps} for v, c in caps.items() if c.runs}
    host = host_tensors[0] if host_tensors else None
    for key in sorted(by_key.get("optimized", {})):
        op, t, role = key
        opt = by_key["optimized"][key].tensor
        ansi = by_key.get("ansi", {}).get(key)
        refs: list[tuple[str, np.ndarray]] = []
        if ansi is not None:
            refs.append(("ansi", ansi.tensor.data))
        if host is not None and t in host:
            refs.append(("host", host[t]))
        res.dumps += [analyze_dump(op, t, role, opt.data, ref, name) for name, ref in refs]
        if refs and opt.data.ndim == 4 and opt.data.shape[0] == 1:
            name, ref = refs[-1]  # the host reference when there is one
            ref_image = np.asarray(ref).reshape(opt.data.shape)
            res.images.append(
                {"op": op, "t": t, "role": role, "ref_name": name, "got": opt.data, "ref": ref_image}
            )
