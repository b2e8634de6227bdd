"""tests/test_device.py's checks on labgrid farm places instead of boards started here: each image's logits
bit-identical to the numpy reference, its greedy tokens the reference's, seeded sampling that repeats itself; and
a random image's, which needs no checkpoint made.

Not collected by a plain `pytest tests` (no farm there); run it against a farm with the plugin:

    pytest -p colibri.farm.pytest_plugin --farm-place board=cortex_m55 tests/farm_device_checks.py
    pytest -p colibri.farm.pytest_plugin --lg-env farm.yaml tests/farm_device_checks.py

tests/test_farm.py runs it against QEMU boards it exports itself.
"""
from __future__ import annotations

import pytest

from conftest import CONFIGS, assert_bit_identical
from colibri.image import read_image
from colibri.protocol import Sampling
from colibri.quant import DType
from colibri.reference import Reference
from colibri.synthetic import moe_dims, random_image

PROMPT = [1, 5, 9, 3]


@pytest.mark.parametrize("name", [c.name for c in CONFIGS])
def test_device_matches_reference(farm_place, name, images):
    image = images[name]
    result = farm_place.run(image, PROMPT, 16)
    ref = Reference(read_image(image.read_bytes()))
    assert result.tokens == ref.greedy(PROMPT, 16)
    assert_bit_identical(result.logits, ref.forward(PROMPT + result.tokens))
    assert result.stats["tokens_fed"] == len(PROMPT) + 16
    if farm_place.board:  # the place's tag agrees with what the board says it is
        assert result.board == farm_place.board


def test_sampling_is_seeded(farm_place, images):
    def run(seed: int) -> list[int]:
        return farm_place.run(images["base"], PROMPT, 20, Sampling(1.2, 0, 0.95, seed), want_logits=False).tokens
    a, b, c = run(7), run(7), run(8)
    assert a == b
    assert a != c


def test_random_image_matches_reference(farm_place, tmp_path):
    """A small random MoE image (no checkpoint to make: the quickest check that a place works end to end)."""
    image = tmp_path / "random.img"
    image.write_bytes(random_image(moe_dims(hidden=16, ffn=16, experts=4, layers=1, vocab=32, max_seq=16), DType.Q8_0,
                                   seed=3, expert_align=64))
    result = farm_place.run(image, PROMPT, 8)
    ref = Reference(read_image(image.read_bytes()))
    assert result.tokens == ref.greedy(PROMPT, 8)
    assert_bit_identical(result.logits, ref.forward(PROMPT + result.tokens))
