/*
 * colibri.h — the whole public API of the Colibri runtime.
 *
 * Colibri runs a Mixture-of-Experts transformer from an image (see docs/FORMAT.md) with no
 * allocation and no threads: the caller provides the image bytes (read in place, never copied)
 * and one work arena; after colibri_open() nothing is allocated.
 *
 *   colibri_image_info info;
 *   colibri_image_verify(image, image_size, &info);          // arena bytes needed: info.arena_bytes
 *   colibri_ctx *ctx;
 *   colibri_open(image, image_size, arena, arena_size, NULL, &ctx, NULL);  // or &opts: see colibri_options
 *   colibri_feed(ctx, prompt, n_prompt);                     // prefill: logits of the last token
 *   colibri_sampler s;
 *   colibri_sampler_init(&s, 0.0f, 0, 1.0f, 42);            // greedy
 *   uint32_t tok;
 *   colibri_step(ctx, &s, &tok);                             // sample, then feed the sample
 *
 * tests/api_example.c is this sequence as a complete program (built and run by the tests).
 *
 * Every call returns a colibri_status; colibri_strerror() names it. A call that fails leaves
 * the context as it was, so it stays usable.
 *
 * libcolibri.a (and the hosted libcolibri.so) define no global symbol but the colibri_* ones declared
 * here: the runtime's internal names cannot collide with the application's.
 *
 * A library and a header from different versions: colibri_api_version() is the COLIBRI_API_VERSION the library
 * was built with, which covers every declaration here; an application that may meet another library checks it
 * once (`colibri_api_version() == COLIBRI_API_VERSION`). The two structs most likely to grow, colibri_options and
 * colibri_stats, also carry their size, which the library checks before reading or writing them
 * (COLIBRI_E_API_MISMATCH: the size unset, or another colibri.h); colibri_image_info, colibri_sampler and
 * colibri_layer_trace do not, so only the version check covers them.
 */
#ifndef COLIBRI_H
#define COLIBRI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    /* schema:status (written by python -m colibri.schema from format/schema.toml) */
    COLIBRI_OK = 0,
    COLIBRI_E_NULL = 1,                /* a required pointer argument is NULL */
    COLIBRI_E_BAD_ARG = 2,             /* an argument is out of its documented range */
    COLIBRI_E_ARENA_TOO_SMALL = 3,     /* arena smaller than the image's plan; *arena_needed says how much */
    COLIBRI_E_ARENA_ALIGN = 4,         /* arena not aligned to COLIBRI_ARENA_ALIGN */
    COLIBRI_E_IMAGE_TRUNCATED = 5,     /* fewer bytes than the header, or than the header's image size */
    COLIBRI_E_IMAGE_MAGIC = 6,         /* not a Colibri image */
    COLIBRI_E_IMAGE_VERSION = 7,       /* a format version this runtime does not read */
    COLIBRI_E_IMAGE_HEADER_CRC = 8,    /* header bytes do not match their CRC32 */
    COLIBRI_E_IMAGE_PAYLOAD_CRC = 9,   /* table or tensor bytes do not match their CRC32 */
    COLIBRI_E_IMAGE_HEADER = 10,       /* inconsistent header fields (sizes, offsets, reserved bytes) */
    COLIBRI_E_IMAGE_DIMS = 11,         /* model dimensions zero, inconsistent or too large */
    COLIBRI_E_IMAGE_TABLE = 12,        /* tensor table out of order, wrong count, bad role or shape */
    COLIBRI_E_IMAGE_BOUNDS = 13,       /* a tensor's bytes are misaligned or outside the image */
    COLIBRI_E_IMAGE_DTYPE = 14,        /* a tensor dtype this build does not implement */
    COLIBRI_E_IMAGE_PLAN = 15,         /* the image's arena plan disagrees with the runtime's */
    COLIBRI_E_UNSUPPORTED = 16,        /* architecture, layer kind or mechanism this runtime (or its lean build)
                                          lacks */
    COLIBRI_E_TOKEN_RANGE = 17,        /* a token id >= vocab size */
    COLIBRI_E_SEQ_FULL = 18,           /* the sequence would exceed the image's max_seq */
    COLIBRI_E_NO_LOGITS = 19,          /* step/logits before any token was fed */
    COLIBRI_E_NONFINITE = 20,          /* a NaN or infinity reached the router or the logits; the tokens fed
                                          before it stay fed, the logits are gone: colibri_reset() to go on */
    COLIBRI_E_CACHE_TOO_SMALL = 21,    /* expert cache below one layer's top-k (info.expert_cache_min slots) */
    COLIBRI_E_FETCH = 22,              /* the board's fetch hook failed; like E_NONFINITE, reset to go on */
    COLIBRI_E_EXPERT_CRC = 23,         /* an expert block does not match its CRC32 (when fetched, or at verify) */
    COLIBRI_E_ARENA_OVERLAP = 24,      /* the arena overlaps the image */
    COLIBRI_E_API_MISMATCH = 25,       /* a colibri_options or colibri_stats whose size field is not this
                                          library's sizeof: unset (COLIBRI_OPTIONS_INIT, COLIBRI_STATS_INIT set
                                          it), or from another colibri.h */
    /* /schema:status */
    COLIBRI_STATUS_COUNT
} colibri_status;

/* The arena must be aligned to this many bytes. */
#define COLIBRI_ARENA_ALIGN 64u

/* Model facts read from a verified image header. */
typedef struct {
    uint32_t format_version;
    uint64_t image_bytes;
    uint64_t arena_bytes;      /* exact work-arena size colibri_open() needs */
    uint32_t payload_crc32;
    uint32_t vocab_size, hidden_size, ffn_size, n_layers;
    uint32_t n_heads, n_kv_heads, head_dim;
    uint32_t n_experts, top_k, max_seq;
    /* Two tiers (docs/FORMAT.md): bytes [0, resident_bytes) are read in place; routed experts past it
     * form the expert part, which an expert cache reaches only through the fetch hook. */
    uint64_t resident_bytes;
    uint64_t expert_block_bytes; /* the largest routed expert (gate, up, down, scales): one cache slot */
    uint32_t expert_cache_min;   /* the fewest cache slots colibri_open() accepts (top_k; 0 without experts) */
    uint32_t streamed_experts;   /* routed experts in the expert part (the most slots worth having) */
    uint64_t prefill_token_bytes; /* arena bytes per token of a prefill batch (colibri_prefill_bytes) */
} colibri_image_info;

/* What one layer did for one token, passed to the trace hook. Pointers are valid only during the
 * call. In a dense layer n_routed is 0 and cycles_ffn is the MLP's. The CRCs (colibri_crc32 from 0) are of
 * the token's residual stream, its `hidden` floats as stored (little-endian on every board), after the
 * attention half and after the whole layer: a host that computes the same bits can name the first layer and
 * half where a run parts from it (flash.py --verify). In a prefill batch only the last token carries
 * crc_attention (the others 0), as it carries the cycles; the lean build (COLIBRI_LEAN) takes neither (0). */
typedef struct {
    uint32_t pos, layer, n_routed;
    const uint32_t *experts;        /* the routed experts, best first */
    const float *weights;           /* their gate weights, as applied */
    const uint64_t *cycles_expert;  /* cycles in each routed expert's FFN */
    uint64_t cycles_attention, cycles_router, cycles_ffn;
    uint32_t crc_attention, crc_output;
} colibri_layer_trace;

/* expert_policy bits */
#define COLIBRI_PREFETCH 1u /* guess the next layer's experts (its router on this layer's input) and fetch them early */

/* Optional platform hooks and the expert cache; pass NULL to colibri_open() for none. Set `size` (COLIBRI_OPTIONS_INIT
 * does): colibri_open() refuses options of another size with COLIBRI_E_API_MISMATCH. */
typedef struct {
    uint32_t size;             /* sizeof(colibri_options) */
    /* A monotonic cycle (or tick) counter, used only for the per-phase stats and the trace. */
    uint64_t (*cycles)(void *user);
    /* Called after every layer of every token, if set (flash.py --trace; colibri_set_trace() changes it). In a
     * prefill batch the calls come layer by layer for all its tokens, and the last token carries the layer's
     * cycles for all of them. */
    void (*trace)(void *user, const colibri_layer_trace *t);
    void *user;
    /* Expert streaming (docs/STREAMING.md). expert_cache = 0: every weight is read in place, so the
     * whole image must be in [image, image + image_size). expert_cache = N >= info.expert_cache_min:
     * only the resident part must be there; routed experts of the expert part are copied into N slots
     * of info.expert_block_bytes after the arena's plan (colibri_expert_cache_bytes()), each checked
     * against its CRC when it arrives (from the image's CRC table as open copied it into the arena). A CRC
     * catches faults, not an attacker who can rewrite the slow memory (docs/SECURITY.md). The runtime then reads the expert part only through `fetch`. */
    uint32_t expert_cache;
    uint32_t expert_policy;    /* COLIBRI_PREFETCH, or 0 */
    /* Copy `bytes` at image offset `offset` to `dst`; 0 on success. Required with an expert cache. */
    int (*fetch)(void *user, uint64_t offset, size_t bytes, void *dst);
    /* Optional asynchronous form (e.g. a DMA channel): start the copy into dst, and wait until the copy
     * into dst has finished. The runtime waits for every started copy before a feed returns. */
    int (*fetch_start)(void *user, uint64_t offset, size_t bytes, void *dst);
    int (*fetch_wait)(void *user, void *dst);
    /* Threads. The runtime never creates one; a board with cores to spare lends them through this hook:
     * call fn(arg, part) once for every part in [0, parts), in any order, on any of its threads (the
     * caller's included), and return when all have returned. parallel_parts is the most parts the runtime
     * may ask for at once (0 or 1: it never calls the hook). The runtime splits a matrix's rows into
     * fixed parts and every row is computed by the same code whichever thread runs it, so results are
     * the same bits with or without threads, for any parallel_parts. */
    void (*parallel_for)(void *user, void (*fn)(void *arg, uint32_t part), void *arg, uint32_t parts);
    uint32_t parallel_parts;   /* at most COLIBRI_MAX_PARTS */
    /* Prefill batch: colibri_feed() computes up to this many tokens in one pass, each weight row read
     * once for all of them (0 or 1: one token a pass). It is a speed-up, not a requirement: open takes the
     * largest batch up to this whose colibri_prefill_bytes() fit in the arena after the plan (none when
     * two do not; stats.prefill_batch says what it took), and no longer than the sliding window when
     * KV-sharing layers read a windowed cache (Gemma 4). The same bits as one token a pass. Not with an
     * expert cache (a fetch serves one token's experts), which feeds one token a pass. */
    uint32_t prefill_batch;    /* at most COLIBRI_MAX_BATCH */
    /* Routed experts per token: 0 for the image's top_k, or 1..top_k (COLIBRI_E_BAD_ARG otherwise; 0 without
     * experts), as llama.cpp's expert_used_count: the router picks this many where the image says top_k, and
     * everything after the pick follows the family as before, over those picked (docs/MODELS.md, "Fewer experts
     * at run time"). Fewer experts need no more arena: the plan stays the image's. */
    uint32_t experts;
} colibri_options;

/* Options with nothing set but their size: `colibri_options opts = COLIBRI_OPTIONS_INIT;`, or with more set
 * `colibri_options opts = { .size = sizeof(colibri_options), .prefill_batch = 16 };` */
#ifdef __cplusplus /* designated initializers are C++20's */
#define COLIBRI_OPTIONS_INIT { sizeof(colibri_options) }
#else
#define COLIBRI_OPTIONS_INIT { .size = sizeof(colibri_options) }
#endif

/* The most parts a parallel_for call is asked to run, and the largest prefill batch. */
#define COLIBRI_MAX_PARTS 64u
#define COLIBRI_MAX_BATCH 1024u

/* Counters since the last colibri_open()/colibri_reset(); cycles are 0 without a cycles hook. Set `size` before
 * colibri_get_stats() (COLIBRI_STATS_INIT does): it refuses another size with COLIBRI_E_API_MISMATCH. */
typedef struct {
    uint32_t size;             /* sizeof(colibri_stats) */
    uint32_t tokens_fed;       /* positions in the KV cache */
    uint32_t prefill_batch;    /* tokens a pass computes together, as open chose it (0: one a pass) */
    uint64_t arena_bytes;      /* the arena used: the plan, plus the expert cache or the prefill batch */
    uint64_t cycles_total;     /* inside colibri_feed/colibri_step */
    uint64_t cycles_attention; /* norms, q/k/v/o projections, RoPE, attention */
    uint64_t cycles_router;    /* router matvec, softmax, top-k */
    uint64_t cycles_experts;   /* FFNs: routed and shared experts, or the dense MLP */
    uint64_t cycles_lm_head;   /* final norm + lm_head */
    uint64_t cycles_sampling;
    uint64_t expert_calls;     /* expert FFN evaluations */
    /* Expert cache (all 0 without one). A hit is a routed expert found in the cache (prefetched ones
     * included) or in the resident part; a miss is one fetched when it was needed. */
    uint64_t expert_hits, expert_misses;
    uint64_t expert_bytes_fetched;   /* all fetches, wrong prefetch guesses included */
    uint64_t prefetch_issued;        /* experts fetched ahead on a guess */
    uint64_t prefetch_used;          /* of those, the ones the router then chose */
    uint64_t cycles_fetch_wait;      /* in fetch and fetch_wait calls */
} colibri_stats;
#ifdef __cplusplus
#define COLIBRI_STATS_INIT { sizeof(colibri_stats) }
#else
#define COLIBRI_STATS_INIT { .size = sizeof(colibri_stats) }
#endif

/* Sampler state. Use colibri_sampler_init(); fields are public so a board can log them. */
typedef struct {
    float temperature;  /* <= 0: greedy (argmax, lowest id on ties) */
    uint32_t top_k;     /* 0: no top-k cut; tokens tied with the k-th logit stay in (as in transformers) */
    float top_p;        /* >= 1: no nucleus cut */
    uint64_t rng;       /* xorshift64* state, never 0 */
} colibri_sampler;

typedef struct colibri_ctx colibri_ctx;

/* The API's version: it changes whenever a declaration in this header does (a struct's layout, a function's
 * arguments, a status). colibri_api_version() returns the value the library was built with. */
#define COLIBRI_API_VERSION 2u
uint32_t colibri_api_version(void);

/* Check an image completely (header, CRCs, table, every offset and size) without touching an
 * arena. The image must start at a 64-byte aligned address (COLIBRI_E_BAD_ARG otherwise): its
 * weights are read in place as floats. `info` may be NULL. Safe on any bytes: never reads
 * outside [image, image + size). */
colibri_status colibri_image_verify(const void *image, size_t size, colibri_image_info *info);

/* Every check colibri_image_verify() makes except the CRCs over tensor and metadata bytes (the header's
 * own CRC is checked), and the same facts in `info`. It reads the header and the tensor table only, so it
 * takes microseconds on any image: enough to size an arena before colibri_open(), which always verifies
 * everything. A COLIBRI_OK here says nothing about the weights' bytes. */
colibri_status colibri_image_inspect(const void *image, size_t size, colibri_image_info *info);

/* The arena bytes an expert cache of `slots` slots adds to info.arena_bytes (0 for 0 slots). */
uint64_t colibri_expert_cache_bytes(const colibri_image_info *info, uint32_t slots);

/* The arena bytes a prefill batch of `tokens` adds (0 for 0 or 1: one token a pass needs none). */
uint64_t colibri_prefill_bytes(const colibri_image_info *info, uint32_t tokens);

/* Verify `image` and lay out the context in `arena` (aligned to COLIBRI_ARENA_ALIGN, at least
 * info.arena_bytes long, plus colibri_expert_cache_bytes() with an expert cache; room beyond that goes to
 * a prefill batch, if asked for). The image must
 * stay valid and unchanged while the context is used. With an expert cache only the resident part
 * is verified here; each expert block is checked when fetched.
 * Every tensor's place is decoded and bounds-checked here, once, into the arena: later calls never
 * read the image's table again, so the arena must not overlap the image (COLIBRI_E_ARENA_OVERLAP).
 * On COLIBRI_E_ARENA_TOO_SMALL, *arena_needed (if not NULL) holds the bytes required; on
 * COLIBRI_E_CACHE_TOO_SMALL, the bytes the smallest cache would need.
 * `opts` may be NULL; it is read during the call only, and must not lie in the arena. On success *ctx points into
 * the arena. */
colibri_status colibri_open(const void *image, size_t image_size, void *arena, size_t arena_size,
                            const colibri_options *opts, colibri_ctx **ctx, uint64_t *arena_needed);

/* Forget the sequence (KV cache position and logits) and zero the stats. */
colibri_status colibri_reset(colibri_ctx *ctx);

/* Set the trace hook (NULL: none) from the next feed on, with the user pointer colibri_open() took: a board
 * that traces only some runs installs it for those, and only they pay for the hook and its CRCs. */
colibri_status colibri_set_trace(colibri_ctx *ctx, void (*trace)(void *user, const colibri_layer_trace *t));

/* Feed n tokens at the next positions (prefill). Afterwards colibri_logits() holds the logits
 * after the last one (only the last token runs the lm_head: feeding n at once is cheaper than n
 * feeds of one, and gives the same bits). All ids are checked and capacity is checked before
 * anything changes. */
colibri_status colibri_feed(colibri_ctx *ctx, const uint32_t *tokens, size_t n);

/* Decode one token: sample from the current logits with `s`, feed the sample, return it in *token. If the
 * feed fails, *s is restored: the sampler's state advances only with a step that succeeds. */
colibri_status colibri_step(colibri_ctx *ctx, colibri_sampler *s, uint32_t *token);

/* Sample from the current logits without feeding (e.g. for the last token of a generation). */
colibri_status colibri_sample(colibri_ctx *ctx, colibri_sampler *s, uint32_t *token);

/* The logits after the last fed token: *logits points at vocab_size floats inside the arena,
 * valid until the next feed/step/reset. */
colibri_status colibri_logits(const colibri_ctx *ctx, const float **logits, uint32_t *vocab_size);

/* The counters into *stats, whose size the caller sets first: `colibri_stats s = COLIBRI_STATS_INIT;`
 * (COLIBRI_E_API_MISMATCH otherwise, and *stats is not written). */
colibri_status colibri_get_stats(const colibri_ctx *ctx, colibri_stats *stats);

/* The facts of the open image, as colibri_image_verify() reported them (without verifying again). */
colibri_status colibri_get_info(const colibri_ctx *ctx, colibri_image_info *info);

/* The name of the kernel set the context computes with: "scalar", "avx2" (chosen by CPUID at open),
 * "mve", "dsp" or "rvv" (chosen at build time). Every set gives the same bits (docs/KERNELS.md);
 * the name says only how fast. *name is a constant string. */
colibri_status colibri_get_kernels(const colibri_ctx *ctx, const char **name);

/* temperature <= 0 means greedy; top_k 0 and top_p >= 1 disable those cuts; the same seed gives
 * the same tokens on every board. */
colibri_status colibri_sampler_init(colibri_sampler *s, float temperature, uint32_t top_k, float top_p,
                                    uint64_t seed);

/* A short constant name for a status, e.g. "arena too small". Never NULL. */
const char *colibri_strerror(colibri_status status);

/* CRC-32 (IEEE 802.3, as zlib) of n bytes, continuing from `crc` (start with 0). Boards use it
 * for the serial protocol, so there is one implementation. */
uint32_t colibri_crc32(uint32_t crc, const void *data, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* COLIBRI_H */
