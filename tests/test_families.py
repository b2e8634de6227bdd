"""Every supported family, exactly as transformers defines it: reference vs transformers, device vs reference."""
from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch

from conftest import MODEL_RUNS, assert_bit_identical, board_name, make_family_checkpoint
from colibri import flash
from colibri.image import FLAG_NORM_TOPK, FLAG_SHARED_EXPERT, Role, read_image
from colibri.pack import pack
from colibri.quant import DType
from colibri.protocol import Sampling
from colibri.reference import Reference

TOLERANCE = 1e-4
PROMPT = [1, 5, 9, 3, 0, 2]
SMALL = dict(vocab_size=45, num_hidden_layers=2)

# (name, HF class, config): odd sizes; dense layers mixed in where the family allows it;
# norm_topk_prob true and false; a shared expert sized unlike the routed ones; rope variants.
FAMILIES = [
    ("qwen2moe_mixed", "Qwen2MoeForCausalLM", dict(SMALL, num_hidden_layers=3, hidden_size=32, num_attention_heads=4,
     num_key_value_heads=2, intermediate_size=20, moe_intermediate_size=12, shared_expert_intermediate_size=18,
     num_experts=5, num_experts_per_tok=2, mlp_only_layers=[1], norm_topk_prob=False)),
    ("qwen2moe_sparse_step", "Qwen2MoeForCausalLM", dict(SMALL, hidden_size=24, num_attention_heads=3,
     num_key_value_heads=3, intermediate_size=14, moe_intermediate_size=10, shared_expert_intermediate_size=6,
     num_experts=4, num_experts_per_tok=3, decoder_sparse_step=2, norm_topk_prob=True)),
    ("qwen3moe", "Qwen3MoeForCausalLM", dict(SMALL, num_hidden_layers=3, hidden_size=24, num_attention_heads=3,
     num_key_value_heads=1, head_dim=10, intermediate_size=22, moe_intermediate_size=14, num_experts=6,
     num_experts_per_tok=3, mlp_only_layers=[0], norm_topk_prob=True)),
    ("qwen3moe_bias", "Qwen3MoeForCausalLM", dict(SMALL, hidden_size=20, num_attention_heads=2, num_key_value_heads=2,
     head_dim=8, moe_intermediate_size=9, num_experts=3, num_experts_per_tok=1, attention_bias=True,
     norm_topk_prob=False)),
    ("olmoe_clip", "OlmoeForCausalLM", dict(SMALL, hidden_size=24, num_attention_heads=4, num_key_value_heads=4,
     intermediate_size=18, num_experts=4, num_experts_per_tok=2, clip_qkv=0.6, norm_topk_prob=False)),
    ("olmoe_norm_topk", "OlmoeForCausalLM", dict(SMALL, hidden_size=24, num_attention_heads=4, num_key_value_heads=2,
     intermediate_size=10, num_experts=5, num_experts_per_tok=2, norm_topk_prob=True, attention_bias=True)),
    ("llama_llama3_tied", "LlamaForCausalLM", dict(SMALL, hidden_size=20, num_attention_heads=2, num_key_value_heads=1,
     intermediate_size=26, tie_word_embeddings=True,
     rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=16))),
    ("qwen2_linear", "Qwen2ForCausalLM", dict(SMALL, hidden_size=24, num_attention_heads=4, num_key_value_heads=2,
     intermediate_size=30, rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0))),
    ("qwen3_yarn", "Qwen3ForCausalLM", dict(SMALL, hidden_size=18, num_attention_heads=3, num_key_value_heads=1,
     head_dim=6, intermediate_size=14, rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                                               original_max_position_embeddings=32))),
    # sliding windows shorter than the prompt: every layer (Mixtral, Qwen3-MoE), the layers from
    # max_window_layers on (Qwen2), the even layers below it (Qwen2-MoE)
    ("mixtral_window", "MixtralForCausalLM", dict(SMALL, hidden_size=24, num_attention_heads=4, num_key_value_heads=2,
     intermediate_size=14, num_local_experts=4, num_experts_per_tok=2, sliding_window=4)),
    ("qwen2_window", "Qwen2ForCausalLM", dict(SMALL, num_hidden_layers=3, hidden_size=24, num_attention_heads=4,
     num_key_value_heads=2, intermediate_size=20, use_sliding_window=True, sliding_window=3, max_window_layers=1)),
    ("qwen2moe_window", "Qwen2MoeForCausalLM", dict(SMALL, num_hidden_layers=3, hidden_size=24, num_attention_heads=4,
     num_key_value_heads=2, intermediate_size=20, moe_intermediate_size=10, shared_expert_intermediate_size=12,
     num_experts=4, num_experts_per_tok=2, use_sliding_window=True, sliding_window=5, max_window_layers=2)),
    ("qwen3moe_window", "Qwen3MoeForCausalLM", dict(SMALL, hidden_size=20, num_attention_heads=2, num_key_value_heads=1,
     head_dim=8, moe_intermediate_size=9, num_experts=3, num_experts_per_tok=2, use_sliding_window=True,
     sliding_window=4, norm_topk_prob=True)),
]
DEEPSEEK = dict(SMALL, hidden_size=32, num_attention_heads=4, num_key_value_heads=4, intermediate_size=40,
                moe_intermediate_size=14, kv_lora_rank=20, qk_nope_head_dim=10, qk_rope_head_dim=6, v_head_dim=12)
FAMILIES += [
    # MLA with a q-LoRA and without; DeepSeek-V2's greedy and group-limited softmax routing, V3's sigmoid
    # routing with a nonzero correction bias and groups scored by their best two; dense layers first;
    # shared experts; YaRN with mscale_all_dim (the softmax scale's factor); rope pairs and halves
    ("deepseek_v2", "DeepseekV2ForCausalLM", dict(DEEPSEEK, num_hidden_layers=3, q_lora_rank=24, n_routed_experts=5,
     num_experts_per_tok=2, first_k_dense_replace=1, n_shared_experts=1, routed_scaling_factor=1.5)),
    ("deepseek_v2_groups_yarn", "DeepseekV2ForCausalLM", dict(DEEPSEEK, q_lora_rank=None, n_routed_experts=6,
     num_experts_per_tok=2, topk_method="group_limited_greedy", n_group=3, topk_group=2, n_shared_experts=2,
     rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=32,
                          mscale=0.707, mscale_all_dim=0.707, beta_fast=32, beta_slow=1))),
    ("deepseek_v3", "DeepseekV3ForCausalLM", dict(DEEPSEEK, num_hidden_layers=3, q_lora_rank=24, n_routed_experts=8,
     num_experts_per_tok=3, n_group=4, topk_group=2, first_k_dense_replace=1, norm_topk_prob=True,
     routed_scaling_factor=2.5)),
    ("deepseek_v3_halves", "DeepseekV3ForCausalLM", dict(DEEPSEEK, q_lora_rank=None, n_routed_experts=4,
     num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=0, norm_topk_prob=False,
     rope_interleave=False, n_shared_experts=0)),
]
GPT_OSS = dict(SMALL, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=24,
               num_local_experts=4, num_experts_per_tok=2)
FAMILIES += [
    # attention sinks, sliding layers alternating with full ones (windows shorter than the prompt), q/k/v/o
    # biases, the router's bias and softmax over its top-k logits, experts with biases and the clamped SwiGLU
    # (a limit low enough that the clamps bite), YaRN without truncation
    ("gpt_oss", "GptOssForCausalLM", dict(GPT_OSS, num_hidden_layers=3, sliding_window=4, swiglu_limit=1.0,
     rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=4.0, original_max_position_embeddings=32,
                          beta_fast=32.0, beta_slow=1.0, truncate=False))),
    ("gpt_oss_full", "GptOssForCausalLM", dict(GPT_OSS, num_experts_per_tok=3, sliding_window=3, swiglu_alpha=2.5,
     layer_types=["full_attention", "sliding_attention"], rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
]
GEMMA4 = dict(SMALL, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=24,
              enable_moe_block=True, moe_intermediate_size=12, hidden_size_per_layer_input=0)
FAMILIES += [
    # Gemma 4's MoE layer (the dense MLP beside the experts, the normed router with per-expert scales, every extra
    # norm, a scalar per layer), GeGLU, q/k/v norms, sliding layers (windows shorter than the prompt) and global
    # ones with their own head size, KV heads and proportional RoPE; keys as values with one global KV head and the
    # logit cap; or biases, a v projection, per-layer inputs and no cap
    ("gemma4", "Gemma4ForCausalLM", dict(GEMMA4, num_hidden_layers=3, num_experts=5, top_k_experts=2, sliding_window=4,
     global_head_dim=16, num_global_key_value_heads=1, attention_k_eq_v=True, final_logit_softcapping=3.0,
     layer_types=["sliding_attention", "sliding_attention", "full_attention"])),
    ("gemma4_bias_ple", "Gemma4ForCausalLM", dict(GEMMA4, num_experts=4, top_k_experts=3, sliding_window=3,
     global_head_dim=12, attention_bias=True, hidden_size_per_layer_input=6, vocab_size_per_layer_input=45, layer_types=["sliding_attention", "full_attention"],
     rope_parameters=dict(sliding_attention=dict(rope_type="default", rope_theta=1000.0),
                          full_attention=dict(rope_type="proportional", partial_rotary_factor=0.5, rope_theta=1e5)))),
    # the small dense models' path (E2B, E4B): no experts, per-layer inputs, the last layers sharing the KV cache
    # of the last earlier layer of their kind, their MLP twice as wide
    ("gemma4_dense_kv_shared", "Gemma4ForCausalLM", dict(GEMMA4, num_hidden_layers=4, enable_moe_block=False,
     sliding_window=3, global_head_dim=16, hidden_size_per_layer_input=4, vocab_size_per_layer_input=45,
     num_kv_shared_layers=2, use_double_wide_mlp=True,
     layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"])),
]
FAMILIES += [
    # Granite's multipliers (embedding, residual, attention, logits) folded into the weights they scale, with tied
    # embeddings (the embedding and the head scaled apart) and q/k/v/o biases (the o bias scaled with o); fused
    # experts; softmax over the router's top-k logits
    ("granitemoe", "GraniteMoeForCausalLM", dict(SMALL, hidden_size=24, num_attention_heads=4, num_key_value_heads=2,
     intermediate_size=10, num_local_experts=5, num_experts_per_tok=2, tie_word_embeddings=True, attention_bias=True,
     embedding_multiplier=6.0, residual_multiplier=0.22, attention_multiplier=0.0625, logits_scaling=4.0)),
]
FAMILIES += [
    # GLM-4.7-Flash: DeepSeek-V3's MLA and grouped sigmoid routing with its correction bias, a shared expert, its
    # layers dense or sparse as mlp_layer_types lists them (not only the first: a dense layer between MoE ones)
    ("glm4_moe_lite", "Glm4MoeLiteForCausalLM", dict(DEEPSEEK, num_hidden_layers=4, q_lora_rank=24, n_routed_experts=8,
     num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1, routed_scaling_factor=1.8,
     norm_topk_prob=True, mlp_layer_types=["dense", "sparse", "dense", "sparse"])),
]
LFM2 = dict(SMALL, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=40,
            moe_intermediate_size=12, num_experts=6, num_experts_per_tok=2)
FAMILIES += [
    # LFM2-MoE: gated short convolutions (a prompt longer than the kernel; two convolving layers in a row) beside
    # attention with per-head q/k norms, dense layers first, the sigmoid router with the expert bias choosing, its
    # renormalization and a routed scale; or a kernel of 4, no expert bias, no renormalization, attention first
    ("lfm2moe", "Lfm2MoeForCausalLM", dict(LFM2, num_hidden_layers=5, num_dense_layers=1, routed_scaling_factor=1.7,
     layer_types=["conv", "conv", "full_attention", "conv", "full_attention"])),
    ("lfm2moe_k4", "Lfm2MoeForCausalLM", dict(LFM2, num_hidden_layers=3, num_dense_layers=0, conv_L_cache=4,
     use_expert_bias=False, norm_topk_prob=False, layer_types=["full_attention", "conv", "conv"])),
    # dense LFM2: the same blocks, the layer kinds from full_attn_idxs, the MLP sized by LFM2's rule (60 -> 2/3 -> 40
    # -> x1.3 -> 52 -> a multiple of 8: 56)
    ("lfm2", "Lfm2ForCausalLM", dict(SMALL, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
     num_hidden_layers=4, intermediate_size=60, block_ffn_dim_multiplier=1.3,
     block_multiple_of=8, full_attn_idxs=[1, 3])),
]
QWEN35 = dict(SMALL, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, moe_intermediate_size=12,
              shared_expert_intermediate_size=10, num_experts=5, num_experts_per_tok=2, linear_conv_kernel_dim=4)
FAMILIES += [
    # Qwen3.5-MoE: Gated DeltaNets (several in a row, value heads twice the key heads, a prompt longer than the
    # kernel) beside gated attention with RoPE on a quarter of each head, zero-centred norms, a shared expert with
    # its gate; or attention first, as many value heads as key heads, RoPE on half of each head
    ("qwen35moe", "Qwen3_5MoeForCausalLM", dict(QWEN35, num_hidden_layers=4, linear_key_head_dim=6,
     linear_value_head_dim=4, linear_num_key_heads=2, linear_num_value_heads=4)),
    ("qwen35moe_attention_first", "Qwen3_5MoeForCausalLM", dict(QWEN35, num_hidden_layers=3, linear_key_head_dim=4,
     linear_value_head_dim=6, linear_num_key_heads=3, linear_num_value_heads=3, linear_conv_kernel_dim=3,
     layer_types=["full_attention", "linear_attention", "linear_attention"],
     rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5))),
]
FAMILIES += [
    # GraniteMoeShared: Granite-MoE's multipliers with an ungated shared MLP beside the experts (its down scaled by
    # the residual multiplier too), untied embeddings
    ("granitemoe_shared", "GraniteMoeSharedForCausalLM", dict(SMALL, hidden_size=24, num_attention_heads=4,
     num_key_value_heads=2, intermediate_size=10, shared_intermediate_size=14, num_local_experts=5,
     num_experts_per_tok=2, tie_word_embeddings=False, embedding_multiplier=6.0, residual_multiplier=0.22,
     attention_multiplier=0.0625, logits_scaling=4.0)),
]
WINDOWED = {"gpt_oss", "gpt_oss_full", "mixtral_window", "qwen2_window", "qwen2moe_window", "qwen3moe_window", "gemma4",
            "gemma4_bias_ple", "gemma4_dense_kv_shared"}


@pytest.fixture(scope="module")
def family_images(tmp_path_factory) -> dict[str, tuple]:
    base = tmp_path_factory.mktemp("families")
    out = {}
    for i, (name, arch, cfg) in enumerate(FAMILIES):
        ckpt = make_family_checkpoint(arch, cfg, 100 + i, base / name)
        image = base / f"{name}.img"
        pack(ckpt, image, max_seq=32, expert_align=64)
        out[name] = (ckpt, image)
    return out


def test_families_cover_the_variants(family_images):
    dims = {name: read_image(img.read_bytes()).dims for name, (_, img) in family_images.items()}
    assert dims["qwen2moe_mixed"].moe_layers == (True, False, True)
    assert dims["qwen2moe_sparse_step"].moe_layers == (False, True)
    assert dims["qwen3moe"].moe_layers == (False, True, True)
    assert dims["qwen2moe_mixed"].flags & FLAG_SHARED_EXPERT and not dims["qwen2moe_mixed"].flags & FLAG_NORM_TOPK
    assert dims["qwen2moe_sparse_step"].flags & FLAG_NORM_TOPK
    assert dims["llama_llama3_tied"].n_experts == 0
    windows = {name: (d.sliding_window, d.window_layers) for name, d in dims.items() if d.sliding_window}
    assert windows == {"gpt_oss": (4, (True, False, True)), "gpt_oss_full": (3, (False, True)),
                       "mixtral_window": (4, (True, True)), "qwen2_window": (3, (False, True, True)),
                       "qwen2moe_window": (5, (True, False, False)), "qwen3moe_window": (4, (True, True)),
                       "gemma4": (4, (True, True, False)), "gemma4_bias_ple": (3, (True, False)),
                       "gemma4_dense_kv_shared": (3, (True, False, True, False))}
    # Gemma 4's global layers have their own widths: the KV cache plan follows each layer's
    g = dims["gemma4"]
    assert [g.layer_kv_dim(layer) for layer in range(3)] == [2 * 8, 2 * 8, 1 * 16]
    assert g.kv_cache_elements() == 4 * 16 + 4 * 16 + 32 * 16
    # KV sharing: the last two layers keep no cache and attend over layers 0's and 1's; their MLP is doubled
    s = dims["gemma4_dense_kv_shared"]
    assert [s.kv_source(layer) for layer in range(4)] == [0, 1, 0, 1] and s.kv_cache_elements() == 3 * 16 + 32 * 32
    assert [s.layer_dense_ffn(layer) for layer in range(4)] == [24, 24, 48, 48] and s.n_experts == 0
    # a windowed layer's KV cache is a ring of the window: the plan holds W rows for it, not max_seq
    d = dims["qwen2_window"]
    assert [d.kv_rows(layer) for layer in range(3)] == [32, 3, 3]


@pytest.mark.parametrize("field,value", [("logits_scaling", 0.0), ("residual_multiplier", -1.0),
                                         ("embedding_multiplier", None), ("attention_multiplier", "0.1"),
                                         ("embedding_multiplier", 1e39), ("logits_scaling", 1e-46)])
def test_granite_multipliers_must_be_positive_numbers(family_images, tmp_path, field, value):
    """A multiplier the packer folds into the weights must be a positive number f32 holds, reciprocal too: 0, a
    negative one or 1e39 would fold into zero, flipped or infinite weights; a missing one is asked for (transformers
    would take 1.0) rather than guessed."""
    from colibri.checkpoint import UnsupportedModel
    ckpt = tmp_path / "granite"
    shutil.copytree(family_images["granitemoe"][0], ckpt)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg[field] = value
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModel, match=field):
        pack(ckpt, tmp_path / "x.img", max_seq=32, expert_align=64)


def test_granite_fused_experts_must_have_the_configs_shape(family_images, tmp_path):
    """The gate and up rows are cut from input_linear at intermediate_size: a config that disagrees with the tensor
    is refused naming it (cut elsewhere, the rows would still have the shape the image asks for). A tied checkpoint
    whose embedding and head the multipliers scale apart is reported as two tensors, as it is stored."""
    from colibri.checkpoint import UnsupportedModel
    ckpt = tmp_path / "granite"
    shutil.copytree(family_images["granitemoe"][0], ckpt)
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["tie_word_embeddings"]
    report = pack(ckpt, tmp_path / "ok.img", max_seq=32, expert_align=64)
    assert report["tied_embeddings"] is False
    cfg["intermediate_size"] -= 2
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModel, match=r"input_linear.weight has shape \[5, 20, 24\]"):
        pack(ckpt, tmp_path / "x.img", max_seq=32, expert_align=64)


@pytest.mark.parametrize("name", [f[0] for f in FAMILIES])
def test_reference_matches_transformers(name, family_images):
    from transformers import AutoModelForCausalLM
    ckpt, image = family_images[name]
    model = AutoModelForCausalLM.from_pretrained(ckpt, experts_implementation="eager").eval()
    ref = Reference(read_image(image.read_bytes()))
    with torch.no_grad():
        hf = model(torch.tensor([PROMPT])).logits[0].numpy()
    assert np.abs(hf).max() > 0.5, "logits too small for the tolerance to mean anything"
    assert np.max(np.abs(ref.forward(PROMPT) - hf)) <= TOLERANCE
    seq = list(PROMPT)
    with torch.no_grad():
        for _ in range(16):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    assert ref.greedy(PROMPT, 16) == seq[len(PROMPT):]


LONG = 512  # positions: issue 14 asks for at least 512 on the hosted board
# Families whose 512 positions transformers itself computes in float32 only to about 1e-4 of the logits' scale (its
# chunked delta rule sums in another order than the recurrent one, through ill-conditioned spots of these random
# models: measured 0.9e-4 from its own float64 run), so the runtime is held to transformers in float64 there, within
# twice that (measured 1.8e-4 and 0.3e-4)
LONG_IN_F64 = {"qwen35moe": 2e-4, "qwen35moe_attention_first": 2e-4}


@pytest.mark.parametrize("name", [f[0] for f in FAMILIES])
def test_long_context_matches_transformers(name, hosted_build, tmp_path):
    """Every family over 512 positions, the runtime (the hosted build's library) against transformers:
    every position's logits, so RoPE far past the short prompts, attention over a long KV cache and, for
    yarn and llama3, positions well beyond original_max_position_embeddings are all covered."""
    from transformers import AutoModelForCausalLM

    from capi import Context, Lib
    arch, cfg = next((a, c) for n, a, c in FAMILIES if n == name)
    ckpt = make_family_checkpoint(arch, cfg, 300 + len(name), tmp_path / name, max_positions=LONG + 8)
    image = tmp_path / f"{name}.img"
    pack(ckpt, image, max_seq=LONG, expert_align=64)
    tokens = np.random.default_rng(len(name)).integers(0, cfg["vocab_size"], LONG).tolist()
    model = AutoModelForCausalLM.from_pretrained(ckpt, experts_implementation="eager").eval()
    if name in LONG_IN_F64:
        model = model.double()
    with torch.no_grad():
        hf = model(torch.tensor([tokens])).logits[0].float().numpy()
    assert np.abs(hf).max() > 0.5, "logits too small for the tolerance to mean anything"
    ctx = Context(Lib(hosted_build / "libcolibri.so"), image.read_bytes())
    rows = []
    for t in tokens:
        assert ctx.feed([t]) == 0
        rows.append(ctx.logits())
    err = np.abs(np.stack(rows) - hf).max(axis=1)
    scale = max(1.0, float(np.abs(hf).max()))
    assert err.max() <= LONG_IN_F64.get(name, TOLERANCE) * scale, f"worst position {int(err.argmax())}: {err.max():.3g}"
    assert_bit_identical(np.stack(rows), Reference(read_image(image.read_bytes())).forward(tokens))  # and bit for bit


@pytest.mark.parametrize("name", [f[0] for f in FAMILIES])
def test_prefill_batch_gives_the_bits_of_one_token_a_pass(name, family_images, hosted_build, tmp_path):
    """colibri_options.prefill_batch: a prompt fed in passes of several tokens (5: uneven chunks, shared and
    dense layers, every routing variant) gives the logits of feeding it one token a pass, bit for bit, for
    float and quantized weights, on one thread or split into parts run last first; and the KV cache it
    leaves is the same (the tokens fed after it agree too)."""
    from capi import PARALLEL_FOR, Context, Lib, Options
    from colibri.quant import DType
    lib = Lib(hosted_build / "libcolibri.so")
    ckpt, _ = family_images[name]
    prompt = np.random.default_rng(7).integers(0, SMALL["vocab_size"], 23).tolist()
    after = [3, 1, 4]

    @PARALLEL_FOR
    def reversed_parts(user, fn, arg, parts):
        for part in reversed(range(parts)):
            fn(arg, part)

    for dtype in (DType.F32, DType.Q4_0):
        image = tmp_path / f"{name}-{dtype.name}.img"
        pack(ckpt, image, max_seq=32, expert_align=64, dtype=dtype, measure_quality=False)
        data = image.read_bytes()
        d = read_image(data).dims  # a pass is no longer than the window where KV-sharing layers read a ring
        batch = min(5, d.sliding_window) if any(d.kv_shared(l) and d.windowed(l) for l in range(d.n_layers)) else 5
        one = Context(lib, data)
        rows = []
        for tok in prompt + after:
            assert one.feed([tok]) == 0
            rows.append(one.logits().tobytes())
        for opts in (Options(prefill_batch=5), Options(prefill_batch=5, parallel_for=reversed_parts, parallel_parts=3)):
            batched = Context(lib, data, options=opts)
            assert batched.open_status == 0
            stats = batched.stats()
            assert stats.prefill_batch == batch
            assert stats.arena_bytes == one.info.arena_bytes + batch * one.info.prefill_token_bytes > one.info.arena_bytes
            assert batched.feed(prompt) == 0
            assert batched.logits().tobytes() == rows[len(prompt) - 1], dtype
            for i, tok in enumerate(after):
                assert batched.feed([tok]) == 0
                assert batched.logits().tobytes() == rows[len(prompt) + i], (dtype, i)
            assert batched.stats().tokens_fed == len(prompt) + len(after)


@pytest.mark.parametrize("board", MODEL_RUNS)
def test_every_family_on_every_board(board, family_images, firmwares):
    for name, (_, image) in family_images.items():
        result = flash.run_on_board(image, board_name(board), PROMPT, 10, Sampling(), True, firmware=firmwares[board])
        ref = Reference(read_image(image.read_bytes()))
        assert result.tokens == ref.greedy(PROMPT, 10), name
        assert_bit_identical(result.logits, ref.forward(PROMPT + result.tokens), name)


@pytest.mark.parametrize("params", [
    dict(rope_type="linear", rope_theta=10000.0, factor=3.0),
    dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
         original_max_position_embeddings=64),
    dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=64),
    dict(rope_type="yarn", rope_theta=1e6, factor=8.0, original_max_position_embeddings=128, beta_fast=16,
         beta_slow=2, mscale=1.0, mscale_all_dim=0.5),
    dict(rope_type="proportional", rope_theta=1e6, partial_rotary_factor=0.25),
], ids=["linear", "llama3", "yarn", "yarn_mscale", "proportional"])
def test_rope_frequencies_match_transformers(params):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from colibri import rope
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=512, rope_parameters=params)
    hf_inv, hf_scale = ROPE_INIT_FUNCTIONS[params["rope_type"]](cfg, "cpu")
    inv, scale = rope.frequencies(rope.rope_parameters(cfg.to_dict()), 16, 512)
    np.testing.assert_allclose(inv, hf_inv.double().numpy(), rtol=1e-6)
    assert math.isclose(scale, hf_scale, rel_tol=1e-9)


def test_mla_cache_holds_the_latent(family_images, hosted_build, capsys):
    """MLA's memory saving, as the footprint report states it: a DeepSeek image's KV cache holds the latent
    and the rope key per position and layer (one row for every head, no V cache), against the keys and values
    per head a standard-attention model of the same shapes keeps; the arena plan holds exactly that."""
    from colibri import footprint
    from colibri.image import arena_plan
    _, image = family_images["deepseek_v2"]
    d = read_image(image.read_bytes()).dims
    assert footprint.main(["--board", "hosted", "--image", str(image), "--json"]) == 0
    kv = json.loads(capsys.readouterr().out)["kv_cache"]
    assert kv["per_position"] == 4 * d.n_layers * (20 + 6)                    # kv_lora_rank + qk_rope_head_dim
    assert kv["per_position_expanded"] == 4 * d.n_layers * 4 * (10 + 6 + 12)  # heads x (nope + rope + v_head_dim)
    plan = arena_plan(d)
    assert plan["k_cache"][1] == kv["bytes"] == d.max_seq * kv["per_position"] and plan["v_cache"][1] == 0
    assert footprint.main(["--board", "hosted", "--image", str(image)]) == 0
    assert "keys and values per head would take 1,344" in capsys.readouterr().out
    _, standard = family_images["qwen2moe_mixed"]
    sd = read_image(standard.read_bytes()).dims
    assert sd.kv_position_bytes() == 2 * 4 * sd.n_layers * sd.n_kv_heads * sd.head_dim  # K and V rows


def test_lean_cortex_m4_fits_16_kib(family_images, firmwares):
    """`scons lean=yes` leaves the newer families' mechanisms out (DeepSeek's, gpt-oss's, Gemma 4's): on the Cortex-M4 that
    runtime is issue 10's 16 KiB (-Os, every dtype; tools/size_gate.json's cortex_m4_lean), gives the other
    families' images the bits of the full build, and refuses a DeepSeek, gpt-oss or Gemma 4 image by name instead of
    computing something else."""
    from conftest import GATE_FILE, build
    from colibri import footprint
    from colibri.protocol import DeviceError
    out = build("cortex_m4", lean=True)
    sizes = footprint.total([footprint.inspect(o) for o in footprint.runtime_objects("cortex_m4", out.name)])
    gate = json.loads(GATE_FILE.read_text())["cortex_m4_lean"]
    assert sizes[".text"] <= gate["runtime_text"] <= 16 * 1024, sizes
    assert sizes[".rodata"] <= gate["runtime_rodata"] and sizes[".data"] <= gate["runtime_data"]
    for name in ("qwen2moe_mixed", "mixtral_window"):
        _, image = family_images[name]
        lean = flash.run_on_board(image, "cortex_m4", PROMPT, 4, Sampling(), True, firmware=out / "firmware.elf")
        full = flash.run_on_board(image, "cortex_m4", PROMPT, 4, Sampling(), True, firmware=firmwares["cortex_m4"])
        assert lean.tokens == full.tokens and lean.logits.tobytes() == full.logits.tobytes(), name
    for name in ("deepseek_v3", "deepseek_v2", "gpt_oss", "gemma4", "granitemoe", "lfm2moe", "qwen35moe"):
        with pytest.raises(DeviceError) as err:
            flash.run_on_board(family_images[name][1], "cortex_m4", PROMPT, 1, Sampling(), False,
                               firmware=out / "firmware.elf")
        assert "COLIBRI_E_UNSUPPORTED" in str(err.value), name


GEMMA4_REFUSALS = [
    ({"num_kv_shared_layers": 2}, "num_kv_shared_layers"),  # every layer: none computes keys and values
    ({"num_kv_shared_layers": 1}, "num_kv_shared_layers"),  # the sharing layer is global, and no global one precedes it
    ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention"),
    ({"hidden_activation": "gelu"}, "hidden_activation"),
    ({"vocab_size_per_layer_input": 30}, "vocab_size_per_layer_input"),
    ({"per_layer_config": {"1": {"head_dim": 12, "sliding_window": 3}}}, "per_layer_config"),
    ({"per_layer_config": {"2": {"head_dim": 12}}}, "per_layer_config"),  # no layer 2
    ({"per_layer_config": {"0": {"head_dim": 16}}}, "per_layer_config"),  # a sliding layer's geometry changed
    ({"final_logit_softcapping": -1.0}, "final_logit_softcapping"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "rope_parameters"),
    # latent attention is DeepSeek's: beside KV sharing it would leave the arena (the image writer refuses that too)
    ({"kv_lora_rank": 4, "num_kv_shared_layers": 1}, "kv_lora_rank"),
]


@pytest.mark.parametrize("changes,field", GEMMA4_REFUSALS, ids=[r[1] + str(i) for i, r in enumerate(GEMMA4_REFUSALS)])
def test_gemma4_refuses_what_it_cannot_run(family_images, tmp_path, changes, field):
    """What the runtime would not compute as transformers does is refused, naming the config field."""
    import shutil

    from colibri.checkpoint import UnsupportedModel
    src, _ = family_images["gemma4_bias_ple"]
    shutil.copytree(src, tmp_path / "edited")
    cfg = json.loads((tmp_path / "edited" / "config.json").read_text())
    (tmp_path / "edited" / "config.json").write_text(json.dumps({**cfg, **changes}))
    with pytest.raises(UnsupportedModel, match=field):
        pack(tmp_path / "edited", tmp_path / "x.img", max_seq=32, expert_align=64)
    with pytest.raises(UnsupportedModel, match="hidden_activation"):  # Gemma 4's fields on another family
        other = json.loads(family_images["mixtral_window"][0].joinpath("config.json").read_text())
        shutil.copytree(family_images["mixtral_window"][0], tmp_path / "other")
        (tmp_path / "other" / "config.json").write_text(json.dumps({**other, "hidden_activation": "gelu_pytorch_tanh"}))
        pack(tmp_path / "other", tmp_path / "y.img", max_seq=32, expert_align=64)


def packs_its_text_model(model, tmp_path, capsys) -> None:
    """A multimodal model, its norms randomized, saved and packed: the towers are left out (and said so), and the
    image gives what the model computes for text."""
    from conftest import randomize
    from colibri import pack as pack_cli
    randomize(model)
    model.save_pretrained(tmp_path / "mm")
    assert pack_cli.main([str(tmp_path / "mm"), "-o", str(tmp_path / "mm.img"), "--max-seq", "32"]) == 0
    assert "vision and audio tower tensors left out" in capsys.readouterr().out
    ref = Reference(read_image((tmp_path / "mm.img").read_bytes()))
    with torch.no_grad():
        hf = model(input_ids=torch.tensor([PROMPT])).logits[0].numpy()
    assert np.abs(hf).max() > 0.5
    assert np.max(np.abs(ref.forward(PROMPT) - hf)) <= TOLERANCE


def test_gemma4_multimodal_checkpoint_packs_its_text_model(tmp_path, capsys):
    """Gemma 4 is released as Gemma4ForConditionalGeneration (text_config, the language model's weights under
    model.language_model., vision and audio towers beside it): the packer takes its text model, leaves the towers
    out (and says so), and the image gives what the multimodal model computes for text."""
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration
    text = next(c for n, _, c in FAMILIES if n == "gemma4")
    vision = dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=8)
    torch.manual_seed(21)
    model = Gemma4ForConditionalGeneration(Gemma4Config(text_config=dict(text, initializer_range=0.25),
                                                        vision_config=vision, initializer_range=0.25)).eval()
    packs_its_text_model(model, tmp_path, capsys)


def test_qwen35_multimodal_checkpoint_packs_its_text_model(tmp_path, capsys):
    """Qwen3.5 is released as Qwen3_5MoeForConditionalGeneration (its language model under model.language_model.,
    the vision tower as model.visual.): the packer takes the text model and leaves the tower out, and the image gives
    what the multimodal model computes for text."""
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration
    text = dict(next(c for n, _, c in FAMILIES if n == "qwen35moe"), initializer_range=0.25)
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32,
                  num_position_embeddings=16)
    torch.manual_seed(23)
    model = Qwen3_5MoeForConditionalGeneration(Qwen3_5MoeConfig(text_config=text, vision_config=vision)).eval()
    packs_its_text_model(model, tmp_path, capsys)


def test_gpt_oss_mxfp4_experts_read_as_transformers_dequantizes_them(tmp_path):
    """gpt-oss's released checkpoints store the experts as MXFP4 (E2M1 codes in blocks of 32 with an E8M0
    scale, [E, out, in/32, 16], quantization_config mxfp4): they pack to the image the same experts give as
    transformers' own dequantization (integrations.mxfp4.convert_moe_packed_tensors) stored in f32, or kept as
    MXFP4 with the same values."""
    from safetensors.numpy import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    arch, cfg = next((a, c) for n, a, c in FAMILIES if n == "gpt_oss")
    cfg = dict(cfg, intermediate_size=32)  # every expert matrix's input a whole number of MXFP4 blocks
    src = make_family_checkpoint(arch, cfg, 77, tmp_path / "plain")
    tensors = load_file(src / "model.safetensors")
    rng = np.random.default_rng(3)
    packed = dict(tensors)
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        experts, n_in, n_out = tensors[name].shape  # transformers' layout: [E, in, out]
        assert n_in % 32 == 0, name
        blocks = rng.integers(0, 256, (experts, n_out, n_in // 32, 16), dtype=np.uint8)
        scales = rng.integers(120, 130, (experts, n_out, n_in // 32), dtype=np.uint8)
        tensors[name] = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales),
                                                   dtype=torch.float32).numpy()  # back in transformers' [E, in, out]
        del packed[name]
        packed[name + "_blocks"], packed[name + "_scales"] = blocks, scales
    save_file(tensors, str(src / "model.safetensors"))  # the plain checkpoint holds transformers' dequantization
    mx = tmp_path / "mxfp4"
    mx.mkdir()
    config = json.loads((src / "config.json").read_text())
    (mx / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "mxfp4"}}))
    save_file(packed, str(mx / "model.safetensors"))
    pack(src, tmp_path / "plain.img", max_seq=32, expert_align=64)
    pack(mx, tmp_path / "mx.img", max_seq=32, expert_align=64)
    # the same values (the image's MXFP4 reads E2M1's -0 as 0, as llama.cpp's kvalues_mxfp4 do: a zero's sign never
    # changes a sum whose lanes start at +0), and the same table
    plain, mxf = read_image((tmp_path / "plain.img").read_bytes()), read_image((tmp_path / "mx.img").read_bytes())
    assert plain.entries == mxf.entries and plain.dims == mxf.dims
    for e in plain.entries:
        np.testing.assert_array_equal(mxf.tensor(e.role, e.layer, e.expert), plain.tensor(e.role, e.layer, e.expert))
    # kept as MXFP4 (--dtype stored): the same values, a quarter of the bytes
    pack(mx, tmp_path / "kept.img", max_seq=32, expert_align=64, dtype=None, measure_quality=False)
    kept = read_image((tmp_path / "kept.img").read_bytes())
    for role in (Role.EXPERT_GATE, Role.EXPERT_UP, Role.EXPERT_DOWN):
        for layer in range(plain.dims.n_layers):
            for expert in range(plain.dims.n_experts):
                assert kept.entry(role, layer, expert).dtype == DType.MXFP4
                np.testing.assert_array_equal(kept.tensor(role, layer, expert), plain.tensor(role, layer, expert))
    with pytest.raises(Exception, match="quant_method='fp8'"):
        (mx / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "fp8"}}))
        pack(mx, tmp_path / "fp8.img", max_seq=32, expert_align=64)


def test_v_norm_is_per_head_beside_full_qk_norms(hosted_build):
    """V_NORM with QK_NORM_FULL (no family has both; the format allows it): v is normed on each head, as Gemma 4's
    v_norm is and as the reference computes, whichever q/k norm the image has. Two KV heads, so a norm across the
    projection differs from one per head; every position's logits, the runtime against the reference."""
    from capi import Context, Lib
    from colibri import image as im
    from test_verifier import TINY, random_tensors
    dims = im.ModelDims(**{**TINY, "n_kv_heads": 2}, head_dim=4, flags=im.FLAG_QK_NORM_FULL | im.FLAG_V_NORM)
    image = im.build_image(dims, random_tensors(dims, seed=5))
    tokens = [1, 5, 9, 3, 7, 10, 2, 4]
    want = Reference(read_image(image)).forward(tokens)
    assert np.abs(want).max() > 0.5, "logits too small for the tolerance to mean anything"
    ctx = Context(Lib(hosted_build / "libcolibri.so"), image)
    rows = []
    for t in tokens:
        assert ctx.feed([t]) == 0
        rows.append(ctx.logits())
    assert_bit_identical(np.stack(rows), want)


def _family_image(name: str, tmp_path, seed: int, **config) -> bytes:
    arch, cfg = next((a, c) for n, a, c in FAMILIES if n == name)
    ckpt = make_family_checkpoint(arch, dict(cfg, **config), seed, tmp_path / name)
    pack(ckpt, tmp_path / f"{name}.img", max_seq=32, expert_align=64)
    return (tmp_path / f"{name}.img").read_bytes()


@pytest.mark.parametrize("dtype", ["f32", "q8_0"])
def test_mla_heads_batched_over_threads_give_the_reference_bits(dtype, hosted_build, tmp_path):
    """MLA's per-head projections (each head's W_UK^T before attention, W_UV after) run as few dispatches as the
    quantized inputs' buffer allows, their rows split over the parts as one matrix (here 8 heads: W_UK^T's all at
    once, W_UV's five and three at q8_0): with the parts run in any order (even and uneven splits) the logits of a
    prompt and of decoding are the unsplit ones and the reference's, bit for bit."""
    from capi import Context, Lib, Options, reversed_parts
    arch, cfg = next((a, c) for n, a, c in FAMILIES if n == "deepseek_v3")
    ckpt = make_family_checkpoint(arch, dict(cfg, hidden_size=64, num_attention_heads=8, num_key_value_heads=8,
                                             kv_lora_rank=128, qk_nope_head_dim=64, qk_rope_head_dim=16,
                                             v_head_dim=64, num_hidden_layers=2), 7, tmp_path / "wide")
    image = tmp_path / "wide.img"
    pack(ckpt, image, max_seq=32, expert_align=64, dtype=DType.parse(dtype), measure_quality=False)
    data = image.read_bytes()
    lib = Lib(hosted_build / "libcolibri.so")
    calls: list[int] = []
    hook = reversed_parts(calls)
    tokens = PROMPT[:6]
    want = Reference(read_image(data)).forward(tokens + [7, 8])
    for parts in (1, 2, 3, 7):
        ctx = Context(lib, data, options=Options(parallel_for=hook, parallel_parts=parts) if parts > 1 else None)
        assert ctx.feed(tokens) == 0
        rows = [ctx.logits()]
        for t in (7, 8):
            assert ctx.feed([t]) == 0
            rows.append(ctx.logits())
        assert_bit_identical(np.stack(rows), want[len(tokens) - 1:], f"{parts} parts")
        assert (len(calls) > 0) == (parts > 1)
        calls.clear()


@pytest.mark.parametrize("name", ["lfm2moe", "qwen35moe"])
def test_a_reset_starts_the_state_again(name, family_images, hosted_build):
    """colibri_reset goes back to position 0, where a convolving layer's inputs before it are 0 and a DeltaNet's
    state is 0: a prompt fed again after a reset gives the bits it gave the first time (as do passes of several
    tokens)."""
    from capi import Context, Lib, Options
    lib = Lib(hosted_build / "libcolibri.so")
    data = family_images[name][1].read_bytes()
    for opts in (None, Options(prefill_batch=4)):
        ctx = Context(lib, data, options=opts)
        runs = []
        for _ in range(2):
            assert ctx.feed(PROMPT) == 0
            runs.append(ctx.logits().tobytes())
            assert lib.so.colibri_reset(ctx.ctx) == 0
        assert runs[0] == runs[1], opts


@pytest.mark.parametrize("name", ["mixtral_window", "lfm2moe", "qwen35moe"])
def test_a_failed_pass_leaves_the_rings_and_conv_state_as_they_were(name, hosted_build, tmp_path):
    """A prefill pass writes its tokens' K/V rows into a windowed layer's ring (W rows, position p in row p % W),
    and every pass its tokens' inputs into a convolving layer's state. When a token of the pass meets a NaN (its
    embedding row here, at a position past the window), the pass fails and colibri_feed replays it one token at a
    time: that replay, and every feed after it, must find the rings and the conv state as they were before the
    pass, as colibri.h promises of a failed call. So batched and one token a pass fail at the same token, and the
    tokens fed next give the same bits, and the reference's logits."""
    import struct

    from capi import STATUS, Context, Lib, Options
    from colibri.image import Role
    from test_verifier import reseal
    data = bytearray(_family_image(name, tmp_path, 11, tie_word_embeddings=False))  # (a NaN head row: every logit)
    img = read_image(bytes(data))
    assert (img.dims.sliding_window == 4 and all(img.dims.window_layers)) or img.dims.conv_layers[0] or \
        img.dims.delta_layers[0]
    bad = 7  # the culprit token: no other prompt token has a NaN row
    embd, row = img.entry(Role.TOKEN_EMBD), 4 * img.dims.hidden_size
    data[embd.offset + bad * row: embd.offset + (bad + 1) * row] = struct.pack("<f", float("nan")) * img.dims.hidden_size
    data = bytes(reseal(data))
    prompt = [1, 5, 9, 3, 0, 2, bad, 4, 6]  # position 6: past the window
    after = [2, 3, 8]
    lib = Lib(hosted_build / "libcolibri.so")
    results = []
    for opts in (None, Options(prefill_batch=8), Options(prefill_batch=3)):
        ctx = Context(lib, data, options=opts)
        assert ctx.open_status == 0
        assert ctx.feed(prompt) == STATUS["E_NONFINITE"]
        fed = ctx.stats().tokens_fed
        rows = []
        for tok in after:
            assert ctx.feed([tok]) == 0
            rows.append(ctx.logits().tobytes())
        results.append((fed, rows))
    assert results[0][0] == 6, results[0][0]
    assert results[1] == results[0] and results[2] == results[0]
    ref = Reference(read_image(data)).forward(prompt[:6] + after)[6:]
    assert_bit_identical(np.stack([np.frombuffer(r, np.float32) for r in results[0][1]]), ref)


def test_kv_sharing_over_a_window_batched_is_one_token_a_pass(hosted_build, tmp_path):
    """Gemma 4's KV-sharing layers attend over an earlier layer's cache; over a windowed ring they read it after
    that layer stored the whole pass, so token t must be given the ring as it was after token t, not after the
    pass. A MoE model whose sharing layers route (a sharing windowed layer's router sees every token's attention
    output, though only the last token's logits come out of a prefill): fed in one call with batches (5 asked,
    the window is 3), every token's experts and weights at every layer and the logits are the bits of one token
    a pass, and the experts are the reference's."""
    import ctypes as C

    from capi import TRACE, Context, Lib, Options
    data = _family_image("gemma4", tmp_path, 12, num_hidden_layers=4, num_kv_shared_layers=2, sliding_window=3,
                         layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"])
    d = read_image(data).dims
    assert d.kv_shared(2) and d.kv_source(2) == 0 and d.windowed(2) and d.moe_layers[2]
    prompt = np.random.default_rng(3).integers(0, SMALL["vocab_size"], 14).tolist()
    lib = Lib(hosted_build / "libcolibri.so")
    traces: dict[str, list] = {"one": [], "batched": []}

    def recorder(into: list):
        @TRACE
        def trace(user, t):
            t = t[0]
            into.append((t.pos, t.layer, tuple(t.experts[i] for i in range(t.n_routed)),
                         np.array([t.weights[i] for i in range(t.n_routed)], np.float32).tobytes()))
        return trace

    hooks = {name: recorder(into) for name, into in traces.items()}
    one = Context(lib, data, options=Options(trace=C.cast(hooks["one"], C.c_void_p)))
    for tok in prompt:
        assert one.feed([tok]) == 0
    batched = Context(lib, data, options=Options(prefill_batch=5, trace=C.cast(hooks["batched"], C.c_void_p)))
    assert batched.open_status == 0
    assert batched.feed(prompt) == 0
    assert batched.logits().tobytes() == one.logits().tobytes()
    assert sorted(traces["batched"]) == traces["one"]  # a batch traces layer by layer for all its tokens
    assert batched.stats().prefill_batch == 3  # no longer than the window
    routes = Reference(read_image(data)).routing(prompt)
    for pos, layer, experts, _ in traces["one"]:
        if experts:
            assert list(experts) == routes[layer][0][pos].tolist(), (pos, layer)


@pytest.mark.parametrize("norms", ["random", "untouched"])
@pytest.mark.parametrize("name", [f[0] for f in FAMILIES])
def test_every_dtype_is_bit_identical_to_the_reference(name, norms, family_images, hosted_build, tmp_path):
    """Every family at every weight dtype (and an f16 KV cache), the runtime (the hosted build's library, its fastest
    kernel set) against the reference, every position's logits bit for bit; every board gives the hosted board's
    bits (test_dtypes.py), so this holds on each. Also untouched, as transformers makes the model: norm weights of
    exactly 1.0 put quantized activations on rounding ties, where any difference in the last bit shows."""
    from capi import Context, Lib
    from colibri.quant import DType
    lib = Lib(hosted_build / "libcolibri.so")
    if norms == "random":
        ckpt, _ = family_images[name]
    else:
        arch, cfg = next((a, c) for n, a, c in FAMILIES if n == name)
        ckpt = make_family_checkpoint(arch, cfg, 500 + len(name), tmp_path / "untouched", randomized=False)
    tokens = np.random.default_rng(11).integers(0, SMALL["vocab_size"], 20).tolist()
    variants = ((DType.F16, "f32"), (DType.BF16, "f32"), (DType.Q8_0, "f32"), (DType.Q4_0, "f16"))
    for dtype, kv in variants if norms == "random" else variants[2:]:  # ties matter where activations are quantized
        image = tmp_path / f"{name}-{dtype.name}-{kv}.img"
        pack(ckpt, image, max_seq=32, expert_align=64, dtype=dtype, kv=kv, measure_quality=False)
        ctx = Context(lib, image.read_bytes())
        rows = []
        for t in tokens:
            assert ctx.feed([t]) == 0
            rows.append(ctx.logits().copy())
        assert_bit_identical(np.stack(rows), Reference(read_image(image.read_bytes())).forward(tokens), f"{dtype.name} kv {kv}")


@pytest.mark.parametrize("arch,changes,field", [
    ("Qwen3MoeForCausalLM", {"max_window_layers": None}, None),    # its rule windows every layer: never read
    ("Qwen2ForCausalLM", {"max_window_layers": None}, "max_window_layers"),
    ("Qwen2ForCausalLM", {"max_window_layers": "x"}, "max_window_layers"),
], ids=["not read where the rule needs none", "null where it is read", "a string where it is read"])
def test_max_window_layers_is_read_only_by_the_rules_that_need_it(arch, changes, field):
    """A family's window rule reads max_window_layers only if it places the window by it (review of the families as
    data: every rule had read it, and a null one raised TypeError in a family that never uses it)."""
    from colibri.checkpoint import UnsupportedModel, read_config
    cfg = {"architectures": [arch], "vocab_size": 16, "hidden_size": 8, "intermediate_size": 12,
           "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 64,
           "sliding_window": 4, "use_sliding_window": True, **changes}
    if arch == "Qwen3MoeForCausalLM":
        cfg.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=6)
    if field is None:
        dims = read_config(cfg, 32)[0]
        assert dims.sliding_window == 4 and all(dims.window_layers)
    else:
        with pytest.raises(UnsupportedModel, match=field):
            read_config(cfg, 32)


def test_a_gemma4_rope_entry_left_empty_is_the_default_one():
    """Gemma 4's sliding layers' RoPE entry given as {} or null takes the default entry's frequencies, as before the
    families became data (review of e33f7f5: an empty entry had raised an error)."""
    from colibri.checkpoint import read_config
    name, arch, cfg = next(f for f in FAMILIES if f[0] == "gemma4")
    full = {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}
    def rope_of(sliding) -> dict:
        params = {"sliding_attention": sliding, "full_attention": full}
        return read_config({**cfg, "architectures": [arch], "rope_parameters": params}, 32)[3]
    default = rope_of({"rope_type": "default", "rope_theta": 10_000.0})
    for empty in ({}, None):
        got = rope_of(empty)
        assert np.array_equal(got["inv_freq"], default["inv_freq"]) and got["attention_factor"] == default["attention_factor"]
        assert np.array_equal(got["global_rope"][0], default["global_rope"][0])


@pytest.mark.parametrize("name,key", [("gemma4", "top_k_experts"), ("mixtral_window", "num_experts_per_tok")])
def test_a_top_k_out_of_range_names_the_familys_own_key(name, key):
    """The refusal names the config field the family reads its top-k from (review of 4b48255: Gemma 4's was named
    num_experts_per_tok, a field its config does not have)."""
    from colibri.checkpoint import UnsupportedModel, read_config
    _, arch, cfg = next(f for f in FAMILIES if f[0] == name)
    experts = next(cfg[k] for k in ("num_local_experts", "num_experts", "n_routed_experts") if k in cfg)
    with pytest.raises(UnsupportedModel, match=f"config field {key}={experts + 1} must be between 1"):
        read_config({**cfg, "architectures": [arch], key: experts + 1}, 32)


# GLM-4.7-Flash's released config.json (its fields, at a small size): DeepSeek's fields transformers' GLM does not
# read stated as GLM computes, a top-level partial_rotary_factor 1, MTP layers (not run, as transformers does not)
GLM_RELEASED = {"attention_bias": False, "attention_dropout": 0.0, "first_k_dense_replace": 1, "hidden_act": "silu",
                "hidden_size": 16, "intermediate_size": 32, "kv_lora_rank": 4, "max_position_embeddings": 128,
                "model_type": "glm4_moe_lite", "moe_intermediate_size": 8, "n_group": 1, "n_routed_experts": 2,
                "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 2, "num_experts_per_tok": 1,
                "num_hidden_layers": 3, "num_key_value_heads": 2, "num_nextn_predict_layers": 1,
                "partial_rotary_factor": 1.0, "q_lora_rank": 4, "qk_nope_head_dim": 2, "qk_rope_head_dim": 2,
                "rms_norm_eps": 1e-5, "rope_scaling": None, "rope_theta": 10000, "routed_scaling_factor": 1.5,
                "tie_word_embeddings": False, "topk_group": 1, "topk_method": "noaux_tc", "v_head_dim": 4,
                "vocab_size": 32, "architectures": ["Glm4MoeLiteForCausalLM"]}


def test_glm_reads_its_released_config():
    from colibri.checkpoint import read_config
    dims = read_config(GLM_RELEASED, 32)[0]
    assert dims.moe_layers == (False, True, True) and dims.kv_lora_rank == 4 and dims.shared_ffn_size == 8


@pytest.mark.parametrize("changes,field", [
    ({"first_k_dense_replace": 2}, "first_k_dense_replace"),  # not read by transformers' GLM: must agree
    ({"topk_method": "greedy"}, "topk_method"),
    ({"scoring_func": "softmax"}, "scoring_func"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({"mlp_layer_types": ["dense", "sparse"]}, "mlp_layer_types"),
    ({"mlp_layer_types": ["dense", "moe", "dense", "sparse"]}, "mlp_layer_types"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor"),
    ({"attention_bias": True}, "attention_bias"),
])
def test_glm_refuses_what_it_cannot_run(changes, field):
    """GLM-4.7-Flash's fields the runtime would not honour as transformers' Glm4MoeLite does are refused by name."""
    from colibri.checkpoint import UnsupportedModel, read_config
    _, arch, cfg = next(f for f in FAMILIES if f[0] == "glm4_moe_lite")
    with pytest.raises(UnsupportedModel, match=field):
        read_config({**cfg, "architectures": [arch], **changes}, 32)
    with pytest.raises(UnsupportedModel, match=field):
        read_config({**GLM_RELEASED, **changes}, 32)


def test_qwen35s_multi_token_prediction_layers_are_left_out_as_transformers_leaves_them(family_images, tmp_path):
    """Released Qwen3.5 checkpoints carry mtp.* tensors, which transformers does not load (its
    _keys_to_ignore_on_load_unexpected): they pack to the image of the checkpoint without them; any other tensor
    the runtime would not use is still refused."""
    from safetensors.numpy import load_file, save_file

    from colibri.checkpoint import UnsupportedModel
    ckpt, image = family_images["qwen35moe"]
    for extra, packs in (("mtp.layers.0.mlp.gate.weight", True), ("model.layers.0.mlp.spare.weight", False)):
        copy = tmp_path / extra
        shutil.copytree(ckpt, copy)
        config = json.loads((copy / "config.json").read_text())  # and the released config's MTP fields
        (copy / "config.json").write_text(json.dumps({**config, "mtp_num_hidden_layers": 1,
                                                      "mtp_use_dedicated_embeddings": False}))
        tensors = load_file(copy / "model.safetensors")
        save_file({**tensors, extra: np.ones((4, 4), np.float32)}, copy / "model.safetensors")
        if packs:
            pack(copy, tmp_path / "mtp.img", max_seq=32, expert_align=64)
            assert (tmp_path / "mtp.img").read_bytes() == image.read_bytes()
        else:
            with pytest.raises(UnsupportedModel, match="spare"):
                pack(copy, tmp_path / "spare.img", max_seq=32, expert_align=64)


def test_the_state_does_not_grow_with_the_context(tmp_path, capsys):
    """Qwen3.5's DeltaNet layers keep a state sized by the model: packed for 64 and for 512 positions, the state is
    the same bytes, only the attention layer's KV cache grows; the footprint report puts the state beside what a KV
    cache of those layers would take for the image's context."""
    from colibri import footprint
    from colibri.plan import arena_plan
    arch, cfg = next((a, c) for n, a, c in FAMILIES if n == "qwen35moe")
    ckpt = make_family_checkpoint(arch, cfg, 17, tmp_path / "q", max_positions=512)
    plans = {}
    for positions in (64, 512):
        pack(ckpt, tmp_path / f"{positions}.img", max_seq=positions, expert_align=64, measure_quality=False)
        d = read_image((tmp_path / f"{positions}.img").read_bytes()).dims
        plans[positions] = arena_plan(d)
        assert d.delta_layers == (True, True, True, False)
    assert plans[64]["state"] == (plans[64]["state"][0], plans[512]["state"][1])
    per_layer = 4 * (3 * (2 * 2 * 6 + 4 * 4) + 4 * 6 * 4)  # (K - 1)·(2·Hk·dk + Hv·dv) + Hv·dk·dv floats
    assert plans[512]["state"][1] == 3 * per_layer == plans[512]["state_saved"][1]
    assert plans[512]["k_cache"][1] == 8 * plans[64]["k_cache"][1] == 512 * 2 * 8 * 4  # one layer: 2 KV heads of 8
    assert footprint.main(["--board", "cortex_m55", "--image", str(tmp_path / "512.img")]) == 0
    out = capsys.readouterr().out
    assert f"state: 3 layers keep {3 * per_layer:,} bytes whatever the context ({per_layer:,} a layer" in out
    assert f"over 512 positions would take {3 * 512 * 2 * 2 * 8 * 4:,}" in out


@pytest.mark.parametrize("name,changes,field", [
    ("lfm2moe", {"conv_bias": True}, "conv_bias"),
    ("lfm2moe", {"conv_L_cache": 17}, "conv_L_cache"),
    ("lfm2moe", {"conv_L_cache": 1}, "conv_L_cache"),
    ("lfm2moe", {"layer_types": ["conv", "attention", "conv", "conv", "conv"]}, "layer_types"),
    ("lfm2moe", {"num_dense_layers": 9}, "num_dense_layers"),
    ("lfm2moe", {"tie_embedding": False}, "tie_embedding"),
    ("lfm2moe", {"kv_lora_rank": 4}, "kv_lora_rank"),  # another family's field
    ("lfm2moe", {"full_attn_idxs": [0]}, r"full_attn_idxs=\[0\] belongs to Lfm2ForCausalLM"),  # dense LFM2's field
    ("lfm2", {"block_use_swiglu": False}, "block_use_swiglu"),
    ("lfm2", {"conv_dim": 64}, "conv_dim"),
    ("lfm2", {"block_norm_eps": 1e-6}, "block_norm_eps"),
    ("lfm2", {"layer_types": ["conv"] * 4}, "full_attn_idxs"),
    ("lfm2", {"block_ffn_dim_multiplier": -1.0}, "block_ffn_dim_multiplier"),
    ("lfm2", {"block_multiple_of": 0}, "block_multiple_of"),
    ("lfm2", {"num_dense_layers": 1}, "num_dense_layers"),  # LFM2-MoE's field
    ("qwen35moe", {"attention_bias": True}, "attention_bias"),
    ("qwen35moe", {"layer_types": ["linear_attention"] * 3}, "layer_types"),
    ("qwen35moe", {"linear_num_key_heads": 3}, "linear_num_value_heads"),
    ("qwen35moe", {"linear_key_head_dim": 70000}, "linear_key_head_dim"),
    ("qwen35moe", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.1}},
     "partial_rotary_factor"),
    ("qwen35moe", {"conv_L_cache": 3}, "conv_L_cache"),  # LFM2's field
])
def test_the_state_families_refuse_what_they_cannot_run(name, changes, field):
    """LFM2's, LFM2-MoE's and Qwen3.5's fields the runtime would not honour as transformers does are refused by name."""
    from colibri.checkpoint import UnsupportedModel, read_config
    _, arch, cfg = next(f for f in FAMILIES if f[0] == name)
    with pytest.raises(UnsupportedModel, match=field):
        read_config({**cfg, "architectures": [arch], **changes}, 32)


@pytest.mark.parametrize("config", [
    dict(intermediate_size=8192, block_ff_dim=12288, block_auto_adjust_ff_dim=True, block_ffn_dim_multiplier=1.0,
         block_multiple_of=256),  # LFM2-1.2B's config.json: Lfm2Config takes block_ff_dim over intermediate_size
    dict(intermediate_size=10752, block_ff_dim=10752, block_auto_adjust_ff_dim=False),  # LFM2-2.6B's
    dict(intermediate_size=100, block_multiple_of=1),  # two thirds, rounded down
    dict(intermediate_size=100, block_ffn_dim_multiplier=1.7, block_multiple_of=24),
])
def test_dense_lfm2_sizes_its_mlp_as_transformers_does(config):
    """The width of Lfm2MLP's w1 that transformers builds from the config, read without building it."""
    import transformers

    from colibri.families.lfm2 import mlp_size
    built = transformers.models.lfm2.modeling_lfm2.Lfm2MLP(transformers.Lfm2Config(hidden_size=4, **config))
    assert mlp_size(config) == built.w1.out_features


@pytest.mark.parametrize("name", sorted({f[0] for f in FAMILIES}))
def test_a_config_silent_on_eps_and_rope_base_gets_its_classs_defaults(name):
    """A config.json without the RMSNorms' epsilon or the RoPE base: what the family's configuration class fills in
    (Mixtral's 1e6 and 1e-5, gpt-oss's 150,000, LFM2's 1e6 and 1e-5, ...), as transformers would run it."""
    import transformers

    from colibri.checkpoint import read_config
    from colibri.families import FAMILIES as FAMILY_RECORDS
    _, arch, cfg = next(f for f in FAMILIES if f[0] == name)
    fam = FAMILY_RECORDS[arch]
    stated_rope = "rope_parameters" in cfg  # (with its other parameters: then only the epsilon is left out)
    cfg = {k: v for k, v in cfg.items() if k not in ("rope_theta", fam.eps_key) + (() if stated_rope else
                                                                                     ("rope_parameters",))}
    classes = {"Gemma4ForCausalLM": "Gemma4TextConfig", "Qwen3_5MoeForCausalLM": "Qwen3_5MoeTextConfig"}
    built = getattr(transformers, classes.get(arch, arch.replace("ForCausalLM", "Config")))(**cfg)
    dims = read_config({**cfg, "architectures": [arch]}, 32)[0]
    rope = built.rope_parameters  # (Gemma 4's per layer type: dims.rope_theta is its sliding layers')
    theta = rope["sliding_attention"]["rope_theta"] if "sliding_attention" in rope else rope["rope_theta"]
    assert dims.rms_norm_eps == getattr(built, fam.eps_key)
    assert stated_rope or dims.rope_theta == theta
