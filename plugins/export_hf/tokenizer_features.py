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

from ditto_core.errors import DittoError

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


def check_byte_level(tj: dict, where: str, byte_tokens_missing: bool) -> str:
    """Byte-level BPE: the normalizer must be null; the pre-tokenizer ByteLevel (use_regex
    true, add_prefix_space false), optionally after Digits(individual_digits=true); decoder
    ByteLevel. Returns the Ditto pre-tokenizer name (``gpt2`` / ``gpt2_digits``)."""
    norms = flatten(tj.get("normalizer"), "normalizers")
    if norms:
        raise _refuse(where, "normalizer", norms[0].get("type"), "none on a byte-level BPE")
    pres = flatten(tj.get("pre_tokenizer"), "pretokenizers")
    kinds = [p.get("type") for p in pres]
    ok = "ByteLevel(use_regex=true, add_prefix_space=false), optionally after " \
         "Digits(individual_digits=true)"
    if kinds == ["ByteLevel"]:
        pre = "gpt2"
    elif kinds == ["Digits", "ByteLevel"]:
        if not pres[0].get("individual_digits"):
            raise _refuse(where, "pre_tokenizer Digits", "individual_digits false", ok)
        pre = "gpt2_digits"
    else:
        raise _refuse(where, "pre_tokenizer", " + ".join(map(str, kinds)) or "none", ok)
    bl = pres[-1]
    if not _opt(bl, "use_regex", True):
        raise _refuse(where, "pre_tokenizer ByteLevel", "use_regex false", ok)
    if _opt(bl, "add_prefix_space", False):
        raise _refuse(where, "pre_tokenizer ByteLevel", "add_prefix_space true", ok)
    model = tj.get("model") or {}
    if byte_tokens_missing and (model.get("unk_token") or model.get("byte_fallback")):
        raise _refuse(where, "model BPE", "unk_token / byte_fallback with bytes that have no "
                      "token", "every byte has a token, or neither unk_token nor byte_fallback")
    decs = flatten(tj.get("decoder"), "decoders")
    if [d.get("type") for d in decs] != ["ByteLevel"]:
        raise _refuse(where, "decoder", " + ".join(str(d.get("type")) for d in decs) or "none",
                      "ByteLevel on a byte-level BPE")
    return pre


def check_sentencepiece(tj: dict, where: str) -> None:
    """SentencePiece-style BPE (Llama 2's tokenizer.json): normalizer Prepend("▁") then
    Replace(" ", "▁"), no pre-tokenizer, byte_fallback, and the matching decoder."""
    model = tj.get("model") or {}
    if not model.get("byte_fallback", False):
        raise _refuse(where, "model BPE", "a SentencePiece-style BPE without byte_fallback",
                      "byte_fallback true")
    norms = flatten(tj.get("normalizer"), "normalizers")
    want = [("Prepend", METASPACE), ("Replace", " ", METASPACE)]
    got = []
    for n in norms:
        if n.get("type") == "Prepend":
            got.append(("Prepend", n.get("prepend")))
        elif n.get("type") == "Replace":
            got.append(("Replace", (n.get("pattern") or {}).get("String"), n.get("content")))
        else:
            got.append((n.get("type"),))
    ok = 'normalizer Prepend("▁") + Replace(" ", "▁") with no pre-tokenizer (Llama 2)'
    if got != want:
        raise _refuse(where, "normalizer", " + ".join(str(g[0]) for g in got) or "none", ok)
    pres = flatten(tj.get("pre_tokenizer"), "pretokenizers")
    if pres:
        raise _refuse(where, "pre_tokenizer", " + ".join(str(p.get("type")) for p in pres), ok)
    decs = [d.get("type") for d in flatten(tj.get("decoder"), "decoders")]
    if decs not in (["Replace", "ByteFallback", "Fuse", "Strip"], ["Metaspace"]):
        raise _refuse(where, "decoder", " + ".join(map(str, decs)) or "none",
                      "Replace(▁→space) + ByteFallback + Fuse + Strip(1 leading space)")


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


def check_added_tokens(tj: dict, where: str) -> None:
    """Added tokens: special, not lstrip / rstrip / single_word, and ``normalized`` only when
    the tokenizer has no normalizer (where it makes no difference)."""
    has_norm = bool(flatten(tj.get("normalizer"), "normalizers"))
    for a in tj.get("added_tokens") or []:
        name = f"added token {a.get('content')!r} (id {a.get('id')})"
        if not a.get("special", False):
            raise _refuse(where, name, "special false (a token matched in plain text)",
                          "special added tokens")
        for flag in ("lstrip", "rstrip", "single_word"):
            if a.get(flag):
                raise _refuse(where, name, f"{flag} true", f"{flag} false")
        if a.get("normalized") and has_norm:
            raise _refuse(where, name, "normalized true with a normalizer",
                          "normalized false")
