"""The ESP-IDF stand-ins of the native target, compiled with the host compiler and checked from outside.

What is real: the stand-in sources as the native build compiles them (harness/firmware/native/standins),
the host C compiler, Python's hashlib as the SHA-256 oracle, the host clock. Nothing is faked. Each
test compiles a small C driver against the stand-ins and reads what it prints.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.firmware.native.config import idf_api_h, resolve, sdkconfig_h
from harness.firmware.native.driver import STANDINS_DIR

CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = [pytest.mark.needs_cc, pytest.mark.skipif(CC is None, reason="no host C compiler")]

DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include "esp_chip_info.h"
#include "esp_cpu.h"
#include "esp_heap_caps.h"
#include "esp_idf_version.h"
#include "esp_timer.h"
#include "freertos/FreeRTOS.h"
#include "freertos/task.h"
#include "mbedtls/sha256.h"
#include "sdkconfig.h"

static unsigned char buf[1 << 20];

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "sha") == 0) {
        size_t n = fread(buf, 1, sizeof(buf), stdin);
        unsigned char d[32];
        int rc = mbedtls_sha256(buf, n, d, 0);
        printf("rc=%d ", rc);
        for (int k = 0; k < 32; ++k) printf("%02x", d[k]);
        printf(" rc224=%d\n", mbedtls_sha256(buf, n, d, 1));
        return 0;
    }
    esp_chip_info_t info;
    memset(&info, 0xAB, sizeof(info));
    esp_chip_info(&info);
    printf("chip model=%d cores=%d rev=%d features=%u\n", (int)info.model, info.cores, info.revision,
           (unsigned)info.features);
    printf("idf %s api %d.%d.%d >=5.3:%d <6:%d\n", esp_get_idf_version(), ESP_IDF_VERSION_MAJOR,
           ESP_IDF_VERSION_MINOR, ESP_IDF_VERSION_PATCH, ESP_IDF_VERSION >= ESP_IDF_VERSION_VAL(5, 3, 0),
           ESP_IDF_VERSION < ESP_IDF_VERSION_VAL(6, 0, 0));
    for (size_t a = 1; a <= 64; a *= 2) {
        void *p = heap_caps_aligned_alloc(a, 100, MALLOC_CAP_INTERNAL | MALLOC_CAP_8BIT);
        printf("align %u ok=%d aligned=%d\n", (unsigned)a, p != NULL, p != NULL && ((uintptr_t)p % a) == 0);
        heap_caps_free(p);
    }
    printf("align3 null=%d\n", heap_caps_aligned_alloc(3, 16, MALLOC_CAP_8BIT) == NULL);
    int64_t t0 = esp_timer_get_time();
    uint32_t c0 = esp_cpu_get_cycle_count();
    vTaskDelay(pdMS_TO_TICKS(20));
    int64_t t1 = esp_timer_get_time();
    uint32_t c1 = esp_cpu_get_cycle_count();
    printf("delay_us %lld cycles %lu\n", (long long)(t1 - t0), (unsigned long)(c1 - c0));
    printf("tick_hz %d ms_per_tick %d ticks_10ms %u hz %d\n", configTICK_RATE_HZ, portTICK_PERIOD_MS,
           (unsigned)pdMS_TO_TICKS(10), CONFIG_FREERTOS_HZ);
    return 0;
}
"""


def _build(tmp: Path, *flags: str) -> Path:
    config = tmp / "config"
    config.mkdir(exist_ok=True)
    defaults = {"CONFIG_IDF_TARGET": '"esp32"', "CONFIG_ESP_DEFAULT_CPU_FREQ_MHZ_240": "y"}
    (config / "sdkconfig.h").write_text(sdkconfig_h(resolve(defaults)))
    (config / "esp_check_idf_api.h").write_text(idf_api_h("5.5.3"))
    (tmp / "driver.c").write_text(DRIVER)
    exe = tmp / "driver"
    assert CC is not None
    subprocess.run(
        [CC, *flags, "-std=c11", "-Wall", "-Wextra", "-Werror", "-I", str(STANDINS_DIR / "include"), "-I",
         str(config), str(tmp / "driver.c"), str(STANDINS_DIR / "src" / "standins.c"),
         str(STANDINS_DIR / "src" / "sha256.c"), str(STANDINS_DIR / "src" / "noinit.c"), "-o", str(exe)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return exe


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("standins"))


def _sha(exe: Path, data: bytes) -> tuple[str, str, str]:
    out = subprocess.run([str(exe), "sha"], input=data, capture_output=True, check=True).stdout.decode()
    rc, digest, rc224 = out.split()
    return rc, digest, rc224


@pytest.mark.parametrize("n", [0, 1, 3, 55, 56, 57, 63, 64, 65, 119, 120, 127, 128, 129, 1000, 65536])
def test_sha256_matches_hashlib_at_padding_boundaries(driver: Path, n: int) -> None:
    data = bytes((7 * i + n) & 0xFF for i in range(n))
    rc, digest, rc224 = _sha(driver, data)
    assert rc == "rc=0"
    assert digest == hashlib.sha256(data).hexdigest()
    assert rc224 == f"rc224={-0x74}"  # SHA-224 is not stood in: refused, never a wrong digest


@settings(max_examples=25, deadline=None)
@given(data=st.binary(max_size=3000))
def test_sha256_matches_hashlib_on_random_data(driver: Path, data: bytes) -> None:
    assert _sha(driver, data)[1] == hashlib.sha256(data).hexdigest()


def test_chip_info_heap_version_timer_delay(driver: Path) -> None:
    t0 = time.monotonic()
    out = subprocess.run([str(driver)], capture_output=True, text=True, check=True).stdout.splitlines()
    wall_us = (time.monotonic() - t0) * 1e6
    assert out[0] == "chip model=999 cores=1 rev=0 features=0"  # CHIP_POSIX_LINUX, as ESP-IDF's host build
    # never an ESP-IDF version string; the API level is the project's pinned ESP-IDF (the template checks it)
    assert out[1] == "idf native-standins-1 api 5.5.3 >=5.3:1 <6:1"
    for line in out[2:9]:
        assert line.endswith("ok=1 aligned=1"), line
    assert out[9] == "align3 null=1"  # a non-power-of-two alignment is refused, like ESP-IDF's
    _, delay_us, _, cycles = out[10].split()
    assert 20_000 <= int(delay_us) < wall_us  # vTaskDelay(20 ms) really slept, the timer counts it
    # the cycle counter is host time at CONFIG_ESP_DEFAULT_CPU_FREQ_MHZ (240): cycles / 240 = us
    assert abs(int(cycles) / 240 - int(delay_us)) < 0.05 * int(delay_us) + 50


def test_standins_build_and_run_32_bit(tmp_path: Path) -> None:
    probe = tmp_path / "probe.c"
    probe.write_text("int main(void) { return 0; }\n")
    assert CC is not None
    if subprocess.run([CC, "-m32", str(probe), "-o", str(tmp_path / "p")], capture_output=True).returncode:
        pytest.skip("the host compiler cannot build -m32 programs (install gcc-multilib)")
    exe = _build(tmp_path, "-m32")
    assert _sha(exe, b"abc")[1] == hashlib.sha256(b"abc").hexdigest()
    assert subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.startswith(
        "chip model=999"
    )


def test_every_standin_file_says_it_is_not_esp_idf() -> None:
    files = [p for p in STANDINS_DIR.rglob("*") if p.is_file() and p.suffix in (".h", ".c", ".cmake", ".txt")]
    assert len(files) >= 14
    for p in files:
        head = p.read_text(encoding="utf-8")[:400]
        assert "STAND-IN" in head and "not ESP-IDF" in head.replace("not ESP-IDF's", "not ESP-IDF"), p


def test_sdkconfig_header_reaches_esp_nn_through_esp_timer(tmp_path: Path) -> None:
    """esp-tflite-micro's ESP-NN kernels see the Kconfig choice only through <esp_timer.h>."""
    config = tmp_path / "config"
    config.mkdir()
    for variant, symbol in (("optimized", "CONFIG_NN_OPTIMIZED"), ("ansi", "CONFIG_NN_ANSI_C")):
        (config / "sdkconfig.h").write_text(
            sdkconfig_h(resolve({"CONFIG_IDF_TARGET": '"esp32"', symbol: "y"}))
        )
        src = tmp_path / "k.c"
        src.write_text(
            "#include <esp_timer.h>\n#include <stdio.h>\nint main(void) {\n"
            '#if defined(CONFIG_NN_OPTIMIZED)\nputs("optimized");\n'
            '#elif defined(CONFIG_NN_ANSI_C)\nputs("ansi");\n'
            "#endif\nreturn 0; }\n"
        )
        assert CC is not None
        exe = tmp_path / f"k-{variant}"
        subprocess.run(
            [CC, "-I", str(STANDINS_DIR / "include"), "-I", str(config), str(src), "-o", str(exe)], check=True
        )
        assert (
            subprocess.run([str(exe)], capture_output=True, text=True, env=dict(os.environ)).stdout.strip()
            == variant
        )


def test_the_tick_is_esp_idfs_default(driver: Path) -> None:
    """The native board's FreeRTOS tick is a chip's (ESP-IDF's default CONFIG_FREERTOS_HZ=100: 10 ms), and
    sdkconfig.h says the same: a vTaskDelay(1) in the firmware costs a native run what it costs a board
    (the old stand-in ticked at 1000 Hz, hiding 9 ms of every tick the firmware slept)."""
    out = subprocess.run([str(driver)], capture_output=True, text=True, check=True).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("tick_hz"))
    assert line.split() == ["tick_hz", "100", "ms_per_tick", "10", "ticks_10ms", "1", "hz", "100"]
