"""The ``kmeans`` quantizer: optimality against a brute-force DP, optimal ≤ Lloyd, Lloyd never
increases the error, exact blocks, nearest-centroid assignment, errors, mixed precision and
thread-count independence."""

import hashlib
import os
import subprocess
import sys
import textwrap

import gguf
import numpy as np
import pytest
from gguf import quants
from hypothesis import given, settings
from hypothesis import strategies as st

from ditto_core.base.errors import DittoError
from ditto_core.base.types import Checkpoint, CodebookTensor, ModelConfig, TokenizerSpec
from ditto_core.kit.components import QuantOptions
from ditto_core.stages.plugins import build_registry
from ditto_quant_kmeans import KMeansQuantizer, kmeans1d, plan_tensors, quantize_matrix


def brute_force_sse(x, k):
    """Optimal 1-D k-means SSE by the plain O(k·n²) DP over the sorted values (Wang & Song
    2011, eq. 1), every cluster cost computed directly."""
    xs = np.sort(np.asarray(x, np.float64))
    n = len(xs)
    k = min(k, len(np.unique(xs)))

    def cost(j, i):
        s = xs[j:i]
        return float(((s - s.mean()) ** 2).sum())

    D = np.full((k + 1, n + 1), np.inf)
    D[0, 0] = 0.0
    for q in range(1, k + 1):
        for i in range(q, n + 1):
            D[q, i] = min(D[q - 1, j] + cost(j, i) for j in range(q - 1, i))
    return D[k, n]


def nearest_sse(x, cent):
    x = np.asarray(x, np.float64)
    return float(np.min((x[:, None] - np.asarray(cent)[None, :]) ** 2, axis=1).sum())


@pytest.fixture(scope="module")
def real_blocks(smollm2_gguf):
    """120 sub-blocks of 256 weights (and 40 tails of 64) from SmolLM2's blk.3.attn_q.weight,
    dequantized by the gguf package."""
    r = gguf.GGUFReader(smollm2_gguf)
    t = next(t for t in r.tensors if t.name == "blk.3.attn_q.weight")
    W = quants.dequantize(t.data, t.tensor_type)
    return [W[i, :256] for i in range(0, 120)] + [W[i, 512:] for i in range(40)]


values = st.lists(st.integers(-6, 6), min_size=2, max_size=22).map(
    lambda v: np.array(v, np.float64) * 0.37)


@settings(max_examples=150, deadline=None)
@given(x=values, k=st.integers(1, 6))
def test_optimal_equals_brute_force_dp(x, k):
    cent, sse = kmeans1d.block_centroids(x, k, kmeans1d.METHOD_OPTIMAL)
    want = brute_force_sse(x, k)
    assert sse == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert nearest_sse(x, cent) == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert np.all(np.diff(cent) >= 0)


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(3, 80), k=st.integers(2, 16))
def test_optimal_le_lloyd_random(seed, n, k):
    x = np.random.default_rng(seed).standard_normal(n)
    _, opt = kmeans1d.block_centroids(x, k, kmeans1d.METHOD_OPTIMAL)
    cent, lloyd = kmeans1d.block_centroids(x, k, kmeans1d.METHOD_LLOYD, seed=seed)
    tol = 1e-12 * np.sum((x - x.mean()) ** 2)  # rounding of the two SSE sums
    assert opt <= lloyd + tol
    assert nearest_sse(x, cent) <= lloyd + tol


def test_optimal_le_lloyd_real_blocks(real_blocks):
    ratios = []
    for i, x in enumerate(real_blocks):
        _, opt = kmeans1d.block_centroids(x, 16, kmeans1d.METHOD_OPTIMAL)
        _, lloyd = kmeans1d.block_centroids(x, 16, kmeans1d.METHOD_LLOYD, seed=i)
        assert opt <= lloyd + 1e-12 * np.sum((x - x.mean()) ** 2)
        ratios.append(lloyd / opt)
    assert np.mean(ratios) > 1.0  # Lloyd does not find the optimum everywhere


def test_optimal_matches_brute_force_on_a_real_block(real_blocks):
    x = real_blocks[7][:40]
    _, sse = kmeans1d.block_centroids(x, 4, kmeans1d.METHOD_OPTIMAL)
    assert sse == pytest.approx(brute_force_sse(x, 4), rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(20, 256), k=st.integers(2, 16))
def test_lloyd_never_increases_the_error(seed, n, k):
    x = np.sort(np.random.default_rng(seed).standard_normal(n) ** 3)
    u, w = np.unique(x, return_counts=True)
    if len(u) <= k:
        return
    trace = np.full(200, np.nan)
    cent = np.empty(k)
    best = kmeans1d.lloyd_weighted(u, w.astype(np.int64), k, np.uint64(seed), 1, 150, 0.0,
                                   cent, trace)
    t = trace[~np.isnan(trace)]
    assert len(t) >= 2
    assert np.all(np.diff(t) <= 1e-12 * t[0])
    assert best == pytest.approx(t[-1])


def test_real_block_lloyd_trace_non_increasing(real_blocks):
    for i, x in enumerate(real_blocks[:20]):
        u, w = np.unique(np.asarray(x, np.float64), return_counts=True)
        trace = np.full(120, np.nan)
        kmeans1d.lloyd_weighted(u, w.astype(np.int64), 16, np.uint64(i), 1, 100, 0.0,
                                np.empty(16), trace)
        t = trace[~np.isnan(trace)]
        assert np.all(np.diff(t) <= 1e-12 * t[0])


# ---- whole matrices ------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["optimal", "lloyd"])
def test_exact_blocks(method):
    rng = np.random.default_rng(0)
    W = np.zeros((4, 40), np.float32)            # row 0: all zero
    W[1] = 0.75                                    # constant, exact in f16
    W[2] = rng.choice([-1.5, 0.25, 2.0], 40)      # 3 distinct values < 2^b
    W[3, :32] = rng.choice(np.arange(16) / 8, 32)  # 16 distinct = 2^b in the first sub-block
    W[3, 32:] = -3.0                               # tail sub-block of 8, constant
    q = quantize_matrix(W, 4, 32, method, "f16", name="w")
    assert q.codebooks.shape == (4, 2, 16)
    rec = q.codebooks[np.arange(4)[:, None], np.arange(40)[None, :] // 32, q.indices]
    np.testing.assert_array_equal(rec, W)
    assert q.rel_error == 0.0
    # values that f16 cannot hold are exact with f32 codebooks
    V = rng.choice(np.float32([0.1, 0.2, 0.3]), (3, 50)).astype(np.float32)
    q32 = quantize_matrix(V, 2, 16, method, "f32", name="v")
    assert q32.rel_error == 0.0


@pytest.mark.parametrize("cbt", ["f16", "f32"])
def test_indices_are_nearest_stored_centroid(cbt):
    rng = np.random.default_rng(5)
    W = (rng.standard_normal((7, 576)) * 0.05).astype(np.float32)
    q = quantize_matrix(W, 3, 256, "optimal", cbt, name="w")
    assert q.codebooks.shape == (7, 3, 8) and q.indices.shape == (7, 576)
    stored = q.codebooks.astype(np.float16 if cbt == "f16" else np.float32)
    np.testing.assert_array_equal(stored.astype(np.float32), q.codebooks)
    sub = np.arange(576) // 256
    cb = q.codebooks.astype(np.float64)[:, sub, :]              # [rows, cols, K]
    d = (W.astype(np.float64)[:, :, None] - cb) ** 2
    chosen = np.take_along_axis(d, q.indices[:, :, None].astype(np.intp), 2)[:, :, 0]
    np.testing.assert_array_equal(chosen, d.min(axis=2))
    rec = np.take_along_axis(cb, q.indices[:, :, None].astype(np.intp), 2)[:, :, 0]
    rel = ((W - rec) ** 2).sum() / (W.astype(np.float64) ** 2).sum()
    assert q.rel_error == pytest.approx(rel, rel=1e-9)


def test_more_bits_less_error():
    W = np.random.default_rng(2).standard_normal((16, 300)).astype(np.float32)
    errs = [quantize_matrix(W, b, 100, "optimal", "f32").rel_error for b in range(1, 9)]
    assert all(a > b for a, b in zip(errs[:6], errs[1:6]))
    assert errs[6] == errs[7] == 0.0  # 2^b >= G: every weight is its own centroid
    assert errs[0] == pytest.approx(1 - 2 / np.pi, rel=0.15)  # 1-bit optimum of a Gaussian


@pytest.mark.parametrize("kw,match", [
    (dict(bits=0), "1..8"), (dict(bits=9), "1..8"), (dict(group_size=1), "in 2..16777216"),
    (dict(codebook_type="bf16"), "codebook type"), (dict(method="median"), "unknown method")])
def test_bad_options(kw, match):
    W = np.ones((2, 8), np.float32)
    with pytest.raises(DittoError, match=match):
        quantize_matrix(W, **kw)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_names_tensor_and_position(bad):
    W = np.ones((5, 20), np.float32)
    W[3, 7] = bad
    with pytest.raises(DittoError, match=r"blk\.2\.ffn_up\.weight.*\(3, 7\)"):
        quantize_matrix(W, name="blk.2.ffn_up.weight")


def test_f16_overflow_is_an_error_f32_is_not():
    W = np.full((1, 16), 1e6, np.float32)
    with pytest.raises(DittoError, match="f16"):
        quantize_matrix(W, 2, 8, codebook_type="f16", name="w")
    assert quantize_matrix(W, 2, 8, codebook_type="f32").rel_error == 0.0


def test_f16_underflow_warns_with_the_tensor_and_f32_keeps_it(capsys):
    """Centroids of ~1e-9 round to 0 in f16 (below 2^-25): never a silent 100 % error."""
    rng = np.random.default_rng(3)
    W = rng.standard_normal((3, 16)).astype(np.float32)
    W[1] *= 1e-9
    q = quantize_matrix(W, 2, 8, codebook_type="f16", name="blk.0.attn_k.weight")
    err = capsys.readouterr().err
    assert "warning: tensor 'blk.0.attn_k.weight': 2 sub-block(s) (first: row 1, sub-block 0)" \
        in err and "--codebook-type f32" in err
    assert np.all(q.codebooks[1] == 0.0)  # what f16 stores for them
    q32 = quantize_matrix(W, 2, 8, codebook_type="f32", name="blk.0.attn_k.weight")
    assert capsys.readouterr().err == ""
    rec = q32.codebooks[1][np.arange(16) // 8, q32.indices[1]]
    assert ((W[1] - rec) ** 2).sum() / (W[1].astype(np.float64) ** 2).sum() < 0.2


@pytest.mark.parametrize("codebook_type", ["f16", "int8"])
def test_a_centroid_near_zero_beside_normal_ones_is_not_an_underflow(codebook_type, capsys):
    """Heavy-tailed weights put some centroid near 0 (|c| ~ 1e-6, stored with an f16 subnormal's
    few bits); its error is negligible against the sub-block's scale, so nothing is reported."""
    rng = np.random.default_rng(0)
    W = (rng.standard_t(3, (256, 1024)) * 0.02).astype(np.float32)
    q = quantize_matrix(W, 4, 256, codebook_type=codebook_type, name="w")
    assert capsys.readouterr().err == ""
    assert q.rel_error < 0.01


def test_quantizer_report_names_the_underflowing_tensor(capsys):
    ck, data = _checkpoint(np.random.default_rng(0))
    data["blk.0.attn_q.weight"][5] *= 1e-9
    qm = KMeansQuantizer().quantize(ck, QuantOptions(bits=2, group_size=8))
    dict(qm.tensors())
    rep = qm.report["tensors"]
    under = rep["blk.0.attn_q.weight"]["codebook_underflow"]
    assert under["sub_blocks"] == 2 and under["first"] == (5, 0)
    assert under["codebook_type"] == "f16" and "below f16 precision" in under["reason"]
    assert 1e-10 < under["smallest_centroid"] < 1e-8
    assert all("codebook_underflow" not in r for n, r in rep.items() if n != "blk.0.attn_q.weight")
    assert "blk.0.attn_q.weight" in capsys.readouterr().err


# ---- the quantizer component ---------------------------------------------------------------

def _checkpoint(rng, poison=None):
    cfg = ModelConfig(dim=16, hidden_dim=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8,
                      vocab_size=40, max_seq_len=16, rope_theta=1e4, norm_eps=1e-5,
                      tied_embeddings=True)
    tok = TokenizerSpec(kind="bpe_bytes", tokens=tuple(bytes([65 + i]) for i in range(40)),
                        scores=np.zeros(40, np.float32), token_types=np.ones(40, np.uint32))
    from ditto_core.model.modelfile import expected_shapes
    shapes = expected_shapes(cfg)
    data = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    if poison:
        data[poison][1, 2] = np.nan
    return Checkpoint(config=cfg, tokenizer=tok, tensors={n: (lambda v=v: v.copy())
                                                          for n, v in data.items()},
                      shapes=shapes, source=__file__), data


def test_plan_mixed_precision():
    shapes = {"token_embd.weight": (100, 64), "blk.0.attn_norm.weight": (64,),
              "blk.0.attn_q.weight": (64, 64), "blk.0.ffn_up.weight": (8, 64),
              "blk.1.ffn_up.weight": (8, 64)}
    plan = plan_tensors(shapes, QuantOptions(bits=3, group_size=16,
                                             keep_fp32=("blk.0.ffn_*",)))
    assert plan["blk.0.attn_norm.weight"] == ("f32", None)
    assert plan["blk.0.ffn_up.weight"] == ("f32", None)
    assert plan["blk.1.ffn_up.weight"] == ("codebook", (3, 16, "f16"))
    # default policy: b + 2 bits, one codebook per row (G' = max(G, cols) = 64)
    assert plan["token_embd.weight"] == ("codebook", (5, 64, "f16"))
    assert plan_tensors({"output.weight": (1000, 2048)}, QuantOptions(bits=7))["output.weight"] \
        == ("codebook", (8, 2048, "f16"))
    # G already ≥ the row: kept as given (still one sub-block per row)
    assert plan_tensors({"output.weight": (1000, 200)}, QuantOptions(bits=2))["output.weight"] \
        == ("codebook", (4, 256, "f16"))
    kept = plan_tensors(shapes, QuantOptions(keep_fp32=("token_embd.weight",)))
    assert kept["token_embd.weight"] == ("f32", None)


def test_quantizer_component_report_and_values():
    ck, data = _checkpoint(np.random.default_rng(0))
    qm = KMeansQuantizer().quantize(ck, QuantOptions(bits=2, group_size=8,
                                                     keep_fp32=("blk.0.attn_v.weight",)))
    out = dict(qm.tensors())
    assert list(out) == list(ck.shapes)
    assert isinstance(out["blk.0.attn_q.weight"], CodebookTensor)
    q, e = out["blk.0.attn_q.weight"], out["token_embd.weight"]
    assert (q.bits, q.group_size, e.bits, e.group_size) == (2, 8, 4, 16)  # embedding: b+2, row
    assert qm.report["method"] == "optimal"
    np.testing.assert_array_equal(out["blk.0.attn_v.weight"], data["blk.0.attn_v.weight"])
    np.testing.assert_array_equal(out["output_norm.weight"], data["output_norm.weight"])
    rep = qm.report["tensors"]
    sse = norm2 = 0.0
    for name, v in out.items():
        if isinstance(v, CodebookTensor):
            W = data[name].astype(np.float64)
            rec = v.codebooks[np.arange(W.shape[0])[:, None],
                              np.arange(W.shape[1])[None, :] // v.group_size, v.indices]
            e = ((W - rec) ** 2).sum()
            assert rep[name]["rel_error"] == pytest.approx(e / (W ** 2).sum(), rel=1e-9)
            sse += e
            norm2 += (W ** 2).sum()
    assert qm.report["total_rel_error"] == pytest.approx(sse / norm2, rel=1e-9)


def test_quantizer_non_finite_weight():
    ck, _ = _checkpoint(np.random.default_rng(1), poison="blk.0.ffn_gate.weight")
    qm = KMeansQuantizer().quantize(ck, QuantOptions(group_size=8))
    with pytest.raises(DittoError, match=r"blk\.0\.ffn_gate\.weight.*\(1, 2\)"):
        dict(qm.tensors())


def test_bad_options_rejected_at_plan_time():
    ck, _ = _checkpoint(np.random.default_rng(1))
    with pytest.raises(DittoError, match="1..8"):
        KMeansQuantizer().quantize(ck, QuantOptions(bits=12))


def test_registered_as_plugins():
    reg = build_registry()
    assert isinstance(reg.get("quantizer", "kmeans"), KMeansQuantizer)
    assert reg.get("packer", "bits").name == "bits"


# ---- determinism across thread counts ------------------------------------------------------

_SCRIPT = textwrap.dedent("""
    import hashlib, sys
    import numpy as np
    import numba
    from ditto_quant_kmeans import quantize_matrix
    rng = np.random.default_rng(11)
    W = (rng.standard_normal((97, 600)) * rng.uniform(0.01, 1, (97, 1))).astype(np.float32)
    W[5, :300] = np.round(W[5, :300], 1)
    h = hashlib.sha256()
    for method in ("optimal", "lloyd"):
        for cbt in ("f16", "f32"):
            q = quantize_matrix(W, 4, 256, method, cbt, seed=3, name="w")
            h.update(q.codebooks.tobytes()); h.update(q.indices.tobytes())
            h.update(np.float64(q.rel_error).tobytes())
    print(numba.get_num_threads(), h.hexdigest())
""")


def test_output_independent_of_thread_count():
    digests = {}
    for threads in ("1", "2"):
        env = dict(os.environ, NUMBA_NUM_THREADS=threads)
        out = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
                             text=True, check=True, timeout=300).stdout.split()
        assert out[0] == threads
        digests[threads] = out[1]
    assert digests["1"] == digests["2"]
    # and in this process, repeated calls agree
    rng = np.random.default_rng(1)
    W = rng.standard_normal((8, 100)).astype(np.float32)
    a = quantize_matrix(W, 3, 32, "lloyd", seed=4)
    b = quantize_matrix(W, 3, 32, "lloyd", seed=4)
    assert hashlib.sha256(a.indices.tobytes() + a.codebooks.tobytes()).digest() == \
        hashlib.sha256(b.indices.tobytes() + b.codebooks.tobytes()).digest()


@pytest.mark.parametrize("shape,g", [((1100, 1024), 256), ((600, 3000), 256), ((2, 70), 33)])
def test_sort_sub_blocks_threads(shape, g):
    """Sorting bands of rows on several threads gives NumPy's per-sub-block sort exactly (tail
    sub-block included), for any thread count."""
    rng = np.random.default_rng(list(shape))
    W = rng.standard_normal(shape).astype(np.float32)
    W[:, ::7] = 0.5  # repeated values
    full = shape[1] // g * g
    ref = np.concatenate([np.sort(W[:, :full].reshape(shape[0], -1, g), -1).reshape(shape[0], -1),
                          np.sort(W[:, full:], -1)], axis=1)
    for threads in (1, 2, 3, None):
        assert np.array_equal(kmeans1d.sort_sub_blocks(W, g, threads), ref)
