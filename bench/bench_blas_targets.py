"""Benchmark: the BLAS libraries Ditto can link, on the GEMV (decode) and GEMM (prefill) shapes
of SmolLM2-135M, at 1 and 2 BLAS threads. Prints JSON.

    python bench/bench_blas_targets.py [--rounds 5] [--threads 1,2] [--targets openblas,openblas-zen,mkl]

Targets: ``openblas`` = scipy-openblas32 as linked by ``--blas openblas`` with the kernel it
selects itself (``OPENBLAS_VERBOSE=2`` prints it: "Core: Haswell" on AMD Zen 3);
``openblas-<core>`` = the same library forced to another kernel set with
``OPENBLAS_CORETYPE=<core>`` (each target runs in its own process, the variable is read at
load); ``mkl`` = oneMKL ``mkl_rt`` from PyPI ``mkl-devel`` (``--blas mkl``). Each library is
loaded with ctypes and called through CBLAS; the thread count is set with its own call
(``scipy_openblas_set_num_threads`` / ``MKL_Set_Num_Threads``). GEMV: y = W x with W cycling
through enough copies (> 64 MB) that every call streams W from memory, as decode does; GB/s of
W read. GEMM: Y[T][rows] = X[T][cols] · Wᵀ (RowMajor, NoTrans, Trans: the prefill call of
docs/PASS.md "GEMM"), T = 64; GFLOP/s. Best of ``--rounds`` after one warm-up.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time

import numpy as np

GEMV_SHAPES = [(576, 576), (1536, 576), (576, 1536), (49152, 576)]
GEMM_SHAPES = [(576, 576), (1536, 576), (576, 1536), (49152, 576)]
T = 64


def _lib(target: str):
    if target.startswith("openblas"):
        from ditto_blas_openblas import OpenBlasTarget
        lib = ctypes.CDLL(str(OpenBlasTarget().library_file()))
        return lib, "scipy_", lib.scipy_openblas_set_num_threads
    from ditto_blas_mkl import MklTarget
    path = MklTarget().link_flags()[0]
    lib = ctypes.CDLL(path)
    return lib, "", lib.MKL_Set_Num_Threads


def run_one(target: str, threads: list[int], rounds: int) -> dict:
    lib, prefix, set_threads = _lib(target)
    P = ctypes.c_void_p
    gemv = getattr(lib, prefix + "cblas_sgemv")
    gemv.argtypes = [ctypes.c_int] * 4 + [ctypes.c_float, P, ctypes.c_int, P, ctypes.c_int,
                                          ctypes.c_float, P, ctypes.c_int]
    gemm = getattr(lib, prefix + "cblas_sgemm")
    gemm.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, P, ctypes.c_int, P, ctypes.c_int,
                                          ctypes.c_float, P, ctypes.c_int]
    rng = np.random.default_rng(0)
    out = {"gemv_GBps": {}, "gemm_GFLOPs": {}}
    if target == "mkl":
        buf = ctypes.create_string_buffer(512)
        lib.mkl_get_version_string(buf, 512)
        out["kernel"] = buf.value.decode(errors="replace").strip()
    for th in threads:
        set_threads(th)
        for rows, cols in GEMV_SHAPES:
            copies = max(1, (64 << 20) // (rows * cols * 4) + 1)
            Ws = [rng.standard_normal((rows, cols), dtype=np.float32) for _ in range(copies)]
            x = rng.standard_normal(cols, dtype=np.float32)
            y = np.zeros(rows, np.float32)
            best = float("inf")
            for r in range(rounds + 1):
                t0 = time.perf_counter()
                for W in Ws:
                    gemv(101, 111, rows, cols, 1.0, W.ctypes.data, cols, x.ctypes.data, 1, 0.0,
                         y.ctypes.data, 1)
                dt = (time.perf_counter() - t0) / copies
                if r:
                    best = min(best, dt)
            np.testing.assert_allclose(y, Ws[-1] @ x, rtol=1e-3, atol=1e-3)
            out["gemv_GBps"][f"{rows}x{cols}@{th}"] = rows * cols * 4 / best / 1e9
        for rows, cols in GEMM_SHAPES:
            W = rng.standard_normal((rows, cols), dtype=np.float32)
            X = rng.standard_normal((T, cols), dtype=np.float32)
            Y = np.zeros((T, rows), np.float32)
            best = float("inf")
            for r in range(rounds + 1):
                t0 = time.perf_counter()
                gemm(101, 111, 112, T, rows, cols, 1.0, X.ctypes.data, cols, W.ctypes.data,
                     cols, 0.0, Y.ctypes.data, rows)
                dt = time.perf_counter() - t0
                if r:
                    best = min(best, dt)
            np.testing.assert_allclose(Y, X @ W.T, rtol=1e-3, atol=1e-3)
            out["gemm_GFLOPs"][f"{T}x{rows}x{cols}@{th}"] = 2 * T * rows * cols / best / 1e9
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--targets", default="openblas,openblas-zen,mkl")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # run a single target in this process
    args = ap.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    if args.one:
        print(json.dumps(run_one(args.one, threads, args.rounds)))
        return 0
    results = {"load_average": os.getloadavg(), "T": T}
    for target in args.targets.split(","):
        env = dict(os.environ, OPENBLAS_VERBOSE="2")
        env.pop("OPENBLAS_CORETYPE", None)
        if target.startswith("openblas-"):
            env["OPENBLAS_CORETYPE"] = target.split("-", 1)[1].capitalize()
        p = subprocess.run([sys.executable, __file__, "--one", target, "--rounds",
                            str(args.rounds), "--threads", args.threads], env=env,
                           capture_output=True, text=True, check=True)
        res = json.loads(p.stdout.strip().splitlines()[-1])
        # the last "Core:" line is the library loaded by ctypes (numpy's own OpenBLAS, loaded
        # at import, prints one first)
        core = [ln for ln in p.stdout.splitlines() + p.stderr.splitlines()
                if ln.startswith("Core:")]
        if target.startswith("openblas"):
            res["kernel"] = core[-1][5:].strip() if len(core) > 1 else "(not reported)"
        results[target] = res
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
