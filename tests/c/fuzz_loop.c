/* Fuzz driver for the portable frame decoder and command loop (tests/test_frames.py builds it with
 * -fsanitize=address,undefined). Each argument is a file of hostile bytes; it is fed to a fresh decoder
 * and a fresh loop in chunks whose sizes come from the file's first byte. Any out-of-bounds access or
 * undefined behaviour aborts with a sanitizer report; the exit code is 0 otherwise. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "esp_check_frame.h"
#include "esp_check_loop.h"
#include "esp_check_proto.h"

static size_t g_written;
static uint8_t g_out0[300], g_out1[11];
static unsigned g_invokes;

static int w_ecp(void *ctx, const char *buf, size_t n) { (void)ctx; (void)buf; g_written += n; return (int)n; }
static int w_raw(void *ctx, const uint8_t *buf, size_t n) { (void)ctx; (void)buf; g_written += n; return (int)n; }
static int invoke(void *ctx, const uint8_t *in, size_t n, uint32_t *us) {
    size_t k;
    (void)ctx;
    g_invokes++;
    for (k = 0; k < sizeof(g_out0); k++) g_out0[k] = (uint8_t)(in[k % n] + g_invokes * (k == 7));
    for (k = 0; k < sizeof(g_out1); k++) g_out1[k] = in[(k * 13) % n];
    *us = (uint32_t)n * ((in[n - 1] & 1u) ? 200000u : 1u); /* some "slow" invokes: results batched by time */
    return in[0] == 0xEE ? 3 : 0; /* an "invoke error" some inputs trigger */
}
static void session(void *ctx, ecp_t *e, uint32_t k) { (void)ctx; ecp_begin(e, "fuzz", 1); ecp_info_int(e, "inputs", k); }
static void sha(void *ctx, const uint8_t *d, size_t n, char *out) { (void)ctx; (void)d; (void)n; memset(out, 'a', 64); out[64] = 0; }
static int boot(void *ctx, uint8_t slot) { (void)ctx; return slot == 1 ? 0 : 7; }
static void on_frame(void *ctx, const ecf_frame_t *f) { size_t *n = (size_t *)ctx; *n += f->len; }

int main(int argc, char **argv) {
    static uint8_t staging[64];
    static uint8_t keep[64 + 8 * 6 + 16 + 6 * 64 + 40]; /* a kept-input store of 6 inputs, kept across cases */
    static const uint8_t model_sha[32] = {1, 2, 3};
    static ecp_t ecp;
    static ecl_t loop;
    static ecf_decoder_t dec;
    ecl_output_t outs[2];
    ecl_config_t cfg;
    int a;
    memset(outs, 0, sizeof(outs));
    outs[0].data = g_out0; outs[0].bytes = sizeof(g_out0); outs[0].dtype = "int8"; outs[0].ndims = 2;
    outs[0].dims[0] = 1; outs[0].dims[1] = 300; outs[0].scale = 0.5f; outs[0].name = "o0";
    outs[1].data = g_out1; outs[1].bytes = sizeof(g_out1); outs[1].dtype = "uint8"; outs[1].ndims = 2;
    outs[1].dims[0] = 1; outs[1].dims[1] = 11; outs[1].name = "o1";
    for (a = 1; a < argc; a++) {
        static uint8_t data[1 << 20];
        size_t n, pos = 0, frames_len = 0;
        FILE *f = fopen(argv[a], "rb");
        if (f == NULL) return 2;
        n = fread(data, 1, sizeof(data), f);
        fclose(f);
        memset(&cfg, 0, sizeof(cfg));
        cfg.write = w_raw; cfg.invoke = invoke; cfg.session_begin = session; cfg.sha256_hex = sha;
        cfg.boot_slot = boot; cfg.ecp = &ecp; cfg.staging = staging; cfg.input_bytes = sizeof(staging);
        cfg.input_dtype = (uint8_t)(a % 6); cfg.outputs = outs; cfg.n_outputs = 2; cfg.window = 5000;
        cfg.human_max = 4; cfg.fwver = "fuzz"; cfg.model_sha256 = model_sha; cfg.session = (uint32_t)a;
        cfg.keep = a % 4 ? keep : NULL; cfg.keep_bytes = a % 4 == 3 ? 70 : sizeof(keep);
        ecp_init(&ecp, w_ecp, NULL);
        if (ecl_init(&loop, &cfg) != 0) return 3;
        ecl_hello(&loop);
        ecf_decoder_init(&dec, (size_t)(n > 0 ? data[0] : 0) * 17);
        while (pos < n) {
            size_t k = 1 + (data[pos] % 97);
            if (k > n - pos) k = n - pos;
            ecf_decoder_feed(&dec, data + pos, k, on_frame, &frames_len);
            ecl_rx(&loop, data + pos, k);
            if (data[pos] % 5 == 0) ecl_idle(&loop);
            pos += k;
        }
        ecl_idle(&loop);
    }
    printf("ok %u invokes, %lu bytes out\n", g_invokes, (unsigned long)g_written);
    return 0;
}
