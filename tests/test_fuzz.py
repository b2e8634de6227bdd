"""Short fixed-seed fuzz runs of the image verifier/loader and of the device side of the protocol.

The long campaign is `python tools/fuzz.py --seconds 3600`; docs/SECURITY.md records its figures."""
from __future__ import annotations

import os
import struct
import subprocess
from pathlib import Path

import pytest

from tools import fuzz

SECONDS = 30
SEAL, STREAMED = 1, 2  # bits of the image harness's first input byte (bit 2: a prefill batch)


@pytest.mark.parametrize("harness", list(fuzz.HARNESSES))
def test_fuzz_harness_finds_nothing(harness):
    result = fuzz.run(harness, SECONDS, jobs=1, seed=1)
    assert result["findings"] == [] and result["exit_status"] == 0, result["log_tail"]
    assert result["executions"] > 1000  # the harness really ran
    assert 0 < result["edges"] <= result["features"]  # coverage is reported (a feature per edge at least)


def test_a_fuzz_run_from_a_large_process_measures_its_own_memory(monkeypatch):
    """A fuzzer started from a test worker that has held more than its RSS limit (Linux keeps the peak resident size
    across exec) must not measure that peak as its own and stop at once as out of memory, as both harnesses did in a
    CI run whose worker had read a 150,000-token GGUF vocabulary before."""
    import numpy as np
    monkeypatch.setattr(fuzz, "RSS_LIMIT_MB", 400)
    held = np.ones(600 << 17)  # 600 MiB, resident
    result = fuzz.run("link", 3, jobs=1, seed=1)
    assert held[-1] == 1.0 and result["findings"] == [] and result["exit_status"] == 0, result["log_tail"]
    assert result["executions"] > 1000


def test_seed_corpus_is_current(hosted_build):
    """The seeds must be valid for today's format, or the fuzzers never get past the verifier:
    regenerate them with `python tools/fuzz.py --make-seeds` after a format change."""
    from capi import Lib
    lib = Lib(hosted_build / "libcolibri.so")
    seeds = sorted((fuzz.FUZZ / "corpus" / "image").glob("*.img"))
    assert len(seeds) >= 10
    for seed in seeds:
        assert lib.verify(seed.read_bytes()[1:])[0] == 0, seed.name  # the first byte is the harness's mode
    assert lib.verify(fuzz.seed_image().read_bytes())[0] == 0


def test_the_seeds_hold_every_weight_dtype():
    """Some seed image stores a matrix in each weight dtype, so the harness runs every dtype's kernels (its mutations
    that change an entry's dtype seldom get its group, bytes and scales right as well, which the verifier wants:
    without a seed of the block dtypes none of their kernels ran, review of issue 34)."""
    from colibri.image import read_image
    from colibri.quant import DType
    held = {DType(e.dtype) for seed in (fuzz.FUZZ / "corpus" / "image").glob("*.img")
            for e in read_image(seed.read_bytes()[1:]).entries}
    assert held == set(DType), f"no seed holds {sorted(d.name for d in set(DType) - held)}"


def test_the_batched_seeds_reach_the_runs_of_rows_by_four_tokens(tmp_path):
    """The harness's prefill batch runs the CPU's kernel set's runs of rows by four tokens (rows4_*) for every dtype
    the set has one for, past the Q8_0 and Q4_0 fallback for rows under 8 blocks (transpose_x): libFuzzer's coverage
    report of the batched seeds names the functions they ran. With a batch of three tokens none ran (review of
    issue 34)."""
    from test_kernels import host_kernels
    kernels = host_kernels()
    if kernels == "scalar":
        pytest.skip("this CPU runs the scalar kernel set, which has no runs of rows by four tokens")
    suffix = {"avx2": "avx2", "avx512": "vnni"}[kernels]  # the sets' functions are named rows4_<dtype>_<suffix>
    want = {f"rows4_{d}_{suffix}" for d in ("q4_k", "q5_k", "q6_k")}
    if suffix == "vnni":
        want |= {"rows4_q8_0_vnni", "rows4_q4_0_vnni", "transpose_x"}
    from colibri.image import read_image
    from colibri.quant import DType
    row_blocks = set()  # (dtype, 32-value blocks a row) of the batched seeds' matrices
    for seed in (fuzz.FUZZ / "corpus" / "image").glob("*-batched.img"):
        (tmp_path / seed.name).write_bytes(seed.read_bytes())
        row_blocks |= {(DType(e.dtype), e.shape[-1] // 32) for e in read_image(seed.read_bytes()[1:]).entries
                       if len(e.shape) == 2}
    # a row of whole groups of 8 blocks and more after them, in both dtypes the runs' last group serves
    assert {DType.Q8_0, DType.Q4_0} <= {d for d, n in row_blocks if n > 8 and n % 8}, row_blocks
    done = subprocess.run(fuzz.fresh_process([str(fuzz.build("image")), "-runs=0", "-print_coverage=1", str(tmp_path)]),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    covered = {line.split()[5] for line in done.stderr.splitlines() if line.startswith("COVERED_FUNC:")}
    assert covered, done.stderr[-3000:]  # the report's format: COVERED_FUNC: hits: N edges: a/b name file:line
    assert want <= covered, f"not reached: {sorted(want - covered)}"


@pytest.mark.parametrize("harness", sorted(p.name for p in (fuzz.FUZZ / "regress").iterdir()))
def test_past_findings_stay_fixed(harness):
    """Inputs a campaign once crashed on (tests/fuzz/regress/<harness>/, rebuilt for today's format by
    `python tools/fuzz.py --make-seeds`: tools/fuzz.py's REGRESS says what each was) run clean under ASan + UBSan."""
    inputs = sorted((fuzz.FUZZ / "regress" / harness).glob("*"))
    assert inputs
    exe = fuzz.build(harness)
    done = subprocess.run(fuzz.fresh_process([str(exe), *map(str, inputs)]), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("Running:") == len(inputs)


def test_past_findings_still_reach_their_fault():
    """Each regression input gets as far as the fault it once hit and is stopped where the fix stops it (not at the
    format version or a CRC): an input the format left behind would pass the test above without testing anything."""
    from capi import STATUS
    inputs = sorted((fuzz.FUZZ / "regress" / "image").glob("*"))
    assert sorted(p.name for p in inputs) == sorted(fuzz.REGRESS)
    got = dict(harness_report([str(p) for p in inputs]))
    for name, (mode, want) in fuzz.REGRESS.items():
        assert got[name]["mode"] == mode, name
        assert {stage: got[name][stage] for stage in want} == {stage: STATUS[s] for stage, s in want.items()}, name


def harness_report(args: list[str]) -> list[tuple[str, dict[str, int]]]:
    """Run the image harness with COLIBRI_FUZZ_REPORT set: for each input it ran, where it came from (the file
    libFuzzer last named with "Running:"; in a fuzzing run "" for the seeds, "mutated" after its INITED line)
    and how far it got (the status of verify, open, feed and step, -1 where not reached, and the mode byte)."""
    env = {**os.environ, "COLIBRI_FUZZ_REPORT": "1", "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=1"}
    done = subprocess.run(fuzz.fresh_process([str(fuzz.build("image")), *args]), capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out: list[tuple[str, dict[str, int]]] = []
    current = ""
    for line in done.stderr.splitlines():
        if line.startswith("Running: "):
            current = Path(line.removeprefix("Running: ")).name
        elif "INITED cov:" in line:
            current = "mutated"
        elif line.startswith("reached: "):
            words = line.split()[1:]
            out.append((current, {key: int(value) for key, value in zip(words[::2], words[1::2])}))
    return out


def scramble_crcs(image: bytes) -> bytes:
    """The image with every CRC it holds wrong: header, payload, metadata and each expert block's."""
    from colibri.image import HEADER_FIELDS, HEADER_OFFSETS, HEADER_STRUCT
    h = dict(zip(HEADER_FIELDS, HEADER_STRUCT.unpack_from(image, 0)))
    fields = ["header_crc32", "payload_crc32"] + (["meta_crc32"] if h["meta_bytes"] else [])
    places = [HEADER_OFFSETS[f] for f in fields]
    places += [h["expert_crc_offset"] + 4 * i for i in range(h["n_layers"] * h["n_experts"])]
    out = bytearray(image)
    for at in places:
        struct.pack_into("<I", out, at, struct.unpack_from("<I", out, at)[0] ^ 0x5A5A5A5A)
    return bytes(out)


def test_harness_reseal_reaches_the_forward_pass(tmp_path):
    """Every seed image in every mode of the harness (its first byte: reseal, stream the experts, a prefill
    batch) verifies, opens, feeds and steps, as the seed and with every CRC in it made wrong when the mode
    reseals: the harness's reseal seals all the verifier checks, so mutations get past the CRCs. Unsealed,
    the scrambled image fails at the header CRC (the scrambling really broke what the reseal must mend)."""
    from capi import STATUS
    images: dict[bytes, str] = {}
    for seed in sorted((fuzz.FUZZ / "corpus" / "image").glob("*.img")):
        images.setdefault(seed.read_bytes()[1:], seed.stem.removesuffix("-raw").removesuffix("-streamed")
                          .removesuffix("-batched"))
    assert len(images) >= 15 and any(name.endswith("-meta") for name in images.values())  # one has a metadata section
    for image, name in images.items():
        for variant, content in (("seed", image), ("scrambled", scramble_crcs(image))):
            for mode in range(8):
                (tmp_path / f"{name}.{variant}.{mode}").write_bytes(bytes([mode]) + content)
    inputs = sorted(tmp_path.iterdir())
    got = dict(harness_report([str(p) for p in inputs]))
    assert sorted(got) == [p.name for p in inputs]
    ok, header_crc = STATUS["OK"], STATUS["E_IMAGE_HEADER_CRC"]
    wrong = []
    for file, r in got.items():
        _, variant, mode = file.split(".")
        streamed = int(mode) & STREAMED
        if variant == "seed" or int(mode) & SEAL:
            # streamed, open verifies the resident part (the expert blocks when fetched)
            if r != {"mode": int(mode), "verify": -1 if streamed else ok, "open": ok, "feed": ok, "step": ok}:
                wrong.append((file, r))
        elif (r["open"] if streamed else r["verify"]) != header_crc:
            wrong.append((file, r))
    assert not wrong, f"{len(wrong)} of {len(got)} inputs: {wrong[:6]}"


def test_mutations_get_past_the_crcs(tmp_path):
    """Most inputs libFuzzer makes from the seeds (3,000 with a fixed seed: the custom mutator's structural
    edits, resealed, and its byte-level ones, sealed by the mode bit) are refused behind the CRCs, by the
    checks of the dimensions, the table and the bounds, or run; before the reseal followed the format
    nearly every one failed a CRC."""
    from capi import STATUS
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for seed in (fuzz.FUZZ / "corpus" / "image").glob("*.img"):
        (corpus / seed.name).write_bytes(seed.read_bytes())
    runs = harness_report([str(corpus), "-runs=3000", "-seed=1", f"-dict={fuzz.FUZZ / 'image.dict'}"])
    mutated = [r for where, r in runs if where == "mutated"]
    assert len(mutated) > 2000
    before_crcs = {STATUS[s] for s in ("E_IMAGE_TRUNCATED", "E_IMAGE_MAGIC", "E_IMAGE_VERSION", "E_IMAGE_HEADER_CRC",
                                       "E_IMAGE_PAYLOAD_CRC")}
    first_refusal = [r["open"] if r["verify"] == -1 else r["verify"] for r in mutated]
    past = [s for s in first_refusal if s not in before_crcs]
    assert len(past) >= len(mutated) // 2, f"{len(past)} of {len(mutated)} got past the CRCs"
    assert {STATUS["OK"], STATUS["E_IMAGE_DIMS"], STATUS["E_IMAGE_TABLE"]} <= set(past)
