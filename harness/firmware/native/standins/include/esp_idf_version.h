/* ESP-IDF STAND-IN for esp-check's native target (not ESP-IDF).
 * esp_get_idf_version() returns "native-standins-<N>": no ESP-IDF is linked into a native build. */
#pragma once
#ifdef __cplusplus
extern "C" {
#endif
const char *esp_get_idf_version(void);
#ifdef __cplusplus
}
#endif
