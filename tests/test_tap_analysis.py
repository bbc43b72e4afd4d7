"""Unit tests of the tap analysis (harness/analysis/tap.py) and the HTML pieces, on hand-made data."""

from __future__ import annotations

import numpy as np
import pytest

from harness.analysis.tap import (
    TapOp,
    TapResult,
    analyze_dump,
    describe_region,
    first_divergence,
    timing_table,
)


def _mask(region: str) -> np.ndarray:
    m = np.zeros((1, 6, 5, 3), dtype=bool)
    if region == "last_row":
        m[:, -1, :, :] = True
    elif region == "last_col":
        m[:, :, -1, 1] = True
    elif region == "first_row":
        m[:, 0, 2, :] = True
    elif region == "border":
        m[:, 0, 1, 0] = m[:, 3, -1, 2] = True
    elif region == "scatter":
        m[:, 2, 2, 0] = m[:, 3, 1, 1] = True
    return m


@pytest.mark.parametrize(
    ("region", "expect"),
    [
        ("last_row", "last row only (row 5 of 6)"),
        ("last_col", "last column only (column 4 of 5)"),
        ("first_row", "first row only (row 0 of 6)"),
        ("border", "border only"),
        ("scatter", "scattered over 2 of 6 rows and 2 of 5 columns"),
        ("none", "none"),
    ],
)
def test_describe_region(region: str, expect: str) -> None:
    desc, rows, cols, chans = describe_region(_mask(region))
    assert desc.startswith(expect)
    if region == "last_col":
        assert cols == [4] and chans == 1 and rows == list(range(6))


def test_analyze_dump_counts_lsb_and_fraction() -> None:
    ref = np.zeros((1, 4, 4, 2), dtype=np.int8)
    got = ref.copy()
    got[0, 3, :, 0] = 2
    got[0, 3, 0, 1] = -1
    d = analyze_dump(5, 9, "out", got, ref, "ansi")
    assert (d.differing, d.elements, d.max_lsb) == (5, 32, 2)
    assert d.lsb_histogram == {-1: 1, 2: 4} and d.fraction == pytest.approx(5 / 32)
    assert d.region.startswith("last row only")


def _op(idx: int, ins: list[tuple[int, str]], outs: list[tuple[int, str]], cycles: int = 0) -> TapOp:
    return TapOp(idx, f"OP{idx}", tuple(ins), tuple(outs), cycles)


def test_first_divergence_output_clobber_and_agreement() -> None:
    good = [
        _op(0, [(0, "A")], [(1, "B")]),
        _op(1, [(1, "B")], [(2, "C")]),
        _op(2, [(1, "B"), (2, "C")], [(3, "D")]),
    ]
    assert first_divergence("x", good, "y", good).op is None
    wrong = [
        _op(0, [(0, "A")], [(1, "B")]),
        _op(1, [(1, "B")], [(2, "X")]),
        _op(2, [(1, "B"), (2, "X")], [(3, "Y")]),
    ]
    d = first_divergence("opt", wrong, "ansi", good)
    assert (d.op, d.kind, d.tensor) == (1, "output", 2) and d.differing_ops == [1, 2]
    # op 2 reads tensor 1 with a CRC op 0 never wrote: clobbered between op 0 and op 2
    clob = [
        _op(0, [(0, "A")], [(1, "B")]),
        _op(1, [(1, "B")], [(2, "C")]),
        _op(2, [(1, "Q"), (2, "C")], [(3, "Z")]),
    ]
    d = first_divergence("opt", clob, "host", good)
    assert (d.op, d.kind, d.tensor, d.producer) == (2, "clobbered_input", 1, 0)
    assert "overwritten between op 0 and op 2" in d.message


def test_timing_table_speedups_and_totals() -> None:
    t = timing_table(
        {
            "optimized": [_op(0, [], [], 240), _op(1, [], [], 480)],
            "ansi": [_op(0, [], [], 960), _op(1, [], [], 480)],
        },
        {"optimized": 240, "ansi": 240},
    )
    assert t["ops"][0]["us"] == {"optimized": 1.0, "ansi": 4.0} and t["ops"][0]["speedup"] == 4.0
    assert t["total_us"] == {"optimized": 3.0, "ansi": 6.0} and t["speedup"] == 2.0
    assert t["by_type"]["OP0"]["count"] == 1


def test_timing_table_gives_no_speedup_it_cannot_know() -> None:
    """ANSI C timed at 0 cycles gave its op a 0.0x speedup but its type None; ops timed in one variant
    only (the rest of the records dropped) gave the type and the total a speedup from different sets of
    ops. One rule: ansi / optimized over the ops timed above zero in both, else None (unknown)."""
    conv = [TapOp(k, "CONV_2D", (), (), c) for k, c in ((0, 240), (1, 480), (2, 240))]
    ansi = [TapOp(0, "CONV_2D", (), (), 0), TapOp(1, "CONV_2D", (), (), 960)]
    t = timing_table({"optimized": conv, "ansi": ansi}, {"optimized": 240, "ansi": 240})
    assert [r["speedup"] for r in t["ops"]] == [None, 2.0, None]
    assert t["by_type"]["CONV_2D"]["speedup"] == 2.0 and t["speedup"] == 2.0  # op 1 alone
    assert t["total_us"] == {"optimized": 4.0, "ansi": 4.0}  # the times themselves stay as measured
    alone = timing_table({"optimized": conv}, {"optimized": 240})
    assert alone["speedup"] is None and alone["by_type"]["CONV_2D"]["speedup"] is None


def test_op_list_flag_is_checked_when_parsed() -> None:
    import click

    from harness.commands.common import OP_LIST

    assert OP_LIST.convert("18, 17,17", None, None) == [17, 18]
    with pytest.raises(click.BadParameter):
        OP_LIST.convert("17,x", None, None)


def test_html_report_draws_the_tap_pictures_escaped() -> None:
    """The real flash-and-compare HTML report (render_html; only the result object is a stand-in) draws
    the checksum timeline, the timing bars and the dump run's image triptych, hostile names escaped."""
    from types import SimpleNamespace

    from harness.analysis.html_report import render_html

    res = TapResult()
    good = [_op(0, [(0, "A")], [(1, "B")]), _op(1, [(1, "B")], [(2, "C")])]
    bad = [_op(0, [(0, "A")], [(1, "B")]), _op(1, [(1, "B")], [(2, "X")])]
    res.runs.append({"i": 0, "optimized_vs_ansi": first_divergence("optimized", bad, "ansi", good)})
    res.timing = timing_table({"optimized": [TapOp(0, "<script>", (), (), 10)]}, {"optimized": 1})
    ref = np.zeros((1, 8, 8, 1), np.int8)
    got = ref.copy()
    got[0, 7] = 3
    res.images.append({"op": 4, "t": 2, "role": "out", "ref_name": "<b>host</b>", "got": got, "ref": ref})
    html = render_html(SimpleNamespace(comparison=None, tap=res), {"verdict": "mismatch", "tap": {}})  # type: ignore[arg-type]
    timeline = html[html.index("<svg") : html.index("</svg>")]
    assert timeline.count("<rect") == 2 and 'fill="#7f0000"><title>op 1: differs' in timeline
    assert "<script>" not in html and "<title>op 0 &lt;script&gt; optimized: 10.0 us</title>" in html
    assert html.count("data:image/png;base64,") == 3 and "8 elements differ" in html
    assert "<h3>op 4 output tensor 2 (dump run)</h3>" in html
    assert "&lt;b&gt;host&lt;/b&gt; (reference)" in html


def test_sim_op_fault_parameters_are_checked() -> None:
    from harness.errors import UsageError
    from harness.sim.faults import parse_faults

    spec = parse_faults({"fault": "op_corrupt", "fault_op": "17", "fault_region": "last_col"})
    assert (spec.fault_op, spec.fault_region) == (17, "last_col")
    with pytest.raises(UsageError, match="fault_op"):
        parse_faults({"fault": "op_clobber"})
    with pytest.raises(UsageError, match="fault_region"):
        parse_faults({"fault": "op_corrupt", "fault_op": "1", "fault_region": "diagonal"})


def test_sim_ops_match_host_without_fault_and_change_only_op_k(models_dir) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("tflite_micro")
    from harness.analysis.tap import host_taps
    from harness.model.loader import load_model
    from harness.sim.tap_sim import OpFault, simulate_ops

    path = models_dir / "cnn_classifier_11.tflite"
    info = load_model(path)
    q = np.load(models_dir / "inputs" / "cnn_classifier_11.q.npy")
    (host,), (tensors,) = host_taps(info, path.read_bytes(), [q])
    layers = {t: a for t, a in tensors.items() if t != info.inputs[0].index}
    clean, _ = simulate_ops(info, q, layers, "optimized", None)
    from harness.protocol.spec import crc32

    as_tap = [TapOp(s.op.index, s.op.opcode, tuple((t, f"{crc32(a):08X}") for t, a in s.inputs),
                    tuple((t, f"{crc32(a):08X}") for t, a in s.outputs)) for s in clean]  # fmt: skip
    assert first_divergence("sim", as_tap, "host", host).op is None
    faulty, _values = simulate_ops(info, q, layers, "optimized", OpFault("op_corrupt", 3, "last_row", 2))
    ((t3, a3),) = faulty[3].outputs
    diff = a3.astype(int) - layers[t3].astype(int)
    assert describe_region(diff != 0)[0].startswith("last row only") and set(np.unique(diff)) <= {0, 2, -2}
    assert all(np.array_equal(a, layers[t]) for s in faulty[:3] for t, a in s.outputs)


def test_missing_or_different_records_are_never_agreement() -> None:
    good = [_op(0, [(0, "A")], [(1, "B")]), _op(1, [(1, "B")], [(2, "C")])]
    d = first_divergence("opt", good[:1], "host", good)
    assert d.op is None and d.missing == [1] and "NOT checked" in d.message
    other = [_op(0, [(0, "A")], [(1, "B")]), _op(1, [(5, "B")], [(2, "C")])]
    d = first_divergence("opt", other, "host", good)
    assert d.layout_mismatch == [1] and d.ops_compared == 1 and "NOT checked" in d.message


def test_a_time_the_device_did_not_give_is_unknown_in_json_text_and_html() -> None:
    """An ANSI C run without OP records (its firmware built without --tap) got a total and a per-type
    time of 0.0 in report.json, "0.0" in the terminal table and "ANSI C 0 us" in the HTML report, and a
    comparison without a mean |diff| showed 0.0000 in HTML: numbers the device never gave. One rule for
    unknown: absent or null in JSON, "-" in text and HTML (as the text compare report already does)."""
    import re
    from io import StringIO
    from types import SimpleNamespace

    from rich.console import Console

    from harness.analysis.html_report import render_html
    from harness.commands.device_cmds import _print_tap

    conv = [TapOp(0, "CONV_2D", (), (), 240), TapOp(1, "CONV_2D", (), (), 480)]
    res = TapResult()
    res.timing = timing_table({"optimized": conv, "ansi": []}, {"optimized": 240, "ansi": 240})
    assert res.timing["total_us"] == {"optimized": 3.0}, res.timing["total_us"]
    assert res.timing["by_type"]["CONV_2D"]["us"] == {"optimized": 3.0}
    out = StringIO()
    _print_tap(Console(file=out, width=200), res)
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in out.getvalue().splitlines() if "│" in line]
    assert ["CONV_2D", "2", "3.0", "-", "-"] in rows and ["total", "2", "3.0", "-", "-"] in rows, rows
    comparison = {
        "a": "optimized",
        "b": "ansi",
        "run": 0,
        "output": 0,
        "verdict": "mismatch",
        "mismatched": 1,
        "count": 2,
        "max_diff_lsb": None,
        "mean_diff_lsb": None,
    }
    doc = {"verdict": "mismatch", "comparison": {"comparisons": [comparison]}, "tap": {}}
    html = render_html(SimpleNamespace(comparison=None, tap=res), doc)  # type: ignore[arg-type]
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", html)
    assert "ANSI C 0" not in html and "None" not in cells and "0.0000" not in cells, cells
    at = cells.index("CONV_2D")
    assert cells[at : at + 5] == ["CONV_2D", "2", "3.0", "-", "-"] and "ANSI C -" in html, cells
