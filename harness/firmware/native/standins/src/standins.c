/* ESP-IDF STAND-INS for esp-check's native target (not ESP-IDF): timer, cycle counter, chip info,
 * heap_caps, IDF version, task delay (restart: flash.c). See ../README.md. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "esp_chip_info.h"
#include "esp_cpu.h"
#include "esp_heap_caps.h"
#include "esp_idf_version.h"
#include "esp_random.h"
#include "esp_system.h"
#include "esp_timer.h"
#include "freertos/task.h"
#include "sdkconfig.h"

#ifndef CONFIG_ESP_DEFAULT_CPU_FREQ_MHZ
#define CONFIG_ESP_DEFAULT_CPU_FREQ_MHZ 240
#endif
#define ESP_CHECK_STANDINS_VERSION "native-standins-1"

static int64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + (int64_t)ts.tv_nsec;
}

static int64_t g_start_ns = -1;

void esp_check_noinit_load(void);

void esp_check_standins_start(void) {
    g_start_ns = monotonic_ns();
    esp_check_noinit_load(); /* EXT_RAM_NOINIT_ATTR memory: kept from a software restart, else noise */
}

static int64_t elapsed_ns(void) {
    if (g_start_ns < 0) esp_check_standins_start();
    return monotonic_ns() - g_start_ns;
}

int64_t esp_timer_get_time(void) { return elapsed_ns() / 1000; }

esp_cpu_cycle_count_t esp_cpu_get_cycle_count(void) {
    /* Wraps like the 32-bit CCOUNT register does. */
    return (esp_cpu_cycle_count_t)((uint64_t)elapsed_ns() * CONFIG_ESP_DEFAULT_CPU_FREQ_MHZ / 1000u);
}

void esp_chip_info(esp_chip_info_t *out_info) {
    memset(out_info, 0, sizeof(*out_info));
    out_info->model = CHIP_POSIX_LINUX;
    out_info->cores = 1;
}

const char *esp_get_idf_version(void) { return ESP_CHECK_STANDINS_VERSION; }

uint32_t esp_random(void) {
    uint32_t v = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (f != NULL) {
        if (fread(&v, sizeof(v), 1, f) != 1) v = 0;
        fclose(f);
    }
    if (v == 0) v = (uint32_t)monotonic_ns() ^ 0x9E3779B9u; /* no /dev/urandom: still differs per boot */
    return v;
}

void *heap_caps_malloc(size_t size, uint32_t caps) {
    (void)caps;
    return malloc(size);
}

void *heap_caps_calloc(size_t n, size_t size, uint32_t caps) {
    (void)caps;
    return calloc(n, size);
}

void *heap_caps_aligned_alloc(size_t alignment, size_t size, uint32_t caps) {
    (void)caps;
    if (alignment == 0 || (alignment & (alignment - 1)) != 0) return NULL;
    if (alignment < sizeof(void *)) alignment = sizeof(void *); /* posix_memalign's minimum */
    void *p = NULL;
    if (posix_memalign(&p, alignment, size) != 0) return NULL;
    return p;
}

void heap_caps_free(void *ptr) { free(ptr); }

void heap_caps_aligned_free(void *ptr) { free(ptr); }

size_t heap_caps_get_free_size(uint32_t caps) {
    (void)caps;
    return (size_t)1 << 30; /* the host's heap: not a chip's RAM */
}

size_t heap_caps_get_largest_free_block(uint32_t caps) { return heap_caps_get_free_size(caps); }

void vTaskDelay(const TickType_t xTicksToDelay) {
    uint64_t ms = (uint64_t)xTicksToDelay * portTICK_PERIOD_MS;
    struct timespec ts = {(time_t)(ms / 1000u), (long)((ms % 1000u) * 1000000u)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}
