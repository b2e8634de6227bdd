#!/usr/bin/env python3
"""Kernel benchmarks (not tests): where each dtype's kernels stand against the memory bus and the
scalar code. Prints a table, writes JSON records with --json.

Three parts:
  hosted  single-thread matvec throughput per dtype and kernel set on a matrix far larger than the
          last-level cache, in GB/s of weights read (scales included), next to a STREAM-style triad and
          a read-only stream over 2 GiB (a plain sum: what one core's loads fetch from memory, decode's
          limit), measured by the same program (build/hosted/release/kernel_bench.elf); several rounds,
          medians with min-max. Beside it the same kernel on 512 KiB of the matrix, which stays in
          the 2nd-level cache: what the kernel computes at when memory is no limit.
  icount  instructions per generated token under QEMU with -icount (the boards' cycle counters then
          count instructions), SIMD build vs `kernels=scalar` build, per board and dtype, on the
          demo model and a larger random one; --boards and --dtypes choose (default: the four SIMD boards,
          f32 f16 q8_0 q4_0), --against COMMIT adds that commit's SIMD build (git archive, as attention's).
  attention  long context on the hosted board, where attention outweighs the weights: a random Mixtral with
          8 heads of 64 (hidden 512, 2 layers, 4 small experts), a 1,024-token prompt in one pass, then
          decode steps at positions ~1k and ~2k (a second prompt between them), per KV dtype, in milliseconds
          of the device's clock; with --against COMMIT the same runs with that commit's hosted build beside
          this tree's, alternated, so both see the same machine (git archive into build/bench/, built there).

  python tools/bench_kernels.py --json bench.json              # hosted and icount
  python tools/bench_kernels.py --part hosted --mib 1024 --rounds 5
  python tools/bench_kernels.py --part attention --against HEAD~1 --rounds 5
  python tools/bench_kernels.py --part icount --boards cortex_m4 --dtypes q4_1,mxfp4 --against HEAD~1
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ICOUNT_BOARDS = ("cortex_m55", "riscv64_virt", "cortex_m4", "x86_64_baremetal")
ICOUNT_DTYPES = ("f32", "f16", "q8_0", "q4_0")


def scons(board: str, kernels: str = "auto") -> Path:
    subprocess.run([sys.executable, "-m", "SCons", "-Q", f"board={board}", f"kernels={kernels}"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    return ROOT / "build" / board / ("release" + ("-scalar" if kernels == "scalar" else ""))


def idle_check() -> float:
    """The 1-minute load average, so a reader can tell whether the machine was busy."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def hosted(mib: int, rounds: int) -> list[dict]:
    exe = scons("hosted") / "kernel_bench.elf"
    samples: dict[tuple[str, str], list[float]] = {}
    in_cache: dict[tuple[str, str], list[float]] = {}
    extra: dict[tuple[str, str], dict] = {}
    for _ in range(rounds):
        out = subprocess.run([str(exe), str(mib)], check=True, capture_output=True, text=True).stdout
        for line in out.splitlines():
            rec = json.loads(line)
            key = (rec["what"], rec["kernels"])
            samples.setdefault(key, []).append(rec["gbps"])
            if "in_cache_gbps" in rec:
                in_cache.setdefault(key, []).append(rec["in_cache_gbps"])
            extra[key] = {k: rec[k] for k in ("rows", "cols") if k in rec}
    triad = statistics.median(samples[("triad", "-")])
    records = []
    for key, vals in samples.items():
        what, kernels = key
        med = statistics.median(vals)
        if key in in_cache:
            extra[key]["in_cache_gbps_median"] = round(statistics.median(in_cache[key]), 3)
        records.append({"part": "hosted", "what": what, "kernels": kernels, "gbps_median": round(med, 3),
                        "gbps_min": round(min(vals), 3), "gbps_max": round(max(vals), 3), "rounds": len(vals),
                        "of_triad": round(med / triad, 3), "weights_mib": mib, **extra[key]})
    return records


def make_images(tmp: Path, dtypes: tuple[str, ...]) -> dict[str, Path]:
    """The demo model and a larger random Mixtral, packed in each dtype."""
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import TinyConfig, make_checkpoint
    from colibri.pack import pack
    from colibri.quant import DType

    sources = {"demo": ROOT / "models" / "demo-adder",
               # 10.5 MB in f32: fits every board's image region (the M4's is 16 MiB)
               "mixtral-h256": make_checkpoint(TinyConfig("bench", vocab=512, hidden=256, ffn=384, layers=2, heads=8,
                                                          kv_heads=4, experts=4, top_k=2, seed=9), tmp / "bench")}
    images = {}
    for model, src in sources.items():
        for dtype in dtypes:
            path = tmp / f"{model}-{dtype}.img"
            pack(src, path, 32, 64, dtype=DType.parse(dtype), measure_quality=False)
            images[f"{model} {dtype}"] = path
    return images


def icount(tokens: int, boards: tuple[str, ...] = ICOUNT_BOARDS, dtypes: tuple[str, ...] = ICOUNT_DTYPES,
           against: str | None = None) -> list[dict]:
    from colibri import flash
    from colibri.protocol import Sampling

    records = []
    with tempfile.TemporaryDirectory(prefix="colibri-bench-") as tmp:
        images = make_images(Path(tmp), dtypes)
        for board in boards:
            builds = {"simd": scons(board) / "firmware.elf", "scalar": scons(board, "scalar") / "firmware.elf"}
            if against:
                builds["against"] = build_commit(against, board)
            for name, image in images.items():
                per_token = {}
                for kind, fw in builds.items():
                    # -icount shift=0: virtual time advances 1 ns per instruction, so the board's
                    # cycle counter (a fixed fraction of virtual time) is proportional to instructions
                    r = flash.run_on_board(image, board, [1, 2, 3, 4], tokens, Sampling(), False, firmware=fw,
                                           board_args=["-icount", "shift=0"])
                    per_token[kind] = r.stats["cycles_total"] / r.stats["tokens_fed"]
                records.append({"part": "icount", "board": board, "image": name,
                                "counter_per_token_simd": round(per_token["simd"]),
                                "counter_per_token_scalar": round(per_token["scalar"]),
                                "scalar_over_simd": round(per_token["scalar"] / per_token["simd"], 2)})
                line = f"  {board:17} {name:18} scalar/simd = {records[-1]['scalar_over_simd']:.2f}"
                if against:
                    records[-1].update(against=against, counter_per_token_against=round(per_token["against"]),
                                       against_over_simd=round(per_token["against"] / per_token["simd"], 2))
                    line += f", {against}/simd = {records[-1]['against_over_simd']:.2f}"
                print(line + f" (per token: simd {per_token['simd']:.0f}, scalar {per_token['scalar']:.0f})", flush=True)
    return records


ATTENTION_PROMPT = 1024  # tokens of the first pass; decode runs at ~1k, then after as many again at ~2k
ATTENTION_DECODE = 16    # decode steps measured at each of the two positions


def build_commit(commit: str, board: str = "hosted") -> Path:
    """The firmware of `commit` for `board`: its tree exported by git archive into build/bench/<hash>, built there."""
    found = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"], cwd=ROOT,
                           capture_output=True, text=True)
    if found.returncode != 0:
        raise SystemExit(f"bench_kernels: --against {commit}: no such commit")
    sha = found.stdout.strip()
    tree = ROOT / "build" / "bench" / f"tree-{sha[:12]}"
    if not (tree / "SConstruct").exists():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", sha], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    subprocess.run([sys.executable, "-m", "SCons", "-Q", f"board={board}"], cwd=tree, check=True, stdout=subprocess.DEVNULL)
    return tree / "build" / board / "release" / "firmware.elf"


def attention_image(tmp: Path, kv: str) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import TinyConfig, make_checkpoint
    from colibri.pack import pack

    ckpt = tmp / "attention"
    if not (ckpt / "config.json").exists():
        make_checkpoint(TinyConfig("attention", vocab=512, hidden=512, ffn=128, layers=2, heads=8, kv_heads=8, experts=4,
                                   top_k=2, seed=11), ckpt, max_position_embeddings=4096)
    image = tmp / f"attention-{kv}.img"
    pack(ckpt, image, 2 * ATTENTION_PROMPT + 2 * ATTENTION_DECODE + 8, 64, kv=kv, measure_quality=False)
    return image


def attention_run(firmware: Path, image: Path, threads: int) -> dict[str, float]:
    """One run: milliseconds of the 1,024-token pass, and per decode step at ~1k and ~2k (device clock)."""
    import numpy as np
    from colibri.flash import threads_args
    from colibri.protocol import Client, Sampling
    from colibri.sim.boards import load_board
    from colibri.sim.launch import start_board

    rng = np.random.default_rng(5)
    prompt = [int(t) for t in rng.integers(3, 512, ATTENTION_PROMPT)]
    stream = [int(t) for t in rng.integers(3, 512, 2 * ATTENTION_DECODE)]
    board = load_board("hosted")
    with start_board(board, firmware, image, threads_args(board, threads)) as device:
        client = Client(device.link, timeout=600)
        hz = client.info().cycle_hz
        client.open()
        client.start(Sampling())
        prefill = client.feed_all(prompt)
        near_1k = sum(client.feed([t])[1] for t in stream[:ATTENTION_DECODE])
        client.feed_all(prompt[:ATTENTION_PROMPT - ATTENTION_DECODE])
        near_2k = sum(client.feed([t])[1] for t in stream[ATTENTION_DECODE:])
        client.quit()
    ms = 1000.0 / hz
    return {"prefill_1024_ms": prefill * ms, "decode_1k_ms": near_1k * ms / ATTENTION_DECODE,
            "decode_2k_ms": near_2k * ms / ATTENTION_DECODE}


def attention(rounds: int, against: str | None, threads: int) -> list[dict]:
    builds = {"this tree": scons("hosted") / "firmware.elf"}
    if against:
        builds = {against: build_commit(against), **builds}
    samples: dict[tuple[str, str], list[dict[str, float]]] = {}
    work = ROOT / "build" / "bench"
    images = {kv: attention_image(work, kv) for kv in ("f32", "f16")}
    for r in range(rounds):
        order = list(builds.items()) if r % 2 == 0 else list(builds.items())[::-1]  # alternated: the same machine
        for kv, image in images.items():
            for name, fw in order:
                run = attention_run(fw, image, threads)
                samples.setdefault((name, kv), []).append(run)
                print(f"  round {r + 1} {name:12} kv {kv}: " + ", ".join(f"{k} {v:.1f}" for k, v in run.items()),
                      file=sys.stderr, flush=True)
    records = []
    for (name, kv), runs in samples.items():
        rec = {"part": "attention", "build": name, "kv": kv, "threads": threads, "rounds": len(runs)}
        for key in runs[0]:
            vals = [run[key] for run in runs]
            rec[key] = {"median": round(statistics.median(vals), 2), "min": round(min(vals), 2), "max": round(max(vals), 2)}
        records.append(rec)
    return records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("hosted", "icount", "attention", "all"), default="all",
                    help="all: hosted and icount (attention only by name)")
    ap.add_argument("--mib", type=int, default=512, help="weight bytes per matrix in MiB (default 512)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="runs of the hosted benchmark (each 7 timed repeats), or of each attention build")
    ap.add_argument("--tokens", type=int, default=8, help="generated tokens per icount run")
    ap.add_argument("--against", metavar="COMMIT",
                    help="attention, icount: that commit's build beside this tree's")
    ap.add_argument("--boards", default=",".join(ICOUNT_BOARDS), help="icount: boards, comma-separated")
    ap.add_argument("--dtypes", default=",".join(ICOUNT_DTYPES), help="icount: image dtypes, comma-separated")
    ap.add_argument("--threads", type=int, default=1, help="attention: the hosted board's threads (default 1)")
    ap.add_argument("--json", type=Path, help="write the records here")
    args = ap.parse_args(argv)
    if args.against and args.part not in ("attention", "icount"):
        ap.error("--against is for --part attention or icount")
    records: list[dict] = []
    load = idle_check()
    print(f"load average before: {load:.2f} (an idle 2-core machine shows < 0.3)")
    if args.part in ("hosted", "all"):
        recs = hosted(args.mib, args.rounds)
        records += recs
        print(f"\nhosted, one thread, {args.mib} MiB of weights per matrix, median of {args.rounds} rounds (min-max)")
        print(f"  {'what':14} {'kernels':8} {'GB/s':>8} {'min-max':>15} {'of triad':>9} {'in L2 GB/s':>11}")
        for r in recs:
            hot = f"{r['in_cache_gbps_median']:11.2f}" if "in_cache_gbps_median" in r else f"{'-':>11}"
            print(f"  {r['what']:14} {r['kernels']:8} {r['gbps_median']:8.2f} "
                  f"{r['gbps_min']:7.2f}-{r['gbps_max']:<7.2f} {r['of_triad']:8.0%} {hot}")
    if args.part in ("icount", "all"):
        print("\ninstructions per token under QEMU -icount (shift=0), scalar build over SIMD build:")
        records += icount(args.tokens, tuple(args.boards.split(",")), tuple(args.dtypes.split(",")), args.against)
    if args.part == "attention":
        recs = attention(args.rounds, args.against, args.threads)
        records += recs
        print(f"\nattention, hosted, {args.threads} thread(s), 8 heads of 64: median of {args.rounds} rounds (min-max), ms")
        print("| build | KV | 1,024-token prompt | decode step at ~1k | decode step at ~2k |")
        print("| --- | --- | --- | --- | --- |")
        for r in recs:
            cells = " | ".join(f"{r[k]['median']:.2f} ({r[k]['min']:.2f}-{r[k]['max']:.2f})"
                               for k in ("prefill_1024_ms", "decode_1k_ms", "decode_2k_ms"))
            print(f"| {r['build']} | {r['kv']} | {cells} |")
    records.append({"part": "machine", "load_average_before": load, "load_average_after": idle_check()})
    print(f"load average after: {records[-1]['load_average_after']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
