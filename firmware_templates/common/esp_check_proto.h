/*
 * esp-check output protocol emitter, version 1 (spec: docs/protocol.md).
 *
 * Portable C99: no TFLM, no ESP-IDF, no malloc. Every record is built in the fixed 240-byte line
 * buffer inside ecp_t and handed to the caller's write function in one call, so the same file runs
 * on the device (write = fwrite(stdout) + fflush) and on the host (the contract tests and the
 * simulated board load it through ctypes).
 *
 * Usage:
 *   ecp_t ecp;
 *   ecp_init(&ecp, my_write, NULL);
 *   ecp_begin(&ecp, "0.1.0", 0);
 *   ecp_record_start(&ecp, "INFO"); ecp_kv_str(&ecp, "nn", "optimized"); ...; ecp_record_end(&ecp);
 *   ecp_arena(&ecp, size, used, "internal");
 *   ecp_input(&ecp, 0, nbytes, sha256_hex); ... invoke ...; ecp_time(&ecp, 0, us);
 *   ecp_tensor(&ecp, 0, 0, "int8", dims, ndims, scale, zp, data, nbytes, name, 16);
 *   ecp_end(&ecp, 1);
 *
 * A record that does not fit is replaced by "ERROR stage=internal code=0 msg=record_overflow" (same
 * sequence number), so the host sees a firmware fault instead of a silently missing record.
 */
#ifndef ESP_CHECK_PROTO_H
#define ESP_CHECK_PROTO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ECP_PROTO_VERSION 1
#define ECP_LINE_MAX 240   /* bytes per record, including the trailing \r\n */
#define ECP_DATA_CHUNK 96  /* raw tensor bytes per DATA record (128 base64 characters) */
#define ECP_NAME_MAX 64    /* TENSOR name= is truncated to this many bytes */
#define ECP_MSG_MAX 120    /* ERROR msg= is truncated to this many bytes */
#define ECP_MAX_DIMS 8     /* more dimensions: record_overflow */
#define ECP_TAP_MAX_TENSORS 4 /* tensors per OP record side (in=/out=); the firmware taps at most this many */
#define ECP_OPNAME_MAX 32     /* OP op= is truncated to this many bytes */
#define ECP_PRINTABLE_MIN 0x21 /* a value's bytes: those outside MIN..MAX (and '*') become '_' */
#define ECP_PRINTABLE_MAX 0x7E

/* Returns the number of bytes written or a negative value on failure. */
typedef int (*ecp_write_fn)(void *ctx, const char *buf, size_t len);

typedef struct {
    ecp_write_fn write;
    void *ctx;
    uint32_t seq;          /* sequence number of the next record */
    size_t len;            /* bytes used in line[] by the record being built */
    int open;              /* a record is being built */
    int overflow;          /* the record being built does not fit (or had an invalid key) */
    unsigned write_errors; /* write callbacks that reported failure */
    char line[ECP_LINE_MAX + 1];
} ecp_t;

void ecp_init(ecp_t *e, ecp_write_fn write, void *ctx);
size_t ecp_sizeof(void); /* sizeof(ecp_t), for foreign-function callers */
uint32_t ecp_crc32(uint32_t crc, const uint8_t *data, size_t len); /* zlib.crc32 compatible */

/* Generic record building (INFO and any other type). Keys must match [a-z][a-z0-9_]*. String
 * values are sanitized byte by byte (anything outside 0x21..0x7E, and '*', becomes '_'); an empty
 * or NULL string is emitted as '-'. ecp_record_end returns 0, or -1 if the record was replaced by
 * an overflow ERROR record. */
void ecp_record_start(ecp_t *e, const char *type);
void ecp_kv_str(ecp_t *e, const char *key, const char *value);
void ecp_kv_int(ecp_t *e, const char *key, int64_t value);
void ecp_kv_uint(ecp_t *e, const char *key, uint64_t value);
int ecp_record_end(ecp_t *e);

/* One-field INFO records (convenience; prefer packing several keys into one record). */
int ecp_info_str(ecp_t *e, const char *key, const char *value);
int ecp_info_int(ecp_t *e, const char *key, int64_t value);

int ecp_begin(ecp_t *e, const char *fwver, int sim);
int ecp_arena(ecp_t *e, uint64_t size, uint64_t used, const char *mem);
int ecp_input(ecp_t *e, int i, uint64_t nbytes, const char *sha256_hex);
int ecp_time(ecp_t *e, int i, int64_t invoke_us);

/* TENSOR + DATA chunks + up to human_max "Output: %.6f" lines (dequantized: (q - zp) * scale when
 * scale != 0, else the raw value; float32 prints the value). dtype: int8 uint8 int16 int32 float32.
 * data is little-endian, row-major; nbytes must equal prod(dims) * itemsize. name may be NULL.
 * Returns 0, or -1 if an ERROR record was emitted instead. */
int ecp_tensor(ecp_t *e, int i, int o, const char *dtype, const int32_t *dims, int ndims, float scale,
               int32_t zp, const uint8_t *data, size_t nbytes, const char *name, int human_max);

/* ---- tap records (docs/protocol.md "Tap records"; only firmware built with --tap prints them) ---- */

/* One tensor an op read or wrote: model tensor index, shape and CRC-32 of its bytes at that moment. */
typedef struct {
    int32_t t;
    uint32_t crc;
    int32_t ndims;
    int32_t dims[ECP_MAX_DIMS];
} ecp_tap_tensor_t;

/* OP record: ins = CRCs taken just before the op's invoke, outs = just after. nin/nout at most
 * ECP_TAP_MAX_TENSORS (else the record is replaced by the overflow ERROR record). */
int ecp_op(ecp_t *e, int i, int sub, int idx, const char *opname, uint64_t cycles, const ecp_tap_tensor_t *ins,
           int nin, const ecp_tap_tensor_t *outs, int nout);
/* OPEND record after a run's OP records: how many were printed, dropped (buffer full), tap RAM bytes. */
int ecp_op_end(ecp_t *e, int i, uint64_t ops, uint64_t dropped, uint64_t ram_bytes);
/* OPDUMP + OPDATA chunks: a full copy of tensor t as op idx saw it (role "in", before its invoke) or
 * left it (role "out", after). Same validation as ecp_tensor; no human-readable lines. */
int ecp_op_dump(ecp_t *e, int i, int idx, int t, const char *role, const char *dtype, const int32_t *dims,
                int ndims, float scale, int32_t zp, const uint8_t *data, size_t nbytes);

/* ERROR record; i < 0 omits the i field; msg may be NULL. */
int ecp_error(ecp_t *e, const char *stage, int32_t code, int i, const char *msg);
int ecp_end(ecp_t *e, int ok);

#ifdef __cplusplus
}
#endif

#endif /* ESP_CHECK_PROTO_H */
