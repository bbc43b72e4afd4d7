/* TEST FIXTURE (esp-nn stand-in): the kernel entry points, with esp-nn's max pool signature. */
#pragma once
#include <stdint.h>

void esp_nn_max_pool_s8_ansi(const int8_t *input, const uint16_t input_wd, const uint16_t input_ht,
                             int8_t *output, const uint16_t output_wd, const uint16_t output_ht,
                             const uint16_t stride_wd, const uint16_t stride_ht, const uint16_t filter_wd,
                             const uint16_t filter_ht, const uint16_t pad_wd, const uint16_t pad_ht,
                             const int32_t activation_min, const int32_t activation_max,
                             const uint16_t channels);

void esp_nn_max_pool_s8_opt(const int8_t *input, const uint16_t input_wd, const uint16_t input_ht,
                            int8_t *output, const uint16_t output_wd, const uint16_t output_ht,
                            const uint16_t stride_wd, const uint16_t stride_ht, const uint16_t filter_wd,
                            const uint16_t filter_ht, const uint16_t pad_wd, const uint16_t pad_ht,
                            const int32_t activation_min, const int32_t activation_max,
                            const uint16_t channels);
