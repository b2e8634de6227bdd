"""Random-weight MoE images of any size, for tests and benchmarks that need a model larger than a
checkpoint written by transformers would be quick to make (docs/STREAMING.md's 4x-the-arena run,
tools/bench_experts.py). The weights mean nothing; the runtime and the numpy reference compute them
exactly as they would trained ones."""
from __future__ import annotations

import numpy as np

from colibri import image as im
from colibri.quant import DType, convert
from colibri.rope import tables


def random_image(dims: im.ModelDims, dtype: DType = DType.Q8_0, seed: int = 0, expert_align: int = 4096,
                 pinned: frozenset[tuple[int, int]] = frozenset()) -> bytes:
    """An image of `dims` with N(0, 1/in) matrices in `dtype` (routers stay f32), norms near 1."""
    rng = np.random.default_rng(seed)
    tensors: dict = {}
    for role, layer, expert in im.canonical_order(dims):
        if dims.present(role, layer):
            shape = im.expected_shape(dims, role, layer)
            if role in (im.Role.ROPE_COS, im.Role.ROPE_SIN):
                continue
            if len(shape) == 1:
                tensors[(role, layer, expert)] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
            else:
                t = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
                keep_f32 = role in (im.Role.ROUTER, im.Role.SHARED_EXPERT_GATE, *im.F32_TABLES)
                tensors[(role, layer, expert)] = t if keep_f32 else convert(t, dtype)
    inv = 1.0 / (dims.rope_theta ** (np.arange(0, dims.rope_width, 2) / dims.rope_width))
    cos, sin = tables(inv, 1.0, dims.max_seq)
    tensors[(im.Role.ROPE_COS, im.NO_INDEX, im.NO_INDEX)] = cos
    tensors[(im.Role.ROPE_SIN, im.NO_INDEX, im.NO_INDEX)] = sin
    return im.build_image(dims, tensors, expert_align=expert_align, pinned=pinned)


def moe_dims(hidden: int, ffn: int, experts: int, layers: int, top_k: int = 2, vocab: int = 64,
             max_seq: int = 32) -> im.ModelDims:
    """A Mixtral-shaped model: 4 heads (2 kv) of hidden/4, every layer routed."""
    return im.ModelDims(vocab_size=vocab, hidden_size=hidden, ffn_size=ffn, n_layers=layers, n_heads=4, n_kv_heads=2,
                        head_dim=hidden // 4, n_experts=experts, top_k=top_k, max_seq=max_seq, rms_norm_eps=1e-5,
                        rope_theta=10000.0, moe_layers=(True,) * layers)
