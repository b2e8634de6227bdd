"""The optimized kernels against the scalar ones, bit for bit, on every board (tests/kernel_check.c)."""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from conftest import RELEASE_BOARDS, build
from colibri.protocol import LinkClosed, LinkTimeout
from colibri.sim.boards import load_board
from colibri.sim.launch import start_board

def host_kernels() -> str:
    """The x86 kernel set CPUID should choose on this machine (Linux names the CPUID bits in /proc/cpuinfo)."""
    flags = set(next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")),
                     "").split())
    if not {"avx2", "f16c"} <= flags:
        return "scalar"
    return "avx512" if {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= flags else "avx2"


# QEMU's `-cpu max` (x86_64_baremetal) has AVX2 and F16C but no AVX-512 (TCG does not emulate it), so the
# AVX2 set is checked there; the hosted board gets whatever this CPU has
EXPECTED_KERNELS = {"hosted": host_kernels(), "x86_64_baremetal": "avx2",
                    "cortex_m55": "mve", "cortex_m4": "dsp", "cortex_m33": "dsp", "riscv64_virt": "rvv"}
EXPECTED_KERNELS["hosted_windows"] = EXPECTED_KERNELS["hosted"]


def run_kernel_check(board: str, elf: Path, extra_args: list[str] | None = None,
                     line_times: list[float] | None = None) -> tuple[str, int | None]:
    """Run a kernel_check.elf on its board; returns (what it printed, the guest's exit code). With
    `line_times`, appends the host's clock when each line arrived."""
    b = load_board(board)
    # the hosted board maps an image before it serves; the check ignores it
    image = elf if b.spec["link"] == "stdio" else None
    out = bytearray()
    with start_board(b, elf, image, extra_args, protocol=False) as dev:
        try:
            while True:
                out += dev.link.read(1, 300)
                if out.endswith(b"\n") and line_times is not None:
                    line_times.append(time.monotonic())
        except (LinkClosed, LinkTimeout):
            pass
    return out.decode(errors="replace"), dev.guest_code


# The kernel sets with prefill tiles, and how many the check compares, 400 each: two rows by two tokens (f32, f16,
# bf16, Q8_0, Q4_0) and runs of rows by four tokens (Q4_K, Q5_K, Q6_K; the avx512 set's also Q8_0, Q4_0).
TILE_DTYPES = {"avx2": 8, "avx512": 10}


def check_report(text: str, code: int | None, kernels: str) -> None:
    assert f": kernels {kernels}" in text, text
    # every kernel set has its own rows for every block dtype (the scalar set is the reference: none named), so the
    # block-dtype checks compare two kernels, not the scalar rows with themselves
    fallback = re.search(r"scalar block rows:(.*)", text)
    assert fallback and not fallback.group(1).split(), f"{kernels} takes kernels_block.c's rows: {text}"
    m = re.search(r"kernel_check: (\d+) cases, (\d+) tiles, (\d+) mismatches", text)
    assert m, text
    # 400 inputs x (5 dots or rows, quantize, swiglu, 2 accumulates, 2 scores, softmax)
    assert int(m.group(1)) == 4800 and int(m.group(3)) == 0, text
    assert int(m.group(2)) == 400 * TILE_DTYPES.get(kernels, 0), text
    assert code == 0, text


@pytest.mark.parametrize("board", RELEASE_BOARDS)
def test_optimized_kernels_equal_scalar(board, firmwares):
    times: list[float] = []
    text, code = run_kernel_check(board, load_board(board).program("kernel_check"), line_times=times)
    check_report(text, code, EXPECTED_KERNELS[board])
    # The board's cycle counter across a phase longer than 2^24 cycles (a SysTick-sized counter wraps
    # there) against the host's clock: QEMU's virtual clock follows the host's without -icount.
    lines = text.splitlines()
    clock = [i for i, line in enumerate(lines) if line.startswith("clock ")]
    assert len(clock) == 2, text
    first, second = (lines[i].split() for i in clock)
    cycles, hz = int(second[1], 16) - int(first[1], 16), int(second[3], 16)
    wall = times[clock[1]] - times[clock[0]]
    assert hz, text
    if load_board(board).spec["link"] != "stdio":  # a hardware counter; an OS clock has 64 bits
        assert wall > min(1.0, (1 << 24) / hz), "the phase must outlast a 24-bit counter at this clock"
    assert 0.5 < cycles / hz / wall < 2.0, f"{cycles} cycles at {hz} Hz over {wall:.2f} s of host time"


def test_board_files_name_the_kernels_their_firmware_uses():
    """`colibri boards` shows board.toml's kernels: the set each board's firmware was seen to choose is among them,
    and so is scalar where CPUID may pick it (test_x86_without_avx2_falls_back_to_scalar)."""
    for board, kernels in EXPECTED_KERNELS.items():
        assert kernels in load_board(board).spec["kernels"], board
    assert "scalar" in load_board("x86_64_baremetal").spec["kernels"]


def test_x86_without_avx2_falls_back_to_scalar(firmwares):
    """One binary: on a CPU without AVX2 (QEMU's Nehalem model) CPUID picks the scalar kernels."""
    text, code = run_kernel_check("x86_64_baremetal", firmwares["x86_64_baremetal"].with_name("kernel_check.elf"),
                                  ["-cpu", "Nehalem"])
    check_report(text, code, "scalar")


def test_kernels_scalar_build_selects_scalar():
    """`scons kernels=scalar` really builds the scalar path (the check then compares scalar with scalar)."""
    text, code = run_kernel_check("hosted", build("hosted", kernels="scalar") / "kernel_check.elf")
    check_report(text, code, "scalar")
