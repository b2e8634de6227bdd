"""What a family file declares: the Family record, and what a family with mechanisms of its own gives its hooks and
gets back from them (colibri/families/__init__.py says how to add one); the helpers its tensor hook may use."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from colibri.format import Role
from colibri.lazy import Derived, LazyTensor, expert_of
from colibri.quant import matrix_rows


class UnsupportedModel(ValueError):
    """The checkpoint asks for something the runtime would not compute exactly."""


@dataclass(frozen=True)
class ConfigContext:
    """What the common mapping (checkpoint.py's read_config) has read when a family's `derive` hook runs."""
    n_layers: int
    head_dim: int
    max_seq: int
    any_moe: bool
    n_experts: int
    top_k: int


@dataclass
class OwnFields:
    """What a family's `derive` hook reads from its config: ModelDims fields, flags (colibri/dims.py's FLAG_*, which
    layer_record writes into the records), and RoPE parameters per layer type (sliding_attention, full_attention)
    for a family whose global layers rotate with tables of their own (else the config's one set; with them `fields`
    must give global_head_dim, their head size). Of the fields the common mapping sets itself, these may be given
    here and replace its value: n_kv_heads, dense_ffn_size, shared_ffn_size, attn_scale, and sliding_window with
    window_layers (both, and then the window is kept even when the sequence never outgrows it); any other it sets
    (head_dim, flags, ffn_size, top_k, ...) may not."""
    fields: dict
    flags: int = 0
    rope: dict | None = None


# The layers a family's window rule gives it (layer, max_window_layers): every layer, the even ones, the even ones
# below max_window_layers (Qwen2-MoE), those from max_window_layers on (Qwen2, Qwen3)
WINDOW_RULES: dict[str, Callable[[int, int], bool]] = {
    "all": lambda layer, limit: True, "even": lambda layer, limit: layer % 2 == 0,
    "even_below_max": lambda layer, limit: layer % 2 == 0 and layer < limit,
    "from_max": lambda layer, limit: layer >= limit}


@dataclass(frozen=True)
class Family:
    """What distinguishes an architecture; the numbers themselves always come from the config."""
    moe: bool                   # has routed experts (else every layer a dense MLP)
    expert_ffn_key: str         # config key of a routed expert's intermediate size
    moe_prefix: str             # tensor names of the MoE block: router and experts
    expert_names: tuple[str, str, str]  # gate, up, down inside an expert
    n_experts_key: str = "num_experts"  # the config key a GGUF file's expert count is written under
    qk_norm: int = 0            # FLAG_QK_NORM_HEAD or FLAG_QK_NORM_FULL
    shared_expert: bool = False  # a gated shared expert of shared_expert_intermediate_size in MoE layers
    sparse_layer_rule: bool = False  # mlp_only_layers and decoder_sparse_step pick dense layers
    norm_topk_default: bool | None = None  # None: read norm_topk_prob; True/False: fixed by the architecture
    bias_key: str = "attention_bias"  # config key of the q/k/v(/o) bias switch
    bias_default: bool = False  # q/k/v(/o) biases when the config has no bias_key (or the family none)
    bias_on_o: bool = True      # the bias switch covers o too (Qwen2's: q, k, v only)
    clip_qkv: bool = False      # the family's modeling file clamps q, k, v (after the q/k norms) by clip_qkv
    shared_prefix: str = "shared_expert"  # the shared expert's module under mlp.
    router_name: str = "gate.weight"  # the router's tensor under moe_prefix
    # the experts fused per layer under moe_prefix: gate and up as [E, 2F, D] (gate rows first), down as [E, D, F]
    # (a GGUF file's experts, split by llama.cpp's converter, come under expert_names instead)
    fused_experts: tuple[str, str] | None = None
    flags: int = 0              # flags the architecture always has (colibri/dims.py FLAG_*)
    own_keys: tuple[str, ...] = ()  # config fields only this family reads: another family's config refuses them
    reads: tuple[str, ...] = ()     # config fields its hooks read that other families' configs may carry too
    top_k_key: str = "num_experts_per_tok"  # config key of the experts a token takes
    tied_default: bool = False      # tie_word_embeddings when the config leaves it out
    routes_itself: bool = False     # its `derive` sets the router's flags: norm_topk_prob is not read for it
    router_bias_name: str = "gate.e_score_correction_bias"  # ROUTER_BIAS under moe_prefix
    attn_scale_key: str = ""    # config field of the softmax scale (else 1/sqrt(head_dim))
    eps_key: str = "rms_norm_eps"  # config field of the RMSNorms' epsilon
    default_eps: float = 1e-6      # its configuration class's epsilon and RoPE base, for a config that states none
    default_theta: float = 10000.0
    partial_rope: bool = False     # RoPE turns a head's first partial_rotary_factor · head_dim dims (rope_dim)
    # checkpoint tensors transformers' class does not load (its _keys_to_ignore_on_load_unexpected), nor the packer
    ignored_prefixes: tuple[str, ...] = ()
    # config fields whose value multiplies a role's weights as packed (1 / value with `divide`): a scale the
    # architecture applies to a layer's output, folded into the matrix that makes it
    weight_scales: tuple[tuple[Role, str, bool], ...] = ()
    # llama.cpp: the GGUF architecture its converter writes (gguf_input.py reads it as this family; "" for none; two
    # families may share one when one has experts and the other not, as Llama and Mixtral share `llama`: a file with
    # an expert count is the one with experts), whether the converter permutes q and k rows (LlamaModel and its
    # subclasses), and config fields read from GGUF keys ({arch} in the key: the architecture), each required
    gguf_arch: str = ""
    gguf_permuted_qk: bool = False
    gguf_config: tuple[tuple[str, str], ...] = ()
    # the routing renormalization llama.cpp fixes in code for the architecture (the norm_w argument of build_moe_ffn in
    # its src/models/<arch>.cpp, which reads no key; its converter writes no expert_weights_norm): what a file without
    # the key gets; a file's expert_weights_norm key, a statement of the model llama.cpp would not honour, or
    # --norm-topk-prob overrides it (hook families too). None: gguf_input.py sets no norm_topk_prob, and the family's
    # own rule holds (norm_topk_default, or a router that renormalizes nothing)
    gguf_norm_topk: bool | None = None
    # an architecture whose GGUF file needs reading of its own (hooks in its family file, over gguf_common.GGUFFile):
    # its config fields (gguf_input.py reads the keys every architecture has first; after the hook it reads no more
    # for it but gguf_norm_topk: the record's bias_key, gguf_config pairs, expert size key and sparse_layer_rule are
    # not used), and only with that hook its tensors under transformers' names (None:
    # gguf_input.py's common naming, with gguf_layer_tensors' extra per-layer names); whether its key_length is a
    # q/k head (DeepSeek's is the latent's)
    gguf_read_config: Callable[[object], dict] | None = None
    gguf_read_tensors: Callable[[object], dict] | None = None
    gguf_layer_tensors: tuple[tuple[object, str], ...] = ()
    gguf_key_length_is_head: bool = True
    # the keys its files may give a value per layer (head_count_kv, feed_forward_length: GGUFFile.layer_kv_heads and
    # layer_ffn, which its config hook checks); any other architecture's list there is refused
    gguf_per_layer: tuple[str, ...] = ()
    # a second family of an architecture and expert kind (GraniteMoeShared's, of granitemoe with experts): the key
    # ({arch} in it) whose value above 0 in a file makes the file this family's rather than the first's
    gguf_variant_key: str = ""
    # the config field the file's expert_shared_feed_forward_length fills
    gguf_shared_ffn_key: str = "shared_expert_intermediate_size"
    # the checkpoint matrix holding the shared expert's gate and up rows, the gate's first (GraniteMoeShared's
    # shared_mlp.input_linear), which llama.cpp's converter writes as ffn_gate_shexp and ffn_up_shexp: joined back
    gguf_shared_fused: str = ""
    # The sliding window as the family's configuration class places it when the config lists no layer_types
    # (WINDOW_RULES: "" none, the family has no window), whether use_sliding_window must switch it on, and whether
    # the config's layer_types (transformers 5 writes it) says it per layer
    window_rule: str = ""
    window_switch: bool = True
    window_layer_types: bool = True
    # A family with mechanisms of its own has hooks, functions in its file (None: the common mapping's rule):
    moe_layer_rule: Callable[[dict, int], tuple[bool, ...]] | None = None  # which of the n layers route to experts
    head_dim_rule: Callable[[dict], int] | None = None  # a q/k head's size (else head_dim, or hidden / heads)
    derive: Callable[[dict, ConfigContext], OwnFields] | None = None  # its own fields, flags and RoPE
    # (the checkpoint names read, the tensor) of a runtime tensor (role, layer, expert) it stores otherwise than the
    # common names say, given the checkpoint's tensors and the ModelDims; None: the common names
    tensor: Callable[[dict, object, tuple[Role, int, int]], tuple[list[str], object] | None] | None = None

    def __post_init__(self) -> None:
        if self.window_rule and self.window_rule not in WINDOW_RULES:
            raise ValueError(f"window_rule {self.window_rule!r} is not one of {', '.join(WINDOW_RULES)}")


def derived_tensor(origin, shape: tuple[int, ...], compute, keeps: bool = False):
    """compute()'s f32 array: now if `origin` is in memory, when read if it is a tensor of a file. `keeps`: the
    result takes the dtype a GGUF file stores `origin` in, for --dtype stored (requantized to it: a scaled tensor)."""
    if isinstance(origin, LazyTensor):
        return Derived(shape, compute, kept=origin.kept if keeps else None)
    return np.ascontiguousarray(compute())


def fused_expert_tensor(raw: dict, d, gate_up: str, down: str, role: Role, expert: int) -> tuple[list[str], object]:
    """(checkpoint names read, tensor) for a routed expert's matrix from a layer's fused experts: gate and up as
    `gate_up` [E, 2F, D], gate rows first, and down as `down` [E, D, F]."""
    F, D, E = d.ffn_size, d.hidden_size, d.n_experts
    fused = down if role == Role.EXPERT_DOWN else gate_up
    rows = {Role.EXPERT_GATE: slice(0, F), Role.EXPERT_UP: slice(F, 2 * F), Role.EXPERT_DOWN: slice(None)}[role]
    shape = (D, F) if role == Role.EXPERT_DOWN else (F, D)
    source = raw[fused]
    stored = (E, D, F) if role == Role.EXPERT_DOWN else (E, 2 * F, D)
    if tuple(source.shape) != stored:  # the config's sizes must describe the tensor the rows are cut from
        raise UnsupportedModel(f"checkpoint tensor {fused} has shape {list(source.shape)}; the config's expert count, "
                               f"expert size and hidden_size make it {list(stored)}")
    # whole rows of one expert: a tensor a GGUF file stores in an image dtype keeps its blocks (--dtype stored)
    return [fused], derived_tensor(source, shape, lambda: matrix_rows(expert_of(source, expert), rows), keeps=True)
