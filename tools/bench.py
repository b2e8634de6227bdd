#!/usr/bin/env python3
"""Hosted speed against the memory bus and against llama.cpp, side by side (docs/PERFORMANCE.md).
A benchmark, not a test: it prints a table and writes JSON records.

  python tools/bench.py --json results.json                    # everything below, 3 repetitions
  python tools/bench.py --dtypes q8_0 --threads 2 --reps 5     # one row
  python tools/bench.py --engines colibri --dtypes f32,q4_0    # without the peer

Model: a Mixtral-architecture checkpoint with random seeded weights made with transformers (hidden 1024,
intermediate 2816, 8 layers, 16 heads / 4 KV heads, 8 experts top-2, vocab 32000: 640M parameters), or
with --family qwen2moe a Qwen2-MoE one (60 experts top-4 and the gated shared expert). It is packed into
one Colibri image per dtype (host/pack.py) and written as one GGUF file per dtype: f32 by the project's
llama.cpp-style writer (tests/gguf_writer.py), f16/q8_0/q4_0 from it by llama.cpp's own quantizer
(`llama_model_quantize`). Everything lands in --work (default build/bench) and is reused.

Peer: llama.cpp through llama-cpp-python, built from its PyPI sdist. On a CPU that advertises AMX inside
a VM build it without AMX (the native build crashes on q8_0/q4_0):
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON \\
    -DGGML_AVX512_VNNI=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" \\
    pip install --no-binary llama-cpp-python llama-cpp-python==0.3.36

Method: for each repetition, each dtype and thread count, the engines alternate; each run opens the
model, feeds a 128-token prompt in one call (prefill: logits of the last token only), then 64 decode steps
each fed one id of a fixed random stream (greedy decoding of random weights repeats one token and keeps
the same experts hot, which flatters everyone). Colibri's times are the device's own clock (the hosted
board's FED frames); llama.cpp's are wall time around llama_decode. Medians with min-max over
repetitions. The denominator is a STREAM-style triad measured by tools/kernel_bench.c at 1 and 2
threads; effective bandwidth = weight bytes a decode step reads (from the image's tensor table: dense
tensors whole, routed experts top_k/n_experts, one embedding row) x decode tokens/s. The 1-minute load
average before and after is recorded: a busy machine makes every figure meaningless.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from colibri.image import Role, open_image  # noqa: E402
from colibri.protocol import Sampling  # noqa: E402
from colibri.flash import threads_args  # noqa: E402
from colibri.protocol import Client  # noqa: E402
from colibri.sim.boards import load_board  # noqa: E402
from colibri.sim.launch import start_board  # noqa: E402

DTYPES = ("f32", "f16", "q8_0", "q4_0", "q4_k_m")  # q4_k_m: llama.cpp's file, packed as it stores it
FAMILIES = {
    "mixtral": dict(architectures=["MixtralForCausalLM"], model_type="mixtral", vocab_size=32000, hidden_size=1024,
                    intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
                    num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=4096, rms_norm_eps=1e-5,
                    tie_word_embeddings=False),
    "qwen2moe": dict(architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe", vocab_size=32000, hidden_size=1024,
                     intermediate_size=2816, moe_intermediate_size=352, shared_expert_intermediate_size=1408,
                     num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4, num_experts=60,
                     num_experts_per_tok=4, max_position_embeddings=4096, rms_norm_eps=1e-6, norm_topk_prob=False,
                     decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False),
}
MAX_SEQ = 256


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


# ---- the model, its images and its GGUF files ----

def make_checkpoint(path: Path, family: str) -> Path:
    if (path / "config.json").exists():
        return path
    import torch
    import transformers
    cfg = dict(FAMILIES[family])
    cls = getattr(transformers, cfg["architectures"][0])
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(0)
    model = cls(config).to(torch.float32).eval()
    model.save_pretrained(path)
    return path


def make_images(ckpt: Path, work: Path, dtypes: list[str]) -> dict[str, Path]:
    """One image per dtype: from the checkpoint, or for q4_k_m from llama.cpp's Q4_K_M file packed as it stores
    its tensors (--dtype stored: its Q4_K and Q6_K blocks byte for byte)."""
    from colibri.pack import pack
    from colibri.quant import DType
    out = {}
    for dt in dtypes:
        img = work / f"colibri-{dt}.img"
        if not img.exists():
            src, dtype = (make_ggufs(ckpt, work, [dt])[dt], None) if dt == "q4_k_m" else (ckpt, DType[dt.upper()])
            pack(src, img, max_seq=MAX_SEQ, expert_align=4096, dtype=dtype, measure_quality=False)
        out[dt] = img
    return out


def quantized_bytes(image: Path, gguf_file: Path) -> tuple[int, int]:
    """The quantized tensors' bytes in the image and in the GGUF file it was packed from."""
    import gguf
    img = open_image(image, check_crcs=False)
    in_image = sum(e.nbytes + e.scales_bytes for e in img.entries if e.dtype != 0)
    in_file = sum(int(t.n_bytes) for t in gguf.GGUFReader(str(gguf_file)).tensors
                  if t.tensor_type.name not in ("F32", "F16", "BF16"))
    return in_image, in_file


def make_ggufs(ckpt: Path, work: Path, dtypes: list[str]) -> dict[str, Path]:
    sys.path.insert(0, str(ROOT / "tests"))
    from gguf_writer import hf_to_gguf
    f32 = work / "llama-f32.gguf"
    if not f32.exists():
        hf_to_gguf(ckpt, f32, placeholder_vocab=True)
    out = {}
    for dt in dtypes:
        path = work / f"llama-{dt}.gguf"
        if not path.exists():
            quantize_with_llama_cpp(f32, path, dt)
        out[dt] = path
    return out


def quantize_with_llama_cpp(src: Path, dst: Path, dtype: str) -> None:
    import llama_cpp
    ftype = {"f32": llama_cpp.LLAMA_FTYPE_ALL_F32, "f16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16,
             "q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
             "q4_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M}[dtype]
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = os.cpu_count() or 1
    if llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params) != 0:
        raise RuntimeError(f"llama.cpp could not quantize {src} to {dtype}")


def decode_bytes_per_token(image: Path) -> int:
    """Weight bytes one decode step reads: every tensor whole, routed experts top_k/n_experts of them,
    and one row of the token embedding instead of the whole table."""
    img = open_image(image, check_crcs=False)
    d = img.dims
    total = 0.0
    for e in img.entries:
        size = e.nbytes + e.scales_bytes
        if e.role in (Role.EXPERT_GATE, Role.EXPERT_UP, Role.EXPERT_DOWN):
            size *= d.top_k / d.n_experts
        elif e.role == Role.TOKEN_EMBD:
            size /= d.vocab_size
        elif e.role in (Role.ROPE_COS, Role.ROPE_SIN):
            size = 0
        total += size
    return int(total)


# ---- measurements ----

def triad(threads: int) -> float:
    exe = ROOT / "build" / "hosted" / "release" / "kernel_bench.elf"
    out = subprocess.run([str(exe), "--triad", str(threads)], check=True, capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])["gbps"]


@dataclass
class Run:
    open_s: float
    prefill_s: float
    decode_s: float
    rss_bytes: int = 0         # colibri: the board process's VmRSS after decoding
    image_arena_bytes: int = 0  # colibri: image + arena, what the resident memory is held against


def vm_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def run_colibri(image: Path, threads: int, prompt: list[int], stream: list[int]) -> Run:
    """One run on the hosted board: the prompt in one FEED, then one FEED per token of the stream."""
    board = load_board("hosted")
    t0 = time.perf_counter()
    with start_board(board, board.firmware(), image, threads_args(board, threads)) as device:
        client = Client(device.link, timeout=600)
        hz = client.info().cycle_hz
        opened = client.open()
        open_s = time.perf_counter() - t0
        client.start(Sampling())
        prefill = client.feed(prompt)[1]
        decode = sum(client.feed([t])[1] for t in stream)
        rss = vm_rss(device.proc.pid)
        client.quit()
    return Run(open_s, prefill / hz, decode / hz, rss, opened.image_bytes + opened.arena_bytes)


@functools.cache
def quiet_llama_cpp():
    """llama.cpp's log callback set to one that prints nothing (it logs every tensor at load)."""
    import llama_cpp
    callback = llama_cpp.llama_log_callback(lambda level, text, user: None)
    llama_cpp.llama_log_set(callback, None)
    return callback  # kept alive by the cache: llama.cpp holds the pointer


def run_llama_cpp(gguf_path: Path, threads: int, prompt: list[int], stream: list[int]) -> Run:
    import llama_cpp
    quiet_llama_cpp()
    t0 = time.perf_counter()
    mparams = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(str(gguf_path).encode(), mparams)
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = MAX_SEQ
    cparams.n_batch = cparams.n_ubatch = len(prompt)
    cparams.n_threads = cparams.n_threads_batch = threads
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    batch = llama_cpp.llama_batch_init(len(prompt), 0, 1)

    def decode(tokens: list[int], pos: int) -> float:
        batch.n_tokens = len(tokens)
        for i, tok in enumerate(tokens):
            batch.token[i] = tok
            batch.pos[i] = pos + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i == len(tokens) - 1
        t = time.perf_counter()
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        llama_cpp.llama_get_logits_ith(ctx, len(tokens) - 1)[0]  # the logits are there to read
        return time.perf_counter() - t

    open_s = time.perf_counter() - t0
    prefill = decode(prompt, 0)
    dec = sum(decode([tok], len(prompt) + i) for i, tok in enumerate(stream))
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return Run(open_s, prefill, dec)


def summarize(vals: list[float]) -> dict:
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, help="write the records here")
    ap.add_argument("--family", choices=sorted(FAMILIES), default="mixtral")
    ap.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated, of " + ", ".join(DTYPES))
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--engines", default="colibri,llama.cpp")
    ap.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens (default 128)")
    ap.add_argument("--decode", type=int, default=64, help="decode steps (default 64)")
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "bench", help="where models are kept")
    args = ap.parse_args(argv)
    dtypes = [d for d in args.dtypes.split(",") if d]
    if any(d not in DTYPES for d in dtypes):
        ap.error(f"--dtypes takes {', '.join(DTYPES)}")
    threads = [int(t) for t in args.threads.split(",")]
    engines = [e for e in args.engines.split(",") if e]
    if "llama.cpp" in engines:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            print("bench: llama-cpp-python is not installed; build it as this script's --help says, or pass "
                  "--engines colibri", file=sys.stderr)
            return 2

    subprocess.run([sys.executable, "-m", "SCons", "-Q", "board=hosted"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    work = args.work / args.family
    work.mkdir(parents=True, exist_ok=True)
    ckpt = make_checkpoint(work / "checkpoint", args.family)
    images = make_images(ckpt, work, dtypes)
    ggufs = make_ggufs(ckpt, work, dtypes) if "llama.cpp" in engines else {}
    vocab = FAMILIES[args.family]["vocab_size"]
    rng = np.random.default_rng(1234)
    prompt = [int(t) for t in rng.integers(3, vocab, args.prompt)]
    stream = [int(t) for t in rng.integers(3, vocab, args.decode)]

    load_before = load_average()
    triads = {n: summarize([triad(n) for _ in range(3)]) for n in threads}
    samples: dict[tuple[str, str, int], list[Run]] = {}
    for rep in range(args.reps):
        for dt in dtypes:
            for n in threads:
                order = engines if rep % 2 == 0 else engines[::-1]
                for eng in order:
                    run = (run_colibri(images[dt], n, prompt, stream) if eng == "colibri"
                           else run_llama_cpp(ggufs[dt], n, prompt, stream))
                    samples.setdefault((eng, dt, n), []).append(run)
                    print(f"  rep {rep + 1} {eng:9} {dt:5} {n} thr: prefill {args.prompt / run.prefill_s:7.1f} tok/s, "
                          f"decode {args.decode / run.decode_s:6.2f} tok/s, open {run.open_s:.2f} s", file=sys.stderr)
    load_after = load_average()

    records = []
    for (eng, dt, n), runs in samples.items():
        bpt = decode_bytes_per_token(images[dt])
        decode_tps = summarize([args.decode / r.decode_s for r in runs])
        gbps = decode_tps["median"] * bpt / 1e9
        records.append({
            "engine": eng, "family": args.family, "dtype": dt, "threads": n,
            "prefill_tok_s": statistics.median(args.prompt / r.prefill_s for r in runs),
            "prefill_tok_s_range": [min(args.prompt / r.prefill_s for r in runs),
                                    max(args.prompt / r.prefill_s for r in runs)],
            "decode_tok_s": decode_tps["median"], "decode_tok_s_range": [decode_tps["min"], decode_tps["max"]],
            "open_s": statistics.median(r.open_s for r in runs),
            "bytes_per_token": bpt, "gbps": gbps,
            "triad_gbps": triads[n]["median"], "triad_fraction": gbps / triads[n]["median"],
            "prompt_tokens": args.prompt, "decode_tokens": args.decode, "reps": len(runs),
            "rss_bytes": max(r.rss_bytes for r in runs) or None,
            "rss_over_image_arena": (max(r.rss_bytes / r.image_arena_bytes for r in runs)
                                     if runs[0].image_arena_bytes else None),
            "load_before": load_before, "load_after": load_after,
        })
    print(f"\ntriad: " + ", ".join(f"{n} thread{'s' if n > 1 else ''} {t['median']:.1f} GB/s" for n, t in triads.items())
          + f"; load average {load_before:.2f} before, {load_after:.2f} after")
    print("| engine | dtype | threads | prefill tok/s (min-max) | decode tok/s (min-max) | GB/s | of triad | open s | "
          "RSS / (image + arena) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in sorted(records, key=lambda r: (DTYPES.index(r["dtype"]), r["threads"], r["engine"])):
        lo, hi = r["decode_tok_s_range"]
        plo, phi = r["prefill_tok_s_range"]
        rss = f"{r['rss_over_image_arena']:.3f}" if r["rss_over_image_arena"] else "-"
        print(f"| {r['engine']} | {r['dtype']} | {r['threads']} | {r['prefill_tok_s']:.1f} ({plo:.1f}-{phi:.1f}) | "
              f"{r['decode_tok_s']:.2f} ({lo:.2f}-{hi:.2f}) | {r['gbps']:.1f} | {100 * r['triad_fraction']:.0f}% | "
              f"{r['open_s']:.2f} | {rss} |")
    if "q4_k_m" in images:
        in_image, in_file = quantized_bytes(images["q4_k_m"], make_ggufs(ckpt, work, ["q4_k_m"])["q4_k_m"])
        print(f"q4_k_m: the image's quantized tensors {in_image:,} bytes, the GGUF file's {in_file:,}")
        records.append({"dtype": "q4_k_m", "image_quantized_bytes": in_image, "file_quantized_bytes": in_file})
    if args.json:
        args.json.write_text(json.dumps(records, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
