"""Layers as data (docs/FORMAT.md "Layers"): each layer runs the mechanisms its record names, whatever the other
layers' records say. An image whose layers differ in every field the families keep the same in each layer (router,
activation, q/k norm, shared expert, options) verifies, runs on the hosted board, and gives the numpy reference's
bits, one token a pass and in prefill batches; the host reader takes exactly the records the verifier takes."""
from __future__ import annotations

import struct
from dataclasses import replace

import numpy as np
import pytest

from capi import STATUS, Context, Lib, Options
from colibri import format as fmt
from colibri import image as im
from colibri.quant import DType
from colibri.reference import Reference
from colibri.synthetic import random_image
from conftest import assert_bit_identical


def record(ffn: int, router: int, activation: int, qk_norm: int, shared: int, options: int, dense: int = 0) -> tuple:
    """A standard-attention layer's record (LAYER_FIELDS order): the header's geometry, its own cache, no window."""
    values = dict(attention=fmt.LAYER_ATTN_STANDARD, ffn=ffn, router=router, activation=activation, qk_norm=qk_norm,
                  shared=shared, reserved=0, options=options, head_dim=0, kv_heads=0, window=0,
                  kv_source=fmt.NO_INDEX, dense_ffn=dense)
    assert tuple(values) == fmt.LAYER_FIELDS
    return tuple(values.values())


# Four layers, four kinds: every router, activation, q/k norm and shared expert, and each option but those of
# Gemma 4's geometry (K_IS_V, GLOBAL_ROPE: tests/test_families.py) in some layer, never all in one.
RECORDS = (
    record(fmt.LAYER_FFN_DENSE, 0, fmt.LAYER_ACT_SILU, fmt.LAYER_QK_NORM_HEAD, fmt.LAYER_SHARED_NONE,
           fmt.LAYER_OPT_QKV_BIAS | fmt.LAYER_OPT_POST_ATTN_NORM),
    record(fmt.LAYER_FFN_MOE, fmt.LAYER_ROUTER_SOFTMAX, fmt.LAYER_ACT_GELU_TANH, fmt.LAYER_QK_NORM_FULL,
           fmt.LAYER_SHARED_GATED, fmt.LAYER_OPT_NORM_TOPK | fmt.LAYER_OPT_O_BIAS | fmt.LAYER_OPT_POST_FFN_NORM),
    record(fmt.LAYER_FFN_MOE, fmt.LAYER_ROUTER_SIGMOID, fmt.LAYER_ACT_SILU, fmt.LAYER_QK_NORM_NONE,
           fmt.LAYER_SHARED_PLAIN, fmt.LAYER_OPT_ROUTER_BIAS | fmt.LAYER_OPT_V_NORM | fmt.LAYER_OPT_LAYER_SCALE
           | fmt.LAYER_OPT_ROPE_PAIRS | fmt.LAYER_OPT_ATTN_GATE),
    record(fmt.LAYER_FFN_MOE_AND_DENSE, fmt.LAYER_ROUTER_TOPK_SOFTMAX, fmt.LAYER_ACT_GELU_TANH, fmt.LAYER_QK_NORM_HEAD,
           fmt.LAYER_SHARED_GATED, fmt.LAYER_OPT_ATTN_SINKS | fmt.LAYER_OPT_EXPERT_BIAS | fmt.LAYER_OPT_ROUTER_BIAS,
           dense=6),
)
DIMS = im.ModelDims(vocab_size=40, hidden_size=16, ffn_size=8, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=6,
                    n_experts=4, top_k=2, max_seq=32, rms_norm_eps=1e-5, rope_theta=10000.0, dense_ffn_size=12,
                    shared_ffn_size=8, rope_dim=4, records=RECORDS)  # RoPE on a head's first 4 dims of 6
TOKENS = np.random.default_rng(5).integers(0, DIMS.vocab_size, 12).tolist()


def test_the_records_cover_every_value():
    """Each u8 field's every value, and every option but K_IS_V and GLOBAL_ROPE, is some layer's."""
    for name, (count, _) in fmt.LAYER_ENUMS.items():
        if name != "attention":  # latent attention is every layer's or none's
            assert {r[fmt.LAYER_FIELDS.index(name)] for r in RECORDS} == set(range(count)), name
    options = 0
    for r in RECORDS:
        options |= r[fmt.LAYER_FIELDS.index("options")]
    assert options | fmt.LAYER_OPT_K_IS_V | fmt.LAYER_OPT_GLOBAL_ROPE == fmt.LAYER_KNOWN_OPTIONS


@pytest.fixture(scope="module")
def lib(hosted_build):
    return Lib(hosted_build / "libcolibri.so")


def one_token_a_pass(lib, data: bytes) -> np.ndarray:
    """TOKENS fed one a call: every position's logits."""
    one, rows = Context(lib, data), []
    for t in TOKENS:
        assert one.feed([t]) == 0
        rows.append(one.logits())
    return np.stack(rows)


@pytest.mark.parametrize("dtype", [DType.F32, DType.Q8_0])
def test_each_layer_runs_its_own_record_bit_for_bit(lib, dtype):
    data = random_image(DIMS, dtype, seed=3, expert_align=64)
    read = im.read_image(data)
    assert read.dims.records == RECORDS and read.header["layer_kinds"] == 4
    expected = Reference(read).forward(TOKENS)
    assert_bit_identical(one_token_a_pass(lib, data), expected)
    batched = Context(lib, data, options=Options(prefill_batch=5))
    assert batched.open_status == 0
    assert batched.feed(TOKENS) == 0
    assert_bit_identical(batched.logits(), expected[-1])


def kind_field(data: bytes, k: int, name: str, value: int) -> bytes:
    """The image with record k's field `name` set (the CRCs resealed)."""
    from test_verifier import LAYER_FIELD, reseal
    buf = bytearray(data)
    code, offset = LAYER_FIELD[name]
    struct.pack_into(code, buf, im.HEADER_OFFSETS["kinds"] + k * im.LAYER_BYTES + offset, value)
    return bytes(reseal(buf))


@pytest.mark.parametrize("k,name,value", [
    (0, "router", fmt.LAYER_ROUTER_SIGMOID),                           # a router in a dense layer
    (1, "shared", fmt.LAYER_SHARED_NONE),                              # no shared expert, though the header sizes one
    (3, "options", fmt.LAYER_OPT_NORM_TOPK),                           # the top-k softmax renormalized
    (2, "qk_norm", 3),                                                 # no such q/k norm
    (1, "options", fmt.LAYER_KNOWN_OPTIONS + 1),                       # no such option
    (0, "kv_source", 1),                                               # the cache of a later layer
])
def test_the_host_reader_refuses_the_records_the_verifier_refuses(lib, k, name, value):
    data = kind_field(random_image(DIMS, DType.F32, expert_align=64), k, name, value)
    assert lib.verify(data)[0] == STATUS["E_IMAGE_DIMS"]
    with pytest.raises(im.ImageError, match="layer"):
        im.read_image(data)


def test_a_layer_of_one_model_may_differ_from_the_families_mapping():
    """The records are the image's only copy: no config-style field the reader also fills decides a layer."""
    read = im.read_image(random_image(DIMS, DType.F32, expert_align=64))
    assert [read.dims.layers[l].router for l in range(4)] == [0, fmt.LAYER_ROUTER_SOFTMAX, fmt.LAYER_ROUTER_SIGMOID,
                                                               fmt.LAYER_ROUTER_TOPK_SOFTMAX]
    assert replace(read.dims, flags=0).layers == read.dims.layers


def lean_refusals() -> list[tuple[str, str, object]]:
    """Every record value and option without `lean = true` in format/schema.toml, and the header fields only the
    mechanisms the lean build leaves out use: (name, what to set, value)."""
    cases = [(f"{name} {value}", name, value) for name, (count, lean) in fmt.LAYER_ENUMS.items()
             for value in range(count) if not lean >> value & 1]
    cases += [(f"option {bit}", "options", 1 << bit) for bit in range(fmt.LAYER_KNOWN_OPTIONS.bit_length())
              if not fmt.LAYER_LEAN_OPTIONS >> bit & 1]
    return cases + [(f"header {name}", name, value) for name, value in (
        ("kv_lora_rank", 4), ("n_group", 2), ("swiglu_limit", 7.0), ("embed_scale", 4.0), ("logit_softcap", 30.0),
        ("ple_dim", 2), ("conv_kernel", 3), ("dn_k_heads", 1), ("dn_v_dim", 4))]


@pytest.mark.parametrize("what,name,value", lean_refusals(), ids=[c[0] for c in lean_refusals()])
def test_the_lean_build_names_what_it_leaves_out_unsupported(what, name, value):
    """The lean build (mechanisms.h) refuses an image needing a mechanism it leaves out with COLIBRI_E_UNSUPPORTED,
    before any other check could name it otherwise; the full build reads the same field."""
    from conftest import build
    from test_verifier import field, kind
    lean = Lib(build("hosted", lean=True) / "libcolibri.so")
    dims = replace(DIMS, records=(), n_layers=2, moe_layers=(True, True), shared_ffn_size=0)
    data = bytearray(random_image(dims, DType.F32, expert_align=64))
    assert lean.verify(bytes(data))[0] == STATUS["OK"]
    changed = bytes(kind(0, name, value)(data) if name in fmt.LAYER_FIELDS else field(name, value)(data))
    assert lean.verify(changed)[0] == STATUS["E_UNSUPPORTED"], what


def test_the_writer_refuses_records_the_verifier_would_refuse():
    """build_image checks the records it writes as the verifier will (reader.check_records), and flags that give a
    layer two values of one field are refused by name, never resolved silently (review of format v8)."""
    from colibri.dims import FLAG_NORM_TOPK, FLAG_QK_NORM_FULL, FLAG_QK_NORM_HEAD, FLAG_ROUTER_TOPK_SOFTMAX
    plain = replace(DIMS, records=(), moe_layers=(True,) * 4, shared_ffn_size=0)
    with pytest.raises(ValueError, match="would not verify: layer record 0: the top-k softmax router"):
        random_image(replace(plain, flags=FLAG_NORM_TOPK | FLAG_ROUTER_TOPK_SOFTMAX), DType.F32)
    with pytest.raises(ValueError, match="two values"):
        random_image(replace(plain, flags=FLAG_QK_NORM_HEAD | FLAG_QK_NORM_FULL), DType.F32)
    later = list(RECORDS)
    later[0] = later[0][:fmt.LAYER_FIELDS.index("kv_source")] + (2,) + later[0][fmt.LAYER_FIELDS.index("kv_source") + 1:]
    with pytest.raises(ValueError, match="shares the KV cache of layer 2"):
        random_image(replace(DIMS, records=tuple(later)), DType.F32)


def test_a_layer_shares_the_cache_of_one_that_differs_in_more_than_attention(lib):
    """A KV-sharing layer agrees with its source on what made the cache (geometry, window, attention options, RoPE
    pairs), not on its FFN: a dense layer reads a MoE layer's cache, bit for bit with the reference."""
    moe = record(fmt.LAYER_FFN_MOE, fmt.LAYER_ROUTER_SOFTMAX, fmt.LAYER_ACT_SILU, fmt.LAYER_QK_NORM_HEAD,
                 fmt.LAYER_SHARED_NONE, fmt.LAYER_OPT_NORM_TOPK | fmt.LAYER_OPT_QKV_BIAS)
    dense = record(fmt.LAYER_FFN_DENSE, 0, fmt.LAYER_ACT_GELU_TANH, fmt.LAYER_QK_NORM_HEAD, fmt.LAYER_SHARED_NONE,
                   fmt.LAYER_OPT_QKV_BIAS | fmt.LAYER_OPT_POST_FFN_NORM)
    source = fmt.LAYER_FIELDS.index("kv_source")
    sharer = dense[:source] + (0,) + dense[source + 1:]
    dims = replace(DIMS, n_layers=3, shared_ffn_size=0, records=(moe, dense, sharer))
    data = random_image(dims, DType.F32, seed=4, expert_align=64)
    assert lib.verify(data)[0] == STATUS["OK"]
    ctx = Context(lib, data)
    rows = []
    for t in TOKENS:
        assert ctx.feed([t]) == 0
        rows.append(ctx.logits())
    assert_bit_identical(np.stack(rows), Reference(im.read_image(data)).forward(TOKENS))
    options = fmt.LAYER_FIELDS.index("options")
    v_normed = sharer[:options] + (sharer[options] | fmt.LAYER_OPT_V_NORM,) + sharer[options + 1:]
    refused = replace(dims, records=(moe, dense, v_normed))
    with pytest.raises(ValueError, match="attention options"):
        random_image(refused, DType.F32)


def conv_record(ffn: int, router: int, shared: int, options: int, dense: int = 0) -> tuple:
    """A SHORT_CONV layer's record: no attention geometry, norms, window or cache."""
    r = record(ffn, router, fmt.LAYER_ACT_SILU, fmt.LAYER_QK_NORM_NONE, shared, options, dense)
    return (fmt.LAYER_ATTN_SHORT_CONV,) + r[1:]


# LFM2's short convolutions beside other mechanisms no family puts beside them: Gemma 4's norms and scale after a
# layer, its MoE beside a dense MLP, a shared expert; two convolving layers around an attending one, of kernel 4
CONV_RECORDS = (
    conv_record(fmt.LAYER_FFN_DENSE, 0, fmt.LAYER_SHARED_NONE,
                fmt.LAYER_OPT_POST_ATTN_NORM | fmt.LAYER_OPT_POST_FFN_NORM | fmt.LAYER_OPT_LAYER_SCALE),
    record(fmt.LAYER_FFN_MOE, fmt.LAYER_ROUTER_SIGMOID, fmt.LAYER_ACT_SILU, fmt.LAYER_QK_NORM_HEAD,
           fmt.LAYER_SHARED_GATED, fmt.LAYER_OPT_NORM_TOPK | fmt.LAYER_OPT_ROUTER_BIAS),
    conv_record(fmt.LAYER_FFN_MOE_AND_DENSE, fmt.LAYER_ROUTER_SOFTMAX, fmt.LAYER_SHARED_PLAIN,
                fmt.LAYER_OPT_NORM_TOPK, dense=6),
)
CONV_DIMS = replace(DIMS, n_layers=3, records=CONV_RECORDS, conv_kernel=4, topk_norm_eps=1e-6)


@pytest.mark.parametrize("dtype", [DType.F32, DType.Q4_0])
def test_convolving_layers_run_their_records_bit_for_bit(lib, dtype):
    """Convolving layers with the options and FFNs a record allows them: the reference's bits one token a pass, in
    prefill batches (uneven ones: a batch ends inside the kernel's reach), and after a reset."""
    data = random_image(CONV_DIMS, dtype, seed=4, expert_align=64)
    read = im.read_image(data)
    assert read.dims.records == CONV_RECORDS and read.dims.conv_layers == (True, False, True)
    runs_bit_for_bit(lib, data, split=7, batch=5)


RECORD_REFUSAL = "a short convolution or DeltaNet with attention's"


@pytest.mark.parametrize("what,change,match", [
    ("a q/k norm", lambda d: kind_field(d, 0, "qk_norm", fmt.LAYER_QK_NORM_HEAD), RECORD_REFUSAL),
    ("standard attention's option", lambda d: kind_field(d, 0, "options", fmt.LAYER_OPT_QKV_BIAS), RECORD_REFUSAL),
    ("a window", lambda d: kind_field(d, 0, "window", 4), RECORD_REFUSAL),
    ("a head size of its own", lambda d: kind_field(d, 2, "head_dim", 4), RECORD_REFUSAL),
    # an earlier layer's cache, which a sharing attention layer could name: only the convolution's clause refuses it
    ("a cache of another layer", lambda d: kind_field(d, 2, "kv_source", 0), RECORD_REFUSAL),
    ("no kernel size", lambda d: _header(d, "conv_kernel", 0), "conv_kernel"),
    ("a kernel of one position", lambda d: _header(d, "conv_kernel", 1), "conv_kernel"),
    ("a kernel past the cap", lambda d: _header(d, "conv_kernel", fmt.MAX_CONV_KERNEL + 1), "conv_kernel"),
    ("a NaN renormalization epsilon", lambda d: _header(d, "topk_norm_eps", float("nan")), "topk_norm_eps"),
    ("an epsilon of 1", lambda d: _header(d, "topk_norm_eps", 1.0), "topk_norm_eps"),
])
def test_the_verifier_and_reader_refuse_a_convolution_they_cannot_run(lib, what, change, match):
    refused_by_both(lib, change(random_image(CONV_DIMS, DType.F32, expert_align=64)), match)


def test_a_kernel_size_without_a_convolving_layer_is_refused(lib):
    refused_by_both(lib, _header(random_image(DIMS, DType.F32, expert_align=64), "conv_kernel", 3),
                    "conv_kernel 3 with 0 short convolution and 0 DeltaNet layers")


def test_a_layer_cannot_share_a_convolving_layers_cache(lib):
    """Layer 1 (attending) names layer 0 (convolving, no KV cache) as its kv_source."""
    refused_by_both(lib, kind_field(random_image(CONV_DIMS, DType.F32, expert_align=64), 1, "kv_source", 0),
                    "shares the KV cache of layer 0")


def refused_by_both(lib, data: bytes, match: str | None = None) -> None:
    """The verifier refuses the image's dimensions, and the host reader refuses it too."""
    assert lib.verify(data)[0] == STATUS["E_IMAGE_DIMS"]
    with pytest.raises(im.ImageError, match=match):
        im.read_image(data)


def runs_bit_for_bit(lib, data: bytes, split: int, batch: int) -> None:
    """TOKENS one a pass, and fed as TOKENS[:split] then the rest in prefill batches of `batch`, twice with a reset
    between: the reference's bits each time."""
    expected = Reference(im.read_image(data)).forward(TOKENS)
    assert_bit_identical(one_token_a_pass(lib, data), expected)
    batched = Context(lib, data, options=Options(prefill_batch=batch))
    for _ in range(2):
        assert batched.feed(TOKENS[:split]) == 0 and batched.feed(TOKENS[split:]) == 0
        assert_bit_identical(batched.logits(), expected[-1])
        assert lib.so.colibri_reset(batched.ctx) == 0


def _header(data: bytes, name: str, value) -> bytes:
    from test_verifier import field
    return bytes(field(name, value)(bytearray(data)))


def delta_record(ffn: int, router: int, shared: int, options: int, dense: int = 0) -> tuple:
    """A DELTA_NET layer's record: no attention geometry, norms, window or cache."""
    return (fmt.LAYER_ATTN_DELTA_NET,) + conv_record(ffn, router, shared, options, dense)[1:]


# Qwen3.5's Gated DeltaNets beside a short convolution (one state region holding both kinds), a dense layer and
# Gemma 4's MoE beside a dense MLP; value heads three times the key heads
DELTA_RECORDS = (
    delta_record(fmt.LAYER_FFN_DENSE, 0, fmt.LAYER_SHARED_NONE, fmt.LAYER_OPT_POST_ATTN_NORM),
    conv_record(fmt.LAYER_FFN_MOE, fmt.LAYER_ROUTER_SIGMOID, fmt.LAYER_SHARED_GATED, fmt.LAYER_OPT_NORM_TOPK),
    record(fmt.LAYER_FFN_MOE, fmt.LAYER_ROUTER_SOFTMAX, fmt.LAYER_ACT_SILU, fmt.LAYER_QK_NORM_HEAD,
           fmt.LAYER_SHARED_GATED, fmt.LAYER_OPT_NORM_TOPK | fmt.LAYER_OPT_ATTN_GATE),
    delta_record(fmt.LAYER_FFN_MOE_AND_DENSE, fmt.LAYER_ROUTER_SOFTMAX, fmt.LAYER_SHARED_PLAIN, 0, dense=6),
)
DELTA_DIMS = replace(DIMS, records=DELTA_RECORDS, conv_kernel=3, dn_k_heads=1, dn_v_heads=3, dn_k_dim=4, dn_v_dim=5,
                     topk_norm_eps=0.0)


@pytest.mark.parametrize("dtype", [DType.F32, DType.Q8_0])
def test_delta_net_layers_run_their_records_bit_for_bit(lib, dtype):
    """DeltaNet layers with a convolving one between them: the reference's bits one token a pass, in uneven prefill
    batches, and after a reset; the state plan holds both kinds of layer."""
    from colibri.plan import arena_plan
    data = random_image(DELTA_DIMS, dtype, seed=6, expert_align=64)
    read = im.read_image(data)
    d = read.dims
    assert d.delta_layers == (True, False, False, True) and d.conv_layers == (False, True, False, False)
    assert d.state_elements() == 2 * (2 * (2 * 4 + 3 * 5) + 3 * 4 * 5) + 2 * d.hidden_size  # (K-1)·channels + Hv·dk·dv
    assert arena_plan(d)["state"][1] == 4 * d.state_elements() == arena_plan(d)["state_saved"][1]
    runs_bit_for_bit(lib, data, split=5, batch=4)


DELTA_REFUSAL = "DeltaNet heads"


@pytest.mark.parametrize("what,change,match", [
    ("no key heads", lambda d: _header(d, "dn_k_heads", 0), DELTA_REFUSAL),
    ("value heads not a multiple of the key heads", lambda d: _header(d, "dn_k_heads", 2), DELTA_REFUSAL),
    ("no value head size", lambda d: _header(d, "dn_v_dim", 0), DELTA_REFUSAL),
    ("widths past 2^24", lambda d: _header(_header(d, "dn_v_heads", 65535), "dn_v_dim", 65535), DELTA_REFUSAL),
    ("no kernel size", lambda d: _header(d, "conv_kernel", 0), "conv_kernel"),
    ("a window", lambda d: kind_field(d, 0, "window", 4), RECORD_REFUSAL),
    ("the gate on a DeltaNet", lambda d: kind_field(d, 0, "options", fmt.LAYER_OPT_ATTN_GATE), "options"),
    ("a rope width past the head", lambda d: _header(d, "rope_dim", 8), "rope_dim 8"),
    ("an odd rope width", lambda d: _header(d, "rope_dim", 3), "rope_dim 3"),  # (3 // 2: the tables' width still)
    ("no rope width", lambda d: _header(d, "rope_dim", 0), "rope_dim 0"),
])
def test_the_verifier_and_reader_refuse_a_delta_net_they_cannot_run(lib, what, change, match):
    refused_by_both(lib, change(random_image(DELTA_DIMS, DType.F32, expert_align=64)), match)


def test_a_delta_net_geometry_without_a_delta_net_layer_is_refused(lib):
    refused_by_both(lib, _header(random_image(CONV_DIMS, DType.F32, expert_align=64), "dn_k_heads", 2),
                    "DeltaNet heads 2")
