"""The block dtypes (Q4_1, Q5_0, Q5_1, MXFP4, Q4_K, Q5_K, Q6_K: GGUF's blocks kept as they are, docs/FORMAT.md):
a GGUF file's tensors of those types land in the image byte for byte, and decode to what `gguf.dequantize` gives;
packing from floats quantizes by llama.cpp's rules (the K-quants through colibri/kquant.py, tests/test_kquant.py);
and every board computes the numpy reference's bits with them (docs/KERNELS.md's order), on its optimized build,
the scalar build and the hosted board's threads."""
from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest

from capi import STATUS, Lib
from conftest import MODEL_BOARDS, WIDE, TinyConfig, assert_bit_identical, board_name, build, make_checkpoint
from colibri import block_dtypes, flash, kquant
from colibri.format import ENTRY_OFFSETS, OFFSET_DTYPES
from colibri.gguf_input import unpermute
from colibri.image import ENTRY_BYTES, HEADER_BYTES, Role, read_image
from colibri.pack import pack
from colibri.protocol import Sampling
from colibri.quant import DType, encode, from_gguf_blocks
from colibri.reference import Reference
from test_gguf import FIXTURES
from test_verifier import reseal

BLOCK = [DType.Q4_1, DType.Q5_0, DType.Q5_1, DType.MXFP4, DType.Q4_K, DType.Q5_K, DType.Q6_K]
# every matrix a whole number of K-quant blocks (hidden and FFN 256), so --dtype q4_k stores Q4_K everywhere
K256 = TinyConfig("k256", vocab=97, hidden=256, ffn=256, layers=2, heads=4, kv_heads=2, experts=4, top_k=2, seed=6)
# llama.cpp's quantizer's files (tools/make_gguf_fixtures.py): each block type, beside the Q6_K output matrix
FILES = ["mixtral-q4_1", "mixtral-q5_0", "mixtral-q5_1", "mixtral-q4_k_m", "mixtral-q5_k_m", "mixtral-q6_k"]
PROMPT = [1, 5, 9, 3, 40, 17]
NEW_TOKENS = 6


@pytest.fixture(scope="module")
def k256_checkpoint(tmp_path_factory):
    return make_checkpoint(K256, tmp_path_factory.mktemp("k256") / "k256")


def runs_everywhere(image, firmwares, prompt: list[int], new: int) -> dict:
    """The image on every model board, the hosted board's scalar build and its threads: name -> run."""
    runs = {board: flash.run_on_board(image, board_name(board), prompt, new, Sampling(), True, firmware=firmwares[board])
            for board in MODEL_BOARDS}
    runs["hosted, kernels=scalar"] = flash.run_on_board(image, "hosted", prompt, new, Sampling(), True,
                                                        firmware=build("hosted", kernels="scalar") / "firmware.elf")
    for threads in (2, 3):
        runs[f"hosted, {threads} threads"] = flash.run_on_board(image, "hosted", prompt, new, Sampling(), True,
                                                                firmware=firmwares["hosted"], threads=threads)
    return runs


def assert_reference_bits_everywhere(image, runs: dict, prompt: list[int]) -> None:
    first = runs["hosted"]
    expected = Reference(read_image(image.read_bytes())).forward(prompt + first.tokens)
    assert_bit_identical(first.logits, expected)
    assert first.tokens == [int(np.argmax(row)) for row in expected[len(prompt) - 1:-1]]
    for name, run in runs.items():
        assert run.tokens == first.tokens, name
        assert run.logits.tobytes() == first.logits.tobytes(), f"{name} differs from hosted"


@pytest.mark.parametrize("dtype", BLOCK, ids=lambda d: d.name.lower())
def test_the_schemas_offset_column_decodes_as_gguf_does(dtype, monkeypatch):
    """format/schema.toml's `offset` column (OFFSET_DTYPES here, DTYPE_OFFSET_MASK in format.h) is what every kernel
    set and the reference add c's term for: with it, blocks of the dtype (rows with a mean, so Q4_1's m and the
    K-quants' mins are not 0) decode to gguf.dequantize's values; a column that gave Q5_0 an offset or took Q4_1's
    is refused (the layout has no c, or drops one)."""
    rng = np.random.default_rng(34)
    x = (rng.standard_normal((4, 512)) * 0.1 + rng.standard_normal((4, 1)) * 0.05).astype(np.float32)
    enc = encode(x, dtype)
    exact = gguf.dequantize(enc.values.reshape(len(x), -1), gguf.GGMLQuantizationType[dtype.name])
    np.testing.assert_array_equal(enc.decode(), exact)
    assert (enc.block_terms()[2] is not None) == (dtype.name in OFFSET_DTYPES)
    monkeypatch.setattr(block_dtypes, "OFFSET_DTYPES", OFFSET_DTYPES ^ {dtype.name})
    with pytest.raises(ValueError, match="format/schema.toml says"):
        enc.decode()


@pytest.mark.parametrize("dtype", BLOCK, ids=lambda d: d.name.lower())
def test_packed_from_floats_on_every_board(dtype, k256_checkpoint, firmwares, tmp_path):
    """--dtype q4_k (and each block dtype) of an f32 checkpoint: every large matrix in that dtype, a K-quant's bytes
    those of llama.cpp's quantizer (the port tests/test_kquant.py holds to llama.cpp's own), and the reference's bits
    on every board."""
    image = tmp_path / "m.img"
    pack(k256_checkpoint, image, 32, 64, dtype=dtype, measure_quality=False)
    img = read_image(image.read_bytes())
    matrices = [e for e in img.entries if e.role in (Role.WQ, Role.WO, Role.EXPERT_GATE, Role.EXPERT_DOWN, Role.LM_HEAD)]
    assert matrices and all(DType(e.dtype) == dtype for e in matrices)
    if dtype.name.lower() in kquant.QUANTIZERS:
        from safetensors.numpy import load_file
        weights = load_file(k256_checkpoint / "model.safetensors")
        wo = weights["model.layers.1.self_attn.o_proj.weight"].astype(np.float32)
        assert img.encoded(Role.WO, 1).values.tobytes() == kquant.QUANTIZERS[dtype.name.lower()](wo).tobytes()
    assert_reference_bits_everywhere(image, runs_everywhere(image, firmwares, PROMPT, NEW_TOKENS), PROMPT)


def test_k_quant_rows_that_are_not_whole_blocks_fall_back(tmp_path):
    """A row that is not a whole number of 256-element blocks (WIDE's hidden 264) takes llama.cpp's fallback type
    (llama-quant.cpp's tensor_type_fallback): Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, its last block zero-padded
    (where llama.cpp, whose blocks cannot be partial, takes F16 for a row that is not whole blocks of 32 either)."""
    src = make_checkpoint(WIDE, tmp_path / "wide")
    for asked, fallback in ((DType.Q4_K, DType.Q5_0), (DType.Q5_K, DType.Q5_1), (DType.Q6_K, DType.Q8_0)):
        pack(src, tmp_path / "m.img", 32, 64, dtype=asked, measure_quality=False)
        img = read_image((tmp_path / "m.img").read_bytes())
        assert DType(img.entry(Role.WQ, 0).dtype) == fallback, asked


def test_the_pack_report_names_the_k_quant_fallback(k256_checkpoint, tmp_path, capsys):
    """--dtype q4_k on a model whose rows are not whole 256-element blocks (WIDE's hidden 264, FFN 72) stores those
    matrices in llama.cpp's fallback type: the report says so, how many and why, where before it said nothing (the
    image line showed q5_0 alone, for a pack asked to make q4_k); a model of whole blocks gets no such line (review
    of issue 34)."""
    from colibri import pack as pack_cli
    src = make_checkpoint(WIDE, tmp_path / "wide")
    assert pack_cli.main([str(src), "-o", str(tmp_path / "w.img"), "--max-seq", "32", "--dtype", "q4_k",
                          "--no-quality"]) == 0
    img = read_image((tmp_path / "w.img").read_bytes())
    fell = sum(e.dtype == DType.Q5_0 for e in {e.offset: e for e in img.entries}.values())
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("  fallback"))
    assert f"{fell} q4_k matrices stored as q5_0" in line and "not whole 256-element blocks" in line, line
    assert pack_cli.main([str(k256_checkpoint), "-o", str(tmp_path / "k.img"), "--max-seq", "32", "--dtype", "q4_k",
                          "--no-quality"]) == 0
    assert "fallback" not in capsys.readouterr().out


def test_the_converted_line_suggests_no_dtype_it_already_has(tmp_path, capsys):
    """An IQ4_XS file packed with --dtype q4_k: the report's converted line must not advise `--dtype q4_k smaller`
    (that is what it did), nor --dtype f32 to a pack that asked for f32 (review of issue 34)."""
    from colibri import pack as pack_cli
    src = FIXTURES / "mixtral-iq4_xs.gguf"
    for dtype, absent in (("q4_k", "--dtype q4_k smaller"), ("f32", "--dtype f32 keeps them exact")):
        assert pack_cli.main([str(src), "-o", str(tmp_path / "x.img"), "--max-seq", "32", "--dtype", dtype,
                              "--no-quality"]) == 0
        line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("  converted"))
        assert absent not in line, line
    assert pack_cli.main([str(src), "-o", str(tmp_path / "x.img"), "--max-seq", "32", "--dtype", "q8_0",
                          "--no-quality"]) == 0
    assert "--dtype q4_k smaller" in capsys.readouterr().out  # where it is smaller, it still says so


def file_tensors_in_image(img, name: str, t) -> list[tuple[object, object]]:
    """(the file's tensor as stored, the image's) for a GGUF tensor the image keeps as it is: the q rows of a
    `llama` file reordered back, the routed experts one by one."""
    raw = from_gguf_blocks(t.data, DType[t.tensor_type.name], tuple(int(n) for n in reversed(t.shape)))
    layer = int(name.split(".")[1]) if name.startswith("blk.") else None
    kind = name.split(".")[-2]
    simple = {"token_embd": Role.TOKEN_EMBD, "output": Role.LM_HEAD, "attn_v": Role.WV, "attn_output": Role.WO}
    if kind in simple:
        return [(raw, img.encoded(simple[kind], *(() if layer is None else (layer,))))]
    if kind == "attn_q":
        return [(raw.map_rows(lambda a: unpermute(a, img.dims.n_heads)), img.encoded(Role.WQ, layer))]
    experts = {"ffn_gate_exps": Role.EXPERT_GATE, "ffn_up_exps": Role.EXPERT_UP, "ffn_down_exps": Role.EXPERT_DOWN}
    if kind in experts:
        return [(raw[e], img.encoded(experts[kind], layer, e)) for e in range(img.dims.n_experts)]
    return []


@pytest.mark.parametrize("name", FILES)
def test_gguf_blocks_carry_over_unchanged(name, firmwares, tmp_path):
    """--dtype stored of a file llama.cpp's quantizer wrote: each tensor of a block type in the image with the same
    bytes, decoding to gguf.dequantize's values (a zero's sign aside: Q6_K's q * scale is 0 before d multiplies it);
    the file's mix of types kept; every board gives the reference's bits."""
    src = FIXTURES / f"{name}.gguf"
    image = tmp_path / "m.img"
    pack(src, image, 32, 64, dtype=None, measure_quality=False)
    img = read_image(image.read_bytes())
    kept, types = 0, set()
    for t in gguf.GGUFReader(str(src)).tensors:
        if t.tensor_type.name not in {d.name for d in BLOCK}:
            continue
        for stored, packed in file_tensors_in_image(img, t.name, t):
            assert packed.dtype == stored.dtype and packed.values.tobytes() == stored.values.tobytes(), t.name
            exact = gguf.dequantize(stored.values.reshape(-1), gguf.GGMLQuantizationType[t.tensor_type.name])
            np.testing.assert_array_equal(packed.decode().reshape(-1), exact.reshape(-1)[:packed.decode().size])
            kept += 1
            types.add(t.tensor_type.name)
    assert kept >= 10 and types <= {k.upper() for k in img.bytes_by_dtype()}  # every block type the file has
    # the image's quantized bytes are the file's: the same tensors, nothing requantized or widened
    file_bytes = sum(int(t.n_bytes) for t in gguf.GGUFReader(str(src)).tensors if t.tensor_type.name in {
        d.name for d in DType if d.quantized})
    assert sum(v for k, v in img.bytes_by_dtype().items() if DType[k.upper()].quantized) == file_bytes
    runs = {b: flash.run_on_board(image, board_name(b), PROMPT, NEW_TOKENS, Sampling(), True, firmware=firmwares[b])
            for b in MODEL_BOARDS}
    assert_reference_bits_everywhere(image, runs, PROMPT)


def rounded_as_the_dots_round(x):
    """x (a torch tensor, last axis the columns) as a quantized dot product reads it: in blocks of 32 (the last
    zero-padded), d = amax / 127 and each value round(v / d) d, as arith.quantize_q8_0 and the kernels do."""
    import torch
    cols = x.shape[-1]
    blocks = torch.nn.functional.pad(x, (0, -cols % 32)).reshape(*x.shape[:-1], -1, 32)
    d = blocks.abs().amax(dim=-1, keepdim=True) / 127
    inv = torch.where(d != 0, 1 / d, torch.zeros_like(d))
    q = torch.round(torch.clamp(blocks * inv, -127, 127))  # (ties to even, as rint)
    return (q * d).reshape(*x.shape[:-1], -1)[..., :cols]


def transformers_logits(src, tokens: list[int], n_experts: int, rounded: bool) -> np.ndarray:
    """transformers on the file's dequantized weights (colibri.oracle), with every matrix's input `rounded` as the
    device rounds it when the matrix is quantized: in these files every matrix but the router's (F32, of n_experts
    rows) is."""
    import torch
    from unittest import mock
    from colibri.oracle import checkpoint_logits
    linear = torch.nn.functional.linear

    def linear_of_rounded_inputs(x, w, b=None):
        return linear(rounded_as_the_dots_round(x) if w.shape[0] != n_experts else x, w, b)
    with mock.patch("torch.nn.functional.linear", linear_of_rounded_inputs if rounded else linear):
        return checkpoint_logits(src, tokens)


@pytest.mark.parametrize("name", FILES)
def test_gguf_blocks_match_transformers_within_the_activations_rounding(name, firmwares, tmp_path):
    """--dtype stored of llama.cpp's file against transformers run on the file's dequantized weights. The device
    computes with those weights exactly but rounds each quantized matrix's input to 8-bit blocks (Q8_0's rule), so
    the bound is what that rounding alone makes inside transformers (its matrix inputs rounded the same way): the
    device is at most twice as far from plain transformers, in the largest and in the mean difference (measured:
    1.00-1.22x and 0.98-1.07x over these files), each greedy token within that reach of transformers' best, and the
    rounding's effect is far above the f32 bound, so a wrong weight cannot hide in it. (The device is not held to
    the rounded transformers itself: the two compute each norm's rounding differently in the last bit, which moves
    an input across a rounding boundary now and then, by a whole step; over these files the device sits as far from
    it as from plain transformers.)"""
    src = FIXTURES / f"{name}.gguf"
    image = tmp_path / "m.img"
    pack(src, image, 32, 64, dtype=None, measure_quality=False)
    img = read_image(image.read_bytes())
    large = [e for e in img.entries if e.role in (Role.WQ, Role.WK, Role.WV, Role.WO, Role.EXPERT_GATE,
                                                  Role.EXPERT_UP, Role.EXPERT_DOWN, Role.LM_HEAD)]
    assert large and all(DType(e.dtype).quantized for e in large)  # (what transformers_logits rounds)
    prompt = [1, 5, 9, 3, 60, 2, 33]
    run = flash.run_on_board(image, "hosted", prompt, NEW_TOKENS, Sampling(), True, firmware=firmwares["hosted"])
    tokens = prompt + run.tokens
    plain = transformers_logits(src, tokens, img.dims.n_experts, rounded=False)
    rounded = transformers_logits(src, tokens, img.dims.n_experts, rounded=True)
    f32_bound = 1e-4 * max(1.0, float(np.abs(plain).max()))  # the f32 image's (test_gguf.py)
    rounding = np.abs(rounded - plain)
    assert rounding.max() > 10 * f32_bound
    device = np.abs(run.logits - plain)
    assert device.max() <= 2 * rounding.max() + f32_bound and device.mean() <= 2 * rounding.mean() + f32_bound
    for i, token in enumerate(run.tokens):
        row = plain[len(prompt) - 1 + i]
        assert row[token] >= row.max() - 2 * rounding.max(), i


def _entry_field(i: int, field: str) -> int:
    return HEADER_BYTES + i * ENTRY_BYTES + ENTRY_OFFSETS[field]


def test_verifier_refuses_a_k_quant_row_that_is_not_whole_blocks(hosted_build, tmp_path):
    """The input vector is quantized in blocks of 32 only as far as a row's columns reach, so a K-quant row must be
    whole 256-element blocks: an entry claiming Q4_K for 264 columns, with every size consistent and the image
    resealed, is refused (COLIBRI_E_IMAGE_TABLE). The same entry as Q4_1 (blocks of 32, smaller) verifies, so the
    refusal is the rule's and not another check's."""
    lib = Lib(hosted_build / "libcolibri.so")
    src = make_checkpoint(WIDE, tmp_path / "wide")
    pack(src, tmp_path / "m.img", 32, 64, dtype=DType.Q5_0, measure_quality=False)
    data = (tmp_path / "m.img").read_bytes()
    img = read_image(data)
    i = next(k for k, e in enumerate(img.entries) if e.role == Role.WO)
    rows, cols = img.entries[i].shape
    assert cols % 256 and lib.verify(data)[0] == 0

    def as_dtype(dtype: DType) -> bytes:
        buf = bytearray(data)
        struct.pack_into("<H", buf, _entry_field(i, "dtype"), dtype)
        struct.pack_into("<I", buf, _entry_field(i, "group_size"), dtype.block)
        struct.pack_into("<Q", buf, _entry_field(i, "bytes"), rows * -(-cols // dtype.block) * dtype.block_bytes)
        return bytes(reseal(buf))
    assert lib.verify(as_dtype(DType.Q4_1))[0] == 0
    assert lib.verify(as_dtype(DType.Q4_K))[0] == STATUS["E_IMAGE_TABLE"]


def test_gpt_oss_gguf_experts_stay_mxfp4(firmwares, tmp_path):
    """llama.cpp's converter keeps gpt-oss's experts as MXFP4: --dtype stored keeps them so (each expert's bytes
    the file's, through gpt-oss's layout and back), and hosted and x86_64 bare metal give the reference's bits."""
    src = FIXTURES / "converted-gpt-oss-q8_0.gguf"
    image = tmp_path / "m.img"
    pack(src, image, 32, 64, dtype=None, measure_quality=False)
    img = read_image(image.read_bytes())
    stacks = {t.name: t for t in gguf.GGUFReader(str(src)).tensors if t.name.endswith("_exps.weight")}
    roles = {"ffn_gate_exps": Role.EXPERT_GATE, "ffn_up_exps": Role.EXPERT_UP, "ffn_down_exps": Role.EXPERT_DOWN}
    for name, t in stacks.items():
        assert t.tensor_type == gguf.GGMLQuantizationType.MXFP4
        raw = from_gguf_blocks(t.data, DType.MXFP4, tuple(int(n) for n in reversed(t.shape)))
        layer, role = int(name.split(".")[1]), roles[name.split(".")[2]]
        for e in range(img.dims.n_experts):
            assert img.encoded(role, layer, e).values.tobytes() == raw[e].values.tobytes(), (name, e)
    runs = {b: flash.run_on_board(image, b, [15496, 995, 11], 3, Sampling(), True, firmware=firmwares[b])
            for b in ("hosted", "x86_64_baremetal")}
    assert_reference_bits_everywhere(image, runs, [15496, 995, 11])


def test_a_scaled_tensor_keeps_its_file_type_when_stored(tmp_path):
    """Granite's multipliers are folded into some matrices when packing (their values are no longer the file's):
    --dtype stored quantizes them again to the type the file stores them in, rather than widening them to f32."""
    image = tmp_path / "g.img"
    pack(FIXTURES / "converted-granitemoe-q8_0.gguf", image, 32, 64, dtype=None, measure_quality=False)
    img = read_image(image.read_bytes())
    scaled = [e for e in img.entries if e.role in (Role.TOKEN_EMBD, Role.WO, Role.EXPERT_DOWN, Role.LM_HEAD)]
    assert scaled and {DType(e.dtype) for e in scaled} == {DType.Q8_0}


def test_rows_the_reader_splits_off_keep_their_file_type_when_stored(tmp_path):
    """--dtype stored keeps a GGUF tensor's blocks where the image takes whole rows of it: Gemma 4's routed experts
    (cut from the layer's fused gate_up and down, expert by expert) and Qwen3.5's query rows (cut from its gated q
    projection, head by head) are the file's Q8_0 bytes, where they came out f32 (4.3 times their bytes)."""
    stored = {}
    for name in ("converted-gemma4-q8_0", "converted-qwen35moe-q8_0"):
        src = FIXTURES / f"{name}.gguf"
        pack(src, tmp_path / "m.img", 32, 64, dtype=None, measure_quality=False)
        stored[name] = read_image((tmp_path / "m.img").read_bytes()), {t.name: t for t in gguf.GGUFReader(str(src)).tensors}
    img, tensors = stored["converted-gemma4-q8_0"]
    F = img.dims.ffn_size
    fused = tensors["blk.0.ffn_gate_up_exps.weight"]
    assert fused.tensor_type == gguf.GGMLQuantizationType.Q8_0
    raw = from_gguf_blocks(fused.data, DType.Q8_0, tuple(int(n) for n in reversed(fused.shape)))
    for e in range(img.dims.n_experts):
        for role, rows in ((Role.EXPERT_GATE, slice(0, F)), (Role.EXPERT_UP, slice(F, 2 * F))):
            got = img.encoded(role, 0, e)
            assert got.dtype == DType.Q8_0 and got.values.tobytes() == raw[e].values[rows].tobytes(), (role, e)
            assert got.scales.tobytes() == raw[e].scales[rows].tobytes(), (role, e)
    img, tensors = stored["converted-qwen35moe-q8_0"]
    layer = next(k for k in range(img.dims.n_layers) if f"blk.{k}.attn_q.weight" in tensors)
    q = tensors[f"blk.{layer}.attn_q.weight"]
    H, hd = img.dims.n_heads, img.dims.head_dim
    raw = from_gguf_blocks(q.data, DType.Q8_0, tuple(int(n) for n in reversed(q.shape)))
    query = np.arange(2 * H * hd).reshape(H, 2, hd)[:, 0].reshape(-1)
    got = img.encoded(Role.WQ, layer)
    assert got.dtype == DType.Q8_0 and got.values.tobytes() == raw.values[query].tobytes()
