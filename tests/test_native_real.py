"""The native target on the real esp-tflite-micro and esp-nn sources (runs only when they are given).

Set ``ESP_CHECK_COMPONENTS_DIR`` to a directory holding esp-tflite-micro and esp-nn (checkouts with a
``version:`` in their idf_component.yml, or a project's managed_components/). CI has no component
sources, so there these tests skip and say why. The first build of both libraries takes ~12 minutes
on 2 cores; builds are cached in the user cache (or ``$ESP_CHECK_CACHE_DIR``), so later runs take
seconds per model. What is real: everything, from the generated firmware to the upstream kernels.

Expected results are recorded per esp-tflite-micro version (docs/native.md): 1.3.8 is bit-exact with
the host reference on the fixture models; 1.3.3's stale fully-connected wrapper (esp-tflite-micro#108)
puts both variants 232 LSB away from the host on cnn_classifier_11, and --tap names op 13.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.errors import ExitCode
from harness.firmware.native.components import component_version, find_components
from harness.firmware.native.project import NativeOptions
from harness.flows.flash_and_compare import flash_and_compare

COMPONENTS = os.environ.get("ESP_CHECK_COMPONENTS_DIR")
MODELS = Path(__file__).parent / "data" / "models"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.needs_cc,
    pytest.mark.skipif(
        not COMPONENTS,
        reason="ESP_CHECK_COMPONENTS_DIR is not set: no esp-tflite-micro / esp-nn sources to build natively "
        "(CI has none; see docs/native.md)",
    ),
]


def _tflm_version() -> str | None:
    assert COMPONENTS is not None
    tflm = next(c for c in find_components(COMPONENTS) if c.name == "espressif__esp-tflite-micro")
    return component_version(tflm.path)


@pytest.mark.parametrize(
    ("model", "inputs"),
    [
        ("cnn_classifier_11", ["cnn_classifier_11.png", "cnn_classifier_11__ambiguous.png"]),
        ("op_zoo", ["op_zoo.npy"]),
        ("unet_mbv2_035_48", ["unet_mbv2_035_48.png"]),
    ],
)
def test_real_components_three_way(model: str, inputs: list[str], tmp_path: Path) -> None:
    version = _tflm_version()
    tap = model == "cnn_classifier_11"
    res = flash_and_compare(
        MODELS / f"{model}.tflite",
        [MODELS / "inputs" / i for i in inputs],
        board="native-esp32",
        out_dir=tmp_path,
        native=NativeOptions(components_dir=Path(str(COMPONENTS))),
        tap=tap,
    )
    assert all(v.capture_valid for v in res.variants.values()), res.errors
    assert {r["tflm"] for r in res.native["reported"].values()} == {version}  # type: ignore[index]
    if version == "1.3.8":
        assert res.exit_code == ExitCode.MATCH, res.errors
    elif version == "1.3.3":
        if model != "cnn_classifier_11":
            pytest.skip("only cnn_classifier_11 has a recorded result on esp-tflite-micro 1.3.3")
        assert res.exit_code == ExitCode.MISMATCH
        opt_vs_ansi = [c for c in res.comparison.comparisons if {c.a, c.b} == {"optimized", "ansi"}]  # type: ignore[union-attr]
        assert opt_vs_ansi and all(c.match for c in opt_vs_ansi)  # the wrapper, not ESP-NN: both agree
        assert res.tap is not None and res.tap.culprit is not None
        assert (res.tap.culprit.op, res.tap.culprit.opcode) == (13, "FULLY_CONNECTED")
    else:
        pytest.skip(
            f"no recorded result for esp-tflite-micro {version} (docs/native.md lists 1.3.8 and 1.3.3)"
        )
