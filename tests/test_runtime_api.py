"""The C API called directly (ctypes on the hosted build): results, misuse, named statuses."""
from __future__ import annotations

import ctypes as C
import struct

import numpy as np
import pytest

from capi import STATUS, Context, ImageInfo, Lib, Sampler
from colibri.image import read_image
from colibri.pack import pack
from colibri.reference import Reference


@pytest.fixture(scope="module")
def lib(hosted_build):
    return Lib(hosted_build / "libcolibri.so")


@pytest.fixture
def base(images):
    return images["base"].read_bytes()


def test_feed_matches_reference(lib, base):
    ctx = Context(lib, base)
    assert ctx.open_status == 0
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    ref = Reference(read_image(base)).forward(tokens)
    for i, tok in enumerate(tokens):
        assert ctx.feed([tok]) == 0
        assert ctx.logits().tobytes() == ref[i].tobytes(), i
    # prefill in one call gives the same last row as token-by-token
    ctx2 = Context(lib, base)
    assert ctx2.feed(tokens) == 0
    np.testing.assert_array_equal(ctx2.logits(), ctx.logits())
    assert ctx2.stats().tokens_fed == len(tokens)
    got = ImageInfo()
    assert lib.so.colibri_get_info(ctx2.ctx, C.byref(got)) == 0
    fields = [f for f, _ in ImageInfo._fields_]
    assert [getattr(got, f) for f in fields] == [getattr(ctx2.info, f) for f in fields]  # what the verifier said
    assert lib.so.colibri_get_info(None, C.byref(got)) == STATUS["E_NULL"]


def test_arena_too_small_names_bytes_needed(lib, base):
    plan = read_image(base).header["arena_bytes"]
    ctx = Context(lib, base, arena_bytes=plan - 1)
    assert ctx.open_status == STATUS["E_ARENA_TOO_SMALL"]
    assert ctx.needed == plan
    assert Context(lib, base, arena_bytes=plan).open_status == 0


def test_misaligned_arena(lib, base):
    ctx = Context(lib, base)
    arena = ctx.arena.addr + 4
    out = C.c_void_p()
    st = lib.so.colibri_open(C.c_void_p(ctx.image.addr), ctx.image.size, C.c_void_p(arena), ctx.arena.size - 4,
                             None, C.byref(out), None)
    assert st == STATUS["E_ARENA_ALIGN"]


def test_bad_tokens_leave_context_usable(lib, base):
    ctx = Context(lib, base)
    vocab, max_seq = ctx.info.vocab_size, ctx.info.max_seq
    assert ctx.feed([1, 2]) == 0
    before = ctx.logits()
    assert ctx.feed([3, vocab]) == STATUS["E_TOKEN_RANGE"]      # checked before anything is fed
    assert ctx.stats().tokens_fed == 2
    np.testing.assert_array_equal(ctx.logits(), before)
    assert ctx.feed([0] * (max_seq - 1)) == STATUS["E_SEQ_FULL"]  # 2 + 47 > 48
    assert ctx.stats().tokens_fed == 2
    assert ctx.feed([]) == STATUS["E_BAD_ARG"]
    # still usable, and equal to a clean run of the same tokens
    assert ctx.feed([3]) == 0
    clean = Context(lib, base)
    clean.feed([1, 2, 3])
    np.testing.assert_array_equal(ctx.logits(), clean.logits())
    assert ctx.feed([0] * (max_seq - 3)) == 0
    assert ctx.feed([0]) == STATUS["E_SEQ_FULL"]


def test_step_before_feed_and_nulls(lib, base):
    ctx = Context(lib, base)
    s, tok = Sampler(), C.c_uint32()
    assert lib.so.colibri_sampler_init(C.byref(s), 0.0, 0, 1.0, 1) == 0
    assert lib.so.colibri_step(ctx.ctx, C.byref(s), C.byref(tok)) == STATUS["E_NO_LOGITS"]
    assert lib.so.colibri_step(None, C.byref(s), C.byref(tok)) == STATUS["E_NULL"]
    assert lib.so.colibri_feed(ctx.ctx, None, 1) == STATUS["E_NULL"]
    assert lib.so.colibri_image_verify(None, 100, None) == STATUS["E_NULL"]
    assert lib.so.colibri_sampler_init(C.byref(s), 1.0, 0, float("nan"), 1) == STATUS["E_BAD_ARG"]
    assert lib.so.colibri_reset(None) == STATUS["E_NULL"]
    for name, code in STATUS.items():
        assert lib.so.colibri_strerror(code).decode()
    assert lib.so.colibri_strerror(999) == b"unknown status"


def test_greedy_step_is_argmax_and_reset_restarts(lib, base):
    ctx = Context(lib, base)
    s, tok = Sampler(), C.c_uint32()
    lib.so.colibri_sampler_init(C.byref(s), 0.0, 0, 1.0, 0)
    ctx.feed([7, 8])
    expect = int(np.argmax(ctx.logits()))
    assert lib.so.colibri_step(ctx.ctx, C.byref(s), C.byref(tok)) == 0
    assert tok.value == expect
    assert lib.so.colibri_reset(ctx.ctx) == 0
    assert ctx.stats().tokens_fed == 0
    ctx.feed([7, 8])
    assert int(np.argmax(ctx.logits())) == expect


def _sample_many(lib, logits_ctx, temperature, top_k, top_p, seed, n=200):
    s, tok = Sampler(), C.c_uint32()
    lib.so.colibri_sampler_init(C.byref(s), temperature, top_k, top_p, seed)
    out = []
    for _ in range(n):
        assert lib.so.colibri_sample(logits_ctx.ctx, C.byref(s), C.byref(tok)) == 0
        out.append(tok.value)
    return out


def test_sampler_cuts(lib, base):
    ctx = Context(lib, base)
    ctx.feed([4, 2])
    logits = ctx.logits()
    order = np.argsort(-logits, kind="stable")
    top3 = _sample_many(lib, ctx, 1.5, 3, 1.0, 11)
    assert set(top3) <= set(order[:3].tolist()) and len(set(top3)) > 1
    # nucleus: the smallest prefix of the sorted distribution reaching top_p
    p = np.exp((logits - logits.max()) / 1.5)
    p /= p.sum()
    cum = np.cumsum(p[order])
    nucleus = set(order[: int(np.searchsorted(cum, 0.6) + 1)].tolist())
    assert set(_sample_many(lib, ctx, 1.5, 0, 0.6, 12)) <= nucleus
    # sample does not disturb the logits; same seed -> same draws; other seed -> different draws
    np.testing.assert_array_equal(ctx.logits(), logits)
    assert _sample_many(lib, ctx, 1.0, 0, 1.0, 5) == _sample_many(lib, ctx, 1.0, 0, 1.0, 5)
    assert _sample_many(lib, ctx, 1.0, 0, 1.0, 5) != _sample_many(lib, ctx, 1.0, 0, 1.0, 6)


def test_expf_accuracy(lib):
    """The runtime's own expf against float64 exp rounded to f32: at most 2 ulp over the normal range."""
    x = np.concatenate([np.linspace(-87.0, 88.7, 200_001, dtype=np.float32),
                        np.float32([0.0, -0.0, 1e-8, -1e-8, 0.5, -0.5, 1.0, 88.72])])
    got = np.array([lib.so.colibri_expf(float(v)) for v in x], np.float32)
    want = np.exp(x.astype(np.float64)).astype(np.float32)
    ulp = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))
    assert ulp.max() <= 2
    assert lib.so.colibri_expf(200.0) == float("inf")
    assert lib.so.colibri_expf(-200.0) == 0.0
    assert np.isnan(lib.so.colibri_expf(float("nan")))


def test_reopen_and_calls_after_failed_open(lib, base):
    """Opening again over a live context starts a fresh one; a failed open hands out no context."""
    ctx = Context(lib, base)
    ctx.feed([1, 2, 3])
    out, needed = C.c_void_p(), C.c_uint64()
    assert lib.so.colibri_open(C.c_void_p(ctx.image.addr), ctx.image.size, C.c_void_p(ctx.arena.addr), ctx.arena.size,
                               None, C.byref(out), C.byref(needed)) == 0
    assert out.value == ctx.ctx.value
    assert ctx.stats().tokens_fed == 0
    assert ctx.feed([1]) == 0

    corrupt = bytearray(base)
    corrupt[-1] ^= 1
    bad = Context.__new__(Context)
    bad.lib, bad.ctx = lib, C.c_void_p()
    from capi import Aligned
    img, arena = Aligned(bytes(corrupt)), Aligned(1 << 20)
    st = lib.so.colibri_open(C.c_void_p(img.addr), img.size, C.c_void_p(arena.addr), arena.size, None,
                             C.byref(bad.ctx), None)
    assert st == STATUS["E_EXPERT_CRC"] and bad.ctx.value is None  # the last byte is an expert's
    assert bad.feed([1]) == STATUS["E_NULL"]
    assert lib.so.colibri_reset(bad.ctx) == STATUS["E_NULL"]



def test_header_example_program(hosted_build, images, tmp_path):
    """colibri.h's usage sequence, as a real program linked against libcolibri.a, generates the
    reference's greedy tokens."""
    import subprocess

    from conftest import ROOT
    exe = tmp_path / "api_example"
    subprocess.run(["gcc", "-std=c11", "-O2", "-Wall", "-Werror", f"-I{ROOT / 'firmware' / 'include'}",
                    str(ROOT / "tests" / "api_example.c"), str(hosted_build / "libcolibri.a"), "-o", str(exe)],
                   check=True)
    out = subprocess.run([str(exe), str(images["base"]), "8", "1", "5", "9", "3"], capture_output=True, text=True,
                         check=True).stdout
    ref = Reference(read_image(images["base"].read_bytes()))
    assert [int(t) for t in out.split()] == ref.greedy([1, 5, 9, 3], 8)


def test_kernel_set_is_named(lib, base):
    """colibri_get_kernels names what CPUID chose at open (AVX2 on this CPU if it has it); NULLs are refused."""
    from test_kernels import EXPECTED_KERNELS
    ctx = Context(lib, base)
    assert ctx.open_status == 0
    assert ctx.kernels() == EXPECTED_KERNELS["hosted"]
    name = C.c_char_p()
    assert lib.so.colibri_get_kernels(None, C.byref(name)) == STATUS["E_NULL"]
    assert lib.so.colibri_get_kernels(ctx.ctx, None) == STATUS["E_NULL"]


def test_nonfinite_router_or_logits_is_named_and_reset_recovers(lib, images):
    """A NaN reaching the router would otherwise be absorbed by '>' (expert 0 taken with weight -1) and
    one in the logits by the argmax: both stop the feed with COLIBRI_E_NONFINITE, the tokens before stay
    fed, and after colibri_reset the context works again."""
    import struct
    from colibri.image import Role
    from test_verifier import reseal
    data = bytearray(images["base"].read_bytes())
    img = read_image(bytes(data))
    embd = img.entry(Role.TOKEN_EMBD)
    row = 5 * img.dims.hidden_size * 4  # token 5's embedding row: NaN, every other token is clean
    for i in range(img.dims.hidden_size):
        struct.pack_into("<f", data, embd.offset + row + 4 * i, float("nan"))
    ctx = Context(lib, bytes(reseal(data)))
    assert ctx.open_status == 0
    assert ctx.feed([1, 2, 5, 3]) == STATUS["E_NONFINITE"]
    assert ctx.stats().tokens_fed == 2  # 1 and 2 stay fed; 5 is not
    ptr, n = C.POINTER(C.c_float)(), C.c_uint32()
    assert lib.so.colibri_logits(ctx.ctx, C.byref(ptr), C.byref(n)) == STATUS["E_NO_LOGITS"]
    assert lib.so.colibri_strerror(STATUS["E_NONFINITE"]) == b"NaN or infinity in the router or the logits"
    assert lib.so.colibri_reset(ctx.ctx) == 0
    assert ctx.feed([1, 2, 3]) == 0
    clean = Context(lib, images["base"].read_bytes())
    assert clean.feed([1, 2, 3]) == 0
    np.testing.assert_array_equal(ctx.logits(), clean.logits())  # the same as an image without the NaN row


def test_top_k_keeps_ties_with_the_kth_as_transformers_does(lib, images):
    """transformers' top-k keeps every token whose score equals the k-th (`scores < kth` are removed);
    so does the sampler: two output rows made identical tie exactly, and top-1 sampling draws both."""
    import torch
    from transformers.generation.logits_process import TopKLogitsWarper

    from colibri.image import Role
    from test_verifier import reseal
    data = bytearray(images["base"].read_bytes())
    img = read_image(bytes(data))
    clean = Context(lib, bytes(data))
    clean.feed([4, 2])
    best = int(np.argmax(clean.logits()))
    twin = (best + 1) % img.dims.vocab_size
    head, row = img.entry(Role.LM_HEAD), img.dims.hidden_size * 4
    data[head.offset + twin * row: head.offset + (twin + 1) * row] = data[head.offset + best * row: head.offset + (best + 1) * row]
    ctx = Context(lib, bytes(reseal(data)))
    ctx.feed([4, 2])
    logits = ctx.logits()
    assert logits[twin] == logits[best] == logits.max()
    kept = TopKLogitsWarper(1)(None, torch.tensor(logits)[None])[0]
    assert set(np.flatnonzero(np.isfinite(kept.numpy()))) == {best, twin}  # the oracle keeps both
    assert set(_sample_many(lib, ctx, 1.0, 1, 1.0, 3)) == {best, twin}
    assert _sample_many(lib, ctx, 0.0, 1, 1.0, 3, n=20) == [min(best, twin)] * 20  # greedy: lowest id


def test_tensor_places_are_resolved_once_at_open(lib, base):
    """After open the runtime never reads the image's table again: a table rewritten under a live context
    (every offset pointed far outside the image) changes nothing, and the logits stay the same bits."""
    from colibri.format import ENTRY_BYTES, ENTRY_OFFSETS, HEADER_OFFSETS
    ctx = Context(lib, base)
    assert ctx.feed([1, 2, 3]) == 0
    want = ctx.logits()
    assert lib.so.colibri_reset(ctx.ctx) == 0
    table, n_tensors = (struct.unpack_from(f, base, HEADER_OFFSETS[k])[0]
                        for f, k in (("<Q", "tensor_table_offset"), ("<I", "n_tensors")))
    for i in range(n_tensors):
        C.memmove(ctx.image.addr + table + i * ENTRY_BYTES + ENTRY_OFFSETS["offset"], struct.pack("<Q", 1 << 40), 8)
    assert ctx.feed([1, 2, 3]) == 0
    assert ctx.logits().tobytes() == want.tobytes()


def test_an_arena_overlapping_the_image_is_refused(lib, base):
    from capi import Aligned
    status, info = lib.verify(base)
    buf = Aligned(len(base) + info.arena_bytes)  # the image, then room for an arena behind it
    C.memmove(buf.addr, base, len(base))
    ctx, needed = C.c_void_p(), C.c_uint64()
    for arena_at in (buf.addr + 64 * (len(base) // 64 // 2), buf.addr):  # inside the image, at its start
        st = lib.so.colibri_open(C.c_void_p(buf.addr), len(base), C.c_void_p(arena_at), info.arena_bytes, None,
                                 C.byref(ctx), C.byref(needed))
        assert st == STATUS["E_ARENA_OVERLAP"]
    behind = buf.addr + (len(base) + 63) // 64 * 64
    assert lib.so.colibri_open(C.c_void_p(buf.addr), len(base), C.c_void_p(behind), info.arena_bytes, None,
                               C.byref(ctx), C.byref(needed)) == 0


def test_parallel_for_hook_gives_the_same_bits_in_any_part_order(lib, tmp_path):
    """The hook may run parts in any order (here last first) on any threads: the logits are the no-hook
    ones, bit for bit, for even and uneven splits. parallel_parts without a hook is E_NULL; above
    COLIBRI_MAX_PARTS (64) E_BAD_ARG."""
    from capi import Options, reversed_parts
    from conftest import WIDE, make_checkpoint
    from colibri.pack import pack
    pack(make_checkpoint(WIDE, tmp_path / "wide"), tmp_path / "wide.img", max_seq=16, expert_align=64,
         measure_quality=False)  # matrices above the runtime's threshold for splitting
    data = (tmp_path / "wide.img").read_bytes()
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    plain = Context(lib, data)
    assert plain.feed(tokens) == 0
    calls: list[int] = []
    hook = reversed_parts(calls)
    for parts in (2, 3, 7):
        ctx = Context(lib, data, options=Options(parallel_for=hook, parallel_parts=parts))
        assert ctx.open_status == 0
        assert ctx.feed(tokens) == 0
        assert ctx.logits().tobytes() == plain.logits().tobytes(), parts
        assert calls and set(calls) == {parts}  # the runtime did split the work
        calls.clear()
    assert Context(lib, data, options=Options(parallel_parts=2)).open_status == STATUS["E_NULL"]
    assert Context(lib, data, options=Options(parallel_for=hook, parallel_parts=65)).open_status == \
        STATUS["E_BAD_ARG"]
    assert Context(lib, data, options=Options(parallel_parts=1)).open_status == 0  # one part needs no hook


def test_crc32_matches_zlib_on_every_path(lib):
    """colibri_crc32 against zlib: the tables below 4 KiB, carry-less multiplication folding above it on a
    CPU with PCLMULQDQ (every length class: 64-byte blocks, 16-byte blocks, a byte tail), any alignment,
    any starting CRC."""
    import zlib
    lib.so.colibri_crc32.argtypes = [C.c_uint32, C.c_char_p, C.c_size_t]
    lib.so.colibri_crc32.restype = C.c_uint32
    rng = np.random.default_rng(5)
    data = rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    for n in (0, 1, 3, 4, 63, 4095, 4096, 4097, 4111, 4112, 4159, 4160, 4175, 65536 + 7, (1 << 20) - 13):
        for start in (0, 1, 13):
            init = int(rng.integers(0, 1 << 32))
            chunk = data[start:start + n]
            assert lib.so.colibri_crc32(init, chunk, len(chunk)) == zlib.crc32(chunk, init), (n, start)


def test_host_mirror_of_the_prefill_batch_bytes(lib, images):
    """colibri/plan.py prefill_bytes (what footprint.py reports before flashing) equals the runtime's
    colibri_prefill_bytes for every test image and a few batch sizes."""
    from colibri.image import prefill_bytes
    for path in images.values():
        data = path.read_bytes()
        status, info = lib.verify(data)
        assert status == 0
        dims = read_image(data).dims
        for tokens in (0, 1, 2, 8, 64):
            assert prefill_bytes(dims, tokens) == lib.so.colibri_prefill_bytes(C.byref(info), tokens), (path.name, tokens)


def test_a_prefill_batch_takes_the_room_the_arena_has(lib, base):
    """prefill_batch is a most, not a requirement: open takes the largest batch whose bytes fit after the
    plan (none when two tokens do not fit) and says so in the stats; the logits are the same bits."""
    from capi import Options
    tokens = [3, 1, 4, 1, 5, 9, 2]
    plain = Context(lib, base)
    assert plain.feed(tokens) == 0
    info = plain.info
    for room, want in ((7 * info.prefill_token_bytes, 7), (3 * info.prefill_token_bytes + 5, 3),
                       (2 * info.prefill_token_bytes - 1, 0), (0, 0)):
        ctx = Context(lib, base, arena_bytes=info.arena_bytes + room, options=Options(prefill_batch=7))
        assert ctx.open_status == 0 and ctx.needed == info.arena_bytes
        stats = ctx.stats()
        assert (stats.prefill_batch, stats.arena_bytes) == (want, info.arena_bytes + want * info.prefill_token_bytes)
        assert ctx.feed(tokens) == 0
        assert ctx.logits().tobytes() == plain.logits().tobytes(), room


def test_set_trace_and_the_residual_crcs_of_a_prefill_batch(lib, base):
    """colibri_set_trace installs the hook between feeds (NULL removes it). In a prefill batch every token's record
    carries the CRC-32 of its residual stream after the layer, and the last token's the one after the attention
    half too (the others 0): the reference's bits (Reference.traced)."""
    from capi import TRACE, Options
    tokens = [3, 1, 4, 1, 5]
    records: list[tuple[int, int, int, int]] = []
    hook = TRACE(lambda user, t: records.append((t[0].pos, t[0].layer, t[0].crc_attention, t[0].crc_output)))
    ctx = Context(lib, base, options=Options(prefill_batch=8))
    assert ctx.stats().prefill_batch == 8
    assert lib.so.colibri_set_trace(None, C.cast(hook, C.c_void_p)) == STATUS["E_NULL"]
    assert lib.so.colibri_set_trace(ctx.ctx, C.cast(hook, C.c_void_p)) == 0
    assert ctx.feed(tokens) == 0
    _, sums = Reference(read_image(base)).traced(tokens)
    n_layers = len(sums)
    assert sorted((pos, layer) for pos, layer, _, _ in records) == [(p, l) for p in range(5) for l in range(n_layers)]
    for pos, layer, crc_attention, crc_output in records:
        assert crc_output == sums[layer][pos][1]
        assert crc_attention == (sums[layer][pos][0] if pos == len(tokens) - 1 else 0)
    assert lib.so.colibri_set_trace(ctx.ctx, None) == 0
    assert ctx.feed([2]) == 0 and len(records) == 5 * n_layers


@pytest.fixture(scope="module")
def scalar_lib():
    from conftest import build
    return Lib(build("hosted", kernels="scalar") / "libcolibri.so")


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("dtype", ["f32", "q8_0", "q4_0"])
def test_a_nonfinite_norm_weight_is_named_at_every_dtype(lib, scalar_lib, checkpoints, tmp_path, dtype, value):
    """A NaN or an infinity in a norm weight reaches every matrix that reads the normed vector. With f32 weights
    the dot products carry it to the router and the logits (COLIBRI_E_NONFINITE); quantized weights read the
    vector quantized to Q8_0, whose block holding it must carry it too (a non-finite block scale), not quantize
    it to 0 and return finite logits. The same status on every kernel set (the CPUID-chosen one and the scalar
    reference), and the numpy reference agrees that the logits are not finite."""
    from colibri.image import Role
    from colibri.quant import DType
    from test_verifier import reseal
    image = tmp_path / f"{dtype}.img"
    pack(checkpoints["base"], image, max_seq=16, expert_align=64, dtype=DType.parse(dtype), measure_quality=False)
    data = bytearray(image.read_bytes())
    norm = read_image(bytes(data)).entry(Role.ATTN_NORM, 0)
    struct.pack_into("<f", data, norm.offset + 4 * 3, value)
    data = bytes(reseal(data))
    assert not np.isfinite(Reference(read_image(data)).forward([1])).all()
    for runtime in (scalar_lib, lib):
        ctx = Context(runtime, data)
        assert ctx.open_status == 0
        assert ctx.feed([1, 2, 3]) == STATUS["E_NONFINITE"], ctx.kernels()
        assert ctx.stats().tokens_fed == 0


def test_a_step_whose_feed_fails_leaves_the_sampler_as_it_was(lib, images):
    """colibri_step samples, then feeds the sample; when the feed fails (here the sampled token's embedding is
    NaN: COLIBRI_E_NONFINITE) the call fails, and the sampler's state must be what it was before the call, as
    colibri.h promises for every failed call: the caller's random stream goes on as if the step never ran."""
    from colibri.image import Role
    from test_verifier import reseal
    data = bytearray(images["base"].read_bytes())
    img = read_image(bytes(data))
    embd, row = img.entry(Role.TOKEN_EMBD), 4 * img.dims.hidden_size
    for tok in range(img.dims.vocab_size):
        if tok != 1:  # only the prompt's token is clean: whatever the step samples besides fails its feed
            data[embd.offset + tok * row: embd.offset + (tok + 1) * row] = struct.pack("<f", float("nan")) * img.dims.hidden_size
    ctx = Context(lib, bytes(reseal(data)))
    assert ctx.feed([1]) == 0
    s, tok = Sampler(), C.c_uint32(12345)
    assert lib.so.colibri_sampler_init(C.byref(s), 1.0, 0, 1.0, 8) == 0
    before = s.rng
    assert lib.so.colibri_step(ctx.ctx, C.byref(s), C.byref(tok)) == STATUS["E_NONFINITE"]
    assert s.rng == before
    assert tok.value == 12345 and ctx.stats().tokens_fed == 1


def test_a_header_and_library_that_disagree_are_named(lib, base):
    """colibri_api_version() is the header's COLIBRI_API_VERSION, and a colibri_options or colibri_stats of another
    size than the library's (an application built with another colibri.h) is refused, COLIBRI_E_API_MISMATCH, with
    nothing written into the caller's struct: a smaller one would otherwise be overrun."""
    import re
    from capi import Options, Stats
    from conftest import ROOT
    header = (ROOT / "firmware" / "include" / "colibri.h").read_text()
    lib.so.colibri_api_version.restype = C.c_uint32
    assert lib.so.colibri_api_version() == int(re.search(r"#define COLIBRI_API_VERSION (\d+)u", header).group(1))
    for size in (0, C.sizeof(Options) - 8, C.sizeof(Options) + 8):
        assert Context(lib, base, options=Options(size=size)).open_status == STATUS["E_API_MISMATCH"], size
    ctx = Context(lib, base, options=Options(prefill_batch=4))
    assert ctx.open_status == 0 and ctx.stats().prefill_batch == 4
    smaller = (C.c_uint8 * 24)(*([0xA5] * 24))
    C.cast(smaller, C.POINTER(C.c_uint32))[0] = 24  # an older colibri_stats of 24 bytes
    assert lib.so.colibri_get_stats(ctx.ctx, C.cast(smaller, C.POINTER(Stats))) == STATUS["E_API_MISMATCH"]
    assert bytes(smaller)[4:] == b"\xA5" * 20
    assert lib.so.colibri_get_stats(ctx.ctx, C.byref(Stats(size=C.sizeof(Stats) + 8))) == STATUS["E_API_MISMATCH"]
    lib.so.colibri_strerror.restype = C.c_char_p
    assert b"struct size" in lib.so.colibri_strerror(STATUS["E_API_MISMATCH"])


def test_the_delta_nets_scalar_functions_are_the_references(tmp_path):
    """silu_f, ln_f and softplus_f (blocks/deltanet.c), built from the runtime's source (tests/math_check.c), give
    colibri/arith.py's bits on every 4,099th f32 bit pattern and around each branch: softplus past 20, where 1 + e
    rounds to 1, ln's mantissa switch at sqrt(2), the normal range's ends."""
    import subprocess

    from colibri import arith
    from colibri.paths import runtime_sources
    from conftest import ROOT
    exe = tmp_path / "math_check"
    subprocess.run(["gcc", "-std=c11", "-ffp-contract=off", "-fno-math-errno", "-O2", "-Ifirmware/include",
                    "-Ifirmware/src", "tests/math_check.c", *[str(p) for p in runtime_sources() if p.name != "model.c"],
                    "-o", str(exe)], cwd=ROOT, check=True)
    bits = np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32)
    near = np.array([20.0, 1.41421356, 1.0, -16.6, -17.0, -88.0, -104.0, 88.7, 1e-8, -1e-8], np.float32)
    steps = np.arange(-64, 65, dtype=np.int32)
    around = (near.view(np.int32)[:, None] + steps).ravel().view(np.float32)
    x = np.concatenate([bits.view(np.float32), around, np.float32([np.inf, -np.inf, 0.0, -0.0])])
    x = x[np.isfinite(x)]
    (tmp_path / "in").write_bytes(x.tobytes())
    subprocess.run([str(exe), str(tmp_path / "in"), str(tmp_path / "out")], check=True)
    got = np.frombuffer((tmp_path / "out").read_bytes(), np.float32).reshape(-1, 3)
    with np.errstate(all="ignore"):
        want = [arith.silu(x), arith.ln(np.maximum(x, np.float32(1))), arith.softplus(x)]
    domain = x >= 1
    for name, g, w, where in (("silu", got[:, 0], want[0], slice(None)), ("ln", got[:, 1], want[1], domain),
                              ("softplus", got[:, 2], want[2], slice(None))):
        g, w = g[where], w[where]
        same = (g.view(np.uint32) == w.view(np.uint32)) | (np.isnan(g) & np.isnan(w))
        assert same.all(), (name, x[where][~same][:5], g[~same][:5], w[~same][:5])
    assert (x > 20).sum() > 1000 and ((np.float32(1) + arith.expf(np.minimum(x, 20))) == 1).sum() > 1000
