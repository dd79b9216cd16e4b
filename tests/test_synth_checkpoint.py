"""bench/synth_checkpoint.py: the synthetic Code Llama-shaped checkpoint is valid safetensors
(read back by the ``safetensors`` library), loads through both Ditto exporters (HF and the
F16 GGUF it writes alongside) with the same config, tokenizer and weights, is reproducible, and
has the heavy tails and outlier channels it promises."""

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from ditto_core.stages.plugins import build_registry

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import synth_checkpoint as S  # noqa: E402

SMALL = dict(layers=2, dim=64, ffn=160, heads=4, vocab=700, corpus_bytes=150_000)


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    d = tmp_path_factory.mktemp("synth")
    # a shard limit of 100 kB splits the 2-layer model over several shards
    res = S.write_checkpoint(d / "m", seed=3, shard_bytes=100_000, gguf_path=d / "m.gguf",
                             log=lambda s: None, **SMALL)
    return d, res


def sha(p):
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()


def test_shards_and_index(synth):
    d, res = synth
    m = d / "m"
    index = json.loads((m / "model.safetensors.index.json").read_text())
    assert len(res["files"]) > 1
    assert sorted(set(index["weight_map"].values())) == res["files"]
    shapes = S.hf_shapes(2, 64, 160, 700)
    assert list(index["weight_map"]) == list(shapes)
    hidden = S.HiddenOutliers(3, 64)
    total = 0
    for f in res["files"]:
        with safe_open(str(m / f), framework="numpy") as st:
            for name in st.keys():
                assert index["weight_map"][name] == f
                sl = st.get_slice(name)
                assert sl.get_dtype() == "BF16" and tuple(sl.get_shape()) == shapes[name]
                total += 2 * np.prod(shapes[name])
    assert index["metadata"]["total_size"] == total == res["bytes"]
    # the HF exporter reads the bf16 bytes back as exactly the drawn values
    ck = build_registry().get("exporter", "hf").load(m)
    assert ck.config.n_layers == 2 and ck.config.vocab_size == 700
    assert ck.config.rope_theta == 1e6 and not ck.config.tied_embeddings
    np.testing.assert_array_equal(
        ck.tensors["blk.1.ffn_down.weight"](),
        S.synth_tensor("model.layers.1.mlp.down_proj.weight", (64, 160), 3, hidden))


def test_gguf_agrees_with_hf(synth):
    d, _ = synth
    reg = build_registry()
    a = reg.get("exporter", "hf").load(d / "m")
    b = reg.get("exporter", "gguf").load(d / "m.gguf")
    assert a.config == b.config
    assert a.tokenizer.kind == b.tokenizer.kind == "spm_bpe"
    assert a.tokenizer.tokens == b.tokenizer.tokens
    np.testing.assert_array_equal(a.tokenizer.scores, b.tokenizer.scores)
    np.testing.assert_array_equal(a.tokenizer.token_types, b.tokenizer.token_types)
    assert list(a.shapes) == list(b.shapes)
    for name in a.shapes:
        x, y = a.tensors[name](), b.tensors[name]()
        if x.ndim == 1:
            np.testing.assert_array_equal(x, y)  # norms are F32 in the GGUF
        else:  # F16 of the bf16 values; q/k rows un-permuted by the GGUF exporter
            np.testing.assert_array_equal(y, x.astype(np.float16).astype(np.float32))


def test_tokenizer(synth):
    from tokenizers import Tokenizer

    d, _ = synth
    tok = Tokenizer.from_file(str(d / "m" / "tokenizer.json"))
    assert tok.get_vocab_size() == 700
    assert [tok.token_to_id(t) for t in ("<unk>", "<s>", "</s>", "<0x00>", "<0xFF>")] == \
        [0, 1, 2, 3, 258]
    text = "def f(x):\n    return x + 1  # ☃"
    enc = tok.encode(text, add_special_tokens=False)
    assert "<0xE2>" in enc.tokens  # the snowman is not in the vocabulary: byte fallback
    assert tok.decode(enc.ids) == text


def test_reproducible_and_layer_independent(synth, tmp_path):
    d, res = synth
    small = dict(SMALL, layers=1)
    r2 = S.write_checkpoint(tmp_path / "m", seed=3, shard_bytes=10**9, log=lambda s: None,
                            **small)
    assert sha(tmp_path / "m" / "tokenizer.json") == sha(d / "m" / "tokenizer.json")
    a = build_registry().get("exporter", "hf").load(d / "m")
    b = build_registry().get("exporter", "hf").load(tmp_path / "m")
    for name in b.shapes:  # layer 0 and the globals are the same tensors in both
        np.testing.assert_array_equal(a.tensors[name](), b.tensors[name]())
    assert r2["n_params"] < res["n_params"]


def test_heavy_tails_and_outlier_channels():
    rng = np.random.default_rng(0)
    W = S.synth_matrix(rng, 512, 1024, outliers=np.array([5, 77]))
    assert np.array_equal(S.from_bf16_bits(S.to_bf16_bits(W)), W)  # bf16 values
    rest = np.delete(W, [5, 77], axis=1)
    assert abs(rest.std() * np.sqrt(1024) - 1) < 0.02
    kurt = ((rest - rest.mean()) ** 4).mean() / rest.var() ** 2
    assert kurt > 6  # Student-t ν = 5: 9 (a Gaussian: 3)
    col = np.abs(W).mean(axis=0)
    assert col[5] > 7 * np.median(col) and col[77] > 7 * np.median(col)
