"""The generated hybrid sources against the REAL headers of the pinned esp-tflite-micro and esp-nn.

Needs their source trees, which are not part of this repository: set ``ESP_CHECK_COMPONENTS_DIR`` to a
directory holding them (``esp-tflite-micro-v1.3.8`` and ``esp-nn-v1.1.2`` as unpacked release archives,
or ``esp-tflite-micro`` / ``esp-nn``, or ESP-IDF's ``managed_components`` with
``espressif__esp-tflite-micro`` / ``espressif__esp-nn``). Without them the real-source tests are
skipped, and say why; the stand-in sdkconfig.h is still checked (it is generated from the project's own
sdkconfig.defaults through the native target's Kconfig stand-in, as the native build makes the real one). ESP-IDF itself is stubbed (sdkconfig.h and the few IDF headers app_main.cc includes); the
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
from harness.firmware.native.config import parse_defaults, resolve, sdkconfig_h

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
]
needs_sources = pytest.mark.skipif(
    TFLM is None or ESPNN is None, reason=f"needs the pinned component sources: {_WHY}"
)

TARGETS = {  # name -> (CONFIG_IDF_TARGET, the ESP-NN Kconfig choice) over the project's own defaults
    "esp32s3-optimized": ("esp32s3", "CONFIG_NN_OPTIMIZED"),
    "esp32s3-ansi": ("esp32s3", "CONFIG_NN_ANSI_C"),
    "esp32-optimized": ("esp32", "CONFIG_NN_OPTIMIZED"),
    "esp32p4-optimized": ("esp32p4", "CONFIG_NN_OPTIMIZED"),
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


def _sdkconfig(tmp: Path, project: Path, target: str) -> Path:
    """The stand-in sdkconfig.h, made from the same source as the real one: the generated project's own
    sdkconfig.defaults, through the native target's Kconfig stand-in (harness/firmware/native/config.py),
    with only the target and the ESP-NN choice set as ``TARGETS[target]`` says."""
    idf_target, nn = TARGETS[target]
    defaults = parse_defaults((project / "sdkconfig.defaults").read_text(encoding="utf-8"))
    defaults = {k: v for k, v in defaults.items() if k not in ("CONFIG_NN_OPTIMIZED", "CONFIG_NN_ANSI_C")}
    defaults.update({"CONFIG_IDF_TARGET": f'"{idf_target}"', nn: "y"})
    d = tmp / "sdk"
    d.mkdir(parents=True, exist_ok=True)
    (d / "sdkconfig.h").write_text(sdkconfig_h(resolve(defaults)), encoding="utf-8")
    return d


_USE = re.compile(r"\bCONFIG_[A-Z0-9_]+\b")


def test_the_stand_in_sdkconfig_defines_every_symbol_the_generated_sources_use(
    tmp_path: Path, projects: dict[str, Path]
) -> None:
    # regression: the hand-written stand-in lacked CONFIG_ESP_CONSOLE_UART_NUM, which app_main.cc
    # uses since the resident loop, and nothing noticed (the real-source tests are skipped without sources).
    # Runs without them: every CONFIG_ symbol the generated sources use outside a preprocessor test
    # (#if / #ifdef / defined(...)) must be defined by the stand-in.
    for name, proj in projects.items():
        header = (_sdkconfig(tmp_path / name, proj, "esp32s3-optimized") / "sdkconfig.h").read_text()
        defined = set(re.findall(r"^#define (CONFIG_[A-Z0-9_]+)", header, re.MULTILINE))
        used = set()
        for src in (proj / "main").glob("*.[ch]*"):
            code = re.sub(r"/\*.*?\*/", " ", src.read_text(encoding="utf-8"), flags=re.DOTALL)
            for line in code.splitlines():
                line = re.sub(r'"(?:[^"\\]|\\.)*"', '""', line).split("//")[0]  # strings, comments out
                if not line.lstrip().startswith("#"):
                    used |= set(_USE.findall(line))
        assert used and used <= defined, f"{name}: not in the stand-in sdkconfig.h: {sorted(used - defined)}"


@pytest.fixture(scope="module")
def projects(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """op_zoo with every kind the wrapper handles on ANSI C, and the U-Net 48 (docs/hybrid.md's worked example)."""
    tmp = tmp_path_factory.mktemp("hybrid-real")
    zoo = generate_projects(MODELS / "op_zoo.tflite", [MODELS / "inputs" / "op_zoo.npy"], "esp32s3-devkitc-1-n8r8",
                            out_dir=tmp / "zoo", variants=("optimized",), arena_kb=64,
                            features=FirmwareFeatures(ansi_ops=(0, 5, 8, 9, 13, 14, 21, 22)))  # fmt: skip
    unet = generate_projects(MODELS / "unet_mbv2_035_48.tflite", [MODELS / "inputs" / "unet_mbv2_035_48.png"],
                             "esp32s3-devkitc-1-n8r8", out_dir=tmp / "unet", variants=("optimized",), arena_kb=400,
                             features=FirmwareFeatures(tap=True, ansi_ops=(4, 17, 27, 54)))  # fmt: skip
    return {"zoo": zoo[0].path, "unet": unet[0].path}


@needs_sources
@pytest.mark.parametrize("target", list(TARGETS))
def test_hybrid_source_compiles_warning_free_against_the_pinned_headers(
    tmp_path: Path, projects: dict[str, Path], target: str
) -> None:
    assert CXX is not None
    for name, proj in projects.items():
        sdk = _sdkconfig(tmp_path / name, proj, target)
        obj = tmp_path / f"{name}.o"
        _run([CXX, "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", "-DTF_LITE_STATIC_MEMORY", "-I", str(sdk),
              "-I", str(proj / "main"), *_includes(), "-c", str(proj / "main" / "esp_check_hybrid.cc"), "-o", str(obj)])  # fmt: skip
        assert obj.stat().st_size > 0


@needs_sources
def test_every_ansi_kernel_it_calls_is_in_esp_nns_always_compiled_sources(
    tmp_path: Path, projects: dict[str, Path]
) -> None:
    assert CXX is not None and CC is not None and ESPNN is not None
    sdk = _sdkconfig(tmp_path, projects["zoo"], "esp32s3-optimized")
    obj = tmp_path / "zoo.o"
    _run([CXX, "-std=c++17", "-DTF_LITE_STATIC_MEMORY", "-I", str(sdk), "-I", str(projects["zoo"] / "main"),
          *_includes(), "-c", str(projects["zoo"] / "main" / "esp_check_hybrid.cc"), "-o", str(obj)])  # fmt: skip
    needed = {ln.split()[-1] for ln in _run(["nm", "-u", str(obj)]).stdout.splitlines() if "esp_nn_" in ln}
    ansi = {s for s in needed if s.endswith("_ansi")}
    assert {"esp_nn_conv_s8_ansi", "esp_nn_depthwise_conv_s8_ansi", "esp_nn_add_elementwise_s8_ansi",
            "esp_nn_mul_elementwise_s8_ansi", "esp_nn_fully_connected_s8_ansi", "esp_nn_max_pool_s8_ansi",
            "esp_nn_avg_pool_s8_ansi", "esp_nn_softmax_s8_ansi"} <= ansi  # fmt: skip
    defined: set[str] = set()
    for src in sorted(
        (ESPNN / "src").rglob("*_ansi.c")
    ):  # esp-nn's CMakeLists compiles these on every target
        o = tmp_path / (src.stem + ".o")
        _run([CC, "-std=c99", "-O2", "-I", str(ESPNN / "include"), "-I", str(ESPNN / "src" / "common"), "-c",
              str(src), "-o", str(o)])  # fmt: skip
        defined |= {ln.split()[-1] for ln in _run(["nm", "--defined-only", str(o)]).stdout.splitlines()}
    assert ansi <= defined, f"not defined by esp-nn's ANSI C sources: {sorted(ansi - defined)}"


@needs_sources
@pytest.mark.parametrize("tap", [False, True])
def test_hybrid_app_main_against_the_real_tflm_headers(
    tmp_path: Path, projects: dict[str, Path], tap: bool
) -> None:
    from tests.test_generate_compile import STUBS

    assert CXX is not None
    proj = projects["unet"] if tap else projects["zoo"]
    stubs = tmp_path / "idf"
    idf = {k: v for k, v in STUBS.items() if not k.startswith("tensorflow/") and k != "sdkconfig.h"}
    idf["esp_cpu.h"] = '#include <stdint.h>\nextern "C" uint32_t esp_cpu_get_cycle_count(void);\n'
    for rel, text in idf.items():
        (stubs / rel).parent.mkdir(parents=True, exist_ok=True)
        (stubs / rel).write_text("#pragma once\n" + text)
    sdk = _sdkconfig(tmp_path, proj, "esp32s3-optimized")
    _run([CXX, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-DTF_LITE_STATIC_MEMORY",
          '-DESP_CHECK_TFLM_VERSION="1.3.8"', '-DESP_CHECK_ESPNN_VERSION="1.1.2"', "-I", str(sdk), "-I", str(stubs),
          "-I", str(proj / "main"), *_includes(), str(proj / "main" / "app_main.cc")])  # fmt: skip
