/* ESP-IDF STAND-IN for esp-check's native target (not ESP-IDF): the UART driver, over the program's
 * stdin (receive) and stdout (transmit), byte for byte: no line-ending translation. The receive ring
 * has the size given to uart_driver_install; what does not fit stays in the pipe (a full FIFO). */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "esp_err.h"
#include "freertos/FreeRTOS.h"
#ifdef __cplusplus
extern "C" {
#endif
typedef int uart_port_t;
typedef void *QueueHandle_t;
esp_err_t uart_driver_install(uart_port_t uart_num, int rx_buffer_size, int tx_buffer_size, int queue_size,
                              QueueHandle_t *uart_queue, int intr_alloc_flags);
int uart_write_bytes(uart_port_t uart_num, const void *src, size_t size);
int uart_read_bytes(uart_port_t uart_num, void *buf, uint32_t length, TickType_t ticks_to_wait);
esp_err_t uart_get_buffered_data_len(uart_port_t uart_num, size_t *size);
esp_err_t uart_wait_tx_done(uart_port_t uart_num, TickType_t ticks_to_wait);
/* a pipe has no line rate: the baud is only remembered (115200 until set) */
esp_err_t uart_set_baudrate(uart_port_t uart_num, uint32_t baudrate);
esp_err_t uart_get_baudrate(uart_port_t uart_num, uint32_t *baudrate);
#ifdef __cplusplus
}
#endif
