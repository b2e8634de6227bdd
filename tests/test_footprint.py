"""Zero-malloc, pthread-free, stdio-free, and small: proven on the built ELFs with pyelftools."""
from __future__ import annotations

import json
import subprocess

import pytest

from conftest import GATE_FILE, OS_BOARDS, RELEASE_BOARDS, ROOT
from colibri import footprint

GATE = json.loads(GATE_FILE.read_text())


@pytest.mark.parametrize("board", OS_BOARDS)
def test_runtime_objects_are_pure(board, firmwares):
    """The runtime inside a Linux or Windows process calls nothing of the OS (ELF objects read by pyelftools,
    the Windows board's COFF objects by MinGW's nm)."""
    objs = footprint.runtime_objects(board, "release")
    assert {o.name for o in objs} >= {"image.o", "model.o", "kernels.o", "sampler.o", "colibri.o", "arena.o"}
    reports = [footprint.inspect(o) for o in objs]
    assert all(not r.forbidden for r in reports), [(r.path, r.forbidden) for r in reports if r.forbidden]
    assert footprint.main(["--board", board]) == 0
    board_code = footprint.inspect(ROOT / "build" / board / "release" / "board" / ("os_posix.o" if board == "hosted"
                                                                                 else "os_win32.o"))
    assert board_code.forbidden  # the check sees the OS calls where they are: the board's own code


@pytest.mark.parametrize("board", [b for b in RELEASE_BOARDS if b not in OS_BOARDS])
def test_bare_metal_firmware_is_pure_fits_and_is_gated(board, firmwares, images):
    """A bare-metal ELF links no C library: nothing in the whole program may allocate, thread or print."""
    r = footprint.board_report(board, "release", images["top3_gqa4_tied"])
    assert r["forbidden"] == {}
    assert r["fits"], r["memory"]
    assert r["stack"]["depth"] is not None and 200 < r["stack"]["depth"] <= r["firmware_elf"][".stack"]
    gate = GATE[board]
    assert r["runtime"][".text"] <= gate["runtime_text"], f"runtime .text grew past tools/size_gate.json: {r['runtime']}"
    assert r["runtime"][".rodata"] <= gate["runtime_rodata"]
    assert r["runtime"][".data"] <= gate["runtime_data"]


def test_check_catches_forbidden_symbols(tmp_path):
    for call in ("malloc(8)", "pthread_self()", "fopen(\"x\", \"r\")"):
        src = tmp_path / "bad.c"
        src.write_text(f"#include <stdlib.h>\n#include <pthread.h>\n#include <stdio.h>\n"
                       f"void *use(void) {{ return (void *)(long){call}; }}\n")
        obj = tmp_path / "bad.o"
        subprocess.run(["gcc", "-c", str(src), "-o", str(obj)], check=True)
        report = footprint.inspect(obj)
        assert report.forbidden == [call.split("(")[0]]
        assert footprint.main([str(obj)]) == 1


def _su_frames(su: str) -> dict[str, int]:
    """Frame sizes from gcc's -fstack-usage output: an independent source for the analyzer's inputs."""
    out = {}
    for line in su.splitlines():
        loc, size, _kind = line.split("\t")
        out[loc.rsplit(":", 1)[-1]] = int(size)
    return out


def test_stack_depth_follows_the_deepest_chain(tmp_path):
    src = tmp_path / "chain.c"
    src.write_text(
        "volatile char sink;\n"
        "__attribute__((noinline)) void leaf(void) { volatile char b[200]; b[0] = 1; sink = b[0]; }\n"
        "__attribute__((noinline)) void mid(void) { volatile char b[64]; b[0] = 2; sink = b[0]; leaf(); }\n"
        "__attribute__((noinline)) void shallow(void) { volatile char b[16]; b[0] = 3; sink = b[0]; }\n"
        "void (*hook)(void);\n"
        "void root(void) { volatile char b[32]; b[0] = 4; sink = b[0]; mid(); shallow(); hook(); }\n")
    hook = tmp_path / "hook.c"
    hook.write_text("__attribute__((noinline)) void big_hook(void) { volatile char b[900]; b[0] = 1; }\n")
    for c in (src, hook):
        subprocess.run(["gcc", "-O1", "-c", str(c), "-o", str(c.with_suffix(".o")), "-fcallgraph-info=su",
                        "-fstack-usage"], check=True, cwd=tmp_path)
    frames = _su_frames((tmp_path / "chain.su").read_text()) | _su_frames((tmp_path / "hook.su").read_text())
    rep = footprint.stack_depth([tmp_path / "chain.ci", tmp_path / "hook.ci"], ["root"], [tmp_path / "hook.ci"])
    # the indirect call may reach the hook, which is deeper than root > mid > leaf
    assert rep.depth == frames["root"] + max(frames["mid"] + frames["leaf"], frames["big_hook"])
    no_hooks = footprint.stack_depth([tmp_path / "chain.ci"], ["root"], [])
    assert no_hooks.depth == frames["root"] + frames["mid"] + frames["leaf"]
    assert no_hooks.path[:3] == ["root", "mid", "leaf"]


def test_a_hook_that_calls_through_a_pointer_costs_its_own_depth_too(tmp_path):
    """An adapter hook (link.c's fetch_start_board, calling the board's fetch_start through board_io) is an indirect
    call's cost with the leaf it calls; the hooks are the functions whose address is taken (their relocations), not
    every function of some files; a task's entry function (given to the kernel) is no hook."""
    src = tmp_path / "hooks.c"
    src.write_text(
        "volatile char sink;\n"
        "typedef void (*fn)(void);\n"
        "fn board_fetch, runtime_hook, task;\n"
        "__attribute__((noinline)) void leaf_hook(void) { volatile char b[200]; b[0] = 1; sink = b[0]; }\n"
        "__attribute__((noinline)) void adapter(void) { volatile char b[300]; b[0] = 2; sink = b[0]; board_fetch(); }\n"
        "__attribute__((noinline)) void never_pointed_to(void) { volatile char b[400]; b[0] = 3; sink = b[0]; }\n"
        "__attribute__((noinline)) void worker_task(void) { volatile char b[4000]; b[0] = 4; sink = b[0]; }\n"
        "void root(void) { volatile char b[32]; b[0] = 5; sink = b[0]; runtime_hook(); never_pointed_to(); }\n"
        "void setup(void) { board_fetch = leaf_hook; runtime_hook = adapter; task = worker_task; }\n")
    subprocess.run(["gcc", "-O1", "-c", str(src), "-o", str(tmp_path / "hooks.o"), "-fcallgraph-info=su",
                    "-fstack-usage", "-fno-pie", "-ffunction-sections"], check=True, cwd=tmp_path)
    frames = _su_frames((tmp_path / "hooks.su").read_text())
    taken = footprint.address_taken([tmp_path / "hooks.o"])
    assert {"leaf_hook", "adapter", "worker_task"} <= taken and not {"never_pointed_to", "root"} & taken
    rep = footprint.stack_depth([tmp_path / "hooks.ci"], ["root"], taken - {"worker_task"})
    through_hooks = frames["adapter"] + frames["leaf_hook"]  # root > (indirect) adapter > (indirect) leaf_hook
    assert through_hooks > frames["never_pointed_to"] and rep.depth == frames["root"] + through_hooks
    assert rep.path == ["root", "(indirect) adapter", "(indirect) leaf_hook"]
    # the rule before: the functions of hooks.c making no indirect call, the adapter left out
    coarse = footprint.stack_depth([tmp_path / "hooks.ci"], ["root"], [tmp_path / "hooks.ci"])
    assert coarse.depth == frames["root"] + frames["worker_task"]


def test_interrupts_stack_by_priority_level(tmp_path):
    """board.toml's interrupt levels: the deepest root of each level, each with the exception frame, stacked; a root
    "name+N" adds what its assembly entry pushes; a root missing from the call graph is an error, not 0 bytes."""
    src = tmp_path / "irq.c"
    src.write_text(
        "volatile char sink;\n"
        "void tick(void) { volatile char b[100]; b[0] = 1; sink = b[0]; }\n"
        "void switch_context(void) { volatile char b[40]; b[0] = 1; sink = b[0]; }\n"
        "void uart_isr(void) { volatile char b[60]; b[0] = 1; sink = b[0]; }\n")
    subprocess.run(["gcc", "-O1", "-c", str(src), "-o", str(tmp_path / "irq.o"), "-fcallgraph-info=su",
                    "-fstack-usage"], check=True, cwd=tmp_path)
    frames = _su_frames((tmp_path / "irq.su").read_text())
    ci = [tmp_path / "irq.ci"]
    spec = {"levels": [["tick", "switch_context+200"], ["uart_isr"]], "frame_bytes": 32}
    r = footprint.interrupt_stack(ci, spec, set())
    assert r["depth"] == max(frames["tick"], frames["switch_context"] + 200) + 32 + frames["uart_isr"] + 32
    assert [lv["root"] for lv in r["levels"]] == ["switch_context+200", "uart_isr"] and r["stack"] == "main"
    assert footprint.interrupt_stack(ci, {"levels": [["no_such_handler"]]}, set())["depth"] is None


def test_stack_depth_refuses_recursion(tmp_path):
    src = tmp_path / "rec.c"
    src.write_text("int f(int n) { volatile int x = n; return n ? f(n - 1) + x : 0; }\n")
    subprocess.run(["gcc", "-O0", "-c", str(src), "-o", str(tmp_path / "rec.o"), "-fcallgraph-info=su"], check=True,
                   cwd=tmp_path)
    rep = footprint.stack_depth([tmp_path / "rec.ci"], ["f"], [])
    assert rep.depth is None and "recursion" in rep.problems[0]


@pytest.mark.parametrize("board", RELEASE_BOARDS)
def test_only_the_public_api_is_exported(board, firmwares):
    """libcolibri.a's one object (and the hosted .so) define no global symbol but colibri_*: internal names
    like image_verify or dot_f32_scalar cannot collide with the application's."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection
    out = ROOT / "build" / board / "release"
    files = [(out / "colibri_runtime.o", ".symtab")] + ([(out / "libcolibri.so", ".dynsym")] if board == "hosted" else [])
    for path, table in files:
        if board == "hosted_windows":  # a COFF object: MinGW's nm lists its defined global symbols
            nm = subprocess.run([footprint.COFF_TOOLS + "nm", "-g", "--defined-only", "-P", str(path)],
                                capture_output=True, text=True, check=True).stdout
            exported = {line.split()[0] for line in nm.splitlines()}
        else:
            with open(path, "rb") as f:
                symbols = ELFFile(f).get_section_by_name(table)
                assert isinstance(symbols, SymbolTableSection)
                exported = {s.name for s in symbols.iter_symbols()
                            if s["st_info"]["bind"] in ("STB_GLOBAL", "STB_WEAK") and s["st_shndx"] != "SHN_UNDEF"}
        assert exported and all(name.startswith("colibri_") for name in exported), sorted(exported)
        assert {"colibri_open", "colibri_feed", "colibri_get_kernels"} <= exported


def cpuid_functions(objects: list) -> set[str]:
    """The functions of these objects that execute CPUID (objdump's disassembly)."""
    found, current = set(), None
    for obj in objects:
        for line in subprocess.run(["objdump", "-d", str(obj)], capture_output=True, text=True, check=True).stdout.splitlines():
            if line.endswith(">:"):
                current = line.split("<", 1)[1][:-2]
            elif line.split("\t")[-1].startswith("cpuid"):
                found.add(current)
    return found


def reachable(ci_files: list, roots: list[str]) -> set[str]:
    """The functions the roots call, directly or not, in the objects' call graphs (-fcallgraph-info; a static
    function's node is file:name)."""
    edges: dict[str, set[str]] = {}
    for ci in ci_files:
        for src, dst in footprint.EDGE.findall(ci.read_text()):
            edges.setdefault(src.rsplit(":", 1)[-1], set()).add(dst.rsplit(":", 1)[-1])
    seen, todo = set(), list(roots)
    while todo:
        f = todo.pop()
        if f not in seen:
            seen.add(f)
            todo.extend(edges.get(f, ()))
    return seen


def test_cpuid_is_asked_at_open_not_per_token(hosted_build):
    """CPUID (a trap to the hypervisor in a VM) runs when a context opens, to choose the kernels and the CRC, and
    never on the way of a token: no function feeding, stepping or sampling calls reaches one that executes it. It
    was asked for every CRC of 4 KiB or more, so for every expert block fetched (issue 26, item 14)."""
    firmware = hosted_build / "firmware"
    cpuid = cpuid_functions(sorted(firmware.glob("*.o")))
    ci = [c for c in sorted(firmware.glob("*.ci")) if not c.name.endswith(".c.ci")]
    assert cpuid & reachable(ci, ["colibri_open"])  # the check finds CPUID where it is
    assert not cpuid & reachable(ci, ["colibri_feed", "colibri_step", "colibri_sample"]), cpuid


def test_a_non_elf_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not an ELF file")
    assert footprint.main([str(tmp_path / "notes.txt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a readable ELF or PE/COFF file" in err


def test_rvv_assembly_is_the_only_vector_code(firmwares):
    """kernels_rvv.c's inline assembly overwrites vector registers, vl and vtype without declaring them (GCC 12 knows
    none of them by name), which is sound only while the compiler keeps nothing of its own there: the board builds
    with -fno-tree-vectorize, and no runtime object but kernels_rvv.o holds a vector instruction (issue 26, item 13).
    The disassembly finds the kernels' own instructions, so the check can fail."""
    from colibri.sim.boards import load_board
    assert "-fno-tree-vectorize" in load_board("riscv64_virt").spec["cflags"]
    vector_code = {}
    for obj in footprint.runtime_objects("riscv64_virt", "release"):
        listing = subprocess.run(["riscv64-unknown-elf-objdump", "-d", str(obj)], capture_output=True, text=True,
                                 check=True).stdout
        ops = [line.split("\t")[2] for line in listing.splitlines() if line.count("\t") >= 2]
        vector_code[obj.name] = sum(op.startswith("v") for op in ops)
    assert vector_code.pop("kernels_rvv.o") > 20
    assert not any(vector_code.values()), vector_code


def test_every_runtime_file_reads_in_one_sitting():
    """No runtime source file over 400 lines (issue 28): a file that grows past it is split by concern, as image.c
    (the header) and table.c (the tensor table) were."""
    from colibri.paths import runtime_sources
    files = [*runtime_sources(), *(ROOT / "firmware" / "src").glob("*.h"), *(ROOT / "firmware" / "src" / "blocks").glob("*.c")]
    assert len(files) > 20
    long = {p.name: n for p in files if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long
