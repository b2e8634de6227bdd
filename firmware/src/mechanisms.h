/* The mechanisms this build computes: the one place that knows what the lean build leaves out.
 *
 * Every build has the standard ones: attention with grouped KV heads, sliding windows, q/k norms, biases and
 * clipping; a softmax router, shared experts, dense layers; the float and Q8_0/Q4_0 weight dtypes and every KV
 * dtype. `scons lean=yes` defines COLIBRI_LEAN 1 (the Cortex-M4's 16 KiB runtime: tools/size_gate.json) and leaves
 * out those below. Each is
 * tested with a plain `if (WITH_X && ...)`, never #if: both builds compile every line, and the lean one's
 * compiler drops what it cannot reach. The verifier refuses an image that needs one of those that change results
 * (COLIBRI_E_UNSUPPORTED): BUILD_OPTIONS and the lean marks of the layer record's values (format/schema.toml),
 * and the header fields only they use; the rest (window rings, threaded heads, trace CRCs, the top-p stop) change speed or what is reported only.
 * They are one switch, COLIBRI_LEAN, named apart so that each use says which mechanism it serves: BUILD_OPTIONS and
 * the verifier's checks follow COLIBRI_LEAN, so one of them alone cannot be turned off (asserted below). */
#ifndef COLIBRI_MECHANISMS_H
#define COLIBRI_MECHANISMS_H

#ifndef COLIBRI_LEAN
#define COLIBRI_LEAN 0
#endif

#define WITH_MLA (!COLIBRI_LEAN)              /* DeepSeek's multi-head latent attention (blocks/mla.c) */
#define WITH_ROUTERS (!COLIBRI_LEAN)          /* routers beyond a softmax: sigmoid scores, a choice bias, groups,
                                               * routed_scale, gpt-oss's softmax over the top-k (blocks/router.c) */
#define WITH_ROPE_PAIRS (!COLIBRI_LEAN)       /* RoPE on adjacent pairs (DeepSeek's layout) */
#define WITH_EXPERT_EXTRAS (!COLIBRI_LEAN)    /* gpt-oss's expert biases and clamped SwiGLU */
#define WITH_SINKS (!COLIBRI_LEAN)            /* gpt-oss's attention sinks */
#define WITH_GEMMA4 (!COLIBRI_LEAN)           /* Gemma 4's layer: its extra norms, the dense MLP beside the experts,
                                               * GeGLU, v norms, keys as values, global layers with their own
                                               * widths and RoPE, KV sharing, the embedding scale and logit cap */
#define WITH_PER_LAYER_INPUTS (!COLIBRI_LEAN) /* Gemma 4's per-layer inputs (blocks/ple.c) */
#define WITH_SHORT_CONV (!COLIBRI_LEAN)       /* LFM2's gated short convolutions (blocks/conv.c) */
#define WITH_DELTA_NET (!COLIBRI_LEAN)        /* Qwen3.5's Gated DeltaNet (blocks/deltanet.c) and its gated attention */
#define WITH_WINDOW_RINGS (!COLIBRI_LEAN)     /* a prefill batch over window rings (blocks/rings.c); without it a
                                               * windowed model is fed one token a pass */
#define WITH_THREADED_HEADS (!COLIBRI_LEAN)   /* a token's attention heads split across the board's threads */
#define WITH_KERNEL_ACCUMULATE (!COLIBRI_LEAN) /* attention's value sum through the kernel set (kernel_set's entries,
                                               * left out by #if); the lean build's sets would all take the scalar
                                               * one, so it calls that directly */
#define WITH_KERNEL_SCORES (!COLIBRI_LEAN)    /* attention's scores (q . K rows) through the kernel set (entries left out
                                               * by #if); the lean build keeps a dot per cached row */
#define WITH_TRACE_CRC (!COLIBRI_LEAN)        /* the trace's residual-stream CRCs */
#define WITH_TOP_P_STOP (!COLIBRI_LEAN)       /* top-p sampling's early stop (sampler.c) */
#define WITH_BLOCK_DTYPES (!COLIBRI_LEAN)     /* the dtypes with GGUF's blocks, Q4_1 ... Q6_K (kernels_block.c: a file of
                                               * extern functions every kernel set points at, so left out by #if);
                                               * they follow Q4_0 (asserted in table.c) */

/* The layer options this build computes, and of a record field's `count` values those it computes as a mask of
 * 1 << value, given the lean build's (format.h, from format/schema.toml) */
#define BUILD_OPTIONS (COLIBRI_LEAN ? LAYER_LEAN_OPTIONS : LAYER_KNOWN_OPTIONS)
#define BUILD_VALUES(count, lean) (COLIBRI_LEAN ? (lean) : (1u << (count)) - 1u)

_Static_assert(WITH_MLA == !COLIBRI_LEAN && WITH_ROUTERS == !COLIBRI_LEAN && WITH_ROPE_PAIRS == !COLIBRI_LEAN &&
                   WITH_EXPERT_EXTRAS == !COLIBRI_LEAN && WITH_SINKS == !COLIBRI_LEAN && WITH_GEMMA4 == !COLIBRI_LEAN &&
                   WITH_PER_LAYER_INPUTS == !COLIBRI_LEAN && WITH_SHORT_CONV == !COLIBRI_LEAN &&
                   WITH_DELTA_NET == !COLIBRI_LEAN &&
                   WITH_WINDOW_RINGS == !COLIBRI_LEAN &&
                   WITH_THREADED_HEADS == !COLIBRI_LEAN && WITH_KERNEL_ACCUMULATE == !COLIBRI_LEAN &&
                   WITH_KERNEL_SCORES == !COLIBRI_LEAN &&
                   WITH_TRACE_CRC == !COLIBRI_LEAN &&
                   WITH_TOP_P_STOP == !COLIBRI_LEAN && WITH_BLOCK_DTYPES == !COLIBRI_LEAN,
               "the mechanisms are one switch (COLIBRI_LEAN): BUILD_OPTIONS and the verifier follow it");

#endif
