#!/usr/bin/env python3
"""How long a FreeRTOS build can keep its tick waiting, measured instruction by instruction (docs/RTOS.md).

The 1 kHz deadline task's release starts with the tick interrupt, which has the lowest priority the kernel uses:
it waits while the core runs any exception handler (SysTick itself, PendSV, the UART's receive interrupt, SVC) and
while a task holds interrupts masked (BASEPRI raised to configMAX_SYSCALL_INTERRUPT_PRIORITY or PRIMASK set on
Cortex-M; mstatus.MIE cleared or a trap being handled on RISC-V). This runs the board's release-freertos firmware
under QEMU with one instruction a translation block and its execution and interrupt log (-singlestep -d
exec,nochain,int) read through a pipe, the virtual clock following the instructions (-icount shift=5, as the deadline
test runs), over a session that exercises every path the tests measure jitter over:
OPEN (the image's verification), a prompt and new tokens with the expert cache at its minimum (fetch_start's claim
and queue, the fetch task, fetch_wait's sleep), a second context generating in the pair task meanwhile (time
slices) and the board's requests. It prints the longest stretches in which the tick could not have been taken, in
instructions, with the function each began in.

  python tools/critical_sections.py --board cortex_m55 [--tokens 1]

The figures are instructions, not cycles: QEMU's -icount (which the deadline test uses) gives every instruction
the same time, while a real core's cycles per instruction vary (loads, branches, FP, waits on flash or a bus).
About 100 million instructions are traced for one new token of the demo model: a few minutes a board.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from colibri.console import Parser  # noqa: E402
from colibri.paths import ROOT  # noqa: E402
from colibri.sim.boards import board_names, load_board  # noqa: E402

PROMPT = [13, 1, 2, 3, 10, 0, 4, 5, 11]  # the demo model's "^123+045="
# The virtual clock following the instructions, as in the deadline test (tests/test_rtos.py): without it the tick
# follows the host's clock, and a guest slowed down a hundredfold by the trace would do little but take ticks.
ICOUNT = ["-icount", "shift=5"]
INSN = re.compile(r"^\s*([0-9a-f]+):\s+(?:[0-9a-f]{2,8}\s)+\s*(\S+)\s*(.*)$")


@dataclass
class Marks:
    """Addresses whose execution changes whether interrupts are masked, from the firmware's disassembly."""
    mask: set[int] = field(default_factory=set)
    unmask: set[int] = field(default_factory=set)
    trap_return: set[int] = field(default_factory=set)  # RISC-V's mret: the end of a trap


def marks(board: str, elf: Path) -> Marks:
    """Cortex-M: `msr BASEPRI, rN` raises the mask when the nearest `mov rN, #imm` before it in the function loads a
    non-zero value, else lowers it (a restored saved value is taken as 0: the kernel restores a non-zero one only
    inside an interrupt handler, which blocks the tick anyway); cpsid/cpsie i set and clear PRIMASK. RISC-V: csrc and
    csrs of mstatus's MIE bit (8), and mret."""
    spec = load_board(board).spec
    objdump = spec["objcopy"].replace("objcopy", "objdump")
    text = subprocess.run([objdump, "-d", str(elf)], capture_output=True, text=True, check=True).stdout
    m, recent = Marks(), []
    for line in text.splitlines():
        if line.endswith(">:"):  # a new function
            recent = []
            continue
        got = INSN.match(line)
        if not got:
            continue
        addr, op, args = int(got.group(1), 16), got.group(2), got.group(3).replace(" ", "")
        if op.startswith("msr") and args.upper().startswith("BASEPRI,"):
            reg = args.split(",")[1]
            imm = next((v for r, v in reversed(recent) if r == reg), 0)
            (m.mask if imm else m.unmask).add(addr)
        elif op == "cpsid" and args.startswith("i"):
            m.mask.add(addr)
        elif op == "cpsie" and args.startswith("i"):
            m.unmask.add(addr)
        elif op in ("csrc", "csrci") and args == "mstatus,8":
            m.mask.add(addr)
        elif op in ("csrs", "csrsi") and args == "mstatus,8":
            m.unmask.add(addr)
        elif op == "mret":
            m.trap_return.add(addr)
        mov = re.match(r"(r\d+|ip|lr),#(-?\d+)", args) if op.startswith("mov") else None
        recent = (recent + [(mov.group(1), int(mov.group(2)))])[-6:] if mov else recent
    return m


@dataclass
class Window:
    length: int     # instructions the tick could not have been taken in
    began: str      # the function the first of them is in
    why: str        # what blocked it first: "masked" (a task's critical section) or "exception N" / "trap"
    ran: dict[str, int] = field(default_factory=dict)  # instructions by function


def longest_windows(log, m: Marks, keep: int = 8) -> tuple[list[Window], int]:
    """Read QEMU's log line by line: the `keep` longest windows (the longest one beginning in each function), and
    the number of instructions seen. Only once the scheduler runs (from the first exception or trap: the port starts
    the first task with one): before it the kernel keeps interrupts masked from the first xTaskCreateStatic on, with
    no tick yet to delay."""
    depth, masked, trap = 0, False, False  # exceptions active (Cortex-M); interrupts masked; in a trap (RISC-V)
    run, began, why, cause, seen, started = 0, "", "", "", 0, False
    ran: dict[str, int] = {}
    best: dict[str, Window] = {}

    def blocked() -> bool:
        return depth > 0 or masked or trap

    for raw in log:
        if raw.startswith(b"Trace "):  # "Trace 0: 0x<host> [<flags>/<pc>/<...>/<...>] <function>"
            seen += 1
            lb, rb = raw.index(b"["), raw.index(b"]")
            pc = int(raw[lb + 1:rb].split(b"/")[1], 16)
            masked |= pc in m.mask
            if blocked() and started:
                function = raw[rb + 1:].strip().decode(errors="replace") or hex(pc)
                if not run:
                    began, why, cause, ran = function, cause or "masked", "", {}
                ran[function] = ran.get(function, 0) + 1
                run += 1
            masked &= pc not in m.unmask
            trap &= pc not in m.trap_return
            if run and not blocked():
                if began not in best or best[began].length < run:
                    best[began] = Window(run, began, why, ran)
                run = 0
        elif raw.startswith(b"Taking exception "):
            number = int(raw.split()[2])
            if number != 8:  # 8 is QEMU's M-profile exception exit, logged as an exception
                started = True
                cause = cause if blocked() else f"exception {number}"
                depth += 1
        elif raw.startswith(b"...successful exception return"):
            depth = max(depth - 1, 0)
        elif b"riscv_cpu_do_interrupt" in raw:
            cause = cause if blocked() else "trap " + (raw.split(b"desc=")[1].strip().decode() if b"desc=" in raw
                                                       else "")
            trap = started = True
    return sorted(best.values(), key=lambda w: -w.length)[:keep], seen


def main(argv: list[str] | None = None) -> int:
    from colibri.flash import run_session
    from colibri.pack import pack
    from colibri.protocol import Sampling
    from colibri.sim import launch
    from colibri.sim.launch import start_board
    from colibri.sim.rtos import MeasuringClient, pair_result, pair_start

    ap = Parser(__doc__, prog="tools/critical_sections.py")
    ap.add_argument("--board", default="cortex_m55", choices=board_names())
    ap.add_argument("--tokens", type=int, default=1, help="new tokens after the 9-token prompt (default 1)")
    args = ap.parse_args(argv)
    firmware = ROOT / "build" / args.board / "release-freertos" / "firmware.elf"
    if not firmware.is_file():
        return ap.fail(f"{firmware} is missing: build it with `colibri build --board {args.board} --rtos freertos`")
    m = marks(args.board, firmware)
    with tempfile.TemporaryDirectory() as tmp:
        image, fifo = Path(tmp) / "demo.img", Path(tmp) / "qemu.log"
        pack(ROOT / "models" / "demo-adder", image, 16, 64, measure_quality=False)
        os.mkfifo(fifo)
        found: dict = {}
        reader = threading.Thread(target=lambda: found.update(
            zip(("windows", "seen"), longest_windows(open(fifo, "rb", buffering=1 << 20), m))))
        reader.start()
        other = [13, 9, 8, 7, 10, 0, 1, 2, 11]

        class Pair(MeasuringClient):  # the pair task generating beside the link's context, as in the tests
            def open(self, *a, **k):
                opened = super().open(*a, **k)
                pair_start(self, other, 16 - len(other))
                return opened

            def quit(self, code: int = 0) -> None:
                pair_result(self, 16)
                super().quit(code)

        launch.BOOT_TIMEOUT = 1200.0  # every instruction logged: the boot, the image's check included, takes minutes
        with start_board(load_board(args.board), firmware, image,
                         ["-singlestep", "-d", "exec,nochain,int", "-D", str(fifo), *ICOUNT]) as device:
            client = Pair(device.link, timeout=1200)
            run_session(client, image, PROMPT, args.tokens, Sampling(), True, False, expert_cache=2)
        reader.join()
    print(f"{args.board} FreeRTOS: {found['seen']:,} instructions traced; the longest stretches in which the tick "
          "could not be taken (one per function they began in):")
    for w in found["windows"]:
        most = ", ".join(f"{f} {n}" for f, n in sorted(w.ran.items(), key=lambda kv: -kv[1])[:6])
        print(f"  {w.length:>6,} instructions from {w.began} ({w.why}): {most}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
