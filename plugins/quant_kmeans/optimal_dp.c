/* Optimal 1-D k-means of every sub-block of a matrix: the ``optimal`` method of the kmeans
 * quantizer in C (docs/QUANT.md, "Speed").
 *
 * The result is, byte for byte, that of the reference kernel ``kmeans1d._optimal_ws`` (numba):
 * the dynamic programme of Ckmeans.1d.dp (Wang & Song 2011), ``D[q][i] = min_j D[q-1][j] +
 * SSE(j, i)``, whose arg-minimum of cell (q, i) is the lowest j of the smallest value in the
 * Knuth window ``W(q, i) = [J[q-1][i], min(i - 1, J[q][i+1])]`` (Grønlund et al. 2017, §2), the
 * layer filled for i descending.  Every value is computed with the reference's operations in
 * its order (build with -ffp-contract=off, no fast-math), so equal windows give equal bits.
 *
 * What differs is how the windows are scanned.  The reference scans one cell at a time, and
 * the upper end of a cell's window is the arg-minimum just found for the cell above: a serial
 * chain with a mispredicted loop exit per cell.  Here four cells i0 > i1 > i2 > i3 are
 * scanned together, one SIMD lane each, over the union window [min_l J[q-1][i_l], J[q][i0+1]]
 * (the Knuth upper bound of i0's window bounds all four in exact arithmetic).  Each lane's
 * minimum over that window equals the reference's minimum over its own window W(q, i_l)
 * whenever W(q, i_l) lies inside the union window and the lane's arg-minimum lies inside
 * W(q, i_l): the lowest arg-minimum of a set that lies in a subset is that subset's lowest
 * arg-minimum.  Both conditions are checked lane by lane, i descending, against the exact
 * windows (which need the arg-minima accepted just before: all four lanes at once when they all
 * pass, lane by lane otherwise); a lane that fails — rounding can break the monotonicity the
 * bound relies on — is rescanned over its exact window as the reference does.  So the output
 * equals the reference's in every case, not only in exact arithmetic;
 * tests/test_quant_dp_kernel.py checks it on many thousands of blocks.
 *
 * Which cells are computed differs too.  The result is read off the backtrack from cell (k, m),
 * and a cell's value and arg-minimum depend only on the cell above it in its layer (the upper
 * end of its window), the cell of layer q - 1 naming the lower end, and the cells of layer
 * q - 1 inside its window.  The reference fills every layer completely; here the layers are
 * filled top down on demand from cell (k, m) (``ensure``): each layer is computed from its top
 * down to its lowest cell computed so far, and before a cell (or a group of four) is scanned,
 * layer q - 1 is extended down to the cells it reads.  Every computed cell so gets exactly the
 * inputs, and so the value and arg-minimum, it has in the full layers, and the cells below
 * what (k, m) depends on are never computed: on bf16 blocks at b = 4, G = 256, 410 groups of
 * four and 25 single cells per sub-block instead of 712 and 184, 21 % fewer union-window steps.
 *
 * On blocks of mostly distinct values (bf16 weights; ``tab``), the groups hold eight cells
 * (two AVX2 vectors sharing each candidate's loads, checked in two vectors: half the groups,
 * so half the latency at the end of each scan that the group below waits for), and a
 * vector's reciprocals inv[c] come from the table instead of a division where that is cheap:
 * when its four cells hold one value each (three in four vectors on bf16 blocks), their
 * counts are consecutive and the four reciprocals are four consecutive table entries; with
 * AVX-512VL, when the counts span at most 8, a permute of eight consecutive entries picks
 * them.  The values are the same.  (On a Zen 3 a two-permute pick without AVX-512 was slower
 * than the division.)  On blocks with many repeated values (Q4_1 grids) the choice would
 * mispredict group by group, and the four-cell scan with divisions is kept.  Eight cells
 * and the table are 1.27x faster than four cells with divisions on bf16 blocks at b = 4,
 * G = 256 on a Xeon with AVX-512, 1.17x on an AVX2-only Zen 3 (docs/QUANT.md, "Speed").
 *
 * Entry point: ``ditto_kmeans_optimal_matrix`` (all sub-blocks, worker threads taking units
 * of 16 sub-blocks from a shared counter; sub-blocks share nothing, so the bytes do not depend
 * on the thread count).  Without AVX2 the lanes are plain C arrays the compiler may vectorise.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define UNIT_BLOCKS 16 /* sub-blocks per unit of work */
#define PAD 8          /* slack before index 0 of the work rows (lanes below the layer) */
#define INV_PAD 16     /* entries after the reciprocal table that the lane scans may load */

/* per-thread work arrays for sub-blocks of up to n distinct values and k clusters */
typedef struct {
    int64_t n, k, ld;
    double *u;            /* distinct values [n] */
    int64_t *w;           /* their multiplicities [n] */
    double *p0f, *p1, *p2; /* prefix sums of w, w·(u-mu), w·(u-mu)^2 [ld], p0f as double */
    double *dprev, *dcur; /* the rows of D the scans read and write (layers q - 1, q) */
    double *lorow;        /* lower ends of the windows of the cells being scanned */
    double *D;            /* D[q][i], [(k + 1) x ld] */
    int32_t *arg;         /* arg-minima [(k + 1) x ld] */
    int64_t *low;         /* lowest cell computed so far in each layer [k + 1] */
    int64_t *p0i;         /* the prefix sums of w as integers [ld] */
    int tab;              /* most values of the block distinct (optimal_block): the lane scans
                           * take the reciprocals from the table, eight cells a group */
    void *mem;
} work_t;

static int work_init(work_t *wk, int64_t n, int64_t k)
{
    int64_t ld = n + 1 + 2 * PAD;
    size_t nd = (size_t)(n + (5 + k) * ld), ni = (size_t)(n + k + 1 + ld),
           na = (size_t)((k + 1) * ld);
    wk->mem = malloc(nd * sizeof(double) + ni * sizeof(int64_t) + na * sizeof(int32_t));
    if (!wk->mem)
        return -1;
    wk->n = n;
    wk->k = k;
    wk->ld = ld;
    double *d = (double *)wk->mem;
    wk->u = d;
    d += n;
    wk->p0f = d + PAD;
    wk->p1 = d + ld + PAD;
    wk->p2 = d + 2 * ld + PAD;
    wk->lorow = d + 3 * ld + PAD;
    wk->D = d + 4 * ld + PAD;
    wk->dprev = wk->dcur = wk->D;
    wk->w = (int64_t *)(d + (5 + k) * ld);
    wk->low = wk->w + n;
    wk->p0i = wk->low + k + 1 + PAD;
    memset(wk->p0i - PAD, 0, (size_t)ld * sizeof(int64_t));
    wk->arg = (int32_t *)(wk->p0i - PAD + ld);
    memset(d, 0, (size_t)(5 + k) * (size_t)ld * sizeof(double));
    return 0;
}

/* Exact scan of W = [jlo, jhi] for cell i, as the reference: lowest j of the smallest value
 * (empty window: +inf at jlo). */
static inline void scan_window(const work_t *wk, const double *inv, int64_t i, int64_t jlo,
                               int64_t jhi, double *best_out, int64_t *bj_out)
{
    const double *p0f = wk->p0f, *p1 = wk->p1, *p2 = wk->p2, *dprev = wk->dprev;
    int64_t s0 = (int64_t)p0f[i];
    double s1 = p1[i], s2 = p2[i], best = INFINITY;
    int64_t bj = jlo;
    for (int64_t j = jlo; j <= jhi; j++) {
        double a = s1 - p1[j];
        double v = dprev[j] + (s2 - p2[j]) - a * a * inv[s0 - (int64_t)p0f[j]];
        if (v < best) {
            best = v;
            bj = j;
        }
    }
    *best_out = best;
    *bj_out = bj;
}

/* Lane minima of four cells ibot..ibot+3 over [jmin, jmax] (j < ibot, so no lane needs a
 * mask): best[l], bj[l] for cell ibot + l, ties to the lowest j.  Returns 1 when every lane
 * passes the check of optimal_block against its exact window (the window of cell ibot + l
 * ends at min(ibot + l - 1, bj[l + 1]), that of ibot + 3 at min(ibot + 2, jmax)) and then
 * stores the four cells' values and arg-minima itself; returns 0 to leave the check to the
 * caller. */
static inline int scan_lanes(const work_t *wk, const double *inv, int64_t ibot, int64_t jmin,
                             int64_t jmax, int32_t *A, double best[4], double bj[4])
{
    const double *p0f = wk->p0f, *p1 = wk->p1, *p2 = wk->p2, *dprev = wk->dprev;
    (void)inv;
#if defined(__AVX2__)
    const __m256d one = _mm256_set1_pd(1.0);
    __m256d S0 = _mm256_loadu_pd(p0f + ibot), S1 = _mm256_loadu_pd(p1 + ibot);
    __m256d S2 = _mm256_loadu_pd(p2 + ibot);
    __m256d B = _mm256_set1_pd(INFINITY), BJ = _mm256_set1_pd((double)jmin);
    /* two running minima (even and odd offsets from jmin) halve the dependency chain; the
     * minimum itself by vminpd (v < B ? v : B, the blend's rule), the candidate index as a
     * running vector */
    __m256d B2 = B, BJ2 = BJ;
    __m256d JV = BJ, JV2 = _mm256_add_pd(BJ, one), two = _mm256_set1_pd(2.0);
    /* one candidate jj for all four lanes, IV_ the lanes' reciprocals 1/c (c = p0[ibot + l]
     * - p0[jj], an exact integer): each way of getting them below gives inv[c] of the
     * reference */
#define CAND(Bx, BJx, JVx, jj, IV_)                                                              \
    do {                                                                                         \
        __m256d a_ = _mm256_sub_pd(S1, _mm256_set1_pd(p1[jj]));                                   \
        __m256d iv_ = (IV_);                                                                     \
        __m256d v_ = _mm256_sub_pd(                                                              \
            _mm256_add_pd(_mm256_set1_pd(dprev[jj]), _mm256_sub_pd(S2, _mm256_set1_pd(p2[jj]))), \
            _mm256_mul_pd(_mm256_mul_pd(a_, a_), iv_));                                           \
        __m256d lt_ = _mm256_cmp_pd(v_, Bx, _CMP_LT_OQ);                                          \
        Bx = _mm256_min_pd(v_, Bx);                                                              \
        BJx = _mm256_blendv_pd(BJx, JVx, lt_);                                                   \
        JVx = _mm256_add_pd(JVx, two);                                                           \
    } while (0)
#define SCAN(IV)                                                                                 \
    do {                                                                                         \
        for (; j + 1 <= jmax; j += 2) {                                                          \
            CAND(B, BJ, JV, j, IV(j));                                                           \
            CAND(B2, BJ2, JV2, j + 1, IV(j + 1));                                                \
        }                                                                                        \
        if (j <= jmax)                                                                           \
            CAND(B, BJ, JV, j, IV(j));                                                           \
    } while (0)
    int64_t j = jmin;
    const int64_t *p0i = wk->p0i, s00 = p0i[ibot];
    /* correctly rounded 1/c = inv[c] */
#define IV_DIV(jj) _mm256_div_pd(one, _mm256_sub_pd(S0, _mm256_set1_pd(p0f[jj])))
    /* four distinct values (counts c0 .. c0 + 3): the table's four consecutive entries */
#define IV_SEQ(jj) _mm256_loadu_pd(inv + (s00 - p0i[jj]))
    if (wk->tab && p0i[ibot + 3] - s00 == 3) {
        SCAN(IV_SEQ);
    }
#if defined(__AVX512VL__)
    else if (wk->tab && p0i[ibot + 3] - s00 <= 7) {
        /* counts c0 + d[l], d[l] <= 7: picked out of inv[c0 .. c0 + 7] as in scan_lanes8 */
        const __m256i dl = _mm256_sub_epi64(_mm256_loadu_si256((const __m256i *)(p0i + ibot)),
                                            _mm256_set1_epi64x(s00));
#define IV_PERM(jj)                                                                              \
    _mm256_permutex2var_pd(_mm256_loadu_pd(inv + (s00 - p0i[jj])), dl,                          \
                           _mm256_loadu_pd(inv + (s00 - p0i[jj]) + 4))
        SCAN(IV_PERM);
#undef IV_PERM
    }
#endif
    else {
        SCAN(IV_DIV);
    }
#undef IV_SEQ
#undef IV_DIV
#undef SCAN
#undef CAND
    /* merge: the smaller value, on equal values the lower j */
    __m256d take2 = _mm256_or_pd(_mm256_cmp_pd(B2, B, _CMP_LT_OQ),
                                 _mm256_and_pd(_mm256_cmp_pd(B2, B, _CMP_EQ_OQ),
                                               _mm256_cmp_pd(BJ2, BJ, _CMP_LT_OQ)));
    B = _mm256_blendv_pd(B, B2, take2);
    BJ = _mm256_blendv_pd(BJ, BJ2, take2);
    /* the exact upper ends if the lanes above are accepted: lane l takes lane l + 1's
     * arg-minimum, lane 3 the bound jmax (= J[q][ibot + 4]) */
    __m256d next = _mm256_blend_pd(_mm256_permute4x64_pd(BJ, 0xF9), _mm256_set1_pd((double)jmax),
                                   0x8);
    __m256d ilim = _mm256_add_pd(_mm256_set1_pd((double)(ibot - 1)), _mm256_setr_pd(0, 1, 2, 3));
    __m256d thi = _mm256_min_pd(ilim, next);
    __m256d ok = _mm256_and_pd(_mm256_cmp_pd(BJ, thi, _CMP_LE_OQ),
                               _mm256_cmp_pd(BJ, _mm256_loadu_pd(wk->lorow + ibot), _CMP_GE_OQ));
    if (_mm256_movemask_pd(ok) == 0xF) {
        _mm256_storeu_pd(wk->dcur + ibot, B);
        _mm_storeu_si128((__m128i *)(A + ibot), _mm256_cvttpd_epi32(BJ));
        return 1;
    }
    _mm256_storeu_pd(best, B);
    _mm256_storeu_pd(bj, BJ);
    return 0;
#else
    double S0[4], S1[4], S2[4], B[4], BJ[4];
    for (int l = 0; l < 4; l++) {
        S0[l] = p0f[ibot + l];
        S1[l] = p1[ibot + l];
        S2[l] = p2[ibot + l];
        B[l] = INFINITY;
        BJ[l] = (double)jmin;
    }
    for (int64_t j = jmin; j <= jmax; j++) {
        double pj0 = p0f[j], pj1 = p1[j], pj2 = p2[j], dj = dprev[j];
        for (int l = 0; l < 4; l++) {
            double a = S1[l] - pj1;
            double iv = 1.0 / (S0[l] - pj0);
            double v = dj + (S2[l] - pj2) - a * a * iv;
            int lt = v < B[l];
            B[l] = lt ? v : B[l];
            BJ[l] = lt ? (double)j : BJ[l];
        }
    }
    memcpy(best, B, sizeof B);
    memcpy(bj, BJ, sizeof BJ);
    (void)A;
    return 0;
#endif
}

#if defined(__AVX2__)
#define LANES8 1
/* Lane minima of eight cells ibot..ibot+7 over [jmin, jmax] (j < ibot), two AVX2 vectors of
 * four (cells ibot..ibot+3 and ibot+4..ibot+7) sharing each candidate's loads: best[l],
 * bj[l] for cell ibot + l, ties to the lowest j, with the operations of scan_window per
 * lane.  Returns 1 when every lane passes the check of accept_lanes against its exact window
 * (lower end lo[l]; upper end min(ibot + l - 1, bj[l + 1]), for cell ibot + 7 min(ibot + 6,
 * jmax)), having stored the eight cells' values and arg-minima; 0 leaves the check to the
 * caller. */
static inline int scan_lanes8(const work_t *wk, const double *inv, int64_t ibot, int64_t jmin,
                              int64_t jmax, const int64_t *lo, int32_t *A, double best[8],
                              double bj[8])
{
    const double *p0f = wk->p0f, *p1 = wk->p1, *p2 = wk->p2, *dprev = wk->dprev;
    const int64_t *p0i = wk->p0i;
    const __m256d one = _mm256_set1_pd(1.0);
    __m256d S0a = _mm256_loadu_pd(p0f + ibot), S1a = _mm256_loadu_pd(p1 + ibot);
    __m256d S2a = _mm256_loadu_pd(p2 + ibot);
    __m256d S0b = _mm256_loadu_pd(p0f + ibot + 4), S1b = _mm256_loadu_pd(p1 + ibot + 4);
    __m256d S2b = _mm256_loadu_pd(p2 + ibot + 4);
    __m256d Ba = _mm256_set1_pd(INFINITY), BJa = _mm256_set1_pd((double)jmin);
    __m256d Bb = Ba, BJb = BJa, JV = BJa;
    /* one candidate j for both vectors; IVA/IVB give the reciprocals 1/c of the lanes' counts
     * (exactly the reference's inv[c]) */
#define CAND8(IVA, IVB)                                                                          \
    for (int64_t j = jmin; j <= jmax; j++) {                                                     \
        __m256d pj1 = _mm256_set1_pd(p1[j]), pj2 = _mm256_set1_pd(p2[j]);                        \
        __m256d dj = _mm256_set1_pd(dprev[j]);                                                   \
        __m256d aa = _mm256_sub_pd(S1a, pj1), ab = _mm256_sub_pd(S1b, pj1);                      \
        __m256d va = _mm256_sub_pd(_mm256_add_pd(dj, _mm256_sub_pd(S2a, pj2)),                   \
                                   _mm256_mul_pd(_mm256_mul_pd(aa, aa), IVA));                    \
        __m256d vb = _mm256_sub_pd(_mm256_add_pd(dj, _mm256_sub_pd(S2b, pj2)),                   \
                                   _mm256_mul_pd(_mm256_mul_pd(ab, ab), IVB));                    \
        __m256d lta = _mm256_cmp_pd(va, Ba, _CMP_LT_OQ), ltb = _mm256_cmp_pd(vb, Bb, _CMP_LT_OQ); \
        Ba = _mm256_min_pd(va, Ba);                                                              \
        Bb = _mm256_min_pd(vb, Bb);                                                              \
        BJa = _mm256_blendv_pd(BJa, JV, lta);                                                    \
        BJb = _mm256_blendv_pd(BJb, JV, ltb);                                                    \
        JV = _mm256_add_pd(JV, one);                                                             \
    }
    const int64_t sa = p0i[ibot], sb = p0i[ibot + 4];
    /* each vector's reciprocals (lane l's count is c0 + d[l], c0 = p0[ibot] - p0[j], d[l] =
     * p0[ibot + l] - p0[ibot], likewise from ibot + 4): with four distinct values (d = 0, 1,
     * 2, 3) four consecutive table entries; else with AVX-512VL and d[3] <= 7 a permute of
     * inv[c0 .. c0 + 7]; else a division.  All give inv[c] of the reference. */
#define IV_SEQ(s_) _mm256_loadu_pd(inv + (s_ - p0i[j]))
#define IV_DIV(S_) _mm256_div_pd(one, _mm256_sub_pd(S_, _mm256_set1_pd(p0f[j])))
    const int seqa = p0i[ibot + 3] - sa == 3, seqb = p0i[ibot + 7] - sb == 3;
    if (seqa && seqb) {
        CAND8(IV_SEQ(sa), IV_SEQ(sb))
    }
#if defined(__AVX512VL__)
    else if (p0i[ibot + 3] - sa <= 7 && p0i[ibot + 7] - sb <= 7) {
        const __m256i da = _mm256_sub_epi64(_mm256_loadu_si256((const __m256i *)(p0i + ibot)),
                                            _mm256_set1_epi64x(sa));
        const __m256i db = _mm256_sub_epi64(
            _mm256_loadu_si256((const __m256i *)(p0i + ibot + 4)), _mm256_set1_epi64x(sb));
#define IV_PERM(s_, d_)                                                                          \
    _mm256_permutex2var_pd(_mm256_loadu_pd(inv + (s_ - p0i[j])), d_,                            \
                           _mm256_loadu_pd(inv + (s_ - p0i[j]) + 4))
        CAND8(IV_PERM(sa, da), IV_PERM(sb, db))
#undef IV_PERM
    }
#endif
    else if (seqa) {
        CAND8(IV_SEQ(sa), IV_DIV(S0b))
    } else if (seqb) {
        CAND8(IV_DIV(S0a), IV_SEQ(sb))
    } else {
        CAND8(IV_DIV(S0a), IV_DIV(S0b))
    }
#undef IV_DIV
#undef IV_SEQ
#undef CAND8
    /* the exact upper ends if the lanes above are accepted: lane l takes lane l + 1's
     * arg-minimum, lane 7 the bound jmax */
    __m256d na = _mm256_blend_pd(_mm256_permute4x64_pd(BJa, 0xF9),
                                 _mm256_permute4x64_pd(BJb, 0x00), 0x8);
    __m256d nb = _mm256_blend_pd(_mm256_permute4x64_pd(BJb, 0xF9), _mm256_set1_pd((double)jmax),
                                 0x8);
    __m256d ia = _mm256_add_pd(_mm256_set1_pd((double)(ibot - 1)), _mm256_setr_pd(0, 1, 2, 3));
    __m256d ib = _mm256_add_pd(ia, _mm256_set1_pd(4.0));
    /* the lower ends are cell indices (< 2^31), exact as int32 and as double */
    __m256d loa = _mm256_cvtepi32_pd(_mm_setr_epi32((int32_t)lo[0], (int32_t)lo[1],
                                                    (int32_t)lo[2], (int32_t)lo[3]));
    __m256d lob = _mm256_cvtepi32_pd(_mm_setr_epi32((int32_t)lo[4], (int32_t)lo[5],
                                                    (int32_t)lo[6], (int32_t)lo[7]));
    __m256d oka = _mm256_and_pd(_mm256_cmp_pd(BJa, _mm256_min_pd(ia, na), _CMP_LE_OQ),
                                _mm256_cmp_pd(BJa, loa, _CMP_GE_OQ));
    __m256d okb = _mm256_and_pd(_mm256_cmp_pd(BJb, _mm256_min_pd(ib, nb), _CMP_LE_OQ),
                                _mm256_cmp_pd(BJb, lob, _CMP_GE_OQ));
    if (_mm256_movemask_pd(_mm256_and_pd(oka, okb)) == 0xF) {
        _mm256_storeu_pd(wk->dcur + ibot, Ba);
        _mm256_storeu_pd(wk->dcur + ibot + 4, Bb);
        _mm_storeu_si128((__m128i *)(A + ibot), _mm256_cvttpd_epi32(BJa));
        _mm_storeu_si128((__m128i *)(A + ibot + 4), _mm256_cvttpd_epi32(BJb));
        return 1;
    }
    _mm256_storeu_pd(best, Ba);
    _mm256_storeu_pd(best + 4, Bb);
    _mm256_storeu_pd(bj, BJa);
    _mm256_storeu_pd(bj + 4, BJb);
    return 0;
}
#endif

/* Cell (q, i)'s window starts at J[q-1][min(i, top of layer q-1)] (at 1 in layer 2): the lower
 * Knuth bound, as the reference takes it. The cell it names must be computed. */
static inline int64_t window_low(const work_t *wk, int64_t q, int64_t i, int64_t ihi)
{
    if (q <= 2)
        return q - 1;
    int64_t a = wk->arg[(q - 1) * wk->ld + (i < ihi - 1 ? i : ihi - 1)];
    return a > q - 1 ? a : q - 1;
}

/* window_low of the n cells i..i+n-1 into lo[0..n); returns the smallest. */
static inline int64_t window_lows(const work_t *wk, int64_t q, int64_t i, int64_t ihi, int n,
                                  int64_t *lo)
{
    int64_t m = lo[0] = window_low(wk, q, i, ihi);
    for (int l = 1; l < n; l++) {
        lo[l] = window_low(wk, q, i + l, ihi);
        m = lo[l] < m ? lo[l] : m;
    }
    return m;
}

/* Layer q computed down to cell i (at least), top down as the reference fills it: the cells
 * of layer q - 1 that the scans read (the windows' lower ends and the candidates j) are
 * computed first, on demand, by the same rule.  Every cell so computed has the inputs, and so
 * the value and arg-minimum, it has in the reference's full layers; cells no window of the
 * final cell's dependency reaches are never computed. */
static void ensure(work_t *wk, const double *inv, int64_t m, int64_t width, int64_t q, int64_t i);

/* ensure(), with the common case — nothing to compute — decided without a call */
#define ENSURE(q_, i_)                                                                           \
    do {                                                                                         \
        int64_t qq_ = (q_), ii_ = (i_);                                                          \
        if (qq_ >= 2 && wk->low[qq_] > ii_)                                                      \
            ensure(wk, inv, m, width, qq_, ii_);                                                 \
    } while (0)

/* After a lane scan that did not pass as a whole: cell c = ibot + l (l = L - 1 .. 0) takes its
 * lane's minimum when its exact window [lo[l], min(c - 1, A[c + 1])] lies in [.., ub] and
 * holds the lane's arg-minimum; otherwise its exact window is scanned. */
static void accept_lanes(work_t *wk, const double *inv, int32_t *A, double *Dq, int64_t ibot,
                         int L, const int64_t *lo, int64_t ub, const double *best,
                         const double *bjd)
{
    for (int64_t c = ibot + L - 1; c >= ibot; c--) {
        int l = (int)(c - ibot);
        int64_t jlo = lo[l];
        int64_t thi = c - 1;
        if (A[c + 1] < thi)
            thi = A[c + 1];
        int64_t bj = (int64_t)bjd[l];
        if (thi <= ub && bj <= thi && bj >= jlo) {
            Dq[c] = best[l];
            A[c] = (int32_t)bj;
        } else {
            double b;
            scan_window(wk, inv, c, jlo, thi, &b, &bj);
            Dq[c] = b;
            A[c] = (int32_t)bj;
        }
    }
}

static void ensure(work_t *wk, const double *inv, int64_t m, int64_t width, int64_t q, int64_t i)
{
    int64_t ld = wk->ld, k = wk->k;
    int64_t ihi = q + width - 1, ilo = q == k ? m : q;
    double *Dq = wk->D + q * ld, *Dp = wk->D + (q - 1) * ld;
    int32_t *A = wk->arg + q * ld;
    (void)k;
    while (wk->low[q] > i) {
        int64_t itop = wk->low[q] - 1;
        int64_t ub = itop == ihi ? itop - 1 : A[itop + 1]; /* Knuth bound of cell itop */
        int64_t ibot = itop - 3;
        if (itop == ihi || ibot < ilo || ub > ibot - 1) {
            /* one cell on its own: the top one (its bound is i - 1), the last ones of the
             * layer, or a window reaching past the lowest lane's i */
            ENSURE(q - 1, itop < ihi - 1 ? itop : ihi - 1);
            int64_t jlo = window_low(wk, q, itop, ihi);
            ENSURE(q - 1, jlo);
            double best;
            int64_t bj;
            wk->dprev = Dp;
            wk->dcur = Dq;
            wk->lorow[itop] = (double)jlo;
            scan_window(wk, inv, itop, jlo, itop - 1 < ub ? itop - 1 : ub, &best, &bj);
            Dq[itop] = best;
            A[itop] = (int32_t)bj;
            wk->low[q] = itop;
            continue;
        }
#if defined(LANES8)
        /* eight cells a group on blocks of mostly distinct values: half the groups, so half
         * the per-group latency (the scan's end, the checks) that the next group waits for;
         * the union window grows by ~4 candidates, shared by eight lanes */
        int64_t ib8 = itop - 7;
        if (wk->tab && ib8 >= ilo && ub <= ib8 - 1) {
            ENSURE(q - 1, ib8 < ihi - 1 ? ib8 : ihi - 1);
            int64_t lo8[8], jmin8;
            if (q > 2 && itop < ihi - 1) {
                /* window_low of the eight cells: max(q - 1, J[q - 1][i]) */
                __m256i a = _mm256_max_epi32(
                    _mm256_loadu_si256((const __m256i *)(wk->arg + (q - 1) * ld + ib8)),
                    _mm256_set1_epi32((int32_t)(q - 1)));
                _mm256_storeu_si256((__m256i *)lo8,
                                    _mm256_cvtepi32_epi64(_mm256_castsi256_si128(a)));
                _mm256_storeu_si256((__m256i *)(lo8 + 4),
                                    _mm256_cvtepi32_epi64(_mm256_extracti128_si256(a, 1)));
                __m128i mn = _mm_min_epi32(_mm256_castsi256_si128(a),
                                           _mm256_extracti128_si256(a, 1));
                mn = _mm_min_epi32(mn, _mm_shuffle_epi32(mn, 0x4E));
                mn = _mm_min_epi32(mn, _mm_shuffle_epi32(mn, 0xB1));
                jmin8 = _mm_cvtsi128_si32(mn);
            } else {
                jmin8 = window_lows(wk, q, ib8, ihi, 8, lo8);
            }
            ENSURE(q - 1, jmin8);
            wk->dprev = Dp;
            wk->dcur = Dq;
            double best8[8], bjd8[8];
            wk->low[q] = ib8;
            if (!scan_lanes8(wk, inv, ib8, jmin8, ub, lo8, A, best8, bjd8))
                accept_lanes(wk, inv, A, Dq, ib8, 8, lo8, ub, best8, bjd8);
            continue;
        }
#endif
        ENSURE(q - 1, ibot < ihi - 1 ? ibot : ihi - 1);
        int64_t lo[4];
        int64_t jmin = window_lows(wk, q, ibot, ihi, 4, lo);
        ENSURE(q - 1, jmin);
        wk->dprev = Dp;
        wk->dcur = Dq;
        for (int l = 0; l < 4; l++)
            wk->lorow[ibot + l] = (double)lo[l];
        double best[4], bjd[4];
        wk->low[q] = ibot;
        if (scan_lanes(wk, inv, ibot, jmin, ub, A, best, bjd))
            continue;
        accept_lanes(wk, inv, A, Dq, ibot, 4, lo, ub, best, bjd);
    }
}

/* The optimal partition of the m distinct sorted values wk->u with multiplicities wk->w into
 * k clusters (m > k); centroids ascending into cent, returns the SSE. */
static double optimal_block(work_t *wk, int64_t m, int64_t k, const double *inv, double *cent)
{
    const double *u = wk->u;
    const int64_t *w = wk->w;
    double *p0f = wk->p0f, *p1 = wk->p1, *p2 = wk->p2;
    int32_t *arg = wk->arg;
    int64_t ld = wk->ld;

    double tot = 0.0;
    int64_t cnt = 0;
    for (int64_t i = 0; i < m; i++) {
        tot += w[i] * u[i];
        cnt += w[i];
    }
    double mu = tot / cnt;
    int64_t c0 = 0;
    double a1 = 0.0, a2 = 0.0;
    p0f[0] = 0.0;
    wk->p0i[0] = 0;
    p1[0] = 0.0;
    p2[0] = 0.0;
    for (int64_t i = 0; i < m; i++) {
        double d = u[i] - mu;
        c0 += w[i];
        a1 += w[i] * d;
        a2 += w[i] * d * d;
        p0f[i + 1] = (double)c0;
        wk->p0i[i + 1] = c0;
        p1[i + 1] = a1;
        p2[i + 1] = a2;
    }
    int64_t width = m - k + 1; /* layer q < k is needed for i in [q, q + width - 1] */
    /* most of the values distinct (bf16 weights: ~230 of 256): the counts of four
     * consecutive cells then nearly always span at most 8 (see scan_lanes); on blocks with
     * many repeats (a Q4_1 grid: ~100 of 256) the per-group choice of the reciprocals would
     * mispredict, and the four-cell division scan is kept */
    wk->tab = 8 * m >= 7 * c0;
    double *D1 = wk->D + ld;
    for (int64_t i = 1; i <= width; i++) {
        double s1 = p1[i];
        D1[i] = p2[i] - s1 * s1 * inv[(int64_t)p0f[i]];
    }
    for (int64_t q = 2; q <= k; q++)
        wk->low[q] = q + width; /* nothing computed yet */
    if (k >= 2)
        ensure(wk, inv, m, width, k, m);
    /* backtrack the cluster boundaries; the SSE is then summed directly */
    int64_t i = m;
    double sse = 0.0;
    for (int64_t q = k; q >= 1; q--) {
        int64_t j = q > 1 ? arg[q * ld + i] : 0;
        int64_t c = (int64_t)p0f[i] - (int64_t)p0f[j];
        double a = p1[i] - p1[j];
        cent[q - 1] = a * inv[c] + mu;
        for (int64_t t = j; t < i; t++) {
            double d = u[t] - cent[q - 1];
            sse += w[t] * d * d;
        }
        i = j;
    }
    return sse;
}

typedef struct {
    const float *W;
    int64_t rows, cols, g, k;
    double *cent, *sse;
    const double *inv;
    atomic_long next;
    atomic_int failed;
} job_t;

static void *worker(void *arg)
{
    job_t *job = (job_t *)arg;
    int64_t S = (job->cols + job->g - 1) / job->g, nb = job->rows * S;
    int64_t n = job->g < job->cols ? job->g : job->cols;
    work_t wk;
    if (work_init(&wk, n, job->k) != 0) {
        atomic_store(&job->failed, 1);
        return NULL;
    }
    for (;;) {
        int64_t unit = atomic_fetch_add(&job->next, 1);
        int64_t t0 = unit * UNIT_BLOCKS;
        if (t0 >= nb)
            break;
        int64_t t1 = t0 + UNIT_BLOCKS < nb ? t0 + UNIT_BLOCKS : nb;
        for (int64_t t = t0; t < t1; t++) {
            int64_t r = t / S, s = t - r * S;
            int64_t a = s * job->g, b = a + job->g < job->cols ? a + job->g : job->cols;
            const float *xs = job->W + r * job->cols + a;
            double *cb = job->cent + t * job->k;
            /* distinct values with multiplicities (the sub-block is sorted) */
            int64_t m = 0;
            for (int64_t x = 0; x < b - a; x++) {
                double v = (double)xs[x];
                if (m > 0 && v == wk.u[m - 1]) {
                    wk.w[m - 1] += 1;
                } else {
                    wk.u[m] = v;
                    wk.w[m] = 1;
                    m++;
                }
            }
            if (m <= job->k) { /* at most k distinct values: exactly those */
                for (int64_t c = 0; c < m; c++)
                    cb[c] = wk.u[c];
                for (int64_t c = m; c < job->k; c++)
                    cb[c] = wk.u[m - 1];
                job->sse[t] = 0.0;
            } else {
                job->sse[t] = optimal_block(&wk, m, job->k, job->inv, cb);
            }
        }
    }
    free(wk.mem);
    return NULL;
}

/* Centroids of every sub-block of W (float32 [rows, cols], row-major, each sub-block of g
 * consecutive weights of a row sorted ascending, the row's tail shorter) into cent (float64
 * [rows, S, k], S = ceil(cols / g)) and the SSE of each into sse (float64 [rows, S]), on
 * nthreads threads.  Returns 0, or -1 when memory or a thread could not be had. */
int ditto_kmeans_optimal_matrix(const float *W, int64_t rows, int64_t cols, int64_t g,
                                int64_t k, double *cent, double *sse, int64_t nthreads)
{
    int64_t n = g < cols ? g : cols;
    /* inv[c] = 1/c, then INV_PAD zeros: the lane scans load inv[c .. c + 15] */
    double *inv = malloc((size_t)(n + 1 + INV_PAD) * sizeof(double));
    if (!inv)
        return -1;
    inv[0] = 0.0;
    for (int64_t c = 1; c <= n; c++)
        inv[c] = 1.0 / c;
    for (int64_t c = n + 1; c <= n + INV_PAD; c++)
        inv[c] = 0.0;
    job_t job = {.W = W, .rows = rows, .cols = cols, .g = g, .k = k, .cent = cent, .sse = sse,
                 .inv = inv};
    atomic_init(&job.next, 0);
    atomic_init(&job.failed, 0);
    if (nthreads < 1)
        nthreads = 1;
    pthread_t tid[64];
    if (nthreads > 64)
        nthreads = 64;
    int64_t started = 0;
    for (int64_t t = 1; t < nthreads; t++) {
        if (pthread_create(&tid[started], NULL, worker, &job) != 0)
            break;
        started++;
    }
    worker(&job);
    for (int64_t t = 0; t < started; t++)
        pthread_join(tid[t], NULL);
    free(inv);
    return atomic_load(&job.failed) ? -1 : 0;
}
