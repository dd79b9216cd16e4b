/* qact_avx2.c: activation quantization (qgemv.h act_quantize) with AVX2 (and its AVX-512 form
 * for the AVX-512 tables), the same bytes as act_quantize_generic: the float steps per element
 * (x * inv, round half to even, clamp) are the generic ones in eight (sixteen) lanes, the
 * block maxima are exact whatever their order, and the per-block scalars come from the shared
 * act_block_m(). A row's partial last block takes the scalar path. */
#include "../../qgemv.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>
#include <math.h>
#include <string.h>

#ifdef __clang__
/* D and x * inv are the generic definition's roundings (qgemv_generic.c), under Ditto's
 * fast-math policy too: no reassociation, reciprocal or contraction rewrites. */
#pragma STDC FP_CONTRACT OFF
#pragma float_control(precise, on)
#endif

#define AVX2_FN __attribute__((target("avx2")))

AVX2_FN static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* 32 int8 values of round(x * inv) clamped to +-127, in column order. */
AVX2_FN static inline __m256i quantize32(const float *x, __m256 inv) {
    const __m256 hi = _mm256_set1_ps((float)QA_QMAX), lo = _mm256_set1_ps(-(float)QA_QMAX);
    __m256i v[4];
    for (int i = 0; i < 4; i++) {
        __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), inv),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        v[i] = _mm256_cvtps_epi32(_mm256_max_ps(_mm256_min_ps(r, hi), lo));
    }
    /* packs work per 128-bit half: dwords end up as 0,2,4,6 | 1,3,5,7 of the eight groups */
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* act_fill_vnni() from qp: per block j of 32 (perm32: its 16 evens, then its 16 odds), m * q
 * in int16 (vpmullw, |m q| <= 32385), mh = (m q + 128) >> 8 (arithmetic: the floor),
 * ml = m q - 256 mh; the block's evens go to perm128 entries 16 (j mod 4) .. + 16 of its
 * 128-column chunk and its odds 64 further; nl, nh the same from q in column order (the same
 * bytes as act_fill_vnni). */
/* The 32 int8 q times the block multiplier m (int16: q's low 16 in *va, high 16 in *vb),
 * split into signed bytes m q = lo + 256 hi (lo in -128..127), lo and hi packed back into
 * q's column order. */
AVX2_FN static inline void split_mq(__m256i q, __m256i m, __m256i *va, __m256i *vb, __m256i *lo,
                                    __m256i *hi) {
    const __m256i r128 = _mm256_set1_epi16(128);
    __m256i a = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)), m);
    __m256i b = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1)), m);
    __m256i ha = _mm256_srai_epi16(_mm256_add_epi16(a, r128), 8);
    __m256i hb = _mm256_srai_epi16(_mm256_add_epi16(b, r128), 8);
    __m256i la = _mm256_sub_epi16(a, _mm256_slli_epi16(ha, 8));
    __m256i lb = _mm256_sub_epi16(b, _mm256_slli_epi16(hb, 8));
    /* packs works per 128-bit half; 0,2,1,3 restores the order */
    *lo = _mm256_permute4x64_epi64(_mm256_packs_epi16(la, lb), 0xd8);
    *hi = _mm256_permute4x64_epi64(_mm256_packs_epi16(ha, hb), 0xd8);
    *va = a;
    *vb = b;
}

AVX2_FN static void fill_vnni_avx2(QuantActs *qa) {
    size_t n_pad = (size_t)qa->n_pad;
    /* the entries no block writes: with n_pad % 128 == 64, the last chunk's missing half */
    if (n_pad % 128) {
        memset(qa->ml + n_pad - 64, 0, 128);
        memset(qa->mh + n_pad - 64, 0, 128);
    }
    const __m256i ones = _mm256_set1_epi16(1);
    for (size_t j = 0; j < n_pad / QA_BLOCK; j++) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(qa->qp + 32 * j));
        __m256i m = _mm256_set1_epi16(qa->m16[j]);
        __m256i ve, vo, l, h; /* perm32 order: the 16 evens, then the 16 odds */
        split_mq(q, m, &ve, &vo, &l, &h);
        size_t e = j / 4 * 128 + j % 4 * 16;
        _mm_storeu_si128((__m128i *)(void *)(qa->ml + e), _mm256_castsi256_si128(l));
        _mm_storeu_si128((__m128i *)(void *)(qa->ml + e + 64), _mm256_extracti128_si256(l, 1));
        _mm_storeu_si128((__m128i *)(void *)(qa->mh + e), _mm256_castsi256_si128(h));
        _mm_storeu_si128((__m128i *)(void *)(qa->mh + e + 64), _mm256_extracti128_si256(h, 1));
        /* natural order: m q from q itself (the block's 32 columns in order) */
        __m256i qn = _mm256_loadu_si256((const __m256i *)(const void *)(qa->q + 32 * j));
        __m256i va, vb, nl, nh;
        split_mq(qn, m, &va, &vb, &nl, &nh);
        _mm256_storeu_si256((__m256i *)(void *)(qa->nl + 32 * j), nl);
        _mm256_storeu_si256((__m256i *)(void *)(qa->nh + 32 * j), nh);
        __m256i s = _mm256_add_epi32(_mm256_madd_epi16(ve, ones), _mm256_madd_epi16(vo, ones));
        __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
        qa->msum[j] = _mm_cvtsi128_si32(t);
    }
    qa->has_vnni = 1;
}

AVX2_FN static void finish_perm32(QuantActs *qa, int flags);

AVX2_FN int act_quantize_avx2(QuantActs *qa, const float *x, int n, int flags) {
    size_t n_pad = ((size_t)(n > 0 ? n : 1) + QA_PAD - 1) / QA_PAD * QA_PAD;
    if (act_reserve(qa, n_pad)) return -1;
    qa->n = n;
    qa->n_pad = (int)n_pad;
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 fmax = _mm256_set1_ps(3.402823466e38f);
    __m256 vA = _mm256_setzero_ps(), vfin = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    int c = 0;
    for (; c + 8 <= n; c += 8) {
        __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + c), abs_mask);
        vfin = _mm256_and_ps(vfin, _mm256_cmp_ps(a, fmax, _CMP_LE_OQ)); /* false: NaN, inf */
        vA = _mm256_max_ps(vA, a);
    }
    int finite = _mm256_movemask_ps(vfin) == 0xff;
    float A = finite ? hmax8(vA) : 0.0f;
    for (; c < n; c++) {
        float a = fabsf(x[c]);
        if (!(a <= 3.402823466e38f)) finite = 0;
        else if (a > A) A = a;
    }
    float D = A / (float)(QA_QMAX * QA_MMAX);
    qa->D = finite ? D : NAN;
    memset(qa->q, 0, n_pad);
    int nb = (int)(n_pad / QA_BLOCK);
    for (int j = 0; j < nb; j++) {
        int c0 = j * QA_BLOCK, c1 = c0 + QA_BLOCK < n ? c0 + QA_BLOCK : n;
        float a = 0.0f, inv = 0.0f;
        int whole = c1 - c0 == QA_BLOCK;
        if (whole) {
            __m256 m4 = _mm256_and_ps(_mm256_loadu_ps(x + c0), abs_mask);
            for (int i = 1; i < 4; i++)
                m4 = _mm256_max_ps(m4, _mm256_and_ps(_mm256_loadu_ps(x + c0 + 8 * i), abs_mask));
            a = hmax8(m4);
        } else {
            for (int k = c0; k < c1; k++) {
                float v = fabsf(x[k]);
                if (v > a) a = v;
            }
        }
        int m = act_block_m(a, D, finite, &inv);
        if (m && whole) {
            __m256i q = quantize32(x + c0, _mm256_set1_ps(inv));
            _mm256_storeu_si256((__m256i *)(void *)(qa->q + c0), q);
        } else if (m) {
            for (int k = c0; k < c1; k++) {
                float r = rintf(x[k] * inv);
                r = r > (float)QA_QMAX ? (float)QA_QMAX : r < -(float)QA_QMAX ? -(float)QA_QMAX : r;
                qa->q[k] = (int8_t)r;
            }
        }
        qa->m[j] = (uint8_t)m;
        qa->m16[j] = (int16_t)m;
    }
    finish_perm32(qa, flags);
    return 0;
}

/* perm32 (each block's evens, then its odds), |qp|, the perm64 arrays (qgemv.h: the evens of
 * each two blocks, then their odds, and their multipliers) and, with ACT_VNNI, the VNNI arrays
 * of qa->q, none of them under ACT_PLAIN (the steps after the quantization itself, shared by
 * the AVX2 and AVX-512 forms). */
AVX2_FN static void finish_perm32(QuantActs *qa, int flags) {
    const size_t n_pad = (size_t)qa->n_pad;
    qa->has_vnni = qa->has_perm = 0;
    if (flags & ACT_PLAIN) return;
    const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                           0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    for (size_t base = 0; base < n_pad; base += 64) { /* QA_PAD: whole groups of 64 */
        __m256i p[2], a[2];
        for (int h = 0; h < 2; h++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(qa->q + base + 32 * h));
            p[h] = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(q, split), 0xd8); /* 0,2,1,3 */
            a[h] = _mm256_abs_epi8(p[h]);
            _mm256_storeu_si256((__m256i *)(void *)(qa->qp + base + 32 * h), p[h]);
            _mm256_storeu_si256((__m256i *)(void *)(qa->aqp + base + 32 * h), a[h]);
        }
        /* perm64: the evens of both blocks, then their odds */
        _mm256_storeu_si256((__m256i *)(void *)(qa->qp64 + base),
                            _mm256_permute2x128_si256(p[0], p[1], 0x20));
        _mm256_storeu_si256((__m256i *)(void *)(qa->qp64 + base + 32),
                            _mm256_permute2x128_si256(p[0], p[1], 0x31));
        _mm256_storeu_si256((__m256i *)(void *)(qa->aqp64 + base),
                            _mm256_permute2x128_si256(a[0], a[1], 0x20));
        _mm256_storeu_si256((__m256i *)(void *)(qa->aqp64 + base + 32),
                            _mm256_permute2x128_si256(a[0], a[1], 0x31));
        _mm256_storeu_si256((__m256i *)(void *)(qa->m64 + base / 4),
                            _mm256_setr_m128i(_mm_set1_epi16(qa->m16[base / 32]),
                                              _mm_set1_epi16(qa->m16[base / 32 + 1])));
    }
    qa->has_perm = 1;
    if (flags & ACT_VNNI) fill_vnni_avx2(qa);
}

#define AVX512_FN __attribute__((target("avx512f,avx2")))

/* 32 int8 values of round(x * inv) clamped to +-127, in column order: quantize32 in two zmm
 * (the same float steps per element; the values are in range, so the narrowing is exact). */
AVX512_FN static inline __m256i quantize32_zmm(const float *x, __m512 inv) {
    const __m512 hi = _mm512_set1_ps((float)QA_QMAX), lo = _mm512_set1_ps(-(float)QA_QMAX);
    __m128i b[2];
    for (int i = 0; i < 2; i++) {
        __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(x + 16 * i), inv),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        b[i] = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_max_ps(_mm512_min_ps(r, hi), lo)));
    }
    return _mm256_setr_m128i(b[0], b[1]);
}

/* act_quantize_avx2 with the maxima and the quantization in sixteen lanes (the AVX-512 tables'
 * act_quant): maxima are exact in any order and the per-element steps are the same, so the
 * same bytes. */
AVX512_FN int act_quantize_avx512(QuantActs *qa, const float *x, int n, int flags) {
    size_t n_pad = ((size_t)(n > 0 ? n : 1) + QA_PAD - 1) / QA_PAD * QA_PAD;
    if (act_reserve(qa, n_pad)) return -1;
    qa->n = n;
    qa->n_pad = (int)n_pad;
    const __m512 fmax = _mm512_set1_ps(3.402823466e38f);
    __m512 vA = _mm512_setzero_ps();
    __mmask16 fin = 0xffff;
    int c = 0;
    for (; c + 16 <= n; c += 16) {
        __m512 a = _mm512_abs_ps(_mm512_loadu_ps(x + c));
        fin &= _mm512_cmp_ps_mask(a, fmax, _CMP_LE_OQ); /* false: NaN, inf */
        vA = _mm512_max_ps(vA, a);
    }
    int finite = fin == 0xffff;
    float A = finite ? _mm512_reduce_max_ps(vA) : 0.0f;
    for (; c < n; c++) {
        float a = fabsf(x[c]);
        if (!(a <= 3.402823466e38f)) finite = 0;
        else if (a > A) A = a;
    }
    float D = A / (float)(QA_QMAX * QA_MMAX);
    qa->D = finite ? D : NAN;
    memset(qa->q, 0, n_pad);
    int nb = (int)(n_pad / QA_BLOCK);
    for (int j = 0; j < nb; j++) {
        int c0 = j * QA_BLOCK, c1 = c0 + QA_BLOCK < n ? c0 + QA_BLOCK : n;
        float a = 0.0f, inv = 0.0f;
        int whole = c1 - c0 == QA_BLOCK;
        if (whole) {
            a = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + c0)),
                                                   _mm512_abs_ps(_mm512_loadu_ps(x + c0 + 16))));
        } else {
            for (int k = c0; k < c1; k++) {
                float v = fabsf(x[k]);
                if (v > a) a = v;
            }
        }
        int m = act_block_m(a, D, finite, &inv);
        if (m && whole) {
            _mm256_storeu_si256((__m256i *)(void *)(qa->q + c0),
                                quantize32_zmm(x + c0, _mm512_set1_ps(inv)));
        } else if (m) {
            for (int k = c0; k < c1; k++) {
                float r = rintf(x[k] * inv);
                r = r > (float)QA_QMAX ? (float)QA_QMAX : r < -(float)QA_QMAX ? -(float)QA_QMAX : r;
                qa->q[k] = (int8_t)r;
            }
        }
        qa->m[j] = (uint8_t)m;
        qa->m16[j] = (int16_t)m;
    }
    finish_perm32(qa, flags);
    return 0;
}

#endif
