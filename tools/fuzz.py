#!/usr/bin/env python3
"""Build and run the libFuzzer harnesses (clang, ASan + UBSan) of tests/fuzz/.

Harnesses: `image` (verify + open + one prefill + one decode step on an arbitrary image) and
`link` (the device side of the serial protocol on an arbitrary byte stream). Each starts from the
seed corpus in tests/fuzz/corpus/<harness>/ (real images of every model variant; real protocol
sessions) plus a dictionary. New inputs go to build/fuzz/corpus/<harness>/; a crash leaves its
input in build/fuzz/ and fails the run.

Examples:
  python tools/fuzz.py --seconds 60                 # both harnesses, one minute each (the test suite's run)
  python tools/fuzz.py image --seconds 3600 --jobs 2 # a long campaign
  python tools/fuzz.py --make-seeds                  # regenerate the committed seed corpus
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

FUZZ = ROOT / "tests" / "fuzz"
OUT = ROOT / "build" / "fuzz"
RUNTIME = ROOT / "firmware" / "src"

from colibri.paths import runtime_sources  # noqa: E402


@dataclass(frozen=True)
class Harness:
    sources: tuple[str, ...]   # under tests/fuzz/, or absolute
    dictionary: str
    # The runtime files built with comparison tracing (-fsanitize-coverage=trace-cmp: a callback at every
    # comparison, so the mutator learns the operands); None: all. The link harness's target is the protocol:
    # it traces the API's argument checks, not the loops of the forward pass and the verifier, which the
    # image harness fuzzes and which were most of its time. Untraced files' edges still count as coverage.
    traced_runtime: tuple[str, ...] | None = None


HARNESSES = {
    "image": Harness(("fuzz_image.c", "image_mutator.c", "reseal.c"), "image.dict"),
    "link": Harness(("fuzz_link.c", str(ROOT / "boards" / "common" / "link.c")), "link.dict",
                    traced_runtime=("colibri.c", "sampler.c")),
}
CFLAGS = ["-std=c11", "-g", "-O1", "-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=all",
          "-ffp-contract=off", f"-I{ROOT / 'firmware' / 'include'}", f"-I{RUNTIME}",
          f"-I{ROOT / 'boards' / 'common'}"]  # firmware/src: format.h, the image format the harness reseals by


def build(name: str) -> Path:
    if shutil.which("clang") is None:
        raise SystemExit("fuzz: clang not found: apt-get install clang libclang-rt-14-dev")
    harness = HARNESSES[name]
    OUT.mkdir(parents=True, exist_ok=True)
    exe = OUT / f"fuzz_{name}"
    objects = OUT / f"untraced-{name}"
    inputs = [str(FUZZ / s) if "/" not in s else s for s in harness.sources]
    for source in runtime_sources():
        if harness.traced_runtime is not None and source.name not in harness.traced_runtime:
            objects.mkdir(exist_ok=True)
            obj = objects / f"{source.stem}.o"
            subprocess.run(["clang", *CFLAGS, "-fno-sanitize-coverage=trace-cmp", "-c", str(source), "-o", str(obj)],
                           check=True)
            inputs.append(str(obj))
        else:
            inputs.append(str(source))
    subprocess.run(["clang", *CFLAGS, *inputs, "-o", str(exe)], check=True)
    return exe


RSS_LIMIT_MB = 2048  # a fuzzer process larger than this is a finding (out-of-memory)


def fresh_process(cmd: list[str]) -> list[str]:
    """`cmd` started by a shell that forks it rather than from this process: Linux keeps a process's peak resident
    size across exec (getrusage's ru_maxrss), so a fuzzer started from a large Python (a test worker that has held
    gigabytes) would measure that peak as its own and stop at once at -rss_limit_mb as out of memory."""
    return ["/bin/sh", "-c", '"$@"; exit $?', "sh", *cmd]


def seed_image() -> Path:
    return FUZZ / "corpus" / "link_image.bin"


def coverage(log: str) -> dict:
    """One libFuzzer process's figures from its log: executions (its final stats), and the coverage it had
    reached: `cov` (edges: the instrumented points hit) and `ft` (features: edges with hit counts and the
    comparisons' values), from its last status line."""
    execs = re.findall(r"stat::number_of_executed_units:\s+(\d+)", log)
    status = re.findall(r"\bcov: (\d+) ft: (\d+)", log)
    edges, features = status[-1] if status else (0, 0)
    return {"executions": int(execs[-1]) if execs else 0, "edges": int(edges), "features": int(features)}


def run(name: str, seconds: int, jobs: int, seed: int) -> dict:
    exe = build(name)
    seeds = FUZZ / "corpus" / name
    work = OUT / "corpus" / name
    work.mkdir(parents=True, exist_ok=True)
    dictionary = HARNESSES[name].dictionary
    cmd = [str(exe), str(work), str(seeds), f"-dict={FUZZ / dictionary}", f"-max_total_time={seconds}",
           f"-seed={seed}", "-print_final_stats=1", "-max_len=65536", f"-artifact_prefix={OUT}/{name}-",
           f"-rss_limit_mb={RSS_LIMIT_MB}", "-timeout=10"]
    if jobs > 1:
        cmd += [f"-jobs={jobs}", f"-workers={jobs}"]
    env = {"COLIBRI_FUZZ_IMAGE": str(seed_image()), "PATH": "/usr/bin:/bin",
           "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=1", "UBSAN_OPTIONS": "print_stacktrace=1"}
    # with -jobs each job writes fuzz-<job>.log into the working directory: build/fuzz, not the checkout
    for old in OUT.glob("fuzz-*.log"):
        old.unlink()
    proc = subprocess.run(fresh_process(cmd), capture_output=True, text=True, env=env, cwd=OUT)
    job_logs = {p.name: p.read_text(errors="replace") for p in sorted(OUT.glob("fuzz-*.log"))} if jobs > 1 else {}
    per_job = [{"log": log_name, **coverage(text)} for log_name, text in job_logs.items()]
    log = proc.stdout + proc.stderr + "".join(job_logs.values())
    # one process, or the jobs together: executions add up; each job counts its own coverage, the best is reported
    figures = coverage(log) if not per_job else {
        "executions": sum(j["executions"] for j in per_job), "edges": max(j["edges"] for j in per_job),
        "features": max(j["features"] for j in per_job)}
    crashes = sorted(str(p) for p in OUT.glob(f"{name}-*"))
    return {"harness": name, "seconds": seconds, **figures, "jobs": per_job, "exit_status": proc.returncode,
            "corpus_files": len(list(work.iterdir())), "findings": crashes,
            "log_tail": log[-3000:] if proc.returncode else ""}


def make_seeds() -> None:
    """Seed corpus: small images of every model variant, and protocol sessions against one of them."""
    import numpy as np

    from colibri import image as im
    from colibri.protocol import (REQ_OPEN, REQ_UPLOAD_BEGIN, REQ_UPLOAD_CHUNK, REQ_UPLOAD_END, Sampling,
                               encode_frame, scripted_session)
    from colibri.quant import DType, convert
    from colibri.rope import tables

    rng = np.random.default_rng(0)
    variants = {
        "mixtral": dict(flags=im.FLAG_NORM_TOPK, moe=(True, True)),
        "qwen2moe": dict(flags=im.FLAG_QKV_BIAS | im.FLAG_SHARED_EXPERT, moe=(True, False), shared=6, dense=10),
        "qwen3moe": dict(flags=im.FLAG_NORM_TOPK | im.FLAG_QK_NORM_HEAD, moe=(False, True), dense=10),
        "olmoe": dict(flags=im.FLAG_QKV_BIAS | im.FLAG_O_BIAS | im.FLAG_QK_NORM_FULL, moe=(True, True), clip=0.5),
        "dense": dict(flags=im.FLAG_QKV_BIAS, moe=(False, False), dense=12, experts=0),
        # the narrower dtypes and the f16 KV cache (the harness runs the forward pass on them too)
        "mixtral-q8_0": dict(flags=im.FLAG_NORM_TOPK, moe=(True, True), dtype=DType.Q8_0, kv=1),
        "mixtral-q4_0": dict(flags=im.FLAG_NORM_TOPK, moe=(True, False), dense=10, dtype=DType.Q4_0),
        "mixtral-f16": dict(flags=im.FLAG_NORM_TOPK, moe=(True, True), dtype=DType.F16, kv=1),
        "mixtral-bf16": dict(flags=im.FLAG_NORM_TOPK, moe=(True, True), dtype=DType.BF16),
        # multi-head latent attention, a sigmoid router with a bias and groups, a plain shared expert
        "deepseek": dict(flags=im.FLAG_NORM_TOPK | im.FLAG_ROUTER_SIGMOID | im.FLAG_ROUTER_BIAS | im.FLAG_SHARED_PLAIN
                         | im.FLAG_ROPE_PAIRS, moe=(False, True), dense=10, shared=5, experts=4,
                         mla=dict(head_dim=6, q_lora_rank=4, kv_lora_rank=5, rope_dim=2, v_head_dim=3, n_group=2,
                                  topk_group=1, group_top=2, routed_scale=2.5, attn_scale=0.3)),
        # attention sinks, a top-k-then-softmax router with a bias, expert biases and the clamped SwiGLU
        "gpt-oss": dict(flags=im.FLAG_QKV_BIAS | im.FLAG_O_BIAS | im.FLAG_ATTN_SINKS | im.FLAG_ROUTER_BIAS
                        | im.FLAG_ROUTER_TOPK_SOFTMAX | im.FLAG_EXPERT_BIAS, moe=(True, True), dtype=DType.Q8_0,
                        mla=dict(swiglu_alpha=1.702, swiglu_limit=0.5)),
        "deepseek-q4_0": dict(flags=im.FLAG_ROPE_PAIRS, moe=(True, True), dtype=DType.Q4_0, kv=1,
                              mla=dict(head_dim=6, kv_lora_rank=5, rope_dim=2, v_head_dim=7)),
        # Gemma 4: its layer (the dense MLP beside the experts), GeGLU, v norms, a windowed layer and a global one
        # of its own head size, KV heads (values its keys) and RoPE, the embedding scale, the logit cap, per-layer inputs
        "gemma4": dict(flags=im.FLAG_NORM_TOPK | im.FLAG_QK_NORM_HEAD | im.FLAG_GEMMA4_LAYER | im.FLAG_GELU_TANH
                       | im.FLAG_V_NORM, moe=(True, True), dense=10,
                       dtype=DType.Q4_0, mla=dict(global_head_dim=8, global_kv_heads=1, embed_scale=2.8, k_eq_v=True,
                                                  global_rope=True,
                                                  logit_softcap=30.0, attn_scale=1.0, sliding_window=3,
                                                  window_layers=(True, False), ple_dim=4)),
        # its dense models' path: a layer sharing an earlier one's KV cache, its MLP twice as wide
        "gemma4-dense-shared": dict(flags=im.FLAG_QK_NORM_HEAD | im.FLAG_GEMMA4_LAYER | im.FLAG_GELU_TANH | im.FLAG_V_NORM
                                    , moe=(False, False, False), dense=10,
                                    experts=0, mla=dict(n_layers=3, global_head_dim=8, embed_scale=2.0, attn_scale=1.0,
                                                        global_rope=True, double_wide_mlp=True,
                                                        sliding_window=3, window_layers=(True, False, True), ple_dim=2,
                                                        kv_shared_layers=1)),
        # LFM2: a short convolution (its state, kept over the prompt) beside attention, a sigmoid router with a bias
        "lfm2": dict(flags=im.FLAG_NORM_TOPK | im.FLAG_QK_NORM_HEAD | im.FLAG_ROUTER_SIGMOID | im.FLAG_ROUTER_BIAS,
                     moe=(False, True), dense=10, mla=dict(conv_layers=(True, False), conv_kernel=3, topk_norm_eps=1e-6)),
        # Qwen3.5: a Gated DeltaNet (its convolution and state) beside gated attention with RoPE on part of each head
        "qwen35": dict(flags=im.FLAG_NORM_TOPK | im.FLAG_QK_NORM_HEAD | im.FLAG_SHARED_EXPERT | im.FLAG_ATTN_GATE,
                       moe=(True, True), shared=6, mla=dict(delta_layers=(True, False), conv_kernel=4, rope_dim=2,
                                                             dn_k_heads=1, dn_v_heads=2, dn_k_dim=4, dn_v_dim=3,
                                                             topk_norm_eps=0.0)),
        # a metadata section (the host's tokenizer and template; its own CRC, which the harness reseals too)
        "mixtral-meta": dict(flags=im.FLAG_NORM_TOPK, moe=(True, True), meta={"note": "fuzz seed"}),
    }
    def image_of(v: dict, rng: np.random.Generator = rng) -> bytes:
        experts = v.get("experts", 3)
        dims = im.ModelDims(**{**dict(
            vocab_size=11, hidden_size=8, ffn_size=6 if experts else 0, n_layers=2, n_heads=2, n_kv_heads=1,
            head_dim=4, n_experts=experts, top_k=2 if experts else 0, max_seq=6, rms_norm_eps=1e-5, rope_theta=10000.0,
            flags=v["flags"], dense_ffn_size=v.get("dense", 0), shared_ffn_size=v.get("shared", 0),
            clip_qkv=v.get("clip", 0.0), moe_layers=v["moe"], kv_dtype=v.get("kv", 0)), **v.get("mla", {})})
        tensors = {}
        for role, layer, expert in im.canonical_order(dims):
            if dims.present(role, layer):
                t = rng.normal(0, 0.5, im.expected_shape(dims, role, layer)).astype(np.float32)
                narrow = t.ndim == 2 and role not in im.F32_TABLES
                dtype = v.get("dtypes", {}).get(role, v.get("dtype", DType.F32))
                tensors[(role, layer, expert)] = convert(t, dtype if narrow else DType.F32)
        inv = 1.0 / (10000.0 ** (np.arange(0, dims.rope_width, 2) / dims.rope_width))
        cos, sin = tables(inv, 1.0, dims.max_seq)
        tensors[(im.Role.ROPE_COS, im.NO_INDEX, im.NO_INDEX)] = cos
        tensors[(im.Role.ROPE_SIN, im.NO_INDEX, im.NO_INDEX)] = sin
        # one pinned expert: both tiers hold experts
        return im.build_image(dims, tensors, pinned=frozenset({(0, 1)}) if experts else frozenset(), meta=v.get("meta"))

    out = FUZZ / "corpus" / "image"
    out.mkdir(parents=True, exist_ok=True)
    for name, v in variants.items():
        blob = image_of(v)
        (out / f"{name}.img").write_bytes(b"\x01" + blob)  # first byte: the harness reseals CRCs
        (out / f"{name}-raw.img").write_bytes(b"\x00" + blob)
        if v.get("experts", 3):
            (out / f"{name}-streamed.img").write_bytes(b"\x03" + blob)  # and streams the expert part
        (out / f"{name}-batched.img").write_bytes(b"\x05" + blob)  # or feeds the prompt through a prefill batch
    write_regress(image_of)
    # the link harness's board: the smallest MoE image (one layer, two experts, one streamed), because every OPEN
    # verifies it and every token runs it; the protocol's paths do not depend on the model's size
    seed_image().write_bytes(image_of(dict(flags=im.FLAG_NORM_TOPK, moe=(True,), experts=2, mla=dict(n_layers=1))))

    image = seed_image().read_bytes()
    run = scripted_session([1, 2], 3, Sampling(0.8, 3, 0.9, 7), 11)
    sessions = {
        "run": run,
        "upload": [(REQ_UPLOAD_BEGIN, struct.pack("<QI", len(image), im.crc32(image))),
                   *[(REQ_UPLOAD_CHUNK, struct.pack("<Q", at) + image[at:at + 2000]) for at in range(0, len(image), 2000)],
                   (REQ_UPLOAD_END, b""), (REQ_OPEN, b""), *run[2:]],  # the whole image: OPEN opens the upload
        "upload-cut": [(REQ_UPLOAD_BEGIN, struct.pack("<QI", len(image), im.crc32(image))),  # END refused: no image
                       (REQ_UPLOAD_CHUNK, struct.pack("<Q", 0) + image[:2000]), (REQ_UPLOAD_END, b""), (REQ_OPEN, b""),
                       *run[2:]],
    }
    link = FUZZ / "corpus" / "link"
    link.mkdir(parents=True, exist_ok=True)
    for name, reqs in sessions.items():
        framed = b"".join(encode_frame(t, i + 1, p) for i, (t, p) in enumerate(reqs))
        records = b"".join(struct.pack("<BBH", t, i + 1, len(p)) + p for i, (t, p) in enumerate(reqs))
        (link / f"{name}-frames.bin").write_bytes(b"\x00" + framed)
        (link / f"{name}-records.bin").write_bytes(b"\x01" + records)
    # the block dtypes (docs/FORMAT.md "Dtypes"), from a generator of their own so the seeds above stay as they were:
    # blocks of 32 on rows of 8 (a padded tail), and the K-quants on rows of 256 (llama.cpp's fallback, Q5_0 and Q4_1,
    # where a row is 8 or 6 long); one layer, two experts, to stay within the harness's -max_len
    block_rng = np.random.default_rng(34)
    k_quants = dict(hidden_size=256, n_layers=1, n_experts=2, top_k=1)
    blocks = {
        "mixtral-q4_1": dict(flags=im.FLAG_NORM_TOPK, moe=(True, True), dtype=DType.Q4_1),
        "mixtral-q5_0": dict(flags=im.FLAG_NORM_TOPK, moe=(True, False), dense=10, dtype=DType.Q5_0, kv=1),
        "mixtral-q5_1": dict(flags=im.FLAG_NORM_TOPK, moe=(True, True), dtype=DType.Q5_1),
        "mixtral-mxfp4": dict(flags=im.FLAG_NORM_TOPK, moe=(True, True), dtype=DType.MXFP4),
        "mixtral-k-quants": dict(flags=im.FLAG_NORM_TOPK, moe=(True,), mla=k_quants, dtype=DType.Q4_K, dtypes={
            im.Role.WQ: DType.Q5_K, im.Role.WK: DType.Q6_K, im.Role.LM_HEAD: DType.Q6_K, im.Role.WO: DType.Q4_1,
            im.Role.EXPERT_DOWN: DType.Q4_1}),
        # rows of 352 (11 blocks) in Q4_0 and Q8_0: the runs of rows by four tokens past their fallback for fewer
        # than 8 blocks, a whole group of 8 and the blocks after it
        "mixtral-q4_0-wide": dict(flags=im.FLAG_NORM_TOPK, moe=(True,), mla={**k_quants, "hidden_size": 352},
                                  dtype=DType.Q4_0, dtypes={
            im.Role.WQ: DType.Q8_0, im.Role.LM_HEAD: DType.Q8_0}),
    }
    for name, v in blocks.items():
        blob = image_of(v, block_rng)
        (out / f"{name}.img").write_bytes(b"\x01" + blob)
        (out / f"{name}-raw.img").write_bytes(b"\x00" + blob)
        (out / f"{name}-streamed.img").write_bytes(b"\x03" + blob)
        (out / f"{name}-batched.img").write_bytes(b"\x05" + blob)
    print(f"seeds written under {FUZZ / 'corpus'}")


# Inputs a campaign once crashed on, rebuilt for today's format by write_regress (tests/fuzz/regress/image/): each
# input's first byte (the harness's mode) and how far the harness gets on it since the fix (tests/test_fuzz.py).
REGRESS = {
    # quantize_q8_0 cast an infinite product to int8: a Q8_0 image whose layer-0 attention norm is infinite
    "quantize-nonfinite.img": (1, {"verify": "OK", "open": "OK", "feed": "E_NONFINITE"}),
    # an expert CRC table at 2^64 - 64 whose end wrapped to 0, read 64 bytes before the image by the verifier
    # (mode 0) and by a streaming open's copy of the table (mode 2)
    "crc-table-wraps.img": (0, {"verify": "E_IMAGE_HEADER"}),
    "crc-table-wraps-streamed.img": (2, {"open": "E_IMAGE_HEADER"}),
}


def write_regress(image_of: Callable[[dict], bytes]) -> None:
    """REGRESS's inputs, from the seeds' images (image_of: make_seeds's) with the fault each needs."""
    import numpy as np

    from colibri import image as im
    from colibri.quant import DType

    def sealed(blob: bytearray) -> bytes:
        struct.pack_into("<I", blob, im.HEADER_CRC_OFFSET, 0)
        struct.pack_into("<I", blob, im.HEADER_CRC_OFFSET, im.crc32(blob[:im.HEADER_BYTES]))
        return bytes(blob)

    q8 = bytearray(image_of(dict(flags=im.FLAG_NORM_TOPK, moe=(True, True), dtype=DType.Q8_0)))
    norm = im.read_image(bytes(q8)).entry(im.Role.ATTN_NORM, 0)
    q8[norm.offset:norm.offset + norm.nbytes] = np.full(norm.shape, np.inf, np.float32).tobytes()
    wraps = bytearray(image_of(dict(flags=im.FLAG_NORM_TOPK, moe=(True, True), experts=8)))  # 4 * 2 * 8 = 64 bytes
    struct.pack_into("<Q", wraps, im.HEADER_OFFSETS["expert_crc_offset"], 2**64 - 64)
    blobs = {"quantize-nonfinite.img": bytes(q8), "crc-table-wraps.img": sealed(wraps),
             "crc-table-wraps-streamed.img": sealed(wraps)}
    out = FUZZ / "regress" / "image"
    out.mkdir(parents=True, exist_ok=True)
    for name, (mode, _) in REGRESS.items():
        (out / name).write_bytes(bytes([mode]) + blobs[name])


def summary(r: dict) -> str:
    verdict = "no findings" if not r["findings"] and r["exit_status"] == 0 else f"FINDINGS: {r['findings']}"
    rate = r["executions"] / r["seconds"] if r["seconds"] else 0.0
    return (f"{r['harness']:<6} {r['seconds']:>5} s  {r['executions']:>10,} executions ({rate:,.0f}/s)  "
            f"{r['edges']:>6,} edges  {r['features']:>7,} features  {r['corpus_files']:>5} corpus files  {verdict}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("harness", nargs="*", choices=[*HARNESSES, []], help="harnesses to run (default: all)")
    ap.add_argument("--seconds", type=int, default=60, help="fuzzing time per harness")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1, help="libFuzzer's random seed (fixed for repeatable runs)")
    ap.add_argument("--make-seeds", action="store_true", help="regenerate tests/fuzz/corpus and exit")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.make_seeds:
        make_seeds()
        return 0
    results = [run(h, args.seconds, args.jobs, args.seed) for h in (args.harness or list(HARNESSES))]
    if args.json:
        print(json.dumps(results))
    else:
        for r in results:
            print(summary(r))
            for job in r["jobs"]:
                print(f"  {job['log']:<12} {job['executions']:>10,} executions  {job['edges']:>6,} edges  "
                      f"{job['features']:>7,} features")
            if r["log_tail"]:
                print(r["log_tail"], file=sys.stderr)
    return 0 if all(not r["findings"] and r["exit_status"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
