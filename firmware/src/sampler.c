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

/* The candidates' order: higher probability first, the lower id on ties (docs/SECURITY.md, "Determinism"). */
static int ranks_before(const float *p, uint32_t a, uint32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); }

/* The subtree of idx[root] in the heap idx[0, n) made a heap again: each id ranks before its children. */
static void sift_down(const float *p, uint32_t *idx, uint32_t root, uint32_t n) {
    for (;;) {
        uint32_t child = 2 * root + 1;
        if (child >= n) return;
        if (child + 1 < n && ranks_before(p, idx[child + 1], idx[child])) child++;
        if (!ranks_before(p, idx[child], idx[root])) return;
        uint32_t t = idx[root]; idx[root] = idx[child]; idx[child] = t;
        root = child;
    }
}

/* The candidates the cuts keep, into the end of index best last: index[n - keep, n); returns keep. The n ids are
 * made a heap (O(n), no recursion, no extra memory) and taken out best first, O(log n) each, each into the place
 * the heap has just left, only as many as the cuts need:
 * - top-k: the k best, then the tokens whose logit equals the k-th's, as transformers' top-k keeps them (they
 *   follow it in the run of equal probabilities: expf can also map nearby logits to one value);
 * - top-p alone: the candidates until one would not change their running sum. No later one could (none is
 *   larger, and rounding is monotone), so that sum is the whole vocabulary's, and the prefix reaching top_p ends
 *   within them. The lean build leaves this stop out (it takes them all, as the sort did): 16 KiB.
 * So the kept candidates are those of a sort of the whole vocabulary, cut where it was cut. */
static uint32_t cut_candidates(const colibri_sampler *s, int cut_k, const float *logits, const float *p,
                               uint32_t *index, uint32_t n) {
    for (uint32_t i = n / 2; i-- > 0;) sift_down(p, index, i, n);
    uint32_t heap = n, keep = 0, kth = 0; /* kth: the k-th, once kept */
    float sum = 0.0f;
    while (heap > 0) {
        const uint32_t best = index[0];
        const float more = sum + p[best];
        if (cut_k ? keep >= s->top_k && p[best] != p[kth] : WITH_TOP_P_STOP && more == sum) break;
        index[0] = index[--heap];
        sift_down(p, index, 0, heap);
        if (!cut_k || keep < s->top_k || logits[best] == logits[kth]) { /* past the k-th: its logit, not only its probability */
            sum = more;
            if (++keep == s->top_k) kth = best;
            index[n - keep] = best;
        }
    }
    return keep;
}

uint32_t sample_token(colibri_sampler *s, const float *logits, float *probs, uint32_t *index, uint32_t n) {
    if (!(s->temperature > 0.0f)) return argmax(logits, n);
    float max = logits[argmax(logits, n)];
    for (uint32_t i = 0; i < n; i++) {
        probs[i] = colibri_expf((logits[i] - max) / s->temperature);
        index[n - 1 - i] = i;
    }
    /* the candidates, best first, are index[n - 1] down to index[end]: without a cut every id, in order */
    const int cut_k = s->top_k > 0 && s->top_k < n;
    uint32_t end = cut_k || s->top_p < 1.0f ? n - cut_candidates(s, cut_k, logits, probs, index, n) : 0;
    float total = 0.0f;
    for (uint32_t i = n; i-- > end;) total += probs[index[i]];
    if (s->top_p < 1.0f) { /* smallest prefix whose mass reaches top_p */
        float cum = 0.0f;
        for (uint32_t i = n; i-- > end;) {
            cum += probs[index[i]];
            if (cum >= s->top_p * total) { end = i; total = cum; break; }
        }
    }
    float r = next_uniform(s) * total, cum = 0.0f;
    for (uint32_t i = n; i-- > end;) {
        cum += probs[index[i]];
        if (r < cum) return index[i];
    }
    return index[end];
}
