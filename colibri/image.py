"""The Colibri image, format v9, as one import: its constants (colibri/format.py, written from format/schema.toml),
the model's geometry (colibri/dims.py), the arena's plan (colibri/plan.py), the records as bytes and the tensor
names (colibri/table.py), the writer (colibri/writer.py) and the reader (colibri/reader.py).

The byte layout is specified in docs/FORMAT.md; these modules and firmware/src/image.c and table.c are the two
implementations of it and are tested against each other.
"""
from __future__ import annotations

from colibri.format import *  # noqa: F401,F403  (the format's constants: format/schema.toml is their source)
from colibri.format import Role  # noqa: F401
from colibri.dims import ModelDims, align_up, canonical_order, expected_shape, index_slots  # noqa: F401
from colibri.dims import (FLAG_ATTN_GATE, FLAG_ATTN_SINKS, FLAG_EXPERT_BIAS, FLAG_GELU_TANH, FLAG_GEMMA4_LAYER,  # noqa: F401
                          FLAG_NORM_TOPK, FLAG_O_BIAS, FLAG_QK_NORM_FULL, FLAG_QK_NORM_HEAD, FLAG_QKV_BIAS,
                          FLAG_ROPE_PAIRS, FLAG_ROUTER_BIAS, FLAG_ROUTER_SIGMOID, FLAG_ROUTER_TOPK_SOFTMAX,
                          FLAG_SHARED_EXPERT, FLAG_SHARED_PLAIN, FLAG_V_NORM)
from colibri.plan import (EXPERT_SLOT_META_BYTES, TENSOR_REF_BYTES, arena_bytes, arena_plan,  # noqa: F401
                          expert_cache_bytes, prefill_bytes)
from colibri.table import (ENTRY_STRUCT, HEADER_CRC_OFFSET, HEADER_STRUCT, LAYER_STRUCT, TensorEntry,  # noqa: F401
                           crc32, entry_encoded, expert_blocks, header_block, tensor_name, write_header)
from colibri.writer import build_image, check_runnable, write_image  # noqa: F401
from colibri.reader import Image, ImageError, layer_fields, open_image, read_image  # noqa: F401
from colibri.quant import DType  # noqa: F401  (the weight dtypes, as image users name them)
