"""The runtime's sampler in Python, bit for bit (firmware/src/sampler.c): given the same logits and seed it
draws the same tokens, so `flash.py --verify` checks sampled tokens as it checks greedy ones.

- The generator: splitmix64 of the seed (0 replaced by a constant), then xorshift64*; a draw is its top 24
  bits times 2^-24, a float32 in [0, 1).
- Temperature <= 0: the first largest logit.
- Otherwise p_i = colibri_expf((logit_i - max) / T). The candidates, best first, are ranked by p (the lower id
  first on ties); top-k keeps the k best and then every candidate of the k-th's probability whose logit equals
  the k-th's; top-p alone keeps candidates until one no longer changes their running sum. With neither cut
  the candidates are every id in id order. Their total is summed from +0 best first; top-p then keeps the
  shortest prefix whose sum reaches top_p * total, and that sum is the total; the draw times the total picks
  the first candidate whose running sum exceeds it (the last one if none does).
"""
from __future__ import annotations

import numpy as np

from colibri import arith
from colibri.arith import F32, ZERO

MASK = (1 << 64) - 1


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


class Sampler:
    """colibri_sampler: colibri_sampler_init's state, and sample_token's draw."""

    def __init__(self, temperature: float, top_k: int, top_p: float, seed: int):
        self.temperature, self.top_k, self.top_p = F32(temperature), int(top_k), F32(top_p)
        self.rng = splitmix64(seed & MASK) or 0x9E3779B97F4A7C15

    def uniform(self) -> np.float32:
        """xorshift64*: the next state, and its top 24 bits as a float32 in [0, 1)."""
        x = self.rng
        x ^= x >> 12
        x ^= (x << 25) & MASK
        x ^= x >> 27
        self.rng = x
        return F32((x * 0x2545F4914F6CDD1D & MASK) >> 40) * F32(1.0 / 16777216.0)

    def candidates(self, logits: np.ndarray, p: np.ndarray) -> list[int]:
        """The ids the cuts keep, best first (every id, in id order, without a cut)."""
        n = p.size
        cut_k = 0 < self.top_k < n
        if not cut_k and not self.top_p < 1:
            return list(range(n))
        kept: list[int] = []
        kth, total = 0, ZERO
        for best in np.lexsort((np.arange(n), -p)).tolist():  # p descending, the lower id first
            more = total + p[best]
            if (len(kept) >= self.top_k and p[best] != p[kth]) if cut_k else more == total:
                break
            if not cut_k or len(kept) < self.top_k or logits[best] == logits[kth]:
                total = more
                kept.append(best)
                if len(kept) == self.top_k:
                    kth = best
        return kept

    def sample(self, logits: np.ndarray) -> int:
        """The token sample_token draws from these logits (float32 [vocab])."""
        logits = np.asarray(logits, F32)
        if not self.temperature > 0:
            return int(np.argmax(logits))
        p = arith.expf((logits - logits.max()) / self.temperature)
        kept = self.candidates(logits, p)
        sums = ZERO + np.add.accumulate(p[kept], dtype=F32)  # running sums, best first, from +0
        total = sums[-1]
        if self.top_p < 1:  # the shortest prefix whose mass reaches top_p of the total
            reach = np.flatnonzero(sums >= self.top_p * total)
            kept, sums = kept[:reach[0] + 1], sums[:reach[0] + 1]
            total = sums[-1]
        r = self.uniform() * total
        above = np.flatnonzero(r < sums)
        return kept[int(above[0])] if above.size else kept[-1]
