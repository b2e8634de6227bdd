#!/usr/bin/env python3
"""Routing report from a traced run: which experts are hot, which never fire, how spread the gates are.

Reads the JSON that `colibri run --trace-out` writes and produces, next to --out PREFIX:
  PREFIX-usage.png     expert usage heatmap (layers x experts, share of routed slots)
  PREFIX-entropy.png   routing entropy of the top-k gate weights per layer (mean and spread)
and prints a text summary (or one JSON object with --json).

Examples:
  colibri run model.img --prompt-tokens 1,2,3,4 --max-new-tokens 32 --trace-out trace.json
  colibri report trace.json --out report
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from colibri.console import Parser
from colibri.inputs import output_problem


def analyse(trace: dict) -> dict:
    """Usage counts [layer, expert] and per-token entropies [layer] -> list, from a trace."""
    n_layers, n_experts = trace["n_layers"], trace["n_experts"]
    usage = np.zeros((n_layers, max(n_experts, 1)), dtype=np.int64)
    entropy: list[list[float]] = [[] for _ in range(n_layers)]
    cycles = np.zeros((n_layers, 3), dtype=np.float64)  # attention, routing, ffn
    for tok in trace["trace"]:
        for layer in tok["layers"]:
            i = layer["layer"]
            cycles[i] += (layer["cycles_attention"], layer["cycles_router"], layer["cycles_ffn"])
            if not layer["experts"]:
                continue
            usage[i, layer["experts"]] += 1
            w = np.asarray(layer["weights"], dtype=np.float64)
            p = w / w.sum()
            entropy[i].append(float(-(p * np.log2(np.clip(p, 1e-12, None))).sum()))
    moe_layers = [i for i in range(n_layers) if entropy[i]]
    hot, cold = {}, {}
    for i in moe_layers:
        share = usage[i] / usage[i].sum()
        fair = 1.0 / n_experts
        hot[i] = [int(e) for e in np.nonzero(share >= 2 * fair)[0]]
        cold[i] = [int(e) for e in np.nonzero(usage[i] == 0)[0]]
    return {"usage": usage, "entropy": entropy, "moe_layers": moe_layers, "hot": hot, "never": cold,
            "cycles": cycles, "tokens": len(trace["trace"]), "top_k": trace["top_k"]}


def plot(a: dict, prefix: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = a["moe_layers"]
    usage = a["usage"][layers]
    share = usage / np.maximum(usage.sum(axis=1, keepdims=True), 1)
    fig, ax = plt.subplots(figsize=(max(4, 0.5 * usage.shape[1] + 2), max(3, 0.35 * len(layers) + 1.5)))
    im = ax.imshow(share, aspect="auto", cmap="viridis")
    ax.set_xlabel("expert")
    ax.set_ylabel("layer")
    ax.set_yticks(range(len(layers)), [str(i) for i in layers])
    ax.set_title(f"expert usage ({a['tokens']} tokens, top-{a['top_k']})")
    fig.colorbar(im, ax=ax, label="share of routed slots")
    fig.tight_layout()
    usage_png = prefix.with_name(prefix.name + "-usage.png")
    fig.savefig(usage_png, dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    data = [a["entropy"][i] for i in layers]
    ax.boxplot(data, positions=range(len(layers)))
    ax.plot(range(len(layers)), [np.mean(d) for d in data], "o-", label="mean")
    ax.axhline(np.log2(a["top_k"]), color="grey", linestyle="--", label=f"uniform over top-{a['top_k']}")
    ax.set_xticks(range(len(layers)), [str(i) for i in layers])
    ax.set_xlabel("layer")
    ax.set_ylabel("entropy of the top-k gate weights (bits)")
    ax.legend()
    fig.tight_layout()
    entropy_png = prefix.with_name(prefix.name + "-entropy.png")
    fig.savefig(entropy_png, dpi=120)
    plt.close(fig)
    return [usage_png, entropy_png]


def main(argv: list[str] | None = None) -> int:
    ap = Parser(__doc__)
    ap.add_argument("trace", type=Path, help="JSON written by colibri run --trace-out")
    ap.add_argument("--out", type=Path, default=Path("routing"), help="prefix of the PNG files (default: routing)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.out.is_dir():  # a prefix, not a folder: /tmp would write /tmp-usage.png
        return ap.fail(f"--out {args.out} is a directory: --out takes a prefix of the PNG files, such as "
                       f"{args.out / 'routing'}")
    problem = output_problem(args.out, "--out")  # its folder: there, or the PNGs are lost after the work
    if problem:
        return ap.fail(problem)
    try:
        trace = json.loads(args.trace.read_text())
    except (OSError, ValueError) as exc:  # ValueError: not JSON, or not text at all
        return ap.fail(f"cannot read {args.trace} as a trace: {exc}; make one with colibri run --trace-out")
    missing = [k for k in ("n_layers", "n_experts", "top_k", "trace") if not isinstance(trace, dict) or k not in trace]
    if missing:
        return ap.fail(f"{args.trace} is not a trace (no {', '.join(missing)}); make one with "
                       "colibri run --trace-out")
    if not trace["n_experts"]:
        return ap.fail("this model has no experts: nothing is routed")
    try:
        a = analyse(trace)
    except (KeyError, TypeError, IndexError, ValueError) as exc:
        return ap.fail(f"{args.trace} is not a trace colibri run wrote ({type(exc).__name__}: {exc}); make "
                       "one with colibri run --trace-out")
    pngs = plot(a, args.out)
    summary = {
        "tokens": a["tokens"], "moe_layers": a["moe_layers"],
        "hot_experts": {str(k): v for k, v in a["hot"].items()},
        "never_fired": {str(k): v for k, v in a["never"].items()},
        "mean_entropy_bits": {str(i): float(np.mean(a["entropy"][i])) for i in a["moe_layers"]},
        "cycles_share": dict(zip(("attention", "routing", "ffn"), (a["cycles"].sum(axis=0) / a["cycles"].sum()).tolist())),
        "plots": [str(p) for p in pngs],
    }
    if args.json:
        print(json.dumps(summary))
        return 0
    print(f"{a['tokens']} tokens, {len(a['moe_layers'])} MoE layers, top-{a['top_k']} of {trace['n_experts']} experts")
    for i in a["moe_layers"]:
        use = a["usage"][i]
        print(f"  layer {i:>3}: usage {' '.join(f'{u:>4}' for u in use)} | hot {a['hot'][i] or '-'} | "
              f"never fired {a['never'][i] or '-'} | entropy {np.mean(a['entropy'][i]):.2f} bits")
    share = summary["cycles_share"]
    print(f"cycles: attention {share['attention']:.0%}, routing {share['routing']:.0%}, ffn {share['ffn']:.0%}")
    print("plots: " + ", ".join(summary["plots"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
