"""Tensor-arena estimate for the firmware's ``tensor_arena``.

Measured: the host TFLM interpreter (``tflite-micro`` wheel) runs the model once with its
recording allocator and reports the bytes it used (``Arena allocation total``). That runs in the
host-reference *child process* (:mod:`harness.model.hostrun`, shared with the reference run and
cached on disk), because the wheel can crash (segfault) instead of raising; the child then re-runs
the model in an arena of exactly the reported size to confirm it. A crash is a ModelError (exit 2).

Target figure (what the firmware should reserve) = host total + ESP-NN scratch + margin:

- 32-bit target: TFLM's persistent structures hold pointers, so the 64-bit host figure is an
  upper bound for them; planned tensor memory is the same. No extra term.
- ESP-NN scratch buffers are not allocated by the host's reference kernels. They live only while
  their op runs, so the largest one is added, by the pinned esp-nn version's formulas
  (``FORMULA_SETS``; docs/firmware.md "What the firmware does", item 4).
- Safety margin: ``MARGIN_FRACTION`` of the host total plus ``MARGIN_FIXED`` bytes, rounded up to 1 KiB.

The device's own ``arena_used_bytes()`` report is the authoritative figure.

Without the wheel (macOS, Windows, ARM), a clearly-labelled *rough* estimate from tensor
lifetimes is returned so ``inspect`` and ``generate`` still work.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HostReferenceError, ReferenceRefusedError
from harness.model import opdata
from harness.model.backends import tflm_installed
from harness.model.hostrun import ArenaMeasurement, host_results
from harness.model.loader import ModelInfo, OpInfo, read_model
from harness.resources import pinned_versions, version_tuple

MARGIN_FRACTION = 0.05
MARGIN_FIXED = 1024
_ALIGN = 16


@dataclass(frozen=True)
class ArenaEstimate:
    """Arena sizes for one model; ``method`` says how ``host_bytes`` was obtained."""

    host_bytes: int  # measured on the 64-bit host with TFLM reference kernels (or rough)
    target_bytes: int  # recommended tensor_arena size on the device
    method: str  # "measured" (TFLM recording allocator, subprocess) or "rough" (no TFLM)
    espnn_scratch_bytes: int  # largest ESP-NN scratch buffer added for the chip(s)
    margin_bytes: int  # safety margin added on top
    chip: str | None  # chip the scratch term was computed for; None = worst case over families
    head_bytes: int | None = None  # non-persistent (planned) part, when measured
    tail_bytes: int | None = None  # persistent part, when measured
    verified: bool = False  # the child re-ran the model in an arena of exactly host_bytes
    backend_version: str = ""
    note: str = ""
    espnn_version: str = ""  # esp-nn version the scratch term is for
    espnn_formulas: str = ""  # which esp-nn version's scratch formulas were used, and why


def _ceil(n: int, k: int) -> int:
    return (n + k - 1) // k * k


def _nhwc(shape: tuple[int, ...]) -> tuple[int, int, int]:
    s = (1,) * max(0, 4 - len(shape)) + shape
    return s[-3], s[-2], s[-1]


def _same_pad(size: int, out: int, stride: int, filt: int, dilation: int, padding: object) -> int:
    """TFLM's padding on the leading side (ComputePaddingHeightWidth)."""
    if padding != "SAME":
        return 0
    eff = (filt - 1) * dilation + 1
    return max(0, (out - 1) * stride + eff - size) // 2


@dataclass(frozen=True)
class ConvGeometry:
    """What esp-tflite-micro passes to esp-nn's scratch getters for one conv / depthwise conv."""

    h: int  # input height, width, channels
    w: int
    c: int
    fh: int  # filter height, width
    fw: int
    oh: int  # output height, width, channels
    ow: int
    oc: int
    ph: int  # TFLM's padding on the leading side (op_data.padding)
    pw: int
    sh: int  # strides
    sw: int
    mult: int = 1  # depthwise channel multiplier


# Each formula below restates, in Python, the arithmetic of one esp-nn scratch getter (C int semantics,
# including its unclamped differences). Which one applies depends on the esp-nn version: ops.toml
# [[espnn_scratch]] and FORMULA_SETS.


def _pointwise(conv: ConvGeometry) -> bool:
    """A 1x1 filter, no padding, stride 1: the getters' first case."""
    return conv.fh == 1 and conv.fw == 1 and conv.ph == 0 and conv.pw == 0 and conv.sh == 1 and conv.sw == 1


def _padded_input(conv: ConvGeometry) -> int:
    """The S3 conv getters' copy of the input with its padding (none without padding)."""
    return 0 if conv.ph == 0 and conv.pw == 0 else (conv.w + 2 * conv.pw) * (conv.h + 2 * conv.ph) * conv.c


def _conv_1x1(conv: ConvGeometry, align: int) -> int:
    """The S3 (and P4) conv getters' scratch for a pointwise conv (:func:`_pointwise`)."""
    c8 = _ceil(conv.c, 8)
    transpose = 0 if conv.w * conv.h < 8 else 2 * 8 * c8
    input_scratch = conv.w * conv.h * c8 if conv.c % 8 else 0
    return input_scratch + c8 * conv.oc + transpose + align


def _conv_s3_until_1_2_0(conv: ConvGeometry) -> int:
    """esp_nn_get_conv_scratch_size_esp32s3 of esp-nn 1.0.0 ... 1.2.0 (also the P4 getter to 1.2.2)."""
    align = 32
    if _pointwise(conv):
        return _conv_1x1(conv, align)
    return _padded_input(conv) + conv.fw * conv.fh * _ceil(conv.c, 16) * conv.oc + align + conv.oc * 4


def _conv_s3_im2col(conv: ConvGeometry, align: int) -> int:
    """esp_nn_get_conv_scratch_size_esp32s3 from esp-nn 1.2.1 (align 32) and 1.2.3 (align 64)."""
    if _pointwise(conv):
        return _conv_1x1(conv, align)
    row, window = conv.fw * conv.c, conv.fw * conv.fh * conv.c
    if row < 16 <= window:  # im2col path
        wa = _ceil(window, 16)
        return conv.oc * 4 + 16 + conv.oc * wa + 16 + wa + align
    filter_scratch = conv.fw * conv.fh * _ceil(conv.c, 16) * conv.oc
    filter_align = _ceil(row, 16) * conv.fh * conv.oc
    pad_r = max(0, conv.ow * conv.sw + conv.fw - 1 - conv.w)
    pad_b = max(0, conv.oh * conv.sh + conv.fh - 1 - conv.h)
    boundary = (conv.w + pad_r) * (conv.h + pad_b) * conv.c if pad_r or pad_b else 0
    return _padded_input(conv) + filter_scratch + filter_align + boundary + align + conv.oc * 4


def _dw_3x3_pad(conv: ConvGeometry) -> tuple[int, int]:
    """The S3 3x3 depthwise getters' padding of width and height (may be negative: C does not clamp)."""
    if conv.pw or conv.ph:
        return 2 * conv.pw, 2 * conv.ph
    return conv.ow * conv.sw + conv.fw - 1 - conv.w, conv.oh * conv.sh + conv.fh - 1 - conv.h


def _dw_s3_until_1_2_0(conv: ConvGeometry, tail: int) -> int:
    """esp_nn_get_depthwise_conv_scratch_size_esp32s3 of esp-nn 1.0.0 ... 1.2.0 (s16 tail 16, then 32)."""
    filter_size = conv.fw * conv.fh * conv.c * conv.mult
    if conv.mult == 1 and conv.c % 8 == 0 and conv.fw == 3 and conv.fh == 3:
        if conv.c % 16 == 0:
            tw, th = _dw_3x3_pad(conv)
            if tw or th:
                return filter_size + (conv.w + tw) * (conv.h + th) * conv.c + 16
            return filter_size + 16
        return 2 * (filter_size + conv.w * conv.h * conv.c) + tail
    if conv.mult % 4 == 0:
        return 2 * (filter_size + conv.w * conv.h * conv.c) + tail
    return 32


def _dw_s3_tiled(conv: ConvGeometry) -> int:
    """esp_nn_get_depthwise_conv_scratch_size_esp32s3 from esp-nn 1.2.1 (unchanged in 1.2.3)."""
    filter_size = conv.fw * conv.fh * conv.c * conv.mult
    if conv.mult == 1 and conv.c % 8 == 0:
        if conv.fw == 3 and conv.fh == 3:
            if conv.c % 16 == 0:
                tw, th = _dw_3x3_pad(conv)
                if tw or th:
                    full = (conv.w + tw) * (conv.h + th) * conv.c
                    return (
                        filter_size + (full if full <= 40 * 1024 else (conv.w + tw) * conv.fh * conv.c) + 16
                    )
                return filter_size + 16
            if conv.c >= 12:
                c16 = _ceil(conv.c, 16)
                tw = 2 * conv.pw + max(0, conv.ow * conv.sw + 2 - conv.w)
                th = 2 * conv.ph + max(0, conv.oh * conv.sh + 2 - conv.h)
                return 9 * c16 + (conv.w + tw) * (conv.h + th) * c16 + conv.ow * conv.oh * c16 + 64
            return 2 * (filter_size + conv.w * conv.h * conv.c) + 32
        total = 2 * (filter_size + conv.w * conv.h * conv.c)
        return total + 32 if total <= 48 * 1024 else 2 * filter_size + 2 * conv.w * conv.fh * conv.c + 32
    if conv.mult == 1 and conv.c > 3:
        c8 = _ceil(conv.c, 8)
        inp = _ceil(2 * conv.fw * conv.fh * c8, 16)
        out = _ceil(inp + 2 * conv.w * conv.h * c8, 16)
        bias = _ceil(out + conv.ow * conv.oh * c8, 16)
        return bias + 12 * c8 + 16
    if conv.mult % 4 == 0:
        return 2 * (filter_size + conv.w * conv.h * conv.c) + 32
    return 32


_P4_L1D_BUDGET = 32768


def _conv_p4_1_2_3(conv: ConvGeometry) -> int:
    """esp_nn_get_conv_scratch_size_esp32p4 of esp-nn 1.2.3."""
    align, acc = 32, conv.oc * 4
    if _pointwise(conv):
        return acc + 16 * conv.oc + 32 + align if conv.c < 16 else _conv_1x1(conv, align)
    if conv.ph == 0 and conv.pw == 0 and conv.fw * conv.c >= 16:
        return conv.fw * conv.fh * _ceil(conv.c, 16) * conv.oc + align + acc
    if conv.fw * conv.fh * conv.c >= 16:
        return acc + conv.fw * conv.fh * conv.c + align
    eff = _ceil(-(-16 // conv.fw), 16)
    if conv.ph == 0 and conv.pw == 0:
        return acc + conv.fw * conv.fh * eff * conv.oc + conv.w * conv.h * eff + align
    padded_w = conv.w + 2 * conv.pw
    full = padded_w * (conv.h + 2 * conv.ph) * conv.c
    if full + acc <= _P4_L1D_BUDGET:
        return full + conv.fw * conv.fh * _ceil(conv.c, 16) * conv.oc + align + acc
    eff_c, filt = (eff, conv.fw * conv.fh * eff * conv.oc) if conv.fw * conv.c < 16 else (conv.c, 0)
    row = padded_w * eff_c
    budget = _P4_L1D_BUDGET - acc - filt
    tile = 1
    if budget > 0 and conv.fh * row <= budget:
        tile = min((budget - conv.fh * row) // (conv.sh * row) + 1, conv.oh)
    return ((tile - 1) * conv.sh + conv.fh + 2 * conv.ph) * row + filt + align + acc


def _none(conv: ConvGeometry) -> int:
    """esp-nn's generic optimized C (and the P4 depthwise) getters: no scratch."""
    del conv
    return 0


ScratchFn = Callable[[ConvGeometry], int]
# formula set -> the getters of (esp32s3 CONV_2D, esp32s3 DEPTHWISE_CONV_2D, esp32p4 CONV_2D); the P4
# depthwise getter requests none in every set
_GETTERS: dict[str, tuple[ScratchFn, ScratchFn, ScratchFn]] = {
    "1.1": (_conv_s3_until_1_2_0, lambda g: _dw_s3_until_1_2_0(g, 16), _conv_s3_until_1_2_0),
    "1.2.0": (_conv_s3_until_1_2_0, lambda g: _dw_s3_until_1_2_0(g, 32), _conv_s3_until_1_2_0),
    "1.2.1": (lambda g: _conv_s3_im2col(g, 32), _dw_s3_tiled, _conv_s3_until_1_2_0),
    "1.2.3": (lambda g: _conv_s3_im2col(g, 64), _dw_s3_tiled, _conv_p4_1_2_3),
}
# formula set -> (family, op) -> getter; families as opdata.chip_family names them
FORMULA_SETS: dict[str, dict[tuple[str, str], ScratchFn]] = {
    name: {
        ("esp32s3", "CONV_2D"): s3_conv,
        ("esp32s3", "DEPTHWISE_CONV_2D"): s3_depthwise,
        ("esp32p4", "CONV_2D"): p4_conv,
        ("esp32p4", "DEPTHWISE_CONV_2D"): _none,
    }
    for name, (s3_conv, s3_depthwise, p4_conv) in _GETTERS.items()
}

_ESPNN_VERSION = re.compile(r"([0-9]{1,4})\.([0-9]{1,4})\.([0-9]{1,4})(?:~[0-9]{1,4})?")


@dataclass(frozen=True)
class ScratchFormulas:
    """Which esp-nn scratch formula set(s) an estimate used, and why (shown by ``inspect``)."""

    espnn_version: str
    sets: tuple[str, ...]  # one set when the version is known; every set (their maximum) otherwise
    note: str


def espnn_formulas(espnn_version: str | None = None) -> ScratchFormulas:
    """The scratch formula set for an esp-nn version (default: the pinned one, harness/data/versions.toml).

    A version no row of ops.toml ``[[espnn_scratch]]`` covers (newer, older, a pre-release or git
    reference) gets every known set, and the estimate takes the largest request per op.
    """
    version = espnn_version if espnn_version is not None else pinned_versions()["espnn"]
    rows = opdata.espnn_scratch_table()
    m = _ESPNN_VERSION.fullmatch(version)
    if m is not None:
        v = tuple(int(x) for x in m.groups())
        for row in rows:
            if version_tuple(row["min"]) <= v < version_tuple(row["below"]):
                return ScratchFormulas(
                    version,
                    (row["set"],),
                    f"esp-nn {version}: scratch formulas of set {row['set']} ({row['source']})",
                )
    sets = tuple(row["set"] for row in rows)
    return ScratchFormulas(
        version,
        sets,
        f"esp-nn {version} is not a version esp-check has the scratch formulas of: the largest of the "
        f"{', '.join(sets)} formulas per op",
    )


def conv_geometry(op: OpInfo, info: ModelInfo) -> ConvGeometry:
    """The dimensions esp-tflite-micro hands esp-nn's getters for a CONV_2D / DEPTHWISE_CONV_2D op."""
    t = info.tensors
    h, w, c = _nhwc(t[op.inputs[0]].shape)
    oh, ow, oc = _nhwc(t[op.outputs[0]].shape)
    fshape = t[op.inputs[1]].shape
    fh, fw = (fshape[1], fshape[2]) if len(fshape) == 4 else (1, 1)
    o = op.options
    sh, sw = int(str(o.get("stride_h", 1))), int(str(o.get("stride_w", 1)))
    ph = _same_pad(h, oh, sh, fh, int(str(o.get("dilation_h_factor", 1))), o.get("padding"))
    pw = _same_pad(w, ow, sw, fw, int(str(o.get("dilation_w_factor", 1))), o.get("padding"))
    mult = 1
    if op.opcode == "DEPTHWISE_CONV_2D":
        mult = int(str(o.get("depth_multiplier", 1))) or max(1, oc // max(1, c))
    return ConvGeometry(h, w, c, fh=fh, fw=fw, oh=oh, ow=ow, oc=oc, ph=ph, pw=pw, sh=sh, sw=sw, mult=mult)


def _op_scratch(op: OpInfo, info: ModelInfo, family: str, sets: Sequence[str]) -> int:
    """ESP-NN scratch bytes one op requests in Prepare on a chip family (largest over ``sets``).

    esp-tflite-micro asks for it for every int8 CONV_2D / DEPTHWISE_CONV_2D (also those its Eval then
    runs on the reference kernel, e.g. dilated ones) and every int8 SOFTMAX: 4 bytes times
    ``input->dims->data[1]``, in every esp-nn version. The generic optimized C getters request none.
    """
    t = info.tensors
    if not op.inputs or op.inputs[0] < 0 or t[op.inputs[0]].dtype != "int8":
        return 0
    if op.opcode == "SOFTMAX":
        shape = t[op.inputs[0]].shape
        out = t[op.outputs[0]] if op.outputs and op.outputs[0] >= 0 else None
        if out is None or out.dtype != "int8":
            return 0
        return 4 * (shape[1] if len(shape) >= 2 else shape[0] if shape else 1)
    if op.opcode not in ("CONV_2D", "DEPTHWISE_CONV_2D") or family == "generic":
        return 0
    g = conv_geometry(op, info)
    return max(FORMULA_SETS[s][(family, op.opcode)](g) for s in sets)


def espnn_scratch_bound(info: ModelInfo, chip: str | None = None, espnn_version: str | None = None) -> int:
    """Largest ESP-NN scratch buffer any op of ``info`` requests on ``chip`` (None: any chip) with the
    given esp-nn version (None: the pinned one)."""
    sets = espnn_formulas(espnn_version).sets
    families = [opdata.chip_family(c) for c in ([chip] if chip else opdata.FAMILY_CHIPS)]
    return max((_op_scratch(op, info, f, sets) for f in families for op in info.main_ops), default=0)


def rough_host_bytes(info: ModelInfo) -> int:
    """Peak bytes of simultaneously live activation tensors + persistent overhead (no TFLM needed).

    Liveness: from the producing op (or start, for model inputs) to the last consuming op (or end,
    for model outputs). Persistent overhead per tensor/op/per-channel quantization is approximated
    with 64-bit sizes. Typically within +/-25% of TFLM's own figure; label it as rough.
    """
    ops = info.main_ops
    n = len(ops)
    first: dict[int, int] = {t.index: -1 for t in info.inputs}
    last: dict[int, int] = {t.index: n for t in info.outputs}
    for k, op in enumerate(ops):
        for t in op.outputs:
            if t >= 0 and not info.tensors[t].is_constant:
                first.setdefault(t, k)
        for t in op.inputs:
            if t >= 0 and not info.tensors[t].is_constant:
                last[t] = max(last.get(t, k), k)
    peak = 0
    for k in range(-1, n + 1):
        live = sum(
            _ceil(info.tensors[t].nbytes, _ALIGN) for t, f in first.items() if f <= k <= last.get(t, f)
        )
        peak = max(peak, live)
    per_channel = sum(
        2 * 4 * len(info.tensors[op.inputs[1]].scales)
        for op in ops
        if len(op.inputs) > 1 and op.inputs[1] >= 0
    )
    persistent = 24 * len(info.tensors) + 64 * n + per_channel + 256 * len(info.inputs + info.outputs)
    return peak + persistent


# ---------------------------------------------------------------------------------------------
# measurement (in the host-reference child process, harness.model.hostrun)


def estimate_arena(
    model_path: Path, chip: str | None = None, espnn_version: str | None = None
) -> ArenaEstimate:
    """Arena estimate for ``model_path`` (see module docstring).

    ``chip`` selects the ESP-NN scratch term (None: the worst case over esp32/esp32s3/esp32p4) and
    ``espnn_version`` the esp-nn release whose scratch formulas apply (None: the pinned one). Raises
    ModelError when the model crashes TFLM (the device would too).
    """
    data, info = read_model(model_path)  # validates before any native code sees the file
    formulas = espnn_formulas(espnn_version)
    scratch = espnn_scratch_bound(info, chip, formulas.espnn_version)
    failure = ""
    measured: ArenaMeasurement | None = None
    if tflm_installed():  # its metadata: a cached measurement imports no runtime
        try:
            measured = host_results(data, info, [], reference=False, arena=True).arena
            if measured is None:
                raise HostReferenceError("the tflite-micro wheel is not installed: no arena measurement")
        except HostReferenceError as exc:  # a crash (ModelError) is not caught: the model is refused
            failure = f"TFLM measurement failed ({exc.message}); "
        except ReferenceRefusedError:  # a kernel check aborts on zeros; the model loads: estimate
            failure = "TFLM's reference kernels refuse all-zero inputs, so the arena was not measured; "
    if measured is not None:
        confirmed = "confirmed by a run at exactly" if measured.verified else "NOT confirmed at"
        note = (
            f"host TFLM recording allocator (64-bit, reference kernels), {confirmed} that size; target adds "
            f"the largest ESP-NN scratch ({scratch} B) and {MARGIN_FRACTION:.0%} + {MARGIN_FIXED} B margin; "
            "the device's arena_used_bytes() is authoritative"
        )
    else:
        note = (
            failure
            + "ROUGH estimate from tensor lifetimes"
            + ("" if failure else " (tflite-micro not installed here, Linux x86-64 only)")
            + "; expect +/-25%; the device's arena_used_bytes() is authoritative"
        )
    m = measured or ArenaMeasurement(rough_host_bytes(info), None, None, False, "")  # rough: no details
    margin = int(m.total * MARGIN_FRACTION) + MARGIN_FIXED
    return ArenaEstimate(
        host_bytes=m.total,
        target_bytes=_ceil(m.total + scratch + margin, 1024),
        method="rough" if measured is None else "measured",
        espnn_scratch_bytes=scratch,
        margin_bytes=margin,
        chip=chip,
        head_bytes=m.head,
        tail_bytes=m.tail,
        verified=m.verified,
        backend_version=m.backend_version,
        espnn_version=formulas.espnn_version,
        espnn_formulas=formulas.note,
        note=note,
    )
