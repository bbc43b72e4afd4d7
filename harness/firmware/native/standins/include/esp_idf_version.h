/* ESP-IDF STAND-IN for esp-check's native target (not ESP-IDF).
 * esp_get_idf_version() returns "native-standins-<N>": no ESP-IDF is linked into a native build.
 * ESP_IDF_VERSION* give the ESP-IDF API the stand-ins present: the version the project pins
 * (esp_check_idf_api.h, generated per build next to sdkconfig.h), for code that tests it with
 * ESP_IDF_VERSION >= ESP_IDF_VERSION_VAL(...). */
#pragma once
#include "esp_check_idf_api.h"
#define ESP_IDF_VERSION_VAL(major, minor, patch) (((major) << 16) | ((minor) << 8) | (patch))
#define ESP_IDF_VERSION \
    ESP_IDF_VERSION_VAL(ESP_IDF_VERSION_MAJOR, ESP_IDF_VERSION_MINOR, ESP_IDF_VERSION_PATCH)
#ifdef __cplusplus
extern "C" {
#endif
const char *esp_get_idf_version(void);
#ifdef __cplusplus
}
#endif
