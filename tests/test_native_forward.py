"""The C forward pass against references: transformers on SmolLM2 (fp32 logits and greedy
decoding) and the NumPy reference forward on dequantized weights (quantized models)."""

import json

import numpy as np
import pytest

from tests.fixtures_native import (dump_logits, model_weights, rel_error, run_native,
                                   synthetic_model, token_file)
from tests.fixtures_quant import rtn_registry, smollm2_packed, smollm2_subset  # noqa: F401
from tests.fixtures_tokenizer import golden_rows
from tests.native_reference import reference_logits

# golden rows used as prompts: code, code with a tab, plain English, ChatML markers, emoji
PROMPT_ROWS = (0, 9, 39, 45, 17)


def hf_logits(model, ids) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double().numpy()


def test_smollm2_fp32_logits_equal_transformers(native_build, smollm2_f32_ditto,
                                                native_hf_smollm2, tmp_path):
    for row in PROMPT_ROWS:
        ids = golden_rows()[row]["ids_special"]
        got = dump_logits(native_build.run, smollm2_f32_ditto, ids, tmp_path)
        ref = hf_logits(native_hf_smollm2, ids)
        assert got.shape == ref.shape == (len(ids), 49152)
        err = rel_error(got, ref)
        assert err.max() <= 1e-4, (row, err)
        assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.95


def test_smollm2_greedy_64_tokens_equal_transformers(native_build, smollm2_f32_ditto,
                                                     native_hf_smollm2, tmp_path):
    import torch

    ids = golden_rows()[0]["ids_special"]  # a Python function: 64 tokens without EOS
    p = run_native(native_build.run, "-m", smollm2_f32_ditto, "--ids",
                   token_file(tmp_path / "p.json", ids), "-n", 64, "--temp", 0, "--print-ids")
    assert p.returncode == 0, p.stderr.decode()
    got = json.loads(p.stdout)
    with torch.no_grad():
        out = native_hf_smollm2.generate(torch.tensor([ids]), max_new_tokens=64,
                                         do_sample=False, eos_token_id=2, pad_token_id=2,
                                         attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    want = out[0, len(ids):].tolist()
    assert len(want) == 64
    assert got == want


def test_smollm2_chat_generates_coherent_answer_within_memory_bound(native_build,
                                                                    smollm2_f32_ditto):
    p = run_native(native_build.run, "-m", smollm2_f32_ditto, "-p",
                   "What is the capital of France?", "--chat", "-n", 24, "--temp", 0)
    stdout, stderr = p.stdout.decode(), p.stderr.decode()
    assert p.returncode == 0, stderr
    assert "Paris" in stdout
    assert "tok/s" in stderr and "time to first token" in stderr
    stats = json.loads(stderr.split("stats ", 1)[1].splitlines()[0])
    # peak RSS <= file size + KV cache (only the positions used) + 64 MiB (issue 4)
    kv = 2 * 30 * stats["ctx"] * 3 * 64 * 4
    assert 0 < stats["peak_rss_kib"] * 1024 <= smollm2_f32_ditto.stat().st_size + kv + 64 * 2**20


@pytest.mark.parametrize("name", ["f32", "quant", "quant_untied", "quant_qwen2"])
def test_synthetic_logits_equal_numpy_reference(native_build, native_synth, tmp_path, name):
    m = getattr(native_synth, name)
    rng = np.random.default_rng(7)
    ids = rng.integers(0, m.cfg.vocab_size, size=40).tolist()
    got = dump_logits(native_build.run, m.path, ids, tmp_path)
    ref = reference_logits(m.cfg, m.weights, ids)
    err = rel_error(got, ref)
    assert err.max() <= 1e-4, err


def test_tinycoder_f32_logits_equal_numpy_reference(native_build, tiny_f32_ditto, tmp_path):
    cfg, w = model_weights(tiny_f32_ditto)
    assert not cfg.tied_embeddings
    ids = [1, 450, 4996, 17354, 1701, 432, 17204, 975, 278, 17366, 11203, 29889]
    got = dump_logits(native_build.run, tiny_f32_ditto, ids, tmp_path)
    ref = reference_logits(cfg, w, ids)
    assert rel_error(got, ref).max() <= 1e-4


def test_threads_do_not_change_logits(native_build, native_synth, tmp_path):
    m = native_synth.quant
    ids = list(range(3, 30))
    a = dump_logits(native_build.run, m.path, ids, tmp_path, "--threads", 1)
    b = dump_logits(native_build.run, m.path, ids, tmp_path, "--threads", 2)
    np.testing.assert_array_equal(a, b)


def test_decode_attention_split_over_threads_keeps_bits(native_build, tmp_path):
    """Token-by-token decode (-b 1) splits the query heads (6, over 2 KV heads of 3) evenly over
    the threads: with 2 threads each takes a whole KV group, with 4 the runs (1, 2, 1, 2 heads)
    cut through the groups. head_dim 16 takes the SIMD attention where the CPU has it (its
    three-head and one-head steps); every split gives the 1-thread logits bit for bit, and
    those match the NumPy reference."""
    path = tmp_path / "gqa16.ditto"
    cfg, w = synthetic_model(path, seed=5, tied=True, quantized=False, head_dim=16)
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (6, 2, 16)
    ids = list(range(3, 30))
    one = dump_logits(native_build.run, path, ids, tmp_path, "--threads", 1, "-b", 1)
    assert rel_error(one, reference_logits(cfg, w, ids)).max() <= 1e-4
    for threads in (2, 4):
        got = dump_logits(native_build.run, path, ids, tmp_path, "--threads", threads, "-b", 1)
        np.testing.assert_array_equal(got, one)


def test_score_equals_log_softmax_of_reference(native_build, native_synth, tmp_path):
    m = native_synth.quant
    ids = np.random.default_rng(3).integers(0, 259, size=20).tolist()
    p = run_native(native_build.run, "-m", m.path, "--score", token_file(tmp_path / "t", ids))
    assert p.returncode == 0, p.stderr.decode()
    out = json.loads(p.stdout)
    ref = reference_logits(m.cfg, m.weights, ids)
    ref = ref - ref.max(-1, keepdims=True)
    logp = ref - np.log(np.exp(ref).sum(-1, keepdims=True))
    want = logp[np.arange(len(ids) - 1), ids[1:]]
    assert out["n_tokens"] == 20 and out["n_scored"] == 19
    np.testing.assert_allclose(out["logprobs"], want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out["sum_logprob"], want.sum(), rtol=1e-4)
    np.testing.assert_allclose(out["perplexity"], np.exp(-want.mean()), rtol=1e-4)


def _sample(exe, model, tmp_path, seed, *extra):
    p = run_native(exe, "-m", model, "--ids", token_file(tmp_path / "s.json", [1, 70, 80]),
                   "-n", 40, "--seed", seed, "--print-ids", *extra)
    assert p.returncode == 0, p.stderr.decode()
    return json.loads(p.stdout)


def test_same_seed_same_text_different_seed_different_text(native_build, native_synth, tmp_path):
    model = native_synth.quant_untied.path  # random untied classifier: a flat distribution
    for extra in (("--temp", 1.0, "--top-p", 1.0), ("--temp", 0.8, "--top-p", 0.9)):
        a = _sample(native_build.run, model, tmp_path, 42, *extra)
        b = _sample(native_build.run, model, tmp_path, 42, *extra)
        c = _sample(native_build.run, model, tmp_path, 43, *extra)
        assert a == b
        assert a != c
        assert len(a) == 40 or a[-1] == 2


def test_smollm2_same_seed_same_text(native_build, smollm2_f32_ditto):
    def gen(seed):
        p = run_native(native_build.run, "-m", smollm2_f32_ditto, "-p", "Once upon a time",
                       "-n", 12, "--temp", 1.0, "--top-p", 0.95, "--seed", seed)
        assert p.returncode == 0, p.stderr.decode()
        return p.stdout

    a, b, c = gen(1), gen(1), gen(2)
    assert a == b and a != c


def test_greedy_is_argmax_and_tiny_top_p_is_greedy(native_build, native_synth, tmp_path):
    m = native_synth.quant
    ids = [1, 70, 80]  # the prompt of _sample
    ref = reference_logits(m.cfg, m.weights, ids)
    greedy = _sample(native_build.run, m.path, tmp_path, 5, "--temp", 0)
    assert greedy[0] == int(ref[-1].argmax())
    nucleus = _sample(native_build.run, m.path, tmp_path, 5, "--temp", 1.0, "--top-p", 1e-6)
    assert nucleus == greedy


@pytest.mark.parametrize("quantizer", ["kmeans", "rtn"])
def test_real_quantized_smollm2_subset_equals_numpy_reference(native_build, smollm2_packed,
                                                              tmp_path, quantizer):
    """SmolLM2 blocks 0, 15, 29 + the tied embedding, quantized by the project's quantizers
    (b = 4, G = 256, f16 codebooks) and packed by ``bits`` (tests/fixtures_quant.py)."""
    path, _ = smollm2_packed[quantizer]
    cfg, w = model_weights(path)
    ids = golden_rows()[39]["ids_special"]  # "The quick brown fox jumps over the lazy dog."
    got = dump_logits(native_build.run, path, ids, tmp_path)
    ref = reference_logits(cfg, w, ids)
    assert rel_error(got, ref).max() <= 1e-4
