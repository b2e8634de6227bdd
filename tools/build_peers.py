#!/usr/bin/env python3
"""Build the peers' own benchmark and quantizer (llama-bench, llama-quantize) from the PyPI sdists that vendor
them, for tools/bench.py (docs/PERFORMANCE.md). Idempotent: a peer whose binaries exist is left alone.

  python tools/build_peers.py                      # both peers into build/peers/
  python tools/build_peers.py --peers ik_llama.cpp --jobs 1

llama.cpp: the `llama-cpp-python` 0.3.36 sdist (vendor/llama.cpp). On a CPU that advertises AMX inside a VM
the native build crashes on q8_0/q4_0, so it is built with the instruction sets named (AVX-512 and VNNI on,
AMX off), as llama-cpp-python is for tools/bench.py.
ik_llama.cpp: the `ik-llama-cpp-python` 0.1.5 sdist (vendor/ik_llama.cpp), with GGML_NATIVE=ON (with it off and
the AVX-512 flags, iqk_fa_templates.h does not compile here). The sdist lacks
common/cmake/build-info-gen-cpp.cmake, the script its build runs to write common/build-info.cpp from its .in, so
one is written that does that.

Each sdist is fetched with `pip download` into build/peers/sdist/ unless a file of that name is already there;
the build runs under `nice` and builds only the two targets. Binaries: build/peers/<peer>/build/bin/.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEERS_DIR = ROOT / "build" / "peers"
TARGETS = ("llama-bench", "llama-quantize")
COMMON = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
          "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_OPENSSL=OFF", "-DGGML_OPENMP=OFF"]


@dataclass(frozen=True)
class Peer:
    name: str      # as tools/bench.py names the engine
    package: str   # the PyPI sdist that vendors it
    version: str
    vendored: str  # the source tree inside the sdist
    cmake_args: tuple[str, ...]


PEERS = {
    "llama.cpp": Peer("llama.cpp", "llama-cpp-python", "0.3.36", "vendor/llama.cpp",
                      ("-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
                       "-DGGML_AVX512=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF",
                       "-DGGML_AMX_BF16=OFF")),
    "ik_llama.cpp": Peer("ik_llama.cpp", "ik-llama-cpp-python", "0.1.5", "vendor/ik_llama.cpp",
                         ("-DGGML_NATIVE=ON",)),
}


def binary(peer: str, tool: str) -> Path:
    """Where `tool` (llama-bench, llama-quantize) of `peer` lands."""
    return PEERS_DIR / peer / "build" / "bin" / tool


def sdist(peer: Peer) -> Path:
    dest = PEERS_DIR / "sdist"
    stem = f"{peer.package.replace('-', '_')}-{peer.version}"
    found = sorted(dest.glob(f"{stem}.tar.gz"))
    if not found:
        dest.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(dest),
                        f"{peer.package}=={peer.version}"], check=True)
        found = sorted(dest.glob(f"{stem}.tar.gz"))
    if not found:
        raise RuntimeError(f"pip download gave no {stem}.tar.gz in {dest}")
    return found[0]


def source_tree(peer: Peer) -> Path:
    """The vendored tree, extracted once from the sdist into build/peers/<peer>/src."""
    top = PEERS_DIR / peer.name / "src"
    archive = sdist(peer)
    root = top / archive.name.removesuffix(".tar.gz")
    if not root.exists():
        top.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive) as tar:
            tar.extractall(top, filter="data")
    tree = root / peer.vendored
    script = tree / "common" / "cmake" / "build-info-gen-cpp.cmake"
    if (tree / "common" / "build-info.cpp.in").exists() and not script.exists():
        # the build runs this script (from the tree's root) to write common/build-info.cpp from its .in
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(f'set(BUILD_NUMBER 0)\nset(BUILD_COMMIT "{peer.package}-{peer.version}")\n'
                          'set(BUILD_COMPILER "${CMAKE_C_COMPILER_ID} ${CMAKE_C_COMPILER_VERSION}")\n'
                          'set(BUILD_TARGET "x86_64-linux-gnu")\n'
                          'configure_file(common/build-info.cpp.in common/build-info.cpp @ONLY)\n')
    return tree


def build(peer: Peer, jobs: int) -> None:
    if all(binary(peer.name, t).exists() for t in TARGETS):
        print(f"{peer.name}: built ({binary(peer.name, TARGETS[0]).parent})")
        return
    tree = source_tree(peer)
    out = PEERS_DIR / peer.name / "build"
    if not (out / "CMakeCache.txt").exists():
        subprocess.run(["cmake", "-S", str(tree), "-B", str(out), "-G", "Ninja", *COMMON, *peer.cmake_args],
                       check=True)
    subprocess.run(["nice", "-n", "10", "cmake", "--build", str(out), "-j", str(jobs), "--target", *TARGETS],
                   check=True)
    print(f"{peer.name}: {', '.join(str(binary(peer.name, t)) for t in TARGETS)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", default=",".join(PEERS), help="comma-separated, of " + ", ".join(PEERS))
    ap.add_argument("--jobs", type=int, default=2, help="parallel compile jobs (default 2)")
    args = ap.parse_args(argv)
    names = [p for p in args.peers.split(",") if p]
    if any(p not in PEERS for p in names):
        ap.error(f"--peers takes {', '.join(PEERS)}")
    for name in names:
        try:
            build(PEERS[name], args.jobs)
        except (subprocess.CalledProcessError, RuntimeError, OSError) as exc:
            print(f"build_peers: {name}: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
