/* ESP-IDF STAND-IN for esp-check's native target (not ESP-IDF). */
#pragma once
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
/* 32 random bits (ESP-IDF: the hardware RNG; here the host's /dev/urandom, with a clock fallback). */
uint32_t esp_random(void);
#ifdef __cplusplus
}
#endif
