"""The Colibri image, format v7: constants, the memory plan, a writer and a reader.

The byte layout is specified in docs/FORMAT.md; this module and firmware/src/image.c
are the two implementations of it and are tested against each other.
"""
from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import ml_dtypes
import numpy as np

from colibri.quant import QBLOCK, Deferred, DType, Encoded, blocks, stored_bytes

from colibri.format import (  # noqa: F401  (the format's constants, re-exported: format/schema.toml is their source)
    ALIGN, ARCH_MOE, ARENA_CTX_BYTES, ENTRY_BYTES, ENTRY_FORMAT, EXPERT_ROLES, FLAG_ATTN_SINKS, FLAG_EXPERT_BIAS,
    FLAG_GELU_TANH, FLAG_GEMMA4_LAYER, FLAG_NORM_TOPK, FLAG_O_BIAS, FLAG_QK_NORM_FULL,
    FLAG_QK_NORM_HEAD, FLAG_QKV_BIAS, FLAG_ROPE_PAIRS, FLAG_ROUTER_BIAS, FLAG_ROUTER_SIGMOID, FLAG_ROUTER_TOPK_SOFTMAX,
    FLAG_SHARED_EXPERT, FLAG_SHARED_PLAIN, FLAG_V_NORM, HEADER_BYTES, HEADER_FIELDS, HEADER_FORMAT, HEADER_OFFSETS,
    KNOWN_FLAGS, KV_DTYPES, LAYER_ROLES, LEAN_FLAGS, MAGIC, NO_INDEX, ROLES_AFTER_LAYERS,
    ROLES_BEFORE_LAYERS, VERSION, F32_TABLES, FACT_DENSE, FACT_GLOBAL_ROPE, FACT_K_IS_V, FACT_KV_SHARED, FACT_MLA,
    FACT_MOE, FACT_OWN_KV, FACT_PLE, FACT_Q_LORA, FACT_QK_NORM, FACT_SHARED_FFN, LAYER_ATTN_LATENT, LAYER_ATTN_STANDARD,
    LAYER_BYTES, LAYER_FFN_DENSE, LAYER_FFN_MOE, LAYER_FFN_MOE_AND_DENSE, LAYER_FIELDS, LAYER_FORMAT, LAYER_OPT_GLOBAL_ROPE,
    LAYER_OPT_K_IS_V, MAX_EXPERTS, MAX_LAYER_KINDS, MAX_LAYERS, ROLE_GGUF, ROLE_SHAPES, TERMS, Role)

TENSOR_REF_BYTES = 32   # one decoded table entry in the arena (tensor_ref in firmware/src/image.h)
HEADER_STRUCT = struct.Struct(HEADER_FORMAT)  # every header field but `reserved`; zeros up to HEADER_BYTES
HEADER_CRC_OFFSET = HEADER_OFFSETS["header_crc32"]
ENTRY_STRUCT = struct.Struct(ENTRY_FORMAT)
LAYER_STRUCT = struct.Struct(LAYER_FORMAT)  # a layer kind's record (docs/FORMAT.md "Layers")



@dataclass(frozen=True)
class ModelDims:
    vocab_size: int
    hidden_size: int
    ffn_size: int          # one routed expert's intermediate size (0 without experts)
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_experts: int         # 0 for a dense model
    top_k: int
    max_seq: int
    rms_norm_eps: float
    rope_theta: float
    flags: int = FLAG_NORM_TOPK
    dense_ffn_size: int = 0      # intermediate size of the dense MLP layers
    shared_ffn_size: int = 0     # intermediate size of the shared expert
    clip_qkv: float = 0.0        # clamp q, k, v to +-clip_qkv after the projections (0: off)
    kv_dtype: int = 0            # KV cache elements: 0 f32, 1 f16
    moe_layers: tuple[bool, ...] = ()  # per layer: routed experts (True) or a dense MLP (False)
    # Sliding-window attention: a windowed layer's token at position p sees positions p - W + 1 .. p only,
    # and its KV cache is a ring of W positions. 0: every layer sees every position before it.
    sliding_window: int = 0
    window_layers: tuple[bool, ...] = ()  # per layer: windowed (True); all False without a window
    # Multi-head latent attention (DeepSeek-V2/V3) when kv_lora_rank > 0: head_dim is the q/k head
    # (nope + rope_dim), the KV cache holds kv_lora_rank + rope_dim per position, values are v_head_dim.
    q_lora_rank: int = 0         # q = WQ_B norm(WQ_A x); 0: q = WQ x
    kv_lora_rank: int = 0
    rope_dim: int = 0            # the dims of each head RoPE rotates (the last ones); 0: head_dim
    v_head_dim: int = 0          # 0: head_dim
    attn_scale: float = 0.0      # the softmax scale; 0: 1/sqrt(head_dim) rounded to f32
    # Routing: experts in n_group groups, a group scored by the sum of its best group_top choice scores,
    # the best topk_group groups kept; the chosen weights times routed_scale.
    n_group: int = 1
    topk_group: int = 1
    group_top: int = 1
    routed_scale: float = 1.0
    # gpt-oss's expert activation when swiglu_limit > 0: gate clamped above, up to +-limit,
    # (up + 1) * gate * sigmoid(swiglu_alpha * gate); 0: SwiGLU, silu(gate) * up
    swiglu_alpha: float = 0.0
    swiglu_limit: float = 0.0
    # Gemma 4: the global (not windowed) layers' head size and KV heads; 0: head_dim and n_kv_heads
    global_head_dim: int = 0
    global_kv_heads: int = 0
    embed_scale: float = 0.0     # times each embedding row (Gemma: sqrt(hidden_size), rounded to f32); 0: none
    logit_softcap: float = 0.0   # logits = cap * tanh(logits / cap); 0: none
    ple_dim: int = 0             # Gemma 4's per-layer inputs: P values per layer and token; 0: none
    # Gemma 4's KV sharing: the last kv_shared_layers layers compute no keys or values; each attends over the
    # cache of the last earlier layer of its kind (windowed or global), which it shares
    kv_shared_layers: int = 0
    double_wide_mlp: bool = False  # Gemma 4: the KV-sharing layers' dense MLP is 2·dense_ffn_size wide
    k_eq_v: bool = False           # Gemma 4: a global layer's values are its keys' projection
    global_rope: bool = False      # Gemma 4: the global layers rotate with RoPE tables of their own head size

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def rope_width(self) -> int:
        return self.rope_dim or self.head_dim

    @property
    def v_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    @property
    def scale(self) -> float:
        """The softmax scale as stored (f32)."""
        if self.attn_scale:
            return float(np.float32(self.attn_scale))
        return float(np.float32(1.0) / np.sqrt(np.float32(self.head_dim)))

    def windowed(self, layer: int) -> bool:
        return bool(self.sliding_window) and self.window_layers[layer]

    def layer_head_dim(self, layer: int) -> int:
        """A head's size in `layer`: Gemma 4's global layers have their own."""
        return self.head_dim if self.windowed(layer) else self.global_head_dim or self.head_dim

    def layer_kv_heads(self, layer: int) -> int:
        return self.n_kv_heads if self.windowed(layer) else self.global_kv_heads or self.n_kv_heads

    def layer_q_dim(self, layer: int) -> int:
        return self.n_heads * self.layer_head_dim(layer)

    def kv_shared(self, layer: int) -> bool:
        return layer >= self.n_layers - self.kv_shared_layers

    def kv_source(self, layer: int) -> int:
        """The layer whose KV cache `layer` attends over: itself, or for a KV-sharing layer the last layer before
        the sharing ones of the same kind (transformers' "store" layer)."""
        if not self.kv_shared(layer):
            return layer
        first = self.n_layers - self.kv_shared_layers
        return max(l for l in range(first) if self.windowed(l) == self.windowed(layer))

    def layer_dense_ffn(self, layer: int) -> int:
        return self.dense_ffn_size * (2 if self.double_wide_mlp and self.kv_shared(layer) else 1)

    @property
    def dense_ffn_max(self) -> int:
        return self.dense_ffn_size * (2 if self.double_wide_mlp and self.kv_shared_layers else 1)

    def layer_record(self, layer: int) -> tuple[int, ...]:
        """`layer`'s record (docs/FORMAT.md "Layers"), its fields in LAYER_FIELDS order: 0 where the header's value
        holds, as the writer stores it."""
        moe, own = self.moe_layers[layer], not self.windowed(layer)  # Gemma 4's global layers: their own geometry
        gemma = bool(self.flags & FLAG_GEMMA4_LAYER)
        ffn = (LAYER_FFN_MOE_AND_DENSE if gemma else LAYER_FFN_MOE) if moe else LAYER_FFN_DENSE
        options = ((LAYER_OPT_K_IS_V if self.k_eq_v and own else 0)
                   | (LAYER_OPT_GLOBAL_ROPE if self.global_rope and own else 0))
        shared = self.kv_shared(layer)
        return (LAYER_ATTN_LATENT if self.mla else LAYER_ATTN_STANDARD, ffn, options, 0,
                self.global_head_dim if own else 0, self.global_kv_heads if own else 0,
                self.sliding_window if self.windowed(layer) else 0, self.kv_source(layer) if shared else NO_INDEX,
                2 * self.dense_ffn_size if self.double_wide_mlp and shared else 0)

    def layer_kinds(self) -> tuple[list[tuple[int, ...]], bytes]:
        """The header's kinds (the distinct records, in the order layers first have them) and its layer_kind map."""
        records = [self.layer_record(layer) for layer in range(self.n_layers)]
        kinds = list(dict.fromkeys(records))
        return kinds, bytes(kinds.index(r) for r in records)

    def layer_kv_dim(self, layer: int) -> int:
        """One position's row of the layer's K cache (and V cache); 0 for a KV-sharing layer, which has none."""
        if self.kv_shared(layer):
            return 0
        return self.att_dim if self.mla else self.layer_kv_heads(layer) * self.layer_head_dim(layer)

    @property
    def max_head_dim(self) -> int:
        return max(self.head_dim, self.global_head_dim)

    @property
    def att_dim(self) -> int:
        """Per head, the widest of what attention dots: the latent and the rope part (MLA), or a head."""
        return self.kv_lora_rank + self.rope_width if self.mla else self.max_head_dim

    @property
    def val_dim(self) -> int:
        """Per head, the widest of what attention sums: the latent (MLA), or a head."""
        return self.kv_lora_rank if self.mla else self.max_head_dim

    @property
    def o_dim(self) -> int:
        """The output projection's input: every head's value."""
        return self.n_heads * self.v_dim

    def kv_rows(self, layer: int) -> int:
        """Positions layer `layer` keeps in its KV cache: the window for a windowed layer, else max_seq."""
        return self.sliding_window if self.windowed(layer) else self.max_seq

    def kv_position_bytes(self, expanded: bool = False) -> int:
        """KV cache bytes one position takes over all layers: K and V rows, or MLA's one latent row. With
        `expanded`, what keys and values a head each would take (MLA's saving: docs/MODELS.md)."""
        elem = 2 if self.kv_dtype == KV_DTYPES["f16"] else 4
        if expanded:
            return elem * self.n_layers * self.n_heads * (self.head_dim + self.v_dim)
        return (1 if self.mla else 2) * elem * sum(self.layer_kv_dim(layer) for layer in range(self.n_layers))

    def kv_cache_bytes(self) -> int:
        """The arena's KV cache: every layer's rows (a windowed layer's ring holds W)."""
        elem = 2 if self.kv_dtype == KV_DTYPES["f16"] else 4
        return (1 if self.mla else 2) * elem * self.kv_cache_elements()

    def kv_cache_elements(self) -> int:
        """Elements of the K cache (the V cache has as many): each layer's rows of its row width."""
        return sum(self.kv_rows(layer) * self.layer_kv_dim(layer) for layer in range(self.n_layers))

    @property
    def q_dim(self) -> int:
        """The widest q projection of any layer."""
        return self.n_heads * self.max_head_dim

    @property
    def kv_dim(self) -> int:
        """The widest K row of any layer (MLA has no V cache: values are the latent)."""
        return self.att_dim if self.mla else max(self.layer_kv_dim(layer) for layer in range(self.n_layers))

    def facts(self, layer: int = NO_INDEX) -> int:
        """The flags and what `layer` has beside them (format/schema.toml [[fact]]; table.c's layer_facts): what a
        role's presence tests. A global tensor's roles test flags and model-wide facts only."""
        global_rope = self.global_rope and not all(self.windowed(l) for l in range(self.n_layers))
        facts = self.flags | (FACT_PLE if self.ple_dim else 0) | (FACT_GLOBAL_ROPE if global_rope else 0)
        if layer == NO_INDEX:
            return facts
        moe, mla, kv_shared = self.moe_layers[layer], self.mla, self.kv_shared(layer)
        for fact, on in ((FACT_MOE, moe), (FACT_DENSE, not moe or self.flags & FLAG_GEMMA4_LAYER), (FACT_MLA, mla),
                         (FACT_Q_LORA, mla and self.q_lora_rank), (FACT_OWN_KV, not mla and not kv_shared),
                         (FACT_K_IS_V, self.k_eq_v and not self.windowed(layer)),
                         (FACT_QK_NORM, self.flags & (FLAG_QK_NORM_HEAD | FLAG_QK_NORM_FULL)),
                         (FACT_KV_SHARED, kv_shared),
                         (FACT_SHARED_FFN, moe and self.flags & (FLAG_SHARED_EXPERT | FLAG_SHARED_PLAIN))):
            facts |= fact if on else 0
        return facts

    def terms(self, layer: int = NO_INDEX) -> dict[str, int]:
        """The numbers `layer`'s tensor shapes are made of (format/schema.toml [[term]]; table.c's shape_terms);
        a global tensor's take any layer's."""
        hd, kv_dim, fd = (self.head_dim, self.kv_dim, self.dense_ffn_size) if layer == NO_INDEX else \
            (self.layer_head_dim(layer), self.layer_kv_dim(layer), self.layer_dense_ffn(layer))
        q_dim, head_norm = self.n_heads * hd, bool(self.flags & FLAG_QK_NORM_HEAD)
        terms = {"none": 0, "one": 1, "V": self.vocab_size, "D": self.hidden_size, "S": self.max_seq, "H": self.n_heads,
                 "E": self.n_experts, "F": self.ffn_size, "Fd": fd, "Fs": self.shared_ffn_size,
                 "rope_half": self.rope_width // 2, "global_rope_half": (self.global_head_dim or self.head_dim) // 2,
                 "q_dim": q_dim, "kv_dim": kv_dim, "q_norm": hd if head_norm else q_dim,
                 "k_norm": hd if head_norm else kv_dim, "o_in": self.o_dim if self.mla else q_dim,
                 "q_lora": self.q_lora_rank, "kv_lora": self.kv_lora_rank,
                 "kv_a": self.kv_lora_rank + self.rope_width,
                 "k_b_rows": self.n_heads * self.kv_lora_rank, "nope": self.head_dim - self.rope_width,
                 "P": self.ple_dim, "LP": self.n_layers * self.ple_dim}
        assert tuple(terms) == TERMS, "ModelDims.terms computes every term of format/schema.toml"
        return terms

    def present(self, role: Role, layer: int = NO_INDEX) -> bool:
        """Whether this image holds a tensor for `role` in `layer` (the table lists the tensors present)."""
        _, _, need, deny = ROLE_SHAPES[role]
        facts = self.facts(layer)
        return facts & need == need and not facts & deny


def index_slots(n_layers: int, n_experts: int) -> int:
    """The dense tensor index's length (colibri_open resolves the table into it): the global tensors before the
    layers, each layer's slots and its experts', the global tensors after them."""
    return len(ROLES_BEFORE_LAYERS) + n_layers * (len(LAYER_ROLES) + len(EXPERT_ROLES) * n_experts) + len(ROLES_AFTER_LAYERS)


def align_up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def canonical_order(d: ModelDims) -> Iterator[tuple[Role, int, int]]:
    """Every tensor of an image as (role, layer, expert), in table order."""
    yield Role.TOKEN_EMBD, NO_INDEX, NO_INDEX
    yield Role.ROPE_COS, NO_INDEX, NO_INDEX
    yield Role.ROPE_SIN, NO_INDEX, NO_INDEX
    for layer in range(d.n_layers):
        for role in LAYER_ROLES:
            yield role, layer, NO_INDEX
        for expert in range(d.n_experts):
            for role in EXPERT_ROLES:
                yield role, layer, expert
    for role in ROLES_AFTER_LAYERS:
        yield role, NO_INDEX, NO_INDEX


def expected_shape(d: ModelDims, role: Role, layer: int = NO_INDEX) -> tuple[int, ...]:
    """A tensor's shape as format/schema.toml gives it: rows, then columns for a matrix."""
    rows, cols, _, _ = ROLE_SHAPES[role]
    terms = tuple(d.terms(layer).values())
    return (terms[rows],) if cols is None else (terms[rows], terms[cols])


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


@dataclass
class TensorEntry:
    role: Role
    layer: int
    expert: int
    dtype: DType
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    group_size: int = 0
    scales_offset: int = 0
    scales_bytes: int = 0

    def pack(self) -> bytes:
        dims = list(self.shape) + [1] * (2 - len(self.shape))
        return ENTRY_STRUCT.pack(self.role, self.dtype, self.layer, self.expert, len(self.shape),
                                 dims[0], dims[1], self.group_size, 0, self.offset, self.nbytes,
                                 self.scales_offset, self.scales_bytes)


    @property
    def end(self) -> int:
        """Where this tensor's bytes end (its scales included)."""
        return self.scales_offset + self.scales_bytes if self.scales_bytes else self.offset + self.nbytes


def entry_encoded(e: TensorEntry, values: bytes | memoryview | np.ndarray, scales: bytes | memoryview | np.ndarray | None,
                  values_at: int = 0, scales_at: int = 0) -> Encoded:
    """The tensor of table entry `e` as stored, without copying: its values at `values_at` of one buffer and,
    quantized, its scales at `scales_at` of another (the image itself for both, or the bytes read of each)."""
    dtype = DType(e.dtype)
    if dtype.quantized:
        rows, cols = e.shape
        per_block = QBLOCK if dtype == DType.Q8_0 else QBLOCK // 2
        vals = np.frombuffer(values, np.int8 if dtype == DType.Q8_0 else np.uint8, e.nbytes, values_at)
        scale = np.frombuffer(scales, "<f2", e.scales_bytes // 2, scales_at)
        return Encoded(dtype, e.shape, vals.reshape(rows, blocks(cols), per_block), scale.reshape(rows, -1))
    np_dtype = {DType.F32: "<f4", DType.F16: "<f2", DType.BF16: ml_dtypes.bfloat16}[dtype]
    count = int(np.prod(e.shape))
    return Encoded(dtype, e.shape, np.frombuffer(values, np_dtype, count, values_at).reshape(e.shape))


def tensor_name(role: Role, layer: int = NO_INDEX, expert: int = NO_INDEX) -> str:
    """A tensor's name for humans and for `pack.py --keep` globs: llama.cpp's names (blk.3.attn_q,
    blk.3.ffn_gate_exps.5 for expert 5, token_embd, output)."""
    name = ROLE_GGUF[role]
    if layer != NO_INDEX:
        name = f"blk.{layer}.{name}"
    return f"{name}.{expert}" if expert != NO_INDEX else name


@dataclass
class Image:
    dims: ModelDims
    header: dict
    entries: list[TensorEntry]
    data: bytes | memoryview = field(repr=False)
    meta: dict | None = None  # the metadata section: tokenizer, chat template (colibri/text.py)

    def entry(self, role: Role, layer: int = NO_INDEX, expert: int = NO_INDEX) -> TensorEntry:
        for e in self.entries:
            if (e.role, e.layer, e.expert) == (role, layer, expert):
                return e
        raise KeyError(f"no tensor {role.name} layer={layer} expert={expert}")

    def encoded(self, role: Role, layer: int = NO_INDEX, expert: int = NO_INDEX) -> Encoded:
        """A tensor as stored (values and, if quantized, scales), without copying."""
        e = self.entry(role, layer, expert)
        return entry_encoded(e, self.data, self.data, e.offset, e.scales_offset)

    def tensor(self, role: Role, layer: int = NO_INDEX, expert: int = NO_INDEX) -> np.ndarray:
        """A tensor's values as float32 (exactly what the runtime computes with)."""
        enc = self.encoded(role, layer, expert)
        return enc.values if enc.dtype == DType.F32 else enc.decode()

    @property
    def resident_bytes(self) -> int:
        """Bytes read in place; routed experts past them form the expert part (docs/FORMAT.md)."""
        return self.header["expert_offset"]

    def expert_block(self, layer: int, expert: int) -> tuple[int, int]:
        """(offset, bytes) of a routed expert's block: gate, up and down with their scales."""
        gate, down = self.entry(Role.EXPERT_GATE, layer, expert), self.entry(Role.EXPERT_DOWN, layer, expert)
        return gate.offset, down.end - gate.offset

    @property
    def expert_block_bytes(self) -> int:
        """The largest routed expert block: the size of one expert cache slot."""
        return max((down.end - gate.offset for gate, down in expert_blocks(self.entries)), default=0)

    def streamed_experts(self) -> list[tuple[int, int]]:
        """(layer, expert) of every routed expert in the expert part."""
        return [(g.layer, g.expert) for g, _ in expert_blocks(self.entries) if g.offset >= self.resident_bytes]

    def bytes_by_dtype(self) -> dict[str, int]:
        """Bytes of tensor data per dtype (tied tensors counted once)."""
        out: dict[str, int] = {}
        seen = set()
        for e in self.entries:
            if e.offset not in seen:
                seen.add(e.offset)
                name = DType(e.dtype).name.lower()
                out[name] = out.get(name, 0) + e.end - e.offset
        return out


def open_image(path: Path, check_crcs: bool = True) -> Image:
    """read_image of a file through a read-only memory map: the weights are paged in only when read
    (check_crcs=False reads only the header, the table and the metadata section: the tensor bytes are
    left to the device, which checks every CRC when it opens the image)."""
    size = path.stat().st_size
    if size == 0:
        raise ImageError(f"{path} is empty")
    return read_image(np.memmap(path, dtype=np.uint8, mode="r"), check_crcs)


class ImageError(ValueError):
    """The bytes are not a valid Colibri image of the version this host reads."""


def crc32(data: bytes | memoryview) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


def build_image(dims: ModelDims, tensors: dict[tuple[Role, int, int], np.ndarray | Encoded],
                expert_align: int = ALIGN, pinned: frozenset[tuple[int, int]] = frozenset(),
                meta: dict | None = None) -> bytes:
    """The image of `tensors` as bytes (write_image puts it in a file without holding it in memory).

    `tensors` are keyed by (role, layer, expert), ROPE_COS/ROPE_SIN included; a float array is stored
    as f32, an `Encoded` tensor in its dtype. The table lists the tensors the model has (dims.present),
    in canonical order; others in `tensors` are ignored. Two tiers (docs/FORMAT.md): the resident part holds every tensor but the routed experts,
    then the routed experts listed in `pinned` as (layer, expert); the expert part after it holds the
    other routed experts, which a board with an expert cache reads only through its fetch hook. Each
    routed expert's block (gate, up, down) starts at a multiple of expert_align (4096 lets a
    page-granular madvise or a DMA burst cover exactly one expert) and has its CRC in the expert CRC
    table. If two keys map to the same object (tied embeddings: LM_HEAD is TOKEN_EMBD), the second
    entry points at the first one's bytes instead of a copy. `meta` (the tokenizer, the chat template:
    colibri/text.py) goes into the metadata section after everything, as JSON.
    """
    plan = _lay_out(dims, tensors, expert_align, pinned, meta)
    buf = bytearray(plan.image_bytes)
    view = memoryview(buf)

    def write(at: int, data: bytes | np.ndarray) -> None:
        data = memoryview(data).cast("B")
        view[at:at + len(data)] = data
    _fill(write, lambda at, n: view[at:at + n], plan)
    return bytes(buf)


def write_image(path: Path, dims: ModelDims, tensors: dict[tuple[Role, int, int], np.ndarray | Encoded],
                expert_align: int = ALIGN, pinned: frozenset[tuple[int, int]] = frozenset(),
                meta: dict | None = None) -> int:
    """build_image's bytes written straight into the file at `path`, a tensor at a time (the image is never
    a second copy of the model in RAM: written pages belong to the page cache, not the process). Returns
    its size."""
    plan = _lay_out(dims, tensors, expert_align, pinned, meta)
    with open(path, "w+b") as f:
        f.truncate(plan.image_bytes)  # zeros: the padding between tensors
        fd = f.fileno()

        def write(at: int, data: bytes | np.ndarray) -> None:
            data = memoryview(data).cast("B")
            while len(data):
                done = os.pwrite(fd, data, at)
                data, at = data[done:], at + done
        _fill(write, lambda at, n: os.pread(fd, n, at), plan)
    return plan.image_bytes


@dataclass
class _Plan:
    """Where everything goes: the table in canonical order, and the stored bytes of each placed tensor."""
    dims: ModelDims
    entries: list[TensorEntry]
    sources: list[tuple[TensorEntry, Encoded | Deferred]]  # placed tensors (tied ones once)
    table_offset: int
    crc_offset: int
    data_offset: int
    expert_offset: int
    image_bytes: int
    expert_align: int
    meta: bytes            # the metadata section's JSON (b"": none)
    meta_offset: int


def check_runnable(d: ModelDims) -> None:
    """Refuse (ValueError naming the fields) what the verifier refuses though no family's mapping leads to it, so no
    hand-made description becomes an image that never opens (firmware/src/image.c, read_dims)."""
    if d.mla and d.kv_shared_layers:
        raise ValueError(f"kv_lora_rank={d.kv_lora_rank} with kv_shared_layers={d.kv_shared_layers}: latent attention "
                         "keeps every layer's own KV cache; the runtime shares caches for standard attention only")
    if d.global_head_dim not in (0, d.head_dim) and not d.global_rope:
        raise ValueError(f"global_head_dim={d.global_head_dim} differs from head_dim={d.head_dim} without "
                         "global_rope: the global layers need RoPE tables of their own head size")
    gemma_only = [name for name, on in (("kv_shared_layers", d.kv_shared_layers), ("k_eq_v", d.k_eq_v),
                                        ("global_rope", d.global_rope), ("double_wide_mlp", d.double_wide_mlp)) if on]
    if gemma_only and not d.flags & FLAG_GEMMA4_LAYER:
        raise ValueError(f"{', '.join(gemma_only)} without FLAG_GEMMA4_LAYER: the runtime has them in Gemma 4's layer only")
    if d.n_layers > MAX_LAYERS:
        raise ValueError(f"{d.n_layers} layers: an image holds at most {MAX_LAYERS}")
    if len(d.layer_kinds()[0]) > MAX_LAYER_KINDS:
        raise ValueError(f"{len(d.layer_kinds()[0])} kinds of layer: an image holds at most {MAX_LAYER_KINDS}")


def _lay_out(dims: ModelDims, tensors: dict, expert_align: int, pinned: frozenset, meta: dict | None) -> _Plan:
    check_runnable(dims)
    if expert_align % ALIGN or expert_align <= 0:
        raise ValueError(f"expert_align must be a positive multiple of {ALIGN}")
    order = [key for key in canonical_order(dims) if dims.present(key[0], key[1])]
    table_offset = HEADER_BYTES
    crc_offset = align_up(table_offset + len(order) * ENTRY_BYTES) if dims.n_experts else 0
    data_offset = align_up(crc_offset + 4 * dims.n_layers * dims.n_experts) if dims.n_experts else \
        align_up(table_offset + len(order) * ENTRY_BYTES)
    entries: dict[int, TensorEntry] = {}
    sources: list[tuple[TensorEntry, Encoded]] = []
    placed: dict[int, TensorEntry] = {}  # id(tensor) -> entry, so tied tensors share bytes
    cursor = data_offset

    def streamed(role: Role, layer: int, expert: int) -> bool:
        return role in EXPERT_ROLES and (layer, expert) not in pinned

    def place(i: int, role: Role, layer: int, expert: int) -> None:
        nonlocal cursor
        src = tensors[(role, layer, expert)]
        want = expected_shape(dims, role, layer)
        if tuple(src.shape) != want:
            raise ValueError(f"{role.name} layer={layer} expert={expert}: shape {src.shape}, expected {want}")
        if id(src) in placed:
            first = placed[id(src)]
            entries[i] = TensorEntry(role, layer, expert, first.dtype, want, first.offset, first.nbytes,
                                     first.group_size, first.scales_offset, first.scales_bytes)
            return
        enc = src if isinstance(src, (Encoded, Deferred)) else Deferred(DType.F32, want, lambda: src)
        if enc.dtype != DType.F32 and (len(want) != 2 or role in F32_TABLES):
            raise ValueError(f"{tensor_name(role, layer, expert)} must be f32 (only matrices may be narrower)")
        if role == Role.EXPERT_GATE:
            cursor = align_up(cursor, expert_align)
        values, scales = stored_bytes(enc)
        entry = TensorEntry(role, layer, expert, enc.dtype, want, cursor, values)
        cursor = align_up(cursor + entry.nbytes)
        if enc.dtype.quantized:
            entry.group_size, entry.scales_offset, entry.scales_bytes = QBLOCK, cursor, 2 * scales
            cursor = align_up(cursor + entry.scales_bytes)
        entries[i] = entry
        placed[id(src)] = entry
        sources.append((entry, enc))

    for i, key in enumerate(order):
        if not streamed(*key):
            place(i, *key)
    stream = [(i, key) for i, key in enumerate(order) if streamed(*key)]
    expert_offset = align_up(cursor, expert_align) if stream else cursor
    cursor = expert_offset
    for i, key in stream:
        place(i, *key)
    meta_bytes = json.dumps(meta, separators=(",", ":")).encode() if meta else b""
    meta_offset = align_up(cursor) if meta_bytes else 0
    image_bytes = meta_offset + len(meta_bytes) if meta_bytes else cursor
    return _Plan(dims, [entries[i] for i in range(len(order))], sources, table_offset, crc_offset, data_offset,
                 expert_offset, image_bytes, expert_align, meta_bytes, meta_offset)


def _fill(write: Callable[[int, bytes | np.ndarray], None], read: Callable[[int, int], bytes | memoryview],
          plan: _Plan) -> None:
    """Write the planned image (into zeroed storage of plan.image_bytes) one tensor at a time through
    `write(offset, data)`, then the table, the CRCs (summed by reading back, a window at a time) and the header."""
    for entry, src in plan.sources:  # one tensor in memory at a time: a Deferred one is encoded here
        enc = src.encoded() if isinstance(src, Deferred) else src
        write(entry.offset, np.ascontiguousarray(enc.values).reshape(-1).view(np.uint8))
        if entry.scales_bytes:
            write(entry.scales_offset, np.ascontiguousarray(enc.scales, dtype="<f2").reshape(-1).view(np.uint8))
    if plan.meta:
        write(plan.meta_offset, plan.meta)
    write(plan.table_offset, b"".join(e.pack() for e in plan.entries))

    def crc_of(start: int, end: int, window: int = 1 << 24) -> int:
        crc = 0
        for at in range(start, end, window):
            crc = zlib.crc32(read(at, min(window, end - at)), crc)
        return crc & 0xFFFFFFFF
    d = plan.dims
    kinds, kind_map = d.layer_kinds()
    for gate, down in expert_blocks(plan.entries):
        write(plan.crc_offset + 4 * (gate.layer * d.n_experts + gate.expert), struct.pack("<I", crc_of(gate.offset, down.end)))
    header = dict(
        magic=MAGIC, version=VERSION, header_bytes=HEADER_BYTES, image_bytes=plan.image_bytes,
        header_crc32=0, payload_crc32=crc_of(HEADER_BYTES, plan.expert_offset),
        arch=ARCH_MOE, vocab_size=d.vocab_size, hidden_size=d.hidden_size, ffn_size=d.ffn_size,
        n_layers=d.n_layers, n_heads=d.n_heads, n_kv_heads=d.n_kv_heads, head_dim=d.head_dim,
        n_experts=d.n_experts, top_k=d.top_k, max_seq=d.max_seq, flags=d.flags,
        rms_norm_eps=d.rms_norm_eps, rope_theta=d.rope_theta,
        tensor_table_offset=plan.table_offset, n_tensors=len(plan.entries), entry_bytes=ENTRY_BYTES,
        data_offset=plan.data_offset, arena_bytes=arena_bytes(d), expert_align=plan.expert_align,
        dense_ffn_size=d.dense_ffn_size, shared_ffn_size=d.shared_ffn_size, clip_qkv=d.clip_qkv,
        kv_dtype=d.kv_dtype, expert_offset=plan.expert_offset, expert_crc_offset=plan.crc_offset,
        meta_offset=plan.meta_offset, meta_bytes=len(plan.meta), meta_crc32=crc32(plan.meta) if plan.meta else 0,
        layer_kinds=len(kinds), kinds=b"".join(LAYER_STRUCT.pack(*k) for k in kinds), layer_kind=kind_map,
        q_lora_rank=d.q_lora_rank, kv_lora_rank=d.kv_lora_rank, rope_dim=d.rope_width, v_head_dim=d.v_dim,
        attn_scale=d.scale, n_group=d.n_group, topk_group=d.topk_group, group_top=d.group_top,
        routed_scale=d.routed_scale, swiglu_alpha=d.swiglu_alpha, swiglu_limit=d.swiglu_limit,
        embed_scale=d.embed_scale, logit_softcap=d.logit_softcap, ple_dim=d.ple_dim,
    )
    write(0, header_block(header))


def expert_blocks(entries: list[TensorEntry]) -> Iterator[tuple[TensorEntry, TensorEntry]]:
    """(gate, down) of every routed expert: its block is [gate.offset, down.end)."""
    for i, e in enumerate(entries):
        if e.role == Role.EXPERT_GATE:
            yield e, entries[i + 2]


def header_block(header: dict) -> bytes:
    """The HEADER_BYTES header bytes of `header`, with its CRC (the CRC field is zero while summing)."""
    raw = bytearray(HEADER_BYTES)
    HEADER_STRUCT.pack_into(raw, 0, *(header[k] if k != "header_crc32" else 0 for k in HEADER_FIELDS))
    struct.pack_into("<I", raw, HEADER_CRC_OFFSET, crc32(raw))
    return bytes(raw)


def write_header(buf: bytearray | memoryview, header: dict) -> None:
    """Pack `header` into buf[0:HEADER_BYTES] with its CRC."""
    buf[:HEADER_BYTES] = header_block(header)


def layer_fields(h: dict) -> dict:
    """ModelDims' per-layer fields from the header's layer records (docs/FORMAT.md "Layers"). The host models the
    layers its families make (one window, Gemma 4's global layers and its KV sharing in the last layers): records
    beyond those are refused, checked by writing the fields' records back."""
    n_layers, n_kinds = h["n_layers"], h["layer_kinds"]
    if not 1 <= n_kinds <= MAX_LAYER_KINDS or n_layers > MAX_LAYERS:
        raise ImageError(f"{n_layers} layers of {n_kinds} kinds: an image has 1 to {MAX_LAYER_KINDS} kinds and at "
                         f"most {MAX_LAYERS} layers")
    kinds = [LAYER_STRUCT.unpack_from(h["kinds"], k * LAYER_BYTES) for k in range(n_kinds)]
    if set(h["layer_kind"][:n_layers]) != set(range(n_kinds)):
        raise ImageError(f"the layers' kinds are not the {n_kinds} records, each some layer's")
    if any(h["kinds"][n_kinds * LAYER_BYTES:]) or any(h["layer_kind"][n_layers:]):
        raise ImageError("bytes past the layer records or past the last layer's kind are not 0")
    for k in kinds:
        r = dict(zip(LAYER_FIELDS, k))
        head, kv = r["head_dim"] or h["head_dim"], r["kv_heads"] or h["n_kv_heads"]
        dense = r["ffn"] != LAYER_FFN_MOE and not (r["dense_ffn"] or h["dense_ffn_size"])
        if head % 2 or not kv or h["n_heads"] % kv or r["window"] > h["max_seq"] or dense:
            raise ImageError(f"a layer record the runtime refuses: {r}")
    records = [dict(zip(LAYER_FIELDS, kinds[k])) for k in h["layer_kind"][:n_layers]]
    windows = {r["window"] for r in records if r["window"]}
    own = [r for r in records if not r["window"]]  # Gemma 4's global layers
    fields = dict(moe_layers=tuple(r["ffn"] != LAYER_FFN_DENSE for r in records),
                  sliding_window=max(windows, default=0), window_layers=tuple(bool(r["window"]) for r in records),
                  global_head_dim=own[0]["head_dim"] if own else 0, global_kv_heads=own[0]["kv_heads"] if own else 0,
                  kv_shared_layers=sum(r["kv_source"] != NO_INDEX for r in records),
                  double_wide_mlp=any(r["dense_ffn"] for r in records),
                  k_eq_v=any(r["options"] & LAYER_OPT_K_IS_V for r in records),
                  global_rope=any(r["options"] & LAYER_OPT_GLOBAL_ROPE for r in records))
    return fields


def read_image(data: bytes | np.ndarray, check_crcs: bool = True) -> Image:
    """Parse and check an image (header, CRCs, table order, presence, shapes, bounds): bytes, or a
    read-only np.memmap of an image file (open_image)."""
    if len(data) < HEADER_BYTES:
        raise ImageError(f"image is {len(data)} bytes, shorter than its {HEADER_BYTES}-byte header")
    h = dict(zip(HEADER_FIELDS, HEADER_STRUCT.unpack_from(data, 0)))
    if h["magic"] != MAGIC:
        raise ImageError("bad magic: not a Colibri image")
    if h["version"] != VERSION:
        raise ImageError(f"format version {h['version']}; this host reads version {VERSION} only: "
                         "pack the checkpoint again with host/pack.py")
    hdr = bytearray(data[:HEADER_BYTES])
    struct.pack_into("<I", hdr, HEADER_CRC_OFFSET, 0)
    if crc32(hdr) != h["header_crc32"]:
        raise ImageError("header CRC mismatch")
    if h["image_bytes"] > len(data):
        raise ImageError(f"image is truncated: header says {h['image_bytes']} bytes, got {len(data)}")
    if not h["tensor_table_offset"] <= h["expert_offset"] <= h["image_bytes"]:
        raise ImageError(f"expert part offset {h['expert_offset']} is outside the image")
    if check_crcs and crc32(memoryview(data)[HEADER_BYTES:h["expert_offset"]]) != h["payload_crc32"]:
        raise ImageError("payload CRC mismatch")
    meta: dict | None = None
    if h["meta_bytes"]:
        end = h["meta_offset"] + h["meta_bytes"]
        if h["meta_offset"] < h["expert_offset"] or end > h["image_bytes"]:
            raise ImageError("metadata section outside the image")
        raw = bytes(memoryview(data)[h["meta_offset"]:end])
        if crc32(raw) != h["meta_crc32"]:  # small: always checked
            raise ImageError("metadata section CRC mismatch")
        try:
            meta = json.loads(raw)
        except ValueError as exc:
            raise ImageError(f"metadata section is not JSON: {exc}") from None
    n_layers, n_experts = h["n_layers"], h["n_experts"]
    if h["tensor_table_offset"] + h["n_tensors"] * ENTRY_BYTES > h["image_bytes"]:
        raise ImageError(f"the tensor table ({h['n_tensors']} entries) ends past the image")
    # every layer lists its attention norm: more layers than entries is refused before anything per layer is built
    if n_layers > h["n_tensors"] or n_experts > MAX_EXPERTS:
        raise ImageError(f"{n_layers} layers of {n_experts} experts in a table of {h['n_tensors']} entries")
    raw = [ENTRY_STRUCT.unpack_from(data, h["tensor_table_offset"] + i * ENTRY_BYTES) for i in range(h["n_tensors"])]
    dims = ModelDims(**{k: h[k] for k in (
        "vocab_size", "hidden_size", "ffn_size", "n_layers", "n_heads", "n_kv_heads", "head_dim",
        "n_experts", "top_k", "max_seq", "rms_norm_eps", "rope_theta", "flags", "dense_ffn_size",
        "shared_ffn_size", "clip_qkv", "kv_dtype", "q_lora_rank", "kv_lora_rank", "rope_dim",
        "v_head_dim", "attn_scale", "n_group", "topk_group", "group_top", "routed_scale", "swiglu_alpha",
        "swiglu_limit", "embed_scale", "logit_softcap", "ple_dim")}, **layer_fields(h))
    listed = [LAYER_STRUCT.unpack_from(h["kinds"], k * LAYER_BYTES) for k in h["layer_kind"][:n_layers]]
    try:
        written = [dims.layer_record(layer) for layer in range(n_layers)]
    except ValueError:  # a sharing layer with no earlier layer of its kind to share
        written = []
    if written != listed:
        raise ImageError("the layer records are not a kind of layer this host models (one window; Gemma 4's global "
                         "layers and its KV sharing in the last layers)")
    order = (key for key in canonical_order(dims) if dims.present(key[0], key[1]))  # walked with the table: a short
    entries = []                                                                    # table ends it
    for i, (role, layer, expert) in enumerate(order):
        if i == len(raw):
            raise ImageError(f"{len(raw)} tensors listed, the dimensions and flags need more")
        role_, dtype, layer_, expert_, ndims, dim0, dim1, group, _, off, nbytes, s_off, s_bytes = raw[i]
        try:
            e = TensorEntry(Role(role_), layer_, expert_, DType(dtype), (dim0, dim1)[:ndims], off, nbytes,
                            group, s_off, s_bytes)
        except ValueError as exc:
            raise ImageError(f"table entry {i}: {exc}") from None
        if (e.role, e.layer, e.expert) != (role, layer, expert):
            raise ImageError(f"table entry {i} is {e.role.name}/{e.layer}/{e.expert}, expected {role.name}/{layer}/{expert}")
        if e.shape != expected_shape(dims, role, layer):
            raise ImageError(f"table entry {i} ({role.name}) has shape {e.shape}")
        if e.offset % ALIGN or e.end > h["image_bytes"]:
            raise ImageError(f"table entry {i} ({role.name}) is misaligned or out of bounds")
        entries.append(e)
    if len(entries) != len(raw):
        raise ImageError(f"{len(raw)} tensors listed, the dimensions and flags need {len(entries)}")
    for gate, down in expert_blocks(entries if check_crcs else []):
        at = h["expert_crc_offset"] + 4 * (gate.layer * n_experts + gate.expert)
        if crc32(memoryview(data)[gate.offset:down.end]) != struct.unpack_from("<I", data, at)[0]:
            raise ImageError(f"expert {gate.expert} of layer {gate.layer}: block CRC mismatch")
    # a view, not a copy: a memory-mapped image file stays on disk
    return Image(dims, h, entries, memoryview(data)[:h["image_bytes"]], meta)
