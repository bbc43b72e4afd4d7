/* ESP-IDF STAND-IN for esp-check's native target (not ESP-IDF): esp_err_t and the codes used here. */
#pragma once
#include <stdint.h>
typedef int esp_err_t;
#define ESP_OK 0
#define ESP_FAIL -1
#define ESP_ERR_NO_MEM 0x101
#define ESP_ERR_INVALID_ARG 0x102
