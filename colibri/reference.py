"""The numpy reference: runs a model from its Colibri image and computes what the runtime computes, bit for
bit, so `flash.py --verify` can compare the device's logits exactly.

It is written from docs/KERNELS.md and docs/MODELS.md, not from the C: every value is rounded where the
runtime rounds it, in the order the runtime adds (colibri/arith.py: the dot products' lanes and trees,
sequential sums from +0, the runtime's own exponential, activation quantization), and every step of the
forward pass follows firmware/src/model.c's order: RMSNorm, q/k/v with optional biases, q/k norms (per
head or across the projection), v norm, clipping, RoPE from the image's tables, the KV cache's rounding to
f16, attention over every earlier position (or a window of them, or an earlier layer's cache), the
output projection; then a dense SwiGLU MLP or a MoE block (softmax or sigmoid scores, choice biases,
groups, top-k picked best first with ties to the lower index, renormalized and scaled weights, each
expert's output added in rank order, then the shared expert), the final norm and the output matrix.
DeepSeek's latent attention runs in the runtime's absorbed form; gpt-oss adds sinks, a softmax over the
top-k, expert biases and its clamped SwiGLU; Gemma 4 its layer (norms after attention and the FFN, the
dense MLP beside the experts, per-layer inputs, a scalar per layer), GeGLU, v norms, keys as values, its
global layers' head size and RoPE, the embedding scale and logit soft-capping.

Each token's values do not depend on the tokens computed beside it (the runtime's prefill batches give
the bits of one token a pass), so the reference computes every position of a sequence at once.

`exact=False` (the pack report's quality pass, which compares two references and needs no bits) computes
the matrix products with BLAS instead: much faster, and within float rounding of the exact ones.
"""
from __future__ import annotations

import dataclasses
import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

from colibri import arith
from colibri.arith import F32, ONE, ZERO
from colibri.image import (KV_DTYPES, LAYER_ACT_GELU_TANH, LAYER_OPT_ATTN_GATE, LAYER_FFN_MOE_AND_DENSE, LAYER_OPT_ATTN_SINKS,
                           LAYER_OPT_EXPERT_BIAS, LAYER_OPT_GLOBAL_ROPE, LAYER_OPT_LAYER_SCALE, LAYER_OPT_NORM_TOPK,
                           LAYER_OPT_POST_ATTN_NORM, LAYER_OPT_POST_FFN_NORM, LAYER_OPT_ROPE_PAIRS,
                           LAYER_OPT_ROUTER_BIAS, LAYER_OPT_V_NORM, LAYER_QK_NORM_FULL, LAYER_QK_NORM_NONE,
                           LAYER_ROUTER_SIGMOID, LAYER_ROUTER_TOPK_SOFTMAX, LAYER_SHARED_GATED, LAYER_SHARED_PLAIN,
                           NO_INDEX, Image, ModelDims, Role)
from colibri.quant import Encoded, quantized_matmul


# Multiply-adds per block of rows in an exact matrix product (counted for at least 16 inputs: a block's lane
# layout holds its rows whatever the inputs): big enough that numpy's per-call cost is small against the work
# of a call, small enough that a block's temporaries stay a few MB
BLOCK_WORK = 1 << 24
_pool: ThreadPoolExecutor | None = None


def by_row_blocks(part: Callable[[int, int], np.ndarray], rows: int, work_per_row: int,
                  threads: bool = False) -> np.ndarray:
    """part(r0, r1) ([n, r1 - r0]) over rows [0, rows) in blocks of about BLOCK_WORK, concatenated: [n, rows].
    Each row's value does not depend on the block it is in, so with `threads` the blocks (at least one per core
    once there is a quarter block of work) run on every core: numpy lets go of the interpreter inside its
    loops, which pays when each call is long (the float products' are; the quantized ones' are not)."""
    global _pool
    work, cores = rows * work_per_row, (os.cpu_count() or 1) if threads else 1
    blocks = max(1, min(rows, max(-(-work // BLOCK_WORK), cores if work >= BLOCK_WORK // 4 else 1)))
    step = -(-rows // blocks)
    if step >= rows:
        return part(0, rows)
    starts = range(0, rows, step)
    if cores == 1:
        return np.concatenate([part(r0, min(rows, r0 + step)) for r0 in starts], axis=1)
    if _pool is None:
        _pool = ThreadPoolExecutor(cores, thread_name_prefix="reference")
    return np.concatenate(list(_pool.map(lambda r0: part(r0, min(rows, r0 + step)), starts)), axis=1)


class Matrix:
    """A weight matrix [rows, cols] as stored in the image (float or quantized), and its product with inputs as
    the runtime's kernels compute it (`exact`) or as BLAS does."""

    def __init__(self, enc: Encoded, exact: bool):
        self.enc, self.exact = enc, exact
        self.rows, self.cols = enc.shape
        self._decoded: np.ndarray | None = None  # exact=False, float: the f32 matrix, decoded once

    def rows_of(self, r0: int, r1: int) -> "Matrix":
        """Rows [r0, r1) as a matrix of their own (one head's part of a per-head projection)."""
        return Matrix(self.enc.rows(slice(r0, r1)), self.exact)

    def times(self, x: np.ndarray) -> np.ndarray:
        """Each row of x [n, cols] through the matrix: [n, rows]."""
        x = np.ascontiguousarray(x, dtype=F32)
        enc, n = self.enc, x.shape[0]
        if not self.exact:
            if enc.dtype.quantized:
                return quantized_matmul(x, enc)
            if self._decoded is None:
                self._decoded = enc.decode()
            return (x @ self._decoded.T).astype(F32)
        if enc.dtype.quantized:
            xq, xd = arith.quantize_q8_0(x)
            return by_row_blocks(lambda r0, r1: arith.quantized_dot(xq, xd, *enc.rows(slice(r0, r1)).block_terms()),
                                 self.rows, max(n, 16) * self.cols)
        return by_row_blocks(lambda r0, r1: arith.float_dot(x, enc.values[r0:r1]), self.rows, max(n, 16) * self.cols,
                             True)


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, pairs: bool = False) -> np.ndarray:
    """RoPE on x [seq, heads, dim] with cos/sin [seq, dim/2] as the runtime rotates: element i with i + dim/2,
    or with `pairs` 2i with 2i + 1 (DeepSeek's layout): (a, b) -> (a cos - b sin, b cos + a sin)."""
    c, s = cos[:, None, :], sin[:, None, :]
    out = np.empty_like(x)
    if pairs:
        a, b = x[..., 0::2], x[..., 1::2]
        out[..., 0::2], out[..., 1::2] = a * c - b * s, b * c + a * s
        return out
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    out[..., :half], out[..., half:] = a * c - b * s, b * c + a * s
    return out


def clamped_glu(g: np.ndarray, u: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    """gpt-oss's expert activation: gate clamped above, up to +-limit, (up + 1) * (gate * sigmoid(alpha gate))."""
    lim = F32(limit)
    g, u = np.minimum(g, lim), np.clip(u, -lim, lim)
    return (u + ONE) * (g / (ONE + arith.expf(-(F32(alpha) * g))))


def experts_problem(d: ModelDims, experts: int) -> str | None:
    """Why `experts` routed experts a token cannot replace the image's top_k, in one line (None: it can). The
    device refuses the same with COLIBRI_E_BAD_ARG (colibri_options.experts)."""
    if not d.n_experts:
        return f"--experts {experts}: this image has no routed experts (a dense model)"
    if not 1 <= experts <= d.top_k:
        return (f"--experts {experts} is outside 1 to {d.top_k}: the image routes each token to its top-{d.top_k} "
                f"experts, and --experts takes that many or fewer")
    return None


class Reference:
    def __init__(self, image: Image, keep_weights: bool = True, exact: bool = True, experts: int | None = None):
        """`keep_weights` False: only the matrix in use is held (a model larger than memory, read from a file a
        tensor at a time: colibri/pack.py), at the cost of reading it again in each forward pass. `exact` False:
        BLAS matrix products (see the module's docstring). `experts`: each token routed to that many experts
        instead of the image's top_k, as colibri_options.experts routes the device's (route())."""
        if exact and not arith.subnormals_kept():
            raise RuntimeError("this process flushes subnormal floats to zero (a library built with -ffast-math?), "
                               "so the reference cannot compute the device's bits: run it in a process without it")
        self.img = image
        self.keep_weights = keep_weights
        self.exact = exact
        self.d = image.dims
        if experts is not None:
            if problem := experts_problem(self.d, experts):
                raise ValueError(problem)
            self.d = dataclasses.replace(self.d, top_k=experts)
        self.routes: dict[int, tuple[np.ndarray, np.ndarray]] | None = None  # layer -> (experts, weights) per position
        self.residuals: dict[int, tuple[np.ndarray, np.ndarray]] | None = None  # layer -> x after attention, after it
        self._matrices: dict[tuple[Role, int, int], Matrix] = {}
        self._vectors: dict[tuple[Role, int, int], np.ndarray] = {}
        self._kv: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}  # a forward pass's cached k, v per layer

    # ---- the image's tensors ----

    def _t(self, role: Role, layer: int = NO_INDEX, expert: int = NO_INDEX) -> np.ndarray:
        """An f32 tensor (norm weights, biases, tables), or any tensor decoded to f32."""
        key = (role, layer, expert)
        if key not in self._vectors:
            if not self.keep_weights:
                return self.img.tensor(role, layer, expert).astype(F32)
            self._vectors[key] = self.img.tensor(role, layer, expert).astype(F32)
        return self._vectors[key]

    def _rows(self, role: Role, index: np.ndarray) -> np.ndarray:
        """Rows `index` of a table decoded to f32 (an embedding lookup), without decoding the others."""
        return self.img.encoded(role).rows(index).decode()

    def matrix(self, role: Role, layer: int = NO_INDEX, expert: int = NO_INDEX) -> Matrix:
        key = (role, layer, expert)
        if key not in self._matrices:
            if not self.keep_weights:
                self._matrices.clear()
            self._matrices[key] = Matrix(self.img.encoded(role, layer, expert), self.exact)
        return self._matrices[key]

    def linear(self, x: np.ndarray, role: Role, layer: int = NO_INDEX, expert: int = NO_INDEX) -> np.ndarray:
        """x [n, cols] through the image's matrix: [n, rows]."""
        return self.matrix(role, layer, expert).times(x)

    def _proj(self, x: np.ndarray, w: Role, b: Role, layer: int) -> np.ndarray:
        """A projection and, when the image has it, its bias added."""
        y = self.linear(x, w, layer)
        return y + self._t(b, layer) if self.d.present(b, layer) else y

    def per_head(self, x: np.ndarray, role: Role, layer: int) -> np.ndarray:
        """x [n, H, cols] through a per-head projection (head h owns the h-th H-th of the matrix's rows, and its
        input is quantized on its own): [n, H, rows]."""
        m, H = self.matrix(role, layer), self.d.n_heads
        rows = m.rows // H
        return np.stack([m.rows_of(h * rows, (h + 1) * rows).times(x[:, h]) for h in range(H)], axis=1)

    def norm(self, x: np.ndarray, role: Role, layer: int = NO_INDEX) -> np.ndarray:
        return arith.rmsnorm(x, self._t(role, layer), self.d.rms_norm_eps)

    # ---- attention ----

    def _cache(self, t: np.ndarray) -> np.ndarray:
        """What the KV cache gives back: t, or t rounded to f16 (to nearest even) with an f16 cache."""
        return t.astype(np.float16).astype(F32) if self.d.kv_dtype == KV_DTYPES["f16"] else t

    def _seen(self, n: int, layer: int) -> np.ndarray:
        """[query, key]: query i sees key j <= i, and in a windowed layer only j > i - W."""
        i, j = np.arange(n)[:, None], np.arange(n)[None, :]
        seen = j <= i
        if self.d.windowed(layer):
            seen &= j > i - self.d.layers[layer].window
        return seen

    def attend(self, q: np.ndarray, keys: np.ndarray, values: np.ndarray, seen: np.ndarray,
               sinks: np.ndarray | None) -> np.ndarray:
        """Every head's attention as heads_part computes it: q [n, H, kd], keys [n, KVH, kd] and values
        [n, KVH, vd] as the cache holds them (head h reads KV head h / (H / KVH)), seen [n, n]. Scores are
        the keys' dot products with q times the scale, then the softmax over the positions seen (with the
        head's sink), and the values summed oldest first, each times its weight. [n, H, vd]."""
        n, H, _ = q.shape
        group = H // keys.shape[1]
        k = np.repeat(keys, group, axis=1).transpose(1, 0, 2)     # [H, n_keys, kd]
        v = np.repeat(values, group, axis=1).transpose(1, 0, 2)   # [H, n_keys, vd]
        # each head's dot products with its keys as dot_f32 computes them: the cached key the weights, q the input
        scores = np.stack([arith.float_dot(q[:, h], k[h]) for h in range(H)])  # [H, n_q, n_keys]
        scores = scores * F32(self.d.scale)
        probs = arith.softmax(scores, sinks[:, None] if sinks is not None else None, seen[None])
        out = np.zeros((H, n, v.shape[-1]), F32)
        with np.errstate(invalid="ignore"):
            for j in range(n):  # oldest first; a position not seen adds nothing (not even 0 times a NaN)
                term = probs[:, :, j, None] * v[:, None, j, :]
                out += np.where(seen[None, :, j, None], term, ZERO)
        return out.transpose(1, 0, 2)

    def _rope_tables(self, layer: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        d = self.d
        global_rope = d.layers[layer].options & LAYER_OPT_GLOBAL_ROPE
        cos = self._t(Role.GLOBAL_ROPE_COS if global_rope else Role.ROPE_COS)[:n]
        sin = self._t(Role.GLOBAL_ROPE_SIN if global_rope else Role.ROPE_SIN)[:n]
        return cos, sin

    def mla(self, xn: np.ndarray, layer: int) -> np.ndarray:
        """Multi-head latent attention in the runtime's absorbed form (attention_mla): the output projection's
        input [n, H * v_head_dim]."""
        d = self.d
        n, H, hd, lat = xn.shape[0], d.n_heads, d.head_dim, d.kv_lora_rank
        kind = d.layers[layer]
        nope, pairs = hd - d.rope_width, bool(kind.options & LAYER_OPT_ROPE_PAIRS)
        if d.q_lora_rank:
            q = self.linear(self.norm(self.linear(xn, Role.WQ_A, layer), Role.Q_A_NORM, layer), Role.WQ_B, layer)
        else:
            q = self.linear(xn, Role.WQ, layer)
        kv = self.linear(xn, Role.WKV_A, layer)
        latent = self.norm(kv[:, :lat], Role.KV_A_NORM, layer)
        cos, sin = self._rope_tables(layer, n)
        q = q.reshape(n, H, hd)
        q_att = np.concatenate([self.per_head(q[..., :nope], Role.WK_B, layer),
                                rope(q[..., nope:], cos, sin, pairs)], axis=-1)           # [n, H, lat + rope]
        key = self._cache(np.concatenate([latent, rope(kv[:, None, lat:], cos, sin, pairs)[:, 0]], axis=-1))
        sinks = self._t(Role.SINKS, layer) if kind.options & LAYER_OPT_ATTN_SINKS else None
        summed = self.attend(q_att, key[:, None], key[:, None, :lat], self._seen(n, layer), sinks)  # [n, H, lat]
        return self.per_head(summed, Role.WV_B, layer).reshape(n, d.o_dim)

    def mha(self, xn: np.ndarray, layer: int) -> np.ndarray:
        """Standard attention (attention_mha): the output projection's input [n, H * head size]."""
        d = self.d
        n, hd, kv_heads, kind = xn.shape[0], d.layer_head_dim(layer), d.layer_kv_heads(layer), d.layers[layer]
        qk_norm = kind.qk_norm != LAYER_QK_NORM_NONE
        pairs = bool(kind.options & LAYER_OPT_ROPE_PAIRS)
        cos, sin = self._rope_tables(layer, n)

        def normed(t: np.ndarray, role: Role, heads: int) -> np.ndarray:  # q/k norm: the whole row, or each head
            if kind.qk_norm == LAYER_QK_NORM_FULL:
                return self.norm(t.reshape(n, -1), role, layer).reshape(n, heads, hd)
            return self.norm(t, role, layer)

        q = self._proj(xn, Role.WQ, Role.BQ, layer).reshape(n, d.n_heads, hd)
        if qk_norm:
            q = normed(q, Role.Q_NORM, d.n_heads)
        if d.clip_qkv:
            q = np.clip(q, -F32(d.clip_qkv), F32(d.clip_qkv))
        rotated = 2 * cos.shape[-1]  # a head's first dims RoPE turns: all, or Qwen3.5's part

        def turned(t: np.ndarray) -> np.ndarray:
            return np.concatenate([rope(t[..., :rotated], cos, sin, pairs), t[..., rotated:]], axis=-1)
        q = turned(q)
        if d.kv_shared(layer):  # Gemma 4's KV sharing: its source layer's cache
            k, v = self._kv[d.kv_source(layer)]
        else:
            k = self._proj(xn, Role.WK, Role.BK, layer)
            v = k if not d.present(Role.WV, layer) else self._proj(xn, Role.WV, Role.BV, layer)  # keys as values
            k, v = k.reshape(n, kv_heads, hd), v.reshape(n, kv_heads, hd)
            if qk_norm:
                k = normed(k, Role.K_NORM, kv_heads)
            if kind.options & LAYER_OPT_V_NORM:
                v = arith.rmsnorm(v, None, d.rms_norm_eps)
            if d.clip_qkv:
                k, v = (np.clip(t, -F32(d.clip_qkv), F32(d.clip_qkv)) for t in (k, v))
            k, v = self._cache(turned(k)), self._cache(v)
            self._kv[layer] = (k, v)
        sinks = self._t(Role.SINKS, layer) if kind.options & LAYER_OPT_ATTN_SINKS else None
        out = self.attend(q, k, v, self._seen(n, layer), sinks).reshape(n, d.n_heads * hd)
        if kind.options & LAYER_OPT_ATTN_GATE:  # Qwen3.5's gate on each head's output
            out = out * arith.sigmoid(self.linear(xn, Role.WQ_GATE, layer))
        return out

    def short_conv(self, xn: np.ndarray, layer: int) -> np.ndarray:
        """LFM2's gated short convolution (blocks/conv.c): b, c, x = CONV_IN xn; u = b * x; each channel's
        y = c * sum_j CONV_KERNEL[:, j] * u(p - K + 1 + j), summed from +0 in j's order (u before position 0 is 0);
        CONV_OUT y."""
        D, K = self.d.hidden_size, self.d.conv_kernel
        bcx = self.linear(xn, Role.CONV_IN, layer)
        b, c, x = bcx[:, :D], bcx[:, D:2 * D], bcx[:, 2 * D:]
        u = np.concatenate([np.zeros((K - 1, D), F32), b * x])  # K - 1 zero positions before the first
        w = self._t(Role.CONV_KERNEL, layer)
        n = xn.shape[0]
        y = np.zeros((n, D), F32)
        for j in range(K):
            y = y + w[:, j] * u[j:j + n]
        return self.linear(c * y, Role.CONV_OUT, layer)

    def delta_net(self, xn: np.ndarray, layer: int) -> np.ndarray:
        """Qwen3.5's Gated DeltaNet (blocks/deltanet.c), one token after another: the convolved and SiLU'd q, k, v;
        q, k L2-normed per key head, q divided by sqrt(dk); each value head's state decayed by
        exp(DN_DECAY softplus(a + DN_DT_BIAS)) and updated by the delta rule with sigmoid(b); its output normed,
        times silu(z); DN_OUT of it. Sums over the key dim in order from +0."""
        d, n = self.d, xn.shape[0]
        Hk, Hv, dk, dv, K, C = d.dn_k_heads, d.dn_v_heads, d.dn_k_dim, d.dn_v_dim, d.conv_kernel, d.dn_conv
        qkv, z = self.linear(xn, Role.DN_QKV, layer), self.linear(xn, Role.DN_Z, layer).reshape(n, Hv, dv)
        b, a = self.linear(xn, Role.DN_B, layer), self.linear(xn, Role.DN_A, layer)
        w = self._t(Role.DN_CONV, layer)
        u = np.concatenate([np.zeros((K - 1, C), F32), qkv])  # K - 1 zero positions before the first
        y = np.zeros((n, C), F32)
        for j in range(K):
            y = y + w[:, j] * u[j:j + n]
        x = arith.silu(y)

        def l2normed(t: np.ndarray) -> np.ndarray:
            return t * (ONE / np.sqrt(arith.seq_sum(t * t) + F32(1e-6)))[..., None]
        q = l2normed(x[:, :Hk * dk].reshape(n, Hk, dk)) / np.sqrt(F32(dk))
        k = l2normed(x[:, Hk * dk:2 * Hk * dk].reshape(n, Hk, dk))
        q, k = np.repeat(q, Hv // Hk, axis=1), np.repeat(k, Hv // Hk, axis=1)  # value head h: key head h / (Hv/Hk)
        v = x[:, 2 * Hk * dk:].reshape(n, Hv, dv)
        beta = arith.sigmoid(b)
        decay = arith.expf(self._t(Role.DN_DECAY, layer) * arith.softplus(a + self._t(Role.DN_DT_BIAS, layer)))
        S, out = np.zeros((Hv, dk, dv), F32), np.zeros((n, Hv, dv), F32)
        for t in range(n):
            S = S * decay[t][:, None, None]
            mem = np.zeros((Hv, dv), F32)
            for i in range(dk):
                mem = mem + S[:, i, :] * k[t][:, i, None]
            delta = (v[t] - mem) * beta[t][:, None]
            S = S + k[t][:, :, None] * delta[:, None, :]
            o = np.zeros((Hv, dv), F32)
            for i in range(dk):
                o = o + S[:, i, :] * q[t][:, i, None]
            out[t] = o
        out = arith.rmsnorm(out, self._t(Role.DN_NORM, layer), d.rms_norm_eps) * arith.silu(z)
        return self.linear(out.reshape(n, Hv * dv), Role.DN_OUT, layer)

    def attention(self, x: np.ndarray, layer: int) -> np.ndarray:
        """What the attention half adds to x: Wo attention(rmsnorm(x)) (+ bo), or a convolving layer's
        convolution, normed after with POST_ATTN_NORM."""
        d = self.d
        xn = self.norm(x, Role.ATTN_NORM, layer)
        if d.conv(layer):
            out = self.short_conv(xn, layer)
        elif d.delta(layer):
            out = self.delta_net(xn, layer)
        else:
            out = self._proj(self.mla(xn, layer) if d.mla else self.mha(xn, layer), Role.WO, Role.BO, layer)
        return self.norm(out, Role.POST_ATTN_NORM, layer) if d.layers[layer].options & LAYER_OPT_POST_ATTN_NORM else out

    # ---- the FFN half ----

    def route(self, xn: np.ndarray, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Each token's top_k experts (best first) and weights, as router_choice and route_topk compute them:
        the scores (softmax over the experts, sigmoids, or gpt-oss's biased logits), the choice scores (plus
        the router bias, which chooses but never weighs), with groups only the best topk_group groups'
        experts (a group scores the sum of its group_top best choice scores, best first), then top_k picks of
        the best choice left, ties to the lower index; the weights are the picked scores (a softmax of them
        in gpt-oss), divided by their sum + topk_norm_eps when renormalized, times routed_scale (and Gemma 4's
        per-expert scale)."""
        d, kind = self.d, self.d.layers[layer]
        logits = self.linear(xn, Role.ROUTER, layer)
        bias = self._t(Role.ROUTER_BIAS, layer) if kind.options & LAYER_OPT_ROUTER_BIAS else None
        if kind.router == LAYER_ROUTER_TOPK_SOFTMAX:
            scores, bias = (logits + bias if bias is not None else logits), None
        elif kind.router == LAYER_ROUTER_SIGMOID:
            scores = arith.sigmoid(logits)
        else:
            scores = arith.softmax(logits)
        choice = scores + bias if bias is not None else scores
        n = xn.shape[0]
        if d.n_group > 1:
            per = d.n_experts // d.n_group
            grouped = choice.reshape(n, d.n_group, per)
            best = np.take_along_axis(grouped, np.argsort(-grouped, axis=-1, kind="stable"), axis=-1)
            group_score = arith.seq_sum(best[..., :d.group_top])
            keep = np.argsort(-group_score, axis=-1, kind="stable")[:, :d.topk_group]
            mask = np.zeros((n, d.n_group), bool)
            np.put_along_axis(mask, keep, True, axis=-1)
            choice = np.where(np.repeat(mask, per, axis=-1), choice, F32(-np.inf))
        idx = np.argsort(-choice, axis=-1, kind="stable")[:, :d.top_k]
        w = np.take_along_axis(scores, idx, axis=-1)
        total = arith.seq_sum(w)
        if kind.router == LAYER_ROUTER_TOPK_SOFTMAX:
            w = arith.softmax(w)
        if kind.options & LAYER_OPT_NORM_TOPK:
            w = w / (total + F32(d.topk_norm_eps))[:, None]
        w = w * F32(d.routed_scale)
        if kind.ffn == LAYER_FFN_MOE_AND_DENSE:
            w = w * self._t(Role.EXPERT_SCALE, layer)[idx]
        return idx, w

    def glu(self, x: np.ndarray, gate: Role, up: Role, down: Role, layer: int, expert: int = NO_INDEX) -> np.ndarray:
        """down(act(gate x) * up x) as swiglu_ffn computes it: SwiGLU, GeGLU with the layer's GELU_TANH, or for a
        gpt-oss expert its biases and clamped SwiGLU."""
        d, kind = self.d, self.d.layers[layer]
        g, u = self.linear(x, gate, layer, expert), self.linear(x, up, layer, expert)
        biased = bool(kind.options & LAYER_OPT_EXPERT_BIAS)
        extras = expert != NO_INDEX and (biased or d.swiglu_limit > 0)
        if extras:
            if biased:
                g, u = g + self._t(Role.EXPERT_GATE_BIAS, layer)[expert], u + self._t(Role.EXPERT_UP_BIAS, layer)[expert]
            h = clamped_glu(g, u, d.swiglu_alpha, d.swiglu_limit) if d.swiglu_limit > 0 else arith.silu_times(g, u)
        elif kind.activation == LAYER_ACT_GELU_TANH:
            h = arith.gelu_tanh(g) * u
        else:
            h = arith.silu_times(g, u)
        y = self.linear(h, down, layer, expert)
        return y + self._t(Role.EXPERT_DOWN_BIAS, layer)[expert] if extras and biased else y

    def experts(self, xn: np.ndarray, router_xn: np.ndarray, layer: int) -> np.ndarray:
        """The routed experts' sum (and the shared expert's), routed on router_xn, reading xn: each token adds
        its experts' outputs times their weights in rank order, from +0."""
        d = self.d
        idx, w = self.route(router_xn, layer)
        if self.routes is not None:
            self.routes[layer] = (idx, w)
        outs = np.zeros((*idx.shape, d.hidden_size), F32)  # [n, top_k, dim]
        for e in np.unique(idx):
            rows, rank = np.nonzero(idx == e)
            outs[rows, rank] = self.glu(xn[rows], Role.EXPERT_GATE, Role.EXPERT_UP, Role.EXPERT_DOWN, layer, int(e))
        out = np.zeros((xn.shape[0], d.hidden_size), F32)
        for k in range(d.top_k):
            out += w[:, k, None] * outs[:, k]
        shared = d.layers[layer].shared
        if shared == LAYER_SHARED_GATED:
            gate = arith.sigmoid(self.linear(xn, Role.SHARED_EXPERT_GATE, layer))
            out += gate * self.glu(xn, Role.SHARED_GATE, Role.SHARED_UP, Role.SHARED_DOWN, layer)
        elif shared == LAYER_SHARED_PLAIN:
            out += ONE * self.glu(xn, Role.SHARED_GATE, Role.SHARED_UP, Role.SHARED_DOWN, layer)
        return out

    def ffn(self, x: np.ndarray, layer: int) -> np.ndarray:
        """What the FFN half adds to x (ffn_block): the routed experts, or the dense MLP, on x normed by
        FFN_NORM. MOE_AND_DENSE (Gemma 4's) routes on x normed by ROUTER_NORM, runs the experts on x normed by
        MOE_NORM and the dense MLP beside them, and norms each part after; POST_FFN_NORM norms their sum."""
        kind = self.d.layers[layer]
        gemma, routed = kind.ffn == LAYER_FFN_MOE_AND_DENSE, kind.moe
        out = np.zeros_like(x)
        if routed:
            router_xn = self.norm(x, Role.ROUTER_NORM if gemma else Role.FFN_NORM, layer)
            xn = self.norm(x, Role.MOE_NORM, layer) if gemma else router_xn
            out = out + self.experts(xn, router_xn, layer)
            if gemma:
                out = self.norm(out, Role.MOE_POST_NORM, layer)
        if not routed or gemma:
            h = self.glu(self.norm(x, Role.FFN_NORM, layer), Role.DENSE_GATE, Role.DENSE_UP, Role.DENSE_DOWN, layer)
            if gemma and routed:
                h = self.norm(h, Role.DENSE_POST_NORM, layer)
            out = out + ONE * h
        return self.norm(out, Role.POST_FFN_NORM, layer) if kind.options & LAYER_OPT_POST_FFN_NORM else out

    # ---- Gemma 4's per-layer inputs ----

    def per_layer_inputs(self, tokens: np.ndarray, x: np.ndarray) -> np.ndarray:
        """[n, L, P]: the token's row of PLE_EMBD times sqrt(P), and the scaled embedding x through
        PLE_MODEL_PROJ times 1 / sqrt(D), normed per layer; their sum times 0.70710678118654752."""
        d, P = self.d, self.d.ple_dim
        n = x.shape[0]
        token = self._rows(Role.PLE_EMBD, tokens) * np.sqrt(F32(P))
        context = self.linear(x, Role.PLE_MODEL_PROJ) * (ONE / np.sqrt(F32(d.hidden_size)))
        context = self.norm(context.reshape(n, d.n_layers, P), Role.PLE_PROJ_NORM)
        return (context + token.reshape(n, d.n_layers, P)) * F32(0.70710678118654752)

    def per_layer_input(self, x: np.ndarray, ple: np.ndarray, layer: int) -> np.ndarray:
        """What layer `layer` adds from its per-layer input ple [n, P]: gelu_tanh(PLE_GATE x) * ple through
        PLE_PROJ, normed."""
        g = arith.gelu_tanh(self.linear(x, Role.PLE_GATE, layer)) * ple
        return self.norm(self.linear(g, Role.PLE_PROJ, layer), Role.PLE_POST_NORM, layer)

    # ---- the whole pass ----

    def forward(self, tokens: list[int] | np.ndarray) -> np.ndarray:
        """Logits [len(tokens), vocab] for every prefix of `tokens` (row i: after token i)."""
        d = self.d
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.size == 0 or tokens.size > d.max_seq:
            raise ValueError(f"need 1..{d.max_seq} tokens, got {tokens.size}")
        if tokens.min() < 0 or tokens.max() >= d.vocab_size:
            raise ValueError(f"token ids must be in [0, {d.vocab_size})")
        x = self._rows(Role.TOKEN_EMBD, tokens)
        if d.embed_scale:
            x = x * F32(d.embed_scale)
        ple = self.per_layer_inputs(tokens, x) if d.ple_dim else None
        self._kv = {}
        for layer in range(d.n_layers):
            x = x + self.attention(x, layer)
            after_attention = x
            x = x + self.ffn(x, layer)
            if ple is not None:
                x = x + self.per_layer_input(x, ple[:, layer], layer)
            if d.layers[layer].options & LAYER_OPT_LAYER_SCALE:
                x = x * self._t(Role.LAYER_SCALE, layer)[0]
            if self.residuals is not None:
                self.residuals[layer] = (after_attention, x)
        logits = self.linear(self.norm(x, Role.OUTPUT_NORM), Role.LM_HEAD)
        if d.logit_softcap:
            cap = F32(d.logit_softcap)
            logits = cap * arith.tanh(logits / cap)
        return logits

    def routing(self, tokens: list[int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """For each MoE layer: the experts chosen for each position (best first) and their weights."""
        return self.traced(tokens)[0]

    def traced(self, tokens: list[int]) -> tuple[dict[int, tuple[np.ndarray, np.ndarray]], dict[int, np.ndarray]]:
        """One pass, recording what the device's trace reports (colibri_layer_trace): for each MoE layer each
        position's experts and weights (routing), and for every layer the CRC-32 of each position's residual
        stream (its f32 values as little-endian bytes) after the attention half and after the whole layer:
        [positions, 2] uint32."""
        self.routes, self.residuals = {}, {}
        try:
            self.forward(tokens)
            sums = {layer: np.array([[zlib.crc32(row.astype("<f4").tobytes()) for row in half] for half in halves],
                                    np.uint32).T for layer, halves in self.residuals.items()}
            return self.routes, sums
        finally:
            self.routes = self.residuals = None

    def greedy(self, prompt: list[int], n_new: int) -> list[int]:
        seq = list(prompt)
        for _ in range(n_new):
            seq.append(int(np.argmax(self.forward(seq)[-1])))
        return seq[len(prompt):]
