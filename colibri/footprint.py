#!/usr/bin/env python3
"""Footprint and purity of built firmware, proven from the ELF files (pyelftools), or for the Windows
board from its PE/COFF objects (MinGW-w64's nm and objdump).

For a board: the runtime's and the board's .text/.rodata/.data/.bss separately, the worst-case
stack depth (static: the call graph and frame sizes gcc writes with -fcallgraph-info=su), and,
given an image, whether image + arena + firmware + stack fit each memory region of the board.
Always: proof that nothing defines or references a forbidden symbol (malloc family, FreeRTOS's heap,
pthread_*, C11 threads, stdio, FILE I/O). For an RTOS build (--mode release-freertos), each task's
worst-case stack from its entry function, with what the port keeps on a switched-out task's stack, against
the stack board.toml gives it: the size to give xTaskCreateStatic.

Examples:
  colibri footprint --board cortex_m4 --image model.img   # full report with usage bars
  colibri footprint --board hosted --json
  colibri footprint --board cortex_m55 --mode release-freertos           # a FreeRTOS build: every task's stack
  colibri footprint some.o other.o                         # purity and sizes of objects
Exit status 1 if a forbidden symbol is found or something does not fit.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.relocation import RelocationSection
from elftools.elf.sections import SymbolTableSection

from colibri.console import Parser
from colibri.format import KV_DTYPES
from colibri.paths import ROOT
from colibri.reader import ImageError
from colibri.sim.boards import board_names, load_board, memory_region

FORBIDDEN = re.compile(
    r"^(malloc|calloc|realloc|free|aligned_alloc|posix_memalign|memalign|valloc|pvalloc|reallocarray"
    r"|_Znw.*|_Zna.*|_Zdl.*|_Zda.*"
    r"|pvPortMalloc|vPortFree|pvPortCalloc|pvPortRealloc"  # FreeRTOS's heaps (heap_N.c): an RTOS build has none
    r"|pthread_\w+|thrd_\w+|mtx_\w+|cnd_\w+"
    r"|printf|fprintf|sprintf|snprintf|vprintf|vfprintf|vsprintf|vsnprintf|puts|fputs|putchar|fputc|putc"
    r"|scanf|fscanf|sscanf|fopen|fclose|fread|fwrite|fseek|ftell|fflush|fgets|getchar|perror"
    r"|stdin|stdout|stderr|_IO_\w+|__printf_chk|__fprintf_chk|__sprintf_chk|__snprintf_chk|__vfprintf_chk"
    # Windows: any call into a DLL (__imp_), its allocators and threads, MinGW's own stdio
    r"|__imp_\w+|HeapAlloc|VirtualAlloc|LocalAlloc|GlobalAlloc|CreateThread|_beginthread\w*|__mingw_\w*printf)$"
)
COFF_TOOLS = "x86_64-w64-mingw32-"  # binutils for x86-64 PE/COFF (the hosted_windows board's toolchain)
COFF_SECTIONS = {".rdata": ".rodata"}  # PE names for what ELF calls .rodata
SECTIONS = (".text", ".rodata", ".data", ".bss", ".stack")
SHF_ALLOC = 0x2


@dataclass
class ObjectReport:
    path: str
    sizes: dict[str, int] = field(default_factory=dict)
    forbidden: list[str] = field(default_factory=list)


def inspect(path: Path) -> ObjectReport:
    """Section sizes (by kind) and forbidden symbols of one ELF or PE/COFF object or executable."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic[:2] == b"MZ" or magic[:2] == b"\x64\x86":  # a PE executable, or an x86-64 COFF object
        return inspect_coff(path)
    rep = ObjectReport(str(path))
    with open(path, "rb") as f:
        elf = ELFFile(f)
        for sec in elf.iter_sections():
            kind = next((s for s in SECTIONS if sec.name == s or sec.name.startswith(s + ".")), None)
            if kind is None and sec.name in (".sdata", ".srodata", ".sbss"):
                kind = {".sdata": ".data", ".srodata": ".rodata", ".sbss": ".bss"}[sec.name]
            if kind and sec["sh_flags"] & SHF_ALLOC:
                rep.sizes[kind] = rep.sizes.get(kind, 0) + sec["sh_size"]
            if isinstance(sec, SymbolTableSection):
                for sym in sec.iter_symbols():
                    name = sym.name.split("@")[0]
                    if name and FORBIDDEN.match(name) and name not in rep.forbidden:
                        rep.forbidden.append(name)
    return rep


def _coff_tool(tool: str, *args: str) -> str:
    exe = shutil.which(COFF_TOOLS + tool)
    if exe is None:
        raise FileNotFoundError(f"{COFF_TOOLS}{tool} not found: apt-get install binutils-mingw-w64-x86-64")
    return subprocess.run([exe, *args], capture_output=True, text=True, check=True).stdout


def inspect_coff(path: Path) -> ObjectReport:
    """inspect() for a PE/COFF file: section headers from objdump -h, every symbol from nm."""
    rep = ObjectReport(str(path))
    for line in _coff_tool("objdump", "-h", str(path)).splitlines():
        fields = line.split()  # "Idx Name Size VMA LMA File-off Algn", flags on the next line
        if len(fields) == 7 and fields[0].isdigit():
            name = COFF_SECTIONS.get(fields[1], fields[1])
            kind = next((k for k in SECTIONS if name == k or name.startswith(k + "$") or name.startswith(k + ".")), None)
            if kind:
                rep.sizes[kind] = rep.sizes.get(kind, 0) + int(fields[2], 16)
    for line in _coff_tool("nm", "-P", str(path)).splitlines():
        name = line.split()[0] if line.split() else ""
        if name and FORBIDDEN.match(name) and name not in rep.forbidden:
            rep.forbidden.append(name)
    return rep


def total(reports: list[ObjectReport]) -> dict[str, int]:
    return {s: sum(r.sizes.get(s, 0) for r in reports) for s in SECTIONS}


# ---- worst-case stack depth from gcc's -fcallgraph-info=su output ----

NODE = re.compile(r'node: \{ title: "([^"]+)" label: "([^"]*)"')
EDGE = re.compile(r'edge: \{ sourcename: "([^"]+)" targetname: "([^"]+)"')
FRAME = re.compile(r"(\d+) bytes \(([\w,]+)\)")
INDIRECT = "__indirect_call"


@dataclass
class StackReport:
    depth: int | None          # bytes on the deepest path from the roots; None if unbounded
    path: list[str]
    unknown: list[str]         # called but not compiled here (libgcc, assembly): counted as 0 bytes
    problems: list[str]        # recursion or dynamic frames


# Relocations that are a direct call or jump (their target's address is not taken): Arm's CALL, JUMP24, THM_CALL,
# THM_JUMP24/19/11/8; RISC-V's BRANCH, JAL, CALL, CALL_PLT, RVC_BRANCH, RVC_JUMP; x86-64's PLT32.
CALL_RELOCATIONS = {"EM_ARM": {10, 28, 29, 30, 51, 102, 103}, "EM_RISCV": {16, 17, 18, 19, 44, 45},
                    "EM_X86_64": {4}}
VECTOR_SECTIONS = (".vectors", ".isr_vector")  # a function only these name is the hardware's to call: a root


def address_taken(objects: list[Path]) -> set[str]:
    """The functions whose address the objects take (a relocation against the function, or against its section at
    its offset, that is not a direct call or jump): what an indirect call may reach. Those only a vector table names
    are left out (the hardware calls them: roots of their own)."""
    out: dict[str, set[str]] = {}
    for obj in objects:
        with open(obj, "rb") as f:
            if f.read(4) != b"\x7fELF":  # a PE/COFF object (the Windows board): an operating system's process
                continue
            f.seek(0)
            elf = ELFFile(f)
            calls = CALL_RELOCATIONS.get(elf["e_machine"])
            symtab = elf.get_section_by_name(".symtab")
            if calls is None or symtab is None:
                continue
            functions = {(sym["st_shndx"], sym["st_value"] & ~1): sym.name for sym in symtab.iter_symbols()
                         if sym["st_info"]["type"] == "STT_FUNC" and isinstance(sym["st_shndx"], int)}
            for sec in elf.iter_sections():
                if not isinstance(sec, RelocationSection):
                    continue
                placed = elf.get_section(sec["sh_info"])
                if placed.name.startswith((".debug", ".ARM.exidx", ".eh_frame", ".comment")):
                    continue
                for r in sec.iter_relocations():
                    if r["r_info_type"] in calls:
                        continue
                    sym = symtab.get_symbol(r["r_info_sym"])
                    addend = r.entry.get("r_addend")
                    if addend is None:  # REL (Arm): the addend is the word in place, for the data relocations here
                        at = r["r_offset"]
                        addend = (int.from_bytes(placed.data()[at:at + 4], "little")
                                  if placed["sh_type"] != "SHT_NOBITS" and r["r_info_type"] == 2 else 0)
                    # a function, or a name defined in another object (undefined here: the linker resolves it)
                    named = sym["st_info"]["type"] == "STT_FUNC" or sym["st_shndx"] == "SHN_UNDEF"
                    if named and sym.name and addend in (0, 1):
                        out.setdefault(sym.name, set()).add(placed.name)
                    elif sym["st_info"]["type"] == "STT_SECTION":  # a static function: its section at its offset
                        name = functions.get((sym["st_shndx"], addend & ~1))
                        if name:
                            out.setdefault(name, set()).add(placed.name)
    return {f for f, where in out.items() if not all(w.startswith(VECTOR_SECTIONS) for w in where)}


def stack_depth(ci_files: list[Path], roots: list[str], hooks: set[str] | list[Path]) -> StackReport:
    """Deepest stack from `roots`. An indirect call costs the deepest of the `hooks` (the functions whose address is
    taken, address_taken(): a board hook such as the UART or the cycle counter, a kernel set's entry, a worker the
    runtime hands to parallel_for), roots excepted. A hook that makes an indirect call itself (an adapter: link.c's
    fetch_start_board calling the board's fetch_start) costs its own depth with that call costing the deepest hook
    that makes none. `hooks` may instead be a list of .ci files: every function defined there that makes no
    indirect call (a coarser rule, for objects without relocations)."""
    frames: dict[str, int] = {}
    dynamic: list[str] = []
    edges: dict[str, list[str]] = {}
    defined_in: dict[str, Path] = {}
    for ci in ci_files:
        text = ci.read_text()
        for title, label in NODE.findall(text):
            m = FRAME.search(label)
            if m:
                frames[title] = int(m.group(1))
                defined_in[title] = ci
                if m.group(2) == "dynamic":  # "dynamic,bounded" gives an upper bound, which is fine
                    dynamic.append(title)
        for src, dst in EDGE.findall(text):
            edges.setdefault(src, []).append(dst)

    unknown: set[str] = set()
    problems = [f"{f}: dynamic stack frame" for f in dynamic]
    indirect: set[str] = set()  # the functions from which an indirect call is reachable
    pending = [INDIRECT]
    callers: dict[str, list[str]] = {}
    for src, dsts in edges.items():
        for dst in dsts:
            callers.setdefault(dst, []).append(src)
    while pending:
        for caller in callers.get(pending.pop(), []):
            if caller not in indirect:
                indirect.add(caller)
                pending.append(caller)

    # a static function's title is "file.c:name": a root or a hook names either
    def titles(name: str) -> list[str]:
        return [name] if name in frames else [t for t in frames if t.endswith(":" + name)]

    roots = [t for r in roots for t in titles(r)]
    if isinstance(hooks, list):
        hook_titles = {f for f, ci in defined_in.items() if ci in hooks and f not in indirect}
    else:
        hook_titles = {t for h in hooks for t in titles(h)}
    hook_titles -= set(roots)
    memo: dict[tuple, tuple[int, list[str]]] = {}
    leaves = {h for h in hook_titles if h not in indirect}

    # `adapter`: below a hook's own indirect call, which reaches a hook that makes none (an adapter forwards to the
    # interface it adapts: link.c's fetch_start_board to the board's fetch_start, a row kernel to its dtype's fill
    # function; the board's parallel_for hands the runtime's worker to tasks of their own, which are roots)
    def deepest(f: str, adapter: bool, active: frozenset) -> tuple[int, list[str]]:
        if f == INDIRECT:
            best = (0, ["(indirect: no hook)"])
            for h in sorted(leaves if adapter else hook_titles):
                d, p = deepest(h, True, frozenset())
                if d > best[0]:
                    best = (d, [f"(indirect) {p[0]}"] + p[1:])
            return best
        key = (f, adapter) if f in indirect else (f,)
        if key in memo:
            return memo[key]
        if f in active:
            problems.append(f"recursion through {f}")
            return 0, [f]
        if f not in frames:
            unknown.add(f)
            return 0, [f]
        best = (0, [])
        for g in edges.get(f, []):
            d, p = deepest(g, adapter, active | {f})
            if d > best[0]:
                best = (d, p)
        memo[key] = (frames[f] + best[0], [f] + best[1])
        return memo[key]

    depth, path = max((deepest(r, False, frozenset()) for r in roots), default=(0, []))
    return StackReport(None if problems else depth, path, sorted(unknown), sorted(set(problems)))


def interrupt_stack(ci_files: list[Path], spec: dict, hooks: set[str]) -> dict:
    """The interrupts' share of a stack (board.toml's [interrupts], or [rtos.<name>.interrupts] for an RTOS build):
    `levels` lists the handlers' roots by priority, lowest first (a root "name+N" adds the N bytes its assembly entry
    pushes before calling it); a handler can preempt one of a lower level, so the worst case is the deepest root of
    every level stacked, each with `frame_bytes` (the exception frame the core pushes, FP state included). `stack` is
    "main" (the thread's own stack: the figure is added to its worst case) or the symbol of a separate stack."""
    levels, total, path = [], 0, []
    for roots in spec.get("levels", []):
        best: tuple = (0, [], None)
        for root in roots:
            name, _, extra = root.partition("+")
            rep = stack_depth(ci_files, [name], hooks)
            if rep.depth is None:
                return {"depth": None, "problems": rep.problems, "levels": levels, "stack": spec.get("stack", "main")}
            if not rep.path:
                return {"depth": None, "problems": [f"interrupt root {name} is not in the call graph"],
                        "levels": levels, "stack": spec.get("stack", "main")}
            if rep.depth + int(extra or 0) >= best[0]:
                best = (rep.depth + int(extra or 0), rep.path, root)
        levels.append({"roots": roots, "deepest": best[0], "root": best[2], "path": best[1]})
        total += best[0] + spec.get("frame_bytes", 0)
        path += best[1][:1]
    return {"depth": total, "levels": levels, "frame_bytes": spec.get("frame_bytes", 0), "path": path,
            "stack": spec.get("stack", "main"), "problems": []}


# ---- a board's whole report ----

ROOTS = ["reset_handler", "board_main", "main"]
KERNEL_TASKS = {"prvIdleTask"}  # FreeRTOS's own tasks' entry functions (the idle task's stack is the kernel's)


def runtime_objects(board: str, mode: str) -> list[Path]:
    objs = sorted((ROOT / "build" / board / mode / "firmware").glob("*.o"))  # model.o holds the blocks
    if not objs:
        raise FileNotFoundError(f"no runtime objects under build/{board}/{mode}: run `scons board={board} mode={mode}`")
    return objs


def usage_bar(label: str, used: int, capacity: int) -> str:
    frac = used / capacity if capacity else float("inf")
    filled = min(30, round(30 * frac))
    return f"{label:<48} [{'=' * filled}{' ' * (30 - filled)}] {100 * frac:5.1f}% (used {used:,} of {capacity:,} bytes)"


def build_files(out: Path, suffix: str) -> list[Path]:
    """A build's files of one kind in its folders (board/, common/ and below, kernel/, ...: not the top level)."""
    return sorted(p for p in out.rglob(f"*{suffix}") if len(p.relative_to(out).parts) > 1)


def rtos_of(board, mode: str) -> tuple[str, dict] | None:
    """The RTOS build a mode names (release-freertos: FreeRTOS, board.toml's [rtos.freertos]), or None."""
    return next(((name, rt) for name, rt in board.spec.get("rtos", {}).items() if mode.endswith("-" + name)), None)


def board_report(board_name: str, mode: str, image: Path | None) -> dict:
    board = load_board(board_name)
    out = ROOT / "build" / board_name / mode
    runtime = [inspect(o) for o in runtime_objects(board_name, mode)]
    board_objs = [o for o in build_files(out, ".o")
                  if o.relative_to(out).parts[0] not in ("firmware", "tests", "tools")]
    board_parts = [inspect(o) for o in board_objs]
    elf = inspect(board.firmware(mode))
    os_process = board.spec["link"] == "stdio"  # the hosted boards: the board's own code uses the C library
    report = {
        "board": board_name, "mode": mode,
        "runtime": total(runtime), "board_code": total(board_parts), "firmware_elf": elf.sizes,
        "forbidden": {r.path: r.forbidden for r in runtime + ([] if os_process else [elf]) if r.forbidden},
    }
    ci = [c for c in build_files(out, ".ci") if not c.name.endswith(".c.ci")]
    rtos = rtos_of(board, mode)
    interrupts = (rtos[1] if rtos else board.spec).get("interrupts", {})
    # what an indirect call may reach: a function whose address is taken, but for those only the kernel starts (the
    # tasks' entry functions, given to xTaskCreateStatic) and the interrupt handlers: roots of their own stacks
    started = {f"{task}_task" for task in (rtos[1].get("stacks", {}) if rtos else {})} | KERNEL_TASKS
    hooks = address_taken(build_files(out, ".o")) - started - {r.partition("+")[0] for level in
                                                               interrupts.get("levels", []) for r in level}
    if not os_process:  # a process's stack is its operating system's business
        stack = stack_depth(ci, ROOTS, hooks)
        irq = interrupt_stack(ci, interrupts, hooks)
        if irq["depth"] is None:
            stack.depth, stack.problems = None, stack.problems + irq["problems"]
        elif irq["stack"] == "main" and stack.depth is not None:
            stack.depth += irq["depth"]  # the handlers run on the thread's stack, on top of its deepest path
        report["stack"] = asdict(stack)
        if irq["levels"]:
            if irq["stack"] != "main":  # the interrupts' own stack (RISC-V's FreeRTOS port switches to one)
                irq["given"] = symbol_size(board.firmware(mode), irq["stack"])
            report["interrupts"] = irq
    if rtos:
        report["rtos"] = rtos[0]
        with open(board.firmware(mode), "rb") as f:
            word = ELFFile(f).elfclass // 8  # FreeRTOS's StackType_t: the machine word
        report["tasks"] = task_stacks(rtos[1], ci, hooks, word, mode.split("-")[0])
    mem = board.spec.get("memory")
    bars, fits, too_large = [], True, []
    if image is not None:
        from colibri.image import read_image
        d = read_image(image.read_bytes(), check_crcs=False).dims
        report["kv_cache"] = {"bytes": d.kv_cache_bytes(), "per_position": d.kv_position_bytes(),
                              "per_position_expanded": d.kv_position_bytes(expanded=True) if d.mla else None}
        report["state"] = layer_state(d)
    if mem:
        code = elf.sizes.get(".text", 0) + elf.sizes.get(".rodata", 0) + elf.sizes.get(".data", 0)
        data = elf.sizes.get(".data", 0) + elf.sizes.get(".bss", 0) + elf.sizes.get(".stack", 0)
        if "code" in mem["regions"][0]["holds"] and "data" in mem["regions"][0]["holds"]:
            code, data = code + data - elf.sizes.get(".data", 0), 0  # one region: count .data once
        for region in mem["regions"]:
            used = (code if "code" in region["holds"] else 0) + (data if "data" in region["holds"] else 0)
            label = f"{region['name']} 0x{region['origin']:08X} ({', '.join(region['holds'])})"
            bars.append(usage_bar(label, used, region["bytes"]))
            fits &= used <= region["bytes"]
        if image is not None:
            from colibri.image import prefill_bytes, read_image
            img = read_image(image.read_bytes())
            image_cap, arena_cap = memory_region(board.spec, "image").bytes, memory_region(board.spec, "arena").bytes
            regions = (("image", len(img.data), image_cap, memory_region(board.spec, "image").name),
                       ("arena (the image's exact plan)", img.header["arena_bytes"], arena_cap,
                        memory_region(board.spec, "arena").name))
            for label, used, cap, region in regions:
                bars.append(usage_bar(label, used, cap))
                fits &= used <= cap
                if used > cap:
                    what = label.split(" ")[0]
                    too_large.append(f"the {what} needs {used:,} bytes, {100 * used / cap:.0f}% of the {cap:,} of its "
                                     f"region ({region})")
            batch = board.spec.get("prefill_batch", 0)
            if batch > 1:  # optional: without room for it the board opens with none (the same results, slower prompts)
                bars.append(usage_bar(f"arena with a prefill batch of {batch} (open takes what fits)",
                                      img.header["arena_bytes"] + prefill_bytes(img.dims, batch), arena_cap))
    stack = report.get("stack")
    if stack and stack["depth"] is not None:
        reserved = elf.sizes.get(".stack") or None
        if reserved:
            bars.append(usage_bar("stack (worst case vs reserved)", stack["depth"], reserved))
            fits &= stack["depth"] <= reserved
    irq = report.get("interrupts")
    if irq and irq.get("given") is not None and irq["depth"] is not None:
        bars.append(usage_bar(f"interrupt stack {irq['stack']} (worst case vs given)", irq["depth"], irq["given"]))
        fits &= irq["depth"] <= irq["given"]
    for t in report.get("tasks", []):
        if t["need"] is None:
            fits = False
        else:
            bars.append(usage_bar(f"task {t['task']} stack (worst case vs given)", t["need"], t["given"]))
            fits &= t["need"] <= t["given"]
    report["memory"] = bars
    report["fits"] = fits
    report["too_large"] = too_large  # the image's and its arena's, said in one line
    return report


def symbol_size(elf_path: Path, name: str) -> int | None:
    """The size of a data symbol of the ELF (a static array: the interrupts' stack), or None."""
    with open(elf_path, "rb") as f:
        symtab = ELFFile(f).get_section_by_name(".symtab")
        sym = symtab.get_symbol_by_name(name) if symtab else None
        return sym[0]["st_size"] if sym else None


def task_stacks(rt: dict, ci: list[Path], hooks: set[str], word: int = 4, mode: str = "release") -> list[dict]:
    """Each task of an RTOS build (board.toml's [rtos.<name>.stacks], or .stacks_<mode> where it has one: the task
    `link` runs link_task()): its static worst case from its entry function, plus what the port keeps on a switched-out
    task's stack (context_bytes), the least stack to give xTaskCreateStatic, against what board.toml gives it."""
    out = []
    for task, given in rt.get(f"stacks_{mode}", rt.get("stacks", {})).items():
        rep = stack_depth(ci, [f"{task}_task"], hooks)
        need = None if rep.depth is None or not rep.path else rep.depth + rt.get("context_bytes", 0)
        out.append({"task": task, "static": rep.depth, "context": rt.get("context_bytes", 0), "need": need,
                    "given": given, "word": word, "path": rep.path, "problems": rep.problems})
    return out


def print_board_report(r: dict) -> None:
    print(f"{r['board']} ({r['mode']})")
    print(f"  {'':<14}" + "".join(f"{s:>10}" for s in SECTIONS))
    for label, sizes in (("runtime", r["runtime"]), ("board + link", r["board_code"]), ("firmware.elf", r["firmware_elf"])):
        print(f"  {label:<14}" + "".join(f"{sizes.get(s, 0):>10,}" for s in SECTIONS))
    stack = r.get("stack")
    if stack:
        if stack["depth"] is None:
            print(f"  stack: unbounded ({'; '.join(stack['problems'])})")
        else:
            print(f"  stack: worst case {stack['depth']:,} bytes (static, gcc -fcallgraph-info call graph): "
                  f"{' > '.join(stack['path'][:8])}")
        if stack["unknown"]:
            print(f"         not compiled here, counted as 0: {', '.join(stack['unknown'])}")
    irq = r.get("interrupts")
    if irq and irq["depth"] is not None:
        where = ("on the main stack, included above" if irq["stack"] == "main" else
                 f"on their own stack ({irq['stack']}, {irq.get('given') or 0:,} bytes)")
        levels = "; ".join(f"{lv['root']} {lv['deepest']:,}" for lv in irq["levels"])
        print(f"  interrupts: worst case {irq['depth']:,} bytes {where}: by priority, lowest first, {levels}, each "
              f"with a {irq['frame_bytes']:,}-byte exception frame")
    for t in r.get("tasks", []):
        if t["need"] is None:
            why = "; ".join(t["problems"]) or f"no {t['task']}_task in the call graph"
            print(f"  task {t['task']}: unbounded ({why})")
        else:
            print(f"  task {t['task']}: worst case {t['static']:,} bytes (static) + {t['context']:,} the port keeps "
                  f"on a "
                  f"switched-out task = {t['need']:,}: give xTaskCreateStatic at least {t['need']:,} bytes "
                  f"({-(-t['need'] // t['word']):,} words of StackType_t); board.toml gives {t['given']:,}: "
                  f"{' > '.join(t['path'][:6])}")
    for bar in r["memory"]:
        print(f"  {bar}")
    state = r.get("state")
    if state:
        sizes = ", ".join(f"{b:,}" for b in sorted(set(state["per_layer"].values())))
        print(f"  state: {len(state['per_layer'])} layers keep {state['bytes']:,} bytes whatever the context ({sizes} "
              f"a layer; as much again for its copy from before a pass), where a KV cache of those layers over "
              f"{state['positions']:,} positions would take {state['kv_cache_instead']:,}")
    kv = r.get("kv_cache")
    if kv:
        expanded = (f" (multi-head latent attention: keys and values per head would take {kv['per_position_expanded']:,})"
                    if kv["per_position_expanded"] else "")
        print(f"  KV cache: {kv['bytes']:,} bytes in the arena, {kv['per_position']:,} per position{expanded}")
    for path, syms in r["forbidden"].items():
        print(f"FORBIDDEN in {path}: {', '.join(syms)}", file=sys.stderr)
    if not r["forbidden"]:
        print("  purity: no allocation, thread or stdio symbol defined or referenced")
    if r.get("too_large"):
        print(f"the image does not fit {r['board']}: {'; '.join(r['too_large'])} (`colibri info IMAGE` says which "
              "boards it fits; `colibri pack ... --board` what packing would)")
    elif not r["fits"]:
        print(f"this build does not fit {r['board']}: see the bars above")


def layer_state(d) -> dict | None:
    """The state the convolving and DeltaNet layers keep instead of a KV cache (blocks/state.c): its bytes per layer,
    and what a KV cache of the model's attention width (its KV heads of head_dim, K and V, in the image's KV dtype)
    would take for those layers over the image's max_seq positions. None without such layers."""
    per_layer = {layer: 4 * d.state_elements(layer) for layer in range(d.n_layers) if d.state_elements(layer)}
    if not per_layer:
        return None
    elem = 2 if d.kv_dtype == KV_DTYPES["f16"] else 4
    return {"per_layer": per_layer, "bytes": sum(per_layer.values()), "positions": d.max_seq,
            "kv_cache_instead": len(per_layer) * d.max_seq * 2 * d.n_kv_heads * d.head_dim * elem}


def main(argv: list[str] | None = None) -> int:
    ap = Parser(__doc__)
    ap.add_argument("objects", nargs="*", type=Path, help="ELF objects or executables to inspect")
    ap.add_argument("--board", choices=board_names(), help="report on build/<board>/<mode>")
    ap.add_argument("--mode", default="release")
    ap.add_argument("--image", type=Path, help="with --board: check this image and its arena against the board")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.board:
        if args.image and not args.image.is_file():
            ap.error(f"image {args.image} not found; make one with colibri pack")
        try:
            r = board_report(args.board, args.mode, args.image)
        except FileNotFoundError as exc:
            return ap.fail(str(exc))
        except ImageError as exc:
            return ap.fail(f"{args.image} is not a valid image ({exc}); make one with colibri pack")
        print(json.dumps(r)) if args.json else print_board_report(r)
        return 1 if r["forbidden"] or not r["fits"] else 0
    if not args.objects:
        ap.error("give object files or --board")
    reports = []
    for path in args.objects:
        try:
            reports.append(inspect(path))
        except (OSError, ELFError, subprocess.CalledProcessError) as exc:
            return ap.fail(f"{path} is not a readable ELF or PE/COFF file ({exc}); give objects or "
                           "executables such as build/<board>/release/firmware.elf")
    if args.json:
        print(json.dumps([asdict(r) for r in reports]))
    else:
        print(f"{'object':<40}" + "".join(f"{s:>9}" for s in SECTIONS))
        for r in reports:
            print(f"{Path(r.path).name:<40}" + "".join(f"{r.sizes.get(s, 0):>9}" for s in SECTIONS))
        for r in reports:
            if r.forbidden:
                print(f"FORBIDDEN in {r.path}: {', '.join(r.forbidden)}", file=sys.stderr)
    return 1 if any(r.forbidden for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
