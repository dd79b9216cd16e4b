"""Property tests of the rewrite's runtime guard: random shapes, leading dimensions (including
ld < n, where BLAS must not be called), lower bounds (including empty and reversed ranges) and
y aliasing x, run through the rewritten program and compared with a scalar Python model of the
C loop (C semantics, element by element)."""

from __future__ import annotations

import struct
import subprocess

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ditto_core.stages.cc import compile_c

SRC = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

/* count BLAS calls: this definition wins over the library's and forwards to it */
static int calls;
int scipy_openblas_get_num_threads(void);
typedef void (*sgemv_fn)(int, int, int, int, float, const float *, int, const float *, int,
                         float, float *, int);
void scipy_cblas_sgemv(int o, int t, int M, int N, float al, const float *A, int lda,
                       const float *X, int incx, float be, float *Y, int incy) {
    calls++;
    ((sgemv_fn)dlsym(RTLD_NEXT, "scipy_cblas_sgemv"))(o, t, M, N, al, A, lda, X, incx, be, Y,
                                                      incy);
}

__attribute__((noinline)) void k_row(float *y, const float *A, const float *x, int m, int n,
                                     int lda, int lb, float alpha, float beta) {
    for (int i = lb; i < m; i++) {
        float acc = 0.0f;
        for (int k = 0; k < n; k++) acc += A[i * lda + k] * x[k];
        y[i] = alpha * acc + beta * y[i];
    }
}

__attribute__((noinline)) void k_col(float *y, const float *A, const float *x, int m, int n,
                                     int lda, int lb, float alpha, float beta) {
    for (int i = lb; i < m; i++) {
        float acc = 0.0f;
        for (int k = 0; k < n; k++) acc += A[k * lda + i] * x[k];
        y[i] = alpha * acc + beta * y[i];
    }
}

__attribute__((noinline)) void k_inplace(float *y, const float *A, const float *x, int m,
                                         int n, int lda, int lb, float alpha, float beta) {
    (void)alpha; (void)beta;
    for (int i = lb; i < m; i++)
        for (int k = 0; k < n; k++) y[i] += A[i * lda + k] * x[k];
}

/* stdin: int32 kernel, m, n, lda, lb, yoff (-1: separate y); float32 alpha, beta;
 * int32 asz, vsz; float32 A[asz], v[vsz]. x = v; y = v + yoff or a separate copy of v.
 * stdout: float32 v[vsz], y[vsz], then int32: number of BLAS calls made. */
int main(void) {
    int h[6], sz[2];
    float ab[2];
    if (fread(h, 4, 6, stdin) != 6 || fread(ab, 4, 2, stdin) != 2 || fread(sz, 4, 2, stdin) != 2)
        return 1;
    float *A = malloc(4 * (size_t)sz[0]), *v = malloc(4 * (size_t)sz[1]);
    float *ysep = malloc(4 * (size_t)sz[1]);
    if (fread(A, 4, (size_t)sz[0], stdin) != (size_t)sz[0] ||
        fread(v, 4, (size_t)sz[1], stdin) != (size_t)sz[1]) return 1;
    for (int i = 0; i < sz[1]; i++) ysep[i] = v[i];
    float *y = h[5] < 0 ? ysep : v + h[5];
    void (*fns[3])(float *, const float *, const float *, int, int, int, int, float, float) =
        {k_row, k_col, k_inplace};
    fns[h[0]](y, A, v, h[1], h[2], h[3], h[4], ab[0], ab[1]);
    fwrite(v, 4, (size_t)sz[1], stdout);
    fwrite(ysep, 4, (size_t)sz[1], stdout);
    fwrite(&calls, 4, 1, stdout);
    if (getenv("DITTO_GUARD_NEVER_SET")) printf("%d", scipy_openblas_get_num_threads());
    return 0;
}
"""


@pytest.fixture(scope="module")
def guard_exe(tmp_path_factory):
    d = tmp_path_factory.mktemp("guard")
    (d / "g.c").write_text(SRC)
    exe, report = compile_c(d / "g.c", blas="openblas", out=d / "g", passes=["gemv-blas"])
    by_fn = {c["function"]: c["status"] for c in report.candidates}
    assert by_fn == {"k_row": "rewritten", "k_col": "rewritten", "k_inplace": "rewritten"}
    return exe


def model(kernel, m, n, lda, lb, yoff, alpha, beta, A, v):
    """The C loops executed element by element in float64 (C semantics incl. aliasing)."""
    v = v.astype(np.float64).copy()
    ysep = v.copy()
    ybuf, base = (ysep, 0) if yoff < 0 else (v, yoff)
    for i in range(lb, m):
        if kernel == 2:
            for k in range(n):
                ybuf[base + i] += A[i * lda + k] * v[k]
            continue
        acc = 0.0
        for k in range(n):
            idx = i * lda + k if kernel == 0 else k * lda + i
            acc += A[idx] * v[k]
        ybuf[base + i] = alpha * acc + beta * ybuf[base + i]
    return v, ysep


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kernel=st.integers(0, 2), m=st.integers(0, 13), n=st.integers(0, 13),
       lda_delta=st.integers(-3, 4), lb=st.integers(0, 14), alias=st.integers(-1, 6),
       alpha=st.sampled_from([1.0, -0.5, 2.0]), beta=st.sampled_from([0.0, 1.0, 0.25]),
       seed=st.integers(0, 2**16))
def test_guarded_rewrite_matches_scalar_model(guard_exe, kernel, m, n, lda_delta, lb, alias,
                                              alpha, beta, seed):
    lb = max(lb, 0)
    cols = n if kernel != 1 else m
    lda = max(cols + lda_delta, 0)
    rows = m if kernel != 1 else n
    asz = max(rows, 1) * (lda + 1) + cols + 8
    vsz = 2 * (m + n) + 16
    rng = np.random.default_rng(seed)
    A = rng.uniform(-1, 1, asz).astype(np.float32)
    v = rng.uniform(-1, 1, vsz).astype(np.float32)
    yoff = -1 if alias < 0 else alias  # y = x + alias: overlaps x for small offsets
    blob = struct.pack("<6i2f2i", kernel, m, n, lda, lb, yoff, alpha, beta, asz, vsz)
    blob += A.tobytes() + v.tobytes()
    p = subprocess.run([str(guard_exe)], input=blob, capture_output=True, check=True)
    out = np.frombuffer(p.stdout[:-4], dtype=np.float32).astype(np.float64)
    got_v, got_y = out[:vsz], out[vsz:]
    (calls,) = struct.unpack("<i", p.stdout[-4:])
    # the guard's conditions, restated: work to do, BLAS-legal ld, y disjoint from x
    M, N = m - lb, n
    blas_cols = N if kernel != 1 else M
    disjoint = yoff < 0 or yoff + lb >= n or yoff + m <= 0
    # alpha = 0, or beta = 0 where the C code reads y: the loop keeps C's NaN/Inf semantics
    scalars = kernel == 2 or (alpha != 0 and beta != 0)
    assert calls == int(M > 0 and N > 0 and lda >= blas_cols and disjoint and scalars), \
        (M, N, lda, yoff, alpha, beta)
    ref_v, ref_y = model(kernel, m, n, lda, lb, yoff, alpha, beta,
                         A.astype(np.float64), v)
    np.testing.assert_allclose(got_v, ref_v, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got_y, ref_y, rtol=1e-4, atol=1e-4)
