"""Smaller neighbours of a sweep case, for shrinking a finding's example (docs/sweep.md).

:func:`smaller` proposes cases one step smaller than ``case``, each with its parameters and meta
recomputed as the generator computes them (output size and padding by TFLite's rule for a TFLite case,
so it stays TFLite-reachable; per-channel multipliers cut to the new channel count). The caller keeps
the first candidate on which the finding still holds, and repeats.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import replace

from harness.analysis import sweep_cases
from harness.analysis.sweep_cases import Case, CaseMeta, GeometryKey, api_out, repack, tflite_padding

_AXES: tuple[tuple[GeometryKey, GeometryKey, GeometryKey, GeometryKey, GeometryKey], ...] = (
    ("ih", "kh", "sh", "ph", "oh"),
    ("iw", "kw", "sw", "pw", "ow"),
)


def _fewer(n: int, step: int = 1, floor: int = 1) -> list[int]:
    """Smaller values than ``n`` (multiples of ``step``, at least ``floor``), the smallest first."""
    out = {floor, (n // 2) // step * step, n - step}
    return sorted(v for v in out if floor <= v < n and v % step == 0)


def _one(key: sweep_cases.Size, value: int) -> CaseMeta:
    move: CaseMeta = {}
    move[key] = value
    return move


def _spatial(meta: CaseMeta, api: bool) -> None:
    """Output size and padding of ``meta`` after a change, as the case's kind computes them."""
    for size, k, s, pad, out in _AXES:
        if api:
            meta[pad] = min(meta[pad], meta[k] - 1)
            meta[out] = api_out(meta[size], meta[k], meta[s], meta[pad])
        else:
            meta[out], meta[pad] = tflite_padding(meta[size], meta[k], meta[s], meta["same"])


def _conv_like(case: Case) -> Iterator[Case]:
    m, p, dw = case.meta, case.named(), case.op == "depthwise"
    api = "pad*" in case.klass
    moves: list[CaseMeta] = []
    if dw:
        moves += [_one("ic", v) for v in _fewer(p["ic"])] + [_one("mult_ch", v) for v in _fewer(p["mult_ch"])]
    else:
        groups = m.get("groups", 1)
        moves += [_one("oc", v) for v in _fewer(p["oc"], groups, groups)]
        moves += [_one("fc", v) for v in _fewer(p["fc"])]
    moves += [_one(key, v) for key in ("ih", "iw", "kh", "kw") for v in _fewer(m[key])]
    if p["bias_range"] != 0:
        moves.append({"bias_range": 0})
    for move in moves:
        g: CaseMeta = {**copy.deepcopy(m), **move}
        if dw:
            g["oc"] = g["ic"] * g["mult_ch"]
        else:
            g["ic"] = g["fc"] * g.get("groups", 1)
        _spatial(g, api)
        if g["oh"] < 1 or g["ow"] < 1:
            continue
        yield replace(case, params=repack(case, _cut(g, g["oc"]), g["oc"]), meta=g)


def _cut(meta: CaseMeta, channels: int) -> CaseMeta:
    """``meta`` with its per-channel lists cut to the first ``channels``."""
    if "mult" in meta:
        meta["mult"] = meta["mult"][:channels]
    if "shift" in meta:
        meta["shift"] = meta["shift"][:channels]
    if "w_scales" in meta:
        meta["w_scales"] = meta["w_scales"][:channels]
    return meta


def _pool(case: Case) -> Iterator[Case]:
    m = case.meta
    api = "pad*" in case.klass
    moves = [_one(key, v) for key in ("ch", "ih", "iw") for v in _fewer(m[key])]
    for move in moves:
        g: CaseMeta = {**copy.deepcopy(m), **move}
        _spatial(g, api)
        if g["oh"] < 1 or g["ow"] < 1:
            continue
        yield replace(case, params=repack(case, g), meta=g)


def _flat(case: Case) -> Iterator[Case]:
    """Fully connected (row length, outputs), add/mul (size), softmax (rows, row length)."""
    p, m = case.named(), case.meta
    for key in sweep_cases.SIZES[case.op]:
        for v in _fewer(p[key]):
            g: CaseMeta = {**copy.deepcopy(m), **_one(key, v)}
            cut = key == "oc" and p["per_channel"]  # one multiplier and shift per output
            yield replace(case, params=repack(case, _cut(g, v) if cut else g, v if cut else None), meta=g)


def klass_of(case: Case) -> str:
    """The geometry class of a shrunk case, as the generator names it (an ``opN`` prefix kept)."""
    words = case.klass.split()
    prefix = words[0] + " " if words and words[0].startswith("op") and words[0][2:].isdigit() else ""
    word = next((w for w in words if w in ("SAME", "VALID", "pad*")), words[-1] if words else "")
    return prefix + sweep_cases.geometry_class(case, word)


def smaller(case: Case) -> Iterator[Case]:
    """Cases one step smaller than ``case`` (see the module's doc), then a narrower input range."""
    if case.op in ("conv", "depthwise"):
        found = _conv_like(case)
    elif case.op in ("avg_pool", "max_pool"):
        found = _pool(case)
    else:
        found = _flat(case)
    for c in found:
        c.klass = klass_of(c)
        yield c
    if case.op != "softmax" and (case.lo, case.hi) != (-8, 7) and case.lo <= -8 and case.hi >= 7:
        yield replace(case, lo=-8, hi=7, params=list(case.params), meta=case.meta.copy())
