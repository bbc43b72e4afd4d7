"""main/CMakeLists.txt's version report, run by the real CMake (no ESP-IDF here).

The generated main/CMakeLists.txt is included, unchanged, by a tiny CMake project whose only fakes are
the ESP-IDF build API functions it calls (idf_component_register, idf_build_get_property,
idf_component_get_property, partition_table_get_partition_info -- which looks the partition up in the
generated partitions.csv, as ESP-IDF looks it up in the table built from that file --,
esptool_py_flash_to_partition) and target_compile_definitions; the last two record what would be flashed
by `idf.py flash` and what would be compiled in.
The dependencies.lock fixtures are written the way the IDF component manager writes them (lock format
2.0.0: a registry ("service") dependency, a git dependency whose version is the commit, and the idf
entry); the component manifests the way registry archives and git checkouts carry them.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.firmware.generate import generate_projects

MODELS = Path(__file__).parent / "data" / "models"
CMAKE = shutil.which("cmake")

pytestmark = pytest.mark.skipif(CMAKE is None, reason="no cmake on PATH")

HARNESS = """cmake_minimum_required(VERSION 3.16)
project(esp_check_cmake_harness NONE)
set(COMPONENT_LIB __idf_main)
function(idf_component_register)
endfunction()
function(idf_build_get_property var prop)
  if(prop STREQUAL "BUILD_COMPONENTS")
    set(${var} "espressif__esp-nn;espressif__esp-tflite-micro" PARENT_SCOPE)
  elseif(prop STREQUAL "PROJECT_DIR")
    set(${var} "${FAKE_PROJECT_DIR}" PARENT_SCOPE)
  elseif(prop STREQUAL "DEPENDENCIES_LOCK")
    set(${var} "${FAKE_DEPENDENCIES_LOCK}" PARENT_SCOPE)
  endif()
endfunction()
function(idf_component_get_property var component prop)
  set(${var} "${FAKE_PROJECT_DIR}/managed_components/${component}" PARENT_SCOPE)
endfunction()
function(target_compile_definitions target scope)
  file(WRITE "${CMAKE_BINARY_DIR}/definitions.txt" "${ARGN}")
endfunction()
get_filename_component(main_dir "${MAIN_CMAKELISTS}" DIRECTORY)
function(partition_table_get_partition_info var args info)
  separate_arguments(a UNIX_COMMAND "${args}")
  list(GET a 1 name)
  file(STRINGS "${main_dir}/../partitions.csv" rows)
  foreach(row IN LISTS rows)
    if(row MATCHES "^${name}[ \t]*,[^,]*,[^,]*,[ \t]*(0x[0-9A-Fa-f]+)[ \t]*,[ \t]*(0x[0-9A-Fa-f]+)")
      if(info STREQUAL "offset")
        set(${var} "${CMAKE_MATCH_1}" PARENT_SCOPE)
      elseif(info STREQUAL "size")
        set(${var} "${CMAKE_MATCH_2}" PARENT_SCOPE)
      endif()
    endif()
  endforeach()
endfunction()
function(esptool_py_flash_to_partition target partition image)
  partition_table_get_partition_info(offset "--partition-name ${partition}" "offset")
  file(APPEND "${CMAKE_BINARY_DIR}/flash.txt" "${target};${partition};${offset};${image}\n")
endfunction()
include("${MAIN_CMAKELISTS}")
"""

GIT_COMMIT = "596b08401a63da3a2e1b40868c442f582a99ae26"
LOCK = f"""dependencies:
  espressif/esp-nn:
    component_hash: null
    dependencies:
    - name: idf
      require: private
      version: '>=4.2'
    source:
      git: https://github.com/espressif/esp-nn.git
      path: .
      type: git
    version: {GIT_COMMIT}
  espressif/esp-tflite-micro:
    component_hash: 7d1a3b5c9e2f4a6b8c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b
    dependencies:
    - name: espressif/esp-nn
      require: private
      version: '>=1.1.1'
    - name: idf
      require: private
      version: '>=5.0'
    source:
      registry_url: https://components.espressif.com/
      type: service
    version: 1.3.8
  idf:
    source:
      type: idf
    version: 5.5.3
direct_dependencies:
- espressif/esp-nn
- espressif/esp-tflite-micro
- idf
manifest_hash: 4b7c3e1f0a2d9c8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b
target: esp32s3
version: 2.0.0
"""


@pytest.fixture(scope="module")
def main_cmakelists(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gen")
    (p,) = generate_projects(
        MODELS / "op_zoo.tflite", [MODELS / "inputs" / "op_zoo.npy"], "esp32s3-devkitc-1-n8", out_dir=out,
        variants=("ansi",), arena_kb=16,
    )  # fmt: skip
    return p.path / "main" / "CMakeLists.txt"


def _project(root: Path, lock: str | None, espnn_manifest: str | None, tflm_manifest: str | None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for comp, text in (("espressif__esp-nn", espnn_manifest), ("espressif__esp-tflite-micro", tflm_manifest)):
        d = root / "managed_components" / comp
        d.mkdir(parents=True, exist_ok=True)
        if text is not None:
            (d / "idf_component.yml").write_text(text)
    if lock is not None:
        (root / "dependencies.lock").write_bytes(lock.encode())
    return root


def _configure(main: Path, project: Path, build: Path, lock_property: str = "") -> dict[str, str]:
    harness = build.parent / (build.name + "-src")
    harness.mkdir(parents=True, exist_ok=True)
    (harness / "CMakeLists.txt").write_text(HARNESS)
    assert CMAKE is not None
    proc = subprocess.run(
        [CMAKE, "-S", str(harness), "-B", str(build), f"-DMAIN_CMAKELISTS={main}",
         f"-DFAKE_PROJECT_DIR={project}", f"-DFAKE_DEPENDENCIES_LOCK={lock_property}"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    defs: dict[str, str] = {}
    for item in (build / "definitions.txt").read_text().split(";"):
        key, _, value = item.partition("=")
        defs[key] = value.strip('"')
    return defs


def test_lock_wins_and_names_the_source(main_cmakelists: Path, tmp_path: Path) -> None:
    # an esp-nn master checkout's manifest says 1.2.3: the lock's commit is what was built
    proj = _project(tmp_path / "p", LOCK, 'version: "1.2.3"\n', 'version: "1.3.8"\n')
    defs = _configure(main_cmakelists, proj, tmp_path / "b")
    assert defs == {
        "ESP_CHECK_TFLM_VERSION": "1.3.8",
        "ESP_CHECK_TFLM_VERSION_FROM": "lock:service",
        "ESP_CHECK_ESPNN_VERSION": GIT_COMMIT,
        "ESP_CHECK_ESPNN_VERSION_FROM": "lock:git",
    }


def test_manifest_when_no_lock_and_unknown_when_neither(main_cmakelists: Path, tmp_path: Path) -> None:
    # registry archive of esp-tflite-micro (version injected); esp-nn v1.1.2 git checkout (no version)
    proj = _project(tmp_path / "p", None, "description: Optimized NN functions\n", 'version: "1.3.8"\n')
    defs = _configure(main_cmakelists, proj, tmp_path / "b")
    assert (defs["ESP_CHECK_TFLM_VERSION"], defs["ESP_CHECK_TFLM_VERSION_FROM"]) == ("1.3.8", "manifest")
    assert (defs["ESP_CHECK_ESPNN_VERSION"], defs["ESP_CHECK_ESPNN_VERSION_FROM"]) == ("unknown", "none")


def test_lock_path_property_and_crlf(main_cmakelists: Path, tmp_path: Path) -> None:
    proj = _project(tmp_path / "p", None, None, None)
    (proj / "dependencies.lock.esp32s3").write_bytes(LOCK.replace("\n", "\r\n").encode())
    defs = _configure(main_cmakelists, proj, tmp_path / "b", lock_property="dependencies.lock.esp32s3")
    assert defs["ESP_CHECK_ESPNN_VERSION"] == GIT_COMMIT and defs["ESP_CHECK_TFLM_VERSION"] == "1.3.8"


def test_dependency_versions_inside_an_entry_are_not_its_version(
    main_cmakelists: Path, tmp_path: Path
) -> None:
    # esp-nn's own version line missing: its dependency's '>=4.2' (deeper indented) must not be taken
    lock = LOCK.replace(f"    version: {GIT_COMMIT}\n", "")
    proj = _project(tmp_path / "p", lock, 'version: "1.1.2"\n', None)
    defs = _configure(main_cmakelists, proj, tmp_path / "b")
    assert (defs["ESP_CHECK_ESPNN_VERSION"], defs["ESP_CHECK_ESPNN_VERSION_FROM"]) == ("1.1.2", "manifest")


def test_hostile_or_mangled_locks_never_reach_c(main_cmakelists: Path, tmp_path: Path) -> None:
    """Fuzz: random edits of a real-shaped lock. The compiled-in values stay within the C/protocol-safe
    character set and every source label is one of the documented ones."""
    rng = random.Random(13)
    pieces = ['"', "'", ";", "\\", "$", "{", "}", " ", "\t", "\n", "#", ":", "x" * 300, "é", "\x00"]
    for k in range(12):
        text = LOCK.replace(GIT_COMMIT, f'1.1.2" -DEVIL={k}') if k == 0 else LOCK
        chars = list(text)
        for _ in range(rng.randint(1, 12)):
            pos = rng.randrange(len(chars))
            chars[pos : pos + rng.randint(0, 3)] = list(rng.choice(pieces))
        proj = _project(tmp_path / f"p{k}", "".join(chars).replace("\x00", ""), None, 'version: "1.3.8"\n')
        defs = _configure(main_cmakelists, proj, tmp_path / f"b{k}")
        for key in ("ESP_CHECK_TFLM_VERSION", "ESP_CHECK_ESPNN_VERSION"):
            value = defs[key]
            assert value and all(c.isalnum() or c in ".+~-" for c in value) and value.isascii(), (k, value)
            assert re.fullmatch(r"lock:[a-z_]+|manifest|none", defs[key + "_FROM"]), (k, defs)


def test_idf_flash_writes_the_model_partition(main_cmakelists: Path, tmp_path: Path) -> None:
    """`idf.py flash` also flashes the model image into the model partition (esptool_py_flash_to_partition):
    the call names the `flash` target, the partition partitions.csv declares, and the image generate wrote."""
    from harness.flashfmt.model_image import parse_model_image

    proj = _project(tmp_path / "p", LOCK, None, None)
    _configure(main_cmakelists, proj, tmp_path / "b")
    (line,) = (tmp_path / "b" / "flash.txt").read_text().splitlines()
    target, partition, offset, image = line.split(";")
    assert (target, partition) == ("flash", "model")
    csv = (main_cmakelists.parent.parent / "partitions.csv").read_text()
    assert re.search(rf"^model,\s+data,\s+0x40,\s+{offset},", csv, re.M), (offset, csv)
    path = Path(image).resolve()
    assert path == (main_cmakelists.parent.parent / "esp-check" / "partitions" / "model.bin").resolve()
    assert parse_model_image(path.read_bytes()).model == (MODELS / "op_zoo.tflite").read_bytes()


def test_a_table_without_the_model_partition_stops_the_build(main_cmakelists: Path, tmp_path: Path) -> None:
    gen = tmp_path / "gen"
    shutil.copytree(main_cmakelists.parent.parent, gen)
    csv = gen / "partitions.csv"
    csv.write_text("".join(ln for ln in csv.read_text().splitlines(True) if not ln.startswith("model")))
    harness = tmp_path / "b-src"
    harness.mkdir()
    (harness / "CMakeLists.txt").write_text(HARNESS)
    assert CMAKE is not None
    main = gen / "main" / "CMakeLists.txt"
    proj = _project(tmp_path / "p", LOCK, None, None)
    proc = subprocess.run(
        [CMAKE, "-S", str(harness), "-B", str(tmp_path / "b"), f"-DMAIN_CMAKELISTS={main}",
         f"-DFAKE_PROJECT_DIR={proj}", "-DFAKE_DEPENDENCIES_LOCK="],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode != 0 and "has no 'model' partition" in proc.stderr


# ---- the top-level CMakeLists.txt: `idf.py flash` of each project boots its own variant -------------

# A stand-in for $IDF_PATH/tools/cmake/project.cmake (faked: ESP-IDF itself is not here). Its `project()`
# does what ESP-IDF v5.5's does for the flash arguments: the sdkconfig's CONFIG_ values become variables,
# esptool_py puts the app at the default boot partition (`--partition-boot-default`: the first app, ota_0)
# and app_update an erased ota_data_initial.bin at otadata, through the same target properties
# (esptool_py_flash_target_image); flasher_args.json and flash_args are generated from those properties
# after the whole project was read, as ESP-IDF's flasher_args.json.in and <target>_args are.
FAKE_IDF_PROJECT = r"""
function(idf_build_get_property var prop)
  if(prop STREQUAL "BUILD_DIR")
    set(${var} "${CMAKE_BINARY_DIR}" PARENT_SCOPE)
  endif()
endfunction()
function(fake_flash_image target name offset image)
  file(RELATIVE_PATH image "${CMAKE_BINARY_DIR}" "${image}")
  set_property(TARGET ${target} APPEND PROPERTY FLASH_FILE "\"${offset}\" : \"${image}\"")
  set_property(TARGET ${target} APPEND PROPERTY FLASH_ENTRY
    "\"${name}\" : { \"offset\" : \"${offset}\", \"file\" : \"${image}\", \"encrypted\" : \"false\" }")
  set_property(TARGET ${target} APPEND PROPERTY IMAGES "${offset} ${image}")
endfunction()
macro(project name)
  _project(${name} NONE)
  file(STRINGS "${CMAKE_SOURCE_DIR}/sdkconfig.defaults" lines REGEX "^CONFIG_NN_[A-Z_]+=y$")
  foreach(line IN LISTS lines)
    string(REPLACE "=y" "" sym "${line}")
    set(${sym} y)
  endforeach()
  file(STRINGS "${CMAKE_SOURCE_DIR}/partitions.csv" rows REGEX "^(otadata|ota_0) *,")
  foreach(row IN LISTS rows)
    string(REGEX MATCH "0x[0-9A-Fa-f]+" off "${row}")
    if(row MATCHES "^otadata")
      set(otadata_offset ${off})
    else()
      set(boot_offset ${off})
    endif()
  endforeach()
  foreach(t flash app-flash otadata-flash)
    add_custom_target(${t})
  endforeach()
  fake_flash_image(flash app ${boot_offset} "${CMAKE_BINARY_DIR}/${name}.bin")
  fake_flash_image(app-flash app ${boot_offset} "${CMAKE_BINARY_DIR}/${name}.bin")
  fake_flash_image(flash otadata ${otadata_offset} "${CMAKE_BINARY_DIR}/ota_data_initial.bin")
  fake_flash_image(otadata-flash otadata ${otadata_offset} "${CMAKE_BINARY_DIR}/ota_data_initial.bin")
  file(GENERATE OUTPUT "${CMAKE_BINARY_DIR}/flasher_args.json" CONTENT
"{ \"flash_files\" : { $<JOIN:$<TARGET_PROPERTY:flash,FLASH_FILE>,,> },
  $<JOIN:$<TARGET_PROPERTY:flash,FLASH_ENTRY>,,> }
")
  foreach(t flash app-flash)
    file(GENERATE OUTPUT "${CMAKE_BINARY_DIR}/${t}_args"
         CONTENT "$<JOIN:$<TARGET_PROPERTY:${t},IMAGES>,\n>\n")
  endforeach()
endmacro()
"""


@pytest.mark.parametrize("variant", ["optimized", "ansi"])
def test_idf_flash_of_each_project_boots_its_own_variant(variant: str, tmp_path: Path) -> None:
    """flasher_args.json, flash_args and app-flash_args of `idf.py build` in each project: the app goes to
    its own slot and the otadata flashed with it boots that slot. On the old template the ANSI C project's
    app went to ota_0 (ESP-IDF's default boot partition) with an erased otadata."""
    import json

    from harness.flashfmt.otadata import selected_slot
    from harness.flashfmt.partitions import VARIANT_SLOTS

    (p,) = generate_projects(
        MODELS / "op_zoo.tflite", [MODELS / "inputs" / "op_zoo.npy"], "esp32s3-devkitc-1-n8",
        out_dir=tmp_path, variants=(variant,), arena_kb=16,
    )  # fmt: skip
    idf = tmp_path / "idf"
    (idf / "tools" / "cmake").mkdir(parents=True)
    (idf / "tools" / "cmake" / "project.cmake").write_text(FAKE_IDF_PROJECT)
    build = tmp_path / "build"
    assert CMAKE is not None
    proc = subprocess.run([CMAKE, "-S", str(p.path), "-B", str(build)], capture_output=True, text=True,
                          timeout=120, check=False, env={**os.environ, "IDF_PATH": str(idf)})  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    slots = {r["name"]: r["offset"] for r in p.manifest["flash_layout"]["partitions"]}
    own = VARIANT_SLOTS[variant]
    args = json.loads((build / "flasher_args.json").read_text())
    assert int(args["app"]["offset"], 16) == slots[f"ota_{own}"]
    otadata = (build / args["otadata"]["file"]).resolve()
    assert int(args["otadata"]["offset"], 16) == slots["otadata"]
    assert args["flash_files"][args["otadata"]["offset"]] == args["otadata"]["file"]
    assert args["flash_files"][args["app"]["offset"]] == "esp_check_fw.bin"
    flashed = otadata.read_bytes() if otadata.is_file() else b"\xff" * 0x2000  # ESP-IDF writes it blank
    assert (selected_slot(flashed, 2) or 0) == own
    for name in ("flash_args", "app-flash_args"):
        pairs = dict(line.split(" ", 1) for line in (build / name).read_text().splitlines() if line)
        assert {int(k, 16) for k, v in pairs.items() if v == "esp_check_fw.bin"} == {slots[f"ota_{own}"]}
