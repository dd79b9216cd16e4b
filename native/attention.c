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

/* q·k_u for four keys at once: nv = d / 8 lanes of eight (a constant after inlining, so q
 * stays in registers for d = 64 and 128), four accumulators reduced together (vhaddps). */
__attribute__((always_inline)) AVX2_FMA_FN static inline void
scores_avx2(float *att, const float *q, const float *K, size_t stride, int n_keys, float scale,
            const int nv) {
    __m256 qv[32];
    for (int i = 0; i < nv; i++) qv[i] = _mm256_loadu_ps(q + 8 * i);
    const __m128 sc = _mm_set1_ps(scale);
    int u = 0;
    for (; u + 4 <= n_keys; u += 4) {
        const float *k = K + (size_t)u * stride;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int i = 0; i < nv; i++) {
            a0 = _mm256_fmadd_ps(qv[i], _mm256_loadu_ps(k + 8 * i), a0);
            a1 = _mm256_fmadd_ps(qv[i], _mm256_loadu_ps(k + stride + 8 * i), a1);
            a2 = _mm256_fmadd_ps(qv[i], _mm256_loadu_ps(k + 2 * stride + 8 * i), a2);
            a3 = _mm256_fmadd_ps(qv[i], _mm256_loadu_ps(k + 3 * stride + 8 * i), a3);
        }
        __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        _mm_storeu_ps(att + u, _mm_mul_ps(s, sc));
    }
    for (; u < n_keys; u++) {
        const float *k = K + (size_t)u * stride;
        __m256 a = _mm256_setzero_ps();
        for (int i = 0; i < nv; i++) a = _mm256_fmadd_ps(qv[i], _mm256_loadu_ps(k + 8 * i), a);
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        s = _mm_add_ss(s, _mm_movehdup_ps(s));
        att[u] = _mm_cvtss_f32(s) * scale;
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

/* out = sum over u of w[u] * v_u, 64 outputs at a time in eight named registers (then any
 * 8-wide rest one register at a time). */
AVX2_FMA_FN static void weighted_sum_avx2(float *out, const float *V, size_t stride, int n_keys,
                                          const float *w, int d) {
    int i = 0;
    for (; i + 64 <= d; i += 64) {
        __m256 o0 = _mm256_setzero_ps(), o1 = o0, o2 = o0, o3 = o0, o4 = o0, o5 = o0, o6 = o0,
               o7 = o0;
        for (int u = 0; u < n_keys; u++) {
            const float *v = V + (size_t)u * stride + i;
            __m256 a = _mm256_broadcast_ss(w + u);
            o0 = _mm256_fmadd_ps(a, _mm256_loadu_ps(v), o0);
            o1 = _mm256_fmadd_ps(a, _mm256_loadu_ps(v + 8), o1);
            o2 = _mm256_fmadd_ps(a, _mm256_loadu_ps(v + 16), o2);
            o3 = _mm256_fmadd_ps(a, _mm256_loadu_ps(v + 24), o3);
            o4 = _mm256_fmadd_ps(a, _mm256_loadu_ps(v + 32), o4);
            o5 = _mm256_fmadd_ps(a, _mm256_loadu_ps(v + 40), o5);
            o6 = _mm256_fmadd_ps(a, _mm256_loadu_ps(v + 48), o6);
            o7 = _mm256_fmadd_ps(a, _mm256_loadu_ps(v + 56), o7);
        }
        _mm256_storeu_ps(out + i, o0);
        _mm256_storeu_ps(out + i + 8, o1);
        _mm256_storeu_ps(out + i + 16, o2);
        _mm256_storeu_ps(out + i + 24, o3);
        _mm256_storeu_ps(out + i + 32, o4);
        _mm256_storeu_ps(out + i + 40, o5);
        _mm256_storeu_ps(out + i + 48, o6);
        _mm256_storeu_ps(out + i + 56, o7);
    }
    for (; i < d; i += 8) {
        __m256 o = _mm256_setzero_ps();
        for (int u = 0; u < n_keys; u++)
            o = _mm256_fmadd_ps(_mm256_broadcast_ss(w + u),
                                _mm256_loadu_ps(V + (size_t)u * stride + i), o);
        _mm256_storeu_ps(out + i, o);
    }
}

__attribute__((always_inline)) AVX2_FMA_FN static inline void
attend_avx2_nv(float *out, const float *q, const float *K, const float *V, size_t stride,
               int n_keys, float scale, float *att, const int nv) {
    scores_avx2(att, q, K, stride, n_keys, scale, nv);
    softmax_avx2(att, n_keys);
    weighted_sum_avx2(out, V, stride, n_keys, att, 8 * nv);
}

AVX2_FMA_FN static void attend_avx2(float *out, const float *q, const float *K, const float *V,
                                    size_t stride, int n_keys, int d, float scale, float *att) {
    switch (d / 8) { /* the common head sizes get their own unrolled copy */
    case 8: attend_avx2_nv(out, q, K, V, stride, n_keys, scale, att, 8); break;
    case 16: attend_avx2_nv(out, q, K, V, stride, n_keys, scale, att, 16); break;
    default: attend_avx2_nv(out, q, K, V, stride, n_keys, scale, att, d / 8); break;
    }
}

#endif

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
