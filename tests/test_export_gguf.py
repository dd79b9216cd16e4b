"""GGUF exporter on the real models: config, dequantized tensors in HF q/k order, tokenizers
checked against llama.cpp's golden token ids (tests/data)."""

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ditto_core.base.errors import DittoError
from ditto_export_gguf import GGUFExporter
from ditto_export_gguf.exporter import _read_gguf, unpermute_qk
from tests.fixtures_hf import gguf_rows_to_hf

GOLDEN = Path(__file__).resolve().parent / "data" / "smollm2_tokenizer_golden.jsonl"


@pytest.fixture(scope="module")
def smollm2(smollm2_checkpoint):
    return smollm2_checkpoint


@pytest.fixture(scope="module")
def tiny(tiny_gguf):
    return GGUFExporter().load(tiny_gguf)


@pytest.fixture(scope="module")
def reader(smollm2_gguf):
    return gguf.GGUFReader(smollm2_gguf)


def golden_rows():
    return [json.loads(line) for line in GOLDEN.read_text().splitlines() if line.strip()]


def test_smollm2_config_is_the_published_model(smollm2):
    c = smollm2.config
    # SmolLM2-135M-Instruct as described in the issue (HF model card values)
    assert (c.n_layers, c.dim, c.hidden_dim, c.n_heads, c.n_kv_heads, c.head_dim) == \
        (30, 576, 1536, 9, 3, 64)
    assert (c.vocab_size, c.rope_theta, c.tied_embeddings) == (49152, 100000.0, True)
    assert c.norm_eps == pytest.approx(1e-5) and c.max_seq_len == 8192
    assert "output.weight" not in smollm2.shapes and len(smollm2.shapes) == 272
    assert smollm2.shapes["blk.0.ffn_down.weight"] == (576, 1536)


def test_smollm2_tensors_are_gguf_dequantized_in_hf_order(smollm2, reader):
    by = {t.name: t for t in reader.tensors}
    for name in ("token_embd.weight", "blk.7.ffn_down.weight", "blk.29.attn_norm.weight",
                 "blk.3.attn_v.weight"):
        t = by[name]
        ref = gguf.quants.dequantize(t.data, t.tensor_type).reshape(smollm2.shapes[name])
        got = smollm2.tensors[name]()
        assert got.dtype == np.float32 and got.flags.c_contiguous
        np.testing.assert_array_equal(got, ref)
    for name, heads in (("blk.5.attn_q.weight", 9), ("blk.5.attn_k.weight", 3)):
        t = by[name]
        raw = gguf.quants.dequantize(t.data, t.tensor_type).reshape(smollm2.shapes[name])
        np.testing.assert_array_equal(smollm2.tensors[name](), gguf_rows_to_hf(raw, heads))
    # Q4_1 blocks of 32 share a scale/min: the row structure survives only in the right order
    assert not np.array_equal(smollm2.tensors["blk.5.attn_q.weight"](),
                              gguf.quants.dequantize(by["blk.5.attn_q.weight"].data,
                                                     by["blk.5.attn_q.weight"].tensor_type))


def test_exporter_reader_holds_what_gguf_reader_holds(smollm2_gguf, reader):
    mine = _read_gguf(smollm2_gguf)
    # a plain view of the memory map: slicing it skips np.memmap's per-slice Python hooks
    assert type(mine.data) is np.ndarray and type(reader.data) is np.memmap
    assert list(mine.fields) == list(reader.fields) and len(mine.fields) > 30
    for key, field in reader.fields.items():
        assert mine.fields[key].types == field.types, key
        assert mine.fields[key].contents() == field.contents(), key
    assert len(mine.fields["tokenizer.ggml.tokens"].contents()) == 49152
    assert [(t.name, t.tensor_type, list(t.shape), t.data_offset) for t in mine.tensors] == \
        [(t.name, t.tensor_type, list(t.shape), t.data_offset) for t in reader.tensors]
    for a, b in zip(mine.tensors, reader.tensors):
        assert a.data.dtype == b.data.dtype and np.array_equal(a.data, b.data), a.name
    assert (mine.byte_order, mine.alignment, mine.data_offset) == \
        (reader.byte_order, reader.alignment, reader.data_offset)


@settings(max_examples=25, deadline=None)
@given(heads=st.integers(1, 5), half=st.integers(1, 6), cols=st.integers(1, 7))
def test_unpermute_inverts_llama_cpp_permute(heads, half, cols):
    d = 2 * half
    w = np.arange(heads * d * cols, dtype=np.float32).reshape(heads * d, cols)
    # convert_hf_to_gguf.py LlamaModel.permute: reshape(n_head, 2, d/2, ...).swapaxes(1, 2)
    permuted = w.reshape(heads, 2, d // 2, cols).swapaxes(1, 2).reshape(w.shape)
    np.testing.assert_array_equal(unpermute_qk(permuted, heads), w)
    np.testing.assert_array_equal(gguf_rows_to_hf(permuted, heads), w)


def test_smollm2_tokenizer_reproduces_llama_cpp_golden_ids(smollm2):
    tok = smollm2.tokenizer
    assert (tok.kind, tok.pre, tok.chat_format) == ("bpe_bytes", "gpt2_digits", "chatml")
    assert tok.tokens[tok.bos_id] == b"<|im_start|>" and tok.tokens[tok.eos_id] == b"<|im_end|>"
    assert len(tok.merges) == 48900
    rows = golden_rows()
    assert len(rows) == 59
    for row in rows:
        # llama.cpp's ids, read back through our raw-byte tokens, give the text's UTF-8 bytes
        assert b"".join(tok.tokens[i] for i in row["ids_plain"]) == row["text"].encode()
        assert b"".join(tok.tokens[i] for i in row["ids_special"]) == row["text"].encode()
    vocab = set(tok.tokens)
    assert all(tok.tokens[a] + tok.tokens[b] in vocab for a, b in tok.merges)
    assert [i for i, t in enumerate(tok.token_types) if t == 3] == list(range(17))


def test_tinycoder_sentencepiece(tiny, tiny_gguf):
    r = gguf.GGUFReader(tiny_gguf)
    f = r.fields
    tok = tiny.tokenizer
    assert tok.kind == "spm_bpe" and len(tok.tokens) == 32000 == tiny.config.vocab_size
    assert tok.tokens[:3] == (b"<unk>", b"<s>", b"</s>") and tok.tokens[3 + 0x41] == b"<0x41>"
    assert [t.encode() for t in f["tokenizer.ggml.tokens"].contents()] == list(tok.tokens)
    np.testing.assert_array_equal(tok.scores, np.array(f["tokenizer.ggml.scores"].contents(),
                                                       np.float32))
    assert int(tok.token_types[3 + 0x41]) == 6
    assert tok.add_bos and tok.add_space_prefix and (tok.bos_id, tok.eos_id) == (1, 2)
    assert not tiny.config.tied_embeddings and tiny.shapes["output.weight"] == (32000, 16)
    assert tiny.config.head_dim == 4 and tiny.config.n_layers == 2


def test_can_load(smollm2_gguf, tmp_path):
    e = GGUFExporter()
    assert e.can_load(smollm2_gguf)
    (tmp_path / "x.gguf").write_bytes(b"DITTOMDL" + bytes(100))
    assert not e.can_load(tmp_path / "x.gguf") and not e.can_load(tmp_path)
    with pytest.raises(DittoError, match="not a GGUF file"):
        e.load(tmp_path / "x.gguf")
