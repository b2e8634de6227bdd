"""Gemma 4: its layer, attention and RoPE per layer type (checkpoint.py's _gemma4 and gemma4_tensor)."""
from colibri.families.base import Family
from colibri.format import FLAG_QK_NORM_HEAD

FAMILIES = {
    "Gemma4ForCausalLM": Family(moe=True, expert_ffn_key="moe_intermediate_size", moe_prefix="",
                                expert_names=("", "", ""), qk_norm=FLAG_QK_NORM_HEAD, gemma4=True),
}
