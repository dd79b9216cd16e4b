/* attention.c: causal attention of one query head (attention.h). */
#include "attention.h"

#include <math.h>

void attend_scalar(float *out, const float *q, const float *K, const float *V, size_t stride,
                   int n_keys, int d, float scale, float *att) {
    float max = -INFINITY;
    for (int u = 0; u < n_keys; u++) {
        const float *k = K + (size_t)u * stride;
        float score = 0.0f;
        for (int i = 0; i < d; i++) score += q[i] * k[i];
        att[u] = score * scale;
        if (att[u] > max) max = att[u];
    }
    float sum = 0.0f;
    for (int u = 0; u < n_keys; u++) {
        att[u] = expf(att[u] - max);
        sum += att[u];
    }
    for (int i = 0; i < d; i++) out[i] = 0.0f;
    for (int u = 0; u < n_keys; u++) {
        const float *v = V + (size_t)u * stride;
        float a = att[u] / sum;
        for (int i = 0; i < d; i++) out[i] += a * v[i];
    }
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define AVX2_FMA_FN __attribute__((target("avx2,fma")))

/* att[j * ld + u] = scale * q_j · k_u for queries j < nq (q_j = q + j * qs; nq a constant,
 * 1..3) and keys u < n_keys: four keys at a time, each key loaded once for the nq queries; per
 * query and key one 8-lane FMA chain over the d = 8 * nv elements, reduced by the same vhaddps
 * tree whatever the grouping (a last group of fewer than four keys repeats key u in the unused
 * slots and stores only its own), so a query's scores do not depend on nq or n_keys % 4. */
__attribute__((always_inline)) AVX2_FMA_FN static inline void
scores_avx2(float *att, size_t ld, const float *q, size_t qs, const float *K, size_t stride,
            int n_keys, float scale, const int nv, const int nq) {
    const __m128 sc = _mm_set1_ps(scale);
    for (int u = 0; u < n_keys; u += 4) {
        const int nk = n_keys - u < 4 ? n_keys - u : 4;
        const float *k0 = K + (size_t)u * stride;
        const float *k1 = nk > 1 ? k0 + stride : k0, *k2 = nk > 2 ? k0 + 2 * stride : k0;
        const float *k3 = nk > 3 ? k0 + 3 * stride : k0;
        __m256 a[3][4];
        for (int j = 0; j < nq; j++)
            for (int c = 0; c < 4; c++) a[j][c] = _mm256_setzero_ps();
        for (int i = 0; i < nv; i++) { /* 12 accumulators, 3 queries, 1 key: 16 registers */
            __m256 qv[3];
            for (int j = 0; j < nq; j++) qv[j] = _mm256_loadu_ps(q + (size_t)j * qs + 8 * i);
            const float *kc[4] = {k0, k1, k2, k3};
            for (int c = 0; c < 4; c++) {
                __m256 v = _mm256_loadu_ps(kc[c] + 8 * i);
                for (int j = 0; j < nq; j++) a[j][c] = _mm256_fmadd_ps(qv[j], v, a[j][c]);
            }
        }
        for (int j = 0; j < nq; j++) {
            __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a[j][0], a[j][1]),
                                      _mm256_hadd_ps(a[j][2], a[j][3]));
            __m128 r = _mm_mul_ps(
                _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)), sc);
            float *dst = att + (size_t)j * ld + u;
            if (nk == 4) {
                _mm_storeu_ps(dst, r);
            } else {
                float t[4];
                _mm_storeu_ps(t, r);
                for (int c = 0; c < nk; c++) dst[c] = t[c];
            }
        }
    }
}

/* e^x for eight floats (Cephes expf: x = n ln 2 + r, |r| <= ln 2 / 2, a degree-5 polynomial
 * for (e^r - 1 - r) / r^2, then 2^n from the exponent bits): within 2 ulp of expf for x in
 * [-87.3, 88]; 0 below (where expf is subnormal or 0), NaN for NaN. */
AVX2_FMA_FN static inline __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33654f), hi = _mm256_set1_ps(88.0f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(hi, x); /* x second: a NaN x is returned as it is */
    x = _mm256_max_ps(lo, x);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
                                  23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

/* att[u] = exp(att[u] - max) / sum over u of the same, in place (max skips NaN scores as the
 * scalar loop does; a NaN score gives NaN weights). The last n_keys % 8 scores go through a
 * copy padded with -inf, whose exp is 0. */
AVX2_FMA_FN static void softmax_avx2(float *att, int n_keys) {
    const int n8 = n_keys & ~7;
    float tail[8];
    for (int i = 0; i < 8; i++) tail[i] = n8 + i < n_keys ? att[n8 + i] : -INFINITY;
    __m256 m = _mm256_set1_ps(-INFINITY);
    for (int u = 0; u < n8; u += 8) m = _mm256_max_ps(_mm256_loadu_ps(att + u), m);
    m = _mm256_max_ps(_mm256_loadu_ps(tail), m);
    m = _mm256_max_ps(m, _mm256_permute2f128_ps(m, m, 1));
    m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0x4e));
    m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0xb1));
    __m256 sum = _mm256_setzero_ps();
    for (int u = 0; u < n8; u += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(att + u), m));
        _mm256_storeu_ps(att + u, e);
        sum = _mm256_add_ps(sum, e);
    }
    __m256 et = exp8(_mm256_sub_ps(_mm256_loadu_ps(tail), m));
    sum = _mm256_add_ps(sum, et);
    sum = _mm256_add_ps(sum, _mm256_permute2f128_ps(sum, sum, 1));
    sum = _mm256_add_ps(sum, _mm256_shuffle_ps(sum, sum, 0x4e));
    sum = _mm256_add_ps(sum, _mm256_shuffle_ps(sum, sum, 0xb1));
    for (int u = 0; u < n8; u += 8)
        _mm256_storeu_ps(att + u, _mm256_div_ps(_mm256_loadu_ps(att + u), sum));
    _mm256_storeu_ps(tail, _mm256_div_ps(et, sum));
    for (int u = n8; u < n_keys; u++) att[u] = tail[u - n8];
}

/* out_j = sum over u of w_j[u] * v_u (out_j = out + j * qs, w_j = w + j * ld) for queries
 * j < nq (a constant, 1..3): 32 outputs at a time (12 accumulators for three queries, each
 * value row loaded once for them), then any 8-wide rest; per output one FMA chain in key
 * order, whatever nq. */
__attribute__((always_inline)) AVX2_FMA_FN static inline void
weighted_sum_avx2(float *out, size_t qs, const float *V, size_t stride, int n_keys,
                  const float *w, size_t ld, int d, const int nq) {
    int i = 0;
    for (; i + 32 <= d; i += 32) {
        __m256 o[3][4];
        for (int j = 0; j < nq; j++)
            for (int c = 0; c < 4; c++) o[j][c] = _mm256_setzero_ps();
        for (int u = 0; u < n_keys; u++) { /* 12 accumulators, 3 weights, 1 value vector */
            const float *v = V + (size_t)u * stride + i;
            __m256 a[3];
            for (int j = 0; j < nq; j++) a[j] = _mm256_broadcast_ss(w + (size_t)j * ld + u);
            for (int c = 0; c < 4; c++) {
                __m256 vc = _mm256_loadu_ps(v + 8 * c);
                for (int j = 0; j < nq; j++) o[j][c] = _mm256_fmadd_ps(a[j], vc, o[j][c]);
            }
        }
        for (int j = 0; j < nq; j++)
            for (int c = 0; c < 4; c++) _mm256_storeu_ps(out + (size_t)j * qs + i + 8 * c, o[j][c]);
    }
    for (; i < d; i += 8) {
        for (int j = 0; j < nq; j++) {
            __m256 o = _mm256_setzero_ps();
            for (int u = 0; u < n_keys; u++)
                o = _mm256_fmadd_ps(_mm256_broadcast_ss(w + (size_t)j * ld + u),
                                    _mm256_loadu_ps(V + (size_t)u * stride + i), o);
            _mm256_storeu_ps(out + (size_t)j * qs + i, o);
        }
    }
}

/* nq (a constant, 1..3) queries against the same keys and values */
__attribute__((always_inline)) AVX2_FMA_FN static inline void
attend_avx2_nq(float *out, const float *q, size_t qs, const float *K, const float *V,
               size_t stride, int n_keys, int d, float scale, float *att, size_t ld,
               const int nv, const int nq) {
    scores_avx2(att, ld, q, qs, K, stride, n_keys, scale, nv, nq);
    for (int j = 0; j < nq; j++) softmax_avx2(att + (size_t)j * ld, n_keys);
    weighted_sum_avx2(out, qs, V, stride, n_keys, att, ld, d, nq);
}

__attribute__((always_inline)) AVX2_FMA_FN static inline void
attend_group_nv(float *out, const float *q, size_t qs, int nq, const float *K, const float *V,
                size_t stride, int n_keys, int d, float scale, float *att, size_t ld,
                const int nv) {
    int j = 0;
    for (; j + 3 <= nq; j += 3)
        attend_avx2_nq(out + (size_t)j * qs, q + (size_t)j * qs, qs, K, V, stride, n_keys, d,
                       scale, att + (size_t)j * ld, ld, nv, 3);
    if (nq - j == 2)
        attend_avx2_nq(out + (size_t)j * qs, q + (size_t)j * qs, qs, K, V, stride, n_keys, d,
                       scale, att + (size_t)j * ld, ld, nv, 2);
    else if (nq - j == 1)
        attend_avx2_nq(out + (size_t)j * qs, q + (size_t)j * qs, qs, K, V, stride, n_keys, d,
                       scale, att + (size_t)j * ld, ld, nv, 1);
}

AVX2_FMA_FN static void attend_group_avx2(float *out, const float *q, size_t qs, int nq,
                                          const float *K, const float *V, size_t stride,
                                          int n_keys, int d, float scale, float *att,
                                          size_t ld) {
    switch (d / 8) { /* the common head sizes get their own unrolled copy */
    case 8: attend_group_nv(out, q, qs, nq, K, V, stride, n_keys, d, scale, att, ld, 8); break;
    case 16: attend_group_nv(out, q, qs, nq, K, V, stride, n_keys, d, scale, att, ld, 16); break;
    default: attend_group_nv(out, q, qs, nq, K, V, stride, n_keys, d, scale, att, ld, d / 8); break;
    }
}

AVX2_FMA_FN static void attend_avx2(float *out, const float *q, const float *K, const float *V,
                                    size_t stride, int n_keys, int d, float scale, float *att) {
    attend_group_avx2(out, q, (size_t)d, 1, K, V, stride, n_keys, d, scale, att,
                      (size_t)n_keys);
}

#endif

void attend_group_scalar(float *out, const float *q, size_t qs, int nq, const float *K,
                         const float *V, size_t stride, int n_keys, int d, float scale,
                         float *att, size_t ld) {
    for (int j = 0; j < nq; j++)
        attend_scalar(out + (size_t)j * qs, q + (size_t)j * qs, K, V, stride, n_keys, d, scale,
                      att + (size_t)j * ld);
}

AttendGroupFn attend_group_for(int d) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (d % 8 == 0 && d <= 256 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return attend_group_avx2;
#else
    (void)d;
#endif
    return attend_group_scalar;
}

AttendFn attend_for(int d) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (d % 8 == 0 && d <= 256 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return attend_avx2;
#else
    (void)d;
#endif
    return attend_scalar;
}
