"""Tensor-arena estimate for the firmware's ``tensor_arena``.

Measured: the host TFLM interpreter (``tflite-micro`` wheel) runs the model once with its
recording allocator and reports the bytes it used (``Arena allocation total``). That runs in the
host-reference *child process* (:mod:`harness.model.hostrun`, shared with the reference run and
cached on disk), because the wheel can crash (segfault) instead of raising; the child then re-runs
the model in an arena of exactly the reported size to confirm it. A crash is a ModelError (exit 2).

Target figure (what the firmware should reserve) = host total + ESP-NN scratch + margin:

- 32-bit target: TFLM's persistent structures hold pointers, so the 64-bit host figure is an
  upper bound for them; planned tensor memory is the same. No extra term.
- ESP-NN scratch buffers (requested in Prepare by the optimized conv/depthwise/softmax kernels)
  are not allocated by the host's reference kernels. They live only while their op runs, so the
  largest one is added (sizes from esp-nn's own scratch-size arithmetic, see ``_op_scratch``).
- Safety margin: ``MARGIN_FRACTION`` of the host total plus ``MARGIN_FIXED`` bytes, rounded up to 1 KiB.

The device's own ``arena_used_bytes()`` report is the authoritative figure.

Without the wheel (macOS, Windows, ARM), a clearly-labelled *rough* estimate from tensor
lifetimes is returned so ``inspect`` and ``generate`` still work.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.errors import HostReferenceError
from harness.model import opdata
from harness.model.backends import tflm_available
from harness.model.hostrun import ArenaMeasurement, host_results
from harness.model.loader import ModelInfo, OpInfo, load_model, parse_model_bytes

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

    def to_dict(self) -> dict[str, object]:
        return {
            "host_bytes": self.host_bytes,
            "target_bytes": self.target_bytes,
            "method": self.method,
            "espnn_scratch_bytes": self.espnn_scratch_bytes,
            "margin_bytes": self.margin_bytes,
            "chip": self.chip,
            "head_bytes": self.head_bytes,
            "tail_bytes": self.tail_bytes,
            "verified": self.verified,
            "backend_version": self.backend_version,
            "note": self.note,
        }


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


def _s3_conv_scratch(
    h: int, w: int, c: int, fh: int, fw: int, oh: int, ow: int, oc: int, ph: int, pw: int, sh: int, sw: int
) -> int:
    """Scratch esp-nn's ESP32-S3 int8 conv requests (arithmetic of esp-nn @ d45b843)."""
    align = 64
    if fh == 1 and fw == 1 and ph == 0 and pw == 0 and sh == 1 and sw == 1:
        c8 = _ceil(c, 8)
        transpose = 0 if w * h < 8 else 2 * 8 * c8
        input_scratch = w * h * c8 if c % 8 else 0
        return input_scratch + c8 * oc + transpose + align
    row, window = fw * c, fw * fh * c
    if row < 16 <= window:  # im2col path
        wa = _ceil(window, 16)
        return oc * 4 + 16 + oc * wa + 16 + wa + align
    input_scratch = 0 if ph == 0 and pw == 0 else (w + 2 * pw) * (h + 2 * ph) * c
    filter_scratch = fw * fh * _ceil(c, 16) * oc
    filter_align = _ceil(row, 16) * fh * oc
    pad_r = max(0, ow * sw + fw - 1 - w)
    pad_b = max(0, oh * sh + fh - 1 - h)
    boundary = (w + pad_r) * (h + pad_b) * c if pad_r or pad_b else 0
    return input_scratch + filter_scratch + filter_align + boundary + align + oc * 4


def _s3_dw_scratch(
    h: int, w: int, c: int, fh: int, fw: int, mult: int, oh: int, ow: int, ph: int, pw: int, sh: int, sw: int
) -> int:
    """Scratch esp-nn's ESP32-S3 int8 depthwise conv requests (arithmetic of esp-nn @ d45b843)."""
    filter_size = fw * fh * c * mult
    if mult == 1 and c % 8 == 0:
        if fw == 3 and fh == 3:
            if c % 16 == 0:
                if pw or ph:
                    tw, th = 2 * pw, 2 * ph
                else:
                    tw, th = ow * sw + fw - 1 - w, oh * sh + fh - 1 - h
                if tw or th:
                    full = (w + tw) * (h + th) * c
                    return filter_size + (full if full <= 40 * 1024 else (w + tw) * fh * c) + 16
                return filter_size + 16
            if c >= 12:
                c16 = _ceil(c, 16)
                tw = 2 * pw + max(0, ow * sw + 2 - w)
                th = 2 * ph + max(0, oh * sh + 2 - h)
                return 9 * c16 + (w + tw) * (h + th) * c16 + ow * oh * c16 + 64
            return 2 * (filter_size + w * h * c) + 32
        total = 2 * (filter_size + w * h * c)
        return total + 32 if total <= 48 * 1024 else 2 * filter_size + 2 * w * fh * c + 32
    if mult == 1 and c > 3:
        c8 = _ceil(c, 8)
        inp = _ceil(2 * fw * fh * c8, 16)
        out = _ceil(inp + 2 * w * h * c8, 16)
        bias = _ceil(out + ow * oh * c8, 16)
        return bias + 12 * c8 + 16
    if mult % 4 == 0:
        return 2 * (filter_size + w * h * c) + 32
    return 32


def _op_scratch(op: OpInfo, info: ModelInfo, family: str) -> int:
    """ESP-NN scratch bytes one accelerated op requests in Prepare on a chip family.

    ESP32-S3 sizes follow esp-nn's own ``esp_nn_get_*_scratch_size_esp32s3`` arithmetic; ESP32-P4's
    functions request no more than that for these shapes, so the S3 figure is used as its bound;
    the generic optimized C conv/depthwise kernels request none. Softmax needs 4 bytes per class.
    """
    t = info.tensors
    if op.opcode == "SOFTMAX":
        return 4 * _nhwc(t[op.inputs[0]].shape)[2]
    if op.opcode not in ("CONV_2D", "DEPTHWISE_CONV_2D") or family == "generic":
        return 0
    h, w, c = _nhwc(t[op.inputs[0]].shape)
    oh, ow, oc = _nhwc(t[op.outputs[0]].shape)
    fshape = t[op.inputs[1]].shape
    fh, fw = (fshape[1], fshape[2]) if len(fshape) == 4 else (1, 1)
    o = op.options
    sh, sw = int(str(o.get("stride_h", 1))), int(str(o.get("stride_w", 1)))
    ph = _same_pad(h, oh, sh, fh, int(str(o.get("dilation_h_factor", 1))), o.get("padding"))
    pw = _same_pad(w, ow, sw, fw, int(str(o.get("dilation_w_factor", 1))), o.get("padding"))
    if op.opcode == "CONV_2D":
        return _s3_conv_scratch(h, w, c, fh, fw, oh, ow, oc, ph, pw, sh, sw)
    mult = int(str(o.get("depth_multiplier", 1))) or max(1, oc // max(1, c))
    return _s3_dw_scratch(h, w, c, fh, fw, mult, oh, ow, ph, pw, sh, sw)


def espnn_scratch_bound(info: ModelInfo, chip: str | None = None) -> int:
    """Largest ESP-NN scratch buffer any op of ``info`` may request on ``chip`` (None: any chip)."""
    chips = [chip] if chip else list(opdata.FAMILY_CHIPS)
    best = 0
    for c in chips:
        family = opdata.chip_family(c)
        accel = {a.index for a in opdata.espnn_model_acceleration(info, c) if a.accelerated}
        for op in info.main_ops:
            if op.index in accel:
                best = max(best, _op_scratch(op, info, family))
    return best


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


def _target(host: int, scratch: int) -> tuple[int, int]:
    margin = int(host * MARGIN_FRACTION) + MARGIN_FIXED
    return _ceil(host + scratch + margin, 1024), margin


# ---------------------------------------------------------------------------------------------
# measurement (in the host-reference child process, harness.model.hostrun)


def measure_host_arena(model_path: Path) -> tuple[int, int | None, int | None, bool]:
    """(total, head, tail, verified) from TFLM's recording allocator, measured in the child process.

    Raises ModelError when the model crashes TFLM, HostReferenceError when TFLM is missing or fails.
    """
    m = _measure(Path(model_path).read_bytes())
    return m.total, m.head, m.tail, m.verified


def _measure(data: bytes) -> ArenaMeasurement:
    measured = host_results(data, parse_model_bytes(data), [], reference=False, arena=True).arena
    if measured is None:
        raise HostReferenceError("the tflite-micro wheel is not installed: no arena measurement")
    return measured


def _estimate(data: bytes, info: ModelInfo, chip: str | None) -> ArenaEstimate:
    scratch = espnn_scratch_bound(info, chip)
    failure = ""
    measured: tuple[int, int | None, int | None, bool, str] | None = None
    if tflm_available():
        try:
            m = _measure(data)
            measured = m.total, m.head, m.tail, m.verified, m.backend_version
        except HostReferenceError as exc:  # a crash (ModelError) is not caught: the model is refused
            failure = f"TFLM measurement failed ({exc.message}); "
    if measured is not None:
        total, head, tail, verified, backend_version = measured
        target, margin = _target(total, scratch)
        return ArenaEstimate(
            host_bytes=total,
            target_bytes=target,
            method="measured",
            espnn_scratch_bytes=scratch,
            margin_bytes=margin,
            chip=chip,
            head_bytes=head,
            tail_bytes=tail,
            verified=verified,
            backend_version=backend_version,
            note=(
                "host TFLM recording allocator (64-bit, reference kernels)"
                + (
                    ", confirmed by a run at exactly that size"
                    if verified
                    else ", NOT confirmed at that size"
                )
                + f"; target adds the largest ESP-NN scratch ({scratch} B) and {MARGIN_FRACTION:.0%} + "
                f"{MARGIN_FIXED} B margin; the device's arena_used_bytes() is authoritative"
            ),
        )
    rough = rough_host_bytes(info)
    target, margin = _target(rough, scratch)
    return ArenaEstimate(
        host_bytes=rough,
        target_bytes=target,
        method="rough",
        espnn_scratch_bytes=scratch,
        margin_bytes=margin,
        chip=chip,
        note=(
            failure
            + "ROUGH estimate from tensor lifetimes"
            + ("" if failure else " (tflite-micro not installed here, Linux x86-64 only)")
            + "; expect +/-25%; the device's arena_used_bytes() is authoritative"
        ),
    )


def estimate_arena(model_path: Path, chip: str | None = None) -> ArenaEstimate:
    """Arena estimate for ``model_path`` (see module docstring).

    ``chip`` selects the ESP-NN scratch term (None: the worst case over esp32/esp32s3/esp32p4).
    The measurement runs in the host-reference child process and is cached on disk by model hash.
    Raises ModelError when the model crashes TFLM (the device would too).
    """
    p = Path(model_path)
    info = load_model(p)  # validates before any native code sees the file
    return _estimate(p.read_bytes(), info, chip)
