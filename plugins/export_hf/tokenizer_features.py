"""Which tokenizer.json features Ditto's C tokenizer reproduces, and the refusal of the rest.

HF ``tokenizers`` runs, for ``encode(text)``: added-token extraction (tokens with
``normalized: false`` on the raw text), the ``normalizer`` on the rest, added tokens with
``normalized: true`` on the normalized text, the ``pre_tokenizer``, the ``model`` and the
``post_processor``; ``decode`` runs the ``decoder``. ``check_tokenizer_json`` walks every one of
those parts and raises a DittoError naming the file and the first feature (component and option)
that Ditto does not reproduce exactly, so an export never tokenizes differently in silence.
The accepted set is listed in docs/TOKENIZER.md ("What an HF tokenizer.json may contain").
"""

from __future__ import annotations

import unicodedata

from ditto_core.base.errors import DittoError
from ditto_core.model import format as F

METASPACE = "\u2581"


def flatten(node, key: str) -> list[dict]:
    """Components of a normalizer / pre-tokenizer / decoder / post-processor, with nested
    ``Sequence`` nodes (children under ``key``) expanded in order; ``[]`` for null."""
    if not node:
        return []
    if node.get("type") == "Sequence":
        out = []
        for child in node.get(key) or []:
            out.extend(flatten(child, key))
        return out
    return [node]


class Refusal(DittoError):
    """A tokenizer.json feature Ditto does not reproduce."""


def _refuse(where: str, part: str, what: str, supported: str) -> Refusal:
    return Refusal(f"{where}: {part}: {what} is not reproduced by Ditto's tokenizer "
                   f"(supported: {supported}); refusing to export a tokenizer that would give "
                   f"different token ids")


def _opt(node: dict, key: str, default):
    v = node.get(key, default)
    return default if v is None else v


def check_model(model: dict, where: str) -> None:
    """BPE options: no dropout, no continuing-subword prefix / end-of-word suffix,
    ``ignore_merges`` false."""
    if model.get("type") != "BPE":
        raise _refuse(where, "model", f"type {model.get('type')!r}", "BPE")
    if model.get("dropout") not in (None, 0, 0.0):
        raise _refuse(where, "model BPE", f"dropout {model['dropout']}", "dropout null")
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise _refuse(where, "model BPE", f"{key} {model[key]!r}", f"{key} null")
    if model.get("ignore_merges"):
        raise _refuse(where, "model BPE", "ignore_merges true", "ignore_merges false")


def normalizer_steps(tj: dict, where: str) -> tuple:
    """The normalizer as Ditto steps (TokenizerSpec.normalizer): Lowercase, Strip, Replace with
    a string pattern, Prepend, in order (Sequence flattened). Others are refused."""
    ok = "NFC, NFD, NFKC, NFKD, Lowercase, Strip, Replace (string pattern), Prepend, " \
         "Sequence of them"
    steps = []
    for n in flatten(tj.get("normalizer"), "normalizers"):
        kind = n.get("type")
        if kind == "Lowercase":
            steps.append(("lowercase",))
        elif kind == "Strip":
            steps.append(("strip", bool(_opt(n, "strip_left", True)),
                          bool(_opt(n, "strip_right", True))))
        elif kind == "Replace":
            pat = n.get("pattern") or {}
            if "String" not in pat or not pat["String"]:
                raise _refuse(where, "normalizer Replace", f"pattern {pat}", ok)
            steps.append(("replace", pat["String"], n.get("content") or ""))
        elif kind == "Prepend":
            steps.append(("prepend", n.get("prepend") or ""))
        elif kind in ("NFC", "NFD", "NFKC", "NFKD"):
            steps.append((kind.lower(),))
        else:
            raise _refuse(where, "normalizer", str(kind), ok)
    return tuple(steps)


def apply_normalizer(steps: tuple, text: str) -> str:
    """``steps`` applied to ``text`` as HF's normalizers do (for added tokens with
    ``normalized: true``, whose text is matched in normalized form)."""
    for step in steps:
        if step[0] == "lowercase":
            text = "".join(c.lower() for c in text)
        elif step[0] == "strip":
            ws = "".join(chr(c) for c in _WHITE_SPACE)
            text = text.lstrip(ws) if step[1] else text
            text = text.rstrip(ws) if step[2] else text
        elif step[0] == "replace":
            text = text.replace(step[1], step[2])
        elif step[0] == "prepend":
            text = step[1] + text if text else text
        else:  # nfc / nfd / nfkc / nfkd (Python's Unicode data; HF's is older, which only
            # matters for characters added since Unicode 12 in an added token's text)
            text = unicodedata.normalize(step[0].upper(), text)
    return text


# Unicode White_Space (Rust char::is_whitespace), as native/tokenizer/unicode/gen_unicode_tables.py
_WHITE_SPACE = frozenset(
    [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029,
     0x202F, 0x205F, 0x3000])


#: The Split regex of Qwen2 / Qwen2.5 tokenizer.json files (Llama-3's with \p{N} alone), which
#: Ditto's pre-tokenizer ``qwen2`` reproduces (native/tokenizer/tokenizer.c ``qwen2_match``)
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
               r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def check_byte_level(tj: dict, where: str, byte_tokens_missing: bool) -> tuple[str, int]:
    """Byte-level BPE: pre-tokenizer ByteLevel (use_regex, add_prefix_space), optionally after
    Digits(individual_digits=true) (then without add_prefix_space), or Qwen2's
    Split(QWEN2_REGEX, isolated) + ByteLevel(use_regex=false, add_prefix_space=false); decoder
    ByteLevel. Returns the Ditto pre-tokenizer name (``gpt2`` / ``gpt2_digits`` / ``qwen2`` /
    ``none``) and flags."""
    pres = flatten(tj.get("pre_tokenizer"), "pretokenizers")
    kinds = [p.get("type") for p in pres]
    ok = "ByteLevel(use_regex, add_prefix_space), Digits(individual_digits=true) + " \
         "ByteLevel(use_regex=true, add_prefix_space=false), or Split(Qwen2 regex, isolated) + " \
         "ByteLevel(use_regex=false, add_prefix_space=false)"
    bl = pres[-1] if pres else {}
    regex = _opt(bl, "use_regex", True)
    prefix = _opt(bl, "add_prefix_space", False)
    if kinds == ["ByteLevel"]:
        pre = "gpt2" if regex else "none"
    elif kinds == ["Split", "ByteLevel"]:
        split = pres[0]
        pattern = (split.get("pattern") or {}).get("Regex")
        if pattern != QWEN2_REGEX:
            raise _refuse(where, "pre_tokenizer Split", f"pattern {split.get('pattern')}",
                          f"{ok}; the Qwen2 regex {QWEN2_REGEX}")
        if split.get("behavior") != "Isolated" or split.get("invert"):
            raise _refuse(where, "pre_tokenizer Split", f"behavior {split.get('behavior')!r} "
                          f"invert {split.get('invert')!r}", "behavior Isolated, invert false")
        if regex or prefix:
            raise _refuse(where, "pre_tokenizer Split + ByteLevel", f"use_regex {regex} "
                          f"add_prefix_space {prefix}", ok)
        pre = "qwen2"
    elif kinds == ["Digits", "ByteLevel"]:
        if not pres[0].get("individual_digits"):
            raise _refuse(where, "pre_tokenizer Digits", "individual_digits false", ok)
        if not regex:
            raise _refuse(where, "pre_tokenizer Digits + ByteLevel", "use_regex false", ok)
        if prefix:
            raise _refuse(where, "pre_tokenizer Digits + ByteLevel", "add_prefix_space true "
                          "(a space before every digit)", ok)
        pre = "gpt2_digits"
    else:
        raise _refuse(where, "pre_tokenizer", " + ".join(map(str, kinds)) or "none", ok)
    model = tj.get("model") or {}
    if byte_tokens_missing and (model.get("unk_token") or model.get("byte_fallback")):
        raise _refuse(where, "model BPE", "unk_token / byte_fallback with bytes that have no "
                      "token", "every byte has a token, or neither unk_token nor byte_fallback")
    decs = flatten(tj.get("decoder"), "decoders")
    if [d.get("type") for d in decs] != ["ByteLevel"]:
        raise _refuse(where, "decoder", " + ".join(str(d.get("type")) for d in decs) or "none",
                      "ByteLevel on a byte-level BPE")
    return pre, F.TOKF_PREFIX_SPACE if prefix else 0


def check_sentencepiece(tj: dict, where: str) -> int:
    """SentencePiece-style BPE (byte_fallback): either no pre-tokenizer (Llama 2: the
    normalizer does Prepend("▁") + Replace(" ", "▁")) or a Metaspace pre-tokenizer (replacement
    "▁", prepend_scheme always / first / never, split); decoder Replace(▁→space) + ByteFallback
    + Fuse (+ Strip(1 leading space)), or Metaspace. Returns the flags."""
    model = tj.get("model") or {}
    if not model.get("byte_fallback", False):
        raise _refuse(where, "model BPE", "a SentencePiece-style BPE without byte_fallback",
                      "byte_fallback true")
    flags = F.TOKF_RANK_MERGES | (F.TOKF_FUSE_UNK if model.get("fuse_unk") else 0)
    pres = flatten(tj.get("pre_tokenizer"), "pretokenizers")
    kinds = [p.get("type") for p in pres]
    ok = "Metaspace, or none (normalizer Prepend/Replace as Llama 2)"
    if kinds == ["Metaspace"]:
        ms = pres[0]
        if ms.get("replacement", METASPACE) != METASPACE:
            raise _refuse(where, "pre_tokenizer Metaspace",
                          f"replacement {ms.get('replacement')!r}", "replacement ▁")
        scheme = ms.get("prepend_scheme")
        if scheme is None:
            scheme = "always" if _opt(ms, "add_prefix_space", True) else "never"
        modes = {"always": F.MS_ALWAYS, "first": F.MS_FIRST, "never": F.MS_NEVER}
        if scheme not in modes:
            raise _refuse(where, "pre_tokenizer Metaspace", f"prepend_scheme {scheme!r}",
                          "always, first, never")
        flags |= modes[scheme] << F.TOKF_MS_SHIFT
        if _opt(ms, "split", True):
            flags |= F.TOKF_MS_SPLIT
    elif kinds:
        raise _refuse(where, "pre_tokenizer", " + ".join(map(str, kinds)), ok)
    decs = flatten(tj.get("decoder"), "decoders")
    names = [d.get("type") for d in decs]
    if names == ["Metaspace"]:
        if decs[0].get("replacement", METASPACE) != METASPACE:
            raise _refuse(where, "decoder Metaspace",
                          f"replacement {decs[0].get('replacement')!r}", "replacement ▁")
        flags |= F.TOKF_DECODE_METASPACE
        scheme = decs[0].get("prepend_scheme")
        if scheme is None:
            scheme = "always" if _opt(decs[0], "add_prefix_space", True) else "never"
        if scheme != "never":
            flags |= F.TOKF_DECODE_STRIP
    elif names[:3] == ["Replace", "ByteFallback", "Fuse"] and names[3:] in ([], ["Strip"]):
        rep = decs[0]
        if (rep.get("pattern") or {}).get("String") != METASPACE or rep.get("content") != " ":
            raise _refuse(where, "decoder Replace", "not ▁ → space", "Replace(▁, space)")
        if names[3:]:
            st = decs[3]
            if (st.get("content"), st.get("start"), st.get("stop")) != (" ", 1, 0):
                raise _refuse(where, "decoder Strip", f"{st}", "Strip(space, 1, 0)")
            flags |= F.TOKF_DECODE_STRIP
    else:
        raise _refuse(where, "decoder", " + ".join(map(str, names)) or "none",
                      "Replace(▁→space) + ByteFallback + Fuse (+ Strip(space, 1, 0)), Metaspace")
    return flags


def check_post_processor(tj: dict, where: str, bos_text: str | None) -> bool:
    """Post-processor: null, ByteLevel (offsets only), or a TemplateProcessing whose single
    template is ``[BOS] $A`` or ``$A`` (a ``Sequence`` of those). Returns whether it adds BOS."""
    add_bos = False
    for p in flatten(tj.get("post_processor"), "processors"):
        kind = p.get("type")
        if kind == "ByteLevel":
            continue
        if kind != "TemplateProcessing":
            raise _refuse(where, "post_processor", kind, "TemplateProcessing [BOS] $A, "
                          "ByteLevel, none")
        single = p.get("single") or []
        names = ["$A" if "Sequence" in s else s.get("SpecialToken", {}).get("id")
                 for s in single]
        if names == ["$A"]:
            continue
        if names == [bos_text, "$A"] and bos_text is not None:
            add_bos = True
            continue
        raise _refuse(where, "post_processor TemplateProcessing", f"single template {names}",
                      "[BOS, $A] or [$A]")
    return add_bos


def added_records(tj: dict, where: str, steps: tuple) -> tuple[tuple, bool]:
    """Added tokens as (id, DITTO_ADDED_* flags, text matched) and whether they need the
    explicit records (HF semantics); without them the C tokenizer derives the same set from
    the token types (special = control, matched with --special; non-special = user-defined,
    always matched), which holds when no token strips whitespace and all are matched in the
    same text."""
    out, normalized = [], set()
    plain = True
    for a in tj.get("added_tokens") or []:
        content = a.get("content") or ""
        if not content:
            continue
        name = f"added token {content!r} (id {a.get('id')})"
        flags = F.ADDED_SPECIAL if a.get("special") else 0
        flags |= F.ADDED_LSTRIP if a.get("lstrip") else 0
        flags |= F.ADDED_RSTRIP if a.get("rstrip") else 0
        flags |= F.ADDED_SINGLE_WORD if a.get("single_word") else 0
        text = content
        if _opt(a, "normalized", not a.get("special")):
            flags |= F.ADDED_NORMALIZED
            text = apply_normalizer(steps, content)
            if not text:
                raise _refuse(where, name, "normalizes to empty text", "a non-empty text")
        plain &= not (flags & (F.ADDED_LSTRIP | F.ADDED_RSTRIP | F.ADDED_SINGLE_WORD))
        normalized.add(bool(flags & F.ADDED_NORMALIZED))
        out.append((int(a["id"]), flags, text.encode("utf-8")))
    same_text = normalized != {True, False} and not (True in normalized and steps)
    return tuple(out), not (plain and same_text)
