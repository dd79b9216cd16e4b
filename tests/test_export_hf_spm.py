"""HF exporter on a SentencePiece-BPE tokenizer.json (Llama-2 style: Prepend/Replace "▁"
normalizer, byte_fallback): the exported TokenizerSpec, run by Ditto's C tokenizer, gives the
same ids as the ``sentencepiece`` library and as HF ``tokenizers``."""

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from ditto_core.model.modelfile import serialize_tokenizer
from ditto_export_hf import HFExporter
from tests.fixtures_hf import write_tiny_hf_dir
from tests.fixtures_tokenizer import CTokenizer

TEXTS = ["def f(x):\n    return  x + 1  # café 🙂", "Hello world", " leading space",
         "import os\nimport sys\n\n\nclass A:\n\tpass\n", "ünïcödé ½ 中文 \x07 bytes",
         "a" * 50, "   ", "x"]


def spm_tokenizer_json(sp):
    """tokenizer.json for sentencepiece model ``sp``, built with ``tokenizers`` the way HF
    converts a Llama SentencePiece model: vocab = pieces by id; merges = every split of a piece
    into two pieces, ordered by the merged piece's score, then by the parts' ids."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

    n = sp.get_piece_size()
    vocab = {sp.id_to_piece(i): i for i in range(n)}
    merges = []
    for piece, pid in vocab.items():
        if sp.is_byte(pid) or sp.is_control(pid) or sp.is_unknown(pid):
            continue
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                merges.append((-sp.get_score(pid), vocab[left], vocab[right], left, right))
    merges.sort()
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(m[3], m[4]) for m in merges],
                               unk_token=sp.id_to_piece(sp.unk_id()), byte_fallback=True,
                               fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                           normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(sp.id_to_piece(i), special=True, normalized=False)
                            for i in (sp.unk_id(), sp.bos_id(), sp.eos_id())])
    # BOS first, as Llama-2's tokenizer.json (and add_bos_token in tokenizer_config.json)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{sp.id_to_piece(sp.bos_id())} $A",
        special_tokens=[(sp.id_to_piece(sp.bos_id()), sp.bos_id())])
    return tok


@pytest.fixture(scope="module")
def spm_hf_dir(spm_model, tmp_path_factory):
    """The tiny HF Llama directory with its tokenizer replaced by the SentencePiece one."""
    d = tmp_path_factory.mktemp("spm_hf")
    src, _ = write_tiny_hf_dir(d / "base", tied=True)
    out = d / "m"
    shutil.copytree(src, out)
    tok = spm_tokenizer_json(spm_model)
    tok.save(str(out / "tokenizer.json"))
    cfg = json.loads((out / "config.json").read_text())
    n_rows = cfg["vocab_size"]
    # the embedding must have one row per token: rebuild the weights for this vocabulary
    w = load_file(str(out / "model.safetensors"))
    n = spm_model.get_piece_size()
    emb = np.random.default_rng(1).standard_normal((n, w["model.embed_tokens.weight"].shape[1]))
    w["model.embed_tokens.weight"] = emb.astype(np.float32)
    save_file(w, str(out / "model.safetensors"))
    cfg["vocab_size"] = n
    (out / "config.json").write_text(json.dumps(cfg))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True}))
    assert n != n_rows
    return out, tok


def test_reference_tokenizer_json_agrees_with_sentencepiece(spm_hf_dir, spm_model):
    _, tok = spm_hf_dir
    for text in TEXTS:
        assert tok.encode(text, add_special_tokens=False).ids == spm_model.encode(text), text


def test_exported_spm_spec(spm_hf_dir, spm_model, tokenizer_lib):
    d, tok = spm_hf_dir
    ck = HFExporter().load(d)
    spec = ck.tokenizer
    n = spm_model.get_piece_size()
    assert spec.kind == "spm_bpe" and spec.add_bos
    # the ▁ prefix and escape are the tokenizer.json normalizer, run by the C tokenizer
    assert spec.normalizer == (("prepend", "\u2581"), ("replace", " ", "\u2581"))
    assert spec.tokens == tuple(spm_model.id_to_piece(i).encode() for i in range(n))
    assert (spec.bos_id, spec.eos_id, spec.unk_id) == (spm_model.bos_id(), spm_model.eos_id(),
                                                      spm_model.unk_id())
    assert all((spec.token_types[i] == 6) == spm_model.is_byte(i) for i in range(n))
    ctok = CTokenizer(tokenizer_lib, serialize_tokenizer(spec), n)
    for text in TEXTS:
        assert ctok.encode(text) == spm_model.encode(text), text
