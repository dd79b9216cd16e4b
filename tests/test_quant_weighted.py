"""Importance-weighted k-means (plugins/quant_kmeans/kmeans1d_weighted.py): the DP against a
brute-force weighted optimum, unit importances against the unweighted quantizer byte for byte,
and the importance checks of the kit."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ditto_core.base.errors import DittoError
from ditto_core.kit.quantkit import IMPORTANCE_FLOOR, importance_weights
from ditto_quant_kmeans import kmeans1d_weighted as kw
from ditto_quant_kmeans import quantize_matrix


def brute_force(x, a, k):
    """Minimum of Σ a (x − mean of its cluster)² over every partition of the sorted distinct
    values into k contiguous clusters (the optimum of 1-D k-means is contiguous), and the
    centroids of the first minimiser."""
    order = np.argsort(x)
    x, a = np.asarray(x, float)[order], np.asarray(a, float)[order]
    u, inv = np.unique(x, return_inverse=True)
    w = np.bincount(inv, weights=a)
    best, cent = np.inf, None
    for cuts in itertools.combinations(range(1, len(u)), k - 1):
        bounds = (0, *cuts, len(u))
        cs, sse = [], 0.0
        for lo, hi in zip(bounds, bounds[1:]):
            c = (w[lo:hi] * u[lo:hi]).sum() / w[lo:hi].sum()
            cs.append(c)
            sse += (w[lo:hi] * (u[lo:hi] - c) ** 2).sum()
        if cent is None or sse < best:
            best, cent = sse, np.array(cs)
    return best, cent


def test_hand_example():
    """Values 0, 1, 10 with importances 1, 100, 1 and k = 2: {0, 1} {10} costs
    1·100/101 ≈ 0.990, {0} {1, 10} costs 100·1·81/101 ≈ 80.2 → the first, centroids 100/101
    and 10."""
    cent, sse = kw.block_centroids_weighted([10.0, 0.0, 1.0], [1.0, 1.0, 100.0], 2)
    assert sse == pytest.approx(100 / 101)
    np.testing.assert_allclose(cent, [100 / 101, 10.0])
    # the importance moves the optimum: with 1, 1, 1 it is {0, 1} {10} too but centred at 0.5,
    # and with 100 on the 10 and 1 elsewhere nothing changes the partition, only its SSE
    cent, sse = kw.block_centroids_weighted([10.0, 0.0, 1.0], [1.0, 1.0, 1.0], 2)
    np.testing.assert_allclose(cent, [0.5, 10.0])
    assert sse == pytest.approx(0.5)


def test_importance_changes_the_partition():
    """0, 1, 2, 3 at k = 2: unweighted the optimum is {0,1} {2,3} (SSE 1); with importances
    1, 1, 1000, 1000 it is {0,1,2} {3}: Σa = 1002, Σax = 2001, Σax² = 4001, so the centroid is
    2001/1002 and the SSE 4001 − 2001²/1002 ≈ 4.99 (against 500.5 for {0,1} {2,3})."""
    cent, sse = kw.block_centroids_weighted([0, 1, 2, 3], [1, 1, 1, 1], 2)
    np.testing.assert_allclose(cent, [0.5, 2.5])
    assert sse == pytest.approx(1.0)
    cent, sse = kw.block_centroids_weighted([0, 1, 2, 3], [1, 1, 1000, 1000], 2)
    np.testing.assert_allclose(cent, [2001 / 1002, 3.0])
    assert sse == pytest.approx(4001 - 2001**2 / 1002)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(3, 11), st.integers(1, 5), st.booleans())
def test_dp_equals_brute_force(seed, n, k, repeats):
    """On random small blocks (with repeated values when ``repeats``) the DP's weighted SSE is
    the brute-force optimum and its centroids give that SSE."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n)
    if repeats:
        x = np.round(x * 2) / 2
    a = rng.lognormal(0.0, 2.0, n)
    if len(np.unique(x)) <= k:
        return
    want, _ = brute_force(x, a, k)
    cent, sse = kw.block_centroids_weighted(x, a, k)
    assert sse == pytest.approx(want, rel=1e-9, abs=1e-12)
    assign = np.abs(x[:, None] - cent[None, :]).argmin(axis=1)
    assert (a * (x - cent[assign]) ** 2).sum() == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert (np.diff(cent) >= 0).all()


def test_unit_importance_is_the_unweighted_result_byte_for_byte():
    """importance = 1 everywhere (and any constant: it is divided by its mean) reproduces the
    unweighted quantizer's codebooks and indices exactly, for every codebook type, including
    few-valued and tail sub-blocks."""
    rng = np.random.default_rng(3)
    W = (rng.standard_t(5, size=(24, 600)) * 0.05).astype(np.float32)
    W[3] = 0.25
    W[5] = np.round(W[5] * 40) / 40
    for cb in ("f16", "int8", "f32"):
        ref = quantize_matrix(W, 4, 256, codebook_type=cb, name="m")
        for imp in (np.ones(600), np.full(600, 7.5)):
            got = quantize_matrix(W, 4, 256, codebook_type=cb, name="m", importance=imp)
            assert got.codebooks.tobytes() == ref.codebooks.tobytes()
            assert got.indices.tobytes() == ref.indices.tobytes()
            assert got.rel_error == ref.rel_error


def test_weighted_codebooks_lower_the_weighted_error():
    """With skewed importances the weighted quantizer's Σ a (W − Ŵ)² is below the unweighted
    one's (it is the optimum per sub-block before rounding, so lower by a margin here)."""
    rng = np.random.default_rng(11)
    W = (rng.standard_normal((32, 512)) * 0.02).astype(np.float32)
    a = rng.lognormal(0.0, 1.5, 512)
    plain = quantize_matrix(W, 3, 128, codebook_type="f32", name="m")
    wq = quantize_matrix(W, 3, 128, codebook_type="f32", name="m", importance=a)

    def werr(q):
        sub = np.arange(512) // 128
        What = q.codebooks[np.arange(32)[:, None], sub[None, :], q.indices]
        return float(((W - What) ** 2 * a[None, :]).sum())

    assert werr(wq) < 0.9 * werr(plain)
    assert wq.rel_error > plain.rel_error  # the plain error is the unweighted optimum


def test_lloyd_with_importance_never_beats_the_optimum():
    rng = np.random.default_rng(2)
    W = (rng.standard_normal((8, 256)) * 0.02).astype(np.float32)
    a = rng.lognormal(0.0, 1.0, 256)
    opt = quantize_matrix(W, 3, 256, codebook_type="f32", name="m", importance=a)
    ll = quantize_matrix(W, 3, 256, method="lloyd", codebook_type="f32", name="m",
                         importance=a)
    def werr(q):
        What = q.codebooks[np.arange(8)[:, None], 0, q.indices]
        return float(((W - What) ** 2 * a[None, :]).sum())
    assert werr(opt) <= werr(ll) * (1 + 1e-9)


def test_importance_file_of_another_model_is_named(tmp_path):
    """A vector of the wrong length from an importance file (one made for another model)
    names the file as well as the tensor."""
    from types import SimpleNamespace

    from ditto_core.kit import importance as imp_mod
    p = tmp_path / "other.npz"
    imp_mod.save_importance(imp_mod.Importance(
        {"blk.0.attn_q.weight": np.ones(64)}, {"format": imp_mod.FORMAT,
                                               "version": imp_mod.VERSION}), p)
    with pytest.raises(DittoError) as e:
        imp_mod.tensor_importance(SimpleNamespace(importance=str(p)), "blk.0.attn_q.weight", 16)
    assert str(e.value) == (f"{p}: tensor 'blk.0.attn_q.weight': importance has shape [64], "
                            "expected [16] (one value per input channel) (an importance file "
                            "is made for one model by `ditto calibrate`)")


def test_importance_weights_checks():
    np.testing.assert_array_equal(importance_weights(np.ones(4), 4), np.ones(4))
    np.testing.assert_allclose(importance_weights([0.0, 2.0, 2.0, 4.0], 4),
                               [IMPORTANCE_FLOOR, 1.0, 1.0, 2.0])
    with pytest.raises(DittoError, match=r"tensor 'blk.0.attn_q.weight': importance has shape "
                                         r"\[3\], expected \[4\]"):
        importance_weights(np.ones(3), 4, "blk.0.attn_q.weight")
    with pytest.raises(DittoError, match="finite and >= 0"):
        importance_weights([1.0, np.nan], 2, "t")
    with pytest.raises(DittoError, match="finite and >= 0"):
        importance_weights([1.0, -1.0], 2, "t")
    with pytest.raises(DittoError, match="all zero"):
        importance_weights([0.0, 0.0], 2, "t")
