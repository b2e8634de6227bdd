"""RoPE frequencies for the image's cos/sin tables, following transformers' rope types.

The runtime never computes a transcendental for RoPE: the host writes cos(pos * f_i) * s and
sin(pos * f_i) * s for every position and frequency, where the rope type decides the
frequencies f_i and the attention factor s. Supported: default, linear, llama3, yarn, and Gemma 4's
proportional (the first partial_rotary_factor of the frequencies, the rest 0: those dims are not
rotated). Anything else (dynamic NTK, longrope, partial rotary elsewhere) is refused by name.
"""
from __future__ import annotations

import math

import numpy as np

SUPPORTED = ("default", "linear", "llama3", "yarn", "proportional")


class UnsupportedRope(ValueError):
    pass


def _base_inv_freq(theta: float, head_dim: int) -> np.ndarray:
    return 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))


def _llama3(inv: np.ndarray, p: dict) -> np.ndarray:
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old_len = p["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > old_len / low, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
    return np.where(medium, smoothed, scaled)


def _mscale(scale: float, m: float = 1.0) -> float:
    """YaRN's magnitude scale (transformers' get_mscale / yarn_get_mscale)."""
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def deepseek_mscale(params: dict) -> float:
    """The factor DeepSeek's attention multiplies its softmax scale by twice (transformers' yarn_apply_mscale):
    mscale(factor, mscale_all_dim) for any non-default rope type that sets mscale_all_dim, else 1."""
    if params.get("rope_type", "default") != "default" and params.get("mscale_all_dim"):
        return _mscale(params["factor"], params["mscale_all_dim"])
    return 1.0


def _yarn(theta: float, head_dim: int, p: dict, max_pos: int | None) -> tuple[np.ndarray, float]:
    factor = p.get("factor")
    orig = p["original_max_position_embeddings"]
    if factor is None:
        factor = max_pos / orig

    attention = p.get("attention_factor")
    if attention is None:
        if p.get("mscale") and p.get("mscale_all_dim"):
            attention = _mscale(factor, p["mscale"]) / _mscale(factor, p["mscale_all_dim"])
        else:
            attention = _mscale(factor)
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    pos_freqs = theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    extrapolation = 1 - ramp
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv, float(attention)


def rope_parameters(cfg: dict, default_theta: float = 10000.0) -> dict:
    """The rope settings of an HF config, from `rope_parameters` (transformers 5) or `rope_scaling` (4); the base
    `default_theta` (its configuration class's) where the config states none."""
    params = dict(cfg.get("rope_parameters") or {})
    scaling = dict(cfg.get("rope_scaling") or {})
    if "type" in scaling:  # transformers 4 spelling
        scaling.setdefault("rope_type", scaling.pop("type"))
    params.update(scaling)  # an explicit rope_scaling is never silently overridden
    params.setdefault("rope_theta", cfg.get("rope_theta", default_theta))
    params.setdefault("rope_type", "default")
    return params


def rotated_dims(factor, head_dim: int) -> int:
    """int(head_dim · partial_rotary_factor), as transformers' default RoPE takes it: even and at least 2."""
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 0 < factor <= 1:
        raise UnsupportedRope(f"partial_rotary_factor={factor!r}: a fraction of the head in (0, 1]")
    dims = int(head_dim * factor)
    if dims < 2 or dims % 2:
        raise UnsupportedRope(f"partial_rotary_factor={factor} of head_dim {head_dim} turns {dims} dims: an even count "
                              "of at least 2 is needed")
    return dims


def frequencies(params: dict, head_dim: int, max_position_embeddings: int | None) -> tuple[np.ndarray, float]:
    """(inv_freq [head_dim/2] float64, attention factor) for these rope parameters."""
    kind, theta = params["rope_type"], float(params["rope_theta"])
    if kind not in SUPPORTED:
        raise UnsupportedRope(f"rope type {kind!r} is not supported (supported: {', '.join(SUPPORTED)})")
    if kind == "proportional":  # transformers' _compute_proportional_rope_parameters
        angles = int(params.get("partial_rotary_factor", 1.0) * head_dim // 2)
        inv = np.zeros(head_dim // 2)
        inv[:angles] = 1.0 / (theta ** (np.arange(0, 2 * angles, 2, dtype=np.float64) / head_dim))
        return inv / params.get("factor", 1.0), 1.0
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise UnsupportedRope(f"partial_rotary_factor={params['partial_rotary_factor']} is not supported")
    inv = _base_inv_freq(theta, head_dim)
    if kind == "linear":
        return inv / params["factor"], 1.0
    if kind == "llama3":
        return _llama3(inv, params), 1.0
    if kind == "yarn":
        return _yarn(theta, head_dim, params, max_position_embeddings)
    return inv, 1.0


def tables(inv_freq: np.ndarray, attention_factor: float, max_seq: int) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [max_seq, head_dim/2] as float32, computed in float64."""
    angles = np.arange(max_seq, dtype=np.float64)[:, None] * inv_freq[None, :]
    return ((np.cos(angles) * attention_factor).astype(np.float32),
            (np.sin(angles) * attention_factor).astype(np.float32))
