/* ESP-IDF STAND-INS for esp-check's native target (not ESP-IDF): the UART and USB-Serial-JTAG drivers
 * over the program's stdin and stdout. See ../README.md.
 *
 * Transmit: write(2) to stdout, looping over partial writes; the bytes leave as given (binary frames and
 * text alike: no LF -> CRLF translation, which ESP-IDF's stdio would do and its drivers do not).
 * Receive: a ring of the size the firmware installed the driver with, filled from stdin with what is
 * there; bytes the ring cannot take stay in the pipe, and bytes beyond the pipe's capacity are dropped
 * by the native board (harness/device/protocol_native.py), as a full UART FIFO drops them. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "driver/uart.h"
#include "driver/uart_vfs.h"
#include "driver/usb_serial_jtag.h"
#include "driver/usb_serial_jtag_vfs.h"
#include "esp_vfs_dev.h"
#include "esp_vfs_usb_serial_jtag.h"

#define RX_MIN 64
#define RX_MAX (1 << 20)

static uint8_t *g_ring;
static size_t g_cap, g_head, g_count;
static int g_eof;

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static esp_err_t install(int rx_buffer_size) {
    if (g_ring != NULL) return ESP_ERR_INVALID_STATE; /* as ESP-IDF: installed once */
    size_t cap = rx_buffer_size < RX_MIN ? RX_MIN : (size_t)rx_buffer_size;
    if (cap > RX_MAX) return ESP_ERR_INVALID_ARG;
    g_ring = (uint8_t *)malloc(cap);
    if (g_ring == NULL) return ESP_ERR_NO_MEM;
    g_cap = cap;
    g_head = g_count = 0;
    return ESP_OK;
}

/* Move what stdin holds into the ring (up to its free space), waiting up to timeout_ms (-1: forever)
 * when nothing is there yet. */
static void fill(int timeout_ms) {
    if (g_ring == NULL || g_count == g_cap) return;
    if (g_eof) { /* the host closed the line: nothing more will come; wait as a silent line would */
        if (timeout_ms != 0) {
            const int ms = timeout_ms < 0 ? 1000 : timeout_ms;
            struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
            while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
            }
        }
        return;
    }
    struct pollfd p = {0, POLLIN, 0};
    int r;
    do {
        r = poll(&p, 1, timeout_ms);
    } while (r < 0 && errno == EINTR);
    if (r <= 0) return;
    size_t tail = (g_head + g_count) % g_cap;
    size_t room = g_cap - g_count;
    size_t chunk = tail + room > g_cap ? g_cap - tail : room; /* contiguous part; the rest next time */
    ssize_t n;
    do {
        n = read(0, g_ring + tail, chunk);
    } while (n < 0 && errno == EINTR);
    if (n == 0) g_eof = 1;
    if (n > 0) g_count += (size_t)n;
}

static size_t take(uint8_t *out, size_t len) {
    size_t n = 0;
    while (n < len && g_count > 0) {
        out[n++] = g_ring[g_head];
        g_head = (g_head + 1) % g_cap;
        --g_count;
    }
    return n;
}

static int read_bytes(void *buf, uint32_t length, TickType_t ticks) {
    if (g_ring == NULL) return -1;
    uint8_t *out = (uint8_t *)buf;
    size_t got = take(out, length);
    const int forever = ticks == portMAX_DELAY;
    const int64_t deadline = now_ms() + (int64_t)ticks * portTICK_PERIOD_MS;
    while (got < length) {
        int64_t left = forever ? -1 : deadline - now_ms();
        if (!forever && left < 0) left = 0;
        fill((int)left);
        size_t n = take(out + got, length - got);
        got += n;
        if (n == 0 && !forever && now_ms() >= deadline) break;
    }
    return (int)got;
}

static int write_bytes(const void *src, size_t size) {
    const uint8_t *p = (const uint8_t *)src;
    size_t done = 0;
    while (done < size) {
        ssize_t n = write(1, p + done, size - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return done > 0 ? (int)done : -1;
        done += (size_t)n;
    }
    return (int)done;
}

esp_err_t uart_driver_install(uart_port_t uart_num, int rx_buffer_size, int tx_buffer_size, int queue_size,
                              QueueHandle_t *uart_queue, int intr_alloc_flags) {
    (void)tx_buffer_size;
    (void)queue_size;
    (void)uart_queue;
    (void)intr_alloc_flags;
    if (uart_num != 0) return ESP_ERR_INVALID_ARG; /* the console UART only */
    return install(rx_buffer_size);
}

int uart_write_bytes(uart_port_t uart_num, const void *src, size_t size) {
    return uart_num == 0 && g_ring != NULL ? write_bytes(src, size) : -1;
}

int uart_read_bytes(uart_port_t uart_num, void *buf, uint32_t length, TickType_t ticks_to_wait) {
    return uart_num == 0 ? read_bytes(buf, length, ticks_to_wait) : -1;
}

esp_err_t uart_get_buffered_data_len(uart_port_t uart_num, size_t *size) {
    if (uart_num != 0 || g_ring == NULL) return ESP_FAIL;
    fill(0);
    *size = g_count;
    return ESP_OK;
}

esp_err_t uart_wait_tx_done(uart_port_t uart_num, TickType_t ticks_to_wait) {
    (void)ticks_to_wait;
    return uart_num == 0 ? ESP_OK : ESP_ERR_INVALID_ARG; /* write(2) has handed every byte to the pipe */
}

static uint32_t g_baud = 115200;

esp_err_t uart_set_baudrate(uart_port_t uart_num, uint32_t baudrate) {
    if (uart_num != 0 || baudrate == 0) return ESP_ERR_INVALID_ARG;
    g_baud = baudrate;
    return ESP_OK;
}

esp_err_t uart_get_baudrate(uart_port_t uart_num, uint32_t *baudrate) {
    if (uart_num != 0 || baudrate == NULL) return ESP_ERR_INVALID_ARG;
    *baudrate = g_baud;
    return ESP_OK;
}

void uart_vfs_dev_use_driver(int uart_num) { (void)uart_num; }
void esp_vfs_dev_uart_use_driver(int uart_num) { (void)uart_num; }

esp_err_t usb_serial_jtag_driver_install(usb_serial_jtag_driver_config_t *config) {
    return config == NULL ? ESP_ERR_INVALID_ARG : install((int)config->rx_buffer_size);
}

int usb_serial_jtag_write_bytes(const void *src, size_t size, TickType_t ticks_to_wait) {
    (void)ticks_to_wait;
    return g_ring != NULL ? write_bytes(src, size) : -1;
}

int usb_serial_jtag_read_bytes(void *buf, uint32_t length, TickType_t ticks_to_wait) {
    return read_bytes(buf, length, ticks_to_wait);
}

void usb_serial_jtag_vfs_use_driver(void) {}
void esp_vfs_usb_serial_jtag_use_driver(void) {}
