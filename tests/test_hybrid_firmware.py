"""The hybrid firmware as generated: the wrapper table, the resolver lines, the manifest, the simulator's
reading of the compiled table, and app_main.cc with the wrapper against stub headers.

Real: the generator, the templates, the sim builder's image packing, g++. Faked: ESP-IDF/TFLM headers in
the stub compile (declarations only; tests/test_hybrid_compile.py uses the real esp-tflite-micro and
esp-nn headers when ESP_CHECK_COMPONENTS_DIR points at them).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.errors import UsageError
from harness.firmware.generate import FirmwareFeatures, generate_projects
from harness.firmware.hybrid_context import readme_snippet, registration_lines
from harness.model.hybrid_ops import ANSI_KINDS
from harness.model.loader import load_model
from harness.model.opdata import FAMILY_CHIPS, espnn_ops
from harness.resources import templates_dir
from harness.sim.image import hybrid_table

MODELS = Path(__file__).parent / "data" / "models"
UNET = MODELS / "unet_mbv2_035_48.tflite"
UNET_IN = MODELS / "inputs" / "unet_mbv2_035_48.png"
CXX = shutil.which("g++") or shutil.which("c++")


def _gen(tmp: Path, ops: tuple[int, ...], variants: tuple[str, ...] = ("optimized",), tap: bool = False):  # type: ignore[no-untyped-def]
    return generate_projects(UNET, [UNET_IN], "sim", out_dir=tmp, variants=variants,
                             features=FirmwareFeatures(tap=tap, ansi_ops=ops))  # fmt: skip


def test_wrapper_table_maps_each_node_to_its_output_tensor(tmp_path: Path) -> None:
    (p,) = _gen(tmp_path, (27, 4, 17))
    info = load_model(UNET)
    main = p.path / "main"
    assert {"main/esp_check_hybrid.h", "main/esp_check_hybrid.cc"} <= set(p.files)
    assert p.manifest["hybrid"] == {"ansi_ops": [4, 17, 27], "kinds": ["DEPTHWISE_CONV_2D", "CONV_2D", "ADD"]}
    src = (main / "esp_check_hybrid.cc").read_text()
    rows = re.findall(r"\{ (\d+), (\d+), (k\w+), (\d+) \},", src)
    assert [(int(a), int(b), k, int(s)) for a, b, k, s in rows] == [
        (4, info.main_ops[4].outputs[0], "kDepthwise", 0),
        (17, info.main_ops[17].outputs[0], "kConv", 1),
        (27, info.main_ops[27].outputs[0], "kAdd", 0),
    ]
    assert "constexpr int kConvStates = 2;" in src and "constexpr int kSoftmaxStates = 0;" in src
    assert '#include "sdkconfig.h"' in src.split('#include "esp_nn.h"')[0]  # Kconfig visible to esp_nn.h
    # the header is the template, verbatim
    assert (main / "esp_check_hybrid.h").read_bytes() == (
        Path(__file__).parents[1] / "firmware_templates" / "hybrid" / "esp_check_hybrid.h"
    ).read_bytes()
    app = (main / "app_main.cc").read_text()
    assert "resolver.AddConv2D(esp_check_hybrid::Register_CONV_2D())" in app
    assert "resolver.AddAdd(esp_check_hybrid::Register_ADD())" in app
    assert "resolver.AddConcatenation()" in app  # kinds without an ANSI C op keep the plain registration
    assert '"esp_check_hybrid.cc"' in (main / "CMakeLists.txt").read_text()
    assert hybrid_table(p.path) == [[4, 107, "kDepthwise"], [17, 120, "kConv"], [27, 130, "kAdd"]]


def test_the_switchable_kinds_are_esp_nns_kernels_each_wrapped_once() -> None:
    """ANSI_KINDS holds only what ops.toml does not, the wrapper's kind enumerators: its kinds are the
    kernels ESP-NN accelerates on some chip (ops.toml), each declared in the header and wrapped under
    its enumerator in the source, the Register_<opcode> that register_args names."""
    assert set(ANSI_KINDS) == {op for chip in FAMILY_CHIPS for op in espnn_ops(chip)}
    root = templates_dir() / "hybrid"
    header, source = (root / "esp_check_hybrid.h").read_text(), (root / "esp_check_hybrid.cc.j2").read_text()
    for opcode, enum in ANSI_KINDS.items():
        assert f"TFLMRegistration Register_{opcode}();" in header
        assert f"Register_{opcode}() {{ return Wrap<{enum}>(tflite::Register_{opcode}()); }}" in source
        assert re.search(rf"^    {enum}\b", source, re.MULTILINE), enum  # an enumerator of enum Kind


def test_plain_firmware_has_no_wrapper_and_variants_differ_only_in_the_nn_setting(tmp_path: Path) -> None:
    (plain,) = _gen(tmp_path / "plain", ())
    assert "hybrid" not in plain.manifest and not any("hybrid" in f for f in plain.files)
    assert "esp_check_hybrid" not in (plain.path / "main" / "app_main.cc").read_text()
    assert hybrid_table(plain.path) is None
    opt, ansi = _gen(tmp_path / "both", (17,), variants=("optimized", "ansi"))
    differ = [f for f in opt.files if (opt.path / f).read_bytes() != (ansi.path / f).read_bytes()]
    assert differ == ["sdkconfig.defaults"]


def test_generate_refuses_ops_the_wrapper_cannot_switch(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"op 48 .RESIZE_NEAREST_NEIGHBOR. has no ESP-NN kernel"):
        _gen(tmp_path, (48,))
    with pytest.raises(UsageError, match=r"ops 0..65"):
        _gen(tmp_path, (99,))


def test_readme_snippet_has_the_resolver_lines_of_the_model() -> None:
    from harness.firmware.hybrid_context import hybrid_firmware_context
    from harness.model.opdata import resolver_methods

    info = load_model(UNET)
    ctx = hybrid_firmware_context(info, (17,), model_name="unet.tflite", model_sha256=info.sha256)
    assert ctx is not None
    lines = registration_lines(ctx, resolver_methods(info))
    assert lines[:3] == ["resolver.AddConv2D(esp_check_hybrid::Register_CONV_2D());",
                         "resolver.AddDepthwiseConv2D();", "resolver.AddAdd();"]  # fmt: skip
    text = readme_snippet(ctx, resolver_methods(info), evidence="verified")
    assert "MicroMutableOpResolver<6>" in text and "op 17 (CONV_2D)" in text and text.endswith("verified\n")


def _stubs(tmp: Path) -> Path:
    """The tap tests' stub headers (TFLM, IDF), with Add* methods that take an optional registration, as
    the pinned esp-tflite-micro's MicroMutableOpResolver does."""
    from tests.test_tap_firmware import _stub_headers

    stubs = _stub_headers(tmp, "unet_mbv2_035_48")
    header = stubs / "tensorflow" / "lite" / "micro" / "micro_mutable_op_resolver.h"
    header.write_text(re.sub(
        r"TfLiteStatus (Add\w+)\(\) \{ return kTfLiteOk; \}",
        r"TfLiteStatus \1(const TFLMRegistration& r = TFLMRegistration()) { (void)r; return kTfLiteOk; }",
        header.read_text(),
    ))  # fmt: skip
    return stubs


@pytest.mark.needs_cc
@pytest.mark.skipif(CXX is None, reason="no host C++ compiler (g++) on PATH")
@pytest.mark.parametrize("tap", [False, True])
def test_hybrid_app_main_is_valid_cpp_against_stub_headers(tmp_path: Path, tap: bool) -> None:
    (p,) = _gen(tmp_path / "p", (4, 17, 27), tap=tap)
    stubs = _stubs(tmp_path)
    assert "esp_check_hybrid::Register_CONV_2D()" in (p.path / "main" / "app_main.cc").read_text()
    assert CXX is not None
    proc = subprocess.run(
        [CXX, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-DCONFIG_NN_OPTIMIZED=1",
         '-DESP_CHECK_TFLM_VERSION="1.3.8"', '-DESP_CHECK_ESPNN_VERSION="1.1.2"', "-I", str(stubs),
         "-I", str(p.path / "main"), str(p.path / "main" / "app_main.cc")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
