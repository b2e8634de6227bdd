"""colibri/kquant.py, the port of llama.cpp's Q4_K / Q5_K / Q6_K reference quantizers, against llama.cpp's own
bytes: tests/fixtures/kquant/llama-cpp-kquants.npz, written by tools/make_kquant_fixture.py through ctypes in
llama.cpp's libggml-base.so (quantize_row_q*_K_ref, checked there against ggml_quantize_chunk). Needs neither."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from colibri import kquant
from colibri.kquant import BLOCK_BYTES, QK_K, QUANTIZERS

FIXTURE = Path(__file__).parent / "fixtures" / "kquant" / "llama-cpp-kquants.npz"
GGUF_TYPE = {"q4_k": gguf.GGMLQuantizationType.Q4_K, "q5_k": gguf.GGMLQuantizationType.Q5_K,
             "q6_k": gguf.GGMLQuantizationType.Q6_K}
BITS = {"q4_k": 4, "q5_k": 5, "q6_k": 6}
# cases outside f16's range, where d underflows to 0 or a subnormal, or overflows to inf: byte-exact all the same,
# but no error bound holds
OUT_OF_F16_RANGE = {"zeros", "tiny", "huge-1e8"}


@pytest.fixture(scope="module")
def fixture() -> dict[str, np.ndarray]:
    with np.load(FIXTURE) as f:
        return {k: f[k] for k in f.files}


@pytest.fixture(scope="module")
def ours(fixture) -> dict[str, np.ndarray]:
    return {name: quantize(fixture["x"]) for name, quantize in QUANTIZERS.items()}


def dequantize(blocks: np.ndarray, name: str) -> np.ndarray:
    rows = blocks.shape[0]
    with np.errstate(invalid="ignore"):  # huge-1e8's inf d times a zero code
        return gguf.quants.dequantize(blocks.reshape(rows, -1), GGUF_TYPE[name]).reshape(rows, -1)


def test_fixture_is_not_trivial(fixture):
    """The fixture keeps testing something: many distinct rows and cases, llama.cpp's bytes varied and not zero,
    and the quantizers' corner paths present in them."""
    x, case = fixture["x"], fixture["case"]
    assert x.dtype == np.float32 and x.shape[0] >= 64 and x.shape[1] >= 512 and x.shape[1] % QK_K == 0
    assert np.isfinite(x).all()
    assert len(set(case)) >= 12 and len(case) == len(x)
    assert len(np.unique(x, axis=0)) >= len(x) - 8  # only the constant/zero rows may repeat
    for name, nbytes in BLOCK_BYTES.items():
        ref = fixture[name]
        assert ref.dtype == np.uint8 and ref.shape == (len(x), x.shape[1] // QK_K, nbytes)
        blocks = ref.reshape(-1, nbytes)
        assert len(np.unique(blocks, axis=0)) >= 0.9 * len(blocks)
        assert (blocks != 0).any(axis=1).sum() >= 0.9 * len(blocks)
    # Q4_K: sub-blocks whose 6-bit scale rounds to 0 (make_qkx2_quants' codes kept), and d overflowing f16
    q4 = fixture["q4_k"].reshape(-1, 144)
    ls = np.concatenate([q4[:, 4:8] & 63, (q4[:, 12:16] & 0xF) | (q4[:, 4:8] >> 6) << 4], axis=1)
    live = np.abs(x.reshape(-1, 8, 32)).max(axis=2) > 0
    assert ((ls == 0) & live).sum() >= 10
    assert np.isinf(q4[:, 0:2].copy().view(np.float16)).any()
    # Q6_K: all-zero blocks, int8 scales of both signs, at -128 and rounded to 0 on live sub-blocks
    q6 = fixture["q6_k"].reshape(-1, 210)
    sc = q6[:, 192:208].view(np.int8)
    live = np.abs(x.reshape(-1, 16, 16)).max(axis=2) > 0
    assert (q6 == 0).all(axis=1).any() and (sc < 0).any() and (sc == -128).any() and (sc > 0).any()
    assert ((sc == 0) & live).sum() >= 10


@pytest.mark.parametrize("name", sorted(QUANTIZERS))
def test_byte_identical_to_llama_cpp(fixture, ours, name):
    ref, got = fixture[name], ours[name]
    assert got.dtype == np.uint8 and got.shape == ref.shape
    differ = (got != ref).any(axis=(1, 2))
    bad = sorted(set(fixture["case"][differ]))
    assert not differ.any(), f"{name}: {differ.sum()} of {len(ref)} rows differ from llama.cpp's, cases {bad}"


@pytest.mark.parametrize("name", sorted(QUANTIZERS))
def test_dequantized(fixture, ours, name):
    """gguf's dequantizer reads our blocks as llama.cpp's, and they are near the input: every value within
    max|x| / 2**(bits - 1) of its super-block's largest |x| (twice a b-bit code's half step over +-max|x|, room
    for the rounded 6- or 8-bit sub-block scales), where the scales are ordinary f16 numbers."""
    x, case = fixture["x"], fixture["case"]
    got = dequantize(ours[name], name)
    np.testing.assert_array_equal(got, dequantize(fixture[name], name))
    assert (got[case == "zeros"] == 0).all()
    keep = ~np.isin(case, list(OUT_OF_F16_RANGE))
    xb, gb = x[keep].reshape(-1, QK_K), got[keep].reshape(-1, QK_K)
    err = np.abs(gb - xb).max(axis=1)
    bound = np.abs(xb).max(axis=1) / 2 ** (BITS[name] - 1)
    assert (err <= bound).all(), f"{name}: worst error {np.max(err / bound):.2f} x the bound"


@pytest.mark.parametrize("name", sorted(QUANTIZERS))
def test_blocks_are_independent(fixture, name):
    """A super-block's bytes depend on its 256 values only: the first columns alone give the first blocks."""
    x, ref = fixture["x"], fixture[name]
    np.testing.assert_array_equal(QUANTIZERS[name](x[:7, :QK_K]), ref[:7, :1])
    np.testing.assert_array_equal(QUANTIZERS[name](x[:0]), ref[:0])


@pytest.mark.parametrize("name", sorted(QUANTIZERS))
def test_bad_input(name):
    quantize = QUANTIZERS[name]
    with pytest.raises(ValueError, match="not a multiple of 256"):
        quantize(np.zeros((2, 300), np.float32))
    with pytest.raises(ValueError, match="2-D"):
        quantize(np.zeros(512, np.float32))
    x = np.zeros((2, 256), np.float32)
    x[1, 5] = np.nan
    with pytest.raises(ValueError, match="row 1"):
        quantize(x)


def test_values_whose_scale_overflows_are_refused():
    """Values so large that the Q6_K search overflows (about 1e15) leave a NaN scale where llama.cpp's order writes
    another block: refused in one line rather than packed into an image that stops with COLIBRI_E_NONFINITE."""
    rows = (np.random.default_rng(0).standard_normal((2, 256)) * 1e15).astype(np.float32)
    with pytest.raises(ValueError, match="too large for Q6_K"):
        kquant.quantize_q6_k(rows)
