"""The Windows board as Windows sees it (the model tests run it through MODEL_BOARDS): one .exe that needs
no DLL beyond Windows' own, and a runtime that MSVC would compile (clang in MSVC mode as the stand-in:
CI has no MSVC)."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from conftest import ROOT, build
from colibri import footprint
from colibri.paths import runtime_sources

# What every Windows 8 or later has: the C runtime that ships with Windows, the kernel, and the API set
# that WaitOnAddress lives in.
SYSTEM_DLLS = {"kernel32.dll", "msvcrt.dll", "api-ms-win-core-synch-l1-2-0.dll"}


def test_the_program_needs_no_dll_beyond_windows():
    out = build("hosted_windows")
    for program in ("firmware.exe", "kernel_check.exe"):
        exe = out / program
        headers = subprocess.run([footprint.COFF_TOOLS + "objdump", "-p", str(exe)], capture_output=True, text=True,
                                 check=True).stdout
        dlls = {m.lower() for m in re.findall(r"DLL Name: (\S+)", headers)}
        assert "kernel32.dll" in dlls  # the listing was read
        assert dlls <= SYSTEM_DLLS, dlls - SYSTEM_DLLS


MSVC = ["clang", "--target=x86_64-pc-windows-msvc", "-std=c11", "-ffreestanding", "-Wall", "-Werror",
        # MSVC does not define it; clang in MSVC mode does (and __x86_64__, which its own headers need:
        # the runtime's guards name _M_X64 beside it, checked below)
        "-U__clang__",
        # MSVC declares every intrinsic whatever the target; clang's headers only those the target enables
        "-mavx2", "-mf16c", "-mpclmul", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-Ifirmware/include"]
# (__builtin_ia32_* are what clang's intrinsic macros expand to: MSVC's intrinsics are functions)
GNU_SPELLINGS = re.compile(r"__attribute__|__builtin_(?!ia32_)|__asm__|\basm\b|__get_cpuid|__cpuid_count|\btypeof\b")


@pytest.mark.skipif(shutil.which("clang") is None, reason="clang is installed by tools/setup.sh")
@pytest.mark.parametrize("source", [str(p.relative_to(ROOT / "firmware" / "src")) for p in runtime_sources()])
def test_the_runtime_compiles_as_msvc_would(source):
    """Compiled in MSVC mode the runtime has no error or warning, and once preprocessed (the branches MSVC
    takes) no GCC spelling is left in the runtime's own lines."""
    path = f"firmware/src/{source}"
    subprocess.run(MSVC + ["-fsyntax-only", path], cwd=ROOT, check=True)
    expanded = subprocess.run(MSVC + ["-E", path], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    ours, own = [], False
    for line in expanded.splitlines():
        marker = re.match(r'#\s*\d+\s+"([^"]+)"', line)
        if marker:  # a line marker: which file the following lines come from
            own = marker.group(1).startswith(("firmware/", "./firmware/"))
        elif own:
            ours.append(line)
    assert ours, "no line of the runtime was read from the preprocessed output"
    found = sorted({m.group(0) for line in ours for m in GNU_SPELLINGS.finditer(line)})
    assert not found, f"{source}: GCC-only spellings MSVC would reject: {found}"
    simd = {"kernels_x86.c": ("kernels_avx2", "kernels_avx512"), "kernels_x86_quantized.c": ("rows_q8_0_avx2", "rows_q8_0_vnni"),
            "crc32.c": ("crc32_clmul",)}.get(source, ())
    for name in simd:  # the x64 SIMD paths are compiled in, not left out
        assert any(name in line for line in ours), f"{source}: {name}"


def test_every_x86_guard_names_msvc_too():
    """MSVC defines _M_X64, not __x86_64__: a guard on __x86_64__ alone would leave MSVC the scalar code."""
    for path in [*(ROOT / "firmware" / "src").rglob("*.[ch]"), ROOT / "firmware" / "include" / "colibri.h"]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if "__x86_64__" in line:
                assert "_M_X64" in line, f"{path.name}:{n}: {line.strip()}"


@pytest.mark.skipif(shutil.which("wine") is None, reason="wine is installed by tools/setup.sh")
def test_wine_starts_boards_without_randomization_and_a_lasting_server():
    """The two ways Wine killed a board at start about once in 1,500 starts (colibri/sim/wine.py): the program
    runs with address-space randomization off, so Windows' shared user page is free, and a wineserver of the
    prefix that outlives each program is running, so no start meets a server going away."""
    from pathlib import Path

    from colibri.sim import wine
    argv, env = wine.wrap(["firmware.exe", "model.img"], ["wine"], "wine64")
    assert argv[-2:] == ["firmware.exe", "model.img"]
    assert "err+all" in env["WINEDEBUG"]  # Wine's own errors reach the board's log
    if wine.no_aslr():  # setarch works here (not in every container): the program sees randomization off
        assert argv[:2] == ["setarch", "-R"]
        personality = subprocess.run([*argv[:2], "cat", "/proc/self/personality"], capture_output=True, text=True,
                                     check=True)
        assert int(personality.stdout, 16) & 0x0040000  # ADDR_NO_RANDOMIZE
    persistent = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:  # the process ended meanwhile, or is not ours to read
            continue
        if b"wineserver" in Path(args[0].decode(errors="replace")).name.encode() and \
                f"-p{wine.SERVER_PERSIST}".encode() in args:
            persistent.append(f"WINEPREFIX={wine.PREFIX}".encode() in environ)
    assert True in persistent, "no wineserver -p of Colibri's prefix is running"
