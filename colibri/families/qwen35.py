"""Qwen3.5-MoE (transformers' Qwen3_5MoeForCausalLM, and the text model of Qwen3_5MoeForConditionalGeneration): Gated
DeltaNet layers (format DELTA_NET) where `layer_types` says "linear_attention" (default: three of every four), gated
attention in the others (q_proj twice as wide, each head's query then its gate: WQ and WQ_GATE; per-head q/k norms;
RoPE on a head's first partial_rotary_factor of dims), every layer routed experts (softmax, top-k renormalized with
no epsilon) with a shared expert gated by a sigmoid. Its RMSNorms but the DeltaNet's are zero-centred (x · (1 + w)):
1 + w is what the image stores, the same f32 product. MRoPE's sections give text the plain RoPE (its three position
ids are equal), so mrope_section is read as that."""
from __future__ import annotations

import numpy as np

from colibri.dims import FLAG_ATTN_GATE, FLAG_QK_NORM_HEAD
from colibri.families.base import ConfigContext, Family, OwnFields, UnsupportedModel, derived_tensor
from colibri.format import Role

KEYS = ("linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
        "linear_num_value_heads")


def derive(cfg: dict, ctx: ConfigContext) -> OwnFields:
    """The DeltaNet layers and their geometry, and what the attention layers add: the gate; refuses the q/k/v/o
    biases (the gate would need its own) and a geometry the runtime cannot hold."""
    types = cfg.get("layer_types")
    if types is None:
        interval = cfg.get("full_attention_interval", 4)
        types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(ctx.n_layers)]
    if not isinstance(types, list) or len(types) != ctx.n_layers or set(types) - {"linear_attention", "full_attention"}:
        raise UnsupportedModel(f"config field layer_types={types!r}: 'linear_attention' or 'full_attention' for each "
                               f"of the {ctx.n_layers} layers")
    if cfg.get("attention_bias"):
        raise UnsupportedModel("config field attention_bias=true: Qwen3.5's gated q projection has no bias here")
    geometry = {key: cfg.get(key, default) for key, default in zip(KEYS, (4, 128, 128, 16, 32))}
    for key, value in geometry.items():
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value < (1 << 16):
            raise UnsupportedModel(f"config field {key}={value!r}: a count of 1 to 65,535")
    if geometry["linear_num_value_heads"] % geometry["linear_num_key_heads"]:
        raise UnsupportedModel(f"config field linear_num_value_heads={geometry['linear_num_value_heads']} is not a "
                               f"multiple of linear_num_key_heads={geometry['linear_num_key_heads']}")
    delta = tuple(t == "linear_attention" for t in types)
    fields = dict(delta_layers=delta, topk_norm_eps=0.0)
    if any(delta):
        fields.update(conv_kernel=geometry["linear_conv_kernel_dim"], dn_k_heads=geometry["linear_num_key_heads"],
                      dn_v_heads=geometry["linear_num_value_heads"], dn_k_dim=geometry["linear_key_head_dim"],
                      dn_v_dim=geometry["linear_value_head_dim"])
    return OwnFields(fields, FLAG_ATTN_GATE)


# zero-centred norms: stored as 1 + w
CENTRED = {Role.ATTN_NORM: "input_layernorm.weight", Role.FFN_NORM: "post_attention_layernorm.weight",
           Role.Q_NORM: "self_attn.q_norm.weight", Role.K_NORM: "self_attn.k_norm.weight"}
DELTA = {Role.DN_QKV: "in_proj_qkv.weight", Role.DN_Z: "in_proj_z.weight", Role.DN_B: "in_proj_b.weight",
         Role.DN_A: "in_proj_a.weight", Role.DN_DT_BIAS: "dt_bias", Role.DN_NORM: "norm.weight",
         Role.DN_OUT: "out_proj.weight"}


def _named(raw: dict, name: str, compute=None, shape=None):
    source = raw[name]
    if compute is None:
        return [name], source
    return [name], derived_tensor(source, shape or tuple(source.shape), lambda: compute(np.asarray(source, np.float32)))


def tensor(raw: dict, d, key: tuple[Role, int, int]):
    """Qwen3.5's names: the zero-centred norms as 1 + w, the gated q projection split into the query and the gate
    rows of each head, the DeltaNet's tensors (A_log as the decay -exp(A_log), the convolution as [channels, K])."""
    role, layer, _ = key
    p = f"model.layers.{layer}."
    if role == Role.OUTPUT_NORM:
        return _named(raw, "model.norm.weight", lambda w: 1.0 + w)
    if role in CENTRED:
        return _named(raw, p + CENTRED[role], lambda w: 1.0 + w)
    if role in (Role.WQ, Role.WQ_GATE):
        H, hd = d.n_heads, d.head_dim
        part = 0 if role == Role.WQ else 1
        name = p + "self_attn.q_proj.weight"
        if tuple(raw[name].shape) != (2 * H * hd, d.hidden_size):
            raise UnsupportedModel(f"checkpoint tensor {name} has shape {list(raw[name].shape)}; a gated q projection "
                                   f"is {[2 * H * hd, d.hidden_size]}")
        return _named(raw, name, lambda w: w.reshape(H, 2, hd, -1)[:, part].reshape(H * hd, -1), (H * hd, d.hidden_size))
    if role == Role.DN_DECAY:
        return _named(raw, p + "linear_attn.A_log", lambda a: -np.exp(a))
    if role == Role.DN_CONV:
        name, want = p + "linear_attn.conv1d.weight", (d.dn_conv, 1, d.conv_kernel)
        if tuple(raw[name].shape) not in (want, want[::2]):
            raise UnsupportedModel(f"checkpoint tensor {name} has shape {list(raw[name].shape)}; the config makes it "
                                   f"{list(want)}")
        return _named(raw, name, lambda w: w.reshape(want[::2]), want[::2])
    if role in DELTA:
        return _named(raw, p + "linear_attn." + DELTA[role])
    return None


FAMILIES = {
    "Qwen3_5MoeForCausalLM": Family(
        moe=True, expert_ffn_key="moe_intermediate_size", moe_prefix="mlp",
        expert_names=("gate_proj", "up_proj", "down_proj"), fused_experts=("experts.gate_up_proj", "experts.down_proj"),
        qk_norm=FLAG_QK_NORM_HEAD, shared_expert=True, norm_topk_default=True, partial_rope=True,
        own_keys=(*KEYS, "full_attention_interval"), derive=derive, tensor=tensor,
        ignored_prefixes=("mtp.",)),  # the multi-token-prediction layers, which transformers does not load either
}
