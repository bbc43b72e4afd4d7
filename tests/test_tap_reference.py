"""The per-op checksums the tap compares against (host_taps, TFLM reference kernels) checked against
evidence that does not come from TFLM itself: LiteRT's reference kernels (BUILTIN_REF, all tensors
preserved) op by op, and the golden outputs measured for the fixtures (tests/data/models/expected).

Known, measured discrepancy (tests/test_reference.py): on cnn_classifier_11__ambiguous, op 13
FULLY_CONNECTED differs by 1 LSB between TFLM and LiteRT, so there the two are NOT bit-exact and the
tap analysis must say exactly that op.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest

from harness.analysis.tap import first_divergence, host_taps
from harness.model.loader import load_model

pytest.importorskip("tflite_micro")
pytest.importorskip("ai_edge_litert")

CASES = [
    ("cnn_classifier_11", "cnn_classifier_11", None),
    ("cnn_classifier_11__ambiguous", "cnn_classifier_11", (13, "FULLY_CONNECTED")),
    ("op_zoo", "op_zoo", None),
    ("unet_mbv2_035_48", "unet_mbv2_035_48", None),
    ("unet_mbv2_035_64", "unet_mbv2_035_64", None),
    ("unet_mbv2_035_128", "unet_mbv2_035_128", None),
]


@pytest.mark.parametrize(("name", "model", "known"), CASES)
def test_host_taps_agree_with_litert_and_golden_outputs(
    models_dir: Path, name: str, model: str, known: tuple[int, str] | None
) -> None:
    path = models_dir / f"{model}.tflite"
    info = load_model(path)
    q = np.load(models_dir / "inputs" / f"{name}.q.npy")
    (tflm_ops,), (tflm_tensors,) = host_taps(info, path.read_bytes(), [q], backend="tflm")
    (lite_ops,), _ = host_taps(info, path.read_bytes(), [q], backend="litert")
    assert len(tflm_ops) == len(info.main_ops) and all(o.outputs for o in tflm_ops)
    d = first_divergence("tflm", tflm_ops, "litert", lite_ops)
    assert d.ops_compared == len(info.main_ops)
    if known is None:
        assert d.op is None, d.message  # bit-exact on every op's inputs and outputs
    else:
        assert (d.op, d.opcode, d.kind) == (*known, "output")
        # op 13 differs; op 14 (SOFTMAX) only because it reads op 13's output, and its own output
        # agrees again (the golden final output below is the same for both)
        assert d.differing_ops == [13, 14]
        assert tflm_ops[14].outputs == lite_ops[14].outputs
    # the final op outputs carry the golden outputs' CRCs (measured independently of this code)
    for k, t in enumerate(info.outputs):
        want = np.load(models_dir / "expected" / f"{name}.out{k}.npy")
        crc = f"{zlib.crc32(np.ascontiguousarray(want).tobytes()) & 0xFFFFFFFF:08X}"
        last = [c for o in tflm_ops for tt, c in o.outputs if tt == t.index]
        assert last and last[-1] == crc
        np.testing.assert_array_equal(tflm_tensors[t.index].reshape(want.shape), want)
