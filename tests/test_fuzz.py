"""Short fixed-seed fuzz runs of the image verifier/loader and of the device side of the protocol.

The long campaign is `python tools/fuzz.py --seconds 3600`; docs/SECURITY.md records its figures."""
from __future__ import annotations

import pytest

from tools import fuzz

SECONDS = 30


@pytest.mark.parametrize("harness", list(fuzz.HARNESSES))
def test_fuzz_harness_finds_nothing(harness):
    result = fuzz.run(harness, SECONDS, jobs=1, seed=1)
    assert result["findings"] == [] and result["exit_status"] == 0, result["log_tail"]
    assert result["executions"] > 1000  # the harness really ran


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


@pytest.mark.parametrize("harness", sorted(p.name for p in (fuzz.FUZZ / "regress").iterdir()))
def test_past_findings_stay_fixed(harness):
    """Inputs a campaign once crashed on (tests/fuzz/regress/<harness>/) run clean under ASan + UBSan:
    image/quantize-nonfinite.img made quantize_q8_0 cast an infinite product to int8 (CI, 2026-11-30; rebuilt
    for format v3 as the same case: a Q8_0 image whose layer-0 attention norm is infinite)."""
    import subprocess
    inputs = sorted((fuzz.FUZZ / "regress" / harness).glob("*"))
    assert inputs
    exe = fuzz.build(harness)
    done = subprocess.run([str(exe), *map(str, inputs)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("Running:") == len(inputs)
