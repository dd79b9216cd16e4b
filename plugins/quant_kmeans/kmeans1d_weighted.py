"""Importance-weighted 1-D k-means on sub-blocks (numba kernels): activation-aware codebooks.

Each weight x_c of a sub-block carries an importance a_c > 0 (the mean squared activation of its
input channel c over a calibration text: ``ditto_core.eval.calibration``), and the codebook of the
sub-block minimises Σ a_c (x_c − centroid(x_c))². Under a diagonal approximation of the
activation covariance this is the expected squared output error E‖(W − Ŵ) x‖² of the row, the
objective llama.cpp's imatrix quantizers weight with the same statistic.

The exact optimum is the dynamic programme of ``kmeans1d._optimal_ws`` (Wang & Song 2011) with
real weights: prefix sums of a, a·x, a·x² over the sorted distinct values (equal values merged,
their importances summed), ``SSE(j, i) = Σa·x² − (Σa·x)² / Σa``. The weighted cost still satisfies
the quadrangle inequality (positive weights are the limit of multiplicities; Grønlund et al.
2017, §2), so the Knuth windows stay valid. The arithmetic mirrors the unweighted kernel
operation for operation (``1.0 / n`` where it reads ``inv[n]``), so unit importances give the
unweighted result bit for bit (tests/test_quant_weighted.py).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from .kmeans1d import CHUNK_BLOCKS, METHOD_OPTIMAL, lloyd_weighted, sort_sub_blocks


@njit(cache=True)
def _distinct_weighted(xs, ws, u, w):
    """Distinct values of sorted ``xs`` into ``u`` (float64) with the sum of their weights
    ``ws`` into ``w`` (float64); returns how many."""
    m = 0
    for i in range(xs.shape[0]):
        if m > 0 and xs[i] == u[m - 1]:
            w[m - 1] += ws[i]
        else:
            u[m] = xs[i]
            w[m] = ws[i]
            m += 1
    return m


@njit(cache=True)
def optimal_real_weighted(u, w, m, k, cent, p0, p1, p2, dprev, dcur, arg):
    """Globally optimal weighted k-means of the first ``m`` sorted distinct values ``u``
    (float64) with positive real weights ``w`` (float64), m > k ≥ 1. Work arrays: p0, p1, p2,
    dprev, dcur float64 (≥ m + 1), arg int32 [≥ k + 1, ≥ m + 1]. Writes the k centroids
    (weighted means of their clusters, ascending) into ``cent`` and returns the weighted SSE
    Σ w (u − c)². Same DP, windows and tie rule (lowest j) as ``kmeans1d._optimal_ws``."""
    tot = 0.0
    cnt = 0.0
    for i in range(m):
        tot += w[i] * u[i]
        cnt += w[i]
    mu = tot / cnt
    p0[0] = 0.0
    p1[0] = 0.0
    p2[0] = 0.0
    for i in range(m):
        d = u[i] - mu
        p0[i + 1] = p0[i] + w[i]
        p1[i + 1] = p1[i] + w[i] * d
        p2[i + 1] = p2[i] + w[i] * d * d

    width = m - k + 1
    for i in range(1, width + 1):
        s1 = p1[i]
        dprev[i] = p2[i] - s1 * s1 * (1.0 / p0[i])
    for q in range(2, k + 1):
        ihi = q + width - 1
        ilo = m if q == k else q
        for i in range(ihi, ilo - 1, -1):
            jlo = q - 1
            if q > 2:
                jlo = max(jlo, arg[q - 1, min(i, ihi - 1)])
            jhi = i - 1
            if i < ihi:
                jhi = min(jhi, arg[q, i + 1])
            s0 = p0[i]
            s1 = p1[i]
            s2 = p2[i]
            best = np.inf
            bj = jlo
            for jj in range(jlo, jhi + 1):
                j = np.uint64(jj)
                a = s1 - p1[j]
                v = dprev[j] + (s2 - p2[j]) - a * a * (1.0 / (s0 - p0[j]))
                lt = v < best
                bj = jj if lt else bj
                best = v if lt else best
            dcur[i] = best
            arg[q, i] = bj
        for i in range(ilo, ihi + 1):
            dprev[i] = dcur[i]
    i = m
    sse = 0.0
    for q in range(k, 0, -1):
        j = arg[q, i] if q > 1 else 0
        c = p0[i] - p0[j]
        a = p1[i] - p1[j]
        cent[q - 1] = a * (1.0 / c) + mu
        for t in range(j, i):
            d = u[t] - cent[q - 1]
            sse += w[t] * d * d
        i = j
    return sse


def block_centroids_weighted(x, a, k):
    """Optimal weighted centroids of one sub-block: ``x`` values (float [n], any order), ``a``
    their importances (float [n], > 0). Returns (centroids float64 [k] ascending, weighted
    SSE). Blocks with ≤ k distinct values get exactly those values (SSE 0)."""
    x = np.asarray(x, np.float64).ravel()
    a = np.asarray(a, np.float64).ravel()
    if x.shape != a.shape or not (a > 0).all():
        raise ValueError("x and a must have the same length and a must be positive")
    order = np.argsort(x, kind="stable")
    n = x.size
    u, w = np.empty(n), np.empty(n)
    m = _distinct_weighted(x[order], a[order], u, w)
    cent = np.empty(k)
    if m <= k:
        cent[:m] = u[:m]
        cent[m:] = u[m - 1]
        return cent, 0.0
    p0, p1, p2, dprev, dcur = (np.empty(m + 1) for _ in range(5))
    arg = np.empty((k + 1, m + 1), np.int32)
    sse = optimal_real_weighted(u, w, m, k, cent, p0, p1, p2, dprev, dcur, arg)
    return cent, sse


def matrix_centroids_weighted(W, importance, group_size, k, method, seed, restarts, max_iter,
                              tol, cent):
    """Weighted centroids of every sub-block of ``W`` (float32 [rows, cols], unsorted) with
    per-column importances ``importance`` (float64 [cols], > 0) into ``cent`` (float64
    [rows, S, k]); parallel over sub-blocks, independent of the thread count. ``method`` 0
    (optimal: ``optimal_real_weighted``) or 1 (Lloyd with the same weights). Returns the
    weighted SSE per sub-block, float64 [rows, S]."""
    rows, cols = W.shape
    full = cols // group_size * group_size
    order = np.empty((rows, cols), np.int64)  # per sub-block, the sorting permutation
    if full:
        o = np.argsort(W[:, :full].reshape(rows, full // group_size, group_size), axis=-1,
                       kind="stable")
        order[:, :full] = (o + (np.arange(full // group_size) * group_size)[None, :, None]
                           ).reshape(rows, full)
    if full < cols:
        order[:, full:] = np.argsort(W[:, full:], axis=-1, kind="stable") + full
    # the values in np.sort's order, as the unweighted kernel reads them (equal values such as
    # -0.0 and 0.0 are merged into one distinct value, which keeps the first one's sign)
    Ws = sort_sub_blocks(W, group_size)
    with numba.parallel_chunksize(1):
        return _matrix_centroids_weighted(Ws, order, np.ascontiguousarray(importance, np.float64),
                                          group_size, k, method, seed, restarts, max_iter, tol,
                                          cent)


@njit(cache=True, parallel=True)
def _matrix_centroids_weighted(Ws, order, imp, group_size, k, method, seed, restarts, max_iter,
                               tol, cent):
    rows, cols = Ws.shape
    S = (cols + group_size - 1) // group_size
    sse = np.empty((rows, S), np.float64)
    nb = rows * S
    n_units = (nb + CHUNK_BLOCKS - 1) // CHUNK_BLOCKS
    g = min(group_size, cols)
    for unit in prange(n_units):
        xs = np.empty(g, np.float64)
        ws = np.empty(g, np.float64)
        u = np.empty(g, np.float64)
        w = np.empty(g, np.float64)
        p0 = np.empty(g + 1, np.float64)
        p1 = np.empty(g + 1, np.float64)
        p2 = np.empty(g + 1, np.float64)
        dprev = np.empty(g + 1, np.float64)
        dcur = np.empty(g + 1, np.float64)
        arg = np.empty((k + 1, g + 1), np.int32)
        for t in range(unit * CHUNK_BLOCKS, min(nb, unit * CHUNK_BLOCKS + CHUNK_BLOCKS)):
            r = t // S
            s = t - r * S
            a = s * group_size
            b = min(a + group_size, cols)
            n = b - a
            for i in range(n):
                xs[i] = Ws[r, a + i]
                ws[i] = imp[order[r, a + i]]
            cb = cent[r, s]
            m = _distinct_weighted(xs[:n], ws[:n], u, w)
            if m <= k:
                for c in range(m):
                    cb[c] = u[c]
                for c in range(m, k):
                    cb[c] = u[m - 1]
                sse[r, s] = 0.0
            elif method == METHOD_OPTIMAL:
                sse[r, s] = optimal_real_weighted(u, w, m, k, cb, p0, p1, p2, dprev, dcur, arg)
            else:
                bseed = np.uint64(seed) ^ (np.uint64(t) * np.uint64(0xD1B54A32D192ED03))
                sse[r, s] = lloyd_weighted(u[:m], w[:m], k, bseed, restarts, max_iter, tol, cb,
                                           np.empty(0, np.float64))
    return sse
