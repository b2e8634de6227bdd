"""The Colibri image, format v1: constants, the memory plan, a writer and a reader.

The byte layout is specified in docs/FORMAT.md; this module and firmware/src/image.c
are the two implementations of it and are tested against each other.
"""
from __future__ import annotations

import enum
import struct
import zlib
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

MAGIC = b"COLIBRI\0"
VERSION = 1
HEADER_BYTES = 256
ENTRY_BYTES = 64
ALIGN = 64
ARENA_CTX_BYTES = 1024  # reserved at the start of the arena for the runtime's context struct
NO_INDEX = 0xFFFFFFFF

ARCH_MOE = 1  # decoder-only transformer with a top-k routed MoE FFN (Mixtral family)

# Header: everything up to `reserved` is packed little-endian, then zero padding to 256 bytes.
HEADER_STRUCT = struct.Struct("<8sIIQII" + "I" * 12 + "ff" + "QIIQQI")
HEADER_FIELDS = (
    "magic", "version", "header_bytes", "image_bytes", "header_crc32", "payload_crc32",
    "arch", "vocab_size", "hidden_size", "ffn_size", "n_layers", "n_heads", "n_kv_heads",
    "head_dim", "n_experts", "top_k", "max_seq", "flags",
    "rms_norm_eps", "rope_theta",
    "tensor_table_offset", "n_tensors", "entry_bytes", "data_offset", "arena_bytes",
    "expert_align",
)
HEADER_CRC_OFFSET = 24
ENTRY_STRUCT = struct.Struct("<HHIIIIIII" + "QQQQ")  # 64 bytes, see docs/FORMAT.md

FLAG_NORM_TOPK = 1 << 0  # renormalize the top-k router weights to sum to 1


class Role(enum.IntEnum):
    TOKEN_EMBD = 1
    ROPE_COS = 2
    ROPE_SIN = 3
    ATTN_NORM = 4
    WQ = 5
    WK = 6
    WV = 7
    WO = 8
    FFN_NORM = 9
    ROUTER = 10
    EXPERT_GATE = 11
    EXPERT_UP = 12
    EXPERT_DOWN = 13
    OUTPUT_NORM = 14
    LM_HEAD = 15


class DType(enum.IntEnum):
    F32 = 0
    F16 = 1
    BF16 = 2
    Q8 = 3  # int8 values + one f32 scale per group (reserved; not produced yet)
    Q4 = 4  # packed int4 values + one f32 scale per group (reserved; not produced yet)


LAYER_ROLES = (Role.ATTN_NORM, Role.WQ, Role.WK, Role.WV, Role.WO, Role.FFN_NORM, Role.ROUTER)
EXPERT_ROLES = (Role.EXPERT_GATE, Role.EXPERT_UP, Role.EXPERT_DOWN)


@dataclass(frozen=True)
class ModelDims:
    vocab_size: int
    hidden_size: int
    ffn_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_experts: int
    top_k: int
    max_seq: int
    rms_norm_eps: float
    rope_theta: float
    flags: int = FLAG_NORM_TOPK

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim


def align_up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def canonical_order(d: ModelDims) -> Iterator[tuple[Role, int, int]]:
    """Every tensor of an image as (role, layer, expert), in table order."""
    yield Role.TOKEN_EMBD, NO_INDEX, NO_INDEX
    yield Role.ROPE_COS, NO_INDEX, NO_INDEX
    yield Role.ROPE_SIN, NO_INDEX, NO_INDEX
    for layer in range(d.n_layers):
        for role in LAYER_ROLES:
            yield role, layer, NO_INDEX
        for expert in range(d.n_experts):
            for role in EXPERT_ROLES:
                yield role, layer, expert
    yield Role.OUTPUT_NORM, NO_INDEX, NO_INDEX
    yield Role.LM_HEAD, NO_INDEX, NO_INDEX


def expected_shape(d: ModelDims, role: Role) -> tuple[int, ...]:
    D, F = d.hidden_size, d.ffn_size
    return {
        Role.TOKEN_EMBD: (d.vocab_size, D),
        Role.ROPE_COS: (d.max_seq, d.head_dim // 2),
        Role.ROPE_SIN: (d.max_seq, d.head_dim // 2),
        Role.ATTN_NORM: (D,),
        Role.WQ: (d.q_dim, D),
        Role.WK: (d.kv_dim, D),
        Role.WV: (d.kv_dim, D),
        Role.WO: (D, d.q_dim),
        Role.FFN_NORM: (D,),
        Role.ROUTER: (d.n_experts, D),
        Role.EXPERT_GATE: (F, D),
        Role.EXPERT_UP: (F, D),
        Role.EXPERT_DOWN: (D, F),
        Role.OUTPUT_NORM: (D,),
        Role.LM_HEAD: (d.vocab_size, D),
    }[role]


def arena_plan(d: ModelDims) -> dict[str, tuple[int, int]]:
    """The runtime's work arena: name -> (offset, bytes). Mirrors arena_plan() in firmware/src/arena.c."""
    kv_cache = d.n_layers * d.max_seq * d.kv_dim
    buffers = [  # (name, float/u32 element count), in arena order
        ("x", d.hidden_size), ("xn", d.hidden_size), ("q", d.q_dim), ("attn_out", d.q_dim),
        ("att", d.n_heads * d.max_seq), ("ffn_gate", d.ffn_size), ("ffn_up", d.ffn_size),
        ("moe_out", d.hidden_size), ("router", d.n_experts), ("topk_weight", d.top_k),
        ("topk_index", d.top_k), ("logits", d.vocab_size), ("probs", d.vocab_size),
        ("sample_index", d.vocab_size),
        ("k_cache", kv_cache), ("v_cache", kv_cache),
    ]
    plan, offset = {}, ARENA_CTX_BYTES
    for name, count in buffers:
        plan[name] = (offset, count * 4)
        offset += align_up(count * 4)
    plan["total"] = (0, offset)
    return plan


def arena_bytes(d: ModelDims) -> int:
    return arena_plan(d)["total"][1]


def rope_tables(d: ModelDims) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin of pos * theta^(-2i/head_dim) for rotate-half RoPE, computed in float64, stored f32."""
    half = d.head_dim // 2
    inv_freq = 1.0 / (d.rope_theta ** (np.arange(0, half, dtype=np.float64) * 2.0 / d.head_dim))
    angles = np.arange(d.max_seq, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


@dataclass
class TensorEntry:
    role: Role
    layer: int
    expert: int
    dtype: DType
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    group_size: int = 0
    scales_offset: int = 0
    scales_bytes: int = 0

    def pack(self) -> bytes:
        dims = list(self.shape) + [1] * (2 - len(self.shape))
        return ENTRY_STRUCT.pack(self.role, self.dtype, self.layer, self.expert, len(self.shape),
                                 dims[0], dims[1], self.group_size, 0, self.offset, self.nbytes,
                                 self.scales_offset, self.scales_bytes)


@dataclass
class Image:
    dims: ModelDims
    header: dict
    entries: list[TensorEntry]
    data: bytes = field(repr=False)

    def tensor(self, role: Role, layer: int = NO_INDEX, expert: int = NO_INDEX) -> np.ndarray:
        for e in self.entries:
            if (e.role, e.layer, e.expert) == (role, layer, expert):
                if e.dtype != DType.F32:
                    raise ValueError(f"tensor {role.name} has dtype {DType(e.dtype).name}; only F32 is supported")
                return np.frombuffer(self.data, np.float32, e.nbytes // 4, e.offset).reshape(e.shape)
        raise KeyError(f"no tensor {role.name} layer={layer} expert={expert}")


class ImageError(ValueError):
    """The bytes are not a valid Colibri v1 image."""


def crc32(data: bytes | memoryview) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


def build_image(dims: ModelDims, tensors: dict[tuple[Role, int, int], np.ndarray],
                expert_align: int = ALIGN) -> bytes:
    """Lay out `tensors` (keyed by (role, layer, expert)) in canonical order and return the image bytes.

    ROPE_COS/ROPE_SIN are generated here. If LM_HEAD is the same array object as TOKEN_EMBD
    (tied embeddings), the table entry points at the embedding's bytes instead of a copy.
    expert_align aligns the start of each expert block (4096 lets a page-granular madvise or a
    DMA burst cover exactly one expert).
    """
    if expert_align % ALIGN or expert_align <= 0:
        raise ValueError(f"expert_align must be a positive multiple of {ALIGN}")
    cos, sin = rope_tables(dims)
    tensors = dict(tensors)
    tensors[(Role.ROPE_COS, NO_INDEX, NO_INDEX)] = cos
    tensors[(Role.ROPE_SIN, NO_INDEX, NO_INDEX)] = sin
    order = list(canonical_order(dims))
    table_offset = HEADER_BYTES
    data_offset = align_up(table_offset + len(order) * ENTRY_BYTES)
    chunks: list[tuple[int, bytes]] = []
    entries: list[TensorEntry] = []
    placed: dict[int, TensorEntry] = {}  # id(array) -> entry, so tied tensors share bytes
    cursor = data_offset
    for role, layer, expert in order:
        arr = tensors[(role, layer, expert)]
        want = expected_shape(dims, role)
        if tuple(arr.shape) != want:
            raise ValueError(f"{role.name} layer={layer} expert={expert}: shape {arr.shape}, expected {want}")
        if id(arr) in placed:
            src = placed[id(arr)]
            entries.append(TensorEntry(role, layer, expert, DType.F32, want, src.offset, src.nbytes))
            continue
        if role == Role.EXPERT_GATE:
            cursor = align_up(cursor, expert_align)
        raw = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        entry = TensorEntry(role, layer, expert, DType.F32, want, cursor, len(raw))
        entries.append(entry)
        placed[id(arr)] = entry
        chunks.append((cursor, raw))
        cursor = align_up(cursor + len(raw))
    image_bytes = cursor
    buf = bytearray(image_bytes)
    for off, raw in chunks:
        buf[off:off + len(raw)] = raw
    for i, e in enumerate(entries):
        buf[table_offset + i * ENTRY_BYTES: table_offset + (i + 1) * ENTRY_BYTES] = e.pack()
    header = dict(
        magic=MAGIC, version=VERSION, header_bytes=HEADER_BYTES, image_bytes=image_bytes,
        header_crc32=0, payload_crc32=crc32(memoryview(buf)[HEADER_BYTES:]),
        arch=ARCH_MOE, vocab_size=dims.vocab_size, hidden_size=dims.hidden_size, ffn_size=dims.ffn_size,
        n_layers=dims.n_layers, n_heads=dims.n_heads, n_kv_heads=dims.n_kv_heads, head_dim=dims.head_dim,
        n_experts=dims.n_experts, top_k=dims.top_k, max_seq=dims.max_seq, flags=dims.flags,
        rms_norm_eps=dims.rms_norm_eps, rope_theta=dims.rope_theta,
        tensor_table_offset=table_offset, n_tensors=len(entries), entry_bytes=ENTRY_BYTES,
        data_offset=data_offset, arena_bytes=arena_bytes(dims), expert_align=expert_align,
    )
    write_header(buf, header)
    return bytes(buf)


def write_header(buf: bytearray, header: dict) -> None:
    """Pack `header` into buf[0:256] and set its CRC (the CRC field is zero while summing)."""
    raw = bytearray(HEADER_BYTES)
    HEADER_STRUCT.pack_into(raw, 0, *(header[k] if k != "header_crc32" else 0 for k in HEADER_FIELDS))
    struct.pack_into("<I", raw, HEADER_CRC_OFFSET, crc32(raw))
    buf[:HEADER_BYTES] = raw


def read_image(data: bytes) -> Image:
    """Parse and check an image (header, CRCs, table order, shapes, bounds)."""
    if len(data) < HEADER_BYTES:
        raise ImageError(f"image is {len(data)} bytes, shorter than its {HEADER_BYTES}-byte header")
    h = dict(zip(HEADER_FIELDS, HEADER_STRUCT.unpack_from(data, 0)))
    if h["magic"] != MAGIC:
        raise ImageError("bad magic: not a Colibri image")
    if h["version"] != VERSION:
        raise ImageError(f"format version {h['version']}, this host reads version {VERSION}")
    hdr = bytearray(data[:HEADER_BYTES])
    struct.pack_into("<I", hdr, HEADER_CRC_OFFSET, 0)
    if crc32(hdr) != h["header_crc32"]:
        raise ImageError("header CRC mismatch")
    if h["image_bytes"] > len(data):
        raise ImageError(f"image is truncated: header says {h['image_bytes']} bytes, got {len(data)}")
    if crc32(memoryview(data)[HEADER_BYTES:h["image_bytes"]]) != h["payload_crc32"]:
        raise ImageError("payload CRC mismatch")
    dims = ModelDims(**{k: h[k] for k in (
        "vocab_size", "hidden_size", "ffn_size", "n_layers", "n_heads", "n_kv_heads", "head_dim",
        "n_experts", "top_k", "max_seq", "rms_norm_eps", "rope_theta", "flags")})
    order = list(canonical_order(dims))
    if h["n_tensors"] != len(order):
        raise ImageError(f"{h['n_tensors']} tensors, the dimensions need {len(order)}")
    entries = []
    for i, (role, layer, expert) in enumerate(order):
        f = ENTRY_STRUCT.unpack_from(data, h["tensor_table_offset"] + i * ENTRY_BYTES)
        role_, dtype, layer_, expert_, ndims, dim0, dim1, group, _, off, nbytes, s_off, s_bytes = f
        try:
            e = TensorEntry(Role(role_), layer_, expert_, DType(dtype), (dim0, dim1)[:ndims], off, nbytes,
                            group, s_off, s_bytes)
        except ValueError as exc:
            raise ImageError(f"table entry {i}: {exc}") from None
        if (e.role, e.layer, e.expert) != (role, layer, expert):
            raise ImageError(f"table entry {i} is {e.role.name}/{e.layer}/{e.expert}, expected {role.name}/{layer}/{expert}")
        if e.shape != expected_shape(dims, role):
            raise ImageError(f"table entry {i} ({role.name}) has shape {e.shape}")
        if e.offset % ALIGN or e.offset + e.nbytes > h["image_bytes"]:
            raise ImageError(f"table entry {i} ({role.name}) is misaligned or out of bounds")
        entries.append(e)
    return Image(dims, h, entries, bytes(data[:h["image_bytes"]]))
