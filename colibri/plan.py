"""The work arena's plan: every buffer the forward pass uses, sized from a model's dimensions, as
firmware/src/arena.c plans it (tests/test_footprint.py holds the two equal), the prefill batch region and the expert
cache's bytes (docs/FORMAT.md "The memory plan", docs/STREAMING.md)."""
from __future__ import annotations

import math

from colibri.dims import ModelDims, align_up, index_slots
from colibri.format import ARENA_CTX_BYTES, KV_DTYPES, LAYER_OPT_ATTN_GATE, PLAN_BUFFERS, PLAN_CONDITIONS, PLAN_TERMS
from colibri.quant import QBLOCK, blocks

TENSOR_REF_BYTES = 32   # one decoded table entry in the arena (tensor_ref in firmware/src/image.h)


def plan_terms(d: ModelDims, tokens: int = 1) -> dict[str, int]:
    """The numbers the plan's buffer sizes are made of (format/schema.toml [[plan_term]]; arena.c computes the same
    from model_dims), for a pass of `tokens` tokens."""
    in_blocks = blocks(max(d.hidden_size, d.q_dim, max(d.ffn_size, d.dense_ffn_max, d.shared_ffn_size), d.q_lora_rank,
                           d.kv_lora_rank, d.o_dim, d.ple_dim, d.dn_v_heads * d.dn_v_dim))  # Q8_0 blocks of the longest input a matrix reads
    terms = {"n_tensors": index_slots(d.n_layers, d.n_experts), "D": d.hidden_size, "q_dim": d.q_dim,
             "q_lora": d.q_lora_rank, "kv_dim": d.kv_dim, "H": d.n_heads, "att_dim": d.att_dim, "val_dim": d.val_dim,
             "o_dim": d.o_dim, "P": d.ple_dim, "L1": d.n_layers + 1, "S": d.max_seq,
             "ffn_max": max(d.ffn_size, d.dense_ffn_max, d.shared_ffn_size), "E": d.n_experts, "n_group": d.n_group,
             "K": d.top_k, "V": d.vocab_size, "in_blocks": in_blocks, "QBLOCK": QBLOCK,
             "kv_cache": d.kv_cache_elements(), "state": d.state_elements(), "mix": d.mix_dim, "kv_elem": 2 if d.kv_dtype == KV_DTYPES["f16"] else 4,
             "tensor_ref": TENSOR_REF_BYTES, "n": tokens}
    assert tuple(terms) == PLAN_TERMS, "plan_terms computes every plan term of format/schema.toml"
    return terms


def buffers(d: ModelDims, lifetime: str, tokens: int = 1) -> list[tuple[str, int]]:
    """(buffer, bytes) of `lifetime`'s buffers in plan order (format/schema.toml [[buffer]]): 0 for one whose
    condition does not hold."""
    terms = plan_terms(d, tokens)
    conditions = {"": True, "mla": d.mla, "!mla": not d.mla, "ple": d.ple_dim != 0, "state": d.conv_kernel != 0,
                  "attn_gate": any(k.options & LAYER_OPT_ATTN_GATE for k in d.layers)}
    assert set(conditions) - {""} == set(PLAN_CONDITIONS), "buffers tests every plan condition of format/schema.toml"

    def value(factor: int | str) -> int:
        return factor if isinstance(factor, int) else terms[factor]
    return [(name, value(elem) * sum(math.prod(value(f) for f in product) for product in count)
             if conditions[when] else 0)
            for name, life, elem, count, when in PLAN_BUFFERS if life == lifetime]


def arena_plan(d: ModelDims) -> dict[str, tuple[int, int]]:
    """The runtime's work arena: name -> (offset, bytes). Mirrors arena_plan() in firmware/src/arena.c: both lay out
    the schema's buffers of the model's lifetime, after the context."""
    plan, offset = {}, ARENA_CTX_BYTES
    for name, nbytes in buffers(d, "model"):
        plan[name] = (offset, nbytes)
        offset += align_up(nbytes)
    plan["total"] = (0, offset)
    return plan


def arena_bytes(d: ModelDims) -> int:
    return arena_plan(d)["total"][1]


def prefill_bytes(d: ModelDims, tokens: int) -> int:
    """Arena bytes a prefill batch of `tokens` adds after the plan (colibri_prefill_bytes(): tokens times
    batch_plan() for one token in firmware/src/arena.c, each buffer 64-byte aligned, and a token's saved ring
    rows); 0 for one token."""
    if tokens <= 1:
        return 0
    per_token = [nbytes for _, nbytes in buffers(d, "pass")] + [_ring_row_bytes(d)]
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
