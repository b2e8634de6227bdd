"""GGUF input: the same checkpoint through llama.cpp's format packs to the same model."""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import gguf
import numpy as np
import pytest

from conftest import CONFIGS, TinyConfig, make_checkpoint, make_family_checkpoint
from gguf_writer import hf_to_gguf
from colibri.format import DTYPES
from colibri.checkpoint import UnsupportedModel
from colibri.gguf_input import open_gguf, read_gguf, unpermute
from colibri.image import FLAG_NORM_TOPK, Role, read_image
from colibri.lazy import loaded
from colibri.pack import pack
from colibri.quant import DType, Encoded, from_gguf_blocks
from test_families import FAMILIES, WINDOWED

Q = gguf.GGMLQuantizationType
PROMPT = [1, 5, 9, 3, 0, 2]
# GGUF files written by llama.cpp's own quantizer, one per common type (tools/make_gguf_fixtures.py)
FIXTURES = Path(__file__).parent / "fixtures" / "gguf"
# every file llama.cpp's tools wrote (tools/make_gguf_fixtures.py): mixtral-<type> from its quantizer,
# converted-<family>-<type> from its converter (convert_hf_to_gguf.py), then its quantizer where needed
LLAMA_CPP_FILES = sorted(p.stem for p in FIXTURES.glob("*.gguf"))
CONVERTED = [f for f in LLAMA_CPP_FILES if f.startswith("converted-")]
NATIVE = set(DTYPES)  # storage types an image holds as they are (F32, F16, BF16 widened to f32 exactly)
# (and Gemma 4, which tests/gguf_writer.py does not write: the converter's own files are read instead,
# converted-gemma4-*, in test_llama_cpp_files_match_transformers and test_gemma4_gguf_...)
# (nor GLM's dense layer between MoE ones: a deepseek2 file has its dense layers first; test_glm_gguf_...)
NOT_IN_GGUF = {"deepseek_v3_halves", "deepseek_v2_groups_yarn", "gemma4", "gemma4_bias_ple",
               "gemma4_dense_kv_shared", "glm4_moe_lite"}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    base = tmp_path_factory.mktemp("gguf_src")
    out = {"mixtral": make_checkpoint(CONFIGS[0], base / "mixtral"),
           # rows a multiple of 32, so GGUF stores every matrix quantized
           "mixtral32": make_checkpoint(TinyConfig("mixtral32", vocab=64, hidden=64, ffn=96, layers=2, heads=4,
                                                   kv_heads=2, experts=4, top_k=2, seed=5), base / "mixtral32")}
    for i, (name, arch, cfg) in enumerate(FAMILIES):
        out[name] = make_family_checkpoint(arch, cfg, 100 + i, base / name)
    return out


# (not the windowed ones: llama.cpp's converter writes no sliding window for these architectures, and
# llama.cpp attends over every position, so a GGUF of them packs without a window, as llama.cpp runs it)
# (nor the DeepSeek variants a deepseek2 file cannot hold: RoPE on halves, YaRN, softmax groups)
@pytest.mark.parametrize("name", ["mixtral"] + [f[0] for f in FAMILIES if f[0] != "llama_llama3_tied"
                                                and f[0] not in WINDOWED and f[0] not in NOT_IN_GGUF])
def test_f32_gguf_packs_to_the_same_image(name, sources, tmp_path):
    """Same tensors after undoing llama.cpp's layout: the images are byte-identical."""
    from_st, from_gguf = tmp_path / "st.img", tmp_path / "gguf.img"
    pack(sources[name], from_st, 32, 64)
    pack(hf_to_gguf(sources[name], tmp_path / "m.gguf"), from_gguf, 32, 64)
    assert from_gguf.read_bytes() == from_st.read_bytes()


def test_llama3_rope_freqs_is_refused(sources, tmp_path):
    """llama.cpp stores llama3 RoPE as a rope_freqs tensor; it is refused by name, never ignored."""
    path = hf_to_gguf(sources["llama_llama3_tied"], tmp_path / "m.gguf", extra={"rope_freqs.weight": np.ones(5, np.float32)})
    with pytest.raises(UnsupportedModel, match="rope_freqs"):
        pack(path, tmp_path / "a.img", 32, 64)


def _bound(orig: np.ndarray, qtype: Q) -> np.ndarray:
    """The largest error each stored type allows per element (an oracle from the formats' definitions)."""
    if qtype == Q.F16:
        return np.abs(orig) * 2.0 ** -11 + 6e-8
    if qtype == Q.BF16:
        return np.abs(orig) * 2.0 ** -8
    blocks = np.abs(orig).reshape(*orig.shape[:-1], -1, 32).max(axis=-1, keepdims=True)
    # Q8_0: d = amax/127, values round(x/d); Q4_0: d = max/-8, values in 0..15. d is stored as f16,
    # which adds up to (largest level) * d * 2^-11 to the rounding error.
    if qtype == Q.Q8_0:
        factor = 0.5 + 127 * 2.0 ** -11
        step = blocks / 127
    else:
        factor = 1.0 + 8 * 2.0 ** -11
        step = blocks / 8
    return np.broadcast_to(step * factor * 1.0001, blocks.shape[:-1] + (32,)).reshape(orig.shape)


@pytest.mark.parametrize("qtype", [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0], ids=lambda q: q.name)
def test_quantized_gguf_dequantizes_within_the_format_error(qtype, tmp_path):
    from colibri.checkpoint import load_checkpoint
    src = make_family_checkpoint("Qwen2MoeForCausalLM", dict(
        vocab_size=64, num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=96, moe_intermediate_size=64, shared_expert_intermediate_size=32, num_experts=4,
        num_experts_per_tok=2, norm_topk_prob=False), 7, tmp_path / "src")
    exact = load_checkpoint(src, 32)
    quant = load_checkpoint(hf_to_gguf(src, tmp_path / "q.gguf", qtype), 32)
    changed = 0
    for key, orig in exact.tensors.items():
        got, orig = loaded(quant.tensors[key]), np.asarray(orig)  # both read now (a checkpoint's come unread)
        if isinstance(got, Encoded):  # Q8_0/Q4_0 are kept as stored; compare their values
            assert got.dtype.name == qtype.name
            got = got.decode()
        stored = orig.ndim == 2 and orig.shape[-1] % 32 == 0 and key[0].name not in ("ROPE_COS", "ROPE_SIN")
        if not stored:
            np.testing.assert_array_equal(got, orig)  # kept in F32, as llama.cpp does for vectors
            continue
        err = np.abs(got - orig)
        assert np.all(err <= _bound(orig, qtype)), (key, float(err.max()))
        changed += bool(err.max() > 0)
    assert changed > 5  # the storage type really was lossy
    pack(tmp_path / "q.gguf", tmp_path / "q.img", 32, 64)  # and it packs


@pytest.mark.parametrize("name,qtype", [("mixtral-iq4_nl", Q.IQ4_NL), ("mixtral-iq4_xs", Q.IQ4_XS)],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_types_without_an_image_dtype_are_dequantized_exactly(name, qtype, tmp_path, capsys):
    """A GGUF type the image has no dtype for (written by llama.cpp's quantizer) packs: with --dtype f32 each tensor
    is dequantized to f32 with nothing lost, the report names what was converted, and the device computes exactly
    what the dequantized weights give; --dtype stored takes q8_0 for them instead (the report says so)."""
    from colibri import pack as pack_cli
    path = FIXTURES / f"{name}.gguf"
    out = tmp_path / "q.img"
    assert pack_cli.main([str(path), "-o", str(out), "--max-seq", "32", "--dtype", "f32"]) == 0
    assert f"{qtype.name} tensors: no image dtype holds them" in capsys.readouterr().out
    img = read_image(out.read_bytes())
    reader = gguf.GGUFReader(str(path))
    stored = {t.name: t for t in reader.tensors}
    assert stored["blk.1.ffn_down_exps.weight"].tensor_type == qtype
    exact = gguf.dequantize(stored["blk.1.ffn_down_exps.weight"].data, qtype)[1]
    assert img.entry(Role.EXPERT_DOWN, 1, 1).dtype == DType.F32
    np.testing.assert_array_equal(img.tensor(Role.EXPERT_DOWN, 1, 1), exact)
    np.testing.assert_array_equal(img.tensor(Role.TOKEN_EMBD), gguf.dequantize(stored["token_embd.weight"].data, qtype))
    assert pack_cli.main([str(path), "-o", str(tmp_path / "s.img"), "--max-seq", "32", "--dtype", "stored"]) == 0
    assert "exactly and stored as q8_0" in capsys.readouterr().out
    assert read_image((tmp_path / "s.img").read_bytes()).entry(Role.EXPERT_DOWN, 1, 1).dtype == DType.Q8_0
    # to a narrower dtype on request, with the cost measured against the exact values
    assert pack_cli.main([str(path), "-o", str(tmp_path / "q8.img"), "--max-seq", "32", "--dtype", "q8_0"]) == 0
    assert "quality" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["mixtral-q3_k_m", "mixtral-iq4_xs", "mixtral-q4_k_m", "mixtral-f32-and-f16"])
def test_stored_keeps_each_tensor_that_an_image_dtype_holds(name, tmp_path):
    """--dtype stored (what `colibri run model.gguf` packs) decides tensor by tensor: a type an image dtype holds
    lands as it is (a Q3_K_M file's Q4_K, Q5_K and Q6_K tensors byte for byte, F16 as F16), a quantized type no
    image has (Q3_K, IQ4_XS) as q8_0 rather than 7-10 times its bytes in f32, F32 as f32."""
    from colibri.autopack import file_dtype
    from colibri.gguf_input import STORED_FALLBACK
    src = FIXTURES / f"{name}.gguf"
    if name == "mixtral-f32-and-f16":  # the Q4_K_M file with its attention matrices in F16 and F32
        reader = gguf.GGUFReader(str(FIXTURES / "mixtral-q4_k_m.gguf"))
        floats = {t.name: np.asarray(gguf.dequantize(t.data, t.tensor_type), np.float32) for t in reader.tensors
                  if t.name.endswith(("attn_q.weight", "attn_k.weight"))}
        changed = {n: (v.astype(np.float16), Q.F16) if "attn_q" in n else v for n, v in floats.items()}
        src = copy_gguf(FIXTURES / "mixtral-q4_k_m.gguf", tmp_path / "mixed.gguf", {}, changed)
    assert file_dtype(src) == "stored"
    image = tmp_path / "m.img"
    pack(src, image, 32, 64, dtype=None, measure_quality=False)
    img = read_image(image.read_bytes())
    names = {"attn_q": (Role.WQ,), "attn_k": (Role.WK,), "attn_output": (Role.WO,), "output": (Role.LM_HEAD,)}
    seen = set()
    for t in gguf.GGUFReader(str(src)).tensors:
        kind = t.name.split(".")[-2]
        if kind not in names:
            continue
        entry = img.entry(*names[kind], *((int(t.name.split(".")[1]),) if t.name.startswith("blk.") else ()))
        want = (DType[t.tensor_type.name] if t.tensor_type.name in DTYPES else STORED_FALLBACK)
        assert DType(entry.dtype) == want, (t.name, t.tensor_type.name)
        seen.add(t.tensor_type.name)
    assert len(seen) >= 2  # (every file here mixes types)


@pytest.mark.parametrize("writer", ["project", "llama.cpp"])
@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0], ids=lambda q: q.name)
def test_quantized_gguf_tensors_land_in_the_image_unchanged(qtype, writer, sources, tmp_path):
    """A GGUF Q8_0/Q4_0 tensor packed to the same dtype keeps its quantized values and scales bit for
    bit (the q/k rows of a `llama` file are only reordered back), the output matrix too (--dtype q4_0 widens
    it to q8_0 only when it is not Q4_0 already); any other target dtype converts it. On the project's
    writer's file (every matrix in the type) and on llama.cpp's quantizer's (tests/fixtures/gguf)."""
    path = (hf_to_gguf(sources["mixtral32"], tmp_path / "q.gguf", qtype) if writer == "project"
            else FIXTURES / f"mixtral-{qtype.name.lower()}.gguf")
    dtype = DType[qtype.name]
    pack(path, tmp_path / "q.img", 32, 64, dtype=dtype, measure_quality=False)
    img = read_image((tmp_path / "q.img").read_bytes())
    reader = gguf.GGUFReader(str(path))
    n_heads = img.dims.n_heads
    checked = 0
    for t in reader.tensors:
        if t.tensor_type != qtype:
            continue
        raw = from_gguf_blocks(t.data, dtype, tuple(int(n) for n in reversed(t.shape)))
        if t.name == "token_embd.weight":
            stored = img.encoded(Role.TOKEN_EMBD)
        elif t.name == "blk.0.attn_q.weight":
            raw = raw.map_rows(lambda a: unpermute(a, n_heads))
            stored = img.encoded(Role.WQ, 0)
        elif t.name == "blk.1.ffn_down_exps.weight":
            last = img.dims.n_experts - 1
            raw, stored = raw[last], img.encoded(Role.EXPERT_DOWN, 1, last)
        elif t.name == "output.weight":
            stored = img.encoded(Role.LM_HEAD)
        else:
            continue
        assert stored.dtype == dtype
        np.testing.assert_array_equal(stored.values, raw.values)
        np.testing.assert_array_equal(stored.scales.view(np.uint16), raw.scales.view(np.uint16))
        checked += 1
    output_in_type = any(t.name == "output.weight" and t.tensor_type == qtype for t in reader.tensors)
    assert output_in_type or writer == "llama.cpp"  # (llama.cpp's Q4_0 file holds its output matrix as Q6_K)
    assert checked == 3 + output_in_type


@pytest.mark.parametrize("name", LLAMA_CPP_FILES)
def test_llama_cpp_files_match_transformers(name, firmwares, tmp_path):
    """Every common type as llama.cpp's quantizer writes it (its K-quant mixes and IQ4 included), and each
    MoE family as its converter writes it: the file packs, naming each type the image has no dtype for
    (dequantized to f32, exactly); on hosted and x86_64 bare metal the logits are the same bits, and they
    match transformers run on the file's dequantized weights within the f32 bound, with the same greedy
    tokens."""
    from colibri.oracle import checkpoint_logits
    from colibri.protocol import Sampling
    from colibri import flash
    src = FIXTURES / f"{name}.gguf"
    stored = Counter(gguf.GGMLQuantizationType(t.tensor_type).name for t in gguf.GGUFReader(str(src)).tensors)
    assert len(stored) >= 2  # llama.cpp keeps the norms in F32 and quantizes the rest
    image = tmp_path / "m.img"
    report = pack(src, image, 32, 64, measure_quality=False)
    assert report["converted"] == {t: n for t, n in stored.items() if t not in NATIVE}
    # the converter's files have GPT-2's 50,257-token vocabulary: every logits row is 200 KB over QEMU's
    # UART, so they run a shorter sequence ("Hello world," and three tokens)
    # (Gemma 4's: "<bos>the model on")
    prompt, new = ([1, 5, 9, 3, 60, 2, 33], 6) if name.startswith("mixtral-") else \
        ([2, 1437, 2028, 580], 3) if "gemma4" in name else ([15496, 995, 11], 3)
    runs = {board: flash.run_on_board(image, board, prompt, new, Sampling(), True, firmware=firmwares[board])
            for board in ("hosted", "x86_64_baremetal")}
    assert runs["hosted"].logits.tobytes() == runs["x86_64_baremetal"].logits.tobytes()
    tokens = runs["hosted"].tokens
    assert tokens == runs["x86_64_baremetal"].tokens
    hf = checkpoint_logits(src, prompt + tokens)
    scale = max(1.0, float(np.abs(hf).max()))
    assert float(np.abs(runs["hosted"].logits - hf).max()) <= 1e-4 * scale  # measured: 5-7e-7 of the scale
    assert tokens == [int(hf[len(prompt) - 1 + i].argmax()) for i in range(len(tokens))]


@pytest.mark.parametrize("name", CONVERTED)
def test_llama_cpp_itself_agrees(name, firmwares, tmp_path):
    """llama.cpp as a second oracle, independent of the packer's reading of the file: its own logits for a prompt on
    each converter file (kept beside it by tools/make_gguf_fixtures.py: llama-cpp-python 0.3.36 on an F32 copy of the
    file with an f32 KV cache; the 64 largest of each position and every n-th of the vocabulary) against the device's
    on the image packed from the file, every position. Bound: 1e-5 of the logits' scale (measured: 2.2e-7 to 2.5e-6);
    Gemma 4's 2e-3, llama.cpp's GELU being an f16 table (measured 3.1e-3 and 5.5e-3 at a scale of 6; with
    transformers' GELU rounded as that table, transformers and llama.cpp agree to 6e-5). Gemma 4's bound still parts
    the files' semantics: the dense file states no logit cap and llama.cpp caps it at 30 all the same; read uncapped,
    the logits differ from llama.cpp's by 0.08-0.10."""
    import hashlib
    from colibri import flash
    from colibri.protocol import Sampling
    src = FIXTURES / f"{name}.gguf"
    oracle = np.load(FIXTURES / f"{name}.llama-cpp.npz")
    assert str(oracle["sha256"]) == hashlib.sha256(src.read_bytes()).hexdigest()  # llama.cpp ran this very file
    assert str(oracle["llama_cpp"]) == "0.3.36"  # (the sdist the fixtures' converter comes from)
    try:  # where llama-cpp-python is installed, llama.cpp gives the kept logits again, bit for bit
        import llama_cpp  # noqa: F401
    except ImportError:
        pass
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
        from make_gguf_fixtures import llama_cpp_logits
        again = np.load(llama_cpp_logits(src, oracle["tokens"].tolist(), tmp_path, tmp_path / "again.npz"))
        assert again["logits"].tobytes() == oracle["logits"].tobytes()
    image = tmp_path / "m.img"
    pack(src, image, 32, 64, measure_quality=False)
    assert read_image(image.read_bytes()).dims.vocab_size == int(oracle["vocab"])
    tokens, columns, llama = oracle["tokens"].tolist(), oracle["columns"], oracle["logits"]
    run = flash.run_on_board(image, "hosted", tokens, 1, Sampling(), True, firmware=firmwares["hosted"])
    device = run.logits[:len(tokens), columns]
    bound = (2e-3 if "gemma4" in name else 1e-5) * float(np.abs(llama).max())
    assert float(np.abs(device - llama).max()) <= bound
    assert (device.argmax(-1) == llama.argmax(-1)).all()  # (the columns hold each position's 64 largest)
    if "gemma4" in name:
        cap = read_image(image.read_bytes()).dims.logit_softcap
        assert cap == 30.0  # (stated by the MoE file, llama.cpp's default for the dense one)
        assert float(np.abs(cap * np.arctanh(device / cap) - llama).max()) > 4 * bound


def test_converter_files_are_as_llama_cpp_writes_them():
    """What makes the converter's files worth testing apart from the project's writer: experts merged into
    one 3-D tensor per layer (dense LFM2's file has none), Qwen2-MoE's shared expert and its gate, a real tokenizer, the converter's q8_0."""
    names = {f: {t.name for t in gguf.GGUFReader(str(FIXTURES / f"{f}.gguf")).tensors} for f in CONVERTED}
    assert set(names) == {"converted-mixtral-q8_0", "converted-qwen2moe-q4_k_m", "converted-deepseek3-q8_0",
                          "converted-gpt-oss-q8_0", "converted-granitemoe-q8_0", "converted-granitemoeshared-q8_0",
                          "converted-glm4-q8_0",
                          "converted-lfm2moe-q8_0", "converted-lfm2-q8_0", "converted-qwen35moe-q8_0",
                          "converted-gemma4-q8_0", "converted-gemma4-dense-q8_0"}
    gemma = gguf.GGUFReader(str(FIXTURES / "converted-gemma4-q8_0.gguf"))  # KV heads per layer kind, keys as values
    assert list(gemma.fields["gemma4.attention.head_count_kv"].contents()) == [2, 2, 1]
    assert list(gemma.fields["gemma4.attention.sliding_window_pattern"].contents()) == [True, True, False]
    assert {"rope_freqs.weight", "blk.0.ffn_gate_up_exps.weight", "blk.0.ffn_down_exps.scale",
            "blk.0.ffn_gate_inp.scale", "blk.0.layer_output_scale.weight", "blk.0.attn_v.weight"} <= names[
        "converted-gemma4-q8_0"] and "blk.2.attn_v.weight" not in names["converted-gemma4-q8_0"]
    freqs = next(t for t in gemma.tensors if t.name == "rope_freqs.weight").data  # proportional RoPE: 1/4 turned
    assert freqs.tolist() == [1.0] * 4 + [np.float32(1e30)] * 12
    e2b = gguf.GGUFReader(str(FIXTURES / "converted-gemma4-dense-q8_0.gguf")).fields  # the doubled MLPs of the
    assert list(e2b["gemma4.feed_forward_length"].contents()) == [64, 64, 128, 128]  # layers sharing a KV cache
    assert e2b["gemma4.attention.shared_kv_layers"].contents() == 2
    assert {"per_layer_token_embd.weight", "per_layer_model_proj.weight", "blk.3.inp_gate.weight",
            "blk.3.proj.weight", "blk.3.post_norm.weight"} <= names["converted-gemma4-dense-q8_0"]
    assert not {"blk.2.attn_k.weight", "blk.3.attn_k.weight"} & names["converted-gemma4-dense-q8_0"]
    qwen35 = gguf.GGUFReader(str(FIXTURES / "converted-qwen35moe-q8_0.gguf")).fields  # its DeltaNets, its MTP layer
    assert list(qwen35["qwen35moe.attention.recurrent_layers"].contents()) == [True, True, True, False, False]
    assert qwen35["qwen35moe.nextn_predict_layers"].contents() == 1
    assert {"blk.0.ssm_a", "blk.0.ssm_dt.bias", "blk.0.attn_qkv.weight", "blk.0.attn_gate.weight",
            "blk.3.attn_q.weight", "blk.4.nextn.eh_proj.weight"} <= names["converted-qwen35moe-q8_0"]
    lfm2 = gguf.GGUFReader(str(FIXTURES / "converted-lfm2moe-q8_0.gguf"))  # a KV head count per layer, 0: it convolves
    assert list(lfm2.fields["lfm2moe.attention.head_count_kv"].contents()) == [0, 2, 0]
    assert {"blk.0.shortconv.conv.weight", "blk.0.shortconv.in_proj.weight", "blk.1.attn_q_norm.weight",
            "token_embd_norm.weight", "blk.1.exp_probs_b.bias"} <= names["converted-lfm2moe-q8_0"]
    assert next(t for t in lfm2.tensors if t.name == "blk.0.shortconv.conv.weight").shape.tolist() == [3, 32]
    dense = gguf.GGUFReader(str(FIXTURES / "converted-lfm2-q8_0.gguf")).fields  # the MLP as built: 2/3 of 144
    assert dense["lfm2.feed_forward_length"].contents() == 96
    assert list(dense["lfm2.attention.head_count_kv"].contents()) == [0, 2, 0]
    glm = gguf.GGUFReader(str(FIXTURES / "converted-glm4-q8_0.gguf")).fields  # GLM-4.7-Flash, as DeepSeek-V3's file
    assert bytes(glm["general.architecture"].parts[-1]).decode() == "deepseek2"
    assert {"blk.0.attn_k_b.weight", "blk.1.exp_probs_b.bias"} <= names["converted-glm4-q8_0"]
    granite = gguf.GGUFReader(str(FIXTURES / "converted-granitemoe-q8_0.gguf")).fields
    assert {"granitemoe.embedding_scale", "granitemoe.residual_scale", "granitemoe.attention.scale",
            "granitemoe.logit_scale"} <= set(granite)  # its multipliers, under llama.cpp's scale keys
    shared = gguf.GGUFReader(str(FIXTURES / "converted-granitemoeshared-q8_0.gguf"))  # GraniteMoeShared: granitemoe
    assert bytes(shared.fields["general.architecture"].parts[-1]).decode() == "granitemoe"  # with its shared MLP's
    assert shared.fields["granitemoe.expert_shared_feed_forward_length"].contents() == 64  # width, gate and up split
    assert {"blk.1.ffn_gate_shexp.weight", "blk.1.ffn_up_shexp.weight", "blk.1.ffn_down_shexp.weight"} <= names[
        "converted-granitemoeshared-q8_0"] and "granitemoe.expert_shared_feed_forward_length" not in granite
    assert {"blk.0.attn_sinks.weight", "blk.0.ffn_gate_exps.bias", "blk.0.ffn_gate_inp.bias"} <= names["converted-gpt-oss-q8_0"]
    oss = {t.name: gguf.GGMLQuantizationType(t.tensor_type).name
           for t in gguf.GGUFReader(str(FIXTURES / "converted-gpt-oss-q8_0.gguf")).tensors}
    assert oss["blk.1.ffn_gate_exps.weight"] == oss["blk.1.ffn_down_exps.weight"] == "MXFP4"  # repacked by the converter
    assert {"blk.0.attn_k_b.weight", "blk.0.attn_v_b.weight", "blk.1.exp_probs_b.bias"} <= names["converted-deepseek3-q8_0"]
    assert "blk.0.ffn_gate_exps.weight" not in names["converted-deepseek3-q8_0"]  # its first layer is dense
    for name, tensors in names.items():
        if name in ("converted-lfm2-q8_0", "converted-gemma4-dense-q8_0"):  # (dense)
            assert {"blk.0.ffn_gate.weight", "blk.1.attn_q.weight"} <= tensors
            assert not any("exps" in t for t in tensors) and "output.weight" not in tensors
            continue
        if name == "converted-gemma4-q8_0":  # (gate and up fused)
            assert {"blk.1.ffn_gate_up_exps.weight", "blk.1.ffn_down_exps.weight"} <= tensors
            continue
        moe = 1 if "blk.1.exp_probs_b.bias" in tensors else 0
        assert {f"blk.{moe}.ffn_gate_exps.weight", f"blk.{moe}.ffn_up_exps.weight", f"blk.{moe}.ffn_down_exps.weight"} <= tensors
        # tied embeddings, but where llama.cpp loads no file without its own output matrix
        assert ("output.weight" in tensors) == (name in ("converted-gpt-oss-q8_0", "converted-qwen2moe-q4_k_m"))
    assert {"blk.0.ffn_gate_shexp.weight", "blk.0.ffn_gate_inp_shexp.weight"} <= names["converted-qwen2moe-q4_k_m"]
    reader = gguf.GGUFReader(str(FIXTURES / "converted-mixtral-q8_0.gguf"))
    assert bytes(reader.fields["tokenizer.ggml.pre"].parts[-1]).decode() == "gpt-2"
    types = Counter(gguf.GGMLQuantizationType(t.tensor_type).name for t in reader.tensors)
    assert types["Q8_0"] >= 10 and set(types) <= {"Q8_0", "F32"}


def test_deepseek_gguf_lands_as_llama_cpp_split_it(tmp_path):
    """llama.cpp's converter splits kv_b_proj into attn_k_b (each head's W_UK transposed) and attn_v_b: the
    image's WK_B and WV_B, so packed to q8_0 their blocks land unchanged; the router bias, the groups (scored by
    their best two, as llama.cpp does), the scaling, the renormalization and the sigmoid arrive as DeepSeek-V3's."""
    from colibri.image import FLAG_ROPE_PAIRS, FLAG_ROUTER_BIAS, FLAG_ROUTER_SIGMOID, FLAG_SHARED_PLAIN
    src = FIXTURES / "converted-deepseek3-q8_0.gguf"
    pack(src, tmp_path / "q.img", 32, 64, dtype=DType.Q8_0, measure_quality=False)
    img = read_image((tmp_path / "q.img").read_bytes())
    d = img.dims
    assert (d.kv_lora_rank, d.q_lora_rank, d.rope_width, d.head_dim, d.v_dim) == (32, 32, 16, 48, 32)
    assert (d.n_group, d.topk_group, d.group_top, d.routed_scale, d.moe_layers) == (2, 1, 2, 2.5, (False, True))
    want = FLAG_ROUTER_SIGMOID | FLAG_ROUTER_BIAS | FLAG_NORM_TOPK | FLAG_SHARED_PLAIN | FLAG_ROPE_PAIRS
    assert d.flags & want == want
    stored = {t.name: t for t in open_gguf(src).tensors}  # (parsed once: read_gguf reuses it)
    for layer in (0, 1):
        for name, role in ((f"blk.{layer}.attn_k_b.weight", Role.WK_B), (f"blk.{layer}.attn_v_b.weight", Role.WV_B)):
            t = stored[name]
            raw = from_gguf_blocks(t.data, DType.Q8_0, tuple(int(n) for n in reversed(t.shape)))
            enc = img.encoded(role, layer)
            np.testing.assert_array_equal(enc.values, raw.values.reshape(enc.values.shape))
            np.testing.assert_array_equal(enc.scales.view(np.uint16), raw.scales.reshape(enc.scales.shape).view(np.uint16))
    np.testing.assert_array_equal(img.tensor(Role.ROUTER_BIAS, 1), np.asarray(stored["blk.1.exp_probs_b.bias"].data))


def test_granite_shared_gguf_lands_as_its_converter_split_it(tmp_path):
    """llama.cpp's converter writes GraniteMoeShared as granitemoe with the shared MLP's width, its fused gate and up
    split into ffn_gate_shexp and ffn_up_shexp: read as GraniteMoeShared, joined back, so packed to q8_0 their blocks
    land unchanged (the down is scaled by residual_multiplier); without the width the file is plain Granite-MoE's and
    the shared tensors are refused (test_a_granite_shared_file_that_disagrees_with_itself_is_one_line); one whose width
    is 0 and which has no shared tensors is Granite-MoE's too, as llama.cpp reads it."""
    from colibri.image import FLAG_SHARED_PLAIN
    src = FIXTURES / "converted-granitemoeshared-q8_0.gguf"
    cfg, _, _ = read_gguf(src)
    assert (cfg["architectures"], cfg["shared_intermediate_size"]) == (["GraniteMoeSharedForCausalLM"], 64)
    pack(src, tmp_path / "q.img", 32, 64, dtype=DType.Q8_0, measure_quality=False)
    img = read_image((tmp_path / "q.img").read_bytes())
    assert img.dims.shared_ffn_size == 64 and img.dims.flags & FLAG_SHARED_PLAIN
    stored = {t.name: t for t in open_gguf(src).tensors}
    for layer in (0, 1):
        for which, role in (("gate", Role.SHARED_GATE), ("up", Role.SHARED_UP)):
            t = stored[f"blk.{layer}.ffn_{which}_shexp.weight"]
            raw = from_gguf_blocks(t.data, DType.Q8_0, tuple(int(n) for n in reversed(t.shape)))
            enc = img.encoded(role, layer)
            np.testing.assert_array_equal(enc.values, raw.values)
            np.testing.assert_array_equal(enc.scales.view(np.uint16), raw.scales.view(np.uint16))
    zero = copy_gguf(src, tmp_path / "zero.gguf", {SHARED_WIDTH: (0, U32)}, NO_SHEXP)  # (llama.cpp: no shared MLP)
    assert read_gguf(zero)[0]["architectures"] == ["GraniteMoeForCausalLM"]
    pack(zero, tmp_path / "z.img", 32, 64, measure_quality=False)
    assert read_image((tmp_path / "z.img").read_bytes()).dims.shared_ffn_size == 0


def test_granite_shared_gate_and_up_are_each_read_once(monkeypatch):
    """The shared gate and up the converter split are joined back into input_linear, which the family cuts in two
    again: each half is its file tensor, read alone (once for the gate, once for the up), never both for either."""
    from colibri.checkpoint import load_checkpoint
    from colibri.image import NO_INDEX
    from colibri.lazy import FileTensor
    ckpt = load_checkpoint(FIXTURES / "converted-granitemoeshared-q8_0.gguf", 64)
    reads, load = Counter(), FileTensor.load
    monkeypatch.setattr(FileTensor, "load", lambda self: (reads.update([self.start]), load(self))[1])
    for role in (Role.SHARED_GATE, Role.SHARED_UP):
        loaded(ckpt.tensors[(role, 0, NO_INDEX)])
    assert len(reads) == 2 and set(reads.values()) == {1}


SHARED_WIDTH = "granitemoe.expert_shared_feed_forward_length"
U32, U64, F32, STR, BOOL, ARRAY = (gguf.GGUFValueType.UINT32, gguf.GGUFValueType.UINT64, gguf.GGUFValueType.FLOAT32,
                                   gguf.GGUFValueType.STRING, gguf.GGUFValueType.BOOL, gguf.GGUFValueType.ARRAY)
NO_SHEXP = {f"blk.{layer}.ffn_{w}_shexp.weight": None for layer in (0, 1) for w in ("gate", "up", "down")}


@pytest.mark.parametrize("fixture,changes,tensors,error", [
    # the width key: one whole number below 2^32, or refused by its name (never a traceback, never truncated)
    ("granitemoeshared", {SHARED_WIDTH: ([64, 64], ARRAY)}, {},
     r"^GGUF key granitemoe\.expert_shared_feed_forward_length=\[64, 64\]: one number was expected"),
    ("qwen2moe-q4_k_m", {"qwen2moe.expert_shared_feed_forward_length": ([64, 64], ARRAY)}, {},
     r"^GGUF key qwen2moe\.expert_shared_feed_forward_length=\[64, 64\]: one number was expected"),
    ("granitemoeshared", {SHARED_WIDTH: ("64", STR)}, {}, r"^GGUF key .*_length='64': one number was expected"),
    ("granitemoeshared", {SHARED_WIDTH: (64.5, F32)}, {}, r"^GGUF key .*_length=64\.5: one whole number from 0 to"),
    ("granitemoeshared", {SHARED_WIDTH: (True, BOOL)}, {}, r"^GGUF key .*_length=True: one number was expected"),
    ("granitemoeshared", {SHARED_WIDTH: (1 << 40, U64)}, {}, r"^GGUF key .*_length=1099511627776: one whole number"),
    ("granitemoeshared", {"granitemoe.block_count": (2.0, F32)}, {}, r"^GGUF key granitemoe\.block_count=2\.0: one"),
    ("granitemoeshared", {"granitemoe.expert_used_count": (2.5, F32)}, {}, r"expert_used_count=2\.5: one whole"),
    ("granitemoeshared", {"granitemoe.logit_scale": ("8", STR)}, {}, r"^GGUF key granitemoe\.logit_scale='8': one"),
    # the shared MLP's tensors without a width above 0: llama.cpp reads them only when n_ff_shexp > 0
    ("granitemoeshared", {SHARED_WIDTH: (0, U32)}, {},
     r"^GGUF tensors blk\.0\.ffn_gate_shexp\.weight, blk\.0\.ffn_up_shexp\.weight, blk\.0\.ffn_down_shexp\.weight "
     r"\.\.\.: a granitemoe shared MLP, which needs the key granitemoe\.expert_shared_feed_forward_length above 0 "
     r"\(the file's is 0\)$"),
    ("granitemoeshared", {SHARED_WIDTH: (None, None)}, {},
     r"^GGUF tensors blk\.0\.ffn_gate_shexp\.weight, .*: a granitemoe shared MLP, which needs the key "
     r"granitemoe\.expert_shared_feed_forward_length$"),
    ("granitemoe", {}, {"blk.1.ffn_down_shexp.weight": np.zeros((32, 64), np.float32)},
     r"^GGUF tensors blk\.1\.ffn_down_shexp\.weight: a granitemoe shared MLP, which needs the key granitemoe\."),
    # a width the tensors disagree with: each named with the keys that size it
    *[("granitemoeshared", {SHARED_WIDTH: (n, U32)}, {},
       rf"^GGUF tensor blk\.0\.ffn_gate_shexp\.weight has shape \(64, 32\); the keys granitemoe\.expert_shared_feed_"
       rf"forward_length={n} and granitemoe\.embedding_length=32 make it \({n}, 32\)$")
      for n in (32, 128, (1 << 32) - 1)],
    ("granitemoeshared", {}, {"blk.0.ffn_down_shexp.weight": np.zeros((32, 32), np.float32)},
     r"^GGUF tensor blk\.0\.ffn_down_shexp\.weight has shape \(32, 32\); the keys granitemoe\.expert_shared_feed_"
     r"forward_length=64 and granitemoe\.embedding_length=32 make it \(32, 64\)$"),
    ("granitemoeshared", {}, {"blk.0.ffn_gate_shexp.weight": np.zeros((32, 32), np.float32)},
     r"^GGUF tensor blk\.0\.ffn_gate_shexp\.weight has shape \(32, 32\);"),
    ("granitemoeshared", {}, {"blk.1.ffn_up_shexp.weight": np.zeros((64, 16), np.float32)},
     r"^GGUF tensor blk\.1\.ffn_up_shexp\.weight has shape \(64, 16\);"),
    # the width without its tensors, or a part of them
    ("granitemoeshared", {}, NO_SHEXP,
     r"^GGUF file lacks blk\.0\.ffn_gate_shexp\.weight, blk\.0\.ffn_up_shexp\.weight and blk\.0\.ffn_down_shexp\."
     r"weight: the key granitemoe\.expert_shared_feed_forward_length=64 gives every layer with experts a shared MLP"),
    ("granitemoeshared", {}, {"blk.1.ffn_up_shexp.weight": None},
     r"^GGUF file lacks blk\.1\.ffn_up_shexp\.weight: the key granitemoe\.expert_shared_feed_forward_length=64"),
    ("granitemoeshared", {}, {"blk.1.ffn_down_shexp.weight": None},
     r"^GGUF file lacks blk\.1\.ffn_down_shexp\.weight:"),
    # biases GraniteMoeSharedMLP has not: refused by their GGUF names
    ("granitemoeshared", {}, {"blk.0.ffn_gate_shexp.bias": np.zeros(64, np.float32)},
     r"^GGUF tensors the runtime would not use: blk\.0\.ffn_gate_shexp\.bias$"),
    ("granitemoeshared", {}, {"blk.1.ffn_down_shexp.bias": np.zeros(32, np.float32)},
     r"^GGUF tensors the runtime would not use: blk\.1\.ffn_down_shexp\.bias$"),
])
def test_a_granite_shared_file_that_disagrees_with_itself_is_one_line(fixture, changes, tensors, error, tmp_path):
    """GraniteMoeShared's file (llama.cpp's converter's) with its shared MLP's width key or tensors changed (review of
    418f921): the key of another type or out of range, the tensors without the key (or with it 0, where llama.cpp
    reads no shared MLP), a width or a tensor that disagrees, tensors missing, biases: each refused in one line
    naming the file's own keys and tensors, never transformers' names, never a traceback; a qwen2moe file's width key
    and other keys read as counts or scales alike."""
    bad = copy_gguf(FIXTURES / f"converted-{fixture}{'' if '-q' in fixture else '-q8_0'}.gguf", tmp_path / "bad.gguf",
                    changes, tensors)
    with pytest.raises(UnsupportedModel, match=error):
        pack(bad, tmp_path / "x.img", 32, 64, measure_quality=False)


def test_a_wrong_shaped_tensor_is_named_as_the_file_names_it(tmp_path):
    """A tensor of the wrong shape is refused by its llama.cpp name (a GGUF file's own), with no index where the
    tensor has none (not `WO layer=0 expert=4294967295`)."""
    bad = copy_gguf(FIXTURES / "converted-granitemoe-q8_0.gguf", tmp_path / "bad.gguf", {},
                    {"blk.0.attn_output.weight": np.zeros((32, 16), np.float32)})
    with pytest.raises(ValueError, match=r"^tensor blk\.0\.attn_output has shape \(32, 16\); the model's sizes make "
                                         r"it \(32, 32\)$"):
        pack(bad, tmp_path / "x.img", 32, 64, measure_quality=False)


@pytest.mark.parametrize("family,llama_cpp_norm", [("qwen3moe", True), ("qwen2moe_sparse_step", False),
                                                    ("olmoe_clip", False), ("lfm2moe_k4", True)])
def test_a_file_without_the_norm_key_runs_as_llama_cpp_runs_it(family, llama_cpp_norm, sources, tmp_path):
    """llama.cpp's converter writes no expert_weights_norm for these architectures (llama.cpp fixes it in
    code: build_moe_ffn's norm_w in src/models/<arch>.cpp), so a file as found renormalizes as llama.cpp
    does; --norm-topk-prob overrides it."""
    path = hf_to_gguf(sources[family], tmp_path / "nonorm.gguf", write_norm_key=False)
    for given, expected in ((None, llama_cpp_norm), (not llama_cpp_norm, not llama_cpp_norm)):
        pack(path, tmp_path / "x.img", 32, 64, norm_topk_prob=given, measure_quality=False)
        flags = read_image((tmp_path / "x.img").read_bytes()).dims.flags
        assert bool(flags & FLAG_NORM_TOPK) == expected, given


def test_an_lfm2moe_file_silent_on_its_router_runs_as_llama_cpp_runs_it(sources, tmp_path):
    """llama.cpp's converter writes neither expert_weights_norm nor expert_weights_scale for lfm2moe, and llama.cpp
    renormalizes and never scales (src/models/lfm2.cpp, lfm2moe.cpp): so does a file without them, whatever the
    checkpoint said (a routed scale of 1.7 here); keys that state them are read (tests/gguf_writer.py writes them:
    test_f32_gguf_packs_to_the_same_image). --norm-topk-prob is for such architectures only: a deepseek2 file states
    its renormalization (llama.cpp reads it), so the option is refused by name, never dropped."""
    silent = hf_to_gguf(sources["lfm2moe"], tmp_path / "m.gguf", write_norm_key=False)
    assert "lfm2moe.expert_weights_scale" not in gguf.GGUFReader(str(silent)).fields
    pack(silent, tmp_path / "m.img", 32, 64, measure_quality=False)
    d = read_image((tmp_path / "m.img").read_bytes()).dims
    assert d.routed_scale == 1.0 and d.flags & FLAG_NORM_TOPK
    deepseek = hf_to_gguf(sources["deepseek_v3"], tmp_path / "d.gguf")
    with pytest.raises(UnsupportedModel, match="--norm-topk-prob is for lfm2moe, olmoe, qwen2moe, qwen3moe files"):
        pack(deepseek, tmp_path / "x.img", 32, 64, norm_topk_prob=True, measure_quality=False)


def copy_gguf(src: Path, dst: Path, changes: dict, tensors: dict | None = None) -> Path:
    """A GGUF file's copy with some keys set anew (name -> (value, GGUFValueType); (None, None): left out), every tensor
    as stored but those `tensors` names (name -> f32 values, new or in place of the file's, or None: left out)."""
    reader = open_gguf(src)  # (parsed once per file: a vocabulary of 150,000 tokens takes seconds)
    arch = reader.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), arch)
    for name, fld in reader.fields.items():
        if not name.startswith("GGUF.") and name != "general.architecture" and name not in changes:
            w.add_key_value(name, fld.contents(), fld.types[0],
                            sub_type=fld.types[-1] if fld.types[0] == gguf.GGUFValueType.ARRAY else None)
    for name, (value, vtype) in changes.items():
        if value is None:  # (left out)
            continue
        sub = None if vtype != gguf.GGUFValueType.ARRAY else \
            gguf.GGUFValueType.BOOL if isinstance(value[0], bool) else gguf.GGUFValueType.INT32
        w.add_key_value(name, value, vtype, sub_type=sub)
    for t in reader.tensors:
        if t.name not in (tensors or {}):
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
        elif tensors[t.name] is not None:
            w.add_tensor(t.name, **_stored(tensors[t.name]))
    for name, values in (tensors or {}).items():  # (and those it had not)
        if values is not None and name not in {t.name for t in reader.tensors}:
            w.add_tensor(name, **_stored(values))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def _stored(values) -> dict:
    """add_tensor's arguments for f32 values, or for (raw bytes, GGMLQuantizationType)."""
    if isinstance(values, tuple):
        return {"tensor": values[0], "raw_dtype": values[1]}
    return {"tensor": np.asarray(values, np.float32)}


def test_fused_gate_up_experts_read_as_the_converter_fuses_them(tmp_path):
    """llama.cpp's converter with --fuse-gate-up-exps stores each layer's expert gates and ups as one tensor
    (conversion/base.py: torch.cat([gate, up], dim=1) as ffn_gate_up_exps), which llama.cpp's qwen35moe and gemma4 run
    as they are (its deepseek2 too, though the converter cannot write it): the qwen35moe fixture with its gates and ups
    so fused packs to the very image of the file as converted, its Q8_0 blocks carried."""
    src = FIXTURES / "converted-qwen35moe-q8_0.gguf"
    stored = {t.name: t for t in open_gguf(src).tensors}  # (parsed once: read_gguf reuses it)
    fused = {}
    for layer in range(4):
        gate, up = stored[f"blk.{layer}.ffn_gate_exps.weight"], stored[f"blk.{layer}.ffn_up_exps.weight"]
        assert gate.tensor_type == up.tensor_type == Q.Q8_0
        fused[f"blk.{layer}.ffn_gate_up_exps.weight"] = (np.concatenate([gate.data, up.data], axis=1), Q.Q8_0)
        fused[gate.name] = fused[up.name] = None
    copy = copy_gguf(src, tmp_path / "fused.gguf", {}, fused)
    assert "blk.0.ffn_gate_up_exps.weight" in {t.name for t in open_gguf(copy).tensors}
    (cfg_a, as_converted, _), (cfg_b, as_fused, _) = read_gguf(src), read_gguf(copy)
    assert cfg_a == cfg_b and set(as_converted) == set(as_fused)
    for name, t in as_converted.items():  # (the experts' rows as stored: Encoded blocks, bit for bit)
        a, b = loaded(t), loaded(as_fused[name])
        assert type(a) is type(b) and (a.values.tobytes() == b.values.tobytes() if isinstance(a, Encoded)
                                       else np.asarray(a).tobytes() == np.asarray(b).tobytes()), name
        assert not isinstance(a, Encoded) or a.scales.tobytes() == b.scales.tobytes()
    assert isinstance(loaded(as_fused["model.layers.0.mlp.experts.3.up_proj.weight"]), Encoded)
    odd = copy_gguf(src, tmp_path / "odd.gguf", {}, {**fused, "blk.0.ffn_gate_up_exps.weight": np.ones((4, 3, 32))})
    with pytest.raises(UnsupportedModel, match="ffn_gate_up_exps.weight has shape \\(4, 3, 32\\): llama.cpp stacks"):
        pack(odd, tmp_path / "c.img", 32, 64, measure_quality=False)


def test_a_bidirectional_file_is_refused(tmp_path):
    """llama.cpp's converter writes attention.causal false for LFM2's bidirectional embedding models (LFM2ColBertModel,
    Lfm2BidirectionalModel), and llama.cpp then attends both ways: not a model the runtime can run."""
    bi = copy_gguf(FIXTURES / "converted-lfm2-q8_0.gguf", tmp_path / "bi.gguf",
                   {"lfm2.attention.causal": (False, gguf.GGUFValueType.BOOL)})
    with pytest.raises(UnsupportedModel, match="lfm2.attention.causal=false: a bidirectional model"):
        pack(bi, tmp_path / "x.img", 32, 64, measure_quality=False)


@pytest.mark.parametrize("changes,error", [
    ({"qwen35moe.ssm.inner_size": (62, U32)}, "inner_size=62: the value heads' width"),
    ({"qwen35moe.attention.recurrent_layers": ([True, True], gguf.GGUFValueType.ARRAY)}, "a flag for each of the 5"),
    ({"qwen35moe.ssm.group_count": (3, U32)}, "group_count=3, qwen35moe.ssm.time_step_rank=4: the value heads are a whole"),
    ({"qwen35moe.ssm.state_size": (32, U32)}, "blk.0.attn_qkv.weight has shape \\(128, 32\\): the ssm keys make"),
    ({"qwen35moe.ssm.state_size": (1 << 31, U32)}, "state_size=2147483648: 1 to 65,535"),  # (no 64 GiB order first)
    ({"qwen35moe.ssm.inner_size": ("64", gguf.GGUFValueType.STRING)}, "inner_size='64': one whole number"),
    ({"qwen35moe.rope.dimension_sections": ([2, 1, 1, 1], gguf.GGUFValueType.ARRAY)}, "a fourth section"),
    ({"qwen35moe.attention.key_length": (1, U32)}, "key_length: a head of 1 dims"),
])
def test_a_qwen35moe_file_that_disagrees_with_itself_is_one_line(changes, error, tmp_path):
    """Keys of a qwen35moe file (the converter's fixture) changed so that they no longer fit together or the tensors:
    refused with the key or the tensor named, never a numpy error."""
    bad = copy_gguf(FIXTURES / "converted-qwen35moe-q8_0.gguf", tmp_path / "bad.gguf", changes)
    with pytest.raises(UnsupportedModel, match=error):
        pack(bad, tmp_path / "x.img", 32, 64, measure_quality=False)


UNTURNED = float(np.float32(1e30))


@pytest.mark.parametrize("fixture,changes,tensors,error", [
    ("gemma4", {"gemma4.attention.sliding_window_pattern": ([True, False], ARRAY)}, {}, "a flag for each of the 3"),
    ("gemma4", {"gemma4.attention.head_count_kv": ([2, 1, 1], ARRAY)}, {}, "one KV head count for each layer kind"),
    ("gemma4", {"gemma4.attention.head_count_kv": ([3, 3, 1], ARRAY)}, {}, "dividing the 4 heads"),
    ("gemma4", {"gemma4.attention.head_count_kv": ([2, 2], ARRAY)}, {}, "lists 2 values: one whole number per block"),
    ("gemma4", {"gemma4.attention.key_length_swa": (15, U32)}, {}, "one even head size for keys and values \\(15\\)"),
    ("gemma4", {"gemma4.rope.dimension_count": (16, U32)}, {}, "rope.dimension_count: Gemma 4's full layers"),
    ("gemma4", {"gemma4.attention.value_length": (16, U32)}, {}, "value_length, gemma4.rope.dimension_count"),
    ("gemma4", {}, {"rope_freqs.weight": None}, "lacks tensor rope_freqs.weight"),
    ("gemma4", {}, {"rope_freqs.weight": [1.0] * 3 + [UNTURNED] * 12}, "rope_freqs.weight has shape \\(15,\\)"),
    ("gemma4", {}, {"rope_freqs.weight": [1.0, 1.0, UNTURNED, 1.0] + [UNTURNED] * 12}, "factors other than"),
    ("gemma4", {}, {"rope_freqs.weight": [0.5] * 16}, "factors other than"),
    ("gemma4", {}, {"blk.0.attn_v.weight": None}, "sliding layers each have attn_v"),
    ("gemma4", {}, {"blk.1.ffn_gate_inp.weight": None}, "routes every layer or none"),
    ("gemma4", {}, {"blk.1.ffn_gate_inp.bias": np.zeros(4)}, "tensors the runtime would not use: blk.1.ffn_gate_inp"),
    ("gemma4", {"gemma4.attention.sliding_window_pattern": ([True, False, True], ARRAY)}, {}, "last layer attends"),
    ("gemma4", {"gemma4.rope.scaling.type": ("linear", STR), "gemma4.rope.scaling.factor": (8.0, F32)}, {},
     "rope.scaling.type='linear': Gemma 4's RoPE is not scaled"),
    ("gemma4", {f"gemma4.{key}": (1 << 31, U32) for key in ("attention.key_length_swa", "attention.value_length_swa",
                                                            "rope.dimension_count_swa")}, {},
     "blk.0.attn_q.weight has 64 rows"),  # (before anything is sized by the head)
    ("gemma4", {"gemma4.attention.key_length": (8, U32)}, {}, "attention.key_length, gemma4.attention.value_length"),
    ("gemma4", {"gemma4.final_logit_softcapping": (True, BOOL)}, {}, "softcapping=True: one number was expected"),
    ("gemma4", {"gemma4.final_logit_softcapping": (float("nan"), F32)}, {}, "a finite number"),
    ("gemma4", {"gemma4.rope.freq_base": (0.0, F32)}, {}, "RoPE bases above 0"),
    ("gemma4", {"gemma4.feed_forward_length": ([0, 0, 0], ARRAY)}, {}, "one MLP width"),
    ("gemma4-dense", {"gemma4.attention.shared_kv_layers": (4, U32)}, {}, "shared_kv_layers=4: fewer than the 4"),
    ("gemma4-dense", {"gemma4.feed_forward_length": ([64, 128, 128, 128], ARRAY)}, {}, "one MLP width, or twice"),
    ("gemma4-dense", {"gemma4.feed_forward_length": ([64, 64, 96, 96], ARRAY)}, {}, "one MLP width, or twice"),
    ("lfm2moe", {"lfm2moe.attention.head_count_kv": ([0, 2, 1], ARRAY)}, {}, "each 0 \\(the layer convolves\\)"),
    ("mixtral", {"llama.attention.head_count_kv": ([2, 2], ARRAY)}, {}, "which the llama architecture does not have"),
    ("mixtral", {"llama.feed_forward_length": ([32, 32], ARRAY)}, {}, "which the llama architecture does not have"),
])
def test_a_file_with_per_layer_keys_that_disagree_is_one_line(fixture, changes, tensors, error, tmp_path):
    """Gemma 4's file (the converter's fixtures) with its per-layer keys, head sizes, RoPE, cap or tensors changed so
    that they no longer describe a Gemma 4 model, or describe one llama.cpp would run otherwise than transformers (a
    sliding last layer, scaled RoPE): refused with the key or tensor named, a huge head size before anything is sized
    by it; and a value per layer for an architecture that has none, or LFM2's KV heads of two counts, likewise."""
    import time
    bad = copy_gguf(FIXTURES / f"converted-{fixture}-q8_0.gguf", tmp_path / "bad.gguf", changes, tensors)
    t0 = time.monotonic()
    with pytest.raises(UnsupportedModel, match=error):
        pack(bad, tmp_path / "x.img", 32, 64, measure_quality=False)
    assert time.monotonic() - t0 < 20


def test_gemma4_gguf_lands_as_its_converter_wrote_it(tmp_path):
    """A gemma4 file read as the Gemma 4 model its converter was given: the global layers' own head size, KV head and
    proportional RoPE (a quarter turned, from rope_freqs), keys as values; the experts' Q8_0 blocks (gate and up
    fused in one tensor) and every other Q8_0 matrix carried into a q8_0 image unchanged; the small dense model's
    KV sharing, doubled MLPs and per-layer inputs."""
    from colibri.image import FLAG_GEMMA4_LAYER
    src = FIXTURES / "converted-gemma4-q8_0.gguf"
    pack(src, tmp_path / "q.img", 32, 64, dtype=DType.Q8_0, measure_quality=False)
    img = read_image((tmp_path / "q.img").read_bytes())
    d = img.dims
    assert d.flags & FLAG_GEMMA4_LAYER and (d.head_dim, d.global_head_dim, d.global_kv_heads) == (16, 32, 1)
    assert d.k_eq_v and d.sliding_window == 4 and d.n_experts == 4 and d.logit_softcap == 30.0
    reader = gguf.GGUFReader(str(src))
    raw = {t.name: from_gguf_blocks(t.data, DType.Q8_0, tuple(int(n) for n in reversed(t.shape)))
           for t in reader.tensors if t.tensor_type == Q.Q8_0}
    for e in range(4):
        gate_up = raw["blk.1.ffn_gate_up_exps.weight"][e]
        for role, rows in ((Role.EXPERT_GATE, slice(0, 32)), (Role.EXPERT_UP, slice(32, 64))):
            stored = img.encoded(role, 1, e)
            np.testing.assert_array_equal(stored.values, gate_up.values[rows])
            np.testing.assert_array_equal(stored.scales.view(np.uint16), gate_up.scales[rows].view(np.uint16))
        np.testing.assert_array_equal(img.encoded(Role.EXPERT_DOWN, 1, e).values,
                                      raw["blk.1.ffn_down_exps.weight"][e].values)
    np.testing.assert_array_equal(img.encoded(Role.WK, 2).values, raw["blk.2.attn_k.weight"].values)
    # keys the file may leave out, taken as llama.cpp takes them: the sliding RoPE base 10,000 (as the fixture states)
    silent = copy_gguf(src, tmp_path / "silent.gguf", {"gemma4.rope.freq_base_swa": (None, None)})
    pack(silent, tmp_path / "s.img", 32, 64, dtype=DType.Q8_0, measure_quality=False)
    assert (tmp_path / "s.img").read_bytes() == (tmp_path / "q.img").read_bytes()
    dense = tmp_path / "d.img"
    pack(FIXTURES / "converted-gemma4-dense-q8_0.gguf", dense, 32, 64, measure_quality=False)
    s = read_image(dense.read_bytes()).dims
    assert [s.kv_source(layer) for layer in range(4)] == [0, 1, 0, 1] and s.ple_dim == 8
    assert [s.layer_dense_ffn(layer) for layer in range(4)] == [64, 64, 128, 128] and s.n_experts == 0


def test_gguf_errors_are_clear(sources, tmp_path):
    (tmp_path / "junk.gguf").write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(UnsupportedModel, match="not a readable GGUF"):
        pack(tmp_path / "junk.gguf", tmp_path / "y.img", 32, 64)


def _write_gguf(path, arch: str, tensors: dict, block_count: int | None = None, head_count=2):
    w = gguf.GGUFWriter(str(path), arch)
    if block_count is not None:
        w.add_block_count(block_count)
        if isinstance(head_count, list):
            w.add_array(f"{arch}.attention.head_count", head_count)
        else:
            w.add_head_count(head_count)
    for name, (arr, qtype) in tensors.items():
        w.add_tensor(name, arr, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unknown_type_and_missing_key_are_named(tmp_path):
    a = np.zeros((4, 64), np.float32)
    raw = np.zeros((4, 64 // 32 * gguf.GGML_QUANT_SIZES[Q.Q8_1][1]), np.uint8)
    q81 = _write_gguf(tmp_path / "q81.gguf", "qwen2", {"token_embd.weight": (raw, Q.Q8_1)}, 1)
    with pytest.raises(UnsupportedModel, match="token_embd.weight has type Q8_1, which the gguf package cannot"):
        pack(q81, tmp_path / "x.img", 32, 64)
    other = _write_gguf(tmp_path / "arch.gguf", "gemma3", {"token_embd.weight": (a, None)}, 1)
    with pytest.raises(UnsupportedModel, match="architecture 'gemma3' is not supported"):
        pack(other, tmp_path / "x.img", 32, 64)
    bare = _write_gguf(tmp_path / "bare.gguf", "mamba2", {"token_embd.weight": (a, None)})  # no key of its own
    with pytest.raises(UnsupportedModel, match="architecture 'mamba2' is not supported"):
        pack(bare, tmp_path / "x.img", 32, 64)
    nokey = _write_gguf(tmp_path / "nokey.gguf", "qwen2", {"token_embd.weight": (a, None)})
    with pytest.raises(UnsupportedModel, match="lacks required key qwen2.block_count"):
        pack(nokey, tmp_path / "y.img", 32, 64)


def test_glm_gguf_packs_to_the_image_of_its_checkpoint(tmp_path):
    """GLM-4.7-Flash as llama.cpp writes it, a deepseek2 file (read as DeepSeek-V3: the same computation), packs to
    the bytes its Hugging Face checkpoint packs to, its dense layers first as such a file holds them; one with a
    dense layer between MoE layers has no deepseek2 file."""
    glm = next(cfg for name, _, cfg in FAMILIES if name == "glm4_moe_lite")
    cfg = dict(glm, mlp_layer_types=["dense", "sparse", "sparse", "sparse"])
    src = make_family_checkpoint("Glm4MoeLiteForCausalLM", cfg, 41, tmp_path / "glm")
    from_st, from_gguf = tmp_path / "st.img", tmp_path / "gguf.img"
    pack(src, from_st, 32, 64)
    pack(hf_to_gguf(src, tmp_path / "m.gguf"), from_gguf, 32, 64)
    assert from_gguf.read_bytes() == from_st.read_bytes()
    interleaved = make_family_checkpoint("Glm4MoeLiteForCausalLM", glm, 42, tmp_path / "glm2")
    with pytest.raises(ValueError, match="dense layers first only"):
        hf_to_gguf(interleaved, tmp_path / "m2.gguf")


@pytest.mark.parametrize("layers,vocab,sigmoid", [(47, 154880, True), (48, 154880, True), (46, 154880, False),
                                                  (47, 50257, False)])
def test_a_deepseek2_file_naming_no_gating_is_scored_as_llama_cpp_scores_it(layers, vocab, sigmoid):
    """llama.cpp's converter writes GLM-4.7-Flash with no gating function, and llama.cpp (src/models/deepseek2.cpp)
    scores such a file by sigmoid when it has GLM-4.7-Flash's layer count (47, or 48 with its MTP layer) and
    vocabulary, else by softmax: read the same way (a router bias without sigmoid is refused, as before)."""
    from types import SimpleNamespace

    from colibri.families.deepseek import gguf_config
    from colibri.gguf_common import GGUFError, GGUFFile
    keys = {"deepseek2.rope.dimension_count": 4, "deepseek2.attention.key_length_mla": 8,
            "deepseek2.attention.value_length_mla": 4, "deepseek2.attention.kv_lora_rank": 8,
            "deepseek2.leading_dense_block_count": 1, "deepseek2.expert_count": 4, "deepseek2.expert_used_count": 2,
            "deepseek2.expert_feed_forward_length": 8}
    def field(key, default=None, required=True):
        if key not in keys and required and default is None:
            raise GGUFError(f"GGUF file lacks required key {key}")
        return keys.get(key, default)
    tensors = {"token_embd.weight": SimpleNamespace(shape=(vocab, 16)), "blk.1.exp_probs_b.bias": SimpleNamespace(shape=(4,))}
    f = GGUFFile(field, lambda key: key.format(arch="deepseek2"), layers, 2, 1, 4, tensors)
    if sigmoid:
        assert gguf_config(f)["architectures"] == ["DeepseekV3ForCausalLM"]
    else:
        with pytest.raises(GGUFError, match="no sigmoid gating function"):
            gguf_config(f)


@pytest.mark.parametrize("block_count,head_count,error", [
    (1 << 31, 2, "an image has 1 to 256 layers"),  # refused before any loop over the layers
    (0, 2, "an image has 1 to 256 layers"),
    (2, 0, "at least one head"),
    (2, [2, 2], "head_count=\\[2, 2\\]: one number was expected"),  # a value per layer
])
def test_hostile_gguf_counts_are_named(tmp_path, block_count, head_count, error):
    """A GGUF file's counts are checked before they are used: a huge block count costs no time, a zero or a list a
    one-line error naming the key, never a traceback (review of the GGUF hooks)."""
    import time
    a = np.zeros((4, 64), np.float32)
    path = _write_gguf(tmp_path / "c.gguf", "qwen2", {"token_embd.weight": (a, None)}, block_count, head_count)
    t0 = time.monotonic()
    with pytest.raises(UnsupportedModel, match=error):
        pack(path, tmp_path / "x.img", 32, 64)
    assert time.monotonic() - t0 < 10


def test_the_writer_refuses_a_source_whose_bytes_are_not_its_shapes(tmp_path):
    """A tensor source that declared one shape and gives the values of another is refused when its bytes are
    written, never written over the next tensor (review of the GGUF hooks: a gpt-oss down matrix of another width)."""
    from colibri import image as im
    from colibri.quant import Deferred, DType
    from colibri.synthetic import moe_dims
    dims = moe_dims(hidden=8, ffn=4, experts=2, layers=1, top_k=1, vocab=16, max_seq=8)
    tensors = {}
    for role, layer, expert in im.canonical_order(dims):
        if dims.present(role, layer):
            shape = im.expected_shape(dims, role, layer)
            tensors[(role, layer, expert)] = np.ones(shape, np.float32)
    key = (im.Role.EXPERT_DOWN, 0, 1)
    wide = tensors[key].shape[:-1] + (tensors[key].shape[-1] + 2,)
    tensors[key] = Deferred(DType.F32, tensors[key].shape, lambda: np.ones(wide, np.float32))
    with pytest.raises(ValueError, match="EXPERT_DOWN layer=0 expert=1: .* bytes of values where its shape"):
        im.write_image(tmp_path / "x.img", dims, tensors, expert_align=64)


def test_a_files_multi_token_prediction_layers_are_not_read(tmp_path):
    """GLM-4.7-Flash's and DeepSeek-V3's files hold their MTP layers as blocks after the model's
    (nextn_predict_layers): llama.cpp runs the trunk alone to predict the next token, and the file packs to the image
    of the checkpoint without them."""
    glm = next(cfg for name, _, cfg in FAMILIES if name == "glm4_moe_lite")
    cfg = dict(glm, mlp_layer_types=["dense", "sparse", "sparse", "sparse"])
    src = make_family_checkpoint("Glm4MoeLiteForCausalLM", cfg, 43, tmp_path / "glm")
    mtp = {"blk.4.nextn.eh_proj.weight": np.ones((cfg["hidden_size"], 2 * cfg["hidden_size"]), np.float32),
           "blk.4.attn_norm.weight": np.ones(cfg["hidden_size"], np.float32)}
    from_st, from_gguf = tmp_path / "st.img", tmp_path / "gguf.img"
    pack(src, from_st, 32, 64)
    pack(hf_to_gguf(src, tmp_path / "m.gguf", extra=mtp, mtp_layers=1), from_gguf, 32, 64)
    assert from_gguf.read_bytes() == from_st.read_bytes()


@pytest.mark.parametrize("hk,hv,width,before", [(16, 32, 2, 0), (3, 6, 2, 5), (2, 6, 1, 0), (2, 4, 3, 4)])
def test_the_value_heads_go_back_as_the_converter_tiled_them(hk, hv, width, before):
    """qwen35.py puts back what conversion/qwen.py's _reorder_v_heads did (tests/gguf_writer.py's copy of it), for
    head counts whose tiling is not its own inverse (Qwen3.5-35B-A3B's 16 and 32; the test models' 2 and 4 are), on
    rows of f32 and of Q8_0/Q4_0 blocks (which move whole) and on columns."""
    from gguf_writer import reorder_v_heads
    from colibri.families.qwen35 import grouped, tiled_order
    from colibri.quant import encode
    rng = np.random.default_rng(hk * 100 + hv)
    rows = rng.standard_normal((before + hv * width, 64)).astype(np.float32)
    tiled = np.concatenate([rows[:before], reorder_v_heads(rows[before:], 0, hk, hv, width)])
    assert not np.array_equal(tiled, rows)
    back = grouped(tiled_order(hk, hv, width, before))
    np.testing.assert_array_equal(back(tiled), rows)
    for dtype in (DType.Q8_0, DType.Q4_0):
        restored = back(encode(tiled, dtype))
        assert isinstance(restored, Encoded)  # the blocks as stored
        np.testing.assert_array_equal(restored.decode(), encode(rows, dtype).decode())
    cols = np.ascontiguousarray(rows[before:].T)
    np.testing.assert_array_equal(grouped(tiled_order(hk, hv, width))(reorder_v_heads(cols, 1, hk, hv, width), 1), cols)
