/* ESP-IDF STAND-IN for esp-check's native target (not ESP-IDF / FreeRTOS): tick type and rate. */
#pragma once
#include <stdint.h>
typedef uint32_t TickType_t;
typedef int BaseType_t;
/* ESP-IDF's default CONFIG_FREERTOS_HZ, as on the chips: one tick is 10 ms (vTaskDelay(1) costs a native
 * run what it costs a board). */
#define configTICK_RATE_HZ 100
#define portTICK_PERIOD_MS (1000 / configTICK_RATE_HZ)
#define pdMS_TO_TICKS(ms) ((TickType_t)(((uint64_t)(ms) * configTICK_RATE_HZ) / 1000))
#define portMAX_DELAY ((TickType_t)0xffffffffUL)
