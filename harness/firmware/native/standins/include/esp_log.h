/* ESP-IDF STAND-IN for esp-check's native target (not ESP-IDF): ESP_LOGx print to stdout in the
 * ESP-IDF line format, without colours or timestamps. */
#pragma once
#include <stdio.h>
#define ESP_STANDIN_LOG(letter, tag, fmt, ...) printf(letter " (0) %s: " fmt "\n", tag, ##__VA_ARGS__)
#define ESP_LOGE(tag, fmt, ...) ESP_STANDIN_LOG("E", tag, fmt, ##__VA_ARGS__)
#define ESP_LOGW(tag, fmt, ...) ESP_STANDIN_LOG("W", tag, fmt, ##__VA_ARGS__)
#define ESP_LOGI(tag, fmt, ...) ESP_STANDIN_LOG("I", tag, fmt, ##__VA_ARGS__)
#define ESP_LOGD(tag, fmt, ...) do { (void)(tag); } while (0)
#define ESP_LOGV(tag, fmt, ...) do { (void)(tag); } while (0)
