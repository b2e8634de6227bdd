"""GLM-4.7-Flash (transformers' Glm4MoeLiteForCausalLM): DeepSeek-V3's latent attention, sigmoid router with its
correction bias and groups, and shared expert (colibri/families/deepseek.py), with its layers dense or sparse as
`mlp_layer_types` lists them. llama.cpp writes it as `deepseek2` (read as DeepSeek-V3: the same computation)."""
from __future__ import annotations

from colibri import rope
from colibri.families.base import ConfigContext, Family, OwnFields, UnsupportedModel
from colibri.families.deepseek import DEEPSEEK, derive


def moe_layers(cfg: dict, n_layers: int) -> tuple[bool, ...]:
    """mlp_layer_types: each layer "dense" or "sparse" (transformers' default: the first dense, the rest sparse)."""
    types = cfg.get("mlp_layer_types") or ["dense"] + ["sparse"] * (n_layers - 1)
    if not isinstance(types, list) or len(types) != n_layers or set(types) - {"dense", "sparse"}:
        raise UnsupportedModel(f"config field mlp_layer_types={types!r}: one of 'dense' or 'sparse' per layer "
                               f"({n_layers})")
    return tuple(t == "sparse" for t in types)


def derive_glm(cfg: dict, ctx: ConfigContext) -> OwnFields:
    """DeepSeek-V3's fields (its router, latent attention and shared experts), after refusing what GLM reads
    otherwise: RoPE over part of the rope dims (its default RoPE reads partial_rotary_factor)."""
    try:
        factor = rope.rope_parameters(cfg).get("partial_rotary_factor", 1.0)
    except (rope.UnsupportedRope, KeyError, TypeError, AttributeError) as exc:
        raise UnsupportedModel(f"config field rope_parameters/rope_scaling: {exc}") from None
    if factor != 1.0:
        raise UnsupportedModel(f"config field partial_rotary_factor={factor}: the runtime rotates every one of the "
                               "qk_rope_head_dim dims")
    return derive(3, cfg, ctx)


# DeepSeek's record but for its layer rule and config fields: those it shares with DeepSeek are its own too, the ones
# only DeepSeek's code reads (first_k_dense_replace, scoring_func, topk_method, moe_layer_freq) refused as DeepSeek's
DEEPSEEK_ONLY = ("first_k_dense_replace", "scoring_func", "topk_method", "moe_layer_freq")
FAMILIES = {
    "Glm4MoeLiteForCausalLM": Family(**{**DEEPSEEK, "moe_layer_rule": moe_layers, "derive": derive_glm, "own_keys": (
        "mlp_layer_types", *(k for k in DEEPSEEK["own_keys"] if k not in DEEPSEEK_ONLY))}),
}
