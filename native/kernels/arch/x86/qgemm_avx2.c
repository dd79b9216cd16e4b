/* qgemm_avx2.c: integer GEMM for int8 codebook tensors, AVX2, AVX-VNNI and AVX-512 VNNI:
 * Y[t][r] for T quantized inputs (batched prefill; kernels.h gemm_i8). Bit-identical to the
 * GEMV kernels, whose definition it shares (qgemv.h): only the integer sums' order changes, and
 * they are exact.
 *
 * A GEMV spends most of its work turning index bytes into int8 weights (unpack, vpshufb
 * lookup); with T inputs that work is done once per row. The rows are taken in panels of 16:
 * a panel's weights, one block of whole sub-blocks (~512 columns) at a time, are decoded to
 * int16 and stored as column pairs across the 16 rows (P[k][i] = the weights of columns 2k and
 * 2k + 1 of row i, 64 bytes per pair, 16 KiB per block: in L1). Each input is scaled once per
 * batch into int16 m[c/32] * q[c], the pairs of six inputs interleaved into one stream (by
 * the caller's GemmPrep, else once per call). The micro-kernel then takes six inputs at a time
 * (a last group of fewer is padded with zero inputs whose sums are dropped): per column pair,
 * two loads of P (16 rows) and one broadcast of each input's pair give twelve int16 pair
 * multiply-adds (vpmaddwd + vpaddd on AVX2; one vpdpwssd each with AVX-VNNI), whose int32
 * lanes are the 16 rows x 6 inputs sums themselves (no horizontal reduction), in twelve
 * accumulator registers. Every weight load serves six inputs and every activation load
 * sixteen rows. At the end of a sub-block the lanes are combined with the rows' f16 scales in
 * double, in sub-block order, exactly as i8_combine does. The AVX2 and AVX-VNNI GEMMs differ
 * only in the micro-kernel's multiply-add; the AVX-512 tables' GEMM takes the same panels as
 * unsigned bytes in groups of four columns ("the quad form" below).
 */
#include "../../qgemv.h"

#if defined(__x86_64__) || defined(__i386__)

#include <stdio.h>
#include <stdlib.h>

#include "simd_avx2.h"

#define PANEL 16   /* rows per panel: two vectors of eight int32 row lanes */
#define NB 6       /* inputs per micro-kernel call: 2 x 6 accumulators + 3 operands */
#define KBLOCK 512 /* columns decoded at a time (whole sub-blocks, at least one) */
#define RUN 512    /* most columns summed in int32 lanes: 512 * 127 * 32385 < 2^31 */
_Static_assert(NB == GEMM_PREP_GROUP, "the GemmPrep groups are the micro-kernel's inputs");

#define AVXVNNI_FN __attribute__((target("avx2,f16c,avxvnni")))
#define VNNI512_FN __attribute__((target("avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

/* Sub-blocks [s0, s1) of row r in natural column order from column s0 * G, for all of their
 * columns rounded up to whole 32-column chunks (padding columns get centroid 0; their
 * activations are 0): as int16 into w16, or, when w16 is NULL, as the unsigned bytes w + 128
 * into u8 (the quad form below). */
AVX2_BMI2_FN static void decode_row(int16_t *w16, uint8_t *u8, const I8Layout *L, int r,
                                    int cols, int s0, int s1) {
    const uint8_t *row = L->indices + (size_t)r * L->row_bytes;
    const int b = L->bits, full = cols & ~31, base = s0 * L->group_size;
    const uint64_t dep = ((UINT64_C(1) << b) - 1u) * UINT64_C(0x0101010101010101);
    __m256i tbl[16];
    for (int i = 0; i < 16; i++) tbl[i] = _mm256_setzero_si256();
    for (int s = s0; s < s1; s++) {
        const int8_t *cb = L->cent + ((size_t)r * (size_t)L->n_sub + (size_t)s) * (size_t)L->k;
        int c0 = s * L->group_size;
        int c1 = c0 + L->group_size < cols ? c0 + L->group_size : cols;
        for (int c = c0; c < c1; c += 32) {
            __m256i v;
            if (b == 4) { /* perm32 (even columns, then odd ones) back to column order */
                uint8_t tail[16];
                const uint8_t *ip = i8_b4_at(L, r, c); /* tiled: every chunk whole */
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
            if (!w16) {
                _mm256_storeu_si256((__m256i *)(void *)(u8 + c - base),
                                    _mm256_xor_si256(v, _mm256_set1_epi8(-128)));
                continue;
            }
            _mm256_storeu_si256((__m256i *)(void *)(w16 + c - base),
                                _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)));
            _mm256_storeu_si256((__m256i *)(void *)(w16 + c - base + 16),
                                _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1)));
        }
    }
}

/* P[k][i] = src[i][k] for 16 rows i of n32 dwords (int16 column pairs, or the quad form's
 * groups of four byte columns; n32 % 8 == 0; row stride ld dwords): 8 x 8 dword transposes. */
AVX2_FN static void transpose_pairs(int32_t *P, const int32_t *src, size_t ld, int n32) {
    for (int h = 0; h < PANEL / 8; h++) {
        const int32_t *s = src + (size_t)(8 * h) * ld;
        for (int k = 0; k < n32; k += 8) {
            __m256i r[8], t[8];
            for (int i = 0; i < 8; i++)
                r[i] = _mm256_loadu_si256((const __m256i *)(const void *)(s + i * ld + k));
            for (int i = 0; i < 8; i += 2) {
                t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
                t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
            }
            for (int i = 0; i < 8; i += 4) {
                r[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
                r[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
                r[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
                r[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
            }
            /* r[0..4) hold columns (0,4), (1,5), (2,6), (3,7) of rows 0-3, r[4..8) of rows 4-7 */
            for (int j = 0; j < 4; j++) {
                _mm256_storeu_si256((__m256i *)(void *)(P + (size_t)(k + j) * PANEL + 8 * h),
                                    _mm256_permute2x128_si256(r[j], r[j + 4], 0x20));
                _mm256_storeu_si256((__m256i *)(void *)(P + (size_t)(k + j + 4) * PANEL + 8 * h),
                                    _mm256_permute2x128_si256(r[j], r[j + 4], 0x31));
            }
        }
    }
}

/* The micro-kernel: acc[2j + h] = int32 lanes, rows 8h..8h+7, of sum over column pairs k in
 * [k0, k1) of P[k] * x[6k + j], for the six inputs j: x holds the six inputs' int16 column
 * pairs interleaved (x[6k + j] = input j's columns 2k and 2k + 1), so the activations are one
 * sequential stream, as the weights are. One form per
 * multiply-add, all with the same lanes and the same (exact, wrapping) int32 sums. Its
 * `combined` twin, for a whole sub-block in one run, adds the sums times the rows' scales
 * sc[16] straight from the registers into dacc[j][16] for all six inputs, as combine_lanes()
 * does (dacc has room for six, whether or not they are all combined). */
typedef void (*Micro6Fn)(__m256i *acc, const int32_t *P, const int32_t *x, int k0, int k1);
typedef void (*Micro6CombinedFn)(double *dacc, const double *sc, const int32_t *P,
                                 const int32_t *x, int k0, int k1);
typedef struct {
    Micro6Fn run;
    Micro6CombinedFn combined;
} Micro6;

/* Spelled out with named registers: the IR pipeline of `ditto build` (clang -O1, then LLVM
 * O3) does not unroll an array of accumulators into registers, and on the stack they would
 * cost half the speed. MADD(c, w, a) = c + the int32 sums of the int16 pair products of w and
 * a (vpmaddwd + vpaddd on AVX2, one vpdpwssd with VNNI). */
#define MQ_PAIR(MADD, j)                                                                      \
    __m256i a##j = _mm256_set1_epi32(xk[j]);                                                  \
    c##j##0 = MADD(c##j##0, w0, a##j);                                                        \
    c##j##1 = MADD(c##j##1, w1, a##j)
#define MICRO6_LOOP(MADD)                                                                     \
    __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00,         \
            c21 = c00, c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;      \
    for (int k = k0; k < k1; k++) {                                                           \
        __m256i w0 = _mm256_loadu_si256((const __m256i *)(const void *)(P + (size_t)k * PANEL)); \
        __m256i w1 =                                                                          \
            _mm256_loadu_si256((const __m256i *)(const void *)(P + (size_t)k * PANEL + 8));   \
        const int32_t *xk = x + (size_t)k * NB;                                               \
        MQ_PAIR(MADD, 0);                                                                     \
        MQ_PAIR(MADD, 1);                                                                     \
        MQ_PAIR(MADD, 2);                                                                     \
        MQ_PAIR(MADD, 3);                                                                     \
        MQ_PAIR(MADD, 4);                                                                     \
        MQ_PAIR(MADD, 5);                                                                     \
    }
/* d[0..8) += sc[0..8) * the eight int32 lanes of v, in double (exact products, one add). */
#define COMBINE8(d, sc, v)                                                                    \
    do {                                                                                      \
        __m256d lo_ = _mm256_cvtepi32_pd(_mm256_castsi256_si128(v));                          \
        __m256d hi_ = _mm256_cvtepi32_pd(_mm256_extracti128_si256((v), 1));                   \
        _mm256_storeu_pd((d), _mm256_add_pd(_mm256_loadu_pd(d),                               \
                                            _mm256_mul_pd(_mm256_loadu_pd(sc), lo_)));        \
        _mm256_storeu_pd((d) + 4, _mm256_add_pd(_mm256_loadu_pd((d) + 4),                     \
                                                _mm256_mul_pd(_mm256_loadu_pd((sc) + 4), hi_))); \
    } while (0)
#define COMBINE_INPUT(j)                                                                      \
    COMBINE8(dacc + j * PANEL, sc, c##j##0);                                                  \
    COMBINE8(dacc + j * PANEL + 8, sc + 8, c##j##1)
#define MICRO6(NAME, ATTR, MADD)                                                              \
    ATTR static void NAME(__m256i *acc, const int32_t *P, const int32_t *x, int k0, int k1) { \
        MICRO6_LOOP(MADD)                                                                     \
        acc[0] = c00, acc[1] = c01, acc[2] = c10, acc[3] = c11, acc[4] = c20, acc[5] = c21;   \
        acc[6] = c30, acc[7] = c31, acc[8] = c40, acc[9] = c41, acc[10] = c50, acc[11] = c51; \
    }                                                                                         \
    ATTR static void NAME##_combined(double *dacc, const double *sc, const int32_t *P,        \
                                     const int32_t *x, int k0, int k1) {                     \
        MICRO6_LOOP(MADD)                                                                     \
        COMBINE_INPUT(0);                                                                     \
        COMBINE_INPUT(1);                                                                     \
        COMBINE_INPUT(2);                                                                     \
        COMBINE_INPUT(3);                                                                     \
        COMBINE_INPUT(4);                                                                     \
        COMBINE_INPUT(5);                                                                     \
    }

#define MADD_AVX2(c, w, a) _mm256_add_epi32((c), _mm256_madd_epi16((w), (a)))
#define MADD_AVXVNNI(c, w, a) _mm256_dpwssd_avx_epi32((c), (w), (a))     /* VEX vpdpwssd */
MICRO6(micro6_avx2, AVX2_FN, MADD_AVX2)
MICRO6(micro6_avxvnni, AVXVNNI_FN, MADD_AVXVNNI)
static const Micro6 MICRO6_AVX2 = {micro6_avx2, micro6_avx2_combined};
static const Micro6 MICRO6_AVXVNNI = {micro6_avxvnni, micro6_avxvnni_combined};
#undef MICRO6
#undef MICRO6_LOOP
#undef COMBINE_INPUT
#undef COMBINE8
#undef MQ_PAIR
#undef MADD_AVX2
#undef MADD_AVXVNNI

/* dacc[j][i] = dacc[j][i] + sc[i] * T[j][i] (double; the definition's multiply, then add) for
 * the 16 rows i and inputs j < n, T given in int64 (a sub-block summed in several runs; one run
 * is combined by the micro-kernel's `combined` twin). */
AVX2_FN static void combine_lanes(double *dacc, const double *sc, const int64_t *t64, int n) {
    for (int j = 0; j < n; j++) {
        double *d = dacc + (size_t)j * PANEL;
        for (int h = 0; h < 2; h++) {
            const int64_t *t = t64 + (size_t)j * PANEL + 8 * h;
            __m256d lo = _mm256_setr_pd((double)t[0], (double)t[1], (double)t[2], (double)t[3]);
            __m256d hi = _mm256_setr_pd((double)t[4], (double)t[5], (double)t[6], (double)t[7]);
            __m256d p0 = _mm256_mul_pd(_mm256_loadu_pd(sc + 8 * h), lo);
            __m256d p1 = _mm256_mul_pd(_mm256_loadu_pd(sc + 8 * h + 4), hi);
            _mm256_storeu_pd(d + 8 * h, _mm256_add_pd(_mm256_loadu_pd(d + 8 * h), p0));
            _mm256_storeu_pd(d + 8 * h + 4, _mm256_add_pd(_mm256_loadu_pd(d + 8 * h + 4), p1));
        }
    }
}

/* t64[j][i] += the int32 lanes of acc (a run of a sub-block longer than RUN columns). */
AVX2_FN static void widen_lanes(int64_t *t64, const __m256i *acc, int n) {
    for (int j = 0; j < n; j++)
        for (int h = 0; h < 2; h++) {
            int64_t *t = t64 + (size_t)j * PANEL + 8 * h;
            __m256i lo = _mm256_cvtepi32_epi64(_mm256_castsi256_si128(acc[2 * j + h]));
            __m256i hi = _mm256_cvtepi32_epi64(_mm256_extracti128_si256(acc[2 * j + h], 1));
            _mm256_storeu_si256((__m256i *)(void *)t,
                                _mm256_add_epi64(_mm256_loadu_si256((const __m256i *)(void *)t), lo));
            _mm256_storeu_si256(
                (__m256i *)(void *)(t + 4),
                _mm256_add_epi64(_mm256_loadu_si256((const __m256i *)(void *)(t + 4)), hi));
        }
}

/* One block of sub-blocks [s0, s1) (P from column s0 * G) against six inputs' interleaved
 * pairs x (x[6k + j], k from column s0 * G), of which the first n count: each sub-block's sums
 * into dacc[j][16] with its scales scd[s][16]. dacc holds six inputs' rows; a sub-block of one
 * run writes all six (rows n..5 are scratch that nothing reads), a longer one the first n. */
AVX2_FN static void block(const Micro6 *micro6, double *dacc, const int32_t *P,
                          const int32_t *x, const double *scd, const I8Layout *L, int s0,
                          int s1, int cols, int n) {
    const int G = L->group_size, base = s0 * G;
    __m256i acc[2 * NB];
    for (int s = s0; s < s1; s++) {
        int c0 = s * G - base, c1 = (s * G + G < cols ? s * G + G : cols) - base;
        int k1 = ((c1 + 31) & ~31) / 2;
        if (k1 - c0 / 2 <= RUN / 2) {
            micro6->combined(dacc, scd + (size_t)s * PANEL, P, x, c0 / 2, k1);
        } else {
            int64_t t64[NB * PANEL] = {0};
            for (int k = c0 / 2; k < k1; k += RUN / 2) {
                micro6->run(acc, P, x, k, k + RUN / 2 < k1 ? k + RUN / 2 : k1);
                widen_lanes(t64, acc, n);
            }
            combine_lanes(dacc, scd + (size_t)s * PANEL, t64, n);
        }
    }
}

/* The int16 m[c / 32] * q[c] (|m q| <= 255 * 127) of input t's columns [c0, c0 + 32), or
 * zeros past the T inputs. */
AVX2_FN static void scaled_chunk(__m256i *lo, __m256i *hi, const QuantActs *qa, int t, int T,
                                 int c0) {
    if (t >= T) {
        *lo = *hi = _mm256_setzero_si256();
        return;
    }
    const __m256i m = _mm256_set1_epi16(qa[t].m16[c0 / 32]);
    const __m128i *q = (const __m128i *)(const void *)(qa[t].q + c0);
    *lo = _mm256_mullo_epi16(m, _mm256_cvtepi8_epi16(_mm_loadu_si128(q)));
    *hi = _mm256_mullo_epi16(m, _mm256_cvtepi8_epi16(_mm_loadu_si128(q + 1)));
}

/* kernels.h I8GemmPrepFn of the pair form: group g of qgemv.h GemmPrep.pairs, the six inputs'
 * scaled pairs interleaved so that the micro-kernel reads them as one sequential stream through
 * one pointer (zeros for the inputs past T in the last group). */
AVX2_FN void i8cb_gemm_prep_pairs(int32_t *pairs, const QuantActs *qa, int T, int g) {
    const int n_pad = qa[0].n_pad;
    int32_t *dst = pairs + (size_t)g * (size_t)n_pad / 2 * NB;
    for (int c = 0; c < n_pad; c += 32, dst += 16 * NB) {
        int32_t chunk[NB][16];
        for (int j = 0; j < NB; j++) {
            __m256i lo, hi;
            scaled_chunk(&lo, &hi, qa, g * NB + j, T, c);
            _mm256_storeu_si256((__m256i *)(void *)chunk[j], lo);
            _mm256_storeu_si256((__m256i *)(void *)(chunk[j] + 8), hi);
        }
        for (int k = 0; k < 16; k++)
            for (int j = 0; j < NB; j++) dst[k * NB + j] = chunk[j][k];
    }
}

static void *alloc_or_die(size_t n, const char *what) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "ditto: out of memory for the GEMM's %s (%zu bytes)\n", what, n);
        abort();
    }
    return p;
}

/* scd[s][i] = the f16 scale of sub-block s of row rp + i as a double, 0 past the R rows. */
AVX2_FN static void panel_scales(double *scd, const I8Layout *L, int rp, int R) {
    for (int s = 0; s < L->n_sub; s++)
        for (int i = 0; i < PANEL; i++)
            scd[(size_t)s * PANEL + i] =
                i < R ? (double)_cvtsh_ss(L->scale[(size_t)(rp + i) * (size_t)L->n_sub + s])
                      : 0.0;
}

/* Y[t][rp + i] = (float)(dacc[t][i] * D_t) for the panel's R rows: i8_combine's last step. */
static void store_panel(float *Y, const double *dacc, const QuantActs *qa, int T, int rows,
                        int rp, int R) {
    for (int t = 0; t < T; t++)
        for (int i = 0; i < R; i++)
            Y[(size_t)t * (size_t)rows + (size_t)(rp + i)] =
                (float)(dacc[(size_t)t * PANEL + i] * (double)qa[t].D);
}

/* The weights of sub-blocks [s0, s1) of the panel's rows rp..rp+R-1 (s1: as many as fit one
 * KBLOCK of columns, at least one) into P, transposed: as int16 column pairs, or in the quad
 * form (`quads`) as the bytes w + 128 in groups of four columns; the rows past R are zero.
 * tmp holds PANEL rows of kmax columns of the form. Returns s1. */
AVX2_BMI2_FN static int load_panel_block(int32_t *P, void *tmp, int kmax, int quads,
                                         const I8Layout *L, int rp, int R, int cols, int s0) {
    const int G = L->group_size, per = G >= KBLOCK ? 1 : KBLOCK / G;
    const int s1 = s0 + per < L->n_sub ? s0 + per : L->n_sub;
    const int c_end = s1 * G < cols ? s1 * G : cols;
    const int kc = (c_end - s0 * G + 31) & ~31; /* columns of this block, padded */
    const size_t width = quads ? 1 : sizeof(int16_t), per_dword = 4 / width;
    for (int i = 0; i < PANEL; i++) {
        uint8_t *row = (uint8_t *)tmp + (size_t)i * (size_t)kmax * width;
        if (i >= R) memset(row, 0, (size_t)kc * width);
        else if (quads) decode_row(NULL, row, L, rp + i, cols, s0, s1);
        else decode_row((int16_t *)(void *)row, NULL, L, rp + i, cols, s0, s1);
    }
    transpose_pairs(P, (const int32_t *)tmp, (size_t)kmax / per_dword, kc / (int)per_dword);
    return s1;
}

/* The index bytes and centroids that load_panel_block() will read for rows rp..rp+R-1 from
 * sub-block s0 on, into L2 (nothing when rp >= r1): issued right after a block is decoded, so
 * the next block's lines arrive while the micro-kernel works on this one (each row's share
 * of a block is a few lines, too short a stream for the hardware prefetcher to cover). */
static void prefetch_panel_block(const I8Layout *L, int rp, int r1, int cols, int s0) {
    if (rp >= r1) return;
    const int G = L->group_size, per = G >= KBLOCK ? 1 : KBLOCK / G;
    const int s1 = s0 + per < L->n_sub ? s0 + per : L->n_sub;
    const int c_end = s1 * G < cols ? s1 * G : cols;
    const size_t lo = (size_t)s0 * (size_t)G * (size_t)L->bits / 8u;
    const size_t hi = ((size_t)c_end * (size_t)L->bits + 7u) / 8u;
    const int R = r1 - rp < PANEL ? r1 - rp : PANEL;
    for (int i = 0; i < R; i++) {
        const uint8_t *row = L->indices + (size_t)(rp + i) * L->row_bytes;
        if (L->tiled) { /* the tile's run for these columns, once per tile (lo, hi: whole
                           64-column chunks, as G % 64 == 0) */
            if (i % I8_TILE_ROWS == 0)
                for (size_t a = lo * I8_TILE_ROWS; a < hi * I8_TILE_ROWS; a += 64)
                    __builtin_prefetch((const void *)(row + a), 0, 2);
        } else {
            for (uintptr_t a = (uintptr_t)(row + lo) & ~(uintptr_t)63; a < (uintptr_t)(row + hi);
                 a += 64)
                __builtin_prefetch((const void *)a, 0, 2);
        }
        const int8_t *cb = L->cent + ((size_t)(rp + i) * (size_t)L->n_sub + (size_t)s0) *
                                         (size_t)L->k;
        const size_t cb_bytes = (size_t)(s1 - s0) * (size_t)L->k;
        for (uintptr_t a = (uintptr_t)cb & ~(uintptr_t)63; a < (uintptr_t)(cb + cb_bytes); a += 64)
            __builtin_prefetch((const void *)a, 0, 2);
    }
}

/* The GEMM of kernels.h's I8GemmFn with the micro-kernel micro6. */
AVX2_BMI2_FN static void gemm(const Micro6 *micro6, float *Y, const QuantActs *qa, int T,
                              const I8Layout *L, int r0, int r1, int rows, int cols,
                              const GemmPrep *prep) {
    const int n_pad = qa[0].n_pad, G = L->group_size, n_sub = L->n_sub;
    const int sb_per_block = G >= KBLOCK ? 1 : KBLOCK / G;
    const int kmax = ((sb_per_block * G < cols ? sb_per_block * G : cols) + 31) & ~31;
    const int n_groups = (T + NB - 1) / NB;
    int32_t *own = NULL; /* the prepared inputs, when the caller has none for these T */
    const int32_t *xi =
        prep && prep->qa == qa && prep->T == T && prep->n_pad == n_pad ? prep->pairs : NULL;
    if (!xi) {
        own = alloc_or_die(gemm_pairs_len(T, n_pad) * sizeof *own, "scaled activations");
        for (int g = 0; g < n_groups; g++) i8cb_gemm_prep_pairs(own, qa, T, g);
        xi = own;
    }
    int16_t *tmp = alloc_or_die((size_t)PANEL * (size_t)kmax * sizeof *tmp, "decoded rows");
    int32_t *P = alloc_or_die((size_t)kmax / 2 * PANEL * sizeof *P, "weight panel");
    /* the sums of T inputs and of the up to NB - 1 zero inputs a last group of fewer combines */
    const size_t n_dacc = ((size_t)T + NB - 1) * PANEL;
    double *dacc = alloc_or_die(n_dacc * sizeof *dacc, "sums");
    double *scd = alloc_or_die((size_t)n_sub * PANEL * sizeof *scd, "scales");
    for (int rp = r0; rp < r1; rp += PANEL) {
        const int R = r1 - rp < PANEL ? r1 - rp : PANEL;
        panel_scales(scd, L, rp, R);
        memset(dacc, 0, n_dacc * sizeof *dacc);
        for (int s0 = 0, s1; s0 < n_sub; s0 = s1) {
            s1 = load_panel_block(P, tmp, kmax, 0, L, rp, R, cols, s0);
            if (s1 < n_sub) prefetch_panel_block(L, rp, r1, cols, s1);
            else prefetch_panel_block(L, rp + PANEL, r1, cols, 0);
            for (int t = 0; t < T; t += NB) {
                const int n = T - t < NB ? T - t : NB;
                if (s0 == 0 && rp + PANEL < r1) /* as in gemm_quads() below */
                    for (int j = 0; j < n; j++)
                        __builtin_prefetch(Y + (size_t)(t + j) * (size_t)rows +
                                               (size_t)(rp + PANEL), 1, 2);
                const int32_t *x =
                    xi + ((size_t)(t / NB) * (size_t)n_pad + (size_t)s0 * (size_t)G) / 2 * NB;
                block(micro6, dacc + (size_t)t * PANEL, P, x, scd, L, s0, s1, cols, n);
            }
        }
        store_panel(Y, dacc, qa, T, rows, rp, R);
    }
    free(scd);
    free(dacc);
    free(P);
    free(tmp);
    free(own);
}

/* ---- The quad form (AVX-512 VNNI: zmm) ----
 * vpdpbusd multiplies unsigned by signed bytes, four products per int32 lane: twice the
 * products of a vpdpwssd, but m * q does not fit a byte. So per 32-column block j the panel's
 * unsigned weights w + 128 (P[k][i] = the four bytes of columns 4k..4k+3 of row i) meet the
 * input's bytes q, and the block's lanes are multiplied by m_j:
 *   sum_c w m q = sum_j m_j sum_{c in j} (w + 128) q  -  128 sum_j m_j sum_{c in j} q,
 * the last term one number per input and run of columns (corr). Per 32 columns and input: 8
 * vpdpbusd, one vpmulld and one vpaddd per 16 rows (zmm), against 16 vpdpwssd per 8 rows in
 * the pair form. The block sums (|.| <= 32 * 255 * 127) and everything after them wrap modulo
 * 2^32 and come out exact because a run's true sum fits int32 (RUN columns, as above). */

/* acc[2j + h] = int32 lanes, rows 8h..8h+7, of the sum over the 32-column blocks of quads
 * [k0, k1) (both multiples of 8) of mb[j][block] * sum of P[k] . x[j][4k..4k+3], for the six
 * inputs j (x, mb and P all indexed from the same first column). One zmm per input holds the
 * panel's 16 rows: one load of P[k] per four columns serves the six inputs. */
#define ZQ_QUAD(j)                                                                            \
    {                                                                                         \
        int32_t quad;                                                                         \
        memcpy(&quad, x##j + 4 * kk, sizeof quad);                                            \
        b##j = _mm512_dpbusd_epi32(b##j, w, _mm512_set1_epi32(quad));                         \
    }
#define ZQ_BLOCK_M(j)                                                                         \
    c##j = _mm512_add_epi32(c##j, _mm512_mullo_epi32(b##j, _mm512_set1_epi32((int)m##j[k / 8])))
VNNI512_FN static void micro6q(__m512i *acc, const int32_t *P, const int8_t *const *x,
                               const uint8_t *const *mb, int k0, int k1) {
    const int8_t *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3], *x4 = x[4], *x5 = x[5];
    const uint8_t *m0 = mb[0], *m1 = mb[1], *m2 = mb[2], *m3 = mb[3], *m4 = mb[4], *m5 = mb[5];
    __m512i c0 = _mm512_setzero_si512(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
    for (int k = k0; k < k1; k += 8) {
        __m512i b0 = _mm512_setzero_si512(), b1 = b0, b2 = b0, b3 = b0, b4 = b0, b5 = b0;
        for (int kk = k; kk < k + 8; kk++) {
            __m512i w = _mm512_loadu_si512((const void *)(P + (size_t)kk * PANEL));
            ZQ_QUAD(0) ZQ_QUAD(1) ZQ_QUAD(2) ZQ_QUAD(3) ZQ_QUAD(4) ZQ_QUAD(5)
        }
        ZQ_BLOCK_M(0);
        ZQ_BLOCK_M(1);
        ZQ_BLOCK_M(2);
        ZQ_BLOCK_M(3);
        ZQ_BLOCK_M(4);
        ZQ_BLOCK_M(5);
    }
    acc[0] = c0, acc[1] = c1, acc[2] = c2, acc[3] = c3, acc[4] = c4, acc[5] = c5;
}
#undef ZQ_QUAD
#undef ZQ_BLOCK_M

/* acc[j] -= 128 * sum over the blocks [b0, b1) of input j's m * (sum of q): the bias of the
 * unsigned weights (wrapping, as the lanes). */
VNNI512_FN static void unbias_lanes(__m512i *acc, const int32_t *const *mqs, int b0, int b1) {
    for (int j = 0; j < NB; j++) {
        uint32_t corr = 0;
        for (int b = b0; b < b1; b++) corr += (uint32_t)mqs[j][b];
        acc[j] = _mm512_sub_epi32(acc[j], _mm512_set1_epi32((int)(128u * corr)));
    }
}

/* combine_lanes() on zmm, acc[j] holding input j's 16 row lanes: the same double multiply, then
 * add, per lane, so the same bits. */
VNNI512_FN static void combine_lanes_zmm(double *dacc, const double *sc, const __m512i *acc,
                                         const int64_t *t64, int n) {
    const __m512d s0 = _mm512_loadu_pd(sc), s1 = _mm512_loadu_pd(sc + 8);
    for (int j = 0; j < n; j++) {
        double *d = dacc + (size_t)j * PANEL;
        __m512d lo, hi;
        if (t64) { /* (int64 to double without AVX512DQ, which the tables do not require) */
            const int64_t *t = t64 + (size_t)j * PANEL;
            lo = _mm512_setr_pd((double)t[0], (double)t[1], (double)t[2], (double)t[3],
                                (double)t[4], (double)t[5], (double)t[6], (double)t[7]);
            hi = _mm512_setr_pd((double)t[8], (double)t[9], (double)t[10], (double)t[11],
                                (double)t[12], (double)t[13], (double)t[14], (double)t[15]);
        } else {
            lo = _mm512_cvtepi32_pd(_mm512_castsi512_si256(acc[j]));
            hi = _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(acc[j], 1));
        }
        _mm512_storeu_pd(d, _mm512_add_pd(_mm512_loadu_pd(d), _mm512_mul_pd(s0, lo)));
        _mm512_storeu_pd(d + 8, _mm512_add_pd(_mm512_loadu_pd(d + 8), _mm512_mul_pd(s1, hi)));
    }
}

/* t64[j][i] += the int32 lanes of acc[j] (a run of a sub-block longer than RUN columns). */
VNNI512_FN static void widen_lanes_zmm(int64_t *t64, const __m512i *acc, int n) {
    for (int j = 0; j < n; j++) {
        int64_t *t = t64 + (size_t)j * PANEL;
        __m512i lo = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(acc[j]));
        __m512i hi = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(acc[j], 1));
        _mm512_storeu_si512((void *)t, _mm512_add_epi64(_mm512_loadu_si512((const void *)t), lo));
        _mm512_storeu_si512((void *)(t + 8),
                            _mm512_add_epi64(_mm512_loadu_si512((const void *)(t + 8)), hi));
    }
}

/* block() of the quad form: x[j] the inputs' q and mb[j] their block multipliers, mqs[j] their
 * per-block m * (sum of q), all from column s0 * G (P's first column). */
VNNI512_FN static void block_quads(double *dacc, const int32_t *P, const int8_t *const *x,
                                   const uint8_t *const *mb, const int32_t *const *mqs,
                                   const double *scd, const I8Layout *L, int s0, int s1,
                                   int cols, int n) {
    const int G = L->group_size, base = s0 * G;
    __m512i acc[NB];
    for (int s = s0; s < s1; s++) {
        int c0 = s * G - base, c1 = (s * G + G < cols ? s * G + G : cols) - base;
        int k1 = ((c1 + 31) & ~31) / 4;
        if (k1 - c0 / 4 <= RUN / 4) {
            micro6q(acc, P, x, mb, c0 / 4, k1);
            unbias_lanes(acc, mqs, c0 / 32, k1 / 8);
            combine_lanes_zmm(dacc, scd + (size_t)s * PANEL, acc, NULL, n);
        } else {
            int64_t t64[NB * PANEL] = {0};
            for (int k = c0 / 4; k < k1; k += RUN / 4) {
                int ke = k + RUN / 4 < k1 ? k + RUN / 4 : k1;
                micro6q(acc, P, x, mb, k, ke);
                unbias_lanes(acc, mqs, k / 8, ke / 8);
                widen_lanes_zmm(t64, acc, n);
            }
            combine_lanes_zmm(dacc, scd + (size_t)s * PANEL, acc, t64, n);
        }
    }
}

/* mqs[b] = m[b] * (sum of q over block b) for the n_pad / 32 blocks of one input: the sum of
 * the 32 bytes q + 128 by vpsadbw against zero, less 32 * 128. */
AVX2_FN static void block_qsums(int32_t *mqs, const QuantActs *qa) {
    const __m256i flip = _mm256_set1_epi8(-128), zero = _mm256_setzero_si256();
    for (int b = 0; b < qa->n_pad / 32; b++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(qa->q + 32 * b));
        __m256i s4 = _mm256_sad_epu8(_mm256_xor_si256(v, flip), zero); /* four u64 sums */
        __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
        int32_t sq = (int32_t)(_mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1)) - 32 * 128;
        mqs[b] = (int32_t)qa->m[b] * sq;
    }
}

/* gemm() in the quad form (I8GemmFn; G % 32 == 0). */
AVX2_BMI2_FN static void gemm_quads(float *Y, const QuantActs *qa, int T, const I8Layout *L,
                                    int r0, int r1, int rows, int cols) {
    const int n_pad = qa[0].n_pad, G = L->group_size, n_sub = L->n_sub, nblk = n_pad / 32;
    const int sb_per_block = G >= KBLOCK ? 1 : KBLOCK / G;
    const int kmax = ((sb_per_block * G < cols ? sb_per_block * G : cols) + 31) & ~31;
    int32_t *mqs = alloc_or_die((size_t)T * (size_t)nblk * sizeof *mqs, "activation sums");
    uint8_t *tmp = alloc_or_die((size_t)PANEL * (size_t)kmax, "decoded rows");
    int32_t *P = alloc_or_die((size_t)kmax / 4 * PANEL * sizeof *P, "weight panel");
    double *dacc = alloc_or_die((size_t)T * PANEL * sizeof *dacc, "sums");
    double *scd = alloc_or_die((size_t)n_sub * PANEL * sizeof *scd, "scales");
    for (int t = 0; t < T; t++) block_qsums(mqs + (size_t)t * (size_t)nblk, &qa[t]);
    for (int rp = r0; rp < r1; rp += PANEL) {
        const int R = r1 - rp < PANEL ? r1 - rp : PANEL;
        panel_scales(scd, L, rp, R);
        memset(dacc, 0, (size_t)T * PANEL * sizeof *dacc);
        for (int s0 = 0, s1; s0 < n_sub; s0 = s1) {
            s1 = load_panel_block(P, tmp, kmax, 1, L, rp, R, cols, s0);
            if (s1 < n_sub) prefetch_panel_block(L, rp, r1, cols, s1);
            else prefetch_panel_block(L, rp + PANEL, r1, cols, 0);
            for (int t = 0; t < T; t += NB) {
                const int n = T - t < NB ? T - t : NB;
                const int8_t *x[NB];
                const uint8_t *mb[NB];
                const int32_t *mq[NB];
                for (int j = 0; j < NB; j++) { /* past the last input: repeat it (not stored) */
                    const size_t tj = (size_t)(t + (j < n ? j : n - 1));
                    /* the next panel's line of Y into L2 for writing while this one is
                     * computed: its stores then do not wait for the line (Y is larger than
                     * the caches, and store_panel writes one line per input) */
                    if (s0 == 0 && j < n && rp + PANEL < r1)
                        __builtin_prefetch(Y + tj * (size_t)rows + (size_t)(rp + PANEL), 1, 2);
                    x[j] = qa[tj].q + (size_t)s0 * (size_t)G;
                    mb[j] = qa[tj].m + (size_t)s0 * (size_t)G / 32;
                    mq[j] = mqs + tj * (size_t)nblk + (size_t)s0 * (size_t)G / 32;
                }
                block_quads(dacc + (size_t)t * PANEL, P, x, mb, mq, scd, L, s0, s1, cols, n);
            }
        }
        store_panel(Y, dacc, qa, T, rows, rp, R);
    }
    free(scd);
    free(dacc);
    free(P);
    free(tmp);
    free(mqs);
}

/* kernels.h I8GemmFn: Y[t][r] (row stride rows) for t < T, r in [r0, r1), G % 32 == 0; the
 * avx2 table's (vpmaddwd), the avxvnni table's (VEX vpdpwssd) and the AVX-512 tables' (the
 * quad form: vpdpbusd on zmm). */
AVX2_BMI2_FN void i8cb_gemm_avx2(float *Y, const QuantActs *qa, int T, const I8Layout *L,
                                 int r0, int r1, int rows, int cols, const GemmPrep *prep) {
    gemm(&MICRO6_AVX2, Y, qa, T, L, r0, r1, rows, cols, prep);
}

AVX2_BMI2_FN void i8cb_gemm_avxvnni(float *Y, const QuantActs *qa, int T, const I8Layout *L,
                                    int r0, int r1, int rows, int cols, const GemmPrep *prep) {
    gemm(&MICRO6_AVXVNNI, Y, qa, T, L, r0, r1, rows, cols, prep);
}

AVX2_BMI2_FN void i8cb_gemm_avx512vnni(float *Y, const QuantActs *qa, int T, const I8Layout *L,
                                       int r0, int r1, int rows, int cols, const GemmPrep *prep) {
    (void)prep; /* the quad form reads q and m directly */
    gemm_quads(Y, qa, T, L, r0, r1, rows, cols);
}

#endif
