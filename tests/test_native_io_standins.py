"""The native target's console, partition, mmap, otadata and restart stand-ins, compiled with the host
compiler and checked from outside.

What is real: the stand-in sources as the native build compiles them (standins/src/console.c, flash.c),
the host C compiler, the partition table packer the builds use, harness.flashfmt.otadata (the format the
simulated bootloader and the native board's boot stand-in read). Nothing is faked: each test runs a
small C driver with a flash image file and reads what it prints.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.firmware.native.config import idf_api_h, resolve, sdkconfig_h
from harness.firmware.native.driver import STANDINS_DIR
from harness.flashfmt import otadata
from harness.flashfmt.partitions import pack_partition_table, parse_partitions_csv

CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = [pytest.mark.needs_cc, pytest.mark.skipif(CC is None, reason="no host C compiler")]

DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "driver/uart.h"
#include "esp_ota_ops.h"
#include "esp_partition.h"
#include "esp_system.h"
#include "mbedtls/sha256.h"

static uint8_t buf[4096];

static int echo(void) {  /* every byte back, as read, until stdin ends and the ring is empty */
    if (uart_driver_install(0, 64, 0, 0, NULL, 0) != ESP_OK) return 1;
    if (uart_driver_install(0, 64, 0, 0, NULL, 0) != ESP_ERR_INVALID_STATE) return 2;
    size_t most = 0, total = 0;
    /* stop after 0.5 s of silence once bytes came (5 s before the first: a loaded machine starts slowly) */
    for (int idle = 0; idle < (total > 0 ? 10 : 100);) {
        size_t avail = 0;
        if (uart_get_buffered_data_len(0, &avail) != ESP_OK) return 3;
        if (avail > most) most = avail;
        int n = uart_read_bytes(0, buf, avail > 0 ? (uint32_t)avail : 1, pdMS_TO_TICKS(avail > 0 ? 0 : 50));
        if (n <= 0) { ++idle; continue; }
        idle = 0;
        total += (size_t)n;
        if (uart_write_bytes(0, buf, (size_t)n) != n) return 4;
    }
    fprintf(stderr, "most=%u\n", (unsigned)most);
    return 0;
}

static int part(const char *label) {
    const esp_partition_t *p =
        esp_partition_find_first(ESP_PARTITION_TYPE_ANY, ESP_PARTITION_SUBTYPE_ANY, label);
    if (p == NULL) { printf("none\n"); return 0; }
    const void *ptr = NULL;
    esp_partition_mmap_handle_t h;
    esp_err_t err = esp_partition_mmap(p, 0, p->size, ESP_PARTITION_MMAP_DATA, &ptr, &h);
    unsigned char d[32];
    if (err == ESP_OK) mbedtls_sha256((const unsigned char *)ptr, 4096, d, 0);
    printf("%s type=%d subtype=0x%x at=0x%x size=0x%x mmap=%d sha=", p->label, (int)p->type,
           (unsigned)p->subtype, (unsigned)p->address, (unsigned)p->size, err);
    for (int k = 0; k < 32; ++k) printf("%02x", err == ESP_OK ? d[k] : 0);
    printf("\n");
    if (err == ESP_OK) esp_partition_munmap(h);
    err = esp_partition_mmap(p, 0, p->size + 1, ESP_PARTITION_MMAP_DATA, &ptr, &h);
    printf("oversize=%d\n", err == ESP_ERR_INVALID_ARG);
    return 0;
}

static int boot(int slot) {
    const esp_partition_t *running = esp_ota_get_running_partition();
    printf("running=%s\n", running ? running->label : "-");
    const esp_partition_t *p = esp_partition_find_first(ESP_PARTITION_TYPE_APP,
        slot == 0 ? ESP_PARTITION_SUBTYPE_APP_OTA_0 : ESP_PARTITION_SUBTYPE_APP_OTA_1, NULL);
    printf("set=0x%x\n", (unsigned)esp_ota_set_boot_partition(p));
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "echo") == 0) return echo();
    if (argc > 2 && strcmp(argv[1], "part") == 0) return part(argv[2]);
    if (argc > 2 && strcmp(argv[1], "boot") == 0) return boot(atoi(argv[2]));
    if (argc > 1 && strcmp(argv[1], "restart") == 0) { esp_restart(); }
    return 9;
}
"""

CSV = """\
nvs,      data, nvs,    0x9000,   0x7000
otadata,  data, ota,    0x10000,  0x2000
ota_0,    app,  ota_0,  0x20000,  0x100000
ota_1,    app,  ota_1,  0x120000, 0x100000
model,    data, 0x40,   0x220000, 0x1E0000
"""


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("io-standins")
    config = tmp / "config"
    config.mkdir()
    defaults = {"CONFIG_IDF_TARGET": '"esp32"', "CONFIG_ESP_CONSOLE_UART_DEFAULT": "y"}
    (config / "sdkconfig.h").write_text(sdkconfig_h(resolve(defaults)))
    (config / "esp_check_idf_api.h").write_text(idf_api_h("5.5.3"))
    (tmp / "driver.c").write_text(DRIVER)
    exe = tmp / "driver"
    assert CC is not None
    src = STANDINS_DIR / "src"
    subprocess.run(
        [CC, "-std=c11", "-Wall", "-Wextra", "-Werror", "-I", str(STANDINS_DIR / "include"),
         "-I", str(config),
         str(tmp / "driver.c"),
         *(str(src / f) for f in ("standins.c", "sha256.c", "console.c", "flash.c", "noinit.c")),
         "-o", str(exe)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return exe


@pytest.mark.slow
@settings(max_examples=20, deadline=None)
@given(data=st.binary(min_size=1, max_size=5000))
def test_the_uart_stand_in_is_binary_safe_and_bounded_by_its_ring(driver: Path, data: bytes) -> None:
    """LF, CR, NUL and every other byte cross unchanged both ways (no LF -> CRLF, unlike ESP-IDF's
    stdio); the driver never holds more than the receive ring it was installed with (64 bytes)."""
    run = subprocess.run([str(driver), "echo"], input=data, capture_output=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout == data
    most = int(run.stderr.decode().strip().split("=")[1])
    assert most <= 64  # never more than the ring, however much waits in the pipe
    if len(data) > 64:
        assert most == 64  # the ring filled up (the rest waited in the pipe), and nothing was lost


def _board(tmp: Path, csv: str = CSV) -> tuple[Path, dict[str, str], bytes]:
    flash = bytearray(b"\xff" * (4 << 20))
    flash[0x8000 : 0x8000 + 0xC00] = pack_partition_table(parse_partitions_csv(csv))
    model = bytes((i * 37 + 11) & 0xFF for i in range(4096))
    flash[0x220000 : 0x220000 + len(model)] = model
    (tmp / "flash.bin").write_bytes(bytes(flash))
    (tmp / "apps").mkdir()
    env = {
        "ESP_CHECK_NATIVE_FLASH": str(tmp / "flash.bin"),
        "ESP_CHECK_NATIVE_TABLE_OFFSET": "0x8000",
        "ESP_CHECK_NATIVE_APP_OFFSET": "0x20000",
        "ESP_CHECK_NATIVE_BOARD_DIR": str(tmp),
    }
    return tmp / "flash.bin", env, model


def _run(driver: Path, env: dict[str, str], *args: str) -> list[str]:
    out = subprocess.run([str(driver), *args], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_partitions_come_from_the_flash_image_and_the_model_partition_maps(
    driver: Path, tmp_path: Path
) -> None:
    _, env, model = _board(tmp_path)
    line, oversize = _run(driver, env, "part", "model")
    sha = hashlib.sha256(model).hexdigest()
    assert line == f"model type=1 subtype=0x40 at=0x220000 size=0x1e0000 mmap=0 sha={sha}"
    assert oversize == "oversize=1"  # beyond the partition: refused, never mapped
    assert _run(driver, env, "part", "nope") == ["none"]
    # no flash image (a program run by hand): no partition, so the firmware reports its model missing
    assert _run(driver, {}, "part", "model") == ["none"]


def test_boot_partition_writes_otadata_the_bootloaders_read(driver: Path, tmp_path: Path) -> None:
    flash, env, _ = _board(tmp_path)

    def selected() -> int | None:
        return otadata.selected_slot(flash.read_bytes()[0x10000:0x12000], 2)

    assert selected() is None  # erased otadata: ota_0 boots
    # the slot holds no program: validation fails (ESP_ERR_OTA_VALIDATE_FAILED), otadata untouched
    assert _run(driver, env, "boot", "1") == ["running=ota_0", "set=0x1503"]
    assert selected() is None
    for slot in (1, 0, 1):
        (tmp_path / "apps" / f"0x{0x20000 + slot * 0x100000:x}").write_bytes(b"#!/bin/sh\n")
        (tmp_path / "apps" / f"0x{0x20000 + slot * 0x100000:x}").chmod(0o700)
        assert _run(driver, env, "boot", str(slot)) == ["running=ota_0", "set=0x0"]
        assert selected() == slot
    env["ESP_CHECK_NATIVE_APP_OFFSET"] = "0x120000"
    assert _run(driver, env, "boot", "1")[0] == "running=ota_1"


def test_a_slot_no_otadata_sequence_selects_is_refused_not_looped_on(driver: Path, tmp_path: Path) -> None:
    # ota_1 without ota_0: one OTA app, so no sequence number selects slot 1 (ESP-IDF: ESP_ERR_INVALID_ARG);
    # the stand-in searched for one forever. The builds refuse such a table; the stand-in must still end.
    table = CSV.replace(
        "ota_0,    app,  ota_0,  0x20000,  0x100000", "factory,  app,  factory, 0x20000, 0x100000"
    )
    flash, env, _ = _board(tmp_path, table)
    (tmp_path / "apps" / "0x120000").write_bytes(b"#!/bin/sh\n")
    (tmp_path / "apps" / "0x120000").chmod(0o700)
    before = flash.read_bytes()[0x10000:0x12000]
    assert _run(driver, env, "boot", "1") == ["running=factory", "set=0x102"]
    assert flash.read_bytes()[0x10000:0x12000] == before  # otadata untouched


def test_restart_leaves_the_marker_the_native_board_reboots_on(driver: Path, tmp_path: Path) -> None:
    _, env, _ = _board(tmp_path)
    assert _run(driver, env, "restart") == []
    assert (tmp_path / "sw_reset").exists()
