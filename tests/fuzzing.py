"""Seeded mutation fuzzing of esp-check's parsers through its real CLI (``harness.cli.main``).

Shared by ``tests/test_fuzz.py`` (bounded, in CI) and ``bench/fuzz.py`` (long runs). Three targets:

- captures: two protocol captures of the same outputs (optimized and ANSI C, printed by the real
  Python emitter); one or both mutated (bytes and lines flipped, dropped, duplicated, reordered;
  data bytes or fields changed with the CRCs recomputed), then ``esp-check compare A B``;
- legacy logs: the ``Output:`` log of the original bug report, mutated, against itself;
- models: the fixture models mutated (bit flips, truncation, huge vector lengths, smashed shapes
  and indices), then ``esp-check inspect`` and ``esp-check reference`` on zeros.

The oracle for "exit 0" is independent of esp-check's parser: :func:`naive_capture` reads only the
CRC-valid records of the first boot by a separate, simple decoder, and exit 0 is a false match
unless both sides' output bytes and identities (model hash, input hashes, dtype/shape/scale/zero
point of every output) are equal there. Every mutant derives from ``random.Random(f"{seed}:{kind}:{k}")``
alone, so any mutant can be regenerated from its number.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import math
import random
import re
import signal
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.cli import main
from harness.protocol.emitter import PythonEmitter, RunSpec, TensorSpec, emit_capture
from harness.protocol.legacy import decode_microprintf_float

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "tests" / "data" / "models"
LEGACY_LOG = ROOT / "tests" / "data" / "logs" / "report_ansi_c.log"
FUZZ_MODELS = ("op_zoo.tflite", "cnn_classifier_11.tflite")
ALLOWED = {"capture": {0, 1, 2, 3, 4}, "legacy": {0, 1, 2, 3, 4}, "model": {0, 2, 3}}


@dataclass
class Outcome:
    """One mutant: what esp-check answered, and whether that broke an invariant."""

    target: str
    k: int
    mutation: str
    code: int | None  # None: it hung
    false_match: bool = False
    contained_crash: bool = False  # the host-reference child died of a signal (exit 2, not a crash)
    detail: str = ""

    @property
    def bad(self) -> bool:
        return self.false_match or self.code is None or self.code not in ALLOWED[self.target]


class Hang(Exception):
    pass


@contextlib.contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    def alarm(_sig: int, _frame: object) -> None:
        raise Hang(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def run_cli(args: list[str], timeout: int = 120) -> tuple[int | None, str]:
    """``esp-check ARGS`` in this process (output captured); (None, why) when it does not return."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with _deadline(timeout), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(args)
    except Hang as exc:
        return None, str(exc)
    text = err.getvalue()
    return code, text[-600:]


# ---- captures ---------------------------------------------------------------------------------------

_INFO = [("target", "esp32s3"), ("chip", "esp32s3"), ("rev", "0.2"), ("cores", 2), ("cpu_mhz", 240),
         ("idf", "v5.5.3"), ("tflm", "1.3.8"), ("espnn", "1.1.2"), ("model_sha256", "5e" * 32),
         ("model_bytes", 28888), ("inputs", 2), ("outputs", 2)]  # fmt: skip


def base_captures() -> tuple[bytes, bytes]:
    """(optimized, ANSI C): two runs, two int8 outputs (250 bytes = 3 DATA chunks, and 11 bytes)."""
    rng = np.random.default_rng(7)
    runs = []
    for k in range(2):
        o0 = rng.integers(-128, 128, size=(1, 250), dtype=np.int8)
        o1 = rng.integers(-128, 128, size=(1, 11), dtype=np.int8)
        runs.append(RunSpec(bytes([k]) * 12, 4000 + k, (
            TensorSpec("int8", (1, 250), 0.00390625, -128, o0.tobytes(), "seg"),
            TensorSpec("int8", (1, 11), 0.0625, 3, o1.tobytes(), "probs"),
        )))  # fmt: skip
    out = []
    for nn in ("optimized", "ansi_c"):
        chunks: list[bytes] = []
        emit_capture(
            PythonEmitter(chunks.append), info=[("nn", nn), *_INFO], runs=runs, sim=True, human_max=3
        )
        out.append(b"I (31) boot: ESP-IDF v5.5.3 2nd stage bootloader\r\n" + b"".join(chunks))
    return out[0], out[1]


_REC = re.compile(rb"(@EC1 ([0-9]+) ([A-Z]+)((?: [^ ]+)*) )\*([0-9A-F]{8})")


_WDT_LINE = b"E (5123) task_wdt: Task watchdog got triggered\r\n"  # what the splice_log mutation inserts


def _records(raw: bytes) -> list[tuple[int, str, dict[str, str]]]:
    recs = []
    raw = raw.replace(_WDT_LINE, b"")  # the true content of a spliced record is the record without it
    for line in re.split(rb"\n|\r(?=@EC1 )", raw):  # a record holds no CR: its CR ends it, LF or not
        pos = line.find(b"@EC1 ")
        if pos < 0:
            continue
        m = _REC.fullmatch(
            line[pos:].rstrip(b"\r \t")
        )  # docs/protocol.md: trailing spaces/tabs are no part of it
        if m is None or zlib.crc32(m.group(1)) != int(m.group(5), 16):
            continue
        fields = dict(tok.split("=", 1) for tok in m.group(4).decode("latin-1").split() if "=" in tok)
        recs.append((int(m.group(2)), m.group(3).decode("latin-1"), fields))
    return recs


def naive_capture(raw: bytes) -> dict[str, object] | None:
    """Identity and output bytes from the CRC-valid records of the first boot, or None."""
    recs = _records(raw)
    start = next((k for k, r in enumerate(recs) if r[1] == "BEGIN"), None)
    if start is None:
        return None
    info: dict[str, str] = {}
    inputs: dict[str, str] = {}
    tensors: dict[tuple[str, str], list[object]] = {}
    for _seq, rtype, f in recs[start + 1 :]:
        if rtype == "BEGIN":
            break
        if rtype == "INFO":
            info.update(f)
        elif rtype == "INPUT":
            inputs[f.get("i", "?")] = f.get("sha256", "")
        elif rtype == "TENSOR":
            key = (f.get("i", "?"), f.get("o", "?"))
            tensors[key] = [f.get("dtype"), f.get("shape"), f.get("scale"), f.get("zp"), b""]
        elif rtype == "DATA":
            key = (f.get("i", "?"), f.get("o", "?"))
            if key in tensors:
                try:
                    tensors[key][4] = bytes(tensors[key][4]) + base64.b64decode(f.get("b64", ""))  # type: ignore[arg-type]
                except ValueError:
                    return None
        elif rtype == "END":
            return {"model": info.get("model_sha256"), "inputs": inputs, "tensors": tensors}
    return None


def same_evidence(a: dict[str, object] | None, b: dict[str, object] | None) -> bool:
    return a is not None and b is not None and a == b


def _lines(raw: bytes) -> list[bytes]:
    return raw.split(b"\n")


def _rewrite_record(raw: bytes, rng: random.Random, rtypes: tuple[str, ...],
                    change: Callable[[str, dict[str, str]], None]) -> bytes:  # fmt: skip
    """Change one record of a type in ``rtypes`` and give it a correct CRC again."""
    lines = _lines(raw)
    cands = [k for k, ln in enumerate(lines) if any(f" {t} ".encode() in ln for t in rtypes)]
    if not cands:
        return raw
    k = rng.choice(cands)
    line = lines[k].rstrip(b"\r")
    m = _REC.fullmatch(line[line.find(b"@EC1 ") :])
    if m is None:
        return raw
    rtype = m.group(3).decode("latin-1")
    fields = dict(tok.split("=", 1) for tok in m.group(4).decode("latin-1").split() if "=" in tok)
    change(rtype, fields)
    body = f"@EC1 {int(m.group(2))} {rtype}" + "".join(f" {key}={v}" for key, v in fields.items()) + " "
    lines[k] = f"{body}*{zlib.crc32(body.encode('latin-1')):08X}\r".encode("latin-1")
    return b"\n".join(lines)


def _flip_data(fix_tensor_crc: bool) -> Callable[[bytes, random.Random], bytes]:
    def mutate(raw: bytes, rng: random.Random) -> bytes:
        changed: dict[str, object] = {}

        def change(_rtype: str, f: dict[str, str]) -> None:
            try:
                data = bytearray(base64.b64decode(f.get("b64", "")))
            except ValueError:  # already damaged by an earlier mutation
                return
            if not data or "i" not in f or "o" not in f:
                return
            j = rng.randrange(len(data))
            data[j] = (data[j] + rng.randrange(1, 256)) % 256
            f["b64"] = base64.b64encode(bytes(data)).decode()
            changed.update(i=f["i"], o=f["o"])

        out = _rewrite_record(raw, rng, ("DATA",), change)
        if not fix_tensor_crc or not changed:
            return out
        decoded = naive_capture(out)
        entry = None if decoded is None else decoded["tensors"].get((changed["i"], changed["o"]))  # type: ignore[attr-defined]
        if entry is None:
            return out
        data = entry[4]

        def fix(_rtype: str, f: dict[str, str]) -> None:
            if (f.get("i"), f.get("o")) == (changed["i"], changed["o"]):
                f["crc"] = f"{zlib.crc32(data):08X}"

        lines = _lines(out)
        idx = [k for k, ln in enumerate(lines) if b" TENSOR i=%s o=%s " % (str(changed["i"]).encode(),
               str(changed["o"]).encode()) in ln]  # fmt: skip
        if idx:
            one = _rewrite_record(lines[idx[0]] + b"\n", random.Random(0), ("TENSOR",), fix)
            lines[idx[0]] = one.rstrip(b"\n")
        return b"\n".join(lines)

    return mutate


_FIELD_CHANGES: dict[str, Callable[[random.Random, str], str]] = {
    "nn": lambda r, v: r.choice(["optimized", "ansi_c", "unknown"]),
    "model_sha256": lambda r, v: v[:-1] + ("0" if v[-1] != "0" else "1"),
    "sha256": lambda r, v: v[:-1] + ("0" if v[-1] != "0" else "1"),
    "scale": lambda r, v: "0x3C000000",
    "zp": lambda r, v: str(int(v) + r.choice([-1, 1])) if re.fullmatch(r"-?\d+", v) else "0",
    "shape": lambda r, v: r.choice(["250", "1x25x10", "11", "1x11", "2x125"]),
    "dtype": lambda r, v: r.choice(["uint8", "int16", "int32", "float32"]),
    "outputs": lambda r, v: r.choice(["1", "3"]),
    "inputs": lambda r, v: r.choice(["1", "3"]),
    "i": lambda r, v: str(1 - int(v)) if v in ("0", "1") else "0",
    "o": lambda r, v: str(1 - int(v)) if v in ("0", "1") else "0",
    "status": lambda r, v: "error",
    "records": lambda r, v: str(int(v) + 1) if v.isdigit() else "0",
}


def _change_field(raw: bytes, rng: random.Random) -> bytes:
    def change(_rtype: str, f: dict[str, str]) -> None:
        keys = [k for k in f if k in _FIELD_CHANGES]
        if keys:
            key = rng.choice(keys)
            f[key] = _FIELD_CHANGES[key](rng, f[key])

    return _rewrite_record(raw, rng, ("INFO", "INPUT", "TENSOR", "DATA", "END", "TIME"), change)


def _drop_line_renumbered(raw: bytes, rng: random.Random) -> bytes:
    """Drop one record and renumber the rest (CRCs recomputed): a gap the sequence cannot show."""
    lines = _lines(raw)
    recs = [k for k, ln in enumerate(lines) if b"@EC1 " in ln and b" BEGIN " not in ln]
    if not recs:
        return raw
    drop = rng.choice(recs)
    del lines[drop]
    seq = 0
    for k, ln in enumerate(lines):
        m = _REC.fullmatch(ln.rstrip(b"\r")[ln.find(b"@EC1 ") :]) if b"@EC1 " in ln else None
        if m is None:
            continue
        rtype = m.group(3).decode("latin-1")
        fields = m.group(4).decode("latin-1")
        if rtype == "BEGIN":
            seq = 0
        if rtype == "END":
            fields = re.sub(r" records=\d+", f" records={seq}", fields)
        body = f"@EC1 {seq} {rtype}{fields} "
        lines[k] = f"{body}*{zlib.crc32(body.encode('latin-1')):08X}\r".encode("latin-1")
        seq += 1
    return b"\n".join(lines)


def _bytes_op(op: str) -> Callable[[bytes, random.Random], bytes]:
    def mutate(raw: bytes, rng: random.Random) -> bytes:
        b = bytearray(raw)
        p = rng.randrange(len(b))
        n = rng.randint(1, 16)
        if op == "flip_bit":
            b[p] ^= 1 << rng.randrange(8)
        elif op == "set_byte":
            b[p] = rng.randrange(256)
        elif op == "drop":
            del b[p : p + n]
        elif op == "duplicate":
            b[p:p] = b[p : p + n]
        elif op == "insert":
            b[p:p] = bytes(rng.choice(b"\r\n @*=0Ax\x00\xff\x1b") for _ in range(n))
        elif op == "swap":
            q = min(len(b), p + n)
            r = min(len(b), q + rng.randint(1, 16))
            b[p:r] = b[q:r] + b[p:q]
        elif op == "truncate":
            del b[p:]
        return bytes(b)

    return mutate


def _lines_op(op: str) -> Callable[[bytes, random.Random], bytes]:
    def mutate(raw: bytes, rng: random.Random) -> bytes:
        lines = _lines(raw)
        if len(lines) < 3:
            return raw
        k = rng.randrange(len(lines) - 1)
        if op == "drop_line":
            del lines[k]
        elif op == "dup_line":
            lines.insert(k, lines[k])
        elif op == "swap_lines":
            lines[k], lines[k + 1] = lines[k + 1], lines[k]
        elif op == "move_line":
            lines.insert(rng.randrange(len(lines)), lines.pop(k))
        elif op == "splice_log":  # a watchdog message printed in the middle of a record
            ln = lines[k]
            cut = rng.randrange(len(ln) + 1)
            lines[k : k + 1] = [ln[:cut] + _WDT_LINE[:-1], ln[cut:]]
        return b"\n".join(lines)

    return mutate


CAPTURE_MUTATIONS: dict[str, Callable[[bytes, random.Random], bytes]] = {
    **{
        op: _bytes_op(op)
        for op in ("flip_bit", "set_byte", "drop", "duplicate", "insert", "swap", "truncate")
    },
    **{op: _lines_op(op) for op in ("drop_line", "dup_line", "swap_lines", "move_line", "splice_log")},
    "data_recrc": _flip_data(fix_tensor_crc=False),
    "data_recrc_tensor": _flip_data(fix_tensor_crc=True),
    "field_recrc": _change_field,
    "drop_line_renumbered": _drop_line_renumbered,
}


def mutate(
    raw: bytes, rng: random.Random, table: dict[str, Callable[[bytes, random.Random], bytes]]
) -> tuple[bytes, str]:
    names = [rng.choice(sorted(table)) for _ in range(rng.choice((1, 1, 1, 2, 3)))]
    for name in names:
        if raw:
            raw = table[name](raw, rng)
    return raw, "+".join(names)


def capture_mutant(seed: int, k: int, base: tuple[bytes, bytes], workdir: Path) -> Outcome:
    rng = random.Random(f"{seed}:capture:{k}")
    a, b = base
    which = rng.choice(("B", "B", "A", "both"))
    if which in ("A", "both"):
        a, how_a = mutate(a, rng, CAPTURE_MUTATIONS)
    if which in ("B", "both"):
        b, how_b = mutate(b, rng, CAPTURE_MUTATIONS)
    how = f"{which}:" + (how_a if which == "A" else how_b if which == "B" else f"{how_a}|{how_b}")
    pa, pb = workdir / "a.log", workdir / "b.log"
    pa.write_bytes(a)
    pb.write_bytes(b)
    code, err = run_cli(["compare", str(pa), str(pb)], timeout=60)
    false_match = code == 0 and not same_evidence(naive_capture(a), naive_capture(b))
    return Outcome(
        "capture", k, how, code, false_match, detail=err if (code in (None, 70) or false_match) else ""
    )


# ---- legacy logs ---------------------------------------------------------------------------------------

_TOKEN = re.compile(r"Output:\s*([^\s,;]+)")


def naive_legacy(raw: bytes) -> list[float] | None:
    values = []
    for line in raw.decode("utf-8", "replace").splitlines():
        for tok in _TOKEN.findall(line):
            try:
                values.append(
                    decode_microprintf_float(tok) if "*2^" in tok or tok in ("Inf", "NaN") else float(tok)
                )
            except ValueError:
                return None
    return values


def _same_values(a: list[float] | None, b: list[float] | None) -> bool:
    if a is None or b is None or len(a) != len(b):
        return False
    return all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b, strict=True))


LEGACY_MUTATIONS: dict[str, Callable[[bytes, random.Random], bytes]] = {
    **{
        op: _bytes_op(op)
        for op in ("flip_bit", "set_byte", "drop", "duplicate", "insert", "swap", "truncate")
    },
    **{op: _lines_op(op) for op in ("drop_line", "dup_line", "swap_lines", "move_line")},
}


def legacy_mutant(seed: int, k: int, base: bytes, workdir: Path) -> Outcome:
    rng = random.Random(f"{seed}:legacy:{k}")
    b, how = mutate(base, rng, LEGACY_MUTATIONS)
    pa, pb = workdir / "a.log", workdir / "b.log"
    pa.write_bytes(base)
    pb.write_bytes(b)
    code, err = run_cli(["compare", str(pa), str(pb)], timeout=60)
    false_match = code == 0 and not _same_values(naive_legacy(base), naive_legacy(b))
    return Outcome(
        "legacy", k, how, code, false_match, detail=err if (code in (None, 70) or false_match) else ""
    )


# ---- models ----------------------------------------------------------------------------------------------


def vector_positions(data: bytes) -> tuple[list[int], list[int]]:
    """(positions of vector length words, positions of shape and tensor-index elements) in a model."""
    import tflite

    lengths: list[int] = []
    elements: list[int] = []

    def vec(obj: object, slot: int, elem: int = 4, keep: bool = False) -> None:
        tab = obj._tab  # type: ignore[attr-defined]
        o = tab.Offset(slot)
        if o:
            start = tab.Vector(o)
            lengths.append(start - 4)
            n = tab.VectorLen(o)
            if keep and start + elem * n <= len(data):  # an earlier mutation may have made it huge
                elements.extend(start + elem * j for j in range(n))

    model = tflite.Model.GetRootAsModel(data, 0)
    for slot in (6, 8, 12):  # operator_codes, subgraphs, buffers
        vec(model, slot)
    for i in range(model.BuffersLength()):
        vec(model.Buffers(i), 4, 1)
    for s in range(model.SubgraphsLength()):
        sg = model.Subgraphs(s)
        for slot in (4, 10):
            vec(sg, slot)
        for slot in (6, 8):
            vec(sg, slot, keep=True)
        for t in range(sg.TensorsLength()):
            tensor = sg.Tensors(t)
            vec(tensor, 4, keep=True)
            q = tensor.Quantization()
            if q is not None:
                vec(q, 8)
                vec(q, 10, 8)
        for k in range(sg.OperatorsLength()):
            op = sg.Operators(k)
            vec(op, 6, keep=True)
            vec(op, 8, keep=True)
    return lengths, elements


_HUGE = (0x7FFFFFFF, 0xFFFFFFFF, 0x40000000, 0x10000000, 0x00FFFFFF, 0x8000)
_INTERESTING = (0, 1, 2, 3, 7, 255, 256, 65535, 65536, 1 << 20, 0x7FFFFFFF, -1, -2, -128, -(1 << 31))


def _model_op(op: str) -> Callable[[bytes, random.Random], bytes]:
    def mutate(data: bytes, rng: random.Random) -> bytes:
        b = bytearray(data)
        if op == "bit_flips":
            for _ in range(rng.randint(1, 16)):
                p = rng.randrange(len(b))
                b[p] ^= 1 << rng.randrange(8)
        elif op == "truncate":
            del b[rng.randrange(len(b)) :]
        elif op == "word_smash":
            p = rng.randrange(0, len(b) - 4, 4)
            b[p : p + 4] = struct.pack("<i", rng.choice(_INTERESTING))
        elif op in ("huge_vector", "index_smash"):
            try:
                lengths, elements = vector_positions(bytes(b))
            except Exception:
                return bytes(b)
            cands = lengths if op == "huge_vector" else elements
            if cands:
                p = rng.choice(cands)
                if op == "huge_vector":
                    b[p : p + 4] = struct.pack("<I", rng.choice((*_HUGE, rng.randrange(1 << 32))))
                else:
                    b[p : p + 4] = struct.pack("<i", rng.choice(_INTERESTING))
        return bytes(b)

    return mutate


MODEL_MUTATIONS = {
    op: _model_op(op) for op in ("bit_flips", "truncate", "word_smash", "huge_vector", "index_smash")
}


def model_mutant(seed: int, k: int, bases: dict[str, bytes], workdir: Path) -> Outcome:
    """``inspect`` the mutant; when it is accepted, ``reference`` it on zero inputs too."""
    from harness.model.loader import parse_model_bytes

    rng = random.Random(f"{seed}:model:{k}")
    name = rng.choice(sorted(bases))
    data, how = mutate(bases[name], rng, MODEL_MUTATIONS)
    how = f"{name}:{how}"
    path = workdir / "m.tflite"
    path.write_bytes(data)
    code, err = run_cli(["inspect", str(path), "--json"], timeout=180)
    if code != 0:
        return Outcome(
            "model", k, how, code, contained_crash="signal" in err and "crashes" in err, detail=err
        )
    info = parse_model_bytes(data)  # inspect accepted it: this must not raise either
    args = ["reference", str(path), "--json"]
    for i, t in enumerate(info.inputs):
        x = workdir / f"x{i}.npy"
        np.save(x, np.zeros(t.shape, dtype=np.dtype(t.dtype)))
        args += ["--input", str(x)]
    rcode, rerr = run_cli(args, timeout=180)
    crashed = "signal" in rerr and "crashes" in rerr
    return Outcome("model", k, how + " (inspect ok)", rcode, contained_crash=crashed, detail=rerr)


def load_bases() -> tuple[tuple[bytes, bytes], bytes, dict[str, bytes]]:
    models = {n: (MODELS / n).read_bytes() for n in FUZZ_MODELS}
    return base_captures(), LEGACY_LOG.read_bytes(), models


def digest(outcomes: list[Outcome]) -> str:
    return hashlib.sha256(
        repr([(o.target, o.k, o.code, o.false_match) for o in outcomes]).encode()
    ).hexdigest()
