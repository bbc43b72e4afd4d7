/* ESP-IDF STAND-IN for esp-check's native target (not ESP-IDF): the one attribute the firmware uses.
 * EXT_RAM_NOINIT_ATTR: PSRAM that ESP-IDF leaves alone at start-up and a software restart does not clear.
 * Here it is a section of the program that the stand-ins keep across esp_restart() (src/noinit.c: saved to
 * the board's directory, loaded at the next boot); a cold boot (a reset, a power-on) starts with noise. */
#pragma once
#define EXT_RAM_NOINIT_ATTR __attribute__((section("esp_check_ext_ram_noinit")))
