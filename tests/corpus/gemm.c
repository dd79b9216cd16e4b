/* GEMM corpus of the gemv-blas pass (tests/test_pass_gemm.py): naive triple loop nests in the
 * forms the pass must turn into cblas_[sd]gemm, the runtime's prefill nest (native/kernels/gemm.c),
 * and nests it must leave to GEMV or to the C loop. Prints "name m n values..." and
 * "calls name m n GEMM GEMV" (BLAS calls the kernel made; the symbols below count and forward
 * to scipy-openblas32 through dlsym). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int gemm_calls, gemv_calls;
typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *,
                         int, float, float *, int);
typedef void (*dgemm_fn)(int, int, int, int, int, int, double, const double *, int,
                         const double *, int, double, double *, int);
typedef void (*sgemv_fn)(int, int, int, int, float, const float *, int, const float *, int,
                         float, float *, int);
void scipy_cblas_sgemm(int o, int ta, int tb, int M, int N, int K, float al, const float *A,
                       int lda, const float *B, int ldb, float be, float *C, int ldc) {
    sgemm_fn real = (sgemm_fn)dlsym(RTLD_NEXT, "scipy_cblas_sgemm");
    __atomic_fetch_add(&gemm_calls, 1, __ATOMIC_RELAXED);
    real(o, ta, tb, M, N, K, al, A, lda, B, ldb, be, C, ldc);
}
void scipy_cblas_dgemm(int o, int ta, int tb, int M, int N, int K, double al, const double *A,
                       int lda, const double *B, int ldb, double be, double *C, int ldc) {
    dgemm_fn real = (dgemm_fn)dlsym(RTLD_NEXT, "scipy_cblas_dgemm");
    __atomic_fetch_add(&gemm_calls, 1, __ATOMIC_RELAXED);
    real(o, ta, tb, M, N, K, al, A, lda, B, ldb, be, C, ldc);
}
void scipy_cblas_sgemv(int o, int t, int M, int N, float al, const float *A, int lda,
                       const float *X, int incx, float be, float *Y, int incy) {
    sgemv_fn real = (sgemv_fn)dlsym(RTLD_NEXT, "scipy_cblas_sgemv");
    __atomic_fetch_add(&gemv_calls, 1, __ATOMIC_RELAXED);
    real(o, t, M, N, al, A, lda, X, incx, be, Y, incy);
}

static unsigned lcg = 12345u;
static double rnd(void) { /* uniform in [-1, 1) */
    lcg = lcg * 1664525u + 1013904223u;
    return (double)(lcg >> 8) / 8388608.0 - 1.0;
}

/* the runtime's prefill nest: Y[t][i] = Σ_k W[i][k] X[t][k], rows of W outermost */
__attribute__((noinline)) void gemm_prefill(float *Y, const float *X, const float *W, int T,
                                            int n, int d) {
    int i;
#pragma omp parallel for private(i)
    for (i = 0; i < d; i++) {
        for (int t = 0; t < T; t++) {
            float acc = 0.0f;
            for (int k = 0; k < n; k++) acc += W[i * n + k] * X[t * n + k];
            Y[t * d + i] = acc;
        }
    }
}

/* C[i][j] = Σ_k A[i][k] B[k][j] (NoTrans, NoTrans), leading dimensions as arguments */
__attribute__((noinline)) void gemm_nn(float *C, const float *A, const float *B, int M, int N,
                                       int K, int lda, int ldb, int ldc) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) acc += A[i * lda + k] * B[k * ldb + j];
            C[i * ldc + j] = acc;
        }
}

/* C[i][j] += Σ_k A[k][i] B[j][k] (Trans, Trans), 64-bit indices */
__attribute__((noinline)) void gemm_tt_acc(float *C, const float *A, const float *B, long M,
                                           long N, long K) {
    for (long i = 0; i < M; i++)
        for (long j = 0; j < N; j++) {
            float acc = C[i * N + j];
            for (long k = 0; k < K; k++) acc += A[k * M + i] * B[j * K + k];
            C[i * N + j] = acc;
        }
}

/* C[i][j] = alpha Σ_k A[i][k] B[k][j] + beta C[i][j], j outermost (C written column by
 * column: the pass swaps the roles of the loops) */
__attribute__((noinline)) void gemm_alpha_beta_jouter(float *C, const float *A, const float *B,
                                                      int M, int N, int K, float alpha,
                                                      float beta) {
    for (int j = 0; j < N; j++)
        for (int i = 0; i < M; i++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = alpha * acc + beta * C[i * N + j];
        }
}

__attribute__((noinline)) void dgemm_nn(double *C, const double *A, const double *B, int M,
                                        int N, int K) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double acc = 0.0;
            for (int k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
}

/* negatives: GEMV-shaped inner loops that are not a GEMM */
__attribute__((noinline)) void neg_triangular(float *C, const float *A, const float *B, int M,
                                              int N, int K) {
    (void)K;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int k = 0; k < i; k++) acc += A[i * M + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
}

__attribute__((noinline)) void neg_outer_store(float *C, const float *A, const float *B, int M,
                                               int N, int K, float *rowmark) {
    for (int i = 0; i < M; i++) {
        rowmark[i] = (float)i;
        for (int j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
    }
}

__attribute__((noinline)) void neg_repeat(float *y, const float *A, const float *x, int reps,
                                          int M, int K) {
    for (int r = 0; r < reps; r++)
        for (int i = 0; i < M; i++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) acc += A[i * K + k] * x[k];
            y[i] = acc;
        }
}

static void print_f(const char *name, int m, int n, const float *v, int len) {
    printf("%s %d %d", name, m, n);
    for (int i = 0; i < len; i++) printf(" %.9g", v[i]);
    printf("\n");
}

static void calls(const char *name, int m, int n) {
    printf("calls %s %d %d %d %d\n", name, m, n, gemm_calls, gemv_calls);
    gemm_calls = gemv_calls = 0;
}

static float *randf(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = (float)rnd();
    return p;
}

int main(void) {
    static const int shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 33, 64}, {64, 40, 100},
                                    {0, 4, 5}, {4, 0, 5}, {4, 5, 0}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        float *A = randf((size_t)M * K + 8), *B = randf((size_t)K * N + 8);
        float *C = randf((size_t)M * N + 8);
        gemm_prefill(C, A, B, M, K, N); /* X = A [M][K], W = B as [N][K] */
        print_f("gemm_prefill", M, N, C, M * N);
        calls("gemm_prefill", M, N);
        gemm_nn(C, A, B, M, N, K, K, N, N);
        print_f("gemm_nn", M, N, C, M * N);
        calls("gemm_nn", M, N);
        gemm_tt_acc(C, A, B, M, N, K);
        print_f("gemm_tt_acc", M, N, C, M * N);
        calls("gemm_tt_acc", M, N);
        gemm_alpha_beta_jouter(C, A, B, M, N, K, 0.5f, -2.0f);
        print_f("gemm_alpha_beta_jouter", M, N, C, M * N);
        calls("gemm_alpha_beta_jouter", M, N);
        double *dA = malloc(((size_t)M * K + 1) * sizeof(double));
        double *dB = malloc(((size_t)K * N + 1) * sizeof(double));
        double *dC = malloc(((size_t)M * N + 1) * sizeof(double));
        for (int i = 0; i < M * K; i++) dA[i] = A[i];
        for (int i = 0; i < K * N; i++) dB[i] = B[i];
        dgemm_nn(dC, dA, dB, M, N, K);
        printf("dgemm_nn %d %d", M, N);
        for (int i = 0; i < M * N; i++) printf(" %.17g", dC[i]);
        printf("\n");
        calls("dgemm_nn", M, N);
        free(dA), free(dB), free(dC);
        free(A), free(B), free(C);
    }
    /* guards: C overlapping A, ldc < N, lda < K: the C loop runs (no BLAS call), exact */
    {
        int M = 6, N = 5, K = 7;
        float *buf = randf(200);
        gemm_nn(buf + 3, buf, buf + 100, M, N, K, K, N, N); /* C overlaps A */
        print_f("guard_overlap", M, N, buf, 200);
        calls("guard_overlap", M, N);
        float *A = randf(100), *B = randf(100), *C = randf(100);
        gemm_nn(C, A, B, M, N, K, K, N, N - 2); /* ldc < N: rows of C overlap */
        print_f("guard_ldc", M, N, C, 100);
        calls("guard_ldc", M, N);
        gemm_nn(C, A, B, M, N, K, K - 1, N, N); /* lda < K */
        print_f("guard_lda", M, N, C, 100);
        calls("guard_lda", M, N);
        free(buf), free(A), free(B), free(C);
    }
    {
        int M = 9, N = 8, K = 9;
        float *A = randf(200), *B = randf(200), *C = randf(200), *mark = randf(16);
        neg_triangular(C, A, B, M, N, K);
        print_f("neg_triangular", M, N, C, M * N);
        calls("neg_triangular", M, N);
        neg_outer_store(C, A, B, M, N, K, mark);
        print_f("neg_outer_store", M, N, C, M * N);
        print_f("neg_outer_store_mark", M, N, mark, M);
        calls("neg_outer_store", M, N);
        neg_repeat(C, A, B, 3, M, K);
        print_f("neg_repeat", M, N, C, M);
        calls("neg_repeat", M, N);
        free(A), free(B), free(C), free(mark);
    }
    return 0;
}
