/* ESP-IDF STAND-IN for esp-check's native target (not ESP-IDF): stdio already is the console. */
#pragma once
#ifdef __cplusplus
extern "C" {
#endif
void usb_serial_jtag_vfs_use_driver(void);
#ifdef __cplusplus
}
#endif
