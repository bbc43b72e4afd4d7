"""The generated hybrid sources against the REAL headers of the pinned esp-tflite-micro and esp-nn.

Needs their source trees, which are not part of this repository: set ``ESP_CHECK_COMPONENTS_DIR`` to a
directory holding them (``esp-tflite-micro-v1.3.8`` and ``esp-nn-v1.1.2`` as unpacked release archives,
or ``esp-tflite-micro`` / ``esp-nn``, or ESP-IDF's ``managed_components`` with
``espressif__esp-tflite-micro`` / ``espressif__esp-nn``). Without them every test here is skipped, and
says why. ESP-IDF itself is stubbed (sdkconfig.h and the few IDF headers app_main.cc includes); the
upstream headers are included with ``-isystem`` because they do not build warning-free themselves.

- ``esp_check_hybrid.cc`` compiles with ``-std=c++17 -Wall -Wextra -Werror`` (and -O2, for the flow
  warnings) for the ESP32-S3 optimized and ANSI C builds, the ESP32 (generic C) and the ESP32-P4, and
  every ``esp_nn_*_ansi`` function it calls is defined by esp-nn's always-compiled C sources;
- ``app_main.cc`` of a hybrid project (with and without ``--tap``) passes ``-fsyntax-only`` against the
  real TFLM headers.
"""

# ruff: noqa: E501  (compiler command lines read better unwrapped)
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.firmware.generate import DEFAULT_VERSIONS, FirmwareFeatures, generate_projects

MODELS = Path(__file__).parent / "data" / "models"
CXX = shutil.which("g++") or shutil.which("c++")
CC = shutil.which("gcc") or shutil.which("cc")
ENV = "ESP_CHECK_COMPONENTS_DIR"


def _component(name: str, version: str) -> Path | None:
    """The source tree of component ``name`` at ``version`` under $ESP_CHECK_COMPONENTS_DIR, if there."""
    root = os.environ.get(ENV)
    if not root:
        return None
    for cand in (f"{name}-v{version}", f"{name}-{version}", name, f"espressif__{name}"):
        d = Path(root) / cand
        manifest = d / "idf_component.yml"
        if not d.is_dir():
            continue
        if cand.endswith(version) or not manifest.is_file():
            return d
        m = re.search(r"^version:\s*['\"]?([^'\"\s]+)", manifest.read_text(), re.MULTILINE)
        if m is None or m.group(1) == version:
            return d
    return None


TFLM = _component("esp-tflite-micro", DEFAULT_VERSIONS["tflm"])
ESPNN = _component("esp-nn", DEFAULT_VERSIONS["espnn"])
_WHY = (
    f"{ENV} is not set" if not os.environ.get(ENV)
    else f"no esp-tflite-micro {DEFAULT_VERSIONS['tflm']} / esp-nn {DEFAULT_VERSIONS['espnn']} source tree in ${ENV}"
)  # fmt: skip

pytestmark = [
    pytest.mark.needs_cc,
    pytest.mark.skipif(CXX is None or CC is None, reason="no host C/C++ compiler (gcc/g++) on PATH"),
    pytest.mark.skipif(TFLM is None or ESPNN is None, reason=f"needs the pinned component sources: {_WHY}"),
]

TARGETS = {  # name -> sdkconfig.h lines (what ESP-IDF generates for that target and ESP-NN choice)
    "esp32s3-optimized": ["CONFIG_IDF_TARGET_ESP32S3 1", "CONFIG_NN_OPTIMIZED 1"],
    "esp32s3-ansi": ["CONFIG_IDF_TARGET_ESP32S3 1", "CONFIG_NN_ANSI_C 1"],
    "esp32-optimized": ["CONFIG_IDF_TARGET_ESP32 1", "CONFIG_NN_OPTIMIZED 1"],
    "esp32p4-optimized": ["CONFIG_IDF_TARGET_ESP32P4 1", "CONFIG_NN_OPTIMIZED 1"],
}


def _includes() -> list[str]:
    assert TFLM is not None and ESPNN is not None
    dirs = [TFLM, TFLM / "third_party" / "flatbuffers" / "include", TFLM / "third_party" / "gemmlowp",
            TFLM / "third_party" / "ruy", ESPNN / "include"]  # fmt: skip
    return [arg for d in dirs for arg in ("-isystem", str(d))]


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(argv)}\n{proc.stderr[-4000:]}"
    return proc


def _sdkconfig(tmp: Path, lines: list[str]) -> Path:
    d = tmp / "sdk"
    d.mkdir(parents=True, exist_ok=True)
    text = "#pragma once\n" + "".join(f"#define {ln}\n" for ln in lines)
    (d / "sdkconfig.h").write_text(text + '#define CONFIG_IDF_TARGET "esp32s3"\n#define CONFIG_ESP_DEFAULT_CPU_FREQ_MHZ 240\n')
    return d


@pytest.fixture(scope="module")
def projects(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """op_zoo with every kind the wrapper handles on ANSI C, and the U-Net with the issue's ops."""
    tmp = tmp_path_factory.mktemp("hybrid-real")
    zoo = generate_projects(MODELS / "op_zoo.tflite", [MODELS / "inputs" / "op_zoo.npy"], "esp32s3-devkitc-1-n8r8",
                            out_dir=tmp / "zoo", variants=("optimized",), arena_kb=64,
                            features=FirmwareFeatures(ansi_ops=(0, 5, 8, 9, 13, 14, 21, 22)))  # fmt: skip
    unet = generate_projects(MODELS / "unet_mbv2_035_48.tflite", [MODELS / "inputs" / "unet_mbv2_035_48.png"],
                             "esp32s3-devkitc-1-n8r8", out_dir=tmp / "unet", variants=("optimized",), arena_kb=400,
                             features=FirmwareFeatures(tap=True, ansi_ops=(4, 17, 27, 54)))  # fmt: skip
    return {"zoo": zoo[0].path, "unet": unet[0].path}


@pytest.mark.parametrize("target", list(TARGETS))
def test_hybrid_source_compiles_warning_free_against_the_pinned_headers(
    tmp_path: Path, projects: dict[str, Path], target: str
) -> None:
    assert CXX is not None
    sdk = _sdkconfig(tmp_path, TARGETS[target])
    for name, proj in projects.items():
        obj = tmp_path / f"{name}.o"
        _run([CXX, "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", "-DTF_LITE_STATIC_MEMORY", "-I", str(sdk),
              "-I", str(proj / "main"), *_includes(), "-c", str(proj / "main" / "esp_check_hybrid.cc"), "-o", str(obj)])  # fmt: skip
        assert obj.stat().st_size > 0


def test_every_ansi_kernel_it_calls_is_in_esp_nns_always_compiled_sources(
    tmp_path: Path, projects: dict[str, Path]
) -> None:
    assert CXX is not None and CC is not None and ESPNN is not None
    sdk = _sdkconfig(tmp_path, TARGETS["esp32s3-optimized"])
    obj = tmp_path / "zoo.o"
    _run([CXX, "-std=c++17", "-DTF_LITE_STATIC_MEMORY", "-I", str(sdk), "-I", str(projects["zoo"] / "main"),
          *_includes(), "-c", str(projects["zoo"] / "main" / "esp_check_hybrid.cc"), "-o", str(obj)])  # fmt: skip
    needed = {ln.split()[-1] for ln in _run(["nm", "-u", str(obj)]).stdout.splitlines() if "esp_nn_" in ln}
    ansi = {s for s in needed if s.endswith("_ansi")}
    assert {"esp_nn_conv_s8_ansi", "esp_nn_depthwise_conv_s8_ansi", "esp_nn_add_elementwise_s8_ansi",
            "esp_nn_mul_elementwise_s8_ansi", "esp_nn_fully_connected_s8_ansi", "esp_nn_max_pool_s8_ansi",
            "esp_nn_avg_pool_s8_ansi", "esp_nn_softmax_s8_ansi"} <= ansi  # fmt: skip
    defined: set[str] = set()
    for src in sorted((ESPNN / "src").rglob("*_ansi.c")):  # esp-nn's CMakeLists compiles these on every target
        o = tmp_path / (src.stem + ".o")
        _run([CC, "-std=c99", "-O2", "-I", str(ESPNN / "include"), "-I", str(ESPNN / "src" / "common"), "-c",
              str(src), "-o", str(o)])  # fmt: skip
        defined |= {ln.split()[-1] for ln in _run(["nm", "--defined-only", str(o)]).stdout.splitlines()}
    assert ansi <= defined, f"not defined by esp-nn's ANSI C sources: {sorted(ansi - defined)}"


@pytest.mark.parametrize("tap", [False, True])
def test_hybrid_app_main_against_the_real_tflm_headers(tmp_path: Path, projects: dict[str, Path], tap: bool) -> None:
    from tests.test_generate_compile import STUBS

    assert CXX is not None
    proj = projects["unet"] if tap else projects["zoo"]
    stubs = tmp_path / "idf"
    idf = {k: v for k, v in STUBS.items() if not k.startswith("tensorflow/") and k != "sdkconfig.h"}
    idf["esp_cpu.h"] = '#include <stdint.h>\nextern "C" uint32_t esp_cpu_get_cycle_count(void);\n'
    for rel, text in idf.items():
        (stubs / rel).parent.mkdir(parents=True, exist_ok=True)
        (stubs / rel).write_text("#pragma once\n" + text)
    sdk = _sdkconfig(tmp_path, TARGETS["esp32s3-optimized"])
    _run([CXX, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-DTF_LITE_STATIC_MEMORY",
          '-DESP_CHECK_TFLM_VERSION="1.3.8"', '-DESP_CHECK_ESPNN_VERSION="1.1.2"', "-I", str(sdk), "-I", str(stubs),
          "-I", str(proj / "main"), *_includes(), str(proj / "main" / "app_main.cc")])  # fmt: skip
