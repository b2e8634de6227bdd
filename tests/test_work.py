"""Work counted, not timed: the instructions the hosted build executes inside one call (colibri_feed, or the
sampler), counted by valgrind's callgrind. The counts are deterministic, so a loop that grows faster than its
input shows as a ratio: four times the layers must cost four times the instructions, not sixteen."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT
from colibri import image as im
from colibri.quant import DType
from colibri.synthetic import moe_dims, random_image

pytestmark = pytest.mark.skipif(shutil.which("valgrind") is None,
                                reason="valgrind not installed (tools/setup.sh installs it)")


def instructions(argv: list[str], function: str, out: Path) -> int:
    """Instructions executed inside `function` (and what it calls) while argv runs, under callgrind."""
    proc = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                           f"--toggle-collect={function}", *argv], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return int(re.search(r"^totals: (\d+)", out.read_text(), re.M).group(1))


@pytest.fixture(scope="module")
def work_count(hosted_build, tmp_path_factory) -> Path:
    """tests/work_count.c linked against the hosted build's libcolibri.a: one feed, as the public API makes it."""
    exe = tmp_path_factory.mktemp("work") / "work_count"
    subprocess.run(["gcc", "-std=c11", "-O2", "-Wall", "-Werror", f"-I{ROOT / 'firmware' / 'include'}",
                    str(ROOT / "tests" / "work_count.c"), str(hosted_build / "libcolibri.a"), "-o", str(exe)], check=True)
    return exe


def feed_instructions(work_count: Path, image: Path, batch: int, tokens: int) -> int:
    return instructions([str(work_count), str(image), str(batch), str(tokens)], "colibri_feed",
                        image.with_suffix(f".{batch}.{tokens}.callgrind"))


def dense_layers(layers: int) -> im.ModelDims:
    """A tiny dense model: every layer does the same small work, so only a loop across layers can grow faster."""
    return im.ModelDims(vocab_size=16, hidden_size=8, ffn_size=0, n_layers=layers, n_heads=2, n_kv_heads=1, head_dim=4,
                        n_experts=0, top_k=0, max_seq=8, rms_norm_eps=1e-5, rope_theta=10000.0, flags=0,
                        dense_ffn_size=8, moe_layers=(False,) * layers)


def test_work_per_token_is_linear_in_layers(work_count, tmp_path):
    """4 tokens through 64 and through 256 layers (an image's most): 4.0x the instructions (each layer does the same
    work). Where a layer's KV rows start was a walk over every earlier layer, once per layer and token, the ratio grew
    with the layers (7.2x at 512 and 2,048; issue 26, item 5)."""
    counts = {}
    for layers in (64, 256):
        image = tmp_path / f"dense{layers}.img"
        image.write_bytes(random_image(dense_layers(layers), DType.F32, expert_align=64))
        counts[layers] = feed_instructions(work_count, image, 0, 4)
    assert counts[256] / counts[64] < 4.4, counts


def test_a_prefill_batch_costs_no_more_than_one_token_a_pass(work_count, tmp_path):
    """256 prompt tokens through 64 experts, top-64 (every token takes every expert at some rank): in one batch
    they cost at most what they cost one token a pass (0.94x: each expert's weights are read once for the batch).
    Grouping the batch's (token, rank) pairs by expert rescanned the earlier pairs for each one: 2.0x at 256
    tokens, and growing with the batch (issue 26, item 6)."""
    image = tmp_path / "moe64.img"
    image.write_bytes(random_image(moe_dims(hidden=8, ffn=4, experts=64, layers=2, top_k=64, vocab=32, max_seq=256),
                                   DType.F32, expert_align=64))
    one_a_pass, batched = (feed_instructions(work_count, image, batch, 256) for batch in (0, 256))
    assert batched / one_a_pass < 1.1, (batched, one_a_pass)


@pytest.fixture(scope="module")
def sampler_check(hosted_build, tmp_path_factory) -> Path:
    """tests/sampler_check.c linked with the hosted build's runtime objects (it calls the internal sample_token)."""
    exe = tmp_path_factory.mktemp("sampler") / "sampler_check"
    subprocess.run(["gcc", "-std=c11", "-O2", "-ffp-contract=off", "-Wall", "-Wextra", "-Werror",
                    f"-I{ROOT / 'firmware' / 'include'}", f"-I{ROOT / 'firmware' / 'src'}",
                    str(ROOT / "tests" / "sampler_check.c"), *map(str, sorted((hosted_build / "firmware").glob("*.o"))),
                    "-o", str(exe)], check=True)
    return exe


def test_sampler_draws_what_the_full_sort_drew(sampler_check):
    """Every draw (token and generator state) of the sampler equals the oracle's, which sorts the whole vocabulary
    as the sampler did before (tests/sampler_check.c): 8 vocabulary sizes, 4 shapes of logits (distinct, on a
    grid, three values, one group far ahead), temperatures from 0.05 to 1e8 (where distinct logits share a
    probability), 8 top-k and 7 top-p settings, 6 draws each."""
    out = subprocess.run([str(sampler_check)], capture_output=True, text=True, timeout=300)
    assert "sampler_check: 53760 draws, 0 mismatches" in out.stdout, out.stdout[-2000:]
    assert out.returncode == 0


def sample_instructions(sampler_check: Path, which: str, top_k: int, top_p: float, spread: float, out: Path) -> int:
    argv = [str(sampler_check), "work", which, str(262144), str(top_k), str(top_p), str(spread)]
    return instructions(argv, "sample_token" if which == "new" else "reference_sample", out)


@pytest.mark.parametrize("top_k, top_p, spread, most", [
    (40, 1.0, 3.0, 0.25),   # top-k: a heap of the vocabulary and 40 taken out (measured 0.18)
    (40, 0.9, 3.0, 0.25),   # top-k then top-p within its 40 (0.18)
    (0, 0.9, 8.0, 0.5),     # top-p alone, a few logits far ahead: only those that change the sum (0.40)
    (0, 0.9, 1.0, 1.05),    # top-p alone, flat: every probability counts, so every candidate is taken (1.03)
])
def test_sampler_cuts_do_not_sort_the_vocabulary(sampler_check, tmp_path, top_k, top_p, spread, most):
    """One draw at a vocabulary of 262,144 (Gemma's), temperature 1: the sampler's instructions against the full
    sort's, the expf of every logit included in both (19 M of them). The cuts heap-sorted the whole vocabulary
    (issue 26, item 10); now they take from a heap only the candidates they keep."""
    new, old = (sample_instructions(sampler_check, which, top_k, top_p, spread, tmp_path / f"{which}.callgrind")
                for which in ("new", "old"))
    assert new <= most * old, (new, old)
