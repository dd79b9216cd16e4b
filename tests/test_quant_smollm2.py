"""SmolLM2-135M (a deterministic subset: embedding + blocks 0, 15, 29; tests/fixtures_quant.py)
quantized with ``kmeans`` and with the third-party ``rtn`` (b = 4, G = 256, f16 codebooks),
both packed by ``bits`` through the plugin registry (one session fixture)."""

import math

import numpy as np
import pytest

from ditto_core.model.modelfile import ModelFile
from ditto_pack_bits import dequantize


def _total(report, names):
    t = report["tensors"]
    return sum(t[n]["sse"] for n in names) / sum(t[n]["norm2"] for n in names)


def test_kmeans_beats_rtn(smollm2_packed):
    """At the same b = 4, G = 256 (all matrices but the embedding, which kmeans' default
    policy gives 6 bits and one codebook per row), kmeans has the lower total and per-tensor
    relative error."""
    kt = smollm2_packed["kmeans"][1]["report"]
    rt = smollm2_packed["rtn"][1]["report"]
    linear = [n for n, v in kt["tensors"].items()
              if v["encoding"] == "codebook" and n != "token_embd.weight"]
    assert len(linear) == 3 * 7  # 21 linear layers of blocks 0, 15, 29
    assert all(kt["tensors"][n]["bits"] == 4 for n in linear)
    k, r = _total(kt, linear), _total(rt, linear)
    assert 0 < k < r
    assert all(kt["tensors"][n]["rel_error"] < rt["tensors"][n]["rel_error"] for n in linear)
    # whole files: kmeans (embedding at 6 bits) vs rtn (4 bits everywhere)
    emb = kt["tensors"]["token_embd.weight"]
    assert (emb["encoding"], emb["bits"], emb["group_size"]) == ("codebook", 6, 576)
    assert 0 < smollm2_packed["kmeans"][1]["total_rel_error"] < \
        smollm2_packed["rtn"][1]["total_rel_error"]


@pytest.mark.parametrize("name", ["token_embd.weight", "blk.0.attn_q.weight",
                                  "blk.2.ffn_down.weight"])
def test_file_holds_what_the_report_says(smollm2_packed, smollm2_subset, name):
    """Decode tensors from the packed file and measure the error against the exporter's
    weights: it equals the quantizer's reported per-tensor error."""
    path, summary = smollm2_packed["kmeans"]
    W = smollm2_subset.tensors[name]()
    mf = ModelFile.open(path)
    What = dequantize(mf.tensors[name], mf.payload(name))
    rel = ((W.astype(np.float64) - What) ** 2).sum() / (W.astype(np.float64) ** 2).sum()
    assert rel == pytest.approx(summary["tensors"][name]["rel_error"], rel=1e-9)
    assert 1e-4 < rel < 0.02


@pytest.mark.parametrize("quantizer", ["kmeans", "rtn"])
def test_file_size_near_theoretical(smollm2_packed, quantizer):
    path, summary = smollm2_packed[quantizer]
    mf = ModelFile.open(path)
    theoretical = 0
    for t in mf.tensors.values():
        if t.encoding == "f32":
            assert len(t.shape) == 1  # only norms stay f32 by default
            theoretical += 4 * t.n_weights
        else:
            b, g = 4, 256
            if quantizer == "kmeans" and t.name == "token_embd.weight":
                b, g = 6, 576  # the default policy: b + 2 bits, one codebook per row
            assert (t.bits, t.group_size, t.codebook_type) == (b, g, "f16")
            s = math.ceil(t.cols / g)
            theoretical += t.n_weights * b // 8 + t.rows * s * (1 << b) * 2
    size = path.stat().st_size
    header = 64 + mf.meta_size  # fixed header, config, tensor table, tokenizer
    assert 0 <= size - header - theoretical < 0.005 * theoretical
    assert summary["file_bytes"] == size
    n = sum(t.n_weights for t in mf.tensors.values())
    assert summary["bpw"] == pytest.approx(8 * size / n)
    # 4-bit indices + 16 f16 centroids per sub-block: rows of 576 have sub-blocks 256+256+64
    # (4 + 3·256/576 = 5.33 bpw), rows of 1536 have 6 full ones (5.0 bpw)
    q = mf.tensors["blk.0.attn_q.weight"]
    assert 8 * q.nbytes / q.n_weights == pytest.approx(4 + 3 * 16 * 16 / 576, abs=1e-3)
    d = mf.tensors["blk.0.ffn_down.weight"]
    assert 8 * d.nbytes / d.n_weights == pytest.approx(5.0, abs=1e-3)
    if quantizer == "kmeans":  # 6-bit indices + 64 f16 centroids per row of 576: 7.78 bpw
        e = mf.tensors["token_embd.weight"]
        assert 8 * e.nbytes / e.n_weights == pytest.approx(6 + 64 * 16 / 576, abs=1e-3)
        assert e.nbytes < 4 * e.n_weights
