"""Today's bits, pinned: for every family configuration of tests/test_families.py, every weight dtype and both KV
cache dtypes, the SHA-256 of every step's logits, kept in tests/golden/logits.json and keyed by the checkpoint
(a digest of its tensors) and the pack options, never by the image's bytes. A change of the image format or a
rewrite of the runtime and the reference together (issue 28) must leave every digest as it is.

Each configuration runs on the hosted build's library with its fastest kernels and with the scalar ones, with
and without a prefill batch: the four runs must give one digest. tests/test_golden_boards.py holds the QEMU boards
to the same digests (22 of the configurations, every family once; all of them with COLIBRI_GOLDEN_FULL=1).

The checkpoints' values come from numpy's generator seeded by the family's name (conftest.numpy_values); the file
keeps each checkpoint's digest and the library versions it was made with, so a checkpoint made differently is
named as such, never mistaken for changed logits. To write the file again after a deliberate change of the bits:
COLIBRI_UPDATE_GOLDEN=1 pytest tests/test_golden.py, at a commit whose bits are the intended ones (and say why in
the commit)."""
from __future__ import annotations

import hashlib
import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file

from capi import Context, Lib, Options
from conftest import ROOT, build, make_family_checkpoint
from test_families import FAMILIES, SMALL
from colibri.pack import pack
from colibri.quant import DType

GOLDEN = ROOT / "tests" / "golden" / "logits.json"
DTYPES = ("f32", "f16", "bf16", "q8_0", "q4_0")
KV = ("f32", "f16")
PROMPT = np.random.default_rng(3).integers(0, SMALL["vocab_size"], 12).tolist()  # fed in one call
AFTER = np.random.default_rng(4).integers(0, SMALL["vocab_size"], 8).tolist()    # then one at a time


def checkpoint_digest(ckpt: Path) -> str:
    """SHA-256 of a checkpoint's tensors (names, dtypes, shapes and values; not the file's bytes, which carry
    metadata)."""
    h = hashlib.sha256()
    for path in sorted(ckpt.glob("*.safetensors")):
        tensors = load_file(str(path))
        for name in sorted(tensors):
            t = np.ascontiguousarray(tensors[name])
            h.update(f"{name} {t.dtype} {t.shape}\n".encode())
            h.update(t.tobytes())
    return h.hexdigest()[:16]


def steps_digest(rows: list[np.ndarray]) -> str:
    """SHA-256 of the logits of every step, in order."""
    h = hashlib.sha256()
    for row in rows:
        h.update(np.ascontiguousarray(row, np.float32).tobytes())
    return h.hexdigest()


def run_steps(lib: Lib, image: bytes, options: Options | None) -> list[np.ndarray]:
    """PROMPT in one feed (one pass, or passes of the prefill batch), then AFTER a token a feed: the logits after
    each feed."""
    ctx = Context(lib, image, options=options)
    assert ctx.open_status == 0
    assert (ctx.stats().prefill_batch > 1) == (options is not None)  # the batch was taken (no longer than a window)
    assert ctx.feed(PROMPT) == 0
    rows = [ctx.logits()]
    for tok in AFTER:
        assert ctx.feed([tok]) == 0
        rows.append(ctx.logits())
    return rows


def compare(want: dict, got: dict) -> list[str]:
    """What differs between the pinned digests and this run's ({"checkpoints": name -> digest, "logits": key ->
    digest}): a checkpoint made differently (its logits cannot be compared), then one line per configuration
    changed, missing from the file or no longer in the matrix."""
    lines = [f"checkpoint {name} is not the one pinned (numpy, torch or transformers, or its config in FAMILIES, "
             "changed): pin again at a commit before your change" for name in sorted(want["checkpoints"])
             if name in got["checkpoints"] and got["checkpoints"][name] != want["checkpoints"][name]]
    if lines:
        return lines
    w, g = want["logits"], got["logits"]
    lines = [f"{key}: logits changed" for key in sorted(w.keys() & g.keys()) if w[key] != g[key]]
    lines += [f"{key}: not pinned (COLIBRI_UPDATE_GOLDEN=1 to add it)" for key in sorted(g.keys() - w.keys())]
    lines += [f"{key}: pinned but no longer run" for key in sorted(w.keys() - g.keys())]
    return lines


@dataclass(frozen=True)
class GoldenImage:
    family: str
    key: str    # the configuration's key in the file's "logits"
    path: Path


def golden_key(family: str, dtype: str, kv: str) -> str:
    return f"{family} dtype={dtype} kv={kv} max_seq=32"


def golden_images(base: Path, only: set[str] | None = None) -> tuple[dict[str, str], list[GoldenImage]]:
    """Every configuration (or those whose keys are in `only`) packed under `base`: the checkpoints' digests
    (family -> digest) and the images."""
    checkpoints, images = {}, []
    for name, arch, cfg in FAMILIES:
        seed = zlib.crc32(name.encode())  # its name's: a family added anywhere in the list moves no other's
        ckpt = make_family_checkpoint(arch, cfg, seed, base / name, portable=True)
        checkpoints[name] = checkpoint_digest(ckpt)
        for dtype in DTYPES:
            for kv in KV:
                if only is not None and golden_key(name, dtype, kv) not in only:
                    continue
                image = base / f"{name}-{dtype}-{kv}.img"
                pack(ckpt, image, max_seq=32, expert_align=64, dtype=DType.parse(dtype), kv=kv, measure_quality=False)
                images.append(GoldenImage(name, golden_key(name, dtype, kv), image))
    return checkpoints, images


def pinned() -> dict:
    return json.loads(GOLDEN.read_text())


@pytest.fixture(scope="module")
def digests(tmp_path_factory, hosted_build) -> dict:
    libs = [Lib(hosted_build / "libcolibri.so"), Lib(build("hosted", kernels="scalar") / "libcolibri.so")]
    checkpoints, images = golden_images(tmp_path_factory.mktemp("golden"))
    out: dict = {"versions": {m.__name__: m.__version__ for m in (np, torch, transformers)},
                 "checkpoints": checkpoints, "logits": {}}
    for image in images:
        data = image.path.read_bytes()
        runs = {steps_digest(run_steps(lib, data, options))
                for lib in libs for options in (None, Options(prefill_batch=5))}
        assert len(runs) == 1, f"{image.key}: kernel sets or the prefill batch disagree"
        out["logits"][image.key] = runs.pop()
    return out


def test_every_configuration_keeps_its_bits(digests):
    if os.environ.get("COLIBRI_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps({k: dict(sorted(v.items())) for k, v in digests.items()}, indent=1) + "\n")
    want = pinned()
    assert len(digests["logits"]) == len(FAMILIES) * len(DTYPES) * len(KV)
    problems = compare(want, digests)
    assert not problems, "\n".join(problems[:20]) + f"\n({len(problems)} in all)"


def test_the_comparison_sees_a_bit_a_new_and_a_dropped_configuration():
    """The check itself can fail: one flipped bit of one logit changes a digest, a configuration added to or dropped
    from the matrix is named, and a checkpoint made differently is named before any of its logits."""
    rows = [np.linspace(-1, 1, 7, dtype=np.float32) for _ in range(3)]
    flipped = [r.copy() for r in rows]
    flipped[2].view(np.uint32)[4] ^= 1
    ckpts = {"m": "1234"}
    want = {"checkpoints": ckpts, "logits": {"a": steps_digest(rows), "gone": "0"}}
    got = {"checkpoints": ckpts, "logits": {"a": steps_digest(flipped), "new": steps_digest(rows)}}
    assert compare(want, got) == ["a: logits changed", "new: not pinned (COLIBRI_UPDATE_GOLDEN=1 to add it)",
                                  "gone: pinned but no longer run"]
    same = {"checkpoints": ckpts, "logits": {"a": want["logits"]["a"]}}
    assert compare(same, same) == []
    assert compare(same, {"checkpoints": {"m": "5678"}, "logits": same["logits"]})[0].startswith(
        "checkpoint m is not the one pinned")
