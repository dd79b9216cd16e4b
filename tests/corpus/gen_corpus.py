"""Generate the C corpus of GEMV loop-nest variants the ``gemv-blas`` pass is tested on.

``python tests/corpus/gen_corpus.py [OUTDIR]`` writes ``gemv_float.c`` and ``gemv_double.c``
(positive variants: every kernel must be rewritten, issue 5) and ``negatives.c`` (nests the pass
must leave alone, or guard) and ``polybench.c`` (PolyBench-style kernels mixing GEMVs with
nests that only look like one). Each file has a ``main`` that runs every kernel on every shape of
``SHAPES`` with deterministic data (a 32-bit LCG) and prints the results as ``%.17g``, one line
per (kernel, shape): ``name m n v0 v1 ...`` (the y vector after the call), then
``calls name m n C``: how many times the program called ``scipy_cblas_[sd]gemv`` (the file
defines these symbols itself, counts, and forwards to the library through dlsym). The same file is built
with and without the pass; the outputs must agree within floating-point tolerance.

OpenMP kernels carry ``#pragma omp parallel for``: the file is built both with ``-fopenmp``
(outlined chunk functions) and without it (serial).
"""

from __future__ import annotations

import sys
from pathlib import Path

#: (m, n) shapes: empty, unit, odd, rectangular both ways, larger than the cache line blocking
SHAPES = [(0, 5), (5, 0), (1, 1), (1, 7), (7, 1), (3, 5), (17, 33), (64, 64), (131, 257),
          (300, 517)]

#: kernel name -> body. Signature: (T *y, const T *A, const T *x, int m, int n, int lda,
#: T alpha, T beta, int lb); A has room for max(m,n)+4 rows of lda >= max(m,n)+3 elements.
KERNELS = {
    "row_set_i32": """
    for (int i = 0; i < m; i++) {
        T acc = 0;
        for (int k = 0; k < n; k++) acc += A[i * n + k] * x[k];
        y[i] = acc;
    }""",
    "row_set_i64": """
    long M = m, N = n;
    for (long i = 0; i < M; i++) {
        T acc = 0;
        for (long k = 0; k < N; k++) acc += x[k] * A[i * N + k];
        y[i] = acc;
    }""",
    "row_set_unsigned": """
    unsigned M = (unsigned)m, N = (unsigned)n;
    for (unsigned i = 0; i < M; i++) {
        T acc = 0;
        for (unsigned k = 0; k < N; k++) acc += A[i * N + k] * x[k];
        y[i] = acc;
    }""",
    "row_acc_local": """
    for (int i = 0; i < m; i++) {
        T acc = 0;
        for (int k = 0; k < n; k++) acc += A[i * n + k] * x[k];
        y[i] += acc;
    }""",
    "row_acc_inplace": """
    for (int i = 0; i < m; i++)
        for (int k = 0; k < n; k++) y[i] += A[i * n + k] * x[k];""",
    "row_zero_then_acc": """
    for (int i = 0; i < m; i++) {
        y[i] = 0;
        for (int k = 0; k < n; k++) y[i] += A[i * n + k] * x[k];
    }""",
    "row_alpha_beta": """
    for (int i = 0; i < m; i++) {
        T acc = 0;
        for (int k = 0; k < n; k++) acc += A[(long)i * lda + k] * x[k];
        y[i] = alpha * acc + beta * y[i];
    }""",
    "row_alpha_only": """
    for (int i = 0; i < m; i++) {
        T acc = 0;
        for (int k = 0; k < n; k++) acc += A[i * lda + k] * x[k];
        y[i] = alpha * acc;
    }""",
    "row_lda_rowptr": """
    for (int i = 0; i < m; i++) {
        const T *row = A + (long)i * lda;
        T acc = 0;
        for (int k = 0; k < n; k++) acc += row[k] * x[k];
        y[i] = acc;
    }""",
    "row_lower_bound": """
    for (int i = lb; i < m; i++) {
        T acc = 0;
        for (int k = 0; k < n; k++) acc += A[i * n + k] * x[k];
        y[i] = acc;
    }""",
    "row_k_from_one": """
    for (int i = 0; i < m; i++) {
        T acc = 0;
        for (int k = 1; k < n; k++) acc += A[i * n + k] * x[k];
        y[i] = acc;
    }""",
    "col_set": """
    for (int i = 0; i < m; i++) {
        T acc = 0;
        for (int k = 0; k < n; k++) acc += A[k * lda + i] * x[k];
        y[i] = acc;
    }""",
    "col_alpha_beta_i64": """
    long M = m, N = n, LD = lda;
    for (long i = 0; i < M; i++) {
        T acc = 0;
        for (long k = 0; k < N; k++) acc += x[k] * A[k * LD + i];
        y[i] = beta * y[i] + alpha * acc;
    }""",
    "omp_row_set": """
    #pragma omp parallel for
    for (int i = 0; i < m; i++) {
        T acc = 0;
        for (int k = 0; k < n; k++) acc += A[i * n + k] * x[k];
        y[i] = acc;
    }""",
    "omp_row_acc_i64": """
    long M = m, N = n;
    #pragma omp parallel for
    for (long i = 0; i < M; i++) {
        T acc = 0;
        for (long k = 0; k < N; k++) acc += A[i * N + k] * x[k];
        y[i] += acc;
    }""",
    "omp_col_alpha_beta": """
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < m; i++) {
        T acc = 0;
        for (int k = 0; k < n; k++) acc += A[k * lda + i] * x[k];
        y[i] = alpha * acc + beta * y[i];
    }""",
    "omp_row_dynamic": """
    #pragma omp parallel for schedule(dynamic, 16)
    for (int i = 0; i < m; i++) {
        T acc = 0;
        for (int k = 0; k < n; k++) acc += A[i * n + k] * x[k];
        y[i] = acc;
    }""",
}

#: PolyBench-style kernels with constant bounds over 2-D arrays (shape fixed: POLY_N).
POLY_N = 37
POLY_KERNELS = {
    "poly_row_2d": f"""
    for (int i = 0; i < {POLY_N}; i++) {{
        T t = 0;
        for (int k = 0; k < {POLY_N}; k++) t += A[i][k] * x[k];
        y[i] = t;
    }}""",
    "poly_col_2d_ab": f"""
    for (int i = 0; i < {POLY_N}; i++) {{
        T t = 0;
        for (int k = 0; k < {POLY_N}; k++) t += A[k][i] * x[k];
        y[i] = alpha * t + beta * y[i];
    }}""",
}

#: Negative cases: name -> (body, expected reason substring or "guard"). "guard" kernels are
#: rewritten but the call in main makes the guard fail (y aliases x or A).
NEGATIVES = {
    "neg_triangular": ("""
    for (int i = 0; i < m; i++) {
        T acc = 0;
        for (int k = 0; k < i; k++) acc += A[i * n + k] * x[k];
        y[i] = acc;
    }""", "triangular"),
    "neg_extra_store": ("""
    for (int i = 0; i < m; i++) {
        T acc = 0;
        for (int k = 0; k < n; k++) acc += A[i * n + k] * x[k];
        y[i] = acc;
        y[m + i] = 2 * acc;
    }""", "extra store"),
    "neg_nonaffine": ("""
    for (int i = 0; i < m; i++) {
        T acc = 0;
        for (int k = 0; k < n; k++) acc += A[i * n + (k * k) % n] * x[k];
        y[i] = acc;
    }""", "non-affine"),
    "neg_used_after": ("""
    T last = 0;
    for (int i = 0; i < m; i++) {
        T acc = 0;
        for (int k = 0; k < n; k++) acc += A[i * n + k] * x[k];
        y[i] = acc;
        last = acc;
    }
    y[m] = last;""", "used after"),
    "neg_call_in_nest": ("""
    for (int i = 0; i < m; i++) {
        T acc = 0;
        for (int k = 0; k < n; k++) acc += A[i * n + k] * x[k];
        y[i] = acc;
        observe(acc);
    }""", "call to"),
    "alias_y_is_x": ("""
    for (int i = 0; i < m; i++) {
        T acc = 0;
        for (int k = 0; k < n; k++) acc += A[i * n + k] * x[k];
        y[i] = acc;
    }""", "guard"),
    "alias_y_in_A": ("""
    for (int i = 0; i < m; i++) {
        T acc = 0;
        for (int k = 0; k < n; k++) acc += A[i * n + k] * x[k];
        y[i] = acc;
    }""", "guard"),
    "neg_strict_fp": ("""
    #pragma clang fp reassociate(off)
    for (int i = 0; i < m; i++) {
        T acc = 0;
        for (int k = 0; k < n; k++) acc += A[i * n + k] * x[k];
        y[i] = acc;
    }""", "reassoc"),
}

INT_NEGATIVE = ("neg_int_elements", """
__attribute__((noinline)) void neg_int_elements(int *y, const int *A, const int *x, int m, int n) {
    for (int i = 0; i < m; i++) {
        int acc = 0;
        for (int k = 0; k < n; k++) acc += A[i * n + k] * x[k];
        y[i] = acc;
    }
}""", "not float/double")

#: PolyBench-style kernels (written for Ditto after the PolyBench/C 4.2 kernel descriptions):
#: name -> (body, expected status per outer loop in source order). Constant size PB_N.
PB_N = 41
POLYBENCH = {
    "pb_mvt": ("""
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) x1[i] = x1[i] + A[i][j] * y1[j];
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) x2[i] = x2[i] + A[j][i] * y2[j];""",
               ["rewritten", "rewritten"]),
    "pb_atax": ("""
    for (int i = 0; i < N; i++) y1[i] = 0;
    for (int i = 0; i < N; i++) {
        x2[i] = 0;
        for (int j = 0; j < N; j++) x2[i] = x2[i] + A[i][j] * y2[j];
        for (int j = 0; j < N; j++) y1[j] = y1[j] + A[i][j] * x2[i];
    }""", ["rejected"]),
    "pb_bicg": ("""
    for (int i = 0; i < N; i++) x1[i] = 0;
    for (int i = 0; i < N; i++) {
        x2[i] = 0;
        for (int j = 0; j < N; j++) {
            x1[j] = x1[j] + y1[i] * A[i][j];
            x2[i] = x2[i] + A[i][j] * y2[j];
        }
    }""", ["rejected"]),
    "pb_gesummv": ("""
    for (int i = 0; i < N; i++) {
        T t = 0, u = 0;
        for (int j = 0; j < N; j++) {
            t = A[i][j] * y1[j] + t;
            u = B[i][j] * y1[j] + u;
        }
        x1[i] = 1.5f * t + 0.5f * u;
    }""", ["rejected"]),
    "pb_gemver_part": ("""
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) x1[i] = x1[i] + 0.75f * A[j][i] * y1[j];
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) x2[i] = x2[i] + A[i][j] * x1[j];""",
                       ["rewritten", "rewritten"]),
}


def polybench_source() -> str:
    """PolyBench-style kernels over ``T A[N][N]`` (float), each run once and printed."""
    out = [PRELUDE.format(T="float"), f"#define N {PB_N}\n"]
    sig = "(T A[N][N], T B[N][N], T *x1, T *x2, T *y1, T *y2)"
    for name, (body, _) in POLYBENCH.items():
        out.append(f"__attribute__((noinline)) void {name}{sig} {{\n    (void)B; (void)x1; (void)x2;"
                   f" (void)y2; (void)y1;{body}\n}}\n")
    calls = "\n".join(f"""    init(A, B, v);
    {name}(A, B, v, v + N, v + 2 * N, v + 3 * N);
    printf("{name} {PB_N} {PB_N}");
    for (int i = 0; i < 4 * N; i++) printf(" %.17g", (double)v[i]);
    printf("\\n");
    print_calls("{name}", {PB_N}, {PB_N});""" for name in POLYBENCH)
    out.append(f"""
static void init(T A[N][N], T B[N][N], T *v) {{
    for (int i = 0; i < N; i++) for (int j = 0; j < N; j++) {{ A[i][j] = rnd(); B[i][j] = rnd(); }}
    for (int i = 0; i < 4 * N; i++) v[i] = rnd();
}}

int main(void) {{
    T (*A)[N] = malloc(sizeof(T) * N * N), (*B)[N] = malloc(sizeof(T) * N * N);
    T *v = malloc(sizeof(T) * 4 * N);
{calls}
    free(A); free(B); free(v);
    return 0;
}}
""")
    return "".join(out)


PRELUDE = """\
/* Generated by tests/corpus/gen_corpus.py -- do not edit. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

/* Count the BLAS calls the rewritten program makes: these definitions of the scipy-openblas32
 * symbols take precedence over the library's and forward to it (dlsym RTLD_NEXT). */
static int blas_calls;
int scipy_openblas_get_num_threads(void);
typedef void (*sgemv_fn)(int, int, int, int, float, const float *, int, const float *, int,
                         float, float *, int);
typedef void (*dgemv_fn)(int, int, int, int, double, const double *, int, const double *, int,
                         double, double *, int);
void scipy_cblas_sgemv(int o, int t, int M, int N, float al, const float *A, int lda,
                       const float *X, int incx, float be, float *Y, int incy) {{
    sgemv_fn real = (sgemv_fn)dlsym(RTLD_NEXT, "scipy_cblas_sgemv");
    __atomic_fetch_add(&blas_calls, 1, __ATOMIC_RELAXED);
    real(o, t, M, N, al, A, lda, X, incx, be, Y, incy);
}}
void scipy_cblas_dgemv(int o, int t, int M, int N, double al, const double *A, int lda,
                       const double *X, int incx, double be, double *Y, int incy) {{
    dgemv_fn real = (dgemv_fn)dlsym(RTLD_NEXT, "scipy_cblas_dgemv");
    __atomic_fetch_add(&blas_calls, 1, __ATOMIC_RELAXED);
    real(o, t, M, N, al, A, lda, X, incx, be, Y, incy);
}}
static void print_calls(const char *name, int m, int n) {{
    printf("calls %s %d %d %d\\n", name, m, n, blas_calls);
    blas_calls = 0;
    if (getenv("DITTO_CORPUS_NEVER_SET")) printf("%d\\n", scipy_openblas_get_num_threads());
}}

typedef {T} T;
#define SIG (T *y, const T *A, const T *x, int m, int n, int lda, T alpha, T beta, int lb)

static unsigned lcg_state = 12345u;
static T rnd(void) {{ /* uniform in [-1, 1) */
    lcg_state = lcg_state * 1664525u + 1013904223u;
    return (T)((double)(lcg_state >> 8) / 8388608.0 - 1.0);
}}
volatile T observed;
__attribute__((noinline)) void observe(T v) {{ observed = v; }}
"""


def _kernel(name: str, body: str) -> str:
    pragma = ""
    if body.lstrip().startswith("#pragma clang fp"):
        first, body = body.lstrip().split("\n", 1)
        pragma = "\n#ifdef __clang__\n    " + first + "\n#endif"
        body = "\n" + body
    return (f"__attribute__((noinline)) void {name} SIG {{{pragma}\n    (void)y; (void)A; (void)x; (void)m; (void)n; (void)lda;"
            f"\n    (void)alpha; (void)beta; (void)lb;{body}\n}}\n")


def _main(names: list[str], ctype: str, special: str = "") -> str:
    table = ",\n    ".join(f'{{"{n}", {n}}}' for n in names)
    shapes = ", ".join(f"{{{m}, {n}}}" for m, n in SHAPES)
    return f"""
typedef void (*kernel_fn) SIG;
static const struct {{ const char *name; kernel_fn fn; }} kernels[] = {{
    {table}
}};
static const int shapes[][2] = {{ {shapes} }};

static void print_vec(const char *name, int m, int n, const T *y, int len) {{
    printf("%s %d %d", name, m, n);
    for (int i = 0; i < len; i++) printf(" %.17g", (double)y[i]);
    printf("\\n");
}}

int main(void) {{
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {{
        int m = shapes[s][0], n = shapes[s][1];
        int big = (m > n ? m : n) + 4, lda = big - 1;
        T *A = malloc(sizeof(T) * (size_t)big * (size_t)big);
        T *x = malloc(sizeof(T) * (size_t)big);
        T *y = malloc(sizeof(T) * (size_t)(2 * big));
        for (size_t kk = 0; kk < sizeof kernels / sizeof kernels[0]; kk++) {{
            for (int i = 0; i < big * big; i++) A[i] = rnd();
            for (int i = 0; i < big; i++) x[i] = rnd();
            for (int i = 0; i < 2 * big; i++) y[i] = rnd();
            kernels[kk].fn(y, A, x, m, n, lda, (T)1.5, (T)-0.75, m / 3);
            print_vec(kernels[kk].name, m, n, y, 2 * big);
            print_calls(kernels[kk].name, m, n);
        }}
{special}
        free(A); free(x); free(y);
    }}
    return 0;
}}
"""


def poly_source() -> str:
    out = []
    for name, body in POLY_KERNELS.items():
        out.append(f"__attribute__((noinline)) void {name}(T A[{POLY_N}][{POLY_N}], T *y, const T *x, T alpha, T beta) "
                   f"{{\n    (void)alpha; (void)beta;{body}\n}}\n")
    calls = "\n".join(f"""        {{
            T (*P)[{POLY_N}] = malloc(sizeof(T) * {POLY_N} * {POLY_N});
            T *px = malloc(sizeof(T) * {POLY_N}), *py = malloc(sizeof(T) * {POLY_N});
            for (int i = 0; i < {POLY_N}; i++) for (int k = 0; k < {POLY_N}; k++) P[i][k] = rnd();
            for (int i = 0; i < {POLY_N}; i++) {{ px[i] = rnd(); py[i] = rnd(); }}
            {name}(P, py, px, (T)0.5, (T)2.0);
            if (s == 0) {{
                print_vec("{name}", {POLY_N}, {POLY_N}, py, {POLY_N});
                print_calls("{name}", {POLY_N}, {POLY_N});
            }}
            blas_calls = 0;
            free(P); free(px); free(py);
        }}""" for name in POLY_KERNELS)
    return "".join(out), calls


def source(ctype: str) -> str:
    """The positive corpus file for element type ``ctype`` ("float" or "double")."""
    body = "".join(_kernel(n, b) for n, b in KERNELS.items())
    poly, calls = poly_source()
    return PRELUDE.format(T=ctype) + body + poly + _main(list(KERNELS), ctype, calls)


def negatives_source() -> str:
    """The negative corpus (float): kernels the pass must reject, or guard at run time."""
    body = "".join(_kernel(n, b) for n, (b, _) in NEGATIVES.items())
    body += INT_NEGATIVE[1] + "\n"
    names = [n for n in NEGATIVES if not n.startswith("alias_")]
    special = """        {
            /* y aliases x (the guard must fail: y overlaps x) */
            for (int i = 0; i < big * big; i++) A[i] = rnd();
            for (int i = 0; i < 2 * big; i++) y[i] = rnd();
            alias_y_is_x(y, A, y, m, n, lda, 1, 0, 0);
            print_vec("alias_y_is_x", m, n, y, 2 * big);
            print_calls("alias_y_is_x", m, n);
            /* y is the last row of A (overlaps A) */
            for (int i = 0; i < big * big; i++) A[i] = rnd();
            for (int i = 0; i < big; i++) x[i] = rnd();
            if (m > 0) {
                alias_y_in_A(A + (size_t)(m - 1) * n, A, x, m, n, lda, 1, 0, 0);
            }
            print_vec("alias_y_in_A", m, n, A, m * n + m);
            print_calls("alias_y_in_A", m, n);
            int *iA = malloc(sizeof(int) * (size_t)big * big), *ix = malloc(sizeof(int) * big);
            int *iy = malloc(sizeof(int) * big);
            for (int i = 0; i < big * big; i++) iA[i] = (int)(rnd() * 100);
            for (int i = 0; i < big; i++) ix[i] = (int)(rnd() * 100);
            neg_int_elements(iy, iA, ix, m, n);
            printf("neg_int_elements %d %d", m, n);
            for (int i = 0; i < m; i++) printf(" %d", iy[i]);
            printf("\\n");
            free(iA); free(ix); free(iy);
        }"""
    return PRELUDE.format(T="float") + body + _main(names, "float", special)


def expected_negatives() -> dict:
    """Kernel name -> expected reason substring ("guard": rewritten, guarded at run time)."""
    out = {n: why for n, (_, why) in NEGATIVES.items()}
    out[INT_NEGATIVE[0]] = INT_NEGATIVE[2]
    return out


def random_kernels(seed: int = 2026, count: int = 48) -> dict:
    """Random combinations of the recognised features (index type, layout, constant offsets
    of A/x/y, lower and upper bounds of both loops, operand order, store form): name -> body.
    Deterministic for a seed (Python's ``random.Random``)."""
    import random

    rng = random.Random(seed)
    out = {}
    for j in range(count):
        it = rng.choice(["int", "long", "unsigned"])
        layout = rng.choice(["row", "col"])
        ld = rng.choice(["n", "lda"]) if layout == "row" else "lda"
        ca, cx, cy = rng.choice([0, 1, 3]), rng.choice([0, 1]), rng.choice([0, 2])
        i0 = rng.choice(["0", "1", "lb"] if it != "unsigned" else ["0", "1"])
        i1 = rng.choice(["m", "m - 1"])
        k0, k1 = rng.choice(["0", "1"]), rng.choice(["n", "n - 1"])
        a = f"A[({it})(i) * ({it}){ld} + ({it})k + {ca}]" if layout == "row" else \
            f"A[({it})k * ({it}){ld} + ({it})(i) + {ca}]"
        prod = rng.choice([f"{a} * x[k + {cx}]", f"x[k + {cx}] * {a}"])
        form = rng.choice(["set", "acc", "ab", "sub", "inplace", "alpha"])
        yi = f"y[i + {cy}]"
        loop_i = f"for ({it} i = {i0}; i < ({it})({i1}); i++)"
        loop_k = f"for ({it} k = {k0}; k < ({it})({k1}); k++)"
        if form == "inplace":
            body = f"""
    if (m < 2 || n < 2) return;
    {loop_i}
        {loop_k} {yi} += {prod};"""
        else:
            store = {"set": f"{yi} = acc;", "acc": f"{yi} += acc;",
                     "ab": f"{yi} = alpha * acc + beta * {yi};", "sub": f"{yi} -= acc;",
                     "alpha": f"{yi} = acc * alpha;"}[form]
            body = f"""
    if (m < 2 || n < 2) return;
    {loop_i} {{
        T acc = 0;
        {loop_k} acc += {prod};
        {store}
    }}"""
        out[f"rnd{j:02d}_{it}_{layout}_{form}"] = body
    return out


def random_source() -> str:
    """The random-combination corpus file (float)."""
    kernels = random_kernels()
    body = "".join(_kernel(n, b) for n, b in kernels.items())
    return PRELUDE.format(T="float") + body + _main(list(kernels), "float")


def write_all(outdir: Path) -> dict:
    """Write the corpus files into ``outdir``; returns {key: path}."""
    outdir.mkdir(parents=True, exist_ok=True)
    files = {"float": source("float"), "double": source("double"),
             "negatives": negatives_source(), "polybench": polybench_source(),
             "random": random_source()}
    paths = {}
    for key, text in files.items():
        p = outdir / (f"{key}.c" if key in ("negatives", "polybench", "random")
                      else f"gemv_{key}.c")
        p.write_text(text)
        paths[key] = p
    return paths


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
    for p in write_all(out).values():
        print(p)
