"""Model inputs: read images, .npy, raw binary or C-array text and quantize them for the model.

The rules (quantization with the model's own scale and zero point, rounding half away from zero as
TFLite's reference ``Quantize`` does; shapes never silently changed) are README "Inputs". A shape
mismatch is an :class:`~harness.errors.InputDataError` naming both shapes.
"""

from __future__ import annotations

import hashlib
import re
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from harness.errors import InputDataError
from harness.model.files import INPUT_MAX_BYTES, check_regular, read_regular
from harness.model.loader import TensorInfo

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")
RAW_SUFFIXES = (".bin", ".raw", ".dat")
C_SUFFIXES = (".c", ".h", ".cc", ".cpp", ".hpp", ".txt", ".inc")

RESIZE_POLICIES = ("error", "stretch", "crop", "pad")
# Images are refused from their header above this (40 MP: any camera photo; decoded RGB ~120 MB).
MAX_IMAGE_PIXELS = 40_000_000
COLOR_MODES = ("auto", "rgb", "grayscale")
# Named normalisations of 8-bit data (0..255): real = pixel * scale + offset.
NAMED_RANGES: dict[str, tuple[float, float]] = {
    "0..1": (1.0 / 255.0, 0.0),
    "-1..1": (2.0 / 255.0, -1.0),
    "0..255": (1.0, 0.0),
}
DEFAULT_IMAGE_RANGE = "0..1"  # when the input tensor's quantization does not say (a float input)
_RANGE_SLACK = 0.05  # a named range matches the tensor's real range within 5 % of its span at each end

_C_TYPES = {
    "float": "float32",
    "double": "float64",
    "int8_t": "int8",
    "signed char": "int8",
    "uint8_t": "uint8",
    "unsigned char": "uint8",
    "char": "int8",
    "int16_t": "int16",
    "short": "int16",
    "int32_t": "int32",
    "int": "int32",
}


@dataclass(frozen=True)
class InputOptions:
    """How to turn a file into the model's input tensor.

    resize: "error" (default: sizes must match), "stretch" (ignore aspect), "crop" (centre-crop to
    the model's aspect, then resize) or "pad" (letterbox with black); resampling is bilinear.
    color: "auto" (from the model's channel count), "rgb" or "grayscale" (checked against the model).
    Normalisation: ``real = value * scale + offset``; either give ``scale``/``offset`` or a named
    ``value_range`` ("0..1", "-1..1", "0..255") for 8-bit data. Images default to the named range the
    input tensor's quantization spans (:func:`default_image_range`; "0..1" when it says nothing); .npy,
    raw and C-array float data are taken as real values unless scale/offset are given.
    raw_dtype: element type of a raw binary file (required for raw files).
    """

    resize: str = "error"
    color: str = "auto"
    scale: float | None = None
    offset: float | None = None
    value_range: str | None = None
    raw_dtype: str | None = None

    def __post_init__(self) -> None:
        given_range = DEFAULT_IMAGE_RANGE if self.value_range is None else self.value_range  # None: valid
        for what, value, choices in (
            ("resize policy", self.resize, RESIZE_POLICIES),
            ("color mode", self.color, COLOR_MODES),
            ("input range", given_range, tuple(NAMED_RANGES)),
        ):
            if value not in choices:
                raise InputDataError(f"unknown {what} {value!r}", hint=f"use one of {choices}")
        if self.value_range is not None and (self.scale is not None or self.offset is not None):
            raise InputDataError("give either a named input range or --input-scale/--input-offset, not both")


@dataclass(frozen=True)
class QuantizationReport:
    """How a truncating cast without clamping (the original bug-report sketch) would differ.

    The sketch computed ``(int8_t)(x / scale + zero_point)``: C truncates toward zero and an
    out-of-range value wraps. ``differing`` counts elements where that differs from correct
    rounding; ``wrapped`` those outside the dtype range; ``clamped`` how many the correct
    quantization had to clamp.
    """

    total: int
    differing: int = 0
    wrapped: int = 0
    clamped: int = 0
    max_abs_diff: int = 0


@dataclass(frozen=True)
class PreparedInput:
    """One input ready for the model: real values (if known), quantized tensor, hash, report."""

    source: Path
    real: np.ndarray | None  # float values in the model's real-valued domain (None if given quantized)
    quantized: np.ndarray  # model dtype and shape: exactly what goes into the input tensor
    sha256: str  # of quantized.tobytes()
    report: QuantizationReport
    tensor: TensorInfo | None = None
    kind: str = ""  # "image", "npy", "raw", "c-array"
    prequantized: bool = False
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, object]:
        return {
            "source": str(self.source),
            "kind": self.kind,
            "tensor": self.tensor.name if self.tensor else None,
            "shape": list(self.quantized.shape),
            "dtype": str(self.quantized.dtype),
            "sha256": self.sha256,
            "prequantized": self.prequantized,
            "notes": list(self.notes),
            "truncating_cast": asdict(self.report),
        }


# --------------------------------------------------------------------------------------------
# quantization


def _dtype_range(dtype: np.dtype) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def quantize(real: np.ndarray, scale: float, zero_point: int, dtype: str | np.dtype) -> np.ndarray:
    """Quantize with round-half-away-from-zero, then clamp to the dtype range."""
    dt = np.dtype(dtype)
    return np.clip(_rounded(real, scale, zero_point), *_dtype_range(dt)).astype(dt)


def _rounded(real: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    x = np.asarray(real, dtype=np.float64) / float(scale)
    return np.where(x >= 0, np.floor(x + 0.5), np.ceil(x - 0.5)) + int(zero_point)


def dequantize(q: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    """Real values of a quantized tensor (float64)."""
    return (np.asarray(q, dtype=np.float64) - int(zero_point)) * float(scale)


def truncation_report(
    real: np.ndarray, scale: float, zero_point: int, dtype: str | np.dtype
) -> QuantizationReport:
    """Compare correct quantization with ``(T)(x / scale + zp)`` (truncate toward zero, wrap)."""
    dt = np.dtype(dtype)
    lo, hi = _dtype_range(dt)
    rounded = _rounded(real, scale, zero_point)
    correct = np.clip(rounded, lo, hi).astype(np.int64)
    x32 = np.asarray(real, dtype=np.float32) / np.float32(scale) + np.float32(zero_point)
    finite = np.isfinite(x32)
    naive_wide = np.trunc(np.where(finite, x32, 0)).astype(np.int64)
    span = hi - lo + 1
    naive = (naive_wide - lo) % span + lo  # two's-complement wrap of the narrowing cast
    diff = np.abs(naive - correct)
    return QuantizationReport(
        total=int(correct.size),
        differing=int(np.count_nonzero(diff)),
        wrapped=int(np.count_nonzero((naive_wide < lo) | (naive_wide > hi))),
        clamped=int(np.count_nonzero((rounded < lo) | (rounded > hi))),
        max_abs_diff=int(diff.max()) if diff.size else 0,
    )


# --------------------------------------------------------------------------------------------
# readers


def _fit_shape(data: np.ndarray, tensor: TensorInfo, source: Path, notes: list[str]) -> np.ndarray:
    """Accept the exact shape, or the shape without a leading batch dim of 1 (added, noted)."""
    if tuple(data.shape) == tensor.shape:
        return data
    if len(tensor.shape) >= 2 and tensor.shape[0] == 1 and tuple(data.shape) == tensor.shape[1:]:
        notes.append(f"added batch dimension: {list(data.shape)} -> {list(tensor.shape)}")
        return data.reshape(tensor.shape)
    raise InputDataError(
        f"{source}: input shape {list(data.shape)} does not match model input {tensor.name!r} "
        f"shape {list(tensor.shape)}",
        hint="provide data of exactly the model's input shape (a missing leading batch dimension of 1 "
        "is accepted); esp-check never reshapes silently",
    )


def _fit_flat(data: np.ndarray, tensor: TensorInfo, source: Path, what: str, notes: list[str]) -> np.ndarray:
    if data.size != tensor.num_elements:
        raise InputDataError(
            f"{source}: {what} holds {data.size} elements, model input {tensor.name!r} shape "
            f"{list(tensor.shape)} needs {tensor.num_elements}",
            hint="check --input-dtype and that the data matches the model input",
        )
    notes.append(f"{what}: {data.size} elements laid out row-major as {list(tensor.shape)}")
    return data.reshape(tensor.shape)


def _image_geometry(tensor: TensorInfo) -> tuple[int, int, int]:
    shape = tensor.shape
    if len(shape) == 4 and shape[0] == 1:
        return shape[1], shape[2], shape[3]
    if len(shape) == 3:
        return shape[0], shape[1], shape[2]
    raise InputDataError(
        f"model input {tensor.name!r} has shape {list(shape)}, which is not an image (NHWC/HWC)",
        hint="pass a .npy, raw or C-array file for non-image inputs",
    )


def _read_image(path: Path, tensor: TensorInfo, opts: InputOptions, notes: list[str]) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError  # lazy: ~8 ms, only an image input needs Pillow

    h, w, c = _image_geometry(tensor)
    if c not in (1, 3):
        raise InputDataError(f"model input {tensor.name!r} has {c} channels; images give 1 (L) or 3 (RGB)")
    wanted = {"rgb": 3, "grayscale": 1}.get(opts.color, c)
    if wanted != c:
        raise InputDataError(
            f"--input-color {opts.color} gives {wanted} channel(s) but model input {tensor.name!r} "
            f"shape {list(tensor.shape)} has {c}",
            hint="omit --input-color (auto) or use the model's channel count",
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # refused below, by size
            im_cm = Image.open(path)
        with im_cm as im:
            _check_image_size(path, im.width, im.height, tensor, opts.resize)  # header only, not decoded
            im.load()
            img = im.convert("RGB" if c == 3 else "L")
    except Image.DecompressionBombError as exc:
        raise InputDataError(
            f"{path}: image is far too large to decode ({exc}); esp-check reads images of at most "
            f"{MAX_IMAGE_PIXELS / 1e6:.0f} megapixels",
            hint=f"scale the image down to the model's input size {w}x{h} first",
        ) from exc
    except (UnidentifiedImageError, OSError) as exc:
        raise InputDataError(f"{path}: cannot read image: {exc}") from exc
    notes.append(f"image {img.width}x{img.height} converted to {'RGB' if c == 3 else 'grayscale'}")
    if (img.width, img.height) != (w, h):  # resize == "error" was refused from the header
        img = _resize(img, w, h, opts.resize)
        notes.append(f"resized to {w}x{h} ({opts.resize}, bilinear)")
    return np.asarray(img, dtype=np.uint8).reshape(tensor.shape)  # (a grayscale image's channel added)


def _check_image_size(path: Path, width: int, height: int, tensor: TensorInfo, resize: str) -> None:
    """Refuse from the header what would be decoded only to be thrown away, or could exhaust memory."""
    h, w, c = _image_geometry(tensor)
    if (width, height) != (w, h) and resize == "error":
        raise InputDataError(
            f"{path}: image is {width}x{height} (shape {[height, width, c]}), "
            f"model input {tensor.name!r} shape {list(tensor.shape)} needs {w}x{h}",
            hint="resize the image yourself or pass --resize stretch|crop|pad",
        )
    if width * height > MAX_IMAGE_PIXELS:
        raise InputDataError(
            f"{path}: image is {width}x{height} ({width * height / 1e6:.1f} megapixels); esp-check reads "
            f"images of at most {MAX_IMAGE_PIXELS / 1e6:.0f} megapixels",
            hint=f"scale the image down to the model's input size {w}x{h} first",
        )


def _resize(img: object, w: int, h: int, policy: str) -> object:
    from PIL import Image  # lazy: ~8 ms, only an image input needs Pillow

    assert isinstance(img, Image.Image)
    bilinear = Image.Resampling.BILINEAR
    if policy == "stretch":
        return img.resize((w, h), bilinear)
    src_aspect, dst_aspect = img.width / img.height, w / h
    if policy == "crop":
        if src_aspect > dst_aspect:  # too wide: crop width
            cw = round(img.height * dst_aspect)
            left = (img.width - cw) // 2
            box = (left, 0, left + cw, img.height)
        else:
            ch = round(img.width / dst_aspect)
            top = (img.height - ch) // 2
            box = (0, top, img.width, top + ch)
        return img.crop(box).resize((w, h), bilinear)
    # pad (letterbox)
    factor = min(w / img.width, h / img.height)
    nw, nh = max(1, round(img.width * factor)), max(1, round(img.height * factor))
    canvas = Image.new(img.mode, (w, h))
    canvas.paste(img.resize((nw, nh), bilinear), ((w - nw) // 2, (h - nh) // 2))
    return canvas


_C_DECL = re.compile(
    r"(?P<type>(?:(?:const|static|volatile|alignas\s*\(\s*\d+\s*\))\s+)*"
    r"(?:float|double|u?int(?:8|16|32)_t|(?:un)?signed\s+char|char|short|int))\s+"
    r"[A-Za-z_]\w*\s*\[[^\]]*\]\s*(?:__attribute__\s*\(\(.*?\)\)\s*)?=\s*\{(?P<body>.*?)\}\s*;",
    re.S,
)
_NUMBER = re.compile(r"[-+]?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)[fFlLuU]*")


def _read_c_array(path: Path) -> tuple[np.ndarray, str]:
    """First ``type name[...] = {...};`` in a C/C++ text file -> (values, numpy dtype name)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    m = _C_DECL.search(text)
    if m is None:
        raise InputDataError(
            f"{path}: no C array definition like `float image[] = {{0.15, ...}};` found",
            hint="supported element types: float, double, int8_t, uint8_t, int16_t, int32_t",
        )
    words = re.sub(r"alignas\s*\(\s*\d+\s*\)", " ", m.group("type")).split()
    base = " ".join(w for w in words if w not in ("const", "static", "volatile"))
    dtype = _C_TYPES[base]
    values: list[float] = []
    for tok in (t for t in re.split(r"[\s,]+", m.group("body")) if t):
        if _NUMBER.fullmatch(tok) is None:
            raise InputDataError(f"{path}: cannot parse array element {tok!r}")
        if "0x" in tok.lower():  # hex digits include f: only the integer suffixes are stripped
            values.append(float(int(tok.rstrip("lLuU"), 16)))
        else:
            values.append(float(tok.rstrip("fFlLuU")))
    arr = np.asarray(values, dtype=np.float64)
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(np.dtype(dtype))
        if np.any(arr != np.round(arr)) or np.any(arr < info.min) or np.any(arr > info.max):
            raise InputDataError(f"{path}: values do not fit the declared C type {base}")
    return arr.astype(dtype), dtype


@dataclass(frozen=True)
class DefaultRange:
    """The named range 8-bit data (images) is normalised to when none is given, and why."""

    name: str
    reason: str
    matched: bool  # False: no named range fits the tensor's real range (0..1 is a guess: warn)

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "reason": self.reason, "from_quantization": self.matched}


def default_image_range(tensor: TensorInfo) -> DefaultRange:
    """The input range that fits ``tensor``: the named range nearest to the real range its int8/int16
    quantization can represent (person_detect: scale 1/127.5, zero point -1 -> -0.996..1.004 -> -1..1).
    A model trained on -1..1 fed 0..1 gets the wrong class silently."""
    dt = np.dtype(tensor.dtype)
    if dt.kind not in "iu" or dt.itemsize > 2 or not tensor.scale or tensor.per_channel:
        return DefaultRange(
            DEFAULT_IMAGE_RANGE,
            f"{dt.name} input without one quantization scale: {DEFAULT_IMAGE_RANGE} assumed",
            dt.kind == "f",
        )
    lo_q, hi_q = _dtype_range(dt)
    zp = tensor.zero_point or 0
    lo, hi = (lo_q - zp) * tensor.scale, (hi_q - zp) * tensor.scale
    span = hi - lo
    best = min(NAMED_RANGES, key=lambda n: abs(_ends(n)[0] - lo) + abs(_ends(n)[1] - hi))
    b_lo, b_hi = _ends(best)
    fits = abs(b_lo - lo) <= _RANGE_SLACK * span and abs(b_hi - hi) <= _RANGE_SLACK * span
    what = (
        f"the input tensor's quantization (scale {tensor.scale:.6g}, zero point {zp}) spans "
        f"{lo:.4g}..{hi:.4g}"
    )
    if fits:
        return DefaultRange(best, f"{what}: {best}", True)
    return DefaultRange(
        DEFAULT_IMAGE_RANGE,
        f"{what}, which no named range fits: {DEFAULT_IMAGE_RANGE} assumed; give --input-range or "
        "--input-scale/--input-offset",
        False,
    )


def _ends(name: str) -> tuple[float, float]:
    s, o = NAMED_RANGES[name]
    return o, 255 * s + o


def _normalise(
    data: np.ndarray, opts: InputOptions, is_8bit_pixels: bool, notes: list[str], tensor: TensorInfo
) -> np.ndarray:
    """Real values from raw data: explicit scale/offset, a named range (8-bit data), or as is."""
    if opts.scale is not None or opts.offset is not None:
        s = 1.0 if opts.scale is None else float(opts.scale)
        o = 0.0 if opts.offset is None else float(opts.offset)
        notes.append(f"normalised: real = value * {s:g} + {o:g}")
        with np.errstate(over="ignore", invalid="ignore"):  # said below, not as a numpy warning
            real = data.astype(np.float64) * s + o
        if not np.all(np.isfinite(real)):
            raise InputDataError(
                f"--input-scale {s:g} / --input-offset {o:g} turn this input's values into infinities",
                hint="give the scale and offset that map the data to the model's real input range",
            )
        return real
    name = opts.value_range
    if name is None and is_8bit_pixels:
        default = default_image_range(tensor)
        name = default.name
        notes.append(
            f"input range {name} by default: {default.reason}"
            if default.matched
            else f"warning: {default.reason}"
        )
    if name is not None:
        if not is_8bit_pixels:
            raise InputDataError(
                f"named input range {name} applies to 8-bit (0..255) data, not {data.dtype} values",
                hint="use --input-scale/--input-offset for other data",
            )
        s, o = NAMED_RANGES[name]
        notes.append(f"normalised 0..255 -> {name}")
        return data.astype(np.float64) * s + o
    return data.astype(np.float64)


def _detect_kind(path: Path, opts: InputOptions) -> str:
    suffix = path.suffix.lower()
    for suffixes, kind in ((IMAGE_SUFFIXES, "image"), ((".npy",), "npy"), (C_SUFFIXES, "c-array")):
        if suffix in suffixes:
            return kind
    if opts.raw_dtype is not None or suffix in RAW_SUFFIXES:
        return "raw"
    raise InputDataError(
        f"{path}: cannot tell the input format from the suffix {suffix!r}",
        hint="use .png/.jpg/.bmp, .npy, a C array file (.c/.h/.txt), or raw binary with --input-dtype",
    )


def load_input(path: str | Path, tensor: TensorInfo, options: InputOptions | None = None) -> PreparedInput:
    """Read ``path`` and prepare it for ``tensor`` (quantize if needed); see the module docstring."""
    src = Path(path)
    opts = options or InputOptions()
    check_regular(src, what="input file", max_bytes=INPUT_MAX_BYTES, error=InputDataError)
    if tensor.dtype not in np.sctypeDict or np.dtype(tensor.dtype).kind not in "iuf":
        raise InputDataError(f"model input {tensor.name!r} has dtype {tensor.dtype}, not supported")
    kind = _detect_kind(src, opts)
    notes: list[str] = []
    data: np.ndarray
    if kind == "image":
        data = _read_image(src, tensor, opts, notes)
    elif kind == "npy":
        try:
            data = np.load(src, allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise InputDataError(f"{src}: not a readable .npy file: {exc}") from exc
        if data.dtype.kind not in "iuf":
            raise InputDataError(f"{src}: .npy dtype {data.dtype} is not numeric")
        data = _fit_shape(data, tensor, src, notes)
    elif kind == "raw":
        if opts.raw_dtype is None:
            raise InputDataError(
                f"{src}: raw binary input needs its element type",
                hint="pass --input-dtype (e.g. int8, uint8, float32)",
            )
        try:
            raw_dt = np.dtype(opts.raw_dtype).newbyteorder("<")
        except TypeError as exc:
            raise InputDataError(f"unknown --input-dtype {opts.raw_dtype!r}") from exc
        blob = read_regular(src, what="input file", max_bytes=INPUT_MAX_BYTES, error=InputDataError)
        if len(blob) % raw_dt.itemsize:
            raise InputDataError(
                f"{src}: {len(blob)} bytes is not a whole number of {raw_dt.name} elements "
                f"({raw_dt.itemsize} B each)"
            )
        values = np.frombuffer(blob, dtype=raw_dt).astype(raw_dt.newbyteorder("="))
        data = _fit_flat(values, tensor, src, f"raw {raw_dt.name}", notes)
    else:
        values, c_dtype = _read_c_array(src)
        data = _fit_flat(values, tensor, src, f"C array ({c_dtype})", notes)
    return _prepare(src, data, tensor, opts=opts, kind=kind, notes=notes)


def prepare_array(
    data: np.ndarray, tensor: TensorInfo, options: InputOptions | None = None, *, source: str = "array"
) -> PreparedInput:
    """An in-memory array (e.g. one entry of a dataset .npz) prepared for ``tensor`` as a .npy file
    holding it would be (``source`` names it in messages)."""
    src = Path(source)
    if data.dtype.kind not in "iuf":
        raise InputDataError(f"{source}: dtype {data.dtype} is not numeric")
    notes: list[str] = []
    data = _fit_shape(np.asarray(data), tensor, src, notes)
    return _prepare(src, data, tensor, opts=options or InputOptions(), kind="npy", notes=notes)


def _prepare(
    src: Path,
    data: np.ndarray,
    tensor: TensorInfo,
    opts: InputOptions,
    kind: str,
    notes: list[str],
) -> PreparedInput:
    """Quantize (or take as already quantized) what was read from ``src``."""
    model_dt = np.dtype(tensor.dtype)
    # 8-bit pixel data: an image, or uint8 values for a model whose input is not uint8
    pixels = kind == "image" or (data.dtype == np.uint8 and model_dt != np.uint8)
    explicit_norm = opts.scale is not None or opts.offset is not None or opts.value_range is not None
    integers = data.dtype.kind in "iu" and model_dt.kind in "iu" and not pixels and not explicit_norm
    # Already quantized: the file holds the model's own integer dtype (and no normalisation asked).
    prequantized = integers and data.dtype == model_dt
    report = None  # nothing quantized here: no element a truncating cast could get wrong
    if prequantized:
        q = np.ascontiguousarray(data.astype(model_dt))
        notes.append(f"already {model_dt.name}: used as quantized values")
        real = dequantize(q, tensor.scale, tensor.zero_point or 0) if tensor.scale is not None else None
    elif integers:
        raise InputDataError(
            f"{src}: integer data of dtype {data.dtype} for model input {tensor.name!r} "
            f"of dtype {model_dt.name}",
            hint="give quantized data in the model's dtype, float real values, "
            "or --input-scale/--input-offset",
        )
    else:
        real = _normalise(data, opts, pixels, notes, tensor)
        if not np.all(np.isfinite(real)):
            raise InputDataError(
                f"{src}: input contains NaN or infinity",
                hint="replace them with finite values (np.isfinite(x).all() must hold): they have no "
                "quantized value",
            )
        if model_dt.kind == "f":
            q = np.ascontiguousarray(real.astype(model_dt))
            notes.append("float model input: no quantization")
        elif tensor.scale is None or tensor.scale == 0:
            raise InputDataError(
                f"model input {tensor.name!r} is {model_dt.name} without quantization parameters",
                hint="pass already-quantized data in the model's dtype (.npy or raw with --input-dtype)",
            )
        else:
            zp = tensor.zero_point or 0
            q = np.ascontiguousarray(quantize(real, tensor.scale, zp, model_dt))
            report = truncation_report(real, tensor.scale, zp, model_dt)
            notes.append(
                f"quantized with scale {tensor.scale:.9g}, zero point {zp} (round half away from zero, clamp)"
            )
    return PreparedInput(
        src,
        real,
        q,
        sha256=hashlib.sha256(q.tobytes()).hexdigest(),
        report=report or QuantizationReport(total=int(q.size)),
        tensor=tensor,
        kind=kind,
        prequantized=prequantized,
        notes=tuple(notes),
    )


def tensor_bytes(prepared: PreparedInput) -> bytes:
    """The quantized input as the device's input tensor holds it: little-endian, C order."""
    q = np.ascontiguousarray(prepared.quantized)
    return q.astype(q.dtype.newbyteorder("<"), copy=False).tobytes()


def input_tensor_bytes(
    paths: Sequence[str | Path], tensor: TensorInfo, options: InputOptions | None = None
) -> list[bytes]:
    """Each input prepared for ``tensor`` (usage errors as :func:`load_input`), as tensor bytes."""
    return [tensor_bytes(load_input(p, tensor, options)) for p in paths]
