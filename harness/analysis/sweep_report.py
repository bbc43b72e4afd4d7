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
    p, (mult, shift) = case.named(), case.requant()
    arrays: dict[str, tuple[str, list[int]]] = {}
    if case.op in ("conv", "depthwise", "fully_connected"):
        oc = len(mult) if case.op != "fully_connected" else p["oc"]  # conv-like: one multiplier per output
        if case.op == "fully_connected":
            n_in, n_out, nfilt = p["row"], oc, oc * p["row"]
        else:
            n_in, n_out = p["ih"] * p["iw"] * p["ic"], p["oh"] * p["ow"] * oc
            nfilt = p["kh"] * p["kw"] * oc * (1 if case.op == "depthwise" else p["fc"])
        arrays["filt"] = ("int8_t", int8_values(case.seed, 1, nfilt, -127, 127).tolist())
        arrays["bias"] = ("int32_t", bias_values(case.seed, oc, p["bias_range"]).tolist())
        arrays["mult"], arrays["shift"] = ("int32_t", mult), ("int32_t", shift)
    elif case.op in ("add", "mul"):
        n_in = n_out = p["size"]
        arrays["in2"] = ("int8_t", int8_values(case.seed, 1, n_in, case.lo, case.hi).tolist())
    elif case.op in ("avg_pool", "max_pool"):
        n_in, n_out = p["ih"] * p["iw"] * p["ch"], p["oh"] * p["ow"] * p["ch"]
    else:
        n_in = n_out = p["rows"] * p["depth"]
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
    p = case.named()
    sfx = "_ansi" if fn.endswith("_ansi") else ""
    if case.op in ("conv", "depthwise"):
        dw, oc = case.op == "depthwise", len(case.requant()[0])  # one multiplier per output channel
        rest = (_braced(p["sw"], p["sh"]), _braced(p["pw"], p["ph"]), "{0, 0}", _braced(p["amin"], p["amax"]))
        if dw:
            f_d = _braced(p["kw"], p["kh"], oc, 1)
            cp = "dw_conv_params_t cp = " + _braced(p["in_off"], p["out_zp"], p["mult_ch"], *rest)
        else:
            f_d = _braced(p["kw"], p["kh"], p["fc"], 0)
            cp = "conv_params_t cp = " + _braced(p["in_off"], p["out_zp"], *rest)
        in_d, o_d = _braced(p["iw"], p["ih"], p["ic"], 1), _braced(p["ow"], p["oh"], oc, 1)
        dims = f"data_dims_t in_d = {in_d}, f_d = {f_d}, o_d = {o_d}"
        call = _c(fn, "&in_d", "in", "&f_d", "filt", "bias", "&o_d", out, "&cp", "&q")
        body = _scratch_call("depthwise_conv" if dw else "conv", sfx, "&in_d, &f_d, &o_d, &cp", call)
        return f"  {{\n  {dims};\n  {cp};\n  quant_data_t q = {{shift, mult}};\n{body}  }}\n"
    if case.op == "fully_connected":
        sm = ("shift", "mult") if p["per_channel"] else ("shift[0]", "mult[0]")
        args = ("in", p["in_off"], p["row"], "filt", p["w_off"], "bias", out, p["oc"], p["out_zp"], *sm)
        return "  " + _c(fn, *args, p["amin"], p["amax"]) + ";\n"
    if case.op in ("add", "mul"):
        ins = ("in", "in2", p["in1_off"], p["in2_off"])
        outs = (p["out_zp"], p["out_mult"], p["out_shift"], p["amin"], p["amax"])
        if case.op == "add":
            shifts = (p["mult1"], p["mult2"], p["shift1"], p["shift2"], p["left_shift"])
            return "  " + _c(fn, *ins, *shifts, out, *outs, p["size"]) + ";\n"
        return "  " + _c(fn, *ins, out, *outs, p["size"]) + ";\n"
    if case.op in ("avg_pool", "max_pool"):
        shape = (p["ow"], p["oh"], p["sw"], p["sh"], p["kw"], p["kh"], p["pw"], p["ph"])
        return "  " + _c(fn, "in", p["iw"], p["ih"], out, *shape, p["amin"], p["amax"], p["ch"]) + ";\n"
    call = _c(fn, "in", p["rows"], p["depth"], p["in_mult"], p["in_shift"], p["diff_min"], out)
    return _scratch_call("softmax", sfx, f"{p['depth']}, {p['rows']}", call)


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
    if case.op == "fully_connected" and case.named()["per_channel"]:
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
    p = case.named()
    if case.op in ("conv", "depthwise", "avg_pool", "max_pool"):
        oc = p["ch"] if "ch" in p else len(case.requant()[0])  # conv-like: one multiplier per output
        return f"y={i // (p['ow'] * oc)} x={i // oc % p['ow']} c={i % oc}"
    if case.op == "softmax":
        return f"row={i // p['depth']} i={i % p['depth']}"
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
