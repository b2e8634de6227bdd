"""A fault-injecting proxy for the byte stream between the host and a device.

Wraps any transport (hosted pipes, a QEMU socket, a real port) and, at a per-byte `rate` in each
direction, drops, flips, duplicates or delays bytes; it can also cut the link for good after a
number of bytes. Seeded, so a failing case can be replayed. Used by tests/test_faults.py and by
`flash.py --fault-rate`.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from colibri.protocol import LinkTimeout, Transport


@dataclass
class FaultCounts:
    dropped: int = 0
    flipped: int = 0
    duplicated: int = 0
    delayed: int = 0


@dataclass
class LossyTransport:
    inner: Transport
    rate: float
    seed: int = 0
    cut_after: int | None = None      # bytes (both directions) after which nothing more gets through
    max_delay: float = 0.01           # seconds for a delayed byte
    counts: FaultCounts = field(default_factory=FaultCounts)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.passed = 0
        self.pending = bytearray()

    def _cut(self) -> bool:
        return self.cut_after is not None and self.passed >= self.cut_after

    def _mangle(self, data: bytes) -> bytes:
        out = bytearray()
        for b in data:
            self.passed += 1
            if self._cut():
                break
            if self.rng.random() >= self.rate:
                out.append(b)
                continue
            kind = self.rng.randrange(4)
            if kind == 0:
                self.counts.dropped += 1
            elif kind == 1:
                self.counts.flipped += 1
                out.append(b ^ (1 << self.rng.randrange(8)))
            elif kind == 2:
                self.counts.duplicated += 1
                out += bytes((b, b))
            else:
                self.counts.delayed += 1
                time.sleep(self.rng.random() * self.max_delay)
                out.append(b)
        return bytes(out)

    def write(self, data: bytes) -> None:
        mangled = self._mangle(data)
        if mangled:
            self.inner.write(mangled)

    def read(self, n: int, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        while len(self.pending) < n:
            left = deadline - time.monotonic()
            if left <= 0 or self._cut():
                if self._cut():
                    time.sleep(max(0.0, left))
                raise LinkTimeout(f"timed out after {timeout:.1f}s waiting for the device")
            self.pending += self._mangle(self.inner.read(1, left))
        out = bytes(self.pending[:n])
        del self.pending[:n]
        return out
