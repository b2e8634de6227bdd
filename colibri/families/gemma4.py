"""Gemma 4: its layer, attention and RoPE per layer type (docs/MODELS.md). Its config's fields, flags and two RoPE
settings (`derive`), every layer MoE or none, a head of 256 by default, and its tensors stored under names of
their own (`tensor`). A gemma4 GGUF file as llama.cpp's converter writes it (conversion/gemma.py's Gemma4Model) is read
back into that config and those names (`gguf_config`, `gguf_tensors`): the per-layer KV heads and MLP widths, the
proportional RoPE of the global layers from its rope_freqs factors, the experts' fused gate and up kept as stored."""
from __future__ import annotations

import math

import numpy as np

from colibri.families.base import ConfigContext, Family, OwnFields, UnsupportedModel, fused_expert_tensor
from colibri.format import EXPERT_ROLES, Role
from colibri.dims import FLAG_GELU_TANH, FLAG_GEMMA4_LAYER, FLAG_NORM_TOPK, FLAG_QK_NORM_HEAD, FLAG_V_NORM
from colibri.gguf_common import MODEL_TENSOR, GGUFError, GGUFFile, Keys, floats, gguf_name

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


# the logit cap llama.cpp applies to a gemma4 file without the key (src/llama-hparams.h's default, which gemma4.cpp
# keeps when the key is absent: the converter writes none for a config whose cap is null), 0 none; Gemma 4's released
# configs state 30. And its sliding layers' RoPE base where the file states none
LLAMA_CPP_SOFTCAP, LLAMA_CPP_SWA_THETA = 30.0, 10_000.0
# the factor llama.cpp's converter gives the dimensions proportional RoPE leaves unturned (rope_freqs): a frequency
# divided by it is zero in f32, so they keep their values, as transformers' zero inverse frequencies do
UNTURNED = np.float32(1e30)


def gguf_config(f: GGUFFile) -> dict:
    """The Gemma4TextConfig fields of a gemma4 file: the layer kinds from sliding_window_pattern; the sliding layers'
    head size, KV heads and RoPE base (the *_swa keys), the global layers' as per_layer_config; keys as values where no
    global layer has a v projection; the KV-sharing layers, the MLP twice as wide on them where feed_forward_length
    says so; per-layer inputs; the experts; proportional RoPE's rotated share from the rope_freqs factors. A key the
    file lacks is what llama.cpp takes for it (src/llama-model.cpp, src/llama-hparams.h): the sliding head size and
    rotation the global ones', a sliding RoPE base of 10,000, a logit cap of 30."""
    field, k, n_layers, tensors = f.field, f.key, f.n_layers, f.tensors

    def real(key: str, default: float) -> float:
        value = field(k(key), default, required=False)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise GGUFError(f"GGUF key {k(key)}={value!r}: a finite number, at least 0, was expected")
        return float(value)
    pattern = field(k(Keys.Attention.SLIDING_WINDOW_PATTERN))
    if not isinstance(pattern, list) or len(pattern) != n_layers or any(not isinstance(p, bool) for p in pattern):
        raise GGUFError(f"GGUF key {k(Keys.Attention.SLIDING_WINDOW_PATTERN)}: a flag for each of the {n_layers} layers")
    if pattern[-1]:  # (transformers makes it global whatever the config says; llama.cpp would window it)
        raise GGUFError(f"GGUF key {k(Keys.Attention.SLIDING_WINDOW_PATTERN)}: Gemma 4's last layer attends over every "
                        "position, not a sliding window")
    if field(k(Keys.Rope.SCALING_TYPE), "none", required=False) != "none":
        raise GGUFError(f"GGUF key {k(Keys.Rope.SCALING_TYPE)}={field(k(Keys.Rope.SCALING_TYPE))!r}: Gemma 4's RoPE is "
                        "not scaled in transformers")
    types = ["sliding_attention" if p else "full_attention" for p in pattern]
    full = f.number(Keys.Attention.KEY_LENGTH)
    head = {"full_attention": full, "sliding_attention": f.number(Keys.Attention.KEY_LENGTH_SWA, full)}
    turned = {"full_attention": f.number(Keys.Rope.DIMENSION_COUNT, full)}
    turned["sliding_attention"] = f.number(Keys.Rope.DIMENSION_COUNT_SWA, turned["full_attention"])
    for kind, keys in (("sliding_attention", (Keys.Attention.KEY_LENGTH_SWA, Keys.Attention.VALUE_LENGTH_SWA,
                                              Keys.Rope.DIMENSION_COUNT_SWA)),
                       ("full_attention", (Keys.Attention.KEY_LENGTH, Keys.Attention.VALUE_LENGTH,
                                           Keys.Rope.DIMENSION_COUNT))):
        if head[kind] < 2 or head[kind] % 2 or f.number(keys[1], head[kind]) != head[kind] or turned[kind] != head[kind]:
            raise GGUFError(f"GGUF keys {', '.join(k(key) for key in keys)}: Gemma 4's {kind.split('_')[0]} layers have "
                            f"one even head size for keys and values ({head[kind]}), turned whole (or as rope_freqs "
                            f"says), not {turned[kind]}")
    kv_heads = f.layer_kv_heads or (f.n_head_kv,) * n_layers
    kv = {kind: {h for h, t in zip(kv_heads, types) if t == kind} for kind in head}
    if any(len(counts) > 1 or 0 in counts or f.n_head % max(counts, default=1) for counts in kv.values()):
        raise GGUFError(f"GGUF key {k(Keys.Attention.HEAD_COUNT_KV)}: one KV head count for each layer kind, dividing "
                        f"the {f.n_head} heads (sliding {sorted(kv['sliding_attention'])}, global {sorted(kv['full_attention'])})")
    for layer, kind in enumerate(types):  # (the head sizes checked against the tensors before anything is sized by them)
        for t, rows in ((MODEL_TENSOR.ATTN_Q, f.n_head * head[kind]), (MODEL_TENSOR.ATTN_K, min(kv[kind]) * head[kind])):
            name = gguf_name(t, layer) + ".weight"
            if name in tensors and tensors[name].shape[0] != rows:
                raise GGUFError(f"GGUF tensor {name} has {tensors[name].shape[0]} rows: the heads and head sizes of the "
                                f"file's keys make {rows}")
    shared = f.number(Keys.Attention.SHARED_KV_LAYERS, 0)
    if shared >= n_layers:
        raise GGUFError(f"GGUF key {k(Keys.Attention.SHARED_KV_LAYERS)}={shared}: fewer than the {n_layers} layers, "
                        "so that some layer computes keys and values")
    first_shared = n_layers - shared
    widths = f.layer_ffn or (f.number(Keys.LLM.FEED_FORWARD_LENGTH),) * n_layers
    base = widths[0]
    sharing = set(widths[first_shared:])
    double = sharing == {2 * base}
    if base < 1 or set(widths[:first_shared]) != {base} or sharing - {base} and not double:
        raise GGUFError(f"GGUF key {k(Keys.LLM.FEED_FORWARD_LENGTH)}={list(widths)}: one MLP width, or twice it on the "
                        f"{shared} layers that share their KV cache (use_double_wide_mlp)")
    has_v = {layer: gguf_name(MODEL_TENSOR.ATTN_V, layer) + ".weight" in tensors for layer in range(first_shared)}
    global_v = {has_v[layer] for layer in has_v if types[layer] == "full_attention"}
    if len(global_v) > 1 or not all(has_v[layer] for layer in has_v if types[layer] == "sliding_attention"):
        raise GGUFError("GGUF file: Gemma 4's sliding layers each have attn_v, and its global layers all (or none: "
                        "their keys are their values, attention_k_eq_v) that compute keys and values")
    routers = {gguf_name(MODEL_TENSOR.FFN_GATE_INP, layer) + ".weight" in tensors for layer in range(n_layers)}
    if routers != {bool(f.n_experts)}:
        raise GGUFError(f"GGUF file: {k(Keys.LLM.EXPERT_COUNT)}={f.n_experts}, and routers in "
                        f"{'some' if len(routers) > 1 else 'no' if f.n_experts else 'all'} layers: Gemma 4 routes every "
                        "layer or none")
    theta, theta_swa = real(Keys.Rope.FREQ_BASE, 0.0), real(Keys.Rope.FREQ_BASE_SWA, LLAMA_CPP_SWA_THETA)
    if not (theta and theta_swa):
        raise GGUFError(f"GGUF keys {k(Keys.Rope.FREQ_BASE)}={theta}, {k(Keys.Rope.FREQ_BASE_SWA)}={theta_swa}: "
                        "RoPE bases above 0")
    cfg = {
        "layer_types": types, "head_dim": head["sliding_attention"],
        "num_key_value_heads": next(iter(kv["sliding_attention"] or kv["full_attention"])),
        "per_layer_config": {str(layer): {"head_dim": head["full_attention"],
                                          "num_key_value_heads": next(iter(kv["full_attention"]))}
                             for layer, t in enumerate(types) if t == "full_attention"},
        "attention_k_eq_v": global_v == {False}, "num_kv_shared_layers": shared, "use_double_wide_mlp": double,
        "intermediate_size": base, "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size_per_layer_input": f.number(Keys.LLM.EMBD_LENGTH_PER_LAYER_INP, 0),
        "vocab_size_per_layer_input": int(tensors[gguf_name(MODEL_TENSOR.TOKEN_EMBD) + ".weight"].shape[0]),
        "sliding_window": f.number(Keys.Attention.SLIDING_WINDOW, None if True in pattern else 0),
        "final_logit_softcapping": real(Keys.LLM.FINAL_LOGIT_SOFTCAPPING, LLAMA_CPP_SOFTCAP) or None,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": theta_swa},
            "full_attention": {"rope_type": "proportional", "rope_theta": theta,
                               "partial_rotary_factor": rotated_share(f, head["full_attention"])}},
        "enable_moe_block": bool(f.n_experts),
    }
    if f.n_experts:
        cfg.update(num_experts=f.n_experts, top_k_experts=f.number(Keys.LLM.EXPERT_USED_COUNT),
                   moe_intermediate_size=f.number(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH))
    return cfg


def rotated_share(f: GGUFFile, head_dim: int) -> float:
    """Proportional RoPE's partial_rotary_factor from the converter's rope_freqs: a factor per dimension pair of the
    global heads, 1 for the pairs turned, then 1e30 for the rest (any other factors are not proportional RoPE)."""
    name = gguf_name(MODEL_TENSOR.ROPE_FREQS) + ".weight"
    if name not in f.tensors:
        raise GGUFError(f"GGUF file lacks tensor {name}: Gemma 4's global layers turn part of each head (proportional "
                        "RoPE), which llama.cpp's converter writes as those factors")
    t = f.tensors[name]
    if tuple(t.shape) != (head_dim // 2,):
        raise GGUFError(f"GGUF tensor {name} has shape {tuple(t.shape)}: one factor per pair of the {head_dim}-wide "
                        "global heads")
    factors = floats(t.load())
    turned = int(np.argmax(factors != 1)) if (factors != 1).any() else len(factors)
    if turned == 0 or not (factors[turned:] == UNTURNED).all():
        raise GGUFError(f"GGUF tensor {name}: factors other than proportional RoPE's (1 for the pairs turned, then 1e30):"
                        f" {factors[:8].tolist()}...")
    return 2 * turned / head_dim


# llama.cpp's tensors -> transformers' names (under model.layers.N. for a layer's)
GGUF_GLOBALS = {(MODEL_TENSOR.TOKEN_EMBD, "weight"): "model.embed_tokens.weight",
                (MODEL_TENSOR.OUTPUT_NORM, "weight"): "model.norm.weight", (MODEL_TENSOR.OUTPUT, "weight"): "lm_head.weight",
                (MODEL_TENSOR.PER_LAYER_TOKEN_EMBD, "weight"): GLOBALS[Role.PLE_EMBD],
                (MODEL_TENSOR.PER_LAYER_MODEL_PROJ, "weight"): GLOBALS[Role.PLE_MODEL_PROJ],
                (MODEL_TENSOR.PER_LAYER_PROJ_NORM, "weight"): GLOBALS[Role.PLE_PROJ_NORM]}
GGUF_LAYER = {
    (MODEL_TENSOR.ATTN_NORM, "weight"): "input_layernorm.weight", (MODEL_TENSOR.ATTN_Q, "weight"): "self_attn.q_proj.weight",
    (MODEL_TENSOR.ATTN_K, "weight"): "self_attn.k_proj.weight", (MODEL_TENSOR.ATTN_V, "weight"): "self_attn.v_proj.weight",
    (MODEL_TENSOR.ATTN_OUT, "weight"): "self_attn.o_proj.weight", (MODEL_TENSOR.ATTN_Q_NORM, "weight"): "self_attn.q_norm.weight",
    (MODEL_TENSOR.ATTN_K_NORM, "weight"): "self_attn.k_norm.weight",
    (MODEL_TENSOR.ATTN_POST_NORM, "weight"): NAMES[Role.POST_ATTN_NORM], (MODEL_TENSOR.FFN_NORM, "weight"): NAMES[Role.FFN_NORM],
    (MODEL_TENSOR.FFN_GATE, "weight"): "mlp.gate_proj.weight", (MODEL_TENSOR.FFN_UP, "weight"): "mlp.up_proj.weight",
    (MODEL_TENSOR.FFN_DOWN, "weight"): "mlp.down_proj.weight", (MODEL_TENSOR.FFN_POST_NORM, "weight"): NAMES[Role.POST_FFN_NORM],
    (MODEL_TENSOR.FFN_GATE_INP, "weight"): NAMES[Role.ROUTER], (MODEL_TENSOR.FFN_GATE_INP, "scale"): "router.scale",
    (MODEL_TENSOR.FFN_DOWN_EXP, "scale"): NAMES[Role.EXPERT_SCALE],
    (MODEL_TENSOR.FFN_PRE_NORM_2, "weight"): NAMES[Role.MOE_NORM],
    (MODEL_TENSOR.FFN_POST_NORM_1, "weight"): NAMES[Role.DENSE_POST_NORM],
    (MODEL_TENSOR.FFN_POST_NORM_2, "weight"): NAMES[Role.MOE_POST_NORM],
    (MODEL_TENSOR.FFN_GATE_UP_EXP, "weight"): "experts.gate_up_proj", (MODEL_TENSOR.FFN_DOWN_EXP, "weight"): "experts.down_proj",
    (MODEL_TENSOR.LAYER_OUT_SCALE, "weight"): NAMES[Role.LAYER_SCALE],
    (MODEL_TENSOR.PER_LAYER_INP_GATE, "weight"): NAMES[Role.PLE_GATE],
    (MODEL_TENSOR.PER_LAYER_PROJ, "weight"): NAMES[Role.PLE_PROJ],
    (MODEL_TENSOR.PER_LAYER_POST_NORM, "weight"): NAMES[Role.PLE_POST_NORM],
}


def gguf_tensors(f: GGUFFile) -> dict:
    """A gemma4 file's tensors under transformers' names, each as stored (its layouts are transformers': the experts'
    gate and up fused [E, 2F, D], gate rows first, as Gemma4TextExperts holds them; the norms as w), but the
    rope_freqs factors, read into the config; any tensor left over is refused."""
    pending = dict(f.tensors)
    pending.pop(gguf_name(MODEL_TENSOR.ROPE_FREQS) + ".weight", None)
    out = {}
    for (t, kind), name in GGUF_GLOBALS.items():
        if f"{gguf_name(t)}.{kind}" in pending:
            out[name] = pending.pop(f"{gguf_name(t)}.{kind}")
    for layer in range(f.n_layers):
        for (t, kind), name in GGUF_LAYER.items():
            if f"{gguf_name(t, layer)}.{kind}" in pending:
                out[f"model.layers.{layer}.{name}"] = pending.pop(f"{gguf_name(t, layer)}.{kind}")
    if pending:
        raise GGUFError(f"GGUF tensors the runtime would not use: {', '.join(sorted(pending)[:5])}")
    return out


FAMILIES = {
    "Gemma4ForCausalLM": Family(moe=True, expert_ffn_key="moe_intermediate_size", moe_prefix="",
                                expert_names=("", "", ""), qk_norm=FLAG_QK_NORM_HEAD, top_k_key="top_k_experts",
                                tied_default=True, routes_itself=True, own_keys=OWN_KEYS,
                                moe_layer_rule=moe_layers, head_dim_rule=head_dim, derive=derive, tensor=tensor,
                                gguf_arch="gemma4", gguf_read_config=gguf_config, gguf_read_tensors=gguf_tensors,
                                gguf_key_length_is_head=False,
                                gguf_per_layer=(Keys.Attention.HEAD_COUNT_KV, Keys.LLM.FEED_FORWARD_LENGTH)),
}
