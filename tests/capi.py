"""ctypes bindings to the hosted build's libcolibri.so, for testing the C API directly."""
from __future__ import annotations

import ctypes as C
from pathlib import Path

import numpy as np

from colibri.codes import STATUS_NAMES

STATUS = {name: i for i, name in enumerate(STATUS_NAMES)}  # colibri_status (format/schema.toml)


class ImageInfo(C.Structure):
    _fields_ = [("format_version", C.c_uint32), ("image_bytes", C.c_uint64), ("arena_bytes", C.c_uint64),
                ("payload_crc32", C.c_uint32)] + [(n, C.c_uint32) for n in (
                    "vocab_size", "hidden_size", "ffn_size", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                    "n_experts", "top_k", "max_seq")] + [
                ("resident_bytes", C.c_uint64), ("expert_block_bytes", C.c_uint64), ("expert_cache_min", C.c_uint32),
                ("streamed_experts", C.c_uint32), ("prefill_token_bytes", C.c_uint64)]


class Sized(C.Structure):
    """A struct whose first field is its size, which the library checks (COLIBRI_E_API_MISMATCH): set to this
    definition's size unless given."""
    def __init__(self, **fields):
        super().__init__(**{"size": C.sizeof(type(self)), **fields})


class Stats(Sized):
    _fields_ = [("size", C.c_uint32), ("tokens_fed", C.c_uint32), ("prefill_batch", C.c_uint32)] + [(n, C.c_uint64) for n in (
        "arena_bytes", "cycles_total", "cycles_attention", "cycles_router", "cycles_experts", "cycles_lm_head",
        "cycles_sampling", "expert_calls", "expert_hits", "expert_misses", "expert_bytes_fetched", "prefetch_issued",
        "prefetch_used", "cycles_fetch_wait")]


class LayerTrace(C.Structure):
    """colibri_layer_trace: what one layer did for one token (the trace hook's argument)."""
    _fields_ = [("pos", C.c_uint32), ("layer", C.c_uint32), ("n_routed", C.c_uint32),
                ("experts", C.POINTER(C.c_uint32)), ("weights", C.POINTER(C.c_float)),
                ("cycles_expert", C.POINTER(C.c_uint64)), ("cycles_attention", C.c_uint64),
                ("cycles_router", C.c_uint64), ("cycles_ffn", C.c_uint64), ("crc_attention", C.c_uint32),
                ("crc_output", C.c_uint32)]


TRACE = C.CFUNCTYPE(None, C.c_void_p, C.POINTER(LayerTrace))  # for Options.trace, as C.cast(hook, C.c_void_p)
FETCH = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_uint64, C.c_size_t, C.c_void_p)
FETCH_START = FETCH
FETCH_WAIT = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_void_p)
PART = C.CFUNCTYPE(None, C.c_void_p, C.c_uint32)
PARALLEL_FOR = C.CFUNCTYPE(None, C.c_void_p, PART, C.c_void_p, C.c_uint32)


def reversed_parts(calls: list[int]):
    """A parallel_for hook that runs the parts on this thread, last first (any order must give the same bits),
    appending each dispatch's part count to `calls`. Keep it referenced while the runtime may call it."""
    @PARALLEL_FOR
    def hook(user, fn, arg, parts):
        calls.append(parts)
        for part in reversed(range(parts)):
            fn(arg, part)
    return hook


class Options(Sized):
    _fields_ = [("size", C.c_uint32), ("cycles", C.c_void_p), ("trace", C.c_void_p), ("user", C.c_void_p), ("expert_cache", C.c_uint32),
                ("expert_policy", C.c_uint32), ("fetch", FETCH), ("fetch_start", FETCH_START), ("fetch_wait", FETCH_WAIT),
                ("parallel_for", PARALLEL_FOR), ("parallel_parts", C.c_uint32), ("prefill_batch", C.c_uint32),
                ("experts", C.c_uint32)]


PREFETCH = 1  # COLIBRI_PREFETCH


class Sampler(C.Structure):
    _fields_ = [("temperature", C.c_float), ("top_k", C.c_uint32), ("top_p", C.c_float), ("rng", C.c_uint64)]


class Aligned:
    """A 64-byte aligned copy of `data` (plus `extra` zero bytes) that ctypes can hand to C."""

    def __init__(self, data: bytes | int, extra: int = 0, misalign: int = 0):
        n = data if isinstance(data, int) else len(data)
        self.raw = C.create_string_buffer(n + extra + 128)
        base = C.addressof(self.raw)
        self.addr = (base + 63) // 64 * 64 + misalign
        if not isinstance(data, int):
            C.memmove(self.addr, data, n)
        self.size = n + extra


class Lib:
    def __init__(self, path: Path):
        self.so = C.CDLL(str(path))
        so = self.so
        so.colibri_image_verify.argtypes = [C.c_void_p, C.c_size_t, C.POINTER(ImageInfo)]
        so.colibri_image_inspect.argtypes = [C.c_void_p, C.c_size_t, C.POINTER(ImageInfo)]
        so.colibri_open.argtypes = [C.c_void_p, C.c_size_t, C.c_void_p, C.c_size_t, C.c_void_p,
                                    C.POINTER(C.c_void_p), C.POINTER(C.c_uint64)]
        so.colibri_reset.argtypes = [C.c_void_p]
        so.colibri_set_trace.argtypes = [C.c_void_p, C.c_void_p]
        so.colibri_feed.argtypes = [C.c_void_p, C.POINTER(C.c_uint32), C.c_size_t]
        so.colibri_step.argtypes = [C.c_void_p, C.POINTER(Sampler), C.POINTER(C.c_uint32)]
        so.colibri_sample.argtypes = [C.c_void_p, C.POINTER(Sampler), C.POINTER(C.c_uint32)]
        so.colibri_logits.argtypes = [C.c_void_p, C.POINTER(C.POINTER(C.c_float)), C.POINTER(C.c_uint32)]
        so.colibri_get_stats.argtypes = [C.c_void_p, C.POINTER(Stats)]
        so.colibri_get_info.argtypes = [C.c_void_p, C.POINTER(ImageInfo)]
        so.colibri_sampler_init.argtypes = [C.POINTER(Sampler), C.c_float, C.c_uint32, C.c_float, C.c_uint64]
        so.colibri_get_kernels.argtypes = [C.c_void_p, C.POINTER(C.c_char_p)]
        so.colibri_strerror.restype = C.c_char_p
        so.colibri_expert_cache_bytes.argtypes = [C.POINTER(ImageInfo), C.c_uint32]
        so.colibri_expert_cache_bytes.restype = C.c_uint64
        so.colibri_prefill_bytes.argtypes = [C.POINTER(ImageInfo), C.c_uint32]
        so.colibri_prefill_bytes.restype = C.c_uint64
        so.colibri_expf.argtypes = [C.c_float]
        so.colibri_expf.restype = C.c_float

    def verify(self, data: bytes, inspect_only: bool = False) -> tuple[int, ImageInfo]:
        """colibri_image_verify, or with inspect_only colibri_image_inspect (no CRCs over tensor bytes)."""
        buf, info = Aligned(data), ImageInfo()
        fn = self.so.colibri_image_inspect if inspect_only else self.so.colibri_image_verify
        return fn(C.c_void_p(buf.addr), buf.size, C.byref(info)), info


class Context:
    """An opened image: keeps the image and arena buffers alive."""

    def __init__(self, lib: Lib, image: bytes, arena_bytes: int | None = None, options: Options | None = None,
                 visible: int | None = None):
        """`visible`: how many image bytes the runtime is given (default all; with an expert cache the
        resident part is enough, the rest is reached through options.fetch)."""
        self.lib = lib
        self.image = Aligned(image)
        status, info = lib.verify(image)
        assert status == 0, status
        self.info = info
        self.options = options  # the callbacks must outlive the context
        if arena_bytes is None:
            arena_bytes = info.arena_bytes + (lib.so.colibri_expert_cache_bytes(C.byref(info), options.expert_cache)
                                              + lib.so.colibri_prefill_bytes(C.byref(info), options.prefill_batch)
                                              if options else 0)
        self.arena = Aligned(arena_bytes)
        self.ctx = C.c_void_p()
        needed = C.c_uint64()
        self.open_status = lib.so.colibri_open(C.c_void_p(self.image.addr), visible or self.image.size,
                                               C.c_void_p(self.arena.addr), self.arena.size,
                                               C.byref(options) if options else None, C.byref(self.ctx), C.byref(needed))
        self.needed = needed.value

    def feed(self, tokens: list[int]) -> int:
        arr = (C.c_uint32 * max(len(tokens), 1))(*tokens)
        return self.lib.so.colibri_feed(self.ctx, arr, len(tokens))

    def logits(self) -> np.ndarray:
        ptr, n = C.POINTER(C.c_float)(), C.c_uint32()
        assert self.lib.so.colibri_logits(self.ctx, C.byref(ptr), C.byref(n)) == 0
        return np.ctypeslib.as_array(ptr, (n.value,)).copy()

    def kernels(self) -> str:
        name = C.c_char_p()
        assert self.lib.so.colibri_get_kernels(self.ctx, C.byref(name)) == 0
        return name.value.decode()

    def stats(self) -> Stats:
        s = Stats()
        assert self.lib.so.colibri_get_stats(self.ctx, C.byref(s)) == 0
        return s
