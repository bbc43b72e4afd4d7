/* ESP-IDF STAND-IN for esp-check's native target (not ESP-IDF). */
#pragma once
#include "esp_err.h"
#include "esp_idf_version.h"
#ifdef __cplusplus
extern "C" {
#endif
void esp_restart(void) __attribute__((noreturn));
#ifdef __cplusplus
}
#endif
