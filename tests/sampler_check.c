/* The sampler (firmware/src/sampler.c) against the rule it must keep, on many random logits: the tokens drawn
 * and the generator's state after every draw must be the same for every temperature, top-k, top-p and seed.
 * The oracle below is the sampler as it was before its cuts took candidates from a heap: the whole vocabulary
 * heap-sorted by probability, then id (docs/SECURITY.md, "Determinism"), then cut. tests/test_work.py builds
 * this with the hosted build's runtime objects and runs it:
 *   sampler_check                          every case; exit 0 when every draw agreed
 *   sampler_check work new|old V K P SPREAD one draw over V logits of SPREAD times a normal, top_k K, top_p P,
 *                                          by the sampler or by the oracle (the test counts its instructions)
 * (A host program: it may allocate and print.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- the oracle: the full sort, as the sampler was ---- */

static float oracle_uniform(colibri_sampler *s) { /* the sampler's xorshift64* */
    uint64_t x = s->rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    s->rng = x;
    return (float)((x * 0x2545F4914F6CDD1Dull) >> 40) * (1.0f / 16777216.0f);
}

static uint32_t oracle_argmax(const float *x, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static int ranks_after(const float *p, uint32_t a, uint32_t b) { return p[a] < p[b] || (p[a] == p[b] && a > b); }

static void oracle_sift(const float *p, uint32_t *idx, uint32_t root, uint32_t n) {
    for (;;) {
        uint32_t child = 2 * root + 1;
        if (child >= n) return;
        if (child + 1 < n && ranks_after(p, idx[child + 1], idx[child])) child++;
        if (!ranks_after(p, idx[child], idx[root])) return;
        uint32_t t = idx[root]; idx[root] = idx[child]; idx[child] = t;
        root = child;
    }
}

uint32_t reference_sample(colibri_sampler *s, const float *logits, float *probs, uint32_t *index, uint32_t n) {
    if (!(s->temperature > 0.0f)) return oracle_argmax(logits, n);
    float max = logits[oracle_argmax(logits, n)];
    for (uint32_t i = 0; i < n; i++) {
        probs[i] = colibri_expf((logits[i] - max) / s->temperature);
        index[i] = i;
    }
    uint32_t keep = n;
    if ((s->top_k > 0 && s->top_k < n) || s->top_p < 1.0f) {
        for (uint32_t i = n / 2; i-- > 0;) oracle_sift(probs, index, i, n);
        for (uint32_t end = n; end-- > 1;) {
            uint32_t t = index[0]; index[0] = index[end]; index[end] = t;
            oracle_sift(probs, index, 0, end);
        }
        if (s->top_k > 0 && s->top_k < n) { /* and every later token of the k-th's probability and logit */
            keep = s->top_k;
            const uint32_t kth = index[keep - 1];
            for (uint32_t j = keep; j < n && probs[index[j]] == probs[kth]; j++) {
                if (logits[index[j]] != logits[kth]) continue;
                uint32_t t = index[keep]; index[keep] = index[j]; index[j] = t;
                keep++;
            }
        }
    }
    float total = 0.0f;
    for (uint32_t i = 0; i < keep; i++) total += probs[index[i]];
    if (s->top_p < 1.0f) {
        float cum = 0.0f;
        for (uint32_t i = 0; i < keep; i++) {
            cum += probs[index[i]];
            if (cum >= s->top_p * total) { keep = i + 1; total = cum; break; }
        }
    }
    float r = oracle_uniform(s) * total, cum = 0.0f;
    for (uint32_t i = 0; i < keep; i++) {
        cum += probs[index[i]];
        if (r < cum) return index[i];
    }
    return index[keep - 1];
}

/* ---- random logits ---- */

static uint64_t rng = 0x243F6A8885A308D3u;
static uint32_t next(void) { /* xorshift64*, the inputs' own */
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (uint32_t)((rng * 0x2545F4914F6CDD1Du) >> 32);
}
static float uniform(void) { return (float)(next() >> 8) * (1.0f / 16777216.0f); }
static float normal(void) { return uniform() + uniform() + uniform() + uniform() - 2.0f; } /* near enough */

/* Logits of one of four shapes: spread out (distinct), on a coarse grid (many equal), a few distinct values
 * (long runs of ties), or one far ahead of the rest (the peaked distribution of a trained model). */
static void fill_logits(float *logits, uint32_t n, uint32_t shape) {
    for (uint32_t i = 0; i < n; i++) {
        switch (shape) {
        case 0: logits[i] = 3.0f * normal(); break;
        case 1: logits[i] = (float)(next() % 17) * 0.5f - 4.0f; break;
        case 2: logits[i] = (float)(next() % 3); break;
        default: logits[i] = next() % 50 ? 2.0f * normal() : 12.0f + normal(); break;
        }
    }
}

static int work(char **argv) {
    const int old = strcmp(argv[2], "old") == 0;
    const uint32_t n = (uint32_t)strtoul(argv[3], 0, 10), k = (uint32_t)strtoul(argv[4], 0, 10);
    const float top_p = strtof(argv[5], 0), spread = strtof(argv[6], 0);
    float *logits = malloc(sizeof *logits * n), *probs = malloc(sizeof *probs * n);
    uint32_t *index = malloc(sizeof *index * n);
    if (!logits || !probs || !index) return 2;
    for (uint32_t i = 0; i < n; i++) logits[i] = spread * normal();
    colibri_sampler s;
    if (colibri_sampler_init(&s, 1.0f, k, top_p, 7)) return 2;
    const uint32_t token = old ? reference_sample(&s, logits, probs, index, n) : sample_token(&s, logits, probs, index, n);
    printf("token %u\n", token);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 7 && strcmp(argv[1], "work") == 0) return work(argv);
    if (argc != 1) {
        fprintf(stderr, "usage: %s [work new|old V K P SPREAD]\n", argv[0]);
        return 2;
    }
    static const uint32_t sizes[] = { 1, 2, 3, 5, 17, 64, 257, 1000 };
    static const float temperatures[] = { 0.05f, 0.7f, 1.0f, 1.9f, 1.0e8f }; /* 1e8: many logits, one probability */
    static const float top_ps[] = { 1.0f, 0.999999f, 0.95f, 0.9f, 0.5f, 0.1f, 1.0e-6f };
    static float logits[1000], probs_a[1000], probs_b[1000];
    static uint32_t index_a[1000], index_b[1000];
    uint32_t draws = 0, mismatches = 0;
    for (uint32_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const uint32_t n = sizes[si];
        const uint32_t top_ks[] = { 0, 1, 2, 3, 7, n > 1 ? n - 1 : 1, n, n + 5 };
        for (uint32_t shape = 0; shape < 4; shape++) {
            fill_logits(logits, n, shape);
            for (uint32_t ti = 0; ti < sizeof temperatures / sizeof temperatures[0]; ti++)
                for (uint32_t ki = 0; ki < sizeof top_ks / sizeof top_ks[0]; ki++)
                    for (uint32_t pi = 0; pi < sizeof top_ps / sizeof top_ps[0]; pi++) {
                        colibri_sampler a, b;
                        colibri_sampler_init(&a, temperatures[ti], top_ks[ki], top_ps[pi], next());
                        b = a;
                        for (int d = 0; d < 6; d++, draws++) {
                            const uint32_t got = sample_token(&a, logits, probs_a, index_a, n);
                            const uint32_t want = reference_sample(&b, logits, probs_b, index_b, n);
                            if (got == want && a.rng == b.rng) continue;
                            if (mismatches++ < 10)
                                printf("MISMATCH n=%u shape=%u T=%g top_k=%u top_p=%g: %u, oracle %u\n", n, shape,
                                       (double)temperatures[ti], top_ks[ki], (double)top_ps[pi], got, want);
                        }
                    }
        }
    }
    printf("sampler_check: %u draws, %u mismatches\n", draws, mismatches);
    return mismatches ? 1 : 0;
}
