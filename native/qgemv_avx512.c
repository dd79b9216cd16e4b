/* qgemv_avx512.c: integer GEMV for int8 codebook tensors with b = 4, AVX-512 VNNI and AVX-512
 * VBMI (definitions in qgemv.h; docs/KERNELS.md "Integer kernels").
 *
 * Per 64 columns (two activation blocks of the same sub-block, G % 64 == 0): the 32 index bytes
 * are spread over the four 128-bit lanes as [bytes 0-15, bytes 0-15, bytes 16-31, bytes 16-31]
 * (vshufi64x2), shifted right by 0 / 4 bits per lane (vpsrlvw) and masked, which gives each
 * block's indices in the perm32 order of the quantized activations. The lookup in the
 * sub-block's 16 int8 centroids is one vpshufb (table in every lane; AVX-512 VNNI) or one
 * vpermb (AVX-512 VBMI). The sign of q moves onto the weight with a masked subtract from zero
 * (the mask is the precomputed sign bits of q), and two vpdpbusd multiply the unsigned low and
 * high bytes of |m q| by it: T = sum(lo) + 256 * sum(hi). A lane gains at most 4*255*127 per
 * step, so the int32 lanes are moved to int64 every 4096 steps.
 */
#include "qgemv.h"
#include "kernels.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>
#include <string.h>

#define VNNI512_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define VBMI512_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")))

/* 64 b = 4 indices from 32 bytes, each 32-column block in perm32 order. */
#define NIBBLES64(p, shift, low4)                                                              \
    _mm512_and_si512(                                                                          \
        _mm512_srlv_epi16(                                                                     \
            _mm512_shuffle_i64x2(                                                              \
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)(p))), \
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)(p))), \
                0x50),                                                                         \
            shift),                                                                            \
        low4)

/* int64 sum of the 16 int32 lanes of v */
#define HSUM_WIDE(v)                                                                           \
    _mm512_reduce_add_epi64(_mm512_add_epi64(                                                  \
        _mm512_cvtepi32_epi64(_mm512_castsi512_si256(v)),                                      \
        _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(v, 1))))

/* 64 columns at c from the index bytes at ip: lo/hi gain the VNNI dot products. */
#define STEP64(LOOKUP, ip)                                                                     \
    do {                                                                                       \
        __m512i w = LOOKUP(tbl, NIBBLES64((ip), shift, low4));                                 \
        __m512i ws = _mm512_mask_sub_epi8(w, (__mmask64)qa->neg[c / 64], zero, w);             \
        lo = _mm512_dpbusd_epi32(lo, _mm512_loadu_si512((const void *)(qa->mq_lo + c)), ws);   \
        hi = _mm512_dpbusd_epi32(hi, _mm512_loadu_si512((const void *)(qa->mq_hi + c)), ws);   \
    } while (0)

/* The row loop, for a lookup LOOKUP(table, idx) of one ISA. */
#define I8CB_B4_ROWS_512(LOOKUP)                                                               \
    int64_t T[L->n_sub];                                                                       \
    const int full = cols & ~63; /* columns in whole 64-column steps */                       \
    const __m512i shift = _mm512_set_epi64(0x0004000400040004, 0x0004000400040004, 0, 0,       \
                                           0x0004000400040004, 0x0004000400040004, 0, 0);      \
    const __m512i low4 = _mm512_set1_epi8(0x0f), zero = _mm512_setzero_si512();               \
    for (int r = r0; r < r1; r++) {                                                            \
        const uint8_t *row = L->indices + (size_t)r * L->row_bytes;                           \
        for (int s = 0; s < L->n_sub; s++) {                                                   \
            const int8_t *cb = L->cent + ((size_t)r * (size_t)L->n_sub + (size_t)s) * 16u;     \
            const __m512i tbl =                                                                \
                _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)cb));    \
            int c0 = s * L->group_size;                                                        \
            int c1 = c0 + L->group_size < cols ? c0 + L->group_size : cols;                    \
            int64_t t = 0;                                                                     \
            for (int c = c0; c < c1;) {                                                        \
                int stop = c + 4096 * 64 < c1 ? c + 4096 * 64 : c1;                            \
                int stop_full = stop < full ? stop : full;                                     \
                __m512i lo = zero, hi = zero;                                                  \
                for (; c < stop_full; c += 64) /* no calls: everything stays in registers */   \
                    STEP64(LOOKUP, row + c / 2);                                               \
                if (c < stop) { /* the row's last, partial step: a zero-padded copy */         \
                    uint8_t tail[32] = {0};                                                    \
                    memcpy(tail, row + c / 2,                                                  \
                           (size_t)ditto_cb_row_bytes((uint64_t)(cols - c), 4u));              \
                    STEP64(LOOKUP, tail);                                                      \
                    c = stop;                                                                  \
                }                                                                              \
                t += HSUM_WIDE(lo) + 256 * HSUM_WIDE(hi);                                      \
            }                                                                                  \
            T[s] = t;                                                                          \
        }                                                                                      \
        y[r] = i8_combine(L, r, T, qa->D);                                                     \
    }

#define LOOKUP_PSHUFB(tbl, idx) _mm512_shuffle_epi8(tbl, idx)
#define LOOKUP_PERMB(tbl, idx) _mm512_permutexvar_epi8(idx, tbl)

VNNI512_FN void i8cb_b4_rows_avx512vnni(float *y, const QuantActs *qa, const I8Layout *L,
                                        int r0, int r1, int cols) {
    I8CB_B4_ROWS_512(LOOKUP_PSHUFB)
}

VBMI512_FN void i8cb_b4_rows_avx512vbmi(float *y, const QuantActs *qa, const I8Layout *L,
                                        int r0, int r1, int cols) {
    I8CB_B4_ROWS_512(LOOKUP_PERMB)
}

#endif
