"""gpt-oss: sinks, a top-k-then-softmax router with a bias, fused experts with biases, the clamped SwiGLU
(docs/MODELS.md). Its config's fields and flags (`derive`), and its experts and their biases from the fused tensors,
MXFP4 or not (`tensor`)."""
from __future__ import annotations

import numpy as np

from colibri.families.base import ConfigContext, Family, OwnFields, UnsupportedModel, derived_tensor
from colibri.format import FLAG_ATTN_SINKS, FLAG_EXPERT_BIAS, FLAG_ROUTER_BIAS, FLAG_ROUTER_TOPK_SOFTMAX, Role
from colibri.lazy import expert_of
from colibri.quant import mxfp4_dequantize

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
    if p + fused + "_blocks" in raw:  # MXFP4: [E, out, in] once dequantized
        blocks, scales = raw[p + fused + "_blocks"], raw[p + fused + "_scales"]
        compute = lambda: mxfp4_dequantize(expert_of(blocks, expert), expert_of(scales, expert))[rows]  # noqa: E731
        return [p + fused + "_blocks", p + fused + "_scales"], derived_tensor(blocks, shape, compute)
    source = raw[p + fused]
    compute = lambda: np.asarray(expert_of(source, expert), np.float32).T[rows]  # noqa: E731
    return [p + fused], derived_tensor(source, shape, compute)


FAMILIES = {
    "GptOssForCausalLM": Family(moe=True, expert_ffn_key="intermediate_size", moe_prefix="mlp",
                                expert_names=("", "", ""), bias_default=True, router_name="router.weight",
                                router_bias_name="router.bias", routes_itself=True, window_rule="even",
                                window_switch=False,
                                own_keys=("swiglu_alpha", "swiglu_limit", "quantization_config"),
                                derive=derive, tensor=tensor),
}
