/* attention.c: causal attention of one query head (attention.h). */
#include "attention.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* The scalar form's three steps (AttendSteps; defined below): attend_scalar runs the same
 * functions as a prefill going through the keys block by block, not copies of their loops:
 * under Ditto's reassociating fast-math policy two copies of a loop may be vectorized (and
 * their sums ordered) differently, and decode and prefill would no longer agree bit for bit. */
static void scores_scalar(float *att, size_t ld, const float *q, size_t qs, int nq,
                          const float *K, size_t stride, int n_keys, int d, float scale);
static void softmax_scalar(float *att, int n_keys);
static void wsum_acc_scalar(float *out, size_t qs, int nq, const float *V, size_t stride,
                            int n_keys, const float *w, size_t ld, int d);

void attend_scalar(float *out, const float *q, const float *K, const float *V, size_t stride,
                   int n_keys, int d, float scale, float *att) {
    scores_scalar(att, (size_t)n_keys, q, (size_t)d, 1, K, stride, n_keys, d, scale);
    softmax_scalar(att, n_keys);
    for (int i = 0; i < d; i++) out[i] = 0.0f;
    wsum_acc_scalar(out, (size_t)d, 1, V, stride, n_keys, att, (size_t)n_keys, d);
}

#if defined(__x86_64__) || defined(__i386__)
#include "simd_exp.h"

#define AVX2_FMA_FN __attribute__((target("avx2,fma")))
/* the score and weighted-sum steps also widen f16 rows (F16C) */
#define ATT_FN __attribute__((target("avx2,fma,f16c")))

/* Eight elements of a KV row as float32: a float32 cache as it is, an f16 one widened (exact). */
#define LOAD8_F32(p) _mm256_loadu_ps(p)
#define LOAD8_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p)))

/* The four key scores of one query from its four 8-lane accumulators: one vhaddps tree for
 * every key (so a score does not depend on which keys share the group), times scale; the
 * first nk stored at dst. */
AVX2_FMA_FN static inline void store_scores(float *dst, __m256 a0, __m256 a1, __m256 a2,
                                            __m256 a3, __m128 sc, int nk) {
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    __m128 r = _mm_mul_ps(_mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)), sc);
    if (nk == 4) {
        _mm_storeu_ps(dst, r);
    } else {
        float t[4];
        _mm_storeu_ps(t, r);
        for (int c = 0; c < nk; c++) dst[c] = t[c];
    }
}

/* att[j * ld + u] = scale * q_j · k_u for the queries j < NQ (q_j = q + j * qs; NQ = 1 or 3)
 * and keys u < n_keys, four keys at a time, each key vector loaded once for the NQ queries:
 * per query and key one 8-lane FMA chain over the d = 8 * nv elements, so a query's scores are
 * the same whatever NQ (a last group of fewer than four keys repeats key u in the unused
 * slots and stores only its own). Named registers (3 queries x 4 keys = 12 accumulators, 3
 * query vectors, 1 key vector), not arrays: the IR pipeline of `ditto build` keeps arrays of
 * vectors on the stack. */
/* a<j><c> += m<j> * v for the queries j < nqc (1 or 3): one vector v of a key (scores) or of
 * a value row (weighted sum) used by every query of the group. */
#define FMA_NQ(a, c, m0, m1, m2, v)                                                           \
    {                                                                                         \
        a##0##c = _mm256_fmadd_ps(m0, v, a##0##c);                                            \
        if (nqc == 3) {                                                                       \
            a##1##c = _mm256_fmadd_ps(m1, v, a##1##c);                                        \
            a##2##c = _mm256_fmadd_ps(m2, v, a##2##c);                                        \
        }                                                                                     \
    }
#define SCORE_KEY(c, kp) FMA_NQ(a, c, q0, q1, q2, LOAD(kp + 8 * i))
#define DEFINE_SCORES(NAME, NQ, T)                                                            \
    ATT_FN static inline void NAME(float *att, size_t ld, const float *q, size_t qs,          \
                                   const T *K, size_t stride, int n_keys, float scale,        \
                                   int nv) {                                                  \
        const __m128 sc = _mm_set1_ps(scale);                                                 \
        const int nqc = NQ;                                                                   \
        (void)qs;                                                                             \
        (void)ld;                                                                             \
        for (int u = 0; u < n_keys; u += 4) {                                                 \
            const int nk = n_keys - u < 4 ? n_keys - u : 4;                                   \
            const T *k0 = K + (size_t)u * stride;                                             \
            const T *k1 = nk > 1 ? k0 + stride : k0, *k2 = nk > 2 ? k0 + 2 * stride : k0;     \
            const T *k3 = nk > 3 ? k0 + 3 * stride : k0;                                      \
            __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;                \
            __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;                                \
            __m256 a20 = a00, a21 = a00, a22 = a00, a23 = a00;                                \
            for (int i = 0; i < nv; i++) {                                                    \
                __m256 q0 = _mm256_loadu_ps(q + 8 * i), q1 = q0, q2 = q0;                     \
                if (NQ == 3) {                                                                \
                    q1 = _mm256_loadu_ps(q + qs + 8 * i);                                     \
                    q2 = _mm256_loadu_ps(q + 2 * qs + 8 * i);                                 \
                }                                                                             \
                SCORE_KEY(0, k0)                                                              \
                SCORE_KEY(1, k1)                                                              \
                SCORE_KEY(2, k2)                                                              \
                SCORE_KEY(3, k3)                                                              \
            }                                                                                 \
            store_scores(att + u, a00, a01, a02, a03, sc, nk);                                \
            if (NQ == 3) {                                                                    \
                store_scores(att + ld + u, a10, a11, a12, a13, sc, nk);                       \
                store_scores(att + 2 * ld + u, a20, a21, a22, a23, sc, nk);                   \
            }                                                                                 \
        }                                                                                     \
    }

/* att[u] = exp(att[u] - max) / sum over u of the same, in place (max skips NaN scores as the
 * scalar loop does; a NaN score gives NaN weights). The last n_keys % 8 scores go through a
 * copy padded with -inf, whose exp is 0. */
__attribute__((noinline)) AVX2_FMA_FN static void softmax_avx2(float *att, int n_keys) {
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

/* out_j += sum over u of w_j[u] * v_u (out_j = out + j * qs, w_j = w + j * ld) for the
 * queries j < NQ (1 or 3): 32 outputs at a time (12 accumulators for three queries, each
 * value vector loaded once for them), then any 8-wide rest; per output one FMA chain in key
 * order, whatever NQ, continued from the value out_j holds (a caller going through the keys
 * block by block, from out_j = 0, gets the bits of one pass). Named registers, as in the
 * scores. */
#define WSUM_VEC(c) FMA_NQ(o, c, w0, w1, w2, LOAD(v + 8 * c))
#define DEFINE_WSUM(NAME, NQ, T)                                                              \
    ATT_FN static inline void NAME(float *out, size_t qs, const T *V, size_t stride,          \
                                   int n_keys, const float *w, size_t ld, int d) {            \
        const int nqc = NQ;                                                                   \
        (void)qs;                                                                             \
        (void)ld;                                                                             \
        int i = 0;                                                                            \
        for (; i + 32 <= d; i += 32) {                                                        \
            __m256 o00 = _mm256_loadu_ps(out + i), o01 = _mm256_loadu_ps(out + i + 8);       \
            __m256 o02 = _mm256_loadu_ps(out + i + 16), o03 = _mm256_loadu_ps(out + i + 24); \
            __m256 o10 = o00, o11 = o01, o12 = o02, o13 = o03;                                \
            __m256 o20 = o00, o21 = o01, o22 = o02, o23 = o03;                                \
            if (NQ == 3) {                                                                    \
                o10 = _mm256_loadu_ps(out + qs + i), o11 = _mm256_loadu_ps(out + qs + i + 8); \
                o12 = _mm256_loadu_ps(out + qs + i + 16);                                     \
                o13 = _mm256_loadu_ps(out + qs + i + 24);                                     \
                o20 = _mm256_loadu_ps(out + 2 * qs + i);                                      \
                o21 = _mm256_loadu_ps(out + 2 * qs + i + 8);                                  \
                o22 = _mm256_loadu_ps(out + 2 * qs + i + 16);                                 \
                o23 = _mm256_loadu_ps(out + 2 * qs + i + 24);                                 \
            }                                                                                 \
            for (int u = 0; u < n_keys; u++) {                                                \
                const T *v = V + (size_t)u * stride + i;                                      \
                __m256 w0 = _mm256_broadcast_ss(w + u), w1 = w0, w2 = w0;                     \
                if (NQ == 3) {                                                                \
                    w1 = _mm256_broadcast_ss(w + ld + u);                                     \
                    w2 = _mm256_broadcast_ss(w + 2 * ld + u);                                 \
                }                                                                             \
                WSUM_VEC(0)                                                                   \
                WSUM_VEC(1)                                                                   \
                WSUM_VEC(2)                                                                   \
                WSUM_VEC(3)                                                                   \
            }                                                                                 \
            _mm256_storeu_ps(out + i, o00);                                                   \
            _mm256_storeu_ps(out + i + 8, o01);                                               \
            _mm256_storeu_ps(out + i + 16, o02);                                              \
            _mm256_storeu_ps(out + i + 24, o03);                                              \
            if (NQ == 3) {                                                                    \
                _mm256_storeu_ps(out + qs + i, o10);                                          \
                _mm256_storeu_ps(out + qs + i + 8, o11);                                      \
                _mm256_storeu_ps(out + qs + i + 16, o12);                                     \
                _mm256_storeu_ps(out + qs + i + 24, o13);                                     \
                _mm256_storeu_ps(out + 2 * qs + i, o20);                                      \
                _mm256_storeu_ps(out + 2 * qs + i + 8, o21);                                  \
                _mm256_storeu_ps(out + 2 * qs + i + 16, o22);                                 \
                _mm256_storeu_ps(out + 2 * qs + i + 24, o23);                                 \
            }                                                                                 \
        }                                                                                     \
        for (; i < d; i += 8) {                                                               \
            for (int j = 0; j < NQ; j++) {                                                    \
                __m256 o = _mm256_loadu_ps(out + (size_t)j * qs + i);                         \
                for (int u = 0; u < n_keys; u++)                                              \
                    o = _mm256_fmadd_ps(_mm256_broadcast_ss(w + (size_t)j * ld + u),          \
                                        LOAD(V + (size_t)u * stride + i), o);                 \
                _mm256_storeu_ps(out + (size_t)j * qs + i, o);                                \
            }                                                                                 \
        }                                                                                     \
    }
/* The scores and weighted sums for one and three queries, over float32 and over f16 KV rows
 * (LOAD: how eight elements of a row are read). */
#define DEFINE_ATTEND_STEPS(T, SFX)                                                           \
    DEFINE_SCORES(scores1##SFX, 1, T)                                                         \
    DEFINE_SCORES(scores3##SFX, 3, T)                                                         \
    DEFINE_WSUM(wsum1##SFX, 1, T)                                                             \
    DEFINE_WSUM(wsum3##SFX, 3, T)
#define LOAD LOAD8_F32
DEFINE_ATTEND_STEPS(float, )
#undef LOAD
#define LOAD LOAD8_F16
DEFINE_ATTEND_STEPS(uint16_t, _f16)
#undef LOAD
#undef DEFINE_ATTEND_STEPS
#undef DEFINE_SCORES
#undef SCORE_KEY
#undef DEFINE_WSUM
#undef WSUM_VEC
#undef FMA_NQ

#define DEFINE_STEPS(SCORES, WSUM, T, SFX)                                                    \
    __attribute__((noinline)) ATT_FN static void SCORES(                                      \
        float *att, size_t ld, const float *q, size_t qs, int nq, const T *K, size_t stride,  \
        int n_keys, int d, float scale) {                                                     \
        int j = 0;                                                                            \
        for (; j + 3 <= nq; j += 3)                                                           \
            scores3##SFX(att + (size_t)j * ld, ld, q + (size_t)j * qs, qs, K, stride, n_keys, \
                         scale, d / 8);                                                       \
        for (; j < nq; j++)                                                                   \
            scores1##SFX(att + (size_t)j * ld, ld, q + (size_t)j * qs, qs, K, stride, n_keys, \
                         scale, d / 8);                                                       \
    }                                                                                         \
    __attribute__((noinline)) ATT_FN static void WSUM(                                        \
        float *out, size_t qs, int nq, const T *V, size_t stride, int n_keys, const float *w, \
        size_t ld, int d) {                                                                   \
        int j = 0;                                                                            \
        for (; j + 3 <= nq; j += 3)                                                           \
            wsum3##SFX(out + (size_t)j * qs, qs, V, stride, n_keys, w + (size_t)j * ld, ld,   \
                       d);                                                                    \
        for (; j < nq; j++)                                                                   \
            wsum1##SFX(out + (size_t)j * qs, qs, V, stride, n_keys, w + (size_t)j * ld, ld,   \
                       d);                                                                    \
    }

/* The AttendSteps of the AVX2 form over float32 and over f16 KV rows: query heads three at a
 * time, then one at a time. Not inlined, so that decode (attend_group_avx2,
 * attend_group_steps) and prefill run the same code (see the scalar form's steps). The f16
 * rows are widened to float32 as they are loaded, so the sums are those of the float32 form
 * on the widened values. */
DEFINE_STEPS(scores_avx2, wsum_acc_avx2, float, )
DEFINE_STEPS(scores_avx2_f16, wsum_acc_avx2_f16, uint16_t, _f16)
#undef DEFINE_STEPS

static const AttendSteps STEPS_AVX2 = {scores_avx2, softmax_avx2, wsum_acc_avx2,
                                       scores_avx2_f16, wsum_acc_avx2_f16};

/* Query heads j < nq against the same keys and values, in one pass over the keys. */
static void attend_group_avx2(float *out, const float *q, size_t qs, int nq, const float *K,
                              const float *V, size_t stride, int n_keys, int d, float scale,
                              float *att, size_t ld) {
    attend_group_steps(&STEPS_AVX2, out, q, qs, nq, K, 0, V, 0, stride, n_keys, d, scale, att,
                       ld);
}

static void attend_avx2(float *out, const float *q, const float *K, const float *V,
                        size_t stride, int n_keys, int d, float scale, float *att) {
    attend_group_avx2(out, q, (size_t)d, 1, K, V, stride, n_keys, d, scale, att,
                      (size_t)n_keys);
}

#endif

/* The AttendSteps of the scalar form: attend_scalar's arithmetic in three parts (the softmax
 * divides by the sum where attend_scalar's weighted sum does: the same quotients). The score
 * and weighted-sum loops are written once for float32 rows and for f16 rows, whose elements
 * are widened to float32 (ELEM) before the same arithmetic. */
#define ELEM_F32(x) (x)
#define ELEM_F16(x) widen(x)

static inline float widen(uint16_t h) {
    _Float16 v;
    memcpy(&v, &h, sizeof v);
    return (float)v;
}

#define DEFINE_SCALAR_STEPS(SCORES, WSUM, T, ELEM)                                             \
    __attribute__((noinline)) static void SCORES(float *att, size_t ld, const float *q,        \
                                                 size_t qs, int nq, const T *K, size_t stride, \
                                                 int n_keys, int d, float scale) {             \
        for (int j = 0; j < nq; j++)                                                           \
            for (int u = 0; u < n_keys; u++) {                                                 \
                const T *k = K + (size_t)u * stride;                                           \
                const float *qj = q + (size_t)j * qs;                                          \
                float score = 0.0f;                                                            \
                for (int i = 0; i < d; i++) score += qj[i] * ELEM(k[i]);                       \
                att[(size_t)j * ld + u] = score * scale;                                       \
            }                                                                                  \
    }                                                                                          \
    __attribute__((noinline)) static void WSUM(float *out, size_t qs, int nq, const T *V,      \
                                               size_t stride, int n_keys, const float *w,      \
                                               size_t ld, int d) {                             \
        for (int j = 0; j < nq; j++)                                                           \
            for (int u = 0; u < n_keys; u++) {                                                 \
                const T *v = V + (size_t)u * stride;                                           \
                float a = w[(size_t)j * ld + u];                                               \
                for (int i = 0; i < d; i++) out[(size_t)j * qs + i] += a * ELEM(v[i]);         \
            }                                                                                  \
    }
DEFINE_SCALAR_STEPS(scores_scalar, wsum_acc_scalar, float, ELEM_F32)
DEFINE_SCALAR_STEPS(scores_scalar_f16, wsum_acc_scalar_f16, uint16_t, ELEM_F16)
#undef DEFINE_SCALAR_STEPS
#undef ELEM_F32
#undef ELEM_F16

__attribute__((noinline)) static void softmax_scalar(float *att, int n_keys) {
    float max = -INFINITY;
    for (int u = 0; u < n_keys; u++)
        if (att[u] > max) max = att[u];
    float sum = 0.0f;
    for (int u = 0; u < n_keys; u++) {
        att[u] = expf(att[u] - max);
        sum += att[u];
    }
    for (int u = 0; u < n_keys; u++) att[u] = att[u] / sum;
}

static const AttendSteps STEPS_SCALAR = {scores_scalar, softmax_scalar, wsum_acc_scalar,
                                         scores_scalar_f16, wsum_acc_scalar_f16};

void attend_scores(const AttendSteps *A, int k_f16, float *att, size_t ld, const float *q,
                   size_t qs, int nq, const void *K, size_t stride, int n_keys, int d,
                   float scale) {
    if (k_f16)
        A->scores_f16(att, ld, q, qs, nq, K, stride, n_keys, d, scale);
    else
        A->scores(att, ld, q, qs, nq, K, stride, n_keys, d, scale);
}

void attend_wsum_acc(const AttendSteps *A, int v_f16, float *out, size_t qs, int nq,
                     const void *V, size_t stride, int n_keys, const float *w, size_t ld,
                     int d) {
    if (v_f16)
        A->wsum_acc_f16(out, qs, nq, V, stride, n_keys, w, ld, d);
    else
        A->wsum_acc(out, qs, nq, V, stride, n_keys, w, ld, d);
}

void attend_group_steps(const AttendSteps *A, float *out, const float *q, size_t qs, int nq,
                        const void *K, int k_f16, const void *V, int v_f16, size_t stride,
                        int n_keys, int d, float scale, float *att, size_t ld) {
    attend_scores(A, k_f16, att, ld, q, qs, nq, K, stride, n_keys, d, scale);
    for (int j = 0; j < nq; j++) {
        A->softmax(att + (size_t)j * ld, n_keys);
        memset(out + (size_t)j * qs, 0, (size_t)d * sizeof(float));
    }
    attend_wsum_acc(A, v_f16, out, qs, nq, V, stride, n_keys, att, ld, d);
}

void attend_group_scalar(float *out, const float *q, size_t qs, int nq, const float *K,
                         const float *V, size_t stride, int n_keys, int d, float scale,
                         float *att, size_t ld) {
    for (int j = 0; j < nq; j++)
        attend_scalar(out + (size_t)j * qs, q + (size_t)j * qs, K, V, stride, n_keys, d, scale,
                      att + (size_t)j * ld);
}

#if defined(__x86_64__) || defined(__i386__)
/* Whether the AVX2 form runs for head size d on this CPU. */
static int simd_for(int d) {
    __builtin_cpu_init();
    return d % 8 == 0 && d <= 256 && __builtin_cpu_supports("avx2") &&
           __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}
#endif

AttendGroupFn attend_group_for(int d) {
#if defined(__x86_64__) || defined(__i386__)
    if (simd_for(d)) return attend_group_avx2;
#else
    (void)d;
#endif
    return attend_group_scalar;
}

const AttendSteps *attend_steps_for(int d) {
#if defined(__x86_64__) || defined(__i386__)
    if (simd_for(d)) return &STEPS_AVX2;
#else
    (void)d;
#endif
    return &STEPS_SCALAR;
}

AttendFn attend_for(int d) {
#if defined(__x86_64__) || defined(__i386__)
    if (simd_for(d)) return attend_avx2;
#else
    (void)d;
#endif
    return attend_scalar;
}
