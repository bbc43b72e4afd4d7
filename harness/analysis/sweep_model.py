"""``esp-check sweep --from-model M``: the geometries of a user's model, and their neighbours.

Which ops become cases, their neighbours (one change at a time) and the ops listed as skipped with why:
docs/sweep.md, "``--from-model M``".
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from harness.analysis.sweep_cases import (
    Case,
    CaseMeta,
    PoolShape,
    Quant,
    add_mul_case,
    conv_case,
    depthwise_case,
    fc_case,
    pool_case,
    softmax_case,
    tflite_padding,
)
from harness.model.modelinfo import ModelInfo, OpInfo, TensorInfo

CHANNEL_DELTAS = tuple(d for d in range(-8, 9) if d)
_POOLS = {"AVERAGE_POOL_2D": "avg_pool", "MAX_POOL_2D": "max_pool"}


def _quant(info: ModelInfo, op: OpInfo) -> Quant:
    """The op's scales and zero points (its weights are input 1; ``_int8`` checked the scales are set)."""
    t_in, t_out, w = (info.tensors[i] for i in (op.inputs[0], op.outputs[0], op.inputs[1]))
    return {
        "in_scale": t_in.scale or 0.0,
        "in_zp": t_in.zero_point or 0,
        "out_zp": t_out.zero_point or 0,
        "out_scale": t_out.scale or 0.0,
        "w_scales": list(w.scales) if w.scales else [w.scale or 0.01],
    }


def _int8(info: ModelInfo, op: OpInfo) -> bool:
    ts = [info.tensors[i] for i in (op.inputs[0], op.outputs[0]) if i >= 0]
    return all(t.dtype == "int8" and t.scale is not None for t in ts)


def _nhwc(tensor: TensorInfo) -> tuple[int, int, int]:
    shape = (1,) * (4 - len(tensor.shape)) + tuple(tensor.shape)
    return shape[1], shape[2], shape[3]


def _geometry(
    ih: int, iw: int, kh: int, kw: int, stride: int, same: bool, stride_w: int | None = None
) -> CaseMeta:
    sw = stride if stride_w is None else stride_w
    oh, ph = tflite_padding(ih, kh, stride, same)
    ow, pw = tflite_padding(iw, kw, sw, same)
    return {"ih": ih, "iw": iw, "kh": kh, "kw": kw, "oh": oh, "ow": ow, "sh": stride, "sw": sw,
            "ph": ph, "pw": pw, "same": same}  # fmt: skip


def _spatial_variants(base: CaseMeta) -> Iterator[tuple[str, CaseMeta]]:
    """The model's own, each spatial axis +-1, every stride and padding (as TFLite computes them)."""
    ih, iw, kh, kw, stride, same = base["ih"], base["iw"], base["kh"], base["kw"], base["sh"], base["same"]
    sw = base["sw"]
    yield "model", _geometry(ih, iw, kh, kw=kw, stride=stride, same=same, stride_w=sw)
    for dh, dw in ((-1, 0), (1, 0), (0, -1), (0, 1)):
        if ih + dh >= 1 and iw + dw >= 1:
            yield (
                f"h{dh:+d} w{dw:+d}",
                _geometry(ih + dh, iw + dw, kh, kw=kw, stride=stride, same=same, stride_w=sw),
            )
    for s in (1, 2):
        for p in (True, False):
            if (s, s, p) != (stride, sw, same):
                yield f"s{s} {'SAME' if p else 'VALID'}", _geometry(ih, iw, kh, kw, s, p)


def _conv_like(info: ModelInfo, op: OpInfo, depthwise: bool) -> tuple[list[tuple[str, CaseMeta]], str]:
    """(variant label, geometry) for conv_case / depthwise_case, or why not."""
    o = op.options
    if o.get("dilation_h_factor", 1) != 1 or o.get("dilation_w_factor", 1) != 1:
        return [], "dilated (esp-nn is not called for it)"
    ih, iw, ic = _nhwc(info.tensors[op.inputs[0]])
    f = info.tensors[op.inputs[1]].shape
    if len(f) != 4:
        return [], f"filter shape {list(f)}"
    kh, kw = f[1], f[2]
    sh, sw = int(str(o.get("stride_h", 1))), int(str(o.get("stride_w", 1)))
    base = _geometry(ih, iw, kh, kw=kw, stride=sh, same=o.get("padding", "SAME") == "SAME", stride_w=sw)
    out: list[tuple[str, CaseMeta]]
    if depthwise:
        mult = max(1, f[3] // max(1, ic))
        out = [(label, {**g, "ic": ic, "mult_ch": mult}) for label, g in _spatial_variants(base)]
        out += [(f"ic{d:+d}", {**base, "ic": ic + d, "mult_ch": mult}) for d in CHANNEL_DELTAS if ic + d >= 1]
        return out, ""
    oc, fc = f[0], f[3]
    groups = max(1, ic // max(1, fc))
    common: CaseMeta = {"fc": fc, "ic": fc * groups, "oc": oc, "groups": groups}
    out = [(label, {**g, **common}) for label, g in _spatial_variants(base)]
    for d in CHANNEL_DELTAS:
        if fc + d >= 1:
            out.append((f"fc{d:+d}", {**base, **common, "fc": fc + d, "ic": (fc + d) * groups}))
        if oc + d >= groups and (oc + d) % groups == 0:
            out.append((f"oc{d:+d}", {**base, **common, "oc": oc + d}))
    return out, ""


def _cases_of(info: ModelInfo, op: OpInfo, rng: random.Random) -> tuple[list[Case], str]:
    """The cases of one op (own geometry first, then its neighbours), or why none."""
    name = op.opcode
    o = op.options
    if name in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        overs, why = _conv_like(info, op, name == "DEPTHWISE_CONV_2D")
        q = _quant(info, op) if overs else None
        make = depthwise_case if name == "DEPTHWISE_CONV_2D" else conv_case
        return [_tag(make(rng, quant=q, over=g), op, label) for label, g in overs], why
    if name == "FULLY_CONNECTED":
        w = info.tensors[op.inputs[1]]
        if len(w.shape) != 2:
            return [], f"weights shape {list(w.shape)}"
        oc, row = w.shape
        q = _quant(info, op)
        pc = w.per_channel
        cases = [_tag(fc_case(rng, row=row, oc=oc, per_channel=pc, quant=q), op, "model")]
        for d in CHANNEL_DELTAS:
            if row + d >= 1:
                cases.append(
                    _tag(fc_case(rng, row=row + d, oc=oc, per_channel=pc, quant=q), op, f"row{d:+d}")
                )
            if oc + d >= 1:
                cases.append(_tag(fc_case(rng, row=row, oc=oc + d, per_channel=pc, quant=q), op, f"oc{d:+d}"))
        return cases, ""
    if name in ("ADD", "MUL"):
        a, b = (info.tensors[i] for i in op.inputs[:2])
        if a.shape != b.shape:
            return [], "broadcasting (esp-tflite-micro calls esp-nn only for equal shapes)"
        n = a.num_elements
        sizes = [n] + [n + d for d in CHANNEL_DELTAS if n + d >= 1]
        return [_tag(add_mul_case(rng, name.lower(), size=s), op, "model" if s == n else f"n{s - n:+d}")
                for s in sizes], ""  # fmt: skip
    if name in _POOLS:
        ih, iw, ch = _nhwc(info.tensors[op.inputs[0]])
        k, stride = int(str(o.get("filter_height", 2))), int(str(o.get("stride_h", 1)))
        if o.get("filter_width") != k or o.get("stride_w") != stride:
            return [], "non-square filter or stride (the sweep's pooling cases are square)"
        base = _geometry(ih, iw, k, k, stride, o.get("padding", "SAME") == "SAME")
        pool = _POOLS[name]
        cases = [
            _tag(pool_case(rng, pool, shape=PoolShape(k, g["sh"], g["same"], g["ih"], g["iw"], ch)), op, lab)
            for lab, g in _spatial_variants(base)
        ]
        same = base["same"]
        cases += [
            _tag(pool_case(rng, pool, shape=PoolShape(k, stride, same, ih, iw, ch + d)), op, f"ch{d:+d}")
            for d in CHANNEL_DELTAS
            if ch + d >= 1
        ]
        return cases, ""
    if name == "SOFTMAX":
        t = info.tensors[op.inputs[0]]
        depth = t.shape[-1] if t.shape else 1
        rows = max(1, t.num_elements // max(1, depth))
        cases = []
        for d in (0, *CHANNEL_DELTAS):
            for near in (True, False):
                if depth + d >= 1:
                    c = softmax_case(rng, depth=depth + d, rows=rows, scale=t.scale, near_max=near, spread=1)
                    cases.append(_tag(c, op, f"depth{d:+d}" if d else "model"))
        return cases, ""
    return [], ""


def _tag(case: Case, op: OpInfo, variant: str) -> Case:
    case.meta["model_op"] = op.index
    case.meta["variant"] = variant
    case.klass = f"op{op.index} {case.klass}"
    return case


def model_cases(info: ModelInfo, seed: int = 0) -> tuple[list[Case], list[dict[str, int | str]]]:
    """Cases for every esp-nn op of ``info`` and its neighbours (ids from 1), and the ops skipped."""
    cases: list[Case] = []
    skipped: list[dict[str, int | str]] = []
    for op in info.main_ops:
        if not _int8(info, op):
            if op.opcode in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "ADD", "MUL", "SOFTMAX",
                             *_POOLS):  # fmt: skip
                skipped.append({"op": op.index, "opcode": op.opcode, "why": "not int8"})
            continue
        got, why = _cases_of(info, op, random.Random(f"{seed}:{op.index}"))
        if why:
            skipped.append({"op": op.index, "opcode": op.opcode, "why": why})
        cases.extend(got)
    for k, c in enumerate(cases, 1):
        c.id = k
    return cases, skipped
