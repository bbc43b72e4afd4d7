"""The generated ``--tap`` firmware: tables, memory overhead, and C++ validity of the op wrapper.

app_main.cc needs ESP-IDF and TFLM headers, which are not installed here; like
tests/test_generate_compile.py it is checked with ``g++ -fsyntax-only -Werror`` against STUB headers
(declarations of the documented APIs only): the stubs of that test, plus what the wrapper uses --
``TFLMRegistration`` (micro_common.h), ``TfLiteContext::GetEvalTensor``, ``TfLiteNode``,
``TfLiteEvalTensor``, ``MicroOpResolver::FindOp`` and ``esp_cpu_get_cycle_count`` (esp_cpu.h). This
catches template typos and misuse of those signatures, not differences from the real headers.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.errors import GenerateError
from harness.firmware.generate import generate_projects
from harness.model.loader import load_model
from harness.protocol.spec import TAP_RECORD_BYTES

MODELS = Path(__file__).parent / "data" / "models"
INPUTS = MODELS / "inputs"
CXX = shutil.which("g++") or shutil.which("c++")

TAP_STUBS = {
    "esp_cpu.h": '#include <stdint.h>\nextern "C" uint32_t esp_cpu_get_cycle_count(void);\n',
    "tensorflow/lite/micro/micro_common.h": """
#include "tensorflow/lite/c/common.h"
typedef struct { TfLiteIntArray* inputs; TfLiteIntArray* outputs; void* user_data; } TfLiteNode;
typedef struct { TfLitePtrUnion data; TfLiteIntArray* dims; TfLiteType type; } TfLiteEvalTensor;
struct TfLiteContext {
  TfLiteEvalTensor* (*GetEvalTensor)(const struct TfLiteContext* context, int tensor_idx);
};
struct TFLMRegistration {
  void* (*init)(TfLiteContext* context, const char* buffer, size_t length);
  void (*free)(TfLiteContext* context, void* buffer);
  TfLiteStatus (*prepare)(TfLiteContext* context, TfLiteNode* node);
  TfLiteStatus (*invoke)(TfLiteContext* context, TfLiteNode* node);
  void (*reset)(TfLiteContext* context, void* buffer);
  int32_t builtin_code;
  const char* custom_name;
};
""",
}


def _stub_headers(tmp: Path, model: str) -> Path:
    from tests.test_generate_compile import STUBS, _resolver_header

    ops = sorted(set(load_model(MODELS / f"{model}.tflite").distinct_ops))
    enum = ", ".join(f"BuiltinOperator_{op} = {k}" for k, op in enumerate(ops))
    resolver = _resolver_header().replace(
        "class MicroOpResolver {};",
        "class MicroOpResolver {\n public:\n"
        "  const TFLMRegistration* FindOp(BuiltinOperator op) const;\n"
        "  const TFLMRegistration* FindOp(const char* op) const;\n};",
    )
    resolver = resolver.replace(
        '#include "tensorflow/lite/c/common.h"\nnamespace tflite {',
        '#include "tensorflow/lite/c/common.h"\n#include "tensorflow/lite/micro/micro_common.h"\n'
        f"namespace tflite {{\nenum BuiltinOperator {{ {enum} }};",
    )
    files = {**STUBS, **TAP_STUBS, "tensorflow/lite/micro/micro_mutable_op_resolver.h": resolver}
    stubs = tmp / "stubs"
    for rel, text in files.items():
        (stubs / rel).parent.mkdir(parents=True, exist_ok=True)
        (stubs / rel).write_text("#pragma once\n" + text if not text.startswith("#pragma") else text)
    return stubs


@pytest.mark.needs_cc
@pytest.mark.skipif(CXX is None, reason="no host C++ compiler (g++) on PATH")
@pytest.mark.parametrize(("model", "dump"), [("unet_mbv2_035_48", [17, 53]), ("op_zoo", [])])
def test_tap_firmware_is_valid_cpp_with_wrapper(tmp_path: Path, model: str, dump: list[int]) -> None:
    inp = INPUTS / (f"{model}.png" if (INPUTS / f"{model}.png").exists() else f"{model}.npy")
    projects = generate_projects(
        MODELS / f"{model}.tflite", [inp], "esp32s3-devkitc-1-n8r8", out_dir=tmp_path / "p",
        arena_kb=400, tap=True, dump_ops=dump,
    )  # fmt: skip
    stubs = _stub_headers(tmp_path, model)
    assert CXX is not None
    for p in projects:
        src = (p.path / "main" / "app_main.cc").read_text()
        assert "TapInvoke" in src and "esp_cpu_get_cycle_count()" in src and "PrintTap(e, i);" in src
        nn = "CONFIG_NN_OPTIMIZED" if p.variant == "optimized" else "CONFIG_NN_ANSI_C"
        proc = subprocess.run(
            [CXX, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", f"-D{nn}=1",
             '-DESP_CHECK_TFLM_VERSION="1.3.8"', '-DESP_CHECK_ESPNN_VERSION="1.1.2"',
             "-I", str(stubs), "-I", str(p.path / "main"), str(p.path / "main" / "app_main.cc")],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]


def test_tap_tables_and_reported_memory_overhead(tmp_path: Path) -> None:
    info = load_model(MODELS / "unet_mbv2_035_48.tflite")
    (p,) = generate_projects(
        MODELS / "unet_mbv2_035_48.tflite", [INPUTS / "unet_mbv2_035_48.png"], "esp32s3-devkitc-1-n8r8",
        out_dir=tmp_path, variants=("optimized",), tap=True, dump_ops=[17],
    )  # fmt: skip
    man = json.loads(p.manifest_path.read_text())["tap"]
    # op 17 reads tensor 119 (1x6x6x16) and writes 120 (1x6x6x96): both dumped
    assert man["dump_ops"] == [17] and man["dump_ram_bytes"] == 6 * 6 * 16 + 6 * 6 * 96
    assert man["records_ram_bytes"] == TAP_RECORD_BYTES * len(info.main_ops)
    assert man["ram_bytes"] == man["records_ram_bytes"] + man["dump_ram_bytes"]
    src = (p.path / "main" / "app_main.cc").read_text()
    assert f"constexpr int kTapOps = {len(info.main_ops)};" in src
    assert f"constexpr size_t kTapRamBytes = {man['ram_bytes']};" in src
    # op 9 (ADD) reads the two non-constant tensors 108 and 111; weights are never checksummed
    row9 = re.search(
        r"\{ (\d+), 2, 1, \{ (\d+), (\d+), 0, 0 \}, \{ (\d+), 0, 0, 0 \}, \"ADD\" \},  // op 9", src
    )
    assert row9 is not None
    table = src[src.index("const TapTensorSpec kTapTensors[] = {") : src.index("struct TapOpSpec")]
    slots = [int(m) for m in re.findall(r"^    \{ (\d+), \d", table, flags=re.M)]
    got = [slots[int(row9.group(k))] for k in (2, 3, 4)]
    assert got == [108, 111, 112]
    assert all(not info.tensors[t].is_constant for t in slots)
    # without --tap the firmware has no wrapper at all (and so a different build cache key)
    (plain,) = generate_projects(
        MODELS / "unet_mbv2_035_48.tflite", [INPUTS / "unet_mbv2_035_48.png"], "esp32s3-devkitc-1-n8r8",
        out_dir=tmp_path / "plain", variants=("optimized",),
    )  # fmt: skip
    plain_src = (plain.path / "main" / "app_main.cc").read_text()
    assert "TapInvoke" not in plain_src and "esp_cpu.h" not in plain_src
    assert "tap" not in json.loads(plain.manifest_path.read_text())


def test_dump_ops_out_of_range_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(GenerateError, match=r"ops 0\.\.65"):
        generate_projects(
            MODELS / "unet_mbv2_035_48.tflite", [INPUTS / "unet_mbv2_035_48.png"], "esp32s3-devkitc-1-n8r8",
            out_dir=tmp_path, tap=True, dump_ops=[66],
        )  # fmt: skip
