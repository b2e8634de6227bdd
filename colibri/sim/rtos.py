"""The RTOS builds' own requests (docs/RTOS.md), the board requests 0x70-0x7F that boards/common/freertos/freertos.c
answers with type | 0x80: the deadline task's release jitter, every task's stack high-water mark, and a second
context in a task of its own.

  python -m colibri.sim.rtos IMAGE --board cortex_m55 [--icount 5] [--tokens N] [--expert-cache SLOTS]

boots the board's FreeRTOS build (build/<board>/release-freertos), restarts the deadline window with the idle task
spinning, runs a greedy generation verified against the numpy reference, and prints the jitter and the stacks.
"""
from __future__ import annotations

import struct
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

from colibri.protocol import Client, Sampling

REQ_RTOS_STATS, REQ_PAIR_START, REQ_PAIR_RESULT = 0x70, 0x71, 0x72
# RTOS_STATS flags: restart the deadline window; the idle task spins rather than sleeps; the deadline task is held
RESTART, SPIN, HOLD = 1, 2, 4


@dataclass
class TaskStack:
    name: str
    bytes: int       # given to xTaskCreateStatic
    used: int        # the most it has used: bytes less uxTaskGetStackHighWaterMark's
    priority: int


@dataclass
class RtosStats:
    tick_hz: int
    period: int                  # counter ticks in a tick period
    counters: dict[str, int]     # by name (boards/common/freertos/freertos.c's rtos_stats): see the properties
    tasks: list[TaskStack]

    def __getitem__(self, name: str) -> int:
        return self.counters[name]

    # the deadline task's window: releases since it started; each release's time less (the window's first + k
    # periods), and the interval between consecutive releases, in counter ticks
    releases = property(lambda self: self["releases"])
    late_min = property(lambda self: self["late_min"])
    late_max = property(lambda self: self["late_max"])
    interval_min = property(lambda self: self["interval_min"])
    interval_max = property(lambda self: self["interval_max"])

    @property
    def jitter(self) -> int:
        """The release jitter: the spread of the releases' lateness, counter ticks."""
        return self.late_max - self.late_min

    def task(self, name: str) -> TaskStack:
        return next(t for t in self.tasks if t.name == name)


SIGNED = ("late_min", "late_max")  # counters the board sends as two's complement


def rtos_stats(client: Client, flags: int = 0) -> RtosStats:
    p = client.call(REQ_RTOS_STATS, struct.pack("<I", flags), REQ_RTOS_STATS | 0x80)
    tick_hz, period, n = struct.unpack_from("<III", p)
    at, counters = 12, {}
    for _ in range(n):
        name, value = struct.unpack_from("<16sQ", p, at)
        name = name.rstrip(b"\0").decode()
        counters[name] = value - (1 << 64) if name in SIGNED and value >> 63 else value
        at += 24
    tasks = []
    for _ in range(struct.unpack_from("<I", p, at)[0]):
        name, size, used, prio = struct.unpack_from("<16sIII", p, at + 4)
        tasks.append(TaskStack(name.rstrip(b"\0").decode(), size, used, prio))
        at += 28
    return RtosStats(tick_hz, period, counters, tasks)


def pair_start(client: Client, prompt: list[int], new_tokens: int) -> int:
    """Start a second context on the open image, generating greedily in the pair task, again and again until
    pair_result; its arena's offset."""
    p = client.call(REQ_PAIR_START, struct.pack(f"<II{len(prompt)}I", new_tokens, len(prompt), *prompt),
                    REQ_PAIR_START | 0x80)
    return struct.unpack("<Q", p)[0]


@dataclass
class PairResult:
    status: int
    tokens: list[int]   # the prompt, then what it generated
    crcs: list[int]     # CRC-32 of each row of logits (after each fed token)
    cycles: int         # of its first generation
    runs: int           # generations it made (it repeats from a reset context until asked for the result)
    differing: int      # of the later ones, those whose tokens or rows differ from the first's


def pair_result(client: Client, n_tokens: int) -> PairResult:
    """Stop the pair after its current generation and read what its first gave."""
    p = client.call(REQ_PAIR_RESULT, b"", REQ_PAIR_RESULT | 0x80)
    status, rows, cycles, runs, differing = struct.unpack_from("<IIQII", p)
    tokens = list(struct.unpack_from(f"<{n_tokens}I", p, 24))
    crcs = list(struct.unpack_from(f"<{rows}I", p, 24 + 4 * n_tokens))
    return PairResult(status, tokens, crcs, cycles, runs, differing)


def row_crcs(logits) -> list[int]:
    """The CRC-32 of each row of float32 logits, as the board computes it (colibri_crc32 is zlib's)."""
    return [zlib.crc32(row.astype("<f4").tobytes()) & 0xFFFFFFFF for row in logits]


class MeasuringClient(Client):
    """A Client that, just before OPEN, restarts the deadline window (flags), and before QUIT reads the RTOS stats:
    flash.run_session's session measured as it runs, OPEN's verification of the image included."""

    def __init__(self, *args, flags: int = RESTART, **kwargs):
        super().__init__(*args, **kwargs)
        self.flags = flags
        self.rtos: RtosStats | None = None

    def open(self, *args, **kwargs):
        rtos_stats(self, self.flags)
        return super().open(*args, **kwargs)

    def quit(self, code: int = 0) -> None:
        self.rtos = rtos_stats(self, self.flags & SPIN)
        super().quit(code)


def main(argv: list[str] | None = None) -> int:
    from colibri.console import Parser
    from colibri.flash import run_session, verify
    from colibri.image import read_image
    from colibri.paths import ROOT
    from colibri.protocol import DeviceError, LinkError
    from colibri.reader import ImageError
    from colibri.reference import Reference
    from colibri.sim.boards import board_names, load_board, rtos_kernel_problem, rtos_names
    from colibri.sim.launch import start_board

    ap = Parser(__doc__, prog="python -m colibri.sim.rtos")
    ap.add_argument("image", type=Path)
    ap.add_argument("--board", default="cortex_m55", choices=board_names())
    ap.add_argument("--icount", type=int, default=5, help="QEMU -icount shift: 2^N ns an instruction (default 5)")
    ap.add_argument("--tokens", type=int, help="new tokens to generate (default: as many as the image's max_seq "
                    "leaves after the prompt)")
    ap.add_argument("--prompt-tokens", default="13,1,2,3,10,0,4,5,11", help="comma-separated token ids (default: "
                    "the demo model's \"^123+045=\")")
    ap.add_argument("--expert-cache", type=int, default=0, help="expert cache slots (0: none)")
    args = ap.parse_args(argv)
    try:
        prompt = [int(t) for t in args.prompt_tokens.split(",")]
    except ValueError:
        ap.error(f"--prompt-tokens {args.prompt_tokens!r} is not a comma-separated list of token ids")
    if "freertos" not in rtos_names(load_board(args.board).spec):
        return ap.fail(f"board {args.board} has no FreeRTOS build (its board.toml has no [rtos.freertos])")
    firmware = ROOT / "build" / args.board / "release-freertos" / "firmware.elf"
    if not firmware.is_file():
        kernel = rtos_kernel_problem("freertos")
        return ap.fail(f"{firmware} is missing: build it with `scons board={args.board} rtos=freertos`"
                       + (f" ({kernel})" if kernel else ""))
    if not args.image.is_file():
        return ap.fail(f"image {args.image} not found; make one with colibri pack")
    try:
        ref = Reference(read_image(args.image.read_bytes()))
    except ImageError as exc:
        return ap.fail(f"{args.image} is not a valid image ({exc}); make one with colibri pack")
    tokens = ref.d.max_seq - len(prompt) if args.tokens is None else args.tokens
    if tokens < 1 or len(prompt) + tokens > ref.d.max_seq:
        return ap.fail(f"{len(prompt)} prompt + {tokens} new tokens do not fit the image's max_seq {ref.d.max_seq}: "
                       f"give --tokens 1 to {ref.d.max_seq - len(prompt)} or a shorter --prompt-tokens"
                       if len(prompt) < ref.d.max_seq else
                       f"{len(prompt)} prompt tokens leave no room in the image's max_seq {ref.d.max_seq}")
    extra = ["-icount", f"shift={args.icount}"] if args.icount >= 0 else []
    try:
        with start_board(load_board(args.board), firmware, args.image, extra) as device:
            client = MeasuringClient(device.link, timeout=120, flags=RESTART | SPIN)
            result = run_session(client, args.image, prompt, tokens, Sampling(), True, False,
                                 expert_cache=args.expert_cache)
    except (DeviceError, LinkError, FileNotFoundError, ValueError) as exc:
        return ap.fail(str(exc))
    v = verify(ref, prompt, result, Sampling())
    s = client.rtos
    us = 1e6 / (s.period * s.tick_hz)  # a counter tick in microseconds
    print(f"{args.board} FreeRTOS, QEMU -icount shift={args.icount}: {len(prompt)} + {tokens} tokens, "
          f"logits {'bit-identical to the reference' if v.bit_identical else 'DIFFER'}")
    print(f"deadline task at {s.tick_hz} Hz: {s.releases} releases, lateness {s.late_min * us:+.1f} to "
          f"{s.late_max * us:+.1f} us (jitter {s.jitter * us:.1f} us), intervals {s.interval_min * us:.1f} to "
          f"{s.interval_max * us:.1f} us")
    print(f"fetch task: {s['xfer_queued']} transfers ({s['xfer_at_once']} copied at once, {s['xfer_pending']} "
          f"still pending when fetch_start returned); fetch_wait slept {s['fetch_sleeps']} of {s['fetch_waits']} "
          f"times; prefetch issued {result.stats.get('prefetch_issued', 0)}")
    for t in s.tasks:
        print(f"  {t.name:<10} priority {t.priority}  stack {t.bytes:>6,}  most used {t.used:>6,}")
    return 0 if v.bit_identical else 1


if __name__ == "__main__":
    from colibri.console import guarded
    sys.exit(guarded(main, prog="python -m colibri.sim.rtos"))
