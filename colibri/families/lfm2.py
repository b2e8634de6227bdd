"""LFM2 and LFM2-MoE (transformers' Lfm2ForCausalLM and Lfm2MoeForCausalLM): gated short convolutions in the layers
`layer_types` calls "conv"
(format SHORT_CONV: in_proj to b, c, x; c · conv(b · x) over the last conv_L_cache positions; out_proj) and GQA
attention with per-head q/k norms in the others; the first num_dense_layers layers a dense MLP (w1, w3, w2), the
rest routed experts scored by sigmoids, chosen with the expert bias added (use_expert_bias), renormalized with
LFM2's 1e-6 (norm_topk_prob) and times routed_scaling_factor; the final norm is called embedding_norm. From GGUF,
llama.cpp's lfm2moe (conversion/lfm2.py): a KV head count per layer, 0 in the convolving ones; the convolution's
weight squeezed to [D, K]; the experts stacked; the final norm as token_embd_norm. Dense LFM2 is the same blocks
with a dense MLP in every layer, sized by LFM2's own rule (mlp_size); its GGUF architecture is llama.cpp's lfm2."""
from __future__ import annotations

import gguf
import numpy as np

from colibri.dims import FLAG_NORM_TOPK, FLAG_QK_NORM_HEAD, FLAG_ROUTER_BIAS, FLAG_ROUTER_SIGMOID
from colibri.families.base import ConfigContext, Family, OwnFields, UnsupportedModel, derived_tensor
from colibri.format import MAX_CONV_KERNEL, Role
from colibri.gguf_common import MODEL_TENSOR, GGUFError, GGUFFile, Keys, gguf_name


def moe_layers(cfg: dict, n_layers: int) -> tuple[bool, ...]:
    """The layers from num_dense_layers on route to experts (transformers' Lfm2MoeDecoderLayer)."""
    dense = cfg.get("num_dense_layers", 2)
    if not isinstance(dense, int) or isinstance(dense, bool) or not 0 <= dense <= n_layers:
        raise UnsupportedModel(f"config field num_dense_layers={dense!r}: a count of layers, 0..{n_layers}")
    return tuple(layer >= dense for layer in range(n_layers))


def layer_types(cfg: dict, n_layers: int) -> list:
    """Lfm2Config's layer kinds: layer_types, or else attention in the layers full_attn_idxs lists (every layer when
    it lists none), as its __post_init__ fills them in."""
    idxs = cfg.get("full_attn_idxs")
    from_idxs = None
    if idxs is not None:
        if not isinstance(idxs, list) or any(not isinstance(i, int) or isinstance(i, bool) for i in idxs):
            raise UnsupportedModel(f"config field full_attn_idxs={idxs!r}: a list of layer indices")
        from_idxs = ["full_attention" if i in idxs else "conv" for i in range(n_layers)]
    types = cfg.get("layer_types")
    if types is None:
        return from_idxs or ["full_attention"] * n_layers
    if from_idxs is not None and types != from_idxs:
        raise UnsupportedModel(f"config field full_attn_idxs={idxs!r} disagrees with layer_types={types!r}")
    return types


def mlp_size(cfg: dict) -> int:
    """Lfm2MLP's width: block_ff_dim (which Lfm2Config takes over intermediate_size), two thirds of it when
    block_auto_adjust_ff_dim, times block_ffn_dim_multiplier and rounded up to block_multiple_of when that is set."""
    def whole(key: str, default):
        value = cfg.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UnsupportedModel(f"config field {key}={value!r}: a positive whole number")
        return value
    size = whole("block_ff_dim", cfg.get("intermediate_size", 12288))
    if cfg.get("block_auto_adjust_ff_dim", True):
        size = int(2 * size / 3)
        multiplier = cfg.get("block_ffn_dim_multiplier", 1.0)
        if multiplier is not None:
            if not isinstance(multiplier, (int, float)) or isinstance(multiplier, bool) or not multiplier > 0:
                raise UnsupportedModel(f"config field block_ffn_dim_multiplier={multiplier!r}: a positive number")
            multiple = whole("block_multiple_of", 256)
            size = multiple * ((int(multiplier * size) + multiple - 1) // multiple)
    return size


# Lfm2Config's fields from LFM2's first release that transformers does not read: each states a fact of the model
# transformers builds (its value there), so a config stating another is a model transformers would run otherwise
DENSE_FACTS = {"block_dim": "hidden_size", "conv_dim": "hidden_size", "conv_dim_out": "hidden_size",
               "num_heads": "num_attention_heads", "block_norm_eps": "norm_eps"}
DENSE_ALWAYS = {"block_use_swiglu": True, "use_pos_enc": True}  # SwiGLU MLPs; RoPE


def dense_derive(cfg: dict, ctx: ConfigContext) -> OwnFields:
    """Dense LFM2: LFM2-MoE's blocks (derive below) with the layer kinds Lfm2Config fills in and its MLP width."""
    for key, fact in DENSE_FACTS.items():
        if key in cfg and cfg[key] != cfg.get(fact):
            raise UnsupportedModel(f"config field {key}={cfg[key]!r} disagrees with {fact}={cfg.get(fact)!r}, which "
                                   "transformers builds the model with")
    for key, value in DENSE_ALWAYS.items():
        if key in cfg and cfg[key] is not value:
            raise UnsupportedModel(f"config field {key}={cfg[key]!r}: transformers' LFM2 always has {key}={value}")
    own = derive(dict(cfg, layer_types=layer_types(cfg, ctx.n_layers)), ctx)
    own.fields["dense_ffn_size"] = mlp_size(cfg)
    return own


def derive(cfg: dict, ctx: ConfigContext) -> OwnFields:
    """The convolving layers and their kernel, and the router (sigmoid scores, the expert bias choosing, LFM2's
    renormalization and scale); refuses the convolutions' biases and a tie_embedding that disagrees."""
    types = cfg.get("layer_types")
    if not isinstance(types, list) or len(types) != ctx.n_layers or set(types) - {"conv", "full_attention"}:
        raise UnsupportedModel(f"config field layer_types={types!r}: 'conv' or 'full_attention' for each of the "
                               f"{ctx.n_layers} layers")
    kernel = cfg.get("conv_L_cache", 3)
    if not isinstance(kernel, int) or isinstance(kernel, bool) or not 2 <= kernel <= MAX_CONV_KERNEL:
        raise UnsupportedModel(f"config field conv_L_cache={kernel!r}: the runtime convolves over 2 to "
                               f"{MAX_CONV_KERNEL} positions")
    if cfg.get("conv_bias", False):
        raise UnsupportedModel("config field conv_bias=true: the runtime's short convolutions have no biases")
    if "tie_embedding" in cfg and bool(cfg["tie_embedding"]) != bool(cfg.get("tie_word_embeddings", True)):
        raise UnsupportedModel(f"config field tie_embedding={cfg['tie_embedding']} disagrees with tie_word_embeddings")
    conv = tuple(t == "conv" for t in types)
    fields = dict(conv_layers=conv, conv_kernel=kernel if any(conv) else 0,
                  topk_norm_eps=1e-6 if ctx.any_moe else 0.0,
                  routed_scale=float(cfg.get("routed_scaling_factor", 1.0)))
    flags = 0
    if ctx.any_moe:
        flags = FLAG_ROUTER_SIGMOID | (FLAG_ROUTER_BIAS if cfg.get("use_expert_bias", True) else 0) | \
            (FLAG_NORM_TOPK if cfg.get("norm_topk_prob", True) else 0)
    return OwnFields(fields, flags)


# the names LFM2 gives what other families call otherwise, under model.layers.{layer}.
NAMES = {Role.ATTN_NORM: "operator_norm.weight", Role.FFN_NORM: "ffn_norm.weight",
         Role.WO: "self_attn.out_proj.weight", Role.Q_NORM: "self_attn.q_layernorm.weight",
         Role.K_NORM: "self_attn.k_layernorm.weight", Role.CONV_IN: "conv.in_proj.weight",
         Role.CONV_OUT: "conv.out_proj.weight", Role.DENSE_GATE: "feed_forward.w1.weight",
         Role.DENSE_UP: "feed_forward.w3.weight", Role.DENSE_DOWN: "feed_forward.w2.weight"}


def tensor(raw: dict, d, key: tuple[Role, int, int]):
    """LFM2's names; the convolution's weight [D, 1, K] as the kernel rows [D, K]."""
    role, layer, _ = key
    if role == Role.OUTPUT_NORM:
        return ["model.embedding_norm.weight"], raw["model.embedding_norm.weight"]
    if role == Role.CONV_KERNEL:
        name = f"model.layers.{layer}.conv.conv.weight"
        source, want = raw[name], (d.hidden_size, 1, d.conv_kernel)  # (llama.cpp's converter squeezes the 1)
        if tuple(source.shape) not in (want, want[::2]):
            raise UnsupportedModel(f"checkpoint tensor {name} has shape {list(source.shape)}; hidden_size and "
                                   f"conv_L_cache make it {list(want)}")
        return [name], derived_tensor(source, want[::2], lambda: np.asarray(source, np.float32).reshape(want[::2]))
    if role in NAMES:
        name = f"model.layers.{layer}.{NAMES[role]}"
        return [name], raw[name]
    return None


def gguf_layer_types(f: GGUFFile) -> dict:
    """The fields both LFM2 architectures' files hold: a KV head count per layer (0: it convolves), the kernel."""
    heads = f.layer_kv_heads or (f.n_head_kv,) * f.n_layers
    if len(set(heads) - {0}) != 1:
        raise GGUFError(f"GGUF key {f.key(Keys.Attention.HEAD_COUNT_KV)} lists KV head counts {sorted(set(heads))}: "
                        "each 0 (the layer convolves) or the one count of the attention layers")
    return {"layer_types": ["conv" if h == 0 else "full_attention" for h in heads],
            "conv_L_cache": int(f.field(f.key(Keys.ShortConv.L_CACHE)))}


def gguf_dense_config(f: GGUFFile) -> dict:
    """The LFM2 config fields of an lfm2 file (conversion/lfm2.py's LFM2Model): its feed_forward_length is the MLP's
    width as built (the converter applies LFM2's rule), and a sliding window (llama.cpp's LFM2 variant with one,
    which transformers' LFM2 has not) is refused."""
    window = f.field(f.key(Keys.Attention.SLIDING_WINDOW), 0, required=False)
    if window:
        raise GGUFError(f"GGUF key {f.key(Keys.Attention.SLIDING_WINDOW)}={window}: transformers' LFM2 attends over "
                        "every position")
    return dict(gguf_layer_types(f), block_auto_adjust_ff_dim=False)


def gguf_config(f: GGUFFile) -> dict:
    """The LFM2-MoE config fields of an lfm2moe file: sigmoid gating (the only one its converter writes), the
    routed scale expert_weights_scale, 1 when the file is silent, as its converter leaves it and llama.cpp runs it
    (src/models/lfm2moe.cpp reads no scale; LFM2-8B-A1B's config says 1). The renormalization is gguf_input.py's:
    Family.gguf_norm_topk, true as src/models/lfm2.cpp's norm_w, unless the file or --norm-topk-prob states it."""
    field, k, n_layers = f.field, f.key, f.n_layers
    gating = field(k(Keys.LLM.EXPERT_GATING_FUNC), None, required=False)
    if gating != gguf.ExpertGatingFuncType.SIGMOID:
        raise GGUFError(f"GGUF key {k(Keys.LLM.EXPERT_GATING_FUNC)}={gating}: LFM2-MoE scores its experts by sigmoid")
    return {
        **gguf_layer_types(f),
        "num_dense_layers": int(field(k(Keys.LLM.LEADING_DENSE_BLOCK_COUNT), 0, required=False)),
        "intermediate_size": int(field(k(Keys.LLM.FEED_FORWARD_LENGTH), 0, required=False)),
        "num_experts": f.n_experts, "num_experts_per_tok": int(field(k(Keys.LLM.EXPERT_USED_COUNT))),
        "moe_intermediate_size": int(field(k(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH))),
        "use_expert_bias": any(gguf_name(MODEL_TENSOR.FFN_EXP_PROBS_B, layer) + ".bias" in f.tensors
                               for layer in range(n_layers)),
        "routed_scaling_factor": float(field(k(Keys.LLM.EXPERT_WEIGHTS_SCALE), 1.0, required=False)),
    }


# llama.cpp's per-layer tensors -> LFM2's names under model.layers.N. (gguf_input.py's common ones otherwise)
GGUF_TENSORS = {MODEL_TENSOR.ATTN_NORM: "operator_norm", MODEL_TENSOR.FFN_NORM: "ffn_norm",
                MODEL_TENSOR.ATTN_OUT: "self_attn.out_proj", MODEL_TENSOR.ATTN_Q_NORM: "self_attn.q_layernorm",
                MODEL_TENSOR.ATTN_K_NORM: "self_attn.k_layernorm", MODEL_TENSOR.FFN_GATE: "feed_forward.w1",
                MODEL_TENSOR.FFN_UP: "feed_forward.w3", MODEL_TENSOR.FFN_DOWN: "feed_forward.w2",
                MODEL_TENSOR.SHORTCONV_CONV: "conv.conv", MODEL_TENSOR.SHORTCONV_INPROJ: "conv.in_proj",
                MODEL_TENSOR.SHORTCONV_OUTPROJ: "conv.out_proj"}


SHARED_KEYS = ("conv_L_cache", "conv_bias", "norm_eps", "tie_embedding")  # both architectures' config fields
FAMILIES = {
    "Lfm2ForCausalLM": Family(
        moe=False, expert_ffn_key="", moe_prefix="", expert_names=("", "", ""), qk_norm=FLAG_QK_NORM_HEAD,
        tied_default=True, eps_key="norm_eps", default_eps=1e-5, default_theta=1e6,
        own_keys=(*SHARED_KEYS, "full_attn_idxs", "block_ff_dim", "block_auto_adjust_ff_dim",
                  "block_ffn_dim_multiplier", "block_multiple_of", *DENSE_FACTS, *DENSE_ALWAYS),
        derive=dense_derive, tensor=tensor,
        gguf_arch="lfm2", gguf_read_config=gguf_dense_config, gguf_layer_tensors=tuple(GGUF_TENSORS.items()),
        gguf_per_layer=(Keys.Attention.HEAD_COUNT_KV,)),
    "Lfm2MoeForCausalLM": Family(
        moe=True, expert_ffn_key="moe_intermediate_size", moe_prefix="feed_forward", expert_names=("w1", "w3", "w2"),
        fused_experts=("experts.gate_up_proj", "experts.down_proj"), router_bias_name="expert_bias",
        qk_norm=FLAG_QK_NORM_HEAD, tied_default=True, routes_itself=True, eps_key="norm_eps", default_eps=1e-5,
        default_theta=1e6,
        own_keys=(*SHARED_KEYS, "num_dense_layers", "use_expert_bias", "routed_scaling_factor"),  # (DeepSeek's too)
        moe_layer_rule=moe_layers, derive=derive, tensor=tensor,
        gguf_arch="lfm2moe", gguf_norm_topk=True, gguf_read_config=gguf_config,
        gguf_layer_tensors=tuple(GGUF_TENSORS.items()), gguf_per_layer=(Keys.Attention.HEAD_COUNT_KV,)),
}
