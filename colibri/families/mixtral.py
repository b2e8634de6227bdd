"""Mixtral (transformers' MixtralForCausalLM): every layer MoE, no biases, top-k always renormalized."""
from colibri.families.base import Family

FAMILIES = {
    "MixtralForCausalLM": Family(moe=True, expert_ffn_key="intermediate_size", moe_prefix="block_sparse_moe",
                                 expert_names=("w1", "w3", "w2"), norm_topk_default=True, bias_key="",
                                 n_experts_key="num_local_experts", window_rule="all", window_switch=False,
                                 window_layer_types=False, gguf_arch="llama", gguf_permuted_qk=True,
                                 default_eps=1e-5, default_theta=1e6),
}
