/* x86-64 kernels around the exponential, the AVX2 and AVX-512 sets' swiglu and softmax (kernels_x86.c holds the
 * sets): colibri_expf eight lanes at a time by its own operations, so each result has the scalar function's bits
 * (docs/KERNELS.md). */
#include "internal.h"
#include "x86.h"

#if defined(COLIBRI_X86_SIMD)
/* colibri_expf of eight lanes of x in [-87, 88] (where its 2^n needs one step): its operations in its order,
 * each rounded on its own, n by truncation as the C cast. (x86 keeps subnormals in vectors and scalars alike.) */
AVX2 static __m256 expf8(__m256 x) {
    const __m256 fn = _mm256_mul_ps(x, _mm256_set1_ps(1.44269502162933349609f));
    const __m256 half = _mm256_blendv_ps(_mm256_set1_ps(-0.5f), _mm256_set1_ps(0.5f),
                                         _mm256_cmp_ps(fn, _mm256_setzero_ps(), _CMP_GE_OQ));
    const __m256i n = _mm256_cvttps_epi32(_mm256_add_ps(fn, half));
    const __m256 nf = _mm256_cvtepi32_ps(n);
    const __m256 r = _mm256_sub_ps(_mm256_sub_ps(x, _mm256_mul_ps(nf, _mm256_set1_ps(0.693145751953125f))),
                                   _mm256_mul_ps(nf, _mm256_set1_ps(1.42860682030941723212e-06f)));
    __m256 q = _mm256_mul_ps(r, _mm256_set1_ps(1.0f / 5040));
    q = _mm256_mul_ps(r, _mm256_add_ps(q, _mm256_set1_ps(1.0f / 720)));
    q = _mm256_mul_ps(r, _mm256_add_ps(q, _mm256_set1_ps(1.0f / 120)));
    q = _mm256_mul_ps(r, _mm256_add_ps(q, _mm256_set1_ps(1.0f / 24)));
    q = _mm256_mul_ps(r, _mm256_add_ps(q, _mm256_set1_ps(1.0f / 6)));
    q = _mm256_mul_ps(r, _mm256_add_ps(q, _mm256_set1_ps(0.5f)));
    q = _mm256_mul_ps(r, _mm256_add_ps(q, _mm256_set1_ps(1.0f)));
    q = _mm256_add_ps(q, _mm256_set1_ps(1.0f));
    return _mm256_mul_ps(q, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23)));
}

/* swiglu_scalar eight lanes at a time; a group with a gate outside expf8's range (or a NaN) goes to the
 * scalar function. */
AVX2 void swiglu_avx2(float *g, const float *u, uint32_t n) {
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 gate = _mm256_loadu_ps(g + i), x = _mm256_xor_ps(gate, _mm256_set1_ps(-0.0f)); /* -g */
        const __m256 in_range = _mm256_and_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ),
                                              _mm256_cmp_ps(x, _mm256_set1_ps(88.0f), _CMP_LE_OQ));
        if (_mm256_movemask_ps(in_range) != 0xFF) {
            swiglu_scalar(g + i, u + i, 8);
            continue;
        }
        const __m256 d = _mm256_add_ps(_mm256_set1_ps(1.0f), expf8(x));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(gate, d), _mm256_loadu_ps(u + i)));
    }
    swiglu_scalar(g + i, u + i, n - i);
}

#if WITH_KERNEL_SCORES
/* softmax (kernels.c), its bits: the max by vector compares (exact: a NaN anywhere takes the scalar scan, whose
 * answer then depends on where it stands; which zero wins is moot, as x - max and sink - max come out the same),
 * eight exponentials at a time by expf8 (a group with an argument outside its range goes to colibri_expf), each
 * added to the sum in turn, then eight divisions at a time. */
AVX2 void softmax_avx2(float *x, uint32_t n, const float *sink) {
    if (!WITH_SINKS) sink = 0;
    uint32_t i = 0;
    __m256 vmax = _mm256_set1_ps(x[0]), nan = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        vmax = _mm256_max_ps(vmax, v);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    float lanes[8], max = x[0];
    _mm256_storeu_ps(lanes, vmax);
    if (_mm256_movemask_ps(nan)) i = 1; /* the scalar scan from the start */
    else
        for (int l = 0; l < 8; l++)
            if (lanes[l] > max) max = lanes[l];
    for (; i < n; i++)
        if (x[i] > max) max = x[i];
    if (sink && *sink > max) max = *sink;
    float sum = 0.0f;
    const __m256 m = _mm256_set1_ps(max);
    for (i = 0; i + 8 <= n; i += 8) {
        const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i), m);
        const __m256 in_range = _mm256_and_ps(_mm256_cmp_ps(d, _mm256_set1_ps(-87.0f), _CMP_GE_OQ),
                                              _mm256_cmp_ps(d, _mm256_set1_ps(88.0f), _CMP_LE_OQ));
        if (_mm256_movemask_ps(in_range) == 0xFF) _mm256_storeu_ps(x + i, expf8(d));
        else
            for (int l = 0; l < 8; l++) x[i + l] = colibri_expf(x[i + l] - max);
        for (int l = 0; l < 8; l++) sum += x[i + l];
    }
    for (; i < n; i++) {
        x[i] = colibri_expf(x[i] - max);
        sum += x[i];
    }
    if (sink) sum += colibri_expf(*sink - max);
    const __m256 s = _mm256_set1_ps(sum);
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_div_ps(_mm256_loadu_ps(x + i), s));
    for (; i < n; i++) x[i] /= sum;
}
#endif
#endif
