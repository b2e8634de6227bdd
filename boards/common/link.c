/* Device side of the framed serial protocol. Frame:
 *   0xA5 0x5A | type u8 | seq u8 | len u16 | payload[len] | crc32(type..payload) u32, little-endian.
 * Every request gets at least one response frame with the request's seq; a frame that fails its
 * length or CRC check is answered with an ERROR frame and never acted on. */
#include "link.h"

#include "colibri.h"

#define SYNC0 0xA5u
#define SYNC1 0x5Au
#define MAX_PAYLOAD 4096u
#define PROTOCOL_VERSION 1u

enum {
    REQ_INFO = 0x01, REQ_OPEN = 0x02, REQ_RUN = 0x03, REQ_STATS = 0x04, REQ_QUIT = 0x05,
    REQ_UPLOAD_BEGIN = 0x06, REQ_UPLOAD_CHUNK = 0x07, REQ_UPLOAD_END = 0x08,
    RSP_INFO = 0x81, RSP_OPENED = 0x82, RSP_TOKEN = 0x83, RSP_LOGITS = 0x84, RSP_DONE = 0x85,
    RSP_STATS = 0x86, RSP_BYE = 0x87, RSP_UPLOAD_ACK = 0x88, RSP_UPLOADED = 0x89, RSP_ERROR = 0xEE,
};
/* Link-level error codes, above the runtime's colibri_status values. */
enum {
    LINK_BAD_CRC = 200, LINK_BAD_LENGTH = 201, LINK_UNKNOWN_TYPE = 202, LINK_BAD_PAYLOAD = 203, LINK_NOT_OPEN = 204,
    LINK_NO_IMAGE = 205, LINK_UPLOAD_TOO_BIG = 206, LINK_UPLOAD_ORDER = 207, LINK_UPLOAD_CRC = 208,
};
#define RUN_FLAG_LOGITS 1u
#define RUN_FIXED_BYTES 36u
#define LOGITS_PER_FRAME ((MAX_PAYLOAD - 12u) / 4u)

typedef struct {
    const board_io *io;
    const uint8_t *image; /* the image OPEN uses: the preloaded one, or the last complete upload */
    size_t image_size;
    uint64_t upload_total, upload_received;
    uint32_t upload_crc;
    colibri_ctx *ctx;
    uint8_t rx[MAX_PAYLOAD];
    uint8_t tx[6 + MAX_PAYLOAD + 4];
} link_state;

static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { put32(p, (uint32_t)v); put32(p + 4, (uint32_t)(v >> 32)); }
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) { return get32(p) | (uint64_t)get32(p + 4) << 32; }
static float getf(const uint8_t *p) { union { uint32_t u; float f; } v = { get32(p) }; return v.f; }
static void putf(uint8_t *p, float f) { union { float f; uint32_t u; } v = { f }; put32(p, v.u); }

/* The payload of the next frame is built in place at tx + 6. */
static uint8_t *payload(link_state *l) { return l->tx + 6; }

static void send(link_state *l, uint8_t type, uint8_t seq, uint32_t len) {
    uint8_t *f = l->tx;
    f[0] = SYNC0; f[1] = SYNC1; f[2] = type; f[3] = seq; f[4] = (uint8_t)len; f[5] = (uint8_t)(len >> 8);
    put32(f + 6 + len, colibri_crc32(0, f + 2, 4 + len));
    l->io->write(f, 6 + len + 4);
}

static void send_error(link_state *l, uint8_t seq, uint32_t code, uint64_t detail) {
    const char *msg = code < COLIBRI_STATUS_COUNT ? colibri_strerror((colibri_status)code) : "link error";
    uint8_t *p = payload(l);
    uint32_t n = 12;
    put32(p, code);
    put64(p + 4, detail);
    while (*msg && n < 12 + 96) p[n++] = (uint8_t)*msg++;
    send(l, RSP_ERROR, seq, n);
}

/* Read one frame into l->rx. Returns its length, -1 at end of stream, or -2 after answering a
 * corrupt frame with an ERROR. */
static int recv_frame(link_state *l, uint8_t *type, uint8_t *seq) {
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
        send_error(l, *seq, LINK_BAD_LENGTH, len);
        return -2;
    }
    for (uint32_t i = 0; i < len + 4; i++) {
        if ((b = io->read_byte()) < 0) return -1;
        if (i < len) l->rx[i] = (uint8_t)b;
        else hdr[i - len] = (uint8_t)b; /* the CRC, reusing hdr */
    }
    uint32_t crc = colibri_crc32(colibri_crc32(0, (const uint8_t[]){ *type, *seq, (uint8_t)len, (uint8_t)(len >> 8) }, 4),
                                 l->rx, len);
    if (crc != get32(hdr)) {
        send_error(l, *seq, LINK_BAD_CRC, 0);
        return -2;
    }
    return (int)len;
}

static void do_info(link_state *l, uint8_t seq) {
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

static void do_open(link_state *l, uint8_t seq) {
    const board_io *io = l->io;
    colibri_options opts = { io->cycles, 0 };
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
    colibri_image_verify(l->image, l->image_size, &info);
    uint8_t *p = payload(l);
    put64(p, info.image_bytes);
    put64(p + 8, info.arena_bytes);
    put32(p + 16, info.payload_crc32);
    put32(p + 20, info.vocab_size);
    put32(p + 24, info.max_seq);
    put32(p + 28, 0);
    send(l, RSP_OPENED, seq, 32);
}

static void send_logits(link_state *l, uint8_t seq, uint32_t row) {
    const float *logits;
    uint32_t vocab;
    colibri_logits(l->ctx, &logits, &vocab);
    for (uint32_t first = 0; first < vocab; first += LOGITS_PER_FRAME) {
        uint32_t count = vocab - first < LOGITS_PER_FRAME ? vocab - first : LOGITS_PER_FRAME;
        uint8_t *p = payload(l);
        put32(p, row);
        put32(p + 4, first);
        put32(p + 8, count);
        for (uint32_t i = 0; i < count; i++) putf(p + 12 + 4 * i, logits[first + i]);
        send(l, RSP_LOGITS, seq, 12 + 4 * count);
    }
}

static uint64_t cycles_now(const board_io *io) { return io->cycles ? io->cycles(0) : 0; }

static void do_run(link_state *l, uint8_t seq, uint32_t len) {
    const uint8_t *r = l->rx;
    if (len < RUN_FIXED_BYTES) { send_error(l, seq, LINK_BAD_PAYLOAD, len); return; }
    uint32_t flags = get32(r), max_new = get32(r + 4), n_prompt = get32(r + 32);
    if (n_prompt == 0 || n_prompt != (len - RUN_FIXED_BYTES) / 4 || (len - RUN_FIXED_BYTES) % 4) {
        send_error(l, seq, LINK_BAD_PAYLOAD, len);
        return;
    }
    colibri_sampler s;
    colibri_status st = colibri_sampler_init(&s, getf(r + 8), get32(r + 12), getf(r + 16), get64(r + 24));
    if (st) { send_error(l, seq, st, 0); return; }
    colibri_reset(l->ctx);
    const int logits = flags & RUN_FLAG_LOGITS;
    uint32_t row = 0;
    for (uint32_t i = 0; i < n_prompt; i++) { /* tokens are decoded from rx one at a time: no copy */
        uint32_t tok = get32(r + RUN_FIXED_BYTES + 4 * i);
        if ((st = colibri_feed(l->ctx, &tok, 1))) { send_error(l, seq, st, i); return; }
        if (logits) send_logits(l, seq, row++);
    }
    uint32_t n = 0;
    for (; n < max_new; n++) {
        uint32_t tok;
        uint64_t t0 = cycles_now(l->io);
        if ((st = colibri_step(l->ctx, &s, &tok))) { send_error(l, seq, st, n); return; }
        uint8_t *p = payload(l);
        put32(p, n);
        put32(p + 4, tok);
        put64(p + 8, cycles_now(l->io) - t0);
        send(l, RSP_TOKEN, seq, 16);
        if (logits) send_logits(l, seq, row++);
    }
    uint8_t *p = payload(l);
    put32(p, n);
    put32(p + 4, 0);
    send(l, RSP_DONE, seq, 8);
}

/* Upload: BEGIN(total, crc32) -> chunks in order -> END checks the CRC of everything received.
 * A chunk at an offset already received is acknowledged again without writing, so a host may
 * resend a chunk whose ACK it lost. Any upload invalidates the open context and the old image. */
static void send_upload_ack(link_state *l, uint8_t seq) {
    put64(payload(l), l->upload_received);
    send(l, RSP_UPLOAD_ACK, seq, 8);
}

static void do_upload_begin(link_state *l, uint8_t seq, uint32_t len) {
    if (len != 12) { send_error(l, seq, LINK_BAD_PAYLOAD, len); return; }
    uint64_t total = get64(l->rx);
    if (!l->io->upload || total == 0 || total > l->io->upload_capacity) {
        send_error(l, seq, LINK_UPLOAD_TOO_BIG, l->io->upload ? l->io->upload_capacity : 0);
        return;
    }
    l->ctx = 0;
    l->image = 0;
    l->upload_total = total;
    l->upload_received = 0;
    l->upload_crc = get32(l->rx + 8);
    send_upload_ack(l, seq);
}

static void do_upload_chunk(link_state *l, uint8_t seq, uint32_t len) {
    if (len < 8 || !l->upload_total) { send_error(l, seq, LINK_BAD_PAYLOAD, len); return; }
    uint64_t offset = get64(l->rx), n = len - 8;
    if (offset <= l->upload_received && n <= l->upload_received - offset) { /* a resent chunk */
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

static void do_upload_end(link_state *l, uint8_t seq) {
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

static void do_stats(link_state *l, uint8_t seq) {
    colibri_stats s;
    colibri_get_stats(l->ctx, &s);
    uint8_t *p = payload(l);
    const uint64_t fields[] = { s.tokens_fed, s.arena_bytes, s.cycles_total, s.cycles_attention, s.cycles_router,
                                s.cycles_experts, s.cycles_lm_head, s.cycles_sampling, s.expert_calls,
                                l->io->cycle_hz };
    for (unsigned i = 0; i < sizeof fields / sizeof fields[0]; i++) put64(p + 8 * i, fields[i]);
    send(l, RSP_STATS, seq, sizeof fields);
}

int link_serve(const board_io *io) {
    static link_state l; /* 8 KiB of buffers: static, not on a small board's stack */
    l.io = io;
    l.image = io->image;
    l.image_size = io->image_size;
    l.upload_total = 0;
    l.ctx = 0;
    for (;;) {
        uint8_t type, seq;
        int len = recv_frame(&l, &type, &seq);
        if (len == -1) return 0;
        if (len < 0) continue;
        if ((type == REQ_RUN || type == REQ_STATS) && !l.ctx) {
            send_error(&l, seq, LINK_NOT_OPEN, 0);
            continue;
        }
        switch (type) {
        case REQ_INFO: do_info(&l, seq); break;
        case REQ_OPEN: do_open(&l, seq); break;
        case REQ_RUN: do_run(&l, seq, (uint32_t)len); break;
        case REQ_STATS: do_stats(&l, seq); break;
        case REQ_UPLOAD_BEGIN: do_upload_begin(&l, seq, (uint32_t)len); break;
        case REQ_UPLOAD_CHUNK: do_upload_chunk(&l, seq, (uint32_t)len); break;
        case REQ_UPLOAD_END: do_upload_end(&l, seq); break;
        case REQ_QUIT: {
            uint32_t code = len >= 4 ? get32(l.rx) : 0;
            send(&l, RSP_BYE, seq, 0);
            return (int)code;
        }
        default: send_error(&l, seq, LINK_UNKNOWN_TYPE, type); break;
        }
    }
}
