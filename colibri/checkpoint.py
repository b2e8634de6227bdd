"""Read a Hugging Face checkpoint directory into the runtime's model description.

Every config field that changes the math is mapped from the config itself (never assumed per
architecture) or the checkpoint is refused with a message naming the field. docs/MODELS.md lists
the families and fields.
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path

import ml_dtypes
import numpy as np

from colibri import rope
from colibri.families import FAMILIES, Family
from colibri.families.base import WINDOW_RULES, ConfigContext, OwnFields, UnsupportedModel, derived_tensor, fused_expert_tensor
from colibri.format import MAX_EXPERTS, MAX_TOP_K  # the verifier's caps: they bound the router's work
from colibri.lazy import FileTensor, LazyTensor, OpenFile
from colibri.image import (EXPERT_ROLES, FLAG_NORM_TOPK, FLAG_O_BIAS, FLAG_QKV_BIAS, FLAG_SHARED_EXPERT, FLAG_ROUTER_TOPK_SOFTMAX,
                           LAYER_ROLES, MAX_LAYERS, NO_INDEX, ModelDims, Role)

DEFAULT_MAX_SEQ = 256


# Fields read by the mapping below.
HANDLED = {
    "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size",
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "num_local_experts",
    "num_experts", "num_experts_per_tok", "max_position_embeddings", "rms_norm_eps", "rope_theta",
    "rope_parameters", "rope_scaling", "tie_word_embeddings", "hidden_act", "sliding_window",
    "use_sliding_window", "layer_types", "attention_bias", "qkv_bias", "mlp_bias", "clip_qkv", "norm_topk_prob",
    "decoder_sparse_step", "mlp_only_layers", "max_window_layers", "architectures", "model_type",
    *(key for fam in FAMILIES.values() for key in (*fam.own_keys, *fam.reads)),  # the families' own
}
# Fields that do not change inference math (training-only, generation defaults, bookkeeping).
HARMLESS = {
    "transformers_version", "torch_dtype", "dtype", "use_cache", "bos_token_id", "eos_token_id", "pad_token_id",
    "initializer_range", "attention_dropout", "output_router_logits", "router_aux_loss_coef", "router_jitter_noise",
    "_name_or_path", "pretraining_tp", "tokenizer_class", "output_attentions", "output_hidden_states",
    "return_dict", "id2label", "label2id", "problem_type", "use_return_dict",
    "num_nextn_predict_layers", "num_mtp_layers", "aux_loss_alpha", "seq_aux", "ep_size",  # DeepSeek's training and MTP
    "mtp_num_hidden_layers", "mtp_use_dedicated_embeddings",  # Qwen3.5's MTP layers, which transformers does not run
    "block_mlp_init_scale", "block_out_init_scale", "block_use_xavier_init", "conv_use_xavier_init",  # LFM2's init
}


@dataclass
class Checkpoint:
    dims: ModelDims
    tensors: dict[tuple[Role, int, int], np.ndarray | LazyTensor]  # a file's are read when used (colibri/lazy.py)
    family: str
    tied_embeddings: bool
    n_params: int
    n_active_params: int
    # GGUF storage types the image has no dtype for, dequantized to f32 (exactly): type name -> tensors
    converted: dict[str, int] = field(default_factory=dict)
    towers_left_out: int = 0  # a multimodal checkpoint's vision and audio tower tensors (text in, text out)
    config: dict = field(default_factory=dict)  # what dims were read from (a GGUF file's keys as transformers')

    def dims_at(self, max_seq: int) -> ModelDims:
        """The dimensions load_checkpoint gives for an image of `max_seq` positions, from the config alone (no
        file read again): the KV cache, the RoPE tables and a sliding window follow max_seq."""
        return read_config(self.config, max_seq)[0]


def _family(cfg: dict) -> tuple[str, Family]:
    archs = cfg.get("architectures") or []
    for a in archs:
        if a in FAMILIES:
            return a, FAMILIES[a]
    raise UnsupportedModel(f"config field architectures={archs!r} is not supported; "
                           f"supported: {', '.join(FAMILIES)}")


def _n_experts(cfg: dict) -> int:
    """The routed expert count; transformers 5 writes num_local_experts where older configs say num_experts."""
    for key in ("num_local_experts", "n_routed_experts"):
        if cfg.get(key) is not None:
            return int(cfg[key])
    return int(cfg.get("num_experts") or 0)


def _moe_layers(cfg: dict, fam: Family, n_layers: int) -> tuple[bool, ...]:
    if not fam.moe:
        return (False,) * n_layers
    if fam.moe_layer_rule:
        return fam.moe_layer_rule(cfg, n_layers)
    if not fam.sparse_layer_rule:
        return (True,) * n_layers
    dense = set(cfg.get("mlp_only_layers") or [])
    step = int(cfg.get("decoder_sparse_step", 1) or 1)
    n_experts = _n_experts(cfg)
    return tuple(layer not in dense and n_experts > 0 and (layer + 1) % step == 0 for layer in range(n_layers))


def _window_layers(cfg: dict, fam: Family, n_layers: int) -> tuple[int, tuple[bool, ...]]:
    """The sliding window W and which layers have it, as transformers decides them (W 0: no window): the family's
    window rule (Family.window_rule), when its switch (use_sliding_window) is on where it has one; layer_types, where
    the config lists them and the family reads them, says it per layer."""
    window = cfg.get("sliding_window")
    use = not fam.window_switch or cfg.get("use_sliding_window", False)
    types = cfg.get("layer_types") if fam.window_layer_types else None
    if not fam.window_rule or not window or not use:
        layers = (False,) * n_layers  # (Llama and OLMoE have no window in transformers)
    elif types is not None:
        if len(types) != n_layers or set(types) - {"sliding_attention", "full_attention"}:
            raise UnsupportedModel(f"config field layer_types={types!r}: need {n_layers} entries, each "
                                   "'sliding_attention' or 'full_attention'")
        layers = tuple(t == "sliding_attention" for t in types)
    else:
        limit = cfg.get("max_window_layers", 28) if fam.window_rule in ("even_below_max", "from_max") else 0
        if not isinstance(limit, (int, float)) or isinstance(limit, bool) or limit != int(limit):
            raise UnsupportedModel(f"config field max_window_layers={limit!r} must be a whole number")
        layers = tuple(WINDOW_RULES[fam.window_rule](layer, int(limit)) for layer in range(n_layers))
    if not any(layers):
        return 0, layers
    if int(window) < 1:
        raise UnsupportedModel(f"config field sliding_window={window} must be at least 1")
    return int(window), layers


def read_config(cfg: dict, max_seq: int | None) -> tuple[ModelDims, bool, str, dict]:
    """The model description for an image of `max_seq` positions (None: 256, or the model's limit if smaller)."""
    arch, fam = _family(cfg)
    unknown = sorted(set(cfg) - HANDLED - HARMLESS)
    if unknown:
        raise UnsupportedModel(f"config field {unknown[0]} is not understood by the packer (it may change the "
                               f"math); refusing rather than ignoring it. Unknown fields: {', '.join(unknown)}")
    limit = cfg.get("max_position_embeddings")
    if max_seq is None:
        max_seq = min(DEFAULT_MAX_SEQ, limit or DEFAULT_MAX_SEQ)
    if limit is not None and max_seq > limit:
        raise UnsupportedModel(f"--max-seq {max_seq} exceeds config field max_position_embeddings={limit}")
    if cfg.get("hidden_act", "silu") != "silu":
        raise UnsupportedModel(f"config field hidden_act={cfg['hidden_act']!r} is not supported (only 'silu')")
    if cfg.get("mlp_bias"):
        raise UnsupportedModel("config field mlp_bias=true is not supported")

    for name, other in FAMILIES.items():  # a field only another family reads
        for key in [k for k in other.own_keys if k not in fam.own_keys and cfg.get(k) is not None]:
            raise UnsupportedModel(f"config field {key}={cfg[key]!r} belongs to {name}; {arch} "
                                   "does not read it in transformers, so the runtime will not either")
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    head_dim = fam.head_dim_rule(cfg) if fam.head_dim_rule else int(cfg.get("head_dim") or hidden // heads)
    if head_dim % 2:
        raise UnsupportedModel(f"config field head_dim={head_dim} is odd; rotate-half RoPE needs an even head_dim")
    n_layers = int(cfg["num_hidden_layers"])
    if n_layers > MAX_LAYERS:
        raise UnsupportedModel(f"config field num_hidden_layers={n_layers}: an image holds at most {MAX_LAYERS} layers")
    moe_layers = _moe_layers(cfg, fam, n_layers)
    any_moe, any_dense = any(moe_layers), not all(moe_layers)
    n_experts = _n_experts(cfg) if any_moe else 0
    top_k = int(cfg[fam.top_k_key]) if any_moe else 0
    own = fam.derive(cfg, ConfigContext(n_layers, head_dim, max_seq, any_moe, n_experts, top_k)) if fam.derive \
        else OwnFields({})
    fields = dict(own.fields)
    if "window_layers" in fields:  # the family's own window rule
        window, window_layers = fields.pop("sliding_window"), fields.pop("window_layers")
    else:
        window, window_layers = _window_layers(cfg, fam, n_layers)
        if window >= max_seq:  # the window never leaves anything out: plain attention, a cache of max_seq
            window, window_layers = 0, (False,) * n_layers

    flags = fam.qk_norm | own.flags | fam.flags
    bias = cfg.get(fam.bias_key, fam.bias_default) if fam.bias_key else fam.bias_default
    if bias:
        flags |= FLAG_QKV_BIAS | (FLAG_O_BIAS if fam.bias_on_o else 0)
    norm_topk = fam.norm_topk_default if fam.norm_topk_default is not None else bool(cfg.get("norm_topk_prob", False))
    if any_moe and norm_topk and not (fam.routes_itself or fam.flags & FLAG_ROUTER_TOPK_SOFTMAX):
        flags |= FLAG_NORM_TOPK
    shared_ffn = int(cfg.get("shared_expert_intermediate_size") or 0) if fam.shared_expert and any_moe else 0
    if shared_ffn:
        flags |= FLAG_SHARED_EXPERT
    clip = cfg.get("clip_qkv")
    if clip is not None and not fam.clip_qkv:
        raise UnsupportedModel(f"config field clip_qkv={clip}: {arch} does not clamp q, k, v in transformers (only "
                               "OLMoE does), so the runtime will not either; remove the field or set it to null")
    if clip is not None and not clip > 0:
        raise UnsupportedModel(f"config field clip_qkv={clip} must be positive or null")

    extra = {}
    try:
        params = (own.rope or {}).get("sliding_attention") or rope.rope_parameters(cfg, fam.default_theta)
        if fam.partial_rope:  # the family turns a head's first dims: the tables are theirs
            params = dict(params)
            fields["rope_dim"] = rope.rotated_dims(params.pop("partial_rotary_factor", 1.0), head_dim)
        inv_freq, attention_factor = rope.frequencies(params, fields.get("rope_dim", head_dim), limit)
        if own.rope:  # the global layers' tables, of their own head size
            extra["global_rope"] = rope.frequencies(own.rope["full_attention"], fields["global_head_dim"], limit)
    except (rope.UnsupportedRope, KeyError, TypeError, AttributeError) as exc:  # (a field of the wrong type)
        raise UnsupportedModel(f"config field rope_parameters/rope_scaling: {exc}") from None
    if fam.attn_scale_key:
        fields["attn_scale"] = _positive(cfg, fam.attn_scale_key)
    for _, key, _ in fam.weight_scales:
        _positive(cfg, key)

    dims = ModelDims(
        vocab_size=int(cfg["vocab_size"]), hidden_size=hidden,
        ffn_size=int(cfg[fam.expert_ffn_key]) if any_moe else 0,
        n_layers=n_layers, n_heads=heads,
        n_kv_heads=fields.pop("n_kv_heads", int(cfg.get("num_key_value_heads") or heads)),
        head_dim=head_dim, n_experts=n_experts, top_k=top_k,
        max_seq=max_seq, rms_norm_eps=float(cfg.get(fam.eps_key, fam.default_eps)),
        rope_theta=float(params["rope_theta"]),
        flags=flags, dense_ffn_size=fields.pop("dense_ffn_size", int(cfg["intermediate_size"]) if any_dense else 0),
        shared_ffn_size=fields.pop("shared_ffn_size", shared_ffn),
        clip_qkv=float(clip or 0.0), moe_layers=moe_layers, sliding_window=window, window_layers=window_layers, **fields,
    )
    if dims.n_heads % dims.n_kv_heads:
        raise UnsupportedModel(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={dims.n_kv_heads}")
    if any_moe and not 1 <= dims.top_k <= dims.n_experts:
        raise UnsupportedModel(f"config field {fam.top_k_key}={dims.top_k} must be between 1 and the expert count "
                               f"{n_experts}")
    if n_experts > MAX_EXPERTS or dims.top_k > MAX_TOP_K:
        raise UnsupportedModel(f"{n_experts} experts, top-{dims.top_k}: the runtime takes at most {MAX_EXPERTS} experts "
                               f"per layer and top-{MAX_TOP_K} (config fields num_local_experts/{fam.top_k_key})")
    if not 0.0 < dims.rms_norm_eps < 1.0:
        raise UnsupportedModel(f"config field {fam.eps_key}={dims.rms_norm_eps} must be in (0, 1)")
    extra.update(inv_freq=inv_freq, attention_factor=attention_factor)
    return dims, bool(cfg.get("tie_word_embeddings", fam.tied_default)), arch, extra


def _positive(cfg: dict, key: str) -> float:
    """A config field that must be a positive number whose f32 and its reciprocal are finite and nonzero (a scale the
    architecture multiplies or divides by, which the packer folds into f32 weights)."""
    value = cfg.get(key)
    f32 = np.finfo(np.float32)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not f32.tiny <= value <= 1 / f32.tiny:
        raise UnsupportedModel(f"config field {key}={value!r} must be a positive number between {f32.tiny:.3g} and "
                               f"{1 / f32.tiny:.3g}")
    return float(value)


def _shard_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            shards = [path / f for f in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UnsupportedModel(f"{index} does not map tensor names to shards ({type(exc).__name__}: {exc}): "
                                   f"{DOWNLOAD_AGAIN}") from None
        for shard in shards:
            if not shard.exists():
                raise UnsupportedModel(f"{shard} is missing, though {index.name} lists it: {DOWNLOAD_AGAIN}")
        return shards
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}: {DOWNLOAD_AGAIN}")
    return files


# safetensors' element types (its format specification) that numpy holds
SAFETENSORS_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": ml_dtypes.bfloat16, "I64": "<i8", "I32": "<i4",
                      "I16": "<i2", "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?",
                      "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2}
MAX_SAFETENSORS_HEADER = 100_000_000  # safetensors' own limit on the JSON header
DOWNLOAD_AGAIN = "the checkpoint is incomplete or damaged; download it again"


def read_safetensors(path: Path) -> dict[str, FileTensor]:
    """Every tensor of a safetensors file, unread: its header (a little-endian u64 length, then that many
    bytes of JSON giving each tensor's dtype, shape and data_offsets after the header) parsed once, checked
    against the file's size, so each tensor is later read by its offsets alone."""
    file = OpenFile(path)
    length = struct.unpack("<Q", file.read(8, 0))[0] if file.size >= 8 else None
    if length is None or length > min(MAX_SAFETENSORS_HEADER, file.size - 8):
        raise UnsupportedModel(f"{path}: not a safetensors file (its header length is missing or past its end): "
                               f"{DOWNLOAD_AGAIN}")
    try:
        header = json.loads(bytes(file.read(length, 8)))
    except ValueError as exc:
        raise UnsupportedModel(f"{path}: safetensors header is not JSON ({exc}): {DOWNLOAD_AGAIN}") from None
    if not isinstance(header, dict):
        raise UnsupportedModel(f"{path}: safetensors header is not a JSON object: {DOWNLOAD_AGAIN}")
    out = {}
    for name, info in header.items():
        if name != "__metadata__":
            out[name] = _safetensors_entry(file, 8 + length, name, info)
    return out


def _safetensors_entry(file: OpenFile, data_start: int, name: str, info) -> FileTensor:
    """One header entry as a tensor to read, refused unless its bytes are exactly its shape's, inside the file."""
    try:
        dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        if not all(isinstance(n, int) and n >= 0 for n in (*shape, begin, end)):
            raise ValueError
    except (KeyError, TypeError, ValueError):
        raise UnsupportedModel(f"{file.path}: safetensors header entry {name!r} is not dtype, shape, data_offsets") from None
    if dtype not in SAFETENSORS_DTYPES:
        raise UnsupportedModel(f"{file.path}: tensor {name} has dtype {dtype}; readable: {', '.join(SAFETENSORS_DTYPES)}")
    stored = np.dtype(SAFETENSORS_DTYPES[dtype])
    if not begin <= end <= file.size - data_start or end - begin != math.prod(shape) * stored.itemsize:
        raise UnsupportedModel(f"{file.path}: tensor {name}: data_offsets [{begin}, {end}] do not hold shape "
                               f"{list(shape)} of {dtype} inside the file ({file.size:,} bytes): {DOWNLOAD_AGAIN}")
    return FileTensor(file, data_start + begin, stored, shape)


def _load_tensors(path: Path) -> dict[str, FileTensor]:
    """Every tensor of the checkpoint's shards, by name, unread (each shard's header read once)."""
    out: dict[str, FileTensor] = {}
    for shard in _shard_files(path):
        out.update(read_safetensors(shard))
    return out


def hf_name(fam: Family, role: Role, layer: int, expert: int) -> str:
    """The Hugging Face tensor name of a runtime tensor in this family."""
    p, a, m = f"model.layers.{layer}.", f"model.layers.{layer}.self_attn.", f"model.layers.{layer}.{fam.moe_prefix}."
    g, u, d = fam.expert_names
    sh = f"{p}mlp.{fam.shared_prefix}."
    return {
        Role.TOKEN_EMBD: "model.embed_tokens.weight", Role.OUTPUT_NORM: "model.norm.weight",
        Role.LM_HEAD: "lm_head.weight",
        Role.ATTN_NORM: p + "input_layernorm.weight", Role.FFN_NORM: p + "post_attention_layernorm.weight",
        Role.WQ: a + "q_proj.weight", Role.BQ: a + "q_proj.bias", Role.WK: a + "k_proj.weight",
        Role.BK: a + "k_proj.bias", Role.WV: a + "v_proj.weight", Role.BV: a + "v_proj.bias",
        Role.WO: a + "o_proj.weight", Role.BO: a + "o_proj.bias",
        Role.Q_NORM: a + "q_norm.weight", Role.K_NORM: a + "k_norm.weight",
        Role.WQ_A: a + "q_a_proj.weight", Role.Q_A_NORM: a + "q_a_layernorm.weight", Role.WQ_B: a + "q_b_proj.weight",
        Role.WKV_A: a + "kv_a_proj_with_mqa.weight", Role.KV_A_NORM: a + "kv_a_layernorm.weight",
        Role.WK_B: a + "kv_b_proj.weight", Role.WV_B: a + "kv_b_proj.weight",  # split by families/deepseek.py
        Role.ROUTER_BIAS: m + fam.router_bias_name,
        Role.SINKS: a + "sinks",
        Role.DENSE_GATE: p + "mlp.gate_proj.weight", Role.DENSE_UP: p + "mlp.up_proj.weight",
        Role.DENSE_DOWN: p + "mlp.down_proj.weight",
        Role.ROUTER: m + fam.router_name,
        Role.SHARED_GATE: sh + "gate_proj.weight", Role.SHARED_UP: sh + "up_proj.weight",
        Role.SHARED_DOWN: sh + "down_proj.weight", Role.SHARED_EXPERT_GATE: p + "mlp.shared_expert_gate.weight",
        Role.EXPERT_GATE: m + f"experts.{expert}.{g}.weight", Role.EXPERT_UP: m + f"experts.{expert}.{u}.weight",
        Role.EXPERT_DOWN: m + f"experts.{expert}.{d}.weight",
    }[role]


def _scaled(t, factor: np.float32, divide: bool):
    """t times factor (divided by it with `divide`), in f32, computed when read if t is; --dtype stored quantizes it
    again to the type its file stores t in (its values are no longer the file's)."""
    return derived_tensor(t, tuple(t.shape), lambda: np.asarray(t, np.float32) / factor if divide
                          else np.asarray(t, np.float32) * factor, keeps=True)


def checkpoint_tensor(raw: dict, fam: Family, d: ModelDims, key: tuple[Role, int, int]) -> tuple[list[str], object]:
    """(the checkpoint names read, the tensor) for a runtime tensor: as the family's tensor hook finds it (a family
    that stores some otherwise: gpt-oss's fused experts, DeepSeek's kv_b_proj, Gemma 4's names), from fused
    experts, or under the common names. KeyError names a missing tensor."""
    found = fam.tensor(raw, d, key) if fam.tensor else None
    if found is not None:
        return found
    m = f"model.layers.{key[1]}.{fam.moe_prefix}."
    if fam.fused_experts and key[0] in EXPERT_ROLES and m + fam.fused_experts[0] in raw:
        return fused_expert_tensor(raw, d, m + fam.fused_experts[0], m + fam.fused_experts[1], key[0], key[2])
    name = hf_name(fam, *key)
    return [name], raw[name]


# multimodal architectures whose text model is a supported causal LM: the text model is packed, the towers left out
MULTIMODAL = {"Gemma4ForConditionalGeneration": "Gemma4ForCausalLM",
              "Qwen3_5MoeForConditionalGeneration": "Qwen3_5MoeForCausalLM"}
LANGUAGE_MODEL, TOWERS = "model.language_model.", ("model.vision_tower.", "model.embed_vision.", "model.audio_tower.",
                                                   "model.embed_audio.", "model.visual.")


def text_model(cfg: dict, raw: dict) -> tuple[dict, dict, int]:
    """A multimodal checkpoint's text model (its text_config as the causal LM's config, its language model's tensors
    under the causal LM's names) and how many vision and audio tower tensors were left out; anything else as given."""
    arch = next((a for a in cfg.get("architectures") or [] if a in MULTIMODAL), None)
    if arch is None:
        return cfg, raw, 0
    if not isinstance(cfg.get("text_config"), dict):
        raise UnsupportedModel(f"config field text_config is missing: {arch} keeps its text model's config there")
    text = {**cfg["text_config"], "architectures": [MULTIMODAL[arch]]}
    text["tie_word_embeddings"] = cfg.get("tie_word_embeddings", True)  # the multimodal model's lm_head is tied by it
    out, towers = {}, 0
    for name, t in raw.items():
        if name.startswith(TOWERS):
            towers += 1
        else:
            out["model." + name[len(LANGUAGE_MODEL):] if name.startswith(LANGUAGE_MODEL) else name] = t
    return text, out, towers


def not_a_checkpoint(path: Path) -> Exception | None:
    """What to raise for a path that is neither a GGUF file (by its magic) nor a directory with config.json, said
    before anything is read; None for one that is."""
    from colibri.inputs import is_gguf
    if (path.is_file() and is_gguf(path)) or (path / "config.json").exists():
        return None
    if path.is_file() and path.suffix.lower() == ".gguf":
        return UnsupportedModel(f"{path} is not a readable GGUF file (it does not start with GGUF's magic): it is cut "
                                "short or not GGUF at all; download or convert it again")
    return FileNotFoundError(f"{path} is neither a GGUF file nor a directory with config.json: give a Hugging Face "
                             "checkpoint directory (config.json and *.safetensors) or a llama.cpp GGUF file")


def load_checkpoint(path: Path | str, max_seq: int | None, norm_topk_prob: bool | None = None) -> Checkpoint:
    """A Hugging Face checkpoint directory or a .gguf file, mapped to the runtime's description.
    `norm_topk_prob` overrides (or supplies, for a GGUF file that lacks it) the routing renormalization."""
    from colibri.inputs import is_gguf
    path = Path(path)
    if path.is_file() and is_gguf(path):  # by its magic: SMOL.GGUF, an ollama blob without an extension
        from colibri.gguf_input import GGUFError, read_gguf
        try:
            cfg, raw, converted = read_gguf(path, norm_topk_prob)
        except GGUFError as exc:
            raise UnsupportedModel(str(exc)) from None
    elif (path / "config.json").exists():
        try:
            cfg = json.loads((path / "config.json").read_text())
        except ValueError as exc:
            raise UnsupportedModel(f"{path / 'config.json'} is not valid JSON ({exc}): fix it, or {DOWNLOAD_AGAIN}") \
                from None
        if not isinstance(cfg, dict):
            raise UnsupportedModel(f"{path / 'config.json'} is not a JSON object: fix it, or {DOWNLOAD_AGAIN}")
        if norm_topk_prob is not None:
            cfg["norm_topk_prob"] = norm_topk_prob
        raw = _load_tensors(path)
        converted = {}
    else:
        raise not_a_checkpoint(path) or AssertionError(path)
    cfg, raw, towers = text_model(cfg, raw)
    try:
        dims, tied, arch, extra = read_config(cfg, max_seq)
    except UnsupportedModel:
        raise
    except KeyError as exc:
        raise UnsupportedModel(f"{path}: the config has no {exc}, which its architecture needs") from None
    except (TypeError, ValueError, ArithmeticError) as exc:  # a field of the wrong type (null, a list), range (0 heads)
        source = path if path.is_file() else path / "config.json"
        raise UnsupportedModel(f"{source}: a config field has a value of the wrong type or range ({exc}): fix it, or "
                               f"{DOWNLOAD_AGAIN}") from None
    fam = FAMILIES[arch]
    keys = [(Role.TOKEN_EMBD, NO_INDEX, NO_INDEX), (Role.OUTPUT_NORM, NO_INDEX, NO_INDEX)]
    keys += [(r, NO_INDEX, NO_INDEX) for r in (Role.PLE_EMBD, Role.PLE_MODEL_PROJ, Role.PLE_PROJ_NORM) if dims.present(r)]
    for layer in range(dims.n_layers):
        keys += [(r, layer, NO_INDEX) for r in LAYER_ROLES if dims.present(r, layer)]
        if dims.moe_layers[layer]:
            keys += [(r, layer, e) for e in range(dims.n_experts) for r in EXPERT_ROLES]
    lm_head = (Role.LM_HEAD, NO_INDEX, NO_INDEX)
    if not tied or "lm_head.weight" in raw:
        keys.append(lm_head)
    tensors: dict[tuple[Role, int, int], np.ndarray] = {}
    used = set()
    for key in keys:
        try:
            names, tensors[key] = checkpoint_tensor(raw, fam, dims, key)
        except KeyError as exc:
            raise UnsupportedModel(f"checkpoint is missing tensor {exc.args[0]}") from None
        used.update(names)
    if lm_head not in tensors:
        tensors[lm_head] = tensors[(Role.TOKEN_EMBD, NO_INDEX, NO_INDEX)]  # same object: stored once
    for role, config_key, divide in fam.weight_scales:  # each scaled tensor a new object (tied ones part here)
        for key in [k for k in tensors if k[0] == role]:
            tensors[key] = _scaled(tensors[key], np.float32(cfg[config_key]), divide)
    tied = tied and tensors[lm_head] is tensors[(Role.TOKEN_EMBD, NO_INDEX, NO_INDEX)]  # stored once only when still one
    unused = sorted(name for name, t in raw.items()  # empty ones add nothing; those transformers ignores neither
                    if name not in used and t.size and not name.startswith(fam.ignored_prefixes))
    if unused:
        raise UnsupportedModel(f"checkpoint has tensors the runtime would ignore: {', '.join(unused[:5])}"
                               + (" ..." if len(unused) > 5 else ""))
    cos, sin = rope.tables(extra["inv_freq"], extra["attention_factor"], dims.max_seq)
    tensors[(Role.ROPE_COS, NO_INDEX, NO_INDEX)] = cos
    tensors[(Role.ROPE_SIN, NO_INDEX, NO_INDEX)] = sin
    if "global_rope" in extra:
        cos, sin = rope.tables(*extra["global_rope"], dims.max_seq)
        tensors[(Role.GLOBAL_ROPE_COS, NO_INDEX, NO_INDEX)] = cos
        tensors[(Role.GLOBAL_ROPE_SIN, NO_INDEX, NO_INDEX)] = sin
    tables = (Role.ROPE_COS, Role.ROPE_SIN, Role.GLOBAL_ROPE_COS, Role.GLOBAL_ROPE_SIN)

    weights = {id(a): a for k, a in tensors.items() if k[0] not in tables}
    n_params = sum(a.size for a in weights.values())
    idle_experts = sum(dims.n_experts - dims.top_k for moe in dims.moe_layers if moe)
    n_active = n_params - idle_experts * 3 * dims.hidden_size * dims.ffn_size
    return Checkpoint(dims, tensors, arch, tied, n_params, n_active, converted, towers, cfg)
