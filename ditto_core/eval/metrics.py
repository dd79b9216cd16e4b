"""Evaluation metrics: KL divergence and perplexity from logits, pass@k, summary statistics.

Conventions follow llama.cpp's ``llama-perplexity --kl-divergence`` (tools/perplexity/
perplexity.cpp) so Ditto's figures can be put beside llama.cpp's:

- per scored token t with base (reference) logits ``b`` and test logits ``q``:
  ``KLD_t = sum_v P_b(v) * (log P_b(v) - log P_q(v))`` (natural log, nats), the divergence of the
  test model from the base model;
- the mean of a per-token quantity is reported with its standard error
  ``sqrt((mean(x²) - mean(x)²) / (n - 1))``;
- perplexity is ``exp(mean NLL)`` of the scored tokens;
- "same top-1" is the fraction of tokens where both models' argmax agree.

Unlike llama.cpp, which stores the base log-probabilities as 16-bit values and skips vocabulary
entries with ``log P_b < -16``, every log-softmax here is exact float64.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import attrs
import numpy as np


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64.

    logits: float array ``[n_tokens, vocab_size]`` (any float dtype; converted to float64).
    Returns float64 ``[n_tokens, vocab_size]``, natural-log probabilities. Raises ValueError if
    the array is not 2-D or holds a non-finite value."""
    x = np.asarray(logits, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"logits must be 2-D [n_tokens, vocab_size], got shape {x.shape}")
    if not np.isfinite(x).all():
        bad = np.argwhere(~np.isfinite(x))[0]
        raise ValueError(f"logits hold a non-finite value at row {bad[0]}, column {bad[1]}")
    shifted = x - x.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def kl_divergence(base_logits: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """Per-token KL divergence ``KL(P_base || P)`` in nats.

    base_logits, logits: ``[n_tokens, vocab_size]`` logits of the reference model and the model
    under test at the same positions. Returns float64 ``[n_tokens]`` (each ≥ 0 up to rounding).
    Raises ValueError for mismatched shapes. Definition: Kullback & Leibler (1951); the
    direction is llama.cpp's (perplexity.cpp, ``kl_divergence``)."""
    if np.shape(base_logits) != np.shape(logits):
        raise ValueError(f"base logits {np.shape(base_logits)} and logits {np.shape(logits)} "
                         "differ in shape")
    lb = log_softmax(base_logits)
    lq = log_softmax(logits)
    return np.maximum((np.exp(lb) * (lb - lq)).sum(axis=1), 0.0)


def token_nll(logits: np.ndarray, targets: Sequence[int]) -> np.ndarray:
    """Negative log-likelihood (nats) of ``targets[i]`` under row i of ``logits``.

    logits: ``[n_tokens, vocab_size]``; targets: ``n_tokens`` token ids in ``[0, vocab_size)``.
    Returns float64 ``[n_tokens]``. Raises ValueError for a length mismatch or an id out of range."""
    lp = log_softmax(logits)
    t = np.asarray(targets, dtype=np.int64)
    if t.shape != (lp.shape[0],):
        raise ValueError(f"{t.size} targets for {lp.shape[0]} rows of logits")
    if t.size and (t.min() < 0 or t.max() >= lp.shape[1]):
        raise ValueError(f"target id out of range [0, {lp.shape[1]})")
    return -lp[np.arange(t.size), t]


def perplexity(nll: Iterable[float]) -> float:
    """``exp(mean NLL)``: the perplexity of the scored tokens (NLL in nats).
    A model that is uniform over V tokens has perplexity V. Raises ValueError if empty."""
    a = np.asarray(list(nll) if not isinstance(nll, np.ndarray) else nll, dtype=np.float64)
    if a.size == 0:
        raise ValueError("perplexity of zero tokens")
    return float(math.exp(a.mean()))


def same_top1(base_logits: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """Boolean ``[n_tokens]``: the two models' argmax tokens agree (first index on ties, as
    llama.cpp's strict ``>`` scan)."""
    return np.argmax(np.asarray(base_logits), axis=1) == np.argmax(np.asarray(logits), axis=1)


def mean_stderr(values: Sequence[float]) -> tuple[float, float]:
    """(mean, standard error of the mean) with llama.cpp's estimator:
    ``sqrt((mean(x²) − mean(x)²) / (n − 1))``, 0 for n ≤ 10 or a non-positive variance
    (perplexity.cpp ``mean_and_uncertainty``). Raises ValueError if empty."""
    a = np.asarray(values, dtype=np.float64)
    n = a.size
    if n == 0:
        raise ValueError("mean of zero values")
    f = a.mean()
    var = (a * a).mean() - f * f
    return float(f), float(math.sqrt(var / (n - 1))) if var > 0 and n > 10 else 0.0


def percentile(values: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile (0..1) with linear interpolation between sorted values, as
    llama.cpp reports "99.0% KLD" (and numpy's default "linear" method)."""
    a = np.sort(np.asarray(values, dtype=np.float64))
    if a.size == 0:
        raise ValueError("percentile of zero values")
    return float(np.quantile(a, min(max(fraction, 0.0), 1.0)))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimator of pass@k from n samples of which c pass:
    ``1 − C(n−c, k) / C(n, k)`` (Chen et al. 2021, "Evaluating Large Language Models Trained on
    Code", eq. 1 and its numerically stable product form). Raises ValueError unless
    ``0 ≤ c ≤ n`` and ``1 ≤ k ≤ n``."""
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


@attrs.define
class KLAccumulator:
    """Collects per-token KLD, NLL of both models and top-1 agreement over chunks, then
    summarises them (``summary()``)."""

    kld: list[np.ndarray] = attrs.field(factory=list)
    nll: list[np.ndarray] = attrs.field(factory=list)
    nll_base: list[np.ndarray] = attrs.field(factory=list)
    same: list[np.ndarray] = attrs.field(factory=list)

    def add(self, base_logits: np.ndarray, logits: np.ndarray, targets: Sequence[int]) -> None:
        """Score one block: row i of both logits arrays predicts ``targets[i]``."""
        self.kld.append(kl_divergence(base_logits, logits))
        self.nll.append(token_nll(logits, targets))
        self.nll_base.append(token_nll(base_logits, targets))
        self.same.append(same_top1(base_logits, logits))

    @property
    def count(self) -> int:
        return int(sum(a.size for a in self.kld))

    def summary(self) -> dict:
        """Every figure as plain floats: ``mean_kld``, ``kld_stderr``, ``kld_p99``,
        ``kld_median``, ``kld_max``, ``same_top1`` (fraction), ``same_top1_stderr``, ``ppl``
        (model under test), ``ppl_stderr``, ``ppl_baseline``, ``ppl_baseline_stderr``,
        ``tokens_scored``. Raises ValueError if nothing was added."""
        kld = np.concatenate(self.kld)
        nll = np.concatenate(self.nll)
        nll_b = np.concatenate(self.nll_base)
        same = np.concatenate(self.same)
        n = kld.size
        mk, sk = mean_stderr(kld)
        mn, sn = mean_stderr(nll)
        mb, sb = mean_stderr(nll_b)
        p_top = float(same.mean())
        return {
            "mean_kld": mk, "kld_stderr": sk, "kld_p99": percentile(kld, 0.99),
            "kld_median": float(np.median(kld)), "kld_max": float(kld.max()),
            "same_top1": p_top,
            "same_top1_stderr": math.sqrt(p_top * (1 - p_top) / (n - 1)) if n > 1 else 0.0,
            "ppl": math.exp(mn), "ppl_stderr": math.exp(mn) * sn,
            "ppl_baseline": math.exp(mb), "ppl_baseline_stderr": math.exp(mb) * sb,
            "tokens_scored": int(n),
        }
