"""Text in, text out (colibri/text.py): a real byte-level BPE tokenizer and a chat template travel in the
image, and a prompt in words gives the token ids, the tokens and the text transformers gives."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT
from colibri import flash
from colibri.image import read_image
from colibri.pack import pack
from colibri.text import Text

CHAT_TEMPLATE = ("{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '</s>\\n' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")
CORPUS = ["the quick brown fox jumps over the lazy dog", "flash memory holds the experts of the model",
          "a mixture of experts routes every token to a few of them", "tiny boards run big models slowly"] * 20


def make_text_checkpoint(out: Path, **sizes: int) -> Path:
    """A random Mixtral with a byte-level BPE tokenizer trained by the tokenizers library, special tokens
    <s> and </s>, and a chat template; `sizes` overrides its (tiny) config."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import MixtralConfig, MixtralForCausalLM, PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    torch.manual_seed(3)
    config = dict(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=24, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                  max_position_embeddings=128, bos_token_id=0, eos_token_id=1, initializer_range=0.25)
    MixtralForCausalLM(MixtralConfig(**{**config, **sizes})).eval().save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def text_checkpoint(tmp_path_factory):
    return make_text_checkpoint(tmp_path_factory.mktemp("text") / "ckpt")


@pytest.fixture(scope="module")
def text_image(text_checkpoint, tmp_path_factory):
    path = tmp_path_factory.mktemp("text_img") / "t.img"
    pack(text_checkpoint, path, 128, 64)
    return path


def test_the_image_carries_the_tokenizer_and_the_template(text_image, text_checkpoint):
    meta = read_image(text_image.read_bytes()).meta
    assert meta["tokenizer"] == json.loads((text_checkpoint / "tokenizer.json").read_text())
    assert meta["chat_template"] == CHAT_TEMPLATE and meta["eos_token"] == "</s>" and 1 in Text(meta).eos_ids


def test_prompt_in_words_matches_transformers(text_image, text_checkpoint, hosted_build, capsys):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    prompt = "the lazy fox routes experts"
    code = flash.main([str(text_image), "--board", "hosted", "--firmware", str(hosted_build / "firmware.elf"),
                       "--prompt", prompt, "--max-new-tokens", "12", "--verify", "--json"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and report["verify"]["passed"]
    hf_tok = AutoTokenizer.from_pretrained(text_checkpoint)
    ids = hf_tok(prompt).input_ids
    assert report["prompt_tokens"] == ids and ids[0] == 0  # <s> added as the tokenizer's post-processor says
    model = AutoModelForCausalLM.from_pretrained(text_checkpoint, experts_implementation="eager").eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=1,
                             pad_token_id=1)[0, len(ids):].tolist()
    assert report["tokens"] == out
    assert report["text"] == hf_tok.decode(out, skip_special_tokens=True)


def test_chat_template_renders_as_transformers_does(text_image, text_checkpoint):
    from transformers import AutoTokenizer
    hf_tok = AutoTokenizer.from_pretrained(text_checkpoint)
    text = Text(read_image(text_image.read_bytes()).meta)
    messages = [{"role": "user", "content": "what do tiny boards run?"}]
    assert text.chat_prompt(messages) == hf_tok.apply_chat_template(messages, add_generation_prompt=True,
                                                                    tokenize=False)
    want = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
    assert text.chat_tokens(messages) == list(want)


def test_chat_runs_and_an_image_without_a_tokenizer_says_so(text_image, images, hosted_build, capsys):
    firmware = str(hosted_build / "firmware.elf")
    code = flash.main([str(text_image), "--board", "hosted", "--firmware", firmware, "--chat", "hello there",
                       "--max-new-tokens", "4", "--json"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and isinstance(report["text"], str) and len(report["tokens"]) <= 4
    code = flash.main([str(images["base"]), "--board", "hosted", "--firmware", firmware, "--prompt", "hello"])
    err = capsys.readouterr().err
    assert code == 2 and "carries no tokenizer" in err and "--prompt-tokens" in err


def test_interactive_chat_keeps_the_context_and_resets(text_image, hosted_build):
    """Turn two feeds only what the conversation added (the KV cache is kept): its answer is the one a
    fresh context fed the whole conversation gives; /reset starts over."""
    from colibri.protocol import Sampling
    text = Text(read_image(text_image.read_bytes()).meta)
    lines = iter(["hello there", "and the experts?", "/reset", "hello there", "/quit"])
    out: list[str] = []
    firmware = hosted_build / "firmware.elf"
    messages = flash.run_chat(text_image, "hosted", firmware, text, Sampling(), 6, read=lambda _: next(lines),
                              write=out.append)
    assert [m["role"] for m in messages] == ["user", "assistant"]  # after /reset, one exchange
    assert "[conversation and KV cache cleared]\n" in out
    end = next(i for i, piece in enumerate(out) if piece.endswith("\n"))
    first_answer = "".join(out[:end + 1])[:-1]  # what streamed, piece by piece, for the first answer
    assert messages[1]["content"] == first_answer  # the same question after /reset, the same answer
    # the second turn's answer, against one fresh run of the whole conversation
    lines2 = iter(["hello there", "and the experts?", "/quit"])
    two = flash.run_chat(text_image, "hosted", firmware, text, Sampling(), 6, read=lambda _: next(lines2),
                         write=lambda s: None)
    fresh = flash.run_on_board(text_image, "hosted", text.chat_tokens(two[:3]), 6, Sampling(), False,
                               firmware=firmware, stop=text.eos_ids)
    assert two[3]["content"] == text.decode(fresh.tokens)


def test_the_converters_vocabulary_travels(hosted_build, tmp_path, capsys):
    """A file written by llama.cpp's converter (tests/fixtures/gguf, GPT-2's vocabulary): prompt -> tokens ->
    device -> text, the ids those transformers' tokenizer of the same file gives, and the text its decode gives."""
    from transformers import AutoTokenizer
    src = ROOT / "tests" / "fixtures" / "gguf" / "converted-mixtral-q8_0.gguf"
    image = tmp_path / "c.img"
    assert pack(src, image, 32, 64, measure_quality=False)["tokenizer"]
    prompt = "Colibri runs mixtures of experts on tiny boards."
    code = flash.main([str(image), "--board", "hosted", "--firmware", str(hosted_build / "firmware.elf"),
                       "--prompt", prompt, "--max-new-tokens", "5", "--json"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    hf_tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    assert code == 0 and out["prompt_tokens"] == hf_tok(prompt).input_ids and len(out["prompt_tokens"]) > 5
    assert out["text"] == hf_tok.decode(out["tokens"])


@pytest.mark.parametrize("name", sorted(p.name.removesuffix(".llama-cpp.npz")
                                        for p in (ROOT / "tests" / "fixtures" / "gguf").glob("*.llama-cpp.npz")))
def test_a_converted_files_vocabulary_tokenizes_as_llama_cpp_does(name, tmp_path):
    """Each file from llama.cpp's converter (tests/fixtures/gguf: GPT-2's, Qwen's and Gemma 4's vocabularies, the
    last cut by the fixture tool): its vocabulary in the image turns a text into the ids llama.cpp's own tokenizer gives
    for it (kept beside the file by tools/make_gguf_fixtures.py), the BOS llama.cpp adds included (gemma4's, whose
    config transformers cannot build, converted alone), and they decode back to the text."""
    src = ROOT / "tests" / "fixtures" / "gguf" / f"{name}.gguf"
    oracle = np.load(src.with_suffix(".llama-cpp.npz"))
    image = tmp_path / "t.img"
    assert pack(src, image, 32, 64, measure_quality=False)["tokenizer"]
    text = Text(read_image(image.read_bytes()).meta)
    ids = text.encode(str(oracle["text"]))
    assert ids == oracle["text_tokens"].tolist()
    assert text.decode(ids).strip() == str(oracle["text"])


def test_a_gguf_files_vocabulary_travels_too(text_checkpoint, hosted_build, tmp_path, capsys):
    """A GGUF file's tokenizer.ggml.* vocabulary and chat template (written as llama.cpp's converter
    stores a byte-level BPE vocabulary) land in the image: a prompt in words gives the ids the checkpoint's
    own tokenizer gives, and the template renders as transformers renders the original."""
    from transformers import AutoTokenizer

    from gguf_writer import hf_to_gguf
    src = hf_to_gguf(text_checkpoint, tmp_path / "t.gguf", tokenizer=True)
    image = tmp_path / "t.img"
    report = pack(src, image, 128, 64, measure_quality=False)
    assert report["tokenizer"] and report["chat_template"]
    prompt = "the lazy fox routes experts"
    code = flash.main([str(image), "--board", "hosted", "--firmware", str(hosted_build / "firmware.elf"),
                       "--prompt", prompt, "--max-new-tokens", "4", "--json"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    hf_tok = AutoTokenizer.from_pretrained(text_checkpoint)
    assert code == 0 and out["prompt_tokens"] == hf_tok(prompt).input_ids
    text = Text(read_image(image.read_bytes()).meta)
    messages = [{"role": "user", "content": "what do tiny boards run?"}]
    assert text.chat_prompt(messages) == hf_tok.apply_chat_template(messages, add_generation_prompt=True,
                                                                    tokenize=False)
    assert 1 in text.eos_ids  # </s>
