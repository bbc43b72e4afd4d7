/*
 * esp-check binary frames, version 1 (spec: docs/protocol.md "Binary frames").
 *
 * Portable C99, no allocation: the encoder writes into the caller's buffer, the streaming decoder keeps
 * one frame in a fixed buffer inside ecf_decoder_t. Input is hostile: every length is checked against
 * ECF_MAX_PAYLOAD before a byte is stored, a frame is delivered only after its CRC-32 passed, and a
 * failed candidate is dropped one byte at a time so the next real frame is found again.
 *
 * Frame layout (all little-endian):
 *   0  u8[2] magic EC F5
 *   2  u8    type
 *   3  u8    flags (0; receivers ignore it)
 *   4  u16   seq   (per direction, +1 per frame, wraps)
 *   6  u16   len   (payload bytes, <= ECF_MAX_PAYLOAD)
 *   8  u16   len ^ 0xFFFF
 *  10  len   payload
 *  10+len u32 CRC-32 (zlib polynomial) of bytes 0 .. 9+len
 *
 * Also here: the device-side input PRNG (SplitMix64, docs/protocol.md "Random inputs") and little-endian
 * field helpers shared by the command loop.
 */
#ifndef ESP_CHECK_FRAME_H
#define ESP_CHECK_FRAME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ECF_VERSION 1
#define ECF_MAGIC0 0xECu
#define ECF_MAGIC1 0xF5u
#define ECF_HEADER 10
#define ECF_TRAILER 4
#define ECF_MAX_PAYLOAD 4096
#define ECF_MAX_FRAME (ECF_HEADER + ECF_MAX_PAYLOAD + ECF_TRAILER)

/* dtype codes (HELLO input_dtype, random inputs) */
#define ECF_DT_UNKNOWN 0
#define ECF_DT_INT8 1
#define ECF_DT_UINT8 2
#define ECF_DT_INT16 3
#define ECF_DT_INT32 4
#define ECF_DT_FLOAT32 5

typedef struct {
    uint8_t type;
    uint8_t flags;
    uint16_t seq;
    uint16_t len;
    const uint8_t *payload; /* valid only during the callback */
} ecf_frame_t;

typedef void (*ecf_frame_cb)(void *ctx, const ecf_frame_t *frame);

typedef struct {
    uint8_t buf[ECF_MAX_FRAME];
    size_t have;          /* bytes of the current candidate frame in buf (buf[0] is the magic) */
    size_t max_payload;   /* frames announcing more are rejected at the header */
    uint32_t frames;      /* frames delivered */
    uint32_t bad_headers; /* magic matched, length field inconsistent or too large */
    uint32_t bad_crc;     /* complete candidate whose CRC-32 failed */
    uint32_t skipped;     /* bytes dropped outside frames (noise, text, rejected candidates' first bytes) */
} ecf_decoder_t;

uint32_t ecf_crc32(uint32_t crc, const uint8_t *data, size_t len); /* zlib.crc32 compatible */

/* Encode one frame into out (cap bytes). Returns the frame size, or 0 if len > ECF_MAX_PAYLOAD or the frame
 * does not fit in cap. payload may be NULL when len is 0. */
size_t ecf_encode(uint8_t *out, size_t cap, uint8_t type, uint8_t flags, uint16_t seq, const uint8_t *payload,
                  size_t len);

void ecf_decoder_init(ecf_decoder_t *d, size_t max_payload);
size_t ecf_decoder_sizeof(void); /* sizeof(ecf_decoder_t), for foreign-function callers */
/* Feed received bytes; cb is called once per valid frame, in order. Never reads or writes out of bounds,
 * whatever the bytes. */
void ecf_decoder_feed(ecf_decoder_t *d, const uint8_t *data, size_t len, ecf_frame_cb cb, void *ctx);

/* Random input bytes for input `index` of seed `seed` (docs/protocol.md "Random inputs"). dtype selects
 * the element mapping: raw stream bytes for integer dtypes, uniform [0, 1) for float32. n is the tensor's
 * byte count. */
void ecf_prng_fill(uint64_t seed, uint32_t index, uint8_t dtype, uint8_t *out, size_t n);

/* Little-endian field helpers (no alignment assumptions). */
void ecf_put_u16(uint8_t *p, uint16_t v);
void ecf_put_u32(uint8_t *p, uint32_t v);
void ecf_put_u64(uint8_t *p, uint64_t v);
uint16_t ecf_get_u16(const uint8_t *p);
uint32_t ecf_get_u32(const uint8_t *p);
uint64_t ecf_get_u64(const uint8_t *p);

#ifdef __cplusplus
}
#endif

#endif /* ESP_CHECK_FRAME_H */
