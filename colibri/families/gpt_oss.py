"""gpt-oss: sinks, a top-k-then-softmax router with a bias, fused experts with biases, the clamped SwiGLU
(checkpoint.py's _gpt_oss and gpt_oss_expert_tensor)."""
from colibri.families.base import Family

FAMILIES = {
    "GptOssForCausalLM": Family(moe=True, expert_ffn_key="intermediate_size", moe_prefix="mlp",
                                expert_names=("", "", ""), bias_default=True, gpt_oss=True, router_name="router.weight"),
}
