"""Gemma 4: its layer, attention and RoPE per layer type (docs/MODELS.md). Its config's fields, flags and two RoPE
settings (`derive`), every layer MoE or none, a head of 256 by default, and its tensors stored under names of
their own (`tensor`)."""
from __future__ import annotations

import numpy as np

from colibri.families.base import ConfigContext, Family, OwnFields, UnsupportedModel, fused_expert_tensor
from colibri.format import EXPERT_ROLES, Role
from colibri.dims import FLAG_GELU_TANH, FLAG_GEMMA4_LAYER, FLAG_NORM_TOPK, FLAG_QK_NORM_HEAD, FLAG_V_NORM

OWN_KEYS = ("hidden_activation", "enable_moe_block", "top_k_experts", "final_logit_softcapping", "per_layer_config",
            "global_head_dim", "num_global_key_value_heads", "attention_k_eq_v", "use_bidirectional_attention",
            "hidden_size_per_layer_input", "vocab_size_per_layer_input", "num_kv_shared_layers", "use_double_wide_mlp")


def moe_layers(cfg: dict, n_layers: int) -> tuple[bool, ...]:
    """Every layer, beside its dense MLP, or none."""
    return (bool(cfg.get("enable_moe_block")),) * n_layers


def head_dim(cfg: dict) -> int:
    return int(cfg.get("head_dim") or 256)  # Gemma4TextConfig's default


def layer_types(cfg: dict, n_layers: int) -> list[str]:
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


def derive(cfg: dict, ctx: ConfigContext) -> OwnFields:
    """Gemma 4's mechanisms as ModelDims fields and flags, and its two RoPE settings (docs/MODELS.md): the layer with
    its extra norms and scalar, the dense MLP beside the experts, the router's norm and per-expert scales; sliding
    layers of head_dim and global layers of their own head size, KV heads and RoPE; v from k on global layers with
    attention_k_eq_v; the embedding scale and the final logit soft-capping."""
    n_layers, head_dim, max_seq = ctx.n_layers, ctx.head_dim, ctx.max_seq
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
    types = layer_types(cfg, n_layers)
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
                  dense_ffn_size=int(cfg["intermediate_size"]),  # every layer has its dense MLP
                  # a window the sequence never outgrows is kept (at max_seq): the layer kinds differ in more than it
                  sliding_window=min(window, max_seq) if any(sliding) else 0, window_layers=sliding)
    params = cfg.get("rope_parameters") or {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}}
    if set(params) != {"sliding_attention", "full_attention"}:
        raise UnsupportedModel(f"config field rope_parameters={params!r}: Gemma 4 gives one per layer type "
                               "(sliding_attention, full_attention)")
    return OwnFields(fields, flags, params)


NAMES = {Role.FFN_NORM: "pre_feedforward_layernorm.weight", Role.POST_ATTN_NORM: "post_attention_layernorm.weight",
         Role.POST_FFN_NORM: "post_feedforward_layernorm.weight",
         Role.DENSE_POST_NORM: "post_feedforward_layernorm_1.weight",
         Role.MOE_NORM: "pre_feedforward_layernorm_2.weight", Role.MOE_POST_NORM: "post_feedforward_layernorm_2.weight",
         Role.ROUTER: "router.proj.weight", Role.EXPERT_SCALE: "router.per_expert_scale",
         Role.LAYER_SCALE: "layer_scalar", Role.PLE_GATE: "per_layer_input_gate.weight",
         Role.PLE_PROJ: "per_layer_projection.weight", Role.PLE_POST_NORM: "post_per_layer_input_norm.weight"}
GLOBALS = {Role.PLE_EMBD: "model.embed_tokens_per_layer.weight",
           Role.PLE_MODEL_PROJ: "model.per_layer_model_projection.weight",
           Role.PLE_PROJ_NORM: "model.per_layer_projection_norm.weight"}


def tensor(raw: dict, d, key: tuple[Role, int, int]) -> tuple[list[str], object] | None:
    """(checkpoint names read, tensor) for a Gemma 4 tensor stored other than the common names say: its norms and
    router parts; ROUTER_NORM is router.scale times hidden_size^-0.5 (the router multiplies its weightless norm by
    both, rounded once here); the experts fused as gate_up_proj [E, 2F, D] (gate rows first) and down_proj [E, D, F]."""
    role, layer, expert = key
    if role in GLOBALS:
        return [GLOBALS[role]], raw[GLOBALS[role]]
    p = f"model.layers.{layer}."
    if role == Role.ROUTER_NORM:
        t = raw[p + "router.scale"]
        return [p + "router.scale"], np.asarray(t, np.float32) * np.float32(d.hidden_size ** -0.5)
    if role in EXPERT_ROLES:
        return fused_expert_tensor(raw, d, p + "experts.gate_up_proj", p + "experts.down_proj", role, expert)
    if role in NAMES:
        return [p + NAMES[role]], raw[p + NAMES[role]]
    return None


FAMILIES = {
    "Gemma4ForCausalLM": Family(moe=True, expert_ffn_key="moe_intermediate_size", moe_prefix="",
                                expert_names=("", "", ""), qk_norm=FLAG_QK_NORM_HEAD, top_k_key="top_k_experts",
                                tied_default=True, routes_itself=True, own_keys=OWN_KEYS,
                                moe_layer_rule=moe_layers, head_dim_rule=head_dim, derive=derive, tensor=tensor),
}
