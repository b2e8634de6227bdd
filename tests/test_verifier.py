"""The C image verifier against crafted images: each corruption gets its own status."""
from __future__ import annotations

import struct

import pytest

from capi import STATUS, Lib
from host.image import ENTRY_BYTES, HEADER_BYTES, HEADER_CRC_OFFSET, crc32, read_image

TABLE = HEADER_BYTES  # the packer puts the tensor table right after the header


def reseal(buf: bytearray) -> bytearray:
    """Recompute both CRCs, so a test reaches the checks behind them."""
    image_bytes = min(struct.unpack_from("<Q", buf, 16)[0], len(buf))
    struct.pack_into("<I", buf, 28, crc32(buf[HEADER_BYTES:image_bytes]))
    struct.pack_into("<I", buf, HEADER_CRC_OFFSET, 0)
    struct.pack_into("<I", buf, HEADER_CRC_OFFSET, crc32(buf[:HEADER_BYTES]))
    return buf


def put(fmt: str, offset: int, value, seal: bool = True):
    def mutate(b: bytearray) -> bytearray:
        struct.pack_into(fmt, b, offset, value)
        return reseal(b) if seal else b
    return mutate


def entry(i: int, field_offset: int) -> int:
    return TABLE + i * ENTRY_BYTES + field_offset


FIRST_UP = 3 + 20 + 1  # entries: embd, rope cos, rope sin, 20 per-layer slots, then expert 0 gate, up, down


def swap_entries(b: bytearray) -> bytearray:
    a, c = entry(3, 0), entry(4, 0)
    b[a:a + ENTRY_BYTES], b[c:c + ENTRY_BYTES] = b[c:c + ENTRY_BYTES], b[a:a + ENTRY_BYTES]
    return reseal(b)


def flip(offset: int):
    def mutate(b: bytearray) -> bytearray:
        b[offset] ^= 0x40
        return b
    return mutate


def overlap_up_with_gate(b: bytearray) -> bytearray:
    """Point expert 0's up matrix at its gate matrix: in bounds and aligned, but not contiguous."""
    gate_offset = struct.unpack_from("<Q", b, entry(FIRST_UP - 1, 32))[0]
    return put("<Q", entry(FIRST_UP, 32), gate_offset)(b)


# Entry 0 is the token embedding; entries 3+7.. are layer 0's first expert (gate, up, down).
CASES = [
    ("shorter than header", lambda b: b[:100], "E_IMAGE_TRUNCATED"),
    ("truncated", lambda b: b[:-64], "E_IMAGE_TRUNCATED"),
    ("image_bytes huge", put("<Q", 16, 1 << 62), "E_IMAGE_TRUNCATED"),
    ("bad magic", flip(0), "E_IMAGE_MAGIC"),
    ("version 2", put("<I", 8, 2, seal=False), "E_IMAGE_VERSION"),
    ("header byte flipped", flip(40), "E_IMAGE_HEADER_CRC"),
    ("payload byte flipped", lambda b: flip(len(b) - 5)(b), "E_IMAGE_PAYLOAD_CRC"),
    ("table byte flipped", flip(TABLE + 33), "E_IMAGE_PAYLOAD_CRC"),
    ("reserved header byte", put("<B", 200, 1), "E_IMAGE_HEADER"),
    ("table offset past data", put("<Q", 88, 1 << 40), "E_IMAGE_HEADER"),
    ("entry size", put("<I", 100, 32), "E_IMAGE_HEADER"),
    ("vocab zero", put("<I", 36, 0), "E_IMAGE_DIMS"),
    ("hidden absurd", put("<I", 40, 1 << 31), "E_IMAGE_DIMS"),
    ("heads not multiple of kv heads", put("<I", 56, 3), "E_IMAGE_DIMS"),
    ("odd head_dim", put("<I", 60, 7), "E_IMAGE_DIMS"),
    ("top_k > experts", put("<I", 68, 9), "E_IMAGE_DIMS"),
    ("eps NaN", put("<f", 80, float("nan")), "E_IMAGE_DIMS"),
    ("unknown arch", put("<I", 32, 2), "E_UNSUPPORTED"),
    ("unknown flag", put("<I", 76, 1 << 9), "E_UNSUPPORTED"),
    ("both q/k norm kinds", put("<I", 76, (1 << 3) | (1 << 4)), "E_UNSUPPORTED"),
    ("tensor count", put("<I", 96, 10), "E_IMAGE_TABLE"),
    ("entries out of order", swap_entries, "E_IMAGE_TABLE"),
    ("wrong shape", put("<I", entry(0, 16), 36), "E_IMAGE_TABLE"),
    ("wrong byte size", put("<Q", entry(0, 40), 4), "E_IMAGE_TABLE"),
    ("unknown dtype", put("<H", entry(0, 2), 77), "E_IMAGE_TABLE"),
    ("dtype not built", put("<H", entry(0, 2), 1), "E_IMAGE_DTYPE"),
    ("offset out of range", put("<Q", entry(0, 32), 1 << 40), "E_IMAGE_BOUNDS"),
    ("offset wraps", put("<Q", entry(0, 32), (1 << 64) - 64), "E_IMAGE_BOUNDS"),
    ("offset misaligned", put("<Q", entry(0, 32), 4096 + 4), "E_IMAGE_BOUNDS"),
    ("offset inside table", put("<Q", entry(0, 32), TABLE), "E_IMAGE_BOUNDS"),
    ("expert not contiguous", overlap_up_with_gate, "E_IMAGE_BOUNDS"),
    ("arena plan", put("<Q", 112, 64), "E_IMAGE_PLAN"),
]


@pytest.fixture(scope="module")
def lib(hosted_build):
    return Lib(hosted_build / "libcolibri.so")


def test_clean_image_verifies(lib, images):
    for path in images.values():
        data = path.read_bytes()
        status, info = lib.verify(data)
        assert status == 0
        assert info.arena_bytes == read_image(data).header["arena_bytes"]
        assert info.image_bytes == len(data)


@pytest.mark.parametrize("name,mutate,expected", CASES, ids=[c[0] for c in CASES])
def test_corruption_is_named(lib, images, name, mutate, expected):
    data = bytes(mutate(bytearray(images["base"].read_bytes())))
    status, _ = lib.verify(data)
    assert status == STATUS[expected], f"{name}: got status {status}"


def test_statuses_are_distinct():
    assert len({c[2] for c in CASES}) >= 12
