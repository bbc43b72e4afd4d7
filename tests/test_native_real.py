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
import shutil
from pathlib import Path

import pytest

from harness.errors import ExitCode
from harness.firmware.native.components import component_version, find_components
from harness.firmware.native.project import NativeOptions
from harness.flows.flash_and_compare import flash_and_compare
from harness.flows.job import JobOptions

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


# What docs/native.md records per esp-tflite-micro version (esp-nn 1.1.2, 64-bit native board).
EXPECTED = {
    "1.3.8": {
        "cnn_classifier_11": ExitCode.MATCH,
        "op_zoo": ExitCode.MATCH,
        "unet_mbv2_035_48": ExitCode.MATCH,
    },
    # the stale FC wrapper (both variants 232 LSB off the host); the conv Init bug aborting softmax Prepare
    "1.3.3": {
        "cnn_classifier_11": ExitCode.MISMATCH,
        "op_zoo": ExitCode.FIRMWARE_FAULT,
        "unet_mbv2_035_48": ExitCode.MATCH,
    },
}


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
    if version not in EXPECTED:
        pytest.skip(
            f"no recorded result for esp-tflite-micro {version} (docs/native.md lists 1.3.8 and 1.3.3)"
        )
    res = flash_and_compare(
        MODELS / f"{model}.tflite",
        [MODELS / "inputs" / i for i in inputs],
        board="native-esp32",
        out_dir=tmp_path,
        options=JobOptions(
            native=NativeOptions(components_dir=Path(str(COMPONENTS))), tap=model == "cnn_classifier_11"
        ),
    )
    assert res.exit_code == EXPECTED[version][model], res.errors
    if res.exit_code == ExitCode.FIRMWARE_FAULT:  # a crash in both variants, named by the native board
        for v in res.variants.values():
            assert v.findings and v.findings[0]["kind"] == "native_exit", v.findings
        return
    assert all(v.capture_valid for v in res.variants.values()), res.errors
    assert res.native is not None and {r["tflm"] for r in res.native["reported"].values()} == {version}
    if res.exit_code == ExitCode.MISMATCH:
        assert res.comparison is not None
        opt_vs_ansi = [c for c in res.comparison.comparisons if {c.a, c.b} == {"optimized", "ansi"}]
        assert opt_vs_ansi and all(c.match for c in opt_vs_ansi)  # the wrapper, not ESP-NN: both agree
        assert res.tap is not None and res.tap.culprit is not None
        assert (res.tap.culprit.op, res.tap.culprit.opcode) == (13, "FULLY_CONNECTED")


def test_bisection_on_a_depthwise_fault_gets_a_verified_reproducer(tmp_path: Path) -> None:
    """Regression: on a native board with a fault in esp-nn's depthwise kernel, ``hybrid --bisect``
    said of its one-op reproducer "NOT verified: the dump run captured no input of this op": the
    reproducer's dump run was built without the run's ``--components-dir`` (so from the component
    manager, offline: no build, no capture). What is faked: the fault, one line injected into a copy of
    the given esp-nn's optimized depthwise kernel (every fourth channel's value XOR 0x55)."""
    from harness.flows.hybrid import HybridOptions, hybrid

    assert COMPONENTS is not None
    comps = tmp_path / "components"
    comps.mkdir()
    for c in find_components(COMPONENTS):
        shutil.copytree(c.path, comps / c.path.name, symlinks=True)
    kernel = next(comps.glob("*/src/convolution/esp_nn_depthwise_conv_opt.c"))
    store = "\n                out_data[out_idx++] = result0;\n"
    text = kernel.read_text(encoding="utf-8")
    assert text.count(store) == 1, "esp-nn's depthwise store moved: update the injected fault"
    fault = "\n                out_data[out_idx++] = (int8_t)(result0 ^ 0x55);\n"  # every 4th channel wrong
    kernel.write_text(text.replace(store, fault), encoding="utf-8")
    res = hybrid(
        MODELS / "cnn_classifier_11.tflite",
        [MODELS / "inputs" / "cnn_classifier_11__ambiguous.png"],
        board="native-esp32",
        out_dir=tmp_path / "out",
        options=HybridOptions(bisect=True),
        job=JobOptions(native=NativeOptions(components_dir=comps)),
    )
    assert res.offered, (res.message, res.errors)
    culprits = [c["op"] for c in res.culprits]
    assert culprits and {c["kind"] for c in res.culprits} == {"DEPTHWISE_CONV_2D"}
    assert [r["op"] for r in res.repro] == culprits and all(r["ok"] for r in res.repro), res.repro
    for r in res.repro:
        assert r["host_equals_ansi"], r
        assert (Path(r["dir"]) / "model.tflite").is_file() and (Path(r["dir"]) / "input_0.npy").is_file()
    # the first culprit shows the fault from the input both builds read (a later one's input was changed)
    assert res.repro[0]["optimized_read_same_input"] and res.repro[0]["optimized_differs"], res.repro[0]
