/* ESP-IDF STAND-IN for esp-check's native target (not ESP-IDF): the running app slot (which the native
 * board's boot stand-in started, ESP_CHECK_NATIVE_APP_OFFSET) and otadata in the board's flash image,
 * in ESP-IDF's format (harness/flashfmt/otadata.py describes it). */
#pragma once
#include "esp_err.h"
#include "esp_partition.h"
#ifdef __cplusplus
extern "C" {
#endif
const esp_partition_t *esp_ota_get_running_partition(void);
const esp_partition_t *esp_ota_get_next_update_partition(const esp_partition_t *start_from);
esp_err_t esp_ota_set_boot_partition(const esp_partition_t *partition);
#ifdef __cplusplus
}
#endif
