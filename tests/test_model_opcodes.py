"""Operator codes written both ways: deprecated_builtin_code set (TF converter) or only builtin_code.

TFLM's model_editor and other non-TensorFlow writers set only the int32 ``builtin_code`` and leave
the int8 ``deprecated_builtin_code`` at its default 0 (absent from the flatbuffer). The ``tflite``
package's ``OperatorCode.BuiltinCode()`` then answers with the deprecated field (0 = ADD) for every
code below 127. The schema's rule, which TFLM's GetBuiltinCode applies, is
max(deprecated_builtin_code, builtin_code) over the raw fields.
"""

from __future__ import annotations

from collections.abc import Callable

import flatbuffers
import numpy as np
import pytest
import tflite
from test_model_builder import Op, T, build_model

from harness.model import arena, opdata
from harness.model.backends import tflm_available
from harness.model.extract import single_op_model as single_op_model_of
from harness.model.loader import parse_model_bytes
from harness.model.reference import run_reference

CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED = 3, 4, 9
_RNG = np.random.default_rng(11)


def _conv_options(b: flatbuffers.Builder) -> int:
    tflite.Conv2DOptionsStart(b)
    tflite.Conv2DOptionsAddPadding(b, tflite.Padding.SAME)
    tflite.Conv2DOptionsAddStrideW(b, 1)
    tflite.Conv2DOptionsAddStrideH(b, 1)
    tflite.Conv2DOptionsAddDilationWFactor(b, 1)
    tflite.Conv2DOptionsAddDilationHFactor(b, 1)
    return int(tflite.Conv2DOptionsEnd(b))


def _dw_options(b: flatbuffers.Builder) -> int:
    tflite.DepthwiseConv2DOptionsStart(b)
    tflite.DepthwiseConv2DOptionsAddPadding(b, tflite.Padding.SAME)
    tflite.DepthwiseConv2DOptionsAddStrideW(b, 1)
    tflite.DepthwiseConv2DOptionsAddStrideH(b, 1)
    tflite.DepthwiseConv2DOptionsAddDepthMultiplier(b, 1)
    tflite.DepthwiseConv2DOptionsAddDilationWFactor(b, 1)
    tflite.DepthwiseConv2DOptionsAddDilationHFactor(b, 1)
    return int(tflite.DepthwiseConv2DOptionsEnd(b))


def _fc_options(b: flatbuffers.Builder) -> int:
    tflite.FullyConnectedOptionsStart(b)
    tflite.FullyConnectedOptionsAddFusedActivationFunction(b, 0)
    return int(tflite.FullyConnectedOptionsEnd(b))


_OPTIONS: dict[int, tuple[int, Callable[[flatbuffers.Builder], int]]] = {
    CONV_2D: (tflite.BuiltinOptions.Conv2DOptions, _conv_options),
    DEPTHWISE_CONV_2D: (tflite.BuiltinOptions.DepthwiseConv2DOptions, _dw_options),
    FULLY_CONNECTED: (tflite.BuiltinOptions.FullyConnectedOptions, _fc_options),
}
_SHAPES = {  # input, filter, output
    CONV_2D: ((1, 6, 6, 8), (4, 3, 3, 8), (1, 6, 6, 4)),
    DEPTHWISE_CONV_2D: ((1, 6, 6, 16), (1, 3, 3, 16), (1, 6, 6, 16)),
    FULLY_CONNECTED: ((1, 12), (5, 12), (1, 5)),
}


def single_op_model(code: int, *, builtin_only: bool) -> bytes:
    """One int8 op with int8 weights and int32 bias; ``builtin_only``: deprecated code left at 0."""
    in_shape, w_shape, out_shape = _SHAPES[code]
    channels = out_shape[-1]
    rng = np.random.default_rng(code)  # the same weights both ways
    weights = rng.integers(-127, 128, size=w_shape, dtype=np.int8)
    bias = rng.integers(-500, 500, size=(channels,), dtype=np.int32)
    return build_model(
        [
            T("x", in_shape, "int8", 0.05, -3),
            T("w", w_shape, "int8", 0.02, 0, data=weights),
            T("b", (channels,), "int32", 0.05 * 0.02, 0, data=bias),
            T("y", out_shape, "int8", 0.4, 5),
        ],
        [Op(code, [0, 1, 2], [3], deprecated=0 if builtin_only else code, options=_OPTIONS[code])],
        inputs=[0],
        outputs=[3],
    )


CASES = [
    (CONV_2D, "CONV_2D", "AddConv2D"),
    (DEPTHWISE_CONV_2D, "DEPTHWISE_CONV_2D", "AddDepthwiseConv2D"),
    (FULLY_CONNECTED, "FULLY_CONNECTED", "AddFullyConnected"),
]


@pytest.mark.parametrize(("code", "name", "method"), CASES)
def test_builtin_code_only_is_read_like_tflm(code: int, name: str, method: str) -> None:
    old, new = single_op_model(code, builtin_only=False), single_op_model(code, builtin_only=True)
    # The file really is written the model_editor way: the tflite package's accessor reads it as 0.
    oc = tflite.Model.GetRootAsModel(new, 0).OperatorCodes(0)
    assert oc.DeprecatedBuiltinCode() == 0 and oc.BuiltinCode() == 0
    for data in (old, new):
        info = parse_model_bytes(data)
        assert [op.opcode for op in info.ops] == [name]
        assert opdata.resolver_methods(info) == (method,)
        accel = opdata.espnn_model_acceleration(info, "esp32s3")
        assert [a.accelerated for a in accel] == [True]
    if code != FULLY_CONNECTED:  # ESP-NN's S3 conv kernels request scratch; ADD would need none
        assert arena.espnn_scratch_bound(parse_model_bytes(new), "esp32s3") > 0
        assert arena.espnn_scratch_bound(parse_model_bytes(new), "esp32s3") == arena.espnn_scratch_bound(
            parse_model_bytes(old), "esp32s3"
        )


@pytest.mark.needs_tflm
@pytest.mark.skipif(not tflm_available(), reason="tflite-micro wheel not installed")
@pytest.mark.parametrize(("code", "name", "method"), CASES)
def test_tflm_runs_both_encodings_alike(code: int, name: str, method: str) -> None:
    """TFLM itself reads both files as the same op: same outputs (and not all zero)."""
    x = _RNG.integers(-128, 128, size=_SHAPES[code][0], dtype=np.int8)
    a = run_reference(single_op_model(code, builtin_only=False), [[x]]).runs[0].outputs[0]
    b = run_reference(single_op_model(code, builtin_only=True), [[x]]).runs[0].outputs[0]
    assert a.shape == _SHAPES[code][2]
    assert np.array_equal(a, b) and len(np.unique(a)) > 1


@pytest.mark.parametrize(("code", "name", "method"), CASES)
def test_an_extracted_op_keeps_its_code_written_either_way(code: int, name: str, method: str) -> None:
    """The one-op reproducer of a model_editor-style file is the same op, not ADD (tflite's accessor
    answers 0 there, so the extractor must copy the raw fields)."""
    for builtin_only in (False, True):
        one = single_op_model_of(single_op_model(code, builtin_only=builtin_only), 0)
        assert [op.opcode for op in parse_model_bytes(one).ops] == [name]
