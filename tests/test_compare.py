"""``esp-check compare``: acceptance fixture, evidence checks, exit codes, three-way with the host reference.

Captures here are printed by the real protocol emitter (Python twin of the firmware's C emitter); the
host reference is the real tflite-micro wheel. Nothing else is faked.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.analysis.compare import (
    OutputTensor,
    compare_files,
    compare_tensors,
    load_source,
    results_document,
)
from harness.cli import main
from harness.errors import CaptureError, IncomparableError, LogFormatError, UsageError
from harness.protocol.emitter import PythonEmitter, RunSpec, TensorSpec, emit_capture

DATA = Path(__file__).parent / "data"
LOGS = DATA / "logs"
MODELS = DATA / "models"
ANSI_LOG = LOGS / "report_ansi_c.log"
OPT_LOG = LOGS / "report_optimized.log"
HAVE_TFLM = importlib.util.find_spec("tflite_micro") is not None


def write_capture(
    path: Path,
    outputs: list[np.ndarray],
    *,
    nn: str,
    model_sha: str = "ab" * 32,
    input_bytes: bytes = b"\x00" * 4,
    scale: float = 0.00390625,
    zp: int = -128,
    error: bool = False,
) -> Path:
    chunks: list[bytes] = []
    em = PythonEmitter(chunks.append)
    info = [("nn", nn), ("target", "esp32s3"), ("chip", "esp32s3"), ("rev", "0.2"), ("cores", 2),
            ("cpu_mhz", 240), ("idf", "v5.5.3"), ("tflm", "1.3.8"), ("espnn", "1.1.2"),
            ("model_sha256", model_sha), ("model_bytes", 28888), ("inputs", 1),
            ("outputs", len(outputs))]  # fmt: skip
    if error:
        em.begin("0.1.0", True)
        for k in range(0, len(info), 6):
            em.info(info[k : k + 6])
        em.input(0, len(input_bytes), hashlib.sha256(input_bytes).hexdigest())
        em.error("invoke", 1, "Invoke failed", i=0)
        em.end(False)
    else:
        specs = tuple(
            TensorSpec(str(o.dtype), o.shape, scale, zp, o.tobytes(), f"out{k}")
            for k, o in enumerate(outputs)
        )
        emit_capture(em, info=info, runs=[RunSpec(input_bytes, 1234, specs)], sim=True)
    path.write_bytes(b"I (31) boot: ESP-IDF v5.5.3 2nd stage bootloader\r\n" + b"".join(chunks))
    return path


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    code = main(["compare", *args, "--json"])
    out = capsys.readouterr().out
    return code, (json.loads(out) if out.strip().startswith("{") else {})


# ---- acceptance: the two logs of the original ESP-NN bug report ----------------------------------


def test_acceptance_report_logs_mismatch(capsys: pytest.CaptureFixture[str]) -> None:
    code, rep = run_json(capsys, str(ANSI_LOG), str(OPT_LOG))
    assert code == 1 and rep["verdict"] == "mismatch"
    (c,) = rep["comparisons"]
    assert (c["argmax_a"], c["argmax_b"]) == (5, 10) and c["argmax_agree"] is False
    assert c["values_a"][5] == 74 / 256 and c["values_b"][5] == 0.0
    assert c["values_a"][10] == 1 / 256 and c["values_b"][10] == 255 / 256
    assert c["mismatched"] == 9 and c["count"] == 11 and c["units"] == "real"


def test_acceptance_lsb_with_scale(capsys: pytest.CaptureFixture[str]) -> None:
    code, rep = run_json(capsys, str(ANSI_LOG), str(OPT_LOG), "--scale", "0.00390625", "--zero-point", "-128")
    assert code == 1
    (c,) = rep["comparisons"]
    assert c["diff_lsb"] == [2, 0, 34, 61, 0, 74, 24, 3, 20, 35, 254]
    assert c["max_diff_lsb"] == 254 and c["units"] == "lsb"
    assert c["pinned_b"] is True and c["pinned_a"] is False  # 10 of 11 optimized outputs at int8 min/max
    # even a generous tolerance cannot hide 254 LSB
    code2, _ = run_json(capsys, str(ANSI_LOG), str(OPT_LOG), "--scale", "0.00390625", "--zero-point", "-128",
                        "--tolerance-lsb", "100")  # fmt: skip
    assert code2 == 1


def test_acceptance_terminal_table(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["compare", str(ANSI_LOG), str(OPT_LOG), "--scale", "0.00390625", "--zero-point", "-128"])
    out = capsys.readouterr().out
    assert code == 1
    assert "MISMATCH" in out and "5 vs 10" in out and "254" in out and "0.2890625" in out


def test_same_log_twice_matches(capsys: pytest.CaptureFixture[str]) -> None:
    code, rep = run_json(capsys, str(ANSI_LOG), str(ANSI_LOG))
    assert code == 0 and rep["verdict"] == "match"
    assert any("not proven" in w for w in rep["warnings"])


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"", "is empty"),
        (b"\r\n  \n", "is empty"),
        (b"hello\r\nno values\r\n", "no 'Output:' lines"),
    ],
)
def test_unusable_logs_fail_cleanly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, needle: str
) -> None:
    bad = tmp_path / "bad.log"
    bad.write_bytes(content)
    assert main(["compare", str(bad), str(ANSI_LOG)]) == 2
    assert needle in capsys.readouterr().err
    with pytest.raises(LogFormatError):
        load_source(bad, "A")
    assert main(["compare", str(tmp_path / "missing.log"), str(ANSI_LOG)]) == 2


@pytest.mark.parametrize("cut", ["before_marker", "in_marker", "boot_banner_only"])
def test_capture_truncated_before_its_first_record_is_exit_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cut: str
) -> None:
    """Device output that stops before the first @EC1 record: a truncated capture, never a usage error."""
    full = write_capture(tmp_path / "full.log", [np.arange(4, dtype=np.int8)], nn="ansi_c").read_bytes()
    first = full.index(b"@EC1 ")
    data = {
        "before_marker": full[:first],
        "in_marker": full[: first + 3],
        "boot_banner_only": ANSI_LOG.read_bytes().split(b"Output:")[0],
    }[cut]
    a = tmp_path / "a.log"
    a.write_bytes(data)
    assert main(["compare", str(a), str(tmp_path / "full.log")]) == 3
    assert "ended before the first result" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000 + "]" * 100_000,  # RecursionError in the JSON decoder
        "[" + "9" * 5000 + "]",  # over-long integer (ValueError outside JSONDecodeError)
        "[" + "9" * 400 + "]",  # too large for a float
        '{"format": "esp-check-results", "version": 1, "runs": [{"outputs": [{"index": 1e999}]}]}',
    ],
)
def test_hostile_json_results_fail_cleanly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    bad = tmp_path / "deep.json"
    bad.write_text(text)
    assert main(["compare", str(bad), str(ANSI_LOG)]) == 2
    assert "internal error" not in capsys.readouterr().err


def test_truncated_legacy_log_is_an_incomplete_capture(tmp_path: Path) -> None:
    short = tmp_path / "short.log"
    short.write_bytes(OPT_LOG.read_bytes().rsplit(b"Output:", 1)[0])
    with pytest.raises(CaptureError, match="11 values") as info:
        compare_files(ANSI_LOG, short)
    assert info.value.exit_code == 3


# ---- protocol captures ---------------------------------------------------------------------------

BASE = np.array([[-126, -128, -93, -67, -128, -54, -104, -125, -108, -93, -127]], dtype=np.int8)


def test_protocol_match_mismatch_and_tolerance(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_capture(tmp_path / "opt.log", [BASE], nn="optimized")
    b = write_capture(tmp_path / "ansi.log", [BASE], nn="ansi_c")
    code, rep = run_json(capsys, str(a), str(b))
    assert code == 0 and rep["verdict"] == "match" and rep["simulated"] is True
    assert rep["sources"][0]["nn"] == "optimized" and rep["comparisons"][0]["scale"] == 0.00390625
    off = BASE.copy()
    off[0, 3] += 1
    b2 = write_capture(tmp_path / "ansi2.log", [off], nn="ansi_c")
    code, rep = run_json(capsys, str(a), str(b2))
    assert (
        code == 1 and rep["comparisons"][0]["mismatched"] == 1 and rep["comparisons"][0]["max_diff_lsb"] == 1
    )
    assert rep["comparisons"][0]["first_mismatches"][0]["index"] == 3
    code, _ = run_json(capsys, str(a), str(b2), "--tolerance-lsb", "1")
    assert code == 0


def test_same_nn_mode_or_other_model_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_capture(tmp_path / "a.log", [BASE], nn="optimized")
    b = write_capture(tmp_path / "b.log", [BASE], nn="optimized")
    assert main(["compare", str(a), str(b)]) == 2
    assert "both report ESP-NN mode 'optimized'" in capsys.readouterr().err
    c = write_capture(tmp_path / "c.log", [BASE], nn="ansi_c", model_sha="cd" * 32)
    assert main(["compare", str(a), str(c)]) == 2
    assert "different models" in capsys.readouterr().err
    u = write_capture(tmp_path / "u.log", [BASE], nn="unknown")
    assert main(["compare", str(a), str(u)]) == 2


def test_corrupted_capture_is_infrastructure_error_never_a_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = write_capture(tmp_path / "a.log", [BASE], nn="optimized")
    b = write_capture(tmp_path / "b.log", [BASE], nn="ansi_c")
    raw = bytearray(b.read_bytes())
    raw[raw.index(b"b64=") + 6] ^= 0x01  # one flipped bit in the tensor data
    b.write_bytes(bytes(raw))
    junit = tmp_path / "j.xml"
    assert main(["compare", str(a), str(b), "--junit", str(junit)]) == 3
    assert "corrupted or incomplete" in capsys.readouterr().err
    root = ET.parse(junit).getroot()
    assert root.get("errors") == "1" and root.get("failures") == "0"
    assert root.find("./testsuite/testcase/error").get("type") == "infrastructure"  # type: ignore[union-attr]


def test_a_junit_file_that_cannot_be_written_does_not_hide_the_error_before_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A is missing (exit 2) and --junit lies under a regular file, so its error report cannot be written
    either (exit 3): the first, truer error decides the exit code and is printed; the write's failure is
    only a warning beside it."""
    b = write_capture(tmp_path / "b.log", [BASE], nn="ansi_c")
    in_the_way = tmp_path / "FILE"
    in_the_way.write_text("a regular file")
    code = main(["compare", str(tmp_path / "missing.log"), str(b), "--junit", str(in_the_way / "x.xml")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "missing.log" in err and "error:" in err
    assert "warning:" in err and "x.xml" in err  # the JUnit report was not written, and it says so


def test_firmware_fault_exit_4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_capture(tmp_path / "a.log", [BASE], nn="optimized", error=True)
    b = write_capture(tmp_path / "b.log", [BASE], nn="ansi_c")
    code, rep = run_json(capsys, str(a), str(b))
    assert code == 4 and rep["verdict"] == "firmware_fault"
    assert rep["faults"] == [{"source": "A", "stage": "invoke", "code": 1, "run": 0, "msg": "Invoke_failed"}]


def test_npy_and_results_json_sources(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_capture(tmp_path / "a.log", [BASE], nn="optimized")
    np.save(tmp_path / "b.npy", BASE)
    assert main(["compare", str(a), str(tmp_path / "b.npy")]) == 0
    capsys.readouterr()
    res = tmp_path / "a.json"
    res.write_text(json.dumps(results_document(load_source(a, "A"))))
    src = load_source(res, "A")
    assert src.kind == "results" and src.nn_mode == "optimized"
    assert np.array_equal(src.runs[0][0].values, BASE) and src.runs[0][0].scale == 0.00390625
    b = write_capture(tmp_path / "b.log", [BASE], nn="ansi_c")
    code, rep = run_json(capsys, str(res), str(b))
    assert code == 0 and rep["sources"][0]["kind"] == "results"
    doc = json.loads(res.read_text())
    doc["runs"][0]["outputs"][0]["crc32"] = "00000000"
    res.write_text(json.dumps(doc))
    with pytest.raises(LogFormatError, match="crc32"):
        load_source(res, "A")
    (tmp_path / "list.json").write_text(json.dumps([0.5, 0.25]))
    assert load_source(tmp_path / "list.json", "B").runs[0][0].values.tolist() == [0.5, 0.25]


def test_raw_vs_real_needs_a_scale(tmp_path: Path) -> None:
    np.save(tmp_path / "q.npy", BASE.reshape(-1))
    with pytest.raises(IncomparableError, match="scale is unknown"):
        compare_files(tmp_path / "q.npy", ANSI_LOG)
    r = compare_files(tmp_path / "q.npy", ANSI_LOG, scale=0.00390625, zero_point=-128)
    assert r.comparisons[0].mismatched == 0  # BASE is exactly the ANSI log, quantized
    with pytest.raises(UsageError, match="needs the output scale"):
        compare_files(ANSI_LOG, OPT_LOG, tolerance_lsb=1)
    with pytest.raises(UsageError, match="go together"):
        compare_files(ANSI_LOG, OPT_LOG, scale=0.1)


# ---- metrics -------------------------------------------------------------------------------------


def test_metrics_vectorised_large_and_exact() -> None:
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, 1_000_000, dtype=np.int64).astype(np.int8)
    b = a.copy()
    idx = rng.choice(a.size, 1000, replace=False)
    b[idx] = np.clip(b[idx].astype(np.int16) + 3, -128, 127).astype(np.int8)
    expect = int(np.count_nonzero(a != b))
    ta = OutputTensor(0, a, raw=True, shape=a.shape, dtype="int8", scale=0.5, zero_point=0)
    tb = OutputTensor(0, b, raw=True, shape=b.shape, dtype="int8", scale=0.5, zero_point=0)
    c = compare_tensors(ta, tb)
    assert c.mismatched == expect and c.max_diff_lsb == 3 and c.max_abs_diff == 1.5
    assert c.diff_lsb is None and c.values_a is None  # not listed for big tensors
    assert compare_tensors(ta, tb, tolerance_lsb=3).mismatched == 0
    assert 0.99 < (c.cosine or 0) <= 1.0


def test_metrics_float_nan_inf_and_pinned() -> None:
    fa = np.array([1.0, np.nan, np.inf, 0.5], dtype=np.float32)
    fb = np.array([1.0, np.nan, np.inf, 0.25], dtype=np.float32)
    c = compare_tensors(OutputTensor(0, fa, raw=False), OutputTensor(0, fb, raw=False))
    assert c.mismatched == 1 and c.first_mismatches[0]["index"] == 3 and c.units == "real"
    c2 = compare_tensors(OutputTensor(0, fa, raw=False), OutputTensor(0, fa[::-1].copy(), raw=False))
    assert c2.mismatched == 4  # NaN vs number and inf vs number both count
    pinned = np.full(20, -128, dtype=np.int8)
    normal = np.arange(20, dtype=np.int8)
    c3 = compare_tensors(
        OutputTensor(0, pinned, raw=True, dtype="int8"), OutputTensor(0, normal, raw=True, dtype="int8")
    )
    assert c3.pinned_a is True and c3.pinned_b is False and c3.units == "lsb" and c3.max_diff_lsb == 147
    with pytest.raises(IncomparableError, match="quantization differs"):
        compare_tensors(OutputTensor(0, pinned, raw=True, scale=0.5, zero_point=0),
                        OutputTensor(0, pinned, raw=True, scale=0.25, zero_point=0))  # fmt: skip


# ---- three-way with the host reference (real tflite-micro) ---------------------------------------


@pytest.mark.needs_tflm
@pytest.mark.skipif(not HAVE_TFLM, reason="tflite-micro wheel not installed (Linux x86-64 only)")
def test_three_way_with_host_reference(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = MODELS / "cnn_classifier_11.tflite"
    inp = MODELS / "inputs" / "cnn_classifier_11__ambiguous.q.npy"
    expected = np.load(MODELS / "expected" / "cnn_classifier_11__ambiguous.out0.npy")
    qbytes = np.load(inp).tobytes()
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    a = write_capture(tmp_path / "opt.log", [expected], nn="optimized", model_sha=sha, input_bytes=qbytes)
    b = write_capture(tmp_path / "ansi.log", [expected], nn="ansi_c", model_sha=sha, input_bytes=qbytes)
    code, rep = run_json(capsys, str(a), str(b), "--model", str(model), "--input", str(inp))
    assert code == 0, rep
    assert [(c["a"], c["b"]) for c in rep["comparisons"]] == [
        ("A", "B"),
        ("A", "reference"),
        ("B", "reference"),
    ]
    assert "tflite-micro" in rep["reference_backend"]
    # the optimized build drifts by 2 LSB from both ANSI and the reference
    drift = expected.copy()
    drift[0, 5] += 2
    a2 = write_capture(tmp_path / "opt2.log", [drift], nn="optimized", model_sha=sha, input_bytes=qbytes)
    code, rep = run_json(capsys, str(a2), str(b), "--model", str(model), "--input", str(inp))
    verdicts = [c["verdict"] for c in rep["comparisons"]]
    assert code == 1 and verdicts == ["mismatch", "mismatch", "match"]
    code, rep = run_json(capsys, str(a2), str(b), "--model", str(model), "--input", str(inp),
                         "--tolerance-lsb", "2", "--ref-tolerance-lsb", "1")  # fmt: skip
    assert code == 1 and [c["verdict"] for c in rep["comparisons"]] == ["match", "mismatch", "match"]
    # a capture of another input is refused
    other = write_capture(tmp_path / "other.log", [expected], nn="ansi_c", model_sha=sha, input_bytes=b"x")
    assert main(["compare", str(a), str(other), "--model", str(model), "--input", str(inp)]) == 2
    assert "ran different inputs" in capsys.readouterr().err
    # both captures ran the same input, but not the one --input names: refused against the reference
    other_a = write_capture(tmp_path / "o_a.log", [expected], nn="optimized", model_sha=sha, input_bytes=b"x")
    assert main(["compare", str(other_a), str(other), "--model", str(model), "--input", str(inp)]) == 2
    assert "run 0 used input" in (err := capsys.readouterr().err) and "quantizes to" in err


def test_model_hash_checked_against_captures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = MODELS / "cnn_classifier_11.tflite"
    a = write_capture(tmp_path / "a.log", [BASE], nn="optimized")
    b = write_capture(tmp_path / "b.log", [BASE], nn="ansi_c")
    assert main(["compare", str(a), str(b), "--model", str(model)]) == 2
    assert "--model" in capsys.readouterr().err
    # legacy logs take scale/zero point from the model
    r = compare_files(ANSI_LOG, OPT_LOG, model=model)
    assert r.comparisons[0].diff_lsb == [2, 0, 34, 61, 0, 74, 24, 3, 20, 35, 254]
    with pytest.raises(UsageError, match="needs --model"):
        compare_files(ANSI_LOG, OPT_LOG, inputs=[MODELS / "inputs" / "cnn_classifier_11.q.npy"])


@settings(max_examples=200, deadline=None)
@given(
    pair=st.integers(1, 40).flatmap(
        lambda n: st.tuples(
            st.lists(st.integers(-128, 127), min_size=n, max_size=n),
            st.lists(st.integers(-128, 127), min_size=n, max_size=n),
        )
    ),
    tol=st.integers(0, 3),
    as_real=st.booleans(),
)
def test_metrics_equal_a_naive_per_element_computation(
    pair: tuple[list[int], list[int]], tol: int, as_real: bool
) -> None:
    """The vectorised metrics (int fast path and real-valued path) against plain Python loops."""
    qa, qb = pair
    s, zp = 0.00390625, -128
    if as_real:  # legacy-style real values, snapped back to the grid with the given scale
        ta = OutputTensor(0, np.array([(q - zp) * s for q in qa]), raw=False)
        tb = OutputTensor(0, np.array([(q - zp) * s for q in qb]), raw=False)
        c = compare_tensors(ta, tb, tolerance_lsb=tol, scale=s, zero_point=zp)
    else:
        ta = OutputTensor(0, np.array(qa, dtype=np.int8), raw=True, dtype="int8", scale=s, zero_point=zp)
        tb = OutputTensor(0, np.array(qb, dtype=np.int8), raw=True, dtype="int8", scale=s, zero_point=zp)
        c = compare_tensors(ta, tb, tolerance_lsb=tol)
    n = len(qa)
    diffs = [abs(x - y) for x, y in zip(qa, qb, strict=True)]
    assert c.count == n and c.mismatched == sum(d > tol for d in diffs)
    assert c.max_diff_lsb == max(diffs) and c.mean_diff_lsb == pytest.approx(sum(diffs) / n)
    assert c.max_abs_diff == max(diffs) * s
    assert c.rmse == pytest.approx((sum((d * s) ** 2 for d in diffs) / n) ** 0.5)
    assert c.argmax_a == qa.index(max(qa)) and c.argmax_b == qb.index(max(qb))
    k = min(5, n)
    top = lambda q: {i for _, i in sorted((-v, i) for i, v in enumerate(q))[:k]}  # noqa: E731
    assert c.topk_agreement == len(top(qa) & top(qb)) / k
    ra, rb = [(q - zp) * s for q in qa], [(q - zp) * s for q in qb]
    na, nb = sum(x * x for x in ra) ** 0.5, sum(x * x for x in rb) ** 0.5
    if na and nb:
        assert c.cosine == pytest.approx(sum(x * y for x, y in zip(ra, rb, strict=True)) / (na * nb))
    assert c.pinned_fraction_a == pytest.approx(sum(q in (-128, 127) for q in qa) / n)
    assert c.diff_lsb == diffs


# ---- logs holding a crash report: the same classifier as flash-and-compare ------------------------


def _crashed_capture(path: Path, crash: bytes) -> Path:
    """A capture whose firmware crashed after its INPUT record: records stop, the panic handler prints."""
    chunks: list[bytes] = []
    em = PythonEmitter(chunks.append)
    em.begin("0.1.0", True)
    em.info([("nn", "optimized"), ("target", "esp32s3"), ("chip", "esp32s3"), ("rev", "0.2"), ("cores", 2)])
    em.input(0, 4, hashlib.sha256(b"\x00" * 4).hexdigest())
    path.write_bytes(b"I (31) boot: ESP-IDF v5.5.3 2nd stage bootloader\r\n" + b"".join(chunks) + crash)
    return path


ABORT = (
    b"\r\nabort() was called at PC 0x42008a1b on core 0\r\n\r\n\r\n"
    b"Backtrace: 0x40375a0e:0x3fc9a550 0x4037a0d1:0x3fc9a570 0x42008a1b:0x3fc9a610\r\n\r\n"
    b"ELF file SHA256: 3f0c21a9b\r\n\r\nRebooting...\r\n"
)
PANIC = (
    b"Guru Meditation Error: Core  0 panic'ed (LoadProhibited). Exception was unhandled.\r\n\r\n"
    b"Core  0 register dump:\r\nPC      : 0x42011c4e  PS      : 0x00060030  A0      : 0x82011d2a  A1      : "
    b"0x3fc9b2f0\r\n\r\nBacktrace: 0x42011c4b:0x3fc9b2f0 0x42011d27:0x3fc9b310\r\n"
)


def test_log_with_an_abort_report_is_a_firmware_fault_not_a_corrupted_capture(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _crashed_capture(tmp_path / "a.log", ABORT)
    b = write_capture(tmp_path / "b.log", [BASE], nn="ansi_c")
    code, rep = run_json(capsys, str(a), str(b))
    assert code == 4 and rep["verdict"] == "firmware_fault"  # was 3, "no END record ... check the cable"
    (fault,) = rep["faults"]
    assert fault["source"] == "A" and fault["stage"] == "abort" and "0x42008a1b" in fault["msg"]
    code, rep = run_json(capsys, str(b), str(_crashed_capture(tmp_path / "p.log", PANIC)))
    assert code == 4 and rep["faults"][0]["stage"] == "panic" and rep["faults"][0]["source"] == "B"


def test_legacy_log_with_a_panic_is_a_firmware_fault(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "sketch.log"
    log.write_bytes(b"Output: 0.25\r\nOutput: 0.75\r\n" + PANIC)
    code, rep = run_json(capsys, str(ANSI_LOG), str(log))
    assert code == 4 and [f["stage"] for f in rep["faults"]] == ["panic"]
    only_crash = tmp_path / "crash.log"
    only_crash.write_bytes(PANIC)  # no outputs at all: still the finding, not "nothing to compare"
    assert run_json(capsys, str(ANSI_LOG), str(only_crash))[0] == 4


def test_truncated_log_without_crash_evidence_stays_infrastructure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _crashed_capture(tmp_path / "a.log", b"")  # records stop, nothing says why
    b = write_capture(tmp_path / "b.log", [BASE], nn="ansi_c")
    assert main(["compare", str(a), str(b)]) == 3
    assert "corrupted or incomplete" in capsys.readouterr().err


@pytest.mark.parametrize("other", ["truncated", "before_first_record"])
@pytest.mark.parametrize("crashed_side", ["A", "B"])
def test_a_crash_on_one_side_is_not_hidden_by_an_unusable_capture_on_the_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], other: str, crashed_side: str
) -> None:
    """One variant crashed, the other's capture is truncated: a firmware fault (4 before 3), as in
    flash-and-compare; the crash is the finding and the other side's failure is reported beside it."""
    crash = _crashed_capture(tmp_path / "crash.log", PANIC)
    full = write_capture(tmp_path / "full.log", [BASE], nn="ansi_c").read_bytes()
    broken = tmp_path / "broken.log"
    broken.write_bytes(
        full[: full.index(b"@EC1 ")] if other == "before_first_record" else full[: full.rindex(b"@EC1 ")]
    )
    pair = [str(crash), str(broken)] if crashed_side == "A" else [str(broken), str(crash)]
    code, rep = run_json(capsys, *pair)
    assert code == 4 and rep["verdict"] == "firmware_fault"  # was 3: the panic was lost
    stages = {(f["source"], f["stage"]) for f in rep["faults"]}
    assert (crashed_side, "panic") in stages
    other_side = "B" if crashed_side == "A" else "A"
    assert (other_side, "capture") in stages  # the other side's failure is not dropped either
