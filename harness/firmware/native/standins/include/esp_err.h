/* ESP-IDF STAND-IN for esp-check's native target (not ESP-IDF): esp_err_t and the codes used here
 * (ESP-IDF's values). */
#pragma once
#include <stdint.h>
typedef int esp_err_t;
#define ESP_OK 0
#define ESP_FAIL -1
#define ESP_ERR_NO_MEM 0x101
#define ESP_ERR_INVALID_ARG 0x102
#define ESP_ERR_INVALID_STATE 0x103
#define ESP_ERR_INVALID_SIZE 0x104
#define ESP_ERR_NOT_FOUND 0x105
#define ESP_ERR_TIMEOUT 0x107
#define ESP_ERR_OTA_BASE 0x1500
#define ESP_ERR_OTA_VALIDATE_FAILED (ESP_ERR_OTA_BASE + 0x03)
#define ESP_ERR_IMAGE_INVALID 0x2002 /* ESP-IDF: esp_image_format.h, ESP_ERR_IMAGE_BASE + 2 */
