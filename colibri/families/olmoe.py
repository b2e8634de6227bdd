"""OLMoE: q/k norms across the whole projections, clip_qkv."""
from colibri.families.base import Family
from colibri.dims import FLAG_QK_NORM_FULL

FAMILIES = {
    "OlmoeForCausalLM": Family(moe=True, expert_ffn_key="intermediate_size", moe_prefix="mlp",
                               expert_names=("gate_proj", "up_proj", "down_proj"), qk_norm=FLAG_QK_NORM_FULL,
                               clip_qkv=True, gguf_arch="olmoe", gguf_norm_topk=False, default_eps=1e-5),
}
