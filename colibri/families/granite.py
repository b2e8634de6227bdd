"""Granite MoE (transformers' GraniteMoeForCausalLM), all data: its multipliers folded into the weights they scale
(the embedding times embedding_multiplier; each layer's attention and MoE outputs times residual_multiplier before
their residual add, so o, its bias and each expert's down; the head divided by logits_scaling), attention_multiplier
as the softmax scale, a softmax over the top-k router logits, the experts fused; from GGUF, llama.cpp's granitemoe
(conversion/granite.py: the multipliers under its scale keys, the experts split, q/k rows permuted)."""
from colibri.families.base import Family
from colibri.format import Role
from colibri.dims import FLAG_ROUTER_TOPK_SOFTMAX

FAMILIES = {
    "GraniteMoeForCausalLM": Family(
        moe=True, expert_ffn_key="intermediate_size", moe_prefix="block_sparse_moe",
        expert_names=("gate_proj", "up_proj", "down_proj"), n_experts_key="num_local_experts",
        router_name="router.layer.weight",
        fused_experts=("input_linear.weight", "output_linear.weight"), flags=FLAG_ROUTER_TOPK_SOFTMAX,
        attn_scale_key="attention_multiplier",
        own_keys=("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"),
        weight_scales=((Role.TOKEN_EMBD, "embedding_multiplier", False), (Role.WO, "residual_multiplier", False),
                       (Role.BO, "residual_multiplier", False), (Role.EXPERT_DOWN, "residual_multiplier", False),
                       (Role.LM_HEAD, "logits_scaling", True)),
        gguf_arch="granitemoe", gguf_permuted_qk=True,
        gguf_config=(("{arch}.embedding_scale", "embedding_multiplier"), ("{arch}.residual_scale", "residual_multiplier"),
                     ("{arch}.attention.scale", "attention_multiplier"), ("{arch}.logit_scale", "logits_scaling"))),
}
