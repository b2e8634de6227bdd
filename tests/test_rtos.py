"""Colibri inside FreeRTOS tasks (docs/RTOS.md): `scons board=NAME rtos=freertos` for every board whose board.toml
has [rtos.freertos], with the kernel tree FREERTOS_KERNEL_PATH names (.ci/run sets it). Every model test runs on
these builds too, on the boards it runs on bare ("cortex_m55@freertos" in conftest.MODEL_RUNS, with_rtos, EVERY_BOARD);
here are what only an RTOS build has: no heap in the whole ELF, each task's stack against its static worst case,
expert streaming through the fetch task, two contexts in two tasks, and a 1 kHz task's deadlines kept beside
inference. Without the kernel the tests here that need it are skipped, saying what to set, and so are the model
tests' FreeRTOS entries."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import MODEL_BOARDS, ROOT, RTOS_BOARDS, assert_bit_identical, board_name, build_run
from colibri import footprint
from colibri.flash import run_on_board, run_session
from colibri.image import read_image
from colibri.pack import pack
from colibri.protocol import Client, DeviceError, Sampling
from colibri.reference import Reference
from colibri.sim.boards import load_board, rtos_kernel_problem
from colibri.sim.launch import start_board
from colibri.sim.rtos import HOLD, RESTART, SPIN, MeasuringClient, pair_result, pair_start, row_crcs

PROMPT = [13, 1, 2, 3, 10, 0, 4, 5, 11]  # the demo model's "^123+045=": its answer takes 5 tokens
# Under QEMU's -icount shift=5 an instruction takes 32 ns of the virtual clock the boards' counters and timers follow:
# a core of 31.25 MHz doing one instruction a cycle, near the Cortex-M55's 32 MHz and the M4's 25 MHz.
ICOUNT = ["-icount", "shift=5"]
# The bound on the deadline task's release jitter there, derived in docs/RTOS.md from tools/critical_sections.py's trace
# of every instruction of the same session: a release waits for at most one stretch in which the tick cannot be taken
# that is under way when it fires (W: 433 instructions on the M55, 565 on the M4, 357 on RISC-V), runs its own path,
# the tick handler and the switch (P: 228, 244, 390), may be preempted once by the UART's receive interrupt (U: 433,
# 212, 357) and runs the task's instructions up to its counter read (T, under 100): W + P + U + T is at most 1,204
# instructions; with a fifth more for paths the traced run did not take, 1,500 (48 us, 4.8% of the period). -icount
# counts instructions, not cycles: on a real core the same paths take their instructions' cycles.
JITTER_INSTRUCTIONS = 1500


# The RTOS builds on two cores (FreeRTOS's SMP port: a parallel_for worker on each core)
SMP_BOARDS = [b for b in RTOS_BOARDS if "worker" in load_board(board_name(b)).spec["rtos"]["freertos"]["stacks"]]


def kernel_or_skip(run: str) -> None:
    problem = rtos_kernel_problem(run.partition("@")[2])
    if problem:
        pytest.skip(problem)


@pytest.fixture(scope="module")
def demo_image(tmp_path_factory):
    """The shipped demo model at max_seq 16 (2 layers of 4 f32 experts, top-2: the minimum cache is 2 slots)."""
    path = tmp_path_factory.mktemp("rtos") / "demo.img"
    pack(ROOT / "models" / "demo-adder", path, 16, 64)
    return path


def test_an_rtos_build_without_the_kernel_says_what_to_set(tmp_path):
    """No FREERTOS_KERNEL_PATH (or one that is not a kernel tree): the build stops with one line naming it."""
    for value in (None, str(tmp_path)):
        env = {k: v for k, v in os.environ.items() if k != "FREERTOS_KERNEL_PATH"}
        if value:
            env["FREERTOS_KERNEL_PATH"] = value
        done = subprocess.run([sys.executable, "-m", "SCons", "-Q", "board=cortex_m55", "rtos=freertos"], cwd=ROOT,
                              env=env, capture_output=True, text=True)
        assert done.returncode != 0
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "set FREERTOS_KERNEL_PATH to a FreeRTOS-Kernel checkout" in lines[0], done.stderr
        assert ("is not set" if value is None else f"{value} is not a FreeRTOS kernel tree") in lines[0]


# The model tests, each run on the FreeRTOS builds of the bare boards it runs on (conftest.MODEL_RUNS, with_rtos,
# EVERY_BOARD)
MODEL_TEST_FILES = ["test_device.py", "test_dtypes.py", "test_families.py", "test_protocol.py", "test_golden_boards.py",
                    "test_demo.py", "test_streaming.py", "test_smollm2.py", "test_trace.py"]


@pytest.mark.parametrize("run", RTOS_BOARDS)
def test_rtos_builds_run_every_model_test(run):
    """Their logits byte-identical to the bare board's: every model test runs on them (MODEL_BOARDS)."""
    kernel_or_skip(run)
    assert run in MODEL_BOARDS and board_name(run) in MODEL_BOARDS


def test_without_the_kernel_the_rtos_runs_are_skipped_saying_why(monkeypatch):
    """With FREERTOS_KERNEL_PATH unset, the model tests' FreeRTOS entries do not vanish: in every model test file
    they are there, skipped with the one line that says what to set (and nothing else is selected by their ids)."""
    monkeypatch.delenv("FREERTOS_KERNEL_PATH", raising=False)
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q", "-rs",
                           "-k", "freertos", *MODEL_TEST_FILES], cwd=ROOT / "tests", capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    reason = rtos_kernel_problem("freertos")
    assert reason and "FREERTOS_KERNEL_PATH is not set" in reason
    skipped = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED [")]
    for name in MODEL_TEST_FILES:
        assert any(f" {name}:" in line and line.endswith(reason) for line in skipped), (name, done.stdout[-3000:])
    assert " passed" not in done.stdout.splitlines()[-1] and " failed" not in done.stdout.splitlines()[-1]


@pytest.mark.parametrize("run", RTOS_BOARDS)
def test_rtos_firmware_has_no_heap_and_every_task_stack_fits(run):
    """The whole ELF, kernel included, allocates nothing (FreeRTOS's pvPortMalloc and vPortFree are forbidden too),
    and each task's stack holds its static worst case plus what the port keeps on a switched-out task, the
    task's given that figure rounded up to 256 bytes (board.toml: a stale hand-copied size fails here)."""
    kernel_or_skip(run)
    board, rtos = run.split("@")
    build_run(run)
    r = footprint.board_report(board, f"release-{rtos}", None)
    assert r["forbidden"] == {} and r["fits"], r["memory"]
    elf = footprint.inspect(ROOT / "build" / board / f"release-{rtos}" / "firmware.elf")
    assert not elf.forbidden
    kernel = {p.name for p in (ROOT / "build" / board / f"release-{rtos}" / "kernel").glob("*.o")}
    assert {"tasks.o", "queue.o", "list.o", "port.o"} <= kernel and not any(k.startswith("heap_") for k in kernel)
    tasks = {t["task"]: t for t in r["tasks"]}
    smp = load_board(board).spec["rtos"][rtos]["stacks"].get("worker") is not None  # a board with two cores
    assert set(tasks) == {"link", "inference", "fetch", "deadline", "pair"} | ({"worker"} if smp else set())
    for t in tasks.values():  # board.toml's sizes are the report's rounded up to 256 bytes: not hand-copied stale
        assert t["need"] is not None and t["static"] > 0 and t["need"] <= t["given"] < t["need"] + 256, t
    assert any(p.startswith("colibri_") for p in tasks["inference"]["path"])  # the runtime's frames are in it


@pytest.mark.parametrize("run", RTOS_BOARDS)
def test_the_runtime_masks_no_interrupt(run):
    """The runtime's objects hold no instruction that masks interrupts (Arm: cpsid, or a write to PRIMASK, BASEPRI or
    FAULTMASK; RISC-V: a write to mstatus or mie), so it cannot delay a higher-priority task's interrupt."""
    kernel_or_skip(run)
    board, rtos = run.split("@")
    build_run(run)
    objdump = load_board(board).spec["objcopy"].replace("objcopy", "objdump")
    out = ROOT / "build" / board / f"release-{rtos}"

    def masking(objects) -> list[str]:
        text = subprocess.run([objdump, "-d", *map(str, objects)], capture_output=True, text=True, check=True).stdout
        assert len(text) > 1000
        return [line for line in text.splitlines()
                if any(m in line for m in ("\tcpsid", "\tmsr\tPRIMASK", "\tmsr\tBASEPRI", "\tmsr\tFAULTMASK",
                                           "mstatus", "\tmie"))]
    assert masking(sorted((out / "firmware").glob("*.o"))) == []
    assert masking(sorted((out / "kernel").glob("port*.o")))  # the kernel's port does, where the check sees it


@pytest.mark.parametrize("run", RTOS_BOARDS)
def test_a_lossy_link_gives_the_clean_bits_or_fails_cleanly(run, images, firmwares):
    """tests/test_faults.py's sweep, shorter, over the RTOS builds' interrupt-driven UARTs: dropped, flipped,
    duplicated and delayed bytes at 1e-3 a byte; every run is the clean run's bits or a LinkError, never wrong."""
    from colibri.protocol import LinkError
    from colibri.sim.faults import LossyTransport
    kernel_or_skip(run)
    sampling = Sampling(0.9, 0, 0.95, 5)
    clean = run_on_board(images["base"], board_name(run), PROMPT[:4], 12, sampling, True, firmware=firmwares[run])
    identical, faults = 0, 0
    for seed in range(3):
        proxies = []

        def wrap(link, seed=seed):
            proxies.append(LossyTransport(link, 1e-3, seed))
            return proxies[-1]
        try:
            got = run_on_board(images["base"], board_name(run), PROMPT[:4], 12, sampling, True, firmware=firmwares[run],
                               timeout=0.4, retries=8, wrap=wrap)
            assert got.tokens == clean.tokens and got.logits.tobytes() == clean.logits.tobytes()
            identical += 1
        except LinkError as exc:
            assert str(exc)
        c = proxies[0].counts
        faults += c.dropped + c.flipped + c.duplicated + c.delayed
    assert faults > 3 and identical >= 2


def stack_bounds(run: str) -> dict[str, int]:
    """Each task's static worst case plus the port's context, from the footprint report; and the interrupt handlers'
    stack's (the "interrupts" task RTOS_STATS reports): on Cortex-M the main stack's worst case, start-up path and
    every level of handler stacked; on RISC-V the port's own interrupt stack's."""
    board, rtos = run.split("@")
    r = footprint.board_report(board, f"release-{rtos}", None)
    irq = r["interrupts"]
    return {**{t["task"]: t["need"] for t in r["tasks"]},
            "interrupts": r["stack"]["depth"] if irq["stack"] == "main" else irq["depth"]}


def assert_stacks_within_bounds(run: str, stats) -> None:
    """Every task's measured high-water mark, and the interrupt handlers' stack's, within its static bound, the bound
    within what it is given."""
    bounds = stack_bounds(run)
    kind = lambda name: name.rstrip("0123456789")  # noqa: E731  (a worker a core: worker0, worker1)
    assert set(bounds) <= {kind(task.name) for task in stats.tasks}
    for task in stats.tasks:
        if kind(task.name) in bounds:
            assert 0 < task.used <= bounds[kind(task.name)] <= task.bytes, (task, bounds[kind(task.name)])


@pytest.mark.parametrize("run", RTOS_BOARDS)
def test_streaming_at_the_minimum_cache_goes_through_the_fetch_task(run, demo_image, firmwares):
    """OPEN with the smallest expert cache (one layer's top-k), prefetch off, then one slot more with prefetch on (the
    smallest cache with room for a guess: at the minimum every slot serves the current layer): every routed expert
    and every guess reaches the arena through the board's asynchronous hooks, fetch_start queueing each block to the
    fetch task and returning before it is copied, fetch_wait sleeping until it is; the logits are the reference's,
    bit for bit, both times."""
    kernel_or_skip(run)
    ref = Reference(read_image(demo_image.read_bytes()))
    for slots, prefetch in ((ref.d.top_k, False), (ref.d.top_k + 1, True)):
        with start_board(load_board(board_name(run)), firmwares[run], demo_image) as device:
            client = MeasuringClient(device.link, timeout=60)
            result = run_session(client, demo_image, PROMPT, 5, Sampling(), True, False, expert_cache=slots,
                                 prefetch=prefetch)
        assert device.guest_code == 0
        assert result.expert_cache == slots and result.tokens == ref.greedy(PROMPT, 5)
        assert_bit_identical(result.logits, ref.forward(PROMPT + result.tokens))
        s, stats = client.rtos, result.stats
        print(f"\n{run} {slots} slots, prefetch {'on' if prefetch else 'off'}: {stats['expert_misses']} misses, "
              f"{stats['prefetch_issued']} guesses; {s['xfer_queued']} transfers, {s['xfer_pending']} pending when "
              f"fetch_start returned, fetch_wait slept {s['fetch_sleeps']} of {s['fetch_waits']} times")
        assert stats["expert_misses"] > 0 and (stats["prefetch_issued"] > 0) == prefetch
        assert s["xfer_queued"] == stats["expert_misses"] + stats["prefetch_issued"] == s["fetch_waits"]
        assert s["xfer_at_once"] == 0
        # asynchronous: the copy is not made inside fetch_start, and the runtime really waits for it
        assert s["xfer_pending"] > s["xfer_queued"] // 2 and s["fetch_sleeps"] > 0
        assert_stacks_within_bounds(run, s)
        assert s.task("fetch").used > 0


@pytest.mark.parametrize("run", RTOS_BOARDS)
def test_two_contexts_in_two_tasks_each_as_if_alone(run, demo_image, firmwares):
    """The link's context (the inference task) and a second one on the same image (the pair task, after the first in
    the arena, generating over and over while the link's generation runs), at one priority, share the core by time
    slicing: the board counts the switches straight from one to the other while both are in the middle of their
    runtime calls (neither blocked), each way, with the 1 kHz deadline task held meanwhile (FreeRTOS rotates tasks of
    one priority whenever a higher one blocks, time slicing or not; with configUSE_TIME_SLICING 0 the counts are 0).
    Both give the reference's tokens and logits, bit for bit, as each does alone, and every repetition of the pair's
    the same. Every task's stack stays within its static bound. (One image twice: the pair opens the link's image,
    which the board's memory map holds one of.)"""
    kernel_or_skip(run)
    ref = Reference(read_image(demo_image.read_bytes()))
    other = [13, 9, 8, 7, 10, 0, 1, 2, 11]  # "^987+012="
    new = ref.d.max_seq - len(other)

    class Pair(MeasuringClient):
        def open(self, *args, **kwargs):
            opened = super().open(*args, **kwargs)
            self.arena_offset = pair_start(self, other, new)
            # the pair reads the link's image and its arena follows the link's context: no OPEN or upload meanwhile
            for refused in (lambda: Client.open(self, expert_cache=2), lambda: self.upload(b"\0" * 64)):
                with pytest.raises(DeviceError, match="LINK_BUSY"):
                    refused()
            return opened

        def quit(self, code: int = 0) -> None:
            self.pair = pair_result(self, len(other) + new)
            super().quit(code)

    with start_board(load_board(board_name(run)), firmwares[run], demo_image) as device:
        client = Pair(device.link, timeout=60, flags=RESTART | HOLD)
        result = run_session(client, demo_image, PROMPT, 5, Sampling(), True, False)
    assert device.guest_code == 0
    assert client.arena_offset >= result.stats["arena_bytes"] and client.arena_offset % 64 == 0
    assert result.tokens == ref.greedy(PROMPT, 5)
    assert_bit_identical(result.logits, ref.forward(PROMPT + result.tokens))
    pair = client.pair
    assert pair.status == 0 and pair.tokens == other + ref.greedy(other, new)
    assert pair.crcs == row_crcs(ref.forward(pair.tokens))
    assert pair.runs >= 2 and pair.differing == 0  # it kept generating through the link's run, the same bits each time
    s = client.rtos
    print(f"\n{run}: time slices mid-computation, inference -> pair {s['slices_to_pair']}, pair -> inference "
          f"{s['slices_to_inf']}; the pair generated {pair.runs} times")
    assert s["slices_to_pair"] >= 10 and s["slices_to_inf"] >= 10  # their execution interleaved, tick by tick
    assert_stacks_within_bounds(run, s)
    assert s.task("pair").used > s.task("pair").bytes // 2 and s.task("inference").used > s.task("inference").bytes // 2


@pytest.mark.parametrize("busy", ["alone", "streaming-and-pair"])
@pytest.mark.parametrize("run", RTOS_BOARDS)
def test_a_1khz_task_keeps_its_deadlines_beside_inference(run, busy, demo_image, firmwares):
    """Under QEMU's -icount (the virtual clock follows instructions, not the host's scheduling) the deadline task,
    released every 1 ms tick at the highest priority, is measured by the board's counter over a whole verified
    session, from just before OPEN (the image's verification) to QUIT: its release jitter stays under
    JITTER_INSTRUCTIONS' worth of time. Once with the link's context alone, once with the expert cache at its
    minimum (fetch_start's critical section and queue, the fetch task, fetch_wait's sleep) and the pair generating
    beside it (time slices). The idle task spins meanwhile (RTOS_STATS flag): a QEMU that sleeps in WFI wakes on the
    host's clock, late by the host's scheduling."""
    kernel_or_skip(run)
    if run in SMP_BOARDS:
        pytest.skip("two cores under QEMU's -icount run one after the other on one host thread, each until the next "
                    "timer's deadline: a release waits for the other core's turn (measured up to 0.8 ms), the "
                    "emulator's scheduling, not the guest's (docs/RTOS.md)")
    ref = Reference(read_image(demo_image.read_bytes()))
    other = [13, 9, 8, 7, 10, 0, 1, 2, 11]
    slots = ref.d.top_k if busy != "alone" else 0

    class Measuring(MeasuringClient):
        def open(self, *args, **kwargs):
            opened = super().open(*args, **kwargs)
            if busy != "alone":
                pair_start(self, other, ref.d.max_seq - len(other))
            return opened

        def quit(self, code: int = 0) -> None:
            self.pair = pair_result(self, ref.d.max_seq) if busy != "alone" else None
            super().quit(code)

    with start_board(load_board(board_name(run)), firmwares[run], demo_image, ICOUNT) as device:
        client = Measuring(device.link, timeout=120, flags=RESTART | SPIN)
        result = run_session(client, demo_image, PROMPT, 5, Sampling(), True, False, expert_cache=slots)
    assert device.guest_code == 0
    assert_bit_identical(result.logits, ref.forward(PROMPT + result.tokens))
    s = client.rtos
    if busy != "alone":
        assert client.pair.status == 0 and client.pair.differing == 0 and client.pair.runs >= 2
        assert s["xfer_queued"] > 0 and s["fetch_sleeps"] > 0
    hz = s.period * s.tick_hz
    bound = JITTER_INSTRUCTIONS * 32e-9 * hz  # counter ticks
    us = 1e6 / hz
    print(f"\n{run} ({busy}): {s.releases} releases of the 1 kHz task over OPEN and a {len(PROMPT)} + 5 token "
          f"generation: lateness {s.late_min * us:+.1f} to {s.late_max * us:+.1f} us, jitter {s.jitter * us:.1f} us "
          f"(bound {bound * us:.0f} us); intervals {s.interval_min * us:.1f} to {s.interval_max * us:.1f} us")
    assert s.releases >= 50
    assert s.jitter <= bound
    assert s.period - bound <= s.interval_min <= s.interval_max <= s.period + bound
    assert_stacks_within_bounds(run, s)


def test_the_measuring_command_says_a_user_error_in_one_line(demo_image, tmp_path):
    """python -m colibri.sim.rtos: by default as many new tokens as the image's max_seq leaves after the prompt (the
    demo image: 9 + 7), and every user error one line on stderr, exit status 2, no traceback."""
    kernel_or_skip("cortex_m55@freertos")
    build_run("cortex_m55@freertos")
    (tmp_path / "junk.img").write_bytes(b"junk")
    command = [sys.executable, "-m", "colibri.sim.rtos"]
    for args, says in (([str(demo_image), "--tokens", "8"], "9 prompt + 8 new tokens do not fit the image's max_seq "
                        "16: give --tokens 1 to 7"),
                       ([str(tmp_path / "none.img")], "not found; make one with colibri pack"),
                       ([str(tmp_path / "junk.img")], "is not a valid image"),
                       ([str(demo_image), "--board", "hosted"], "board hosted has no FreeRTOS build"),
                       ([str(demo_image), "--prompt-tokens", "1,x"], "is not a comma-separated list of token ids")):
        done = subprocess.run(command + args, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and done.stdout == "", (args, done.stdout, done.stderr)
        assert len(done.stderr.splitlines()) == 1 and says in done.stderr, (args, done.stderr)
    done = subprocess.run(command + [str(demo_image), "--board", "cortex_m55"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "9 + 7 tokens, logits bit-identical to the reference" in done.stdout


# A user's firmware project, as docs/RTOS.md sketches it: the FreeRTOS kernel through its own CMake (FREERTOS_PORT, a
# freertos_config target for FreeRTOSConfig.h, no FREERTOS_HEAP: no heap), Colibri through firmware/CMakeLists.txt
# (colibri::runtime), and the board's own sources. board.cmake, written from board.toml, holds the board's facts.
CMAKE_PROJECT = """\
cmake_minimum_required(VERSION 3.15)
project(colibri_freertos_firmware C ASM)
include(${CMAKE_CURRENT_SOURCE_DIR}/board.cmake)

# FreeRTOSConfig.h (the board's) and, the board having no C library, the <string.h> and <stdlib.h> the kernel includes
add_library(freertos_config INTERFACE)
target_include_directories(freertos_config SYSTEM INTERFACE ${BOARD_DIR} ${COLIBRI}/boards/common/freertos
                           ${COLIBRI}/boards/common/freertos/include)
set(FREERTOS_PORT ${BOARD_FREERTOS_PORT} CACHE STRING "the kernel's port")
add_subdirectory(${FREERTOS_KERNEL_PATH} freertos_kernel)

add_subdirectory(${COLIBRI}/firmware colibri)

add_executable(firmware.elf ${BOARD_SOURCES})
target_compile_definitions(firmware.elf PRIVATE ${BOARD_DEFINES})
target_include_directories(firmware.elf PRIVATE ${COLIBRI}/boards/common ${COLIBRI}/boards/common/freertos)
set_source_files_properties(${COLIBRI}/boards/common/rt.c PROPERTIES COMPILE_OPTIONS -fno-tree-loop-distribute-patterns)
target_link_libraries(firmware.elf PRIVATE colibri::runtime freertos_kernel gcc)
target_link_options(firmware.elf PRIVATE -nostdlib -nostartfiles -Wl,--gc-sections
                    -Wl,-T,${BOARD_DIR}/link.ld -L${CMAKE_CURRENT_SOURCE_DIR} -L${COLIBRI})
"""


def cmake_board_files(run: str, where) -> None:
    """The toolchain file and board.cmake for the board of `run`, from its board.toml (and memory.ld, as SCons
    writes it)."""
    from colibri.sim.boards import memory_defines, memory_ld
    board, rtos = run.split("@")
    spec = load_board(board).spec
    rt = spec["rtos"][rtos]
    cflags = spec["cflags"] + rt.get("cflags", [])
    flags = [f for f in cflags if not f.startswith("-D")]
    defines = ([f[2:].replace('\\"', '"') for f in cflags if f.startswith("-D")]
               + [d[2:] for d in memory_defines(spec)] + [f"PREFILL_BATCH={spec.get('prefill_batch', 0)}u",
                                                           "COLIBRI_FREERTOS=1"]
               + [f"STACK_{task.upper()}={size}u" for task, size in rt["stacks"].items()])
    sources = [ROOT / "boards" / board / s for s in spec["sources"] + rt["sources"]]
    prefix = spec["cc"][:-len("gcc")]
    (where / "toolchain.cmake").write_text(
        "set(CMAKE_SYSTEM_NAME Generic)\n"
        f"set(CMAKE_C_COMPILER {spec['cc']})\nset(CMAKE_ASM_COMPILER {spec['cc']})\n"
        f"set(CMAKE_OBJCOPY {prefix}objcopy)\n"
        "set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)\n"
        f"set(CMAKE_C_FLAGS_INIT \"{' '.join(flags)}\")\nset(CMAKE_ASM_FLAGS_INIT \"{' '.join(flags)}\")\n"
        "set(CMAKE_C_FLAGS_RELEASE \"-O2\")\n")
    quoted = lambda items: " ".join(f"[=[{i}]=]" for i in items)  # noqa: E731  (CMake's bracket arguments)
    (where / "board.cmake").write_text(
        f"set(COLIBRI [=[{ROOT}]=])\nset(BOARD_DIR [=[{ROOT / 'boards' / board}]=])\n"
        f"set(BOARD_FREERTOS_PORT {rt['cmake_port']})\n"
        f"set(BOARD_DEFINES {quoted(defines)})\nset(BOARD_SOURCES {quoted(sources)})\n")
    (where / "memory.ld").write_text(memory_ld(spec, board))
    (where / "CMakeLists.txt").write_text(CMAKE_PROJECT)


def test_cmake_builds_the_same_firmware(demo_image, firmwares, tmp_path):
    """firmware/CMakeLists.txt's colibri::runtime in a CMake project with the FreeRTOS kernel's own CMake: the
    Cortex-M55 FreeRTOS firmware built that way gives the SCons build's logits, bit for bit, and has no heap either."""
    import shutil
    run = "cortex_m55@freertos"
    kernel_or_skip(run)
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed: apt-get install cmake (tools/setup.sh installs it)")
    src, out = tmp_path / "project", tmp_path / "build"
    src.mkdir()
    cmake_board_files(run, src)
    env = {**os.environ}
    configure = subprocess.run(["cmake", "-S", str(src), "-B", str(out),
                                f"-DCMAKE_TOOLCHAIN_FILE={src / 'toolchain.cmake'}", "-DCMAKE_BUILD_TYPE=Release",
                                f"-DFREERTOS_KERNEL_PATH={env['FREERTOS_KERNEL_PATH']}"],
                               capture_output=True, text=True, env=env)
    assert configure.returncode == 0, configure.stdout[-3000:] + configure.stderr[-3000:]
    built = subprocess.run(["cmake", "--build", str(out), "-j", "2"], capture_output=True, text=True)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    elf = out / "firmware.elf"
    assert not footprint.inspect(elf).forbidden
    runtime = out / "colibri" / "colibri_runtime.o"  # the one object libcolibri_runtime.a holds, as SCons's
    assert not footprint.inspect(runtime).forbidden
    from elftools.elf.elffile import ELFFile
    with open(runtime, "rb") as f:
        exported = {s.name for s in ELFFile(f).get_section_by_name(".symtab").iter_symbols()
                    if s["st_info"]["bind"] in ("STB_GLOBAL", "STB_WEAK") and s["st_shndx"] != "SHN_UNDEF"}
    assert "colibri_open" in exported and all(name.startswith("colibri_") for name in exported), sorted(exported)
    ref = Reference(read_image(demo_image.read_bytes()))
    runs = {}
    for how, firmware in (("scons", firmwares[run]), ("cmake", elf)):
        runs[how] = run_on_board(demo_image, board_name(run), PROMPT, 5, Sampling(), True, firmware=firmware)
    assert runs["cmake"].tokens == runs["scons"].tokens == ref.greedy(PROMPT, 5)
    assert runs["cmake"].logits.tobytes() == runs["scons"].logits.tobytes()
    assert_bit_identical(runs["cmake"].logits, ref.forward(PROMPT + runs["cmake"].tokens))


@pytest.mark.parametrize("run", SMP_BOARDS)
def test_parallel_for_over_two_cores_gives_one_cores_bits(run, images, demo_image, firmwares):
    """The Cortex-M33 pair (QEMU mps2-an521) under FreeRTOS's SMP port: the link's context opens with the board's
    parallel_for, which hands the runtime's parts to a worker task pinned to each core; the tokens and logits are the
    bare board's on one core and the reference's, bit for bit, and each core ran parts (per-core counters)."""
    kernel_or_skip(run)
    for image in (demo_image, images["top3_gqa4_tied"]):
        ref = Reference(read_image(image.read_bytes()))
        one = run_on_board(image, board_name(run), PROMPT[:4], 8, Sampling(), True, firmware=firmwares[board_name(run)])
        with start_board(load_board(board_name(run)), firmwares[run], image) as device:
            client = MeasuringClient(device.link, timeout=60)
            two = run_session(client, image, PROMPT[:4], 8, Sampling(), True, False)
        assert device.guest_code == 0
        assert one.threads == 1 and two.threads == 2  # OPENED's parallel parts
        assert two.tokens == one.tokens == ref.greedy(PROMPT[:4], 8)
        assert two.logits.tobytes() == one.logits.tobytes()
        assert_bit_identical(two.logits, ref.forward(PROMPT[:4] + two.tokens))
        s = client.rtos
        print(f"\n{run} {image.name}: {s['parallel_calls']} parallel_for calls, parts on core 0 {s['parts_core0']}, "
              f"on core 1 {s['parts_core1']}")
        assert s["cores"] == 2 and s["parallel_calls"] > 0
        assert s["parts_core0"] > 0 and s["parts_core1"] > 0  # both cores computed
        assert_stacks_within_bounds(run, s)


def test_riscv_has_no_smp_port():
    """RISC-V virt (-smp 2) runs one core here: the kernel's RISC-V port has no SMP support (docs/RTOS.md): asked for
    two cores, the kernel's own header stops the build."""
    kernel_or_skip("riscv64_virt@freertos")
    from colibri.sim.boards import rtos_kernel
    kernel, spec = rtos_kernel("freertos"), load_board("riscv64_virt").spec
    rt = spec["rtos"]["freertos"]
    done = subprocess.run([spec["cc"], *spec["cflags"], "-std=c11", "-DconfigNUMBER_OF_CORES=2",
                           "-DconfigUSE_PASSIVE_IDLE_HOOK=0",
                           f"-I{ROOT / 'boards/common/freertos/include'}", f"-I{ROOT / 'boards/common/freertos'}",
                           f"-I{ROOT / 'boards/riscv64_virt'}", f"-I{kernel / 'include'}", f"-I{kernel / rt['port']}",
                           "-fsyntax-only", str(kernel / "tasks.c")], capture_output=True, text=True)
    assert done.returncode != 0
    assert "configNUMBER_OF_CORES is set to more than 1 then portGET_CORE_ID must also be defined" in done.stderr
