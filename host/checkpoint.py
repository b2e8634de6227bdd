"""Read a Hugging Face checkpoint directory into the runtime's model description.

Only what the runtime computes exactly is accepted: every config field that changes the math is
either mapped or the checkpoint is refused with a message naming the field.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy so safetensors can return bf16 tensors)
import numpy as np
from safetensors import safe_open

from host.image import FLAG_NORM_TOPK, NO_INDEX, ModelDims, Role

SUPPORTED_ARCHITECTURES = ("MixtralForCausalLM",)


class UnsupportedModel(ValueError):
    """The checkpoint asks for something the runtime would not compute exactly."""


@dataclass
class Checkpoint:
    dims: ModelDims
    tensors: dict[tuple[Role, int, int], np.ndarray]
    tied_embeddings: bool
    n_params: int
    n_active_params: int


def _rope_theta(cfg: dict) -> float:
    """rope_theta from either transformers 4 (`rope_theta` + `rope_scaling`) or 5 (`rope_parameters`)."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling")
    for name, spec in (("rope_parameters", params), ("rope_scaling", scaling or {})):
        kind = spec.get("rope_type", spec.get("type", "default"))
        if kind != "default":
            raise UnsupportedModel(f"config field {name}.rope_type={kind!r} is not supported (only plain RoPE)")
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    return float(theta)


DEFAULT_MAX_SEQ = 256


def read_config(path: Path, max_seq: int | None) -> tuple[ModelDims, bool]:
    """The model description for an image of `max_seq` positions (None: 256 or the model's limit if smaller)."""
    cfg = json.loads((path / "config.json").read_text())
    if max_seq is None:
        max_seq = min(DEFAULT_MAX_SEQ, cfg.get("max_position_embeddings") or DEFAULT_MAX_SEQ)
    archs = cfg.get("architectures") or []
    if not any(a in SUPPORTED_ARCHITECTURES for a in archs) and cfg.get("model_type") != "mixtral":
        raise UnsupportedModel(f"config field architectures={archs!r} is not supported; "
                               f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    if cfg.get("hidden_act", "silu") != "silu":
        raise UnsupportedModel(f"config field hidden_act={cfg['hidden_act']!r} is not supported (only 'silu')")
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise UnsupportedModel("config field attention_bias/mlp_bias=true is not supported by MixtralForCausalLM packing")
    window = cfg.get("sliding_window")
    if window is not None and window < max_seq:
        raise UnsupportedModel(f"config field sliding_window={window} is smaller than --max-seq {max_seq}; "
                               "sliding-window attention is not implemented (use --max-seq <= sliding_window)")
    limit = cfg.get("max_position_embeddings")
    if limit is not None and max_seq > limit:
        raise UnsupportedModel(f"--max-seq {max_seq} exceeds config field max_position_embeddings={limit}")
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim") or hidden // heads
    if head_dim % 2:
        raise UnsupportedModel(f"config field head_dim={head_dim} is odd; rotate-half RoPE needs an even head_dim")
    dims = ModelDims(
        vocab_size=int(cfg["vocab_size"]), hidden_size=hidden, ffn_size=int(cfg["intermediate_size"]),
        n_layers=int(cfg["num_hidden_layers"]), n_heads=heads,
        n_kv_heads=int(cfg.get("num_key_value_heads") or heads), head_dim=int(head_dim),
        n_experts=int(cfg["num_local_experts"]), top_k=int(cfg["num_experts_per_tok"]),
        max_seq=max_seq, rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)), rope_theta=_rope_theta(cfg),
        flags=FLAG_NORM_TOPK,  # Mixtral always renormalizes its top-k weights
    )
    if dims.n_heads % dims.n_kv_heads:
        raise UnsupportedModel(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={dims.n_kv_heads}")
    if not 1 <= dims.top_k <= dims.n_experts:
        raise UnsupportedModel(f"num_experts_per_tok={dims.top_k} must be between 1 and num_local_experts={dims.n_experts}")
    return dims, bool(cfg.get("tie_word_embeddings", False))


def _shard_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [path / f for f in sorted(set(weight_map.values()))]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}")
    return files


def _load_tensors(path: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for shard in _shard_files(path):
        with safe_open(str(shard), framework="np") as f:
            for name in f.keys():
                out[name] = f.get_tensor(name).astype(np.float32)
    return out


def _hf_name(role: Role, layer: int, expert: int) -> str:
    p = f"model.layers.{layer}."
    return {
        Role.TOKEN_EMBD: "model.embed_tokens.weight",
        Role.ATTN_NORM: p + "input_layernorm.weight",
        Role.WQ: p + "self_attn.q_proj.weight",
        Role.WK: p + "self_attn.k_proj.weight",
        Role.WV: p + "self_attn.v_proj.weight",
        Role.WO: p + "self_attn.o_proj.weight",
        Role.FFN_NORM: p + "post_attention_layernorm.weight",
        Role.ROUTER: p + "block_sparse_moe.gate.weight",
        Role.EXPERT_GATE: p + f"block_sparse_moe.experts.{expert}.w1.weight",
        Role.EXPERT_DOWN: p + f"block_sparse_moe.experts.{expert}.w2.weight",
        Role.EXPERT_UP: p + f"block_sparse_moe.experts.{expert}.w3.weight",
        Role.OUTPUT_NORM: "model.norm.weight",
        Role.LM_HEAD: "lm_head.weight",
    }[role]


def load_checkpoint(path: Path | str, max_seq: int | None) -> Checkpoint:
    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} has no config.json: pass a Hugging Face checkpoint directory")
    dims, tied = read_config(path, max_seq)
    raw = _load_tensors(path)
    tensors: dict[tuple[Role, int, int], np.ndarray] = {}
    keys = [(Role.TOKEN_EMBD, NO_INDEX, NO_INDEX), (Role.OUTPUT_NORM, NO_INDEX, NO_INDEX)]
    for layer in range(dims.n_layers):
        keys += [(r, layer, NO_INDEX) for r in (Role.ATTN_NORM, Role.WQ, Role.WK, Role.WV, Role.WO,
                                                Role.FFN_NORM, Role.ROUTER)]
        keys += [(r, layer, e) for e in range(dims.n_experts)
                 for r in (Role.EXPERT_GATE, Role.EXPERT_UP, Role.EXPERT_DOWN)]
    lm_head = (Role.LM_HEAD, NO_INDEX, NO_INDEX)
    if not tied or "lm_head.weight" in raw:
        keys.append(lm_head)
    used = set()
    for key in keys:
        name = _hf_name(*key)
        if name not in raw:
            raise UnsupportedModel(f"checkpoint is missing tensor {name}")
        tensors[key] = raw[name]
        used.add(name)
    if lm_head not in tensors:
        tensors[lm_head] = tensors[(Role.TOKEN_EMBD, NO_INDEX, NO_INDEX)]  # same object: stored once
    unused = sorted(set(raw) - used)
    if unused:
        raise UnsupportedModel(f"checkpoint has tensors the runtime would ignore: {', '.join(unused[:5])}"
                               + (" ..." if len(unused) > 5 else ""))
    n_params = sum(a.size for a in {id(a): a for a in tensors.values()}.values())
    expert_params = 3 * dims.hidden_size * dims.ffn_size
    n_active = n_params - dims.n_layers * (dims.n_experts - dims.top_k) * expert_params
    return Checkpoint(dims, tensors, tied, n_params, n_active)
