"""load_model refuses (ModelError, exit 2) what TFLM cannot load, before any interpreter sees it.

Each case is a fixture model (written by the TF converter) with one field patched the way a
corrupted copy would have it, or a model written with the test builder: the parts the loader never
read before (signature defs, metadata, intermediates, option subgraph indices), vector lengths that
claim more elements than the file holds, constant tensors larger than their buffers, activation
shapes no ESP32 can hold.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from pathlib import Path

import flatbuffers
import numpy as np
import pytest
import tflite
from test_model_builder import CONV_2D, Op, T, build_model, conv2d_options

from harness.cli import main
from harness.errors import ExitCode, ModelError
from harness.model import backends
from harness.model.loader import parse_model_bytes

CNN = Path(__file__).parent / "data" / "models" / "cnn_classifier_11.tflite"


def _field(obj: object, slot: int) -> int:
    """File position of a scalar field of a flatbuffer table (it must be present)."""
    tab = obj._tab  # type: ignore[attr-defined]
    o = tab.Offset(slot)
    assert o, "field not present in the fixture"
    return int(tab.Pos + o)


def _vector_len(obj: object, slot: int) -> int:
    """File position of a vector's length word."""
    tab = obj._tab  # type: ignore[attr-defined]
    return int(tab.Vector(tab.Offset(slot))) - 4


def _patched(where: Callable[[tflite.Model], int], value: int) -> bytes:
    data = bytearray(CNN.read_bytes())
    pos = where(tflite.Model.GetRootAsModel(bytes(data), 0))
    data[pos : pos + 4] = struct.pack("<I", value)
    return bytes(data)


PATCHES = {
    # field -> (position in the file, value, what the message names)
    "signature tensor": (lambda m: _field(m.SignatureDefs(0).Outputs(0), 6), 9999, "tensor 9999 of"),
    "metadata buffer": (lambda m: _field(m.Metadata(0), 6), 9999, "metadata 0 refers to buffer 9999"),
    "signature_defs length": (lambda m: _vector_len(m, 18), 0x7FFFFFFF, "elements cannot fit"),
    "metadata length": (lambda m: _vector_len(m, 16), 0x40000000, "elements cannot fit"),
    "signature inputs length": (lambda m: _vector_len(m.SignatureDefs(0), 4), 0xFFFFFFF, "cannot fit"),
}


@pytest.mark.parametrize("case", sorted(PATCHES))
def test_corrupted_fields_the_interpreter_reads_are_refused(case: str) -> None:
    where, value, needle = PATCHES[case]
    data = _patched(where, value)
    t0 = time.monotonic()
    with pytest.raises(ModelError) as err:
        parse_model_bytes(data)
    assert needle in str(err.value)
    assert time.monotonic() - t0 < 5  # a huge length is refused, not iterated (generous bound)


def test_refused_by_inspect_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(_patched(lambda m: _field(m.Metadata(0), 6), 9999))
    assert main(["inspect", str(bad)]) == ExitCode.USAGE
    assert "metadata 0 refers to buffer 9999" in capsys.readouterr().err


def _fc(weights_shape: tuple[int, ...], weights: np.ndarray, out: int = 5, n_in: int = 12) -> bytes:
    return build_model(
        [
            T("x", (1, n_in), "int8", 0.05, 0),
            T("w", weights_shape, "int8", 0.02, 0, data=weights),
            T("y", (1, out), "int8", 0.4, 0),
        ],
        [Op(9, [0, 1, -1], [2])],
        inputs=[0],
        outputs=[2],
    )


def test_constant_tensor_larger_than_its_buffer() -> None:
    assert parse_model_bytes(_fc((5, 12), np.ones(60, np.int8))).ops[0].opcode == "FULLY_CONNECTED"
    with pytest.raises(ModelError, match=r"needs 600 bytes, its buffer holds 60"):
        parse_model_bytes(_fc((50, 12), np.ones(60, np.int8)))


def test_activation_shape_no_esp32_can_hold() -> None:
    n = 64 * 1024 * 1024 + 1  # one byte more than an activation may take
    with pytest.raises(ModelError, match="more than any ESP32 can hold"):
        parse_model_bytes(_fc((5, 12), np.ones(60, np.int8), n_in=n))


def test_negative_dimension() -> None:
    model = build_model(
        [T("x", (1, -5), "int8", 0.05, 0), T("y", (1, 5), "int8", 0.05, 0)],
        [Op(0, [0, 0], [1], add_options=True)],
        inputs=[0],
        outputs=[1],
    )
    with pytest.raises(ModelError, match=r"shape \[1, -5\]"):
        parse_model_bytes(model)


def _rank7(opcode: int, inputs: list[T]) -> bytes:
    """``inputs`` -> one op -> a rank-7 int8 output (an ADD of x with itself, or a RESHAPE)."""
    shape = (1, 1, 1, 1, 2, 2, 3)
    ins = [0, 0] if opcode == 0 else list(range(len(inputs)))
    return build_model(
        [*inputs, T("y", shape, "int8", 0.1, 0)],
        [Op(opcode, ins, [len(inputs)], add_options=opcode == 0)],
        inputs=[0],
        outputs=[len(inputs)],
    )


def test_rank_over_tflm_runtime_shape_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """TFLM's kernels copy shapes into a RuntimeShape of 6 dimensions: a rank-7 ADD overflows it
    (the host wheel ran it silently; the native firmware under ASan: stack-buffer-overflow)."""
    model = tmp_path / "add7.tflite"
    model.write_bytes(_rank7(0, [T("x", (1, 1, 1, 1, 2, 2, 3), "int8", 0.05, 0)]))
    assert main(["inspect", str(model)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "op 0 (ADD): tensor 0 ('x') has rank 7" in err
    assert "at most 6 dimensions" in err and "runtime_shape.h" in err


def _slice(rank: int) -> bytes:
    """SLICE of an int8 tensor of ``rank`` dimensions, whole (begin 0, size = its shape)."""
    shape = (1,) * (rank - 3) + (2, 2, 3)
    begin = T("begin", (rank,), "int32", data=np.zeros(rank, np.int32))
    size = T("size", (rank,), "int32", data=np.array(shape, np.int32))
    tensors = [T("x", shape, "int8", 0.05, 0), begin, size, T("y", shape, "int8", 0.05, 0)]
    return build_model(tensors, [Op(65, [0, 1, 2], [3])], inputs=[0], outputs=[3])


def test_rank_over_slice_kernel_limit_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """TFLM's SLICE kernel handles 5 dimensions and only DCHECKs that (slice.cc): at rank 6, within
    RuntimeShape's 6, it writes begins[-1] and sizes[-1], before its SliceParams arrays."""
    assert parse_model_bytes(_slice(5)).ops[0].opcode == "SLICE"
    model = tmp_path / "slice6.tflite"
    model.write_bytes(_slice(6))
    assert main(["inspect", str(model)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "op 0 (SLICE): tensor 0 ('x') has rank 6" in err
    assert "at most 5 dimensions" in err and "slice.cc" in err


def test_rank_7_reshape_output_accepted() -> None:
    """RESHAPE only reads the dims array (no RuntimeShape): TFLM runs it at rank 7, so it stays allowed."""
    shape_t = T("shape", (7,), "int32", data=np.array((1, 1, 1, 1, 2, 2, 3), np.int32))
    info = parse_model_bytes(_rank7(22, [T("x", (1, 12), "int8", 0.1, 0), shape_t]))
    assert info.tensors[2].shape == (1, 1, 1, 1, 2, 2, 3)


def _call_once(b: flatbuffers.Builder) -> int:
    tflite.CallOnceOptionsStart(b)
    tflite.CallOnceOptionsAddInitSubgraphIndex(b, 3)
    return int(tflite.CallOnceOptionsEnd(b))


def test_option_subgraph_index_out_of_range() -> None:
    model = build_model(
        [T("x", (1, 4), "int8", 0.05, 0), T("y", (1, 4), "int8", 0.05, 0)],
        [Op(0, [0, 0], [1], add_options=True),
         Op(129, [], [], deprecated=127, options=(tflite.BuiltinOptions.CallOnceOptions, _call_once))],
        inputs=[0],
        outputs=[1],
    )  # fmt: skip
    with pytest.raises(ModelError, match="init_subgraph_index=3 refers to a subgraph that does not exist"):
        parse_model_bytes(model)


@pytest.mark.skipif(not backends.tflm_available(), reason="tflite-micro wheel not installed")
def test_tflm_wheel_unpack_errors_are_model_errors() -> None:
    """Should a broken field get past the loader, the wheel's own unpack error is exit 2 too."""
    good = parse_model_bytes(CNN.read_bytes())
    bad = _patched(lambda m: _vector_len(m.SignatureDefs(0), 4), 0x7FFFFFF0)
    with pytest.raises(ModelError, match="cannot read this model file"):
        backends.TflmBackend().run(bad, good, [[np.zeros((1, 32, 32, 3), np.int8)]], False)


@pytest.mark.parametrize(
    ("inputs", "w_shape", "needle"),
    [([0], (5, 12), "needs an input, weights and an output"),
     ([0, -1, -1], (5, 12), "needs an input, weights and an output"),
     ([0, 1, -1], (5, 0), "no empty dimension"),
     ([0, 1, -1], (60,), "rank 2")],
)  # fmt: skip
def test_weighted_op_without_usable_weights(inputs: list[int], w_shape: tuple[int, ...], needle: str) -> None:
    """TFLM divides by weight dimensions and reads inputs it assumes (SIGFPE / SIGSEGV on the host)."""
    model = build_model(
        [
            T("x", (1, 12), "int8", 0.05, 0),
            T("w", w_shape, "int8", 0.02, 0, data=np.ones(w_shape, np.int8)),
            T("y", (1, 5), "int8", 0.4, 0),
        ],
        [Op(9, inputs, [2])],
        inputs=[0],
        outputs=[2],
    )
    with pytest.raises(ModelError, match=needle):
        parse_model_bytes(model)


def _mean(dtype: str, axes: int) -> bytes:
    """MEAN of a rank-5 ``dtype`` tensor over a constant axis tensor of ``axes`` entries."""
    scale = None if dtype == "float32" else 0.05
    return build_model(
        [
            T("x", (1, 2, 2, 2, 3), dtype, scale),
            T("axis", (axes,), "int32", data=np.arange(axes, dtype=np.int32)),
            T("y", (1, 1, 1, 1, 1), dtype, scale),
        ],
        [Op(40, [0, 1], [2])],
        inputs=[0],
        outputs=[2],
    )


def test_float_mean_over_axis_params_limit_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """TFLM's float MEAN copies the axis entries into MeanParams.axis[4] unbounded (reduce_common.cc
    ResolveAxis): a fifth entry writes past it on the stack. The int8 path does not use it."""
    assert parse_model_bytes(_mean("int8", 5)).ops[0].opcode == "MEAN"
    assert parse_model_bytes(_mean("float32", 4)).ops[0].opcode == "MEAN"
    model = tmp_path / "mean5.tflite"
    model.write_bytes(_mean("float32", 5))
    assert main(["inspect", str(model)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "op 0 (MEAN): axis tensor 1 ('axis') has 5 entries" in err
    assert "at most 4" in err and "MeanParams" in err


def _conv3(out_shape: tuple[int, ...] = (4, 4, 8)) -> bytes:
    """int8 3x3 CONV_2D with a rank-3 input [4,4,3] (no batch dimension) -> ``out_shape``."""
    rng = np.random.default_rng(0)
    return build_model(
        [
            T("image", (4, 4, 3), "int8", 1 / 128, -1),
            T("filter", (8, 3, 3, 3), "int8", 0.02, 0, rng.integers(-127, 128, (8, 3, 3, 3))),
            T("bias", (8,), "int32", 0.02 / 128, 0, rng.integers(-2000, 2000, (8,))),
            T("features", out_shape, "int8", 0.05, 3),
        ],
        [Op(CONV_2D, [0, 1, 2], [3], options=conv2d_options())],
        inputs=[0],
        outputs=[3],
    )


def test_conv_input_not_rank_4_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """ESP-NN's CONV_2D Prepare reads input->dims->data[3] (esp_nn/conv.cc:72) and the reference
    kernels RuntimeShape.Dims(3) with only a DCHECK of rank 4: on a rank-3 input both read past the
    shape (the host wheel happened to die of SIGFPE on what it found there)."""
    model = tmp_path / "conv3.tflite"
    model.write_bytes(_conv3())
    assert main(["inspect", str(model)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "op 0 (CONV_2D): tensor 0 ('image') has rank 3" in err and "needs rank 4" in err


_RANK3_POOL = [T("x", (4, 4, 8), "int8", 0.05, 0), T("y", (2, 2, 8), "int8", 0.05, 0)]
_RANK3_TRANSPOSE_CONV = [
    T("x", (4, 4, 8), "int8", 0.05, 0),
    T("y", (8, 8, 8), "int8", 0.05, 0),
    T("shape", (3,), "int32", data=np.array((8, 8, 8), np.int32)),
    T("w", (8, 3, 3, 8), "int8", 0.02, 0, np.ones((8, 3, 3, 8))),
]


@pytest.mark.parametrize(
    ("builtin", "ins", "tensors"),
    [
        (17, [0], _RANK3_POOL),  # MAX_POOL_2D
        (1, [0], [T("x", (1, 4, 4, 8), "int8", 0.05, 0), _RANK3_POOL[1]]),  # AVERAGE_POOL_2D, rank-3 output
        (67, [2, 3, 0], _RANK3_TRANSPOSE_CONV),  # TRANSPOSE_CONV: output shape, weights, input
    ],
)
def test_pool_and_transpose_conv_not_rank_4_refused(builtin: int, ins: list[int], tensors: list[T]) -> None:
    """Pooling (pooling_common.cc, esp_nn/pooling.cc:51-52) and TRANSPOSE_CONV only DCHECK rank 4."""
    model = build_model(tensors, [Op(builtin, ins, [1])], inputs=[0], outputs=[1])
    with pytest.raises(ModelError, match=r"has rank 3; .* needs rank 4"):
        parse_model_bytes(model)


def _transpose_conv(w_shape: tuple[int, ...]) -> bytes:
    """int8 TRANSPOSE_CONV [1,4,4,8] -> [1,8,8,8]; inputs (output_shape, weights, activation)."""
    return build_model(
        [
            T("x", (1, 4, 4, 8), "int8", 0.05, 0),
            T("y", (1, 8, 8, 8), "int8", 0.05, 0),
            T("shape", (4,), "int32", data=np.array((1, 8, 8, 8), np.int32)),
            T("w", w_shape, "int8", 0.02, 0, np.ones(w_shape, np.int8)),
        ],
        [Op(67, [2, 3, 0], [1])],
        inputs=[0],
        outputs=[1],
    )


@pytest.mark.parametrize(("w_shape", "needle"), [((8, 3, 3), "rank 4"), ((8, 3, 3, 8, 0), "rank 4")])
def test_transpose_conv_weights_not_rank_4_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], w_shape: tuple[int, ...], needle: str
) -> None:
    """TRANSPOSE_CONV's Eval reads filter dims 0..3 (Offset, reference/integer_ops/transpose_conv.h:45-53,
    88) with only a DCHECK of rank 4: past a rank-3 shape; a rank-5 one with an empty dimension holds no
    element to read. Its weights are input 1, its activation input 2 (not 0, as for CONV_2D)."""
    assert parse_model_bytes(_transpose_conv((8, 3, 3, 8))).ops[0].opcode == "TRANSPOSE_CONV"
    model = tmp_path / "tconv.tflite"
    model.write_bytes(_transpose_conv(w_shape))
    assert main(["inspect", str(model)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert f"op 0 (TRANSPOSE_CONV): weights of shape {list(w_shape)}" in err and needle in err


# (builtin, activation shape, weights shape, output shape): 8 output channels each
_WEIGHTED_OPS = {
    "CONV_2D": (CONV_2D, (1, 4, 4, 3), (8, 3, 3, 3), (1, 4, 4, 8)),
    "DEPTHWISE_CONV_2D": (4, (1, 4, 4, 8), (1, 3, 3, 8), (1, 4, 4, 8)),
    "FULLY_CONNECTED": (9, (1, 12), (8, 12), (1, 8)),
    "TRANSPOSE_CONV": (67, (1, 4, 4, 8), (8, 3, 3, 8), (1, 8, 8, 8)),
}


def _weighted(
    opcode: str, bias: T, act: str = "int8", scales: int = 0, qdim: int | None = None, out_channels: int = 8
) -> bytes:
    """``opcode`` with ``act`` activations, int8 weights (``scales`` per-channel scales along ``qdim``,
    else one), ``bias`` and ``out_channels`` output channels; TRANSPOSE_CONV's inputs are (output shape,
    weights, activation, bias)."""
    builtin, x_shape, w_shape, y_shape = _WEIGHTED_OPS[opcode]
    y_shape = (*y_shape[:-1], out_channels)
    per_channel = (0.02,) * scales if scales else None
    tensors = [
        T("x", x_shape, act, 0.05, 0),
        T("w", w_shape, "int8", 0.02, 0, np.ones(w_shape, np.int8), scales=per_channel, qdim=qdim),
        bias,
        T("y", y_shape, act, 0.4, 0),
        T("shape", (len(y_shape),), "int32", data=np.array(y_shape, np.int32)),
    ]
    ins = [4, 1, 0, 2] if builtin == 67 else [0, 1, 2]
    return build_model(tensors, [Op(builtin, ins, [3])], inputs=[0], outputs=[3])


def _bias(n: int, dtype: str = "int32") -> T:
    return T("bias", (n,), dtype, 0.001, 0, np.ones(n, np.dtype(dtype)))


@pytest.mark.parametrize("opcode", sorted(_WEIGHTED_OPS))
def test_bias_shorter_than_the_output_channels_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], opcode: str
) -> None:
    """No Prepare checks the bias's length; Eval adds bias_data[out_channel] for every output channel
    (reference/integer_ops/conv.h:123, transpose_conv.h:109, esp-nn's conv and depthwise) with only a
    DCHECK: a 3-entry bias for 8 channels is read past its end (the host wheel ran it, channels 3-4: 127)."""
    assert parse_model_bytes(_weighted(opcode, _bias(8))).ops[0].opcode == opcode
    model = tmp_path / "bias3.tflite"
    model.write_bytes(_weighted(opcode, _bias(3)))
    assert main(["inspect", str(model)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert f"op 0 ({opcode}): bias tensor 2 ('bias') has 3 entries; the kernel reads 8" in err
    assert "one per output channel" in err


@pytest.mark.parametrize(
    ("opcode", "act", "bias", "ok"),
    [
        ("CONV_2D", "int8", "int64", False),  # read as int32: every other entry is a high word
        ("FULLY_CONNECTED", "int8", "int16", False),  # read as int32: past the end
        ("DEPTHWISE_CONV_2D", "int16", "int32", False),  # read as int64 (esp_nn/depthwise_conv.cc:392)
        ("FULLY_CONNECTED", "int16", "int64", True),
        ("CONV_2D", "int16", "int32", True),  # conv's Eval picks int32 or int64 (esp_nn/conv.cc:314-327)
        ("TRANSPOSE_CONV", "int16", "int16", True),  # widened to int64 first (transpose_conv.cc:128)
    ],
)
def test_bias_of_a_type_the_kernel_does_not_read_refused(opcode: str, act: str, bias: str, ok: bool) -> None:
    """No Prepare checks the bias's type; Eval casts the data to the type it expects."""
    model = _weighted(opcode, _bias(8, bias), act=act)
    if ok:
        assert parse_model_bytes(model).ops[0].opcode == opcode
        return
    with pytest.raises(ModelError) as err:
        parse_model_bytes(model)
    assert (
        f"op 0 ({opcode}): bias tensor 2 ('bias') is {bias}; for {act} activations the kernel reads"
        in str(err.value)
    )


@pytest.mark.parametrize(
    ("opcode", "scales", "qdim"),
    [("FULLY_CONNECTED", 12, 1), ("CONV_2D", 3, 3), ("DEPTHWISE_CONV_2D", 8, 0)],
)
def test_per_channel_scales_not_along_the_output_channels_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], opcode: str, scales: int, qdim: int
) -> None:
    """FULLY_CONNECTED's Prepare checks the scales against the weights' quantized_dimension, not the
    output channels (fully_connected_common.cc:104-109): 12 scales along dimension 1 of [8,12] weights pass;
    TFLM then applies scale i to output channel i. The others check the count (kernel_util.cc:243-246)."""
    for good, dim in ((8, 3 if opcode == "DEPTHWISE_CONV_2D" else 0), (1, None)):
        assert parse_model_bytes(_weighted(opcode, _bias(8), scales=good, qdim=dim)).ops[0].opcode == opcode
    model = tmp_path / "scales.tflite"
    model.write_bytes(_weighted(opcode, _bias(8), scales=scales, qdim=qdim))
    assert main(["inspect", str(model)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert (
        f"op 0 ({opcode}): weights tensor 1 ('w') has {scales} per-channel scales along dimension {qdim}"
        in err
    )


@pytest.mark.parametrize("opcode", sorted(_WEIGHTED_OPS))
def test_output_channels_other_than_the_weights_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], opcode: str
) -> None:
    """FULLY_CONNECTED's Eval takes its output channels from the output's last dimension with only a
    DCHECK_LE against the weights' rows (esp_nn/fully_connected.cc:166-167, reference/integer_ops/
    fully_connected.h:54-55): 16 output channels from [8,12] weights read 8 rows past the weights (the host
    wheel printed them). The convolutions take min(weights, output) channels (MatchingDim, types.h:302-306,
    its DCHECK compiled out) and leave the output's other channels unwritten."""
    model = tmp_path / "out16.tflite"
    model.write_bytes(_weighted(opcode, _bias(16), out_channels=16))
    assert main(["inspect", str(model)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert f"op 0 ({opcode}): output tensor 3 ('y') has 16 channels; the weights have 8" in err


def _i(dtype: str, *values: int) -> np.ndarray:
    return np.array(values, np.dtype(dtype))


def _with_params(builtin: int, x: tuple[int, ...], params: list[T], y: tuple[int, ...]) -> bytes:
    """int8 ``x`` and constant ``params`` -> one op ``builtin`` -> int8 ``y``."""
    tensors = [T("x", x, "int8", 0.1, 0), *params, T("y", y, "int8", 0.1, 0)]
    n = len(tensors) - 1
    return build_model(tensors, [Op(builtin, list(range(n)), [n])], inputs=[0], outputs=[n])


_ZERO_CROPS = T("crops", (2, 2), "int32", data=np.zeros((2, 2), np.int32))
# (builtin, input shape, parameter tensors, output shape, the refusal): what the host wheel did
_BAD_PARAMS = {
    "transpose_repeated": (
        39,
        (2, 3),
        [T("perm", (2,), "int32", data=_i("int32", 0, 0))],
        (2, 2),
        "tensor 1 ('perm') is [0, 0], not a permutation of 0..1",
    ),  # read x[6]
    "transpose_int64": (
        39,
        (2, 3, 1),
        [T("perm", (3,), "int64", data=_i("int64", 2, 1, 0))],
        (1, 3, 2),
        "tensor 1 ('perm') is int64; the kernel reads it as int32",
    ),  # read as [2, 0, 1]: [[1, 2], [4, 5], [0, 0]], past x
    "slice_past_input": (
        65,
        (2, 3),
        [T("begin", (2,), "int32", data=_i("int32", 1, 1)), T("size", (2,), "int32", data=_i("int32", 1, 5))],
        (1, 5),
        "begin 1 and size 5 for dimension 1 of size 3",
    ),  # [5, 6, 0, 0, -128]
    "slice_mixed_types": (
        65,
        (2, 3),
        [T("begin", (2,), "int64", data=_i("int64", 0, 0)), T("size", (2,), "int32", data=_i("int32", 2, 3))],
        (2, 3),
        "tensor 2 ('size') is int32; the kernel reads it as int64",
    ),  # SIGSEGV
    **{
        f"{name}_block_0": (
            code,
            (1, 2, 2, 2),
            [T("block", (2,), "int32", data=_i("int32", 1, 0)), _ZERO_CROPS],
            (1, 2, 2, 2),
            "tensor 1 ('block') has block size 0",
        )  # SIGFPE
        for name, code in (("batch_to_space", 37), ("space_to_batch", 38))
    },
    "mirror_pad_past_input": (
        100,
        (2, 3),
        [T("pads", (2, 2), "int32", data=_i("int32", 0, 0, 4, 0))],
        (2, 7),
        "left padding 4 for dimension 1 of size 3",
    ),  # row 1: [0, 6, ..]
    "mirror_pad_one_column": (
        100,
        (2, 3),
        [T("pads", (2, 1), "int32", data=_i("int32", 0, 1))],
        (2, 4),
        "tensor 1 ('pads') has 2 entries; the kernel reads 4",
    ),  # SIGSEGV
    "pad_for_another_rank": (
        34,
        (2, 3),
        [T("pads", (1, 2), "int32", data=_i("int32", 0, 0))],
        (2,),
        "tensor 1 ('pads') has 2 entries; the kernel reads 4",
    ),  # [0, 0]
    "strided_slice_short": (
        45,
        (2, 3),
        [T(n, (1,), "int32", data=_i("int32", v)) for n, v in (("begin", 0), ("end", 1), ("strides", 1))],
        (1,),
        "tensor 1 ('begin') has 1 entries; the kernel reads 2",
    ),  # Prepare read begin[1] etc. past their ends (and refused the garbage)
}


@pytest.mark.parametrize("case", sorted(_BAD_PARAMS))
def test_constant_parameters_the_kernel_reads_out_of_bounds_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    """These ops' Prepare leaves their constant parameter tensors unchecked (or checks less than Eval
    reads): the host wheel ran each model above to the outcome noted: garbage, a SIGSEGV or a SIGFPE."""
    builtin, x, params, y, needle = _BAD_PARAMS[case]
    model = tmp_path / f"{case}.tflite"
    model.write_bytes(_with_params(builtin, x, params, y))
    assert main(["inspect", str(model)]) == ExitCode.USAGE
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize(
    ("builtin", "x", "params", "y"),
    [
        (39, (2, 3), [T("perm", (2,), "int32", data=_i("int32", 1, 0))], (3, 2)),
        (
            65,
            (2, 3),
            [T("b", (2,), "int64", data=_i("int64", 1, 0)), T("s", (2,), "int64", data=_i("int64", 1, -1))],
            (1, 3),
        ),
        (100, (2, 3), [T("pads", (2, 2), "int64", data=_i("int64", 1, 1, 2, 2))], (4, 7)),
        # no MirrorPadOptions: TFLM's mode is unknown, mirrored as SYMMETRIC (left padding up to 3 here)
        (100, (2, 3), [T("pads", (2, 2), "int32", data=_i("int32", 0, 0, 3, 0))], (2, 6)),
        (37, (4, 1, 1, 2), [T("block", (2,), "int32", data=_i("int32", 2, 2)), _ZERO_CROPS], (1, 2, 2, 2)),
    ],
)
def test_constant_parameters_in_bounds_accepted(
    builtin: int, x: tuple[int, ...], params: list[T], y: tuple[int, ...]
) -> None:
    assert parse_model_bytes(_with_params(builtin, x, params, y)).ops


def _opts(name: str, **fields: int) -> tuple[int, Callable[[flatbuffers.Builder], int]]:
    """``Op.options`` of builtin options table ``name`` (GatherOptions, ...) with ``fields`` set."""

    def write(b: flatbuffers.Builder) -> int:
        getattr(tflite, f"{name}Start")(b)
        for key, value in fields.items():
            getattr(tflite, f"{name}Add{key}")(b, value)
        return int(getattr(tflite, f"{name}End")(b))

    return getattr(tflite.BuiltinOptions, name), write


def _param_op(builtin: int, ins: list[T], outs: list[T], options: str = "", **fields: int) -> bytes:
    """One op from ``ins`` (the non-constant ones are the model's inputs) to ``outs``, int8 scale 0.05."""
    n = len(ins)
    return build_model(
        [*ins, *outs],
        [Op(builtin, list(range(n)), list(range(n, n + len(outs))),
            options=_opts(options, **fields) if options else None)],
        inputs=[i for i, t in enumerate(ins) if t.data is None],
        outputs=list(range(n, n + len(outs))),
    )  # fmt: skip


def _x(*shape: int, name: str = "x") -> T:
    return T(name, shape, "int8", 0.05, 0)


def _gather(idx: np.ndarray, out: tuple[int, ...], builtin: int = 36, x: tuple[int, ...] = (4, 3)) -> bytes:
    return _param_op(builtin, [_x(*x), T("idx", idx.shape, "int32", data=idx)], [_x(*out, name="y")])


def _split(builtin: int, outs: list[tuple[int, ...]]) -> bytes:
    axis = T("axis", (1,), "int32", data=_i("int32", 1))
    if builtin == 49:  # SPLIT: axis, input
        return _param_op(49, [axis, _x(2, 6)], [_x(*s, name=f"y{k}") for k, s in enumerate(outs)])
    sizes = T("sizes", (len(outs),), "int32", data=_i("int32", *(s[1] for s in outs)))
    return _param_op(102, [_x(2, 6), sizes, axis], [_x(*s, name=f"y{k}") for k, s in enumerate(outs)])


# (model, what the refusal names); each model's accepted twin is in PARAMS_OK
PARAMS_BAD = {
    "gather index past the axis": (_gather(_i("int32", 1, 4), (2, 3)), "index 4 of tensor 1 ('idx')"),
    "gather negative index": (_gather(_i("int32", -1), (1, 3)), "index -1 of tensor 1 ('idx')"),
    "gather output shape": (_gather(_i("int32", 1, 3), (1, 3)), "tensor 2 ('y') has shape [1, 3]"),
    "gather_nd index past a dim": (
        _gather(np.array([[0, 5]], np.int32), (1,), 107, (2, 3)),
        "index 5 of tensor 1 ('idx')",
    ),
    "concat axis": (
        _param_op(2, [_x(1, 3), _x(1, 2, name="z")], [_x(1, 5, name="y")], "ConcatenationOptions", Axis=2),
        "axis 2",
    ),
    "concat output too small": (
        _param_op(2, [_x(1, 3), _x(1, 2, name="z")], [_x(1, 4, name="y")], "ConcatenationOptions", Axis=1),
        "tensor 1 ('z') has shape [1, 2]; from its other",
    ),
    "concat other dim": (
        _param_op(2, [_x(2, 3), _x(1, 2, name="z")], [_x(2, 5, name="y")], "ConcatenationOptions", Axis=1),
        "tensor 1 ('z') has shape [1, 2]",
    ),
    "split unequal": (_split(49, [(2, 4), (2, 2)]), "tensor 2 ('y0') has shape [2, 4]"),
    "split_v sum": (_split(102, [(2, 4), (2, 3)]), "tensor 4 ('y1') has shape [2, 3]"),
    "pack values_count": (
        _param_op(83, [_x(2), _x(2, name="z")], [_x(2, 2, name="y")], "PackOptions", ValuesCount=3),
        "values_count=3",
    ),
    "pack axis": (
        _param_op(83, [_x(2), _x(2, name="z")], [_x(2, 2, name="y")], "PackOptions", ValuesCount=2, Axis=-3),
        "axis -3",
    ),
    "unpack num": (
        _param_op(88, [_x(2, 3)], [_x(3, name="y0"), _x(3, name="y1")], "UnpackOptions", Num=3),
        "num=3",
    ),
    "arg_max axis": (
        _param_op(56, [_x(2, 3), T("axis", (1,), "int32", data=_i("int32", 2))], [T("y", (2,), "int32")]),
        "axis 2",
    ),
}
PARAMS_OK = [
    _gather(_i("int32", 1, 3), (2, 3)),
    _gather(np.array([[1, 2]], np.int32), (1,), 107, (2, 3)),
    _param_op(2, [_x(1, 3), _x(1, 2, name="z")], [_x(1, 5, name="y")], "ConcatenationOptions", Axis=-1),
    _split(49, [(2, 3), (2, 3)]),
    _split(102, [(2, 4), (2, 2)]),
    _param_op(83, [_x(2), _x(2, name="z")], [_x(2, 2, name="y")], "PackOptions", ValuesCount=2, Axis=1),
    _param_op(88, [_x(2, 3)], [_x(3, name="y0"), _x(3, name="y1")], "UnpackOptions", Num=2),
    _param_op(56, [_x(2, 3), T("axis", (1,), "int32", data=_i("int32", -1))], [T("y", (2,), "int32")]),
]


@pytest.mark.parametrize("case", PARAMS_BAD)
def test_constant_parameters_the_kernels_trust_refused(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Indices, axes, counts and the shapes these ops copy between: TFLM's 1.3.8 kernels only DCHECK them
    (gather.cc:85-93, concatenation.h:39-51, split.cc:39-44, pack.cc:113 has no Prepare, ...) and read or
    write past the tensors; the host wheel's newer GATHER fails the invoke, the firmware's does not."""
    model, needle = PARAMS_BAD[case]
    path = tmp_path / "m.tflite"
    path.write_bytes(model)
    assert main(["inspect", str(path)]) == ExitCode.USAGE
    err = " ".join(capsys.readouterr().err.split())
    assert needle in err, err


@pytest.mark.parametrize("k", range(len(PARAMS_OK)))
def test_constant_parameters_in_range_accepted(k: int) -> None:
    assert parse_model_bytes(PARAMS_OK[k]).ops
