"""The end-of-generation set and the fill-in-the-middle (FIM) tokens of a vocabulary, found as
llama.cpp finds them (``src/llama-vocab.cpp``, ``llama_vocab::impl::load``), for both exporters.

- FIM tokens (prefix, suffix, middle, pad, repo, file separator): the GGUF keys
  ``tokenizer.ggml.fim_{pre,suf,mid,pad,rep,sep}_token_id`` (and the older
  ``tokenizer.ggml.{prefix,suffix,middle}_token_id``, read after them), else the first token
  (lowest id) whose text is one of ``FIM_TEXTS[role]`` (Qwen ``<|fim_prefix|>``, StarCoder
  ``<fim_prefix>``, CodeLlama ``▁<PRE>``, DeepSeek ``<｜fim▁begin｜>``, ...).
- End of generation (EOG): the FIM pad, repo and file-separator tokens, every token whose text
  is in ``EOG_TEXTS`` (``<|endoftext|>``, ``<|im_end|>``, ``<|eot_id|>``, ``<|end|>``,
  ``<end_of_turn>``, ``<EOT>``, ...), and the EOS, EOT and EOM ids; then llama.cpp's two
  exceptions: ``<|end|>`` leaves the set when ``<|call|>`` or ``<|calls|>`` is in it together
  with ``<|return|>`` or ``<|flush|>``, ``</s>`` when ``<|tool_response>`` or ``<|plamo:eos|>`` is.
  One difference: a ``</s>`` that is a normal token (type 1) is not taken by its text. llama.cpp
  takes it (for PaddleOCR, whose ``</s>`` is a control token) and so stops Qwen2.5 at its normal
  token 128247 ``</s>``, an HTML end tag in generated code; transformers' generation does not.

Texts are the source vocabulary's strings (GGUF ``tokenizer.ggml.tokens``, tokenizer.json
vocab and added tokens), as llama.cpp compares them.
"""

from __future__ import annotations

from typing import Mapping, Sequence

#: FIM roles in the order of the model file's DITTO_FIM_* numbers (FORMAT.md)
FIM_ROLES = ("prefix", "suffix", "middle", "pad", "repo", "sep")

#: GGUF keys of each FIM role, read in this order (a later key present wins, as llama.cpp)
GGUF_FIM_KEYS = {
    "prefix": ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"),
    "suffix": ("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"),
    "middle": ("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"),
    "pad": ("tokenizer.ggml.fim_pad_token_id",),
    "repo": ("tokenizer.ggml.fim_rep_token_id",),
    "sep": ("tokenizer.ggml.fim_sep_token_id",),
}

#: token texts that make a token the FIM token of a role when no GGUF key names one
FIM_TEXTS = {
    "prefix": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>",
               "<PRE>", "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "suffix": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>",
               "<SUF>", "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "middle": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>",
               "<MID>", "\u2581<MID>", "<|code_middle|>", "<|middle|>"),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "repo": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "sep": ("<|file_sep|>",),
}

#: token texts that end generation (llama.cpp's list)
EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
))

#: texts llama.cpp takes as the EOT token when no GGUF key names one (all are in EOG_TEXTS)
EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
             "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>",
             "<end_of_utterance>")


def _first_with_text(texts: Sequence[str | None], wanted) -> int:
    wanted = set(wanted)
    return next((i for i, t in enumerate(texts) if t in wanted), -1)


def fim_ids(texts: Sequence[str | None], given: Mapping[str, int] | None = None) -> tuple:
    """The FIM token ids ``(prefix, suffix, middle, pad, repo, sep)``, -1 where the vocabulary
    has none; ``()`` when it has none at all. ``texts[i]``: token i's source text (None for an
    id without a token); ``given``: role -> id from the source's metadata (GGUF keys), ids
    outside the vocabulary ignored, as llama.cpp does."""
    given = given or {}
    out = []
    for role in FIM_ROLES:
        i = given.get(role, -1)
        if not 0 <= i < len(texts):
            i = _first_with_text(texts, FIM_TEXTS[role])
        out.append(i)
    return tuple(out) if any(i >= 0 for i in out) else ()


def gguf_fim_given(meta: Mapping) -> dict[str, int]:
    """role -> id of the FIM keys present in GGUF metadata ``meta`` (``GGUF_FIM_KEYS``)."""
    out = {}
    for role, keys in GGUF_FIM_KEYS.items():
        for key in keys:
            v = meta.get(key)
            if isinstance(v, int) and not isinstance(v, bool):
                out[role] = v
    return out


def eog_ids(texts: Sequence[str | None], eos: int, eot: int = -1, eom: int = -1,
            fim: Sequence[int] = (), types: Sequence[int] | None = None) -> tuple[int, ...]:
    """The end-of-generation ids, sorted, as llama.cpp builds ``special_eog_ids`` (module
    docstring); ``()`` when the set is just ``{eos}`` (or empty), which a model file stores as
    no EOG records. ``eot`` -1: the first token whose text is in ``EOT_TEXTS``; ``fim``: the
    ids of ``fim_ids``; ``types``: GGUF token types (a normal ``</s>`` is not taken)."""
    n = len(texts)
    ids = set()
    if fim:
        ids.update(i for i in fim[3:6] if i >= 0)
    ids.update(i for i, t in enumerate(texts) if t in EOG_TEXTS
               and not (t == "</s>" and types is not None and int(types[i]) == 1))
    if not 0 <= eot < n:
        eot = _first_with_text(texts, EOT_TEXTS)
    ids.update(i for i in (eos, eot, eom) if 0 <= i < n)
    by_text = {texts[i]: i for i in ids}
    has_call = "<|call|>" in by_text or "<|calls|>" in by_text
    if "<|end|>" in by_text and has_call and ("<|return|>" in by_text
                                              or "<|flush|>" in by_text):
        ids.discard(by_text["<|end|>"])
    if "</s>" in by_text and ("<|tool_response>" in by_text or "<|plamo:eos|>" in by_text):
        ids.discard(by_text["</s>"])
    out = tuple(sorted(ids))
    return () if out in ((), (eos,)) else out
