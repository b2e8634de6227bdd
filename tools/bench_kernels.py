#!/usr/bin/env python3
"""Kernel benchmarks (not tests): where each dtype's kernels stand against the memory bus and the
scalar code. Prints a table, writes JSON records with --json.

Two parts:
  hosted  single-thread matvec throughput per dtype and kernel set on a matrix far larger than the
          last-level cache, in GB/s of weights read (scales included), next to a STREAM-style triad
          measured by the same program (build/hosted/release/kernel_bench.elf); several rounds,
          medians with min-max. Beside it the same kernel on 512 KiB of the matrix, which stays in
          the 2nd-level cache: what the kernel computes at when memory is no limit.
  icount  instructions per generated token under QEMU with -icount (the boards' cycle counters then
          count instructions), SIMD build vs `kernels=scalar` build, per board and dtype, on the
          demo model and a larger random one.

  python tools/bench_kernels.py --json bench.json              # both parts
  python tools/bench_kernels.py --part hosted --mib 1024 --rounds 5
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


def make_images(tmp: Path) -> dict[str, Path]:
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
        for dtype in ICOUNT_DTYPES:
            path = tmp / f"{model}-{dtype}.img"
            pack(src, path, 32, 64, dtype=DType.parse(dtype), measure_quality=False)
            images[f"{model} {dtype}"] = path
    return images


def icount(tokens: int) -> list[dict]:
    from colibri import flash
    from colibri.protocol import Sampling

    records = []
    with tempfile.TemporaryDirectory(prefix="colibri-bench-") as tmp:
        images = make_images(Path(tmp))
        for board in ICOUNT_BOARDS:
            builds = {"simd": scons(board) / "firmware.elf", "scalar": scons(board, "scalar") / "firmware.elf"}
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
                print(f"  {board:17} {name:18} scalar/simd = {records[-1]['scalar_over_simd']:.2f}", flush=True)
    return records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("hosted", "icount", "all"), default="all")
    ap.add_argument("--mib", type=int, default=512, help="weight bytes per matrix in MiB (default 512)")
    ap.add_argument("--rounds", type=int, default=3, help="runs of the hosted benchmark (each 7 timed repeats)")
    ap.add_argument("--tokens", type=int, default=8, help="generated tokens per icount run")
    ap.add_argument("--json", type=Path, help="write the records here")
    args = ap.parse_args(argv)
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
        records += icount(args.tokens)
    records.append({"part": "machine", "load_average_before": load, "load_average_after": idle_check()})
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
