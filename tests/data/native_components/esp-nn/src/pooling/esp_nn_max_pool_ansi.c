/* TEST FIXTURE (esp-nn stand-in): int8 max pooling, NHWC, the plain way. */
#include <esp_nn_ansi_headers.h>

void esp_nn_max_pool_s8_ansi(const int8_t *input, const uint16_t input_wd, const uint16_t input_ht,
                             int8_t *output, const uint16_t output_wd, const uint16_t output_ht,
                             const uint16_t stride_wd, const uint16_t stride_ht, const uint16_t filter_wd,
                             const uint16_t filter_ht, const uint16_t pad_wd, const uint16_t pad_ht,
                             const int32_t activation_min, const int32_t activation_max,
                             const uint16_t channels) {
    for (int oy = 0; oy < output_ht; ++oy) {
        for (int ox = 0; ox < output_wd; ++ox) {
            for (int c = 0; c < channels; ++c) {
                int32_t best = -128;
                for (int fy = 0; fy < filter_ht; ++fy) {
                    const int iy = oy * stride_ht - pad_ht + fy;
                    if (iy < 0 || iy >= input_ht) continue;
                    for (int fx = 0; fx < filter_wd; ++fx) {
                        const int ix = ox * stride_wd - pad_wd + fx;
                        if (ix < 0 || ix >= input_wd) continue;
                        const int32_t v = input[(iy * input_wd + ix) * channels + c];
                        if (v > best) best = v;
                    }
                }
                if (best < activation_min) best = activation_min;
                if (best > activation_max) best = activation_max;
                output[(oy * output_wd + ox) * channels + c] = (int8_t)best;
            }
        }
    }
}
