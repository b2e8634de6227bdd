"""The model's geometry as the image records it: ModelDims (the header's dimensions and each layer's record, with
what a layer has and the numbers its tensor shapes are made of), the dense tensor index and the table's order.
The verifier's side is firmware/src/image.c and table.c; docs/FORMAT.md is the layout."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from colibri import format as fmt
from colibri.format import (ALIGN, EXPERT_ROLES, FACT_CONV, FACT_DELTA, FACT_DENSE, FACT_GLOBAL_ROPE_TABLES, FACT_KV_SHARED, FACT_MLA, FACT_MOE,
                            FACT_OWN_KV, FACT_PLE, FACT_Q_LORA, FACT_QK_NORM, FACT_SHARED_FFN, FACT_SHARED_GATED,
                            KV_DTYPES, LAYER_ATTN_DELTA_NET, LAYER_ATTN_LATENT, LAYER_ATTN_SHORT_CONV,
                            LAYER_ATTN_STANDARD, LAYER_FFN_DENSE, LAYER_FFN_MOE,
                            LAYER_FFN_MOE_AND_DENSE, LAYER_FIELDS, LAYER_OPT_GLOBAL_ROPE, LAYER_OPT_K_IS_V,
                            LAYER_QK_NORM_HEAD, LAYER_ROLES, NO_INDEX, ROLE_SHAPES, ROLES_AFTER_LAYERS, ROLES_BEFORE_LAYERS,
                            TERMS, Role)

# What a config asks of every layer (ModelDims.flags): the families set these, and layer_record writes them into each
# layer's record (docs/FORMAT.md "Layers"), the image's only copy. Each names the record's value or options it gives.
FLAG_NORM_TOPK = 1 << 0       # options NORM_TOPK (layers with experts)
FLAG_QKV_BIAS = 1 << 1        # options QKV_BIAS
FLAG_O_BIAS = 1 << 2          # options O_BIAS
FLAG_QK_NORM_HEAD = 1 << 3    # qk_norm HEAD
FLAG_QK_NORM_FULL = 1 << 4    # qk_norm FULL
FLAG_SHARED_EXPERT = 1 << 5   # shared GATED (layers with experts)
FLAG_ROUTER_SIGMOID = 1 << 6  # router SIGMOID (layers with experts)
FLAG_ROUTER_BIAS = 1 << 7     # options ROUTER_BIAS (layers with experts)
FLAG_SHARED_PLAIN = 1 << 8    # shared PLAIN (layers with experts)
FLAG_ROPE_PAIRS = 1 << 9      # options ROPE_PAIRS
FLAG_ATTN_SINKS = 1 << 10     # options ATTN_SINKS
FLAG_EXPERT_BIAS = 1 << 11    # options EXPERT_BIAS (layers with experts)
FLAG_ROUTER_TOPK_SOFTMAX = 1 << 12  # router TOPK_SOFTMAX (layers with experts)
FLAG_GEMMA4_LAYER = 1 << 13   # Gemma 4's layer: options POST_ATTN_NORM, POST_FFN_NORM, LAYER_SCALE; ffn MOE_AND_DENSE
FLAG_GELU_TANH = 1 << 14      # activation GELU_TANH
FLAG_V_NORM = 1 << 15         # options V_NORM
FLAG_ATTN_GATE = 1 << 16      # options ATTN_GATE
# flag -> the option it sets in every layer, and in the layers with experts
_OPTION_OF = {FLAG_QKV_BIAS: fmt.LAYER_OPT_QKV_BIAS, FLAG_O_BIAS: fmt.LAYER_OPT_O_BIAS,
              FLAG_ROPE_PAIRS: fmt.LAYER_OPT_ROPE_PAIRS, FLAG_ATTN_SINKS: fmt.LAYER_OPT_ATTN_SINKS,
              FLAG_V_NORM: fmt.LAYER_OPT_V_NORM, FLAG_ATTN_GATE: fmt.LAYER_OPT_ATTN_GATE,
              FLAG_GEMMA4_LAYER: fmt.LAYER_OPT_POST_ATTN_NORM | fmt.LAYER_OPT_POST_FFN_NORM | fmt.LAYER_OPT_LAYER_SCALE}
_EXPERT_OPTION_OF = {FLAG_NORM_TOPK: fmt.LAYER_OPT_NORM_TOPK, FLAG_ROUTER_BIAS: fmt.LAYER_OPT_ROUTER_BIAS,
                     FLAG_EXPERT_BIAS: fmt.LAYER_OPT_EXPERT_BIAS}
# the u8 fields' values: (flag, value) pairs, the first that the flags have; else 0
_VALUE_OF = {"router": ((FLAG_ROUTER_TOPK_SOFTMAX, fmt.LAYER_ROUTER_TOPK_SOFTMAX), (FLAG_ROUTER_SIGMOID, fmt.LAYER_ROUTER_SIGMOID)),
             "activation": ((FLAG_GELU_TANH, fmt.LAYER_ACT_GELU_TANH),),
             "qk_norm": ((FLAG_QK_NORM_HEAD, fmt.LAYER_QK_NORM_HEAD), (FLAG_QK_NORM_FULL, fmt.LAYER_QK_NORM_FULL)),
             "shared": ((FLAG_SHARED_EXPERT, fmt.LAYER_SHARED_GATED), (FLAG_SHARED_PLAIN, fmt.LAYER_SHARED_PLAIN))}


def record_value(flags: int, field: str) -> int:
    """The record's `field` (router, activation, qk_norm, shared) the flags give: at most one of its flags."""
    given = [value for flag, value in _VALUE_OF[field] if flags & flag]
    if len(given) > 1:
        raise ValueError(f"flags 0x{flags:X} give the layers' {field} two values: a layer has one")
    return given[0] if given else 0


def flags_of_record(r: dict) -> int:
    """The flags whose record `r` is (the inverse of layer_record's mapping, for the reader)."""
    flags = sum(flag for field, pairs in _VALUE_OF.items() for flag, value in pairs if value and r[field] == value)
    for table in (_OPTION_OF, _EXPERT_OPTION_OF):
        flags |= sum(flag for flag, opt in table.items() if r["options"] & opt == opt)
    return flags


@dataclass(frozen=True)
class LayerKind:
    """A layer's record resolved (docs/FORMAT.md "Layers"): the header's value where the record has 0, and no dense
    width in a layer of routed experts only. What the runtime's model_dims.kinds holds."""
    attention: int   # LAYER_ATTN_*
    ffn: int         # LAYER_FFN_*
    router: int      # LAYER_ROUTER_*
    activation: int  # LAYER_ACT_*
    qk_norm: int     # LAYER_QK_NORM_*
    shared: int      # LAYER_SHARED_*
    options: int     # LAYER_OPT_* bits
    head_dim: int
    kv_heads: int
    window: int      # W (0: none)
    kv_source: int   # the layer whose KV cache it reads (NO_INDEX: its own)
    dense_ffn: int   # its dense MLP's width (0: none)

    @classmethod
    def resolve(cls, r: dict, d: "ModelDims") -> "LayerKind":
        dense = 0 if r["ffn"] == LAYER_FFN_MOE else r["dense_ffn"] or d.dense_ffn_size
        return cls(r["attention"], r["ffn"], r["router"], r["activation"], r["qk_norm"], r["shared"], r["options"],
                   r["head_dim"] or d.head_dim, r["kv_heads"] or d.n_kv_heads, r["window"], r["kv_source"], dense)

    @property
    def moe(self) -> bool:
        return self.ffn != LAYER_FFN_DENSE


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
    rope_dim: int = 0            # the dims of each head RoPE rotates (MLA: the last ones; else the first); 0: head_dim
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
    # LFM2's gated short convolutions: the layers that convolve (True) instead of attending, and the kernel size
    # (Qwen3.5's DeltaNets' convolution's too)
    conv_layers: tuple[bool, ...] = ()
    conv_kernel: int = 0
    # Qwen3.5's Gated DeltaNets: the layers that run one (True) instead of attending, their key and value heads and
    # head sizes
    delta_layers: tuple[bool, ...] = ()
    dn_k_heads: int = 0
    dn_v_heads: int = 0
    dn_k_dim: int = 0
    dn_v_dim: int = 0
    # with NORM_TOPK the top-k weights are divided by their sum plus this (as f32): DeepSeek-V3's 1e-20, LFM2's 1e-6
    topk_norm_eps: float = 1e-20
    # The layers' records as an image holds them (one per layer, LAYER_FIELDS order), when given: the reader's, for an
    # image whose records the fields above do not give (so that the host computes any image the verifier accepts as
    # its records say; a dims made from such one by replace() keeps them unless told records=()). Empty: layer_record
    # derives each from the fields above (the packer's side, and every image a family makes).
    records: tuple[tuple[int, ...], ...] = ()

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

    def layer_record(self, layer: int) -> tuple[int, ...]:
        """`layer`'s record (docs/FORMAT.md "Layers"), its fields in LAYER_FIELDS order, as the writer stores it (0
        where the header's value holds), from the fields above: the flags' values and options (those of experts in
        the layers with experts); the window on the window layers; Gemma 4's global layers (those without) with
        their own geometry and options; its last kv_shared_layers layers reading the cache of the last earlier layer
        of their kind, windowed or global (transformers' "store" layer). Given `records`, the one listed."""
        if self.records:
            return self.records[layer]
        windowed = [bool(self.sliding_window) and self.window_layers[l] for l in range(self.n_layers)]
        own, moe, flags = not windowed[layer], self.moe_layers[layer], self.flags
        gemma = bool(flags & FLAG_GEMMA4_LAYER)
        conv = bool(self.conv_layers) and self.conv_layers[layer]
        delta = bool(self.delta_layers) and self.delta_layers[layer]
        ffn = (LAYER_FFN_MOE_AND_DENSE if gemma else LAYER_FFN_MOE) if moe else LAYER_FFN_DENSE
        options = ((LAYER_OPT_K_IS_V if self.k_eq_v and own else 0)
                   | (LAYER_OPT_GLOBAL_ROPE if self.global_rope and own else 0)
                   | sum(opt for flag, opt in _OPTION_OF.items() if flags & flag)
                   | sum(opt for flag, opt in _EXPERT_OPTION_OF.items() if moe and flags & flag))
        first_shared = self.n_layers - self.kv_shared_layers
        shared = layer >= first_shared
        source = max(l for l in range(first_shared) if windowed[l] == windowed[layer]) if shared else NO_INDEX
        if conv or delta:  # none of attention's options or norms
            options &= ~fmt.LAYER_STANDARD_OPTIONS
        attention = LAYER_ATTN_SHORT_CONV if conv else LAYER_ATTN_DELTA_NET if delta else \
            LAYER_ATTN_LATENT if self.mla else LAYER_ATTN_STANDARD
        return (attention, ffn,
                record_value(flags, "router") if moe else 0, record_value(flags, "activation"),
                0 if conv or delta else record_value(flags, "qk_norm"), record_value(flags, "shared") if moe else 0, 0, options,
                self.global_head_dim if own else 0, self.global_kv_heads if own else 0,
                self.sliding_window if windowed[layer] else 0, source,
                2 * self.dense_ffn_size if self.double_wide_mlp and shared else 0)

    def layer_kinds(self) -> tuple[list[tuple[int, ...]], bytes]:
        """The header's kinds (the distinct records, in the order layers first have them) and its layer_kind map."""
        records = [self.layer_record(layer) for layer in range(self.n_layers)]
        kinds = list(dict.fromkeys(records))
        return kinds, bytes(kinds.index(r) for r in records)

    @functools.cached_property
    def layers(self) -> tuple[LayerKind, ...]:
        """Every layer's record resolved, as the verifier holds them (image.c's layer_kinds): what the per-layer
        accessors below, the plan and the reference read."""
        return tuple(LayerKind.resolve(dict(zip(LAYER_FIELDS, self.layer_record(layer))), self)
                     for layer in range(self.n_layers))

    def windowed(self, layer: int) -> bool:
        return self.layers[layer].window != 0

    def layer_head_dim(self, layer: int) -> int:
        """A head's size in `layer`: Gemma 4's global layers have their own."""
        return self.layers[layer].head_dim

    def layer_kv_heads(self, layer: int) -> int:
        return self.layers[layer].kv_heads

    def layer_q_dim(self, layer: int) -> int:
        return self.n_heads * self.layer_head_dim(layer)

    def kv_shared(self, layer: int) -> bool:
        return self.layers[layer].kv_source != NO_INDEX

    def kv_source(self, layer: int) -> int:
        """The layer whose KV cache `layer` attends over: itself, or the one its record names."""
        return self.layers[layer].kv_source if self.kv_shared(layer) else layer

    def layer_dense_ffn(self, layer: int) -> int:
        return self.layers[layer].dense_ffn

    @property
    def dense_ffn_max(self) -> int:
        """The widest dense MLP: the header's width or any layer's (arena.c's ffn_max counts both)."""
        return max([self.dense_ffn_size, *(k.dense_ffn for k in self.layers)])

    def conv(self, layer: int) -> bool:
        """Whether `layer` convolves (LFM2's short convolution) instead of attending."""
        return self.layers[layer].attention == LAYER_ATTN_SHORT_CONV

    def delta(self, layer: int) -> bool:
        """Whether `layer` runs a Gated DeltaNet (Qwen3.5's) instead of attending."""
        return self.layers[layer].attention == LAYER_ATTN_DELTA_NET

    @property
    def dn_conv(self) -> int:
        """The channels a DeltaNet convolves: q, k and v."""
        return 2 * self.dn_k_heads * self.dn_k_dim + self.dn_v_heads * self.dn_v_dim

    def state_elements(self, layer: int | None = None) -> int:
        """A layer's state (every layer's with None; blocks/state.c): its convolution's last conv_kernel - 1 inputs per
        channel, then a DeltaNet's value heads' dk·dv."""
        if layer is None:
            return sum(self.state_elements(l) for l in range(self.n_layers))
        channels = self.hidden_size if self.conv(layer) else self.dn_conv if self.delta(layer) else 0
        recurrent = self.dn_v_heads * self.dn_k_dim * self.dn_v_dim if self.delta(layer) else 0
        return (self.conv_kernel - 1) * channels + recurrent

    @property
    def mix_dim(self) -> int:
        """Per token, the widest convolving or DeltaNet layer's projections (the plan's mix)."""
        layers = range(self.n_layers)
        conv = 3 * self.hidden_size if any(self.conv(l) for l in layers) else 0
        delta = self.dn_conv + 2 * self.dn_v_heads * self.dn_v_dim + 2 * self.dn_v_heads if any(
            self.delta(l) for l in layers) else 0
        return max(conv, delta)

    def layer_kv_dim(self, layer: int) -> int:
        """One position's row of the layer's K cache (and V cache); 0 for a KV-sharing or convolving layer, which
        has none."""
        if self.kv_shared(layer) or self.conv(layer) or self.delta(layer):
            return 0
        return self.att_dim if self.mla else self.layer_kv_heads(layer) * self.layer_head_dim(layer)

    @property
    def max_head_dim(self) -> int:
        return max([self.head_dim, *(k.head_dim for k in self.layers)])

    @property
    def global_rope_dim(self) -> int:
        """The head size of the layers rotating with GLOBAL_ROPE's tables (every such layer has the same); 0: none."""
        return next((k.head_dim for k in self.layers if k.options & LAYER_OPT_GLOBAL_ROPE), 0)

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
        """Positions layer `layer` keeps in its KV cache: the window for a windowed layer, none for a convolving
        one, else max_seq."""
        return 0 if self.conv(layer) or self.delta(layer) else self.layers[layer].window or self.max_seq

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
        """`layer`'s options and what its record and the header say beside them (format/schema.toml [[fact]];
        table.c's layer_facts): what a role's presence tests. A global tensor's roles test model-wide facts only."""
        global_rope = any(k.options & LAYER_OPT_GLOBAL_ROPE for k in self.layers)
        facts = (FACT_PLE if self.ple_dim else 0) | (FACT_GLOBAL_ROPE_TABLES if global_rope else 0)
        if layer == NO_INDEX:
            return facts
        k = self.layers[layer]
        moe, mla, kv_shared = k.moe, self.mla, k.kv_source != NO_INDEX
        conv, delta = k.attention == LAYER_ATTN_SHORT_CONV, k.attention == LAYER_ATTN_DELTA_NET
        for fact, on in ((FACT_MOE, moe), (FACT_DENSE, k.ffn != LAYER_FFN_MOE), (FACT_MLA, mla),
                         (FACT_Q_LORA, mla and self.q_lora_rank), (FACT_CONV, conv), (FACT_DELTA, delta),
                         (FACT_OWN_KV, not mla and not kv_shared and not conv and not delta),
                         (FACT_QK_NORM, k.qk_norm), (FACT_KV_SHARED, kv_shared), (FACT_SHARED_FFN, k.shared),
                         (FACT_SHARED_GATED, k.shared == fmt.LAYER_SHARED_GATED)):
            facts |= fact if on else 0
        return facts | k.options

    def terms(self, layer: int = NO_INDEX) -> dict[str, int]:
        """The numbers `layer`'s tensor shapes are made of (format/schema.toml [[term]]; table.c's shape_terms);
        a global tensor's take any layer's."""
        hd, kv_dim, fd = (self.head_dim, self.kv_dim, self.dense_ffn_size) if layer == NO_INDEX else \
            (self.layer_head_dim(layer), self.layer_kv_dim(layer), self.layer_dense_ffn(layer))
        q_dim = self.n_heads * hd
        head_norm = layer != NO_INDEX and self.layers[layer].qk_norm == LAYER_QK_NORM_HEAD
        terms = {"none": 0, "one": 1, "V": self.vocab_size, "D": self.hidden_size, "S": self.max_seq, "H": self.n_heads,
                 "E": self.n_experts, "F": self.ffn_size, "Fd": fd, "Fs": self.shared_ffn_size,
                 "rope_half": self.rope_width // 2, "global_rope_half": self.global_rope_dim // 2,
                 "q_dim": q_dim, "kv_dim": kv_dim, "q_norm": hd if head_norm else q_dim,
                 "k_norm": hd if head_norm else kv_dim, "o_in": self.o_dim if self.mla else q_dim,
                 "q_lora": self.q_lora_rank, "kv_lora": self.kv_lora_rank,
                 "kv_a": self.kv_lora_rank + self.rope_width,
                 "k_b_rows": self.n_heads * self.kv_lora_rank, "nope": self.head_dim - self.rope_width,
                 "conv_in": 3 * self.hidden_size, "conv_k": self.conv_kernel,
                 "dn_conv": self.dn_conv, "dn_v": self.dn_v_heads * self.dn_v_dim, "dn_heads": self.dn_v_heads,
                 "dn_v_dim": self.dn_v_dim,
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
