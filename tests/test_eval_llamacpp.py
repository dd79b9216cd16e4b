"""llama.cpp peers of `ditto eval --peer-gguf`: the llama-perplexity output parser (on a saved
sample, tests/data/README.md) and the errors when llama.cpp is absent. llama.cpp itself is not
needed."""

import subprocess
import sys
from pathlib import Path

import pytest

from ditto_core.errors import DittoError
from ditto_core.eval import llamacpp

SAMPLE = Path(__file__).parent / "data" / "llama_perplexity_kld_q4_0.txt"


def test_parse_kld_output():
    r = llamacpp.parse_kld_output(SAMPLE.read_text())
    assert r == {"mean_kld": 0.259401, "kld_stderr": 0.011914, "kld_p99": 1.284254,
                 "kld_median": 0.196841, "kld_max": 2.638209,
                 "same_top1": pytest.approx(0.76471), "same_top1_stderr": pytest.approx(0.0188),
                 "ppl": 13.775697, "ppl_stderr": 1.655314, "ppl_baseline": 11.727451,
                 "ppl_baseline_stderr": 1.349483, "chunks": 2, "tokens_scored": 510}


def test_parse_kld_output_refuses_truncated_output():
    text = SAMPLE.read_text()
    with pytest.raises(DittoError, match=r"no 'Mean    KLD' line"):
        llamacpp.parse_kld_output(text.split("====== KL divergence")[0])
    with pytest.raises(DittoError, match="no per-chunk table"):
        llamacpp.parse_kld_output(text.split("====== Perplexity")[1])


def test_missing_llama_cpp_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(DittoError, match="llama-perplexity: not found on PATH; build llama.cpp"):
        llamacpp.find_tool("llama-perplexity")
    with pytest.raises(DittoError, match=f"{tmp_path}/llama-quantize: no such executable"):
        llamacpp.find_tool("llama-quantize", tmp_path)


def test_eval_peer_gguf_errors(eval_builds, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ditto_core.cli", "eval", eval_builds["none"],
                           "--baseline", eval_builds["none"], "--chunks", "1", "-q",
                           "--peer-gguf", tmp_path / "missing.gguf"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1
    assert f"error: {tmp_path / 'missing.gguf'}: no such GGUF file" in proc.stderr
