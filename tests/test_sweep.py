"""esp-check sweep (docs/sweep.md): case generation, the driver's output parser, and the real driver
built against the native target's stand-in component tree (tests/data/native_components, a labelled
TEST FIXTURE with max-pool kernels only) with faults injected into its optimized kernel.

Nothing is faked here: the driver is compiled by the native build (CMake, the host compiler) and run.
The fixture has no TFLM reference kernels, so these runs compare optimized vs ANSI C only (the report
says so); the three-way comparison against real sources is recorded in docs/sweep.md.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from native_fixture import (
    COMPONENTS,
    FAULT_MARK,
    OPT_KERNEL,
    faulty_components,
    inject,
    write_input,
    write_model,
)

from harness.analysis import sweep_cases as sc
from harness.analysis.sweep_findings import parse_outputs, parse_result, sanitizer_report
from harness.analysis.sweep_model import CHANNEL_DELTAS, model_cases
from harness.analysis.sweep_repro import repro_model
from harness.cli import main
from harness.errors import BuildError, EspCheckError, Terminated, UsageError
from harness.firmware.native.components import ComponentSource
from harness.firmware.native.driver import NativePlan
from harness.firmware.native.sweep_build import (
    CONV_GLUE,
    build_sweep_driver,
    find_sweep_sources,
    grouped_conv_refusal,
)
from harness.flows.sweep import SweepOptions, run_driver, sweep
from harness.model.loader import load_model

needs_build = pytest.mark.skipif(
    shutil.which("cmake") is None or shutil.which("c++") is None, reason="needs cmake and a host C++ compiler"
)


def test_quantize_multiplier_matches_tflite_arithmetic() -> None:
    assert sc.quantize_multiplier(0.5) == (1 << 30, 0)
    assert sc.quantize_multiplier(0.25) == (1 << 30, -1)
    assert sc.quantize_multiplier(1.0) == (1 << 30, 1)
    assert sc.quantize_multiplier(0.0) == (0, 0)
    m, s = sc.quantize_multiplier(0.0123)
    assert abs(m * 2.0 ** (s - 31) - 0.0123) < 1e-9


def test_softmax_params_as_tflm_prepare() -> None:
    # beta 1, input scale 1/16: real multiplier 2**22 -> mult 2**30, left shift 23; radius 31 * 2**26 / 2**23
    assert sc.softmax_params(1 / 16) == (1 << 30, 23, -248)


@pytest.mark.parametrize(("size", "k", "stride"), [(5, 3, 1), (6, 3, 2), (7, 2, 2), (1, 5, 1), (10, 1, 3)])
def test_tflite_padding(size: int, k: int, stride: int) -> None:
    out, pad = sc.tflite_padding(size, k, stride, True)
    assert out == -(-size // stride)
    total = max((out - 1) * stride + k - size, 0)
    assert pad == total // 2  # the extra row/column of an odd total goes to the end, as TFLite does
    out_v, pad_v = sc.tflite_padding(size, k, stride, False)
    assert pad_v == 0 and out_v == (size - k) // stride + 1


def test_generated_cases_are_reproducible_and_reachable() -> None:
    a = [c.line() for c in sc.generate(list(sc.OPS), 20, seed=3)]
    b = [c.line() for c in sc.generate(list(sc.OPS), 20, seed=3)]
    assert a == b and len(a) == 160
    assert a != [c.line() for c in sc.generate(list(sc.OPS), 20, seed=4)]
    for c in sc.generate(["conv", "depthwise", "max_pool"], 50, seed=1):
        assert c.reachable and c.params[0] > 0
    grouped = [c for c in sc.generate(["conv"], 40, seed=1) if c.meta["groups"] > 1]
    assert grouped and all(c.meta["ic"] == c.meta["fc"] * c.meta["groups"] for c in grouped)


def test_one_param_layout_packs_and_reads_every_op() -> None:
    """sweep_cases.LAYOUT is the one definition of the driver's params (sweep_driver.cc's order): the
    generator packs by it and the shrinker, the geometry class and repro.c read by it. Every generated
    case reads back by name to the values it was made from (its meta), and packs to the same params."""
    for api in (False, True):
        for case in sc.generate(list(sc.OPS), 30, seed=5, api=api):
            named = case.named()
            assert list(named) == list(sc.LAYOUT[case.op])
            for key, value in named.items():
                made = case.meta.get(key)
                if isinstance(made, int):  # a bool (per_channel) too
                    assert value == int(made), (case.op, key)
            if "in_off" in named and case.op in ("conv", "depthwise", "fully_connected"):
                assert named["in_off"] == -case.meta["in_zp"]
            mult, shift = case.requant()
            assert (mult, shift) == (case.meta.get("mult", []), case.meta.get("shift", []))
            assert sc.pack(case.op, named, mult, shift) == case.params


def test_repro_model_reads_back_with_the_case_tensors() -> None:
    import random

    from harness.model.loader import parse_model_bytes

    case = sc.conv_case(random.Random(5), grouped=True)
    data, x = repro_model(case)
    info = parse_model_bytes(data)
    assert [op.opcode for op in info.main_ops] == ["CONV_2D"]
    assert x.dtype == np.int8 and list(x.shape) == [1, case.meta["ih"], case.meta["iw"], case.meta["ic"]]
    assert np.array_equal(x.ravel(), sc.int8_values(case.seed, 0, x.size, case.lo, case.hi))


def test_all_space_repro_never_lacks_scales(tmp_path: Path) -> None:
    # regression: in --all, a case with a TFLite geometry but raw multipliers (no w_scales) made
    # the repro writer raise KeyError (exit 70, no sweep.json). Now a case is TFLite-reachable only when
    # its scales give TFLM the very multipliers and shifts the driver passed; every other one is API-only.
    from harness.analysis.sweep_repro import write_repro

    cases = list(sc.generate(["conv", "depthwise", "fully_connected"], 60, seed=2, api=True))
    reach = [c for c in cases if c.reachable]
    assert reach and len(reach) < len(cases)
    for c in cases:
        info = write_repro(c, tmp_path / f"c{c.id}", None)
        assert (info["model"] == "model.tflite") == c.reachable, info.get("why_no_model")
    for c in reach:
        n = c.meta["oc"]
        scales = c.meta["w_scales"] if len(c.meta["w_scales"]) == n else c.meta["w_scales"] * n
        tflm = [sc.quantize_multiplier(c.meta["in_scale"] * w / c.meta["out_scale"]) for w in scales]
        assert [m for m, _ in tflm][: len(c.meta["mult"])] == c.meta["mult"]
        assert [s for _, s in tflm][: len(c.meta["shift"])] == c.meta["shift"]


def _tflm_with_conv_glue(tmp: Path, body: str) -> ComponentSource:
    glue = tmp / "esp-tflite-micro" / CONV_GLUE
    glue.parent.mkdir(parents=True)
    glue.write_text(body, encoding="utf-8")
    (tmp / "esp-tflite-micro" / "idf_component.yml").write_text('version: "1.3.8"\n', encoding="utf-8")
    return ComponentSource("espressif__esp-tflite-micro", tmp / "esp-tflite-micro", "1.3.8", "components-dir")


def test_grouped_conv_is_api_only_when_the_tflm_glue_refuses_it(tmp_path: Path) -> None:
    # regression: esp-tflite-micro v1.3.8's conv Eval checks MatchingDim(input, 3, filter, 3),
    # which aborts on a grouped conv: such findings must not be called TFLite-reachable nor get a .tflite.
    # The glue here is a two-line stand-in written by the test (only the check matters).
    from harness.analysis.sweep_findings import CaseVerdict, group
    from harness.analysis.sweep_repro import write_repro
    from harness.flows.sweep import mark_grouped_conv

    refusing = _tflm_with_conv_glue(
        tmp_path / "a", "const int input_depth = MatchingDim(input_shape, 3, filter_shape, 3);\n"
    )
    passing = _tflm_with_conv_glue(tmp_path / "b", "const int input_depth = filter_shape.Dims(3) * groups;\n")
    assert grouped_conv_refusal(passing) == ""
    assert "MatchingDim" in grouped_conv_refusal(refusing) and "1.3.8" in grouped_conv_refusal(refusing)
    assert "unknown" in grouped_conv_refusal(None)
    cases = list(sc.generate(["conv"], 40, seed=1))
    mark_grouped_conv(cases, grouped_conv_refusal(refusing))
    grouped = [c for c in cases if c.meta["groups"] > 1]
    assert grouped and not any(c.reachable for c in grouped)
    assert all(c.reachable for c in cases if c.meta["groups"] == 1)
    info = write_repro(grouped[0], tmp_path / "repro", None)
    assert info["model"] is None and "MatchingDim" in info["why_no_model"]
    [g] = group([CaseVerdict(grouped[0], None, ["sanitizer"])])
    assert g["tflite_reachable"] is False and "esp-nn's API" in g["why_api_only"]


def test_the_draw_reaches_the_geometry_it_used_to_miss() -> None:
    # geometry the draw used to miss: each of these now comes up in a default (TFLite) draw of 400
    # cases per op, or in --all for the API-only padded 1x1 conv
    conv = list(sc.generate(["conv"], 400, seed=0))
    dw = list(sc.generate(["depthwise"], 400, seed=0))
    api = list(sc.generate(["conv"], 400, seed=0, api=True))
    assert {c.meta["mult_ch"] for c in dw} >= {1, 2, 3, 4, 5, 8}
    pool = list(sc.generate(["max_pool"], 400, seed=0))
    assert any(c.meta["sh"] != c.meta["sw"] and c.reachable for c in conv + dw)
    assert any(c.meta["sh"] != c.meta["sw"] and c.reachable for c in pool)
    assert any(max(c.meta["shift"]) > 0 and c.reachable for c in conv + dw)  # effective scale >= 1
    assert any(c.meta["kh"] == c.meta["kw"] == 1 and (c.meta["ph"] or c.meta["pw"]) for c in api)
    assert not any(c.reachable for c in api if c.meta["kh"] == c.meta["kw"] == 1 and c.meta["ph"])
    assert {c.meta["bias_range"] for c in conv} >= {1 << 12, 1 << 16, 1 << 20}
    assert any(max(c.meta["ih"], c.meta["iw"]) > 12 for c in conv)
    for c in conv + dw:  # TFLite's arithmetic still gives exactly the drawn geometry and multipliers
        oh, _ = sc.tflite_padding(c.meta["ih"], c.meta["kh"], c.meta["sh"], c.meta["same"])
        ow, _ = sc.tflite_padding(c.meta["iw"], c.meta["kw"], c.meta["sw"], c.meta["same"])
        assert (oh, ow) == (c.meta["oh"], c.meta["ow"])


def test_parse_result_strict() -> None:
    r = parse_result("R 7 0 0 2 48 0000abcd 0000abcd 00000000 3:1:5 - - 16 0 1")
    assert r is not None and r.id == 7 and r.status == (0, 0, 2) and r.alias
    assert r.opt_ansi is not None and (r.opt_ansi.count, r.opt_ansi.max_abs, r.opt_ansi.first) == (3, 1, 5)
    assert r.opt_ref is None
    assert parse_result("R 7 0 0 2 48 0000abcd 0000abcd") is None
    assert parse_result("R 7 9 0 2 48 0000abcd 0000abcd 00000000 - - - 0 0 0") is None
    assert parse_outputs("O 3 7f80 - 7f7f") == (3, (b"\x7f\x80", None, b"\x7f\x7f"))


@given(st.text(max_size=200))
def test_parsers_never_raise(text: str) -> None:
    for line in text.splitlines() or [text]:
        parse_result(line)
        parse_outputs(line)
    sanitizer_report(text)


def _espnn(tmp: Path, fault: str | None) -> Path:
    if fault is None:
        dest = tmp / "clean"
        shutil.copytree(COMPONENTS, dest)
        return dest / "esp-nn"
    if fault == "rounding":  # drop the last bit of odd results: a changed rounding in the optimized kernel
        dest = tmp / "rounding"
        shutil.copytree(COMPONENTS, dest)
        src = dest / OPT_KERNEL
        src.write_text(src.read_text().replace(FAULT_MARK, "out[c] = (int8_t)(v & ~1);"), encoding="utf-8")
        return dest / "esp-nn"
    return faulty_components(tmp / fault, fault) / "esp-nn"


def _run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str | None, sanitize: bool, cases: int = 60
) -> tuple[int, dict]:
    monkeypatch.setenv("ESP_CHECK_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / f"out-{fault}-{cases}"
    espnn = _espnn(tmp_path / str(cases), fault)
    opts = SweepOptions(ops=("max_pool",), cases_per_op=cases, espnn_dir=espnn, sanitize=sanitize)
    result = sweep(opts, out)
    return result.exit_code, json.loads((out / "sweep.json").read_text())


@needs_build
@pytest.mark.slow
def test_clean_fixture_sweeps_clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, report = _run(tmp_path, monkeypatch, None, sanitize=True)
    assert code == 0 and report["findings"] == []
    assert report["reference_compiled"] is False  # the fixture has no reference kernels: said, not hidden
    assert sum(row["opt_vs_ansi"] for row in report["coverage"]) == 60  # two functions, so real coverage


@needs_build
@pytest.mark.slow
@pytest.mark.parametrize("fault", ["off_by_one", "rounding"])
def test_injected_value_fault_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str) -> None:
    code, report = _run(tmp_path, monkeypatch, fault, sanitize=False)
    assert code == 1
    kinds = {f["kind"] for f in report["findings"]}
    assert kinds == {"opt_vs_ansi"}
    assert all(f["op"] == "max_pool" and f["tflite_reachable"] for f in report["findings"])
    repro = report["findings"][0]["repro"]
    assert repro["model"] == "model.tflite" and Path(repro["dir"], "input.npy").is_file()


def _max_pool(case: sc.Case) -> np.ndarray:
    """What max pooling must give for ``case`` (the driver's own input, rebuilt from its seed)."""
    p = case.named()
    ih, iw, ch, oh, ow, sh, sw = (p[k] for k in ("ih", "iw", "ch", "oh", "ow", "sh", "sw"))
    kh, kw, ph, pw, amin, amax = (p[k] for k in ("kh", "kw", "ph", "pw", "amin", "amax"))
    x = sc.int8_values(case.seed, 0, ih * iw * ch, case.lo, case.hi).astype(np.int32).reshape(ih, iw, ch)
    out = np.full((oh, ow, ch), -128, dtype=np.int32)
    for oy in range(oh):
        for ox in range(ow):
            y0, x0 = oy * sh - ph, ox * sw - pw
            win = x[max(y0, 0) : max(y0 + kh, 0), max(x0, 0) : max(x0 + kw, 0)]
            if win.size:
                out[oy, ox] = np.maximum(out[oy, ox], win.reshape(-1, ch).max(axis=0))
    return np.clip(out, amin, amax).astype(np.int8).ravel()


@needs_build
@pytest.mark.slow
@pytest.mark.parametrize("side", ["optimized", "ansi_c"])
def test_a_one_sided_fault_is_blamed_on_its_own_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, side: str
) -> None:
    # regression: the driver's slot 0 must be the optimized kernel, as sweep.json reads it.
    # The fault (+1 on every element below 127) goes into ONE kernel of the stand-in tree; the right
    # answer is computed here from the case's own tensors, so the test knows which side is wrong.
    monkeypatch.setenv("ESP_CHECK_CACHE_DIR", str(tmp_path / "cache"))
    espnn = faulty_components(tmp_path / side, "off_by_one", side=side) / "esp-nn"
    out = tmp_path / "out"
    result = sweep(SweepOptions(ops=("max_pool",), cases_per_op=12, espnn_dir=espnn, sanitize=False), out)
    report = json.loads((out / "sweep.json").read_text())
    assert result.exit_code == 1 and report["findings"]

    def case_of(line: str) -> sc.Case:  # the example as the driver ran it (shrunk: not among the verdicts)
        _id, _op, seed, lo, hi, *params = (int(x) for x in line.split())
        return sc.Case("max_pool", seed, lo, hi, params, "", True)

    other = "ansi_c" if side == "optimized" else "optimized"
    for f in report["findings"]:
        case = case_of(f["example"]["line"])
        right = _max_pool(case)
        outs = {
            k: np.frombuffer(bytes.fromhex(v), dtype=np.int8) for k, v in f["repro"]["outputs"].items() if v
        }
        assert np.array_equal(outs[other], right), f"{other} is the clean kernel, yet its output is wrong"
        assert not np.array_equal(outs[side], right), f"{side} carries the fault, yet its output is right"
        wrong = outs[side] != right
        assert np.array_equal(outs[side][wrong].astype(np.int32), right[wrong].astype(np.int32) + 1)


@needs_build
@pytest.mark.slow
def test_the_driver_reads_each_param_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sweep_driver.cc indexes a case's params by the names sc.LAYOUT gives them (a header written from
    it), not by positions written a second time in C: with the pooling layout reversed here, the driver
    still pools as the params say by name; a case with a param too many is refused, not misread."""
    for op in ("avg_pool", "max_pool"):
        monkeypatch.setitem(sc.LAYOUT, op, sc.LAYOUT[op][::-1])
    espnn, _ = find_sweep_sources(None, COMPONENTS / "esp-nn")
    where = {"root": tmp_path / "native", "out": tmp_path / "sweep", "log_path": tmp_path / "log"}
    program, _ = build_sweep_driver(espnn, None, sanitize=False, **where)
    cases = list(sc.generate(["max_pool"], 8, seed=3))
    run = run_driver(program.path, cases, dump=True, variants="o")
    for case in cases:
        outputs = run.results[case.id].outputs
        assert outputs is not None and outputs[0] is not None
        assert np.array_equal(np.frombuffer(outputs[0], dtype=np.int8), _max_pool(case))
    with pytest.raises(EspCheckError, match="parameters"):
        run_driver(program.path, [replace(cases[0], params=[*cases[0].params, 0])])


@needs_build
@pytest.mark.slow
def test_scratch_overrun_is_a_sanitizer_finding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, report = _run(tmp_path, monkeypatch, "scratch_overrun", sanitize=True)
    assert code == 4
    san = [f for f in report["findings"] if f["kind"] == "sanitizer"]
    assert san and "heap-buffer-overflow" in san[0]["sanitizer"]["error"]
    assert sum(f["cases"] for f in san) == 60  # every case stopped the sanitized driver, and the rest ran on


@needs_build
@pytest.mark.slow
def test_each_variant_is_sanitized_on_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # regression: the first sanitizer report aborted the process, so a variant with UB hid the
    # other variant's errors in the same case. Here both kernels of the stand-in tree are faulty: ANSI C
    # has a signed overflow (UBSan), the optimized one a scratch overrun (ASan). Both must be reported,
    # in every case, as two groups: one per variant and error type.
    monkeypatch.setenv("ESP_CHECK_CACHE_DIR", str(tmp_path / "cache"))
    comps = inject(faulty_components(tmp_path / "both", "signed_overflow", side="ansi_c"), "scratch_overrun")
    out = tmp_path / "out"
    result = sweep(SweepOptions(ops=("max_pool",), cases_per_op=20, espnn_dir=comps / "esp-nn"), out)
    report = json.loads((out / "sweep.json").read_text())
    assert result.exit_code == 4
    san = [f for f in report["findings"] if f["kind"] == "sanitizer"]
    seen: dict[tuple[str, str, str], int] = {}
    for f in san:  # one group per geometry family (SAME, VALID), variant and error
        key = (f["variant"], f["sanitizer"]["type"], f["sanitizer"]["in"])
        seen[key] = seen.get(key, 0) + f["cases"]
    assert seen == {
        ("optimized", "heap-buffer-overflow", "esp_nn_max_pool_s8_opt"): 20,
        ("ansi_c", "signed integer overflow", "esp_nn_max_pool_s8_ansi"): 20,
    }
    assert all(any(".c:" in a for a in f["sanitizer"]["at"]) for f in san)  # file:line of the frames
    assert not [f for f in report["findings"] if f["kind"] not in ("sanitizer",)]  # the values agree


@needs_build
@pytest.mark.slow
def test_a_death_after_the_last_result_is_a_finding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # regression: a heap overflow that glibc only notices when the driver frees the case's
    # buffers (after its result line) ended the sweep with "failed after its last case", exit 70 and
    # no report. Every death is a finding of the case that was running, never an internal error.
    code, report = _run(tmp_path, monkeypatch, "heap_smash", sanitize=False)
    assert code == 4
    crash = [f for f in report["findings"] if f["kind"] == "crash"]
    assert sum(f["cases"] for f in crash) == 60  # each case smashes the heap: each is blamed, none skipped
    assert all("signal 6" in f["crash"] for f in crash)
    code, report = _run(
        tmp_path, monkeypatch, "heap_smash", sanitize=False, cases=1
    )  # dies after its only case
    assert code == 4 and [f["cases"] for f in report["findings"] if f["kind"] == "crash"] == [1]


@needs_build
@pytest.mark.slow
def test_the_printed_reproduction_runs_on_the_swept_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # regression: the printed command lacked --board native-esp32 --components-dir, so it ran on the
    # simulated board (outputs from the host reference) and said "match". Run it as printed: the
    # native board builds the faulty stand-in tree (nothing faked) and must see the mismatch.
    import shlex

    monkeypatch.setenv("ESP_CHECK_CACHE_DIR", str(tmp_path / "cache"))
    comps = faulty_components(tmp_path / "comps", "off_by_one")
    # the stand-in TFLM glue runs MAX_POOL_2D without a fused activation only: sweep such cases
    cases = [c for c in sc.generate(["max_pool"], 30, seed=0) if c.meta["act"] == "NONE"]
    for k, c in enumerate(cases, 1):
        c.id = k
    opts = SweepOptions(ops=("max_pool",), cases=cases, components_dir=comps, sanitize=False)
    sweep(opts, tmp_path / "out")
    report = json.loads((tmp_path / "out" / "sweep.json").read_text())
    command = report["findings"][0]["repro"]["command"]
    argv = shlex.split(command)
    assert argv[:2] == ["esp-check", "flash-and-compare"]
    assert argv[argv.index("--board") + 1] == "native-esp32"
    assert Path(argv[argv.index("--components-dir") + 1]).resolve() == comps.resolve()
    assert main([*argv[1:], "--out", str(tmp_path / "fc")]) == 1


def _build_c_repro(repro_dir: Path, espnn: Path, work: Path, sanitize: bool) -> Path:
    """Build ``repro.c`` exactly as its own first comment says, from a directory holding ``esp-nn/``."""
    import shlex
    import subprocess

    work.mkdir()
    (work / "esp-nn").symlink_to(espnn.resolve(), target_is_directory=True)
    shutil.copy(repro_dir / "repro.c", work / "repro.c")
    line = next(ln for ln in (work / "repro.c").read_text().splitlines() if ln.startswith("//   cc "))
    argv = shlex.split(line[len("//   ") :])
    assert ("-fsanitize=address,undefined" in argv) == sanitize
    expanded = [str(p.relative_to(work)) for a in argv if "*" in a for p in sorted(work.glob(a))]
    argv = [a for a in argv if "*" not in a] + expanded  # the shell's glob, done here without a shell
    subprocess.run(argv, cwd=work, check=True, capture_output=True, text=True, timeout=300)
    return work / "repro"


@needs_build
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_each_finding_gets_a_report_and_a_standalone_c_repro(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # each example gets report.md (kernel, version, geometry, expected against got, frames) and repro.c, which
    # calls esp-nn's API directly with the data inline, builds with cc alone and exits non-zero; one
    # directory per example case. The faulty stand-in tree is the esp-nn here (nothing faked).
    import subprocess

    code, report = _run(tmp_path, monkeypatch, "off_by_one", sanitize=False, cases=20)
    assert code == 1
    dirs = {f["repro"]["dir"] for f in report["findings"]}
    assert len(dirs) == len({f["example"]["line"] for f in report["findings"]})
    d = Path(sorted(dirs)[0])
    md = (d / "report.md").read_text()
    assert md.startswith("# esp_nn_max_pool_s8 / esp_nn_max_pool_s8_ansi") and "optimized != ANSI C" in md
    assert "| element | where | optimized | ANSI C |" in md
    espnn = tmp_path / "20" / "off_by_one" / "esp-nn"
    prog = _build_c_repro(d, espnn, tmp_path / "c", sanitize=False)
    runs = [subprocess.run([str(prog)], capture_output=True, text=True, timeout=60) for _ in range(2)]
    assert runs[0].returncode == 1 and runs[0].stdout == runs[1].stdout  # fails, the same way each time
    assert (
        "optimized (esp_nn_max_pool_s8): " in runs[0].stdout
        and " values differ from ANSI C" in runs[0].stdout
    )
    row = next(ln for ln in md.splitlines() if ln.startswith("| ") and ln[2].isdigit())
    i, _, opt, ansi = (c.strip() for c in row.strip("|").split("|"))
    assert f"[{int(i):5d}] ANSI C: got {int(opt):4d}, expected {int(ansi):4d}" in runs[0].stdout

    code, report = _run(tmp_path, monkeypatch, "scratch_overrun", sanitize=True, cases=4)
    assert code == 4
    san = next(f for f in report["findings"] if f["kind"] == "sanitizer")
    assert "esp_nn_max_pool_s8_opt" in (Path(san["repro"]["dir"]) / "report.md").read_text()
    espnn = tmp_path / "4" / "scratch_overrun" / "esp-nn"
    prog = _build_c_repro(Path(san["repro"]["dir"]), espnn, tmp_path / "c-san", sanitize=True)
    run = subprocess.run([str(prog)], capture_output=True, text=True, timeout=60)
    assert (
        run.returncode != 0
        and "heap-buffer-overflow" in run.stderr
        and "esp_nn_max_pool_s8_opt" in run.stderr
    )


@needs_build
@pytest.mark.slow
def test_examples_are_shrunk_and_two_sweeps_write_the_same_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # each example is shrunk while its finding holds (here: the off-by-one in the optimized
    # max pool of the stand-in tree shows on any geometry, so one channel and the smallest input that
    # still has an output are left), and a second sweep writes byte-identical reports.
    reports = []
    for k in range(2):
        code, report = _run(tmp_path / str(k), monkeypatch, "off_by_one", sanitize=False, cases=12)
        assert code == 1 and all(f.get("shrunk_from") for f in report["findings"])
        for f in report["findings"]:
            ih, iw, ch, oh, ow = (int(x) for x in f["example"]["line"].split()[5:10])
            before = [int(x) for x in f["shrunk_from"].split()[5:8]]
            assert ch == 1 and ih * iw < before[0] * before[1] * before[2] and oh * ow >= 1
            assert f["example"]["meta"]["ch"] == 1
        reports.append(sorted(Path(f["repro"]["dir"], "report.md").read_text() for f in report["findings"]))
    assert reports[0] == reports[1]


def test_the_components_dir_of_the_command_holds_the_swept_trees(tmp_path: Path) -> None:
    # --components-dir must find these very trees by the names flash-and-compare looks for: a parent
    # holding "espnn-master" and "tflm-v1.3.8" does not, so links to both are made under the output.
    from harness.flows.sweep import native_board_args

    for name in ("espnn-master", "tflm-v1.3.8"):
        shutil.copytree(
            COMPONENTS / ("esp-nn" if name.startswith("espnn") else "esp-tflite-micro"), tmp_path / name
        )
    espnn = ComponentSource("espressif__esp-nn", tmp_path / "espnn-master", None, "components-dir")
    tflm = ComponentSource("espressif__esp-tflite-micro", tmp_path / "tflm-v1.3.8", None, "components-dir")
    args = native_board_args(espnn, tflm, tmp_path / "out")
    assert args is not None
    where = Path(args[args.index("--components-dir") + 1])
    assert where == (tmp_path / "out" / "components").resolve()
    assert (where / "esp-nn").resolve() == espnn.path.resolve()
    assert (where / "esp-tflite-micro").resolve() == tflm.path.resolve()
    assert native_board_args(espnn, None, tmp_path / "out") is None  # no TFLM: no firmware, no command


def test_a_components_dir_without_esp_tflite_micro_sweeps_without_the_reference(tmp_path: Path) -> None:
    # esp-tflite-micro is optional (the reference kernels, docs/sweep.md); only esp-nn is required
    (tmp_path / "esp-nn").mkdir()
    (tmp_path / "esp-nn" / "CMakeLists.txt").write_text("idf_component_register()\n")
    espnn, tflm = find_sweep_sources(tmp_path)
    assert espnn.path == (tmp_path / "esp-nn").resolve() and tflm is None
    with pytest.raises(UsageError, match="is not a directory"):  # a wrong --components-dir is still an error
        find_sweep_sources(tmp_path / "missing", espnn_dir=tmp_path / "esp-nn")


@needs_build
@pytest.mark.slow
def test_cli_sweep_exit_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ESP_CHECK_CACHE_DIR", str(tmp_path / "cache"))
    espnn = _espnn(tmp_path, "off_by_one")
    rc = main(
        [
            "sweep",
            "--espnn",
            str(espnn),
            "--op",
            "max_pool",
            "--cases",
            "10",
            "--no-sanitize",
            "--out",
            str(tmp_path / "o"),
        ]
    )
    assert rc == 1
    assert main(["sweep", "--op", "nope"]) == 2


@needs_build
def test_an_op_that_compared_nothing_is_said_and_alone_is_never_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The stand-in esp-nn has max pool kernels only: its conv cases are all absent, and with no
    # reference compiled nothing about conv was compared. Alone, that used to be "no finding", exit 0.
    monkeypatch.setenv("ESP_CHECK_CACHE_DIR", str(tmp_path / "cache"))
    args = ["sweep", "--espnn", str(COMPONENTS / "esp-nn"), "--cases", "4", "--no-sanitize", "--op", "conv"]
    assert main([*args, "--out", str(tmp_path / "conv")]) == 2
    assert json.loads((tmp_path / "conv" / "sweep.json").read_text())["not_compared"] == ["conv"]
    assert main([*args, "--op", "max_pool", "--out", str(tmp_path / "both")]) == 0
    assert json.loads((tmp_path / "both" / "sweep.json").read_text())["not_compared"] == ["conv"]


MODELS = Path(__file__).parent / "data" / "models"


def test_from_model_takes_each_ops_real_geometry_and_its_neighbours() -> None:
    info = load_model(MODELS / "cnn_classifier_11.tflite")
    cases, skipped = model_cases(info)
    assert skipped == [] and [c.id for c in cases] == list(range(1, len(cases) + 1))
    assert all(c.reachable for c in cases)  # neighbours are computed with TFLite's padding rule
    conv = [c for c in cases if c.meta["model_op"] == 0]
    own = conv[0]
    assert own.op == "conv" and own.meta["variant"] == "model"
    # op 0: input [1,32,32,3], filter [16,3,3,3], SAME, stride 1 -> [1,32,32,16]
    assert own.params[:13] == [32, 32, 3, 3, 3, 3, 16, 32, 32, 1, 1, 1, 1]
    assert own.meta["in_scale"] == pytest.approx(info.tensors[info.main_ops[0].inputs[0]].scale)
    assert own.meta["in_zp"] == info.tensors[info.main_ops[0].inputs[0]].zero_point
    w = info.tensors[info.main_ops[0].inputs[1]]
    assert own.meta["w_scales"] == pytest.approx(list(w.scales), rel=1e-6)  # its per-channel scales
    variants = {c.meta["variant"] for c in conv}
    assert {"s2 SAME", "s1 VALID", "s2 VALID", "h-1 w+0", "h+0 w+1"} <= variants
    assert {f"oc{d:+d}" for d in CHANNEL_DELTAS} <= variants
    assert {f"fc{d:+d}" for d in (-2, -1, 1, 8)} <= variants
    pool = [c for c in cases if c.meta["model_op"] == 1]  # MAX_POOL_2D 2x2/2 VALID on [1,32,32,16]
    assert pool[0].op == "max_pool" and pool[0].params[:11] == [32, 32, 16, 16, 16, 2, 2, 2, 2, 0, 0]
    swept = {f"op{op.index}" for op in info.main_ops if op.opcode != "RESHAPE"}
    assert {c.klass.split()[0] for c in cases} == swept


def test_from_model_says_which_ops_it_cannot_sweep() -> None:
    cases, skipped = model_cases(load_model(MODELS / "op_zoo.tflite"))
    assert {(s["opcode"], s["why"].split()[0]) for s in skipped} == {
        ("CONV_2D", "dilated"),
        ("DEPTHWISE_CONV_2D", "dilated"),
    }
    assert {c.op for c in cases} >= {"conv", "depthwise", "fully_connected", "add", "mul", "softmax"}


@needs_build
@pytest.mark.slow
def test_cli_from_model_catches_a_fault_in_the_models_own_geometry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ESP_CHECK_CACHE_DIR", str(tmp_path / "cache"))
    model = write_model(tmp_path / "pool.tflite")  # MAX_POOL_2D 2x2/2 VALID on [1,8,8,3], then RESHAPE
    args = ["sweep", "--from-model", str(model), "--no-sanitize"]
    assert main([*args, "--espnn", str(COMPONENTS / "esp-nn"), "--out", str(tmp_path / "clean")]) == 0
    clean = json.loads((tmp_path / "clean" / "sweep.json").read_text())
    assert clean["cases"] == 1 + 4 + 3 + 10  # own, spatial +-1, other strides/paddings, channels 3-2..3+8
    rc = main([*args, "--espnn", str(_espnn(tmp_path, "off_by_one")), "--out", str(tmp_path / "bad")])
    bad = json.loads((tmp_path / "bad" / "sweep.json").read_text())
    assert rc == 1 and bad["findings"] and all(f["class"].startswith("op0 ") for f in bad["findings"])
    assert main([*args, "--op", "conv", "--espnn", str(COMPONENTS / "esp-nn")]) == 2  # nothing left to sweep


@pytest.mark.parametrize("given", [{"cases_per_op": 0}, {"cases": []}])
def test_a_sweep_of_no_case_is_refused_not_clean(tmp_path: Path, given: dict) -> None:
    """Zero cases per op (the API allows it) used to give a clean sweep.json and exit 0 over nothing;
    an empty list of given cases used to be replaced by 200 generated ones. Both are refused (exit 2)."""
    opts = SweepOptions(ops=("max_pool",), espnn_dir=COMPONENTS / "esp-nn", sanitize=False, **given)
    opts.cache_dir = tmp_path / "cache"
    with pytest.raises(UsageError, match="no case to sweep"):
        sweep(opts, tmp_path / "out")
    assert not (tmp_path / "out" / "sweep.json").exists()


def test_findings_group_by_a_coarse_geometry_family() -> None:
    from harness.analysis.sweep_findings import CaseVerdict, family, group

    def conv(klass: str) -> CaseVerdict:
        return CaseVerdict(sc.Case("conv", 1, -128, 127, [1] * 20, klass, True), None, ["sanitizer"])

    fine = ("3x3 s1 SAME grouped c<8", "5x5 s2 VALID grouped c>=16", "1x1 s1 SAME grouped c<8")
    vs = [conv(k) for k in fine]
    vs.append(CaseVerdict(sc.Case("conv", 2, -128, 127, [1] * 20, "3x3 s1 SAME c<8", True), None, []))
    groups = group(vs)
    assert [(g["class"], g["cases"]) for g in groups] == [("grouped 1x1", 1), ("grouped KxK", 2)]
    assert groups[1]["classes"] == {"3x3 s1 SAME grouped c<8": 1, "5x5 s2 VALID grouped c>=16": 1}
    assert family("depthwise", "op4 3x3 s2 SAME mult2 c<8") == "op4 KxK mult>1"
    assert family("softmax", "depth>=512 near-max") == "depth>=512 near-max"
    assert family("max_pool", "2x2 s2 VALID c<8") == "VALID"


def test_a_findings_example_is_its_smallest_case_by_size() -> None:
    """A group's example is the case whose sizes (sc.SIZES, by name) are smallest, whatever its other
    params hold: here a 1-input fully connected case with a wide bias range beats a 257-input one."""
    from harness.analysis.sweep_findings import CaseVerdict, group

    def fc(row: int, bias: int) -> CaseVerdict:
        case = sc.fc_case(random.Random(row), row=row, oc=2, per_channel=True)
        case.params = sc.repack(case, {"bias_range": bias})
        return CaseVerdict(case, None, ["sanitizer"])

    (found,) = group([fc(257, 1 << 12), fc(1, 1 << 20)])
    assert found["cases"] == 2 and found["example"].case.named()["row"] == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="XDG_CACHE_HOME is the Linux cache root")
def test_the_sweep_builds_in_the_cache_every_other_build_uses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep's driver builds go where flash-and-compare's native builds go (harness.resources'
    cache root, which honours XDG_CACHE_HOME), not always under ~/.cache. Faked: the component lookup
    and the build (the outermost edge: a CMake build); the test stops at the build."""
    import harness.flows.sweep as sweep_flow  # the module whose two edges are replaced

    monkeypatch.delenv("ESP_CHECK_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    roots: list[Path] = []

    class Stop(Exception):
        """Raised by the faked build: nothing below the build is under test."""

    def build(*_args: object, root: Path, **_kw: object) -> None:
        roots.append(root)
        raise Stop

    monkeypatch.setattr(sweep_flow, "find_sweep_sources", lambda *_a: (None, None))
    monkeypatch.setattr(sweep_flow, "build_sweep_driver", build)
    with pytest.raises(Stop):
        sweep(SweepOptions(ops=("add",), sanitize=False), tmp_path / "out")
    assert roots == [tmp_path / "xdg" / "esp-check" / "builds" / "native"]


@needs_build
@pytest.mark.parametrize("how", ["--cache-dir", "ESP_CHECK_CACHE_DIR"])
def test_sweep_and_flash_and_compare_put_native_builds_in_one_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """``esp-check sweep`` and ``esp-check flash-and-compare`` on a native board build their library trees
    under the same ``<cache>/native``, whether the cache is given by ``--cache-dir`` or by
    $ESP_CHECK_CACHE_DIR. Faked: the two CMake builds (the outermost edge), which record their cache root
    and fail; everything before them (the CLI, the job, the native build plan) is real."""
    import harness.firmware.build as build_mod  # the modules whose CMake builds are replaced
    import harness.flows.sweep as sweep_flow

    monkeypatch.setenv("ESP_CHECK_CACHE_DIR", str(tmp_path / "env"))
    cache = tmp_path / "flag" if how == "--cache-dir" else tmp_path / "env" / "builds"
    flag = ["--cache-dir", str(cache)] if how == "--cache-dir" else []
    roots: dict[str, Path] = {}

    def sweep_build(*_args: object, root: Path, **_kw: object) -> None:
        roots["sweep"] = root
        raise BuildError("faked sweep build")

    def job_build(plan: NativePlan, *_args: object, **_kw: object) -> None:
        roots["flash-and-compare"] = plan.root
        raise BuildError("faked native build")

    monkeypatch.setattr(sweep_flow, "build_sweep_driver", sweep_build)
    monkeypatch.setattr(build_mod, "build_program", job_build)
    model, given = write_model(tmp_path / "pool.tflite"), write_input(tmp_path / "in0.npy")
    common = ["--components-dir", str(COMPONENTS), *flag]
    assert main(["sweep", "--op", "max_pool", "--no-sanitize", *common, "--out", str(tmp_path / "s")]) == 3
    fc = ["flash-and-compare", str(model), "--input", str(given), "--board", "native-esp32", "--no-reference"]
    assert main([*fc, "--allow-untested", *common, "--out", str(tmp_path / "f")]) == 3
    assert roots == {"sweep": cache / "native", "flash-and-compare": cache / "native"}


def _interrupt_the_driver(monkeypatch: pytest.MonkeyPatch, bin_dir: Path, nth: int, how: str) -> None:
    """Faked: the sweep driver's ``nth`` process (the outermost edge, a subprocess of the built driver
    under ``bin_dir``) gets Ctrl-C (``how="ctrl-c"``), SIGTERM (as harness.cli raises it), exits 0
    having printed nothing, or refuses its input as the driver does (exit 2, "esp-check sweep: ..." on
    stderr); the others and every build run for real."""
    import subprocess

    real, calls = subprocess.run, []

    def run(cmd: list[str], *args: object, **kw: object) -> object:
        if str(cmd[0]).startswith(str(bin_dir)):
            calls.append(cmd)
            if len(calls) == nth and how == "refuses":
                refusal = "esp-check sweep: case 0: 7 params, expected 9"
                return subprocess.CompletedProcess(cmd, 2, "", refusal)
            if len(calls) == nth and how != "silent":
                raise KeyboardInterrupt if how == "ctrl-c" else Terminated("signal 15")
            if len(calls) == nth:
                return subprocess.CompletedProcess(cmd, 0, "", "")
        return real(cmd, *args, **kw)

    monkeypatch.setattr(subprocess, "run", run)


@needs_build
@pytest.mark.parametrize(
    ("fault", "cases", "nth", "how", "rc"),
    [
        (None, 150, 1, "ctrl-c", 130),  # in the first driver process, on a clean tree: never "no finding"
        ("off_by_one", 150, 2, "ctrl-c", 130),  # in the second batch: the first batch's findings kept
        ("off_by_one", 20, 2, "ctrl-c", 130),  # every case ran: while shrinking the examples
        ("off_by_one", 150, 1, "silent", 70),
        (None, 150, 1, "sigterm", 143),  # the driver exits 0 without a result: an error that raises
        (None, 150, 1, "refuses", 70),  # a case line esp-check wrote that the driver refuses: esp-check's bug
    ],
)
def test_a_stopped_sweep_writes_what_it_judged_marked_partial(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    fault: str | None,
    cases: int,
    nth: int,
    how: str,
    rc: int,
) -> None:
    # regression: Ctrl-C (or a driver error) during the run or the shrinking left no sweep.json at all.
    # Now the cases judged so far are written, marked partial, with the exit code of the stop (130 as the
    # CLI maps Ctrl-C; an error's own), never 0 or 1.
    monkeypatch.setenv("ESP_CHECK_CACHE_DIR", str(tmp_path / "cache"))
    espnn, out = _espnn(tmp_path, fault), tmp_path / "out"
    _interrupt_the_driver(monkeypatch, out / "bin", nth, how)
    args = ["sweep", "--espnn", str(espnn), "--op", "max_pool", "--cases", str(cases), "--no-sanitize"]
    assert main([*args, "--out", str(out)]) == rc
    report = json.loads((out / "sweep.json").read_text())
    assert report["exit_code"] == rc and report["cases"] == cases
    assert report["partial"] and 0 <= report["cases_run"] <= cases
    assert sum(row["cases"] for row in report["coverage"]) == report["cases_run"]
    if nth == 2:  # the findings of the cases judged before are kept
        assert {f["kind"] for f in report["findings"]} == {"opt_vs_ansi"}
    if nth == 2 and cases == 20:  # one batch: every case was judged before the shrinking
        assert report["cases_run"] == cases and "shrinking" in report["partial"]
    elif nth == 2:
        assert 0 < report["cases_run"] < cases and "running the cases" in report["partial"]
    said = capsys.readouterr()
    assert f"{report['cases_run']} of {cases} cases" in said.out
    if how == "refuses":
        assert "the sweep driver refused its input" in report["partial"]
        assert "report it" in " ".join(said.err.split()), said.err


@needs_build
def test_the_sweep_says_how_many_cases_ran_while_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # regression: one blocking driver process ran every case, and nothing was said until the end
    monkeypatch.setenv("ESP_CHECK_CACHE_DIR", str(tmp_path / "cache"))
    said: list[str] = []
    opts = SweepOptions(ops=("max_pool",), cases_per_op=150, espnn_dir=_espnn(tmp_path, None), sanitize=False)
    assert sweep(opts, tmp_path / "out", progress=said.append).exit_code == 0
    ran = [m for m in said if m.startswith("ran ")]
    assert len(ran) >= 2 and ran[-1] == "ran 150/150 cases" and ran[0] != ran[-1]
