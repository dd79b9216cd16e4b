/* qgemm_avx2.c: integer GEMM for int8 codebook tensors, AVX2: Y[t][r] for T quantized inputs
 * (batched prefill; kernels.h gemm_i8). Bit-identical to the GEMV kernels, whose definition it
 * shares (qgemv.h): only the integer sums' order changes, and they are exact.
 *
 * A GEMV spends most of its work turning index bytes into int8 weights (unpack, vpshufb
 * lookup); with T inputs that work is done once per row: the row's weights are decoded into an
 * int16 buffer (2 * cols bytes, in L1 while the inputs pass over it). Each input is scaled
 * once per call into int16 m[c/32] * q[c], so a weight-activation pair is one vpmaddwd lane
 * (no sign trick, no per-block multiply). A row meets four inputs at a time: each weight load
 * serves four dot products, and the four sums are reduced together (vphaddd) and combined
 * with the scales in four double lanes.
 */
#include "qgemv.h"
#include "kernels.h"

#if defined(__x86_64__) || defined(__i386__)

#include <stdio.h>
#include <stdlib.h>

#include "simd_avx2.h"

/* Row r's weights as int16 in natural column order, for all of its columns rounded up to whole
 * 32-column chunks (padding columns get centroid 0; their activations are 0). */
AVX2_BMI2_FN static void decode_row16(int16_t *w, const I8Layout *L, int r, int cols) {
    const uint8_t *row = L->indices + (size_t)r * L->row_bytes;
    const int b = L->bits, full = cols & ~31;
    const uint64_t dep = ((UINT64_C(1) << b) - 1u) * UINT64_C(0x0101010101010101);
    __m256i tbl[16];
    for (int i = 0; i < 16; i++) tbl[i] = _mm256_setzero_si256();
    for (int s = 0; s < L->n_sub; s++) {
        const int8_t *cb = L->cent + ((size_t)r * (size_t)L->n_sub + (size_t)s) * (size_t)L->k;
        int c0 = s * L->group_size;
        int c1 = c0 + L->group_size < cols ? c0 + L->group_size : cols;
        for (int c = c0; c < c1; c += 32) {
            __m256i v;
            if (b == 4) { /* perm32 (even columns, then odd ones) back to column order */
                uint8_t tail[16];
                const uint8_t *ip = row + c / 2;
                if (c >= full) {
                    i8_tail_indices(tail, row, c, cols);
                    ip = tail;
                }
                if (c == c0) load_tables(tbl, cb, L->k, 16);
                __m256i p = _mm256_shuffle_epi8(tbl[0], nibbles32(ip));
                __m128i ev = _mm256_castsi256_si128(p), od = _mm256_extracti128_si256(p, 1);
                v = _mm256_setr_m128i(_mm_unpacklo_epi8(ev, od), _mm_unpackhi_epi8(ev, od));
            } else if (b == 6) {
                uint8_t tail[24] = {0};
                const uint8_t *ip = row + (size_t)c / 32 * 24u;
                if (c >= full) {
                    memcpy(tail, ip, (size_t)ditto_cb_row_bytes((uint64_t)(cols - c), 6u));
                    ip = tail;
                }
                if (c == c0) load_tables(tbl, cb, L->k, 64);
                v = b6_lookup(b6_indices(ip), tbl[0], tbl[1], tbl[2], tbl[3]);
            } else {
                int whole = c < full && L->end - (row + (size_t)(c / 8) * (size_t)b) >= 3 * b + 8;
                __m256i idx = chunk_indices(row, c, cols, b, dep, L->end, whole);
                switch (L->k) {
                case 32:
                    if (c == c0) load_tables(tbl, cb, L->k, 32);
                    v = lookup_k(idx, tbl, 32);
                    break;
                case 128:
                    if (c == c0) load_tables(tbl, cb, L->k, 128);
                    v = lookup_k(idx, tbl, 128);
                    break;
                case 256:
                    if (c == c0) load_tables(tbl, cb, L->k, 256);
                    v = lookup_k(idx, tbl, 256);
                    break;
                default: /* b <= 3 (b = 5 has k = 32) */
                    if (c == c0) load_tables(tbl, cb, L->k, 16);
                    v = lookup_k(idx, tbl, 16);
                    break;
                }
            }
            _mm256_storeu_si256((__m256i *)(void *)(w + c),
                                _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)));
            _mm256_storeu_si256((__m256i *)(void *)(w + c + 16),
                                _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1)));
        }
    }
}

/* mq[c] = m[c / 32] * q[c] (|mq| <= 255 * 127) for one input, natural order, n_pad entries. */
static void scale_acts(int16_t *mq, const QuantActs *qa) {
    for (int c = 0; c < qa->n_pad; c++) mq[c] = (int16_t)(qa->m16[c / 32] * qa->q[c]);
}

/* Row r against inputs mq[0..4) (their D in D4): y4 = the four results, each exactly
 * i8_combine's: acc = sum over sub-blocks of (double)scale * (double)T in sub-block order, then
 * (float)(acc * D). Whole sub-block sums are formed in int32 lanes (runs of at most 128 chunks
 * as in the GEMV kernels) and, when G <= 512, summed across lanes in int32 (|T| <= G * 127 *
 * 32385 < 2^31), else in int64. */
AVX2_FN static void row_x4(float *y4, const int16_t *w, const int16_t *const mq[4],
                           const double D4[4], const I8Layout *L, int r, int cols) {
    const uint16_t *sc = L->scale + (size_t)r * (size_t)L->n_sub;
    __m256d acc = _mm256_setzero_pd();
    for (int s = 0; s < L->n_sub; s++) {
        int c0 = s * L->group_size;
        int c1 = c0 + L->group_size < cols ? c0 + L->group_size : cols;
        __m256d scale = _mm256_set1_pd((double)_cvtsh_ss(sc[s]));
        int64_t t64[4] = {0, 0, 0, 0};
        __m128i t32 = _mm_setzero_si128();
        for (int c = c0; c < c1;) {
            int stop = c + 128 * 32 < c1 ? c + 128 * 32 : c1;
            __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
            for (; c < stop; c += 32) {
                __m256i wl = _mm256_loadu_si256((const __m256i *)(const void *)(w + c));
                __m256i wh = _mm256_loadu_si256((const __m256i *)(const void *)(w + c + 16));
#define LOAD16(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))
#define DOT16X2(acc, x)                                                                       \
    acc = _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(wl, LOAD16(x + c)),        \
                                                 _mm256_madd_epi16(wh, LOAD16(x + c + 16))))
                DOT16X2(a0, mq[0]);
                DOT16X2(a1, mq[1]);
                DOT16X2(a2, mq[2]);
                DOT16X2(a3, mq[3]);
#undef DOT16X2
#undef LOAD16
            }
            if (L->group_size <= 512) {
                t32 = hsum4_epi32(a0, a1, a2, a3); /* one run: the whole sub-block */
            } else {
                t64[0] += hsum_epi32_wide(a0);
                t64[1] += hsum_epi32_wide(a1);
                t64[2] += hsum_epi32_wide(a2);
                t64[3] += hsum_epi32_wide(a3);
            }
        }
        __m256d T = L->group_size <= 512
                        ? _mm256_cvtepi32_pd(t32)
                        : _mm256_setr_pd((double)t64[0], (double)t64[1], (double)t64[2],
                                         (double)t64[3]);
        acc = _mm256_add_pd(acc, _mm256_mul_pd(scale, T)); /* no FMA: the reference's rounding */
    }
    _mm_storeu_ps(y4, _mm256_cvtpd_ps(_mm256_mul_pd(acc, _mm256_loadu_pd(D4))));
}

AVX2_BMI2_FN void i8cb_gemm_avx2(float *Y, const QuantActs *qa, int T, const I8Layout *L,
                                 int r0, int r1, int rows, int cols) {
    const int n_pad = qa[0].n_pad;
    int16_t w[(cols + 31) & ~31];
    int16_t *mq = malloc((size_t)T * (size_t)n_pad * sizeof *mq);
    if (!mq) {
        fprintf(stderr, "ditto: out of memory for %d scaled activation rows of %d\n", T, n_pad);
        abort();
    }
    for (int t = 0; t < T; t++) scale_acts(mq + (size_t)t * (size_t)n_pad, &qa[t]);
    for (int r = r0; r < r1; r++) {
        decode_row16(w, L, r, cols);
        for (int t = 0; t < T; t += 4) {
            const int16_t *x[4];
            double D4[4];
            float y4[4];
            for (int j = 0; j < 4; j++) { /* past the last input: repeat it */
                int u = t + j < T ? t + j : T - 1;
                x[j] = mq + (size_t)u * (size_t)n_pad;
                D4[j] = (double)qa[u].D;
            }
            row_x4(y4, w, x, D4, L, r, cols);
            for (int j = 0; j < 4 && t + j < T; j++)
                Y[(size_t)(t + j) * (size_t)rows + (size_t)r] = y4[j];
        }
    }
    free(mq);
}

#endif
