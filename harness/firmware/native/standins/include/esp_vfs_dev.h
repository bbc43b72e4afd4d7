/* ESP-IDF STAND-IN for esp-check's native target (not ESP-IDF): the ESP-IDF < 5.3 name. */
#pragma once
#include "driver/uart.h"
#ifdef __cplusplus
extern "C" {
#endif
void esp_vfs_dev_uart_use_driver(int uart_num);
#ifdef __cplusplus
}
#endif
