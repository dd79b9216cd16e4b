"""Benchmark the gemv-blas pass's OpenMP options side by side; prints one JSON object.

Programs (one C kernel ``y = W x``, W d×n row-major fp32, timed over R calls per shape):

- ``naive_omp``     : ``#pragma omp parallel for`` naive loops, no rewrite (O3 host)
- ``chunk_blas``    : OpenMP kept; each thread's chunk rewritten to one sgemv, BLAS left at its
                      default thread count (pthreads BLAS inside OpenMP threads: oversubscribed)
- ``chunk_blas_1t`` : same, BLAS made single-threaded once (pass option omp_threads="single")
- ``region_blas``   : the parallel region serialized by the pass (omp_threads="region"): ONE
                      sgemv over the whole range with BLAS's own threads
- ``whole_blas``    : the program built without -fopenmp and rewritten (one sgemv, BLAS threads;
                      the lower bound of what a whole-region rewrite can cost)
- ``naive_serial``  : no OpenMP, no rewrite (reference)

Usage: ``python bench/bench_pass.py [--threads 2] [--reps 200]``. W rotates over copies
totalling > 96 MB, so every call streams its matrix from DRAM as in decode. Shapes: SmolLM2-135M's
matrices (576×576, 1536×576, 576×1536, 49152×576 classifier) and 4096×4096.
Minimum ns per GEMV call over ``--rounds`` interleaved runs (median also given), and GB/s of matrix traffic (4·d·n bytes per call).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SHAPES = [(576, 576), (1536, 576), (576, 1536), (49152, 576), (4096, 4096)]

SRC = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define COLD_BYTES (96u << 20)

__attribute__((noinline)) void matmul(float *xout, const float *x, const float *w, int n, int d) {
    int i;
    #pragma omp parallel for private(i)
    for (i = 0; i < d; i++) {
        float val = 0.0f;
        for (int j = 0; j < n; j++) val += w[i * n + j] * x[j];
        xout[i] = val;
    }
}

int main(int argc, char **argv) {
    int d = atoi(argv[1]), n = atoi(argv[2]), reps = atoi(argv[3]);
    /* rotate over enough copies of W to exceed the last-level cache (as in LLM decode, where
     * every weight matrix is read once per token from DRAM) */
    size_t per = (size_t)d * n, copies = (size_t)COLD_BYTES / (4 * per) + 1;
    float *wall = malloc(sizeof(float) * per * copies), *x = malloc(sizeof(float) * n);
    float *y = malloc(sizeof(float) * d), *w = wall;
    for (size_t i = 0; i < per * copies; i++) wall[i] = (float)((i * 2654435761u) % 1000) / 1000.0f;
    for (int i = 0; i < n; i++) x[i] = (float)(i % 7) / 7.0f;
    matmul(y, x, w, n, d);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int r = 0; r < reps; r++) {
        w = wall + per * ((size_t)r % copies);
        matmul(y, x, w, n, d);
        x[r % n] += y[r % d] * 1e-9f;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ns = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / reps;
    printf("%.1f %.6g\n", ns, (double)y[d / 2]);
    return 0;
}
"""


def build(src: Path, out: Path, *, openmp: bool, rewrite: bool, omp_threads: str = "single"):
    from ditto_core.stages.cc import emit_ir, link, resolve_blas
    from ditto_pass_gemv_blas import GemvBlasPass

    blas = resolve_blas("openblas")
    flags = blas.compile_flags() + (["-fopenmp"] if openmp else [])
    with tempfile.TemporaryDirectory() as tmp:
        mod = emit_ir([src], workdir=Path(tmp), flags=flags)
        report = None
        if rewrite:
            mod, report = GemvBlasPass(omp_threads=omp_threads).run(mod, blas)
            assert report.rewritten == 1, report.candidates
        link(mod, blas, out)
    return out


def run_once(exe: Path, d: int, n: int, reps: int, threads: int) -> float:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    p = subprocess.run([str(exe), str(d), str(n), str(reps)], capture_output=True,
                       text=True, env=env, check=True)
    return float(p.stdout.split()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src = tmp / "matmul.c"
        src.write_text(SRC)
        exes = {
            "naive_omp": build(src, tmp / "naive_omp", openmp=True, rewrite=False),
            "chunk_blas": build(src, tmp / "chunk_blas", openmp=True, rewrite=True,
                                omp_threads="blas"),
            "chunk_blas_1t": build(src, tmp / "chunk_1t", openmp=True, rewrite=True,
                                   omp_threads="single"),
            "region_blas": build(src, tmp / "region", openmp=True, rewrite=True,
                                 omp_threads="region"),
            "whole_blas": build(src, tmp / "whole", openmp=False, rewrite=True),
            "naive_serial": build(src, tmp / "naive_serial", openmp=False, rewrite=False),
        }
        results = []
        for d, n in SHAPES:
            reps = max(5, int(args.reps * 576 * 576 / (d * n)))
            row = {"d": d, "n": n, "reps": reps}
            times = {name: [] for name in exes}
            for _ in range(args.rounds):  # interleaved, so load changes hit every variant
                for name, exe in exes.items():
                    times[name].append(run_once(exe, d, n, reps, args.threads))
            for name in exes:
                ns = min(times[name])
                row[name] = {"ns_per_call": ns, "median_ns": statistics.median(times[name]),
                             "GBps": round(4.0 * d * n / ns, 2)}
            base = row["naive_omp"]["ns_per_call"]
            row["speedup_vs_naive_omp"] = {k: round(base / row[k]["ns_per_call"], 2)
                                           for k in exes}
            results.append(row)
    json.dump({"threads": args.threads, "cpu_count": os.cpu_count(),
               "load_avg": os.getloadavg(), "statistic": "min over interleaved rounds",
               "results": results},
              sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
