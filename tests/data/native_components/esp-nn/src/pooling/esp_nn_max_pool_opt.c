/* TEST FIXTURE (esp-nn stand-in): int8 max pooling, the "optimized" way (window clipped up front,
 * one output pixel's channels at a time). Same results as the ANSI version unless a test injects a
 * fault at the FIXTURE-FAULT line. */
#include <string.h>

#include <esp_nn_ansi_headers.h>

void esp_nn_max_pool_s8_opt(const int8_t *input, const uint16_t input_wd, const uint16_t input_ht,
                            int8_t *output, const uint16_t output_wd, const uint16_t output_ht,
                            const uint16_t stride_wd, const uint16_t stride_ht, const uint16_t filter_wd,
                            const uint16_t filter_ht, const uint16_t pad_wd, const uint16_t pad_ht,
                            const int32_t activation_min, const int32_t activation_max,
                            const uint16_t channels) {
    for (int oy = 0; oy < output_ht; ++oy) {
        const int y0 = oy * stride_ht - pad_ht;
        const int fy_start = y0 < 0 ? -y0 : 0;
        const int fy_end = (input_ht - y0) < filter_ht ? (input_ht - y0) : filter_ht;
        for (int ox = 0; ox < output_wd; ++ox) {
            const int x0 = ox * stride_wd - pad_wd;
            const int fx_start = x0 < 0 ? -x0 : 0;
            const int fx_end = (input_wd - x0) < filter_wd ? (input_wd - x0) : filter_wd;
            int8_t *out = output + (oy * output_wd + ox) * channels;
            memset(out, 0x80, channels);
            for (int fy = fy_start; fy < fy_end; ++fy) {
                for (int fx = fx_start; fx < fx_end; ++fx) {
                    const int8_t *in = input + ((y0 + fy) * input_wd + (x0 + fx)) * channels;
                    for (int c = 0; c < channels; ++c) {
                        if (in[c] > out[c]) out[c] = in[c];
                    }
                }
            }
            for (int c = 0; c < channels; ++c) {
                int32_t v = out[c];
                v = v < activation_min ? activation_min : (v > activation_max ? activation_max : v);
                out[c] = (int8_t)v; /* FIXTURE-FAULT */
            }
        }
    }
}
