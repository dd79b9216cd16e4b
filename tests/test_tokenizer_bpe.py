"""Byte-level BPE in C (native/tokenizer/tokenizer.c) on SmolLM2's vocabulary, against references:
llama.cpp's token ids (tests/data/smollm2_tokenizer_golden.jsonl) and HF ``tokenizers``
built from the same GGUF."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .fixtures_tokenizer import EDGE_CORPUS, CTokenizer, TokenizerError, golden_rows

ROWS = golden_rows()


def test_golden_file_is_present():
    assert len(ROWS) >= 50


@pytest.mark.parametrize("row", ROWS, ids=[f"golden{i}" for i in range(len(ROWS))])
def test_matches_llama_cpp_golden(smollm2_ctok, row):
    assert smollm2_ctok.encode(row["text"], parse_special=False) == row["ids_plain"]
    assert smollm2_ctok.encode(row["text"], parse_special=True) == row["ids_special"]


def _hf_ids(hf, text):
    return hf.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("text", EDGE_CORPUS, ids=[f"edge{i}" for i in range(len(EDGE_CORPUS))])
def test_matches_hf_tokenizers_on_edge_cases(smollm2_ctok, smollm2_hf, text):
    # HF always splits off added special tokens, i.e. parse_special on
    assert smollm2_ctok.encode(text, parse_special=True) == _hf_ids(smollm2_hf, text)
    if "<|" not in text:
        assert smollm2_ctok.encode(text, parse_special=False) == _hf_ids(smollm2_hf, text)


ALPHABET = st.sampled_from(list("ab zZ09'sdtlmrev\t\n\r  .,;:!?-_()[]{}<>|/\\\"#")
                           + ["é", "ß", "中", "文", "🙂", "👍🏽", "\u0301", "²", "٣", "\u00a0",
                              "\u3000", "\u2028", "\x85", "\x1c", "\x04", "\x00", "Ω", "ا",
                              "<|im_start|>", "<|endoftext|>", "'s", "'re", "'LL"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                    HealthCheck.function_scoped_fixture])
@given(st.lists(ALPHABET, max_size=40).map("".join))
def test_random_text_matches_hf_tokenizers(smollm2_ctok, smollm2_hf, text):
    assert smollm2_ctok.encode(text, parse_special=True) == _hf_ids(smollm2_hf, text)


def _all_texts():
    return [r["text"] for r in ROWS] + EDGE_CORPUS


def test_decode_matches_hf_and_round_trips(smollm2_ctok, smollm2_hf, smollm2_spec):
    missing = {b for b in range(256) if bytes([b]) not in set(smollm2_spec.tokens)}
    for text in _all_texts():
        ids = smollm2_ctok.encode(text, parse_special=True)
        ours = smollm2_ctok.decode(ids, show_special=True)
        assert ours.decode("utf-8") == smollm2_hf.decode(ids, skip_special_tokens=False), text
        if not missing & set(text.encode("utf-8")):
            assert ours == text.encode("utf-8")


def test_streaming_decoder_prints_split_characters_whole(smollm2_ctok, smollm2_spec):
    split_seen = 0
    for text in _all_texts():
        ids = smollm2_ctok.encode(text, parse_special=True)
        pieces = smollm2_ctok.decode_pieces(ids, show_special=True)
        for i, p in zip(ids, pieces):
            p.decode("utf-8")  # every chunk printed is whole characters (raises otherwise)
            try:
                smollm2_spec.tokens[i].decode("utf-8")
            except UnicodeDecodeError:
                split_seen += 1  # this token alone is part of a character
        assert pieces[-1] == b""  # nothing left pending after a valid text
    assert split_seen > 10  # the corpus really has characters split across tokens


def test_emoji_split_over_tokens_comes_out_once(smollm2_ctok):
    ids = smollm2_ctok.encode("🙂")
    assert len(ids) >= 2  # llama.cpp/HF split it into byte tokens
    pieces = smollm2_ctok.decode_pieces(ids)
    assert pieces[:-1] == [b""] * (len(ids) - 1) + ["🙂".encode()]


def test_incomplete_character_flushes_as_replacement(smollm2_ctok):
    ids = smollm2_ctok.encode("🙂")
    pieces = smollm2_ctok.decode_pieces(ids[:-1])
    assert b"".join(pieces) == "\ufffd".encode()  # the cut-off character, at flush time


def test_control_tokens_print_only_with_show_special(smollm2_ctok, smollm2_spec):
    ids = smollm2_ctok.encode("<|im_start|>user\nhi<|im_end|>", parse_special=True)
    assert ids[0] == smollm2_spec.tokens.index(b"<|im_start|>")
    assert smollm2_ctok.decode(ids, show_special=False) == b"user\nhi"
    assert smollm2_ctok.decode(ids, show_special=True) == b"<|im_start|>user\nhi<|im_end|>"


def test_bos_find_and_add_bos(smollm2_ctok, smollm2_spec, tokenizer_lib):
    assert tokenizer_lib.tokenizer_bos(smollm2_ctok.ptr) == smollm2_spec.bos_id
    assert tokenizer_lib.tokenizer_eos(smollm2_ctok.ptr) == smollm2_spec.eos_id
    assert smollm2_ctok.find("<|im_end|>") == smollm2_spec.tokens.index(b"<|im_end|>")
    assert smollm2_ctok.find("no such token text") == -1
    plain = smollm2_ctok.encode("Hello")
    assert smollm2_ctok.encode("Hello", add_bos=True) == [smollm2_spec.bos_id] + plain


INVALID = [b"abc\xffdef", b"\x80", b"ok \xc3", b"\xe2\x96", b"x\xc0\x80", b"\xed\xa0\x80",
           b"\xf4\x90\x80\x80", b"\xf8\x88\x80\x80\x80", b"caf\xe9", b"good \xf0\x9f\x99"]


@pytest.mark.parametrize("data", INVALID)
def test_invalid_utf8_is_refused_with_offset(smollm2_ctok, data):
    with pytest.raises(UnicodeDecodeError) as ref:
        data.decode("utf-8")
    with pytest.raises(TokenizerError, match=f"invalid UTF-8.*byte offset {ref.value.start}\\b"):
        smollm2_ctok.encode(data)


def test_malformed_blocks_are_refused(tokenizer_lib, smollm2_block, smollm2_spec):
    n = len(smollm2_spec.tokens)
    with pytest.raises(TokenizerError, match="vocab_size"):
        CTokenizer(tokenizer_lib, smollm2_block, n + 1)
    with pytest.raises(TokenizerError, match="sections take .* bytes, the block has"):
        CTokenizer(tokenizer_lib, smollm2_block[:len(smollm2_block) // 2], n)
    with pytest.raises(TokenizerError, match="header"):
        CTokenizer(tokenizer_lib, smollm2_block[:10], n)
    bad_kind = struct.pack("<I", 7) + smollm2_block[4:]
    with pytest.raises(TokenizerError, match="unknown kind 7"):
        CTokenizer(tokenizer_lib, bad_kind, n)
    # first merge pointing at a token id past the vocabulary
    from ditto_core.model.modelfile import serialize_ext
    m0 = len(smollm2_block) - 8 * len(smollm2_spec.merges) - _pad4(
        len(smollm2_spec.chat_template.encode())) - len(serialize_ext(smollm2_spec))
    bad_merge = smollm2_block[:m0] + struct.pack("<II", n + 5, 0) + smollm2_block[m0 + 8:]
    with pytest.raises(TokenizerError, match="merge 0 refers to token"):
        CTokenizer(tokenizer_lib, bad_merge, n)


def _pad4(k: int) -> int:
    return (k + 3) // 4 * 4
