/* TEST FIXTURE standing in for esp-nn's esp_nn.h: picks the kernel set from the ESP-NN Kconfig
 * choice, like the real header (CONFIG_NN_* must come from sdkconfig.h, included before this). */
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

#include "esp_nn_ansi_headers.h"

#if defined(CONFIG_NN_OPTIMIZED)
#include "esp_nn_generic_opt.h"
#else
#include "esp_nn_ansi_c.h"
#endif

#ifdef __cplusplus
}
#endif
