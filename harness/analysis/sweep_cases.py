"""Kernel-sweep cases (docs/sweep.md): geometries and quantization as TFLite produces them, or raw API space.

A case is everything the sweep driver (``firmware_templates/sweep/sweep_driver.cc``) needs to call one
esp-nn kernel, its ANSI C twin and TFLM's reference, and a seed from which the driver derives the tensors
(:func:`values` rebuilds them for a reproduction). Its params are named once, in the driver's order, by
:data:`LAYOUT`: the generator packs by it, the shrinker, the geometry class and ``repro.c`` read by it.
Which geometries and quantizations are drawn, and when a case is TFLite-reachable: docs/sweep.md,
"Geometries".
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, TypedDict, TypeVar, get_args

import numpy as np

T = TypeVar("T")

OPS = {
    "conv": 1,
    "depthwise": 2,
    "fully_connected": 3,
    "add": 4,
    "mul": 5,
    "avg_pool": 6,
    "max_pool": 7,
    "softmax": 8,
}


# --------------------------------------------------------------------------------------------
# the driver's data (must match sweep_value() in sweep_driver.cc)


def _mix(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def values(seed: int, stream: int, n: int) -> np.ndarray:
    """The driver's raw 64-bit values for elements 0..n-1 of ``stream`` of the case with ``seed``."""
    base = np.uint64((((seed & 0x0FFFFFFF) << 4) | stream) << 32)
    return _mix(base | np.arange(n, dtype=np.uint64))


def int8_values(seed: int, stream: int, n: int, lo: int, hi: int) -> np.ndarray:
    span = np.uint64(hi - lo + 1)
    return (lo + (values(seed, stream, n) % span).astype(np.int64)).astype(np.int8)


def bias_values(seed: int, n: int, rng: int) -> np.ndarray:
    span = np.uint64(2 * rng + 1)
    return (-rng + (values(seed, 2, n) % span).astype(np.int64)).astype(np.int32)


# --------------------------------------------------------------------------------------------
# TFLite's arithmetic for quantized parameters (tensorflow/lite/kernels/internal/quantization_util.cc)


def quantize_multiplier(real_multiplier: float) -> tuple[int, int]:
    """(multiplier, shift) of ``real_multiplier`` as TFLite's QuantizeMultiplier computes them."""
    if real_multiplier == 0.0:
        return 0, 0
    frac, exp = math.frexp(real_multiplier)
    q = round(frac * (1 << 31))
    if q == 1 << 31:
        q //= 2
        exp += 1
    if exp < -31:
        return 0, 0
    return int(q), int(exp)


def softmax_params(input_scale: float, beta: float = 1.0) -> tuple[int, int, int]:
    """(input_multiplier, input_left_shift, diff_min) as TFLM's softmax Prepare computes them."""
    bits = 5  # kScaledDiffIntegerBits
    real = min(beta * input_scale * (1 << (31 - bits)), (1 << 31) - 1.0)
    mult, shift = quantize_multiplier(real)
    radius = ((1 << bits) - 1) * (1 << (31 - bits)) / (1 << shift)
    return mult, shift, -math.floor(radius)


def tflite_padding(size: int, k: int, stride: int, same: bool) -> tuple[int, int]:
    """(output size, leading pad) as TFLite computes them (ComputePaddingHeightWidth, dilation 1)."""
    if same:
        out = (size + stride - 1) // stride
        total = max((out - 1) * stride + k - size, 0)
        return out, total // 2
    return (size - k) // stride + 1, 0


def api_out(size: int, k: int, stride: int, pad: int) -> int:
    """Output size of a raw API call with leading pad ``pad`` (trailing pad as far as it takes)."""
    return (size + 2 * pad - k) // stride + 1


# --------------------------------------------------------------------------------------------
# cases


class CaseMeta(TypedDict, total=False):
    """What a case's params were made from (sweep.json keeps it; a reproduction and the shrinker use it)."""

    ih: int  # geometry (conv, depthwise, pooling)
    iw: int
    ic: int
    kh: int
    kw: int
    fc: int
    oc: int
    oh: int
    ow: int
    sh: int
    sw: int
    ph: int
    pw: int
    same: bool
    groups: int
    mult_ch: int
    ch: int
    w_scales: list[float]  # requantization: from tensor scales (TFLite-reachable) or drawn raw
    out_scale: float
    mult: list[int]
    shift: list[int]
    in_scale: float
    in_zp: int
    out_zp: int
    act: str
    bias_range: int
    row: int  # fully connected
    per_channel: bool
    size: int  # add, mul
    scales: list[float]
    zps: list[int]
    scale: float  # pooling
    zp: int
    rows: int  # softmax
    depth: int
    model_op: int  # --from-model
    variant: str
    why_api_only: str


class Quant(TypedDict):
    """A model op's own quantization (--from-model): tensor scales and zero points."""

    in_scale: float
    in_zp: int
    out_zp: int
    out_scale: float
    w_scales: list[float]


# a conv / depthwise case's geometry (CaseMeta keys), in the driver's order
GeometryKey = Literal["ih", "iw", "ic", "kh", "kw", "fc", "oc", "mult_ch", "oh", "ow", "sh", "sw", "ph", "pw"]
CONV_PARAMS: tuple[GeometryKey, ...] = tuple(k for k in get_args(GeometryKey) if k != "mult_ch")
DEPTHWISE_PARAMS: tuple[GeometryKey, ...] = tuple(k for k in get_args(GeometryKey) if k not in ("fc", "oc"))
_Quant = Literal["in_off", "out_zp", "amin", "amax", "bias_range"]  # after a conv's or depthwise's geometry
_AddMul = Literal["size", "in1_off", "in2_off", "mult1", "mult2", "shift1", "shift2", "left_shift"]
_Rest = Literal["out_mult", "out_shift", "row", "w_off", "per_channel", "ch", "rows", "depth", "in_mult"]
Param = GeometryKey | _Quant | _AddMul | _Rest | Literal["in_shift", "diff_min"]  # LAYOUT's names
_QUANT: tuple[_Quant, ...] = get_args(_Quant)
_POOL: tuple[Param, ...] = ("ih", "iw", "ch", "oh", "ow", "sh", "sw", "kh", "kw", "ph", "pw", "amin", "amax")
_OUT: tuple[Param, ...] = ("out_zp", "out_mult", "out_shift", "amin", "amax")
# The one definition of a case's params: per op, the names of the ints the driver reads from a case line,
# in order (the driver's indices, sweep_layout.h, are written from it and OPS); a conv, depthwise or
# fully connected case's multipliers, then its shifts, follow them (one per output channel; one for a
# per-tensor fully connected case).
LAYOUT: dict[str, tuple[Param, ...]] = {
    "conv": (*CONV_PARAMS, *_QUANT),
    "depthwise": (*DEPTHWISE_PARAMS, *_QUANT),
    "fully_connected": ("row", "oc", "in_off", "w_off", *_QUANT[1:], "per_channel"),
    "add": ("size", "in1_off", "in2_off", "mult1", "mult2", "shift1", "shift2", "left_shift", *_OUT),
    "mul": ("size", "in1_off", "in2_off", *_OUT),
    "avg_pool": _POOL,
    "max_pool": _POOL,
    "softmax": ("rows", "depth", "in_mult", "in_shift", "diff_min"),
}
# the params that are sizes; per op, the ones it has (the order the shrinker tries them in)
Size = Literal[
    "ih", "iw", "ic", "kh", "kw", "fc", "row", "oc", "mult_ch", "oh", "ow", "ch", "rows", "depth", "size"
]
SIZES: dict[str, tuple[Size, ...]] = {
    op: tuple(k for k in get_args(Size) if k in names) for op, names in LAYOUT.items()
}


def pack(
    op: str, values: Mapping[Param, int], mult: Sequence[int] = (), shift: Sequence[int] = ()
) -> list[int]:
    """A case's params: ``values`` by :data:`LAYOUT` (other keys ignored), then ``mult`` and ``shift``."""
    return [values[k] for k in LAYOUT[op]] + [*mult, *shift]


def repack(case: Case, meta: CaseMeta, channels: int | None = None) -> list[int]:
    """``case``'s params with each one ``meta`` holds (by name) taken from it, the multipliers and shifts
    cut to the first ``channels`` (a shrunk case)."""
    named = case.named()
    named |= {key: int(made) for key in named if isinstance(made := meta.get(key), int)}
    mult, shift = case.requant()
    return pack(case.op, named, mult[:channels], shift[:channels])


@dataclass
class Case:
    """One kernel call; ``params`` in the driver's order for ``op``; ``meta`` what made them."""

    op: str
    seed: int
    lo: int
    hi: int
    params: list[int]
    klass: str
    reachable: bool
    meta: CaseMeta = field(default_factory=CaseMeta)
    id: int = 0

    def line(self) -> str:
        return " ".join(str(x) for x in (self.id, OPS[self.op], self.seed, self.lo, self.hi, *self.params))

    def named(self) -> dict[Param, int]:
        """The params by name (:data:`LAYOUT`), without the multipliers and shifts."""
        return dict(zip(LAYOUT[self.op], self.params, strict=False))

    def size(self) -> int:
        """The sum of its sizes (:data:`SIZES`): how big a finding's example is."""
        named = self.named()
        return sum(named[k] for k in SIZES[self.op])

    def requant(self) -> tuple[list[int], list[int]]:
        """(multipliers, shifts): the params after the named ones (none for the other ops)."""
        tail = self.params[len(LAYOUT[self.op]) :]
        return tail[: len(tail) // 2], tail[len(tail) // 2 :]


def _drawn(
    op: str,
    rng: random.Random,
    params: list[int],
    word: str,
    reachable: bool,
    meta: CaseMeta,
    *,
    lo: int = -128,
    hi: int = 127,
) -> Case:
    """A case whose seed is the last draw from ``rng`` (after everything it is made of); its class is
    :func:`geometry_class` with ``word``."""
    seed = rng.randint(0, 0x0FFFFFFF)
    case = Case(op, seed, lo, hi, params=params, klass="", reachable=reachable, meta=meta)
    case.klass = geometry_class(case, word)
    return case


def bias_range(rng: random.Random) -> int:
    """The bias values' range: +-4096 mostly, one in four up to +-2**16 or +-2**20."""
    return rng.choice((1 << 12, 1 << 12, 1 << 12, 1 << 12, 1 << 12, 1 << 12, 1 << 16, 1 << 20))


def _f32(x: float) -> float:
    return float(np.float32(x))


def _act(rng: random.Random, zp: int, scale: float) -> tuple[str, int, int]:
    kind = rng.choice(("NONE", "NONE", "RELU", "RELU6"))
    if kind == "NONE":
        return kind, -128, 127
    lo = max(-128, zp)
    hi = (
        127 if kind == "RELU" else min(127, zp + math.floor(float(np.float32(6.0) / np.float32(scale)) + 0.5))
    )
    return kind, lo, max(lo, hi)


def ch_bucket(channels: int) -> str:
    """The channel-count bucket of a geometry class."""
    return "c<8" if channels < 8 else "c8-15" if channels < 16 else "c>=16"


def _spatial(rng: random.Random, k: int, stride: int, same: bool, api: bool) -> tuple[int, int, int]:
    """(input size, output size, pad) along one axis, drawn as docs/sweep.md "Geometries" says."""
    lo = 1 if same or api else k
    size = rng.randint(lo, max(lo, 40 if rng.random() < 0.125 else 12))
    if api:
        pad = rng.randint(0, max(1, k - 1))
        size = max(size, k - 2 * pad)
        return size, api_out(size, k, stride, pad), pad
    out, pad = tflite_padding(size, k, stride, same)
    return size, out, pad


def _given(value: T | None, drawn: T) -> T:
    """An override, else the value drawn (drawn either way, so the draws after it do not shift)."""
    return drawn if value is None else value


def _requant(rng: random.Random, in_scale: float, n: int, per_channel: bool, api: bool) -> CaseMeta:
    """Multipliers and shifts: from float32 tensor scales as TFLM computes them (``w_scales`` and
    ``out_scale`` kept), or drawn raw for half of the ``--all`` cases (API-only: :func:`from_scales`)."""
    if api and rng.random() < 0.5:
        return {
            "mult": [rng.randint(1 << 30, (1 << 31) - 1) for _ in range(n)],
            "shift": [rng.randint(-31, 1) for _ in range(n)],
        }
    w = (
        [_f32(rng.uniform(0.001, 0.05))] * n
        if not per_channel
        else [_f32(rng.uniform(0.001, 0.05)) for _ in range(n)]
    )
    # one in eight: an effective scale >= 1, a positive (left) shift; otherwise 1/4000..1/20 (shift <= -4)
    out_scale = _f32(
        in_scale * w[0] * (rng.uniform(0.25, 1.0) if rng.random() < 0.125 else rng.uniform(20, 4000))
    )
    ms = [quantize_multiplier(in_scale * ws / out_scale) for ws in w]
    return {"w_scales": w, "out_scale": out_scale, "mult": [m for m, _ in ms], "shift": [s for _, s in ms]}


def from_scales(meta: CaseMeta) -> bool:
    """Whether a requantization came from tensor scales (so a .tflite can carry it), not drawn raw."""
    return "w_scales" in meta and "out_scale" in meta


def _quant(
    rng: random.Random, quant: Quant | None, n: int, per_channel: bool, api: bool
) -> tuple[float, int, int, CaseMeta]:
    """(input scale, input zero point, output zero point, requantization): random, or a model's own
    ``quant`` (--from-model; its weight scales reused cyclically when a neighbour has more channels)."""
    if quant is None:
        in_scale, in_zp = _f32(rng.uniform(0.005, 0.1)), rng.randint(-128, 127)
        out_zp = rng.randint(-128, 127)
        return in_scale, in_zp, out_zp, _requant(rng, in_scale, n, per_channel, api)
    ws = [_f32(quant["w_scales"][i % len(quant["w_scales"])]) for i in range(n if per_channel else 1)]
    ms = [quantize_multiplier(quant["in_scale"] * w / quant["out_scale"]) for w in ws]
    rq: CaseMeta = {"w_scales": ws, "out_scale": _f32(quant["out_scale"])}
    rq.update({"mult": [m for m, _ in ms], "shift": [t for _, t in ms]})
    return _f32(quant["in_scale"]), int(quant["in_zp"]), int(quant["out_zp"]), rq


def _conv(rng: random.Random, api: bool, grouped: bool) -> CaseMeta:
    k = rng.choice((1, 1, 3, 3, 5, 2, 7))
    kh, kw = (k, k) if rng.random() < 0.8 else (k, rng.choice((1, 3)))
    stride = rng.choice((1, 1, 2)) if not api else rng.randint(1, 4)
    # one in five: a different stride along W (TFLite allows it)
    stride_w = stride if rng.random() < 0.8 else (rng.choice((1, 2)) if not api else rng.randint(1, 4))
    same = rng.random() < 0.6
    ih, oh, ph = _spatial(rng, kh, stride, same, api)
    iw, ow, pw = _spatial(rng, kw, stride_w, same, api)
    fc = rng.choice((1, 2, 3, 4, 8, 15, 16, 17, 24, 32, 33))
    groups = rng.choice((2, 3, 4)) if grouped else 1
    oc = rng.choice((1, 2, 3, 4, 7, 8, 16, 17, 32)) * groups
    return {
        "ih": ih,
        "iw": iw,
        "ic": fc * groups,
        "kh": kh,
        "kw": kw,
        "fc": fc,
        "oc": oc,
        "oh": oh,
        "ow": ow,
        "sh": stride,
        "sw": stride_w,
        "ph": ph,
        "pw": pw,
        "same": same,
        "groups": groups,
    }


def conv_case(
    rng: random.Random,
    api: bool = False,
    grouped: bool = False,
    *,
    quant: Quant | None = None,
    over: CaseMeta | None = None,
) -> Case:
    """A conv case; ``over`` (a model's geometry) replaces the drawn one, ``quant`` its quantization."""
    g: CaseMeta = {**_conv(rng, api, grouped), **(over or {})}
    return _conv_like_case("conv", rng, g, quant, api)


def depthwise_case(
    rng: random.Random, api: bool = False, *, quant: Quant | None = None, over: CaseMeta | None = None
) -> Case:
    g = _conv(rng, api, False)
    g["ic"] = rng.choice((1, 2, 3, 4, 8, 15, 16, 17, 24, 32))
    g["mult_ch"] = rng.choice((1, 1, 1, 2, 3, 4, 5, 8))
    g.update(over or {})
    g["oc"] = g["ic"] * g["mult_ch"]
    return _conv_like_case("depthwise", rng, g, quant, api)


def _conv_like_case(op: str, rng: random.Random, geometry: CaseMeta, quant: Quant | None, api: bool) -> Case:
    """A conv or depthwise case from ``geometry``: quantization, activation and bias drawn (in
    this order) from ``rng``, params = the geometry keys of ``geometry`` (``CONV_PARAMS`` or
    ``DEPTHWISE_PARAMS``) then the quantization."""
    if geometry["oh"] < 1 or geometry["ow"] < 1:  # no output: the input the filter just covers
        geometry.update({"ih": geometry["kh"], "iw": geometry["kw"], "oh": 1, "ow": 1, "ph": 0, "pw": 0})
    in_scale, in_zp, out_zp, rq = _quant(rng, quant, geometry["oc"], per_channel=True, api=api)
    act, amin, amax = _act(rng, out_zp, rq.get("out_scale", 0.05))
    br = bias_range(rng)
    keys = CONV_PARAMS if op == "conv" else DEPTHWISE_PARAMS
    named: dict[Param, int] = {k: geometry[k] for k in keys}
    named |= {"in_off": -in_zp, "out_zp": out_zp, "amin": amin, "amax": amax, "bias_range": br}
    p = pack(op, named, rq["mult"], rq["shift"])
    reach = from_scales(rq) and (not api or _reachable_2d(geometry))
    meta: CaseMeta = {
        **geometry,
        **rq,
        "in_scale": in_scale,
        "in_zp": in_zp,
        "out_zp": out_zp,
        "act": act,
        "bias_range": br,
    }
    return _drawn(op, rng, p, _pad_word(geometry["same"], api), reach, meta)


def _pad_word(same: bool, api: bool) -> str:
    return "pad*" if api else "SAME" if same else "VALID"


def _strides(sh: int, sw: int) -> str:
    return f"s{sh}" if sh == sw else f"s{sh}x{sw}"


def geometry_class(case: Case, word: str = "") -> str:
    """A case's geometry class, from its params; ``word`` is the padding (SAME, VALID or pad*) of a conv,
    depthwise or pooling case, the input range (near-max or spread) of a softmax case."""
    p = case.named()
    if case.op in ("conv", "depthwise", "avg_pool", "max_pool"):
        kernel = f"{p['kh']}x{p['kw']} {_strides(p['sh'], p['sw'])} {word}"
        if case.op == "conv":
            grouped = "grouped " if p["ic"] != p["fc"] else ""  # in channels != filter channels
            return f"{kernel} {grouped}{ch_bucket(p['fc'])}"
        if case.op == "depthwise":
            return f"{kernel} mult{p['mult_ch']} {ch_bucket(p['ic'])}"
        return f"{kernel} {ch_bucket(p['ch'])}"
    if case.op == "softmax":
        return f"depth{'>=512' if p['depth'] >= 512 else '<512'} {word}"
    if case.op == "fully_connected":
        per = "per-channel" if p["per_channel"] else "per-tensor"
        return f"{per} row%4={p['row'] % 4} {ch_bucket(p['row'])}"
    return f"size%4={p['size'] % 4} {'n<16' if p['size'] < 16 else 'n>=16'}"


def _reachable_2d(meta: CaseMeta) -> bool:
    for same in (True, False):
        oh, ph = tflite_padding(meta["ih"], meta["kh"], meta["sh"], same)
        ow, pw = tflite_padding(meta["iw"], meta["kw"], meta["sw"], same)
        if (oh, ph, ow, pw) == (meta["oh"], meta["ph"], meta["ow"], meta["pw"]) and oh > 0 and ow > 0:
            meta["same"] = same
            return True
    return False


def fc_case(
    rng: random.Random,
    api: bool = False,
    *,
    row: int | None = None,
    oc: int | None = None,
    per_channel: bool | None = None,
    quant: Quant | None = None,
) -> Case:
    row = _given(row, rng.choice((1, 3, 4, 7, 8, 15, 16, 17, 31, 64, 100, 257)))
    oc = _given(oc, rng.choice((1, 2, 3, 8, 10, 16, 17)))
    per_ch = _given(per_channel, rng.random() < 0.5)
    in_scale, in_zp, out_zp, rq = _quant(rng, quant, oc if per_ch else 1, per_channel=per_ch, api=api)
    act, amin, amax = _act(rng, out_zp, rq.get("out_scale", 0.05))
    w_off = rng.randint(-127, 127) if api else 0  # TFLM: int8 weights are symmetric (zero point 0)
    br = bias_range(rng)
    named: dict[Param, int] = {"row": row, "oc": oc, "in_off": -in_zp, "w_off": w_off, "out_zp": out_zp}
    named |= {"amin": amin, "amax": amax, "bias_range": br, "per_channel": int(per_ch)}
    p = pack("fully_connected", named, rq["mult"], rq["shift"])
    meta: CaseMeta = {
        "row": row,
        "oc": oc,
        "per_channel": per_ch,
        **rq,
        "in_scale": in_scale,
        "in_zp": in_zp,
        "out_zp": out_zp,
        "act": act,
        "bias_range": br,
    }
    reach = from_scales(rq) and (not api or w_off == 0)
    return _drawn("fully_connected", rng, p, "", reach, meta)


def add_mul_case(rng: random.Random, op: str, api: bool = False, *, size: int | None = None) -> Case:
    n = _given(size, rng.choice((1, 3, 4, 7, 8, 16, 17, 33, 100, 1000)))
    s1, s2, so = (_f32(rng.uniform(0.005, 0.2)) for _ in range(3))
    z1, z2, zo = (rng.randint(-128, 127) for _ in range(3))
    act, amin, amax = _act(rng, zo, so)
    meta: CaseMeta = {"size": n, "scales": [s1, s2, so], "zps": [z1, z2, zo], "act": act}
    named: dict[Param, int] = {"size": n, "in1_off": -z1, "in2_off": -z2, "out_zp": zo}
    if op == "add":
        twice = 2 * max(s1, s2)
        (m1, sh1), (m2, sh2) = quantize_multiplier(s1 / twice), quantize_multiplier(s2 / twice)
        named |= {"mult1": m1, "mult2": m2, "shift1": sh1, "shift2": sh2, "left_shift": 20}
        mo, sho = quantize_multiplier(twice / ((1 << 20) * so))
    else:
        mo, sho = quantize_multiplier(s1 * s2 / so)
    named |= {"out_mult": mo, "out_shift": sho, "amin": amin, "amax": amax}
    return _drawn(op, rng, pack(op, named), "", True, meta)


class PoolShape(NamedTuple):
    """A model's own pooling geometry (--from-model): square filter and stride, as esp-nn takes them."""

    k: int
    stride: int
    same: bool
    ih: int
    iw: int
    ch: int


def pool_case(rng: random.Random, op: str, api: bool = False, *, shape: PoolShape | None = None) -> Case:
    k = rng.choice((2, 2, 3, 5))
    stride = rng.choice((1, 2, 2)) if not api else rng.randint(1, 3)
    # one in five: a different stride along W (TFLite allows it)
    stride_w = stride if rng.random() < 0.8 else (rng.choice((1, 2)) if not api else rng.randint(1, 3))
    same = rng.random() < 0.5
    ih, oh, ph = _spatial(rng, k, stride, same, api)
    iw, ow, pw = _spatial(rng, k, stride_w, same, api)
    ch = rng.choice((1, 3, 4, 8, 16, 17, 32))
    if shape is not None:  # drawn all the same, so the draws after it do not shift
        k, stride, same, ih, iw, ch = shape
        stride_w = stride
        oh, ph = tflite_padding(ih, k, stride, same)
        ow, pw = tflite_padding(iw, k, stride, same)
    if oh < 1 or ow < 1:
        ih, iw, oh, ow, ph, pw = k, k, 1, 1, 0, 0
    zp = rng.randint(-128, 127)
    act, amin, amax = _act(rng, zp, 0.05)
    g: CaseMeta = {
        "ih": ih,
        "iw": iw,
        "oh": oh,
        "ow": ow,
        "kh": k,
        "kw": k,
        "sh": stride,
        "sw": stride_w,
        "ph": ph,
        "pw": pw,
        "same": same,
        "ch": ch,
    }
    named: dict[Param, int] = {"ih": ih, "iw": iw, "ch": ch, "oh": oh, "ow": ow, "sh": stride, "sw": stride_w}
    named |= {"kh": k, "kw": k, "ph": ph, "pw": pw, "amin": amin, "amax": amax}
    reach = not api or _reachable_2d(g)
    meta: CaseMeta = {**g, "scale": 0.05, "zp": zp, "act": act}
    return _drawn(op, rng, pack(op, named), _pad_word(same, api), reach, meta)


def softmax_case(
    rng: random.Random,
    api: bool = False,
    *,
    depth: int | None = None,
    rows: int | None = None,
    scale: float | None = None,
    near_max: bool | None = None,
    spread: int | None = None,
) -> Case:
    depth = _given(depth, rng.choice((1, 2, 10, 100, 255, 256, 511, 512, 513, 1000, 1024, 2000)))
    rows = _given(rows, rng.choice((1, 1, 2, 3)))
    scale = _given(
        scale, _f32(rng.choice((1 / 16, 0.05, 0.1, 0.25, 1.0)) if not api else rng.uniform(1e-3, 2))
    )
    mult, shift, diff_min = softmax_params(scale)
    near = _given(near_max, rng.random() < 0.5)
    hi = 127 if near else rng.randint(0, 127)
    lo = hi - _given(spread, rng.choice((0, 1, 2))) if near else -128
    meta: CaseMeta = {
        "rows": rows,
        "depth": depth,
        "in_scale": scale,
        "in_zp": rng.randint(-128, 127) if api else 0,
    }
    params = pack(
        "softmax", {"rows": rows, "depth": depth, "in_mult": mult, "in_shift": shift, "diff_min": diff_min}
    )
    word = "near-max" if near else "spread"
    return _drawn("softmax", rng, params, word, True, meta, lo=max(-128, lo), hi=hi)


def generate(ops: Sequence[str], per_op: int, seed: int = 0, api: bool = False) -> Iterator[Case]:
    """``per_op`` cases of every op in ``ops`` (ids from 1), reproducible from ``seed``."""
    next_id = 1
    for op in ops:
        rng = random.Random(f"{seed}:{op}:{api}")
        for k in range(per_op):
            if op == "conv":
                case = conv_case(rng, api, grouped=k % 4 == 3)
            elif op == "depthwise":
                case = depthwise_case(rng, api)
            elif op == "fully_connected":
                case = fc_case(rng, api)
            elif op in ("add", "mul"):
                case = add_mul_case(rng, op, api)
            elif op in ("avg_pool", "max_pool"):
                case = pool_case(rng, op, api)
            elif op == "softmax":
                case = softmax_case(rng, api)
            else:
                raise ValueError(f"unknown op {op!r}")
            case.id = next_id
            next_id += 1
            yield case
