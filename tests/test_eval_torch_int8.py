"""The PyTorch dynamic-int8 baseline row (`ditto compare --config torch-int8`)."""

import pytest

from ditto_core.base.errors import DittoError
from ditto_core.eval import compare, torch_int8


def test_names_map_to_transformers():
    assert torch_int8.hf_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj.weight"
    assert torch_int8.hf_name("output.weight") == "lm_head.weight"
    with pytest.raises(DittoError, match="tensor blk.0.nope.weight: no transformers name"):
        torch_int8.hf_name("blk.0.nope.weight")


def test_fp32_transformers_model_matches_the_fp32_build(eval_builds, monkeypatch, tmp_path):
    monkeypatch.setenv("DITTO_CACHE_DIR", str(tmp_path))
    r = torch_int8.evaluate("tinycoder", eval_builds["none"], n_chunks=1, threads=1,
                            quantize=False)
    assert r["mean_kld"] < 1e-9 and r["same_top1"] == 1.0
    assert r["ppl"] == pytest.approx(r["ppl_baseline"], rel=1e-6)
    m = torch_int8.int8_model("tinycoder")
    import torch

    linears = [n for n, mod in m.named_modules()
               if isinstance(mod, torch.ao.nn.quantized.dynamic.Linear)]
    n_layers = m.config.num_hidden_layers
    assert len(linears) == 7 * n_layers + 1  # q k v o gate up down per layer + the classifier


def test_torch_int8_row_in_a_sweep(eval_builds, tmp_path, build_cache_root, monkeypatch):
    monkeypatch.setenv("DITTO_CACHE_DIR", str(build_cache_root))
    settings = {"eval": True, "chunks": 1, "bench": True, "threads": [1], "repeat": 1,
                "tokens": 4, "humaneval": False, "limit": None}
    (row,) = compare.compare("tinycoder", ["torch-int8"], tmp_path, settings)
    assert row["config"] == "torch-int8" and row["source"] == "pytorch"
    assert 0 < row["mean_kld"] < 1e-3 and row["tokens_scored"] == 255
    assert row["decode_tok_per_s"] > 0 and row["peak_rss_mib"] > 0
    assert 8 < row["bpw"] < 32
