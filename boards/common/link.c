/* Device side of the serial protocol (docs/PROTOCOL.md). Frame:
 *   0xA5 0x5A | type u8 | seq u8 | len u16 | payload[len] | crc32(type..payload) u32, little-endian.
 * Every request gets exactly one response frame carrying the request's seq. A frame that fails
 * its length or CRC check is answered with an ERROR frame and never acted on. A request that
 * repeats the previous one (same seq and CRC: the host did not get our answer) is answered by
 * resending the previous response, without doing the work again, so every request takes effect
 * exactly once however often the host has to retransmit it. */
#include "link.h"

#include "colibri.h"

void *memcpy(void *dst, const void *src, size_t n); /* the C library's, or boards/common/rt.c on bare metal */

/* Each request's handler keeps its own frame: inlined into link_execute, their frames (a colibri_stats or more in
 * several) would all be under every runtime call, in the worst-case stack colibri footprint computes (240 bytes more
 * on the Cortex-M4, against 520 bytes of .text this way). */
#if defined(__GNUC__) || defined(__clang__)
#define HANDLER static __attribute__((noinline)) void
#else
#define HANDLER static void
#endif

/* schema:link (written by python -m colibri.schema from format/schema.toml) */
#define SYNC0 0xA5u
#define SYNC1 0x5Au
#define MAX_PAYLOAD 4096u
#define PROTOCOL_VERSION 4u

enum {
    REQ_INFO = 0x01, REQ_OPEN = 0x02, REQ_START = 0x03, REQ_STATS = 0x04, REQ_QUIT = 0x05, REQ_UPLOAD_BEGIN = 0x06,
    REQ_UPLOAD_CHUNK = 0x07, REQ_UPLOAD_END = 0x08, REQ_FEED = 0x09, REQ_STEP = 0x0A, REQ_LOGITS = 0x0B,
    REQ_TRACE = 0x0C, RSP_INFO = 0x81, RSP_OPENED = 0x82, RSP_TOKEN = 0x83, RSP_LOGITS = 0x84, RSP_STARTED = 0x85,
    RSP_STATS = 0x86, RSP_BYE = 0x87, RSP_UPLOAD_ACK = 0x88, RSP_UPLOADED = 0x89, RSP_FED = 0x8A, RSP_TRACE = 0x8B,
    RSP_ERROR = 0xEE
};
/* Link-level error codes, above the runtime's colibri_status values. */
enum {
    LINK_BAD_CRC = 200, LINK_BAD_LENGTH = 201, LINK_UNKNOWN_TYPE = 202, LINK_BAD_PAYLOAD = 203, LINK_NOT_OPEN = 204,
    LINK_NO_IMAGE = 205, LINK_UPLOAD_TOO_BIG = 206, LINK_UPLOAD_ORDER = 207, LINK_UPLOAD_CRC = 208, LINK_BUSY = 209
};
/* /schema:link */
#define LOGITS_PER_FRAME ((MAX_PAYLOAD - 12u) / 4u)
#define START_TRACE 1u          /* START flag: record what every layer did for the last token */
#define TRACE_BYTES 8192u       /* one token's layer records; layers that do not fit are dropped */
#define TRACE_LAYER_BYTES 40u   /* u32 layer, u32 n_routed, u64 cycles: attention, router, ffn; u32 CRCs: attention, output */
#define TRACE_EXPERT_BYTES 16u  /* u32 expert, f32 weight, u64 cycles */

typedef struct {
    const board_io *io;
    const uint8_t *image; /* the image OPEN uses: the preloaded one, or the last complete upload */
    size_t image_size;
    uint64_t upload_total, upload_received;
    uint32_t upload_crc;
    colibri_ctx *ctx;
    colibri_image_info info; /* of the open image */
    colibri_sampler sampler;
    uint32_t trace_len, trace_layers, trace_dropped; /* the last token's records */
    uint32_t trace_pos;                              /* the position of the last token of this FEED or STEP */
    uint8_t trace[TRACE_BYTES];
    int have_last;         /* tx holds the response to the request (last_seq, last_crc) */
    uint8_t last_seq;
    uint32_t last_crc;
    uint8_t rx[MAX_PAYLOAD];
    uint32_t feed_tokens[(MAX_PAYLOAD - 4) / 4]; /* a FEED's ids, decoded for colibri_feed */
    uint8_t tx[6 + MAX_PAYLOAD + 4]; /* the last response, kept to answer a retransmission */
    uint8_t err_tx[6 + 12 + 96 + 4]; /* errors about corrupt frames, which must not replace tx */
} link_state;

static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { put32(p, (uint32_t)v); put32(p + 4, (uint32_t)(v >> 32)); }
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) { return get32(p) | (uint64_t)get32(p + 4) << 32; }
static float getf(const uint8_t *p) { union { uint32_t u; float f; } v = { get32(p) }; return v.f; }
static void putf(uint8_t *p, float f) { union { float f; uint32_t u; } v = { f }; put32(p, v.u); }

/* The payload of the response is built in place at tx + 6. */
static uint8_t *payload(link_state *l) { return l->tx + 6; }

static uint32_t frame_bytes(const uint8_t *f) { return 6u + (f[4] | (uint32_t)f[5] << 8) + 4u; }

/* Frame the payload already at f + 6 and write it. */
static void send_frame(link_state *l, uint8_t *f, uint8_t type, uint8_t seq, uint32_t len) {
    f[0] = SYNC0; f[1] = SYNC1; f[2] = type; f[3] = seq; f[4] = (uint8_t)len; f[5] = (uint8_t)(len >> 8);
    put32(f + 6 + len, colibri_crc32(0, f + 2, 4 + len));
    l->io->write(f, frame_bytes(f));
}

static void send(link_state *l, uint8_t type, uint8_t seq, uint32_t len) { send_frame(l, l->tx, type, seq, len); }

static void error_frame(link_state *l, uint8_t *f, uint8_t seq, uint32_t code, uint64_t detail) {
    const char *msg = code < COLIBRI_STATUS_COUNT ? colibri_strerror((colibri_status)code) : "link error";
    uint8_t *p = f + 6;
    uint32_t n = 12;
    put32(p, code);
    put64(p + 4, detail);
    while (*msg && n < 12 + 96) p[n++] = (uint8_t)*msg++;
    send_frame(l, f, RSP_ERROR, seq, n);
}

static void send_error(link_state *l, uint8_t seq, uint32_t code, uint64_t detail) {
    error_frame(l, l->tx, seq, code, detail);
}

/* Read one frame into l->rx. Returns its length, -1 at end of stream, or -2 after answering a
 * corrupt frame with an ERROR. *crc receives the frame's CRC (identifies a retransmission). */
static int recv_frame(link_state *l, uint8_t *type, uint8_t *seq, uint32_t *crc) {
    const board_io *io = l->io;
    int b = io->read_byte();
    for (;;) { /* hunt for the sync pair */
        if (b < 0) return -1;
        if (b != SYNC0) { b = io->read_byte(); continue; }
        b = io->read_byte();
        if (b == SYNC1) break;
    }
    uint8_t hdr[4];
    for (int i = 0; i < 4; i++) {
        if ((b = io->read_byte()) < 0) return -1;
        hdr[i] = (uint8_t)b;
    }
    *type = hdr[0];
    *seq = hdr[1];
    uint32_t len = hdr[2] | (uint32_t)hdr[3] << 8;
    if (len > MAX_PAYLOAD) {
        error_frame(l, l->err_tx, *seq, LINK_BAD_LENGTH, len);
        return -2;
    }
    uint8_t tail[4];
    for (uint32_t i = 0; i < len + 4; i++) {
        if ((b = io->read_byte()) < 0) return -1;
        if (i < len) l->rx[i] = (uint8_t)b;
        else tail[i - len] = (uint8_t)b;
    }
    *crc = colibri_crc32(colibri_crc32(0, hdr, 4), l->rx, len);
    if (*crc != get32(tail)) {
        error_frame(l, l->err_tx, *seq, LINK_BAD_CRC, 0);
        return -2;
    }
    return (int)len;
}

HANDLER do_info(link_state *l, uint8_t seq) {
    uint8_t *p = payload(l);
    put32(p, PROTOCOL_VERSION);
    put32(p + 4, MAX_PAYLOAD);
    put64(p + 8, l->io->upload ? l->io->upload_capacity : l->image_size);
    put64(p + 16, l->io->arena_size);
    put64(p + 24, l->io->cycle_hz);
    uint32_t n = 0;
    for (const char *s = l->io->board; s && *s && n < 31; s++) p[32 + n++] = (uint8_t)*s;
    while (n < 32) p[32 + n++] = 0;
    send(l, RSP_INFO, seq, 64);
}

/* The trace buffer keeps the layer records of the token at position pos, the last one a FEED or STEP feeds. */
static void start_trace(link_state *l, uint32_t pos) {
    l->trace_pos = pos;
    l->trace_len = l->trace_layers = l->trace_dropped = 0;
}

/* The runtime's trace hook: append one layer's record of the traced token. */
static void trace_layer(void *user, const colibri_layer_trace *t) {
    link_state *l = user;
    if (t->pos != l->trace_pos) return; /* a prefill batch calls it for all its tokens, layer by layer */
    uint32_t need = TRACE_LAYER_BYTES + TRACE_EXPERT_BYTES * t->n_routed;
    if (need > TRACE_BYTES - l->trace_len) { l->trace_dropped++; return; }
    uint8_t *p = l->trace + l->trace_len;
    put32(p, t->layer);
    put32(p + 4, t->n_routed);
    put64(p + 8, t->cycles_attention);
    put64(p + 16, t->cycles_router);
    put64(p + 24, t->cycles_ffn);
    put32(p + 32, t->crc_attention);
    put32(p + 36, t->crc_output);
    for (uint32_t k = 0; k < t->n_routed; k++) {
        uint8_t *e = p + TRACE_LAYER_BYTES + TRACE_EXPERT_BYTES * k;
        put32(e, t->experts[k]);
        putf(e + 4, t->weights[k]);
        put64(e + 8, t->cycles_expert[k]);
    }
    l->trace_len += need;
    l->trace_layers++;
}

/* The runtime's fetch hooks: the board's, or a copy out of the image region. */
static int fetch_region(void *user, uint64_t offset, size_t bytes, void *dst) {
    const link_state *l = user;
    if (offset > l->image_size || bytes > l->image_size - offset) return 1;
    memcpy(dst, l->image + offset, bytes);
    return 0;
}
static int fetch_board(void *user, uint64_t offset, size_t bytes, void *dst) {
    return ((const link_state *)user)->io->fetch(offset, bytes, dst);
}
static int fetch_start_board(void *user, uint64_t offset, size_t bytes, void *dst) {
    return ((const link_state *)user)->io->fetch_start(offset, bytes, dst);
}
static int fetch_wait_board(void *user, void *dst) { return ((const link_state *)user)->io->fetch_wait(dst); }
static void parallel_for_board(void *user, void (*fn)(void *arg, uint32_t part), void *arg, uint32_t parts) {
    ((const link_state *)user)->io->parallel_for(fn, arg, parts);
}

/* OPEN [u32 expert cache slots, u32 expert policy [, u32 routed experts per token]] */
HANDLER do_open(link_state *l, uint8_t seq, uint32_t len) {
    const board_io *io = l->io;
    if (len != 0 && len != 8 && len != 12) { send_error(l, seq, LINK_BAD_PAYLOAD, len); return; }
    colibri_options opts = { .size = sizeof(colibri_options), .cycles = io->cycles, .user = l }; /* the trace hook only while tracing: do_start */
    if (io->parallel_for && io->parallel_parts > 1) {
        opts.parallel_for = parallel_for_board;
        opts.parallel_parts = io->parallel_parts;
    }
    if (len) {
        opts.expert_cache = get32(l->rx);
        opts.expert_policy = get32(l->rx + 4);
    }
    if (len == 12) { /* a count sent is one asked for: 0 here is a request for no experts, not "the image's" */
        opts.experts = get32(l->rx + 8);
        if (!opts.experts) { send_error(l, seq, COLIBRI_E_BAD_ARG, 0); return; }
    }
    if (!opts.expert_cache) opts.prefill_batch = io->prefill_batch;
    if (opts.expert_cache) {
        opts.fetch = io->fetch ? fetch_board : fetch_region;
        if (io->fetch_start && io->fetch_wait) {
            opts.fetch_start = fetch_start_board;
            opts.fetch_wait = fetch_wait_board;
        }
    }
    uint64_t needed = 0;
    colibri_image_info info;
    l->ctx = 0;
    if (!l->image) {
        send_error(l, seq, LINK_NO_IMAGE, 0);
        return;
    }
    colibri_status st = colibri_open(l->image, l->image_size, io->arena, io->arena_size, &opts, &l->ctx, &needed);
    if (st) {
        send_error(l, seq, st, needed);
        return;
    }
    colibri_get_info(l->ctx, &info); /* open verified the image: no second CRC pass */
    colibri_stats stats = COLIBRI_STATS_INIT;
    colibri_get_stats(l->ctx, &stats);
    l->info = info;
    colibri_sampler_init(&l->sampler, 0.0f, 0, 1.0f, 0);
    uint8_t *p = payload(l);
    put64(p, info.image_bytes);
    put64(p + 8, stats.arena_bytes);
    put32(p + 16, info.payload_crc32);
    put32(p + 20, info.vocab_size);
    put32(p + 24, info.max_seq);
    put32(p + 28, opts.expert_cache);
    const char *kernels = "";
    colibri_get_kernels(l->ctx, &kernels);
    for (uint32_t i = 0; i < 8; i++) { /* the kernel set's name, NUL-padded */
        p[32 + i] = (uint8_t)*kernels;
        if (*kernels) kernels++;
    }
    put64(p + 40, info.resident_bytes);
    put64(p + 48, info.expert_block_bytes);
    put32(p + 56, info.streamed_experts);
    put32(p + 60, info.expert_cache_min);
    put32(p + 64, stats.prefill_batch);
    put32(p + 68, opts.parallel_parts);
    send(l, RSP_OPENED, seq, 72);
}

static uint64_t cycles_now(const board_io *io) { return io->cycles ? io->cycles(0) : 0; }

/* START: a new sequence (reset) with these sampling parameters. */
HANDLER do_start(link_state *l, uint8_t seq, uint32_t len) {
    const uint8_t *r = l->rx;
    if (len != 24) { send_error(l, seq, LINK_BAD_PAYLOAD, len); return; }
    colibri_sampler s;
    colibri_status st = colibri_sampler_init(&s, getf(r), get32(r + 4), getf(r + 8), get64(r + 16));
    if (st) { send_error(l, seq, st, 0); return; }
    l->sampler = s;
    l->trace_len = l->trace_layers = l->trace_dropped = 0;
    colibri_reset(l->ctx);
    colibri_set_trace(l->ctx, get32(r + 12) & START_TRACE ? trace_layer : 0);
    put32(payload(l), 0);
    send(l, RSP_STARTED, seq, 4);
}

/* FEED: tokens at the next positions. All are checked before any is fed, so a failed FEED
 * changes nothing. */
HANDLER do_feed(link_state *l, uint8_t seq, uint32_t len) {
    const uint8_t *r = l->rx;
    uint32_t n = len >= 4 ? get32(r) : 0;
    if (len < 8 || (len - 4) % 4 || n != (len - 4) / 4) { send_error(l, seq, LINK_BAD_PAYLOAD, len); return; }
    colibri_stats stats = COLIBRI_STATS_INIT;
    colibri_get_stats(l->ctx, &stats);
    if (n > l->info.max_seq - stats.tokens_fed) { send_error(l, seq, COLIBRI_E_SEQ_FULL, l->info.max_seq); return; }
    for (uint32_t i = 0; i < n; i++)
        if (get32(r + 4 + 4 * i) >= l->info.vocab_size) { send_error(l, seq, COLIBRI_E_TOKEN_RANGE, i); return; }
    for (uint32_t i = 0; i < n; i++) l->feed_tokens[i] = get32(r + 4 + 4 * i);
    uint64_t t0 = cycles_now(l->io);
    start_trace(l, stats.tokens_fed + n - 1);
    colibri_status st = colibri_feed(l->ctx, l->feed_tokens, n); /* one call: only the last token runs the lm_head */
    if (st) {
        colibri_stats after = COLIBRI_STATS_INIT;
        colibri_get_stats(l->ctx, &after);
        send_error(l, seq, st, after.tokens_fed - stats.tokens_fed); /* detail: which token of the request */
        return;
    }
    uint8_t *p = payload(l);
    put32(p, stats.tokens_fed + n);
    put32(p + 4, 0);
    put64(p + 8, cycles_now(l->io) - t0);
    send(l, RSP_FED, seq, 16);
}

/* STEP: sample the next token from the current logits and feed it. */
HANDLER do_step(link_state *l, uint8_t seq) {
    uint32_t tok;
    colibri_stats before = COLIBRI_STATS_INIT;
    colibri_get_stats(l->ctx, &before);
    start_trace(l, before.tokens_fed);
    uint64_t t0 = cycles_now(l->io);
    colibri_status st = colibri_step(l->ctx, &l->sampler, &tok);
    if (st) { send_error(l, seq, st, 0); return; }
    colibri_stats stats = COLIBRI_STATS_INIT;
    colibri_get_stats(l->ctx, &stats);
    uint8_t *p = payload(l);
    put32(p, stats.tokens_fed);
    put32(p + 4, tok);
    put64(p + 8, cycles_now(l->io) - t0);
    send(l, RSP_TOKEN, seq, 16);
}

/* LOGITS: a slice of the logits after the last fed token (read-only, so any repeat is harmless). */
HANDLER do_logits(link_state *l, uint8_t seq, uint32_t len) {
    if (len != 8) { send_error(l, seq, LINK_BAD_PAYLOAD, len); return; }
    const float *logits;
    uint32_t vocab;
    colibri_status st = colibri_logits(l->ctx, &logits, &vocab);
    if (st) { send_error(l, seq, st, 0); return; }
    uint32_t first = get32(l->rx), count = get32(l->rx + 4);
    if (first >= vocab || count == 0 || count > LOGITS_PER_FRAME || count > vocab - first) {
        send_error(l, seq, LINK_BAD_PAYLOAD, vocab);
        return;
    }
    colibri_stats stats = COLIBRI_STATS_INIT;
    colibri_get_stats(l->ctx, &stats);
    uint8_t *p = payload(l);
    put32(p, stats.tokens_fed);
    put32(p + 4, first);
    put32(p + 8, count);
    for (uint32_t i = 0; i < count; i++) putf(p + 12 + 4 * i, logits[first + i]);
    send(l, RSP_LOGITS, seq, 12 + 4 * count);
}

/* TRACE(first_byte): the last fed token's layer records from that byte offset on, as many as fit. */
HANDLER do_trace(link_state *l, uint8_t seq, uint32_t len) {
    if (len != 4) { send_error(l, seq, LINK_BAD_PAYLOAD, len); return; }
    uint32_t first = get32(l->rx);
    if (first > l->trace_len) { send_error(l, seq, LINK_BAD_PAYLOAD, l->trace_len); return; }
    uint32_t n = l->trace_len - first;
    if (n > MAX_PAYLOAD - 16) n = MAX_PAYLOAD - 16;
    uint8_t *p = payload(l);
    put32(p, l->trace_layers);
    put32(p + 4, l->trace_dropped);
    put32(p + 8, l->trace_len);
    put32(p + 12, first);
    for (uint32_t i = 0; i < n; i++) p[16 + i] = l->trace[first + i];
    send(l, RSP_TRACE, seq, 16 + n);
}

/* Upload: BEGIN(total, crc32) -> chunks in order -> END checks the CRC of everything received.
 * A chunk at an offset already received is acknowledged again without writing, and a BEGIN that
 * repeats the unfinished upload's size and CRC resumes it (the ACK says how much arrived), so an
 * upload survives lost frames and a cut link. Any other BEGIN forgets the open context and the
 * old image. */
static void send_upload_ack(link_state *l, uint8_t seq) {
    put64(payload(l), l->upload_received);
    send(l, RSP_UPLOAD_ACK, seq, 8);
}

HANDLER do_upload_begin(link_state *l, uint8_t seq, uint32_t len) {
    if (len != 12) { send_error(l, seq, LINK_BAD_PAYLOAD, len); return; }
    uint64_t total = get64(l->rx);
    uint32_t crc = get32(l->rx + 8);
    if (!l->io->upload || total == 0 || total > l->io->upload_capacity) {
        send_error(l, seq, LINK_UPLOAD_TOO_BIG, l->io->upload ? l->io->upload_capacity : 0);
        return;
    }
    l->ctx = 0;
    l->image = 0;
    if (total != l->upload_total || crc != l->upload_crc) { /* a new upload, not a resumed one */
        l->upload_total = total;
        l->upload_received = 0;
        l->upload_crc = crc;
    }
    send_upload_ack(l, seq);
}

HANDLER do_upload_chunk(link_state *l, uint8_t seq, uint32_t len) {
    if (len < 8 || !l->upload_total) { send_error(l, seq, LINK_BAD_PAYLOAD, len); return; }
    uint64_t offset = get64(l->rx), n = len - 8;
    if (offset <= l->upload_received && n <= l->upload_received - offset) { /* already have it */
        send_upload_ack(l, seq);
        return;
    }
    if (offset != l->upload_received || n > l->upload_total - offset) {
        send_error(l, seq, LINK_UPLOAD_ORDER, l->upload_received);
        return;
    }
    for (uint64_t i = 0; i < n; i++) l->io->upload[offset + i] = l->rx[8 + i];
    l->upload_received += n;
    send_upload_ack(l, seq);
}

HANDLER do_upload_end(link_state *l, uint8_t seq) {
    if (!l->upload_total || l->upload_received != l->upload_total) {
        send_error(l, seq, LINK_UPLOAD_ORDER, l->upload_received);
        return;
    }
    uint32_t crc = colibri_crc32(0, l->io->upload, (size_t)l->upload_total);
    if (crc != l->upload_crc) {
        l->upload_total = 0;
        send_error(l, seq, LINK_UPLOAD_CRC, crc);
        return;
    }
    l->image = l->io->upload;
    l->image_size = (size_t)l->upload_total;
    l->upload_total = 0;
    uint8_t *p = payload(l);
    put64(p, l->image_size);
    put32(p + 8, crc);
    send(l, RSP_UPLOADED, seq, 12);
}

HANDLER do_stats(link_state *l, uint8_t seq) {
    colibri_stats s = COLIBRI_STATS_INIT;
    colibri_get_stats(l->ctx, &s);
    uint8_t *p = payload(l);
    const uint64_t fields[] = { s.tokens_fed, s.arena_bytes, s.cycles_total, s.cycles_attention, s.cycles_router,
                                s.cycles_experts, s.cycles_lm_head, s.cycles_sampling, s.expert_calls,
                                l->io->cycle_hz, s.expert_hits, s.expert_misses, s.expert_bytes_fetched,
                                s.prefetch_issued, s.prefetch_used, s.cycles_fetch_wait };
    for (unsigned i = 0; i < sizeof fields / sizeof fields[0]; i++) put64(p + 8 * i, fields[i]);
    send(l, RSP_STATS, seq, sizeof fields);
}

/* The link's one state: frame buffers and the open context (20 KiB: static, not on a small board's stack). */
static link_state l;

/* The request link_serve has received (in l.rx): its type, seq and payload length. */
static uint8_t req_type, req_seq;
static uint32_t req_len;

/* A board's own request (BOARD_REQ_FIRST..BOARD_REQ_LAST, answered with type | 0x80): the board's hook builds the
 * answer's payload in place, or says which error to send. */
HANDLER do_board_request(link_state *s, uint8_t type, uint8_t seq, uint32_t len) {
    uint32_t n = 0;
    uint64_t detail = 0;
    uint32_t code = s->io->request(type, s->rx, len, payload(s), &n, &detail);
    if (code || n > MAX_PAYLOAD) {
        send_error(s, seq, code ? code : LINK_BAD_PAYLOAD, detail);
        return;
    }
    send(s, (uint8_t)(type | 0x80u), seq, n);
}

void link_execute(void) {
    const uint8_t type = req_type, seq = req_seq;
    const uint32_t len = req_len;
    const int needs_ctx = type == REQ_START || type == REQ_FEED || type == REQ_STEP || type == REQ_LOGITS ||
                          type == REQ_STATS || type == REQ_TRACE;
    if (needs_ctx && !l.ctx) {
        send_error(&l, seq, LINK_NOT_OPEN, 0);
        return;
    }
    if (l.io->busy && l.io->busy(type)) {
        send_error(&l, seq, LINK_BUSY, type);
        return;
    }
    switch (type) {
    case REQ_INFO: do_info(&l, seq); break;
    case REQ_OPEN: do_open(&l, seq, len); break;
    case REQ_START: do_start(&l, seq, len); break;
    case REQ_FEED: do_feed(&l, seq, len); break;
    case REQ_STEP: do_step(&l, seq); break;
    case REQ_LOGITS: do_logits(&l, seq, len); break;
    case REQ_TRACE: do_trace(&l, seq, len); break;
    case REQ_STATS: do_stats(&l, seq); break;
    case REQ_UPLOAD_BEGIN: do_upload_begin(&l, seq, len); break;
    case REQ_UPLOAD_CHUNK: do_upload_chunk(&l, seq, len); break;
    case REQ_UPLOAD_END: do_upload_end(&l, seq); break;
    default:
        if (type >= BOARD_REQ_FIRST && type <= BOARD_REQ_LAST && l.io->request) do_board_request(&l, type, seq, len);
        else send_error(&l, seq, LINK_UNKNOWN_TYPE, type);
        break;
    }
}

void link_context(const uint8_t **image, size_t *image_size, uint64_t *arena_used) {
    *image = l.image;
    *image_size = l.image_size;
    if (!arena_used) return;
    colibri_stats s = COLIBRI_STATS_INIT;
    *arena_used = l.ctx && colibri_get_stats(l.ctx, &s) == COLIBRI_OK ? s.arena_bytes : 0;
}

/* Wait for the next request that is not a retransmission (answering those, and corrupt frames, itself): 1 with it in
 * req_type, req_seq, req_len and l.rx; 0 after answering QUIT (its code in *code); -1 at the end of the stream. */
static int next_request(int *code) {
    for (;;) {
        uint8_t type, seq;
        uint32_t crc;
        int len = recv_frame(&l, &type, &seq, &crc);
        if (len == -1) return -1;
        if (len < 0) continue;
        if (l.have_last && seq == l.last_seq && crc == l.last_crc) { /* a retransmission: answer again */
            l.io->write(l.tx, frame_bytes(l.tx));
            continue;
        }
        l.have_last = 1;
        l.last_seq = seq;
        l.last_crc = crc;
        if (type == REQ_QUIT) {
            *code = len >= 4 ? (int)get32(l.rx) : 0;
            send(&l, RSP_BYE, seq, 0);
            return 0;
        }
        req_type = type;
        req_seq = seq;
        req_len = (uint32_t)len;
        return 1;
    }
}

static void link_start(const board_io *io) {
    l.io = io;
    l.image = io->image;
    l.image_size = io->image_size;
    l.upload_total = 0;
    l.ctx = 0;
    l.have_last = 0;
    l.trace_len = 0;
}

int link_serve(const board_io *io) {
    link_start(io);
    int code = 0, r;
    while ((r = next_request(&code)) > 0) link_execute();
    return r < 0 ? 0 : code;
}

int link_serve_elsewhere(const board_io *io) {
    link_start(io);
    int code = 0, r;
    while ((r = next_request(&code)) > 0) io->execute();
    return r < 0 ? 0 : code;
}
