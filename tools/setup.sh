#!/usr/bin/env bash
# Install what a fresh Debian 12 machine lacks for Colibri: compilers, QEMU and tools (apt), then
# the Python packages (pip). Quick and quiet when everything is already there.
#
# Source it (`. tools/setup.sh`) to get $PY, the Python that has the packages: the system's
# python3, or ./.venv when the system Python is externally managed (Debian's own python3) or has
# no pip. tools/demo.sh and tools/test.sh do that.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
apt_install() {
    local missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "setup: installing Debian packages: ${missing[*]}"
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}
# gcc-mingw-w64-x86-64-win32 builds the hosted_windows board; wine runs it off Windows; cmake builds firmware/CMakeLists.txt
apt_install gcc make qemu-system-x86 qemu-system-arm qemu-system-misc gcc-arm-none-eabi gcc-riscv64-unknown-elf \
    clang libclang-rt-14-dev valgrind gcc-mingw-w64-x86-64-win32 wine wine64 cmake

PY=${PYTHON:-python3}
managed=$($PY -c 'import os, sysconfig; print(os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))')
if [ "$managed" = "True" ] || ! $PY -m pip --version >/dev/null 2>&1; then
    if [ ! -x .venv/bin/python ]; then
        apt_install python3-venv python3-pip
        echo "setup: creating .venv (the system Python does not take pip installs)"
        $PY -m venv .venv
    fi
    PY=$PWD/.venv/bin/python
fi

# torch first and pinned: an unpinned install would pull a multi-GB CUDA build.
if ! $PY -c "import torch" 2>/dev/null; then
    echo "setup: installing torch 2.13.0 (CPU)"
    $PY -m pip install -q --disable-pip-version-check torch==2.13.0 2>&1 | grep -v "^WARNING" || true
    $PY -c "import torch" || { echo "setup: torch did not install"; exit 1; }
fi
# every requirement installed at a version its specifier allows (an older one is upgraded, not kept)
if ! $PY - <<'CHECK' 2>/dev/null
import importlib.metadata as md
try:
    from packaging.requirements import Requirement
except ImportError:  # pip carries its own copy
    from pip._vendor.packaging.requirements import Requirement
for line in open("requirements.txt"):
    line = line.split("#")[0].strip()
    if line and md.version(Requirement(line).name) not in Requirement(line).specifier:
        raise SystemExit(1)
CHECK
then
    echo "setup: installing Python packages from requirements.txt"
    $PY -m pip install -q --disable-pip-version-check -r requirements.txt 2>&1 | grep -v "^WARNING" || true
    $PY -c "import numpy, safetensors, ml_dtypes, elftools, serial, SCons, transformers, pytest, xdist, gguf, matplotlib, tokenizers, tqdm, jinja2, labgrid"
fi
# the `colibri` command, running this checkout
if ! "$PY" -c "import importlib.metadata as m; m.distribution('colibri')" 2>/dev/null; then
    echo "setup: installing the colibri command (pip install -e .)"
    "$PY" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e . 2>&1 | grep -v "^WARNING" || true
    "$PY" -c "import importlib.metadata as m; m.distribution('colibri')" || { echo "setup: pip install -e . failed"; exit 1; }
fi
export PY
