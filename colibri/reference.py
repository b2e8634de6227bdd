"""The numpy reference: runs a model from its Colibri image, in float32.

Weights are used exactly as the runtime decodes them (f16/bf16 widened, Q8_0/Q4_0 dequantized);
a matrix product with Q8_0/Q4_0 weights quantizes its input to Q8_0 first, as the runtime does
(colibri/quant.py), and an f16 KV cache rounds k and v to f16. So the only difference left between
the two is float summation order, and `flash.py --verify` stays tight for every dtype.

It follows transformers' forward passes for the supported families (docs/MODELS.md): RMSNorm,
GQA attention with optional q/k/v/o biases, optional q/k RMSNorm (per head or across the
projection), optional clipping, rotate-half RoPE from the image's tables, over every earlier position
or, in a windowed layer, the last sliding_window of them; then per layer either a
dense SwiGLU MLP or a MoE block (softmax or sigmoid router scores, an optional choice bias and
group-limited choice, top-k, optionally renormalized and scaled weights, SwiGLU experts, an optional
shared expert, sigmoid-gated or plain); final norm, lm_head. DeepSeek's multi-head latent attention
is computed in the runtime's absorbed form; gpt-oss adds attention sinks, a softmax over the top-k
router logits, expert biases and its clamped SwiGLU; Gemma 4 its layer (norms after attention and the
FFN, the dense MLP beside the experts, a normed router with per-expert scales, a scalar per layer), GeGLU,
v norms, keys as values and a head size and RoPE of their own in global layers, the embedding scale and
logit soft-capping (docs/MODELS.md). It is the
oracle that device outputs are verified against. It reads the image, not the HF checkpoint, so it
checks the packer too.
"""
from __future__ import annotations

import numpy as np

from colibri.image import (FLAG_ATTN_SINKS, FLAG_EXPERT_BIAS, FLAG_GELU_TANH, FLAG_GEMMA4_LAYER, FLAG_GLOBAL_ROPE,
                           FLAG_K_EQ_V, FLAG_NORM_TOPK, FLAG_QK_NORM_FULL, FLAG_QK_NORM_HEAD, FLAG_ROPE_PAIRS,
                           FLAG_ROUTER_BIAS, FLAG_ROUTER_SIGMOID, FLAG_ROUTER_TOPK_SOFTMAX, FLAG_SHARED_EXPERT,
                           FLAG_SHARED_PLAIN, FLAG_V_NORM, KV_DTYPES, NO_INDEX, Image, ModelDims, Role)
from colibri.quant import Encoded, quantized_matmul


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    var = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
    return (x / np.sqrt(var + np.float32(eps))) * weight


def silu(x: np.ndarray) -> np.ndarray:
    return x / (np.float32(1) + np.exp(-x))


def tanh(x: np.ndarray) -> np.ndarray:
    """tanh as the runtime computes it: 1 - 2 / (exp(2x) + 1) (exp overflowing to infinity gives 1)."""
    with np.errstate(over="ignore"):
        return np.float32(1) - np.float32(2) / (np.exp(np.float32(2) * x) + np.float32(1))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """gelu's tanh approximation (transformers' gelu_pytorch_tanh): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    inner = np.float32(0.7978845608028654) * (x + np.float32(0.044715) * (x * x * x))
    return np.float32(0.5) * x * (np.float32(1) + tanh(inner))


def clamped_glu(g: np.ndarray, u: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    """gpt-oss's expert activation: gate clamped above, up to +-limit, (up + 1) * gate * sigmoid(alpha * gate)."""
    g, u = np.minimum(g, np.float32(limit)), np.clip(u, np.float32(-limit), np.float32(limit))
    return (u + np.float32(1)) * (g / (np.float32(1) + np.exp(-(np.float32(alpha) * g))))


def softmax_sink(x: np.ndarray, sink: np.ndarray) -> np.ndarray:
    """softmax over the last axis with one more logit per head (x [heads, q, k], sink [heads]) in the
    denominator only."""
    s = np.broadcast_to(sink[:, None, None], (*x.shape[:-1], 1)).astype(np.float32)
    return softmax(np.concatenate([x, s], axis=-1))[..., :-1]


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, pairs: bool = False) -> np.ndarray:
    """RoPE on x [seq, heads, dim] with cos/sin [seq, dim/2]: the two halves rotated together, or with
    `pairs` adjacent elements (x0, x1), (x2, x3), ... (in place of their pair)."""
    c, s = cos[:, None, :], sin[:, None, :]
    if pairs:
        out = np.empty_like(x)
        a, b = x[..., 0::2], x[..., 1::2]
        out[..., 0::2], out[..., 1::2] = a * c - b * s, b * c + a * s
        return out
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def route_topk(router_logits: np.ndarray, d: ModelDims, bias: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The runtime's routing (ties: lower index first): scores (softmax over the experts, or sigmoids), the
    choice scores (scores + bias), with groups only the best topk_group groups' experts (a group scores the
    sum of its group_top best choice scores), the top_k by choice weighted by their scores, optionally
    renormalized, times routed_scale. Returns (indices, weights), best first."""
    if d.flags & FLAG_ROUTER_TOPK_SOFTMAX:  # gpt-oss: the logits with the Linear's bias choose
        scores = router_logits + bias if bias is not None else router_logits
        bias = None
    elif d.flags & FLAG_ROUTER_SIGMOID:
        scores = (np.float32(1) / (np.float32(1) + np.exp(-router_logits))).astype(np.float32)
    else:
        scores = softmax(router_logits)
    choice = scores + bias if bias is not None else scores.copy()
    if d.n_group > 1:
        n, per = choice.shape[0], d.n_experts // d.n_group
        grouped = choice.reshape(n, d.n_group, per)
        top = -np.sort(-grouped, axis=-1)[..., :d.group_top]
        group_score = np.zeros((n, d.n_group), np.float32)
        for j in range(d.group_top):  # best first, in float32, as the runtime sums them
            group_score = (group_score + top[..., j]).astype(np.float32)
        keep = np.argsort(-group_score, axis=-1, kind="stable")[:, :d.topk_group]
        mask = np.zeros((n, d.n_group), bool)
        np.put_along_axis(mask, keep, True, axis=-1)
        choice = np.where(np.repeat(mask, per, axis=-1), choice, -np.inf).astype(np.float32)
    idx = np.argsort(-choice, axis=-1, kind="stable")[:, :d.top_k]
    w = np.take_along_axis(scores, idx, axis=-1)
    if d.flags & FLAG_ROUTER_TOPK_SOFTMAX:
        w = softmax(w)
    if d.flags & FLAG_NORM_TOPK:
        w = w / (np.sum(w, axis=-1, keepdims=True) + np.float32(1e-20))
    return idx, (w * np.float32(d.routed_scale)).astype(np.float32)


class Reference:
    def __init__(self, image: Image, keep_weights: bool = True):
        """`keep_weights` False: only the weight in use is held (a model larger than memory, read from a file
        a tensor at a time: colibri/pack.py), at the cost of reading a weight again in each forward pass."""
        self.img = image
        self.keep_weights = keep_weights
        self.d = image.dims
        self.routes: dict[int, tuple[np.ndarray, np.ndarray]] | None = None  # layer -> (experts, weights) per position
        self._decoded: dict[tuple[Role, int, int], np.ndarray] = {}
        self._encoded: dict[tuple[Role, int, int], Encoded] = {}
        self._kv: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # a forward pass's cached k, v per layer

    def _t(self, role: Role, layer: int = NO_INDEX, expert: int = NO_INDEX) -> np.ndarray:
        return self._held(self._decoded, (role, layer, expert), self.img.tensor)

    def _held(self, cache: dict, key: tuple[Role, int, int], fetch):
        """cache[key], fetched on first use; without keep_weights the cache holds only the latest."""
        if key not in cache:
            if not self.keep_weights:
                cache.clear()
            cache[key] = fetch(*key)
        return cache[key]

    def linear(self, x: np.ndarray, role: Role, layer: int = NO_INDEX, expert: int = NO_INDEX) -> np.ndarray:
        """x @ W.T for the image's matrix W, with the runtime's activation quantization for Q8_0/Q4_0."""
        # the table lookup is linear: once per tensor, not per matmul
        enc = self._held(self._encoded, (role, layer, expert), self.img.encoded)
        if enc.dtype.quantized:
            return quantized_matmul(x, enc)
        return x @ self._t(role, layer, expert).T

    def per_head(self, x: np.ndarray, role: Role, layer: int) -> np.ndarray:
        """x [n, H, cols] through a per-head projection (head h owns the h-th H-th of the matrix's rows):
        [n, H, rows]. As the runtime does it: one matrix product per head."""
        enc, H = self._held(self._encoded, (role, layer, NO_INDEX), self.img.encoded), self.d.n_heads
        rows = enc.shape[0] // H
        out = []
        for h in range(H):
            part = slice(h * rows, (h + 1) * rows)
            if enc.dtype.quantized:
                out.append(quantized_matmul(x[:, h], Encoded(enc.dtype, (rows, enc.shape[1]), enc.values[part],
                                                             enc.scales[part])))
            else:
                out.append(x[:, h] @ self._t(role, layer)[part].T)
        return np.stack(out, axis=1)

    def swiglu(self, x: np.ndarray, gate: Role, up: Role, down: Role, layer: int, expert: int = NO_INDEX) -> np.ndarray:
        """down(act(gate x) * up x): SwiGLU, or GeGLU with FLAG_GELU_TANH."""
        g = self.linear(x, gate, layer, expert)
        u = self.linear(x, up, layer, expert)
        act = gelu_tanh if self.d.flags & FLAG_GELU_TANH else silu
        return self.linear(act(g) * u, down, layer, expert)

    def routed_expert(self, x: np.ndarray, layer: int, e: int) -> np.ndarray:
        d = self.d
        if not d.flags & FLAG_EXPERT_BIAS and not d.swiglu_limit:
            return self.swiglu(x, Role.EXPERT_GATE, Role.EXPERT_UP, Role.EXPERT_DOWN, layer, e)
        g, u = self.linear(x, Role.EXPERT_GATE, layer, e), self.linear(x, Role.EXPERT_UP, layer, e)
        if d.flags & FLAG_EXPERT_BIAS:
            g, u = g + self._t(Role.EXPERT_GATE_BIAS, layer)[e], u + self._t(Role.EXPERT_UP_BIAS, layer)[e]
        h = clamped_glu(g, u, d.swiglu_alpha, d.swiglu_limit) if d.swiglu_limit else silu(g) * u
        y = self.linear(h, Role.EXPERT_DOWN, layer, e)
        return y + self._t(Role.EXPERT_DOWN_BIAS, layer)[e] if d.flags & FLAG_EXPERT_BIAS else y

    def moe(self, x: np.ndarray, layer: int, router_x: np.ndarray | None = None) -> np.ndarray:
        """The routed experts (and shared expert) on x, routed on router_x (Gemma 4's own norm) or x."""
        d = self.d
        bias = self._t(Role.ROUTER_BIAS, layer) if d.flags & FLAG_ROUTER_BIAS else None
        idx, w = route_topk(self.linear(x if router_x is None else router_x, Role.ROUTER, layer), d, bias)
        if d.flags & FLAG_GEMMA4_LAYER:
            w = w * self._t(Role.EXPERT_SCALE, layer)[idx]
        if self.routes is not None:
            self.routes[layer] = (idx, w)
        out = np.zeros_like(x)
        for e in range(d.n_experts):
            rows, slot = np.nonzero(idx == e)
            if rows.size:
                out[rows] += w[rows, slot][:, None] * self.routed_expert(x[rows], layer, e)
        if d.flags & FLAG_SHARED_EXPERT:
            gate = 1.0 / (1.0 + np.exp(-self.linear(x, Role.SHARED_EXPERT_GATE, layer)))
            out += gate * self.swiglu(x, Role.SHARED_GATE, Role.SHARED_UP, Role.SHARED_DOWN, layer)
        elif d.flags & FLAG_SHARED_PLAIN:
            out += self.swiglu(x, Role.SHARED_GATE, Role.SHARED_UP, Role.SHARED_DOWN, layer)
        return out

    def ffn(self, x: np.ndarray, layer: int) -> np.ndarray:
        if self.d.moe_layers[layer]:
            return self.moe(x, layer)
        return self.swiglu(x, Role.DENSE_GATE, Role.DENSE_UP, Role.DENSE_DOWN, layer)

    def per_layer_inputs(self, tokens: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Gemma 4's per-layer inputs [n, L, P]: the token's row of PLE_EMBD times sqrt(P), and the scaled
        embedding x through PLE_MODEL_PROJ times D^-1/2, normed per layer; their sum times 2^-1/2."""
        d, P = self.d, self.d.ple_dim
        n = x.shape[0]
        token = self._t(Role.PLE_EMBD)[tokens] * np.sqrt(np.float32(P))
        context = self.linear(x, Role.PLE_MODEL_PROJ) * (np.float32(1) / np.sqrt(np.float32(d.hidden_size)))
        context = rms_norm(context.reshape(n, d.n_layers, P), self._t(Role.PLE_PROJ_NORM), d.rms_norm_eps)
        return (context + token.reshape(n, d.n_layers, P)) * np.float32(2 ** -0.5)

    def per_layer_input(self, x: np.ndarray, ple: np.ndarray, layer: int) -> np.ndarray:
        """What layer `layer` adds from its per-layer input ple [n, P]: gelu_tanh(PLE_GATE x) * ple through
        PLE_PROJ, normed."""
        g = gelu_tanh(self.linear(x, Role.PLE_GATE, layer)) * ple
        return rms_norm(self.linear(g, Role.PLE_PROJ, layer), self._t(Role.PLE_POST_NORM, layer), self.d.rms_norm_eps)

    def gemma4_ffn(self, x: np.ndarray, layer: int) -> np.ndarray:
        """Gemma 4's FFN half on the residual x, its post norm included: the dense MLP, and in a MoE layer beside
        it the experts, each normed before and after on its own."""
        d, eps = self.d, self.d.rms_norm_eps
        h = self.swiglu(rms_norm(x, self._t(Role.FFN_NORM, layer), eps), Role.DENSE_GATE, Role.DENSE_UP, Role.DENSE_DOWN,
                        layer)
        if d.moe_layers[layer]:
            experts = self.moe(rms_norm(x, self._t(Role.MOE_NORM, layer), eps), layer,
                               router_x=rms_norm(x, self._t(Role.ROUTER_NORM, layer), eps))
            h = rms_norm(h, self._t(Role.DENSE_POST_NORM, layer), eps) + \
                rms_norm(experts, self._t(Role.MOE_POST_NORM, layer), eps)
        return rms_norm(h, self._t(Role.POST_FFN_NORM, layer), eps)

    def _proj(self, x: np.ndarray, w: Role, b: Role, layer: int) -> np.ndarray:
        y = self.linear(x, w, layer)
        return y + self._t(b, layer) if self.d.present(b, layer) else y

    def _seen(self, n: int, layer: int) -> np.ndarray:
        """[query, key]: query i sees key j <= i, and with a window only j > i - W."""
        seen = np.tril(np.ones((n, n), bool))
        if self.d.kv_rows(layer) < self.d.max_seq:
            seen &= ~np.tril(np.ones((n, n), bool), -self.d.sliding_window)
        return seen

    def _cache(self, t: np.ndarray) -> np.ndarray:
        """What the KV cache gives back: t, or t rounded to f16 with an f16 cache."""
        return t.astype(np.float16).astype(np.float32) if self.d.kv_dtype == KV_DTYPES["f16"] else t

    def mla(self, x: np.ndarray, layer: int) -> np.ndarray:
        """Multi-head latent attention, absorbed as the runtime computes it: the output projection's input."""
        d = self.d
        n, H, hd, lat = x.shape[0], d.n_heads, d.head_dim, d.kv_lora_rank
        nope, pairs = hd - d.rope_width, bool(d.flags & FLAG_ROPE_PAIRS)
        if d.q_lora_rank:
            q = self.linear(rms_norm(self.linear(x, Role.WQ_A, layer), self._t(Role.Q_A_NORM, layer), d.rms_norm_eps),
                            Role.WQ_B, layer)
        else:
            q = self.linear(x, Role.WQ, layer)
        kv = self.linear(x, Role.WKV_A, layer)
        latent = rms_norm(kv[:, :lat], self._t(Role.KV_A_NORM, layer), d.rms_norm_eps)
        cos, sin = self._t(Role.ROPE_COS)[:n], self._t(Role.ROPE_SIN)[:n]
        q = q.reshape(n, H, hd)
        q_rope = rope(q[..., nope:], cos, sin, pairs)
        k_rope = rope(kv[:, None, lat:], cos, sin, pairs)[:, 0]
        q_att = np.concatenate([self.per_head(q[..., :nope], Role.WK_B, layer), q_rope], axis=-1)  # [n, H, lat + rope]
        key = self._cache(np.concatenate([latent, k_rope], axis=-1))  # [n, lat + rope]: one row per position
        scores = np.einsum("qhd,kd->hqk", q_att, key) * np.float32(d.scale)
        scores = np.where(self._seen(n, layer)[None], scores, np.float32(-np.inf))
        probs = softmax_sink(scores, self._t(Role.SINKS, layer)) if d.flags & FLAG_ATTN_SINKS else softmax(scores)
        summed = np.einsum("hqk,kd->qhd", probs, key[:, :lat])  # [n, H, lat]
        return self.per_head(summed, Role.WV_B, layer).reshape(n, d.o_dim)

    def attention(self, x: np.ndarray, layer: int) -> np.ndarray:
        d = self.d
        if d.mla:
            return self._proj(self.mla(x, layer), Role.WO, Role.BO, layer)
        n, hd, kv_heads = x.shape[0], d.layer_head_dim(layer), d.layer_kv_heads(layer)
        q = self._proj(x, Role.WQ, Role.BQ, layer)
        global_rope = d.flags & FLAG_GLOBAL_ROPE and not d.windowed(layer)
        cos = self._t(Role.GLOBAL_ROPE_COS if global_rope else Role.ROPE_COS)[:n]
        sin = self._t(Role.GLOBAL_ROPE_SIN if global_rope else Role.ROPE_SIN)[:n]
        pairs = bool(d.flags & FLAG_ROPE_PAIRS)
        if d.flags & FLAG_QK_NORM_FULL:
            q = rms_norm(q, self._t(Role.Q_NORM, layer), d.rms_norm_eps)
        q = q.reshape(n, d.n_heads, hd)
        if d.flags & FLAG_QK_NORM_HEAD:
            q = rms_norm(q, self._t(Role.Q_NORM, layer), d.rms_norm_eps)
        if d.kv_shared(layer):  # Gemma 4's KV sharing: the keys and values its source layer cached
            k, v = self._kv[d.kv_source(layer)]
        else:
            k = self._proj(x, Role.WK, Role.BK, layer)
            v = k if not d.present(Role.WV, layer) else self._proj(x, Role.WV, Role.BV, layer)  # FLAG_K_EQ_V
            if d.flags & FLAG_QK_NORM_FULL:
                k = rms_norm(k, self._t(Role.K_NORM, layer), d.rms_norm_eps)
            k, v = k.reshape(n, kv_heads, hd), v.reshape(n, kv_heads, hd)
            if d.flags & FLAG_QK_NORM_HEAD:
                k = rms_norm(k, self._t(Role.K_NORM, layer), d.rms_norm_eps)
            if d.flags & FLAG_V_NORM:
                v = rms_norm(v, np.float32(1), d.rms_norm_eps)
            if d.clip_qkv:  # after either kind of q/k norm, as the runtime (and OLMoE, the family that has it) does
                k, v = (np.clip(t, -d.clip_qkv, d.clip_qkv) for t in (k, v))
            k, v = self._cache(rope(k, cos, sin, pairs)), self._cache(v)
            self._kv[layer] = (k, v)
        if d.clip_qkv:
            q = np.clip(q, -d.clip_qkv, d.clip_qkv)
        q = rope(q, cos, sin, pairs)
        group = d.n_heads // kv_heads
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) * np.float32(d.scale)
        scores = np.where(self._seen(n, layer)[None], scores, np.float32(-np.inf))
        probs = softmax_sink(scores, self._t(Role.SINKS, layer)) if d.flags & FLAG_ATTN_SINKS else softmax(scores)
        out = np.einsum("hqk,khd->qhd", probs, v).reshape(n, d.n_heads * hd)
        return self._proj(out, Role.WO, Role.BO, layer)

    def forward(self, tokens: list[int] | np.ndarray) -> np.ndarray:
        """Logits [len(tokens), vocab] for every prefix of `tokens` (row i: after token i)."""
        d = self.d
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.size == 0 or tokens.size > d.max_seq:
            raise ValueError(f"need 1..{d.max_seq} tokens, got {tokens.size}")
        if tokens.min() < 0 or tokens.max() >= d.vocab_size:
            raise ValueError(f"token ids must be in [0, {d.vocab_size})")
        x = self._t(Role.TOKEN_EMBD)[tokens].astype(np.float32)
        if d.embed_scale:
            x = x * np.float32(d.embed_scale)
        ple = self.per_layer_inputs(tokens, x) if d.ple_dim else None
        gemma = d.flags & FLAG_GEMMA4_LAYER
        for layer in range(d.n_layers):
            h = self.attention(rms_norm(x, self._t(Role.ATTN_NORM, layer), d.rms_norm_eps), layer)
            x = x + (rms_norm(h, self._t(Role.POST_ATTN_NORM, layer), d.rms_norm_eps) if gemma else h)
            if gemma:
                x = x + self.gemma4_ffn(x, layer)
                if ple is not None:
                    x = x + self.per_layer_input(x, ple[:, layer], layer)
                x = x * self._t(Role.LAYER_SCALE, layer)[0]
            else:
                x = x + self.ffn(rms_norm(x, self._t(Role.FFN_NORM, layer), d.rms_norm_eps), layer)
        x = rms_norm(x, self._t(Role.OUTPUT_NORM), d.rms_norm_eps)
        logits = self.linear(x, Role.LM_HEAD).astype(np.float32)
        if d.logit_softcap:
            cap = np.float32(d.logit_softcap)
            logits = cap * tanh(logits / cap)
        return logits

    def routing(self, tokens: list[int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """For each MoE layer: the experts chosen for each position (best first) and their weights."""
        self.routes = {}
        try:
            self.forward(tokens)
            return self.routes
        finally:
            self.routes = None

    def greedy(self, prompt: list[int], n_new: int) -> list[int]:
        seq = list(prompt)
        for _ in range(n_new):
            seq.append(int(np.argmax(self.forward(seq)[-1])))
        return seq[len(prompt):]
