/*
 * esp-check resident command loop, version 2 (spec: docs/protocol.md "Resident loop").
 *
 * Portable C99 state machine, no allocation, no ESP-IDF: the firmware feeds it the bytes its UART /
 * USB-Serial-JTAG driver received (ecl_rx) and tells it when the receive buffer ran empty (ecl_idle);
 * the loop decodes binary frames, enforces sequence numbers, acknowledges what it consumed (windowed flow
 * control), and runs the commands through the callbacks in ecl_config_t: load input bytes, invoke the
 * model R times, send CRC-32s or full outputs in batched RESULT frames, print text records for a text
 * session, switch the app slot. The simulated board runs this same file through ctypes.
 */
#ifndef ESP_CHECK_LOOP_H
#define ESP_CHECK_LOOP_H

#include <stddef.h>
#include <stdint.h>

#include "esp_check_frame.h"
#include "esp_check_proto.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ECL_MAX_OUTPUTS 16
#define ECL_HELLO_FIXED 128 /* HELLO's payload before the output sizes */
#define ECL_FWVER_MAX 32     /* HELLO's firmware version is cut to this many bytes */
#define ECL_ERROR_MSG_MAX 120 /* an ERROR frame's message is cut to this many bytes */
#define ECL_ERROR_FIXED 9 /* ERROR payload before the message: u32 id, i32 code, u8 stage */
#define ECL_ERROR_AT_ID 0
#define ECL_ERROR_AT_CODE 4
#define ECL_ERROR_AT_STAGE 8

/* the other small payloads (docs/protocol.md "Device to host"): their bytes, where each field starts */
#define ECL_ACK_BYTES 4 /* u16 next_seq, u16 0 */
#define ECL_ACK_AT_NEXT_SEQ 0
#define ECL_ACK_AT_ZERO 2
#define ECL_NAK_BYTES 4 /* u16 next_seq, u8 reason, u8 0 */
#define ECL_NAK_AT_NEXT_SEQ 0
#define ECL_NAK_AT_REASON 2
#define ECL_NAK_AT_ZERO 3
#define ECL_SYNC_BYTES 4 /* SYNC and SYNC_ACK: the host's u32 token */
#define ECL_SYNC_AT_TOKEN 0
#define ECL_BOOT_BYTES 8 /* BOOTING: u8 slot, 3 bytes 0, i32 status */
#define ECL_BOOT_AT_SLOT 0
#define ECL_BOOT_AT_ZERO 1
#define ECL_BOOT_AT_STATUS 4
#define ECL_BAUD_BYTES 8 /* BAUD_OK: u32 baud, i32 status */
#define ECL_BAUD_AT_BAUD 0
#define ECL_BAUD_AT_STATUS 4
#define ECL_ACK_PER_WINDOW 2 /* an ACK once window / this many bytes were taken in since the last one */

/* HELLO payload: where each field of its fixed part starts (docs/protocol.md "HELLO") */
#define ECL_HELLO_AT_PROTO 0
#define ECL_HELLO_AT_FLAGS 1 /* ECL_HELLO_SIM | ECL_HELLO_TAP */
#define ECL_HELLO_AT_NN 2
#define ECL_HELLO_AT_SLOT 3
#define ECL_HELLO_AT_INIT 4
#define ECL_HELLO_AT_DTYPE 5
#define ECL_HELLO_AT_MAX_PAYLOAD 6
#define ECL_HELLO_AT_WINDOW 8
#define ECL_HELLO_AT_INPUT_BYTES 12
#define ECL_HELLO_AT_OUTPUTS 16
#define ECL_HELLO_AT_SESSION 20
#define ECL_HELLO_AT_MODEL_SHA256 24
#define ECL_HELLO_AT_APP_SHA256 56
#define ECL_HELLO_AT_OTHER_SHA256 88
#define ECL_HELLO_AT_KEEP_CAPACITY 120
#define ECL_HELLO_AT_KEPT 124
#define ECL_HELLO_SHA256 32 /* bytes of each SHA-256 field */
#define ECL_HELLO_SIM 0x01u
#define ECL_HELLO_TAP 0x02u
#define ECL_SLOT_UNKNOWN 0xFFu /* HELLO slot: the running app slot is not known */

/* host -> device */
#define ECL_CMD_HELLO 0x01
#define ECL_CMD_LOAD 0x02
#define ECL_CMD_RUN 0x03
#define ECL_CMD_SESSION 0x04
#define ECL_CMD_END 0x05
#define ECL_CMD_SYNC 0x06
#define ECL_CMD_BOOT 0x07
#define ECL_CMD_BAUD 0x08
/* device -> host */
#define ECL_RSP_HELLO 0x80
#define ECL_RSP_ACK 0x81
#define ECL_RSP_NAK 0x82
#define ECL_RSP_RESULT 0x83
#define ECL_RSP_DATA 0x84
#define ECL_RSP_ERROR 0x85
#define ECL_RSP_SYNC 0x86
#define ECL_RSP_BOOT 0x87
#define ECL_RSP_BAUD 0x88
#define ECL_BAUD_MIN 9600u
#define ECL_BAUD_MAX 5000000u
#define ECL_BAUD_CONFIRM_US 1000000u /* no command frame at the new baud within this: back to the console's */

/* RUN fields */
#define ECL_SRC_LOADED 0
#define ECL_SRC_PRNG 1
#define ECL_SRC_KEPT 2 /* the input kept at index `id` across the slot switch; the RUN's seed holds its CRC-32 */
#define ECL_RES_CRC 0
#define ECL_RES_FULL 1
#define ECL_RES_FULL_IF_DIFFERENT 2
#define ECL_RUN_FIXED 20 /* bytes before the expected CRCs */
#define ECL_RUN_AT_ID 0
#define ECL_RUN_AT_SOURCE 4
#define ECL_RUN_AT_RESULTS 5
#define ECL_RUN_AT_FLAGS 6
#define ECL_RUN_AT_KEEP 7
#define ECL_RUN_AT_REPEAT 8
#define ECL_RUN_AT_EXPECTED 10 /* how many expected CRCs follow */
#define ECL_RUN_AT_SEED 12
#define ECL_RUN_TEXT 0x01u /* RUN flags: print text records */
#define ECL_RUN_NOW 0x02u  /* send this result at once, not batched */

/* RESULT record: u8 head (flags, status << 4, ECL_HEAD_NEXT_ID), u32 id unless ECL_HEAD_NEXT_ID, u32
 * invoke_us, u32 input_crc */
#define ECL_REC_FIXED 13
#define ECL_REC_AT_HEAD 0
#define ECL_REC_AT_ID 1
#define ECL_REC_AT_INVOKE_US 5
#define ECL_REC_AT_INPUT_CRC 9
#define ECL_HEAD_STATUS_SHIFT 4 /* the head: flags in bits 0..3, status in bits 4..5 */
#define ECL_HEAD_NEXT_ID 0x40 /* the id is the previous record's (in this RESULT payload) + 1: not sent */
#define ECL_CTRL_MAX 256      /* payload of the frames other than RESULT and DATA (HELLO is the largest) */
#define ECL_ST_OK 0
#define ECL_ST_INVOKE_FAILED 1
#define ECL_ST_INPUT_INCOMPLETE 2
#define ECL_ST_NOT_KEPT 3 /* source kept: the device holds no valid copy with that CRC-32 (not run) */
#define ECL_FL_NONDETERMINISTIC 0x01
#define ECL_FL_INLINE 0x02
#define ECL_FL_DATA_FRAMES 0x04
#define ECL_FL_REPEATS 0x08 /* u16 invokes done + u16 first differing repeat follow (RUN repeat > 1) */
#define ECL_DATA_FIXED 10 /* DATA payload: u32 id, u16 o, u32 offset */
#define ECL_DATA_AT_ID 0
#define ECL_DATA_AT_OUTPUT 4
#define ECL_DATA_AT_OFFSET 6
/* A batch whose oldest result waited this much invoke time (the RUNs after it) is sent at once, with the
 * ACK folded in: a slow model's results share frames, and no result waits longer than this plus one RUN. */
#define ECL_BATCH_WAIT_US 2500000u
/* The boot's first RUN that took this long sends its result at once: the host learns the invoke time,
 * and waits out the batches before it probes. */
#define ECL_SLOW_RUN_US 100000u
#define ECL_FRAME_ACK 0x01u /* RESULT frame flag: the payload ends with an ACK's u16 next_seq */

/* The kept-input store (docs/protocol.md "Kept inputs"): a RAM region that survives a software restart */
#define ECL_KEEP_HEADER 64
#define ECL_KEEP_ENTRY 8
#define ECL_KEEP_MAX 0xFFFFu /* at most this many inputs */
#define ECL_KEEP_MAGIC "ECKEEP\0\3" /* the header's first 8 bytes: the store's layout, version 3 */
#define ECL_KEEP_ALIGN 16 /* the inputs start on a boundary of this many bytes from the region's start */
/* where each header field starts: the magic, input bytes, capacity, nonce, region bytes, the model's
 * SHA-256, the region's own address, then the CRC-32 of the bytes before it */
#define ECL_KEEP_AT_MAGIC 0
#define ECL_KEEP_AT_INPUT_BYTES 8
#define ECL_KEEP_AT_CAPACITY 12
#define ECL_KEEP_AT_NONCE 16
#define ECL_KEEP_AT_BYTES 20
#define ECL_KEEP_AT_MODEL_SHA256 24
#define ECL_KEEP_AT_PLACE 56
#define ECL_KEEP_AT_CRC 60

/* NAK reasons */
#define ECL_NAK_BAD_FRAME 1
#define ECL_NAK_GAP 2

/* ERROR stages (text ERROR record stage names in docs/protocol.md) */
#define ECL_STAGE_SCHEMA 1
#define ECL_STAGE_RESOLVER 2
#define ECL_STAGE_ALLOC 3
#define ECL_STAGE_INPUT 4
#define ECL_STAGE_INVOKE 5
#define ECL_STAGE_OUTPUT 6
#define ECL_STAGE_INTERNAL 7
#define ECL_STAGE_MODEL 8
#define ECL_STAGE_PROTOCOL 9
#define ECL_NO_ID 0xFFFFFFFFu

/* HELLO nn: the ESP-NN mode the firmware was built with */
#define ECL_NN_UNKNOWN 0
#define ECL_NN_OPTIMIZED 1
#define ECL_NN_ANSI_C 2

/* ecl_rx / ecl_idle results */
#define ECL_OK 0
#define ECL_HALTED 1 /* invoke reported that the device stopped (crash, hang): nothing more is processed */
#define ECL_REBOOT 2 /* BOOT succeeded and its reply was sent: the app should restart now */

typedef struct {
    const uint8_t *data; /* the output tensor's bytes (stable after AllocateTensors) */
    size_t bytes;
    const char *dtype; /* "int8", "uint8", "int16", "int32", "float32" */
    int32_t dims[ECP_MAX_DIMS];
    int32_t ndims;
    float scale;
    int32_t zp;
    const char *name;
} ecl_output_t;

typedef struct {
    int (*write)(void *ctx, const uint8_t *buf, size_t len);
    /* Run the model once on `input` (n bytes): 0 ok, > 0 a TFLM error status, < 0 the device stops. */
    int (*invoke)(void *ctx, const uint8_t *input, size_t n, uint32_t *invoke_us);
    /* Text session: print BEGIN + INFO (inputs = K) + ARENA through e (its seq was reset to 0). */
    void (*session_begin)(void *ctx, ecp_t *e, uint32_t inputs);
    void (*text_extra)(void *ctx, ecp_t *e, int i); /* after a text run's outputs (tap records); may be NULL */
    void (*sha256_hex)(void *ctx, const uint8_t *data, size_t n, char *out65);
    int (*boot_slot)(void *ctx, uint8_t slot); /* 0: the next boot runs `slot`; else an error code */
    void *ctx;
    ecp_t *ecp;
    uint8_t *staging; /* input_bytes: LOAD writes here, RUN copies it into the input tensor per invoke */
    size_t input_bytes;
    uint8_t input_dtype; /* ECF_DT_* */
    const ecl_output_t *outputs;
    size_t n_outputs; /* at most ECL_MAX_OUTPUTS */
    uint32_t window;  /* receive buffer bytes the host may have in flight */
    int32_t human_max;
    uint8_t sim, tap, nn, slot, init_status; /* HELLO: nn 1 optimized, 2 ansi_c; slot 0xFF unknown */
    const uint8_t *model_sha256;             /* 32 bytes (NULL: zeros) */
    const char *fwver;
    uint32_t session;            /* this boot's session id (drawn at boot, never 0): keys every frame's CRC */
    const uint8_t *app_sha256;   /* 32 bytes: the running app image's SHA-256 (NULL: zeros, unknown) */
    const uint8_t *other_sha256; /* 32 bytes: the other app slot's image SHA-256 (NULL: zeros, unknown) */
    /* Called right after the BAUD reply was queued: wait until it left, then switch the console UART to
     * `baud` (and back to the console baud by itself when no frame arrives at the new one in time). NULL:
     * the link cannot switch (USB-Serial-JTAG), BAUD is refused. */
    void (*set_baud)(void *ctx, uint32_t baud);
    /* The kept-input store: a region both app slots place at the same address, left alone by a software
     * restart (PSRAM EXT_RAM_NOINIT_ATTR on the firmware). NULL / 0: inputs are not kept. A store whose
     * header records another size or placement (the other app linked it elsewhere) is not used. */
    uint8_t *keep;
    size_t keep_bytes;
    uint32_t keep_place; /* where the app placed it (its address on a chip): the header records it */
} ecl_config_t;

typedef struct {
    ecl_config_t cfg;
    ecf_decoder_t dec;
    uint16_t rx_expected;
    uint16_t tx_seq;
    int nak_pending;
    uint32_t bad_seen; /* decoder bad_headers + bad_crc already answered */
    uint32_t consumed_since_ack;
    size_t loaded; /* staging bytes written since the last RUN */
    int session_open;
    int session_error;
    int status; /* ECL_OK, ECL_HALTED or ECL_REBOOT */
    size_t batch_len;     /* RESULT records waiting in txb + ECF_HEADER (the frame is encoded in place) */
    uint32_t batch_last;  /* the id of the last record in the batch */
    uint32_t batch_wait_us; /* invoke time of the RUNs after the batch's first record: how long it waited */
    uint32_t run_busy_us;   /* invoke time of the RUN whose record is being added */
    int slow_shown;         /* a RUN of ECL_SLOW_RUN_US or more had its result sent at once (this boot) */
    uint32_t crc_first[ECL_MAX_OUTPUTS];
    uint32_t crc_diff[ECL_MAX_OUTPUTS];
    uint8_t txb[ECF_HEADER + ECF_MAX_TX_PAYLOAD + ECF_TRAILER]; /* RESULT and DATA frames */
    uint8_t tx[ECF_HEADER + ECL_CTRL_MAX + ECF_TRAILER];        /* every other frame */
    uint32_t stats_runs, stats_naks, stats_dups;
    uint32_t key; /* ecf_key_crc(session, nn): the CRC start of every keyed frame, both directions */
    uint32_t keep_cap;  /* inputs the store holds for this model (0: no store) */
    uint32_t kept;      /* valid entries found at boot */
    uint32_t keep_nonce; /* the store's nonce: every entry's check includes it */
} ecl_t;

size_t ecl_sizeof(void);
/* 0, or -1 for a configuration the loop cannot serve (too many outputs, no staging buffer ...) */
int ecl_init(ecl_t *l, const ecl_config_t *cfg);
/* Open the kept-input store (ecl_init calls it): keep a valid one, else write an empty one. Returns kept. */
uint32_t ecl_keep_open(ecl_t *l);
void ecl_hello(ecl_t *l);
int ecl_rx(ecl_t *l, const uint8_t *data, size_t len);
int ecl_idle(ecl_t *l);
/* An ERROR frame outside any command (e.g. the model partition is missing at boot). */
void ecl_error(ecl_t *l, uint32_t id, uint8_t stage, int32_t code, const char *msg);

#ifdef __cplusplus
}
#endif

#endif /* ESP_CHECK_LOOP_H */
