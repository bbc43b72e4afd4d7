/* esp-check resident command loop, version 4 (see esp_check_loop.h and docs/protocol.md). */
#include "esp_check_loop.h"

#include <string.h>

size_t ecl_sizeof(void) { return sizeof(ecl_t); }

static void send_in(ecl_t *l, uint8_t *buf, size_t cap, uint8_t type, const uint8_t *payload, size_t len) {
    size_t n = ecf_encode_keyed(buf, cap, type, 0, l->tx_seq, payload, len, l->key);
    if (n == 0) return; /* cannot happen: every caller bounds len by its buffer */
    l->tx_seq++;
    l->cfg.write(l->cfg.ctx, buf, n);
}

static void send_frame(ecl_t *l, uint8_t type, const uint8_t *payload, size_t len) {
    send_in(l, l->tx, sizeof(l->tx), type, payload, len);
}

static void flush_batch(ecl_t *l) {
    if (l->batch_len > 0) {
        send_in(l, l->txb, sizeof(l->txb), ECL_RSP_RESULT, l->txb + ECF_HEADER, l->batch_len);
        l->batch_len = 0;
    }
    l->batch_wait_us = 0;
}

static void send_ack(ecl_t *l) {
    uint8_t p[ECL_ACK_BYTES];
    ecf_put_u16(p + ECL_ACK_AT_NEXT_SEQ, l->rx_expected);
    ecf_put_u16(p + ECL_ACK_AT_ZERO, 0);
    send_frame(l, ECL_RSP_ACK, p, sizeof(p));
    l->consumed_since_ack = 0;
}

/* The batch, and an ACK of what was consumed: one RESULT frame that carries both when it can. */
static void flush_ack(ecl_t *l) {
    if (l->batch_len > 0 && l->consumed_since_ack > 0 && l->batch_len + 2u <= ECF_MAX_TX_PAYLOAD) {
        size_t n;
        ecf_put_u16(l->txb + ECF_HEADER + l->batch_len, l->rx_expected);
        n = ecf_encode_keyed(l->txb, sizeof(l->txb), ECL_RSP_RESULT, ECL_FRAME_ACK, l->tx_seq, l->txb + ECF_HEADER,
                             l->batch_len + 2u, l->key);
        if (n > 0) {
            l->tx_seq++;
            l->cfg.write(l->cfg.ctx, l->txb, n);
        }
        l->batch_len = 0;
        l->batch_wait_us = 0;
        l->consumed_since_ack = 0;
        return;
    }
    flush_batch(l);
    if (l->consumed_since_ack > 0) send_ack(l);
}

static void send_nak(ecl_t *l, uint8_t reason) {
    uint8_t p[ECL_NAK_BYTES];
    if (l->nak_pending) return;
    ecf_put_u16(p + ECL_NAK_AT_NEXT_SEQ, l->rx_expected);
    p[ECL_NAK_AT_REASON] = reason;
    p[ECL_NAK_AT_ZERO] = 0;
    flush_batch(l);
    send_frame(l, ECL_RSP_NAK, p, sizeof(p));
    l->nak_pending = 1;
    l->stats_naks++;
}

void ecl_error(ecl_t *l, uint32_t id, uint8_t stage, int32_t code, const char *msg) {
    uint8_t p[ECL_ERROR_FIXED + ECL_ERROR_MSG_MAX];
    size_t n = 0;
    flush_batch(l);
    ecf_put_u32(p + ECL_ERROR_AT_ID, id);
    ecf_put_u32(p + ECL_ERROR_AT_CODE, (uint32_t)code);
    p[ECL_ERROR_AT_STAGE] = stage;
    while (msg != NULL && msg[n] != '\0' && n < ECL_ERROR_MSG_MAX) {
        unsigned char c = (unsigned char)msg[n];
        p[ECL_ERROR_FIXED + n] = (c >= ECP_PRINTABLE_MIN && c <= ECP_PRINTABLE_MAX && c != '*') ? c : '_';
        n++;
    }
    send_frame(l, ECL_RSP_ERROR, p, ECL_ERROR_FIXED + n);
}

void ecl_hello(ecl_t *l) {
    uint8_t p[ECL_HELLO_FIXED + 4 * ECL_MAX_OUTPUTS + 1 + ECL_FWVER_MAX];
    /* "\r\n@ECH HELLO " + base64 of the whole frame + "\r\n": one line of text in a serial monitor */
    char line[sizeof(ECF_HELLO_LINE_PREFIX) + 4 * ((ECF_HEADER + sizeof(p) + ECF_TRAILER + 2) / 3) + 2];
    const ecl_config_t *c = &l->cfg;
    size_t k, pos, vlen = 0, n, w;
    memset(p, 0, sizeof(p));
    p[ECL_HELLO_AT_PROTO] = ECF_VERSION;
    p[ECL_HELLO_AT_FLAGS] = (uint8_t)((c->sim ? ECL_HELLO_SIM : 0u) | (c->tap ? ECL_HELLO_TAP : 0u));
    p[ECL_HELLO_AT_NN] = c->nn;
    p[ECL_HELLO_AT_SLOT] = c->slot;
    p[ECL_HELLO_AT_INIT] = c->init_status;
    p[ECL_HELLO_AT_DTYPE] = c->input_dtype;
    ecf_put_u16(p + ECL_HELLO_AT_MAX_PAYLOAD, ECF_MAX_TX_PAYLOAD);
    ecf_put_u32(p + ECL_HELLO_AT_WINDOW, c->window);
    ecf_put_u32(p + ECL_HELLO_AT_INPUT_BYTES, (uint32_t)c->input_bytes);
    ecf_put_u16(p + ECL_HELLO_AT_OUTPUTS, (uint16_t)c->n_outputs);
    ecf_put_u32(p + ECL_HELLO_AT_SESSION, c->session);
    if (c->model_sha256 != NULL) memcpy(p + ECL_HELLO_AT_MODEL_SHA256, c->model_sha256, ECL_HELLO_SHA256);
    if (c->app_sha256 != NULL) memcpy(p + ECL_HELLO_AT_APP_SHA256, c->app_sha256, ECL_HELLO_SHA256);
    if (c->other_sha256 != NULL) memcpy(p + ECL_HELLO_AT_OTHER_SHA256, c->other_sha256, ECL_HELLO_SHA256);
    ecf_put_u32(p + ECL_HELLO_AT_KEEP_CAPACITY, l->keep_cap);
    ecf_put_u32(p + ECL_HELLO_AT_KEPT, l->kept);
    pos = ECL_HELLO_FIXED;
    for (k = 0; k < c->n_outputs; k++, pos += 4) ecf_put_u32(p + pos, (uint32_t)c->outputs[k].bytes);
    while (c->fwver != NULL && c->fwver[vlen] != '\0' && vlen < ECL_FWVER_MAX) vlen++;
    p[pos++] = (uint8_t)vlen;
    for (k = 0; k < vlen; k++) {
        unsigned char ch = (unsigned char)c->fwver[k];
        p[pos++] = (ch >= ECP_PRINTABLE_MIN && ch <= ECP_PRINTABLE_MAX) ? ch : '_';
    }
    flush_batch(l);
    n = ecf_encode_keyed(l->tx, sizeof(l->tx), ECL_RSP_HELLO, 0, l->tx_seq, p, pos, l->key);
    if (n == 0) return;
    l->tx_seq++;
    w = sizeof(ECF_HELLO_LINE_PREFIX) - 1;
    memcpy(line, ECF_HELLO_LINE_PREFIX, w);
    k = ecf_b64(line + w, sizeof(line) - w - 2, l->tx, n);
    if (k == 0) return; /* cannot happen: line is sized for the largest HELLO */
    w += k;
    line[w++] = '\r';
    line[w++] = '\n';
    l->cfg.write(l->cfg.ctx, (const uint8_t *)line, w);
}

int ecl_init(ecl_t *l, const ecl_config_t *cfg) {
    memset(l, 0, sizeof(*l));
    l->cfg = *cfg;
    ecf_decoder_init(&l->dec, ECF_MAX_PAYLOAD);
    if (cfg->write == NULL || cfg->invoke == NULL || cfg->n_outputs > ECL_MAX_OUTPUTS ||
        (cfg->n_outputs > 0 && cfg->outputs == NULL)) {
        return -1;
    }
    if (cfg->window < ECF_MAX_FRAME) l->cfg.window = ECF_MAX_FRAME;
    l->key = ecf_key_crc(cfg->session, cfg->nn);
    ecf_decoder_set_key(&l->dec, l->key);
    ecl_keep_open(l);
    return 0;
}

/* ---- kept inputs (docs/protocol.md "Kept inputs") --------------------------------------------------
 * Layout of cfg.keep: a 64-byte header (magic, input bytes, capacity, nonce, region bytes, model SHA-256,
 * the region's own address, CRC-32 of the 60 bytes before it), then `capacity` entries of 8 bytes (u32
 * CRC-32 of the kept input, u32 check = CRC-32 of nonce, index and that CRC), then the inputs, 16-aligned
 * from the region's start.
 * A header written by another model, another layout, another address, or never written (a cold boot leaves
 * noise) fails its checks and is replaced by an empty one: the host then uploads. */

static size_t keep_slots_at(uint32_t cap) {
    return (ECL_KEEP_HEADER + (size_t)cap * ECL_KEEP_ENTRY + (ECL_KEEP_ALIGN - 1u)) & ~(size_t)(ECL_KEEP_ALIGN - 1u);
}

static uint32_t keep_check(uint32_t nonce, uint32_t index, uint32_t crc) {
    uint8_t b[12];
    ecf_put_u32(b, nonce);
    ecf_put_u32(b + 4, index);
    ecf_put_u32(b + 8, crc);
    return ecf_crc32(0u, b, sizeof(b));
}

static void keep_header(const ecl_t *l, uint8_t *h) {
    const ecl_config_t *c = &l->cfg;
    memset(h, 0, ECL_KEEP_HEADER);
    memcpy(h + ECL_KEEP_AT_MAGIC, ECL_KEEP_MAGIC, sizeof(ECL_KEEP_MAGIC) - 1);
    ecf_put_u32(h + ECL_KEEP_AT_INPUT_BYTES, (uint32_t)c->input_bytes);
    ecf_put_u32(h + ECL_KEEP_AT_CAPACITY, l->keep_cap);
    ecf_put_u32(h + ECL_KEEP_AT_NONCE, l->keep_nonce);
    ecf_put_u32(h + ECL_KEEP_AT_BYTES, (uint32_t)c->keep_bytes);
    memcpy(h + ECL_KEEP_AT_MODEL_SHA256, c->model_sha256, ECL_HELLO_SHA256);
    ecf_put_u32(h + ECL_KEEP_AT_PLACE, c->keep_place);
    ecf_put_u32(h + ECL_KEEP_AT_CRC, ecf_crc32(0u, h, ECL_KEEP_AT_CRC));
}

static int keep_entry_valid(const ecl_t *l, uint32_t k, uint32_t *crc) {
    const uint8_t *e = l->cfg.keep + ECL_KEEP_HEADER + (size_t)k * ECL_KEEP_ENTRY;
    *crc = ecf_get_u32(e);
    return ecf_get_u32(e + 4) == keep_check(l->keep_nonce, k, *crc);
}

uint32_t ecl_keep_open(ecl_t *l) {
    const ecl_config_t *c = &l->cfg;
    uint8_t want[ECL_KEEP_HEADER];
    size_t per, cap;
    uint32_t k, crc;
    l->keep_cap = 0;
    l->kept = 0;
    if (c->keep == NULL || c->model_sha256 == NULL || c->input_bytes == 0 || c->keep_bytes < ECL_KEEP_HEADER + ECL_KEEP_ALIGN) {
        return 0;
    }
    per = c->input_bytes + ECL_KEEP_ENTRY;
    cap = (c->keep_bytes - ECL_KEEP_HEADER - ECL_KEEP_ALIGN) / per;
    if (cap > ECL_KEEP_MAX) cap = ECL_KEEP_MAX;
    if (cap == 0) return 0;
    l->keep_cap = (uint32_t)cap;
    l->keep_nonce = ecf_get_u32(c->keep + ECL_KEEP_AT_NONCE); /* the header's own: it must match in the comparison below */
    keep_header(l, want);
    if (memcmp(want, c->keep, ECL_KEEP_HEADER) != 0) { /* not ours: a fresh, empty store */
        l->keep_nonce = c->session;
        keep_header(l, c->keep);
        memset(c->keep + ECL_KEEP_HEADER, 0, (size_t)cap * ECL_KEEP_ENTRY);
        return 0;
    }
    for (k = 0; k < l->keep_cap; k++) l->kept += (uint32_t)keep_entry_valid(l, k, &crc);
    return l->kept;
}

/* Input `id` is kept in entry id % capacity (a dataset larger than the store runs in chunks of the capacity,
 * docs/protocol.md "Kept inputs"); the RUN names the CRC-32 of the bytes it means, so an entry that holds
 * another input (an earlier chunk's) is not run. */
static uint32_t keep_slot(const ecl_t *l, uint32_t id) { return id % l->keep_cap; }

/* The kept copy of input `id` whose CRC-32 is `want`, or NULL (not kept, another input, damaged). */
static const uint8_t *keep_find(const ecl_t *l, uint32_t id, uint32_t want) {
    uint32_t crc, k;
    const uint8_t *in;
    if (l->keep_cap == 0) return NULL;
    k = keep_slot(l, id);
    if (!keep_entry_valid(l, k, &crc) || crc != want) return NULL;
    in = l->cfg.keep + keep_slots_at(l->keep_cap) + (size_t)k * l->cfg.input_bytes;
    return ecf_crc32(0u, in, l->cfg.input_bytes) == want ? in : NULL;
}

static void keep_store(ecl_t *l, uint32_t id, const uint8_t *in) {
    uint8_t *e;
    uint32_t crc, k;
    if (l->keep_cap == 0) return;
    k = keep_slot(l, id);
    e = l->cfg.keep + ECL_KEEP_HEADER + (size_t)k * ECL_KEEP_ENTRY;
    ecf_put_u32(e + 4, 0u); /* invalid while the bytes change */
    memcpy(l->cfg.keep + keep_slots_at(l->keep_cap) + (size_t)k * l->cfg.input_bytes, in, l->cfg.input_bytes);
    crc = ecf_crc32(0u, in, l->cfg.input_bytes);
    ecf_put_u32(e, crc);
    ecf_put_u32(e + 4, keep_check(l->keep_nonce, k, crc));
}

/* ---- RUN ------------------------------------------------------------------------------------ */

typedef struct {
    uint32_t id;
    uint8_t source, results, text, keep, now;
    uint16_t repeat, n_expect;
    uint64_t seed;
    const uint8_t *expected; /* n_expect little-endian u32 */
} run_cmd_t;

static int parse_run(const ecl_t *l, const ecf_frame_t *f, run_cmd_t *r) {
    if (f->len < ECL_RUN_FIXED) return 0;
    r->id = ecf_get_u32(f->payload + ECL_RUN_AT_ID);
    r->source = f->payload[ECL_RUN_AT_SOURCE];
    r->results = f->payload[ECL_RUN_AT_RESULTS];
    r->text = f->payload[ECL_RUN_AT_FLAGS] & ECL_RUN_TEXT;
    r->now = (uint8_t)(f->payload[ECL_RUN_AT_FLAGS] / ECL_RUN_NOW); /* ECL_RUN_NOW and any bit above it */
    r->keep = f->payload[ECL_RUN_AT_KEEP];
    r->repeat = ecf_get_u16(f->payload + ECL_RUN_AT_REPEAT);
    r->n_expect = ecf_get_u16(f->payload + ECL_RUN_AT_EXPECTED);
    r->seed = ecf_get_u64(f->payload + ECL_RUN_AT_SEED);
    r->expected = f->payload + ECL_RUN_FIXED;
    if ((size_t)f->len != ECL_RUN_FIXED + 4u * r->n_expect) return 0;
    if (r->n_expect != 0 && r->n_expect != l->cfg.n_outputs) return 0;
    if (r->source > ECL_SRC_KEPT || r->results > ECL_RES_FULL_IF_DIFFERENT || r->now > 1 || r->repeat == 0) {
        return 0;
    }
    if (r->keep > 1 || (r->keep && r->source != ECL_SRC_LOADED) || (r->text && r->source == ECL_SRC_KEPT)) return 0;
    return 1;
}

static void output_crcs(const ecl_t *l, uint32_t *out) {
    size_t o;
    for (o = 0; o < l->cfg.n_outputs; o++) out[o] = ecf_crc32(0u, l->cfg.outputs[o].data, l->cfg.outputs[o].bytes);
}

static void run_text(ecl_t *l, const run_cmd_t *r, const uint8_t *in) {
    const ecl_config_t *c = &l->cfg;
    char sha[65];
    uint32_t us = 0;
    int rc;
    size_t o;
    c->sha256_hex(c->ctx, in, c->input_bytes, sha);
    ecp_input(c->ecp, (int)r->id, c->input_bytes, sha);
    rc = c->invoke(c->ctx, in, c->input_bytes, &us);
    if (rc < 0) {
        l->status = ECL_HALTED;
        return;
    }
    if (rc > 0) {
        ecp_error(c->ecp, "invoke", rc, (int)r->id, "Invoke_failed");
        l->session_error = 1;
        return;
    }
    ecp_time(c->ecp, (int)r->id, (int64_t)us);
    for (o = 0; o < c->n_outputs; o++) {
        const ecl_output_t *t = &c->outputs[o];
        if (ecp_tensor(c->ecp, (int)r->id, (int)o, t->dtype, t->dims, t->ndims, t->scale, t->zp, t->data, t->bytes,
                       t->name, c->human_max) != 0) {
            l->session_error = 1;
            return;
        }
    }
    if (c->text_extra != NULL) c->text_extra(c->ctx, c->ecp, (int)r->id);
}

static void append(ecl_t *l, const uint8_t *data, size_t n) {
    memcpy(l->txb + ECF_HEADER + l->batch_len, data, n);
    l->batch_len += n;
}

static void send_data_frames(ecl_t *l, uint32_t id) { /* the batch is empty: its buffer builds them */
    uint8_t *p = l->txb + ECF_HEADER;
    const size_t chunk = ECF_MAX_TX_PAYLOAD - ECL_DATA_FIXED;
    size_t o;
    for (o = 0; o < l->cfg.n_outputs; o++) {
        const ecl_output_t *t = &l->cfg.outputs[o];
        size_t off = 0;
        while (off < t->bytes) {
            size_t n = t->bytes - off < chunk ? t->bytes - off : chunk;
            ecf_put_u32(p + ECL_DATA_AT_ID, id);
            ecf_put_u16(p + ECL_DATA_AT_OUTPUT, (uint16_t)o);
            ecf_put_u32(p + ECL_DATA_AT_OFFSET, (uint32_t)off);
            memcpy(p + ECL_DATA_FIXED, t->data + off, n);
            send_in(l, l->txb, sizeof(l->txb), ECL_RSP_DATA, p, ECL_DATA_FIXED + n);
            off += n;
        }
    }
}

/* Append a record to the batch (the room for its full size was made): an id that follows the previous
 * record's is not sent (ECL_HEAD_NEXT_ID). */
static void append_record(ecl_t *l, uint8_t *rec, size_t rec_len) {
    const uint32_t id = ecf_get_u32(rec + ECL_REC_AT_ID);
    if (l->batch_len > 0) { /* the batch's first record waited this RUN's invokes too */
        uint32_t sum = l->batch_wait_us + l->run_busy_us;
        l->batch_wait_us = sum < l->run_busy_us ? 0xFFFFFFFFu : sum;
    }
    if (l->batch_len > 0 && id == l->batch_last + 1u) {
        rec[0] |= ECL_HEAD_NEXT_ID;
        append(l, rec, ECL_REC_AT_ID);
        append(l, rec + ECL_REC_AT_INVOKE_US, rec_len - ECL_REC_AT_INVOKE_US);
    } else {
        append(l, rec, rec_len);
    }
    l->batch_last = id;
}

/* Queue one RESULT record (docs/protocol.md "Result record"): inline data when the record fits one frame.
 * crc_at: where the record's per-output CRC-32 block starts; a deterministic record whose outputs go inline
 * leaves it out (the host computes the CRC-32s from the bytes, which the frame's own CRC protects). */
static void emit_record(ecl_t *l, uint8_t *rec, size_t rec_len, size_t crc_at, int full) {
    size_t data_len = 0, o;
    for (o = 0; o < l->cfg.n_outputs; o++) data_len += l->cfg.outputs[o].bytes;
    if (!full) {
        if (l->batch_len + rec_len > ECF_MAX_TX_PAYLOAD) flush_batch(l);
        append_record(l, rec, rec_len);
        return;
    }
    if (!(rec[0] & ECL_FL_NONDETERMINISTIC)) {
        const size_t crcs = 4 * l->cfg.n_outputs;
        if (rec_len - crcs + data_len <= ECF_MAX_TX_PAYLOAD) {
            memmove(rec + crc_at, rec + crc_at + crcs, rec_len - crc_at - crcs);
            rec_len -= crcs;
        }
    }
    if (rec_len + data_len <= ECF_MAX_TX_PAYLOAD) {
        if (l->batch_len + rec_len + data_len > ECF_MAX_TX_PAYLOAD) flush_batch(l);
        rec[0] |= ECL_FL_INLINE;
        append_record(l, rec, rec_len);
        for (o = 0; o < l->cfg.n_outputs; o++) append(l, l->cfg.outputs[o].data, l->cfg.outputs[o].bytes);
        return;
    }
    if (l->batch_len + rec_len > ECF_MAX_TX_PAYLOAD) flush_batch(l);
    rec[0] |= ECL_FL_DATA_FRAMES;
    append_record(l, rec, rec_len);
    flush_batch(l);
    send_data_frames(l, l->batch_last);
}

static void run_binary(ecl_t *l, const run_cmd_t *r, const uint8_t *in) {
    const ecl_config_t *c = &l->cfg;
    uint8_t rec[ECL_REC_FIXED + 8 * ECL_MAX_OUTPUTS + 4];
    uint32_t now[ECL_MAX_OUTPUTS];
    uint32_t us = 0, first_us = 0, busy_us = 0;
    uint16_t done = 0, first_diff = 0;
    uint8_t status = ECL_ST_OK, flags = 0;
    size_t o, pos, crc_at;
    int full = 0;
    const uint32_t input_crc = ecf_crc32(0u, in, c->input_bytes);
    while (done < r->repeat) {
        int rc = c->invoke(c->ctx, in, c->input_bytes, &us);
        if (rc < 0) {
            l->status = ECL_HALTED;
            return;
        }
        if (rc > 0) {
            status = ECL_ST_INVOKE_FAILED;
            first_us = (uint32_t)rc; /* the invoke_us field carries the error status */
            break;
        }
        busy_us = busy_us + us < busy_us ? 0xFFFFFFFFu : busy_us + us;
        if (done == 0) {
            first_us = us;
            output_crcs(l, l->crc_first);
        } else if (!(flags & ECL_FL_NONDETERMINISTIC)) {
            output_crcs(l, now);
            if (memcmp(now, l->crc_first, 4 * c->n_outputs) != 0) {
                flags |= ECL_FL_NONDETERMINISTIC;
                first_diff = done;
                memcpy(l->crc_diff, now, 4 * c->n_outputs);
            }
        }
        done++;
    }
    if (r->repeat > 1) flags |= ECL_FL_REPEATS;
    rec[ECL_REC_AT_HEAD] = (uint8_t)(flags | (status << ECL_HEAD_STATUS_SHIFT));
    ecf_put_u32(rec + ECL_REC_AT_ID, r->id);
    ecf_put_u32(rec + ECL_REC_AT_INVOKE_US, first_us);
    ecf_put_u32(rec + ECL_REC_AT_INPUT_CRC, input_crc);
    pos = ECL_REC_FIXED;
    if (flags & ECL_FL_REPEATS) {
        ecf_put_u16(rec + pos, done);
        ecf_put_u16(rec + pos + 2, first_diff);
        pos += 4;
    }
    crc_at = pos;
    for (o = 0; o < c->n_outputs; o++, pos += 4) ecf_put_u32(rec + pos, status == ECL_ST_OK ? l->crc_first[o] : 0);
    if (flags & ECL_FL_NONDETERMINISTIC) {
        for (o = 0; o < c->n_outputs; o++, pos += 4) ecf_put_u32(rec + pos, l->crc_diff[o]);
    }
    if (status == ECL_ST_OK) {
        if (r->results == ECL_RES_FULL) full = 1;
        if (r->results == ECL_RES_FULL_IF_DIFFERENT) {
            full = r->n_expect == 0;
            for (o = 0; o < r->n_expect; o++) full |= ecf_get_u32(r->expected + 4 * o) != l->crc_first[o];
        }
    }
    l->run_busy_us = busy_us;
    emit_record(l, rec, pos, crc_at, full);
    /* a batch that waited long enough (a slow model's results share frames), or asked for, or the boot's
     * first slow RUN (the host learns the invoke time): out, with the ACK */
    if (l->batch_wait_us >= ECL_BATCH_WAIT_US || r->now || (busy_us >= ECL_SLOW_RUN_US && !l->slow_shown)) {
        l->slow_shown |= busy_us >= ECL_SLOW_RUN_US;
        flush_ack(l);
    }
}

static void not_run(ecl_t *l, uint32_t id, uint8_t status) {
    uint8_t rec[ECL_REC_FIXED + 4 * ECL_MAX_OUTPUTS];
    memset(rec, 0, sizeof(rec));
    rec[ECL_REC_AT_HEAD] = (uint8_t)(status << ECL_HEAD_STATUS_SHIFT);
    ecf_put_u32(rec + ECL_REC_AT_ID, id);
    l->run_busy_us = 0;
    emit_record(l, rec, ECL_REC_FIXED + 4 * l->cfg.n_outputs, ECL_REC_FIXED, 0);
}

static void do_run(ecl_t *l, const ecf_frame_t *f) {
    run_cmd_t r;
    const ecl_config_t *c = &l->cfg;
    const uint8_t *in = c->staging;
    if (!parse_run(l, f, &r) || (r.text && !l->session_open) || c->staging == NULL) {
        ecl_error(l, f->len >= 4 ? ecf_get_u32(f->payload) : ECL_NO_ID, ECL_STAGE_PROTOCOL, f->len, "bad_run_command");
        l->loaded = 0;
        return;
    }
    l->stats_runs++;
    if (r.source == ECL_SRC_PRNG) {
        ecf_prng_fill(r.seed, r.id, c->input_dtype, c->staging, c->input_bytes);
    } else if (r.source == ECL_SRC_KEPT) {
        in = keep_find(l, r.id, (uint32_t)r.seed);
        if (in == NULL) {
            not_run(l, r.id, ECL_ST_NOT_KEPT);
            return;
        }
    } else if (l->loaded != c->input_bytes) {
        l->loaded = 0;
        if (r.text) {
            flush_batch(l);
            ecp_error(c->ecp, "input", 0, (int)r.id, "input_not_loaded");
            l->session_error = 1;
            return;
        }
        not_run(l, r.id, ECL_ST_INPUT_INCOMPLETE);
        return;
    } else if (r.keep) {
        keep_store(l, r.id, c->staging);
    }
    l->loaded = 0;
    if (r.text) {
        flush_batch(l);
        run_text(l, &r, in);
    } else {
        run_binary(l, &r, in);
    }
}

/* ---- dispatch ------------------------------------------------------------------------------- */

static void do_load(ecl_t *l, const ecf_frame_t *f) {
    uint32_t off;
    size_t n;
    if (f->len < 4 || l->cfg.staging == NULL) {
        ecl_error(l, ECL_NO_ID, ECL_STAGE_PROTOCOL, f->len, "bad_load_command");
        return;
    }
    off = ecf_get_u32(f->payload);
    n = (size_t)f->len - 4;
    if (off > l->cfg.input_bytes || n > l->cfg.input_bytes - off) {
        ecl_error(l, ECL_NO_ID, ECL_STAGE_INPUT, (int32_t)off, "load_beyond_input_tensor");
        l->loaded = 0;
        return;
    }
    memcpy(l->cfg.staging + off, f->payload + 4, n);
    l->loaded += n;
}

static void dispatch(ecl_t *l, const ecf_frame_t *f) {
    uint8_t p[ECL_BOOT_BYTES]; /* the largest reply here (BAUD_OK's is as large) */
    switch (f->type) {
        case ECL_CMD_HELLO: ecl_hello(l); break;
        case ECL_CMD_LOAD: do_load(l, f); break;
        case ECL_CMD_RUN: do_run(l, f); break;
        case ECL_CMD_SESSION:
            flush_batch(l);
            if (l->cfg.ecp == NULL || l->cfg.session_begin == NULL || l->cfg.sha256_hex == NULL) {
                ecl_error(l, ECL_NO_ID, ECL_STAGE_PROTOCOL, 0, "no_text_sessions");
                break;
            }
            l->session_open = 1;
            l->session_error = 0;
            l->cfg.ecp->seq = 0;
            l->cfg.session_begin(l->cfg.ctx, l->cfg.ecp, f->len >= 4 ? ecf_get_u32(f->payload) : 0u);
            break;
        case ECL_CMD_END:
            flush_batch(l);
            if (!l->session_open || l->cfg.ecp == NULL) {
                ecl_error(l, ECL_NO_ID, ECL_STAGE_PROTOCOL, 0, "end_without_session");
                break;
            }
            ecp_end(l->cfg.ecp, !l->session_error);
            l->session_open = 0;
            break;
        case ECL_CMD_SYNC:
            flush_batch(l);
            memset(p, 0, sizeof(p));
            if (f->len >= ECL_SYNC_BYTES) memcpy(p + ECL_SYNC_AT_TOKEN, f->payload, ECL_SYNC_BYTES);
            send_frame(l, ECL_RSP_SYNC, p, ECL_SYNC_BYTES);
            break;
        case ECL_CMD_BOOT: {
            int rc = f->len >= 1 && f->payload[0] <= 1 && l->cfg.boot_slot != NULL
                         ? l->cfg.boot_slot(l->cfg.ctx, f->payload[0])
                         : -1;
            flush_batch(l);
            p[ECL_BOOT_AT_SLOT] = f->len >= 1 ? f->payload[0] : 0xFF;
            memset(p + ECL_BOOT_AT_ZERO, 0, ECL_BOOT_AT_STATUS - ECL_BOOT_AT_ZERO);
            ecf_put_u32(p + ECL_BOOT_AT_STATUS, (uint32_t)rc);
            send_frame(l, ECL_RSP_BOOT, p, ECL_BOOT_BYTES);
            if (rc == 0) l->status = ECL_REBOOT;
            break;
        }
        case ECL_CMD_BAUD: {
            uint32_t baud = f->len >= 4 ? ecf_get_u32(f->payload) : 0u;
            int32_t rc = l->cfg.set_baud != NULL && baud >= ECL_BAUD_MIN && baud <= ECL_BAUD_MAX ? 0 : -1;
            flush_batch(l);
            ecf_put_u32(p + ECL_BAUD_AT_BAUD, baud);
            ecf_put_u32(p + ECL_BAUD_AT_STATUS, (uint32_t)rc);
            send_frame(l, ECL_RSP_BAUD, p, ECL_BAUD_BYTES);
            if (rc == 0) l->cfg.set_baud(l->cfg.ctx, baud); /* after the reply: it leaves at the old baud */
            break;
        }
        default: ecl_error(l, ECL_NO_ID, ECL_STAGE_PROTOCOL, f->type, "unknown_command"); break;
    }
}

static void on_frame(void *ctx, const ecf_frame_t *f) {
    ecl_t *l = (ecl_t *)ctx;
    int16_t d;
    if (l->status != ECL_OK) return;
    if (l->dec.bad_headers + l->dec.bad_crc != l->bad_seen) {
        l->bad_seen = l->dec.bad_headers + l->dec.bad_crc;
        send_nak(l, ECL_NAK_BAD_FRAME);
    }
    d = (int16_t)(uint16_t)(f->seq - l->rx_expected);
    if (d < 0) { /* a retransmission of something already done: say again where we are */
        l->stats_dups++;
        send_ack(l);
        return;
    }
    if (d > 0) { /* a frame before this one was lost */
        send_nak(l, ECL_NAK_GAP);
        return;
    }
    l->nak_pending = 0;
    l->rx_expected++;
    l->consumed_since_ack += (uint32_t)(ECF_HEADER + f->len + ECF_TRAILER);
    if (l->consumed_since_ack >= l->cfg.window / ECL_ACK_PER_WINDOW) send_ack(l);
    dispatch(l, f);
}

int ecl_rx(ecl_t *l, const uint8_t *data, size_t len) {
    if (l->status != ECL_OK) return l->status;
    ecf_decoder_feed(&l->dec, data, len, on_frame, l);
    if (l->status == ECL_OK && l->dec.bad_headers + l->dec.bad_crc != l->bad_seen) {
        l->bad_seen = l->dec.bad_headers + l->dec.bad_crc;
        send_nak(l, ECL_NAK_BAD_FRAME);
    }
    return l->status;
}

int ecl_idle(ecl_t *l) {
    if (l->status != ECL_OK) return l->status;
    flush_ack(l);
    return l->status;
}
