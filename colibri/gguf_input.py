"""Read a GGUF file (llama.cpp's format) into the same config + tensors a Hugging Face checkpoint gives.

The packer then maps both the same way (colibri/checkpoint.py), so GGUF and safetensors inputs
cannot drift apart. What this module undoes:
- llama.cpp's names and metadata keys (taken from the `gguf` package's constants);
- experts stored as one 3-D tensor per layer (split back into one matrix per expert);
- the q/k row permutation llama.cpp's converter applies for the `llama` architecture (Llama and
  Mixtral) and `granitemoe`, so that its interleaved RoPE matches; the runtime uses rotate-half;
- `granitemoe` with `expert_shared_feed_forward_length` above 0 (GraniteMoeShared, a variant told apart by that
  key: Family.gguf_variant_key; llama.cpp reads the shared MLP only then): the shared MLP's gate and up, split by
  the converter, joined back into one matrix;
- `gpt-oss` (its family file's GGUF hooks): experts as separate gate, up and down stacks (MXFP4 in llama.cpp's
  converter's files) fused back into transformers' layout;
- `deepseek2` (DeepSeek-V2/V3, its family file's GGUF hooks): kv_b_proj arrives already split into attn_k_b
  (transposed per head) and attn_v_b, the runtime's own WK_B and WV_B layout, so they are kept as they are;
- `lfm2` and `lfm2moe` (colibri/families/lfm2.py): a KV head count per layer, 0 where a layer convolves, the
  convolution squeezed to [D, K];
- `qwen35moe` (colibri/families/qwen35.py's GGUF hooks): the DeltaNet's value heads, which the converter tiles for
  ggml, put back in transformers' order; the norms (1 + w) and the decay (-exp(A_log)) taken as stored;
- storage types: tensors of a type the image has (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4, Q4_K, Q5_K, Q6_K) are kept
  as they are (colibri.quant.Encoded), so packing them to the same dtype (or `--dtype stored`) carries them over bit
  for bit (but for a tensor the family scales or transposes when packing: Granite's multipliers,
  colibri/families/granite.py's weight_scales; gpt-oss's experts); every other type the `gguf` package can
  dequantize (F16, BF16, Q2_K, Q3_K, the IQ types, ...) is widened to f32 exactly, and the packer converts it to
  the dtype asked for. `read_gguf` says which types it converted.
The architecture and the config keys are checked before any tensor is read, so a refusal of a
multi-GB file is immediate. No tensor is read here: each is read by its offset when the packer writes it
(colibri/lazy.py), a routed expert's bytes alone out of its layer's 3-D tensor, and the layout undone then.
"""
from __future__ import annotations

import functools
import math
from pathlib import Path

import gguf
import numpy as np
from gguf.constants import MODEL_TENSOR, Keys

from colibri.families import FAMILIES, Family
from colibri.format import MAX_LAYERS
from colibri.gguf_common import (GGUFError, GGUFFile, as_row, gguf_name, heads_stacked, lazy, rows_joined,
                                  split_experts, split_gate_up)
from colibri.lazy import FileTensor, LazyTensor, OpenFile
from colibri.quant import DType, Encoded, from_gguf_blocks

# the keys whose value the reader takes as one number (the others it reads with a numeric default are too)
NUMBER_KEYS = (".block_count", ".head_count", ".head_count_kv", ".embedding_length", ".context_length",
               ".feed_forward_length", ".expert_used_count", ".layer_norm_rms_epsilon", ".dimension_count",
               ".kv_lora_rank", ".key_length_mla", ".value_length_mla", ".scaling.factor")
KEPT_TYPES = {gguf.GGMLQuantizationType[d.name]: d for d in DType if d.quantized}  # carried over as stored
# widened to f32 with nothing lost: not worth naming in the conversion report
EXACT_TYPES = {gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16}
# --dtype stored's dtype for a tensor of a type no image dtype holds (IQ4_XS, Q3_K, ...): 8 bits a value keep its
# values within Q8_0's rounding, where f32 would take 7-10 times the file's bytes
STORED_FALLBACK = DType.Q8_0


def stored_as(qtype: gguf.GGMLQuantizationType) -> DType | None:
    """The image dtype --dtype stored packs a GGUF tensor of this type in: its own where the image has it (F16 and
    BF16 too), STORED_FALLBACK for another quantized type, None (f32) for F32."""
    if qtype in KEPT_TYPES:
        return KEPT_TYPES[qtype]
    if qtype == gguf.GGMLQuantizationType.F32:
        return None
    return DType[qtype.name] if qtype in EXACT_TYPES else STORED_FALLBACK
# llama.cpp architecture -> {has experts: HF architecture} (the families' gguf_arch: colibri/families/; one family,
# or two told apart by the file's expert count, as llama is Llama or Mixtral)
ARCHITECTURES: dict[str, dict[bool, str]] = {}
# HF architecture -> its variants, each with the key whose value above 0 marks a file as the variant's
# (Family.gguf_variant_key: a count, as llama.cpp reads granitemoe's shared MLP only when n_ff_shexp > 0)
VARIANTS: dict[str, list[tuple[str, str]]] = {}
for _arch, _fam in FAMILIES.items():
    if _fam.gguf_arch and not _fam.gguf_variant_key:
        ARCHITECTURES.setdefault(_fam.gguf_arch, {})[_fam.moe] = _arch
for _arch, _fam in FAMILIES.items():
    if _fam.gguf_variant_key:
        VARIANTS.setdefault(ARCHITECTURES[_fam.gguf_arch][_fam.moe], []).append((_fam.gguf_variant_key, _arch))
# Architectures whose q and k rows llama.cpp's converter permutes (LlamaModel and its subclasses): undone on reading
PERMUTED_QK = tuple({fam.gguf_arch for fam in FAMILIES.values() if fam.gguf_permuted_qk})
# Architectures whose routing renormalization llama.cpp fixes in code rather than in the file (the norm_w
# argument of build_moe_ffn in its src/models/<arch>.cpp): its converter writes no expert_weights_norm
# for them, so a file as found runs as llama.cpp runs it, unless the key or --norm-topk-prob says otherwise.
LLAMA_CPP_NORM_TOPK = {fam.gguf_arch: fam.gguf_norm_topk for fam in FAMILIES.values() if fam.gguf_norm_topk is not None}
# per-layer GGUF tensor -> HF name suffix after "model.layers.N."
LAYER_TENSORS = {
    MODEL_TENSOR.ATTN_NORM: "input_layernorm", MODEL_TENSOR.FFN_NORM: "post_attention_layernorm",
    MODEL_TENSOR.ATTN_Q: "self_attn.q_proj", MODEL_TENSOR.ATTN_K: "self_attn.k_proj",
    MODEL_TENSOR.ATTN_V: "self_attn.v_proj", MODEL_TENSOR.ATTN_OUT: "self_attn.o_proj",
    MODEL_TENSOR.ATTN_Q_NORM: "self_attn.q_norm", MODEL_TENSOR.ATTN_K_NORM: "self_attn.k_norm",
    MODEL_TENSOR.FFN_GATE: "mlp.gate_proj", MODEL_TENSOR.FFN_UP: "mlp.up_proj", MODEL_TENSOR.FFN_DOWN: "mlp.down_proj",
    MODEL_TENSOR.FFN_GATE_INP_SHEXP: "mlp.shared_expert_gate",
}
# the shared expert's matrices -> their names under the family's shared expert module (Family.shared_prefix)
SHARED_TENSORS = {MODEL_TENSOR.FFN_GATE_SHEXP: "gate_proj", MODEL_TENSOR.FFN_UP_SHEXP: "up_proj",
                  MODEL_TENSOR.FFN_DOWN_SHEXP: "down_proj"}
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


def gguf_reader(path: Path) -> gguf.GGUFReader:
    """open_gguf, a damaged file said as GGUFError (what pack says of it, and `colibri run` before it packs)."""
    try:
        return open_gguf(path)
    except OSError:  # (unreadable: said as such, not as a damaged file)
        raise
    except Exception as exc:  # the gguf package's parse of hostile bytes fails in many ways (IndexError, struct.error...)
        raise GGUFError(f"{path} is not a readable GGUF file ({type(exc).__name__}: {exc}): it is cut short or not "
                        "GGUF at all; download or convert it again") from None


def read_gguf(path: Path, norm_topk_prob: bool | None = None
              ) -> tuple[dict, dict[str, LazyTensor | np.ndarray], dict[str, int]]:
    """(HF-style config dict, HF-named tensors, unread (their load() gives Q8_0/Q4_0 as stored, any other type
    dequantized to f32), and how many tensors of each storage type the image has no dtype for are
    dequantized to f32) from a GGUF file."""
    reader = gguf_reader(path)

    def field(key: str, default=None, required: bool = True):
        f = reader.fields.get(key)
        if f is None:
            if required and default is None:
                raise GGUFError(f"GGUF file lacks required key {key}")
            return default
        value = f.contents()
        numeric = (isinstance(default, (int, float)) and not isinstance(default, bool)) or key.endswith(NUMBER_KEYS)
        if numeric and isinstance(value, (list, str, bytes, bool)):  # one number: not a list (per layer), text, a bool
            raise GGUFError(f"GGUF key {key}={value!r}: one number was expected"
                            + (" (a value per layer is not read)" if isinstance(value, list) else ""))
        return value

    def whole(key: str, default: int | None = None) -> int:
        """Key `key` as one whole number below 2^32 (llama.cpp reads these counts and sizes as uint32; a text, a
        fraction, a bool or a list is refused by the key's name, never truncated); `default` where the file lacks it
        (None: required)."""
        value = field(key, default, required=default is None)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < (1 << 32):
            raise GGUFError(f"GGUF key {key}={value!r}: one whole number from 0 to 2^32 - 1 was expected")
        return value

    def real(key: str, default: float | None = None) -> float:
        """Key `key` as one finite number (an epsilon, a RoPE base, a multiplier); `default` where the file lacks it
        (None: required)."""
        value = field(key, default, required=default is None)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise GGUFError(f"GGUF key {key}={value!r}: one finite number was expected")
        return float(value)

    arch = field(Keys.General.ARCHITECTURE)
    if arch not in ARCHITECTURES:  # (before any key of the architecture's is looked for)
        raise GGUFError(f"GGUF architecture {arch!r} is not supported; supported: {', '.join(sorted(ARCHITECTURES))}")
    k = lambda key: key.format(arch=arch)  # noqa: E731
    if not field(k(Keys.Attention.CAUSAL), True, required=False):  # (llama.cpp reads it for every architecture)
        raise GGUFError(f"GGUF key {k(Keys.Attention.CAUSAL)}=false: a bidirectional model (an embedding model's "
                        "encoder); the runtime attends causally, to generate")
    n_layers = whole(k(Keys.LLM.BLOCK_COUNT))
    # multi-token-prediction layers (GLM-4.7-Flash's, DeepSeek-V3's) come after the trunk; llama.cpp runs the trunk
    # only when it predicts the next token (its n_layer()), and so does the runtime: their tensors are not read
    nextn = whole(k(Keys.LLM.NEXTN_PREDICT_LAYERS), 0)
    if nextn and not (0 < nextn < n_layers and nextn <= MAX_LAYERS):
        raise GGUFError(f"GGUF key {k(Keys.LLM.NEXTN_PREDICT_LAYERS)}={nextn}: at most {MAX_LAYERS}, and fewer than "
                        f"the {n_layers} blocks")
    n_layers -= nextn
    n_head = whole(k(Keys.Attention.HEAD_COUNT))
    if not 1 <= n_layers <= MAX_LAYERS or n_head < 1:  # (before any loop over the layers)
        raise GGUFError(f"GGUF keys {k(Keys.LLM.BLOCK_COUNT)}={n_layers}, {k(Keys.Attention.HEAD_COUNT)}={n_head}: "
                        f"an image has 1 to {MAX_LAYERS} layers, and a model at least one head")
    n_experts = whole(k(Keys.LLM.EXPERT_COUNT), 0)
    by_experts = ARCHITECTURES[arch]
    hf_arch = by_experts.get(bool(n_experts)) or next(iter(by_experts.values()))  # one family: whatever the count
    variants = VARIANTS.get(hf_arch, ())
    hf_arch = next((variant for key, variant in variants if whole(k(key), 0) > 0), hf_arch)
    for key, variant in variants:  # a variant's own tensors in a file that is not the variant's: refused by its key
        own = [] if variant == hf_arch else \
            _variant_tensors(FAMILIES[variant], FAMILIES[hf_arch], [t.name for t in reader.tensors])
        if own:
            said = f" above 0 (the file's is {whole(k(key), 0)})" if k(key) in reader.fields else ""
            raise GGUFError(f"GGUF tensors {', '.join(own[:3])}{' ...' if len(own) > 3 else ''}: a {arch} shared MLP, "
                            f"which needs the key {k(key)}{said}")
    fam = FAMILIES[hf_arch]
    per_layer = functools.partial(_per_layer, reader, arch=arch, n_blocks=n_layers + nextn, listed=fam.gguf_per_layer)
    n_head_kv, layer_kv_heads = per_layer(k(Keys.Attention.HEAD_COUNT_KV), n_head)
    if n_head_kv < 1:
        raise GGUFError(f"GGUF key {k(Keys.Attention.HEAD_COUNT_KV)}={n_head_kv}: a model has at least one KV head")
    ff, layer_ffn = per_layer(k(Keys.LLM.FEED_FORWARD_LENGTH), 0)

    if norm_topk_prob is not None and arch not in LLAMA_CPP_NORM_TOPK:
        raise GGUFError(f"--norm-topk-prob is for {', '.join(sorted(LLAMA_CPP_NORM_TOPK))} files, whose "
                        f"renormalization llama.cpp fixes in code and their converter does not write; a file of "
                        f"architecture {arch} states its own or has none: pack it without the option")
    norm = field(k(Keys.LLM.EXPERT_WEIGHTS_NORM), None, required=False) if norm_topk_prob is None else norm_topk_prob
    if norm is None:
        norm = LLAMA_CPP_NORM_TOPK.get(arch)
    if not fam.gguf_read_tensors and any(t.name == "rope_freqs.weight" for t in reader.tensors):
        raise GGUFError("GGUF tensor rope_freqs (llama3-style RoPE frequency factors) is not supported")

    file = OpenFile(path)
    tensors: dict[str, FileTensor] = {}
    converted: dict[str, int] = {}
    mtp = tuple(f"blk.{layer}." for layer in range(n_layers, n_layers + nextn))
    for t in reader.tensors:
        if t.name.startswith(mtp):
            continue
        tensors[t.name] = _file_tensor(file, t)
        if t.tensor_type not in EXACT_TYPES and t.tensor_type not in KEPT_TYPES:
            converted[t.tensor_type.name] = converted.get(t.tensor_type.name, 0) + 1

    embd = tensors.get(gguf_name(MODEL_TENSOR.TOKEN_EMBD) + ".weight")
    if embd is None:
        raise GGUFError("GGUF file lacks tensor token_embd.weight")

    cfg: dict = {
        "architectures": [hf_arch],
        "vocab_size": embd.shape[0], "hidden_size": whole(k(Keys.LLM.EMBEDDING_LENGTH)),
        "num_hidden_layers": n_layers, "num_attention_heads": n_head, "num_key_value_heads": n_head_kv,
        "max_position_embeddings": whole(k(Keys.LLM.CONTEXT_LENGTH)),
        fam.eps_key: real(k(Keys.Attention.LAYERNORM_RMS_EPS)),
        "rope_theta": real(k(Keys.Rope.FREQ_BASE), 10000.0),
        "tie_word_embeddings": gguf_name(MODEL_TENSOR.OUTPUT) + ".weight" not in tensors,
    }
    if ff:
        cfg["intermediate_size"] = int(ff)
    head_dim = whole(k(Keys.Attention.KEY_LENGTH), 0)
    if head_dim and fam.gguf_key_length_is_head:  # (DeepSeek's is the latent's: kv_lora_rank + rope)
        cfg["head_dim"] = head_dim
    scaling = field(k(Keys.Rope.SCALING_TYPE), None, required=False)
    if scaling and scaling != "none":
        cfg["rope_scaling"] = {"rope_type": scaling, "factor": real(k(Keys.Rope.SCALING_FACTOR))}
        orig = whole(k(Keys.Rope.SCALING_ORIG_CTX_LEN), 0)
        if orig:
            cfg["rope_scaling"]["original_max_position_embeddings"] = orig
    clamp = real(k(Keys.Attention.CLAMP_KQV), 0.0)
    if clamp:
        cfg["clip_qkv"] = clamp
    if fam.gguf_read_config:  # an architecture whose file its family reads (DeepSeek's, gpt-oss's)
        f = GGUFFile(field, k, n_layers, n_head, n_head_kv, n_experts, tensors, layer_kv_heads[:n_layers],
                     layer_ffn[:n_layers])
        cfg.update(fam.gguf_read_config(f))
        if n_experts and arch in LLAMA_CPP_NORM_TOPK:
            cfg["norm_topk_prob"] = bool(norm)
        if fam.gguf_read_tensors:
            return cfg, fam.gguf_read_tensors(f), converted
        return cfg, _hf_tensors(tensors, arch, cfg["architectures"][0], n_layers, n_head, n_head_kv), converted
    if fam.bias_key:  # the family's switch of the q/k/v(/o) biases (Qwen2's are always there)
        cfg[fam.bias_key] = gguf_name(MODEL_TENSOR.ATTN_Q, 0) + ".bias" in tensors
    cfg.update({hf: real(k(key)) for key, hf in fam.gguf_config})  # e.g. Granite's multipliers
    shared_ff = 0
    if n_experts and fam.moe:  # under the name the family's transformers config takes (so --against builds it)
        cfg[fam.n_experts_key] = n_experts
        cfg["num_experts_per_tok"] = whole(k(Keys.LLM.EXPERT_USED_COUNT))
        expert_ff = whole(k(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH), 0)
        if expert_ff or ff:  # (a llama file's experts: feed_forward_length, the same key as transformers')
            cfg[fam.expert_ffn_key] = int(expert_ff or ff)
        shared_ff = whole(k(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH), 0)
        if shared_ff:
            cfg[fam.gguf_shared_ffn_key] = shared_ff
        if arch in LLAMA_CPP_NORM_TOPK:
            cfg["norm_topk_prob"] = bool(norm)
        # dense layers are the blocks without a router
        dense = [layer for layer in range(n_layers)
                 if gguf_name(MODEL_TENSOR.FFN_GATE_INP, layer) + ".weight" not in tensors]
        if dense and fam.sparse_layer_rule:
            cfg["mlp_only_layers"] = dense
    shared = ((k(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH), shared_ff),
              (k(Keys.LLM.EMBEDDING_LENGTH), cfg["hidden_size"]))
    return cfg, _hf_tensors(tensors, arch, hf_arch, n_layers, n_head, n_head_kv, shared), converted


def _shared_joined(pending: dict[str, LazyTensor], layer: int, width: tuple[str, int], hidden: tuple[str, int]
                   ) -> LazyTensor:
    """A layer's shared MLP as llama.cpp reads it when the width key is above 0 (src/models/granite-moe.cpp: gate
    and up [width, hidden], down [hidden, width], in every layer with experts), checked by the file's tensor and key
    names: its gate and up (taken out of `pending`) joined into one matrix, the gate's rows first."""
    gate, up, down = (gguf_name(t, layer) + ".weight"
                      for t in (MODEL_TENSOR.FFN_GATE_SHEXP, MODEL_TENSOR.FFN_UP_SHEXP, MODEL_TENSOR.FFN_DOWN_SHEXP))
    (width_key, n), (hidden_key, d) = width, hidden
    missing = [name for name in (gate, up, down) if name not in pending]
    if missing:
        listed = ", ".join(missing[:-1]) + " and " * (len(missing) > 1) + missing[-1]
        raise GGUFError(f"GGUF file lacks {listed}: the key {width_key}={n} gives every layer with experts a shared "
                        "MLP, blk.N.ffn_gate_shexp, ffn_up_shexp and ffn_down_shexp")
    for name, want in ((gate, (n, d)), (up, (n, d)), (down, (d, n))):
        if tuple(pending[name].shape) != want:
            raise GGUFError(f"GGUF tensor {name} has shape {tuple(pending[name].shape)}; the keys {width_key}={n} "
                            f"and {hidden_key}={d} make it {want}")
    return rows_joined(pending.pop(gate), pending.pop(up), [gate, up])


def _variant_tensors(variant: Family, base: Family, names: list[str]) -> list[str]:
    """Those of `names` that are tensors only the variant family's files hold, not its base family's
    (GraniteMoeShared's shared MLP: ffn_gate_shexp and ffn_up_shexp, which it joins, and ffn_down_shexp, one of its
    gguf_layer_tensors), in the file's order."""
    kinds = {*([MODEL_TENSOR.FFN_GATE_SHEXP, MODEL_TENSOR.FFN_UP_SHEXP] if variant.gguf_shared_fused else []),
             *(t for t, _ in variant.gguf_layer_tensors)} - {t for t, _ in base.gguf_layer_tensors}
    own = {gguf_name(t, 0).split(".")[2] for t in kinds}  # (blk.N.<this>.weight)
    return [name for name in names if name.startswith("blk.") and name.count(".") >= 3 and name.split(".")[2] in own]


def _per_layer(reader: gguf.GGUFReader, key: str, default: int, *, arch: str, n_blocks: int,
               listed: tuple[str, ...]) -> tuple[int, tuple[int, ...]]:
    """A count the file gives once or, for an architecture whose family reads it so (Family.gguf_per_layer), once per
    block (LFM2's KV heads, 0 where a layer convolves; Gemma 4's KV heads and MLP widths): (the largest, the list or
    () when given once)."""
    f = reader.fields.get(key)
    value = default if f is None else f.contents()
    if not isinstance(value, list):
        if isinstance(value, (str, bytes, bool, float)) or not 0 <= value < (1 << 32):
            raise GGUFError(f"GGUF key {key}={value!r}: one whole number was expected")
        return int(value), ()
    if key.split(".", 1)[1] not in {t.split(".", 1)[1] for t in listed}:
        raise GGUFError(f"GGUF key {key}={value!r}: one number was expected (a value per layer, which the {arch} "
                        "architecture does not have)")
    if len(value) != n_blocks or any(isinstance(v, (str, bytes, bool, float)) or not 0 <= v < (1 << 32)
                                     for v in value):
        raise GGUFError(f"GGUF key {key} lists {len(value)} values: one whole number per block ({n_blocks})")
    return max(value), tuple(int(v) for v in value)


def _file_tensor(file: OpenFile, t) -> FileTensor:
    """A GGUF tensor unread: an image dtype's to come as stored (Encoded), every other type dequantized to f32 when
    read.
    The reader's own arrays map the file; only their dtype and shape are taken, and one row is dequantized now
    so that a type the gguf package cannot dequantize is refused before anything is written."""
    shape = tuple(int(n) for n in reversed(t.shape))  # GGUF lists dimensions fastest first
    if t.tensor_type in KEPT_TYPES:
        dtype = KEPT_TYPES[t.tensor_type]
        decode = lambda raw, shape: from_gguf_blocks(raw, dtype, shape)  # noqa: E731
    else:
        qtype = t.tensor_type
        decode = lambda raw, shape: np.asarray(gguf.dequantize(raw, qtype), np.float32).reshape(shape)  # noqa: E731
        try:  # (one row, when there is one)
            if t.data.size:
                gguf.dequantize(t.data.reshape(-1, t.data.shape[-1])[:1], qtype)
        except NotImplementedError:
            raise GGUFError(f"tensor {t.name} has type {t.tensor_type.name}, which the gguf package cannot "
                            "dequantize; convert the model again with another type") from None
    return FileTensor(file, t.data_offset, t.data.dtype, t.data.shape, shape, decode, stored_as(t.tensor_type))


def _hf_tensors(tensors: dict[str, LazyTensor], arch: str, hf_arch: str, n_layers: int, n_head: int,
                n_head_kv: int, shared: tuple[tuple[str, int], tuple[str, int]] = (("", 0), ("", 0))
                ) -> dict[str, LazyTensor]:
    """The tensors under the names the HF family's mapping reads (colibri/checkpoint.py's FAMILIES: its MoE block's
    prefix, router and per-expert names), each layer's experts split from llama.cpp's stacks. `shared`: the keys
    (name, value) of the shared MLP's width and of the hidden size, by which a family whose shared gate and up are
    joined (Family.gguf_shared_fused) checks its shared MLP's tensors, naming them as the file does."""
    fam = FAMILIES[hf_arch]
    out: dict[str, LazyTensor] = {}
    pending = dict(tensors)

    def take(gguf_name: str, hf_name: str) -> None:
        if gguf_name in pending:
            out[hf_name] = pending.pop(gguf_name)

    take(gguf_name(MODEL_TENSOR.TOKEN_EMBD) + ".weight", "model.embed_tokens.weight")
    take(gguf_name(MODEL_TENSOR.OUTPUT_NORM) + ".weight", "model.norm.weight")
    take(gguf_name(MODEL_TENSOR.TOKEN_EMBD_NORM) + ".weight", "model.embedding_norm.weight")  # LFM2's final norm
    take(gguf_name(MODEL_TENSOR.OUTPUT) + ".weight", "lm_head.weight")
    for layer in range(n_layers):
        p = f"model.layers.{layer}."
        # the shared expert under the family's module, or the shared MLP whose gate and up are joined back (its
        # down one of the family's gguf_layer_tensors; no biases: GraniteMoeSharedMLP has none, so a file's are left
        # to be refused by their names)
        shared_names = {} if fam.gguf_shared_fused else \
            {t: f"mlp.{fam.shared_prefix}.{name}" for t, name in SHARED_TENSORS.items()}
        if fam.gguf_shared_fused and gguf_name(MODEL_TENSOR.FFN_GATE_INP, layer) + ".weight" in pending:
            out[f"{p}{fam.gguf_shared_fused}.weight"] = _shared_joined(pending, layer, *shared)
        for t, hf in {**LAYER_TENSORS, **shared_names, **dict(fam.gguf_layer_tensors)}.items():
            for kind in ("weight", "bias"):
                if kind == "weight" or not (fam.gguf_shared_fused and t in SHARED_TENSORS):
                    take(f"{gguf_name(t, layer)}.{kind}", f"{p}{hf}.{kind}")
        take(gguf_name(MODEL_TENSOR.FFN_EXP_PROBS_B, layer) + ".bias", f"{p}{fam.moe_prefix}.{fam.router_bias_name}")
        for which in ("k_b_proj", "v_b_proj"):
            if f"{p}self_attn.{which}.weight" in out:
                t = out[f"{p}self_attn.{which}.weight"]
                if len(t.shape) != 3:
                    raise GGUFError(f"GGUF layer {layer}'s {which.replace('_proj', '')} tensor has shape {tuple(t.shape)}: "
                                    "llama.cpp's converter stacks it per head, [heads, rows, columns]")
                out[f"{p}self_attn.{which}.weight"] = lazy((t.shape[0] * t.shape[1], t.shape[2]), t, heads_stacked,
                                                           keeps=True)
        router = gguf_name(MODEL_TENSOR.FFN_GATE_INP, layer) + ".weight"
        if router in pending:
            out[f"{p}{fam.moe_prefix}.{fam.router_name}"] = pending.pop(router)
        fused = gguf_name(MODEL_TENSOR.FFN_GATE_UP_EXP, layer) + ".weight"
        if fused in pending:  # (gate and up in one tensor: the converter's --fuse-gate-up-exps)
            for which, experts in zip(fam.expert_names[:2], split_gate_up(pending.pop(fused), fused)):
                for e, expert in enumerate(experts):
                    out[f"{p}{fam.moe_prefix}.experts.{e}.{which}.weight"] = expert
        for t, which in EXPERT_TENSORS.items():
            name = gguf_name(t, layer) + ".weight"
            if name not in pending:
                continue
            stacked = pending.pop(name)
            expert_name = fam.expert_names[("gate", "up", "down").index(which)]
            for e, expert in enumerate(split_experts(stacked)):
                out[f"{p}{fam.moe_prefix}.experts.{e}.{expert_name}.weight"] = expert
        if arch in PERMUTED_QK:  # undo convert_hf_to_gguf's q/k permutation
            for proj, heads in (("q_proj", n_head), ("k_proj", n_head_kv)):
                for kind in ("weight", "bias"):
                    key = f"{p}self_attn.{proj}.{kind}"
                    if key in out:
                        out[key] = lazy(out[key].shape, out[key], functools.partial(_unpermuted, n_head=heads),
                                        keeps=True)
    for name, t in out.items():  # llama.cpp may store the shared expert's gate as a vector
        if name.endswith("shared_expert_gate.weight") and t.ndim == 1:
            out[name] = as_row(t)
    if pending:
        raise GGUFError(f"GGUF tensors the runtime would not use: {', '.join(sorted(pending)[:5])}")
    return out
