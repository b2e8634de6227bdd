/* The sampler: greedy, temperature, top-k and top-p, with the runtime's own PRNG so a seed gives
 * the same tokens on every board. Only float ops with a fixed order and colibri_expf are used. */
#include "internal.h"

static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* xorshift64*: 24 random bits -> a float in [0, 1). */
static float next_uniform(colibri_sampler *s) {
    uint64_t x = s->rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    s->rng = x;
    return (float)((x * 0x2545F4914F6CDD1Dull) >> 40) * (1.0f / 16777216.0f);
}

colibri_status colibri_sampler_init(colibri_sampler *s, float temperature, uint32_t top_k, float top_p,
                                    uint64_t seed) {
    if (!s) return COLIBRI_E_NULL;
    if (temperature != temperature || top_p != top_p || !(top_p > 0.0f)) return COLIBRI_E_BAD_ARG;
    s->temperature = temperature;
    s->top_k = top_k;
    s->top_p = top_p;
    s->rng = splitmix64(seed);
    if (s->rng == 0) s->rng = 0x9E3779B97F4A7C15ull;
    return COLIBRI_OK;
}

static uint32_t argmax(const float *x, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Sort order for candidates: higher probability first, lower id on ties. */
static int ranks_after(const float *p, uint32_t a, uint32_t b) { return p[a] < p[b] || (p[a] == p[b] && a > b); }

static void sift_down(const float *p, uint32_t *idx, uint32_t root, uint32_t n) {
    for (;;) {
        uint32_t child = 2 * root + 1;
        if (child >= n) return;
        if (child + 1 < n && ranks_after(p, idx[child + 1], idx[child])) child++;
        if (!ranks_after(p, idx[child], idx[root])) return;
        uint32_t t = idx[root]; idx[root] = idx[child]; idx[child] = t;
        root = child;
    }
}

/* Heapsort of candidate ids, best first: O(n log n), no recursion, no extra memory. */
static void sort_candidates(const float *p, uint32_t *idx, uint32_t n) {
    for (uint32_t i = n / 2; i-- > 0;) sift_down(p, idx, i, n);
    for (uint32_t end = n; end-- > 1;) {
        uint32_t t = idx[0]; idx[0] = idx[end]; idx[end] = t;
        sift_down(p, idx, 0, end);
    }
}

uint32_t sample_token(colibri_sampler *s, const float *logits, float *probs, uint32_t *index, uint32_t n) {
    if (!(s->temperature > 0.0f)) return argmax(logits, n);
    float max = logits[argmax(logits, n)];
    for (uint32_t i = 0; i < n; i++) {
        probs[i] = colibri_expf((logits[i] - max) / s->temperature);
        index[i] = i;
    }
    uint32_t keep = n;
    if ((s->top_k > 0 && s->top_k < n) || s->top_p < 1.0f) {
        sort_candidates(probs, index, n);
        if (s->top_k > 0 && s->top_k < n) {
            /* and every token whose logit equals the k-th, as transformers' top-k keeps them: they sit in
             * the run of equal probabilities after it (expf can also map nearby logits to one value) */
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
    if (s->top_p < 1.0f) { /* smallest prefix whose mass reaches top_p */
        float cum = 0.0f;
        for (uint32_t i = 0; i < keep; i++) {
            cum += probs[index[i]];
            if (cum >= s->top_p * total) { keep = i + 1; total = cum; break; }
        }
    }
    float r = next_uniform(s) * total, cum = 0.0f;
    for (uint32_t i = 0; i < keep; i++) {
        cum += probs[index[i]];
        if (r < cum) return index[i];
    }
    return index[keep - 1];
}
