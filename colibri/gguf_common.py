"""What reading a GGUF file needs in more than one place: its errors, llama.cpp's tensor names, the file as a family's
GGUF hooks see it (GGUFFile), and the layouts undone lazily (colibri/gguf_input.py reads the file; a family file's
gguf_config and gguf_tensors hooks read what is its own)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from gguf.constants import MODEL_TENSOR, TENSOR_NAMES, Keys  # noqa: F401  (Keys: the hooks' keys, from here)

from colibri.lazy import Derived, LazyTensor
from colibri.quant import Encoded, matrix_rows


class GGUFError(ValueError):
    """The GGUF file lacks something required or holds something unsupported."""


def gguf_name(t: MODEL_TENSOR, layer: int | None = None) -> str:
    return TENSOR_NAMES[t].format(bid=layer)


@dataclass
class GGUFFile:
    """A GGUF file as a family's hooks read it: `field(key, default=None, required=True)` its metadata, `key(name)`
    a key template ({arch} filled in), the counts every architecture has, its tensors by llama.cpp's names, and the
    KV heads and MLP widths per layer where the file lists them so (empty where it gives one count)."""
    field: Callable
    key: Callable[[str], str]
    n_layers: int
    n_head: int
    n_head_kv: int
    n_experts: int
    tensors: dict
    layer_kv_heads: tuple[int, ...] = ()
    layer_ffn: tuple[int, ...] = ()

    def number(self, key: str, default: int | None = None) -> int:
        """Key `key` (a template) as one whole number below 2^32; `default` where the file lacks it (None: required)."""
        value = self.field(self.key(key), default, required=default is None)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < (1 << 32):
            raise GGUFError(f"GGUF key {self.key(key)}={value!r}: one whole number was expected (a value per layer is "
                            "not read)")
        return value


def lazy(shape: tuple[int, ...], t: LazyTensor, fn, by_expert=None, keeps: bool = False) -> Derived:
    """`fn` of a tensor's values, computed when they are read (`by_expert(values of sub-tensor i)`: its
    sub-tensor i alone). `keeps`: fn only moves rows, so a tensor stored in an image dtype stays in it."""
    return Derived(shape, lambda: fn(t.load()), None if by_expert is None else lambda i: by_expert(t.expert(i)),
                   t.kept if keeps else None)


def split_experts(stacked: LazyTensor) -> list[Derived]:
    """A layer's experts stacked by llama.cpp ([experts, rows, columns]) as one tensor each, its bytes alone read."""
    return [Derived(stacked.shape[1:], lambda e=e: stacked.expert(e), kept=stacked.kept)
            for e in range(stacked.shape[0])]


def split_gate_up(stacked: LazyTensor, name: str) -> tuple[list[Derived], list[Derived]]:
    """A layer's experts' gate and up fused by llama.cpp's converter (--fuse-gate-up-exps: [experts, 2F, D], gate rows
    first, as ffn_gate_up_exps) as one gate and one up tensor per expert, its rows whole (quantized blocks as stored),
    its bytes alone read."""
    if len(stacked.shape) != 3 or stacked.shape[1] % 2:
        raise GGUFError(f"GGUF tensor {name} has shape {tuple(stacked.shape)}: llama.cpp stacks a layer's experts' "
                        "gate and up rows, [experts, 2 x ffn, hidden]")
    ffn = stacked.shape[1] // 2
    return tuple([Derived((ffn, stacked.shape[2]), lambda e=e, half=half: matrix_rows(stacked.expert(e), half),
                          kept=stacked.kept) for e in range(stacked.shape[0])] for half in (slice(0, ffn), slice(ffn, 2 * ffn)))


class Joined(Derived):
    """Matrices read as one, their rows in turn (rows_joined), each kept as it is: a reader of exactly one's rows
    (GraniteMoeShared's gate, or its up: colibri/families/granite.py) takes that one alone (`part`), so neither is
    read twice, nor the other with it."""

    def __init__(self, parts: tuple[LazyTensor, ...], compute: Callable[[], np.ndarray | Encoded]):
        kept = parts[0].kept if all(t.kept == parts[0].kept for t in parts) else None  # (rows_joined keeps them then)
        super().__init__((sum(t.shape[0] for t in parts), parts[0].shape[1]), compute, kept=kept)
        self.parts = parts

    def part(self, rows: slice) -> LazyTensor | None:
        """The matrix whose rows `rows` are, when they are exactly one's."""
        start = 0
        for t in self.parts:
            if rows.step in (None, 1) and (rows.start or 0, rows.stop) == (start, start + t.shape[0]):
                return t
            start += t.shape[0]
        return None


def rows_joined(top: LazyTensor, bottom: LazyTensor, names: list[str]) -> Joined:
    """Two matrices as one, `top`'s rows first (a shared expert's gate and up, which a checkpoint keeps in one matrix
    and llama.cpp's converter splits): quantized rows as stored where both are stored alike, else f32."""
    if len(top.shape) != 2 or tuple(top.shape) != tuple(bottom.shape):
        raise GGUFError(f"GGUF tensors {names[0]} {tuple(top.shape)} and {names[1]} {tuple(bottom.shape)}: two "
                        "matrices of one shape were expected")

    def join() -> np.ndarray | Encoded:
        a, b = top.load(), bottom.load()
        if isinstance(a, Encoded) and isinstance(b, Encoded) and a.dtype == b.dtype:
            return Encoded(a.dtype, (a.shape[0] + b.shape[0], a.shape[1]), np.concatenate([a.values, b.values]),
                           None if a.scales is None else np.concatenate([a.scales, b.scales]))
        return np.concatenate([floats(a), floats(b)])
    return Joined((top, bottom), join)


def as_row(t: LazyTensor) -> Derived:
    """A vector llama.cpp stores for a [1, D] matrix (a shared expert's gate) as that matrix."""
    return lazy((1, t.shape[-1]), t, lambda values: floats(values).reshape(1, -1))


def floats(t: np.ndarray | Encoded) -> np.ndarray:
    """Values as f32 (a quantized tensor's widened exactly)."""
    return t.decode() if isinstance(t, Encoded) else np.asarray(t, np.float32)


def transposed(t: np.ndarray | Encoded) -> np.ndarray:
    """The last two axes swapped, as f32."""
    return np.ascontiguousarray(np.swapaxes(floats(t), -1, -2))


def fused_gate_up(gate: np.ndarray | Encoded, up: np.ndarray | Encoded) -> np.ndarray:
    """gate and up [..., F, D] (one expert or all of a layer) as transformers' gate_up_proj [..., D, 2F],
    gate and up interleaved by column."""
    g, u = floats(gate), floats(up)
    fused = np.empty((*g.shape[:-2], 2 * g.shape[-2], g.shape[-1]), np.float32)
    fused[..., 0::2, :], fused[..., 1::2, :] = g, u
    return transposed(fused)


def heads_stacked(t: np.ndarray | Encoded) -> np.ndarray | Encoded:
    """A per-head [H, rows, cols] tensor (attn_k_b, attn_v_b) as one matrix [H * rows, cols]."""
    if isinstance(t, Encoded):
        h, rows = t.shape[0], t.shape[1]
        return Encoded(t.dtype, (h * rows, t.shape[2]), t.values.reshape(h * rows, *t.values.shape[2:]),
                       None if t.scales is None else t.scales.reshape(h * rows, -1))
    return t.reshape(-1, t.shape[-1])
