"""Host-side logic of ``esp-check hybrid`` (harness.analysis.hybrid, harness.model.hybrid_ops): no board.

The bisection is driven here by an oracle (a set of faulty ops: a run is bad when one of them runs
optimized), which is what the simulator's op faults model; the bound ceil(log2 N)+1 per culprit is
checked for every position of one culprit among the U-Net's 57 switchable ops, and for pairs.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.analysis.hybrid import Bisection, _ranges, cost_report, espnn_audit, hybrid_evidence, invoke_cost
from harness.errors import UsageError
from harness.model.hybrid_ops import ANSI_KINDS, candidate_ops, format_ops, select_ansi_ops
from harness.model.loader import load_model
from harness.protocol.capture import parse_capture
from harness.protocol.emitter import PythonEmitter

MODELS = Path(__file__).parent / "data" / "models"


@pytest.fixture(scope="module")
def unet():  # type: ignore[no-untyped-def]
    return load_model(MODELS / "unet_mbv2_035_48.tflite")


def _bisect(switchable: list[int], faulty: set[int], max_culprits: int = 4) -> Bisection:
    bis = Bisection(switchable, max_culprits=max_culprits)
    while (ansi := bis.next_ansi_ops()) is not None:
        optimized = set(switchable) - set(ansi)
        bis.record(bool(optimized & faulty), "oracle")
    return bis


def test_switchable_ops_of_the_unet(unet) -> None:  # type: ignore[no-untyped-def]
    ops = candidate_ops(unet)
    assert len(ops) == 57  # 36 CONV_2D + 13 DEPTHWISE_CONV_2D + 8 ADD: the ops ESP-NN accelerates on the S3
    assert {unet.main_ops[k].opcode for k in ops} == {"CONV_2D", "DEPTHWISE_CONV_2D", "ADD"}
    assert {4, 17, 27, 33, 54} <= set(ops) and 48 not in ops  # 48: RESIZE_NEAREST_NEIGHBOR


@pytest.mark.parametrize("culprit", range(57))
def test_one_culprit_is_found_within_the_bound_at_every_position(unet, culprit: int) -> None:  # type: ignore[no-untyped-def]
    ops = candidate_ops(unet)
    bis = _bisect(ops, {ops[culprit]})
    assert bis.success and bis.found == [ops[culprit]]
    bound = math.ceil(math.log2(57)) + 1
    assert bis.bound_per_culprit == bound == 7
    assert len(bis.steps) <= bound and bis.runs_per_culprit() == [len(bis.steps)]
    assert bis.steps[-1].phase == "verify" and bis.steps[-1].ansi == [ops[culprit]]


@pytest.mark.parametrize("pair", [(17, 27), (0, 64), (4, 54), (46, 47)])
def test_two_culprits_are_both_found_each_within_the_bound(unet, pair: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    bis = _bisect(candidate_ops(unet), set(pair))
    assert bis.success and sorted(bis.found) == sorted(pair)
    assert len(bis.runs_per_culprit()) == 2
    assert all(n <= bis.bound_per_culprit for n in bis.runs_per_culprit())
    assert [s.bad for s in bis.steps if s.phase == "verify"] == [True, False]


def test_bisection_is_bounded_when_the_failure_is_not_in_any_switchable_op(unet) -> None:  # type: ignore[no-untyped-def]
    ops = candidate_ops(unet)
    bis = Bisection(ops, max_culprits=3)
    while bis.next_ansi_ops() is not None:
        bis.record(True, "always bad")  # e.g. a fault outside the ESP-NN kernels
    assert bis.done and not bis.success and len(bis.found) == 3
    assert len(bis.steps) <= 3 * bis.bound_per_culprit
    assert "still bad" in bis.message


def test_bisection_with_known_culprits_and_edge_cases() -> None:
    bis = Bisection([1, 2, 3, 4], found=[2])
    assert bis.suspects == [1, 3, 4]
    assert Bisection([]).done and "nothing to bisect" in Bisection([]).message
    one = _bisect([9], {9})
    assert one.success and one.found == [9] and len(one.steps) == 1  # only the verify run
    aborted = Bisection([1, 2, 3])
    aborted.next_ansi_ops()
    aborted.abort("port gone")
    assert aborted.done and not aborted.success and aborted.next_ansi_ops() is None


def test_ranges_and_format() -> None:
    assert _ranges([5, 1, 2, 3, 9, 10]) == "1-3,5,9-10" and _ranges([]) == "-"
    assert format_ops([27, 17, 17]) == "17,27"


def test_select_ansi_ops_refuses_what_the_wrapper_cannot_switch(unet) -> None:  # type: ignore[no-untyped-def]
    assert select_ansi_ops(unet, [27, 17]) == (17, 27)
    dw = select_ansi_ops(unet, kinds=["depthwise_conv_2d"])
    assert len(dw) == 13 and all(unet.main_ops[k].opcode == "DEPTHWISE_CONV_2D" for k in dw)
    with pytest.raises(UsageError, match=r"RESIZE_NEAREST_NEIGHBOR.*nothing to switch"):
        select_ansi_ops(unet, [48])
    with pytest.raises(UsageError, match=r"ops 0..65"):
        select_ansi_ops(unet, [66])
    with pytest.raises(UsageError, match="not a kind"):
        select_ansi_ops(unet, kinds=["LOGISTIC"])
    assert set(ANSI_KINDS) >= {"CONV_2D", "SOFTMAX", "FULLY_CONNECTED", "MAX_POOL_2D"}


def test_cost_report_keeps_share_of_the_speedup(unet) -> None:  # type: ignore[no-untyped-def]
    n = len(unet.main_ops)
    opt = {k: 1000 for k in range(n)}
    ansi = {k: 4000 for k in range(n)}
    doc = cost_report(unet, opt, ansi, [17], cpu_mhz=240)
    # total optimized 66000, ANSI 264000, hybrid 69000: (264000-69000)/(264000-66000) = 98.48 %
    assert doc["speedup_kept_percent"] == pytest.approx(98.48, abs=0.01)
    assert doc["per_op"] == [
        {"op": 17, "kind": "CONV_2D", "cycles_optimized": 1000, "cycles_ansi": 4000, "extra_cycles": 3000}
    ]
    assert "keeps 98.5% of ESP-NN's speedup" in doc["summary"]
    assert "op 17 (CONV_2D) costs 3,000 cycles more" in doc["summary"]
    measured = cost_report(unet, opt, ansi, [17], 240, measured_hybrid={k: 1100 for k in range(n)})
    assert measured["measured"] and measured["cycles"]["hybrid"] == 1100 * n
    flat = cost_report(unet, opt, opt, [17], 240)
    assert flat["speedup_kept_percent"] is None and "no speedup" in flat["summary"]


def test_audit_flags_ansi_speed_and_slower_ops_within_the_noise_band(unet) -> None:  # type: ignore[no-untyped-def]
    ops = unet.main_ops
    ansi = {o.index: 10_000 for o in ops}
    opt = {o.index: 2_000 for o in ops}
    for o in ops:
        if o.opcode == "DEPTHWISE_CONV_2D":
            opt[o.index] = 9_500  # 1.05x: inside the 10 % band -> ANSI C speed
        if o.opcode in ("RESIZE_NEAREST_NEIGHBOR", "CONCATENATION", "LOGISTIC"):
            opt[o.index] = 10_000  # no ESP-NN kernel: same speed, not flagged
    opt[27] = 12_000  # an ADD 0.83x: slower optimized
    audit = espnn_audit(unet, "esp32s3", opt, ansi, noise_band=0.10)
    dw = [o.index for o in ops if o.opcode == "DEPTHWISE_CONV_2D"]
    assert sorted(audit["flagged_ops"]) == sorted([*dw, 27])
    kinds = {k["kind"]: k for k in audit["kinds"]}
    assert kinds["DEPTHWISE_CONV_2D"]["finding"] == "not_optimized"
    assert kinds["ADD"]["finding"] == "some_ops" and kinds["ADD"]["ops"] == [27]
    assert "CONV_2D" not in kinds and "CONCATENATION" not in kinds
    row = next(r for r in audit["rows"] if r["op"] == 48)
    assert row["espnn"] is False and "no ESP-NN kernel" in row["reason"] and row["flag"] is None
    # ADD has no ESP-NN kernel on the ESP32 (generic C): not expected, so never "at ANSI C speed"
    plain = espnn_audit(unet, "esp32", {**opt, 27: 2_000}, ansi)
    assert not any(r["flag"] for r in plain["rows"] if r["kind"] == "ADD")


def test_audit_gives_tiny_ops_and_native_boards_no_verdict(unet) -> None:  # type: ignore[no-untyped-def]
    """A 2-element SOFTMAX at 1.03x was called "most likely compiled without ESP-NN optimization": an op
    whose ANSI C time is below the floor (mostly per-op overhead) gets no verdict; on a native board no op
    does (the timing is the PC's)."""
    ops = unet.main_ops
    ansi = {o.index: 10_000 for o in ops}
    opt = {o.index: 2_000 for o in ops}
    dw = [o.index for o in ops if o.opcode == "DEPTHWISE_CONV_2D"]
    for k in dw:
        ansi[k], opt[k] = 2_000, 1_940  # tiny: 1.03x, below the floor
    audit = espnn_audit(unet, "esp32s3", opt, ansi)
    assert not set(dw) & set(audit["flagged_ops"])
    assert "DEPTHWISE_CONV_2D" not in {k["kind"] for k in audit["kinds"]}
    assert {r["no_verdict"] for r in audit["rows"] if r["op"] in dw} == {"below_floor"}
    opt_slow = {**opt, **{k: 9_900 for k in range(len(ops)) if k not in dw}}
    native = espnn_audit(unet, "esp32", opt_slow, ansi, native=True)
    assert native["flagged_ops"] == [] and native["kinds"] == [] and "native board" in native["note"]


def test_cost_claims_need_a_speedup_above_the_noise_and_a_chip(unet) -> None:  # type: ignore[no-untyped-def]
    """On a native board with a fault in esp-nn's depthwise kernel, bisection printed "the hybrid keeps
    -10285.5% of ESP-NN's speedup" from invoke times optimized 977, ANSI 1060, hybrid 9597 us."""
    seen = invoke_cost({"optimized": 977, "ansi": 1060, "hybrid": 9597})
    assert seen["speedup_kept_percent"] is None and "%" not in seen["summary"], seen
    assert "no speedup above the noise" in seen["summary"]
    slow = invoke_cost({"optimized": 500, "ansi": 1060, "hybrid": 9597})
    assert slow["speedup_kept_percent"] is None and "not comparable" in slow["summary"]
    good = invoke_cost({"optimized": 500, "ansi": 1000, "hybrid": 550})
    assert good["speedup_kept_percent"] == 90.0 and "keeps 90.0%" in good["summary"]
    native = invoke_cost({"optimized": 500, "ansi": 1000, "hybrid": 550}, native=True)
    assert native["speedup_kept_percent"] is None and "native board" in native["summary"]
    n = len(unet.main_ops)
    opt, ansi = {k: 1000 for k in range(n)}, {k: 4000 for k in range(n)}
    doc = cost_report(unet, opt, ansi, [17], 240, native=True)
    assert (
        doc["speedup_kept_percent"] is None and "keeps" not in doc["summary"] and "native" in doc["summary"]
    )
    near = cost_report(unet, opt, {k: 1030 for k in range(n)}, [17], 240)
    assert near["speedup_kept_percent"] is None and "no speedup above the noise" in near["summary"]


def test_invoke_times_and_cycles_keep_the_same_share_under_one_rule(unet) -> None:  # type: ignore[no-untyped-def]
    """A hybrid 1 us slower than the optimized build (of 100 ms) keeps 99.999% of the speedup: from
    invoke times it was rounded to 2 digits and printed as "keeps 100.0%", a cost shown as none."""
    tiny = invoke_cost({"optimized": 100_000, "ansi": 200_000, "hybrid": 100_001})
    assert tiny["speedup_kept_percent"] == 99.999 and "keeps 99.999%" in tiny["summary"], tiny
    n = len(unet.main_ops)
    opt, ansi = {k: 1000 for k in range(n)}, {k: 4000 for k in range(n)}
    cycles = cost_report(unet, opt, ansi, [17], 240, measured_hybrid={**opt, 17: 1001})
    total = {"optimized": 1000 * n, "ansi": 4000 * n, "hybrid": 1000 * n + 1}
    assert cycles["speedup_kept_percent"] == invoke_cost(total)["speedup_kept_percent"]


def _capture(info_fields: list[tuple[str, object]], hybrid_records: list[tuple[int, int]]) -> bytes:
    out = bytearray()
    em = PythonEmitter(out.extend)
    em.begin("0.1.0", True)
    em.info([("nn", "optimized"), ("target", "esp32s3"), ("chip", "esp32s3"), ("rev", "0.2"), ("cores", 2),
             ("cpu_mhz", 240)])  # fmt: skip
    em.info([("idf", "v5.5.3"), ("tflm", "1.3.8"), ("espnn", "1.1.2"), ("model_bytes", 4), ("inputs", 1),
             ("outputs", 1)])  # fmt: skip
    em.info([("model_sha256", "0" * 64), *info_fields])  # type: ignore[list-item]
    em.input(0, 1, "1" * 64)
    em.time(0, 5)
    em.tensor(0, 0, "int8", [1], 0.5, 0, b"\x01")
    for ansi, fallback in hybrid_records:
        em.record("HYBRID", [("i", 0), ("ansi", ansi), ("fallback", fallback)])
    em.end(True)
    return bytes(out)


def test_hybrid_records_are_parsed_and_checked() -> None:
    cap = parse_capture(_capture([("hybrid", 2), ("ansi_ops", "17,27")], [(2, 0)]))
    assert cap.valid, cap.problems
    assert cap.hybrid_ops == ((17, 27), False) and cap.runs[0].hybrid == {"ansi": 2, "fallback": 0}
    assert hybrid_evidence(cap, [17, 27], 2) == []
    assert "expected 17,27" in hybrid_evidence(cap, [17, 27, 30], 3)[0]
    assert "1 invokes went to ANSI C" in hybrid_evidence(parse_capture(_capture(
        [("hybrid", 2), ("ansi_ops", "17,27")], [(1, 1)])), [17, 27], 2)[0]  # fmt: skip
    missing = parse_capture(_capture([("hybrid", 1), ("ansi_ops", "17")], []))
    assert not missing.valid and any("no HYBRID record" in p for p in missing.problems)
    twice = parse_capture(_capture([("hybrid", 1), ("ansi_ops", "17")], [(1, 0), (1, 0)]))
    assert any("HYBRID for i=0 repeated" in p for p in twice.problems)
    bad = parse_capture(_capture([("hybrid", 1), ("ansi_ops", "17;18")], [(1, 0)]))
    assert any("ansi_ops" in p for p in bad.problems)
    cut = parse_capture(_capture([("hybrid", 40), ("ansi_ops", "1,2,3+")], [(40, 0)]))
    assert cut.valid and cut.hybrid_ops == ((1, 2, 3), True)
    assert hybrid_evidence(cut, list(range(1, 41)), 40) == []  # a cut list is checked as a prefix
    plain = parse_capture(_capture([], []))
    assert plain.valid and plain.hybrid_ops is None
    assert "not the hybrid build" in hybrid_evidence(plain, [1], 1)[0]


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet="0123456789,+-;x ", max_size=24), st.integers(0, 5), st.integers(0, 5))
def test_fuzz_hybrid_info_never_crashes_the_parser(text: str, ansi: int, fallback: int) -> None:
    value = text.replace(" ", "") or "-"
    cap = parse_capture(_capture([("hybrid", 3), ("ansi_ops", value)], [(ansi, fallback)]))
    if cap.valid:  # a valid capture printed a well-formed list the helper can read back
        ops, cut = cap.hybrid_ops  # type: ignore[misc]
        body = value.rstrip("+")
        assert cut == value.endswith("+")
        assert list(ops) == ([] if body in ("-", "") else [int(p) for p in body.split(",")])


def test_an_unverified_reproducer_says_why_its_dump_run_captured_nothing(tmp_path: Path) -> None:
    """Regression: "NOT verified: the dump run captured no input of this op" did not say that the
    dump run's builds had failed (on a native board they were built without --components-dir); the
    reason now names what the dump run reported."""
    from harness.flows.repro import write_reproducer

    model = Path(__file__).parent / "data" / "models" / "cnn_classifier_11.tflite"
    err = "tap dump run [optimized]: build: the component manager cannot reach its registry"
    r = write_reproducer(model, load_model(model), 2, {}, tmp_path, "native-esp32", [err])
    assert not r["ok"] and r["why"].startswith("the dump run captured no input of this op")
    assert err in r["why"]


def test_the_confirm_runs_divergence_names_the_optimized_build() -> None:
    """hybrid's confirm run (no op on ANSI C) is the plain optimized build: its comparison says
    "optimized", and so must its divergence text (the old text said "hybrid vs ansi"); a run with ops on
    ANSI C is the hybrid."""
    from types import SimpleNamespace

    from harness.flows.hybrid import HybridRun, _divergence
    from harness.protocol.capture import Capture, CapturedRun, OpRecord, TapEntry

    def tapped(out_crc: str) -> Capture:
        op = OpRecord(
            0, 0, 3, "CONV_2D", 10, (TapEntry(0, (4,), "00000001"),), (TapEntry(5, (4,), out_crc),), 0
        )
        return Capture(runs=[CapturedRun(0, 4, "0" * 64, ops=[op])])

    state = SimpleNamespace(base_caps={"ansi": tapped("0000000A")})
    for ansi_ops, name in (([], "optimized"), ([3], "hybrid")):
        run = HybridRun("confirm" if not ansi_ops else "tap-1", ansi_ops, True, capture=tapped("0000000B"))
        d = _divergence(state, run)  # type: ignore[arg-type]
        assert d is not None and d.op == 3 and d.kind == "output"
        assert d.a == name and d.message.endswith(f"({name} vs ansi)"), d.message


def test_cost_report_gives_no_speedup_from_a_zero_ansi_time(unet) -> None:  # type: ignore[no-untyped-def]
    """ANSI C per-op cycles of 0 (a cycle counter that did not run) gave ``speedup`` 0.0 in report.json,
    op 17 "costs -1,000 cycles more", and the claim that ESP-NN gives no speedup. A time of zero is
    unknown (as in the tap timing): the speedup and the extra cycles are null, the summary says why."""
    n = len(unet.main_ops)
    opt = {k: 1000 for k in range(n)}
    doc = cost_report(unet, opt, {k: 0 for k in range(n)}, [17], 240)
    assert doc["speedup"] == {"optimized": None, "hybrid": None}, doc["speedup"]
    assert doc["per_op"][0]["extra_cycles"] is None and "-1,000" not in doc["summary"]
    assert doc["speedup_kept_percent"] is None and "unknown" in doc["summary"], doc["summary"]
    assert "no speedup above the noise" not in doc["summary"]
    blank = cost_report(unet, {k: 0 for k in range(n)}, {k: 4000 for k in range(n)}, [17], 240)
    assert blank["speedup"] == {"optimized": None, "hybrid": None} and "unknown" in blank["summary"]


def test_a_measured_hybrid_missing_an_op_leaves_its_time_unknown(unet) -> None:  # type: ignore[no-untyped-def]
    """A tapped hybrid run that did not time an op both builds timed (op_cycles leaves it out, or says 0):
    its total is unknown (null), never a KeyError, never a sum that is short by that op (docs/hybrid.md)."""
    n = len(unet.main_ops)
    opt, ansi = {k: 1000 for k in range(n)}, {k: 4000 for k in range(n)}
    for hybrid in ({k: 1100 for k in range(1, n)}, {**opt, 5: 0}, {}):
        doc = cost_report(unet, opt, ansi, [17], 240, measured_hybrid=hybrid)
        assert doc["measured"] and doc["cycles"]["hybrid"] is None and doc["speedup"]["hybrid"] is None
        assert doc["speedup_kept_percent"] is None and "unknown" in doc["summary"]
