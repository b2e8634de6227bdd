#!/usr/bin/env python3
"""Train the shipped demo model: a small Mixtral-architecture MoE that adds 3-digit numbers.

A problem is written `^123+045=` and the model answers the sum's four digits least significant
first, then `$`: 123 + 45 = 168 -> `8610$` (reversed digits let a small model carry the way a
person does, right to left). Training is seeded and runs on the CPU in a few minutes; problems
with (a * 1000 + b) % 97 == 0 are never trained on and form the held-out set.

Examples:
  python tools/train_demo.py                       # writes models/demo-adder
  python tools/train_demo.py --steps 200 -o /tmp/d # a quick smoke run
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from colibri.demo_task import (ANSWER_LEN, PROMPT_LEN, VOCAB, encode_problem, held_out,  # noqa: E402
                            tokenizer_json)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--output", type=Path, default=ROOT / "models" / "demo-adder")
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args(argv)

    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    config = MixtralConfig(
        vocab_size=len(VOCAB), hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=32,
        rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=VOCAB.index("^"), eos_token_id=VOCAB.index("$"),
        pad_token_id=None, router_aux_loss_coef=0.01, output_router_logits=True,
    )
    model = MixtralForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.steps, pct_start=0.05)
    gen = torch.Generator().manual_seed(args.seed)

    def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        a = torch.randint(0, 1000, (n * 2,), generator=gen)
        b = torch.randint(0, 1000, (n * 2,), generator=gen)
        keep = [(int(x), int(y)) for x, y in zip(a, b) if not held_out(int(x), int(y))][:n]
        seqs = torch.tensor([encode_problem(x, y, with_answer=True) for x, y in keep])
        labels = seqs.clone()
        labels[:, :PROMPT_LEN] = -100  # learn the answer only
        return seqs, labels

    start = time.time()
    model.train()
    for step in range(args.steps):
        seqs, labels = batch(args.batch)
        out = model(input_ids=seqs, labels=labels)
        opt.zero_grad()
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 200 == 0 or step == args.steps - 1:
            print(f"step {step:5d}  loss {out.loss.item():.4f}  {time.time() - start:6.1f}s", flush=True)

    model.eval()
    model.config.output_router_logits = False
    args.output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.output)
    (args.output / "generation_config.json").unlink(missing_ok=True)
    (args.output / "tokenizer.json").write_text(tokenizer_json())
    (args.output / "TRAINING.json").write_text(json.dumps({
        "task": "3-digit addition, answer digits reversed", "steps": args.steps, "batch": args.batch,
        "lr": args.lr, "seed": args.seed, "seconds": round(time.time() - start, 1),
        "prompt_len": PROMPT_LEN, "answer_len": ANSWER_LEN,
    }, indent=2) + "\n")
    print(f"saved {args.output} after {time.time() - start:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
