/* The image format (docs/FORMAT.md): sizes, flags, header and table-entry field offsets, tensor roles and
 * dtypes. The one definition: the runtime's verifier (image.c) and the fuzz harness's reseal
 * (tests/fuzz/fuzz_image.c) both read it, so a format change cannot leave either behind. Plain C, no
 * runtime declarations. */
#ifndef COLIBRI_FORMAT_H
#define COLIBRI_FORMAT_H

/* ---- format v5 ---- */
#define IMG_VERSION 5u
#define IMG_HEADER_BYTES 384u
#define IMG_ENTRY_BYTES 64u
#define IMG_ALIGN 64u
#define IMG_ARCH_MOE 1u
#define IMG_FLAG_NORM_TOPK (1u << 0)     /* renormalize the top-k router weights */
#define IMG_FLAG_QKV_BIAS (1u << 1)      /* q, k, v projections have biases */
#define IMG_FLAG_O_BIAS (1u << 2)        /* the output projection has a bias */
#define IMG_FLAG_QK_NORM_HEAD (1u << 3)  /* RMSNorm per head of q and k */
#define IMG_FLAG_QK_NORM_FULL (1u << 4)  /* RMSNorm across the whole q and k projections */
#define IMG_FLAG_SHARED_EXPERT (1u << 5) /* sigmoid-gated shared expert in MoE layers */
#define IMG_FLAG_ROUTER_SIGMOID (1u << 6) /* router scores are sigmoid(logits), not a softmax */
#define IMG_FLAG_ROUTER_BIAS (1u << 7)    /* ROUTER_BIAS added to the scores to choose experts, not to weigh them */
#define IMG_FLAG_SHARED_PLAIN (1u << 8)   /* ungated shared expert in MoE layers */
#define IMG_FLAG_ROPE_PAIRS (1u << 9)     /* RoPE rotates adjacent pairs, not the two halves of a head */
#define IMG_FLAG_ATTN_SINKS (1u << 10)   /* a learned logit per head joins each softmax's denominator */
#define IMG_FLAG_EXPERT_BIAS (1u << 11)  /* routed experts' gate, up and down have biases */
#define IMG_FLAG_ROUTER_TOPK_SOFTMAX (1u << 12) /* top-k of the logits (+ ROUTER_BIAS), softmax over those */
/* Gemma 4's layer: norms after attention and after the FFN, a scalar per layer; a MoE layer runs the dense MLP
 * beside the experts, each part normed on its own, routed on the residual normed by ROUTER_NORM, each chosen
 * expert's weight times its EXPERT_SCALE */
#define IMG_FLAG_GEMMA4_LAYER (1u << 13)
#define IMG_FLAG_GELU_TANH (1u << 14)  /* the FFN activation is gelu (tanh approximation), not silu */
#define IMG_FLAG_V_NORM (1u << 15)     /* RMSNorm without weights on each head of v */
#define IMG_FLAG_K_EQ_V (1u << 16)     /* global layers' values are their keys' projection (no WV) */
#define IMG_FLAG_GLOBAL_ROPE (1u << 17) /* global layers rotate with GLOBAL_ROPE_COS/SIN */
#define IMG_FLAG_DOUBLE_WIDE_MLP (1u << 18) /* the KV-sharing layers' dense MLP is 2 * dense_ffn wide */
#define IMG_KNOWN_FLAGS 0x7FFFFu
#define IMG_LEAN_FLAGS 0x13Fu /* the lean build's (COLIBRI_LEAN): bits 0-5 and SHARED_PLAIN */
#define IMG_NO_INDEX 0xFFFFFFFFu
#define IMG_MAX_DIM (1u << 24) /* any single dimension; keeps every product of two in 64 bits */
#define IMG_WINDOW_LAYER_BYTES 64u /* the header's window_layers bitmap: layers 0..511 */
#define IMG_MAX_EXPERTS 1024u  /* routed experts per layer (DeepSeek-V3 has 256): bounds the router's work */
#define IMG_MAX_TOP_K 64u      /* experts per token */

/* Header field offsets (docs/FORMAT.md, "Header"). */
enum {
    H_MAGIC = 0, H_VERSION = 8, H_HEADER_BYTES = 12, H_IMAGE_BYTES = 16, H_HEADER_CRC = 24,
    H_PAYLOAD_CRC = 28, H_ARCH = 32, H_VOCAB = 36, H_DIM = 40, H_FFN = 44, H_LAYERS = 48,
    H_HEADS = 52, H_KV_HEADS = 56, H_HEAD_DIM = 60, H_EXPERTS = 64, H_TOP_K = 68, H_MAX_SEQ = 72,
    H_FLAGS = 76, H_EPS = 80, H_ROPE_THETA = 84, H_TABLE_OFFSET = 88, H_N_TENSORS = 96,
    H_ENTRY_BYTES = 100, H_DATA_OFFSET = 104, H_ARENA_BYTES = 112, H_EXPERT_ALIGN = 120,
    H_DENSE_FFN = 124, H_SHARED_FFN = 128, H_CLIP_QKV = 132, H_KV_DTYPE = 136, H_EXPERT_OFFSET = 140,
    H_EXPERT_CRC_OFFSET = 148, H_META_OFFSET = 156, H_META_BYTES = 164, H_META_CRC = 172, H_SLIDING_WINDOW = 176,
    H_WINDOW_LAYERS = 180, H_Q_LORA = 244, H_KV_LORA = 248, H_ROPE_DIM = 252, H_V_HEAD_DIM = 256, H_ATTN_SCALE = 260,
    H_N_GROUP = 264, H_TOPK_GROUP = 268, H_GROUP_TOP = 272, H_ROUTED_SCALE = 276, H_SWIGLU_ALPHA = 280,
    H_SWIGLU_LIMIT = 284, H_GLOBAL_HEAD_DIM = 288, H_GLOBAL_KV_HEADS = 292, H_EMBED_SCALE = 296, H_LOGIT_SOFTCAP = 300,
    H_PLE_DIM = 304, H_KV_SHARED = 308, H_RESERVED = 312
};
/* Tensor table entry field offsets (docs/FORMAT.md, "Tensor table"). */
enum {
    E_ROLE = 0, E_DTYPE = 2, E_LAYER = 4, E_EXPERT = 8, E_NDIMS = 12, E_DIM0 = 16, E_DIM1 = 20,
    E_GROUP = 24, E_RESERVED = 28, E_OFFSET = 32, E_BYTES = 40, E_SCALES_OFFSET = 48, E_SCALES_BYTES = 56
};

enum tensor_role {
    ROLE_TOKEN_EMBD = 1, ROLE_ROPE_COS, ROLE_ROPE_SIN,
    /* per layer, in table order */
    ROLE_ATTN_NORM, ROLE_WQ, ROLE_BQ, ROLE_WK, ROLE_BK, ROLE_WV, ROLE_BV, ROLE_WO, ROLE_BO,
    ROLE_Q_NORM, ROLE_K_NORM, ROLE_SINKS, ROLE_WQ_A, ROLE_Q_A_NORM, ROLE_WQ_B, ROLE_WKV_A, ROLE_KV_A_NORM, ROLE_WK_B, ROLE_WV_B,
    ROLE_FFN_NORM, ROLE_DENSE_GATE, ROLE_DENSE_UP, ROLE_DENSE_DOWN, ROLE_ROUTER, ROLE_ROUTER_BIAS,
    ROLE_EXPERT_GATE_BIAS, ROLE_EXPERT_UP_BIAS, ROLE_EXPERT_DOWN_BIAS, ROLE_SHARED_GATE, ROLE_SHARED_UP, ROLE_SHARED_DOWN, ROLE_SHARED_EXPERT_GATE,
    ROLE_POST_ATTN_NORM, ROLE_POST_FFN_NORM, ROLE_DENSE_POST_NORM, ROLE_MOE_NORM, ROLE_MOE_POST_NORM, ROLE_ROUTER_NORM,
    ROLE_EXPERT_SCALE, ROLE_LAYER_SCALE, ROLE_PLE_GATE, ROLE_PLE_PROJ, ROLE_PLE_POST_NORM,
    /* per expert of a layer */
    ROLE_EXPERT_GATE, ROLE_EXPERT_UP, ROLE_EXPERT_DOWN,
    ROLE_OUTPUT_NORM, ROLE_LM_HEAD, ROLE_GLOBAL_ROPE_COS, ROLE_GLOBAL_ROPE_SIN, ROLE_PLE_EMBD, ROLE_PLE_MODEL_PROJ,
    ROLE_PLE_PROJ_NORM
};
enum tensor_dtype { DTYPE_F32 = 0, DTYPE_F16, DTYPE_BF16, DTYPE_Q8_0, DTYPE_Q4_0, DTYPE_COUNT };
#define QBLOCK 32u /* elements per quantization block (Q8_0, Q4_0): GGUF's block size */
enum kv_dtype { KV_F32 = 0, KV_F16 = 1 };

/* Tensor table index layout: 3 global tensors, then per layer LAYER_FIXED slots (ATTN_NORM ..
 * PLE_POST_NORM) followed by 3 per expert, then the output norm, lm_head, the global layers' RoPE tables and
 * Gemma 4's per-layer input tensors. A slot the model does not use holds an empty entry (n_dims 0). */
#define TENSORS_BEFORE_LAYERS 3u
#define TENSORS_AFTER_LAYERS (ROLE_PLE_PROJ_NORM - ROLE_OUTPUT_NORM + 1u)
#define LAYER_FIXED (ROLE_PLE_POST_NORM - ROLE_ATTN_NORM + 1u)
#define TENSORS_PER_EXPERT 3u

#endif
