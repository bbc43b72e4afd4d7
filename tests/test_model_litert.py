"""A model LiteRT rejects is a model problem (exit 2), and the one rejection TFLM's
stock person_detect hits (1-D bias tensors that carry the filter's quantized_dimension 3) is made valid
before LiteRT reads the model, so LiteRT-only platforms get a host reference for it.

Real LiteRT (`ai-edge-litert`, BUILTIN_REF) and real TFLM run on models written by the test builder;
nothing is faked."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from test_model_builder import CONV_2D, Op, T, build_model, conv2d_options

from harness.errors import ExitCode, ModelError
from harness.model.backends import litert_compatible
from harness.model.loader import parse_model_bytes
from harness.model.reference import run_reference

needs_litert = pytest.mark.skipif(
    importlib.util.find_spec("ai_edge_litert") is None, reason="ai-edge-litert is not installed here"
)
needs_tflm = pytest.mark.skipif(
    importlib.util.find_spec("tflite_micro") is None, reason="tflite-micro is not installed here"
)


def _conv(bias_qdim: int, out_qdim: int | None = None) -> bytes:
    """int8 1x1 CONV_2D with per-channel filter and bias scales, as the converter writes them; the bias
    (1-D) carries ``bias_qdim``, the output ``out_qdim`` if given."""
    rng = np.random.default_rng(3)
    oc, c, s_in = 4, 3, 1 / 128
    fs = (0.02, 0.03, 0.01, 0.04)
    return build_model(
        [
            T("image", (1, 5, 5, c), "int8", s_in, -1),
            T("filter", (oc, 1, 1, c), "int8", data=rng.integers(-127, 128, (oc, 1, 1, c)), scales=fs,
              qdim=0),
            T("bias", (oc,), "int32", data=rng.integers(-900, 900, (oc,)),
              scales=tuple(s_in * f for f in fs), qdim=bias_qdim),
            T("out", (1, 5, 5, oc), "int8", 0.05, 2, qdim=out_qdim),
        ],
        [Op(CONV_2D, [0, 1, 2], [3], options=conv2d_options())],
        inputs=[0],
        outputs=[3],
    )  # fmt: skip


def test_the_rewrite_touches_only_a_1d_tensors_dimension() -> None:
    fixed = parse_model_bytes(litert_compatible(_conv(bias_qdim=3)))
    assert fixed.tensors[2].quantized_dimension == 0
    assert parse_model_bytes(_conv(bias_qdim=3)).tensors[2].quantized_dimension == 3
    assert litert_compatible(_conv(bias_qdim=0)) == _conv(bias_qdim=0)


@needs_litert
@needs_tflm
def test_litert_gives_a_reference_for_person_detect_style_biases_equal_to_tflm() -> None:
    model = _conv(bias_qdim=3)
    x = np.random.default_rng(0).integers(-128, 128, (1, 5, 5, 3), dtype=np.int8)
    lite = run_reference(model, [[x]], backend="litert").runs[0].outputs[0]
    tflm = run_reference(model, [[x]], backend="tflm").runs[0].outputs[0]
    assert np.array_equal(lite, tflm) and lite.dtype == np.int8


@needs_litert
def test_a_model_litert_still_rejects_is_exit_2() -> None:
    # a 4-D output's dimension 7 (TFLM never reads it): no rewrite can guess. Not the filter's: TFLM
    # reads filter->dims->data[7] (kernel_util.cc:246), so the loader refuses that before LiteRT runs
    model = _conv(bias_qdim=0, out_qdim=7)
    x = np.zeros((1, 5, 5, 3), np.int8)
    with pytest.raises(ModelError, match="LiteRT rejected the model") as exc:
        run_reference(model, [[x]], backend="litert")
    assert exc.value.exit_code == ExitCode.USAGE
