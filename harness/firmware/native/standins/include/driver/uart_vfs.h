/* ESP-IDF STAND-IN for esp-check's native target (not ESP-IDF): stdio already is the console. */
#pragma once
#include "driver/uart.h"
#ifdef __cplusplus
extern "C" {
#endif
void uart_vfs_dev_use_driver(int uart_num);
#ifdef __cplusplus
}
#endif
