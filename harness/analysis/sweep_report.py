"""A kernel-sweep finding as a maintainer reads it (docs/sweep.md): ``report.md`` and ``repro.c``.

What ``repro.c`` holds, how it builds without esp-check or TFLM, and how its inputs are allocated:
docs/sweep.md, "Findings".
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib.resources import files
from typing import Any

import numpy as np

from harness.analysis.sweep_cases import Case, bias_values, int8_values

# The sweep's own flags (harness/firmware/native/toolchain.py): -O2 as on the device; left shifts of
# negative values are defined by GCC, which builds the firmware, so not checked.
BUILD = (
    "cc -std=c99 -g -O2 repro.c -I esp-nn/include -I esp-nn/src/common "
    "esp-nn/src/*/*_ansi.c esp-nn/src/*/*_opt.c -lm -o repro"
)
SANITIZE = (
    " -fsanitize=address,undefined -fno-sanitize=shift-base -fno-sanitize-recover=all -fno-omit-frame-pointer"
)
ROWS = 8

# The start of every repro.c: includes, the input guard, the output check (BUILD_LINE and ROWS filled in).
_PRELUDE = (files("harness") / "templates" / "sweep_repro_prelude.c").read_text(encoding="utf-8")


def _array(ctype: str, name: str, values: Sequence[int]) -> str:
    body = ", ".join(str(int(v)) for v in values) or "0"
    return f"static const {ctype} {name}[{max(len(values), 1)}] = {{{body}}};\n"


def _tensors(case: Case) -> tuple[dict[str, tuple[str, list[int]]], int]:
    """The case's inline arrays (the driver's own values) and its output length."""
    p = case.params
    arrays: dict[str, tuple[str, list[int]]] = {}
    if case.op in ("conv", "depthwise"):
        ih, iw, ic, kh, kw = p[:5]
        dw = case.op == "depthwise"
        oc = ic * p[5] if dw else p[6]
        oh, ow = (p[6], p[7]) if dw else (p[7], p[8])
        nq = 17 if dw else 18
        n_in, n_out = ih * iw * ic, oh * ow * oc
        nfilt = kh * kw * oc if dw else oc * kh * kw * p[5]
        arrays["filt"] = ("int8_t", int8_values(case.seed, 1, nfilt, -127, 127).tolist())
        arrays["bias"] = ("int32_t", bias_values(case.seed, oc, p[nq - 1]).tolist())
        arrays["mult"] = ("int32_t", p[nq : nq + oc])
        arrays["shift"] = ("int32_t", p[nq + oc : nq + 2 * oc])
    elif case.op == "fully_connected":
        row, oc, per_ch = p[0], p[1], p[8]
        nq = oc if per_ch else 1
        n_in, n_out = row, oc
        arrays["filt"] = ("int8_t", int8_values(case.seed, 1, oc * row, -127, 127).tolist())
        arrays["bias"] = ("int32_t", bias_values(case.seed, oc, p[7]).tolist())
        arrays["mult"] = ("int32_t", p[9 : 9 + nq])
        arrays["shift"] = ("int32_t", p[9 + nq : 9 + 2 * nq])
    elif case.op in ("add", "mul"):
        n_in = n_out = p[0]
        arrays["in2"] = ("int8_t", int8_values(case.seed, 1, n_in, case.lo, case.hi).tolist())
    elif case.op in ("avg_pool", "max_pool"):
        ih, iw, ch, oh, ow = p[:5]
        n_in, n_out = ih * iw * ch, oh * ow * ch
    else:
        n_in = n_out = p[0] * p[1]
    inputs = ("int8_t", int8_values(case.seed, 0, n_in, case.lo, case.hi).tolist())
    return {"in": inputs, **arrays}, n_out


def _c(fn: str, *args: object) -> str:
    return f"{fn}({', '.join(str(a) for a in args)})"


def _braced(*args: object) -> str:
    return "{" + ", ".join(str(a) for a in args) + "}"


def _scratch_call(kind: str, sfx: str, size_args: str, call: str) -> str:
    return (
        f"  {{\n    int size = (int)esp_nn_get_{kind}_scratch_size{sfx}({size_args});\n"
        "    void *scratch = size > 0 ? malloc((size_t)size) : NULL;\n"
        f"    esp_nn_set_{kind}_scratch_buf{sfx}(scratch);\n    {call};\n"
        f"    esp_nn_set_{kind}_scratch_buf{sfx}(NULL);\n    free(scratch);\n  }}\n"
    )


def _call(case: Case, fn: str, out: str) -> str:
    """One variant's call (``fn``: the generic name or its ``_ansi`` twin), as the sweep driver makes it."""
    p = case.params
    sfx = "_ansi" if fn.endswith("_ansi") else ""
    if case.op in ("conv", "depthwise"):
        dw = case.op == "depthwise"
        ih, iw, ic, kh, kw = p[:5]
        if dw:
            cm, oh, ow, oc = p[5], p[6], p[7], ic * p[5]
            f_d = _braced(kw, kh, oc, 1)
            cp = "dw_conv_params_t cp = " + _braced(
                p[12], p[13], cm, _braced(p[9], p[8]), _braced(p[11], p[10]), "{0, 0}", _braced(p[14], p[15])
            )
        else:
            fc, oc, oh, ow = p[5], p[6], p[7], p[8]
            f_d = _braced(kw, kh, fc, 0)
            cp = "conv_params_t cp = " + _braced(
                p[13], p[14], _braced(p[10], p[9]), _braced(p[12], p[11]), "{0, 0}", _braced(p[15], p[16])
            )
        dims = f"data_dims_t in_d = {_braced(iw, ih, ic, 1)}, f_d = {f_d}, o_d = {_braced(ow, oh, oc, 1)}"
        call = _c(fn, "&in_d", "in", "&f_d", "filt", "bias", "&o_d", out, "&cp", "&q")
        body = _scratch_call("depthwise_conv" if dw else "conv", sfx, "&in_d, &f_d, &o_d, &cp", call)
        return f"  {{\n  {dims};\n  {cp};\n  quant_data_t q = {{shift, mult}};\n{body}  }}\n"
    if case.op == "fully_connected":
        sm = ("shift", "mult") if p[8] else ("shift[0]", "mult[0]")
        return "  " + _c(fn, "in", p[2], p[0], "filt", p[3], "bias", out, p[1], p[4], *sm, p[5], p[6]) + ";\n"
    if case.op == "add":
        return "  " + _c(fn, "in", "in2", *p[1:8], out, *p[8:13], p[0]) + ";\n"
    if case.op == "mul":
        return "  " + _c(fn, "in", "in2", p[1], p[2], out, *p[3:8], p[0]) + ";\n"
    if case.op in ("avg_pool", "max_pool"):
        ih, iw, ch, oh, ow, sh, sw, kh, kw, ph, pw, amin, amax = p[:13]
        return "  " + _c(fn, "in", iw, ih, out, ow, oh, sw, sh, kw, kh, pw, ph, amin, amax, ch) + ";\n"
    rows, depth, mult, shift, diff_min = p[:5]
    call = _c(fn, "in", rows, depth, mult, shift, diff_min, out)
    return _scratch_call("softmax", sfx, f"{depth}, {rows}", call)


GENERIC = {
    "conv": "esp_nn_conv_s8",
    "depthwise": "esp_nn_depthwise_conv_s8",
    "fully_connected": "esp_nn_fully_connected_s8",
    "add": "esp_nn_add_elementwise_s8",
    "mul": "esp_nn_mul_elementwise_s8",
    "avg_pool": "esp_nn_avg_pool_s8",
    "max_pool": "esp_nn_max_pool_s8",
    "softmax": "esp_nn_softmax_s8",
}


def kernel_names(case: Case) -> tuple[str, str]:
    """(the generic name esp_nn_generic_opt.h maps, its ANSI C function) for ``case``."""
    name = GENERIC[case.op]
    if case.op == "fully_connected" and case.params[8]:
        name = "esp_nn_fully_connected_per_ch_s8"
    return name, name + "_ansi"


def c_repro(case: Case, expected: bytes | None, sanitize: bool) -> str:
    """``repro.c`` for ``case``; ``expected`` is the reference output (None: optimized vs ANSI C only)."""
    arrays, n = _tensors(case)
    opt, ansi = kernel_names(case)
    build = BUILD + (SANITIZE if sanitize else "")
    src = [_PRELUDE.replace("BUILD_LINE", build).replace("ROWS", str(ROWS))]
    src.append(f"\n/* {case.op} case {case.id}: {case.line()} */\n")
    for name, (ctype, values) in arrays.items():
        src.append(_array(ctype, f"{name}_data", values))
    if expected is not None:
        src.append(_array("int8_t", "expected", list(np.frombuffer(expected, dtype=np.int8))))
    src.append(f"\nint main(void) {{\n  const int n = {n};\n")
    for name, (ctype, values) in arrays.items():
        size = f"sizeof({name}_data[0]) * {len(values)}"
        src.append(f"  {ctype} *{name} = ({ctype} *)input_copy({name}_data, {size});\n")
    src.append("  int8_t *opt = output((size_t)n, 0x55), *ansi = output((size_t)n, 0xAA);\n")
    src.append(_call(case, opt, "opt"))
    src.append(_call(case, ansi, "ansi"))
    if expected is not None:
        src.append(f'  int bad = check("optimized ({opt})", opt, expected, n, "TFLM reference");\n')
        src.append(f'  bad |= check("ANSI C ({ansi})", ansi, expected, n, "TFLM reference");\n')
    else:
        src.append(f'  int bad = check("optimized ({opt})", opt, ansi, n, "ANSI C");\n')
    src.append("  return bad ? 1 : 0;\n}\n")
    return "".join(src)


def _coords(case: Case, i: int) -> str:
    p = case.params
    if case.op in ("conv", "depthwise", "avg_pool", "max_pool"):
        oc = p[2] * p[5] if case.op == "depthwise" else p[6] if case.op == "conv" else p[2]
        ow = p[7] if case.op == "depthwise" else p[8] if case.op == "conv" else p[4]
        return f"y={i // (ow * oc)} x={i // oc % ow} c={i % oc}"
    if case.op == "softmax":
        return f"row={i // p[1]} i={i % p[1]}"
    return f"i={i}"


def value_rows(case: Case, outputs: Sequence[bytes | None]) -> list[str]:
    """Markdown rows of the first elements where a variant differs from the reference (or each other)."""
    opt, ansi, ref = (None if o is None else np.frombuffer(o, dtype=np.int8).astype(int) for o in outputs)
    if opt is None or ansi is None:
        return []
    base = ref if ref is not None else ansi
    bad = np.flatnonzero((opt != base) | (ansi != base))[:ROWS]
    head = (
        "| element | where | reference | optimized | ANSI C |"
        if ref is not None
        else "| element | where | optimized | ANSI C |"
    )
    rows = [head, "|---|---|---|---|---|" if ref is not None else "|---|---|---|---|"]
    for i in bad:
        vals = ([int(ref[i])] if ref is not None else []) + [int(opt[i]), int(ansi[i])]
        rows.append(f"| {i} | {_coords(case, int(i))} | " + " | ".join(str(v) for v in vals) + " |")
    return rows if len(bad) else []


def report_md(
    case: Case,
    findings: Sequence[dict[str, Any]],
    outputs: Sequence[bytes | None] | None,
    sources: dict[str, Any],
    command: str | None = None,
    shrunk_from: str | None = None,
) -> str:
    """The maintainer's report of one example case and every finding it stands for."""
    opt, ansi = kernel_names(case)
    espnn = sources.get("esp-nn") or {}
    tflm = sources.get("esp-tflite-micro") or {}
    headline = headline_of(case, findings)
    shrunk = f" (shrunk from `{shrunk_from}`)" if shrunk_from else ""
    out = [
        f"# {headline}",
        "",
        f"- kernel: `{opt}` (as `esp_nn_generic_opt.h` maps it) and `{ansi}`",
        f"- esp-nn: {espnn.get('version') or 'version not stated'}"
        f" (source tree content sha256 {str(espnn.get('sha256', ''))[:16]})",
        f"- reference: TFLM reference kernels of esp-tflite-micro {tflm.get('version') or '(not given)'}",
        f"- geometry and quantization: `{case.klass}`; {_geometry(case)}",
        f"- driver case line: `{case.line()}`{shrunk}",
    ]
    why = next((f["why_api_only"] for f in findings if f.get("why_api_only")), "")
    reach = (
        f"API-only: {why}" if why else "TFLite-reachable" if case.reachable else "API-only (raw API space)"
    )
    out += [f"- reached by: {reach}", ""]
    for f in findings:
        out.append(f"## {f['kind']}" + (f": {f['error']}" if f.get("error") else ""))
        out.append(f"{f['cases']} case(s) of the sweep in this group; classes: {', '.join(f['classes'])}")
        san = f.get("sanitizer")
        if san:
            out += ["", f"`{san['error']}`", "", "```", *san.get("at", san.get("frames", [])), "```"]
        if f.get("crash"):
            out.append(f"\ncrash: {f['crash']}")
        out.append("")
    rows = value_rows(case, outputs) if outputs else []
    if rows:
        out += ["## Expected against got (first differing elements)", "", *rows, ""]
    sanitize = any(f["kind"] == "sanitizer" for f in findings)
    out += ["## Standalone reproduction", "", "From a directory holding `esp-nn/`:", "", "```sh",
            BUILD + (SANITIZE if sanitize else ""), "./repro", "```", ""]  # fmt: skip
    if command:
        out += ["## Through TFLite, with esp-check on the native board", "",
                "`model.tflite` (this one op) and `input.npy`:", "", "```sh", command, "```", ""]  # fmt: skip
    return "\n".join(out) + "\n"


def _geometry(case: Case) -> str:
    m = case.meta
    keys = (
        *("ih", "iw", "ic", "kh", "kw", "fc", "oc", "mult_ch", "oh", "ow", "sh", "sw", "ph", "pw", "groups"),
        *("row", "per_channel", "size", "rows", "depth", "in_scale", "in_zp", "out_scale", "out_zp", "act"),
    )
    values: dict[str, object] = dict(m)
    return ", ".join(f"{k}={values[k]}" for k in keys if k in values)


def headline_of(case: Case, findings: Sequence[dict[str, Any]]) -> str:
    """One line: which kernel, what went wrong, on what geometry."""
    opt, ansi = kernel_names(case)
    what = []
    for f in findings:
        if f["kind"] == "sanitizer":
            where = f["sanitizer"].get("in") or ""
            what.append(f"{f['variant']}: {f['sanitizer']['type']}" + (f" in {where}" if where else ""))
        elif f["kind"] == "crash":
            what.append(f"{f['crash']}")
        else:
            what.append(_value_text(f))
    return f"{opt} / {ansi} ({case.klass}): " + "; ".join(dict.fromkeys(what))


def _value_text(finding: dict[str, Any]) -> str:
    """Which variant gives wrong values, from the example's differences (never a guess)."""
    diff = finding.get("example", {}).get("diff") or {}
    o_r, a_r, o_a = diff.get("opt_ref"), diff.get("ansi_ref"), diff.get("opt_ansi")
    if finding["kind"] == "reference_refuses":
        return "TFLM's reference refuses (a TFLITE_CHECK aborts) while esp-nn returns values"
    if o_r is not None and a_r is not None:
        parts = []
        for name, d in (("optimized", o_r), ("ANSI C", a_r)):
            wrong = f"!= reference ({d['count']} values, up to {d['max_abs']} LSB)"
            parts.append(f"{name} {'== reference' if d['count'] == 0 else wrong}")
        return ", ".join(parts)
    if o_a is not None and o_a["count"]:
        n, most = o_a["count"], o_a["max_abs"]
        return f"optimized != ANSI C ({n} values, up to {most} LSB; no reference to say which is right)"
    return str(finding["kind"]).replace("_", " ")
