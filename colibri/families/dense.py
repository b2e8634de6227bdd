"""The dense models: Llama, Qwen2 (q/k/v biases always), Qwen3 (per-head q/k norms)."""
from colibri.families.base import Family
from colibri.dims import FLAG_QK_NORM_HEAD

DENSE = dict(moe=False, expert_ffn_key="", moe_prefix="", expert_names=("", "", ""))
FAMILIES = {
    "LlamaForCausalLM": Family(**DENSE, gguf_arch="llama", gguf_permuted_qk=True),
    "Qwen2ForCausalLM": Family(**DENSE, bias_key="", bias_default=True, bias_on_o=False, gguf_arch="qwen2",
                               window_rule="from_max"),
    "Qwen3ForCausalLM": Family(**DENSE, qk_norm=FLAG_QK_NORM_HEAD, gguf_arch="qwen3", window_rule="from_max"),
}
