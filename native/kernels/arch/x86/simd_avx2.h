/* simd_avx2.h: the AVX2 building blocks shared by the integer GEMV (qgemv_avx2.c) and GEMM
 * (qgemm_avx2.c) kernels: b-bit index unpacking, int8 centroid lookup, int64 horizontal sums
 * and the float combine of qgemv.h. Internal to those files (static inline, x86 only). */
#ifndef DITTO_SIMD_AVX2_H
#define DITTO_SIMD_AVX2_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "../../kernels.h"
#include "../../qgemv.h"

#define AVX2_FN __attribute__((target("avx2,f16c")))
#define AVX2_BMI2_FN __attribute__((target("avx2,f16c,bmi2")))

/* 32 indices of b = 4 from 16 bytes: low nibbles in the low half, high nibbles in the high. */
AVX2_FN static inline __m256i nibbles32(const uint8_t *p) {
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
    __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

AVX2_FN static inline int64_t hsum_epi32_wide(__m256i v) {
    __m256i lo = _mm256_cvtepi32_epi64(_mm256_castsi256_si128(v));
    __m256i hi = _mm256_cvtepi32_epi64(_mm256_extracti128_si256(v, 1));
    __m256i s = _mm256_add_epi64(lo, hi);
    __m128i t = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    return _mm_cvtsi128_si64(t) + _mm_extract_epi64(t, 1);
}

/* The totals of four int32 lane vectors (exact when each total and partial sum fits int32:
 * a sub-block sum with G <= 512, |T| <= G * 127 * 32385 < 2^31). */
AVX2_FN static inline __m128i hsum4_epi32(__m256i a, __m256i b, __m256i c, __m256i d) {
    __m256i ab = _mm256_hadd_epi32(a, b), cd = _mm256_hadd_epi32(c, d);
    __m256i abcd = _mm256_hadd_epi32(ab, cd); /* per half: a, b, c, d */
    return _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256(abcd, 1));
}

/* Software prefetch of bytes [off, off + n) of base[size] into L2, one line per 64 bytes: the
 * weights of the rows a kernel reaches next. Decode streams every weight once per token; on
 * the machine measured, the hardware prefetcher alone left the b = 4 kernel waiting on its
 * index loads (docs/KERNELS.md "Where decode time goes"). */
static inline void prefetch_bytes(const void *base, size_t off, size_t n, size_t size) {
    for (size_t o = off; o < off + n && o < size; o += 64)
        _mm_prefetch((const char *)base + o, _MM_HINT_T1);
}

/* i8_combine() with the f16 scales converted by F16C (exact, as the scalar conversion).
 * This and the kernels' four-lane forms of acc + s * T may be contracted into a fused
 * multiply-add where the function's target has FMA (AVX-512F implies it) under Ditto's
 * -ffp-contract=fast: that rounds as the definition's multiply, then add, because s * T is
 * exact in double (an 11-bit f16 significand times |T| < 2^42 for any row of fewer than
 * 2^20 columns: |T| <= cols * 127 * 32385). */
AVX2_FN static inline float combine_f16c(const I8Layout *L, int r, const int64_t *T, float D) {
    const uint16_t *sc = L->scale + (size_t)r * (size_t)L->n_sub;
    double acc = 0.0;
    for (int s = 0; s < L->n_sub; s++) {
        double p = (double)_cvtsh_ss(sc[s]) * (double)T[s];
        acc = acc + p;
    }
    return (float)(acc * (double)D);
}

/* The index rows r..r+3 of a b = 4 tensor (16 centroids per sub-block) into row[], and the
 * centroids of rows r+8..r+11 prefetched, with their indices too when `indices` is set (the
 * kernels that prefetch indices inside their column loop pass 0). */
static inline void i8_b4_rows4_begin(const I8Layout *L, int r, const uint8_t *row[4],
                                     int indices) {
    for (int i = 0; i < 4; i++) row[i] = L->indices + (size_t)(r + i) * L->row_bytes;
    const size_t cent_bytes = (size_t)((const int8_t *)(const void *)L->scale - L->cent);
    if (indices)
        prefetch_bytes(L->indices, (size_t)(r + 8) * L->row_bytes, 4 * L->row_bytes,
                       (size_t)(L->end - L->indices));
    prefetch_bytes(L->cent, (size_t)(r + 8) * (size_t)L->n_sub * 16u, 4 * (size_t)L->n_sub * 16u,
                   cent_bytes);
}

/* How far past a row the kernels that prefetch inside their column loop read ahead: whole
 * rows, at least 8 KiB and at least four rows (measured on SmolLM2 decode and 4096 x 11008,
 * docs/KERNELS.md "In-loop prefetch"), or 0 when those rows would be past the tensor (the
 * kernel then prefetches its own rows again, which is harmless). row_last is the last of the
 * rows the kernel is reading. */
#define PREFETCH_AHEAD_BYTES 8192u
static inline size_t i8_prefetch_ahead(const I8Layout *L, const uint8_t *row_last) {
    size_t n = (PREFETCH_AHEAD_BYTES + L->row_bytes - 1) / L->row_bytes;
    if (n < 4) n = 4; /* fewer would land in the rows being read (four at a time) */
    return (size_t)(L->end - row_last) >= (n + 1) * L->row_bytes ? n * L->row_bytes : 0;
}

/* How far ahead of a stream read front to back (the row tiles, the decoded classifier's tiles)
 * its lines are prefetched into L2: 8 KiB on AMD CPUs, 2 KiB on others. On the Zen 4 measured
 * (table avx2), 8 KiB decoded ~1.2x faster than 2 KiB at 1 thread and ~1.08x at 2; on the
 * Xeon measured, the decoded classifier read 7-13 % slower at 4-8 KiB than at 2 KiB
 * (docs/KERNELS.md "Decoded classifier", "Row tiles"). */
static inline size_t stream_prefetch_ahead(void) {
    return __builtin_cpu_is("amd") ? 8192u : 2048u;
}

/* The f16 scales of sub-block s of rows r..r+3 as doubles (F16C: exact). */
AVX2_FN static inline __m256d scales4_pd(const I8Layout *L, int r, int s) {
    const uint16_t *sc = L->scale + (size_t)r * (size_t)L->n_sub + (size_t)s;
    __m128i sh = _mm_setr_epi16((short)sc[0], (short)sc[L->n_sub], (short)sc[2 * L->n_sub],
                                (short)sc[3 * L->n_sub], 0, 0, 0, 0);
    return _mm256_cvtps_pd(_mm_cvtph_ps(sh));
}

/* y[0..3] = (float)(acc * D): i8_combine's last step for four rows at once. */
AVX2_FN static inline void store4_combined(float *y, __m256d acc, float D) {
    _mm_storeu_ps(y, _mm256_cvtpd_ps(_mm256_mul_pd(acc, _mm256_set1_pd((double)D))));
}

/* The f16 scales of sub-block s of the rows rr[0..3] (any four rows; a last group of fewer
 * rows repeats its last one) as doubles (F16C: exact). */
AVX2_FN static inline __m256d scales4_rows_pd(const I8Layout *L, const int rr[4], int s) {
    const uint16_t *sc = L->scale + (size_t)s;
    const size_t ns = (size_t)L->n_sub;
    __m128i sh = _mm_setr_epi16((short)sc[(size_t)rr[0] * ns], (short)sc[(size_t)rr[1] * ns],
                                (short)sc[(size_t)rr[2] * ns], (short)sc[(size_t)rr[3] * ns],
                                0, 0, 0, 0);
    return _mm256_cvtps_pd(_mm_cvtph_ps(sh));
}

/* y[0..n-1] = (float)(acc * D) for the first n <= 4 lanes: store4_combined for a last group
 * of fewer than four rows. */
AVX2_FN static inline void storen_combined(float *y, __m256d acc, float D, int n) {
    if (n == 4) {
        store4_combined(y, acc, D);
    } else {
        float out[4];
        store4_combined(out, acc, D);
        memcpy(y, out, (size_t)n * sizeof *out);
    }
}

/* Four rows r..r+3 of a VNNI b = 4 kernel, given the GEMV's per-sub-block corrections. */
typedef void (*I8Rows4Fn)(float *y, const QuantActs *qa, const I8Layout *L, int r, int cols,
                          const uint32_t *corr);

/* The entry of the four-row VNNI b = 4 kernels: when G is a multiple of 128 up to 512, the
 * corrections (act_vnni_corrections) once, then rows in fours through rows4; other G and the
 * last (r1 - r0) mod 4 rows through `rest` (the AVX2 kernel: the same bits). */
static inline void i8cb_b4_rows4_run(I8Rows4Fn rows4, I8RowsFn rest, float *y,
                                     const QuantActs *qa, const I8Layout *L, int r0, int r1,
                                     int cols) {
    if (L->group_size % 128 != 0 || L->group_size > 512) {
        rest(y, qa, L, r0, r1, cols);
        return;
    }
    uint32_t corr[L->n_sub];
    act_vnni_corrections(corr, qa, L->n_sub, L->group_size, cols);
    int r = r0;
    for (; r + 4 <= r1; r += 4) rows4(y, qa, L, r, cols, corr);
    if (r < r1) rest(y, qa, L, r, r1, cols);
}

/* 32 b = 6 indices (natural column order) from the 24 bytes at p (qgemv_avx2.c explains how). */
AVX2_FN static inline __m256i b6_indices(const uint8_t *p) {
    const __m256i lo_words = _mm256_setr_epi8(0, 1, 0, 1, 1, 2, 1, 2, 3, 4, 3, 4, 4, 5, 4, 5,
                                              4, 5, 4, 5, 5, 6, 5, 6, 7, 8, 7, 8, 8, 9, 8, 9);
    const __m256i hi_words = _mm256_setr_epi8(6, 7, 6, 7, 7, 8, 7, 8, 9, 10, 9, 10, 10, 11, 10,
                                              11, 10, 11, 10, 11, 11, 12, 11, 12, 13, 14, 13, 14,
                                              14, 15, 14, 15);
    const __m256i to_top = _mm256_setr_epi16(1024, 16, 64, 1, 1024, 16, 64, 1, 1024, 16, 64, 1,
                                             1024, 16, 64, 1);
    __m256i v = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)p)),
        _mm_loadu_si128((const __m128i *)(const void *)(p + 8)), 1);
    __m256i a =
        _mm256_srli_epi16(_mm256_mullo_epi16(_mm256_shuffle_epi8(v, lo_words), to_top), 10);
    __m256i b =
        _mm256_srli_epi16(_mm256_mullo_epi16(_mm256_shuffle_epi8(v, hi_words), to_top), 10);
    return _mm256_packus_epi16(a, b);
}

/* 32 int8 centroids for 32 indices in 0..63 (vpshufb reads bits 0..3, bit 7 is clear). */
AVX2_FN static inline __m256i b6_lookup(__m256i idx, __m256i t0, __m256i t1, __m256i t2,
                                        __m256i t3) {
    __m256i bit4 = _mm256_slli_epi16(idx, 3), bit5 = _mm256_slli_epi16(idx, 2);
    __m256i lo =
        _mm256_blendv_epi8(_mm256_shuffle_epi8(t0, idx), _mm256_shuffle_epi8(t1, idx), bit4);
    __m256i hi =
        _mm256_blendv_epi8(_mm256_shuffle_epi8(t2, idx), _mm256_shuffle_epi8(t3, idx), bit4);
    return _mm256_blendv_epi8(lo, hi, bit5);
}

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

/* The sub-block's K int8 centroids as k/16 tables of 16 (broadcast to both halves); a table of
 * fewer than 16 (b < 4) is zero-padded. */
__attribute__((always_inline)) AVX2_FN static inline void load_tables(__m256i *tbl,
                                                                      const int8_t *cb, int K,
                                                                      const int k) {
    if (K >= 16) {
        for (int i = 0; i < k / 16; i++)
            tbl[i] = _mm256_broadcastsi128_si256(
                _mm_loadu_si128((const __m128i *)(const void *)(cb + 16 * i)));
    } else {
        int8_t t16[16] = {0};
        memcpy(t16, cb, (size_t)K);
        tbl[0] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)t16));
    }
}

/* The 32 index bytes of the chunk at column c of a row: four groups of 8 b-bit indices, each
 * one pdep away from 8 bytes. `whole` says the 8-byte reads of all four groups lie inside the
 * payload and the chunk inside the row; otherwise only the groups' own bytes are read. */
__attribute__((always_inline)) AVX2_BMI2_FN static inline __m256i
chunk_indices(const uint8_t *row, int c, int cols, int b, uint64_t dep, const uint8_t *end,
              int whole) {
    const uint8_t *g0 = row + (size_t)(c / 8) * (size_t)b;
    uint64_t g[4] = {0, 0, 0, 0};
    if (whole) {
        uint64_t v0, v1, v2, v3;
        memcpy(&v0, g0, 8);
        memcpy(&v1, g0 + b, 8);
        memcpy(&v2, g0 + 2 * b, 8);
        memcpy(&v3, g0 + 3 * b, 8);
        return _mm256_set_epi64x((long long)_pdep_u64(v3, dep), (long long)_pdep_u64(v2, dep),
                                 (long long)_pdep_u64(v1, dep), (long long)_pdep_u64(v0, dep));
    }
    for (int j = 0; j < 4 && c + 8 * j < cols; j++) g[j] = group_bytes(g0 + j * b, b, dep, end);
    return _mm256_set_epi64x((long long)g[3], (long long)g[2], (long long)g[1], (long long)g[0]);
}

#endif
