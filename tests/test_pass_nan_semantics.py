"""The gemv-blas rewrite keeps NaN and Inf meaning what they mean in the C loop (docs/PASS.md
"Floating-point policy"; reliability/cc-gemv-rewrite-nan-inf-semantics): BLAS returns early for
alpha = 0 (never reading A or x) and does not read y for beta = 0, where the loop computes
0·Inf = NaN or 0·NaN = NaN. Those cases run the original nest; every other case still calls
BLAS. Differential test: the same program built with and without the rewrite, on inputs with
Inf/NaN in A, x and y and alpha, beta in {0, 1, 2, NaN}, GEMV (both layouts, with and without a
beta term) and GEMM."""

from __future__ import annotations

import itertools
import struct
import subprocess

import numpy as np
import pytest

from ditto_core.stages.cc import compile_c

N = 6
SRC = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

/* count BLAS calls: these definitions win over the library's and forward to it */
static int calls;
typedef void (*sgemv_fn)(int, int, int, int, float, const float *, int, const float *, int,
                         float, float *, int);
void scipy_cblas_sgemv(int o, int t, int M, int N, float al, const float *A, int lda,
                       const float *X, int incx, float be, float *Y, int incy) {
    calls++;
    ((sgemv_fn)dlsym(RTLD_NEXT, "scipy_cblas_sgemv"))(o, t, M, N, al, A, lda, X, incx, be, Y,
                                                      incy);
}
typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *,
                         int, float, float *, int);
void scipy_cblas_sgemm(int o, int ta, int tb, int M, int N, int K, float al, const float *A,
                       int lda, const float *B, int ldb, float be, float *C, int ldc) {
    calls++;
    ((sgemm_fn)dlsym(RTLD_NEXT, "scipy_cblas_sgemm"))(o, ta, tb, M, N, K, al, A, lda, B, ldb, be,
                                                      C, ldc);
}

#define N 6
__attribute__((noinline)) void k_row(float *y, const float *A, const float *x, float alpha,
                                     float beta) {
    for (int i = 0; i < N; i++) {
        float acc = 0.0f;
        for (int k = 0; k < N; k++) acc += A[i * N + k] * x[k];
        y[i] = alpha * acc + beta * y[i];
    }
}
__attribute__((noinline)) void k_col(float *y, const float *A, const float *x, float alpha,
                                     float beta) {
    for (int i = 0; i < N; i++) {
        float acc = 0.0f;
        for (int k = 0; k < N; k++) acc += A[k * N + i] * x[k];
        y[i] = alpha * acc + beta * y[i];
    }
}
__attribute__((noinline)) void k_scale(float *y, const float *A, const float *x, float alpha,
                                       float beta) {
    (void)beta;
    for (int i = 0; i < N; i++) {
        float acc = 0.0f;
        for (int k = 0; k < N; k++) acc += A[i * N + k] * x[k];
        y[i] = alpha * acc; /* no beta term: y is not read */
    }
}
__attribute__((noinline)) void k_gemm(float *y, const float *A, const float *x, float alpha,
                                      float beta) {
    for (int j = 0; j < 2; j++) /* C[2][N] = alpha * B[2][N] . A^T + beta * C */
        for (int i = 0; i < N; i++) {
            float acc = 0.0f;
            for (int k = 0; k < N; k++) acc += A[i * N + k] * x[j * N + k];
            y[j * N + i] = alpha * acc + beta * y[j * N + i];
        }
}

/* stdin: int32 kernel; float32 alpha, beta, A[N*N], x[2N], y[2N]. stdout: y[2N], int32 calls */
int main(void) {
    int kernel;
    float ab[2], A[N * N], x[2 * N], y[2 * N];
    if (fread(&kernel, 4, 1, stdin) != 1 || fread(ab, 4, 2, stdin) != 2 ||
        fread(A, 4, N * N, stdin) != N * N || fread(x, 4, 2 * N, stdin) != 2 * N ||
        fread(y, 4, 2 * N, stdin) != 2 * N)
        return 1;
    void (*fns[4])(float *, const float *, const float *, float, float) =
        {k_row, k_col, k_scale, k_gemm};
    fns[kernel](y, A, x, ab[0], ab[1]);
    fwrite(y, 4, 2 * N, stdout);
    fwrite(&calls, 4, 1, stdout);
    return 0;
}
"""

KERNELS = {"k_row": 0, "k_col": 1, "k_scale": 2, "k_gemm": 3}


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    d = tmp_path_factory.mktemp("nan_sem")
    (d / "n.c").write_text(SRC)
    rw, report = compile_c(d / "n.c", blas="openblas", out=d / "rw", passes=["gemv-blas"])
    status = {c["function"]: c["status"] for c in report.candidates}
    assert all(status[f] == "rewritten" for f in KERNELS), status
    nr, _ = compile_c(d / "n.c", blas="openblas", out=d / "nr", rewrite=False)
    return rw, nr


def run(exe, kernel, alpha, beta, A, x, y):
    blob = struct.pack("<i2f", kernel, alpha, beta) + A.tobytes() + x.tobytes() + y.tobytes()
    p = subprocess.run([str(exe)], input=blob, capture_output=True, check=True)
    return np.frombuffer(p.stdout[:-4], np.float32), struct.unpack("<i", p.stdout[-4:])[0]


def inputs(where: str, bad: float):
    rng = np.random.default_rng(7)
    A = rng.uniform(-1, 1, N * N).astype(np.float32)
    x = rng.uniform(-1, 1, 2 * N).astype(np.float32)
    y = rng.uniform(-1, 1, 2 * N).astype(np.float32)
    if where != "none":
        {"A": A, "x": x, "y": y}[where][3] = bad
    return A, x, y


CASES = list(itertools.product(KERNELS, [0.0, 1.0, 2.0, float("nan")], [0.0, 1.0, 0.5],
                               ["A", "x", "y", "none"], [float("inf"), float("nan")]))


@pytest.mark.parametrize("kernel,alpha,beta,where,bad", CASES)
def test_rewrite_keeps_nan_inf_semantics(builds, kernel, alpha, beta, where, bad):
    rw, nr = builds
    A, x, y = inputs(where, bad)
    want, no_calls = run(nr, KERNELS[kernel], alpha, beta, A, x, y)
    got, calls = run(rw, KERNELS[kernel], alpha, beta, A, x, y)
    assert no_calls == 0
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    fin = np.isfinite(want)
    np.testing.assert_array_equal(np.sign(got[np.isinf(got)]), np.sign(want[np.isinf(want)]))
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-5, atol=1e-6)
    # BLAS is still used whenever it computes what the loop computes
    reads_y = kernel != "k_scale"
    blas_ok = alpha != 0 and not (reads_y and beta == 0)
    per_run = 2 if kernel == "k_gemm" else 1  # one sgemv per row j (or one sgemm)
    assert calls in ((1, per_run) if blas_ok else (0,)), (calls, alpha, beta)


def test_handed_case_prints_nan_like_the_loop(builds, tmp_path):
    rw, nr = builds
    A = (np.arange(N * N) % 5 - 2).astype(np.float32)
    x = (np.arange(2 * N) % 4 - 1).astype(np.float32)
    A[3] = np.inf
    got, _ = run(rw, 0, 0.0, 1.0, A, x, np.ones(2 * N, np.float32))
    assert np.isnan(got[0])  # the rewritten build gave 1 (BLAS's early return)
    A[3] = 1.0
    got, _ = run(rw, 0, 1.0, 0.0, A, x, np.full(2 * N, np.nan, np.float32))
    assert np.isnan(got[0])  # gave a finite value (y ignored for beta = 0)
