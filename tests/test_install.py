"""A wheel gives the `colibri` command, the importable `colibri` package and the tree to build boards from;
`pip install -e .` runs the checkout. Each goes into a fresh virtual environment whose dependencies are this test
environment's (a .pth file points at them), so nothing is downloaded: --no-deps --no-build-isolation --no-index."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

from conftest import ROOT
from colibri.sim.boards import board_names


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


def run(cmd: list, cwd: Path, home: Path | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home or cwd)}  # no COLIBRI_ROOT, no PYTHONPATH
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def tracked_copy(dest: Path) -> Path:
    """The checkout's tracked files, as a clean clone has them (no build/, no caches)."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in filter(None, files.split("\0")):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def test_a_wheel_builds_and_runs_boards_without_a_checkout(tmp_path):
    """A wheel built from the checkout, installed in a fresh environment and run from a folder with no checkout:
    the command, the package, the boards it carries, a build of a board's firmware into the user's cache (the
    first run builds it itself), a run on the hosted board and on a Cortex-M4 under QEMU, verified."""
    src = tracked_copy(tmp_path / "src")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", tmp_path / "dist", src], check=True, capture_output=True, text=True)
    wheel = next((tmp_path / "dist").glob("colibri-*.whl"))
    py = fresh_venv(tmp_path / "venv")
    pip_install(py, str(wheel))
    colibri = tmp_path / "venv" / "bin" / "colibri"
    elsewhere = tmp_path / "elsewhere"  # HOME, so the cache is ~/.cache/colibri/<version> in it
    elsewhere.mkdir()

    where = run([py, "-c", "import colibri.cli, colibri.sim.launch; print(colibri.__file__)"], elsewhere)
    assert where.returncode == 0 and where.stdout.startswith(str(tmp_path / "venv")), where
    version = run([colibri, "--version"], elsewhere)
    from colibri import __version__
    assert version.returncode == 0 and version.stdout.strip() == f"colibri {__version__}", version
    helped = run([colibri, "--help"], elsewhere)
    subcommands = ("pack", "run", "build", "boards", "info", "footprint", "report")
    assert helped.returncode == 0 and all(f"colibri {s}" in helped.stdout for s in subcommands)
    for sub in subcommands:
        out = run([colibri, sub, "--help"], elsewhere)
        assert out.returncode == 0 and out.stdout.startswith(f"usage: colibri {sub}"), (sub, out.stderr)
    boards = run([colibri, "boards", "--json"], elsewhere)
    listed = {b["board"]: b for b in json.loads(boards.stdout)}
    assert set(listed) == set(board_names()) and not listed["hosted"]["built"], boards.stderr

    image = tmp_path / "demo.img"
    packed = run([colibri, "pack", ROOT / "models" / "demo-adder", "-o", image, "--max-seq", "16", "--no-quality"],
                 elsewhere)
    assert packed.returncode == 0 and image.exists(), packed.stderr
    info = json.loads(run([colibri, "info", image, "--json"], elsewhere).stdout)
    assert info["image_bytes"] == image.stat().st_size and info["boards"]["cortex_m4"].startswith("fits")
    cache = elsewhere / ".cache" / "colibri" / __version__
    for board in ("hosted", "cortex_m4"):
        ran = run([colibri, "run", image, "--board", board, "--prompt-tokens", "13,1,2,3,10,0,4,5", "--max-new-tokens",
                   "5", "--verify"], elsewhere)
        assert ran.returncode == 0 and "greedy tokens agree 5/5: PASS" in ran.stdout, ran.stderr
        said = f"{board}: the firmware is not built yet: building it (colibri build --board {board})"
        assert ran.stderr.strip() == said, ran.stderr
        assert (cache / "build" / board / "release" / "firmware.elf").is_file()
    again = run([colibri, "run", image, "--board", "hosted", "--prompt-tokens", "13,1", "--max-new-tokens", "1"],
                elsewhere)
    assert again.returncode == 0 and again.stderr == "", again.stderr  # built and current: not built again
    firmware = cache / "build" / "hosted" / "release" / "firmware.elf"
    os.utime(cache / "boards" / "hosted" / "main.c")  # a source edited after the build (its content as it was)
    os.utime(firmware, (firmware.stat().st_atime, firmware.stat().st_mtime - 60))
    for says in ("hosted: the firmware is older than ", ""):  # then current
        ran = run([colibri, "run", image, "--board", "hosted", "--prompt-tokens", "13,1", "--max-new-tokens", "1"],
                  elsewhere)
        assert ran.returncode == 0 and ran.stderr.startswith(says) and bool(ran.stderr) == bool(says), ran.stderr
    built = run([colibri, "build", "--board", "hosted", "--mode", "debug"], elsewhere)
    assert built.returncode == 0 and str(cache / "build" / "hosted" / "debug" / "firmware.elf") in built.stdout

    # user errors: one line, exit 2, no traceback
    for cmd, cwd, says in (([colibri, "bogus"], elsewhere, "unknown subcommand 'bogus'"),
                           ([colibri, "run", image, "--board", "hosted", "--prompt-tokens", "1,99"], elsewhere,
                            "token id 99 is outside the image's vocabulary of 14 ids"),
                           ([colibri, "info", tmp_path / "missing.img"], elsewhere, "missing.img not found"),
                           ([colibri, "build", "--board", "nope"], elsewhere, "unknown board 'nope'"),
                           ([colibri, "run", image, "--board", "nope", "--prompt-tokens", "1"], ROOT,
                            "unknown board 'nope'"),
                           ([colibri, "pack", tmp_path / "missing", "-o", tmp_path / "x.img"], elsewhere, "missing")):
        out = run(cmd, cwd, elsewhere)  # (inside the checkout too, the wheel uses its own tree, in ~/.cache)
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
