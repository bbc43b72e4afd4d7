/* ESP-IDF STAND-IN for esp-check's native target (not ESP-IDF).
 * esp_cpu_get_cycle_count(): the host's monotonic clock scaled to CONFIG_ESP_DEFAULT_CPU_FREQ_MHZ
 * "cycles", so the host converts it back to time with INFO cpu_mhz. It measures host time. */
#pragma once
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
typedef uint32_t esp_cpu_cycle_count_t;
esp_cpu_cycle_count_t esp_cpu_get_cycle_count(void);
#ifdef __cplusplus
}
#endif
