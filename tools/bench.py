#!/usr/bin/env python3
"""Hosted speed against the memory bus and against llama.cpp and ik_llama.cpp, side by side (docs/PERFORMANCE.md).
A benchmark, not a test: it prints a table and writes JSON records.

  python tools/build_peers.py                                  # the peers' llama-bench and llama-quantize, once
  python tools/bench.py --json results.json                    # everything below, 3 repetitions
  python tools/bench.py --dtypes q8_0 --threads 2 --reps 5     # one row
  python tools/bench.py --engines colibri --dtypes f32,q4_0    # without the peers
  python tools/bench.py --family mixtral32 --dtypes q8_0,q4_0  # the model far beyond the cache
  python tools/bench.py --engines colibri --experts 1          # Colibri at top_k and at one expert, alternated
  python tools/bench.py --dtypes q8_0,q4_0 --depth 2048        # long context: prompt and decode after 2,048 tokens

Models (checkpoints with random seeded weights made with transformers): `mixtral`, a Mixtral-architecture one
(hidden 1024, intermediate 2816, 8 layers, 16 heads / 4 KV heads, 8 experts top-2, vocab 32000: 640M
parameters, f32); `mixtral32` and `mixtral64`, the same shape with 11 layers and 32 or 64 experts of 2048 (2.3 B
and 4.5 B parameters, written in bf16: their experts are several times any last-level cache); `qwen2moe`, a
Qwen2-MoE one (60 experts top-4 and the gated shared expert). Each is packed into one Colibri image per dtype
(host/pack.py) and written as one GGUF file per dtype: f32 (bf16 for the bf16 checkpoints) by the project's
llama.cpp-style writer (tests/gguf_writer.py), the others from it by llama.cpp's own quantizer (llama-quantize);
`q4_k_m` is llama.cpp's Q4_K_M file, and Colibri's image of it packs that same file as it stores it (--dtype
stored). Everything lands in --work (default build/bench) and is reused.

Peers: llama.cpp 0.3.36 and ik_llama.cpp (ik-llama-cpp-python 0.1.5), each through its own `llama-bench`,
built by tools/build_peers.py from the PyPI sdists that vendor them (that script says how). Both read the same
GGUF files (llama.cpp's quantizer's).

Method: for each repetition, each dtype and thread count, the engines alternate (the order reversed every
other repetition). A Colibri run opens the image, feeds a 128-token prompt in one call (prefill: logits of the
last token only), then 64 decode steps each fed one id of a fixed random stream (greedy decoding of random
weights repeats one token and keeps the same experts hot, which flatters everyone); its times are the device's
own clock (the hosted board's FED frames). A peer run is one `llama-bench -p 128 -n 64 -t N -r 1 -o json`: its
own warm-up, then a 128-token prompt in one batch and, from an empty context, 64 decode steps each fed a
random id (`std::rand() % n_vocab`, so routing moves across the experts as in Colibri's stream). Medians with
min-max over repetitions. The limit is a read-only stream (tools/kernel_bench.c --read: a sum over 2 GiB, far
beyond any last-level cache here) at the same thread count, measured twice before each repetition and after the
last (median with min-max: on this shared VM it moves within minutes); beside it a STREAM-style triad. Effective bandwidth = weight bytes a decode step reads (from the Colibri image's tensor
table: dense tensors whole, routed experts top_k/n_experts, one embedding row; the peers' files hold the same
tensors in the same types) x decode tokens/s. The 1-minute load average before and after is recorded: a busy
machine makes every figure meaningless.

Long context (--depth D): every run first fills the context with D tokens (Colibri: untimed FEEDs of a fixed random
stream; llama.cpp: `llama-bench -d D`, whose prompt and decode tests start after a D-token context; ik_llama.cpp's
llama-bench has no -d: its `-gp D,N` times N decode steps after a D-token prompt, so its prompt figure is left out),
then the prompt and decode are timed as above, at positions D and later. Those images are packed with max_seq D + prompt +
decode and an f16 KV cache, the element type the peers' caches hold by default, so each engine's attention reads
the same bytes.
"""
from __future__ import annotations

import argparse
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
for _path in (ROOT, ROOT / "tools"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from colibri.image import Role, open_image  # noqa: E402
from colibri.quant import DType  # noqa: E402
from colibri.protocol import Sampling  # noqa: E402
from colibri.flash import threads_args  # noqa: E402
from colibri.protocol import Client  # noqa: E402
from colibri.sim.boards import load_board  # noqa: E402
from colibri.sim.launch import start_board  # noqa: E402

DTYPES = ("f32", "f16", "q8_0", "q4_0", "q4_k_m")  # q4_k_m: llama.cpp's file, packed as it stores it
ENGINES = ("colibri", "llama.cpp", "ik_llama.cpp")
QUANTIZER_TYPES = {"f32": "F32", "bf16": "BF16", "f16": "F16", "q8_0": "Q8_0", "q4_0": "Q4_0", "q4_k_m": "Q4_K_M"}
FAMILIES = {
    "mixtral": dict(architectures=["MixtralForCausalLM"], model_type="mixtral", vocab_size=32000, hidden_size=1024,
                    intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
                    num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=8192, rms_norm_eps=1e-5,
                    tie_word_embeddings=False),
    "qwen2moe": dict(architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe", vocab_size=32000, hidden_size=1024,
                     intermediate_size=2816, moe_intermediate_size=352, shared_expert_intermediate_size=1408,
                     num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4, num_experts=60,
                     num_experts_per_tok=4, max_position_embeddings=4096, rms_norm_eps=1e-6, norm_topk_prob=False,
                     decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False),
}
# The shape far beyond the cache: 11 layers of 32 or 64 experts of 2048, written in bf16
for _experts in (32, 64):
    FAMILIES[f"mixtral{_experts}"] = dict(FAMILIES["mixtral"], intermediate_size=2048, num_hidden_layers=11,
                                          num_local_experts=_experts, dtype="bfloat16")
MAX_SEQ = 256


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


# ---- the model, its images and its GGUF files ----

def make_checkpoint(path: Path, family: str) -> Path:
    """The family's checkpoint, seeded; a bf16 one is made in bf16 (half the memory of f32 while it is made)
    and written in shards of 1 GB (save_pretrained serializes a shard at a time)."""
    if (path / "config.json").exists():
        return path
    import torch
    import transformers
    cfg = dict(FAMILIES[family])
    cls = getattr(transformers, cfg["architectures"][0])
    dtype = getattr(torch, cfg.get("dtype", "float32"))
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model = cls(config).eval()
    finally:
        torch.set_default_dtype(default)
    model.save_pretrained(path, max_shard_size="1GB")
    return path


def make_images(ckpt: Path, work: Path, dtypes: list[str], max_seq: int = MAX_SEQ, kv: str = "f32") -> dict[str, Path]:
    """One image per dtype: from the checkpoint, or for q4_k_m from llama.cpp's Q4_K_M file packed as it stores
    its tensors (--dtype stored: its Q4_K and Q6_K blocks byte for byte); `max_seq` positions of a `kv` cache."""
    from colibri.pack import pack
    out = {}
    for dt in dtypes:
        context = "" if (max_seq, kv) == (MAX_SEQ, "f32") else f"-ctx{max_seq}-kv{kv}"
        img = work / f"colibri-{dt}{context}.img"
        if not img.exists():
            src, dtype = (make_ggufs(ckpt, work, [dt])[dt], None) if dt == "q4_k_m" else (ckpt, DType[dt.upper()])
            pack(src, img, max_seq=max_seq, expert_align=4096, dtype=dtype, kv=kv, measure_quality=False)
        out[dt] = img
    return out


def tensor_bytes(image: Path, gguf_file: Path) -> dict[str, dict[str, int]]:
    """Tensor bytes by type in the image and in the GGUF file it was packed from, and each file's size: what
    the two hold beyond their tensors is headers, the vocabulary (the GGUF's) and alignment. The image's
    RoPE tables (its own, precomputed) are counted apart."""
    import gguf
    img = open_image(image, check_crcs=False)
    in_image: dict[str, int] = {}
    for e in img.entries:
        kind = "rope tables" if e.role in (Role.ROPE_COS, Role.ROPE_SIN) else DType(e.dtype).name
        in_image[kind] = in_image.get(kind, 0) + e.nbytes + e.scales_bytes
    in_file: dict[str, int] = {}
    for t in gguf.GGUFReader(str(gguf_file)).tensors:
        in_file[t.tensor_type.name] = in_file.get(t.tensor_type.name, 0) + int(t.n_bytes)
    return {"image": in_image, "file": in_file,
            "sizes": {"image": image.stat().st_size, "file": gguf_file.stat().st_size}}


def make_ggufs(ckpt: Path, work: Path, dtypes: list[str]) -> dict[str, Path]:
    """The checkpoint as an f32 GGUF (bf16 for a bf16 checkpoint) by the project's writer, and each dtype from
    it by llama.cpp's llama-quantize."""
    sys.path.insert(0, str(ROOT / "tests"))
    from gguf_writer import Q, hf_to_gguf
    cfg = json.loads((ckpt / "config.json").read_text())
    stored = "bf16" if cfg.get("dtype", cfg.get("torch_dtype")) == "bfloat16" else "f32"
    base = work / f"llama-{stored}.gguf"
    out = {}
    for dt in dtypes:
        path = work / f"llama-{dt}.gguf"
        if not path.exists():
            if not base.exists():
                hf_to_gguf(ckpt, base, Q[stored.upper()], placeholder_vocab=True)
            quantize_with_llama_cpp(base, path, dt)
        out[dt] = path
    return out


def quantize_with_llama_cpp(src: Path, dst: Path, dtype: str) -> None:
    exe = peer_binary("llama.cpp", "llama-quantize")
    tmp = dst.with_suffix(".part")
    done = subprocess.run([str(exe), str(src), str(tmp), QUANTIZER_TYPES[dtype], str(os.cpu_count() or 1)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"llama-quantize could not make {dtype} of {src}: {done.stderr.strip()[-300:]}")
    tmp.rename(dst)


def peer_binary(engine: str, tool: str) -> Path:
    from build_peers import binary
    exe = binary(engine, tool)
    if not exe.exists():
        raise RuntimeError(f"{exe} is missing: run python tools/build_peers.py")
    return exe


def decode_bytes_per_token(image: Path, experts: int | None = None) -> int:
    """Weight bytes one decode step reads: every tensor whole, routed experts top_k/n_experts of them (or
    experts/n_experts, routed to fewer), and one row of the token embedding instead of the whole table."""
    img = open_image(image, check_crcs=False)
    d = img.dims
    total = 0.0
    for e in img.entries:
        size = e.nbytes + e.scales_bytes
        if e.role in (Role.EXPERT_GATE, Role.EXPERT_UP, Role.EXPERT_DOWN):
            size *= (experts or d.top_k) / d.n_experts
        elif e.role == Role.TOKEN_EMBD:
            size /= d.vocab_size
        elif e.role in (Role.ROPE_COS, Role.ROPE_SIN):
            size = 0
        total += size
    return int(total)


# ---- measurements ----

def bandwidth(kind: str, threads: int) -> float:
    """GB/s of tools/kernel_bench.c's `--read` (a sum over 2 GiB) or `--triad` stream on `threads` threads."""
    exe = ROOT / "build" / "hosted" / "release" / "kernel_bench.elf"
    out = subprocess.run([str(exe), f"--{kind}", str(threads)], check=True, capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])["gbps"]


@dataclass
class Run:
    open_s: float | None       # colibri: starting the board to OPEN's answer; the peers' llama-bench does not say
    prefill_s: float | None    # None: ik_llama.cpp's llama-bench times no prompt after a context (--depth)
    decode_s: float
    rss_bytes: int = 0         # colibri: the board process's VmRSS after decoding
    image_arena_bytes: int = 0  # colibri: image + arena, what the resident memory is held against


def vm_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def run_colibri(image: Path, threads: int, prompt: list[int], stream: list[int], experts: int | None = None,
                context: list[int] = ()) -> Run:
    """One run on the hosted board: the `context` tokens fed untimed, then the prompt in one FEED, then one FEED per
    token of the stream (each token routed to `experts` experts, if not the image's top_k)."""
    board = load_board("hosted")
    t0 = time.perf_counter()
    with start_board(board, board.firmware(), image, threads_args(board, threads)) as device:
        client = Client(device.link, timeout=600)
        hz = client.info().cycle_hz
        opened = client.open(experts=experts)
        open_s = time.perf_counter() - t0
        client.start(Sampling())
        client.feed_all(list(context))
        prefill = client.feed(prompt)[1]
        decode = sum(client.feed([t])[1] for t in stream)
        rss = vm_rss(device.proc.pid)
        client.quit()
    return Run(open_s, prefill / hz, decode / hz, rss, opened.image_bytes + opened.arena_bytes)


def run_llama_bench(engine: str, gguf_path: Path, threads: int, n_prompt: int, n_decode: int, depth: int = 0) -> Run:
    """One `llama-bench` run of the peer: its prompt test and its decode test, one repetition each, after a `depth`-token
    context: llama.cpp's `-d`; ik_llama.cpp's has none, and its `-gp D,N` (N decode steps timed after a D-token prompt)
    gives the decode figure only."""
    cmd = [str(peer_binary(engine, "llama-bench")), "-m", str(gguf_path), "-t", str(threads), "-r", "1", "-o", "json"]
    if depth and engine == "ik_llama.cpp":
        cmd += ["-p", "0", "-n", "0", "-gp", f"{depth},{n_decode}"]
    else:
        cmd += ["-p", str(n_prompt), "-n", str(n_decode)] + (["-d", str(depth)] if depth else [])
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{engine}'s llama-bench failed on {gguf_path.name}: {done.stderr.strip()[-300:]}")
    tests = json.loads(done.stdout)
    if depth and engine == "ik_llama.cpp":
        gen = next(t for t in tests if t["n_gen"] == n_decode and t["n_prompt"] == depth)
        return Run(None, None, n_decode / gen["avg_ts"])
    prompt = next(t for t in tests if t["n_prompt"] == n_prompt and t["n_gen"] == 0)
    gen = next(t for t in tests if t["n_gen"] == n_decode and t["n_prompt"] == 0)
    return Run(None, n_prompt / prompt["avg_ts"], n_decode / gen["avg_ts"])


def routed_experts(engine: str) -> int | None:
    """K of the engine colibri@K (--experts); None for the others."""
    return int(engine.split("@")[1]) if "@" in engine else None


def summarize(vals: list[float]) -> dict:
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, help="write the records here")
    ap.add_argument("--family", choices=sorted(FAMILIES), default="mixtral")
    ap.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated, of " + ", ".join(DTYPES))
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--engines", default=",".join(ENGINES), help="comma-separated, of " + ", ".join(ENGINES))
    ap.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens (default 128)")
    ap.add_argument("--decode", type=int, default=64, help="decode steps (default 64)")
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "bench", help="where models are kept")
    ap.add_argument("--depth", type=int, default=0, metavar="D",
                    help="tokens in the context before the prompt and the decode steps (llama-bench -d): long-context "
                         "speed, on images of max_seq D + prompt + decode with an f16 KV cache (default 0)")
    ap.add_argument("--experts", type=int, metavar="K", help="Colibri also routing each token to K experts (colibri run "
                    "--experts), as one more engine, colibri@K, alternated with the others")
    args = ap.parse_args(argv)
    dtypes = [d for d in args.dtypes.split(",") if d]
    if any(d not in DTYPES for d in dtypes):
        ap.error(f"--dtypes takes {', '.join(DTYPES)}")
    threads = [int(t) for t in args.threads.split(",")]
    engines = [e for e in args.engines.split(",") if e]
    if any(e not in ENGINES for e in engines):
        ap.error(f"--engines takes {', '.join(ENGINES)}")
    if args.experts is not None:
        top_k = FAMILIES[args.family].get("num_experts_per_tok", 0)
        if not 1 <= args.experts <= top_k or "colibri" not in engines:
            ap.error(f"--experts takes 1 to {args.family}'s top-{top_k}, with the colibri engine")
    try:
        for eng in engines:
            if eng != "colibri":
                peer_binary(eng, "llama-bench")
        if "q4_k_m" in dtypes or set(engines) - {"colibri"}:
            peer_binary("llama.cpp", "llama-quantize")
        return bench(args, dtypes, threads, engines)
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1


def bench(args: argparse.Namespace, dtypes: list[str], threads: list[int], engines: list[str]) -> int:
    subprocess.run([sys.executable, "-m", "SCons", "-Q", "board=hosted"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    work = args.work / args.family
    work.mkdir(parents=True, exist_ok=True)
    ckpt = make_checkpoint(work / "checkpoint", args.family)
    max_seq = args.depth + args.prompt + args.decode if args.depth else MAX_SEQ
    images = make_images(ckpt, work, dtypes, max_seq, "f16" if args.depth else "f32")
    ggufs = make_ggufs(ckpt, work, dtypes) if set(engines) - {"colibri"} else {}
    vocab = FAMILIES[args.family]["vocab_size"]
    rng = np.random.default_rng(1234)
    prompt = [int(t) for t in rng.integers(3, vocab, args.prompt)]
    stream = [int(t) for t in rng.integers(3, vocab, args.decode)]
    context = [int(t) for t in rng.integers(3, vocab, args.depth)]

    load_before = load_average()
    limits: dict[tuple[str, int], list[float]] = {}

    def measure_limits() -> None:
        for n in threads:
            for kind in ("read", "triad"):
                limits.setdefault((kind, n), []).extend(bandwidth(kind, n) for _ in range(2))

    samples: dict[tuple[str, str, int], list[Run]] = {}
    timed = [e for eng in engines for e in ([eng, f"colibri@{args.experts}"] if eng == "colibri" and args.experts
                                            else [eng])]
    for rep in range(args.reps):
        measure_limits()  # between the repetitions too: this VM's bandwidth moves within minutes
        for dt in dtypes:
            for n in threads:
                order = timed if rep % 2 == 0 else timed[::-1]
                for eng in order:
                    run = (run_colibri(images[dt], n, prompt, stream, routed_experts(eng), context)
                           if eng.startswith("colibri")
                           else run_llama_bench(eng, ggufs[dt], n, args.prompt, args.decode, args.depth))
                    samples.setdefault((eng, dt, n), []).append(run)
                    prefill = f"{args.prompt / run.prefill_s:7.1f}" if run.prefill_s else "      -"
                    print(f"  rep {rep + 1} {eng:12} {dt:6} {n} thr: prefill {prefill} tok/s, "
                          f"decode {args.decode / run.decode_s:6.2f} tok/s", file=sys.stderr)
    measure_limits()
    load_after = load_average()
    limit = {key: summarize(vals) for key, vals in limits.items()}

    records = []
    for (eng, dt, n), runs in samples.items():
        bpt = decode_bytes_per_token(images[dt], routed_experts(eng))
        decode_tps = summarize([args.decode / r.decode_s for r in runs])
        timed = [args.prompt / r.prefill_s for r in runs if r.prefill_s]
        prefill_tps = summarize(timed) if timed else {"median": None, "min": None, "max": None}
        gbps = decode_tps["median"] * bpt / 1e9
        opens = [r.open_s for r in runs if r.open_s is not None]
        records.append({
            "engine": eng, "family": args.family, "dtype": dt, "threads": n,
            "prefill_tok_s": prefill_tps["median"], "prefill_tok_s_range": [prefill_tps["min"], prefill_tps["max"]],
            "decode_tok_s": decode_tps["median"], "decode_tok_s_range": [decode_tps["min"], decode_tps["max"]],
            "open_s": statistics.median(opens) if opens else None,
            "bytes_per_token": bpt, "gbps": gbps,
            "read_gbps": limit[("read", n)]["median"], "read_fraction": gbps / limit[("read", n)]["median"],
            "triad_gbps": limit[("triad", n)]["median"], "triad_fraction": gbps / limit[("triad", n)]["median"],
            "prompt_tokens": args.prompt, "decode_tokens": args.decode, "depth": args.depth, "reps": len(runs),
            "rss_bytes": max(r.rss_bytes for r in runs) or None,
            "rss_over_image_arena": (max(r.rss_bytes / r.image_arena_bytes for r in runs)
                                     if runs[0].image_arena_bytes else None),
            "load_before": load_before, "load_after": load_after,
        })
    print("\n" + "; ".join(f"{kind} {n} thread{'s' if n > 1 else ''} {v['median']:.1f} GB/s ({v['min']:.1f}-{v['max']:.1f})"
                           for (kind, n), v in sorted(limit.items()))
          + f"; load average {load_before:.2f} before, {load_after:.2f} after")
    print("| engine | dtype | threads | prompt tok/s (min-max) | decode tok/s (min-max) | decode GB/s | of read | "
          "of triad | open s | RSS / (image + arena) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in sorted(records, key=lambda r: (DTYPES.index(r["dtype"]), r["threads"],
                                            ENGINES.index(r["engine"].split("@")[0]), r["engine"])):
        lo, hi = r["decode_tok_s_range"]
        plo, phi = r["prefill_tok_s_range"]
        prompt = f"{r['prefill_tok_s']:.1f} ({plo:.1f}-{phi:.1f})" if r["prefill_tok_s"] is not None else "-"
        rss = f"{r['rss_over_image_arena']:.3f}" if r["rss_over_image_arena"] else "-"
        opened = f"{r['open_s']:.2f}" if r["open_s"] is not None else "-"
        print(f"| {r['engine']} | {r['dtype']} | {r['threads']} | {prompt} | "
              f"{r['decode_tok_s']:.2f} ({lo:.2f}-{hi:.2f}) | {r['gbps']:.1f} | {100 * r['read_fraction']:.0f}% | "
              f"{100 * r['triad_fraction']:.0f}% | {opened} | {rss} |")
    records.extend({"limit": kind, "threads": n, "gbps": v} for (kind, n), v in limit.items())
    if "q4_k_m" in images:
        sizes = tensor_bytes(images["q4_k_m"], make_ggufs(ckpt, work, ["q4_k_m"])["q4_k_m"])
        print("\n| q4_k_m tensor bytes | image | GGUF file |\n| --- | --- | --- |")
        for kind in sorted(set(sizes["image"]) | set(sizes["file"])):
            print(f"| {kind} | {sizes['image'].get(kind, 0):,} | {sizes['file'].get(kind, 0):,} |")
        print(f"| the whole file | {sizes['sizes']['image']:,} | {sizes['sizes']['file']:,} |")
        records.append({"dtype": "q4_k_m", "tensor_bytes": sizes})
    if args.json:
        args.json.write_text(json.dumps(records, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
