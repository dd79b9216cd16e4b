/* qgemv_avx2.c: integer GEMV for int8 codebook tensors, AVX2 and AVX-VNNI (256-bit): b = 4,
 * b = 6 (the default classifier) and any b (definitions in qgemv.h; docs/KERNELS.md "Integer
 * kernels").
 *
 * Per 32 columns of a row (one activation block, wholly inside one sub-block as G % 32 == 0):
 * the 16 index bytes are split into their low nibbles (even columns) and high nibbles (odd
 * columns), one 128-bit half each, which is the perm32 order of the quantized activations;
 * one vpshufb looks the 32 indices up in the sub-block's 16 int8 centroids (broadcast to both
 * halves). vpmaddubsw multiplies unsigned by signed bytes, so the sign of q moves onto the
 * weight (vpsignb) and |q| is the unsigned operand (the trick of ggml's q4_0 x q8_0 dot):
 *   AVX2:     vpmaddubsw(|q|, sign(w, q)) -> 16 x int16 (|pair| <= 2*127*127, no saturation),
 *             vpmaddwd with the block multiplier m -> 8 x int32, added to the accumulator.
 * The int32 lanes are moved to an int64 sum before they can overflow (every 128 chunks, a lane
 * gains at most 2*32258*255 per chunk). AVX-VNNI has its own kernel below (128 columns per
 * step, vpdpbusd on the unsigned weights w + 128).
 * The AVX2 kernel works on two rows at a time, sharing the activation loads. The inner loops
 * over whole chunks make no calls (a row's partial last chunk is handled after them), so the
 * accumulators, tables and activations stay in registers.
 */
#include "../../qgemv.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>
#include <string.h>

#include "simd_avx2.h"

/* 32 columns of one row: int32 lanes of m * sum(q * w) (perm32 order, G % 32 == 0). */
AVX2_FN static inline __m256i block32(const uint8_t *ip, __m256i tbl, __m256i q, __m256i a,
                                      __m256i m) {
    __m256i w = _mm256_shuffle_epi8(tbl, nibbles32(ip));
    return _mm256_madd_epi16(_mm256_maddubs_epi16(a, _mm256_sign_epi8(w, q)), m);
}

/* Two 128-bit loads as one vector: lo at p_lo, hi at p_hi. */
#define LOAD2X128(p_hi, p_lo)                                                                  \
    _mm256_inserti128_si256(                                                                   \
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(p_lo))),        \
        _mm_loadu_si128((const __m128i *)(const void *)(p_hi)), 1)

/* 64 columns of one row from 32 index bytes: the low nibbles are the even columns of the two
 * activation blocks (block A in the low half, B in the high), the high nibbles the odd ones;
 * qe/ae and qo/ao hold the perm32 activations in that order and m the two blocks' multipliers
 * (A's in the low half). int32 lanes of mA * sum_A(q * w) and mB * sum_B(q * w). */
AVX2_FN static inline __m256i block64(const uint8_t *ip, __m256i tbl, __m256i qe, __m256i qo,
                                      __m256i ae, __m256i ao, __m256i m, __m256i low4) {
    __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)ip);
    __m256i we = _mm256_shuffle_epi8(tbl, _mm256_and_si256(v, low4));
    __m256i wo = _mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_srli_epi16(v, 4), low4));
    __m256i pe = _mm256_madd_epi16(_mm256_maddubs_epi16(ae, _mm256_sign_epi8(we, qe)), m);
    __m256i po = _mm256_madd_epi16(_mm256_maddubs_epi16(ao, _mm256_sign_epi8(wo, qo)), m);
    return _mm256_add_epi32(pe, po);
}

/* The four rows' centroids of sub-block s (r..r+3), each 16-entry table in both halves. */
__attribute__((always_inline)) AVX2_FN static inline void tables4(__m256i tbl[4],
                                                                  const I8Layout *L, int r,
                                                                  int s) {
    for (int i = 0; i < 4; i++)
        tbl[i] = _mm256_broadcastsi128_si256(_mm_loadu_si128(
            (const __m128i *)(const void *)(L->cent +
                                            ((size_t)(r + i) * (size_t)L->n_sub + (size_t)s) *
                                                16u)));
}

/* The centroids of rows r+8..r+11 into L2: the four-row kernels' next tables. */
static inline void prefetch_tables4(const I8Layout *L, int r) {
    const size_t cent_bytes = (size_t)((const int8_t *)(const void *)L->scale - L->cent);
    prefetch_bytes(L->cent, (size_t)(r + 8) * (size_t)L->n_sub * 16u, 4 * (size_t)L->n_sub * 16u,
                   cent_bytes);
}

/* (m[c/32], m[c/32 + 1]) as one dword -> the first in the low half, the second in the high */
#define M_PICK                                                                                 \
    _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, \
                     3, 2, 3, 2, 3, 2, 3)

/* The activations of the 64 columns at c for block64: perm32 q and |q| of the even (qe, ae)
 * and odd (qo, ao) columns of its two blocks, and the two blocks' multipliers m. */
__attribute__((always_inline)) AVX2_FN static inline void
acts64(const QuantActs *qa, int c, __m256i m_pick, __m256i *qe, __m256i *qo, __m256i *ae,
       __m256i *ao, __m256i *m) {
    const int8_t *qp = qa->qp + c;
    const uint8_t *ap = qa->aqp + c;
    *qe = LOAD2X128(qp + 32, qp);
    *qo = LOAD2X128(qp + 48, qp + 16);
    *ae = LOAD2X128(ap + 32, ap);
    *ao = LOAD2X128(ap + 48, ap + 16);
    int32_t mm;
    memcpy(&mm, qa->m16 + c / 32, sizeof mm);
    *m = _mm256_shuffle_epi8(_mm256_set1_epi32(mm), m_pick);
}

/* acts64 from the perm64 arrays (qa->qp64, aqp64 and m64 at a column c % 64 == 0): five
 * loads. */
__attribute__((always_inline)) AVX2_FN static inline void
acts64_p64(const int8_t *qp, const uint8_t *ap, const int16_t *mp, __m256i *qe, __m256i *qo,
           __m256i *ae, __m256i *ao, __m256i *m) {
    *qe = _mm256_loadu_si256((const __m256i *)(const void *)qp);
    *qo = _mm256_loadu_si256((const __m256i *)(const void *)(qp + 32));
    *ae = _mm256_loadu_si256((const __m256i *)(const void *)ap);
    *ao = _mm256_loadu_si256((const __m256i *)(const void *)(ap + 32));
    *m = _mm256_loadu_si256((const __m256i *)(const void *)mp);
}

/* Full 32-column chunks [c, stop) of two rows (index bytes i0, i1 at column 0 of the rows):
 * int32 lanes added to *acc0 and *acc1. No calls inside, so the accumulators, tables and
 * activations stay in registers. */
AVX2_FN static inline void b4_pair_chunks(const uint8_t *i0, const uint8_t *i1,
                                          const QuantActs *qa, int c, int stop, __m256i tbl0,
                                          __m256i tbl1, __m256i *acc0, __m256i *acc1) {
    __m256i s0 = *acc0, s1 = *acc1;
    for (; c < stop; c += 32) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(qa->qp + c));
        __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)(qa->aqp + c));
        __m256i m = _mm256_set1_epi16(qa->m16[c / 32]);
        s0 = _mm256_add_epi32(s0, block32(i0 + c / 2, tbl0, q, a, m));
        s1 = _mm256_add_epi32(s1, block32(i1 + c / 2, tbl1, q, a, m));
    }
    *acc0 = s0;
    *acc1 = s1;
}

/* Two rows at once (ra, rb; the same row twice for a run's odd last row): the activation
 * loads and the block multiplier are shared. A row's last, partial chunk reads a zero-padded
 * copy of its index bytes. */
AVX2_FN static void rows2_avx2(float *y, const QuantActs *qa, const I8Layout *L, int ra, int rb,
                               int cols, int64_t *T0, int64_t *T1) {
    const uint8_t *row0 = L->indices + (size_t)ra * L->row_bytes;
    const uint8_t *row1 = L->indices + (size_t)rb * L->row_bytes;
    const int full = cols & ~31; /* columns in whole chunks */
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
            int stop_full = stop < full ? stop : full;
            __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
            b4_pair_chunks(row0, row1, qa, c, stop_full, tbl0, tbl1, &acc0, &acc1);
            if (stop_full < stop) { /* the row's partial last chunk */
                uint8_t tail0[16], tail1[16];
                i8_tail_indices(tail0, row0, full, cols);
                i8_tail_indices(tail1, row1, full, cols);
                __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(qa->qp + full));
                __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)(qa->aqp + full));
                __m256i m = _mm256_set1_epi16(qa->m16[full / 32]);
                acc0 = _mm256_add_epi32(acc0, block32(tail0, tbl0, q, a, m));
                acc1 = _mm256_add_epi32(acc1, block32(tail1, tbl1, q, a, m));
            }
            c = stop;
            t0 += hsum_epi32_wide(acc0);
            t1 += hsum_epi32_wide(acc1);
        }
        T0[s] = t0;
        T1[s] = t1;
    }
    y[ra] = combine_f16c(L, ra, T0, qa->D);
    y[rb] = combine_f16c(L, rb, T1, qa->D);
}

/* The index line at row offset p of each of the four rows, `ahead` bytes on, prefetched into
 * L2 when the step reading bytes [b, b + len) of the rows starts a new 64-byte line (p, the
 * first multiple of 64 at or after b, falls inside it): one line per row per 128 columns for
 * any G % 32 == 0, whichever mix of 64- and 32-column steps its sub-blocks take. */
static inline void prefetch4_crossing(const uint8_t *const row[4], size_t ahead, size_t b,
                                      size_t len) {
    const size_t p = (b + 63u) & ~(size_t)63u;
    if (p < b + len)
        for (int i = 0; i < 4; i++) _mm_prefetch((const char *)row[i] + ahead + p, _MM_HINT_T1);
}

/* Four rows at once (G <= 512, so every sub-block sum fits int32): four streams of index
 * bytes in flight, one activation load per four rows, the four sub-block sums reduced together
 * (vphaddd) and combined with their scales in four double lanes (the definition's multiply,
 * then add, in sub-block order). */
AVX2_FN static void rows4_avx2(float *y, const QuantActs *qa, const I8Layout *L, int r,
                               int cols) {
    const uint8_t *row[4];
    for (int i = 0; i < 4; i++) row[i] = L->indices + (size_t)(r + i) * L->row_bytes;
    const int full = cols & ~31;
    /* the centroids of the rows 8 ahead into L2 here, their index lines in the column loop */
    const size_t ahead = i8_prefetch_ahead(L, row[3]);
    prefetch_tables4(L, r);
    const __m256i low4 = _mm256_set1_epi8(0x0f), m_pick = M_PICK;
    __m256d acc = _mm256_setzero_pd();
    for (int s = 0; s < L->n_sub; s++) {
        __m256i tbl[4];
        tables4(tbl, L, r, s);
        int c0 = s * L->group_size;
        int c1 = c0 + L->group_size < cols ? c0 + L->group_size : cols;
        int stop = c1 < full ? c1 : full;
        __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
        int c = c0;
        for (; c + 64 <= stop; c += 64) { /* no calls: everything stays in registers */
            __m256i qe, qo, ae, ao, m;
            acts64(qa, c, m_pick, &qe, &qo, &ae, &ao, &m);
            prefetch4_crossing(row, ahead, (size_t)c / 2, 32);
            a0 = _mm256_add_epi32(a0, block64(row[0] + c / 2, tbl[0], qe, qo, ae, ao, m, low4));
            a1 = _mm256_add_epi32(a1, block64(row[1] + c / 2, tbl[1], qe, qo, ae, ao, m, low4));
            a2 = _mm256_add_epi32(a2, block64(row[2] + c / 2, tbl[2], qe, qo, ae, ao, m, low4));
            a3 = _mm256_add_epi32(a3, block64(row[3] + c / 2, tbl[3], qe, qo, ae, ao, m, low4));
        }
        for (; c < stop; c += 32) { /* a last 32 columns of the sub-block */
            __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(qa->qp + c));
            __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)(qa->aqp + c));
            __m256i m = _mm256_set1_epi16(qa->m16[c / 32]);
            prefetch4_crossing(row, ahead, (size_t)c / 2, 16);
            a0 = _mm256_add_epi32(a0, block32(row[0] + c / 2, tbl[0], q, a, m));
            a1 = _mm256_add_epi32(a1, block32(row[1] + c / 2, tbl[1], q, a, m));
            a2 = _mm256_add_epi32(a2, block32(row[2] + c / 2, tbl[2], q, a, m));
            a3 = _mm256_add_epi32(a3, block32(row[3] + c / 2, tbl[3], q, a, m));
        }
        if (c < c1) { /* the rows' partial last chunk: zero-padded copies */
            __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(qa->qp + c));
            __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)(qa->aqp + c));
            __m256i m = _mm256_set1_epi16(qa->m16[c / 32]);
            uint8_t t[4][16];
            for (int i = 0; i < 4; i++) i8_tail_indices(t[i], row[i], c, cols);
            a0 = _mm256_add_epi32(a0, block32(t[0], tbl[0], q, a, m));
            a1 = _mm256_add_epi32(a1, block32(t[1], tbl[1], q, a, m));
            a2 = _mm256_add_epi32(a2, block32(t[2], tbl[2], q, a, m));
            a3 = _mm256_add_epi32(a3, block32(t[3], tbl[3], q, a, m));
        }
        __m256d T = _mm256_cvtepi32_pd(hsum4_epi32(a0, a1, a2, a3));
        acc = _mm256_add_pd(acc, _mm256_mul_pd(scales4_pd(L, r, s), T));
    }
    store4_combined(y + r, acc, qa->D);
}

/* Four rows at once from tiled indices (qgemv.h i8_b4_at; i8_tiles_fit: G % 64 == 0, G <= 512,
 * cols % 64 == 0): rows4_avx2's arithmetic, with each 64-column step's index bytes of the four
 * rows one 128-byte run of the tile, so the tensor is read as one sequential stream. The lines
 * `ahead` bytes on (stream_prefetch_ahead) are prefetched into L2 (docs/KERNELS.md "Row tiles":
 * 482 us against 565-588 without, 8960 x 1536 from DRAM on the Zen 3 measured, 2 KiB ahead). */
AVX2_FN static void rows4_tiled_avx2(float *y, const QuantActs *qa, const I8Layout *L, int r,
                                     int cols, size_t ahead) {
    const uint8_t *w = L->indices + (size_t)r * L->row_bytes; /* the tile, read in order */
    prefetch_tables4(L, r);
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    __m256d acc = _mm256_setzero_pd();
    for (int s = 0; s < L->n_sub; s++) {
        __m256i tbl[4];
        tables4(tbl, L, r, s);
        int c0 = s * L->group_size;
        int c1 = c0 + L->group_size < cols ? c0 + L->group_size : cols;
        __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
        const int8_t *qp = qa->qp64 + c0;
        const uint8_t *ap = qa->aqp64 + c0;
        const int16_t *mp = qa->m64 + c0 / 4;
        for (int c = c0; c < c1; c += 64, w += I8_TILE_ROWS * I8_TILE_CHUNK) {
            __m256i qe, qo, ae, ao, m;
            acts64_p64(qp, ap, mp, &qe, &qo, &ae, &ao, &m);
            qp += 64, ap += 64, mp += 16;
            _mm_prefetch((const char *)w + ahead, _MM_HINT_T1);
            _mm_prefetch((const char *)w + ahead + 64, _MM_HINT_T1);
            a0 = _mm256_add_epi32(a0, block64(w, tbl[0], qe, qo, ae, ao, m, low4));
            a1 = _mm256_add_epi32(a1, block64(w + 32, tbl[1], qe, qo, ae, ao, m, low4));
            a2 = _mm256_add_epi32(a2, block64(w + 64, tbl[2], qe, qo, ae, ao, m, low4));
            a3 = _mm256_add_epi32(a3, block64(w + 96, tbl[3], qe, qo, ae, ao, m, low4));
        }
        __m256d T = _mm256_cvtepi32_pd(hsum4_epi32(a0, a1, a2, a3));
        acc = _mm256_add_pd(acc, _mm256_mul_pd(scales4_pd(L, r, s), T));
    }
    store4_combined(y + r, acc, qa->D);
}

/* Rows [r0, r1) of a tiled b = 4 tensor (r0 and r1 multiples of I8_TILE_ROWS: the threads'
 * chunks, kernels.c row_chunks, cut at multiples of 16, and a tiled tensor has rows % 4 == 0). */
AVX2_FN void i8cb_b4_tiled_rows_avx2(float *y, const QuantActs *qa, const I8Layout *L, int r0,
                                     int r1, int cols) {
    const size_t ahead = stream_prefetch_ahead();
    for (int r = r0; r < r1; r += I8_TILE_ROWS) rows4_tiled_avx2(y, qa, L, r, cols, ahead);
}

AVX2_FN void i8cb_b4_rows_avx2(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                               int cols) {
    int64_t T0[L->n_sub], T1[L->n_sub];
    int r = r0;
    if (L->group_size <= 512)
        for (; r + 4 <= r1; r += 4) rows4_avx2(y, qa, L, r, cols);
    for (; r < r1; r += 2) rows2_avx2(y, qa, L, r, r + 1 < r1 ? r + 1 : r, cols, T0, T1);
}

/* ---- b = 4 over 128 columns per step (perm128 activations), ymm VNNI ----
 * qgemv_avx512.c's 128-column kernel in 256-bit registers: per 64 columns (32 index bytes)
 * the low nibbles (vpand 0x0f) and the high nibbles (16-bit shift by 4, vpand) are looked up
 * with vpshufb in the table of w + 128 (both halves), and four vpdpbusd multiply them by the
 * signed bytes ml, mh of m * q in perm128 order (the even columns of the 64 are perm128
 * entries 0..31 or 32..63 of their chunk, the odd ones 64 further); T = lo + 256 hi - corr
 * (qgemv.h act_vnni_corrections), formed modulo 2^32 (G <= 512: |T| < 2^31). Four rows at
 * a time; other G and the last r1 - r0 mod 4 rows go to the AVX2 kernel (the same bits).
 * (The same with the EVEX vpdpbusd on ymm0..31 was slower than the zmm kernel on the
 * Sapphire Rapids measured: docs/KERNELS.md.) */
#define AVXVNNI_F16C_FN __attribute__((target("avx2,f16c,avxvnni")))
#define DPBUSD_VEX(acc, a, b) _mm256_dpbusd_avx_epi32((acc), (a), (b))

/* 64 columns (index bytes at ip, activations at perm128 entry e of chunk c) of one row */
#define STEP64Y(DP, ip, e, tbl, lo, hi)                                                        \
    do {                                                                                       \
        __m256i v_ = _mm256_loadu_si256((const __m256i *)(const void *)(ip));                  \
        __m256i we_ = _mm256_shuffle_epi8(tbl, _mm256_and_si256(v_, low4));                    \
        __m256i wo_ =                                                                          \
            _mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_srli_epi16(v_, 4), low4));        \
        lo = DP(DP(lo, we_, LD256(qa->ml + c + (e))), wo_, LD256(qa->ml + c + (e) + 64));      \
        hi = DP(DP(hi, we_, LD256(qa->mh + c + (e))), wo_, LD256(qa->mh + c + (e) + 64));      \
    } while (0)
#define LD256(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))

#define I8CB_B4_ROWS4_128Y(NAME, FN, DP)                                                       \
    FN static void NAME##_rows4(float *y, const QuantActs *qa, const I8Layout *L, int r,       \
                                int cols, const uint32_t *corr) {                              \
        const uint8_t *row[4];                                                                 \
        i8_b4_rows4_begin(L, r, row, 1);                                                        \
        const int full = cols & ~127;                                                          \
        const __m256i low4 = _mm256_set1_epi8(0x0f), flip = _mm256_set1_epi8(-128);            \
        __m256d acc = _mm256_setzero_pd();                                                     \
        for (int s = 0; s < L->n_sub; s++) {                                                   \
            const int8_t *cb = L->cent + ((size_t)r * (size_t)L->n_sub + (size_t)s) * 16u;     \
            const size_t cs = (size_t)L->n_sub * 16u;                                          \
            const __m256i t0 = _mm256_xor_si256(flip, _mm256_broadcastsi128_si256(             \
                                                          LD128(cb)));                         \
            const __m256i t1 = _mm256_xor_si256(flip, _mm256_broadcastsi128_si256(             \
                                                          LD128(cb + cs)));                    \
            const __m256i t2 = _mm256_xor_si256(flip, _mm256_broadcastsi128_si256(             \
                                                          LD128(cb + 2 * cs)));                \
            const __m256i t3 = _mm256_xor_si256(flip, _mm256_broadcastsi128_si256(             \
                                                          LD128(cb + 3 * cs)));                \
            int c0 = s * L->group_size;                                                        \
            int c1 = c0 + L->group_size < cols ? c0 + L->group_size : cols;                    \
            int stop = c1 < full ? c1 : full;                                                  \
            __m256i l0 = _mm256_setzero_si256(), l1 = l0, l2 = l0, l3 = l0;                    \
            __m256i h0 = l0, h1 = l0, h2 = l0, h3 = l0;                                        \
            int c = c0;                                                                        \
            for (; c < stop; c += 128) { /* no calls: everything stays in registers */        \
                STEP64Y(DP, row[0] + c / 2, 0, t0, l0, h0);                                    \
                STEP64Y(DP, row[1] + c / 2, 0, t1, l1, h1);                                    \
                STEP64Y(DP, row[2] + c / 2, 0, t2, l2, h2);                                    \
                STEP64Y(DP, row[3] + c / 2, 0, t3, l3, h3);                                    \
                STEP64Y(DP, row[0] + c / 2 + 32, 32, t0, l0, h0);                              \
                STEP64Y(DP, row[1] + c / 2 + 32, 32, t1, l1, h1);                              \
                STEP64Y(DP, row[2] + c / 2 + 32, 32, t2, l2, h2);                              \
                STEP64Y(DP, row[3] + c / 2 + 32, 32, t3, l3, h3);                              \
            }                                                                                  \
            if (c < c1) { /* the rows' partial last step: zero-padded copies */                \
                uint8_t tl[4][64];                                                             \
                memset(tl, 0, sizeof tl);                                                      \
                size_t nb = (size_t)ditto_cb_row_bytes((uint64_t)(cols - c), 4u);              \
                for (int i = 0; i < 4; i++) memcpy(tl[i], row[i] + c / 2, nb);                 \
                STEP64Y(DP, tl[0], 0, t0, l0, h0);                                             \
                STEP64Y(DP, tl[1], 0, t1, l1, h1);                                             \
                STEP64Y(DP, tl[2], 0, t2, l2, h2);                                             \
                STEP64Y(DP, tl[3], 0, t3, l3, h3);                                             \
                STEP64Y(DP, tl[0] + 32, 32, t0, l0, h0);                                       \
                STEP64Y(DP, tl[1] + 32, 32, t1, l1, h1);                                       \
                STEP64Y(DP, tl[2] + 32, 32, t2, l2, h2);                                       \
                STEP64Y(DP, tl[3] + 32, 32, t3, l3, h3);                                       \
            }                                                                                  \
            __m128i T = _mm_sub_epi32(                                                         \
                hsum4_epi32(_mm256_add_epi32(l0, _mm256_slli_epi32(h0, 8)),                    \
                            _mm256_add_epi32(l1, _mm256_slli_epi32(h1, 8)),                    \
                            _mm256_add_epi32(l2, _mm256_slli_epi32(h2, 8)),                    \
                            _mm256_add_epi32(l3, _mm256_slli_epi32(h3, 8))),                   \
                _mm_set1_epi32((int)corr[s]));                                                 \
            acc = _mm256_add_pd(acc,                                                           \
                                _mm256_mul_pd(scales4_pd(L, r, s), _mm256_cvtepi32_pd(T)));    \
        }                                                                                      \
        store4_combined(y + r, acc, qa->D);                                                    \
    }                                                                                          \
    FN void NAME(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1, int cols) { \
        i8cb_b4_rows4_run(NAME##_rows4, i8cb_b4_rows_avx2, y, qa, L, r0, r1, cols);            \
    }
#define LD128(p) _mm_loadu_si128((const __m128i *)(const void *)(p))

I8CB_B4_ROWS4_128Y(i8cb_b4_rows_avxvnni, AVXVNNI_F16C_FN, DPBUSD_VEX)


/* ---- any b in 1..8 (natural column order), AVX2 + BMI2 ----
 * Per 32 columns: each group of 8 b-bit indices is one pdep (BMI2) away from 8 index bytes
 * (the group's 8b bits deposited into the low b bits of each byte); the 32 bytes are looked up
 * in the sub-block's K int8 centroids with K/16 vpshufb (16-entry tables) joined by vpblendvb
 * on index bits 4..7 (each moved to the byte's top bit by a shift); then as for b = 4, with
 * the activations in natural order (q and |q| = vpabsb q). */

/* int32 lanes of m * sum(q * w) for 32 columns at c in natural order, w = the int8 weights. */
AVX2_FN static inline __m256i dot32_natural(const QuantActs *qa, int c, __m256i w) {
    __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(qa->q + c));
    __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(w, q));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(qa->m16[c / 32]));
}

/* The columns of the row at `row` whose 32-column chunks chunk_indices() may read with whole
 * 8-byte group loads (none of them past the payload's end): a multiple of 32. */
static inline int group_load_cols(const I8Layout *L, const uint8_t *row, int cols) {
    const size_t b = (size_t)L->bits;
    int fast = cols & ~31;
    while (fast > 0 &&
           L->end - (row + (size_t)((fast - 32) / 8) * b) < (ptrdiff_t)(3 * b + 8))
        fast -= 32;
    return fast;
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
        int fast = group_load_cols(L, row, cols);
        for (int s = 0; s < L->n_sub; s++) {
            load_tables(tbl, L->cent + ((size_t)r * (size_t)L->n_sub + (size_t)s) * (size_t)L->k,
                        L->k, k);
            int c0 = s * L->group_size;
            int c1 = c0 + L->group_size < cols ? c0 + L->group_size : cols;
            int64_t t = 0;
            for (int c = c0; c < c1;) {
                int stop = c + 128 * 32 < c1 ? c + 128 * 32 : c1; /* int32 lanes stay exact */
                int stop_fast = stop < fast ? stop : fast;
                __m256i acc = _mm256_setzero_si256();
                for (; c < stop_fast; c += 32) {
                    __m256i idx = chunk_indices(row, c, cols, b, dep, L->end, 1);
                    acc = _mm256_add_epi32(acc, dot32_natural(qa, c, lookup_k(idx, tbl, k)));
                }
                for (; c < stop; c += 32) {
                    __m256i idx = chunk_indices(row, c, cols, b, dep, L->end, 0);
                    acc = _mm256_add_epi32(acc, dot32_natural(qa, c, lookup_k(idx, tbl, k)));
                }
                t += hsum_epi32_wide(acc);
            }
            T[s] = t;
        }
        y[r] = combine_f16c(L, r, T, qa->D);
    }
}

/* ---- b = 6, AVX2 (natural column order) ----
 * 32 indices are 24 bytes (4 indices per 3 bytes, FORMAT.md). Both 128-bit halves get 16 bytes
 * (bytes 0..15 and 8..23, so nothing past the chunk is read); vpshufb places under each index
 * the 16-bit word that holds it, vpmullw moves the index's 6 bits to the word's top and a shift
 * by 10 brings them down (index k of a 3-byte group sits at bit 0, 6, 12 or 18, i.e. bit 0 or 6
 * of the word at byte 0, bit 4 or 10 of the word at byte 1); vpackuswb joins the two word
 * vectors in column order. The 64 centroids are four 16-entry vpshufb tables joined by
 * vpblendvb on index bits 4 and 5. */
AVX2_FN void i8cb_b6_rows_avx2(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                               int cols) {
    int64_t T[L->n_sub];
    const int full = cols & ~31;
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = L->indices + (size_t)r * L->row_bytes;
        /* the index bytes and centroids of the row 4 ahead, into L2 */
        prefetch_bytes(L->indices, (size_t)(r + 4) * L->row_bytes, L->row_bytes,
                       (size_t)(L->end - L->indices));
        prefetch_bytes(L->cent, (size_t)(r + 4) * (size_t)L->n_sub * 64u, (size_t)L->n_sub * 64u,
                       (size_t)((const int8_t *)(const void *)L->scale - L->cent));
        for (int s = 0; s < L->n_sub; s++) {
            const int8_t *cb = L->cent + ((size_t)r * (size_t)L->n_sub + (size_t)s) * 64u;
            __m256i t[4];
            for (int i = 0; i < 4; i++)
                t[i] = _mm256_broadcastsi128_si256(
                    _mm_loadu_si128((const __m128i *)(const void *)(cb + 16 * i)));
            int c0 = s * L->group_size;
            int c1 = c0 + L->group_size < cols ? c0 + L->group_size : cols;
            int64_t sum = 0;
            for (int c = c0; c < c1;) {
                int stop = c + 128 * 32 < c1 ? c + 128 * 32 : c1; /* int32 lanes stay exact */
                int stop_full = stop < full ? stop : full;
                __m256i acc = _mm256_setzero_si256();
                for (; c < stop_full; c += 32) {
                    __m256i w = b6_lookup(b6_indices(row + (size_t)c / 32 * 24u), t[0], t[1],
                                          t[2], t[3]);
                    acc = _mm256_add_epi32(acc, dot32_natural(qa, c, w));
                }
                if (c < stop) { /* the row's partial last chunk: a zero-padded copy */
                    uint8_t tail[24] = {0};
                    memcpy(tail, row + (size_t)c / 32 * 24u,
                           (size_t)ditto_cb_row_bytes((uint64_t)(cols - c), 6u));
                    __m256i w = b6_lookup(b6_indices(tail), t[0], t[1], t[2], t[3]);
                    acc = _mm256_add_epi32(acc, dot32_natural(qa, c, w));
                    c = stop;
                }
                sum += hsum_epi32_wide(acc);
            }
            T[s] = sum;
        }
        y[r] = combine_f16c(L, r, T, qa->D);
    }
}

/* ---- b = 5, AVX2 (natural column order) ----
 * 32 indices are 20 bytes (8 per 5 bytes, FORMAT.md); index j of a group starts at bit 5j,
 * i.e. at bit 0, 5, 2, 7, 4, 1, 6 or 3 of the byte 5j / 8, inside the 16-bit word there. The
 * low 128-bit half gets bytes 0..15 (indices 0..15 lie in bytes 0..9), the high half bytes
 * 4..19 (indices 16..31 lie in bytes 10..19; the last index fits in byte 19 alone, so no byte
 * past the 20 is read); vpshufb places under each index its word, vpmullw by 2^(11 - bit)
 * moves the index to bits 11..15 (dropping the bits above it) and a shift by 11 brings it
 * down; vpackuswb joins the two word vectors in column order. The 32 centroids are two
 * 16-entry vpshufb tables joined by vpblendvb on index bit 4. Then as dot32_natural. Four rows
 * at a time share the activation loads (a last group of fewer rows repeats its last row);
 * sums in runs of at most 512 columns, each run's int32 total exact and added in double. */

/* 32 b = 5 indices (natural column order) from the 20 bytes at p. */
AVX2_FN static inline __m256i b5_indices(const uint8_t *p) {
    const __m256i lo_words = _mm256_setr_epi8(0, 1, 0, 1, 1, 2, 1, 2, 2, 3, 3, 4, 3, 4, 4, 5,
                                              6, 7, 6, 7, 7, 8, 7, 8, 8, 9, 9, 10, 9, 10, 10, 11);
    const __m256i hi_words = _mm256_setr_epi8(5, 6, 5, 6, 6, 7, 6, 7, 7, 8, 8, 9, 8, 9, 9, 10,
                                              11, 12, 11, 12, 12, 13, 12, 13, 13, 14, 14, 15, 14,
                                              15, 15, -128);
    const __m256i to_top = _mm256_setr_epi16(2048, 64, 512, 16, 128, 1024, 32, 256, 2048, 64,
                                             512, 16, 128, 1024, 32, 256);
    __m256i v = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)p)),
        _mm_loadu_si128((const __m128i *)(const void *)(p + 4)), 1);
    __m256i a =
        _mm256_srli_epi16(_mm256_mullo_epi16(_mm256_shuffle_epi8(v, lo_words), to_top), 11);
    __m256i b =
        _mm256_srli_epi16(_mm256_mullo_epi16(_mm256_shuffle_epi8(v, hi_words), to_top), 11);
    return _mm256_packus_epi16(a, b);
}

/* 32 int8 centroids for 32 indices in 0..31 (vpshufb reads bits 0..3, bit 7 is clear). */
AVX2_FN static inline __m256i b5_lookup(__m256i idx, __m256i t0, __m256i t1) {
    return _mm256_blendv_epi8(_mm256_shuffle_epi8(t0, idx), _mm256_shuffle_epi8(t1, idx),
                              _mm256_slli_epi16(idx, 3));
}

/* int32 lanes of m * sum(q * w) for 32 columns, q and |q| = aq loaded, m broadcast. */
#define B5_DOT(acc, w) \
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(aq, _mm256_sign_epi8((w), q)), m))

/* Rows r .. r + n - 1 (1 <= n <= 4). */
AVX2_FN static void b5_rows4_avx2(float *y, const QuantActs *qa, const I8Layout *L, int r, int n,
                                  int cols) {
    int rr[4];
    const uint8_t *row[4];
    for (int i = 0; i < 4; i++) {
        rr[i] = r + (i < n ? i : n - 1);
        row[i] = L->indices + (size_t)rr[i] * L->row_bytes;
    }
    const int full = cols & ~31;
    const size_t cs = (size_t)L->n_sub * 32u;
    const size_t ahead = i8_prefetch_ahead(L, row[3]);
    prefetch_bytes(L->cent, (size_t)(r + 8) * cs, 4 * cs,
                   (size_t)((const int8_t *)(const void *)L->scale - L->cent));
    __m256d acc = _mm256_setzero_pd();
    for (int s = 0; s < L->n_sub; s++) {
        __m256i tl[4], th[4];
        for (int i = 0; i < 4; i++) {
            const int8_t *cb = L->cent + (size_t)rr[i] * cs + (size_t)s * 32u;
            tl[i] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)cb));
            th[i] = _mm256_broadcastsi128_si256(
                _mm_loadu_si128((const __m128i *)(const void *)(cb + 16)));
        }
        int c0 = s * L->group_size;
        int c1 = c0 + L->group_size < cols ? c0 + L->group_size : cols;
        __m256d T = _mm256_setzero_pd();
        for (int c = c0; c < c1;) {
            int run = c + 512 < c1 ? c + 512 : c1; /* |sum of the run| < 2^31 */
            int stop = run < full ? run : full;
            __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
            for (; c < run; c += 32) { /* no calls: everything stays in registers */
                const size_t o = (size_t)c / 8 * 5u;
                const __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(qa->q + c));
                const __m256i aq = _mm256_abs_epi8(q);
                const __m256i m = _mm256_set1_epi16(qa->m16[c / 32]);
                if (c < stop) {
                    prefetch4_crossing(row, ahead, o, 20);
                    B5_DOT(a0, b5_lookup(b5_indices(row[0] + o), tl[0], th[0]));
                    B5_DOT(a1, b5_lookup(b5_indices(row[1] + o), tl[1], th[1]));
                    B5_DOT(a2, b5_lookup(b5_indices(row[2] + o), tl[2], th[2]));
                    B5_DOT(a3, b5_lookup(b5_indices(row[3] + o), tl[3], th[3]));
                } else { /* the rows' partial last chunk: zero-padded copies */
                    uint8_t t[4][20];
                    memset(t, 0, sizeof t);
                    size_t nb = (size_t)ditto_cb_row_bytes((uint64_t)(cols - c), 5u);
                    for (int i = 0; i < 4; i++) memcpy(t[i], row[i] + o, nb);
                    B5_DOT(a0, b5_lookup(b5_indices(t[0]), tl[0], th[0]));
                    B5_DOT(a1, b5_lookup(b5_indices(t[1]), tl[1], th[1]));
                    B5_DOT(a2, b5_lookup(b5_indices(t[2]), tl[2], th[2]));
                    B5_DOT(a3, b5_lookup(b5_indices(t[3]), tl[3], th[3]));
                }
            }
            T = _mm256_add_pd(T, _mm256_cvtepi32_pd(hsum4_epi32(a0, a1, a2, a3)));
        }
        acc = _mm256_add_pd(acc, _mm256_mul_pd(scales4_rows_pd(L, rr, s), T));
    }
    storen_combined(y + r, acc, qa->D, n);
}
#undef B5_DOT

AVX2_FN void i8cb_b5_rows_avx2(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                               int cols) {
    for (int r = r0; r < r1; r += 4) b5_rows4_avx2(y, qa, L, r, r1 - r < 4 ? r1 - r : 4, cols);
}

/* ---- weights decoded to int8 at load (L->w8; kernels_decode_tensor), tiles of 4 rows ----
 * One tile (qgemv.h DEC8_TILE) at a time, read front to back: per 32 columns, the four rows'
 * 32-byte chunks lie side by side, each through dot32_natural's steps (the sign of q onto w,
 * |q| unsigned, vpmaddubsw, vpmaddwd by m) with the activation loads shared. The int32 lanes
 * move to int64 every 128 chunks, as in the lookup kernels, and each row's sub-block sums are
 * combined by combine_f16c: the same bits. r0 is a multiple of DEC8_TILE (the threads' chunks
 * start on multiples of 16); the zero rows that pad the last tile are summed and dropped.
 * The two lines stream_prefetch_ahead() bytes ahead of each step's 128 bytes are prefetched
 * into L2: from DRAM the hardware prefetchers alone fed this loop at 77 % of a STREAM read,
 * these prefetches at 86 % (2 KiB ahead on the Xeon measured; docs/KERNELS.md "Decoded
 * classifier"). A prefetch past the tensor's end is harmless (no fault, nothing read into
 * registers). */
AVX2_FN void i8_dec8_rows_avx2(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                               int cols) {
    const size_t ahead = stream_prefetch_ahead();
    const size_t stride = dec8_stride(cols);
    int64_t T[DEC8_TILE][L->n_sub];
    for (int r = r0; r < r1; r += DEC8_TILE) {
        int n = r1 - r < DEC8_TILE ? r1 - r : DEC8_TILE;
        const int8_t *tile = L->w8 + (size_t)r * stride; /* r / DEC8_TILE tiles before it */
        for (int s = 0; s < L->n_sub; s++) {
            int c0 = s * L->group_size;
            int c1 = c0 + L->group_size < cols ? c0 + L->group_size : cols;
            int64_t t0 = 0, t1 = 0, t2 = 0, t3 = 0;
            for (int c = c0; c < c1;) {
                int stop = c + 128 * 32 < c1 ? c + 128 * 32 : c1; /* int32 lanes stay exact */
                __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
                for (; c < stop; c += 32) { /* no calls: everything stays in registers */
                    __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(qa->q + c));
                    __m256i aq = _mm256_abs_epi8(q);
                    __m256i m = _mm256_set1_epi16(qa->m16[c / 32]);
                    const int8_t *w = tile + (size_t)c * DEC8_TILE; /* chunk c / 32 */
                    _mm_prefetch((const char *)w + ahead, _MM_HINT_T1);
                    _mm_prefetch((const char *)w + ahead + 64, _MM_HINT_T1);
#define DEC8_DOT(i, acc)                                                                       \
    acc = _mm256_add_epi32(                                                                    \
        acc, _mm256_madd_epi16(                                                                \
                 _mm256_maddubs_epi16(                                                         \
                     aq, _mm256_sign_epi8(                                                     \
                             _mm256_loadu_si256((const __m256i *)(const void *)(w + 32 * (i))), \
                             q)),                                                              \
                 m))
                    DEC8_DOT(0, a0);
                    DEC8_DOT(1, a1);
                    DEC8_DOT(2, a2);
                    DEC8_DOT(3, a3);
#undef DEC8_DOT
                }
                t0 += hsum_epi32_wide(a0);
                t1 += hsum_epi32_wide(a1);
                t2 += hsum_epi32_wide(a2);
                t3 += hsum_epi32_wide(a3);
            }
            T[0][s] = t0;
            T[1][s] = t1;
            T[2][s] = t2;
            T[3][s] = t3;
        }
        for (int i = 0; i < n; i++) y[r + i] = combine_f16c(L, r + i, T[i], qa->D);
    }
}

/* kernels_decode_tensor's decoding with the lookup kernels' own steps, 32 columns at a time:
 * b = 6 through b6_indices + b6_lookup, other b through pdep + lookup_k; a row's partial last
 * chunk (and, for other b, chunks whose 8-byte group reads would pass the payload) through the
 * scalar decoder. */
__attribute__((always_inline)) AVX2_BMI2_FN static inline void
decode_rows_k(int8_t *w8, const I8Layout *L, int r0, int r1, int cols, const int k) {
    const int b = L->bits;
    const uint64_t dep = ((UINT64_C(1) << b) - 1u) * UINT64_C(0x0101010101010101);
    __m256i tbl[16];
    for (int i = 0; i < 16; i++) tbl[i] = _mm256_setzero_si256();
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = L->indices + (size_t)r * L->row_bytes;
        int fast = b == 6 ? cols & ~31 : group_load_cols(L, row, cols);
        for (int s = 0; s < L->n_sub; s++) {
            load_tables(tbl, L->cent + ((size_t)r * (size_t)L->n_sub + (size_t)s) * (size_t)L->k,
                        L->k, k);
            int c0 = s * L->group_size;
            int c1 = c0 + L->group_size < fast ? c0 + L->group_size : fast;
            for (int c = c0; c < c1; c += 32) {
                __m256i w = b == 6 ? b6_lookup(b6_indices(row + (size_t)c / 32 * 24u), tbl[0],
                                               tbl[1], tbl[2], tbl[3])
                                   : lookup_k(chunk_indices(row, c, cols, b, dep, L->end, 1),
                                              tbl, k);
                _mm256_storeu_si256((__m256i *)(void *)(w8 + dec8_offset(r, c, cols)), w);
            }
        }
        if (fast < cols) i8_decode_cols_generic(w8, L, r, fast, cols);
    }
}

AVX2_BMI2_FN void i8_decode_rows_avx2(int8_t *w8, const I8Layout *L, int r0, int r1, int cols) {
    switch (L->k) {
    case 32: decode_rows_k(w8, L, r0, r1, cols, 32); break;
    case 64: decode_rows_k(w8, L, r0, r1, cols, 64); break;
    case 128: decode_rows_k(w8, L, r0, r1, cols, 128); break;
    case 256: decode_rows_k(w8, L, r0, r1, cols, 256); break;
    default: i8_decode_rows_generic(w8, L, r0, r1, cols); break;
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
