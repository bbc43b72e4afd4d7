/*
 * esp-check output protocol emitter, version 1. Spec: docs/protocol.md. See esp_check_proto.h.
 *
 * Portable C99 with no TFLM/IDF dependency and no dynamic memory: the contract tests compile this
 * exact file with the host C compiler and check that harness/protocol/capture.py reads back what it printed.
 */
#include "esp_check_proto.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define ECP_TAIL 11 /* "*XXXXXXXX\r\n" after the body (the body ends with the space before '*') */
#define ECP_BODY_MAX (ECP_LINE_MAX - ECP_TAIL)
#define ECP_STR_(x) #x
#define ECP_STR(x) ECP_STR_(x)
/* every record line's marker, "@EC1 ": the protocol version, then a space (docs/protocol.md) */
#define ECP_MARKER "@EC" ECP_STR(ECP_PROTO_VERSION) " "

static const char HEX_UP[] = "0123456789ABCDEF";
static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* CRC-32 (IEEE 802.3, reflected, poly 0xEDB88320) with a 16-entry nibble table: small and fast enough. */
static const uint32_t CRC_NIBBLE[16] = {
    0x00000000u, 0x1DB71064u, 0x3B6E20C8u, 0x26D930ACu, 0x76DC4190u, 0x6B6B51F4u, 0x4DB26158u, 0x5005713Cu,
    0xEDB88320u, 0xF00F9344u, 0xD6D6A3E8u, 0xCB61B38Cu, 0x9B64C2B0u, 0x86D3D2D4u, 0xA00AE278u, 0xBDBDF21Cu,
};

uint32_t ecp_crc32(uint32_t crc, const uint8_t *data, size_t len) {
    size_t k;
    crc = ~crc;
    for (k = 0; k < len; k++) {
        crc ^= data[k];
        crc = (crc >> 4) ^ CRC_NIBBLE[crc & 0x0Fu];
        crc = (crc >> 4) ^ CRC_NIBBLE[crc & 0x0Fu];
    }
    return ~crc;
}

size_t ecp_sizeof(void) { return sizeof(ecp_t); }

void ecp_init(ecp_t *e, ecp_write_fn write, void *ctx) {
    memset(e, 0, sizeof(*e));
    e->write = write;
    e->ctx = ctx;
}

/* ---- bounded appends into the line buffer -------------------------------------------------- */

static void put(ecp_t *e, const char *s, size_t n) {
    if (e->overflow) {
        return;
    }
    if (n > ECP_BODY_MAX - e->len) {
        e->overflow = 1;
        return;
    }
    memcpy(e->line + e->len, s, n);
    e->len += n;
}

static void put_cstr(ecp_t *e, const char *s) { put(e, s, strlen(s)); }

static size_t fmt_u64(char *out, uint64_t v) { /* out: at least 21 bytes */
    char tmp[24];
    size_t n = 0, k;
    do {
        tmp[n++] = (char)('0' + (int)(v % 10u));
        v /= 10u;
    } while (v != 0u);
    for (k = 0; k < n; k++) {
        out[k] = tmp[n - 1 - k];
    }
    out[n] = '\0';
    return n;
}

static size_t fmt_i64(char *out, int64_t v) { /* out: at least 22 bytes */
    if (v < 0) {
        out[0] = '-';
        /* -(v + 1) + 1 avoids overflow on INT64_MIN */
        return 1 + fmt_u64(out + 1, (uint64_t)(-(v + 1)) + 1u);
    }
    return fmt_u64(out, (uint64_t)v);
}

static void put_u64(ecp_t *e, uint64_t v) {
    char buf[24];
    put(e, buf, fmt_u64(buf, v));
}

static void put_i64(ecp_t *e, int64_t v) {
    char buf[24];
    put(e, buf, fmt_i64(buf, v));
}

static void put_hex32(ecp_t *e, uint32_t v) {
    char buf[8];
    int k;
    for (k = 0; k < 8; k++) {
        buf[k] = HEX_UP[(v >> (28 - 4 * k)) & 0x0Fu];
    }
    put(e, buf, 8);
}

static int key_ok(const char *key) {
    const char *p;
    if (key == NULL || !(key[0] >= 'a' && key[0] <= 'z')) {
        return 0;
    }
    for (p = key + 1; *p != '\0'; p++) {
        char c = *p;
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) {
            return 0;
        }
    }
    return 1;
}

/* Sanitized string value: bytes outside ECP_PRINTABLE_MIN..MAX and '*' become '_'; empty/NULL is '-'. */
static void put_value(ecp_t *e, const char *s, size_t max_len) {
    size_t k;
    if (s == NULL || s[0] == '\0') {
        put(e, "-", 1);
        return;
    }
    for (k = 0; s[k] != '\0' && k < max_len; k++) {
        unsigned char c = (unsigned char)s[k];
        char out = (c < ECP_PRINTABLE_MIN || c > ECP_PRINTABLE_MAX || c == '*') ? '_' : (char)c;
        put(e, &out, 1);
    }
}

static void put_key(ecp_t *e, const char *key) {
    if (!key_ok(key)) {
        e->overflow = 1; /* an invalid key makes the record unusable: same handling as overflow */
        return;
    }
    put(e, " ", 1);
    put_cstr(e, key);
    put(e, "=", 1);
}

static void put_b64(ecp_t *e, const uint8_t *d, size_t n) {
    size_t k;
    char q[4];
    for (k = 0; k + 3 <= n; k += 3) {
        uint32_t v = ((uint32_t)d[k] << 16) | ((uint32_t)d[k + 1] << 8) | (uint32_t)d[k + 2];
        q[0] = B64[(v >> 18) & 63u];
        q[1] = B64[(v >> 12) & 63u];
        q[2] = B64[(v >> 6) & 63u];
        q[3] = B64[v & 63u];
        put(e, q, 4);
    }
    if (n - k == 1) {
        uint32_t v = (uint32_t)d[k] << 16;
        q[0] = B64[(v >> 18) & 63u];
        q[1] = B64[(v >> 12) & 63u];
        q[2] = '=';
        q[3] = '=';
        put(e, q, 4);
    } else if (n - k == 2) {
        uint32_t v = ((uint32_t)d[k] << 16) | ((uint32_t)d[k + 1] << 8);
        q[0] = B64[(v >> 18) & 63u];
        q[1] = B64[(v >> 12) & 63u];
        q[2] = B64[(v >> 6) & 63u];
        q[3] = '=';
        put(e, q, 4);
    }
}

static void emit(ecp_t *e, const char *buf, size_t len) {
    if (e->write == NULL || e->write(e->ctx, buf, len) < 0) {
        e->write_errors++;
    }
}

/* ---- records ---------------------------------------------------------------------------------- */

void ecp_record_start(ecp_t *e, const char *type) {
    e->len = 0;
    e->overflow = 0;
    e->open = 1;
    put(e, ECP_MARKER, sizeof ECP_MARKER - 1);
    put_u64(e, e->seq);
    put(e, " ", 1);
    put_cstr(e, type);
}

void ecp_kv_str(ecp_t *e, const char *key, const char *value) {
    put_key(e, key);
    put_value(e, value, ECP_LINE_MAX);
}

void ecp_kv_int(ecp_t *e, const char *key, int64_t value) {
    put_key(e, key);
    put_i64(e, value);
}

void ecp_kv_uint(ecp_t *e, const char *key, uint64_t value) {
    put_key(e, key);
    put_u64(e, value);
}

static void finish_and_write(ecp_t *e) {
    uint32_t crc = ecp_crc32(0u, (const uint8_t *)e->line, e->len);
    size_t k;
    /* the tail always fits: put() keeps the body within ECP_BODY_MAX */
    e->line[e->len++] = '*';
    for (k = 0; k < 8; k++) {
        e->line[e->len++] = HEX_UP[(crc >> (28 - 4 * k)) & 0x0Fu];
    }
    e->line[e->len++] = '\r';
    e->line[e->len++] = '\n';
    e->line[e->len] = '\0';
    emit(e, e->line, e->len);
    e->seq++;
    e->open = 0;
    e->len = 0;
}

int ecp_record_end(ecp_t *e) {
    put(e, " ", 1);
    if (!e->open || e->overflow) {
        /* Replace the unusable record by an ERROR record with the same sequence number. */
        e->len = 0;
        e->overflow = 0;
        put(e, ECP_MARKER, sizeof ECP_MARKER - 1);
        put_u64(e, e->seq);
        put_cstr(e, " ERROR stage=internal code=0 msg=record_overflow ");
        finish_and_write(e);
        return -1;
    }
    finish_and_write(e);
    return 0;
}

int ecp_info_str(ecp_t *e, const char *key, const char *value) {
    ecp_record_start(e, "INFO");
    ecp_kv_str(e, key, value);
    return ecp_record_end(e);
}

int ecp_info_int(ecp_t *e, const char *key, int64_t value) {
    ecp_record_start(e, "INFO");
    ecp_kv_int(e, key, value);
    return ecp_record_end(e);
}

int ecp_begin(ecp_t *e, const char *fwver, int sim) {
    e->seq = 0;
    ecp_record_start(e, "BEGIN");
    ecp_kv_int(e, "proto", ECP_PROTO_VERSION);
    ecp_kv_str(e, "fw", "esp-check");
    ecp_kv_str(e, "fwver", fwver);
    ecp_kv_int(e, "sim", sim ? 1 : 0);
    return ecp_record_end(e);
}

int ecp_arena(ecp_t *e, uint64_t size, uint64_t used, const char *mem) {
    ecp_record_start(e, "ARENA");
    ecp_kv_uint(e, "size", size);
    ecp_kv_uint(e, "used", used);
    ecp_kv_str(e, "mem", mem);
    return ecp_record_end(e);
}

int ecp_input(ecp_t *e, int i, uint64_t nbytes, const char *sha256_hex) {
    ecp_record_start(e, "INPUT");
    ecp_kv_int(e, "i", i);
    ecp_kv_uint(e, "bytes", nbytes);
    ecp_kv_str(e, "sha256", sha256_hex);
    return ecp_record_end(e);
}

int ecp_time(ecp_t *e, int i, int64_t invoke_us) {
    ecp_record_start(e, "TIME");
    ecp_kv_int(e, "i", i);
    ecp_kv_int(e, "invoke_us", invoke_us);
    return ecp_record_end(e);
}

int ecp_error(ecp_t *e, const char *stage, int32_t code, int i, const char *msg) {
    ecp_record_start(e, "ERROR");
    ecp_kv_str(e, "stage", stage);
    ecp_kv_int(e, "code", code);
    if (i >= 0) {
        ecp_kv_int(e, "i", i);
    }
    if (msg != NULL) {
        put_key(e, "msg");
        put_value(e, msg, ECP_MSG_MAX);
    }
    return ecp_record_end(e);
}

int ecp_end(ecp_t *e, int ok) {
    ecp_record_start(e, "END");
    ecp_kv_str(e, "status", ok ? "ok" : "error");
    ecp_kv_uint(e, "records", e->seq);
    return ecp_record_end(e);
}

/* ---- tensors ---------------------------------------------------------------------------------- */

static size_t dtype_size(const char *dtype) {
    if (dtype == NULL) {
        return 0;
    }
    if (strcmp(dtype, "int8") == 0 || strcmp(dtype, "uint8") == 0) {
        return 1;
    }
    if (strcmp(dtype, "int16") == 0) {
        return 2;
    }
    if (strcmp(dtype, "int32") == 0 || strcmp(dtype, "float32") == 0) {
        return 4;
    }
    return 0;
}

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static double element_value(const char *dtype, const uint8_t *p, float scale, int32_t zp) {
    int64_t q;
    if (dtype[0] == 'f') {
        uint32_t bits = le32(p);
        float f;
        memcpy(&f, &bits, sizeof f);
        return (double)f;
    }
    if (strcmp(dtype, "int8") == 0) {
        q = (int64_t)(int8_t)p[0];
    } else if (strcmp(dtype, "uint8") == 0) {
        q = (int64_t)p[0];
    } else if (strcmp(dtype, "int16") == 0) {
        q = (int64_t)(int16_t)(uint16_t)((unsigned)p[0] | ((unsigned)p[1] << 8));
    } else {
        q = (int64_t)(int32_t)le32(p);
    }
    if (scale == 0.0f) {
        return (double)q;
    }
    return (double)(q - (int64_t)zp) * (double)scale;
}

static void emit_human(ecp_t *e, double v) {
    int n;
    if (isnan(v)) {
        n = snprintf(e->line, sizeof e->line, "Output: nan\r\n");
    } else if (isinf(v)) {
        n = snprintf(e->line, sizeof e->line, "Output: %sinf\r\n", v < 0 ? "-" : "");
    } else {
        n = snprintf(e->line, sizeof e->line, "Output: %.6f\r\n", v);
    }
    if (n > 0 && (size_t)n < sizeof e->line) {
        emit(e, e->line, (size_t)n);
    }
}

/* Why a tensor cannot be emitted (NULL if it can); sets *item and *count. */
static const char *tensor_problem(const char *dtype, const int32_t *dims, int ndims, const uint8_t *data,
                                  size_t nbytes, size_t *item, uint64_t *count) {
    int k;
    *item = dtype_size(dtype);
    *count = 1;
    if (*item == 0) {
        return "bad_dtype";
    }
    if (ndims < 0 || ndims > ECP_MAX_DIMS || (ndims > 0 && dims == NULL)) {
        return "bad_shape";
    }
    for (k = 0; k < ndims; k++) {
        if (dims[k] < 0 || (dims[k] > 0 && *count > UINT64_MAX / 16u / (uint64_t)dims[k])) {
            return "bad_shape";
        }
        *count *= (uint64_t)dims[k];
    }
    if (*count * *item != (uint64_t)nbytes || (nbytes > 0 && data == NULL)) {
        return "tensor_size";
    }
    return NULL;
}

static void put_shape(ecp_t *e, const int32_t *dims, int ndims) {
    int k;
    if (ndims == 0) {
        put(e, "-", 1);
    }
    for (k = 0; k < ndims; k++) {
        if (k > 0) {
            put(e, "x", 1);
        }
        put_i64(e, dims[k]);
    }
}

/* What TENSOR and OPDUMP both say about a tensor: dtype, shape, scale bits, zp, size, CRC32. */
static void put_tensor_desc(ecp_t *e, const char *dtype, const int32_t *dims, int ndims, float scale,
                            int32_t zp, const uint8_t *data, size_t nbytes) {
    uint32_t bits;
    ecp_kv_str(e, "dtype", dtype);
    put_key(e, "shape");
    put_shape(e, dims, ndims);
    memcpy(&bits, &scale, sizeof bits);
    put_key(e, "scale");
    put(e, "0x", 2);
    put_hex32(e, bits);
    ecp_kv_int(e, "zp", zp);
    ecp_kv_uint(e, "bytes", (uint64_t)nbytes);
    put_key(e, "crc");
    put_hex32(e, ecp_crc32(0u, data, nbytes));
}

int ecp_tensor(ecp_t *e, int i, int o, const char *dtype, const int32_t *dims, int ndims, float scale,
               int32_t zp, const uint8_t *data, size_t nbytes, const char *name, int human_max) {
    size_t item;
    uint64_t count;
    size_t off;
    const char *bad = tensor_problem(dtype, dims, ndims, data, nbytes, &item, &count);

    if (bad != NULL) {
        ecp_error(e, "internal", 0, i, bad);
        return -1;
    }

    ecp_record_start(e, "TENSOR");
    ecp_kv_int(e, "i", i);
    ecp_kv_int(e, "o", o);
    put_tensor_desc(e, dtype, dims, ndims, scale, zp, data, nbytes);
    if (name != NULL && name[0] != '\0') {
        put_key(e, "name");
        put_value(e, name, ECP_NAME_MAX);
    }
    if (ecp_record_end(e) != 0) {
        return -1;
    }

    for (off = 0; off < nbytes; off += ECP_DATA_CHUNK) {
        size_t n = nbytes - off < ECP_DATA_CHUNK ? nbytes - off : ECP_DATA_CHUNK;
        ecp_record_start(e, "DATA");
        ecp_kv_int(e, "i", i);
        ecp_kv_int(e, "o", o);
        ecp_kv_uint(e, "off", (uint64_t)off);
        put_key(e, "b64");
        put_b64(e, data + off, n);
        if (ecp_record_end(e) != 0) {
            return -1;
        }
    }

    if (human_max > 0) {
        uint64_t nh = count < (uint64_t)human_max ? count : (uint64_t)human_max;
        uint64_t j;
        for (j = 0; j < nh; j++) {
            emit_human(e, element_value(dtype, data + j * item, scale, zp));
        }
    }
    return 0;
}

/* ---- tap records (--tap) ------------------------------------------------------------------------ */

/* "t:shape:CRC" entries joined by ',' ("-" for none). */
static int put_tap_list(ecp_t *e, const char *key, const ecp_tap_tensor_t *ts, int n) {
    int k;
    if (n < 0 || n > ECP_TAP_MAX_TENSORS || (n > 0 && ts == NULL)) {
        return -1;
    }
    put_key(e, key);
    if (n == 0) {
        put(e, "-", 1);
    }
    for (k = 0; k < n; k++) {
        if (ts[k].ndims < 0 || ts[k].ndims > ECP_MAX_DIMS) {
            return -1;
        }
        if (k > 0) {
            put(e, ",", 1);
        }
        put_i64(e, ts[k].t);
        put(e, ":", 1);
        put_shape(e, ts[k].dims, ts[k].ndims);
        put(e, ":", 1);
        put_hex32(e, ts[k].crc);
    }
    return 0;
}

int ecp_op(ecp_t *e, int i, int sub, int idx, const char *opname, uint64_t cycles, const ecp_tap_tensor_t *ins,
           int nin, const ecp_tap_tensor_t *outs, int nout) {
    ecp_record_start(e, "OP");
    ecp_kv_int(e, "i", i);
    ecp_kv_int(e, "sub", sub);
    ecp_kv_int(e, "idx", idx);
    put_key(e, "op");
    put_value(e, opname, ECP_OPNAME_MAX);
    ecp_kv_uint(e, "cycles", cycles);
    if (put_tap_list(e, "in", ins, nin) != 0 || put_tap_list(e, "out", outs, nout) != 0) {
        e->overflow = 1; /* a malformed tensor list: replaced by the overflow ERROR record */
    }
    return ecp_record_end(e);
}

int ecp_op_end(ecp_t *e, int i, uint64_t ops, uint64_t dropped, uint64_t ram_bytes) {
    ecp_record_start(e, "OPEND");
    ecp_kv_int(e, "i", i);
    ecp_kv_uint(e, "ops", ops);
    ecp_kv_uint(e, "dropped", dropped);
    ecp_kv_uint(e, "ram", ram_bytes);
    return ecp_record_end(e);
}

int ecp_op_dump(ecp_t *e, int i, int idx, int t, const char *role, const char *dtype, const int32_t *dims,
                int ndims, float scale, int32_t zp, const uint8_t *data, size_t nbytes) {
    size_t item, off;
    uint64_t count;
    const char *bad = tensor_problem(dtype, dims, ndims, data, nbytes, &item, &count);

    if (bad == NULL && (role == NULL || (strcmp(role, "in") != 0 && strcmp(role, "out") != 0))) {
        bad = "bad_role";
    }
    if (bad != NULL) {
        ecp_error(e, "internal", 0, i, bad);
        return -1;
    }
    ecp_record_start(e, "OPDUMP");
    ecp_kv_int(e, "i", i);
    ecp_kv_int(e, "idx", idx);
    ecp_kv_int(e, "t", t);
    ecp_kv_str(e, "role", role);
    put_tensor_desc(e, dtype, dims, ndims, scale, zp, data, nbytes);
    if (ecp_record_end(e) != 0) {
        return -1;
    }
    for (off = 0; off < nbytes; off += ECP_DATA_CHUNK) {
        size_t n = nbytes - off < ECP_DATA_CHUNK ? nbytes - off : ECP_DATA_CHUNK;
        ecp_record_start(e, "OPDATA");
        ecp_kv_int(e, "i", i);
        ecp_kv_int(e, "idx", idx);
        ecp_kv_int(e, "t", t);
        ecp_kv_str(e, "role", role);
        ecp_kv_uint(e, "off", (uint64_t)off);
        put_key(e, "b64");
        put_b64(e, data + off, n);
        if (ecp_record_end(e) != 0) {
            return -1;
        }
    }
    return 0;
}
