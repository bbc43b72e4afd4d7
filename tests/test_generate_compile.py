"""Host-compiler checks of the generated C/C++ (no ESP-IDF or TFLM here).

- model_data.cc / inputs_data.cc need neither: they are compiled for real with -Werror, linked into a small
  host program and *run*, which checks the embedded bytes, their 16-byte alignment and the input table.
- esp_check_proto.c (copied into main/) is compiled with -std=c99 -Werror.
- app_main.cc needs ESP-IDF and TFLM headers, which are not installed here. It is checked with
  `g++ -fsyntax-only` against STUB headers written in this file from the documented ESP-IDF 5.x / TFLM
  APIs (declarations only): this catches template typos and misuse of the declared signatures, not
  differences from the real headers -- a real `pio run` is still the final word.
"""

# ruff: noqa: E501  (C declarations in the stub headers below read better unwrapped)
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from harness.firmware.boards import load_board
from harness.firmware.generate import generate_projects
from harness.resources import parse_toml

MODELS = Path(__file__).parent / "data" / "models"
INPUTS = MODELS / "inputs"
CXX = shutil.which("g++") or shutil.which("c++")
CC = shutil.which("gcc") or shutil.which("cc")

pytestmark = [
    pytest.mark.needs_cc,
    pytest.mark.skipif(CXX is None or CC is None, reason="no host C/C++ compiler (gcc/g++) on PATH"),
]

CHECK_MAIN = r"""
#include <cstdio>
#include <cstdint>
#include <cstring>
#include "esp_check_frame.h"
#include "model_data.h"

static long file_size(const char* path, unsigned char** out) {
    FILE* f = std::fopen(path, "rb");
    if (!f) return -1;
    std::fseek(f, 0, SEEK_END);
    long n = std::ftell(f);
    std::fseek(f, 0, SEEK_SET);
    *out = new unsigned char[n > 0 ? n : 1];
    if (std::fread(*out, 1, n, f) != (size_t)n) n = -1;
    std::fclose(f);
    return n;
}

// argv: model partition image, the .tflite, then the K input files
int main(int argc, char** argv) {
    unsigned char* image = nullptr;
    unsigned char* model = nullptr;
    long ni = file_size(argv[1], &image);
    long nm = file_size(argv[2], &model);
    // the checks app_main.cc's MapModel makes on the mapped partition
    if (ni < (long)kEspCheckModelHeaderBytes || std::memcmp(image, "ECMODEL1", 8) != 0) return 2;
    if (ecf_get_u32(image + 8) != kEspCheckModelHeaderBytes) return 3;
    if (ecf_crc32(0u, image, 48) != ecf_get_u32(image + 48)) return 4;
    uint32_t len = ecf_get_u32(image + 12);
    if ((long)len != nm || std::memcmp(image + kEspCheckModelHeaderBytes, model, len) != 0) return 5;
    if (kEspCheckModelHeaderBytes % 16 != 0) return 6;  // the mapped model stays 16-byte aligned
    unsigned char* buf = nullptr;
    for (int k = 0; k < kEspCheckNumInputs; ++k) {
        long n = file_size(argv[3 + k], &buf);
        if (n != (long)kEspCheckInputBytes || std::memcmp(buf, g_esp_check_inputs[k], n) != 0) return 7;
        if (reinterpret_cast<uintptr_t>(g_esp_check_inputs[k]) % 16 != 0) return 8;
    }
    if (kEspCheckNumInputs == 0 && g_esp_check_inputs[0] != nullptr) return 9;
    std::printf("ok %d\n", kEspCheckNumInputs);
    return argc == 3 + kEspCheckNumInputs ? 0 : 10;
}
"""


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(argv)}\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.mark.parametrize("embed", [True, False])
def test_embedded_data_compiles_links_and_matches(tmp_path: Path, embed: bool) -> None:
    from harness.firmware.generate import FirmwareFeatures

    inputs = [INPUTS / "cnn_classifier_11.png", INPUTS / "cnn_classifier_11__ambiguous.png"]
    (p,) = generate_projects(
        MODELS / "cnn_classifier_11.tflite", inputs if embed else [], "esp32s3-devkitc-1-n8r8", out_dir=tmp_path,
        variants=("optimized",), arena_kb=64, features=FirmwareFeatures(embed_inputs=embed),
    )  # fmt: skip
    main_dir = p.path / "main"
    (tmp_path / "check.cc").write_text(CHECK_MAIN)
    exe = tmp_path / "check"
    assert CXX is not None and CC is not None
    objs = []
    for name in ("esp_check_proto", "esp_check_frame"):
        obj = tmp_path / f"{name}.o"
        _run([CC, "-std=c99", "-Wall", "-Wextra", "-Werror", "-c", str(main_dir / f"{name}.c"), "-o", str(obj)],
             tmp_path)  # fmt: skip
        objs.append(str(obj))
    _run(
        [CXX, "-std=c++17", "-Wall", "-Wextra", "-Werror", "-I", str(main_dir), "-o", str(exe),
         str(tmp_path / "check.cc"), str(main_dir / "inputs_data.cc"), *objs],
        tmp_path,
    )  # fmt: skip
    k = len(inputs) if embed else 0
    out = _run(
        [
            str(exe),
            str(p.path / "esp-check" / "partitions" / "model.bin"),
            str(p.path / "esp-check" / "model.tflite"),
        ]
        + [str(p.path / "esp-check" / f"input_{j}.bin") for j in range(k)],
        tmp_path,
    )
    assert out.stdout.strip() == f"ok {k}"


def test_portable_c_copies_compile_as_c99(tmp_path: Path) -> None:
    (p,) = generate_projects(
        MODELS / "op_zoo.tflite", [INPUTS / "op_zoo.npy"], "esp32c3-devkitm-1", out_dir=tmp_path,
        variants=("ansi",), arena_kb=16,
    )  # fmt: skip
    assert CC is not None
    for name in ("esp_check_proto", "esp_check_frame", "esp_check_loop"):
        _run(
            [CC, "-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror", "-c", str(p.path / "main" / f"{name}.c"),
             "-o", str(tmp_path / f"{name}.o")],
            tmp_path,
        )  # fmt: skip
        assert (tmp_path / f"{name}.o").stat().st_size > 0


# --- stub declarations of the ESP-IDF 5.x and TFLM APIs app_main.cc uses (declarations, no behaviour) ---

STUBS: dict[str, str] = {
    "sdkconfig.h": """
#define CONFIG_IDF_TARGET "esp32s3"
#define CONFIG_ESP_DEFAULT_CPU_FREQ_MHZ 240
#define CONFIG_ESP_CONSOLE_UART_NUM 0
""",
    "esp_chip_info.h": """
#include <stdint.h>
#include "esp_idf_version.h"
typedef enum { CHIP_ESP32 = 1, CHIP_ESP32S2 = 2, CHIP_ESP32S3 = 9, CHIP_ESP32C3 = 5, CHIP_ESP32C2 = 12,
               CHIP_ESP32C6 = 13, CHIP_ESP32H2 = 16,
#if ESP_IDF_VERSION >= ESP_IDF_VERSION_VAL(5, 2, 0)  /* as in the real header: P4 from ESP-IDF 5.2 */
               CHIP_ESP32P4 = 18
#endif
               } esp_chip_model_t;
typedef struct { esp_chip_model_t model; uint32_t features; uint16_t revision; uint8_t cores; } esp_chip_info_t;
extern "C" void esp_chip_info(esp_chip_info_t* out_info);
""",
    "esp_random.h": """
#include <stdint.h>
extern "C" uint32_t esp_random(void);
""",
    # the kept-input store (boards with PSRAM): esp_common/include/esp_attr.h, esp_mm/include/esp_mmu_map.h
    # with hal/mmu_types.h, ESP-IDF v5.3 ... v5.5
    "esp_attr.h": """
#define EXT_RAM_NOINIT_ATTR __attribute__((section(".ext_ram_noinit.0")))
""",
    "esp_mmu_map.h": """
#include <stdint.h>
#include "esp_err.h"
typedef uint32_t esp_paddr_t;
typedef enum { MMU_TARGET_FLASH0 = 1 << 0, MMU_TARGET_PSRAM0 = 1 << 1 } mmu_target_t;
extern "C" esp_err_t esp_mmu_vaddr_to_paddr(void* vaddr, esp_paddr_t* out_paddr, mmu_target_t* out_target);
""",
    "esp_heap_caps.h": """
#include <stddef.h>
#include <stdint.h>
#define MALLOC_CAP_8BIT (1 << 2)
#define MALLOC_CAP_SPIRAM (1 << 10)
#define MALLOC_CAP_INTERNAL (1 << 11)
extern "C" void* heap_caps_aligned_alloc(size_t alignment, size_t size, uint32_t caps);
extern "C" void* heap_caps_malloc(size_t size, uint32_t caps);
extern "C" void heap_caps_free(void* ptr);
""",
    # the macros as ESP-IDF defines them; the version defaults to 5.5.3 and tests set others with -D
    "esp_idf_version.h": """
#ifndef ESP_IDF_VERSION_MAJOR
#define ESP_IDF_VERSION_MAJOR 5
#define ESP_IDF_VERSION_MINOR 5
#define ESP_IDF_VERSION_PATCH 3
#endif
#define ESP_IDF_VERSION_VAL(major, minor, patch) ((major << 16) | (minor << 8) | (patch))
#define ESP_IDF_VERSION ESP_IDF_VERSION_VAL(ESP_IDF_VERSION_MAJOR, ESP_IDF_VERSION_MINOR, ESP_IDF_VERSION_PATCH)
extern "C" const char* esp_get_idf_version(void);
""",
    "esp_system.h": 'extern "C" void esp_restart(void);\n',
    "esp_err.h": """
#include <stdint.h>
typedef int esp_err_t;
#define ESP_OK 0
#define ESP_ERR_NOT_FOUND 0x105
""",
    "esp_partition.h": """
#include <stddef.h>
#include <stdint.h>
#include "esp_err.h"
typedef enum { ESP_PARTITION_TYPE_APP = 0x00, ESP_PARTITION_TYPE_DATA = 0x01 } esp_partition_type_t;
typedef enum { ESP_PARTITION_SUBTYPE_APP_FACTORY = 0x00, ESP_PARTITION_SUBTYPE_APP_OTA_0 = 0x10,
               ESP_PARTITION_SUBTYPE_APP_OTA_1 = 0x11, ESP_PARTITION_SUBTYPE_ANY = 0xff } esp_partition_subtype_t;
typedef enum { ESP_PARTITION_MMAP_DATA, ESP_PARTITION_MMAP_INST } esp_partition_mmap_memory_t;
typedef uint32_t esp_partition_mmap_handle_t;
typedef struct { void* flash_chip; esp_partition_type_t type; esp_partition_subtype_t subtype; uint32_t address;
                 uint32_t size; uint32_t erase_size; char label[17]; bool encrypted; bool readonly; } esp_partition_t;
extern "C" const esp_partition_t* esp_partition_find_first(esp_partition_type_t type, esp_partition_subtype_t subtype,
                                                           const char* label);
extern "C" esp_err_t esp_partition_mmap(const esp_partition_t* partition, size_t offset, size_t size,
                                        esp_partition_mmap_memory_t memory, const void** out_ptr,
                                        esp_partition_mmap_handle_t* out_handle);
extern "C" esp_err_t esp_partition_get_sha256(const esp_partition_t* partition, uint8_t* sha_256);
""",
    "esp_ota_ops.h": """
#include "esp_partition.h"
extern "C" const esp_partition_t* esp_ota_get_running_partition(void);
extern "C" const esp_partition_t* esp_ota_get_next_update_partition(const esp_partition_t* start_from);
extern "C" esp_err_t esp_ota_set_boot_partition(const esp_partition_t* partition);
""",
    "driver/uart.h": """
#include <stddef.h>
#include <stdint.h>
#include "esp_err.h"
#include "freertos/FreeRTOS.h"
typedef int uart_port_t;
typedef void* QueueHandle_t;
extern "C" esp_err_t uart_driver_install(uart_port_t uart_num, int rx_buffer_size, int tx_buffer_size,
                                         int queue_size, QueueHandle_t* uart_queue, int intr_alloc_flags);
extern "C" int uart_write_bytes(uart_port_t uart_num, const void* src, size_t size);
extern "C" int uart_read_bytes(uart_port_t uart_num, void* buf, uint32_t length, TickType_t ticks_to_wait);
extern "C" esp_err_t uart_wait_tx_done(uart_port_t uart_num, TickType_t ticks_to_wait);
extern "C" esp_err_t uart_set_baudrate(uart_port_t uart_num, uint32_t baudrate);
extern "C" esp_err_t uart_get_baudrate(uart_port_t uart_num, uint32_t* baudrate);
extern "C" esp_err_t uart_get_buffered_data_len(uart_port_t uart_num, size_t* size);
""",
    "driver/uart_vfs.h": 'extern "C" void uart_vfs_dev_use_driver(int uart_num);\n',
    "esp_vfs_dev.h": 'extern "C" void esp_vfs_dev_uart_use_driver(int uart_num);\n',
    "driver/usb_serial_jtag.h": """
#include <stddef.h>
#include <stdint.h>
#include "esp_err.h"
#include "freertos/FreeRTOS.h"
typedef struct { uint32_t tx_buffer_size; uint32_t rx_buffer_size; } usb_serial_jtag_driver_config_t;
#define USB_SERIAL_JTAG_DRIVER_CONFIG_DEFAULT() { 256, 256 }
extern "C" esp_err_t usb_serial_jtag_driver_install(usb_serial_jtag_driver_config_t* cfg);
extern "C" int usb_serial_jtag_read_bytes(void* buf, uint32_t length, TickType_t ticks_to_wait);
extern "C" int usb_serial_jtag_write_bytes(const void* src, size_t size, TickType_t ticks_to_wait);
""",
    "driver/usb_serial_jtag_vfs.h": 'extern "C" void usb_serial_jtag_vfs_use_driver(void);\n',
    "esp_vfs_usb_serial_jtag.h": 'extern "C" void esp_vfs_usb_serial_jtag_use_driver(void);\n',
    "esp_timer.h": '#include <stdint.h>\nextern "C" int64_t esp_timer_get_time(void);\n',
    "freertos/FreeRTOS.h": (
        "#include <stdint.h>\ntypedef uint32_t TickType_t;\n#define portMAX_DELAY ((TickType_t)0xffffffffUL)\n"
        "#define pdMS_TO_TICKS(ms) ((TickType_t)(ms))\n"
        "typedef int BaseType_t;\ntypedef unsigned int UBaseType_t;\n#define pdPASS ((BaseType_t)1)\n"
        "typedef struct { void* opaque[8]; } StaticStreamBuffer_t;\n"
    ),
    # freertos/task.h and stream_buffer.h (FreeRTOS-Kernel in ESP-IDF v5.3 ... v5.5): the signatures used
    "freertos/task.h": (
        'extern "C" void vTaskDelay(const TickType_t xTicksToDelay);\n'
        "typedef void (*TaskFunction_t)(void*);\ntypedef void* TaskHandle_t;\n"
        'extern "C" BaseType_t xTaskCreate(TaskFunction_t pxTaskCode, const char* const pcName, const uint32_t '
        "usStackDepth, void* const pvParameters, UBaseType_t uxPriority, TaskHandle_t* const pxCreatedTask);\n"
    ),
    "freertos/stream_buffer.h": (
        "#include <stddef.h>\ntypedef struct StreamBufferDef_t* StreamBufferHandle_t;\n"
        'extern "C" StreamBufferHandle_t xStreamBufferGenericCreateStatic(size_t xBufferSizeBytes, size_t '
        "xTriggerLevelBytes, BaseType_t xIsMessageBuffer, uint8_t* const pucStreamBufferStorageArea, "
        "StaticStreamBuffer_t* const pxStaticStreamBuffer, void* pxSendCompletedCallback, void* "
        "pxReceiveCompletedCallback);\n"
        "#define xStreamBufferCreateStatic(n, t, s, b) xStreamBufferGenericCreateStatic((n), (t), 0, (s), (b), "
        "NULL, NULL)\n"
        'extern "C" size_t xStreamBufferSend(StreamBufferHandle_t xStreamBuffer, const void* pvTxData, size_t '
        "xDataLengthBytes, TickType_t xTicksToWait);\n"
        'extern "C" size_t xStreamBufferReceive(StreamBufferHandle_t xStreamBuffer, void* pvRxData, size_t '
        "xBufferLengthBytes, TickType_t xTicksToWait);\n"
    ),
    # IDF 6 (Mbed TLS 4) has no such header: the stub errors out the way the missing file would
    "mbedtls/sha256.h": (
        "#include <stddef.h>\n"
        '#include "esp_idf_version.h"\n'
        "#if ESP_IDF_VERSION_MAJOR >= 6\n#error mbedtls/sha256.h: No such file or directory\n#endif\n"
        'extern "C" int mbedtls_sha256(const unsigned char* input, size_t ilen, unsigned char* output, int is224);\n'
    ),
    "tensorflow/lite/c/common.h": """
#include <stddef.h>
#include <stdint.h>
typedef enum { kTfLiteOk = 0, kTfLiteError = 1 } TfLiteStatus;
typedef enum { kTfLiteNoType = 0, kTfLiteFloat32 = 1, kTfLiteInt32 = 2, kTfLiteUInt8 = 3, kTfLiteInt64 = 4,
               kTfLiteInt16 = 7, kTfLiteInt8 = 9 } TfLiteType;
typedef struct { int size; int data[]; } TfLiteIntArray;
typedef struct { float scale; int32_t zero_point; } TfLiteQuantizationParams;
typedef union { int32_t* i32; float* f; char* raw; const char* raw_const; uint8_t* uint8; int8_t* int8; } TfLitePtrUnion;
typedef struct { TfLiteType type; TfLitePtrUnion data; TfLiteIntArray* dims; TfLiteQuantizationParams params;
                 size_t bytes; } TfLiteTensor;
""",
    "tensorflow/lite/schema/schema_generated.h": """
#include <stdint.h>
#define TFLITE_SCHEMA_VERSION (3)
namespace tflite {
struct Model { uint32_t version() const; };
inline const Model* GetModel(const void* buf) { return static_cast<const Model*>(buf); }
}
""",
    "tensorflow/lite/micro/micro_interpreter.h": """
#include "tensorflow/lite/c/common.h"
#include "tensorflow/lite/schema/schema_generated.h"
#include "tensorflow/lite/micro/micro_mutable_op_resolver.h"
namespace tflite {
class MicroInterpreter {
 public:
  MicroInterpreter(const Model* model, const MicroOpResolver& op_resolver, uint8_t* tensor_arena,
                   size_t tensor_arena_size);
  TfLiteStatus AllocateTensors();
  TfLiteStatus Invoke();
  TfLiteTensor* input(size_t index);
  TfLiteTensor* output(size_t index);
  size_t inputs_size() const;
  size_t outputs_size() const;
  size_t arena_used_bytes() const;
};
}
""",
}


def _resolver_header() -> str:
    """MicroMutableOpResolver stub with every method in harness/data/ops.toml (the pinned TFLM's list)."""
    table = parse_toml((Path(__file__).resolve().parents[1] / "harness" / "data" / "ops.toml").read_text())
    methods = sorted(set(table["resolver"].values()) | set(table.get("custom", {}).values()))
    body = "\n".join(f"  TfLiteStatus {m}() {{ return kTfLiteOk; }}" for m in methods)
    return (
        '#pragma once\n#include "tensorflow/lite/c/common.h"\nnamespace tflite {\n'
        "class MicroOpResolver {};\n"
        "template <unsigned int tOpCount> class MicroMutableOpResolver : public MicroOpResolver {\n public:\n"
        f"{body}\n}};\n}}\n"
    )


def _write_stubs(stubs: Path) -> None:
    for rel, text in {
        **STUBS,
        "tensorflow/lite/micro/micro_mutable_op_resolver.h": _resolver_header(),
    }.items():
        (stubs / rel).parent.mkdir(parents=True, exist_ok=True)
        (stubs / rel).write_text("#pragma once\n" + text if not text.startswith("#pragma") else text)


@pytest.mark.parametrize(
    ("model_name", "board", "embed"),
    [("op_zoo", "esp32s3-devkitc-1-n8r8", True), ("unet_mbv2_035_48", "esp32s3-devkitc-1-n8r8", True),
     ("op_zoo", "sim-usbjtag", False)],  # the USB-Serial-JTAG console, no compiled-in inputs
)  # fmt: skip
def test_app_main_is_valid_cpp_against_stub_headers(
    tmp_path: Path, model_name: str, board: str, embed: bool
) -> None:
    from harness.firmware.generate import FirmwareFeatures

    inp = INPUTS / (f"{model_name}.png" if (INPUTS / f"{model_name}.png").exists() else f"{model_name}.npy")
    projects = generate_projects(
        MODELS / f"{model_name}.tflite", [inp] if embed else [], board, out_dir=tmp_path / "p", arena_kb=400,
        features=FirmwareFeatures(embed_inputs=embed),
    )  # fmt: skip
    stubs = tmp_path / "stubs"
    _write_stubs(stubs)
    assert CXX is not None
    for p in projects:
        nn = "CONFIG_NN_OPTIMIZED" if p.variant == "optimized" else "CONFIG_NN_ANSI_C"
        _run(
            [CXX, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", f"-D{nn}=1",
             '-DESP_CHECK_TFLM_VERSION="1.3.8"', '-DESP_CHECK_ESPNN_VERSION="1.1.2"',
             "-I", str(stubs), "-I", str(p.path / "main"), str(p.path / "main" / "app_main.cc")],
            tmp_path,
        )  # fmt: skip


# (board, ESP-IDF version the stub headers claim, accepted?). The range comes from
# harness/data/versions.toml (5.3.0 up to, not including, 6.0.0) and the board's idf_min (esp32p4-v3: 5.5.2).
IDF_CASES = [
    ("esp32s3-devkitc-1-n8r8", (5, 1, 7), False),  # no CHIP_ESP32P4 yet: only our message may appear
    ("esp32s3-devkitc-1-n8r8", (5, 2, 5), False),
    ("esp32s3-devkitc-1-n8r8", (5, 3, 0), True),
    ("esp32s3-devkitc-1-n8r8", (5, 5, 3), True),
    ("esp32s3-devkitc-1-n8r8", (6, 0, 0), False),  # Mbed TLS 4: no mbedtls/sha256.h
    ("esp32p4", (5, 3, 0), True),
    ("esp32p4-v3", (5, 5, 1), False),  # no option to build for v3 silicon yet
    ("esp32p4-v3", (5, 5, 2), True),
    ("esp32p4-v3", (6, 0, 2), False),
]


@pytest.mark.parametrize(("board", "idf", "accepted"), IDF_CASES)
def test_supported_idf_range_is_enforced_at_compile_time(
    tmp_path: Path, board: str, idf: tuple[int, int, int], accepted: bool
) -> None:
    """The generated app refuses, with one clear message, every ESP-IDF outside the board's range."""
    (p,) = generate_projects(
        MODELS / "op_zoo.tflite", [INPUTS / "op_zoo.npy"], board, out_dir=tmp_path / "p",
        variants=("ansi",), arena_kb=64,
    )  # fmt: skip
    stubs = tmp_path / "stubs"
    _write_stubs(stubs)
    assert CXX is not None
    major, minor, patch = idf
    proc = subprocess.run(
        [CXX, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-DCONFIG_NN_ANSI_C=1",
         f"-DESP_IDF_VERSION_MAJOR={major}", f"-DESP_IDF_VERSION_MINOR={minor}", f"-DESP_IDF_VERSION_PATCH={patch}",
         "-I", str(stubs), "-I", str(p.path / "main"), str(p.path / "main" / "app_main.cc")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if accepted:
        assert proc.returncode == 0, proc.stderr
        return
    assert proc.returncode != 0
    low, below = load_board(board).idf_range
    first_error = next(line for line in proc.stderr.splitlines() if "error" in line)
    assert f"this firmware supports ESP-IDF >={low},<{below} for board {board}" in first_error
    assert "CHIP_ESP32P4" not in proc.stderr  # the guarded case never breaks an old IDF's build
