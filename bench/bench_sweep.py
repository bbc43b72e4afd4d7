"""Kernel-sweep throughput and coverage (docs/sweep.md): cases per second, coverage per kernel and class.

    python bench/bench_sweep.py --espnn DIR [--tflm DIR] [--cases N] [--op conv ...] [--no-sanitize]
    python bench/bench_sweep.py --mutants [--espnn DIR --tflm DIR] [--cases N]

Without --espnn it sweeps the stand-in component tree of the tests (max pool only, no reference), so it
runs anywhere a host compiler and CMake are. Prints what one run measured; asserts nothing.

``--mutants`` measures coverage as a **mutation score**: each fault of MUTANTS (ours, written for this
bench: rounding, loop bounds, index and stride mix-ups, scratch overruns, per-channel mix-ups, shift-sign
paths) is injected into a copy of the tree, and the sweep of that kernel's op runs on it. A mutant is
killed when a finding group has more cases than on the unmutated tree (the baseline's own findings do
not count). Real-esp-nn mutants are text edits of esp-nn v1.2.0's generic C sources; a mutant whose text
is not in the tree given is skipped and said so.
"""

# ruff: noqa: E501  (the mutants are source lines: they read better unwrapped)
from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from harness.analysis.sweep_cases import OPS
from harness.flows.sweep import SweepOptions, sweep

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "data" / "native_components" / "esp-nn"


# (name, category, file under esp-nn/, text, replacement, op swept). Stand-in mutants first.
_CONV = "src/convolution/esp_nn_conv_opt.c"
_DW = "src/convolution/esp_nn_depthwise_conv_opt.c"
_COMMON = "src/common/common_functions.h"
_POOL = "src/pooling/esp_nn_max_pool_opt.c"
_STORE = "out[c] = (int8_t)v; /* FIXTURE-FAULT */"
MUTANTS = [
    ("standin-rounding", "rounding", _POOL, _STORE, "out[c] = (int8_t)(v & ~1);", "max_pool"),
    ("standin-loop-bound", "loop bounds", _POOL, "fx < fx_end;", "fx < fx_end - 1;", "max_pool"),
    ("standin-stride-mixup", "index/stride", _POOL, "oy * stride_ht - pad_ht", "oy * stride_wd - pad_ht", "max_pool"),
    ("standin-channel-mixup", "per-channel", _POOL, "if (in[c] > out[c]) out[c] = in[c];",
     "if (in[c] > out[c]) out[c] = in[channels - 1 - c];", "max_pool"),
    ("standin-scratch-overrun", "scratch overrun", _POOL, _STORE,
     "{ int8_t s[1]; volatile int8_t *p = (int8_t *)malloc(channels); p[channels] = 0; free((void *)p);"
     " out[c] = (int8_t)v; (void)s; }", "max_pool"),
    ("conv-rounding", "rounding", _COMMON, "int64_t nudge_val = 1 << 30;", "int64_t nudge_val = 1 << 29;", "conv"),
    ("conv1x1-loop-bound", "loop bounds", _CONV, "for (; in_ch_idx < in_channels; in_ch_idx ++) {",
     "for (; in_ch_idx < in_channels - 1; in_ch_idx ++) {", "conv"),
    ("conv-stride-mixup", "index/stride", _CONV, "const int32_t base_y = stride_ht * out_y - pad_ht;",
     "const int32_t base_y = stride_wd * out_y - pad_ht;", "conv"),
    ("conv-pad-mixup", "index/stride", _CONV, "const int32_t base_x = stride_wd * out_x - pad_wd;",
     "const int32_t base_x = stride_wd * out_x - pad_ht;", "conv"),
    ("conv-filter-bound", "loop bounds", _CONV, "min(filter_wd, input_wd - base_x);",
     "min(filter_wd, input_wd - base_x + 1);", "conv"),
    ("conv-per-channel", "per-channel", _CONV,
     "conv_out = esp_nn_multiply_by_quantized_mult_fast(conv_out, *out_mult++, *out_shift++);\n"
     "                conv_out += out_offset;\n                conv_out = max(conv_out, activation_min);\n"
     "                conv_out = min(conv_out, activation_max);\n                *out_data++ = (int8_t) conv_out;\n"
     "            }\n        }\n    }\n}\n\n/**",
     "conv_out = esp_nn_multiply_by_quantized_mult_fast(conv_out, quant_data->mult[0], *out_shift++); out_mult++;\n"
     "                conv_out += out_offset;\n                conv_out = max(conv_out, activation_min);\n"
     "                conv_out = min(conv_out, activation_max);\n                *out_data++ = (int8_t) conv_out;\n"
     "            }\n        }\n    }\n}\n\n/**", "conv"),
    ("shift-sign", "shift sign", _COMMON, "int64_t in0_64 = (int64_t) (x << left_shift);",
     "int64_t in0_64 = (int64_t) (x << (left_shift > 0 ? left_shift - 1 : 0));", "conv"),
    ("dw-stride-mixup", "index/stride", _DW, "const int16_t base_y = (out_y * stride_ht) - pad_ht;",
     "const int16_t base_y = (out_y * stride_wd) - pad_ht;", "depthwise"),
    ("dw-mult-loop-bound", "loop bounds", _DW, "for (; ch_mult_idx < ch_mult; ch_mult_idx++) {",
     "for (; ch_mult_idx < ch_mult - (ch_mult > 4); ch_mult_idx++) {", "depthwise"),
    ("dw-per-channel", "per-channel", _DW,
     "result = esp_nn_multiply_by_quantized_mult_fast(result, *out_mult++, *out_shift++);",
     "result = esp_nn_multiply_by_quantized_mult_fast(result, *out_mult++, quant_data->shift[0]); out_shift++;", "depthwise"),
]  # fmt: skip


def _counts(findings: list[dict[str, object]]) -> dict[tuple[str, ...], int]:
    return {
        (str(f["op"]), str(f["class"]), str(f["kind"]), str(f.get("error", ""))): int(str(f["cases"]))
        for f in findings
    }


def mutation_score(espnn: Path, tflm: Path | None, cases: int) -> None:
    """Each applicable mutant of MUTANTS on a copy of ``espnn``; killed, survived or skipped."""
    standin = espnn.resolve() == FIXTURE.resolve()
    killed, tried = 0, 0
    baselines: dict[str, dict[tuple[str, ...], int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, category, rel, old, new, op in MUTANTS:
            if name.startswith("standin") != standin:
                continue
            text = (espnn / rel).read_text(encoding="utf-8") if (espnn / rel).is_file() else ""
            if old not in text:
                print(f"{name:<26}{category:<16}skipped: its text is not in {rel} of this tree")
                continue
            if op not in baselines:
                base = sweep(_options(espnn, tflm, op, cases), Path(tmp) / f"base-{op}")
                baselines[op] = _counts(base.findings)
            tree = Path(tmp) / name / "esp-nn"
            shutil.copytree(espnn, tree)
            extra = "#include <stdlib.h>\n" if name == "standin-scratch-overrun" else ""
            (tree / rel).write_text(extra + text.replace(old, new, 1), encoding="utf-8")
            r = sweep(_options(tree, tflm, op, cases), Path(tmp) / f"out-{name}")
            grew = [k for k, n in _counts(r.findings).items() if n > baselines[op].get(k, 0)]
            tried += 1
            killed += bool(grew)
            how = f"killed: {', '.join(' '.join(k[2:]).strip() for k in grew[:3])}" if grew else "SURVIVED"
            print(f"{name:<26}{category:<16}{how}", flush=True)
    print(f"mutation score: {killed}/{tried} killed ({cases} cases per op, ASan+UBSan)")


def _options(espnn: Path, tflm: Path | None, op: str, cases: int) -> SweepOptions:
    return SweepOptions(ops=(op,), cases_per_op=cases, espnn_dir=espnn, tflm_dir=tflm, shrink=False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--espnn", type=Path, default=FIXTURE)
    ap.add_argument("--tflm", type=Path, default=None)
    ap.add_argument("--cases", type=int, default=500)
    ap.add_argument("--op", action="append", choices=list(OPS))
    ap.add_argument("--no-sanitize", action="store_true")
    ap.add_argument("--mutants", action="store_true", help="measure the mutation score (see above)")
    args = ap.parse_args()
    if args.mutants:
        mutation_score(args.espnn, args.tflm, args.cases if args.cases != 500 else 200)
        return
    ops = tuple(args.op or (["max_pool"] if args.espnn == FIXTURE else OPS))
    with tempfile.TemporaryDirectory() as tmp:
        r = sweep(
            SweepOptions(
                ops=ops,
                cases_per_op=args.cases,
                espnn_dir=args.espnn,
                tflm_dir=args.tflm,
                sanitize=not args.no_sanitize,
            ),
            tmp,
        )
    print(
        f"{r.cases} cases in {r.seconds:.2f} s: {r.cases_per_second:.0f} cases/s "
        f"({'ASan+UBSan' if not args.no_sanitize else 'plain'}; reference "
        f"{'compiled' if r.reference else 'absent'})"
    )
    print(f"{'op':<16}{'class':<34}{'cases':>6}{'opt/ANSI':>9}{'ANSI/ANSI':>10}{'vs ref':>8}{'absent':>8}")
    for row in r.coverage:
        print(
            f"{row['op']:<16}{row['class']:<34}{row['cases']:>6}{row['opt_vs_ansi']:>9}"
            f"{row['ansi_vs_ansi']:>10}{row['vs_reference']:>8}{row['absent']:>8}"
        )
    print(f"findings: {len(r.findings)} group(s); exit code {r.exit_code}")


if __name__ == "__main__":
    main()
