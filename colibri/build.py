#!/usr/bin/env python3
"""Build a board's firmware: SCons (SConstruct) underneath, into build/<board>/<mode>/ of the Colibri tree (the
checkout, or for an installed package its copy in the user's cache: colibri/paths.py).

Examples:
  colibri build --board cortex_m4
  colibri build --board hosted --mode debug
  colibri build --board cortex_m55 --kernels scalar
  colibri build --board cortex_m55 --rtos freertos   # as FreeRTOS tasks (FREERTOS_KERNEL_PATH; docs/RTOS.md)

`colibri run` builds a board's firmware itself when it is missing or older than its sources.
"""
from __future__ import annotations

import fcntl
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

from colibri.console import Parser
from colibri.paths import ROOT
from colibri.sim.boards import Board, board_names, load_board, rtos_kernel_problem, rtos_names

MODES = ("release", "debug", "asan")
BUILD_LOCK = "build.lock"  # in build/: one SCons run at a time per tree (pytest-xdist's workers share one)
KERNELS = ("auto", "scalar")


class BuildError(RuntimeError):
    """The firmware could not be built; the message says why and what to do."""


def output_dir(board: str, mode: str = "release", kernels: str = "auto", lean: bool = False,
               rtos: str = "none") -> Path:
    """Where SConstruct puts a build: build/<board>/<mode>[-scalar][-lean][-<rtos>]."""
    return ROOT / "build" / board / (mode + ("-scalar" if kernels == "scalar" else "") + ("-lean" if lean else "")
                                     + ("" if rtos == "none" else f"-{rtos}"))


def firmware_targets(board: Board, out: Path) -> list[Path]:
    """The files a run needs: the firmware, and the image QEMU boots where the board converts it (x86's .kernel)."""
    elf = out / ("firmware" + board.spec.get("program_suffix", ".elf"))
    return [elf] + ([elf.with_suffix(".kernel")] if "kernel_objcopy" in board.spec else [])


def sources(board: Board) -> list[Path]:
    """What a board's firmware is built from: SConstruct, the runtime, the board's folder and the folders it
    shares (boards/common, ...)."""
    folders = {ROOT / "firmware", ROOT / "boards" / board.name}
    folders |= {ROOT / "boards" / s[3:].partition("/")[0] for s in board.spec["sources"] if s.startswith("../")}
    return [ROOT / "SConstruct"] + [p for folder in folders for p in folder.rglob("*") if p.is_file()]


def staleness(board: Board, out: Path) -> str | None:
    """Why a build of `board` in `out` must be made: missing, or older than a source; None when it is current."""
    targets = firmware_targets(board, out)
    if not all(t.exists() for t in targets):
        return "not built yet"
    built = min(t.stat().st_mtime for t in targets)
    newer = [p for p in sources(board) if p.stat().st_mtime > built]
    return f"older than {newer[0].relative_to(ROOT)}" if newer else None


def check_toolchain(board: Board) -> None:
    cc = board.spec["cc"]
    if shutil.which(cc) is None:
        package = board.spec.get("toolchain_package", cc)
        raise BuildError(f"the compiler {cc} for {board.name} is not installed: apt-get install {package} "
                         "(tools/setup.sh installs every board's)")
    if importlib.util.find_spec("SCons") is None:
        raise BuildError("SCons is not installed: pip install scons")


def build(board: Board, mode: str = "release", kernels: str = "auto", lean: bool = False, rtos: str = "none") -> Path:
    """Build `board`'s firmware (one build at a time in a tree: concurrent SCons runs would share its database);
    returns the output folder. Raises BuildError with the compiler's last lines when it fails."""
    check_toolchain(board)
    if rtos != "none":
        if rtos not in rtos_names(board.spec):
            having = [b for b in board_names() if rtos in rtos_names(load_board(b).spec)]
            raise BuildError(f"{board.name} has no {rtos} build (its board.toml has no [rtos.{rtos}]); boards with "
                             f"one: {', '.join(having) or 'none'}")
        if rtos_kernel_problem(rtos):
            raise BuildError(rtos_kernel_problem(rtos))
    out = output_dir(board.name, mode, kernels, lean, rtos)
    (ROOT / "build").mkdir(exist_ok=True)
    with open(ROOT / "build" / BUILD_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = subprocess.run([sys.executable, "-m", "SCons", "-Q", f"board={board.name}", f"mode={mode}",
                               f"kernels={kernels}", f"lean={'yes' if lean else 'no'}", f"rtos={rtos}",
                               *(str(t.relative_to(ROOT)) for t in firmware_targets(board, out))],
                              cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        how = f"scons board={board.name} mode={mode}" + (f" rtos={rtos}" if rtos != "none" else "")
        raise BuildError(f"building {board.name} failed ({how} in {ROOT}):\n{tail}")
    for target in firmware_targets(board, out):  # SCons judges by content: a touched source left them as they were,
        target.touch()                           # and they are current now
    return out


def ensure_built(board: Board, say=lambda line: print(line, file=sys.stderr)) -> Path:
    """The release firmware of `board`, built first (said in one line) when it is missing or stale."""
    out = output_dir(board.name)
    why = staleness(board, out)
    if why:
        say(f"{board.name}: the firmware is {why}: building it (colibri build --board {board.name})")
        build(board)
    return firmware_targets(board, out)[0]


def main(argv: list[str] | None = None) -> int:
    ap = Parser(__doc__)
    ap.add_argument("--board", required=True, help=f"the board to build for: {', '.join(board_names()) or '(none)'}")
    ap.add_argument("--mode", default="release", choices=MODES, help="release (default), debug, or asan (hosted)")
    ap.add_argument("--kernels", default="auto", choices=KERNELS,
                    help="auto: the board's SIMD kernels (default); scalar: the portable reference kernels only")
    ap.add_argument("--lean", action="store_true",
                    help="leave the newer families' mechanisms out (a smaller runtime: docs/BOARDS.md)")
    ap.add_argument("--rtos", default="none", help="none (default: bare metal), or an RTOS the board's board.toml has "
                    "a build for: freertos (the kernel tree FREERTOS_KERNEL_PATH names; docs/RTOS.md)")
    args = ap.parse_args(argv)
    try:
        board = load_board(args.board)
        out = build(board, args.mode, args.kernels, args.lean, args.rtos)
    except (ValueError, BuildError) as exc:
        return ap.fail(str(exc))
    for target in firmware_targets(board, out):
        print(f"built {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
