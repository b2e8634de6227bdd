"""The C image verifier against crafted images: each corruption gets its own status."""
from __future__ import annotations

import struct
from dataclasses import replace

import numpy as np
import pytest

from capi import STATUS, Lib
from colibri import image as im
from colibri.dims import FLAG_GEMMA4_LAYER
from colibri.format import (ENTRY_OFFSETS, LAYER_BYTES, LAYER_ENUMS, LAYER_FFN_DENSE, LAYER_FFN_MOE_AND_DENSE,
                            LAYER_KNOWN_OPTIONS, LAYER_OPT_ATTN_SINKS, LAYER_OPT_EXPERT_BIAS, LAYER_OPT_GLOBAL_ROPE,
                            LAYER_OPT_K_IS_V, LAYER_OPT_ROUTER_BIAS, LAYER_ROUTER_SIGMOID,
                            LAYER_ROUTER_TOPK_SOFTMAX, LAYER_SHARED_PLAIN)
from colibri.image import ENTRY_BYTES, HEADER_BYTES, HEADER_CRC_OFFSET, HEADER_OFFSETS, crc32, read_image
from colibri.rope import tables as rope_tables
from colibri.schema import load as load_schema

TABLE = HEADER_BYTES  # the packer puts the tensor table right after the header


def reseal(buf: bytearray) -> bytearray:
    """Recompute the header and payload CRCs (the payload is the resident part), so a test reaches the
    checks behind them."""
    resident = min(struct.unpack_from("<Q", buf, HEADER_OFFSETS["expert_offset"])[0], len(buf))
    struct.pack_into("<I", buf, HEADER_OFFSETS["payload_crc32"], crc32(buf[HEADER_BYTES:resident]))
    struct.pack_into("<I", buf, HEADER_CRC_OFFSET, 0)
    struct.pack_into("<I", buf, HEADER_CRC_OFFSET, crc32(buf[:HEADER_BYTES]))
    return buf


def put(fmt: str, offset: int, value, seal: bool = True):
    def mutate(b: bytearray) -> bytearray:
        struct.pack_into(fmt, b, offset, value)
        return reseal(b) if seal else b
    return mutate


FIELD_FORMAT = {f.name: "<" + f.struct_code for f in load_schema().header}


LAYER_FIELD = {f.name: ("<" + f.struct_code, f.offset) for f in load_schema().layer}


def kind(k: int, name: str, value, seal: bool = True):
    """A mutation setting field `name` of layer record k (format/schema.toml [[layer]])."""
    fmt, offset = LAYER_FIELD[name]
    return put(fmt, HEADER_OFFSETS["kinds"] + k * LAYER_BYTES + offset, value, seal)


def with_options(k: int, bits: int, seal: bool = True):
    """A mutation adding option bits to layer record k."""
    fmt, offset = LAYER_FIELD["options"]
    def mutate(b: bytearray) -> bytearray:
        at = HEADER_OFFSETS["kinds"] + k * LAYER_BYTES + offset
        return put(fmt, at, struct.unpack_from(fmt, b, at)[0] | bits, seal)(b)
    return mutate


def second_kind(b: bytearray) -> bytearray:
    """Layer 1 given a kind of its own, a copy of layer 0's (unsealed): a mutation then changes it alone."""
    at = HEADER_OFFSETS["kinds"]
    b[at + LAYER_BYTES:at + 2 * LAYER_BYTES] = b[at:at + LAYER_BYTES]
    b[HEADER_OFFSETS["layer_kind"] + 1] = 1
    return field("layer_kinds", 2, seal=False)(b)


def entry(i: int, name: str) -> int:
    """Where table entry i's field `name` is (format/schema.toml)."""
    return TABLE + i * ENTRY_BYTES + ENTRY_OFFSETS[name]


def get(b: bytes | bytearray, name: str):
    """Header field `name` (its place and type from format/schema.toml)."""
    return struct.unpack_from(FIELD_FORMAT[name], b, HEADER_OFFSETS[name])[0]


def field(name: str, value, seal: bool = True):
    """A mutation setting header field `name` to `value` (and resealing the CRCs unless told not to)."""
    return put(FIELD_FORMAT[name], HEADER_OFFSETS[name], value, seal)


def index_of(b: bytes | bytearray, role: im.Role, layer: int, expert: int = im.NO_INDEX) -> int:
    """The table entry listing (role, layer, expert): the table holds the present tensors only."""
    n = get(b, "n_tensors")
    keys = [struct.unpack_from("<HHII", b, entry(i, "role")) for i in range(n)]
    return next(i for i, (r, _, l, e) in enumerate(keys) if (r, l, e) == (role, layer, expert))


def swap_entries(b: bytearray) -> bytearray:
    a, c = entry(3, "role"), entry(4, "role")
    b[a:a + ENTRY_BYTES], b[c:c + ENTRY_BYTES] = b[c:c + ENTRY_BYTES], b[a:a + ENTRY_BYTES]
    return reseal(b)


def flip(offset: int):
    def mutate(b: bytearray) -> bytearray:
        b[offset] ^= 0x40
        return b
    return mutate


def overlap_up_with_gate(b: bytearray) -> bytearray:
    """Point expert 0's up matrix at its gate matrix: in bounds and aligned, but not contiguous."""
    up = index_of(b, im.Role.EXPERT_UP, 0, 0)
    gate_offset = struct.unpack_from("<Q", b, entry(up - 1, "offset"))[0]
    return put("<Q", entry(up, "offset"), gate_offset)(b)


# Entry 0 is the token embedding, entry 3 layer 0's attention norm.
CASES = [
    ("shorter than header", lambda b: b[:100], "E_IMAGE_TRUNCATED"),
    ("truncated", lambda b: b[:-64], "E_IMAGE_TRUNCATED"),
    ("image_bytes huge", field("image_bytes", 1 << 62), "E_IMAGE_TRUNCATED"),
    ("bad magic", flip(0), "E_IMAGE_MAGIC"),
    ("version 1", field("version", 1), "E_IMAGE_VERSION"),
    ("version 2", field("version", 2), "E_IMAGE_VERSION"),
    ("version 3", field("version", 3), "E_IMAGE_VERSION"),
    ("version 4", field("version", 4), "E_IMAGE_VERSION"),
    ("version 5", field("version", 5), "E_IMAGE_VERSION"),
    ("version 6", field("version", 6), "E_IMAGE_VERSION"),
    ("version 7", field("version", 7), "E_IMAGE_VERSION"),
    ("version 8", field("version", 8), "E_IMAGE_VERSION"),
    ("the next version", field("version", im.VERSION + 1, seal=False), "E_IMAGE_VERSION"),
    ("header byte flipped", flip(40), "E_IMAGE_HEADER_CRC"),
    ("resident byte flipped", lambda b: flip(get(b, "data_offset") + 5)(b), "E_IMAGE_PAYLOAD_CRC"),
    ("expert byte flipped", lambda b: flip(len(b) - 5)(b), "E_EXPERT_CRC"),  # the last expert's down matrix
    ("expert CRC entry flipped", lambda b: reseal(flip(get(b, "expert_crc_offset") + 1)(b)), "E_EXPERT_CRC"),
    ("expert part past the end", lambda b: field("expert_offset", len(b) + 64)(b), "E_IMAGE_HEADER"),
    ("expert part misaligned", lambda b: field("expert_offset", get(b, "expert_offset") - 4)(b), "E_IMAGE_HEADER"),
    ("expert CRC table in the tensor table", field("expert_crc_offset", TABLE), "E_IMAGE_HEADER"),
    ("resident tensor in the expert part", lambda b: put("<Q", entry(0, "offset"), get(b, "expert_offset"))(b),
     "E_IMAGE_BOUNDS"),
    ("table byte flipped", flip(TABLE + 33), "E_IMAGE_PAYLOAD_CRC"),
    ("reserved header byte", put("<B", HEADER_OFFSETS["reserved"] + 4, 1), "E_IMAGE_HEADER"),
    # the layer records (format/schema.toml [[layer]]); the base image has one kind, MoE layers with NORM_TOPK
    ("no layer kinds", field("layer_kinds", 0), "E_IMAGE_DIMS"),
    ("nine layer kinds", field("layer_kinds", 9), "E_IMAGE_DIMS"),
    ("a layer of a kind past the records", put("<B", HEADER_OFFSETS["layer_kind"] + 1, 1), "E_IMAGE_DIMS"),
    ("257 layers", field("n_layers", 257), "E_IMAGE_DIMS"),
    ("odd layer head size", kind(0, "head_dim", 7), "E_IMAGE_DIMS"),
    ("layer KV heads that do not divide the heads", kind(0, "kv_heads", 3), "E_IMAGE_DIMS"),
    ("a head size of its own without its RoPE tables", kind(0, "head_dim", 12), "E_IMAGE_DIMS"),
    ("latent attention in a model without it", kind(0, "attention", 1), "E_IMAGE_DIMS"),
    ("an unknown feed-forward block", kind(0, "ffn", 3), "E_IMAGE_DIMS"),
    ("a dense layer without a width", kind(0, "ffn", LAYER_FFN_DENSE), "E_IMAGE_DIMS"),
    ("a width on a MoE layer", kind(0, "dense_ffn", 8), "E_IMAGE_DIMS"),
    ("a reserved record byte", kind(0, "reserved", 1), "E_IMAGE_DIMS"),
    ("an unknown layer option", with_options(0, LAYER_KNOWN_OPTIONS + 1), "E_IMAGE_DIMS"),
    *((f"an unknown {name} value", kind(0, name, count), "E_IMAGE_DIMS") for name, (count, _) in LAYER_ENUMS.items()),
    ("keys as values the table contradicts", with_options(0, LAYER_OPT_K_IS_V), "E_IMAGE_TABLE"),
    ("global RoPE without its tables", with_options(0, LAYER_OPT_GLOBAL_ROPE), "E_IMAGE_TABLE"),
    ("KV sharing the table contradicts", lambda b: kind(1, "kv_source", 0)(second_kind(b)), "E_IMAGE_TABLE"),
    ("KV sharing with a later layer", lambda b: kind(0, "kv_source", 1)(second_kind(b)), "E_IMAGE_DIMS"),
    ("a dense layer with a router", lambda b: kind(0, "router", LAYER_ROUTER_SIGMOID)(
        kind(0, "options", 0, seal=False)(kind(0, "dense_ffn", 8, seal=False)(kind(0, "ffn", LAYER_FFN_DENSE, seal=False)(b)))),
     "E_IMAGE_DIMS"),
    ("a dense layer with the experts' options", lambda b: kind(0, "dense_ffn", 8)(kind(0, "ffn", LAYER_FFN_DENSE, seal=False)(b)),
     "E_IMAGE_DIMS"),
    ("a dense layer with a shared expert", lambda b: kind(0, "shared", LAYER_SHARED_PLAIN)(
        kind(0, "options", 0, seal=False)(kind(0, "dense_ffn", 8, seal=False)(kind(0, "ffn", LAYER_FFN_DENSE, seal=False)(b)))),
     "E_IMAGE_DIMS"),
    ("a window longer than max_seq", kind(0, "window", 49), "E_IMAGE_DIMS"),
    ("two windows", lambda b: kind(1, "window", 4)(kind(0, "window", 3, seal=False)(second_kind(b))), "E_IMAGE_DIMS"),
    ("a window the plan does not know", kind(0, "window", 3), "E_IMAGE_PLAN"),
    ("a second kind the same as the first", lambda b: reseal(second_kind(b)), "OK"),
    ("a record no layer has", lambda b: put("<B", HEADER_OFFSETS["layer_kind"] + 1, 0)(second_kind(b)), "E_IMAGE_DIMS"),
    ("a byte past the records", put("<B", HEADER_OFFSETS["kinds"] + LAYER_BYTES + 5, 1), "E_IMAGE_DIMS"),
    ("a kind past the last layer", put("<B", HEADER_OFFSETS["layer_kind"] + 2, 1), "E_IMAGE_DIMS"),
    # Gemma 4's fields and its experts beside a dense MLP
    ("embedding scale NaN", field("embed_scale", float("nan")), "E_IMAGE_DIMS"),
    ("logit cap negative", field("logit_softcap", -30.0), "E_IMAGE_DIMS"),
    ("per-layer inputs the table lacks", field("ple_dim", 4), "E_IMAGE_TABLE"),
    ("experts beside a dense MLP without its width", kind(0, "ffn", LAYER_FFN_MOE_AND_DENSE), "E_IMAGE_DIMS"),
    # gpt-oss's expert activation and router
    ("SwiGLU limit without alpha", field("swiglu_limit", 7.0), "E_IMAGE_DIMS"),
    ("SwiGLU alpha NaN", lambda b: field("swiglu_alpha", float("nan"))(field("swiglu_limit", 7.0, seal=False)(b)), "E_IMAGE_DIMS"),
    ("SwiGLU limit negative", lambda b: field("swiglu_alpha", 1.7)(field("swiglu_limit", -1.0, seal=False)(b)), "E_IMAGE_DIMS"),
    ("top-k softmax with renormalization", kind(0, "router", LAYER_ROUTER_TOPK_SOFTMAX), "E_IMAGE_DIMS"),
    ("top-k softmax with groups", lambda b: kind(0, "router", LAYER_ROUTER_TOPK_SOFTMAX)(
        kind(0, "options", 0, seal=False)(field("n_group", 2, seal=False)(b))), "E_IMAGE_DIMS"),
    ("sinks the table lacks", with_options(0, LAYER_OPT_ATTN_SINKS), "E_IMAGE_TABLE"),
    ("expert biases the table lacks", with_options(0, LAYER_OPT_EXPERT_BIAS), "E_IMAGE_TABLE"),
    # attention and routing fields; the base image: 4 heads of 6, 2 KV heads, 4 experts, top-2
    ("q-LoRA without latent attention", field("q_lora_rank", 8), "E_IMAGE_DIMS"),
    ("latent attention with two KV heads", field("kv_lora_rank", 8), "E_IMAGE_DIMS"),
    ("RoPE over more than a standard head", field("rope_dim", 4096), "E_IMAGE_DIMS"),
    ("RoPE over an odd part of a standard head", field("rope_dim", 3), "E_IMAGE_DIMS"),
    ("odd rope_dim", field("rope_dim", 5), "E_IMAGE_DIMS"),
    ("values narrower than a standard head", field("v_head_dim", 4), "E_IMAGE_DIMS"),
    ("softmax scale NaN", field("attn_scale", float("nan")), "E_IMAGE_DIMS"),
    ("softmax scale zero", field("attn_scale", 0.0), "E_IMAGE_DIMS"),
    ("routed scale negative", field("routed_scale", -1.0), "E_IMAGE_DIMS"),
    ("no groups", field("n_group", 0), "E_IMAGE_DIMS"),
    ("groups that do not divide the experts", field("n_group", 3), "E_IMAGE_DIMS"),
    ("more kept groups than groups", field("topk_group", 2), "E_IMAGE_DIMS"),
    ("a group scored by more experts than it has", lambda b: field("group_top", 3)(field("n_group", 2, seal=False)(b)),
     "E_IMAGE_DIMS"),
    ("kept groups too small for top_k", lambda b: field("n_group", 4)(b), "E_IMAGE_DIMS"),
    ("plain shared expert without a size", kind(0, "shared", LAYER_SHARED_PLAIN), "E_IMAGE_DIMS"),
    ("a shared expert's size without one", field("shared_ffn_size", 8), "E_IMAGE_DIMS"),
    ("router bias the table lacks", with_options(0, LAYER_OPT_ROUTER_BIAS), "E_IMAGE_TABLE"),
    # the sliding window (176) and its layers (bitmap at 180); the base images have 2 layers, max_seq 48
    ("table offset past data", field("tensor_table_offset", 1 << 40), "E_IMAGE_HEADER"),
    ("entry size", field("entry_bytes", 32), "E_IMAGE_HEADER"),
    ("vocab zero", field("vocab_size", 0), "E_IMAGE_DIMS"),
    ("hidden absurd", field("hidden_size", 1 << 31), "E_IMAGE_DIMS"),
    ("heads not multiple of kv heads", field("n_kv_heads", 3), "E_IMAGE_DIMS"),
    ("odd head_dim", field("head_dim", 7), "E_IMAGE_DIMS"),
    ("top_k > experts", field("top_k", 9), "E_IMAGE_DIMS"),
    # the caps that bound the router's work (top_k * n_experts per layer and token); at a cap the
    # dimensions pass and the expert CRC table they need, which does not fit before the data, is what fails
    ("experts over the cap", lambda b: field("n_experts", 1025)(b), "E_IMAGE_DIMS"),
    ("experts at the cap", lambda b: field("n_experts", 1024)(b), "E_IMAGE_HEADER"),
    ("top_k over the cap", lambda b: field("top_k", 65)(field("n_experts", 100, seal=False)(b)), "E_IMAGE_DIMS"),
    ("top_k at the cap", lambda b: field("top_k", 64)(field("n_experts", 100, seal=False)(b)), "E_IMAGE_HEADER"),
    ("eps NaN", field("rms_norm_eps", float("nan")), "E_IMAGE_DIMS"),
    ("eps zero", field("rms_norm_eps", 0.0), "E_IMAGE_DIMS"),
    ("unknown arch", field("arch", 2), "E_UNSUPPORTED"),
    ("tensor count", field("n_tensors", 10), "E_IMAGE_TABLE"),
    ("last tensor left out", lambda b: field("n_tensors", get(b, "n_tensors") - 1)(b), "E_IMAGE_TABLE"),
    ("2^24 layers of 1024 experts", lambda b: field("n_layers", 1 << 24)(field("n_experts", 1024, seal=False)(b)),
     "E_IMAGE_DIMS"),
    ("entries out of order", swap_entries, "E_IMAGE_TABLE"),
    ("wrong shape", put("<I", entry(0, "dim0"), 36), "E_IMAGE_TABLE"),
    ("wrong byte size", put("<Q", entry(0, "bytes"), 4), "E_IMAGE_TABLE"),
    ("unknown dtype", put("<H", entry(0, "dtype"), 77), "E_IMAGE_DTYPE"),
    ("f16 vector", put("<H", entry(3, "dtype"), 1), "E_IMAGE_DTYPE"),            # entry 3: layer 0's attention norm
    ("q8_0 RoPE table", put("<H", entry(1, "dtype"), 3), "E_IMAGE_DTYPE"),
    ("unknown kv dtype", field("kv_dtype", 2), "E_IMAGE_DTYPE"),
    ("f16 with f32 byte count", put("<H", entry(0, "dtype"), 1), "E_IMAGE_TABLE"),
    ("group size on a float tensor", put("<I", entry(0, "group_size"), 32), "E_IMAGE_TABLE"),
    ("offset out of range", put("<Q", entry(0, "offset"), 1 << 40), "E_IMAGE_BOUNDS"),
    ("offset wraps", put("<Q", entry(0, "offset"), (1 << 64) - 64), "E_IMAGE_BOUNDS"),
    ("offset misaligned", put("<Q", entry(0, "offset"), 4096 + 4), "E_IMAGE_BOUNDS"),
    ("offset inside table", put("<Q", entry(0, "offset"), TABLE), "E_IMAGE_BOUNDS"),
    ("expert not contiguous", overlap_up_with_gate, "E_IMAGE_BOUNDS"),
    ("arena plan", field("arena_bytes", 64), "E_IMAGE_PLAN"),
]


@pytest.fixture(scope="module")
def lib(hosted_build):
    return Lib(hosted_build / "libcolibri.so")


def test_clean_image_verifies(lib, images):
    for path in images.values():
        data = path.read_bytes()
        status, info = lib.verify(data)
        assert status == 0
        assert info.arena_bytes == read_image(data).header["arena_bytes"]
        assert info.image_bytes == len(data)


@pytest.mark.parametrize("name,mutate,expected", CASES, ids=[c[0] for c in CASES])
def test_corruption_is_named(lib, images, name, mutate, expected):
    data = bytes(mutate(bytearray(images["base"].read_bytes())))
    status, _ = lib.verify(data)
    assert status == STATUS[expected], f"{name}: got status {status}"


# the corruptions only a CRC sees: the bytes of a tensor or of the expert CRC table
CRC_ONLY = {"resident byte flipped", "expert byte flipped", "expert CRC entry flipped"}


@pytest.mark.parametrize("name,mutate,expected", CASES, ids=[c[0] for c in CASES])
def test_inspect_checks_everything_but_the_tensor_crcs(lib, images, name, mutate, expected):
    """colibri_image_inspect (how the hosted board sizes its arena without a pass over the weights):
    the verifier's status for every corruption of the header and the table, OK and the same facts when
    only tensor bytes changed."""
    clean = images["base"].read_bytes()
    status, info = lib.verify(bytes(mutate(bytearray(clean))), inspect_only=True)
    if name in CRC_ONLY:
        assert status == 0, name
        _, want = lib.verify(clean)
        facts = [f for f, _ in info._fields_ if f != "payload_crc32"]  # resealed after a CRC table change
        assert [getattr(info, f) for f in facts] == [getattr(want, f) for f in facts]
    elif name == "table byte flipped":  # moves tensor 0 by 256 bytes: still in bounds and aligned, so only
        assert status == 0                # the payload CRC saw it
    else:
        assert status == STATUS[expected], f"{name}: got status {status}"


# Q8_0 images: the scales must follow the values exactly, and the sizes must be the dtype's
Q8_CASES = [
    ("scales moved", lambda b: put("<Q", entry(0, "scales_offset"), struct.unpack_from("<Q", b, entry(0, "scales_offset"))[0] + 64)(b),
     "E_IMAGE_BOUNDS"),
    ("scales past the end", lambda b: put("<Q", entry(0, "scales_offset"), len(b) - 64)(b), "E_IMAGE_BOUNDS"),
    ("scale bytes", lambda b: put("<Q", entry(0, "scales_bytes"), struct.unpack_from("<Q", b, entry(0, "scales_bytes"))[0] - 2)(b),
     "E_IMAGE_TABLE"),
    ("group size 16", put("<I", entry(0, "group_size"), 16), "E_IMAGE_TABLE"),
    ("q8_0 read as q4_0", put("<H", entry(0, "dtype"), 4), "E_IMAGE_TABLE"),
    ("q8_0 read as f32", put("<H", entry(0, "dtype"), 0), "E_IMAGE_TABLE"),
]


@pytest.fixture(scope="module")
def q8_image(checkpoints, tmp_path_factory):
    from colibri.pack import pack
    from colibri.quant import DType
    path = tmp_path_factory.mktemp("q8") / "base-q8_0.img"
    pack(checkpoints["base"], path, 48, 64, dtype=DType.Q8_0, measure_quality=False)
    return path.read_bytes()


def test_quantized_image_verifies(lib, q8_image):
    assert lib.verify(q8_image)[0] == 0
    assert read_image(q8_image).entries[0].scales_bytes > 0


@pytest.mark.parametrize("name,mutate,expected", Q8_CASES, ids=[c[0] for c in Q8_CASES])
def test_quantized_corruption_is_named(lib, q8_image, name, mutate, expected):
    status, _ = lib.verify(bytes(mutate(bytearray(q8_image))))
    assert status == STATUS[expected], f"{name}: got status {status}"


def test_statuses_are_distinct():
    assert len({c[2] for c in CASES}) >= 12


# An image with a metadata section (tokenizer, chat template: colibri/text.py) at its end
META_CASES = [
    ("metadata byte flipped", lambda b: flip(len(b) - 3)(b), "E_IMAGE_PAYLOAD_CRC"),
    ("metadata misaligned", lambda b: field("meta_offset", get(b, "meta_offset") + 8)(b), "E_IMAGE_HEADER"),
    ("metadata past the end", lambda b: field("meta_bytes", 1 << 20)(b), "E_IMAGE_HEADER"),
    ("metadata inside the resident part", lambda b: field("meta_offset", get(b, "expert_offset") - 64)(b),
     "E_IMAGE_HEADER"),
    ("metadata offset without bytes", lambda b: field("meta_bytes", 0)(b), "E_IMAGE_HEADER"),
]


@pytest.fixture(scope="module")
def meta_image(checkpoints):
    from colibri.checkpoint import load_checkpoint
    from colibri.image import build_image
    ckpt = load_checkpoint(checkpoints["base"], 24)
    return build_image(ckpt.dims, ckpt.tensors, meta={"tokenizer": {"model": {"type": "WordLevel"}}})


def test_image_with_metadata_verifies(lib, meta_image):
    assert lib.verify(meta_image)[0] == 0
    assert read_image(meta_image).meta == {"tokenizer": {"model": {"type": "WordLevel"}}}


@pytest.mark.parametrize("name,mutate,expected", META_CASES, ids=[c[0] for c in META_CASES])
def test_metadata_corruption_is_named(lib, meta_image, name, mutate, expected):
    status, _ = lib.verify(bytes(mutate(bytearray(meta_image))))
    assert status == STATUS[expected], f"{name}: got status {status}"


ROPE_TABLES = (im.Role.ROPE_COS, im.Role.ROPE_SIN, im.Role.GLOBAL_ROPE_COS, im.Role.GLOBAL_ROPE_SIN)
TINY = dict(  # two dense layers, two heads sharing one KV head, 48 positions
    vocab_size=11, hidden_size=8, ffn_size=0, n_layers=2, n_heads=2, n_kv_heads=1, n_experts=0, top_k=0, max_seq=48,
    rms_norm_eps=1e-5, rope_theta=10000.0, dense_ffn_size=10, moe_layers=(False, False))


def random_tensors(dims: im.ModelDims, seed: int = 0) -> dict:
    """Every tensor `dims` has, in f32: N(0, 1/in) matrices, vectors near 1, RoPE tables of their width."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for role, layer, expert in im.canonical_order(dims):
        if not dims.present(role, layer):
            continue
        shape = im.expected_shape(dims, role, layer)
        if role in ROPE_TABLES:
            width = 2 * shape[1]
            cos, sin = rope_tables(1.0 / 10000.0 ** (np.arange(0, width, 2) / width), 1.0, dims.max_seq)
            tensors[(role, layer, expert)] = cos if role in (im.Role.ROPE_COS, im.Role.GLOBAL_ROPE_COS) else sin
        elif len(shape) == 1:
            tensors[(role, layer, expert)] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            tensors[(role, layer, expert)] = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
    return tensors


# Combinations the runtime does not implement, crafted as the packer would write them if it allowed them: before
# the verifier refused them, each was accepted and read or wrote outside the image or the arena
# (tests/test_sanitizers.py runs them under AddressSanitizer).
def mla_sharing_image() -> bytes:
    """Two dense layers of latent attention (kv_lora 4, rope_dim 4) in Gemma 4's layer, the second sharing the
    first one's KV cache: the plan gives it no KV rows, but latent attention stores and reads its own."""
    dims = im.ModelDims(**TINY, head_dim=8, flags=im.FLAG_GEMMA4_LAYER, kv_lora_rank=4, rope_dim=4, v_head_dim=4)
    buf = bytearray(im.build_image(dims, random_tensors(dims)))
    kind(1, "kv_source", 0, seal=False)(second_kind(buf))  # changes no tensor of latent attention
    struct.pack_into("<Q", buf, HEADER_OFFSETS["arena_bytes"], im.arena_bytes(replace(dims, kv_shared_layers=1)))
    return bytes(reseal(buf))


def global_head_without_rope_image() -> bytes:
    """Two global layers of head size 8 where head_dim is 4, rotated with ROPE_COS/SIN ([max_seq, 2]) because the
    GLOBAL_ROPE option and its tables ([max_seq, 4]) were taken out; ROPE_SIN moved to the image's last bytes (a
    legal place), so rope()'s four values a row read past the image at the last position."""
    dims = im.ModelDims(**TINY, head_dim=4, global_head_dim=8, global_rope=True, flags=im.FLAG_GEMMA4_LAYER)
    buf = bytearray(im.build_image(dims, random_tensors(dims)))
    entries = read_image(bytes(buf)).entries
    index = {e.role: i for i, e in enumerate(entries) if e.layer == im.NO_INDEX}
    assert index[im.Role.GLOBAL_ROPE_SIN] == len(entries) - 1 == index[im.Role.GLOBAL_ROPE_COS] + 1
    fmt, offset = LAYER_FIELD["options"]
    at = HEADER_OFFSETS["kinds"] + offset
    struct.pack_into(fmt, buf, at, struct.unpack_from(fmt, buf, at)[0] & ~LAYER_OPT_GLOBAL_ROPE)
    field("n_tensors", len(entries) - 2, seal=False)(buf)  # the global tables, the table's last two entries
    sin = entries[index[im.Role.ROPE_SIN]]
    assert len(buf) == entries[index[im.Role.GLOBAL_ROPE_SIN]].end and (len(buf) - sin.nbytes) % 64 == 0
    struct.pack_into("<Q", buf, entry(index[im.Role.ROPE_SIN], "offset"), len(buf) - sin.nbytes)
    return bytes(reseal(buf))


@pytest.mark.parametrize("make", [mla_sharing_image, global_head_without_rope_image])
def test_combination_outside_the_arena_or_image_is_refused(lib, make):
    status, _ = lib.verify(make())
    assert status == STATUS["E_IMAGE_DIMS"], f"got status {status}"


@pytest.mark.parametrize("changes,field", [
    (dict(head_dim=8, flags=im.FLAG_GEMMA4_LAYER, kv_lora_rank=4, rope_dim=4, v_head_dim=4, kv_shared_layers=1),
     "kv_shared_layers=1"),
    (dict(head_dim=4, global_head_dim=8, flags=0), "global_head_dim=8"),
    (dict(head_dim=6, rope_dim=8), "rope_dim 8"),
], ids=["latent attention with KV sharing", "global head size without its RoPE tables", "RoPE past the head"])
def test_the_image_writer_refuses_them_too(changes, field):
    dims = im.ModelDims(**TINY, **changes)
    with pytest.raises(ValueError, match=field):
        im.build_image(dims, random_tensors(dims))


def test_an_expert_crc_table_that_wraps_past_2_64_is_refused(lib):
    """The expert CRC table's end, its offset plus 4 bytes per (layer, expert), must not wrap: an offset of
    2^64 - 64 with 16 (layer, expert) pairs ended at 0, passed `end <= data_offset`, and the verifier (and a
    streaming open's copy of the table) read 64 bytes before the image (ASan heap-buffer-overflow, review of
    issue 26)."""
    from colibri.quant import DType
    from colibri.synthetic import moe_dims, random_image
    dims = moe_dims(hidden=8, ffn=4, experts=8, layers=2, top_k=2, vocab=32, max_seq=16)
    data = bytearray(random_image(dims, DType.F32, expert_align=64))
    assert lib.verify(bytes(data))[0] == 0
    table_bytes = 4 * dims.n_layers * dims.n_experts
    assert table_bytes == 64
    struct.pack_into("<Q", data, HEADER_OFFSETS["expert_crc_offset"], (1 << 64) - table_bytes)
    status, _ = lib.verify(bytes(reseal(data)))
    assert status == STATUS["E_IMAGE_HEADER"], f"got status {status}"


def test_the_host_reader_refuses_what_the_verifier_refuses():
    """Records the C verifier refuses, or the host cannot express, are an ImageError of read_image, never another
    exception (review of format v7: a windowed layer sharing with no earlier windowed layer raised ValueError)."""
    dims = im.ModelDims(**{**TINY, "n_layers": 3, "moe_layers": (False,) * 3}, head_dim=4, flags=FLAG_GEMMA4_LAYER)
    base = bytearray(im.build_image(dims, random_tensors(dims)))
    sharing = kind(1, "kv_source", 0)(kind(1, "window", 3, seal=False)(second_kind(bytearray(base))))
    unused = put("<B", HEADER_OFFSETS["layer_kind"] + 1, 0)(second_kind(bytearray(base)))
    odd_kv = kind(0, "kv_heads", 3)(bytearray(base))
    for bad in (sharing, unused, odd_kv):
        with pytest.raises(im.ImageError):
            read_image(bytes(bad))



@pytest.mark.parametrize("name,value", [("top_k", 0), ("top_k", 9), ("top_k", 1 << 31), ("ffn_size", 0)])
def test_a_router_that_cannot_choose_is_refused_by_both(lib, name, value):
    """With experts, 1 <= top_k <= n_experts and an expert size; the verifier refuses anything else, and the host
    reader must too rather than build a reference that picks no expert or more than there are."""
    from colibri.quant import DType
    from colibri.synthetic import moe_dims, random_image
    dims = moe_dims(hidden=8, ffn=4, experts=8, layers=2, top_k=2, vocab=32, max_seq=16)
    bad = bytes(field(name, value)(bytearray(random_image(dims, DType.F32, expert_align=64))))
    assert lib.verify(bad)[0] == STATUS["E_IMAGE_DIMS"]
    with pytest.raises(im.ImageError, match="top_k"):
        read_image(bad)


def test_a_sharing_layer_with_options_its_source_lacks_is_refused(lib):
    """A KV-sharing layer reads its source's cache as that layer stored it: a record whose options differ from its
    source's (here keys as values, which the source's cache was not made with) is refused, not run (review of format
    v7: only the head size, KV heads and window had been compared)."""
    dims = im.ModelDims(**{**TINY, "n_layers": 3, "moe_layers": (False,) * 3}, head_dim=4,
                        flags=FLAG_GEMMA4_LAYER, sliding_window=3, window_layers=(True, False, True), kv_shared_layers=1)
    base = bytearray(im.build_image(dims, random_tensors(dims)))
    kinds, kind_map = dims.layer_kinds()
    assert status_of(lib, base) == STATUS["OK"] and len(kinds) == 3 and kind_map == bytes([0, 1, 2])
    assert dims.kv_source(2) == 0  # the sharer, kind 2, reads the windowed layer 0
    changed = with_options(2, LAYER_OPT_K_IS_V)(bytearray(base))
    assert status_of(lib, changed) == STATUS["E_IMAGE_DIMS"]


def status_of(lib, image: bytes | bytearray) -> int:
    return lib.verify(bytes(image))[0]


def block_dtype_image() -> bytes:
    """One dense layer of hidden 256: Q4_K where a row is whole 256-element blocks, Q5_0 (llama.cpp's fallback) for the
    down matrix's rows of 32."""
    from colibri.quant import DType, convert
    dims = im.ModelDims(**{**TINY, "hidden_size": 256, "dense_ffn_size": 32, "n_layers": 1, "moe_layers": (False,),
                           "max_seq": 8}, head_dim=128)
    tensors = {k: convert(t, DType.Q4_K) if t.ndim == 2 and k[0] not in im.F32_TABLES else t
               for k, t in random_tensors(dims).items()}
    return im.build_image(dims, tensors, expert_align=64)


def entry_changed(role: im.Role, layer: int, **fields):
    """A mutation setting table entry fields (ENTRY_OFFSETS' names) of the tensor (role, layer); `bytes_by` adds to
    its `bytes`."""
    def mutate(b: bytearray) -> bytearray:
        i = index_of(b, role, layer)
        e = read_image(bytes(b)).entries[i]
        values = {"bytes": e.nbytes + fields.pop("bytes_by", 0), **fields}
        for name, value in values.items():
            fmt = "<" + next(f.struct_code for f in load_schema().entry if f.name == name)
            struct.pack_into(fmt, b, entry(i, name), value)
        return reseal(b)
    return mutate


@pytest.mark.parametrize("mutate,status,why", [
    (entry_changed(im.Role.WQ, 0, bytes_by=-144), "E_IMAGE_TABLE", "bytes"),
    (entry_changed(im.Role.WQ, 0, bytes_by=1), "E_IMAGE_TABLE", "bytes"),
    (entry_changed(im.Role.WQ, 0, group_size=32), "E_IMAGE_TABLE", "group_size"),
    (entry_changed(im.Role.WQ, 0, scales_offset=4096), "E_IMAGE_TABLE", "scales"),
    (entry_changed(im.Role.DENSE_DOWN, 0, dtype=9, group_size=256, bytes=256 * 144), "E_IMAGE_TABLE", "256"),
    (entry_changed(im.Role.ATTN_NORM, 0, dtype=9, group_size=256, bytes=144), "E_IMAGE_DTYPE", "only F32"),
    (entry_changed(im.Role.ROPE_COS, im.NO_INDEX, dtype=1, bytes=8 * 64 * 2), "E_IMAGE_DTYPE", "only F32"),
], ids=["a block short", "a byte long", "a K-quant's group 32", "scales apart of a block dtype",
        "Q4_K rows of 32", "a Q4_K vector", "an F16 RoPE table"])
def test_the_host_reader_refuses_a_dtype_the_verifier_refuses(lib, mutate, status, why):
    """An entry whose dtype's storage the verifier refuses (table.c's check_entry: its sizes, its group, scales apart,
    a K-quant row of whole blocks, a narrow dtype where only f32 may be) is an ImageError of read_image too, never an
    image `colibri info` says fits a board (or a reference that fails on reshaping its bytes): review of issue 34."""
    base = block_dtype_image()
    assert lib.verify(base)[0] == STATUS["OK"]
    bad = bytes(mutate(bytearray(base)))
    assert lib.verify(bad)[0] == STATUS[status]
    with pytest.raises(im.ImageError, match=why):
        read_image(bad)


def moved_into_the_header(b: bytearray) -> bytearray:
    return entry_changed(im.Role.WQ, 0, offset=0)(b)


def moved_onto_the_table(b: bytearray) -> bytearray:
    return entry_changed(im.Role.WQ, 0, offset=TABLE)(b)


def down_not_after_up(b: bytearray) -> bytearray:
    """The dense down matrix 64 bytes before its place: inside the up matrix, in bounds and aligned."""
    return entry_changed(im.Role.DENSE_DOWN, 0, offset=read_image(bytes(b)).entry(im.Role.DENSE_DOWN, 0).offset - 64)(b)


def resident_past_the_resident_part(b: bytearray) -> bytearray:
    """The resident part made to end before the output matrix does (the last tensor: it would lie in the expert part,
    which a board may stream)."""
    lm = read_image(bytes(b)).entry(im.Role.LM_HEAD)
    return field("expert_offset", lm.offset)(b)


@pytest.mark.parametrize("mutate", [moved_into_the_header, moved_onto_the_table, down_not_after_up,
                                    resident_past_the_resident_part],
                         ids=["into the header", "onto the table", "down not after up", "past the resident part"])
def test_the_host_reader_refuses_tensor_bounds_the_verifier_refuses(lib, mutate):
    """A tensor placed where the verifier refuses it (table.c's check_entry and table_walk: before data_offset, a
    resident tensor past the resident part, a SwiGLU matrix not right after the one before it) is an ImageError of
    read_image too, where it had read such images as valid and `colibri info` said they fitted every board that
    refuses them with E_IMAGE_BOUNDS (review of issue 34)."""
    base = block_dtype_image()
    assert lib.verify(base)[0] == STATUS["OK"]
    bad = bytes(mutate(bytearray(base)))
    assert lib.verify(bad)[0] in (STATUS["E_IMAGE_BOUNDS"], STATUS["E_IMAGE_HEADER"])
    with pytest.raises(im.ImageError):
        read_image(bad)
