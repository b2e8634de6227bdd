"""Fewer experts at run time (colibri_options.experts, OPEN's third word, `colibri run --experts K`): each token routed
to its K best experts instead of the image's top_k, every family's routing rules kept over the K chosen, as
transformers computes the same checkpoint with its top-k config field set to K (and llama.cpp with expert_used_count
lowered); the device's bits are the numpy reference's at K on every board, thread count, prefill batch and with the
expert cache."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from capi import STATUS, Context, Lib, Options
from conftest import RELEASE_BOARDS, ROOT, assert_bit_identical, board_name, build_run, make_family_checkpoint
from test_cli import DEMO_PROMPT, assert_one_line_error, demo_image, run  # noqa: F401 (demo_image: a fixture)
from test_families import FAMILIES, PROMPT, TOLERANCE
from colibri import flash
from colibri.image import read_image
from colibri.pack import pack
from colibri.protocol import Client, DeviceError, Sampling
from colibri.reference import Reference
from colibri.sim.boards import load_board
from colibri.sim.launch import start_board

# Every routing rule: Mixtral's softmax renormalized over the chosen; Qwen2-MoE's left unnormalized, beside a gated
# shared expert and a dense layer; DeepSeek-V3's sigmoid with its choice bias, groups and routed scale (and a dense
# layer first); V2's softmax over groups; gpt-oss's softmax over the chosen logits; Gemma 4's per-expert scales;
# Granite's top-k softmax; LFM2's sigmoid with the expert bias; GLM's grouped sigmoid beside a shared expert
ROUTED = ["mixtral_window", "qwen2moe_mixed", "qwen2moe_sparse_step", "deepseek_v3", "deepseek_v2_groups_yarn",
          "gpt_oss_full", "gemma4", "granitemoe", "lfm2moe", "glm4_moe_lite", "qwen35moe"]
# What the boards run: one of each rule the kernels could treat differently
ON_BOARDS = ["qwen2moe_mixed", "deepseek_v3", "gpt_oss_full", "gemma4"]
BOARDS = RELEASE_BOARDS + ["hosted@asan"]
NEW_TOKENS = 6


def top_k_key(config: dict) -> str:
    return "top_k_experts" if "top_k_experts" in config else "num_experts_per_tok"


@pytest.fixture(scope="module")
def routed(tmp_path_factory) -> dict[str, tuple]:
    """name -> (checkpoint, image, config) of the routed families, packed as test_families packs them."""
    base = tmp_path_factory.mktemp("experts")
    out = {}
    for i, (name, arch, cfg) in enumerate(FAMILIES):
        if name in ROUTED:
            ckpt = make_family_checkpoint(arch, cfg, 100 + i, base / name)
            pack(ckpt, base / f"{name}.img", max_seq=32, expert_align=64, measure_quality=False)
            out[name] = (ckpt, base / f"{name}.img", cfg)
    return out


def fewer(config: dict) -> list[int]:
    """Every count below the family's top_k."""
    return list(range(1, config[top_k_key(config)]))


@pytest.mark.parametrize("name", ROUTED)
def test_fewer_experts_are_transformers_with_fewer(name, routed):
    """The reference at K is transformers with the checkpoint's top-k field set to K: the same choice scores and
    groups, then K picks, their weights renormalized over the K (or softmaxed, or left) as the family does."""
    from transformers import AutoModelForCausalLM
    ckpt, image, cfg = routed[name]
    img = read_image(image.read_bytes())
    full = Reference(img).forward(PROMPT)
    for k in fewer(cfg):
        model = AutoModelForCausalLM.from_pretrained(ckpt, experts_implementation="eager", **{top_k_key(cfg): k}).eval()
        with torch.no_grad():
            hf = model(torch.tensor([PROMPT])).logits[0].numpy()
        ref = Reference(img, experts=k).forward(PROMPT)
        assert np.max(np.abs(ref - hf)) <= TOLERANCE, (name, k)
        assert np.max(np.abs(full - hf)) > 100 * TOLERANCE, (name, k)  # K routes otherwise than top_k


def same_as_reference(run, img, k: int) -> None:
    ref = Reference(img, experts=k)
    expected = ref.forward(PROMPT + run.tokens)
    assert_bit_identical(run.logits, expected)
    assert run.tokens == [int(np.argmax(row)) for row in expected[len(PROMPT) - 1:-1]]
    assert run.logits.tobytes() != Reference(img).forward(PROMPT + run.tokens).tobytes()


@pytest.mark.parametrize("board", BOARDS)
def test_every_board_routes_k_as_the_reference(board, routed):
    firmware = build_run(board)
    for name in ON_BOARDS:
        _, image, cfg = routed[name]
        img = read_image(image.read_bytes())
        for k in fewer(cfg):
            result = flash.run_on_board(image, board_name(board), PROMPT, NEW_TOKENS, Sampling(), True, firmware=firmware,
                                        experts=k)
            same_as_reference(result, img, k)


def test_threads_the_expert_cache_and_a_prefill_batch_route_k_alike(routed, hosted_build):
    """Two threads and the smallest expert cache (streamed experts, prefetch guesses of K) give the bits of one
    thread; a prefill batch's last row is the reference's (the batch's (token, rank) pairs walk K ranks)."""
    lib = Lib(hosted_build / "libcolibri.so")
    for name in ON_BOARDS:
        _, image, cfg = routed[name]
        img = read_image(image.read_bytes())
        for k in fewer(cfg):
            threads = flash.run_on_board(image, "hosted", PROMPT, NEW_TOKENS, Sampling(), True,
                                         firmware=hosted_build / "firmware.elf", threads=2, experts=k)
            same_as_reference(threads, img, k)
            cache = flash.run_on_board(image, "hosted", PROMPT, NEW_TOKENS, Sampling(), True,
                                       firmware=hosted_build / "firmware.elf", expert_cache=cfg[top_k_key(cfg)],
                                       experts=k)
            same_as_reference(cache, img, k)
            assert cache.stats["expert_misses"] > 0  # the experts were streamed
            batched = Context(lib, image.read_bytes(), options=Options(experts=k, prefill_batch=len(PROMPT)))
            assert batched.open_status == 0 and batched.stats().prefill_batch == len(PROMPT)
            assert batched.feed(PROMPT) == 0
            assert batched.logits().tobytes() == Reference(img, experts=k).forward(PROMPT)[-1].tobytes(), (name, k)


def test_the_device_refuses_counts_outside_one_to_top_k(routed, hosted_build, tmp_path):
    """K = 0 in an OPEN frame (a count sent is one asked for) and K > top_k are refused with COLIBRI_E_BAD_ARG, and
    the board then opens the image as asked; through the C API too, where 0 means top_k, and a dense image takes
    none. Fewer experts never ask for a larger arena."""
    _, image, cfg = routed["deepseek_v3"]
    top_k = cfg[top_k_key(cfg)]
    board = load_board("hosted")
    with start_board(board, hosted_build / "firmware.elf", image, []) as device:
        client = Client(device.link, timeout=60)
        client.info()
        full = client.open()
        for k in (0, top_k + 1, 2**32 - 1):
            with pytest.raises(DeviceError) as err:
                client.open(experts=k)
            assert err.value.code == STATUS["E_BAD_ARG"], k
        for k in range(1, top_k + 1):
            assert client.open(experts=k).arena_bytes == full.arena_bytes
        client.quit()
    lib = Lib(hosted_build / "libcolibri.so")
    data = image.read_bytes()
    assert Context(lib, data, options=Options(experts=top_k + 1)).open_status == STATUS["E_BAD_ARG"]
    at_top_k, default = Context(lib, data, options=Options(experts=top_k)), Context(lib, data, options=Options())
    assert at_top_k.feed(PROMPT) == 0 and default.feed(PROMPT) == 0
    assert at_top_k.logits().tobytes() == default.logits().tobytes()
    arch, dense_cfg = next((a, c) for n, a, c in FAMILIES if n == "qwen2_linear")
    pack(make_family_checkpoint(arch, dense_cfg, 7, tmp_path / "dense"), tmp_path / "dense.img", max_seq=16,
         expert_align=64, measure_quality=False)
    dense_data = (tmp_path / "dense.img").read_bytes()
    assert Context(lib, dense_data, options=Options(experts=1)).open_status == STATUS["E_BAD_ARG"]
    assert Context(lib, dense_data, options=Options(experts=0)).open_status == 0


def test_run_refuses_a_count_outside_the_range_before_the_board_boots(demo_image, tmp_path):  # noqa: F811
    """Said by the host before it looks for a firmware to boot (the one named here does not exist)."""
    before_boot = ("run", demo_image, "--board", "hosted", "--firmware", tmp_path / "missing.elf", "--prompt-tokens",
                   DEMO_PROMPT, "--max-new-tokens", "2")
    for k in ("0", "3", "-1"):
        assert_one_line_error(run(*before_boot, "--experts", k),
                              f"--experts {k} is outside 1 to 2: the image routes each token to its top-2 experts")
    assert_one_line_error(run(*before_boot, "--experts", "1", "--against", ROOT / "models" / "demo-adder"),
                          "--against runs transformers at the image's top-2, not at --experts 1")
    assert "missing.elf" in run(*before_boot, "--experts", "1").stderr  # the firmware is looked for next


def test_run_verifies_k_and_says_what_it_costs(demo_image, hosted_build):  # noqa: F811
    """`colibri run --experts 1 --verify` on the demo model: the device's bits are the reference's at one expert, and
    the run says beside its speed what one expert costs against two on its tokens (the reference at top-2)."""
    args = ("run", demo_image, "--board", "hosted", "--firmware", hosted_build / "firmware.elf", "--prompt-tokens",
            DEMO_PROMPT, "--max-new-tokens", "5", "--experts", "1", "--verify")
    said = run(*args)
    assert said.returncode == 0, said.stderr
    assert "avx" in said.stdout or "scalar" in said.stdout
    assert ", 1 of top-2 experts] load " in said.stdout, said.stdout
    assert "experts: 1 of top-2 against top-2 (numpy reference) on the run's 14 tokens: KL " in said.stdout
    report = json.loads(run(*args, "--json").stdout.splitlines()[-1])
    assert report["verify"]["passed"] and report["verify"]["rows_identical"] == report["verify"]["rows"] == 14
    cost = report["experts"]
    img = read_image(demo_image.read_bytes())
    tokens = [int(t) for t in DEMO_PROMPT.split(",")] + report["tokens"]
    fewer_logits, full = Reference(img, experts=1).forward(tokens), Reference(img).forward(tokens)
    p, q = (np.exp(z - z.max(-1, keepdims=True)) for z in (full.astype(np.float64), fewer_logits.astype(np.float64)))
    p, q = p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)
    assert cost["experts"] == 1 and cost["top_k"] == 2 and cost["tokens"] == len(tokens)
    assert cost["kl_divergence"] == pytest.approx(float(np.mean(np.sum(p * np.log(p / q), -1))), rel=1e-6)
    assert cost["top1_agreement"] == np.mean(full.argmax(-1) == fewer_logits.argmax(-1)) < 1
