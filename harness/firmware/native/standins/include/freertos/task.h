/* ESP-IDF STAND-IN for esp-check's native target (not ESP-IDF / FreeRTOS): vTaskDelay sleeps the host
 * thread for the given ticks (configTICK_RATE_HZ in FreeRTOS.h). */
#pragma once
#include "freertos/FreeRTOS.h"
#ifdef __cplusplus
extern "C" {
#endif
void vTaskDelay(const TickType_t xTicksToDelay);
#ifdef __cplusplus
}
#endif
