#!/usr/bin/env python3
"""Expert cache sweep (docs/STREAMING.md): cache size and policy against hit rate, bytes fetched per
token and modeled time per token for a named flash bandwidth, on the demo model and a larger one.

  python tools/bench_experts.py                          # hosted board, table + docs/img/expert_cache.png
  python tools/bench_experts.py --board cortex_m55 --json
  python tools/bench_experts.py --bandwidth QSPI=50e6 --bandwidth SD=20e6 --tokens 32

Policies: LRU alone; LRU with the one-layer-ahead prefetch; LRU on an image whose hottest quarter of
the experts (from a calibration run on another prompt, as pack.py --pin-from does) is pinned resident.
Every run is checked against the resident run of the same image: the same tokens, or the sweep stops.
The modeled time is compute + bytes fetched / bandwidth, with compute the resident run's measured time
per token on this board: a synchronous fetch hook, no overlap (an asynchronous one hides up to the
compute time). Figures from one run on a noisy machine: compare rows, not runs.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Callable

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from colibri.flash import run_on_board, streaming_args, trace_report  # noqa: E402
from colibri.image import read_image  # noqa: E402
from colibri.pack import hot_experts, pack  # noqa: E402
from colibri.protocol import Client, Sampling  # noqa: E402
from colibri.sim.boards import load_board  # noqa: E402
from colibri.sim.launch import start_board  # noqa: E402
from colibri.quant import DType  # noqa: E402
from colibri.synthetic import moe_dims, random_image  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BANDWIDTHS = {"QSPI 50 MB/s": 50e6, "SD 20 MB/s": 20e6}


Builder = Callable[[frozenset], Path]  # pinned (layer, expert) pairs -> image file


def models(tmp: Path) -> dict[str, Builder]:
    """The shipped demo model (f32, 8 experts) and a larger random one (Q8_0, 4 layers x 32 experts),
    each buildable with a pinned set."""
    def demo(pinned: frozenset) -> Path:
        path = tmp / f"demo-{len(pinned)}.img"
        pack(ROOT / "models" / "demo-adder", path, max_seq=32, expert_align=4096, measure_quality=False, pinned=pinned)
        return path

    def large(pinned: frozenset) -> Path:
        path = tmp / f"large-{len(pinned)}.img"
        dims = moe_dims(hidden=256, ffn=512, experts=32, layers=4, max_seq=64)
        path.write_bytes(random_image(dims, DType.Q8_0, seed=3, pinned=pinned))
        return path
    return {"demo-adder (f32)": demo, "random 4x32 experts (q8_0)": large}


def prompt_for(vocab: int, salt: int) -> list[int]:
    return [1 + (7 * i + salt) % (vocab - 1) for i in range(8)]


def hot_set(path: Path, board: str, tokens: int) -> frozenset:
    """A quarter of the routed experts (at least top_k per layer): the ones a calibration run on another
    prompt routed to most (pack.py --pin-from's choice)."""
    img = read_image(path.read_bytes())
    prompt = prompt_for(img.dims.vocab_size, salt=3)
    traced = run_on_board(path, board, prompt, tokens, Sampling(), False, trace=True)
    moe_layers = sum(img.dims.moe_layers)
    count = max(img.dims.top_k * moe_layers, moe_layers * img.dims.n_experts // 4)
    return hot_experts(trace_report(traced, prompt, path), count)


def cache_sizes(top_k: int, streamed: int) -> list[int]:
    sizes, n = [], top_k
    while n < streamed:
        sizes.append(n)
        n *= 2
    return sizes + [streamed]


def sweep(build: Builder, board: str, tokens: int, bandwidths: dict[str, float]) -> list[dict]:
    path = build(frozenset())
    img = read_image(path.read_bytes())
    prompt = prompt_for(img.dims.vocab_size, salt=0)
    greedy = Sampling()
    resident = run_on_board(path, board, prompt, tokens, greedy, False)
    hz = resident.stats["cycle_hz"] or 1
    compute_s = resident.stats["cycles_total"] / hz / resident.stats["tokens_fed"]
    pinned_path = build(hot_set(path, board, tokens))
    rows = []
    runs = [(path, "lru", False), (path, "lru+prefetch", True), (pinned_path, "lru+pinned", False)]
    for image_path, policy, prefetch in runs:
        pinned_img = read_image(image_path.read_bytes())
        for slots in cache_sizes(img.dims.top_k, len(pinned_img.streamed_experts())):
            run = run_on_board(image_path, board, prompt, tokens, greedy, False, expert_cache=slots,
                               prefetch=prefetch)
            if run.tokens != resident.tokens:
                raise SystemExit(f"bench_experts: {slots} slots gave other tokens than the resident run: a bug")
            s, n = run.stats, run.stats["tokens_fed"]
            routed = s["expert_hits"] + s["expert_misses"]
            per_token = s["expert_bytes_fetched"] / n
            rows.append({
                "slots": slots, "policy": policy, "resident_bytes": pinned_img.resident_bytes,
                "cache_bytes": s["arena_bytes"] - img.header["arena_bytes"],
                "hit_rate": s["expert_hits"] / routed, "bytes_per_token": per_token,
                "prefetch_accuracy": s["prefetch_used"] / s["prefetch_issued"] if s["prefetch_issued"] else None,
                "measured_s_per_token": s["cycles_total"] / hz / n,
                "fetch_wait_s_per_token": s["cycles_fetch_wait"] / hz / n,
                "modeled_s_per_token": {name: compute_s + per_token / bw for name, bw in bandwidths.items()},
            })
    return [{"resident_s_per_token": compute_s, "image_bytes": len(path.read_bytes()),
             "resident_bytes": img.resident_bytes, "expert_block_bytes": img.expert_block_bytes}] + rows


def hosted_memory(path: Path, slots: int, tokens: int, copy: bool = False) -> dict:
    """The hosted board process's resident memory after a run (Linux /proc): with an expert cache the
    expert part is read through madvise'd copies, so what stays resident is the resident part, the
    arena (plan + cache) and the program, not the image. Without one the image is a mapping of the file
    (file-backed), or with `copy` a private copy (anonymous)."""
    img = read_image(path.read_bytes())
    prompt = [1 + (7 * i) % (img.dims.vocab_size - 1) for i in range(8)]
    board = load_board("hosted")
    with start_board(board, board.firmware(), path, streaming_args(board) if slots else ["--copy"] if copy else None) as device:
        client = Client(device.link)
        client.info()
        opened = client.open(slots, True)
        client.run(prompt, tokens, Sampling())
        status = dict(line.split(":", 1) for line in Path(f"/proc/{device.proc.pid}/status").read_text().splitlines())
        client.quit()
    kib = {k: int(status[k].split()[0]) * 1024 for k in ("VmRSS", "RssAnon", "RssFile")}
    return {"slots": slots, "copy": copy, "image_bytes": len(path.read_bytes()), "resident_bytes": img.resident_bytes,
            "arena_bytes": opened.arena_bytes, "rss": kib["VmRSS"], "rss_anon": kib["RssAnon"],
            "rss_file": kib["RssFile"]}


def plot(results: dict[str, list[dict]], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax_hit, ax_bytes) = plt.subplots(1, 2, figsize=(11, 4))
    for model, res in results.items():
        for policy in ("lru", "lru+prefetch", "lru+pinned"):
            rows = [r for r in res[1:] if r["policy"] == policy]
            x = [r["slots"] for r in rows]
            ax_hit.plot(x, [r["hit_rate"] for r in rows], marker="o", label=f"{model}, {policy}")
            ax_bytes.plot(x, [r["bytes_per_token"] for r in rows], marker="o", label=f"{model}, {policy}")
    for ax, title in ((ax_hit, "hit rate"), (ax_bytes, "bytes fetched per token")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("expert cache slots")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    ax_bytes.set_yscale("log")
    ax_hit.legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def parse_bandwidth(text: str) -> tuple[str, float]:
    name, _, value = text.partition("=")
    try:
        return name, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME=BYTES_PER_SECOND, e.g. QSPI=50e6, got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--board", default="hosted", help="board to run on (default hosted)")
    ap.add_argument("--tokens", type=int, default=24, help="tokens generated per run after an 8-token prompt")
    ap.add_argument("--bandwidth", type=parse_bandwidth, action="append", metavar="NAME=BYTES_PER_S",
                    help="a slow-memory bandwidth to model (repeatable; default QSPI 50 MB/s and SD 20 MB/s)")
    ap.add_argument("--plot", type=Path, default=ROOT / "docs" / "img" / "expert_cache.png", help="plot file")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args(argv)
    bandwidths = dict(args.bandwidth) if args.bandwidth else DEFAULT_BANDWIDTHS
    with tempfile.TemporaryDirectory() as tmp:
        builders = models(Path(tmp))
        results = {name: sweep(build, args.board, args.tokens, bandwidths) for name, build in builders.items()}
        large = builders["random 4x32 experts (q8_0)"](frozenset())
        memory = [hosted_memory(large, 0, args.tokens, copy=True)] + [hosted_memory(large, slots, args.tokens)
                                                                       for slots in (0, 4, 16)]
    plot(results, args.plot)
    if args.json:
        print(json.dumps({"board": args.board, "bandwidths": bandwidths, "results": results,
                          "hosted_memory": memory}))
        return 0
    for model, res in results.items():
        head = res[0]
        print(f"\n{model} on {args.board}: image {head['image_bytes']:,} B, resident {head['resident_bytes']:,} B, "
              f"slot {head['expert_block_bytes']:,} B, resident run {head['resident_s_per_token'] * 1e3:.3f} ms/token")
        names = list(bandwidths)
        print(f"{'slots':>5} {'policy':<13} {'resident B':>11} {'cache B':>11} {'hit rate':>8} {'B/token':>11} {'prefetch ok':>11} "
              f"{'ms/token':>9} " + " ".join(f"{n + ' ms':>14}" for n in names))
        for r in res[1:]:
            acc = f"{r['prefetch_accuracy']:.0%}" if r["prefetch_accuracy"] is not None else "-"
            print(f"{r['slots']:>5} {r['policy']:<13} {r['resident_bytes']:>11,} {r['cache_bytes']:>11,} {r['hit_rate']:>8.1%} "
                  f"{r['bytes_per_token']:>11,.0f} {acc:>11} {r['measured_s_per_token'] * 1e3:>9.3f} " +
                  " ".join(f"{r['modeled_s_per_token'][n] * 1e3:>14.2f}" for n in names))
    print("\nhosted board process memory after the run, random 4x32 experts (q8_0):")
    print(f"{'slots':>5} {'image B':>12} {'resident B':>12} {'arena B':>12} {'RSS B':>12} {'file B':>12} {'anon B':>12}")
    for m in memory:
        print(f"{m['slots'] or ('copy' if m['copy'] else 'none'):>5} {m['image_bytes']:>12,} {m['resident_bytes']:>12,} {m['arena_bytes']:>12,} "
              f"{m['rss']:>12,} {m['rss_file']:>12,} {m['rss_anon']:>12,}")
    print(f"\nplot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
