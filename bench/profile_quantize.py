"""Where the time of the ``kmeans`` quantizer goes, phase by phase, on one matrix; prints JSON.

    NUMBA_NUM_THREADS=1 python bench/profile_quantize.py [--rows 4096] [--cols 4096]
        [--bits 4] [--group-size 256] [--data bf16|q4_1] [--repeat 1]

The matrix is either Student-t (ν = 5) weights rounded to bf16 with a few outlier input
channels (the synthetic 7B checkpoint's weights, bench/synth_checkpoint.py: ~232 distinct values
per sub-block of 256) or a Q4_1 grid (SmolLM2's GGUF: ~105 distinct values per 256). Each phase
of ``quantize_matrix`` is run on its own and timed in wall and process CPU seconds (all
threads): loading (bf16 → f32 widening as the HF exporter does it; GGUF F16 and Q4_1
dequantization through ``gguf.quants``), the NaN/Inf check, sorting the sub-blocks, reducing
them to distinct values, the optimal DP (the centroid kernel minus the distinct pass), f16
rounding of the codebooks, the nearest-centroid assignment, bit packing, and the Python
overhead of ``quantize_matrix`` (its total minus the phases it runs). Run with
``NUMBA_NUM_THREADS=1`` for per-core seconds; ``DITTO_KMEANS_KERNEL=numba`` times the numba
reference kernels (DP and assignment) instead of the C ones (the output records which ran).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numba
import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import quants
from numba import njit, prange

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synth_checkpoint import synth_matrix, to_bf16_bits  # noqa: E402

from ditto_core.base.untrusted import check_finite  # noqa: E402
from ditto_core.model import codebook  # noqa: E402
from ditto_core.model.codebook import codebook_payload  # noqa: E402
from ditto_quant_kmeans import kmeans1d, native, quantize_matrix  # noqa: E402


@njit(cache=True, parallel=True)
def _distinct_all(Ws, group_size):
    """The distinct-value pass of ``matrix_centroids`` alone, over every sub-block."""
    rows, cols = Ws.shape
    S = (cols + group_size - 1) // group_size
    out = np.empty(rows * S, np.int64)
    for t in prange(rows * S):
        r = t // S
        s = t - r * S
        a = s * group_size
        b = min(a + group_size, cols)
        xs = Ws[r, a:b]
        u = np.empty(b - a, np.float64)
        w = np.empty(b - a, np.int64)
        out[t] = kmeans1d._distinct(xs, u, w)
    return out


def timed(fn, *args, repeat=1):
    """(result, best wall seconds, CPU seconds of that run) of ``fn(*args)``."""
    best = None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        r = fn(*args)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        if best is None or dt < best[0]:
            best = (dt, dc)
    return r, best[0], best[1]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=256)
    ap.add_argument("--data", choices=("bf16", "q4_1"), default="bf16")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args(argv)
    rows, cols, b, g = args.rows, args.cols, args.bits, args.group_size
    k = codebook.n_centroids(b)

    rng = np.random.default_rng(0)
    W = synth_matrix(rng, rows, cols)  # float32 holding bf16 values
    bf16 = to_bf16_bits(W)
    if args.data == "q4_1":
        W = quants.dequantize(quants.quantize(W, QT.Q4_1), QT.Q4_1).astype(np.float32)
    f16q = quants.quantize(W, QT.F16)
    q41 = quants.quantize(W, QT.Q4_1)
    # compile / load the numba caches outside the timed region
    quantize_matrix(W[:4], b, g, "optimal", "f16", 0, "warm")
    _distinct_all(kmeans1d.sort_sub_blocks(W[:4], g), g)

    phases = {}

    def rec(name, dt, dc):
        phases[name] = {"wall_s": round(dt, 4), "cpu_s": round(dc, 4)}

    rep = args.repeat
    _, dt, dc = timed(lambda: (bf16.astype(np.uint32) << 16).view(np.float32), repeat=rep)
    rec("load_bf16_to_f32", dt, dc)
    _, dt, dc = timed(lambda: quants.dequantize(f16q, QT.F16).astype(np.float32), repeat=rep)
    rec("load_gguf_f16_dequantize", dt, dc)
    _, dt, dc = timed(lambda: quants.dequantize(q41, QT.Q4_1).astype(np.float32), repeat=rep)
    rec("load_gguf_q4_1_dequantize", dt, dc)
    _, dt, dc = timed(check_finite, W, "W", repeat=rep)
    rec("check_finite", dt, dc)
    Ws, dt, dc = timed(kmeans1d.sort_sub_blocks, W, g, repeat=rep)
    rec("sort_sub_blocks", dt, dc)
    nd, dt_d, dc_d = timed(_distinct_all, Ws, g, repeat=rep)
    rec("distinct_values", dt_d, dc_d)
    cent = np.empty((rows, codebook.n_sub_blocks(cols, g), k), np.float64)
    _, dt, dc = timed(kmeans1d.matrix_centroids, Ws, g, k, kmeans1d.METHOD_OPTIMAL,
                      np.uint64(0), 4, 100, 1e-6, cent, repeat=rep)
    rec("centroids_total", dt, dc)
    rec("optimal_dp", dt - dt_d, dc - dc_d)

    def f16_round():
        with np.errstate(over="ignore"):
            cb = cent.astype(np.float16).astype(np.float32)
        np.isfinite(cb).all()
        return cb

    cb, dt, dc = timed(f16_round, repeat=rep)
    rec("f16_rounding", dt, dc)
    idx = np.empty((rows, cols), np.uint8)
    _, dt, dc = timed(kmeans1d.assign_matrix, W, g, cb, idx, repeat=rep)
    rec("assign_nearest", dt, dc)
    q, dt_q, dc_q = timed(quantize_matrix, W, b, g, "optimal", "f16", 0, "W", repeat=rep)
    _, dt, dc = timed(codebook_payload, q, repeat=rep)
    rec("pack_bits", dt, dc)
    inner = ("check_finite", "sort_sub_blocks", "centroids_total", "f16_rounding",
             "assign_nearest")
    rec("quantize_matrix_total", dt_q, dc_q)
    rec("python_overhead", dt_q - sum(phases[p]["wall_s"] for p in inner),
        dc_q - sum(phases[p]["cpu_s"] for p in inner))
    n = rows * cols
    out = {"rows": rows, "cols": cols, "bits": b, "group_size": g, "method": "optimal",
           "data": args.data, "numba_threads": numba.get_num_threads(),
           "dp_kernel": "numba" if native.load() is None else "c",
           "distinct_per_sub_block": round(float(nd.mean()), 1),
           "load_average": os.getloadavg(), "phases": phases,
           "quantize_s_per_1B_wall": round(dt_q / n * 1e9, 1),
           "quantize_s_per_1B_cpu": round(dc_q / n * 1e9, 1)}
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
