"""`ditto eval`: the corpus, its chunks, and perplexity / KL divergence of tinycoder builds."""

import gzip
import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest

from ditto_core.base.errors import DittoError
from ditto_core.eval import corpus
from ditto_core.runtime.run import run_build


def ditto(*args, env=None):
    return subprocess.run([sys.executable, "-m", "ditto_core.cli.main", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=1200)


def test_corpus_is_the_issue_s_bytes():
    data = corpus.corpus_bytes()
    assert len(data) == 411_098
    assert hashlib.sha256(data).hexdigest() == \
        "edf99747046f6a2a4bb480c2549a0f922cce2f299cc72721e2727351a1ec4c35"
    assert data.startswith(b"# Author: Steven J. Bethard <steven.bethard@gmail.com>.")
    assert corpus.packaged_corpus() == data  # the shipped copy is the same bytes


def test_damaged_corpus_is_refused():
    with pytest.raises(DittoError, match=r"x.gz: the evaluation corpus is 3 bytes with sha256 "
                                         r"[0-9a-f]{64}, expected 411,098 bytes"):
        corpus._check(b"abc", "x.gz")


def test_chunks_follow_llama_perplexity():
    toks = list(range(100, 100 + 5 * 8 + 3))
    ch = corpus.chunks(toks, n_ctx=8)
    assert len(ch) == 5 and ch[1] == list(range(108, 116))
    assert corpus.chunks(toks, n_ctx=8, n_chunks=2, bos_id=1) == \
        [[1, *range(101, 108)], [1, *range(109, 116)]]
    with pytest.raises(DittoError, match="--chunks 6: the corpus has 5 chunks of 8 tokens"):
        corpus.chunks(toks, n_ctx=8, n_chunks=6)
    with pytest.raises(DittoError, match="tokenizes to 15 tokens; at least 16 are needed"):
        corpus.chunks(toks[:15], n_ctx=8)


def score_ppl_second_halves(build, chunks, n_ctx, tmp_path):
    """Perplexity over the second halves by the C runtime's own --score (an independent
    implementation: double log-softmax in C)."""
    lps = []
    for i, c in enumerate(chunks):
        f = tmp_path / f"c{i}.ids"
        f.write_text(json.dumps(c))
        proc = run_build(build, ["--score", str(f)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        lp = json.loads(proc.stdout)["logprobs"]  # lp[j] scores token j+1
        lps += lp[n_ctx // 2:]
    assert len(lps) == len(chunks) * (n_ctx - 1 - n_ctx // 2)
    return float(np.exp(-np.mean(lps)))


def test_eval_of_a_build_against_itself(eval_builds, tmp_path, monkeypatch):
    monkeypatch.setenv("DITTO_NO_CACHE", "1")
    b = eval_builds["none"]
    proc = ditto("eval", b, "--baseline", b, "--chunks", 2, "--json", "-q", "--threads", 1)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["mean_kld"] == 0.0 and r["kld_p99"] == 0.0 and r["kld_stderr"] == 0.0
    assert r["same_top1"] == 1.0
    assert r["ppl"] == r["ppl_baseline"]
    assert r["tokens_scored"] == 2 * 255 and r["chunks"] == 2 and r["n_ctx"] == 512
    assert r["corpus_sha256"].startswith("edf99747")
    # the same perplexity as the runtime's own --score on the same chunks (tinycoder adds BOS:
    # the token stream starts with BOS and each chunk's first token is replaced by it)
    exe, model = b / "ditto-run", b / "model.ditto"
    toks = corpus.tokenize(exe, model, corpus.corpus_bytes(), add_bos=True)
    assert toks[0] == 1 and r["corpus_tokens"] == len(toks)
    ch = corpus.chunks(toks, 512, 2, bos_id=1)
    assert r["ppl"] == pytest.approx(score_ppl_second_halves(b, ch, 512, tmp_path), rel=1e-6)


def test_eval_kmeans_against_default_fp32_baseline(eval_builds, build_cache_root, tmp_path,
                                                   monkeypatch):
    import os

    env = {**os.environ, "DITTO_CACHE_DIR": str(build_cache_root)}
    proc = ditto("eval", eval_builds["kmeans"], "--chunks", 1, "--json", "-q", "--threads", 1,
                 env=env)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["baseline"].startswith(str(build_cache_root / "eval-baselines"))
    assert r["tokens_scored"] == 255
    assert r["mean_kld"] > 0 and r["kld_p99"] >= r["kld_median"] > 0
    # the baseline is the fp32 build: its perplexity equals the explicit fp32 build's
    proc2 = ditto("eval", eval_builds["kmeans"], "--baseline", eval_builds["none"], "--chunks",
                  1, "--json", "-q", "--threads", 1, env=env)
    r2 = json.loads(proc2.stdout)
    assert r2["ppl_baseline"] == r["ppl_baseline"] and r2["mean_kld"] == r["mean_kld"]
    # the second run found the baseline's logits in the cache
    assert any((build_cache_root / "eval-logits").iterdir())
    # the readable table
    proc3 = ditto("eval", eval_builds["kmeans"], "--baseline", eval_builds["none"], "--chunks",
                  1, "-q", "--threads", 1, env=env)
    assert proc3.returncode == 0, proc3.stderr
    assert "1 chunk of 512 tokens, 255 tokens scored" in proc3.stdout
    assert f"{r2['mean_kld']:.6f} ± {r2['kld_stderr']:.6f}" in proc3.stdout


def test_eval_errors(eval_builds, tmp_path):
    proc = ditto("eval", tmp_path / "nope", "--chunks", 1)
    assert proc.returncode == 1
    assert f"{tmp_path / 'nope'}: not a build directory" in proc.stderr
    proc = ditto("eval", eval_builds["none"], "--baseline", eval_builds["none"], "--chunks",
                 999, "-q")
    assert proc.returncode == 1
    assert "--chunks 999: the corpus has 228 chunks of 512 tokens" in proc.stderr
    proc = ditto("eval", eval_builds["none"], "--limit", 3)
    assert proc.returncode == 2 and "--limit applies to --humaneval only" in proc.stderr
