"""Granite MoE (transformers' GraniteMoeForCausalLM), all data: its multipliers folded into the weights they scale
(the embedding times embedding_multiplier; each layer's attention and MoE outputs times residual_multiplier before
their residual add, so o, its bias and each expert's down; the head divided by logits_scaling), attention_multiplier
as the softmax scale, a softmax over the top-k router logits, the experts fused; from GGUF, llama.cpp's granitemoe
(conversion/granite.py: the multipliers under its scale keys, the experts split, q/k rows permuted). GraniteMoeShared
(GraniteMoeSharedForCausalLM): the same with an ungated shared MLP beside the experts."""
from dataclasses import replace

from colibri.families.base import ConfigContext, Family, OwnFields, UnsupportedModel, derived_tensor
from colibri.format import Role
from colibri.dims import FLAG_ROUTER_TOPK_SOFTMAX, FLAG_SHARED_PLAIN
from colibri.gguf_common import MODEL_TENSOR, Joined
from colibri.lazy import loaded
from colibri.quant import matrix_rows

MULTIPLIERS = ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")
SCALED = ((Role.TOKEN_EMBD, "embedding_multiplier", False), (Role.WO, "residual_multiplier", False),
          (Role.BO, "residual_multiplier", False), (Role.EXPERT_DOWN, "residual_multiplier", False),
          (Role.LM_HEAD, "logits_scaling", True))


def shared_derive(cfg: dict, ctx: ConfigContext) -> OwnFields:
    """GraniteMoeShared's shared MLP beside the experts: shared_intermediate_size wide (0: none), ungated."""
    shared = cfg.get("shared_intermediate_size") or 0
    if not isinstance(shared, int) or isinstance(shared, bool) or shared < 0:
        raise UnsupportedModel(f"config field shared_intermediate_size={shared!r}: a whole number, 0 for none")
    shared = shared if ctx.any_moe else 0
    return OwnFields({"shared_ffn_size": shared}, FLAG_SHARED_PLAIN if shared else 0)


def shared_tensor(raw: dict, d, key: tuple[Role, int, int]) -> tuple[list[str], object] | None:
    """(checkpoint names read, tensor) for the shared MLP, stored as GraniteMoeSharedMLP holds it: input_linear
    [2S, D], the gate's rows first (its chunk(2) of the output), and output_linear [D, S]."""
    role, layer, _ = key
    p = f"model.layers.{layer}.shared_mlp."
    if role == Role.SHARED_DOWN:
        return [p + "output_linear.weight"], raw[p + "output_linear.weight"]
    if role not in (Role.SHARED_GATE, Role.SHARED_UP):
        return None
    name, width = p + "input_linear.weight", d.shared_ffn_size
    source = raw[name]
    if tuple(source.shape) != (2 * width, d.hidden_size):
        raise UnsupportedModel(f"checkpoint tensor {name} has shape {list(source.shape)}; shared_intermediate_size "
                               f"and hidden_size make it {[2 * width, d.hidden_size]}")
    rows = slice(0, width) if role == Role.SHARED_GATE else slice(width, 2 * width)
    if isinstance(source, Joined) and source.part(rows) is not None:  # from GGUF: the converter's gate or up alone
        return [name], source.part(rows)
    return [name], derived_tensor(source, (width, d.hidden_size), lambda: matrix_rows(loaded(source), rows))


GRANITE_MOE = Family(
    moe=True, expert_ffn_key="intermediate_size", moe_prefix="block_sparse_moe",
    expert_names=("gate_proj", "up_proj", "down_proj"), n_experts_key="num_local_experts",
    router_name="router.layer.weight",
    fused_experts=("input_linear.weight", "output_linear.weight"), flags=FLAG_ROUTER_TOPK_SOFTMAX,
    attn_scale_key="attention_multiplier", own_keys=MULTIPLIERS, weight_scales=SCALED,
    gguf_arch="granitemoe", gguf_permuted_qk=True,
    gguf_config=(("{arch}.embedding_scale", "embedding_multiplier"), ("{arch}.residual_scale", "residual_multiplier"),
                 ("{arch}.attention.scale", "attention_multiplier"), ("{arch}.logit_scale", "logits_scaling")))
FAMILIES = {
    "GraniteMoeForCausalLM": GRANITE_MOE,
    # and its shared MLP, whose output joins the experts' before the residual multiplier (so it scales its down too);
    # from GGUF, a granitemoe file whose expert_shared_feed_forward_length is above 0 (llama.cpp reads the shared MLP
    # only then: src/models/granite-moe.cpp; 0, or no key, is GraniteMoe's file), its input_linear split by the
    # converter into ffn_gate_shexp and ffn_up_shexp (joined back, each read alone for the gate or the up)
    "GraniteMoeSharedForCausalLM": replace(
        GRANITE_MOE, own_keys=(*MULTIPLIERS, "shared_intermediate_size"),
        weight_scales=(*SCALED, (Role.SHARED_DOWN, "residual_multiplier", False)),
        derive=shared_derive, tensor=shared_tensor, gguf_variant_key="{arch}.expert_shared_feed_forward_length",
        gguf_shared_ffn_key="shared_intermediate_size", gguf_shared_fused="shared_mlp.input_linear",
        gguf_layer_tensors=((MODEL_TENSOR.FFN_DOWN_SHEXP, "shared_mlp.output_linear"),)),
}
