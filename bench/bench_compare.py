"""Benchmark: compare two 1,000,000-element int8 tensors, parse a ~10 MB protocol capture, and run
`esp-check compare` on two realistic 25 MB text logs and on a 24 MB protocol capture pair (goal:
under 5 s; the text pair took 116 s, the protocol pair 11 s before parse_capture streamed).

Prints throughput only (no pass/fail on time). Run: ``python bench/bench_compare.py``.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from harness.analysis.compare import OutputTensor, compare_tensors
from harness.protocol.capture import parse_capture
from harness.protocol.emitter import (
    PythonEmitter,
    RunSpec,
    TensorSpec,
    emit_capture,
    find_c_compiler,
    make_emitter,
)

INFO = [
    ("nn", "optimized"), ("target", "esp32s3"), ("chip", "esp32s3"), ("rev", "0.2"), ("cores", 2),
    ("cpu_mhz", 240), ("idf", "v5.5.3"), ("tflm", "1.3.8"), ("espnn", "1.1.2"),
    ("model_sha256", "ab" * 32), ("model_bytes", 1), ("inputs", 1), ("outputs", 1),
]  # fmt: skip


def best_of(n: int, fn) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    rng = np.random.default_rng(0)
    n = 1_000_000
    a = rng.integers(-128, 128, n, dtype=np.int16).astype(np.int8)
    b = a.copy()
    idx = rng.choice(n, n // 100, replace=False)
    b[idx] = (b[idx].astype(np.int16) // 2).astype(np.int8)
    ta = OutputTensor(0, a, raw=True, shape=a.shape, dtype="int8", scale=0.00390625, zero_point=-128)
    tb = OutputTensor(0, b, raw=True, shape=b.shape, dtype="int8", scale=0.00390625, zero_point=-128)
    result = compare_tensors(ta, tb)
    t = best_of(5, lambda: compare_tensors(ta, tb))
    print(f"compare_tensors: {n:,} int8 elements in {t * 1e3:.1f} ms = {n / t / 1e6:.1f} M elements/s "
          f"({result.mismatched:,} mismatched, max {result.max_diff_lsb:.0f} LSB)")  # fmt: skip

    # the same core work as a plain Python loop, on a tenth of the data, for a ratio measured in this run
    la, lb = a[: n // 10].tolist(), b[: n // 10].tolist()

    def loop() -> None:
        mism = 0
        worst = 0
        for x, y in zip(la, lb, strict=True):
            d = abs(x - y)
            mism += d > 0
            worst = max(worst, d)

    t_loop = best_of(3, loop) * 10
    print(
        f"  vs a Python loop doing less (count + max only): {t_loop * 1e3:.0f} ms per 1M -> {t_loop / t:.1f}x"
    )

    # ~10 MB capture: one 7.3 MB tensor -> 76k DATA records of 96 bytes + framing
    payload = rng.integers(-128, 128, 7_300_000, dtype=np.int16).astype(np.int8).tobytes()
    chunks: list[bytes] = []
    spec = RunSpec(b"\x00" * 16, 1, (TensorSpec("int8", (len(payload),), 0.00390625, -128, payload),))
    t0 = time.perf_counter()
    emit_capture(PythonEmitter(chunks.append), info=INFO, runs=[spec])
    t_emit_py = time.perf_counter() - t0
    raw = b"".join(chunks)
    mb = len(raw) / 1e6
    print(f"python emitter: {mb:.1f} MB in {t_emit_py:.2f} s = {mb / t_emit_py:.1f} MB/s")
    if find_c_compiler() is not None:
        c_chunks: list[bytes] = []
        em = make_emitter(c_chunks.append, backend="c")
        t0 = time.perf_counter()
        emit_capture(em, info=INFO, runs=[spec])
        t_emit_c = time.perf_counter() - t0
        assert b"".join(c_chunks) == raw, "C and Python emitters differ"
        print(f"C emitter (ctypes): {mb:.1f} MB in {t_emit_c:.2f} s = {mb / t_emit_c:.1f} MB/s")
    cap = parse_capture(raw)
    assert cap.valid, cap.problems[:3]
    t = best_of(3, lambda: parse_capture(raw))
    print(f"parse_capture: {mb:.1f} MB ({raw.count(b'@EC1 '):,} records) in {t:.2f} s = {mb / t:.1f} MB/s")


def realistic_log(target: int = 25_000_000) -> bytes:
    """A 25 MB serial log as a long legacy-sketch run prints it: ESP-IDF log lines (some coloured),
    ``Output:`` lines, a boot banner; no fault."""
    rng = np.random.default_rng(1)
    lines = ["ets Jul 29 2019 12:21:46", "rst:0x1 (POWERON_RESET),boot:0x13 (SPI_FAST_FLASH_BOOT)"]
    size, i = 0, 0
    while size < target:
        i += 1
        if i % 3 == 0:
            ln = f"I ({i * 7}) app: invoke {i} took {int(rng.integers(1000, 9000))} us, free heap 123456"
        elif i % 3 == 1:
            ln = "Output: " + " ".join(f"{v:.6f}" for v in rng.random(8))
        else:
            ln = f"\x1b[0;32mI ({i * 7}) tflite: arena used {int(rng.integers(10000, 90000))} bytes\x1b[0m"
        lines.append(ln)
        size += len(ln) + 2
    return ("\r\n".join(lines) + "\r\n").encode()


def bench_compare_cli(tmp: Path) -> None:
    from harness.analysis.compare import compare_files

    raw = realistic_log()
    a, b = tmp / "a.log", tmp / "b.log"
    a.write_bytes(raw)
    b.write_bytes(raw)
    t0 = time.perf_counter()
    result = compare_files(a, b)
    t = time.perf_counter() - t0
    mb = len(raw) / 1e6
    print(
        f"compare (legacy text logs): 2 x {mb:.1f} MB in {t:.2f} s (goal < 5 s), exit {int(result.exit_code)}"
    )


def bench_compare_protocol(tmp: Path) -> None:
    """`esp-check compare` on a 24 MB protocol capture pair (one 12.75 MB int8 tensor each, 133k DATA
    records), optimized vs ANSI C, from the project's emitter; with parse and classify on their own."""
    from harness.analysis.classify import classify
    from harness.analysis.compare import compare_files

    payload = np.random.default_rng(2).integers(-128, 128, 12_750_000).astype(np.int8).tobytes()
    spec = RunSpec(b"\x00" * 16, 1, (TensorSpec("int8", (len(payload),), 0.00390625, -128, payload),))
    for name, nn in (("a.log", "optimized"), ("b.log", "ansi_c")):
        out = bytearray()
        info = [(k, nn if k == "nn" else v) for k, v in INFO]
        emit_capture(PythonEmitter(out.extend), info=info, runs=[spec])
        (tmp / name).write_bytes(out)
    raw = (tmp / "a.log").read_bytes()
    mb = len(raw) / 1e6
    t0 = time.perf_counter()
    cap = parse_capture(raw)
    t_parse = time.perf_counter() - t0
    t0 = time.perf_counter()
    classify(raw, parsed=cap)
    t_classify = time.perf_counter() - t0
    print(f"  parse_capture {mb:.1f} MB: {t_parse:.2f} s; classify (with the parse): {t_classify:.2f} s")
    t0 = time.perf_counter()
    result = compare_files(tmp / "a.log", tmp / "b.log")
    t = time.perf_counter() - t0
    code = int(result.exit_code)
    print(f"compare (protocol captures): 2 x {mb:.1f} MB in {t:.2f} s (goal < 5 s), exit {code}")


if __name__ == "__main__":
    main()
    with tempfile.TemporaryDirectory() as d:
        bench_compare_cli(Path(d))
    with tempfile.TemporaryDirectory() as d:
        bench_compare_protocol(Path(d))
