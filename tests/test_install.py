"""`pip install .` gives the `colibri` command and the importable `colibri` package; `pip install -e .`
too. Each goes into a fresh virtual environment whose dependencies are this test environment's (a .pth
file points at them), so nothing is downloaded: --no-deps --no-build-isolation --no-index."""
from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from conftest import ROOT, build


def fresh_venv(where: Path) -> Path:
    """A new virtual environment that sees this environment's packages (numpy, pip, setuptools, ...)."""
    venv.create(where, with_pip=False)
    py = where / "bin" / "python"
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    paths = sysconfig.get_paths()
    Path(site, "test-deps.pth").write_text(f"{paths['purelib']}\n{paths['platlib']}\n")
    return py


def pip_install(py: Path, *args: str) -> None:
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", *args],
                   check=True, capture_output=True, text=True)


def run(cmd: list, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd)}  # no COLIBRI_ROOT, no PYTHONPATH
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_pip_install_gives_the_command_and_the_package(tmp_path):
    src = tmp_path / "src"  # a copy, so the build leaves nothing in the checkout
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "colibri"):
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, src / name)
    py = fresh_venv(tmp_path / "venv")
    pip_install(py, str(src))
    colibri = tmp_path / "venv" / "bin" / "colibri"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    where = run([py, "-c", "import colibri.cli, colibri.sim.launch; print(colibri.__file__)"], elsewhere)
    assert where.returncode == 0 and where.stdout.startswith(str(tmp_path / "venv")), where
    helped = run([colibri, "--help"], elsewhere)
    assert helped.returncode == 0 and all(f"colibri {s}" in helped.stdout for s in ("pack", "run", "footprint", "report"))
    for sub in ("pack", "run", "footprint", "report"):
        out = run([colibri, sub, "--help"], elsewhere)
        assert out.returncode == 0 and out.stdout.startswith(f"usage: colibri {sub}"), (sub, out.stderr)

    # packing needs no checkout; running on a board finds the checkout from the working directory
    image = tmp_path / "demo.img"
    packed = run([colibri, "pack", ROOT / "models" / "demo-adder", "-o", image, "--max-seq", "16", "--no-quality"],
                 elsewhere)
    assert packed.returncode == 0 and image.exists(), packed.stderr
    firmware = build("hosted") / "firmware.elf"
    ran = run([colibri, "run", image, "--board", "hosted", "--firmware", firmware,
               "--prompt-tokens", "13,1,2,3,10,0,4,5,11", "--max-new-tokens", "5", "--verify"], ROOT)
    assert ran.returncode == 0 and "greedy tokens agree 5/5: PASS" in ran.stdout, ran.stderr

    # user errors: one line, exit 2, no traceback
    for cmd, cwd, says in (([colibri, "bogus"], elsewhere, "unknown subcommand 'bogus'"),
                           ([colibri, "run", image, "--board", "hosted", "--prompt-tokens", "1"], elsewhere,
                            "Colibri checkout"),
                           ([colibri, "run", image, "--board", "nope", "--prompt-tokens", "1"], ROOT,
                            "unknown board 'nope'"),
                           ([colibri, "pack", tmp_path / "missing", "-o", tmp_path / "x.img"], elsewhere, "missing")):
        out = run(cmd, cwd)
        assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr, (cmd, out.stderr)
        assert out.stderr.strip().count("\n") == 0, out.stderr


def test_editable_install_runs_the_checkout(tmp_path):
    py = fresh_venv(tmp_path / "venv")
    pip_install(py, "-e", str(ROOT))
    where = run([py, "-c", "import colibri; print(colibri.__file__)"], tmp_path)
    assert where.returncode == 0 and where.stdout.strip() == str(ROOT / "colibri" / "__init__.py"), where
    helped = run([tmp_path / "venv" / "bin" / "colibri", "--help"], tmp_path)
    assert helped.returncode == 0 and "colibri run" in helped.stdout
    shutil.rmtree(ROOT / "colibri.egg-info", ignore_errors=True)
