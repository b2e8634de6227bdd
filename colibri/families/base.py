"""What a family file declares: the Family record (colibri/families/__init__.py says how to add one)."""
from __future__ import annotations

from dataclasses import dataclass

from colibri.format import Role


@dataclass(frozen=True)
class Family:
    """What distinguishes an architecture; the numbers themselves always come from the config."""
    moe: bool
    expert_ffn_key: str         # config key of a routed expert's intermediate size
    moe_prefix: str             # tensor names of the MoE block: router and experts
    expert_names: tuple[str, str, str]  # gate, up, down inside an expert
    n_experts_key: str = "num_experts"  # the config key a GGUF file's expert count is written under
    qk_norm: int = 0            # FLAG_QK_NORM_HEAD or FLAG_QK_NORM_FULL
    shared_expert: bool = False
    sparse_layer_rule: bool = False  # mlp_only_layers and decoder_sparse_step pick dense layers
    norm_topk_default: bool | None = None  # None: read norm_topk_prob; True/False: fixed by the architecture
    bias_key: str = "attention_bias"  # config key of the q/k/v(/o) bias switch
    bias_default: bool = False
    bias_on_o: bool = True
    clip_qkv: bool = False      # the family's modeling file clamps q, k, v (after the q/k norms) by clip_qkv
    deepseek: int = 0           # 2 or 3: DeepSeek-V2/V3 (multi-head latent attention, their routers)
    gpt_oss: bool = False       # sinks, a top-k-then-softmax router, experts fused with biases, clamped SwiGLU
    gemma4: bool = False        # Gemma 4's layer, attention and rope per layer type (checkpoint.py's _gemma4)
    shared_prefix: str = "shared_expert"  # the shared expert's module under mlp.
    router_name: str = "gate.weight"  # the router's tensor under moe_prefix
    # the experts fused per layer under moe_prefix: gate and up as [E, 2F, D] (gate rows first), down as [E, D, F]
    # (a GGUF file's experts, split by llama.cpp's converter, come under expert_names instead)
    fused_experts: tuple[str, str] | None = None
    flags: int = 0              # image flags the architecture always has
    own_keys: tuple[str, ...] = ()  # config fields only this family reads: another family's config refuses them
    attn_scale_key: str = ""    # config field of the softmax scale (else 1/sqrt(head_dim))
    # config fields whose value multiplies a role's weights as packed (1 / value with `divide`): a scale the
    # architecture applies to a layer's output, folded into the matrix that makes it
    weight_scales: tuple[tuple[Role, str, bool], ...] = ()
    # llama.cpp: the GGUF architecture its converter writes (gguf_input.py reads it as this family; "" for the
    # architectures gguf_input.py maps itself: llama, deepseek2, gpt-oss), whether the converter permutes q and k
    # rows (LlamaModel and its subclasses), and config fields read from GGUF keys ({arch} in the key: the
    # architecture), each required
    gguf_arch: str = ""
    gguf_permuted_qk: bool = False
    gguf_config: tuple[tuple[str, str], ...] = ()
