"""Qwen3.5-MoE (transformers' Qwen3_5MoeForCausalLM, and the text model of Qwen3_5MoeForConditionalGeneration): Gated
DeltaNet layers (format DELTA_NET) where `layer_types` says "linear_attention" (default: three of every four), gated
attention in the others (q_proj twice as wide, each head's query then its gate: WQ and WQ_GATE; per-head q/k norms;
RoPE on a head's first partial_rotary_factor of dims), every layer routed experts (softmax, top-k renormalized with
no epsilon) with a shared expert gated by a sigmoid. Its RMSNorms but the DeltaNet's are zero-centred (x · (1 + w)):
1 + w is what the image stores, the same f32 product. MRoPE's sections give text the plain RoPE (its three position
ids are equal), so mrope_section is read as that.

From GGUF, llama.cpp's qwen35moe as its converter writes it (conversion/qwen.py, Qwen3NextModel and
_LinearAttentionVReorderBase): the zero-centred norms stored as 1 + w already and A_log as the decay -exp(A_log)
(both read as stored, under names of their own: tensor() adds nothing), dt_bias as ssm_dt.bias, the convolution
squeezed to [channels, K], and where there are more value heads than key heads the value heads of every DeltaNet
tensor reordered from grouped by key head to tiled, which gguf_tensors puts back."""
from __future__ import annotations

import numpy as np

from colibri.dims import FLAG_ATTN_GATE, FLAG_QK_NORM_HEAD
from colibri.families.base import ConfigContext, Family, OwnFields, UnsupportedModel, derived_tensor
from colibri.format import Role
from colibri.gguf_common import (MODEL_TENSOR, GGUFError, GGUFFile, Keys, as_row, floats, gguf_name, lazy,
                                  split_experts, split_gate_up)
from colibri.lazy import LazyTensor, loaded
from colibri.quant import Encoded

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


STORED = "_as_stored"  # a GGUF file's tensor stored as the image holds it: a norm's 1 + w, the decay


def _centred(raw: dict, name: str):
    if name + STORED in raw:
        return [name + STORED], raw[name + STORED]
    return _named(raw, name, lambda w: 1.0 + w)


def _named(raw: dict, name: str, compute=None, shape=None):
    source = raw[name]
    if compute is None:
        return [name], source
    return [name], derived_tensor(source, shape or tuple(source.shape), lambda: compute(np.asarray(source, np.float32)))


def _rows(t: np.ndarray | Encoded, rows: np.ndarray) -> np.ndarray | Encoded:
    """Rows `rows` of a matrix: a quantized one's blocks as they are, a float one's values as f32."""
    return t.rows(rows) if isinstance(t, Encoded) else np.asarray(t, np.float32)[rows]


def tensor(raw: dict, d, key: tuple[Role, int, int]):
    """Qwen3.5's names: the zero-centred norms as 1 + w, the gated q projection split into the query and the gate
    rows of each head, the DeltaNet's tensors (A_log as the decay -exp(A_log), the convolution as [channels, K])."""
    role, layer, _ = key
    p = f"model.layers.{layer}."
    if role == Role.OUTPUT_NORM:
        return _centred(raw, "model.norm.weight")
    if role in CENTRED:
        return _centred(raw, p + CENTRED[role])
    if role in (Role.WQ, Role.WQ_GATE):
        H, hd = d.n_heads, d.head_dim
        part = 0 if role == Role.WQ else 1
        name = p + "self_attn.q_proj.weight"
        if tuple(raw[name].shape) != (2 * H * hd, d.hidden_size):
            raise UnsupportedModel(f"checkpoint tensor {name} has shape {list(raw[name].shape)}; a gated q projection "
                                   f"is {[2 * H * hd, d.hidden_size]}")
        rows = np.arange(2 * H * hd).reshape(H, 2, hd)[:, part].reshape(-1)  # head h's query rows, then its gate's
        source = raw[name]
        # whole rows: a tensor a GGUF file stores in an image dtype keeps its blocks (--dtype stored)
        return [name], derived_tensor(source, (H * hd, d.hidden_size), lambda: _rows(loaded(source), rows), keeps=True)
    if role == Role.DN_DECAY:
        if p + "linear_attn.decay" + STORED in raw:
            return _named(raw, p + "linear_attn.decay" + STORED)
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


def gguf_config(f: GGUFFile) -> dict:
    """The Qwen3.5-MoE config fields of a qwen35moe file: the DeltaNet's geometry from the ssm keys (state_size the
    key head size, group_count the key heads, time_step_rank the value heads, inner_size their width), the layers
    from attention.recurrent_layers (else full_attention_interval), the partial RoPE from rope.dimension_count, the
    experts and the shared one; the router renormalizes, as src/models/qwen35moe.cpp's norm_w."""
    field, k, n_layers, whole = f.field, f.key, f.n_layers, f.number

    def count(key: str) -> int:  # (1 to 65,535, as the config's: derive refuses the same, by the config's name)
        if not 1 <= (value := whole(key)) < (1 << 16):
            raise GGUFError(f"GGUF key {k(key)}={value}: 1 to 65,535")
        return value
    hk, hv, dk, kernel = (count(key) for key in (Keys.SSM.GROUP_COUNT, Keys.SSM.TIME_STEP_RANK, Keys.SSM.STATE_SIZE,
                                                 Keys.SSM.CONV_KERNEL))
    inner = whole(Keys.SSM.INNER_SIZE)
    if inner % hv:
        raise GGUFError(f"GGUF keys {k(Keys.SSM.TIME_STEP_RANK)}={hv}, {k(Keys.SSM.INNER_SIZE)}={inner}: the value "
                        "heads' width is a whole multiple of their count")
    if hv % hk:
        raise GGUFError(f"GGUF keys {k(Keys.SSM.GROUP_COUNT)}={hk}, {k(Keys.SSM.TIME_STEP_RANK)}={hv}: the value "
                        "heads are a whole multiple of the key heads")
    recurrent = field(k("{arch}.attention.recurrent_layers"), None, required=False)
    blocks = n_layers + int(field(k(Keys.LLM.NEXTN_PREDICT_LAYERS), 0, required=False))
    if recurrent is not None:
        if not isinstance(recurrent, list) or len(recurrent) != blocks or \
                any(not isinstance(r, bool) for r in recurrent):
            raise GGUFError(f"GGUF key {k('{arch}.attention.recurrent_layers')}: a flag for each of the {blocks} "
                            "blocks")
        types = ["linear_attention" if r else "full_attention" for r in recurrent[:n_layers]]
    else:
        interval = whole(Keys.LLM.FULL_ATTENTION_INTERVAL, 4)
        types = ["linear_attention" if interval < 1 or (i + 1) % interval else "full_attention" for i in range(n_layers)]
    sections = field(k(Keys.Rope.DIMENSION_SECTIONS), [], required=False)
    if not isinstance(sections, list) or (len(sections) > 3 and any(sections[3:])):
        raise GGUFError(f"GGUF key {k(Keys.Rope.DIMENSION_SECTIONS)}={sections!r}: llama.cpp turns a fourth section "
                        "by position 0, which transformers' text model does not; only three are read as plain RoPE")
    head_dim = whole(Keys.Attention.KEY_LENGTH, 0) or whole(Keys.LLM.EMBEDDING_LENGTH) // f.n_head
    if head_dim < 2:
        raise GGUFError(f"GGUF key {k(Keys.Attention.KEY_LENGTH)}: a head of {head_dim} dims")
    rope_dim = whole(Keys.Rope.DIMENSION_COUNT, head_dim)
    return {
        "layer_types": types, "head_dim": head_dim,
        "rope_parameters": {"rope_type": "default", "partial_rotary_factor": rope_dim / head_dim,
                            "rope_theta": float(field(k(Keys.Rope.FREQ_BASE), 10000.0, required=False))},
        "linear_conv_kernel_dim": kernel, "linear_key_head_dim": dk,
        "linear_num_key_heads": hk, "linear_num_value_heads": hv, "linear_value_head_dim": inner // hv,
        "num_experts": f.n_experts, "num_experts_per_tok": whole(Keys.LLM.EXPERT_USED_COUNT),
        "moe_intermediate_size": whole(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH),
        "shared_expert_intermediate_size": whole(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH),
    }


def grouped(order: np.ndarray):
    """The function putting back rows (axis 0, or `axis`) a converter stored in `order` (file row i: row order[i])."""
    inverse = np.argsort(order)

    def rows(t, axis: int = 0):
        if isinstance(t, Encoded) and axis == 0:  # whole rows move: the blocks stay as stored
            return Encoded(t.dtype, t.shape, t.values[inverse], None if t.scales is None else t.scales[inverse])
        return np.ascontiguousarray(np.take(floats(t), inverse, axis=axis))
    return rows


def tiled_order(hk: int, hv: int, width: int, before: int = 0) -> np.ndarray:
    """conversion/qwen.py's _reorder_v_heads: the value heads (each `width` rows, after `before` other rows) from
    grouped by key head [G0 v0..v(r-1), G1 ...] to tiled [G0 v0, G1 v0, ..., G0 v1, ...]."""
    heads = np.arange(hv * width).reshape(hk, hv // hk, width).transpose(1, 0, 2).reshape(-1)
    return np.concatenate([np.arange(before), before + heads])


def gguf_tensors(f: GGUFFile) -> dict[str, LazyTensor | np.ndarray]:
    """A qwen35moe file's tensors under transformers' names (the norms and the decay under names of their own, as
    stored), the value heads put back in transformers' order, each layer's experts split from llama.cpp's stacks."""
    pending = dict(f.tensors)
    out: dict[str, LazyTensor | np.ndarray] = {}
    cfg = gguf_config(f)
    hk, hv, dk, dv = (cfg[key] for key in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                           "linear_value_head_dim"))

    def take(t: MODEL_TENSOR, layer: int | None = None, kind: str | None = "weight", required: bool = True):
        name = gguf_name(t, layer) + (f".{kind}" if kind else "")  # (ssm_a: no suffix)
        if name not in pending:
            if required:
                raise GGUFError(f"GGUF file lacks tensor {name}")
            return None
        return pending.pop(name)

    def reordered(t: MODEL_TENSOR, layer: int, width: int, before: int = 0, axis: int = 0,
                  kind: str | None = "weight"):
        """The tensor with its value heads (`width` rows each, after `before` rows) in transformers' order again; its
        shape checked against the ssm keys before any order is built (a hostile key must not size an array)."""
        stored = take(t, layer, kind)
        shape, want = tuple(stored.shape), before + hv * width
        if len(shape) <= axis or shape[axis] != want:
            raise GGUFError(f"GGUF tensor {gguf_name(t, layer)}{'.' + kind if kind else ''} has shape {shape}: the "
                            f"ssm keys make its axis {axis} {want}")
        if hk == hv:  # nothing was reordered
            return stored
        return lazy(shape, stored, lambda values: grouped(tiled_order(hk, hv, width, before))(values, axis))

    out["model.embed_tokens.weight"] = take(MODEL_TENSOR.TOKEN_EMBD)
    out["model.norm.weight" + STORED] = take(MODEL_TENSOR.OUTPUT_NORM)
    head = take(MODEL_TENSOR.OUTPUT, required=False)
    if head is not None:
        out["lm_head.weight"] = head
    for layer, kind in enumerate(cfg["layer_types"]):
        p = f"model.layers.{layer}."
        out[p + "input_layernorm.weight" + STORED] = take(MODEL_TENSOR.ATTN_NORM, layer)
        out[p + "post_attention_layernorm.weight" + STORED] = take(MODEL_TENSOR.ATTN_POST_NORM, layer)
        if kind == "full_attention":
            for t, name in ((MODEL_TENSOR.ATTN_Q, "q_proj"), (MODEL_TENSOR.ATTN_K, "k_proj"),
                            (MODEL_TENSOR.ATTN_V, "v_proj"), (MODEL_TENSOR.ATTN_OUT, "o_proj")):
                out[f"{p}self_attn.{name}.weight"] = take(t, layer)
            out[p + "self_attn.q_norm.weight" + STORED] = take(MODEL_TENSOR.ATTN_Q_NORM, layer)
            out[p + "self_attn.k_norm.weight" + STORED] = take(MODEL_TENSOR.ATTN_K_NORM, layer)
        else:
            a = p + "linear_attn."
            qk = 2 * hk * dk  # (the q and k rows before the value heads')
            out[a + "in_proj_qkv.weight"] = reordered(MODEL_TENSOR.ATTN_QKV, layer, dv, before=qk)
            out[a + "in_proj_z.weight"] = reordered(MODEL_TENSOR.ATTN_GATE, layer, dv)
            out[a + "in_proj_b.weight"] = reordered(MODEL_TENSOR.SSM_BETA, layer, 1)
            out[a + "in_proj_a.weight"] = reordered(MODEL_TENSOR.SSM_ALPHA, layer, 1)
            out[a + "dt_bias"] = reordered(MODEL_TENSOR.SSM_DT, layer, 1, kind="bias")
            out[a + "decay" + STORED] = reordered(MODEL_TENSOR.SSM_A, layer, 1, kind=None)
            out[a + "conv1d.weight"] = reordered(MODEL_TENSOR.SSM_CONV1D, layer, dv, before=qk)
            out[a + "norm.weight"] = take(MODEL_TENSOR.SSM_NORM, layer)
            out[a + "out_proj.weight"] = reordered(MODEL_TENSOR.SSM_OUT, layer, dv, axis=1)
        m = p + "mlp."
        out[m + "gate.weight"] = take(MODEL_TENSOR.FFN_GATE_INP, layer)
        fused = take(MODEL_TENSOR.FFN_GATE_UP_EXP, layer, required=False)  # (the converter's --fuse-gate-up-exps)
        if fused is not None:
            for which, experts in zip(("gate_proj", "up_proj"), split_gate_up(fused, gguf_name(
                    MODEL_TENSOR.FFN_GATE_UP_EXP, layer) + ".weight")):
                for e, expert in enumerate(experts):
                    out[f"{m}experts.{e}.{which}.weight"] = expert
        for t, which in ((MODEL_TENSOR.FFN_GATE_EXP, "gate_proj"), (MODEL_TENSOR.FFN_UP_EXP, "up_proj"),
                         (MODEL_TENSOR.FFN_DOWN_EXP, "down_proj"))[2 if fused is not None else 0:]:
            stacked = take(t, layer)
            if len(stacked.shape) != 3:
                raise GGUFError(f"GGUF tensor {gguf_name(t, layer)}.weight has shape {tuple(stacked.shape)}: "
                                "llama.cpp stacks a layer's experts, [experts, rows, columns]")
            for e, expert in enumerate(split_experts(stacked)):
                out[f"{m}experts.{e}.{which}.weight"] = expert
        for t, name in ((MODEL_TENSOR.FFN_GATE_SHEXP, "gate_proj"), (MODEL_TENSOR.FFN_UP_SHEXP, "up_proj"),
                        (MODEL_TENSOR.FFN_DOWN_SHEXP, "down_proj")):
            out[f"{m}shared_expert.{name}.weight"] = take(t, layer)
        out[m + "shared_expert_gate.weight"] = as_row(take(MODEL_TENSOR.FFN_GATE_INP_SHEXP, layer))  # [D] or [1, D]
    if pending:
        raise GGUFError(f"GGUF tensors the runtime would not use: {', '.join(sorted(pending)[:5])}")
    return out


def as_transformers(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """gguf_tensors' f32 values under transformers' own names, for transformers to load (colibri/oracle.py): the
    norms' w from 1 + w and A_log from the decay (within an ulp or two: the oracle's, not the image's)."""
    out = {}
    for name, t in tensors.items():
        if name.endswith("linear_attn.decay" + STORED):
            out[name.replace("decay" + STORED, "A_log")] = np.log(-t).astype(np.float32)
        elif name.endswith(STORED):
            out[name[:-len(STORED)]] = (t - np.float32(1)).astype(np.float32)
        else:
            out[name] = t
    return out


FAMILIES = {
    "Qwen3_5MoeForCausalLM": Family(
        moe=True, expert_ffn_key="moe_intermediate_size", moe_prefix="mlp",
        expert_names=("gate_proj", "up_proj", "down_proj"), fused_experts=("experts.gate_up_proj", "experts.down_proj"),
        qk_norm=FLAG_QK_NORM_HEAD, shared_expert=True, norm_topk_default=True, partial_rope=True,
        own_keys=(*KEYS, "full_attention_interval"), derive=derive, tensor=tensor,
        ignored_prefixes=("mtp.",),  # the multi-token-prediction layers, which transformers does not load either
        gguf_arch="qwen35moe", gguf_read_config=gguf_config, gguf_read_tensors=gguf_tensors),
}
