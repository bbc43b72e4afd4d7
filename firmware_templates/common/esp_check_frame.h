/*
 * esp-check binary frames, version 4 (spec: docs/protocol.md "Binary frames").
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
 *   6  u16   len   (payload bytes: <= ECF_MAX_PAYLOAD host to device, <= ECF_MAX_TX_PAYLOAD device to host)
 *   8  u16   len ^ 0xFFFF
 *  10  len   payload
 *  10+len u32 CRC-32 (zlib polynomial) of the boot key, then bytes 0 .. 9+len
 *
 * The boot key binds every frame but HELLO and HELLO? to one boot of one variant: the CRC-32 starts from
 * ecf_key_crc(session, nn) (the session id the device drew at boot and announced in its HELLO, and its
 * compiled-in ESP-NN mode) instead of 0, so a frame of another boot, or of the other variant, fails its
 * CRC and is dropped like a damaged one. HELLO is sent as one text line, "@ECH HELLO <base64 frame>".
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

#define ECF_VERSION 4
#define ECF_MAGIC0 0xECu
#define ECF_MAGIC1 0xF5u
#define ECF_HEADER 10
#define ECF_AT_MAGIC 0 /* where each header field starts (the layout above) */
#define ECF_AT_TYPE 2
#define ECF_AT_FLAGS 3
#define ECF_AT_SEQ 4
#define ECF_AT_LEN 6
#define ECF_AT_LEN_CHECK 8 /* len ^ 0xFFFF */
#define ECF_TRAILER 4
#define ECF_MAX_PAYLOAD 4096
#define ECF_MAX_FRAME (ECF_HEADER + ECF_MAX_PAYLOAD + ECF_TRAILER)
/* The device's RESULT and DATA frames may be larger (HELLO announces it): a frame of records costs its
 * 14 bytes once for all the records in it (docs/protocol.md "Result record", the byte budget). */
#define ECF_MAX_TX_PAYLOAD 16384
#define ECF_TYPE_HELLO_Q 0x01u /* the two frame types whose CRC is not keyed (they set up the session) */
#define ECF_TYPE_HELLO 0x80u
#define ECF_HELLO_LINE_PREFIX "\r\n@ECH HELLO "

/* the input PRNG (SplitMix64, docs/protocol.md "Random inputs"): its increment and two multipliers, and the
 * multiplier that spreads the input index over the seed */
#define ECF_PRNG_GOLDEN 0x9E3779B97F4A7C15ull
#define ECF_PRNG_MIX1 0xBF58476D1CE4E5B9ull
#define ECF_PRNG_MIX2 0x94D049BB133111EBull
#define ECF_PRNG_INDEX_MIX 0xD1B54A32D192ED03ull

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
    uint32_t key;         /* the boot key's CRC (ecf_key_crc): where a keyed frame's CRC starts; 0 none */
} ecf_decoder_t;

uint32_t ecf_crc32(uint32_t crc, const uint8_t *data, size_t len); /* zlib.crc32 compatible */

/* The boot key: CRC-32 of the 5 bytes session (u32 little-endian) and nn. */
uint32_t ecf_key_crc(uint32_t session, uint8_t nn);
/* 1 when a frame of this type carries the boot key in its CRC (every type but HELLO? and HELLO). */
int ecf_keyed(uint8_t type);

/* Encode one frame into out (cap bytes). Returns the frame size, or 0 if len > ECF_MAX_TX_PAYLOAD or the
 * frame does not fit in cap. payload may be NULL when len is 0, and may be out + ECF_HEADER (in place). */
size_t ecf_encode(uint8_t *out, size_t cap, uint8_t type, uint8_t flags, uint16_t seq, const uint8_t *payload,
                  size_t len);
/* The same with the boot key's CRC (ecf_key_crc) as the CRC's start for keyed types. */
size_t ecf_encode_keyed(uint8_t *out, size_t cap, uint8_t type, uint8_t flags, uint16_t seq,
                        const uint8_t *payload, size_t len, uint32_t key);
/* Standard base64 (RFC 4648, padded) of in[0..n) into out; returns the characters written, or 0 when
 * they would not fit in cap (no NUL is written). */
size_t ecf_b64(char *out, size_t cap, const uint8_t *in, size_t n);

void ecf_decoder_init(ecf_decoder_t *d, size_t max_payload);
size_t ecf_decoder_sizeof(void); /* sizeof(ecf_decoder_t), for foreign-function callers */
void ecf_decoder_set_key(ecf_decoder_t *d, uint32_t key); /* keyed frames must then carry this key */
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
