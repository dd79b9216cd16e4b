/* qgemv_avx2.c: integer GEMV for int8 codebook tensors with b = 4, AVX2 and AVX-VNNI (256-bit)
 * (definitions in qgemv.h; docs/KERNELS.md "Integer kernels").
 *
 * Per 32 columns of a row (one activation block, wholly inside one sub-block as G % 32 == 0):
 * the 16 index bytes are split into their low nibbles (even columns) and high nibbles (odd
 * columns), one 128-bit half each, which is the perm32 order of the quantized activations;
 * one vpshufb looks the 32 indices up in the sub-block's 16 int8 centroids (broadcast to both
 * halves). vpmaddubsw multiplies unsigned by signed bytes, so the sign of q moves onto the
 * weight (vpsignb) and |q| is the unsigned operand (the trick of ggml's q4_0 x q8_0 dot):
 *   AVX2:     vpmaddubsw(|q|, sign(w, q)) -> 16 x int16 (|pair| <= 2*127*127, no saturation),
 *             vpmaddwd with the block multiplier m -> 8 x int32, added to the accumulator.
 *   AVX-VNNI: vpdpbusd(lo, sign(w, q)) and vpdpbusd(hi, sign(w, q)) where lo/hi are the bytes
 *             of |m q| (<= 32385), so T = sum(lo part) + 256 * sum(hi part).
 * The int32 lanes are moved to an int64 sum before they can overflow (AVX2: every 128 chunks,
 * a lane gains at most 2*32258*255 per chunk; VNNI: every 8192 chunks, at most 4*255*127).
 * The AVX2 kernel works on two rows at a time, sharing the activation loads.
 */
#include "qgemv.h"
#include "kernels.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>
#include <string.h>

#define AVX2_FN __attribute__((target("avx2")))
#define AVXVNNI_FN __attribute__((target("avx2,avxvnni")))

/* 32 indices of b = 4 from 16 bytes: low nibbles in the low half, high nibbles in the high. */
AVX2_FN static inline __m256i nibbles32(const uint8_t *p) {
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
    __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

AVX2_FN static int64_t hsum_epi32_wide(__m256i v) {
    __m256i lo = _mm256_cvtepi32_epi64(_mm256_castsi256_si128(v));
    __m256i hi = _mm256_cvtepi32_epi64(_mm256_extracti128_si256(v, 1));
    __m256i s = _mm256_add_epi64(lo, hi);
    __m128i t = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    return _mm_cvtsi128_si64(t) + _mm_extract_epi64(t, 1);
}

/* 32 columns of one row: int32 lanes of m * sum(q * w) (perm32 order, G % 32 == 0). */
AVX2_FN static inline __m256i block32(const uint8_t *ip, __m256i tbl, __m256i q, __m256i a,
                                      __m256i m) {
    __m256i w = _mm256_shuffle_epi8(tbl, nibbles32(ip));
    return _mm256_madd_epi16(_mm256_maddubs_epi16(a, _mm256_sign_epi8(w, q)), m);
}

/* The index bytes of the block at column c of a row: in place, or for the row's last,
 * partial block a zero-padded copy in tail. */
static inline const uint8_t *block_indices(const uint8_t *row, int c, int cols, uint8_t *tail) {
    if (c + 32 <= cols) return row + c / 2;
    i8_tail_indices(tail, row, c, cols);
    return tail;
}

/* Two rows at once (ra, rb; the same row twice for a run's odd last row): the activation
 * loads and the block multiplier are shared. */
AVX2_FN static void rows2_avx2(float *y, const QuantActs *qa, const I8Layout *L, int ra, int rb,
                               int cols, int64_t *T0, int64_t *T1) {
    const uint8_t *row0 = L->indices + (size_t)ra * L->row_bytes;
    const uint8_t *row1 = L->indices + (size_t)rb * L->row_bytes;
    const __m256i zero = _mm256_setzero_si256();
    for (int s = 0; s < L->n_sub; s++) {
        const int8_t *cb0 = L->cent + ((size_t)ra * (size_t)L->n_sub + (size_t)s) * 16u;
        const int8_t *cb1 = L->cent + ((size_t)rb * (size_t)L->n_sub + (size_t)s) * 16u;
        const __m256i tbl0 =
            _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)cb0));
        const __m256i tbl1 =
            _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)cb1));
        int c0 = s * L->group_size;
        int c1 = c0 + L->group_size < cols ? c0 + L->group_size : cols;
        int64_t t0 = 0, t1 = 0;
        for (int c = c0; c < c1;) {
            int stop = c + 128 * 32 < c1 ? c + 128 * 32 : c1; /* int32 lanes stay exact */
            __m256i acc0 = zero, acc1 = zero;
            for (; c < stop; c += 32) {
                uint8_t tail0[16], tail1[16];
                __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(qa->qp + c));
                __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)(qa->aqp + c));
                __m256i m = _mm256_set1_epi16(qa->m16[c / 32]);
                acc0 = _mm256_add_epi32(
                    acc0, block32(block_indices(row0, c, cols, tail0), tbl0, q, a, m));
                acc1 = _mm256_add_epi32(
                    acc1, block32(block_indices(row1, c, cols, tail1), tbl1, q, a, m));
            }
            t0 += hsum_epi32_wide(acc0);
            t1 += hsum_epi32_wide(acc1);
        }
        T0[s] = t0;
        T1[s] = t1;
    }
    y[ra] = i8_combine(L, ra, T0, qa->D);
    y[rb] = i8_combine(L, rb, T1, qa->D);
}

AVX2_FN void i8cb_b4_rows_avx2(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                               int cols) {
    int64_t T0[L->n_sub], T1[L->n_sub];
    for (int r = r0; r < r1; r += 2) rows2_avx2(y, qa, L, r, r + 1 < r1 ? r + 1 : r, cols, T0, T1);
}

AVXVNNI_FN void i8cb_b4_rows_avxvnni(float *y, const QuantActs *qa, const I8Layout *L, int r0,
                                     int r1, int cols) {
    int64_t T[L->n_sub];
    const __m256i zero = _mm256_setzero_si256();
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = L->indices + (size_t)r * L->row_bytes;
        for (int s = 0; s < L->n_sub; s++) {
            const int8_t *cb = L->cent + ((size_t)r * (size_t)L->n_sub + (size_t)s) * 16u;
            const __m256i tbl =
                _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)cb));
            int c0 = s * L->group_size;
            int c1 = c0 + L->group_size < cols ? c0 + L->group_size : cols;
            int64_t t = 0;
            for (int c = c0; c < c1;) {
                int stop = c + 8192 * 32 < c1 ? c + 8192 * 32 : c1;
                __m256i lo = zero, hi = zero;
                for (; c < stop; c += 32) {
                    uint8_t tail[16];
                    const uint8_t *ip = row + c / 2;
                    if (c + 32 > cols) {
                        i8_tail_indices(tail, row, c, cols);
                        ip = tail;
                    }
                    __m256i w = _mm256_shuffle_epi8(tbl, nibbles32(ip));
                    __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(qa->qp + c));
                    __m256i ws = _mm256_sign_epi8(w, q);
                    lo = _mm256_dpbusd_avx_epi32(
                        lo, _mm256_loadu_si256((const __m256i *)(const void *)(qa->mq_lo + c)), ws);
                    hi = _mm256_dpbusd_avx_epi32(
                        hi, _mm256_loadu_si256((const __m256i *)(const void *)(qa->mq_hi + c)), ws);
                }
                t += hsum_epi32_wide(lo) + 256 * hsum_epi32_wide(hi);
            }
            T[s] = t;
        }
        y[r] = i8_combine(L, r, T, qa->D);
    }
}


/* ---- any b in 1..8 (natural column order), AVX2 + BMI2 ----
 * Per 32 columns: each group of 8 b-bit indices is one pdep (BMI2) away from 8 index bytes
 * (the group's 8b bits deposited into the low b bits of each byte); the 32 bytes are looked up
 * in the sub-block's K int8 centroids with K/16 vpshufb (16-entry tables) joined by vpblendvb
 * on index bits 4..7 (each moved to the byte's top bit by a shift); then as for b = 4, with
 * the activations in natural order (q and |q| = vpabsb q). */
#define AVX2_BMI2_FN __attribute__((target("avx2,bmi2")))

/* The 8 indices of the group at p (b bytes) as 8 bytes. Reads 8 bytes when they lie inside
 * the payload, else only the group's b bytes. */
AVX2_BMI2_FN static inline uint64_t group_bytes(const uint8_t *p, int bits, uint64_t dep_mask,
                                                const uint8_t *end) {
    uint64_t v = 0;
    if (end - p >= 8) memcpy(&v, p, 8);
    else memcpy(&v, p, (size_t)bits);
    return _pdep_u64(v, dep_mask);
}

/* 32 int8 centroids for 32 index bytes: tables tbl[0..K/16) of 16 entries each (k a
 * constant after inlining, so the loops unroll). */
__attribute__((always_inline)) AVX2_BMI2_FN static inline __m256i lookup_k(__m256i idx,
                                                                           const __m256i *tbl,
                                                                           const int k) {
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    __m256i lo = _mm256_and_si256(idx, low4); /* vpshufb zeroes a lane whose bit 7 is set */
    if (k <= 16) return _mm256_shuffle_epi8(tbl[0], lo);
    __m256i r[16];
    const int n = k / 16;
    for (int i = 0; i < n; i++) r[i] = _mm256_shuffle_epi8(tbl[i], lo);
    for (int bit = 4, step = 1; step < n; bit++, step *= 2) { /* bit 4 picks pairs, ... */
        __m256i sel = _mm256_slli_epi16(idx, 7 - bit); /* index bit -> the byte's top bit */
        for (int i = 0; i + step < n; i += 2 * step)
            r[i] = _mm256_blendv_epi8(r[i], r[i + step], sel);
    }
    return r[0];
}

/* Rows [r0, r1) for a table of k (>= 16: b < 4 pads to 16) entries. */
__attribute__((always_inline)) AVX2_BMI2_FN static inline void
rows_any_k(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1, int cols,
           const int k) {
    int64_t T[L->n_sub];
    const int b = L->bits;
    const uint64_t dep = ((UINT64_C(1) << b) - 1u) * UINT64_C(0x0101010101010101);
    __m256i tbl[16];
    for (int i = 0; i < 16; i++) tbl[i] = _mm256_setzero_si256();
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = L->indices + (size_t)r * L->row_bytes;
        for (int s = 0; s < L->n_sub; s++) {
            const int8_t *cb =
                L->cent + ((size_t)r * (size_t)L->n_sub + (size_t)s) * (size_t)L->k;
            if (L->k >= 16) {
                for (int i = 0; i < k / 16; i++)
                    tbl[i] = _mm256_broadcastsi128_si256(
                        _mm_loadu_si128((const __m128i *)(const void *)(cb + 16 * i)));
            } else {
                int8_t t16[16] = {0};
                memcpy(t16, cb, (size_t)L->k);
                tbl[0] = _mm256_broadcastsi128_si256(
                    _mm_loadu_si128((const __m128i *)(const void *)t16));
            }
            int c0 = s * L->group_size;
            int c1 = c0 + L->group_size < cols ? c0 + L->group_size : cols;
            int64_t t = 0;
            for (int c = c0; c < c1;) {
                int stop = c + 128 * 32 < c1 ? c + 128 * 32 : c1; /* int32 lanes stay exact */
                __m256i acc = _mm256_setzero_si256();
                for (; c < stop; c += 32) {
                    const uint8_t *g0 = row + (size_t)(c / 8) * (size_t)b;
                    uint64_t g[4] = {0, 0, 0, 0};
                    if (c + 32 <= cols && L->end - g0 >= 3 * b + 8) { /* 4 whole groups */
                        for (int j = 0; j < 4; j++) {
                            uint64_t v;
                            memcpy(&v, g0 + j * b, 8);
                            g[j] = _pdep_u64(v, dep);
                        }
                    } else {
                        for (int j = 0; j < 4 && c + 8 * j < cols; j++)
                            g[j] = group_bytes(g0 + j * b, b, dep, L->end);
                    }
                    __m256i idx = _mm256_setr_epi64x((long long)g[0], (long long)g[1],
                                                     (long long)g[2], (long long)g[3]);
                    __m256i w = lookup_k(idx, tbl, k);
                    __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(qa->q + c));
                    __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(w, q));
                    acc = _mm256_add_epi32(
                        acc, _mm256_madd_epi16(p, _mm256_set1_epi16(qa->m16[c / 32])));
                }
                t += hsum_epi32_wide(acc);
            }
            T[s] = t;
        }
        y[r] = i8_combine(L, r, T, qa->D);
    }
}

AVX2_BMI2_FN void i8cb_rows_avx2_any(float *y, const QuantActs *qa, const I8Layout *L, int r0,
                                     int r1, int cols) {
    switch (L->k) {
    case 32: rows_any_k(y, qa, L, r0, r1, cols, 32); break;
    case 64: rows_any_k(y, qa, L, r0, r1, cols, 64); break;
    case 128: rows_any_k(y, qa, L, r0, r1, cols, 128); break;
    case 256: rows_any_k(y, qa, L, r0, r1, cols, 256); break;
    default: rows_any_k(y, qa, L, r0, r1, cols, 16); break; /* b <= 4 */
    }
}

#endif
