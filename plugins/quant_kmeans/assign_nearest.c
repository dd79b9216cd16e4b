/* Nearest stored centroid of every weight of a matrix: the assignment step of the kmeans
 * quantizer in C (docs/QUANT.md, "Speed").
 *
 * The result is, byte for byte, that of the reference ``kmeans1d.assign_nearest`` (numba):
 * per sub-block the k - 1 midpoints ``mids[t] = 0.5 * ((double)cb[t] + (double)cb[t + 1])`` of
 * the ascending codebook, each weight's index the number of midpoints strictly below it (a
 * weight exactly between two centroids takes the lower index), and per row the sums
 * ``sse += (x - cb[idx])^2`` and ``norm += x^2`` in float64, accumulated in column order as the
 * reference does (build with -ffp-contract=off, no fast-math, so the sums round alike).
 *
 * The reference finds the count by a branching binary search whose branches the CPU cannot
 * predict; here it is, for k <= 16 with AVX2, one compare per midpoint on four weights at once,
 * else a branch-free search over the midpoints padded to k entries with +inf (k = 2^b):
 * ``idx += half`` when ``mids[idx + half - 1] < x``, for half = k/2 .. 1.  Both yield the same
 * count (the midpoints are sorted).  Rows are independent, so worker threads
 * take units of rows from a shared counter; the bytes do not depend on the thread count.
 *
 * Entry point: ``ditto_kmeans_assign_nearest``.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define UNIT_ROWS 8 /* rows per unit of work */

/* a condition the CPU cannot predict: ask for a conditional move rather than a branch */
#if defined(__has_builtin)
#if __has_builtin(__builtin_unpredictable)
#define UNPREDICTABLE(c) __builtin_unpredictable(c)
#endif
#endif
#ifndef UNPREDICTABLE
#define UNPREDICTABLE(c) (c)
#endif

typedef struct {
    const float *W, *cb;
    uint8_t *idx;
    double *sse, *norm;
    int64_t rows, cols, g, k;
    atomic_long next;
    atomic_int failed;
} assign_job_t;

static void assign_row(const assign_job_t *job, int64_t r, double *mids)
{
    int64_t cols = job->cols, g = job->g, k = job->k;
    int64_t S = (cols + g - 1) / g;
    const float *x = job->W + r * cols;
    uint8_t *out = job->idx + r * cols;
    double acc = 0.0, nrm = 0.0;
    for (int64_t s = 0; s < S; s++) {
        const float *cb = job->cb + (r * S + s) * k;
        for (int64_t t = 0; t + 1 < k; t++)
            mids[t] = 0.5 * ((double)cb[t] + (double)cb[t + 1]);
        mids[k - 1] = INFINITY;
        int64_t a = s * g, b = a + g < cols ? a + g : cols;
        int64_t c = a;
#if defined(__AVX2__)
        if (k <= 16) {
            /* four weights at a time: the count of midpoints below each, one compare per
             * midpoint; the sums then run weight by weight in column order */
            __m256d M[15];
            for (int64_t t = 0; t + 1 < k; t++)
                M[t] = _mm256_set1_pd(mids[t]);
            for (; c + 4 <= b; c += 4) {
                __m256d X = _mm256_cvtps_pd(_mm_loadu_ps(x + c));
                __m256i cnt = _mm256_setzero_si256();
                for (int64_t t = 0; t + 1 < k; t++) /* a true compare is -1 */
                    cnt = _mm256_sub_epi64(
                        cnt, _mm256_castpd_si256(_mm256_cmp_pd(M[t], X, _CMP_LT_OQ)));
                int64_t lo[4];
                double v[4];
                _mm256_storeu_si256((__m256i *)lo, cnt);
                _mm256_storeu_pd(v, X);
                for (int l = 0; l < 4; l++) {
                    out[c + l] = (uint8_t)lo[l];
                    double d = v[l] - (double)cb[lo[l]];
                    acc += d * d;
                    nrm += v[l] * v[l];
                }
            }
        }
#endif
        for (; c < b; c++) {
            double v = (double)x[c];
            int64_t lo = 0;
            for (int64_t half = k >> 1; half >= 1; half >>= 1)
                lo += UNPREDICTABLE(mids[lo + half - 1] < v) ? half : 0;
            out[c] = (uint8_t)lo;
            double d = v - (double)cb[lo];
            acc += d * d;
            nrm += v * v;
        }
    }
    job->sse[r] = acc;
    job->norm[r] = nrm;
}

static void *assign_worker(void *arg)
{
    assign_job_t *job = (assign_job_t *)arg;
    double *mids = malloc((size_t)job->k * sizeof(double));
    if (!mids) {
        atomic_store(&job->failed, 1);
        return NULL;
    }
    for (;;) {
        int64_t r0 = atomic_fetch_add(&job->next, 1) * UNIT_ROWS;
        if (r0 >= job->rows)
            break;
        int64_t r1 = r0 + UNIT_ROWS < job->rows ? r0 + UNIT_ROWS : job->rows;
        for (int64_t r = r0; r < r1; r++)
            assign_row(job, r, mids);
    }
    free(mids);
    return NULL;
}

/* Index of the nearest centroid of cb (float32 [rows, S, k], k = 2^b with 1 <= b <= 8, each
 * sub-block's centroids ascending and finite, S = ceil(cols / g)) for every weight of W
 * (float32 [rows, cols], finite) into idx (uint8 [rows, cols]); per row the squared error into
 * sse and the squared norm into norm (float64 [rows]); on nthreads threads.  Returns 0, or -1
 * when memory could not be had or k is not a power of two in 2..256. */
int ditto_kmeans_assign_nearest(const float *W, int64_t rows, int64_t cols, int64_t g,
                                int64_t k, const float *cb, uint8_t *idx, double *sse,
                                double *norm, int64_t nthreads)
{
    if (k < 2 || k > 256 || (k & (k - 1)) != 0)
        return -1;
    assign_job_t job = {.W = W, .cb = cb, .idx = idx, .sse = sse, .norm = norm, .rows = rows,
                        .cols = cols, .g = g, .k = k};
    atomic_init(&job.next, 0);
    atomic_init(&job.failed, 0);
    if (nthreads < 1)
        nthreads = 1;
    if (nthreads > 64)
        nthreads = 64;
    pthread_t tid[64];
    int64_t started = 0;
    for (int64_t t = 1; t < nthreads; t++) {
        if (pthread_create(&tid[started], NULL, assign_worker, &job) != 0)
            break;
        started++;
    }
    assign_worker(&job);
    for (int64_t t = 0; t < started; t++)
        pthread_join(tid[t], NULL);
    return atomic_load(&job.failed) ? -1 : 0;
}
