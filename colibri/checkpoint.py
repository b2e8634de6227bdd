"""Read a Hugging Face checkpoint directory into the runtime's model description.

Every config field that changes the math is mapped from the config itself (never assumed per
architecture) or the checkpoint is refused with a message naming the field. docs/MODELS.md lists
the families and fields.
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path

import ml_dtypes
import numpy as np

from colibri import rope
from colibri.families import FAMILIES, Family  # noqa: F401  (Family: the record checkpoint.py's functions take)
from colibri.format import MAX_EXPERTS, MAX_TOP_K  # the verifier's caps: they bound the router's work
from colibri.lazy import Derived, FileTensor, LazyTensor, OpenFile, expert_of
from colibri.quant import mxfp4_dequantize
from colibri.image import (EXPERT_ROLES, FLAG_NORM_TOPK, FLAG_O_BIAS, FLAG_QKV_BIAS, FLAG_ROPE_PAIRS, FLAG_ROUTER_BIAS, FLAG_ROUTER_SIGMOID, FLAG_SHARED_EXPERT,
                           FLAG_SHARED_PLAIN, FLAG_ATTN_SINKS, FLAG_EXPERT_BIAS, FLAG_ROUTER_TOPK_SOFTMAX, FLAG_GEMMA4_LAYER,
                           FLAG_GELU_TANH, FLAG_V_NORM, LAYER_ROLES, MAX_LAYERS,
                           NO_INDEX, ModelDims, Role)

DEFAULT_MAX_SEQ = 256


GEMMA4_ONLY = ("hidden_activation", "enable_moe_block", "top_k_experts", "final_logit_softcapping", "per_layer_config",
               "global_head_dim", "num_global_key_value_heads", "attention_k_eq_v", "use_bidirectional_attention",
               "hidden_size_per_layer_input", "vocab_size_per_layer_input", "num_kv_shared_layers", "use_double_wide_mlp")
# Fields read by the mapping below.
HANDLED = {
    "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size",
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "num_local_experts",
    "num_experts", "num_experts_per_tok", "max_position_embeddings", "rms_norm_eps", "rope_theta",
    "rope_parameters", "rope_scaling", "tie_word_embeddings", "hidden_act", "sliding_window",
    "use_sliding_window", "layer_types", "attention_bias", "qkv_bias", "mlp_bias", "clip_qkv", "norm_topk_prob",
    "decoder_sparse_step", "mlp_only_layers", "max_window_layers", "architectures", "model_type",
    *("n_routed_experts", "first_k_dense_replace", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim",
      "qk_rope_head_dim", "qk_head_dim", "v_head_dim", "n_group", "topk_group", "topk_method", "routed_scaling_factor",
      "n_shared_experts", "rope_interleave", "scoring_func", "moe_layer_freq"),  # DeepSeek's (_deepseek)
    "swiglu_alpha", "swiglu_limit", "quantization_config",  # gpt-oss's (quantization_config: MXFP4 experts only)
    *GEMMA4_ONLY, *(key for fam in FAMILIES.values() for key in fam.own_keys),
}
DEEPSEEK_ONLY = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "n_group", "topk_group",
                 "topk_method", "routed_scaling_factor", "n_shared_experts", "first_k_dense_replace", "scoring_func",
                 "moe_layer_freq")
# Fields that do not change inference math (training-only, generation defaults, bookkeeping).
HARMLESS = {
    "transformers_version", "torch_dtype", "dtype", "use_cache", "bos_token_id", "eos_token_id", "pad_token_id",
    "initializer_range", "attention_dropout", "output_router_logits", "router_aux_loss_coef", "router_jitter_noise",
    "_name_or_path", "pretraining_tp", "tokenizer_class", "output_attentions", "output_hidden_states",
    "return_dict", "id2label", "label2id", "problem_type", "use_return_dict",
    "num_nextn_predict_layers", "num_mtp_layers", "aux_loss_alpha", "seq_aux", "ep_size",  # DeepSeek's training and MTP
}


class UnsupportedModel(ValueError):
    """The checkpoint asks for something the runtime would not compute exactly."""


@dataclass
class Checkpoint:
    dims: ModelDims
    tensors: dict[tuple[Role, int, int], np.ndarray | LazyTensor]  # a file's are read when used (colibri/lazy.py)
    family: str
    tied_embeddings: bool
    n_params: int
    n_active_params: int
    # GGUF storage types the image has no dtype for, dequantized to f32 (exactly): type name -> tensors
    converted: dict[str, int] = field(default_factory=dict)
    towers_left_out: int = 0  # a multimodal checkpoint's vision and audio tower tensors (text in, text out)


def _family(cfg: dict) -> tuple[str, Family]:
    archs = cfg.get("architectures") or []
    for a in archs:
        if a in FAMILIES:
            return a, FAMILIES[a]
    raise UnsupportedModel(f"config field architectures={archs!r} is not supported; "
                           f"supported: {', '.join(FAMILIES)}")


def _n_experts(cfg: dict) -> int:
    """The routed expert count; transformers 5 writes num_local_experts where older configs say num_experts."""
    for key in ("num_local_experts", "n_routed_experts"):
        if cfg.get(key) is not None:
            return int(cfg[key])
    return int(cfg.get("num_experts") or 0)


def _moe_layers(cfg: dict, fam: Family, n_layers: int) -> tuple[bool, ...]:
    if not fam.moe:
        return (False,) * n_layers
    if fam.deepseek:
        return tuple(layer >= int(cfg.get("first_k_dense_replace") or 0) for layer in range(n_layers))
    if fam.gemma4:  # every layer, beside its dense MLP
        return (bool(cfg.get("enable_moe_block")),) * n_layers
    if not fam.sparse_layer_rule:
        return (True,) * n_layers
    dense = set(cfg.get("mlp_only_layers") or [])
    step = int(cfg.get("decoder_sparse_step", 1) or 1)
    n_experts = _n_experts(cfg)
    return tuple(layer not in dense and n_experts > 0 and (layer + 1) % step == 0 for layer in range(n_layers))


WINDOWED_FAMILIES = ("GptOssForCausalLM", "MixtralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen2MoeForCausalLM",
                     "Qwen3MoeForCausalLM")


def _window_layers(cfg: dict, arch: str, n_layers: int) -> tuple[int, tuple[bool, ...]]:
    """The sliding window W and which layers have it, as transformers decides them (W 0: no window).
    A config that lists layer_types (transformers 5 writes it) says it per layer; otherwise each family's
    configuration class derives it: Mixtral and Qwen3-MoE window every layer when sliding_window is set
    (Qwen3-MoE only with use_sliding_window); Qwen2 and Qwen3 window the layers from max_window_layers on;
    Qwen2-MoE the even-numbered layers (0, 2, ...) below max_window_layers; gpt-oss the even-numbered layers."""
    window = cfg.get("sliding_window")
    use = arch in ("MixtralForCausalLM", "GptOssForCausalLM") or cfg.get("use_sliding_window", False)  # no switch
    types = cfg.get("layer_types")
    if arch not in WINDOWED_FAMILIES or not window or not use:
        layers = (False,) * n_layers  # (Llama and OLMoE have no window in transformers)
    elif arch in ("MixtralForCausalLM", "Qwen3MoeForCausalLM"):  # these two do not read layer_types
        layers = (True,) * n_layers
    elif types is not None:
        if len(types) != n_layers or set(types) - {"sliding_attention", "full_attention"}:
            raise UnsupportedModel(f"config field layer_types={types!r}: need {n_layers} entries, each "
                                   "'sliding_attention' or 'full_attention'")
        layers = tuple(t == "sliding_attention" for t in types)
    elif arch == "GptOssForCausalLM":  # its configuration class: the even layers (0, 2, ...) windowed
        layers = tuple(layer % 2 == 0 for layer in range(n_layers))
    elif arch == "Qwen2MoeForCausalLM":
        limit = int(cfg.get("max_window_layers", 28))
        layers = tuple(layer % 2 == 0 and layer < limit for layer in range(n_layers))
    else:
        limit = int(cfg.get("max_window_layers", 28))
        layers = tuple(layer >= limit for layer in range(n_layers))
    if not any(layers):
        return 0, layers
    if int(window) < 1:
        raise UnsupportedModel(f"config field sliding_window={window} must be at least 1")
    return int(window), layers


def _deepseek(cfg: dict, fam: Family, any_moe: bool, n_experts: int, top_k: int) -> tuple[dict, int]:
    """DeepSeek-V2/V3's attention and routing as ModelDims fields, and their flags (docs/MODELS.md)."""
    arch = f"DeepSeek-V{fam.deepseek}"
    if cfg.get("attention_bias"):
        raise UnsupportedModel(f"config field attention_bias=true: the runtime's multi-head latent attention has no biases")
    if int(cfg.get("moe_layer_freq", 1) or 1) != 1:
        raise UnsupportedModel(f"config field moe_layer_freq={cfg['moe_layer_freq']}: transformers' {arch} makes every "
                               "layer from first_k_dense_replace on a MoE layer (moe_layer_freq 1)")
    scoring = cfg.get("scoring_func")
    want = "sigmoid" if fam.deepseek == 3 else "softmax"
    if scoring is not None and scoring != want:
        raise UnsupportedModel(f"config field scoring_func={scoring!r}: transformers' {arch} router uses {want}")
    nope, rope_dim, lat = int(cfg["qk_nope_head_dim"]), int(cfg["qk_rope_head_dim"]), int(cfg["kv_lora_rank"])
    if nope < 1 or rope_dim < 2 or rope_dim % 2 or lat < 1 or int(cfg["v_head_dim"]) < 1:
        raise UnsupportedModel(f"config fields qk_nope_head_dim={nope}, qk_rope_head_dim={rope_dim}, kv_lora_rank={lat}, "
                               f"v_head_dim={cfg['v_head_dim']}: each must be positive, qk_rope_head_dim even")
    fields = dict(q_lora_rank=int(cfg.get("q_lora_rank") or 0), kv_lora_rank=lat, rope_dim=rope_dim,
                  v_head_dim=int(cfg["v_head_dim"]), routed_scale=float(cfg.get("routed_scaling_factor", 1.0)))
    flags = FLAG_ROPE_PAIRS if fam.deepseek == 2 or cfg.get("rope_interleave", True) else 0
    shared = int(cfg.get("n_shared_experts") or 0) * int(cfg["moe_intermediate_size"]) if any_moe else 0
    if shared:
        flags |= FLAG_SHARED_PLAIN
    fields["shared_ffn_size"] = shared
    if not any_moe:
        return fields, flags
    if fam.deepseek == 2:
        if cfg.get("norm_topk_prob"):
            raise UnsupportedModel("config field norm_topk_prob=true: transformers' DeepSeek-V2 router ignores it "
                                   "(DeepSeek's own code renormalizes), so what it means is ambiguous; refusing")
        method = cfg.get("topk_method", "greedy")
        if method not in ("greedy", "group_limited_greedy"):
            raise UnsupportedModel(f"config field topk_method={method!r}: transformers' DeepSeek-V2 router knows "
                                   "'greedy' and 'group_limited_greedy'")
        grouped, group_top = method == "group_limited_greedy", 1  # a group scores its best expert
    else:
        if cfg.get("topk_method", "noaux_tc") != "noaux_tc":
            raise UnsupportedModel(f"config field topk_method={cfg['topk_method']!r}: DeepSeek-V3 routes by 'noaux_tc'")
        flags |= FLAG_ROUTER_SIGMOID | FLAG_ROUTER_BIAS
        if cfg.get("norm_topk_prob"):
            flags |= FLAG_NORM_TOPK
        grouped, group_top = True, 2  # a group scores the sum of its best two
    if grouped:
        n_group, topk_group = int(cfg.get("n_group") or 0), int(cfg.get("topk_group") or 0)
        per = n_experts // n_group if n_group else 0
        if not (n_group >= 1 and n_experts % n_group == 0 and 1 <= topk_group <= n_group and group_top <= per
                and top_k <= topk_group * per):
            raise UnsupportedModel(f"config fields n_group={n_group}, topk_group={topk_group}: need n_group to divide the "
                                   f"{n_experts} experts into groups of at least {group_top}, 1 <= topk_group <= "
                                   f"n_group, and num_experts_per_tok={top_k} of the kept groups' experts at most")
        if n_group > MAX_TOP_K:
            raise UnsupportedModel(f"config field n_group={n_group}: the runtime takes at most {MAX_TOP_K} groups")
        fields.update(n_group=n_group, topk_group=topk_group, group_top=group_top)
    return fields, flags


def _gpt_oss(cfg: dict) -> tuple[dict, int]:
    """gpt-oss's mechanisms as ModelDims fields and flags: attention sinks, the router's bias and softmax over its
    top-k logits, the experts' biases and clamped SwiGLU (docs/MODELS.md)."""
    quant = cfg.get("quantization_config")
    if quant is not None and quant.get("quant_method") != "mxfp4":
        raise UnsupportedModel(f"config field quantization_config: quant_method={quant.get('quant_method')!r}; only "
                               "gpt-oss's mxfp4 experts are read")
    alpha, limit = float(cfg.get("swiglu_alpha", 1.702)), float(cfg.get("swiglu_limit", 7.0))
    if not (alpha > 0 and limit > 0):
        raise UnsupportedModel(f"config fields swiglu_alpha={alpha}, swiglu_limit={limit} must be positive")
    flags = FLAG_ATTN_SINKS | FLAG_ROUTER_BIAS | FLAG_ROUTER_TOPK_SOFTMAX | FLAG_EXPERT_BIAS
    return {"swiglu_alpha": alpha, "swiglu_limit": limit}, flags


def _gemma4_layer_types(cfg: dict, n_layers: int) -> list[str]:
    """Gemma4TextConfig's layer types: as listed, or its default (every sixth layer global), the last layer global
    whatever the list says."""
    types = cfg.get("layer_types")
    if types is None:
        types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n_layers)]
    types = list(types)
    if len(types) != n_layers or set(types) - {"sliding_attention", "full_attention"}:
        raise UnsupportedModel(f"config field layer_types={types!r}: need {n_layers} entries, each "
                               "'sliding_attention' or 'full_attention'")
    types[-1] = "full_attention"
    return types


def _gemma4(cfg: dict, n_layers: int, head_dim: int, max_seq: int) -> tuple[dict, int, dict]:
    """Gemma 4's mechanisms as ModelDims fields and flags, and its two RoPE settings (docs/MODELS.md): the layer with
    its extra norms and scalar, the dense MLP beside the experts, the router's norm and per-expert scales; sliding
    layers of head_dim and global layers of their own head size, KV heads and RoPE; v from k on global layers with
    attention_k_eq_v; the embedding scale and the final logit soft-capping."""
    if cfg.get("use_bidirectional_attention") is not None:
        raise UnsupportedModel(f"config field use_bidirectional_attention={cfg['use_bidirectional_attention']!r}: the "
                               "runtime attends causally only (Gemma 4's text checkpoints set it to null)")
    ple = int(cfg.get("hidden_size_per_layer_input", 256) or 0)  # Gemma4TextConfig's defaults where a field is absent
    if ple and int(cfg.get("vocab_size_per_layer_input", 262_144)) != int(cfg["vocab_size"]):
        raise UnsupportedModel(f"config field vocab_size_per_layer_input={cfg.get('vocab_size_per_layer_input', 262_144)}: the "
                               f"per-layer input embeddings must cover the vocabulary ({cfg['vocab_size']})")
    act = cfg.get("hidden_activation", "gelu_pytorch_tanh")
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise UnsupportedModel(f"config field hidden_activation={act!r}: only 'gelu_pytorch_tanh' (GeGLU) is supported")
    types = _gemma4_layer_types(cfg, n_layers)
    # the global layers' geometry: per_layer_config as transformers saves it (what differs from the base), or the
    # fields its configuration class derives it from (a released config.json's global_head_dim, 512 if absent)
    overrides = {int(k): v for k, v in (cfg.get("per_layer_config") or {}).items()}
    if "per_layer_config" not in cfg:
        g = {"head_dim": int(cfg.get("global_head_dim", 512))}
        if cfg.get("attention_k_eq_v", False) and cfg.get("num_global_key_value_heads") is not None:
            g["num_key_value_heads"] = int(cfg["num_global_key_value_heads"])
        overrides = {layer: g for layer, t in enumerate(types) if t == "full_attention"}
    if any(not 0 <= layer < n_layers for layer in overrides):
        raise UnsupportedModel(f"config field per_layer_config names layers {sorted(overrides)}; the model has {n_layers}")
    kv_heads = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    base = {"head_dim": head_dim, "num_key_value_heads": kv_heads}
    geometry = {t: set() for t in ("sliding_attention", "full_attention")}
    for layer, t in enumerate(types):
        o = overrides.get(layer, {})
        if set(o) - set(base):
            raise UnsupportedModel(f"config field per_layer_config: layer {layer} overrides {sorted(set(o) - set(base))}; "
                                   "only head_dim and num_key_value_heads are read")
        geometry[t].add((int(o.get("head_dim", head_dim)), int(o.get("num_key_value_heads", kv_heads))))
    if geometry["sliding_attention"] - {(head_dim, kv_heads)} or len(geometry["full_attention"]) != 1:
        raise UnsupportedModel(f"config field per_layer_config: the sliding layers must keep head_dim={head_dim} and "
                               f"num_key_value_heads={kv_heads}, and the full-attention layers share one geometry")
    (g_head, g_kv), = geometry["full_attention"]
    if g_head % 2 or cfg["num_attention_heads"] % g_kv:
        raise UnsupportedModel(f"per_layer_config: global head_dim={g_head} must be even and num_key_value_heads={g_kv} "
                               "divide num_attention_heads")
    window = int(cfg.get("sliding_window", 512) or 0)
    sliding = tuple(t == "sliding_attention" for t in types)
    if any(sliding) and window < 1:
        raise UnsupportedModel(f"config field sliding_window={window} must be at least 1")
    shared = int(cfg.get("num_kv_shared_layers") or 0)
    first = n_layers - shared  # layers from here on attend over the KV cache of the last earlier layer of their kind
    if not 0 <= shared < n_layers or {types[layer] for layer in range(first, n_layers)} - set(types[:first]):
        raise UnsupportedModel(f"config field num_kv_shared_layers={shared}: each sharing layer needs an earlier layer "
                               "of its kind (sliding or full attention) that computes its own keys and values")
    flags = FLAG_GEMMA4_LAYER | FLAG_GELU_TANH | FLAG_V_NORM
    if cfg.get("enable_moe_block"):  # its router always renormalizes the top-k
        flags |= FLAG_NORM_TOPK
    softcap = cfg.get("final_logit_softcapping")
    if softcap is not None and not softcap > 0:
        raise UnsupportedModel(f"config field final_logit_softcapping={softcap} must be positive or null")
    fields = dict(global_head_dim=g_head, global_kv_heads=g_kv, attn_scale=1.0, logit_softcap=float(softcap or 0.0),
                  ple_dim=ple, kv_shared_layers=shared, global_rope=True,
                  double_wide_mlp=bool(shared and cfg.get("use_double_wide_mlp")),
                  k_eq_v=bool(cfg.get("attention_k_eq_v")),
                  embed_scale=float(np.float32(cfg["hidden_size"] ** 0.5)),
                  # a window the sequence never outgrows is kept (at max_seq): the layer kinds differ in more than it
                  sliding_window=min(window, max_seq) if any(sliding) else 0, window_layers=sliding)
    params = cfg.get("rope_parameters") or {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}}
    if set(params) != {"sliding_attention", "full_attention"}:
        raise UnsupportedModel(f"config field rope_parameters={params!r}: Gemma 4 gives one per layer type "
                               "(sliding_attention, full_attention)")
    return fields, flags, params


def read_config(cfg: dict, max_seq: int | None) -> tuple[ModelDims, bool, str, dict]:
    """The model description for an image of `max_seq` positions (None: 256, or the model's limit if smaller)."""
    arch, fam = _family(cfg)
    unknown = sorted(set(cfg) - HANDLED - HARMLESS)
    if unknown:
        raise UnsupportedModel(f"config field {unknown[0]} is not understood by the packer (it may change the "
                               f"math); refusing rather than ignoring it. Unknown fields: {', '.join(unknown)}")
    limit = cfg.get("max_position_embeddings")
    if max_seq is None:
        max_seq = min(DEFAULT_MAX_SEQ, limit or DEFAULT_MAX_SEQ)
    if limit is not None and max_seq > limit:
        raise UnsupportedModel(f"--max-seq {max_seq} exceeds config field max_position_embeddings={limit}")
    if cfg.get("hidden_act", "silu") != "silu":
        raise UnsupportedModel(f"config field hidden_act={cfg['hidden_act']!r} is not supported (only 'silu')")
    if cfg.get("mlp_bias"):
        raise UnsupportedModel("config field mlp_bias=true is not supported")

    for key in ("swiglu_alpha", "swiglu_limit", "quantization_config"):
        if cfg.get(key) is not None and not fam.gpt_oss:
            raise UnsupportedModel(f"config field {key} is not understood for {arch} (only gpt-oss's MXFP4 experts and "
                                   "clamped SwiGLU are); refusing rather than ignoring it")
    owners = [("DeepSeek's architectures", DEEPSEEK_ONLY, fam.deepseek), ("Gemma 4", GEMMA4_ONLY, fam.gemma4)]
    owners += [(name, f.own_keys, f is fam) for name, f in FAMILIES.items() if f.own_keys]
    for owner, keys, mine in owners:
        for key in keys if not mine else ():
            if cfg.get(key) is not None:
                raise UnsupportedModel(f"config field {key}={cfg[key]!r} belongs to {owner}; {arch} "
                                       "does not read it in transformers, so the runtime will not either")
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or (256 if fam.gemma4 else hidden // heads))  # Gemma4TextConfig's default
    if fam.deepseek:  # config.head_dim is the rope part there; a q/k head is qk_nope_head_dim + qk_rope_head_dim
        head_dim = int(cfg["qk_nope_head_dim"]) + int(cfg["qk_rope_head_dim"])
    if head_dim % 2:
        raise UnsupportedModel(f"config field head_dim={head_dim} is odd; rotate-half RoPE needs an even head_dim")
    n_layers = int(cfg["num_hidden_layers"])
    moe_layers = _moe_layers(cfg, fam, n_layers)
    gemma, gemma_flags, gemma_rope = _gemma4(cfg, n_layers, head_dim, max_seq) if fam.gemma4 else ({}, 0, {})
    window, window_layers = (gemma.pop("sliding_window"), gemma.pop("window_layers")) if fam.gemma4 else \
        _window_layers(cfg, arch, n_layers)
    if window >= max_seq and not fam.gemma4:  # the window never leaves anything out: plain attention, a cache of max_seq
        window, window_layers = 0, (False,) * n_layers
    if n_layers > MAX_LAYERS:
        raise UnsupportedModel(f"config field num_hidden_layers={n_layers}: an image holds at most {MAX_LAYERS} layers")
    any_moe, any_dense = any(moe_layers), not all(moe_layers)
    n_experts = _n_experts(cfg) if any_moe else 0

    flags = fam.qk_norm | gemma_flags | fam.flags
    top_k = int(cfg["top_k_experts" if fam.gemma4 else "num_experts_per_tok"]) if any_moe else 0
    mla, mla_flags = _deepseek(cfg, fam, any_moe, n_experts, top_k) if fam.deepseek else ({}, 0)
    if fam.gpt_oss:
        mla, mla_flags = _gpt_oss(cfg)
    flags |= mla_flags
    mla.update(gemma)
    bias = cfg.get(fam.bias_key, fam.bias_default) if fam.bias_key and not fam.deepseek else fam.bias_default
    if bias:
        flags |= FLAG_QKV_BIAS | (FLAG_O_BIAS if fam.bias_on_o else 0)
    norm_topk = fam.norm_topk_default if fam.norm_topk_default is not None else bool(cfg.get("norm_topk_prob", False))
    if fam.gpt_oss and cfg.get("norm_topk_prob"):
        raise UnsupportedModel("config field norm_topk_prob=true: transformers' gpt-oss router takes a softmax over the "
                               "top-k logits and reads no norm_topk_prob")
    if any_moe and norm_topk and not (fam.deepseek or fam.gpt_oss or fam.gemma4 or fam.flags & FLAG_ROUTER_TOPK_SOFTMAX):
        flags |= FLAG_NORM_TOPK
    shared_ffn = int(cfg.get("shared_expert_intermediate_size") or 0) if fam.shared_expert and any_moe else 0
    if shared_ffn:
        flags |= FLAG_SHARED_EXPERT
    clip = cfg.get("clip_qkv")
    if clip is not None and not fam.clip_qkv:
        raise UnsupportedModel(f"config field clip_qkv={clip}: {arch} does not clamp q, k, v in transformers (only "
                               "OLMoE does), so the runtime will not either; remove the field or set it to null")
    if clip is not None and not clip > 0:
        raise UnsupportedModel(f"config field clip_qkv={clip} must be positive or null")

    extra = {}
    try:
        params = gemma_rope.get("sliding_attention") or rope.rope_parameters(cfg)
        inv_freq, attention_factor = rope.frequencies(params, mla.get("rope_dim", head_dim), limit)
        if fam.gemma4:
            extra["global_rope"] = rope.frequencies(gemma_rope["full_attention"], gemma["global_head_dim"], limit)
    except (rope.UnsupportedRope, KeyError) as exc:
        raise UnsupportedModel(f"config field rope_parameters/rope_scaling: {exc}") from None
    if fam.deepseek:  # the softmax scale: 1/sqrt(q/k head), times YaRN's mscale(factor, mscale_all_dim) squared
        mla["attn_scale"] = head_dim ** -0.5 * rope.deepseek_mscale(params) ** 2
    if fam.attn_scale_key:
        mla["attn_scale"] = _positive(cfg, fam.attn_scale_key)
    for _, key, _ in fam.weight_scales:
        _positive(cfg, key)

    dims = ModelDims(
        vocab_size=int(cfg["vocab_size"]), hidden_size=hidden,
        ffn_size=int(cfg[fam.expert_ffn_key]) if any_moe else 0,
        n_layers=n_layers, n_heads=heads,
        n_kv_heads=1 if fam.deepseek else int(cfg.get("num_key_value_heads") or heads),  # MLA: one shared latent
        head_dim=head_dim, n_experts=n_experts, top_k=top_k,
        max_seq=max_seq, rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope_theta=float(params["rope_theta"]),
        flags=flags, dense_ffn_size=int(cfg["intermediate_size"]) if any_dense or fam.gemma4 else 0,
        shared_ffn_size=mla.pop("shared_ffn_size", shared_ffn),
        clip_qkv=float(clip or 0.0), moe_layers=moe_layers, sliding_window=window, window_layers=window_layers, **mla,
    )
    if dims.n_heads % dims.n_kv_heads:
        raise UnsupportedModel(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={dims.n_kv_heads}")
    if any_moe and not 1 <= dims.top_k <= dims.n_experts:
        raise UnsupportedModel(f"num_experts_per_tok={dims.top_k} must be between 1 and the expert count {n_experts}")
    if n_experts > MAX_EXPERTS or dims.top_k > MAX_TOP_K:
        raise UnsupportedModel(f"{n_experts} experts, top-{dims.top_k}: the runtime takes at most {MAX_EXPERTS} experts "
                               f"per layer and top-{MAX_TOP_K} (config fields num_local_experts/num_experts_per_tok)")
    if not 0.0 < dims.rms_norm_eps < 1.0:
        raise UnsupportedModel(f"config field rms_norm_eps={dims.rms_norm_eps} must be in (0, 1)")
    extra.update(inv_freq=inv_freq, attention_factor=attention_factor)
    return dims, bool(cfg.get("tie_word_embeddings", fam.gemma4)), arch, extra


def _positive(cfg: dict, key: str) -> float:
    """A config field that must be a positive number whose f32 and its reciprocal are finite and nonzero (a scale the
    architecture multiplies or divides by, which the packer folds into f32 weights)."""
    value = cfg.get(key)
    f32 = np.finfo(np.float32)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not f32.tiny <= value <= 1 / f32.tiny:
        raise UnsupportedModel(f"config field {key}={value!r} must be a positive number between {f32.tiny:.3g} and "
                               f"{1 / f32.tiny:.3g}")
    return float(value)


def _shard_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [path / f for f in sorted(set(weight_map.values()))]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}")
    return files


# safetensors' element types (its format specification) that numpy holds
SAFETENSORS_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": ml_dtypes.bfloat16, "I64": "<i8", "I32": "<i4",
                      "I16": "<i2", "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?",
                      "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2}
MAX_SAFETENSORS_HEADER = 100_000_000  # safetensors' own limit on the JSON header


def read_safetensors(path: Path) -> dict[str, FileTensor]:
    """Every tensor of a safetensors file, unread: its header (a little-endian u64 length, then that many
    bytes of JSON giving each tensor's dtype, shape and data_offsets after the header) parsed once, checked
    against the file's size, so each tensor is later read by its offsets alone."""
    file = OpenFile(path)
    length = struct.unpack("<Q", file.read(8, 0))[0] if file.size >= 8 else None
    if length is None or length > min(MAX_SAFETENSORS_HEADER, file.size - 8):
        raise UnsupportedModel(f"{path}: not a safetensors file (its header length is missing or past its end)")
    try:
        header = json.loads(bytes(file.read(length, 8)))
    except ValueError as exc:
        raise UnsupportedModel(f"{path}: safetensors header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise UnsupportedModel(f"{path}: safetensors header is not a JSON object")
    out = {}
    for name, info in header.items():
        if name != "__metadata__":
            out[name] = _safetensors_entry(file, 8 + length, name, info)
    return out


def _safetensors_entry(file: OpenFile, data_start: int, name: str, info) -> FileTensor:
    """One header entry as a tensor to read, refused unless its bytes are exactly its shape's, inside the file."""
    try:
        dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        if not all(isinstance(n, int) and n >= 0 for n in (*shape, begin, end)):
            raise ValueError
    except (KeyError, TypeError, ValueError):
        raise UnsupportedModel(f"{file.path}: safetensors header entry {name!r} is not dtype, shape, data_offsets") from None
    if dtype not in SAFETENSORS_DTYPES:
        raise UnsupportedModel(f"{file.path}: tensor {name} has dtype {dtype}; readable: {', '.join(SAFETENSORS_DTYPES)}")
    stored = np.dtype(SAFETENSORS_DTYPES[dtype])
    if not begin <= end <= file.size - data_start or end - begin != math.prod(shape) * stored.itemsize:
        raise UnsupportedModel(f"{file.path}: tensor {name}: data_offsets [{begin}, {end}] do not hold shape "
                               f"{list(shape)} of {dtype} inside the file")
    return FileTensor(file, data_start + begin, stored, shape)


def _load_tensors(path: Path) -> dict[str, FileTensor]:
    """Every tensor of the checkpoint's shards, by name, unread (each shard's header read once)."""
    out: dict[str, FileTensor] = {}
    for shard in _shard_files(path):
        out.update(read_safetensors(shard))
    return out


def hf_name(fam: Family, role: Role, layer: int, expert: int) -> str:
    """The Hugging Face tensor name of a runtime tensor in this family."""
    p, a, m = f"model.layers.{layer}.", f"model.layers.{layer}.self_attn.", f"model.layers.{layer}.{fam.moe_prefix}."
    g, u, d = fam.expert_names
    sh = f"{p}mlp.{fam.shared_prefix}."
    return {
        Role.TOKEN_EMBD: "model.embed_tokens.weight", Role.OUTPUT_NORM: "model.norm.weight",
        Role.LM_HEAD: "lm_head.weight",
        Role.ATTN_NORM: p + "input_layernorm.weight", Role.FFN_NORM: p + "post_attention_layernorm.weight",
        Role.WQ: a + "q_proj.weight", Role.BQ: a + "q_proj.bias", Role.WK: a + "k_proj.weight",
        Role.BK: a + "k_proj.bias", Role.WV: a + "v_proj.weight", Role.BV: a + "v_proj.bias",
        Role.WO: a + "o_proj.weight", Role.BO: a + "o_proj.bias",
        Role.Q_NORM: a + "q_norm.weight", Role.K_NORM: a + "k_norm.weight",
        Role.WQ_A: a + "q_a_proj.weight", Role.Q_A_NORM: a + "q_a_layernorm.weight", Role.WQ_B: a + "q_b_proj.weight",
        Role.WKV_A: a + "kv_a_proj_with_mqa.weight", Role.KV_A_NORM: a + "kv_a_layernorm.weight",
        Role.WK_B: a + "kv_b_proj.weight", Role.WV_B: a + "kv_b_proj.weight",  # split by kv_b_part
        Role.ROUTER_BIAS: m + ("router.bias" if fam.gpt_oss else "gate.e_score_correction_bias"),
        Role.SINKS: a + "sinks",
        Role.DENSE_GATE: p + "mlp.gate_proj.weight", Role.DENSE_UP: p + "mlp.up_proj.weight",
        Role.DENSE_DOWN: p + "mlp.down_proj.weight",
        Role.ROUTER: m + fam.router_name,
        Role.SHARED_GATE: sh + "gate_proj.weight", Role.SHARED_UP: sh + "up_proj.weight",
        Role.SHARED_DOWN: sh + "down_proj.weight", Role.SHARED_EXPERT_GATE: p + "mlp.shared_expert_gate.weight",
        Role.EXPERT_GATE: m + f"experts.{expert}.{g}.weight", Role.EXPERT_UP: m + f"experts.{expert}.{u}.weight",
        Role.EXPERT_DOWN: m + f"experts.{expert}.{d}.weight",
    }[role]


def kv_b_shape(d: ModelDims, role: Role) -> tuple[int, int]:
    nope, lat = d.head_dim - d.rope_width, d.kv_lora_rank
    return (d.n_heads * lat, nope) if role == Role.WK_B else (d.n_heads * d.v_dim, lat)


def kv_b_split(kv_b: np.ndarray, d: ModelDims, role: Role) -> np.ndarray:
    """kv_b_proj [H * (nope + v_head), kv_lora] as WK_B (every head's W_UK transposed, stacked: [H * kv_lora,
    nope]) or WV_B (every head's W_UV: [H * v_head, kv_lora]): the absorbed form's matrices (docs/MODELS.md)."""
    nope, lat = d.head_dim - d.rope_width, d.kv_lora_rank
    heads = kv_b.reshape(d.n_heads, nope + d.v_dim, lat)
    if role == Role.WK_B:
        return np.ascontiguousarray(heads[:, :nope, :].transpose(0, 2, 1)).reshape(d.n_heads * lat, nope)
    return np.ascontiguousarray(heads[:, nope:, :]).reshape(d.n_heads * d.v_dim, lat)


def kv_b_join(k_b: np.ndarray, v_b: np.ndarray, n_heads: int) -> np.ndarray:
    """kv_b_proj [H * (nope + v_head), kv_lora] from its two parts (kv_b_split's inverse: a GGUF file's
    attn_k_b and attn_v_b back into the matrix transformers loads)."""
    lat = k_b.shape[0] // n_heads
    k_heads = k_b.reshape(n_heads, lat, -1).transpose(0, 2, 1)  # [H, nope, lat]
    v_heads = v_b.reshape(n_heads, -1, lat)                      # [H, v_head, lat]
    return np.concatenate([k_heads, v_heads], axis=1).reshape(-1, lat)


def kv_b_part(t: np.ndarray | LazyTensor, d: ModelDims, role: Role) -> np.ndarray | LazyTensor:
    """WK_B or WV_B of a kv_b_proj tensor: computed now from values in memory, or when read from a file."""
    if isinstance(t, LazyTensor):
        return Derived(kv_b_shape(d, role), lambda: kv_b_split(np.asarray(t), d, role))
    return kv_b_split(np.asarray(t, dtype=np.float32), d, role)


GPT_OSS_EXPERTS = (Role.EXPERT_GATE, Role.EXPERT_UP, Role.EXPERT_DOWN, Role.EXPERT_GATE_BIAS, Role.EXPERT_UP_BIAS,
                   Role.EXPERT_DOWN_BIAS)


def gpt_oss_expert_tensor(raw: dict, d: ModelDims, role: Role, layer: int, expert: int) -> tuple[list[str], object]:
    """(checkpoint names read, tensor) for a routed expert's matrix or a layer's expert bias table, from gpt-oss's
    fused experts: gate_up_proj [E, D, 2F] (gate and up interleaved by column), down_proj [E, F, D], or their
    MXFP4 blocks and scales ([E, out, in / 32, 16] and [E, out, in / 32], not transposed), and the biases
    gate_up_proj_bias [E, 2F], down_proj_bias [E, D]."""
    p = f"model.layers.{layer}.mlp.experts."
    if role in (Role.EXPERT_GATE_BIAS, Role.EXPERT_UP_BIAS):
        t = raw[p + "gate_up_proj_bias"]
        first = 0 if role == Role.EXPERT_GATE_BIAS else 1
        return [p + "gate_up_proj_bias"], np.ascontiguousarray(np.asarray(t, np.float32)[:, first::2])
    if role == Role.EXPERT_DOWN_BIAS:
        return [p + "down_proj_bias"], raw[p + "down_proj_bias"]
    fused = "down_proj" if role == Role.EXPERT_DOWN else "gate_up_proj"
    rows = slice(None) if role == Role.EXPERT_DOWN else slice(0 if role == Role.EXPERT_GATE else 1, None, 2)
    shape = (d.hidden_size, d.ffn_size) if role == Role.EXPERT_DOWN else (d.ffn_size, d.hidden_size)
    if p + fused + "_blocks" in raw:  # MXFP4: [E, out, in] once dequantized
        blocks, scales = raw[p + fused + "_blocks"], raw[p + fused + "_scales"]
        compute = lambda: mxfp4_dequantize(expert_of(blocks, expert), expert_of(scales, expert))[rows]  # noqa: E731
        return [p + fused + "_blocks", p + fused + "_scales"], _derived(blocks, shape, compute)
    source = raw[p + fused]
    compute = lambda: np.asarray(expert_of(source, expert), np.float32).T[rows]  # noqa: E731
    return [p + fused], _derived(source, shape, compute)


def _scaled(t, factor: np.float32, divide: bool):
    """t times factor (divided by it with `divide`), in f32, computed when read if t is."""
    return _derived(t, tuple(t.shape), lambda: np.asarray(t, np.float32) / factor if divide
                    else np.asarray(t, np.float32) * factor)


def _derived(origin, shape: tuple[int, ...], compute):
    return Derived(shape, compute) if isinstance(origin, LazyTensor) else np.ascontiguousarray(compute())


GEMMA4_NAMES = {Role.FFN_NORM: "pre_feedforward_layernorm.weight", Role.POST_ATTN_NORM: "post_attention_layernorm.weight",
                Role.POST_FFN_NORM: "post_feedforward_layernorm.weight",
                Role.DENSE_POST_NORM: "post_feedforward_layernorm_1.weight",
                Role.MOE_NORM: "pre_feedforward_layernorm_2.weight", Role.MOE_POST_NORM: "post_feedforward_layernorm_2.weight",
                Role.ROUTER: "router.proj.weight", Role.EXPERT_SCALE: "router.per_expert_scale",
                Role.LAYER_SCALE: "layer_scalar", Role.PLE_GATE: "per_layer_input_gate.weight",
                Role.PLE_PROJ: "per_layer_projection.weight", Role.PLE_POST_NORM: "post_per_layer_input_norm.weight"}
GEMMA4_GLOBALS = {Role.PLE_EMBD: "model.embed_tokens_per_layer.weight",
                  Role.PLE_MODEL_PROJ: "model.per_layer_model_projection.weight",
                  Role.PLE_PROJ_NORM: "model.per_layer_projection_norm.weight"}


def gemma4_tensor(raw: dict, d: ModelDims, role: Role, layer: int, expert: int) -> tuple[list[str], object]:
    """(checkpoint names read, tensor) for a Gemma 4 tensor stored other than the common names say: its norms and
    router parts; ROUTER_NORM is router.scale times hidden_size^-0.5 (the router multiplies its weightless norm by
    both, rounded once here); the experts fused as gate_up_proj [E, 2F, D] (gate rows first) and down_proj [E, D, F]."""
    if role in GEMMA4_GLOBALS:
        return [GEMMA4_GLOBALS[role]], raw[GEMMA4_GLOBALS[role]]
    p = f"model.layers.{layer}."
    if role == Role.ROUTER_NORM:
        t = raw[p + "router.scale"]
        return [p + "router.scale"], np.asarray(t, np.float32) * np.float32(d.hidden_size ** -0.5)
    if role in EXPERT_ROLES:
        return fused_expert_tensor(raw, d, p + "experts.gate_up_proj", p + "experts.down_proj", role, expert)
    return [p + GEMMA4_NAMES[role]], raw[p + GEMMA4_NAMES[role]]


def fused_expert_tensor(raw: dict, d: ModelDims, gate_up: str, down: str, role: Role, expert: int) -> tuple[list[str], object]:
    """(checkpoint names read, tensor) for a routed expert's matrix from a layer's fused experts: gate and up as
    `gate_up` [E, 2F, D], gate rows first, and down as `down` [E, D, F]."""
    F, D, E = d.ffn_size, d.hidden_size, d.n_experts
    fused = down if role == Role.EXPERT_DOWN else gate_up
    rows = {Role.EXPERT_GATE: slice(0, F), Role.EXPERT_UP: slice(F, 2 * F), Role.EXPERT_DOWN: slice(None)}[role]
    shape = (D, F) if role == Role.EXPERT_DOWN else (F, D)
    source = raw[fused]
    stored = (E, D, F) if role == Role.EXPERT_DOWN else (E, 2 * F, D)
    if tuple(source.shape) != stored:  # the config's sizes must describe the tensor the rows are cut from
        raise UnsupportedModel(f"checkpoint tensor {fused} has shape {list(source.shape)}; the config's expert count, "
                               f"expert size and hidden_size make it {list(stored)}")
    return [fused], _derived(source, shape, lambda: np.asarray(expert_of(source, expert), np.float32)[rows])


def checkpoint_tensor(raw: dict, fam: Family, d: ModelDims, key: tuple[Role, int, int]) -> tuple[list[str], object]:
    """(the checkpoint names read, the tensor) for a runtime tensor: as stored, or in the runtime's layout from what
    the family stores instead (gpt-oss's fused experts; DeepSeek's kv_b_proj, which a GGUF file holds split
    already). KeyError names a missing tensor."""
    role = key[0]
    if fam.gpt_oss and role in GPT_OSS_EXPERTS:
        return gpt_oss_expert_tensor(raw, d, *key)
    if fam.gemma4 and (role in GEMMA4_NAMES or role in GEMMA4_GLOBALS or role in EXPERT_ROLES or role == Role.ROUTER_NORM):
        return gemma4_tensor(raw, d, *key)
    m = f"model.layers.{key[1]}.{fam.moe_prefix}."
    if fam.fused_experts and role in EXPERT_ROLES and m + fam.fused_experts[0] in raw:
        return fused_expert_tensor(raw, d, m + fam.fused_experts[0], m + fam.fused_experts[1], role, key[2])
    name = hf_name(fam, *key)
    if role in (Role.WK_B, Role.WV_B):
        split = name.replace("kv_b_proj", "k_b_proj" if role == Role.WK_B else "v_b_proj")
        if split in raw:  # llama.cpp's converter split it as the runtime does
            return [split], raw[split]
        return [name], kv_b_part(raw[name], d, role)
    return [name], raw[name]


# multimodal architectures whose text model is a supported causal LM: the text model is packed, the towers left out
MULTIMODAL = {"Gemma4ForConditionalGeneration": "Gemma4ForCausalLM"}
LANGUAGE_MODEL, TOWERS = "model.language_model.", ("model.vision_tower.", "model.embed_vision.", "model.audio_tower.",
                                                   "model.embed_audio.")


def text_model(cfg: dict, raw: dict) -> tuple[dict, dict, int]:
    """A multimodal checkpoint's text model (its text_config as the causal LM's config, its language model's tensors
    under the causal LM's names) and how many vision and audio tower tensors were left out; anything else as given."""
    arch = next((a for a in cfg.get("architectures") or [] if a in MULTIMODAL), None)
    if arch is None:
        return cfg, raw, 0
    if not isinstance(cfg.get("text_config"), dict):
        raise UnsupportedModel(f"config field text_config is missing: {arch} keeps its text model's config there")
    text = {**cfg["text_config"], "architectures": [MULTIMODAL[arch]]}
    text["tie_word_embeddings"] = cfg.get("tie_word_embeddings", True)  # the multimodal model's lm_head is tied by it
    out, towers = {}, 0
    for name, t in raw.items():
        if name.startswith(TOWERS):
            towers += 1
        else:
            out["model." + name[len(LANGUAGE_MODEL):] if name.startswith(LANGUAGE_MODEL) else name] = t
    return text, out, towers


def load_checkpoint(path: Path | str, max_seq: int | None, norm_topk_prob: bool | None = None) -> Checkpoint:
    """A Hugging Face checkpoint directory or a .gguf file, mapped to the runtime's description.
    `norm_topk_prob` overrides (or supplies, for a GGUF file that lacks it) the routing renormalization."""
    path = Path(path)
    if path.suffix == ".gguf" and path.is_file():
        from colibri.gguf_input import GGUFError, read_gguf
        try:
            cfg, raw, converted = read_gguf(path, norm_topk_prob)
        except GGUFError as exc:
            raise UnsupportedModel(str(exc)) from None
    elif (path / "config.json").exists():
        try:
            cfg = json.loads((path / "config.json").read_text())
        except ValueError as exc:
            raise UnsupportedModel(f"{path / 'config.json'} is not valid JSON: {exc}") from None
        if not isinstance(cfg, dict):
            raise UnsupportedModel(f"{path / 'config.json'} is not a JSON object")
        if norm_topk_prob is not None:
            cfg["norm_topk_prob"] = norm_topk_prob
        raw = _load_tensors(path)
        converted = {}
    else:
        raise FileNotFoundError(f"{path} is neither a .gguf file nor a directory with config.json")
    cfg, raw, towers = text_model(cfg, raw)
    try:
        dims, tied, arch, extra = read_config(cfg, max_seq)
    except KeyError as exc:
        raise UnsupportedModel(f"{path}: the config has no {exc}, which its architecture needs") from None
    fam = FAMILIES[arch]
    keys = [(Role.TOKEN_EMBD, NO_INDEX, NO_INDEX), (Role.OUTPUT_NORM, NO_INDEX, NO_INDEX)]
    keys += [(r, NO_INDEX, NO_INDEX) for r in (Role.PLE_EMBD, Role.PLE_MODEL_PROJ, Role.PLE_PROJ_NORM) if dims.present(r)]
    for layer in range(dims.n_layers):
        keys += [(r, layer, NO_INDEX) for r in LAYER_ROLES if dims.present(r, layer)]
        if dims.moe_layers[layer]:
            keys += [(r, layer, e) for e in range(dims.n_experts) for r in EXPERT_ROLES]
    lm_head = (Role.LM_HEAD, NO_INDEX, NO_INDEX)
    if not tied or "lm_head.weight" in raw:
        keys.append(lm_head)
    tensors: dict[tuple[Role, int, int], np.ndarray] = {}
    used = set()
    for key in keys:
        try:
            names, tensors[key] = checkpoint_tensor(raw, fam, dims, key)
        except KeyError as exc:
            raise UnsupportedModel(f"checkpoint is missing tensor {exc.args[0]}") from None
        used.update(names)
    if lm_head not in tensors:
        tensors[lm_head] = tensors[(Role.TOKEN_EMBD, NO_INDEX, NO_INDEX)]  # same object: stored once
    for role, config_key, divide in fam.weight_scales:  # each scaled tensor a new object (tied ones part here)
        for key in [k for k in tensors if k[0] == role]:
            tensors[key] = _scaled(tensors[key], np.float32(cfg[config_key]), divide)
    tied = tied and tensors[lm_head] is tensors[(Role.TOKEN_EMBD, NO_INDEX, NO_INDEX)]  # stored once only when still one
    unused = sorted(name for name, t in raw.items() if name not in used and t.size)  # empty ones add nothing
    if unused:
        raise UnsupportedModel(f"checkpoint has tensors the runtime would ignore: {', '.join(unused[:5])}"
                               + (" ..." if len(unused) > 5 else ""))
    cos, sin = rope.tables(extra["inv_freq"], extra["attention_factor"], dims.max_seq)
    tensors[(Role.ROPE_COS, NO_INDEX, NO_INDEX)] = cos
    tensors[(Role.ROPE_SIN, NO_INDEX, NO_INDEX)] = sin
    if "global_rope" in extra:
        cos, sin = rope.tables(*extra["global_rope"], dims.max_seq)
        tensors[(Role.GLOBAL_ROPE_COS, NO_INDEX, NO_INDEX)] = cos
        tensors[(Role.GLOBAL_ROPE_SIN, NO_INDEX, NO_INDEX)] = sin
    tables = (Role.ROPE_COS, Role.ROPE_SIN, Role.GLOBAL_ROPE_COS, Role.GLOBAL_ROPE_SIN)

    weights = {id(a): a for k, a in tensors.items() if k[0] not in tables}
    n_params = sum(a.size for a in weights.values())
    idle_experts = sum(dims.n_experts - dims.top_k for moe in dims.moe_layers if moe)
    n_active = n_params - idle_experts * 3 * dims.hidden_size * dims.ffn_size
    return Checkpoint(dims, tensors, arch, tied, n_params, n_active, converted, towers)
