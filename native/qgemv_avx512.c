/* qgemv_avx512.c: integer GEMV for int8 codebook tensors with b = 4, AVX-512 VNNI (+ VBMI):
 * 128 columns per step in zmm registers (definitions in qgemv.h; docs/KERNELS.md "Integer
 * kernels").
 */
#include "qgemv.h"
#include "kernels.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>
#include <string.h>

#include "simd_avx2.h"

/* ---- b = 4 over 128 columns per step (perm128 activations), zmm ----
 * The 64 index bytes of 128 columns are one load; their low nibbles (the even columns) and,
 * after a 16-bit shift right by 4, their high nibbles (the odd columns) are looked up in the
 * sub-block's 16 centroids, stored as the unsigned bytes w + 128 (the table xor 0x80). With
 * VBMI the lookup is vpermb on the table repeated in all four lanes: it reads index bits 0..5,
 * and bits 4..5 (the neighbouring nibble) only pick which copy, so no mask is needed; without
 * VBMI it is vpand 0x0f + vpshufb. vpdpbusd multiplies those unsigned weights by the signed
 * bytes ml and mh of m * q (qgemv.h), so per sub-block
 *   sum (w + 128) (256 mh + ml) = T + 128 * sum m q,  T = (lo lanes) + 256 (hi lanes) - corr.
 * Four rows at a time (one activation load per four rows, 8 accumulators); G <= 512 keeps
 * |T| < 2^31, so every sum is formed modulo 2^32 (wrapping int32 lanes) and comes out exact.
 * Other G, and the last r1 - r0 mod 4 rows, go to the AVX2 kernel (the same bits). */

#define VNNI512_F16C_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")))
#define VBMI512_F16C_FN                                                                        \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,f16c")))

void i8cb_b4_rows_avx2(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                       int cols);

#define LOOKUP128_PERMB(tbl, v) _mm512_permutexvar_epi8((v), (tbl))
#define LOOKUP128_PSHUFB(tbl, v) _mm512_shuffle_epi8((tbl), _mm512_and_si512((v), low4))

/* 128 columns of one row (index bytes at ip): lo and hi gain the dot products. */
#define STEP128(LOOKUP, ip, tbl, lo, hi)                                                       \
    do {                                                                                       \
        __m512i v_ = _mm512_loadu_si512((const void *)(ip));                                   \
        __m512i we_ = LOOKUP(tbl, v_), wo_ = LOOKUP(tbl, _mm512_srli_epi16(v_, 4));            \
        lo = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(lo, we_, ale), wo_, alo);                 \
        hi = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(hi, we_, ahe), wo_, aho);                 \
    } while (0)

#define ACTS128(c)                                                                             \
    const __m512i ale = _mm512_loadu_si512((const void *)(qa->ml + (c)));                      \
    const __m512i alo = _mm512_loadu_si512((const void *)(qa->ml + (c) + 64));                 \
    const __m512i ahe = _mm512_loadu_si512((const void *)(qa->mh + (c)));                      \
    const __m512i aho = _mm512_loadu_si512((const void *)(qa->mh + (c) + 64))

/* lo + 256 hi, 16 lanes folded to 8 (wrapping int32) */
__attribute__((target("avx512f,avx2"))) static inline __m256i fold_lohi(__m512i lo, __m512i hi) {
    __m512i t = _mm512_add_epi32(lo, _mm512_slli_epi32(hi, 8));
    return _mm256_add_epi32(_mm512_castsi512_si256(t), _mm512_extracti64x4_epi64(t, 1));
}

#define I8CB_B4_ROWS4_128(NAME, FN, LOOKUP)                                                    \
    FN static void NAME##_rows4(float *y, const QuantActs *qa, const I8Layout *L, int r,       \
                                int cols, const uint32_t *corr) {                              \
        const uint8_t *row[4];                                                                 \
        for (int i = 0; i < 4; i++) row[i] = L->indices + (size_t)(r + i) * L->row_bytes;     \
        const int full = cols & ~127;                                                          \
        const size_t cent_bytes = (size_t)((const int8_t *)(const void *)L->scale - L->cent);  \
        prefetch_bytes(L->indices, (size_t)(r + 8) * L->row_bytes, 4 * L->row_bytes,           \
                       (size_t)(L->end - L->indices));                                         \
        prefetch_bytes(L->cent, (size_t)(r + 8) * (size_t)L->n_sub * 16u,                      \
                       4 * (size_t)L->n_sub * 16u, cent_bytes);                                \
        const __m512i low4 = _mm512_set1_epi8(0x0f), flip = _mm512_set1_epi8(-128);            \
        (void)low4;                                                                            \
        __m256d acc = _mm256_setzero_pd();                                                     \
        for (int s = 0; s < L->n_sub; s++) {                                                   \
            __m512i t0, t1, t2, t3;                                                            \
            const int8_t *cb = L->cent + ((size_t)r * (size_t)L->n_sub + (size_t)s) * 16u;     \
            const size_t cs = (size_t)L->n_sub * 16u;                                          \
            t0 = _mm512_xor_si512(flip, _mm512_broadcast_i32x4(_mm_loadu_si128(                \
                                            (const __m128i *)(const void *)cb)));              \
            t1 = _mm512_xor_si512(flip, _mm512_broadcast_i32x4(_mm_loadu_si128(                \
                                            (const __m128i *)(const void *)(cb + cs))));       \
            t2 = _mm512_xor_si512(flip, _mm512_broadcast_i32x4(_mm_loadu_si128(                \
                                            (const __m128i *)(const void *)(cb + 2 * cs))));   \
            t3 = _mm512_xor_si512(flip, _mm512_broadcast_i32x4(_mm_loadu_si128(                \
                                            (const __m128i *)(const void *)(cb + 3 * cs))));   \
            int c0 = s * L->group_size;                                                        \
            int c1 = c0 + L->group_size < cols ? c0 + L->group_size : cols;                    \
            int stop = c1 < full ? c1 : full;                                                  \
            __m512i l0 = _mm512_setzero_si512(), l1 = l0, l2 = l0, l3 = l0;                    \
            __m512i h0 = l0, h1 = l0, h2 = l0, h3 = l0;                                        \
            int c = c0;                                                                        \
            for (; c < stop; c += 128) { /* no calls: everything stays in registers */        \
                ACTS128(c);                                                                    \
                STEP128(LOOKUP, row[0] + c / 2, t0, l0, h0);                                   \
                STEP128(LOOKUP, row[1] + c / 2, t1, l1, h1);                                   \
                STEP128(LOOKUP, row[2] + c / 2, t2, l2, h2);                                   \
                STEP128(LOOKUP, row[3] + c / 2, t3, l3, h3);                                   \
            }                                                                                  \
            if (c < c1) { /* the rows' partial last step: zero-padded copies */                \
                uint8_t tl[4][64];                                                             \
                memset(tl, 0, sizeof tl);                                                      \
                size_t nb = (size_t)ditto_cb_row_bytes((uint64_t)(cols - c), 4u);              \
                for (int i = 0; i < 4; i++) memcpy(tl[i], row[i] + c / 2, nb);                 \
                ACTS128(c);                                                                    \
                STEP128(LOOKUP, tl[0], t0, l0, h0);                                            \
                STEP128(LOOKUP, tl[1], t1, l1, h1);                                            \
                STEP128(LOOKUP, tl[2], t2, l2, h2);                                            \
                STEP128(LOOKUP, tl[3], t3, l3, h3);                                            \
            }                                                                                  \
            __m128i T = _mm_sub_epi32(hsum4_epi32(fold_lohi(l0, h0), fold_lohi(l1, h1), fold_lohi(l2, h2),    \
                                                  fold_lohi(l3, h3)),                               \
                                      _mm_set1_epi32((int)corr[s]));                           \
            const uint16_t *sc = L->scale + (size_t)r * (size_t)L->n_sub + (size_t)s;          \
            __m128i sh = _mm_setr_epi16((short)sc[0], (short)sc[L->n_sub],                     \
                                        (short)sc[2 * L->n_sub], (short)sc[3 * L->n_sub], 0,   \
                                        0, 0, 0);                                              \
            __m256d scale = _mm256_cvtps_pd(_mm_cvtph_ps(sh));                                 \
            acc = _mm256_add_pd(acc, _mm256_mul_pd(scale, _mm256_cvtepi32_pd(T)));            \
        }                                                                                      \
        _mm_storeu_ps(y + r,                                                                   \
                      _mm256_cvtpd_ps(_mm256_mul_pd(acc, _mm256_set1_pd((double)qa->D))));     \
    }                                                                                          \
    FN void NAME(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1, int cols) { \
        if (L->group_size % 128 != 0 || L->group_size > 512) {                                 \
            i8cb_b4_rows_avx2(y, qa, L, r0, r1, cols);                                         \
            return;                                                                            \
        }                                                                                      \
        uint32_t corr[L->n_sub];                                                               \
        act_vnni_corrections(corr, qa, L->n_sub, L->group_size, cols);                         \
        int r = r0;                                                                            \
        for (; r + 4 <= r1; r += 4) NAME##_rows4(y, qa, L, r, cols, corr);                     \
        if (r < r1) i8cb_b4_rows_avx2(y, qa, L, r, r1, cols);                                  \
    }

I8CB_B4_ROWS4_128(i8cb_b4_rows_avx512vbmi, VBMI512_F16C_FN, LOOKUP128_PERMB)
I8CB_B4_ROWS4_128(i8cb_b4_rows_avx512vnni, VNNI512_F16C_FN, LOOKUP128_PSHUFB)

#endif
