"""Read a GGUF file (llama.cpp's format) into the same config + tensors a Hugging Face checkpoint gives.

The packer then maps both the same way (colibri/checkpoint.py), so GGUF and safetensors inputs
cannot drift apart. What this module undoes:
- llama.cpp's names and metadata keys (taken from the `gguf` package's constants);
- experts stored as one 3-D tensor per layer (split back into one matrix per expert);
- the q/k row permutation llama.cpp's converter applies for the `llama` architecture (Llama and
  Mixtral) and `granitemoe`, so that its interleaved RoPE matches; the runtime uses rotate-half;
- `gpt-oss`: experts as separate gate, up and down stacks (MXFP4 in llama.cpp's converter's files, dequantized
  exactly like any other type the image has no dtype for) fused back into transformers' layout;
- `deepseek2` (DeepSeek-V2/V3): kv_b_proj arrives already split into attn_k_b (transposed per head) and
  attn_v_b, the runtime's own WK_B and WV_B layout, so they are kept as they are;
- storage types: Q8_0 and Q4_0 tensors are kept as they are (host.quant.Encoded), so packing them to
  the same dtype carries them over bit for bit (but for a tensor the family scales when packing: Granite's
  multipliers, colibri/families/granite.py's weight_scales); every other type the `gguf` package can dequantize
  (F16, BF16, Q4_1, Q5_0, Q5_1, the K-quants, the IQ types, ...) is widened to f32 exactly, and the
  packer converts it to the dtype asked for. `read_gguf` says which types it converted.
The architecture and the config keys are checked before any tensor is read, so a refusal of a
multi-GB file is immediate. No tensor is read here: each is read by its offset when the packer writes it
(colibri/lazy.py), a routed expert's bytes alone out of its layer's 3-D tensor, and the layout undone then.
"""
from __future__ import annotations

import functools
from pathlib import Path

import gguf
import numpy as np
from gguf.constants import MODEL_TENSOR, TENSOR_NAMES, Keys

from colibri.families import FAMILIES
from colibri.lazy import Derived, FileTensor, LazyTensor, OpenFile
from colibri.quant import DType, Encoded, from_gguf_blocks

KEPT_TYPES = {gguf.GGMLQuantizationType.Q8_0: DType.Q8_0, gguf.GGMLQuantizationType.Q4_0: DType.Q4_0}
# widened to f32 with nothing lost: not worth naming in the conversion report
EXACT_TYPES = {gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16}
# llama.cpp architecture -> HF architecture (llama with experts is Mixtral)
# (the families' own: colibri/families/, gguf_arch; llama, deepseek2 and gpt-oss are mapped below)
ARCHITECTURES = {fam.gguf_arch: arch for arch, fam in FAMILIES.items() if fam.gguf_arch}
# Architectures whose q and k rows llama.cpp's converter permutes (LlamaModel and its subclasses): undone on reading
PERMUTED_QK = ("llama", *(fam.gguf_arch for fam in FAMILIES.values() if fam.gguf_permuted_qk))
# Architectures whose routing renormalization llama.cpp fixes in code rather than in the file (the norm_w
# argument of build_moe_ffn in its src/models/<arch>.cpp): its converter writes no expert_weights_norm
# for them, so a file as found runs as llama.cpp runs it, unless the key or --norm-topk-prob says otherwise.
LLAMA_CPP_NORM_TOPK = {fam.gguf_arch: fam.gguf_norm_topk for fam in FAMILIES.values() if fam.gguf_norm_topk is not None}
# deepseek2 tensors -> HF name suffix after "model.layers.N." (k_b/v_b: the runtime's WK_B/WV_B, checkpoint.py)
DEEPSEEK_TENSORS = {
    MODEL_TENSOR.ATTN_Q_A: "self_attn.q_a_proj", MODEL_TENSOR.ATTN_Q_A_NORM: "self_attn.q_a_layernorm",
    MODEL_TENSOR.ATTN_Q_B: "self_attn.q_b_proj", MODEL_TENSOR.ATTN_KV_A_MQA: "self_attn.kv_a_proj_with_mqa",
    MODEL_TENSOR.ATTN_KV_A_NORM: "self_attn.kv_a_layernorm", MODEL_TENSOR.ATTN_KV_B: "self_attn.kv_b_proj",
    MODEL_TENSOR.ATTN_K_B: "self_attn.k_b_proj", MODEL_TENSOR.ATTN_V_B: "self_attn.v_b_proj",
    MODEL_TENSOR.FFN_GATE_SHEXP: "mlp.shared_experts.gate_proj", MODEL_TENSOR.FFN_UP_SHEXP: "mlp.shared_experts.up_proj",
    MODEL_TENSOR.FFN_DOWN_SHEXP: "mlp.shared_experts.down_proj",
}


class GGUFError(ValueError):
    """The GGUF file lacks something required or holds something unsupported."""


def _name(t: MODEL_TENSOR, layer: int | None = None) -> str:
    return TENSOR_NAMES[t].format(bid=layer)


# per-layer GGUF tensor -> HF name suffix after "model.layers.N."
LAYER_TENSORS = {
    MODEL_TENSOR.ATTN_NORM: "input_layernorm", MODEL_TENSOR.FFN_NORM: "post_attention_layernorm",
    MODEL_TENSOR.ATTN_Q: "self_attn.q_proj", MODEL_TENSOR.ATTN_K: "self_attn.k_proj",
    MODEL_TENSOR.ATTN_V: "self_attn.v_proj", MODEL_TENSOR.ATTN_OUT: "self_attn.o_proj",
    MODEL_TENSOR.ATTN_Q_NORM: "self_attn.q_norm", MODEL_TENSOR.ATTN_K_NORM: "self_attn.k_norm",
    MODEL_TENSOR.FFN_GATE: "mlp.gate_proj", MODEL_TENSOR.FFN_UP: "mlp.up_proj", MODEL_TENSOR.FFN_DOWN: "mlp.down_proj",
    MODEL_TENSOR.FFN_GATE_SHEXP: "mlp.shared_expert.gate_proj", MODEL_TENSOR.FFN_UP_SHEXP: "mlp.shared_expert.up_proj",
    MODEL_TENSOR.FFN_DOWN_SHEXP: "mlp.shared_expert.down_proj",
    MODEL_TENSOR.FFN_GATE_INP_SHEXP: "mlp.shared_expert_gate",
}
EXPERT_TENSORS = {MODEL_TENSOR.FFN_GATE_EXP: "gate", MODEL_TENSOR.FFN_UP_EXP: "up", MODEL_TENSOR.FFN_DOWN_EXP: "down"}


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's convert_hf_to_gguf `permute` of q/k rows (weights or biases)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _unpermuted(t: np.ndarray | Encoded, n_head: int) -> np.ndarray | Encoded:
    """unpermute of an array, or of a Q8_0/Q4_0 tensor's rows (values and scales alike, kept as stored)."""
    return t.map_rows(lambda a: unpermute(a, n_head)) if isinstance(t, Encoded) else unpermute(t, n_head)


@functools.lru_cache(maxsize=2)
def _reader(path: str, mtime_ns: int, size: int) -> gguf.GGUFReader:
    return gguf.GGUFReader(path)


def open_gguf(path: Path) -> gguf.GGUFReader:
    """The file's reader, parsed once while the file stays the same: parsing a vocabulary's keys takes
    seconds (GPT-2's 50k tokens and merges: 4 s), and packing reads them for the model and for the text."""
    st = Path(path).stat()
    return _reader(str(path), st.st_mtime_ns, st.st_size)


def read_gguf(path: Path, norm_topk_prob: bool | None = None
              ) -> tuple[dict, dict[str, LazyTensor | np.ndarray], dict[str, int]]:
    """(HF-style config dict, HF-named tensors, unread (their load() gives Q8_0/Q4_0 as stored, any other type
    dequantized to f32), and how many tensors of each storage type the image has no dtype for are
    dequantized to f32) from a GGUF file."""
    try:
        reader = open_gguf(path)
    except Exception as exc:  # the gguf package's parse of hostile bytes fails in many ways (IndexError, struct.error...)
        raise GGUFError(f"{path} is not a readable GGUF file: {type(exc).__name__}: {exc}") from None

    def field(key: str, default=None, required: bool = True):
        f = reader.fields.get(key)
        if f is None:
            if required and default is None:
                raise GGUFError(f"GGUF file lacks required key {key}")
            return default
        return f.contents()

    arch = field(Keys.General.ARCHITECTURE)
    k = lambda key: key.format(arch=arch)  # noqa: E731
    n_layers = int(field(k(Keys.LLM.BLOCK_COUNT)))
    n_head = int(field(k(Keys.Attention.HEAD_COUNT)))
    n_head_kv = int(field(k(Keys.Attention.HEAD_COUNT_KV), n_head))
    n_experts = int(field(k(Keys.LLM.EXPERT_COUNT), 0, required=False))
    if arch == "llama":
        hf_arch = "MixtralForCausalLM" if n_experts else "LlamaForCausalLM"
    elif arch in ARCHITECTURES:
        hf_arch = ARCHITECTURES[arch]
    elif arch == "deepseek2":
        hf_arch = "DeepseekV2ForCausalLM"  # or V3: _deepseek2 decides by the gating function
    elif arch == "gpt-oss":
        hf_arch = "GptOssForCausalLM"
    else:
        raise GGUFError(f"GGUF architecture {arch!r} is not supported; supported: llama, deepseek2, "
                        f"gpt-oss, {', '.join(ARCHITECTURES)}")

    norm = field(k(Keys.LLM.EXPERT_WEIGHTS_NORM), None, required=False) if norm_topk_prob is None else norm_topk_prob
    if norm is None:
        norm = LLAMA_CPP_NORM_TOPK.get(arch)
    if any(t.name == "rope_freqs.weight" for t in reader.tensors):
        raise GGUFError("GGUF tensor rope_freqs (llama3-style RoPE frequency factors) is not supported")

    file = OpenFile(path)
    tensors: dict[str, FileTensor] = {}
    converted: dict[str, int] = {}
    for t in reader.tensors:
        tensors[t.name] = _file_tensor(file, t)
        if t.tensor_type not in EXACT_TYPES and t.tensor_type not in KEPT_TYPES:
            converted[t.tensor_type.name] = converted.get(t.tensor_type.name, 0) + 1

    embd = tensors.get(_name(MODEL_TENSOR.TOKEN_EMBD) + ".weight")
    if embd is None:
        raise GGUFError("GGUF file lacks tensor token_embd.weight")

    cfg: dict = {
        "architectures": [hf_arch],
        "vocab_size": embd.shape[0], "hidden_size": int(field(k(Keys.LLM.EMBEDDING_LENGTH))),
        "num_hidden_layers": n_layers, "num_attention_heads": n_head, "num_key_value_heads": n_head_kv,
        "max_position_embeddings": int(field(k(Keys.LLM.CONTEXT_LENGTH))),
        "rms_norm_eps": float(field(k(Keys.Attention.LAYERNORM_RMS_EPS))),
        "rope_theta": float(field(k(Keys.Rope.FREQ_BASE), 10000.0, required=False)),
        "tie_word_embeddings": _name(MODEL_TENSOR.OUTPUT) + ".weight" not in tensors,
    }
    ff = field(k(Keys.LLM.FEED_FORWARD_LENGTH), 0, required=False)
    if ff:
        cfg["intermediate_size"] = int(ff)
    head_dim = field(k(Keys.Attention.KEY_LENGTH), None, required=False)
    if head_dim and arch != "deepseek2":  # there key_length is the latent's (kv_lora_rank + rope)
        cfg["head_dim"] = int(head_dim)
    scaling = field(k(Keys.Rope.SCALING_TYPE), None, required=False)
    if scaling and scaling != "none":
        cfg["rope_scaling"] = {"rope_type": scaling, "factor": float(field(k(Keys.Rope.SCALING_FACTOR)))}
        orig = field(k(Keys.Rope.SCALING_ORIG_CTX_LEN), None, required=False)
        if orig:
            cfg["rope_scaling"]["original_max_position_embeddings"] = int(orig)
    clamp = field(k(Keys.Attention.CLAMP_KQV), None, required=False)
    if clamp:
        cfg["clip_qkv"] = float(clamp)
    if arch == "deepseek2":
        cfg.update(_deepseek2(field, k, n_layers, n_head, tensors))
        return cfg, _hf_tensors(tensors, arch, cfg["architectures"][0], n_layers, n_head, n_head_kv), converted
    if arch == "gpt-oss":
        cfg.update(_gpt_oss(field, k, n_layers, n_experts, tensors))
        return cfg, _gpt_oss_tensors(tensors, n_layers), converted
    fam = FAMILIES[hf_arch]
    if fam.bias_key:  # the family's switch of the q/k/v(/o) biases (Qwen2's are always there)
        cfg[fam.bias_key] = _name(MODEL_TENSOR.ATTN_Q, 0) + ".bias" in tensors
    cfg.update({hf: float(field(k(key))) for key, hf in fam.gguf_config})  # e.g. Granite's multipliers
    if n_experts and fam.moe:  # under the name the family's transformers config takes (so --against builds it)
        cfg[fam.n_experts_key] = n_experts
        cfg["num_experts_per_tok"] = int(field(k(Keys.LLM.EXPERT_USED_COUNT)))
        expert_ff = field(k(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH), None, required=False)
        if expert_ff or ff:  # (a llama file's experts: feed_forward_length, the same key as transformers')
            cfg[fam.expert_ffn_key] = int(expert_ff or ff)
        shared_ff = field(k(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH), None, required=False)
        if shared_ff:
            cfg["shared_expert_intermediate_size"] = int(shared_ff)
        if arch in LLAMA_CPP_NORM_TOPK:
            cfg["norm_topk_prob"] = bool(norm)
        # dense layers are the blocks without a router
        dense = [layer for layer in range(n_layers)
                 if _name(MODEL_TENSOR.FFN_GATE_INP, layer) + ".weight" not in tensors]
        if dense and fam.sparse_layer_rule:
            cfg["mlp_only_layers"] = dense
    return cfg, _hf_tensors(tensors, arch, hf_arch, n_layers, n_head, n_head_kv), converted


def _file_tensor(file: OpenFile, t) -> FileTensor:
    """A GGUF tensor unread: Q8_0/Q4_0 to come as stored (Encoded), every other type dequantized to f32 when read.
    The reader's own arrays map the file; only their dtype and shape are taken, and one row is dequantized now
    so that a type the gguf package cannot dequantize is refused before anything is written."""
    shape = tuple(int(n) for n in reversed(t.shape))  # GGUF lists dimensions fastest first
    if t.tensor_type in KEPT_TYPES:
        dtype = KEPT_TYPES[t.tensor_type]
        decode = lambda raw, shape: from_gguf_blocks(raw, dtype, shape)  # noqa: E731
    else:
        qtype = t.tensor_type
        decode = lambda raw, shape: np.asarray(gguf.dequantize(raw, qtype), np.float32).reshape(shape)  # noqa: E731
        try:
            gguf.dequantize(t.data.reshape(-1, t.data.shape[-1])[:1], qtype)
        except NotImplementedError:
            raise GGUFError(f"tensor {t.name} has type {t.tensor_type.name}, which the gguf package cannot "
                            "dequantize; convert the model again with another type") from None
    return FileTensor(file, t.data_offset, t.data.dtype, t.data.shape, shape, decode, KEPT_TYPES.get(t.tensor_type))


def _lazy(shape: tuple[int, ...], t: LazyTensor, fn, by_expert=None) -> Derived:
    """`fn` of a tensor's values, computed when they are read (`by_expert(values of sub-tensor i)`: its
    sub-tensor i alone)."""
    return Derived(shape, lambda: fn(t.load()), None if by_expert is None else lambda i: by_expert(t.expert(i)))


def _deepseek2(field, k, n_layers: int, n_head: int, tensors: dict) -> dict:
    """The DeepSeek-V2/V3 config fields of a deepseek2 file, as llama.cpp runs it: the gating function
    the file names (llama.cpp's default, softmax, when it names none), groups scored by their best two
    experts (llama.cpp's build_moe_ffn does so for any gating function: transformers' V3, never its V2),
    RoPE on adjacent pairs."""
    gating = field(k(Keys.LLM.EXPERT_GATING_FUNC), None, required=False)
    sigmoid = gating == gguf.ExpertGatingFuncType.SIGMOID
    if gating not in (None, gguf.ExpertGatingFuncType.SOFTMAX, gguf.ExpertGatingFuncType.SIGMOID):
        raise GGUFError(f"GGUF key {k(Keys.LLM.EXPERT_GATING_FUNC)}={gating} is neither softmax nor sigmoid")
    has_bias = any(_name(MODEL_TENSOR.FFN_EXP_PROBS_B, layer) + ".bias" in tensors for layer in range(n_layers))
    if has_bias != sigmoid:
        raise GGUFError("GGUF deepseek2 file with " + ("a router bias (exp_probs_b) but no sigmoid gating function "
                        f"({k(Keys.LLM.EXPERT_GATING_FUNC)}): DeepSeek-V3 scores by sigmoid, and llama.cpp would "
                        "use softmax here; convert it from a config.json with scoring_func \"sigmoid\"" if has_bias
                        else "sigmoid gating but no router bias (exp_probs_b): neither DeepSeek-V2 nor V3"))
    n_group = int(field(k(Keys.LLM.EXPERT_GROUP_COUNT), 1, required=False))
    topk_group = int(field(k(Keys.LLM.EXPERT_GROUP_USED_COUNT), n_group, required=False))
    if n_group > 1 and not sigmoid:
        raise GGUFError(f"GGUF key {k(Keys.LLM.EXPERT_GROUP_COUNT)}={n_group} with softmax gating: llama.cpp scores a "
                        "group by its best two experts, transformers' DeepSeek-V2 by its best one; refusing to pick")
    scaling = field(k(Keys.Rope.SCALING_TYPE), None, required=False)
    if scaling and scaling != "none":
        raise GGUFError(f"GGUF key {k(Keys.Rope.SCALING_TYPE)}={scaling!r}: RoPE scaling of a deepseek2 file is not "
                        "read yet (llama.cpp folds YaRN's mscale into its own keys); pack the safetensors checkpoint")
    rope = int(field(k(Keys.Rope.DIMENSION_COUNT)))
    key_mla, value_mla = field(k(Keys.Attention.KEY_LENGTH_MLA), None), field(k(Keys.Attention.VALUE_LENGTH_MLA), None)
    ff = field(k(Keys.LLM.FEED_FORWARD_LENGTH), 0, required=False)
    q_lora = field(k(Keys.Attention.Q_LORA_RANK), None, required=False)
    cfg = {
        "architectures": ["DeepseekV3ForCausalLM" if sigmoid else "DeepseekV2ForCausalLM"],
        "num_key_value_heads": n_head,  # the file says 1: MLA's latent, which the runtime's image says too
        "q_lora_rank": int(q_lora) if q_lora else None, "kv_lora_rank": int(field(k(Keys.Attention.KV_LORA_RANK))),
        "qk_rope_head_dim": rope, "qk_nope_head_dim": int(key_mla) - rope, "v_head_dim": int(value_mla),
        "first_k_dense_replace": int(field(k(Keys.LLM.LEADING_DENSE_BLOCK_COUNT), 0, required=False)),
        "intermediate_size": int(ff), "n_shared_experts": int(field(k(Keys.LLM.EXPERT_SHARED_COUNT), 0, required=False)),
        "routed_scaling_factor": float(field(k(Keys.LLM.EXPERT_WEIGHTS_SCALE), 1.0, required=False)),
        "norm_topk_prob": bool(field(k(Keys.LLM.EXPERT_WEIGHTS_NORM), False, required=False)),
        "n_group": n_group, "topk_group": topk_group,
    }
    if sigmoid:
        cfg["rope_interleave"] = True  # llama.cpp rotates adjacent pairs
    else:
        cfg["topk_method"] = "greedy"
    n_experts = int(field(k(Keys.LLM.EXPERT_COUNT), 0, required=False))
    if n_experts:
        cfg["n_routed_experts"] = n_experts
        cfg["num_experts_per_tok"] = int(field(k(Keys.LLM.EXPERT_USED_COUNT)))
        cfg["moe_intermediate_size"] = int(field(k(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH)))
    return cfg


# llama.cpp's expert activation for gpt-oss (src/llama-graph.cpp, LLM_FFN_SWIGLU_OAI_MOE): constants, not keys
LLAMA_CPP_SWIGLU_ALPHA, LLAMA_CPP_SWIGLU_LIMIT = 1.702, 7.0


def _gpt_oss(field, k, n_layers: int, n_experts: int, tensors: dict) -> dict:
    """The gpt-oss config fields of a gpt-oss file, as llama.cpp runs it: the sliding window on the even
    layers (its swa pattern 2), its constant SwiGLU alpha and limit, YaRN with the correction range rounded
    to whole dimensions (ggml's rope_yarn_corr_dims floors and ceils)."""
    if field(k(Keys.Attention.SLIDING_WINDOW_PATTERN), None, required=False) is not None:
        raise GGUFError(f"GGUF key {k(Keys.Attention.SLIDING_WINDOW_PATTERN)} is not read; llama.cpp's gpt-oss "
                        "files window the even layers")
    cfg = {
        "sliding_window": int(field(k(Keys.Attention.SLIDING_WINDOW))),
        "layer_types": ["sliding_attention" if layer % 2 == 0 else "full_attention" for layer in range(n_layers)],
        "swiglu_alpha": LLAMA_CPP_SWIGLU_ALPHA, "swiglu_limit": LLAMA_CPP_SWIGLU_LIMIT,
        "attention_bias": _name(MODEL_TENSOR.ATTN_Q, 0) + ".bias" in tensors,
        "num_local_experts": n_experts, "num_experts_per_tok": int(field(k(Keys.LLM.EXPERT_USED_COUNT))),
        "intermediate_size": int(field(k(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH))),
    }
    scaling = field(k(Keys.Rope.SCALING_TYPE), None, required=False)
    if scaling == "yarn":
        cfg["rope_scaling"] = {
            "rope_type": "yarn", "factor": float(field(k(Keys.Rope.SCALING_FACTOR))), "truncate": True,
            "original_max_position_embeddings": int(field(k(Keys.Rope.SCALING_ORIG_CTX_LEN))),
            "beta_fast": float(field(k(Keys.Rope.SCALING_YARN_BETA_FAST), 32.0, required=False)),
            "beta_slow": float(field(k(Keys.Rope.SCALING_YARN_BETA_SLOW), 1.0, required=False)),
        }
    return cfg


def _gpt_oss_tensors(tensors: dict, n_layers: int) -> dict[str, LazyTensor | np.ndarray]:
    """A gpt-oss file's tensors under transformers' names and in its layout: every layer's experts fused
    (gate_up_proj [E, D, 2F], gate and up interleaved by column; down_proj [E, F, D]), as GptOssExperts holds them.
    The other tensors stay as stored (a Q8_0/Q4_0 one carries over unchanged)."""
    pending = dict(tensors)
    out: dict[str, LazyTensor | np.ndarray] = {}

    def take(gguf_name: str) -> LazyTensor:
        if gguf_name not in pending:
            raise GGUFError(f"GGUF file lacks tensor {gguf_name}")
        return pending.pop(gguf_name)

    out["model.embed_tokens.weight"] = take(_name(MODEL_TENSOR.TOKEN_EMBD) + ".weight")
    out["model.norm.weight"] = take(_name(MODEL_TENSOR.OUTPUT_NORM) + ".weight")
    if _name(MODEL_TENSOR.OUTPUT) + ".weight" in pending:
        out["lm_head.weight"] = take(_name(MODEL_TENSOR.OUTPUT) + ".weight")
    for layer in range(n_layers):
        p = f"model.layers.{layer}."
        name = lambda t, kind="weight": f"{_name(t, layer)}.{kind}"  # noqa: E731
        out[p + "input_layernorm.weight"] = take(name(MODEL_TENSOR.ATTN_NORM))
        out[p + "post_attention_layernorm.weight"] = take(name(MODEL_TENSOR.ATTN_POST_NORM))
        out[p + "self_attn.sinks"] = take(name(MODEL_TENSOR.ATTN_SINKS))
        for t, proj in ((MODEL_TENSOR.ATTN_Q, "q_proj"), (MODEL_TENSOR.ATTN_K, "k_proj"), (MODEL_TENSOR.ATTN_V, "v_proj"),
                        (MODEL_TENSOR.ATTN_OUT, "o_proj")):
            for kind in ("weight", "bias"):
                if name(t, kind) in pending:
                    out[f"{p}self_attn.{proj}.{kind}"] = take(name(t, kind))
        out[p + "mlp.router.weight"] = take(name(MODEL_TENSOR.FFN_GATE_INP))
        out[p + "mlp.router.bias"] = take(name(MODEL_TENSOR.FFN_GATE_INP, "bias"))
        gate, up = take(name(MODEL_TENSOR.FFN_GATE_EXP)), take(name(MODEL_TENSOR.FFN_UP_EXP))  # [E, F, D]
        n_experts, ffn, hidden = gate.shape
        out[p + "mlp.experts.gate_up_proj"] = Derived(
            (n_experts, hidden, 2 * ffn), lambda gate=gate, up=up: _fused_gate_up(gate.load(), up.load()),
            lambda i, gate=gate, up=up: _fused_gate_up(gate.expert(i), up.expert(i)))
        bias = np.empty((n_experts, 2 * ffn), np.float32)
        bias[:, 0::2] = np.asarray(take(name(MODEL_TENSOR.FFN_GATE_EXP, "bias")), np.float32)
        bias[:, 1::2] = np.asarray(take(name(MODEL_TENSOR.FFN_UP_EXP, "bias")), np.float32)
        out[p + "mlp.experts.gate_up_proj_bias"] = bias
        down = take(name(MODEL_TENSOR.FFN_DOWN_EXP))  # [E, D, F]
        out[p + "mlp.experts.down_proj"] = _lazy((n_experts, ffn, hidden), down, _transposed, _transposed)
        out[p + "mlp.experts.down_proj_bias"] = take(name(MODEL_TENSOR.FFN_DOWN_EXP, "bias"))
    if pending:
        raise GGUFError(f"GGUF tensors the runtime would not use: {', '.join(sorted(pending)[:5])}")
    return out


def _floats(t: np.ndarray | Encoded) -> np.ndarray:
    """Values as f32 (Q8_0/Q4_0 widened exactly)."""
    return t.decode() if isinstance(t, Encoded) else np.asarray(t, np.float32)


def _transposed(t: np.ndarray | Encoded) -> np.ndarray:
    """The last two axes swapped, as f32."""
    return np.ascontiguousarray(np.swapaxes(_floats(t), -1, -2))


def _fused_gate_up(gate: np.ndarray | Encoded, up: np.ndarray | Encoded) -> np.ndarray:
    """gate and up [..., F, D] (one expert or all of a layer) as transformers' gate_up_proj [..., D, 2F],
    gate and up interleaved by column."""
    g, u = _floats(gate), _floats(up)
    fused = np.empty((*g.shape[:-2], 2 * g.shape[-2], g.shape[-1]), np.float32)
    fused[..., 0::2, :], fused[..., 1::2, :] = g, u
    return _transposed(fused)


def _heads_stacked(t: np.ndarray | Encoded) -> np.ndarray | Encoded:
    """A per-head [H, rows, cols] tensor (attn_k_b, attn_v_b) as one matrix [H * rows, cols]."""
    if isinstance(t, Encoded):
        h, rows = t.shape[0], t.shape[1]
        return Encoded(t.dtype, (h * rows, t.shape[2]), t.values.reshape(h * rows, *t.values.shape[2:]),
                       t.scales.reshape(h * rows, -1))
    return t.reshape(-1, t.shape[-1])


def _hf_tensors(tensors: dict[str, LazyTensor], arch: str, hf_arch: str, n_layers: int, n_head: int,
                n_head_kv: int) -> dict[str, LazyTensor]:
    """The tensors under the names the HF family's mapping reads (colibri/checkpoint.py's FAMILIES: its MoE block's
    prefix, router and per-expert names), each layer's experts split from llama.cpp's stacks."""
    fam = FAMILIES[hf_arch]
    out: dict[str, LazyTensor] = {}
    pending = dict(tensors)

    def take(gguf_name: str, hf_name: str) -> None:
        if gguf_name in pending:
            out[hf_name] = pending.pop(gguf_name)

    take(_name(MODEL_TENSOR.TOKEN_EMBD) + ".weight", "model.embed_tokens.weight")
    take(_name(MODEL_TENSOR.OUTPUT_NORM) + ".weight", "model.norm.weight")
    take(_name(MODEL_TENSOR.OUTPUT) + ".weight", "lm_head.weight")
    for layer in range(n_layers):
        p = f"model.layers.{layer}."
        for t, hf in {**LAYER_TENSORS, **(DEEPSEEK_TENSORS if arch == "deepseek2" else {})}.items():
            for kind in ("weight", "bias"):
                take(f"{_name(t, layer)}.{kind}", f"{p}{hf}.{kind}")
        take(_name(MODEL_TENSOR.FFN_EXP_PROBS_B, layer) + ".bias", p + "mlp.gate.e_score_correction_bias")
        for which in ("k_b_proj", "v_b_proj"):
            if f"{p}self_attn.{which}.weight" in out:
                t = out[f"{p}self_attn.{which}.weight"]
                out[f"{p}self_attn.{which}.weight"] = _lazy((t.shape[0] * t.shape[1], t.shape[2]), t, _heads_stacked)
        router = _name(MODEL_TENSOR.FFN_GATE_INP, layer) + ".weight"
        if router in pending:
            out[f"{p}{fam.moe_prefix}.{fam.router_name}"] = pending.pop(router)
        for t, which in EXPERT_TENSORS.items():
            name = _name(t, layer) + ".weight"
            if name not in pending:
                continue
            stacked = pending.pop(name)
            expert_name = fam.expert_names[("gate", "up", "down").index(which)]
            for e in range(stacked.shape[0]):
                hf = f"{p}{fam.moe_prefix}.experts.{e}.{expert_name}.weight"
                out[hf] = Derived(stacked.shape[1:], functools.partial(stacked.expert, e))  # its bytes alone
        if arch in PERMUTED_QK:  # undo convert_hf_to_gguf's q/k permutation
            for proj, heads in (("q_proj", n_head), ("k_proj", n_head_kv)):
                for kind in ("weight", "bias"):
                    key = f"{p}self_attn.{proj}.{kind}"
                    if key in out:
                        out[key] = _lazy(out[key].shape, out[key], functools.partial(_unpermuted, n_head=heads))
    for name, t in out.items():  # llama.cpp may store the shared expert's gate as a vector
        if name.endswith("shared_expert_gate.weight") and t.ndim == 1:
            out[name] = _lazy((1, t.shape[0]), t, lambda values: _floats(values).reshape(1, -1))
    if pending:
        raise GGUFError(f"GGUF tensors the runtime would not use: {', '.join(sorted(pending)[:5])}")
    return out
