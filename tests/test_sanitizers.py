"""The hosted board under AddressSanitizer + UBSan and under valgrind memcheck.

Every model test also runs on the ASan build ("hosted@asan" in conftest.MODEL_BOARDS); here are the
malformed requests and the valgrind run."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, build
from colibri.image import read_image
from colibri.paths import runtime_sources
from colibri.protocol import Sampling, encode_frame, scripted_session

PROMPT = [1, 5, 9, 3]


def image_run(out, cc: str, flags: list[str]) -> Path:
    """tests/image_run.c and the runtime's sources, built by `cc` with `flags` (a sanitizer) into `out`."""
    exe = out / "image_run"
    sources = [str(p) for p in runtime_sources()]
    subprocess.run([cc, "-std=c11", "-ffp-contract=off", "-fno-math-errno", "-g", "-O1", "-fno-omit-frame-pointer", *flags,
                    "-Ifirmware/include", "-Ifirmware/src", "tests/image_run.c", *sources, "-o", str(exe)],
                   cwd=ROOT, check=True)
    return exe


@pytest.fixture(scope="module")
def asan_image_run(tmp_path_factory):
    return image_run(tmp_path_factory.mktemp("asan"), "gcc", ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"])


def run_image(exe: Path, image: Path, tokens: int, batch: int = 0) -> str:
    """image_run's status line; a sanitizer's report fails the test with its first lines."""
    proc = subprocess.run([str(exe), str(image), str(tokens), str(batch)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[:3000]
    return proc.stdout.strip()


def test_open_reads_each_table_entry_once_a_walk(images, tmp_path):
    """The verifier's walk copies each table entry once and checks and uses only the copy, so an image that changes
    while it is verified or opened cannot slip an unchecked offset past the checks: counted on table.c's calls to
    the image readers (tests/entry_reads.c), the two walks (verify, then open's) read no entry field from the image
    but a layer's and a role, which find a layer's router before its entries are copied (and decide nothing the
    copy is not checked against)."""
    exe = tmp_path / "entry_reads"
    sources = [str(p) for p in runtime_sources()]
    subprocess.run(["gcc", "-std=c11", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                    "-Wl,--wrap=rd16,--wrap=rd32,--wrap=rd64", "-Ifirmware/include", "-Ifirmware/src",
                    "tests/entry_reads.c", *sources, "-lm", "-o", str(exe)], cwd=ROOT, check=True)
    from colibri.format import ENTRY_OFFSETS
    done = subprocess.run([str(exe), str(images["base"])], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[:3000]
    fields = {int(w[1]): int(w[3]) for w in map(str.split, done.stdout.splitlines()) if w[0] == "field"}
    assert int(done.stdout.split()[-1]) > 10
    assert set(fields) <= {ENTRY_OFFSETS["role"], ENTRY_OFFSETS["layer"]}, fields


def test_image_run_feeds_a_clean_image(asan_image_run, images):
    """The harness of the two tests below runs a model: 40 tokens, one at a time and in batches of 16."""
    assert run_image(asan_image_run, images["base"], 40) == "verify 0 open 0 feed 0"
    assert run_image(asan_image_run, images["base"], 40, 16) == "verify 0 open 0 feed 0"


@pytest.mark.parametrize("make", ["mla_sharing_image", "global_head_without_rope_image"])
def test_crafted_image_outside_its_memory_is_refused_not_run(asan_image_run, make, tmp_path):
    """The images the verifier once accepted wrote past the arena (latent attention with KV sharing: kv_store)
    or read past the image (a global head size without its RoPE tables: rope) within 48 positions: refused
    (E_IMAGE_DIMS, 11) before they can."""
    import test_verifier
    path = tmp_path / "crafted.img"
    path.write_bytes(getattr(test_verifier, make)())
    assert run_image(asan_image_run, path, 48) == "verify 11"


@pytest.mark.skipif(shutil.which("clang") is None, reason="MemorySanitizer is clang's")
@pytest.mark.parametrize("lean", [True, False], ids=["lean", "full"])
def test_open_leaves_no_field_undefined(images, tmp_path, lean):
    """Every field of the model description and every arena pointer is defined after open, in the lean build too
    (it reads none of the newer families' fields, so it must give them their neutral values): tests/image_run.c
    under MemorySanitizer checks each one, then feeds six tokens, three a pass (the prefill batch region's pointers
    are checked too). The image and the arena are malloc'd: undefined until written. -O0: no copy of an undefined
    value is optimized away."""
    exe = image_run(tmp_path, "clang", ["-O0", "-fsanitize=memory", "-fsanitize-memory-track-origins", "-DCHECK_DEFINED",
                                        "-DCOLIBRI_KERNELS_SCALAR"] + (["-DCOLIBRI_LEAN=1"] if lean else []))
    assert run_image(exe, images["base"], 6, 3) == "verify 0 open 0 feed 0"


def test_the_undefined_check_names_every_field_of_the_model_description():
    """tests/image_run.c's DIMS_FIELDS is the one hand-kept list the check above walks (the arena's and the batch's
    buffers come from the schema's plan, plan.h): it must name every model_dims field, or a new one left unset at
    open would go unseen."""
    import re
    header = (ROOT / "firmware" / "src" / "image.h").read_text()
    body = re.search(r"typedef struct \{((?:(?!typedef struct).)*?)\} model_dims;", header, re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    fields = {re.sub(r"\[.*", "", name).strip(" *") for decl in body.split(";") if decl.strip()
              for name in re.sub(r"^\s*\w+\s+", "", decl.strip()).split(",")}
    run = (ROOT / "tests" / "image_run.c").read_text()
    listed = set(re.findall(r"X\((\w+)\)", run[run.index("#define DIMS_FIELDS"):run.index("#define ARENA_FIELDS")]))
    assert len(fields) >= 50 and listed == fields, (sorted(fields - listed), sorted(listed - fields))


@pytest.fixture(scope="module")
def asan_firmware():
    return build("hosted", "asan") / "firmware.elf"


def test_sanitized_build_survives_bad_requests(images, asan_firmware):
    """Malformed and out-of-order requests under the sanitizers: named errors, no report."""
    from colibri.sim.boards import load_board
    from colibri.sim.launch import start_board
    from colibri.protocol import Client, DeviceError
    with start_board(load_board("hosted"), asan_firmware, images["base"]) as device:
        client = Client(device.link, timeout=10)
        with pytest.raises(DeviceError, match="LINK_NOT_OPEN"):
            client.stats()
        client.open()
        vocab = read_image(images["base"].read_bytes()).dims.vocab_size
        with pytest.raises(DeviceError, match="E_TOKEN_RANGE"):
            client.run([vocab + 5], 1, Sampling())
        with pytest.raises(DeviceError, match="E_SEQ_FULL"):
            client.run([1] * 40, 20, Sampling())
        assert len(client.run([1, 2], 3, Sampling()).events) == 3
        client.quit()
    assert device.exit_status == 0


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind not installed (tools/setup.sh installs it)")
def test_valgrind_memcheck_one_generation(images):
    """One generation on the debug build under memcheck: no invalid access, no uninitialised read, no leak."""
    elf = build("hosted", "debug") / "firmware.elf"
    vocab = read_image(images["top3_gqa4_tied"].read_bytes()).dims.vocab_size
    session = b"".join(encode_frame(t, i + 1, p) for i, (t, p) in
                       enumerate(scripted_session(PROMPT, 6, Sampling(0.7, 5, 0.9, 11), vocab)))
    proc = subprocess.run(["valgrind", "--error-exitcode=99", "--leak-check=full", "--errors-for-leak-kinds=definite",
                           str(elf), str(images["top3_gqa4_tied"])], input=session, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert b"ERROR SUMMARY: 0 errors" in proc.stderr
    assert len(proc.stdout) > 1000  # it really answered: tokens and logits frames


def test_no_allocation_after_open(images, hosted_build, tmp_path, monkeypatch):
    """Zero allocations after open, counted: the hosted board (with its thread pool and a prefill batch)
    under an LD_PRELOAD malloc counter (tests/malloc_count.c), read before and after a generation."""
    import os
    import signal
    import time

    from colibri.protocol import Client
    from colibri.sim.boards import load_board
    from colibri.sim.launch import start_board
    counter = tmp_path / "malloc_count.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(counter), "tests/malloc_count.c"], check=True)
    count_file = tmp_path / "count"
    monkeypatch.setenv("LD_PRELOAD", str(counter))
    monkeypatch.setenv("MALLOC_COUNT_FILE", str(count_file))

    def allocations(pid: int) -> int:
        count_file.unlink(missing_ok=True)
        os.kill(pid, signal.SIGUSR1)
        for _ in range(1000):  # up to 10 s: a bound for a busy machine, not a delay
            if count_file.exists() and count_file.read_text().endswith("\n"):
                return int(count_file.read_text())
            time.sleep(0.01)
        raise AssertionError("the counter did not answer")

    image = images["top3_gqa4_tied"]
    vocab = read_image(image.read_bytes()).dims.vocab_size
    with start_board(load_board("hosted"), hosted_build / "firmware.elf", image, ["--threads", "2"]) as device:
        client = Client(device.link, timeout=10)
        client.info()
        client.open()
        before = allocations(device.proc.pid)
        gen = client.run([1, 5, 9, 3, 7, 2, 8, 4], 12, Sampling(0.7, 5, 0.9, 11), vocab=vocab)  # one token a FEED
        client.run([(7 * i) % vocab for i in range(30)], 4, Sampling())  # the prompt in one FEED: prefill batches
        client.stats()
        after = allocations(device.proc.pid)
        client.quit()
    assert len(gen.events) == 12
    assert before > 0  # the counter counts: the C library allocated while the board started
    assert after == before, f"{after - before} allocations during a generation"
