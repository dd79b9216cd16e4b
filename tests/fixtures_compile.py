"""Session fixtures of the compile stages: a small C program with GEMV loop nests of several
forms, built by ``ditto_core.stages.cc.compile_c`` with and without the IR rewrite (each built
once per test session), and a helper that runs it on numpy inputs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from ditto_core.stages.cc import compile_c

#: Naive GEMV loop nests in the forms the GEMV→BLAS pass matches (issue 5): row-major
#: y = A x with i32 and i64 indices, y += A x, y = alpha A x + beta y, the transposed form
#: y = Aᵀ x2, a double-precision one and an OpenMP-parallel one. Input file: int32 m, n, then
#: float32 A[m*n], x[n], x2[m], y0[m]. Output: one line per form, m (or n) values, %.9g.
GEMV_C = r"""
#include <stdio.h>
#include <stdlib.h>

static void gemv_i32(float *y, const float *A, const float *x, int m, int n) {
    for (int i = 0; i < m; i++) {
        float acc = 0.0f;
        for (int j = 0; j < n; j++) acc += A[i * n + j] * x[j];
        y[i] = acc;
    }
}

static void gemv_i64_acc(float *y, const float *A, const float *x, long m, long n) {
    for (long i = 0; i < m; i++) {
        float acc = 0.0f;
        for (long j = 0; j < n; j++) acc += x[j] * A[i * n + j];
        y[i] += acc;
    }
}

static void gemv_alpha_beta(float *y, const float *A, const float *x, int m, int n,
                            float alpha, float beta) {
    for (int i = 0; i < m; i++) {
        float acc = 0.0f;
        for (int j = 0; j < n; j++) acc += A[(long)i * n + j] * x[j];
        y[i] = alpha * acc + beta * y[i];
    }
}

static void gemv_t(float *y, const float *A, const float *x2, int m, int n) {
    for (int j = 0; j < n; j++) {
        float acc = 0.0f;
        for (int i = 0; i < m; i++) acc += A[i * n + j] * x2[i];
        y[j] = acc;
    }
}

static void dgemv(double *y, const double *A, const double *x, int m, int n) {
    for (int i = 0; i < m; i++) {
        double acc = 0.0;
        for (int j = 0; j < n; j++) acc += A[i * n + j] * x[j];
        y[i] = acc;
    }
}

static void gemv_omp(float *y, const float *A, const float *x, int m, int n) {
#pragma omp parallel for
    for (int i = 0; i < m; i++) {
        float acc = 0.0f;
        for (int j = 0; j < n; j++) acc += A[(long)i * n + j] * x[j];
        y[i] = acc;
    }
}

static void print(const char *tag, const float *v, int k) {
    printf("%s", tag);
    for (int i = 0; i < k; i++) printf(" %.9g", v[i]);
    printf("\n");
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: %s FILE\n", argv[0]); return 2; }
    FILE *f = fopen(argv[1], "rb");
    int mn[2];
    if (!f || fread(mn, sizeof(int), 2, f) != 2) { fprintf(stderr, "bad input\n"); return 1; }
    int m = mn[0], n = mn[1];
    size_t mm = m > 0 ? (size_t)m : 1, nn = n > 0 ? (size_t)n : 1;
    float *A = malloc(sizeof(float) * mm * nn), *x = malloc(sizeof(float) * nn);
    float *x2 = malloc(sizeof(float) * mm), *y0 = malloc(sizeof(float) * mm);
    float *y = malloc(sizeof(float) * (mm > nn ? mm : nn));
    double *Ad = malloc(sizeof(double) * mm * nn), *xd = malloc(sizeof(double) * nn);
    double *yd = malloc(sizeof(double) * mm);
    if (fread(A, sizeof(float), (size_t)m * n, f) != (size_t)m * n ||
        fread(x, sizeof(float), (size_t)n, f) != (size_t)n ||
        fread(x2, sizeof(float), (size_t)m, f) != (size_t)m ||
        fread(y0, sizeof(float), (size_t)m, f) != (size_t)m) {
        fprintf(stderr, "short input\n");
        return 1;
    }
    fclose(f);
    gemv_i32(y, A, x, m, n);
    print("n", y, m);
    for (int i = 0; i < m; i++) y[i] = y0[i];
    gemv_i64_acc(y, A, x, m, n);
    print("acc", y, m);
    for (int i = 0; i < m; i++) y[i] = y0[i];
    gemv_alpha_beta(y, A, x, m, n, 0.5f, -2.0f);
    print("ab", y, m);
    gemv_t(y, A, x2, m, n);
    print("t", y, n);
    for (long k = 0; k < (long)m * n; k++) Ad[k] = A[k];
    for (int j = 0; j < n; j++) xd[j] = x[j];
    dgemv(yd, Ad, xd, m, n);
    printf("d");
    for (int i = 0; i < m; i++) printf(" %.17g", yd[i]);
    printf("\n");
    gemv_omp(y, A, x, m, n);
    print("omp", y, m);
    free(A); free(x); free(x2); free(y0); free(y); free(Ad); free(xd); free(yd);
    return 0;
}
"""

#: Forms printed by GEMV_C, in order.
GEMV_FORMS = ("n", "acc", "ab", "t", "d", "omp")


def gemv_reference(A: np.ndarray, x: np.ndarray, x2: np.ndarray, y0: np.ndarray) -> dict:
    """float64 numpy reference for every form of GEMV_C (A: float32 [m, n])."""
    A64, x64, x264, y064 = (a.astype(np.float64) for a in (A, x, x2, y0))
    yn = A64 @ x64
    return {"n": yn, "acc": y064 + yn, "ab": 0.5 * yn - 2.0 * y064, "t": A64.T @ x264,
            "d": yn, "omp": yn}


def run_gemv(exe: Path, workdir: Path, m: int, n: int, seed: int = 0):
    """Run the GEMV program on random inputs of shape m×n; return (outputs, reference),
    both dicts form → float64 array."""
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((m, n)).astype(np.float32)
    x = rng.standard_normal(n).astype(np.float32)
    x2 = rng.standard_normal(m).astype(np.float32)
    y0 = rng.standard_normal(m).astype(np.float32)
    inp = workdir / f"in_{m}_{n}_{seed}.bin"
    inp.write_bytes(np.array([m, n], np.int32).tobytes() + A.tobytes() + x.tobytes()
                    + x2.tobytes() + y0.tobytes())
    proc = subprocess.run([str(exe), str(inp)], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "2"})
    assert proc.returncode == 0, proc.stderr
    out = {}
    for line in proc.stdout.splitlines():
        tag, *vals = line.split()
        out[tag] = np.array([float(v) for v in vals])
    return out, gemv_reference(A, x, x2, y0)


@pytest.fixture(scope="session")
def gemv_source(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("gemv_src")
    src = d / "gemv_forms.c"
    src.write_text(GEMV_C)
    return src


@pytest.fixture(scope="session")
def gemv_builds(gemv_source, tmp_path_factory) -> dict:
    """{"rewrite": (exe, report json path), "naive": (exe, report json path)} built with
    --blas openblas and -fopenmp."""
    d = tmp_path_factory.mktemp("gemv_build")
    builds = {}
    for label, rewrite in (("rewrite", True), ("naive", False)):
        exe, rep = d / f"gemv_{label}", d / f"report_{label}.json"
        compile_c([gemv_source], blas="openblas", out=exe, openmp=True, rewrite=rewrite,
                  report=rep)
        builds[label] = (exe, rep)
    return builds


# ----------------------------------------------------------------------------- ditto build

def build_model(model, out_dir: Path, cache_root: Path, *, quantizer="none", rewrite=True,
                **kw) -> dict:
    """``pipeline.build`` with ``--blas openblas`` and the given cache root; returns build.json."""
    from ditto_core.stages import pipeline

    opts = pipeline.BuildOptions(quantizer=quantizer, blas="openblas", rewrite=rewrite, **kw)
    return pipeline.build(model, out_dir, opts, cache_root=cache_root)


def greedy_ids(build_dir: Path, prompt: str, n: int, threads: int = 1) -> list[int]:
    """Greedy (--temp 0) token ids generated by a build directory's executable."""
    import json

    from ditto_core.runtime.run import run_build

    proc = run_build(build_dir, ["-p", prompt, "-n", str(n), "--temp", "0", "--threads",
                                 str(threads), "--print-ids"], capture_output=True, text=True,
                     timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def build_cache_root(tmp_path_factory) -> Path:
    """A cache root private to the test session (builds share stages through it)."""
    return tmp_path_factory.mktemp("ditto_cache")


@pytest.fixture(scope="session")
def tiny_builds(tmp_path_factory, build_cache_root) -> dict:
    """tinycoder fp32 (--quantizer none) built with and without the rewrite:
    {"rewrite": (dir, record), "naive": (dir, record)}."""
    d = tmp_path_factory.mktemp("tiny_builds")
    out = {}
    for label, rewrite in (("rewrite", True), ("naive", False)):
        rec = build_model("tinycoder", d / label, build_cache_root, rewrite=rewrite)
        out[label] = (d / label, rec)
    return out


@pytest.fixture(scope="session")
def smollm2_f32_builds(tmp_path_factory, build_cache_root) -> dict:
    """SmolLM2-135M fp32 (--quantizer none) built with and without the rewrite (the model
    file is built once and shared through the cache): {"rewrite": dir, "naive": dir}."""
    d = tmp_path_factory.mktemp("smollm2_builds")
    out = {}
    for label, rewrite in (("rewrite", True), ("naive", False)):
        build_model("smollm2", d / label, build_cache_root, rewrite=rewrite)
        out[label] = d / label
    return out
