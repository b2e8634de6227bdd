"""Today's bits on the boards: configurations of tests/test_golden.py run on x86_64_baremetal, cortex_m55,
cortex_m4 (full and lean) and riscv64_virt, and the FreeRTOS builds of the last three, must give the digests pinned
in tests/golden/logits.json, with the prompt fed in one frame (the board's prefill batch) and a token a frame. Same
image, same prompt: the same bits on every board, so the boards share the hosted build's pins. The lean Cortex-M4
build refuses the families whose mechanisms it leaves out, by name, and runs the others.

By default each board runs every family once, at a weight dtype and KV dtype that rotate over the families (every
mechanism, every dtype's kernels and both caches on every board: 23 images a board). COLIBRI_GOLDEN_FULL=1 runs
all 230 configurations on every board (some minutes a board; run it before and after a change that could move
bits, such as issue 28's steps). Each image is placed by QEMU's loader at boot: uploading over the Cortex-M
boards' one-byte UART is slower than booting again."""
from __future__ import annotations

import os

import pytest

from conftest import board_name, build, build_run, with_rtos
from test_families import FAMILIES
from test_golden import AFTER, DTYPES, KV, PROMPT, golden_images, golden_key, pinned, steps_digest
from colibri.image import read_image
from colibri.protocol import Client, DeviceError, Sampling
from colibri.sim.boards import load_board
from colibri.sim.launch import start_board


def _runs() -> list:
    """(board run, lean build): each board, its FreeRTOS builds after it (conftest.with_rtos: skipped saying why where
    the kernel is not here), and the lean Cortex-M4."""
    out = []
    for run in with_rtos(["x86_64_baremetal", "cortex_m55", "cortex_m4", "riscv64_virt"]):
        if isinstance(run, str):
            out.append(pytest.param(run, False, id=run))
        else:
            out.append(pytest.param(run.values[0], False, id=run.values[0], marks=run.marks))
    return out + [pytest.param("cortex_m4", True, id="cortex_m4-lean")]


RUNS = _runs()
LEAN_REFUSES = ("deepseek_v2", "deepseek_v3", "gpt_oss", "gemma4", "granitemoe", "glm4", "lfm2", "qwen35")  # the families (name prefixes) lean=yes leaves out


def selection() -> set[str] | None:
    """The configurations the boards run: None for all of them (COLIBRI_GOLDEN_FULL=1), else each family once,
    family i at dtype i mod 5 and KV dtype (i div 5) mod 2, so that every dtype meets both KV dtypes."""
    if os.environ.get("COLIBRI_GOLDEN_FULL"):
        return None
    return {golden_key(name, DTYPES[i % len(DTYPES)], KV[i // len(DTYPES) % len(KV)])
            for i, (name, _, _) in enumerate(FAMILIES)}


def test_the_rotation_meets_every_dtype_with_both_caches():
    """Every (dtype, KV dtype) pair is run on every board: over all the families, and over those the lean build
    runs too."""
    if os.environ.get("COLIBRI_GOLDEN_FULL"):
        pytest.skip("COLIBRI_GOLDEN_FULL=1 runs every configuration")
    keys = selection()
    assert len(keys) == len(FAMILIES)
    pairs = {(d, k) for d in DTYPES for k in KV}
    of = lambda chosen: {(key.split()[1][6:], key.split()[2][3:]) for key in chosen}  # noqa: E731
    assert of(keys) == pairs
    assert of(k for k in keys if not k.startswith(LEAN_REFUSES)) == pairs


@pytest.fixture(scope="module")
def configurations(tmp_path_factory):
    return golden_images(tmp_path_factory.mktemp("golden"), selection())


def sequence(client: Client, vocab: int, batched: bool) -> str:
    """START, then PROMPT in one frame (batched) or a token a frame, then AFTER a token a frame: the digest of the
    logits after the prompt and after each later token."""
    client.start(Sampling())
    if batched:
        client.feed(PROMPT)
    else:
        for tok in PROMPT:
            client.feed([tok])
    rows = [client.logits(vocab)]
    for tok in AFTER:
        client.feed([tok])
        rows.append(client.logits(vocab))
    return steps_digest(rows)


@pytest.mark.parametrize("board,lean", RUNS)
def test_board_keeps_the_pinned_bits(board, lean, configurations):
    checkpoints, images = configurations
    chosen = selection()
    assert len(images) == (len(chosen) if chosen is not None else len(FAMILIES) * len(DTYPES) * len(KV)) > 0
    want = pinned()
    assert checkpoints == want["checkpoints"], "the checkpoints are not the pinned ones: see tests/test_golden.py"
    firmware = build_run(board) if "@" in board else build(board, lean=lean) / "firmware.elf"
    spec = load_board(board_name(board))
    wrong, ran, refused = [], 0, 0
    for image in images:
        with start_board(spec, firmware, image.path) as device:
            client = Client(device.link, timeout=120)
            if lean and image.family.startswith(LEAN_REFUSES):
                with pytest.raises(DeviceError, match="COLIBRI_E_UNSUPPORTED"):
                    client.open()
                refused += 1
            else:
                info = client.open()
                windowed = read_image(image.path.read_bytes()).dims.sliding_window != 0  # lean: a token a pass (colibri.c)
                assert (info.prefill_batch > 1) != (lean and windowed), f"{image.key}: prefill batch {info.prefill_batch}"
                for batched in (True, False):
                    if sequence(client, info.vocab_size, batched) != want["logits"][image.key]:
                        wrong.append(f"{image.key} ({'prompt in one frame' if batched else 'a token a frame'})")
                ran += 1
            client.quit()
        assert device.guest_code == 0, device.describe()
    assert not wrong, f"{len(wrong)} of {2 * ran} runs differ from the pins, the first: " + "; ".join(wrong[:5])
    runs = sum(not image.family.startswith(LEAN_REFUSES) for image in images) if lean else len(images)
    assert ran + refused == len(images) and ran == runs > 0
