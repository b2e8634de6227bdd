"""gpt-oss: sinks, a top-k-then-softmax router with a bias, fused experts with biases, the clamped SwiGLU
(docs/MODELS.md). Its config's fields and flags (`derive`), and its experts and their biases from the fused tensors,
MXFP4 or not (`tensor`)."""
from __future__ import annotations

import numpy as np

from colibri.families.base import ConfigContext, Family, OwnFields, UnsupportedModel, derived_tensor
from colibri.gguf_common import (MODEL_TENSOR, GGUFError, GGUFFile, Keys, fused_gate_up, gguf_name, lazy,
                                 transposed)
from colibri.format import Role
from colibri.dims import FLAG_ATTN_SINKS, FLAG_EXPERT_BIAS, FLAG_ROUTER_BIAS, FLAG_ROUTER_TOPK_SOFTMAX
from colibri.lazy import Derived, LazyTensor, expert_of
from colibri.quant import DType, Encoded, mxfp4_blocks_from_hf, mxfp4_blocks_to_hf

EXPERTS = (Role.EXPERT_GATE, Role.EXPERT_UP, Role.EXPERT_DOWN, Role.EXPERT_GATE_BIAS, Role.EXPERT_UP_BIAS,
           Role.EXPERT_DOWN_BIAS)


def derive(cfg: dict, ctx: ConfigContext) -> OwnFields:
    """gpt-oss's mechanisms as ModelDims fields and flags: attention sinks, the router's bias and softmax over its
    top-k logits, the experts' biases and clamped SwiGLU (docs/MODELS.md)."""
    quant = cfg.get("quantization_config")
    if quant is not None and quant.get("quant_method") != "mxfp4":
        raise UnsupportedModel(f"config field quantization_config: quant_method={quant.get('quant_method')!r}; only "
                               "gpt-oss's mxfp4 experts are read")
    alpha, limit = float(cfg.get("swiglu_alpha", 1.702)), float(cfg.get("swiglu_limit", 7.0))
    if not (alpha > 0 and limit > 0):
        raise UnsupportedModel(f"config fields swiglu_alpha={alpha}, swiglu_limit={limit} must be positive")
    if cfg.get("norm_topk_prob"):
        raise UnsupportedModel("config field norm_topk_prob=true: transformers' gpt-oss router takes a softmax over the "
                               "top-k logits and reads no norm_topk_prob")
    flags = FLAG_ATTN_SINKS | FLAG_ROUTER_BIAS | FLAG_ROUTER_TOPK_SOFTMAX | FLAG_EXPERT_BIAS
    return OwnFields({"swiglu_alpha": alpha, "swiglu_limit": limit}, flags)


def tensor(raw: dict, d, key: tuple[Role, int, int]) -> tuple[list[str], object] | None:
    """(checkpoint names read, tensor) for a routed expert's matrix or a layer's expert bias table, from gpt-oss's
    fused experts: gate_up_proj [E, D, 2F] (gate and up interleaved by column), down_proj [E, F, D], or their
    MXFP4 blocks and scales ([E, out, in / 32, 16] and [E, out, in / 32], not transposed), and the biases
    gate_up_proj_bias [E, 2F], down_proj_bias [E, D]."""
    role, layer, expert = key
    if role not in EXPERTS:
        return None
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
    if p + fused + "_blocks" in raw:  # MXFP4, kept as the image's MXFP4 blocks: [E, out, in]
        blocks, scales = raw[p + fused + "_blocks"], raw[p + fused + "_scales"]

        def compute() -> Encoded:
            return Encoded(DType.MXFP4, shape, mxfp4_blocks_from_hf(expert_of(blocks, expert),
                                                                    expert_of(scales, expert))[rows])
        names = [p + fused + "_blocks", p + fused + "_scales"]
        return names, Derived(shape, compute, kept=DType.MXFP4) if isinstance(blocks, LazyTensor) else compute()
    source = raw[p + fused]
    compute = lambda: np.asarray(expert_of(source, expert), np.float32).T[rows]  # noqa: E731
    return [p + fused], derived_tensor(source, shape, compute)


# llama.cpp's expert activation for gpt-oss (src/llama-graph.cpp, LLM_FFN_SWIGLU_OAI_MOE): constants, not keys
LLAMA_CPP_SWIGLU_ALPHA, LLAMA_CPP_SWIGLU_LIMIT = 1.702, 7.0


def gguf_config(f: GGUFFile) -> dict:
    """The gpt-oss config fields of a gpt-oss file, as llama.cpp runs it: the sliding window on the even
    layers (its swa pattern 2), its constant SwiGLU alpha and limit, YaRN with the correction range rounded
    to whole dimensions (ggml's rope_yarn_corr_dims floors and ceils)."""
    field, k, n_layers, n_experts, tensors = f.field, f.key, f.n_layers, f.n_experts, f.tensors
    if field(k(Keys.Attention.SLIDING_WINDOW_PATTERN), None, required=False) is not None:
        raise GGUFError(f"GGUF key {k(Keys.Attention.SLIDING_WINDOW_PATTERN)} is not read; llama.cpp's gpt-oss "
                        "files window the even layers")
    cfg = {
        "sliding_window": int(field(k(Keys.Attention.SLIDING_WINDOW))),
        "layer_types": ["sliding_attention" if layer % 2 == 0 else "full_attention" for layer in range(n_layers)],
        "swiglu_alpha": LLAMA_CPP_SWIGLU_ALPHA, "swiglu_limit": LLAMA_CPP_SWIGLU_LIMIT,
        "attention_bias": gguf_name(MODEL_TENSOR.ATTN_Q, 0) + ".bias" in tensors,
        "num_local_experts": n_experts, "num_experts_per_tok": int(field(k(Keys.LLM.EXPERT_USED_COUNT))),
        "intermediate_size": int(field(k(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH))),
    }
    scaling = field(k(Keys.Rope.SCALING_TYPE), None, required=False)
    if scaling == "yarn":
        cfg["rope_scaling"] = {
            "rope_type": "yarn", "factor": float(field(k(Keys.Rope.SCALING_FACTOR))), "truncate": True,
            "original_max_position_embeddings": int(field(k(Keys.Rope.SCALING_ORIG_CTX_LEN))),
            "beta_fast": float(field(k(Keys.Rope.SCALING_YARN_BETA_FAST), 32.0, required=False)),
            "beta_slow": float(field(k(Keys.Rope.SCALING_YARN_BETA_SLOW), 1.0, required=False)),
        }
    return cfg


def hf_mxfp4(parts: list[Encoded], which: str) -> np.ndarray:
    """GGUF MXFP4 matrices ([..., rows, G, 17]; gate and up, or down alone) as gpt-oss's `_blocks` or `_scales`
    (gate and up rows interleaved, gate first, as gate_up_proj holds them)."""
    values = parts[0].values
    if len(parts) == 2:
        values = np.empty((*values.shape[:-3], 2 * values.shape[-3], *values.shape[-2:]), np.uint8)
        values[..., 0::2, :, :], values[..., 1::2, :, :] = parts[0].values, parts[1].values
    blocks, scales = mxfp4_blocks_to_hf(values)
    return blocks if which == "_blocks" else scales


def gguf_tensors(f: GGUFFile) -> dict[str, LazyTensor | np.ndarray]:
    """A gpt-oss file's tensors under transformers' names and in its layout: every layer's experts fused
    (gate_up_proj [E, D, 2F], gate and up interleaved by column; down_proj [E, F, D]), as GptOssExperts holds them,
    or, when they are MXFP4 (llama.cpp's converter keeps gpt-oss's), as its MXFP4 blocks and scales, which the image
    keeps as MXFP4. The other tensors stay as stored (a quantized one carries over unchanged)."""
    n_layers, pending = f.n_layers, dict(f.tensors)
    out: dict[str, LazyTensor | np.ndarray] = {}

    def take(name_in_file: str) -> LazyTensor:
        if name_in_file not in pending:
            raise GGUFError(f"GGUF file lacks tensor {name_in_file}")
        return pending.pop(name_in_file)

    out["model.embed_tokens.weight"] = take(gguf_name(MODEL_TENSOR.TOKEN_EMBD) + ".weight")
    out["model.norm.weight"] = take(gguf_name(MODEL_TENSOR.OUTPUT_NORM) + ".weight")
    if gguf_name(MODEL_TENSOR.OUTPUT) + ".weight" in pending:
        out["lm_head.weight"] = take(gguf_name(MODEL_TENSOR.OUTPUT) + ".weight")
    for layer in range(n_layers):
        p = f"model.layers.{layer}."
        name = lambda t, kind="weight": f"{gguf_name(t, layer)}.{kind}"  # noqa: E731
        out[p + "input_layernorm.weight"] = take(name(MODEL_TENSOR.ATTN_NORM))
        out[p + "post_attention_layernorm.weight"] = take(name(MODEL_TENSOR.ATTN_POST_NORM))
        out[p + "self_attn.sinks"] = take(name(MODEL_TENSOR.ATTN_SINKS))
        for t, proj in ((MODEL_TENSOR.ATTN_Q, "q_proj"), (MODEL_TENSOR.ATTN_K, "k_proj"), (MODEL_TENSOR.ATTN_V, "v_proj"),
                        (MODEL_TENSOR.ATTN_OUT, "o_proj")):
            for kind in ("weight", "bias"):
                if name(t, kind) in pending:
                    out[f"{p}self_attn.{proj}.{kind}"] = take(name(t, kind))
        out[p + "mlp.router.weight"] = take(name(MODEL_TENSOR.FFN_GATE_INP))
        out[p + "mlp.router.bias"] = take(name(MODEL_TENSOR.FFN_GATE_INP, "bias"))
        gate, up = take(name(MODEL_TENSOR.FFN_GATE_EXP)), take(name(MODEL_TENSOR.FFN_UP_EXP))  # [E, F, D]
        if len(gate.shape) != 3:
            raise GGUFError(f"GGUF tensor {name(MODEL_TENSOR.FFN_GATE_EXP)} has shape {tuple(gate.shape)}: llama.cpp "
                            "stacks the experts' gates as [experts, ffn, hidden]")
        n_experts, ffn, hidden = gate.shape
        down = take(name(MODEL_TENSOR.FFN_DOWN_EXP))  # [E, D, F]
        biases = {MODEL_TENSOR.FFN_GATE_EXP: (n_experts, ffn), MODEL_TENSOR.FFN_UP_EXP: (n_experts, ffn),
                  MODEL_TENSOR.FFN_DOWN_EXP: (n_experts, hidden)}
        for t, shape in ((up, gate.shape), (down, (n_experts, hidden, ffn)),
                         *((pending.get(name(kind, "bias")), want) for kind, want in biases.items())):
            if t is not None and tuple(t.shape) != tuple(shape):
                raise GGUFError(f"GGUF layer {layer}'s expert tensors disagree with its {name(MODEL_TENSOR.FFN_GATE_EXP)} "
                                f"{tuple(gate.shape)}: one has shape {tuple(t.shape)}, not {tuple(shape)}")
        if gate.kept == up.kept == down.kept == DType.MXFP4:  # kept as MXFP4, in gpt-oss's blocks and scales
            for part, stacked, rows in (("gate_up_proj", (gate, up), 2 * ffn), ("down_proj", (down,), hidden)):
                cols = down.shape[2] if part == "down_proj" else hidden
                for which, shape in (("_blocks", (n_experts, rows, cols // 32, 16)), ("_scales", (n_experts, rows, cols // 32))):
                    out[p + "mlp.experts." + part + which] = Derived(
                        shape, lambda stacked=stacked, which=which: hf_mxfp4([t.load() for t in stacked], which),
                        lambda i, stacked=stacked, which=which: hf_mxfp4([t.expert(i) for t in stacked], which))
        else:
            out[p + "mlp.experts.gate_up_proj"] = Derived(
                (n_experts, hidden, 2 * ffn), lambda gate=gate, up=up: fused_gate_up(gate.load(), up.load()),
                lambda i, gate=gate, up=up: fused_gate_up(gate.expert(i), up.expert(i)))
        bias = np.empty((n_experts, 2 * ffn), np.float32)
        bias[:, 0::2] = np.asarray(take(name(MODEL_TENSOR.FFN_GATE_EXP, "bias")), np.float32)
        bias[:, 1::2] = np.asarray(take(name(MODEL_TENSOR.FFN_UP_EXP, "bias")), np.float32)
        out[p + "mlp.experts.gate_up_proj_bias"] = bias
        if down.kept != DType.MXFP4 or gate.kept != DType.MXFP4 or up.kept != DType.MXFP4:
            out[p + "mlp.experts.down_proj"] = lazy((n_experts, ffn, hidden), down, transposed, transposed)
        out[p + "mlp.experts.down_proj_bias"] = take(name(MODEL_TENSOR.FFN_DOWN_EXP, "bias"))
    if pending:
        raise GGUFError(f"GGUF tensors the runtime would not use: {', '.join(sorted(pending)[:5])}")
    return out


FAMILIES = {
    "GptOssForCausalLM": Family(moe=True, expert_ffn_key="intermediate_size", moe_prefix="mlp",
                                expert_names=("", "", ""), bias_default=True, router_name="router.weight",
                                router_bias_name="router.bias", routes_itself=True, window_rule="even",
                                window_switch=False, default_eps=1e-5, default_theta=150000.0,
                                own_keys=("swiglu_alpha", "swiglu_limit", "quantization_config"),
                                derive=derive, tensor=tensor, gguf_arch="gpt-oss", gguf_read_config=gguf_config,
                                gguf_read_tensors=gguf_tensors),
}
