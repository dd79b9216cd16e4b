"""GGUF tokenizer metadata (``tokenizer.ggml.*``) -> ``TokenizerSpec`` (docs/FORMAT.md).

- ``tokenizer.ggml.model = gpt2``: byte-level BPE. Normal tokens are stored by llama.cpp in the
  GPT-2 byte-to-unicode form; Ditto stores their raw bytes. Control/user-defined tokens keep
  their text. Merges ``"a b"`` become (id(a), id(b)) in rank order.
- ``tokenizer.ggml.model = llama``: SentencePiece BPE with piece scores and ``<0xXX>`` byte
  pieces, kept as they are.

The end-of-generation set and the FIM tokens are found as llama.cpp finds them
(``ditto_core.text.special_tokens``: the ``tokenizer.ggml.eot/eom/fim_*_token_id`` keys, then token
texts such as ``<|im_end|>`` and ``<|fim_prefix|>``).
"""

from __future__ import annotations

import numpy as np

from ditto_core.base.errors import DittoError
from ditto_core.base.types import TokenizerSpec
from ditto_core.text.bytelevel import unicode_to_bytes
from ditto_core.text.special_tokens import eog_ids, fim_ids, gguf_fim_given

#: llama.cpp ``tokenizer.ggml.pre`` -> Ditto pre-tokenizer (FORMAT.md), by llama.cpp's names,
#: and ``gpt2`` for GPT-2's split too (GGUFs written with that name exist; llama.cpp knows only
#: ``gpt-2``). Others are refused, ``default`` (and a missing key, which llama.cpp reads as
#: ``default``) too: llama.cpp's default splits by four regexes (punctuation runs, GPT-2's,
#: digit runs, three-digit groups), which no Ditto pre-tokenizer reproduces.
PRE = {"smollm": "gpt2_digits", "gpt-2": "gpt2", "gpt2": "gpt2", "qwen2": "qwen2"}

TT_NORMAL, TT_CONTROL, TT_USER_DEFINED, TT_BYTE = 1, 3, 4, 6


def chat_format_of(template: str) -> str:
    """``"chatml"`` when the Jinja chat template uses ChatML markers, else ``"none"``."""
    return "chatml" if "<|im_start|>" in template else "none"


def tokenizer_from_gguf(meta: dict, where: str) -> TokenizerSpec:
    """Build the TokenizerSpec from GGUF metadata ``meta`` (key -> Python value).

    Raises DittoError (naming ``where``) for missing tokenizer keys, an unsupported tokenizer
    model or pre-tokenizer, or merges that do not name vocabulary tokens."""
    model = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if model is None or tokens is None:
        raise DittoError(f"{where}: no tokenizer in the GGUF metadata "
                         f"(tokenizer.ggml.model / tokenizer.ggml.tokens missing)")
    n = len(tokens)
    types = np.asarray(meta.get("tokenizer.ggml.token_type", [TT_NORMAL] * n), dtype=np.uint32)
    if types.shape != (n,):
        raise DittoError(f"{where}: {len(types)} token types for {n} tokens")
    template = meta.get("tokenizer.chat_template", "") or ""
    if meta.get("tokenizer.ggml.add_eos_token"):
        raise DittoError(f"{where}: tokenizer.ggml.add_eos_token = true (llama.cpp appends EOS "
                         f"to every prompt) is not reproduced by Ditto's tokenizer; refusing to "
                         f"export a tokenizer that would give different token ids")

    def tid(key):
        v = meta.get(key)
        return -1 if v is None or not 0 <= int(v) < n else int(v)

    fim = fim_ids(tokens, gguf_fim_given(meta))
    eos = tid("tokenizer.ggml.eos_token_id")
    common = dict(bos_id=tid("tokenizer.ggml.bos_token_id"), eos_id=eos,
                  eog_ids=eog_ids(tokens, eos, tid("tokenizer.ggml.eot_token_id"),
                                  tid("tokenizer.ggml.eom_token_id"), fim, types),
                  fim_ids=fim,
                  unk_id=tid("tokenizer.ggml.unknown_token_id"),
                  pad_id=tid("tokenizer.ggml.padding_token_id"),
                  chat_format=chat_format_of(template), chat_template=template)

    if model == "gpt2":
        pre_name = meta.get("tokenizer.ggml.pre", "default")
        if pre_name not in PRE:
            given = ("no tokenizer.ggml.pre (llama.cpp then uses its 'default')"
                     if "tokenizer.ggml.pre" not in meta else repr(pre_name))
            raise DittoError(f"{where}: unsupported byte-level BPE pre-tokenizer: {given} "
                             f"(supported: {', '.join(sorted(PRE))})")
        raw = []
        for i, (text, t) in enumerate(zip(tokens, types.tolist())):
            if t in (TT_CONTROL, TT_USER_DEFINED):
                raw.append(text.encode("utf-8"))
            else:
                raw.append(unicode_to_bytes(text, f"{where}: token {i}: "))
        merges_txt = meta.get("tokenizer.ggml.merges")
        if merges_txt is None:
            raise DittoError(f"{where}: byte-level BPE tokenizer without "
                             f"tokenizer.ggml.merges")
        index = {text: i for i, text in enumerate(tokens)}
        merges = []
        for rank, m in enumerate(merges_txt):
            parts = m.split(" ")
            if len(parts) != 2 or parts[0] not in index or parts[1] not in index:
                raise DittoError(f"{where}: merge {rank} {m!r} does not name two tokens")
            if parts[0] + parts[1] not in index:
                raise DittoError(f"{where}: merge {rank} {m!r} makes a token not in the vocab")
            merges.append((index[parts[0]], index[parts[1]]))
        return TokenizerSpec(kind="bpe_bytes", tokens=tuple(raw),
                             scores=np.zeros(n, np.float32), token_types=types,
                             merges=tuple(merges), pre=PRE[pre_name],
                             add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
                             add_space_prefix=False, **common)
    if model == "llama":
        scores = meta.get("tokenizer.ggml.scores")
        if scores is None:
            raise DittoError(f"{where}: SentencePiece tokenizer without tokenizer.ggml.scores")
        scores = np.asarray(scores, dtype=np.float32)
        if scores.shape != (n,):
            raise DittoError(f"{where}: {len(scores)} scores for {n} tokens")
        return TokenizerSpec(kind="spm_bpe", tokens=tuple(t.encode("utf-8") for t in tokens),
                             scores=scores, token_types=types,
                             add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", True)),
                             add_space_prefix=bool(meta.get("tokenizer.ggml.add_space_prefix",
                                                            True)), **common)
    raise DittoError(f"{where}: unsupported tokenizer model {model!r} (supported: gpt2 "
                     f"byte-level BPE, llama SentencePiece BPE)")
