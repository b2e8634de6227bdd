"""Read a GGUF file (llama.cpp's format) into the same config + tensors a Hugging Face checkpoint gives.

The packer then maps both the same way (colibri/checkpoint.py), so GGUF and safetensors inputs
cannot drift apart. What this module undoes:
- llama.cpp's names and metadata keys (taken from the `gguf` package's constants);
- experts stored as one 3-D tensor per layer (split back into one matrix per expert);
- the q/k row permutation llama.cpp's converter applies for the `llama` architecture (Llama and
  Mixtral), so that its interleaved RoPE matches; the runtime uses rotate-half;
- storage types: Q8_0 and Q4_0 tensors are kept as they are (host.quant.Encoded), so packing them to
  the same dtype carries them over bit for bit; every other type the `gguf` package can dequantize
  (F16, BF16, Q4_1, Q5_0, Q5_1, the K-quants, the IQ types, ...) is widened to f32 exactly, and the
  packer converts it to the dtype asked for. `read_gguf` says which types it converted.
The architecture and the config keys are checked before any tensor is read, so a refusal of a
multi-GB file is immediate.
"""
from __future__ import annotations

import functools
from pathlib import Path

import gguf
import numpy as np
from gguf.constants import MODEL_TENSOR, TENSOR_NAMES, Keys

from colibri.quant import DType, Encoded, from_gguf_blocks

KEPT_TYPES = {gguf.GGMLQuantizationType.Q8_0: DType.Q8_0, gguf.GGMLQuantizationType.Q4_0: DType.Q4_0}
# widened to f32 with nothing lost: not worth naming in the conversion report
EXACT_TYPES = {gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16}
# llama.cpp architecture -> HF architecture (llama with experts is Mixtral)
ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen2moe": "Qwen2MoeForCausalLM",
                 "qwen3moe": "Qwen3MoeForCausalLM", "olmoe": "OlmoeForCausalLM"}
# Architectures whose routing renormalization llama.cpp fixes in code rather than in the file (the norm_w
# argument of build_moe_ffn in its src/models/<arch>.cpp): its converter writes no expert_weights_norm
# for them, so a file as found runs as llama.cpp runs it, unless the key or --norm-topk-prob says otherwise.
LLAMA_CPP_NORM_TOPK = {"qwen2moe": False, "qwen3moe": True, "olmoe": False}


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


@functools.lru_cache(maxsize=2)
def _reader(path: str, mtime_ns: int, size: int) -> gguf.GGUFReader:
    return gguf.GGUFReader(path)


def open_gguf(path: Path) -> gguf.GGUFReader:
    """The file's reader, parsed once while the file stays the same: parsing a vocabulary's keys takes
    seconds (GPT-2's 50k tokens and merges: 4 s), and packing reads them for the model and for the text."""
    st = Path(path).stat()
    return _reader(str(path), st.st_mtime_ns, st.st_size)


def read_gguf(path: Path, norm_topk_prob: bool | None = None
              ) -> tuple[dict, dict[str, np.ndarray | Encoded], dict[str, int]]:
    """(HF-style config dict, HF-named tensors: f32 arrays, or Q8_0/Q4_0 as stored, and how many tensors
    of each storage type the image has no dtype for were dequantized to f32) from a GGUF file."""
    try:
        reader = open_gguf(path)
    except (ValueError, OSError) as exc:
        raise GGUFError(f"{path} is not a readable GGUF file: {exc}") from None

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
    else:
        raise GGUFError(f"GGUF architecture {arch!r} is not supported; supported: llama, {', '.join(ARCHITECTURES)}")

    norm = field(k(Keys.LLM.EXPERT_WEIGHTS_NORM), None, required=False) if norm_topk_prob is None else norm_topk_prob
    if norm is None:
        norm = LLAMA_CPP_NORM_TOPK.get(arch)
    if any(t.name == "rope_freqs.weight" for t in reader.tensors):
        raise GGUFError("GGUF tensor rope_freqs (llama3-style RoPE frequency factors) is not supported")

    tensors: dict[str, np.ndarray | Encoded] = {}
    converted: dict[str, int] = {}
    for t in reader.tensors:
        if t.tensor_type in KEPT_TYPES:
            shape = tuple(int(n) for n in reversed(t.shape))  # GGUF lists dimensions fastest first
            tensors[t.name] = from_gguf_blocks(t.data, KEPT_TYPES[t.tensor_type], shape)
            continue
        try:
            tensors[t.name] = np.asarray(gguf.dequantize(t.data, t.tensor_type), dtype=np.float32)
        except NotImplementedError:
            raise GGUFError(f"tensor {t.name} has type {t.tensor_type.name}, which the gguf package cannot "
                            "dequantize; convert the model again with another type") from None
        if t.tensor_type not in EXACT_TYPES:
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
    if head_dim:
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
    has_bias = _name(MODEL_TENSOR.ATTN_Q, 0) + ".bias" in tensors
    if arch == "qwen2moe":
        cfg["qkv_bias"] = has_bias
    elif arch not in ("qwen2",):
        cfg["attention_bias"] = has_bias
    if n_experts:  # under the name the family's transformers config takes (so --against builds the right model)
        cfg["num_local_experts" if arch == "llama" else "num_experts"] = n_experts
        cfg["num_experts_per_tok"] = int(field(k(Keys.LLM.EXPERT_USED_COUNT)))
        expert_ff = field(k(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH), None, required=False)
        if arch in ("qwen2moe", "qwen3moe"):
            cfg["moe_intermediate_size"] = int(expert_ff or ff)
        elif expert_ff:
            cfg["intermediate_size"] = int(expert_ff)
        shared_ff = field(k(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH), None, required=False)
        if shared_ff:
            cfg["shared_expert_intermediate_size"] = int(shared_ff)
        if arch in LLAMA_CPP_NORM_TOPK:
            cfg["norm_topk_prob"] = bool(norm)
        # dense layers are the blocks without a router
        dense = [layer for layer in range(n_layers)
                 if _name(MODEL_TENSOR.FFN_GATE_INP, layer) + ".weight" not in tensors]
        if dense and arch in ("qwen2moe", "qwen3moe"):
            cfg["mlp_only_layers"] = dense
    return cfg, _hf_tensors(tensors, arch, n_layers, n_head, n_head_kv), converted


def _hf_tensors(tensors: dict[str, np.ndarray | Encoded], arch: str, n_layers: int, n_head: int,
                n_head_kv: int) -> dict[str, np.ndarray | Encoded]:
    out: dict[str, np.ndarray | Encoded] = {}
    pending = dict(tensors)

    def take(gguf_name: str, hf_name: str) -> None:
        if gguf_name in pending:
            out[hf_name] = pending.pop(gguf_name)

    take(_name(MODEL_TENSOR.TOKEN_EMBD) + ".weight", "model.embed_tokens.weight")
    take(_name(MODEL_TENSOR.OUTPUT_NORM) + ".weight", "model.norm.weight")
    take(_name(MODEL_TENSOR.OUTPUT) + ".weight", "lm_head.weight")
    mixtral = arch == "llama"
    for layer in range(n_layers):
        p = f"model.layers.{layer}."
        for t, hf in LAYER_TENSORS.items():
            for kind in ("weight", "bias"):
                take(f"{_name(t, layer)}.{kind}", f"{p}{hf}.{kind}")
        router = _name(MODEL_TENSOR.FFN_GATE_INP, layer) + ".weight"
        if router in pending:
            out[p + ("block_sparse_moe.gate.weight" if mixtral else "mlp.gate.weight")] = pending.pop(router)
        for t, which in EXPERT_TENSORS.items():
            name = _name(t, layer) + ".weight"
            if name not in pending:
                continue
            stacked = pending.pop(name)
            for e in range(stacked.shape[0]):
                if mixtral:
                    hf = f"{p}block_sparse_moe.experts.{e}.{ {'gate': 'w1', 'up': 'w3', 'down': 'w2'}[which]}.weight"
                else:
                    hf = f"{p}mlp.experts.{e}.{which}_proj.weight"
                out[hf] = stacked[e]
        if arch == "llama":  # undo convert_hf_to_gguf's q/k permutation
            for proj, heads in (("q_proj", n_head), ("k_proj", n_head_kv)):
                for kind in ("weight", "bias"):
                    key = f"{p}self_attn.{proj}.{kind}"
                    if key in out:
                        t = out[key]
                        out[key] = t.map_rows(lambda a: unpermute(a, heads)) if isinstance(t, Encoded) else unpermute(t, heads)
    for name, arr in out.items():  # llama.cpp may store the shared expert's gate as a vector
        if name.endswith("shared_expert_gate.weight") and arr.ndim == 1:
            out[name] = (arr.decode() if isinstance(arr, Encoded) else arr).reshape(1, -1)
    if pending:
        raise GGUFError(f"GGUF tensors the runtime would not use: {', '.join(sorted(pending)[:5])}")
    return out
