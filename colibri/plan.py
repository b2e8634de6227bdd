"""The work arena's plan: every buffer the forward pass uses, sized from a model's dimensions, as
firmware/src/arena.c plans it (tests/test_footprint.py holds the two equal), the prefill batch region and the expert
cache's bytes (docs/FORMAT.md "The memory plan", docs/STREAMING.md)."""
from __future__ import annotations

from colibri.dims import ModelDims, align_up, index_slots
from colibri.format import ARENA_CTX_BYTES, KV_DTYPES
from colibri.quant import QBLOCK, blocks

TENSOR_REF_BYTES = 32   # one decoded table entry in the arena (tensor_ref in firmware/src/image.h)


def _token_widths(d: ModelDims) -> list[tuple[str, int]]:
    """One token's attention buffers and per-layer inputs (floats), in plan order: q, q_a (the q-LoRA's rank),
    k_new, v_new, q_att (MLA: each head's query against the latent), attn_out (what attention sums), o_in (MLA:
    the output projection's input), ple (Gemma 4: every layer's input, then one gate of ple_dim)."""
    mla = d.mla
    return [("q", d.q_dim), ("q_a", d.q_lora_rank), ("k_new", d.kv_dim), ("v_new", 0 if mla else d.kv_dim),
            ("q_att", d.n_heads * d.att_dim if mla else 0), ("attn_out", d.n_heads * d.val_dim),
            ("o_in", d.o_dim if mla else 0), ("ple", (d.n_layers + 1) * d.ple_dim)]


def _in_blocks(d: ModelDims) -> int:
    """Q8_0 blocks of the longest input a matrix reads (the quantized activation buffers)."""
    ffn = max(d.ffn_size, d.dense_ffn_max, d.shared_ffn_size)
    return blocks(max(d.hidden_size, d.q_dim, ffn, d.q_lora_rank, d.kv_lora_rank, d.o_dim, d.ple_dim))


def arena_plan(d: ModelDims) -> dict[str, tuple[int, int]]:
    """The runtime's work arena: name -> (offset, bytes). Mirrors arena_plan() in firmware/src/arena.c."""
    kv_cache = d.kv_cache_elements()
    kv_size = 2 if d.kv_dtype == KV_DTYPES["f16"] else 4
    ffn = max(d.ffn_size, d.dense_ffn_max, d.shared_ffn_size)
    in_blocks = _in_blocks(d)
    D = d.hidden_size
    n_tensors = index_slots(d.n_layers, d.n_experts)
    buffers = [  # (name, bytes), in arena order
        ("tensors", TENSOR_REF_BYTES * n_tensors),  # the table, decoded by colibri_open
        ("x", 4 * D), ("xn", 4 * D), *((name, 4 * n) for name, n in _token_widths(d)),
        ("att", 4 * d.n_heads * d.max_seq), ("ffn_gate", 4 * ffn), ("ffn_up", 4 * ffn),
        ("ffn_out", 4 * D), ("moe_out", 4 * D), ("router", 4 * (2 * d.n_experts + d.n_group)), ("topk_weight", 4 * d.top_k),
        ("topk_index", 4 * d.top_k), ("topk_cycles", 8 * d.top_k), ("logits", 4 * d.vocab_size),
        ("probs", 4 * d.vocab_size), ("sample_index", 4 * d.vocab_size),
        ("xq", in_blocks * QBLOCK), ("xq_scale", 4 * in_blocks), ("xq_sum", 4 * in_blocks),
        ("hq", in_blocks * QBLOCK), ("hq_scale", 4 * in_blocks), ("hq_sum", 4 * in_blocks),
        ("k_cache", kv_size * kv_cache), ("v_cache", 0 if d.mla else kv_size * kv_cache),
    ]
    plan, offset = {}, ARENA_CTX_BYTES
    for name, nbytes in buffers:
        plan[name] = (offset, nbytes)
        offset += align_up(nbytes)
    plan["total"] = (0, offset)
    return plan


def arena_bytes(d: ModelDims) -> int:
    return arena_plan(d)["total"][1]


def prefill_bytes(d: ModelDims, tokens: int) -> int:
    """Arena bytes a prefill batch of `tokens` adds after the plan (colibri_prefill_bytes(): tokens times
    batch_plan() for one token in firmware/src/arena.c, each buffer 64-byte aligned); 0 for one token."""
    if tokens <= 1:
        return 0
    ffn = max(d.ffn_size, d.dense_ffn_max, d.shared_ffn_size)
    in_blocks = _in_blocks(d)
    D, k = d.hidden_size, d.top_k
    per_token = [4 * D, 4 * D, *(4 * n for _, n in _token_widths(d)), 4 * D,  # x .. ple, moe_out
                 4 * ffn, 4 * ffn, 4 * D, 4 * D, 4 * k * D,  # gate, up, ffn_out, gx, expert_out
                 4, 4 * k, 4 * k, 4 * d.n_experts, 4 * k,  # scalar, topk_index, topk_weight, first_pair, next_pair
                 in_blocks * QBLOCK, 4 * in_blocks, 4 * in_blocks, in_blocks * QBLOCK, 4 * in_blocks, 4 * in_blocks,
                 _ring_row_bytes(d)]  # a token's saved ring rows
    return tokens * sum(align_up(n) for n in per_token)


def _ring_row_bytes(d: ModelDims) -> int:
    """The K and V rows (MLA: K) of one position over every windowed layer that keeps a cache: what a prefill
    pass saves of the window rings per token before it overwrites them (blocks/rings.c, "a prefill batch and the
    window rings")."""
    elem = 2 if d.kv_dtype == KV_DTYPES["f16"] else 4
    return (1 if d.mla else 2) * elem * sum(d.layer_kv_dim(l) for l in range(d.n_layers) if d.windowed(l))


EXPERT_SLOT_META_BYTES = 32  # per cache slot: layer, expert, state, prefetched, last use, padding


def expert_cache_bytes(block_bytes: int, slots: int, crc_entries: int) -> int:
    """Arena bytes an expert cache of `slots` slots adds after the plan (colibri_expert_cache_bytes() in
    firmware/src/experts.c): the slots' bookkeeping, the expert CRC table of `crc_entries` (layers x experts)
    u32 as open copies it, then the slots, each the largest block rounded to 64."""
    if slots == 0:
        return 0
    return align_up(slots * EXPERT_SLOT_META_BYTES + 4 * crc_entries) + slots * align_up(block_bytes)
