#!/usr/bin/env python3
"""Run an image on a board: boot it, get the image onto it, run a prompt, stream the tokens, verify.

Examples (`colibri run` in a checkout is `python host/flash.py`):
  colibri run model.img --prompt-tokens 1,5,9,3 --max-new-tokens 16 --verify          # x86_64 under QEMU
  colibri run model.img --board hosted --prompt-tokens 1,5,9,3 --verify
  colibri run model.img --upload --prompt-tokens 1,5 --verify                         # image over the serial link
  colibri run model.img --port /dev/ttyUSB0 --baud 921600 --prompt-tokens 1,5 --verify
  colibri run model.img --port socket://localhost:2000 --prompt-tokens 1,5 --verify  # a board behind ser2net
  colibri run model.img --board hosted --prompt-tokens 1,2 --temperature 0.8 --top-p 0.9 --seed 7
  colibri run model.img --board hosted --prompt-tokens 1,2 --dump-logits logits.npy --json
  colibri run model.img --prompt-tokens 1,2,3 --trace --trace-out trace.json          # then colibri report
  colibri run model.img --board cortex_m55 --expert-cache 4 --prompt-tokens 1,2 --verify   # stream experts
  colibri run model.img --board hosted --prompt-tokens 1,2,3 --against path/to/checkpoint  # vs transformers
  colibri run model.img --board hosted --prompt "The capital of France is" --max-new-tokens 20
  colibri run model.img --board hosted --chat "Write a haiku about flash memory"
  colibri run model.gguf --board hosted --chat                                        # packed first, then a chat

--verify compares the device with the numpy reference built from the same image, bit for bit (the reference
computes what the runtime computes, in its order: docs/KERNELS.md): it catches runtime and board bugs.
--against compares with transformers on the source checkpoint: it also catches packing mistakes (a tensor
mapped wrongly is in the image and so in the reference, but not in transformers).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from colibri.console import Parser, Stopped
from colibri.autopack import is_image, packed_image
from colibri.build import BuildError, ensure_built
from colibri.checkpoint import UnsupportedModel
from colibri.image import Image, ImageError, arena_bytes, expert_cache_bytes, open_image, read_image
from colibri.inputs import is_gguf, not_utf8, number, output_problem, utf8_text, whole
from colibri.protocol import STATUS_NAMES, Client, DeviceError, Generation, LinkError, Sampling, Transport
from colibri.reference import Reference, experts_problem
from colibri.quant import DType
from colibri.sampling import Sampler
from colibri.text import NoTokenizer, Text, TextStream
from colibri.sim.boards import DEFAULT_BOARD, Board, board_names, load_board, memory_shortfalls
from colibri.sim.launch import (below, firmware_problem, launch_problem, line_open, open_port,
                                 start_board)

if TYPE_CHECKING:
    from colibri.farm.run import FarmPlace

@dataclass
class Verification:
    """The device's logits against an oracle's: the numpy reference bit for bit (tolerance None), or within a
    tolerance (--tolerance; transformers with --against)."""
    max_abs_error: float
    rows: int
    tokens_checked: int  # generated tokens checked against the oracle's choice from its logits
    tokens_agree: int
    tolerance: float | None  # None: every row must be bit-identical
    error_bounded: bool = True  # the error must be within the tolerance (not for --against: it reports it)
    rows_identical: int = 0  # rows bit-identical to the oracle's
    first_difference: int | None = None  # the first position whose row is not
    parting: str = ""  # where the device and the reference first part, when a trace showed it
    sampled: bool = False  # the tokens were sampled (and checked against the runtime's sampler, reproduced)

    @property
    def bit_identical(self) -> bool:
        return self.rows_identical == self.rows

    @property
    def passed(self) -> bool:
        if self.tolerance is None:
            return self.bit_identical and self.tokens_agree == self.tokens_checked
        return (not self.error_bounded or self.max_abs_error <= self.tolerance) and \
            self.tokens_agree == self.tokens_checked


def compare(expected: np.ndarray, device: np.ndarray | None, prompt: list[int], tokens: list[int], greedy: bool,
            tolerance: float | None, error_bounded: bool = True, sampler: Sampler | None = None) -> Verification:
    """Which rows are bit-identical, the largest logit error, and whether each generated token is the oracle's
    choice from its row: the first (greedy; with a tolerance, or within it of the first: a near tie), or with a
    sampler the token the runtime's sampler draws from the row. Neither: no token is checked."""
    if device is None or device.shape != expected.shape:
        raise ValueError(f"device returned logits of shape {None if device is None else device.shape}, "
                         f"the oracle gives {expected.shape}")
    same = np.all(device.astype(np.float32).view(np.uint32) == expected.astype(np.float32).view(np.uint32), axis=1)
    differ = np.flatnonzero(~same)
    checked = agree = 0
    if greedy or sampler is not None:
        for i, tok in enumerate(tokens):
            row = expected[len(prompt) - 1 + i]
            checked += 1
            if sampler is not None:
                agree += int(tok == sampler.sample(row))
            else:
                agree += int(tok == int(np.argmax(row)) if tolerance is None else row[tok] >= row.max() - tolerance)
    with np.errstate(invalid="ignore"):
        error = float(np.max(np.abs(device - expected)))
    return Verification(error, expected.shape[0], checked, agree, tolerance, error_bounded, int(same.sum()),
                        int(differ[0]) if differ.size else None, sampled=sampler is not None)


@dataclass
class RunResult:
    tokens: list[int]
    stats: dict[str, int]
    logits: np.ndarray | None
    board: str
    upload_crc32: int | None = None
    guest_code: int | None = None
    kernels: str = ""  # the kernel set the device computed with
    traces: list | None = None  # per fed token: list[LayerTrace]
    expert_cache: int = 0  # cache slots (0: experts read in place)
    timing: dict | None = None  # prompt and decode tokens and seconds (device clock), open seconds (host clock)
    prefill_batch: int = 0  # prompt tokens the device computed in one pass (0: one a pass)
    threads: int = 1  # threads the device computed on


def verify(reference: Reference, prompt: list[int], result: RunResult, sampling: Sampling,
           tolerance: float | None = None) -> Verification:
    """Compare the device's logits with the numpy reference run on the same tokens, bit for bit (or with a
    tolerance on max |device - reference|), and its tokens with the reference's choices: the first of each row,
    or the runtime's sampler's draw with the same settings and seed. When they part and the device traced the run,
    say where."""
    sampled = sampling.temperature > 0
    sampler = Sampler(sampling.temperature, sampling.top_k, sampling.top_p, sampling.seed) if sampled else None
    v = compare(reference.forward(prompt + result.tokens), result.logits, prompt, result.tokens, not sampled, tolerance,
                sampler=sampler)
    if v.first_difference is not None and tolerance is None and result.traces:
        v.parting = parting_point(reference, prompt + result.tokens, result.traces)
    return v


def parting_point(reference: Reference, tokens: list[int], traces: list) -> str:
    """The first token, layer and step where the device's trace parts from the reference's pass: the residual
    stream after the attention half (its CRC), the router's choice (experts, or their weights' bits), the
    residual stream after the layer; or that every layer of every token agrees."""
    routes, sums = reference.traced(tokens)
    # a lean build's trace takes no CRCs (0, 0): only its routing can be compared
    crcs = any(t.crc_attention or t.crc_output for layers in traces for t in layers)
    for pos, layers in enumerate(traces[:len(tokens)]):
        for t in layers:
            where = f"token {pos} (id {tokens[pos]}), layer {t.layer}"
            crc_attention, crc_output = (int(v) for v in sums[t.layer][pos])
            if crcs and t.crc_attention != crc_attention:
                return (f"{where}: the residual stream after the attention half differs (CRC-32 device "
                        f"{t.crc_attention:08x}, reference {crc_attention:08x}); every earlier token and layer agrees")
            if t.layer in routes:
                experts, weights = routes[t.layer]
                device_weights = np.asarray(t.weights, np.float32)
                if t.experts != experts[pos].tolist() or device_weights.tobytes() != weights[pos].tobytes():
                    what = "experts" if t.experts != experts[pos].tolist() else "expert weights"
                    return (f"{where}: the router's {what} differ (device {t.experts} {device_weights.tolist()}, "
                            f"reference {experts[pos].tolist()} {weights[pos].tolist()}); every earlier token and "
                            "layer agrees")
            if crcs and t.crc_output != crc_output:
                return (f"{where}: the residual stream after the FFN half differs (CRC-32 device {t.crc_output:08x}, "
                        f"reference {crc_output:08x}, at the layer's end); its attention half and every earlier token "
                        "and layer agree")
    if not crcs:
        return "every routed layer of every token routed alike; this build's trace carries no residual CRCs (lean)"
    return "every layer of every token agrees: they part after the last layer (the output norm or matrix)"


def traced_parting(reference: Reference, board: str, port: str | None, result: RunResult, prompt: list[int],
                   rerun: Callable[[], RunResult]) -> str:
    """Where device and reference part, from one more run of the same prompt with the trace on (`rerun`), or why
    that cannot say."""
    if port:
        return "not traced (--port): run again with --trace to see where they part"
    try:
        traced = rerun()
    except (DeviceError, LinkError, ValueError, OSError) as exc:
        return f"not traced: the traced run on {board} failed ({exc})"
    if traced.tokens != result.tokens:
        return (f"not traced: a second run gave other tokens ({traced.tokens} against {result.tokens}): "
                "the device does not repeat itself")
    return parting_point(reference, prompt + result.tokens, traced.traces or [])


def tokens_text(v: Verification) -> str:
    if not v.tokens_checked:
        return "no generated token checked"
    return f"{'sampled' if v.sampled else 'greedy'} tokens agree {v.tokens_agree}/{v.tokens_checked}"


def verify_line(v: Verification) -> str:
    """--verify's one-line answer."""
    greedy_txt = tokens_text(v)
    verdict = "PASS" if v.passed else "FAIL"
    if v.tolerance is not None:
        return (f"verify: max |device - reference| = {v.max_abs_error:.3g} over {v.rows} logits rows "
                f"(tolerance {v.tolerance:g}); {greedy_txt}: {verdict}")
    if v.bit_identical:
        return f"verify: bit-identical to the reference over {v.rows} logits rows; {greedy_txt}: {verdict}"
    return (f"verify: device and reference part at position {v.first_difference}: {v.rows - v.rows_identical} of "
            f"{v.rows} logits rows differ (max |device - reference| = {v.max_abs_error:.3g}); {greedy_txt}: {verdict}")


def against(checkpoint: Path, image_bytes: bytes | memoryview, prompt: list[int], result: RunResult, greedy: bool,
            tolerance: float | None = None) -> Verification:
    """Compare the device's logits with transformers run on the checkpoint the image was packed from
    (colibri/oracle.py). The error says how far packing (narrower dtypes, the KV cache) and the runtime moved
    the logits; it passes when every greedy token agrees. Without a tolerance for near ties: 1e-3 x
    max(1, max |logit|) for an all-f32 image, 5e-2 x that when weights or the KV cache are narrower."""
    from colibri.oracle import checkpoint_logits
    image = read_image(image_bytes)
    hf = checkpoint_logits(checkpoint, prompt + result.tokens)
    narrow = image.dims.kv_dtype != 0 or any(e.dtype != 0 for e in image.entries)
    if tolerance is None:
        tolerance = (5e-2 if narrow else 1e-3) * max(1.0, float(np.abs(hf).max()))
    try:
        return compare(hf, result.logits, prompt, result.tokens, greedy, tolerance, error_bounded=False)
    except ValueError as exc:
        raise ValueError(f"{exc}: is {checkpoint} the checkpoint this image was packed from?") from None


def progress_bar(total: int, enabled: bool, desc: str, unit: str):
    """A tqdm bar on an interactive terminal, as a callback given the count done so far; None (quiet) otherwise.
    The bar clears itself when it is full."""
    if not enabled or not sys.stderr.isatty():
        return None
    from tqdm import tqdm
    bar = tqdm(total=total, unit=unit, unit_scale=unit == "B", desc=desc, leave=False)

    def update(done: int) -> None:
        bar.update(done - bar.n)
        if done >= total:
            bar.close()
    return update


def run_session(client: Client, image: Path, prompt: list[int], max_new: int, sampling: Sampling,
                want_logits: bool, upload: bool, on_token=None, trace: bool = False,
                progress: bool = False, expert_cache: int = 0, prefetch: bool = True,
                stop: frozenset[int] = frozenset(), started: float | None = None,
                experts: int | None = None) -> RunResult:
    """The host's side of one session: INFO, optional upload, OPEN (with an expert cache of
    `expert_cache` slots, if not 0, and `experts` routed experts a token, if not the image's top_k), the generation (ending early after a token in `stop`), STATS, QUIT.
    `started` (time.perf_counter()) is when the board was started, for the time to open."""
    started = time.perf_counter() if started is None else started
    info = client.info()
    upload_crc = None
    if upload:
        data = image.read_bytes()
        upload_crc = client.upload(data, progress_bar(len(data), progress, "upload", "B"))
    opened = client.open(expert_cache, prefetch, experts)
    open_s = time.perf_counter() - started
    if len(prompt) + max_new > opened.max_seq:
        raise ValueError(f"{len(prompt)} prompt + {max_new} new tokens exceed the image's max_seq "
                         f"{opened.max_seq}; repack with a larger --max-seq or ask for fewer tokens")
    traces: list | None = [] if trace else None
    # the prompt goes one token a pass when each position's logits or trace is wanted: on a board under QEMU that
    # is long enough to show
    fed = progress_bar(len(prompt), progress and (want_logits or trace) and len(prompt) > 1, "prompt", "tok")
    gen = client.run(prompt, max_new, sampling, opened.vocab_size if want_logits else None, on_token, traces, stop,
                     fed)
    stats = client.stats()
    client.quit()
    return RunResult([e.token for e in gen.events], stats, gen.logits, info.board, upload_crc, traces=traces,
                     kernels=opened.kernels, expert_cache=opened.expert_cache,
                     timing=timing(len(prompt), gen, info.cycle_hz, open_s), prefill_batch=opened.prefill_batch,
                     threads=max(1, opened.parallel_parts))


def timing(n_prompt: int, gen: Generation, cycle_hz: int, open_s: float) -> dict:
    """Prompt and decode throughput on the device's own clock (None where the board has no clock), and the
    host's wall time from starting the board to the answer of OPEN (reading the image and verifying it)."""
    def seconds(cycles: int) -> float | None:
        return cycles / cycle_hz if cycle_hz else None
    prompt_s, decode_s = seconds(gen.prefill_cycles), seconds(sum(e.cycles for e in gen.events))
    return {"open_s": open_s, "prompt_tokens": n_prompt, "prompt_s": prompt_s, "decode_tokens": len(gen.events),
            "decode_s": decode_s,
            "prompt_tok_s": n_prompt / prompt_s if prompt_s else None,
            "decode_tok_s": len(gen.events) / decode_s if decode_s and gen.events else None}


def streaming_args(board) -> list[str]:
    """What tells a board to keep the expert part out of memory, for an OPEN with an expert cache (board.toml)."""
    return list(board.spec.get("stream_args", []))


def threads_args(board, threads: int) -> list[str]:
    """What asks a board to compute on `threads` threads (board.toml's threads_arg); one needs nothing."""
    if threads == 1:
        return []
    if "threads_arg" not in board.spec:
        with_threads = [b for b in board_names() if "threads_arg" in load_board(b).spec]
        raise ValueError(f"board {board.name} computes on one core; --threads needs a board with threads "
                         f"({', '.join(with_threads)})")
    return [board.spec["threads_arg"], str(threads)]


def run_on_board(image: Path, board_name: str, prompt: list[int], max_new: int, sampling: Sampling,
                 want_logits: bool, *, firmware: Path | None = None, on_token=None, board_args: list[str] | None = None,
                 timeout: float = 60.0, upload: bool = False, gdb: bool = False, retries: int = 4,
                 wrap: Callable[[Transport], Transport] | None = None, trace: bool = False,
                 progress: bool = False, expert_cache: int = 0, prefetch: bool = True,
                 stop: frozenset[int] = frozenset(), threads: int = 1, experts: int | None = None) -> RunResult:
    """Boot `board_name` (QEMU or hosted), load the image (QEMU's loader, or `upload` over the link), run.
    `wrap` may put something between host and device (the fault injector of colibri/sim/faults.py)."""
    board = load_board(board_name)
    if expert_cache and not upload:
        board_args = (board_args or []) + streaming_args(board)
    board_args = (board_args or []) + threads_args(board, threads)
    started = time.perf_counter()
    with start_board(board, firmware or board.firmware(), None if upload else image, board_args, gdb) as device:
        link = wrap(device.link) if wrap else device.link
        result = run_session(Client(link, timeout=timeout, retries=retries), image, prompt, max_new, sampling,
                             want_logits, upload, on_token, trace, progress, expert_cache, prefetch, stop, started,
                             experts)
    result.guest_code = device.guest_code
    if result.guest_code != 0:
        raise LinkError(f"board ended badly after the run: {device.describe()}")
    return result


# --fault-rate's largest: the fault injector (colibri/sim/faults.py) tests the link's recovery, which
# tests/test_faults.py sweeps at 1e-4 and 1e-3; at 0.01 most frames are damaged already, and above it a run
# mostly waits out --timeout between retransmissions (0.5 never ended)
MAX_FAULT_RATE = 0.01


def preflight(img: Image, image_bytes: int, board: Board | None, prompt: list[int] | None, max_new: int,
              slots: int) -> str | None:
    """The first reason a run cannot work that the host sees before a board boots, as the line the user reads;
    None when there is none. The device checks all of it again (that is the defence; this is the courtesy):
    the tokens against the image's vocabulary and max_seq, a cache on an image without streamed experts, and
    on a board with a fixed memory map the image and the arena (with the cache) against its regions."""
    d = img.dims
    if slots and not img.streamed_experts():
        return ("--expert-cache streams routed experts, and this image has none in its expert part (a dense model, "
                "or every expert pinned resident): run it without --expert-cache")
    if slots > len(img.streamed_experts()):
        return (f"--expert-cache {slots} is more slots than the image's {len(img.streamed_experts())} streamed "
                "experts: --expert-cache all gives each its own")
    least = min(d.top_k, len(img.streamed_experts()))  # the device's own minimum (image.c: expert_cache_min)
    if 0 < slots < least:
        return (f"--expert-cache {slots} is fewer slots than the {d.top_k} experts one layer routes to (top_k): "
                f"ask for at least {least}")
    if prompt is not None:
        outside = [t for t in prompt if t >= d.vocab_size]
        if outside:
            return (f"token id {outside[0]} is outside the image's vocabulary of {d.vocab_size:,} ids "
                    f"(0 to {d.vocab_size - 1:,})")
        if len(prompt) + max_new > d.max_seq:
            room = d.max_seq - len(prompt)
            fewer = f"ask for at most {room} new tokens (--max-new-tokens {room})" if room > 0 else "shorten the prompt"
            return (f"{len(prompt)} prompt + {max_new} new tokens exceed the image's max_seq {d.max_seq}: {fewer}, "
                    f"or repack with --max-seq {len(prompt) + max_new} or more")
    if board is None:
        return None
    cache = expert_cache_bytes(img.expert_block_bytes, slots, d.n_layers * d.n_experts)
    for what, region, need in memory_shortfalls(board, image_bytes, arena_bytes(d) + cache):
        holds = f"{board.name}'s {what} region ({region.name}) holds {region.bytes:,}"
        if what == "image":
            elsewhere = [b for b in board_names() if b != board.name and not memory_shortfalls(
                load_board(b), image_bytes, arena_bytes(d) + cache)]
            return (f"the image is {need:,} bytes and {holds}: {repack_advice(img, need, region.bytes)}"
                    + (f", or run it on {', '.join(elsewhere)}" if elsewhere else ""))
        with_cache = f" with {slots} expert cache slots" if slots else ""
        return (f"the image needs a {need:,}-byte arena{with_cache} and {holds}: repack with a smaller --max-seq "
                f"or --kv f16" + (", or ask for fewer --expert-cache slots" if slots else "")
                + f" (`colibri pack ... --board {board.name}` says what fits)")
    return None


def repack_advice(img: Image, image_bytes: int, room: int) -> str:
    """What packing the image's checkpoint again would make it fit `room` bytes: the widest narrower --dtype whose
    image, sized exactly as colibri pack would write it, fits; or that even the narrowest does not."""
    from colibri.pack import NARROWER, repacked_image_bytes
    sizes = {dtype: repacked_image_bytes(img, dtype) for dtype in NARROWER}
    fitting = [dtype for dtype, size in sizes.items() if size <= room and size < image_bytes]
    if fitting:
        name = fitting[0].name.lower()
        return f"repack it with --dtype {name} (the image is then {sizes[fitting[0]]:,} bytes), or a smaller model"
    narrowest = NARROWER[-1]
    return f"even --dtype {narrowest.name.lower()} makes it {sizes[narrowest]:,} bytes: a smaller model"


class NotReady(Exception):
    """A run the host refuses before a board starts; the message says why and what to do."""


def ready_firmware(img: Image, image_bytes: int, board: Board | None, prompt: list[int] | None, max_new: int,
                   slots: int, firmware: Path | None, upload: bool = False, gdb: bool = False) -> Path | None:
    """The checks before the boot (preflight, then whether the board can be started so: launch_problem), then the
    firmware to boot: the one given, or the board's release build, built first when it is missing or older than
    its sources (None for a board on a serial port)."""
    problem = preflight(img, image_bytes, board, prompt, max_new, slots) or \
        (launch_problem(board, upload, gdb) if board is not None else None) or \
        (firmware_problem(board, firmware) if board is not None and firmware is not None else None)
    if problem:
        raise NotReady(problem)
    if board is None or firmware is not None:
        return firmware
    try:
        return ensure_built(board)
    except BuildError as exc:
        raise NotReady(str(exc)) from None


def emit(s: str) -> None:
    print(s, end="", flush=True)


def chat_turns(client: Client, text: Text, sampling: Sampling, max_new: int, max_seq: int,
               read: Callable[[str], str] = input, write: Callable[[str], None] = emit) -> list[dict[str, str]]:
    """An interactive chat over one open context. Each turn feeds only what the conversation added since
    the last (the KV cache is kept), unless the template tokenizes the conversation differently from
    what was fed, when the context starts over with all of it. Ctrl-C during an answer ends the answer where it
    is (kept in the conversation as far as it was shown) and returns to the prompt; the device may have
    generated one token more than the host saw, so the next turn starts the context over. /reset clears the
    conversation and the context; /quit or the end of input ends. Returns the conversation."""
    messages: list[dict[str, str]] = []
    fed: list[int] = []
    client.start(sampling)
    while True:
        try:
            line = read("you> ").strip()
        except EOFError:
            break
        except UnicodeDecodeError as exc:  # (a reader that decodes strictly)
            write(f"[that line holds bytes that are not UTF-8 ({exc.object[exc.start:exc.end].hex(' ')}): give UTF-8 "
                  "text]\n")
            continue
        if line == "/quit":
            break
        if line == "/reset":
            messages, fed = [], []
            client.start(sampling)
            write("[conversation and KV cache cleared]\n")
            continue
        if not line:
            continue
        if problem := not_utf8(line):
            write(f"[that line {problem.removeprefix('it ')}]\n")
            continue
        want = text.chat_tokens(messages + [{"role": "user", "content": line}])
        if len(want) + max_new > max_seq:
            room = max_seq - len(want)
            fewer = (f"at most {room} new tokens fit (--max-new-tokens {room})" if room > 0
                     else "the conversation fills it")
            write(f"[{len(want)} prompt + {max_new} new tokens exceed the image's max_seq {max_seq}: {fewer}; "
                  "/reset to start over]\n")
            continue
        if want[:len(fed)] != fed:  # re-tokenized differently: start over with the whole conversation
            client.start(sampling)
            fed = []
        messages.append({"role": "user", "content": line})
        reply = TextStream(text)
        try:
            client.feed_all(want[len(fed):])
            fed = list(want)
            for _ in range(max_new):
                token = client.step().token
                fed.append(token)
                write(reply.push(token))
                if token in text.eos_ids:
                    break
        except KeyboardInterrupt as exc:
            if isinstance(exc, Stopped):  # SIGTERM, SIGHUP: the chat ends, not only the answer
                raise
            fed = [-1]  # no prefix of any conversation: the next turn starts the context over
            write(reply.finish() + " [interrupted]")
        else:
            write(reply.finish())
        write("\n")
        messages.append({"role": "assistant", "content": text.decode(reply.ids)})
    return messages


def chat_room_problem(text: Text, max_new: int, max_seq: int) -> str | None:
    """Why no turn of an interactive chat could be answered (the chat template's own tokens for an empty message
    and --max-new-tokens pass max_seq), as the one-shot path says it; None when one can."""
    least = len(text.chat_tokens([{"role": "user", "content": ""}]))
    if least + max_new <= max_seq:
        return None
    room = max_seq - least
    fewer = f"ask for at most {room} new tokens (--max-new-tokens {room}), or " if room > 0 else ""
    return (f"{least} prompt (the chat template's, for an empty message) + {max_new} new tokens exceed the image's "
            f"max_seq {max_seq}: {fewer}repack with a larger --max-seq")


def run_chat(image: Path, board_name: str, firmware: Path | None, text: Text, sampling: Sampling, max_new: int, *,
             timeout: float = 60.0, retries: int = 4, expert_cache: int = 0, prefetch: bool = True,
             read: Callable[[str], str] = input, write: Callable[[str], None] = emit,
             threads: int = 1, port: str | None = None, baud: int = 921600,
             experts: int | None = None) -> list[dict[str, str]]:
    """Boot the board with the image and chat on it (chat_turns); with `port`, chat on the board at that serial
    port (a real one, a TCP serial server, a farm place's) with the image uploaded over it first, as --port runs."""
    if port:
        with open_port(port, baud) as link:
            client = Client(link, timeout=timeout, retries=retries)
            client.info()
            data = image.read_bytes()
            crc = client.upload(data)
            write(f"[{port}] image uploaded, device CRC-32 {crc:08x} matches\n")
            return chat_on(client, text, sampling, max_new, expert_cache, prefetch, read, write, experts)
    board = load_board(board_name)
    board_args = (streaming_args(board) if expert_cache else []) + threads_args(board, threads)
    with start_board(board, firmware or board.firmware(), image, board_args) as device:
        return chat_on(Client(device.link, timeout=timeout, retries=retries), text, sampling, max_new, expert_cache,
                       prefetch, read, write, experts)


def chat_on(client: Client, text: Text, sampling: Sampling, max_new: int, expert_cache: int, prefetch: bool,
            read: Callable[[str], str], write: Callable[[str], None], experts: int | None = None) -> list[dict[str, str]]:
    """OPEN the image the board holds, chat, QUIT."""
    client.info()
    opened = client.open(expert_cache, prefetch, experts)
    messages = chat_turns(client, text, sampling, max_new, opened.max_seq, read, write)
    client.quit()
    return messages


def optional_text(img: Image) -> Text | None:
    """The image's tokenizer, if it carries one."""
    try:
        return Text(img.meta)
    except NoTokenizer:
        return None


def trace_report(result: RunResult, prompt: list[int], image: Path, text: Text | None = None) -> dict:
    """The traced run as JSON-ready data (tools/routing_report.py reads it); with the image's tokenizer, each
    token's text too."""
    dims = read_image(image.read_bytes()).dims
    fed = prompt + result.tokens
    return {"board": result.board, "cycle_hz": result.stats["cycle_hz"], "n_layers": dims.n_layers,
            "n_experts": dims.n_experts, "top_k": dims.top_k, "prompt": prompt, "tokens": result.tokens,
            "trace": [{"pos": i, "token": fed[i], "layers": [asdict(t) for t in layers],
                       **({"text": text.decode([fed[i]])} if text else {})}
                      for i, layers in enumerate(result.traces or [])]}


def print_trace(report: dict) -> None:
    for tok in report["trace"]:
        piece = f" {tok['text']!r}" if "text" in tok else ""
        print(f"pos {tok['pos']:>4} token {tok['token']:>6}{piece}")
        for t in tok["layers"]:
            routed = "  ".join(f"e{e}:{w:.3f} ({c:,} cyc)" for e, w, c in
                               zip(t["experts"], t["weights"], t["cycles_expert"])) or "dense MLP"
            print(f"  layer {t['layer']:>3}  attention {t['cycles_attention']:>10,}  routing {t['cycles_router']:>8,}  "
                  f"ffn {t['cycles_ffn']:>10,}  | {routed}")


def parse_tokens(text: str) -> list[int]:
    try:
        tokens = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids, got {text!r}") from None
    if not tokens or min(tokens) < 0:
        raise argparse.ArgumentTypeError("need at least one non-negative token id")
    return tokens


def rate(tokens: int, seconds: float | None) -> str:
    count = f"{tokens} token{'' if tokens == 1 else 's'}"
    if not seconds:
        return count
    return f"{count} in {seconds * 1e3:,.1f} ms ({tokens / seconds:,.1f} tok/s)"


def experts_cost(image: Path, tokens: list[int], logits: np.ndarray, experts: int) -> dict:
    """What routing to `experts` experts instead of top_k cost a run: its logits (at `experts`, one row per fed token)
    against the numpy reference's at the image's top_k on the same tokens."""
    from colibri.pack import logit_cost
    reference = Reference(read_image(image.read_bytes()))
    return {"experts": experts, "top_k": reference.d.top_k, "tokens": len(tokens),
            **logit_cost(reference.forward(tokens), logits)}


def experts_line(cost: dict) -> str:
    """--experts' cost, as colibri pack's quality line says a dtype's."""
    return (f"experts: {cost['experts']} of top-{cost['top_k']} against top-{cost['top_k']} (numpy reference) on the "
            f"run's {cost['tokens']} tokens: KL {cost['kl_divergence']:.3g}, top-1 agreement "
            f"{cost['top1_agreement']:.1%}, max |dlogit| {cost['max_abs_dlogit']:.4g}, mean {cost['mean_abs_dlogit']:.4g}")


def timing_line(result: RunResult) -> str:
    """The run's times as llama.cpp's users read them: loading (the host's wall time from starting the board to
    the device's answer to OPEN, which verified the image), then prompt and decode on the device's clock."""
    t = result.timing
    load = f"{t['open_s']:.2f} s" if t["open_s"] >= 1 else f"{t['open_s'] * 1e3:.1f} ms"
    return (f"load {load}, prompt {rate(t['prompt_tokens'], t['prompt_s'])}, "
            f"decode {rate(t['decode_tokens'], t['decode_s'])}")


def phases_line(stats: dict[str, int], clock: str) -> str:
    """Where a token's device cycles go, on which clock, and the arena used."""
    n = max(stats["tokens_fed"], 1)
    hz = stats["cycle_hz"]
    rate_text = f"{hz / 1e9:.3g} GHz" if hz >= 1e9 else f"{hz / 1e6:.3g} MHz" if hz >= 1e6 else f"{hz:,} Hz"
    on = f" at {rate_text}" + (f" ({clock})" if clock else "") if hz else ""
    return (f"per token: attention {stats['cycles_attention'] / n:,.0f}, router {stats['cycles_router'] / n:,.0f}, "
            f"experts {stats['cycles_experts'] / n:,.0f}, lm_head {stats['cycles_lm_head'] / n:,.0f} of "
            f"{stats['cycles_total'] / n:,.0f} cycles{on}; arena {stats['arena_bytes']:,} bytes")


def cache_line(stats: dict[str, int], slots: int) -> str:
    n = max(stats["tokens_fed"], 1)
    routed = stats["expert_hits"] + stats["expert_misses"]
    hit_rate = stats["expert_hits"] / routed if routed else 0.0
    prefetch = (f", prefetch guesses used {stats['prefetch_used']}/{stats['prefetch_issued']}"
                if stats["prefetch_issued"] else "")
    return (f"expert cache {slots} slots: hit rate {hit_rate:.1%} ({stats['expert_hits']} hits, "
            f"{stats['expert_misses']} misses), {stats['expert_bytes_fetched'] / n:,.0f} bytes fetched/token, "
            f"{stats['cycles_fetch_wait'] / n:,.0f} cycles/token waiting{prefetch}")


def cache_slots(spec: str, image: Path, say: Callable[[str], None] = lambda line: None) -> int:
    """--expert-cache: a slot count, `all`, or a byte budget (512KiB, 4MiB, 1000000B) turned into slots; a budget
    that holds more than every streamed expert is said (`say`) as what it is used for."""
    text = spec.strip().lower()
    img = open_image(image, check_crcs=False)
    streamed = len(img.streamed_experts())
    if text.isdigit() and int(text) == 0:
        raise ValueError(f"--expert-cache {spec} streams nothing: leave it out to read the experts in place, or ask "
                         f"for at least {max(1, min(img.dims.top_k, streamed))} slots")
    if text.isdigit():
        return int(text)
    if text == "all":
        return streamed
    for suffix, scale in (("gib", 1 << 30), ("mib", 1 << 20), ("kib", 1 << 10), ("b", 1)):
        if text.endswith(suffix) and text[:-len(suffix)].strip().isdigit():
            budget = int(text[:-len(suffix)]) * scale
            slots = 0
            crcs = img.dims.n_layers * img.dims.n_experts
            while slots < streamed and expert_cache_bytes(img.expert_block_bytes, slots + 1, crcs) <= budget:
                slots += 1
            if slots == 0:
                raise ValueError(f"--expert-cache {spec}: one slot needs "
                                 f"{expert_cache_bytes(img.expert_block_bytes, 1, crcs):,} bytes")
            if slots == streamed and budget > expert_cache_bytes(img.expert_block_bytes, slots, crcs):
                say(f"--expert-cache {spec} holds every one of the image's {streamed} streamed experts: {slots} slots "
                    f"({expert_cache_bytes(img.expert_block_bytes, slots, crcs):,} bytes) are all it uses")
            return slots
    raise ValueError(f"--expert-cache {spec!r}: give a slot count, 'all', or bytes such as 512KiB or 4MiB")


def main(argv: list[str] | None = None) -> int:
    ap = Parser(__doc__)
    ap.add_argument("image", type=Path, help="image file made by colibri pack; or a checkpoint directory or a .gguf "
                                             "file, packed first into a cache (--dtype, --max-seq, --kv)")
    ap.add_argument("--board", help=f"board to start and run on (default {DEFAULT_BOARD}; not with --port)")
    ap.add_argument("--firmware", type=Path,
                    help="firmware ELF (default: the board's release build, built first when missing or stale)")
    ap.add_argument("--upload", action="store_true",
                    help="send the image over the serial link in checksummed chunks instead of QEMU's loader")
    ap.add_argument("--port", help="a real board's serial port: /dev/ttyUSB0, or a URL such as socket://host:2000 "
                                   "(ser2net) or rfc2217://host:2217; implies --upload")
    ap.add_argument("--baud", type=whole(1, 2**31 - 1), default=921600, help="baud rate for --port (default 921600)")
    ap.add_argument("--place", metavar="NAME|TAG=VALUE", help="a board farm's labgrid place, by name or tags "
                    "(board=cortex_m55: any free one): held for the run, its board reset, the image uploaded over its "
                    "serial port (docs/FARM.md; coordinator from $LG_COORDINATOR)")
    ap.add_argument("--place-timeout", type=float, default=60.0, metavar="SECONDS",
                    help="how long --place waits while someone else holds the place (default 60)")
    ap.add_argument("--lg-env", metavar="FILE", help="for --place: a labgrid environment file (its "
                                                     "coordinator_address; its targets' colibri_board option)")
    ap.add_argument("--gdb", action="store_true", help="start QEMU halted with a GDB stub and print how to attach")
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--prompt", metavar="TEXT", type=utf8_text,
                      help="a prompt in words, encoded with the image's tokenizer; the answer streams as text and "
                           "stops at the end-of-sequence token")
    what.add_argument("--chat", metavar="MESSAGE", nargs="?", const="", type=utf8_text,
                      help="a user message, put through the image's chat template; without one, an interactive "
                           "chat that keeps the KV cache across turns (/reset clears it, /quit or end of input ends)")
    what.add_argument("--prompt-tokens", type=parse_tokens, help="comma-separated token ids")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--temperature", type=number(0, 100), default=0.0, help="0 = greedy (default); 0 to 100")
    ap.add_argument("--top-k", type=whole(0, 2**32 - 1), default=0, help="0 = no top-k cut")
    ap.add_argument("--top-p", type=number(0, 1), default=1.0, help="1 = no nucleus cut; 0 to 1")
    ap.add_argument("--seed", type=whole(0, 2**64 - 1), default=0)
    ap.add_argument("--verify", action="store_true",
                    help="compare the device's logits with the numpy reference, bit for bit; when they part, name the "
                         "first token, layer and step where they do (one more run, traced)")
    ap.add_argument("--tolerance", type=number(0),
                    help="--verify within this max abs logit error instead of bit for bit (a deliberate comparison, "
                         "e.g. of a runtime you changed); --against: the near-tie margin for greedy tokens")
    ap.add_argument("--against", type=Path, metavar="CHECKPOINT",
                    help="also compare with transformers run on the checkpoint the image was packed from (a directory "
                         "or a .gguf file): catches packing mistakes that --verify, which rebuilds the model from the "
                         "image, cannot")
    ap.add_argument("--dump-logits", type=Path, metavar="FILE.npy",
                    help="save the device's logits: row i = after the i-th token fed, prompt first")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    ap.add_argument("--trace", action="store_true",
                    help="per token and layer: the routed experts, their gate weights, and the cycles spent in "
                         "attention, routing and each expert")
    ap.add_argument("--trace-out", type=Path, metavar="FILE.json",
                    help="save the trace (implies --trace) for tools/routing_report.py")
    ap.add_argument("--timeout", type=number(0, low_open=True), default=60.0,
                    help="seconds to wait for an answer before sending a request again (default 60)")
    ap.add_argument("--retries", type=whole(0, 1000), default=4,
                    help="retransmissions of a request before giving up (default 4)")
    ap.add_argument("--fault-rate", type=number(0, MAX_FAULT_RATE), default=0.0, metavar="R",
                    help="testing the link: drop/flip/duplicate/delay each byte with probability R in both directions, "
                         f"at most {MAX_FAULT_RATE} (tests/test_faults.py uses 0.001; at 0.01 two 100-byte frames in "
                         "three are damaged, and each damaged request waits --timeout before it is sent again: use a "
                         "short --timeout with it)")
    ap.add_argument("--fault-seed", type=int, default=0, help="seed of --fault-rate")
    ap.add_argument("--expert-cache", metavar="N|BYTES|all",
                    help="stream routed experts through the board's fetch hook into a cache of N slots (or as many "
                         "as BYTES such as 2MiB hold); at least top_k (docs/STREAMING.md)")
    ap.add_argument("--threads", type=int, default=1,
                    help="compute on N threads (the hosted board; bare-metal boards have one core). The same bits "
                         "for any N: each thread computes fixed rows")
    ap.add_argument("--dtype", choices=[d.name.lower() for d in DType] + ["stored"],
                    help="for a checkpoint or .gguf: the dtype to pack its large matrices in (default: as its files "
                         "store them, `stored`: a GGUF file's each in its own type, q8_0 for a GGUF type no image "
                         "has)")
    ap.add_argument("--max-seq", type=int, help="for a checkpoint or .gguf: the longest sequence to pack for "
                                                "(default: colibri pack's)")
    ap.add_argument("--kv", choices=("f32", "f16"),
                    help="for a checkpoint or .gguf: the KV cache's element type (default f32)")
    ap.add_argument("--no-prefetch", action="store_true",
                    help="with --expert-cache: do not guess and fetch the next layer's experts early")
    ap.add_argument("--experts", type=int, metavar="K",
                    help="route each token to its K best experts instead of the image's top_k (1 to top_k; "
                         "llama.cpp's --override-kv ARCH.expert_used_count=int:K): fewer experts, faster decode; with "
                         "--verify the run also says what K costs against top_k on its tokens (KL, top-1 agreement, "
                         "numpy reference). The family's routing rules stay, over the K chosen (docs/MODELS.md)")
    args = ap.parse_args(argv)
    if args.place is not None:
        from colibri.farm.run import FarmPlace
        place = FarmPlace(ap, args)
        try:
            return run(ap, args, place)
        finally:
            place.close()  # released on every way out: a return, an error, Ctrl-C, SIGTERM, SIGHUP
    return run(ap, args)


def take_place(ap: Parser, place: FarmPlace, img: Image, image_bytes: int, prompt: list[int] | None, max_new: int,
               slots: int) -> int | None:
    """--place, once the run's own arguments are checked: the place's board checked against the image, then the
    place held (FarmPlace.take); None when it is, else the exit status of the one-line error said."""
    from colibri.farm import FarmError
    try:
        problem = place.take(img, image_bytes, prompt, max_new, slots)
    except FarmError as exc:
        return ap.fail(str(exc))
    return ap.fail(problem) if problem else None


def run(ap: Parser, args: argparse.Namespace, place: FarmPlace | None = None) -> int:
    """colibri run with its arguments parsed (on a board it starts, the one at --port, or a farm place's, held
    only once every check the host can make has passed)."""
    remote = bool(args.port) or place is not None
    if args.port and (args.board is not None or args.gdb):
        ap.error("--port and --board each name the board: --port talks to the board on that serial port, --board "
                 "(and --gdb) start one; give one of them")
    args.board = args.board or DEFAULT_BOARD
    if args.max_new_tokens < 0:
        ap.error("--max-new-tokens must be >= 0")
    if args.against is not None and not args.against.exists():  # (else transformers takes it for a hub name)
        ap.error(f"--against {args.against} does not exist: give the checkpoint directory or GGUF file the image "
                 "was packed from")
    for option, path in (("--trace-out", args.trace_out), ("--dump-logits", args.dump_logits)):
        if path is not None and (problem := output_problem(path, option)):  # before the run, not after it
            return ap.fail(problem)
    if not 1 <= args.threads <= 64:
        ap.error("--threads takes 1 to 64")
    if args.threads > 1:
        try:
            threads_args(load_board(args.board), args.threads)
            if args.port:
                raise ValueError("--threads applies to a board flash.py starts, not one on a serial port")
        except ValueError as exc:
            ap.error(str(exc))
    if not args.image.exists():
        ap.error(f"image {args.image} not found; make one with colibri pack")
    if args.image.is_dir() or is_gguf(args.image):  # a model, not an image: packed first (or found packed)
        if args.max_seq is not None and args.max_seq < 1:
            ap.error("--max-seq must be at least 1")
        try:
            args.image = packed_image(args.image, args.dtype, args.max_seq, args.kv or "f32",
                                      None if remote else args.board,
                                      lambda line: print(line, file=sys.stderr, flush=True))
        except (UnsupportedModel, ValueError, OSError) as exc:
            return ap.fail(f"cannot pack {args.image}: {exc}")
    elif is_image(args.image):
        given = [flag for flag, value in (("--max-seq", args.max_seq), ("--dtype", args.dtype), ("--kv", args.kv))
                 if value is not None]
        if given:
            ap.error(f"{given[0]} applies to a checkpoint or a GGUF file, which colibri run packs first; {args.image} "
                     "is packed already: colibri pack packs it again with other options")
    if not remote:
        try:  # an unknown board, or no checkout to find boards in: said before anything is printed or started
            load_board(args.board)
        except ValueError as exc:
            return ap.fail(str(exc))

    try:  # the image's structure is checked here, before a board boots or an upload starts (its CRCs are
        img = open_image(args.image, check_crcs=False)  # the device's: it verifies every byte when it opens it)
    except ImageError as exc:
        return ap.fail(f"{args.image} is not a valid image ({exc}); make one with colibri pack")
    if args.experts is not None and (problem := experts_problem(img.dims, args.experts)):
        return ap.fail(problem)
    if args.experts is not None and args.against is not None and args.experts < img.dims.top_k:
        return ap.fail(f"--against runs transformers at the image's top-{img.dims.top_k}, not at --experts "
                       f"{args.experts}: leave out one of them")
    try:
        slots = cache_slots(args.expert_cache, args.image, lambda line: print(f"{ap.prog}: {line}",
                                                                               file=sys.stderr)) \
            if args.expert_cache else 0
    except (ValueError, ImageError) as exc:
        ap.error(str(exc))
    quiet = args.json
    sampling = Sampling(args.temperature, args.top_k, args.top_p, args.seed)
    greedy = args.temperature <= 0 or args.top_k == 1
    text: Text | None = None
    prompt: list[int] = args.prompt_tokens
    board = None if remote else load_board(args.board)
    image_bytes = args.image.stat().st_size
    if args.chat == "":
        try:
            text = Text(img.meta)
            if not text.meta.get("chat_template"):
                raise NoTokenizer("this image's checkpoint has no chat template: use --prompt")
            if problem := chat_room_problem(text, args.max_new_tokens, img.dims.max_seq):
                raise NotReady(problem)
            firmware = ready_firmware(img, image_bytes, board, None, args.max_new_tokens, slots, args.firmware)
        except (NoTokenizer, NotReady) as exc:
            return ap.fail(str(exc))
        if place is not None and (status := take_place(ap, place, img, image_bytes, None, args.max_new_tokens,
                                                       slots)) is not None:
            return status
        if hasattr(sys.stdin, "reconfigure"):  # a line's bytes that are not UTF-8 are said, not a traceback
            sys.stdin.reconfigure(errors="surrogateescape")
        try:
            run_chat(args.image, args.board, firmware, text, sampling, args.max_new_tokens, timeout=args.timeout,
                     retries=args.retries, expert_cache=slots, prefetch=not args.no_prefetch, threads=args.threads,
                     port=args.port, baud=args.baud, experts=args.experts)
        except (DeviceError, LinkError, ValueError) as exc:
            print(f"\n{ap.prog}: error: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.prompt_tokens is None:
        try:
            text = Text(img.meta)
            prompt = (text.encode(args.prompt) if args.prompt is not None
                      else text.chat_tokens([{"role": "user", "content": args.chat}]))
        except NoTokenizer as exc:
            return ap.fail(str(exc))
        if not prompt:
            ap.error("the prompt encodes to no tokens")
    try:
        firmware = ready_firmware(img, image_bytes, board, prompt, args.max_new_tokens, slots, args.firmware,
                                  args.upload, args.gdb)
    except NotReady as exc:
        return ap.fail(str(exc))
    if place is not None and (status := take_place(ap, place, img, image_bytes, prompt, args.max_new_tokens,
                                                   slots)) is not None:
        return status
    stream = TextStream(text) if text else None

    def on_token(ev) -> None:
        if not quiet:
            emit(stream.push(ev.token) if stream else f"{ev.token} ")

    if not quiet:
        asked = f"prompt {prompt}" if text is None else repr(args.prompt if args.prompt is not None else args.chat)
        if len(asked) > 80:  # a long prompt is the user's own text: its start says which one it was
            asked = asked[:60] + f"... ({len(prompt)} tokens)"
        print(f"[{args.port or args.board}] {asked} -> ", end="", flush=True)
        line_open(True)  # what is said on stderr from here goes below it
    want_logits = args.verify or args.dump_logits is not None or args.against is not None
    trace = args.trace or args.trace_out is not None
    wrap = None
    if args.fault_rate > 0:
        from colibri.sim.faults import LossyTransport
        wrap = lambda link: LossyTransport(link, args.fault_rate, args.fault_seed)  # noqa: E731
    try:
        if args.port:
            with open_port(args.port, args.baud) as port_link:
                link = wrap(port_link) if wrap else port_link
                result = run_session(Client(link, timeout=args.timeout, retries=args.retries), args.image,
                                     prompt, args.max_new_tokens, sampling, want_logits, True, on_token,
                                     trace, progress=not quiet, expert_cache=slots, prefetch=not args.no_prefetch,
                                     stop=text.eos_ids if text else frozenset(), experts=args.experts)
        else:
            result = run_on_board(args.image, args.board, prompt, args.max_new_tokens, sampling,
                                  want_logits, firmware=firmware, on_token=on_token, timeout=args.timeout,
                                  upload=args.upload,
                                  gdb=args.gdb, retries=args.retries, wrap=wrap, trace=trace, progress=not quiet,
                                  expert_cache=slots, prefetch=not args.no_prefetch,
                                  stop=text.eos_ids if text else frozenset(), threads=args.threads,
                                  experts=args.experts)
    except DeviceError as exc:
        hint = ""
        if exc.message == "arena too small":
            hint = f": the image needs a {exc.detail:,}-byte arena"
            if slots:
                hint += f" with {slots} expert cache slots; ask for fewer with --expert-cache"
        elif exc.code == STATUS_NAMES.index("E_CACHE_TOO_SMALL"):
            top_k = read_image(args.image.read_bytes()).dims.top_k
            hint = (f": one layer routes to {top_k} experts, so --expert-cache needs at least {top_k} slots "
                    f"({exc.detail:,} arena bytes)")
        elif exc.code == STATUS_NAMES.index("E_BAD_ARG") and slots:
            hint = f": --expert-cache {slots} is more slots than the image streams experts (try --expert-cache all)"
        print(below(f"{ap.prog}: {exc}{hint}"), file=sys.stderr)
        return 2
    except (LinkError, ValueError, FileNotFoundError, ImageError) as exc:
        print(below(f"{ap.prog}: error: {exc}"), file=sys.stderr)
        return 2
    line_open(False)
    if not quiet:
        if stream:
            emit(stream.finish())
        if result.upload_crc32 is not None:
            print(f"\n[{result.board}] image uploaded, device CRC-32 {result.upload_crc32:08x} matches", end="")
        clock = "" if args.port else board.spec.get("clock", "")
        routed = f", {args.experts} of top-{img.dims.top_k} experts" if args.experts is not None else ""
        print(f"\n[{result.board}, {result.kernels} kernels{routed}] {timing_line(result)}")
        print(f"[{result.board}] {phases_line(result.stats, clock)}")
        if result.expert_cache:
            print(f"[{result.board}] {cache_line(result.stats, result.expert_cache)}")
    if args.dump_logits:
        with open(args.dump_logits, "wb") as f:  # the name given (np.save would add .npy to one without it)
            np.save(f, result.logits)
    if trace:
        traced = trace_report(result, prompt, args.image, text or optional_text(img))
        if args.trace_out:
            args.trace_out.write_text(json.dumps(traced))
        if not quiet:
            print_trace(traced)
    report: dict = {"board": result.board, "kernels": result.kernels, "prompt_tokens": prompt, "tokens": result.tokens,
                    "stats": result.stats, "upload_crc32": result.upload_crc32, "timing": result.timing,
                    "threads": result.threads, "prefill_batch": result.prefill_batch}
    if place is not None and place.held is not None:
        report["place"] = place.held.name
    if text is not None:
        report["text"] = text.decode(result.tokens)
    status = 0
    if args.verify:
        reference = Reference(read_image(args.image.read_bytes()), experts=args.experts)
        v = verify(reference, prompt, result, sampling, args.tolerance)
        if v.first_difference is not None and v.tolerance is None and not v.parting:
            # one more run, traced: its residual CRCs and routing name the first layer where device and reference part
            v.parting = traced_parting(reference, args.board, args.port, result, prompt, lambda: run_on_board(
                args.image, args.board, prompt, args.max_new_tokens, sampling, False, firmware=firmware,
                timeout=args.timeout, upload=args.upload, retries=args.retries, trace=True, expert_cache=slots,
                prefetch=not args.no_prefetch, stop=text.eos_ids if text else frozenset(), threads=args.threads,
                experts=args.experts))
        report["verify"] = {**asdict(v), "passed": v.passed}
        status = 0 if v.passed else 1
        if not quiet:
            print(verify_line(v))
            if v.parting:
                print(f"verify: {v.parting}")
        if args.experts is not None and args.experts < img.dims.top_k:
            del reference  # its weights, before the full top_k's reference reads them again
            report["experts"] = experts_cost(args.image, prompt + result.tokens, result.logits, args.experts)
            if not quiet:
                print(experts_line(report["experts"]))
    if args.against:
        from colibri.oracle import OracleUnavailable
        try:
            a = against(args.against, open_image(args.image).data, prompt, result, greedy, args.tolerance)
        except (OracleUnavailable, ValueError, OSError) as exc:
            return ap.fail(f"--against {args.against}: {exc}")
        report["against"] = {**asdict(a), "checkpoint": str(args.against), "passed": a.passed}
        status = status or (0 if a.passed else 1)
        if not quiet:
            greedy_txt = tokens_text(a) + (f" (near ties within {a.tolerance:g})" if a.tokens_checked else "")
            print(f"against transformers on {args.against}: max |device - transformers| = {a.max_abs_error:.3g} over "
                  f"{a.rows} logits rows; {greedy_txt}: {'PASS' if a.passed else 'FAIL'}")
    if args.json:
        print(json.dumps(report))
    return status


if __name__ == "__main__":
    sys.exit(main())
