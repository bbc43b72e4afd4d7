"""Quantization-aware comparison of output tensors: optimized vs ANSI C vs the host reference.

Sources are captured logs (protocol or legacy ``Output:`` lines), results JSON, ``.npy`` files, or
the host reference. Every verdict rests on evidence: a protocol capture must be valid (CRC-checked,
complete) or the comparison refuses to run (CaptureError, exit 3), and two captures that report the
same compiled-in ESP-NN mode or different models are refused (IncomparableError, exit 2).
All metrics are vectorised numpy.
"""

from __future__ import annotations

import base64
import io
import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harness.analysis.classify import Severity, classify
from harness.errors import (
    CaptureError,
    ExitCode,
    IncomparableError,
    LogFormatError,
    UsageError,
    Verdict,
    combine_exit_codes,
)
from harness.model.files import LOG_MAX_BYTES, read_regular
from harness.model.inputs import InputOptions, load_input
from harness.model.loader import load_model
from harness.model.modelinfo import TensorInfo
from harness.model.reference import run_reference
from harness.protocol.capture import MARKER, Capture, looks_like_device_output, parse_capture
from harness.protocol.legacy import parse_legacy_log
from harness.protocol.spec import crc32_hex

RESULTS_FORMAT = "esp-check-results"
RESULTS_VERSION = 1
PINNED_FRACTION = 0.9  # an output "sits pinned" when this share of elements is at the dtype min/max
TOPK = 5
DIFF_LIST_MAX = 64  # per-element LSB diffs are listed in reports for tensors up to this size
_INT_DTYPES = ("int8", "uint8", "int16", "int32")  # the quantized dtypes whose min/max "pin" an output


@dataclass
class OutputTensor:
    """One output tensor from any source, with what is known about its quantization."""

    index: int
    values: np.ndarray  # raw integers when ``raw``, else real values
    raw: bool
    shape: tuple[int, ...] | None = None  # None: unknown (legacy logs print a flat list)
    dtype: str | None = None  # quantized dtype (int8...) when known
    scale: float | None = None
    zero_point: int | None = None
    name: str = ""


def _typed_tensor(
    index: int, values: np.ndarray, dtype: str, scale: float | None, zero_point: int | None, name: str
) -> OutputTensor:
    """An output of a known dtype: raw integers and their quantization, or float32 real values."""
    raw = dtype != "float32"
    quantized = raw and scale is not None
    return OutputTensor(
        index,
        values,
        raw=raw,
        shape=tuple(values.shape),
        dtype=dtype,
        scale=scale if quantized else None,
        zero_point=zero_point if quantized else None,
        name=name,
    )


@dataclass
class Fault:
    """A firmware fault (ERROR record) a source reported: a finding, exit 4 (or 2 for stage=input)."""

    source: str
    stage: str
    code: int
    run: int | None
    msg: str

    @property
    def exit_code(self) -> ExitCode:
        if self.stage in ("model", "capture"):  # no model partition flashed, an unusable capture: exit 3
            return ExitCode.INFRASTRUCTURE
        return ExitCode.USAGE if self.stage == "input" else ExitCode.FIRMWARE_FAULT

    @property
    def kind(self) -> str:
        """What the report calls it: a firmware fault, or what else its exit code says it is."""
        return {ExitCode.INFRASTRUCTURE: "infrastructure error", ExitCode.USAGE: "input error"}.get(
            self.exit_code, "firmware fault"
        )


@dataclass
class Source:
    """One side of a comparison."""

    label: str
    kind: str  # protocol | legacy | results | npy | reference
    runs: list[list[OutputTensor]]  # runs[i][o]
    path: str | None = None
    nn_mode: str | None = None
    model_sha256: str | None = None
    input_sha256: list[str | None] = field(default_factory=list)
    simulated: bool = False
    info: dict[str, str] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    raw_log: bytes | None = None
    invoke_us: list[int | None] = field(default_factory=list)
    backend_version: str | None = None  # reference sources


@dataclass
class TensorComparison:
    """Metrics for one output tensor of one run between two sources."""

    a: str
    b: str
    run: int
    output: int
    name: str
    count: int
    mismatched: int
    tolerance_lsb: float
    units: str  # "lsb" (scale known or both raw), "real" (no scale: exact compare of real values)
    scale: float | None
    zero_point: int | None
    max_abs_diff: float | None  # real units (None when the scale is unknown for raw integers)
    mean_abs_diff: float | None
    max_diff_lsb: float | None
    mean_diff_lsb: float | None
    rmse: float | None
    cosine: float | None
    argmax_a: int | None
    argmax_b: int | None
    topk: int
    topk_agreement: float | None  # share of the top-k indices both sides have in common
    pinned_a: bool | None
    pinned_b: bool | None
    pinned_fraction_a: float | None
    pinned_fraction_b: float | None
    diff_lsb: list[float] | None  # |A - B| per element in LSB, for small tensors
    first_mismatches: list[dict[str, float | int]]
    values_a: list[float] | None = None  # real values, for small tensors
    values_b: list[float] | None = None

    @property
    def match(self) -> bool:
        return self.mismatched == 0

    @property
    def argmax_agree(self) -> bool | None:
        if self.argmax_a is None or self.argmax_b is None:
            return None
        return self.argmax_a == self.argmax_b

    def mismatch_text(self) -> str:
        """How this output differs, in the one wording of every report (JUnit, a run's reasons and
        testcases, flash-and-compare's summary, hybrid's why): ``optimized vs ansi, input 0 output 0
        [logits]: 83 of 832 elements differ by more than 0 LSB (max 3 LSB, argmax 5 vs 10)``."""
        where = f"{self.a} vs {self.b}, input {self.run} output {self.output}" + (
            f" [{self.name}]" if self.name else ""
        )
        head = f"{where}: {self.mismatched} of {self.count} elements differ"
        if self.units == "lsb":
            head += f" by more than {self.tolerance_lsb:g} LSB"
            notes = [] if self.max_diff_lsb is None else [f"max {self.max_diff_lsb:g} LSB"]
        else:  # no scale: real values, compared exactly
            notes = ["real values, no scale: compared exactly"]
            notes += [] if self.max_abs_diff is None else [f"max |diff| {self.max_abs_diff:g}"]
        notes += [] if self.argmax_a is None else [f"argmax {self.argmax_a} vs {self.argmax_b}"]
        return head + (f" ({', '.join(notes)})" if notes else "")


@dataclass
class CompareResult:
    """Everything ``esp-check compare`` reports."""

    sources: list[Source]
    comparisons: list[TensorComparison]
    faults: list[Fault]
    warnings: list[str]
    tolerance_lsb: float
    ref_tolerance_lsb: float
    reference_backend: str | None = None

    @property
    def simulated(self) -> bool:
        return any(s.simulated for s in self.sources)

    @property
    def exit_code(self) -> ExitCode:
        codes: list[ExitCode] = [f.exit_code for f in self.faults]
        codes += [ExitCode.MISMATCH for c in self.comparisons if not c.match]
        return combine_exit_codes(codes or [ExitCode.MATCH])

    @property
    def verdict(self) -> Verdict:
        return Verdict.from_exit_code(self.exit_code)


# ---- loading sources -----------------------------------------------------------------------------


def source_from_capture(
    cap: Capture, label: str, path: str | None = None, raw: bytes | None = None, crashes: Sequence[Fault] = ()
) -> Source:
    """A Source from a parsed protocol capture; refuses (CaptureError, exit 3) an invalid one, unless the
    log's text shows a crash (``crashes``): then a Source without runs, its faults the finding."""
    complete = cap.valid or not crashes
    if complete:
        cap.require_valid(path or label)
    runs = cap.runs if complete else []
    warnings = (
        list(cap.warnings) if complete else [f"{label}: the firmware crashed before its records completed"]
    )
    return Source(
        label=label,
        kind="protocol",
        runs=[
            [_typed_tensor(t.o, t.data, t.dtype, t.scale or None, t.zero_point, t.name) for t in run.outputs]
            for run in runs
        ],
        path=path,
        nn_mode=cap.nn_mode,
        model_sha256=cap.model_sha256,
        input_sha256=[r.input_sha256 for r in runs],
        simulated=cap.simulated,
        info=dict(cap.info),
        faults=[Fault(label, e.stage, e.code, e.i, e.msg) for e in cap.errors] + list(crashes),
        warnings=warnings,
        raw_log=raw,
        invoke_us=[r.invoke_us for r in runs],
    )


def _source_from_results(doc: object, label: str, path: str) -> Source:
    if isinstance(doc, list):
        try:
            vals = np.asarray([float(v) for v in doc], dtype=np.float64)
        except (TypeError, ValueError, OverflowError):
            raise LogFormatError(f"{path}: a JSON list must hold numbers only") from None
        if vals.size == 0:
            raise LogFormatError(f"{path}: the JSON list is empty")
        return Source(label, "results", [[OutputTensor(0, vals, raw=False)]], path=path)
    if not isinstance(doc, dict) or doc.get("format") != RESULTS_FORMAT:
        raise LogFormatError(
            f"{path}: not an esp-check results file (format {RESULTS_FORMAT!r}) or a list of numbers",
            hint="write one with harness.analysis.compare.results_document()",
        )
    if doc.get("version") != RESULTS_VERSION:
        raise LogFormatError(f"{path}: results version {doc.get('version')!r} is not supported")
    try:
        runs: list[list[OutputTensor]] = []
        for run in doc["runs"]:
            outs = []
            for t in run["outputs"]:
                dtype = str(t["dtype"])
                if dtype not in (*_INT_DTYPES, "float32"):
                    raise LogFormatError(f"{path}: dtype {dtype!r} not supported")
                data = base64.b64decode(t["data_b64"], validate=True)
                if crc32_hex(data) != t["crc32"]:
                    raise LogFormatError(
                        f"{path}: output data does not match its crc32", hint="the file is corrupted"
                    )
                shape = tuple(int(d) for d in t["shape"])
                arr = np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<")).reshape(shape)
                q = dtype != "float32" and t.get("scale") is not None
                scale, zero_point = (float(t["scale"]), int(t["zero_point"])) if q else (None, None)
                outs.append(
                    _typed_tensor(int(t["index"]), arr, dtype, scale, zero_point, str(t.get("name", "")))
                )
            runs.append(outs)
        return Source(
            label,
            "results",
            runs,
            path=path,
            nn_mode=doc.get("nn"),
            model_sha256=doc.get("model_sha256"),
            input_sha256=[r.get("input_sha256") for r in doc["runs"]],
            simulated=bool(doc.get("simulated")),
            info={str(k): str(v) for k, v in dict(doc.get("info", {})).items()},
        )
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise LogFormatError(f"{path}: malformed results file ({type(exc).__name__}: {exc})") from None


def results_document(source: Source) -> dict[str, object]:
    """Serialise a Source's raw outputs as an esp-check results file (exact bytes, CRC-protected)."""
    runs = []
    for k, outs in enumerate(source.runs):
        tensors = []
        for t in outs:
            dtype = t.dtype or ("float32" if not t.raw else str(t.values.dtype))
            data = np.ascontiguousarray(t.values, dtype=np.dtype(dtype).newbyteorder("<")).tobytes()
            tensors.append(
                {
                    "index": t.index,
                    "name": t.name,
                    "dtype": dtype,
                    "shape": list(t.shape if t.shape is not None else t.values.shape),
                    "scale": t.scale,
                    "zero_point": t.zero_point,
                    "data_b64": base64.b64encode(data).decode("ascii"),
                    "crc32": crc32_hex(data),
                }
            )
        sha = source.input_sha256[k] if k < len(source.input_sha256) else None
        runs.append({"index": k, "input_sha256": sha, "outputs": tensors})
    return {
        "format": RESULTS_FORMAT,
        "version": RESULTS_VERSION,
        "nn": source.nn_mode,
        "model_sha256": source.model_sha256,
        "simulated": source.simulated,
        "info": source.info,
        "runs": runs,
    }


def load_source(path: str | Path, label: str) -> Source:
    """Load one side of a comparison from a file (type from extension and content)."""
    p = Path(path)
    data = read_regular(
        p,
        what="capture",
        max_bytes=LOG_MAX_BYTES,
        error=LogFormatError,
        big_hint="compare reads one captured run (a flash-and-compare capture is a few MB): cut the log "
        "to the run it holds",
    )
    if not data.strip():
        raise LogFormatError(
            f"{p} is empty: nothing to compare",
            hint="capture the serial output again (was the monitor connected at boot?)",
        )
    if p.suffix.lower() == ".npy":
        try:
            arr = np.load(io.BytesIO(data), allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise LogFormatError(f"{p} is not a readable .npy file: {exc}") from None
        raw = arr.dtype.kind in "iu"
        if arr.dtype.kind not in "iuf":
            raise LogFormatError(f"{p}: .npy dtype {arr.dtype} is not numeric")
        return Source(
            label,
            "npy",
            [[OutputTensor(0, arr, raw=raw, shape=tuple(arr.shape), dtype=str(arr.dtype) if raw else None)]],
            path=str(p),
        )
    if p.suffix.lower() == ".json":
        try:
            doc = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:  # incl. JSONDecodeError, over-long integers
            raise LogFormatError(f"{p} is not valid JSON: {exc}") from None
        except RecursionError:
            raise LogFormatError(f"{p} is not a results file: its JSON is nested too deeply") from None
        return _source_from_results(doc, label, str(p))
    return _source_from_log(data, label, p)


def _source_from_log(data: bytes, label: str, path: Path) -> Source:
    """A serial log: its protocol records (or legacy ``Output:`` lines), read by the same classifier as
    flash-and-compare, so a log that holds a panic, abort or TFLM error is a firmware fault (exit 4),
    never "corrupted capture" (3), whether or not its records completed."""
    cap = parse_capture(data) if MARKER in data else None
    crashes = _firmware_faults(data, cap, label)
    if cap is not None:
        return source_from_capture(cap, label, str(path), data, crashes)
    values = parse_legacy_log(data)
    if not values and not crashes and looks_like_device_output(data):
        raise CaptureError(
            f"{path} is a device's serial output without esp-check records or 'Output:' lines: the capture "
            "ended before the first result (truncated)",
            hint="capture again and wait for the END record (or the 'Output:' lines); check the cable, "
            "the baud rate and that the monitor stayed connected",
        )
    if not values and not crashes:
        raise LogFormatError(
            f"{path} has no 'Output:' lines and no esp-check protocol records: nothing to compare",
            hint="pass the serial log of a run (esp-check firmware or a sketch printing 'Output: <value>')",
        )
    runs = [[OutputTensor(0, np.asarray(values, dtype=np.float64), raw=False)]] if values else []
    src = Source(label, "legacy", runs, path=str(path), raw_log=data, faults=crashes)
    src.warnings.append(f"{label}: legacy log: the ESP-NN mode and model are not proven by the device")
    return src


def _firmware_faults(data: bytes, cap: Capture | None, label: str) -> list[Fault]:
    """Firmware faults the log's text shows (crash reports, TFLM errors, ...), as compare Faults.

    The device's own ERROR records are left to the capture (they are already Faults)."""
    return [
        Fault(label, f.kind, 0, None, f.message)
        for f in classify(data, parsed=cap)
        if f.severity == Severity.FIRMWARE_FAULT and f.details.get("source") != "protocol"
    ]


# ---- metrics -------------------------------------------------------------------------------------


def _snap(real: np.ndarray, scale: float, zp: int) -> np.ndarray | None:
    """Quantized integers for real values printed from quantized ones; None if off the grid."""
    if real.size == 0:
        return real.astype(np.int64)
    if not np.all(np.isfinite(real)):
        return None
    x = real / scale
    q = np.where(x >= 0, np.floor(x + 0.5), np.ceil(x - 0.5))
    eps = min(0.25, 1e-3 + 6e-7 / scale)  # %.6f prints are off the grid by up to 5e-7
    if float(np.max(np.abs(x - q))) > eps or float(np.max(np.abs(q))) > 2**40:
        return None
    return q.astype(np.int64) + int(zp)


def _pinned(quantized: np.ndarray | None, dtype: str | None) -> float | None:
    if quantized is None or dtype not in _INT_DTYPES or quantized.size == 0:
        return None
    lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
    return float(np.count_nonzero((quantized == lo) | (quantized == hi))) / quantized.size


def _topk(v: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values, ties broken by lower index (= stable argsort), in O(n)."""
    if k <= 0:
        return np.zeros(0, dtype=np.intp)
    kth = np.partition(v, v.size - k)[v.size - k]  # k-th largest value
    above = np.flatnonzero(v > kth)
    ties = np.flatnonzero(v == kth)[: k - above.size]
    cand = np.concatenate([above, ties])
    return cand[np.lexsort((cand, -v[cand]))]


@dataclass
class _Diff:
    """Element-wise difference of two tensors, in LSB where the scale is known."""

    real_a: np.ndarray  # real values of A (dequantized when the scale is known)
    real_b: np.ndarray
    int_a: np.ndarray | None  # quantized integers when known (raw, or snapped from printed reals)
    int_b: np.ndarray | None
    lsb: np.ndarray | None  # A - B in LSB, None when the scale is unknown
    beyond: np.ndarray  # bool: beyond the tolerance (NaN counts as beyond)
    real_known: bool
    abs_real: np.ndarray  # |A - B| in real units (in LSB when the scale of integers is unknown)

    @property
    def int_path(self) -> bool:
        return self.int_a is not None and self.int_b is not None

    @property
    def units(self) -> str:
        return "lsb" if self.lsb is not None else "real"


def compare_tensors(
    a: OutputTensor,
    b: OutputTensor,
    *,
    tolerance_lsb: float = 0,
    scale: float | None = None,
    zero_point: int | None = None,
    dtype: str | None = None,
    labels: tuple[str, str] = ("A", "B"),
    run: int = 0,
) -> TensorComparison:
    """Compare one output tensor; ``scale``/``zero_point``/``dtype`` fill in what the sources lack."""
    la, lb = labels
    s, zp = _common_quant(a, b, run, labels, scale, zero_point)
    qdtype = a.dtype or b.dtype or dtype or ("int8" if s is not None and zero_point is not None else None)
    d = _difference(a, b, s, zp, tolerance_lsb, run)
    n = int(d.real_a.size)
    stats = _stats(d, n)
    k = min(TOPK, n)
    ka, kb = _rank_keys(d)
    topk_agree = (len(set(_topk(ka, k).tolist()) & set(_topk(kb, k).tolist())) / k) if k else None
    pf_a, pf_b = _pinned(d.int_a, qdtype), _pinned(d.int_b, qdtype)
    bad = np.flatnonzero(d.beyond)
    first = [
        {
            "index": int(j),
            "a": float(d.real_a[j]),
            "b": float(d.real_b[j]),
            **({"diff_lsb": float(d.lsb[j])} if d.lsb is not None else {}),
        }
        for j in bad[:10]
    ]
    small = n <= DIFF_LIST_MAX
    return TensorComparison(
        a=la,
        b=lb,
        run=run,
        output=a.index,
        name=a.name or b.name,
        count=n,
        mismatched=int(bad.size),
        tolerance_lsb=tolerance_lsb,
        units=d.units,
        scale=s,
        zero_point=zp,
        **stats,
        argmax_a=int(np.argmax(ka)) if n else None,
        argmax_b=int(np.argmax(kb)) if n else None,
        topk=k,
        topk_agreement=topk_agree,
        pinned_a=None if pf_a is None else pf_a >= PINNED_FRACTION,
        pinned_b=None if pf_b is None else pf_b >= PINNED_FRACTION,
        pinned_fraction_a=pf_a,
        pinned_fraction_b=pf_b,
        diff_lsb=[float(x) for x in np.abs(d.lsb)] if small and d.lsb is not None else None,
        first_mismatches=first,
        values_a=[float(x) for x in d.real_a] if small else None,
        values_b=[float(x) for x in d.real_b] if small else None,
    )


def _common_quant(
    a: OutputTensor,
    b: OutputTensor,
    run: int,
    labels: tuple[str, str],
    scale: float | None,
    zero_point: int | None,
) -> tuple[float | None, int | None]:
    """The (scale, zero point) both sides share; IncomparableError when they are not one tensor."""
    la, lb = labels
    if a.values.size != b.values.size:
        raise IncomparableError(
            f"run {run} output {a.index}: {la} has {a.values.size} values, {lb} has {b.values.size}",
            hint="both sides must come from the same model (a truncated legacy log also shows up here)",
        )
    if a.shape is not None and b.shape is not None and tuple(a.shape) != tuple(b.shape):
        raise IncomparableError(
            f"run {run} output {a.index}: shape {list(a.shape)} ({la}) vs {list(b.shape)} ({lb})"
        )
    qa = (a.scale, a.zero_point) if a.scale is not None else None
    qb = (b.scale, b.zero_point) if b.scale is not None else None
    if qa is not None and qb is not None and (not math.isclose(qa[0], qb[0], rel_tol=1e-6) or qa[1] != qb[1]):
        raise IncomparableError(
            f"run {run} output {a.index}: quantization differs: scale/zp {qa} ({la}) vs {qb} ({lb})",
            hint="the two runs used different models",
        )
    s, zp = qa or qb or (scale, zero_point)
    return s, (zp or 0) if s is not None else None


def _difference(
    a: OutputTensor, b: OutputTensor, scale: float | None, zp: int | None, tolerance_lsb: float, run: int
) -> _Diff:
    """Integers when both sides have them (exact), else real values (NaN-aware)."""
    va, vb = a.values.reshape(-1), b.values.reshape(-1)

    def to_int(t: OutputTensor, v: np.ndarray) -> np.ndarray | None:
        if t.raw:
            return v.astype(np.int32 if v.dtype.itemsize <= 2 else np.int64)  # exact, half the memory
        if scale is not None and zp is not None:
            return _snap(v.astype(np.float64), scale, zp)
        return None

    int_a, int_b = to_int(a, va), to_int(b, vb)
    both = int_a is not None and int_b is not None

    def to_real(t: OutputTensor, v: np.ndarray, ints: np.ndarray | None) -> np.ndarray:
        """Dequantized integers (both sides have them, or ``t`` holds raw ones), else ``v`` as reals."""
        if ints is None or scale is None or zp is None or not (both or t.raw):
            return v.astype(np.float64)
        return (ints - zp).astype(np.float64) * scale

    real_a, real_b = to_real(a, va, int_a), to_real(b, vb, int_b)
    if int_a is not None and int_b is not None:
        dl = (int_a - int_b).astype(np.float64)
        beyond = ~(np.abs(dl) <= tolerance_lsb)  # never a match by a NaN tolerance (also refused earlier)
        ad = np.abs(dl) * (scale if scale is not None else 1.0)
        return _Diff(real_a, real_b, int_a, int_b, dl, beyond, real_known=scale is not None, abs_real=ad)
    if (a.raw or b.raw) and scale is None:
        raise IncomparableError(
            f"run {run} output {a.index}: one side holds raw quantized integers, the other real values, "
            "and the output scale is unknown",
            hint="pass --scale and --zero-point, or --model",
        )
    both_nan = np.isnan(real_a) & np.isnan(real_b)
    with np.errstate(invalid="ignore"):  # inf - inf is NaN: counted as a mismatch below
        diff = np.where(both_nan | (real_a == real_b), 0.0, real_a - real_b)
    if scale is None and tolerance_lsb:
        raise UsageError(
            "--tolerance-lsb needs the output scale for real-valued outputs",
            hint="pass --scale and --zero-point, or --model",
        )
    lsb = diff / scale if scale is not None else None
    # NaN is a mismatch; without a scale the tolerance is 0: only equal values (or two NaNs) match
    beyond = ~(np.abs(diff if lsb is None else lsb) <= tolerance_lsb)
    return _Diff(real_a, real_b, int_a, int_b, lsb, beyond, real_known=True, abs_real=np.abs(diff))


def _stats(diff: _Diff, n: int) -> dict[str, float | None]:
    """max/mean LSB and absolute differences, RMSE and cosine similarity."""
    alsb = np.abs(diff.lsb) if diff.lsb is not None else None
    max_lsb: float | None = None
    mean_lsb: float | None = None
    if alsb is not None and n and (diff.int_path or not np.all(np.isnan(alsb))):
        max_lsb, mean_lsb = float(np.nanmax(alsb)), float(np.nanmean(alsb))
    real_a, real_b, ad = diff.real_a, diff.real_b, diff.abs_real
    finite = diff.int_path or not n or bool(np.all(np.isfinite(ad)))  # integers: no NaN/inf to guard against
    with np.errstate(invalid="ignore", over="ignore"):
        na, nb = float(np.linalg.norm(real_a)), float(np.linalg.norm(real_b))
        cosine = (
            float(np.dot(real_a, real_b) / (na * nb))
            if n and na > 0 and nb > 0 and math.isfinite(na * nb)
            else None
        )
        if cosine is None and n and na == 0 and nb == 0:
            cosine = 1.0
        return {
            "max_abs_diff": float(ad.max()) if n and diff.real_known else None,
            "mean_abs_diff": float(ad.mean()) if n and diff.real_known else None,
            "max_diff_lsb": max_lsb,
            "mean_diff_lsb": mean_lsb,
            "rmse": float(np.sqrt(np.mean(ad * ad))) if n and finite else None,
            "cosine": cosine,
        }


def _rank_keys(diff: _Diff) -> tuple[np.ndarray, np.ndarray]:
    """Values to rank for argmax/top-k: the integers when known (same order), NaN ranked lowest."""
    if diff.int_a is not None and diff.int_b is not None:
        return diff.int_a, diff.int_b
    ka = diff.real_a if not np.any(np.isnan(diff.real_a)) else np.nan_to_num(diff.real_a, nan=-np.inf)
    kb = diff.real_b if not np.any(np.isnan(diff.real_b)) else np.nan_to_num(diff.real_b, nan=-np.inf)
    return ka, kb


# ---- runs ----------------------------------------------------------------------------------------


def check_tolerances(tolerance_lsb: float, ref_tolerance_lsb: float) -> None:
    """UsageError unless both tolerances are finite and >= 0 (a NaN tolerance would match anything)."""
    for name, tol in (("--tolerance-lsb", tolerance_lsb), ("--ref-tolerance-lsb", ref_tolerance_lsb)):
        if not (math.isfinite(tol) and tol >= 0):
            raise UsageError(f"{name} {tol} must be a finite number >= 0", hint=f"e.g. {name} 0")


def _check_legacy_lengths(a: Source, b: Source) -> None:
    """Two legacy logs of different lengths: at least one is an incomplete capture (exit 3)."""
    if a.kind == b.kind == "legacy" and not (a.faults or b.faults):  # a crash is the finding itself
        na, nb = (sum(t.values.size for run in s.runs for t in run) for s in (a, b))
        if na != nb:
            raise CaptureError(
                f"legacy logs of different lengths: {a.label} has {na} values, {b.label} has {nb}: "
                "at least one capture is incomplete",
                hint="capture both runs to the end, or pass --model so each log is checked against "
                "the model's output size",
            )


def _fit_legacy(src: Source, outputs: Sequence[TensorInfo]) -> Source:
    """A legacy log checked against the model: exactly its output size, split into its outputs.

    A legacy log carries no END record, so its element count is the only completeness check there is:
    any other count is an incomplete (or foreign) capture, exit 3 and never a match.
    """
    if src.kind != "legacy" or src.faults:  # a crashed log is incomplete by nature: the fault decides
        return src
    values = np.concatenate([t.values.reshape(-1) for run in src.runs for t in run])
    sizes = [int(t.num_elements) for t in outputs]
    if values.size != sum(sizes):
        raise CaptureError(
            f"{src.label}: the legacy log has {values.size} output values, the model's outputs have "
            f"{sum(sizes)}: an incomplete capture",
            hint="capture the whole run (check the monitor's buffer and that the sketch prints every "
            "output), or pass the model the firmware ran",
        )
    tensors, start = [], 0
    for k, (t, n) in enumerate(zip(outputs, sizes, strict=True)):
        part = values[start : start + n].reshape(tuple(t.shape))
        start += n
        tensors.append(OutputTensor(k, part, raw=False, shape=tuple(t.shape), name=str(t.name)))
    src.runs = [tensors]
    return src


def _check_identity(a: Source, b: Source) -> None:
    crashed = any(s.faults and not s.runs for s in (a, b))  # a crash is the finding; nothing to vouch for
    proven = ("protocol", "results")
    if a.kind in proven and b.kind in proven and (a.nn_mode or b.nn_mode) and not crashed:
        if a.nn_mode == b.nn_mode:
            raise IncomparableError(
                f"{a.label} and {b.label} both report ESP-NN mode {a.nn_mode!r}: "
                "comparing them proves nothing",
                hint="compare an optimized build with an ANSI C build (check the sdkconfig.defaults of each)",
            )
        for s in (a, b):
            if s.nn_mode not in ("optimized", "ansi_c"):
                raise IncomparableError(
                    f"{s.label} reports ESP-NN mode {s.nn_mode!r}: "
                    "the firmware does not prove which kernels ran",
                    hint="rebuild with esp-check's firmware templates",
                )
    if a.model_sha256 and b.model_sha256 and a.model_sha256 != b.model_sha256:
        raise IncomparableError(
            f"{a.label} and {b.label} ran different models (model_sha256 {a.model_sha256} vs "
            f"{b.model_sha256})",
            hint="flash both variants generated from the same .tflite",
        )
    for k, (ha, hb) in enumerate(zip(a.input_sha256, b.input_sha256, strict=False)):
        if ha and hb and ha != hb:
            raise IncomparableError(
                f"{a.label} and {b.label} ran different inputs: run {k} input_sha256 {ha} ({a.label}) vs "
                f"{hb} ({b.label}); their outputs say nothing about the kernels",
                hint="generate both variants from the same inputs (and preprocessing options)",
            )
    for k, (run_a, run_b) in enumerate(zip(a.runs, b.runs, strict=False)):
        sa = {t.index: tuple(t.shape) for t in run_a if t.shape is not None}
        sb = {t.index: tuple(t.shape) for t in run_b if t.shape is not None}
        if sa and sb and sa != sb:
            raise IncomparableError(
                f"{a.label} and {b.label} have different outputs in run {k}: {_shapes(sa)} vs {_shapes(sb)}",
                hint="both sides must come from the same model",
            )


def _check_reference_identity(source: Source, reference: Source | None) -> None:
    """IncomparableError when ``source`` ran another model or other inputs than the host reference."""
    if reference is None or source is reference:
        return
    if source.model_sha256 and reference.model_sha256 and source.model_sha256 != reference.model_sha256:
        raise IncomparableError(
            f"{source.label} ran model {source.model_sha256[:12]}..., "
            f"but --model is {reference.model_sha256[:12]}...",
            hint="pass the .tflite the firmware was generated from",
        )
    for k, (sha, ref_sha) in enumerate(zip(source.input_sha256, reference.input_sha256, strict=False)):
        if sha and ref_sha and sha != ref_sha:
            raise IncomparableError(
                f"{source.label} run {k} used input {sha[:12]}..., "
                f"but --input #{k + 1} quantizes to {ref_sha[:12]}...",
                hint="pass the inputs (and preprocessing options) the firmware was generated with",
            )


def _shapes(shapes: dict[int, tuple[int, ...]]) -> str:
    return ", ".join(f"output {i} {list(sh)}" for i, sh in sorted(shapes.items()))


def compare_sources(
    a: Source,
    b: Source,
    reference: Source | None = None,
    *,
    tolerance_lsb: float = 0,
    ref_tolerance_lsb: float = 0,
    scale: float | None = None,
    zero_point: int | None = None,
    output_quant: Sequence[tuple[float | None, int | None, str | None]] = (),
) -> CompareResult:
    """Compare A with B (tolerance_lsb) and each with the reference (ref_tolerance_lsb).

    ``output_quant[o]`` = (scale, zero point, dtype) from the model; ``scale``/``zero_point`` flags
    apply to every output. Raises IncomparableError when the sources cannot honestly be compared.
    """
    check_tolerances(tolerance_lsb, ref_tolerance_lsb)
    _check_identity(a, b)
    sources = [a, b] + ([reference] if reference is not None else [])
    for s in (a, b):
        _check_reference_identity(s, reference)
    faults = [f for s in sources for f in s.faults]
    warnings = [w for s in sources for w in s.warnings]
    pairs: list[tuple[Source, Source, float]] = [(a, b, tolerance_lsb)]
    if reference is not None:
        pairs += [(a, reference, ref_tolerance_lsb), (b, reference, ref_tolerance_lsb)]
    comparisons: list[TensorComparison] = []
    for x, y, tol in pairs:
        faulted = bool(x.faults or y.faults)
        if len(x.runs) != len(y.runs) and not faulted:
            raise IncomparableError(
                f"{x.label} has {len(x.runs)} runs (inputs), {y.label} has {len(y.runs)}",
                hint="give the same inputs to both",
            )
        for k in range(min(len(x.runs), len(y.runs))):
            ox, oy = x.runs[k], y.runs[k]
            if len(ox) != len(oy) and not faulted:
                raise IncomparableError(f"run {k}: {x.label} has {len(ox)} outputs, {y.label} has {len(oy)}")
            by_y = {t.index: t for t in oy}
            for tx in ox:
                ty = by_y.get(tx.index)
                if ty is None:
                    continue
                mq = output_quant[tx.index] if tx.index < len(output_quant) else (None, None, None)
                try:
                    compared = compare_tensors(
                        tx,
                        ty,
                        tolerance_lsb=tol,
                        scale=mq[0] if mq[0] is not None else scale,
                        zero_point=mq[1] if mq[0] is not None else zero_point,
                        dtype=mq[2],
                        labels=(x.label, y.label),
                        run=k,
                    )
                except IncomparableError:
                    if not faulted:
                        raise
                    continue  # a crashed side's partial outputs: its fault is the finding
                comparisons.append(compared)
    try:
        warnings += empty_outputs((c.output, c.name, c.count) for c in comparisons)
    except IncomparableError:
        if not faults:  # a crash is the finding, compared or not
            raise
    warnings += _pinned_warnings(comparisons)
    return CompareResult(
        sources,
        comparisons,
        faults,
        warnings=warnings,
        tolerance_lsb=tolerance_lsb,
        ref_tolerance_lsb=ref_tolerance_lsb,
        reference_backend=reference.backend_version if reference is not None else None,
    )


def empty_outputs(outputs: Iterable[tuple[int, str, int]]) -> list[str]:
    """The one rule for outputs without elements, as (index, name, elements compared) of every run: a
    comparison of none is no evidence, so each such output is said not compared (the verdict rests on the
    others), and when no output has any, nothing was compared: IncomparableError (exit 2), never a match."""
    sizes: Counter[tuple[int, str]] = Counter()
    for o, name, n in outputs:
        sizes[o, name] += n
    empty = [
        f"output {o}" + (f" [{name}]" if name else "") for (o, name), n in sorted(sizes.items()) if not n
    ]
    if len(empty) == len(sizes):
        raise IncomparableError(
            "nothing to compare: "
            + ("; ".join(f"{e} has zero elements" for e in empty) or "no run has outputs on both sides"),
            hint="a verdict needs elements compared on both sides: check that both ran the same model "
            "and inputs, and the model's output shapes (esp-check inspect MODEL)",
        )
    return [f"{e} has zero elements: not compared, the verdict rests on the other outputs" for e in empty]


Quant = tuple[float | None, int | None, str | None]


def output_quant(outputs: Sequence[TensorInfo]) -> list[Quant]:
    """(scale, zero point, dtype) per model output, as compare_sources takes them."""
    return [(t.scale, t.zero_point, t.dtype) if t.scale else (None, None, t.dtype) for t in outputs]


def compare_variants(
    optimized: Source | None,
    ansi: Source | None,
    reference: Source | None,
    *,
    tolerance_lsb: float,
    ref_tolerance_lsb: float,
    output_quant: Sequence[Quant],
) -> CompareResult | None:
    """Optimized vs ANSI C (and each vs the host); a lone valid variant is still checked against the
    host; None when nothing can honestly be compared (the variants' failures decide the verdict)."""
    if optimized is not None and ansi is not None:
        a, b, ref, tol = optimized, ansi, reference, tolerance_lsb
    elif (only := optimized if optimized is not None else ansi) is not None and reference is not None:
        a, b, ref, tol = only, reference, None, ref_tolerance_lsb
    else:
        return None
    return compare_sources(
        a, b, ref, tolerance_lsb=tol, ref_tolerance_lsb=ref_tolerance_lsb, output_quant=output_quant
    )


def _pinned_warnings(comparisons: Sequence[TensorComparison]) -> list[str]:
    """One warning per (side, run, output) pinned where its counterpart is not, one note per saturation.

    Outputs pinned on one side only are a known symptom of broken optimized kernels. Outputs pinned on
    every side (a confident softmax) are legitimate, but they hide small kernel differences.
    """
    out: list[str] = []
    pinned_alone: dict[tuple[str, int, int], str] = {}
    saturated: set[tuple[int, int]] = set()
    for c in comparisons:
        if c.pinned_a is None or c.pinned_b is None:
            continue
        if c.pinned_a and c.pinned_b:
            saturated.add((c.run, c.output))
        elif c.pinned_a or c.pinned_b:
            side, other = (c.a, c.b) if c.pinned_a else (c.b, c.a)
            pinned_alone.setdefault((side, c.run, c.output), other)
    for (side, run, output), other in pinned_alone.items():
        out.append(
            f"{side} run {run} output {output}: outputs sit pinned at the dtype min/max while {other}'s "
            "do not (a known symptom of broken optimized kernels)"
        )
    for run, output in sorted(saturated):
        if not any(k[1:] == (run, output) for k in pinned_alone):
            out.append(
                f"run {run} output {output} is saturated (>= {PINNED_FRACTION:.0%} of elements at the dtype "
                "min/max) on every side: small kernel differences can hide there; add an input whose "
                "output is less confident"
            )
    return out


def reference_source(
    model_path: str | Path,
    input_paths: Sequence[str | Path],
    backend: str = "tflm",
    input_options: InputOptions | None = None,
) -> Source:
    """Run the host reference on the model for each input (one input tensor per model).

    ``input_options`` (harness.model.inputs.InputOptions) must be the preprocessing the firmware's inputs
    were made with, or the input hashes will not match and the comparison is refused.
    """
    info = load_model(model_path)
    if len(info.inputs) != 1:
        raise UsageError(
            f"{model_path} has {len(info.inputs)} inputs; compare --input supports one-input models",
            hint="compare against a reference .npy per output instead",
        )
    prepared = [load_input(p, info.inputs[0], input_options) for p in input_paths]
    result = run_reference(model_path, [[p.quantized] for p in prepared], backend=backend)
    runs = [
        [
            _typed_tensor(o, arr, t.dtype, t.scale, t.zero_point, t.name)
            for o, (arr, t) in enumerate(zip(run.outputs, info.outputs, strict=True))
        ]
        for run in result.runs
    ]
    return Source(
        "reference",
        "reference",
        runs,
        path=str(model_path),
        model_sha256=result.model_sha256 or info.sha256,
        input_sha256=[p.sha256 for p in prepared],
        backend_version=f"{result.backend_version} ({result.kernels})"
        if result.kernels
        else result.backend_version,
    )


def _load_pair(a: str | Path, b: str | Path) -> tuple[Source, Source]:
    """Both sides. A side whose capture is unusable (exit 3) does not hide a crash the other side shows
    (4 before 3, as in flash-and-compare): it becomes a side without runs whose failure is a ``capture``
    fault; without a crash on the other side its error is raised as it is."""
    loaded: dict[str, Source | CaptureError] = {}
    for path, label in ((a, "A"), (b, "B")):
        try:
            loaded[label] = load_source(path, label)
        except CaptureError as exc:
            loaded[label] = exc
    crashed = any(
        isinstance(s, Source) and any(f.exit_code == ExitCode.FIRMWARE_FAULT for f in s.faults)
        for s in loaded.values()
    )
    sides: list[Source] = []
    for (label, side), path in zip(loaded.items(), (a, b), strict=True):
        if isinstance(side, CaptureError):
            if not crashed:
                raise side
            msg = f"{side.message}; {side.hint}" if side.hint else side.message
            side = Source(
                label, "capture", [], path=str(path), faults=[Fault(label, "capture", 0, None, msg)]
            )
        sides.append(side)
    return sides[0], sides[1]


def compare_files(
    a: str | Path,
    b: str | Path,
    *,
    model: str | Path | None = None,
    inputs: Sequence[str | Path] = (),
    scale: float | None = None,
    zero_point: int | None = None,
    tolerance_lsb: float = 0,
    ref_tolerance_lsb: float = 0,
) -> CompareResult:
    """What ``esp-check compare`` does: load both sides, optionally the host reference, compare."""
    if inputs and model is None:
        raise UsageError("--input needs --model (the host reference runs the model on the inputs)")
    if (scale is None) != (zero_point is None):
        raise UsageError("--scale and --zero-point go together")
    if scale is not None and not (math.isfinite(scale) and scale > 0):
        raise UsageError(f"--scale {scale} must be a positive number")
    sa, sb = _load_pair(a, b)
    ref = None
    quant: list[Quant] = []
    if model is None:
        _check_legacy_lengths(sa, sb)
    else:
        info = load_model(model)
        quant = output_quant(info.outputs)
        sa, sb = (_fit_legacy(s, info.outputs) for s in (sa, sb))
        for s in (sa, sb):
            if s.model_sha256 and s.model_sha256 != info.sha256:
                raise IncomparableError(
                    f"{s.label} ran model {s.model_sha256[:12]}..., --model {model} is {info.sha256[:12]}...",
                    hint="pass the .tflite the firmware was built from",
                )
        if inputs:
            ref = reference_source(model, inputs)
    return compare_sources(
        sa,
        sb,
        ref,
        tolerance_lsb=tolerance_lsb,
        ref_tolerance_lsb=ref_tolerance_lsb,
        scale=scale,
        zero_point=zero_point,
        output_quant=quant,
    )
