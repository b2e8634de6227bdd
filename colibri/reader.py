"""The image reader: the header, the layer records, the table and the CRCs checked as the verifier checks them, into
an Image (the dimensions, the entries and the bytes, never copied) (docs/FORMAT.md)."""
from __future__ import annotations

import functools
import json
import operator
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from colibri.dims import ModelDims, align_up, canonical_order, expected_shape, flags_of_record
from colibri.format import (ALIGN, ENTRY_BYTES, F32_TABLES, FOLLOWS, HEADER_BYTES, HEADER_FIELDS, LAYER_ATTN_DELTA_NET,
                            LAYER_ATTN_LATENT, LAYER_ATTN_SHORT_CONV, LAYER_ATTN_STANDARD, LAYER_BYTES, LAYER_ENUMS,
                            LAYER_EXPERT_OPTIONS, LAYER_FFN_DENSE, LAYER_FFN_MOE, LAYER_FIELDS, LAYER_KNOWN_OPTIONS,
                            LAYER_OPT_GLOBAL_ROPE, LAYER_OPT_K_IS_V, LAYER_OPT_NORM_TOPK, LAYER_OPT_ROPE_PAIRS,
                            LAYER_ROUTER_TOPK_SOFTMAX, LAYER_STANDARD_OPTIONS, MAGIC, MAX_CONV_KERNEL, MAX_DIM,
                            MAX_EXPERTS, MAX_LAYER_KINDS, MAX_LAYERS, MAX_TOP_K, NO_INDEX, VERSION, Role)
from colibri.quant import QBLOCK, DType, Encoded
from colibri.table import (ENTRY_STRUCT, HEADER_CRC_OFFSET, HEADER_STRUCT, LAYER_STRUCT, TensorEntry, crc32,
                           entry_encoded, expert_blocks)

class ImageError(ValueError):
    """The bytes are not a valid Colibri image of the version this host reads."""


@dataclass
class Image:
    dims: ModelDims
    header: dict
    entries: list[TensorEntry]
    data: bytes | memoryview = field(repr=False)
    meta: dict | None = None  # the metadata section: tokenizer, chat template (colibri/text.py)

    def entry(self, role: Role, layer: int = NO_INDEX, expert: int = NO_INDEX) -> TensorEntry:
        for e in self.entries:
            if (e.role, e.layer, e.expert) == (role, layer, expert):
                return e
        raise KeyError(f"no tensor {role.name} layer={layer} expert={expert}")

    def encoded(self, role: Role, layer: int = NO_INDEX, expert: int = NO_INDEX) -> Encoded:
        """A tensor as stored (values and, if quantized, scales), without copying."""
        e = self.entry(role, layer, expert)
        return entry_encoded(e, self.data, self.data, e.offset, e.scales_offset)

    def tensor(self, role: Role, layer: int = NO_INDEX, expert: int = NO_INDEX) -> np.ndarray:
        """A tensor's values as float32 (exactly what the runtime computes with)."""
        enc = self.encoded(role, layer, expert)
        return enc.values if enc.dtype == DType.F32 else enc.decode()

    @property
    def resident_bytes(self) -> int:
        """Bytes read in place; routed experts past them form the expert part (docs/FORMAT.md)."""
        return self.header["expert_offset"]

    def expert_block(self, layer: int, expert: int) -> tuple[int, int]:
        """(offset, bytes) of a routed expert's block: gate, up and down with their scales."""
        gate, down = self.entry(Role.EXPERT_GATE, layer, expert), self.entry(Role.EXPERT_DOWN, layer, expert)
        return gate.offset, down.end - gate.offset

    @property
    def expert_block_bytes(self) -> int:
        """The largest routed expert block: the size of one expert cache slot."""
        return max((down.end - gate.offset for gate, down in expert_blocks(self.entries)), default=0)

    def streamed_experts(self) -> list[tuple[int, int]]:
        """(layer, expert) of every routed expert in the expert part."""
        return [(g.layer, g.expert) for g, _ in expert_blocks(self.entries) if g.offset >= self.resident_bytes]

    def bytes_by_dtype(self) -> dict[str, int]:
        """Bytes of tensor data per dtype (tied tensors counted once)."""
        out: dict[str, int] = {}
        seen = set()
        for e in self.entries:
            if e.offset not in seen:
                seen.add(e.offset)
                name = DType(e.dtype).name.lower()
                out[name] = out.get(name, 0) + e.end - e.offset
        return out


def open_image(path: Path, check_crcs: bool = True) -> Image:
    """read_image of a file through a read-only memory map: the weights are paged in only when read
    (check_crcs=False reads only the header, the table and the metadata section: the tensor bytes are
    left to the device, which checks every CRC when it opens the image)."""
    size = path.stat().st_size
    if size == 0:
        raise ImageError(f"{path} is empty")
    return read_image(np.memmap(path, dtype=np.uint8, mode="r"), check_crcs)


def check_records(h: dict, kinds: list[dict], kind_of: list[int]) -> None:
    """The layer records as the verifier checks them (image.c, layer_kinds; docs/FORMAT.md "Layers"): each record
    on its own, then each layer's kind and the KV cache it reads. ImageError names the first record refused."""
    mla, window, global_head = h["kv_lora_rank"] != 0, 0, 0
    rope, head = h["rope_dim"], h["head_dim"]  # (image.c, attention_dims)
    if rope == 0 or rope % 2 or (rope >= head if mla else rope > head):
        raise ImageError(f"rope_dim {rope} with head_dim {head}: RoPE turns an even number of a head's dims, at least "
                         "2 and at most the head (fewer than it beside latent attention)")
    for k, r in enumerate(kinds):
        def refuse(why: str) -> ImageError:
            return ImageError(f"layer record {k}: {why}")
        for name, (count, _) in LAYER_ENUMS.items():
            if r[name] >= count:
                raise refuse(f"{name} {r[name]} is not one of its {count} values")
        options, ffn, fd = r["options"], r["ffn"], r["dense_ffn"]
        if options & ~LAYER_KNOWN_OPTIONS or r["reserved"]:
            raise refuse(f"options 0x{options:X} or reserved {r['reserved']}: unknown bits")
        conv = r["attention"] in (LAYER_ATTN_SHORT_CONV, LAYER_ATTN_DELTA_NET)  # a state, no KV cache
        if mla if conv else r["attention"] != (LAYER_ATTN_LATENT if mla else LAYER_ATTN_STANDARD):
            raise refuse("its attention is not the model's (latent exactly when kv_lora_rank > 0, and then no "
                         "convolution)")
        if conv and (options & LAYER_STANDARD_OPTIONS or r["qk_norm"] or r["head_dim"] or r["kv_heads"]
                     or r["window"] or r["kv_source"] != NO_INDEX):
            raise refuse("a short convolution or DeltaNet with attention's options, norms, geometry, window or cache")
        if ffn == LAYER_FFN_DENSE and (r["router"] or r["shared"] or options & LAYER_EXPERT_OPTIONS):
            raise refuse("a dense layer with a router, a shared expert or the experts' options")
        if ffn != LAYER_FFN_DENSE and (not h["n_experts"] or bool(r["shared"]) != bool(h["shared_ffn_size"])):
            raise refuse("experts without E > 0, or a shared expert not exactly when shared_ffn_size > 0")
        if (fd != 0 if ffn == LAYER_FFN_MOE else not (fd or h["dense_ffn_size"])) or fd > MAX_DIM:
            raise refuse("a dense width not exactly when it has a dense MLP")
        if r["router"] == LAYER_ROUTER_TOPK_SOFTMAX and (options & LAYER_OPT_NORM_TOPK or h["n_group"] != 1):
            raise refuse("the top-k softmax router with renormalization or groups")
        if r["window"] > h["max_seq"] or (r["window"] and window and r["window"] != window):
            raise refuse(f"window {r['window']}: more than max_seq, or another than an earlier layer's")
        window = r["window"] or window
        if mla:
            if r["head_dim"] or r["kv_heads"] or options & LAYER_STANDARD_OPTIONS or r["qk_norm"] \
                    or r["kv_source"] != NO_INDEX:
                raise refuse("latent attention with standard attention's geometry, options or a shared cache")
            continue
        head, kv = r["head_dim"] or h["head_dim"], r["kv_heads"] or h["n_kv_heads"]
        global_rope = options & LAYER_OPT_GLOBAL_ROPE
        if head % 2 or head > MAX_DIM or not kv or kv > MAX_DIM or h["n_heads"] % kv or \
                (head != h["head_dim"] and not global_rope) or (global_rope and global_head and head != global_head):
            raise refuse(f"head size {head} or {kv} KV heads (even, dividing the heads; a size of its own only "
                         "with GLOBAL_ROPE, the same in every such layer)")
        global_head = head if global_rope else global_head
    attention_options = LAYER_STANDARD_OPTIONS | LAYER_OPT_ROPE_PAIRS  # those a sharer and its source agree on
    resolved = [(r["head_dim"] or h["head_dim"], r["kv_heads"] or h["n_kv_heads"], r["window"],
                 r["options"] & attention_options) for r in kinds]
    convs = sum(kinds[k]["attention"] == LAYER_ATTN_SHORT_CONV for k in kind_of)
    deltas = sum(kinds[k]["attention"] == LAYER_ATTN_DELTA_NET for k in kind_of)
    if bool(convs + deltas) != bool(h["conv_kernel"]) or not (h["conv_kernel"] == 0 or 2 <= h["conv_kernel"] <= MAX_CONV_KERNEL) \
            or (convs and 3 * h["hidden_size"] > MAX_DIM):
        raise ImageError(f"conv_kernel {h['conv_kernel']} with {convs} short convolution and {deltas} DeltaNet layers: "
                         f"2..{MAX_CONV_KERNEL} exactly when some layer convolves (and 3 * hidden_size <= 2^24)")
    hk, hv, dk, dv = (h[f] for f in ("dn_k_heads", "dn_v_heads", "dn_k_dim", "dn_v_dim"))
    mix = 2 * hk * dk + hv * dv + 2 * hv * dv + 2 * hv
    if (not (hk and hv and dk and dv and hv % hk == 0 and mix <= MAX_DIM)) if deltas else (hk or hv or dk or dv):
        raise ImageError(f"DeltaNet heads {hk}, {hv} of {dk}, {dv} with {deltas} DeltaNet layers: all nonzero exactly "
                         "when some layer is one, value heads a multiple of key heads, their widths <= 2^24")
    ring = NO_INDEX
    for layer, k in enumerate(kind_of):
        source = kinds[k]["kv_source"]
        if source == NO_INDEX:
            continue
        if source >= layer or kinds[kind_of[source]]["kv_source"] != NO_INDEX or \
                kinds[kind_of[source]]["attention"] != kinds[k]["attention"] or \
                resolved[kind_of[source]] != resolved[k] or (kinds[k]["window"] and ring not in (NO_INDEX, source)):
            raise ImageError(f"layer {layer} shares the KV cache of layer {source}, which is not an earlier layer "
                             "keeping its own of the same geometry, window and attention options (or another ring)")
        ring = source if kinds[k]["window"] else ring


def layer_fields(h: dict) -> dict:
    """ModelDims' records and per-layer fields from the header's layer records (docs/FORMAT.md "Layers"), checked
    as the verifier checks them. The host computes a layer from its record; the config-style fields (flags,
    windows, Gemma 4's global layers, ...) are a summary, exact only for the records a family makes (read_image
    keeps the records where those fields do not give them again): the flags are every layer's together."""
    n_layers, n_kinds = h["n_layers"], h["layer_kinds"]
    if not 1 <= n_kinds <= MAX_LAYER_KINDS or n_layers > MAX_LAYERS:
        raise ImageError(f"{n_layers} layers of {n_kinds} kinds: an image has 1 to {MAX_LAYER_KINDS} kinds and at "
                         f"most {MAX_LAYERS} layers")
    kinds = [dict(zip(LAYER_FIELDS, LAYER_STRUCT.unpack_from(h["kinds"], k * LAYER_BYTES))) for k in range(n_kinds)]
    kind_of = list(h["layer_kind"][:n_layers])
    if set(kind_of) != set(range(n_kinds)):
        raise ImageError(f"the layers' kinds are not the {n_kinds} records, each some layer's")
    if any(h["kinds"][n_kinds * LAYER_BYTES:]) or any(h["layer_kind"][n_layers:]):
        raise ImageError("bytes past the layer records or past the last layer's kind are not 0")
    check_records(h, kinds, kind_of)
    records = [kinds[k] for k in kind_of]
    windows = {r["window"] for r in records if r["window"]}
    own = [r for r in records if not r["window"]]  # Gemma 4's global layers
    return dict(records=tuple(tuple(r.values()) for r in records),
                flags=functools.reduce(operator.or_, map(flags_of_record, records), 0),
                moe_layers=tuple(r["ffn"] != LAYER_FFN_DENSE for r in records),
                sliding_window=max(windows, default=0), window_layers=tuple(bool(r["window"]) for r in records),
                global_head_dim=own[0]["head_dim"] if own else 0, global_kv_heads=own[0]["kv_heads"] if own else 0,
                kv_shared_layers=sum(r["kv_source"] != NO_INDEX for r in records),
                double_wide_mlp=any(r["dense_ffn"] for r in records),
                k_eq_v=any(r["options"] & LAYER_OPT_K_IS_V for r in records),
                global_rope=any(r["options"] & LAYER_OPT_GLOBAL_ROPE for r in records),
                conv_layers=tuple(r["attention"] == LAYER_ATTN_SHORT_CONV for r in records),
                delta_layers=tuple(r["attention"] == LAYER_ATTN_DELTA_NET for r in records))


def storage_problem(e: TensorEntry) -> str | None:
    """What the verifier refuses in how an entry stores its dtype (table.c, check_entry; docs/FORMAT.md "Dtypes"), in
    words; None when nothing: a narrow dtype only for a matrix not read as floats, a K-quant row of whole blocks, the
    group, bytes and scales its shape takes in its dtype."""
    dtype = DType(e.dtype)
    if dtype != DType.F32 and (len(e.shape) != 2 or e.role in F32_TABLES):
        return f"{dtype.name} where only F32 may be (a vector, or a table read as floats)"
    rows, cols = e.shape[0], e.shape[1] if len(e.shape) == 2 else 1
    if dtype.block > QBLOCK and cols % dtype.block:
        return f"{dtype.name} rows of {cols} values, not whole {dtype.block}-element blocks"
    blocks = rows * -(-cols // dtype.block)
    want = (dtype.block if dtype.quantized else 0, blocks * dtype.block_bytes, 2 * blocks if dtype.scales_apart else 0)
    if (e.group_size, e.nbytes, e.scales_bytes) != want:
        return (f"group_size {e.group_size}, bytes {e.nbytes}, scales_bytes {e.scales_bytes} where {dtype.name} of "
                f"shape {e.shape} takes {want[0]}, {want[1]}, {want[2]}")
    scales_at = align_up(e.offset + e.nbytes, ALIGN) if dtype.scales_apart else 0
    if e.scales_offset != scales_at:
        return f"scales_offset {e.scales_offset} where {dtype.name} takes {scales_at}"
    return None


def read_image(data: bytes | np.ndarray, check_crcs: bool = True) -> Image:
    """Parse and check an image (header, CRCs, table order, presence, shapes, bounds): bytes, or a
    read-only np.memmap of an image file (open_image)."""
    if len(data) < HEADER_BYTES:
        raise ImageError(f"image is {len(data)} bytes, shorter than its {HEADER_BYTES}-byte header")
    h = dict(zip(HEADER_FIELDS, HEADER_STRUCT.unpack_from(data, 0)))
    if h["magic"] != MAGIC:
        raise ImageError("bad magic: not a Colibri image")
    if h["version"] != VERSION:
        raise ImageError(f"format version {h['version']}; this host reads version {VERSION} only: "
                         "pack the checkpoint again with host/pack.py")
    hdr = bytearray(data[:HEADER_BYTES])
    struct.pack_into("<I", hdr, HEADER_CRC_OFFSET, 0)
    if crc32(hdr) != h["header_crc32"]:
        raise ImageError("header CRC mismatch")
    if h["image_bytes"] > len(data):
        raise ImageError(f"image is truncated: header says {h['image_bytes']} bytes, got {len(data)}")
    if not h["tensor_table_offset"] <= h["expert_offset"] <= h["image_bytes"]:
        raise ImageError(f"expert part offset {h['expert_offset']} is outside the image")
    if check_crcs and crc32(memoryview(data)[HEADER_BYTES:h["expert_offset"]]) != h["payload_crc32"]:
        raise ImageError("payload CRC mismatch")
    meta: dict | None = None
    if h["meta_bytes"]:
        end = h["meta_offset"] + h["meta_bytes"]
        if h["meta_offset"] < h["expert_offset"] or end > h["image_bytes"]:
            raise ImageError("metadata section outside the image")
        raw = bytes(memoryview(data)[h["meta_offset"]:end])
        if crc32(raw) != h["meta_crc32"]:  # small: always checked
            raise ImageError("metadata section CRC mismatch")
        try:
            meta = json.loads(raw)
        except ValueError as exc:
            raise ImageError(f"metadata section is not JSON: {exc}") from None
    n_layers, n_experts = h["n_layers"], h["n_experts"]
    if h["tensor_table_offset"] + h["n_tensors"] * ENTRY_BYTES > h["image_bytes"]:
        raise ImageError(f"the tensor table ({h['n_tensors']} entries) ends past the image")
    # every layer lists its attention norm: more layers than entries is refused before anything per layer is built
    if n_layers > h["n_tensors"] or n_experts > MAX_EXPERTS:
        raise ImageError(f"{n_layers} layers of {n_experts} experts in a table of {h['n_tensors']} entries")
    top_k, ffn = h["top_k"], h["ffn_size"]
    if (not (1 <= top_k <= n_experts and ffn) if n_experts else top_k or ffn) or top_k > MAX_TOP_K:
        raise ImageError(f"top_k {top_k} of {n_experts} experts of size {ffn}: with experts 1 <= top_k <= their "
                         f"count (at most {MAX_TOP_K}) and a size, without them both 0")
    eps = h["topk_norm_eps"]
    if not (0.0 <= eps < 1.0 if n_experts else struct.pack("<f", eps) == bytes(4)):  # (NaN fails both)
        raise ImageError(f"topk_norm_eps {eps}: 0 <= eps < 1 with experts, else 0")
    table_end, data_offset = h["tensor_table_offset"] + h["n_tensors"] * ENTRY_BYTES, h["data_offset"]
    if data_offset % ALIGN or not table_end <= data_offset <= h["expert_offset"]:
        raise ImageError(f"data_offset {data_offset} is not aligned, or not between the tensor table's end ({table_end}) "
                         f"and the expert part ({h['expert_offset']})")
    raw = [ENTRY_STRUCT.unpack_from(data, h["tensor_table_offset"] + i * ENTRY_BYTES) for i in range(h["n_tensors"])]
    dims = ModelDims(**{k: h[k] for k in (
        "vocab_size", "hidden_size", "ffn_size", "n_layers", "n_heads", "n_kv_heads", "head_dim",
        "n_experts", "top_k", "max_seq", "rms_norm_eps", "rope_theta", "dense_ffn_size",
        "shared_ffn_size", "clip_qkv", "kv_dtype", "q_lora_rank", "kv_lora_rank", "rope_dim",
        "v_head_dim", "attn_scale", "n_group", "topk_group", "group_top", "routed_scale", "swiglu_alpha",
        "swiglu_limit", "embed_scale", "logit_softcap", "ple_dim", "conv_kernel", "topk_norm_eps", "dn_k_heads",
        "dn_v_heads", "dn_k_dim", "dn_v_dim")},
        **layer_fields(h))
    try:  # records the config-style fields give again are left to them: a dims changed by replace() follows its fields
        derived = tuple(replace(dims, records=()).layer_record(layer) for layer in range(n_layers))
    except ValueError:  # a sharing layer with no earlier layer of its kind to share: not a family's layout
        derived = ()
    if derived == dims.records:
        dims = replace(dims, records=())
    order = (key for key in canonical_order(dims) if dims.present(key[0], key[1]))  # walked with the table: a short
    entries = []                                                                    # table ends it
    # where tensor bytes may lie (table.c, check_entry and table_walk): from data_offset on; a resident tensor within
    # the resident part, a routed expert's anywhere before the metadata section, its block wholly in one tier
    tensors_end = h["meta_offset"] if h["meta_bytes"] else h["image_bytes"]
    prev_end = block_start = 0
    for i, (role, layer, expert) in enumerate(order):
        if i == len(raw):
            raise ImageError(f"{len(raw)} tensors listed, the dimensions and layer records need more")
        role_, dtype, layer_, expert_, ndims, dim0, dim1, group, _, off, nbytes, s_off, s_bytes = raw[i]
        try:
            e = TensorEntry(Role(role_), layer_, expert_, DType(dtype), (dim0, dim1)[:ndims], off, nbytes,
                            group, s_off, s_bytes)
        except ValueError as exc:
            raise ImageError(f"table entry {i}: {exc}") from None
        if (e.role, e.layer, e.expert) != (role, layer, expert):
            raise ImageError(f"table entry {i} is {e.role.name}/{e.layer}/{e.expert}, expected {role.name}/{layer}/{expert}")
        if e.shape != expected_shape(dims, role, layer):
            raise ImageError(f"table entry {i} ({role.name}) has shape {e.shape}")
        if (problem := storage_problem(e)) is not None:
            raise ImageError(f"table entry {i} ({role.name}): {problem}")
        limit = tensors_end if expert != NO_INDEX else h["expert_offset"]
        if e.offset % ALIGN or e.offset < data_offset or e.end > limit:
            raise ImageError(f"table entry {i} ({role.name}) is misaligned or out of bounds: bytes [{e.offset}, {e.end}) "
                             f"where [{data_offset}, {limit}) may hold it")
        if role in FOLLOWS and e.offset != align_up(prev_end, ALIGN):
            raise ImageError(f"table entry {i} ({role.name}) does not start where the matrix before it ends "
                             f"({align_up(prev_end, ALIGN)}): a SwiGLU block's matrices are one read")
        prev_end = e.end
        block_start = e.offset if role == Role.EXPERT_GATE else block_start
        if role == Role.EXPERT_DOWN and block_start < h["expert_offset"] < e.end:
            raise ImageError(f"expert {expert} of layer {layer}: its block starts in the resident part and ends past it")
        entries.append(e)
    if len(entries) != len(raw):
        raise ImageError(f"{len(raw)} tensors listed, the dimensions and layer records need {len(entries)}")
    for gate, down in expert_blocks(entries if check_crcs else []):
        at = h["expert_crc_offset"] + 4 * (gate.layer * n_experts + gate.expert)
        if crc32(memoryview(data)[gate.offset:down.end]) != struct.unpack_from("<I", data, at)[0]:
            raise ImageError(f"expert {gate.expert} of layer {gate.layer}: block CRC mismatch")
    # a view, not a copy: a memory-mapped image file stays on disk
    return Image(dims, h, entries, memoryview(data)[:h["image_bytes"]], meta)
