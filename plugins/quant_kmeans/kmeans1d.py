"""One-dimensional k-means on sub-blocks of a weight matrix (numba kernels).

Every sub-block (G consecutive weights of one row, the row's tail possibly shorter) is clustered
independently into K = 2^b centroids, so the work is a parallel loop (``numba.prange``) over
sub-blocks whose iterations share nothing: the result does not depend on the thread count.
Sub-blocks arrive sorted (``sort_sub_blocks``, NumPy's SIMD sort).

Two methods:

* ``optimal`` (method 0): the globally optimal 1-D k-means partition by dynamic programming over
  the sorted block (Wang & Song 2011, "Ckmeans.1d.dp", R Journal 3(2)). The layer recurrence
  ``D[q][i] = min_j D[q-1][j] + SSE(j, i)`` has arg-minima monotone in both indices because the
  1-D SSE cost satisfies the quadrangle inequality (Grønlund et al. 2017, "Fast exact k-means,
  k-medians and Bregman divergence clustering in 1D", §2), so each cell scans only the window
  ``[J[q-1][i], J[q][i+1]]`` (Knuth's speed-up, Yao 1980). The block is first reduced to its
  distinct values with multiplicities (n ≤ G); SSE(j, i) comes from prefix sums in O(1) with a
  reciprocal table.
* ``lloyd`` (method 1): Lloyd's iteration (Lloyd 1982) from a seeded k-means++ initialisation
  (Arthur & Vassilvitskii 2007), several restarts, best kept; iterates until the relative
  decrease of the SSE is ≤ ``tol`` or ``max_iter`` is reached. Each iteration never increases
  the SSE.

Blocks with at most K distinct values get those values as centroids (zero error before the
codebook is rounded to its storage precision).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
from numba import njit, prange

from . import native

METHOD_OPTIMAL = 0
METHOD_LLOYD = 1


@njit(cache=True)
def _distinct(xs, u, w):
    """Distinct values of sorted float64 ``xs`` into ``u`` and their counts into ``w`` (int64);
    returns how many."""
    m = 0
    n = xs.shape[0]
    for i in range(n):
        if m > 0 and xs[i] == u[m - 1]:
            w[m - 1] += 1
        else:
            u[m] = xs[i]
            w[m] = 1
            m += 1
    return m


@njit(cache=True)
def optimal_weighted(u, w, k, inv, cent):
    """Globally optimal k-means of distinct sorted values ``u`` (float64 [m]) with integer
    multiplicities ``w`` (int64 [m]), m > k ≥ 1; ``inv[c] = 1/c`` (float64, len > sum(w)).

    Writes the k centroids, ascending, into ``cent`` (float64 [k]) and returns the SSE (sum of
    squared errors, each value counted with its multiplicity). Allocates the work arrays of
    ``_optimal_ws`` (which has the method) for this one block."""
    m = u.shape[0]
    p0, p1, p2, dprev, dcur, arg = _work_arrays(m, k)
    return _optimal_ws(u, w, m, k, inv, cent, p0, p1, p2, dprev, dcur, arg)


@njit(cache=True)
def _work_arrays(n, k):
    """Work arrays of ``_optimal_ws`` for blocks of up to ``n`` distinct values and k
    clusters: p0 (int64), p1, p2, dprev, dcur (float64), each n + 1 long, and arg (int32
    [k + 1, n + 1])."""
    return (np.empty(n + 1, np.int64), np.empty(n + 1, np.float64),
            np.empty(n + 1, np.float64), np.empty(n + 1, np.float64),
            np.empty(n + 1, np.float64), np.empty((k + 1, n + 1), np.int32))


@njit(cache=True)
def _optimal_ws(u, w, m, k, inv, cent, p0, p1, p2, dprev, dcur, arg):
    """``optimal_weighted`` on the first ``m`` entries of ``u``/``w``, in caller-provided work
    arrays (p0 int64, p1/p2/dprev/dcur float64, each ≥ m + 1 long; arg int32
    [≥ k + 1, ≥ m + 1])
    so a thread reuses them over many sub-blocks.

    Dynamic programming ``D[q][i] = min_j D[q-1][j] + SSE(u[j:i])`` (Wang & Song 2011). The
    arg-minima ``J[q][i]`` are monotone in both indices because the 1-D SSE cost satisfies the
    quadrangle inequality (Grønlund et al. 2017, §2): ``J[q-1][i] ≤ J[q][i] ≤ J[q][i+1]``, so
    each layer is filled for i descending scanning only that window (Knuth's speed-up, Yao
    1980); within a window the first (lowest) j of the smallest value wins.

    This is the reference implementation of the ``optimal`` method: ``matrix_centroids`` runs
    the C kernel ``optimal_dp.c`` when it can, which reproduces these bytes
    (tests/test_quant_dp_kernel.py; docs/QUANT.md, "Speed"). The scan is written for the
    machine: array indices are unsigned (numba then emits no negative-index
    wrap-around test per load) and the running minimum is branch-free (min + conditional move;
    the comparison is unpredictable). The arithmetic, its order and the tie rule are exactly
    those of the plain loop, so the result is bit-identical (tests/test_quant_pinned.py)."""
    # prefix sums of the centred data (centring keeps the SSE differences accurate)
    tot = 0.0
    cnt = 0
    for i in range(m):
        tot += w[i] * u[i]
        cnt += w[i]
    mu = tot / cnt
    p0[0] = 0
    p1[0] = 0.0
    p2[0] = 0.0
    for i in range(m):
        d = u[i] - mu
        p0[i + 1] = p0[i] + w[i]
        p1[i + 1] = p1[i] + w[i] * d
        p2[i + 1] = p2[i] + w[i] * d * d

    width = m - k + 1  # layer q < k is needed for i in [q, q + width - 1]; layer k at i = m
    for i in range(1, width + 1):
        s1 = p1[i]
        dprev[i] = p2[i] - s1 * s1 * inv[p0[i]]
    for q in range(2, k + 1):
        ihi = q + width - 1  # = m when q == k
        ilo = m if q == k else q
        for i in range(ihi, ilo - 1, -1):
            # lower bound J[q-1][i] (layer q-1 stops at ihi-1; J is monotone in i)
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
                v = dprev[j] + (s2 - p2[j]) - a * a * inv[np.uint64(s0 - p0[j])]
                lt = v < best
                bj = jj if lt else bj
                best = v if lt else best
            dcur[i] = best
            arg[q, i] = bj
        for i in range(ilo, ihi + 1):
            dprev[i] = dcur[i]
    # backtrack the cluster boundaries; the SSE is then summed directly (no cancellation)
    i = m
    sse = 0.0
    for q in range(k, 0, -1):
        j = arg[q, i] if q > 1 else 0
        c = p0[i] - p0[j]
        a = p1[i] - p1[j]
        cent[q - 1] = a * inv[c] + mu
        for t in range(j, i):
            d = u[t] - cent[q - 1]
            sse += w[t] * d * d
        i = j
    return sse


@njit(cache=True)
def _splitmix64(state):
    """One step of SplitMix64 (Steele et al. 2014); returns (new_state, output)."""
    state = (state + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(0xFFFFFFFFFFFFFFFF)
    z = state
    z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & np.uint64(0xFFFFFFFFFFFFFFFF)
    z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & np.uint64(0xFFFFFFFFFFFFFFFF)
    z = z ^ (z >> np.uint64(31))
    return state, z


@njit(cache=True)
def _uniform(state):
    """A float64 uniform in [0, 1) from SplitMix64; returns (new_state, value)."""
    state, z = _splitmix64(state)
    return state, (z >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@njit(cache=True)
def _lloyd_run(u, w, k, c, max_iter, tol, trace):
    """Lloyd iterations from sorted initial centroids ``c`` (float64 [k], modified in place) on
    sorted distinct ``u`` with multiplicities ``w``. Records the SSE of every iteration in
    ``trace`` (if it has room) and returns (sse, iterations)."""
    m = u.shape[0]
    sums = np.empty(k, np.float64)
    cnts = np.empty(k, np.float64)
    prev = np.inf
    sse = np.inf
    it = 0
    while it < max_iter:
        # assignment: u and c sorted, so a pointer walk over the midpoints
        for t in range(k):
            sums[t] = 0.0
            cnts[t] = 0.0
        sse = 0.0
        t = 0
        for i in range(m):
            x = u[i]
            while t < k - 1 and x > 0.5 * (c[t] + c[t + 1]):
                t += 1
            d = x - c[t]
            sse += w[i] * d * d
            sums[t] += w[i] * x
            cnts[t] += w[i]
        if it < trace.shape[0]:
            trace[it] = sse
        it += 1
        # update: means (an empty cluster keeps its centroid)
        for t in range(k):
            if cnts[t] > 0:
                c[t] = sums[t] / cnts[t]
        # means of consecutive runs of sorted data stay sorted, except around an empty cluster
        for a in range(1, k):
            v = c[a]
            b = a - 1
            while b >= 0 and c[b] > v:
                c[b + 1] = c[b]
                b -= 1
            c[b + 1] = v
        if prev - sse <= tol * prev:
            break
        prev = sse
    # final SSE of the updated centroids with the nearest assignment
    fin = 0.0
    t = 0
    for i in range(m):
        x = u[i]
        while t < k - 1 and x > 0.5 * (c[t] + c[t + 1]):
            t += 1
        d = x - c[t]
        fin += w[i] * d * d
    if it < trace.shape[0]:
        trace[it] = fin
    return fin, it


@njit(cache=True)
def lloyd_weighted(u, w, k, seed, restarts, max_iter, tol, cent, trace):
    """Best of ``restarts`` Lloyd runs, each from a k-means++ seeding drawn with SplitMix64
    seeded by ``seed`` (uint64) — deterministic. ``u`` sorted distinct float64 [m], ``w`` int64
    multiplicities, m > k. Writes sorted centroids into ``cent`` (float64 [k]) and returns the
    SSE. ``trace`` (float64 [T]) receives the SSE per iteration of the first restart."""
    m = u.shape[0]
    d2 = np.empty(m, np.float64)
    c = np.empty(k, np.float64)
    best = np.inf
    state = np.uint64(seed)
    empty_trace = np.empty(0, np.float64)
    for r in range(restarts):
        # k-means++: first centre by multiplicity, then proportional to w·D²
        tw = 0.0
        for i in range(m):
            tw += w[i]
        state, x = _uniform(state)
        target = x * tw
        acc = 0.0
        pick = m - 1
        for i in range(m):
            acc += w[i]
            if acc > target:
                pick = i
                break
        c[0] = u[pick]
        for i in range(m):
            d = u[i] - c[0]
            d2[i] = d * d
        for t in range(1, k):
            tot = 0.0
            for i in range(m):
                tot += w[i] * d2[i]
            state, x = _uniform(state)
            target = x * tot
            acc = 0.0
            pick = -1
            for i in range(m):
                acc += w[i] * d2[i]
                if acc > target and d2[i] > 0:
                    pick = i
                    break
            if pick < 0:  # rounding at the end of the cumulative sum: take the farthest point
                pick = 0
                for i in range(m):
                    if d2[i] > d2[pick]:
                        pick = i
            c[t] = u[pick]
            for i in range(m):
                d = u[i] - c[t]
                if d * d < d2[i]:
                    d2[i] = d * d
        c.sort()
        sse, _ = _lloyd_run(u, w, k, c, max_iter, tol, trace if r == 0 else empty_trace)
        if sse < best:
            best = sse
            for t in range(k):
                cent[t] = c[t]
    return best


@njit(cache=True)
def sorted_block_centroids(xs, k, method, seed, restarts, max_iter, tol, inv, cent):
    """Centroids (float64, ascending, written to ``cent`` [k]) of one sub-block given as its
    values sorted ascending (``xs``, float32 or float64 [n]) by ``method`` (0 optimal, 1
    lloyd). Blocks with ≤ k distinct values get exactly those values (the last one repeated to
    fill the codebook). Returns the SSE of the unrounded centroids."""
    n = xs.shape[0]
    u = np.empty(n, np.float64)
    w = np.empty(n, np.int64)
    m = _distinct(xs, u, w)
    if m <= k:
        for t in range(m):
            cent[t] = u[t]
        for t in range(m, k):
            cent[t] = u[m - 1]
        return 0.0
    uu = u[:m]
    ww = w[:m]
    if method == METHOD_OPTIMAL:
        return optimal_weighted(uu, ww, k, inv, cent)
    return lloyd_weighted(uu, ww, k, seed, restarts, max_iter, tol, cent, np.empty(0, np.float64))


def block_centroids(x, k, method=METHOD_OPTIMAL, seed=0, restarts=4, max_iter=100, tol=1e-6):
    """Convenience wrapper for one sub-block ``x`` (any order, float [n]): returns
    (centroids float64 [k] ascending, SSE) by ``method`` (0 optimal, 1 lloyd)."""
    xs = np.sort(np.asarray(x, dtype=np.float64).ravel())
    inv = np.zeros(xs.size + 1)
    inv[1:] = 1.0 / np.arange(1, xs.size + 1)
    cent = np.empty(k, np.float64)
    sse = sorted_block_centroids(xs, k, method, np.uint64(seed), restarts, max_iter, tol, inv,
                                 cent)
    return cent, sse


def sort_sub_blocks(W: np.ndarray, group_size: int, threads: int | None = None) -> np.ndarray:
    """Copy of ``W`` (float32 [rows, cols]) with every sub-block of ``group_size`` consecutive
    weights of a row (the tail one shorter) sorted ascending (NumPy's SIMD sort, which releases
    the GIL: bands of rows are sorted on ``threads`` threads, default
    ``numba.get_num_threads()``; the result does not depend on the count)."""
    rows, cols = W.shape
    out = np.empty_like(W)
    threads = max(1, min(rows, numba.get_num_threads() if threads is None else int(threads)))

    def band(r0, r1):
        full = cols // group_size * group_size
        if full == cols:  # whole sub-blocks: the band copied once, then sorted where it lies
            rows_out = out[r0:r1]
            rows_out[...] = W[r0:r1]
            rows_out.reshape(r1 - r0, cols // group_size, group_size).sort(axis=-1)
            return
        if full:
            out[r0:r1, :full] = np.sort(
                W[r0:r1, :full].reshape(r1 - r0, full // group_size, group_size),
                axis=-1).reshape(r1 - r0, full)
        if full < cols:
            out[r0:r1, full:] = np.sort(W[r0:r1, full:], axis=-1)

    if threads == 1 or W.size < (1 << 20):
        band(0, rows)
        return out
    edges = np.linspace(0, rows, threads + 1).astype(int)
    with ThreadPoolExecutor(threads) as pool:
        for f in [pool.submit(band, a, b) for a, b in zip(edges[:-1], edges[1:])]:
            f.result()
    return out


#: sub-blocks per unit of parallel work: each unit allocates its work arrays once, and the
#: threads take units dynamically (a machine shared with other jobs slows threads unevenly)
CHUNK_BLOCKS = 16


def matrix_centroids(W, group_size, k, method, seed, restarts, max_iter, tol, cent):
    """Centroids of every sub-block of ``W`` (float32 [rows, cols], each sub-block already
    sorted ascending: ``sort_sub_blocks``) into ``cent`` (float64
    [rows, S, k], S = ceil(cols / G)); parallel over sub-blocks (``numba.get_num_threads()``
    threads). Returns the unrounded SSE per sub-block, float64 [rows, S]. The ``optimal``
    method runs the C kernel (``native.py``, ``optimal_dp.c``) when it is available and the
    numba kernel ``_optimal_ws`` otherwise; both give the same bytes. The Lloyd seed of
    sub-block (r, s) is derived from ``seed`` and (r, s) only, so the output does not depend
    on the thread count or on which thread takes which sub-blocks."""
    if method == METHOD_OPTIMAL:
        fn = native.load()
        if (fn is not None and W.dtype == np.float32 and W.flags.c_contiguous
                and cent.dtype == np.float64 and cent.flags.c_contiguous):
            return native.optimal_matrix(fn, W, group_size, k, cent, numba.get_num_threads())
    with numba.parallel_chunksize(1):
        return _matrix_centroids(W, group_size, k, method, seed, restarts, max_iter, tol, cent)


@njit(cache=True, parallel=True)
def _matrix_centroids(W, group_size, k, method, seed, restarts, max_iter, tol, cent):
    """``matrix_centroids``: a parallel loop over units of ``CHUNK_BLOCKS`` sub-blocks, each
    with its own work arrays."""
    rows, cols = W.shape
    S = (cols + group_size - 1) // group_size
    inv = np.empty(group_size + 1, np.float64)
    inv[0] = 0.0
    for c in range(1, group_size + 1):
        inv[c] = 1.0 / c
    sse = np.empty((rows, S), np.float64)
    nb = rows * S
    n_units = (nb + CHUNK_BLOCKS - 1) // CHUNK_BLOCKS
    g = min(group_size, cols)
    for unit in prange(n_units):
        u = np.empty(g, np.float64)
        w = np.empty(g, np.int64)
        p0, p1, p2, dprev, dcur, arg = _work_arrays(g, k)
        for t in range(unit * CHUNK_BLOCKS, min(nb, unit * CHUNK_BLOCKS + CHUNK_BLOCKS)):
            r = t // S
            s = t - r * S
            a = s * group_size
            b = min(a + group_size, cols)
            cb = cent[r, s]
            m = _distinct(W[r, a:b], u, w)
            if m <= k:  # at most k distinct values: exactly those
                for c in range(m):
                    cb[c] = u[c]
                for c in range(m, k):
                    cb[c] = u[m - 1]
                sse[r, s] = 0.0
            elif method == METHOD_OPTIMAL:
                sse[r, s] = _optimal_ws(u, w, m, k, inv, cb, p0, p1, p2, dprev, dcur, arg)
            else:
                bseed = np.uint64(seed) ^ (np.uint64(t) * np.uint64(0xD1B54A32D192ED03))
                sse[r, s] = lloyd_weighted(u[:m], w[:m], k, bseed, restarts, max_iter, tol, cb,
                                           np.empty(0, np.float64))
    return sse


def assign_matrix(W, group_size, codebooks, indices):
    """``assign_nearest`` (same arguments, same bytes) by the C kernel ``assign_nearest.c``
    (``native.py``) when it is available and the arrays are float32/uint8 in C order, else by
    the numba reference; parallel over rows (``numba.get_num_threads()`` threads)."""
    fn = native.load_assign()
    if (fn is not None and W.dtype == np.float32 and W.flags.c_contiguous
            and codebooks.dtype == np.float32 and codebooks.flags.c_contiguous
            and indices.dtype == np.uint8 and indices.flags.c_contiguous):
        return native.assign_nearest(fn, W, group_size, codebooks, indices,
                                     numba.get_num_threads())
    return assign_nearest(W, group_size, codebooks, indices)


@njit(cache=True, parallel=True)
def assign_nearest(W, group_size, codebooks, indices):
    """Index of the nearest centroid (float32 codebooks [rows, S, k], each ascending) for every
    weight of ``W`` (float32 [rows, cols]) into ``indices`` (uint8 [rows, cols]); a weight exactly
    between two centroids takes the lower index. Returns (SSE per row, ‖row‖² per row), both
    float64 [rows]. The reference of the C kernel ``assign_nearest.c`` (``assign_matrix``)."""
    rows, cols = W.shape
    k = codebooks.shape[2]
    S = codebooks.shape[1]
    sse = np.zeros(rows, np.float64)
    norm2 = np.zeros(rows, np.float64)
    for r in prange(rows):
        acc = 0.0
        nrm = 0.0
        mids = np.empty(max(k - 1, 1), np.float64)
        for s in range(S):
            a = s * group_size
            b = min(a + group_size, cols)
            cb = codebooks[r, s]
            for t in range(k - 1):
                mids[t] = 0.5 * (np.float64(cb[t]) + np.float64(cb[t + 1]))
            for c in range(a, b):
                x = np.float64(W[r, c])
                # binary search: number of midpoints strictly below x
                lo = 0
                hi = k - 1
                while lo < hi:
                    h = (lo + hi) >> 1
                    if mids[h] < x:
                        lo = h + 1
                    else:
                        hi = h
                indices[r, c] = lo
                d = x - np.float64(cb[lo])
                acc += d * d
                nrm += x * x
        sse[r] = acc
        norm2[r] = nrm
    return sse, norm2
