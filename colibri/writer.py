"""The image writer: a model's tensors laid out (the table in canonical order, the two tiers, tied tensors once) and
written into bytes or straight into a file, then the table, the CRCs and the header (docs/FORMAT.md)."""
from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from colibri.dims import ModelDims, align_up, canonical_order, expected_shape
from colibri.format import (ALIGN, ARCH_MOE, ENTRY_BYTES, EXPERT_ROLES, F32_TABLES, HEADER_BYTES,
                            LAYER_FIELDS, MAGIC, MAX_LAYER_KINDS, MAX_LAYERS, VERSION, Role)
from colibri.plan import arena_bytes
from colibri.reader import ImageError, check_records
from colibri.quant import Deferred, DType, Encoded, stored_bytes
from colibri.table import LAYER_STRUCT, TensorEntry, crc32, expert_blocks, header_block, tensor_name

def build_image(dims: ModelDims, tensors: dict[tuple[Role, int, int], np.ndarray | Encoded],
                expert_align: int = ALIGN, pinned: frozenset[tuple[int, int]] = frozenset(),
                meta: dict | None = None) -> bytes:
    """The image of `tensors` as bytes (write_image puts it in a file without holding it in memory).

    `tensors` are keyed by (role, layer, expert), ROPE_COS/ROPE_SIN included; a float array is stored
    as f32, an `Encoded` tensor in its dtype. The table lists the tensors the model has (dims.present),
    in canonical order; others in `tensors` are ignored. Two tiers (docs/FORMAT.md): the resident part holds every tensor but the routed experts,
    then the routed experts listed in `pinned` as (layer, expert); the expert part after it holds the
    other routed experts, which a board with an expert cache reads only through its fetch hook. Each
    routed expert's block (gate, up, down) starts at a multiple of expert_align (4096 lets a
    page-granular madvise or a DMA burst cover exactly one expert) and has its CRC in the expert CRC
    table. If two keys map to the same object (tied embeddings: LM_HEAD is TOKEN_EMBD), the second
    entry points at the first one's bytes instead of a copy. `meta` (the tokenizer, the chat template:
    colibri/text.py) goes into the metadata section after everything, as JSON.
    """
    plan = plan_image(dims, tensors, expert_align, pinned, meta)
    buf = bytearray(plan.image_bytes)
    view = memoryview(buf)

    def write(at: int, data: bytes | np.ndarray) -> None:
        data = memoryview(data).cast("B")
        view[at:at + len(data)] = data
    _fill(write, lambda at, n: view[at:at + n], plan)
    return bytes(buf)


def write_image(path: Path, dims: ModelDims, tensors: dict[tuple[Role, int, int], np.ndarray | Encoded],
                expert_align: int = ALIGN, pinned: frozenset[tuple[int, int]] = frozenset(),
                meta: dict | None = None) -> int:
    """build_image's bytes written straight into the file at `path`, a tensor at a time (the image is never
    a second copy of the model in RAM: written pages belong to the page cache, not the process). Returns
    its size."""
    return write_plan(path, plan_image(dims, tensors, expert_align, pinned, meta))


def write_plan(path: Path, plan: ImagePlan, progress: Callable[[int], None] | None = None) -> int:
    """The planned image written into the file at `path` as write_image writes it; `progress(bytes)` is told of
    each tensor's bytes as they are written (plan.data_bytes in all). Returns its size, plan.image_bytes. An
    error writing the file names it (os.pwrite's own names none)."""
    try:
        with open(path, "w+b") as f:
            f.truncate(plan.image_bytes)  # zeros: the padding between tensors
            fd = f.fileno()

            def write(at: int, data: bytes | np.ndarray) -> None:
                data = memoryview(data).cast("B")
                while len(data):
                    done = os.pwrite(fd, data, at)
                    data, at = data[done:], at + done
            _fill(write, lambda at, n: os.pread(fd, n, at), plan, progress)
    except OSError as exc:
        if exc.filename is not None:  # (a checkpoint file read while writing names itself)
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    return plan.image_bytes


@dataclass
class ImagePlan:
    """Where everything goes: the table in canonical order, and the stored bytes of each placed tensor. Computed
    from the tensors' shapes and dtypes alone (plan_image), so an image's size is known before any tensor is
    converted."""
    dims: ModelDims
    entries: list[TensorEntry]
    sources: list[tuple[TensorEntry, Encoded | Deferred]]  # placed tensors (tied ones once)
    table_offset: int
    crc_offset: int
    data_offset: int
    expert_offset: int
    image_bytes: int
    expert_align: int
    meta: bytes            # the metadata section's JSON (b"": none)
    meta_offset: int

    @property
    def resident_bytes(self) -> int:
        """The resident part: everything before the routed experts a board may stream (docs/STREAMING.md)."""
        return self.expert_offset

    @property
    def data_bytes(self) -> int:
        """The bytes of the placed tensors, values and scales: what writing them goes through."""
        return sum(entry.nbytes + entry.scales_bytes for entry, _ in self.sources)


def check_runnable(d: ModelDims) -> None:
    """Refuse (ValueError naming the fields) what the verifier refuses though no family's mapping leads to it, so no
    hand-made description becomes an image that never opens (firmware/src/image.c, read_dims)."""
    if d.mla and d.kv_shared_layers:
        raise ValueError(f"kv_lora_rank={d.kv_lora_rank} with kv_shared_layers={d.kv_shared_layers}: latent attention "
                         "keeps every layer's own KV cache; the runtime shares caches for standard attention only")
    if d.global_head_dim not in (0, d.head_dim) and not d.global_rope:
        raise ValueError(f"global_head_dim={d.global_head_dim} differs from head_dim={d.head_dim} without "
                         "global_rope: the global layers need RoPE tables of their own head size")
    if d.n_layers > MAX_LAYERS:
        raise ValueError(f"{d.n_layers} layers: an image holds at most {MAX_LAYERS}")
    kinds, kind_map = d.layer_kinds()
    if len(kinds) > MAX_LAYER_KINDS:
        raise ValueError(f"{len(kinds)} kinds of layer: an image holds at most {MAX_LAYER_KINDS}")
    header = {name: getattr(d, name) for name in ("kv_lora_rank", "n_experts", "shared_ffn_size", "dense_ffn_size",
                                                  "n_group", "max_seq", "head_dim", "n_kv_heads", "n_heads",
                                                  "conv_kernel", "hidden_size", "dn_k_heads", "dn_v_heads",
                                                  "dn_k_dim", "dn_v_dim")}
    header["rope_dim"] = d.rope_width  # (as the header holds it: 0 in ModelDims is the whole head)
    try:  # the records as the verifier checks them (the reader's copy of image.c's layer_kinds)
        check_records(header, [dict(zip(LAYER_FIELDS, k)) for k in kinds], list(kind_map))
    except ImageError as exc:
        raise ValueError(f"the layers would not verify: {exc}") from None


def plan_image(dims: ModelDims, tensors: dict, expert_align: int = ALIGN,
               pinned: frozenset[tuple[int, int]] = frozenset(), meta: dict | None = None) -> ImagePlan:
    """The layout build_image and write_image give `tensors` (their arguments alike), without encoding any: its
    image_bytes and resident_bytes are the image's, exactly."""
    check_runnable(dims)
    if expert_align % ALIGN or expert_align <= 0:
        raise ValueError(f"expert_align must be a positive multiple of {ALIGN}")
    order = [key for key in canonical_order(dims) if dims.present(key[0], key[1])]
    table_offset = HEADER_BYTES
    crc_offset = align_up(table_offset + len(order) * ENTRY_BYTES) if dims.n_experts else 0
    data_offset = align_up(crc_offset + 4 * dims.n_layers * dims.n_experts) if dims.n_experts else \
        align_up(table_offset + len(order) * ENTRY_BYTES)
    entries: dict[int, TensorEntry] = {}
    sources: list[tuple[TensorEntry, Encoded]] = []
    placed: dict[int, TensorEntry] = {}  # id(tensor) -> entry, so tied tensors share bytes
    cursor = data_offset

    def streamed(role: Role, layer: int, expert: int) -> bool:
        return role in EXPERT_ROLES and (layer, expert) not in pinned

    def place(i: int, role: Role, layer: int, expert: int) -> None:
        nonlocal cursor
        src = tensors[(role, layer, expert)]
        want = expected_shape(dims, role, layer)
        if tuple(src.shape) != want:
            # llama.cpp's names: a GGUF file's own, and no index where the tensor has none
            raise ValueError(f"tensor {tensor_name(role, layer, expert)} has shape {tuple(src.shape)}; the model's "
                             f"sizes make it {want}")
        if id(src) in placed:
            first = placed[id(src)]
            entries[i] = TensorEntry(role, layer, expert, first.dtype, want, first.offset, first.nbytes,
                                     first.group_size, first.scales_offset, first.scales_bytes)
            return
        enc = src if isinstance(src, (Encoded, Deferred)) else Deferred(DType.F32, want, lambda: src)
        if enc.dtype != DType.F32 and (len(want) != 2 or role in F32_TABLES):
            raise ValueError(f"{tensor_name(role, layer, expert)} must be f32 (only matrices may be narrower)")
        if role == Role.EXPERT_GATE:
            cursor = align_up(cursor, expert_align)
        values, scales = stored_bytes(enc)
        entry = TensorEntry(role, layer, expert, enc.dtype, want, cursor, values)
        cursor = align_up(cursor + entry.nbytes)
        if enc.dtype.quantized:
            entry.group_size = enc.dtype.block
        if enc.dtype.scales_apart:
            entry.scales_offset, entry.scales_bytes = cursor, 2 * scales
            cursor = align_up(cursor + entry.scales_bytes)
        entries[i] = entry
        placed[id(src)] = entry
        sources.append((entry, enc))

    for i, key in enumerate(order):
        if not streamed(*key):
            place(i, *key)
    stream = [(i, key) for i, key in enumerate(order) if streamed(*key)]
    expert_offset = align_up(cursor, expert_align) if stream else cursor
    cursor = expert_offset
    for i, key in stream:
        place(i, *key)
    meta_bytes = json.dumps(meta, separators=(",", ":")).encode() if meta else b""
    meta_offset = align_up(cursor) if meta_bytes else 0
    image_bytes = meta_offset + len(meta_bytes) if meta_bytes else cursor
    return ImagePlan(dims, [entries[i] for i in range(len(order))], sources, table_offset, crc_offset, data_offset,
                 expert_offset, image_bytes, expert_align, meta_bytes, meta_offset)


def _fill(write: Callable[[int, bytes | np.ndarray], None], read: Callable[[int, int], bytes | memoryview],
          plan: ImagePlan, progress: Callable[[int], None] | None = None) -> None:
    """Write the planned image (into zeroed storage of plan.image_bytes) one tensor at a time through
    `write(offset, data)`, telling `progress` each one's bytes, then the table, the CRCs (summed by reading back, a
    window at a time) and the header."""
    for entry, src in plan.sources:  # one tensor in memory at a time: a Deferred one is encoded here
        try:
            enc = src.encoded() if isinstance(src, Deferred) else src
        except ValueError as exc:  # (a value no block of the dtype holds: named by the tensor)
            raise ValueError(f"{tensor_name(entry.role, entry.layer, entry.expert)}: {exc}") from None
        values = np.ascontiguousarray(enc.values).reshape(-1).view(np.uint8)
        if values.size != entry.nbytes:  # (a source whose declared shape was not its own: never into the next tensor)
            raise ValueError(f"{entry.role.name} layer={entry.layer} expert={entry.expert}: {values.size} bytes of values "
                             f"where its shape {entry.shape} holds {entry.nbytes}")
        write(entry.offset, values)
        if entry.scales_bytes:
            write(entry.scales_offset, np.ascontiguousarray(enc.scales, dtype="<f2").reshape(-1).view(np.uint8))
        if progress:
            progress(entry.nbytes + entry.scales_bytes)
    if plan.meta:
        write(plan.meta_offset, plan.meta)
    write(plan.table_offset, b"".join(e.pack() for e in plan.entries))

    def crc_of(start: int, end: int, window: int = 1 << 24) -> int:
        crc = 0
        for at in range(start, end, window):
            crc = zlib.crc32(read(at, min(window, end - at)), crc)
        return crc & 0xFFFFFFFF
    d = plan.dims
    kinds, kind_map = d.layer_kinds()
    for gate, down in expert_blocks(plan.entries):
        write(plan.crc_offset + 4 * (gate.layer * d.n_experts + gate.expert), struct.pack("<I", crc_of(gate.offset, down.end)))
    header = dict(
        magic=MAGIC, version=VERSION, header_bytes=HEADER_BYTES, image_bytes=plan.image_bytes,
        header_crc32=0, payload_crc32=crc_of(HEADER_BYTES, plan.expert_offset),
        arch=ARCH_MOE, vocab_size=d.vocab_size, hidden_size=d.hidden_size, ffn_size=d.ffn_size,
        n_layers=d.n_layers, n_heads=d.n_heads, n_kv_heads=d.n_kv_heads, head_dim=d.head_dim,
        n_experts=d.n_experts, top_k=d.top_k, max_seq=d.max_seq,
        rms_norm_eps=d.rms_norm_eps, rope_theta=d.rope_theta,
        tensor_table_offset=plan.table_offset, n_tensors=len(plan.entries), entry_bytes=ENTRY_BYTES,
        data_offset=plan.data_offset, arena_bytes=arena_bytes(d), expert_align=plan.expert_align,
        dense_ffn_size=d.dense_ffn_size, shared_ffn_size=d.shared_ffn_size, clip_qkv=d.clip_qkv,
        kv_dtype=d.kv_dtype, expert_offset=plan.expert_offset, expert_crc_offset=plan.crc_offset,
        meta_offset=plan.meta_offset, meta_bytes=len(plan.meta), meta_crc32=crc32(plan.meta) if plan.meta else 0,
        layer_kinds=len(kinds), kinds=b"".join(LAYER_STRUCT.pack(*k) for k in kinds), layer_kind=kind_map,
        q_lora_rank=d.q_lora_rank, kv_lora_rank=d.kv_lora_rank, rope_dim=d.rope_width, v_head_dim=d.v_dim,
        attn_scale=d.scale, n_group=d.n_group, topk_group=d.topk_group, group_top=d.group_top,
        routed_scale=d.routed_scale, swiglu_alpha=d.swiglu_alpha, swiglu_limit=d.swiglu_limit,
        embed_scale=d.embed_scale, logit_softcap=d.logit_softcap, ple_dim=d.ple_dim, conv_kernel=d.conv_kernel,
        dn_k_heads=d.dn_k_heads, dn_v_heads=d.dn_v_heads, dn_k_dim=d.dn_k_dim, dn_v_dim=d.dn_v_dim,
        topk_norm_eps=d.topk_norm_eps if d.n_experts else 0.0,
    )
    write(0, header_block(header))
