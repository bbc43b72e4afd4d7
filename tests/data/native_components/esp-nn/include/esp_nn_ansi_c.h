/* TEST FIXTURE (esp-nn stand-in): CONFIG_NN_ANSI_C maps every kernel to its ANSI C version. */
#pragma once
#include "esp_nn_ansi_headers.h"
#define esp_nn_max_pool_s8 esp_nn_max_pool_s8_ansi
