#!/usr/bin/env bash
# Install what a fresh Debian 12 machine lacks for Colibri: the C toolchain and QEMU (apt), then the
# Python packages (pip). Quick and quiet when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(gcc make qemu-system-x86 qemu-system-arm qemu-system-misc gcc-arm-none-eabi gcc-riscv64-unknown-elf
              clang libclang-rt-14-dev valgrind)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing Debian packages: ${missing[*]}"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
# torch first and pinned: an unpinned install would pull a multi-GB CUDA build.
if ! $PY -c "import torch" 2>/dev/null; then
    echo "setup: installing torch 2.13.0 (CPU)"
    $PY -m pip install -q --disable-pip-version-check torch==2.13.0 2>&1 | grep -v "^WARNING" || true
    $PY -c "import torch" || { echo "setup: torch did not install"; exit 1; }
fi
if ! $PY - <<'PY' 2>/dev/null
import importlib.metadata as md, re, sys
for line in open("requirements.txt"):
    name = re.split(r"[<>=\s#]", line.strip(), maxsplit=1)[0]
    if name:
        md.version(name)
PY
then
    echo "setup: installing Python packages from requirements.txt"
    $PY -m pip install -q --disable-pip-version-check -r requirements.txt 2>&1 | grep -v "^WARNING" || true
    $PY - <<'PY'
import numpy, safetensors, ml_dtypes, elftools, serial, SCons, transformers, pytest, gguf, matplotlib, tokenizers
PY
fi
