"""Every weight dtype (and the f16 KV cache) on every board: the numpy reference as the oracle, and
the same bytes everywhere, with each board's optimized kernels on, on an x86 CPU without AVX2, with
the scalar kernels (`scons kernels=scalar`), and on the hosted boards' threads (Linux and Windows)."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import (EVERY_BOARD, WIDE, assert_bit_identical, board_name, build, build_run, make_checkpoint,
                      with_rtos)
from colibri import flash
from colibri.image import read_image
from colibri.pack import pack
from colibri.protocol import Sampling
from colibri.quant import DType
from colibri.reference import Reference

PROMPT = [1, 5, 9, 3, 40, 77]
NEW_TOKENS = 10
# (dtype, kv cache): every weight dtype, and an f16 KV cache. The device must give the reference's bits in each.
VARIANTS = [(DType.F32, "f32"), (DType.F16, "f32"), (DType.BF16, "f32"), (DType.Q8_0, "f32"), (DType.Q4_0, "f32"),
            (DType.Q8_0, "f16")]


@pytest.fixture(scope="module")
def wide_checkpoint(tmp_path_factory):
    return make_checkpoint(WIDE, tmp_path_factory.mktemp("wide") / "wide")


@pytest.fixture(scope="module")
def scalar_firmware():
    return build("hosted", kernels="scalar") / "firmware.elf"


@pytest.mark.parametrize("boards", EVERY_BOARD)
@pytest.mark.parametrize("dtype,kv", VARIANTS, ids=[f"{d.name.lower()}-kv{k}" for d, k in VARIANTS])
def test_dtype_on_every_board(dtype, kv, boards, wide_checkpoint, firmwares, scalar_firmware, tmp_path):
    image = tmp_path / "wide.img"
    pack(wide_checkpoint, image, 32, 64, dtype=dtype, kv=kv, measure_quality=False)
    ref = Reference(read_image(image.read_bytes()))

    runs = {board: flash.run_on_board(image, board_name(board), PROMPT, NEW_TOKENS, Sampling(), True,
                                      firmware=firmwares[board]) for board in boards}
    runs["x86_64 without AVX2"] = flash.run_on_board(image, "x86_64_baremetal", PROMPT, NEW_TOKENS, Sampling(), True,
                                                     firmware=firmwares["x86_64_baremetal"],
                                                     board_args=["-cpu", "Nehalem"])
    runs["hosted, kernels=scalar"] = flash.run_on_board(image, "hosted", PROMPT, NEW_TOKENS, Sampling(), True,
                                                        firmware=scalar_firmware)
    threaded = {"hosted": (2, 3), "hosted_windows": (3,)}  # every matrix of this model is split (3: unevenly)
    for board, counts in threaded.items():
        for threads in counts:
            runs[f"{board}, {threads} threads"] = flash.run_on_board(image, board, PROMPT, NEW_TOKENS, Sampling(), True,
                                                                     firmware=firmwares[board], threads=threads)
    from test_kernels import EXPECTED_KERNELS
    kernels = {**{board: EXPECTED_KERNELS[board_name(board)] for board in boards},
               "x86_64 without AVX2": "scalar", "hosted, kernels=scalar": "scalar",
               **{f"{board}, {t} threads": EXPECTED_KERNELS[board] for board, counts in threaded.items() for t in counts}}
    assert {name: run.kernels for name, run in runs.items()} == kernels  # each board really used its own
    first = runs["hosted"]
    expected = ref.forward(PROMPT + first.tokens)  # the reference fed the device's tokens
    assert_bit_identical(first.logits, expected, f"{dtype.name} kv {kv}")
    assert first.tokens == [int(np.argmax(row)) for row in expected[len(PROMPT) - 1:-1]]
    for name, run in runs.items():
        assert run.tokens == first.tokens, name
        assert run.logits.tobytes() == first.logits.tobytes(), f"{name} differs from hosted"


@pytest.mark.parametrize("boards", EVERY_BOARD)
def test_sampled_tokens_agree_across_boards_q4(boards, wide_checkpoint, firmwares, tmp_path):
    """Temperature sampling reads every logit bit: one seed, one token stream on every board."""
    image = tmp_path / "q4.img"
    pack(wide_checkpoint, image, 32, 64, dtype=DType.Q4_0, measure_quality=False)
    streams = {board: flash.run_on_board(image, board_name(board), PROMPT, 12, Sampling(0.9, 0, 0.95, 3), False,
                                         firmware=firmwares[board]).tokens for board in boards}
    assert len({tuple(s) for s in streams.values()}) == 1, streams


@pytest.mark.parametrize("board", with_rtos(["cortex_m55", "x86_64_baremetal"]))
@pytest.mark.parametrize("dtype", [DType.Q8_0, DType.Q4_0])
def test_a_nan_norm_weight_is_named_on_boards_with_their_own_quantizer(board, dtype, wide_checkpoint, tmp_path):
    """Helium's and AVX2's activation quantizers (kernels_mve.c, kernels_x86.c) carry a NaN in a normed vector
    into their block's scale as the scalar one does, so a quantized image with a NaN norm weight stops with
    COLIBRI_E_NONFINITE there too, as an f32 one does (tests/test_runtime_api.py covers the hosted sets)."""
    import struct

    from colibri.image import Role
    from colibri.protocol import DeviceError
    from test_verifier import reseal
    image = tmp_path / "wide.img"
    pack(wide_checkpoint, image, max_seq=16, expert_align=64, dtype=dtype, measure_quality=False)
    data = bytearray(image.read_bytes())
    struct.pack_into("<f", data, read_image(bytes(data)).entry(Role.ATTN_NORM, 0).offset + 4 * 100, float("nan"))
    image.write_bytes(bytes(reseal(data)))
    with pytest.raises(DeviceError) as err:
        flash.run_on_board(image, board_name(board), PROMPT, 1, Sampling(), False, firmware=build_run(board))
    assert "COLIBRI_E_NONFINITE" in str(err.value)
