"""The packer: faithful images from sharded or single checkpoints, refusals that name the field."""
from __future__ import annotations

import json

import gguf
import numpy as np
import pytest

from capi import Lib
from conftest import CONFIGS, ROOT, make_checkpoint
from colibri import pack as pack_cli
from colibri.checkpoint import UnsupportedModel
from colibri.image import NO_INDEX, Role, read_image
from colibri.pack import pack


def test_sharded_checkpoint_packs_identically(checkpoints, tmp_path):
    cfg = CONFIGS[0]
    sharded = make_checkpoint(cfg, tmp_path / "sharded", max_shard_size="20KB")
    assert (sharded / "model.safetensors.index.json").exists()
    pack(sharded, tmp_path / "a.img", 48, 64)
    pack(checkpoints[cfg.name], tmp_path / "b.img", 48, 64)
    assert (tmp_path / "a.img").read_bytes() == (tmp_path / "b.img").read_bytes()


def test_tied_embeddings_share_bytes(images):
    img = read_image(images["top3_gqa4_tied"].read_bytes())
    embd = [e for e in img.entries if e.role == Role.TOKEN_EMBD][0]
    head = [e for e in img.entries if e.role == Role.LM_HEAD][0]
    assert (embd.offset, embd.nbytes) == (head.offset, head.nbytes)


def test_layout_promises(images, hosted_build):
    for path in images.values():
        img = read_image(path.read_bytes())
        assert all(e.offset % 64 == 0 for e in img.entries)
        # the packer's plan against the runtime's own (an independent implementation, in C)
        status, info = Lib(ROOT / "build" / "hosted" / "release" / "libcolibri.so").verify(path.read_bytes())
        assert status == 0 and img.header["arena_bytes"] == info.arena_bytes
        for layer in range(img.dims.n_layers):
            for expert in range(img.dims.n_experts):
                g, u, d = [next(e for e in img.entries if (e.role, e.layer, e.expert) == (r, layer, expert))
                           for r in (Role.EXPERT_GATE, Role.EXPERT_UP, Role.EXPERT_DOWN)]
                assert u.offset == (g.offset + g.nbytes + 63) // 64 * 64
                assert d.offset == (u.offset + u.nbytes + 63) // 64 * 64


def test_expert_align_pages(checkpoints, images, tmp_path):
    pack(checkpoints["base"], tmp_path / "p.img", 48, 4096)
    paged = read_image((tmp_path / "p.img").read_bytes())
    assert all(e.offset % 4096 == 0 for e in paged.entries if e.role == Role.EXPERT_GATE)
    packed = read_image(images["base"].read_bytes())
    for e in packed.entries:  # same tensors, only placed differently
        np.testing.assert_array_equal(paged.tensor(e.role, e.layer, e.expert), packed.tensor(e.role, e.layer, e.expert))


def _edit_config(src, dst, **changes):
    import shutil
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


REFUSALS = [
    ({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}, "architectures"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}}, "rope_parameters.rope_type"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_scaling"),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e6, "factor": 2.0, "partial_rotary_factor": 0.5}},
     "rope_parameters"),
    ({"sliding_window": -3}, "sliding_window"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"max_position_embeddings": 32}, "max_position_embeddings"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
    ({"clip_qkv": -1.0}, "clip_qkv"),
    ({"clip_qkv": 8.0}, "clip_qkv"),  # Mixtral: transformers clamps only in OLMoE
    ({"rms_norm_eps": 0.0}, "rms_norm_eps"),
    ({"num_local_experts": 2048, "num_experts_per_tok": 2}, "num_local_experts"),
    ({"num_experts_per_tok": 65, "num_local_experts": 100}, "num_experts_per_tok"),
    ({"residual_multiplier": 0.5}, "residual_multiplier"),  # Granite's: Mixtral does not read it
]


@pytest.mark.parametrize("changes,field", REFUSALS, ids=[r[1] for r in REFUSALS])
def test_refuses_what_it_cannot_run(checkpoints, tmp_path, changes, field):
    ckpt = _edit_config(checkpoints["base"], tmp_path / "edited", **changes)
    with pytest.raises(UnsupportedModel, match=field.split(".")[0]):
        pack(ckpt, tmp_path / "x.img", 48, 64)


def test_sliding_window_beyond_max_seq_is_fine(checkpoints, tmp_path):
    """A window at least as long as the image's max_seq never leaves a position out: plain attention, a full
    KV cache. A shorter one windows every Mixtral layer and shrinks each layer's cache to the window."""
    ckpt = _edit_config(checkpoints["base"], tmp_path / "sw", sliding_window=4096)
    pack(ckpt, tmp_path / "x.img", 48, 64)
    assert read_image((tmp_path / "x.img").read_bytes()).dims.sliding_window == 0
    short = _edit_config(checkpoints["base"], tmp_path / "sw16", sliding_window=16)
    pack(short, tmp_path / "y.img", 48, 64)
    dims = read_image((tmp_path / "y.img").read_bytes()).dims
    assert dims.sliding_window == 16 and all(dims.window_layers)
    plain = read_image((tmp_path / "x.img").read_bytes())
    kv_saved = 2 * 4 * dims.n_layers * (48 - 16) * dims.kv_dim  # k and v, f32, (max_seq - W) rows per layer
    assert plain.header["arena_bytes"] - read_image((tmp_path / "y.img").read_bytes()).header["arena_bytes"] == kv_saved


def test_unknown_tensor_refused(checkpoints, tmp_path):
    import shutil
    from safetensors.numpy import load_file, save_file
    dst = tmp_path / "extra"
    shutil.copytree(checkpoints["base"], dst)
    tensors = load_file(dst / "model.safetensors")
    tensors["model.layers.0.self_attn.q_proj.bias"] = np.zeros(24, np.float32)
    save_file(tensors, dst / "model.safetensors")
    with pytest.raises(UnsupportedModel, match="q_proj.bias"):
        pack(dst, tmp_path / "x.img", 48, 64)


def test_cli_report_and_errors(checkpoints, tmp_path, capsys):
    assert pack_cli.main([str(checkpoints["base"]), "-o", str(tmp_path / "m.img"), "--max-seq", "32"]) == 0
    out = capsys.readouterr().out
    assert "parameters" in out and "arena" in out and "active per token" in out
    assert pack_cli.main([str(tmp_path), "-o", str(tmp_path / "m.img")]) == 2
    assert "config.json" in capsys.readouterr().err


def test_board_fit_is_checked(checkpoints, tmp_path, capsys):
    from colibri.sim.boards import Board, fit_report
    tight = Board("tight", {"memory": {"image": {"origin": 0, "bytes": 50_000}, "arena": {"origin": 0, "bytes": 1_000_000}}})
    ok, lines = fit_report(tight, 72_000, 9_000)
    assert not ok and "22,000 bytes over" in "\n".join(lines)
    assert fit_report(tight, 50_000, 9_000)[0]
    assert pack_cli.main([str(checkpoints["base"]), "-o", str(tmp_path / "m.img"), "--board", "x86_64_baremetal"]) == 0
    assert "x86_64_baremetal arena" in capsys.readouterr().out


def test_dtype_choice_keep_globs_and_what_stays_f32(checkpoints, tmp_path):
    """--dtype narrows the large matrices; --keep keeps matches wider (first match wins); norms, biases and
    routers stay f32 whatever is asked."""
    from colibri.pack import parse_keep
    from colibri.quant import DType
    keep = [parse_keep("output"), parse_keep("blk.0.*=f16")]
    pack(checkpoints["base"], tmp_path / "m.img", 48, 64, dtype=DType.Q4_0, keep=keep, measure_quality=False)
    img = read_image((tmp_path / "m.img").read_bytes())
    dtype = {(e.role, e.layer, e.expert): DType(e.dtype) for e in img.entries if e.shape}
    assert dtype[(Role.TOKEN_EMBD, NO_INDEX, NO_INDEX)] == DType.Q4_0
    assert dtype[(Role.LM_HEAD, NO_INDEX, NO_INDEX)] == DType.F32
    assert dtype[(Role.WQ, 0, NO_INDEX)] == DType.F16 and dtype[(Role.EXPERT_DOWN, 0, 3)] == DType.F16
    assert dtype[(Role.WQ, 1, NO_INDEX)] == DType.Q4_0 and dtype[(Role.EXPERT_DOWN, 1, 3)] == DType.Q4_0
    for role in (Role.ROUTER, Role.ATTN_NORM, Role.FFN_NORM):
        assert dtype[(role, 0, NO_INDEX)] == DType.F32 and dtype[(role, 1, NO_INDEX)] == DType.F32
    assert dtype[(Role.ROPE_COS, NO_INDEX, NO_INDEX)] == DType.F32
    with pytest.raises(ValueError, match="unknown dtype"):
        parse_keep("output=q3_k")


@pytest.mark.parametrize("glob,said", [
    ("blk.*.ffn_gate_inp=q8_0", "matches only tensors every image keeps f32 (norms, biases, routers: blk.0.ffn_gate_inp"),
    ("blk.*.atn_q", "matches no tensor of this model; names are llama.cpp's, such as token_embd"),
])
def test_a_keep_glob_that_chooses_nothing_is_refused(checkpoints, tmp_path, capsys, glob, said):
    """A --keep glob matching only f32-always tensors (a router) or nothing (a typo) is a one-line error before
    anything is written, where the pack went on as if it had not been given (review of issue 34)."""
    out = tmp_path / "m.img"
    assert pack_cli.main([str(checkpoints["base"]), "-o", str(out), "--dtype", "q8_0", "--keep", glob]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not out.exists() and not out.with_name("m.img.part").exists()


@pytest.mark.parametrize("dtype", ["f16", "bf16", "q8_0", "q4_0"])
def test_narrow_images_keep_their_values(checkpoints, tmp_path, dtype):
    """Each dtype stores what its definition says: f16/bf16 round to nearest, Q8_0/Q4_0 are GGUF's
    quantizers; the decoded values are within the format's rounding of the f32 weights."""
    from colibri.quant import DType
    pack(checkpoints["base"], tmp_path / "f32.img", 48, 64)
    pack(checkpoints["base"], tmp_path / "n.img", 48, 64, dtype=DType.parse(dtype), measure_quality=False)
    f32, narrow = read_image((tmp_path / "f32.img").read_bytes()), read_image((tmp_path / "n.img").read_bytes())
    w, got = f32.tensor(Role.EXPERT_UP, 1, 2), narrow.tensor(Role.EXPERT_UP, 1, 2)
    step = {"f16": 2.0 ** -11, "bf16": 2.0 ** -8}.get(dtype)
    if step:  # relative rounding of a float format (w is far from f16's subnormal range here)
        assert np.all(np.abs(got - w) <= np.abs(w) * step)
    else:
        amax = np.abs(w).max(axis=1, keepdims=True)  # one block per row: hidden 24 < 32
        # half a step of d = amax/127 (Q8_0) or a step of amax/8 (Q4_0), plus d's own f16 rounding times the level
        step, factor = (amax / 127, 0.5 + 127 * 2.0 ** -11) if dtype == "q8_0" else (amax / 8, 1.0 + 8 * 2.0 ** -11)
        assert np.all(np.abs(got - w) <= step * factor * 1.0001)
    assert not np.array_equal(got, w)


def test_cli_reports_sizes_by_dtype_and_quality(checkpoints, tmp_path, capsys):
    assert pack_cli.main([str(checkpoints["base"]), "-o", str(tmp_path / "m.img"), "--max-seq", "32"]) == 0
    assert "quality" not in capsys.readouterr().out  # nothing narrowed: nothing to measure
    kl = {}
    for dtype in ("q8_0", "q4_0"):
        assert pack_cli.main([str(checkpoints["base"]), "-o", str(tmp_path / f"{dtype}.img"), "--max-seq", "32",
                              "--dtype", dtype, "--kv", "f16"]) == 0
        out = capsys.readouterr().out
        assert f"{dtype} " in out and "f32 KV" not in out and "f16 KV cache" in out
        line = next(x for x in out.splitlines() if "quality" in x)
        kl[dtype] = float(line.split("KL ")[1].split(",")[0])
        assert "top-1 agreement" in line and "32 calibration tokens" in line
    assert 0 < kl["q8_0"] < kl["q4_0"]  # 4 bits cost more than 8
    assert pack_cli.main([str(checkpoints["base"]), "-o", str(tmp_path / "x.img"), "--keep", "output=q9"]) == 2
    assert "unknown dtype" in capsys.readouterr().err


def test_older_image_is_refused_with_its_version(images, tmp_path):
    from colibri.image import VERSION, ImageError, write_header
    old = bytearray(images["base"].read_bytes())
    header = read_image(bytes(old)).header
    write_header(old, {**header, "version": 2})
    with pytest.raises(ImageError, match=f"format version 2; this host reads version {VERSION} only: pack the checkpoint again"):
        read_image(bytes(old))


@pytest.mark.parametrize("field,value", [("n_layers", 1 << 24), ("n_layers", 3), ("n_tensors", 5)])
def test_reader_refuses_a_table_its_dimensions_do_not_fit(images, field, value):
    """The host's reader walks the table with the tensors the dimensions need and stops at the first that is not
    there: a header naming 2^24 layers over a table of a few dozen entries is refused at once (no per-layer tuples
    of 2^24), as are one layer too many and a table cut short."""
    import time
    from colibri.image import ImageError, write_header
    data = bytearray(images["base"].read_bytes())
    write_header(data, {**read_image(bytes(data)).header, field: value})
    start = time.perf_counter()
    with pytest.raises(ImageError, match="tensors listed|layers of|table entry"):
        read_image(bytes(data), check_crcs=False)
    assert time.perf_counter() - start < 1.0


def test_pin_from_a_trace_puts_the_hot_experts_in_the_resident_part(checkpoints, tmp_path, capsys):
    trace = {"trace": [{"layers": [{"layer": 0, "experts": [3, 1]}, {"layer": 1, "experts": [2, 1]}]},
                       {"layers": [{"layer": 0, "experts": [3, 0]}, {"layer": 1, "experts": [2, 3]}]}]}
    (tmp_path / "trace.json").write_text(json.dumps(trace))
    out = tmp_path / "pinned.img"
    assert pack_cli.main([str(checkpoints["base"]), "-o", str(out), "--pin-from", str(tmp_path / "trace.json"),
                          "--pin", "3"]) == 0
    assert "3 hot experts pinned resident" in capsys.readouterr().out
    img = read_image(out.read_bytes())
    resident = {le for le in [(l, e) for l in range(2) for e in range(4)] if le not in img.streamed_experts()}
    assert resident == {(0, 3), (1, 2), (0, 0)}  # used twice, twice, then the lowest of the once-used
    # a trace from another model names experts this one lacks
    (tmp_path / "other.json").write_text(json.dumps({"trace": [{"layers": [{"layer": 7, "experts": [0]}]}]}))
    assert pack_cli.main([str(checkpoints["base"]), "-o", str(out), "--pin-from", str(tmp_path / "other.json"),
                          "--pin", "1"]) == 2
    assert "no such routed expert" in capsys.readouterr().err


def test_write_image_streams_the_same_bytes_build_image_returns(checkpoints, tmp_path):
    """pack.py writes the file a tensor at a time (the image never a copy of the model in RAM): the file
    must be exactly the bytes build_image assembles in memory."""
    from colibri.checkpoint import load_checkpoint
    from colibri.image import build_image, write_image
    from colibri.pack import convert_tensors
    from colibri.quant import DType
    ckpt = load_checkpoint(checkpoints["top3_gqa4_tied"], 24)
    tensors = convert_tensors(ckpt.tensors, DType.Q8_0, [("blk.0.*", DType.F16)])
    pinned = frozenset({(1, 2)})
    size = write_image(tmp_path / "w.img", ckpt.dims, tensors, expert_align=256, pinned=pinned)
    want = build_image(ckpt.dims, tensors, expert_align=256, pinned=pinned)
    assert size == len(want) and (tmp_path / "w.img").read_bytes() == want
    read_image(want)  # and it is a valid image


@pytest.mark.parametrize("name,keep,output,embedding", [
    ("base", [], "Q8_0", "Q4_0"),                              # llama.cpp's Q4_0 rule: the output matrix at q8_0
    ("base", [("output", "Q4_0")], "Q4_0", "Q4_0"),              # ... unless --keep says otherwise
    ("top3_gqa4_tied", [], "Q8_0", "Q8_0"),                    # a tied embedding is the output matrix: the wider
    ("top3_gqa4_tied", [("token_embd", "F16")], "F16", "F16"),  # ... of its two names' choices
])
def test_q4_0_keeps_the_output_matrix_at_q8_0(name, keep, output, embedding, checkpoints):
    """--dtype q4_0 stores the output matrix as q8_0 (the logits feel its rounding most; SmolLM2-135M's q4_0 goes
    from KL 0.98 to 0.81 against F16, llama.cpp's own Q4_0 0.82: docs/PERFORMANCE.md) and every other large
    matrix as q4_0; a tied tensor takes the widest dtype any of its names chooses."""
    from colibri.checkpoint import load_checkpoint
    from colibri.pack import convert_tensors
    from colibri.quant import DType
    ckpt = load_checkpoint(checkpoints[name], 24)
    tensors = convert_tensors(ckpt.tensors, DType.Q4_0, [(glob, DType[d]) for glob, d in keep])
    assert tensors[Role.LM_HEAD, NO_INDEX, NO_INDEX].dtype == DType[output]
    assert tensors[Role.TOKEN_EMBD, NO_INDEX, NO_INDEX].dtype == DType[embedding]
    assert tensors[Role.WQ, 0, NO_INDEX].dtype == DType.Q4_0


def write_mixtral(out, vocab: int, hidden: int, ffn: int, layers: int, experts: int, shards: int, heads: int = 4,
                  kv_heads: int = 2, seed: int = 0):
    """A random bf16 Mixtral checkpoint in `shards` shards, written with safetensors directly (no torch: fast
    at hundreds of MB); norms 1."""
    import ml_dtypes
    from safetensors.numpy import save_file
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(dict(
        architectures=["MixtralForCausalLM"], vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads, num_local_experts=experts,
        num_experts_per_tok=2, max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False)))
    hd = hidden // heads
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "lm_head.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    for layer in range(layers):
        p, m = f"model.layers.{layer}.", f"model.layers.{layer}.block_sparse_moe."
        shapes.update({p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
                       p + "self_attn.q_proj.weight": (heads * hd, hidden), p + "self_attn.k_proj.weight": (kv_heads * hd, hidden),
                       p + "self_attn.v_proj.weight": (kv_heads * hd, hidden), p + "self_attn.o_proj.weight": (hidden, heads * hd),
                       m + "gate.weight": (experts, hidden)})
        for e in range(experts):
            shapes.update({f"{m}experts.{e}.{w}.weight": shape for w, shape in
                           (("w1", (ffn, hidden)), ("w3", (ffn, hidden)), ("w2", (hidden, ffn)))})
    rng = np.random.default_rng(seed)
    names = list(shapes)
    weight_map = {}
    for i in range(shards):
        shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = names[i * len(names) // shards:(i + 1) * len(names) // shards]
        save_file({n: (np.ones(shapes[n]) if n.endswith("norm.weight") else
                       rng.standard_normal(shapes[n], dtype=np.float32) * 0.05).astype(ml_dtypes.bfloat16) for n in part},
                  str(out / shard))
        weight_map.update(dict.fromkeys(part, shard))
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out


def test_each_shard_is_opened_once_not_once_per_tensor(tmp_path, monkeypatch):
    """Opening a safetensors file parses its whole header: once per tensor made packing quadratic in the
    tensors of a shard. However a shard is opened (safetensors' safe_open, os.open), packing, the quality
    pass included, opens each one once."""
    import os
    from collections import Counter
    from pathlib import Path
    from colibri.quant import DType
    ckpt = write_mixtral(tmp_path / "ckpt", vocab=40, hidden=32, ffn=16, layers=24, experts=4, shards=3)
    opened: Counter[str] = Counter()

    def counting(real):
        def opener(path, *args, **kwargs):
            if str(path).endswith(".safetensors"):
                opened[Path(path).name] += 1
            return real(path, *args, **kwargs)
        return opener
    import safetensors
    monkeypatch.setattr(os, "open", counting(os.open))
    monkeypatch.setattr("colibri.checkpoint.safe_open", counting(safetensors.safe_open), raising=False)
    report = pack(ckpt, tmp_path / "m.img", 32, 64, dtype=DType.Q8_0)
    assert report["quality"] is not None  # the f32 reference read the checkpoint too
    shards = sorted(p.name for p in ckpt.glob("*.safetensors"))
    assert len(read_image((tmp_path / "m.img").read_bytes()).entries) > 100 * len(shards)
    assert opened == Counter(shards)


@pytest.mark.parametrize("source", ["safetensors", "gguf"])
def test_packing_holds_a_few_tensors_not_the_model(source, tmp_path):
    """A checkpoint several times larger than the memory the packer is allowed: its peak resident memory
    (VmHWM: anonymous and mapped pages alike) stays below what it had after its imports plus K times the
    model's largest tensor in f32, quantizing to q4_0 with the quality pass, from bf16 safetensors shards or
    a Q8_0 GGUF file; and the file it streamed is the image assembled in memory (build_image, here in the
    test's process)."""
    import subprocess
    import sys
    from gguf_writer import hf_to_gguf
    from colibri.checkpoint import load_checkpoint
    from colibri.image import build_image
    from colibri.pack import convert_tensors
    from colibri.quant import DType
    K = 12  # measured 7.2 (safetensors) and 7.7 (GGUF): the q4_0 quantizer's and the quality pass's temporaries
    if source == "safetensors":
        ckpt = write_mixtral(tmp_path / "ckpt", vocab=1024, hidden=1024, ffn=1024, layers=4, experts=8, shards=4)
        stored = sum(p.stat().st_size for p in ckpt.glob("*.safetensors"))
    else:
        ckpt = hf_to_gguf(write_mixtral(tmp_path / "ckpt", vocab=1024, hidden=1024, ffn=1024, layers=8, experts=4,
                                        shards=2), tmp_path / "m.gguf", gguf.GGMLQuantizationType.Q8_0)
        stored = ckpt.stat().st_size
    model = load_checkpoint(ckpt, 64)
    largest = 4 * max(t.size for t in model.tensors.values())  # 1024 x 1024: the embedding, lm_head, each expert
    child = ("import json, sys; sys.path.insert(0, sys.argv[1])\n"
             "from pathlib import Path\n"
             "hwm = lambda: next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
             "from colibri.pack import pack\n"
             "from colibri.quant import DType\n"
             "baseline = hwm()\n"
             "r = pack(Path(sys.argv[2]), Path(sys.argv[3]), 64, 64, dtype=DType.Q4_0)\n"
             "print(json.dumps({'baseline': baseline, 'peak': hwm(), 'quality': r['quality'] is not None}))\n")
    run = subprocess.run([sys.executable, "-c", child, str(ROOT), str(ckpt), str(tmp_path / "m.img")],
                         capture_output=True, text=True, check=True)
    got = json.loads(run.stdout)
    bound = got["baseline"] + K * largest
    assert stored > 2 * K * largest and got["quality"]
    assert got["peak"] < bound, f"peak {got['peak'] / 2**20:.0f} MiB, bound {bound / 2**20:.0f} MiB"
    assert (tmp_path / "m.img").read_bytes() == build_image(model.dims, convert_tensors(model.tensors, DType.Q4_0, []))


def test_a_broken_shard_is_refused_by_name(tmp_path, capsys):
    """A shard's header is checked against its file before anything is written: a header length past the
    end, or a tensor whose bytes the file no longer holds, is a one-line error naming the shard, and neither
    the image nor its .part file is left behind."""
    ckpt = write_mixtral(tmp_path / "ckpt", vocab=40, hidden=32, ffn=16, layers=2, experts=4, shards=2)
    shard = sorted(ckpt.glob("*.safetensors"))[1]
    whole = shard.read_bytes()
    out = tmp_path / "m.img"
    for broken, says in ((whole[:-8], "data_offsets"), (b"\xff" * 8 + whole[8:], "header length")):
        shard.write_bytes(broken)
        assert pack_cli.main([str(ckpt), "-o", str(out)]) == 2
        err = capsys.readouterr().err
        assert ": error: " in err and shard.name in err and says in err and err.count("\n") == 1
        assert not out.exists() and not out.with_name("m.img.part").exists()


def test_a_broken_config_or_gguf_is_one_line(checkpoints, tmp_path, capsys):
    """A config.json without a field its architecture needs, one that is not JSON or not an object, and a file
    named .gguf whose magic is right but whose body is garbage are one-line errors naming what is wrong (they
    were a KeyError, and an IndexError from inside the gguf package, with their tracebacks)."""
    import json
    import shutil
    ckpt = tmp_path / "ckpt"
    shutil.copytree(checkpoints["base"], ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    cases = [(json.dumps({k: v for k, v in config.items() if k != "hidden_size"}), "'hidden_size'"),
             ("{not json", "not valid JSON"), ("[1, 2]", "not a JSON object")]
    for text, says in cases:
        (ckpt / "config.json").write_text(text)
        assert pack_cli.main([str(ckpt), "-o", str(tmp_path / "m.img")]) == 2
        err = capsys.readouterr().err
        assert ": error: " in err and says in err and err.count("\n") == 1, err
    assert pack_cli.main([str(garbage), "-o", str(tmp_path / "m.img")]) == 2
    err = capsys.readouterr().err
    assert ": error: " in err and "not a readable GGUF file" in err and err.count("\n") == 1, err
