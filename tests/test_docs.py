"""The commands the README, docs/GUIDE.md and docs/RTOS.md show run as they are written: every line of every `sh`
block, in order, from a folder that has the checkout's models/, tests/ and build/ (so its files land there, not in the
checkout), with `colibri` on the PATH. A block is `sh` (run here), `text` (output, not run) or `bash` (the README's
quick start, which CI itself runs), or in docs/RTOS.md code to read (c, cmake, yaml, kconfig); the docs' figures that
do not depend on the machine are checked against what prints them. docs/RTOS.md's commands need the FreeRTOS kernel
(FREERTOS_KERNEL_PATH): without it they are skipped, saying so."""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

DOCS = ("README.md", "docs/GUIDE.md", "docs/RTOS.md")
CODE = {"docs/RTOS.md": {"c", "cmake", "yaml", "kconfig"}}  # blocks of code to read, not commands
FENCE = re.compile(r"^```(\w*)\s*$")


def blocks(doc: Path) -> list[tuple[str, list[str]]]:
    """(language, lines) of each fenced block."""
    out, current = [], None
    for line in doc.read_text().splitlines():
        fence = FENCE.match(line)
        if fence and current is None:
            current = (fence.group(1), [])
        elif fence:
            out.append(current)
            current = None
        elif current is not None:
            current[1].append(line)
    assert current is None, f"{doc}: a fenced block is not closed"
    return out


def commands(lines: list[str]) -> list[str]:
    """The block's commands, a line ending in a backslash joined to the next."""
    out, pending = [], ""
    for line in lines:
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        if (pending + line).strip():
            out.append(pending + line)
        pending = ""
    return out


@pytest.mark.parametrize("doc", DOCS)
def test_every_block_says_what_it_is(doc):
    languages = [lang for lang, _ in blocks(ROOT / doc)]
    assert languages and set(languages) <= {"sh", "text", "bash"} | CODE.get(doc, set()), languages


@pytest.mark.parametrize("doc", DOCS)
def test_documented_commands_run_as_written(doc, tmp_path, tmp_path_factory):
    if doc == "docs/RTOS.md":
        from colibri.sim.boards import rtos_kernel_problem
        if rtos_kernel_problem("freertos"):
            pytest.skip(rtos_kernel_problem("freertos"))
    work = tmp_path / "work"
    work.mkdir()
    (ROOT / "build").mkdir(exist_ok=True)
    for name in ("models", "tests", "build"):  # build/: where `colibri build` puts the firmware the docs name
        (work / name).symlink_to(ROOT / name)
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "colibri").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m colibri.cli "$@"\n')
    (shim / "colibri").chmod(0o755)
    env = dict(os.environ, PATH=f"{shim}:{os.environ['PATH']}", PYTHONPATH=str(ROOT),
               XDG_CACHE_HOME=str(tmp_path_factory.getbasetemp() / "docs-cache"))  # the docs' runs share images
    ran = 0
    for lang, lines in blocks(ROOT / doc):
        if lang != "sh":
            continue
        for command in commands(lines):
            done = subprocess.run(["bash", "-c", command], cwd=work, env=env, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=600)
            assert done.returncode == 0 and "Traceback" not in done.stderr, (command, done.stdout[-2000:],
                                                                              done.stderr[-2000:])
            ran += 1
    assert ran >= 5, f"{doc}: only {ran} commands"


def test_readme_demo_figures_are_what_the_demo_prints(tmp_path):
    """The README's demo output names the image and arena bytes: the demo's own figures (which do not depend on
    the machine; the speeds do)."""
    from tools import demo
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert demo.main(["--board", "hosted", "--problems", "1", "--json"]) == 0
    report = json.loads(printed.getvalue().strip().splitlines()[-1])
    readme = (ROOT / "README.md").read_text()
    assert f"image {report['image_bytes']:,} bytes" in readme
    stated = re.search(r"arena ([\d,]+) bytes \(exact: the packer's plan, ([\d,]+) \+ a prefill batch of (\d+) "
                       r"tokens, ([\d,]+)\)", readme)
    assert stated, "the README's demo output has no arena line"
    plan, batch_bytes = (int(stated.group(i).replace(",", "")) for i in (2, 4))
    assert int(stated.group(1).replace(",", "")) == plan + batch_bytes
    from colibri.image import arena_bytes, open_image, prefill_bytes
    from colibri.pack import pack
    image = tmp_path / "demo.img"
    pack(ROOT / "models" / "demo-adder", image, 16, 64, measure_quality=False)  # as tools/demo.py packs it
    dims = open_image(image, check_crcs=False).dims
    assert plan == arena_bytes(dims) and batch_bytes == prefill_bytes(dims, int(stated.group(3)))


def test_the_guides_pack_report_is_what_pack_prints(tmp_path, monkeypatch, capsys):
    """The GUIDE's sample report (the block after "The report:") is, line for line, what its first pack command
    prints (the demo model's figures do not depend on the machine)."""
    from colibri import pack
    first = next(c for lang, lines in blocks(ROOT / "docs" / "GUIDE.md") if lang == "sh" for c in commands(lines))
    assert first.startswith("colibri pack ")
    shown = re.search(r"The report:\n\n```text\n(.*?)\n```", (ROOT / "docs" / "GUIDE.md").read_text(), re.S)
    (tmp_path / "models").symlink_to(ROOT / "models")
    monkeypatch.chdir(tmp_path)
    assert pack.main(first.split()[2:]) == 0
    assert capsys.readouterr().out.splitlines() == shown.group(1).splitlines()
