"""llama.cpp peers of `ditto eval --peer-gguf`: the llama-perplexity output parser (on a saved
sample, tests/data/README.md) and the errors when llama.cpp is absent. llama.cpp itself is not
needed."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ditto_core.base.errors import DittoError
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
    proc = subprocess.run([sys.executable, "-m", "ditto_core.cli.main", "eval", eval_builds["none"],
                           "--baseline", eval_builds["none"], "--chunks", "1", "-q",
                           "--peer-gguf", tmp_path / "missing.gguf"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1
    assert f"error: {tmp_path / 'missing.gguf'}: no such GGUF file" in proc.stderr


def fake_llama_cpp(bin_dir: Path, log: Path) -> Path:
    """Stand-ins for llama-quantize / llama-perplexity that log their arguments: quantize copies
    the GGUF, perplexity writes a base file or prints the saved sample output."""
    bin_dir.mkdir()
    (bin_dir / "llama-quantize").write_text(
        f'#!/bin/sh\necho "quantize $*" >> {log}\ncp "$2" "$3"\n')
    (bin_dir / "llama-perplexity").write_text(
        f'#!/bin/sh\necho "perplexity $*" >> {log}\n'
        'case "$*" in *--kl-divergence\\ *|*--kl-divergence) cat ' + str(SAMPLE) + ';;\n'
        '*) while [ $# -gt 0 ]; do [ "$1" = --kl-divergence-base ] && echo base > "$2"; '
        'shift; done;;\nesac\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir


def test_peer_rows_run_llama_perplexity_as_documented(tmp_path, tiny_gguf, monkeypatch):
    monkeypatch.setenv("DITTO_CACHE_DIR", str(tmp_path / "cache"))
    log = tmp_path / "log"
    bin_dir = fake_llama_cpp(tmp_path / "bin", log)
    rows = llamacpp.peer_rows("tinycoder", [tiny_gguf], tmp_path / "out", bin_dir=bin_dir,
                              n_chunks=2)
    (r,) = rows
    assert r["config"] == f"llama.cpp {tiny_gguf.stem}" and r["source"] == "llama.cpp"
    assert r["mean_kld"] == 0.259401 and r["tokens_scored"] == 510
    assert r["file_bytes"] == tiny_gguf.stat().st_size and 0 < r["bpw"] < 40
    calls = log.read_text().splitlines()
    f32 = next((tmp_path / "cache" / "llama-cpp").glob("*-F32.gguf"))
    base = next((tmp_path / "cache" / "llama-cpp").glob("*-c512-n2.kld"))
    assert calls[0].startswith(f"quantize --allow-requantize {tiny_gguf} ") and \
        calls[0].endswith(" F32")
    assert re.fullmatch(rf"perplexity -m {re.escape(str(f32))} -f \S+/corpus.txt -c 512 -b 512 "
                        r"--chunks 2 --kl-divergence-base \S+/base.kld", calls[1])
    assert calls[2] == (f"perplexity -m {tiny_gguf} -c 512 -b 512 --kl-divergence-base {base} "
                        "--kl-divergence")
    assert len(calls) == 3
    # a second sweep reuses the F32, the base file and the saved peer result
    assert llamacpp.peer_rows("tinycoder", [tiny_gguf], tmp_path / "out", bin_dir=bin_dir,
                              n_chunks=2) == rows
    assert len(log.read_text().splitlines()) == 3
