"""HF ``tokenizer.json`` (+ ``tokenizer_config.json``, ``chat_template.jinja``) ->
``TokenizerSpec`` (docs/FORMAT.md, "Tokenizer block"; docs/TOKENIZER.md for what is accepted).

Every part of tokenizer.json is checked by ``tokenizer_features``: what the C tokenizer
reproduces becomes flags, normalizer steps and added-token records; the rest is refused.
Two kinds of ``BPE`` model are read:
- byte-level BPE (a ``ByteLevel`` pre-tokenizer): tokens are stored as raw bytes (the GPT-2
  byte-to-unicode form undone), added tokens as their text; merges become id pairs in rank
  order.
- SentencePiece-style BPE (``Metaspace`` pre-tokenizer, or a normalizer that replaces " " by
  "▁"; ``byte_fallback``): pieces are kept and merged by HF's merge ranks (flag RANK_MERGES);
  a piece also gets ``-rank`` of the first merge producing it as its score (informational).
The end-of-generation set and the FIM tokens come from the token texts as llama.cpp finds them
(``ditto_core.text.special_tokens``), plus EOS and config.json's ``eos_token_id`` ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ditto_core.base.errors import DittoError
from ditto_core.base.types import TokenizerSpec
from ditto_core.text.bytelevel import unicode_to_byte, unicode_to_bytes
from ditto_core.text.special_tokens import eog_ids, fim_ids

from ditto_core.model import format as F

from .tokenizer_features import (added_records, check_byte_level, check_model,
                                 check_post_processor, check_sentencepiece, flatten,
                                 normalizer_steps)

TT_NORMAL, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE = 1, 3, 4, 5, 6


def _load_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DittoError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DittoError(f"{path}: not valid JSON: {exc}") from None


def _token_text(v) -> str | None:
    if v is None:
        return None
    if isinstance(v, dict):
        return v.get("content")
    return str(v)


def _byte_ids(tokens: list[bytes], types) -> list[int]:
    """For each byte value, the id of the normal token that is exactly that byte, or -1."""
    out = [-1] * 256
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if len(t) == 1 and ty == TT_NORMAL and out[t[0]] < 0:
            out[t[0]] = i
    return out


def tokenizer_from_hf(directory: Path, vocab_size: int, config: dict) -> TokenizerSpec:
    """Read the tokenizer of an HF model directory. ``vocab_size`` is the number of embedding
    rows: a smaller vocabulary is padded with unused (empty) tokens, a larger one refused.
    Raises DittoError naming the file for a missing tokenizer.json, a model type other than
    BPE, or an unsupported pre-tokenizer."""
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise DittoError(f"{path}: missing (an HF model directory needs tokenizer.json)")
    tj = _load_json(path)
    where = str(path)
    tcfg_path = directory / "tokenizer_config.json"
    tcfg = _load_json(tcfg_path) if tcfg_path.is_file() else {}
    model = tj.get("model") or {}
    check_model(model, where)
    vocab: dict[str, int] = model.get("vocab") or {}
    added = {int(a["id"]): a for a in tj.get("added_tokens", [])}
    n_src = max([*vocab.values(), *added.keys(), -1]) + 1
    if n_src > vocab_size:
        raise DittoError(f"{where}: {n_src} tokens but the embedding has only {vocab_size} rows")
    texts: list[str | None] = [None] * vocab_size
    for text, i in vocab.items():
        texts[i] = text
    for i, a in added.items():
        if texts[i] is not None and texts[i] != a["content"]:
            # the tokenizers library gives such a token an id of its own past the vocabulary
            raise DittoError(f"{where}: added token {a['content']!r} has id {i}, the id of "
                             f"vocabulary token {texts[i]!r}")
        texts[i] = a["content"]
    by_text = {t: i for i, t in enumerate(texts) if t is not None}

    pres = flatten(tj.get("pre_tokenizer"), "pretokenizers")
    norms = flatten(tj.get("normalizer"), "normalizers")
    byte_level = any(p.get("type") == "ByteLevel" for p in pres)
    metaspace = any(p.get("type") == "Metaspace" for p in pres) or any(
        n.get("type") == "Replace" and n.get("content") == "\u2581" for n in norms)

    types = np.full(vocab_size, TT_UNUSED, dtype=np.uint32)
    tokens: list[bytes] = [b""] * vocab_size
    for i, text in enumerate(texts):
        if text is None:
            continue
        if i in added:
            types[i] = TT_CONTROL if added[i].get("special") else TT_USER_DEFINED
            tokens[i] = text.encode("utf-8")
        elif byte_level:
            types[i] = TT_NORMAL
            tokens[i] = unicode_to_bytes(text, f"{where}: token {i}: ")
        else:
            is_byte = len(text) == 6 and text.startswith("<0x") and text.endswith(">")
            types[i] = TT_BYTE if is_byte else TT_NORMAL
            tokens[i] = text.encode("utf-8")

    merges = []
    for rank, m in enumerate(model.get("merges") or []):
        parts = m.split(" ") if isinstance(m, str) else list(m)
        if len(parts) != 2:
            raise DittoError(f"{where}: merge {rank} {m!r} is not a pair of tokens")
        left, right = parts
        if left not in by_text or right not in by_text or left + right not in by_text:
            raise DittoError(f"{where}: merge {rank} {m!r} does not join two vocabulary tokens "
                             f"into one")
        merges.append((by_text[left], by_text[right], by_text[left + right]))

    def tok_id(key: str, cfg_key: str) -> int:
        text = _token_text(tcfg.get(key))
        if text is not None:
            if text not in by_text:
                raise DittoError(f"{tcfg_path}: {key} {text!r} is not in the vocabulary")
            return by_text[text]
        v = config.get(cfg_key)
        if isinstance(v, list):
            v = v[0] if v else None
        return int(v) if isinstance(v, int) and 0 <= v < vocab_size else -1

    unk = tok_id("unk_token", "unk_token_id")
    if unk < 0 and model.get("unk_token") in by_text:
        unk = by_text[model["unk_token"]]
    template = tcfg.get("chat_template") or ""
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        template = next((t.get("template", "") for t in template
                         if t.get("name") == "default"), "")
    jinja = directory / "chat_template.jinja"
    if not template and jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    bos_id = tok_id("bos_token", "bos_token_id")
    steps = normalizer_steps(tj, where)
    added_recs, need_records = added_records(tj, where, steps)
    for tid, flags, matched in added_recs:
        if flags & F.ADDED_NORMALIZED:  # HF decodes such a token as its normalized text,
            tokens[tid] = matched        # and skips it as special only if that is unchanged
            if matched != texts[tid].encode("utf-8"):
                types[tid] = TT_USER_DEFINED
    if byte_level:  # HF's ByteLevel decoder maps an added token through the byte-to-unicode
        # table too when all its characters are in it ("Ġx" prints " x"); matching keeps the
        # records' text
        to_byte = unicode_to_byte()
        for tid, _, matched in added_recs:
            text = tokens[tid].decode("utf-8")
            if not all(c in to_byte for c in text):
                continue
            shown = bytes(to_byte[c] for c in text)
            if shown != tokens[tid]:
                tokens[tid] = shown
                need_records = True
    post_bos = check_post_processor(tj, where, texts[bos_id] if bos_id >= 0 else None)
    add_bos = bool(tcfg["add_bos_token"]) if "add_bos_token" in tcfg else post_bos
    if add_bos != post_bos:
        # transformers 5 adds BOS as the post-processor says; 4's Llama tokenizer followed
        # add_bos_token: which ids the model was run with is not known
        raise DittoError(f"{tcfg_path}: add_bos_token is {str(add_bos).lower()} but the "
                         f"post_processor of {path} {'adds no' if add_bos else 'adds a'} BOS "
                         f"(transformers 5 follows the post_processor, transformers 4's Llama "
                         f"tokenizer add_bos_token); make them agree")
    ext = dict(normalizer=steps, added=added_recs if need_records else (),
               flags=F.TOKF_ADDED_RECORDS if need_records else 0)
    eos = tok_id("eos_token", "eos_token_id")
    fim = fim_ids(texts)
    eog = set(eog_ids(texts, eos, fim=fim, types=types)) or ({eos} if eos >= 0 else set())
    cfg_eos = config.get("eos_token_id")
    eog.update(i for i in (cfg_eos if isinstance(cfg_eos, list) else [cfg_eos])
               if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab_size)
    common = dict(bos_id=bos_id, eos_id=eos, unk_id=unk, fim_ids=fim,
                  eog_ids=() if eog <= {eos} else tuple(sorted(eog)),
                  pad_id=tok_id("pad_token", "pad_token_id"), add_bos=add_bos,
                  chat_format="chatml" if "<|im_start|>" in template else "none",
                  chat_template=template)
    if byte_level:
        pre, flags = check_byte_level(tj, where, any(v < 0 for v in _byte_ids(tokens, types)))
        ext["flags"] |= flags
        return TokenizerSpec(kind="bpe_bytes", tokens=tuple(tokens),
                             scores=np.zeros(vocab_size, np.float32), token_types=types,
                             merges=tuple((a, b) for a, b, _ in merges),
                             pre=pre, add_space_prefix=False, **common, **ext)
    if metaspace:
        ext["flags"] |= check_sentencepiece(tj, where)
        scores = np.zeros(vocab_size, np.float32)
        seen = set()
        for rank, (_, _, merged) in enumerate(merges):
            if merged not in seen:
                seen.add(merged)
                scores[merged] = -float(rank)
        common["unk_id"] = by_text.get(model.get("unk_token"), -1)
        return TokenizerSpec(kind="spm_bpe", tokens=tuple(tokens), scores=scores,
                             token_types=types, merges=tuple((a, b) for a, b, _ in merges),
                             add_space_prefix=False, **common, **ext)
    raise DittoError(f"{where}: BPE tokenizer is neither byte-level (ByteLevel pre-tokenizer) "
                     f"nor SentencePiece (Metaspace); not supported")
