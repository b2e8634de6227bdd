#!/usr/bin/env python3
"""Pack a Hugging Face checkpoint or a GGUF file into a Colibri image: Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE,
Llama, Qwen2, Qwen3, DeepSeek-V2/V3, gpt-oss, Gemma 4, Granite MoE, GLM-4.7-Flash, Qwen3.5-MoE, LFM2, LFM2-MoE.

Examples (in a checkout, `python host/pack.py ...` is the same command):
  colibri pack path/to/mixtral-checkpoint -o model.img --max-seq 256
  colibri pack models/demo-adder -o demo.img --max-seq 64 --board x86_64_baremetal
  colibri pack path/to/checkpoint -o model.img --dtype q4_0 --keep output --keep 'blk.*.attn_*=q8_0'
  colibri pack qwen2-moe-q8_0.gguf -o model.img --dtype q8_0
  colibri pack path/to/checkpoint -o model.img --dtype q4_0 --pin-from trace.json --pin 16

--dtype sets the dtype of the large matrices (attention, experts, shared experts, dense MLPs, the token
embedding and the output matrix, which --dtype q4_0 keeps at q8_0 as llama.cpp's Q4_0 files do); norms,
biases, routers and the shared-expert gate stay f32. A tied embedding takes the wider of the two choices.
--keep NAME_GLOB[=DTYPE] stores the matching large matrices in that dtype (f32 unless one is given); names are
llama.cpp's: token_embd, output, blk.N.attn_q, blk.N.ffn_gate_exps.E (expert E), blk.N.ffn_down_shexp.
When some tensor is not f32 (or --kv f16), the report shows what that costs on a calibration prompt
against the f32 image of the same checkpoint.

--board checks that the image and its work arena fit the board's memory before anything is converted; when
they do not, the error says what does: the largest --max-seq, --kv f16, a narrower --dtype.

The image has two tiers (docs/FORMAT.md): a resident part (everything but the routed experts) and an
expert part that a board can stream from slow memory (colibri run --expert-cache). --pin-from/--pin move the
experts a calibration trace routed to most into the resident part.
"""
from __future__ import annotations

import fnmatch
import json
import sys
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
from tqdm import tqdm

from colibri.console import Parser
from colibri.checkpoint import Checkpoint, UnsupportedModel, load_checkpoint
from colibri.image import (KV_DTYPES, NO_INDEX, Image, ModelDims, Role, arena_bytes, entry_encoded, expert_blocks,
                           open_image, tensor_name)
from colibri.lazy import LazyTensor, OpenFile
from colibri.quant import Deferred, DType, Encoded, convert, fitted
from colibri.reference import Reference
from colibri.text import checkpoint_meta
from colibri.sim.boards import Board, board_names, fit_report, load_board, memory_region
from colibri.writer import ImagePlan, plan_image, write_plan

# The matrices --dtype applies to; everything else (norms, biases, routers, the shared-expert gate) stays f32.
LARGE = {Role.TOKEN_EMBD, Role.LM_HEAD, Role.WQ, Role.WK, Role.WV, Role.WO, Role.WQ_A, Role.WQ_B, Role.WKV_A,
         Role.WK_B, Role.WV_B, Role.DENSE_GATE, Role.DENSE_UP,
         Role.DENSE_DOWN, Role.SHARED_GATE, Role.SHARED_UP, Role.SHARED_DOWN, Role.EXPERT_GATE, Role.EXPERT_UP,
         Role.EXPERT_DOWN, Role.PLE_EMBD, Role.PLE_MODEL_PROJ, Role.PLE_GATE, Role.PLE_PROJ}
CALIBRATION_TOKENS = 32  # the quality report's prompt: this many seeded random token ids (fewer if max_seq is)
# The report warns past either bound. Q8_0 costs SmolLM2-135M a KL of 0.016 on this prompt (top-1 90.6%):
# ten times that is a loss worth a look, and so is a first choice that differs for one token in five.
# Requantizing its Q4_1 GGUF to q4_0 costs 0.81 (top-1 50% on real prompts; llama.cpp's own Q4_0 as much):
# the text changes.
LOSSY_KL = 0.15
LOSSY_TOP1 = 0.8


def human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    raise AssertionError


class DoesNotFit(ValueError):
    """The image or its arena is larger than the board's memory for it."""


# the dtypes a fit suggestion narrows the large matrices to, widest (least lossy) first
NARROWER = (DType.F16, DType.Q8_0, DType.Q4_0)


def parse_keep(spec: str) -> tuple[str, DType]:
    """'GLOB' or 'GLOB=DTYPE' (default f32)."""
    glob, _, dtype = spec.partition("=")
    return glob, DType.parse(dtype) if dtype else DType.F32


def value_bytes(dtype: DType | None) -> float:
    """Bytes per value stored: what makes one dtype wider than another (None, --dtype stored: at most f32's)."""
    return 4.0 if dtype is None else dtype.bytes_per_value


def dtype_flag(dtype: DType | None) -> str:
    """--dtype's word for a dtype (None: stored)."""
    return "stored" if dtype is None else dtype.name.lower()


def stored_dtype(t: object) -> DType | None:
    """The image dtype --dtype stored packs a checkpoint's tensor in (a GGUF file's: its own type's, or Q8_0 for a
    type no image has), or None (f32)."""
    return t.dtype if isinstance(t, Encoded) else t.kept if isinstance(t, LazyTensor) else None


def choose_dtype(role: Role, layer: int, expert: int, dtype: DType | None, keep: list[tuple[str, DType]],
                 stored: DType | None = None) -> DType:
    """A tensor's dtype: the first --keep glob matching its name, else --dtype for the large matrices (None,
    --dtype stored: the dtype a GGUF file stores it in where the image has it, Q8_0 for another quantized type, else
    f32) and f32 for everything
    else; but the output matrix at q8_0 when --dtype is q4_0, as llama.cpp's Q4_0 files keep it (the logits feel
    its rounding most), unless it is stored as Q4_0 already (widening those values gains nothing)."""
    if role not in LARGE:
        return DType.F32
    name = tensor_name(role, layer, expert)
    for glob, kept in keep:
        if fnmatch.fnmatchcase(name, glob):
            return kept
    if dtype is None:
        return stored if stored is not None else DType.F32
    if role == Role.LM_HEAD and dtype == DType.Q4_0 and stored != DType.Q4_0:
        return DType.Q8_0
    return dtype


def check_keep(tensors: dict, keep: list[tuple[str, DType]]) -> None:
    """Every --keep glob names at least one large matrix of the checkpoint (a ValueError saying what it matched,
    else): a glob that matched nothing, or only tensors every image keeps f32, would leave the pack as it was
    without a word."""
    names = [tensor_name(*key) for key in tensors]
    large = [tensor_name(*key) for key in tensors if key[0] in LARGE]
    for glob, _ in keep:
        if any(fnmatch.fnmatchcase(name, glob) for name in large):
            continue
        matched = [name for name in names if fnmatch.fnmatchcase(name, glob)]
        if matched:
            raise ValueError(f"--keep {glob!r} matches only tensors every image keeps f32 (norms, biases, routers: "
                             f"{', '.join(matched[:3])}); --keep chooses the dtype of the large matrices, such as "
                             f"{', '.join(large[:3])}")
        raise ValueError(f"--keep {glob!r} matches no tensor of this model; names are llama.cpp's, such as "
                         f"{', '.join(large[:3])}, {large[-1]}")


def repacked_image_bytes(img: Image, dtype: DType | None) -> int:
    """The exact size of the image that packing `img`'s checkpoint again with --dtype `dtype` (and no --keep) makes:
    the shapes of its table planned in the dtypes choose_dtype gives them (a tied tensor once, in the wider of its
    choices), with its pinned experts, expert alignment and metadata as they are. What `colibri run` suggests for a
    board whose image region it does not fit is sized by this, never guessed."""
    ties: dict[int, list] = {}
    for e in img.entries:
        ties.setdefault(e.offset, []).append(e)
    tensors = {}
    for tied in ties.values():
        want = max((fitted(choose_dtype(e.role, e.layer, e.expert, dtype, []), e.shape[-1]) for e in tied),
                   key=value_bytes)
        tensor = Deferred(want, tuple(tied[0].shape), lambda: None)
        for e in tied:
            tensors[(e.role, e.layer, e.expert)] = tensor
    pinned = frozenset((g.layer, g.expert) for g, _ in expert_blocks(img.entries)) - set(img.streamed_experts())
    return plan_image(img.dims, tensors, img.header["expert_align"], pinned, img.meta).image_bytes


def fallbacks(tensors: dict, dtype: DType | None, keep: list[tuple[str, DType]]) -> dict[tuple[str, str], tuple[set[int], int]]:
    """(the K-quant chosen, the type stored) -> (their row lengths, how many) of the matrices whose rows are not
    whole 256-element blocks and so take llama.cpp's fallback type (quant.fitted), a tied tensor counted once."""
    out: dict[tuple[str, str], set[int]] = {}
    seen: dict[int, tuple[str, str]] = {}
    for key, t in tensors.items():
        chosen = choose_dtype(*key, dtype, keep, stored_dtype(t))
        stored = fitted(chosen, t.shape[-1])
        if stored != chosen and id(t) not in seen:
            seen[id(t)] = pair = (chosen.name.lower(), stored.name.lower())
            out.setdefault(pair, set()).add(int(t.shape[-1]))
    return {pair: (cols, sum(p == pair for p in seen.values())) for pair, cols in out.items()}


def convert_tensors(tensors: dict, dtype: DType, keep: list[tuple[str, DType]]) -> dict:
    """Every tensor in its chosen dtype; tied tensors stay one object, in the widest dtype any of their keys
    chooses (a tied embedding is the output matrix too: `--keep token_embd=...` narrower than the output's
    choice does not narrow it). A tensor not yet read from its checkpoint (LazyTensor) is read and converted
    when the image is written."""
    wanted: dict[int, DType] = {}
    for key, t in tensors.items():
        want = fitted(choose_dtype(*key, dtype, keep, stored_dtype(t)), t.shape[-1])
        if id(t) not in wanted or value_bytes(want) > value_bytes(wanted[id(t)]):
            wanted[id(t)] = want
    done: dict[int, Encoded | Deferred] = {}
    out = {}
    for key, t in tensors.items():
        if id(t) not in done:
            want = wanted[id(t)]
            done[id(t)] = Deferred(want, t.shape, t.load) if isinstance(t, LazyTensor) else convert(t, want)
        out[key] = done[id(t)]
    return out


class OneTensorAtATime:
    """What the numpy reference reads of an image (dims, encoded(), tensor()) served by `load(role, layer,
    expert) -> Encoded` and let go when the next one is asked for: the reference over a model without the
    model in memory (with Reference(..., keep_weights=False))."""

    def __init__(self, dims: ModelDims, load: Callable[[Role, int, int], Encoded],
                 on_load: Callable[[], object] | None = None):
        self.dims, self._load, self._on_load = dims, load, on_load
        self._last: tuple[tuple[Role, int, int], Encoded] | None = None

    def encoded(self, role: Role, layer: int = NO_INDEX, expert: int = NO_INDEX) -> Encoded:
        key = (role, layer, expert)
        if self._last is None or self._last[0] != key:
            self._last = None  # the previous tensor goes before the next one is read
            self._last = (key, self._load(*key))
            if self._on_load:
                self._on_load()
        return self._last[1]

    def tensor(self, role: Role, layer: int = NO_INDEX, expert: int = NO_INDEX) -> np.ndarray:
        enc = self.encoded(role, layer, expert)
        return enc.values if enc.dtype == DType.F32 else enc.decode()


def quality(f32: OneTensorAtATime, packed: OneTensorAtATime) -> dict:
    """What the narrower dtypes cost: logits of the f32 model and of the packed image on the calibration
    prompt (numpy reference), each holding one weight at a time, its matrix products through BLAS (the bits of
    the device's products are not the question here)."""
    ref32, ref = Reference(f32, keep_weights=False, exact=False), Reference(packed, keep_weights=False, exact=False)
    n = min(CALIBRATION_TOKENS, ref.d.max_seq)
    prompt = np.random.default_rng(0).integers(0, ref.d.vocab_size, n)
    cost = logit_cost(ref32.forward(prompt), ref.forward(prompt))
    return {"tokens": int(n), **cost,
            "lossy": cost["kl_divergence"] > LOSSY_KL or cost["top1_agreement"] < LOSSY_TOP1}


def logit_cost(exact: np.ndarray, approx: np.ndarray) -> dict:
    """How far rows of logits `approx` are from `exact` (one row per position): max and mean |dlogit|, the mean
    KL(exact || approx) of their softmaxes in nats, and the share of rows whose first choice is the same."""
    a, b = exact.astype(np.float64), approx.astype(np.float64)
    delta = np.abs(a - b)

    def log_softmax(z: np.ndarray) -> np.ndarray:
        z = z - z.max(axis=-1, keepdims=True)
        return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    la, lb = log_softmax(a), log_softmax(b)
    return {"max_abs_dlogit": float(delta.max()), "mean_abs_dlogit": float(delta.mean()),
            "kl_divergence": float(np.mean(np.sum(np.exp(la) * (la - lb), axis=-1))),
            "top1_agreement": float(np.mean(a.argmax(-1) == b.argmax(-1)))}


def checkpoint_f32(dims: ModelDims, tensors: dict, on_load: Callable[[], object] | None = None) -> OneTensorAtATime:
    """The f32 image of a checkpoint's tensors, read from the checkpoint a tensor at a time, never written."""
    f32 = convert_tensors(tensors, DType.F32, [])
    return OneTensorAtATime(dims, lambda *key: f32[key].encoded() if isinstance(f32[key], Deferred) else f32[key],
                            on_load)


def written_image(path: Path, on_load: Callable[[], object] | None = None) -> OneTensorAtATime:
    """An image file's tensors, read from the file a tensor at a time (its table read once)."""
    img = open_image(path, check_crcs=False)
    entries = {(e.role, e.layer, e.expert): e for e in img.entries if e.shape}
    file = OpenFile(path)

    def load(*key) -> Encoded:
        e = entries[key]
        scales = file.read(e.scales_bytes, e.scales_offset) if e.scales_bytes else None
        return entry_encoded(e, file.read(e.nbytes, e.offset), scales)
    return OneTensorAtATime(img.dims, load, on_load)


def hot_experts(trace: dict, count: int) -> frozenset[tuple[int, int]]:
    """The `count` (layer, expert) pairs a calibration trace (colibri run --trace-out) routed to most often;
    ties go to the lower layer, then the lower expert."""
    uses: Counter[tuple[int, int]] = Counter()
    for token in trace.get("trace", []):
        for layer in token["layers"]:
            uses.update((layer["layer"], e) for e in layer["experts"])
    ranked = sorted(uses, key=lambda le: (-uses[le], le))
    return frozenset(ranked[:count])


@dataclass(frozen=True)
class Choice:
    """The options an image's sizes follow: what a fit suggestion may change."""
    max_seq: int
    kv: str
    dtype: DType | None  # None: --dtype stored

    def flags(self, asked: Choice) -> str:
        """The options that turn the `asked` packing into this one, as the user types them."""
        changes = ((self.dtype != asked.dtype, f"--dtype {dtype_flag(self.dtype)}"),
                   (self.max_seq != asked.max_seq, f"--max-seq {self.max_seq}"),
                   (self.kv != asked.kv, f"--kv {self.kv}"))
        return " ".join(flag for changed, flag in changes if changed)


class Packing:
    """One checkpoint as it would be packed under any Choice, sized before a tensor is converted: the image by the
    plan write_plan then follows (writer.plan_image: one layout, so the planned size is the written size), the
    arena by the model's dimensions (plan.arena_bytes). The checkpoint is mapped for the asked max_seq; another
    one's dimensions come from its config alone, and its tensors (the RoPE tables follow max_seq) from mapping it
    again, one other at a time (its files stay open while it is kept). The metadata section (tokenizer, chat
    template) is read when a size first needs it: a checkpoint directory's JSON files at once, but a GGUF file's
    vocabulary only when a verdict depends on it, since transformers takes seconds to convert it (SmolLM2's 49k
    tokens: 6 s)."""

    def __init__(self, src: Path, max_seq: int | None, norm_topk_prob: bool | None, keep: list[tuple[str, DType]],
                 expert_align: int, pinned: frozenset[tuple[int, int]]):
        self.src, self.norm_topk_prob, self.keep = Path(src), norm_topk_prob, keep
        self.expert_align, self.pinned = expert_align, pinned
        self.checkpoint = load_checkpoint(self.src, max_seq, norm_topk_prob)  # as asked (None: its default)
        self._other: Checkpoint | None = None
        self._meta: dict | None = None
        self.meta_read = False
        self.meta_costly = self.src.is_file()  # a GGUF file (a directory's tokenizer is JSON to read)

    def checkpoint_at(self, max_seq: int) -> Checkpoint:
        if max_seq == self.checkpoint.dims.max_seq:
            return self.checkpoint
        if self._other is None or self._other.dims.max_seq != max_seq:
            self._other = None  # its files closed before the next mapping opens them
            self._other = load_checkpoint(self.src, max_seq, self.norm_topk_prob)
        return self._other

    def dims(self, choice: Choice) -> ModelDims:
        return replace(self.checkpoint.dims_at(choice.max_seq), kv_dtype=KV_DTYPES[choice.kv])

    def arena_bytes(self, choice: Choice) -> int:
        return arena_bytes(self.dims(choice))

    @property
    def meta(self) -> dict | None:
        """The image's metadata section: the tokenizer and chat template, for colibri run --prompt/--chat."""
        if not self.meta_read:
            try:
                self._meta = checkpoint_meta(self.src)
            except ValueError as exc:  # (json's message names no file)
                raise UnsupportedModel(f"{self.src}: tokenizer.json, tokenizer_config.json or generation_config.json "
                                       f"is not valid JSON ({exc}): fix it, or download the checkpoint again") from None
            self.meta_read = True
        return self._meta

    def plan(self, choice: Choice, with_meta: bool = True) -> ImagePlan:
        """The image's layout; without its metadata section (the image's size less that section) when
        `with_meta` is False."""
        tensors = convert_tensors(self.checkpoint_at(choice.max_seq).tensors, choice.dtype, self.keep)
        return plan_image(self.dims(choice), tensors, self.expert_align, self.pinned,
                          self.meta if with_meta else None)

    def image_bytes(self, choice: Choice) -> tuple[int, bool]:
        """(the image's bytes, True), or (its bytes but the metadata section, False) while that is costly and
        unread."""
        exact = self.meta_read or not self.meta_costly
        return self.plan(choice, with_meta=exact).image_bytes, exact


def size_of(nbytes: int, exact: bool = True) -> str:
    """A size as the fit error gives it: `exact` False for an image whose metadata section is not counted."""
    return f"{'' if exact else 'at least '}{nbytes:,} bytes"


class BoardFit:
    """A board's image region and arena against a Packing's sizes. The image is judged without its metadata
    section first: when the rest is too large already, no tokenizer is read to say so."""

    def __init__(self, board: Board, packing: Packing):
        self.board, self.packing = board, packing
        self.image_cap = memory_region(board.spec, "image")
        self.arena_cap = memory_region(board.spec, "arena")

    def arena_fits(self, choice: Choice) -> bool:
        return self.arena_cap is None or self.packing.arena_bytes(choice) <= self.arena_cap.bytes

    def image_fits(self, choice: Choice) -> bool:
        if self.image_cap is None:
            return True
        image, exact = self.packing.image_bytes(choice)
        if image > self.image_cap.bytes:  # (too large even before the metadata section: nothing more to read)
            return False
        return exact or self.packing.plan(choice).image_bytes <= self.image_cap.bytes

    def largest_max_seq(self, asked: Choice, kv: str) -> int | None:
        """The largest max_seq up to the asked one whose arena fits with a `kv` cache (the arena grows with
        max_seq), or None when not even 1 does."""
        def fits(max_seq: int) -> bool:
            return self.arena_fits(Choice(max_seq, kv, asked.dtype))
        if fits(asked.max_seq):
            return asked.max_seq
        if not fits(1):
            return None
        low, high = 1, asked.max_seq  # low fits, high does not
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if fits(middle) else (low, middle)
        return low

    def arena_options(self, asked: Choice) -> list[Choice]:
        """The max_seq and KV cache choices whose arena fits: the asked KV type with its largest max_seq, then an
        f16 cache (half an f32 one) if that allows a longer one."""
        options: list[Choice] = []
        for kv in (asked.kv, "f16"):
            max_seq = self.largest_max_seq(asked, kv)
            if max_seq and (not options or max_seq > options[-1].max_seq):
                options.append(Choice(max_seq, kv, asked.dtype))
        return options

    def what_fits(self, asked: Choice) -> list[Choice]:
        """Each arena option with the widest dtype (the asked one, or a narrower one) whose image fits: every
        choice returned was sized and fits."""
        found = []
        for option in self.arena_options(asked):
            for dtype in (asked.dtype, *(d for d in NARROWER if value_bytes(d) < value_bytes(asked.dtype))):
                if self.image_fits(replace(option, dtype=dtype)):
                    found.append(replace(option, dtype=dtype))
                    break
        return found

    def does_not_fit(self, asked: Choice) -> DoesNotFit:
        """The error: what the asked packing needs of each region, then what fits, or what is too large even at
        the least."""
        advice = self.advice(asked)  # first: when it read the tokenizer, the image's size is known exactly
        image, exact = self.packing.image_bytes(asked)
        arena = self.packing.arena_bytes(asked)
        return DoesNotFit(
            f"{self.packing.src.name} does not fit {self.board.name}: the arena for max_seq {asked.max_seq} needs "
            f"{size_of(arena)} of its {self.arena_cap.bytes:,} ({100 * arena / self.arena_cap.bytes:.1f}%), the image "
            f"{size_of(image, exact)} of its {self.image_cap.bytes:,} ({100 * image / self.image_cap.bytes:.1f}%)"
            f"\n  {advice}")

    def advice(self, asked: Choice) -> str:
        def described(choice: Choice) -> str:
            return f"`{choice.flags(asked)}`" if choice.flags(asked) else "as asked"
        fitting = self.what_fits(asked)
        if fitting:
            return f"what fits {self.board.name}: " + ", or ".join(
                f"{described(c)} (image {human(self.packing.plan(c).image_bytes)}, arena "
                f"{human(self.packing.arena_bytes(c))})" for c in fitting)
        options = self.arena_options(asked)
        if not options:
            least = Choice(1, "f16", asked.dtype)
            return (f"nothing fits {self.board.name}: even {described(least)} needs an arena of "
                    f"{size_of(self.packing.arena_bytes(least))}")
        least = replace(options[0], dtype=min((asked.dtype, *NARROWER), key=value_bytes))
        return f"nothing fits {self.board.name}: even {described(least)} makes the image " \
               f"{size_of(*self.packing.image_bytes(least))}"

    def check(self, asked: Choice) -> list[str]:
        """The fit report's lines for the asked packing; DoesNotFit, naming what fits, when it does not."""
        if not (self.arena_fits(asked) and self.image_fits(asked)):
            raise self.does_not_fit(asked)
        return fit_report(self.board, self.packing.plan(asked).image_bytes, self.packing.arena_bytes(asked))[1]


def progress_bar(show: bool, desc: str, total: int | None = None, unit: str = "B") -> tqdm:
    """A tqdm bar on stderr when `show` (stderr is a terminal), else one that draws nothing: tests and logs
    capture stderr."""
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B", leave=False, disable=not show,
                file=sys.stderr)


def check_pins(dims: ModelDims, pinned: frozenset[tuple[int, int]]) -> None:
    for layer, expert in pinned:
        if not (0 <= layer < dims.n_layers and dims.moe_layers[layer] and 0 <= expert < dims.n_experts):
            raise ValueError(f"cannot pin expert {expert} of layer {layer}: the model has no such routed expert "
                             "(was the trace made with another model?)")


def pack(src: Path, out: Path, max_seq: int | None, expert_align: int, *, board: str | None = None,
         norm_topk_prob: bool | None = None, dtype: DType | None = DType.F32, keep: list[tuple[str, DType]] | None = None,
         kv: str = "f32", measure_quality: bool = True, pinned: frozenset[tuple[int, int]] = frozenset(),
         progress: bool = False) -> dict:
    """Pack `src` into the image `out`: sized first and checked against `board` (DoesNotFit, before anything is
    converted), then written a tensor at a time into `out`.part, renamed `out` once whole. `progress`: bars on
    stderr."""
    from colibri.autopack import source_files
    from colibri.inputs import is_gguf, overwrites_source
    src, out = Path(src), Path(out)
    if (src.is_dir() or src.is_file()) and (source := overwrites_source(source_files(src), out)):
        what = "the GGUF file" if is_gguf(src) else f"{source.name} of the checkpoint"
        raise ValueError(f"{out} is {what} being packed: the image would replace it; give -o another file")
    packing = Packing(src, max_seq, norm_topk_prob, keep or [], expert_align, pinned)
    ckpt = packing.checkpoint
    check_pins(ckpt.dims, pinned)
    check_keep(ckpt.tensors, keep or [])
    asked = Choice(ckpt.dims.max_seq, kv, dtype)
    fit_lines = BoardFit(load_board(board), packing).check(asked) if board else []
    plan = packing.plan(asked)
    dims, meta = plan.dims, packing.meta
    # written straight to the file a tensor at a time, then renamed: never a copy of the model in RAM,
    # and never a half-written image under the output name
    part = out.with_name(out.name + ".part")
    try:
        with progress_bar(progress, "writing", plan.data_bytes) as bar:
            size = write_plan(part, plan, bar.update)
        img = open_image(part, check_crcs=False)  # just written: only its table is read back
        narrowed = kv != "f32" or any(e.dtype != DType.F32 for e in plan.entries)
        cost = None
        if narrowed and measure_quality:
            with progress_bar(progress, "quality", unit=" tensors") as bar:
                cost = quality(checkpoint_f32(ckpt.dims, ckpt.tensors, bar.update), written_image(part, bar.update))
        report = {
            "image": str(out), "image_bytes": size, "arena_bytes": arena_bytes(dims),
            "params": ckpt.n_params, "active_params_per_token": ckpt.n_active_params,
            "tied_embeddings": ckpt.tied_embeddings, "dims": dims, "fit": fit_lines, "family": ckpt.family,
            "bytes_by_dtype": img.bytes_by_dtype(), "quality": cost,
            "resident_bytes": img.resident_bytes, "pinned": sorted(pinned), "converted": ckpt.converted,
            "fallbacks": fallbacks(ckpt.tensors, dtype, keep or []),
            "towers_left_out": ckpt.towers_left_out,
            "tokenizer": bool(meta), "chat_template": bool(meta and meta.get("chat_template")),
        }
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    part.replace(out)
    return report


def os_error_message(exc: OSError, output: Path) -> str:
    """A file the packer could not read or write, named, with what to do about it."""
    if exc.filename is None:  # (raised with a message of ours)
        return str(exc)
    if Path(exc.filename) in (output, output.with_name(output.name + ".part")):
        return (f"cannot write {output}: {exc.strerror}: check that its folder exists, that you may write there and "
                "that the disk has room")
    return f"cannot read {exc.filename}: {exc.strerror}: check the path, and that you may read it"


def main(argv: list[str] | None = None) -> int:
    ap = Parser(__doc__)
    ap.add_argument("checkpoint", type=Path,
                    help="Hugging Face checkpoint directory (config.json + *.safetensors), or a .gguf file")
    ap.add_argument("-o", "--output", type=Path, required=True, help="image file to write")
    ap.add_argument("--max-seq", type=int,
                    help="longest sequence (prompt + generated) the image supports; sizes the KV cache "
                         "(default: 256, or the model's max_position_embeddings if smaller)")
    ap.add_argument("--expert-align", type=int, default=64,
                    help="byte alignment of each expert block, e.g. 4096 for page-granular prefetch (default 64)")
    ap.add_argument("--board", choices=board_names(), help="check that image + arena fit this board's memory")
    ap.add_argument("--dtype", default="f32", choices=[d.name.lower() for d in DType] + ["stored"],
                    help="dtype of the large matrices (default f32); stored: each as a GGUF file stores it, where "
                         "the image has that dtype (a Q4_K_M file's mix of Q4_K, Q6_K, ... as it is), q8_0 for a "
                         "quantized type no image has (IQ4_XS, Q3_K, ...), else f32")
    ap.add_argument("--keep", action="append", default=[], metavar="NAME_GLOB[=DTYPE]",
                    help="store the matching large matrices in the dtype given instead of --dtype's (f32 when "
                         "none is given; repeatable, first match wins); a glob that matches none is an error")
    ap.add_argument("--kv", default="f32", choices=sorted(KV_DTYPES), help="KV cache element type (default f32)")
    ap.add_argument("--no-quality", action="store_true",
                    help="skip the quality measurement (it runs the numpy reference twice on the calibration prompt)")
    ap.add_argument("--norm-topk-prob", choices=("true", "false"),
                    help="whether the top-k router weights are renormalized, for a Qwen-MoE, OLMoE or LFM2-MoE GGUF "
                         "file (default: its expert_weights_norm key, or else what llama.cpp does for the "
                         "architecture: qwen3moe and lfm2moe true, qwen2moe and olmoe false)")
    ap.add_argument("--pin-from", type=Path, metavar="TRACE.json",
                    help="a calibration trace (colibri run --trace-out): pin its most routed experts into the resident "
                         "part, so a board with an expert cache never fetches them (docs/STREAMING.md)")
    ap.add_argument("--pin", type=int, default=0, metavar="N", help="how many experts --pin-from pins")
    args = ap.parse_args(argv)
    if args.max_seq is not None and args.max_seq < 1:
        ap.error("--max-seq must be at least 1")
    if (args.pin > 0) != (args.pin_from is not None) or args.pin < 0:
        ap.error("--pin-from TRACE.json and --pin N (N >= 1) go together")
    pinned: frozenset[tuple[int, int]] = frozenset()
    if args.pin_from:
        try:
            pinned = hot_experts(json.loads(args.pin_from.read_text()), args.pin)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            ap.error(f"--pin-from {args.pin_from}: not a trace written by colibri run --trace-out ({exc})")
    try:
        norm = None if args.norm_topk_prob is None else args.norm_topk_prob == "true"
        keep = [parse_keep(k) for k in args.keep]
        r = pack(args.checkpoint, args.output, args.max_seq, args.expert_align, board=args.board, norm_topk_prob=norm,
                 dtype=None if args.dtype == "stored" else DType.parse(args.dtype), keep=keep, kv=args.kv, measure_quality=not args.no_quality,
                 pinned=pinned, progress=sys.stderr.isatty())
    except (OSError, ValueError) as exc:  # the checkpoint's own faults (UnsupportedModel), a file unreadable...
        return ap.fail(os_error_message(exc, args.output) if isinstance(exc, OSError) else str(exc))
    d = r["dims"]
    print(f"packed {args.checkpoint} -> {r['image']}")
    n_moe = sum(d.moe_layers)
    ffn = (f"{d.n_experts} experts top-{d.top_k} in {n_moe} of {d.n_layers} layers" if n_moe else "dense MLP")
    print(f"  model       {r['family']}: {d.n_layers} layers, hidden {d.hidden_size}, {d.n_heads} heads "
          f"({d.n_kv_heads} kv, head_dim {d.head_dim}), {ffn}, vocab {d.vocab_size}")
    print(f"  parameters  {r['params']:,} total, {r['active_params_per_token']:,} active per token")
    if r["converted"]:
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(r["converted"].items()))
        target = "q8_0" if args.dtype == "stored" else args.dtype
        # the other choices, those that differ from this one (f32 is exact: no quality line to look at)
        other = ", ".join(hint for hint, differs in (
            ("--dtype f32 keeps them exact", target != "f32"),
            ("--dtype q4_k smaller", value_bytes(DType.parse(target)) > value_bytes(DType.Q4_K))) if differs)
        cost = "; the quality line shows what that costs" if target != "f32" else ""
        print(f"  converted   {kinds} tensors: no image dtype holds them, so they were dequantized to f32 "
              f"exactly and stored as {target} ({other}{cost})")
    for (chosen, stored), (cols, count) in sorted(r["fallbacks"].items()):
        widths = ", ".join(str(c) for c in sorted(cols))
        print(f"  fallback    {count} {chosen} matrices stored as {stored}: their rows ({widths} values) are not whole "
              f"256-element blocks (llama.cpp's fallback type)")
    if r["towers_left_out"]:
        print(f"  text model  the multimodal checkpoint's text model: {r['towers_left_out']} vision and audio tower "
              "tensors left out (the image runs text)")
    by_dtype = ", ".join(f"{k} {human(v)}" for k, v in sorted(r["bytes_by_dtype"].items()))
    print(f"  image       {r['image_bytes']:,} bytes ({human(r['image_bytes'])}): {by_dtype}")
    if n_moe:
        expert_part = r["image_bytes"] - r["resident_bytes"]
        pins = f", {len(r['pinned'])} hot experts pinned resident" if r["pinned"] else ""
        if r["pinned"] and len(r["pinned"]) < args.pin:  # the trace routed to fewer experts than asked for
            pins += f" (--pin {args.pin}: the trace routed to only {len(r['pinned'])} experts)"
        print(f"  tiers       resident {human(r['resident_bytes'])}, expert part {human(expert_part)}{pins} "
              "(colibri run --expert-cache streams the expert part)")
    kv = "f16" if d.kv_dtype else "f32"
    print(f"  arena       {r['arena_bytes']:,} bytes ({human(r['arena_bytes'])}) for max_seq {d.max_seq}, {kv} KV cache "
          f"of {human(d.kv_cache_bytes())}")
    if d.mla:
        print(f"  latent KV   {d.kv_position_bytes():,} bytes per position (latent {d.kv_lora_rank} + rope {d.rope_width} "
              f"per layer); keys and values per head would take {d.kv_position_bytes(expanded=True):,}")
    if d.global_head_dim:  # Gemma 4
        print(f"  global      {d.n_layers - sum(d.windowed(l) for l in range(d.n_layers))} global layers: "
              f"{d.layer_kv_heads(d.n_layers - 1)} kv heads of {d.global_head_dim}, their own RoPE")
    if d.sliding_window:
        windowed = sum(d.window_layers)
        print(f"  window      {windowed} of {d.n_layers} layers attend over the last {d.sliding_window} positions: "
              f"their KV cache is a ring of {d.sliding_window} positions, not {d.max_seq}")
    q = r["quality"]
    if q:
        print(f"  quality     vs the f32 image on {q['tokens']} calibration tokens: max |dlogit| {q['max_abs_dlogit']:.4g}, "
              f"mean {q['mean_abs_dlogit']:.4g}, KL {q['kl_divergence']:.3g}, top-1 agreement {q['top1_agreement']:.1%}")
        if q["lossy"]:
            wider = "f16" if args.dtype == "q8_0" else "f32" if args.dtype in ("f16", "bf16") else "q8_0"
            print(f"  warning     this packing loses more than KL {LOSSY_KL} or top-1 {LOSSY_TOP1:.0%} allow: the model's "
                  f"text will change. Pack with --dtype {wider}, or keep chosen tensors wider (--keep NAME_GLOB={wider}) "
                  "and look at this line again")
    if r["tokenizer"]:
        chat = ", chat template" if r["chat_template"] else ", no chat template"
        print(f"  text        tokenizer{chat} (colibri run --prompt \"...\"{' or --chat' if r['chat_template'] else ''})")
    else:
        print("  text        no tokenizer carried (a checkpoint directory with tokenizer.json has one): "
              "colibri run takes --prompt-tokens")
    for line in r["fit"]:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
