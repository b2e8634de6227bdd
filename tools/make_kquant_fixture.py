#!/usr/bin/env python3
"""Write tests/fixtures/kquant/llama-cpp-kquants.npz: seeded f32 matrices and the Q4_K, Q5_K and Q6_K bytes
llama.cpp's own reference quantizers (quantize_row_q4_K_ref, quantize_row_q5_K_ref, quantize_row_q6_K_ref, no
importance matrix) make of them, called through ctypes in llama.cpp's shared library libggml-base.so. The tests
(tests/test_kquant.py) hold colibri/kquant.py's port to these bytes; they need neither llama.cpp nor this script.

  python tools/make_kquant_fixture.py              # the library of the installed llama_cpp package (llama-cpp-python)
  python tools/make_kquant_fixture.py --lib DIR    # a directory holding libggml-base.so (a llama.cpp build)
  python tools/make_kquant_fixture.py --check      # compare the fixture with the library's output, write nothing

Every row is also quantized through ggml_quantize_chunk (llama.cpp's quantizer entry point, which the tools
use) and must agree with the _ref functions. The npz holds `x` (f32 [rows, cols]), `case` (each row's case
name), `q4_k`, `q5_k`, `q6_k` (uint8 [rows, cols / 256, block bytes]) and `llama_cpp` (the library's path and
llama_cpp's version, for the record).
"""
from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "kquant" / "llama-cpp-kquants.npz"
COLS = 512  # two super-blocks a row
SEED = 34
# name: (ggml_type, block bytes); ggml.h's GGML_TYPE_Q4_K = 12, Q5_K = 13, Q6_K = 14
TYPES = {"q4_k": (12, 144), "q5_k": (13, 176), "q6_k": (14, 210)}


def cases(rng: np.random.Generator) -> list[tuple[str, np.ndarray]]:
    """(name, rows [n, COLS]) for each case: ordinary weights and the corners of the quantizers' code paths."""
    def normal(n: int, sigma: float) -> np.ndarray:
        return rng.normal(0, sigma, (n, COLS))

    outlier = normal(4, 0.02)
    outlier[np.arange(4), rng.integers(0, COLS, 4)] = [100.0, -100.0, 7.5, -3e3]
    tiny = np.concatenate([normal(1, s) for s in (1e-3, 1e-4, 2e-5, 1e-5, 1e-6, 1e-7, 1e-9, 1e-12)])
    # each sub-block of 16 values its own magnitude, 1e-7..1e2: small scales round to 0 in the 6/8-bit codes
    mixed = normal(8, 1.0) * 10.0 ** rng.uniform(-7, 2, (8, COLS // 16)).repeat(16, axis=1)
    sparse = normal(4, 0.5) * (rng.random((4, COLS)) < 0.03)  # mostly zero: zero sub-blocks in live blocks
    grid = rng.integers(-16, 16, (4, COLS)) * 0.5  # values on a grid: ties for the round-half-to-even
    ramp = np.tile(np.linspace(-1, 1, COLS), (2, 1)) * [[1.0], [3e-3]]
    constant = np.array([[0.25], [-0.25], [3e4], [-1e-3]]) * np.ones((1, COLS))
    positive = np.abs(normal(3, 0.02)) + [[0.0], [0.0], [0.05]]  # min > 0: make_qkx2_quants clamps it to 0
    negative = -np.abs(normal(4, 0.02)) - [[0.0], [0.0], [0.05], [2.0]]
    return [
        ("normal-0.02", normal(32, 0.02)),
        ("normal-1", normal(16, 1.0)),
        ("zeros", np.zeros((2, COLS))),
        ("constant", constant),
        ("outlier", outlier),
        ("tiny", tiny),
        ("positive-only", positive),
        ("negative-only", negative),
        ("large-1e4", normal(4, 1e4)),
        ("huge-1e8", normal(2, 1e8)),  # past f16's range: d and dmin become inf, as llama.cpp writes them
        ("student-t", rng.standard_t(2.5, (4, COLS)) * 0.05),
        ("mixed-scales", mixed),
        ("sparse", sparse),
        ("grid", grid),
        ("ramp", ramp),
    ]


def find_lib(lib_dir: str | None) -> Path:
    if lib_dir is None:
        try:
            import llama_cpp
        except ImportError:
            sys.exit("make_kquant_fixture: llama_cpp (llama-cpp-python) is not installed; pass --lib DIR, a directory "
                     "holding llama.cpp's libggml-base.so")
        lib_dir = str(Path(llama_cpp.__file__).parent / "lib")
    path = Path(lib_dir) / "libggml-base.so"
    if not path.exists():
        sys.exit(f"make_kquant_fixture: no libggml-base.so in {lib_dir}")
    return path


class LlamaCpp:
    """llama.cpp's K-quant quantizers, through ctypes."""

    def __init__(self, path: Path):
        self.lib = ctypes.CDLL(str(path))
        for name in TYPES:
            fn = getattr(self.lib, f"quantize_row_{name[:2]}_K_ref")
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
            fn.restype = None
        self.lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                                 ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
        self.lib.ggml_quantize_chunk.restype = ctypes.c_size_t

    def quantize(self, name: str, x: np.ndarray) -> np.ndarray:
        """quantize_row_*_ref row by row, checked against ggml_quantize_chunk on the whole matrix."""
        ggml_type, block_bytes = TYPES[name]
        x = np.ascontiguousarray(x, dtype=np.float32)
        rows, cols = x.shape
        out = np.zeros((rows, cols // 256, block_bytes), np.uint8)
        fn = getattr(self.lib, f"quantize_row_{name[:2]}_K_ref")
        for r in range(rows):
            fn(x[r].ctypes.data, out[r].ctypes.data, cols)
        chunk = np.zeros_like(out)
        size = self.lib.ggml_quantize_chunk(ggml_type, x.ctypes.data, chunk.ctypes.data, 0, rows, cols, None)
        assert size == out.nbytes, (name, size, out.nbytes)
        if not np.array_equal(chunk, out):
            sys.exit(f"make_kquant_fixture: {name}: ggml_quantize_chunk and quantize_row_{name[:2]}_K_ref disagree")
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--lib", metavar="DIR", help="directory holding llama.cpp's libggml-base.so (default: the "
                    "installed llama_cpp package's lib/)")
    ap.add_argument("--out", type=Path, default=OUT, help=f"the npz to write (default {OUT.relative_to(ROOT)})")
    ap.add_argument("--check", action="store_true", help="compare the existing fixture with the library's bytes")
    args = ap.parse_args(argv)

    path = find_lib(args.lib)
    llama = LlamaCpp(path)
    named = cases(np.random.default_rng(SEED))
    x = np.concatenate([rows for _, rows in named]).astype(np.float32)
    case = np.array([name for name, rows in named for _ in range(len(rows))])
    quants = {name: llama.quantize(name, x) for name in TYPES}
    try:
        import llama_cpp
        version = llama_cpp.__version__
    except ImportError:
        version = "unknown"
    source = f"{path.name} of llama_cpp {version}" if args.lib is None else str(path)

    if args.check:
        old = np.load(args.out)
        same = np.array_equal(old["x"], x) and all(np.array_equal(old[n], q) for n, q in quants.items())
        print(f"{args.out}: {'matches' if same else 'DIFFERS from'} {source}")
        return 0 if same else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, x=x, case=case, llama_cpp=np.array(source), **quants)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KB): {len(x)} rows x {x.shape[1]} cols, "
          f"{len(named)} cases, from {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
