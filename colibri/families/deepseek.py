"""DeepSeek-V2 and V3: multi-head latent attention, their routers, shared experts (docs/MODELS.md). Their config's
fields and flags (`derive`), which layers are MoE and a q/k head's size, and kv_b_proj split into the absorbed
form's WK_B and WV_B (`tensor`)."""
from __future__ import annotations

from functools import partial

import numpy as np

import gguf

from colibri import rope
from colibri.families.base import ConfigContext, Family, OwnFields, UnsupportedModel
from colibri.gguf_common import MODEL_TENSOR, GGUFError, GGUFFile, Keys, gguf_name
from colibri.format import MAX_TOP_K, Role
from colibri.dims import FLAG_NORM_TOPK, FLAG_ROPE_PAIRS, FLAG_ROUTER_BIAS, FLAG_ROUTER_SIGMOID, FLAG_SHARED_PLAIN
from colibri.lazy import Derived, LazyTensor

OWN_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "n_group", "topk_group",
            "topk_method", "routed_scaling_factor", "n_shared_experts", "first_k_dense_replace", "scoring_func",
            "moe_layer_freq")


def moe_layers(cfg: dict, n_layers: int) -> tuple[bool, ...]:
    return tuple(layer >= int(cfg.get("first_k_dense_replace") or 0) for layer in range(n_layers))


def head_dim(cfg: dict) -> int:
    """config.head_dim is the rope part there; a q/k head is qk_nope_head_dim + qk_rope_head_dim."""
    return int(cfg["qk_nope_head_dim"]) + int(cfg["qk_rope_head_dim"])


def derive(version: int, cfg: dict, ctx: ConfigContext) -> OwnFields:
    """DeepSeek-V2/V3's attention and routing as ModelDims fields, and their flags (docs/MODELS.md)."""
    arch = f"DeepSeek-V{version}"
    if cfg.get("attention_bias"):
        raise UnsupportedModel("config field attention_bias=true: the runtime's multi-head latent attention has no biases")
    if int(cfg.get("moe_layer_freq", 1) or 1) != 1:
        raise UnsupportedModel(f"config field moe_layer_freq={cfg['moe_layer_freq']}: transformers' {arch} makes every "
                               "layer from first_k_dense_replace on a MoE layer (moe_layer_freq 1)")
    heads, kv_heads = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads", cfg.get("num_attention_heads"))
    if kv_heads != heads:
        raise UnsupportedModel(f"config field num_key_value_heads={kv_heads} with num_attention_heads={heads}: "
                               f"transformers' {arch} expands the latent into keys and values for every head and "
                               "cannot run other counts (DeepSeek's checkpoints give both the same)")
    scoring = cfg.get("scoring_func")
    want = "sigmoid" if version == 3 else "softmax"
    if scoring is not None and scoring != want:
        raise UnsupportedModel(f"config field scoring_func={scoring!r}: transformers' {arch} router uses {want}")
    nope, rope_dim, lat = int(cfg["qk_nope_head_dim"]), int(cfg["qk_rope_head_dim"]), int(cfg["kv_lora_rank"])
    if nope < 1 or rope_dim < 2 or rope_dim % 2 or lat < 1 or int(cfg["v_head_dim"]) < 1:
        raise UnsupportedModel(f"config fields qk_nope_head_dim={nope}, qk_rope_head_dim={rope_dim}, kv_lora_rank={lat}, "
                               f"v_head_dim={cfg['v_head_dim']}: each must be positive, qk_rope_head_dim even")
    try:  # the softmax scale: 1/sqrt(q/k head), times YaRN's mscale(factor, mscale_all_dim) squared
        scale = ctx.head_dim ** -0.5 * rope.deepseek_mscale(rope.rope_parameters(cfg)) ** 2
    except (rope.UnsupportedRope, KeyError) as exc:
        raise UnsupportedModel(f"config field rope_parameters/rope_scaling: {exc}") from None
    fields = dict(n_kv_heads=1, q_lora_rank=int(cfg.get("q_lora_rank") or 0), kv_lora_rank=lat, rope_dim=rope_dim,
                  v_head_dim=int(cfg["v_head_dim"]), routed_scale=float(cfg.get("routed_scaling_factor", 1.0)),
                  attn_scale=scale)
    flags = FLAG_ROPE_PAIRS if version == 2 or cfg.get("rope_interleave", True) else 0
    shared = int(cfg.get("n_shared_experts") or 0) * int(cfg["moe_intermediate_size"]) if ctx.any_moe else 0
    if shared:
        flags |= FLAG_SHARED_PLAIN
    fields["shared_ffn_size"] = shared
    if not ctx.any_moe:
        return OwnFields(fields, flags)
    if version == 2:
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
        n_experts, top_k = ctx.n_experts, ctx.top_k
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
    return OwnFields(fields, flags)


def kv_b_shape(d, role: Role) -> tuple[int, int]:
    nope, lat = d.head_dim - d.rope_width, d.kv_lora_rank
    return (d.n_heads * lat, nope) if role == Role.WK_B else (d.n_heads * d.v_dim, lat)


def kv_b_split(kv_b: np.ndarray, d, role: Role) -> np.ndarray:
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


def kv_b_part(t: np.ndarray | LazyTensor, d, role: Role) -> np.ndarray | LazyTensor:
    """WK_B or WV_B of a kv_b_proj tensor: computed now from values in memory, or when read from a file."""
    if isinstance(t, LazyTensor):
        return Derived(kv_b_shape(d, role), lambda: kv_b_split(np.asarray(t), d, role))
    return kv_b_split(np.asarray(t, dtype=np.float32), d, role)


def tensor(raw: dict, d, key: tuple[Role, int, int]) -> tuple[list[str], object] | None:
    """WK_B and WV_B: as llama.cpp's converter split kv_b_proj (a GGUF file), or split here from it."""
    role, layer, _ = key
    if role not in (Role.WK_B, Role.WV_B):
        return None
    name = f"model.layers.{layer}.self_attn.kv_b_proj.weight"
    split = name.replace("kv_b_proj", "k_b_proj" if role == Role.WK_B else "v_b_proj")
    if split in raw:
        return [split], raw[split]
    return [name], kv_b_part(raw[name], d, role)


# llama.cpp (src/models/deepseek2.cpp) scores a deepseek2 file that names no gating function by softmax, but by sigmoid
# when it has GLM-4.7-Flash's layer count (with or without its MTP layer) and vocabulary: its converter writes none
GLM_47_LAYERS, GLM_47_VOCAB = (47, 48), 154880


def gguf_config(f: GGUFFile) -> dict:
    """The DeepSeek-V2/V3 config fields of a deepseek2 file, as llama.cpp runs it: the gating function the file
    names (when it names none, llama.cpp's choice: softmax, or sigmoid for GLM-4.7-Flash's shape), groups scored by
    their best two experts (llama.cpp's build_moe_ffn does so for any gating function: transformers' V3, never its
    V2), RoPE on adjacent pairs."""
    field, k, n_layers, n_head, tensors = f.field, f.key, f.n_layers, f.n_head, f.tensors
    gating = field(k(Keys.LLM.EXPERT_GATING_FUNC), None, required=False)
    embd = tensors.get(gguf_name(MODEL_TENSOR.TOKEN_EMBD) + ".weight")
    if gating is None and n_layers in GLM_47_LAYERS and embd is not None and embd.shape[0] == GLM_47_VOCAB:
        gating = gguf.ExpertGatingFuncType.SIGMOID  # llama.cpp's rule for GLM-4.7-Flash's files, which name none
    sigmoid = gating == gguf.ExpertGatingFuncType.SIGMOID
    if gating not in (None, gguf.ExpertGatingFuncType.SOFTMAX, gguf.ExpertGatingFuncType.SIGMOID):
        raise GGUFError(f"GGUF key {k(Keys.LLM.EXPERT_GATING_FUNC)}={gating} is neither softmax nor sigmoid")
    has_bias = any(gguf_name(MODEL_TENSOR.FFN_EXP_PROBS_B, layer) + ".bias" in tensors for layer in range(n_layers))
    if has_bias != sigmoid:
        raise GGUFError("GGUF deepseek2 file with " + ("a router bias (exp_probs_b) but no sigmoid gating function "
                        f"({k(Keys.LLM.EXPERT_GATING_FUNC)}): DeepSeek-V3 scores by sigmoid, and llama.cpp would "
                        "use softmax here; convert it from a config.json with scoring_func \"sigmoid\"" if has_bias
                        else "sigmoid gating but no router bias (exp_probs_b): neither DeepSeek-V2 nor V3"))
    n_group = f.number(Keys.LLM.EXPERT_GROUP_COUNT, 1)
    topk_group = f.number(Keys.LLM.EXPERT_GROUP_USED_COUNT, n_group)
    if n_group > 1 and not sigmoid:
        raise GGUFError(f"GGUF key {k(Keys.LLM.EXPERT_GROUP_COUNT)}={n_group} with softmax gating: llama.cpp scores a "
                        "group by its best two experts, transformers' DeepSeek-V2 by its best one; refusing to pick")
    scaling = field(k(Keys.Rope.SCALING_TYPE), None, required=False)
    if scaling and scaling != "none":
        raise GGUFError(f"GGUF key {k(Keys.Rope.SCALING_TYPE)}={scaling!r}: RoPE scaling of a deepseek2 file is not "
                        "read yet (llama.cpp folds YaRN's mscale into its own keys); pack the safetensors checkpoint")
    rope = f.number(Keys.Rope.DIMENSION_COUNT)
    key_mla, value_mla = field(k(Keys.Attention.KEY_LENGTH_MLA), None), field(k(Keys.Attention.VALUE_LENGTH_MLA), None)
    ff = field(k(Keys.LLM.FEED_FORWARD_LENGTH), 0, required=False)
    q_lora = field(k(Keys.Attention.Q_LORA_RANK), None, required=False)
    cfg = {
        "architectures": ["DeepseekV3ForCausalLM" if sigmoid else "DeepseekV2ForCausalLM"],
        "num_key_value_heads": n_head,  # the file says 1: MLA's latent, which the runtime's image says too
        "q_lora_rank": int(q_lora) if q_lora else None, "kv_lora_rank": f.number(Keys.Attention.KV_LORA_RANK),
        "qk_rope_head_dim": rope, "qk_nope_head_dim": int(key_mla) - rope, "v_head_dim": int(value_mla),
        "first_k_dense_replace": f.number(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, 0),
        "intermediate_size": int(ff), "n_shared_experts": f.number(Keys.LLM.EXPERT_SHARED_COUNT, 0),
        "routed_scaling_factor": float(field(k(Keys.LLM.EXPERT_WEIGHTS_SCALE), 1.0, required=False)),
        "norm_topk_prob": bool(field(k(Keys.LLM.EXPERT_WEIGHTS_NORM), False, required=False)),
        "n_group": n_group, "topk_group": topk_group,
    }
    if sigmoid:
        cfg["rope_interleave"] = True  # llama.cpp rotates adjacent pairs
    else:
        cfg["topk_method"] = "greedy"
    n_experts = int(field(k(Keys.LLM.EXPERT_COUNT), 0, required=False))
    if n_experts:
        cfg["n_routed_experts"] = n_experts
        cfg["num_experts_per_tok"] = int(field(k(Keys.LLM.EXPERT_USED_COUNT)))
        cfg["moe_intermediate_size"] = int(field(k(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH)))
    return cfg


# a deepseek2 file's own tensors -> HF name suffix after "model.layers.N." (k_b/v_b: the runtime's WK_B/WV_B)
GGUF_TENSORS = {
    MODEL_TENSOR.ATTN_Q_A: "self_attn.q_a_proj", MODEL_TENSOR.ATTN_Q_A_NORM: "self_attn.q_a_layernorm",
    MODEL_TENSOR.ATTN_Q_B: "self_attn.q_b_proj", MODEL_TENSOR.ATTN_KV_A_MQA: "self_attn.kv_a_proj_with_mqa",
    MODEL_TENSOR.ATTN_KV_A_NORM: "self_attn.kv_a_layernorm", MODEL_TENSOR.ATTN_KV_B: "self_attn.kv_b_proj",
    MODEL_TENSOR.ATTN_K_B: "self_attn.k_b_proj", MODEL_TENSOR.ATTN_V_B: "self_attn.v_b_proj",
}


DEEPSEEK = dict(moe=True, expert_ffn_key="moe_intermediate_size", moe_prefix="mlp",
                expert_names=("gate_proj", "up_proj", "down_proj"), shared_prefix="shared_experts", bias_key="",
                own_keys=OWN_KEYS, reads=("n_routed_experts", "qk_head_dim", "v_head_dim", "rope_interleave"), routes_itself=True,
                moe_layer_rule=moe_layers, head_dim_rule=head_dim, tensor=tensor,
                gguf_read_config=gguf_config, gguf_layer_tensors=tuple(GGUF_TENSORS.items()), gguf_key_length_is_head=False)
FAMILIES = {  # a deepseek2 file names V2; its gguf_config names V3 for a sigmoid router
    "DeepseekV2ForCausalLM": Family(**DEEPSEEK, derive=partial(derive, 2), gguf_arch="deepseek2"),
    "DeepseekV3ForCausalLM": Family(**DEEPSEEK, derive=partial(derive, 3)),
}
