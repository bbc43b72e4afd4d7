/* esp-check binary frames, version 2: encoder, streaming decoder, input PRNG (see esp_check_frame.h). */
#include "esp_check_frame.h"

#include <string.h>

#include "esp_check_proto.h"

uint32_t ecf_crc32(uint32_t crc, const uint8_t *data, size_t len) { return ecp_crc32(crc, data, len); }

void ecf_put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)(v & 0xFFu);
    p[1] = (uint8_t)(v >> 8);
}

void ecf_put_u32(uint8_t *p, uint32_t v) {
    int k;
    for (k = 0; k < 4; k++) p[k] = (uint8_t)((v >> (8 * k)) & 0xFFu);
}

void ecf_put_u64(uint8_t *p, uint64_t v) {
    int k;
    for (k = 0; k < 8; k++) p[k] = (uint8_t)((v >> (8 * k)) & 0xFFu);
}

uint16_t ecf_get_u16(const uint8_t *p) { return (uint16_t)(p[0] | ((uint16_t)p[1] << 8)); }

uint32_t ecf_get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

uint64_t ecf_get_u64(const uint8_t *p) { return (uint64_t)ecf_get_u32(p) | ((uint64_t)ecf_get_u32(p + 4) << 32); }

uint32_t ecf_key_crc(uint32_t session, uint8_t nn) {
    uint8_t k[5];
    ecf_put_u32(k, session);
    k[4] = nn;
    return ecf_crc32(0u, k, sizeof(k));
}

int ecf_keyed(uint8_t type) { return type != ECF_TYPE_HELLO_Q && type != ECF_TYPE_HELLO; }

size_t ecf_b64(char *out, size_t cap, const uint8_t *in, size_t n) {
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t k, w = 0;
    if (out == NULL || (n + 2) / 3 > cap / 4) return 0;
    for (k = 0; k < n; k += 3) {
        uint32_t v = (uint32_t)in[k] << 16;
        size_t left = n - k;
        if (left > 1) v |= (uint32_t)in[k + 1] << 8;
        if (left > 2) v |= (uint32_t)in[k + 2];
        out[w++] = A[(v >> 18) & 63u];
        out[w++] = A[(v >> 12) & 63u];
        out[w++] = left > 1 ? A[(v >> 6) & 63u] : '=';
        out[w++] = left > 2 ? A[v & 63u] : '=';
    }
    return w;
}

size_t ecf_encode(uint8_t *out, size_t cap, uint8_t type, uint8_t flags, uint16_t seq, const uint8_t *payload,
                  size_t len) {
    return ecf_encode_keyed(out, cap, type, flags, seq, payload, len, 0u);
}

size_t ecf_encode_keyed(uint8_t *out, size_t cap, uint8_t type, uint8_t flags, uint16_t seq,
                        const uint8_t *payload, size_t len, uint32_t key) {
    size_t total;
    uint32_t crc;
    if (out == NULL || len > ECF_MAX_TX_PAYLOAD || (len > 0 && payload == NULL)) return 0;
    total = ECF_HEADER + len + ECF_TRAILER;
    if (cap < total) return 0;
    out[ECF_AT_MAGIC] = (uint8_t)ECF_MAGIC0;
    out[ECF_AT_MAGIC + 1] = (uint8_t)ECF_MAGIC1;
    out[ECF_AT_TYPE] = type;
    out[ECF_AT_FLAGS] = flags;
    ecf_put_u16(out + ECF_AT_SEQ, seq);
    ecf_put_u16(out + ECF_AT_LEN, (uint16_t)len);
    ecf_put_u16(out + ECF_AT_LEN_CHECK, (uint16_t)(len ^ 0xFFFFu));
    if (len > 0) memmove(out + ECF_HEADER, payload, len);
    crc = ecf_crc32(ecf_keyed(type) ? key : 0u, out, ECF_HEADER + len);
    ecf_put_u32(out + ECF_HEADER + len, crc);
    return total;
}

size_t ecf_decoder_sizeof(void) { return sizeof(ecf_decoder_t); }

void ecf_decoder_set_key(ecf_decoder_t *d, uint32_t key) { d->key = key; }

void ecf_decoder_init(ecf_decoder_t *d, size_t max_payload) {
    memset(d, 0, sizeof(*d));
    d->max_payload = max_payload > ECF_MAX_PAYLOAD ? ECF_MAX_PAYLOAD : max_payload;
}

/* Drop buf[0] (a rejected candidate's magic byte) and keep only what may start a frame. */
static void resync(ecf_decoder_t *d) {
    size_t k = 1;
    d->skipped++;
    while (k < d->have && d->buf[k] != ECF_MAGIC0) {
        k++;
        d->skipped++;
    }
    memmove(d->buf, d->buf + k, d->have - k);
    d->have -= k;
}

/* Examine the candidate in buf; returns 1 when it should wait for more bytes. */
static int step(ecf_decoder_t *d, ecf_frame_cb cb, void *ctx) {
    uint16_t len;
    size_t total;
    ecf_frame_t f;
    if (d->buf[0] != ECF_MAGIC0) { /* what followed a delivered frame: skip to the next magic byte */
        size_t k = 0;
        while (k < d->have && d->buf[k] != ECF_MAGIC0) k++;
        d->skipped += (uint32_t)k;
        memmove(d->buf, d->buf + k, d->have - k);
        d->have -= k;
        return 0;
    }
    if (d->have < ECF_AT_MAGIC + 2) return 1;
    if (d->buf[ECF_AT_MAGIC + 1] != ECF_MAGIC1) {
        resync(d);
        return 0;
    }
    if (d->have < ECF_HEADER) return 1;
    len = ecf_get_u16(d->buf + ECF_AT_LEN);
    /* the check field holds len ^ 0xFFFF, i.e. the two fields add up to 0xFFFF */
    if ((uint32_t)len + (uint32_t)ecf_get_u16(d->buf + ECF_AT_LEN_CHECK) != 0xFFFFu || len > d->max_payload) {
        d->bad_headers++;
        resync(d);
        return 0;
    }
    total = ECF_HEADER + (size_t)len + ECF_TRAILER;
    if (d->have < total) return 1;
    if (ecf_crc32(ecf_keyed(d->buf[ECF_AT_TYPE]) ? d->key : 0u, d->buf, ECF_HEADER + len) !=
        ecf_get_u32(d->buf + ECF_HEADER + len)) {
        d->bad_crc++;
        resync(d);
        return 0;
    }
    f.type = d->buf[ECF_AT_TYPE];
    f.flags = d->buf[ECF_AT_FLAGS];
    f.seq = ecf_get_u16(d->buf + ECF_AT_SEQ);
    f.len = len;
    f.payload = d->buf + ECF_HEADER;
    d->frames++;
    if (cb != NULL) cb(ctx, &f);
    memmove(d->buf, d->buf + total, d->have - total);
    d->have -= total;
    return 0;
}

void ecf_decoder_feed(ecf_decoder_t *d, const uint8_t *data, size_t len, ecf_frame_cb cb, void *ctx) {
    size_t pos = 0;
    while (pos < len || d->have > 0) {
        if (d->have == 0) {
            /* hunting: skip to the next magic byte without copying */
            while (pos < len && data[pos] != ECF_MAGIC0) {
                pos++;
                d->skipped++;
            }
            if (pos >= len) return;
        }
        if (pos < len) {
            size_t room = sizeof(d->buf) - d->have;
            size_t n = len - pos < room ? len - pos : room;
            memcpy(d->buf + d->have, data + pos, n);
            d->have += n;
            pos += n;
        }
        while (d->have > 0) {
            if (step(d, cb, ctx)) break;
        }
        if (d->have > 0 && pos >= len) return; /* a partial frame waits for more bytes */
    }
}

/* SplitMix64 (Steele, Lea, Flood 2014): the generator docs/protocol.md specifies for random inputs. */
static uint64_t splitmix_next(uint64_t *state) {
    uint64_t z;
    *state += ECF_PRNG_GOLDEN;
    z = *state;
    z = (z ^ (z >> 30)) * ECF_PRNG_MIX1;
    z = (z ^ (z >> 27)) * ECF_PRNG_MIX2;
    return z ^ (z >> 31);
}

void ecf_prng_fill(uint64_t seed, uint32_t index, uint8_t dtype, uint8_t *out, size_t n) {
    uint64_t state = seed ^ ((uint64_t)index * ECF_PRNG_INDEX_MIX);
    size_t pos = 0;
    while (pos < n) {
        uint64_t z = splitmix_next(&state);
        uint8_t word[8];
        size_t k;
        ecf_put_u64(word, z);
        if (dtype == ECF_DT_FLOAT32) {
            /* two elements per draw: the high 24 bits of each 32-bit half, scaled to [0, 1) */
            for (k = 0; k < 2 && pos + 4 <= n; k++) {
                uint32_t w = ecf_get_u32(word + 4 * k);
                float v = (float)(w >> 8) * (1.0f / 16777216.0f);
                memcpy(out + pos, &v, 4);
                pos += 4;
            }
            if (pos + 4 > n && pos < n) { /* a float32 tensor's size is a multiple of 4; be safe anyway */
                memset(out + pos, 0, n - pos);
                pos = n;
            }
        } else {
            for (k = 0; k < 8 && pos < n; k++) out[pos++] = word[k];
        }
    }
}
