/* ESP-IDF STAND-IN for esp-check's native target (not ESP-IDF): the ESP-IDF < 5.3 name. */
#pragma once
#ifdef __cplusplus
extern "C" {
#endif
void esp_vfs_usb_serial_jtag_use_driver(void);
#ifdef __cplusplus
}
#endif
