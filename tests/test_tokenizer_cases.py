"""Regression tests from issue 12's handed tokenizer cases (inputs in tests/data/cases, provenance
in tests/data/README.md): the HF exporter either reproduces HF ``tokenizers`` on the same
tokenizer.json exactly (Ditto's C tokenizer gives the same ids) or refuses the export with a
message naming the file and the feature. ``EXPORTED`` lists the cases Ditto must reproduce."""

import json
from pathlib import Path

import pytest

from ditto_core.base.errors import DittoError
from ditto_core.model.modelfile import serialize_tokenizer
from ditto_export_hf.tokenizer import tokenizer_from_hf
from tests.fixtures_tokenizer import CTokenizer

CASES_DIR = Path(__file__).parent / "data" / "cases"

#: case -> (texts of the case's repro.sh, parse_special, feature named by a refusal)
CASES = {
    "bytelevel-add-prefix-space": (["Hello world", "hello"], True, "add_prefix_space"),
    "normalizer-ignored": (["café", "Ｈello"], True, "NFKC"),
    "added-token-lstrip-rstrip": (["hello <|im_start|>user", "x <|im_end|>  y"], True, "lstrip"),
    "metaspace-prepend-first": (["<|im_start|>user", "hello <|im_end|>world"], True,
                                "special false"),
    "user-defined-token-not-split": (["say <|im_start|>user hello"], False, "special false"),
}

#: cases whose tokenizer.json Ditto reproduces (the others must be refused)
EXPORTED = {"bytelevel-add-prefix-space", "added-token-lstrip-rstrip", "metaspace-prepend-first",
            "user-defined-token-not-split", "normalizer-ignored"}


def load_case(name: str):
    d = CASES_DIR / name
    cfg = json.loads((d / "config.json").read_text())
    return d, cfg


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_matches_hf_or_is_refused(name, tokenizer_lib):
    from tokenizers import Tokenizer

    d, cfg = load_case(name)
    texts, special, feature = CASES[name]
    try:
        spec = tokenizer_from_hf(d, cfg["vocab_size"], cfg)
    except DittoError as exc:
        assert name not in EXPORTED, f"{name} must export: {exc}"
        msg = str(exc)
        assert str(d / "tokenizer.json") in msg and feature in msg, msg
        assert "not reproduced" in msg
        return
    assert name in EXPORTED, f"{name} exported but is expected to be refused"
    ref = Tokenizer.from_file(str(d / "tokenizer.json"))
    ctok = CTokenizer(tokenizer_lib, serialize_tokenizer(spec), cfg["vocab_size"])
    for text in texts:
        assert ctok.encode(text, parse_special=special) == \
            ref.encode(text, add_special_tokens=False).ids, text


def test_gguf_add_eos_token_is_refused():
    import numpy as np

    from ditto_export_gguf.tokenizer import tokenizer_from_gguf
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "a"],
            "tokenizer.ggml.scores": np.zeros(2), "tokenizer.ggml.add_eos_token": True}
    with pytest.raises(DittoError, match="m.gguf: tokenizer.ggml.add_eos_token = true.*not "
                                         "reproduced"):
        tokenizer_from_gguf(meta, "m.gguf")
    meta["tokenizer.ggml.add_eos_token"] = False
    assert tokenizer_from_gguf(meta, "m.gguf").kind == "spm_bpe"


def test_gguf_pre_tokenizer_names_are_llama_cpps():
    """tokenizer.ggml.pre: "gpt-2" (llama.cpp's name) and "gpt2" are GPT-2's split; "default"
    (and a missing key, which llama.cpp reads as "default": four regexes of its own) and other
    names are refused."""
    from ditto_export_gguf.tokenizer import tokenizer_from_gguf
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b", "ab"],
            "tokenizer.ggml.merges": ["a b"]}
    for name in ("gpt-2", "gpt2"):
        assert tokenizer_from_gguf({**meta, "tokenizer.ggml.pre": name}, "m.gguf").pre == "gpt2"
    with pytest.raises(DittoError, match=r"^m.gguf: unsupported byte-level BPE pre-tokenizer: "
                                         r"no tokenizer.ggml.pre \(llama.cpp then uses its "
                                         r"'default'\) \(supported: gpt-2, gpt2, qwen2, "
                                         r"smollm\)$"):
        tokenizer_from_gguf(meta, "m.gguf")
    for name in ("default", "gpt-4o"):
        with pytest.raises(DittoError, match=f"pre-tokenizer: '{name}' \\(supported: gpt-2"):
            tokenizer_from_gguf({**meta, "tokenizer.ggml.pre": name}, "m.gguf")
