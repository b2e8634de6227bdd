"""GLM-4.7-Flash (transformers' Glm4MoeLiteForCausalLM): DeepSeek-V3's latent attention, sigmoid router with its
correction bias and groups, and shared expert (colibri/families/deepseek.py), with its layers dense or sparse as
`mlp_layer_types` lists them. llama.cpp writes it as `deepseek2` (read as DeepSeek-V3: the same computation)."""
from __future__ import annotations

from colibri import rope
from colibri.families.base import ConfigContext, Family, OwnFields, UnsupportedModel
from colibri.families.deepseek import DEEPSEEK, derive


def moe_layers(cfg: dict, n_layers: int) -> tuple[bool, ...]:
    """mlp_layer_types: each layer "dense" or "sparse" (transformers' default: the first dense, the rest sparse). The
    released config also states first_k_dense_replace, which transformers' GLM does not read: it must agree."""
    types = cfg.get("mlp_layer_types") or ["dense"] + ["sparse"] * (n_layers - 1)
    if not isinstance(types, list) or len(types) != n_layers or set(types) - {"dense", "sparse"}:
        raise UnsupportedModel(f"config field mlp_layer_types={types!r}: one of 'dense' or 'sparse' per layer "
                               f"({n_layers})")
    moe = tuple(t == "sparse" for t in types)
    first = cfg.get("first_k_dense_replace")
    if first is not None and moe != tuple(layer >= int(first) for layer in range(n_layers)):
        raise UnsupportedModel(f"config field first_k_dense_replace={first} disagrees with the layers transformers' "
                               f"GLM makes (mlp_layer_types {types}), which it does not read")
    return moe


def derive_glm(cfg: dict, ctx: ConfigContext) -> OwnFields:
    """DeepSeek-V3's fields (its router, latent attention and shared experts; the DeepSeek fields a released config
    states, which transformers' GLM does not read, must say what GLM does: topk_method noaux_tc, scoring_func
    sigmoid, moe_layer_freq 1), after refusing RoPE over part of the rope dims (GLM's default RoPE reads
    partial_rotary_factor, at the top of the config or in its RoPE parameters)."""
    try:
        factors = {cfg.get("partial_rotary_factor", 1.0), rope.rope_parameters(cfg).get("partial_rotary_factor", 1.0)}
    except (rope.UnsupportedRope, KeyError, TypeError, AttributeError) as exc:
        raise UnsupportedModel(f"config field rope_parameters/rope_scaling: {exc}") from None
    if factors != {1.0}:
        raise UnsupportedModel(f"config field partial_rotary_factor={max(factors - {1.0})}: the runtime rotates every "
                               "one of the qk_rope_head_dim dims")
    return derive(3, cfg, ctx)


FAMILIES = {  # DeepSeek's record, its fields its own too, but for its layer rule and its RoPE factor
    "Glm4MoeLiteForCausalLM": Family(**{**DEEPSEEK, "moe_layer_rule": moe_layers, "derive": derive_glm,
                                        "default_eps": 1e-5,
                                        "own_keys": ("mlp_layer_types", *DEEPSEEK["own_keys"]),
                                        "reads": (*DEEPSEEK["reads"], "partial_rotary_factor")}),
}
