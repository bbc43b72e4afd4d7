/* TEST FIXTURE (esp-nn stand-in): CONFIG_NN_OPTIMIZED on a generic chip maps to the _opt versions. */
#pragma once
#include "esp_nn_ansi_headers.h"
#define esp_nn_max_pool_s8 esp_nn_max_pool_s8_opt
