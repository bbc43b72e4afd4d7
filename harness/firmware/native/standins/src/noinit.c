/* ESP-IDF STAND-IN for esp-check's native target (not ESP-IDF): the memory EXT_RAM_NOINIT_ATTR places
 * (esp_attr.h). A software restart (esp_restart) saves it to the board's directory and the next boot
 * loads it, as PSRAM keeps its contents across a restart; the native board deletes that file at a cold
 * boot (harness/device/protocol_native.py), and a boot without it starts with noise, as PSRAM powers up. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "esp_mmu_map.h"

extern uint8_t __start_esp_check_ext_ram_noinit[] __attribute__((weak));
extern uint8_t __stop_esp_check_ext_ram_noinit[] __attribute__((weak));

#define NOINIT_FILE "psram_noinit.bin"

static size_t noinit_size(void) {
    if (__start_esp_check_ext_ram_noinit == NULL || __stop_esp_check_ext_ram_noinit == NULL) return 0;
    return (size_t)(__stop_esp_check_ext_ram_noinit - __start_esp_check_ext_ram_noinit);
}

static int noinit_path(char *out, size_t cap) {
    const char *dir = getenv("ESP_CHECK_NATIVE_BOARD_DIR");
    return dir != NULL && dir[0] != '\0' && snprintf(out, cap, "%s/%s", dir, NOINIT_FILE) < (int)cap;
}

esp_err_t esp_mmu_vaddr_to_paddr(void *vaddr, esp_paddr_t *out_paddr, mmu_target_t *out_target) {
    const uint8_t *p = (const uint8_t *)vaddr;
    if (noinit_size() == 0 || p < __start_esp_check_ext_ram_noinit || p >= __stop_esp_check_ext_ram_noinit) {
        return ESP_ERR_NOT_FOUND;
    }
    *out_paddr = (esp_paddr_t)(p - __start_esp_check_ext_ram_noinit);
    *out_target = MMU_TARGET_PSRAM0;
    return ESP_OK;
}

void esp_check_noinit_load(void) {
    const size_t n = noinit_size();
    char path[4096];
    size_t got = 0;
    if (n == 0) return;
    if (noinit_path(path, sizeof(path))) {
        FILE *f = fopen(path, "rb");
        if (f != NULL) {
            got = fread(__start_esp_check_ext_ram_noinit, 1, n, f);
            fclose(f);
        }
    }
    if (got != n) { /* a cold boot: noise */
        FILE *r = fopen("/dev/urandom", "rb");
        got = r != NULL ? fread(__start_esp_check_ext_ram_noinit, 1, n, r) : 0;
        if (r != NULL) fclose(r);
        if (got != n) memset(__start_esp_check_ext_ram_noinit, 0xA5, n);
    }
}

void esp_check_noinit_save(void) {
    const size_t n = noinit_size();
    char path[4096];
    int fd;
    size_t off = 0;
    if (n == 0 || !noinit_path(path, sizeof(path))) return;
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return;
    while (off < n) {
        ssize_t w = write(fd, __start_esp_check_ext_ram_noinit + off, n - off);
        if (w <= 0) break;
        off += (size_t)w;
    }
    close(fd);
}
