"""SentencePiece BPE in C (native/tokenizer/tokenizer.c) against the ``sentencepiece`` library: a
BPE model with byte fallback is trained inside the test session, converted to a TokenizerSpec, and the C
tokenizer must give sentencepiece's ids and decoded text."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .fixtures_tokenizer import EDGE_CORPUS, TT_BYTE, spec_from_sentencepiece

# Text the model was not trained on: unseen words, characters that exist only as byte pieces
# (CJK, emoji, Cyrillic), runs of spaces, leading/trailing spaces, newlines and tabs.
SPM_CORPUS = [t for t in EDGE_CORPUS if "<" not in t] + [
    "Hello world",
    " Hello world",
    "The textwrap module wraps paragraphs of text.",
    "def fill(text, width=70, **kwargs):\n    return '\\n'.join(wrap(text, width))",
    "Привет, мир! 你好，世界 🙂🚀",
    "mixed 中文 and English words",
    "    indented    with    four    spaces",
    "x" * 100,
]


def test_trained_model_has_byte_fallback(spm_model):
    spec = spec_from_sentencepiece(spm_model)
    assert sum(int(t) == TT_BYTE for t in spec.token_types) == 256
    assert spec.add_space_prefix


@pytest.mark.parametrize("text", SPM_CORPUS, ids=[f"spm{i}" for i in range(len(SPM_CORPUS))])
def test_encode_matches_sentencepiece(spm_ctok, spm_model, text):
    assert spm_ctok.encode(text) == spm_model.encode(text)


def test_corpus_exercises_byte_fallback(spm_ctok, spm_model):
    spec = spec_from_sentencepiece(spm_model)
    ids = [i for t in SPM_CORPUS for i in spm_ctok.encode(t)]
    assert sum(int(spec.token_types[i]) == TT_BYTE for i in ids) > 20


@pytest.mark.parametrize("text", SPM_CORPUS, ids=[f"spm{i}" for i in range(len(SPM_CORPUS))])
def test_decode_matches_sentencepiece_and_round_trips(spm_ctok, spm_model, text):
    ids = spm_model.encode(text)
    ours = spm_ctok.decode(ids)
    assert ours.decode("utf-8") == spm_model.decode(ids)
    assert ours == text.encode("utf-8")
    for piece in spm_ctok.decode_pieces(ids):
        piece.decode("utf-8")  # byte-fallback characters come out whole


def test_byte_fallback_character_streams_whole(spm_ctok, spm_model):
    spec = spec_from_sentencepiece(spm_model)
    ids = spm_ctok.encode("中")
    byte_ids = [i for i in ids if int(spec.token_types[i]) == TT_BYTE]
    assert len(byte_ids) == 3  # U+4E2D is three <0xXX> pieces
    pieces = spm_ctok.decode_pieces(ids)
    assert b"".join(pieces) == "中".encode()
    assert [p for p in pieces if p] == ["中".encode()]


def test_bos_and_control_tokens(spm_ctok, spm_model):
    ids = spm_ctok.encode("Hello", add_bos=True)
    assert ids == [spm_model.bos_id()] + spm_model.encode("Hello")
    assert spm_ctok.decode(ids + [spm_model.eos_id()]) == b"Hello"
    assert spm_ctok.decode(ids, show_special=True) == b"<s>Hello"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                    HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(list("abcdefghij etaoin_.,()\n\t") + ["the", "def ", "中", "🙂",
                                                                      "é", "  "]),
                max_size=60).map("".join))
def test_random_text_matches_sentencepiece(spm_ctok, spm_model, text):
    ids = spm_ctok.encode(text)
    assert ids == spm_model.encode(text)
    assert spm_ctok.decode(ids).decode("utf-8") == spm_model.decode(ids)


# tinycoder's GGUF has a 32000-piece Llama-style vocabulary but ships no tokenizer.model; the
# sentencepiece library is run on a model proto assembled from that same vocabulary.
TINY_CORPUS = SPM_CORPUS + ["The quick brown fox jumps over the lazy dog.",
                            "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)\n"]


def test_tinycoder_vocab_matches_sentencepiece(tokenizer_lib, tiny_spec):
    import sentencepiece as spm

    from ditto_core.model.modelfile import serialize_tokenizer

    from .fixtures_tokenizer import CTokenizer, sentencepiece_model_from_spec

    assert len(tiny_spec.tokens) == 32000 and tiny_spec.add_space_prefix
    ref = spm.SentencePieceProcessor(model_proto=sentencepiece_model_from_spec(tiny_spec))
    assert [ref.id_to_piece(i).encode() for i in range(32000)] == list(tiny_spec.tokens)
    ctok = CTokenizer(tokenizer_lib, serialize_tokenizer(tiny_spec), 32000)
    n_bytes = 0
    for text in TINY_CORPUS:
        ids = ctok.encode(text)
        assert ids == ref.encode(text), text
        assert ctok.decode(ids).decode("utf-8") == ref.decode(ids) == text
        n_bytes += sum(int(tiny_spec.token_types[i]) == TT_BYTE for i in ids)
    assert n_bytes > 10  # byte fallback was exercised
