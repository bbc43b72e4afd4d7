/* ESP-IDF STAND-IN for esp-check's native target (not ESP-IDF).
 * esp_timer_get_time(): microseconds of the host's monotonic clock since the program started.
 * Like ESP-IDF's esp_timer.h, this header pulls in sdkconfig.h: esp-tflite-micro's ESP-NN kernels
 * get CONFIG_NN_OPTIMIZED / CONFIG_NN_ANSI_C (read by esp_nn.h) through it. */
#pragma once
#include <stdint.h>
#include "sdkconfig.h"
#include "esp_err.h"
#ifdef __cplusplus
extern "C" {
#endif
int64_t esp_timer_get_time(void);
#ifdef __cplusplus
}
#endif
