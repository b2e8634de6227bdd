"""Qwen2-MoE and Qwen3-MoE: dense layers by mlp_only_layers and decoder_sparse_step; Qwen2-MoE's shared expert and
q/k/v biases, Qwen3-MoE's per-head q/k norms."""
from colibri.families.base import Family
from colibri.dims import FLAG_QK_NORM_HEAD

QWEN_MOE = dict(moe=True, expert_ffn_key="moe_intermediate_size", moe_prefix="mlp",
                expert_names=("gate_proj", "up_proj", "down_proj"), sparse_layer_rule=True)
FAMILIES = {
    "Qwen2MoeForCausalLM": Family(**QWEN_MOE, shared_expert=True, bias_key="qkv_bias", bias_default=True,
                                  bias_on_o=False, gguf_arch="qwen2moe", window_rule="even_below_max",
                                  gguf_norm_topk=False),
    "Qwen3MoeForCausalLM": Family(**QWEN_MOE, qk_norm=FLAG_QK_NORM_HEAD, gguf_arch="qwen3moe", window_rule="all", gguf_norm_topk=True,
                                  window_layer_types=False),
}
