"""Zero-malloc, pthread-free, stdio-free: proven on the built objects with pyelftools."""
from __future__ import annotations

import subprocess

from tools import footprint


def test_runtime_objects_are_pure(hosted_build):
    objs = footprint.runtime_objects("hosted", "release")
    assert {o.name for o in objs} >= {"image.o", "model.o", "kernels.o", "sampler.o", "colibri.o", "arena.o"}
    reports = [footprint.inspect(o) for o in objs]
    assert all(not r.forbidden for r in reports), [(r.path, r.forbidden) for r in reports if r.forbidden]
    assert sum(r.sizes.get(".text", 0) for r in reports) > 1000
    assert footprint.main(["--board", "hosted"]) == 0


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


def test_bare_metal_firmware_is_pure(firmwares):
    """A bare-metal ELF links no C library: nothing in the whole program may allocate, thread or print."""
    for board, elf in firmwares.items():
        if board == "hosted":
            continue  # a Linux process: its runtime objects are checked above
        report = footprint.inspect(elf)
        assert not report.forbidden, (board, report.forbidden)
        assert report.sizes[".text"] > 1000
