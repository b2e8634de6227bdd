"""DeepSeek-V2 and V3: multi-head latent attention, their routers, shared experts (checkpoint.py's _deepseek)."""
from colibri.families.base import Family

DEEPSEEK = dict(moe=True, expert_ffn_key="moe_intermediate_size", moe_prefix="mlp",
                expert_names=("gate_proj", "up_proj", "down_proj"), shared_prefix="shared_experts")
FAMILIES = {
    "DeepseekV2ForCausalLM": Family(**DEEPSEEK, deepseek=2),
    "DeepseekV3ForCausalLM": Family(**DEEPSEEK, deepseek=3),
}
