"""Write a Hugging Face checkpoint as a GGUF file the way llama.cpp's converter does (for tests).

Independent of colibri/gguf_input.py, which reads it back: llama.cpp's tensor names and metadata keys
(from the `gguf` package), experts stacked into one 3-D tensor per layer, q/k rows permuted for the
`llama` and `granitemoe` architectures, Granite's fused experts split (and GraniteMoeShared's shared gate and up),
kv_b_proj split per head into attn_k_b (transposed) and attn_v_b for `deepseek2`, and the chosen storage type for
matrices (1-D tensors stay F32, as in llama.cpp).
"""
from __future__ import annotations

import json
from pathlib import Path

from collections.abc import Iterator, Mapping

import gguf
import ml_dtypes
import numpy as np
from gguf.constants import MODEL_TENSOR, TENSOR_NAMES

from colibri.checkpoint import read_safetensors

ARCH = {"MixtralForCausalLM": "llama", "LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
        "Qwen3ForCausalLM": "qwen3", "Qwen2MoeForCausalLM": "qwen2moe", "Qwen3MoeForCausalLM": "qwen3moe",
        "OlmoeForCausalLM": "olmoe", "DeepseekV2ForCausalLM": "deepseek2", "DeepseekV3ForCausalLM": "deepseek2",
        "Glm4MoeLiteForCausalLM": "deepseek2",
        "GraniteMoeForCausalLM": "granitemoe", "GraniteMoeSharedForCausalLM": "granitemoe",
        "Lfm2MoeForCausalLM": "lfm2moe", "Lfm2ForCausalLM": "lfm2",
        "Qwen3_5MoeForCausalLM": "qwen35moe"}
Q = gguf.GGMLQuantizationType


class ShardTensors(Mapping):
    """A checkpoint's tensors by name, each read from its shard when asked for (as stored; bf16 as f32), so a
    checkpoint larger than memory converts a tensor at a time."""

    def __init__(self, src: Path):
        self.lazy = {k: v for f in sorted(src.glob("*.safetensors")) for k, v in read_safetensors(f).items()}

    def __getitem__(self, key: str) -> np.ndarray:
        values = np.asarray(self.lazy[key].load())
        return values.astype(np.float32) if values.dtype == ml_dtypes.bfloat16 else values

    def __iter__(self) -> Iterator[str]:
        return iter(self.lazy)

    def __len__(self) -> int:
        return len(self.lazy)


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf's LlamaModel.permute (interleaved RoPE order)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _add(writer: gguf.GGUFWriter, name: str, arr: np.ndarray, qtype: Q) -> None:
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if arr.ndim == 1 or qtype == Q.F32 or arr.shape[-1] % block:  # as llama.cpp: unblockable rows stay F32
        writer.add_tensor(name, arr)
    elif qtype == Q.F16:
        writer.add_tensor(name, arr.astype(np.float16))
    else:
        writer.add_tensor(name, gguf.quantize(arr, qtype), raw_dtype=qtype)


def add_placeholder_vocab(w: gguf.GGUFWriter, n_vocab: int) -> None:
    """A SentencePiece-type vocabulary of n_vocab meaningless pieces: enough for llama.cpp to load a
    random-weight model and take token ids (the benchmark feeds ids, never text)."""
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(3, n_vocab)])
    w.add_token_scores([0.0] * n_vocab)
    w.add_token_types([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
                      + [gguf.TokenType.NORMAL] * (n_vocab - 3))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)


def add_bpe_tokenizer(w: gguf.GGUFWriter, src: Path) -> None:
    """The checkpoint's byte-level BPE tokenizer (tokenizer.json) as llama.cpp's converter stores a `gpt2`
    vocabulary: the tokens in id order, their types, the merges, the special token ids, the chat template."""
    tok = json.loads((src / "tokenizer.json").read_text())
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    vocab = tok["model"]["vocab"]
    special = {t["content"] for t in tok.get("added_tokens", []) if t.get("special")}
    tokens = sorted(vocab, key=vocab.get)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    w.add_bos_token_id(vocab[cfg["bos_token"]])
    w.add_eos_token_id(vocab[cfg["eos_token"]])
    w.add_add_bos_token(tok.get("post_processor") is not None)
    template = cfg.get("chat_template")
    if template is None and (src / "chat_template.jinja").exists():
        template = (src / "chat_template.jinja").read_text()
    if template:
        w.add_chat_template(template)


def add_deepseek_keys(w: gguf.GGUFWriter, cfg: dict) -> None:
    """deepseek2's attention and routing keys, as llama.cpp's converter writes them (the gating function as
    a released V3 config's scoring_func would give it)."""
    rope, lat = cfg["qk_rope_head_dim"], cfg["kv_lora_rank"]
    if cfg.get("q_lora_rank"):
        w.add_q_lora_rank(cfg["q_lora_rank"])
    w.add_kv_lora_rank(lat)
    w.add_key_length(lat + rope)
    w.add_value_length(lat)
    w.add_key_length_mla(cfg["qk_nope_head_dim"] + rope)
    w.add_value_length_mla(cfg["v_head_dim"])
    w.add_rope_dimension_count(rope)
    types = cfg.get("mlp_layer_types")  # GLM's: a deepseek2 file holds leading dense layers only
    dense = types.index("sparse") if types else cfg.get("first_k_dense_replace") or 0
    if types and "dense" in types[dense:]:
        raise ValueError(f"mlp_layer_types {types}: a deepseek2 file has dense layers first only")
    w.add_leading_dense_block_count(dense)
    w.add_expert_shared_count(cfg.get("n_shared_experts") or 0)
    w.add_expert_weights_scale(cfg.get("routed_scaling_factor", 1.0))
    v3 = cfg["architectures"][0] in ("DeepseekV3ForCausalLM", "Glm4MoeLiteForCausalLM")
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if v3 else gguf.ExpertGatingFuncType.SOFTMAX)
    if v3 and cfg.get("n_group"):
        w.add_expert_group_count(cfg["n_group"])
        w.add_expert_group_used_count(cfg["topk_group"])


def reorder_v_heads(a: np.ndarray, axis: int, hk: int, hv: int, width: int) -> np.ndarray:
    """conversion/qwen.py's _reorder_v_heads: value heads grouped by key head [G0 v0..v(r-1), G1 ...] to tiled
    [G0 v0, G1 v0, ..., G0 v1, ...], along `axis`."""
    shape = list(a.shape)
    split = a.reshape(*shape[:axis], hk, hv // hk, width, *shape[axis + 1:])
    return np.swapaxes(split, axis, axis + 1).reshape(shape)


def qwen35_to_gguf(cfg: dict, t: dict[str, np.ndarray], out: Path, qtype: Q) -> Path:
    """A Qwen3.5-MoE checkpoint as llama.cpp's converter writes it (conversion/qwen.py: Qwen3NextModel,
    _LinearAttentionVReorderBase, _Qwen35MRopeMixin): its ssm keys, the zero-centred norms stored as 1 + w (not the
    DeltaNet's), A_log as -exp(A_log) (numpy's exp here: the converter's torch may round an ulp otherwise), dt_bias as
    ssm_dt.bias, the convolution squeezed, the value heads tiled, the experts stacked, no MTP layer."""
    n_layers, hidden = cfg["num_hidden_layers"], cfg["hidden_size"]
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    head_dim = cfg.get("head_dim") or hidden // cfg["num_attention_heads"]
    rope = cfg["rope_parameters"]
    w = gguf.GGUFWriter(str(out), "qwen35moe")
    w.add_block_count(n_layers)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 0.25)))
    w.add_rope_dimension_sections(list(rope.get("mrope_section", [11, 11, 10])) + [0])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(cfg["num_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    w.add_ssm_conv_kernel(cfg["linear_conv_kernel_dim"])
    w.add_ssm_state_size(dk)
    w.add_ssm_group_count(hk)
    w.add_ssm_time_step_rank(hv)
    w.add_ssm_inner_size(dv * hv)
    w.add_array("qwen35moe.attention.recurrent_layers", [k == "linear_attention" for k in cfg["layer_types"]])
    w.add_uint32("qwen35moe.full_attention_interval", cfg.get("full_attention_interval", 4))

    def name(tensor: MODEL_TENSOR, layer: int | None = None, kind: str | None = "weight") -> str:
        return TENSOR_NAMES[tensor].format(bid=layer) + (f".{kind}" if kind else "")

    _add(w, name(MODEL_TENSOR.TOKEN_EMBD), t["model.embed_tokens.weight"], qtype)
    _add(w, name(MODEL_TENSOR.OUTPUT_NORM), 1 + t["model.norm.weight"], qtype)
    if "lm_head.weight" in t:
        _add(w, name(MODEL_TENSOR.OUTPUT), t["lm_head.weight"], qtype)
    v = lambda a, axis=0, width=dv: reorder_v_heads(a, axis, hk, hv, width)  # noqa: E731
    for layer in range(n_layers):
        p = f"model.layers.{layer}."
        _add(w, name(MODEL_TENSOR.ATTN_NORM, layer), 1 + t[p + "input_layernorm.weight"], qtype)
        _add(w, name(MODEL_TENSOR.ATTN_POST_NORM, layer), 1 + t[p + "post_attention_layernorm.weight"], qtype)
        if cfg["layer_types"][layer] == "full_attention":
            for proj, tensor in (("q_proj", MODEL_TENSOR.ATTN_Q), ("k_proj", MODEL_TENSOR.ATTN_K),
                                 ("v_proj", MODEL_TENSOR.ATTN_V), ("o_proj", MODEL_TENSOR.ATTN_OUT)):
                _add(w, name(tensor, layer), t[f"{p}self_attn.{proj}.weight"], qtype)
            _add(w, name(MODEL_TENSOR.ATTN_Q_NORM, layer), 1 + t[p + "self_attn.q_norm.weight"], qtype)
            _add(w, name(MODEL_TENSOR.ATTN_K_NORM, layer), 1 + t[p + "self_attn.k_norm.weight"], qtype)
        else:
            a, qk = p + "linear_attn.", 2 * hk * dk
            qkv, conv = t[a + "in_proj_qkv.weight"], t[a + "conv1d.weight"][:, 0, :]
            _add(w, name(MODEL_TENSOR.ATTN_QKV, layer), np.concatenate([qkv[:qk], v(qkv[qk:])]), qtype)
            _add(w, name(MODEL_TENSOR.SSM_CONV1D, layer), np.concatenate([conv[:qk], v(conv[qk:])]), qtype)
            _add(w, name(MODEL_TENSOR.ATTN_GATE, layer), v(t[a + "in_proj_z.weight"]), qtype)
            _add(w, name(MODEL_TENSOR.SSM_BETA, layer), v(t[a + "in_proj_b.weight"], width=1), qtype)
            _add(w, name(MODEL_TENSOR.SSM_ALPHA, layer), v(t[a + "in_proj_a.weight"], width=1), qtype)
            _add(w, name(MODEL_TENSOR.SSM_DT, layer, "bias"), v(t[a + "dt_bias"], width=1), qtype)
            _add(w, name(MODEL_TENSOR.SSM_A, layer, None), v(-np.exp(t[a + "A_log"]), width=1), qtype)
            _add(w, name(MODEL_TENSOR.SSM_NORM, layer), t[a + "norm.weight"], qtype)
            _add(w, name(MODEL_TENSOR.SSM_OUT, layer), v(t[a + "out_proj.weight"], axis=1), qtype)
        m, ffn = p + "mlp.", cfg["moe_intermediate_size"]
        _add(w, name(MODEL_TENSOR.FFN_GATE_INP, layer), t[m + "gate.weight"], qtype)
        if m + "experts.gate_up_proj" in t:  # fused, [E, 2F, D] with the gate rows first; or saved per expert
            gate_up, down = t[m + "experts.gate_up_proj"], t[m + "experts.down_proj"]
        else:
            experts = range(cfg["num_experts"])
            gate_up = np.stack([np.concatenate([t[f"{m}experts.{e}.{proj}.weight"] for proj in ("gate_proj", "up_proj")])
                                for e in experts])
            down = np.stack([t[f"{m}experts.{e}.down_proj.weight"] for e in experts])
        _add(w, name(MODEL_TENSOR.FFN_GATE_EXP, layer), gate_up[:, :ffn], qtype)
        _add(w, name(MODEL_TENSOR.FFN_UP_EXP, layer), gate_up[:, ffn:], qtype)
        _add(w, name(MODEL_TENSOR.FFN_DOWN_EXP, layer), down, qtype)
        for proj, tensor in (("gate_proj", MODEL_TENSOR.FFN_GATE_SHEXP), ("up_proj", MODEL_TENSOR.FFN_UP_SHEXP),
                             ("down_proj", MODEL_TENSOR.FFN_DOWN_SHEXP)):
            _add(w, name(tensor, layer), t[f"{m}shared_expert.{proj}.weight"], qtype)
        _add(w, name(MODEL_TENSOR.FFN_GATE_INP_SHEXP, layer), t[m + "shared_expert_gate.weight"], qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def lfm2_mlp_size(cfg: dict) -> int:
    """The MLP width dense LFM2's converter writes (conversion/lfm2.py's _add_feed_forward_length): LFM2's rule."""
    size = cfg.get("block_ff_dim", cfg["intermediate_size"])
    if cfg["block_auto_adjust_ff_dim"]:
        size = int(2 * size / 3)
        if cfg["block_ffn_dim_multiplier"] is not None:
            size = int(cfg["block_ffn_dim_multiplier"] * size)
        size = cfg["block_multiple_of"] * ((size + cfg["block_multiple_of"] - 1) // cfg["block_multiple_of"])
    return size


def hf_to_gguf(src: Path, out: Path, qtype: Q = Q.F32, write_norm_key: bool = True,
               extra: dict[str, np.ndarray] | None = None, placeholder_vocab: bool = False,
               tokenizer: bool = False, mtp_layers: int = 0) -> Path:
    """`mtp_layers`: blocks counted after the model's as multi-token-prediction layers (their tensors: `extra`)."""
    cfg = json.loads((src / "config.json").read_text())
    hf_arch = cfg["architectures"][0]
    arch = ARCH[hf_arch]
    t = ShardTensors(src)
    if arch == "qwen35moe":
        return qwen35_to_gguf(cfg, t, out, qtype)
    n_layers, n_head = cfg["num_hidden_layers"], cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads") or n_head
    n_experts = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0
    deepseek = arch == "deepseek2"
    w = gguf.GGUFWriter(str(out), arch, use_temp_file=True)  # tensors written as they come, not held
    w.add_block_count(n_layers + mtp_layers)
    if mtp_layers:
        w.add_nextn_predict_layers(mtp_layers)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    lfm2 = arch in ("lfm2", "lfm2moe")
    w.add_feed_forward_length(lfm2_mlp_size(cfg) if arch == "lfm2" else cfg.get("intermediate_size", 0))
    w.add_head_count(n_head)
    if lfm2:  # conversion/lfm2.py: KV heads per layer, 0 where it convolves
        w.add_head_count_kv([n_kv if kind == "full_attention" else 0 for kind in cfg["layer_types"]])
        w.add_shortconv_l_cache(cfg.get("conv_L_cache", 3))
    else:
        w.add_head_count_kv(1 if deepseek else n_kv)  # MLA as MQA over the latent, as llama.cpp's converter writes it
    if arch == "lfm2moe":
        w.add_leading_dense_block_count(cfg.get("num_dense_layers", 2))
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        if write_norm_key:  # (stated: llama.cpp's converter writes no scale, and llama.cpp reads none: 1)
            w.add_expert_weights_scale(cfg.get("routed_scaling_factor", 1.0))
    w.add_layer_norm_rms_eps(cfg["norm_eps" if lfm2 else "rms_norm_eps"])
    if placeholder_vocab:
        add_placeholder_vocab(w, cfg["vocab_size"])
    if tokenizer:
        add_bpe_tokenizer(w, src)
    rp = cfg.get("rope_parameters") or {}
    w.add_rope_freq_base(rp.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    if rp.get("rope_type", "default") in ("linear", "yarn"):
        w.add_rope_scaling_type(gguf.RopeScalingType(rp["rope_type"]))
        w.add_rope_scaling_factor(rp["factor"])
        if "original_max_position_embeddings" in rp:
            w.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
    if deepseek:
        add_deepseek_keys(w, cfg)
    elif cfg.get("head_dim"):
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    if cfg.get("clip_qkv"):
        w.add_clamp_kqv(cfg["clip_qkv"])
    if arch == "granitemoe":  # conversion/granite.py: the multipliers under llama.cpp's scale keys
        w.add_attention_scale(cfg["attention_multiplier"])
        w.add_embedding_scale(cfg["embedding_multiplier"])
        w.add_residual_scale(cfg["residual_multiplier"])
        w.add_logit_scale(cfg["logits_scaling"])
    if n_experts:
        w.add_expert_count(n_experts)
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        if cfg.get("moe_intermediate_size"):
            w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        if cfg.get("shared_expert_intermediate_size") or cfg.get("shared_intermediate_size"):  # (Qwen2-MoE's, Granite's)
            w.add_expert_shared_feed_forward_length(cfg.get("shared_expert_intermediate_size")
                                                    or cfg["shared_intermediate_size"])
        if write_norm_key and arch not in ("llama", "granitemoe"):  # (stated, where llama.cpp's converter writes none)
            w.add_expert_weights_norm(bool(cfg.get("norm_topk_prob", arch == "lfm2moe")))

    def name(tensor: MODEL_TENSOR, layer: int | None = None, kind: str = "weight") -> str:
        return f"{TENSOR_NAMES[tensor].format(bid=layer)}.{kind}"

    _add(w, name(MODEL_TENSOR.TOKEN_EMBD), t["model.embed_tokens.weight"], qtype)
    if lfm2:
        _add(w, name(MODEL_TENSOR.TOKEN_EMBD_NORM), t["model.embedding_norm.weight"], qtype)
    else:
        _add(w, name(MODEL_TENSOR.OUTPUT_NORM), t["model.norm.weight"], qtype)
    if "lm_head.weight" in t:
        _add(w, name(MODEL_TENSOR.OUTPUT), t["lm_head.weight"], qtype)
    for layer in range(n_layers):
        p = f"model.layers.{layer}."
        direct = {
            "input_layernorm.weight": name(MODEL_TENSOR.ATTN_NORM, layer),
            "post_attention_layernorm.weight": name(MODEL_TENSOR.FFN_NORM, layer),
            "self_attn.v_proj.weight": name(MODEL_TENSOR.ATTN_V, layer),
            "self_attn.v_proj.bias": name(MODEL_TENSOR.ATTN_V, layer, "bias"),
            "self_attn.o_proj.weight": name(MODEL_TENSOR.ATTN_OUT, layer),
            "self_attn.o_proj.bias": name(MODEL_TENSOR.ATTN_OUT, layer, "bias"),
            "self_attn.q_norm.weight": name(MODEL_TENSOR.ATTN_Q_NORM, layer),
            "self_attn.k_norm.weight": name(MODEL_TENSOR.ATTN_K_NORM, layer),
            "mlp.gate_proj.weight": name(MODEL_TENSOR.FFN_GATE, layer),
            "mlp.up_proj.weight": name(MODEL_TENSOR.FFN_UP, layer),
            "mlp.down_proj.weight": name(MODEL_TENSOR.FFN_DOWN, layer),
            "mlp.gate.weight": name(MODEL_TENSOR.FFN_GATE_INP, layer),
            "block_sparse_moe.gate.weight": name(MODEL_TENSOR.FFN_GATE_INP, layer),
            "block_sparse_moe.router.layer.weight": name(MODEL_TENSOR.FFN_GATE_INP, layer),
            "block_sparse_moe.output_linear.weight": name(MODEL_TENSOR.FFN_DOWN_EXP, layer),
            "mlp.shared_expert.gate_proj.weight": name(MODEL_TENSOR.FFN_GATE_SHEXP, layer),
            "mlp.shared_expert.up_proj.weight": name(MODEL_TENSOR.FFN_UP_SHEXP, layer),
            "mlp.shared_expert.down_proj.weight": name(MODEL_TENSOR.FFN_DOWN_SHEXP, layer),
            "mlp.shared_expert_gate.weight": name(MODEL_TENSOR.FFN_GATE_INP_SHEXP, layer),
            "self_attn.q_a_proj.weight": name(MODEL_TENSOR.ATTN_Q_A, layer),
            "self_attn.q_a_layernorm.weight": name(MODEL_TENSOR.ATTN_Q_A_NORM, layer),
            "self_attn.q_b_proj.weight": name(MODEL_TENSOR.ATTN_Q_B, layer),
            "self_attn.kv_a_proj_with_mqa.weight": name(MODEL_TENSOR.ATTN_KV_A_MQA, layer),
            "self_attn.kv_a_layernorm.weight": name(MODEL_TENSOR.ATTN_KV_A_NORM, layer),
            "mlp.gate.e_score_correction_bias": name(MODEL_TENSOR.FFN_EXP_PROBS_B, layer, "bias"),
            "mlp.shared_experts.gate_proj.weight": name(MODEL_TENSOR.FFN_GATE_SHEXP, layer),
            "mlp.shared_experts.up_proj.weight": name(MODEL_TENSOR.FFN_UP_SHEXP, layer),
            "mlp.shared_experts.down_proj.weight": name(MODEL_TENSOR.FFN_DOWN_SHEXP, layer),
            "operator_norm.weight": name(MODEL_TENSOR.ATTN_NORM, layer),  # LFM2's names
            "ffn_norm.weight": name(MODEL_TENSOR.FFN_NORM, layer),
            "self_attn.out_proj.weight": name(MODEL_TENSOR.ATTN_OUT, layer),
            "self_attn.q_layernorm.weight": name(MODEL_TENSOR.ATTN_Q_NORM, layer),
            "self_attn.k_layernorm.weight": name(MODEL_TENSOR.ATTN_K_NORM, layer),
            "conv.in_proj.weight": name(MODEL_TENSOR.SHORTCONV_INPROJ, layer),
            "conv.out_proj.weight": name(MODEL_TENSOR.SHORTCONV_OUTPROJ, layer),
            "feed_forward.w1.weight": name(MODEL_TENSOR.FFN_GATE, layer),
            "feed_forward.w3.weight": name(MODEL_TENSOR.FFN_UP, layer),
            "feed_forward.w2.weight": name(MODEL_TENSOR.FFN_DOWN, layer),
            "feed_forward.gate.weight": name(MODEL_TENSOR.FFN_GATE_INP, layer),
            "feed_forward.expert_bias": name(MODEL_TENSOR.FFN_EXP_PROBS_B, layer, "bias"),
        }
        if p + "conv.conv.weight" in t:  # squeezed to [D, K], as the converter does
            _add(w, name(MODEL_TENSOR.SHORTCONV_CONV, layer), t[p + "conv.conv.weight"][:, 0, :], qtype)
        for hf, g in direct.items():
            if p + hf in t:
                _add(w, g, t[p + hf], qtype)
        if p + "self_attn.kv_b_proj.weight" in t:  # per head [nope + v, lat]: k_b transposed, v_b as it is
            nope = cfg["qk_nope_head_dim"]
            kv_b = t[p + "self_attn.kv_b_proj.weight"].reshape(n_head, nope + cfg["v_head_dim"], -1)
            _add(w, name(MODEL_TENSOR.ATTN_K_B, layer), kv_b[:, :nope].transpose(0, 2, 1), qtype)
            _add(w, name(MODEL_TENSOR.ATTN_V_B, layer), kv_b[:, nope:], qtype)
        for proj, heads, tensor in (("q_proj", n_head, MODEL_TENSOR.ATTN_Q), ("k_proj", n_kv, MODEL_TENSOR.ATTN_K)):
            for kind in ("weight", "bias"):
                key = f"{p}self_attn.{proj}.{kind}"
                if key in t:
                    _add(w, name(tensor, layer, kind), permute(t[key], heads) if arch in ("llama", "granitemoe") else t[key],
                         qtype)
        if p + "block_sparse_moe.input_linear.weight" in t:  # Granite's gate and up, split as its converter splits them
            gate_up, ffn = t[p + "block_sparse_moe.input_linear.weight"], cfg["intermediate_size"]
            _add(w, name(MODEL_TENSOR.FFN_GATE_EXP, layer), gate_up[:, :ffn], qtype)
            _add(w, name(MODEL_TENSOR.FFN_UP_EXP, layer), gate_up[:, ffn:], qtype)
        if p + "shared_mlp.input_linear.weight" in t:  # GraniteMoeShared's shared MLP, split as its converter splits it
            gate_up, ffn = t[p + "shared_mlp.input_linear.weight"], cfg["shared_intermediate_size"]
            _add(w, name(MODEL_TENSOR.FFN_GATE_SHEXP, layer), gate_up[:ffn], qtype)
            _add(w, name(MODEL_TENSOR.FFN_UP_SHEXP, layer), gate_up[ffn:], qtype)
            _add(w, name(MODEL_TENSOR.FFN_DOWN_SHEXP, layer), t[p + "shared_mlp.output_linear.weight"], qtype)
        expert_names = ({"gate": "w1", "up": "w3", "down": "w2"} if hf_arch in ("MixtralForCausalLM", "Lfm2MoeForCausalLM")
                        else {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"})
        moe = {"MixtralForCausalLM": "block_sparse_moe", "Lfm2MoeForCausalLM": "feed_forward"}.get(hf_arch, "mlp")
        for which, tensor in (("gate", MODEL_TENSOR.FFN_GATE_EXP), ("up", MODEL_TENSOR.FFN_UP_EXP),
                              ("down", MODEL_TENSOR.FFN_DOWN_EXP)):
            keys = [f"{p}{moe}.experts.{e}.{expert_names[which]}.weight" for e in range(n_experts)]
            if keys and keys[0] in t:
                _add(w, name(tensor, layer), np.stack([t[k] for k in keys]), qtype)
    for n, arr in (extra or {}).items():
        w.add_tensor(n, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
